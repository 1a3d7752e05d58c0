// Package plan chooses which package sets to checkpoint for a corpus of requests: the sets
// that minimise the corpus's expected start cost under this host's cost model, within a number
// of sets and a size budget, and compares that plan with simpler strategies on the part of the
// corpus it planned from and on a held-out part.
package plan

import (
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"fmt"
	"io"
	"math"
	"os"
	"slices"
	"strings"

	"readie.dev/pipeline/pkg/atomicfile"
	"readie.dev/pipeline/pkg/catalogue"
	"readie.dev/pipeline/pkg/catalogue/internal/cost"
	"readie.dev/pipeline/pkg/checkpointid"
	"readie.dev/pipeline/pkg/jsonfile"
)

// FileName is the plan's name in an output directory.
const FileName = "plan.json"

// Version is the version of plan.json.
const Version = 1

// ErrInput wraps problems with the planner's inputs.
var ErrInput = errors.New("invalid planning input")

// The strategies, in the order they are reported.
const (
	// Cold starts every request cold.
	Cold = "cold"
	// Empty restores the empty checkpoint (or starts cold, when cheaper).
	Empty = "empty"
	// TopK checkpoints the K most frequent distinct import sets that fit the budget.
	TopK = "top-k"
	// Greedy is readie's greedy facility location over the distinct import sets.
	Greedy = "greedy"
	// Planned is this package's plan (the strategy named "plan").
	Planned = "plan"
)

// Strategies lists the strategies in report order.
func Strategies() []string { return []string{Cold, Empty, TopK, Greedy, Planned} }

// Options bound the plan.
type Options struct {
	// MaxSets is K, the most sets to checkpoint besides "empty".
	MaxSets int `json:"max_sets"`
	// BudgetMiB bounds the total predicted image size of the sets ("empty" aside, which every
	// output holds anyway).
	BudgetMiB float64 `json:"budget_mib"`
	// MaxCandidates caps the distinct import sets taken as candidates, most frequent first
	// (0: all). A bound on time for corpora with very many distinct sets.
	MaxCandidates int `json:"max_candidates"`
}

// DefaultOptions returns readie's bounds, so that the plan and its greedy compare at the same K and
// budget; on a corpus like the sample one the budget does not bind (15 sets of the common
// stacks predict to well under 2 GiB).
func DefaultOptions() Options { return Options{MaxSets: 15, BudgetMiB: 2048} }

func (o Options) validate() error {
	var problems []error
	if o.MaxSets < 0 || o.MaxSets > 1000 {
		problems = append(problems, fmt.Errorf("max sets %d: want 0..1000", o.MaxSets))
	}
	if !(o.BudgetMiB >= 0) || math.IsInf(o.BudgetMiB, 0) {
		problems = append(problems, fmt.Errorf("budget %v MiB: want a finite number >= 0", o.BudgetMiB))
	}
	if o.MaxCandidates < 0 {
		problems = append(problems, fmt.Errorf("max candidates %d: want >= 0 (0: all)", o.MaxCandidates))
	}
	if len(problems) > 0 {
		return fmt.Errorf("%w: %w", ErrInput, errors.Join(problems...))
	}
	return nil
}

// Result is plan.json.
type Result struct {
	Version   int                 `json:"version"`
	Options   Options             `json:"options"`
	CostModel catalogue.CostModel `json:"cost_model"`
	// CostSource says where the cost model's figures were measured (set by the caller).
	CostSource string               `json:"cost_source,omitempty"`
	Corpus     CorpusSummary        `json:"corpus"`
	Sets       []PlannedSet         `json:"sets"`
	Strategies map[string]*Strategy `json:"strategies"`
}

// CorpusSummary describes the corpus planned from.
type CorpusSummary struct {
	Planned PartSummary `json:"planned"`
	HeldOut PartSummary `json:"held_out"`
	// Unavailable counts, per module the image lacks, the requests that import it.
	Unavailable map[string]int `json:"unavailable"`
}

// PartSummary describes one side of the held-out split.
type PartSummary struct {
	Requests int     `json:"requests"`
	Weight   float64 `json:"weight"`
	// DistinctNeeds is how many distinct sets of needed modules the servable requests have.
	DistinctNeeds int `json:"distinct_needs"`
	// Unservable requests import a module the image lacks; the cost figures leave them out.
	Unservable       int     `json:"unservable"`
	UnservableWeight float64 `json:"unservable_weight"`
	// LowerBoundMs is a floor under every strategy's mean_ms on this part: each request on the
	// best start it could have with unlimited sets (see lowerBound).
	LowerBoundMs float64 `json:"lower_bound_ms"`
}

// Strategy is one strategy's sets and its expected start costs.
type Strategy struct {
	Sets     []PlannedSet `json:"sets"`
	TotalMiB float64      `json:"total_mib"`
	Planned  Stats        `json:"planned"`
	HeldOut  Stats        `json:"held_out"`
}

// PlannedSet is one package set to checkpoint, as plan.json lists it.
type PlannedSet struct {
	ID      string   `json:"id"`
	Imports []string `json:"imports"`
	// Closure is every analysed module the set holds loaded.
	Closure      []string `json:"closure"`
	PredictedMiB float64  `json:"predicted_mib"`
	RestoreMs    float64  `json:"restore_ms"`
	// ServedWeight is the weight of the planned requests that start on it.
	ServedWeight float64 `json:"served_weight"`
}

// Plan plans sets for the requests of in, with the modules it names, under the cost model.
func Plan(in Input, model catalogue.CostModel, opt Options) (*Result, error) {
	if err := opt.validate(); err != nil {
		return nil, err
	}
	p, err := newProblem(in, model)
	if err != nil {
		return nil, err
	}
	res := &Result{Version: Version, Options: opt, CostModel: model, Strategies: map[string]*Strategy{}}
	res.Corpus = CorpusSummary{Planned: p.planned.summary(), HeldOut: p.heldOut.summary(), Unavailable: p.unavailable}
	res.Corpus.Planned.LowerBoundMs = p.lowerBound(p.planned)
	res.Corpus.HeldOut.LowerBoundMs = p.lowerBound(p.heldOut)

	s := p.searcher(opt.MaxSets, opt.BudgetMiB)
	distinct, pool, units := p.candidates(opt.MaxCandidates)

	var topK []cand
	mib := 0.0
	for _, c := range distinct {
		if len(topK) == opt.MaxSets {
			break
		}
		if mib+c.mib <= opt.BudgetMiB {
			topK = append(topK, c)
			mib += c.mib
		}
	}
	// pool starts with distinct, so the gains of distinct are the first of pool's.
	gains := s.gains(pool)
	greedy := s.greedy(distinct, gains[:len(distinct)])
	// The plan: local search from greedy's sets (so never worse than greedy on the planned
	// part), with the pool's candidates of highest gain.
	var short []cand
	for _, i := range shortlist(gains, swapCandidates) {
		short = append(short, pool[i])
	}
	plan := s.improve(greedy, short, units, p.cand)

	res.Strategies[Cold] = p.strategy(nil, false)
	res.Strategies[Empty] = p.strategy(nil, true)
	res.Strategies[TopK] = p.strategy(topK, true)
	res.Strategies[Greedy] = p.strategy(greedy, true)
	res.Strategies[Planned] = p.strategy(plan, true)
	res.Sets = res.Strategies[Planned].Sets
	return res, nil
}

// Price returns the strategy that checkpoints sets (each the modules it imports) besides the
// empty checkpoint, priced on the requests of in under model as Plan prices its own: the figures
// of a hand-made or another planner's choice, beside the plan's.
func Price(in Input, model catalogue.CostModel, sets [][]string) (*Strategy, error) {
	p, err := newProblem(in, model)
	if err != nil {
		return nil, err
	}
	var problems []error
	cands := make([]cand, 0, len(sets))
	for i, imports := range sets {
		loaded := p.x.NewSet()
		for _, m := range imports {
			j, ok := p.x.Position(m)
			if !ok {
				problems = append(problems, fmt.Errorf("sets[%d]: %q is not an available module of the analysis", i, m))
				continue
			}
			loaded.Or(p.x.Closure(j))
		}
		cands = append(cands, p.cand(loaded))
	}
	if len(problems) > 0 {
		return nil, fmt.Errorf("%w: %w", ErrInput, errors.Join(problems...))
	}
	return p.strategy(cands, true), nil
}

func (pt part) summary() PartSummary {
	return PartSummary{Requests: pt.requests, Weight: pt.weight, DistinctNeeds: len(pt.groups), Unservable: pt.unservable, UnservableWeight: pt.unservableWeight}
}

// swapCandidates is how many candidates of the pool, those that lower the cost most on their
// own, the local search tries to add or swap in. Each costs a pass over the groups per round.
const swapCandidates = 256

// strategy names and evaluates a solution: sets (plus the empty checkpoint when withEmpty) and a
// cold start, in the router's order.
func (p *problem) strategy(sets []cand, withEmpty bool) *Strategy {
	x := p.x
	st := &Strategy{Sets: []PlannedSet{}}
	named := p.name(sets)
	// The router's order: smaller image first, then id; cold last.
	order := make([]int, len(sets))
	for i := range order {
		order[i] = i
	}
	slices.SortStableFunc(order, func(a, b int) int {
		if sets[a].mib != sets[b].mib {
			if sets[a].mib < sets[b].mib {
				return -1
			}
			return 1
		}
		return strings.Compare(named[a].ID, named[b].ID)
	})
	var options []cost.Option
	if withEmpty {
		options = append(options, p.price.PredictedOption(x.NewSet()))
	}
	for _, i := range order {
		options = append(options, sets[i].opt)
	}
	options = append(options, p.price.ColdOption())
	var served []float64
	st.Planned, served = p.evaluate(p.planned, options)
	st.HeldOut, _ = p.evaluate(p.heldOut, options)
	first := 0
	if withEmpty {
		first = 1
	}
	for k, i := range order {
		named[i].ServedWeight = served[first+k]
	}
	for i := range sets {
		st.TotalMiB += sets[i].mib
	}
	st.Sets = named
	slices.SortFunc(st.Sets, func(a, b PlannedSet) int { return strings.Compare(a.ID, b.ID) })
	return st
}

// name gives sets their imports (the fewest modules whose closures load the set) and ids.
func (p *problem) name(sets []cand) []PlannedSet {
	x := p.x
	out := make([]PlannedSet, len(sets))
	count := map[string]int{}
	for i, c := range sets {
		imports := minimalImports(x, c.loaded)
		out[i] = PlannedSet{ID: baseID(imports), Imports: imports, Closure: x.Names(c.loaded), PredictedMiB: c.mib, RestoreMs: c.opt.FixedMs}
		count[out[i].ID]++
	}
	for i := range out {
		if count[out[i].ID] > 1 {
			out[i].ID = hashedID(out[i].ID, out[i].Imports)
		}
	}
	return out
}

// minimalImports returns the modules of loaded that no other module of loaded pulls in: importing
// them loads the whole set. Of modules that pull each other in, the first by name is kept.
func minimalImports(x *cost.Index, loaded cost.Set) []string {
	members := loaded.Members()
	var out []string
	for _, u := range members {
		redundant := false
		for _, v := range members {
			if v != u && x.Closure(v).Has(u) && (!x.Closure(u).Has(v) || x.Name(v) < x.Name(u)) {
				redundant = true
				break
			}
		}
		if !redundant {
			out = append(out, x.Name(u))
		}
	}
	slices.Sort(out)
	return out
}

// baseID returns a set's id, derived from its imports: matplotlib.pyplot and pandas give
// matplotlib_pyplot-pandas. Too long or reserved ids get a hash (see hashedID).
func baseID(imports []string) string {
	parts := make([]string, len(imports))
	for i, m := range imports {
		parts[i] = strings.ReplaceAll(m, ".", "_")
	}
	id := strings.Join(parts, "-")
	if len(id) > 64 || id == checkpointid.Empty || id == "" {
		return hashedID(id, imports)
	}
	return id
}

// hashedID returns the start of id followed by 8 hex digits of a digest of the imports, so that
// the id stays unique, valid and the same for the same imports.
func hashedID(id string, imports []string) string {
	sum := sha256.Sum256([]byte(strings.Join(imports, ",")))
	return strings.TrimRight(id[:min(len(id), 55)], "-_") + "-" + hex.EncodeToString(sum[:4])
}

// Save writes the plan to path atomically.
func (r *Result) Save(path string) error { return atomicfile.WriteJSON(path, r) }

// Load reads the plan.json at path (see Parse).
func Load(path string) (*Result, error) {
	data, err := os.ReadFile(path)
	if err != nil {
		return nil, err
	}
	r, err := Parse(data)
	if err != nil {
		return nil, fmt.Errorf("%s: %w", path, err)
	}
	return r, nil
}

// Parse reads a plan.json and checks that its sets are valid package sets (ids, imports), so
// that `capture --plan` can take them as they are.
func Parse(data []byte) (*Result, error) {
	var r Result
	if err := jsonfile.Decode(data, &r, "plan"); err != nil {
		return nil, fmt.Errorf("%w: %w", ErrInput, err)
	}
	if r.Version != Version {
		return nil, fmt.Errorf("%w: version %d: this reader knows %d", ErrInput, r.Version, Version)
	}
	var problems []error
	seen := map[string]bool{}
	for i, s := range r.Sets {
		switch {
		case !checkpointid.Valid(s.ID):
			problems = append(problems, fmt.Errorf("sets[%d]: %w", i, checkpointid.Check(s.ID)))
		case s.ID == checkpointid.Empty:
			problems = append(problems, fmt.Errorf("sets[%d]: id %q is reserved for the set every run captures first", i, s.ID))
		case seen[s.ID]:
			problems = append(problems, fmt.Errorf("sets[%d]: duplicate id %q", i, s.ID))
		}
		seen[s.ID] = true
		if len(s.Imports) == 0 {
			problems = append(problems, fmt.Errorf("sets[%d] %s: imports is empty", i, s.ID))
		}
		for _, m := range s.Imports {
			if !catalogue.IsModuleName(m) {
				problems = append(problems, fmt.Errorf("sets[%d] %s: import %q is not a dotted Python module name", i, s.ID, m))
			}
		}
	}
	if len(problems) > 0 {
		return nil, fmt.Errorf("%w: %w", ErrInput, errors.Join(problems...))
	}
	return &r, nil
}

// Catalogue is the catalogue the plan predicts: its sets and the empty checkpoint priced on
// their predicted sizes, and the analysed modules (those it was planned with). Captures replace
// the predictions with measured sizes and restore medians.
func (r *Result) Catalogue(modules map[string]catalogue.Module) *catalogue.Catalogue {
	c := &catalogue.Catalogue{Version: catalogue.Version, CostModel: r.CostModel, Modules: modules}
	c.Checkpoints = append(c.Checkpoints, catalogue.Checkpoint{ID: checkpointid.Empty, Imports: []string{}, Closure: []string{},
		ImageMiB: r.CostModel.EmptyMiB, PredictedMiB: r.CostModel.EmptyMiB})
	for _, s := range r.Sets {
		c.Checkpoints = append(c.Checkpoints, catalogue.Checkpoint{ID: s.ID, Imports: s.Imports, Closure: s.Closure,
			ImageMiB: s.PredictedMiB, PredictedMiB: s.PredictedMiB})
	}
	return c
}

// WriteSummary writes the strategies side by side.
func (r *Result) WriteSummary(w io.Writer) error {
	pl, ho := r.Corpus.Planned, r.Corpus.HeldOut
	fmt.Fprintf(w, "corpus: %d requests planned from (%d distinct needs, %d unservable), %d held out (%d unservable)\n",
		pl.Requests, pl.DistinctNeeds, pl.Unservable, ho.Requests, ho.Unservable)
	fmt.Fprintf(w, "expected start cost per request, ms (servable requests; K=%d, budget %.0f MiB):\n", r.Options.MaxSets, r.Options.BudgetMiB)
	fmt.Fprintf(w, "%-8s %5s %9s | %8s %8s %8s %6s | %8s %8s %8s %6s\n", "strategy", "sets", "MiB", "mean", "p50", "p90", "cold", "held mean", "p50", "p90", "cold")
	for _, name := range Strategies() {
		s := r.Strategies[name]
		if s == nil {
			continue
		}
		fmt.Fprintf(w, "%-8s %5d %9.1f | %8.1f %8.1f %8.1f %5.0f%% | %8.1f %8.1f %8.1f %5.0f%%\n", name, len(s.Sets), s.TotalMiB,
			s.Planned.MeanMs, s.Planned.P50Ms, s.Planned.P90Ms, 100*s.Planned.ColdShare,
			s.HeldOut.MeanMs, s.HeldOut.P50Ms, s.HeldOut.P90Ms, 100*s.HeldOut.ColdShare)
	}
	fmt.Fprintf(w, "%-8s %5s %9s | %8.1f %8s %8s %6s | %8.1f\n", "bound", "", "", pl.LowerBoundMs, "", "", "", ho.LowerBoundMs)
	if g, p := r.Strategies[Greedy], r.Strategies[Planned]; g != nil && p != nil && g.Planned.MeanMs > 0 && g.HeldOut.MeanMs > 0 {
		fmt.Fprintf(w, "plan vs greedy: %+.1f%% planned, %+.1f%% held out\n",
			100*(p.Planned.MeanMs/g.Planned.MeanMs-1), 100*(p.HeldOut.MeanMs/g.HeldOut.MeanMs-1))
	}
	_, err := fmt.Fprintln(w)
	return err
}
