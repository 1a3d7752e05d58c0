package plan

import (
	"slices"
	"strings"

	"readie.dev/pipeline/pkg/catalogue/internal/cost"
)

// candidates returns the corpus's distinct needs (most frequent first: the candidates of top-k
// and greedy), the plan's wider pool, and the modules the plan may grow a set by.
func (p *problem) candidates(maxCandidates int) (distinct, pool []cand, units []int) {
	groups := p.frequentGroups(maxCandidates)
	seen := map[string]bool{}
	addTo := func(list *[]cand, s cost.Set) {
		if k := s.Key(); !seen[k] {
			seen[k] = true
			*list = append(*list, p.cand(s))
		}
	}
	for _, g := range groups {
		addTo(&distinct, g.need)
	}
	pool = slices.Clone(distinct)
	// Unions of two frequent sets: one checkpoint for requests that use either.
	const pairs = 24
	top := groups[:min(pairs, len(groups))]
	for i := range top {
		for j := i + 1; j < len(top); j++ {
			u := top[i].need.Clone()
			u.Or(top[j].need)
			addTo(&pool, u)
		}
	}
	// Families, alone and with the most frequent set that uses the package.
	weightOf := p.moduleWeights()
	for _, f := range p.families(weightOf) {
		addTo(&pool, f.modules)
		if i, ok := p.x.Position(f.top); ok {
			for _, g := range groups {
				if g.need.Has(i) {
					u := f.modules.Clone()
					u.Or(g.need)
					addTo(&pool, u)
					break
				}
			}
		}
	}
	return distinct, pool, growUnits(weightOf)
}

// frequentGroups returns the planned groups that need a module, most frequent first, then fewer
// modules, then by name (a fixed order for ties); at most maxCandidates of them when it is
// positive.
func (p *problem) frequentGroups(maxCandidates int) []group {
	groups := slices.Clone(p.planned.groups)
	groups = slices.DeleteFunc(groups, func(g group) bool { return g.need.Empty() })
	names := make(map[string]string, len(groups))
	nameOf := func(s cost.Set) string {
		k := s.Key()
		if n, ok := names[k]; ok {
			return n
		}
		n := strings.Join(p.x.Names(s), ",")
		names[k] = n
		return n
	}
	slices.SortStableFunc(groups, func(a, b group) int {
		switch {
		case a.weight != b.weight:
			if a.weight > b.weight {
				return -1
			}
			return 1
		case a.need.Len() != b.need.Len():
			return a.need.Len() - b.need.Len()
		}
		return strings.Compare(nameOf(a.need), nameOf(b.need))
	})
	if maxCandidates > 0 && len(groups) > maxCandidates {
		groups = groups[:maxCandidates]
	}
	return groups
}

// moduleWeights returns, for each module of the index, the weight of the planned requests that need it.
func (p *problem) moduleWeights() []float64 {
	weightOf := make([]float64, p.x.Len())
	for _, g := range p.planned.groups {
		for _, u := range g.need.Members() {
			weightOf[u] += g.weight
		}
	}
	return weightOf
}

// family is every needed module under one top-level package (sklearn.svm, sklearn.tree, ...)
// with their closures: a candidate for the long tail of requests that each name a different
// submodule.
type family struct {
	top     string
	modules cost.Set
}

// families returns the families of the needed modules, in the order of their first module.
func (p *problem) families(weightOf []float64) []family {
	var out []family
	at := map[string]int{}
	for u := range weightOf {
		if weightOf[u] == 0 {
			continue
		}
		top, _, _ := strings.Cut(p.x.Name(u), ".")
		i, ok := at[top]
		if !ok {
			i = len(out)
			at[top] = i
			out = append(out, family{top: top, modules: p.x.NewSet()})
		}
		out[i].modules.Or(p.x.Closure(u))
	}
	return out
}

// growUnits returns the modules to grow a set by: those the planned requests need, most needed
// first, at most 128.
func growUnits(weightOf []float64) []int {
	var units []int
	for u := range weightOf {
		if weightOf[u] > 0 {
			units = append(units, u)
		}
	}
	slices.SortStableFunc(units, func(a, b int) int {
		switch {
		case weightOf[a] > weightOf[b]:
			return -1
		case weightOf[a] < weightOf[b]:
			return 1
		}
		return a - b
	})
	const maxUnits = 128
	if len(units) > maxUnits {
		units = units[:maxUnits]
	}
	return units
}
