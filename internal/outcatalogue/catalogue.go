// Package outcatalogue builds the catalogue.json of an output from its manifest and the
// inputs a manifest does not hold (Inputs: the analysed modules, the cost model's measured
// constants, the plan's predictions), whichever command wrote the output: capture, merge,
// pull or measure.
package outcatalogue

import (
	"errors"
	"fmt"
	"io/fs"
	"math"
	"path/filepath"
	"slices"

	"github.com/sirupsen/logrus"

	"readie.dev/pipeline/internal/analysis"
	"readie.dev/pipeline/internal/config"
	"readie.dev/pipeline/pkg/atomicfile"
	"readie.dev/pipeline/pkg/catalogue"
	"readie.dev/pipeline/pkg/manifest"
	"readie.dev/pipeline/pkg/measure"
)

// Inputs are what catalogue.json holds beyond the manifest: the analysed modules, the
// cost model's constants that a manifest does not measure, and the plan's predicted sizes.
// Every output's catalogue is built from its manifest and these (Build), whether a
// capture, a merge, a pull or a measure wrote it.
type Inputs struct {
	// Modules are the analysed modules (none: the catalogue prices no module).
	Modules map[string]catalogue.Module
	// Model gives the cold start, and the restore line when the manifest cannot (fewer than
	// two image sizes); nil when nothing measured them.
	Model *catalogue.CostModel
	// Predicted is the planned image size of each set, by id.
	Predicted map[string]float64
	// Packages are the image's distributions (nil: unknown).
	Packages map[string]string
	// From says where the modules came from, for the log.
	From string
}

// FromAnalysis returns the inputs an analysis gives.
func FromAnalysis(a *analysis.File, from string) Inputs {
	in := Inputs{Modules: a.Modules(), From: from, Packages: a.Packages}
	if h := a.Host; h != nil {
		in.Model = &catalogue.CostModel{InterceptMs: h.InterceptMs, AlphaMsPerMiB: h.AlphaMsPerMiB, ColdStartMs: h.ColdStartMs, EmptyMiB: h.EmptyMiB, Pooled: h.Pooled, Memory: h.Memory}
	}
	return in
}

// FromCatalogue returns the inputs an earlier catalogue gives (a source of a merge or a pull).
func FromCatalogue(c *catalogue.Catalogue, from string) Inputs {
	in := Inputs{Modules: c.Modules, From: from, Predicted: map[string]float64{}, Packages: c.Packages}
	model := c.CostModel
	in.Model = &model
	for _, cp := range c.Checkpoints {
		if cp.PredictedMiB > 0 {
			in.Predicted[cp.ID] = cp.PredictedMiB
		}
	}
	return in
}

// MatchesManifest reports whether an analysis was measured on what m's checkpoints were made
// with (rootfs, runsc, spec); it says why not.
func MatchesManifest(a *analysis.File, m *manifest.Manifest) error {
	for _, f := range []struct{ field, analysis, manifest string }{
		{"rootfs digest", a.Image.RootfsDigest, m.Rootfs.Digest},
		{"runsc sha256", a.Image.Runsc, m.Runsc.SHA256},
		{"spec fingerprint", a.Image.SpecDigest, m.SpecFingerprint},
	} {
		if f.analysis != f.manifest {
			return fmt.Errorf("the analysis was measured with %s %s, the output's checkpoints with %s", f.field, f.analysis, f.manifest)
		}
	}
	return nil
}

// mib returns a size in MiB.
func mib(bytes int64) float64 { return float64(bytes) / (1 << 20) }

// Build returns the catalogue of the output whose manifest is m: each checkpoint's imports,
// closure (from the analysed modules), image size, measured restore median and predicted size;
// the modules; and the cost model: the manifest's restore line when it has two image sizes or
// more, else the inputs' measured one; the cold start, the pooled line and the memory line from
// the inputs.
func Build(m *manifest.Manifest, in Inputs) (*catalogue.Catalogue, error) {
	modules := in.Modules
	if modules == nil {
		modules = map[string]catalogue.Module{}
	}
	c := &catalogue.Catalogue{Version: catalogue.Version, Modules: modules, Checkpoints: []catalogue.Checkpoint{}, Packages: in.Packages}
	var sizes []float64
	for _, cp := range m.Checkpoints {
		if !slices.Contains(sizes, mib(cp.Bytes)) {
			sizes = append(sizes, mib(cp.Bytes))
		}
		if cp.ID == config.EmptySetID {
			c.CostModel.EmptyMiB = mib(cp.Bytes)
		}
	}
	c.CostModel.InterceptMs, c.CostModel.AlphaMsPerMiB = m.InterceptMs, m.AlphaMsPerMiB
	if in.Model != nil {
		c.CostModel.ColdStartMs, c.CostModel.Pooled, c.CostModel.Memory = in.Model.ColdStartMs, in.Model.Pooled, in.Model.Memory
		if len(sizes) < 2 {
			c.CostModel.InterceptMs, c.CostModel.AlphaMsPerMiB = in.Model.InterceptMs, in.Model.AlphaMsPerMiB
		}
	}
	// A line fitted to noisy medians may slope down or cross zero: it prices nothing then.
	c.CostModel.InterceptMs, c.CostModel.AlphaMsPerMiB = max(c.CostModel.InterceptMs, 0), max(c.CostModel.AlphaMsPerMiB, 0)
	imports := make([][]string, len(m.Checkpoints))
	for i, cp := range m.Checkpoints {
		imports[i] = cp.Imports
	}
	closures, err := catalogue.Closures(modules, imports...)
	if err != nil {
		return nil, fmt.Errorf("%w: %w", catalogue.ErrInvalid, err)
	}
	var errsMiB, errsPct []float64
	for i, cp := range m.Checkpoints {
		entry := catalogue.Checkpoint{
			ID: cp.ID, Imports: slices.Clone(cp.Imports), Closure: closures[i],
			ImageMiB: round2(mib(cp.Bytes)), RestoreMedianMs: cp.RestoreMS.Median,
			PredictedMiB: round2(in.Predicted[cp.ID]), Packages: cp.Packages, UnmappedModules: cp.UnmappedModules,
			ResidentBytes: cp.Smoke.ResidentBytes, OwnBytes: cp.Smoke.OwnBytes,
		}
		if entry.Imports == nil {
			entry.Imports = []string{}
		}
		if p := in.Predicted[cp.ID]; p > 0 && cp.Bytes > 0 {
			errsMiB = append(errsMiB, math.Abs(mib(cp.Bytes)-p))
			errsPct = append(errsPct, 100*math.Abs(mib(cp.Bytes)-p)/mib(cp.Bytes))
		}
		c.Checkpoints = append(c.Checkpoints, entry)
	}
	if len(errsMiB) > 0 {
		c.Prediction = &catalogue.Prediction{Sets: len(errsMiB), MeanAbsErrorMiB: round2(mean(errsMiB)), MeanAbsErrorPct: round2(mean(errsPct))}
	}
	c.Version = catalogue.VersionFor(c)
	if err := c.Validate(); err != nil {
		return nil, err
	}
	return c, nil
}

func mean(v []float64) float64 {
	s := 0.0
	for _, x := range v {
		s += x
	}
	return s / float64(len(v))
}

func round2(v float64) float64 { return math.Round(v*100) / 100 }

// Write builds and writes dir/catalogue.json for the manifest m.
func Write(dir string, m *manifest.Manifest, in Inputs) (*catalogue.Catalogue, error) {
	c, err := Build(m, in)
	if err != nil {
		return nil, fmt.Errorf("catalogue: %w", err)
	}
	if err := atomicfile.WriteJSON(filepath.Join(dir, catalogue.FileName), c); err != nil {
		return nil, fmt.Errorf("write catalogue: %w", err)
	}
	return c, nil
}

// Rebuild writes out's catalogue again for its manifest m (after a measure changed its
// restore medians), keeping the inputs of the catalogue it had; an output without one gets
// none.
func Rebuild(out string, m *manifest.Manifest) error {
	old, err := catalogue.Load(filepath.Join(out, catalogue.FileName))
	if errors.Is(err, fs.ErrNotExist) {
		return nil
	}
	if err != nil {
		return err
	}
	_, err = Write(out, m, FromCatalogue(old, "the output's catalogue"))
	return err
}

// CostModel returns the manifest's cost model: the line of restore medians against image sizes.
func CostModel(cs []manifest.Checkpoint) (alphaMsPerMiB, interceptMs float64) {
	var sizes []int64
	var medians []float64
	for _, c := range cs {
		sizes = append(sizes, c.Bytes)
		medians = append(medians, c.RestoreMS.Median)
	}
	fit := measure.CostModel(sizes, medians)
	return fit.Slope, fit.Intercept
}

// ForCapture returns the inputs of a capture's catalogue: the output's analysis.json when it
// was measured on this image, else cached (the analysis cache's, nil for none); the plan's
// predictions. An analysis left out is logged to log.
func ForCapture(out string, m *manifest.Manifest, cached *analysis.File, predicted map[string]float64, log logrus.FieldLogger) Inputs {
	in := Inputs{From: "no analysis"}
	path := filepath.Join(out, analysis.FileName)
	a, err := analysis.Load(path)
	switch {
	case err == nil && MatchesManifest(a, m) == nil:
		in = FromAnalysis(a, path)
	case err == nil:
		log.WithField("analysis", path).Warnf("catalogue: the output's analysis is not of this image (%v): left out", MatchesManifest(a, m))
	case !errors.Is(err, fs.ErrNotExist):
		log.WithField("analysis", path).WithError(err).Warn("catalogue: the output's analysis cannot be read: left out")
	}
	if in.Modules == nil && cached != nil && MatchesManifest(cached, m) == nil {
		in = FromAnalysis(cached, "the analysis cache")
	}
	in.Predicted = predicted
	return in
}

// Pulled rebuilds the catalogue of a pulled output (in staging) for its verified
// manifest, from the catalogue the image carried (its modules, cost model and predictions);
// an image without one gives an output without one. A catalogue that does not parse is refused
// like any other bad file of the image.
func Pulled(staging string, m *manifest.Manifest) error {
	path := filepath.Join(staging, catalogue.FileName)
	c, err := catalogue.Load(path)
	if errors.Is(err, fs.ErrNotExist) {
		return nil
	}
	if err != nil {
		return fmt.Errorf("the image's catalogue.json: %w", err)
	}
	_, err = Write(staging, m, FromCatalogue(c, "the image's catalogue"))
	return err
}
