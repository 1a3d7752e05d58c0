package setplan

import (
	"bytes"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"math"
	"runtime"
	"slices"
	"strings"
	"testing"

	"readie.dev/pipeline/internal/analysis"
	"readie.dev/pipeline/internal/config"
	"readie.dev/pipeline/internal/corpus"
	"readie.dev/pipeline/pkg/catalogue"
	"readie.dev/pipeline/pkg/catalogue/plan"
)

// mod is a module of a hand-made analysis: own time, own memory, what it imports.
type mod struct {
	ms, mib float64
	deps    []string
}

// handAnalysis builds an analysis from mods (closures made transitive); names maps names as
// written to modules ("" for a module the image lacks).
func handAnalysis(mods map[string]mod, names map[string]string) *analysis.File {
	f := &analysis.File{Version: analysis.Version, Names: map[string]analysis.Entry{}}
	var walk func(m string, into map[string]bool)
	walk = func(m string, into map[string]bool) {
		if !into[m] {
			into[m] = true
			for _, d := range mods[m].deps {
				walk(d, into)
			}
		}
	}
	entry := func(m string) analysis.Entry {
		members := map[string]bool{}
		walk(m, members)
		e := analysis.Entry{Module: m, Available: true, OwnMs: mods[m].ms, OwnMiB: mods[m].mib}
		for c := range members {
			e.Closure = append(e.Closure, c)
		}
		slices.Sort(e.Closure)
		for _, c := range e.Closure {
			e.ImportMs += mods[c].ms
			e.MiB += mods[c].mib
		}
		return e
	}
	for m := range mods {
		f.Names[m] = entry(m)
	}
	for n, m := range names {
		if m == "" {
			top, _, _ := strings.Cut(n, ".")
			f.Names[n] = analysis.Entry{Module: top}
		} else {
			f.Names[n] = entry(m)
		}
	}
	return f
}

// requests makes a JSON Lines corpus: each entry is "weight:name,name".
func requests(t testing.TB, lines ...string) *corpus.Corpus {
	var sb strings.Builder
	for _, l := range lines {
		w, names, _ := strings.Cut(l, ":")
		var quoted []string
		for n := range strings.SplitSeq(names, ",") {
			if n != "" {
				quoted = append(quoted, fmt.Sprintf("%q", n))
			}
		}
		fmt.Fprintf(&sb, "{\"imports\": [%s], \"weight\": %s}\n", strings.Join(quoted, ", "), w)
	}
	c, err := corpus.Parse(strings.NewReader(sb.String()))
	if err != nil {
		t.Fatal(err)
	}
	return c
}

// allPlanned places lines at the indexes of the planned part, in order, and copies of the first
// line at the held-out indexes between them: the planned part is exactly lines.
func allPlanned(lines ...string) []string {
	var out []string
	for i := 0; len(lines) > 0; i++ {
		if corpus.HeldOut(i) {
			out = append(out, lines[0])
			continue
		}
		out = append(out, lines[0])
		lines = lines[1:]
	}
	return out
}

func ids(sets []plan.PlannedSet) []string {
	out := []string{}
	for _, s := range sets {
		out = append(out, s.ID)
	}
	return out
}

// The stack: numpy 100 ms 10 MiB; pandas 200/10 on numpy; seaborn 300/10 on pandas. Restores
// cost 100 ms + 1 ms/MiB, a cold start 500 ms, the empty image 0 MiB. One request of each.
//
//	set      size  restore  seaborn  pandas  numpy  total
//	seaborn  30    130      130      130     130    390
//	pandas   20    120      420      120     120    660
//	numpy    10    110      610      310     110   1030
//	(none)   -     100      700      400     200   1300 (empty; cold is dearer)
func stackAnalysis() *analysis.File {
	return handAnalysis(map[string]mod{
		"numpy":   {100, 10, nil},
		"pandas":  {200, 10, []string{"numpy"}},
		"seaborn": {300, 10, []string{"pandas"}},
	}, map[string]string{"pandas.DataFrame": "pandas"})
}

func stackModel() catalogue.CostModel {
	return catalogue.CostModel{InterceptMs: 100, AlphaMsPerMiB: 1, ColdStartMs: 500, EmptyMiB: 0}
}

func TestPlanKnownOptima(t *testing.T) {
	stack := requests(t, allPlanned("1:seaborn", "1:pandas.DataFrame", "1:numpy")...)
	for _, tc := range []struct {
		name   string
		budget float64
		k      int
		want   []string
		mean   float64 // planned mean for plan and greedy
	}{
		{"closures: seaborn holds pandas and numpy", 1000, 1, []string{"seaborn"}, 390.0 / 3},
		{"budget leaves out seaborn", 25, 1, []string{"pandas"}, 660.0 / 3},
		{"budget leaves only numpy", 15, 1, []string{"numpy"}, 1030.0 / 3},
		{"budget leaves nothing", 5, 1, []string{}, 1300.0 / 3},
		{"no sets", 1000, 0, []string{}, 1300.0 / 3},
		// With seaborn, a set of numpy saves 20 ms on the numpy request, one of pandas 10 on
		// the pandas and the numpy requests: a tie, which goes to the set of fewer modules.
		{"K=2", 1000, 2, []string{"numpy", "seaborn"}, (130 + 130 + 110) / 3.0},
	} {
		t.Run(tc.name, func(t *testing.T) {
			res, err := Plan(stack, stackAnalysis(), stackModel(), plan.Options{MaxSets: tc.k, BudgetMiB: tc.budget})
			if err != nil {
				t.Fatal(err)
			}
			for _, name := range []string{plan.Greedy, plan.Planned} {
				s := res.Strategies[name]
				if got := ids(s.Sets); !slices.Equal(got, tc.want) {
					t.Errorf("%s: sets %v, want %v", name, got, tc.want)
				}
				if math.Abs(s.Planned.MeanMs-tc.mean) > 1e-9 {
					t.Errorf("%s: mean %v, want %v", name, s.Planned.MeanMs, tc.mean)
				}
			}
		})
	}
	res, err := Plan(stack, stackAnalysis(), stackModel(), plan.Options{MaxSets: 1, BudgetMiB: 1000})
	if err != nil {
		t.Fatal(err)
	}
	want := plan.PlannedSet{ID: "seaborn", Imports: []string{"seaborn"}, Closure: []string{"numpy", "pandas", "seaborn"}, PredictedMiB: 30, RestoreMs: 130}
	got := res.Sets[0]
	got.ServedWeight = 0
	if !slicesEqualSet(got, want) {
		t.Errorf("set %+v, want %+v", got, want)
	}
	if s := res.Strategies[plan.Cold]; s.Planned.MeanMs != (1100+800+600)/3.0 || s.Planned.ColdShare != 1 {
		t.Errorf("cold %+v", s.Planned)
	}
}

func slicesEqualSet(a, b plan.PlannedSet) bool {
	return a.ID == b.ID && slices.Equal(a.Imports, b.Imports) && slices.Equal(a.Closure, b.Closure) &&
		a.PredictedMiB == b.PredictedMiB && a.RestoreMs == b.RestoreMs && a.ServedWeight == b.ServedWeight
}

// numpy 100 ms 10 MiB, networkx 400/40; requests numpy, networkx, both. Restore 100 + 1/MiB.
//
//	K=1: {numpy,networkx} serves all at 150: 450 (numpy alone 1120, networkx alone 580).
//	K=2: add numpy (110 for the numpy request): 410; networkx instead: 440.
//	K=3: all three: 400.
func TestPlanMaxSets(t *testing.T) {
	a := handAnalysis(map[string]mod{"numpy": {100, 10, nil}, "networkx": {400, 40, nil}}, nil)
	c := requests(t, allPlanned("1:numpy", "1:networkx", "1:numpy,networkx")...)
	model := catalogue.CostModel{InterceptMs: 100, AlphaMsPerMiB: 1, ColdStartMs: 1000}
	for k, want := range map[int]struct {
		sets []string
		mean float64
	}{
		1: {[]string{"networkx-numpy"}, 450.0 / 3},
		2: {[]string{"networkx-numpy", "numpy"}, 410.0 / 3},
		3: {[]string{"networkx", "networkx-numpy", "numpy"}, 400.0 / 3},
		4: {[]string{"networkx", "networkx-numpy", "numpy"}, 400.0 / 3},
	} {
		res, err := Plan(c, a, model, plan.Options{MaxSets: k, BudgetMiB: 1000})
		if err != nil {
			t.Fatal(err)
		}
		for _, name := range []string{plan.Greedy, plan.Planned} {
			s := res.Strategies[name]
			if got := ids(s.Sets); !slices.Equal(got, want.sets) || math.Abs(s.Planned.MeanMs-want.mean) > 1e-9 {
				t.Errorf("K=%d %s: %v %v ms, want %v %v ms", k, name, got, s.Planned.MeanMs, want.sets, want.mean)
			}
		}
	}
}

func TestPlanColdIsBest(t *testing.T) {
	// A restore costs at least 2 s, a cold start 50 ms plus at most 600 ms of imports: every
	// request starts cold and no set lowers anything.
	c := requests(t, allPlanned("3:seaborn", "1:numpy", "1:")...)
	model := catalogue.CostModel{InterceptMs: 2000, AlphaMsPerMiB: 1, ColdStartMs: 50, EmptyMiB: 10}
	res, err := Plan(c, stackAnalysis(), model, plan.DefaultOptions())
	if err != nil {
		t.Fatal(err)
	}
	for _, name := range []string{plan.Empty, plan.Greedy, plan.Planned} {
		s := res.Strategies[name]
		if s.Planned.ColdShare != 1 || (name != plan.Empty && len(s.Sets) != 0) {
			t.Errorf("%s: %d sets, cold share %v", name, len(s.Sets), s.Planned.ColdShare)
		}
		if s.Planned.MeanMs != res.Strategies[plan.Cold].Planned.MeanMs {
			t.Errorf("%s: mean %v, cold %v", name, s.Planned.MeanMs, res.Strategies[plan.Cold].Planned.MeanMs)
		}
	}
	// top-k checkpoints the frequent sets anyway; a request still starts cold when cheaper.
	if s := res.Strategies[plan.TopK]; len(s.Sets) == 0 || s.Planned.ColdShare != 1 {
		t.Errorf("top-k: %v, cold share %v", ids(s.Sets), s.Planned.ColdShare)
	}
}

func TestPlanTiesAreDeterministic(t *testing.T) {
	// a and b are priced alike and requested alike: a set of either costs 650 ms in all (250
	// for its request, 400 on the empty checkpoint for the other), of both 800. The tie goes
	// to the set whose modules sort first, whatever the order of the corpus.
	a := handAnalysis(map[string]mod{"a": {300, 10, nil}, "b": {300, 10, nil}}, nil)
	model := catalogue.CostModel{InterceptMs: 100, AlphaMsPerMiB: 15, ColdStartMs: 1000}
	for _, order := range [][]string{allPlanned("1:a", "1:b"), allPlanned("1:b", "1:a")} {
		res, err := Plan(requests(t, order...), a, model, plan.Options{MaxSets: 1, BudgetMiB: 100})
		if err != nil {
			t.Fatal(err)
		}
		for _, name := range []string{plan.TopK, plan.Greedy, plan.Planned} {
			if got := ids(res.Strategies[name].Sets); !slices.Equal(got, []string{"a"}) {
				t.Errorf("order %v, %s: %v, want [a]", order[:2], name, got)
			}
		}
	}
}

func TestPlanUnservableRequests(t *testing.T) {
	// transformers is not in the image: its requests are counted apart, priced nowhere and
	// never make a set, however frequent.
	a := stackAnalysis()
	a.Names["transformers.pipeline"] = analysis.Entry{Module: "transformers", Error: "No module named 'transformers'"}
	var lines []string
	for range 5 {
		lines = append(lines, "100:transformers.pipeline,pandas", "1:numpy")
	}
	c := requests(t, lines...)
	res, err := Plan(c, a, stackModel(), plan.DefaultOptions())
	if err != nil {
		t.Fatal(err)
	}
	pl, ho := res.Corpus.Planned, res.Corpus.HeldOut
	if pl.Unservable+ho.Unservable != 5 || pl.UnservableWeight+ho.UnservableWeight != 500 || res.Corpus.Unavailable["transformers"] != 5 {
		t.Errorf("unservable %+v %+v %v", pl, ho, res.Corpus.Unavailable)
	}
	if got := ids(res.Sets); !slices.Equal(got, []string{"numpy"}) {
		t.Errorf("sets %v, want [numpy]", got)
	}
	if s := res.Strategies[plan.Planned].Planned; s.Weight != float64(pl.Requests-pl.Unservable) || s.Weight == 0 || s.MeanMs != 110 {
		t.Errorf("planned stats %+v", s)
	}
}

func TestPlanIgnoresTheHeldOutPart(t *testing.T) {
	// Changing only held-out requests changes no set, and every request is on one side.
	var base, changed []string
	for i := range 200 {
		line := []string{"1:numpy", "1:pandas", "2:seaborn", "1:pandas,numpy"}[i%4]
		base = append(base, line)
		if corpus.HeldOut(i) {
			line = "50:seaborn"
		}
		changed = append(changed, line)
	}
	opt := plan.Options{MaxSets: 2, BudgetMiB: 1000}
	r1, err := Plan(requests(t, base...), stackAnalysis(), stackModel(), opt)
	if err != nil {
		t.Fatal(err)
	}
	r2, err := Plan(requests(t, changed...), stackAnalysis(), stackModel(), opt)
	if err != nil {
		t.Fatal(err)
	}
	if r1.Corpus.Planned.Requests+r1.Corpus.HeldOut.Requests != 200 || r1.Corpus.HeldOut.Requests == 0 {
		t.Fatalf("split %+v", r1.Corpus)
	}
	for _, name := range plan.Strategies() {
		if a, b := ids(r1.Strategies[name].Sets), ids(r2.Strategies[name].Sets); !slices.Equal(a, b) {
			t.Errorf("%s: held-out requests changed the sets: %v then %v", name, a, b)
		}
		if r1.Strategies[name].Planned != r2.Strategies[name].Planned {
			t.Errorf("%s: planned figures changed", name)
		}
	}
	if r1.Strategies[plan.Planned].HeldOut == r2.Strategies[plan.Planned].HeldOut {
		t.Error("held-out figures did not change with the held-out requests")
	}
}

func TestPlanInputErrors(t *testing.T) {
	c := requests(t, "1:pandas", "1:torch.nn", "1:numpy")
	if _, err := Plan(c, stackAnalysis(), stackModel(), plan.DefaultOptions()); !errors.Is(err, plan.ErrInput) || !strings.Contains(err.Error(), "torch.nn (line 2)") {
		t.Errorf("error %v, want ErrInput naming torch.nn on line 2", err)
	}
	for _, opt := range []plan.Options{{MaxSets: -1, BudgetMiB: 1}, {MaxSets: 1, BudgetMiB: math.NaN()}, {MaxSets: 1, BudgetMiB: 1, MaxCandidates: -1}} {
		if _, err := Plan(requests(t, "1:numpy"), stackAnalysis(), stackModel(), opt); !errors.Is(err, plan.ErrInput) {
			t.Errorf("options %+v: %v", opt, err)
		}
	}
	bad := stackAnalysis()
	bad.Version = 9
	if _, err := Plan(requests(t, "1:numpy"), bad, stackModel(), plan.DefaultOptions()); !errors.Is(err, analysis.ErrInvalid) {
		t.Errorf("invalid analysis: %v", err)
	}
}

// The planner's figures are the router's: Select on the plan's predicted catalogue prices every
// request as the plan did.
func TestPlanAgreesWithSelect(t *testing.T) {
	c, err := corpus.Parse(bytes.NewReader(syntheticCorpus(3000, 7)))
	if err != nil {
		t.Fatal(err)
	}
	a := syntheticAnalysis(c.Names())
	res, err := Plan(c, a, syntheticModel(), plan.DefaultOptions())
	if err != nil {
		t.Fatal(err)
	}
	r, err := catalogue.NewRouter(res.Catalogue(a.Modules()))
	if err != nil {
		t.Fatal(err)
	}
	var sum, weight float64
	for i, req := range c.Requests {
		if corpus.HeldOut(i) {
			continue
		}
		ch := r.Select(req.Imports)
		if len(ch.Unavailable) > 0 || len(ch.Unknown) > 0 {
			continue
		}
		sum += req.Weight * ch.PredictedMs
		weight += req.Weight
	}
	if st := res.Strategies[plan.Planned].Planned; math.Abs(sum/weight-st.MeanMs) > 1e-9*st.MeanMs || weight != st.Weight {
		t.Errorf("Select's mean %v over weight %v, the plan's %v over %v", sum/weight, weight, st.MeanMs, st.Weight)
	}
}

func TestConfigBlock(t *testing.T) {
	// An id the planner made for imports too long to spell out (see plan's TestBaseID).
	long := []string{"sklearn.feature_extraction.text", "sklearn.model_selection", "sklearn.neural_network", "matplotlib.pyplot"}
	sum := sha256.Sum256([]byte(strings.Join(long, ",")))
	longID := "sklearn_feature_extraction_text-sklearn_model_selection-" + hex.EncodeToString(sum[:4])
	res := &plan.Result{Sets: []plan.PlannedSet{
		{ID: "matplotlib_pyplot-pandas", Imports: []string{"matplotlib.pyplot", "pandas"}},
		{ID: longID, Imports: long},
	}}
	var buf bytes.Buffer
	if err := WriteConfigBlock(&buf, ConfigSets(res)); err != nil {
		t.Fatal(err)
	}
	want := "checkpoints:\n  - id: matplotlib_pyplot-pandas\n    imports:\n      - matplotlib.pyplot\n      - pandas\n"
	if !strings.HasPrefix(buf.String(), want) {
		t.Errorf("block:\n%s\nwant it to start with:\n%s", buf.String(), want)
	}
	// The pipeline's config takes the block as it is.
	cfg, err := config.Parse(buf.Bytes(), "plan.yaml", t.TempDir(), t.TempDir())
	if err != nil {
		t.Fatal(err)
	}
	if len(cfg.Checkpoints) != 2 || cfg.Checkpoints[1].ID != longID || !slices.Equal(cfg.Checkpoints[1].Imports, long) {
		t.Errorf("config sets %+v", cfg.Checkpoints)
	}
}

func TestPlanDegenerateCorpora(t *testing.T) {
	a := stackAnalysis()
	a.Names["torch"] = analysis.Entry{Module: "torch"}
	for name, lines := range map[string][]string{
		"all unservable": {"1:torch", "2:torch,numpy", "1:torch"},
		"no imports":     {"1:", "3:", "1:"},
	} {
		t.Run(name, func(t *testing.T) {
			res, err := Plan(requests(t, lines...), a, stackModel(), plan.DefaultOptions())
			if err != nil {
				t.Fatal(err)
			}
			if len(res.Sets) != 0 {
				t.Errorf("sets %v", ids(res.Sets))
			}
			for _, s := range res.Strategies {
				for _, st := range []plan.Stats{s.Planned, s.HeldOut} {
					if math.IsNaN(st.MeanMs) || math.IsNaN(st.P90Ms) {
						t.Errorf("NaN in %+v", st)
					}
				}
			}
		})
	}
}

func TestPlanSaveLoad(t *testing.T) {
	c := requests(t, allPlanned("1:seaborn", "1:pandas.DataFrame", "1:numpy")...)
	res, err := Plan(c, stackAnalysis(), stackModel(), plan.Options{MaxSets: 2, BudgetMiB: 1000})
	if err != nil {
		t.Fatal(err)
	}
	path := t.TempDir() + "/" + plan.FileName
	if err := res.Save(path); err != nil {
		t.Fatal(err)
	}
	back, err := plan.Load(path)
	if err != nil {
		t.Fatal(err)
	}
	if !slices.Equal(ids(back.Sets), ids(res.Sets)) || back.Strategies[plan.Planned].HeldOut != res.Strategies[plan.Planned].HeldOut {
		t.Errorf("round trip: %+v", back)
	}
	// A plan whose sets the config would refuse is refused.
	res.Sets = append(res.Sets, plan.PlannedSet{ID: "empty", Imports: []string{"numpy"}}, plan.PlannedSet{ID: "x", Imports: []string{"not a name"}})
	if err := res.Save(path); err != nil {
		t.Fatal(err)
	}
	if _, err := plan.Load(path); !errors.Is(err, plan.ErrInput) || !strings.Contains(err.Error(), "reserved") || !strings.Contains(err.Error(), "not a name") {
		t.Errorf("error %v", err)
	}
}

func FuzzParse(f *testing.F) {
	f.Add([]byte(`{"version":1,"sets":[{"id":"pandas","imports":["pandas"]}]}`))
	f.Add([]byte(`{"version":1,"sets":[{"id":"empty","imports":["x"]}]}`))
	f.Add([]byte(`{"version":1,"sets":[{"id":"a","imports":[]}],"strategies":{"plan":{"planned":{"mean_ms":1}}}}`))
	f.Fuzz(func(t *testing.T, data []byte) {
		r, err := plan.Parse(data)
		if err != nil {
			if !errors.Is(err, plan.ErrInput) {
				t.Fatalf("error not ErrInput: %v", err)
			}
			return
		}
		// Every set of a plan that parses is one the config takes.
		var buf bytes.Buffer
		if err := WriteConfigBlock(&buf, ConfigSets(r)); err != nil {
			t.Fatal(err)
		}
		if len(r.Sets) > 0 {
			if _, err := config.Parse(buf.Bytes(), "plan.yaml", "/", "/"); err != nil {
				t.Fatalf("the config refuses a parsed plan's sets: %v\n%s", err, buf.String())
			}
		}
	})
}

// The plan is the same bytes whatever the parallelism and however often it runs.
func TestPlanIsDeterministic(t *testing.T) {
	c, err := corpus.Parse(bytes.NewReader(syntheticCorpus(5000, 3)))
	if err != nil {
		t.Fatal(err)
	}
	a := syntheticAnalysis(c.Names())
	var first []byte
	for _, procs := range []int{1, 4, 2} {
		prev := runtime.GOMAXPROCS(procs)
		res, err := Plan(c, a, syntheticModel(), plan.DefaultOptions())
		runtime.GOMAXPROCS(prev)
		if err != nil {
			t.Fatal(err)
		}
		data, err := json.Marshal(res)
		if err != nil {
			t.Fatal(err)
		}
		if first == nil {
			first = data
		} else if !bytes.Equal(data, first) {
			t.Fatalf("GOMAXPROCS=%d planned differently", procs)
		}
	}
}
