package pool

import (
	"context"
	"errors"
	"fmt"
	"maps"
	"slices"
	"sync"
	"time"

	"readie.dev/pipeline/pkg/launch"
)

// DefaultWarmWaitTimeout bounds Warm.Wait when WarmOptions.WaitTimeout is zero: filling a pool
// restores one sandbox after another.
const DefaultWarmWaitTimeout = 5 * time.Minute

// WarmOptions shape a pool of warm sandboxes.
type WarmOptions struct {
	// Restorer restores the sets' checkpoints (the worker's launch.Restorer).
	Restorer *launch.Restorer
	// Sizes is how many sandboxes of each set are kept restored (Size); a set of size 0, or
	// not named, is not kept.
	Sizes map[string]int
	// Pool, when set, gives the sandboxes the refill restores into, created ahead (a *Pool of
	// Restorer.NewSandbox); otherwise each is created for its restore.
	Pool launch.Pool
	// RetryDelay is the pause after a failed restore before the next (DefaultRetryDelay).
	RetryDelay time.Duration
	// WaitTimeout bounds Wait (DefaultWarmWaitTimeout).
	WaitTimeout time.Duration
	// RefillOnDelete makes a taken sandbox count as one of its set's until its Delete, so that
	// its replacement's restore does not run beside its call: for a benchmark that times the
	// take to the answer (Options.RefillOnDelete). A worker leaves it false.
	RefillOnDelete bool
}

// WarmStats count what a warm pool did, per set.
type WarmStats struct {
	Ready     int // restored and waiting
	Restored  int // successful restores by the refill
	Failed    int // failed restores
	Dead      int // ready sandboxes found dead and replaced
	HandedOut int // taken (Take)
	// RestoreTime is the sum of the refill's restores, from the start of the restore to the
	// executor's accept (after Pool's Get): what the takes saved, RestoreTime/Restored each.
	RestoreTime time.Duration
}

// Warm keeps, per set, sandboxes already restored from its checkpoint and connected, so that
// a start is the call alone (launch.RestoreOptions.Warm). A sandbox is handed out once (Take)
// and never comes back; the pool restores a replacement in the background, one restore at a
// time (it runs on the CPUs the requests use); every sandbox it restored is deleted on every
// path: by its user (launch.Restored.Close), when it is found dead, on Close, and once the
// context given to NewWarm ends. Its methods are safe for concurrent use.
//
// A warm sandbox holds its checkpoint's process restored, with the environment its sandbox
// was created with (the restorer's); a value per call goes over the socket.
type Warm struct {
	o      WarmOptions
	sets   []string // the sets kept, sorted
	ctx    context.Context
	cancel context.CancelCauseFunc
	stop   func() bool
	done   chan struct{}

	mu      sync.Mutex
	ready   map[string][]*launch.Restored
	live    map[*launch.Restored]struct{} // restored and not yet deleted, handed out included
	held    map[*launch.Restored]string   // taken and not yet deleted, with RefillOnDelete: its set
	discard []*launch.Restored            // found dead: the refill deletes them
	changed chan struct{}
	wake    chan struct{}
	lastErr error
	closed  bool
	stats   map[string]*WarmStats

	closeOnce sync.Once
	closeErr  error
}

// NewWarm starts a warm pool: it returns at once and restores in the background. Cancelling
// ctx closes the pool as Close does.
func NewWarm(ctx context.Context, o WarmOptions) (*Warm, error) {
	if o.Restorer == nil {
		return nil, errors.New("pool: WarmOptions.Restorer is required")
	}
	w := &Warm{o: o, ready: map[string][]*launch.Restored{}, live: map[*launch.Restored]struct{}{}, held: map[*launch.Restored]string{},
		changed: make(chan struct{}), wake: make(chan struct{}, 1), stats: map[string]*WarmStats{}, done: make(chan struct{})}
	for _, set := range slices.Sorted(maps.Keys(o.Sizes)) {
		switch n := o.Sizes[set]; {
		case set == "":
			return nil, errors.New("pool: a warm pool of set \"\": a cold start is not kept warm")
		case n < 0:
			return nil, fmt.Errorf("pool: warm pool of %s: size %d, want 0 or more", set, n)
		case n > 0:
			w.sets = append(w.sets, set)
			w.stats[set] = &WarmStats{}
		}
	}
	if w.o.RetryDelay <= 0 {
		w.o.RetryDelay = DefaultRetryDelay
	}
	if w.o.WaitTimeout <= 0 {
		w.o.WaitTimeout = DefaultWarmWaitTimeout
	}
	w.ctx, w.cancel = context.WithCancelCause(context.WithoutCancel(ctx))
	w.stop = context.AfterFunc(ctx, func() { w.Close() })
	go w.refill()
	return w, nil
}

// Sets returns the sets the pool keeps warm, sorted.
func (w *Warm) Sets() []string { return slices.Clone(w.sets) }

// Size returns how many sandboxes of set the pool keeps.
func (w *Warm) Size(set string) int { return w.o.Sizes[set] }

// Stats returns what the pool did so far, per set kept.
func (w *Warm) Stats() map[string]WarmStats {
	w.mu.Lock()
	defer w.mu.Unlock()
	out := make(map[string]WarmStats, len(w.stats))
	for set, s := range w.stats {
		c := *s
		c.Ready = len(w.ready[set])
		out[set] = c
	}
	return out
}

// Take hands out a ready sandbox of set, never the same one twice, and has the pool restore
// a replacement; nil when none is ready: it never waits (launch.Warm). A ready sandbox whose
// process died is skipped, deleted and replaced (launch.Sandbox.Alive: /proc only). A nil
// pool has none.
func (w *Warm) Take(set string) *launch.Restored {
	if w == nil { // a nil *Warm in launch.RestoreOptions.Warm: no pool
		return nil
	}
	w.mu.Lock()
	defer w.mu.Unlock()
	if w.closed {
		return nil
	}
	st := w.stats[set]
	if st == nil {
		return nil
	}
	defer w.kick()
	for len(w.ready[set]) > 0 {
		r := w.ready[set][0]
		w.ready[set] = w.ready[set][1:]
		if r.Sandbox.Alive() {
			st.HandedOut++
			if w.o.RefillOnDelete {
				w.held[r] = set
			}
			w.broadcast()
			return r
		}
		st.Dead++
		w.discard = append(w.discard, r)
	}
	return nil
}

// Wait returns once every set holds its size of ready sandboxes, for a caller that keeps the
// refill off whatever it times next; it waits at most WarmOptions.WaitTimeout (and ctx).
func (w *Warm) Wait(ctx context.Context) error {
	ctx, cancel := context.WithTimeoutCause(ctx, w.o.WaitTimeout, fmt.Errorf("%w: the warm pool was not full within %s", ErrExhausted, w.o.WaitTimeout))
	defer cancel()
	for {
		w.mu.Lock()
		if w.closed {
			w.mu.Unlock()
			return ErrClosed
		}
		full := w.full()
		changed := w.changed
		w.kick()
		w.mu.Unlock()
		if full {
			return nil
		}
		select {
		case <-changed:
		case <-ctx.Done():
			err := fmt.Errorf("pool: %w", context.Cause(ctx))
			w.mu.Lock()
			defer w.mu.Unlock()
			if w.lastErr != nil {
				err = fmt.Errorf("%w (the last restore failed: %w)", err, w.lastErr)
			}
			return err
		}
	}
}

// missing returns the set with the most sandboxes missing (ties to the first by name), or ""
// when every set is full (with RefillOnDelete, a taken sandbox counts until its Delete);
// w.mu is held.
func (w *Warm) missing() string {
	held := map[string]int{}
	for _, set := range w.held {
		held[set]++
	}
	best, most := "", 0
	for _, set := range w.sets {
		if n := w.o.Sizes[set] - len(w.ready[set]) - held[set]; n > most {
			best, most = set, n
		}
	}
	return best
}

// full reports whether every set holds its size of ready sandboxes; w.mu is held.
func (w *Warm) full() bool {
	for _, set := range w.sets {
		if len(w.ready[set]) < w.o.Sizes[set] {
			return false
		}
	}
	return len(w.discard) == 0
}

// Resident returns what one ready sandbox of set holds in memory, restored and idle
// (launch.Sandbox.Resident); an error when none is ready.
func (w *Warm) Resident(set string) (int64, error) {
	w.mu.Lock()
	var r *launch.Restored
	if len(w.ready[set]) > 0 {
		r = w.ready[set][0]
	}
	w.mu.Unlock()
	if r == nil {
		return 0, fmt.Errorf("pool: no warm sandbox of %s ready", set)
	}
	return r.Sandbox.Resident()
}

// ResidentAll returns what every sandbox the pool restored and has not deleted holds in
// memory, those taken included: the pool's footprint now.
func (w *Warm) ResidentAll() int64 {
	w.mu.Lock()
	all := slices.Collect(maps.Keys(w.live))
	w.mu.Unlock()
	var total int64
	for _, r := range all {
		n, err := r.Sandbox.Resident()
		if err != nil {
			continue // deleted since: it holds nothing
		}
		total += n
	}
	return total
}

// Close stops the refill and deletes every sandbox the pool restored that is not deleted yet,
// those handed out included (their connections closed); it returns the failed deletes. It is
// safe to call again.
func (w *Warm) Close() error {
	w.closeOnce.Do(func() {
		w.stop()
		w.mu.Lock()
		w.closed = true
		w.broadcast()
		w.mu.Unlock()
		w.cancel(ErrClosed)
		<-w.done // the refill's restore is bounded (the runtime's timeouts) and cancelled
		w.mu.Lock()
		all := slices.Collect(maps.Keys(w.live))
		w.ready, w.discard = nil, nil
		w.mu.Unlock()
		var errs []error
		for _, r := range all {
			errs = append(errs, r.Close(context.Background()))
		}
		w.closeErr = errors.Join(errs...)
	})
	return w.closeErr
}

// broadcast wakes every Wait; w.mu is held.
func (w *Warm) broadcast() {
	close(w.changed)
	w.changed = make(chan struct{})
}

// kick wakes the refill; w.mu is held.
func (w *Warm) kick() {
	select {
	case w.wake <- struct{}{}:
	default:
	}
}

// refill deletes the sandboxes found dead and restores one whenever a set has fewer than its
// size ready (the set missing most first), until Close.
func (w *Warm) refill() {
	defer close(w.done)
	for {
		w.mu.Lock()
		discard := w.discard
		w.discard = nil
		set := w.missing()
		w.mu.Unlock()
		for _, r := range discard {
			if err := r.Close(w.ctx); err != nil {
				w.fail("", err)
			}
		}
		if w.ctx.Err() != nil {
			return
		}
		if set == "" {
			select {
			case <-w.wake:
			case <-w.ctx.Done():
				return
			}
			continue
		}
		r, err := w.o.Restorer.Restore(w.ctx, set, launch.RestoreOptions{Pool: w.o.Pool, NoFallback: true})
		if err != nil {
			w.fail(set, err)
			select {
			case <-time.After(w.o.RetryDelay):
			case <-w.ctx.Done():
				return
			}
			continue
		}
		w.mu.Lock()
		w.live[r] = struct{}{}
		w.mu.Unlock()
		r.Sandbox.OnDelete(func() { w.forget(r) })
		w.mu.Lock()
		st := w.stats[set]
		st.Restored++
		st.RestoreTime += r.Marks.Connected.Sub(r.Marks.Began)
		w.lastErr = nil
		w.ready[set] = append(w.ready[set], r)
		w.broadcast()
		w.mu.Unlock()
	}
}

// fail records a failed restore (of set) or delete (set "") for Wait's error.
func (w *Warm) fail(set string, err error) {
	w.mu.Lock()
	defer w.mu.Unlock()
	if st := w.stats[set]; st != nil {
		st.Failed++
	}
	w.lastErr = err
	w.broadcast()
}

// forget drops a deleted sandbox.
func (w *Warm) forget(r *launch.Restored) {
	w.mu.Lock()
	defer w.mu.Unlock()
	delete(w.live, r)
	if _, ok := w.held[r]; ok {
		delete(w.held, r)
		w.kick()
	}
}
