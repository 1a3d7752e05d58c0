package output

import (
	"archive/tar"
	"bytes"
	"context"
	"errors"
	"io"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/google/go-containerregistry/pkg/v1/empty"
	"github.com/google/go-containerregistry/pkg/v1/mutate"
	"github.com/google/go-containerregistry/pkg/v1/tarball"

	"readie.dev/pipeline/internal/oci/unpack"
)

// TestExtractTakesExactlyReadie: only the files under readie/ (top level and one directory
// down) are extracted; readiefoo/x (which a prefix test without the slash lets through as
// foo/x), a path out, a deeper file and a symlink are each refused with their name, and
// nothing lands outside the directory.
func TestExtractTakesExactlyReadie(t *testing.T) {
	for _, tc := range []struct {
		name string
		hdr  tar.Header
		want string
	}{
		{"a sibling of readie/", tar.Header{Name: "readiefoo/x", Typeflag: tar.TypeReg}, `"readiefoo/x" is outside readie/`},
		{"a sibling file", tar.Header{Name: "readiefoo", Typeflag: tar.TypeReg}, `"readiefoo" is outside readie/`},
		{"a way out", tar.Header{Name: "readie/../x", Typeflag: tar.TypeReg}, `"readie/../x" is outside readie/`},
		{"elsewhere", tar.Header{Name: "etc/passwd", Typeflag: tar.TypeReg}, `"etc/passwd" is outside readie/`},
		{"deeper", tar.Header{Name: "readie/a/b/c", Typeflag: tar.TypeReg}, `"readie/a/b/c" is not a file or directory of an output`},
		{"a symlink", tar.Header{Name: "readie/link", Typeflag: tar.TypeSymlink, Linkname: "/etc"}, `"readie/link" is not a file or directory of an output`},
	} {
		t.Run(tc.name, func(t *testing.T) {
			var buf bytes.Buffer
			tw := tar.NewWriter(&buf)
			for _, h := range []tar.Header{
				{Name: "readie/", Typeflag: tar.TypeDir, Mode: 0o755},
				{Name: "readie/manifest.json", Typeflag: tar.TypeReg, Mode: 0o644, Size: 2},
				tc.hdr,
			} {
				h.Mode |= 0o644
				if h.Typeflag == tar.TypeReg && h.Size == 0 {
					h.Size = 1
				}
				tw.WriteHeader(&h)
				io.WriteString(tw, strings.Repeat("x", int(h.Size)))
			}
			tw.Close()
			data := buf.Bytes()
			l, _ := tarball.LayerFromOpener(func() (io.ReadCloser, error) { return io.NopCloser(bytes.NewReader(data)), nil })
			img, _ := mutate.AppendLayers(empty.Image, l)
			parent := t.TempDir()
			dir := filepath.Join(parent, "staging")
			os.Mkdir(dir, 0o755)
			err := Extract(context.Background(), img, dir, unpack.DefaultLimits(), nil)
			if !errors.Is(err, ErrImage) || !strings.Contains(err.Error(), tc.want) {
				t.Fatalf("err = %v, want it to say %s", err, tc.want)
			}
			var found []string
			filepath.WalkDir(parent, func(p string, d os.DirEntry, err error) error {
				if err == nil && !d.IsDir() && filepath.Base(p) != "manifest.json" {
					found = append(found, p)
				}
				return nil
			})
			if len(found) != 0 {
				t.Errorf("extracted: %v", found)
			}
		})
	}
}

// TestExtractModes: a pulled output's files get an output's modes (image files 0400, the rest
// 0444), whatever modes the image's tar gives them (0777, setuid).
func TestExtractModes(t *testing.T) {
	var buf bytes.Buffer
	tw := tar.NewWriter(&buf)
	for _, h := range []tar.Header{
		{Name: "readie/", Typeflag: tar.TypeDir, Mode: 0o755},
		{Name: "readie/manifest.json", Typeflag: tar.TypeReg, Mode: 0o777, Size: 2},
		{Name: "readie/js/", Typeflag: tar.TypeDir, Mode: 0o755},
		{Name: "readie/js/pages.img", Typeflag: tar.TypeReg, Mode: 0o4777, Size: 2},
		{Name: "readie/js/meta.json", Typeflag: tar.TypeReg, Mode: 0o600, Size: 2},
	} {
		tw.WriteHeader(&h)
		io.WriteString(tw, strings.Repeat("x", int(h.Size)))
	}
	tw.Close()
	data := buf.Bytes()
	l, _ := tarball.LayerFromOpener(func() (io.ReadCloser, error) { return io.NopCloser(bytes.NewReader(data)), nil })
	img, _ := mutate.AppendLayers(empty.Image, l)
	dir := t.TempDir()
	if err := Extract(context.Background(), img, dir, unpack.DefaultLimits(), nil); err != nil {
		t.Fatal(err)
	}
	for name, want := range map[string]os.FileMode{"manifest.json": 0o444, "js/pages.img": 0o400, "js/meta.json": 0o444} {
		fi, err := os.Stat(filepath.Join(dir, name))
		if err != nil || fi.Mode() != want {
			t.Errorf("%s: mode %v, %v; want %v", name, fi.Mode(), err, want)
		}
	}
}
