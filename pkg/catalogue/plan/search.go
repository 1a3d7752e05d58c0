package plan

import (
	"container/heap"
	"math"
	"slices"

	"readie.dev/pipeline/pkg/catalogue/internal/cost"
)

// cand is a candidate checkpoint: what it holds loaded (a closed set), its restore priced on
// its predicted size, and that size.
type cand struct {
	loaded cost.Set
	opt    cost.Option
	mib    float64
}

func (p *problem) cand(loaded cost.Set) cand {
	return cand{loaded: loaded, opt: p.price.PredictedOption(loaded), mib: p.price.ImageMiB(loaded)}
}

// searcher chooses sets for the groups of one part: at most k, their predicted images at most
// budget MiB in all. Every start can also take its base: the empty checkpoint or a cold start.
type searcher struct {
	x      *cost.Index
	price  *cost.Pricer
	groups []group
	base   []float64
	k      int
	budget float64
}

func (p *problem) searcher(k int, budgetMiB float64) *searcher {
	s := &searcher{x: p.x, price: p.price, groups: p.planned.groups, k: k, budget: budgetMiB}
	base := []cost.Option{p.price.PredictedOption(p.x.NewSet()), p.price.ColdOption()}
	s.base = make([]float64, len(s.groups))
	for g := range s.groups {
		_, s.base[g] = p.price.Best(base, s.groups[g].need)
	}
	return s
}

// Set positions in an assignment besides a solution's own (0..k-1).
const (
	baseStart = -1 // the empty checkpoint or a cold start
	noStart   = -2 // an empty slot (cost +Inf)
	noSet     = -3 // "no set" where a move names sets to leave out
)

// assignment is, per group, its three cheapest starts among the base and a solution's sets:
// their costs c1 <= c2 <= c3 and which sets give the first two. The cost of a group without
// one or two of the sets is then known without pricing again.
type assignment struct {
	c1, c2, c3 []float64
	i1, i2     []int
	total      float64
}

// without is the cost of group g when sets f and h (or noSet) are left out.
func (a *assignment) without(g, f, h int) float64 {
	switch {
	case a.i1[g] != f && a.i1[g] != h:
		return a.c1[g]
	case a.i2[g] != f && a.i2[g] != h:
		return a.c2[g]
	}
	return a.c3[g]
}

func (s *searcher) assign(sets []cand) assignment {
	n := len(s.groups)
	a := assignment{c1: slices.Clone(s.base), c2: make([]float64, n), c3: make([]float64, n), i1: make([]int, n), i2: make([]int, n)}
	for g := range s.groups {
		a.i1[g], a.c2[g], a.i2[g], a.c3[g] = baseStart, math.Inf(1), noStart, math.Inf(1)
		for i := range sets {
			c, ok := s.price.CostBelow(sets[i].opt, s.groups[g].need, a.c3[g])
			if !ok {
				continue
			}
			switch {
			case c < a.c1[g]:
				a.c3[g] = a.c2[g]
				a.c2[g], a.i2[g] = a.c1[g], a.i1[g]
				a.c1[g], a.i1[g] = c, i
			case c < a.c2[g]:
				a.c3[g] = a.c2[g]
				a.c2[g], a.i2[g] = c, i
			default:
				a.c3[g] = c
			}
		}
		a.total += s.groups[g].weight * a.c1[g]
	}
	return a
}

// gain returns how much adding c lowers the total of a solution whose per-group costs are best,
// summed over the groups of support (nil: all), and the groups where it lowers the cost. As
// sets are added, costs only fall, so a group where c gains nothing never becomes one where it
// does: a later gain of c need only look at the groups of the earlier support.
func (s *searcher) gain(c *cand, best []float64, support []int32) (float64, []int32) {
	n := len(s.groups)
	if support != nil {
		n = len(support)
	}
	parts := make([]float64, (n+chunk-1)/chunk)
	supports := make([][]int32, len(parts))
	parallel(len(parts), func(i int) {
		var gain float64
		var sup []int32
		for k := i * chunk; k < min(n, (i+1)*chunk); k++ {
			g := k
			if support != nil {
				g = int(support[k])
			}
			if best[g] <= c.opt.FixedMs || !s.groups[g].need.Intersects(c.loaded) {
				continue
			}
			if cost, ok := s.price.CostBelow(c.opt, s.groups[g].need, best[g]); ok {
				gain += s.groups[g].weight * (best[g] - cost)
				sup = append(sup, int32(g))
			}
		}
		parts[i], supports[i] = gain, sup
	})
	var gain float64
	for _, p := range parts {
		gain += p
	}
	return gain, slices.Concat(supports...)
}

// gains returns the gains of the candidates on the base alone.
func (s *searcher) gains(pool []cand) []float64 {
	out := make([]float64, len(pool))
	for i := range pool {
		out[i], _ = s.gain(&pool[i], s.base, nil)
	}
	return out
}

// shortlist returns the positions of the n candidates of highest gain (ties: earlier first).
func shortlist(gains []float64, n int) []int {
	order := make([]int, len(gains))
	for i := range order {
		order[i] = i
	}
	slices.SortStableFunc(order, func(a, b int) int {
		switch {
		case gains[a] > gains[b]:
			return -1
		case gains[a] < gains[b]:
			return 1
		}
		return 0
	})
	return order[:min(n, len(order))]
}

func mibOf(sets []cand) float64 {
	var mib float64
	for _, c := range sets {
		mib += c.mib
	}
	return mib
}

// greedy adds to sets, from pool, the candidate that lowers the total most, until no candidate
// lowers it, k sets are chosen, or none fits the budget (a candidate that does not fit is
// passed over). It is the plain greedy of facility location, evaluated lazily: a candidate's
// gain only shrinks as sets are added, so a stale gain is an upper bound, and only the head of
// the queue is re-evaluated, over the groups where it gained last time. Ties go to the earlier
// candidate of pool, as in the plain loop.
//
// gains are the candidates' gains on the base alone (see gains).
func (s *searcher) greedy(pool []cand, gains []float64) []cand {
	var sets []cand
	best := slices.Clone(s.base)
	mib := 0.0
	q := &gainQueue{}
	if s.k > 0 {
		for i := range pool {
			q.items = append(q.items, gainItem{index: i, gain: gains[i]})
		}
	}
	heap.Init(q)
	for len(sets) < s.k && q.Len() > 0 {
		top := &q.items[0]
		c := &pool[top.index]
		switch {
		case mib+c.mib > s.budget:
			heap.Pop(q) // it will never fit: the budget left only shrinks
		case top.round != len(sets):
			top.gain, top.support = s.gain(c, best, top.support)
			top.round = len(sets)
			if top.support == nil {
				top.support = []int32{} // no group left: not "all groups"
			}
			heap.Fix(q, 0)
		case top.gain <= 0:
			return sets
		default:
			heap.Pop(q)
			sets = append(sets, *c)
			mib += c.mib
			for g := range s.groups {
				if best[g] > c.opt.FixedMs {
					best[g] = min(best[g], s.price.Cost(c.opt, s.groups[g].need))
				}
			}
		}
	}
	return sets
}

type gainItem struct {
	index int
	gain  float64
	round int
	// support is the groups where the candidate gained when last evaluated (nil: all).
	support []int32
}

// gainQueue orders by gain, highest first, then by pool position.
type gainQueue struct{ items []gainItem }

func (q *gainQueue) Len() int { return len(q.items) }
func (q *gainQueue) Less(i, j int) bool {
	a, b := q.items[i], q.items[j]
	if a.gain != b.gain {
		return a.gain > b.gain
	}
	return a.index < b.index
}
func (q *gainQueue) Swap(i, j int) { q.items[i], q.items[j] = q.items[j], q.items[i] }
func (q *gainQueue) Push(x any)    { q.items = append(q.items, x.(gainItem)) }
func (q *gainQueue) Pop() any {
	last := q.items[len(q.items)-1]
	q.items = q.items[:len(q.items)-1]
	return last
}

// move changes a solution: replace the set at index drop by add, or drop it when add is nil,
// or add add when drop is noSet; drop the set at drop2 too, unless it is noSet; and add add2
// too, unless it is nil.
type move struct {
	total       float64
	drop, drop2 int
	add, add2   *cand
}

// consider keeps the first move of lowest total.
func (m *move) consider(total float64, drop, drop2 int, add *cand) {
	if total < m.total {
		*m = move{total: total, drop: drop, drop2: drop2, add: add}
	}
}

func (m move) ok() bool { return m.add != nil || m.drop != noSet }

func (m move) apply(sets []cand) []cand {
	switch {
	case m.drop != noSet && m.add != nil:
		sets[m.drop] = *m.add
	case m.drop != noSet:
		sets[m.drop].loaded = nil // deleted below
	default:
		sets = append(sets, *m.add)
	}
	if m.drop2 != noSet {
		sets[m.drop2].loaded = nil
	}
	if m.add2 != nil {
		sets = append(sets, *m.add2)
	}
	return slices.DeleteFunc(sets, func(c cand) bool { return c.loaded == nil })
}

// noMove returns the bar a move must pass: lower the total by more than rounding error, so that
// the search ends.
func noMove(total float64) move {
	return move{total: total - 1e-9*math.Abs(total), drop: noSet, drop2: noSet}
}

func holds(sets []cand, loaded cost.Set) bool {
	for i := range sets {
		if sets[i].loaded.Equal(loaded) {
			return true
		}
	}
	return false
}

// improve is a local search from sets. Each round it takes the best move with the pool (add a
// candidate while fewer than k sets, swap a set for one, or drop a set), then, set by set, the
// best change of that set: grow it by a module of units (with its closure), dropping another
// set when the budget needs the room; shrink it by one of its modules (and what needs them);
// or merge another set into it. Every move lowers the total and keeps the budget; the search
// stops when no move does. Ties go to the move found first, in a fixed order, so the result is
// deterministic.
func (s *searcher) improve(sets []cand, pool []cand, units []int, newCand func(cost.Set) cand) []cand {
	sets = slices.Clone(sets)
	for range maxRounds {
		changed := false
		if m := s.poolMove(sets, pool); m.ok() {
			sets = m.apply(sets)
			changed = true
		}
		for f := 0; f < len(sets); f++ {
			if m := s.reshape(sets, f, units, newCand); m.ok() {
				sets = m.apply(sets)
				changed = true
			}
		}
		if !changed {
			break
		}
	}
	return sets
}

// maxRounds bounds the local search; each round lowers the total, so it ends anyway.
const maxRounds = 200

// dropTotals returns the totals after dropping each set: the groups it serves fall back to their
// second best.
func (s *searcher) dropTotals(a *assignment, n int) []float64 {
	totals := make([]float64, n)
	for i := range totals {
		totals[i] = a.total
	}
	for g, f := range a.i1 {
		if f >= 0 {
			totals[f] += s.groups[g].weight * (a.c2[g] - a.c1[g])
		}
	}
	return totals
}

// poolMove returns the best add, swap or drop.
func (s *searcher) poolMove(sets []cand, pool []cand) move {
	a := s.assign(sets)
	mib := mibOf(sets)
	best := noMove(a.total)
	for f, total := range s.dropTotals(&a, len(sets)) {
		best.consider(total, f, noSet, nil)
	}
	// Adds and swaps: all swaps of one candidate in one pass over the groups, candidates in
	// parallel, considered in pool order.
	addTotal := make([]float64, len(pool))
	swapTotal := make([][]float64, len(pool))
	parallel(len(pool), func(ci int) {
		c := &pool[ci]
		if holds(sets, c.loaded) {
			return
		}
		swap := make([]float64, len(sets))
		add := 0.0
		for g := range s.groups {
			w, f := s.groups[g].weight, a.i1[g]
			limit := a.c1[g]
			if f >= 0 {
				limit = a.c2[g]
			}
			cost, ok := 0.0, false
			if c.opt.FixedMs < limit && s.groups[g].need.Intersects(c.loaded) {
				cost, ok = s.price.CostBelow(c.opt, s.groups[g].need, limit)
			}
			if !ok {
				// c serves g no better than now; a swap for f loses what f gave g.
				add += w * a.c1[g]
				if f >= 0 {
					swap[f] += w * (a.c2[g] - a.c1[g])
				}
				continue
			}
			withC := min(a.c1[g], cost)
			add += w * withC
			if f >= 0 {
				swap[f] += w * (min(a.c2[g], cost) - withC)
			}
		}
		addTotal[ci], swapTotal[ci] = add, swap
	})
	for ci := range pool {
		c := &pool[ci]
		if swapTotal[ci] == nil {
			continue
		}
		if len(sets) < s.k && mib+c.mib <= s.budget {
			best.consider(addTotal[ci], noSet, noSet, c)
		}
		for f := range sets {
			if mib-sets[f].mib+c.mib <= s.budget {
				best.consider(addTotal[ci]+swapTotal[ci][f], f, noSet, c)
			}
		}
	}
	return best
}

// reshaping is a change of one set: replace set f by c, dropping set h too (or noSet), or
// adding c2 too (or nil).
type reshaping struct {
	c  cand
	h  int
	c2 *cand
}

// reshape returns the best change of set f: grown, shrunk, split or merged.
func (s *searcher) reshape(sets []cand, f int, units []int, newCand func(cost.Set) cand) move {
	a := s.assign(sets)
	r := reshaper{s: s, sets: sets, f: f, old: sets[f].loaded, mib: mibOf(sets), newCand: newCand}
	best := noMove(a.total)
	r.dropLoss = s.dropTotals(&a, len(sets))
	tries := slices.Concat(r.grows(&a, units), r.shrinks(), r.merges())
	totals := make([]float64, len(tries))
	parallel(len(tries), func(i int) {
		totals[i] = s.replaceTotal(&a, &tries[i].c, tries[i].c2, r.old, f, tries[i].h)
	})
	for i := range tries {
		if totals[i] < best.total {
			best = move{total: totals[i], drop: f, drop2: tries[i].h, add: &tries[i].c, add2: tries[i].c2}
		}
	}
	return best
}

// reshaper makes the reshapings of set f of sets, whose modules are old.
type reshaper struct {
	s        *searcher
	sets     []cand
	f        int
	old      cost.Set
	mib      float64
	dropLoss []float64 // the totals after dropping each set (searcher.dropTotals)
	newCand  func(cost.Set) cand
}

// fit returns the move replacing f by c, dropping the set that costs least to lose when the
// budget needs its room; ok false when none makes room.
func (r *reshaper) fit(c cand) (reshaping, bool) {
	sets, f := r.sets, r.f
	if r.mib-sets[f].mib+c.mib <= r.s.budget {
		return reshaping{c, noSet, nil}, true
	}
	h := noSet
	for i := range sets {
		if i != f && r.mib-sets[f].mib-sets[i].mib+c.mib <= r.s.budget && (h == noSet || r.dropLoss[i] < r.dropLoss[h]) {
			h = i
		}
	}
	return reshaping{c, h, nil}, h != noSet
}

// grows returns f grown by one of units and its closure. Only the modules that the requests f
// serves, or would serve next, need: a module no request near f needs cannot draw requests to it.
func (r *reshaper) grows(a *assignment, units []int) []reshaping {
	var tries []reshaping
	near := r.s.x.NewSet()
	for g := range r.s.groups {
		if a.i1[g] == r.f || a.i2[g] == r.f {
			near.Or(r.s.groups[g].need)
		}
	}
	for _, u := range units {
		if !r.old.Has(u) && near.Has(u) {
			grown := r.old.Clone()
			grown.Or(r.s.x.Closure(u))
			if t, ok := r.fit(r.newCand(grown)); ok && !holds(r.sets, grown) {
				tries = append(tries, t)
			}
		}
	}
	return tries
}

// shrinks returns f without one module u (and what needs it), and splits: the same with u's
// closure as a set of its own, when there is a free slot and room.
func (r *reshaper) shrinks() []reshaping {
	var tries []reshaping
	x, sets := r.s.x, r.sets
	members := r.old.Members()
	for _, u := range members {
		shrunk := x.NewSet()
		for _, v := range members {
			if !x.Closure(v).Has(u) {
				shrunk.Add(v)
			}
		}
		if shrunk.Empty() || holds(sets, shrunk) {
			continue
		}
		c := r.newCand(shrunk)
		tries = append(tries, reshaping{c, noSet, nil})
		if part := r.newCand(x.Closure(u).Clone()); len(sets) < r.s.k && r.mib-sets[r.f].mib+c.mib+part.mib <= r.s.budget && !holds(sets, part.loaded) {
			tries = append(tries, reshaping{c, noSet, &part})
		}
	}
	return tries
}

// merges returns f merged with each later set, which the merge replaces too.
func (r *reshaper) merges() []reshaping {
	var tries []reshaping
	for h := r.f + 1; h < len(r.sets); h++ {
		merged := r.old.Clone()
		merged.Or(r.sets[h].loaded)
		if !holds(r.sets, merged) {
			tries = append(tries, reshaping{r.newCand(merged), h, nil})
		}
	}
	return tries
}

// replaceTotal returns the total after replacing set f (whose loaded set was old) by c, dropping set
// h (or noSet) and adding c2 (or nil). Only the groups f or h serve, and those that need a
// module of c or c2, can change cost; when c holds old, only those that need a module c adds
// to it, or a module of c2.
func (s *searcher) replaceTotal(a *assignment, c, c2 *cand, old cost.Set, f, h int) float64 {
	relevant := c.loaded
	if old.SubsetOf(c.loaded) {
		relevant = c.loaded.Clone()
		for w := range relevant {
			relevant[w] &^= old[w]
		}
	}
	fixed := c.opt.FixedMs
	if c2 != nil {
		relevant = relevant.Clone()
		relevant.Or(c2.loaded)
		fixed = min(fixed, c2.opt.FixedMs)
	}
	total := a.total
	for g := range s.groups {
		affected := a.i1[g] == f || a.i1[g] == h
		if !affected && (fixed >= a.c1[g] || !s.groups[g].need.Intersects(relevant)) {
			continue
		}
		cost := a.without(g, f, h)
		for _, n := range []*cand{c, c2} {
			if n != nil && n.opt.FixedMs < cost {
				if below, ok := s.price.CostBelow(n.opt, s.groups[g].need, cost); ok {
					cost = below
				}
			}
		}
		total += s.groups[g].weight * (cost - a.c1[g])
	}
	return total
}
