package bench

import (
	"bytes"
	"fmt"
	"math/rand/v2"
	"os"
	"path/filepath"
	"strings"
	"testing"
)

// syntheticResults is a bench run of sets (name and MiB) with every core series, variants
// variants and their last-page series, with runs spread as a loaded machine spreads them.
func syntheticResults(sets map[string]float64, order []string, variants, rounds int) *Results {
	rng := rand.New(rand.NewPCG(1, 2))
	series := CoreSeries()
	names := []string{"none", "-direct", "-background", "-direct,-background", "zero-pages,-direct", "zero-pages,-direct,-background", "cold-cache,none", "cold-cache,-direct", "cold-cache,-background", "a-very-long-variant-name-that-goes-on"}
	for i := range variants {
		series = append(series, VariantPrefix+names[i%len(names)]+strings.Repeat("'", i/len(names)))
	}
	for i := range variants {
		series = append(series, series[len(CoreSeries())+i]+LastPageSuffix)
	}
	r := &Results{Rounds: rounds, WarmupRounds: 1, Series: series}
	for _, id := range order {
		mib := sets[id]
		rep := SetReport{MeasuredSet: MeasuredSet{ID: id, Bytes: int64(mib * (1 << 20))}, Series: map[string]Stats{}}
		for k, name := range series {
			base := 100 + 2*mib + float64(k*15)
			if name == Cold {
				base = 700 + 20*mib
			}
			runs := make([]float64, rounds)
			for i := range runs {
				runs[i] = base * (1 + 0.3*rng.ExpFloat64()*rng.Float64())
			}
			if name == Cold { // a loaded machine's outlier: five digits at the scale's end
				runs[0] *= 12
			}
			rep.Series[name] = Summarize(runs)
		}
		r.Sets = append(r.Sets, rep)
	}
	r.Fit = fitSizes(r.Sets)
	return r
}

func syntheticConcurrency(set string, series []string, ks []int) []Concurrent {
	var cs []Concurrent
	for i, name := range series {
		for _, k := range ks {
			var runs []float64
			for j := range 2 * k {
				runs = append(runs, float64(150+40*k+10*i+j*7))
			}
			cs = append(cs, Concurrent{Set: set, Series: name, Concurrency: k, Latency: Summarize(runs)})
		}
	}
	return cs
}

// TestChartLayout draws charts of runs shaped like those bench makes (one set with every
// default variant, the default three sets, a size sweep of many near sizes, restores at once
// of many series) and checks each: no text over a mark or another text, nothing outside the
// picture, every series named, and no panel without data.
func TestChartLayout(t *testing.T) {
	three := map[string]float64{"empty": 8, "numpy": 17.5, "pandas": 39.7}
	sweep := map[string]float64{}
	var sweepOrder []string
	for i, mib := range []float64{9.6, 9.9, 10.1, 17.5, 18, 39.7, 40.2, 61, 95.6} {
		id := fmt.Sprintf("stack-%d", i)
		sweep[id], sweepOrder = mib, append(sweepOrder, id)
	}
	for _, tc := range []struct {
		name   string
		res    *Results
		conc   []Concurrent
		panels []string
	}{
		{"one set, every variant", syntheticResults(map[string]float64{"small": 8.2}, []string{"small"}, 9, 2),
			syntheticConcurrency("small", []string{Restore, "variant:none", "variant:-direct", "variant:-background", "variant:-direct,-background", "variant:zero-pages,-direct", "variant:zero-pages,-direct,-background"}, []int{1, 2}),
			[]string{"Time to a ready executor", "Distribution", "one size: no cost model", "Restores at once"}},
		{"the default sets", syntheticResults(three, []string{"empty", "numpy", "pandas"}, 9, 7),
			syntheticConcurrency("pandas", []string{Restore, "variant:-direct"}, []int{1, 2, 4, 16}),
			[]string{"Time to a ready executor", "Distribution", "cost model: ", "Restores at once"}},
		{"a size sweep", syntheticResults(sweep, sweepOrder, 0, 5), nil,
			[]string{"Time to a ready executor", "Distribution", "cost model: "}},
		{"many variants", syntheticResults(three, []string{"empty", "numpy", "pandas"}, 20, 3), nil,
			[]string{"Time to a ready executor", "Distribution", "cost model: "}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			var svg bytes.Buffer
			if err := WriteChart(&svg, tc.res, tc.conc); err != nil {
				t.Fatal(err)
			}
			names := tc.res.Series
			for _, c := range tc.conc {
				names = append(names, c.Series)
			}
			if err := CheckChart(svg.Bytes(), names); err != nil {
				t.Errorf("%s: %v", tc.name, err)
			}
			for _, want := range tc.panels {
				if !strings.Contains(svg.String(), want) {
					t.Errorf("the chart lacks %q", want)
				}
			}
			if tc.conc == nil && strings.Contains(svg.String(), "Restores at once") {
				t.Error("a panel of restores at once without any")
			}
			if dir := os.Getenv("READIE_CHART_DIR"); dir != "" { // to look at them: rsvg-convert
				os.WriteFile(filepath.Join(dir, strings.ReplaceAll(tc.name, " ", "-")+".svg"), svg.Bytes(), 0o644)
			}
		})
	}
}

// TestChartLeavesEmptyPanelsOut: with no measure series there is no size panel at all (it was
// once drawn with axes from -1 to 1).
func TestChartLeavesEmptyPanelsOut(t *testing.T) {
	res := syntheticResults(map[string]float64{"a": 8}, []string{"a"}, 0, 3)
	for i := range res.Sets {
		delete(res.Sets[i].Series, Measure)
	}
	res.Series = res.Series[:len(res.Series)-1] // Measure is the last core series
	var svg bytes.Buffer
	if err := WriteChart(&svg, res, nil); err != nil {
		t.Fatal(err)
	}
	if strings.Contains(svg.String(), "against image size") || strings.Contains(svg.String(), "at once") {
		t.Errorf("panels without data drawn:\n%s", svg.String())
	}
	if err := CheckChart(svg.Bytes(), res.Series); err != nil {
		t.Error(err)
	}
}

// TestCheckChartFindsFaults: the check itself finds a text over a mark, two texts over each
// other, a text cut at the edge and a series not named.
func TestCheckChartFindsFaults(t *testing.T) {
	head := `<svg xmlns="http://www.w3.org/2000/svg" width="200" height="100">`
	for _, tc := range []struct{ body, want string }{
		{`<text x="10" y="50" font-size="11" text-anchor="start">restore</text><circle class="mark" cx="20" cy="47" r="4"/>`, `text "restore" overlaps the mark`},
		{`<text x="10" y="50" font-size="11" text-anchor="start">restore</text><text x="30" y="52" font-size="11" text-anchor="start">floor</text>`, `text "restore" overlaps text "floor"`},
		{`<text x="190" y="50" font-size="11" text-anchor="start">restore</text>`, "not inside the picture"},
		{`<text x="10" y="50" font-size="11" text-anchor="start">floor</text><path class="mark" d="M1 1 L300 1 L2 2 Z"/>`, "not inside the picture"},
		{`<text x="10" y="50" font-size="11" text-anchor="start">floor</text>`, `the series "restore" is named nowhere`},
	} {
		err := CheckChart([]byte(head+tc.body+"</svg>"), []string{"restore"})
		if err == nil || !strings.Contains(err.Error(), tc.want) {
			t.Errorf("%s: %v, want %q", tc.body, err, tc.want)
		}
	}
	if err := CheckChart([]byte(head+`<text x="10" y="50" font-size="11" text-anchor="start">restore</text></svg>`), []string{"restore"}); err != nil {
		t.Errorf("a clean picture: %v", err)
	}
}
