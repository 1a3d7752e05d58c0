package run

import (
	"context"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"

	"readie.dev/pipeline/internal/lease"
	"readie.dev/pipeline/internal/outdir"
	"readie.dev/pipeline/internal/scratch"
	"readie.dev/pipeline/internal/store"
	"readie.dev/pipeline/internal/testenv"
)

// TestRemoveDeadWorkDirs: scratch directories are judged by their run's lease: a run that is
// over loses its own, a live run (another, or this one) keeps its, and directories of
// pipelines from before leases (rd-PID-*) and of tests are never touched.
func TestRemoveDeadWorkDirs(t *testing.T) {
	tmp := t.TempDir()
	own, live, dead := testenv.NewLease(t), testenv.NewLease(t), testenv.NewLease(t)
	mk := func(l *lease.Lease) string {
		if err := l.Hold(tmp); err != nil {
			t.Fatal(err)
		}
		d, err := os.MkdirTemp(tmp, scratch.Prefix+l.ID()+"-")
		if err != nil {
			t.Fatal(err)
		}
		return d
	}
	ownDir, liveDir, deadDir := mk(own), mk(live), mk(dead)
	dead.Release()
	old := filepath.Join(tmp, fmt.Sprintf("rd-%d-abc", testenv.DeadPID(t)))
	other := filepath.Join(tmp, "rdt-123")
	for _, d := range []string{old, other} {
		os.MkdirAll(d, 0o755)
	}
	removed, err := own.RemoveDeadDirs(tmp, scratch.Prefix)
	if err != nil || len(removed) != 1 || removed[0] != deadDir {
		t.Fatalf("removed %v, %v; want only %s", removed, err, deadDir)
	}
	for _, keep := range []string{ownDir, liveDir, old, other} {
		if _, err := os.Stat(keep); err != nil {
			t.Errorf("%s was removed", keep)
		}
	}
}

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

	would, err := PruneRootfs(cache, keep, nil, time.Time{}, true)
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
	if _, err := PruneRootfs(cache, keep, []string{shared}, time.Time{}, false); !errors.Is(err, lease.ErrInUse) || !strings.Contains(err.Error(), running.ID()) {
		t.Fatalf("prune while a run lives: %v", err)
	}
	if _, err := os.Stat(unnamed); err != nil {
		t.Fatalf("a refused prune removed %s", unnamed)
	}
	running.Release()
	if _, err := PruneRootfs(cache, keep, []string{shared}, time.Time{}, false); err != nil {
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

// TestSweepRemovesWhatDeadRunsLeft: what runs that died leave outside the store and the runsc
// root (the pulled sources of a merge beside the output, the scratch directory of a check-host
// pull, the work directories of a rootfs assembly and of an image unpack in the cache) is
// removed by the next run's sweep, judged by the lease or the lock of whoever made it; a live
// run's stays.
func TestSweepRemovesWhatDeadRunsLeft(t *testing.T) {
	tmp := t.TempDir()
	t.Setenv("TMPDIR", tmp)
	rt := testenv.Runtime(t)
	rootfs := filepath.Join(t.TempDir(), "rootfs")
	s := sweeper{runtime: rt, lease: rt.Lease, store: &store.Store{Dir: filepath.Join(t.TempDir(), "store"), Lease: rt.Lease}, rootfs: rootfs, log: testenv.DiscardLog()}
	out := filepath.Join(t.TempDir(), "out")

	live, dead := testenv.NewLease(t), testenv.NewLease(t)
	named := func(l *lease.Lease, dir, prefix string) string {
		t.Helper()
		if err := l.Hold(dir); err != nil {
			t.Fatal(err)
		}
		d, err := os.MkdirTemp(dir, prefix+l.ID()+"-")
		if err != nil {
			t.Fatal(err)
		}
		return d
	}
	deadPull, livePull := named(dead, filepath.Dir(out), outdir.MergePullPrefix), named(live, filepath.Dir(out), outdir.MergePullPrefix)
	deadScratch, liveScratch := named(dead, tmp, scratch.Prefix), named(live, tmp, scratch.Prefix)
	dead.Release() // its lock files go, as a killed run's locks do; what it named stays

	// Work directories of unpack.Once: .tmp-NAME-* beside NAME's lock.
	work := func(parent, name string) string {
		t.Helper()
		dir := filepath.Join(parent, ".tmp-"+name+"-123")
		if err := os.MkdirAll(filepath.Join(dir, "rootfs"), 0o755); err != nil {
			t.Fatal(err)
		}
		if err := os.WriteFile(filepath.Join(parent, "."+name+".lock"), nil, 0o644); err != nil {
			t.Fatal(err)
		}
		return dir
	}
	oci := filepath.Join(rootfs, ociDir)
	deadAssembly, deadUnpack, liveUnpack := work(rootfs, "sha256-aaaa"), work(oci, "bbbb"), work(oci, "cccc")
	held, err := os.OpenFile(filepath.Join(oci, ".cccc.lock"), os.O_RDWR, 0)
	if err != nil {
		t.Fatal(err)
	}
	defer held.Close()
	if err := syscall.Flock(int(held.Fd()), syscall.LOCK_EX|syscall.LOCK_NB); err != nil {
		t.Fatal(err)
	}

	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	lock, err := s.lockAndSweep(ctx, out)
	if err != nil {
		t.Fatal(err)
	}
	lock.Unlock()
	for _, gone := range []string{deadPull, deadScratch, deadAssembly, deadUnpack} {
		if _, err := os.Stat(gone); !os.IsNotExist(err) {
			t.Errorf("a dead run's %s is still there (%v)", gone, err)
		}
	}
	for _, kept := range []string{livePull, liveScratch, liveUnpack} {
		if _, err := os.Stat(kept); err != nil {
			t.Errorf("a live run's %s was removed: %v", kept, err)
		}
	}
}

// TestPruneRootfsUnpackedImages: with --older-than, prune-rootfs removes the images unpacked
// under oci/ last used before the cutoff, and not one that a run is making now (its lock
// held); without it, oci/ stays. Work directories of dead runs go, a live run's stay.
func TestPruneRootfsUnpackedImages(t *testing.T) {
	cache := t.TempDir()
	oci := filepath.Join(cache, ociDir)
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

	if pruned, err := PruneRootfs(cache, nil, nil, time.Time{}, false); err != nil || len(pruned) != 1 || pruned[0] != deadWork {
		t.Fatalf("without --older-than: pruned %v, %v; want only the dead run's %s", pruned, err, deadWork)
	}
	cutoff := time.Now().Add(-24 * time.Hour)
	would, err := PruneRootfs(cache, nil, nil, cutoff, true)
	if err != nil || strings.Join(would, ",") != unused+","+busy {
		t.Fatalf("dry run would remove %v, %v; want %s and %s", would, err, unused, busy)
	}
	pruned, err := PruneRootfs(cache, nil, nil, cutoff, false)
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
