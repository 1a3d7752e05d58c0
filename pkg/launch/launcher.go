package launch

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"time"

	specs "github.com/opencontainers/runtime-spec/specs-go"

	"readie.dev/pipeline/pkg/sandbox"
)

// Launcher starts the pipeline's sandboxes of the executor's shape (sandbox.Spec of a run) and
// times calls into them. Its sandboxes keep their logs in WorkDir (SandboxOptions.KeepLogs):
// the pipeline keeps a failed set's, and removes its scratch directory at the end of its run.
type Launcher struct {
	Runtime *Runtime
	Rootfs  string
	// WorkDir holds bundles and host directories: a directory only root can enter
	// (SandboxOptions.WorkDir); keep it short (socket paths).
	WorkDir string
	// Process is the image's environment, cwd and user (the zero Process: the default
	// rootfs's).
	Process sandbox.Process
	// Env holds variables added to every sandbox's base environment.
	Env []string
	// Timeout bounds one sandbox's work: a restore, or a start or restore plus the call.
	Timeout time.Duration
}

// NewSandbox prepares a sandbox of the executor's shape in mode, named by the runtime's lease
// (Runtime.NewID); args, when set, replace the executor's argv (a sandbox of the same shape
// running something else).
func (l *Launcher) NewSandbox(setID, step string, mode sandbox.Mode, env, args []string) (*Sandbox, error) {
	return NewSandbox(l.SandboxOptions(mode, env, args), setID, step)
}

// SandboxOptions are the options of the launcher's sandboxes in mode (NewSandbox's), for a
// caller that makes them elsewhere (a pool of the launcher's shape).
func (l *Launcher) SandboxOptions(mode sandbox.Mode, env, args []string) SandboxOptions {
	return SandboxOptions{
		Runtime: l.Runtime, WorkDir: l.WorkDir, KeepLogs: true,
		Spec: func(hostDir string) (*specs.Spec, error) { return l.Spec(mode, hostDir, env, args) },
	}
}

// Spec returns the spec of a sandbox of the launcher's shape in mode whose executor mount's
// source is hostDir: the image's process (Process), the launcher's Env and then env over its
// base environment, args (when set) for the executor's argv. Every sandbox of the launcher,
// and a pool of its shape, is made from it.
func (l *Launcher) Spec(mode sandbox.Mode, hostDir string, env, args []string) (*specs.Spec, error) {
	return sandbox.Spec(sandbox.SpecOptions{Mode: mode, Rootfs: l.Rootfs, HostDir: hostDir, Process: l.Process, Env: append(slices.Clone(l.Env), env...), Args: args})
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

// CallMarks are the moments a timed call passed: the start of the runsc command (or of the
// wait for a pool's sandbox), its return, the executor accepting the connection, and the
// decoded answer.
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
	// Prepare readies the sandbox off the clock (e.g. its Create); nil: nothing. The clock
	// starts as it returns.
	Prepare func(context.Context, *Sandbox) error
	// Image is what the start restores (Sandbox.Start); the zero Image starts the executor
	// cold, creating the sandbox on the clock unless Prepare did.
	Image Image
	// Request is sent once the executor's socket accepts; Check judges the answer.
	Request []byte
	Check   func(response []byte) error
	// MaxResponseSize is the most of the answer read (executorproto.Caller's; zero: its
	// default): what the call's answer needs, so that an executor cannot make the caller
	// hold and decode more.
	MaxResponseSize int64
}

// TimedCall prepares a sandbox for c (off the clock), then times its start, dial and one call
// until the answer has been checked (Sandbox.CallOnce). The sandbox is deleted on every path,
// and a failed delete is reported.
func (l *Launcher) TimedCall(ctx context.Context, c Call) (marks CallMarks, err error) {
	sb, err := l.NewSandbox(c.SetID, c.Step, sandbox.ModeSandbox, c.Env, nil)
	if err != nil {
		return marks, err
	}
	defer DeleteInto(ctx, sb, &err)
	ctx, cancel := context.WithTimeoutCause(ctx, l.Timeout,
		fmt.Errorf("%s of %s exceeded its timeout of %s", c.Step, c.SetID, l.Timeout))
	defer cancel()
	if c.Prepare != nil {
		if err := c.Prepare(ctx, sb); err != nil {
			return marks, WithStderr(ctx, sb, err)
		}
	}
	return sb.CallOnce(ctx, c.Image, c.Request, c.MaxResponseSize, c.Check)
}
