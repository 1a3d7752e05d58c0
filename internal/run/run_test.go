package run

import (
	"context"
	"fmt"
	"maps"
	"os"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/sirupsen/logrus"

	"readie.dev/pipeline/internal/config"
	"readie.dev/pipeline/internal/lease"
	ocirootfs "readie.dev/pipeline/internal/oci/rootfs"
	"readie.dev/pipeline/internal/outdir"
	"readie.dev/pipeline/internal/scratch"
	"readie.dev/pipeline/internal/store"
	"readie.dev/pipeline/internal/testenv"
	"readie.dev/pipeline/pkg/filedigest"
	"readie.dev/pipeline/pkg/manifest"
	"readie.dev/pipeline/pkg/runsc"
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
	s := sweeper{runtime: rt, lease: l, store: &store.Store{Dir: filepath.Join(t.TempDir(), "store"), Lease: l}, rootfs: rootfs, log: testenv.DiscardLog()}
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
	oci := filepath.Join(rootfs, ocirootfs.OCIDir)
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

// TestRunscDriverCaptureLeavesNoMeta: the runsc driver's capture (capture.Take, on the real
// runsc and executor) returns the set's meta.json contents, stamped with the fingerprint it
// was given and matching the files, and writes no meta.json itself: the carrier writes it,
// once, into the store (TestStagesValuesMadeOncePerSet counts those writes).
func TestRunscDriverCaptureLeavesNoMeta(t *testing.T) {
	rt := testenv.Runtime(t)
	r, err := OpenRootfs(testenv.Rootfs(t))
	if err != nil {
		t.Fatal(err)
	}
	cfg, err := config.Parse(nil, "test.yaml", t.TempDir(), t.TempDir())
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	version, err := rt.Version(ctx)
	if err != nil {
		t.Fatal(err)
	}
	sb := &Sandboxes{Config: cfg, Log: testenv.DiscardLog(), Runtime: rt, Rootfs: r}
	fingerprint, err := sb.SpecFingerprint()
	if err != nil {
		t.Fatal(err)
	}
	d := leavesNoMeta{Driver: runscDriver{sandboxes: sb, work: testenv.WorkDir(t), runscVersion: version, fingerprint: fingerprint}, t: t}
	dir := t.TempDir()
	meta, err := d.Capture(ctx, config.PackageSet{ID: "empty"}, dir)
	if err != nil {
		t.Fatal(err)
	}
	if meta.ID != "empty" || meta.SpecFingerprint != fingerprint || meta.RunscVersion != version {
		t.Errorf("meta.json contents: id %q, spec fingerprint %s (want %s), runsc %q (want %q)", meta.ID, meta.SpecFingerprint, fingerprint, meta.RunscVersion, version)
	}
	if err := store.VerifyFiles(dir, meta); err != nil || len(meta.Files) != len(manifest.ImageFiles()) {
		t.Errorf("the returned meta.json does not match the capture's files (%d of them): %v", len(meta.Files), err)
	}
}

// TestNewEnvRecordsHelpers: NewEnv records the digests of runsc's helpers (gvisor-bin/ beside
// it) for the manifest, and warns when runsc has none, naming the ones missing.
func TestNewEnvRecordsHelpers(t *testing.T) {
	fake, _ := testenv.FakeRunsc(t, "[]")
	newEnv := func() (*Env, string) {
		t.Helper()
		cfg, err := config.Parse([]byte("runsc:\n  path: "+fake+"\n"), "test.yaml", t.TempDir(), t.TempDir())
		if err != nil {
			t.Fatal(err)
		}
		var log strings.Builder
		logger := logrus.New()
		logger.SetOutput(&log)
		e, err := NewEnv(context.Background(), cfg, logger)
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { e.Close() })
		return e, log.String()
	}
	e, log := newEnv()
	if len(e.Runsc.Helpers) != 0 || !strings.Contains(log, "runsc's helpers are missing") || !strings.Contains(log, "missing=\"gvisor-sentry-prewarmer,gvisor_sentry\"") {
		t.Errorf("a runsc without helpers: recorded %v, logged %q", e.Runsc.Helpers, log)
	}
	bin := filepath.Join(filepath.Dir(fake), "gvisor-bin")
	if err := os.Mkdir(bin, 0o755); err != nil {
		t.Fatal(err)
	}
	for _, name := range runsc.HelperNames() {
		if err := os.WriteFile(filepath.Join(bin, name), []byte(name), 0o755); err != nil {
			t.Fatal(err)
		}
	}
	e, log = newEnv()
	want := map[string]string{runsc.Sentry: filedigest.OfBytes([]byte(runsc.Sentry)), runsc.Prewarmer: filedigest.OfBytes([]byte(runsc.Prewarmer))}
	if !maps.Equal(e.Runsc.Helpers, want) || strings.Contains(log, "helpers") {
		t.Errorf("a runsc with its helpers: recorded %v, want %v; logged %q", e.Runsc.Helpers, want, log)
	}
}
