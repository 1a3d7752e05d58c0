package rootfs

import (
	"errors"
	"os"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"

	"readie.dev/pipeline/internal/lease"
	"readie.dev/pipeline/internal/testenv"
)

func TestPruneRootfs(t *testing.T) {
	cache := t.TempDir()
	mk := func(p string) string {
		full := filepath.Join(cache, p)
		os.MkdirAll(full, 0o755)
		return full
	}
	named := mk("sha256-aaaa/rootfs")
	unnamed := mk("sha256-bbbb/rootfs")
	legacy := mk("0123456789abcdef/rootfs")
	layer := mk("layers/0123456789abcdef/rootfs")
	building := mk(".tmp-cccc-123/rootfs")
	keep := []string{named, "/elsewhere/rootfs"}

	would, err := Prune(cache, keep, nil, time.Time{}, true)
	if err != nil {
		t.Fatal(err)
	}
	want := []string{filepath.Dir(legacy), filepath.Dir(unnamed)}
	if strings.Join(would, ",") != strings.Join(want, ",") {
		t.Fatalf("dry run would remove %v, want %v", would, want)
	}
	for _, p := range []string{named, unnamed, legacy, layer, building} {
		if _, err := os.Stat(p); err != nil {
			t.Fatalf("the dry run removed %s", p)
		}
	}
	// A run holding its lease in a shared directory (it may be using any rootfs): nothing goes.
	shared := t.TempDir()
	running := testenv.NewLease(t)
	if err := running.Hold(shared); err != nil {
		t.Fatal(err)
	}
	if _, err := Prune(cache, keep, []string{shared}, time.Time{}, false); !errors.Is(err, lease.ErrInUse) || !strings.Contains(err.Error(), running.ID()) {
		t.Fatalf("prune while a run lives: %v", err)
	}
	if _, err := os.Stat(unnamed); err != nil {
		t.Fatalf("a refused prune removed %s", unnamed)
	}
	running.Release()
	if _, err := Prune(cache, keep, []string{shared}, time.Time{}, false); err != nil {
		t.Fatal(err)
	}
	for _, p := range []string{named, layer, building} {
		if _, err := os.Stat(p); err != nil {
			t.Errorf("%s was removed", p)
		}
	}
	for _, p := range []string{unnamed, legacy} {
		if _, err := os.Stat(p); !os.IsNotExist(err) {
			t.Errorf("%s is still there", p)
		}
	}
}

// TestPruneRootfsUnpackedImages: with --older-than, prune-rootfs removes the images unpacked
// under oci/ last used before the cutoff, and not one that a run is making now (its lock
// held); without it, oci/ stays. Work directories of dead runs go, a live run's stay.
func TestPruneRootfsUnpackedImages(t *testing.T) {
	cache := t.TempDir()
	oci := filepath.Join(cache, OCIDir)
	old, recent := time.Now().Add(-48*time.Hour), time.Now()
	image := func(name string, used time.Time) string {
		t.Helper()
		dir := filepath.Join(oci, name)
		if err := os.MkdirAll(filepath.Join(dir, "rootfs"), 0o755); err != nil {
			t.Fatal(err)
		}
		record := filepath.Join(dir, "unpack.json")
		if err := os.WriteFile(record, []byte("{}"), 0o644); err != nil {
			t.Fatal(err)
		}
		if err := os.Chtimes(record, used, used); err != nil {
			t.Fatal(err)
		}
		return dir
	}
	unused, used, busy := image("aaaa", old), image("bbbb", recent), image("cccc", old)
	incomplete := filepath.Join(oci, "dddd", "rootfs")
	os.MkdirAll(incomplete, 0o755)
	held, err := os.OpenFile(filepath.Join(oci, ".cccc.lock"), os.O_RDWR|os.O_CREATE, 0o644)
	if err != nil {
		t.Fatal(err)
	}
	defer held.Close()
	if err := syscall.Flock(int(held.Fd()), syscall.LOCK_EX|syscall.LOCK_NB); err != nil {
		t.Fatal(err)
	}
	deadWork := filepath.Join(oci, ".tmp-eeee-1")
	os.MkdirAll(deadWork, 0o755)
	os.WriteFile(filepath.Join(oci, ".eeee.lock"), nil, 0o644)
	liveWork := filepath.Join(oci, ".tmp-cccc-1")
	os.MkdirAll(liveWork, 0o755)

	if pruned, err := Prune(cache, nil, nil, time.Time{}, false); err != nil || len(pruned) != 1 || pruned[0] != deadWork {
		t.Fatalf("without --older-than: pruned %v, %v; want only the dead run's %s", pruned, err, deadWork)
	}
	cutoff := time.Now().Add(-24 * time.Hour)
	would, err := Prune(cache, nil, nil, cutoff, true)
	if err != nil || strings.Join(would, ",") != unused+","+busy {
		t.Fatalf("dry run would remove %v, %v; want %s and %s", would, err, unused, busy)
	}
	pruned, err := Prune(cache, nil, nil, cutoff, false)
	if err != nil || strings.Join(pruned, ",") != unused {
		t.Fatalf("pruned %v, %v; want only %s", pruned, err, unused)
	}
	for _, p := range []string{used, busy, incomplete, liveWork} {
		if _, err := os.Stat(p); err != nil {
			t.Errorf("%s was removed", p)
		}
	}
	if left, _ := filepath.Glob(filepath.Join(oci, ".tmp-aaaa-*")); len(left) != 0 {
		t.Errorf("the prune left %v", left)
	}
}
