package plan

import (
	"errors"
	"fmt"
	"math/rand/v2"
	"slices"
	"strconv"
	"strings"
	"testing"

	"readie.dev/pipeline/pkg/catalogue"
	"readie.dev/pipeline/pkg/checkpointid"
)

// The planner's own tests; internal/setplan tests it on corpora and analyses.

func TestBaseID(t *testing.T) {
	long := []string{"sklearn.feature_extraction.text", "sklearn.model_selection", "sklearn.neural_network", "matplotlib.pyplot"}
	for _, tc := range []struct {
		imports []string
		id      string
	}{
		{[]string{"matplotlib.pyplot", "pandas"}, "matplotlib_pyplot-pandas"},
		{[]string{"empty"}, "empty-" + hashOf("empty")},
		{long, "sklearn_feature_extraction_text-sklearn_model_selection-" + hashOf(strings.Join(long, ","))},
	} {
		if got := baseID(tc.imports); got != tc.id {
			t.Errorf("baseID(%v) = %q, want %q", tc.imports, got, tc.id)
		}
		if !checkpointid.Valid(baseID(tc.imports)) {
			t.Errorf("baseID(%v) = %q is not a valid id", tc.imports, baseID(tc.imports))
		}
	}
}

func hashOf(s string) string { return hashedID("x", strings.Split(s, ","))[2:] }

func TestMinimalImports(t *testing.T) {
	// c and d import each other: the first by name is kept. e is pulled in by b.
	closures := map[string][]string{"a": {"a"}, "b": {"a", "b", "e"}, "c": {"c", "d"}, "d": {"c", "d"}, "e": {"e"}}
	modules := map[string]catalogue.Module{}
	for m, c := range closures {
		modules[m] = catalogue.Module{Available: true, ImportMs: 1, MiB: 1, OwnMs: 1, OwnMiB: 1, Closure: c}
	}
	x, err := index(modules, catalogue.CostModel{})
	if err != nil {
		t.Fatal(err)
	}
	pos := func(n string) int { i, _ := x.Position(n); return i }
	if got := minimalImports(x, x.Load(pos("b"), pos("d"), pos("a"))); !slices.Equal(got, []string{"b", "c"}) {
		t.Errorf("minimal imports %v, want [b c]", got)
	}
}

// mod is a module of a hand-made analysis: own time, own memory, what it imports.
type mod struct {
	ms, mib float64
	deps    []string
}

// handInput builds the planner's input from mods (NewIndex makes the closures transitive) and
// requests, every one planned from: each line is "weight:name,name", each name a module.
func handInput(t testing.TB, mods map[string]mod, lines ...string) Input {
	in := Input{Names: map[string]string{}, Modules: map[string]catalogue.Module{}}
	for m, d := range mods {
		in.Names[m] = m
		in.Modules[m] = catalogue.Module{Available: true, OwnMs: d.ms, OwnMiB: d.mib, Closure: append([]string{m}, d.deps...)}
	}
	for i, l := range lines {
		w, names, _ := strings.Cut(l, ":")
		weight, err := strconv.ParseFloat(w, 64)
		if err != nil {
			t.Fatal(err)
		}
		r := Request{Weight: weight, Line: i + 1}
		for n := range strings.SplitSeq(names, ",") {
			if n != "" {
				r.Imports = append(r.Imports, n)
			}
		}
		in.Requests = append(in.Requests, r)
	}
	return in
}

// On small random problems the plan is never worse than greedy, and never better than the
// optimum found by trying every pair of sets the modules can form (which would mean it
// mispriced something).
func TestPlanAgainstBruteForce(t *testing.T) {
	rng := rand.New(rand.NewPCG(1, 2))
	names := []string{"m0", "m1", "m2", "m3", "m4", "m5"}
	hits := 0
	const trials = 40
	for trial := range trials {
		mods := map[string]mod{}
		for i, n := range names {
			var deps []string
			for j := range i {
				if rng.IntN(4) == 0 {
					deps = append(deps, names[j])
				}
			}
			mods[n] = mod{ms: float64(10 * rng.IntN(60)), mib: float64(rng.IntN(40)), deps: deps}
		}
		var lines []string
		for range 12 {
			var req []string
			for _, n := range names {
				if rng.IntN(3) == 0 {
					req = append(req, n)
				}
			}
			lines = append(lines, fmt.Sprintf("%d:%s", 1+rng.IntN(5), strings.Join(req, ",")))
		}
		model := catalogue.CostModel{InterceptMs: 100, AlphaMsPerMiB: float64(rng.IntN(4)), ColdStartMs: float64(100 + rng.IntN(400)), EmptyMiB: 10}
		in := handInput(t, mods, lines...)
		opt := Options{MaxSets: 2, BudgetMiB: float64(60 + rng.IntN(200))}
		res, err := Plan(in, model, opt)
		if err != nil {
			t.Fatal(err)
		}
		p, err := newProblem(in, model)
		if err != nil {
			t.Fatal(err)
		}
		s := p.searcher(opt.MaxSets, opt.BudgetMiB)
		// Every closed set: the union of the closures of a subset of the modules.
		seen := map[string]bool{}
		var closed []cand
		for mask := 1; mask < 1<<len(names); mask++ {
			loaded := p.x.NewSet()
			for i := range names {
				if mask&(1<<i) != 0 {
					loaded.Or(p.x.Closure(i))
				}
			}
			if k := loaded.Key(); !seen[k] {
				seen[k] = true
				closed = append(closed, p.cand(loaded))
			}
		}
		optimum := s.assign(nil).total
		for i := range closed {
			for j := i; j < len(closed); j++ {
				sets := []cand{closed[i]}
				if j != i {
					sets = append(sets, closed[j])
				}
				if mibOf(sets) <= opt.BudgetMiB {
					optimum = min(optimum, s.assign(sets).total)
				}
			}
		}
		plan, greedy := res.Strategies[Planned].Planned, res.Strategies[Greedy].Planned
		got := plan.MeanMs * plan.Weight
		if got < optimum*(1-1e-12) || plan.MeanMs > greedy.MeanMs*(1+1e-12) {
			t.Errorf("trial %d: plan %v, greedy %v, optimum %v (totals over the planned part)", trial, got, greedy.MeanMs*greedy.Weight, optimum)
		}
		if res.Strategies[Planned].TotalMiB > opt.BudgetMiB {
			t.Errorf("trial %d: %v MiB over the budget %v", trial, res.Strategies[Planned].TotalMiB, opt.BudgetMiB)
		}
		if got <= optimum*(1+1e-12) {
			hits++
		} else {
			t.Logf("trial %d: plan %.1f greedy %.1f optimum %.1f (+%.2f%%)", trial, got, greedy.MeanMs*greedy.Weight, optimum, 100*(got/optimum-1))
		}
	}
	t.Logf("the plan found the optimum in %d of %d problems", hits, trials)
}

// Price prices the plan's own sets as the plan did, and refuses a set of a module it does not
// know.
func TestPrice(t *testing.T) {
	mods := map[string]mod{"numpy": {100, 10, nil}, "networkx": {400, 40, nil}, "pandas": {200, 10, []string{"numpy"}}}
	in := handInput(t, mods, "1:numpy", "1:networkx", "3:numpy,networkx", "2:pandas", "1:")
	model := catalogue.CostModel{InterceptMs: 100, AlphaMsPerMiB: 1, ColdStartMs: 1000}
	res, err := Plan(in, model, Options{MaxSets: 2, BudgetMiB: 1000})
	if err != nil {
		t.Fatal(err)
	}
	want := res.Strategies[Planned]
	var sets [][]string
	for _, s := range want.Sets {
		sets = append(sets, s.Imports)
	}
	got, err := Price(in, model, sets)
	if err != nil {
		t.Fatal(err)
	}
	if got.Planned != want.Planned || got.TotalMiB != want.TotalMiB || !slices.EqualFunc(got.Sets, want.Sets, func(a, b PlannedSet) bool {
		return a.ID == b.ID && a.ServedWeight == b.ServedWeight && a.RestoreMs == b.RestoreMs
	}) {
		t.Errorf("priced %+v, planned %+v", got, want)
	}
	if _, err := Price(in, model, [][]string{{"numpy", "torch"}}); !errors.Is(err, ErrInput) || !strings.Contains(err.Error(), `"torch"`) {
		t.Errorf("unknown module: %v", err)
	}
}
