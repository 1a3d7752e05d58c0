package catalogue

import (
	"errors"
	"fmt"
	"math"
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
// kept: below it, the memory buys almost nothing (B(n) falls faster than geometrically).
const minHitGain = 0.01

// SizeWarm sizes the warm pools of the sets within budgetBytes to minimise the expected start:
// a set's warm sandboxes are worth its rate x its saving x the share of its requests they
// catch, and each costs its resident memory. A set's n warm sandboxes, each replaced RefillMs
// after it is taken, miss a request when all n are being replaced: with Poisson arrivals that
// is Erlang's loss formula B(n, rate x refill), so each further sandbox is worth less than
// the one before, and adding, one at a time, the sandbox that saves the most per byte is the
// best use of the budget (up to the last sandbox that fits); a sandbox that would catch less
// than 1% of its set's requests is not kept. A set whose one sandbox does not
// fit the budget gets none, with why; a budget of zero keeps none.
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
	// gain returns what set i's next sandbox saves a second.
	gain := func(i int) float64 {
		d, n := demand[i], out.Sets[i].Size
		if n >= maxWarmPerSet {
			return 0
		}
		load := d.RatePerSec * d.RefillMs / 1000
		caught := erlangB(n, load) - erlangB(n+1, load)
		if caught < minHitGain {
			return 0
		}
		return d.RatePerSec * d.SavingMs * caught
	}
	for i, d := range demand {
		out.Sets[i].Set = d.Set
	}
	left := budgetBytes
	for {
		best, bestPerByte := -1, 0.0
		for i, d := range demand {
			if d.ResidentBytes > left {
				continue
			}
			if perByte := gain(i) / float64(d.ResidentBytes); perByte > bestPerByte {
				best, bestPerByte = i, perByte
			}
		}
		if best < 0 {
			break
		}
		out.Sets[best].Size++
		left -= demand[best].ResidentBytes
	}
	for i, d := range demand {
		s := &out.Sets[i]
		load := d.RatePerSec * d.RefillMs / 1000
		s.HitRate = 1 - erlangB(s.Size, load)
		s.SavedMsPerSec = d.RatePerSec * d.SavingMs * s.HitRate
		s.MemoryBytes = int64(s.Size) * d.ResidentBytes
		out.MemoryBytes += s.MemoryBytes
		out.SavedMsPerSec += s.SavedMsPerSec
		if s.Size == 0 && d.RatePerSec > 0 && d.SavingMs > 0 {
			s.Why = "the budget is spent on sets that save more per byte"
			if d.ResidentBytes > budgetBytes {
				s.Why = fmt.Sprintf("one warm sandbox (%d bytes) does not fit the budget (%d bytes)", d.ResidentBytes, budgetBytes)
			}
		}
	}
	sort.SliceStable(out.Sets, func(a, b int) bool { return out.Sets[a].Set < out.Sets[b].Set })
	return out, nil
}

// erlangB is the share of arrivals that find all n servers busy at an offered load of load
// (Poisson arrivals, load = rate x holding time): B(0) = 1, B(n) = load B(n-1) / (n + load
// B(n-1)).
func erlangB(n int, load float64) float64 {
	b := 1.0
	for k := 1; k <= n; k++ {
		b = load * b / (float64(k) + load*b)
	}
	if math.IsNaN(b) {
		return 1
	}
	return b
}
