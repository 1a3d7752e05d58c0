package outcatalogue

import (
	"errors"
	"os"
	"path/filepath"
	"slices"
	"testing"

	"readie.dev/pipeline/internal/analysis"
	"readie.dev/pipeline/internal/testenv"
	"readie.dev/pipeline/pkg/atomicfile"
	"readie.dev/pipeline/pkg/catalogue"
	"readie.dev/pipeline/pkg/manifest"
)

const mebi = 1 << 20

func testManifest() *manifest.Manifest {
	return &manifest.Manifest{
		Rootfs: manifest.Rootfs{Digest: "sha256:root"}, Runsc: manifest.Runsc{SHA256: "runsc"}, SpecFingerprint: "sha256:spec",
		AlphaMsPerMiB: 1.5, InterceptMs: 130,
		Checkpoints: []manifest.Checkpoint{
			{ID: "empty", Imports: []string{}, Bytes: 8 * mebi, RestoreMS: manifest.Stats{Median: 150}},
			{ID: "pandas", Imports: []string{"pandas"}, Bytes: 40 * mebi, RestoreMS: manifest.Stats{Median: 190},
				Packages: map[string]string{"pandas": "1.5.3", "numpy": "1.24.2"}},
		},
	}
}

func testAnalysis() *analysis.File {
	mod := func(name string, own, mib float64, closure ...string) analysis.Entry {
		return analysis.Entry{Module: name, Available: true, ImportMs: own, MiB: mib, OwnMs: own, OwnMiB: mib, Closure: append([]string{name}, closure...)}
	}
	return &analysis.File{
		Version: analysis.Version,
		Image:   analysis.Provenance{RootfsDigest: "sha256:root", Runsc: "runsc", SpecDigest: "sha256:spec", Runs: 3},
		Names: map[string]analysis.Entry{
			"numpy":  mod("numpy", 200, 9.5),
			"pandas": {Module: "pandas", Available: true, ImportMs: 900, MiB: 31, OwnMs: 700, OwnMiB: 21.5, Closure: []string{"numpy", "pandas"}},
			"torch":  {Module: "torch", Error: "no module named torch"},
		},
		Host: &analysis.HostCosts{ColdStartMs: 400, EmptyMiB: 8, InterceptMs: 200, AlphaMsPerMiB: 4, RestoreSets: []string{"empty", "pandas"},
			Pooled: catalogue.PooledLine{InterceptMs: 60, AlphaMsPerMiB: 2, ColdStartMs: 300}},
		Packages: map[string]string{"pandas": "1.5.3", "numpy": "1.24.2"},
	}
}

func TestBuildCatalogue(t *testing.T) {
	m := testManifest()
	in := FromAnalysis(testAnalysis(), "test")
	in.Predicted = map[string]float64{"pandas": 39}
	c, err := Build(m, in)
	if err != nil {
		t.Fatal(err)
	}
	// The manifest's restore line (two sizes), analyze's cold start and pooled line, the empty
	// image measured.
	want := catalogue.CostModel{InterceptMs: 130, AlphaMsPerMiB: 1.5, ColdStartMs: 400, EmptyMiB: 8,
		Pooled: catalogue.PooledLine{InterceptMs: 60, AlphaMsPerMiB: 2, ColdStartMs: 300}}
	if c.CostModel != want {
		t.Errorf("cost model %+v, want %+v", c.CostModel, want)
	}
	if c.Version != 3 {
		t.Errorf("version %d with a pooled line, want 3", c.Version)
	}
	p := c.Checkpoints[1]
	if p.ID != "pandas" || !slices.Equal(p.Closure, []string{"numpy", "pandas"}) || p.ImageMiB != 40 || p.PredictedMiB != 39 || p.RestoreMedianMs != 190 {
		t.Errorf("pandas %+v", p)
	}
	if e := c.Checkpoints[0]; e.ID != "empty" || len(e.Closure) != 0 || e.PredictedMiB != 0 {
		t.Errorf("empty %+v", e)
	}
	if c.Prediction == nil || c.Prediction.Sets != 1 || c.Prediction.MeanAbsErrorMiB != 1 || c.Prediction.MeanAbsErrorPct != 2.5 {
		t.Errorf("prediction %+v", c.Prediction)
	}
	r, err := catalogue.NewRouter(c)
	if err != nil {
		t.Fatal(err)
	}
	if ch := r.Select([]string{"pandas.DataFrame", "numpy"}); ch.Checkpoint != "pandas" || ch.PredictedMs != 190 {
		t.Errorf("select %+v", ch)
	}
	// Packages: each checkpoint's from the manifest, the image's from the analysis, and kept
	// by a catalogue rebuilt from this one (measure, merge, pull).
	if p.Packages["pandas"] != "1.5.3" || c.Packages["numpy"] != "1.24.2" || c.Checkpoints[0].Packages != nil {
		t.Errorf("packages: pandas %v, image %v, empty %v", p.Packages, c.Packages, c.Checkpoints[0].Packages)
	}
	if again, err := Build(m, FromCatalogue(c, "test")); err != nil || again.Packages["pandas"] != "1.5.3" || again.Checkpoints[1].Packages["numpy"] != "1.24.2" || again.CostModel != want {
		t.Errorf("rebuilt: %+v, %v", again, err)
	}

	// With one image size the manifest has no line: analyze's serves.
	one := testManifest()
	one.Checkpoints = one.Checkpoints[:1]
	c, err = Build(one, FromAnalysis(testAnalysis(), "test"))
	if err != nil {
		t.Fatal(err)
	}
	if c.CostModel.InterceptMs != 200 || c.CostModel.AlphaMsPerMiB != 4 || c.Prediction != nil {
		t.Errorf("one size: %+v", c)
	}

	// Without an analysis: checkpoints and the manifest's line, no module priced.
	c, err = Build(m, Inputs{})
	if err != nil {
		t.Fatal(err)
	}
	if len(c.Modules) != 0 || len(c.Checkpoints[1].Closure) != 0 || c.CostModel.ColdStartMs != 0 {
		t.Errorf("no analysis: %+v", c)
	}
	// No pooled line: version 2, which a kit of before the pooled line still reads.
	if c.Version != 2 {
		t.Errorf("version %d without a pooled line, want 2", c.Version)
	}

	// A checkpoint's unmapped modules go into the catalogue, which is then version 4 (a kit
	// of version 3 would refuse the key).
	m.Checkpoints[1].UnmappedModules = []string{"appmod"}
	c, err = Build(m, Inputs{})
	if err != nil {
		t.Fatal(err)
	}
	if got := c.Checkpoints[1].UnmappedModules; c.Version != 4 || !slices.Equal(got, []string{"appmod"}) || c.Checkpoints[0].UnmappedModules != nil {
		t.Errorf("unmapped modules: version %d, pandas %v, empty %v", c.Version, got, c.Checkpoints[0].UnmappedModules)
	}

	// The smoke test's measure of a checkpoint's memory, restored and idle, goes into the
	// catalogue, which is then version 5.
	m.Checkpoints[1].Smoke.ResidentBytes = 113 << 20
	c, err = Build(m, Inputs{})
	if err != nil {
		t.Fatal(err)
	}
	if c.Version != 5 || c.Checkpoints[1].ResidentBytes != 113<<20 || c.Checkpoints[0].ResidentBytes != 0 {
		t.Errorf("resident memory: version %d, %+v", c.Version, c.Checkpoints)
	}
	// Its own part, what a warm sandbox pins, makes it version 6.
	m.Checkpoints[1].Smoke.OwnBytes = 80 << 20
	c, err = Build(m, Inputs{})
	if err != nil {
		t.Fatal(err)
	}
	if c.Version != 6 || c.Checkpoints[1].OwnBytes != 80<<20 || c.Checkpoints[0].OwnBytes != 0 {
		t.Errorf("own memory: version %d, %+v", c.Version, c.Checkpoints)
	}
	// analyze's memory line goes into the cost model, which is then version 7, and a catalogue
	// rebuilt from this one keeps it.
	a := testAnalysis()
	a.Host.Memory = catalogue.MemoryLine{InterceptBytes: 40 << 20, BytesPerMiB: 1.1 * mebi}
	c, err = Build(m, FromAnalysis(a, "test"))
	if err != nil {
		t.Fatal(err)
	}
	if c.Version != 7 || c.CostModel.Memory != a.Host.Memory {
		t.Errorf("memory line: version %d, %+v", c.Version, c.CostModel)
	}
	if again, err := Build(m, FromCatalogue(c, "test")); err != nil || again.CostModel.Memory != a.Host.Memory || again.Version != 7 {
		t.Errorf("rebuilt with a memory line: %+v, %v", again, err)
	}
}

func TestMatchesManifest(t *testing.T) {
	a := testAnalysis()
	if err := MatchesManifest(a, testManifest()); err != nil {
		t.Fatal(err)
	}
	a.Image.RootfsDigest = "sha256:other"
	if err := MatchesManifest(a, testManifest()); err == nil {
		t.Fatal("an analysis of another image matched")
	}
}

// Measure, merge and pull rebuild the catalogue from the one they had, for the new manifest.
func TestRebuildCatalogue(t *testing.T) {
	out := t.TempDir()
	m := testManifest()
	in := FromAnalysis(testAnalysis(), "test")
	in.Predicted = map[string]float64{"pandas": 39}
	if _, err := Write(out, m, in); err != nil {
		t.Fatal(err)
	}
	m.Checkpoints[1].RestoreMS.Median = 175
	if err := Rebuild(out, m); err != nil {
		t.Fatal(err)
	}
	c, err := catalogue.Load(filepath.Join(out, catalogue.FileName))
	if err != nil {
		t.Fatal(err)
	}
	if c.Checkpoints[1].RestoreMedianMs != 175 || c.Checkpoints[1].PredictedMiB != 39 || len(c.Modules) != 3 || c.CostModel.ColdStartMs != 400 {
		t.Errorf("rebuilt catalogue %+v", c)
	}
	// A pulled image's catalogue is rebuilt for the verified manifest; a bad one is refused.
	if err := Pulled(out, m); err != nil {
		t.Fatal(err)
	}
	atomicfile.Write(filepath.Join(out, catalogue.FileName), []byte(`{"version": 9}`), 0o644)
	if err := Pulled(out, m); !errors.Is(err, catalogue.ErrInvalid) {
		t.Errorf("a bad pulled catalogue: %v", err)
	}
	os.Remove(filepath.Join(out, catalogue.FileName))
	if err := Pulled(out, m); err != nil {
		t.Errorf("an image without a catalogue: %v", err)
	}
	if _, err := os.Stat(filepath.Join(out, catalogue.FileName)); !errors.Is(err, os.ErrNotExist) {
		t.Errorf("a catalogue appeared from nothing: %v", err)
	}
}

// A capture's catalogue takes the output's analysis.json only when it was measured on the
// image the manifest names.
func TestCatalogueInputsOfACapture(t *testing.T) {
	out := t.TempDir()
	a := testAnalysis()
	if err := a.Save(filepath.Join(out, analysis.FileName)); err != nil {
		t.Fatal(err)
	}
	if in := ForCapture(out, testManifest(), nil, nil, testenv.DiscardLog()); len(in.Modules) != 3 {
		t.Errorf("inputs from the output's analysis: %+v", in)
	}
	other := testManifest()
	other.Rootfs.Digest = "sha256:another"
	if in := ForCapture(out, other, nil, nil, testenv.DiscardLog()); in.Modules != nil {
		t.Errorf("an analysis of another image was taken: %+v", in)
	}
	// The cached analysis serves when the output has none of its image.
	cached := testAnalysis()
	cached.Image.RootfsDigest = "sha256:another"
	if in := ForCapture(out, other, cached, nil, testenv.DiscardLog()); len(in.Modules) != 3 {
		t.Errorf("the cached analysis was not taken: %+v", in)
	}
}
