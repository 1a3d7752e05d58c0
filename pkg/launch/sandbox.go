// Package launch runs sandboxes of the executor's shape through their life cycle, on top of
// the stateless runsc driver (pkg/runsc) and the spec's shape (pkg/sandbox): IDs that carry
// the owner's lease, a bundle per sandbox, the process's stdout and stderr copied through
// pipes into bounded log files, deletion exactly once on every path with a failed delete
// always reported, the end of the stderr log for error messages, and sandboxes started and
// timed through one call (Launcher, TimedCall of a Call).
//
// pkg/capture and pkg/measure are built on it; a build job or a benchmark can use it on its
// own. A worker restoring from a pool needs only pkg/runsc, pkg/sandbox and pkg/executorproto.
package launch

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"time"

	specs "github.com/opencontainers/runtime-spec/specs-go"

	"readie.dev/pipeline/pkg/runsc"
	"readie.dev/pipeline/pkg/sandbox"
)

// Runtime is the pipeline's runsc: one binary with a private state root and the flags that
// shape its sandboxes.
type Runtime struct {
	Path  string // the runsc binary
	Root  string // --root: private, so `runsc list` shows only this pipeline's sandboxes
	Flags sandbox.Flags
	// DebugLogDir, when set, turns on runsc's --debug and writes its logs there.
	DebugLogDir string
	// HelpersDir, when set, is where runsc looks for its helpers (runsc.Runsc.HelpersDir).
	HelpersDir string
	// CommandTimeout bounds runsc commands that should return at once (create, start, kill,
	// delete, state, list). Zero means runsc.DefaultCommandTimeout.
	CommandTimeout time.Duration
	// Lease is the owner's (a run's): the IDs of its sandboxes carry it (NewID), so that
	// another run can tell them from the leftovers of a run that is over.
	Lease Lease
	// OutputLimit bounds each sandbox's stdout and stderr, on disk and in memory: the first and
	// last halves are kept, the rest counted (boundedCopy). Zero means DefaultOutputLimit.
	OutputLimit int64
}

// OutputLimitOrDefault returns OutputLimit, or DefaultOutputLimit when it is zero.
func (r *Runtime) OutputLimitOrDefault() int64 {
	if r.OutputLimit > 0 {
		return r.OutputLimit
	}
	return DefaultOutputLimit
}

// Driver is the stateless runsc driver with this runtime's settings.
func (r *Runtime) Driver() *runsc.Runsc {
	d := &runsc.Runsc{Path: r.Path, Root: r.Root, GlobalArgs: r.Flags.Args(), CommandTimeout: r.CommandTimeout, HelpersDir: r.HelpersDir}
	if r.DebugLogDir != "" {
		d.DebugLog = strings.TrimSuffix(r.DebugLogDir, "/") + "/"
	}
	return d
}

// Check reports whether the runsc binary exists and runs.
func (r *Runtime) Check(ctx context.Context) error {
	if _, err := os.Stat(r.Path); err != nil {
		return fmt.Errorf("runsc not found at %s (run `make runsc`): %w", r.Path, err)
	}
	_, err := r.Version(ctx)
	return err
}

// Version returns runsc's version string (runsc.Runsc.Version).
func (r *Runtime) Version(ctx context.Context) (string, error) { return r.Driver().Version(ctx) }

// Module returns the Go module path and version the runsc binary was built from.
func (r *Runtime) Module() (path, version string, err error) { return r.Driver().Module() }

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
	cs, err := r.Driver().List(ctx)
	if err != nil {
		return nil, err
	}
	states := make(map[string]string, len(cs))
	for _, c := range cs {
		states[c.ID] = c.Status
	}
	return states, nil
}

// Sandbox is one runsc container of the pipeline: its bundle, its host directory and its
// stdio logs. It is deleted exactly once (Delete).
type Sandbox struct {
	ID      string
	Bundle  string // holds config.json
	HostDir string // bind-mounted on sandbox.ExecutorDir
	Stdout  string // log file of the process's stdout
	Stderr  string // log file of the process's stderr

	driver *runsc.Runsc
	stdio  *stdio
	// outputLimit bounds each of Stdout and Stderr (boundedCopy).
	outputLimit int64
	mu          sync.Mutex
	started     bool // a runsc command that may have created state has run
	deleted     bool
}

// SocketPath returns the executor's socket as seen from the host.
func (s *Sandbox) SocketPath() string { return filepath.Join(s.HostDir, sandbox.SocketName) }

// NewSandbox writes spec into a fresh bundle under workDir/id; the process's stdout and
// stderr will be logged there. The spec's bind mount source must already be hostDir, which is
// given to the spec's user (sandbox.PrepareHostDir). An id CheckID refuses changes nothing on
// disk.
func (r *Runtime) NewSandbox(id, workDir, hostDir string, spec *specs.Spec) (*Sandbox, error) {
	if err := CheckID(id); err != nil {
		return nil, err
	}
	if hostDir != "" && spec.Process != nil {
		if err := sandbox.PrepareHostDir(hostDir, spec.Process.User); err != nil {
			return nil, err
		}
	}
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
		ID: id, Bundle: bundle, HostDir: hostDir, driver: r.Driver(), outputLimit: r.OutputLimitOrDefault(),
		Stdout: filepath.Join(bundle, "stdout.log"),
		Stderr: filepath.Join(bundle, "stderr.log"),
	}
	return s, nil
}

// Run runs the sandbox in the foreground (`runsc run`) and returns the process's exit status;
// a status other than 0 comes with a *runsc.ExitError.
func (s *Sandbox) Run(ctx context.Context) (int, error) {
	if err := s.begin(); err != nil {
		return -1, err
	}
	status, err := s.driver.Run(ctx, s.ID, s.Bundle, &runsc.CreateOpts{IO: s.stdio.childEnds()})
	s.stdio.closeChildEnds()
	return status, err
}

// Create creates the sandbox without starting its process (`runsc create`), so a later
// restore does not pay for sandbox start-up.
func (s *Sandbox) Create(ctx context.Context) error {
	if err := s.begin(); err != nil {
		return err
	}
	err := s.driver.Create(ctx, s.ID, s.Bundle, &runsc.CreateOpts{IO: s.stdio.childEnds()})
	s.stdio.closeChildEnds()
	return err
}

// Start starts the process of a sandbox made by Create.
func (s *Sandbox) Start(ctx context.Context) error { return s.driver.Start(ctx, s.ID) }

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
	opts := &runsc.RestoreOpts{ImagePath: o.ImageDir, Detach: o.Detach, ExtraArgs: o.Flags}
	if s.stdio.attached() {
		// A sandbox made by Create already has its stdio, and runsc restore then writes on a
		// stderr of its own: keep it beside the logs, where a failed run's kept directory finds
		// it (the driver's error quotes runsc's messages already).
		f, err := os.OpenFile(filepath.Join(s.Bundle, "restore-stderr.log"), os.O_CREATE|os.O_WRONLY|os.O_TRUNC, 0o600)
		if err != nil {
			return -1, err
		}
		defer f.Close()
		opts.IO = runsc.IO{Stderr: f}
		return s.driver.Restore(ctx, s.ID, s.Bundle, opts)
	}
	opts.IO = s.stdio.childEnds()
	status, err := s.driver.Restore(ctx, s.ID, s.Bundle, opts)
	s.stdio.closeChildEnds()
	return status, err
}

// Kill sends sig to the sandbox's process (`runsc kill`).
func (s *Sandbox) Kill(ctx context.Context, sig syscall.Signal) error {
	return s.driver.Kill(ctx, s.ID, sig, nil)
}

// State returns the sandbox's status as runsc reports it ("created", "running", "stopped").
func (s *Sandbox) State(ctx context.Context) (string, error) {
	c, err := s.driver.State(ctx, s.ID)
	if err != nil {
		return "", err
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
	io, err := newStdio(s.Stdout, s.Stderr, s.outputLimit)
	if err != nil {
		return err
	}
	s.stdio = io
	return nil
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
		// --force also makes runsc succeed for a sandbox that is already gone.
		if err := s.driver.Delete(context.WithoutCancel(ctx), s.ID, &runsc.DeleteOpts{Force: true}); err != nil {
			errs = append(errs, err)
		}
	}
	if s.stdio != nil {
		errs = append(errs, s.stdio.wait(5*time.Second))
	}
	return errors.Join(errs...)
}

// Tail returns the last n lines of the process's stderr, for error messages, after a line
// saying how much of its stdout and stderr the output limit dropped, if any. The log is only
// complete after Delete.
func (s *Sandbox) Tail(n int) string {
	tail := tailFile(s.Stderr, n)
	stdout, stderr := s.Dropped()
	if stdout == 0 && stderr == 0 {
		return tail
	}
	note := fmt.Sprintf("[readie: the sandbox wrote more than limits.sandbox_output (%s) allows: %s of its stdout and %s of its stderr dropped from the middle of their logs]",
		mib(s.outputLimit), mib(stdout), mib(stderr))
	if tail == "" {
		return note
	}
	return note + "\n" + tail
}

// Dropped returns how many bytes of the process's stdout and stderr the output limit left out
// of their logs; final after Delete.
func (s *Sandbox) Dropped() (stdout, stderr int64) {
	s.mu.Lock()
	std := s.stdio
	s.mu.Unlock()
	if std == nil {
		return 0, 0
	}
	return std.dropped[0].Load(), std.dropped[1].Load()
}

// stdio gives the sandbox pipes (a restored process with a regular file for stdout would write
// at its old offset) and copies what comes out of them into log files, each bounded by limit.
type stdio struct {
	outR, outW, errR, errW *os.File
	done                   chan error
	closeOnce              sync.Once
	handedOver             atomic.Bool
	// dropped counts what the limit left out of the stdout and the stderr log.
	dropped [2]atomic.Int64
}

func newStdio(stdoutPath, stderrPath string, limit int64) (*stdio, error) {
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
	for i, p := range []struct {
		r    *os.File
		dest *os.File
		what string
	}{{s.outR, outFile, "stdout"}, {s.errR, errFile, "stderr"}} {
		go func() {
			dropped, err := boundedCopy(p.dest, p.r, limit, p.what)
			s.dropped[i].Store(dropped)
			p.r.Close()
			err = errors.Join(err, p.dest.Close())
			s.done <- err
		}()
	}
	return s, nil
}

// childEnds are the write ends, for the runsc command that hands them to the process.
func (s *stdio) childEnds() runsc.IO { return runsc.IO{Stdout: s.outW, Stderr: s.errW} }

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
