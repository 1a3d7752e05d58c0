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
	// Capture captures set into the empty directory dir and returns its meta.json contents,
	// not written: the carrier completes them and writes them once, into the store
	// (capture.Take). The spec fingerprint is the run's, computed once (Basis).
	Capture(ctx context.Context, set config.PackageSet, dir string) (*manifest.Meta, error)
	// Measure times runs restores of the checkpoint in dir (measure.Restorer.MeasureRuns).
	Measure(ctx context.Context, setID, dir string, runs int) (manifest.Stats, error)
	// Smoke restores the checkpoint in dir and calls the executor (measure.Restorer.Smoke).
	Smoke(ctx context.Context, setID, dir string, imports []string) (manifest.Smoke, error)
}

// runscDriver is the Driver of a run on the real runsc: sandboxes of sb's shape, their bundles
// in work, captures stamped with runscVersion and fingerprint (the basis's).
type runscDriver struct {
	sandboxes    *Sandboxes
	work         string
	runscVersion string
	fingerprint  string
}

// Capture captures set with capture.Take, bounded by timeouts.capture.
func (d runscDriver) Capture(ctx context.Context, set config.PackageSet, dir string) (*manifest.Meta, error) {
	sb := d.sandboxes
	req := sb.CaptureRequest(set, dir, d.work, d.runscVersion, sb.Config.Runsc.CheckpointOptions)
	req.SpecFingerprint = d.fingerprint
	return capture.Take(ctx, sb.Runtime, req)
}

// Measure times runs restores, each bounded by timeouts.restore.
func (d runscDriver) Measure(ctx context.Context, setID, dir string, runs int) (manifest.Stats, error) {
	return d.sandboxes.Restorer(d.work, d.sandboxes.Config.Timeouts.Restore).MeasureRuns(ctx, setID, dir, runs)
}

// Smoke smoke-tests the checkpoint in dir, bounded by timeouts.smoke: a restore plus a call.
func (d runscDriver) Smoke(ctx context.Context, setID, dir string, imports []string) (manifest.Smoke, error) {
	return d.sandboxes.Restorer(d.work, d.sandboxes.Config.Timeouts.Smoke).Smoke(ctx, setID, dir, imports)
}
