package measure

import (
	"context"
	"errors"
	"fmt"
	"time"

	"readie.dev/pipeline/pkg/launch"
	"readie.dev/pipeline/pkg/manifest"
	"readie.dev/pipeline/pkg/sandbox"
)

// ErrMeasure wraps a failed timed restore; ErrSmoke a failed smoke test.
var (
	ErrMeasure = errors.New("measure failed")
	ErrSmoke   = errors.New("smoke test failed")
)

// Restorer restores checkpoints into the pipeline's sandboxes of the captured shape.
type Restorer struct {
	launch.Launcher
	// Flags are passed to every `runsc restore`, e.g. "-direct".
	Flags []string
}

// MeasureRuns restores imageDir in measure mode `runs` times, each in a new sandbox, and times
// each from the start of `runsc restore` to its exit.
func (r *Restorer) MeasureRuns(ctx context.Context, setID, imageDir string, runs int) (manifest.Stats, error) {
	times := make([]float64, 0, runs)
	for i := range runs {
		ms, err := r.MeasureOnce(ctx, setID, imageDir)
		if err != nil {
			return manifest.Stats{}, fmt.Errorf("%w: %s: run %d of %d: %w", ErrMeasure, setID, i+1, runs, err)
		}
		times = append(times, ms)
	}
	return Summarize(times), nil
}

// MeasureOnce restores imageDir in measure mode in a new sandbox and returns the time from the
// start of `runsc restore` to its exit, in milliseconds.
func (r *Restorer) MeasureOnce(ctx context.Context, setID, imageDir string) (_ float64, err error) {
	sb, err := r.NewSandbox(setID, "measure", sandbox.ModeMeasure, nil, nil)
	if err != nil {
		return 0, err
	}
	defer launch.DeleteInto(ctx, sb, &err)
	runCtx, cancel := context.WithTimeoutCause(ctx, r.Timeout,
		fmt.Errorf("restore exceeded its timeout of %s", r.Timeout))
	defer cancel()
	start := time.Now()
	_, err = sb.RunRestored(runCtx, launch.Image{Dir: imageDir, Flags: r.Flags})
	elapsed := time.Since(start)
	if err != nil {
		return 0, launch.WithStderr(ctx, sb, err)
	}
	return launch.MS(elapsed), nil
}
