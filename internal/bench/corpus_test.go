package bench

import (
	"bytes"
	"encoding/json"
	"fmt"
	"slices"
	"strings"
	"testing"
	"time"

	"readie.dev/pipeline/internal/corpus"
	"readie.dev/pipeline/internal/run"
	"readie.dev/pipeline/pkg/catalogue"
	"readie.dev/pipeline/pkg/manifest"
)

func testRouter(t *testing.T) (*catalogue.Router, *run.VerifiedOutput) {
	t.Helper()
	c := &catalogue.Catalogue{
		Version:   catalogue.Version,
		CostModel: catalogue.CostModel{InterceptMs: 130, AlphaMsPerMiB: 1.5, ColdStartMs: 400, EmptyMiB: 8},
		Modules: map[string]catalogue.Module{
			"numpy":        {Available: true, OwnMs: 200, OwnMiB: 9.5, ImportMs: 200, MiB: 9.5, Closure: []string{"numpy"}},
			"pandas":       {Available: true, OwnMs: 700, OwnMiB: 21, ImportMs: 900, MiB: 31, Closure: []string{"numpy", "pandas"}},
			"re":           {Available: true, Closure: []string{"re"}},
			"transformers": {},
		},
		Checkpoints: []catalogue.Checkpoint{
			{ID: "empty", Imports: []string{}, Closure: []string{}, ImageMiB: 8, RestoreMedianMs: 150},
			{ID: "pandas", Imports: []string{"pandas"}, Closure: []string{"numpy", "pandas"}, ImageMiB: 40, RestoreMedianMs: 190},
		},
	}
	r, err := catalogue.NewRouter(c)
	if err != nil {
		t.Fatal(err)
	}
	x := &run.VerifiedOutput{Out: "/out", Manifest: &manifest.Manifest{Checkpoints: []manifest.Checkpoint{{ID: "empty", Dir: "empty"}, {ID: "pandas", Dir: "pandas"}}}}
	return r, x
}

func testCorpus(t *testing.T, n int) *corpus.Corpus {
	t.Helper()
	var b strings.Builder
	for i := range n {
		switch i % 4 {
		case 0:
			b.WriteString(`{"imports": ["pandas.DataFrame", "numpy"]}` + "\n")
		case 1:
			b.WriteString(`{"imports": ["re"], "weight": 2}` + "\n")
		case 2:
			b.WriteString(`{"imports": ["transformers"]}` + "\n")
		default:
			b.WriteString(`{"imports": []}` + "\n")
		}
	}
	c, err := corpus.Parse(strings.NewReader(b.String()))
	if err != nil {
		t.Fatal(err)
	}
	return c
}

// The draw is deterministic, from the part asked for, never an unservable request, and
// resolves each request's names to the modules its call imports.
func TestDrawRequests(t *testing.T) {
	r, x := testRouter(t)
	c := testCorpus(t, 200)
	draw := func(part string, n int) []corpusTrial {
		trials, eligible, unservable, err := drawRequests(CorpusOptions{Corpus: c, Sample: n, Part: part}, r, x)
		if err != nil {
			t.Fatal(err)
		}
		if part == PartAll && (eligible != 150 || unservable != 50) {
			t.Errorf("all: %d eligible, %d unservable", eligible, unservable)
		}
		return trials
	}
	first, again := draw(PartHeldOut, 10), draw(PartHeldOut, 10)
	index := func(ts []corpusTrial) []int {
		var out []int
		for _, t := range ts {
			out = append(out, t.req.Index)
		}
		return out
	}
	if !slices.Equal(index(first), index(again)) || len(first) != 10 || !slices.IsSorted(index(first)) {
		t.Fatalf("draws differ or are not sorted: %v %v", index(first), index(again))
	}
	for _, tr := range first {
		if !corpus.HeldOut(tr.req.Index) {
			t.Errorf("request %d is not held out", tr.req.Index)
		}
		if slices.Contains(tr.req.Imports, "transformers") {
			t.Errorf("an unservable request was drawn: %+v", tr.req)
		}
		switch tr.req.Index % 4 {
		case 0:
			if tr.req.Choice != "pandas" || tr.dir != "/out/pandas" || !slices.Equal(tr.req.Modules, []string{"numpy", "pandas"}) {
				t.Errorf("pandas request: %+v dir %s", tr.req, tr.dir)
			}
		case 3:
			if tr.req.Choice != "empty" || len(tr.req.Modules) != 0 || tr.req.Modules == nil {
				t.Errorf("empty request: %+v", tr.req)
			}
		}
	}
	for _, tr := range draw(PartPlanned, 500) {
		if corpus.HeldOut(tr.req.Index) {
			t.Errorf("planned part drew held-out request %d", tr.req.Index)
		}
	}
	if all := draw(PartAll, 1000); len(all) != 150 {
		t.Errorf("all: %d requests", len(all))
	}
	// Weighted: requests of weight 2 (re) are drawn about twice as often as those of weight 1.
	counts := map[int]int{}
	for _, tr := range draw(PartAll, 30) {
		counts[tr.req.Index%4]++
	}
	if counts[1] <= counts[0] || counts[1] <= counts[3] {
		t.Errorf("draw of 30 by weight: %v (weight-2 requests are index 1 mod 4)", counts)
	}
}

// Each drawn request carries its choice's price from a pool, the catalogue's pooled line on the
// chosen checkpoint's image size (or its pooled cold start) plus the imports the choice lacks;
// none without a pooled line.
func TestDrawRequestsPooledPrediction(t *testing.T) {
	c := twoCheckpoints(catalogue.CostModel{InterceptMs: 130, AlphaMsPerMiB: 1.5, ColdStartMs: 400, EmptyMiB: 8,
		Pooled: catalogue.PooledLine{InterceptMs: 50, AlphaMsPerMiB: 1, ColdStartMs: 300}})
	cor, err := corpus.Parse(strings.NewReader(`{"imports": ["pandas.DataFrame"]}
{"imports": ["numpy"]}
{"imports": ["re"]}
`))
	if err != nil {
		t.Fatal(err)
	}
	x := &run.VerifiedOutput{Out: "/out", Manifest: &manifest.Manifest{Checkpoints: []manifest.Checkpoint{{ID: "empty", Dir: "empty"}, {ID: "pandas", Dir: "pandas"}}}}
	draw := func() map[int]corpusTrial {
		r, err := catalogue.NewRouter(c)
		if err != nil {
			t.Fatal(err)
		}
		trials, _, _, err := drawRequests(CorpusOptions{Corpus: cor, Sample: 4, Part: PartAll}, r, x)
		if err != nil {
			t.Fatal(err)
		}
		byLine := map[int]corpusTrial{}
		for _, tr := range trials {
			byLine[tr.req.Line] = tr
		}
		return byLine
	}
	// pandas: restored (190 ms), from a pool 50 + 40 = 90 ms; numpy: the pandas checkpoint
	// (190 ms) beats empty (150 + 200 ms), 90 ms pooled; re: empty, 150 ms, pooled 50 + 8 ms.
	for line, want := range map[int]struct {
		choice            string
		predicted, pooled float64
	}{1: {"pandas", 190, 90}, 2: {"pandas", 190, 90}, 3: {"empty", 150, 58}} {
		tr := draw()[line]
		if tr.req.Choice != want.choice || tr.req.PredictedMs != want.predicted || tr.predictedPooled != want.pooled {
			t.Errorf("line %d: %s %v ms, pooled %v ms; want %s %v ms, pooled %v ms", line, tr.req.Choice, tr.req.PredictedMs, tr.predictedPooled, want.choice, want.predicted, want.pooled)
		}
	}
	// A cold choice (10 ms against empty's 150 ms): the pooled cold start, 300 ms.
	c.CostModel.ColdStartMs = 10
	if tr := draw()[3]; tr.req.Choice != Cold || tr.predictedPooled != 300 {
		t.Errorf("cold re: %+v, pooled %v ms, want cold, 300 ms", tr.req, tr.predictedPooled)
	}
	c.CostModel.Pooled = catalogue.PooledLine{}
	if tr := draw()[1]; tr.predictedPooled != 0 {
		t.Errorf("without a pooled line: %v ms", tr.predictedPooled)
	}
}

// With a pool: the pooled medians, their mean against cold, the prediction (the pooled line's)
// and its error, and the pooled lines of bench.txt.
func TestCorpusPooledSummaryAndBenchfmt(t *testing.T) {
	r := &CorpusReport{Rounds: 2, Pool: 2, Corpus: "c.jsonl", Part: PartHeldOut, Basis: catalogue.BasisCostModel, Requests: []CorpusRequest{
		{Index: 3, ColdMs: 1000, ChosenMs: 200, PredictedMs: 250, PredictedColdMs: 1100, Cold: manifest.Stats{Runs: []float64{900, 1100}}, Chosen: manifest.Stats{Runs: []float64{190, 210}},
			Pooled: &manifest.Stats{Runs: []float64{90, 110}}, PooledMs: 100, PredictedPooledMs: 150},
		{Index: 12, ColdMs: 500, ChosenMs: 300, PredictedMs: 200, PredictedColdMs: 450, Cold: manifest.Stats{Runs: []float64{500, 500}}, Chosen: manifest.Stats{Runs: []float64{300, 300}},
			Pooled: &manifest.Stats{Runs: []float64{200, 200}}, PooledMs: 200, PredictedPooledMs: 100},
	}}
	// The header says where, when (UTC, whatever the local zone) and under what load.
	r.CreatedAt = time.Date(2026, 12, 6, 11, 30, 0, 0, time.FixedZone("CET", 3600))
	r.Machine, r.Revision = Machine{GOOS: "linux", GOARCH: "arm64", CPUModel: "AMD EPYC", CPUs: 2}, "v1 abc123"
	r.Load = Load{Before: 0.5, During: []float64{1, 3}, After: 2, Warning: "busy"}
	r.Summary = summarize(r.Requests)
	s := r.Summary
	if s.MeanPooledMs != 150 || s.PredictedPooledMs != 125 || fmt.Sprintf("%.4f %.2f", s.PooledOverCold, s.PooledModelErrorPct) != "0.2000 20.00" {
		t.Errorf("summary %+v", s)
	}
	var buf bytes.Buffer
	if err := WriteCorpusBenchfmt(&buf, r); err != nil {
		t.Fatal(err)
	}
	text := buf.String()
	for _, want := range []string{
		"goos: linux\ngoarch: arm64\npkg: readie.dev/pipeline/bench\ncpu: AMD EPYC\ndate: 2026-12-06T10:30:00Z\nrounds: 2\nrevision: v1 abc123\n",
		"\nload: before 0.50, during 1.00-3.00 over 2 samples, after 2.00\nload-warning: busy\n",
		"BenchmarkCorpus/req=00003/series=pooled 1 90000000 ns/op 150.0 predicted-ms\n",
		"BenchmarkCorpusMean/series=pooled 1 145000000 ns/op 125.0 predicted-ms\n",
		"BenchmarkCorpusMean/series=pooled 1 155000000 ns/op 125.0 predicted-ms\n",
	} {
		if !strings.Contains(text, want) {
			t.Errorf("bench.txt lacks %q:\n%s", want, text)
		}
	}
	if n := strings.Count(text, "BenchmarkCorpus/"); n != 12 {
		t.Errorf("%d run lines, want 12", n)
	}
	var svg bytes.Buffer
	if err := WriteCorpusChart(&svg, r); err != nil || !strings.Contains(svg.String(), "from a pool of 2") {
		t.Errorf("chart: %v", err)
	}
}

func TestCorpusSummaryAndBenchfmt(t *testing.T) {
	r := &CorpusReport{Rounds: 2, Corpus: "c.jsonl", Part: PartHeldOut, Basis: catalogue.BasisCostModel, Requests: []CorpusRequest{
		{Index: 3, ColdMs: 1000, ChosenMs: 200, PredictedMs: 250, PredictedColdMs: 1100, Cold: manifest.Stats{Runs: []float64{900, 1100}}, Chosen: manifest.Stats{Runs: []float64{190, 210}}},
		{Index: 12, ColdMs: 500, ChosenMs: 300, PredictedMs: 200, PredictedColdMs: 450, Cold: manifest.Stats{Runs: []float64{500, 500}}, Chosen: manifest.Stats{Runs: []float64{300, 300}}},
	}}
	r.Summary = summarize(r.Requests)
	s := r.Summary
	if s.MeanColdMs != 750 || s.MeanChosenMs != 250 || s.MeanPredictedMs != 225 || s.SavedMs != 500 || fmt.Sprintf("%.4f", s.ChosenOverCold) != "0.3333" {
		t.Errorf("summary %+v", s)
	}
	if fmt.Sprintf("%.2f", s.ModelErrorPct) != "11.11" || fmt.Sprintf("%.1f", s.MeanAbsErrorPct) != "35.0" {
		t.Errorf("model error %+v", s)
	}
	var buf bytes.Buffer
	if err := WriteCorpusBenchfmt(&buf, r); err != nil {
		t.Fatal(err)
	}
	text := buf.String()
	for _, want := range []string{
		"BenchmarkCorpus/req=00003/series=cold 1 900000000 ns/op 1100.0 predicted-ms\n",
		"BenchmarkCorpus/req=00012/series=chosen 1 300000000 ns/op 200.0 predicted-ms\n",
		"BenchmarkCorpusMean/series=cold 1 700000000 ns/op 775.0 predicted-ms\n",
		"BenchmarkCorpusMean/series=chosen 1 255000000 ns/op 225.0 predicted-ms\n",
	} {
		if !strings.Contains(text, want) {
			t.Errorf("bench.txt lacks %q:\n%s", want, text)
		}
	}
	if n := strings.Count(text, "BenchmarkCorpus/"); n != 8 {
		t.Errorf("%d run lines, want 8", n)
	}
	var svg bytes.Buffer
	if err := WriteCorpusChart(&svg, r); err != nil || !strings.Contains(svg.String(), "predicted (choice)") || !strings.Contains(svg.String(), "(predicted 225 ms)") {
		t.Errorf("chart: %v", err)
	}
}

// A request's packages route it: the pandas checkpoint holds pandas 1.5.3, so a request that
// needs pandas>=2 is replayed on the next best start (the empty checkpoint), one that does not
// on the pandas checkpoint.
func TestDrawRequestsPackages(t *testing.T) {
	c := &catalogue.Catalogue{
		Version:   catalogue.Version,
		CostModel: catalogue.CostModel{InterceptMs: 130, AlphaMsPerMiB: 1.5, ColdStartMs: 400, EmptyMiB: 8},
		Modules: map[string]catalogue.Module{
			"numpy":  {Available: true, OwnMs: 200, OwnMiB: 9.5, ImportMs: 200, MiB: 9.5, Closure: []string{"numpy"}},
			"pandas": {Available: true, OwnMs: 700, OwnMiB: 21, ImportMs: 900, MiB: 31, Closure: []string{"numpy", "pandas"}},
		},
		Checkpoints: []catalogue.Checkpoint{
			{ID: "empty", Imports: []string{}, Closure: []string{}, ImageMiB: 8, RestoreMedianMs: 150},
			{ID: "pandas", Imports: []string{"pandas"}, Closure: []string{"numpy", "pandas"}, ImageMiB: 40, RestoreMedianMs: 190,
				Packages: map[string]string{"pandas": "1.5.3", "numpy": "1.24.2"}},
		},
	}
	r, err := catalogue.NewRouter(c)
	if err != nil {
		t.Fatal(err)
	}
	x := &run.VerifiedOutput{Out: "/out", Manifest: &manifest.Manifest{Checkpoints: []manifest.Checkpoint{{ID: "empty", Dir: "empty"}, {ID: "pandas", Dir: "pandas"}}}}
	cor, err := corpus.Parse(strings.NewReader(`{"imports": ["pandas"], "packages": ["pandas>=2"]}
{"imports": ["pandas"], "packages": ["pandas<2"]}
{"imports": ["pandas"]}
`))
	if err != nil {
		t.Fatal(err)
	}
	trials, _, _, err := drawRequests(CorpusOptions{Corpus: cor, Sample: 4, Part: PartAll}, r, x)
	if err != nil {
		t.Fatal(err)
	}
	choice := map[int]string{}
	for _, tr := range trials {
		choice[tr.req.Line] = tr.req.Choice
	}
	if want := map[int]string{1: "empty", 2: "pandas", 3: "pandas"}; fmt.Sprint(choice) != fmt.Sprint(want) {
		t.Errorf("choices by line %v, want %v", choice, want)
	}
}

// A catalogue without measured prices (no cold start time): the draw routes by image size and
// carries no prediction, and the report, bench.txt and the chart give none either, never a
// price of 0 ms.
func TestCorpusByImageSize(t *testing.T) {
	c := twoCheckpoints(catalogue.CostModel{InterceptMs: 130, AlphaMsPerMiB: 1.5, EmptyMiB: 8}) // no cold start: no prices
	r, err := catalogue.NewRouter(c)
	if err != nil {
		t.Fatal(err)
	}
	cor, err := corpus.Parse(strings.NewReader(`{"imports": ["pandas.DataFrame"]}
{"imports": ["re"]}
{"imports": []}
{"imports": ["re", "numpy"]}
`))
	if err != nil {
		t.Fatal(err)
	}
	x := &run.VerifiedOutput{Out: "/out", Manifest: &manifest.Manifest{Checkpoints: []manifest.Checkpoint{{ID: "empty", Dir: "empty"}, {ID: "pandas", Dir: "pandas"}}}}
	trials, _, _, err := drawRequests(CorpusOptions{Corpus: cor, Sample: 4, Part: PartAll}, r, x)
	if err != nil {
		t.Fatal(err)
	}
	// pandas: the pandas checkpoint holds it; re: none holds it, cold; nothing: empty; re and
	// numpy: the pandas checkpoint holds numpy, and re is imported after either start.
	want := map[int]string{1: "pandas", 2: Cold, 3: "empty", 4: "pandas"}
	report := &CorpusReport{Rounds: 1, Corpus: "c.jsonl", Part: PartAll, Basis: r.Basis()}
	for _, tr := range trials {
		if tr.req.Choice != want[tr.req.Line] || tr.req.PredictedMs != 0 || tr.req.PredictedColdMs != 0 || tr.predictedPooled != 0 {
			t.Errorf("line %d: %+v, pooled %v ms; want %s, no prediction", tr.req.Line, tr.req, tr.predictedPooled, want[tr.req.Line])
		}
		req := tr.req
		req.Cold, req.Chosen = manifest.Stats{Runs: []float64{600}}, manifest.Stats{Runs: []float64{200}}
		req.ColdMs, req.ChosenMs = 600, 200
		report.Requests = append(report.Requests, req)
	}
	if len(trials) != 4 || report.Predicted() {
		t.Fatalf("%d trials, predicted %v", len(trials), report.Predicted())
	}
	report.Summary = summarize(report.Requests)
	data, err := json.Marshal(report)
	if err != nil {
		t.Fatal(err)
	}
	for _, key := range []string{"predicted_ms", "predicted_cold_ms", "mean_predicted_ms", "model_error_pct", "mean_abs_error_pct"} {
		if strings.Contains(string(data), `"`+key+`"`) {
			t.Errorf("corpus.json by image size has %s: %s", key, data)
		}
	}
	if !strings.Contains(string(data), `"basis":"image size"`) {
		t.Errorf("corpus.json without its basis: %s", data)
	}
	var buf bytes.Buffer
	if err := WriteCorpusBenchfmt(&buf, report); err != nil {
		t.Fatal(err)
	}
	if text := buf.String(); strings.Contains(text, "predicted-ms") || !strings.Contains(text, "BenchmarkCorpus/req=00000/series=chosen 1 200000000 ns/op\n") {
		t.Errorf("bench.txt by image size:\n%s", text)
	}
	var svg bytes.Buffer
	if err := WriteCorpusChart(&svg, report); err != nil || strings.Contains(svg.String(), "predicted (choice)") || !strings.Contains(svg.String(), "chosen by image size, not predicted") {
		t.Errorf("chart by image size: %v", err)
	}
}

// twoCheckpoints is a catalogue of numpy, pandas and re, with the checkpoints empty and pandas,
// under the cost model m.
func twoCheckpoints(m catalogue.CostModel) *catalogue.Catalogue {
	return &catalogue.Catalogue{
		Version:   catalogue.Version,
		CostModel: m,
		Modules: map[string]catalogue.Module{
			"numpy":  {Available: true, OwnMs: 200, OwnMiB: 9.5, ImportMs: 200, MiB: 9.5, Closure: []string{"numpy"}},
			"pandas": {Available: true, OwnMs: 700, OwnMiB: 21, ImportMs: 900, MiB: 31, Closure: []string{"numpy", "pandas"}},
			"re":     {Available: true, Closure: []string{"re"}},
		},
		Checkpoints: []catalogue.Checkpoint{
			{ID: "empty", Imports: []string{}, Closure: []string{}, ImageMiB: 8, RestoreMedianMs: 150},
			{ID: "pandas", Imports: []string{"pandas"}, Closure: []string{"numpy", "pandas"}, ImageMiB: 40, RestoreMedianMs: 190},
		},
	}
}
