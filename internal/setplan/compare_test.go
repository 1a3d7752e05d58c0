package setplan

import (
	"bytes"
	"fmt"
	"os"
	"testing"

	"readie.dev/pipeline/internal/analysis"
	"readie.dev/pipeline/internal/corpus"
	"readie.dev/pipeline/pkg/catalogue"
	"readie.dev/pipeline/pkg/catalogue/plan"
)

// corpusPath is the corpus BenchmarkSampleCorpus plans: $READIE_CORPUS, or the sample corpus
// beside the repository (../shared/corpus/requests.jsonl from its root).
func corpusPath() string {
	if p := os.Getenv("READIE_CORPUS"); p != "" {
		return p
	}
	return "../../../shared/corpus/requests.jsonl"
}

// BenchmarkSampleCorpus plans the sample corpus with the synthetic image's figures and reports
// each strategy's expected mean start cost (ms per request) on the planned and held-out parts.
// READIE_ANALYSIS names a real analysis.json (analyze's) to plan with instead, under the restore
// line and cold start it measured.
func BenchmarkSampleCorpus(b *testing.B) {
	c, err := corpus.Load(corpusPath())
	if err != nil {
		b.Fatal(err)
	}
	a, model := syntheticAnalysis(c.Names()), syntheticModel()
	if path := os.Getenv("READIE_ANALYSIS"); path != "" {
		if a, err = analysis.Load(path); err != nil {
			b.Fatal(err)
		}
		if a.Host == nil {
			b.Fatalf("%s has no host figures", path)
		}
		model = catalogue.CostModel{InterceptMs: a.Host.InterceptMs, AlphaMsPerMiB: a.Host.AlphaMsPerMiB, ColdStartMs: a.Host.ColdStartMs, EmptyMiB: a.Host.EmptyMiB}
	}
	var res *plan.Result
	for b.Loop() {
		if res, err = Plan(c, a, model, plan.DefaultOptions()); err != nil {
			b.Fatal(err)
		}
	}
	var buf bytes.Buffer
	res.WriteSummary(&buf)
	readie := readieGreedy(b, c, a, model, plan.DefaultOptions())
	fmt.Fprintf(&buf, "readie's closure-blind greedy, priced with closures: %d sets, %.1f MiB, mean %.1f ms planned, %.1f ms held out\n",
		len(readie.Sets), readie.TotalMiB, readie.Planned.MeanMs, readie.HeldOut.MeanMs)
	b.Log("\n" + buf.String())
	b.ReportMetric(readie.Planned.MeanMs, "readie-planned-ms")
	b.ReportMetric(readie.HeldOut.MeanMs, "readie-heldout-ms")
	for _, s := range res.Sets {
		b.Logf("%-40s %6.1f MiB %6.0f ms restore, serves %.0f", s.ID, s.PredictedMiB, s.RestoreMs, s.ServedWeight)
	}
	for _, s := range res.Strategies[plan.Greedy].Sets {
		b.Logf("greedy: %-40s %6.1f MiB %6.0f ms restore, serves %.0f", s.ID, s.PredictedMiB, s.RestoreMs, s.ServedWeight)
	}
	for _, name := range plan.Strategies() {
		b.ReportMetric(res.Strategies[name].Planned.MeanMs, name+"-planned-ms")
		b.ReportMetric(res.Strategies[name].HeldOut.MeanMs, name+"-heldout-ms")
	}
}

// closureBlind is the analysis as readie sees it: every module alone, its cold import time and
// memory as its own, no closure. Planning on it reproduces readie's greedy.
func closureBlind(a *analysis.File) *analysis.File {
	blind := &analysis.File{Version: a.Version, Image: a.Image, Stdlib: a.Stdlib, Names: map[string]analysis.Entry{}}
	for name, e := range a.Names {
		if e.Available {
			e.Closure = []string{e.Module}
			e.OwnMs, e.OwnMiB = e.ImportMs, e.MiB
		}
		blind.Names[name] = e
	}
	return blind
}

// readieGreedy plans with readie's closure-blind greedy and prices its sets with the real
// (closure-aware) model: what readie's planner would achieve on this image.
func readieGreedy(b *testing.B, c *corpus.Corpus, a *analysis.File, model catalogue.CostModel, opt plan.Options) *plan.Strategy {
	blind, err := Plan(c, closureBlind(a), model, opt)
	if err != nil {
		b.Fatal(err)
	}
	var sets [][]string
	for _, s := range blind.Strategies[plan.Greedy].Sets {
		sets = append(sets, s.Imports)
	}
	st, err := plan.Price(Input(c, a), model, sets)
	if err != nil {
		b.Fatal(err)
	}
	return st
}
