package setplan

import (
	"fmt"
	"slices"
	"strings"

	"readie.dev/pipeline/internal/analysis"
	"readie.dev/pipeline/internal/corpus"
	"readie.dev/pipeline/pkg/catalogue"
)

// group is the requests of one part of the corpus that need the same modules (closures
// included): they cost the same on every start, so the planner prices them once.
type group struct {
	need     catalogue.Set
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
	x                *catalogue.Index
	price            *catalogue.Pricer
	planned, heldOut part
	// unavailable counts, per module the image lacks, the requests that import it.
	unavailable map[string]int
}

func newProblem(c *corpus.Corpus, a *analysis.File, model catalogue.CostModel) (*problem, error) {
	x, err := a.Index(model)
	if err != nil {
		return nil, err
	}
	p := &problem{x: x, price: x.Pricer(), unavailable: map[string]int{}}
	// need is the closure union of a request's names, interned by key per part.
	var missing []string
	seenMissing := map[string]bool{}
	byKey := [2]map[string]int{{}, {}}
	for i, r := range c.Requests {
		pt, side := &p.planned, 0
		if corpus.HeldOut(i) {
			pt, side = &p.heldOut, 1
		}
		pt.requests++
		pt.weight += r.Weight
		need, lacks, unanalysed := needOf(r.Imports, a, x)
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
func needOf(imports []string, a *analysis.File, x *catalogue.Index) (need catalogue.Set, lacks, unanalysed []string) {
	need = x.NewSet()
	for _, name := range imports {
		e, ok := a.Names[name]
		if !ok {
			unanalysed = append(unanalysed, name)
			continue
		}
		pos, ok := x.Position(e.Module)
		if !ok {
			if !slices.Contains(lacks, e.Module) {
				lacks = append(lacks, e.Module)
			}
			continue
		}
		need.Or(x.Closure(pos))
	}
	return need, lacks, unanalysed
}

// pack moves the groups' needs into one array, in group order: the planner's inner loops scan
// them all, and contiguous sets scan several times faster than scattered ones.
func (pt *part) pack(x *catalogue.Index) {
	words := len(x.NewSet())
	flat := make([]uint64, 0, len(pt.groups)*words)
	for _, g := range pt.groups {
		flat = append(flat, g.need...)
	}
	for i := range pt.groups {
		pt.groups[i].need = catalogue.Set(flat[i*words : (i+1)*words : (i+1)*words])
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
func (p *problem) evaluate(pt part, options []catalogue.Option) (Stats, []float64) {
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
