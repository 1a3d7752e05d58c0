package run

import (
	"context"

	"readie.dev/pipeline/internal/config"
	"readie.dev/pipeline/pkg/capture"
	"readie.dev/pipeline/pkg/manifest"
)

// Driver is where a run calls runsc: a capture, timed restores and a smoke test of one set.
// The stages around it (the plan, reuse or capture, what goes into the store and the output)
// take it as an input, so they are tested with a substitute as well as with runsc.
type Driver interface {
	// Capture captures set into the empty directory dir and returns its meta.json, written
	// there (capture.Run).
	Capture(ctx context.Context, set config.PackageSet, dir string) (*manifest.Meta, error)
	// Measure times runs restores of the checkpoint in dir (measure.Restorer.MeasureRuns).
	Measure(ctx context.Context, setID, dir string, runs int) (manifest.Stats, error)
	// Smoke restores the checkpoint in dir and calls the executor (measure.Restorer.Smoke).
	Smoke(ctx context.Context, setID, dir string, imports []string) (manifest.Smoke, error)
}

// runscDriver is the Driver of a run on the real runsc: e's sandboxes, their bundles in work,
// captures stamped with runscVersion.
type runscDriver struct {
	env          *Env
	work         string
	runscVersion string
}

func (d runscDriver) Capture(ctx context.Context, set config.PackageSet, dir string) (*manifest.Meta, error) {
	req := d.env.CaptureRequest(set, dir, d.work, d.runscVersion, d.env.Config.Runsc.CheckpointOptions)
	return capture.Run(ctx, d.env.Runtime, req)
}

func (d runscDriver) Measure(ctx context.Context, setID, dir string, runs int) (manifest.Stats, error) {
	return d.env.Restorer(d.work, d.env.Config.Timeouts.Restore).MeasureRuns(ctx, setID, dir, runs)
}

// Smoke is bounded by timeouts.smoke: a restore plus a call.
func (d runscDriver) Smoke(ctx context.Context, setID, dir string, imports []string) (manifest.Smoke, error) {
	return d.env.Restorer(d.work, d.env.Config.Timeouts.Smoke).Smoke(ctx, setID, dir, imports)
}
