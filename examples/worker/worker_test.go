package main

import (
	"bufio"
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"io/fs"
	"math/rand/v2"
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

	"readie.dev/pipeline/internal/testenv"
	"readie.dev/pipeline/pkg/exitcode"
)

// build compiles a main package of this module into dir.
func build(t *testing.T, dir, pkg string) string {
	t.Helper()
	bin := filepath.Join(dir, filepath.Base(pkg))
	cmd := testenv.Command(t, 5*time.Minute, "go", "build", "-o", bin, pkg)
	cmd.Dir = "../.."
	if out, err := cmd.CombinedOutput(); err != nil {
		t.Fatalf("go build %s: %v\n%s", pkg, err, out)
	}
	return bin
}

// captureSmall captures the set "small" with the pipeline binary into dir/out, on the test's
// runsc and rootfs, and returns the output and the config.
func captureSmall(t *testing.T, pipeline, dir string) (out, config string) {
	t.Helper()
	runscPath := testenv.RunscPath(t)
	out = filepath.Join(dir, "out")
	config = filepath.Join(dir, "pipeline.yaml")
	os.WriteFile(config, []byte(fmt.Sprintf(`runsc:
  path: %s
  root: %s
rootfs: %s
output: %s
checkpoint_cache: %s
restore_runs: 1
checkpoints:
  - id: small
    imports: [json, email.parser]
`, runscPath, privateRoot(t, runscPath, filepath.Join(dir, "pipeline")), testenv.Rootfs(t), out, filepath.Join(dir, "store"))), 0o644)
	capture := testenv.Command(t, 5*time.Minute, pipeline, "capture", "--config", config)
	if output, err := capture.CombinedOutput(); err != nil {
		t.Fatalf("pipeline capture: %v\n%s", err, output)
	}
	return out, config
}

// privateRoot is a runsc root that must hold no sandbox when the test ends: none in runsc
// list, no runsc process naming it.
func privateRoot(t *testing.T, runscPath, dir string) string {
	t.Helper()
	root := filepath.Join(dir, "root")
	t.Cleanup(func() {
		testenv.CheckNoRunsc(t, runscPath, root, "")
		if err := testenv.RemoveRunscRoot(root); err != nil {
			t.Error(err)
		}
	})
	return root
}

// TestWorker builds the example worker and the pipeline, captures a small output with the
// pipeline, and has the worker restore a checkpoint of it into a pre-created sandbox and call
// it; then stops a worker with SIGTERM in the middle of a call, which still deletes its
// sandbox. The worker imports pkg/ only.
func TestWorker(t *testing.T) {
	runscPath := testenv.RunscPath(t)
	imports, err := testenv.Command(t, time.Minute, "go", "list", "-f", `{{join .Imports " "}}`, ".").Output()
	if err != nil {
		t.Fatal(err)
	}
	for _, path := range strings.Fields(string(imports)) {
		if first, _, _ := strings.Cut(path, "/"); strings.Contains(first, ".") && !strings.HasPrefix(path, "readie.dev/pipeline/pkg/") {
			t.Errorf("the example worker imports %s: a worker's kit is pkg/ and the standard library", path)
		}
	}
	bins := t.TempDir()
	pipeline, worker := build(t, bins, "./cmd/pipeline"), build(t, bins, "./examples/worker")

	dir := testenv.WorkDir(t)
	out, _ := captureSmall(t, pipeline, dir)

	root := privateRoot(t, runscPath, filepath.Join(dir, "worker"))
	// The same calls with a sandbox created per call and from a pool of sandboxes created
	// ahead: each call's start (create or Get, restore, dial, answer) is printed; the test
	// logs them side by side and never judges how long they took.
	// With sandboxes restored ahead (-warm 1), the first call takes the one the worker
	// restored before it served; the next ones take its replacement if the refill is done,
	// else restore into the pool's sandbox: never anything else.
	for _, pool := range []string{"0", "2", "warm"} {
		var stdout, stderr bytes.Buffer
		args := []string{"-out", out, "-runsc", runscPath, "-root", root, "-set", "small", "-eval", "sum(range(10))", "-pool", pool, "-calls", "3"}
		if pool == "warm" {
			args[len(args)-3] = "1"
			args = append(args, "-warm", "1")
		}
		cmd := testenv.Command(t, 2*time.Minute, worker, args...)
		cmd.Stdout, cmd.Stderr = &stdout, &stderr
		if err := cmd.Run(); err != nil {
			t.Fatalf("worker -pool %s: %v\nstdout:\n%s\nstderr:\n%s", pool, err, &stdout, &stderr)
		}
		how := map[string][]string{"0": {"created on demand"}, "2": {"from a pool of 2"}, "warm": {"restored ahead", "from a pool of 1"}}[pool]
		for i := 1; i <= 3; i++ {
			said := func(how string) bool {
				return strings.Contains(stdout.String(), fmt.Sprintf("(call %d of 3, %s): its modules were imported and it sees the restore-time environment", i, how))
			}
			if !slices.ContainsFunc(how, said) || i == 1 && !said(how[0]) {
				t.Errorf("the worker (-pool %s) did not say call %d was %q:\n%s", pool, i, how, &stdout)
			}
		}
		if !strings.Contains(stdout.String(), "worker: small restored in") || strings.Count(stdout.String(), "worker: = 45") != 3 {
			t.Errorf("the worker (-pool %s) did not answer every call:\n%s", pool, &stdout)
		}
		t.Logf("worker -pool %s:\n%s", pool, &stdout)
	}

	// A checkpoint the output does not have, a binary that is no runsc, and a runsc of another
	// version (the host check): refused, naming them, with nothing restored.
	otherRunsc := filepath.Join(t.TempDir(), "runsc")
	os.WriteFile(otherRunsc, []byte("#!/bin/sh\ncase \"$1\" in --version) echo 'runsc version other';; cpu-features) echo fpu,sse2;; esac\n"), 0o755)
	// A manifest whose flags would reach runsc as root: a debug log written on the host,
	// restore flags runsc would take as a path. The tampered output is a whole copy of the
	// good one (its files linked) with only manifest.json edited, so that everything else
	// passes: without the kit's refusal these flags would reach runsc (runsc --version and
	// cpu-features for the host check, runsc restore) and "owned" would be written.
	tampered := t.TempDir()
	for _, edit := range []struct{ field, value string }{{"runsc_flags", `"--debug-log=` + tampered + `/owned"`}, {"restore_flags", `"-pid-file=` + tampered + `/owned"`}} {
		dir := filepath.Join(tampered, edit.field)
		linkOutput(t, out, dir)
		data, err := os.ReadFile(filepath.Join(out, "manifest.json"))
		if err != nil {
			t.Fatal(err)
		}
		var m map[string]json.RawMessage
		if err := json.Unmarshal(data, &m); err != nil {
			t.Fatal(err)
		}
		var list []string
		json.Unmarshal(m[edit.field], &list)
		m[edit.field], _ = json.Marshal(append(list, strings.Trim(edit.value, `"`)))
		data, _ = json.Marshal(m)
		if err := os.WriteFile(filepath.Join(dir, "manifest.json"), data, 0o644); err != nil {
			t.Fatal(err)
		}
		cmd := testenv.Command(t, 2*time.Minute, worker, "-out", dir, "-runsc", runscPath, "-root", root, "-set", "small")
		output, err := cmd.CombinedOutput()
		if code, _ := exitcode.Of(err); code != exitcode.Usage || !strings.Contains(string(output), "the manifest's "+edit.field) {
			t.Errorf("worker with a tampered %s = %v\n%s\nwant exit 2 naming it", edit.field, err, output)
		}
		if _, err := os.Stat(filepath.Join(tampered, "owned")); err == nil {
			t.Errorf("a tampered %s wrote on the host", edit.field)
		}
	}

	for _, tc := range []struct {
		args []string
		code int
		want string
	}{
		{[]string{"-set", "nosuch"}, 2, `has no checkpoint "nosuch"`},
		{[]string{"-rootfs", "/"}, 2, "rootfs / is not one the pipeline built"},
		{[]string{"-runsc", "/bin/true"}, 1, "/bin/true --version printed"},
		{[]string{"-runsc", otherRunsc}, 1, `does not restore on this host: runsc version "other"`},
		{[]string{"-memory", "1MiB"}, 2, "memory 1MiB: want 0 (none) or at least 32MiB"},
		{[]string{"-memory", "512MB"}, 2, `"512MB" is not a size`},
		{[]string{"-pids", "-1"}, 2, "pids -1"},
		{[]string{"-fallback", "warm"}, 2, `-fallback "warm": want none or cold`},
	} {
		args := append([]string{"-out", out, "-runsc", runscPath, "-root", root}, tc.args...)
		cmd := testenv.Command(t, 2*time.Minute, worker, args...)
		output, err := cmd.CombinedOutput()
		if code, _ := exitcode.Of(err); code != tc.code || !strings.Contains(string(output), tc.want) {
			t.Errorf("worker %v = %v\n%s\nwant exit %d saying %q", tc.args, err, output, tc.code, tc.want)
		}
	}

	// A call past the worker's memory limit fails naming it, and the next call is served (and
	// fails the same way): two restores, two errors, nothing left.
	limited := testenv.Command(t, 2*time.Minute, worker, "-out", out, "-runsc", runscPath, "-root", root, "-set", "small", "-memory", "100MiB", "-eval", `len(b"x" * (300 << 20))`, "-calls", "2")
	output, err := limited.CombinedOutput()
	if code, _ := exitcode.Of(err); code != exitcode.Failed || strings.Count(string(output), "worker: small restored in") != 2 ||
		strings.Count(string(output), "went past its memory limit of 100MiB") < 2 || !strings.Contains(string(output), "call 2 of 2 failed") {
		t.Errorf("worker -memory 100MiB filling 300 MB, twice = %v\n%s\nwant exit 1, both calls served and failed naming the limit", err, output)
	}
	testenv.CheckNoRunsc(t, runscPath, root, "")

	// An output whose checkpoint's pages.img was cut short: refused as it is (its digest), and
	// served by a cold start of its set with -fallback cold, which says why and what it cost.
	damaged := filepath.Join(t.TempDir(), "out")
	if err := testenv.CopyTree(out, damaged); err != nil {
		t.Fatal(err)
	}
	pages, _ := filepath.Glob(filepath.Join(damaged, "small", "pages.img"))
	if len(pages) != 1 {
		t.Fatalf("the output's pages.img of small: %v", pages)
	}
	if err := os.Truncate(pages[0], 4096); err != nil {
		t.Fatal(err)
	}
	output, err = testenv.Command(t, 2*time.Minute, worker, "-out", damaged, "-runsc", runscPath, "-root", root, "-set", "small").CombinedOutput()
	if code, _ := exitcode.Of(err); code != exitcode.Usage || !strings.Contains(string(output), "pages.img") {
		t.Errorf("worker on a checkpoint cut short = %v\n%s\nwant exit 2 naming pages.img", err, output)
	}
	output, err = testenv.Command(t, 2*time.Minute, worker, "-out", damaged, "-runsc", runscPath, "-root", root, "-set", "small", "-fallback", "cold", "-eval", "sum(range(10))").CombinedOutput()
	if err != nil || !strings.Contains(string(output), "worker: small started cold in") || !strings.Contains(string(output), "not its checkpoint: checkpoint small: verify failed") ||
		!strings.Contains(string(output), "pages.img") || !strings.Contains(string(output), "worker: = 45") {
		t.Errorf("worker -fallback cold on a checkpoint cut short = %v\n%s\nwant a cold start naming the cause, answering", err, output)
	}
	t.Logf("worker -fallback cold:\n%s", output)
	testenv.CheckNoRunsc(t, runscPath, root, "")

	// SIGTERM while the executor runs a call that never returns, without a pool and with one
	// (its other sandboxes wait, created): the worker deletes every sandbox (privateRoot
	// checks) and exits 128+15. It is signalled only once it has said that it is calling, so
	// the signal certainly arrives during the call.
	for _, pool := range []string{"0", "2"} {
		blocked := testenv.Command(t, 5*time.Minute, worker, "-out", out, "-runsc", runscPath, "-root", root, "-set", "small", "-pool", pool, "-eval", `__import__("time").sleep(3600)`)
		pipe, err := blocked.StdoutPipe()
		if err != nil {
			t.Fatal(err)
		}
		var blockedErr bytes.Buffer
		blocked.Stderr = &blockedErr
		if err := blocked.Start(); err != nil {
			t.Fatal(err)
		}
		lines := bufio.NewScanner(pipe)
		calling := false
		for !calling && lines.Scan() {
			calling = strings.HasPrefix(lines.Text(), "worker: eval ")
		}
		if !calling {
			blocked.Process.Kill()
			blocked.Wait()
			t.Fatalf("the worker (-pool %s) never started its call:\n%s", pool, &blockedErr)
		}
		// The call is under way; signal now.
		if err := blocked.Process.Signal(syscall.SIGTERM); err != nil {
			t.Fatal(err)
		}
		done := make(chan error, 1)
		go func() { done <- blocked.Wait() }()
		select {
		case err = <-done:
		case <-time.After(2 * time.Minute):
			blocked.Process.Kill()
			t.Fatalf("the worker (-pool %s) did not stop after SIGTERM:\n%s", pool, &blockedErr)
		}
		if code, _ := exitcode.Of(err); code != exitcode.ForSignal(syscall.SIGTERM) || !strings.Contains(blockedErr.String(), "was deleted") {
			t.Fatalf("worker -pool %s stopped by SIGTERM = %v\n%s", pool, err, &blockedErr)
		}
		testenv.CheckNoRunsc(t, runscPath, root, "")
	}

	t.Run("sigterm-loop", func(t *testing.T) { sigtermLoop(t, worker, out, runscPath, dir) })
}

// sigtermRounds is how many times sigtermLoop stops the worker.
const sigtermRounds = 20

// sigtermLoop stops the example worker with SIGTERM at random moments (a seeded random delay;
// the seed is logged, and READIE_SIGTERM_SEED repeats a run): every other round after it says
// it fills its pool (its first `runsc create` under way or about to be), the others after its
// first answer (its second call under way, its pool refilling). Whenever the signal lands,
// even after the worker is done, it leaves nothing: no sandbox in runsc list, no runsc process
// of its root (by process), no entry in its runsc root or in its TMPDIR. A pool of one and two
// short calls bound each round.
func sigtermLoop(t *testing.T, worker, out, runscPath, dir string) {
	seed := time.Now().UnixNano()
	if s := os.Getenv("READIE_SIGTERM_SEED"); s != "" {
		var err error
		if seed, err = strconv.ParseInt(s, 10, 64); err != nil {
			t.Fatalf("READIE_SIGTERM_SEED=%q: %v", s, err)
		}
	}
	t.Logf("seed %d (READIE_SIGTERM_SEED=%d repeats these moments)", seed, seed)
	rng := rand.New(rand.NewPCG(uint64(seed), 35))
	root := privateRoot(t, runscPath, filepath.Join(dir, "loop"))
	tmp := filepath.Join(dir, "loop-tmp")
	if err := os.Mkdir(tmp, 0o700); err != nil {
		t.Fatal(err)
	}
	began := time.Now()
	stopped := 0
	for round := range sigtermRounds {
		moment, after := "after it said it fills its pool", "worker: filling a pool of 1"
		if round%2 == 1 {
			moment, after = "after its first answer", "worker: small restored in"
		}
		delay := time.Duration(rng.Int64N(int64(time.Second)))
		cmd := testenv.Command(t, 2*time.Minute, worker, "-out", out, "-runsc", runscPath, "-root", root, "-set", "small", "-pool", "1", "-calls", "2")
		cmd.Env = append(os.Environ(), "TMPDIR="+tmp)
		stdout, stderr := &lineWatch{want: after}, &lineWatch{want: after}
		stdout.init()
		stderr.init()
		cmd.Stdout, cmd.Stderr = stdout, stderr
		if err := cmd.Start(); err != nil {
			t.Fatal(err)
		}
		exited := make(chan error, 1)
		go func() { exited <- cmd.Wait() }()
		var err error
		select {
		case <-stdout.seen:
		case <-stderr.seen:
		case err = <-exited: // done, or failed, before it got there
			exited <- err
		}
		time.Sleep(delay)
		signalErr := cmd.Process.Signal(syscall.SIGTERM)
		err = <-exited
		code := exitCode(err)
		switch {
		case code == exitcode.ForSignal(syscall.SIGTERM):
			stopped++
		case code == exitcode.OK && (signalErr != nil || strings.Count(stdout.String(), "worker: small restored in") == 2):
			// done before the signal landed
		default:
			t.Errorf("round %d, SIGTERM %s %s: exit %v\nstdout:\n%s\nstderr:\n%s", round, delay.Round(time.Millisecond), moment, err, stdout, stderr)
		}
		t.Logf("round %d: SIGTERM %s %s: exit %d", round, delay.Round(time.Millisecond), moment, code)
		testenv.CheckNoRunsc(t, runscPath, root, "")
		testenv.CheckEmptyDir(t, root, "null-netns") // runsc's, mounted once per root (RemoveRunscRoot)
		testenv.CheckEmptyDir(t, tmp)
		if t.Failed() {
			t.Fatalf("round %d left something (seed %d)\nstderr:\n%s", round, seed, stderr)
		}
	}
	t.Logf("%d rounds (%d stopped by the signal, the others done before it) in %s", sigtermRounds, stopped, time.Since(began).Round(time.Millisecond))
}

// lineWatch keeps what a process writes and closes seen once a line begins with want.
type lineWatch struct {
	want string
	seen chan struct{}
	mu   sync.Mutex
	buf  bytes.Buffer
	done bool
}

func (w *lineWatch) init() { w.seen = make(chan struct{}) }

func (w *lineWatch) Write(p []byte) (int, error) {
	w.mu.Lock()
	defer w.mu.Unlock()
	w.buf.Write(p)
	if !w.done && (strings.HasPrefix(w.buf.String(), w.want) || strings.Contains(w.buf.String(), "\n"+w.want)) {
		w.done = true
		close(w.seen)
	}
	return len(p), nil
}

func (w *lineWatch) String() string {
	w.mu.Lock()
	defer w.mu.Unlock()
	return w.buf.String()
}

// linkOutput makes dst a copy of the output src, every file hard-linked but manifest.json
// (left out, for the caller to write).
func linkOutput(t *testing.T, src, dst string) {
	t.Helper()
	err := filepath.WalkDir(src, func(path string, d fs.DirEntry, err error) error {
		if err != nil {
			return err
		}
		rel, _ := filepath.Rel(src, path)
		switch {
		case d.IsDir():
			return os.MkdirAll(filepath.Join(dst, rel), 0o755)
		case rel == "manifest.json" || !d.Type().IsRegular():
			return nil
		}
		return os.Link(path, filepath.Join(dst, rel))
	})
	if err != nil {
		t.Fatal(err)
	}
}

// exitCode is the worker's exit code, 128+N when signal N killed it before its handler was in
// place.
func exitCode(err error) int {
	var exited *exec.ExitError
	switch {
	case err == nil:
		return exitcode.OK
	case !errors.As(err, &exited):
		return -1
	}
	if status, ok := exited.Sys().(syscall.WaitStatus); ok && status.Signaled() {
		return exitcode.ForSignal(status.Signal())
	}
	return exited.ExitCode()
}
