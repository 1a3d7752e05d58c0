package orphans_test

import (
	"bufio"
	"context"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strings"
	"syscall"
	"testing"
	"time"

	"readie.dev/pipeline/internal/lease"
	"readie.dev/pipeline/internal/orphans"
	"readie.dev/pipeline/internal/testenv"
	"readie.dev/pipeline/pkg/launch"
	"readie.dev/pipeline/pkg/sandbox"
)

// TestRemoveOrphans (with a stand-in runsc): only the pipeline's sandboxes whose run is over
// (its lease not held) are deleted, with the lock files such runs left; sandboxes of live runs
// (another's, this one's) and of pipelines from before leases stay; a failed delete is
// reported with runsc's words.
func TestRemoveOrphans(t *testing.T) {
	path, calls := testenv.FakeRunsc(t, "[]")
	root := t.TempDir()
	id := func(l *lease.Lease, set, step string) string {
		rt := &launch.Runtime{Path: path, Root: root, Lease: l}
		id, err := rt.NewID(set, step)
		if err != nil {
			t.Fatal(err)
		}
		return id
	}
	dead, live, own := testenv.NewLease(t), testenv.NewLease(t), testenv.NewLease(t)
	orphan, stuck := id(dead, "numpy", "capture"), id(dead, "fail", "measure")
	running, mine := id(live, "pandas", "capture"), id(own, "json", "smoke")
	deadSoak, liveSoak, deadSoak2 := id(dead, "pandas", "soak"), id(live, "numpy", "soak"), id(dead, "json", "soak")
	dead.Release()
	list := `[{"id":"` + strings.Join([]string{orphan, stuck, running, mine, "readie-old-capture-4242-cccc0000", "someone-elses"}, `","status":"running"},{"id":"`) + `","status":"running"}]`
	os.WriteFile(filepath.Join(filepath.Dir(path), "list.json"), []byte(list), 0o644)
	rt := &launch.Runtime{Path: path, Root: root, Flags: sandbox.DefaultFlags(), Lease: own}
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	removed, err := orphans.Remove(ctx, rt, own)
	if len(removed) != 1 || removed[0].ID != orphan || removed[0].Run != dead.ID() || removed[0].Note != "" {
		t.Errorf("removed %+v, want only %s", removed, orphan)
	}
	if err == nil || !strings.Contains(err.Error(), stuck) || !strings.Contains(err.Error(), "device or resource busy") {
		t.Errorf("err = %v, want the failed delete of %s with runsc's words", err, stuck)
	}
	var deleted []string
	for _, line := range calls() {
		if strings.Contains(line, " delete ") {
			deleted = append(deleted, line[strings.LastIndex(line, " ")+1:])
		}
	}
	slices.Sort(deleted)
	want := []string{stuck, orphan}
	slices.Sort(want)
	if !slices.Equal(deleted, want) {
		t.Errorf("deleted %v, want %v", deleted, want)
	}
	// runsc's lock files without a state beside them (a `runsc list` made them again after a
	// delete): the dead run's goes, a live run's stays (its state may be on its way), and so
	// does a dead run's lock whose state is still there, and a file that is not the pipeline's.
	stray := func(id string, withState bool) string {
		base := filepath.Join(root, id+"_sandbox:"+id)
		os.WriteFile(base+".lock", nil, 0o600)
		if withState {
			os.WriteFile(base+".state", []byte("{}"), 0o600)
		}
		return base + ".lock"
	}
	deadStray, liveStray := stray(deadSoak, false), stray(liveSoak, false)
	deadWithState, notOurs := stray(deadSoak2, true), stray("someone-elses", false)
	orphans.Remove(ctx, rt, own) // its other sandboxes as above: judged above
	if _, err := os.Lstat(deadStray); !errors.Is(err, fs.ErrNotExist) {
		t.Errorf("a dead run's stray runsc lock file is still there (%v)", err)
	}
	for _, kept := range []string{liveStray, deadWithState, notOurs} {
		if _, err := os.Lstat(kept); err != nil {
			t.Errorf("%s was removed: %v", kept, err)
		}
	}
	locks, _ := filepath.Glob(filepath.Join(root, lease.RunsDir, "*.lock"))
	if len(locks) != 2 {
		t.Errorf("lock files left %v, want the live run's and this one's", locks)
	}
	if _, err := (&launch.Runtime{Path: path, Root: root}).NewID("x", "y"); err == nil {
		t.Error("NewID without a lease succeeded")
	}
}

// otherNamespace is a run that made a sandbox from a pid namespace of its own (as a pod's
// pipeline does) and whose lease is gone: its sandbox runs `sleep` under the shared root.
type otherNamespace struct {
	id     string
	cmd    *exec.Cmd
	stdout *bufio.Reader
}

func startInOtherNamespace(t *testing.T, rt *launch.Runtime) *otherNamespace {
	t.Helper()
	run := testenv.NewLease(t)
	other := *rt
	other.Lease = run
	// Only its bundle is made here: it is created and started in the other namespace.
	l := &launch.Launcher{Runtime: &other, Rootfs: testenv.Rootfs(t), WorkDir: testenv.WorkDir(t)}
	sb, err := l.NewSandbox("orphan", "ns", sandbox.ModeSandbox, nil, []string{"/bin/sleep", "3600"})
	if err != nil {
		t.Fatal(err)
	}
	id := sb.ID
	runsc := strings.Join(append([]string{rt.Path, "--root=" + rt.Root}, rt.Flags.Args()...), " ")
	script := fmt.Sprintf("%s create --bundle %s %s && %s start %s && echo started && exec sleep 3600", runsc, sb.Bundle, id, runsc, id)
	ns := &otherNamespace{id: id, cmd: exec.Command("unshare", "--pid", "--fork", "--kill-child", "--mount-proc", "sh", "-c", script)}
	// The sandbox's processes hold this pipe too: its end says that all of them are gone.
	r, w, err := os.Pipe()
	if err != nil {
		t.Fatal(err)
	}
	ns.cmd.Stdout, ns.cmd.Stderr = w, os.Stderr
	if err := ns.cmd.Start(); err != nil {
		t.Fatal(err)
	}
	w.Close()
	t.Cleanup(func() {
		ns.cmd.Process.Kill()
		ns.cmd.Wait()
		r.Close()
	})
	ns.stdout = bufio.NewReader(r)
	if line, err := ns.stdout.ReadString('\n'); line != "started\n" {
		t.Fatalf("the sandbox in another pid namespace did not start: %q %v", line, err)
	}
	if err := run.Release(); err != nil { // the run is over; its sandbox is left behind
		t.Fatal(err)
	}
	return ns
}

// kill kills the namespace (SIGKILL to unshare, which kills its pid 1, and the namespace
// with it) and waits until every process of it, the sandbox's included, is gone.
func (ns *otherNamespace) kill(t *testing.T) {
	t.Helper()
	ns.cmd.Process.Signal(syscall.SIGKILL)
	ns.cmd.Wait()
	done := make(chan struct{})
	go func() { io.Copy(io.Discard, ns.stdout); close(done) }()
	select {
	case <-done:
	case <-time.After(time.Minute):
		t.Fatal("the namespace's processes outlived its SIGKILL by a minute")
	}
}

// TestRemoveOrphanFromAnotherPidNamespace (real runsc): runsc records the pids of a sandbox as
// the namespace that made it saw them (small numbers, which here are strangers such as kernel
// threads); orphans.Remove signals none of them, removes the sandbox's processes that are still
// visible here, and leaves no runsc state, cgroup or process of it, within runsc_command's
// limit (runsc alone would wait two minutes for a stranger to stop).
func TestRemoveOrphanFromAnotherPidNamespace(t *testing.T) {
	for _, namespaceAlive := range []bool{false, true} {
		t.Run(fmt.Sprintf("namespace_alive=%v", namespaceAlive), func(t *testing.T) {
			rt := testenv.Runtime(t)
			rt.CommandTimeout = 20 * time.Second
			ns := startInOtherNamespace(t, rt)
			if !namespaceAlive {
				ns.kill(t)
			}
			ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
			defer cancel()
			start := time.Now()
			removed, err := orphans.Remove(ctx, rt, rt.Lease.(*lease.Lease))
			took := time.Since(start) // logged, never asserted
			if err != nil || len(removed) != 1 || removed[0].ID != ns.id {
				t.Fatalf("Remove = %+v, %v; want %s", removed, err, ns.id)
			}
			t.Logf("removed %s in %s: %s", removed[0].ID, took.Round(time.Millisecond), removed[0].Note)
			if !strings.Contains(removed[0].Note, "not its processes in this pid namespace") {
				t.Errorf("the note does not say why runsc was not let signal: %q", removed[0].Note)
			}
			if namespaceAlive != strings.Contains(removed[0].Note, "were killed") {
				t.Errorf("namespace alive %v, note %q", namespaceAlive, removed[0].Note)
			}
			if ids, err := rt.List(ctx); err != nil || len(ids) != 0 {
				t.Errorf("runsc list after: %v %v", ids, err)
			}
			if left, _ := filepath.Glob(filepath.Join(rt.Root, "*"+ns.id+"*")); len(left) != 0 {
				t.Errorf("runsc state left: %v", left)
			}
			if left, _ := filepath.Glob(filepath.Join("/sys/fs/cgroup/*", ns.id)); len(left) != 0 {
				t.Errorf("cgroups left: %v", left)
			}
			if left, err := testenv.RunscProcesses(rt.Root, ns.id); err != nil || len(left) != 0 {
				t.Errorf("processes of the sandbox left: %v %v", left, err)
			}
		})
	}
}
