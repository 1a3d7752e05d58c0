package unpack

import (
	"archive/tar"
	"bytes"
	"errors"
	"io"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"testing"

	v1 "github.com/google/go-containerregistry/pkg/v1"
	"github.com/google/go-containerregistry/pkg/v1/empty"
	"github.com/google/go-containerregistry/pkg/v1/mutate"
	"github.com/google/go-containerregistry/pkg/v1/tarball"
)

// entry is one tar entry of a test layer.
type entry struct {
	name, body, link string
	typ              byte
	mode             int64
	uid              int
}

func layerOf(t *testing.T, entries ...entry) v1.Layer {
	t.Helper()
	var buf bytes.Buffer
	tw := tar.NewWriter(&buf)
	for _, e := range entries {
		typ := e.typ
		if typ == 0 {
			typ = tar.TypeReg
		}
		mode := e.mode
		if mode == 0 {
			mode = 0o644
			if typ == tar.TypeDir {
				mode = 0o755
			}
		}
		hdr := &tar.Header{Name: e.name, Typeflag: typ, Mode: mode, Linkname: e.link, Uid: e.uid, Gid: e.uid}
		if typ == tar.TypeReg {
			hdr.Size = int64(len(e.body))
		}
		if err := tw.WriteHeader(hdr); err != nil {
			t.Fatal(err)
		}
		io.WriteString(tw, e.body)
	}
	tw.Close()
	data := buf.Bytes()
	l, err := tarball.LayerFromOpener(func() (io.ReadCloser, error) { return io.NopCloser(bytes.NewReader(data)), nil })
	if err != nil {
		t.Fatal(err)
	}
	return l
}

func imageOf(t *testing.T, layers ...v1.Layer) v1.Image {
	t.Helper()
	img, err := mutate.AppendLayers(empty.Image, layers...)
	if err != nil {
		t.Fatal(err)
	}
	return img
}

func TestUnpackWhiteoutsModesLinks(t *testing.T) {
	root := t.TempDir()
	lower := layerOf(t,
		entry{name: "a/", typ: tar.TypeDir},
		entry{name: "a/keep", body: "keep"},
		entry{name: "a/gone", body: "gone"},
		entry{name: "d/", typ: tar.TypeDir},
		entry{name: "d/old", body: "old"},
		entry{name: "d/sub/", typ: tar.TypeDir},
		entry{name: "d/sub/deeper", body: "deeper"},
		entry{name: "bin/tool", body: "#!/bin/sh\n", mode: 0o4755, uid: 1000},
		entry{name: "bin/tool-link", typ: tar.TypeLink, link: "bin/tool"},
		entry{name: "bin/sh-link", typ: tar.TypeSymlink, link: "/bin/tool"},
		entry{name: "dev/null", typ: tar.TypeChar},
	)
	upper := layerOf(t,
		entry{name: "d/before", body: "made before the marker"},
		entry{name: "a/.wh.gone"},
		entry{name: "d/.wh..wh..opq"},
		entry{name: "d/after", body: "made after the marker"},
	)
	if err := Unpack(imageOf(t, lower, upper), root, nil); err != nil {
		t.Fatal(err)
	}
	exists := func(p string) bool { _, err := os.Lstat(filepath.Join(root, p)); return err == nil }
	for p, want := range map[string]bool{
		"a/keep": true, "a/gone": false, "d/old": false, "d/sub": false, "d/before": true, "d/after": true, "dev/null": false,
	} {
		if exists(p) != want {
			t.Errorf("%s exists = %v, want %v", p, !want, want)
		}
	}
	tool, _ := os.Stat(filepath.Join(root, "bin/tool"))
	link, _ := os.Stat(filepath.Join(root, "bin/tool-link"))
	if tool == nil || tool.Mode()&os.ModeSetuid == 0 || tool.Mode().Perm() != 0o755 || !os.SameFile(tool, link) {
		t.Errorf("bin/tool: %v; a hard link to it: %v", tool, link)
	}
	if uid := tool.Sys().(*syscallStat).Uid; uid != 1000 {
		t.Errorf("bin/tool owner %d, want 1000", uid)
	}
	if target, err := os.Readlink(filepath.Join(root, "bin/sh-link")); err != nil || target != "/bin/tool" {
		t.Errorf("symlink: %q %v", target, err)
	}
}

// TestUnpackRefusesHostileLayers: each entry that would land outside the root is refused with
// an error naming it, and nothing is written outside the root.
func TestUnpackRefusesHostileLayers(t *testing.T) {
	for _, tc := range []struct {
		name    string
		entries []entry
		want    string
	}{
		{"path traversal", []entry{{name: "../escaped", body: "x"}}, `"../escaped"`},
		{"deeper traversal", []entry{{name: "a/../../escaped", body: "x"}}, `"a/../../escaped"`},
		{"absolute name", []entry{{name: "/escaped", body: "x"}}, `"/escaped"`},
		{"write through a symlink", []entry{{name: "out", typ: tar.TypeSymlink, link: "OUTSIDE"}, {name: "out/escaped", body: "x"}}, `"out/escaped": it would be written through the symlink`},
		{"whiteout of ..", []entry{{name: "etc/.wh..."}}, `a whiteout of ".."`},
		{"hard link to outside", []entry{{name: "h", typ: tar.TypeLink, link: "../OUTSIDE/secret"}}, `"h"`},
	} {
		t.Run(tc.name, func(t *testing.T) {
			dir := t.TempDir()
			root, outside := filepath.Join(dir, "root"), filepath.Join(dir, "outside")
			os.MkdirAll(root, 0o755)
			os.MkdirAll(outside, 0o755)
			os.WriteFile(filepath.Join(outside, "secret"), []byte("s"), 0o600)
			for i := range tc.entries {
				tc.entries[i].link = strings.ReplaceAll(tc.entries[i].link, "OUTSIDE", outside)
				if tc.entries[i].typ == tar.TypeLink {
					tc.entries[i].link = strings.ReplaceAll(tc.entries[i].link, outside, "../outside")
				}
			}
			err := Unpack(imageOf(t, layerOf(t, tc.entries...)), root, nil)
			if !errors.Is(err, ErrLayer) || !strings.Contains(err.Error(), tc.want) {
				t.Fatalf("err = %v, want ErrLayer naming %s", err, tc.want)
			}
			entries, _ := os.ReadDir(outside)
			if len(entries) != 1 {
				t.Errorf("something was written outside the root: %v", entries)
			}
			if _, err := os.Stat(filepath.Join(dir, "escaped")); err == nil {
				t.Error("an entry escaped the root")
			}
		})
	}
}

// TestUnpackOnceConcurrently: runs that unpack the same image at once all end with the one
// complete directory; a later call unpacks nothing.
func TestUnpackOnceConcurrently(t *testing.T) {
	cache := t.TempDir()
	img := imageOf(t, layerOf(t, entry{name: "etc/", typ: tar.TypeDir}, entry{name: "etc/os-release", body: "ID=test\n"}))
	var wg sync.WaitGroup
	dirs := make([]string, 6)
	errs := make([]error, 6)
	for i := range dirs {
		wg.Go(func() { dirs[i], _, errs[i] = UnpackOnce(img, cache, nil) })
	}
	wg.Wait()
	for i := range dirs {
		if errs[i] != nil || dirs[i] != dirs[0] {
			t.Fatalf("unpack %d: %s %v (first: %s)", i, dirs[i], errs[i], dirs[0])
		}
	}
	if data, err := os.ReadFile(filepath.Join(dirs[0], "etc/os-release")); err != nil || string(data) != "ID=test\n" {
		t.Fatalf("%q %v", data, err)
	}
	entries, _ := os.ReadDir(filepath.Join(cache, "rootfs", "oci"))
	if len(entries) != 1 {
		t.Errorf("left in the cache: %v", entries)
	}
	if _, unpacked, err := UnpackOnce(img, cache, nil); unpacked || err != nil {
		t.Errorf("a second unpack: unpacked %v, %v", unpacked, err)
	}
}
