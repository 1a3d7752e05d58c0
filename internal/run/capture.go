package run

import (
	"context"
	"errors"
	"fmt"
	"maps"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"time"

	"github.com/sirupsen/logrus"

	"readie.dev/pipeline/internal/cpubaseline"
	"readie.dev/pipeline/internal/store"
	"readie.dev/pipeline/pkg/capture"
	"readie.dev/pipeline/pkg/catalogue"
	"readie.dev/pipeline/pkg/executorproto"
	"readie.dev/pipeline/pkg/manifest"
	"readie.dev/pipeline/pkg/measure"
	"readie.dev/pipeline/pkg/sandbox"
)

// begin takes the output's lock and cleans up after runs that are over: their sandboxes,
// scratch directories, pending store entries and the lease files they left in those shared
// directories (judged by lease, in any pid namespace), and their staging directories.
func (e *Env) begin(ctx context.Context, out string) (*Lock, error) {
	if err := os.MkdirAll(e.Runtime.Root, 0o700); err != nil {
		return nil, fmt.Errorf("%w: runsc root: %w", ErrSetup, err)
	}
	lock, err := LockOutput(out)
	if err != nil {
		return nil, err
	}
	if lock.Stale != 0 {
		e.Log.WithField("pid", lock.Stale).Warn("took over the lock of a run that died")
	}
	if err := e.sweepShared(ctx); err != nil {
		lock.Unlock()
		return nil, err
	}
	did, err := sweepOutput(out)
	for _, line := range did {
		e.Log.Warn(line)
	}
	if err != nil {
		lock.Unlock()
		return nil, err
	}
	return lock, nil
}

// sweepShared removes what runs that are over left in the directories runs share, and logs
// each removal. A sandbox that cannot be deleted fails the run; a scratch or store directory
// that cannot be removed is logged and left for the next run.
func (e *Env) sweepShared(ctx context.Context) error {
	orphans, err := e.Runtime.RemoveOrphans(ctx)
	for _, o := range orphans {
		log := e.Log.WithFields(logrus.Fields{"sandbox": o.ID, "run": o.Run})
		if o.Note != "" {
			log = log.WithField("note", o.Note)
		}
		log.Warn("removed a sandbox left by a run that died")
	}
	if err != nil {
		return err
	}
	// Only now: an orphan's bind mount may have pointed into its scratch directory.
	tmp := os.TempDir()
	dirs, err := removeDeadWorkDirs(tmp, e.lease)
	for _, dir := range dirs {
		e.Log.WithField("dir", dir).Warn("removed the scratch directory of a run that died")
	}
	if err != nil {
		e.Log.WithError(err).Warn("could not remove every scratch directory of runs that died")
	}
	st := e.Store()
	dirs, err = st.RemoveDeadPending()
	for _, dir := range dirs {
		e.Log.WithField("dir", dir).Warn("removed a store entry that a run which died was writing")
	}
	if err != nil {
		e.Log.WithError(err).Warn("could not remove every store entry that runs which died were writing")
	}
	for _, dir := range []string{e.Runtime.Root, tmp, st.Dir} {
		runs, err := e.lease.RemoveDeadLocks(dir)
		for _, run := range runs {
			e.Log.WithFields(logrus.Fields{"dir": dir, "run": run}).Debug("removed the lease lock file of a run that died")
		}
		if err != nil {
			e.Log.WithError(err).Warn("could not remove every lease lock file of runs that died")
		}
	}
	return nil
}

// Status is how one set of a capture ended.
type Status string

const (
	Captured Status = "captured"
	Reused   Status = "reused"
	Kept     Status = "kept"
	Failed   Status = "failed"
	// Interrupted is a set the run was working on, or had not reached, when it was stopped.
	Interrupted Status = "interrupted"
)

// SetResult is one set of a capture: its checkpoint (as the manifest has it) and how it ended.
type SetResult struct {
	Checkpoint manifest.Checkpoint
	Status     Status
	Err        error
	// Timings says when the timings it kept were measured under other settings (SetPlan).
	Timings string
}

// Result is what a capture did, set by set; Manifest and Catalogue are nil when a set failed.
type Result struct {
	Manifest  *manifest.Manifest
	Catalogue *catalogue.Catalogue
	Sets      []SetResult
}

// Capture carries out the plan of a capture into out: each selected set is reused from the
// output or the store when its key is there (and smoke-tested again), or captured, measured
// and smoke-tested and put into the store; sets not selected are kept while their key
// matches. It all goes into a staging directory beside out, which replaces out only when every
// set passed. A failed set does not stop the others; the run then fails naming them, leaves
// out as it was, and keeps the staging directory for inspection (or removes it).
func (e *Env) Capture(ctx context.Context, out string, o CaptureOptions) (*Result, error) {
	if err := checkOutput(out); err != nil {
		return nil, err
	}
	if err := e.PrepareRootfs(ctx); err != nil {
		return nil, err
	}
	lock, err := e.begin(ctx, out)
	if err != nil {
		return nil, err
	}
	defer lock.Unlock()
	start := time.Now()
	plan, err := e.Plan(ctx, out, o)
	if err != nil {
		return nil, err
	}
	e.Log.WithField("took", time.Since(start).Round(time.Millisecond)).Debug("plan: done")
	for _, d := range plan.Dropped {
		e.Log.WithFields(logrus.Fields{"set": d.ID, "reason": d.Reason}).Warn("dropped from the output")
	}
	plan.Log(e.Log)
	version, err := e.Runtime.Version(ctx)
	if err != nil {
		return nil, err
	}
	m, err := e.newManifest(version, plan.cpu)
	if err != nil {
		return nil, err
	}
	work, cleanup, err := e.workDir()
	if err != nil {
		return nil, err
	}
	defer cleanup()
	// Made last, so that every failure from here on can name it or remove it.
	staging, err := newStaging(out)
	if err != nil {
		return nil, err
	}
	res, err := e.carryOut(ctx, plan, m, staging, work, version, o)
	if err != nil {
		if e.CleanFailed {
			os.RemoveAll(staging)
			return res, fmt.Errorf("%w\n(%s left as it was; staging directory removed)", err, out)
		}
		kept := keepStaging(out, staging)
		return res, fmt.Errorf("%w\n(%s left as it was; staging directory kept for inspection: %s)", err, out, kept)
	}
	if err := replaceDir(out, staging); err != nil {
		return res, err
	}
	res.Manifest = m
	return res, nil
}

// setWork is one set's way through a capture's phases.
type setWork struct {
	sp      SetPlan
	c       manifest.Checkpoint
	status  Status
	err     error
	meta    *manifest.Meta // the checkpoint's meta.json as the store or the output has it
	pending *store.Pending // a capture not yet in the store
	images  string         // where its image files are now
	measure bool           // its restores are to be timed
	done    bool           // in staging with its meta.json: nothing of it is left to do
}

// carryOut carries out the plan in three phases: captures and smoke tests, Config.Jobs sets
// at a time; then the timed restores, one at a time with no other sandbox of the run alive,
// so restore_ms means the same whatever --jobs is; then the new checkpoints go into the store
// and every set into staging.
func (e *Env) carryOut(ctx context.Context, plan *Plan, m *manifest.Manifest, staging, work, version string, o CaptureOptions) (*Result, error) {
	works := make([]*setWork, len(plan.Sets))
	for i, sp := range plan.Sets {
		works[i] = &setWork{sp: sp, c: manifest.Checkpoint{ID: sp.ID, Imports: slices.Clone(sp.Imports), Dir: sp.ID, Key: sp.Key, KeyParts: sp.KeyParts}}
	}
	defer func() {
		for _, w := range works {
			if w.pending != nil {
				w.pending.Abort()
			}
		}
	}()
	e.inParallel(ctx, works, func(w *setWork) error { return e.prepare(ctx, plan, w, staging, work, version, o) })
	for _, w := range works {
		if w.err != nil || !w.measure || ctx.Err() != nil {
			continue
		}
		start := time.Now()
		stats, err := e.Restorer(work).MeasureRuns(ctx, w.sp.ID, w.images, e.Config.RestoreRuns)
		if err != nil {
			e.fail(w, err)
			continue
		}
		w.c.RestoreMS, w.c.MeasuredWith = stats, e.measuredWith()
		e.Log.WithFields(logrus.Fields{"set": w.sp.ID, "median_ms": round1(stats.Median), "p90_ms": round1(stats.P90), "runs": e.Config.RestoreRuns, "took": time.Since(start).Round(time.Millisecond)}).Info("measure: done")
	}
	for _, w := range works {
		if w.err == nil && ctx.Err() == nil {
			if err := e.finish(w, staging); err != nil {
				e.fail(w, err)
			}
		}
	}
	res := &Result{}
	var failed []string
	var errs []error
	for _, w := range works {
		if ctx.Err() != nil && !w.done && (w.err == nil || errors.Is(w.err, context.Cause(ctx)) || errors.Is(w.err, ctx.Err())) {
			// Stopped before it was done (or before it began): it neither passed nor failed.
			res.Sets = append(res.Sets, SetResult{Checkpoint: w.c, Status: Interrupted})
			continue
		}
		res.Sets = append(res.Sets, SetResult{Checkpoint: w.c, Status: w.status, Err: w.err, Timings: w.sp.Timings})
		if w.err != nil {
			failed, errs = append(failed, w.sp.ID), append(errs, w.err)
			if err := keepFailedSet(w, staging, work); err != nil {
				e.Log.WithField("set", w.sp.ID).WithError(err).Warn("could not keep the failed set's files for inspection")
			}
			continue
		}
		e.Log.WithFields(logrus.Fields{"set": w.sp.ID, "status": w.status}).Info(string(w.status))
		m.Checkpoints = append(m.Checkpoints, w.c)
	}
	if ctx.Err() != nil {
		return res, context.Cause(ctx)
	}
	if len(failed) > 0 {
		return res, fmt.Errorf("%w: %s\n%w", errFailedSets, strings.Join(failed, ", "), errors.Join(errs...))
	}
	if m.CPU.Baseline != nil {
		enforced := !slices.ContainsFunc(m.Checkpoints, func(c manifest.Checkpoint) bool {
			return c.CPUCheck == nil || c.CPUCheck.Verdict != manifest.CPUEnforced
		})
		m.CPU.Enforced = &enforced
	}
	m.AlphaMsPerMiB, m.InterceptMs = costModel(m.Checkpoints)
	if err := e.writeRestoreSpec(filepath.Join(staging, manifest.RestoreSpecFileName)); err != nil {
		return res, fmt.Errorf("write restore spec: %w", err)
	}
	if err := writeOutputJSON(filepath.Join(staging, manifest.FileName), m); err != nil {
		return res, fmt.Errorf("write manifest: %w", err)
	}
	in := e.catalogueInputs(plan.Out, m, o)
	c, err := writeCatalogue(staging, m, in)
	if err != nil {
		return res, err
	}
	res.Catalogue = c
	e.Log.WithFields(logrus.Fields{"modules": len(in.Modules), "from": in.From}).Debug("catalogue: written")
	return res, nil
}

func (e *Env) fail(w *setWork, err error) {
	w.status, w.err = Failed, err
	e.Log.WithField("set", w.sp.ID).WithError(err).Error("failed")
}

// inParallel runs f on every set, Config.Jobs at a time, in plan order; a set whose f fails
// is marked failed and the others go on. Once ctx ends no set starts.
func (e *Env) inParallel(ctx context.Context, works []*setWork, f func(*setWork) error) {
	slots := make(chan struct{}, max(e.Config.Jobs, 1))
	var wg sync.WaitGroup
	for _, w := range works {
		select {
		case slots <- struct{}{}:
		case <-ctx.Done():
		}
		if ctx.Err() != nil {
			break
		}
		wg.Go(func() {
			defer func() { <-slots }()
			if err := f(w); err != nil {
				e.fail(w, err)
			}
		})
	}
	wg.Wait()
}

// prepare is a set's first phase: a capture into a pending store entry and its smoke test, or
// the files of a reused or kept checkpoint put into staging and a reused one's smoke test.
func (e *Env) prepare(ctx context.Context, plan *Plan, w *setWork, staging, work, version string, o CaptureOptions) error {
	sp := w.sp
	log := e.Log.WithField("set", sp.ID)
	st := e.Store()
	if sp.Action == Capture {
		w.status = Captured
		if first := plan.unenforceable.Load(); first != nil {
			return fmt.Errorf("%w: %s: not captured: %w (see %s)", ErrSetup, sp.ID, cpubaseline.ErrUnenforceable, *first)
		}
		if sp.unreadable != nil {
			return fmt.Errorf("%s: %w", sp.ID, sp.unreadable)
		}
		if sp.corrupt != nil {
			log.WithError(sp.corrupt).Warn("removed a corrupt store entry; capturing again")
			if err := st.Remove(sp.Key); err != nil {
				return err
			}
		}
		pending, err := st.Begin(sp.Key)
		if err != nil {
			return err
		}
		w.pending, w.images, w.measure = pending, pending.Dir, true
		start := time.Now()
		log.WithField("imports", strings.Join(sp.Imports, ",")).Info("capture: start")
		if w.meta, err = capture.Run(ctx, e.Runtime, e.CaptureRequest(sp.Set, pending.Dir, work, version, e.Config.Runsc.CheckpointOptions)); err != nil {
			return err
		}
		log.WithFields(logrus.Fields{"bytes": w.meta.Bytes(), "took": time.Since(start).Round(time.Millisecond)}).Info("capture: done")
		if err := e.judgeCPU(plan, w); err != nil {
			return err
		}
		return e.smoke(ctx, w, work)
	}

	w.status = Kept
	if sp.Action == Reuse {
		w.status = Reused
	}
	var src string
	var stats *manifest.Stats
	if sp.From == FromOutput {
		src = filepath.Join(plan.Out, sp.existing.Dir)
		meta, err := manifest.LoadMeta(filepath.Join(src, manifest.MetaFileName))
		if err != nil {
			return err
		}
		w.meta, stats, w.c.Smoke = meta, &sp.existing.RestoreMS, sp.existing.Smoke
		w.c.MeasuredWith = sp.existing.MeasuredWith
	} else {
		var err error
		if src, err = st.Path(sp.Key); err != nil {
			return err
		}
		w.meta, stats = sp.stored, sp.stored.RestoreMS
		w.c.MeasuredWith = sp.stored.MeasuredWith
	}
	w.c.Bytes, w.c.CapturedAt = w.meta.Bytes(), w.meta.CapturedAt
	w.images = filepath.Join(staging, sp.ID)
	if err := store.LinkFiles(src, w.images); err != nil {
		return fmt.Errorf("%s: take the checkpoint from the %s: %w", sp.ID, sp.From, err)
	}
	if sp.From == FromOutput {
		e.keepInStore(sp, src, w.meta) // so other outputs find it too
	}
	if stats != nil {
		w.c.RestoreMS = *stats
	}
	if err := e.judgeCPU(plan, w); err != nil {
		return err
	}
	if sp.Action == Keep {
		return nil
	}
	w.measure = stats == nil || o.Remeasure
	return e.smoke(ctx, w, work)
}

// judgeCPU refuses, with a CPU baseline, a checkpoint whose capture saw features outside it
// that the config does not accept (exit 2: the config asks for what this host cannot do).
func (e *Env) judgeCPU(plan *Plan, w *setWork) error {
	b := e.Config.CPUBaseline
	if b == nil {
		return nil
	}
	if err := cpubaseline.Judge(w.meta.CPUCheck, b.Enforced(), cpubaseline.Host{CPUIDFaulting: plan.faulting}); err != nil {
		if errors.Is(err, cpubaseline.ErrUnenforceable) {
			plan.unenforceable.CompareAndSwap(nil, &w.sp.ID)
		}
		return fmt.Errorf("%w: %s: %w", ErrSetup, w.sp.ID, err)
	}
	if w.meta.CPUCheck.Verdict != manifest.CPUEnforced {
		e.Log.WithFields(logrus.Fields{"set": w.sp.ID, "verdict": w.meta.CPUCheck.Verdict, "cpuid": strings.Join(w.meta.CPUCheck.Outside["cpuid"], ",")}).Warn("cpu baseline not enforced (enforce: false): only the library controls keep it")
	}
	return nil
}

func (e *Env) smoke(ctx context.Context, w *setWork, work string) error {
	smoke, err := e.Smoker(work).Smoke(ctx, w.sp.ID, w.images, w.sp.Imports)
	w.c.Smoke = smoke
	if err != nil {
		return err
	}
	fields := logrus.Fields{"set": w.sp.ID, "ready_ms": round1(smoke.ReadyMS)}
	if w.sp.From != "" {
		fields["from"] = w.sp.From
	}
	e.Log.WithFields(fields).Info("smoke: ok")
	return nil
}

// finish is a set's last phase: a new checkpoint goes into the store (with its timings) and
// from there into staging; every set gets its meta.json and its use recorded.
func (e *Env) finish(w *setWork, staging string) error {
	st := e.Store()
	dir := filepath.Join(staging, w.sp.ID)
	if w.pending != nil {
		w.meta.KeyParts, w.meta.RestoreMS, w.meta.MeasuredWith = w.sp.KeyParts, &w.c.RestoreMS, w.c.MeasuredWith
		stored, err := w.pending.Commit(w.meta)
		if err != nil {
			return fmt.Errorf("%s: put the checkpoint into the store: %w", w.sp.ID, err)
		}
		w.pending, w.meta = nil, stored
		entry, err := st.Path(w.sp.Key)
		if err != nil {
			return err
		}
		if err := store.LinkFiles(entry, dir); err != nil {
			return err
		}
	}
	if err := e.writeMeta(dir, w.sp, w.meta); err != nil {
		return err
	}
	if err := st.Use(w.sp.Key, w.sp.ID); err != nil {
		e.Log.WithField("set", w.sp.ID).WithError(err).Warn("could not record the store entry's use")
	}
	w.c.Bytes, w.c.CapturedAt, w.c.CPUCheck = w.meta.Bytes(), w.meta.CapturedAt, w.meta.CPUCheck
	w.done = true
	return nil
}

// writeMeta writes the output's own meta.json for a set: the stored one, under the set's id.
func (e *Env) writeMeta(dir string, sp SetPlan, stored *manifest.Meta) error {
	meta := *stored
	meta.ID, meta.Imports = sp.ID, slices.Clone(sp.Imports)
	meta.Key, meta.KeyParts = sp.Key, sp.KeyParts
	meta.RestoreMS, meta.MeasuredWith = nil, nil
	return writeOutputJSON(filepath.Join(dir, manifest.MetaFileName), &meta)
}

// keepInStore puts a checkpoint reused from the output into the store when the store lacks
// it; a failure only costs a later capture, so it is logged, not fatal.
func (e *Env) keepInStore(sp SetPlan, src string, meta *manifest.Meta) {
	st := e.Store()
	if found, err := st.Lookup(sp.Key); found != nil || err != nil {
		return
	}
	pending, err := st.Begin(sp.Key)
	if err == nil {
		err = store.LinkFiles(src, pending.Dir)
		if err == nil {
			stored := *meta
			stored.KeyParts, stored.RestoreMS, stored.MeasuredWith = sp.KeyParts, &sp.existing.RestoreMS, sp.existing.MeasuredWith
			_, err = pending.Commit(&stored)
		}
		if err != nil {
			pending.Abort()
		}
	}
	if err != nil {
		e.Log.WithField("set", sp.ID).WithError(err).Warn("could not add the output's checkpoint to the store")
	}
}

// costModel is the manifest's cost model: restore median against image size.
func costModel(cs []manifest.Checkpoint) (alphaMsPerMiB, interceptMs float64) {
	var sizes []int64
	var medians []float64
	for _, c := range cs {
		sizes = append(sizes, c.Bytes)
		medians = append(medians, c.RestoreMS.Median)
	}
	fit := measure.CostModel(sizes, medians)
	return fit.Slope, fit.Intercept
}

// measuredWith are the settings this run times restores with.
func (e *Env) measuredWith() *manifest.Measured {
	return &manifest.Measured{Runs: e.Config.RestoreRuns, RestoreFlags: append([]string{}, e.RestoreFlags...)}
}

func round1(ms float64) float64 { return float64(int64(ms*10+0.5)) / 10 }

func (e *Env) newManifest(version string, need manifest.CPU) (*manifest.Manifest, error) {
	spec, err := e.restoreSpec()
	if err != nil {
		return nil, err
	}
	fingerprint, err := sandbox.Fingerprint(spec, e.Runtime.Flags)
	if err != nil {
		return nil, err
	}
	module, moduleVersion, err := e.Runtime.Module()
	if err != nil {
		return nil, err
	}
	options := map[string]string{} // {} rather than null
	maps.Copy(options, e.Config.Runsc.CheckpointOptions)
	return &manifest.Manifest{
		ExecutorProtocol:  executorproto.Version,
		Runsc:             manifest.Runsc{Version: version, Module: module + "@" + moduleVersion, SHA256: e.RunscSHA256},
		RunscFlags:        e.Runtime.Flags.Args(),
		RestoreFlags:      slices.Clone(e.RestoreFlags),
		CheckpointOptions: options,
		SpecFingerprint:   fingerprint,
		ExecutorArgv:      sandbox.ExecutorArgs(),
		PythonPath:        sandbox.PythonPath,
		Overlay:           e.Runtime.Flags.Overlay,
		Network:           e.Runtime.Flags.Network,
		RootReadonly:      spec.Root.Readonly,
		Rootfs:            e.Rootfs,
		Image:             e.Image,
		CPU:               &need,
		CreatedAt:         time.Now().UTC(),
		Spec:              manifest.RestoreSpecFileName,
		Checkpoints:       []manifest.Checkpoint{},
	}, nil
}

func (e *Env) writeRestoreSpec(path string) error {
	spec, err := e.restoreSpec()
	if err != nil {
		return err
	}
	return writeOutputJSON(path, spec)
}

// replaceDir puts staging in place of out: the old output is moved aside first and removed
// only after the new one is in place, so some complete output always exists; then what other
// commands keep in the output (carriedOver: the benchmark history, analyze's and plan-sets'
// results) moves over from the old one. A run killed in between leaves OUT.old-ID, which the
// next run puts back when OUT is missing, or takes those entries from (sweepOutput).
func replaceDir(out, staging string) error {
	old := ""
	if _, err := os.Stat(out); err == nil {
		old = besideOutput(out, oldInfix)
		if err := os.Rename(out, old); err != nil {
			return fmt.Errorf("move the previous output aside: %w", err)
		}
	}
	if err := os.Rename(staging, out); err != nil {
		if old != "" {
			os.Rename(old, out)
		}
		return fmt.Errorf("put the new output in place: %w (it is in %s)", err, staging)
	}
	if old == "" {
		return nil
	}
	if err := carryOver(old, out); err != nil {
		return fmt.Errorf("keep %s's history: %w (it is in %s)", out, err, old)
	}
	return os.RemoveAll(old)
}
