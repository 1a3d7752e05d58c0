package analysis

import (
	"encoding/json"
	"errors"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"

	"readie.dev/pipeline/pkg/catalogue"
)

func sample() *File {
	return &File{
		Version: Version,
		Image:   Provenance{RootfsDigest: "sha256:abc", Runsc: "readie-x", SpecDigest: "sha256:def", Runs: 3},
		Stdlib:  []string{"json", "re"},
		Names: map[string]Entry{
			"numpy":                                {Module: "numpy", Available: true, ImportMs: 100, MiB: 10, OwnMs: 100, OwnMiB: 10, Closure: []string{"numpy"}},
			"pandas":                               {Module: "pandas", Available: true, ImportMs: 400, MiB: 30, OwnMs: 300, OwnMiB: 20, Closure: []string{"numpy", "pandas"}},
			"sklearn":                              {Module: "sklearn", Available: true, ImportMs: 300, MiB: 20, OwnMs: 200, OwnMiB: 10, Closure: []string{"numpy", "sklearn"}},
			"sklearn.preprocessing.StandardScaler": {Module: "sklearn.preprocessing", Available: true, ImportMs: 500, MiB: 30, OwnMs: 200, OwnMiB: 10, Closure: []string{"numpy", "sklearn", "sklearn.preprocessing"}},
			"sklearn.preprocessing.MinMaxScaler":   {Module: "sklearn.preprocessing", Available: true, ImportMs: 500, MiB: 30, OwnMs: 200, OwnMiB: 10, Closure: []string{"numpy", "sklearn", "sklearn.preprocessing"}},
			"transformers.pipeline":                {Module: "transformers", Available: false, Error: "ModuleNotFoundError: No module named 'transformers'"},
		},
	}
}

// router compiles the analysis's modules for routing under model, as a catalogue of no
// checkpoint.
func router(a *File, model catalogue.CostModel) (*catalogue.Router, error) {
	return catalogue.NewRouter(&catalogue.Catalogue{Version: catalogue.Version, CostModel: model, Modules: a.Modules()})
}

func TestValidSaveLoad(t *testing.T) {
	f := sample()
	path := filepath.Join(t.TempDir(), FileName)
	if err := f.Save(path); err != nil {
		t.Fatal(err)
	}
	back, err := Load(path)
	if err != nil {
		t.Fatal(err)
	}
	mods := back.Modules()
	if len(mods) != 5 || mods["sklearn.preprocessing"].OwnMs != 200 || mods["transformers"].Available {
		t.Fatalf("modules %+v", mods)
	}
	r, err := router(back, catalogue.CostModel{InterceptMs: 100, AlphaMsPerMiB: 1, ColdStartMs: 200, EmptyMiB: 10})
	if err != nil {
		t.Fatal(err)
	}
	if m := r.Select([]string{"sklearn.preprocessing.RobustScaler"}).Modules; !slices.Equal(m, []string{"sklearn.preprocessing"}) {
		t.Errorf("resolved to %q", m)
	}
}

// TestPooledLineSaveLoad: the host's pooled line is kept, and an analysis of version 2 (before
// the line) still loads, with none.
func TestPooledLineSaveLoad(t *testing.T) {
	f := sample()
	f.Host = &HostCosts{CPU: "x", ColdStartMs: 400, EmptyMiB: 8, InterceptMs: 200, AlphaMsPerMiB: 4, RestoreSets: []string{"empty"},
		Pooled: catalogue.PooledLine{InterceptMs: 60, AlphaMsPerMiB: 2, ColdStartMs: 300}, PooledRSquared: 0.9}
	path := filepath.Join(t.TempDir(), FileName)
	if err := f.Save(path); err != nil {
		t.Fatal(err)
	}
	back, err := Load(path)
	if err != nil {
		t.Fatal(err)
	}
	if back.Host.Pooled != f.Host.Pooled || back.Host.PooledRSquared != 0.9 {
		t.Errorf("host %+v", back.Host)
	}
	v2 := `{"version":2,"image":{"rootfs_digest":"d","runsc":"r","spec_digest":"s","runs":1},"stdlib":[],"names":{},` +
		`"host":{"cpu":"x","cold_start_ms":400,"empty_mib":8,"intercept_ms":200,"alpha_ms_per_mib":4,"restore_sets":["empty"],"r_squared":1}}`
	old, err := Parse([]byte(v2))
	if err != nil {
		t.Fatalf("version 2: %v", err)
	}
	if old.Host.Pooled.Measured() || old.Host.ColdStartMs != 400 {
		t.Errorf("version 2 host %+v", old.Host)
	}
}

func TestInvalidAnalyses(t *testing.T) {
	for _, tc := range []struct {
		name string
		edit func(f *File)
		want string
	}{
		{"version", func(f *File) { f.Version = 0 }, "version 0"},
		{"module not a prefix", func(f *File) {
			f.Names["pandas.DataFrame"] = Entry{Module: "numpy", Available: true, Closure: []string{"numpy"}}
		}, `module "numpy" is not a prefix`},
		{"partial prefix", func(f *File) {
			f.Names["numpyx"] = Entry{Module: "numpy", Available: true, Closure: []string{"numpy"}}
		}, `module "numpy" is not a prefix`},
		{"disagreeing entries", func(f *File) {
			e := f.Names["sklearn.preprocessing.MinMaxScaler"]
			e.OwnMs = 1
			f.Names["sklearn.preprocessing.MinMaxScaler"] = e
		}, "different figures"},
		{"closure lacks the module", func(f *File) {
			f.Names["numpy"] = Entry{Module: "numpy", Available: true, Closure: []string{}}
		}, "lacks the module numpy"},
		{"closure unsorted", func(f *File) {
			e := f.Names["pandas"]
			e.Closure = []string{"pandas", "numpy"}
			f.Names["pandas"] = e
		}, "not sorted"},
		{"closure member without entry", func(f *File) {
			e := f.Names["pandas"]
			e.Closure = []string{"numpy", "pandas", "pytz"}
			f.Names["pandas"] = e
		}, "closure member pytz is not an available module"},
		{"closure member unavailable", func(f *File) {
			e := f.Names["pandas"]
			e.Closure = []string{"numpy", "pandas", "transformers"}
			f.Names["pandas"] = e
			f.Names["transformers"] = Entry{Module: "transformers"}
		}, "closure member transformers is not an available module"},
		{"negative time", func(f *File) {
			e := f.Names["numpy"]
			e.OwnMs = -3
			f.Names["numpy"] = e
		}, "own_ms -3"},
		{"unavailable with a closure", func(f *File) {
			f.Names["torch"] = Entry{Module: "torch", Closure: []string{"numpy"}}
		}, "unavailable but has a closure"},
		{"bad name", func(f *File) { f.Names["a b"] = Entry{Module: "a"} }, `"a b" is not a dotted`},
		{"bad stdlib", func(f *File) { f.Stdlib = append(f.Stdlib, "") }, `stdlib: ""`},
		{"negative pooled line", func(f *File) {
			f.Host = &HostCosts{ColdStartMs: 400, Pooled: catalogue.PooledLine{AlphaMsPerMiB: -1, ColdStartMs: 300}}
		}, "host: "},
	} {
		t.Run(tc.name, func(t *testing.T) {
			f := sample()
			tc.edit(f)
			path := filepath.Join(t.TempDir(), FileName)
			err := f.Save(path)
			if !errors.Is(err, ErrInvalid) || !strings.Contains(err.Error(), tc.want) {
				t.Fatalf("error %v, want ErrInvalid with %q", err, tc.want)
			}
			if _, statErr := os.Stat(path); !errors.Is(statErr, os.ErrNotExist) {
				t.Errorf("an invalid analysis was written: %v", statErr)
			}
		})
	}
}

func TestClosure(t *testing.T) {
	stdlib := map[string]bool{"json": true, "collections": true, "_ssl": true}
	analysed := map[string]bool{"sklearn.preprocessing": true, "collections": true, "matplotlib.pyplot": true}
	added := []string{"json", "json.decoder", "numpy", "numpy.core", "_ssl", "__main__", "scipy.sparse", "sklearn.preprocessing",
		"sklearn.utils", "collections", "_cffi_backend", "six.moves.urllib", "weird-name", "matplotlib.pyplot"}
	got := Closure("sklearn.ensemble", added, stdlib, analysed)
	want := []string{"_cffi_backend", "collections", "matplotlib", "matplotlib.pyplot", "numpy", "scipy", "six", "sklearn", "sklearn.ensemble", "sklearn.preprocessing"}
	if !slices.Equal(got, want) {
		t.Errorf("closure %v\nwant    %v", got, want)
	}
}

func FuzzParse(f *testing.F) {
	good, _ := json.Marshal(sample())
	f.Add(good)
	f.Add([]byte(`{"version":1,"names":{"a.b":{"module":"a","available":true,"closure":["a"]},"a":{"module":"a","available":true,"closure":["a"]}}}`))
	f.Fuzz(func(t *testing.T, data []byte) {
		a, err := Parse(data)
		if err != nil {
			if !errors.Is(err, ErrInvalid) {
				t.Fatalf("error not ErrInvalid: %v", err)
			}
			return
		}
		// A valid analysis always compiles.
		if _, err := router(a, catalogue.CostModel{}); err != nil {
			t.Fatalf("valid analysis does not compile: %v", err)
		}
	})
}

func TestOwnSteps(t *testing.T) {
	steps := OwnSteps(map[string][]string{
		"numpy":             {"numpy"},
		"pandas":            {"numpy", "pandas"},
		"matplotlib":        {"matplotlib", "matplotlib.colors", "numpy"},
		"matplotlib.colors": {"matplotlib", "matplotlib.colors", "numpy"},
		"matplotlib.pyplot": {"matplotlib", "matplotlib.colors", "matplotlib.pyplot", "numpy"},
		// seaborn's closure as measured lacks numpy (pandas brings it): still preloaded.
		"seaborn": {"matplotlib.pyplot", "pandas", "seaborn"},
	})
	want := []OwnStep{
		{Module: "matplotlib", Preload: []string{"numpy"}, Measure: true},
		{Module: "matplotlib.colors", Preload: []string{"numpy"}, Measure: false},
		{Module: "matplotlib.pyplot", Preload: []string{"matplotlib", "matplotlib.colors", "numpy"}, Measure: true},
		{Module: "numpy", Measure: true},
		{Module: "pandas", Preload: []string{"numpy"}, Measure: true},
		{Module: "seaborn", Preload: []string{"matplotlib", "matplotlib.colors", "matplotlib.pyplot", "numpy", "pandas"}, Measure: true},
	}
	if len(steps) != len(want) {
		t.Fatalf("steps %+v", steps)
	}
	for i := range want {
		if steps[i].Module != want[i].Module || steps[i].Measure != want[i].Measure || !slices.Equal(steps[i].Preload, want[i].Preload) {
			t.Errorf("step %+v, want %+v", steps[i], want[i])
		}
	}
}
