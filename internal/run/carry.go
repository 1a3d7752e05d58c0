package run

import (
	"context"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"sync/atomic"
	"time"

	"github.com/sirupsen/logrus"

	"readie.dev/pipeline/internal/config"
	"readie.dev/pipeline/internal/cpubaseline"
	"readie.dev/pipeline/internal/parallel"
	"readie.dev/pipeline/internal/progress"
	"readie.dev/pipeline/internal/store"
	"readie.dev/pipeline/pkg/manifest"
)

// carrier carries out a plan into a staging directory: each set reused (from the output or the
// store) or captured through driver, smoke-tested and timed, new checkpoints put into the
// store, every set into staging. A failed set does not stop the others.
type carrier struct {
	plan    *Plan
	basis   *Basis
	driver  Driver
	store   *store.Store
	staging string
	// work is the run's scratch directory, where a failed set's sandbox logs are, in bundles
	// whose names begin with bundlePrefix of the set and step (launch.Runtime.IDPrefix).
	work         string
	bundlePrefix func(setID, step string) (string, error)
	// jobs is how many sets are captured and smoke-tested at a time (config jobs).
	jobs int
	// restoreRuns is how many restores a set's timing takes (config restore_runs).
	restoreRuns int
	// remeasure times the restores of reused checkpoints again (--remeasure).
	remeasure bool
	baseline  *config.CPUBaseline
	log       logrus.FieldLogger
	// progress says which sets are done as they go (nil: nothing).
	progress *progress.Meter
	// unenforceable is the first capture's refusal that holds for every set on this host (the
	// CPUID instruction shows features beyond the baseline): the sets not yet captured are not.
	unenforceable atomic.Pointer[string] // the set whose capture showed it
	// writeJSON writes the output's meta.json and a failed set's kept one atomically
	// (outdir.WriteJSON; a unit test counts the writes through it).
	writeJSON func(path string, v any) error
}

// setWork is one set's way through the carry-out's phases.
type setWork struct {
	sp      SetPlan
	c       manifest.Checkpoint
	status  Status
	err     error
	meta    *manifest.Meta // the checkpoint's meta.json as the store or the output has it
	pending *store.Pending // a capture not yet in the store
	// imageDir is where its image files are now; timeRestores says they are to be timed.
	imageDir     string
	timeRestores bool
	done         bool // in staging with its meta.json: nothing of it is left to do
}

// carryOut carries out the plan in three phases: captures and smoke tests, jobs sets at a
// time; then the timed restores, one at a time with no other sandbox of the run alive, so
// restore_ms means the same whatever --jobs is; then the new checkpoints go into the store and
// every set into staging. The checkpoints of the sets that passed are appended to m; a failed
// set's files are kept in staging for inspection.
func (c *carrier) carryOut(ctx context.Context, m *manifest.Manifest) (*Result, error) {
	works := make([]*setWork, len(c.plan.Sets))
	for i, sp := range c.plan.Sets {
		works[i] = &setWork{sp: sp, c: manifest.Checkpoint{ID: sp.ID, Imports: slices.Clone(sp.Imports), Dir: sp.ID, Key: sp.Key, KeyParts: sp.KeyParts}}
	}
	defer func() {
		for _, w := range works {
			if w.pending != nil {
				w.pending.Abort()
			}
		}
	}()
	// Captures and smoke tests, jobs sets at a time in plan order; a set that fails is marked
	// failed and the others go on. Once ctx ends no set starts.
	var prepared atomic.Int64
	parallel.Each(ctx, c.jobs, works, func(w *setWork) {
		if err := c.prepare(ctx, w); err != nil {
			c.fail(w, err)
		}
		c.progress.Step("capture", int(prepared.Add(1)), len(works), "sets", w.sp.ID+" "+string(w.status))
	})
	timed := 0
	for _, w := range works {
		if w.err == nil && w.timeRestores {
			timed++
		}
	}
	measured := 0
	for _, w := range works {
		if w.err == nil && w.timeRestores && ctx.Err() == nil {
			c.measure(ctx, w)
			measured++
			c.progress.Step("measure", measured, timed, "sets", w.sp.ID)
		}
	}
	c.progress.Done()
	for _, w := range works {
		if w.err == nil && ctx.Err() == nil {
			if err := c.finish(w); err != nil {
				c.fail(w, err)
			}
		}
	}
	return c.results(ctx, works, m)
}

// results returns how each set ended; the checkpoints of those that passed go into m. It fails
// naming the failed sets, or with ctx's cause when the run was stopped.
func (c *carrier) results(ctx context.Context, works []*setWork, m *manifest.Manifest) (*Result, error) {
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
			if err := keepFailedSet(w, c.staging, c.work, c.bundlePrefix, c.writeJSON); err != nil {
				c.log.WithField("set", w.sp.ID).WithError(err).Warn("could not keep the failed set's files for inspection")
			}
			continue
		}
		c.log.WithFields(logrus.Fields{"set": w.sp.ID, "status": w.status}).Info(string(w.status))
		m.Checkpoints = append(m.Checkpoints, w.c)
	}
	if ctx.Err() != nil {
		return res, context.Cause(ctx)
	}
	if len(failed) > 0 {
		return res, fmt.Errorf("%w: %s\n%w", errFailedSets, strings.Join(failed, ", "), errors.Join(errs...))
	}
	return res, nil
}

func (c *carrier) fail(w *setWork, err error) {
	w.status, w.err = Failed, err
	c.log.WithField("set", w.sp.ID).WithError(err).Error("failed")
}

// prepare does a set's first phase: a capture, or a reused or kept checkpoint taken over.
func (c *carrier) prepare(ctx context.Context, w *setWork) error {
	if w.sp.Action == Capture {
		return c.capture(ctx, w)
	}
	return c.takeOver(ctx, w)
}

// capture captures a set into a pending store entry, judges its CPU check and smoke-tests it.
func (c *carrier) capture(ctx context.Context, w *setWork) error {
	sp := w.sp
	log := c.log.WithField("set", sp.ID)
	w.status = Captured
	if first := c.unenforceable.Load(); first != nil {
		return fmt.Errorf("%w: %s: not captured: %w (see %s)", ErrSetup, sp.ID, cpubaseline.ErrUnenforceable, *first)
	}
	if sp.unreadable != nil {
		return fmt.Errorf("%s: %w", sp.ID, sp.unreadable)
	}
	if sp.corrupt != nil {
		removed, err := c.store.RemoveCorrupt(sp.corrupt)
		if err != nil {
			return err
		}
		if removed {
			log.WithError(sp.corrupt).Warn("removed a corrupt store entry; capturing again")
		} else {
			log.WithError(sp.corrupt).Warn("the store entry judged corrupt was replaced by another run since: left to it; capturing again")
		}
	}
	pending, err := c.store.Begin(sp.Key)
	if err != nil {
		return err
	}
	w.pending, w.imageDir, w.timeRestores = pending, pending.Dir, true
	start := time.Now()
	log.WithField("imports", strings.Join(sp.Imports, ",")).Info("capture: start")
	if w.meta, err = c.driver.Capture(ctx, sp.Set, pending.Dir); err != nil {
		return err
	}
	log.WithFields(logrus.Fields{"bytes": w.meta.Bytes(), "took": time.Since(start).Round(time.Millisecond)}).Info("capture: done")
	for _, module := range w.meta.UnmappedModules {
		log.WithField("module", module).Warnf("module %s: no distribution's metadata names it; its version is unknown", module)
	}
	if err := c.judgeCPU(w); err != nil {
		return err
	}
	return c.smoke(ctx, w)
}

// takeOver links a reused or kept checkpoint's files from the output or the store into
// staging with the timings it has, and smoke-tests a reused one.
func (c *carrier) takeOver(ctx context.Context, w *setWork) error {
	sp := w.sp
	w.status = Kept
	if sp.Action == Reuse {
		w.status = Reused
	}
	var src string
	var stats *manifest.Stats
	if sp.From == FromOutput {
		src = filepath.Join(c.plan.Out, sp.existing.Dir)
		meta, err := manifest.LoadMeta(filepath.Join(src, manifest.MetaFileName))
		if err != nil {
			return err
		}
		w.meta, stats, w.c.Smoke = meta, &sp.existing.RestoreMS, sp.existing.Smoke
		w.c.MeasuredWith = sp.existing.MeasuredWith
	} else {
		var err error
		if src, err = c.store.Path(sp.Key); err != nil {
			return err
		}
		w.meta, stats = sp.stored, sp.stored.RestoreMS
		w.c.MeasuredWith = sp.stored.MeasuredWith
	}
	w.c.Bytes, w.c.CapturedAt = w.meta.Bytes(), w.meta.CapturedAt
	w.imageDir = filepath.Join(c.staging, sp.ID)
	if err := store.LinkFiles(src, w.imageDir); err != nil {
		return fmt.Errorf("%s: take the checkpoint from the %s: %w", sp.ID, sp.From, err)
	}
	if sp.Action == Keep {
		// Not selected, so the plan did not look at its files: the run refuses rather than
		// recaptures a set it was told to leave alone.
		if err := store.VerifyFiles(w.imageDir, w.meta); err != nil {
			return fmt.Errorf("%s: kept from the output, but its files do not match its meta.json (capture it again: pipeline capture --only %s): %w", sp.ID, sp.ID, err)
		}
	}
	if stats != nil {
		w.c.RestoreMS = *stats
	}
	if err := c.judgeCPU(w); err != nil {
		return err
	}
	if sp.Action == Keep {
		return nil
	}
	w.timeRestores = stats == nil || c.remeasure
	return c.smoke(ctx, w)
}

// judgeCPU refuses, with a CPU baseline, a checkpoint whose capture saw features outside it
// that the config does not accept (exit 2: the config asks for what this host cannot do).
func (c *carrier) judgeCPU(w *setWork) error {
	if c.baseline == nil {
		return nil
	}
	if err := cpubaseline.Judge(w.meta.CPUCheck, c.baseline.Enforced(), cpubaseline.BuildHost{CPUIDFaulting: c.basis.CPUIDFaulting}); err != nil {
		if errors.Is(err, cpubaseline.ErrUnenforceable) {
			c.unenforceable.CompareAndSwap(nil, &w.sp.ID)
		}
		return fmt.Errorf("%w: %s: %w", ErrSetup, w.sp.ID, err)
	}
	if w.meta.CPUCheck.Verdict != manifest.CPUEnforced {
		c.log.WithFields(logrus.Fields{"set": w.sp.ID, "verdict": w.meta.CPUCheck.Verdict, "cpuid": strings.Join(w.meta.CPUCheck.Outside["cpuid"], ",")}).Warn("cpu baseline not enforced (enforce: false): only the library controls keep it")
	}
	return nil
}

func (c *carrier) smoke(ctx context.Context, w *setWork) error {
	smoke, err := c.driver.Smoke(ctx, w.sp.ID, w.imageDir, w.sp.Imports)
	w.c.Smoke = smoke
	if err != nil {
		return err
	}
	fields := logrus.Fields{"set": w.sp.ID, "ready_ms": round1(smoke.ReadyMS)}
	if w.sp.From != "" {
		fields["from"] = w.sp.From
	}
	c.log.WithFields(fields).Info("smoke: ok")
	return nil
}

// measure times a set's restores; the settings go with the timings (manifest.Measured).
func (c *carrier) measure(ctx context.Context, w *setWork) {
	start := time.Now()
	stats, err := c.driver.Measure(ctx, w.sp.ID, w.imageDir, c.restoreRuns)
	if err != nil {
		c.fail(w, err)
		return
	}
	w.c.RestoreMS = stats
	w.c.MeasuredWith = &manifest.Measured{Runs: c.restoreRuns, RestoreFlags: append([]string{}, c.basis.RestoreFlags...)}
	c.log.WithFields(logrus.Fields{"set": w.sp.ID, "median_ms": round1(stats.Median), "p90_ms": round1(stats.P90), "runs": c.restoreRuns, "took": time.Since(start).Round(time.Millisecond)}).Info("measure: done")
}

// finish does a set's last phase: a new checkpoint goes into the store (its timings in its
// meta.json, which Commit writes: the capture did not) and from there into staging; every set
// gets the output's meta.json and its use recorded. No meta.json is written twice.
func (c *carrier) finish(w *setWork) error {
	dir := filepath.Join(c.staging, w.sp.ID)
	if w.pending != nil {
		w.meta.KeyParts, w.meta.RestoreMS, w.meta.MeasuredWith = w.sp.KeyParts, &w.c.RestoreMS, w.c.MeasuredWith
		stored, err := w.pending.Commit(w.meta)
		if err != nil {
			return fmt.Errorf("%s: put the checkpoint into the store: %w", w.sp.ID, err)
		}
		w.pending, w.meta = nil, stored
		entry, err := c.store.Path(w.sp.Key)
		if err != nil {
			return err
		}
		if err := store.LinkFiles(entry, dir); err != nil {
			return err
		}
	}
	if err := writeMeta(c.writeJSON, dir, w.sp, w.meta); err != nil {
		return err
	}
	if err := c.store.Use(w.sp.Key, w.sp.ID); err != nil {
		c.log.WithField("set", w.sp.ID).WithError(err).Warn("could not record the store entry's use")
	}
	w.c.Bytes, w.c.CapturedAt, w.c.CPUCheck, w.c.Packages = w.meta.Bytes(), w.meta.CapturedAt, w.meta.CPUCheck, w.meta.Packages
	w.c.UnmappedModules = w.meta.UnmappedModules
	w.done = true
	return nil
}

// writeMeta writes with write the output's own meta.json for a set: the stored one, under the
// set's id.
func writeMeta(write func(string, any) error, dir string, sp SetPlan, stored *manifest.Meta) error {
	meta := *stored
	meta.ID, meta.Imports = sp.ID, slices.Clone(sp.Imports)
	meta.Key, meta.KeyParts = sp.Key, sp.KeyParts
	meta.RestoreMS, meta.MeasuredWith = nil, nil
	return write(filepath.Join(dir, manifest.MetaFileName), &meta)
}

// keepFailedSet puts what a failed set left into staging/ID, where the failed run's message
// points: the logs of its sandboxes (stdout, stderr and runsc's own words, from the scratch
// directory that the run removes; bundles named by the sandbox IDs that bundlePrefix begins,
// a long set id's shortened in them) under logs/, and the image files of a capture that failed
// (taken out of its pending store entry) under capture/, with the meta.json the capture
// returned (written with write) when it returned one: only Commit writes it otherwise, and a
// set that failed after its capture (its smoke test, its CPU check) never got there.
func keepFailedSet(w *setWork, staging, work string, bundlePrefix func(setID, step string) (string, error), write func(string, any) error) error {
	dir := filepath.Join(staging, w.sp.ID)
	var errs []error
	for _, step := range []string{"capture", "smoke", "measure"} {
		prefix, err := bundlePrefix(w.sp.ID, step)
		if err != nil {
			errs = append(errs, err)
			continue
		}
		// The prefix is a plain name (letters, digits, - and _): no pattern of its own.
		bundles, _ := filepath.Glob(filepath.Join(work, prefix+"*"))
		for _, bundle := range bundles {
			for _, name := range []string{"stdout.log", "stderr.log", "restore-stderr.log"} {
				data, err := os.ReadFile(filepath.Join(bundle, name))
				if errors.Is(err, os.ErrNotExist) {
					continue
				}
				if err == nil {
					err = os.MkdirAll(filepath.Join(dir, "logs"), 0o700)
				}
				if err == nil {
					err = os.WriteFile(filepath.Join(dir, "logs", filepath.Base(bundle)+"-"+name), data, 0o600)
				}
				errs = append(errs, err)
			}
		}
	}
	if w.pending != nil {
		if err := os.MkdirAll(dir, 0o700); err != nil {
			return errors.Join(append(errs, err)...)
		}
		capture := filepath.Join(dir, "capture")
		if err := os.Rename(w.pending.Dir, capture); err != nil {
			errs = append(errs, fmt.Errorf("keep the capture's files (%s): %w", w.pending.Dir, err))
		} else if w.meta != nil {
			meta := *w.meta
			meta.Key, meta.KeyParts = w.sp.Key, w.sp.KeyParts
			if err := write(filepath.Join(capture, manifest.MetaFileName), &meta); err != nil {
				errs = append(errs, fmt.Errorf("keep the capture's meta.json: %w", err))
			}
		}
	}
	return errors.Join(errs...)
}
