package main

import (
	"fmt"
	"os"
	"path/filepath"
	"runtime"
	"strings"
	"testing"

	"readie.dev/pipeline/pkg/manifest"
)

// TestSandboxCPUs: sandbox.cpus is part of every checkpoint's key. Captured with 1 CPU, the
// manifest and every meta.json record 1; the same sets at 2 CPUs are a cache miss (plan names
// cpus as what changed) and record 2; back at 1, the store's entries are reused; outputs of the
// two counts do not merge. A count this
// host cannot give is refused before anything is captured, naming both counts, and leaves the
// output as it was.
func TestSandboxCPUs(t *testing.T) {
	t.Parallel()
	e := newIncrementalEnv(t)
	e.cfg.sets = "  - id: a\n    imports: [json]\n"
	base := e.cfg.write(t)
	withCPUs := func(n int) string {
		text, err := os.ReadFile(base)
		if err != nil {
			t.Fatal(err)
		}
		path := filepath.Join(e.dir, fmt.Sprintf("cpus-%d.yaml", n))
		if err := os.WriteFile(path, append(text, fmt.Sprintf("sandbox:\n  cpus: %d\n", n)...), 0o644); err != nil {
			t.Fatal(err)
		}
		return path
	}
	recorded := func(want int) {
		t.Helper()
		m := e.manifest()
		if m.CPUs != want {
			t.Errorf("manifest cpus = %d, want %d", m.CPUs, want)
		}
		for _, c := range m.Checkpoints {
			meta, err := manifest.LoadMeta(filepath.Join(e.out, c.Dir, manifest.MetaFileName))
			if err != nil || meta.CPUs != want {
				t.Errorf("%s: meta.json cpus %+v, %v; want %d", c.ID, meta, err, want)
			}
		}
	}
	one, two := withCPUs(1), withCPUs(2)
	wantStatuses(t, e.statuses("capture", "--config", one), map[string]string{"empty": "captured", "a": "captured"})
	recorded(1)
	e.verify(one)
	keyAtOne := e.manifest().Checkpoints[1].Key

	plan, _ := e.plan("--config", two)
	if plan["a"] != "capture: changed since the output: cpus; not in the store" {
		t.Errorf("plan at 2 CPUs after 1: %v", plan)
	}
	wantStatuses(t, e.statuses("capture", "--config", two), map[string]string{"empty": "captured", "a": "captured"})
	recorded(2)
	if e.manifest().Checkpoints[1].Key == keyAtOne {
		t.Error("the key at 2 CPUs is the key at 1")
	}

	wantStatuses(t, e.statuses("capture", "--config", one), map[string]string{"empty": "reused", "a": "reused"})
	recorded(1)

	// Outputs of two counts do not merge: one worker restores every checkpoint of the result.
	atTwo := filepath.Join(e.dir, "out-at-2")
	if code, _, stderr := e.run("capture", "--config", two, "--out", atTwo); code != exitOK {
		t.Fatalf("capture at 2 CPUs into another output: exit %d\n%s", code, stderr)
	}
	code, _, stderr := e.run("merge", "--config", one, "--out", filepath.Join(e.dir, "merged"), e.out, atTwo)
	if code != exitFailed || !strings.Contains(stderr, "disagree on cpus") {
		t.Errorf("a merge of outputs at 1 and 2 CPUs: exit %d, want 1 naming cpus\n%s", code, stderr)
	}

	before, err := os.ReadFile(filepath.Join(e.out, manifest.FileName))
	if err != nil {
		t.Fatal(err)
	}
	more := runtime.NumCPU() + 1
	code, stdout, stderr := e.run("capture", "--config", withCPUs(more))
	if code != exitUsage || !strings.Contains(stderr, fmt.Sprintf("sandbox.cpus is %d, this host gives the pipeline %d CPUs", more, runtime.NumCPU())) {
		t.Errorf("sandbox.cpus %d on a host of %d: exit %d, want 2 naming both\n%s%s", more, runtime.NumCPU(), code, stdout, stderr)
	}
	if after, _ := os.ReadFile(filepath.Join(e.out, manifest.FileName)); string(after) != string(before) {
		t.Error("a refused capture changed the output")
	}
}
