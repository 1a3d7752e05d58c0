package launch

import (
	"context"
	"errors"
	"fmt"
	"io"
	"net"
	"slices"

	specs "github.com/opencontainers/runtime-spec/specs-go"

	"readie.dev/pipeline/pkg/executorproto"
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
	env := slices.Clone(o.Env)
	if _, err := out.Spec("/", env); err != nil { // a placeholder host directory: each sandbox has its own
		return nil, err
	}
	r := &Restorer{out: out, sandboxes: SandboxOptions{
		Runtime: o.Runtime, WorkDir: o.WorkDir, IDs: o.IDs,
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

// RestoreOptions say how one restore is served.
type RestoreOptions struct {
	// Pool, when set, gives the sandbox, created ahead; otherwise one is created for the
	// restore.
	Pool Pool
}

// How says which path served a restore.
type How string

const (
	// FromPool is a restore into a sandbox a pool created ahead.
	FromPool How = "pool"
	// Created is a restore into a sandbox created for it.
	Created How = "created"
)

// Restored is a checkpoint restored into a sandbox of its own, its executor connected. Call
// it, then Close it: Close deletes the sandbox, which is never used again (it holds the calls'
// state).
type Restored struct {
	Sandbox *Sandbox
	Conn    net.Conn
	// Marks: Began is the start of `runsc restore` (after the pool's Get or the create),
	// Started its return, Connected the executor's accept.
	Marks CallMarks
	How   How
}

// Restore restores set's checkpoint into a sandbox, from o.Pool or created for it (`runsc
// create`, never killed half-way), with `runsc restore -detach` and the manifest's restore
// flags, and dials the executor's socket (Sandbox.Open). On any failure the sandbox is deleted
// and the error carries the end of the executor's stderr.
//
// This is the kit's one restore path: the pipeline's soak takes it as a worker does, and the
// example worker (examples/worker) is a runnable whole around it.
func (r *Restorer) Restore(ctx context.Context, set string, o RestoreOptions) (*Restored, error) {
	img, err := r.out.Image(set)
	if err != nil {
		return nil, err
	}
	how := Created
	var sb *Sandbox
	if o.Pool != nil {
		how = FromPool
		sb, err = o.Pool.Get(ctx)
	} else {
		sb, err = NewSandbox(r.sandboxes, set, "restore")
		if err == nil {
			if err := sb.Create(ctx); err != nil {
				return nil, WithStderr(ctx, sb, fmt.Errorf("create a sandbox for %s: %w", set, err))
			}
		}
	}
	if err != nil {
		return nil, err
	}
	conn, marks, err := sb.Open(ctx, img)
	if err != nil {
		return nil, WithStderr(ctx, sb, fmt.Errorf("restore %s into %s: %w", set, sb.ID, err))
	}
	return &Restored{Sandbox: sb, Conn: conn, Marks: marks, How: how}, nil
}

// Call sends request to the restored executor and returns its answer, bounded by ctx, of at
// most maxResponseSize bytes (executorproto.Caller's MaxResponseSize; zero:
// executorproto.DefaultReadLimit). An answer is a stranger's data: read no more of it than the
// call needs (pycall.SmallResponse for a small value), since decoding may allocate some 320
// bytes per byte (pycall.Decode).
func (r *Restored) Call(ctx context.Context, request []byte, maxResponseSize int64) ([]byte, error) {
	caller := executorproto.Caller{MaxResponseSize: maxResponseSize}
	return caller.Call(ctx, r.Conn, request)
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
