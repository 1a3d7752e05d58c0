package bench

import (
	"context"
	"errors"
	"fmt"
	"time"

	"readie.dev/pipeline/internal/sandboxes"
	"readie.dev/pipeline/pkg/measure"
	"readie.dev/pipeline/pkg/sandbox"
)

// ImportRequest builds a request that imports every module of imports and returns how many
// it imported: the first call of a cold executor, and the same call on a restored one.
func ImportRequest(imports []string) ([]byte, error) {
	list, err := measure.PyList(imports)
	if err != nil {
		return nil, err
	}
	return measure.EvalRequest(fmt.Sprintf(`len([__import__(m) for m in %s])`, list))
}

// checkImported checks the answer to ImportRequest.
func checkImported(response []byte, imports []string) error {
	value, err := measure.DecodeEnvelope(response)
	if err != nil {
		return err
	}
	if n, ok := value.(int64); !ok || n != int64(len(imports)) {
		return fmt.Errorf("import call returned %v, want %d", value, len(imports))
	}
	return nil
}

// TimeColdCall starts the executor in sandbox mode without a checkpoint and makes the call that
// imports the set's modules; the time runs from `runsc create` to the answer.
func TimeColdCall(ctx context.Context, l *sandboxes.Launcher, setID string, imports []string) (float64, error) {
	request, err := ImportRequest(imports)
	if err != nil {
		return 0, err
	}
	marks, err := l.TimedCall(ctx, sandboxes.Call{SetID: setID, Step: "cold", Start: func(ctx context.Context, sb *sandboxes.Sandbox) error {
		if err := sb.Create(ctx); err != nil {
			return err
		}
		return sb.Start(ctx)
	}, Request: request, Check: func(resp []byte) error { return checkImported(resp, imports) }})
	return marks.TotalMS(), err
}

// TimeRestoreCall restores imageDir in sandbox mode and makes the same call as TimeColdCall; the time
// runs from `runsc restore` to the answer. With prestarted, the sandbox is made by
// `runsc create` first, off the clock, as a worker with a pool of created sandboxes would.
func TimeRestoreCall(ctx context.Context, r *measure.Restorer, setID, imageDir string, imports []string, prestarted bool) (sandboxes.CallMarks, error) {
	request, err := ImportRequest(imports)
	if err != nil {
		return sandboxes.CallMarks{}, err
	}
	var prepare func(context.Context, *sandboxes.Sandbox) error
	step := "restore"
	if prestarted {
		prepare = func(ctx context.Context, sb *sandboxes.Sandbox) error { return sb.Create(ctx) }
		step = "prestarted"
	}
	return r.TimedCall(ctx, sandboxes.Call{SetID: setID, Step: step, Prepare: prepare, Start: sandboxes.RestoreStep(imageDir, r.Flags),
		Request: request, Check: func(resp []byte) error { return checkImported(resp, imports) }})
}

// TimeFloor runs a sandbox of the executor's shape whose process exits at once (/bin/true): the
// cost of any sandbox on this machine.
func TimeFloor(ctx context.Context, l *sandboxes.Launcher) (_ float64, err error) {
	sb, err := l.NewSandbox("floor", "floor", sandbox.ModeSandbox, nil, []string{"/bin/true"})
	if err != nil {
		return 0, err
	}
	defer func() { err = errors.Join(err, sb.Delete(ctx)) }() // a failed delete is always reported
	ctx, cancel := context.WithTimeoutCause(ctx, l.Timeout, fmt.Errorf("floor sandbox exceeded its timeout of %s", l.Timeout))
	defer cancel()
	start := time.Now()
	_, err = sb.Run(ctx)
	return float64(time.Since(start).Microseconds()) / 1000, err
}
