package run

import (
	"context"
	"fmt"
	"maps"
	"path/filepath"
	"slices"
	"time"

	specs "github.com/opencontainers/runtime-spec/specs-go"
	"github.com/sirupsen/logrus"

	"readie.dev/pipeline/internal/outcatalogue"
	"readie.dev/pipeline/internal/outdir"
	"readie.dev/pipeline/internal/sandboxes"
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
// The stages, in the order data flows: the config's rootfs (PrepareRootfs), the Basis every
// set shares, the Plan (NewPlan), the carry-out through a Driver on runsc (carrier), the
// output's files (writeOutputFiles) and the swap (intoOutput).
func (e *Env) Capture(ctx context.Context, out string, o CaptureOptions) (*Result, error) {
	if err := outdir.Check(out); err != nil {
		return nil, err
	}
	if err := e.PrepareRootfs(ctx); err != nil {
		return nil, err
	}
	lock, err := e.sweep.lockAndSweep(ctx, out)
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
	runsc, err := runscRecord(ctx, e.Runtime, e.RunscSHA256)
	if err != nil {
		return nil, err
	}
	work, cleanup, err := scratch.Dir(e.lease)
	if err != nil {
		return nil, err
	}
	defer cleanup()
	return carryOutPlan(ctx, e, plan, runsc, runscDriver{env: e, work: work, runscVersion: runsc.Version}, work, o)
}

// carryOutPlan is the stages after the plan: it carries out plan through d (reuse or capture,
// measure and smoke), writes the output and swaps it in, with e's config, store and log and
// the runsc binary r; work is the scratch directory d's sandboxes use. Capture passes the
// runsc driver, a unit test a substitute.
func carryOutPlan(ctx context.Context, e *Env, plan *Plan, r manifest.Runsc, d Driver, work string, o CaptureOptions) (*Result, error) {
	m := newManifest(plan.basis, r, e.Config.Runsc.CheckpointOptions)
	c := &carrier{
		plan: plan, driver: d, store: e.Store, work: work, jobs: e.Config.Jobs, restoreRuns: e.Config.RestoreRuns,
		remeasure: o.Remeasure, baseline: e.Config.CPUBaseline, log: e.Log,
	}
	return intoOutput(ctx, c, m, o, e.CleanFailed)
}

// runscRecord is what the manifest records of rt's runsc binary, whose digest is sha256: its
// version and module.
func runscRecord(ctx context.Context, rt *sandboxes.Runtime, sha256 string) (manifest.Runsc, error) {
	version, err := rt.Version(ctx)
	if err != nil {
		return manifest.Runsc{}, err
	}
	module, moduleVersion, err := rt.Module()
	if err != nil {
		return manifest.Runsc{}, err
	}
	return manifest.Runsc{Version: version, Module: module + "@" + moduleVersion, SHA256: sha256}, nil
}

// intoOutput carries out c's plan into a fresh staging directory beside the plan's output,
// writes the output's files there, and puts it in place of the output when every set passed.
// When one failed, the output is left as it was and the staging directory kept for inspection
// (removed with cleanFailed). m is the new manifest, without checkpoints yet.
func intoOutput(ctx context.Context, c *carrier, m *manifest.Manifest, o CaptureOptions, cleanFailed bool) (*Result, error) {
	var res *Result
	err := outdir.ThroughStaging(c.plan.Out, !cleanFailed, func(staging string) error {
		c.staging = staging
		var err error
		if res, err = c.carryOut(ctx, m); err != nil {
			return err
		}
		in := outcatalogue.ForCapture(c.plan.Out, m, o.Analysis, o.Predicted, c.log)
		if res.Catalogue, err = writeOutputFiles(staging, m, c.plan.basis.RestoreSpec, in); err != nil {
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

// newManifest is the manifest of a capture on basis b with the runsc binary r and the
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
		CreatedAt:         time.Now().UTC(),
		Spec:              manifest.RestoreSpecFileName,
		Checkpoints:       []manifest.Checkpoint{},
	}
}
