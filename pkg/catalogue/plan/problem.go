package plan

import (
	"errors"
	"fmt"
	"slices"
	"strings"

	"readie.dev/pipeline/pkg/catalogue"
	"readie.dev/pipeline/pkg/catalogue/internal/cost"
)

// group is the requests of one part of the corpus that need the same modules (closures
// included): they cost the same on every start, so the planner prices them once.
type group struct {
	need     cost.Set
	weight   float64
	requests int
}

// part is one side of the held-out split, grouped.
type part struct {
	groups []group
	// requests and weight count every request of the part, unservable ones included.
	requests int
	weight   float64
	// unservable requests import a module that the image lacks: they can only start cold and
	// fail, whatever the plan, so they are left out of the cost figures and never make a set.
	unservable       int
	unservableWeight float64
}

// problem is a corpus resolved against an analysis and priced under a cost model.
type problem struct {
	x                *cost.Index
	price            *cost.Pricer
	planned, heldOut part
	// unavailable counts, per module the image lacks, the requests that import it.
	unavailable map[string]int
}

// Request is one request of a corpus.
type Request struct {
	// Imports are the names the request imports, as written in code (a module, or a name
	// imported from one); each must be a key of Input.Names.
	Imports []string
	// Weight is how often the request occurs.
	Weight float64
	// Line is where the request is in its file, for errors.
	Line int
	// HeldOut requests are priced but never planned from.
	HeldOut bool
}

// Input is what the planner plans from: a corpus resolved by an analysis.
type Input struct {
	Requests []Request
	// Names maps every name a request imports to the analysed module it resolves to.
	Names map[string]string
	// Modules are the analysed modules, keyed by name.
	Modules map[string]catalogue.Module
}

// index checks the modules and the cost model as the router does and compiles them for
// pricing.
func index(modules map[string]catalogue.Module, model catalogue.CostModel) (*cost.Index, error) {
	if err := errors.Join(model.Validate(), catalogue.CheckModules(modules)); err != nil {
		return nil, fmt.Errorf("%w: %w", ErrInput, err)
	}
	in := make(map[string]cost.Module, len(modules))
	for name, m := range modules {
		in[name] = cost.Module{Available: m.Available, OwnMs: m.OwnMs, OwnMiB: m.OwnMiB, Closure: m.Closure}
	}
	x, err := cost.NewIndex(in, cost.Model{InterceptMs: model.InterceptMs, AlphaMsPerMiB: model.AlphaMsPerMiB, ColdStartMs: model.ColdStartMs, EmptyMiB: model.EmptyMiB})
	if err != nil {
		return nil, fmt.Errorf("%w: %w", ErrInput, err)
	}
	return x, nil
}

func newProblem(in Input, model catalogue.CostModel) (*problem, error) {
	x, err := index(in.Modules, model)
	if err != nil {
		return nil, err
	}
	p := &problem{x: x, price: x.Pricer(), unavailable: map[string]int{}}
	// need is the closure union of a request's names, interned by key per part.
	var missing []string
	seenMissing := map[string]bool{}
	byKey := [2]map[string]int{{}, {}}
	for _, r := range in.Requests {
		pt, side := &p.planned, 0
		if r.HeldOut {
			pt, side = &p.heldOut, 1
		}
		pt.requests++
		pt.weight += r.Weight
		need, lacks, unanalysed := needOf(r.Imports, in.Names, x)
		for _, name := range unanalysed {
			if !seenMissing[name] {
				seenMissing[name] = true
				missing = append(missing, fmt.Sprintf("%s (line %d)", name, r.Line))
			}
		}
		if len(lacks) > 0 {
			pt.unservable++
			pt.unservableWeight += r.Weight
			for _, m := range lacks {
				p.unavailable[m]++
			}
			continue
		}
		key := need.Key()
		g, ok := byKey[side][key]
		if !ok {
			g = len(pt.groups)
			byKey[side][key] = g
			pt.groups = append(pt.groups, group{need: need})
		}
		pt.groups[g].weight += r.Weight
		pt.groups[g].requests++
	}
	p.planned.pack(x)
	p.heldOut.pack(x)
	if len(missing) > 0 {
		const show = 5
		more := ""
		if len(missing) > show {
			more = fmt.Sprintf(" and %d more", len(missing)-show)
			missing = missing[:show]
		}
		return nil, fmt.Errorf("%w: the analysis has no entry for %s%s: analyze this corpus", ErrInput, strings.Join(missing, ", "), more)
	}
	return p, nil
}

// needOf returns the closure union of the modules that imports resolve to; lacks are the modules
// among them that the image lacks, unanalysed the imports the analysis has no entry for.
func needOf(imports []string, names map[string]string, x *cost.Index) (need cost.Set, lacks, unanalysed []string) {
	need = x.NewSet()
	for _, name := range imports {
		module, ok := names[name]
		if !ok {
			unanalysed = append(unanalysed, name)
			continue
		}
		pos, ok := x.Position(module)
		if !ok {
			if !slices.Contains(lacks, module) {
				lacks = append(lacks, module)
			}
			continue
		}
		need.Or(x.Closure(pos))
	}
	return need, lacks, unanalysed
}

// pack moves the groups' needs into one array, in group order: the planner's inner loops scan
// them all, and contiguous sets scan several times faster than scattered ones.
func (pt *part) pack(x *cost.Index) {
	words := len(x.NewSet())
	flat := make([]uint64, 0, len(pt.groups)*words)
	for _, g := range pt.groups {
		flat = append(flat, g.need...)
	}
	for i := range pt.groups {
		pt.groups[i].need = cost.Set(flat[i*words : (i+1)*words : (i+1)*words])
	}
}

// Stats are the expected start costs of the servable requests of one part under one strategy,
// weighted by the requests' weights.
type Stats struct {
	Requests int     `json:"requests"`
	Weight   float64 `json:"weight"`
	MeanMs   float64 `json:"mean_ms"`
	P50Ms    float64 `json:"p50_ms"`
	P90Ms    float64 `json:"p90_ms"`
	// ColdShare is the share of the weight that starts cold.
	ColdShare float64 `json:"cold_share"`
}

// evaluate prices every group of pt on its best option (options in the router's order, cold
// last) and returns the statistics and, per option, the weight it serves.
func (p *problem) evaluate(pt part, options []cost.Option) (Stats, []float64) {
	type priced struct{ ms, weight float64 }
	costs := make([]priced, 0, len(pt.groups))
	served := make([]float64, len(options))
	var st Stats
	var sum float64
	for _, g := range pt.groups {
		best, ms := p.price.Best(options, g.need)
		served[best] += g.weight
		costs = append(costs, priced{ms, g.weight})
		st.Requests += g.requests
		st.Weight += g.weight
		sum += ms * g.weight
	}
	if st.Weight == 0 {
		return st, served
	}
	st.MeanMs = sum / st.Weight
	st.ColdShare = served[len(served)-1] / st.Weight
	slices.SortStableFunc(costs, func(a, b priced) int {
		switch {
		case a.ms < b.ms:
			return -1
		case a.ms > b.ms:
			return 1
		}
		return 0
	})
	// The weighted percentile: the lowest cost at which the cumulative weight reaches q of
	// the total.
	percentile := func(q float64) float64 {
		var cum float64
		for _, c := range costs {
			cum += c.weight
			if cum >= q*st.Weight {
				return c.ms
			}
		}
		return costs[len(costs)-1].ms
	}
	st.P50Ms = percentile(0.5)
	st.P90Ms = percentile(0.9)
	return st, served
}

// lowerBound returns a floor under every strategy's mean on pt: each group on the best start it could
// have if every set were allowed, closures relaxed: the empty restore, plus per needed module
// the cheaper of holding it in the image (its memory priced by the restore line) or importing
// it; or a cold start. No K, budget or candidate pool reaches below it.
func (p *problem) lowerBound(pt part) float64 {
	x, m := p.x, p.price.Model()
	var sum, weight float64
	for _, g := range pt.groups {
		ideal := m.RestoreMs(m.EmptyMiB)
		for _, u := range g.need.Members() {
			ideal += min(x.OwnMs(u), m.AlphaMsPerMiB*x.OwnMiB(u))
		}
		cold := p.price.Cost(p.price.ColdOption(), g.need)
		sum += g.weight * min(ideal, cold)
		weight += g.weight
	}
	if weight == 0 {
		return 0
	}
	return sum / weight
}
