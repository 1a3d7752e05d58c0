package pool_test

import (
	"context"
	"errors"
	"os"
	"slices"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	specs "github.com/opencontainers/runtime-spec/specs-go"

	"readie.dev/pipeline/internal/testenv"
	"readie.dev/pipeline/pkg/launch"
	"readie.dev/pipeline/pkg/pool"
	"readie.dev/pipeline/pkg/runsc"
)

// options are a pool of size on the stand-in runsc f (testenv.FakeSandboxRunsc: the real one
// is tested in real_test.go), its sandboxes named "pool-...".
func options(t *testing.T, f *testenv.FakeSandboxRunsc, size int) (pool.Options, launch.SandboxOptions) {
	so := f.Options(t, specs.User{})
	so.IDs = launch.RandomIDs{Prefix: "pool"}
	return pool.Options{
		New:        func() (*launch.Sandbox, error) { return launch.NewSandbox(so, "pool", "pooled") },
		Size:       size,
		GetTimeout: time.Minute,
		RetryDelay: 10 * time.Millisecond,
	}, so
}

func ctxFor(t *testing.T) context.Context {
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	t.Cleanup(cancel)
	return ctx
}

// TestRefillAndNoReuse: a pool of 2 fills up; each Get hands out a sandbox never handed out
// before and the pool makes another; a sandbox is started once, a second start of any kind is
// refused; a deleted sandbox is gone from runsc with its directories; Close deletes the rest,
// those handed out and not yet deleted included.
func TestRefillAndNoReuse(t *testing.T) {
	f := testenv.NewFakeSandboxRunsc(t)
	ctx := ctxFor(t)
	o, _ := options(t, f, 2)
	p, err := pool.New(ctx, o)
	if err != nil {
		t.Fatal(err)
	}
	defer p.Close()
	if err := p.Wait(ctx); err != nil {
		t.Fatal(err)
	}
	seen := map[string]bool{}
	var kept *launch.Sandbox
	for i := range 4 {
		sb, err := p.Get(ctx)
		if err != nil {
			t.Fatal(err)
		}
		if seen[sb.ID] {
			t.Fatalf("sandbox %s handed out twice", sb.ID)
		}
		seen[sb.ID] = true
		if err := sb.Start(ctx, launch.Image{Dir: "/images/set", Flags: []string{"-background"}}); err != nil {
			t.Fatal(err)
		}
		if err := sb.Start(ctx, launch.Image{Dir: "/images/set"}); !errors.Is(err, launch.ErrUsed) {
			t.Errorf("second restore of %s = %v, want ErrUsed", sb.ID, err)
		}
		if err := sb.Start(ctx, launch.Image{}); !errors.Is(err, launch.ErrUsed) {
			t.Errorf("cold start after a restore of %s = %v, want ErrUsed", sb.ID, err)
		}
		if i == 3 {
			kept = sb // Close must delete it
			break
		}
		if err := sb.Delete(ctx); err != nil {
			t.Fatal(err)
		}
		if slices.Contains(f.Live(), sb.ID) {
			t.Errorf("%s still exists after Delete", sb.ID)
		}
		for _, dir := range []string{sb.Bundle, sb.HostDir} {
			if _, err := os.Stat(dir); !errors.Is(err, os.ErrNotExist) {
				t.Errorf("%s still exists after Delete: %v", dir, err)
			}
		}
		if err := p.Wait(ctx); err != nil {
			t.Fatal(err)
		}
	}
	if err := p.Wait(ctx); err != nil {
		t.Fatal(err)
	}
	if s := p.Stats(); s.Created != 6 || s.HandedOut != 4 || s.Ready != 2 {
		t.Errorf("stats %+v, want 6 created (2 + 4 refills), 4 handed out, 2 ready", s)
	}
	restores := f.Calls("restore")
	if len(restores) != 4 || !strings.Contains(restores[0], "--image-path=/images/set --detach -background") {
		t.Errorf("restores: %q", restores)
	}
	if err := p.Close(); err != nil {
		t.Fatal(err)
	}
	if live := f.Live(); len(live) != 0 {
		t.Errorf("after Close: %v live (the kept one was %s)", live, kept.ID)
	}
	if _, err := p.Get(ctx); !errors.Is(err, pool.ErrClosed) {
		t.Errorf("Get after Close = %v, want ErrClosed", err)
	}
}

// TestExhausted: with every create failing, Get waits no longer than its limit and says why
// (ErrExhausted, the create's own error); once creates work again the pool recovers. With a
// create that does not end, a pool of 1 hands out its one sandbox, then a Get is bounded; the
// pool's Close lets that create finish and deletes its sandbox.
func TestExhausted(t *testing.T) {
	f := testenv.NewFakeSandboxRunsc(t)
	ctx := ctxFor(t)
	f.Fault(t, "fail-create", true)
	o, _ := options(t, f, 1)
	o.GetTimeout = 300 * time.Millisecond
	p, err := pool.New(ctx, o)
	if err != nil {
		t.Fatal(err)
	}
	defer p.Close()
	// Once a create has failed (not a race with the clock: the Get below cannot succeed
	// whenever it ends), the error names it.
	testenv.WaitFor(t, "a failed create", func() bool { return p.Stats().Failed > 0 })
	_, err = p.Get(ctx)
	if !errors.Is(err, pool.ErrExhausted) || !errors.Is(err, runsc.ErrFailed) || !strings.Contains(err.Error(), "no space left on device") {
		t.Fatalf("Get with failing creates = %v, want ErrExhausted naming the create's error", err)
	}
	f.Fault(t, "fail-create", false)
	p.Close()

	o.GetTimeout = time.Minute
	p, err = pool.New(ctx, o)
	if err != nil {
		t.Fatal(err)
	}
	defer p.Close()
	if err := p.Wait(ctx); err != nil {
		t.Fatal(err)
	}
	begun := len(f.Calls("create"))
	f.Fault(t, "hold-create", true) // the refill after the next Get does not end
	sb, err := p.Get(ctx)
	if err != nil {
		t.Fatal(err)
	}
	testenv.WaitFor(t, "the refill's create", func() bool { return len(f.Calls("create")) == begun+1 })
	short, cancel := context.WithTimeout(ctx, 300*time.Millisecond)
	defer cancel()
	if _, err := p.Get(short); !errors.Is(err, pool.ErrExhausted) || !errors.Is(err, context.DeadlineExceeded) {
		t.Fatalf("Get of an exhausted pool = %v, want ErrExhausted and the caller's deadline", err)
	}
	closed := make(chan error, 1)
	go func() { closed <- p.Close() }()
	f.Fault(t, "hold-create", false)
	if err := <-closed; err != nil {
		t.Fatal(err)
	}
	if live := f.Live(); len(live) != 0 || !slices.ContainsFunc(f.Calls("delete"), func(c string) bool { return strings.HasSuffix(c, sb.ID) }) {
		t.Errorf("after Close: %v live, deletes %q", live, f.Calls("delete"))
	}
}

// TestCancel: cancelling the context given to New closes the pool: a Get under way returns,
// later ones fail with ErrClosed, a create under way is let finish, and every sandbox is
// deleted, ready, handed out or just created.
func TestCancel(t *testing.T) {
	f := testenv.NewFakeSandboxRunsc(t)
	ctx, cancel := context.WithCancel(ctxFor(t))
	o, _ := options(t, f, 2)
	p, err := pool.New(ctx, o)
	if err != nil {
		t.Fatal(err)
	}
	if err := p.Wait(ctx); err != nil {
		t.Fatal(err)
	}
	if _, err := p.Get(ctx); err != nil { // handed out, never deleted by its user
		t.Fatal(err)
	}
	if err := p.Wait(ctx); err != nil {
		t.Fatal(err)
	}
	f.Fault(t, "hold-create", true)
	p.Get(ctx)
	p.Get(ctx) // now empty: the refill waits in a create
	testenv.WaitFor(t, "the held create", func() bool { return len(f.Calls("create")) == 4 })
	waiting := make(chan error, 1)
	go func() {
		_, err := p.Get(context.Background())
		waiting <- err
	}()
	cancel()
	select {
	case err := <-waiting:
		if !errors.Is(err, pool.ErrClosed) {
			t.Errorf("a Get under way at the cancel = %v, want ErrClosed", err)
		}
	case <-time.After(time.Minute):
		t.Fatal("a Get under way did not return after the cancel")
	}
	f.Fault(t, "hold-create", false)
	if err := p.Close(); err != nil { // the close the cancel began: it ends once the create has
		t.Fatal(err)
	}
	if live := f.Live(); len(live) != 0 {
		t.Errorf("after the cancel: %v live", live)
	}
	if n, made := len(f.Calls("delete")), len(f.Calls("created")); n != 4 || made != 4 {
		t.Errorf("%d creates ended and %d deletes, want 4 of each (the held create let finish, then deleted)", made, n)
	}
}

// TestDeadReplaced: a ready sandbox whose process was killed is never handed out: Get skips
// it, the pool deletes it and creates another.
func TestDeadReplaced(t *testing.T) {
	f := testenv.NewFakeSandboxRunsc(t)
	ctx := ctxFor(t)
	o, _ := options(t, f, 2)
	p, err := pool.New(ctx, o)
	if err != nil {
		t.Fatal(err)
	}
	defer p.Close()
	if err := p.Wait(ctx); err != nil {
		t.Fatal(err)
	}
	live := f.Live()
	victim := f.Calls("created")[0] // the first made is the first handed out
	victimID := strings.Fields(victim)[1]
	pid := f.Pid(victimID)
	if len(live) != 2 || pid <= 0 {
		t.Fatalf("live %v, victim %s pid %d", live, victimID, pid)
	}
	if err := syscall.Kill(pid, syscall.SIGKILL); err != nil {
		t.Fatal(err)
	}
	// The process is gone once it is reaped; the fake's shell does not reap it, init does:
	// wait until /proc no longer shows it running.
	testenv.WaitFor(t, "the killed process to die", func() bool {
		data, err := os.ReadFile("/proc/" + strconv.Itoa(pid) + "/stat")
		return err != nil || strings.Contains(string(data), ") Z ")
	})
	sb, err := p.Get(ctx)
	if err != nil {
		t.Fatal(err)
	}
	defer sb.Delete(ctx)
	if sb.ID == victimID {
		t.Fatalf("the dead sandbox %s was handed out", victimID)
	}
	if err := sb.Start(ctx, launch.Image{Dir: "/images/set"}); err != nil {
		t.Fatal(err)
	}
	if err := p.Wait(ctx); err != nil {
		t.Fatal(err)
	}
	if s := p.Stats(); s.Dead != 1 || s.Created != 4 {
		t.Errorf("stats %+v, want 1 dead and 4 created (2, the replacement of the dead one and of the one handed out)", s)
	}
	if slices.Contains(f.Live(), victimID) {
		t.Errorf("the dead sandbox %s was not deleted", victimID)
	}
}

// TestTakenIDNotDeleted: a create under a name another sandbox holds in the same runsc root (an
// IDs policy that repeats itself) fails with a clear error and leaves that sandbox alone: the
// pool's clean-up of a failed create must not `runsc delete --force` a stranger's sandbox.
func TestTakenIDNotDeleted(t *testing.T) {
	f := testenv.NewFakeSandboxRunsc(t)
	ctx := ctxFor(t)
	o, so := options(t, f, 1)
	so.IDs = testenv.SameID("taken-0a1b2c3d")
	// Another user's sandbox, named as the pool will name its own.
	theirs, err := launch.NewSandbox(so, "other", "other")
	if err != nil {
		t.Fatal(err)
	}
	if err := theirs.Create(ctx); err != nil {
		t.Fatal(err)
	}
	defer theirs.Delete(ctx)
	so.WorkDir = testenv.WorkDir(t)
	o.New = func() (*launch.Sandbox, error) { return launch.NewSandbox(so, "pool", "pooled") }
	o.GetTimeout = 100 * time.Millisecond // no create can succeed
	p, err := pool.New(ctx, o)
	if err != nil {
		t.Fatal(err)
	}
	testenv.WaitFor(t, "a failed create", func() bool { return p.Stats().Failed > 0 || p.Stats().Created > 0 })
	if _, err := p.Get(ctx); !errors.Is(err, pool.ErrExhausted) || !strings.Contains(err.Error(), "already exists") {
		t.Errorf("Get with every name taken = %v, want ErrExhausted naming the taken name", err)
	}
	if err := p.Close(); err != nil {
		t.Fatal(err)
	}
	if !slices.Contains(f.Live(), "taken-0a1b2c3d") {
		t.Error("the pool deleted a sandbox it did not make")
	}
}

// TestRefillOnDelete: with RefillOnDelete a handed-out sandbox's replacement is not created
// while it is held (a bench times Get to the answer with no `runsc create` beside it), and is
// created once it is deleted. Without it the refill starts as Get returns (the default).
func TestRefillOnDelete(t *testing.T) {
	f := testenv.NewFakeSandboxRunsc(t)
	ctx := ctxFor(t)
	o, _ := options(t, f, 1)
	o.RefillOnDelete = true
	o.GetTimeout = 2 * time.Second // Wait's limit while the refill is held back on purpose
	p, err := pool.New(ctx, o)
	if err != nil {
		t.Fatal(err)
	}
	defer p.Close()
	if err := p.Wait(ctx); err != nil {
		t.Fatal(err)
	}
	sb, err := p.Get(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if err := p.Wait(ctx); !errors.Is(err, pool.ErrExhausted) {
		t.Errorf("Wait while the sandbox is held = %v, want ErrExhausted (no refill yet)", err)
	}
	if n := len(f.Calls("create")); n != 1 {
		t.Errorf("%d creates while the sandbox is held, want 1", n)
	}
	if err := sb.Delete(ctx); err != nil {
		t.Fatal(err)
	}
	if err := p.Wait(ctx); err != nil {
		t.Errorf("Wait after the Delete = %v, want the refill", err)
	}
	if n := len(f.Calls("create")); n != 2 {
		t.Errorf("%d creates after the Delete, want 2", n)
	}
}
