package launch_test

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	specs "github.com/opencontainers/runtime-spec/specs-go"

	"readie.dev/pipeline/internal/testenv"
	"readie.dev/pipeline/pkg/launch"
)

// TestCreateNotKilledHalfWay: a create under way when its context is cancelled is let finish
// (a create killed half-way left a sandbox that `runsc delete --force` cannot find); Create
// then returns the context's cause, and Delete deletes what the create made.
func TestCreateNotKilledHalfWay(t *testing.T) {
	f := testenv.NewFakeSandboxRunsc(t)
	sb, err := launch.NewSandbox(f.Options(t, specs.User{}), "set", "create")
	if err != nil {
		t.Fatal(err)
	}
	f.Fault(t, "hold-create", true)
	ctx, cancel := context.WithCancelCause(context.Background())
	done := make(chan error, 1)
	go func() { done <- sb.Create(ctx) }()
	testenv.WaitFor(t, "the create to begin", func() bool { return len(f.Calls("create")) > 0 })
	stopped := errors.New("stopped by the test")
	cancel(stopped)
	f.Fault(t, "hold-create", false) // the create may end now, if it was not killed
	select {
	case err = <-done:
	case <-time.After(time.Minute):
		t.Fatal("Create did not return within a minute of its create's end")
	}
	if !errors.Is(err, stopped) {
		t.Errorf("Create cancelled half-way = %v, want the context's cause", err)
	}
	if created := f.Calls("created"); len(created) != 1 || !strings.HasSuffix(created[0], sb.ID) {
		t.Fatalf("the create was killed half-way: log %q", f.Calls("create"))
	}
	if err := sb.Delete(ctx); err != nil {
		t.Fatal(err)
	}
	if live := f.Live(); len(live) != 0 {
		t.Errorf("after Delete: %v live", live)
	}
}

// TestNoCreateOnceCancelled: a create, a cold start or a restore that would make its sandbox,
// asked with a context already ended, runs no runsc command and says why.
func TestNoCreateOnceCancelled(t *testing.T) {
	f := testenv.NewFakeSandboxRunsc(t)
	ctx, cancel := context.WithCancelCause(context.Background())
	stopped := errors.New("stopped by the test")
	cancel(stopped)
	for name, start := range map[string]func(*launch.Sandbox) error{
		"Create":       func(sb *launch.Sandbox) error { return sb.Create(ctx) },
		"a cold Start": func(sb *launch.Sandbox) error { return sb.Start(ctx, launch.Image{}) },
		"a restore":    func(sb *launch.Sandbox) error { return sb.Start(ctx, launch.Image{Dir: "/images/set"}) },
	} {
		sb, err := launch.NewSandbox(f.Options(t, specs.User{}), "set", "late")
		if err != nil {
			t.Fatal(err)
		}
		if err := start(sb); !errors.Is(err, stopped) {
			t.Errorf("%s once cancelled = %v, want the cause", name, err)
		}
		if err := sb.Delete(context.Background()); err != nil {
			t.Error(err)
		}
	}
	if calls := f.Calls("begin"); len(calls) != 0 {
		t.Errorf("runsc ran: %q", calls)
	}
}

// TestNewSandboxWritesOneBundle: the bundle is WorkDir/ID (0700) with a compact config.json
// (0600) holding the spec; the host directory (0700) belongs to the spec's user, root's or
// uid 1000's, and its parent, the work directory, is root's and 0700, so that whatever uid a
// stranger's restore spec names reaches nothing else on the host. Delete removes both.
func TestNewSandboxWritesOneBundle(t *testing.T) {
	f := testenv.NewFakeSandboxRunsc(t)
	for _, user := range []specs.User{{}, {UID: 1000, GID: 1000}} {
		o := f.Options(t, user)
		sb, err := launch.NewSandbox(o, "set", "bundle")
		if err != nil {
			t.Fatal(err)
		}
		if sb.Bundle != filepath.Join(o.WorkDir, sb.ID) || filepath.Dir(sb.HostDir) != o.WorkDir {
			t.Errorf("bundle %s, host dir %s: want both in %s", sb.Bundle, sb.HostDir, o.WorkDir)
		}
		for _, c := range []struct {
			path     string
			uid, gid uint32
			mode     os.FileMode
		}{
			{o.WorkDir, 0, 0, os.ModeDir | 0o700},
			{sb.Bundle, 0, 0, os.ModeDir | 0o700},
			{filepath.Join(sb.Bundle, "config.json"), 0, 0, 0o600},
			{sb.HostDir, user.UID, user.GID, os.ModeDir | 0o700},
		} {
			fi, err := os.Stat(c.path)
			if err != nil {
				t.Fatal(err)
			}
			st := fi.Sys().(*syscall.Stat_t)
			if st.Uid != c.uid || st.Gid != c.gid || fi.Mode() != c.mode {
				t.Errorf("user %d: %s is %s %d:%d, want %s %d:%d", user.UID, c.path, fi.Mode(), st.Uid, st.Gid, c.mode, c.uid, c.gid)
			}
		}
		data, err := os.ReadFile(filepath.Join(sb.Bundle, "config.json"))
		if err != nil {
			t.Fatal(err)
		}
		var spec specs.Spec
		if err := json.Unmarshal(data, &spec); err != nil || spec.Mounts[0].Source != sb.HostDir || bytes.Contains(data, []byte("\n")) {
			t.Errorf("config.json = %s (%v): want the compact spec with the host directory", data, err)
		}
		if err := sb.Delete(context.Background()); err != nil {
			t.Fatal(err)
		}
		for _, dir := range []string{sb.Bundle, sb.HostDir} {
			if _, err := os.Stat(dir); !errors.Is(err, os.ErrNotExist) {
				t.Errorf("%s still there after Delete: %v", dir, err)
			}
		}
	}
}

// TestWorkDirOthersCanEnterIsRefused: a work directory that others can enter (0755) or that is
// another user's is refused, naming it, and nothing of the sandbox is made in it.
func TestWorkDirOthersCanEnterIsRefused(t *testing.T) {
	f := testenv.NewFakeSandboxRunsc(t)
	for name, prepare := range map[string]func(dir string) error{
		"mode 0755": func(dir string) error { return os.Chmod(dir, 0o755) },
		"uid 1000":  func(dir string) error { return os.Chown(dir, 1000, 1000) },
	} {
		o := f.Options(t, specs.User{})
		if err := prepare(o.WorkDir); err != nil {
			t.Fatal(err)
		}
		if _, err := launch.NewSandbox(o, "set", "refused"); err == nil || !strings.Contains(err.Error(), o.WorkDir) || !strings.Contains(err.Error(), "0700") {
			t.Errorf("%s: NewSandbox = %v, want a refusal naming the directory", name, err)
		}
		if entries, _ := os.ReadDir(o.WorkDir); len(entries) != 0 {
			t.Errorf("%s: the refusal left %v", name, entries)
		}
	}
}

// TestDeleteExactlyOnce: Delete runs `runsc delete --force` once however often it is called
// and returns the first result each time; a failed delete is reported; a sandbox that never
// ran a runsc command is not deleted from runsc at all. KeepLogs leaves the bundle, never the
// host directory.
func TestDeleteExactlyOnce(t *testing.T) {
	f := testenv.NewFakeSandboxRunsc(t)
	ctx := context.Background()
	o := f.Options(t, specs.User{})
	sb, err := launch.NewSandbox(o, "set", "once")
	if err != nil {
		t.Fatal(err)
	}
	if err := sb.Create(ctx); err != nil {
		t.Fatal(err)
	}
	var wg sync.WaitGroup
	for range 4 {
		wg.Go(func() {
			if err := sb.Delete(ctx); err != nil {
				t.Error(err)
			}
		})
	}
	wg.Wait()
	if n := len(f.Calls("delete")); n != 1 {
		t.Errorf("%d deletes for one sandbox, want 1", n)
	}
	unused, err := launch.NewSandbox(o, "set", "unused")
	if err != nil {
		t.Fatal(err)
	}
	if err := unused.Delete(ctx); err != nil || len(f.Calls("delete")) != 1 {
		t.Errorf("Delete of a sandbox never created = %v, with %d runsc deletes, want none", err, len(f.Calls("delete"))-1)
	}

	// A runsc whose delete fails: reported, and again on the second call.
	failing, _ := testenv.FakeRunsc(t, "[]")
	o.Runtime = &launch.Runtime{Path: failing, Root: t.TempDir(), Lease: testenv.Lease(t)}
	o.IDs = launch.RandomIDs{Prefix: "fail"} // its delete fails
	o.KeepLogs = true
	sb, err = launch.NewSandbox(o, "set", "fail")
	if err != nil {
		t.Fatal(err)
	}
	if err := sb.Create(ctx); err == nil || !strings.Contains(err.Error(), "no pid file") {
		t.Fatalf("create on a runsc that writes no pid file = %v", err)
	}
	first := sb.Delete(ctx)
	if first == nil || !strings.Contains(first.Error(), "may be left behind") || !strings.Contains(first.Error(), "device or resource busy") {
		t.Errorf("a failed delete = %v, want it reported", first)
	}
	if again := sb.Delete(ctx); again == nil || again.Error() != first.Error() {
		t.Errorf("second Delete = %v, want the first's error", again)
	}
	if _, err := os.Stat(filepath.Join(sb.Bundle, "config.json")); err != nil {
		t.Errorf("KeepLogs: the bundle is gone: %v", err)
	}
	if _, err := os.Stat(sb.HostDir); !errors.Is(err, os.ErrNotExist) {
		t.Errorf("KeepLogs: the host directory is still there: %v", err)
	}
}

// TestTakenIDLeftAlone: a create under a name another sandbox holds in the same runsc root (an
// IDs policy that repeats itself) fails saying so, and Delete leaves that sandbox alone:
// `runsc delete --force` would kill a stranger's sandbox.
func TestTakenIDLeftAlone(t *testing.T) {
	f := testenv.NewFakeSandboxRunsc(t)
	ctx := context.Background()
	o := f.Options(t, specs.User{})
	o.IDs = testenv.SameID("taken-0a1b2c3d")
	theirs, err := launch.NewSandbox(o, "set", "theirs")
	if err != nil {
		t.Fatal(err)
	}
	if err := theirs.Create(ctx); err != nil {
		t.Fatal(err)
	}
	defer theirs.Delete(ctx)
	o.WorkDir = testenv.WorkDir(t) // another bundle, the same name
	ours, err := launch.NewSandbox(o, "set", "ours")
	if err != nil {
		t.Fatal(err)
	}
	if err := ours.Create(ctx); err == nil || !strings.Contains(err.Error(), "already exists") || !strings.Contains(err.Error(), theirs.Bundle) {
		t.Errorf("a create under a taken name = %v, want it named, with the other bundle", err)
	}
	if err := ours.Delete(ctx); err != nil {
		t.Fatal(err)
	}
	if len(f.Calls("delete")) != 0 || len(f.Live()) != 1 {
		t.Errorf("the other sandbox was deleted: deletes %q, live %v", f.Calls("delete"), f.Live())
	}
}

// TestStartOnce: a sandbox's process starts once: a second start of any kind fails with
// launch.ErrUsed, as does one after Delete, and a Create after a start.
func TestStartOnce(t *testing.T) {
	f := testenv.NewFakeSandboxRunsc(t)
	ctx := context.Background()
	sb, err := launch.NewSandbox(f.Options(t, specs.User{}), "set", "once")
	if err != nil {
		t.Fatal(err)
	}
	defer sb.Delete(ctx)
	if err := sb.Start(ctx, launch.Image{}); err != nil { // cold: create, then start
		t.Fatal(err)
	}
	if len(f.Calls("created")) != 1 || len(f.Calls("start")) != 1 {
		t.Errorf("a cold start ran %q", f.Calls("begin"))
	}
	for name, again := range map[string]func() error{
		"Start":       func() error { return sb.Start(ctx, launch.Image{Dir: "/images/set"}) },
		"RunRestored": func() error { _, err := sb.RunRestored(ctx, launch.Image{Dir: "/images/set"}); return err },
		"Run":         func() error { _, err := sb.Run(ctx); return err },
		"Create":      func() error { return sb.Create(ctx) },
	} {
		if err := again(); !errors.Is(err, launch.ErrUsed) {
			t.Errorf("%s after a start = %v, want launch.ErrUsed", name, err)
		}
	}
}

// TestRestoreBounded: a detached restore that never returns is ended by the runtime's
// RestoreTimeout even under a context without a deadline, with an error that says so.
func TestRestoreBounded(t *testing.T) {
	f := testenv.NewFakeSandboxRunsc(t)
	ctx := context.Background()
	o := f.Options(t, specs.User{})
	o.Runtime.RestoreTimeout = 100 * time.Millisecond
	sb, err := launch.NewSandbox(o, "set", "hang")
	if err != nil {
		t.Fatal(err)
	}
	defer sb.Delete(ctx)
	if err := sb.Create(ctx); err != nil {
		t.Fatal(err)
	}
	f.Fault(t, "hang-restore", true)
	done := make(chan error, 1)
	go func() { done <- sb.Start(ctx, launch.Image{Dir: t.TempDir()}) }()
	select {
	case err := <-done:
		if err == nil || !strings.Contains(err.Error(), "did not return within 100ms") {
			t.Errorf("a hung restore = %v, want the RestoreTimeout error", err)
		}
	case <-time.After(time.Minute):
		t.Fatal("a hung restore under context.Background() did not return within a minute")
	}
}

// TestAlive: a created sandbox is alive while its process runs, and not once it was killed.
func TestAlive(t *testing.T) {
	f := testenv.NewFakeSandboxRunsc(t)
	ctx := context.Background()
	sb, err := launch.NewSandbox(f.Options(t, specs.User{}), "set", "alive")
	if err != nil {
		t.Fatal(err)
	}
	defer sb.Delete(ctx)
	if sb.Alive() {
		t.Error("alive before its create")
	}
	if err := sb.Create(ctx); err != nil {
		t.Fatal(err)
	}
	if !sb.Alive() {
		t.Fatal("not alive after its create")
	}
	pid := f.Pid(sb.ID)
	if err := syscall.Kill(pid, syscall.SIGKILL); err != nil {
		t.Fatal(err)
	}
	testenv.WaitFor(t, "the killed process to be seen dead", func() bool { return !sb.Alive() })
}
