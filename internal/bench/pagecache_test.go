package bench

import (
	"os"
	"path/filepath"
	"testing"

	"readie.dev/pipeline/pkg/manifest"
)

// TestEvictPageCache: after a read every page of an image file is cached; after the eviction
// none is. The directory is on a disk, not a tmpfs (whose pages cannot be dropped).
func TestEvictPageCache(t *testing.T) {
	dir, err := os.MkdirTemp(".", ".pagecache-")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { os.RemoveAll(dir) })
	data := make([]byte, 4<<20)
	for i := range data {
		data[i] = byte(i)
	}
	for _, name := range manifest.ImageFiles() {
		f, err := os.Create(filepath.Join(dir, name))
		if err != nil {
			t.Fatal(err)
		}
		f.Write(data)
		f.Sync()
		f.Close()
	}
	pages := filepath.Join(dir, "pages.img")
	if _, err := os.ReadFile(pages); err != nil {
		t.Fatal(err)
	}
	if resident, total, err := ResidentPages(pages); err != nil || resident != total || total == 0 {
		t.Fatalf("after a read: %d of %d pages cached (%v)", resident, total, err)
	}
	if err := EvictPageCache(dir); err != nil {
		t.Fatal(err)
	}
	if resident, total, err := ResidentPages(pages); err != nil || resident != 0 {
		t.Fatalf("after the eviction: %d of %d pages cached (%v)", resident, total, err)
	}
}
