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
			// n sandboxes at a load of 2 on one refiller.
			if want := warmHitRate(s.Size, 2); math.Abs(s.HitRate-want) > 1e-12 || s.HitRate <= 0 || s.HitRate >= 1 {
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

	// With room for torch, its saving per byte (5 x 2000 x 1/6 / 1000 MiB) beats pandas' first
	// (2 x 200 x 1/3 / 100 MiB): torch is kept.
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
	if n == 0 || n >= maxWarmPerSet || warmHitRate(n+1, 2)-warmHitRate(n, 2) >= minHitGain || warmHitRate(n, 2)-warmHitRate(n-1, 2) < minHitGain {
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

// TestWarmHitRate: the one-refiller hit rate's known values: none without a sandbox, every
// request without load, n/(n+1) at a load of 1, and at a load of 2 never more than the
// refiller supplies (1/2), however many sandboxes.
func TestWarmHitRate(t *testing.T) {
	for _, c := range []struct {
		n    int
		load float64
		want float64
	}{{0, 3, 0}, {1, 0, 1}, {1, 1, 0.5}, {3, 1, 0.75}, {1, 2, 1.0 / 3}, {2, 2, 3.0 / 7}, {5, 2, 31.0 / 63}, {2, 0.5, 0.75 / 0.875}, {64, 1e6, 1e-6}} {
		if got := warmHitRate(c.n, c.load); math.Abs(got-c.want) > 1e-12 {
			t.Errorf("warmHitRate(%d, %v) = %v, want %v", c.n, c.load, got, c.want)
		}
	}
}

// refillLoadOf is the sum over sets of rate x hit rate x refill: the share of the one
// refiller the sizing's hits take.
func refillLoadOf(t *testing.T, demand []WarmDemand, got WarmSizing) float64 {
	t.Helper()
	load := 0.0
	for _, s := range got.Sets {
		for _, d := range demand {
			if d.Set == s.Set {
				load += d.RatePerSec * s.HitRate * d.RefillMs / 1000
			}
		}
	}
	if math.Abs(load-got.RefillLoad) > 1e-9 {
		t.Errorf("refill load %v, the sets' hits imply %v", got.RefillLoad, load)
	}
	return load
}

// TestSizeWarmRefillCapacity: a set asked twice per refill (rate 2 a second, refill 1 s) with
// room for 5 sandboxes: n parallel refills would catch 96% of its requests with 5, but the
// pool's one refiller supplies one sandbox a second, half of the requests at most: the
// predicted hit rate stays under 1/2, the refill load under 1.
func TestSizeWarmRefillCapacity(t *testing.T) {
	demand := []WarmDemand{{Set: "pandas", RatePerSec: 2, SavingMs: 300, RefillMs: 1000, ResidentBytes: 100 * mib}}
	got, err := SizeWarm(demand, 5*100*mib)
	if err != nil {
		t.Fatal(err)
	}
	s := got.Sets[0]
	if s.Size == 0 || s.HitRate <= 0 || s.HitRate > 0.5 || s.HitRate != warmHitRate(s.Size, 2) {
		t.Errorf("%d warm, hit rate %v: want some, at most 1/2 (one refill a second for 2 requests a second)", s.Size, s.HitRate)
	}
	if load := refillLoadOf(t, demand, got); load > 1 {
		t.Errorf("refill load %v, more than the one refiller", load)
	}
	if want := 2 * 300 * s.HitRate; math.Abs(got.SavedMsPerSec-want) > 1e-9 {
		t.Errorf("saved %v ms a second, want %v", got.SavedMsPerSec, want)
	}
}

// TestSizeWarmSharedRefiller: two sets each asked 1.5 times per refill, one saving ten times
// the other's, room for ten sandboxes of each: the one refiller cannot refill both, so the
// sandboxes go to the set that saves more until its refills fill the refiller; the other gets
// none and says it is the refiller, and the sizing says it stopped for it. Two light sets
// (0.2 per refill each) both get sandboxes: the refiller has room for both.
func TestSizeWarmSharedRefiller(t *testing.T) {
	demand := []WarmDemand{
		{Set: "torch", RatePerSec: 1.5, SavingMs: 2000, RefillMs: 1000, ResidentBytes: 100 * mib},
		{Set: "json", RatePerSec: 1.5, SavingMs: 200, RefillMs: 1000, ResidentBytes: 100 * mib},
	}
	got, err := SizeWarm(demand, 20*100*mib)
	if err != nil {
		t.Fatal(err)
	}
	sizes := got.Sizes()
	if sizes["torch"] == 0 || sizes["json"] != 0 {
		t.Errorf("sizes %v, want torch's only", sizes)
	}
	if load := refillLoadOf(t, demand, got); load > 1 || load < 0.9 {
		t.Errorf("refill load %v, want near 1 and not past it", load)
	}
	for _, s := range got.Sets {
		if s.HitRate > 1/1.5 {
			t.Errorf("%s: hit rate %v, more than the refiller supplies (1/1.5)", s.Set, s.HitRate)
		}
		if s.Set == "json" && !strings.Contains(s.Why, "refiller") {
			t.Errorf("json's why %q, want the refiller", s.Why)
		}
	}
	if !strings.Contains(got.Why, "refill load") || !strings.Contains(got.Why, "one restore at a time") {
		t.Errorf("the sizing's why %q, want that it stopped for the refiller", got.Why)
	}

	light := []WarmDemand{
		{Set: "a", RatePerSec: 0.2, SavingMs: 200, RefillMs: 1000, ResidentBytes: 100 * mib},
		{Set: "b", RatePerSec: 0.2, SavingMs: 100, RefillMs: 1000, ResidentBytes: 100 * mib},
	}
	both, err := SizeWarm(light, 20*100*mib)
	if err != nil {
		t.Fatal(err)
	}
	if sizes := both.Sizes(); sizes["a"] == 0 || sizes["b"] == 0 || both.Why != "" {
		t.Errorf("light sets: sizes %v, why %q: want both kept, nothing stopped", sizes, both.Why)
	}
	if load := refillLoadOf(t, light, both); load > 1 {
		t.Errorf("light sets: refill load %v", load)
	}
}

// TestSizeWarmZeroBudget: a budget of zero keeps no sandbox, predicts no hit and no refill,
// and says of each set with requests that its sandbox does not fit, not that the refiller is
// busy.
func TestSizeWarmZeroBudget(t *testing.T) {
	demand := []WarmDemand{
		{Set: "pandas", RatePerSec: 2, SavingMs: 300, RefillMs: 1000, ResidentBytes: 100 * mib},
		{Set: "json", RatePerSec: 0.1, SavingMs: 100, RefillMs: 500, ResidentBytes: 40 * mib},
	}
	got, err := SizeWarm(demand, 0)
	if err != nil {
		t.Fatal(err)
	}
	if len(got.Sizes()) != 0 || got.MemoryBytes != 0 || got.SavedMsPerSec != 0 || got.RefillLoad != 0 || got.Why != "" {
		t.Errorf("a budget of zero: %+v, want no warm sandbox, no refill", got)
	}
	for _, s := range got.Sets {
		if s.HitRate != 0 || !strings.Contains(s.Why, "does not fit the budget") {
			t.Errorf("%s: hit rate %v, why %q: want none, and that it does not fit", s.Set, s.HitRate, s.Why)
		}
	}
}

// TestSizeWarmSetDoesNotFit: a set whose one sandbox is larger than the budget gets none and
// says so; a set that fits the memory but whose refills do not fit beside a busier set's gets
// none and says it is the refiller, not the budget; the budget left is not spent on it.
func TestSizeWarmSetDoesNotFit(t *testing.T) {
	demand := []WarmDemand{
		{Set: "pandas", RatePerSec: 1, SavingMs: 1000, RefillMs: 1000, ResidentBytes: 100 * mib},
		{Set: "numpy", RatePerSec: 1.5, SavingMs: 500, RefillMs: 1000, ResidentBytes: 100 * mib},
		{Set: "torch", RatePerSec: 5, SavingMs: 5000, RefillMs: 1000, ResidentBytes: 1000 * mib},
	}
	got, err := SizeWarm(demand, 3*100*mib)
	if err != nil {
		t.Fatal(err)
	}
	if sizes := got.Sizes(); sizes["pandas"] == 0 || sizes["numpy"] != 0 || sizes["torch"] != 0 {
		t.Errorf("sizes %v, want pandas' only", sizes)
	}
	for _, s := range got.Sets {
		switch s.Set {
		case "torch":
			if !strings.Contains(s.Why, "does not fit the budget") {
				t.Errorf("torch's why %q, want that it does not fit the budget", s.Why)
			}
		case "numpy":
			if !strings.Contains(s.Why, "refiller") || strings.Contains(s.Why, "budget") {
				t.Errorf("numpy's why %q, want the refiller, not the budget", s.Why)
			}
		}
	}
	if load := refillLoadOf(t, demand, got); load > 1 {
		t.Errorf("refill load %v", load)
	}
}
