// Package pool keeps sandboxes created ahead (`runsc create`) so that a start restores a
// checkpoint into one that already runs, off the sandbox's own boot. One spec serves every
// checkpoint of an output: at the pinned gVisor, `runsc restore` onto a created sandbox uses
// the spec it was created with (its bundle is not read again), so everything a restore needs
// is fixed at create time, the executor mount's source and the environment included; only
// the image differs per restore.
//
// A pool refills itself in the background, one `runsc create` at a time; every wait is
// bounded; a sandbox is handed out once and never comes back (a sandbox that ran a call holds
// that call's state); every sandbox it made is deleted on every path: by its user (Delete),
// when it is found dead, on Close, and once the context given to New ends (a worker cancels
// it on SIGTERM).
//
//	p, err := pool.New(ctx, pool.Options{Runsc: r, Size: 2, Dir: work, Spec: spec})
//	defer p.Close()
//	sb, err := p.Get(ctx)
//	defer sb.Delete(ctx)
//	err = sb.Restore(ctx, imageDir, m.RestoreFlags)
//	conn, err := executorproto.Dial(ctx, sb.SocketPath())
package pool

import (
	"bufio"
	"context"
	"crypto/rand"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"time"

	specs "github.com/opencontainers/runtime-spec/specs-go"

	"readie.dev/pipeline/pkg/runsc"
	"readie.dev/pipeline/pkg/sandbox"
)

// Defaults for the zero values of Options.
const (
	DefaultGetTimeout = time.Minute
	DefaultRetryDelay = time.Second
	// DefaultRestoreTimeout is generous: a detached restore of a large image on a loaded
	// machine takes seconds, a hung one forever.
	DefaultRestoreTimeout = time.Minute
)

var (
	// ErrClosed is returned by a pool after Close, or once the context given to New ended.
	ErrClosed = errors.New("pool closed")
	// ErrExhausted is returned by Get when no sandbox was ready within its limit; the error
	// also carries the last failed create, if any.
	ErrExhausted = errors.New("no pooled sandbox ready")
	// ErrUsed is returned by a second Restore or Start of a sandbox: a sandbox runs one
	// executor, once.
	ErrUsed = errors.New("pooled sandbox already used")
)

// SpecFunc returns the spec of a sandbox whose executor mount's source is hostDir.
type SpecFunc func(hostDir string) (*specs.Spec, error)

// FromRestoreSpec returns the SpecFunc of an output's restore spec: sandbox.RestoreSpec with
// o, o.HostDir replaced by each sandbox's own. It reads and checks the spec once now, so a
// spec that cannot restore the output is refused (sandbox.ErrRestoreSpec) before any sandbox
// is made.
func FromRestoreSpec(path, fingerprint string, runscFlags []string, o sandbox.RestoreOptions) (SpecFunc, error) {
	if o.HostDir == "" {
		o.HostDir = "/" // checked with a placeholder: each sandbox has its own
	}
	if _, err := sandbox.RestoreSpec(path, fingerprint, runscFlags, o); err != nil {
		return nil, err
	}
	return func(hostDir string) (*specs.Spec, error) {
		o := o
		o.HostDir = hostDir
		return sandbox.RestoreSpec(path, fingerprint, runscFlags, o)
	}, nil
}

// Options shape a pool.
type Options struct {
	// Runsc creates, restores and deletes the sandboxes: its Root should be private to the
	// pool's user, its GlobalArgs the output's runsc flags (sandbox.ParseFlags).
	Runsc *runsc.Runsc
	// Size is how many sandboxes are kept created ahead (at least 1).
	Size int
	// Dir holds a bundle and a host directory per sandbox; keep it short: the executor's
	// socket path (Dir/h-XXXXXXXX/executor.sock) must fit in a Unix socket address.
	Dir string
	// Spec returns the spec of each sandbox: for a worker, FromRestoreSpec of the output.
	// Its environment is the restore-time environment of whatever is restored into it.
	Spec SpecFunc
	// NewID names a sandbox; nil: "pool-" and 8 random hex digits.
	NewID func() (string, error)
	// Output receives the executors' stdout and stderr, each line prefixed with the sandbox's
	// ID; nil discards them. The executor gets pipes, as it was captured with.
	Output io.Writer
	// GetTimeout bounds Get's wait for a ready sandbox (DefaultGetTimeout when zero).
	GetTimeout time.Duration
	// RetryDelay is the pause after a failed create before the next (DefaultRetryDelay).
	RetryDelay time.Duration
	// RestoreTimeout bounds Sandbox.Restore, a detached restore that returns once the
	// executor runs again, whatever its ctx (DefaultRestoreTimeout when zero).
	RestoreTimeout time.Duration
	// RefillOnDelete makes a handed-out sandbox count as one of Size until its Delete, so that
	// its replacement's `runsc create` does not run while it is restored and called: for a
	// benchmark that times Get to the answer. A worker leaves it false and refills at once.
	RefillOnDelete bool
}

// Stats count what a pool did.
type Stats struct {
	Ready   int // created and waiting
	Created int // successful creates
	Failed  int // failed creates
	Dead    int // ready sandboxes found dead and replaced
	// HandedOut counts the sandboxes Get returned.
	HandedOut int
	// CreateTime is the sum of the successful creates' times: what the pool took off the
	// starts it served, CreateTime/Created each.
	CreateTime time.Duration
}

// Pool keeps Options.Size sandboxes created ahead. Its methods are safe for concurrent use.
type Pool struct {
	o      Options
	ctx    context.Context // the refill's; ends on Close
	cancel context.CancelCauseFunc
	stop   func() bool // unregisters the close on New's context
	done   chan struct{}

	mu      sync.Mutex
	ready   []*Sandbox
	live    map[*Sandbox]struct{} // every sandbox made and not yet deleted
	discard []*Sandbox            // found dead: the refill deletes them
	changed chan struct{}         // closed and replaced on every change of ready
	wake    chan struct{}
	held    int // handed out and not yet deleted, with RefillOnDelete
	lastErr error
	closed  bool
	stats   Stats

	closeOnce sync.Once
	closeErr  error

	outMu sync.Mutex // one line at a time into Options.Output, from every sandbox
}

// New starts a pool: it returns at once and fills itself in the background. Cancelling ctx
// closes the pool as Close does.
func New(ctx context.Context, o Options) (*Pool, error) {
	switch {
	case o.Runsc == nil || o.Spec == nil:
		return nil, errors.New("pool: Options.Runsc and Options.Spec are required")
	case o.Size < 1:
		return nil, fmt.Errorf("pool: size %d: want at least 1", o.Size)
	case !filepath.IsAbs(o.Dir):
		return nil, fmt.Errorf("pool: dir %q is not an absolute path", o.Dir)
	}
	if o.GetTimeout <= 0 {
		o.GetTimeout = DefaultGetTimeout
	}
	if o.RetryDelay <= 0 {
		o.RetryDelay = DefaultRetryDelay
	}
	if o.RestoreTimeout <= 0 {
		o.RestoreTimeout = DefaultRestoreTimeout
	}
	if o.NewID == nil {
		o.NewID = func() (string, error) { return "pool-" + randomHex(4), nil }
	}
	if o.Output == nil {
		o.Output = io.Discard
	}
	if err := os.MkdirAll(o.Dir, 0o755); err != nil {
		return nil, fmt.Errorf("pool: %w", err)
	}
	p := &Pool{o: o, done: make(chan struct{}), live: map[*Sandbox]struct{}{},
		changed: make(chan struct{}), wake: make(chan struct{}, 1)}
	p.ctx, p.cancel = context.WithCancelCause(context.WithoutCancel(ctx))
	p.stop = context.AfterFunc(ctx, func() { p.Close() })
	go p.refill()
	return p, nil
}

// Size returns the number of sandboxes the pool keeps ready.
func (p *Pool) Size() int { return p.o.Size }

// Stats returns what the pool did so far.
func (p *Pool) Stats() Stats {
	p.mu.Lock()
	defer p.mu.Unlock()
	s := p.stats
	s.Ready = len(p.ready)
	return s
}

// Get hands out a ready sandbox, never the same one twice, and has the pool replace it. It
// waits for one at most Options.GetTimeout (and ctx): then it fails with ErrExhausted and the
// last create error. A ready sandbox whose process died is skipped, deleted and replaced.
func (p *Pool) Get(ctx context.Context) (*Sandbox, error) {
	ctx, cancel := context.WithTimeoutCause(ctx, p.o.GetTimeout, fmt.Errorf("%w within %s", ErrExhausted, p.o.GetTimeout))
	defer cancel()
	for {
		p.mu.Lock()
		if p.closed {
			p.mu.Unlock()
			return nil, ErrClosed
		}
		var found *Sandbox
		for len(p.ready) > 0 && found == nil {
			sb := p.ready[0]
			p.ready = p.ready[1:]
			if sb.alive() {
				found = sb
				continue
			}
			p.stats.Dead++
			p.discard = append(p.discard, sb)
		}
		if found != nil {
			p.stats.HandedOut++
			if p.o.RefillOnDelete {
				found.held = true
				p.held++
			}
			p.broadcast()
		}
		changed := p.changed
		p.kick()
		p.mu.Unlock()
		if found != nil {
			return found, nil
		}
		select {
		case <-changed:
		case <-ctx.Done():
			err := fmt.Errorf("pool: %w", context.Cause(ctx))
			if !errors.Is(err, ErrExhausted) {
				err = fmt.Errorf("%w: %w", ErrExhausted, err)
			}
			return nil, p.withLastErr(err)
		}
	}
}

// Wait returns once the pool holds Size ready sandboxes, for a caller that keeps the refill
// off whatever it times next; it waits at most Options.GetTimeout (and ctx).
func (p *Pool) Wait(ctx context.Context) error {
	ctx, cancel := context.WithTimeoutCause(ctx, p.o.GetTimeout, fmt.Errorf("%w: the pool was not full within %s", ErrExhausted, p.o.GetTimeout))
	defer cancel()
	for {
		p.mu.Lock()
		if p.closed {
			p.mu.Unlock()
			return ErrClosed
		}
		full := len(p.ready) >= p.o.Size && len(p.discard) == 0
		changed := p.changed
		p.kick()
		p.mu.Unlock()
		if full {
			return nil
		}
		select {
		case <-changed:
		case <-ctx.Done():
			return p.withLastErr(fmt.Errorf("pool: %w", context.Cause(ctx)))
		}
	}
}

// withLastErr adds the last failed create or delete, if any, to err.
func (p *Pool) withLastErr(err error) error {
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.lastErr != nil {
		return fmt.Errorf("%w (the last create failed: %w)", err, p.lastErr)
	}
	return err
}

// Close stops the refill and deletes every sandbox the pool made that is not deleted yet,
// those handed out included; it returns the failed deletes. It is safe to call again.
func (p *Pool) Close() error {
	p.closeOnce.Do(func() {
		p.stop()
		p.mu.Lock()
		p.closed = true
		p.broadcast()
		p.mu.Unlock()
		p.cancel(ErrClosed)
		<-p.done // every runsc command of the refill is bounded (runsc.Runsc.CommandTimeout)
		p.mu.Lock()
		var all []*Sandbox
		for sb := range p.live {
			all = append(all, sb)
		}
		p.ready, p.discard = nil, nil
		p.mu.Unlock()
		var errs []error
		for _, sb := range all {
			errs = append(errs, sb.Delete(context.Background()))
		}
		p.closeErr = errors.Join(errs...)
	})
	return p.closeErr
}

// broadcast wakes every Get and Wait; p.mu is held.
func (p *Pool) broadcast() {
	close(p.changed)
	p.changed = make(chan struct{})
}

// kick wakes the refill; p.mu is held.
func (p *Pool) kick() {
	select {
	case p.wake <- struct{}{}:
	default:
	}
}

// refill deletes the sandboxes found dead and creates one whenever fewer than Size are ready,
// until Close.
func (p *Pool) refill() {
	defer close(p.done)
	for {
		p.mu.Lock()
		discard := p.discard
		p.discard = nil
		need := len(p.ready)+p.held < p.o.Size
		p.mu.Unlock()
		for _, sb := range discard {
			if err := sb.Delete(p.ctx); err != nil {
				p.fail(err, false)
			}
		}
		if p.ctx.Err() != nil {
			return
		}
		if !need {
			select {
			case <-p.wake:
			case <-p.ctx.Done():
				return
			}
			continue
		}
		sb, err := p.create(p.ctx)
		if err != nil {
			p.fail(err, true)
			select {
			case <-time.After(p.o.RetryDelay):
			case <-p.ctx.Done():
				return
			}
			continue
		}
		p.mu.Lock()
		p.stats.Created++
		p.stats.CreateTime += sb.CreateTime
		p.lastErr = nil
		p.ready = append(p.ready, sb)
		p.broadcast()
		p.mu.Unlock()
	}
}

// fail records a failed create or delete for Get's error and wakes the waiters.
func (p *Pool) fail(err error, create bool) {
	p.mu.Lock()
	defer p.mu.Unlock()
	if create {
		p.stats.Failed++
	}
	p.lastErr = err
	p.broadcast()
}

// create makes one sandbox: its bundle and host directory, then `runsc create` with a pipe
// for the executor's stdout and stderr. A failed create is deleted before it returns.
func (p *Pool) create(ctx context.Context) (_ *Sandbox, err error) {
	id, err := p.o.NewID()
	if err != nil {
		return nil, err
	}
	suffix := randomHex(4)
	sb := &Sandbox{ID: id, p: p, Bundle: filepath.Join(p.o.Dir, "b-"+suffix), HostDir: filepath.Join(p.o.Dir, "h-"+suffix)}
	p.mu.Lock()
	if p.closed {
		p.mu.Unlock()
		return nil, ErrClosed
	}
	p.live[sb] = struct{}{} // from here on Close deletes it, whatever happens below
	p.mu.Unlock()
	defer func() {
		if err != nil {
			err = errors.Join(err, sb.Delete(ctx))
		}
	}()
	for _, dir := range []string{sb.Bundle, sb.HostDir} {
		if err := os.Mkdir(dir, 0o755); err != nil {
			return nil, fmt.Errorf("pool: %w", err)
		}
	}
	spec, err := p.o.Spec(sb.HostDir)
	if err != nil {
		return nil, fmt.Errorf("pool: the spec of %s: %w", id, err)
	}
	// An image with a non-root User: its executor binds the socket in the host directory.
	if spec.Process != nil {
		if err := sandbox.PrepareHostDir(sb.HostDir, spec.Process.User); err != nil {
			return nil, fmt.Errorf("pool: %w", err)
		}
	}
	data, err := json.Marshal(spec)
	if err != nil {
		return nil, err
	}
	if err := os.WriteFile(filepath.Join(sb.Bundle, "config.json"), data, 0o600); err != nil {
		return nil, fmt.Errorf("pool: %w", err)
	}
	// A failed create is cleaned up with `runsc delete --force ID`, which would kill a
	// stranger's sandbox of the same name: refuse a name already taken under the root.
	taken, err := p.o.Runsc.List(ctx)
	if err != nil {
		return nil, fmt.Errorf("pool: %w", err)
	}
	for _, c := range taken {
		if c.ID == id {
			return nil, fmt.Errorf("pool: a sandbox named %s already exists under runsc's root %s: Options.NewID must return a new name", id, p.o.Runsc.Root)
		}
	}
	r, w, err := os.Pipe()
	if err != nil {
		return nil, fmt.Errorf("pool: %w", err)
	}
	sb.output = r
	sb.copied = make(chan struct{})
	go sb.relay(r, p.o.Output)
	pidFile := filepath.Join(sb.Bundle, "pid")
	sb.created = true
	start := time.Now()
	err = p.o.Runsc.Create(ctx, id, sb.Bundle, &runsc.CreateOpts{IO: runsc.IO{Stdout: w, Stderr: w}, PidFile: pidFile})
	sb.CreateTime = time.Since(start)
	w.Close() // the sandbox holds its own copy now
	if err != nil {
		return nil, fmt.Errorf("pool: %w", err)
	}
	if sb.pid, sb.startTime, err = readPid(pidFile); err != nil {
		return nil, fmt.Errorf("pool: sandbox %s: %w", id, err)
	}
	return sb, nil
}

// Sandbox is one created sandbox of a pool, handed out once by Get.
type Sandbox struct {
	ID      string
	Bundle  string // holds config.json
	HostDir string // bind-mounted on sandbox.ExecutorDir
	// CreateTime is how long its `runsc create` took: what a pool takes off a start.
	CreateTime time.Duration

	p         *Pool
	held      bool // counted in Pool.held until Delete; guarded by Pool.mu
	pid       int
	startTime string // of pid, from /proc/PID/stat: a pid reused by another process differs
	output    *os.File
	copied    chan struct{}
	created   bool // runsc create ran: there may be state to delete

	useMu   sync.Mutex
	used    bool
	deleted bool
	delErr  error
}

// SocketPath returns the executor's socket as seen from the host.
func (s *Sandbox) SocketPath() string { return filepath.Join(s.HostDir, sandbox.SocketName) }

// Restore restores the checkpoint in imageDir into the sandbox (`runsc restore --detach`,
// with flags such as a manifest's restore_flags) and returns once the executor runs again.
// It waits at most Options.RestoreTimeout (and ctx): the driver bounds a restore by its
// context alone. A sandbox is restored or started once: a second use fails with ErrUsed.
func (s *Sandbox) Restore(ctx context.Context, imageDir string, flags []string) error {
	if err := s.use(); err != nil {
		return err
	}
	ctx, cancel := context.WithTimeoutCause(ctx, s.p.o.RestoreTimeout,
		fmt.Errorf("pool: the restore into %s did not return within Options.RestoreTimeout (%s)", s.ID, s.p.o.RestoreTimeout))
	defer cancel()
	_, err := s.p.o.Runsc.Restore(ctx, s.ID, s.Bundle, &runsc.RestoreOpts{ImagePath: imageDir, Detach: true, ExtraArgs: flags})
	return err // it names the cause
}

// Start starts the sandbox's own process (`runsc start`): a cold start of the executor, for a
// request no checkpoint serves. A second use fails with ErrUsed.
func (s *Sandbox) Start(ctx context.Context) error {
	if err := s.use(); err != nil {
		return err
	}
	return s.p.o.Runsc.Start(ctx, s.ID)
}

func (s *Sandbox) use() error {
	s.useMu.Lock()
	defer s.useMu.Unlock()
	switch {
	case s.deleted:
		return fmt.Errorf("%w: sandbox %s was deleted", ErrUsed, s.ID)
	case s.used:
		return fmt.Errorf("%w: sandbox %s", ErrUsed, s.ID)
	}
	s.used = true
	return nil
}

// Delete deletes the sandbox (`runsc delete --force`, bounded by the driver's CommandTimeout,
// even once ctx is cancelled), its bundle and its host directory. It is safe to call again.
func (s *Sandbox) Delete(ctx context.Context) error {
	s.useMu.Lock()
	defer s.useMu.Unlock()
	if s.deleted {
		return s.delErr
	}
	s.deleted = true
	var errs []error
	if s.created {
		if err := s.p.o.Runsc.Delete(context.WithoutCancel(ctx), s.ID, &runsc.DeleteOpts{Force: true}); err != nil {
			errs = append(errs, fmt.Errorf("pool: the sandbox %s may be left behind: %w", s.ID, err))
		}
	}
	if s.output != nil {
		select {
		case <-s.copied:
		case <-time.After(5 * time.Second):
			// Something outside the sandbox still holds the write end; stop waiting for it.
			s.output.Close()
			errs = append(errs, fmt.Errorf("pool: the output of %s was still open 5s after it was deleted", s.ID))
		}
	}
	for _, dir := range []string{s.Bundle, s.HostDir} {
		if err := os.RemoveAll(dir); err != nil {
			errs = append(errs, err)
		}
	}
	s.delErr = errors.Join(errs...)
	s.p.mu.Lock()
	delete(s.p.live, s)
	if s.held {
		s.held = false
		s.p.held--
		s.p.kick()
	}
	s.p.mu.Unlock()
	return s.delErr
}

// relay copies the executor's output to w line by line, prefixed with the sandbox's ID.
func (s *Sandbox) relay(r *os.File, w io.Writer) {
	defer close(s.copied)
	defer r.Close()
	lines := bufio.NewScanner(r)
	lines.Buffer(make([]byte, 4096), 1<<20)
	for lines.Scan() {
		s.p.outMu.Lock()
		fmt.Fprintf(w, "%s: %s\n", s.ID, lines.Text())
		s.p.outMu.Unlock()
	}
	io.Copy(io.Discard, r) // a line too long for the scanner: keep the pipe drained
}

// alive reports whether the sandbox's process still runs: its pid names a process, not a
// zombie, that started when it did. It reads /proc only, no runsc command: Get stays cheap.
func (s *Sandbox) alive() bool {
	state, start, err := procStat(s.pid)
	return err == nil && start == s.startTime && state != "Z" && state != "X"
}

// readPid reads the sandbox process's pid from runsc's pid file and its start time.
func readPid(path string) (int, string, error) {
	data, err := os.ReadFile(path)
	if err != nil {
		return 0, "", fmt.Errorf("runsc create wrote no pid file: %w", err)
	}
	pid, err := strconv.Atoi(strings.TrimSpace(string(data)))
	if err != nil || pid <= 0 {
		return 0, "", fmt.Errorf("pid file %s holds %q, not a pid", path, data)
	}
	_, start, err := procStat(pid)
	if err != nil {
		return 0, "", fmt.Errorf("the sandbox process %d: %w", pid, err)
	}
	return pid, start, nil
}

// procStat returns fields 3 and 22 of /proc/PID/stat: the process's state and its start time
// in clock ticks since boot.
func procStat(pid int) (state, start string, err error) {
	data, err := os.ReadFile("/proc/" + strconv.Itoa(pid) + "/stat")
	if err != nil {
		return "", "", err
	}
	// The command name (field 2) may hold spaces and parentheses: count after its last ')'.
	i := strings.LastIndexByte(string(data), ')')
	if i < 0 {
		return "", "", fmt.Errorf("/proc/%d/stat: no command name", pid)
	}
	fields := strings.Fields(string(data[i+1:]))
	if len(fields) < 20 {
		return "", "", fmt.Errorf("/proc/%d/stat: %d fields after the name", pid, len(fields))
	}
	return fields[0], fields[19], nil
}

func randomHex(n int) string {
	b := make([]byte, n)
	rand.Read(b)
	return hex.EncodeToString(b)
}
