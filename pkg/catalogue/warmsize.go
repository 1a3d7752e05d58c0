package catalogue

import (
	"errors"
	"fmt"
	"math"
	"slices"
	"sort"
)

// WarmDemand is what sizing a set's warm pool needs to know of it.
type WarmDemand struct {
	Set string
	// RatePerSec is how many requests a second start on the set (a router's choices, from a
	// corpus or counted live).
	RatePerSec float64
	// SavingMs is what a warm sandbox saves a start: its price without one (a restore, from a
	// pool or not) less the warm path's.
	SavingMs float64
	// RefillMs is how long a taken warm sandbox takes to be replaced (a restore off the
	// request path): while every one of a set's is being replaced, its requests miss.
	RefillMs float64
	// ResidentBytes is what one warm sandbox of the set holds in memory, restored and idle.
	ResidentBytes int64
}

// WarmSize is one set's warm pool as SizeWarm chose it.
type WarmSize struct {
	Set  string `json:"set"`
	Size int    `json:"size"`
	// HitRate is the predicted share of the set's requests that find a warm sandbox ready.
	HitRate float64 `json:"hit_rate"`
	// SavedMsPerSec is the predicted start time saved a second: rate x saving x hit rate.
	SavedMsPerSec float64 `json:"saved_ms_per_sec"`
	MemoryBytes   int64   `json:"memory_bytes"`
	// Why says why a set with requests got no warm sandbox ("" otherwise).
	Why string `json:"why,omitempty"`
}

// WarmSizing is the warm pools SizeWarm chose under a memory budget.
type WarmSizing struct {
	BudgetBytes int64      `json:"budget_bytes"`
	MemoryBytes int64      `json:"memory_bytes"`
	Sets        []WarmSize `json:"sets"`
	// SavedMsPerSec is the sum of the sets': divided by the total rate, the mean start saved.
	SavedMsPerSec float64 `json:"saved_ms_per_sec"`
	// RefillLoad is the share of the pool's one refiller the kept sandboxes' refills take: the
	// sum over sets of rate x hit rate x refill, at most 1.
	RefillLoad float64 `json:"refill_load"`
	// Why says why the sizing stopped short of the budget for want of refills ("" otherwise).
	Why string `json:"why,omitempty"`
}

// Sizes returns the pool sizes by set, the sets of size 0 left out (pool.WarmOptions.Sizes).
func (w WarmSizing) Sizes() map[string]int {
	out := map[string]int{}
	for _, s := range w.Sets {
		if s.Size > 0 {
			out[s.Set] = s.Size
		}
	}
	return out
}

// maxWarmPerSet bounds one set's pool: past it a further sandbox saves nothing measurable.
const maxWarmPerSet = 64

// minHitGain is the least share of a set's requests a further warm sandbox must catch to be
// kept: below it, the memory buys almost nothing.
const minHitGain = 0.01

// SizeWarm sizes the warm pools of the sets within budgetBytes to minimise the expected start:
// a set's warm sandboxes are worth its rate x its saving x the share of its requests they
// catch, and each costs its resident memory. pool.Warm replaces taken sandboxes one restore at
// a time, for all sets: a set's n warm sandboxes are n places in front of one refiller, which
// supplies at most one sandbox per refill, so its hit rate is warmHitRate(n, rate x refill)
// (at most 1/(rate x refill)), and the sets' refills share that refiller: the sum over sets of
// rate x hit rate x refill cannot exceed 1. Each further sandbox of a set catches fewer
// requests than the one before; the sizing adds, one at a time, the sandbox that saves the most
// per byte (up to the last that fits), keeps none that would catch less than 1% of its set's
// requests, and none whose refills would take the summed refill load past 1: there it stops,
// and says so (Why). A set whose one sandbox does not fit the budget gets none, with why; a
// budget of zero keeps none.
func SizeWarm(demand []WarmDemand, budgetBytes int64) (WarmSizing, error) {
	if budgetBytes < 0 {
		return WarmSizing{}, fmt.Errorf("warm sizing: a memory budget of %d bytes", budgetBytes)
	}
	seen := map[string]bool{}
	var problems []error
	for _, d := range demand {
		switch {
		case d.Set == "":
			problems = append(problems, errors.New("a set without a name"))
		case seen[d.Set]:
			problems = append(problems, fmt.Errorf("set %s named twice", d.Set))
		case !finiteNonNegative(d.RatePerSec) || !finiteNonNegative(d.SavingMs) || !finiteNonNegative(d.RefillMs):
			problems = append(problems, fmt.Errorf("set %s: rate %v, saving %v ms, refill %v ms: each must be finite and >= 0", d.Set, d.RatePerSec, d.SavingMs, d.RefillMs))
		case d.ResidentBytes <= 0:
			problems = append(problems, fmt.Errorf("set %s: resident memory %d bytes: not measured (capture measures it)", d.Set, d.ResidentBytes))
		}
		seen[d.Set] = true
	}
	if len(problems) > 0 {
		return WarmSizing{}, fmt.Errorf("warm sizing: %w", errors.Join(problems...))
	}
	out := WarmSizing{BudgetBytes: budgetBytes, Sets: make([]WarmSize, len(demand))}
	for i, d := range demand {
		out.Sets[i].Set = d.Set
	}
	// refillLoad returns the share of the refiller set i's refills take with n warm sandboxes.
	refillLoad := func(i, n int) float64 {
		a := demand[i].offeredLoad()
		return a * warmHitRate(n, a)
	}
	load := 0.0 // the kept sandboxes' refill load
	// overloads marks the sets whose next sandbox was refused for the refiller: for good, as
	// the load only grows.
	overloads := make([]bool, len(demand))
	left := budgetBytes
	for {
		best, bestPerByte, bestLoad := -1, 0.0, 0.0
		for i, d := range demand {
			n := out.Sets[i].Size
			if d.ResidentBytes > left || n >= maxWarmPerSet {
				continue
			}
			a := d.offeredLoad()
			caught := warmHitRate(n+1, a) - warmHitRate(n, a)
			if caught < minHitGain || d.RatePerSec*d.SavingMs == 0 {
				continue
			}
			with := load - refillLoad(i, n) + refillLoad(i, n+1)
			if with > 1+1e-9 { // a load of 1 in rounding fits
				overloads[i] = true
				continue
			}
			if perByte := d.RatePerSec * d.SavingMs * caught / float64(d.ResidentBytes); perByte > bestPerByte {
				best, bestPerByte, bestLoad = i, perByte, with
			}
		}
		if best < 0 {
			break
		}
		out.Sets[best].Size++
		left -= demand[best].ResidentBytes
		load = bestLoad
	}
	out.RefillLoad = load
	if slices.Contains(overloads, true) {
		out.Why = fmt.Sprintf("stopped at a refill load of %.2f: pool.Warm refills one restore at a time for all sets, and a further warm sandbox's refills would need more than that one refiller supplies", load)
	}
	for i, d := range demand {
		s := &out.Sets[i]
		s.HitRate = warmHitRate(s.Size, d.offeredLoad())
		s.SavedMsPerSec = d.RatePerSec * d.SavingMs * s.HitRate
		s.MemoryBytes = int64(s.Size) * d.ResidentBytes
		out.MemoryBytes += s.MemoryBytes
		out.SavedMsPerSec += s.SavedMsPerSec
		if s.Size == 0 && d.RatePerSec > 0 && d.SavingMs > 0 {
			switch {
			case d.ResidentBytes > budgetBytes:
				s.Why = fmt.Sprintf("one warm sandbox (%d bytes) does not fit the budget (%d bytes)", d.ResidentBytes, budgetBytes)
			case overloads[i]:
				s.Why = fmt.Sprintf("its refills do not fit the one refiller (one restore at a time), %.0f%% busy with the kept pools'", 100*load)
			default:
				s.Why = "the budget is spent on sets that save more per byte"
			}
		}
	}
	sort.SliceStable(out.Sets, func(a, b int) bool { return out.Sets[a].Set < out.Sets[b].Set })
	return out, nil
}

// offeredLoad is the set's rate x refill: the refills a second its requests would ask for if
// each found a warm sandbox, in refill times.
func (d WarmDemand) offeredLoad() float64 { return d.RatePerSec * d.RefillMs / 1000 }

// warmHitRate is the share of a set's requests that find one of its n warm sandboxes ready
// when one refiller replaces them one at a time, at an offered load of load (Poisson arrivals,
// load = rate x refill, refills taken as exponential): the sandboxes missing, k of n, go up
// with each hit and down with each refill, so P(k) is proportional to load^k and a request
// misses when all n are missing. The hit rate is (1 - load^n) / (1 - load^(n+1)), n/(n+1) at
// a load of 1; the hits it implies, rate x hit rate, never exceed the refiller's 1/refill.
func warmHitRate(n int, load float64) float64 {
	switch {
	case n <= 0:
		return 0
	case math.Abs(load-1) < 1e-9:
		return float64(n) / float64(n+1)
	case load > 1: // in powers of 1/load, which cannot overflow
		r := 1 / load
		return (math.Pow(r, float64(n+1)) - r) / (math.Pow(r, float64(n+1)) - 1)
	}
	return (1 - math.Pow(load, float64(n))) / (1 - math.Pow(load, float64(n+1)))
}
