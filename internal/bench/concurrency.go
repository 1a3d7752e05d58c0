package bench

import (
	"context"
	"fmt"
	"slices"
	"sync"
	"time"

	"readie.dev/pipeline/pkg/launch"
	"readie.dev/pipeline/pkg/measure"
	"readie.dev/pipeline/pkg/pycall"
)

// Concurrent is K restores of one checkpoint started at the same moment, with one variant's
// restore flags, over every round.
type Concurrent struct {
	Set         string `json:"set"`
	Series      string `json:"series"`
	Concurrency int    `json:"concurrency"`
	// Latency is each restore from the barrier's release to its answer, all rounds together.
	Latency Stats `json:"latency_ms"`
	// Throughput is restores per second of each round's batch (K over the time from the
	// release to the last answer): median over rounds.
	Throughput float64   `json:"restores_per_second"`
	Batches    []float64 `json:"batch_restores_per_second"`
	// SpreadMS is how far apart the K restores started after the release, worst round.
	SpreadMS float64 `json:"start_spread_ms"`
}

// batch runs k restores of imageDir, prepared off the clock, released together by closing one
// channel, each timed from its start to its answer. It returns the latencies, the batch's wall
// time and the spread of the starts.
func batch(ctx context.Context, r *measure.Restorer, set MeasuredSet, dir string, k int) ([]float64, time.Duration, time.Duration, error) {
	request, err := pycall.ImportRequest(set.Imports)
	if err != nil {
		return nil, 0, 0, err
	}
	release := make(chan struct{})
	var ready sync.WaitGroup
	ready.Add(k)
	var wg sync.WaitGroup
	marks := make([]launch.CallMarks, k)
	errs := make([]error, k)
	for i := range k {
		wg.Go(func() {
			waited := false
			wait := func(ctx context.Context, sb *launch.Sandbox) error {
				waited = true
				ready.Done()
				select {
				case <-release:
					return nil
				case <-ctx.Done():
					return context.Cause(ctx)
				}
			}
			marks[i], errs[i] = r.TimedCall(ctx, launch.Call{SetID: set.ID, Step: fmt.Sprintf("conc%d", i), Prepare: wait, Image: launch.Image{Dir: dir, Flags: r.Flags},
				Request: request, Check: func(resp []byte) error { return pycall.CheckImported(resp, set.Imports) }, MaxResponseSize: pycall.SmallResponse})
			if !waited {
				ready.Done()
			}
		})
	}
	ready.Wait() // every sandbox prepared and waiting (or failed before)
	released := time.Now()
	close(release)
	wg.Wait()
	var latencies []float64
	var first, last time.Time
	var end time.Time
	for i, m := range marks {
		if errs[i] != nil {
			return nil, 0, 0, fmt.Errorf("restore %d of %d at once: %w", i+1, k, errs[i])
		}
		latencies = append(latencies, m.TotalMS())
		if first.IsZero() || m.Began.Before(first) {
			first = m.Began
		}
		if m.Began.After(last) {
			last = m.Began
		}
		if m.Answered.After(end) {
			end = m.Answered
		}
	}
	return latencies, end.Sub(released), last.Sub(first), nil
}

// RunConcurrency measures, for the set, every series of flags (the manifest's restore flags as
// "restore", then the variants) at every concurrency, rounds times, interleaved round by round.
func RunConcurrency(ctx context.Context, r *measure.Restorer, set MeasuredSet, variants []Variant, ks []int, rounds int, progress func(Concurrent, int)) ([]Concurrent, error) {
	type series struct {
		name     string
		restorer *measure.Restorer
		dir      string
	}
	all := []series{{Restore, r, set.Dir}}
	for _, v := range variants {
		if v.ColdPageCache || v.Pooled {
			// K restores at once of one image share its cache: a warm-cache figure; a pool's
			// sandboxes are measured one at a time.
			continue
		}
		dir, err := set.variantDir(v)
		if err != nil {
			return nil, err
		}
		all = append(all, series{v.Name, v.restorer(r, ""), dir})
	}
	results := map[string]*Concurrent{}
	raw := map[string][]float64{}
	var order []string
	for round := range rounds {
		for _, s := range all {
			for _, k := range ks {
				id := fmt.Sprintf("%s/%d", s.name, k)
				c, ok := results[id]
				if !ok {
					c = &Concurrent{Set: set.ID, Series: s.name, Concurrency: k}
					results[id] = c
					order = append(order, id)
				}
				latencies, wall, spread, err := batch(ctx, s.restorer, set, s.dir, k)
				if err != nil {
					return nil, fmt.Errorf("bench: %s, %s, %d at once, round %d: %w", set.ID, s.name, k, round+1, err)
				}
				raw[id] = append(raw[id], latencies...)
				c.Batches = append(c.Batches, float64(k)/wall.Seconds())
				c.SpreadMS = max(c.SpreadMS, float64(spread.Microseconds())/1000)
				if progress != nil {
					progress(*c, round)
				}
			}
		}
	}
	var out []Concurrent
	for _, id := range order {
		c := results[id]
		c.Latency = Summarize(raw[id])
		sorted := slices.Sorted(slices.Values(c.Batches))
		c.Throughput = measure.Percentile(sorted, 50)
		out = append(out, *c)
	}
	return out, nil
}

// BestAt returns the series with the lowest median latency at concurrency k, or "".
func BestAt(cs []Concurrent, k int) (Concurrent, bool) {
	var best Concurrent
	found := false
	for _, c := range cs {
		if c.Concurrency == k && (!found || c.Latency.Median < best.Latency.Median) {
			best, found = c, true
		}
	}
	return best, found
}
