// Command worker is an example of a worker that restores an output of the readie pipeline
// through pkg/ alone, on the kit's one restore path (pkg/launch): it opens the output
// (launch.OpenOutput: its manifest, flags, rootfs, restore spec and bytes checked), checks
// that this host can restore it (Output.CheckHost), serves -calls calls, each restoring one
// checkpoint into a sandbox of its own (Restorer.Restore, the fastest thing ready): a sandbox
// restored ahead (-warm N, pkg/pool.Warm: the start is the call alone), else one taken from a
// pool of sandboxes created ahead (-pool N, pkg/pool: the restore does not pay for the
// sandbox's start-up), else one created on demand; it says which served each call; calls the executor, checks the answer, and deletes every sandbox on
// every path, SIGINT and SIGTERM included. Each sandbox is bounded by the worker's limits
// (-memory, -pids, -cpus: sandbox.Limits, never the output's): a call past one fails naming
// it, and the next call is served. With -fallback cold, a checkpoint that fails its checks
// (its files, this host) or its restore is served by a cold start of its set
// (Restorer.ColdStart), and the worker says why and what it cost.
//
//	worker -out OUT (-runsc PATH [-rootfs DIR] | -runtime DIR) [-set ID] [-root DIR] [-eval EXPR] [-timeout D] [-pool N] [-warm N] [-calls K]
//	       [-memory SIZE] [-pids N] [-cpus X] [-fallback none|cold]
//
// Exit codes: 0 the call answered as it should; 1 the host cannot restore the output, or the
// restore or the call failed; 2 bad flags or an output that does not load or verify; 128+N
// when stopped by signal N, after the sandbox was deleted.
package main

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"errors"
	"flag"
	"fmt"
	"io"
	"os"
	"os/signal"
	"path/filepath"
	"sync"
	"syscall"
	"time"

	"readie.dev/pipeline/pkg/exitcode"
	"readie.dev/pipeline/pkg/launch"
	"readie.dev/pipeline/pkg/manifest"
	"readie.dev/pipeline/pkg/pool"
	"readie.dev/pipeline/pkg/pycall"
	"readie.dev/pipeline/pkg/sandbox"
)

func main() {
	os.Exit(run(os.Args[1:], os.Stdout, os.Stderr))
}

// options are the worker's flags.
type options struct {
	out, runsc, set, rootfs, runtime, root, eval, fallback string
	timeout                                                time.Duration
	pool, warm, calls                                      int
	limits                                                 sandbox.Limits
}

// errBadInput marks bad flags or an output that cannot be used at all (exit 2).
var errBadInput = errors.New("bad input")

func run(args []string, stdout, stderr io.Writer) int {
	fs := flag.NewFlagSet("worker", flag.ContinueOnError)
	fs.SetOutput(stderr)
	var o options
	fs.StringVar(&o.out, "out", "", "the output directory (manifest.json)")
	fs.StringVar(&o.runsc, "runsc", "", "this host's runsc binary")
	fs.StringVar(&o.set, "set", "empty", "the checkpoint to restore")
	fs.StringVar(&o.rootfs, "rootfs", "", "this host's copy of the output's rootfs (default: the manifest's rootfs.path); the digest it records must be the manifest's")
	fs.StringVar(&o.runtime, "runtime", "", "this host's runtime, as `pipeline pull REF OUT --runtime DIR` lays it out: DIR/runsc with its helpers in DIR/gvisor-bin, DIR/rootfs (instead of -runsc and -rootfs); DIR must be private, and its runsc and helpers the output's (launch.CheckRuntimeDir, before they run)")
	fs.StringVar(&o.root, "root", "/run/readie-worker/runsc", "runsc's state root, private to the worker")
	fs.StringVar(&o.eval, "eval", "", fmt.Sprintf("a Python expression to evaluate in the restored executor after the check (an answer of at most %d KiB; its first %d KiB printed)", evalResponseSize>>10, printBytes>>10))
	fs.DurationVar(&o.timeout, "timeout", time.Minute, "the limit of the whole restore and calls")
	fs.IntVar(&o.pool, "pool", 0, "keep this many sandboxes created ahead and restore each call into one (0: create a sandbox per call)")
	fs.IntVar(&o.warm, "warm", 0, "keep this many sandboxes of -set restored ahead (pkg/pool.Warm, refilled in the background, into -pool's sandboxes when there is a pool); a call takes one when one is ready, else restores")
	fs.IntVar(&o.calls, "calls", 1, "how many calls to serve, each in a sandbox of its own")
	o.limits = sandbox.Limits{Memory: 1 << 30, Pids: 1024}
	fs.Var(&o.limits.Memory, "memory", "each sandbox's memory limit, a size as the pipeline's config writes them (512MiB); 0: none")
	fs.Int64Var(&o.limits.Pids, "pids", o.limits.Pids, "each sandbox's limit of host tasks (its threads and processes); 0: none")
	fs.Float64Var(&o.limits.CPUs, "cpus", 0, "each sandbox's CPU time, in CPUs (1.5); 0: none")
	fs.StringVar(&o.fallback, "fallback", "none", "cold: serve a set whose checkpoint fails its checks or its restore by a cold start; none: fail the call")
	if err := fs.Parse(args); err != nil {
		return exitcode.Usage
	}
	if o.fallback != "none" && o.fallback != "cold" {
		fmt.Fprintf(stderr, "worker: -fallback %q: want none or cold\n", o.fallback)
		return exitcode.Usage
	}
	if err := o.limits.Check(); err != nil {
		fmt.Fprintf(stderr, "worker: %v\n", err)
		return exitcode.Usage
	}
	if o.runtime != "" && (o.runsc != "" || o.rootfs != "") {
		fmt.Fprintln(stderr, "worker: -runtime DIR names runsc and the rootfs (DIR/runsc, DIR/rootfs): give it without -runsc and -rootfs")
		return exitcode.Usage
	}
	if o.out == "" || o.runsc == "" && o.runtime == "" || fs.NArg() > 0 {
		fmt.Fprintln(stderr, "worker: -out and -runsc (or -runtime) are required, and nothing else")
		return exitcode.Usage
	}
	if o.pool < 0 || o.warm < 0 || o.calls < 1 {
		fmt.Fprintf(stderr, "worker: -pool %d -warm %d -calls %d: want -pool >= 0, -warm >= 0 and -calls >= 1\n", o.pool, o.warm, o.calls)
		return exitcode.Usage
	}

	// A signal cancels everything under way; the sandbox is still deleted (below).
	ctx, cancel := context.WithCancelCause(context.Background())
	defer cancel(nil)
	signals := make(chan os.Signal, 1)
	signal.Notify(signals, syscall.SIGINT, syscall.SIGTERM)
	defer signal.Stop(signals)
	var stoppedBy syscall.Signal
	var stopMu sync.Mutex
	go func() {
		sig, ok := <-signals
		if !ok {
			return
		}
		stopMu.Lock()
		stoppedBy = sig.(syscall.Signal)
		stopMu.Unlock()
		cancel(fmt.Errorf("stopped by %v", sig))
	}()

	err := restoreAndCall(ctx, o, stdout, stderr)
	stopMu.Lock()
	defer stopMu.Unlock()
	switch {
	case stoppedBy != 0:
		fmt.Fprintf(stderr, "worker: stopped by %v (every sandbox was deleted): %v\n", stoppedBy, err)
		return exitcode.ForSignal(stoppedBy)
	case errors.Is(err, errBadInput):
		fmt.Fprintf(stderr, "worker: %v\n", err)
		return exitcode.Usage
	case err != nil:
		fmt.Fprintf(stderr, "worker: %v\n", err)
		return exitcode.Failed
	}
	return exitcode.OK
}

// restoreAndCall is the worker's job in the order a worker does it: open and check the output
// (launch.OpenOutput: every field that reaches runsc or the host, every byte), check this
// host, then serve -calls calls, each restored into a sandbox of its own through the kit's one
// restore path (launch.Restorer.Restore): taken from a pool of sandboxes created ahead (-pool
// N), or created on demand.
func restoreAndCall(ctx context.Context, o options, stdout, stderr io.Writer) (err error) {
	cold := o.fallback == "cold"
	var helpers string // empty: gvisor-bin/ beside runsc
	if o.runtime != "" {
		// Before anything reads what DIR holds or runs its runsc (CheckHost's runsc --version
		// included), whatever -fallback says: DIR must be private and its runsc the output's.
		m, err := manifest.Load(filepath.Join(o.out, manifest.FileName))
		if err != nil {
			return fmt.Errorf("%w: %w", errBadInput, err)
		}
		in, err := launch.CheckRuntimeDir(o.runtime, m)
		if err != nil {
			return fmt.Errorf("%w: -runtime: %w", errBadInput, err)
		}
		o.runsc, helpers, o.rootfs = in.Runsc, in.Helpers, in.Rootfs
	}
	out, err := launch.OpenOutput(o.out, launch.OpenOptions{Rootfs: o.rootfs, Verify: true, ColdFallback: cold})
	if err != nil {
		return fmt.Errorf("%w: %w", errBadInput, err)
	}
	c, err := out.Checkpoint(o.set)
	if err != nil {
		return fmt.Errorf("%w: %w", errBadInput, err)
	}
	if why := out.Unusable(o.set); why != nil {
		fmt.Fprintf(stderr, "worker: %s will start cold: %v\n", c.ID, why)
	}
	rt := &launch.Runtime{Path: o.runsc, HelpersDir: helpers, Root: o.root, Flags: out.Flags}
	warnings, err := out.CheckHost(ctx, rt, o.set)
	for _, w := range warnings { // an unenforced CPU baseline, say: it does not stop the worker
		fmt.Fprintf(stderr, "worker: warning: %s\n", w)
	}
	// A host that cannot restore the checkpoint (another runsc, missing CPU features) can
	// still start its set cold.
	var hostErr error
	switch {
	case err != nil && cold && errors.Is(err, launch.ErrHost):
		fmt.Fprintf(stderr, "worker: %s will start cold: %v\n", c.ID, err)
		hostErr = err
	case err != nil:
		return err
	}

	// A short scratch directory, only root's (0700): the socket's path must fit in a Unix
	// socket address, and the host directory of each sandbox in it is handed to the image's
	// user.
	work, err := os.MkdirTemp("", "rw-")
	if err != nil {
		return err
	}
	defer os.RemoveAll(work)
	// The token is in the environment the sandbox is created with, which a restore onto it
	// keeps: the smoke call reads it back.
	token := randomHex(8)
	r, err := out.Restorer(launch.Options{
		Runtime: rt, WorkDir: work, IDs: launch.RandomIDs{Prefix: "worker"},
		Env: []string{pycall.SmokeTokenVar + "=" + token}, Output: &prefixed{w: stderr, prefix: "executor "},
		Limits: o.limits,
	})
	if err != nil { // refused before any sandbox
		return fmt.Errorf("%w: %w", errBadInput, err)
	}

	ctx, cancel := context.WithTimeoutCause(ctx, o.timeout, fmt.Errorf("restoring and calling %s exceeded -timeout %s", c.ID, o.timeout))
	defer cancel()
	var from launch.RestoreOptions
	if o.pool > 0 {
		fmt.Fprintf(stderr, "worker: filling a pool of %d\n", o.pool)
		p, err := pool.New(ctx, pool.Options{New: r.NewSandbox, Size: o.pool})
		if err != nil {
			return err
		}
		// Every sandbox the pool made is deleted, on SIGTERM too (ctx is cancelled, and
		// Close waits for the creates under way and the deletes).
		defer func() { err = errors.Join(err, p.Close()) }()
		if err := p.Wait(ctx); err != nil { // a worker fills its pool before it takes calls
			return err
		}
		from.Pool = p
	}
	switch {
	case o.warm > 0 && hostErr != nil:
		fmt.Fprintf(stderr, "worker: no sandbox of %s kept restored ahead: this host cannot restore its checkpoint\n", c.ID)
	case o.warm > 0:
		fmt.Fprintf(stderr, "worker: restoring %d sandboxes of %s ahead\n", o.warm, c.ID)
		w, err := pool.NewWarm(ctx, pool.WarmOptions{Restorer: r, Sizes: map[string]int{c.ID: o.warm}, Pool: from.Pool})
		if err != nil {
			return err
		}
		// Every sandbox it restored is deleted, handed out or not, on SIGTERM too.
		defer func() { err = errors.Join(err, w.Close()) }()
		if err := w.Wait(ctx); err != nil { // full before the first call, as the pool
			return err
		}
		from.Warm = w
	}
	var failed []error
	for i := range o.calls {
		err := serve(ctx, r, from, hostErr, o, c, token, fmt.Sprintf("call %d of %d", i+1, o.calls), stdout)
		switch {
		case err == nil:
		case ctx.Err() != nil:
			return err
		default: // a call past a limit, say: the next one is served all the same
			fmt.Fprintf(stderr, "worker: call %d of %d failed: %v\n", i+1, o.calls, err)
			failed = append(failed, err)
		}
	}
	if len(failed) > 0 {
		return fmt.Errorf("%d of %d calls failed, the first: %w", len(failed), o.calls, failed[0])
	}
	return nil
}

// printBytes is the most of -eval's value the worker prints; evalResponseSize the most of
// its answer read: decoding may allocate some 320 bytes per byte of it (pycall.Decode).
const (
	printBytes       = 64 << 10
	evalResponseSize = 256 << 10
)

// serve restores c (Restorer.Restore; or starts it cold, Restorer.ColdStart, when hostErr says
// this host cannot restore it), checks the executor's answer to the smoke request, evaluates
// -eval, and deletes the sandbox on every path: a sandbox that ran a call is never used again.
// It says how long the restore took from its start (before the pool's Get or the create) and
// which path served it; for a cold start, why the checkpoint was not used and what the cold
// start cost.
func serve(ctx context.Context, r *launch.Restorer, from launch.RestoreOptions, hostErr error, o options, c *manifest.Checkpoint, token, which string, stdout io.Writer) (err error) {
	start := time.Now()
	var restored *launch.Restored
	if hostErr != nil {
		restored, err = r.ColdStart(ctx, c.ID, hostErr)
	} else {
		restored, err = r.Restore(ctx, c.ID, from)
	}
	if err != nil {
		return err
	}
	defer func() { err = errors.Join(err, restored.Close(ctx)) }()
	ready := time.Since(start)
	switch restored.How { // the path that served the call: the fastest ready (Restorer.Restore)
	case launch.FromWarm:
		which += ", restored ahead"
	case launch.FromPool:
		which += fmt.Sprintf(", from a pool of %d", o.pool)
	case launch.Created:
		which += ", created on demand"
	}
	request, err := pycall.SmokeRequest(c.Imports)
	if err != nil {
		return err
	}
	response, err := restored.Call(ctx, request, pycall.SmallResponse)
	if err != nil {
		return err
	}
	if err := pycall.CheckSmokeResponse(response, token); err != nil {
		return err
	}
	if restored.Cold != nil {
		fmt.Fprintf(stdout, "worker: %s started cold in %.0f ms (the cold start itself %.0f ms) and answered in %.0f ms (%s, not its checkpoint: %v): its modules were imported and it sees the worker's environment\n",
			c.ID, ms(ready), ms(restored.Cold.Took), ms(time.Since(start)), which, restored.Cold.Why)
	} else {
		fmt.Fprintf(stdout, "worker: %s restored in %.0f ms and answered in %.0f ms (%s): its modules were imported and it sees the restore-time environment\n",
			c.ID, ms(ready), ms(time.Since(start)), which)
	}
	if o.eval == "" {
		return nil
	}
	request, err = pycall.EvalRequest(o.eval)
	if err != nil {
		return err
	}
	fmt.Fprintf(stdout, "worker: eval %s\n", o.eval)
	if response, err = restored.Call(ctx, request, evalResponseSize); err != nil {
		return err
	}
	value, err := pycall.DecodeEnvelope(response)
	if err != nil {
		return err
	}
	fmt.Fprintf(stdout, "worker: = %s\n", pycall.Format(value, printBytes))
	return nil
}

// prefixed writes each write (a line, from launch.Options.Output) to w after prefix.
type prefixed struct {
	w      io.Writer
	prefix string
}

func (x *prefixed) Write(b []byte) (int, error) {
	if _, err := fmt.Fprintf(x.w, "%s%s", x.prefix, b); err != nil {
		return 0, err
	}
	return len(b), nil
}

func randomHex(n int) string {
	b := make([]byte, n)
	rand.Read(b)
	return hex.EncodeToString(b)
}

func ms(d time.Duration) float64 { return float64(d.Microseconds()) / 1000 }
