package setplan

import (
	"bytes"
	"syscall"
	"testing"

	"readie.dev/pipeline/internal/corpus"
	"readie.dev/pipeline/pkg/catalogue/plan"
)

// BenchmarkPlanSets100k is plan-sets on a synthetic corpus of 100,000 requests: parsing the
// corpus and planning every strategy (the target: under 10 s). The analysis is built outside the
// timer: the command loads it from analysis.json. cpu-s/op is the process's CPU time per plan,
// which a busy machine inflates less than the wall time.
func BenchmarkPlanSets100k(b *testing.B) {
	data := syntheticCorpus(100_000, 1)
	c, err := corpus.Parse(bytes.NewReader(data))
	if err != nil {
		b.Fatal(err)
	}
	a := syntheticAnalysis(c.Names())
	var res *plan.Result
	cpu := cpuSeconds()
	for b.Loop() {
		c, err := corpus.Parse(bytes.NewReader(data))
		if err != nil {
			b.Fatal(err)
		}
		if res, err = Plan(c, a, syntheticModel(), plan.DefaultOptions()); err != nil {
			b.Fatal(err)
		}
	}
	b.ReportMetric((cpuSeconds()-cpu)/float64(b.N), "cpu-s/op")
	var buf bytes.Buffer
	res.WriteSummary(&buf)
	b.Log("\n" + buf.String())
	b.ReportMetric(float64(res.Corpus.Planned.DistinctNeeds), "distinct-needs")
	b.ReportMetric(res.Strategies[plan.Planned].Planned.MeanMs, "plan-ms")
	b.ReportMetric(res.Strategies[plan.Greedy].Planned.MeanMs, "greedy-ms")
}

// cpuSeconds is the CPU time (user and system) the process has used.
func cpuSeconds() float64 {
	var ru syscall.Rusage
	if err := syscall.Getrusage(syscall.RUSAGE_SELF, &ru); err != nil {
		return 0
	}
	return float64(ru.Utime.Nano()+ru.Stime.Nano()) / 1e9
}
