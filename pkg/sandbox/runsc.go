package sandbox

import (
	"context"
	"debug/buildinfo"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"time"

	runc "github.com/containerd/go-runc"
	specs "github.com/opencontainers/runtime-spec/specs-go"

	"readie.dev/pipeline/internal/lease"
)

// Flags are runsc's global flags that shape a sandbox. A restore must use the same ones as
// the capture, so the manifest records them.
type Flags struct {
	Network string // --network: "none" keeps sandboxes off every network
	Overlay string // --overlay2: "none" with a read-only root
	// HostUDS is --host-uds: "create" lets the executor's bind() of its socket reach the host;
	// with runsc's default the gofer refuses it and a dial from the host waits forever.
	HostUDS string
	// Extra are further global flags, e.g. "--ignore-cgroups".
	Extra []string
}

// Args returns the flags as runsc arguments.
func (f Flags) Args() []string {
	return append([]string{"--network=" + f.Network, "--overlay2=" + f.Overlay, "--host-uds=" + f.HostUDS}, f.Extra...)
}

// DefaultFlags are the global flags the pipeline uses unless its config says otherwise.
func DefaultFlags() Flags {
	return Flags{Network: "none", Overlay: "none", HostUDS: "create"}
}

// Runtime drives one runsc binary with a private state root.
type Runtime struct {
	Path  string // the runsc binary
	Root  string // --root: private, so `runsc list` shows only this pipeline's sandboxes
	Flags Flags
	// DebugLogDir, when set, turns on runsc's --debug and writes its logs there.
	DebugLogDir string
	// CommandTimeout bounds runsc commands that should return at once (create, start, kill,
	// delete, state, list). Zero means 30 s.
	CommandTimeout time.Duration
	// Lease is the run's: the IDs of its sandboxes carry it (NewID), so that another run can
	// tell them from the leftovers of a run that is over (RemoveOrphans).
	Lease *lease.Lease
}

// ErrRunsc wraps every failed runsc command.
var ErrRunsc = errors.New("runsc failed")

func (r *Runtime) commandTimeout() time.Duration {
	if r.CommandTimeout > 0 {
		return r.CommandTimeout
	}
	return 30 * time.Second
}

// commandContext bounds a runsc command that should return at once; on expiry the error
// names the command and the limit.
func (r *Runtime) commandContext(ctx context.Context, command string) (context.Context, context.CancelFunc) {
	limit := r.commandTimeout()
	return context.WithTimeoutCause(ctx, limit, fmt.Errorf("runsc %s exceeded its timeout of %s", command, limit))
}

// GlobalArgs are the global flags every runsc command of this runtime gets.
func (r *Runtime) GlobalArgs() []string {
	args := r.Flags.Args()
	if r.DebugLogDir != "" {
		args = append(args, "--debug", "--debug-log="+strings.TrimSuffix(r.DebugLogDir, "/")+"/")
	}
	return args
}

// utcLogs runs runsc with TZ=UTC: its debug logs stamp lines with the local wall clock and no
// zone, and the restore breakdown reads them as UTC, whatever the host's zone.
func utcLogs(ctx context.Context) context.Context { return runc.WithExtraEnv(ctx, "TZ=UTC") }

func (r *Runtime) client() *runc.Runc {
	return &runc.Runc{
		Command:   r.Path,
		Root:      r.Root,
		Setpgid:   true, // Ctrl-C on the terminal reaches the pipeline, which deletes sandboxes itself
		ExtraArgs: r.GlobalArgs(),
	}
}

// Check reports whether the runsc binary exists and runs.
func (r *Runtime) Check(ctx context.Context) error {
	if _, err := os.Stat(r.Path); err != nil {
		return fmt.Errorf("runsc not found at %s (run `make runsc`): %w", r.Path, err)
	}
	_, err := r.Version(ctx)
	return err
}

// Version returns the first line of `runsc --version`, e.g. "runsc version readie-...".
// go-runc's Version does not parse runsc's output, so it is read here.
func (r *Runtime) Version(ctx context.Context) (string, error) {
	ctx, cancel := r.commandContext(ctx, "--version")
	defer cancel()
	out, err := exec.CommandContext(ctx, r.Path, "--version").Output()
	if err != nil {
		return "", fmt.Errorf("%w: %s --version: %w", ErrRunsc, r.Path, err)
	}
	line, _, _ := strings.Cut(string(out), "\n")
	return strings.TrimSpace(strings.TrimPrefix(line, "runsc version")), nil
}

// Module returns the Go module path and version the runsc binary was built from.
func (r *Runtime) Module() (path, version string, err error) {
	info, err := buildinfo.ReadFile(r.Path)
	if err != nil {
		return "", "", fmt.Errorf("read build info of %s: %w", r.Path, err)
	}
	return info.Main.Path, info.Main.Version, nil
}

// List returns the IDs of the sandboxes under this runtime's root.
func (r *Runtime) List(ctx context.Context) ([]string, error) {
	states, err := r.States(ctx)
	if err != nil {
		return nil, err
	}
	ids := make([]string, 0, len(states))
	for id := range states {
		ids = append(ids, id)
	}
	slices.Sort(ids)
	return ids, nil
}

// States returns the status of every sandbox under this runtime's root, by ID ("created",
// "running", "stopped").
func (r *Runtime) States(ctx context.Context) (map[string]string, error) {
	ctx, cancel := r.commandContext(ctx, "list")
	defer cancel()
	if _, err := os.Stat(r.Root); errors.Is(err, os.ErrNotExist) {
		return map[string]string{}, nil
	}
	cs, err := r.client().List(ctx)
	if err != nil {
		return nil, fmt.Errorf("%w: list: %w", ErrRunsc, err)
	}
	states := make(map[string]string, len(cs))
	for _, c := range cs {
		states[c.ID] = c.Status
	}
	return states, nil
}

// Sandbox is one runsc container: its bundle, its host directory and its stdio logs.
type Sandbox struct {
	ID      string
	Bundle  string // holds config.json
	HostDir string // bind-mounted on ExecutorDir
	Stdout  string // log file of the process's stdout
	Stderr  string // log file of the process's stderr

	rt      *Runtime
	stdio   *stdio
	mu      sync.Mutex
	started bool // a runsc command that may have created state has run
	deleted bool
}

// SocketPath is the executor's socket as seen from the host.
func (s *Sandbox) SocketPath() string { return filepath.Join(s.HostDir, SocketName) }

// NewSandbox writes spec into a fresh bundle under workDir/id; the process's stdout and
// stderr will be logged there. The spec's bind mount source must already be hostDir.
func (r *Runtime) NewSandbox(id, workDir, hostDir string, spec *specs.Spec) (*Sandbox, error) {
	bundle := filepath.Join(workDir, id)
	if err := os.MkdirAll(bundle, 0o700); err != nil {
		return nil, err
	}
	data, err := json.MarshalIndent(spec, "", "  ")
	if err != nil {
		return nil, err
	}
	if err := os.WriteFile(filepath.Join(bundle, "config.json"), data, 0o600); err != nil {
		return nil, err
	}
	s := &Sandbox{
		ID: id, Bundle: bundle, HostDir: hostDir, rt: r,
		Stdout: filepath.Join(bundle, "stdout.log"),
		Stderr: filepath.Join(bundle, "stderr.log"),
	}
	return s, nil
}

// Run runs the sandbox in the foreground (`runsc run`) and returns the process's exit status.
func (s *Sandbox) Run(ctx context.Context) (int, error) {
	if err := s.begin(); err != nil {
		return -1, err
	}
	status, err := s.rt.client().Run(utcLogs(ctx), s.ID, s.Bundle, &runc.CreateOpts{IO: s.stdio})
	s.stdio.closeChildEnds()
	return status, s.wrap(ctx, "run", err)
}

// Create creates the sandbox without starting its process (`runsc create`), so a later
// restore does not pay for sandbox start-up.
func (s *Sandbox) Create(ctx context.Context) error {
	if err := s.begin(); err != nil {
		return err
	}
	ctx, cancel := s.rt.commandContext(ctx, "create")
	defer cancel()
	err := s.rt.client().Create(utcLogs(ctx), s.ID, s.Bundle, &runc.CreateOpts{IO: s.stdio})
	s.stdio.closeChildEnds()
	return s.wrap(ctx, "create", err)
}

// Start starts the process of a sandbox made by Create.
func (s *Sandbox) Start(ctx context.Context) error {
	ctx, cancel := s.rt.commandContext(ctx, "start")
	defer cancel()
	return s.wrap(ctx, "start", s.rt.client().Start(utcLogs(ctx), s.ID))
}

// RestoreOptions are the per-restore flags.
type RestoreOptions struct {
	ImageDir string
	// Flags are passed through as they are, e.g. "-direct", "-background".
	Flags []string
	// Detach returns once the process runs again instead of waiting for it to exit.
	Detach bool
}

// Restore restores the checkpoint in ImageDir into this sandbox (`runsc restore`). Without
// Detach it waits for the restored process and returns its exit status.
func (s *Sandbox) Restore(ctx context.Context, o RestoreOptions) (int, error) {
	if err := s.begin(); err != nil {
		return -1, err
	}
	opts := &runc.RestoreOpts{
		CheckpointOpts: runc.CheckpointOpts{ImagePath: o.ImageDir},
		ExtraArgs:      o.Flags,
	}
	// A sandbox made by Create already has its stdio, and runsc restore then says why it
	// failed on a stderr of its own: keep it for the error.
	var runscStderr *commandStderr
	if s.stdio.attached() {
		var err error
		if runscStderr, err = newCommandStderr(filepath.Join(s.Bundle, "restore-stderr.log")); err != nil {
			return -1, err
		}
		defer runscStderr.Close()
		opts.IO = runscStderr
	} else {
		opts.IO = s.stdio
	}
	if o.Detach {
		opts.ExtraArgs = append([]string{"-detach"}, o.Flags...)
	}
	status, err := s.rt.client().Restore(utcLogs(ctx), s.ID, s.Bundle, opts)
	s.stdio.closeChildEnds()
	if err != nil && runscStderr != nil {
		if words := runscStderr.words(); words != "" {
			err = fmt.Errorf("%w: %s", err, words)
		}
	}
	return status, s.wrap(ctx, "restore", err)
}

// commandStderr gives one runsc command a stderr of its own and no other stdio. It is a file,
// not a pipe: a process runsc leaves behind may hold it open, and a pipe would keep the
// command from being waited for.
type commandStderr struct{ file *os.File }

var _ runc.IO = (*commandStderr)(nil)

func newCommandStderr(path string) (*commandStderr, error) {
	f, err := os.OpenFile(path, os.O_CREATE|os.O_RDWR|os.O_TRUNC, 0o600)
	if err != nil {
		return nil, err
	}
	return &commandStderr{file: f}, nil
}

// words returns what the command wrote, trimmed.
func (c *commandStderr) words() string {
	data, _ := os.ReadFile(c.file.Name())
	return strings.TrimSpace(string(data))
}

func (c *commandStderr) Stdin() io.WriteCloser  { return nil }
func (c *commandStderr) Stdout() io.ReadCloser  { return nil }
func (c *commandStderr) Stderr() io.ReadCloser  { return nil }
func (c *commandStderr) Close() error           { return c.file.Close() }
func (c *commandStderr) CloseAfterStart() error { return nil }
func (c *commandStderr) Set(cmd *exec.Cmd)      { cmd.Stderr = c.file }

// Kill sends sig to the sandbox's process (`runsc kill`).
func (s *Sandbox) Kill(ctx context.Context, sig syscall.Signal) error {
	ctx, cancel := s.rt.commandContext(ctx, "kill")
	defer cancel()
	return s.wrap(ctx, "kill", s.rt.client().Kill(utcLogs(ctx), s.ID, int(sig), nil))
}

// State returns the sandbox's status as runsc reports it ("created", "running", "stopped").
func (s *Sandbox) State(ctx context.Context) (string, error) {
	ctx, cancel := s.rt.commandContext(ctx, "state")
	defer cancel()
	c, err := s.rt.client().State(utcLogs(ctx), s.ID)
	if err != nil {
		return "", s.wrap(ctx, "state", err)
	}
	return c.Status, nil
}

// begin opens the stdio pipes once, before the first runsc command that starts a process.
func (s *Sandbox) begin() error {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.deleted {
		return fmt.Errorf("sandbox %s: already deleted", s.ID)
	}
	s.started = true
	if s.stdio != nil {
		return nil
	}
	io, err := newStdio(s.Stdout, s.Stderr)
	if err != nil {
		return err
	}
	s.stdio = io
	return nil
}

func (s *Sandbox) wrap(ctx context.Context, command string, err error) error {
	if err == nil {
		return nil
	}
	if ctx.Err() != nil {
		// The cause says which step ran out of time and its limit; ctx.Err() keeps the error
		// matchable with errors.Is(err, context.DeadlineExceeded) or context.Canceled.
		if cause := context.Cause(ctx); cause != ctx.Err() {
			return fmt.Errorf("%w: %s %s: %w: %w", ErrRunsc, command, s.ID, cause, ctx.Err())
		}
		return fmt.Errorf("%w: %s %s: %w", ErrRunsc, command, s.ID, ctx.Err())
	}
	return fmt.Errorf("%w: %s %s: %w", ErrRunsc, command, s.ID, err)
}

// Delete deletes the sandbox (`runsc delete --force`, which kills what still runs) and waits
// until its output is in the log files. It runs even when ctx is already cancelled (Ctrl-C
// must still clean up) and is safe to call again.
func (s *Sandbox) Delete(ctx context.Context) error {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.deleted {
		return nil
	}
	s.deleted = true
	var errs []error
	if s.started {
		ctx, cancel := s.rt.commandContext(context.WithoutCancel(ctx), "delete")
		defer cancel()
		c := s.rt.client()
		// --force also makes runsc succeed for a sandbox that is already gone.
		if err := c.Delete(ctx, s.ID, &runc.DeleteOpts{Force: true}); err != nil {
			errs = append(errs, s.wrap(ctx, "delete", err))
		}
	}
	if s.stdio != nil {
		errs = append(errs, s.stdio.wait(5*time.Second))
	}
	return errors.Join(errs...)
}

// Tail returns the last n lines of the process's stderr, for error messages. The log is only
// complete after Delete.
func (s *Sandbox) Tail(n int) string { return tailFile(s.Stderr, n) }

func tailFile(path string, n int) string {
	data, err := os.ReadFile(path)
	if err != nil {
		return ""
	}
	lines := strings.Split(strings.TrimRight(string(data), "\n"), "\n")
	if len(lines) > n {
		lines = lines[len(lines)-n:]
	}
	return strings.Join(lines, "\n")
}

// stdio gives the sandbox pipes (a restored process with a regular file for stdout would write
// at its old offset) and copies what comes out of them into log files.
type stdio struct {
	outR, outW, errR, errW *os.File
	done                   chan error
	closeOnce              sync.Once
	handedOver             atomic.Bool
}

var _ runc.IO = (*stdio)(nil)

func newStdio(stdoutPath, stderrPath string) (*stdio, error) {
	outFile, err := os.OpenFile(stdoutPath, os.O_CREATE|os.O_WRONLY|os.O_APPEND, 0o600)
	if err != nil {
		return nil, err
	}
	errFile, err := os.OpenFile(stderrPath, os.O_CREATE|os.O_WRONLY|os.O_APPEND, 0o600)
	if err != nil {
		outFile.Close()
		return nil, err
	}
	s := &stdio{done: make(chan error, 2)}
	if s.outR, s.outW, err = os.Pipe(); err == nil {
		s.errR, s.errW, err = os.Pipe()
	}
	if err != nil {
		outFile.Close()
		errFile.Close()
		return nil, err
	}
	for _, p := range []struct {
		r    *os.File
		dest *os.File
	}{{s.outR, outFile}, {s.errR, errFile}} {
		go func() {
			_, err := io.Copy(p.dest, p.r)
			p.r.Close()
			err = errors.Join(err, p.dest.Close())
			s.done <- err
		}()
	}
	return s, nil
}

func (s *stdio) Stdin() io.WriteCloser  { return nil }
func (s *stdio) Stdout() io.ReadCloser  { return s.outR }
func (s *stdio) Stderr() io.ReadCloser  { return s.errR }
func (s *stdio) Close() error           { s.closeChildEnds(); return nil }
func (s *stdio) CloseAfterStart() error { return nil } // the child ends are closed after the command
func (s *stdio) Set(cmd *exec.Cmd) {
	cmd.Stdin = nil
	cmd.Stdout = s.outW
	cmd.Stderr = s.errW
}

// attached reports whether a runsc command has already been given the pipes.
func (s *stdio) attached() bool { return s.handedOver.Load() }

// closeChildEnds closes the pipeline's copies of the write ends once runsc has them; the pipes
// reach EOF when the sandbox is gone too.
func (s *stdio) closeChildEnds() {
	s.closeOnce.Do(func() {
		s.handedOver.Store(true)
		s.outW.Close()
		s.errW.Close()
	})
}

func (s *stdio) wait(limit time.Duration) error {
	s.closeChildEnds()
	timer := time.NewTimer(limit)
	defer timer.Stop()
	var errs []error
	for range 2 {
		select {
		case err := <-s.done:
			errs = append(errs, err)
		case <-timer.C:
			// Something outside the sandbox still holds a write end; stop waiting for it.
			s.outR.Close()
			s.errR.Close()
			return fmt.Errorf("sandbox output still open %s after delete", limit)
		}
	}
	return errors.Join(errs...)
}

// ParseFlags reads back the global flags that Flags.Args wrote (a manifest's runsc_flags), so
// an existing output is restored with the flags it was captured with.
func ParseFlags(args []string) (Flags, error) {
	var f Flags
	for _, arg := range args {
		name, value, _ := strings.Cut(arg, "=")
		switch name {
		case "--network":
			f.Network = value
		case "--overlay2":
			f.Overlay = value
		case "--host-uds":
			f.HostUDS = value
		default:
			if !strings.HasPrefix(arg, "--") {
				return Flags{}, fmt.Errorf("runsc flag %q is not a --flag", arg)
			}
			f.Extra = append(f.Extra, arg)
		}
	}
	if f.Network == "" || f.Overlay == "" || f.HostUDS == "" {
		return Flags{}, fmt.Errorf("runsc flags %q lack --network, --overlay2 or --host-uds", args)
	}
	return f, nil
}
