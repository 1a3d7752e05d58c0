package catalogue

import (
	"encoding/json"
	"errors"
	"fmt"
	"math"
	"path/filepath"
	"slices"
	"strings"
	"testing"

	"readie.dev/pipeline/pkg/checkpointid"
	"readie.dev/pipeline/pkg/pyreq"
)

// stack is a small analysis whose costs are round numbers, so every optimum below is known by
// hand. Own figures: numpy 100 ms 10 MiB, pandas 300/20, matplotlib 200/15, pyplot 100/5,
// seaborn 150/5, re 0/0.
func stack() map[string]Module {
	return map[string]Module{
		"numpy":             {Available: true, ImportMs: 100, MiB: 10, OwnMs: 100, OwnMiB: 10, Closure: []string{"numpy"}},
		"pandas":            {Available: true, ImportMs: 400, MiB: 30, OwnMs: 300, OwnMiB: 20, Closure: []string{"numpy", "pandas"}},
		"matplotlib":        {Available: true, ImportMs: 300, MiB: 25, OwnMs: 200, OwnMiB: 15, Closure: []string{"matplotlib", "numpy"}},
		"matplotlib.pyplot": {Available: true, ImportMs: 400, MiB: 30, OwnMs: 100, OwnMiB: 5, Closure: []string{"matplotlib", "matplotlib.pyplot", "numpy"}},
		// seaborn's closure lists pandas but not numpy: compiling closes it transitively.
		"seaborn":      {Available: true, ImportMs: 850, MiB: 55, OwnMs: 150, OwnMiB: 5, Closure: []string{"matplotlib.pyplot", "pandas", "seaborn"}},
		"re":           {Available: true, Closure: []string{"re"}},
		"transformers": {Available: false},
	}
}

func model() CostModel {
	return CostModel{InterceptMs: 100, AlphaMsPerMiB: 2, ColdStartMs: 150, EmptyMiB: 10}
}

func catalogue(m CostModel, checkpoints ...Checkpoint) *Catalogue {
	return &Catalogue{Version: Version, CostModel: m, Modules: stack(), Checkpoints: checkpoints}
}

// Restores priced by the model: empty 100+2x10 = 120, pandas (40 MiB) 180, seaborn (65 MiB) 230.
var (
	emptyCP   = Checkpoint{ID: "empty", Imports: []string{}, ImageMiB: 10}
	pandasCP  = Checkpoint{ID: "pandas", Imports: []string{"pandas"}, ImageMiB: 40}
	seabornCP = Checkpoint{ID: "seaborn", Imports: []string{"seaborn"}, ImageMiB: 65}
)

func TestSelect(t *testing.T) {
	cheapCold := model()
	cheapCold.ColdStartMs = 50
	for _, tc := range []struct {
		name        string
		cat         *Catalogue
		request     []string
		checkpoint  string // "" = cold
		ms          float64
		imports     []string
		unknown     []string
		unavailable []string
	}{
		{"no imports: empty", catalogue(model(), emptyCP, pandasCP, seabornCP), nil, "empty", 120, nil, nil, nil},
		{"pandas", catalogue(model(), emptyCP, pandasCP, seabornCP), []string{"pandas"}, "pandas", 180, nil, nil, nil},
		{"closure: seaborn holds pyplot and numpy", catalogue(model(), emptyCP, pandasCP, seabornCP), []string{"matplotlib.pyplot", "numpy"}, "seaborn", 230, nil, nil, nil},
		{"imports what the checkpoint lacks", catalogue(model(), emptyCP, pandasCP), []string{"seaborn", "pandas.DataFrame"}, "pandas", 180 + 450, []string{"matplotlib", "matplotlib.pyplot", "seaborn"}, nil, nil},
		{"cold is best", catalogue(cheapCold, emptyCP, pandasCP), []string{"re"}, "", 50, []string{"re"}, nil, nil},
		{"cold beats a big checkpoint", catalogue(cheapCold, seabornCP), []string{"numpy"}, "", 150, []string{"numpy"}, nil, nil},
		{"no checkpoint at all", catalogue(model()), []string{"pandas"}, "", 550, []string{"numpy", "pandas"}, nil, nil},
		{"unknown and unavailable are not priced", catalogue(model(), emptyCP, pandasCP), []string{"transformers.pipeline", "pandas", "torch.nn"}, "pandas", 180, nil, []string{"torch.nn"}, []string{"transformers"}},
		{"measured restore wins over the model", catalogue(model(), emptyCP, Checkpoint{ID: "pandas", Imports: []string{"pandas"}, ImageMiB: 40, RestoreMedianMs: 600}), []string{"pandas"}, "empty", 520, []string{"numpy", "pandas"}, nil, nil},
		// Two checkpoints of equal cost: the smaller image wins, then the lower id.
		{"tie: smaller image", catalogue(model(), Checkpoint{ID: "a", Imports: []string{"pandas"}, ImageMiB: 40, RestoreMedianMs: 200}, Checkpoint{ID: "b", Imports: []string{"pandas"}, ImageMiB: 30, RestoreMedianMs: 200}), []string{"pandas"}, "b", 200, nil, nil, nil},
		{"tie: lower id", catalogue(model(), Checkpoint{ID: "b", Imports: []string{"pandas"}, ImageMiB: 40}, Checkpoint{ID: "a", Imports: []string{"pandas"}, ImageMiB: 40}), []string{"pandas"}, "a", 180, nil, nil, nil},
		// empty restores in 120 ms, cold starts in 150-30 = 120 ms too: the checkpoint wins.
		{"tie: cold loses", catalogue(CostModel{InterceptMs: 100, AlphaMsPerMiB: 2, ColdStartMs: 120, EmptyMiB: 10}, emptyCP), nil, "empty", 120, nil, nil, nil},
	} {
		t.Run(tc.name, func(t *testing.T) {
			r, err := NewRouter(tc.cat)
			if err != nil {
				t.Fatal(err)
			}
			ch := r.Select(tc.request)
			if ch.Checkpoint != tc.checkpoint || ch.Cold != (tc.checkpoint == "") || ch.PredictedMs != tc.ms {
				t.Fatalf("got %q cold=%v %v ms (%s), want %q %v ms", ch.Checkpoint, ch.Cold, ch.PredictedMs, ch.Why, tc.checkpoint, tc.ms)
			}
			if !slices.Equal(ch.Import, tc.imports) && !(len(ch.Import) == 0 && len(tc.imports) == 0) {
				t.Errorf("imports %v, want %v", ch.Import, tc.imports)
			}
			if !slices.Equal(ch.Unknown, tc.unknown) || !slices.Equal(ch.Unavailable, tc.unavailable) {
				t.Errorf("unknown %v unavailable %v, want %v %v", ch.Unknown, ch.Unavailable, tc.unknown, tc.unavailable)
			}
			if ch.FixedMs+ch.ImportMs != ch.PredictedMs || ch.Why == "" {
				t.Errorf("fixed %v + import %v != %v; why %q", ch.FixedMs, ch.ImportMs, ch.PredictedMs, ch.Why)
			}
			if ch.Basis != BasisCostModel || r.Basis() != BasisCostModel || ch.PredictedMs <= 0 || ch.ColdMs <= 0 || strings.Contains(ch.Why, "image size") {
				t.Errorf("a catalogue with a cost model: basis %q, %v ms, cold %v ms, why %q", ch.Basis, ch.PredictedMs, ch.ColdMs, ch.Why)
			}
		})
	}
}

// unpricedCatalogue is catalogue.json as capture writes it without analyze: no module, a cost
// model without a cold start (the restore line comes from the manifest's medians), each
// checkpoint's measured median, image size and loaded distributions.
func unpricedCatalogue(checkpoints ...Checkpoint) *Catalogue {
	return &Catalogue{Version: 2, CostModel: CostModel{InterceptMs: 120, AlphaMsPerMiB: 1.5, EmptyMiB: 8.4},
		Modules: map[string]Module{}, Checkpoints: checkpoints}
}

// TestSelectBySize: a catalogue without measured prices routes by image size: the smallest
// checkpoint that holds (by its imports or its loaded distributions) every import some
// checkpoint holds and meets every requirement, else a cold start; an import no checkpoint
// holds is named in the why but does not decide, and a request of only such imports starts
// cold; no price in the choice or its JSON, and the why says so and how to measure them.
func TestSelectBySize(t *testing.T) {
	old := map[string]string{"pandas": "1.5.3", "numpy": "1.24.2", "cloudpickle": "2.2.0"}
	current := map[string]string{"pandas": "2.2.3+dfsg", "numpy": "1.26.4", "cloudpickle": "2.2.0"}
	empty := Checkpoint{ID: "empty", Imports: []string{}, ImageMiB: 8.4, RestoreMedianMs: 140, Packages: map[string]string{"cloudpickle": "2.2.0"}}
	numpy := Checkpoint{ID: "numpy", Imports: []string{"numpy"}, ImageMiB: 17.6, RestoreMedianMs: 150, Packages: map[string]string{"numpy": "1.24.2", "cloudpickle": "2.2.0"}}
	// Listed before the smaller pandas checkpoint, restoring faster: size alone decides.
	pandasNumpy := Checkpoint{ID: "numpy-pandas", Imports: []string{"numpy", "pandas"}, ImageMiB: 45.2, RestoreMedianMs: 100, Packages: current}
	pandas := Checkpoint{ID: "pandas", Imports: []string{"pandas"}, ImageMiB: 39.8, RestoreMedianMs: 200, Packages: old}
	svm := Checkpoint{ID: "sklearn_svm", Imports: []string{"sklearn.svm"}, ImageMiB: 60, RestoreMedianMs: 210,
		Packages: map[string]string{"scikit-learn": "1.2.1", "typing-extensions": "4.12.2"}}
	all := unpricedCatalogue(empty, numpy, pandasNumpy, pandas, svm)
	// As captured without analyze: the pandas checkpoint holds numpy only by its packages.
	emptyPandas := unpricedCatalogue(empty, pandas)
	for _, tc := range []struct {
		name     string
		cat      *Catalogue
		imports  []string
		requires []string
		want     string // checkpoint id, "" for cold
		why      string // how the why starts
	}{
		{"the smallest that holds it", all, []string{"pandas"}, nil, "pandas", "restore pandas (39.8 MiB), the smallest checkpoint that holds pandas; next smallest numpy-pandas (45.2 MiB); "},
		// The pandas checkpoint holds numpy loaded (its packages say so), though it does not import it.
		{"a name imported from a module", all, []string{"pandas.DataFrame", "numpy"}, nil, "pandas", "restore pandas (39.8 MiB), the smallest checkpoint that holds numpy, pandas; next smallest numpy-pandas (45.2 MiB); "},
		{"numpy", all, []string{"numpy"}, nil, "numpy", "restore numpy (17.6 MiB), the smallest checkpoint that holds numpy; next smallest pandas (39.8 MiB); "},
		{"a loaded distribution", emptyPandas, []string{"numpy", "pandas"}, nil, "pandas", "restore pandas (39.8 MiB), the smallest checkpoint that holds numpy, pandas; "},
		{"a submodule of a loaded distribution", emptyPandas, []string{"pandas", "numpy.linalg"}, nil, "pandas", "restore pandas (39.8 MiB), the smallest checkpoint that holds numpy, pandas; "},
		{"a distribution name normalized", all, []string{"typing_extensions"}, nil, "sklearn_svm", "restore sklearn_svm (60.0 MiB), the smallest checkpoint that holds typing_extensions; "},
		{"a requirement on what a checkpoint holds by its packages", all, []string{"numpy"}, []string{"numpy>=1.26"}, "numpy-pandas",
			"restore numpy-pandas (45.2 MiB), the smallest checkpoint that holds numpy; passed over numpy: holds numpy 1.24.2 loaded, not numpy>=1.26; passed over pandas: "},
		{"a submodule", all, []string{"sklearn.svm.SVC"}, nil, "sklearn_svm", "restore sklearn_svm (60.0 MiB), the smallest checkpoint that holds sklearn.svm; "},
		{"no imports", all, nil, nil, "empty", "restore empty (8.4 MiB), the smallest checkpoint (the request imports nothing); next smallest numpy (17.6 MiB); "},
		{"a requirement excludes one", all, []string{"pandas"}, []string{"pandas>=2.2,<3"}, "numpy-pandas", "restore numpy-pandas (45.2 MiB), the smallest checkpoint that holds pandas; "},
		{"a requirement excludes every holder", all, []string{"pandas"}, []string{"pandas>=3"}, "", "cold start: every checkpoint that holds pandas is passed over; "},
		{"a requirement on what a checkpoint does not load", all, []string{"numpy"}, []string{"requests>=2"}, "numpy", "restore numpy (17.6 MiB)"},
		// json is imported after a restore as after a cold start: it does not decide.
		{"a name none holds", all, []string{"json", "pandas"}, nil, "pandas",
			"restore pandas (39.8 MiB), the smallest checkpoint that holds pandas; no checkpoint holds json, imported after the start either way; next smallest numpy-pandas (45.2 MiB); "},
		{"a name none holds, captured without analyze", emptyPandas, []string{"json", "pandas.DataFrame"}, nil, "pandas",
			"restore pandas (39.8 MiB), the smallest checkpoint that holds pandas; no checkpoint holds json, imported after the start either way; "},
		{"a name none holds, every holder passed over", all, []string{"re", "pandas", "json"}, []string{"pandas>=3"}, "",
			"cold start: every checkpoint that holds pandas is passed over; no checkpoint holds json, re, imported after the start either way; "},
		// Nothing the request imports is held: nothing shows that a restore gains anything.
		{"only names none holds", emptyPandas, []string{"json"}, nil, "", "cold start: no checkpoint holds json; "},
		{"only names none holds, several", all, []string{"re", "json"}, nil, "", "cold start: no checkpoint holds json, re; "},
		// Holding sklearn.svm loads sklearn, but no checkpoint imports sklearn by that name, and
		// its distribution is scikit-learn.
		{"a parent package is not an import", all, []string{"sklearn"}, nil, "", "cold start: no checkpoint holds sklearn; "},
		{"none holds them all", all, []string{"numpy", "sklearn.svm"}, nil, "", "cold start: no checkpoint holds all of numpy, sklearn.svm; "},
		{"none holds them all, and a name none holds", all, []string{"json", "numpy", "sklearn.svm"}, nil, "",
			"cold start: no checkpoint holds all of numpy, sklearn.svm; no checkpoint holds json, imported after the start either way; "},
		{"no checkpoint", unpricedCatalogue(), nil, nil, "", "cold start: the catalogue has no checkpoint; "},
	} {
		t.Run(tc.name, func(t *testing.T) {
			r, err := NewRouter(tc.cat)
			if err != nil {
				t.Fatal(err)
			}
			var reqs []pyreq.Requirement
			for _, spec := range tc.requires {
				reqs = append(reqs, mustRequirement(t, spec))
			}
			ch := r.SelectFor(tc.imports, reqs)
			if ch.Checkpoint != tc.want || ch.Cold != (tc.want == "") || ch.Basis != BasisImageSize || r.Basis() != BasisImageSize {
				t.Fatalf("got %q cold=%v by %q (%s), want %q by image size", ch.Checkpoint, ch.Cold, ch.Basis, ch.Why, tc.want)
			}
			if ch.PredictedMs != 0 || ch.FixedMs != 0 || ch.ImportMs != 0 || ch.ColdMs != 0 || ch.PredictedPooledMs != 0 {
				t.Errorf("a choice by image size carries a price: %+v", ch)
			}
			if !strings.HasPrefix(ch.Why, tc.why) || strings.Contains(ch.Why, " ms") ||
				!strings.Contains(ch.Why, "; chosen by image size for want of measured prices (the catalogue has no cold start time): to price starts, run `pipeline analyze --corpus FILE` on this output, then capture it again") {
				t.Errorf("why %q, want it to start %q and say it chose by size, and how to price", ch.Why, tc.why)
			}
			if tc.want != "" && ch.ImageMiB <= 0 || tc.want == "" && ch.ImageMiB != 0 {
				t.Errorf("image %v MiB for %q", ch.ImageMiB, tc.want)
			}
			data, err := json.Marshal(ch)
			if err != nil {
				t.Fatal(err)
			}
			for _, key := range []string{"predicted_ms", "fixed_ms", "import_ms", "cold_ms", "predicted_pooled_ms"} {
				if strings.Contains(string(data), `"`+key+`"`) {
					t.Errorf("JSON of a choice by image size has %s: %s", key, data)
				}
			}
			if !strings.Contains(string(data), `"basis":"image size"`) {
				t.Errorf("JSON without the basis: %s", data)
			}
		})
	}
	ch := router(t, all).SelectFor([]string{"pandas"}, []pyreq.Requirement{mustRequirement(t, "pandas>=3")})
	if len(ch.PassedOver) != 2 || !strings.Contains(ch.Why, "; passed over pandas: holds pandas 1.5.3 loaded, not pandas>=3") {
		t.Errorf("passed over %+v, why %q", ch.PassedOver, ch.Why)
	}
}

// TestSelectBySizeWithAnalysis: an analysis without a cold start (analysed before analyze
// measured one) gives the checkpoints' closures, and the choice by size uses them: numpy is
// held by the pandas checkpoint too, yet the numpy one is smaller; the import a cold start
// lacks is named, unpriced.
func TestSelectBySizeWithAnalysis(t *testing.T) {
	c := catalogue(CostModel{InterceptMs: 100, AlphaMsPerMiB: 2}, emptyCP,
		Checkpoint{ID: "pandas", Imports: []string{"pandas"}, Closure: []string{"numpy", "pandas"}, ImageMiB: 40},
		Checkpoint{ID: "numpy", Imports: []string{"numpy"}, Closure: []string{"numpy"}, ImageMiB: 18})
	r, err := NewRouter(c)
	if err != nil {
		t.Fatal(err)
	}
	if ch := r.Select([]string{"numpy"}); ch.Checkpoint != "numpy" || ch.Basis != BasisImageSize || !strings.Contains(ch.Why, "next smallest pandas (40.0 MiB)") {
		t.Errorf("numpy: %+v", ch)
	}
	ch := r.Select([]string{"seaborn", "transformers"})
	if !ch.Cold || !slices.Equal(ch.Import, []string{"matplotlib", "matplotlib.pyplot", "numpy", "pandas", "seaborn"}) || ch.PredictedMs != 0 ||
		!strings.HasPrefix(ch.Why, "cold start: no checkpoint holds seaborn, transformers; ") || !strings.Contains(ch.Why, "; transformers not in the image") {
		t.Errorf("seaborn: %+v", ch)
	}
}

// TestUnpriced: what a catalogue lacks to be priced, each said; a cold start measured and a
// restore time for every checkpoint (its median, or the line on its size) price it.
func TestUnpriced(t *testing.T) {
	noTime := Checkpoint{ID: "pandas", Imports: []string{"pandas"}, ImageMiB: 40}
	for _, tc := range []struct {
		name  string
		cat   *Catalogue
		basis Basis
		why   string
	}{
		{"priced", catalogue(model(), emptyCP, pandasCP), BasisCostModel, ""},
		{"no cold start", catalogue(CostModel{InterceptMs: 100, AlphaMsPerMiB: 2}, emptyCP, pandasCP), BasisImageSize, "(the catalogue has no cold start time)"},
		{"no restore line, a checkpoint without a median", catalogue(CostModel{ColdStartMs: 150}, Checkpoint{ID: "empty", Imports: []string{}, ImageMiB: 10, RestoreMedianMs: 90}, noTime),
			BasisImageSize, "(the catalogue has no restore time for pandas)"},
		{"no restore line, every median measured", catalogue(CostModel{ColdStartMs: 150}, Checkpoint{ID: "pandas", Imports: []string{"pandas"}, ImageMiB: 40, RestoreMedianMs: 190}),
			BasisCostModel, ""},
	} {
		t.Run(tc.name, func(t *testing.T) {
			ch := router(t, tc.cat).Select([]string{"pandas"})
			if ch.Basis != tc.basis || !strings.Contains(ch.Why, tc.why) || (tc.basis == BasisCostModel) != (ch.PredictedMs > 0) {
				t.Errorf("%+v, want basis %q and a why with %q", ch, tc.basis, tc.why)
			}
		})
	}
}

// router returns c's router.
func router(t *testing.T, c *Catalogue) *Router {
	t.Helper()
	r, err := NewRouter(c)
	if err != nil {
		t.Fatal(err)
	}
	return r
}

func mustRequirement(t *testing.T, spec string) pyreq.Requirement {
	t.Helper()
	req, err := pyreq.ParseRequirement(spec)
	if err != nil {
		t.Fatal(err)
	}
	return req
}

// TestSelectPooled: with a pooled line, the choice (made on the restore line and the measured
// medians, as without one) carries its price in a sandbox created ahead: the pooled line on the
// checkpoint's image size, or the pooled cold start, plus the same imports. Without a line it
// carries none.
func TestSelectPooled(t *testing.T) {
	pooled := model()
	pooled.Pooled = PooledLine{InterceptMs: 40, AlphaMsPerMiB: 1, ColdStartMs: 60}
	cheapCold := pooled
	cheapCold.ColdStartMs = 50
	medianPandas := Checkpoint{ID: "pandas", Imports: []string{"pandas"}, ImageMiB: 40, RestoreMedianMs: 600}
	for _, tc := range []struct {
		name       string
		cat        *Catalogue
		request    []string
		checkpoint string
		ms, pooled float64
	}{
		// pandas (40 MiB): 100 + 2x40 = 180 ms restored, 40 + 1x40 = 80 ms from a pool.
		{"held", catalogue(pooled, emptyCP, pandasCP), []string{"pandas"}, "pandas", 180, 80},
		{"imports on top", catalogue(pooled, emptyCP, pandasCP), []string{"seaborn", "pandas"}, "pandas", 180 + 450, 80 + 450},
		// cold wins: 50 ms cold, 60 ms cold from a pool (the pooled cold start is its own figure).
		{"cold", catalogue(cheapCold, emptyCP, pandasCP), []string{"re"}, "", 50, 60},
		// The measured median (600 ms) makes empty the choice; its pooled price is the line's on
		// 10 MiB, 50 ms, plus numpy and pandas (400 ms).
		{"measured median chooses, the line prices", catalogue(pooled, emptyCP, medianPandas), []string{"pandas"}, "empty", 520, 50 + 400},
		{"no pooled line", catalogue(model(), emptyCP, pandasCP), []string{"pandas"}, "pandas", 180, 0},
	} {
		t.Run(tc.name, func(t *testing.T) {
			r, err := NewRouter(tc.cat)
			if err != nil {
				t.Fatal(err)
			}
			ch := r.Select(tc.request)
			if ch.Checkpoint != tc.checkpoint || ch.PredictedMs != tc.ms || ch.PredictedPooledMs != tc.pooled {
				t.Errorf("got %q %v ms, pooled %v ms; want %q %v ms, pooled %v ms (%s)", ch.Checkpoint, ch.PredictedMs, ch.PredictedPooledMs, tc.checkpoint, tc.ms, tc.pooled, ch.Why)
			}
		})
	}
}

// TestPooledLineRoundTrip: the pooled line survives Parse, a catalogue without one writes no
// "pooled" key, and a version 2 catalogue (before the line) still loads, pricing nothing pooled.
func TestPooledLineRoundTrip(t *testing.T) {
	m := model()
	m.Pooled = PooledLine{InterceptMs: 40, AlphaMsPerMiB: 1, ColdStartMs: 60}
	data, err := json.Marshal(catalogue(m, emptyCP, pandasCP))
	if err != nil {
		t.Fatal(err)
	}
	back, err := Parse(data)
	if err != nil {
		t.Fatal(err)
	}
	if back.CostModel != m || !strings.Contains(string(data), `"pooled":{"intercept_ms":40,"alpha_ms_per_mib":1,"cold_start_ms":60}`) {
		t.Errorf("cost model %+v after a round trip of %s", back.CostModel, data)
	}
	without, err := json.Marshal(catalogue(model(), emptyCP))
	if err != nil {
		t.Fatal(err)
	}
	if strings.Contains(string(without), "pooled") {
		t.Errorf("a catalogue without a pooled line: %s", without)
	}
	v2 := `{"version":2,"cost_model":{"intercept_ms":100,"alpha_ms_per_mib":2,"cold_start_ms":150,"empty_mib":10},"checkpoints":[{"id":"empty","imports":[],"closure":[],"image_mib":10,"restore_median_ms":0}],"modules":{}}`
	c, err := Parse([]byte(v2))
	if err != nil {
		t.Fatalf("version 2: %v", err)
	}
	r, err := NewRouter(c)
	if err != nil {
		t.Fatal(err)
	}
	if ch := r.Select(nil); ch.Checkpoint != "empty" || ch.PredictedPooledMs != 0 || c.CostModel.Pooled.Measured() {
		t.Errorf("version 2: %+v, line %+v", ch, c.CostModel.Pooled)
	}
}

func TestSelectSaysWhy(t *testing.T) {
	r, err := NewRouter(catalogue(model(), emptyCP, pandasCP))
	if err != nil {
		t.Fatal(err)
	}
	ch := r.Select([]string{"pandas", "seaborn", "transformers"})
	want := "restore pandas (180 ms, 40.0 MiB) + import matplotlib, matplotlib.pyplot, seaborn (450 ms) = 630 ms; next best empty 970 ms; transformers not in the image (the request will fail to import it)"
	if ch.Why != want {
		t.Errorf("why:\n%s\nwant:\n%s", ch.Why, want)
	}
	if ch.ColdMs != 150+850 {
		t.Errorf("cold %v", ch.ColdMs)
	}
}

// TestSelectPackages: a checkpoint that holds a distribution whose version does not satisfy a
// request's requirement is passed over, naming why, for the next best (another checkpoint, or
// cold); one that does not load it costs nothing; the image's own versions are reported.
func TestSelectPackages(t *testing.T) {
	pandas := pandasCP
	pandas.Packages = map[string]string{"pandas": "1.5.3", "numpy": "1.24.2", "cloudpickle": "2.2.0"}
	seaborn := seabornCP
	seaborn.Packages = map[string]string{"pandas": "2.2.3+dfsg", "numpy": "1.26.4", "seaborn": "0.13.2", "cloudpickle": "2.2.0"}
	empty := emptyCP
	empty.Packages = map[string]string{"cloudpickle": "2.2.0"}
	c := catalogue(model(), empty, pandas, seaborn)
	c.Packages = map[string]string{"pandas": "2.2.3+dfsg", "numpy": "1.26.4", "seaborn": "0.13.2", "cloudpickle": "2.2.0"}
	r, err := NewRouter(c)
	if err != nil {
		t.Fatal(err)
	}
	reqs := func(specs ...string) []pyreq.Requirement {
		var out []pyreq.Requirement
		for _, s := range specs {
			req, err := pyreq.ParseRequirement(s)
			if err != nil {
				t.Fatal(err)
			}
			out = append(out, req)
		}
		return out
	}
	for _, tc := range []struct {
		name       string
		imports    []string
		packages   []string
		want       string // checkpoint id, "" for cold
		passedOver []string
		imageLacks []string
	}{
		{"no requirement", []string{"pandas"}, nil, "pandas", nil, nil},
		{"satisfied", []string{"pandas"}, []string{"pandas>=1.5,<3"}, "pandas", nil, nil},
		// pandas 1.5.3 is loaded in "pandas": seaborn's checkpoint (230 + 0 ms) beats cold
		// (150 + 400 ms) for the request.
		{"passed over for another checkpoint", []string{"pandas"}, []string{"pandas>=2.1,<3"}, "seaborn", []string{"pandas"}, nil},
		// Normalized names match: Pandas and pandas are one distribution.
		{"name spelled otherwise", []string{"pandas"}, []string{"Pandas>=2.2"}, "seaborn", []string{"pandas"}, nil},
		// Both checkpoints that hold pandas are out: the empty checkpoint (120 + 400 ms) beats
		// cold (150 + 400 ms).
		{"passed over for the empty checkpoint", []string{"pandas"}, []string{"pandas==3.*"}, "empty", []string{"pandas", "seaborn"}, []string{"pandas==3.*: the image has pandas 2.2.3+dfsg"}},
		// cloudpickle is loaded everywhere, cold included: only cold is left.
		{"every checkpoint out", []string{"numpy"}, []string{"cloudpickle>=3"}, "", []string{"empty", "pandas", "seaborn"}, []string{"cloudpickle>=3: the image has cloudpickle 2.2.0"}},
		// A distribution no checkpoint loads costs nothing.
		{"not loaded anywhere", []string{"pandas"}, []string{"requests>=2"}, "pandas", nil, []string{"requests>=2: the image has no requests"}},
		// numpy alone: the empty checkpoint (120 + 100 ms) beats seaborn's (230 ms).
		{"two requirements", []string{"numpy"}, []string{"numpy==1.26.*", "pandas>=2"}, "empty", []string{"pandas"}, nil},
	} {
		t.Run(tc.name, func(t *testing.T) {
			ch := r.SelectFor(tc.imports, reqs(tc.packages...))
			var passed []string
			for _, p := range ch.PassedOver {
				passed = append(passed, p.Checkpoint)
				if !strings.Contains(p.Why, "loaded, not ") || !strings.Contains(ch.Why, "passed over "+p.Checkpoint+": "+p.Why) {
					t.Errorf("passed over %s: why %q; choice why %q", p.Checkpoint, p.Why, ch.Why)
				}
			}
			slices.Sort(passed)
			if ch.Checkpoint != tc.want || !slices.Equal(passed, tc.passedOver) || !slices.Equal(ch.ImageLacks, tc.imageLacks) {
				t.Errorf("choice %q, passed over %v, image lacks %q; want %q, %v, %q\n%s", ch.Checkpoint, passed, ch.ImageLacks, tc.want, tc.passedOver, tc.imageLacks, ch.Why)
			}
		})
	}
	if ch := r.SelectFor([]string{"numpy"}, reqs("numpy==1.26.*", "pandas>=2")); ch.PassedOver[0].Why != "holds numpy 1.24.2 loaded, not numpy==1.26.*; holds pandas 1.5.3 loaded, not pandas>=2" {
		t.Errorf("why %q", ch.PassedOver[0].Why)
	}
	if ch := r.SelectFor([]string{"pandas"}, reqs("pandas>=2.1,<3")); !strings.Contains(ch.Why, "passed over pandas: holds pandas 1.5.3 loaded, not pandas>=2.1,<3") {
		t.Errorf("why %q", ch.Why)
	}
	// Without the image's distributions (no analysis recorded them), nothing is said of it.
	c.Packages = nil
	r, _ = NewRouter(c)
	if ch := r.SelectFor([]string{"pandas"}, reqs("requests>=2")); ch.Checkpoint != "pandas" || ch.ImageLacks != nil {
		t.Errorf("%+v", ch)
	}
	// A version 1 catalogue (no packages) is still read.
	c.Version = 1
	if _, err := NewRouter(c); err != nil {
		t.Errorf("version 1: %v", err)
	}
}

func TestInvalidCatalogues(t *testing.T) {
	bad := func(edit func(c *Catalogue)) *Catalogue {
		c := catalogue(model(), emptyCP, pandasCP)
		edit(c)
		return c
	}
	for _, tc := range []struct {
		name string
		cat  *Catalogue
		want string
	}{
		{"version", bad(func(c *Catalogue) { c.Version = Version + 1 }), fmt.Sprintf("version %d", Version+1)},
		{"version 0", bad(func(c *Catalogue) { c.Version = 0 }), "version 0"},
		{"package name not normalized", bad(func(c *Catalogue) { c.Checkpoints[1].Packages = map[string]string{"Scikit_Learn": "1.4"} }), `"Scikit_Learn" is not a normalized distribution name ("scikit-learn")`},
		{"package version empty", bad(func(c *Catalogue) { c.Packages = map[string]string{"pandas": ""} }), `"pandas": version ""`},
		// An image's metadata reaches select's terminal output: no control characters.
		{"package version with an escape", bad(func(c *Catalogue) { c.Checkpoints[0].Packages = map[string]string{"pandas": "2.2\x1b[2J"} }), `"pandas": version "2.2\x1b[2J"`},
		{"package version with a bidi override", bad(func(c *Catalogue) { c.Packages = map[string]string{"pandas": "2.2\u202e1"} }), `"pandas": version "2.2\u202e1"`},
		{"unmapped module with a space", bad(func(c *Catalogue) { c.Checkpoints[1].UnmappedModules = []string{"app mod"} }), `unmapped_modules: "app mod"`},
		{"unmapped submodule", bad(func(c *Catalogue) { c.Checkpoints[1].UnmappedModules = []string{"app.mod"} }), `unmapped_modules: "app.mod": want a top-level module name`},
		{"unmapped module with an escape", bad(func(c *Catalogue) { c.Checkpoints[1].UnmappedModules = []string{"app\x1b[2J"} }), `unmapped_modules: "app\x1b[2J"`},
		{"unmapped module twice", bad(func(c *Catalogue) { c.Checkpoints[1].UnmappedModules = []string{"appmod", "appmod"} }), `"appmod" is named twice`},
		{"module package", bad(func(c *Catalogue) { c.Modules["re"] = Module{Available: true, Packages: map[string]string{"a b": "1"}} }), `module re: packages: "a b"`},
		{"bad id", bad(func(c *Catalogue) { c.Checkpoints[1].ID = "pan das" }), `"pan das": id`},
		{"duplicate id", bad(func(c *Catalogue) { c.Checkpoints[1].ID = "empty" }), "duplicate id"},
		{"own memory past resident", bad(func(c *Catalogue) { c.Checkpoints[1].ResidentBytes, c.Checkpoints[1].OwnBytes = 10, 11 }), "own_bytes a part of resident_bytes"},
		{"negative own memory", bad(func(c *Catalogue) { c.Checkpoints[1].OwnBytes = -1 }), "own_bytes -1"},
		{"unknown closure member", bad(func(c *Catalogue) { c.Checkpoints[1].Closure = []string{"torch"} }), `"torch" is not an available module`},
		{"bad import name", bad(func(c *Catalogue) { c.Checkpoints[1].Imports = []string{"torch vision"} }), `"torch vision" is not an available module`},
		{"unavailable import", bad(func(c *Catalogue) { c.Checkpoints[1].Imports = []string{"transformers"} }), `"transformers" does not import in the image`},
		{"negative size", bad(func(c *Catalogue) { c.Checkpoints[1].ImageMiB = -1 }), "finite numbers >= 0"},
		{"closure member unknown", bad(func(c *Catalogue) {
			c.Modules["pandas"] = Module{Available: true, Closure: []string{"pytz"}}
		}), `closure member "pytz"`},
		{"NaN figure", bad(func(c *Catalogue) { c.Modules["re"] = Module{Available: true, OwnMs: math.NaN()} }), "own_ms NaN"},
		{"bad module name", bad(func(c *Catalogue) { c.Modules["9lives"] = Module{Available: true} }), `module "9lives"`},
		{"negative alpha", bad(func(c *Catalogue) { c.CostModel.AlphaMsPerMiB = -1 }), "alpha_ms_per_mib -1"},
		{"negative pooled intercept", bad(func(c *Catalogue) { c.CostModel.Pooled = PooledLine{InterceptMs: -1, ColdStartMs: 50} }), "pooled.intercept_ms -1"},
		{"infinite pooled cold start", bad(func(c *Catalogue) { c.CostModel.Pooled = PooledLine{ColdStartMs: math.Inf(1)} }), "pooled.cold_start_ms +Inf"},
		{"negative memory intercept", bad(func(c *Catalogue) { c.CostModel.Memory = MemoryLine{InterceptBytes: -1, BytesPerMiB: 1 << 20} }), "memory.intercept_bytes -1"},
		{"NaN memory slope", bad(func(c *Catalogue) { c.CostModel.Memory = MemoryLine{InterceptBytes: 1 << 20, BytesPerMiB: math.NaN()} }), "memory.bytes_per_mib NaN"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			_, err := NewRouter(tc.cat)
			if !errors.Is(err, ErrInvalid) || !strings.Contains(err.Error(), tc.want) {
				t.Fatalf("error %v, want ErrInvalid naming %q", err, tc.want)
			}
		})
	}
}

// A checkpoint captured without an analysis of one of its imports holds it unpriced: no request
// resolves to it, so it neither helps nor hurts a choice.
func TestUnanalysedImport(t *testing.T) {
	torch := Checkpoint{ID: "torch", Imports: []string{"torch", "pandas"}, Closure: []string{"pandas"}, ImageMiB: 240}
	c := catalogue(model(), emptyCP, pandasCP, torch)
	r, err := NewRouter(c)
	if err != nil {
		t.Fatal(err)
	}
	ch := r.Select([]string{"torch", "pandas"})
	if ch.Checkpoint != "pandas" || !slices.Equal(ch.Unknown, []string{"torch"}) {
		t.Errorf("choice %+v: want pandas (smaller than torch's image, same cost otherwise) with torch unknown", ch)
	}
}

func TestParseRoundTrip(t *testing.T) {
	c := catalogue(model(), emptyCP, pandasCP, seabornCP)
	data, err := json.Marshal(c)
	if err != nil {
		t.Fatal(err)
	}
	back, err := Parse(data)
	if err != nil {
		t.Fatal(err)
	}
	r, _ := NewRouter(back)
	if ch := r.Select([]string{"seaborn"}); ch.Checkpoint != "seaborn" {
		t.Errorf("after a round trip: %+v", ch)
	}
	// A checkpoint's unmapped modules (version 4) are read back; a version 3 catalogue has none.
	c.Checkpoints[1].UnmappedModules = []string{"appmod", "écrit"}
	if data, err = json.Marshal(c); err != nil {
		t.Fatal(err)
	}
	if back, err = Parse(data); err != nil || !slices.Equal(back.Checkpoints[1].UnmappedModules, []string{"appmod", "écrit"}) {
		t.Errorf("unmapped modules after a round trip: %+v, %v", back, err)
	}
	if _, err := Parse([]byte(`{"version":3,"cost_model":{},"checkpoints":[{"id":"a","imports":[],"closure":[],"image_mib":1,"restore_median_ms":1,"packages":{"numpy":"2.2.4"}}],"modules":{}}`)); err != nil {
		t.Errorf("a version 3 catalogue: %v", err)
	}
	for _, tc := range []struct{ data, want string }{
		{`{"version":1,"cost_model":{},"checkpoints":[],"modules":{},"extra":1}`, "unknown field"},
		{`{"version":1,"cost_model":{},"checkpoints":[],"modules":{}} {}`, "data after"},
		{`[]`, "cannot unmarshal array"},
	} {
		if _, err := Parse([]byte(tc.data)); !errors.Is(err, ErrInvalid) || !strings.Contains(err.Error(), tc.want) {
			t.Errorf("Parse(%s): %v, want %q", tc.data, err, tc.want)
		}
	}
}

func TestIsModuleName(t *testing.T) {
	for name, want := range map[string]bool{
		"pandas": true, "matplotlib.pyplot": true, "_x.y2": true, "A.B_c": true,
		"": false, ".x": false, "x.": false, "x..y": false, "2x": false, "x.2": false, "x-y": false, "x y": false, "é": false,
	} {
		if IsModuleName(name) != want {
			t.Errorf("IsModuleName(%q) = %v", name, !want)
		}
	}
}

func FuzzParse(f *testing.F) {
	good, _ := json.Marshal(catalogue(model(), emptyCP, pandasCP, seabornCP))
	f.Add(good)
	f.Add([]byte(`{"version":1,"cost_model":{"cold_start_ms":1},"checkpoints":[{"id":"x","imports":["a"]}],"modules":{"a":{"available":true,"closure":["a","b"]},"b":{"available":true}}}`))
	f.Add([]byte(`{}`))
	f.Add([]byte(`{"version":1,"cost_model":{"cold_start_ms":1},"checkpoints":[{"id":"../../x","imports":["a"]}],"modules":{"a":{"available":true}}}`))
	f.Fuzz(func(t *testing.T, data []byte) {
		c, err := Parse(data)
		if err != nil {
			if !errors.Is(err, ErrInvalid) {
				t.Fatalf("error not ErrInvalid: %v", err)
			}
			return
		}
		// An accepted id is one plain name: outputs and sandboxes are named after it.
		for _, cp := range c.Checkpoints {
			if !checkpointid.Valid(cp.ID) || !filepath.IsLocal(cp.ID) || filepath.Base(cp.ID) != cp.ID {
				t.Fatalf("accepted id %q", cp.ID)
			}
		}
		r, err := NewRouter(c)
		if err != nil {
			t.Fatal(err)
		}
		names := []string{}
		for m := range c.Modules {
			names = append(names, m, m+".x")
		}
		ch := r.Select(names)
		if math.IsNaN(ch.PredictedMs) || ch.PredictedMs > ch.ColdMs {
			t.Fatalf("choice %+v", ch)
		}
		// Never a price of 0 ms: a choice is priced (a cold start measured, every restore
		// timed), or by image size with no price at all.
		switch ch.Basis {
		case BasisCostModel:
			if !(ch.PredictedMs > 0) || !(ch.ColdMs > 0) || !(ch.FixedMs > 0) {
				t.Fatalf("a priced choice at 0 ms: %+v", ch)
			}
		case BasisImageSize:
			if ch.PredictedMs != 0 || ch.ColdMs != 0 || ch.FixedMs != 0 || ch.ImportMs != 0 {
				t.Fatalf("a choice by image size with a price: %+v", ch)
			}
		default:
			t.Fatalf("basis %q", ch.Basis)
		}
	})
}

// TestParseNewerVersion: a catalogue of a version this reader does not know is refused for its
// version, not for a field the version added (which is how a version 1 reader meets version 2's
// packages).
func TestParseNewerVersion(t *testing.T) {
	data := fmt.Sprintf(`{"version": %d, "cost_model": {}, "checkpoints": [], "modules": {}, "flavours": {}}`, Version+1)
	_, err := Parse([]byte(data))
	if want := fmt.Sprintf("version %d: this reader knows 1 to %d", Version+1, Version); !errors.Is(err, ErrInvalid) || !strings.Contains(err.Error(), want) {
		t.Fatalf("error %v, want ErrInvalid naming %q", err, want)
	}
}

// TestSelectCostsOverflow: figures each finite (so valid) but whose sums overflow to +Inf price
// every option alike; with the one checkpoint passed over, SelectFor chose nothing and panicked.
// It starts cold.
func TestSelectCostsOverflow(t *testing.T) {
	m := model()
	m.ColdStartMs = math.MaxFloat64
	c := catalogue(m, pandasCP)
	c.Checkpoints[0].Packages = map[string]string{"pandas": "1.5.3"}
	for name, mod := range c.Modules {
		mod.ImportMs, mod.OwnMs = math.MaxFloat64, math.MaxFloat64
		c.Modules[name] = mod
	}
	r, err := NewRouter(c)
	if err != nil {
		t.Fatal(err)
	}
	req, err := pyreq.ParseRequirement("pandas>=2")
	if err != nil {
		t.Fatal(err)
	}
	if ch := r.SelectFor([]string{"seaborn", "pandas"}, []pyreq.Requirement{req}); !ch.Cold {
		t.Errorf("%+v, want a cold start", ch)
	}
}

// Closures gives each list of imports the closed set of analysed modules it loads, leaving
// out what the analysis lacks, and refuses modules that do not compile.
func TestClosures(t *testing.T) {
	got, err := Closures(stack(), []string{"seaborn"}, []string{"numpy", "torch"}, nil)
	if err != nil {
		t.Fatal(err)
	}
	want := [][]string{{"matplotlib", "matplotlib.pyplot", "numpy", "pandas", "seaborn"}, {"numpy"}, {}}
	if !slices.EqualFunc(got, want, slices.Equal) {
		t.Errorf("closures %v, want %v", got, want)
	}
	bad := stack()
	bad["pandas"] = Module{Available: true, Closure: []string{"pytz"}}
	if _, err := Closures(bad, []string{"pandas"}); err == nil || !strings.Contains(err.Error(), `closure member "pytz"`) {
		t.Errorf("error %v, want the unknown closure member named", err)
	}
}

// TestSelectWarm: the warm path's prices. A request for pandas chooses the pandas checkpoint
// (180 ms); from a warm sandbox of it, nothing is left to import (0 ms). seaborn holds pandas
// too, so its warm sandbox serves at 0 ms; empty's serves by importing numpy and pandas (400
// ms), slower than the choice's restore: not listed. A request for seaborn chooses seaborn; a
// warm pandas sandbox imports matplotlib, pyplot and seaborn (450 ms), slower than seaborn's
// restore (230 ms), and empty's too: none listed. A cold start is never warm.
func TestSelectWarm(t *testing.T) {
	r, err := NewRouter(catalogue(model(), emptyCP, pandasCP, seabornCP))
	if err != nil {
		t.Fatal(err)
	}
	ch := r.Select([]string{"pandas"})
	if ch.Checkpoint != "pandas" || ch.PredictedWarmMs != 0 || !slices.Equal(ch.Warm, []WarmOption{{"seaborn", 0}}) {
		t.Errorf("pandas: %q, warm %v ms, others %+v; want pandas, 0 ms, seaborn at 0 ms", ch.Checkpoint, ch.PredictedWarmMs, ch.Warm)
	}
	ch = r.Select([]string{"seaborn"})
	if ch.Checkpoint != "seaborn" || len(ch.Warm) != 0 {
		t.Errorf("seaborn: %q, others %+v; want seaborn alone", ch.Checkpoint, ch.Warm)
	}
	// A request the choice lacks an import of: its warm price is that import.
	ch = r.Select([]string{"pandas", "re"})
	if ch.PredictedWarmMs != ch.ImportMs {
		t.Errorf("warm %v ms, want the imports' %v ms", ch.PredictedWarmMs, ch.ImportMs)
	}
	cheapCold := model()
	cheapCold.ColdStartMs = 50
	r, err = NewRouter(catalogue(cheapCold, emptyCP, pandasCP))
	if err != nil {
		t.Fatal(err)
	}
	// Cold (50 ms) beats every restore of a request for re; a warm empty (0 ms) beats cold.
	if ch := r.Select([]string{"re"}); !ch.Cold || ch.PredictedWarmMs != 0 || !slices.Equal(ch.Warm, []WarmOption{{"empty", 0}, {"pandas", 0}}) {
		t.Errorf("re: cold %v, warm %v ms, others %+v; want cold, empty and pandas warm at 0 ms", ch.Cold, ch.PredictedWarmMs, ch.Warm)
	}
}
