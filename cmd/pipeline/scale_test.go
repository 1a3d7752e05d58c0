package main

import (
	"bytes"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"readie.dev/pipeline/internal/config"
	"readie.dev/pipeline/internal/testenv"
	"readie.dev/pipeline/pkg/atomicfile"
	"readie.dev/pipeline/pkg/manifest"
)

const sixSets = `  - id: json
    imports: [json]
  - id: csv
    imports: [csv]
  - id: sqlite3
    imports: [sqlite3]
  - id: email
    imports: [email.parser]
  - id: numpy
    imports: [numpy]
  - id: pandas
    imports: [pandas]
`

// TestShardsAndMerge: three shard processes of a six-set config at the same time, each into
// its own output, then merge: every set once, verify passes, every smoke test passed, and plan
// on the merged output with the full config reuses every set. The same sources in another
// order give the same manifest.json, byte for byte.
func TestShardsAndMerge(t *testing.T) {
	t.Parallel()
	dir := testenv.WorkDir(t)
	tc := testConfig{runsc: testenv.RunscPath(t), root: runscRoot(t, dir), rootfs: testenv.Rootfs(t), output: filepath.Join(dir, "merged"),
		store: filepath.Join(dir, "store"), sets: sixSets}
	full := tc.write(t)
	var shards []string
	var runs []*process
	for i := range 3 {
		out := filepath.Join(dir, "shard"+string(rune('0'+i)))
		shards = append(shards, out)
		p := startPipeline(t, "capture", "--config", full, "--out", out, "--shard", string(rune('0'+i))+"/3", "--jobs", "2")
		p.drain()
		runs = append(runs, p)
	}
	for i, p := range runs {
		if code := p.wait(t, 5*time.Minute); code != exitOK {
			t.Fatalf("shard %d: exit %d\n%s", i, code, p.all.String())
		}
	}
	for i, out := range shards {
		m, err := manifest.Load(filepath.Join(out, manifest.FileName))
		if err != nil {
			t.Fatal(err)
		}
		if m.Checkpoints[0].ID != config.EmptySetID {
			t.Errorf("shard %d does not start with empty", i)
		}
		for _, c := range m.Checkpoints[1:] {
			if config.ShardOf(c.ID, 3) != i {
				t.Errorf("shard %d holds %s, which belongs to shard %d", i, c.ID, config.ShardOf(c.ID, 3))
			}
		}
		if code, stdout, stderr := runCLI(t, "verify", "--config", full, "--out", out); code != exitOK {
			t.Fatalf("verify shard %d: %s%s", i, stdout, stderr)
		}
	}
	// One shard goes through an image, as on Kubernetes (merge pulls it).
	layoutRef := "oci-layout:" + filepath.Join(dir, "layout") + ":shard-2"
	if code, _, stderr := runCLI(t, "push", "--config", full, "--out", shards[2], layoutRef); code != exitOK {
		t.Fatalf("push shard 2: %s", stderr)
	}
	code, stdout, stderr := runCLI(t, "merge", "--config", full, "--out", tc.output, layoutRef, shards[0], shards[1])
	if code != exitOK {
		t.Fatalf("merge: exit %d\n%s%s", code, stdout, stderr)
	}
	if code, stdout, stderr := runCLI(t, "verify", "--config", full); code != exitOK || !strings.Contains(stdout, "7 checkpoints verified") {
		t.Fatalf("verify the merge: exit %d\n%s%s", code, stdout, stderr)
	}
	m, _ := manifest.Load(filepath.Join(tc.output, manifest.FileName))
	for _, c := range m.Checkpoints {
		if !c.Smoke.OK {
			t.Errorf("%s: smoke test did not pass", c.ID)
		}
	}
	code, stdout, stderr = runCLI(t, "plan", "--config", full)
	if code != exitOK {
		t.Fatalf("plan: %s", stderr)
	}
	for id, action := range tableColumn(stdout, 1) {
		if action != "reuse" {
			t.Errorf("plan on the merge: %s would %s", id, action)
		}
	}
	again := filepath.Join(dir, "merged-again")
	if code, _, stderr := runCLI(t, "merge", "--config", full, "--out", again, shards[1], shards[2], shards[0]); code != exitOK {
		t.Fatalf("second merge: %s", stderr)
	}
	a, _ := os.ReadFile(filepath.Join(tc.output, manifest.FileName))
	b, _ := os.ReadFile(filepath.Join(again, manifest.FileName))
	if !bytes.Equal(a, b) {
		t.Error("the same sources in another order gave another manifest.json")
	}
}

// TestMergeRefuses: sources that differ in runsc, spec fingerprint or rootfs, or hold one set
// under two keys, are refused (exit 1) with the field, the sources and both values named (and
// for two keys, the key parts that differ), and the output is not written.
func TestMergeRefuses(t *testing.T) {
	t.Parallel()
	dir := testenv.WorkDir(t)
	tc := testConfig{runsc: testenv.RunscPath(t), root: runscRoot(t, dir), rootfs: testenv.Rootfs(t), output: filepath.Join(dir, "a"),
		store: filepath.Join(dir, "store"), sets: "  - id: js\n    imports: [json]\n"}
	cfgA := tc.write(t)
	tc.output, tc.sets = filepath.Join(dir, "b"), "  - id: js\n    imports: [json, csv]\n"
	cfgB := tc.write(t)
	for _, cfg := range []string{cfgA, cfgB} {
		if code, _, stderr := runCLI(t, "capture", "--config", cfg); code != exitOK {
			t.Fatalf("capture: %s", stderr)
		}
	}
	out := filepath.Join(dir, "merged")
	code, _, stderr := runCLI(t, "merge", "--config", cfgA, "--out", out, filepath.Join(dir, "a"), filepath.Join(dir, "b"))
	if code != exitFailed || !strings.Contains(stderr, "set js has key sha256:") || !strings.Contains(stderr, "they differ in imports") {
		t.Errorf("one set, two keys: exit %d\n%s", code, stderr)
	}
	for _, tt := range []struct {
		field  string
		change func(*manifest.Manifest)
	}{
		{"runsc.sha256", func(m *manifest.Manifest) { m.Runsc.SHA256 = "sha256:other" }},
		{"runsc.helpers", func(m *manifest.Manifest) { m.Runsc.Helpers = map[string]string{"gvisor_sentry": "sha256:other"} }},
		{"spec_fingerprint", func(m *manifest.Manifest) { m.SpecFingerprint = "sha256:other" }},
		{"rootfs.digest", func(m *manifest.Manifest) { m.Rootfs.Digest = "sha256:other" }},
	} {
		copyDir := filepath.Join(dir, "copy-"+tt.field)
		if err := testenv.CopyTree(filepath.Join(dir, "a"), copyDir); err != nil {
			t.Fatal(err)
		}
		m, _ := manifest.Load(filepath.Join(copyDir, manifest.FileName))
		tt.change(m)
		atomicfile.WriteJSON(filepath.Join(copyDir, manifest.FileName), m)
		code, _, stderr := runCLI(t, "merge", "--config", cfgA, "--out", out, filepath.Join(dir, "a"), copyDir)
		if code != exitFailed || !strings.Contains(stderr, "disagree on "+tt.field) || !strings.Contains(stderr, "sha256:other") || !strings.Contains(stderr, copyDir) {
			t.Errorf("%s differs: exit %d\n%s", tt.field, code, stderr)
		}
	}
	if _, err := os.Stat(out); !os.IsNotExist(err) {
		t.Errorf("a refused merge wrote %s", out)
	}
}

// TestJobsWithAFailingSet: with --jobs 2, a set whose import fails among good ones fails the
// run, which names it, leaves no sandbox, and keeps the previous output valid.
func TestJobsWithAFailingSet(t *testing.T) {
	t.Parallel()
	e := newFaultEnv(t)
	good := e.goodOutput(t)
	cfg := e.config(t, "  - id: js\n    imports: [json]\n  - id: broken\n    imports: [not_a_module_readie]\n  - id: csv\n    imports: [csv]\n", "")
	code, stdout, stderr := runCLI(t, "capture", "--config", cfg, "--jobs", "2", "--clean-failed")
	if code != exitFailed || !strings.Contains(stderr, "package sets failed: broken") {
		t.Fatalf("exit %d\n%s%s", code, stdout, stderr)
	}
	statuses := tableColumn(stdout, 1)
	if statuses["broken"] != "failed" || statuses["js"] == "failed" || statuses["csv"] == "failed" {
		t.Errorf("summary: %v\n%s", statuses, stdout)
	}
	e.checkNoSandboxes(t)
	e.checkOutputVerifies(t, good)
}
