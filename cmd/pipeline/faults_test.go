package main

import (
	"bufio"
	"bytes"
	"context"
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

	"readie.dev/pipeline/internal/testenv"
	"readie.dev/pipeline/pkg/manifest"
	"readie.dev/pipeline/pkg/sandbox"
)

// TestMain lets a test run this binary as the pipeline in a process of its own, for signals
// and concurrent runs.
func TestMain(m *testing.M) {
	if os.Getenv("READIE_TEST_AS_PIPELINE") == "1" {
		os.Exit(dispatch(os.Args[1:], os.Stdout, os.Stderr))
	}
	os.Exit(m.Run())
}

// faultEnv is an output directory that already holds a good capture of the empty set, so
// every fault test can check that a failed run leaves it valid.
type faultEnv struct {
	dir, root, out string
	rootfs, runsc  string
}

func newFaultEnv(t *testing.T) *faultEnv {
	t.Helper()
	dir := testenv.WorkDir(t)
	e := &faultEnv{dir: dir, root: filepath.Join(dir, "root"), out: filepath.Join(dir, "out"), rootfs: testenv.Rootfs(t), runsc: testenv.RunscPath(t)}
	t.Cleanup(func() {
		e.checkNoSandboxes(t)
		if err := testenv.RemoveRunscRoot(e.root); err != nil {
			t.Error(err)
		}
	})
	return e
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

func (e *faultEnv) checkNoSandboxes(t *testing.T) {
	t.Helper()
	rt := &sandbox.Runtime{Path: e.runsc, Root: e.root, Flags: sandbox.DefaultFlags()}
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	if ids, err := rt.List(ctx); err != nil || len(ids) != 0 {
		t.Errorf("runsc list under %s: %v %v", e.root, ids, err)
	}
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

func TestFaultImportFails(t *testing.T) {
	e := newFaultEnv(t)
	good := e.goodOutput(t)
	cfg := e.config(t, "  - id: broken\n    imports: [json, not_a_module_readie]\n", "")
	code, _, stderr := runCLI(t, "capture", "--config", cfg, "--clean-failed")
	if code != exitFailed || !strings.Contains(stderr, "not_a_module_readie") || !strings.Contains(stderr, "broken") {
		t.Fatalf("exit %d\n%s", code, stderr)
	}
	if matches, _ := filepath.Glob(e.out + ".staging-*"); len(matches) != 0 {
		t.Errorf("--clean-failed left %v", matches)
	}
	e.checkOutputVerifies(t, good)
}

func TestFaultCaptureTimeout(t *testing.T) {
	e := newFaultEnv(t)
	good := e.goodOutput(t)
	cfg := e.config(t, "", "")
	data, _ := os.ReadFile(cfg)
	os.WriteFile(cfg, []byte(strings.Replace(string(data), "capture: 3m", "capture: 1500ms", 1)), 0o644)
	start := time.Now()
	code, _, stderr := runCLI(t, "capture", "--config", cfg)
	if code != exitFailed || !strings.Contains(stderr, "capture of pandas exceeded its timeout of 1.5s") {
		t.Fatalf("exit %d\n%s", code, stderr)
	}
	if took := time.Since(start); took > time.Minute {
		t.Errorf("a 1.5s capture timeout took %s to fail", took)
	}
	if !strings.Contains(stderr, "staging directory kept for inspection") {
		t.Errorf("the error does not name the staging directory:\n%s", stderr)
	}
	e.checkOutputVerifies(t, good)
}

func TestFaultCorruptImages(t *testing.T) {
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
	e := newFaultEnv(t)
	small := filepath.Join(e.dir, "small-fs")
	os.MkdirAll(small, 0o755)
	if out, err := exec.Command("mount", "-t", "tmpfs", "-o", "size=24m", "readie-test", small).CombinedOutput(); err != nil {
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
	exited chan struct{}
}

func startPipeline(t *testing.T, args ...string) *process {
	t.Helper()
	return startPipelineEnv(t, nil, args...)
}

func startPipelineEnv(t *testing.T, env map[string]string, args ...string) *process {
	t.Helper()
	p := &process{exited: make(chan struct{})}
	p.cmd = exec.Command(os.Args[0], args...)
	p.cmd.Env = append(os.Environ(), "READIE_TEST_AS_PIPELINE=1")
	for k, v := range env {
		p.cmd.Env = append(p.cmd.Env, k+"="+v)
	}
	pr, pw := io.Pipe()
	p.stderr = bufio.NewReader(pr)
	p.cmd.Stderr = io.MultiWriter(pw, &p.all)
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
	e := newFaultEnv(t)
	good := e.goodOutput(t)
	p := startPipeline(t, "capture", "--config", e.config(t, "", ""))
	p.waitForLine(t, "capture: start") // the empty set
	p.waitForLine(t, "capture: start") // pandas, now importing
	time.Sleep(300 * time.Millisecond)
	p.cmd.Process.Signal(syscall.SIGINT)
	p.drain()
	if code := p.wait(t, time.Minute); code != exitSIGINT {
		t.Fatalf("exit %d after SIGINT, want 130\n%s", code, p.all.String())
	}
	t.Logf("the interrupted run said:\n%s", p.all.String())
	e.checkNoSandboxes(t)
	e.checkOutputVerifies(t, good)
}

// TestFaultSIGKILLLeftovers: a run killed outright leaves its sandbox and its lock file; the
// next run removes the sandbox, takes the lock over, and says so.
func TestFaultSIGKILLLeftovers(t *testing.T) {
	e := newFaultEnv(t)
	good := e.goodOutput(t)
	cfg := e.config(t, "", "")
	p := startPipeline(t, "capture", "--config", cfg)
	p.waitForLine(t, "capture: start")
	p.waitForLine(t, "capture: start")
	time.Sleep(300 * time.Millisecond)
	p.cmd.Process.Kill()
	p.drain()
	p.wait(t, time.Minute)
	rt := &sandbox.Runtime{Path: e.runsc, Root: e.root, Flags: sandbox.DefaultFlags()}
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	left, err := rt.List(ctx)
	if err != nil || len(left) == 0 {
		t.Fatalf("expected the killed run's sandbox under the root, got %v %v", left, err)
	}
	code, _, stderr := runCLI(t, "smoke", "--config", good, "--only", "small")
	if code != exitOK {
		t.Fatalf("the next run: exit %d\n%s", code, stderr)
	}
	for _, want := range []string{"removed a sandbox left by a run that died", left[0], "took over the lock of a run that died",
		fmt.Sprintf("removed the scratch directory of a run that died\" dir=%s/rd-%d-", strings.TrimSuffix(os.TempDir(), "/"), p.cmd.Process.Pid)} {
		if !strings.Contains(stderr, want) {
			t.Errorf("the next run does not say %q:\n%s", want, stderr)
		}
	}
}

func TestFaultConcurrentRun(t *testing.T) {
	e := newFaultEnv(t)
	e.goodOutput(t)
	cfg := e.config(t, "", "")
	p := startPipeline(t, "capture", "--config", cfg)
	p.waitForLine(t, "capture: start")
	p.drain()
	start := time.Now()
	code, _, stderr := runCLI(t, "capture", "--config", cfg)
	if code != exitFailed || !strings.Contains(stderr, "being written by pid "+strconv.Itoa(p.cmd.Process.Pid)) {
		t.Fatalf("second run: exit %d\n%s", code, stderr)
	}
	if took := time.Since(start); took > 10*time.Second {
		t.Errorf("the second run took %s to refuse", took)
	}
	if code := p.wait(t, 3*time.Minute); code != exitOK {
		t.Fatalf("the first run failed: exit %d\n%s", code, p.all.String())
	}
	e.checkOutputVerifies(t, cfg)
}

// TestNoSecretsInCheckpoints runs a capture with canary secrets in the pipeline's environment
// and checks that no file under the output (images, meta.json, manifest, restore spec), the
// lock file, and nothing the pipeline printed contains any of them.
func TestNoSecretsInCheckpoints(t *testing.T) {
	e := newFaultEnv(t)
	marker := fmt.Sprintf("readie-canary-%d-%d", os.Getpid(), time.Now().UnixNano())
	canaries := map[string]string{
		"AWS_SECRET_ACCESS_KEY": "AKIAcanary" + marker,
		"GITHUB_TOKEN":          "ghp_canary" + marker,
		"READIE_CANARY":         marker,
	}
	cfg := e.config(t, "  - id: small\n    imports: [json, email.parser]\n", "")
	p := startPipelineEnv(t, canaries, "capture", "--config", cfg, "-v")
	p.drain()
	if code := p.wait(t, 3*time.Minute); code != exitOK {
		t.Fatalf("capture: exit %d\n%s", code, p.all.String())
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
