// Package analysis holds analysis.json: per name of a corpus (and per module a closure names),
// the module it resolves to in the image, whether that imports, and what importing it costs
// (time, memory) and leaves loaded (its closure). The analyze stage measures these in sandboxes
// of the image; the planner and the catalogue read them.
package analysis

import (
	"errors"
	"fmt"
	"maps"
	"math"
	"slices"
	"strings"

	"readie.dev/pipeline/pkg/atomicfile"
	"readie.dev/pipeline/pkg/catalogue"
	"readie.dev/pipeline/pkg/jsonfile"
)

// FileName is the analysis's name in an output directory.
const FileName = "analysis.json"

// Version is the version of analysis.json this package writes. Version 2 added packages (the
// image's distributions, and each module's), version 3 the host's pooled line (host.pooled),
// version 4 its memory line (host.memory); versions 1 to 3 are read too.
const Version = 4

// ErrInvalid wraps every problem of an analysis.
var ErrInvalid = errors.New("invalid analysis")

// File is analysis.json.
type File struct {
	Version int `json:"version"`
	// Image identifies what was measured, as the analyze stage's cache key does.
	Image Provenance `json:"image"`
	// Stdlib is the image python's sys.stdlib_module_names: closures leave these out.
	Stdlib []string `json:"stdlib"`
	// Names holds an entry per name of the corpus and per module that a closure names.
	Names map[string]Entry `json:"names"`
	// Host holds what was measured of this host besides the modules (absent in analyses
	// written before it was measured).
	Host *HostCosts `json:"host,omitempty"`
	// Packages are the image's distributions, PEP 503 normalized name to version, from its
	// own metadata (importlib.metadata in a sandbox of the image); absent in version 1.
	Packages map[string]string `json:"packages,omitempty"`
}

// HostCosts is what the analysis measured of the host and the image besides the modules: the
// cost model's constants, for planning when no output's manifest gives the restore line.
type HostCosts struct {
	// CPU names the machine the times were measured on (model and count).
	CPU string `json:"cpu"`
	// ColdStartMs is a cold start of the bare executor, from `runsc create` to the answer of a
	// call that imports nothing (median of Image.Runs fresh sandboxes).
	ColdStartMs float64 `json:"cold_start_ms"`
	// EmptyMiB is the image of the empty checkpoint (its files together).
	EmptyMiB float64 `json:"empty_mib"`
	// InterceptMs and AlphaMsPerMiB are the restore line fitted to measure-mode restore medians
	// of RestoreSets checkpoints of different sizes, with its RSquared.
	InterceptMs   float64  `json:"intercept_ms"`
	AlphaMsPerMiB float64  `json:"alpha_ms_per_mib"`
	RestoreSets   []string `json:"restore_sets"`
	RSquared      float64  `json:"r_squared"`
	// Pooled is the line of a start in a sandbox created ahead, `runsc create` off the clock:
	// restores of the same RestoreSets checkpoints and cold starts, each from `runsc restore`
	// (or `runsc start`) to the answer of a call that imports nothing (medians of restore_runs),
	// and PooledRSquared its fit. Zero in analyses written before it was measured.
	Pooled         catalogue.PooledLine `json:"pooled,omitzero"`
	PooledRSquared float64              `json:"pooled_r_squared,omitempty"`
	// Memory is the line of own memory (launch.Memory.Own, restored and idle) against image
	// size: medians over the pooled line's restores of the same RestoreSets checkpoints, and
	// MemoryRSquared its fit. Zero in analyses written before it was measured.
	Memory         catalogue.MemoryLine `json:"memory,omitzero"`
	MemoryRSquared float64              `json:"memory_r_squared,omitempty"`
}

// Provenance is what the figures were measured on: the rootfs, the runsc and the spec.
type Provenance struct {
	RootfsDigest string `json:"rootfs_digest"`
	Runsc        string `json:"runsc"`
	SpecDigest   string `json:"spec_digest"`
	// Runs is how many fresh sandboxes each import time is the median of.
	Runs int `json:"runs"`
}

// Entry is what a name resolves to and what its module costs. Names that resolve to the same
// module carry the same figures.
type Entry struct {
	// Module is the longest prefix of the name that is a module in the image (the name itself
	// for a module); when no prefix is, the name's top-level package.
	Module string `json:"module"`
	// Available is whether Module imports in the image. An unavailable module has zero figures
	// and no closure, is reported and never planned; Error says why.
	Available bool   `json:"available"`
	Error     string `json:"error,omitempty"`
	// ImportMs is the median cold import time in a fresh sandbox, closure included; MiB the
	// memory the import adds to a checkpoint image.
	ImportMs float64 `json:"import_ms"`
	MiB      float64 `json:"mib"`
	// Closure is what the import leaves loaded: the top-level modules outside the standard
	// library, and any other module of this analysis, found in sys.modules after it; the module
	// itself included; sorted.
	Closure []string `json:"closure"`
	// OwnMs and OwnMiB are the import's time and memory with the rest of its closure imported
	// first: what the module adds by itself. The cost model sums these over the modules a start
	// lacks (see pkg/catalogue), so a module shared by two closures is paid once.
	OwnMs  float64 `json:"own_ms"`
	OwnMiB float64 `json:"own_mib"`
	// Packages are the distributions that provide Module's top-level package
	// (importlib.metadata.packages_distributions), name to version: none for the standard
	// library and modules no distribution declares.
	Packages map[string]string `json:"packages,omitempty"`
}

// module returns the catalogue's view of an entry.
func (e Entry) module() catalogue.Module {
	return catalogue.Module{Available: e.Available, ImportMs: e.ImportMs, MiB: e.MiB, OwnMs: e.OwnMs, OwnMiB: e.OwnMiB, Closure: e.Closure, Packages: e.Packages}
}

// Modules returns the analysed modules, one per distinct Module of the entries.
func (f *File) Modules() map[string]catalogue.Module {
	out := map[string]catalogue.Module{}
	for _, e := range f.Names {
		out[e.Module] = e.module()
	}
	return out
}

// Validate checks the analysis: names and modules are dotted names, a module is a prefix of its
// name, the entries of one module agree, every closure member is an available module of an
// entry, closures are sorted and hold their module, figures are finite and >= 0.
func (f *File) Validate() error {
	var problems []error
	add := func(format string, args ...any) { problems = append(problems, fmt.Errorf(format, args...)) }
	if f.Version < 1 || f.Version > Version {
		add("version %d: this reader knows 1 to %d", f.Version, Version)
	}
	if err := catalogue.CheckPackages(f.Packages); err != nil {
		add("packages: %w", err)
	}
	for _, s := range f.Stdlib {
		if !catalogue.IsModuleName(s) {
			add("stdlib: %q is not a module name", s)
		}
	}
	available := map[string]bool{}
	for _, e := range f.Names {
		if e.Available {
			available[e.Module] = true
		}
	}
	byModule := map[string]string{} // module -> the first name seen with it
	for _, n := range slices.Sorted(maps.Keys(f.Names)) {
		e := f.Names[n]
		if err := e.checkName(n); err != nil {
			problems = append(problems, err)
			continue
		}
		if first, ok := byModule[e.Module]; ok {
			if !sameFigures(e, f.Names[first]) {
				add("%s and %s resolve to %s with different figures", first, n, e.Module)
			}
		} else {
			byModule[e.Module] = n
		}
		problems = append(problems, e.check(n, available)...)
	}
	if h := f.Host; h != nil {
		if err := h.check(); err != nil {
			problems = append(problems, err)
		}
	}
	if len(problems) > 0 {
		return fmt.Errorf("%w: %w", ErrInvalid, errors.Join(problems...))
	}
	return nil
}

// checkName checks that the name n and the entry's module are dotted Python names, the module
// a prefix of the name.
func (e Entry) checkName(n string) error {
	switch {
	case !catalogue.IsModuleName(n):
		return fmt.Errorf("%q is not a dotted Python name", n)
	case e.Module != n && !strings.HasPrefix(n, e.Module+"."):
		return fmt.Errorf("%s: module %q is not a prefix of the name", n, e.Module)
	case !catalogue.IsModuleName(e.Module):
		return fmt.Errorf("%s: module %q is not a dotted Python name", n, e.Module)
	}
	return nil
}

// check checks the figures of the entry of name n and, when it is available, its closure: the
// module itself, sorted, without duplicates, of available modules only.
func (e Entry) check(n string, available map[string]bool) []error {
	var problems []error
	add := func(format string, args ...any) { problems = append(problems, fmt.Errorf(format, args...)) }
	if err := e.module().Validate(); err != nil {
		add("%s: %w", n, err)
	}
	if !e.Available {
		return problems
	}
	if !slices.Contains(e.Closure, e.Module) {
		add("%s: closure %v lacks the module %s", n, e.Closure, e.Module)
	}
	if !slices.IsSorted(e.Closure) || len(slices.Compact(slices.Clone(e.Closure))) != len(e.Closure) {
		add("%s: closure %v is not sorted and without duplicates", n, e.Closure)
	}
	for _, c := range e.Closure {
		if !available[c] {
			add("%s: closure member %s is not an available module of the analysis", n, c)
		}
	}
	return problems
}

// check wants the host's figures finite and not negative.
func (h *HostCosts) check() error {
	for _, v := range []float64{h.ColdStartMs, h.EmptyMiB, h.InterceptMs, h.AlphaMsPerMiB, h.Pooled.InterceptMs, h.Pooled.AlphaMsPerMiB, h.Pooled.ColdStartMs, float64(h.Memory.InterceptBytes), h.Memory.BytesPerMiB} {
		if !(v >= 0) || math.IsInf(v, 1) {
			return fmt.Errorf("host: %v: want finite figures >= 0", *h)
		}
	}
	return nil
}

func sameFigures(a, b Entry) bool {
	return a.Available == b.Available && a.ImportMs == b.ImportMs && a.MiB == b.MiB &&
		a.OwnMs == b.OwnMs && a.OwnMiB == b.OwnMiB && slices.Equal(a.Closure, b.Closure) && maps.Equal(a.Packages, b.Packages)
}

// Parse reads and validates an analysis.
func Parse(data []byte) (*File, error) {
	var f File
	if err := jsonfile.Decode(data, &f, "analysis"); err != nil {
		return nil, fmt.Errorf("%w: %w", ErrInvalid, err)
	}
	if err := f.Validate(); err != nil {
		return nil, err
	}
	return &f, nil
}

// Load reads and validates the analysis at path.
func Load(path string) (*File, error) {
	data, err := jsonfile.Read(path)
	if err != nil {
		return nil, err
	}
	f, err := Parse(data)
	if err != nil {
		return nil, fmt.Errorf("%s: %w", path, err)
	}
	return f, nil
}

// Save validates f and writes it to path atomically; an invalid analysis writes nothing.
func (f *File) Save(path string) error {
	if err := f.Validate(); err != nil {
		return err
	}
	return atomicfile.WriteJSON(path, f)
}

// Closure returns the closure of module from what importing it added to sys.modules (added, the
// names after the import that were not there before): the top-level packages of added names
// outside stdlib, the added names that are analysed modules (analysed), and module itself.
// Dunder names and names that are not dotted identifiers are left out. Sorted, each once.
func Closure(module string, added []string, stdlib, analysed map[string]bool) []string {
	set := map[string]bool{module: true}
	for _, name := range added {
		if !catalogue.IsModuleName(name) || strings.HasPrefix(name, "__") {
			continue
		}
		top, _, _ := strings.Cut(name, ".")
		if !stdlib[top] {
			set[top] = true
		}
		if analysed[name] {
			set[name] = true
		}
	}
	out := make([]string, 0, len(set))
	for name := range set {
		out = append(out, name)
	}
	slices.Sort(out)
	return out
}
