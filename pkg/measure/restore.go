package measure

import (
	"context"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"time"

	"readie.dev/pipeline/pkg/capture"
	"readie.dev/pipeline/pkg/manifest"
	"readie.dev/pipeline/pkg/sandbox"
)

// ErrMeasure wraps a failed timed restore; ErrSmoke a failed smoke test.
var (
	ErrMeasure = errors.New("measure failed")
	ErrSmoke   = errors.New("smoke test failed")
)

// Restorer restores checkpoints into sandboxes of the captured shape.
type Restorer struct {
	Runtime *sandbox.Runtime
	Rootfs  string
	// WorkDir holds bundles and host directories; keep it short (socket paths).
	WorkDir string
	// Env holds variables added to every sandbox's base environment.
	Env []string
	// Flags are passed to every `runsc restore`, e.g. "-direct".
	Flags []string
	// Timeout bounds one restore (and, for the smoke test, restore plus the call).
	Timeout time.Duration
}

// newSandbox prepares a sandbox of the executor's shape in mode, with a fresh host directory.
func (r *Restorer) newSandbox(setID, step string, mode sandbox.Mode, env []string) (*sandbox.Sandbox, error) {
	return r.newSandboxArgs(setID, step, mode, env, nil)
}

func (r *Restorer) newSandboxArgs(setID, step string, mode sandbox.Mode, env, args []string) (*sandbox.Sandbox, error) {
	id := capture.SandboxID(setID, step)
	hostDir := filepath.Join(r.WorkDir, id[len(id)-8:]) // the random suffix: socket paths stay short
	if err := os.MkdirAll(hostDir, 0o755); err != nil {
		return nil, err
	}
	spec, err := sandbox.Spec(sandbox.SpecOptions{Mode: mode, Rootfs: r.Rootfs, HostDir: hostDir, Env: append(slices.Clone(r.Env), env...), Args: args})
	if err != nil {
		return nil, err
	}
	return r.Runtime.NewSandbox(id, r.WorkDir, hostDir, spec)
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
func (r *Restorer) MeasureOnce(ctx context.Context, setID, imageDir string) (float64, error) {
	sb, err := r.newSandbox(setID, "measure", sandbox.ModeMeasure, nil)
	if err != nil {
		return 0, err
	}
	defer sb.Delete(ctx)
	runCtx, cancel := context.WithTimeoutCause(ctx, r.Timeout,
		fmt.Errorf("restore exceeded its timeout of %s", r.Timeout))
	defer cancel()
	start := time.Now()
	status, err := sb.Restore(runCtx, sandbox.RestoreOptions{ImageDir: imageDir, Flags: r.Flags})
	elapsed := time.Since(start)
	if err == nil && status != 0 {
		err = fmt.Errorf("restored executor exited with status %d", status)
	}
	if err != nil {
		return 0, withStderr(ctx, sb, err)
	}
	return ms(elapsed), nil
}
