package main

import (
	"bytes"
	"context"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"readie.dev/pipeline/internal/orphans"
	"readie.dev/pipeline/internal/testenv"
	"readie.dev/pipeline/pkg/exitcode"
)

// nsProcess is this test binary running as the pipeline as pid 1 of a pid namespace of its
// own (`unshare --pid --fork --kill-child --mount-proc`), as each pod's pipeline is.
type nsProcess struct {
	cmd    *exec.Cmd // unshare
	mu     sync.Mutex
	stderr bytes.Buffer
	exited chan struct{}
}

func (p *nsProcess) Write(b []byte) (int, error) {
	p.mu.Lock()
	defer p.mu.Unlock()
	return p.stderr.Write(b)
}

func (p *nsProcess) output() string {
	p.mu.Lock()
	defer p.mu.Unlock()
	return p.stderr.String()
}

func startInNamespace(t *testing.T, env map[string]string, args ...string) *nsProcess {
	t.Helper()
	p := &nsProcess{exited: make(chan struct{})}
	p.cmd = testenv.Command(t, 10*time.Minute, "unshare", append([]string{"--pid", "--fork", "--kill-child", "--mount-proc", os.Args[0]}, args...)...)
	p.cmd.Env = append(os.Environ(), "READIE_TEST_AS_PIPELINE=1")
	for k, v := range env {
		p.cmd.Env = append(p.cmd.Env, k+"="+v)
	}
	p.cmd.Stderr = p
	if err := p.cmd.Start(); err != nil {
		t.Fatal(err)
	}
	go func() {
		p.cmd.Wait()
		close(p.exited)
	}()
	t.Cleanup(func() {
		p.cmd.Process.Kill() // --kill-child: the pipeline, and its namespace, with it
		<-p.exited
	})
	return p
}

// pipelinePid is the pipeline's pid as this namespace sees it (unshare's one child).
func (p *nsProcess) pipelinePid(t *testing.T) int {
	t.Helper()
	data, err := os.ReadFile("/proc/" + strconv.Itoa(p.cmd.Process.Pid) + "/task/" + strconv.Itoa(p.cmd.Process.Pid) + "/children")
	pid, convErr := strconv.Atoi(strings.TrimSpace(string(data)))
	if err != nil || convErr != nil {
		t.Fatalf("the pipeline under unshare %d: %q %v", p.cmd.Process.Pid, data, err)
	}
	return pid
}

func (p *nsProcess) wait(t *testing.T, limit time.Duration) int {
	t.Helper()
	select {
	case <-p.exited:
		return p.cmd.ProcessState.ExitCode()
	case <-time.After(limit):
		t.Fatalf("the pipeline did not exit within %s:\n%s", limit, p.output())
		return -1
	}
}

// waitUntil polls cond until it holds, failing the test after limit.
func waitUntil(t *testing.T, limit time.Duration, what string, cond func() bool) {
	t.Helper()
	deadline := time.Now().Add(limit)
	for !cond() {
		if time.Now().After(deadline) {
			t.Fatalf("%s: not within %s", what, limit)
		}
		time.Sleep(20 * time.Millisecond)
	}
}

// runLeftovers are the files a run names after its lease in the shared directories: a
// sandbox, its pending store entries (the blocked set's, and those of sets captured beside it
// that wait for it before their timed restores), its scratch directory.
type runLeftovers struct {
	sandbox string
	pending []string
	scratch string
}

func (e *faultEnv) leftoversOf(t *testing.T, sandboxID string) runLeftovers {
	t.Helper()
	run, ok := orphans.OwnerRun(sandboxID)
	if !ok {
		t.Fatalf("sandbox %s carries no run", sandboxID)
	}
	l := runLeftovers{sandbox: sandboxID}
	l.pending, _ = filepath.Glob(filepath.Join(e.dir, "store", ".pending-"+run+"-*"))
	if m, _ := filepath.Glob(filepath.Join(e.tmp, "readie-scratch-"+run+"-*")); len(m) == 1 {
		l.scratch = m[0]
	}
	if len(l.pending) == 0 || l.scratch == "" {
		t.Fatalf("run %s: pending entries %q, scratch %q; want some and one", run, l.pending, l.scratch)
	}
	return l
}

// present reports which of the run's leftovers are there.
func (e *faultEnv) present(t *testing.T, l runLeftovers) []string {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	var there []string
	if ids, err := e.runtime().List(ctx); err != nil {
		t.Fatal(err)
	} else if slices.Contains(ids, l.sandbox) {
		there = append(there, "sandbox")
	}
	for _, path := range l.pending {
		if _, err := os.Stat(path); err == nil {
			there = append(there, "pending "+filepath.Base(path))
		}
	}
	if _, err := os.Stat(l.scratch); err == nil {
		there = append(there, "scratch")
	}
	slices.Sort(there)
	return there
}

// TestRunsInOtherPidNamespaces: runs of one store and one runsc root, each the pid 1 of a pid
// namespace of its own (as pods of the shipped Job are), leave each other's sandboxes,
// pending store entries and scratch directories alone while they live, and so does a run of
// this namespace. Once one is killed with SIGKILL (its namespace with it), the next run, in yet
// another namespace, removes its leftovers and says so, signalling none of the pids runsc
// recorded for its sandbox (they name other processes here), within the config's 30 s
// runsc_command limit where runsc alone would wait two minutes.
func TestRunsInOtherPidNamespaces(t *testing.T) {
	e := newFaultEnv(t)
	e.useTmp(t) // a run in this process sweeps beside the others
	good := e.goodOutput(t)
	blocking := func(out, id string) string {
		path := testConfig{runsc: e.runsc, root: e.root, rootfs: e.rootfs, output: out,
			sets: "  - id: " + id + "\n    imports: [json, " + testenv.BlockingModule + "]\n"}.write(t)
		data, _ := os.ReadFile(path)
		os.WriteFile(path, []byte(strings.Replace(string(data), "checkpoints:\n", "pass_env: [PYTHONPATH]\ncheckpoints:\n", 1)), 0o644)
		return path
	}
	a := startInNamespace(t, blockingEnv, "capture", "--config", blocking(filepath.Join(e.dir, "out-a"), "blocka"))
	idA := testenv.WaitForSandbox(t, e.runtime(), "-blocka-capture-", 2*time.Minute)
	testenv.WaitForBlocked(t, e.tmp, idA, 2*time.Minute)
	b := startInNamespace(t, blockingEnv, "capture", "--config", blocking(filepath.Join(e.dir, "out-b"), "blockb"))
	idB := testenv.WaitForSandbox(t, e.runtime(), "-blockb-capture-", 2*time.Minute)
	testenv.WaitForBlocked(t, e.tmp, idB, 2*time.Minute)
	leftA, leftB := e.leftoversOf(t, idA), e.leftoversOf(t, idB)

	// B swept when it began, while A lived; a run of this namespace sweeps now.
	if code, _, stderr := runCLI(t, "smoke", "--config", good, "--only", "small"); code != exitOK {
		t.Fatalf("a run beside the two: exit %d\n%s", code, stderr)
	}
	for name, l := range map[string]runLeftovers{"A": leftA, "B": leftB} {
		if there := e.present(t, l); len(there) != 2+len(l.pending) {
			t.Fatalf("run %s, alive in its own pid namespace, lost some of its files: only %v are left", name, there)
		}
	}

	pidA := a.pipelinePid(t)
	a.cmd.Process.Signal(syscall.SIGKILL) // --kill-child: unshare's SIGKILL kills A, pid 1 of its namespace
	a.wait(t, time.Minute)
	waitUntil(t, time.Minute, "A's namespace gone", func() bool {
		_, err := os.Stat("/proc/" + strconv.Itoa(pidA))
		left, perr := testenv.RunscProcesses("", idA)
		return os.IsNotExist(err) && perr == nil && len(left) == 0
	})
	if there := e.present(t, leftA); len(there) != 2+len(leftA.pending) {
		t.Fatalf("the killed run left only %v", there)
	}

	next := startInNamespace(t, nil, "smoke", "--config", good, "--only", "small")
	if code := next.wait(t, 3*time.Minute); code != exitOK {
		t.Fatalf("the next run: exit %d\n%s", code, next.output())
	}
	stderr := next.output()
	t.Logf("the next run said:\n%s", stderr)
	for _, want := range []string{
		"removed a sandbox left by a run that died\" note=\"runsc recorded pids",
		"not its processes in this pid namespace (it was made in another one): none of them was signalled\" run=",
		"sandbox=" + idA,
		"removed the scratch directory of a run that died\" dir=" + leftA.scratch,
	} {
		if !strings.Contains(stderr, want) {
			t.Errorf("the next run does not say %q", want)
		}
	}
	for _, dir := range leftA.pending {
		if !strings.Contains(stderr, "removed a store entry that a run which died was writing\" dir="+dir) {
			t.Errorf("the next run does not say it removed %s", dir)
		}
	}
	if there := e.present(t, leftA); len(there) != 0 {
		t.Errorf("the killed run's %v are still there", there)
	}
	if left, _ := filepath.Glob(filepath.Join(e.root, "*"+idA+"*")); len(left) != 0 {
		t.Errorf("runsc state of the killed run's sandbox is still there: %v", left)
	}
	if there := e.present(t, leftB); len(there) != 2+len(leftB.pending) {
		t.Fatalf("the live run B lost some of its files to the next run: only %v are left", there)
	}

	// B ends as a run ends on Ctrl-C: its sandbox deleted (newFaultEnv checks), exit 130.
	syscall.Kill(b.pipelinePid(t), syscall.SIGINT)
	if code := b.wait(t, time.Minute); code != exitcode.ForSignal(syscall.SIGINT) {
		t.Fatalf("B after SIGINT: exit %d\n%s", code, b.output())
	}
}
