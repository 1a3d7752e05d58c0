package main

import (
	"archive/tar"
	"bytes"
	"context"
	"encoding/json"
	"io"
	"io/fs"
	"os"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/google/go-containerregistry/pkg/name"
	v1 "github.com/google/go-containerregistry/pkg/v1"
	"github.com/google/go-containerregistry/pkg/v1/empty"
	"github.com/google/go-containerregistry/pkg/v1/layout"
	"github.com/google/go-containerregistry/pkg/v1/mutate"
	"github.com/google/go-containerregistry/pkg/v1/remote"
	"github.com/google/go-containerregistry/pkg/v1/tarball"

	"readie.dev/pipeline/internal/testenv"
	"readie.dev/pipeline/internal/testenv/debianimage"
	"readie.dev/pipeline/pkg/launch"
	"readie.dev/pipeline/pkg/manifest"
	"readie.dev/pipeline/pkg/measure"
	"readie.dev/pipeline/pkg/pycall"
	"readie.dev/pipeline/pkg/sandbox"
)

// userImage builds what a user's image build job would: the default rootfs without the
// executor (and without numpy and pandas, to stay small) as a base layer (made once, cached),
// plus a layer that deletes a file (.wh.) and replaces a directory opaquely (.wh..wh..opq).
func userImage(t *testing.T) v1.Image {
	t.Helper()
	rootfs := testenv.Rootfs(t)
	var info struct {
		SitePackages string `json:"site_packages"`
	}
	data, _ := os.ReadFile(filepath.Join(rootfs, manifest.RootfsInfoFile))
	json.Unmarshal(data, &info)
	baseLayer := debianimage.RootfsLayer(t, rootfs, []string{"./usr/lib/readie", "." + info.SitePackages + "/readie_executor",
		"./usr/lib/python3/dist-packages/pandas", "./usr/lib/python3/dist-packages/numpy",
		"./run/readie"}) // the executor's mount point, which the pipeline makes
	var buf bytes.Buffer
	tw := tar.NewWriter(&buf)
	for _, h := range []*tar.Header{
		{Name: "etc/.wh.debian_version", Typeflag: tar.TypeReg},
		{Name: "usr/share/readie-opaque/", Typeflag: tar.TypeDir, Mode: 0o755},
		{Name: "usr/share/readie-opaque/.wh..wh..opq", Typeflag: tar.TypeReg},
		{Name: "usr/share/readie-opaque/new", Typeflag: tar.TypeReg, Mode: 0o644, Size: 3},
		{Name: "usr/share/zoneinfo/", Typeflag: tar.TypeDir, Mode: 0o755},
		{Name: "usr/share/zoneinfo/.wh..wh..opq", Typeflag: tar.TypeReg},
	} {
		tw.WriteHeader(h)
		if h.Size > 0 {
			io.WriteString(tw, "new")
		}
	}
	tw.Close()
	upper := buf.Bytes()
	upperLayer, err := tarball.LayerFromOpener(func() (io.ReadCloser, error) { return io.NopCloser(bytes.NewReader(upper)), nil })
	if err != nil {
		t.Fatal(err)
	}
	img, err := mutate.AppendLayers(empty.Image, baseLayer, upperLayer)
	if err != nil {
		t.Fatal(err)
	}
	return img
}

// unchangedSince fails the test when anything under dir (an entry's content, metadata or the
// entries of a directory) changed after marker was written: its status change time is later.
// A rootfs's files are hard links to its base's: call it before another rootfs is linked from
// the same base (a link count changes the status of every file it shares).
func unchangedSince(t *testing.T, dir, marker string) {
	t.Helper()
	ctime := func(fi fs.FileInfo) time.Time {
		st := fi.Sys().(*syscall.Stat_t)
		return time.Unix(st.Ctim.Sec, st.Ctim.Nsec)
	}
	fi, err := os.Lstat(marker)
	if err != nil {
		t.Fatal(err)
	}
	made := ctime(fi)
	var changed []string
	err = filepath.WalkDir(dir, func(p string, d fs.DirEntry, err error) error {
		if err != nil {
			return err
		}
		fi, err := d.Info()
		if err != nil {
			return err
		}
		if ctime(fi).After(made) {
			changed = append(changed, strings.TrimPrefix(p, dir))
		}
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
	if len(changed) > 0 {
		t.Errorf("%s changed after it was made (%s): %v", dir, marker, changed[:min(len(changed), 10)])
	}
}

// planRootfs runs `pipeline plan --image REF` in a process of its own with env added and
// returns the rootfs digest it would use.
func planRootfs(t *testing.T, env map[string]string, cfg, ref string) string {
	t.Helper()
	code, stdout, stderr := runProcess(t, env, 5*time.Minute, "plan", "--config", cfg, "--image", ref, "--log-format", "json")
	if code != exitOK {
		t.Fatalf("plan --image %s: exit %d\n%s", ref, code, stderr)
	}
	var p struct{ Rootfs manifest.Rootfs }
	if err := json.Unmarshal([]byte(stdout), &p); err != nil || !strings.HasPrefix(p.Rootfs.Digest, "sha256:") {
		t.Fatalf("plan's JSON: %v\n%s", err, stdout)
	}
	return p.Rootfs.Digest
}

// TestCaptureFromUserImage: a capture whose root is a user's OCI image (with whiteouts)
// succeeds, passes its smoke test, and a call in the restored sandbox does not see what the
// upper layer deleted; the manifest names the image; the same image through oci-layout:,
// docker-archive: and a registry gives the same rootfs digest; a second capture unpacks nothing.
func TestCaptureFromUserImage(t *testing.T) {
	t.Parallel()
	// The unpacked images go with the test: its runs are processes of their own, with a cache
	// of the test's in their environment.
	env := map[string]string{"XDG_CACHE_HOME": t.TempDir()}
	dir := testenv.WorkDir(t)
	img := userImage(t)
	p, err := layout.Write(filepath.Join(dir, "layout"), empty.Index)
	if err != nil {
		t.Fatal(err)
	}
	if err := p.AppendImage(img, layout.WithAnnotations(map[string]string{"org.opencontainers.image.ref.name": "v1"})); err != nil {
		t.Fatal(err)
	}
	cfg := testConfig{runsc: testenv.RunscPath(t), root: runscRoot(t, dir), rootfs: testenv.Rootfs(t), output: filepath.Join(dir, "out"),
		sets: "  - id: small\n    imports: [json, email.parser]\n"}.write(t)
	ref := "oci-layout:" + filepath.Join(dir, "layout") + ":v1"
	code, stdout, stderr := runProcess(t, env, 5*time.Minute, "capture", "--config", cfg, "--image", ref)
	if code != exitOK || !strings.Contains(stderr, "unpack: done") {
		t.Fatalf("capture --image: exit %d\n%s%s", code, stdout, stderr)
	}
	m, err := manifest.Load(filepath.Join(dir, "out", manifest.FileName))
	if err != nil {
		t.Fatal(err)
	}
	digest, _ := img.Digest()
	if m.Image == nil || m.Image.Ref != ref || m.Image.Digest != digest.String() || !m.Checkpoints[1].Smoke.OK {
		t.Fatalf("manifest image %+v, checkpoints %+v", m.Image, m.Checkpoints)
	}

	// A call in a restored sandbox: the deleted file and the opaque directory's old entries
	// are gone, the new entry is there.
	rt := &launch.Runtime{Path: testenv.RunscPath(t), Root: filepath.Join(dir, "root"), Flags: sandbox.DefaultFlags(), Lease: testenv.Lease(t)}
	r := &measure.Restorer{Launcher: launch.Launcher{Runtime: rt, Rootfs: m.Rootfs.Path, WorkDir: dir, Timeout: time.Minute}, Flags: m.RestoreFlags}
	request, _ := pycall.EvalRequest(`[__import__("os").path.exists(p) for p in ("/etc/debian_version", "/usr/share/readie-opaque/new", "/usr/share/zoneinfo/UTC", "/etc/os-release")]`)
	var seen []any
	_, err = r.TimedCall(context.Background(), launch.Call{SetID: "small", Step: "call", Image: launch.Image{Dir: filepath.Join(dir, "out", "small"), Flags: r.Flags}, Request: request, Check: func(resp []byte) error {
		v, err := pycall.DecodeEnvelope(resp)
		seen, _ = v.([]any)
		return err
	}})
	if err != nil {
		t.Fatal(err)
	}
	if len(seen) != 4 || seen[0] != false || seen[1] != true || seen[2] != false || seen[3] != true {
		t.Errorf("exists(/etc/debian_version, opaque/new, zoneinfo/UTC, /etc/os-release) = %s, want [False, True, False, True]", pycall.Format(seen, pycall.ErrorBytes))
	}
	// The captures, smoke tests, measures and this call left the rootfs as it was made: it is
	// named by its digest and shared (runsc once made the executor's mount point in it).
	unchangedSince(t, m.Rootfs.Path, filepath.Join(filepath.Dir(m.Rootfs.Path), "complete"))

	// Again: nothing is unpacked, every set is reused.
	code, stdout, stderr = runProcess(t, env, 5*time.Minute, "capture", "--config", cfg, "--image", ref)
	if code != exitOK || strings.Contains(stderr, "unpack: done") || tableColumn(stdout, 1)["small"] != "reused" {
		t.Fatalf("second capture: exit %d\n%s%s", code, stdout, stderr)
	}

	// The same image through a docker archive and a registry: the same rootfs.
	archive := filepath.Join(dir, "image.tar")
	tag, _ := name.NewTag("example.com/readie/user:v1")
	if err := tarball.WriteToFile(archive, tag, img); err != nil {
		t.Fatal(err)
	}
	reg := testenv.StartRegistry(t, false)
	pushed, _ := name.NewTag(reg.Host + "/readie/user:v1")
	if err := remote.Write(pushed, img); err != nil {
		t.Fatal(err)
	}
	want := m.Rootfs.Digest
	for _, other := range []string{"docker-archive:" + archive, pushed.String()} {
		if got := planRootfs(t, env, cfg, other); got != want {
			t.Errorf("%s gives rootfs %s, the OCI layout %s", other, got, want)
		}
	}
}

// TestImageWithoutPython: an image the executor cannot run in fails up front, exit 2, naming
// what is missing and the image.
func TestImageWithoutPython(t *testing.T) {
	t.Setenv("XDG_CACHE_HOME", t.TempDir())
	dir := testenv.WorkDir(t)
	var buf bytes.Buffer
	tw := tar.NewWriter(&buf)
	tw.WriteHeader(&tar.Header{Name: "etc/hostname", Typeflag: tar.TypeReg, Mode: 0o644, Size: 6})
	io.WriteString(tw, "nopy\n\n"[:6])
	tw.Close()
	data := buf.Bytes()
	l, _ := tarball.LayerFromOpener(func() (io.ReadCloser, error) { return io.NopCloser(bytes.NewReader(data)), nil })
	img, _ := mutate.AppendLayers(empty.Image, l)
	archive := filepath.Join(dir, "nopython.tar")
	tag, _ := name.NewTag("example.com/nopython:v1")
	if err := tarball.WriteToFile(archive, tag, img); err != nil {
		t.Fatal(err)
	}
	cfg := testConfig{runsc: testenv.RunscPath(t), root: runscRoot(t, dir), rootfs: testenv.Rootfs(t), output: filepath.Join(dir, "out")}.write(t)
	code, _, stderr := runCLI(t, "capture", "--config", cfg, "--image", "docker-archive:"+archive)
	if code != exitUsage || !strings.Contains(stderr, "python3 is missing") || !strings.Contains(stderr, archive) {
		t.Fatalf("exit %d\n%s", code, stderr)
	}
	if _, err := os.Stat(filepath.Join(dir, "out")); !os.IsNotExist(err) {
		t.Error("the output was written")
	}
}
