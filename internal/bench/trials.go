package bench

import (
	"context"
	"errors"
	"fmt"
	"time"

	"readie.dev/pipeline/pkg/launch"
	"readie.dev/pipeline/pkg/measure"
	"readie.dev/pipeline/pkg/pool"
	"readie.dev/pipeline/pkg/pycall"
	"readie.dev/pipeline/pkg/sandbox"
)

// TimeColdCall starts the executor in sandbox mode without a checkpoint and makes the call that
// imports the set's modules; the time runs from `runsc create` to the answer.
func TimeColdCall(ctx context.Context, l *launch.Launcher, setID string, imports []string) (float64, error) {
	request, err := pycall.ImportRequest(imports)
	if err != nil {
		return 0, err
	}
	// The zero Image: `runsc create` and `runsc start`, both on the clock.
	marks, err := l.TimedCall(ctx, launch.Call{SetID: setID, Step: "cold", Request: request, Check: func(resp []byte) error { return pycall.CheckImported(resp, imports) }, MaxResponseSize: pycall.SmallResponse})
	return marks.TotalMS(), err
}

// TimeRestoreCall restores imageDir in sandbox mode and makes the same call as TimeColdCall; the time
// runs from `runsc restore` to the answer. With prestarted, the sandbox is made by
// `runsc create` first, off the clock, as a worker with a pool of created sandboxes would.
func TimeRestoreCall(ctx context.Context, r *measure.Restorer, setID, imageDir string, imports []string, prestarted bool) (launch.CallMarks, error) {
	request, err := pycall.ImportRequest(imports)
	if err != nil {
		return launch.CallMarks{}, err
	}
	var prepare func(context.Context, *launch.Sandbox) error
	step := "restore"
	if prestarted {
		prepare = func(ctx context.Context, sb *launch.Sandbox) error { return sb.Create(ctx) }
		step = "prestarted"
	}
	return r.TimedCall(ctx, launch.Call{SetID: setID, Step: step, Prepare: prepare, Image: launch.Image{Dir: imageDir, Flags: r.Flags},
		Request: request, Check: func(resp []byte) error { return pycall.CheckImported(resp, imports) }, MaxResponseSize: pycall.SmallResponse})
}

// TimeFloor runs a sandbox of the executor's shape whose process exits at once (/bin/true): the
// cost of any sandbox on this machine.
func TimeFloor(ctx context.Context, l *launch.Launcher) (_ float64, err error) {
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

// NewPool starts a pool of size sandboxes of the launcher's shape in sandbox mode (the spec a
// restore of the output uses, the image's process included: launch.Launcher.Spec), named with
// the run's lease (Runtime.NewID) so that no other run takes them for leftovers; the caller
// closes it.
func NewPool(ctx context.Context, l *launch.Launcher, size int) (*pool.Pool, error) {
	so := l.SandboxOptions(sandbox.ModeSandbox, nil, nil)
	so.KeepLogs = false // a trial's failure carries its stderr's end; a pool makes many
	return pool.New(ctx, pool.Options{
		New:        func() (*launch.Sandbox, error) { return launch.NewSandbox(so, "pool", Pooled) },
		Size:       size,
		GetTimeout: l.Timeout,
		// The replacement's create waits for the trial's Delete: no create beside a timed start.
		RefillOnDelete: true,
	})
}

// TimePooledCall makes the same call as TimeRestoreCall in a sandbox of p: restored from
// imageDir with flags, or started cold when imageDir is "" (a request no checkpoint serves).
// The time runs from Get to the answer. The pool is full before (Wait) and refilled after
// the sandbox's Delete (NewPool's RefillOnDelete), both off the clock, so that no refill runs
// during this trial or any other. A worker's pool refills as Get returns: its start may share
// the machine with a create.
func TimePooledCall(ctx context.Context, p *pool.Pool, imageDir string, flags, imports []string, timeout time.Duration) (marks launch.CallMarks, err error) {
	request, err := pycall.ImportRequest(imports)
	if err != nil {
		return marks, err
	}
	if err := p.Wait(ctx); err != nil {
		return marks, err
	}
	marks, err = pooledCall(ctx, p, imageDir, flags, timeout, request, func(resp []byte) error { return pycall.CheckImported(resp, imports) })
	if err != nil {
		return marks, err
	}
	return marks, p.Wait(ctx)
}

// NewWarm starts a warm pool of one sandbox of each set, restored ahead through kit (the
// output's launch.Restorer, as a worker makes it), refilled after a taken sandbox's Delete
// (RefillOnDelete), so that no restore runs beside a timed warm start; the caller closes it.
func NewWarm(ctx context.Context, kit *launch.Restorer, sets []MeasuredSet, timeout time.Duration) (*pool.Warm, error) {
	sizes := map[string]int{}
	for _, s := range sets {
		sizes[s.ID] = 1
	}
	return pool.NewWarm(ctx, pool.WarmOptions{Restorer: kit, Sizes: sizes, RefillOnDelete: true, WaitTimeout: timeout * time.Duration(len(sets))})
}

// TimeWarmCall makes the same call as TimeRestoreCall in a sandbox of set restored ahead by
// w: the time runs from the take (launch.Restorer.Restore with the warm pool) to the answer.
// The pool is full before (Wait) and refilled after the sandbox's Delete, both off the clock;
// the memory of the sandbox, restored and idle, is measured before, off the clock too.
func TimeWarmCall(ctx context.Context, kit *launch.Restorer, w *pool.Warm, set string, imports []string, timeout time.Duration) (marks launch.CallMarks, resident int64, err error) {
	request, err := pycall.ImportRequest(imports)
	if err != nil {
		return marks, 0, err
	}
	if err := w.Wait(ctx); err != nil { // bounded by the pool's WaitTimeout
		return marks, 0, err
	}
	ctx, cancel := context.WithTimeoutCause(ctx, timeout, fmt.Errorf("a warm start and call exceeded its timeout of %s", timeout))
	defer cancel()
	if resident, err = w.Resident(set); err != nil {
		return marks, 0, err
	}
	restored, err := kit.Restore(ctx, set, launch.RestoreOptions{Warm: w})
	if err != nil {
		return marks, 0, err
	}
	defer func() { err = errors.Join(err, restored.Close(ctx)) }()
	if restored.How != launch.FromWarm {
		return marks, 0, fmt.Errorf("the warm pool was full, yet %s started by the %s path", set, restored.How)
	}
	response, err := restored.Call(ctx, request, pycall.SmallResponse)
	if err != nil {
		return marks, 0, launch.WithStderr(ctx, restored.Sandbox, err)
	}
	marks = restored.Marks
	marks.Answered = time.Now()
	if err := pycall.CheckImported(response, imports); err != nil {
		return marks, 0, err
	}
	if err := restored.Close(ctx); err != nil {
		return marks, 0, err
	}
	// The refill the close started runs now, off the clock, not beside the next series' trial.
	if err := w.Wait(ctx); err != nil {
		return marks, 0, err
	}
	return marks, resident, nil
}

// pooledCall takes a sandbox of p, restores or starts it, dials and calls it
// (launch.Sandbox.CallOnce), and deletes it. The time runs from Get.
func pooledCall(ctx context.Context, p *pool.Pool, imageDir string, flags []string, timeout time.Duration, request []byte, check func([]byte) error) (marks launch.CallMarks, err error) {
	ctx, cancel := context.WithTimeoutCause(ctx, timeout, fmt.Errorf("a pooled start and call exceeded its timeout of %s", timeout))
	defer cancel()
	began := time.Now()
	sb, err := p.Get(ctx)
	if err != nil {
		return marks, err
	}
	defer launch.DeleteInto(ctx, sb, &err)
	img := launch.Image{Dir: imageDir, Flags: flags} // "": a cold start
	marks, err = sb.CallOnce(ctx, img, request, pycall.SmallResponse, check)
	marks.Began = began
	return marks, err
}
