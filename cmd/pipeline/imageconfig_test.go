package main

import (
	"archive/tar"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"maps"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"

	v1 "github.com/google/go-containerregistry/pkg/v1"
	"github.com/google/go-containerregistry/pkg/v1/empty"
	"github.com/google/go-containerregistry/pkg/v1/layout"
	"github.com/google/go-containerregistry/pkg/v1/mutate"
	"github.com/google/go-containerregistry/pkg/v1/random"
	"github.com/google/go-containerregistry/pkg/v1/types"
	specs "github.com/opencontainers/runtime-spec/specs-go"

	"readie.dev/pipeline/internal/bench"
	"readie.dev/pipeline/internal/run"
	"readie.dev/pipeline/internal/testenv"
	"readie.dev/pipeline/internal/testenv/debianimage"
	"readie.dev/pipeline/pkg/catalogue"
	"readie.dev/pipeline/pkg/launch"
	"readie.dev/pipeline/pkg/manifest"
	"readie.dev/pipeline/pkg/pycall"
)

// dirEntry is a directory entry of tarLayer.
func dirEntry(name string) tar.Header {
	return tar.Header{Name: name, Typeflag: tar.TypeDir, Mode: 0o755}
}

// withConfig is img with a layer on top and cfg as its config.
func withConfig(t *testing.T, img v1.Image, top v1.Layer, cfg v1.Config) v1.Image {
	t.Helper()
	img, err := mutate.AppendLayers(img, top)
	if err != nil {
		t.Fatal(err)
	}
	if img, err = mutate.Config(img, cfg); err != nil {
		t.Fatal(err)
	}
	return img
}

// kitCall restores checkpoint id of the output out as a worker does, through the kit's one
// restore path (launch.OpenOutput, Restorer.Restore), and returns what the executor answers to
// expr.
func kitCall(t *testing.T, out, id, expr string) any {
	t.Helper()
	o, err := launch.OpenOutput(out, launch.OpenOptions{Verify: true})
	if err != nil {
		t.Fatal(err)
	}
	work := testenv.WorkDir(t)
	rt := &launch.Runtime{Path: testenv.RunscPath(t), Root: runscRoot(t, work), Flags: o.Flags}
	r, err := o.Restorer(launch.Options{Runtime: rt, WorkDir: filepath.Join(work, "w"), IDs: launch.RandomIDs{Prefix: "kit"}, Env: []string{"KIT=1"}})
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	restored, err := r.Restore(ctx, id, launch.RestoreOptions{})
	if err != nil {
		t.Fatalf("restore of %s through the kit: %v", id, err)
	}
	request, err := pycall.EvalRequest(expr)
	if err != nil {
		t.Fatal(err)
	}
	response, err := restored.Call(ctx, request, pycall.SmallResponse)
	var value any
	if err == nil {
		value, err = pycall.DecodeEnvelope(response)
	}
	if err = errors.Join(err, restored.Close(ctx)); err != nil {
		t.Fatalf("call of %s through the kit: %v\nexecutor stderr:\n%s", id, err, restored.Sandbox.Tail(20))
	}
	return value
}

// appUser adds a user app (1234:1235, home /home/app) to the default rootfs's /etc/passwd and
// /etc/group: the entries of a layer over userImage.
func appUser(t *testing.T) []tar.Header {
	t.Helper()
	passwd, err := os.ReadFile(filepath.Join(testenv.Rootfs(t), "etc/passwd"))
	if err != nil {
		t.Fatal(err)
	}
	group, _ := os.ReadFile(filepath.Join(testenv.Rootfs(t), "etc/group"))
	return []tar.Header{
		file("etc/passwd", string(passwd)+"app:x:1234:1235::/home/app:/bin/sh\n"),
		file("etc/group", string(group)+"app:x:1235:\n"),
		dirEntry("home/"), dirEntry("home/app/"),
	}
}

// imageProcessExpr asks a restored executor for its process: uid, gid, cwd, the image's
// VIRTUAL_ENV, the user's HOME, sys.prefix, and a module of the venv that no set imports
// (imported by the call), in that order.
const imageProcessExpr = `(lambda os, sys: [os.getuid(), os.getgid(), os.getcwd(), os.environ.get("VIRTUAL_ENV"), os.environ.get("HOME"), sys.prefix, __import__("venvlater").WHERE])(__import__("os"), __import__("sys"))`

// checkImageProcess checks an answer to imageProcessExpr: the process of TestVenvImage's image.
func checkImageProcess(t *testing.T, where string, got any) {
	t.Helper()
	want := []any{int64(1234), int64(1235), "/srv/work", "/opt/venv", "/home/app", "/opt/venv", "later"}
	if l, _ := got.([]any); len(l) != len(want) || fmt.Sprint(l) != fmt.Sprint(want) {
		t.Errorf("%s: uid, gid, cwd, VIRTUAL_ENV, HOME, sys.prefix, venvlater = %s; want %s", where, pycall.Format(got, pycall.ErrorBytes), pycall.Format(want, pycall.ErrorBytes))
	}
}

// benchPoolEval restores checkpoint id of out into a sandbox of the pool the bench's pooled
// series uses (bench.NewPool on the output's sandboxes, as `bench` makes it), and returns what
// the executor answers to expr.
func benchPoolEval(t *testing.T, cfg, out, id, expr string) any {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 3*time.Minute)
	defer cancel()
	env := testRunEnv(ctx, t, cfg)
	var value any
	_, err := env.WithVerifiedOutput(ctx, out, []string{id}, func(x *run.VerifiedOutput) (err error) {
		r := x.Sandboxes.Restorer(x.Work, time.Minute)
		p, err := bench.NewPool(ctx, &r.Launcher, 1)
		if err != nil {
			return err
		}
		defer func() { err = errors.Join(err, p.Close()) }()
		sb, err := p.Get(ctx)
		if err != nil {
			return err
		}
		defer func() { err = errors.Join(err, sb.Delete(ctx)) }()
		request, err := pycall.EvalRequest(expr)
		if err != nil {
			return err
		}
		_, err = sb.CallOnce(ctx, launch.Image{Dir: x.Dir(x.Picked[0]), Flags: r.Flags}, request, pycall.SmallResponse, func(response []byte) (err error) {
			value, err = pycall.DecodeEnvelope(response)
			return err
		})
		return err
	})
	if err != nil {
		t.Fatalf("a call in the bench's pool: %v", err)
	}
	return value
}

// TestVenvImage: an image whose Python is a virtualenv named only by its config (PATH and
// VIRTUAL_ENV), with a module only the venv has, run as a non-root User (by name) in a
// WorkingDir: plan, capture, smoke and verify pass, the manifest's python_path is the venv's
// python3, and a restore through the kit finds the module preloaded and the image's process.
// Every other sandbox of the output runs that process too: the bench's, its pooled series
// included (the pool is asked from inside), and the soak's (whose executor must bind its
// socket as the image's user); `spec` on the image's rootfs prints the restore spec's shape.
// The set's modules are installed as pip leaves them: venvonly with a .dist-info that has
// RECORD and no top_level.txt (a meson-python or scikit-build wheel's), editmod as an editable
// install (hatchling's: a .pth names the project's src, direct_url.json says editable),
// orphanmod with no metadata: the checkpoint records the first two with their versions and
// names orphanmod as unmapped, with a warning; the venv's cloudpickle, without metadata, is the
// executor's own and not named.
func TestVenvImage(t *testing.T) {
	t.Parallel()
	// The unpacked images go with the test: its runs are processes of their own.
	env := map[string]string{"XDG_CACHE_HOME": t.TempDir()}
	dir := testenv.WorkDir(t)
	base := userImage(t)
	site := "opt/venv/lib/python3.11/site-packages/"
	entries := append(appUser(t),
		dirEntry("srv/"), dirEntry("srv/work/"),
		dirEntry("opt/venv/"), dirEntry("opt/venv/bin/"), dirEntry("opt/venv/lib/"), dirEntry("opt/venv/lib/python3.11/"), dirEntry(site),
		file("opt/venv/pyvenv.cfg", "home = /usr/bin\ninclude-system-site-packages = false\nversion = 3.11.2\n"),
		tar.Header{Name: "opt/venv/bin/python3", Typeflag: tar.TypeSymlink, Linkname: "/usr/bin/python3"},
		tar.Header{Name: "opt/venv/bin/python", Typeflag: tar.TypeSymlink, Linkname: "python3"},
		file(site+"venvonly.py", "WHERE = 'venv'\n"),
		file(site+"venvlater.py", "WHERE = 'later'\n"),
		dirEntry(site+"venv_only_dist-1.0.dist-info/"),
		file(site+"venv_only_dist-1.0.dist-info/METADATA", "Metadata-Version: 2.1\nName: venv-only-dist\nVersion: 1.0\n"),
		file(site+"venv_only_dist-1.0.dist-info/INSTALLER", "pip\n"),
		file(site+"venv_only_dist-1.0.dist-info/RECORD", "venvonly.py,sha256=x,15\nvenv_only_dist-1.0.dist-info/METADATA,,\nvenv_only_dist-1.0.dist-info/RECORD,,\n"),
		dirEntry("srv/proj/"), dirEntry("srv/proj/src/"), dirEntry("srv/proj/src/editmod/"),
		file("srv/proj/src/editmod/__init__.py", ""),
		file(site+"_editmod_proj.pth", "/srv/proj/src\n"),
		dirEntry(site+"editmod_proj-0.1.dev0.dist-info/"),
		file(site+"editmod_proj-0.1.dev0.dist-info/METADATA", "Metadata-Version: 2.1\nName: Editmod.Proj\nVersion: 0.1.dev0\n"),
		file(site+"editmod_proj-0.1.dev0.dist-info/RECORD", "_editmod_proj.pth,sha256=x,14\neditmod_proj-0.1.dev0.dist-info/RECORD,,\n"),
		file(site+"editmod_proj-0.1.dev0.dist-info/direct_url.json", `{"url": "file:///srv/proj", "dir_info": {"editable": true}}`),
		file(site+"orphanmod.py", ""),
	)
	// cloudpickle, in the venv only: the system's is not on a venv's path.
	cp := filepath.Join(testenv.Rootfs(t), "usr/lib/python3/dist-packages/cloudpickle")
	files, _ := os.ReadDir(cp)
	entries = append(entries, dirEntry(site+"cloudpickle/"))
	for _, f := range files {
		if data, err := os.ReadFile(filepath.Join(cp, f.Name())); err == nil && strings.HasSuffix(f.Name(), ".py") {
			entries = append(entries, file(site+"cloudpickle/"+f.Name(), string(data)))
		}
	}
	img := withConfig(t, base, tarLayer(t, entries...), v1.Config{User: "app", WorkingDir: "/srv/work", Env: []string{
		"PATH=/opt/venv/bin:/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin", "VIRTUAL_ENV=/opt/venv",
	}})
	ref := writeLayout(t, filepath.Join(dir, "layout"), img)
	out, root := filepath.Join(dir, "out"), runscRoot(t, dir)
	cfg := testConfig{runsc: testenv.RunscPath(t), root: root, rootfs: testenv.Rootfs(t), output: out,
		sets: "  - id: venv\n    imports: [venvonly, editmod, orphanmod, json]\n"}.write(t)
	if got := planRootfs(t, env, cfg, ref); !strings.HasPrefix(got, "sha256:") {
		t.Fatalf("plan: rootfs %q", got)
	}
	code, stdout, stderr := runProcess(t, env, 10*time.Minute, "capture", "--config", cfg, "--image", ref)
	if code != exitOK {
		t.Fatalf("capture --image (venv): exit %d\n%s%s", code, stdout, stderr)
	}
	m, err := manifest.Load(filepath.Join(out, manifest.FileName))
	if err != nil {
		t.Fatal(err)
	}
	if m.PythonPath != "/opt/venv/bin/python3" || m.Python == nil || !strings.HasPrefix(m.Python.Version, "3.11.") || m.Python.Cloudpickle == "" {
		t.Errorf("manifest python_path %q, python %+v; want the venv's python3, 3.11", m.PythonPath, m.Python)
	}
	if m.Process == nil || !strings.Contains(strings.Join(m.Process.Env, " "), "VIRTUAL_ENV=/opt/venv") || m.Process.User.UID != 1234 || m.Process.Cwd != "/srv/work" {
		t.Errorf("manifest process %+v: want the image's Env, user and working directory", m.Process)
	}
	c := m.Checkpoints[len(m.Checkpoints)-1]
	if c.ID != "venv" || !c.Smoke.OK || c.KeyParts["image_config"] == "" {
		t.Errorf("checkpoint %+v: want venv, smoke ok, an image_config key part", c)
	}
	if want := map[string]string{"venv-only-dist": "1.0", "editmod-proj": "0.1.dev0"}; !maps.Equal(c.Packages, want) || !slices.Equal(c.UnmappedModules, []string{"orphanmod"}) {
		t.Errorf("checkpoint packages %v, unmapped %v; want %v, [orphanmod]", c.Packages, c.UnmappedModules, want)
	}
	if !strings.Contains(stderr, "module orphanmod: no distribution's metadata names it; its version is unknown") || strings.Contains(stderr, "module cloudpickle:") {
		t.Errorf("the capture's log does not warn of orphanmod alone:\n%s", stderr)
	}
	if cat, err := catalogue.Load(filepath.Join(out, catalogue.FileName)); err != nil || !slices.Equal(cat.Checkpoints[len(cat.Checkpoints)-1].UnmappedModules, []string{"orphanmod"}) {
		t.Errorf("catalogue %+v, %v; want the venv checkpoint's unmapped_modules [orphanmod]", cat, err)
	}
	if code, stdout, stderr := runProcess(t, env, 10*time.Minute, "verify", "--config", cfg); code != exitOK {
		t.Fatalf("verify: exit %d\n%s%s", code, stdout, stderr)
	}
	got := kitCall(t, out, "venv", `[`+imageProcessExpr+`, __import__("sys").modules["venvonly"].WHERE, __import__("os").environ.get("KIT")]`)
	l, _ := got.([]any)
	if len(l) != 3 || l[1] != "venv" || l[2] != "1" {
		t.Fatalf("restored through the kit: %s; want [process, 'venv', '1'] (venvonly preloaded, the worker's KIT)", pycall.Format(got, pycall.ErrorBytes))
	}
	checkImageProcess(t, "restored through the kit", l[0])

	// The bench's pool: a sandbox created ahead for the pooled series runs the image's process.
	checkImageProcess(t, "restored into the bench's pool", benchPoolEval(t, cfg, out, "venv", imageProcessExpr))
	// The bench itself, every series of it, the pooled one included.
	code, stdout, stderr = runProcess(t, env, 10*time.Minute, "bench", "--config", cfg, "--only", "venv", "--rounds", "1", "--variants=false", "--concurrency", "", "--pool", "1")
	if code != exitOK || !strings.Contains(stdout, "pooled") {
		t.Fatalf("bench (pooled series included) on the image: exit %d\n%s%s", code, stdout, stderr)
	}
	// The soak: every restore's executor binds its socket in a host directory as the image's
	// user, and answers.
	code, stdout, stderr = runProcess(t, env, 10*time.Minute, "bench", "--config", cfg, "--only", "venv", "--soak", "2", "--concurrency", "1")
	if r := readSoak(t, out); code != exitOK || r.Restores != 2 || r.Failures != 0 {
		t.Fatalf("bench --soak 2 on the image: exit %d, %d restores, errors %v\n%s%s", code, r.Restores, r.Errors, stdout, stderr)
	}

	// `spec` on the image's rootfs prints the spec of its process: the restore spec's shape.
	specCfg := testConfig{runsc: testenv.RunscPath(t), root: root, rootfs: m.Rootfs.Path, output: out}.write(t)
	code, stdout, stderr = runProcess(t, env, time.Minute, "spec", "--config", specCfg)
	printed, fingerprint, _ := strings.Cut(stdout, "\nfingerprint: ")
	var spec specs.Spec
	if code != exitOK || json.Unmarshal([]byte(printed), &spec) != nil || spec.Process == nil {
		t.Fatalf("spec: exit %d\n%s%s", code, stdout, stderr)
	}
	if spec.Process.User.UID != 1234 || spec.Process.Cwd != "/srv/work" || !slices.Contains(spec.Process.Env, "VIRTUAL_ENV=/opt/venv") || strings.TrimSpace(fingerprint) != m.SpecFingerprint {
		t.Errorf("spec on the image's rootfs: user %+v, cwd %q, env %q, fingerprint %s; want the image's process and the manifest's fingerprint %s",
			spec.Process.User, spec.Process.Cwd, spec.Process.Env, strings.TrimSpace(fingerprint), m.SpecFingerprint)
	}
}

// TestImageUserAndWorkingDir: an image whose config names a non-root User (by name, in its
// own /etc/passwd) and a WorkingDir: the restored executor runs there, as that user, with the
// user's HOME, and its socket still reaches the host directory. The same image has its
// python3 under /usr/local/bin (first on its PATH: python_path names it) and its application's
// modules on PYTHONPATH, as many images do: the set imports one of them.
func TestImageUserAndWorkingDir(t *testing.T) {
	t.Parallel()
	// The unpacked images go with the test: its runs are processes of their own.
	env := map[string]string{"XDG_CACHE_HOME": t.TempDir()}
	dir := testenv.WorkDir(t)
	base := userImage(t)
	img := withConfig(t, base, tarLayer(t, append(appUser(t),
		dirEntry("srv/"), dirEntry("srv/work/"), dirEntry("srv/work/lib/"),
		file("srv/work/lib/appmod.py", "NAME = 'app'\n"),
		tar.Header{Name: "usr/local/bin/python3", Typeflag: tar.TypeSymlink, Linkname: "/usr/bin/python3.11"},
	)...), v1.Config{User: "app", WorkingDir: "/srv/work", Env: []string{"PATH=/usr/local/bin:/usr/bin:/bin", "PYTHONPATH=/srv/work/lib"}})
	ref := writeLayout(t, filepath.Join(dir, "layout"), img)
	out := filepath.Join(dir, "out")
	cfg := testConfig{runsc: testenv.RunscPath(t), root: runscRoot(t, dir), rootfs: testenv.Rootfs(t), output: out,
		sets: "  - id: small\n    imports: [json, appmod]\n"}.write(t)
	code, stdout, stderr := runProcess(t, env, 10*time.Minute, "capture", "--config", cfg, "--image", ref)
	if code != exitOK {
		t.Fatalf("capture --image (user, workdir): exit %d\n%s%s", code, stdout, stderr)
	}
	m, err := manifest.Load(filepath.Join(out, manifest.FileName))
	if err != nil {
		t.Fatal(err)
	}
	if m.PythonPath != "/usr/local/bin/python3" || m.Process == nil || m.Process.User.UID != 1234 || m.Process.Cwd != "/srv/work" {
		t.Errorf("manifest python_path %q, process %+v", m.PythonPath, m.Process)
	}
	got := kitCall(t, out, "small", `[__import__("os").getcwd(), __import__("os").getuid(), __import__("os").getgid(), __import__("os").environ.get("HOME"), "appmod" in __import__("sys").modules]`)
	if l, _ := got.([]any); len(l) != 5 || l[0] != "/srv/work" || l[1] != int64(1234) || l[2] != int64(1235) || l[3] != "/home/app" || l[4] != true {
		t.Errorf("restored executor: cwd, uid, gid, HOME, appmod loaded = %s; want ['/srv/work', 1234, 1235, '/home/app', True]", pycall.Format(got, pycall.ErrorBytes))
	}
	// A user the image does not define is refused up front, naming it.
	img = withConfig(t, base, tarLayer(t, dirEntry("srv/")), v1.Config{User: "nobody-here"})
	ref = writeLayout(t, filepath.Join(dir, "layout2"), img)
	code, _, stderr = runProcess(t, env, 10*time.Minute, "capture", "--config", cfg, "--image", ref)
	if code != exitUsage || !strings.Contains(stderr, `no user "nobody-here"`) {
		t.Errorf("capture of an image with an unknown user: exit %d\n%s", code, stderr)
	}
}

// TestImageIndexPlatforms: an OCI layout whose index.json names an image index of two
// platforms and an attestation manifest (as buildx writes one): the host's image is captured
// and the manifest names the index, the image and the platform; --platform for a platform the
// index lacks is refused naming the platforms it has.
func TestImageIndexPlatforms(t *testing.T) {
	t.Parallel()
	// The unpacked images go with the test: its runs are processes of their own.
	env := map[string]string{"XDG_CACHE_HOME": t.TempDir()}
	dir := testenv.WorkDir(t)
	base := userImage(t)
	cf, err := base.ConfigFile()
	if err != nil {
		t.Fatal(err)
	}
	cf = cf.DeepCopy()
	cf.OS, cf.Architecture = "linux", "amd64"
	amd64, err := mutate.ConfigFile(base, cf)
	if err != nil {
		t.Fatal(err)
	}
	other, _ := random.Image(256, 1)
	attest, _ := random.Image(256, 1)
	idx := mutate.AppendManifests(empty.Index,
		mutate.IndexAddendum{Add: attest, Descriptor: v1.Descriptor{Platform: &v1.Platform{OS: "unknown", Architecture: "unknown"},
			Annotations: map[string]string{"vnd.docker.reference.type": "attestation-manifest"}}},
		mutate.IndexAddendum{Add: other, Descriptor: v1.Descriptor{Platform: &v1.Platform{OS: "linux", Architecture: "arm", Variant: "v7"}}},
		mutate.IndexAddendum{Add: amd64, Descriptor: v1.Descriptor{Platform: &v1.Platform{OS: "linux", Architecture: "amd64"}}},
	)
	idx = mutate.IndexMediaType(idx, types.OCIImageIndex)
	p, err := layout.Write(filepath.Join(dir, "layout"), empty.Index)
	if err != nil {
		t.Fatal(err)
	}
	if err := p.AppendIndex(idx, layout.WithAnnotations(map[string]string{"org.opencontainers.image.ref.name": "multi"})); err != nil {
		t.Fatal(err)
	}
	ref := "oci-layout:" + filepath.Join(dir, "layout") + ":multi"
	out := filepath.Join(dir, "out")
	cfg := testConfig{runsc: testenv.RunscPath(t), root: runscRoot(t, dir), rootfs: testenv.Rootfs(t), output: out,
		sets: "  - id: small\n    imports: [json]\n"}.write(t)
	code, stdout, stderr := runProcess(t, env, 10*time.Minute, "capture", "--config", cfg, "--image", ref)
	if code != exitOK {
		t.Fatalf("capture --image (index): exit %d\n%s%s", code, stdout, stderr)
	}
	m, err := manifest.Load(filepath.Join(out, manifest.FileName))
	if err != nil {
		t.Fatal(err)
	}
	indexDigest, _ := idx.Digest()
	imageDigest, _ := amd64.Digest()
	if m.Image == nil || m.Image.Index != indexDigest.String() || m.Image.Digest != imageDigest.String() || m.Image.Platform != "linux/amd64" || !m.Checkpoints[1].Smoke.OK {
		t.Errorf("manifest image %+v; want index %s, image %s, linux/amd64", m.Image, indexDigest, imageDigest)
	}
	code, _, stderr = runProcess(t, env, 10*time.Minute, "capture", "--config", cfg, "--image", ref, "--platform", "linux/arm64", "--out", filepath.Join(dir, "out-arm64"))
	if code != exitUsage || !strings.Contains(stderr, "no image for linux/arm64") || !strings.Contains(stderr, "linux/amd64, linux/arm/v7, unknown/unknown (attestation)") {
		t.Errorf("--platform linux/arm64: exit %d\n%s", code, stderr)
	}
	if _, err := os.Stat(filepath.Join(dir, "out-arm64")); !os.IsNotExist(err) {
		t.Error("a refused platform wrote an output")
	}
}

// TestDebian13Image: a Debian 13 image (Python 3.13, numpy 2) made by mmdebstrap as a user's
// build would is captured and restored; the manifest says python 3.13 and the kit's check
// refuses a client of another minor version. Debian 13's metadata has no RECORD, and numpy's,
// cloudpickle's and attrs's no top_level.txt either: each checkpoint still records every
// distribution it holds loaded, with the version the image's metadata gives (numpy 2 in the
// pandas checkpoint too, attrs for the module attr), and leaves nothing unmapped; so select
// (by image size: no analysis) sends a pandas request that needs numpy>=2 to the pandas
// checkpoint, and one that needs numpy<2 to neither: it starts cold.
func TestDebian13Image(t *testing.T) {
	t.Parallel()
	layoutDir := debianimage.Layout(t, "trixie") // built once, then cached
	// The unpacked images go with the test: its runs are processes of their own.
	env := map[string]string{"XDG_CACHE_HOME": t.TempDir()}
	dir := testenv.WorkDir(t)
	out := filepath.Join(dir, "out")
	cfg := testConfig{runsc: testenv.RunscPath(t), root: runscRoot(t, dir), rootfs: testenv.Rootfs(t), output: out,
		sets: "  - id: numpy\n    imports: [numpy]\n  - id: pandas\n    imports: [pandas, attr]\n"}.write(t)
	code, stdout, stderr := runProcess(t, env, 10*time.Minute, "capture", "--config", cfg, "--image", "oci-layout:"+layoutDir+":latest")
	if code != exitOK {
		t.Fatalf("capture --image (Debian 13): exit %d\n%s%s", code, stdout, stderr)
	}
	m, err := manifest.Load(filepath.Join(out, manifest.FileName))
	if err != nil {
		t.Fatal(err)
	}
	if m.Python == nil || !strings.HasPrefix(m.Python.Version, "3.13.") || m.Python.CacheTag != "cpython-313" || m.Python.Implementation != "cpython" || m.PythonPath != "/usr/bin/python3" {
		t.Fatalf("manifest python %+v, python_path %q; want 3.13", m.Python, m.PythonPath)
	}
	if err := m.CheckPython(manifest.Python{Version: "3.13", Implementation: "cpython"}); err != nil {
		t.Error(err)
	}
	if err := m.CheckPython(manifest.Python{Version: "3.11.2"}); !errors.Is(err, manifest.ErrPython) || !strings.Contains(err.Error(), "3.11.2") {
		t.Errorf("CheckPython(3.11.2) = %v", err)
	}
	installed := testenv.Distributions(t, filepath.Join(m.Rootfs.Path, "usr/lib/python3/dist-packages"))
	if !strings.HasPrefix(installed["numpy"], "2.") || installed["attrs"] == "" {
		t.Fatalf("the image's distributions %v: want numpy 2 and attrs", installed)
	}
	for _, c := range m.Checkpoints {
		// What each set must record, with the image's versions; pandas's closure may load more
		// of the archive's packages as they change, each of which must be recorded as installed.
		must := []string{"cloudpickle"}
		switch c.ID {
		case "numpy":
			must = append(must, "numpy")
		case "pandas":
			must = append(must, "pandas", "numpy", "python-dateutil", "pytz")
		}
		for _, name := range must {
			if c.Packages[name] == "" {
				t.Errorf("checkpoint %s: packages %v lack %s", c.ID, c.Packages, name)
			}
		}
		for name, version := range c.Packages {
			if installed[name] != version || (c.ID != "pandas" && !slices.Contains(must, name)) {
				t.Errorf("checkpoint %s: records %s %s; the image has %q (the set must record %v)", c.ID, name, version, installed[name], must)
			}
		}
		if c.UnmappedModules != nil {
			t.Errorf("checkpoint %s: unmapped modules %v", c.ID, c.UnmappedModules)
		}
	}
	selectJSON := func(requires string) catalogue.Choice {
		t.Helper()
		code, stdout, stderr := runProcess(t, env, time.Minute, "select", "--config", cfg, "--log-format", "json", "pandas", "--requires", requires)
		var ch catalogue.Choice
		if err := json.Unmarshal([]byte(stdout), &ch); code != exitOK || err != nil {
			t.Fatalf("select pandas --requires %s: exit %d, %v\n%s%s", requires, code, err, stdout, stderr)
		}
		return ch
	}
	if ch := selectJSON("numpy<2"); !ch.Cold || len(ch.PassedOver) != 2 ||
		!strings.Contains(ch.Why, "passed over numpy: holds numpy "+installed["numpy"]+" loaded, not numpy<2") ||
		!strings.Contains(ch.Why, "passed over pandas: holds numpy "+installed["numpy"]+" loaded, not numpy<2") {
		t.Errorf("select pandas --requires numpy<2: %+v; want numpy and pandas passed over, a cold start", ch)
	}
	// No analyze here: the catalogue has no prices, so the smallest checkpoint that holds pandas.
	if ch := selectJSON("numpy>=2"); ch.PassedOver != nil || ch.Checkpoint != "pandas" || ch.Basis != catalogue.BasisImageSize {
		t.Errorf("select pandas --requires numpy>=2: %+v; want the pandas checkpoint, chosen by image size, nothing passed over", ch)
	}
	got := kitCall(t, out, "numpy", `["%d.%d" % __import__("sys").version_info[:2], __import__("sys").modules["numpy"].__version__.split(".")[0]]`)
	if l, _ := got.([]any); len(l) != 2 || l[0] != "3.13" || l[1] != "2" {
		t.Errorf("restored Debian 13 executor: python, numpy's major = %s; want ['3.13', '2']", pycall.Format(got, pycall.ErrorBytes))
	}
}
