package main

import (
	"archive/tar"
	"context"
	"encoding/json"
	"errors"
	"io"
	"net"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	v1 "github.com/google/go-containerregistry/pkg/v1"
	"github.com/google/go-containerregistry/pkg/v1/empty"
	"github.com/google/go-containerregistry/pkg/v1/layout"
	"github.com/google/go-containerregistry/pkg/v1/mutate"
	"github.com/google/go-containerregistry/pkg/v1/random"
	"github.com/google/go-containerregistry/pkg/v1/types"

	"readie.dev/pipeline/internal/testenv"
	"readie.dev/pipeline/internal/testenv/debianimage"
	"readie.dev/pipeline/pkg/executorproto"
	"readie.dev/pipeline/pkg/manifest"
	"readie.dev/pipeline/pkg/pycall"
	"readie.dev/pipeline/pkg/runsc"
	"readie.dev/pipeline/pkg/sandbox"
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

// kitCall restores checkpoint id of the output out as a worker does, through the kit alone
// (manifest.Load, sandbox.RestoreSpec, sandbox.PrepareHostDir, pkg/runsc, executorproto),
// and returns what the executor answers to expr.
func kitCall(t *testing.T, out, id, expr string) any {
	t.Helper()
	m, err := manifest.Load(filepath.Join(out, manifest.FileName))
	if err != nil {
		t.Fatal(err)
	}
	work := testenv.WorkDir(t)
	host := filepath.Join(work, "h")
	if err := os.Mkdir(host, 0o755); err != nil {
		t.Fatal(err)
	}
	spec, err := sandbox.RestoreSpec(filepath.Join(out, m.Spec), m.SpecFingerprint, m.RunscFlags, sandbox.RestoreOptions{Rootfs: m.Rootfs.Path, HostDir: host, Env: []string{"KIT=1"}})
	if err != nil {
		t.Fatal(err)
	}
	if err := sandbox.PrepareHostDir(host, spec.Process.User); err != nil {
		t.Fatal(err)
	}
	b := filepath.Join(work, "b")
	os.Mkdir(b, 0o700)
	data, _ := json.Marshal(spec)
	os.WriteFile(filepath.Join(b, "config.json"), data, 0o600)
	r := &runsc.Runsc{Path: testenv.RunscPath(t), Root: runscRoot(t, work), GlobalArgs: m.RunscFlags}
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	// Pipes, as at capture: a restored process needs stdio of the same kinds.
	pr, pw, err := os.Pipe()
	if err != nil {
		t.Fatal(err)
	}
	logged := make(chan string, 1)
	go func() { data, _ := io.ReadAll(pr); logged <- string(data) }()
	defer r.Delete(context.WithoutCancel(ctx), "kit", &runsc.DeleteOpts{Force: true})
	err = r.Create(ctx, "kit", b, &runsc.CreateOpts{IO: runsc.IO{Stdout: pw, Stderr: pw}})
	if err == nil {
		_, err = r.Restore(ctx, "kit", b, &runsc.RestoreOpts{ImagePath: filepath.Join(out, id), Detach: true, ExtraArgs: m.RestoreFlags})
	}
	var value any
	if err == nil {
		var conn net.Conn
		if conn, err = executorproto.Dial(ctx, filepath.Join(host, sandbox.SocketName)); err == nil {
			request, _ := pycall.EvalRequest(expr)
			var response []byte
			if response, err = executorproto.Call(ctx, conn, request); err == nil {
				value, err = pycall.DecodeEnvelope(response)
			}
			conn.Close()
		}
	}
	deleteErr := r.Delete(ctx, "kit", &runsc.DeleteOpts{Force: true})
	pw.Close()
	if err = errors.Join(err, deleteErr); err != nil {
		t.Fatalf("restore of %s through the kit: %v\nexecutor:\n%s", id, err, <-logged)
	}
	return value
}

// TestVenvImage: an image whose Python is a virtualenv named only by its config (PATH and
// VIRTUAL_ENV), with a module only the venv has: plan, capture, smoke and verify pass, the
// manifest's python_path is the venv's python3, and a restore through the kit finds the module
// preloaded and the image's environment.
func TestVenvImage(t *testing.T) {
	t.Parallel()
	// The unpacked images go with the test: its runs are processes of their own.
	env := map[string]string{"XDG_CACHE_HOME": t.TempDir()}
	dir := testenv.WorkDir(t)
	base := userImage(t)
	site := "opt/venv/lib/python3.11/site-packages/"
	entries := []tar.Header{
		dirEntry("opt/venv/"), dirEntry("opt/venv/bin/"), dirEntry("opt/venv/lib/"), dirEntry("opt/venv/lib/python3.11/"), dirEntry(site),
		file("opt/venv/pyvenv.cfg", "home = /usr/bin\ninclude-system-site-packages = false\nversion = 3.11.2\n"),
		tar.Header{Name: "opt/venv/bin/python3", Typeflag: tar.TypeSymlink, Linkname: "/usr/bin/python3"},
		tar.Header{Name: "opt/venv/bin/python", Typeflag: tar.TypeSymlink, Linkname: "python3"},
		file(site+"venvonly.py", "WHERE = 'venv'\n"),
	}
	// cloudpickle, in the venv only: the system's is not on a venv's path.
	cp := filepath.Join(testenv.Rootfs(t), "usr/lib/python3/dist-packages/cloudpickle")
	files, _ := os.ReadDir(cp)
	entries = append(entries, dirEntry(site+"cloudpickle/"))
	for _, f := range files {
		if data, err := os.ReadFile(filepath.Join(cp, f.Name())); err == nil && strings.HasSuffix(f.Name(), ".py") {
			entries = append(entries, file(site+"cloudpickle/"+f.Name(), string(data)))
		}
	}
	img := withConfig(t, base, tarLayer(t, entries...), v1.Config{Env: []string{
		"PATH=/opt/venv/bin:/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin", "VIRTUAL_ENV=/opt/venv",
	}})
	ref := writeLayout(t, filepath.Join(dir, "layout"), img)
	out := filepath.Join(dir, "out")
	cfg := testConfig{runsc: testenv.RunscPath(t), root: runscRoot(t, dir), rootfs: testenv.Rootfs(t), output: out,
		sets: "  - id: venv\n    imports: [venvonly, json]\n"}.write(t)
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
	if m.Process == nil || !strings.Contains(strings.Join(m.Process.Env, " "), "VIRTUAL_ENV=/opt/venv") {
		t.Errorf("manifest process %+v: want the image's Env", m.Process)
	}
	c := m.Checkpoints[len(m.Checkpoints)-1]
	if c.ID != "venv" || !c.Smoke.OK || c.KeyParts["image_config"] == "" {
		t.Errorf("checkpoint %+v: want venv, smoke ok, an image_config key part", c)
	}
	if code, stdout, stderr := runProcess(t, env, 10*time.Minute, "verify", "--config", cfg); code != exitOK {
		t.Fatalf("verify: exit %d\n%s%s", code, stdout, stderr)
	}
	got := kitCall(t, out, "venv", `[__import__("sys").modules["venvonly"].WHERE, __import__("sys").prefix, __import__("os").environ.get("VIRTUAL_ENV"), __import__("os").environ.get("KIT")]`)
	if l, _ := got.([]any); len(l) != 4 || l[0] != "venv" || l[1] != "/opt/venv" || l[2] != "/opt/venv" || l[3] != "1" {
		t.Errorf("restored through the kit: %s; want ['venv', '/opt/venv', '/opt/venv', '1'] (venvonly preloaded, the image's VIRTUAL_ENV, the worker's KIT)", pycall.Format(got, pycall.ErrorBytes))
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
	passwd, err := os.ReadFile(filepath.Join(testenv.Rootfs(t), "etc/passwd"))
	if err != nil {
		t.Fatal(err)
	}
	group, _ := os.ReadFile(filepath.Join(testenv.Rootfs(t), "etc/group"))
	img := withConfig(t, base, tarLayer(t,
		file("etc/passwd", string(passwd)+"app:x:1234:1235::/home/app:/bin/sh\n"),
		file("etc/group", string(group)+"app:x:1235:\n"),
		dirEntry("home/"), dirEntry("home/app/"),
		dirEntry("srv/"), dirEntry("srv/work/"), dirEntry("srv/work/lib/"),
		file("srv/work/lib/appmod.py", "NAME = 'app'\n"),
		tar.Header{Name: "usr/local/bin/python3", Typeflag: tar.TypeSymlink, Linkname: "/usr/bin/python3.11"},
	), v1.Config{User: "app", WorkingDir: "/srv/work", Env: []string{"PATH=/usr/local/bin:/usr/bin:/bin", "PYTHONPATH=/srv/work/lib"}})
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
// refuses a client of another minor version.
func TestDebian13Image(t *testing.T) {
	t.Parallel()
	layoutDir := debianimage.Layout(t, "trixie") // built once, then cached
	// The unpacked images go with the test: its runs are processes of their own.
	env := map[string]string{"XDG_CACHE_HOME": t.TempDir()}
	dir := testenv.WorkDir(t)
	out := filepath.Join(dir, "out")
	cfg := testConfig{runsc: testenv.RunscPath(t), root: runscRoot(t, dir), rootfs: testenv.Rootfs(t), output: out,
		sets: "  - id: numpy\n    imports: [numpy]\n"}.write(t)
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
	got := kitCall(t, out, "numpy", `["%d.%d" % __import__("sys").version_info[:2], __import__("sys").modules["numpy"].__version__.split(".")[0]]`)
	if l, _ := got.([]any); len(l) != 2 || l[0] != "3.13" || l[1] != "2" {
		t.Errorf("restored Debian 13 executor: python, numpy's major = %s; want ['3.13', '2']", pycall.Format(got, pycall.ErrorBytes))
	}
}
