// Command worker is an example of a worker that restores an output of the readie pipeline
// through pkg/ alone: it loads the output's manifest, checks that this host can restore it,
// serves -calls calls, each restoring one checkpoint into a sandbox of its own: one taken from
// a pool of sandboxes created ahead (-pool N, pkg/pool: the restore does not pay for the
// sandbox's start-up), or one created on demand; calls the executor, checks the answer, and
// deletes every sandbox on every path, SIGINT and SIGTERM included.
//
//	worker -out OUT -runsc PATH [-set ID] [-rootfs DIR] [-root DIR] [-eval EXPR] [-timeout D] [-pool N] [-calls K]
//
// Exit codes: 0 the call answered as it should; 1 the host cannot restore the output, or the
// restore or the call failed; 2 bad flags or an output that does not load or verify; 128+N
// when stopped by signal N, after the sandbox was deleted.
package main

import (
	"bufio"
	"context"
	"crypto/rand"
	"encoding/hex"
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"io"
	"os"
	"os/signal"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"syscall"
	"time"

	"readie.dev/pipeline/pkg/executorproto"
	"readie.dev/pipeline/pkg/exitcode"
	"readie.dev/pipeline/pkg/manifest"
	"readie.dev/pipeline/pkg/pool"
	"readie.dev/pipeline/pkg/pycall"
	"readie.dev/pipeline/pkg/runsc"
	"readie.dev/pipeline/pkg/sandbox"
)

func main() {
	os.Exit(run(os.Args[1:], os.Stdout, os.Stderr))
}

// options are the worker's flags.
type options struct {
	out, runsc, set, rootfs, root, eval string
	timeout                             time.Duration
	pool, calls                         int
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
	fs.StringVar(&o.root, "root", "/run/readie-worker/runsc", "runsc's state root, private to the worker")
	fs.StringVar(&o.eval, "eval", "", fmt.Sprintf("a Python expression to evaluate in the restored executor after the check (an answer of at most %d MiB; its first %d KiB printed)", evalResponseSize>>20, printBytes>>10))
	fs.DurationVar(&o.timeout, "timeout", time.Minute, "the limit of the whole restore and calls")
	fs.IntVar(&o.pool, "pool", 0, "keep this many sandboxes created ahead and restore each call into one (0: create a sandbox per call)")
	fs.IntVar(&o.calls, "calls", 1, "how many calls to serve, each in a sandbox of its own")
	if err := fs.Parse(args); err != nil {
		return exitcode.Usage
	}
	if o.out == "" || o.runsc == "" || fs.NArg() > 0 {
		fmt.Fprintln(stderr, "worker: -out and -runsc are required, and nothing else")
		return exitcode.Usage
	}
	if o.pool < 0 || o.calls < 1 {
		fmt.Fprintf(stderr, "worker: -pool %d -calls %d: want -pool >= 0 and -calls >= 1\n", o.pool, o.calls)
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

// restoreAndCall is the worker's job in the order a worker does it: open and check the output,
// then serve -calls calls, each in a sandbox of its own restored from the checkpoint: taken from
// a pool of sandboxes created ahead (-pool N), or created on demand.
func restoreAndCall(ctx context.Context, o options, stdout, stderr io.Writer) (err error) {
	m, c, err := openCheckpoint(o)
	if err != nil {
		return err
	}
	flags, rootfs, err := checkManifest(o, m)
	if err != nil {
		return err
	}
	r := &runsc.Runsc{Path: o.runsc, Root: o.root, GlobalArgs: flags.Args()}
	if err := checkHost(ctx, r, m, o.set, stderr); err != nil {
		return err
	}
	// Every byte against the manifest before anything of it runs.
	if _, err := manifest.Verify(o.out, executorproto.Version); err != nil {
		return fmt.Errorf("%w: %w", errBadInput, err)
	}

	// A short scratch directory: the socket's path must fit in a Unix socket address.
	work, err := os.MkdirTemp("", "rw-")
	if err != nil {
		return err
	}
	defer os.RemoveAll(work)
	// The token is in the environment the sandbox is created with, which a restore onto it
	// keeps: the smoke call reads it back.
	token := randomHex(8)
	specFor, err := pool.FromRestoreSpec(filepath.Join(o.out, m.Spec), m.SpecFingerprint, m.RunscFlags, sandbox.RestoreOptions{
		Rootfs: rootfs, Env: []string{pycall.SmokeTokenVar + "=" + token},
	})
	if err != nil { // refused before any sandbox
		return fmt.Errorf("%w: %w", errBadInput, err)
	}

	ctx, cancel := context.WithTimeoutCause(ctx, o.timeout, fmt.Errorf("restoring and calling %s exceeded -timeout %s", c.ID, o.timeout))
	defer cancel()
	newID := func() (string, error) { return "worker-" + c.ID + "-" + randomHex(4), nil }
	image := filepath.Join(o.out, c.Dir)
	how := "created on demand"
	var p *pool.Pool
	if o.pool > 0 {
		how = fmt.Sprintf("from a pool of %d", o.pool)
		p, err = pool.New(ctx, pool.Options{Runsc: r, Size: o.pool, Dir: filepath.Join(work, "p"), Spec: specFor, NewID: newID, Output: &prefixed{w: stderr, prefix: "executor "}})
		if err != nil {
			return err
		}
		// Every sandbox the pool made is deleted, on SIGTERM too (ctx is cancelled, and
		// Close waits for the deletes).
		defer func() { err = errors.Join(err, p.Close()) }()
		if err := p.Wait(ctx); err != nil { // a worker fills its pool before it takes calls
			return err
		}
	}
	for i := range o.calls {
		var err error
		start := time.Now()
		if p != nil {
			err = callPooled(ctx, p, image, m.RestoreFlags, func(socket string) error {
				return call(ctx, o, c, socket, token, start, fmt.Sprintf("call %d of %d, %s", i+1, o.calls, how), stdout)
			})
		} else {
			err = callOnDemand(ctx, r, work, image, m.RestoreFlags, specFor, newID, stderr, func(socket string) error {
				return call(ctx, o, c, socket, token, start, fmt.Sprintf("call %d of %d, %s", i+1, o.calls, how), stdout)
			})
		}
		if err != nil {
			return err
		}
	}
	return nil
}

// callPooled restores the image into a sandbox of the pool, runs serve on its socket, and
// deletes the sandbox: a sandbox that ran a call is never used again.
func callPooled(ctx context.Context, p *pool.Pool, image string, flags []string, serve func(socket string) error) (err error) {
	sb, err := p.Get(ctx)
	if err != nil {
		return err
	}
	defer func() { err = errors.Join(err, sb.Delete(ctx)) }()
	if err := sb.Restore(ctx, image, flags); err != nil {
		return err
	}
	return serve(sb.SocketPath())
}

// callOnDemand creates a sandbox (its bundle under work), restores the image into it, runs
// serve on its socket, and deletes it on every path.
func callOnDemand(ctx context.Context, r *runsc.Runsc, work, image string, flags []string, specFor pool.SpecFunc, newID func() (string, error), stderr io.Writer, serve func(socket string) error) (err error) {
	id, err := newID()
	if err != nil {
		return err
	}
	b, err := writeBundle(work, id, specFor)
	if err != nil {
		return err
	}
	defer os.RemoveAll(b.dir)
	defer os.RemoveAll(b.hostDir)
	// Pipes for the executor's stdout and stderr, as it had when it was captured: a restore
	// needs stdio of the same kinds.
	executorOut, err := relay(stderr, "executor: ")
	if err != nil {
		return err
	}
	// Deleted on every path: after a failed create too (--force succeeds for a sandbox that
	// is not there), and once ctx is cancelled (WithoutCancel; Delete has its own limit).
	defer func() {
		if deleteErr := r.Delete(context.WithoutCancel(ctx), id, &runsc.DeleteOpts{Force: true}); deleteErr != nil {
			err = errors.Join(err, fmt.Errorf("the sandbox %s may be left behind: %w", id, deleteErr))
		}
		err = errors.Join(err, executorOut.wait())
	}()
	err = r.Create(ctx, id, b.dir, &runsc.CreateOpts{IO: runsc.IO{Stdout: executorOut.w, Stderr: executorOut.w}})
	executorOut.w.Close() // the sandbox holds its own copy now
	if err != nil {
		return err
	}
	if _, err := r.Restore(ctx, id, b.dir, &runsc.RestoreOpts{ImagePath: image, Detach: true, ExtraArgs: flags}); err != nil {
		return err
	}
	return serve(filepath.Join(b.hostDir, sandbox.SocketName))
}

// openCheckpoint loads the output's manifest and finds the checkpoint of -set in it.
func openCheckpoint(o options) (*manifest.Manifest, manifest.Checkpoint, error) {
	m, err := manifest.Load(filepath.Join(o.out, manifest.FileName))
	if err != nil {
		return nil, manifest.Checkpoint{}, fmt.Errorf("%w: %w", errBadInput, err)
	}
	if err := m.CheckProtocol(executorproto.Version); err != nil {
		return nil, manifest.Checkpoint{}, fmt.Errorf("%w: %w", errBadInput, err)
	}
	i := slices.IndexFunc(m.Checkpoints, func(c manifest.Checkpoint) bool { return c.ID == o.set })
	if i < 0 {
		return nil, manifest.Checkpoint{}, fmt.Errorf("%w: %s has no checkpoint %q", errBadInput, o.out, o.set)
	}
	return m, m.Checkpoints[i], nil
}

// checkManifest checks what of the manifest reaches runsc as root against the kit's
// allow-list (its runsc and restore flags), and the rootfs this host restores on (-rootfs, or
// the manifest's) against the manifest's digest.
func checkManifest(o options, m *manifest.Manifest) (sandbox.Flags, string, error) {
	flags, err := sandbox.ParseFlags(m.RunscFlags)
	if err != nil {
		return sandbox.Flags{}, "", fmt.Errorf("%w: the manifest's runsc_flags: %w", errBadInput, err)
	}
	if err := sandbox.CheckRestoreFlags(m.RestoreFlags); err != nil {
		return sandbox.Flags{}, "", fmt.Errorf("%w: the manifest's restore_flags: %w", errBadInput, err)
	}
	rootfs := o.rootfs
	if rootfs == "" {
		rootfs = m.Rootfs.Path
	}
	if err := m.CheckRootfs(rootfs); err != nil {
		return sandbox.Flags{}, "", fmt.Errorf("%w: %w", errBadInput, err)
	}
	return flags, rootfs, nil
}

// bundle is a restore bundle: its directory (config.json) and the host directory the
// executor's socket appears in.
type bundle struct{ dir, hostDir string }

// writeBundle writes the output's restore spec, made this host's (specFor), into a bundle of
// the sandbox id under work.
func writeBundle(work, id string, specFor pool.SpecFunc) (bundle, error) {
	b := bundle{dir: filepath.Join(work, "b-"+id), hostDir: filepath.Join(work, "h-"+id[len(id)-8:])}
	for _, dir := range []string{b.hostDir, b.dir} {
		if err := os.Mkdir(dir, 0o755); err != nil {
			return bundle{}, err
		}
	}
	spec, err := specFor(b.hostDir)
	if err != nil {
		return bundle{}, err
	}
	// An image's non-root user must be able to bind the executor's socket there.
	if err := sandbox.PrepareHostDir(b.hostDir, spec.Process.User); err != nil {
		return bundle{}, err
	}
	data, err := json.Marshal(spec)
	if err != nil {
		return bundle{}, err
	}
	return b, os.WriteFile(filepath.Join(b.dir, "config.json"), data, 0o600)
}

// printBytes is the most of -eval's value the worker prints; evalResponseSize the most of
// its answer read: decoding may allocate some 320 bytes per byte of it (pycall.Decode).
const (
	printBytes       = 64 << 10
	evalResponseSize = 4 << 20
)

// call dials the restored executor on socket, checks its answer to the smoke request, and
// evaluates -eval; start is when the start began (before Get or create), which says how.
func call(ctx context.Context, o options, c manifest.Checkpoint, socket, token string, start time.Time, which string, stdout io.Writer) error {
	restored := time.Since(start)
	conn, err := executorproto.Dial(ctx, socket)
	if err != nil {
		return err
	}
	defer conn.Close()
	request, err := pycall.SmokeRequest(c.Imports)
	if err != nil {
		return err
	}
	smoke := executorproto.Caller{MaxResponseSize: pycall.SmallResponse}
	response, err := smoke.Call(ctx, conn, request)
	if err != nil {
		return err
	}
	if err := pycall.CheckSmokeResponse(response, token); err != nil {
		return err
	}
	fmt.Fprintf(stdout, "worker: %s restored in %.0f ms and answered in %.0f ms (%s): its modules were imported and it sees the restore-time environment\n",
		c.ID, ms(restored), ms(time.Since(start)), which)
	if o.eval == "" {
		return nil
	}
	request, err = pycall.EvalRequest(o.eval)
	if err != nil {
		return err
	}
	fmt.Fprintf(stdout, "worker: eval %s\n", o.eval)
	eval := executorproto.Caller{MaxResponseSize: evalResponseSize}
	if response, err = eval.Call(ctx, conn, request); err != nil {
		return err
	}
	value, err := pycall.DecodeEnvelope(response)
	if err != nil {
		return err
	}
	fmt.Fprintf(stdout, "worker: = %s\n", pycall.Format(value, printBytes))
	return nil
}

// checkHost asks whether every checkpoint of m restores on this host (manifest.CheckHost): the
// runsc version and binary, the executor protocol, the CPU features and the cache line. A
// warning (an unenforced CPU baseline, say) is printed and does not stop the worker; the
// checkpoint it restores must restore here.
func checkHost(ctx context.Context, r *runsc.Runsc, m *manifest.Manifest, set string, stderr io.Writer) error {
	host, err := manifest.ReadHost(ctx, r.Path, time.Minute)
	if err != nil {
		return err
	}
	for _, v := range manifest.CheckHost(m, host).Checkpoints {
		if v.ID != set {
			continue
		}
		for _, w := range v.Warnings {
			fmt.Fprintf(stderr, "worker: warning: %s\n", w)
		}
		if !v.Restores {
			return fmt.Errorf("checkpoint %s does not restore on this host: %s", set, strings.Join(v.Problems, "; "))
		}
	}
	return nil
}

// relayed is a pipe whose read end is copied, line by line with a prefix, to a writer.
type relayed struct {
	w    *os.File
	done chan error
}

func relay(to io.Writer, prefix string) (*relayed, error) {
	pr, pw, err := os.Pipe()
	if err != nil {
		return nil, err
	}
	x := &relayed{w: pw, done: make(chan error, 1)}
	go func() {
		defer pr.Close()
		lines := bufio.NewScanner(pr)
		for lines.Scan() {
			fmt.Fprintf(to, "%s%s\n", prefix, lines.Text())
		}
		x.done <- lines.Err()
	}()
	return x, nil
}

// wait waits, a little, for the relay to reach the end once the sandbox is gone.
func (x *relayed) wait() error {
	x.w.Close()
	select {
	case err := <-x.done:
		return err
	case <-time.After(5 * time.Second):
		return errors.New("the executor's output was still open 5s after the sandbox was deleted")
	}
}

// prefixed writes each write (a line, from pool.Options.Output) to w after prefix.
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
