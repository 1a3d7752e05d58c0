package selfimage

import (
	"archive/tar"
	"bytes"
	"errors"
	"io"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	v1 "github.com/google/go-containerregistry/pkg/v1"
	"golang.org/x/sys/unix"
)

// makeTree writes the same small tree under dir, its entries created in the given order, with
// fixed modification times: a file, a setuid file, a hard link, a symbolic link, a subdirectory.
func makeTree(t *testing.T, dir string, reverse bool) {
	t.Helper()
	steps := []func(){
		func() { os.Chmod(filepath.Join(dir, "sub"), 0o750) },
		func() { os.WriteFile(filepath.Join(dir, "sub", "b.txt"), []byte("bee"), 0o644) },
		func() { os.WriteFile(filepath.Join(dir, "a.py"), []byte("print(1)\n"), 0o644) },
		func() {
			os.WriteFile(filepath.Join(dir, "su"), []byte("#!"), 0o755)
			os.Chmod(filepath.Join(dir, "su"), 0o755|os.ModeSetuid)
		},
		func() { os.Symlink("/usr/lib/x", filepath.Join(dir, "link")) },
	}
	os.MkdirAll(filepath.Join(dir, "sub"), 0o755)
	if reverse {
		for i, j := 0, len(steps)-1; i < j; i, j = i+1, j-1 {
			steps[i], steps[j] = steps[j], steps[i]
		}
	}
	for _, step := range steps {
		step()
	}
	if err := os.Link(filepath.Join(dir, "a.py"), filepath.Join(dir, "sub", "z.py")); err != nil {
		t.Fatal(err)
	}
	when := time.Date(2026, 9, 5, 3, 51, 2, 123456789, time.UTC)
	ts := unix.NsecToTimespec(when.UnixNano())
	for _, p := range []string{"a.py", "su", "sub/b.txt", "link", "sub", "."} {
		if err := unix.UtimesNanoAt(unix.AT_FDCWD, filepath.Join(dir, p), []unix.Timespec{ts, ts}, unix.AT_SYMLINK_NOFOLLOW); err != nil {
			t.Fatal(err)
		}
	}
}

func layerOf(dir, source string) Layer {
	return Layer{Name: "test", Files: []File{
		{Path: "/usr/local/bin/tool", Mode: 0o755, Source: source},
		{Path: "/bin/sh", Link: "busybox"},
		{Path: "/tmp", Mode: 0o777 | os.ModeSticky, Dir: true},
		{Path: "/etc/passwd", Mode: 0o644, Data: []byte("root:x:0:0::/root:/bin/sh\n")},
	}, Trees: []Tree{{Path: "/usr/share/readie/rootfs", Source: dir}}}
}

func tarOf(t *testing.T, l Layer) []byte {
	t.Helper()
	var buf bytes.Buffer
	if err := l.WriteTar(&buf); err != nil {
		t.Fatal(err)
	}
	return buf.Bytes()
}

// TestLayerReproducible: the same files, wherever they are on the host and in whatever order
// they were made, give the same tar and the same layer digest; entries are sorted, parents
// first, with no host path; a tree keeps its modes, owners, nanosecond times and hard links,
// and a changed time changes the digest.
func TestLayerReproducible(t *testing.T) {
	base := t.TempDir()
	one, two := filepath.Join(base, "one", "rootfs"), filepath.Join(base, "elsewhere", "two")
	makeTree(t, one, false)
	makeTree(t, two, true)
	tool1, tool2 := filepath.Join(base, "tool1"), filepath.Join(base, "tool2")
	os.WriteFile(tool1, []byte("ELF"), 0o700)
	os.WriteFile(tool2, []byte("ELF"), 0o600) // the image's mode is the File's, not the host's
	a, b := tarOf(t, layerOf(one, tool1)), tarOf(t, layerOf(two, tool2))
	if !bytes.Equal(a, b) {
		t.Fatal("the same files at other host paths, made in another order, give another tar")
	}
	if bytes.Contains(a, []byte(base)) {
		t.Error("the tar holds a host path")
	}
	var names []string
	byName := map[string]*tar.Header{}
	tr := tar.NewReader(bytes.NewReader(a))
	for {
		hdr, err := tr.Next()
		if errors.Is(err, io.EOF) {
			break
		}
		if err != nil {
			t.Fatal(err)
		}
		names = append(names, hdr.Name)
		byName[hdr.Name] = hdr
	}
	want := []string{"bin/", "bin/sh", "etc/", "etc/passwd", "tmp/", "usr/", "usr/local/", "usr/local/bin/", "usr/local/bin/tool",
		"usr/share/", "usr/share/readie/", "usr/share/readie/rootfs/", "usr/share/readie/rootfs/a.py", "usr/share/readie/rootfs/link",
		"usr/share/readie/rootfs/su", "usr/share/readie/rootfs/sub/", "usr/share/readie/rootfs/sub/b.txt", "usr/share/readie/rootfs/sub/z.py"}
	if strings.Join(names, " ") != strings.Join(want, " ") {
		t.Errorf("entries\n%v\nwant\n%v", names, want)
	}
	if h := byName["usr/share/readie/rootfs/sub/z.py"]; h.Typeflag != tar.TypeLink || h.Linkname != "usr/share/readie/rootfs/a.py" {
		t.Errorf("the hard link: %+v", h)
	}
	if h := byName["usr/share/readie/rootfs/su"]; h.Mode != 0o4755 || h.ModTime.Nanosecond() != 123456789 {
		t.Errorf("a tree's setuid file: mode %o, time %v", h.Mode, h.ModTime)
	}
	if h := byName["tmp/"]; h.Mode != 0o1777 || !h.ModTime.Equal(epoch) || h.Uid != 0 {
		t.Errorf("/tmp: %+v", h)
	}
	if h := byName["usr/local/bin/tool"]; h.Mode != 0o755 || !h.ModTime.Equal(epoch) {
		t.Errorf("a file: %+v", h)
	}

	digest := func(dir, tool string) v1.Hash {
		l, err := WriteLayer(layerOf(dir, tool), t.TempDir())
		if err != nil {
			t.Fatal(err)
		}
		d, err := l.Digest()
		if err != nil {
			t.Fatal(err)
		}
		return d
	}
	d1, d2 := digest(one, tool1), digest(two, tool2)
	if d1 != d2 {
		t.Errorf("layer digests %s and %s", d1, d2)
	}
	later := time.Date(2026, 9, 5, 3, 51, 2, 123456790, time.UTC)
	os.Chtimes(filepath.Join(two, "sub", "b.txt"), later, later)
	if d3 := digest(two, tool2); d3 == d1 {
		t.Error("a tree file's time changed by a nanosecond, the digest did not")
	}

	for _, bad := range []Layer{
		{Name: "rel", Files: []File{{Path: "etc/passwd", Data: []byte("x")}}},
		{Name: "twice", Files: []File{{Path: "/a", Dir: true}, {Path: "/a", Data: []byte("x")}}},
		{Name: "empty", Files: []File{{Path: "/a"}}},
		{Name: "dir-source", Files: []File{{Path: "/a", Source: base}}},
	} {
		if err := bad.WriteTar(io.Discard); !errors.Is(err, ErrInput) {
			t.Errorf("layer %s: %v, want ErrInput", bad.Name, err)
		}
	}
}

// TestImageReproducible: the same layers and config give the same image digest and the same
// layout bytes, written twice; a changed annotation changes the digest.
func TestImageReproducible(t *testing.T) {
	dir := t.TempDir()
	makeTree(t, filepath.Join(dir, "tree"), false)
	tool := filepath.Join(dir, "tool")
	os.WriteFile(tool, []byte("ELF"), 0o755)
	build := func(revision string) (v1.Image, v1.Hash) {
		l, err := WriteLayer(layerOf(filepath.Join(dir, "tree"), tool), t.TempDir())
		if err != nil {
			t.Fatal(err)
		}
		img, err := Image([]v1.Layer{l}, []string{"test"}, Config{
			Entrypoint: []string{"/usr/local/bin/tool"}, Env: []string{"HOME=/root"},
			Created:     time.Date(2026, 12, 3, 12, 9, 3, 0, time.FixedZone("x", 3600)),
			Annotations: map[string]string{"org.opencontainers.image.revision": revision},
		})
		if err != nil {
			t.Fatal(err)
		}
		d, err := img.Digest()
		if err != nil {
			t.Fatal(err)
		}
		return img, d
	}
	img1, d1 := build("abc")
	img2, d2 := build("abc")
	if d1 != d2 {
		t.Fatalf("digests %s and %s", d1, d2)
	}
	if _, d3 := build("abd"); d3 == d1 {
		t.Error("another revision, the same digest")
	}
	out1, out2 := filepath.Join(dir, "layout1"), filepath.Join(dir, "layout2")
	for _, w := range []struct {
		dir string
		img v1.Image
	}{{out1, img1}, {out2, img2}, {out2, img2}} { // the second write to out2 replaces it
		if err := WriteLayout(w.dir, w.img); err != nil {
			t.Fatal(err)
		}
	}
	i1, _ := os.ReadFile(filepath.Join(out1, "index.json"))
	i2, _ := os.ReadFile(filepath.Join(out2, "index.json"))
	if len(i1) == 0 || !bytes.Equal(i1, i2) || !bytes.Contains(i1, []byte(d1.String())) {
		t.Errorf("index.json\n%s\n%s\nwant both naming %s", i1, i2, d1)
	}
	if leftovers, _ := filepath.Glob(filepath.Join(dir, ".layout*")); len(leftovers) > 0 {
		t.Errorf("left behind: %v", leftovers)
	}
}
