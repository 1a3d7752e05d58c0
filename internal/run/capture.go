package run

import (
	"context"
	"fmt"
	"maps"
	"os"
	"path/filepath"
	"slices"
	"time"

	specs "github.com/opencontainers/runtime-spec/specs-go"
	"github.com/sirupsen/logrus"

	"readie.dev/pipeline/internal/analysis"
	"readie.dev/pipeline/internal/config"
	"readie.dev/pipeline/internal/outcatalogue"
	"readie.dev/pipeline/internal/outdir"
	"readie.dev/pipeline/internal/scratch"
	"readie.dev/pipeline/pkg/catalogue"
	"readie.dev/pipeline/pkg/executorproto"
	"readie.dev/pipeline/pkg/manifest"
	"readie.dev/pipeline/pkg/sandbox"
)

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
//
// The stages, in the order data flows, each value made once and passed on: the config's
// rootfs (ResolveRootfs) and the Sandboxes on it, the Basis every set shares, the Plan
// (NewPlan), the carry-out through a Driver on runsc (carrier), the output's files
// (writeOutputFiles) and the swap (intoOutput).
func (e *Env) Capture(ctx context.Context, out string, o CaptureOptions) (*Result, error) {
	if err := outdir.Check(out); err != nil {
		return nil, err
	}
	r, err := e.ResolveRootfs(ctx)
	if err != nil {
		return nil, err
	}
	lock, err := e.sweep.lockAndSweep(ctx, out)
	if err != nil {
		return nil, err
	}
	defer lock.Unlock()
	start := time.Now()
	sb := e.Sandboxes(r)
	b, err := e.basis(ctx, sb)
	if err != nil {
		return nil, err
	}
	plan := NewPlan(b, e.Store, out, o, e.Config.RestoreRuns)
	e.Log.WithField("took", time.Since(start).Round(time.Millisecond)).Debug("plan: done")
	for _, d := range plan.Dropped {
		e.Log.WithFields(logrus.Fields{"set": d.ID, "reason": d.Reason}).Warn("dropped from the output")
	}
	plan.Log(e.Log)
	runsc, err := e.runscRecord()
	if err != nil {
		return nil, err
	}
	work, cleanup, err := scratch.Dir(e.lease)
	if err != nil {
		return nil, err
	}
	defer cleanup()
	cached := e.cachedAnalysis(ctx, sb, out, o.Selection)
	d := runscDriver{sandboxes: sb, work: work, runscVersion: runsc.Version, fingerprint: b.Fingerprint}
	return carryOutPlan(ctx, e, plan, b, runsc, d, work, o, cached)
}

// cachedAnalysis returns the analysis cache's figures of the selected sets' imports on sb
// (Env.Analyses), for catalogue.json when the output holds no analysis.json; nil when there
// is none. It measures nothing.
func (e *Env) cachedAnalysis(ctx context.Context, sb *Sandboxes, out string, sel *config.Selection) *analysis.File {
	if e.Analyses == nil {
		return nil
	}
	if _, err := os.Stat(filepath.Join(out, analysis.FileName)); err == nil {
		return nil // the capture takes the output's own
	}
	var names []string
	for _, s := range sel.Sets {
		for _, m := range s.Imports {
			if !slices.Contains(names, m) {
				names = append(names, m)
			}
		}
	}
	if len(names) == 0 {
		return nil
	}
	return e.Analyses(ctx, sb, names)
}

// carryOutPlan is the stages after the plan: it carries out plan on basis b through d (reuse
// or capture, measure and smoke), writes the output and swaps it in, with e's config, store
// and log and the runsc binary r; work is the scratch directory d's sandboxes use; cached is
// the analysis cache's figures for the catalogue (nil: none). Capture passes the runsc
// driver, a unit test a substitute.
func carryOutPlan(ctx context.Context, e *Env, plan *Plan, b *Basis, r manifest.Runsc, d Driver, work string, o CaptureOptions, cached *analysis.File) (*Result, error) {
	m := newManifest(b, r, e.Config.Runsc.CheckpointOptions)
	c := &carrier{
		plan: plan, basis: b, driver: d, store: e.Store, work: work, bundlePrefix: e.Runtime.IDPrefix, jobs: e.Config.Jobs, restoreRuns: e.Config.RestoreRuns,
		remeasure: o.Remeasure, baseline: e.Config.CPUBaseline, log: e.Log, progress: e.Progress, writeJSON: e.tally.writer(outdir.WriteJSON),
	}
	return intoOutput(ctx, c, m, o, cached, e.CleanFailed)
}

// runscRecord returns what the manifest records of e's runsc binary: the version and digest
// NewEnv asked once, and the module its build info names.
func (e *Env) runscRecord() (manifest.Runsc, error) {
	module, moduleVersion, err := e.Runtime.Module()
	if err != nil {
		return manifest.Runsc{}, err
	}
	r := e.Runsc
	r.Module = module + "@" + moduleVersion
	return r, nil
}

// intoOutput carries out c's plan into a fresh staging directory beside the plan's output,
// writes the output's files there, and puts it in place of the output when every set passed.
// When one failed, the output is left as it was and the staging directory kept for inspection
// (removed with cleanFailed). m is the new manifest, without checkpoints yet; cached is the
// analysis cache's figures for catalogue.json (nil: none).
func intoOutput(ctx context.Context, c *carrier, m *manifest.Manifest, o CaptureOptions, cached *analysis.File, cleanFailed bool) (*Result, error) {
	var res *Result
	err := outdir.ThroughStaging(c.plan.Out, !cleanFailed, func(staging string) error {
		c.staging = staging
		var err error
		if res, err = c.carryOut(ctx, m); err != nil {
			return err
		}
		in := outcatalogue.ForCapture(c.plan.Out, m, cached, o.Predicted, c.log)
		if res.Catalogue, err = writeOutputFiles(staging, m, c.basis.RestoreSpec, in); err != nil {
			return err
		}
		c.log.WithFields(logrus.Fields{"modules": len(in.Modules), "from": in.From}).Debug("catalogue: written")
		return nil
	})
	if err != nil {
		return res, err
	}
	res.Manifest = m
	return res, nil
}

// writeOutputFiles completes m once its checkpoints are in (whether the CPU baseline was
// enforced, the cost model) and writes the output's own files into staging: the restore spec,
// manifest.json and catalogue.json (from m and in).
func writeOutputFiles(staging string, m *manifest.Manifest, restoreSpec *specs.Spec, in outcatalogue.Inputs) (*catalogue.Catalogue, error) {
	if m.CPU.Baseline != nil {
		enforced := !slices.ContainsFunc(m.Checkpoints, func(c manifest.Checkpoint) bool {
			return c.CPUCheck == nil || c.CPUCheck.Verdict != manifest.CPUEnforced
		})
		m.CPU.Enforced = &enforced
	}
	m.AlphaMsPerMiB, m.InterceptMs = outcatalogue.CostModel(m.Checkpoints)
	if err := outdir.WriteJSON(filepath.Join(staging, manifest.RestoreSpecFileName), restoreSpec); err != nil {
		return nil, fmt.Errorf("write restore spec: %w", err)
	}
	if err := outdir.WriteJSON(filepath.Join(staging, manifest.FileName), m); err != nil {
		return nil, fmt.Errorf("write manifest: %w", err)
	}
	return outcatalogue.Write(staging, m, in)
}

func round1(ms float64) float64 { return float64(int64(ms*10+0.5)) / 10 }

// newManifest returns the manifest of a capture on basis b with the runsc binary r and the
// checkpoint options options, before its checkpoints are in.
func newManifest(b *Basis, r manifest.Runsc, options map[string]string) *manifest.Manifest {
	need := b.CPU
	checkpointOptions := map[string]string{} // {} rather than null
	maps.Copy(checkpointOptions, options)
	return &manifest.Manifest{
		ExecutorProtocol:  executorproto.Version,
		Runsc:             r,
		RunscFlags:        b.Flags.Args(),
		RestoreFlags:      slices.Clone(b.RestoreFlags),
		CheckpointOptions: checkpointOptions,
		SpecFingerprint:   b.Fingerprint,
		ExecutorArgv:      sandbox.ExecutorArgs(),
		PythonPath:        b.PythonPath,
		Python:            b.Python,
		Process:           b.Process,
		RootReadonly:      b.RestoreSpec.Root.Readonly,
		Rootfs:            b.Rootfs,
		Image:             b.Image,
		CPU:               &need,
		CPUs:              b.CPUs,
		CreatedAt:         time.Now().UTC(),
		Spec:              manifest.RestoreSpecFileName,
		Checkpoints:       []manifest.Checkpoint{},
	}
}
