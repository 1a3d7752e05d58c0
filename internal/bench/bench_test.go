package bench

import (
	"bytes"
	"context"
	"errors"
	"math"
	"strings"
	"testing"

	"readie.dev/pipeline/internal/config"
)

func TestScheduleInterleaves(t *testing.T) {
	series := []string{"A", "B", "C", "D"}
	trials := Schedule(2, 3, series)
	if len(trials) != 2*3*4 {
		t.Fatalf("%d trials", len(trials))
	}
	var got []string
	for _, tr := range trials[:8] {
		got = append(got, string(rune('0'+tr.Set))+tr.Series)
	}
	if s := strings.Join(got, " "); s != "0A 0B 0C 0D 1A 1B 1C 1D" {
		t.Fatalf("round 1 order: %s", s)
	}
	// Every series appears once per set before any repeats: never all A then all B.
	for i, tr := range trials {
		if tr.Round != i/8 {
			t.Fatalf("trial %d is in round %d", i, tr.Round)
		}
	}
}

type fakeRunner struct {
	calls []string
	times map[string]float64
}

func (f *fakeRunner) Run(ctx context.Context, set MeasuredSet, series string) (float64, error) {
	f.calls = append(f.calls, set.ID+"/"+series)
	ms := f.times[series] + float64(len(f.calls)%3) // a little spread
	if set.ID == "big" {
		ms += 50
	}
	return ms, nil
}

func TestExecuteStatisticsAndRatios(t *testing.T) {
	runner := &fakeRunner{times: map[string]float64{Floor: 250, Cold: 2000, Restore: 400, Prestarted: 150, Pooled: 100, Warm: 10, Measure: 350}}
	sets := []MeasuredSet{{ID: "small", Bytes: 8 << 20}, {ID: "big", Bytes: 40 << 20}}
	res, err := Execute(context.Background(), sets, CoreSeries(), 3, runner, nil)
	if err != nil {
		t.Fatal(err)
	}
	// One warm-up round, then 3 measured ones; the warm-up's figures are not kept.
	if len(runner.calls) != 2*4*7 || runner.calls[0] != "small/floor" || runner.calls[7] != "big/floor" || runner.calls[14] != "small/floor" {
		t.Fatalf("calls %v", runner.calls)
	}
	if res.WarmupRounds != 1 || res.Rounds != 3 {
		t.Fatalf("warm-up %d, rounds %d", res.WarmupRounds, res.Rounds)
	}
	small := res.Sets[0]
	if st := small.Series[Restore]; len(st.Runs) != 3 || st.Min > st.Median || st.Median > st.P90 || st.P90 > st.Max {
		t.Fatalf("restore stats %+v", st)
	}
	want := small.Series[Cold].Median / small.Series[Restore].Median
	if math.Abs(small.Ratios["cold/restore"]-want) > 1e-9 || small.Ratios["restore/floor"] <= 1 || small.Ratios["prestarted/floor"] >= 1 ||
		math.Abs(small.Ratios["pooled/floor"]-small.Series[Pooled].Median/small.Series[Floor].Median) > 1e-9 ||
		math.Abs(small.Ratios["warm/floor"]-small.Series[Warm].Median/small.Series[Floor].Median) > 1e-9 {
		t.Fatalf("ratios %+v", small.Ratios)
	}
	// measure medians: small ~351, big ~401 over 8 and 40 MiB: slope ~50/32 ms per MiB.
	if res.Fit.Points != 2 || math.Abs(res.Fit.AlphaMsPerMiB-(res.Sets[1].Series[Measure].Median-small.Series[Measure].Median)/32) > 1e-9 {
		t.Fatalf("fit %+v", res.Fit)
	}
}

type failingRunner struct{}

func (failingRunner) Run(context.Context, MeasuredSet, string) (float64, error) {
	return 0, errors.New("sandbox exploded")
}

func TestExecuteNamesTheFailedTrial(t *testing.T) {
	_, err := Execute(context.Background(), []MeasuredSet{{ID: "pandas"}}, []string{Cold}, 2, failingRunner{}, nil)
	if err == nil || !strings.Contains(err.Error(), "pandas, cold, warm-up round: sandbox exploded") {
		t.Fatalf("err = %v", err)
	}
}

func TestFastest(t *testing.T) {
	runner := &fakeRunner{times: map[string]float64{"variant:none": 500, "variant:-direct": 450, "variant:-background": 300,
		"variant:cold,none": 900, "variant:cold,-direct": 700}}
	vs := Variants([]config.BenchVariant{{Name: "none"}, {Name: "-direct", RestoreFlags: []string{"-direct"}}, {Name: "-background", RestoreFlags: []string{"-background"}},
		{Name: "cold,none", PageCache: "cold"}, {Name: "cold,-direct", RestoreFlags: []string{"-direct"}, PageCache: "cold"}})
	var names []string
	for _, v := range vs {
		names = append(names, v.Name)
	}
	res, err := Execute(context.Background(), []MeasuredSet{{ID: "a"}, {ID: "b"}}, names, 2, runner, nil)
	if err != nil {
		t.Fatal(err)
	}
	if v, ok := res.Fastest(vs, false); !ok || v.Name != "variant:-background" {
		t.Fatalf("fastest = %+v %v", v, ok)
	}
	// A cold page cache is another state of the machine, not a choice: compared apart.
	if v, ok := res.Fastest(vs, true); !ok || v.Name != "variant:cold,-direct" || !v.ColdPageCache {
		t.Fatalf("fastest with a cold page cache = %+v %v", v, ok)
	}
}

func TestWriteChartPanels(t *testing.T) {
	runner := &fakeRunner{times: map[string]float64{Floor: 250, Cold: 2000, Restore: 400, Prestarted: 150, Measure: 350}}
	sets := []MeasuredSet{{ID: "small", Bytes: 8 << 20}, {ID: "big", Bytes: 40 << 20}}
	res, err := Execute(context.Background(), sets, CoreSeries(), 3, runner, nil)
	if err != nil {
		t.Fatal(err)
	}
	conc := []Concurrent{
		{Set: "big", Series: Restore, Concurrency: 1, Latency: Summarize([]float64{300, 320})},
		{Set: "big", Series: Restore, Concurrency: 2, Latency: Summarize([]float64{400, 450, 430, 410})},
	}
	var svg bytes.Buffer
	if err := WriteChart(&svg, res, conc); err != nil {
		t.Fatal(err)
	}
	for _, want := range []string{"Time to a ready executor", "Restore against image size", "R²", "Restores at once", "prestarted"} {
		if !strings.Contains(svg.String(), want) {
			t.Errorf("the chart lacks %q", want)
		}
	}
}

// TestOneSizeHasNoCostModel: one image size cannot give a line; the figures say so instead of
// drawing a flat one with R² 0.
func TestOneSizeHasNoCostModel(t *testing.T) {
	runner := &fakeRunner{times: map[string]float64{Floor: 250, Cold: 2000, Restore: 400, Prestarted: 150, Measure: 350}}
	res, err := Execute(context.Background(), []MeasuredSet{{ID: "only", Bytes: 8 << 20}}, CoreSeries(), 2, runner, nil)
	if err != nil {
		t.Fatal(err)
	}
	if res.Fit.Fitted() || !strings.Contains(res.Fit.Describe(), "needs at least two image sizes") {
		t.Fatalf("fit %+v: %s", res.Fit, res.Fit.Describe())
	}
	var svg bytes.Buffer
	if err := WriteChart(&svg, res, nil); err != nil {
		t.Fatal(err)
	}
	if strings.Contains(svg.String(), "R²") || !strings.Contains(svg.String(), "no cost model") {
		t.Error("the chart draws a cost model from one size")
	}
}
