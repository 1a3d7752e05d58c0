package launch

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"net"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"syscall"
	"time"

	specs "github.com/opencontainers/runtime-spec/specs-go"

	"readie.dev/pipeline/pkg/executorproto"
	"readie.dev/pipeline/pkg/runsc"
	"readie.dev/pipeline/pkg/sandbox"
)

// DefaultRestoreTimeout bounds a detached restore when Runtime.RestoreTimeout is zero: generous,
// since a detached restore of a large image on a loaded machine takes seconds, a hung one
// forever.
const DefaultRestoreTimeout = time.Minute

// Runtime is one runsc binary with a private state root and the flags that shape its
// sandboxes: the pipeline's, or a worker's (with an output's flags, Output.Flags).
type Runtime struct {
	Path  string // the runsc binary
	Root  string // --root: private, so `runsc list` shows only this owner's sandboxes
	Flags sandbox.Flags
	// DebugLogDir, when set, turns on runsc's --debug and writes its logs there.
	DebugLogDir string
	// HelpersDir, when set, is where runsc looks for its helpers (runsc.Runsc.HelpersDir).
	HelpersDir string
	// CommandTimeout bounds runsc commands that should return at once (create, start, kill,
	// delete, state, list). Zero means runsc.DefaultCommandTimeout.
	CommandTimeout time.Duration
	// RestoreTimeout bounds each detached restore (`runsc restore -detach`, which returns once
	// the executor runs again), whatever the caller's context. Zero means
	// DefaultRestoreTimeout.
	RestoreTimeout time.Duration
	// Lease is the owner's (a run's): the IDs of its sandboxes carry it (NewID), so that
	// another run can tell them from the leftovers of a run that is over. A worker with a root
	// of its own names its sandboxes with RandomIDs instead and needs none.
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

func (r *Runtime) restoreTimeout() time.Duration {
	if r.RestoreTimeout > 0 {
		return r.RestoreTimeout
	}
	return DefaultRestoreTimeout
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

// SpecFunc returns the spec of one sandbox whose executor mount's source is hostDir ("" for a
// sandbox made with SandboxOptions.NoHostDir). It is the one thing that differs between the
// sandboxes of a worker (an output's restore spec, sandbox.FillRestoreSpec) and the pipeline's
// (sandbox.Spec of the run, Launcher.Spec).
type SpecFunc func(hostDir string) (*specs.Spec, error)

// SandboxOptions say how NewSandbox makes a sandbox.
type SandboxOptions struct {
	Runtime *Runtime
	// WorkDir holds each sandbox's bundle (WorkDir/ID) and host directory (HostDir): an
	// absolute path of a directory that only its owner, this process's user (root), can enter,
	// mode 0700; made so when it does not exist, refused when others can enter it (unless
	// NoHostDir: the bundle itself is 0700). The host
	// directory where executor.sock appears is handed to the user the spec's process runs as,
	// whatever uid a restore spec names: it reaches nothing else on the host through it. Keep it
	// short: the socket's path must fit in a Unix socket address (108 bytes).
	WorkDir string
	// IDs names each sandbox; nil means Runtime's NewID (bound to its lease).
	IDs IDs
	// Spec gives each sandbox's spec, before anything of the sandbox is made on disk.
	Spec SpecFunc
	// NoHostDir makes a sandbox without a host directory (Spec gets ""): one that runs
	// something other than the executor, with no mount on sandbox.ExecutorDir.
	NoHostDir bool
	// Output, when set, also receives what the process writes on its stdout and stderr, line
	// by line, each line after the sandbox's ID: copied from the same bounded copy that writes
	// the logs (limits.sandbox_output), never holding the process up. Sandboxes write it from
	// goroutines of their own: it must be safe for concurrent use (an *os.File is; a
	// Restorer's is made so).
	Output io.Writer
	// Limits bound the sandbox's memory, pids and CPU on the host (sandbox.Limits.Apply to its
	// spec, cgroups path "/" + ID): the caller's, whatever the spec. A call or restore that
	// fails because the sandbox went past one says so (ErrMemoryLimit, ErrPidsLimit).
	Limits sandbox.Limits
	// KeepLogs leaves the bundle (config.json and the logs) in WorkDir when the sandbox is
	// deleted, for a caller that reads them afterwards (the pipeline keeps a failed set's
	// logs, and its scratch directory goes at the end of its run). Otherwise Delete removes
	// it; the host directory is removed either way.
	KeepLogs bool
}

// Image is what a start of the executor restores: a checkpoint's directory (checkpoint.img,
// pages.img, pages_meta.img) and the flags of `runsc restore` ("-direct", "-background"). The
// zero Image is a cold start: the executor starts from nothing, as a sandbox created for it
// does.
type Image struct {
	Dir   string
	Flags []string
}

// ErrUsed is returned by a second start of a sandbox's process (Run, RunRestored, Start): a
// sandbox runs one executor, once, and one that ran a call holds that call's state.
var ErrUsed = errors.New("sandbox already used")

// Sandbox is one runsc container: its bundle, its host directory and its stdio logs. Its life
// cycle is NewSandbox, then at most one Create (`runsc create`, never killed half-way), one
// start of its process (Run, RunRestored, Start or Open), and Delete, exactly once, on every
// path, whatever happened before.
type Sandbox struct {
	ID      string
	Bundle  string // holds config.json and the logs
	HostDir string // bind-mounted on sandbox.ExecutorDir; "" with SandboxOptions.NoHostDir
	Stdout  string // log file of the process's stdout
	Stderr  string // log file of the process's stderr
	// CreateTime is how long its `runsc create` took (zero before Create): what a pool takes
	// off a start.
	CreateTime time.Duration

	driver         *runsc.Runsc
	restoreTimeout time.Duration
	// outputLimit bounds each of Stdout and Stderr (boundedCopy).
	outputLimit int64
	output      io.Writer
	keepLogs    bool
	limits      sandbox.Limits
	cgroupsPath string

	mu       sync.Mutex
	stdio    *stdio
	started  bool // a runsc command that may have made state has run
	created  bool // Create ran
	notOurs  bool // the name is another sandbox's: never delete it
	used     bool
	deleted  bool
	delErr   error
	onDelete []func()
	// stderrTail is the end of the stderr log, kept when Delete removes the bundle.
	stderrTail string
	// pid and pidStart are the sandbox process's, from Create (Alive).
	pid      int
	pidStart string
}

// NewSandbox names a sandbox of set at step (o.IDs), asks o.Spec for its spec, then writes its
// bundle under o.WorkDir (compact JSON, config.json mode 0600, the directory 0700) and makes
// its host directory, handed to the spec's user (sandbox.PrepareHostDir). Nothing runs yet.
// Whatever fails leaves nothing of the sandbox on disk; an ID or a spec that is refused
// leaves nothing at all.
func NewSandbox(o SandboxOptions, set, step string) (*Sandbox, error) {
	if o.Runtime == nil || o.Spec == nil {
		return nil, errors.New("launch: SandboxOptions.Runtime and SandboxOptions.Spec are required")
	}
	if !filepath.IsAbs(o.WorkDir) {
		return nil, fmt.Errorf("launch: work dir %q is not an absolute path", o.WorkDir)
	}
	if err := o.Limits.Check(); err != nil {
		return nil, fmt.Errorf("launch: %w", err)
	}
	var ids IDs = o.Runtime
	if o.IDs != nil {
		ids = o.IDs
	}
	id, err := ids.NewID(set, step)
	if err != nil {
		return nil, err
	}
	if err := CheckID(id); err != nil { // whichever policy made it
		return nil, err
	}
	hostDir := ""
	if !o.NoHostDir {
		if hostDir, err = HostDir(o.WorkDir, id); err != nil {
			return nil, err
		}
	}
	spec, err := o.Spec(hostDir)
	if err != nil {
		return nil, fmt.Errorf("the spec of sandbox %s: %w", id, err)
	}
	if spec.Process == nil {
		return nil, fmt.Errorf("the spec of sandbox %s has no process", id)
	}
	o.Limits.Apply(spec, cgroupsPath(id))
	data, err := json.Marshal(spec)
	if err != nil {
		return nil, err
	}
	if err := privateDir(o.WorkDir, hostDir != ""); err != nil {
		return nil, err
	}
	s := &Sandbox{
		ID: id, Bundle: filepath.Join(o.WorkDir, id), HostDir: hostDir,
		driver: o.Runtime.Driver(), restoreTimeout: o.Runtime.restoreTimeout(), outputLimit: o.Runtime.OutputLimitOrDefault(),
		output: o.Output, keepLogs: o.KeepLogs, limits: o.Limits, cgroupsPath: cgroupsPath(id),
	}
	s.Stdout, s.Stderr = filepath.Join(s.Bundle, "stdout.log"), filepath.Join(s.Bundle, "stderr.log")
	if err := s.writeBundle(data, spec.Process.User); err != nil {
		os.RemoveAll(s.Bundle)
		if hostDir != "" {
			os.RemoveAll(hostDir)
		}
		return nil, err
	}
	return s, nil
}

// writeBundle makes the bundle (a name already taken is an error: os.Mkdir) with config.json,
// and the host directory, given to user.
func (s *Sandbox) writeBundle(config []byte, user specs.User) error {
	if err := os.Mkdir(s.Bundle, 0o700); err != nil {
		return fmt.Errorf("the bundle of sandbox %s: %w", s.ID, err)
	}
	if err := os.WriteFile(filepath.Join(s.Bundle, "config.json"), config, 0o600); err != nil {
		return err
	}
	if s.HostDir == "" {
		return nil
	}
	if err := os.Mkdir(s.HostDir, 0o700); err != nil {
		return fmt.Errorf("the host directory of sandbox %s: %w", s.ID, err)
	}
	return sandbox.PrepareHostDir(s.HostDir, user)
}

// privateDir makes dir (mode 0700) when it does not exist and, for hostDirs, refuses one that
// is not private (CheckPrivateDir): the host directories of sandboxes live in it, each given to
// whatever user its spec names.
func privateDir(dir string, hostDirs bool) error {
	if err := os.MkdirAll(dir, 0o700); err != nil {
		return fmt.Errorf("launch: work dir: %w", err)
	}
	if !hostDirs {
		return nil // a bundle is 0700 itself
	}
	if _, err := CheckPrivateDir(dir); err != nil {
		return fmt.Errorf("launch: work dir: %w: the host directories of sandboxes must live there, whatever user a spec names", err)
	}
	return nil
}

// ErrNotPrivate reports a directory that is not this process's user's alone.
var ErrNotPrivate = errors.New("not a private directory")

// CheckPrivateDir refuses dir unless it is a directory itself (not a symbolic link to one),
// owned by this process's effective user, that no one else can enter (no group or other
// permission): what the process puts there (sandboxes' host directories, a runtime it runs as
// root) stays its own. It returns dir's FileInfo, for a caller that opens dir to check it
// opened the same one.
func CheckPrivateDir(dir string) (fs.FileInfo, error) {
	fi, err := os.Lstat(dir)
	if err != nil {
		return nil, err
	}
	st, ok := fi.Sys().(*syscall.Stat_t)
	if !fi.IsDir() || !ok || int(st.Uid) != os.Geteuid() || fi.Mode().Perm()&0o077 != 0 {
		owner := -1
		if ok {
			owner = int(st.Uid)
		}
		return nil, fmt.Errorf("%w: %s is %s owned by uid %d, want a directory only uid %d can enter (mode 0700)", ErrNotPrivate, dir, fi.Mode(), owner, os.Geteuid())
	}
	return fi, nil
}

// SocketPath returns the executor's socket as seen from the host.
func (s *Sandbox) SocketPath() string { return filepath.Join(s.HostDir, sandbox.SocketName) }

// OnDelete registers f to run once the sandbox is deleted (at once if it is already): a pool
// counts its sandboxes so.
func (s *Sandbox) OnDelete(f func()) {
	s.mu.Lock()
	if !s.deleted {
		s.onDelete = append(s.onDelete, f)
		s.mu.Unlock()
		return
	}
	s.mu.Unlock()
	f()
}

// Run runs the sandbox in the foreground (`runsc run`) and returns the process's exit status;
// a status other than 0 comes with a *runsc.ExitError (and ErrMemoryLimit for a sandbox with a
// memory limit that SIGKILL ended, as the OOM killer does). runsc's sandbox is attached to the
// command: a cancel that kills it ends the sandbox too.
func (s *Sandbox) Run(ctx context.Context) (int, error) {
	if err := s.use(); err != nil {
		return -1, err
	}
	if err := s.begin(); err != nil {
		return -1, err
	}
	status, err := s.driver.Run(ctx, s.ID, s.Bundle, &runsc.CreateOpts{IO: s.stdio.childEnds()})
	s.stdio.closeChildEnds()
	return status, s.runLimitError(status, err)
}

// Create creates the sandbox without starting its process (`runsc create`), so that a later
// start does not pay for the sandbox's boot. The command is never killed half-way: a create
// killed by a cancel left a sandbox and its gofer running with no state that `runsc delete
// --force` could find. It runs under context.WithoutCancel(ctx), bounded by the runtime's
// CommandTimeout; if ctx ended meanwhile, it returns ctx's cause once the create has ended, and
// the caller's Delete deletes what it made.
func (s *Sandbox) Create(ctx context.Context) error {
	s.mu.Lock()
	if s.created || s.used {
		s.mu.Unlock()
		return fmt.Errorf("%w: sandbox %s was already created or started", ErrUsed, s.ID)
	}
	s.created = true
	s.mu.Unlock()
	return s.create(ctx)
}

// create runs `runsc create` for Create, and for a cold Start of a sandbox not yet created;
// none when ctx has already ended.
func (s *Sandbox) create(ctx context.Context) error {
	if ctx.Err() != nil {
		return fmt.Errorf("sandbox %s: %w", s.ID, context.Cause(ctx))
	}
	if err := s.begin(); err != nil {
		return err
	}
	pidFile := filepath.Join(s.Bundle, "pid")
	start := time.Now()
	err := s.driver.Create(context.WithoutCancel(ctx), s.ID, s.Bundle, &runsc.CreateOpts{IO: s.stdio.childEnds(), PidFile: pidFile})
	s.CreateTime = time.Since(start)
	s.stdio.closeChildEnds()
	if err != nil {
		return errors.Join(err, s.checkOurs(ctx))
	}
	pid, pidStart, err := readPid(pidFile)
	if err != nil {
		return fmt.Errorf("sandbox %s: %w", s.ID, err)
	}
	s.mu.Lock()
	s.pid, s.pidStart = pid, pidStart
	s.mu.Unlock()
	if ctx.Err() != nil {
		return fmt.Errorf("sandbox %s: %w (its create was let finish, to be deleted)", s.ID, context.Cause(ctx))
	}
	return nil
}

// checkOurs asks runsc, after a failed create, whether a sandbox of this name exists with
// another bundle: a name the IDs policy gave twice. That one is another's, and Delete leaves
// it alone (`runsc delete --force` would kill it); a half-made one of ours is deleted.
func (s *Sandbox) checkOurs(ctx context.Context) error {
	c, err := s.driver.State(context.WithoutCancel(ctx), s.ID)
	if err != nil || c.Bundle == s.Bundle {
		return nil
	}
	s.mu.Lock()
	s.notOurs = true
	s.mu.Unlock()
	return fmt.Errorf("a sandbox named %s already exists under runsc's root %s (bundle %s), left alone: the IDs policy must give a new name every time", s.ID, s.driver.Root, c.Bundle)
}

// Alive reports whether the process of a sandbox made by Create still runs: its pid names a
// process, not a zombie, that started when it did. It reads /proc only, no runsc command.
func (s *Sandbox) Alive() bool {
	s.mu.Lock()
	pid, start := s.pid, s.pidStart
	s.mu.Unlock()
	if pid <= 0 {
		return false
	}
	state, now, err := procStat(pid)
	return err == nil && now == start && state != "Z" && state != "X"
}

// Start runs the executor, once: restored from img (`runsc restore -detach`, which returns
// once it runs again), or, for the zero Image, started cold (`runsc start`). A sandbox not made
// by Create is made now: by Create for a cold start, by the restore itself otherwise, which is
// then never killed half-way either (as Create). A restore is bounded by the runtime's
// RestoreTimeout whatever ctx.
func (s *Sandbox) Start(ctx context.Context, img Image) error {
	if err := s.use(); err != nil {
		return err
	}
	s.mu.Lock()
	created := s.created
	s.created = true // from here on, by this start if not before
	s.mu.Unlock()
	if img.Dir == "" {
		if !created {
			if err := s.create(ctx); err != nil {
				return err
			}
		}
		return s.driver.Start(ctx, s.ID)
	}
	restoreCtx := ctx
	if !created {
		if ctx.Err() != nil {
			return fmt.Errorf("sandbox %s: %w", s.ID, context.Cause(ctx))
		}
		restoreCtx = context.WithoutCancel(ctx)
	}
	restoreCtx, cancel := context.WithTimeoutCause(restoreCtx, s.restoreTimeout,
		fmt.Errorf("the restore into %s did not return within %s", s.ID, s.restoreTimeout))
	defer cancel()
	_, err := s.restore(restoreCtx, img, true)
	if err == nil && !created && ctx.Err() != nil {
		err = fmt.Errorf("sandbox %s: %w (its restore was let finish, to be deleted)", s.ID, context.Cause(ctx))
	}
	return err
}

// RunRestored restores img into the sandbox in the foreground (`runsc restore`, not detached:
// the executor in measure mode exits right after) and returns the process's exit status. As
// with Run, the sandbox is attached to the command.
func (s *Sandbox) RunRestored(ctx context.Context, img Image) (int, error) {
	if err := s.use(); err != nil {
		return -1, err
	}
	return s.restore(ctx, img, false)
}

// restore runs `runsc restore` of img into the sandbox.
func (s *Sandbox) restore(ctx context.Context, img Image, detach bool) (int, error) {
	if err := s.begin(); err != nil {
		return -1, err
	}
	opts := &runsc.RestoreOpts{ImagePath: img.Dir, Detach: detach, ExtraArgs: img.Flags}
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

// Open starts the executor (Start: restored from img, or cold for the zero Image) and dials
// its socket: the one way from a sandbox to a connected executor, for a worker's restore
// (Restorer), a pool's sandbox, the pipeline's smoke test and every timed call. The marks say
// when the start began and returned and when the executor accepted. The caller closes the
// connection and deletes the sandbox.
func (s *Sandbox) Open(ctx context.Context, img Image) (net.Conn, CallMarks, error) {
	var marks CallMarks
	marks.Began = time.Now()
	if err := s.Start(ctx, img); err != nil {
		return nil, marks, err
	}
	marks.Started = time.Now()
	conn, err := executorproto.Dial(ctx, s.SocketPath())
	if err != nil {
		return nil, marks, err
	}
	marks.Connected = time.Now()
	return conn, marks, nil
}

// CallOnce opens the executor (Open) and makes one call, whose answer check judges, timed from
// the start to the decoded answer. It reads at most maxResponseSize bytes of the answer
// (executorproto.Caller's MaxResponseSize; zero: executorproto.DefaultReadLimit): what the
// caller's check needs, so that an executor cannot make it hold and decode more. A failure
// comes with the end of the executor's stderr (WithStderr, which deletes the sandbox); the
// caller deletes it on every path.
func (s *Sandbox) CallOnce(ctx context.Context, img Image, request []byte, maxResponseSize int64, check func(response []byte) error) (CallMarks, error) {
	conn, marks, err := s.Open(ctx, img)
	if err != nil {
		return marks, WithStderr(ctx, s, err)
	}
	defer conn.Close()
	caller := executorproto.Caller{MaxResponseSize: maxResponseSize}
	response, err := caller.Call(ctx, conn, request)
	if err != nil {
		return marks, WithStderr(ctx, s, err)
	}
	marks.Answered = time.Now()
	return marks, check(response)
}

// Kill sends sig to the sandbox's process (`runsc kill`).
func (s *Sandbox) Kill(ctx context.Context, sig syscall.Signal) error {
	return s.driver.Kill(ctx, s.ID, sig, nil)
}

// State returns the sandbox as runsc reports it (its status: "created", "running",
// "stopped"; its pid).
func (s *Sandbox) State(ctx context.Context) (*runsc.Container, error) {
	return s.driver.State(ctx, s.ID)
}

// use marks the sandbox's one start of its process.
func (s *Sandbox) use() error {
	s.mu.Lock()
	defer s.mu.Unlock()
	switch {
	case s.deleted:
		return fmt.Errorf("%w: sandbox %s was deleted", ErrUsed, s.ID)
	case s.used:
		return fmt.Errorf("%w: sandbox %s", ErrUsed, s.ID)
	}
	s.used = true
	return nil
}

// begin opens the stdio pipes once, before the first runsc command that starts a process, and
// marks the sandbox as one whose state Delete must delete.
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
	io, err := newStdio(s.Stdout, s.Stderr, s.outputLimit, s.output, s.ID)
	if err != nil {
		return err
	}
	s.stdio = io
	return nil
}

// Delete deletes the sandbox (`runsc delete --force`, which kills what still runs), waits
// until its output is in the log files, and removes its host directory and, unless
// SandboxOptions.KeepLogs, its bundle. It runs even when ctx is already cancelled (Ctrl-C must
// still clean up; the runtime's CommandTimeout bounds it), exactly once: a second call returns
// the first's result. A failed delete is always reported.
func (s *Sandbox) Delete(ctx context.Context) error {
	s.mu.Lock()
	if s.deleted {
		err := s.delErr
		s.mu.Unlock()
		return err
	}
	s.deleted = true
	var errs []error
	if s.started && !s.notOurs {
		// --force also makes runsc succeed for a sandbox that is already gone.
		if err := s.driver.Delete(context.WithoutCancel(ctx), s.ID, &runsc.DeleteOpts{Force: true}); err != nil {
			errs = append(errs, fmt.Errorf("the sandbox %s may be left behind: %w", s.ID, err))
		}
	}
	if s.stdio != nil {
		errs = append(errs, s.stdio.wait(5*time.Second))
	}
	if s.HostDir != "" {
		errs = append(errs, os.RemoveAll(s.HostDir))
	}
	if !s.keepLogs {
		s.stderrTail = tailFile(s.Stderr, maxTailLines) // for Tail, once the log is gone
		errs = append(errs, os.RemoveAll(s.Bundle))
	}
	s.delErr = errors.Join(errs...)
	hooks := s.onDelete
	s.onDelete = nil
	err := s.delErr
	s.mu.Unlock()
	for _, f := range hooks {
		f()
	}
	return err
}

// Tail returns the last n lines of the process's stderr, for error messages, after a line
// saying how much of its stdout and stderr the output limit dropped, if any. The log is only
// complete after Delete, which keeps its last maxTailLines lines when it removes the bundle.
func (s *Sandbox) Tail(n int) string {
	s.mu.Lock()
	gone, kept := s.deleted && !s.keepLogs, s.stderrTail
	s.mu.Unlock()
	var tail string
	if gone {
		tail = lastLines(kept, n)
	} else {
		tail = tailFile(s.Stderr, n)
	}
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
