// Package cost compiles the analysed modules for pricing (Index, its bitsets Set) and prices
// the ways to start a request under a cost model (Pricer): the one pricing rule of the router
// (package catalogue) and the planner (package catalogue/plan), kept out of their public API.
package cost

import (
	"errors"
	"fmt"
	"math"
	"slices"
	"strings"
)

// Model is what pricing needs of a cost model (catalogue.CostModel): a checkpoint of predicted
// image size S costs InterceptMs + AlphaMsPerMiB x S to restore, a cold start ColdStartMs, and
// the empty checkpoint's image is EmptyMiB.
type Model struct {
	InterceptMs, AlphaMsPerMiB, ColdStartMs, EmptyMiB float64
}

// RestoreMs returns the predicted restore time of an image of imageMiB.
func (m Model) RestoreMs(imageMiB float64) float64 {
	return m.InterceptMs + m.AlphaMsPerMiB*imageMiB
}

// Module is what pricing needs of one analysed module (catalogue.Module): whether it imports,
// its own figures and its closure.
type Module struct {
	Available     bool
	OwnMs, OwnMiB float64
	Closure       []string
}

// Index is the analysed modules compiled for pricing: positions, own figures and transitive
// closures as Sets. Pricing a start (Pricer) is then a few word operations per module.
type Index struct {
	pricer      Pricer
	names       []string
	pos         map[string]int
	ownMs       []float64
	ownMiB      []float64
	closure     []Set
	unavailable map[string]bool
	words       int
}

// MaxModules bounds an index: sets are bitsets over the modules, one per module for closures.
const MaxModules = 16384

// NewIndex compiles modules (keyed by name) under model. The caller has checked the names and
// figures (catalogue.Module.Validate, catalogue.CostModel.Validate); every closure member must
// be an available module of the map; closures are made transitive and hold their module.
func NewIndex(modules map[string]Module, model Model) (*Index, error) {
	if len(modules) > MaxModules {
		return nil, fmt.Errorf("%d modules: at most %d", len(modules), MaxModules)
	}
	var problems []error
	x := &Index{pos: map[string]int{}, unavailable: map[string]bool{}}
	x.pricer = Pricer{x: x, model: model}
	names := make([]string, 0, len(modules))
	for name := range modules {
		names = append(names, name)
	}
	slices.Sort(names)
	for _, name := range names {
		m := modules[name]
		if !m.Available {
			x.unavailable[name] = true
			continue
		}
		x.pos[name] = len(x.names)
		x.names = append(x.names, name)
		x.ownMs = append(x.ownMs, m.OwnMs)
		x.ownMiB = append(x.ownMiB, m.OwnMiB)
	}
	x.words = (len(x.names) + 63) / 64
	x.closure = make([]Set, len(x.names))
	for i, name := range x.names {
		c := x.NewSet()
		c.Add(i)
		for _, member := range modules[name].Closure {
			j, ok := x.pos[member]
			if !ok {
				problems = append(problems, fmt.Errorf("module %s: closure member %q is not an available module of the analysis", name, member))
				continue
			}
			c.Add(j)
		}
		x.closure[i] = c
	}
	if len(problems) > 0 {
		return nil, errors.Join(problems...)
	}
	makeTransitive(x.closure)
	return x, nil
}

// makeTransitive adds to each closure the closures of its members, since a member's closure is
// loaded too. It iterates to a fixed point: a few rounds; closures measured in one sandbox are
// already transitive.
func makeTransitive(closure []Set) {
	for changed := true; changed; {
		changed = false
		for i := range closure {
			for _, j := range closure[i].Members() {
				if !closure[j].SubsetOf(closure[i]) {
					closure[i].Or(closure[j])
					changed = true
				}
			}
		}
	}
}

// Pricer prices starts over the index's modules under the cost model it was made with.
func (x *Index) Pricer() *Pricer { return &x.pricer }

// Len returns the number of available modules.
func (x *Index) Len() int { return len(x.names) }

// Name returns the module at position i.
func (x *Index) Name(i int) string { return x.names[i] }

// Position returns the position of an available module.
func (x *Index) Position(module string) (int, bool) {
	i, ok := x.pos[module]
	return i, ok
}

// Unavailable reports whether the analysis found that module does not import.
func (x *Index) Unavailable(module string) bool { return x.unavailable[module] }

// Resolve returns the longest prefix of name (as written in code: a module, or a name imported
// from one) that is an analysed module, available or not; ok is false when none is.
func (x *Index) Resolve(name string) (module string, ok bool) {
	return LongestPrefix(name, func(prefix string) bool {
		_, known := x.pos[prefix]
		return known || x.unavailable[prefix]
	})
}

// LongestPrefix returns the longest of name's dotted prefixes (name itself included) that
// known holds: the module a name as written in code (pandas.DataFrame) comes from. ok is false
// when none is known.
func LongestPrefix(name string, known func(string) bool) (module string, ok bool) {
	for prefix := name; ; {
		if known(prefix) {
			return prefix, true
		}
		dot := strings.LastIndexByte(prefix, '.')
		if dot < 0 {
			return "", false
		}
		prefix = prefix[:dot]
	}
}

// OwnMs returns the own import time of the module at position i.
func (x *Index) OwnMs(i int) float64 { return x.ownMs[i] }

// OwnMiB returns the own memory of the module at position i.
func (x *Index) OwnMiB(i int) float64 { return x.ownMiB[i] }

// NewSet returns an empty set sized for the index.
func (x *Index) NewSet() Set { return make(Set, x.words) }

// Closure returns the transitive closure of the module at position i, itself included. The caller
// must not change it.
func (x *Index) Closure(i int) Set { return x.closure[i] }

// Load returns what importing the modules at positions leaves loaded: their closures' union.
func (x *Index) Load(positions ...int) Set {
	s := x.NewSet()
	for _, i := range positions {
		s.Or(x.closure[i])
	}
	return s
}

// Names returns the modules of s, sorted.
func (x *Index) Names(s Set) []string {
	out := []string{}
	for _, i := range s.Members() {
		out = append(out, x.names[i])
	}
	return out
}

// Pricer prices the ways to start a request under a cost model, over the modules of an Index
// (Index.Pricer). Its Cost is the one pricing rule of both the planner and the router.
type Pricer struct {
	x     *Index
	model Model
}

// Model returns the pricer's cost model.
func (p *Pricer) Model() Model { return p.model }

// ImageMiB returns the predicted image size of a checkpoint holding loaded: the empty checkpoint
// plus the own memory of each loaded module, each counted once.
func (p *Pricer) ImageMiB(loaded Set) float64 {
	mib := p.model.EmptyMiB
	for _, i := range loaded.Members() {
		mib += p.x.ownMiB[i]
	}
	return mib
}

// ImportMs returns the time to import need on a start that already holds loaded: the own import
// times of the modules of need that loaded lacks, each counted once.
func (p *Pricer) ImportMs(need, loaded Set) float64 {
	ms, _ := p.importMsBelow(need, loaded, math.Inf(1))
	return ms
}

// importMsBelow returns ImportMs when that is below limit (ok); otherwise it stops adding as soon as
// the sum reaches limit. Own times are >= 0, so a partial sum never exceeds the whole.
func (p *Pricer) importMsBelow(need, loaded Set, limit float64) (ms float64, ok bool) {
	for w, word := range need {
		for m := word &^ loaded[w]; m != 0; m &= m - 1 {
			ms += p.x.ownMs[w<<6+trailingZeros(m)]
			if ms >= limit {
				return ms, false
			}
		}
	}
	return ms, true
}

// Option is one way to start a request: its fixed cost (a restore, or a cold start) and the
// modules it holds when it answers.
type Option struct {
	FixedMs float64
	Loaded  Set
}

// ColdOption returns a cold start: nothing loaded beyond the interpreter.
func (p *Pricer) ColdOption() Option {
	return Option{FixedMs: p.model.ColdStartMs, Loaded: p.x.NewSet()}
}

// PredictedOption returns a checkpoint holding loaded, priced by the cost model on its predicted size.
func (p *Pricer) PredictedOption(loaded Set) Option {
	return Option{FixedMs: p.model.RestoreMs(p.ImageMiB(loaded)), Loaded: loaded}
}

// Cost returns the start cost of a request that needs need (a closed set: see Load) on o: its fixed
// cost plus the import of what it lacks. This is the one pricing rule of both the planner and
// the router.
func (p *Pricer) Cost(o Option, need Set) float64 { return o.FixedMs + p.ImportMs(need, o.Loaded) }

// CostBelow returns Cost when that is below limit (ok true), and ok false otherwise: pricing stops
// as soon as the cost reaches limit, which saves a planner most of the work of options that
// cannot beat what a request already has. When ok, the cost is exactly Cost's.
func (p *Pricer) CostBelow(o Option, need Set, limit float64) (float64, bool) {
	if o.FixedMs >= limit {
		return o.FixedMs, false
	}
	ms, ok := p.importMsBelow(need, o.Loaded, limit-o.FixedMs)
	return o.FixedMs + ms, ok && o.FixedMs+ms < limit
}

// Best returns the cheapest of options for need: its position and cost. Ties go to the earliest
// option, so the caller's order decides them. It returns -1 when options is empty.
func (p *Pricer) Best(options []Option, need Set) (int, float64) {
	best, bestMs := -1, math.Inf(1)
	for i, o := range options {
		if ms := p.Cost(o, need); ms < bestMs {
			best, bestMs = i, ms
		}
	}
	return best, bestMs
}
