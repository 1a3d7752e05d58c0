package launch

import (
	"context"
	"errors"
	"fmt"
	"io"
	"net"
	"slices"
	"time"

	specs "github.com/opencontainers/runtime-spec/specs-go"

	"readie.dev/pipeline/pkg/executorproto"
	"readie.dev/pipeline/pkg/pycall"
	"readie.dev/pipeline/pkg/sandbox"
)

// Options are what the sandboxes of a Restorer share, made on demand or ahead by a pool
// (Restorer.NewSandbox). Everything a restore needs of a sandbox is fixed when it is created
// (runsc restore onto a created sandbox uses the spec it was created with): the environment
// too.
type Options struct {
	// Runtime runs runsc; its Flags must be the output's (Output.Flags).
	Runtime *Runtime
	// WorkDir holds the sandboxes' bundles and host directories (SandboxOptions.WorkDir: a
	// short directory only root can enter).
	WorkDir string
	// IDs names the sandboxes: RandomIDs for a worker with a runsc root of its own; nil means
	// Runtime.NewID, bound to the runtime's lease (the pipeline's).
	IDs IDs
	// Env are KEY=VALUE entries of the restored executor's environment, each replacing the
	// restore spec's entry of that name or added (the executor's os.environ after a restore).
	Env []string
	// Output, when set, receives the executors' stdout and stderr, line by line after the
	// sandbox's ID (SandboxOptions.Output); the restorer serializes its writes.
	Output io.Writer
	// Limits bound each sandbox's memory, pids and CPU (SandboxOptions.Limits), a pool's
	// too: the worker's own, never the output's (whose restore spec holds no resources).
	Limits sandbox.Limits
}

// Restorer restores the checkpoints of one output, each into a sandbox of its own, and hands
// back the executor connected (Restore). It is safe for concurrent use.
type Restorer struct {
	out       *Output
	sandboxes SandboxOptions
}

// Restorer returns a restorer of out's checkpoints into sandboxes shaped by o. The spec of every
// sandbox is checked now, with o.Env: one that cannot be made is refused before any sandbox
// is (sandbox.ErrRestoreSpec).
func (out *Output) Restorer(o Options) (*Restorer, error) {
	if o.Runtime == nil {
		return nil, errors.New("launch: Options.Runtime is required")
	}
	if have, want := o.Runtime.Flags.Args(), out.Flags.Args(); !slices.Equal(have, want) {
		return nil, fmt.Errorf("launch: the runtime's runsc flags %q are not the output's %q: a restore needs the capture's (Output.Flags)", have, want)
	}
	if err := o.Limits.Check(); err != nil {
		return nil, fmt.Errorf("launch: %w", err)
	}
	env := slices.Clone(o.Env)
	if _, err := out.Spec("/", env); err != nil { // a placeholder host directory: each sandbox has its own
		return nil, err
	}
	r := &Restorer{out: out, sandboxes: SandboxOptions{
		Runtime: o.Runtime, WorkDir: o.WorkDir, IDs: o.IDs, Limits: o.Limits,
		Spec: func(hostDir string) (*specs.Spec, error) { return out.Spec(hostDir, env) },
	}}
	if o.Output != nil {
		r.sandboxes.Output = &lockedWriter{w: o.Output}
	}
	return r, nil
}

// NewSandbox prepares a sandbox of the restorer's shape, not created yet (set "pool", step
// "pooled"): what a pool creates ahead (pool.Options.New).
func (r *Restorer) NewSandbox() (*Sandbox, error) {
	return NewSandbox(r.sandboxes, "pool", "pooled")
}

// Pool hands out sandboxes created ahead, each once: a *pool.Pool of sandboxes made by
// Restorer.NewSandbox.
type Pool interface {
	Get(ctx context.Context) (*Sandbox, error)
}

// Warm hands out sandboxes restored ahead, each once: a *pool.Warm.
type Warm interface {
	// Take returns a sandbox of set's checkpoint restored ahead, its executor connected, or
	// nil when none is ready: it never waits.
	Take(set string) *Restored
}

// RestoreOptions say how one start is served: the fastest thing ready, a sandbox restored
// ahead (Warm), else a restore into a sandbox created ahead (Pool), else into one created for
// it.
type RestoreOptions struct {
	// Warm, when set, is asked first for a sandbox restored ahead, of the set or of one of
	// Also.
	Warm Warm
	// Also are other checkpoints that serve the request as well (a router's next choices, in
	// order): a warm sandbox of one of them is taken when the set has none ready. A restore is
	// always of the set itself.
	Also []string
	// Pool, when set, gives the sandbox, created ahead; otherwise one is created for the
	// restore.
	Pool Pool
	// NoFallback refuses OpenOptions.ColdFallback's cold start for this restore: a sandbox
	// restored ahead (pool.Warm's refill) must hold its checkpoint, or fail.
	NoFallback bool
}

// How says which path served a start.
type How string

const (
	// FromWarm is a sandbox restored ahead (RestoreOptions.Warm): nothing to restore.
	FromWarm How = "warm"
	// FromPool is a restore into a sandbox a pool created ahead.
	FromPool How = "pool"
	// Created is a restore into a sandbox created for it.
	Created How = "created"
	// Cold is the executor started cold: for no checkpoint (set ""), in a sandbox of the pool
	// or created for it; or in place of a checkpoint that could not be used (Restored.Cold
	// says why; Restorer.ColdStart imported the set's modules in a fresh executor).
	Cold How = "cold"
)

// Paths returns the values of How, fastest first.
func Paths() []How { return []How{FromWarm, FromPool, Created, Cold} }

// Restored is a checkpoint restored into a sandbox of its own (or the executor started cold),
// its executor connected. Call it, then Close it: Close deletes the sandbox, which is never
// used again (it holds the calls' state).
type Restored struct {
	Sandbox *Sandbox
	Conn    net.Conn
	// Set is the checkpoint restored ("" for a cold start): one of RestoreOptions.Also when a
	// warm sandbox of it served.
	Set string
	// Marks: Began is the start of `runsc restore` (after the pool's Get or the create),
	// Started its return, Connected the executor's accept; for a warm sandbox all three are
	// the moment it was taken. For a cold start in place of a checkpoint: Began is the start
	// of `runsc create`, Answered the answer of the imports.
	Marks CallMarks
	How   How
	// Cold, for a cold start (How Cold), says why the checkpoint was not used and what the
	// cold start cost; nil for a restore.
	Cold *ColdStart
}

// ColdStart is what a cold start of a set (Restorer.ColdStart) reports.
type ColdStart struct {
	// Why is why the checkpoint was not used: its files failed verification
	// (Output.Unusable), its restore failed, or the caller's reason.
	Why error
	// Took is the cold start's cost: from `runsc create` to the answer of its imports.
	Took time.Duration
}

// Restore starts set's checkpoint for a request by the fastest path ready: a sandbox restored
// ahead (o.Warm, of set or of o.Also), else a restore into a sandbox from o.Pool, else into
// one created for it (`runsc create`, never killed half-way), with `runsc restore -detach` and
// the manifest's restore flags; then it dials the executor's socket (Sandbox.Open). Set ""
// starts the executor cold (no checkpoint serves the request), in a sandbox of o.Pool or
// created for it. Restored.How says which path served. On any failure the sandbox is deleted
// and the error carries the end of the executor's stderr.
//
// With OpenOptions.ColdFallback, a set whose checkpoint failed verification, or whose restore
// fails (not the pool's Get or the create, which are not the checkpoint's, nor a cancelled
// ctx), is started cold instead (ColdStart): Restored.How is Cold and Restored.Cold says why
// and what it cost. An error then carries the restore's failure and the cold start's.
//
// This is the kit's one restore path: the pipeline's soak takes it as a worker does, and the
// example worker (examples/worker) is a runnable whole around it.
func (r *Restorer) Restore(ctx context.Context, set string, o RestoreOptions) (*Restored, error) {
	if o.Warm != nil && set != "" {
		for _, s := range append([]string{set}, o.Also...) {
			if s == "" {
				continue
			}
			if warm := o.Warm.Take(s); warm != nil {
				now := time.Now()
				warm.How, warm.Set, warm.Marks = FromWarm, s, CallMarks{Began: now, Started: now, Connected: now}
				return warm, nil
			}
		}
	}
	var img Image // the zero Image: a cold start
	name, step, how := "cold", "start", Cold
	if set != "" {
		var err error
		if img, err = r.out.Image(set); err != nil {
			return nil, err
		}
		name, step, how = set, "restore", Created
	}
	if set != "" {
		if why := r.out.Unusable(set); why != nil {
			if o.NoFallback {
				return nil, why
			}
			return r.ColdStart(ctx, set, why)
		}
	}
	var sb *Sandbox
	var err error
	if o.Pool != nil {
		if how != Cold {
			how = FromPool
		}
		sb, err = o.Pool.Get(ctx)
	} else {
		sb, err = NewSandbox(r.sandboxes, name, step)
		if err == nil {
			if err := sb.Create(ctx); err != nil {
				return nil, WithStderr(ctx, sb, fmt.Errorf("create a sandbox for %s: %w", name, err))
			}
		}
	}
	if err != nil {
		return nil, err
	}
	conn, marks, err := sb.Open(ctx, img)
	if err != nil {
		if how == Cold {
			return nil, WithStderr(ctx, sb, fmt.Errorf("start the executor cold in %s: %w", sb.ID, err))
		}
		err = WithStderr(ctx, sb, fmt.Errorf("restore %s into %s: %w", set, sb.ID, err))
		if !r.out.coldFallback || o.NoFallback || ctx.Err() != nil {
			return nil, err
		}
		cold, coldErr := r.ColdStart(ctx, set, err)
		if coldErr != nil {
			return nil, fmt.Errorf("%w; then, starting it cold: %w", err, coldErr)
		}
		return cold, nil
	}
	return &Restored{Sandbox: sb, Conn: conn, Set: set, Marks: marks, How: how}, nil
}

// ColdStart starts set cold, without its checkpoint: a sandbox of the restorer's shape created
// for it (the output's restore spec, the restorer's environment and limits), the executor
// started from nothing (`runsc create`, `runsc start`), dialled, and every module of the set
// imported (pycall.ImportRequest) before it is handed back, as a restore would have it. why
// is why the checkpoint is not used (Restored.Cold.Why): Restore's fallback, or a caller's
// own (a host that cannot restore it, ErrHost). On any failure the sandbox is deleted and the
// error carries the end of the executor's stderr.
func (r *Restorer) ColdStart(ctx context.Context, set string, why error) (*Restored, error) {
	c, err := r.out.Checkpoint(set)
	if err != nil {
		return nil, err
	}
	request, err := pycall.ImportRequest(c.Imports)
	if err != nil {
		return nil, err
	}
	sb, err := NewSandbox(r.sandboxes, set, "cold")
	if err != nil {
		return nil, err
	}
	conn, marks, err := sb.Open(ctx, Image{}) // the zero Image: create, then start cold
	if err != nil {
		return nil, WithStderr(ctx, sb, fmt.Errorf("start %s cold in %s: %w", set, sb.ID, err))
	}
	restored := &Restored{Sandbox: sb, Conn: conn, Marks: marks, How: Cold}
	response, err := restored.Call(ctx, request, pycall.SmallResponse)
	if err == nil {
		err = pycall.CheckImported(response, c.Imports)
	}
	if err != nil {
		conn.Close()
		return nil, WithStderr(ctx, sb, fmt.Errorf("import the modules of %s cold in %s: %w", set, sb.ID, err))
	}
	restored.Marks.Answered = time.Now()
	restored.Cold = &ColdStart{Why: why, Took: restored.Marks.Answered.Sub(marks.Began)}
	return restored, nil
}

// Call sends request to the restored executor and returns its answer, bounded by ctx, of at
// most maxResponseSize bytes (executorproto.Caller's MaxResponseSize; a limit of zero or less
// is refused: no default reads a stranger's 256 MiB). An answer is a stranger's data: read no
// more of it than the call needs (pycall.SmallResponse for a small value), since decoding may
// allocate some 320 bytes per byte (pycall.Decode). A call that went past one of the sandbox's limits says
// which: one that failed, with ErrMemoryLimit or ErrPidsLimit (Sandbox.LimitError); one that
// answered although the pids limit refused it forks or threads (its code saw ENOMEM), with the
// answer and an error matching ErrPidsLimit.
func (r *Restored) Call(ctx context.Context, request []byte, maxResponseSize int64) ([]byte, error) {
	if maxResponseSize <= 0 {
		return nil, fmt.Errorf("call %s: a response limit of %d bytes: give the most the call needs (pycall.SmallResponse for a small value)", r.Sandbox.ID, maxResponseSize)
	}
	refused := r.Sandbox.pidsRefused()
	caller := executorproto.Caller{MaxResponseSize: maxResponseSize}
	response, err := caller.Call(ctx, r.Conn, request)
	if err != nil {
		return nil, r.Sandbox.LimitError(err)
	}
	if now := r.Sandbox.pidsRefused(); now > refused {
		return response, r.Sandbox.pidsError(now - refused)
	}
	return response, nil
}

// Close closes the connection and deletes the sandbox (Sandbox.Delete: exactly once, even
// once ctx is cancelled); it returns a failed delete.
func (r *Restored) Close(ctx context.Context) error {
	err := r.Conn.Close()
	if errors.Is(err, net.ErrClosed) {
		err = nil
	}
	return errors.Join(err, r.Sandbox.Delete(ctx))
}
