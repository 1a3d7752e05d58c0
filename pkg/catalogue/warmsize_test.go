package catalogue

import (
	"math"
	"strings"
	"testing"
)

const mib = 1 << 20

// TestSizeWarm: rates and a budget to pool sizes. Two sets of equal memory and saving, one
// asked ten times as often, share a budget of three sandboxes: the busy set gets more; a
// budget of zero keeps none; a set whose one sandbox is larger than the budget gets none, and
// says why, while the others still fit; a set nobody asks for gets none.
func TestSizeWarm(t *testing.T) {
	demand := []WarmDemand{
		{Set: "pandas", RatePerSec: 2, SavingMs: 200, RefillMs: 1000, ResidentBytes: 100 * mib},
		{Set: "json", RatePerSec: 0.2, SavingMs: 200, RefillMs: 1000, ResidentBytes: 100 * mib},
		{Set: "torch", RatePerSec: 5, SavingMs: 2000, RefillMs: 1000, ResidentBytes: 1000 * mib},
		{Set: "idle", RatePerSec: 0, SavingMs: 200, RefillMs: 1000, ResidentBytes: 10 * mib},
	}
	got, err := SizeWarm(demand, 300*mib)
	if err != nil {
		t.Fatal(err)
	}
	sizes := got.Sizes()
	if sizes["pandas"] <= sizes["json"] || sizes["pandas"]+sizes["json"] != 3 || sizes["torch"] != 0 || sizes["idle"] != 0 {
		t.Errorf("sizes %v, want pandas more than json, 3 in all, none of torch or idle", sizes)
	}
	if got.MemoryBytes > got.BudgetBytes || got.MemoryBytes != 300*mib {
		t.Errorf("memory %d of a budget of %d, want all of it", got.MemoryBytes, got.BudgetBytes)
	}
	for _, s := range got.Sets {
		switch s.Set {
		case "torch":
			if !strings.Contains(s.Why, "does not fit") {
				t.Errorf("torch's why %q, want that it does not fit", s.Why)
			}
		case "pandas":
			// B(n, 2) for n sandboxes: the hit rate is 1 - B.
			if want := 1 - erlangB(s.Size, 2); math.Abs(s.HitRate-want) > 1e-12 || s.HitRate <= 0 || s.HitRate >= 1 {
				t.Errorf("pandas hit rate %v, want %v", s.HitRate, want)
			}
		}
	}

	none, err := SizeWarm(demand, 0)
	if err != nil {
		t.Fatal(err)
	}
	if len(none.Sizes()) != 0 || none.MemoryBytes != 0 || none.SavedMsPerSec != 0 {
		t.Errorf("a budget of zero: %+v, want no warm sandbox", none)
	}

	// With room for torch, its saving per byte (5 x 2000 / 1000 MiB) beats json's first (0.2 x
	// 200 x 0.83 / 100 MiB): torch is kept.
	big, err := SizeWarm(demand, 1300*mib)
	if err != nil {
		t.Fatal(err)
	}
	if big.Sizes()["torch"] != 1 {
		t.Errorf("sizes %v with 1300 MiB, want torch kept", big.Sizes())
	}

	// A budget with room for everything keeps no sandbox that would catch less than 1% of its
	// set's requests: pandas (load 2) stops where the next would add less.
	huge, err := SizeWarm(demand[:1], 1<<40)
	if err != nil {
		t.Fatal(err)
	}
	n := huge.Sizes()["pandas"]
	if n == 0 || n >= maxWarmPerSet || erlangB(n, 2)-erlangB(n+1, 2) >= minHitGain || erlangB(n-1, 2)-erlangB(n, 2) < minHitGain {
		t.Errorf("pandas with a huge budget: %d warm, want the last that catches 1%% or more", n)
	}
}

// TestSizeWarmRefusesBadInput: an unmeasured memory, a negative budget, a set named twice and
// a rate that is not a number are refused, each named.
func TestSizeWarmRefusesBadInput(t *testing.T) {
	for name, c := range map[string]struct {
		demand []WarmDemand
		budget int64
		want   string
	}{
		"unmeasured": {[]WarmDemand{{Set: "a", RatePerSec: 1, SavingMs: 1, ResidentBytes: 0}}, mib, "set a: resident memory 0"},
		"budget":     {nil, -1, "a memory budget of -1"},
		"twice":      {[]WarmDemand{{Set: "a", ResidentBytes: 1}, {Set: "a", ResidentBytes: 1}}, mib, "set a named twice"},
		"nan":        {[]WarmDemand{{Set: "a", RatePerSec: math.NaN(), ResidentBytes: 1}}, mib, "set a: rate NaN"},
	} {
		if _, err := SizeWarm(c.demand, c.budget); err == nil || !strings.Contains(err.Error(), c.want) {
			t.Errorf("%s: %v, want an error with %q", name, err, c.want)
		}
	}
}

// TestErlangB: the loss formula's known values.
func TestErlangB(t *testing.T) {
	for _, c := range []struct {
		n    int
		load float64
		want float64
	}{{0, 3, 1}, {1, 1, 0.5}, {2, 1, 0.2}, {1, 0, 0}, {3, 2, 4.0 / 19}} {
		if got := erlangB(c.n, c.load); math.Abs(got-c.want) > 1e-12 {
			t.Errorf("B(%d, %v) = %v, want %v", c.n, c.load, got, c.want)
		}
	}
}
