package main

import (
	"bufio"
	"bytes"
	"context"
	"fmt"
	"io"
	"os"
	"os/exec"
	"os/signal"
	"path/filepath"
	"runtime"
	"slices"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"readie.dev/pipeline/internal/orphans"
	"readie.dev/pipeline/internal/testenv"
	"readie.dev/pipeline/pkg/checkpointid"
	"readie.dev/pipeline/pkg/exitcode"
	"readie.dev/pipeline/pkg/launch"
	"readie.dev/pipeline/pkg/manifest"
	"readie.dev/pipeline/pkg/sandbox"
)

// TestMain lets a test run this binary as the pipeline in a process of its own, for signals
// and concurrent runs.
func TestMain(m *testing.M) {
	if os.Getenv("READIE_TEST_AS_PIPELINE") == "1" {
		signals := make(chan os.Signal, 1)
		signal.Notify(signals, syscall.SIGINT, syscall.SIGTERM)
		os.Exit(dispatch(os.Args[1:], os.Stdout, os.Stderr, signals))
	}
	os.Exit(m.Run())
}

// faultEnv is an output directory that already holds a good capture of the empty set, so
// every fault test can check that a failed run leaves it valid.
type faultEnv struct {
	dir, root, out string
	rootfs, runsc  string
	// tmp is the TMPDIR of the runs the test starts in processes of their own (env), and of
	// its in-process runs after useTmp.
	tmp string
}

func newFaultEnv(t *testing.T) *faultEnv {
	t.Helper()
	dir := testenv.WorkDir(t)
	// A temporary directory of the test's own: the runs of other tests (other packages and
	// parallel tests run at the same time) sweep the shared one's scratch directories of runs
	// that died, which the tests of killed runs look for.
	e := &faultEnv{dir: dir, root: filepath.Join(dir, "root"), out: filepath.Join(dir, "out"), rootfs: testenv.Rootfs(t), runsc: testenv.RunscPath(t), tmp: filepath.Join(dir, "t")}
	if err := os.Mkdir(e.tmp, 0o700); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		e.checkNoSandboxes(t)
		if err := testenv.RemoveRunscRoot(e.root); err != nil {
			t.Error(err)
		}
	})
	return e
}

// useTmp makes e.tmp the TMPDIR of this process for the rest of the test, for a test whose
// in-process runs must see the scratch directories of the runs it started (t.Setenv: the
// test cannot run in parallel).
func (e *faultEnv) useTmp(t *testing.T) {
	t.Setenv("TMPDIR", e.tmp)
}

// env returns extra and TMPDIR=e.tmp: the environment of a run in a process of its own.
func (e *faultEnv) env(extra map[string]string) map[string]string {
	env := map[string]string{"TMPDIR": e.tmp}
	for k, v := range extra {
		env[k] = v
	}
	return env
}

// config writes a config for this environment; sets defaults to pandas.
func (e *faultEnv) config(t *testing.T, sets, extra string) string {
	t.Helper()
	path := testConfig{runsc: e.runsc, root: e.root, rootfs: e.rootfs, output: e.out, sets: sets}.write(t)
	if extra != "" {
		data, _ := os.ReadFile(path)
		data = []byte(strings.Replace(string(data), "checkpoints:\n", extra+"\ncheckpoints:\n", 1))
		os.WriteFile(path, data, 0o644)
	}
	return path
}

// blockingConfig is a config whose one set never finishes importing (testenv.BlockingModule):
// a capture of it is in progress whenever the test interrupts it, on any machine. The caller
// must put PYTHONPATH into the pipeline's environment (blockingEnv).
func (e *faultEnv) blockingConfig(t *testing.T) string {
	t.Helper()
	return e.config(t, "  - id: block\n    imports: [json, "+testenv.BlockingModule+"]\n", "pass_env: [PYTHONPATH]")
}

// blockingEnv is the environment that puts the blocking module on the executor's path.
var blockingEnv = map[string]string{"PYTHONPATH": testenv.TestingPythonPath}

func (e *faultEnv) runtime() *launch.Runtime {
	return &launch.Runtime{Path: e.runsc, Root: e.root, Flags: sandbox.DefaultFlags()}
}

// waitForBlockedCapture waits until the blocking set's capture sandbox runs and its executor
// is blocked in the import.
func (e *faultEnv) waitForBlockedCapture(t *testing.T) string {
	t.Helper()
	id := testenv.WaitForSandbox(t, e.runtime(), "-block-capture-", 2*time.Minute)
	testenv.WaitForBlocked(t, e.tmp, id, 2*time.Minute)
	return id
}

func (e *faultEnv) checkNoSandboxes(t *testing.T) {
	t.Helper()
	testenv.CheckNoRunsc(t, e.runsc, e.root, "")
}

// goodOutput captures a small set so later runs have something to keep intact.
func (e *faultEnv) goodOutput(t *testing.T) string {
	t.Helper()
	cfg := e.config(t, "  - id: small\n    imports: [json]\n", "")
	if code, _, stderr := runCLI(t, "capture", "--config", cfg); code != exitOK {
		t.Fatalf("capture of the good output: exit %d\n%s", code, stderr)
	}
	return cfg
}

func (e *faultEnv) checkOutputVerifies(t *testing.T, cfg string) {
	t.Helper()
	if code, stdout, stderr := runCLI(t, "verify", "--config", cfg); code != exitOK {
		t.Fatalf("the previous output no longer verifies: exit %d\n%s%s", code, stdout, stderr)
	}
}

// TestLongTmpdirIsRefused: under a TMPDIR so long that an executor's socket path would not
// fit in a Unix socket address, a capture fails naming the path and the limit. It once started
// the sandbox, whose socket never appeared on the host, and timed out dialling (a minute in a
// measure; the whole capture limit here, over the test's own limit below).
func TestLongTmpdirIsRefused(t *testing.T) {
	t.Parallel()
	dir := testenv.WorkDir(t)
	tmp := filepath.Join(dir, strings.Repeat("t", max(100-len(dir), 1)))
	if err := os.Mkdir(tmp, 0o700); err != nil {
		t.Fatal(err)
	}
	cfg := testConfig{runsc: testenv.RunscPath(t), root: runscRoot(t, dir), rootfs: testenv.Rootfs(t), output: filepath.Join(dir, "out"),
		sets: "  - id: js\n    imports: [json]\n"}.write(t)
	code, _, stderr := runProcess(t, map[string]string{"TMPDIR": tmp}, 2*time.Minute, "capture", "--config", cfg)
	if code == exitOK || !strings.Contains(stderr, "executor.sock has ") || !strings.Contains(stderr, "a Unix socket address holds 107") {
		t.Fatalf("capture under a TMPDIR of %d bytes: exit %d, want a failure naming the socket path and its limit\n%s", len(tmp), code, stderr)
	}
}

func TestFaultImportFails(t *testing.T) {
	t.Parallel()
	e := newFaultEnv(t)
	good := e.goodOutput(t)
	cfg := e.config(t, "  - id: broken\n    imports: [json, not_a_module_readie]\n", "")
	code, _, stderr := runCLI(t, "capture", "--config", cfg, "--clean-failed")
	if code != exitFailed || !strings.Contains(stderr, "not_a_module_readie") || !strings.Contains(stderr, "broken") {
		t.Fatalf("exit %d\n%s", code, stderr)
	}
	if !strings.Contains(stderr, "the executor exited with status 3 (an import of the package set failed)") {
		t.Errorf("the error does not say what the executor's exit status means:\n%s", stderr)
	}
	for _, pattern := range []string{".staging-*", ".failed-*"} {
		if matches, _ := filepath.Glob(e.out + pattern); len(matches) != 0 {
			t.Errorf("--clean-failed left %v", matches)
		}
	}
	e.checkOutputVerifies(t, good)
}

// TestFailedRunKeepsItsFiles: without --clean-failed, the directory the failed run names holds
// the failed set's logs and files, and the next run leaves it alone. The set's id is as long
// as the id rule allows: its sandboxes' IDs carry a shortened form of it, and its logs are
// still found and kept.
func TestFailedRunKeepsItsFiles(t *testing.T) {
	t.Parallel()
	e := newFaultEnv(t)
	good := e.goodOutput(t)
	broken := "broken_" + strings.Repeat("x", checkpointid.MaxLen-len("broken_"))
	cfg := e.config(t, "  - id: "+broken+"\n    imports: [json, not_a_module_readie]\n", "")
	code, _, stderr := runCLI(t, "capture", "--config", cfg)
	_, kept, found := strings.Cut(stderr, "staging directory kept for inspection: ")
	kept, _, _ = strings.Cut(kept, ")")
	if code != exitFailed || !found || !strings.Contains(stderr, broken) {
		t.Fatalf("exit %d, no kept directory or failed set named\n%s", code, stderr)
	}
	logs, _ := filepath.Glob(filepath.Join(kept, broken, "logs", "readie-broken_*-capture-*-stderr.log"))
	if len(logs) != 1 {
		all, _ := filepath.Glob(filepath.Join(kept, "*", "*"))
		t.Fatalf("the kept directory %s holds no log of the failed capture: %v (it holds %v)", kept, logs, all)
	}
	if data, _ := os.ReadFile(logs[0]); !strings.Contains(string(data), "not_a_module_readie") {
		t.Errorf("the kept log does not say what failed:\n%s", data)
	}
	if _, err := os.Stat(filepath.Join(kept, broken, "capture")); err != nil {
		t.Errorf("the failed capture's files are not kept: %v", err)
	}
	code, _, stderr = runCLI(t, "capture", "--config", good)
	if code != exitOK {
		t.Fatalf("the next run: exit %d\n%s", code, stderr)
	}
	if _, err := os.Stat(logs[0]); err != nil || strings.Contains(stderr, kept) {
		t.Errorf("the next run swept the kept directory (%v):\n%s", err, stderr)
	}
}

// TestFaultCaptureTimeout: a capture that cannot finish (its import blocks forever) fails when
// its limit runs out, names the set, the step and the limit, deletes its sandbox and keeps the
// previous output. The limit is generous for the empty set that is captured first, on any
// machine; the blocked set exceeds any limit.
func TestFaultCaptureTimeout(t *testing.T) {
	t.Parallel()
	e := newFaultEnv(t)
	good := e.goodOutput(t)
	cfg := e.blockingConfig(t)
	data, _ := os.ReadFile(cfg)
	os.WriteFile(cfg, []byte(strings.Replace(string(data), "capture: 3m", "capture: 15s", 1)), 0o644)
	p := startPipelineEnv(t, e.env(blockingEnv), "capture", "--config", cfg)
	p.drain()
	code := p.wait(t, 3*time.Minute)
	stderr := p.all.String()
	if code != exitFailed || !strings.Contains(stderr, "capture of block exceeded its timeout of 15s") {
		t.Fatalf("exit %d\n%s", code, stderr)
	}
	// Kept where the message says, under a name that no later run takes for a leftover.
	kept, _ := filepath.Glob(e.out + ".failed-*")
	if len(kept) != 1 || !strings.Contains(stderr, "staging directory kept for inspection: "+kept[0]) {
		t.Fatalf("kept %v; the error does not name it:\n%s", kept, stderr)
	}
	if code, _, stderr := runCLI(t, "smoke", "--config", good, "--only", "small"); code != exitOK {
		t.Fatalf("the next run: exit %d\n%s", code, stderr)
	}
	if _, err := os.Stat(kept[0]); err != nil {
		t.Errorf("the next run removed the kept staging directory: %v", err)
	}
	e.checkOutputVerifies(t, good)
}

func TestFaultCorruptImages(t *testing.T) {
	t.Parallel()
	e := newFaultEnv(t)
	cfg := e.goodOutput(t)
	for _, tc := range []struct{ file string }{{"checkpoint.img"}, {"pages.img"}} {
		path := filepath.Join(e.out, "small", tc.file)
		original, err := os.ReadFile(path)
		if err != nil {
			t.Fatal(err)
		}
		// Cut the file in half: restore must fail, and verify must name the file.
		os.WriteFile(path, original[:len(original)/2], 0o644)
		code, _, stderr := runCLI(t, "measure", "--config", cfg, "--only", "small", "--runs", "1")
		if code != exitFailed {
			t.Errorf("%s: measure of a corrupted image: exit %d\n%s", tc.file, code, stderr)
		}
		code, _, stderr = runCLI(t, "verify", "--config", cfg)
		if code != exitFailed || !strings.Contains(stderr, path) {
			t.Errorf("%s: verify: exit %d\n%s", tc.file, code, stderr)
		}
		os.WriteFile(path, original, 0o644)
	}
	e.checkOutputVerifies(t, cfg)
}

func TestFaultFullFileSystem(t *testing.T) {
	t.Parallel()
	e := newFaultEnv(t)
	small := filepath.Join(e.dir, "small-fs")
	os.MkdirAll(small, 0o755)
	if out, err := testenv.Command(t, time.Minute, "mount", "-t", "tmpfs", "-o", "size=24m", "readie-test", small).CombinedOutput(); err != nil {
		t.Fatalf("mount a small tmpfs: %v\n%s", err, out)
	}
	t.Cleanup(func() { exec.Command("umount", "-l", small).Run() })
	e.out = filepath.Join(small, "out")
	good := e.goodOutput(t)                                                                    // about 8 MiB
	code, _, stderr := runCLI(t, "capture", "--config", e.config(t, "", ""), "--clean-failed") // pandas: about 40 MiB
	if code != exitFailed {
		t.Fatalf("capture on a full file system: exit %d\n%s", code, stderr)
	}
	t.Logf("the failed run said:\n%s", stderr)
	m, err := manifest.Load(filepath.Join(e.out, manifest.FileName))
	if err != nil {
		t.Fatal(err)
	}
	for _, c := range m.Checkpoints {
		if c.ID == "pandas" {
			t.Fatal("the manifest lists the checkpoint that did not fit")
		}
	}
	e.checkOutputVerifies(t, good)
}

// process is this test binary running as the pipeline in a process of its own.
type process struct {
	cmd    *exec.Cmd
	stderr *bufio.Reader // read it only until waitForLine returns, then drain()
	all    bytes.Buffer  // all of stderr; read it only after exited is closed
	stdout bytes.Buffer  // read it only after exited is closed
	exited chan struct{}
}

func startPipeline(t *testing.T, args ...string) *process {
	t.Helper()
	return startPipelineEnv(t, nil, args...)
}

func startPipelineEnv(t *testing.T, env map[string]string, args ...string) *process {
	t.Helper()
	p := &process{exited: make(chan struct{})}
	p.cmd = testenv.Command(t, 10*time.Minute, os.Args[0], args...)
	p.cmd.Env = append(os.Environ(), "READIE_TEST_AS_PIPELINE=1")
	for k, v := range env {
		p.cmd.Env = append(p.cmd.Env, k+"="+v)
	}
	pr, pw := io.Pipe()
	p.stderr = bufio.NewReader(pr)
	p.cmd.Stderr = io.MultiWriter(pw, &p.all)
	p.cmd.Stdout = &p.stdout
	if err := p.cmd.Start(); err != nil {
		t.Fatal(err)
	}
	go func() {
		p.cmd.Wait()
		pw.Close()
		close(p.exited)
	}()
	t.Cleanup(func() {
		p.cmd.Process.Kill()
		<-p.exited
	})
	return p
}

func (p *process) waitForLine(t *testing.T, want string) {
	t.Helper()
	for {
		line, err := p.stderr.ReadString('\n')
		if strings.Contains(line, want) {
			return
		}
		if err != nil {
			t.Fatalf("the pipeline ended before saying %q: %v", want, err)
		}
	}
}

func (p *process) drain() { go io.Copy(io.Discard, p.stderr) }

func (p *process) wait(t *testing.T, limit time.Duration) int {
	t.Helper()
	select {
	case <-p.exited:
		return p.cmd.ProcessState.ExitCode()
	case <-time.After(limit):
		t.Fatalf("the pipeline did not exit within %s", limit)
		return -1
	}
}

func TestFaultSIGINTDuringCapture(t *testing.T) {
	t.Parallel()
	e := newFaultEnv(t)
	good := e.goodOutput(t)
	p := startPipelineEnv(t, e.env(blockingEnv), "capture", "--config", e.blockingConfig(t))
	p.drain()
	e.waitForBlockedCapture(t)
	p.cmd.Process.Signal(syscall.SIGINT)
	if code := p.wait(t, time.Minute); code != exitcode.ForSignal(syscall.SIGINT) {
		t.Fatalf("exit %d after SIGINT, want 130\n%s", code, p.all.String())
	}
	t.Logf("the interrupted run said:\n%s%s", p.all.String(), p.stdout.String())
	e.checkNoSandboxes(t)
	e.checkOutputVerifies(t, good)
	if !strings.Contains(p.all.String(), "interrupted (SIGINT)") {
		t.Error("the log does not say the run was interrupted (SIGINT)")
	}
	// The summary says which sets the stop caught, and never prints an unknown figure as 0:
	// block was never captured, so its size, timings and smoke test are unknown.
	rows := map[string][]string{}
	for _, line := range strings.Split(p.stdout.String(), "\n") {
		if fields := strings.Fields(line); len(fields) > 0 {
			rows[fields[0]] = fields
		}
	}
	for _, set := range []string{"empty", "block"} {
		if row := rows[set]; len(row) < 2 || row[1] != "interrupted" {
			t.Errorf("summary row of %s: %v, want status interrupted", set, row)
		}
	}
	if want := []string{"block", "interrupted", "json," + testenv.BlockingModule, "-", "-", "-", "-", "-", "-", "-"}; !slices.Equal(rows["block"], want) {
		t.Errorf("summary row of block: %v, want %v", rows["block"], want)
	}
}

// TestSignalInProcess delivers SIGTERM to dispatch in this process (the race detector watches
// the signal path) while two captures are blocked in two workers (--jobs 2): exit 143, no
// sandbox of either worker left.
func TestSignalInProcess(t *testing.T) {
	e := newFaultEnv(t)
	e.useTmp(t)
	t.Setenv("PYTHONPATH", testenv.TestingPythonPath)
	signals := make(chan os.Signal, 1)
	var stderr bytes.Buffer
	exited := make(chan int, 1)
	cfg := e.config(t, "  - id: block\n    imports: ["+testenv.BlockingModule+"]\n  - id: block2\n    imports: [json, "+testenv.BlockingModule+"]\n", "pass_env: [PYTHONPATH]")
	go func() {
		exited <- dispatch([]string{"capture", "--config", cfg, "--jobs", "2"}, io.Discard, &stderr, signals)
	}()
	e.waitForBlockedCapture(t)
	second := testenv.WaitForSandbox(t, e.runtime(), "-block2-capture-", 2*time.Minute)
	testenv.WaitForBlocked(t, e.tmp, second, 2*time.Minute)
	signals <- syscall.SIGTERM
	select {
	case code := <-exited:
		if code != exitcode.ForSignal(syscall.SIGTERM) {
			t.Fatalf("exit %d after SIGTERM, want 143\n%s", code, stderr.String())
		}
	case <-time.After(time.Minute):
		t.Fatal("dispatch did not return within a minute of SIGTERM")
	}
	e.checkNoSandboxes(t)
}

// TestDispatchLeavesNoGoroutine: every call of dispatch ends the goroutine that watches for
// signals.
func TestDispatchLeavesNoGoroutine(t *testing.T) {
	cfg := testConfig{runsc: "/x", root: "/r", rootfs: "/f", output: filepath.Join(t.TempDir(), "none")}.write(t)
	runCLI(t, "verify", "--config", cfg)
	before := runtime.NumGoroutine()
	for range 20 {
		if code, _, stderr := runCLI(t, "verify", "--config", cfg); code != exitUsage {
			t.Fatalf("exit %d\n%s", code, stderr)
		}
	}
	if after := runtime.NumGoroutine(); after > before {
		t.Fatalf("%d goroutines before 20 calls, %d after", before, after)
	}
}

// TestFaultSIGKILLLeftovers: a run killed outright leaves its sandbox, its lock file, its
// scratch and its staging directory and its pending store entry, all named after its lease;
// the next run removes them, takes the lock over, and says so.
func TestFaultSIGKILLLeftovers(t *testing.T) {
	e := newFaultEnv(t)
	e.useTmp(t) // the next run, in this process, sweeps the killed run's scratch directory
	good := e.goodOutput(t)
	p := startPipelineEnv(t, e.env(blockingEnv), "capture", "--config", e.blockingConfig(t))
	p.drain()
	left := e.waitForBlockedCapture(t)
	run, ok := orphans.OwnerRun(left)
	if !ok {
		t.Fatalf("sandbox %s carries no run", left)
	}
	p.cmd.Process.Kill()
	p.wait(t, time.Minute)
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	if ids, err := e.runtime().List(ctx); err != nil || !slices.Contains(ids, left) {
		t.Fatalf("the killed run's sandbox %s is not under the root: %v %v", left, ids, err)
	}
	staging, _ := filepath.Glob(e.out + ".staging-*")
	if len(staging) != 1 {
		t.Fatalf("the killed run left staging directories %v, want one", staging)
	}
	pendingPattern := filepath.Join(e.dir, "store", ".pending-"+run+"-*")
	if pending, _ := filepath.Glob(pendingPattern); len(pending) == 0 {
		t.Fatal("the killed run left no pending entry in the store (its blocked capture writes one)")
	}
	scratch := filepath.Join(e.tmp, "readie-scratch-"+run+"-")
	code, _, stderr := runCLI(t, "smoke", "--config", good, "--only", "small")
	if code != exitOK {
		t.Fatalf("the next run: exit %d\n%s", code, stderr)
	}
	for _, want := range []string{"removed a sandbox left by a run that died", left, "took over the lock of a run that died",
		"removed the scratch directory of a run that died\" dir=" + scratch,
		"removed the staging directory of a run that died: " + staging[0],
		"removed a store entry that a run which died was writing\" dir=" + filepath.Join(e.dir, "store", ".pending-"+run+"-")} {
		if !strings.Contains(stderr, want) {
			t.Errorf("the next run does not say %q:\n%s", want, stderr)
		}
	}
	if _, err := os.Stat(staging[0]); !os.IsNotExist(err) {
		t.Errorf("the staging directory of the killed run is still there: %v", err)
	}
	if pending, _ := filepath.Glob(pendingPattern); len(pending) != 0 {
		t.Errorf("the killed run's pending store entry is still there: %v", pending)
	}
	if dirs, _ := filepath.Glob(scratch + "*"); len(dirs) != 0 {
		t.Errorf("the killed run's scratch directory is still there: %v", dirs)
	}
	e.checkOutputVerifies(t, good)
}

// TestFaultConcurrentRun: while one run holds the output (its capture blocks forever), a
// second run refuses at once, naming the holder's pid, instead of waiting for the lock.
func TestFaultConcurrentRun(t *testing.T) {
	t.Parallel()
	e := newFaultEnv(t)
	good := e.goodOutput(t)
	p := startPipelineEnv(t, e.env(blockingEnv), "capture", "--config", e.blockingConfig(t))
	p.waitForLine(t, "capture: start") // the lock is taken before any capture starts
	p.drain()
	code, _, stderr := runCLI(t, "capture", "--config", good)
	if code != exitFailed || !strings.Contains(stderr, "being written by pid "+strconv.Itoa(p.cmd.Process.Pid)) {
		t.Fatalf("second run: exit %d\n%s", code, stderr)
	}
	select {
	case <-p.exited:
		t.Fatal("the first run ended although its capture never finishes")
	default:
	}
	p.cmd.Process.Signal(syscall.SIGINT)
	if code := p.wait(t, time.Minute); code != exitcode.ForSignal(syscall.SIGINT) {
		t.Fatalf("the first run: exit %d after SIGINT\n%s", code, p.all.String())
	}
	e.checkOutputVerifies(t, good)
}

// TestNoSecretsInCheckpoints runs a capture with canary secrets in the pipeline's environment
// and checks that no file under the output (images, meta.json, manifest, restore spec), the
// lock file, and nothing the pipeline printed contains any of them.
func TestNoSecretsInCheckpoints(t *testing.T) {
	t.Parallel()
	e := newFaultEnv(t)
	marker := fmt.Sprintf("readie-canary-%d-%d", os.Getpid(), time.Now().UnixNano())
	canaries := map[string]string{
		"AWS_SECRET_ACCESS_KEY": "AKIAcanary" + marker,
		"GITHUB_TOKEN":          "ghp_canary" + marker,
		"READIE_CANARY":         marker,
	}
	// Uncompressed images, said explicitly: a compressed image could hide a canary from the
	// byte search below (the header check after the run makes sure).
	cfg := e.config(t, "  - id: small\n    imports: [json, email.parser]\n", "")
	data, _ := os.ReadFile(cfg)
	os.WriteFile(cfg, []byte(strings.Replace(string(data), "  restore_flags:", "  checkpoint_options: {compression: none}\n  restore_flags:", 1)), 0o644)
	p := startPipelineEnv(t, e.env(canaries), "capture", "--config", cfg, "-v")
	p.drain()
	if code := p.wait(t, 3*time.Minute); code != exitOK {
		t.Fatalf("capture: exit %d\n%s", code, p.all.String())
	}
	for _, set := range []string{"empty", "small"} {
		header, err := manifest.ReadImageHeader(filepath.Join(e.out, set, "checkpoint.img"))
		if err != nil || header.Compression() != "none" {
			t.Fatalf("%s: checkpoint.img compression %q, %v: the search below needs plain images", set, header.Compression(), err)
		}
	}
	var scanned int
	check := func(name string, data []byte) {
		scanned++
		for key, value := range canaries {
			if bytes.Contains(data, []byte(value)) {
				t.Errorf("%s contains the value of %s", name, key)
			}
		}
	}
	// Everything the run wrote: output, lock file, any staging. runsc's own state root is not
	// the pipeline's (it holds namespace files that cannot be read).
	err := filepath.WalkDir(e.dir, func(path string, d os.DirEntry, err error) error {
		if err != nil {
			return err
		}
		if d.IsDir() && path == e.root {
			return filepath.SkipDir
		}
		if d.IsDir() || !d.Type().IsRegular() {
			return nil
		}
		data, err := os.ReadFile(path)
		if err != nil {
			return err
		}
		check(path, data)
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
	check("the pipeline's stderr", p.all.Bytes())
	if _, err := os.Stat(filepath.Join(e.out, "small", "pages.img")); err != nil || scanned < 8 {
		t.Fatalf("scanned %d files; the checkpoint is missing: %v", scanned, err)
	}
}
