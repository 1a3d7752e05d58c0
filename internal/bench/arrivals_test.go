package bench

import (
	"math"
	"testing"
	"time"

	"readie.dev/pipeline/internal/testenv"
	"readie.dev/pipeline/pkg/catalogue"
)

// TestDrawArrivals: the arrivals are the same for the same seed (both runs of one bench, and
// run to run), in order, within the duration, about rate x duration of them, each request
// drawn as often as its weight says; another seed draws others.
func TestDrawArrivals(t *testing.T) {
	trials := []corpusTrial{{req: CorpusRequest{Choice: "pandas"}, weight: 3, dir: "/p"}, {req: CorpusRequest{Choice: Cold}, weight: 1}}
	o := ArrivalsOptions{RatePerSec: 10, Duration: 100 * time.Second, Seed: 36}
	a, b := drawArrivals(o, trials), drawArrivals(o, trials)
	if len(a) != len(b) || len(a) < 800 || len(a) > 1200 {
		t.Fatalf("%d and %d arrivals, want the same number, about 1000", len(a), len(b))
	}
	picked := map[string]int{}
	for i := range a {
		if a[i].at != b[i].at || a[i].trial != b[i].trial || a[i].at >= o.Duration || i > 0 && a[i].at < a[i-1].at {
			t.Fatalf("arrival %d: %v (%s) and %v (%s)", i, a[i].at, a[i].trial.req.Choice, b[i].at, b[i].trial.req.Choice)
		}
		picked[a[i].trial.req.Choice]++
	}
	if share := float64(picked["pandas"]) / float64(len(a)); math.Abs(share-0.75) > 0.05 {
		t.Errorf("pandas drawn %v of the time, want its weight's 0.75", share)
	}
	o.Seed = 37
	if c := drawArrivals(o, trials); len(c) == len(a) && c[0].at == a[0].at {
		t.Errorf("another seed drew the same arrivals")
	}
}

// TestWarmDemand: each checkpoint the requests start on gets its share of the rate by weight,
// a cold start none; a checkpoint whose memory the catalogue lacks is left out.
func TestWarmDemand(t *testing.T) {
	cat := &catalogue.Catalogue{CostModel: catalogue.CostModel{InterceptMs: 100, AlphaMsPerMiB: 2, ColdStartMs: 900},
		Checkpoints: []catalogue.Checkpoint{{ID: "pandas", ImageMiB: 40, ResidentBytes: 150 << 20, OwnBytes: 100 << 20}, {ID: "numpy", ImageMiB: 20}, {ID: "idle", ImageMiB: 5, ResidentBytes: 1, OwnBytes: 1}}}
	trials := []corpusTrial{
		{req: CorpusRequest{Choice: "pandas"}, weight: 3, dir: "/p"},
		{req: CorpusRequest{Choice: "numpy"}, weight: 1, dir: "/n"},
		{req: CorpusRequest{Choice: Cold}, weight: 4},
	}
	got := warmDemand(cat, trials, 2, testenv.DiscardLog())
	if len(got) != 1 || got[0].Set != "pandas" || got[0].RatePerSec != 2*3.0/8 || got[0].SavingMs != 180 || got[0].RefillMs != 180 || got[0].OwnBytes != 100<<20 {
		t.Errorf("demand %+v, want pandas alone at 0.75 a second, 180 ms, 100 MiB", got)
	}
}

func TestQuantile(t *testing.T) {
	sorted := []float64{1, 2, 3, 4, 5, 6, 7, 8, 9, 10}
	for q, want := range map[float64]float64{0.5: 5, 0.9: 9, 0.99: 10, 0: 1} {
		if got := quantile(sorted, q); got != want {
			t.Errorf("quantile %v = %v, want %v", q, got, want)
		}
	}
}
