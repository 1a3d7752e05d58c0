// Package catalogue holds catalogue.json, what a pipeline output publishes for routers: its
// checkpoints (imports, closure, image size, measured restore time), the analysed modules
// (import time, memory, closure) and the cost model; and Select, which picks for a request the
// checkpoint, or a cold start, with the lowest predicted start cost, never a checkpoint whose
// loaded distributions do not satisfy the request's package requirements (SelectFor). A
// catalogue without measured prices (an output captured without analyze: no cold start time)
// is routed by image size instead: the smallest checkpoint that holds what some checkpoint
// holds of the request, else a cold start. The planner (package catalogue/plan) prices with the same rule (package
// catalogue/internal/cost), so a plan and a router agree on what a request costs.
package catalogue

import (
	"cmp"
	"encoding/json"
	"errors"
	"fmt"
	"maps"
	"math"
	"slices"
	"strings"
	"unicode"
	"unicode/utf8"

	"readie.dev/pipeline/pkg/catalogue/internal/cost"
	"readie.dev/pipeline/pkg/checkpointid"
	"readie.dev/pipeline/pkg/jsonfile"
	"readie.dev/pipeline/pkg/limitread"
	"readie.dev/pipeline/pkg/pyreq"
)

// FileName is the catalogue's name in an output directory.
const FileName = "catalogue.json"

// Version is the version of catalogue.json this package writes. Version 2 added packages (the
// image's, each checkpoint's and each module's distributions), version 3 the cost model's
// pooled line (cost_model.pooled), version 4 the checkpoints' unmapped_modules, version 5 their
// resident_bytes, version 6 their own_bytes, version 7 the cost model's memory line
// (cost_model.memory): an older reader refuses the new keys, so it is told the version instead.
// Versions 1 to 6 are read too.
const Version = 7

// VersionFor returns the lowest version that holds c: 7 with a memory line, 6 with a
// checkpoint's own memory, 5 with its resident memory, 4 with a checkpoint's unmapped modules,
// 3 with a pooled line, else 2, so that a catalogue without them stays readable by a kit that
// reads an older version (it refuses any higher version).
func VersionFor(c *Catalogue) int {
	if c.CostModel.Memory.Measured() {
		return 7
	}
	for _, cp := range c.Checkpoints {
		if cp.OwnBytes > 0 {
			return 6
		}
	}
	for _, cp := range c.Checkpoints {
		if cp.ResidentBytes > 0 {
			return 5
		}
	}
	for _, cp := range c.Checkpoints {
		if len(cp.UnmappedModules) > 0 {
			return 4
		}
	}
	if c.CostModel.Pooled.Measured() {
		return 3
	}
	return 2
}

// ErrInvalid wraps every problem of a catalogue.
var ErrInvalid = errors.New("invalid catalogue")

// Catalogue is catalogue.json.
type Catalogue struct {
	Version     int               `json:"version"`
	CostModel   CostModel         `json:"cost_model"`
	Checkpoints []Checkpoint      `json:"checkpoints"`
	Modules     map[string]Module `json:"modules"`
	// Packages are the image's distributions, PEP 503 normalized name to version, as analyze
	// found them in the image (absent without an analysis that recorded them).
	Packages map[string]string `json:"packages,omitempty"`
	// Prediction compares the predicted image sizes of planned checkpoints with their real
	// ones (absent when no checkpoint was planned).
	Prediction *Prediction `json:"prediction,omitempty"`
}

// Prediction is how far the plan's predicted image sizes were from the captured ones.
type Prediction struct {
	// Sets is the number of checkpoints with a prediction.
	Sets int `json:"sets"`
	// MeanAbsErrorMiB and MeanAbsErrorPct are the mean of |real - predicted|, in MiB and in
	// percent of the real size.
	MeanAbsErrorMiB float64 `json:"mean_abs_error_mib"`
	MeanAbsErrorPct float64 `json:"mean_abs_error_pct"`
}

// Checkpoint is one captured package set.
type Checkpoint struct {
	ID      string   `json:"id"`
	Imports []string `json:"imports"`
	// Closure is every analysed module the checkpoint holds loaded. An import that is not an
	// analysed module is held too, but not priced: no request resolves to it.
	Closure []string `json:"closure"`
	// ImageMiB is the measured size of its image (its files together, as meta.json records
	// them); PredictedMiB what the cost model predicted before the capture (0: not planned).
	ImageMiB     float64 `json:"image_mib"`
	PredictedMiB float64 `json:"predicted_mib,omitempty"`
	// RestoreMedianMs is the median of its timed restores (0: not measured).
	RestoreMedianMs float64 `json:"restore_median_ms"`
	// Packages are the distributions its closure loaded, PEP 503 normalized name to version
	// (2.2.3+dfsg), as the executor found them after its imports. A request that needs
	// another version of one of them is never sent to it: a loaded module cannot be replaced.
	Packages map[string]string `json:"packages,omitempty"`
	// UnmappedModules are the top-level modules it holds loaded that no distribution's
	// metadata names: their versions are unknown, and no requirement rules it out for them.
	UnmappedModules []string `json:"unmapped_modules,omitempty"`
	// ResidentBytes is the memory a sandbox of it holds restored and idle, as the capture's
	// smoke test measured it (Pss; 0: not measured), and OwnBytes the part of it no other
	// sandbox shares: what each warm sandbox of it pins (SizeWarm). The rest is files mapped
	// (runsc's text, the image's libraries): page cache the host's sandboxes share.
	ResidentBytes int64 `json:"resident_bytes,omitempty"`
	OwnBytes      int64 `json:"own_bytes,omitempty"`
}

// RestoreMs returns the price of restoring c: its measured median when there is one, otherwise the
// cost model on its measured image size.
func (c Checkpoint) RestoreMs(m CostModel) float64 {
	if c.RestoreMedianMs > 0 {
		return c.RestoreMedianMs
	}
	return m.RestoreMs(c.ImageMiB)
}

// unpriced says why c's cost model cannot price starts, or "" when it can: it needs a measured
// cold start (a measured one is never 0 ms) and a restore time for every checkpoint (its
// median, or the restore line on its size). Without them a cold start, or a checkpoint, would
// look free and win every request.
func (c *Catalogue) unpriced() string {
	if c.CostModel.ColdStartMs <= 0 {
		return "no cold start time"
	}
	var none []string
	for _, cp := range c.Checkpoints {
		if cp.RestoreMs(c.CostModel) <= 0 {
			none = append(none, cp.ID)
		}
	}
	if len(none) > 0 {
		return "no restore time for " + strings.Join(none, ", ")
	}
	return ""
}

// Validate checks the catalogue as NewRouter does; write a catalogue only when it passes.
func (c *Catalogue) Validate() error {
	_, err := NewRouter(c)
	return err
}

// Closures returns, for each list of imports, the analysed modules importing them leaves
// loaded: the union of their closures, made transitive, sorted. An import that is not an
// available module of modules is left out. It fails when modules do not compile (names,
// figures, closure members).
func Closures(modules map[string]Module, imports ...[]string) ([][]string, error) {
	x, err := index(modules, CostModel{})
	if err != nil {
		return nil, err
	}
	out := make([][]string, len(imports))
	for i, list := range imports {
		loaded := x.NewSet()
		for _, imp := range list {
			if j, ok := x.Position(imp); ok {
				loaded.Or(x.Closure(j))
			}
		}
		out[i] = x.Names(loaded)
	}
	return out, nil
}

// Parse reads and validates a catalogue.
func Parse(data []byte) (*Catalogue, error) {
	// The version first, leniently: a newer catalogue is refused for its version, not for the
	// first field it added.
	var v struct {
		Version int `json:"version"`
	}
	if err := json.Unmarshal(data, &v); err == nil && v.Version > Version {
		return nil, checkVersion(v.Version)
	}
	var c Catalogue
	if err := jsonfile.Decode(data, &c, "catalogue"); err != nil {
		return nil, fmt.Errorf("%w: %w", ErrInvalid, err)
	}
	if _, err := NewRouter(&c); err != nil {
		return nil, err
	}
	return &c, nil
}

// checkVersion refuses a catalogue version this package does not read.
func checkVersion(v int) error {
	if v < 1 || v > Version {
		return fmt.Errorf("%w: version %d: this reader knows 1 to %d", ErrInvalid, v, Version)
	}
	return nil
}

// Load reads and validates the catalogue at path.
func Load(path string) (*Catalogue, error) {
	data, err := limitread.OutputFile(path)
	if err != nil {
		return nil, err
	}
	c, err := Parse(data)
	if err != nil {
		return nil, fmt.Errorf("%s: %w", path, err)
	}
	return c, nil
}

// Router picks checkpoints for requests from one catalogue. It is safe for concurrent use.
type Router struct {
	index   *cost.Index
	pricer  *cost.Pricer
	options []cost.Option
	// ids and images name options[i] (the last option is the cold start: id ""); packages are
	// what each has loaded (none for the cold start); pooled is each one's fixed cost in a
	// sandbox created ahead (nil: the cost model has no pooled line).
	ids      []string
	pooled   []float64
	images   []float64
	packages []map[string]string
	// image are the image's distributions (nil: unknown).
	image map[string]string
	// basis is how the router chooses; unpriced says why the catalogue has no prices (when
	// basis is BasisImageSize).
	basis    Basis
	unpriced string
	// holds are the modules each option holds by name, its imports and closure (none for the
	// cold start), held every module some checkpoint holds, and heldDists every distribution
	// some checkpoint holds loaded: a choice by image size.
	holds     []map[string]bool
	held      map[string]bool
	heldDists map[string]bool
}

// NewRouter validates c and compiles it for Select.
func NewRouter(c *Catalogue) (*Router, error) {
	if err := checkVersion(c.Version); err != nil {
		return nil, err
	}
	x, err := index(c.Modules, c.CostModel)
	if err != nil {
		return nil, fmt.Errorf("%w: %w", ErrInvalid, err)
	}
	var problems []error
	seen := map[string]bool{}
	order := make([]int, 0, len(c.Checkpoints))
	loaded := make([]cost.Set, len(c.Checkpoints))
	for i, cp := range c.Checkpoints {
		where := fmt.Sprintf("checkpoints[%d] %q", i, cp.ID)
		if err := checkpointid.Check(cp.ID); err != nil {
			problems = append(problems, fmt.Errorf("%s: id: %w", where, err))
		} else if seen[cp.ID] {
			problems = append(problems, fmt.Errorf("%s: duplicate id", where))
		}
		seen[cp.ID] = true
		if !finiteNonNegative(cp.ImageMiB) || !finiteNonNegative(cp.PredictedMiB) || !finiteNonNegative(cp.RestoreMedianMs) {
			problems = append(problems, fmt.Errorf("%s: image_mib, predicted_mib and restore_median_ms must be finite numbers >= 0", where))
		}
		if cp.ResidentBytes < 0 || cp.OwnBytes < 0 || cp.OwnBytes > cp.ResidentBytes {
			problems = append(problems, fmt.Errorf("%s: resident_bytes %d and own_bytes %d must be >= 0, own_bytes a part of resident_bytes", where, cp.ResidentBytes, cp.OwnBytes))
		}
		if err := CheckPackages(cp.Packages); err != nil {
			problems = append(problems, fmt.Errorf("%s: packages: %w", where, err))
		}
		if err := CheckUnmapped(cp.UnmappedModules); err != nil {
			problems = append(problems, fmt.Errorf("%s: unmapped_modules: %w", where, err))
		}
		var errs []error
		loaded[i], errs = cp.loaded(x, where)
		problems = append(problems, errs...)
		order = append(order, i)
	}
	if err := CheckPackages(c.Packages); err != nil {
		problems = append(problems, fmt.Errorf("packages: %w", err))
	}
	if len(problems) > 0 {
		return nil, fmt.Errorf("%w: %w", ErrInvalid, errors.Join(problems...))
	}
	// Ties go to the smaller image, then to the lower id; a cold start loses every tie.
	slices.SortFunc(order, func(a, b int) int {
		ca, cb := c.Checkpoints[a], c.Checkpoints[b]
		if ca.ImageMiB != cb.ImageMiB {
			if ca.ImageMiB < cb.ImageMiB {
				return -1
			}
			return 1
		}
		return strings.Compare(ca.ID, cb.ID)
	})
	r := &Router{index: x, pricer: x.Pricer(), image: c.Packages, basis: BasisCostModel, unpriced: c.unpriced(), held: map[string]bool{}, heldDists: map[string]bool{}}
	if r.unpriced != "" {
		r.basis = BasisImageSize
	}
	for _, i := range order {
		cp := c.Checkpoints[i]
		holds := map[string]bool{}
		for _, m := range slices.Concat(cp.Imports, cp.Closure) {
			holds[m], r.held[m] = true, true
		}
		for d := range cp.Packages {
			r.heldDists[d] = true
		}
		r.holds = append(r.holds, holds)
		r.options = append(r.options, cost.Option{FixedMs: cp.RestoreMs(c.CostModel), Loaded: loaded[i]})
		r.ids = append(r.ids, cp.ID)
		r.images = append(r.images, cp.ImageMiB)
		r.packages = append(r.packages, cp.Packages)
		if pl := c.CostModel.Pooled; pl.Measured() {
			r.pooled = append(r.pooled, pl.RestoreMs(cp.ImageMiB))
		}
	}
	r.options = append(r.options, r.pricer.ColdOption())
	r.ids = append(r.ids, "")
	r.images = append(r.images, 0)
	r.packages = append(r.packages, nil)
	r.holds = append(r.holds, nil)
	if pl := c.CostModel.Pooled; pl.Measured() {
		r.pooled = append(r.pooled, pl.ColdStartMs)
	}
	return r, nil
}

// CheckPackages checks a map of distributions to versions: each name PEP 503 normalized
// (pyreq.NormalizeName), each version a non-empty string of at most 256 bytes of printable
// characters other than white space (a version need not be PEP 440: it is what the image's
// metadata says, and select prints it to a terminal).
func CheckPackages(packages map[string]string) error {
	var problems []error
	for _, name := range slices.Sorted(maps.Keys(packages)) {
		v := packages[name]
		if !pyreq.IsName(name) || pyreq.NormalizeName(name) != name {
			problems = append(problems, fmt.Errorf("%.100q is not a normalized distribution name (%.100q)", name, pyreq.NormalizeName(name)))
		}
		if !printable(v) {
			problems = append(problems, fmt.Errorf("%.100q: version %.100q: want a non-empty string of printable characters without white space", name, v))
		}
	}
	return firstProblems(problems)
}

// MaxUnmapped bounds how many unmapped modules a checkpoint may name: each is warned of at
// capture and carried into every catalogue a worker loads.
const MaxUnmapped = 1024

// maxProblems is how many problems of a list an error names; the image's metadata or Python
// may give millions.
const maxProblems = 10

// firstProblems joins the first maxProblems of problems and counts the rest.
func firstProblems(problems []error) error {
	if len(problems) <= maxProblems {
		return errors.Join(problems...)
	}
	return errors.Join(append(slices.Clip(problems[:maxProblems]), fmt.Errorf("and %d more", len(problems)-maxProblems))...)
}

// CheckUnmapped checks a checkpoint's unmapped modules: at most MaxUnmapped top-level module
// names as the image's Python has them (printable, without white space or dots, at most 256
// bytes), each once.
func CheckUnmapped(modules []string) error {
	if len(modules) > MaxUnmapped {
		return fmt.Errorf("%d modules: at most %d", len(modules), MaxUnmapped)
	}
	var problems []error
	seen := map[string]bool{}
	for _, m := range modules {
		switch {
		case !printable(m) || strings.Contains(m, "."):
			problems = append(problems, fmt.Errorf("%.100q: want a top-level module name: printable characters without white space or dots", m))
		case seen[m]:
			problems = append(problems, fmt.Errorf("%q is named twice", m))
		}
		seen[m] = true
	}
	return firstProblems(problems)
}

// printable says whether s is a non-empty string of at most 256 bytes of printable characters
// other than white space: what the image's metadata or Python may give that select prints to
// a terminal.
func printable(s string) bool {
	return s != "" && len(s) <= 256 && utf8.ValidString(s) && !strings.ContainsFunc(s, func(r rune) bool { return unicode.IsSpace(r) || !unicode.IsGraphic(r) })
}

// loaded returns what the checkpoint holds loaded, of the index's modules: the closures of its
// imports and closure. An import the analysis lacks is held but not priced; a module that does
// not import in the image, or a closure member the index lacks, is a problem, named with where.
func (cp Checkpoint) loaded(x *cost.Index, where string) (cost.Set, []error) {
	var problems []error
	s := x.NewSet()
	for i, m := range slices.Concat(cp.Imports, cp.Closure) {
		j, ok := x.Position(m)
		switch {
		case ok:
			s.Or(x.Closure(j))
		case i < len(cp.Imports) && IsModuleName(m) && !x.Unavailable(m):
			// Captured without an analysis of it: held, not priced.
		case x.Unavailable(m):
			problems = append(problems, fmt.Errorf("%s: %q does not import in the image (the analysis says so), yet the checkpoint holds it", where, m))
		default:
			problems = append(problems, fmt.Errorf("%s: %q is not an available module of the catalogue", where, m))
		}
	}
	return s, problems
}

// Basis is how a choice was made.
type Basis string

const (
	// BasisCostModel: the option of lowest predicted start cost.
	BasisCostModel Basis = "cost model"
	// BasisImageSize: the catalogue has no measured prices (Choice.Why says what it lacks), so
	// the smallest checkpoint that holds every import of the request that some checkpoint
	// holds and meets its requirements, else a cold start (SelectFor).
	BasisImageSize Basis = "image size"
)

// MeasureHint says how to give a catalogue the prices it lacks.
const MeasureHint = "to price starts, run `pipeline analyze --corpus FILE` on this output, then capture it again"

// Choice is where a request should start.
type Choice struct {
	// Checkpoint is the id of the checkpoint to restore; empty for a cold start.
	Checkpoint string `json:"checkpoint,omitempty"`
	Cold       bool   `json:"cold"`
	// Basis says how the choice was made: by the cost model's prices, or by image size when the
	// catalogue has none. A choice by image size carries no price: PredictedMs, FixedMs,
	// ImportMs, ColdMs and PredictedPooledMs are 0 and absent from its JSON.
	Basis Basis `json:"basis"`
	// ImageMiB is the chosen checkpoint's image size (0 for a cold start).
	ImageMiB float64 `json:"image_mib,omitempty"`
	// PredictedMs is the predicted start cost: FixedMs (the restore, or the cold start) plus
	// ImportMs (the modules in Import, which the start lacks; absent when that is nothing).
	PredictedMs float64  `json:"predicted_ms,omitempty"`
	FixedMs     float64  `json:"fixed_ms,omitempty"`
	ImportMs    float64  `json:"import_ms,omitempty"`
	Import      []string `json:"import"`
	// ColdMs is the predicted cost of a cold start, for comparison.
	ColdMs float64 `json:"cold_ms,omitempty"`
	// PredictedPooledMs is the same start in a sandbox created ahead (a pool's), priced by the
	// cost model's pooled line: its restore (or cold start) plus the same ImportMs; 0 when the
	// catalogue has no pooled line.
	PredictedPooledMs float64 `json:"predicted_pooled_ms,omitempty"`
	// PredictedWarmMs is the choice's start from a sandbox of its checkpoint restored ahead (a
	// warm pool's, launch.RestoreOptions.Warm): the restore is done, what is left is ImportMs
	// (absent for a cold start, never kept warm, and by image size). The take and the call
	// themselves, a few milliseconds, are not priced.
	PredictedWarmMs float64 `json:"predicted_warm_ms,omitempty"`
	// Warm are the other checkpoints whose sandbox restored ahead would start the request
	// faster than the choice started without one (PredictedMs), each priced as
	// PredictedWarmMs is, cheapest first: a worker passes them, after the choice, as
	// launch.RestoreOptions.Also (empty by image size).
	Warm []WarmOption `json:"warm,omitempty"`
	// Modules are the request's names resolved to analysed modules; Unknown are names no
	// analysed module is a prefix of, Unavailable modules that do not import in the image.
	// Neither is priced (no option holds them, so they cost every option the same).
	Modules     []string `json:"modules"`
	Unknown     []string `json:"unknown,omitempty"`
	Unavailable []string `json:"unavailable,omitempty"`
	// PassedOver are the checkpoints never considered because a distribution they hold loaded
	// does not satisfy one of the request's packages, each with why.
	PassedOver []PassedOver `json:"passed_over,omitempty"`
	// ImageLacks are the request's packages the image itself does not satisfy (as analyze
	// found its distributions), each with why: the worker must install them, or the request
	// fails. A package a checkpoint does not hold loaded costs nothing either way.
	ImageLacks []string `json:"image_lacks,omitempty"`
	Why        string   `json:"why"`
}

// WarmOption is a checkpoint whose warm sandbox serves a request, and its price from one.
type WarmOption struct {
	Checkpoint  string  `json:"checkpoint"`
	PredictedMs float64 `json:"predicted_ms"`
}

// PassedOver is a checkpoint that a request's packages rule out.
type PassedOver struct {
	Checkpoint string `json:"checkpoint"`
	Why        string `json:"why"`
}

// Basis returns how the router chooses: BasisImageSize when its catalogue has no measured
// prices, else BasisCostModel.
func (r *Router) Basis() Basis { return r.basis }

// Unpriced says what the catalogue lacks to price starts ("no cold start time", "no restore
// time for X"), or "" when the router chooses by the cost model.
func (r *Router) Unpriced() string { return r.unpriced }

// Select chooses where to start a request that imports names (modules, or names imported from
// modules, as written in code): the option of lowest Cost among the catalogue's checkpoints and a
// cold start. Ties go to the smaller image, then the lower id; cold loses ties. A catalogue
// without measured prices chooses by image size instead (SelectFor).
func (r *Router) Select(names []string) Choice { return r.SelectFor(names, nil) }

// SelectFor selects as Select does, for a request that also needs packages: a checkpoint that
// holds loaded a distribution whose version does not satisfy one of them is passed over (Choice.PassedOver
// says why), since a loaded module cannot be replaced; one that does not load it is as good as
// without the requirement (the worker installs it before the call). The cold start is never
// ruled out. A requirement the image itself does not satisfy is reported in ImageLacks.
//
// On a catalogue without measured prices (Router.Basis is BasisImageSize) it chooses the
// smallest checkpoint not passed over that holds every name some checkpoint holds (its longest
// dotted prefix that a checkpoint imports or holds in its closure, or its top-level module when
// a checkpoint holds loaded the distribution of that normalized name), else a cold start, and
// prices nothing. Names no checkpoint holds are imported after the start either way and do not
// decide; a request that names only such names starts cold.
func (r *Router) SelectFor(names []string, packages []pyreq.Requirement) Choice {
	ch, need := r.resolve(names)
	ch.Basis = r.basis
	ruledOut := r.passOver(&ch, packages)
	if r.basis == BasisImageSize {
		r.bySize(&ch, names, ruledOut, need)
		return ch
	}
	p := r.pricer
	// The cheapest option not ruled out; ties to the earliest, as Pricer.Best.
	best, bestMs := -1, math.Inf(1)
	for i, o := range r.options {
		if ms := p.Cost(o, need); !ruledOut[i] && ms < bestMs {
			best, bestMs = i, ms
		}
	}
	if best < 0 {
		// Every cost overflowed to +Inf (figures near the float64 limit): start cold.
		best, bestMs = len(r.options)-1, p.Cost(r.options[len(r.options)-1], need)
	}
	o := r.options[best]
	r.chose(&ch, best, need)
	ch.PredictedMs = bestMs
	ch.FixedMs = o.FixedMs
	ch.ImportMs = bestMs - o.FixedMs
	if r.pooled != nil {
		ch.PredictedPooledMs = r.pooled[best] + ch.ImportMs
	}
	cold := r.options[len(r.options)-1]
	ch.ColdMs = p.Cost(cold, need)
	if !ch.Cold {
		ch.PredictedWarmMs = ch.ImportMs
	}
	for i, opt := range r.options[:len(r.options)-1] { // the cold start is never warm
		if warmMs := p.Cost(opt, need) - opt.FixedMs; i != best && !ruledOut[i] && warmMs < bestMs {
			ch.Warm = append(ch.Warm, WarmOption{Checkpoint: r.ids[i], PredictedMs: warmMs})
		}
	}
	slices.SortStableFunc(ch.Warm, func(a, b WarmOption) int { return cmp.Compare(a.PredictedMs, b.PredictedMs) })

	// The runner-up, to say by how much the choice won.
	second, secondMs := -1, 0.0
	for i, opt := range r.options {
		if i == best || ruledOut[i] {
			continue
		}
		if ms := p.Cost(opt, need); second < 0 || ms < secondMs {
			second, secondMs = i, ms
		}
	}
	ch.Why = r.why(&ch, second, secondMs)
	return ch
}

// passOver rules out the options that hold loaded a distribution whose version does not
// satisfy one of packages, recording each in ch.PassedOver with why, and records in
// ch.ImageLacks the packages the image itself does not satisfy. It returns which options are
// ruled out.
func (r *Router) passOver(ch *Choice, packages []pyreq.Requirement) []bool {
	ruledOut := make([]bool, len(r.options))
	for i, held := range r.packages {
		var why []string
		for _, req := range packages {
			if v, ok := held[req.Key()]; ok && !req.Allows(v) {
				why = append(why, fmt.Sprintf("holds %s %s loaded, not %s", req.Key(), v, req))
			}
		}
		if len(why) > 0 {
			ruledOut[i] = true
			ch.PassedOver = append(ch.PassedOver, PassedOver{Checkpoint: r.ids[i], Why: strings.Join(why, "; ")})
		}
	}
	if r.image != nil {
		for _, req := range packages {
			switch v, ok := r.image[req.Key()]; {
			case !ok:
				ch.ImageLacks = append(ch.ImageLacks, fmt.Sprintf("%s: the image has no %s", req, req.Key()))
			case !req.Allows(v):
				ch.ImageLacks = append(ch.ImageLacks, fmt.Sprintf("%s: the image has %s %s", req, req.Key(), v))
			}
		}
	}
	return ruledOut
}

// chose records in ch the option best for a request that needs need: the checkpoint (or cold),
// its image size and the analysed modules it lacks.
func (r *Router) chose(ch *Choice, best int, need cost.Set) {
	ch.Checkpoint = r.ids[best]
	ch.Cold = ch.Checkpoint == ""
	ch.ImageMiB = r.images[best]
	missing := need.Clone()
	for w := range missing {
		missing[w] &^= r.options[best].Loaded[w]
	}
	ch.Import = r.index.Names(missing)
}

// bySize chooses for a catalogue without prices: the smallest option (options are in image size
// order, the cold start last) not ruled out that holds every one of names that some checkpoint
// holds, else the cold start. A name no checkpoint holds (json, re: what a request imports after
// a restore and after a cold start alike) does not count against any checkpoint; it is said in
// the why. A request all of whose names no checkpoint holds starts cold: nothing it imports
// would be loaded by a restore. need is what the request needs of the analysed modules.
func (r *Router) bySize(ch *Choice, names []string, ruledOut []bool, need cost.Set) {
	// Each name as the module a checkpoint holds it by; names no checkpoint holds.
	var wanted, nowhere []string
	for _, name := range names {
		switch m, ok := r.heldAs(name); {
		case !ok && !slices.Contains(nowhere, name):
			nowhere = append(nowhere, name)
		case ok && !slices.Contains(wanted, m):
			wanted = append(wanted, m)
		}
	}
	slices.Sort(wanted)
	slices.Sort(nowhere)
	cold := len(r.options) - 1
	var serving []int // the checkpoints that may serve the request, smallest first
	for i := range cold {
		if (len(wanted) > 0 || len(nowhere) == 0) && !ruledOut[i] && r.holdsAll(i, wanted) {
			serving = append(serving, i)
		}
	}
	best := cold
	if len(serving) > 0 {
		best = serving[0]
	}
	r.chose(ch, best, need)

	var why strings.Builder
	holding := " (the request imports nothing)"
	if len(wanted) > 0 {
		holding = " that holds " + strings.Join(wanted, ", ")
	}
	switch {
	case !ch.Cold:
		fmt.Fprintf(&why, "restore %s (%.1f MiB), the smallest checkpoint%s", ch.Checkpoint, ch.ImageMiB, holding)
	case len(wanted) == 0 && len(nowhere) > 0:
		fmt.Fprintf(&why, "cold start: no checkpoint holds %s", strings.Join(nowhere, ", "))
	case cold == 0:
		why.WriteString("cold start: the catalogue has no checkpoint")
	case r.anyHolds(wanted):
		fmt.Fprintf(&why, "cold start: every checkpoint%s is passed over", holding)
	default:
		fmt.Fprintf(&why, "cold start: no checkpoint holds all of %s", strings.Join(wanted, ", "))
	}
	if len(wanted) > 0 && len(nowhere) > 0 {
		fmt.Fprintf(&why, "; no checkpoint holds %s, imported after the start either way", strings.Join(nowhere, ", "))
	}
	if len(serving) > 1 {
		fmt.Fprintf(&why, "; next smallest %s (%.1f MiB)", r.ids[serving[1]], r.images[serving[1]])
	}
	r.notes(&why, ch, false)
	fmt.Fprintf(&why, "; chosen by image size for want of measured prices (the catalogue has %s): %s", r.unpriced, MeasureHint)
	ch.Why = why.String()
}

// heldAs returns the module by which some checkpoint holds name: its longest dotted prefix that
// a checkpoint imports or holds in its closure, else its top-level module when that module's
// name, PEP 503 normalized, is a distribution some checkpoint holds loaded (numpy for
// numpy.linalg, held by a checkpoint of pandas). ok is false when no checkpoint holds it.
func (r *Router) heldAs(name string) (module string, ok bool) {
	if m, ok := cost.LongestPrefix(name, func(p string) bool { return r.held[p] }); ok {
		return m, true
	}
	top, _, _ := strings.Cut(name, ".")
	if r.heldDists[pyreq.NormalizeName(top)] {
		return top, true
	}
	return "", false
}

// holdsAll reports whether option i holds every one of modules: by its imports or closure, or
// by a loaded distribution whose name is the module's top-level one, normalized.
func (r *Router) holdsAll(i int, modules []string) bool {
	return !slices.ContainsFunc(modules, func(m string) bool {
		if r.holds[i][m] {
			return false
		}
		top, _, _ := strings.Cut(m, ".")
		_, loaded := r.packages[i][pyreq.NormalizeName(top)]
		return !loaded
	})
}

// anyHolds reports whether some checkpoint (the cold start holds nothing) holds every one of
// modules.
func (r *Router) anyHolds(modules []string) bool {
	for i := range len(r.options) - 1 {
		if r.holdsAll(i, modules) {
			return true
		}
	}
	return false
}

// resolve resolves names to the index's modules: a Choice with Modules, Unknown and
// Unavailable filled in, each sorted, and the closed set of modules the request needs.
func (r *Router) resolve(names []string) (Choice, cost.Set) {
	x := r.index
	need := x.NewSet()
	var ch Choice
	seen := map[string]bool{}
	for _, name := range names {
		module, ok := x.Resolve(name)
		switch {
		case !ok:
			if !seen["?"+name] {
				ch.Unknown = append(ch.Unknown, name)
			}
			seen["?"+name] = true
			continue
		case seen[module]:
			continue
		}
		seen[module] = true
		ch.Modules = append(ch.Modules, module)
		if i, ok := x.Position(module); ok {
			need.Or(x.Closure(i))
		} else {
			ch.Unavailable = append(ch.Unavailable, module)
		}
	}
	slices.Sort(ch.Modules)
	slices.Sort(ch.Unknown)
	slices.Sort(ch.Unavailable)
	return ch, need
}

// why returns in words why ch won: its option and what it costs, the runner-up second (or -1)
// at secondMs, and what the request names that is not priced.
func (r *Router) why(ch *Choice, second int, secondMs float64) string {
	var why strings.Builder
	if ch.Cold {
		fmt.Fprintf(&why, "cold start %.0f ms", ch.FixedMs)
	} else {
		fmt.Fprintf(&why, "restore %s (%.0f ms, %.1f MiB)", ch.Checkpoint, ch.FixedMs, ch.ImageMiB)
	}
	if len(ch.Import) > 0 {
		fmt.Fprintf(&why, " + import %s (%.0f ms)", strings.Join(ch.Import, ", "), ch.ImportMs)
	} else {
		why.WriteString(" + nothing to import")
	}
	fmt.Fprintf(&why, " = %.0f ms", ch.PredictedMs)
	if second >= 0 {
		name := "cold start"
		if r.ids[second] != "" {
			name = r.ids[second]
		}
		fmt.Fprintf(&why, "; next best %s %.0f ms", name, secondMs)
	}
	r.notes(&why, ch, true)
	return why.String()
}

// notes adds to why what the request names that the image lacks, and with priced what the
// analysis lacks (neither is priced), then the checkpoints passed over and the requirements
// the image does not satisfy.
func (r *Router) notes(why *strings.Builder, ch *Choice, priced bool) {
	if len(ch.Unavailable) > 0 {
		fmt.Fprintf(why, "; %s not in the image (the request will fail to import it)", strings.Join(ch.Unavailable, ", "))
	}
	if priced && len(ch.Unknown) > 0 {
		fmt.Fprintf(why, "; %s not analysed (not priced)", strings.Join(ch.Unknown, ", "))
	}
	for _, p := range ch.PassedOver {
		fmt.Fprintf(why, "; passed over %s: %s", p.Checkpoint, p.Why)
	}
	for _, lack := range ch.ImageLacks {
		fmt.Fprintf(why, "; %s (the worker must install it)", lack)
	}
}
