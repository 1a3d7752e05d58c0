package main

import (
	"encoding/json"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"

	"readie.dev/pipeline/internal/lease"
	"readie.dev/pipeline/internal/testenv"
	"readie.dev/pipeline/pkg/manifest"
)

// incrementalEnv is an output and a store in a scratch directory, and a config of two small
// stdlib sets.
type incrementalEnv struct {
	t     *testing.T
	dir   string
	out   string
	store string
	cfg   testConfig
	// env, when set, is added to the environment of the runs, each then a process of its own
	// (this process's environment is every parallel test's).
	env map[string]string
}

// run runs the pipeline with e.env.
func (e *incrementalEnv) run(args ...string) (int, string, string) {
	e.t.Helper()
	if e.env != nil {
		return runProcess(e.t, e.env, 5*time.Minute, args...)
	}
	return runCLI(e.t, args...)
}

func newIncrementalEnv(t *testing.T) *incrementalEnv {
	dir := testenv.WorkDir(t)
	e := &incrementalEnv{t: t, dir: dir, out: filepath.Join(dir, "out"), store: filepath.Join(dir, "store")}
	e.cfg = testConfig{runsc: testenv.RunscPath(t), root: runscRoot(t, dir), rootfs: testenv.Rootfs(t), output: e.out, store: e.store,
		sets: "  - id: a\n    imports: [json]\n  - id: b\n    imports: [csv]\n"}
	return e
}

// statuses runs a command and returns each set's status from the summary table.
func (e *incrementalEnv) statuses(args ...string) map[string]string {
	e.t.Helper()
	code, stdout, stderr := e.run(args...)
	if code != exitOK {
		e.t.Fatalf("%v: exit %d\n%s%s", args, code, stdout, stderr)
	}
	return tableColumn(stdout, 1)
}

// tableColumn maps the first column of each row of a table (after its header) to column i.
func tableColumn(table string, i int) map[string]string {
	got := map[string]string{}
	for _, line := range strings.Split(strings.TrimSpace(table), "\n")[1:] {
		if f := strings.Fields(line); len(f) > i {
			got[f[0]] = f[i]
		}
	}
	return got
}

func (e *incrementalEnv) manifest() *manifest.Manifest {
	e.t.Helper()
	m, err := manifest.Load(filepath.Join(e.out, manifest.FileName))
	if err != nil {
		e.t.Fatal(err)
	}
	return m
}

func (e *incrementalEnv) ids() []string {
	var ids []string
	for _, c := range e.manifest().Checkpoints {
		ids = append(ids, c.ID)
	}
	return ids
}

func (e *incrementalEnv) verify(cfg string) {
	e.t.Helper()
	if code, stdout, stderr := e.run("verify", "--config", cfg); code != exitOK {
		e.t.Fatalf("verify: exit %d\n%s%s", code, stdout, stderr)
	}
}

// plan returns `pipeline plan --log-format json`'s action per set, and the dropped sets.
func (e *incrementalEnv) plan(args ...string) (map[string]string, map[string]string) {
	e.t.Helper()
	code, stdout, stderr := e.run(append([]string{"plan", "--log-format", "json"}, args...)...)
	if code != exitOK {
		e.t.Fatalf("plan: exit %d\n%s", code, stderr)
	}
	var p struct {
		Sets []struct {
			ID, Action, Reason string
		}
		Dropped []struct{ ID, Reason string }
	}
	if err := json.Unmarshal([]byte(stdout), &p); err != nil {
		e.t.Fatalf("plan's JSON: %v\n%s", err, stdout)
	}
	actions, dropped := map[string]string{}, map[string]string{}
	for _, s := range p.Sets {
		actions[s.ID] = s.Action + ": " + s.Reason
	}
	for _, d := range p.Dropped {
		dropped[d.ID] = d.Reason
	}
	return actions, dropped
}

// agree checks that a plan's actions are what the capture then reported.
func agree(t *testing.T, plan, done map[string]string) {
	t.Helper()
	want := map[string]string{"capture": "captured", "reuse": "reused", "keep": "kept"}
	for id, action := range plan {
		if verb, _, _ := strings.Cut(action, ":"); done[id] != want[verb] {
			t.Errorf("%s: plan said %q, capture did %q", id, action, done[id])
		}
	}
	if len(plan) != len(done) {
		t.Errorf("plan %v, capture %v", plan, done)
	}
}

func wantStatuses(t *testing.T, got map[string]string, want map[string]string) {
	t.Helper()
	for id, status := range want {
		if got[id] != status {
			t.Errorf("%s: %q, want %q (all: %v)", id, got[id], status, got)
		}
	}
	if len(got) != len(want) {
		t.Errorf("statuses %v, want %v", got, want)
	}
}

// TestIncrementalCapture walks an image build job's life: a first capture, a second with
// nothing changed, one set's imports changed, a per-set trigger with --set and --only, and a
// change of a key input that every set shares.
func TestIncrementalCapture(t *testing.T) {
	t.Parallel()
	e := newIncrementalEnv(t)
	cfg := e.cfg.write(t)
	wantStatuses(t, e.statuses("capture", "--config", cfg), map[string]string{"empty": "captured", "a": "captured", "b": "captured"})
	first := e.manifest()
	for _, c := range first.Checkpoints {
		if !strings.HasPrefix(c.Key, "sha256:") || c.CapturedAt.IsZero() || len(c.KeyParts) < 10 {
			t.Errorf("%s: key %q captured_at %v parts %d", c.ID, c.Key, c.CapturedAt, len(c.KeyParts))
		}
		meta, err := manifest.LoadMeta(filepath.Join(e.out, c.Dir, manifest.MetaFileName))
		if err != nil || meta.Key != c.Key || !meta.CapturedAt.Equal(c.CapturedAt) {
			t.Errorf("%s: meta.json %+v, %v", c.ID, meta, err)
		}
	}

	// Nothing changed: everything reused, timings kept, smoke-tested again.
	plan, _ := e.plan("--config", cfg)
	done := e.statuses("capture", "--config", cfg)
	agree(t, plan, done)
	wantStatuses(t, done, map[string]string{"empty": "reused", "a": "reused", "b": "reused"})
	second := e.manifest()
	for i, c := range second.Checkpoints {
		if c.Key != first.Checkpoints[i].Key || !slices.Equal(c.RestoreMS.Runs, first.Checkpoints[i].RestoreMS.Runs) || !c.Smoke.OK {
			t.Errorf("%s: reused checkpoint changed: %+v", c.ID, c)
		}
	}
	e.verify(cfg)

	// --remeasure times the reused restores again.
	e.statuses("capture", "--config", cfg, "--only", "a", "--remeasure")
	if slices.Equal(e.manifest().Checkpoints[1].RestoreMS.Runs, first.Checkpoints[1].RestoreMS.Runs) {
		t.Error("--remeasure kept the old timings")
	}

	// One set's imports change: only it is captured, and plan says why.
	e.cfg.sets = "  - id: a\n    imports: [json, csv]\n  - id: b\n    imports: [csv]\n"
	cfg = e.cfg.write(t)
	plan, _ = e.plan("--config", cfg)
	if !strings.HasPrefix(plan["a"], "capture: changed since the output: imports") {
		t.Errorf("plan for a: %q", plan["a"])
	}
	done = e.statuses("capture", "--config", cfg)
	agree(t, plan, done)
	wantStatuses(t, done, map[string]string{"empty": "reused", "a": "captured", "b": "reused"})

	// A job triggered for one package set touches nothing else; --only keeps the others too.
	done = e.statuses("capture", "--config", cfg, "--set", "torch=email.parser,json")
	wantStatuses(t, done, map[string]string{"empty": "reused", "a": "kept", "b": "kept", "torch": "captured"})
	done = e.statuses("capture", "--config", cfg, "--only", "b")
	wantStatuses(t, done, map[string]string{"empty": "reused", "a": "kept", "b": "reused", "torch": "kept"})
	if got := strings.Join(e.ids(), ","); got != "empty,a,b,torch" {
		t.Errorf("output holds %s", got)
	}
	e.verify(cfg)
	// A plain capture makes the output exactly the config's sets.
	_, dropped := e.plan("--config", cfg)
	if dropped["torch"] != "not in the config" {
		t.Errorf("plan's dropped: %v", dropped)
	}
	e.statuses("capture", "--config", cfg)
	if got := strings.Join(e.ids(), ","); got != "empty,a,b" {
		t.Errorf("after a plain capture the output holds %s", got)
	}

	// A value of a pass_env variable changes: every set is captured again; with --only, the
	// sets it did not select are dropped, naming the part that changed.
	text, _ := os.ReadFile(cfg)
	os.WriteFile(cfg, []byte(strings.Replace(string(text), "checkpoints:", "pass_env: [READIE_TEST_KEY_PART]\ncheckpoints:", 1)), 0o644)
	e.env = map[string]string{"READIE_TEST_KEY_PART": "one"}
	wantStatuses(t, e.statuses("capture", "--config", cfg), map[string]string{"empty": "captured", "a": "captured", "b": "captured"})
	e.env["READIE_TEST_KEY_PART"] = "two"
	plan, dropped = e.plan("--config", cfg, "--only", "a")
	if dropped["b"] != "changed since the output: pass_env" || !strings.Contains(plan["a"], "pass_env") {
		t.Errorf("plan after a pass_env change: %v, dropped %v", plan, dropped)
	}
	code, stdout, stderr := e.run("capture", "--config", cfg, "--only", "a")
	if code != exitOK || !strings.Contains(stderr, "dropped from the output") || !strings.Contains(stderr, "set=b") {
		t.Fatalf("exit %d; the run does not warn that b was dropped:\n%s%s", code, stdout, stderr)
	}
	wantStatuses(t, tableColumn(stdout, 1), map[string]string{"empty": "captured", "a": "captured"})
	e.verify(cfg)

	// Checkpoint options are part of the key too.
	text, _ = os.ReadFile(cfg)
	os.WriteFile(cfg, []byte(strings.Replace(string(text), "  restore_flags:", "  checkpoint_options: {compression: none}\n  restore_flags:", 1)), 0o644)
	wantStatuses(t, e.statuses("capture", "--config", cfg, "--only", "a"), map[string]string{"empty": "captured", "a": "captured"})

	// The hard links: a reused checkpoint adds no image bytes.
	m := e.manifest()
	stored, _ := os.Stat(filepath.Join(e.store, strings.TrimPrefix(m.Checkpoints[1].Key, "sha256:"), "pages.img"))
	inOutput, _ := os.Stat(filepath.Join(e.out, "a", "pages.img"))
	if stored == nil || inOutput == nil || !os.SameFile(stored, inOutput) {
		t.Error("the output's pages.img is not the store's (hard link)")
	}
}

// TestCorruptStoreEntryIsRecaptured: a changed byte in a stored pages.img (and so in every
// output linked to it) is found before reuse; the entry is removed and captured again, and
// the output verifies.
func TestCorruptStoreEntryIsRecaptured(t *testing.T) {
	t.Parallel()
	e := newIncrementalEnv(t)
	cfg := e.cfg.write(t)
	e.statuses("capture", "--config", cfg)
	key := e.manifest().Checkpoints[1].Key
	pages := filepath.Join(e.store, strings.TrimPrefix(key, "sha256:"), "pages.img")
	flipByte(t, pages, 4096)
	plan, _ := e.plan("--config", cfg)
	if !strings.Contains(plan["a"], "capture") || !strings.Contains(plan["a"], "corrupt") {
		t.Errorf("plan for a: %q", plan["a"])
	}
	code, stdout, stderr := runCLI(t, "capture", "--config", cfg)
	if code != exitOK || !strings.Contains(stderr, "removed a corrupt store entry") {
		t.Fatalf("exit %d\n%s%s", code, stdout, stderr)
	}
	wantStatuses(t, tableColumn(stdout, 1), map[string]string{"empty": "reused", "a": "captured", "b": "reused"})
	e.verify(cfg)
	code, stdout, _ = runCLI(t, "cache", "list", "--config", cfg)
	if code != exitOK || strings.Count(stdout, "sha256:") != 3 || !strings.Contains(stdout, key) {
		t.Errorf("cache list:\n%s", stdout)
	}
}

// TestUnreadableStoreEntryIsKept: an error reading a store entry (EISDIR here: its meta.json
// is a directory) says nothing about its content. plan says so; capture fails that set,
// naming the entry and the error, goes on with the others, and leaves the entry as it is;
// once it can be read again it is reused.
func TestUnreadableStoreEntryIsKept(t *testing.T) {
	t.Parallel()
	e := newIncrementalEnv(t)
	e.statuses("capture", "--config", e.cfg.write(t))
	key := e.manifest().Checkpoints[1].Key
	entry := filepath.Join(e.store, strings.TrimPrefix(key, "sha256:"))
	meta := filepath.Join(entry, manifest.MetaFileName)
	if err := os.Rename(meta, meta+".aside"); err != nil {
		t.Fatal(err)
	}
	os.Mkdir(meta, 0o700)
	// Another output: nothing comes from an output, the store is asked.
	e.cfg.output = filepath.Join(e.dir, "out2")
	cfg := e.cfg.write(t)
	plan, _ := e.plan("--config", cfg)
	if !strings.HasPrefix(plan["a"], "capture") || !strings.Contains(plan["a"], "cannot be read") {
		t.Errorf("plan for a: %q", plan["a"])
	}
	code, stdout, stderr := runCLI(t, "capture", "--config", cfg)
	if code != exitFailed || !strings.Contains(stderr, entry) || !strings.Contains(stderr, "is a directory") {
		t.Fatalf("exit %d\n%s%s", code, stdout, stderr)
	}
	wantStatuses(t, tableColumn(stdout, 1), map[string]string{"empty": "reused", "a": "failed", "b": "reused"})
	if _, err := os.Stat(filepath.Join(entry, "pages.img")); err != nil {
		t.Fatalf("the entry was removed on an I/O error: %v", err)
	}
	os.Remove(meta)
	os.Rename(meta+".aside", meta)
	wantStatuses(t, e.statuses("capture", "--config", cfg), map[string]string{"empty": "reused", "a": "reused", "b": "reused"})
}

// TestConcurrentCapturesShareOneEntry: two runs capture the same sets into two outputs at the
// same time (--recapture: each captures, whatever the other has put into the store already,
// so both commit the same keys); both succeed, the store holds one entry per key and nothing
// pending, and both outputs link to it.
func TestConcurrentCapturesShareOneEntry(t *testing.T) {
	t.Parallel()
	e := newIncrementalEnv(t)
	e.cfg.sets = "  - id: a\n    imports: [json]\n"
	cfgs := []string{e.cfg.write(t)}
	other := e.cfg
	other.output = filepath.Join(e.dir, "out2")
	cfgs = append(cfgs, other.write(t))
	var runs []*process
	for _, cfg := range cfgs {
		p := startPipeline(t, "capture", "--config", cfg, "--recapture")
		p.drain()
		runs = append(runs, p)
	}
	for i, p := range runs {
		if code := p.wait(t, 3*time.Minute); code != exitOK {
			t.Fatalf("run %d: exit %d\n%s", i, code, p.all.String())
		}
		for _, set := range []string{"empty", "a"} {
			if !strings.Contains(p.all.String(), "msg=captured set="+set+" ") {
				t.Errorf("run %d did not capture %s:\n%s", i, set, p.all.String())
			}
		}
	}
	entries, _ := os.ReadDir(e.store)
	var keys, others []string
	for _, d := range entries {
		switch {
		case !strings.HasPrefix(d.Name(), "."):
			keys = append(keys, d.Name())
		case d.Name() != lease.RunsDir:
			others = append(others, d.Name()) // a pending entry left behind
		}
	}
	if len(keys) != 2 || len(others) != 0 {
		t.Fatalf("store holds %v, want one entry for empty and one for a, and nothing pending", entries)
	}
	for _, cfg := range cfgs {
		e.verify(cfg)
	}
	for _, out := range []string{e.out, other.output} {
		m, err := manifest.Load(filepath.Join(out, manifest.FileName))
		if err != nil {
			t.Fatal(err)
		}
		for _, c := range m.Checkpoints {
			stored, _ := os.Stat(filepath.Join(e.store, strings.TrimPrefix(c.Key, "sha256:"), "pages.img"))
			linked, _ := os.Stat(filepath.Join(out, c.Dir, "pages.img"))
			if stored == nil || linked == nil || !os.SameFile(stored, linked) {
				t.Errorf("%s/%s is not the store's entry", out, c.ID)
			}
		}
	}
}

// TestSetFlagBadInput: a bad --set exits 2 and changes nothing.
func TestSetFlagBadInput(t *testing.T) {
	t.Parallel()
	dir := t.TempDir()
	cfg := testConfig{runsc: "/x", root: filepath.Join(dir, "root"), rootfs: "/f", output: filepath.Join(dir, "out")}.write(t)
	for _, arg := range []string{"torch", "empty=json", "to/rch=json", "torch=", "torch=scikit-learn"} {
		for _, command := range []string{"capture", "plan"} {
			code, _, stderr := runCLI(t, command, "--config", cfg, "--set", arg)
			if code != exitUsage || !strings.Contains(stderr, "--set") {
				t.Errorf("%s --set %s: exit %d\n%s", command, arg, code, stderr)
			}
		}
	}
	if entries, _ := os.ReadDir(dir); len(entries) != 0 {
		t.Errorf("bad input changed the disk: %v", entries)
	}
}

// TestKeptTimingsUnderOtherSettings: when restore_runs (or the restore flags) changed since
// kept timings were measured, plan and the summary say so and point at --remeasure.
func TestKeptTimingsUnderOtherSettings(t *testing.T) {
	t.Parallel()
	e := newIncrementalEnv(t)
	cfg := e.cfg.write(t) // restore_runs: 2
	e.statuses("capture", "--config", cfg)
	if w := e.manifest().Checkpoints[1].MeasuredWith; w == nil || w.Runs != 2 || !slices.Equal(w.RestoreFlags, []string{"-direct"}) {
		t.Fatalf("measured_with %+v", w)
	}
	code, stdout, stderr := runCLI(t, "plan", "--config", cfg, "--runs", "1", "--log-format", "json")
	if code != exitOK || !strings.Contains(stdout, `"timings": "kept timings were measured with 2 runs and restore flags [-direct], this run uses 1 and [-direct]: --remeasure times them again"`) {
		t.Fatalf("plan --runs 1: exit %d\n%s%s", code, stdout, stderr)
	}
	code, stdout, stderr = runCLI(t, "capture", "--config", cfg, "--runs", "1")
	if code != exitOK {
		t.Fatalf("capture --runs 1: exit %d\n%s", code, stderr)
	}
	wantStatuses(t, tableColumn(strings.Split(stdout, "\n*")[0], 1), map[string]string{"empty": "reused*", "a": "reused*", "b": "reused*"})
	if !strings.Contains(stdout, "* a: kept timings were measured with 2 runs") || !strings.Contains(stderr, "--remeasure") {
		t.Errorf("the summary does not say the timings are from other settings:\n%s%s", stdout, stderr)
	}
	// Nothing to say once they are measured again.
	code, stdout, stderr = runCLI(t, "capture", "--config", cfg, "--runs", "1", "--remeasure")
	if code != exitOK || strings.Contains(stdout, "*") {
		t.Fatalf("capture --remeasure: exit %d\n%s%s", code, stdout, stderr)
	}
	if c := e.manifest().Checkpoints[1]; len(c.RestoreMS.Runs) != 1 || c.MeasuredWith.Runs != 1 {
		t.Errorf("after --remeasure: %+v %+v", c.RestoreMS, c.MeasuredWith)
	}
}
