package main

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"maps"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/sirupsen/logrus"

	"readie.dev/pipeline/internal/analysis"
	"readie.dev/pipeline/internal/bench"
	"readie.dev/pipeline/internal/config"
	"readie.dev/pipeline/internal/run"
	"readie.dev/pipeline/internal/testenv"
	"readie.dev/pipeline/pkg/catalogue"
	"readie.dev/pipeline/pkg/catalogue/plan"
	"readie.dev/pipeline/pkg/manifest"
)

// A small corpus on the default image: numpy and pandas (and what pandas pulls in), modules the
// executor already holds (re, collections), a name imported from a module (pandas.DataFrame),
// one the image lacks, a request with no imports, and one that names package versions.
const smallCorpus = `{"imports": ["pandas", "numpy"], "weight": 3}
{"imports": ["numpy", "json"]}
{"imports": ["re", "collections"]}
{"imports": ["pandas.DataFrame"]}
{"imports": ["transformers.AutoModel"]}
{"imports": []}
{"imports": ["pandas"], "weight": 2, "packages": ["pandas>=1.5,<3", "numpy"]}
{"imports": ["numpy"]}
`

// catalogueConfig writes a config with one timed run per measurement, to keep the test short,
// and one checkpoint that holds pandas (and so numpy): which sets a plan chooses depends on the
// times measured in the run, so what must hold pandas is captured from the config.
func catalogueConfig(t *testing.T, dir string) string {
	t.Helper()
	text := fmt.Sprintf(`runsc:
  path: %s
  root: %s
rootfs: %s
output: %s
checkpoint_cache: %s
restore_runs: 1
timeouts:
  capture: 3m
  restore: 1m
  smoke: 1m
  runsc_command: 30s
analysis:
  runs: 1
  timeout: 2m
  cache: %s
checkpoints:
  - id: pandas
    imports: [pandas]
`, testenv.RunscPath(t), runscRoot(t, dir), testenv.Rootfs(t), filepath.Join(dir, "out"), filepath.Join(dir, "store"), filepath.Join(dir, "analysis-cache"))
	path := filepath.Join(dir, "pipeline.yaml")
	if err := os.WriteFile(path, []byte(text), 0o644); err != nil {
		t.Fatal(err)
	}
	return path
}

// TestAnalyzePlanCaptureSelect runs the stages for real on the default image: analyze (twice:
// the second measures nothing), capture of the config's set (packages and versions), plan-sets,
// capture --plan, the catalogue, Select's choice restored and answering with the request's
// modules loaded, and a short corpus replay.
func TestAnalyzePlanCaptureSelect(t *testing.T) {
	t.Parallel()
	dir := testenv.WorkDir(t)
	cfg := catalogueConfig(t, dir)
	out := filepath.Join(dir, "out")
	corpusPath := filepath.Join(dir, "corpus.jsonl")
	os.WriteFile(corpusPath, []byte(smallCorpus), 0o644)

	type analyzeReport struct {
		Modules     int               `json:"modules"`
		Measured    int               `json:"measured"`
		Cached      int               `json:"cached"`
		Sandboxes   int64             `json:"sandboxes"`
		Unavailable map[string]string `json:"unavailable"`
	}
	analyzeOnce := func() analyzeReport {
		t.Helper()
		code, stdout, stderr := runCLI(t, "analyze", "--config", cfg, "--corpus", corpusPath, "--log-format", "json")
		if code != exitOK {
			t.Fatalf("analyze exit %d\n%s", code, stderr)
		}
		var rep analyzeReport
		if err := json.Unmarshal([]byte(stdout), &rep); err != nil {
			t.Fatalf("analyze JSON summary: %v\n%s", err, stdout)
		}
		return rep
	}
	first := analyzeOnce()
	if first.Sandboxes == 0 || first.Measured == 0 || first.Cached != 0 || first.Unavailable["transformers"] == "" {
		t.Fatalf("first analyze: %+v", first)
	}
	a, err := analysis.Load(filepath.Join(out, analysis.FileName))
	if err != nil {
		t.Fatal(err)
	}
	pandas, numpy := a.Names["pandas"], a.Names["numpy"]
	if !pandas.Available || !slices.Contains(pandas.Closure, "numpy") || !slices.Contains(pandas.Closure, "pandas") {
		t.Errorf("pandas: %+v (its closure must hold numpy)", pandas)
	}
	if e := a.Names["pandas.DataFrame"]; e.Module != "pandas" || !e.Available {
		t.Errorf("pandas.DataFrame resolves to %+v, want the module pandas", e)
	}
	if e := a.Names["transformers.AutoModel"]; e.Module != "transformers" || e.Available || !strings.Contains(e.Error, "transformers") {
		t.Errorf("transformers.AutoModel: %+v", e)
	}
	// numpy adds about 10 MiB of private memory; re is loaded by the executor already.
	if numpy.ImportMs <= 0 || numpy.MiB < 1 || numpy.OwnMiB < 1 || pandas.OwnMs <= 0 {
		t.Errorf("numpy %+v, pandas %+v", numpy, pandas)
	}
	if e := a.Names["re"]; !e.Available || e.ImportMs != 0 || e.MiB != 0 || !slices.Equal(e.Closure, []string{"re"}) {
		t.Errorf("re (loaded by the executor): %+v", e)
	}
	if a.Host == nil || a.Host.ColdStartMs <= 0 || a.Host.EmptyMiB < 1 || len(a.Host.RestoreSets) < 2 {
		t.Fatalf("host: %+v", a.Host)
	}
	// The pooled line: a cold start and restores onto sandboxes created ahead, measured.
	if p := a.Host.Pooled; p.ColdStartMs <= 0 || p.RestoreMs(a.Host.EmptyMiB) <= 0 {
		t.Errorf("host's pooled line: %+v", p)
	}
	// The memory line: the own memory of the same checkpoints restored and idle, against image
	// size (no relation of sizes asserted: a loaded machine may bend it).
	if m := a.Host.Memory; m.InterceptBytes <= 0 || m.OwnBytes(a.Host.EmptyMiB) <= 0 {
		t.Errorf("host's memory line: %+v", m)
	}
	t.Logf("memory line: %+v (R² %v over %v)", a.Host.Memory, a.Host.MemoryRSquared, a.Host.RestoreSets)
	if second := analyzeOnce(); second.Sandboxes != 0 || second.Measured != 0 || second.Cached != first.Measured || second.Modules != first.Modules {
		t.Errorf("second analyze of the same corpus: %+v, want no sandbox and nothing measured (first %+v)", second, first)
	}
	// A cache from before the memory line (its entries removed) measures it then, and only
	// it: no module again.
	if err := os.RemoveAll(filepath.Join(dir, "analysis-cache", "memory-line")); err != nil {
		t.Fatal(err)
	}
	if third := analyzeOnce(); third.Sandboxes == 0 || third.Measured != 0 {
		t.Errorf("analyze over a cache without the memory line: %+v, want its sandboxes and no module measured", third)
	}
	if a, err = analysis.Load(filepath.Join(out, analysis.FileName)); err != nil {
		t.Fatal(err)
	}
	if a.Host == nil || a.Host.Memory.InterceptBytes <= 0 {
		t.Fatalf("the memory line measured over a cache without it: host %+v", a.Host)
	}

	// The config's own set, captured on the analysis: its packages, and select by version.
	if code, _, stderr := runCLI(t, "capture", "--config", cfg); code != exitOK {
		t.Fatalf("capture exit %d\n%s", code, stderr)
	}
	cat, err := catalogue.Load(filepath.Join(out, catalogue.FileName))
	if err != nil {
		t.Fatal(err)
	}
	checkPackages(t, cfg, cat, a)

	// A corpus the analysis has not seen: named, with its line, exit 2.
	other := filepath.Join(dir, "other.jsonl")
	os.WriteFile(other, []byte("{\"imports\": [\"numpy\"]}\n{\"imports\": [\"torch\"]}\n"), 0o644)
	if code, _, stderr := runCLI(t, "plan-sets", "--config", cfg, "--corpus", other); code != exitUsage || !strings.Contains(stderr, "torch (line 2)") {
		t.Errorf("plan-sets of a corpus not analysed: exit %d\n%s", code, stderr)
	}

	// A bad requirement is refused naming its line and item, before anything is planned.
	badReq := filepath.Join(dir, "bad-requirement.jsonl")
	os.WriteFile(badReq, []byte("{\"imports\": [\"numpy\"]}\n{\"imports\": [\"numpy\"], \"packages\": [\"numpy=>1.24\"]}\n"), 0o644)
	if code, _, stderr := runCLI(t, "plan-sets", "--config", cfg, "--corpus", badReq); code != exitUsage || !strings.Contains(stderr, `line 2: packages[0]: invalid requirement: "=>1.24"`) {
		t.Errorf("plan-sets of a corpus with a bad requirement: exit %d\n%s", code, stderr)
	}

	// Its JSON first (one document: the plan), then its text, whose plan.json the capture takes.
	code, stdout, stderr := runCLI(t, "plan-sets", "--config", cfg, "--corpus", corpusPath, "--max-sets", "2", "--log-format", "json")
	var planJSON plan.Result
	if err := decodeOne(stdout, &planJSON); err != nil || code != exitOK || len(planJSON.Sets) == 0 || len(planJSON.Strategies) == 0 {
		t.Fatalf("plan-sets as JSON: exit %d, %v\n%s%s", code, err, stdout, stderr)
	}
	code, stdout, stderr = runCLI(t, "plan-sets", "--config", cfg, "--corpus", corpusPath, "--max-sets", "2")
	if code != exitOK {
		t.Fatalf("plan-sets exit %d\n%s", code, stderr)
	}
	for _, want := range []string{"cold", "empty", "top-k", "greedy", "plan", "checkpoints:", "measured by analyze", "hit rate"} {
		if !strings.Contains(stdout, want) {
			t.Errorf("plan-sets output lacks %q:\n%s", want, stdout)
		}
	}
	// The warm sizing has a memory for every planned set: measured, or by the memory line.
	if strings.Contains(stdout, "not sized") {
		t.Errorf("plan-sets did not size the warm pools:\n%s", stdout)
	}
	pl, err := plan.Load(filepath.Join(out, plan.FileName))
	if err != nil {
		t.Fatal(err)
	}
	for _, name := range plan.Strategies() {
		s := pl.Strategies[name]
		if s == nil || s.Planned.MeanMs <= 0 || s.HeldOut.MeanMs <= 0 || s.Planned.P90Ms < s.Planned.P50Ms {
			t.Errorf("strategy %s: %+v", name, s)
		}
	}
	if len(pl.Sets) == 0 || len(pl.Sets) > 2 {
		t.Fatalf("plan sets: %+v", pl.Sets)
	}
	// The printed block is a config's checkpoints, as capture takes it.
	block := stdout[strings.Index(stdout, "checkpoints:"):]
	if _, err := config.Parse([]byte(block), "block", dir, dir); err != nil {
		t.Errorf("the printed checkpoints block does not parse as a config: %v\n%s", err, block)
	}

	if code, _, stderr := runCLI(t, "capture", "--config", cfg, "--plan", filepath.Join(out, plan.FileName)); code != exitOK {
		t.Fatalf("capture --plan exit %d\n%s", code, stderr)
	}
	m, err := manifest.Load(filepath.Join(out, manifest.FileName))
	if err != nil {
		t.Fatal(err)
	}
	if len(m.Checkpoints) != len(pl.Sets)+1 {
		t.Fatalf("manifest holds %d checkpoints, want empty and the plan's %d", len(m.Checkpoints), len(pl.Sets))
	}
	for _, name := range []string{analysis.FileName, plan.FileName} {
		if _, err := os.Stat(filepath.Join(out, name)); err != nil {
			t.Errorf("the capture did not carry %s over: %v", name, err)
		}
	}
	if cat, err = catalogue.Load(filepath.Join(out, catalogue.FileName)); err != nil {
		t.Fatal(err)
	}
	checkCatalogue(t, cat, m, a, pl)
	if cat.CostModel.Memory != a.Host.Memory || cat.Version < 7 {
		t.Errorf("catalogue version %d, memory line %+v: want version 7 or later and the analysis's %+v", cat.Version, cat.CostModel.Memory, a.Host.Memory)
	}

	// Select's choice for a request restores and answers with its modules already loaded.
	want := pl.Sets[0].Imports
	code, stdout, stderr = runCLI(t, "select", "--config", cfg, "--log-format", "json", strings.Join(want, ","))
	if code != exitOK {
		t.Fatalf("select exit %d\n%s", code, stderr)
	}
	var ch catalogue.Choice
	if err := json.Unmarshal([]byte(stdout), &ch); err != nil {
		t.Fatal(err)
	}
	// Which start wins depends on the restore and cold times measured in this run, and a
	// loaded machine can make a restore slower than a cold start: judge the choice by the
	// catalogue's own figures, then restore the planned set that holds the whole request.
	planned := pl.Sets[0].ID
	var held *catalogue.Checkpoint
	for i := range cat.Checkpoints {
		if cat.Checkpoints[i].ID == planned {
			held = &cat.Checkpoints[i]
		}
	}
	if held == nil {
		t.Fatalf("the catalogue has no checkpoint %s", planned)
	}
	restoreMs := held.RestoreMs(cat.CostModel)
	switch {
	case ch.PredictedMs <= 0 || ch.Why == "":
		t.Fatalf("select %v: %+v, want a priced choice that says why", want, ch)
	case ch.PredictedMs > restoreMs+0.001:
		// Another checkpoint plus imports, or a cold start, may be priced below the planned set
		// when this run measured its restore slow; never above it.
		t.Fatalf("select %v chose a start priced %.0f ms over %s, which holds them all (restore %.0f ms): %+v", want, ch.PredictedMs, planned, restoreMs, ch)
	}
	t.Logf("select %v: %s (%s: restore %.0f ms; cold %.0f ms)", want, ch.Why, planned, restoreMs, ch.ColdMs)
	if got, want := ch.PredictedPooledMs, pooledPrice(t, cat, ch.Checkpoint, ch.PredictedMs); !near(got, want) {
		t.Errorf("select's pooled prediction %v ms, want the pooled line's %v ms: %+v", got, want, ch)
	}
	restoreAndCheck(t, cfg, out, m, planned, ch.Modules)

	// With a short run of arrivals: the same Poisson arrivals (seeded) with warm pools and
	// without, against a worker of the kit.
	code, stdout, stderr = runCLI(t, "bench", "--config", cfg, "--corpus", corpusPath, "--part", "all", "--sample", "2", "--rounds", "1",
		"--arrivals", "2", "--duration", "3s", "--memory", "256MiB")
	if code != exitOK {
		t.Fatalf("bench --corpus exit %d\n%s", code, stderr)
	}
	if !strings.Contains(stdout, "by the pooled line: measured") {
		t.Errorf("bench --corpus's summary does not give the pooled line's prediction:\n%s", stdout)
	}
	data, err := os.ReadFile(filepath.Join(out, "bench", "latest", "corpus.json"))
	if err != nil {
		t.Fatal(err)
	}
	var rep bench.CorpusReport
	if err := json.Unmarshal(data, &rep); err != nil {
		t.Fatal(err)
	}
	// The pooled series is on by default (--pool 2): each request also started from a pool.
	if len(rep.Requests) != 2 || rep.Summary.MeanColdMs <= 0 || rep.Summary.MeanChosenMs <= 0 || rep.Summary.MeanPredictedMs <= 0 || rep.Unservable != 1 ||
		rep.Pool != 2 || rep.Summary.MeanPooledMs <= 0 || rep.Summary.PooledOverCold <= 0 || rep.Summary.CreateMs <= 0 || rep.Summary.PredictedPooledMs <= 0 {
		t.Errorf("corpus.json: %+v", rep)
	}
	var predictedPooled float64
	for _, r := range rep.Requests {
		if r.Choice == "" || len(r.Cold.Runs) != 1 || len(r.Chosen.Runs) != 1 || r.Pooled == nil || len(r.Pooled.Runs) != 1 || r.PooledMs <= 0 {
			t.Errorf("request %+v", r)
		}
		// Predicted by the pooled line, not by the chosen start less the pool's create time.
		id := r.Choice
		if id == bench.Cold {
			id = ""
		}
		if want := pooledPrice(t, cat, id, r.PredictedMs); !near(r.PredictedPooledMs, want) {
			t.Errorf("request at line %d: predicted_pooled_ms %v, want the pooled line's %v", r.Line, r.PredictedPooledMs, want)
		}
		predictedPooled += r.PredictedPooledMs / float64(len(rep.Requests))
	}
	if s := rep.Summary; !near(s.PredictedPooledMs, predictedPooled) || !near(s.PooledModelErrorPct, 100*(s.MeanPooledMs/s.PredictedPooledMs-1)) {
		t.Errorf("summary's pooled prediction %v ms, error %v%%; the requests' mean %v ms", s.PredictedPooledMs, s.PooledModelErrorPct, predictedPooled)
	}
	t.Logf("corpus: cold %.0f ms, chosen %.0f ms (predicted %.0f), pooled %.0f ms (predicted %.0f, error %+.1f%%; create %.0f ms)", rep.Summary.MeanColdMs,
		rep.Summary.MeanChosenMs, rep.Summary.MeanPredictedMs, rep.Summary.MeanPooledMs, rep.Summary.PredictedPooledMs, rep.Summary.PooledModelErrorPct, rep.Summary.CreateMs)
	for _, name := range []string{"bench.txt", "corpus.svg"} {
		if fi, err := os.Stat(filepath.Join(out, "bench", "latest", name)); err != nil || fi.Size() == 0 {
			t.Errorf("%s: %v", name, err)
		}
	}
	checkArrivals(t, out, stdout)
}

// checkArrivals checks the arrivals of a `bench --corpus --arrivals` run by counts and shape,
// never by a time: the same arrivals in both runs, each answered or failed, by the paths a
// worker takes; warm pools sized and their memory measured in the run with them, and the warm
// path taken there only; bench.txt carries every answered request.
func checkArrivals(t *testing.T, out, stdout string) {
	t.Helper()
	data, err := os.ReadFile(filepath.Join(out, "bench", "latest", "corpus.json"))
	if err != nil {
		t.Fatal(err)
	}
	var rep struct {
		Summary struct {
			MeanColdMs float64 `json:"mean_cold_ms"`
		} `json:"summary"`
		Arrivals *struct {
			Choices     map[string]int             `json:"choices"`
			WithWarm    map[string]json.RawMessage `json:"with_warm"`
			WithoutWarm map[string]json.RawMessage `json:"without_warm"`
		} `json:"arrivals"`
	}
	if err := json.Unmarshal(data, &rep); err != nil || rep.Arrivals == nil {
		t.Fatalf("corpus.json has no arrivals: %v", err)
	}
	for _, key := range []string{"p50_ms", "p90_ms", "p99_ms", "mean_ms", "paths", "queued", "failures", "memory_peak_bytes", "warm_memory_peak_bytes"} {
		if rep.Arrivals.WithWarm[key] == nil || rep.Arrivals.WithoutWarm[key] == nil {
			t.Errorf("corpus.json arrivals lack %s: %s", key, data)
		}
	}
	var with, without bench.ArrivalsRun
	for raw, into := range map[*map[string]json.RawMessage]*bench.ArrivalsRun{&rep.Arrivals.WithWarm: &with, &rep.Arrivals.WithoutWarm: &without} {
		b, _ := json.Marshal(*raw)
		if err := json.Unmarshal(b, into); err != nil {
			t.Fatal(err)
		}
	}
	for name, r := range map[string]bench.ArrivalsRun{"with": with, "without": without} {
		served := 0
		for _, n := range r.Paths {
			served += n
		}
		if r.Requests == 0 || served+r.Failures != r.Requests || len(r.LatenciesMs) != served || r.Failures != 0 ||
			!(r.P50Ms > 0 && r.P50Ms <= r.P90Ms && r.P90Ms <= r.P99Ms && r.MeanMs > 0) {
			t.Errorf("arrivals %s warm pools: %+v", name, r)
		}
	}
	// Which sets get warm pools depends on the prices this run measured (Select may start
	// every request cold on a loaded machine): the first arrival of a set kept warm finds its
	// pool full, and only then is the warm path required.
	kept := 0
	for set := range with.WarmSizes {
		kept += rep.Arrivals.Choices[set]
	}
	if kept == 0 { // the warm path itself is proved by pkg/pool's TestRealWarm and TestBenchShort
		t.Logf("arrivals: this run's prices kept no warm pool that a request chose (sizes %v, choices %v): the warm path went untried here", with.WarmSizes, rep.Arrivals.Choices)
	}
	// Both runs' workers held sandboxes (a pool of created ones at least); only the first had
	// warm pools, whose memory is part of its worker's.
	if with.Requests != without.Requests || without.Paths["warm"] != 0 || len(without.WarmSizes) != 0 || without.WarmMemoryPeakBytes != 0 ||
		with.MemoryPeakBytes <= 0 || without.MemoryPeakBytes <= 0 || with.MemorySamples <= 0 || without.MemorySamples <= 0 || with.CPUBusy <= 0 || without.CPUBusy <= 0 || with.CPUBusy > 1 || without.CPUBusy > 1 ||
		kept > 0 && (with.Paths["warm"] == 0 || with.PredictedMemoryBytes <= 0 || with.WarmMemoryPeakBytes <= 0) {
		t.Errorf("arrivals (choices %v): with warm pools %+v; without %+v", rep.Arrivals.Choices, with, without)
	}
	txt, err := os.ReadFile(filepath.Join(out, "bench", "latest", "bench.txt"))
	if err != nil || strings.Count(string(txt), "\nBenchmarkArrivals/warm=with ") != len(with.LatenciesMs) || strings.Count(string(txt), "\nBenchmarkArrivals/warm=without ") != len(without.LatenciesMs) {
		t.Errorf("bench.txt's arrivals: %v\n%s", err, txt)
	}
	if !strings.Contains(stdout, "arrivals: Poisson at 2.00 a second") {
		t.Errorf("bench --corpus --arrivals's summary lacks the arrivals:\n%s", stdout)
	}
	t.Logf("arrivals: with warm pools %v p50 %.0f p99 %.0f ms, paths %v, queued %d, warm pools' memory peak %.0f MiB (predicted %.0f); without p50 %.0f p99 %.0f ms, paths %v, queued %d; mean cold %.0f ms",
		with.WarmSizes, with.P50Ms, with.P99Ms, with.Paths, with.Queued, float64(with.WarmMemoryPeakBytes)/(1<<20), float64(with.PredictedMemoryBytes)/(1<<20),
		without.P50Ms, without.P99Ms, without.Paths, without.Queued, rep.Summary.MeanColdMs)
}

// pooledPrice is the pooled line's price of a start Select chose (the checkpoint id, "" for a
// cold start) at predictedMs: the line's restore of the checkpoint's image (or its cold start)
// plus the imports the choice was priced with.
func pooledPrice(t *testing.T, cat *catalogue.Catalogue, id string, predictedMs float64) float64 {
	t.Helper()
	m := cat.CostModel
	if id == "" {
		return m.Pooled.ColdStartMs + predictedMs - m.ColdStartMs
	}
	for _, cp := range cat.Checkpoints {
		if cp.ID == id {
			return m.Pooled.RestoreMs(cp.ImageMiB) + predictedMs - cp.RestoreMs(m)
		}
	}
	t.Fatalf("the catalogue has no checkpoint %s", id)
	return 0
}

// near reports whether two prices agree but for float rounding.
func near(a, b float64) bool { return abs(a-b) <= 1e-6*max(1, abs(a), abs(b)) }

// checkPackages checks the distributions recorded by analyze (numpy's, in the image and for the
// module) and by the captures (each checkpoint's), then select with requirements on the real
// output: a checkpoint whose loaded pandas (Debian 12's 1.5) does not satisfy pandas>=2 is
// passed over, naming why, and the image is said to lack it; pandas<2 keeps the checkpoint.
func checkPackages(t *testing.T, cfg string, cat *catalogue.Catalogue, a *analysis.File) {
	t.Helper()
	numpy, pandas := a.Packages["numpy"], a.Packages["pandas"]
	if numpy == "" || pandas == "" || a.Packages["cloudpickle"] == "" {
		t.Fatalf("the analysis's packages %v lack numpy, pandas or cloudpickle", a.Packages)
	}
	if got := a.Names["numpy"].Packages; !maps.Equal(got, map[string]string{"numpy": numpy}) {
		t.Errorf("numpy's packages %v, want numpy %s", got, numpy)
	}
	if got := a.Names["pandas.DataFrame"].Packages; !maps.Equal(got, map[string]string{"pandas": pandas}) {
		t.Errorf("pandas.DataFrame's packages %v, want pandas %s", got, pandas)
	}
	if len(a.Names["re"].Packages) != 0 || !maps.Equal(cat.Packages, a.Packages) {
		t.Errorf("re's packages %v; the catalogue's %v, the analysis's %v", a.Names["re"].Packages, cat.Packages, a.Packages)
	}
	holder := ""
	for _, cp := range cat.Checkpoints {
		if cp.Packages["cloudpickle"] != a.Packages["cloudpickle"] {
			t.Errorf("%s: packages %v lack the executor's cloudpickle", cp.ID, cp.Packages)
		}
		if slices.Contains(cp.Closure, "pandas") {
			if cp.Packages["pandas"] != pandas || cp.Packages["numpy"] != numpy {
				t.Errorf("%s: packages %v, want pandas %s and numpy %s", cp.ID, cp.Packages, pandas, numpy)
			}
			if holder == "" {
				holder = cp.ID
			}
		} else if _, ok := cp.Packages["pandas"]; ok {
			t.Errorf("%s: packages %v name pandas, which it does not load", cp.ID, cp.Packages)
		}
	}
	if holder == "" {
		t.Fatalf("no checkpoint loads pandas: %+v", cat.Checkpoints)
	}
	selectJSON := func(args ...string) catalogue.Choice {
		t.Helper()
		code, stdout, stderr := runCLI(t, append([]string{"select", "--config", cfg, "--log-format", "json"}, args...)...)
		if code != exitOK {
			t.Fatalf("select %v: exit %d\n%s", args, code, stderr)
		}
		var ch catalogue.Choice
		if err := json.Unmarshal([]byte(stdout), &ch); err != nil {
			t.Fatal(err)
		}
		return ch
	}
	if ch := selectJSON("pandas", "--requires", "pandas>=1.5,<2"); ch.Checkpoint == "" || ch.PassedOver != nil || ch.ImageLacks != nil {
		t.Errorf("select pandas with pandas>=1.5,<2: %+v, want a checkpoint that holds pandas %s", ch, pandas)
	}
	ch := selectJSON("pandas", "--requires", "pandas>=2", "--requires", "numpy")
	passed := map[string]string{}
	for _, p := range ch.PassedOver {
		passed[p.Checkpoint] = p.Why
	}
	if ch.Checkpoint == holder || passed[holder] != fmt.Sprintf("holds pandas %s loaded, not pandas>=2", pandas) ||
		!slices.Equal(ch.ImageLacks, []string{"pandas>=2: the image has pandas " + pandas}) {
		t.Errorf("select pandas with pandas>=2: %+v, want %s passed over", ch, holder)
	}
	code, stdout, _ := runCLI(t, "select", "--config", cfg, "pandas", "--requires", "pandas>=2")
	if code != exitOK || !strings.Contains(stdout, "passed over "+holder+": holds pandas "+pandas+" loaded, not pandas>=2\n") || !strings.Contains(stdout, "not in the image: pandas>=2: the image has pandas "+pandas) {
		t.Errorf("select's text output, exit %d:\n%s", code, stdout)
	}
	// A bad requirement names the flag; one with commas is one requirement.
	if code, _, stderr := runCLI(t, "select", "--config", cfg, "pandas", "--requires", "pandas=>2"); code != exitUsage || !strings.Contains(stderr, `invalid value "pandas=>2" for flag --requires`) {
		t.Errorf("select --requires pandas=>2: exit %d\n%s", code, stderr)
	}
}

// checkSelectBySize runs select on the output out of empty and pandas (m its manifest), captured
// without an analysis: its catalogue has no cold start time and no module, so select chooses by
// image size and never prints a price: the pandas checkpoint for pandas when the version it
// holds loaded meets the requirement (the issue: select answered "cold start: predicted 0 ms"),
// a cold start when it does not, the empty checkpoint for no import, the pandas checkpoint for
// numpy (its packages hold numpy loaded, though it imports only pandas) and for json beside
// pandas (json, which no checkpoint holds, is imported after either start), and a cold start
// for a request of only imports no checkpoint holds.
func checkSelectBySize(t *testing.T, cfg, out string, m *manifest.Manifest) {
	t.Helper()
	cat, err := catalogue.Load(filepath.Join(out, catalogue.FileName))
	if err != nil {
		t.Fatal(err)
	}
	if cat.CostModel.ColdStartMs != 0 || len(cat.Modules) != 0 {
		t.Fatalf("a catalogue captured without an analysis has a cold start or modules: %+v", cat)
	}
	sizes := map[string]float64{}
	for _, cp := range cat.Checkpoints {
		sizes[cp.ID] = cp.ImageMiB
	}
	pandas := m.Checkpoints[1].Packages["pandas"]
	if m.Checkpoints[1].ID != "pandas" || pandas == "" || m.Checkpoints[1].Packages["numpy"] == "" || sizes["pandas"] <= sizes["empty"] || sizes["empty"] <= 0 {
		t.Fatalf("the pandas checkpoint %+v; sizes %v", m.Checkpoints[1], sizes)
	}
	const bySize = "; chosen by image size for want of measured prices (the catalogue has no cold start time): to price starts, run `pipeline analyze --corpus FILE` on this output, then capture it again"
	for _, tc := range []struct {
		args []string
		want string // the checkpoint, "" for cold
		text string // what select prints
	}{
		{[]string{"pandas", "--requires", "pandas==" + pandas}, "pandas",
			fmt.Sprintf("restore pandas: chosen by image size, not priced (no measured prices)\nrestore pandas (%.1f MiB), the smallest checkpoint that holds pandas%s\n", sizes["pandas"], bySize)},
		{[]string{"pandas", "--requires", "pandas!=" + pandas}, "",
			"cold start: chosen by image size, not priced (no measured prices)\ncold start: every checkpoint that holds pandas is passed over; passed over pandas: holds pandas " + pandas + " loaded, not pandas!=" + pandas + bySize +
				"\npassed over pandas: holds pandas " + pandas + " loaded, not pandas!=" + pandas + "\n"},
		{[]string{""}, "empty",
			fmt.Sprintf("restore empty: chosen by image size, not priced (no measured prices)\nrestore empty (%.1f MiB), the smallest checkpoint (the request imports nothing); next smallest pandas (%.1f MiB)%s\n", sizes["empty"], sizes["pandas"], bySize)},
		{[]string{"json,pandas.DataFrame"}, "pandas",
			fmt.Sprintf("restore pandas: chosen by image size, not priced (no measured prices)\nrestore pandas (%.1f MiB), the smallest checkpoint that holds pandas; no checkpoint holds json, imported after the start either way%s\n", sizes["pandas"], bySize)},
		{[]string{"numpy.linalg"}, "pandas",
			fmt.Sprintf("restore pandas: chosen by image size, not priced (no measured prices)\nrestore pandas (%.1f MiB), the smallest checkpoint that holds numpy%s\n", sizes["pandas"], bySize)},
		{[]string{"json"}, "",
			"cold start: chosen by image size, not priced (no measured prices)\ncold start: no checkpoint holds json" + bySize + "\n"},
	} {
		code, stdout, stderr := runCLI(t, append([]string{"select", "--config", cfg}, tc.args...)...)
		if code != exitOK || stdout != tc.text {
			t.Errorf("select %q: exit %d\n%s%s\nwant:\n%s", tc.args, code, stdout, stderr, tc.text)
		}
		code, stdout, stderr = runCLI(t, append([]string{"select", "--config", cfg, "--log-format", "json"}, tc.args...)...)
		if code != exitOK {
			t.Fatalf("select --log-format json %q: exit %d\n%s", tc.args, code, stderr)
		}
		var fields map[string]any
		if err := json.Unmarshal([]byte(stdout), &fields); err != nil {
			t.Fatalf("select %q: %v\n%s", tc.args, err, stdout)
		}
		for _, key := range []string{"predicted_ms", "fixed_ms", "import_ms", "cold_ms", "predicted_pooled_ms"} {
			if _, ok := fields[key]; ok {
				t.Errorf("select %q: the JSON has %s, a price nothing measured:\n%s", tc.args, key, stdout)
			}
		}
		var ch catalogue.Choice
		if err := json.Unmarshal([]byte(stdout), &ch); err != nil {
			t.Fatal(err)
		}
		if ch.Basis != catalogue.BasisImageSize || ch.Checkpoint != tc.want || ch.Cold != (tc.want == "") || ch.ImageMiB != sizes[tc.want] || !strings.HasSuffix(ch.Why, bySize) {
			t.Errorf("select %q: %+v, want %q by image size", tc.args, ch, tc.want)
		}
	}
}

// checkCatalogue checks catalogue.json against the manifest, the analysis and the plan.
func checkCatalogue(t *testing.T, cat *catalogue.Catalogue, m *manifest.Manifest, a *analysis.File, pl *plan.Result) {
	t.Helper()
	if len(cat.Checkpoints) != len(m.Checkpoints) {
		t.Fatalf("catalogue has %d checkpoints, the manifest %d", len(cat.Checkpoints), len(m.Checkpoints))
	}
	for i, c := range m.Checkpoints {
		got := cat.Checkpoints[i]
		if got.ID != c.ID || got.RestoreMedianMs != c.RestoreMS.Median || got.ImageMiB <= 0 || abs(got.ImageMiB-float64(c.Bytes)/(1<<20)) > 0.01 {
			t.Errorf("catalogue checkpoint %+v, manifest %+v", got, c)
		}
		if c.ID == config.EmptySetID {
			continue
		}
		if got.PredictedMiB <= 0 {
			t.Errorf("%s: no predicted size", c.ID)
		}
		for _, imp := range c.Imports {
			if !slices.Contains(got.Closure, imp) {
				t.Errorf("%s: closure %v lacks its import %s", c.ID, got.Closure, imp)
			}
		}
	}
	if cat.Prediction == nil || cat.Prediction.Sets != len(pl.Sets) || cat.Prediction.MeanAbsErrorMiB < 0 {
		t.Errorf("prediction %+v", cat.Prediction)
	}
	for name, mod := range a.Modules() {
		if got, ok := cat.Modules[name]; !ok || got.Available != mod.Available || got.ImportMs != mod.ImportMs {
			t.Errorf("module %s: catalogue %+v, analysis %+v", name, got, mod)
		}
	}
	if cat.CostModel.ColdStartMs != a.Host.ColdStartMs || cat.CostModel.EmptyMiB <= 0 || cat.CostModel.Pooled != a.Host.Pooled {
		t.Errorf("cost model %+v", cat.CostModel)
	}
}

// testRunEnv returns the run environment of the config at cfgPath, its log discarded, closed
// when the test ends.
func testRunEnv(ctx context.Context, t *testing.T, cfgPath string) *run.Env {
	t.Helper()
	cfg, err := config.Load(cfgPath, config.CacheDir())
	if err != nil {
		t.Fatal(err)
	}
	log := logrus.New()
	log.SetOutput(io.Discard)
	env, err := run.NewEnv(ctx, cfg, log)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { env.Close() })
	return env
}

// restoreAndCheck restores checkpoint id as a worker would and calls it: the call sees every one
// of modules already in sys.modules (the smoke request reports the missing).
func restoreAndCheck(t *testing.T, cfgPath, out string, m *manifest.Manifest, id string, modules []string) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	env := testRunEnv(ctx, t, cfgPath)
	r, err := env.ResolveRootfs(ctx)
	if err != nil {
		t.Fatal(err)
	}
	var dir string
	for _, c := range m.Checkpoints {
		if c.ID == id {
			dir = filepath.Join(out, c.Dir)
		}
	}
	if dir == "" {
		t.Fatalf("the manifest has no checkpoint %s", id)
	}
	work := testenv.WorkDir(t)
	if _, err := env.Sandboxes(r).Restorer(work, env.Config.Timeouts.Smoke).Smoke(ctx, id, dir, modules); err != nil {
		t.Fatalf("restore of %s for %v: %v", id, modules, err)
	}
	testenv.CheckNoRunsc(t, env.Config.Runsc.Path, env.Config.Runsc.Root, "")
}

func abs(v float64) float64 {
	if v < 0 {
		return -v
	}
	return v
}

// TestCorpusErrorsExit2 gives analyze, plan-sets and bench --corpus bad corpora: each exits 2
// naming the line (or the emptiness) before it starts a sandbox, and changes nothing on disk.
func TestCorpusErrorsExit2(t *testing.T) {
	t.Parallel()
	dir := testenv.WorkDir(t)
	cfg := catalogueConfig(t, dir)
	out := filepath.Join(dir, "out")
	os.MkdirAll(out, 0o755)
	os.WriteFile(filepath.Join(out, analysis.FileName), []byte("{}"), 0o644) // must stay as it is
	write := func(name, text string) string {
		path := filepath.Join(dir, name)
		os.WriteFile(path, []byte(text), 0o644)
		return path
	}
	badLine := write("bad.jsonl", "{\"imports\": [\"pandas\"]}\n\n{\"imports\": \"pandas\"}\n")
	badName := write("name.jsonl", "{\"imports\": [\"pandas\"]}\n{\"imports\": [\"pan das\"]}\n")
	badWeight := write("weight.jsonl", "{\"imports\": [], \"weight\": -2}\n")
	empty := write("empty.jsonl", "\n\n")
	for _, tc := range []struct {
		args []string
		want string
	}{
		{[]string{"analyze", "--corpus", badLine}, "line 3"},
		{[]string{"analyze", "--corpus", badName}, "line 2"},
		{[]string{"analyze", "--corpus", badWeight}, "line 1"},
		{[]string{"analyze", "--corpus", empty}, "no requests"},
		{[]string{"analyze", "--corpus", filepath.Join(dir, "absent.jsonl")}, "absent.jsonl"},
		{[]string{"analyze"}, "--corpus FILE is required"},
		{[]string{"plan-sets", "--corpus", badLine}, "line 3"},
		{[]string{"plan-sets", "--corpus", empty, "--max-sets", "-1"}, "--max-sets -1"},
		{[]string{"plan-sets", "--corpus", write("good.jsonl", "{\"imports\": [\"numpy\"]}\n")}, "invalid analysis"},
		{[]string{"plan-sets", "--corpus", write("good2.jsonl", "{\"imports\": [\"numpy\"]}\n"), "--analysis", filepath.Join(dir, "none.json")}, "none.json does not exist: run `pipeline analyze"},
		{[]string{"capture", "--plan", filepath.Join(dir, "none.json")}, "--plan: open"},
		{[]string{"capture", "--plan", write("plan.json", `{"version": 1, "sets": [{"id": "empty", "imports": ["numpy"]}]}`)}, `id "empty" is reserved`},
		{[]string{"select", "pandas"}, "catalogue.json does not exist"},
		{[]string{"bench", "--corpus", badName}, "line 2"},
		{[]string{"bench", "--corpus", badName, "--sample", "0"}, "--sample 0"},
		{[]string{"bench", "--corpus", badName, "--part", "middle"}, `--part "middle"`},
		{[]string{"bench", "--corpus", badName, "--explain"}, "--only and --explain are for the set benchmark"},
		{[]string{"bench", "--corpus", badName, "--pool", "-1"}, "--pool -1"},
		{[]string{"bench", "--pool", "0"}, "--pool 0: want 1 to 64 sandboxes (0 only with --corpus"},
		{[]string{"select", "pan das"}, `"pan das" is not a dotted Python name`},
	} {
		args := append([]string{tc.args[0], "--config", cfg}, tc.args[1:]...)
		code, _, stderr := runCLI(t, args...)
		if code != exitUsage || !strings.Contains(stderr, tc.want) {
			t.Errorf("%v: exit %d, want 2 naming %q\n%s", tc.args, code, tc.want, stderr)
		}
	}
	if data, _ := os.ReadFile(filepath.Join(out, analysis.FileName)); !bytes.Equal(data, []byte("{}")) {
		t.Errorf("analysis.json changed: %q", data)
	}
	if entries, _ := os.ReadDir(filepath.Join(dir, "analysis-cache")); len(entries) != 0 {
		t.Errorf("the analysis cache was written: %v", entries)
	}
}
