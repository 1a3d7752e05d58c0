package main

import (
	"bytes"
	"encoding/json"
	"fmt"
	"maps"
	"os"
	"path/filepath"
	"runtime"
	"slices"
	"strings"
	"testing"

	"readie.dev/pipeline/internal/bench"
	"readie.dev/pipeline/internal/testenv"
	"readie.dev/pipeline/pkg/atomicfile"
	"readie.dev/pipeline/pkg/manifest"
	"readie.dev/pipeline/pkg/runsc"
	"readie.dev/pipeline/pkg/sandbox"
)

// runCLI runs the command in-process and returns its exit code, stdout and stderr.
func runCLI(t *testing.T, args ...string) (int, string, string) {
	t.Helper()
	var stdout, stderr bytes.Buffer
	code := dispatch(args, &stdout, &stderr, nil)
	return code, stdout.String(), stderr.String()
}

type testConfig struct {
	runsc, root, rootfs, output string
	sets                        string
	// store is the checkpoint store; default: "store" beside the output.
	store string
	// analysisCache, when set, is the analysis cache (default: the user's), so that a capture
	// finds no analysis another run left there.
	analysisCache string
}

func (c testConfig) write(t *testing.T) string {
	t.Helper()
	sets := c.sets
	if sets == "" {
		sets = "  - id: pandas\n    imports: [pandas]\n"
	}
	if c.store == "" {
		c.store = filepath.Join(filepath.Dir(c.output), "store")
	}
	analysis := ""
	if c.analysisCache != "" {
		analysis = fmt.Sprintf("analysis:\n  cache: %s\n", c.analysisCache)
	}
	text := fmt.Sprintf(`runsc:
  path: %s
  root: %s
  network: none
  overlay: none
  host_uds: create
  restore_flags: ["-direct"]
rootfs: %s
output: %s
checkpoint_cache: %s
restore_runs: 2
timeouts:
  capture: 3m
  restore: 1m
  smoke: 1m
  runsc_command: 30s
%scheckpoints:
%s`, c.runsc, c.root, c.rootfs, c.output, c.store, analysis, sets)
	path := filepath.Join(t.TempDir(), "pipeline.yaml")
	if err := os.WriteFile(path, []byte(text), 0o644); err != nil {
		t.Fatal(err)
	}
	return path
}

// runscRoot is a private runsc root inside dir; after the test, nothing may be left of its
// sandboxes (testenv.CheckNoRunsc: runsc list and processes), and it is removed (with runsc's
// mount in it).
func runscRoot(t *testing.T, dir string) string {
	t.Helper()
	root := filepath.Join(dir, "root")
	t.Cleanup(func() {
		if !testing.Short() { // -short runs no sandbox, and has no runsc to list with
			testenv.CheckNoRunsc(t, testenv.RunscPath(t), root, "")
		}
		if err := testenv.RemoveRunscRoot(root); err != nil {
			t.Error(err)
		}
	})
	return root
}

func TestUsageErrorsExit2(t *testing.T) {
	t.Parallel()
	dir := t.TempDir()
	file := filepath.Join(dir, "a-file")
	os.WriteFile(file, []byte("x"), 0o644)
	badYAML := filepath.Join(dir, "bad.yaml")
	os.WriteFile(badYAML, []byte("runsc:\n  path: [unclosed\n"), 0o644)
	fakeRunsc := filepath.Join(dir, "runsc")
	os.WriteFile(fakeRunsc, []byte("#!/bin/sh\necho 'runsc version test'\n"), 0o755)
	emptyRoot := filepath.Join(dir, "no-rootfs")

	tests := []struct {
		name string
		args []string
		want string
	}{
		{"no command", nil, "usage"},
		{"unknown command", []string{"frobnicate"}, `unknown command "frobnicate"`},
		{"unknown flag", []string{"capture", "--bogus"}, "flag provided but not defined: --bogus"},
		{"stray argument", []string{"verify", "--config", testConfig{runsc: "/x", root: "/r", rootfs: "/f", output: dir}.write(t), dir, "extra"}, "unexpected arguments: extra"},
		{"stray argument, no positional", []string{"version", "extra"}, "unexpected arguments: extra"},
		{"a flag of another command", []string{"version", "--runs", "3"}, "flag provided but not defined: --runs"},
		{"--only on verify", []string{"verify", "--only", "numpy"}, "flag provided but not defined: --only"},
		{"a flag after OUT is a flag", []string{"verify", dir, "--only", "numpy"}, "flag provided but not defined: --only"},
		{"-- ends the flags", []string{"verify", "--", dir, "--only"}, "unexpected arguments: --only"},
		{"--out and OUT disagree", []string{"verify", "--out", dir, filepath.Join(dir, "other")}, "disagree"},
		{"bad --set", []string{"plan", "--set", "x=a b"}, `invalid value "x=a b" for flag --set`},
		{"unknown cache command", []string{"cache", "frob"}, `unknown command "frob"`},
		{"bad log format", []string{"version", "--log-format", "xml"}, "--log-format"},
		{"yaml syntax", []string{"capture", "--config", badYAML}, "bad.yaml: yaml: line 1: did not find expected"},
		{"missing config", []string{"capture", "--config", filepath.Join(dir, "absent.yaml")}, "absent.yaml"},
		{"missing runsc", []string{"capture", "--config", testConfig{runsc: filepath.Join(dir, "nope"), root: dir + "/root", rootfs: emptyRoot, output: dir + "/out"}.write(t)}, "make runsc"},
		{"missing rootfs", []string{"capture", "--config", testConfig{runsc: fakeRunsc, root: dir + "/root", rootfs: emptyRoot, output: dir + "/out"}.write(t)}, "make image"},
		{"negative runs", []string{"capture", "--runs", "-1", "--config", testConfig{runsc: fakeRunsc, root: dir + "/root", rootfs: emptyRoot, output: dir + "/out"}.write(t)}, "--runs"},
		// The rootfs is missing too: --only is checked first, before anything outside the config.
		{"unknown --only", []string{"capture", "--only", "nope", "--config", testConfig{runsc: fakeRunsc, root: dir + "/root", rootfs: emptyRoot, output: dir + "/out"}.write(t)}, "--only names unknown package sets: nope"},
		{"unknown --only, bench --capture", []string{"bench", "--capture", "--only", "nope", "--config", testConfig{runsc: fakeRunsc, root: dir + "/root", rootfs: emptyRoot, output: dir + "/out"}.write(t)}, "--only names unknown package sets: nope"},
		{"--soak with --rounds", []string{"bench", "--soak", "100", "--rounds", "3", "--explain"}, "--soak restores and calls the output's checkpoints, nothing else: --explain, --rounds cannot go with it"},
		{"--soak with two concurrencies", []string{"bench", "--soak", "30m", "--concurrency", "1,2"}, `--concurrency "1,2" (with --soak: one number, 1 to 256)`},
		{"--soak neither count nor duration", []string{"bench", "--soak", "lots"}, `--soak "lots": want a number of restores (5000) or a duration (30m)`},
		{"--soak-kill-every alone", []string{"bench", "--soak-kill-every", "100"}, "--soak-kill-every goes with --soak"},
		{"bench --runs without --capture", []string{"bench", "--runs", "3"}, "--runs: only with --capture"},
		{"bench --clean-failed without --capture", []string{"bench", "--clean-failed", "--soak", "5"}, "--clean-failed: only with --capture"},
		{"verify missing output", []string{"verify", "--config", testConfig{runsc: "/x", root: "/r", rootfs: "/f", output: filepath.Join(dir, "none")}.write(t)}, "does not exist"},
		{"spec bad mode", []string{"spec", "--mode", "party", "--config", testConfig{runsc: "/x", root: "/r", rootfs: "/f", output: dir}.write(t)}, `-mode "party": want capture, measure or sandbox`},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			code, _, stderr := runCLI(t, tt.args...)
			if code != exitUsage {
				t.Fatalf("exit %d, want 2; stderr:\n%s", code, stderr)
			}
			if !strings.Contains(stderr, tt.want) {
				t.Fatalf("stderr does not say %q:\n%s", tt.want, stderr)
			}
		})
	}
	if entries, _ := os.ReadDir(dir); len(entries) != 3 {
		var names []string
		for _, e := range entries {
			names = append(names, e.Name())
		}
		t.Errorf("bad input changed the disk: %v", names)
	}
}

func TestOutputIsAFileExit2(t *testing.T) {
	t.Parallel()
	dir := testenv.WorkDir(t)
	out := filepath.Join(dir, "out")
	os.WriteFile(out, []byte("not a directory"), 0o644)
	cfg := testConfig{runsc: testenv.RunscPath(t), root: runscRoot(t, dir), rootfs: testenv.Rootfs(t), output: out}.write(t)
	code, _, stderr := runCLI(t, "capture", "--config", cfg)
	if code != exitUsage || !strings.Contains(stderr, "not a directory") {
		t.Fatalf("exit %d, stderr:\n%s", code, stderr)
	}
	if data, _ := os.ReadFile(out); string(data) != "not a directory" {
		t.Fatal("the file was changed")
	}
}

// TestCaptureVerify runs the command end to end under real gVisor: capture pandas (and the
// empty set) without an analysis, select on its catalogue (by image size), verify, then catch a
// changed byte in pages.img.
func TestCaptureVerify(t *testing.T) {
	t.Parallel()
	dir := testenv.WorkDir(t)
	root := runscRoot(t, dir)
	out := filepath.Join(dir, "out")
	cfg := testConfig{runsc: testenv.RunscPath(t), root: root, rootfs: testenv.Rootfs(t), output: out, analysisCache: filepath.Join(dir, "analysis-cache")}.write(t)

	code, stdout, stderr := runCLI(t, "capture", "--config", cfg, "--log-format", "json")
	if code != exitOK {
		t.Fatalf("capture exit %d\n%s", code, stderr)
	}
	for _, line := range strings.Split(strings.TrimSpace(stderr), "\n") {
		var entry map[string]any
		if err := json.Unmarshal([]byte(line), &entry); err != nil {
			t.Fatalf("--log-format json wrote a non-JSON line: %q", line)
		}
	}
	if !strings.Contains(stdout, "pandas") || !strings.Contains(stdout, "ok") {
		t.Errorf("summary table:\n%s", stdout)
	}
	m, err := manifest.Load(filepath.Join(out, manifest.FileName))
	if err != nil {
		t.Fatal(err)
	}
	if m.ExecutorProtocol != 2 || len(m.Checkpoints) != 2 || m.Checkpoints[0].ID != "empty" || m.Checkpoints[1].ID != "pandas" {
		t.Fatalf("manifest %+v", m)
	}
	for _, c := range m.Checkpoints {
		if !c.Smoke.OK || c.Smoke.ReadyMS <= 0 || len(c.RestoreMS.Runs) != 2 || c.Bytes == 0 {
			t.Errorf("checkpoint %+v", c)
		}
	}
	testenv.CheckNoRunsc(t, testenv.RunscPath(t), root, "")
	for _, pattern := range []string{".staging-*", ".old-*"} {
		if matches, _ := filepath.Glob(out + pattern); len(matches) != 0 {
			t.Errorf("staging or old output left: %v", matches)
		}
	}
	// The lock file stays, released (empty): removing it would race with a starting run.
	if data, err := os.ReadFile(out + ".lock"); err != nil || len(data) != 0 {
		t.Errorf("lock file after the run: %q, %v", data, err)
	}

	checkSelectBySize(t, cfg, out, m)

	if code, stdout, stderr := runCLI(t, "verify", "--config", cfg); code != exitOK || !strings.Contains(stdout, "2 checkpoints verified") {
		t.Fatalf("verify exit %d\n%s%s", code, stdout, stderr)
	}
	if code, _, stderr := runCLI(t, "smoke", "--config", cfg, "--only", "pandas"); code != exitOK {
		t.Fatalf("smoke exit %d\n%s", code, stderr)
	}

	// An output is immutable: its files say so (image files are shared with the store).
	pages := filepath.Join(out, "pandas", "pages.img")
	for path, want := range map[string]os.FileMode{pages: 0o400, filepath.Join(out, manifest.FileName): 0o444,
		filepath.Join(out, "pandas", manifest.MetaFileName): 0o444, filepath.Join(out, manifest.RestoreSpecFileName): 0o444} {
		if fi, err := os.Stat(path); err != nil || fi.Mode().Perm() != want {
			t.Errorf("%s: mode %v (%v), want %v", path, fi.Mode().Perm(), err, want)
		}
	}
	// Root writes it anyway: verify names the file, and the store entry it shares.
	flipByte(t, pages, 4096)
	code, _, stderr = runCLI(t, "verify", "--config", cfg)
	if code != exitFailed || !strings.Contains(stderr, pages) || !strings.Contains(stderr, "shares pages.img with the store entry "+filepath.Join(filepath.Dir(out), "store")) {
		t.Fatalf("verify after tampering: exit %d\n%s", code, stderr)
	}
}

// TestBenchShort runs `pipeline bench` for real: 2 rounds, one set, with the variants and the
// breakdown, and checks the table, bench.json and bench.svg.
func TestBenchShort(t *testing.T) {
	t.Parallel()
	dir := testenv.WorkDir(t)
	out := filepath.Join(dir, "out")
	cfg := testConfig{runsc: testenv.RunscPath(t), root: runscRoot(t, dir), rootfs: testenv.Rootfs(t), output: out,
		sets: "  - id: small\n    imports: [json, email.parser]\n"}.write(t)
	code, stdout, stderr := runCLI(t, "bench", "--config", cfg, "--capture", "--only", "small", "--rounds", "2", "--explain")
	if code != exitOK {
		t.Fatalf("bench: exit %d\n%s", code, stderr)
	}
	// Only the capture wrote the manifest: its restore flags are the config's.
	captured, err := os.ReadFile(filepath.Join(out, manifest.FileName))
	if err != nil {
		t.Fatal(err)
	}
	if m, err := manifest.Load(filepath.Join(out, manifest.FileName)); err != nil || m.RestoreFlagsConcurrency != 0 || strings.Join(m.RestoreFlags, " ") != "-direct" {
		t.Errorf("the bench changed the manifest: %+v, %v", m, err)
	}
	for _, want := range []string{"floor", "cold", "restore", "prestarted", "pooled", "warm", "measure", "variant:-direct", "cold/restore", "pooled/floor", "warm/floor", "resident MiB", "spawn",
		// One set is one image size: no line can be fitted, and the table says so.
		"no cost model: it needs at least two image sizes, and 1 set was measured"} {
		if !strings.Contains(stdout, want) {
			t.Errorf("the bench table lacks %q:\n%s", want, stdout)
		}
	}
	latest := filepath.Join(out, "bench", "latest")
	data, err := os.ReadFile(filepath.Join(latest, "bench.json"))
	if err != nil {
		t.Fatal(err)
	}
	var report struct {
		Machine struct{ CPUs int } `json:"machine"`
		Runsc   struct{ Version string }
		Rounds  int `json:"rounds"`
		Sets    []struct {
			ID     string
			Series map[string]struct {
				Runs          []float64
				P50, P90, P99 *float64
				RestoreCPU    []float64 `json:"restore_cpu_ms"`
			}
			Ratios   map[string]float64
			Resident map[string]int64 `json:"resident_bytes"`
		} `json:"sets"`
		Fit     struct{ Points int } `json:"fit"`
		Explain []struct {
			Path  string  `json:"path"`
			Total float64 `json:"total_ms"`
		} `json:"explain"`
		Concurrency []struct {
			Series      string
			Concurrency int
			Latency     struct{ Runs []float64 } `json:"latency_ms"`
			Throughput  float64                  `json:"restores_per_second"`
			SpreadMS    float64                  `json:"start_spread_ms"`
		} `json:"concurrency"`
		Recommendation string
		Load           struct {
			Before, After float64
			During        []float64
		}
		RecommendedRestoreFlags *[]string `json:"recommended_restore_flags"`
		RecommendedAt           int       `json:"recommended_at"`
	}
	if err := json.Unmarshal(data, &report); err != nil {
		t.Fatal(err)
	}
	if report.Machine.CPUs < 1 || report.Runsc.Version == "" || report.Rounds != 2 || len(report.Sets) != 1 || report.Sets[0].ID != "small" {
		t.Fatalf("bench.json: %+v", report)
	}
	for name, s := range report.Sets[0].Series {
		if len(s.Runs) != 2 {
			t.Errorf("series %s has %d runs, want 2", name, len(s.Runs))
		}
		if s.P50 == nil || s.P90 == nil || s.P99 == nil || *s.P50 > *s.P90 || *s.P90 > *s.P99 {
			t.Errorf("series %s: p50 %v, p90 %v, p99 %v", name, s.P50, s.P90, s.P99)
		}
		// A variant restored into a sandbox of its own making logs its restore's CPU time.
		ownSandbox := strings.HasPrefix(name, bench.VariantPrefix) && !strings.HasSuffix(name, bench.LastPageSuffix) && report.Sets[0].Series[name+bench.LastPageSuffix].Runs != nil
		if ownSandbox && (len(s.RestoreCPU) != len(s.Runs) || slices.Min(s.RestoreCPU) <= 0) {
			t.Errorf("series %s: restore CPU times %v beside runs %v", name, s.RestoreCPU, s.Runs)
		}
	}
	if report.Load.Before < 0 || report.Load.During == nil && report.Load.After < 0 {
		t.Errorf("bench.json's load: %+v", report.Load)
	}
	// --explain breaks down a restore, the pooled path (a restore onto a created sandbox) and
	// the warm path (a sandbox restored ahead).
	// 7 core series, the 9 default variants and each variant's time to its last page loaded.
	if len(report.Sets[0].Series) != 25 || report.Sets[0].Ratios["cold/restore"] <= 0 || report.Sets[0].Ratios["pooled/floor"] <= 0 || report.Sets[0].Ratios["warm/floor"] <= 0 ||
		len(report.Explain) != 3 || report.Explain[0].Total <= 0 || report.Explain[0].Path != "restore" || report.Explain[1].Path != "pooled" || report.Explain[1].Total <= 0 ||
		report.Explain[2].Path != "warm" || report.Explain[2].Total <= 0 {
		t.Errorf("bench.json: %d series, ratios %v, explain %+v", len(report.Sets[0].Series), report.Sets[0].Ratios, report.Explain)
	}
	// The warm series' sandbox holds memory, measured by /proc: at least the runsc binary's.
	if resident := report.Sets[0].Resident["warm"]; resident < 1<<20 {
		t.Errorf("bench.json: the warm sandbox's resident memory %d bytes", resident)
	}
	// K restores at once, released by one barrier: every restore of every batch answered; how
	// far apart they started is measured and logged (never asserted: it is a timing).
	if len(report.Concurrency) != 7*2 || report.Recommendation == "" {
		t.Errorf("concurrency %+v, recommendation %q", report.Concurrency, report.Recommendation)
	}
	// The flags fastest at bench.concurrency (the number of CPUs by default) are in bench.json,
	// and the summary gives the config line that restores with them.
	if report.RecommendedRestoreFlags == nil || report.RecommendedAt != runtime.NumCPU() ||
		!strings.Contains(stdout, bench.RestoreFlagsLine(*report.RecommendedRestoreFlags)) {
		t.Errorf("recommended flags %v at %d; the summary says:\n%s", report.RecommendedRestoreFlags, report.RecommendedAt, stdout)
	}
	for _, c := range report.Concurrency {
		if len(c.Latency.Runs) != 2*c.Concurrency || c.Throughput <= 0 {
			t.Errorf("%s at %d: %d restores, %.2f/s", c.Series, c.Concurrency, len(c.Latency.Runs), c.Throughput)
		}
		if c.Concurrency > 1 {
			t.Logf("%s: %d restores released by one barrier started within %.2f ms of each other", c.Series, c.Concurrency, c.SpreadMS)
		}
	}
	t.Log(report.Recommendation)
	svg, err := os.ReadFile(filepath.Join(latest, "bench.svg"))
	if err != nil || !bytes.Contains(svg, []byte("<svg")) || !bytes.Contains(svg, []byte("prestarted")) {
		t.Fatalf("bench.svg: %v", err)
	}
	// The chart of the real run: no text over a mark or another text, nothing cut at an edge,
	// every series of bench.json named.
	var named []string
	for name := range report.Sets[0].Series {
		named = append(named, name)
	}
	for _, c := range report.Concurrency {
		named = append(named, c.Series)
	}
	if err := bench.CheckChart(svg, named); err != nil {
		t.Errorf("bench.svg's layout: %v", err)
	}
	if dir := os.Getenv("READIE_CHART_DIR"); dir != "" { // to look at it: rsvg-convert
		os.WriteFile(filepath.Join(dir, "bench-short.svg"), svg, 0o644)
	}
	txt, err := os.ReadFile(filepath.Join(latest, "bench.txt"))
	for _, key := range []string{"goos: " + runtime.GOOS, "goarch: " + runtime.GOARCH, "date: 20", "rounds: 2", "cpu: ", "runsc: " + report.Runsc.Version, "revision: ", "load: before "} {
		if !bytes.Contains(txt, []byte("\n"+key)) && !bytes.HasPrefix(txt, []byte(key)) {
			t.Errorf("bench.txt's header lacks %q", key)
		}
	}
	if err != nil || bytes.Count(txt, []byte("\nBenchmarkRestore/set=small/series=")) != 25*2 || bytes.Count(txt, []byte(":last-page/conc=1 ")) != 9*2 || bytes.Count(txt, []byte("\nBenchmarkRestore/set=small/series=pooled/conc=1 ")) != 2 || bytes.Count(txt, []byte("\nBenchmarkRestore/set=small/series=warm/conc=1 ")) != 2 || bytes.Count(txt, []byte("\nBenchmarkRestoreAtOnce/set=small/series=")) != 7*(2*1+2*2) {
		t.Errorf("bench.txt: %v\n%s", err, txt)
	}
	// A second run keeps the first: history, not overwrite; latest follows the new one. Its
	// report on stdout is one JSON document with --log-format json.
	first, _ := os.Readlink(latest)
	code, stdout, stderr = runCLI(t, "bench", "--config", cfg, "--only", "small", "--rounds", "1", "--variants=false", "--concurrency", "", "--log-format", "json")
	if code != exitOK {
		t.Fatalf("second bench: %s", stderr)
	}
	var again bench.Report
	if err := decodeOne(stdout, &again); err != nil || len(again.Sets) != 1 || again.Sets[0].ID != "small" || again.Sets[0].Series["pooled"].Median <= 0 {
		t.Errorf("second bench's JSON: %v\n%s", err, stdout)
	}
	runs, _ := filepath.Glob(filepath.Join(out, "bench", "2*"))
	second, _ := os.Readlink(latest)
	if len(runs) != 2 || second == first || filepath.Base(runs[0]) != first && filepath.Base(runs[1]) != first {
		t.Errorf("bench runs %v, latest %s then %s", runs, first, second)
	}
	if after, _ := os.ReadFile(filepath.Join(out, manifest.FileName)); !bytes.Equal(after, captured) {
		t.Errorf("a bench rewrote manifest.json:\n%s\nwas:\n%s", after, captured)
	}
	m, err := manifest.Load(filepath.Join(out, manifest.FileName))
	if err != nil {
		t.Fatal(err)
	}
	// The empty set and small: two sizes, so the cost model has a slope.
	if m.AlphaMsPerMiB == 0 {
		t.Errorf("manifest alpha_ms_per_mib %v", m.AlphaMsPerMiB)
	}
}

// TestExistingOutputRestoresAsRecorded: measure and smoke on an existing output restore with
// what its manifest records, whatever the config says now, and refuse (exit 2, naming the
// field and both values) a runsc, rootfs or spec shape that differs from the manifest's.
func TestExistingOutputRestoresAsRecorded(t *testing.T) {
	t.Parallel()
	dir := testenv.WorkDir(t)
	out := filepath.Join(dir, "out")
	tc := testConfig{runsc: testenv.RunscPath(t), root: runscRoot(t, dir), rootfs: testenv.Rootfs(t), output: out,
		sets: "  - id: small\n    imports: [json]\n"}
	cfg := tc.write(t)
	if code, _, stderr := runCLI(t, "capture", "--config", cfg); code != exitOK {
		t.Fatalf("capture: exit %d\n%s", code, stderr)
	}
	// The config changes afterwards: other restore flags (the timings would record them),
	// another network and a rootfs that does not exist (restoring with either would fail).
	data, _ := os.ReadFile(cfg)
	edited := strings.NewReplacer(`restore_flags: ["-direct"]`, `restore_flags: ["-background"]`,
		"network: none", "network: sandbox", "rootfs: "+tc.rootfs, "rootfs: "+filepath.Join(dir, "gone")).Replace(string(data))
	os.WriteFile(cfg, []byte(edited), 0o644)
	for _, args := range [][]string{{"measure", "--runs", "1"}, {"smoke"}} {
		if code, _, stderr := runCLI(t, append(args, "--config", cfg)...); code != exitOK {
			t.Fatalf("%s after a config edit: exit %d\n%s", args[0], code, stderr)
		}
	}
	m, err := manifest.Load(filepath.Join(out, manifest.FileName))
	var flags sandbox.Flags
	if err == nil {
		flags, err = m.Flags()
	}
	if err != nil || strings.Join(m.RestoreFlags, " ") != "-direct" || flags.Network != "none" {
		t.Fatalf("the manifest no longer says how its checkpoints were made: %+v %v", m, err)
	}
	// The helpers runsc booted the sandboxes with, by digest: both of gvisor-bin/ beside it.
	helpers, err := (&runsc.Runsc{Path: tc.runsc}).Helpers()
	if err != nil || len(helpers) != len(runsc.HelperNames()) || !maps.Equal(m.Runsc.Helpers, helpers) {
		t.Errorf("the manifest records the helpers %v; beside runsc: %v, %v", m.Runsc.Helpers, helpers, err)
	}
	for _, c := range m.Checkpoints {
		if c.MeasuredWith == nil || strings.Join(c.MeasuredWith.RestoreFlags, " ") != "-direct" {
			t.Errorf("%s was timed with the config's restore flags, not the manifest's: %+v", c.ID, c.MeasuredWith)
		}
	}

	// Each recorded value that differs from what is on hand stops the run, names the field.
	manifestPath := filepath.Join(out, manifest.FileName)
	original, _ := os.ReadFile(manifestPath)
	for _, tt := range []struct {
		field, onHand, recorded string
		change                  func(m *manifest.Manifest)
	}{
		{"runsc.sha256", m.Runsc.SHA256, "sha256:recorded", func(m *manifest.Manifest) { m.Runsc.SHA256 = "sha256:recorded" }},
		{"runsc.helpers", m.Runsc.HelpersText(), "gvisor_sentry=sha256:recorded", func(m *manifest.Manifest) {
			m.Runsc.Helpers = map[string]string{"gvisor_sentry": "sha256:recorded"}
		}},
		{"rootfs.digest", m.Rootfs.Digest, "sha256:recorded", func(m *manifest.Manifest) { m.Rootfs.Digest = "sha256:recorded" }},
		{"spec_fingerprint", m.SpecFingerprint, "sha256:recorded", func(m *manifest.Manifest) { m.SpecFingerprint = "sha256:recorded" }},
	} {
		changed, _ := manifest.Load(manifestPath)
		tt.change(changed)
		atomicfile.WriteJSON(manifestPath, changed)
		code, _, stderr := runCLI(t, "measure", "--config", cfg, "--runs", "1")
		if code != exitUsage || !strings.Contains(stderr, tt.field) || !strings.Contains(stderr, tt.onHand+" on hand, "+tt.recorded+" in the manifest") {
			t.Errorf("%s changed: exit %d, want 2 naming it and both values\n%s", tt.field, code, stderr)
		}
		os.WriteFile(manifestPath, original, 0o644)
	}
}

// TestCachePruneRootfs: only rootfs directories that neither the config nor a named output
// uses are removed, and --dry-run removes nothing.
func TestCachePruneRootfs(t *testing.T) {
	cacheHome := t.TempDir()
	t.Setenv("XDG_CACHE_HOME", cacheHome)
	rootfsDir := filepath.Join(cacheHome, "readie", "rootfs")
	used := filepath.Join(rootfsDir, "sha256-aaaa", "rootfs")
	unused := filepath.Join(rootfsDir, "sha256-bbbb", "rootfs")
	configs := filepath.Join(rootfsDir, "sha256-cccc", "rootfs")
	for _, d := range []string{used, unused, configs} {
		os.MkdirAll(d, 0o755)
	}
	out := filepath.Join(t.TempDir(), "out")
	os.MkdirAll(out, 0o755)
	atomicfile.WriteJSON(filepath.Join(out, manifest.FileName), &manifest.Manifest{ExecutorProtocol: 2, Rootfs: manifest.Rootfs{Path: used}})
	cfg := testConfig{runsc: "/x", root: "/r", rootfs: configs, output: out}.write(t)

	code, stdout, stderr := runCLI(t, "cache", "prune-rootfs", "--dry-run", "--config", cfg, out)
	if code != exitOK || strings.TrimSpace(stdout) != "would remove "+filepath.Dir(unused) {
		t.Fatalf("dry run: exit %d\n%s%s", code, stdout, stderr)
	}
	if _, err := os.Stat(unused); err != nil {
		t.Fatal("the dry run removed a directory")
	}
	if code, _, stderr := runCLI(t, "cache", "prune-rootfs", "--config", cfg, filepath.Join(t.TempDir(), "no-output")); code != exitUsage {
		t.Fatalf("an output that cannot be read: exit %d, want 2\n%s", code, stderr)
	}
	if _, err := os.Stat(unused); err != nil {
		t.Fatal("a failed prune removed a directory")
	}
	if code, stdout, stderr := runCLI(t, "cache", "prune-rootfs", "--config", cfg, out); code != exitOK {
		t.Fatalf("prune: exit %d\n%s%s", code, stdout, stderr)
	}
	for path, want := range map[string]bool{used: true, configs: true, unused: false} {
		if _, err := os.Stat(path); (err == nil) != want {
			t.Errorf("%s present = %v, want %v", path, err == nil, want)
		}
	}
}

// flipByte changes the byte at offset of the file at path, in place (so every hard link of it
// sees the change).
func flipByte(t *testing.T, path string, offset int64) {
	t.Helper()
	f, err := os.OpenFile(path, os.O_RDWR, 0)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	b := make([]byte, 1)
	if _, err := f.ReadAt(b, offset); err != nil {
		t.Fatal(err)
	}
	b[0] ^= 0xff
	if _, err := f.WriteAt(b, offset); err != nil {
		t.Fatal(err)
	}
}

// TestBenchConfigVariants: the variants bench measures are the config's bench.variants: their
// names, their flags, and an image captured for the one with checkpoint options; a variant with
// a global flag and pre-checkpoint steps gets an image of its own that restores and answers
// (its objects frozen), also from a pool of sandboxes created with its flag; a -background
// variant is timed to its last page loaded too.
func TestBenchConfigVariants(t *testing.T) {
	t.Parallel()
	dir := testenv.WorkDir(t)
	out := filepath.Join(dir, "out")
	cfg := testConfig{runsc: testenv.RunscPath(t), root: runscRoot(t, dir), rootfs: testenv.Rootfs(t), output: out,
		sets: "  - id: small\n    imports: [json]\n"}.write(t)
	data, _ := os.ReadFile(cfg)
	os.WriteFile(cfg, append(data, []byte(`bench:
  variants:
    - {name: plain, restore_flags: []}
    - {name: zero, restore_flags: [-direct], checkpoint_options: {exclude-committed-zero-pages: "true"}}
    - {name: knobs, restore_flags: [-background], global_flags: [--host-settings=ignore], pre_checkpoint: [gc.collect, gc.freeze, malloc_trim]}
    - {name: knobs-pooled, global_flags: [--host-settings=ignore], pre_checkpoint: [gc.collect, gc.freeze, malloc_trim], pooled: true}
`)...), 0o644)
	if code, _, stderr := runCLI(t, "bench", "--config", cfg, "--capture", "--only", "small", "--rounds", "1"); code != exitOK {
		t.Fatalf("bench: exit %d\n%s", code, stderr)
	}
	data, err := os.ReadFile(filepath.Join(out, "bench", "latest", "bench.json"))
	if err != nil {
		t.Fatal(err)
	}
	var report struct {
		Series []string `json:"series"`
		Sets   []struct {
			VariantBytes map[string]int64          `json:"variant_bytes"`
			Series       map[string]manifest.Stats `json:"series"`
		} `json:"sets"`
	}
	json.Unmarshal(data, &report)
	want := "floor cold restore prestarted pooled warm measure variant:plain variant:zero variant:knobs variant:knobs-pooled " +
		"variant:plain:last-page variant:zero:last-page variant:knobs:last-page"
	if got := strings.Join(report.Series, " "); got != want {
		t.Errorf("series %q, want %q", got, want)
	}
	if len(report.Sets) != 1 || report.Sets[0].VariantBytes["exclude-committed-zero-pages=true"] <= 0 ||
		report.Sets[0].VariantBytes["flags=--host-settings=ignore,pre_checkpoint=gc.collect+gc.freeze+malloc_trim"] <= 0 || len(report.Sets[0].VariantBytes) != 2 {
		t.Fatalf("sets %+v", report.Sets)
	}
	series := report.Sets[0].Series
	for _, name := range []string{"variant:knobs", "variant:knobs-pooled", "variant:knobs:last-page"} {
		if st := series[name]; len(st.Runs) != 1 || st.Median <= 0 {
			t.Errorf("%s: %+v", name, st)
		}
	}
	// Without -background the pages are in before runsc restore returns: before the answer.
	if last, first := series["variant:plain:last-page"].Median, series["variant:plain"].Median; last > first {
		t.Errorf("plain: last page at %.1f ms, after the answer at %.1f ms", last, first)
	}
}

// TestConfigElsewhere: a config that holds only checkpoints:, in a directory far from the
// checkout, finds the runsc and the rootfs that `make runsc` and `make image` put in the cache.
func TestConfigElsewhere(t *testing.T) {
	rootfs := testenv.Rootfs(t)
	cache := filepath.Join(t.TempDir(), "cache")
	runsc := filepath.Join(cache, "readie", "runsc", "readie-20260905-160fafc42237", "runsc")
	os.MkdirAll(filepath.Dir(runsc), 0o755)
	os.MkdirAll(filepath.Join(cache, "readie", "rootfs"), 0o755)
	if err := os.Symlink(testenv.RunscPath(t), runsc); err != nil {
		t.Fatal(err)
	}
	if err := os.Symlink(rootfs, filepath.Join(cache, "readie", "rootfs", "default")); err != nil {
		t.Fatal(err)
	}
	t.Setenv("XDG_CACHE_HOME", cache)
	elsewhere := t.TempDir()
	cfg := filepath.Join(elsewhere, "mine.yaml")
	os.WriteFile(cfg, []byte("checkpoints:\n  - id: tiny\n    imports: [json]\n"), 0o644)
	code, stdout, stderr := runCLI(t, "plan", "--config", cfg, "--out", filepath.Join(elsewhere, "out"), "--log-format", "json")
	if code != exitOK {
		t.Fatalf("plan: exit %d\n%s", code, stderr)
	}
	var plan struct {
		Rootfs manifest.Rootfs `json:"rootfs"`
	}
	if err := json.Unmarshal([]byte(stdout), &plan); err != nil || plan.Rootfs.Path != rootfs {
		t.Fatalf("plan's rootfs %q (%v), want the cache's default %s\n%s", plan.Rootfs.Path, err, rootfs, stdout)
	}
}
