package cost

import (
	"math"
	"slices"
	"testing"
)

// stack is the own figures of catalogue_test.go's small analysis, round numbers: numpy 100 ms
// 10 MiB, pandas 300/20, matplotlib 200/15, pyplot 100/5, seaborn 150/5, re 0/0.
func stack() map[string]Module {
	return map[string]Module{
		"numpy":             {Available: true, OwnMs: 100, OwnMiB: 10, Closure: []string{"numpy"}},
		"pandas":            {Available: true, OwnMs: 300, OwnMiB: 20, Closure: []string{"numpy", "pandas"}},
		"matplotlib":        {Available: true, OwnMs: 200, OwnMiB: 15, Closure: []string{"matplotlib", "numpy"}},
		"matplotlib.pyplot": {Available: true, OwnMs: 100, OwnMiB: 5, Closure: []string{"matplotlib", "matplotlib.pyplot", "numpy"}},
		// seaborn's closure lists pandas but not numpy: NewIndex closes it transitively.
		"seaborn":      {Available: true, OwnMs: 150, OwnMiB: 5, Closure: []string{"matplotlib.pyplot", "pandas", "seaborn"}},
		"re":           {Available: true, Closure: []string{"re"}},
		"transformers": {Available: false},
	}
}

func model() Model {
	return Model{InterceptMs: 100, AlphaMsPerMiB: 2, ColdStartMs: 150, EmptyMiB: 10}
}

func TestIndexClosuresAndPrices(t *testing.T) {
	x, err := NewIndex(stack(), model())
	if err != nil {
		t.Fatal(err)
	}
	seaborn, _ := x.Position("seaborn")
	if got := x.Names(x.Closure(seaborn)); !slices.Equal(got, []string{"matplotlib", "matplotlib.pyplot", "numpy", "pandas", "seaborn"}) {
		t.Fatalf("seaborn's closure %v", got)
	}
	// numpy is shared by pandas and matplotlib: counted once.
	p, _ := x.Position("pandas")
	m, _ := x.Position("matplotlib")
	both := x.Load(p, m)
	pr := x.Pricer()
	if got := pr.ImageMiB(both); got != 10+10+20+15 {
		t.Errorf("image of pandas+matplotlib %v MiB, want 55", got)
	}
	if got := pr.ImportMs(both, x.Load(p)); got != 200 {
		t.Errorf("import of matplotlib on pandas %v ms, want 200", got)
	}
	if got := pr.Cost(pr.PredictedOption(x.Load(p)), x.Closure(seaborn)); got != 100+2*40+200+100+150 {
		t.Errorf("seaborn on a pandas checkpoint %v ms, want 630", got)
	}
	if got := pr.Cost(pr.ColdOption(), x.Closure(seaborn)); got != 150+850 {
		t.Errorf("seaborn cold %v ms, want 1000", got)
	}
	for name, want := range map[string]string{
		"matplotlib.pyplot.plot": "matplotlib.pyplot", "matplotlib.cm": "matplotlib", "transformers.pipeline": "transformers",
		"re": "re", "numpyx": "",
	} {
		if got, _ := x.Resolve(name); got != want {
			t.Errorf("Resolve(%s) = %q, want %q", name, got, want)
		}
	}
}

func TestCostBelow(t *testing.T) {
	x, err := NewIndex(stack(), model())
	if err != nil {
		t.Fatal(err)
	}
	seaborn, _ := x.Position("seaborn")
	need := x.Closure(seaborn)
	pr := x.Pricer()
	empty := pr.PredictedOption(x.NewSet()) // 120 ms + 850 ms of imports
	for _, tc := range []struct {
		limit float64
		ok    bool
	}{{math.Inf(1), true}, {971, true}, {970, false}, {500, false}, {120, false}, {100, false}} {
		got, ok := pr.CostBelow(empty, need, tc.limit)
		if ok != tc.ok || (ok && got != pr.Cost(empty, need)) || (!ok && got >= tc.limit && got > pr.Cost(empty, need)) {
			t.Errorf("CostBelow(limit %v) = %v, %v; Cost %v", tc.limit, got, ok, pr.Cost(empty, need))
		}
	}
}
