package catalogue

import (
	"errors"
	"fmt"
	"maps"
	"math"
	"slices"
	"strings"

	"readie.dev/pipeline/pkg/catalogue/internal/cost"
)

// CostModel prices the ways to start a request (milliseconds, MiB). A checkpoint of predicted
// image size S costs InterceptMs + AlphaMsPerMiB x S to restore; a cold start costs ColdStartMs;
// either then imports what the request needs and the start did not already hold. Pooled, when
// measured, prices the same starts in a sandbox created ahead (a worker's pool).
type CostModel struct {
	// InterceptMs and AlphaMsPerMiB are this host's restore cost line (pipeline bench's fit of
	// restore time against pages.img size).
	InterceptMs   float64 `json:"intercept_ms"`
	AlphaMsPerMiB float64 `json:"alpha_ms_per_mib"`
	// ColdStartMs is a cold sandbox start of the executor to its first answer, imports aside.
	ColdStartMs float64 `json:"cold_start_ms"`
	// EmptyMiB is the image size of the "empty" checkpoint: the interpreter and the executor.
	EmptyMiB float64 `json:"empty_mib"`
	// Pooled is the line of a start in a sandbox created ahead; zero when it was not measured
	// (catalogues before version 3, analyses without it).
	Pooled PooledLine `json:"pooled,omitzero"`
	// Memory is the line of a checkpoint's own memory, restored and idle, against its image
	// size; zero when it was not measured (catalogues before version 7, analyses without it).
	Memory MemoryLine `json:"memory,omitzero"`
}

// MemoryLine predicts the own memory of a sandbox restored from a checkpoint of S MiB and idle
// (launch.Memory.Own: what each warm sandbox of it pins): InterceptBytes + BytesPerMiB x S.
// analyze fits it to pooled restores of the restore line's checkpoints, so that a set planned
// but not yet captured has a memory to size its warm pool by.
type MemoryLine struct {
	InterceptBytes int64   `json:"intercept_bytes"`
	BytesPerMiB    float64 `json:"bytes_per_mib"`
}

// Measured reports whether the line holds figures: a sandbox's measured memory is never zero.
func (l MemoryLine) Measured() bool { return l != MemoryLine{} }

// OwnBytes is the predicted own memory of a sandbox restored from an image of imageMiB.
func (l MemoryLine) OwnBytes(imageMiB float64) int64 {
	return l.InterceptBytes + int64(l.BytesPerMiB*imageMiB)
}

// PooledLine prices a start in a sandbox that `runsc create` made ahead, off the clock (a
// pool's): a restore of an image of S MiB costs InterceptMs + AlphaMsPerMiB x S, a cold start
// ColdStartMs, each from `runsc restore` (or `runsc start`) to the executor's first answer. A
// pool takes the sandbox's boot off a start, which a difference of two lines measured apart
// (the restore less a create) does not price: analyze measures this line on its own.
type PooledLine struct {
	InterceptMs   float64 `json:"intercept_ms"`
	AlphaMsPerMiB float64 `json:"alpha_ms_per_mib"`
	ColdStartMs   float64 `json:"cold_start_ms"`
}

// Measured reports whether the line holds figures: a measured cold start is never zero.
func (l PooledLine) Measured() bool { return l != PooledLine{} }

// RestoreMs is the predicted pooled restore time of an image of imageMiB.
func (l PooledLine) RestoreMs(imageMiB float64) float64 {
	return l.InterceptMs + l.AlphaMsPerMiB*imageMiB
}

// RestoreMs returns the predicted restore time of an image of imageMiB.
func (m CostModel) RestoreMs(imageMiB float64) float64 {
	return m.InterceptMs + m.AlphaMsPerMiB*imageMiB
}

// Validate checks the figures: each finite and >= 0.
func (m CostModel) Validate() error {
	var problems []error
	for _, f := range []struct {
		name string
		v    float64
	}{{"intercept_ms", m.InterceptMs}, {"alpha_ms_per_mib", m.AlphaMsPerMiB}, {"cold_start_ms", m.ColdStartMs}, {"empty_mib", m.EmptyMiB},
		{"pooled.intercept_ms", m.Pooled.InterceptMs}, {"pooled.alpha_ms_per_mib", m.Pooled.AlphaMsPerMiB}, {"pooled.cold_start_ms", m.Pooled.ColdStartMs},
		{"memory.intercept_bytes", float64(m.Memory.InterceptBytes)}, {"memory.bytes_per_mib", m.Memory.BytesPerMiB}} {
		if !finiteNonNegative(f.v) {
			problems = append(problems, fmt.Errorf("cost model: %s %v: want a finite number >= 0", f.name, f.v))
		}
	}
	return errors.Join(problems...)
}

// Module is what the analysis measured of one module. The cost model is additive over modules:
// a start that lacks a set of modules pays the sum of their own figures, so a module shared by
// several closures is counted once.
type Module struct {
	// Available is false when the module does not import in the image; it is then never
	// loaded by a checkpoint and its figures are zero.
	Available bool `json:"available"`
	// ImportMs and MiB are a cold import of the module in a fresh sandbox, closure included:
	// its time and the memory it adds to a checkpoint image.
	ImportMs float64 `json:"import_ms"`
	MiB      float64 `json:"mib"`
	// OwnMs and OwnMiB are the same figures with the rest of its closure already imported:
	// what the module adds by itself. The cost model sums these.
	OwnMs  float64 `json:"own_ms"`
	OwnMiB float64 `json:"own_mib"`
	// Closure is the modules importing it leaves loaded (top-level modules outside the
	// standard library, and other analysed modules), itself included.
	Closure []string `json:"closure"`
	// Packages are the distributions that provide it (its top-level package), PEP 503
	// normalized name to version; none for the standard library and the image's loose modules.
	Packages map[string]string `json:"packages,omitempty"`
}

// Validate checks the figures (finite, >= 0) and the closure's names.
func (m Module) Validate() error {
	var problems []error
	for _, f := range []struct {
		name string
		v    float64
	}{{"import_ms", m.ImportMs}, {"mib", m.MiB}, {"own_ms", m.OwnMs}, {"own_mib", m.OwnMiB}} {
		if !finiteNonNegative(f.v) {
			problems = append(problems, fmt.Errorf("%s %v: want a finite number >= 0", f.name, f.v))
		}
	}
	for _, c := range m.Closure {
		if !IsModuleName(c) {
			problems = append(problems, fmt.Errorf("closure: %q is not a dotted Python module name", c))
		}
	}
	if !m.Available && len(m.Closure) > 0 {
		problems = append(problems, errors.New("unavailable but has a closure"))
	}
	if err := CheckPackages(m.Packages); err != nil {
		problems = append(problems, fmt.Errorf("packages: %w", err))
	}
	return errors.Join(problems...)
}

func finiteNonNegative(v float64) bool { return v >= 0 && !math.IsInf(v, 1) }

// IsModuleName reports whether s is a dotted Python module name of ASCII identifiers, such as
// matplotlib.pyplot.
func IsModuleName(s string) bool {
	if s == "" {
		return false
	}
	for part := range strings.SplitSeq(s, ".") {
		if part == "" || part[0] >= '0' && part[0] <= '9' {
			return false
		}
		for i := 0; i < len(part); i++ {
			c := part[i]
			if !(c == '_' || c >= 'a' && c <= 'z' || c >= 'A' && c <= 'Z' || c >= '0' && c <= '9') {
				return false
			}
		}
	}
	return true
}

// CheckModules checks analysed modules, keyed by name: each name a dotted module name, each
// module valid (Module.Validate). NewRouter and the planner check them so; a closure member
// that is not an available module of the map is a problem they find as they compile them.
func CheckModules(modules map[string]Module) error {
	var problems []error
	for _, name := range slices.Sorted(maps.Keys(modules)) {
		if !IsModuleName(name) {
			problems = append(problems, fmt.Errorf("module %q: not a dotted Python module name", name))
		} else if err := modules[name].Validate(); err != nil {
			problems = append(problems, fmt.Errorf("module %s: %w", name, err))
		}
	}
	return errors.Join(problems...)
}

// index checks modules and model and compiles them for pricing.
func index(modules map[string]Module, model CostModel) (*cost.Index, error) {
	if err := errors.Join(model.Validate(), CheckModules(modules)); err != nil {
		return nil, err
	}
	in := make(map[string]cost.Module, len(modules))
	for name, m := range modules {
		in[name] = cost.Module{Available: m.Available, OwnMs: m.OwnMs, OwnMiB: m.OwnMiB, Closure: m.Closure}
	}
	return cost.NewIndex(in, model.figures())
}

// figures returns what pricing needs of m.
func (m CostModel) figures() cost.Model {
	return cost.Model{InterceptMs: m.InterceptMs, AlphaMsPerMiB: m.AlphaMsPerMiB, ColdStartMs: m.ColdStartMs, EmptyMiB: m.EmptyMiB}
}
