package runsc_test

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"syscall"
	"testing"
	"time"

	specs "github.com/opencontainers/runtime-spec/specs-go"

	"readie.dev/pipeline/internal/testenv"
	"readie.dev/pipeline/pkg/executorproto"
	"readie.dev/pipeline/pkg/pycall"
	"readie.dev/pipeline/pkg/runsc"
	"readie.dev/pipeline/pkg/sandbox"
)

// driver returns the real runsc with a private root, which the test checks is empty at the
// end (every sandbox deleted: in runsc list and by process) and removes.
func driver(t *testing.T) *runsc.Runsc {
	t.Helper()
	root, err := os.MkdirTemp("", "readie-runsc-")
	if err != nil {
		t.Fatal(err)
	}
	r := &runsc.Runsc{Path: testenv.RunscPath(t), Root: root, GlobalArgs: sandbox.DefaultFlags().Args()}
	t.Cleanup(func() {
		testenv.CheckNoRunsc(t, r.Path, root, "")
		if err := testenv.RemoveRunscRoot(root); err != nil {
			t.Error(err)
		}
	})
	return r
}

// bundle writes spec as the config.json of a fresh bundle.
func bundle(t testing.TB, work, name string, spec *specs.Spec) string {
	t.Helper()
	dir := filepath.Join(work, name)
	if err := os.MkdirAll(dir, 0o700); err != nil {
		t.Fatal(err)
	}
	data, _ := json.Marshal(spec)
	if err := os.WriteFile(filepath.Join(dir, "config.json"), data, 0o600); err != nil {
		t.Fatal(err)
	}
	return dir
}

// hostDir is a fresh directory for the executor's bind mount.
func hostDir(t testing.TB, work, name string) string {
	t.Helper()
	dir := filepath.Join(work, name)
	if err := os.MkdirAll(dir, 0o755); err != nil {
		t.Fatal(err)
	}
	return dir
}

// output is a pipe whose read end is collected until the write end's last holder closes it.
type output struct {
	w    *os.File
	done chan string
}

func newOutput(t *testing.T) *output {
	t.Helper()
	r, w, err := os.Pipe()
	if err != nil {
		t.Fatal(err)
	}
	o := &output{w: w, done: make(chan string, 1)}
	go func() {
		data, _ := io.ReadAll(r)
		r.Close()
		o.done <- string(data)
	}()
	return o
}

// text closes this process's write end and returns what came through once the sandbox is gone.
func (o *output) text(t *testing.T) string {
	t.Helper()
	o.w.Close()
	select {
	case s := <-o.done:
		return s
	case <-time.After(time.Minute):
		t.Fatal("the sandbox's output never ended")
		return ""
	}
}

func TestVersionAndModule(t *testing.T) {
	r := &runsc.Runsc{Path: testenv.RunscPath(t)}
	v, err := r.Version(context.Background())
	if err != nil || !strings.HasPrefix(v, "readie-") {
		t.Fatalf("Version = %q, %v; want the stamped label", v, err)
	}
	path, version, err := r.Module()
	if err != nil || path != "gvisor.dev/gvisor/runsc" && path != "gvisor.dev/gvisor" || version == "" {
		t.Fatalf("Module = %q %q, %v", path, version, err)
	}
	if _, err := (&runsc.Runsc{Path: "/bin/true"}).Version(context.Background()); !errors.Is(err, runsc.ErrFailed) {
		t.Fatalf("Version of a binary that prints nothing = %v, want ErrFailed", err)
	}
}

// TestLifecycle drives one sandbox through create, state, start, list, kill and delete with
// the real runsc, and sees runsc's own words in the errors about a sandbox that is gone.
func TestLifecycle(t *testing.T) {
	r := driver(t)
	work := testenv.WorkDir(t)
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	spec, err := sandbox.Spec(sandbox.SpecOptions{Mode: sandbox.ModeSandbox, Rootfs: testenv.Rootfs(t), HostDir: hostDir(t, work, "h"), Args: []string{"/bin/sh", "-c", "echo hello; exec sleep 3600"}})
	if err != nil {
		t.Fatal(err)
	}
	b := bundle(t, work, "b", spec)
	out := newOutput(t)
	const id = "kit-lifecycle"
	if err := r.Create(ctx, id, b, &runsc.CreateOpts{IO: runsc.IO{Stdout: out.w}, PidFile: filepath.Join(work, "pid")}); err != nil {
		t.Fatal(err)
	}
	deleted := false
	defer func() {
		if !deleted {
			r.Delete(context.WithoutCancel(ctx), id, &runsc.DeleteOpts{Force: true})
		}
	}()
	state := func(want string) {
		t.Helper()
		c, err := r.State(ctx, id)
		if err != nil || c.Status != want || c.ID != id || c.Bundle != b || c.Pid <= 0 {
			t.Fatalf("State = %+v, %v; want %s", c, err, want)
		}
	}
	state("created")
	if pid, err := os.ReadFile(filepath.Join(work, "pid")); err != nil || len(bytes.TrimSpace(pid)) == 0 {
		t.Errorf("--pid-file: %q, %v", pid, err)
	}
	if err := r.Start(ctx, id); err != nil {
		t.Fatal(err)
	}
	state("running")
	cs, err := r.List(ctx)
	if err != nil || len(cs) != 1 || cs[0].ID != id || cs[0].Status != "running" {
		t.Fatalf("List = %+v, %v", cs, err)
	}
	if err := r.Kill(ctx, id, syscall.SIGKILL, &runsc.KillOpts{All: true}); err != nil {
		t.Fatal(err)
	}
	for {
		c, err := r.State(ctx, id)
		if err != nil {
			t.Fatal(err)
		}
		if c.Status == "stopped" {
			break
		}
		if ctx.Err() != nil {
			t.Fatalf("still %s after SIGKILL", c.Status)
		}
		time.Sleep(20 * time.Millisecond)
	}
	if err := r.Delete(ctx, id, &runsc.DeleteOpts{Force: true}); err != nil {
		t.Fatal(err)
	}
	deleted = true
	if got := out.text(t); got != "hello\n" {
		t.Errorf("the process wrote %q through the stdout it was created with", got)
	}
	// Gone now: errors name the command and the sandbox, and quote runsc.
	_, err = r.State(ctx, id)
	if !errors.Is(err, runsc.ErrFailed) || !strings.Contains(err.Error(), "state "+id) || !strings.Contains(err.Error(), "does not exist") {
		t.Errorf("State of a deleted sandbox = %v", err)
	}
	if err := r.Delete(ctx, id, nil); !errors.Is(err, runsc.ErrFailed) || !strings.Contains(err.Error(), "delete "+id) {
		t.Errorf("Delete without --force of a deleted sandbox = %v", err)
	}
	if err := r.Delete(ctx, id, &runsc.DeleteOpts{Force: true}); err != nil {
		t.Errorf("Delete --force of a deleted sandbox = %v, want nil", err)
	}
}

// TestRunExitStatus: `runsc run` returns the process's own status, as an *ExitError too, and
// its stdout and stderr arrive through the files passed in.
func TestRunExitStatus(t *testing.T) {
	r := driver(t)
	work := testenv.WorkDir(t)
	spec, err := sandbox.Spec(sandbox.SpecOptions{Mode: sandbox.ModeSandbox, Rootfs: testenv.Rootfs(t), HostDir: hostDir(t, work, "h"), Args: []string{"/bin/sh", "-c", "echo out; echo err >&2; exit 3"}})
	if err != nil {
		t.Fatal(err)
	}
	stdout, stderr := newOutput(t), newOutput(t)
	ctx := context.Background()
	status, err := r.Run(ctx, "kit-run", bundle(t, work, "b", spec), &runsc.CreateOpts{IO: runsc.IO{Stdout: stdout.w, Stderr: stderr.w}})
	if delErr := r.Delete(ctx, "kit-run", &runsc.DeleteOpts{Force: true}); delErr != nil {
		t.Error(delErr)
	}
	var exit *runsc.ExitError
	if status != 3 || !errors.As(err, &exit) || exit.Status != 3 || !errors.Is(err, runsc.ErrFailed) || !strings.Contains(err.Error(), "run kit-run: exit status 3") {
		t.Fatalf("Run = %d, %v; want status 3", status, err)
	}
	if o, e := stdout.text(t), stderr.text(t); o != "out\n" || !strings.Contains(e, "err\n") {
		t.Errorf("stdout %q, stderr %q", o, e)
	}
}

// TestContextEnds: a command whose context has ended fails matching the context's error and
// saying its cause; one without an image path is refused before runsc runs.
func TestContextEnds(t *testing.T) {
	r := driver(t)
	ctx, cancel := context.WithCancelCause(context.Background())
	cancel(errors.New("the worker is shutting down"))
	_, err := r.List(ctx)
	if !errors.Is(err, context.Canceled) || !errors.Is(err, runsc.ErrFailed) || !strings.Contains(err.Error(), "the worker is shutting down") {
		t.Errorf("List with a cancelled context = %v", err)
	}
	if _, err := r.Restore(context.Background(), "x", "/nonexistent", &runsc.RestoreOpts{}); !errors.Is(err, runsc.ErrFailed) || !strings.Contains(err.Error(), "no image path") {
		t.Errorf("Restore without an image = %v", err)
	}
}

// TestCaptureAndRestore is the whole way through with the driver alone: the executor captures
// itself in `runsc run`; a restore spec is made from the output-like spec file with
// sandbox.RestoreSpec; a sandbox made by Create gets the checkpoint by a detached Restore, and
// answers a call with the restore-time environment; a measure-mode restore waits for the
// executor's exit; a restore of a spec of another shape fails with runsc's words.
func TestCaptureAndRestore(t *testing.T) {
	r := driver(t)
	rootfs := testenv.Rootfs(t)
	work := testenv.WorkDir(t)
	ctx, cancel := context.WithTimeout(context.Background(), 4*time.Minute)
	defer cancel()
	images := filepath.Join(work, "img")
	os.MkdirAll(images, 0o755)
	capture, err := sandbox.Spec(sandbox.SpecOptions{Mode: sandbox.ModeCapture, Rootfs: rootfs, HostDir: hostDir(t, work, "hc"), ImageDir: images, Imports: []string{"json"}})
	if err != nil {
		t.Fatal(err)
	}
	// Pipes for stdout and stderr, as the pipeline captures: a restore must give the process
	// stdio of the same kinds (pipes here), or the restored executor does not answer.
	stdout := newOutput(t)
	status, err := r.Run(ctx, "kit-capture", bundle(t, work, "capture", capture), &runsc.CreateOpts{IO: runsc.IO{Stdout: stdout.w, Stderr: stdout.w}})
	if delErr := r.Delete(ctx, "kit-capture", &runsc.DeleteOpts{Force: true}); delErr != nil {
		t.Error(delErr)
	}
	if status != 0 || err != nil || !strings.Contains(stdout.text(t), "checkpoint begin") {
		t.Fatalf("capture: %d, %v", status, err)
	}

	// The restore spec as an output ships it, and its fingerprint.
	shipped, err := sandbox.Spec(sandbox.SpecOptions{Mode: sandbox.ModeSandbox, Rootfs: rootfs, HostDir: "/run/readie/sandboxes/SANDBOX_ID"})
	if err != nil {
		t.Fatal(err)
	}
	flags := sandbox.DefaultFlags().Args()
	fingerprint, _ := sandbox.Fingerprint(shipped, sandbox.DefaultFlags())
	specPath := filepath.Join(work, "restore-spec.json")
	data, _ := json.Marshal(shipped)
	os.WriteFile(specPath, data, 0o644)

	host := hostDir(t, work, "hs")
	spec, err := sandbox.RestoreSpec(specPath, fingerprint, flags, sandbox.RestoreOptions{Rootfs: rootfs, HostDir: host, Env: []string{"KIT_TOKEN=t0k"}})
	if err != nil {
		t.Fatal(err)
	}
	b := bundle(t, work, "restore", spec)
	executor := newOutput(t)
	if err := r.Create(ctx, "kit-restore", b, &runsc.CreateOpts{IO: runsc.IO{Stdout: executor.w, Stderr: executor.w}}); err != nil {
		t.Fatal(err)
	}
	defer r.Delete(context.WithoutCancel(ctx), "kit-restore", &runsc.DeleteOpts{Force: true})
	if _, err := r.Restore(ctx, "kit-restore", b, &runsc.RestoreOpts{ImagePath: images, Detach: true, ExtraArgs: []string{"-direct"}}); err != nil {
		t.Fatal(err)
	}
	if c, err := r.State(ctx, "kit-restore"); err != nil || c.Status != "running" {
		t.Fatalf("state after a detached restore: %+v, %v", c, err)
	}
	dialCtx, cancelDial := context.WithTimeout(ctx, 20*time.Second)
	conn, err := executorproto.Dial(dialCtx, filepath.Join(host, sandbox.SocketName))
	cancelDial()
	if err != nil {
		r.Delete(ctx, "kit-restore", &runsc.DeleteOpts{Force: true})
		t.Fatalf("%v\nexecutor:\n%s", err, executor.text(t))
	}
	request, _ := pycall.EvalRequest(`[__import__("os").environ.get("KIT_TOKEN"), "json" in __import__("sys").modules]`)
	response, err := executorproto.Call(ctx, conn, request)
	conn.Close()
	if err != nil {
		t.Fatal(err)
	}
	value, err := pycall.DecodeEnvelope(response)
	if got, _ := value.([]any); err != nil || len(got) != 2 || got[0] != "t0k" || got[1] != true {
		t.Fatalf("the restored executor answered %s, %v; want its restore-time token and json imported", pycall.Format(value, pycall.ErrorBytes), err)
	}
	if err := r.Delete(ctx, "kit-restore", &runsc.DeleteOpts{Force: true}); err != nil {
		t.Fatal(err)
	}
	executor.text(t)

	// Measure mode: the restore waits for the executor, which leaves with 0 at once.
	measureSpec, err := sandbox.RestoreSpec(specPath, fingerprint, flags, sandbox.RestoreOptions{Rootfs: rootfs, HostDir: hostDir(t, work, "hm"), Env: []string{"EXECUTOR_MODE=measure"}})
	if err != nil {
		t.Fatal(err)
	}
	mout := newOutput(t)
	status, err = r.Restore(ctx, "kit-measure", bundle(t, work, "measure", measureSpec), &runsc.RestoreOpts{ImagePath: images, IO: runsc.IO{Stdout: mout.w, Stderr: mout.w}})
	if delErr := r.Delete(ctx, "kit-measure", &runsc.DeleteOpts{Force: true}); delErr != nil {
		t.Error(delErr)
	}
	if status != 0 || err != nil {
		t.Fatalf("measure-mode restore = %d, %v\n%s", status, err, mout.text(t))
	}
	mout.text(t)

	// A spec of another shape: runsc refuses it and says why, in the error itself.
	other := *measureSpec
	other.Process = &specs.Process{}
	*other.Process = *measureSpec.Process
	other.Process.Args = append(slices.Clone(other.Process.Args), "--tampered")
	_, err = r.Restore(ctx, "kit-tampered", bundle(t, work, "tampered", &other), &runsc.RestoreOpts{ImagePath: images})
	if delErr := r.Delete(ctx, "kit-tampered", &runsc.DeleteOpts{Force: true}); delErr != nil {
		t.Error(delErr)
	}
	if !errors.Is(err, runsc.ErrFailed) || !strings.Contains(err.Error(), `"Args" does not match`) {
		t.Fatalf("restore of a tampered spec = %v; want runsc's words", err)
	}
}

// TestLeftBehindChildDoesNotHoldTheCaller: a runsc that exits but leaves a process holding its
// stdout (here a shell's background sleep) does not hold Version or List past their end.
func TestLeftBehindChildDoesNotHoldTheCaller(t *testing.T) {
	dir := t.TempDir()
	pids := filepath.Join(dir, "pids")
	fake := filepath.Join(dir, "runsc")
	script := "#!/bin/sh\nsleep 600 & echo $! >> " + pids + "\ncase \"$*\" in *--version*) echo 'runsc version left-behind';; *) echo '[]';; esac\n"
	if err := os.WriteFile(fake, []byte(script), 0o755); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		data, _ := os.ReadFile(pids)
		for _, f := range strings.Fields(string(data)) {
			var pid int
			if _, err := fmt.Sscan(f, &pid); err == nil {
				syscall.Kill(pid, syscall.SIGKILL)
			}
		}
	})
	r := &runsc.Runsc{Path: fake, Root: dir, CommandTimeout: time.Hour}
	for name, call := range map[string]func() error{
		"Version": func() error {
			v, err := r.Version(context.Background())
			if err == nil && v != "left-behind" {
				err = fmt.Errorf("version %q", v)
			}
			return err
		},
		"List": func() error {
			ids, err := r.List(context.Background())
			if err == nil && len(ids) != 0 {
				err = fmt.Errorf("sandboxes %v", ids)
			}
			return err
		},
	} {
		done := make(chan error, 1)
		go func() { done <- call() }()
		select {
		case err := <-done:
			if err != nil {
				t.Errorf("%s: %v, want its answer: runsc exited 0 with all of it", name, err)
			}
		case <-time.After(2 * time.Minute): // reached only when the pipe holds the call
			t.Fatalf("%s still waits on the pipe a left-behind process holds", name)
		}
	}
}

// TestRunscRunsInUTC: runsc's logs carry wall-clock times without a zone, which the restore
// breakdown (internal/bench) reads as UTC, so every runsc command runs in UTC whatever this
// process's zone. The zone is checked here, where it is set, rather than by running every
// test in two zones.
func TestRunscRunsInUTC(t *testing.T) {
	t.Setenv("TZ", "America/New_York") // for the children: this process's time.Local is set once
	dir := t.TempDir()
	seen := filepath.Join(dir, "zone")
	fake := filepath.Join(dir, "runsc")
	script := "#!/bin/sh\necho \"$TZ $(date +%Z)\" > " + seen + "\necho null\n"
	if err := os.WriteFile(fake, []byte(script), 0o755); err != nil {
		t.Fatal(err)
	}
	if err := os.Mkdir(filepath.Join(dir, "root"), 0o700); err != nil {
		t.Fatal(err)
	}
	r := &runsc.Runsc{Path: fake, Root: filepath.Join(dir, "root")}
	if _, err := r.List(context.Background()); err != nil {
		t.Fatal(err)
	}
	data, err := os.ReadFile(seen)
	if err != nil {
		t.Fatal(err)
	}
	if got := strings.TrimSpace(string(data)); got != "UTC UTC" {
		t.Errorf("runsc ran with TZ and zone %q, want \"UTC UTC\"", got)
	}
}
