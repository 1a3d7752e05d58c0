// Package pool keeps sandboxes created ahead (`runsc create`) so that a start restores a
// checkpoint into one that already runs, off the sandbox's own boot. The sandboxes are
// pkg/launch's, made by Options.New and created by launch.Sandbox.Create (never killed
// half-way), restored through the kit's one path (launch.Restorer.Restore with the pool, or
// launch.Sandbox.Open). One spec serves every checkpoint of an output: at the pinned gVisor,
// `runsc restore` onto a created sandbox uses the spec it was created with (its bundle is not
// read again), so everything a restore needs is fixed at create time, the executor mount's
// source, the environment and the limits (launch.Options.Limits: memory, pids, CPU) included;
// only the image differs per restore.
//
// A pool refills itself in the background, one `runsc create` at a time; every wait is
// bounded; a sandbox is handed out once and never comes back (a sandbox that ran a call holds
// that call's state: launch.ErrUsed for a second start); every sandbox it made is deleted on
// every path: by its user (Delete), when it is found dead, on Close, and once the context
// given to New ends (a worker cancels it on SIGTERM).
//
//	r, err := out.Restorer(launch.Options{Runtime: rt, WorkDir: work, IDs: launch.RandomIDs{Prefix: "worker"}})
//	p, err := pool.New(ctx, pool.Options{New: r.NewSandbox, Size: 2})
//	defer p.Close()
//	restored, err := r.Restore(ctx, set, launch.RestoreOptions{Pool: p})
//	defer restored.Close(ctx)
//
// Warm goes further: sandboxes already restored, per set, their executor connected, so that a
// start is the call alone (launch.RestoreOptions.Warm); catalogue.SizeWarm sizes them.
package pool

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"time"

	"readie.dev/pipeline/pkg/launch"
)

// Defaults for the zero values of Options.
const (
	DefaultGetTimeout = time.Minute
	DefaultRetryDelay = time.Second
)

var (
	// ErrClosed is returned by a pool after Close, or once the context given to New ended.
	ErrClosed = errors.New("pool closed")
	// ErrExhausted is returned by Get when no sandbox was ready within its limit; the error
	// also carries the last failed create, if any.
	ErrExhausted = errors.New("no pooled sandbox ready")
)

// Options shape a pool.
type Options struct {
	// New prepares a sandbox of the pool's shape, not created yet: a worker's
	// launch.Restorer.NewSandbox, or the pipeline bench's sandboxes of its launcher. The pool
	// creates it (launch.Sandbox.Create) and deletes it on every path.
	New func() (*launch.Sandbox, error)
	// Size is how many sandboxes are kept created ahead (at least 1).
	Size int
	// GetTimeout bounds Get's wait for a ready sandbox (DefaultGetTimeout when zero).
	GetTimeout time.Duration
	// RetryDelay is the pause after a failed create before the next (DefaultRetryDelay).
	RetryDelay time.Duration
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
	ready   []*launch.Sandbox
	live    map[*launch.Sandbox]struct{} // every sandbox made and not yet deleted
	held    map[*launch.Sandbox]struct{} // handed out and not yet deleted, with RefillOnDelete
	discard []*launch.Sandbox            // found dead: the refill deletes them
	changed chan struct{}                // closed and replaced on every change of ready
	wake    chan struct{}
	lastErr error
	closed  bool
	stats   Stats

	closeOnce sync.Once
	closeErr  error
}

// New starts a pool: it returns at once and fills itself in the background. Cancelling ctx
// closes the pool as Close does.
func New(ctx context.Context, o Options) (*Pool, error) {
	switch {
	case o.New == nil:
		return nil, errors.New("pool: Options.New is required")
	case o.Size < 1:
		return nil, fmt.Errorf("pool: size %d: want at least 1", o.Size)
	}
	if o.GetTimeout <= 0 {
		o.GetTimeout = DefaultGetTimeout
	}
	if o.RetryDelay <= 0 {
		o.RetryDelay = DefaultRetryDelay
	}
	p := &Pool{o: o, done: make(chan struct{}), live: map[*launch.Sandbox]struct{}{}, held: map[*launch.Sandbox]struct{}{},
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
func (p *Pool) Get(ctx context.Context) (*launch.Sandbox, error) {
	ctx, cancel := context.WithTimeoutCause(ctx, p.o.GetTimeout, fmt.Errorf("%w within %s", ErrExhausted, p.o.GetTimeout))
	defer cancel()
	for {
		p.mu.Lock()
		if p.closed {
			p.mu.Unlock()
			return nil, ErrClosed
		}
		var found *launch.Sandbox
		for len(p.ready) > 0 && found == nil {
			sb := p.ready[0]
			p.ready = p.ready[1:]
			if sb.Alive() {
				found = sb
				continue
			}
			p.stats.Dead++
			p.discard = append(p.discard, sb)
		}
		if found != nil {
			p.stats.HandedOut++
			if p.o.RefillOnDelete {
				p.held[found] = struct{}{}
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
		<-p.done // every runsc command of the refill is bounded (the runtime's CommandTimeout)
		p.mu.Lock()
		var all []*launch.Sandbox
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
		need := len(p.ready)+len(p.held) < p.o.Size
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

// create makes one sandbox (Options.New) and creates it, registered first: from then on Close
// deletes it, whatever happens. A create under way when the pool closes is let finish
// (launch.Sandbox.Create), then deleted. A failed create is deleted before it returns.
func (p *Pool) create(ctx context.Context) (*launch.Sandbox, error) {
	sb, err := p.o.New()
	if err != nil {
		return nil, fmt.Errorf("pool: %w", err)
	}
	p.mu.Lock()
	if p.closed {
		p.mu.Unlock()
		return nil, errors.Join(ErrClosed, sb.Delete(ctx))
	}
	p.live[sb] = struct{}{}
	p.mu.Unlock()
	sb.OnDelete(func() { p.forget(sb) })
	if err := sb.Create(ctx); err != nil {
		return nil, errors.Join(fmt.Errorf("pool: %w", err), sb.Delete(ctx))
	}
	return sb, nil
}

// forget drops a deleted sandbox, and wakes the refill when it was held.
func (p *Pool) forget(sb *launch.Sandbox) {
	p.mu.Lock()
	defer p.mu.Unlock()
	delete(p.live, sb)
	if _, ok := p.held[sb]; ok {
		delete(p.held, sb)
		p.kick()
	}
}
