package bench

import (
	"context"
	"errors"
	"fmt"
	"math"
	"math/rand/v2"
	"runtime"
	"slices"
	"sync"
	"time"

	"github.com/sirupsen/logrus"

	"readie.dev/pipeline/internal/run"
	"readie.dev/pipeline/pkg/catalogue"
	"readie.dev/pipeline/pkg/launch"
	"readie.dev/pipeline/pkg/pool"
	"readie.dev/pipeline/pkg/pycall"
)

// ArrivalsOptions shape bench --corpus --arrivals: an open-loop arrival process against a
// worker built from the kit alone.
type ArrivalsOptions struct {
	// RatePerSec is the Poisson arrival rate; Duration how long requests arrive.
	RatePerSec float64
	Duration   time.Duration
	// MemoryBytes is the budget of the warm pools (catalogue.SizeWarm).
	MemoryBytes int64
	// Seed draws the arrivals and their requests: the same in both runs, and run to run.
	Seed uint64
}

// ArrivalsRun is one run of the arrivals: with warm pools or without.
type ArrivalsRun struct {
	// Requests arrived; Failures of them got no checked answer (an error, or the run's end).
	Requests int `json:"requests"`
	Failures int `json:"failures"`
	// P50Ms .. MeanMs are over the answered requests, from arrival to the answer, waiting for
	// a free slot included (the sandbox's delete after the answer holds the slot, not the
	// request).
	P50Ms  float64 `json:"p50_ms"`
	P90Ms  float64 `json:"p90_ms"`
	P99Ms  float64 `json:"p99_ms"`
	MeanMs float64 `json:"mean_ms"`
	// Paths counts the answered requests by the path that started them (launch.How).
	Paths map[string]int `json:"paths"`
	// Queued counts the requests that found every one of the worker's slots (its CPUs) busy
	// and waited for one. CPUBusy is the share of the machine's CPU time busy while the run
	// served (/proc/stat: every process's, the warm refill's included): near 1, the CPUs, not
	// the slots, bound the starts.
	Queued  int     `json:"queued"`
	CPUBusy float64 `json:"cpu_busy"`
	// MemoryPeakBytes is the most the worker's sandboxes held at once, sampled: the warm
	// pools', the created ones', the requests' (launch.Runtime.Memory: their own memory, the
	// files they share with every sandbox of the host aside).
	MemoryPeakBytes int64 `json:"memory_peak_bytes"`
	// MemorySamples counts the samples of the worker's memory that could be read: with none,
	// MemoryPeakBytes says nothing.
	MemorySamples int `json:"memory_samples"`
	// WarmSizes are the warm pools (catalogue.SizeWarm under the budget), PredictedMemoryBytes
	// their predicted memory, WarmMemoryPeakBytes the most they held at once, sampled
	// (pool.Warm.ReadyOwnBytes: the sandboxes restored and waiting).
	WarmSizes            map[string]int `json:"warm_sizes,omitempty"`
	PredictedMemoryBytes int64          `json:"predicted_memory_bytes"`
	WarmMemoryPeakBytes  int64          `json:"warm_memory_peak_bytes"`
	// RefillLagMs is the mean time a warm pool's refill took to restore a replacement, off
	// the request path but on the same CPUs; Refills how many it restored during the run
	// (the fill before it aside).
	RefillLagMs float64 `json:"refill_lag_ms"`
	Refills     int     `json:"refills"`
	// LatenciesMs are the answered requests' times, in arrival order (bench.txt).
	LatenciesMs []float64 `json:"latencies_ms"`
	// Errors are the first failures' messages, at most ten.
	Errors []string `json:"errors,omitempty"`
}

// Arrivals is corpus.json's arrivals: the same arrivals with warm pools and without.
type Arrivals struct {
	RatePerSec  float64 `json:"rate_per_sec"`
	DurationS   float64 `json:"duration_s"`
	MemoryBytes int64   `json:"memory_bytes"`
	Seed        uint64  `json:"seed"`
	Slots       int     `json:"slots"`
	// Choices counts the arrivals by where Select starts them (a checkpoint, or cold).
	Choices     map[string]int `json:"choices"`
	WithWarm    ArrivalsRun    `json:"with_warm"`
	WithoutWarm ArrivalsRun    `json:"without_warm"`
}

// arrival is one request of the arrival process: when it arrives after the start, and what.
type arrival struct {
	at    time.Duration
	trial *corpusTrial
}

// drawArrivals draws Poisson arrivals at o.RatePerSec for o.Duration, each a trial drawn by
// weight, from a generator of seed o.Seed: the same list for both runs.
func drawArrivals(o ArrivalsOptions, trials []corpusTrial) []arrival {
	rng := rand.New(rand.NewPCG(o.Seed, 36))
	total := 0.0
	for _, t := range trials {
		total += t.weight
	}
	var out []arrival
	for at := time.Duration(0); ; {
		at += time.Duration(rng.ExpFloat64() / o.RatePerSec * float64(time.Second))
		if at >= o.Duration {
			return out
		}
		pick, u := len(trials)-1, rng.Float64()*total
		for i, t := range trials {
			if u -= t.weight; u < 0 {
				pick = i
				break
			}
		}
		out = append(out, arrival{at: at, trial: &trials[pick]})
	}
}

// warmDemand is what catalogue.SizeWarm needs of each checkpoint the trials choose: its share
// of the arrival rate, its saving (its restore price from a created sandbox, all a warm one
// takes off), its refill (the same restore) and its memory from the catalogue. A checkpoint
// whose memory the catalogue lacks is left out, and said.
func warmDemand(cat *catalogue.Catalogue, trials []corpusTrial, rate float64, log logrus.FieldLogger) []catalogue.WarmDemand {
	total, share := 0.0, map[string]float64{}
	for _, t := range trials {
		total += t.weight
		if t.dir != "" {
			share[t.req.Choice] += t.weight
		}
	}
	var out []catalogue.WarmDemand
	for _, cp := range cat.Checkpoints {
		if share[cp.ID] == 0 {
			continue
		}
		if cp.OwnBytes <= 0 {
			log.Warnf("bench --arrivals: checkpoint %s has no own memory in the catalogue (captured before it was measured): kept out of the warm pools; capture it again", cp.ID)
			continue
		}
		price := cp.RestoreMs(cat.CostModel)
		if pl := cat.CostModel.Pooled; pl.Measured() {
			price = pl.RestoreMs(cp.ImageMiB)
		}
		out = append(out, catalogue.WarmDemand{Set: cp.ID, RatePerSec: rate * share[cp.ID] / total, SavingMs: price, RefillMs: price, OwnBytes: cp.OwnBytes})
	}
	return out
}

// runArrivals runs the arrivals twice against a worker of the kit (the output's
// launch.Restorer, a pool of created sandboxes, restores, cold starts): with warm pools sized
// under o.MemoryBytes, then without. Each run ends at o.Duration plus one start's timeout,
// whatever happens: a request not answered by then is a failure.
func runArrivals(ctx context.Context, x *run.VerifiedOutput, cat *catalogue.Catalogue, trials []corpusTrial, poolSize int, o ArrivalsOptions) (*Arrivals, error) {
	env := x.Sandboxes
	kit, err := x.Output.Restorer(launch.Options{Runtime: env.Runtime, WorkDir: x.Work, Limits: env.Config.SandboxLimits()})
	if err != nil {
		return nil, err
	}
	sizing, err := catalogue.SizeWarm(warmDemand(cat, trials, o.RatePerSec, env.Log), o.MemoryBytes)
	if err != nil {
		return nil, err
	}
	arrivals := drawArrivals(o, trials)
	res := &Arrivals{RatePerSec: o.RatePerSec, DurationS: o.Duration.Seconds(), MemoryBytes: o.MemoryBytes, Seed: o.Seed, Slots: runtime.NumCPU(), Choices: map[string]int{}}
	for _, a := range arrivals {
		res.Choices[a.trial.req.Choice]++
	}
	timeout := env.Config.Timeouts.Smoke // a start plus a call
	for _, warm := range []bool{true, false} {
		sizes := map[string]int{}
		if warm {
			sizes = sizing.Sizes()
		}
		r, err := arrivalsRun(ctx, kit, env.Runtime, arrivals, sizes, poolSize, res.Slots, o.Duration+timeout, timeout)
		if err != nil {
			return nil, err
		}
		if warm {
			r.WarmSizes, r.PredictedMemoryBytes = sizes, sizing.MemoryBytes
			res.WithWarm = r
		} else {
			res.WithoutWarm = r
		}
		env.Log.WithFields(logrus.Fields{"warm": warm, "requests": r.Requests, "failures": r.Failures, "p50_ms": r.P50Ms, "p99_ms": r.P99Ms, "paths": r.Paths}).Info("bench --arrivals: run done")
	}
	return res, nil
}

// arrivalsRun serves arrivals with a worker of kit, whose sandboxes rt runs: warm pools of
// sizes (none: none), a pool of poolSize created sandboxes (their restores' and the warm
// refill's), at most slots starts at once. It returns once every request is answered or
// failed, within limit.
func arrivalsRun(ctx context.Context, kit *launch.Restorer, rt *launch.Runtime, arrivals []arrival, sizes map[string]int, poolSize, slots int, limit, timeout time.Duration) (res ArrivalsRun, err error) {
	// The pools live until this returns; they are filled before the run, under a bound of
	// their own (a start's timeout per sandbox), so the fill never eats into the run's time.
	created, err := pool.New(ctx, pool.Options{New: kit.NewSandbox, Size: poolSize, GetTimeout: timeout})
	if err != nil {
		return res, err
	}
	defer func() { err = errors.Join(err, created.Close()) }()
	fill := poolSize
	for _, n := range sizes {
		fill += n
	}
	fillLimit := time.Duration(fill+1) * timeout
	fillCtx, cancelFill := context.WithTimeoutCause(ctx, fillLimit, fmt.Errorf("the pools were not filled within %s", fillLimit))
	defer cancelFill()
	var warm *pool.Warm
	var opts launch.RestoreOptions
	opts.Pool = created
	if len(sizes) > 0 {
		if warm, err = pool.NewWarm(ctx, pool.WarmOptions{Restorer: kit, Sizes: sizes, Pool: created, WaitTimeout: fillLimit}); err != nil {
			return res, err
		}
		defer func() { err = errors.Join(err, warm.Close()) }()
		// Requests arrive at a worker ready: its pools full, off the clock.
		if err := warm.Wait(fillCtx); err != nil {
			return res, err
		}
	}
	if err := created.Wait(fillCtx); err != nil {
		return res, err
	}
	// The fill's restores are not the run's refills.
	var filled int
	var filledTime time.Duration
	if warm != nil {
		for _, st := range warm.Stats() {
			filled, filledTime = filled+st.Restored, filledTime+st.RestoreTime
		}
	}
	runCtx, cancel := context.WithTimeoutCause(ctx, limit, fmt.Errorf("the arrivals run did not end within %s", limit))
	defer cancel()

	var mu sync.Mutex
	var peak, warmPeak int64
	var samples int
	samplerDone := make(chan struct{})
	stopSampler := make(chan struct{})
	go func() { // the worker's memory and the warm pools', sampled until the run ends
		defer close(samplerDone)
		tick := time.NewTicker(250 * time.Millisecond)
		defer tick.Stop()
		for {
			if m, _, err := rt.Memory(); err == nil {
				samples++
				peak = max(peak, m.Own)
			}
			if warm != nil {
				if m := warm.ReadyOwnBytes(); m > warmPeak {
					warmPeak = m
				}
			}
			select {
			case <-tick.C:
			case <-stopSampler:
				return
			}
		}
	}()

	res.Paths = map[string]int{}
	latencies := make([]float64, len(arrivals))
	served := make([]bool, len(arrivals))
	sem := make(chan struct{}, slots)
	var wg sync.WaitGroup
	cpuBefore, cpuErr := readCPUTimes()
	start := time.Now()
	for i, a := range arrivals {
		select {
		case <-time.After(time.Until(start.Add(a.at))):
		case <-runCtx.Done():
		}
		arrived := time.Now()
		wg.Add(1)
		go func() {
			defer wg.Done()
			how, answered, err := serveArrival(runCtx, kit, opts, warm, a.trial, sem, timeout, func() {
				mu.Lock()
				res.Queued++
				mu.Unlock()
			})
			mu.Lock()
			defer mu.Unlock()
			if err != nil {
				res.Failures++
				if len(res.Errors) < 10 {
					res.Errors = append(res.Errors, fmt.Sprintf("request at line %d: %v", a.trial.req.Line, err))
				}
				return
			}
			latencies[i], served[i] = launch.MS(answered.Sub(arrived)), true
			res.Paths[string(how)]++
		}()
	}
	wg.Wait()
	if cpuAfter, err := readCPUTimes(); err == nil && cpuErr == nil {
		res.CPUBusy = cpuAfter.busySince(cpuBefore)
	}
	close(stopSampler)
	<-samplerDone
	res.Requests = len(arrivals)
	for i, ok := range served {
		if ok {
			res.LatenciesMs = append(res.LatenciesMs, latencies[i])
		}
	}
	res.MemoryPeakBytes, res.WarmMemoryPeakBytes, res.MemorySamples = peak, warmPeak, samples
	if warm != nil {
		refillTime := -filledTime
		res.Refills = -filled
		for _, st := range warm.Stats() {
			res.Refills += st.Restored
			refillTime += st.RestoreTime
		}
		if res.Refills > 0 {
			res.RefillLagMs = launch.MS(refillTime) / float64(res.Refills)
		}
	}
	if n := len(res.LatenciesMs); n > 0 {
		sorted := slices.Sorted(slices.Values(res.LatenciesMs))
		sum := 0.0
		for _, ms := range sorted {
			sum += ms
		}
		res.MeanMs = sum / float64(n)
		res.P50Ms, res.P90Ms, res.P99Ms = quantile(sorted, 0.5), quantile(sorted, 0.9), quantile(sorted, 0.99)
	}
	return res, nil
}

// serveArrival serves one request as a worker does: a free slot (queued says it waited for
// one), then the fastest path ready (launch.Restorer.Restore), the call that imports its
// modules, its answer checked, and the sandbox deleted. It returns when the answer came: the
// delete after it holds the slot, not the request.
func serveArrival(ctx context.Context, kit *launch.Restorer, opts launch.RestoreOptions, warm *pool.Warm, t *corpusTrial, sem chan struct{}, timeout time.Duration, queued func()) (_ launch.How, answered time.Time, err error) {
	select {
	case sem <- struct{}{}:
	default:
		queued()
		select {
		case sem <- struct{}{}:
		case <-ctx.Done():
			return "", answered, fmt.Errorf("waiting for a slot: %w", context.Cause(ctx))
		}
	}
	defer func() { <-sem }()
	if warm != nil {
		opts.Warm = warm
	}
	ctx, cancel := context.WithTimeoutCause(ctx, timeout, fmt.Errorf("a start and call exceeded its timeout of %s", timeout))
	defer cancel()
	set := t.req.Choice
	if t.dir == "" {
		set = "" // Select chose a cold start
	}
	opts.Also = t.warmAlso
	restored, err := kit.Restore(ctx, set, opts)
	if err != nil {
		return "", answered, err
	}
	defer func() { err = errors.Join(err, restored.Close(ctx)) }()
	request, err := pycall.ImportRequest(t.req.Modules)
	if err != nil {
		return "", answered, err
	}
	response, err := restored.Call(ctx, request, pycall.SmallResponse)
	if err != nil {
		return "", answered, err
	}
	answered = time.Now()
	return restored.How, answered, pycall.CheckImported(response, t.req.Modules)
}

// quantile returns the q quantile of sorted values (nearest rank).
func quantile(sorted []float64, q float64) float64 {
	i := int(math.Ceil(q*float64(len(sorted)))) - 1
	return sorted[max(0, min(i, len(sorted)-1))]
}
