// Package runsc drives gVisor's runsc binary, in the style of github.com/containerd/go-runc:
// a Runsc value holds the settings every command shares (the binary, its state root, the
// global flags), an options struct per command turns into that command's flags, the context
// comes first, and the stdio a command hands to the sandbox's process is passed in per call.
// It keeps no state between calls and writes no files: which sandboxes exist, their logs and
// when to delete them are the caller's.
//
// pkg/launch drives it for every sandbox of the pipeline and of a worker (a worker restores
// through launch.Restorer, which also never kills a create half-way and deletes on every path);
// on its own, a restore reads:
//
//	r := &runsc.Runsc{Path: path, Root: "/run/worker/runsc", GlobalArgs: m.RunscFlags}
//	err := r.Create(ctx, id, bundle, &runsc.CreateOpts{IO: runsc.IO{Stdout: w, Stderr: w}})
//	_, err = r.Restore(ctx, id, bundle, &runsc.RestoreOpts{ImagePath: dir, Detach: true, ExtraArgs: m.RestoreFlags})
//	defer r.Delete(context.WithoutCancel(ctx), id, &runsc.DeleteOpts{Force: true})
//
// It is its own small wrapper of os/exec, not go-runc: go-runc's options emit flags runsc
// rejects (create --detach, --no-pivot, CRIU's), its Restore is shaped for CRIU, its Version
// does not parse runsc's output, and it waits for commands through a package-level monitor.
// Everything that matters to runsc here (-direct, -background) would have gone through
// go-runc's ExtraArgs anyway.
package runsc

import (
	"bytes"
	"context"
	"debug/buildinfo"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"os"
	"os/exec"
	"strconv"
	"strings"
	"syscall"
	"time"

	"readie.dev/pipeline/pkg/exitcode"
)

// DefaultCommandTimeout bounds the commands that should return at once when
// Runsc.CommandTimeout is zero.
const DefaultCommandTimeout = 30 * time.Second

// ErrFailed wraps every failed runsc command; the error also names the command, the
// container and what runsc said.
var ErrFailed = errors.New("runsc failed")

// ExitError is a command that exited with a non-zero status. For Run and a Restore without
// Detach, that is the sandbox process's own exit status (128+N for one killed by signal N).
// exitcode.Of reads it.
type ExitError struct{ Status int }

func (e *ExitError) Error() string { return "exit status " + strconv.Itoa(e.Status) }

// ExitCode returns the command's exit status.
func (e *ExitError) ExitCode() int { return e.Status }

// Runsc is one runsc binary with the settings every command shares. The zero CommandTimeout
// means DefaultCommandTimeout.
type Runsc struct {
	Path string // the runsc binary
	// Root is --root, runsc's state directory. A private one keeps `runsc list` to the
	// caller's sandboxes.
	Root string
	// GlobalArgs go before every command: the flags that shape a sandbox (--network,
	// --overlay2, --host-uds, ...). A restore needs the capture's: a manifest records them as
	// runsc_flags.
	GlobalArgs []string
	// DebugLog, when set, turns on --debug and sends the logs there (--debug-log: a
	// directory when it ends in "/").
	DebugLog string
	// CommandTimeout bounds create, start, kill, delete, state, list and --version. Run and
	// Restore are bounded by their context alone: how long a process runs is the caller's.
	CommandTimeout time.Duration
	// HelpersDir, when set, is where runsc looks for its helpers instead of gvisor-bin/ beside
	// its binary (ResolvedHelpersDir). An empty directory boots sandboxes as runsc did before gVisor
	// shipped helpers: with runsc itself as the sentry, and no prewarmer.
	HelpersDir string
}

// IO is the stdio a command hands to the sandbox's process (run, create, and a restore that
// makes its own sandbox); a nil field is /dev/null. They must be files: the sandbox outlives
// a create or a detached restore, and os/exec would otherwise wait for it through its copying
// goroutines. A restore must give the process stdio of the kinds it had when it was saved
// (seen here: an executor captured with a pipe as stderr and restored with /dev/null there
// never answered; one captured with a regular file stopped at once): the pipeline captures
// with /dev/null as stdin and pipes as stdout and stderr, so give a restore of its outputs
// pipes for both. Never a regular file: a restored process writes to one at the offset it had
// when it was saved. runsc's own error messages need none of them: the driver reads those
// through --log-fd.
type IO struct {
	Stdin, Stdout, Stderr *os.File
}

// CreateOpts are the options of create and run.
type CreateOpts struct {
	IO IO
	// PidFile is --pid-file: where runsc writes the sandbox process's pid.
	PidFile string
	// ExtraArgs are further flags of the command, as runsc spells them.
	ExtraArgs []string
}

func (o *CreateOpts) args() []string {
	var out []string
	if o.PidFile != "" {
		out = append(out, "--pid-file="+o.PidFile)
	}
	return append(out, o.ExtraArgs...)
}

// RestoreOpts are the options of restore.
type RestoreOpts struct {
	// IO is the process's stdio when the restore makes the sandbox. Onto a sandbox made by
	// Create, leave Stdout empty: the process keeps the stdio it was created with.
	IO IO
	// ImagePath is --image-path: the directory of checkpoint.img, pages.img and pages_meta.img.
	ImagePath string
	// Detach is -detach: return once the process runs again instead of waiting for its exit.
	Detach bool
	// ExtraArgs are further flags, e.g. a manifest's restore_flags ("-direct", "-background").
	ExtraArgs []string
}

func (o *RestoreOpts) args() []string {
	out := []string{"--image-path=" + o.ImagePath}
	if o.Detach {
		out = append(out, "--detach")
	}
	return append(out, o.ExtraArgs...)
}

// KillOpts are the options of kill.
type KillOpts struct {
	All bool // --all: every process of the container, not only its init
}

func (o *KillOpts) args() []string {
	if o != nil && o.All {
		return []string{"--all"}
	}
	return nil
}

// DeleteOpts are the options of delete.
type DeleteOpts struct {
	// Force is --force: kill what still runs; it also succeeds for a container already gone.
	Force bool
}

func (o *DeleteOpts) args() []string {
	if o != nil && o.Force {
		return []string{"--force"}
	}
	return nil
}

// Container is a sandbox as `runsc state` and `runsc list` report it.
type Container struct {
	ID string `json:"id"`
	// Status is "creating", "created", "running", "paused" or "stopped".
	Status string `json:"status"`
	// Pid is the sandbox process's pid as the pid namespace that made it saw it.
	Pid    int    `json:"pid"`
	Bundle string `json:"bundle"`
}

// Version returns runsc's version string, e.g. "readie-20260905-160fafc42237": the first line
// of `runsc --version` without "runsc version". Restore accepts an image only from the exact
// same string.
func (r *Runsc) Version(ctx context.Context) (string, error) {
	// Without the global flags: --version needs none, and a DebugLog would log it.
	ctx, cancel := r.call("", "--version").bounded(ctx)
	defer cancel()
	var stderr bytes.Buffer
	cmd := exec.CommandContext(ctx, r.Path, "--version")
	cmd.Stderr = &stderr
	cmd.WaitDelay = pipeGrace
	out, err := cmd.Output()
	err = ignoreHeldPipes(err)
	if err != nil {
		if ctx.Err() != nil {
			return "", fmt.Errorf("%w: %s --version: %w: %w", ErrFailed, r.Path, context.Cause(ctx), ctx.Err())
		}
		return "", fmt.Errorf("%w: %s --version: %w: %s", ErrFailed, r.Path, err, strings.TrimSpace(stderr.String()))
	}
	line, _, _ := strings.Cut(string(out), "\n")
	version := strings.TrimSpace(strings.TrimPrefix(line, "runsc version"))
	if version == "" || version == line {
		return "", fmt.Errorf("%w: %s --version printed %q, not \"runsc version ...\"", ErrFailed, r.Path, line)
	}
	return version, nil
}

// Module returns the Go module path and version the runsc binary was built from.
func (r *Runsc) Module() (path, version string, err error) {
	info, err := buildinfo.ReadFile(r.Path)
	if err != nil {
		return "", "", fmt.Errorf("read build info of %s: %w", r.Path, err)
	}
	return info.Main.Path, info.Main.Version, nil
}

// List returns the containers under Root; none when Root does not exist.
func (r *Runsc) List(ctx context.Context) ([]Container, error) {
	if _, err := os.Stat(r.Root); errors.Is(err, os.ErrNotExist) {
		return nil, nil
	}
	out, err := r.call("", "list", "--format=json").output(ctx)
	if err != nil {
		return nil, err
	}
	var cs []Container // runsc prints null for none
	if err := json.Unmarshal(out, &cs); err != nil {
		return nil, fmt.Errorf("%w: list: %w", ErrFailed, err)
	}
	return cs, nil
}

// State returns the container id as runsc reports it.
func (r *Runsc) State(ctx context.Context, id string) (*Container, error) {
	out, err := r.call(id, "state", id).output(ctx)
	if err != nil {
		return nil, err
	}
	var c Container
	if err := json.Unmarshal(out, &c); err != nil {
		return nil, fmt.Errorf("%w: state %s: %w", ErrFailed, id, err)
	}
	return &c, nil
}

// Create makes the sandbox of bundle (its config.json) without starting its process, so that
// a later Start or Restore does not pay for the sandbox's start-up.
func (r *Runsc) Create(ctx context.Context, id, bundle string, opts *CreateOpts) error {
	if opts == nil {
		opts = &CreateOpts{}
	}
	args := append([]string{"create", "--bundle=" + bundle}, opts.args()...)
	_, err := r.call(id, append(args, id)...).run(ctx, true, opts.IO)
	return err
}

// Start starts the process of a sandbox made by Create.
func (r *Runsc) Start(ctx context.Context, id string) error {
	_, err := r.call(id, "start", id).run(ctx, true, IO{})
	return err
}

// Run makes the sandbox of bundle and runs its process in the foreground (`runsc run`); it
// returns the process's exit status, with an *ExitError when it is not 0.
func (r *Runsc) Run(ctx context.Context, id, bundle string, opts *CreateOpts) (int, error) {
	if opts == nil {
		opts = &CreateOpts{}
	}
	args := append([]string{"run", "--bundle=" + bundle}, opts.args()...)
	return r.call(id, append(args, id)...).run(ctx, false, opts.IO)
}

// Restore restores the checkpoint in opts.ImagePath into sandbox id: one made by Create, or
// a new one from bundle. Without Detach it waits for the restored process and returns its
// exit status, with an *ExitError when it is not 0.
func (r *Runsc) Restore(ctx context.Context, id, bundle string, opts *RestoreOpts) (int, error) {
	if opts == nil || opts.ImagePath == "" {
		return -1, fmt.Errorf("%w: restore %s: no image path", ErrFailed, id)
	}
	args := append([]string{"restore", "--bundle=" + bundle}, opts.args()...)
	return r.call(id, append(args, id)...).run(ctx, false, opts.IO)
}

// Kill sends sig to the sandbox's process (`runsc kill`).
func (r *Runsc) Kill(ctx context.Context, id string, sig syscall.Signal, opts *KillOpts) error {
	args := append([]string{"kill"}, opts.args()...)
	_, err := r.call(id, append(args, id, strconv.Itoa(int(sig)))...).run(ctx, true, IO{})
	return err
}

// Delete deletes the sandbox (`runsc delete`). It is bounded by CommandTimeout even when ctx
// has none; to clean up after ctx was cancelled, pass context.WithoutCancel(ctx).
func (r *Runsc) Delete(ctx context.Context, id string, opts *DeleteOpts) error {
	args := append([]string{"delete"}, opts.args()...)
	_, err := r.call(id, append(args, id)...).run(ctx, true, IO{})
	return err
}

func (r *Runsc) commandTimeout() time.Duration {
	if r.CommandTimeout > 0 {
		return r.CommandTimeout
	}
	return DefaultCommandTimeout
}

// call returns the invocation of runsc's command args[0] with args, about the container id (""
// for none).
func (r *Runsc) call(id string, args ...string) invocation {
	return invocation{r: r, id: id, args: args}
}

// invocation is one runsc command line: the binary's settings, the command and its arguments,
// and the container it is about, which its errors name.
type invocation struct {
	r    *Runsc
	id   string
	args []string
}

// globalArgs returns the flags before the command.
func (c invocation) globalArgs() []string {
	var args []string
	if c.r.Root != "" {
		args = append(args, "--root="+c.r.Root)
	}
	args = append(args, c.r.GlobalArgs...)
	if c.r.DebugLog != "" {
		args = append(args, "--debug", "--debug-log="+c.r.DebugLog)
	}
	return args
}

// command prepares runsc with the invocation's args, and the file where runsc writes its error
// messages (--log-fd: JSON lines, whatever the process's stderr is). runsc gets a process
// group of its own, so a Ctrl-C on the terminal reaches the caller, which decides what to
// delete, and not runsc; and TZ=UTC, because runsc's debug logs stamp lines with the local
// wall clock and no zone. The error log is a regular file, unlinked at once, not a pipe: the
// sandbox's processes inherit it, and a pipe would keep the command from being waited for.
func (c invocation) command(ctx context.Context, io IO) (*exec.Cmd, *os.File, error) {
	errorLog, err := os.CreateTemp("", "runsc-errors-")
	if err != nil {
		return nil, nil, fmt.Errorf("%w: a file for runsc's error messages: %w", ErrFailed, err)
	}
	os.Remove(errorLog.Name())
	cmd := exec.CommandContext(ctx, c.r.Path, append(append([]string{"--log-fd=3"}, c.globalArgs()...), c.args...)...)
	cmd.ExtraFiles = []*os.File{errorLog}
	cmd.SysProcAttr = &syscall.SysProcAttr{Setpgid: true}
	cmd.Env = append(os.Environ(), "TZ=UTC")
	if c.r.HelpersDir != "" {
		cmd.Env = append(cmd.Env, helpersDirEnv+"="+c.r.HelpersDir)
	}
	// A nil *os.File in an io.Reader or io.Writer would not be nil: set only those given.
	if io.Stdin != nil {
		cmd.Stdin = io.Stdin
	}
	if io.Stdout != nil {
		cmd.Stdout = io.Stdout
	}
	if io.Stderr != nil {
		cmd.Stderr = io.Stderr
	}
	return cmd, errorLog, nil
}

// pipeGrace is how long a command whose output is read into memory may keep its pipes open
// after it exits or its context ends: a process it left behind holding them must not hold the
// caller past its limit.
const pipeGrace = time.Second

// ignoreHeldPipes takes a command that exited 0 but left its pipes held (exec.ErrWaitDelay:
// the output it wrote before it exited is read) for a success.
func ignoreHeldPipes(err error) error {
	if errors.Is(err, exec.ErrWaitDelay) {
		return nil
	}
	return err
}

// bounded limits a command that should return at once; on expiry the error names the command
// and the limit.
func (c invocation) bounded(ctx context.Context) (context.Context, context.CancelFunc) {
	limit := c.r.commandTimeout()
	return context.WithTimeoutCause(ctx, limit, fmt.Errorf("runsc %s exceeded its timeout of %s", c.args[0], limit))
}

// output runs a command that hands nothing to a sandbox and returns its stdout.
func (c invocation) output(ctx context.Context) ([]byte, error) {
	ctx, cancel := c.bounded(ctx)
	defer cancel()
	cmd, errorLog, err := c.command(ctx, IO{})
	if err != nil {
		return nil, err
	}
	defer errorLog.Close()
	var stdout bytes.Buffer
	cmd.Stdout = &stdout
	cmd.WaitDelay = pipeGrace
	err = ignoreHeldPipes(cmd.Run())
	return stdout.Bytes(), c.fail(ctx, err, errorLog)
}

// run runs the command with io as its stdio and returns its exit status; bounded commands are
// limited by CommandTimeout.
func (c invocation) run(ctx context.Context, bounded bool, io IO) (int, error) {
	if bounded {
		var cancel context.CancelFunc
		ctx, cancel = c.bounded(ctx)
		defer cancel()
	}
	cmd, errorLog, err := c.command(ctx, io)
	if err != nil {
		return -1, err
	}
	defer errorLog.Close()
	err = cmd.Run()
	status := 0
	if err != nil {
		status, _ = exitcode.Of(err)
	}
	return status, c.fail(ctx, err, errorLog)
}

// maxWords is how much of runsc's error log an error quotes: its end, where runsc says why.
const maxWords = 8 << 10

// words returns the messages runsc wrote to its error log, joined.
func words(errorLog *os.File) string {
	size, err := errorLog.Seek(0, io.SeekEnd)
	if err != nil {
		return ""
	}
	start := max(size-maxWords, 0)
	buf := make([]byte, size-start)
	n, _ := errorLog.ReadAt(buf, start)
	var msgs []string
	for _, line := range strings.Split(string(buf[:n]), "\n") {
		var entry struct {
			Msg string `json:"msg"`
		}
		if json.Unmarshal([]byte(line), &entry) == nil && entry.Msg != "" {
			msgs = append(msgs, strings.TrimSpace(entry.Msg))
		} else if line = strings.TrimSpace(line); line != "" {
			msgs = append(msgs, line)
		}
	}
	return strings.Join(msgs, "; ")
}

// fail turns a command's error into one that names the command, the container and why: the
// context's cause when it ended (still matching context.DeadlineExceeded or
// context.Canceled), the exit status, and runsc's own words.
func (c invocation) fail(ctx context.Context, err error, errorLog *os.File) error {
	if err == nil {
		return nil
	}
	what := c.args[0]
	if c.id != "" {
		what += " " + c.id
	}
	if ctx.Err() != nil {
		if cause := context.Cause(ctx); cause != ctx.Err() {
			return fmt.Errorf("%w: %s: %w: %w", ErrFailed, what, cause, ctx.Err())
		}
		return fmt.Errorf("%w: %s: %w", ErrFailed, what, ctx.Err())
	}
	if status, ok := exitcode.Of(err); ok {
		err = &ExitError{Status: status}
	}
	if w := words(errorLog); w != "" {
		return fmt.Errorf("%w: %s: %w: %s", ErrFailed, what, err, w)
	}
	return fmt.Errorf("%w: %s: %w", ErrFailed, what, err)
}
