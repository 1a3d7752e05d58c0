package run

import (
	"context"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	v1 "github.com/google/go-containerregistry/pkg/v1"

	"readie.dev/pipeline/internal/config"
	"readie.dev/pipeline/internal/lease"
	"readie.dev/pipeline/internal/oci/unpack"
	"readie.dev/pipeline/internal/store"
	"readie.dev/pipeline/internal/testenv"
	"readie.dev/pipeline/pkg/atomicfile"
	"readie.dev/pipeline/pkg/manifest"
)

// deadPID returns the pid of a process that has exited (and been reaped).
func deadPID(t *testing.T) int {
	t.Helper()
	cmd := exec.Command("true")
	if err := cmd.Run(); err != nil {
		t.Fatal(err)
	}
	return cmd.Process.Pid
}

func TestLockOutput(t *testing.T) {
	out := filepath.Join(t.TempDir(), "out")
	first, err := LockOutput(out)
	if err != nil {
		t.Fatal(err)
	}
	if data, _ := os.ReadFile(out + ".lock"); strings.TrimSpace(string(data)) != strconv.Itoa(os.Getpid()) {
		t.Errorf("lock file holds %q, want this pid", data)
	}
	// flock is per open file: a second open in this process conflicts like another process.
	if _, err := LockOutput(out); !errors.Is(err, ErrLocked) || !strings.Contains(err.Error(), "pid "+strconv.Itoa(os.Getpid())) {
		t.Fatalf("second lock = %v, want ErrLocked naming the holder", err)
	}
	if err := first.Unlock(); err != nil {
		t.Fatal(err)
	}
	if data, _ := os.ReadFile(out + ".lock"); len(data) != 0 {
		t.Errorf("released lock file holds %q", data)
	}
	again, err := LockOutput(out)
	if err != nil || again.Stale != 0 {
		t.Fatalf("lock after release = %+v, %v", again, err)
	}
	again.Unlock()
}

// TestLockSharedAndExclusive: readers share the lock and a writer is refused while they hold
// it, saying that it is being read; a reader waits while a writer holds it (bounded by its
// context) and gets it once the writer is gone; the writer's pid stays in the file for errors.
func TestLockSharedAndExclusive(t *testing.T) {
	out := filepath.Join(t.TempDir(), "out")
	r1, err := ReadLockOutput(context.Background(), out, nil)
	if err != nil {
		t.Fatal(err)
	}
	r2, err := ReadLockOutput(context.Background(), out, nil)
	if err != nil {
		t.Fatalf("a second reader: %v", err)
	}
	if _, err := LockOutput(out); !errors.Is(err, ErrLocked) || !strings.Contains(err.Error(), "is being read by another run") {
		t.Fatalf("a writer beside readers: %v", err)
	}
	r1.Unlock()
	r2.Unlock()

	w, err := LockOutput(out)
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 200*time.Millisecond)
	defer cancel()
	var waitedFor int
	if _, err := ReadLockOutput(ctx, out, func(pid int) { waitedFor = pid }); !errors.Is(err, ErrLocked) || !errors.Is(err, context.DeadlineExceeded) ||
		waitedFor != os.Getpid() || !strings.Contains(err.Error(), "waiting for pid "+strconv.Itoa(os.Getpid())) {
		t.Fatalf("a reader while a writer holds it: %v (waited for %d)", err, waitedFor)
	}
	w.Unlock()
	r, err := ReadLockOutput(context.Background(), out, nil)
	if err != nil {
		t.Fatal(err)
	}
	r.Unlock()
	if again, err := LockOutput(out); err != nil || again.Stale != 0 {
		t.Fatalf("a writer after the reader: %+v %v", again, err)
	} else {
		again.Unlock()
	}
}

func TestLockTakesOverFromADeadRun(t *testing.T) {
	out := filepath.Join(t.TempDir(), "out")
	dead := deadPID(t)
	os.WriteFile(out+".lock", []byte(fmt.Sprintf("%d\n", dead)), 0o644) // a run killed with SIGKILL
	l, err := LockOutput(out)
	if err != nil {
		t.Fatal(err)
	}
	defer l.Unlock()
	if l.Stale != dead {
		t.Fatalf("Stale = %d, want %d", l.Stale, dead)
	}
}

func TestReplaceDir(t *testing.T) {
	dir := t.TempDir()
	out, staging := filepath.Join(dir, "out"), filepath.Join(dir, "out.staging-1")
	// First output: nothing to move aside.
	os.MkdirAll(staging, 0o755)
	os.WriteFile(filepath.Join(staging, "manifest.json"), []byte("one"), 0o644)
	if err := replaceDir(out, staging); err != nil {
		t.Fatal(err)
	}
	os.MkdirAll(staging, 0o755)
	os.WriteFile(filepath.Join(staging, "manifest.json"), []byte("two"), 0o644)
	if err := replaceDir(out, staging); err != nil {
		t.Fatal(err)
	}
	if data, _ := os.ReadFile(filepath.Join(out, "manifest.json")); string(data) != "two" {
		t.Fatalf("output holds %q", data)
	}
	// The benchmark history goes over to the next output.
	os.MkdirAll(filepath.Join(out, "bench", "20261202T120000Z"), 0o755)
	os.MkdirAll(staging, 0o755)
	os.WriteFile(filepath.Join(staging, "manifest.json"), []byte("three"), 0o644)
	if err := replaceDir(out, staging); err != nil {
		t.Fatal(err)
	}
	if _, err := os.Stat(filepath.Join(out, "bench", "20261202T120000Z")); err != nil {
		t.Fatalf("the benchmark history was lost: %v", err)
	}
	if entries, _ := os.ReadDir(dir); len(entries) != 1 {
		t.Fatalf("left beside the output: %v", entries)
	}
	// A staging directory that cannot be put in place leaves the old output where it was.
	if err := replaceDir(out, filepath.Join(dir, "missing")); err == nil {
		t.Fatal("replaceDir from a missing staging directory succeeded")
	}
	if data, _ := os.ReadFile(filepath.Join(out, "manifest.json")); string(data) != "three" {
		t.Fatalf("after a failed swap the output holds %q", data)
	}
	if _, err := os.Stat(filepath.Join(out, "bench", "20261202T120000Z")); err != nil {
		t.Fatalf("a failed swap lost the benchmark history: %v", err)
	}
}

// TestSweepOutput: under the output's lock, every staging directory the pipeline made beside
// it is a leftover of a run that is over (whatever its pid or namespace), a previous output
// moved aside is put back or removed; a failed run's kept staging directory, other outputs',
// a pid-named one from before leases and a user's directories that only look like ours stay.
func TestSweepOutput(t *testing.T) {
	dir := t.TempDir()
	out := filepath.Join(dir, "out")
	content := func(name string) string { return fmt.Sprintf(`{"spec": %q}`, name) }
	mk := func(name string) string {
		p := filepath.Join(dir, name)
		os.MkdirAll(p, 0o755)
		os.WriteFile(filepath.Join(p, "manifest.json"), []byte(content(name)), 0o644)
		return p
	}
	users := func(name string) string {
		p := filepath.Join(dir, name)
		os.MkdirAll(p, 0o755)
		os.WriteFile(filepath.Join(p, "notes.txt"), []byte("precious"), 0o644)
		return p
	}
	staging, err := newStaging(out)
	if err != nil {
		t.Fatal(err)
	}
	byPid := mk(fmt.Sprintf("out.staging-%d", os.Getpid())) // a pipeline from before leases
	failed, err := newStaging(out)
	if err != nil {
		t.Fatal(err)
	}
	kept := keepStaging(out, failed)
	if !strings.HasPrefix(filepath.Base(kept), "out.failed-") {
		t.Fatalf("a failed run's staging directory was kept as %s", kept)
	}
	otherOutput := mk("out2.staging-0123456789ab") // another output's: not ours
	usersStaging, usersOld := users("out.staging-0123456789ab"), users("out.old-0123456789ab")
	// A run killed between moving the old output aside and putting the new one in place.
	oldOutput := mk(filepath.Base(besideOutput(out, oldInfix)))
	did, err := sweepOutput(out)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := os.Stat(staging); !os.IsNotExist(err) {
		t.Errorf("the leftover %s is still there", staging)
	}
	for _, keep := range []string{kept, otherOutput, byPid, usersStaging, usersOld} {
		if _, err := os.Stat(keep); err != nil {
			t.Errorf("%s was removed: %v", keep, err)
		}
	}
	if data, _ := os.ReadFile(filepath.Join(out, "manifest.json")); string(data) != content(filepath.Base(oldOutput)) {
		t.Errorf("the previous output was not put back: %q", data)
	}
	if len(did) != 4 || !strings.Contains(strings.Join(did, "\n"), "left alone "+usersOld) {
		t.Errorf("sweep said %q", did)
	}
	// With the output in place, a dead run's old copy is only removed.
	oldAgain := mk(filepath.Base(besideOutput(out, oldInfix)))
	if _, err := sweepOutput(out); err != nil {
		t.Fatal(err)
	}
	if _, err := os.Stat(oldAgain); !os.IsNotExist(err) {
		t.Error("a dead run's old output beside a present output was kept")
	}
	if data, _ := os.ReadFile(filepath.Join(out, "manifest.json")); string(data) != content(filepath.Base(oldOutput)) {
		t.Errorf("the output changed: %q", data)
	}
	if data, err := os.ReadFile(filepath.Join(usersOld, "notes.txt")); err != nil || string(data) != "precious" {
		t.Errorf("the user's directory changed: %q %v", data, err)
	}

	// A run killed in its swap, after the marker went: the staging directory is a whole output,
	// swept. A previous output that held only analyze's results is put back.
	swapped := mk(filepath.Base(besideOutput(out, stagingInfix)))
	os.RemoveAll(out)
	analysisOnly := filepath.Join(dir, filepath.Base(besideOutput(out, oldInfix)))
	os.MkdirAll(analysisOnly, 0o755)
	os.WriteFile(filepath.Join(analysisOnly, "analysis.json"), []byte("{}"), 0o644)
	if _, err := sweepOutput(out); err != nil {
		t.Fatal(err)
	}
	if _, err := os.Stat(swapped); !os.IsNotExist(err) {
		t.Error("the staging directory of a run killed in its swap was kept")
	}
	if _, err := os.Stat(filepath.Join(out, "analysis.json")); err != nil {
		t.Errorf("a previous output of analyze's results alone was not put back: %v", err)
	}
}

func newLease(t *testing.T) *lease.Lease {
	t.Helper()
	l, err := lease.New()
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { l.Release() })
	return l
}

// TestRemoveDeadWorkDirs: scratch directories are judged by their run's lease: a run that is
// over loses its own, a live run (another, or this one) keeps its, and directories of
// pipelines from before leases (rd-PID-*) and of tests are never touched.
func TestRemoveDeadWorkDirs(t *testing.T) {
	tmp := t.TempDir()
	own, live, dead := newLease(t), newLease(t), newLease(t)
	mk := func(l *lease.Lease) string {
		if err := l.Hold(tmp); err != nil {
			t.Fatal(err)
		}
		d, err := os.MkdirTemp(tmp, scratchPrefix+l.ID()+"-")
		if err != nil {
			t.Fatal(err)
		}
		return d
	}
	ownDir, liveDir, deadDir := mk(own), mk(live), mk(dead)
	dead.Release()
	old := filepath.Join(tmp, fmt.Sprintf("rd-%d-abc", deadPID(t)))
	other := filepath.Join(tmp, "rdt-123")
	for _, d := range []string{old, other} {
		os.MkdirAll(d, 0o755)
	}
	removed, err := own.RemoveDeadDirs(tmp, scratchPrefix)
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
	running := newLease(t)
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

// TestReplaceDirCarriesOver: what other commands keep in an output (the benchmark history,
// analyze's and plan-sets' results) survives a capture's swap, and a swap that a kill cut
// short between putting the new output in place and moving them over.
func TestReplaceDirCarriesOver(t *testing.T) {
	dir := t.TempDir()
	out, staging := filepath.Join(dir, "out"), filepath.Join(dir, "out.staging-1")
	os.MkdirAll(filepath.Join(out, "bench", "run1"), 0o755)
	os.WriteFile(filepath.Join(out, "analysis.json"), []byte("a"), 0o644)
	os.WriteFile(filepath.Join(out, "plan.json"), []byte("p"), 0o644)
	os.WriteFile(filepath.Join(out, "manifest.json"), []byte("one"), 0o644)
	os.MkdirAll(staging, 0o755)
	os.WriteFile(filepath.Join(staging, "manifest.json"), []byte("two"), 0o644)
	if err := replaceDir(out, staging); err != nil {
		t.Fatal(err)
	}
	for _, name := range []string{"bench/run1", "analysis.json", "plan.json"} {
		if _, err := os.Stat(filepath.Join(out, name)); err != nil {
			t.Errorf("%s was not carried over: %v", name, err)
		}
	}
	// Killed after the swap: the old output still holds the history; carryOver moves it.
	old := filepath.Join(dir, "out.old-9")
	os.MkdirAll(filepath.Join(old, "bench", "run2"), 0o755)
	os.RemoveAll(filepath.Join(out, "bench"))
	if err := carryOver(old, out); err != nil {
		t.Fatal(err)
	}
	if _, err := os.Stat(filepath.Join(out, "bench", "run2")); err != nil {
		t.Errorf("the history of a cut-short swap was not taken over: %v", err)
	}
}

// TestCheckOutput: a directory that holds anything the pipeline did not write is refused as
// an output, naming what it holds; nothing is changed.
func TestCheckOutput(t *testing.T) {
	dir := t.TempDir()
	mk := func(name string, files ...string) string {
		p := filepath.Join(dir, name)
		os.MkdirAll(p, 0o755)
		for _, f := range files {
			os.MkdirAll(filepath.Dir(filepath.Join(p, f)), 0o755)
			os.WriteFile(filepath.Join(p, f), []byte("x"), 0o644)
		}
		return p
	}
	ours := mk("ours", "restore-spec.json", "analysis.json", "numpy/pages.img", "bench/x/bench.json")
	atomicfile.WriteJSON(filepath.Join(ours, manifest.FileName), &manifest.Manifest{ExecutorProtocol: 2,
		Checkpoints: []manifest.Checkpoint{{ID: "numpy", Dir: "numpy"}}})
	// A killed writer's temporary files of the output's own files: the next writer sweeps them.
	killed := mk("killed", ".manifest.json.tmp-123", ".plan.json.tmp-9", "analysis.json")
	for _, ok := range []string{ours, mk("empty"), mk("analysed", "analysis.json", "plan.json"), killed, filepath.Join(dir, "absent")} {
		if err := CheckOutput(ok); err != nil {
			t.Errorf("%s: %v", ok, err)
		}
	}
	for path, want := range map[string]string{
		mk("notes", "notes.txt"):                        "holds notes.txt",
		mk("home", ".bashrc", "src/main.go"):            "holds .bashrc, src",
		mk("stray", "analysis.json", "numpy/pages.img"): "holds numpy", // no manifest names numpy
		mk("badmanifest", "manifest.json"):              "cannot read",
		mk("othertmp", ".notes.txt.tmp-1"):              "holds .notes.txt.tmp-1", // not a file of ours
		mk("tmpdir", ".manifest.json.tmp-1/x"):          "holds .manifest.json.tmp-1",
	} {
		err := CheckOutput(path)
		if !errors.Is(err, ErrSetup) || !strings.Contains(err.Error(), want) || !strings.Contains(err.Error(), path) {
			t.Errorf("%s: %v, want ErrSetup naming it and %q", path, err, want)
		}
	}
	if _, err := os.Stat(filepath.Join(dir, "notes", "notes.txt")); err != nil {
		t.Error("CheckOutput changed the directory")
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
	l := rt.Lease.(*lease.Lease)
	s := sweeper{runtime: rt, lease: l, store: &store.Store{Dir: filepath.Join(t.TempDir(), "store"), Lease: l}, rootfs: rootfs, log: discardLog()}
	out := filepath.Join(t.TempDir(), "out")

	live, dead := newLease(t), newLease(t)
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
	deadPull, livePull := named(dead, filepath.Dir(out), mergePullPrefix), named(live, filepath.Dir(out), mergePullPrefix)
	deadScratch, liveScratch := named(dead, tmp, scratchPrefix), named(live, tmp, scratchPrefix)
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

// probeImage is an image whose Manifest runs probe, then fails: a pull stops there.
type probeImage struct {
	v1.Image
	probe func()
}

func (i probeImage) Manifest() (*v1.Manifest, error) {
	i.probe()
	return nil, errors.New("stopped by the test")
}

// TestPullAsideIsSweptByLease: a pull that only reads the manifest (check-host --image) works
// in a scratch directory named after a lease of its own, which a sweep leaves while the pull
// lives (and removes once it is over, TestRemoveDeadWorkDirs), and which is gone when it
// returns.
func TestPullAsideIsSweptByLease(t *testing.T) {
	tmp := t.TempDir()
	t.Setenv("TMPDIR", tmp)
	probed := false
	_, err := PullAside(context.Background(), probeImage{probe: func() {
		probed = true
		dirs, _ := filepath.Glob(filepath.Join(tmp, scratchPrefix+"*"))
		if len(dirs) != 1 {
			t.Errorf("while it pulls, TMPDIR holds %v; want one scratch directory named after a lease", dirs)
		}
		if removed, err := (*lease.Lease)(nil).RemoveDeadDirs(tmp, scratchPrefix); len(removed) != 0 || err != nil {
			t.Errorf("a sweep removed %v (%v) while the pull lives", removed, err)
		}
	}}, unpack.DefaultLimits(), discardLog(), "pull")
	if err == nil || !probed {
		t.Fatalf("PullAside = %v (probed %v); want the test's stop", err, probed)
	}
	left, _ := filepath.Glob(filepath.Join(tmp, "*"))
	locks, _ := filepath.Glob(filepath.Join(tmp, lease.RunsDir, "*"))
	if len(left) != 1 || left[0] != filepath.Join(tmp, lease.RunsDir) || len(locks) != 0 {
		t.Errorf("left %v and lock files %v", left, locks)
	}
}

// TestMergeSweepsDeadMergesPulls: a merge first removes, beside its output, the pulled sources
// of merges that died (named after their lease), and leaves a live merge's.
func TestMergeSweepsDeadMergesPulls(t *testing.T) {
	cfg, err := config.Parse([]byte("{}\n"), "test.yaml", t.TempDir(), t.TempDir())
	if err != nil {
		t.Fatal(err)
	}
	out := filepath.Join(t.TempDir(), "out")
	live, dead := newLease(t), newLease(t)
	pull := func(l *lease.Lease) string {
		t.Helper()
		if err := l.Hold(filepath.Dir(out)); err != nil {
			t.Fatal(err)
		}
		d, err := os.MkdirTemp(filepath.Dir(out), mergePullPrefix+l.ID()+"-")
		if err != nil {
			t.Fatal(err)
		}
		return d
	}
	deadPull, livePull := pull(dead), pull(live)
	dead.Release()
	_, err = MergeSources(context.Background(), cfg, out, []string{filepath.Join(t.TempDir(), "missing")}, discardLog())
	if !errors.Is(err, ErrSetup) {
		t.Fatalf("a merge of a missing source: %v, want a setup error", err)
	}
	if _, err := os.Stat(deadPull); !os.IsNotExist(err) {
		t.Errorf("a dead merge's %s is still there (%v)", deadPull, err)
	}
	if _, err := os.Stat(livePull); err != nil {
		t.Errorf("a live merge's %s was removed: %v", livePull, err)
	}
}

// TestSweepTemporaries: under the lock, sweepOutput removes the temporary files killed writers
// left in the output (top level, checkpoint directories, bench runs), and nothing else.
func TestSweepTemporaries(t *testing.T) {
	out := filepath.Join(t.TempDir(), "out")
	keep := []string{"manifest.json", "numpy/meta.json", "bench/20261203T000000Z/bench.json", ".hidden", "notes.tmp-1"}
	gone := []string{".manifest.json.tmp-1", ".catalogue.json.tmp-22", "numpy/.meta.json.tmp-3", "bench/20261203T000000Z/.bench.json.tmp-4"}
	for _, name := range slices.Concat(keep, gone) {
		path := filepath.Join(out, name)
		os.MkdirAll(filepath.Dir(path), 0o755)
		if err := os.WriteFile(path, nil, 0o644); err != nil {
			t.Fatal(err)
		}
	}
	did, err := sweepOutput(out)
	if err != nil || len(did) != len(gone) {
		t.Fatalf("sweepOutput = %q, %v; want %d removals", did, err, len(gone))
	}
	for _, name := range gone {
		if _, err := os.Lstat(filepath.Join(out, name)); !os.IsNotExist(err) {
			t.Errorf("%s is still there", name)
		}
	}
	for _, name := range keep {
		if _, err := os.Lstat(filepath.Join(out, name)); err != nil {
			t.Errorf("%s: %v", name, err)
		}
	}
	if did, err := sweepOutput(filepath.Join(t.TempDir(), "absent")); err != nil || len(did) != 0 {
		t.Errorf("an absent output: %q, %v", did, err)
	}
}
