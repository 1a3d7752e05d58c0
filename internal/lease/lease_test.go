package lease

import (
	"bufio"
	"fmt"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"
)

// TestMain lets a test run this binary as a run that holds a lease in a process of its own:
// READIE_LEASE_HOLD=DIR holds DIR, prints "ID PID" and waits until stdin closes.
func TestMain(m *testing.M) {
	if dir := os.Getenv("READIE_LEASE_HOLD"); dir != "" {
		l, err := New()
		if err == nil {
			err = l.Hold(dir)
		}
		if err != nil {
			fmt.Fprintln(os.Stderr, err)
			os.Exit(1)
		}
		fmt.Printf("%s %d\n", l.ID(), os.Getpid())
		bufio.NewReader(os.Stdin).ReadString('\n')
		os.Exit(0)
	}
	os.Exit(m.Run())
}

func mustNew(t *testing.T) *Lease {
	t.Helper()
	l, err := New()
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { l.Release() })
	return l
}

func TestHeldIsAliveReleasedIsOver(t *testing.T) {
	dir := t.TempDir()
	owner, sweeper := mustNew(t), mustNew(t)
	if err := owner.Hold(dir); err != nil {
		t.Fatal(err)
	}
	if err := owner.Hold(dir); err != nil { // twice: a no-op
		t.Fatal(err)
	}
	if claim, err := sweeper.TakeOver(dir, owner.ID()); claim != nil || err != nil {
		t.Fatalf("TakeOver of a held lease = %+v, %v; want alive", claim, err)
	}
	if claim, err := owner.TakeOver(dir, owner.ID()); claim != nil || err != nil {
		t.Fatalf("a run's own lease = %+v, %v; want alive", claim, err)
	}
	var none *Lease // a process that owns nothing
	if claim, err := none.TakeOver(dir, owner.ID()); claim != nil || err != nil {
		t.Fatalf("nil lease: TakeOver of a held lease = %+v, %v; want alive", claim, err)
	}
	if err := owner.Release(); err != nil {
		t.Fatal(err)
	}
	if _, err := os.Stat(lockPath(dir, owner.ID())); !os.IsNotExist(err) {
		t.Errorf("Release left the lock file: %v", err)
	}
	claim, err := sweeper.TakeOver(dir, owner.ID())
	if claim == nil || err != nil {
		t.Fatalf("TakeOver of a released lease = %+v, %v; want over", claim, err)
	}
	if err := claim.Release(); err != nil {
		t.Fatal(err)
	}
	if err := owner.Hold(t.TempDir()); err != ErrReleased {
		t.Errorf("Hold after Release = %v, want ErrReleased", err)
	}
}

// holder is this test binary running as a run that holds a lease, maybe in a pid namespace of
// its own.
type holder struct {
	id     string
	pid    int // as the holder sees itself
	cmd    *exec.Cmd
	stdout *bufio.Reader
}

// startHolder starts a holder of a lease on dir, under unshare's args when given.
func startHolder(t *testing.T, dir string, wrap ...string) *holder {
	t.Helper()
	args := append(wrap, os.Args[0], "-test.run=^$")
	h := &holder{cmd: exec.Command(args[0], args[1:]...)}
	h.cmd.Env = append(os.Environ(), "READIE_LEASE_HOLD="+dir)
	stdin, err := h.cmd.StdinPipe()
	if err != nil {
		t.Fatal(err)
	}
	// A pipe of our own, not StdoutPipe: reading it to the end waits for the holder itself,
	// which in a namespace is not the process we started.
	r, w, err := os.Pipe()
	if err != nil {
		t.Fatal(err)
	}
	h.cmd.Stdout, h.cmd.Stderr = w, os.Stderr
	if err := h.cmd.Start(); err != nil {
		t.Fatal(err)
	}
	w.Close()
	t.Cleanup(func() {
		stdin.Close()
		h.cmd.Process.Kill()
		h.cmd.Wait()
		r.Close()
	})
	h.stdout = bufio.NewReader(r)
	line, err := h.stdout.ReadString('\n')
	if err != nil {
		t.Fatalf("the holder said nothing: %v", err)
	}
	id, pid, _ := strings.Cut(strings.TrimSpace(line), " ")
	if h.pid, err = strconv.Atoi(pid); err != nil || !IsID(id) {
		t.Fatalf("the holder said %q", line)
	}
	h.id = id
	return h
}

// kill sends SIGKILL to the process started and waits until the holder is gone: its end of
// stdout is closed when it has exited, and its locks with it.
func (h *holder) kill(t *testing.T) {
	t.Helper()
	h.cmd.Process.Signal(syscall.SIGKILL)
	h.cmd.Wait()
	done := make(chan struct{})
	go func() { io.Copy(io.Discard, h.stdout); close(done) }()
	select {
	case <-done:
	case <-time.After(time.Minute):
		t.Fatal("the holder outlived its SIGKILL by a minute")
	}
}

// TestLockHeldInAnotherPidNamespace: a run in a pid namespace of its own (its pid is 1 there,
// as every pod's pipeline's is) is alive while it lives, however its pid reads here; once its
// namespace is killed with SIGKILL, the next sweeper finds it over and removes its lock file.
func TestLockHeldInAnotherPidNamespace(t *testing.T) {
	dir := t.TempDir()
	h := startHolder(t, dir, "unshare", "--pid", "--fork", "--kill-child", "--mount-proc")
	id := h.id
	if h.pid != 1 {
		t.Fatalf("the holder's pid is %d in its namespace, want 1", h.pid)
	}
	sweeper := mustNew(t)
	if claim, err := sweeper.TakeOver(dir, id); claim != nil || err != nil {
		t.Fatalf("a run alive in another pid namespace was judged over: %+v, %v", claim, err)
	}
	if removed, err := sweeper.RemoveDeadLocks(dir); len(removed) != 0 || err != nil {
		t.Fatalf("RemoveDeadLocks removed the lock of a live run: %v, %v", removed, err)
	}
	// --kill-child: the holder (pid 1 of the namespace) gets SIGKILL when unshare does, and the
	// namespace ends with it.
	h.kill(t)
	if _, err := os.Stat(lockPath(dir, id)); err != nil {
		t.Fatalf("a killed run leaves its lock file: %v", err)
	}
	removed, err := sweeper.RemoveDeadLocks(dir)
	if len(removed) != 1 || removed[0] != id || err != nil {
		t.Fatalf("RemoveDeadLocks = %v, %v; want the killed run %s", removed, err, id)
	}
	if _, err := os.Stat(lockPath(dir, id)); !os.IsNotExist(err) {
		t.Errorf("the killed run's lock file is still there: %v", err)
	}
}

// TestLockHeldByAnotherProcess: the same without namespaces, and a live holder's lock file is
// never removed, whoever sweeps.
func TestLockHeldByAnotherProcess(t *testing.T) {
	dir := t.TempDir()
	h := startHolder(t, dir)
	id := h.id
	var none *Lease
	if claim, err := none.TakeOver(dir, id); claim != nil || err != nil {
		t.Fatalf("a live run was judged over: %+v, %v", claim, err)
	}
	h.kill(t)
	claim, err := none.TakeOver(dir, id)
	if claim == nil || err != nil {
		t.Fatalf("a killed run was judged alive: %+v, %v", claim, err)
	}
	// While one sweeper has it, another leaves it alone.
	if other, err := mustNew(t).TakeOver(dir, id); other != nil || err != nil {
		t.Fatalf("a second sweeper took over a claimed run: %+v, %v", other, err)
	}
	if err := claim.Release(); err != nil {
		t.Fatal(err)
	}
}

// TestHoldWhileASweeperHasTheFile: a sweeper holds the file that the run is about to lock (the
// creation race). Whenever the sweeper lets go (unlinking it), the run ends up holding a lock
// file that is at its path, and a third party sees it alive.
func TestHoldWhileASweeperHasTheFile(t *testing.T) {
	dir := t.TempDir()
	owner, sweeper := mustNew(t), mustNew(t)
	path := lockPath(dir, owner.ID())
	os.MkdirAll(filepath.Dir(path), 0o700)
	if err := os.WriteFile(path, nil, 0o600); err != nil {
		t.Fatal(err)
	}
	claim, err := sweeper.TakeOver(dir, owner.ID())
	if claim == nil || err != nil {
		t.Fatalf("TakeOver = %+v, %v", claim, err)
	}
	if f, err := lockNew(path); f != nil || err != nil {
		t.Fatalf("lockNew of a file a sweeper holds = %v, %v; want a retry", f, err)
	}
	held := make(chan error, 1)
	go func() { held <- owner.Hold(dir) }()
	if err := claim.Release(); err != nil {
		t.Fatal(err)
	}
	select {
	case err := <-held:
		if err != nil {
			t.Fatal(err)
		}
	case <-time.After(time.Minute):
		t.Fatal("Hold did not return within a minute of the sweeper letting go")
	}
	if other, err := mustNew(t).TakeOver(dir, owner.ID()); other != nil || err != nil {
		t.Fatalf("after Hold, the run was judged over: %+v, %v", other, err)
	}
}

func TestIDs(t *testing.T) {
	for range 200 {
		l, err := New()
		if err != nil {
			t.Fatal(err)
		}
		if !IsID(l.ID()) {
			t.Fatalf("New gave %q, which IsID refuses", l.ID())
		}
	}
	for _, s := range []string{"12345", "4194304", "000000000000", "0123456789ab0", "0123456789aB", "", "runsc"} {
		if IsID(s) {
			t.Errorf("IsID(%q) = true", s)
		}
	}
}

func TestTakeOverReportsWhatItCannotRead(t *testing.T) {
	dir := t.TempDir()
	l := mustNew(t)
	id := mustNew(t).ID()
	// A directory where the lock file should be: neither alive nor over, and said so.
	if err := os.MkdirAll(lockPath(dir, id), 0o700); err != nil {
		t.Fatal(err)
	}
	if claim, err := l.TakeOver(dir, id); claim != nil || err == nil || !strings.Contains(err.Error(), id) {
		t.Fatalf("TakeOver of an unreadable lock = %+v, %v; want an error naming the run", claim, err)
	}
}

// TestTwoSweepersAndAStartingRun: the interleaving of two sweepers and a run that starts.
// The run has created its lock file and not locked it yet; sweeper B opens it; sweeper A locks
// it, judges the run over (it is not started), and unlinks it; the run, whose flock failed,
// starts again with a new file and holds it; only then does B lock the file it opened, now
// unlinked. B must judge the run by the file at the path (alive), and whatever it judges,
// the run's lock file must stay, so that later sweepers leave its sandboxes and scratch.
func TestTwoSweepersAndAStartingRun(t *testing.T) {
	dir := t.TempDir()
	run := mustNew(t)
	path := lockPath(dir, run.ID())
	if err := os.MkdirAll(filepath.Dir(path), 0o700); err != nil {
		t.Fatal(err)
	}
	// The run's open(O_CREAT), before its flock.
	if err := os.WriteFile(path, nil, 0o600); err != nil {
		t.Fatal(err)
	}
	b, err := takeOver(dir, run.ID(), func() {
		// B has opened the file; before B's flock:
		a, err := mustNew(t).TakeOver(dir, run.ID())
		if a == nil || err != nil {
			t.Fatalf("sweeper A: TakeOver = %+v, %v; want over", a, err)
		}
		if f, err := lockNew(path); f != nil || err != nil { // the run's flock fails: A has it
			t.Fatalf("lockNew of a file a sweeper holds = %v, %v; want a retry", f, err)
		}
		if err := a.Release(); err != nil {
			t.Fatal(err)
		}
		if err := run.Hold(dir); err != nil { // the run starts again with a new file
			t.Fatal(err)
		}
	})
	if err != nil {
		t.Fatal(err)
	}
	if b != nil {
		t.Errorf("sweeper B judged a live run over, by the lock of an unlinked file")
		if err := b.Release(); err != nil {
			t.Fatal(err)
		}
	}
	if _, err := os.Stat(path); err != nil {
		t.Fatalf("the live run's lock file is gone: %v", err)
	}
	if c, err := mustNew(t).TakeOver(dir, run.ID()); c != nil || err != nil {
		t.Fatalf("a later sweeper judged the live run over: %+v, %v", c, err)
	}
}

// TestReleaseRemovesOnlyTheFileHeld: a claim's Release (and a run's) removes the lock file only
// while the path names the file it holds locked. Here something that unlinks by name (a
// pipeline from before this rule, sharing the directory) has taken the dead run's file away
// and a run holds a new one of that name: the claim's Release must leave it.
func TestReleaseRemovesOnlyTheFileHeld(t *testing.T) {
	dir := t.TempDir()
	run := mustNew(t)
	path := lockPath(dir, run.ID())
	if err := os.MkdirAll(filepath.Dir(path), 0o700); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(path, nil, 0o600); err != nil { // a killed run's file
		t.Fatal(err)
	}
	claim, err := mustNew(t).TakeOver(dir, run.ID())
	if claim == nil || err != nil {
		t.Fatalf("TakeOver = %+v, %v; want over", claim, err)
	}
	if err := os.Remove(path); err != nil {
		t.Fatal(err)
	}
	if err := run.Hold(dir); err != nil {
		t.Fatal(err)
	}
	if err := claim.Release(); err != nil {
		t.Fatal(err)
	}
	if c, err := mustNew(t).TakeOver(dir, run.ID()); c != nil || err != nil {
		t.Fatalf("after the claim's Release, the live run was judged over: %+v, %v", c, err)
	}
	// The run's own Release removes its file, the one it holds.
	if err := run.Release(); err != nil {
		t.Fatal(err)
	}
	if _, err := os.Stat(path); !os.IsNotExist(err) {
		t.Errorf("the run's Release left its lock file: %v", err)
	}
}

// TestRemoveDeadDirsInADirectoryNamedLikeAGlob: a shared directory whose name holds glob
// metacharacters (a user's output directory beside which a merge pulls) is swept alone: the
// entries of a directory its name would match as a pattern are not judged by its locks.
func TestRemoveDeadDirsInADirectoryNamedLikeAGlob(t *testing.T) {
	base := t.TempDir()
	pattern, other := filepath.Join(base, "[ab]"), filepath.Join(base, "a")
	live := mustNew(t)
	if err := live.Hold(other); err != nil {
		t.Fatal(err)
	}
	liveDir := filepath.Join(other, ".merge-pull-"+live.ID()+"-1")
	for _, d := range []string{pattern, liveDir} {
		if err := os.MkdirAll(d, 0o755); err != nil {
			t.Fatal(err)
		}
	}
	if removed, err := mustNew(t).RemoveDeadDirs(pattern, ".merge-pull-"); len(removed) != 0 || err != nil {
		t.Fatalf("RemoveDeadDirs(%s) = %v, %v; want nothing", pattern, removed, err)
	}
	if _, err := os.Stat(liveDir); err != nil {
		t.Fatalf("a live run's directory in %s was removed: %v", other, err)
	}
}

// TestTakeOverFollowsNoSymlink: a shared directory is shared with strangers; one who plants a
// run's lock file as a symlink (beside a leftover of that run, so that a sweep judges it) must
// not have a sweeper open, as root, the file it points to (a device, another program's lock).
// Such a file is no run's lock: no judgement, an error naming it, and the leftover stays.
func TestTakeOverFollowsNoSymlink(t *testing.T) {
	dir, outside := t.TempDir(), t.TempDir()
	target := filepath.Join(outside, "someone-elses.lock")
	if err := os.WriteFile(target, nil, 0o600); err != nil {
		t.Fatal(err)
	}
	id := mustNew(t).ID()
	if err := os.MkdirAll(filepath.Join(dir, RunsDir), 0o700); err != nil {
		t.Fatal(err)
	}
	if err := os.Symlink(target, lockPath(dir, id)); err != nil {
		t.Fatal(err)
	}
	leftover := filepath.Join(dir, ".pending-"+id+"-1")
	if err := os.Mkdir(leftover, 0o700); err != nil {
		t.Fatal(err)
	}
	claim, err := mustNew(t).TakeOver(dir, id)
	if claim != nil {
		defer claim.Release()
		f, openErr := os.Open(target)
		if openErr != nil {
			t.Fatal(openErr)
		}
		defer f.Close()
		if syscall.Flock(int(f.Fd()), syscall.LOCK_EX|syscall.LOCK_NB) != nil {
			t.Fatalf("TakeOver locked %s, the file a planted symlink names", target)
		}
	}
	if claim != nil || err == nil || !strings.Contains(err.Error(), lockPath(dir, id)) {
		t.Fatalf("TakeOver of a symlinked lock = %+v, %v; want an error naming it", claim, err)
	}
	if removed, err := mustNew(t).RemoveDeadDirs(dir, ".pending-"); len(removed) != 0 || err == nil {
		t.Errorf("RemoveDeadDirs = %v, %v; want the leftover left and an error", removed, err)
	}
	if _, err := os.Lstat(leftover); err != nil {
		t.Errorf("the leftover judged by a symlink was removed: %v", err)
	}
}
