package main

import (
	"encoding/json"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"readie.dev/pipeline/internal/bench"
	"readie.dev/pipeline/internal/lease"
	"readie.dev/pipeline/internal/testenv"
)

// readSoak reads the soak.json of the newest bench run directory of out.
func readSoak(t *testing.T, out string) bench.SoakReport {
	t.Helper()
	runs, err := filepath.Glob(filepath.Join(out, "bench", "2*", "soak.json"))
	if err != nil || len(runs) == 0 {
		t.Fatalf("no soak.json under %s/bench: %v", out, err)
	}
	data, err := os.ReadFile(runs[len(runs)-1])
	if err != nil {
		t.Fatal(err)
	}
	var r bench.SoakReport
	if err := json.Unmarshal(data, &r); err != nil {
		t.Fatal(err)
	}
	return r
}

// TestSoakShort: `bench --soak` (a short one: the long ones are `make soak`) restores the
// output's checkpoints in turn, 2 at once, through the worker's kit, with every answer checked,
// and leaves nothing: no sandbox in its runsc root, no runsc process, no descriptor of the
// pipeline, no mount, no entry of the runsc root or TMPDIR (both private here, so their
// totals count too). Then the fault: every 5th sandbox killed with SIGKILL, each of those
// restores reported as a failure with its error, and still nothing left.
func TestSoakShort(t *testing.T) {
	dir := testenv.WorkDir(t)
	tmp := filepath.Join(dir, "t")
	if err := os.Mkdir(tmp, 0o755); err != nil {
		t.Fatal(err)
	}
	t.Setenv("TMPDIR", tmp)
	out := filepath.Join(dir, "out")
	root := runscRoot(t, dir)
	cfg := testConfig{runsc: testenv.RunscPath(t), root: root, rootfs: testenv.Rootfs(t), output: out,
		sets: "  - id: small\n    imports: [json, email.parser]\n"}.write(t)
	if code, _, stderr := runCLI(t, "capture", "--config", cfg); code != exitOK {
		t.Fatalf("capture: exit %d\n%s", code, stderr)
	}

	code, stdout, stderr := runCLI(t, "bench", "--config", cfg, "--soak", "100")
	if code != exitOK {
		t.Fatalf("bench --soak 100: exit %d\n%s\n%s", code, stdout, stderr)
	}
	if !strings.Contains(stdout, "\n100 restores, 0 failures\n") || !strings.Contains(stdout, "left at the end: nothing") {
		t.Errorf("the summary does not say 100 restores, 0 failures, nothing left:\n%s", stdout)
	}
	r := readSoak(t, out)
	if r.Restores != 100 || r.Failures != 0 || r.Concurrency != 2 || len(r.Left) != 0 || strings.Join(r.Checkpoints, ",") != "empty,small" {
		t.Fatalf("soak.json: %d restores, %d failures at %d, checkpoints %v, left %v, errors %v", r.Restores, r.Failures, r.Concurrency, r.Checkpoints, r.Left, r.Errors)
	}
	checkNothingLeft(t, r)
	if len(r.Minutes) == 0 || r.Latency.Median <= 0 || r.Minutes[0].P99 < r.Minutes[0].P50 {
		t.Errorf("latency: %+v per minute %+v", r.Latency, r.Minutes)
	}

	code, stdout, stderr = runCLI(t, "bench", "--config", cfg, "--soak", "20", "--concurrency", "2", "--soak-kill-every", "5")
	if code != exitOK {
		t.Fatalf("bench --soak 20 --soak-kill-every 5: exit %d\n%s\n%s", code, stdout, stderr)
	}
	if !strings.Contains(stdout, "\n20 restores, 4 failures (4 sandboxes killed with SIGKILL on purpose, 0 failures not induced)\n") {
		t.Errorf("the summary does not report the 4 failures:\n%s", stdout)
	}
	r = readSoak(t, out)
	if r.Restores != 20 || r.Failures != 4 || r.Killed != 4 || len(r.Errors) != 4 || len(r.Left) != 0 {
		t.Fatalf("soak.json: %d restores, %d failures, %d killed, left %v, errors %v", r.Restores, r.Failures, r.Killed, r.Left, r.Errors)
	}
	for _, f := range r.Errors {
		if !f.Killed || f.N%5 != 0 || f.Error == "" || !strings.Contains(stdout, f.Error) {
			t.Errorf("failure %+v is not a killed restore reported with its error", f)
		}
	}
	checkNothingLeft(t, r)
	// And by the tests' own look: no sandbox, no runsc process of the root, nothing in TMPDIR
	// but the test's own temporary directories and the directory of the runs' leases.
	testenv.CheckNoRunsc(t, testenv.RunscPath(t), root, "")
	testenv.CheckEmptyDir(t, tmp, t.Name()+"*", lease.RunsDir)
}

// checkNothingLeft checks the soak's last sample against its first: with a private runsc root
// and TMPDIR, their totals too.
func checkNothingLeft(t *testing.T, r bench.SoakReport) {
	t.Helper()
	first, last := r.Samples[0], r.Samples[len(r.Samples)-1]
	if last.Sandboxes != 0 || last.RunscProcesses != 0 || last.OwnRootEntries != 0 || last.FDs > first.FDs || last.Mounts > first.Mounts ||
		last.TmpEntries != first.TmpEntries || last.RootEntries > first.RootEntries+1 || len(last.Errors) != 0 {
		t.Errorf("left at the end: first sample %+v, last %+v", first, last)
	}
}
