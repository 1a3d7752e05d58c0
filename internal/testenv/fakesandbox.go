package testenv

import (
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	specs "github.com/opencontainers/runtime-spec/specs-go"

	"readie.dev/pipeline/pkg/launch"
	"readie.dev/pipeline/pkg/sandbox"
)

// FakeSandboxRunsc is a stand-in for runsc with sandboxes that live, for unit tests of the logic
// around a sandbox's life cycle (pkg/launch's, a pool's; never the only test of a behaviour): `create` starts a stand-in sandbox process (a sleep holding the executor's
// stdout, as a sandbox does), writes its pid to --pid-file and records it, with its bundle,
// under state/; `state` prints it; `restore` and `start` fail for a sandbox that is not there;
// `delete` kills the process and forgets it. Every command is logged as it begins ("begin
// ARGS") and a create also as it ends ("created ID"). Files in the fake's directory induce
// faults: hold-create makes a create wait until the file is removed (at most a minute),
// hang-restore makes every restore block until it is killed, fail-create makes every create
// fail.
type FakeSandboxRunsc struct{ dir, Path string }

// NewFakeSandboxRunsc writes the stand-in; the test fails if a sandbox is left when it ends.
func NewFakeSandboxRunsc(t testing.TB) *FakeSandboxRunsc {
	t.Helper()
	f := &FakeSandboxRunsc{dir: t.TempDir()}
	f.Path = filepath.Join(f.dir, "runsc")
	script := `#!/bin/sh
dir="` + f.dir + `"
echo "begin $*" >> "$dir/calls.log"
for last; do :; done
cmd= pidfile= bundle=
for a in "$@"; do
  case "$a" in
    --pid-file=*) pidfile="${a#--pid-file=}" ;;
    --bundle=*) bundle="${a#--bundle=}" ;;
    create|restore|start|delete|state|kill|list) [ -z "$cmd" ] && cmd=$a ;;
  esac
done
state="$dir/state/$last"
case "$cmd" in
  create)
    n=0
    while [ -e "$dir/hold-create" ] && [ $n -lt 1200 ]; do sleep 0.05; n=$((n+1)); done
    [ -e "$dir/fail-create" ] && { echo '{"msg":"creating container: no space left on device"}' >&3; exit 1; }
    [ -e "$state" ] && { echo '{"msg":"container with id '"$last"' already exists"}' >&3; exit 1; }
    mkdir -p "$dir/state"
    sleep 3600 </dev/null 2>&1 &
    echo "$! $bundle" > "$state"
    [ -n "$pidfile" ] && echo $! > "$pidfile"
    echo "created $last" >> "$dir/calls.log"
    exit 0 ;;
  restore|start)
    [ "$cmd" = restore ] && [ -e "$dir/hang-restore" ] && exec sleep 3600
    [ -e "$state" ] || { echo '{"msg":"container is not running"}' >&3; exit 1; }
    exit 0 ;;
  state)
    [ -e "$state" ] || { echo '{"msg":"container does not exist"}' >&3; exit 1; }
    read pid b < "$state"
    printf '{"id":"%s","status":"created","pid":%s,"bundle":"%s"}\n' "$last" "$pid" "$b"
    exit 0 ;;
  delete)
    [ -e "$state" ] && { read pid b < "$state"; kill -9 "$pid" 2>/dev/null; rm -f "$state"; }
    exit 0 ;;
esac
exit 0
`
	if err := os.WriteFile(f.Path, []byte(script), 0o755); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		// A sandbox left behind is a failure; its stand-in is killed either way.
		for _, id := range f.Live() {
			t.Errorf("sandbox %s left behind", id)
			if pid := f.Pid(id); pid > 0 {
				syscall.Kill(pid, syscall.SIGKILL)
			}
		}
	})
	return f
}

// Live lists the sandboxes created and not deleted.
func (f *FakeSandboxRunsc) Live() []string {
	entries, _ := os.ReadDir(filepath.Join(f.dir, "state"))
	var ids []string
	for _, e := range entries {
		ids = append(ids, e.Name())
	}
	return ids
}

// Pid returns the pid of the stand-in process of sandbox id (0 when there is none).
func (f *FakeSandboxRunsc) Pid(id string) int {
	data, _ := os.ReadFile(filepath.Join(f.dir, "state", id))
	pid, _ := strconv.Atoi(strings.Fields(string(data) + " 0")[0])
	return pid
}

// Fault turns an induced fault on or off.
func (f *FakeSandboxRunsc) Fault(t testing.TB, name string, on bool) {
	t.Helper()
	path := filepath.Join(f.dir, name)
	if on {
		if err := os.WriteFile(path, nil, 0o644); err != nil {
			t.Fatal(err)
		}
	} else if err := os.Remove(path); err != nil {
		t.Fatal(err)
	}
}

// Calls returns the lines of the stand-in's log that hold word as a field.
func (f *FakeSandboxRunsc) Calls(word string) []string {
	data, _ := os.ReadFile(filepath.Join(f.dir, "calls.log"))
	var out []string
	for _, line := range strings.Split(strings.TrimSpace(string(data)), "\n") {
		if slices.Contains(strings.Fields(line), word) {
			out = append(out, line)
		}
	}
	return out
}

// Runtime is a runtime of the stand-in, with a lease of the test's.
func (f *FakeSandboxRunsc) Runtime(t testing.TB) *launch.Runtime {
	return &launch.Runtime{Path: f.Path, Root: filepath.Join(f.dir, "root"), Flags: sandbox.DefaultFlags(), Lease: Lease(t)}
}

// Options are launch.SandboxOptions on the stand-in, in a private work directory, whose spec
// runs as user.
func (f *FakeSandboxRunsc) Options(t testing.TB, user specs.User) launch.SandboxOptions {
	return launch.SandboxOptions{
		Runtime: f.Runtime(t), WorkDir: WorkDir(t),
		Spec: func(hostDir string) (*specs.Spec, error) {
			return &specs.Spec{Process: &specs.Process{User: user},
				Mounts: []specs.Mount{{Destination: sandbox.ExecutorDir, Type: "bind", Source: hostDir}}}, nil
		},
	}
}

// WaitFor waits until cond holds, at most a minute, polling: for a state outside the test's
// process that it cannot be told of.
func WaitFor(t testing.TB, what string, cond func() bool) {
	t.Helper()
	for deadline := time.Now().Add(time.Minute); !cond(); time.Sleep(10 * time.Millisecond) {
		if time.Now().After(deadline) {
			t.Fatalf("%s: not within a minute", what)
		}
	}
}

// SameID is an IDs policy that gives one name, whatever it is asked: one that repeats itself.
type SameID string

// NewID returns the one name.
func (f SameID) NewID(string, string) (string, error) { return string(f), nil }
