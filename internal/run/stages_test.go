package run

import (
	"context"
	"encoding/binary"
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/sirupsen/logrus"
	logtest "github.com/sirupsen/logrus/hooks/test"

	"readie.dev/pipeline/internal/config"
	"readie.dev/pipeline/internal/outdir"
	"readie.dev/pipeline/internal/store"
	"readie.dev/pipeline/internal/testenv"
	"readie.dev/pipeline/pkg/atomicfile"
	"readie.dev/pipeline/pkg/catalogue"
	"readie.dev/pipeline/pkg/checkpointid"
	"readie.dev/pipeline/pkg/executorproto"
	"readie.dev/pipeline/pkg/filedigest"
	"readie.dev/pipeline/pkg/launch"
	"readie.dev/pipeline/pkg/manifest"
	"readie.dev/pipeline/pkg/measure"
	"readie.dev/pipeline/pkg/sandbox"
)

// Unit tests of the plan and the carry-out against a substitute Driver: which sets are
// captured, reused or kept, what the store and the output hold afterwards, and how a failed
// set leaves the output. The same stages run on the real runsc in cmd/pipeline's tests.

// fakeDriver stands in for runsc: a capture writes image files whose bytes depend on the set
// and returns their meta.json contents, unwritten, stamped with the run's fingerprint, as
// capture.Take does; restores and smoke tests only check the files are there.
type fakeDriver struct {
	fingerprint string
	cpus        int             // the CPU count its sandboxes "see": the run's
	failCapture map[string]bool // sets whose capture fails, after writing part of an image
	failSmoke   map[string]bool
	// alter changes a set's pages.img after its meta.json recorded it (a capture whose files
	// do not match what it says of them).
	alter map[string]bool
	// unmapped are the modules a set's capture says no distribution's metadata names.
	unmapped map[string][]string

	mu                         sync.Mutex
	captured, measured, smoked []string
}

func (d *fakeDriver) record(list *[]string, id string) {
	d.mu.Lock()
	defer d.mu.Unlock()
	*list = append(*list, id)
}

// calls returns what the driver was asked to do, each sorted (sets run in parallel).
func (d *fakeDriver) calls() (captured, measured, smoked []string) {
	d.mu.Lock()
	defer d.mu.Unlock()
	return slices.Sorted(slices.Values(d.captured)), slices.Sorted(slices.Values(d.measured)), slices.Sorted(slices.Values(d.smoked))
}

func (d *fakeDriver) Capture(ctx context.Context, set config.PackageSet, dir string) (*manifest.Meta, error) {
	d.record(&d.captured, set.ID)
	if d.failCapture[set.ID] {
		os.WriteFile(filepath.Join(dir, "checkpoint.img"), []byte("half"), 0o600)
		return nil, fmt.Errorf("fake capture of %s failed", set.ID)
	}
	meta := &manifest.Meta{
		ID: set.ID, Imports: slices.Clone(set.Imports), RunscVersion: "fake-runsc", SpecFingerprint: d.fingerprint,
		CapturedAt: time.Now().UTC(), Files: map[string]manifest.File{}, UnmappedModules: d.unmapped[set.ID], CPUs: d.cpus,
	}
	for _, name := range manifest.ImageFiles() {
		path := filepath.Join(dir, name)
		data := []byte(fmt.Sprintf("%s of %s %v", name, set.ID, set.Imports))
		if name == "checkpoint.img" {
			data = append(fakeImageHeader(meta.RunscVersion), data...)
		}
		if err := os.WriteFile(path, data, 0o600); err != nil {
			return nil, err
		}
		size, sum, err := filedigest.Of(path)
		if err != nil {
			return nil, err
		}
		meta.Files[name] = manifest.File{Bytes: size, SHA256: sum}
	}
	return meta, nil
}

// fakeImageHeader is the header gVisor starts checkpoint.img with (manifest.ImageHeader), as a
// runsc of version would write it: Verify reads it.
func fakeImageHeader(version string) []byte {
	metadata := fmt.Sprintf(`{"runsc_version":%q}`, version)
	header := binary.BigEndian.AppendUint64([]byte(manifest.ImageMagic), uint64(len(metadata)))
	return append(header, metadata...)
}

func (d *fakeDriver) Measure(ctx context.Context, setID, dir string, runs int) (manifest.Stats, error) {
	d.record(&d.measured, setID)
	if d.alter[setID] {
		if err := os.WriteFile(filepath.Join(dir, "pages.img"), []byte("altered"), 0o600); err != nil {
			return manifest.Stats{}, err
		}
	}
	if _, err := os.Stat(filepath.Join(dir, "checkpoint.img")); err != nil {
		return manifest.Stats{}, err
	}
	times := make([]float64, runs)
	for i := range times {
		times[i] = float64(100 + i)
	}
	return measure.Summarize(times), nil
}

func (d *fakeDriver) Smoke(ctx context.Context, setID, dir string, imports []string) (manifest.Smoke, error) {
	d.record(&d.smoked, setID)
	if _, err := os.Stat(filepath.Join(dir, "checkpoint.img")); err != nil {
		return manifest.Smoke{Error: err.Error()}, err
	}
	if d.failSmoke[setID] {
		err := fmt.Errorf("fake smoke test of %s failed", setID)
		return manifest.Smoke{Error: err.Error()}, err
	}
	return manifest.Smoke{OK: true, ReadyMS: 5}, nil
}

// stagesFixture is an Env and the rootfs its captures run on: a test may change the rootfs
// between captures.
type stagesFixture struct {
	*Env
	Rootfs *Rootfs
}

// stagesEnv is an Env of the default config's sets (empty, numpy, pandas) with no runsc: a
// store in a fresh cache, 3 timed restores, 2 jobs; its tally counts. Its rootfs is a
// directory nothing runs in.
func stagesEnv(t *testing.T) *stagesFixture {
	t.Helper()
	cache := t.TempDir()
	cfg, err := config.Parse([]byte("restore_runs: 3\njobs: 2\n"), "test.yaml", t.TempDir(), cache)
	if err != nil {
		t.Fatal(err)
	}
	l := testenv.NewLease(t)
	counts := &tally{}
	e := &Env{
		Config: cfg, Runtime: &launch.Runtime{Flags: sandbox.DefaultFlags(), Lease: l},
		Runsc: manifest.Runsc{Version: "fake-runsc", SHA256: filedigest.OfBytes([]byte("runsc"))}, RestoreFlags: []string{"-direct"}, Log: testenv.DiscardLog(),
		Store: &store.Store{Dir: cfg.CheckpointCache, Lease: l, WriteJSON: counts.writer(atomicfile.WriteJSON)}, lease: l, tally: counts,
	}
	return &stagesFixture{Env: e, Rootfs: &Rootfs{Rootfs: manifest.Rootfs{Path: t.TempDir(), Digest: filedigest.OfBytes([]byte("rootfs"))}}}
}

// fakeCapture plans a capture into out with the sets of only and extra (as --only and --set)
// and carries it out through d, as Env.Capture does after its runsc steps.
func fakeCapture(t *testing.T, e *stagesFixture, d *fakeDriver, out string, only []string, extra []config.PackageSet) (*Plan, *Result, error) {
	t.Helper()
	sel, err := e.Config.Select(only, extra)
	if err != nil {
		t.Fatal(err)
	}
	return fakeCaptureWith(t, e, d, out, CaptureOptions{Selection: sel}, nil)
}

// fakeCaptureWith is fakeCapture with the options o; between, when set, runs between the plan
// and its carry-out (what other runs do meanwhile).
func fakeCaptureWith(t *testing.T, e *stagesFixture, d *fakeDriver, out string, o CaptureOptions, between func(*Plan)) (*Plan, *Result, error) {
	t.Helper()
	b, err := newBasis(e.Env, e.Sandboxes(e.Rootfs), manifest.CPU{Features: []string{"sse2"}, CacheLine: 64}, false)
	if err != nil {
		t.Fatal(err)
	}
	d.fingerprint, d.cpus = b.Fingerprint, b.CPUs
	plan := NewPlan(b, e.Store, out, o, e.Config.RestoreRuns)
	if between != nil {
		between(plan)
	}
	res, err := carryOutPlan(context.Background(), e.Env, plan, b, e.Runsc, leavesNoMeta{Driver: d, t: t}, t.TempDir(), o, nil)
	return plan, res, err
}

// leavesNoMeta is a Driver whose captures must leave no meta.json: the carrier writes it,
// once, into the store (Commit).
type leavesNoMeta struct {
	Driver
	t *testing.T
}

func (d leavesNoMeta) Capture(ctx context.Context, set config.PackageSet, dir string) (*manifest.Meta, error) {
	meta, err := d.Driver.Capture(ctx, set, dir)
	if _, serr := os.Lstat(filepath.Join(dir, manifest.MetaFileName)); !errors.Is(serr, os.ErrNotExist) {
		d.t.Errorf("the capture of %s wrote %s itself (%v): the carrier writes it, once", set.ID, manifest.MetaFileName, serr)
	}
	return meta, err
}

// actions are the plan's decisions, "id action from" each.
func actions(p *Plan) []string {
	var out []string
	for _, sp := range p.Sets {
		out = append(out, strings.TrimSpace(fmt.Sprintf("%s %s %s", sp.ID, sp.Action, sp.From)))
	}
	return out
}

func statuses(res *Result) map[string]Status {
	out := map[string]Status{}
	for _, s := range res.Sets {
		out[s.Checkpoint.ID] = s.Status
	}
	return out
}

func checkpointIDs(m *manifest.Manifest) []string {
	var ids []string
	for _, c := range m.Checkpoints {
		ids = append(ids, c.ID)
	}
	return ids
}

func equal(t *testing.T, what string, got, want []string) {
	t.Helper()
	if !slices.Equal(got, want) {
		t.Errorf("%s = %q, want %q", what, got, want)
	}
}

// A first capture captures every set, times and smoke-tests each, puts each into the store
// and writes the output; a second one reuses the output's checkpoints (smoke-tested again,
// timings kept); with the output gone, a third reuses the store's.
func TestStagesCaptureThenReuse(t *testing.T) {
	e := stagesEnv(t)
	out := filepath.Join(t.TempDir(), "out")
	all := []string{"empty", "numpy", "pandas"}

	first := &fakeDriver{}
	plan, res, err := fakeCapture(t, e, first, out, nil, nil)
	if err != nil {
		t.Fatal(err)
	}
	equal(t, "first plan", actions(plan), []string{"empty capture", "numpy capture", "pandas capture"})
	captured, measured, smoked := first.calls()
	equal(t, "captured", captured, all)
	equal(t, "measured", measured, all)
	equal(t, "smoke-tested", smoked, all)
	m := testenv.Manifest(t, out)
	equal(t, "checkpoints", checkpointIDs(m), all)
	if _, err := os.Lstat(filepath.Join(out, outdir.StagingMarker)); !os.IsNotExist(err) || outdir.Check(out) != nil {
		t.Errorf("the output holds the staging marker (%v) or is not an output: %v", err, outdir.Check(out))
	}
	if !slices.Equal(m.RunscFlags, sandbox.DefaultFlags().Args()) || !slices.Equal(m.RestoreFlags, []string{"-direct"}) || m.Runsc.Version != "fake-runsc" {
		t.Errorf("manifest runsc %+v, flags %q, restore flags %q", m.Runsc, m.RunscFlags, m.RestoreFlags)
	}
	if _, err := sandbox.ReadSpec(filepath.Join(out, m.Spec), m.SpecFingerprint, m.RunscFlags); err != nil {
		t.Errorf("the restore spec does not match the manifest: %v", err)
	}
	for i, c := range m.Checkpoints {
		if c.Key != plan.Sets[i].Key || len(c.RestoreMS.Runs) != 3 || c.MeasuredWith == nil || c.MeasuredWith.Runs != 3 || !c.Smoke.OK || c.Bytes == 0 {
			t.Errorf("checkpoint %+v", c)
		}
		meta, err := manifest.LoadMeta(filepath.Join(out, c.Dir, manifest.MetaFileName))
		if err != nil || meta.Key != c.Key || store.VerifyFiles(filepath.Join(out, c.Dir), meta) != nil {
			t.Errorf("meta.json of %s: %+v %v", c.ID, meta, err)
		}
		if stored, err := e.Store.Lookup(c.Key); err != nil || stored == nil || stored.RestoreMS == nil || len(stored.RestoreMS.Runs) != 3 {
			t.Errorf("store entry of %s: %+v %v", c.ID, stored, err)
		}
	}
	if statuses(res)["pandas"] != Captured {
		t.Errorf("statuses %v", statuses(res))
	}

	second := &fakeDriver{}
	plan, res, err = fakeCapture(t, e, second, out, nil, nil)
	if err != nil {
		t.Fatal(err)
	}
	equal(t, "second plan", actions(plan), []string{"empty reuse output", "numpy reuse output", "pandas reuse output"})
	captured, measured, smoked = second.calls()
	equal(t, "captured again", captured, nil)
	equal(t, "measured again", measured, nil)
	equal(t, "smoke-tested again", smoked, all)
	if again := testenv.Manifest(t, out); !slices.Equal(again.Checkpoints[2].RestoreMS.Runs, m.Checkpoints[2].RestoreMS.Runs) || statuses(res)["pandas"] != Reused {
		t.Errorf("reused timings %v, first %v; statuses %v", again.Checkpoints[2].RestoreMS.Runs, m.Checkpoints[2].RestoreMS.Runs, statuses(res))
	}

	if err := os.RemoveAll(out); err != nil {
		t.Fatal(err)
	}
	third := &fakeDriver{}
	plan, _, err = fakeCapture(t, e, third, out, nil, nil)
	if err != nil {
		t.Fatal(err)
	}
	equal(t, "plan without the output", actions(plan), []string{"empty reuse store", "numpy reuse store", "pandas reuse store"})
	if captured, _, _ := third.calls(); len(captured) != 0 {
		t.Errorf("captured %v with every set in the store", captured)
	}
	equal(t, "checkpoints from the store", checkpointIDs(testenv.Manifest(t, out)), all)
}

// A capture's unmapped modules are logged as a warning, once, when it is captured, and recorded
// in the set's meta.json, the manifest and the catalogue; a reuse (from the output, from the
// store) keeps them without warning again.
func TestStagesUnmappedModules(t *testing.T) {
	e := stagesEnv(t)
	log, hook := logtest.NewNullLogger()
	e.Log = log
	out := filepath.Join(t.TempDir(), "out")
	check := func(when string) {
		t.Helper()
		m := testenv.Manifest(t, out)
		for _, c := range m.Checkpoints {
			want := map[string][]string{"pandas": {"appmod"}}[c.ID]
			meta, err := manifest.LoadMeta(filepath.Join(out, c.Dir, manifest.MetaFileName))
			if err != nil || !slices.Equal(c.UnmappedModules, want) || !slices.Equal(meta.UnmappedModules, want) {
				t.Errorf("%s: %s: manifest %v, meta.json %v (%v); want %v", when, c.ID, c.UnmappedModules, meta.UnmappedModules, err, want)
			}
		}
		cat, err := catalogue.Load(filepath.Join(out, catalogue.FileName))
		if err != nil || cat.Version != 4 || !slices.Equal(cat.Checkpoints[2].UnmappedModules, []string{"appmod"}) {
			t.Errorf("%s: catalogue %+v, %v; want version 4, pandas's appmod", when, cat, err)
		}
	}
	if _, _, err := fakeCapture(t, e, &fakeDriver{unmapped: map[string][]string{"pandas": {"appmod"}}}, out, nil, nil); err != nil {
		t.Fatal(err)
	}
	check("captured")
	var warned []string
	for _, entry := range hook.AllEntries() {
		if entry.Level == logrus.WarnLevel {
			warned = append(warned, fmt.Sprintf("%v: %s", entry.Data["set"], entry.Message))
		}
	}
	equal(t, "warnings", warned, []string{"pandas: module appmod: no distribution's metadata names it; its version is unknown"})
	hook.Reset()
	if _, _, err := fakeCapture(t, e, &fakeDriver{}, out, nil, nil); err != nil {
		t.Fatal(err)
	}
	check("reused from the output")
	if err := os.RemoveAll(out); err != nil {
		t.Fatal(err)
	}
	if _, _, err := fakeCapture(t, e, &fakeDriver{}, out, nil, nil); err != nil {
		t.Fatal(err)
	}
	check("reused from the store")
	for _, entry := range hook.AllEntries() {
		if entry.Level <= logrus.WarnLevel {
			t.Errorf("a reuse logged %s: %s", entry.Level, entry.Message)
		}
	}
}

// An output's checkpoints are reused into the next output, but never put into the store: an
// output may have been pulled from whoever pushed it, and the store serves every run.
func TestStagesOutputCheckpointsStayOutOfTheStore(t *testing.T) {
	out := filepath.Join(t.TempDir(), "out")
	if _, _, err := fakeCapture(t, stagesEnv(t), &fakeDriver{}, out, nil, nil); err != nil {
		t.Fatal(err)
	}
	e := stagesEnv(t) // another store
	plan, _, err := fakeCapture(t, e, &fakeDriver{}, out, nil, nil)
	if err != nil {
		t.Fatal(err)
	}
	equal(t, "plan", actions(plan), []string{"empty reuse output", "numpy reuse output", "pandas reuse output"})
	for _, sp := range plan.Sets {
		if stored, err := e.Store.Lookup(sp.Key); stored != nil || err != nil {
			t.Errorf("%s went from the output into the store: %+v %v", sp.ID, stored, err)
		}
	}
}

// A set whose imports change (--set) is captured again, naming the changed key part; a set the
// run does not select is kept with its key; the others are reused.
func TestStagesChangedSetOnly(t *testing.T) {
	e := stagesEnv(t)
	out := filepath.Join(t.TempDir(), "out")
	if _, _, err := fakeCapture(t, e, &fakeDriver{}, out, nil, nil); err != nil {
		t.Fatal(err)
	}
	before := testenv.Manifest(t, out)
	d := &fakeDriver{}
	plan, res, err := fakeCapture(t, e, d, out, nil, []config.PackageSet{{ID: "pandas", Imports: []string{"numpy", "pandas"}}})
	if err != nil {
		t.Fatal(err)
	}
	equal(t, "plan", actions(plan), []string{"empty reuse output", "numpy keep output", "pandas capture"})
	if r := plan.Sets[2].Reason; !strings.Contains(r, "imports") {
		t.Errorf("the reason for capturing pandas again does not name its imports: %q", r)
	}
	captured, _, smoked := d.calls()
	equal(t, "captured", captured, []string{"pandas"})
	equal(t, "smoke-tested", smoked, []string{"empty", "pandas"})
	after := testenv.Manifest(t, out)
	equal(t, "checkpoints", checkpointIDs(after), []string{"empty", "numpy", "pandas"})
	if after.Checkpoints[1].Key != before.Checkpoints[1].Key || after.Checkpoints[2].Key == before.Checkpoints[2].Key {
		t.Errorf("keys before %s %s, after %s %s", before.Checkpoints[1].Key, before.Checkpoints[2].Key, after.Checkpoints[1].Key, after.Checkpoints[2].Key)
	}
	if s := statuses(res); s["numpy"] != Kept || s["pandas"] != Captured || s["empty"] != Reused {
		t.Errorf("statuses %v", s)
	}
}

// A set that fails does not stop the others: they are captured and go into the store, while
// the run fails naming the failed set, leaves the output as it was, and keeps the failed set's
// capture in the staging directory it keeps for inspection, with its meta.json when the
// capture returned one.
func TestStagesFailedSetCarriesOn(t *testing.T) {
	e := stagesEnv(t)
	out := filepath.Join(t.TempDir(), "out")
	d := &fakeDriver{failCapture: map[string]bool{"numpy": true}, failSmoke: map[string]bool{"pandas": true}}
	plan, res, err := fakeCapture(t, e, d, out, nil, nil)
	if !errors.Is(err, errFailedSets) || !strings.Contains(err.Error(), "numpy, pandas") {
		t.Fatalf("a run with failed sets: %v", err)
	}
	if _, serr := os.Stat(out); !errors.Is(serr, os.ErrNotExist) {
		t.Errorf("a failed first run made the output: %v", serr)
	}
	if s := statuses(res); s["empty"] != Captured || s["numpy"] != Failed || s["pandas"] != Failed {
		t.Errorf("statuses %v", s)
	}
	captured, measured, _ := d.calls()
	equal(t, "captured", captured, []string{"empty", "numpy", "pandas"})
	equal(t, "measured", measured, []string{"empty"})
	for _, sp := range plan.Sets {
		stored, err := e.Store.Lookup(sp.Key)
		if (stored != nil) != (sp.ID == "empty") || err != nil {
			t.Errorf("store entry of %s: %v %v", sp.ID, stored, err)
		}
	}
	kept, _ := filepath.Glob(out + ".failed-*")
	if len(kept) != 1 {
		t.Fatalf("kept staging directories: %v", kept)
	}
	if data, err := os.ReadFile(filepath.Join(kept[0], "numpy", "capture", "checkpoint.img")); err != nil || string(data) != "half" {
		t.Errorf("the failed capture's files: %q %v", data, err)
	}
	// pandas captured fine, then failed its smoke test: its capture is kept with its meta.json
	// (the files' digests, the CPU check's evidence), which only the store's Commit would
	// otherwise have written.
	capture := filepath.Join(kept[0], "pandas", "capture")
	if meta, err := manifest.LoadMeta(filepath.Join(capture, manifest.MetaFileName)); err != nil {
		t.Errorf("the kept capture of pandas has no meta.json: %v", err)
	} else if meta.ID != "pandas" || meta.Key != plan.Sets[2].Key || len(meta.Files) != len(manifest.ImageFiles()) || store.VerifyFiles(capture, meta) != nil {
		t.Errorf("the kept capture's meta.json %+v does not match its files: %v", meta, store.VerifyFiles(capture, meta))
	}
	if _, err := os.Lstat(filepath.Join(kept[0], "numpy", "capture", manifest.MetaFileName)); !errors.Is(err, os.ErrNotExist) {
		t.Errorf("a capture that failed has a meta.json (%v): it returned none", err)
	}
	if !strings.Contains(err.Error(), kept[0]) {
		t.Errorf("the error does not name the kept staging directory %s: %v", kept[0], err)
	}
	if pending, _ := filepath.Glob(filepath.Join(e.Store.Dir, ".pending-*")); len(pending) != 0 {
		t.Errorf("the failed capture left store entries pending: %v", pending)
	}
}

// keepFailedSet keeps the logs of a failed set's own sandboxes whatever the length of its id
// (a sandbox ID carries a long one shortened), and none of another set's whose id begins like
// its own and a step's name.
func TestKeepFailedSetLogs(t *testing.T) {
	rt := &launch.Runtime{Root: t.TempDir(), Lease: testenv.NewLease(t)}
	work, staging := t.TempDir(), t.TempDir()
	long := strings.Repeat("x", checkpointid.MaxLen)
	for _, b := range []struct{ set, step string }{{long, "capture"}, {"a", "smoke"}, {"a-smoke", "capture"}} {
		id, err := rt.NewID(b.set, b.step)
		if err != nil {
			t.Fatal(err)
		}
		if err := os.Mkdir(filepath.Join(work, id), 0o700); err != nil {
			t.Fatal(err)
		}
		if err := os.WriteFile(filepath.Join(work, id, "stderr.log"), []byte(b.set+" "+b.step), 0o600); err != nil {
			t.Fatal(err)
		}
	}
	for set, want := range map[string]string{long: long + " capture", "a": "a smoke", "a-smoke": "a-smoke capture"} {
		if err := keepFailedSet(&setWork{sp: SetPlan{ID: set}}, staging, work, rt.IDPrefix, nil); err != nil {
			t.Errorf("keepFailedSet(%s): %v", set, err)
		}
		var kept []string
		logs, _ := filepath.Glob(filepath.Join(staging, set, "logs", "*"))
		for _, log := range logs {
			data, _ := os.ReadFile(log)
			kept = append(kept, string(data))
		}
		if len(kept) != 1 || kept[0] != want {
			t.Errorf("the kept logs of %s hold %q, want [%q]", set, kept, want)
		}
	}
}

// A store entry whose files no longer match its meta.json is removed and its set captured
// again; the sets whose entries verify are reused.
func TestStagesCorruptStoreEntry(t *testing.T) {
	e := stagesEnv(t)
	out := filepath.Join(t.TempDir(), "out")
	plan, _, err := fakeCapture(t, e, &fakeDriver{}, out, nil, nil)
	if err != nil {
		t.Fatal(err)
	}
	if err := os.RemoveAll(out); err != nil {
		t.Fatal(err)
	}
	entry, err := e.Store.Path(plan.Sets[1].Key) // numpy
	if err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join(entry, "pages.img"), []byte("changed"), 0o600); err != nil {
		t.Fatal(err)
	}
	d := &fakeDriver{}
	plan, _, err = fakeCapture(t, e, d, out, nil, nil)
	if err != nil {
		t.Fatal(err)
	}
	equal(t, "plan", actions(plan), []string{"empty reuse store", "numpy capture", "pandas reuse store"})
	if !strings.Contains(plan.Sets[1].Reason, "corrupt") {
		t.Errorf("reason %q", plan.Sets[1].Reason)
	}
	captured, _, _ := d.calls()
	equal(t, "captured", captured, []string{"numpy"})
	if stored, err := e.Store.Lookup(plan.Sets[1].Key); err != nil || stored == nil {
		t.Errorf("the recaptured entry: %v %v", stored, err)
	}
}

// The key covers the basis: another rootfs changes every set's key, so nothing is reused and
// the plan names the changed part.
func TestStagesKeyCoversTheBasis(t *testing.T) {
	e := stagesEnv(t)
	out := filepath.Join(t.TempDir(), "out")
	if _, _, err := fakeCapture(t, e, &fakeDriver{}, out, nil, nil); err != nil {
		t.Fatal(err)
	}
	e.Rootfs.Digest = filedigest.OfBytes([]byte("another rootfs"))
	d := &fakeDriver{}
	plan, _, err := fakeCapture(t, e, d, out, nil, nil)
	if err != nil {
		t.Fatal(err)
	}
	equal(t, "plan", actions(plan), []string{"empty capture", "numpy capture", "pandas capture"})
	if !strings.Contains(plan.Sets[0].Reason, "rootfs_digest") {
		t.Errorf("reason %q does not name the rootfs", plan.Sets[0].Reason)
	}
	if m := testenv.Manifest(t, out); m.Rootfs.Digest != e.Rootfs.Digest {
		t.Errorf("manifest rootfs %s", m.Rootfs.Digest)
	}
}

// TestStagesKeptSetThatDoesNotVerify: a set kept from the previous output (not selected by
// --only) whose file was altered there is refused, not recaptured (the run was told to leave it
// alone): the run fails naming it, and the previous output stays in place as it was.
func TestStagesKeptSetThatDoesNotVerify(t *testing.T) {
	e := stagesEnv(t)
	out := filepath.Join(t.TempDir(), "out")
	if _, _, err := fakeCapture(t, e, &fakeDriver{}, out, nil, nil); err != nil {
		t.Fatal(err)
	}
	// A new file in the output's place (the store's entry, linked before, stays good).
	pages := filepath.Join(out, "pandas", "pages.img")
	if err := os.Remove(pages); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(pages, []byte("altered"), 0o400); err != nil {
		t.Fatal(err)
	}
	before, err := os.ReadFile(filepath.Join(out, manifest.FileName))
	if err != nil {
		t.Fatal(err)
	}
	d := &fakeDriver{}
	plan, res, err := fakeCapture(t, e, d, out, []string{"numpy"}, nil)
	equal(t, "plan", actions(plan), []string{"empty reuse output", "numpy reuse output", "pandas keep output"})
	if err == nil || !strings.Contains(err.Error(), "pandas: kept from the output, but its files do not match its meta.json") {
		t.Fatalf("a capture keeping an altered set: %v; want it refused naming pandas", err)
	}
	if got := statuses(res)["pandas"]; got != Failed {
		t.Errorf("pandas: %s, want failed", got)
	}
	if captured, _, _ := d.calls(); len(captured) != 0 {
		t.Errorf("captured %v, want nothing", captured)
	}
	after, err := os.ReadFile(filepath.Join(out, manifest.FileName))
	if err != nil || string(after) != string(before) {
		t.Fatalf("the previous output's manifest changed (%v)", err)
	}
	if data, _ := os.ReadFile(pages); string(data) != "altered" {
		t.Errorf("the previous output was replaced")
	}
}

// TestStagesOutputThatDoesNotVerifyIsNotSwapped: every set passes, but the staging output does
// not verify (a capture's file does not match its meta.json): the run fails saying so, and the
// previous output stays in place.
func TestStagesOutputThatDoesNotVerifyIsNotSwapped(t *testing.T) {
	e := stagesEnv(t)
	out := filepath.Join(t.TempDir(), "out")
	first, _, err := fakeCapture(t, e, &fakeDriver{}, out, nil, nil)
	if err != nil {
		t.Fatal(err)
	}
	// Out of the store, so that the capture below, not the stored one, goes into the output.
	entry, err := e.Store.Path(first.Sets[1].Key) // numpy
	if err != nil {
		t.Fatal(err)
	}
	if err := os.RemoveAll(entry); err != nil {
		t.Fatal(err)
	}
	before, err := os.ReadFile(filepath.Join(out, manifest.FileName))
	if err != nil {
		t.Fatal(err)
	}
	sel, err := e.Config.Select(nil, nil)
	if err != nil {
		t.Fatal(err)
	}
	d := &fakeDriver{alter: map[string]bool{"numpy": true}}
	_, res, err := fakeCaptureWith(t, e, d, out, CaptureOptions{Selection: sel, Recapture: true}, nil)
	if err == nil || !strings.Contains(err.Error(), "does not verify") || !strings.Contains(err.Error(), filepath.Join("numpy", "pages.img")) {
		t.Fatalf("a capture whose output does not verify: %v; want it refused naming numpy's pages.img", err)
	}
	for id, status := range statuses(res) {
		if status != Captured {
			t.Errorf("%s: %s, want captured (every set passed)", id, status)
		}
	}
	after, err := os.ReadFile(filepath.Join(out, manifest.FileName))
	if err != nil || string(after) != string(before) {
		t.Fatalf("the output that does not verify was swapped in (%v)", err)
	}
	if _, err := manifest.Verify(out, executorproto.Version); err != nil {
		t.Errorf("the previous output no longer verifies: %v", err)
	}
	staging, _ := filepath.Glob(out + ".staging-*")
	if len(staging) != 0 {
		t.Errorf("left %v", staging)
	}
}

// TestStagesStaleCorruptVerdict: the plan judges a store entry corrupt; before the carry-out
// removes it, another run (another pod sharing the store) replaces it with a good entry. The
// carry-out leaves that entry, and the output takes it.
func TestStagesStaleCorruptVerdict(t *testing.T) {
	e := stagesEnv(t)
	out := filepath.Join(t.TempDir(), "out")
	plan, _, err := fakeCapture(t, e, &fakeDriver{}, out, nil, nil)
	if err != nil {
		t.Fatal(err)
	}
	if err := os.RemoveAll(out); err != nil {
		t.Fatal(err)
	}
	key := plan.Sets[1].Key // numpy
	entry, err := e.Store.Path(key)
	if err != nil {
		t.Fatal(err)
	}
	pages := filepath.Join(entry, "pages.img")
	if err := os.WriteFile(pages, []byte("changed"), 0o600); err != nil {
		t.Fatal(err)
	}
	sel, err := e.Config.Select(nil, nil)
	if err != nil {
		t.Fatal(err)
	}
	d := &fakeDriver{}
	_, _, err = fakeCaptureWith(t, e, d, out, CaptureOptions{Selection: sel}, func(p *Plan) {
		if p.Sets[1].corrupt == nil {
			t.Fatalf("the plan did not judge the entry corrupt: %+v", p.Sets[1])
		}
		other := &store.Store{Dir: e.Store.Dir, Lease: testenv.NewLease(t)}
		_, verdict := other.Lookup(key)
		if removed, err := other.RemoveCorrupt(verdict); !removed || err != nil {
			t.Fatalf("the other run: Lookup %v, RemoveCorrupt %v, %v", verdict, removed, err)
		}
		pending, err := other.Begin(key)
		if err != nil {
			t.Fatal(err)
		}
		meta, err := (&fakeDriver{fingerprint: d.fingerprint, cpus: d.cpus}).Capture(context.Background(), config.PackageSet{ID: "theirs", Imports: []string{"numpy"}}, pending.Dir)
		if err != nil {
			t.Fatal(err)
		}
		if _, err := pending.Commit(meta); err != nil {
			t.Fatal(err)
		}
	})
	if err != nil {
		t.Fatal(err)
	}
	if data, _ := os.ReadFile(pages); !strings.Contains(string(data), "of theirs") {
		t.Errorf("the store entry holds %q: the other run's good entry was removed", data)
	}
	if data, _ := os.ReadFile(filepath.Join(out, "numpy", "pages.img")); !strings.Contains(string(data), "of theirs") {
		t.Errorf("the output holds %q, want the other run's entry", data)
	}
}

// TestStagesValuesMadeOncePerSet: a capture computes the spec fingerprint once for the run
// (the basis; the driver is given it) and writes no meta.json twice: the capture returns it
// unwritten, the store's entry gets it once (with the timings) and the output its own once.
// The writes are counted where the bytes are written (the store's and the carrier's writers),
// and every meta.json on disk afterwards must be a file one of them made.
func TestStagesValuesMadeOncePerSet(t *testing.T) {
	for _, tc := range []struct {
		name string
		only []string
	}{
		{"--only numpy", []string{"numpy"}},
		{"every set", nil},
	} {
		t.Run(tc.name, func(t *testing.T) {
			e := stagesEnv(t)
			out := filepath.Join(t.TempDir(), "out")
			_, res, err := fakeCapture(t, e, &fakeDriver{}, out, tc.only, nil)
			if err != nil {
				t.Fatal(err)
			}
			captured := 0
			for id, status := range statuses(res) {
				if status != Captured {
					t.Fatalf("%s: %s, want captured", id, status)
				}
				captured++
			}
			if captured == 0 {
				t.Fatal("nothing captured")
			}
			if n := e.tally.fingerprints.Load(); n != 1 {
				t.Errorf("%d spec fingerprints computed for %d captured sets, want 1 (the basis's)", n, captured)
			}
			e.tally.mu.Lock()
			defer e.tally.mu.Unlock()
			metaWrites := 0
			for path, n := range e.tally.writes {
				if filepath.Base(path) != manifest.MetaFileName {
					continue
				}
				metaWrites++
				if n != 1 {
					t.Errorf("%s written %d times, want once", path, n)
				}
			}
			// Each captured set's meta.json in its store entry and in the output, nothing else.
			if metaWrites != 2*captured {
				t.Errorf("%d meta.json files written for %d captured sets, want 2 each (store, output): %v", metaWrites, captured, e.tally.writes)
			}
			// Every meta.json there is now is a file one of those writes made: none was written
			// another way, nor again after.
			var found []string
			for _, root := range []string{e.Store.Dir, out} {
				paths, err := filepath.Glob(filepath.Join(root, "*", manifest.MetaFileName))
				if err != nil {
					t.Fatal(err)
				}
				found = append(found, paths...)
			}
			if len(found) != metaWrites {
				t.Errorf("%d meta.json files in the store and the output, %d written through the counted writers: %q", len(found), metaWrites, found)
			}
			for _, path := range found {
				id, err := fileIDOf(path)
				if err != nil {
					t.Fatal(err)
				}
				if _, ok := e.tally.made[id]; !ok {
					t.Errorf("%s is not a file the counted writes made", path)
				}
			}
			if _, err := manifest.Verify(out, executorproto.Version); err != nil {
				t.Errorf("the output does not verify: %v", err)
			}
		})
	}
}

// TestSandboxesFingerprintOnce: the sandboxes of a capture compute their restore spec's
// fingerprint once, for the basis and for the analysis cache's lookup (Offline is the same
// shape when the config's network is none already); with a network, the offline shape is
// another spec, with a fingerprint of its own.
func TestSandboxesFingerprintOnce(t *testing.T) {
	e := stagesEnv(t)
	sb := e.Sandboxes(e.Rootfs)
	if sb.Runtime.Flags.Network != "none" {
		t.Fatalf("the default flags have network %q, want none", sb.Runtime.Flags.Network)
	}
	b, err := newBasis(e.Env, sb, manifest.CPU{Features: []string{"sse2"}, CacheLine: 64}, false)
	if err != nil {
		t.Fatal(err)
	}
	offline, err := sb.Offline().SpecFingerprint()
	if err != nil || offline != b.Fingerprint {
		t.Fatalf("offline fingerprint %s (%v), want the basis's %s", offline, err, b.Fingerprint)
	}
	if n := e.tally.fingerprints.Load(); n != 1 {
		t.Errorf("%d fingerprints computed, want 1", n)
	}
	flags := sb.Runtime.Flags
	flags.Network = "sandbox"
	networked := &Sandboxes{Config: e.Config, Runtime: runtimeWithFlags(e.Runtime, flags), Rootfs: e.Rootfs, tally: e.tally}
	withNetwork, err := networked.SpecFingerprint()
	if err != nil {
		t.Fatal(err)
	}
	offline, err = networked.Offline().SpecFingerprint()
	if err != nil || offline == withNetwork || offline != b.Fingerprint {
		t.Errorf("offline fingerprint %s (%v) of a networked shape %s, want the network-less %s", offline, err, withNetwork, b.Fingerprint)
	}
	if n := e.tally.fingerprints.Load(); n != 3 {
		t.Errorf("%d fingerprints computed, want 3 (one per shape)", n)
	}
}

// TestVerifiedOutputFingerprintOnce: a run over an existing output (a measure through a
// substitute driver) computes the restore spec's fingerprint once, to check it against the
// manifest's; the Sandboxes it runs on answer later asks (SpecFingerprint, Offline: what an
// analysis on them asks) from that one, and count into the run's tally, so that one computed
// again would show.
func TestVerifiedOutputFingerprintOnce(t *testing.T) {
	t.Setenv("TMPDIR", t.TempDir()) // the sweep's and the scratch directory's
	e := stagesEnv(t)
	info, err := json.Marshal(manifest.RootfsInfo{Digest: e.Rootfs.Digest})
	if err != nil {
		t.Fatal(err)
	}
	record := filepath.Join(e.Rootfs.Path, manifest.RootfsInfoFile)
	if err := os.MkdirAll(filepath.Dir(record), 0o755); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(record, info, 0o644); err != nil {
		t.Fatal(err)
	}
	out := filepath.Join(t.TempDir(), "out")
	if _, _, err := fakeCapture(t, e, &fakeDriver{}, out, nil, nil); err != nil {
		t.Fatal(err)
	}
	// What WithVerifiedOutput's sweep needs of runsc: a list of no sandboxes.
	runsc, _ := testenv.FakeRunsc(t, "[]")
	e.Runtime = &launch.Runtime{Path: runsc, Root: t.TempDir(), Flags: e.Runtime.Flags, Lease: e.lease}
	e.sweep = sweeper{runtime: e.Runtime, lease: e.lease, store: e.Store, log: e.Log}
	e.tally.fingerprints.Store(0) // the capture's are counted by TestStagesValuesMadeOncePerSet

	d := &fakeDriver{}
	m, err := e.WithVerifiedOutput(context.Background(), out, []string{"numpy"}, func(x *VerifiedOutput) error {
		for _, sb := range []*Sandboxes{x.Sandboxes, x.Sandboxes.Offline()} {
			fingerprint, err := sb.SpecFingerprint()
			if err != nil || fingerprint != x.Manifest.SpecFingerprint {
				t.Errorf("the sandboxes' fingerprint %s (%v), want the manifest's %s", fingerprint, err, x.Manifest.SpecFingerprint)
			}
		}
		if x.Sandboxes.tally != e.tally {
			t.Errorf("the sandboxes of the output count into no tally or another: a fingerprint computed again would not show")
		}
		return remeasure(context.Background(), d, x, e.Config.RestoreRuns, e.Log)
	})
	if err != nil {
		t.Fatal(err)
	}
	if _, measured, _ := d.calls(); !slices.Equal(measured, []string{"numpy"}) || len(m.Checkpoints[1].RestoreMS.Runs) != e.Config.RestoreRuns {
		t.Errorf("measured %v; numpy's timings %v", measured, m.Checkpoints[1].RestoreMS.Runs)
	}
	if n := e.tally.fingerprints.Load(); n != 1 {
		t.Errorf("%d spec fingerprints computed over an existing output, want 1 (the check against the manifest)", n)
	}
}
