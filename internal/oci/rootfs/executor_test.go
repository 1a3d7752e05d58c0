package rootfs

import (
	"archive/tar"
	"bytes"
	"errors"
	"io"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"readie.dev/pipeline/internal/oci/unpack"
)

// TestExecutorLayer: the executor layer is the same bytes each time, sorted, root's, at time 0,
// with no directory entries (the image's own directories keep their modes), and puts
// readie_executor under the site it is given.
func TestExecutorLayer(t *testing.T) {
	a, err := ExecutorLayer("/usr/lib/python3/dist-packages")
	if err != nil {
		t.Fatal(err)
	}
	b, _ := ExecutorLayer("usr/lib/python3/dist-packages/")
	if !bytes.Equal(a, b) {
		t.Error("the same site gives other bytes")
	}
	tr := tar.NewReader(bytes.NewReader(a))
	var names []string
	for {
		hdr, err := tr.Next()
		if err == io.EOF {
			break
		}
		if err != nil {
			t.Fatal(err)
		}
		if hdr.Typeflag == tar.TypeDir || hdr.Uid != 0 || hdr.Gid != 0 || !hdr.ModTime.Equal(epoch) {
			t.Errorf("entry %+v", hdr)
		}
		names = append(names, hdr.Name)
	}
	joined := strings.Join(names, " ")
	for _, want := range []string{"etc/hosts", "etc/resolv.conf", "usr/lib/python3/dist-packages/readie_executor/__main__.py", TestingDir + "/readie_test_block.py"} {
		if !strings.Contains(joined, want) {
			t.Errorf("the layer lacks %s: %v", want, names)
		}
	}
	for i := 1; i < len(names); i++ {
		if names[i-1] > names[i] {
			t.Errorf("entries not sorted: %v", names)
		}
	}
}

// TestExecutorLayerRefusesAPlantedLink: an image whose site directory is a symlink out of its
// root gets no executor through it: the layer goes on through the one layer applier, which
// refuses to write through a symlink, and nothing lands outside.
func TestExecutorLayerRefusesAPlantedLink(t *testing.T) {
	dir := t.TempDir()
	rootDir, outside := filepath.Join(dir, "root"), filepath.Join(dir, "outside")
	os.MkdirAll(filepath.Join(rootDir, "usr/lib/python3"), 0o755)
	os.MkdirAll(outside, 0o755)
	if err := os.Symlink(outside, filepath.Join(rootDir, "usr/lib/python3/dist-packages")); err != nil {
		t.Fatal(err)
	}
	layer, err := ExecutorLayer("/usr/lib/python3/dist-packages")
	if err != nil {
		t.Fatal(err)
	}
	root, err := os.OpenRoot(rootDir)
	if err != nil {
		t.Fatal(err)
	}
	defer root.Close()
	err = unpack.NewApplier(root, unpack.NewBudget(unpack.DefaultLimits())).Apply(tar.NewReader(bytes.NewReader(layer)))
	if !errors.Is(err, unpack.ErrLayer) || !strings.Contains(err.Error(), "written through the symlink /usr/lib/python3/dist-packages") {
		t.Fatalf("err = %v", err)
	}
	if entries, _ := os.ReadDir(outside); len(entries) != 0 {
		t.Errorf("written outside the root: %v", entries)
	}
}
