package launch

import (
	"context"
	"errors"
	"fmt"
	"os"
	"slices"
	"time"

	"readie.dev/pipeline/pkg/executorproto"
	"readie.dev/pipeline/pkg/sandbox"
)

// Launcher starts sandboxes of the executor's shape and times calls into them.
type Launcher struct {
	Runtime *Runtime
	Rootfs  string
	// WorkDir holds bundles and host directories; keep it short (socket paths).
	WorkDir string
	// Process is the image's environment, cwd and user (the zero Process: the default
	// rootfs's).
	Process sandbox.Process
	// Env holds variables added to every sandbox's base environment.
	Env []string
	// Timeout bounds one sandbox's work: a restore, or a start or restore plus the call.
	Timeout time.Duration
}

// NewSandbox prepares a sandbox of the executor's shape in mode, with a fresh host directory;
// args, when set, replace the executor's argv (a sandbox of the same shape running something
// else).
func (l *Launcher) NewSandbox(setID, step string, mode sandbox.Mode, env, args []string) (*Sandbox, error) {
	id, err := l.Runtime.NewID(setID, step)
	if err != nil {
		return nil, err
	}
	hostDir := HostDir(l.WorkDir, id)
	if err := os.MkdirAll(hostDir, 0o755); err != nil {
		return nil, err
	}
	spec, err := sandbox.Spec(sandbox.SpecOptions{Mode: mode, Rootfs: l.Rootfs, HostDir: hostDir, Process: l.Process, Env: append(slices.Clone(l.Env), env...), Args: args})
	if err != nil {
		return nil, err
	}
	return l.Runtime.NewSandbox(id, l.WorkDir, hostDir, spec)
}

// MS returns d in milliseconds, to the microsecond.
func MS(d time.Duration) float64 { return float64(d.Microseconds()) / 1000 }

// DeleteInto deletes sb and joins a failed delete into *err: a sandbox that could not be
// deleted is reported, never dropped.
func DeleteInto(ctx context.Context, sb *Sandbox, err *error) {
	*err = errors.Join(*err, sb.Delete(ctx))
}

// WithStderr deletes the sandbox, so that its log holds everything the executor wrote, and
// adds the log's last lines (and a failed delete) to err.
func WithStderr(ctx context.Context, sb *Sandbox, err error) error {
	deleteErr := sb.Delete(ctx)
	if tail := sb.Tail(10); tail != "" {
		err = fmt.Errorf("%w\nexecutor stderr:\n%s", err, tail)
	}
	return errors.Join(err, deleteErr)
}

// CallMarks are the moments a timed call passed: the start of the runsc command, its return,
// the executor accepting the connection, and the decoded answer.
type CallMarks struct {
	Began, Started, Connected, Answered time.Time
}

// TotalMS is the time from the start of the runsc command to the answer.
func (m CallMarks) TotalMS() float64 { return MS(m.Answered.Sub(m.Began)) }

// Call is one call into a new sandbox of a launcher's shape, timed by TimedCall.
type Call struct {
	// SetID and Step name the sandbox (its ID, its logs) and the timeout's message.
	SetID, Step string
	// Env adds to the sandbox's environment (in a restore: the restore-time environment).
	Env []string
	// Prepare readies the sandbox off the clock (e.g. `runsc create`); nil: nothing.
	Prepare func(context.Context, *Sandbox) error
	// Start starts or restores the executor (RestoreStep): the clock runs from here.
	Start func(context.Context, *Sandbox) error
	// Request is sent once the executor's socket accepts; Check judges the answer.
	Request []byte
	Check   func(response []byte) error
	// MaxResponseSize is the most of the answer read (executorproto.Caller's; zero: its
	// default): what the call's answer needs, so that an executor cannot make the caller
	// hold and decode more.
	MaxResponseSize int64
}

// TimedCall prepares a sandbox for c (off the clock), then times start, dial and one call
// until the answer has been checked. The sandbox is deleted on every path, and a failed delete
// is reported.
func (l *Launcher) TimedCall(ctx context.Context, c Call) (marks CallMarks, err error) {
	setID, step := c.SetID, c.Step
	sb, err := l.NewSandbox(setID, step, sandbox.ModeSandbox, c.Env, nil)
	if err != nil {
		return marks, err
	}
	defer DeleteInto(ctx, sb, &err)
	ctx, cancel := context.WithTimeoutCause(ctx, l.Timeout,
		fmt.Errorf("%s of %s exceeded its timeout of %s", step, setID, l.Timeout))
	defer cancel()
	withTail := func(err error) error { return WithStderr(ctx, sb, err) }
	if c.Prepare != nil {
		if err := c.Prepare(ctx, sb); err != nil {
			return marks, withTail(err)
		}
	}
	marks.Began = time.Now()
	if err := c.Start(ctx, sb); err != nil {
		return marks, withTail(err)
	}
	marks.Started = time.Now()
	conn, err := executorproto.Dial(ctx, sb.SocketPath())
	if err != nil {
		return marks, withTail(err)
	}
	defer conn.Close()
	marks.Connected = time.Now()
	caller := executorproto.Caller{MaxResponseSize: c.MaxResponseSize}
	response, err := caller.Call(ctx, conn, c.Request)
	if err != nil {
		return marks, withTail(err)
	}
	marks.Answered = time.Now()
	return marks, c.Check(response)
}

// RestoreStep is the step that restores imageDir into a sandbox with flags and returns once
// the executor runs again (`runsc restore -detach`): TimedCall's start.
func RestoreStep(imageDir string, flags []string) func(context.Context, *Sandbox) error {
	return func(ctx context.Context, sb *Sandbox) error {
		_, err := sb.Restore(ctx, RestoreOptions{ImageDir: imageDir, Flags: flags, Detach: true})
		return err
	}
}
