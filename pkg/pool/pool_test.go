package pool_test

import (
	"context"
	"errors"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	specs "github.com/opencontainers/runtime-spec/specs-go"

	"readie.dev/pipeline/pkg/pool"
	"readie.dev/pipeline/pkg/runsc"
)

// fakeRunsc is a substitute runsc for the pool's own logic (the real one is tested below):
// `create` starts a stand-in sandbox process (a sleep holding the executor's stdout, as a
// sandbox does), writes its pid to --pid-file and records it under state/; `restore` and
// `start` fail for a sandbox that is not there or whose process is gone; `delete` kills the
// process and forgets it. Files in the fake's directory induce faults: fail-create makes
// every create fail, hang-create makes every create block until it is killed, hang-restore
// every restore.
type fakeRunsc struct{ dir, path string }

func newFake(t *testing.T) *fakeRunsc {
	t.Helper()
	f := &fakeRunsc{dir: t.TempDir()}
	f.path = filepath.Join(f.dir, "runsc")
	script := `#!/bin/sh
dir="` + f.dir + `"
echo "$*" >> "$dir/calls.log"
for last; do :; done
cmd= pidfile=
for a in "$@"; do
  case "$a" in
    --pid-file=*) pidfile="${a#--pid-file=}" ;;
    create|restore|start|delete|state|kill|list) [ -z "$cmd" ] && cmd=$a ;;
  esac
done
state="$dir/state/$last"
case "$cmd" in
  create)
    [ -e "$dir/fail-create" ] && { echo '{"msg":"creating container: no space left on device"}' >&3; exit 1; }
    [ -e "$dir/hang-create" ] && exec sleep 3600
    [ -e "$state" ] && { echo '{"msg":"container with id '"$last"' already exists"}' >&3; exit 1; }
    mkdir -p "$dir/state"
    sleep 3600 </dev/null 2>&1 &
    echo $! > "$state"
    [ -n "$pidfile" ] && echo $! > "$pidfile"
    exit 0 ;;
  restore|start)
    [ "$cmd" = restore ] && [ -e "$dir/hang-restore" ] && exec sleep 3600
    [ -e "$state" ] && kill -0 "$(cat "$state")" 2>/dev/null || { echo '{"msg":"container is not running"}' >&3; exit 1; }
    exit 0 ;;
  list)
    printf '['; sep=
    for f in "$dir"/state/*; do [ -e "$f" ] && { printf '%s{"id":"%s","status":"created"}' "$sep" "${f##*/}"; sep=,; }; done
    echo ']'
    exit 0 ;;
  delete)
    [ -e "$state" ] && { kill -9 "$(cat "$state")" 2>/dev/null; rm -f "$state"; }
    exit 0 ;;
esac
exit 0
`
	if err := os.WriteFile(f.path, []byte(script), 0o755); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		// A sandbox the pool left behind is a failure; its stand-in is killed either way.
		for _, id := range f.live() {
			t.Errorf("sandbox %s left behind", id)
			if pid := f.pid(id); pid > 0 {
				syscall.Kill(pid, syscall.SIGKILL)
			}
		}
	})
	return f
}

// live lists the sandboxes created and not deleted.
func (f *fakeRunsc) live() []string {
	entries, _ := os.ReadDir(filepath.Join(f.dir, "state"))
	var ids []string
	for _, e := range entries {
		ids = append(ids, e.Name())
	}
	return ids
}

func (f *fakeRunsc) pid(id string) int {
	data, _ := os.ReadFile(filepath.Join(f.dir, "state", id))
	pid, _ := strconv.Atoi(strings.TrimSpace(string(data)))
	return pid
}

// fault turns an induced fault on or off.
func (f *fakeRunsc) fault(t *testing.T, name string, on bool) {
	t.Helper()
	path := filepath.Join(f.dir, name)
	if on {
		if err := os.WriteFile(path, nil, 0o644); err != nil {
			t.Fatal(err)
		}
	} else {
		os.Remove(path)
	}
}

// calls returns the command lines the fake ran that contain word.
func (f *fakeRunsc) calls(word string) []string {
	data, _ := os.ReadFile(filepath.Join(f.dir, "calls.log"))
	var out []string
	for _, line := range strings.Split(strings.TrimSpace(string(data)), "\n") {
		if slices.Contains(strings.Fields(line), word) {
			out = append(out, line)
		}
	}
	return out
}

func (f *fakeRunsc) options(t *testing.T, size int) pool.Options {
	return pool.Options{
		Runsc: &runsc.Runsc{Path: f.path, Root: filepath.Join(f.dir, "root")},
		Size:  size,
		Dir:   t.TempDir(),
		Spec: func(hostDir string) (*specs.Spec, error) {
			return &specs.Spec{Mounts: []specs.Mount{{Destination: "/run/readie", Type: "bind", Source: hostDir}}}, nil
		},
		GetTimeout: time.Minute,
		RetryDelay: 10 * time.Millisecond,
	}
}

// waitFor waits until cond holds, at most a minute.
func waitFor(t *testing.T, what string, cond func() bool) {
	t.Helper()
	for deadline := time.Now().Add(time.Minute); !cond(); time.Sleep(10 * time.Millisecond) {
		if time.Now().After(deadline) {
			t.Fatalf("%s: not within a minute", what)
		}
	}
}

func ctxFor(t *testing.T) context.Context {
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	t.Cleanup(cancel)
	return ctx
}

// TestRefillAndNoReuse: a pool of 2 fills up; each Get hands out a sandbox never handed out
// before and the pool makes another; a sandbox is restored once, a second use is refused; a
// deleted sandbox is gone from runsc with its directories; Close deletes the rest, those
// handed out and not yet deleted included.
func TestRefillAndNoReuse(t *testing.T) {
	f := newFake(t)
	ctx := ctxFor(t)
	o := f.options(t, 2)
	p, err := pool.New(ctx, o)
	if err != nil {
		t.Fatal(err)
	}
	defer p.Close()
	if err := p.Wait(ctx); err != nil {
		t.Fatal(err)
	}
	seen := map[string]bool{}
	var kept *pool.Sandbox
	for i := range 4 {
		sb, err := p.Get(ctx)
		if err != nil {
			t.Fatal(err)
		}
		if seen[sb.ID] {
			t.Fatalf("sandbox %s handed out twice", sb.ID)
		}
		seen[sb.ID] = true
		if err := sb.Restore(ctx, "/images/set", []string{"-background"}); err != nil {
			t.Fatal(err)
		}
		if err := sb.Restore(ctx, "/images/set", nil); !errors.Is(err, pool.ErrUsed) {
			t.Errorf("second restore of %s = %v, want ErrUsed", sb.ID, err)
		}
		if err := sb.Start(ctx); !errors.Is(err, pool.ErrUsed) {
			t.Errorf("start after a restore of %s = %v, want ErrUsed", sb.ID, err)
		}
		if i == 3 {
			kept = sb // Close must delete it
			break
		}
		if err := sb.Delete(ctx); err != nil {
			t.Fatal(err)
		}
		if slices.Contains(f.live(), sb.ID) {
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
	restores := f.calls("restore")
	if len(restores) != 4 || !strings.Contains(restores[0], "--image-path=/images/set --detach -background") {
		t.Errorf("restores: %q", restores)
	}
	if err := p.Close(); err != nil {
		t.Fatal(err)
	}
	if live := f.live(); len(live) != 0 {
		t.Errorf("after Close: %v live (the kept one was %s)", live, kept.ID)
	}
	if _, err := p.Get(ctx); !errors.Is(err, pool.ErrClosed) {
		t.Errorf("Get after Close = %v, want ErrClosed", err)
	}
}

// TestExhausted: with every create failing, Get waits no longer than its limit and says why
// (ErrExhausted, the create's own error); once creates work again the pool recovers. With
// creates that hang, a pool of 1 hands out its one sandbox, then a Get is bounded.
func TestExhausted(t *testing.T) {
	f := newFake(t)
	ctx := ctxFor(t)
	f.fault(t, "fail-create", true)
	o := f.options(t, 1)
	o.GetTimeout = 300 * time.Millisecond
	p, err := pool.New(ctx, o)
	if err != nil {
		t.Fatal(err)
	}
	defer p.Close()
	// Once a create has failed (not a race with the clock: the Get below cannot succeed
	// whenever it ends), the error names it.
	waitFor(t, "a failed create", func() bool { return p.Stats().Failed > 0 })
	_, err = p.Get(ctx)
	if !errors.Is(err, pool.ErrExhausted) || !errors.Is(err, runsc.ErrFailed) || !strings.Contains(err.Error(), "no space left on device") {
		t.Fatalf("Get with failing creates = %v, want ErrExhausted naming the create's error", err)
	}
	if s := p.Stats(); s.Failed == 0 {
		t.Errorf("stats %+v: no failed create counted", s)
	}
	f.fault(t, "fail-create", false)
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
	f.fault(t, "hang-create", true) // the refill after the next Get never finishes
	sb, err := p.Get(ctx)
	if err != nil {
		t.Fatal(err)
	}
	defer sb.Delete(ctx)
	short, cancel := context.WithTimeout(ctx, 300*time.Millisecond)
	defer cancel()
	if _, err := p.Get(short); !errors.Is(err, pool.ErrExhausted) || !errors.Is(err, context.DeadlineExceeded) {
		t.Fatalf("Get of an exhausted pool = %v, want ErrExhausted and the caller's deadline", err)
	}
	// Close ends the hung create (its sandbox, half made, is deleted too).
	if err := p.Close(); err != nil {
		t.Fatal(err)
	}
	if n := len(f.calls("create")); n < 2 {
		t.Errorf("%d creates, want the hung refill too", n)
	}
}

// TestCancel: cancelling the context given to New closes the pool: every sandbox is deleted,
// ready or handed out, a Get under way returns, and later ones fail with ErrClosed.
func TestCancel(t *testing.T) {
	f := newFake(t)
	ctx, cancel := context.WithCancel(ctxFor(t))
	p, err := pool.New(ctx, f.options(t, 2))
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
	f.fault(t, "hang-create", true)
	p.Get(ctx)
	p.Get(ctx) // now empty: the refill hangs in a create
	waitFor(t, "the hung create", func() bool { return len(f.calls("create")) == 4 })
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
	if err := p.Close(); err != nil { // the close the cancel began; it has finished
		t.Fatal(err)
	}
	if live := f.live(); len(live) != 0 {
		t.Errorf("after the cancel: %v live", live)
	}
	if n := len(f.calls("delete")); n != 4 {
		t.Errorf("%d deletes, want one per sandbox created (4 and the hung one)", n)
	}
}

// TestDeadReplaced: a ready sandbox whose process was killed is never handed out: Get skips
// it, the pool deletes it and creates another.
func TestDeadReplaced(t *testing.T) {
	f := newFake(t)
	ctx := ctxFor(t)
	p, err := pool.New(ctx, f.options(t, 2))
	if err != nil {
		t.Fatal(err)
	}
	defer p.Close()
	if err := p.Wait(ctx); err != nil {
		t.Fatal(err)
	}
	live := f.live()
	victim := f.calls("create")[0] // the first made is the first handed out
	victimID := strings.Fields(victim)[len(strings.Fields(victim))-1]
	pid := f.pid(victimID)
	if len(live) != 2 || pid <= 0 {
		t.Fatalf("live %v, victim %s pid %d", live, victimID, pid)
	}
	if err := syscall.Kill(pid, syscall.SIGKILL); err != nil {
		t.Fatal(err)
	}
	// The process is gone once it is reaped; the fake's shell does not reap it, init does:
	// wait until /proc no longer shows it running.
	waitFor(t, "the killed process to die", func() bool {
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
	if err := sb.Restore(ctx, "/images/set", nil); err != nil {
		t.Fatal(err)
	}
	if err := p.Wait(ctx); err != nil {
		t.Fatal(err)
	}
	if s := p.Stats(); s.Dead != 1 || s.Created != 4 {
		t.Errorf("stats %+v, want 1 dead and 4 created (2, the replacement of the dead one and of the one handed out)", s)
	}
	if slices.Contains(f.live(), victimID) {
		t.Errorf("the dead sandbox %s was not deleted", victimID)
	}
}

// TestRestoreBounded: a restore into a pooled sandbox that never returns is ended by
// Options.RestoreTimeout even under a context without a deadline, with an error that says so.
func TestRestoreBounded(t *testing.T) {
	f := newFake(t)
	ctx := ctxFor(t)
	o := f.options(t, 1)
	o.RestoreTimeout = 100 * time.Millisecond
	_, sb := openAndGet(t, ctx, o)
	f.fault(t, "hang-restore", true)
	done := make(chan error, 1)
	go func() { done <- sb.Restore(context.Background(), t.TempDir(), nil) }()
	select {
	case err := <-done:
		if err == nil || !strings.Contains(err.Error(), "RestoreTimeout") {
			t.Errorf("a hung restore = %v, want the RestoreTimeout error", err)
		}
	case <-time.After(time.Minute):
		t.Fatal("a hung restore under context.Background() did not return within a minute")
	}
}

// TestTakenIDNotDeleted: a create under a name another sandbox holds in the same runsc root (a
// NewID that repeats itself) fails with a clear error and leaves that sandbox alone: the
// pool's clean-up of a failed create must not `runsc delete --force` a stranger's sandbox.
func TestTakenIDNotDeleted(t *testing.T) {
	f := newFake(t)
	ctx := ctxFor(t)
	o := f.options(t, 1)
	if err := os.MkdirAll(o.Runsc.Root, 0o755); err != nil {
		t.Fatal(err)
	}
	// Another user's sandbox, named as the pool will name its own.
	if err := o.Runsc.Create(ctx, "taken", t.TempDir(), nil); err != nil {
		t.Fatal(err)
	}
	defer o.Runsc.Delete(ctx, "taken", &runsc.DeleteOpts{Force: true})
	o.NewID = func() (string, error) { return "taken", nil }
	o.GetTimeout = 100 * time.Millisecond // no create can succeed
	p, err := pool.New(ctx, o)
	if err != nil {
		t.Fatal(err)
	}
	waitFor(t, "a failed create", func() bool { return p.Stats().Failed > 0 || p.Stats().Created > 0 })
	if _, err := p.Get(ctx); !errors.Is(err, pool.ErrExhausted) || !strings.Contains(err.Error(), "already exists") {
		t.Errorf("Get with every name taken = %v, want ErrExhausted naming the taken name", err)
	}
	if err := p.Close(); err != nil {
		t.Fatal(err)
	}
	if !slices.Contains(f.live(), "taken") {
		t.Error("the pool deleted a sandbox it did not make")
	}
}

// TestRefillOnDelete: with RefillOnDelete a handed-out sandbox's replacement is not created
// while it is held (a bench times Get to the answer with no `runsc create` beside it), and is
// created once it is deleted. Without it the refill starts as Get returns (the default).
func TestRefillOnDelete(t *testing.T) {
	f := newFake(t)
	ctx := ctxFor(t)
	o := f.options(t, 1)
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
	if n := len(f.calls("create")); n != 1 {
		t.Errorf("%d creates while the sandbox is held, want 1", n)
	}
	if err := sb.Delete(ctx); err != nil {
		t.Fatal(err)
	}
	if err := p.Wait(ctx); err != nil {
		t.Errorf("Wait after the Delete = %v, want the refill", err)
	}
	if n := len(f.calls("create")); n != 2 {
		t.Errorf("%d creates after the Delete, want 2", n)
	}
}

// TestImageUserOwnsHostDir: an output of an image with a non-root User gets sandboxes whose
// host directory is that user's, or its executor could not bind the socket there.
func TestImageUserOwnsHostDir(t *testing.T) {
	f := newFake(t)
	o := f.options(t, 1)
	o.Spec = func(hostDir string) (*specs.Spec, error) {
		return &specs.Spec{Process: &specs.Process{User: specs.User{UID: 1234, GID: 2345}},
			Mounts: []specs.Mount{{Destination: "/run/readie", Type: "bind", Source: hostDir}}}, nil
	}
	ctx := ctxFor(t)
	_, sb := openAndGet(t, ctx, o)
	fi, err := os.Stat(sb.HostDir)
	if err != nil {
		t.Fatal(err)
	}
	if st := fi.Sys().(*syscall.Stat_t); st.Uid != 1234 || st.Gid != 2345 {
		t.Errorf("host directory owned by %d:%d, want the image's user 1234:2345", st.Uid, st.Gid)
	}
}

// openAndGet starts a pool of o and takes one sandbox from it; the test's end deletes the
// sandbox, then closes the pool.
func openAndGet(t *testing.T, ctx context.Context, o pool.Options) (*pool.Pool, *pool.Sandbox) {
	t.Helper()
	p, err := pool.New(ctx, o)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { p.Close() })
	sb, err := p.Get(ctx)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { sb.Delete(ctx) })
	return p, sb
}
