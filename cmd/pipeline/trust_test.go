package main

import (
	"archive/tar"
	"bufio"
	"bytes"
	"compress/gzip"
	"context"
	"crypto/sha256"
	"encoding/json"
	"fmt"
	"io"
	"io/fs"
	"net"
	"os"
	"path/filepath"
	"sort"
	"strings"
	"syscall"
	"testing"
	"time"

	v1 "github.com/google/go-containerregistry/pkg/v1"
	"github.com/google/go-containerregistry/pkg/v1/empty"
	"github.com/google/go-containerregistry/pkg/v1/layout"
	"github.com/google/go-containerregistry/pkg/v1/mutate"
	"github.com/google/go-containerregistry/pkg/v1/tarball"

	"readie.dev/pipeline/internal/oci/ocitest"
	"readie.dev/pipeline/internal/oci/output"
	"readie.dev/pipeline/internal/outdir"
	"readie.dev/pipeline/internal/testenv"
	"readie.dev/pipeline/pkg/manifest"
)

// tarLayer is a layer of the given entries (regular files unless a header says otherwise).
func tarLayer(t *testing.T, entries ...tar.Header) v1.Layer {
	t.Helper()
	var buf bytes.Buffer
	tw := tar.NewWriter(&buf)
	for _, h := range entries {
		body := h.Linkname
		if h.Typeflag == 0 || h.Typeflag == tar.TypeReg {
			h.Typeflag, h.Size, h.Linkname = tar.TypeReg, int64(len(body)), ""
		} else {
			body = ""
		}
		if h.Mode == 0 {
			h.Mode = 0o644
		}
		if err := tw.WriteHeader(&h); err != nil {
			t.Fatal(err)
		}
		io.WriteString(tw, body)
	}
	tw.Close()
	return ocitest.Layer(t, buf.Bytes())
}

// file is a regular file entry of tarLayer (its body in Linkname, for brevity).
func file(name, body string) tar.Header { return tar.Header{Name: name, Linkname: body} }

// writeLayout writes img into a new OCI layout at dir, tagged v1.
func writeLayout(t *testing.T, dir string, img v1.Image) string {
	t.Helper()
	p, err := layout.Write(dir, empty.Index)
	if err != nil {
		t.Fatal(err)
	}
	if err := p.AppendImage(img, layout.WithAnnotations(map[string]string{"org.opencontainers.image.ref.name": "v1"})); err != nil {
		t.Fatal(err)
	}
	return "oci-layout:" + dir + ":v1"
}

// hashTree is a digest of everything under dir that a write could change: each entry's path,
// type, mode, owner, size, and a file's content or a link's target.
func hashTree(t *testing.T, dir string) string {
	t.Helper()
	var lines []string
	err := filepath.WalkDir(dir, func(p string, d fs.DirEntry, err error) error {
		if err != nil {
			return err
		}
		fi, err := os.Lstat(p)
		if err != nil {
			return err
		}
		st := fi.Sys().(*syscall.Stat_t)
		rel, _ := filepath.Rel(dir, p)
		line := fmt.Sprintf("%s %v %d:%d", rel, fi.Mode(), st.Uid, st.Gid)
		switch {
		case fi.Mode()&fs.ModeSymlink != 0:
			target, _ := os.Readlink(p)
			line += " -> " + target
		case fi.Mode().IsRegular():
			f, err := os.Open(p)
			if err != nil {
				return err
			}
			h := sha256.New()
			io.Copy(h, f)
			f.Close()
			line += fmt.Sprintf(" %d %x", fi.Size(), h.Sum(nil))
		}
		lines = append(lines, line)
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
	sort.Strings(lines)
	sum := sha256.Sum256([]byte(strings.Join(lines, "\n")))
	return fmt.Sprintf("%x (%d entries)", sum, len(lines))
}

// planJSON runs `pipeline plan --image REF` in a process of its own whose XDG_CACHE_HOME is
// cache, and returns its exit code, the rootfs it would use and its stderr.
func planJSON(t *testing.T, cache, cfg, ref string) (int, manifest.Rootfs, string) {
	t.Helper()
	code, stdout, stderr := runProcess(t, map[string]string{"XDG_CACHE_HOME": cache}, 5*time.Minute, "plan", "--config", cfg, "--image", ref, "--log-format", "json")
	var p struct{ Rootfs manifest.Rootfs }
	if code == exitOK {
		if err := json.Unmarshal([]byte(stdout), &p); err != nil {
			t.Fatalf("plan's JSON: %v\n%s", err, stdout)
		}
	}
	return code, p.Rootfs, stderr
}

// completeInCache lists the directories of the cache a later run could take as made: unpacked
// images and assembled rootfs directories (not hidden ones, not package layers).
func completeInCache(t *testing.T, cache string) []string {
	t.Helper()
	var found []string
	for _, parent := range []string{filepath.Join(cache, "readie", "rootfs"), filepath.Join(cache, "readie", "rootfs", "oci")} {
		entries, _ := os.ReadDir(parent)
		for _, e := range entries {
			if e.IsDir() && !strings.HasPrefix(e.Name(), ".") && e.Name() != "oci" && e.Name() != "layers" {
				found = append(found, filepath.Join(parent, e.Name()))
			}
		}
	}
	return found
}

// hostileModule leaves a chroot the classic way (a chroot below the working directory, then
// ".." up to the real root) and writes marker there, and writes into its own root, the cache's
// files included: what a .pth file or sitecustomize of any image may run.
const hostileModule = `import os
MARKER = %q
# Made only by running this module, so the test can find it in the checkpoint's memory.
RAN = "readie-hostile-" + str(6 * 7) + "-ran"
def _attack():
    for p in ("/readie-was-here", "/usr/lib/readie-was-here", "/etc/os-release"):
        try:
            with open(p, "a") as f:
                f.write("hostile\n")
        except OSError:
            pass
    try:
        os.makedirs("/tmp/.esc", exist_ok=True)
        fd = os.open("/", os.O_RDONLY)
        os.chroot("/tmp/.esc")
        os.fchdir(fd)
        for _ in range(64):
            os.chdir("..")
        os.chroot(".")
    except OSError:
        pass
    try:
        os.makedirs(os.path.dirname(MARKER), exist_ok=True)
        with open(MARKER, "w") as f:
            f.write("escaped\n")
    except OSError:
        pass
_attack()
`

// TestHostileImageStaysInItsSandbox: an image whose .pth file and sitecustomize try to leave a
// chroot and write on the host, and to write into their own root: `plan --image` (the probe
// and the precompile run the image's python3) and `capture --image` (the capture and the
// smoke test) leave no such file on the host, and the unpacked and assembled directories in
// the cache do not change.
func TestHostileImageStaysInItsSandbox(t *testing.T) {
	t.Parallel()
	cache := t.TempDir()
	dir := testenv.WorkDir(t)
	marker := filepath.Join(dir, "escaped", "on-the-host")
	module := fmt.Sprintf(hostileModule, marker)
	img, err := mutate.AppendLayers(userImage(t), tarLayer(t,
		file("usr/lib/python3/dist-packages/readie_hostile.py", module),
		file("usr/lib/python3/dist-packages/zz-hostile.pth", "import readie_hostile\n"),
		file("usr/lib/python3.11/sitecustomize.py", "import readie_hostile\n"),
	))
	if err != nil {
		t.Fatal(err)
	}
	ref := writeLayout(t, filepath.Join(dir, "layout"), img)
	cfg := testConfig{runsc: testenv.RunscPath(t), root: runscRoot(t, dir), rootfs: testenv.Rootfs(t), output: filepath.Join(dir, "out"),
		sets: "  - id: small\n    imports: [json]\n"}.write(t)

	code, rootfs, stderr := planJSON(t, cache, cfg, ref)
	if code != exitOK {
		t.Fatalf("plan --image: exit %d\n%s", code, stderr)
	}
	if _, err := os.Stat(marker); !os.IsNotExist(err) {
		t.Fatalf("the image's code wrote %s on the host (%v)", marker, err)
	}
	digest, _ := img.Digest()
	unpacked := filepath.Join(cache, "readie", "rootfs", "oci", digest.Hex, "rootfs")
	want, _ := os.ReadFile(filepath.Join(testenv.Rootfs(t), "etc/os-release"))
	for _, root := range []string{unpacked, rootfs.Path} {
		if got, err := os.ReadFile(filepath.Join(root, "etc/os-release")); err != nil || !bytes.Equal(got, want) {
			t.Errorf("%s/etc/os-release was changed: %q %v", root, got, err)
		}
		for _, p := range []string{"readie-was-here", "usr/lib/readie-was-here"} {
			if _, err := os.Lstat(filepath.Join(root, p)); err == nil {
				t.Errorf("the image's code wrote %s into %s", p, root)
			}
		}
	}
	before := []string{hashTree(t, unpacked), hashTree(t, rootfs.Path)}

	code, stdout, stderr := runProcess(t, map[string]string{"XDG_CACHE_HOME": cache}, 5*time.Minute, "capture", "--config", cfg, "--image", ref)
	if code != exitOK {
		t.Fatalf("capture --image: exit %d\n%s%s", code, stdout, stderr)
	}
	if _, err := os.Stat(marker); !os.IsNotExist(err) {
		t.Fatalf("the image's code wrote %s on the host (%v)", marker, err)
	}
	if after := []string{hashTree(t, unpacked), hashTree(t, rootfs.Path)}; after[0] != before[0] || after[1] != before[1] {
		t.Errorf("the cache changed: %v, then %v", before, after)
	}
	// The control: the image's code did run, in the sandbox (its string is in the memory the
	// checkpoint saved), so the test above tried something.
	pages, err := os.ReadFile(filepath.Join(dir, "out", "small", "pages.img"))
	if err != nil || !bytes.Contains(pages, []byte("readie-hostile-42-ran")) {
		t.Errorf("the hostile module never ran in the sandbox (%v): the test proves nothing", err)
	}
}

// forgeConfig rewrites the image of the OCI layout at dir (tagged v1) the way a forger would,
// keeping the layout consistent with itself: edit changes the config, which is written again
// with a manifest that names it.
func forgeConfig(t *testing.T, dir string, edit func(*v1.ConfigFile)) {
	t.Helper()
	img, im := ocitest.FirstImage(t, dir)
	m, _ := img.Manifest()
	cfg, _ := img.ConfigFile()
	edit(cfg)
	write := func(data []byte) v1.Descriptor {
		sum := sha256.Sum256(data)
		h := v1.Hash{Algorithm: "sha256", Hex: fmt.Sprintf("%x", sum)}
		if err := os.WriteFile(filepath.Join(dir, "blobs", "sha256", h.Hex), data, 0o644); err != nil {
			t.Fatal(err)
		}
		return v1.Descriptor{Digest: h, Size: int64(len(data))}
	}
	rawConfig, _ := json.Marshal(cfg)
	d := write(rawConfig)
	m.Config.Digest, m.Config.Size = d.Digest, d.Size
	rawManifest, _ := json.Marshal(m)
	md := write(rawManifest)
	md.MediaType, md.Annotations = im.Manifests[0].MediaType, im.Manifests[0].Annotations
	im.Manifests = []v1.Descriptor{md}
	data, _ := json.Marshal(im)
	if err := os.WriteFile(filepath.Join(dir, "index.json"), data, 0o644); err != nil {
		t.Fatal(err)
	}
}

// TestForgedImagesAreRefused: an OCI layout whose layer blob holds other bytes under its name,
// and an image whose config claims another image's diff IDs, are refused (exit 1) naming the
// layer, the expected and the actual digest; nothing a later run could take as made is left
// in the cache; the other image's rootfs is neither served nor changed, whichever comes first.
func TestForgedImagesAreRefused(t *testing.T) {
	t.Parallel()
	dir := testenv.WorkDir(t)
	cfg := testConfig{runsc: testenv.RunscPath(t), root: runscRoot(t, dir), rootfs: testenv.Rootfs(t), output: filepath.Join(dir, "out")}.write(t)

	t.Run("other bytes under a blob's name", func(t *testing.T) {
		cache := t.TempDir()
		img, _ := mutate.AppendLayers(empty.Image, tarLayer(t, file("etc/hostname", "tiny\n")))
		layoutDir := filepath.Join(t.TempDir(), "layout")
		ref := writeLayout(t, layoutDir, img)
		m, _ := img.Manifest()
		var other bytes.Buffer
		zw := gzip.NewWriter(&other)
		tw := tar.NewWriter(zw)
		tw.WriteHeader(&tar.Header{Name: "etc/hostname", Typeflag: tar.TypeReg, Mode: 0o644, Size: 7})
		io.WriteString(tw, "forged\n")
		tw.Close()
		zw.Close()
		os.WriteFile(filepath.Join(layoutDir, "blobs", "sha256", m.Layers[0].Digest.Hex), other.Bytes(), 0o644)
		code, _, stderr := planJSON(t, cache, cfg, ref)
		actual := fmt.Sprintf("sha256:%x", sha256.Sum256(other.Bytes()))
		if code != exitFailed || !strings.Contains(stderr, "layer 1 of 1 ("+m.Layers[0].Digest.String()+")") ||
			!strings.Contains(stderr, "expected "+m.Layers[0].Digest.String()) || !strings.Contains(stderr, "got "+actual) {
			t.Fatalf("exit %d\n%s", code, stderr)
		}
		if found := completeInCache(t, cache); len(found) != 0 {
			t.Errorf("left in the cache: %v", found)
		}
	})

	// Image A, and image B whose config claims A's diff IDs over layers of its own.
	a := userImage(t)
	layers, _ := a.Layers()
	b, _ := mutate.AppendLayers(empty.Image, layers[0], tarLayer(t, file("usr/share/readie-opaque/new", "forged\n")))
	cfgA, _ := a.ConfigFile()
	manifestB, _ := b.Manifest()
	refA := writeLayout(t, filepath.Join(dir, "a"), a)
	refB := writeLayout(t, filepath.Join(dir, "b"), b)
	forgeConfig(t, filepath.Join(dir, "b"), func(c *v1.ConfigFile) { c.RootFS.DiffIDs = cfgA.RootFS.DiffIDs })
	refuseB := func(t *testing.T, cache string) {
		t.Helper()
		code, _, stderr := planJSON(t, cache, cfg, refB)
		if code != exitFailed || !strings.Contains(stderr, "layer 2 of 2 ("+manifestB.Layers[1].Digest.String()+")") ||
			!strings.Contains(stderr, "uncompressed tar: expected "+cfgA.RootFS.DiffIDs[1].String()) {
			t.Fatalf("forged config: exit %d\n%s", code, stderr)
		}
	}

	t.Run("another image's diff IDs, after it", func(t *testing.T) {
		cache := t.TempDir()
		code, rootfsA, stderr := planJSON(t, cache, cfg, refA)
		if code != exitOK {
			t.Fatalf("plan A: exit %d\n%s", code, stderr)
		}
		made := completeInCache(t, cache)
		digestA, _ := a.Digest()
		dirsA := []string{filepath.Dir(rootfsA.Path), filepath.Join(cache, "readie", "rootfs", "oci", digestA.Hex)}
		before := []string{hashTree(t, dirsA[0]), hashTree(t, dirsA[1])}
		refuseB(t, cache)
		if after := completeInCache(t, cache); strings.Join(after, " ") != strings.Join(made, " ") {
			t.Errorf("the cache held %v, then %v", made, after)
		}
		if after := []string{hashTree(t, dirsA[0]), hashTree(t, dirsA[1])}; after[0] != before[0] || after[1] != before[1] {
			t.Errorf("A's directories changed: %v, then %v", before, after)
		}
	})

	t.Run("another image's diff IDs, before it", func(t *testing.T) {
		cache := t.TempDir()
		refuseB(t, cache)
		if found := completeInCache(t, cache); len(found) != 0 {
			t.Errorf("left in the cache: %v", found)
		}
		code, rootfsA, stderr := planJSON(t, cache, cfg, refA)
		if code != exitOK {
			t.Fatalf("plan A: exit %d\n%s", code, stderr)
		}
		if data, err := os.ReadFile(filepath.Join(rootfsA.Path, "usr/share/readie-opaque/new")); err != nil || string(data) != "new" {
			t.Errorf("A's rootfs holds %q (%v), want A's own file", data, err)
		}
	})
}

// TestImageLimits: a layer of a few KiB whose sparse entry expands to 2 GiB is refused by
// limits.image_file_bytes before it is written (exit 2, naming the entry and the key), and
// nothing is left in the cache.
func TestImageLimits(t *testing.T) {
	t.Parallel()
	cache := t.TempDir()
	dir := testenv.WorkDir(t)
	var buf bytes.Buffer
	record := func(k, v string) string {
		rest := " " + k + "=" + v + "\n"
		for n := len(rest); ; {
			if s := fmt.Sprintf("%d%s", n, rest); len(s) == n {
				return s
			} else {
				n = len(s)
			}
		}
	}
	records := record("GNU.sparse.major", "1") + record("GNU.sparse.minor", "0") + record("GNU.sparse.name", "big") + record("GNU.sparse.realsize", fmt.Sprint(2<<30))
	header := func(name string, typ byte, size int) {
		b := make([]byte, 512)
		copy(b, name)
		copy(b[100:], "0000644\x000000000\x000000000\x00")
		copy(b[124:], fmt.Sprintf("%011o\x0000000000000\x00        ", size))
		b[156] = typ
		copy(b[257:], "ustar\x0000")
		sum := 0
		for _, c := range b {
			sum += int(c)
		}
		copy(b[148:], fmt.Sprintf("%06o\x00 ", sum))
		buf.Write(b)
	}
	header("PaxHeaders/big", 'x', len(records))
	buf.Write(append([]byte(records), make([]byte, 512-len(records))...))
	header("GNUSparseFile.0/big", '0', 512)
	buf.Write(append([]byte("0\n"), make([]byte, 510+1024)...))
	data := buf.Bytes()
	l, _ := tarball.LayerFromOpener(func() (io.ReadCloser, error) { return io.NopCloser(bytes.NewReader(data)), nil })
	img, _ := mutate.AppendLayers(empty.Image, l)
	ref := writeLayout(t, filepath.Join(dir, "layout"), img)
	cfg := testConfig{runsc: testenv.RunscPath(t), root: runscRoot(t, dir), rootfs: testenv.Rootfs(t), output: filepath.Join(dir, "out")}.write(t)
	text, _ := os.ReadFile(cfg)
	os.WriteFile(cfg, append(text, []byte("limits:\n  image_file_bytes: 1MiB\n")...), 0o644)
	code, _, stderr := planJSON(t, cache, cfg, ref)
	if code != exitUsage || !strings.Contains(stderr, `entry \"big\": 2 GiB exceeds the limit on one file, 1 MiB (limits.image_file_bytes)`) {
		t.Fatalf("exit %d\n%s", code, stderr)
	}
	if found := completeInCache(t, cache); len(found) != 0 {
		t.Errorf("left in the cache: %v", found)
	}
}

// TestImageFetchBounded: a registry that accepts connections and never answers holds
// `plan --image` no longer than timeouts.registry; the error says so.
func TestImageFetchBounded(t *testing.T) {
	t.Parallel()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer ln.Close()
	go func() {
		for {
			c, err := ln.Accept()
			if err != nil {
				return
			}
			defer c.Close() // held open, never answered
		}
	}()
	dir := testenv.WorkDir(t)
	cfg := testConfig{runsc: testenv.RunscPath(t), root: runscRoot(t, dir), rootfs: testenv.Rootfs(t), output: filepath.Join(dir, "out")}.write(t)
	text, _ := os.ReadFile(cfg)
	os.WriteFile(cfg, []byte(strings.Replace(string(text), "runsc_command: 30s", "runsc_command: 30s\n  registry: 3s", 1)), 0o644)
	code, _, stderr := runProcess(t, map[string]string{"XDG_CACHE_HOME": t.TempDir()}, 2*time.Minute, "plan", "--config", cfg, "--image", ln.Addr().String()+"/readie/user:v1")
	if code != exitFailed || !strings.Contains(stderr, "exceeded timeouts.registry (3s)") {
		t.Fatalf("exit %d\n%s", code, stderr)
	}
}

// TestPullRefusesForgedLayer: a pull from a layout whose layer blob holds other bytes fails
// (exit 1) naming the layer, and leaves the output unwritten.
func TestPullRefusesForgedLayer(t *testing.T) {
	t.Parallel()
	dir := testenv.WorkDir(t)
	cfg := smallOutput(t, dir)
	layoutDir := filepath.Join(dir, "layout")
	if code, _, stderr := runCLI(t, "push", "--runtime", "--config", cfg, "oci-layout:"+layoutDir+":v1"); code != exitOK {
		t.Fatalf("push: %s", stderr)
	}
	img, _ := ocitest.FirstImage(t, layoutDir)
	m, _ := img.Manifest()
	// The manifest.json layer (the last before the runtime's two, which pull skips), replaced
	// by the first checkpoint's: a valid layer of another digest.
	i := len(m.Layers) - 3
	last, first := m.Layers[i].Digest, m.Layers[0].Digest
	if runtime := m.Annotations[output.AnnotationRuntimeRunsc]; runtime != m.Layers[i+1].Digest.String() {
		t.Fatalf("layer %d is %s, the runtime's runsc layer %s: the layers are not output, runsc, rootfs", i+2, m.Layers[i+1].Digest, runtime)
	}
	data, _ := os.ReadFile(filepath.Join(layoutDir, "blobs", "sha256", first.Hex))
	os.WriteFile(filepath.Join(layoutDir, "blobs", "sha256", last.Hex), data, 0o644)
	pullRefused(t, cfg, "oci-layout:"+layoutDir+":v1", filepath.Join(dir, "pulled"),
		fmt.Sprintf("layer %d of %d (%s)", i+1, len(m.Layers), last), "got "+first.String())
}

// TestPushMessages: push logs each layer it uploads once (uncompressed and compressed MiB),
// and a second push of the same output says that it uploaded nothing; pull reports the same
// sizes per layer; a tag a layout lacks is refused listing the tags it has.
func TestPushMessages(t *testing.T) {
	t.Parallel()
	dir := testenv.WorkDir(t)
	cfg := smallOutput(t, dir)
	ref := "oci-layout:" + filepath.Join(dir, "layout") + ":v1"
	code, _, stderr := runCLI(t, "push", "--config", cfg, "--log-format", "json", ref)
	if code != exitOK {
		t.Fatalf("push: %s", stderr)
	}
	counts := map[string]int{}
	var summary map[string]any
	for _, line := range strings.Split(strings.TrimSpace(stderr), "\n") {
		var e map[string]any
		json.Unmarshal([]byte(line), &e)
		if e["msg"] == "push: layer" && e["mib"] != nil && e["compressed_mib"] != nil {
			counts[fmt.Sprint(e["layer"])]++
		}
		if strings.HasPrefix(fmt.Sprint(e["msg"]), "push: ") && e["uploaded"] != nil {
			summary = e
		}
	}
	if len(counts) != 3 || counts["empty"] != 1 || counts["js"] != 1 || counts["manifest.json"] != 1 || summary["uploaded"] != 3.0 {
		t.Errorf("push logged layers %v, summary %v\n%s", counts, summary, stderr)
	}
	code, _, stderr = runCLI(t, "push", "--config", cfg, ref)
	if code != exitOK || strings.Contains(stderr, "push: layer") || !strings.Contains(stderr, "push: 0 layers uploaded (0.0 MiB compressed), 3 already present") {
		t.Errorf("second push: exit %d\n%s", code, stderr)
	}
	code, _, stderr = runCLI(t, "pull", "--config", cfg, ref, filepath.Join(dir, "pulled"))
	if code != exitOK || strings.Count(stderr, "compressed_mib=") != 3 {
		t.Errorf("pull: exit %d\n%s", code, stderr)
	}
	code, _, stderr = runCLI(t, "pull", "--config", cfg, "oci-layout:"+filepath.Join(dir, "layout")+":v3", filepath.Join(dir, "pulled3"))
	if code == exitOK || !strings.Contains(stderr, `no image tagged "v3" (tags: v1)`) {
		t.Errorf("pull of a missing tag: exit %d\n%s", code, stderr)
	}
}

// TestPushWhileACaptureSwaps: a push started while a capture holds the output waits for it,
// then pushes the output the capture swapped in, whole: never the old one, never a mix.
func TestPushWhileACaptureSwaps(t *testing.T) {
	t.Parallel()
	dir := testenv.WorkDir(t)
	cfg := smallOutput(t, dir)
	out := filepath.Join(dir, "out")
	// The output a capture is about to swap in: another set.
	newer := filepath.Join(dir, "newer")
	cfgNewer := testConfig{runsc: testenv.RunscPath(t), root: runscRoot(t, dir), rootfs: testenv.Rootfs(t), output: newer,
		sets: "  - id: em\n    imports: [email.parser]\n"}.write(t)
	if code, _, stderr := runCLI(t, "capture", "--config", cfgNewer); code != exitOK {
		t.Fatalf("capture: %s", stderr)
	}

	lock, err := outdir.LockOutput(out) // as a capture holds it
	if err != nil {
		t.Fatal(err)
	}
	layoutDir := filepath.Join(dir, "layout")
	cmd := testenv.Command(t, 5*time.Minute, os.Args[0], "push", "--config", cfg, "oci-layout:"+layoutDir+":v1")
	cmd.Env = append(os.Environ(), "READIE_TEST_AS_PIPELINE=1")
	stderr, _ := cmd.StderrPipe()
	var stdout bytes.Buffer
	cmd.Stdout = &stdout
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	lines := bufio.NewScanner(stderr)
	waiting := make(chan bool, 1)
	var said bytes.Buffer
	go func() {
		for lines.Scan() {
			said.WriteString(lines.Text() + "\n")
			if strings.Contains(lines.Text(), "push: waiting for the run that writes the output") {
				waiting <- true
			}
		}
		close(waiting)
	}()
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	select {
	case ok := <-waiting:
		if !ok {
			cmd.Wait()
			t.Fatalf("push did not wait for the lock:\n%s", said.String())
		}
	case <-ctx.Done():
		cmd.Process.Kill()
		t.Fatal("push said nothing of waiting within 2 minutes")
	}
	// The swap, as a capture does it, while the push waits.
	if err := os.Rename(out, out+".old-1"); err != nil {
		t.Fatal(err)
	}
	if err := os.Rename(newer, out); err != nil {
		t.Fatal(err)
	}
	lock.Unlock()
	if err := cmd.Wait(); err != nil {
		t.Fatalf("push: %v\n%s", err, said.String())
	}
	pulled := filepath.Join(dir, "pulled")
	if code, _, stderr := runCLI(t, "pull", "--config", cfg, "oci-layout:"+layoutDir+":v1", pulled); code != exitOK {
		t.Fatalf("pull: %s", stderr)
	}
	want, _ := os.ReadFile(filepath.Join(out, manifest.FileName))
	got, _ := os.ReadFile(filepath.Join(pulled, manifest.FileName))
	if !bytes.Equal(got, want) {
		t.Errorf("the pushed output is not the one swapped in")
	}
	if _, err := os.Stat(filepath.Join(pulled, "em", "meta.json")); err != nil {
		t.Errorf("the pushed output lacks the new set: %v", err)
	}
}
