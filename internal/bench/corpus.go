package bench

import (
	"cmp"
	"context"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"math"
	"math/rand/v2"
	"path/filepath"
	"slices"
	"strings"
	"time"

	"github.com/sirupsen/logrus"
	"gonum.org/v1/plot"
	"gonum.org/v1/plot/plotter"
	"gonum.org/v1/plot/plotutil"
	"gonum.org/v1/plot/vg"

	"readie.dev/pipeline/internal/corpus"
	"readie.dev/pipeline/internal/run"
	"readie.dev/pipeline/pkg/catalogue"
	"readie.dev/pipeline/pkg/launch"
	"readie.dev/pipeline/pkg/manifest"
	"readie.dev/pipeline/pkg/measure"
	"readie.dev/pipeline/pkg/pool"
)

// The parts of a corpus a replay may draw from (corpus.HeldOut).
const (
	PartHeldOut = "held-out"
	PartPlanned = "planned"
	PartAll     = "all"
)

// CorpusOptions shape a corpus replay.
type CorpusOptions struct {
	Corpus *corpus.Corpus
	// Path names the corpus in the report.
	Path string
	// Sample is how many requests to draw; Part which part they come from.
	Sample int
	Part   string
	// Rounds is how many times each request runs in each series, interleaved.
	Rounds int
	// Pool, when not zero, adds the pooled series: each request started in a sandbox of a
	// pool of this size (restored, or started cold when Select chose a cold start).
	Pool int
	// Arrivals, when its rate is not zero, adds the arrivals: the drawn requests arriving
	// open-loop against a worker of the kit, with warm pools and without (runArrivals).
	Arrivals ArrivalsOptions
	// Revision is the pipeline's own version and VCS revision, for the report.
	Revision string
}

// CorpusRequest is one replayed request: what it imports, where Select starts it, and the
// medians measured and predicted.
type CorpusRequest struct {
	// Index is the request's position in the corpus, Line its line.
	Index   int      `json:"index"`
	Line    int      `json:"line"`
	Imports []string `json:"imports"`
	// Modules are the modules the call imports: the imports resolved by the catalogue.
	Modules []string `json:"modules"`
	// Choice is the checkpoint Select chose, or "cold".
	Choice   string  `json:"choice"`
	ColdMs   float64 `json:"cold_ms"`
	ChosenMs float64 `json:"chosen_ms"`
	// PredictedMs is what the cost model predicts for the chosen start, PredictedColdMs for
	// the cold start; both absent when the catalogue has no prices (CorpusReport.Basis).
	PredictedMs     float64        `json:"predicted_ms,omitempty"`
	PredictedColdMs float64        `json:"predicted_cold_ms,omitempty"`
	Cold            manifest.Stats `json:"cold"`
	Chosen          manifest.Stats `json:"chosen"`
	// Pooled is the same start as Chosen from a sandbox of a pool (--pool), PooledMs its
	// median; PredictedPooledMs is the cost model's pooled line's price of it
	// (Choice.PredictedPooledMs; absent when the catalogue has no pooled line).
	Pooled            *manifest.Stats `json:"pooled,omitempty"`
	PooledMs          float64         `json:"pooled_ms,omitempty"`
	PredictedPooledMs float64         `json:"predicted_pooled_ms,omitempty"`
}

// ReplaySummary holds a corpus replay's means over the sampled requests.
type ReplaySummary struct {
	Requests     int     `json:"requests"`
	MeanColdMs   float64 `json:"mean_cold_ms"`
	MeanChosenMs float64 `json:"mean_chosen_ms"`
	// MeanPredictedMs and MeanPredictedColdMs are the cost model's means for the chosen and
	// the cold starts. They, ModelErrorPct and MeanAbsErrorPct are absent when nothing was
	// predicted (a catalogue without prices).
	MeanPredictedMs     float64 `json:"mean_predicted_ms,omitempty"`
	MeanPredictedColdMs float64 `json:"mean_predicted_cold_ms,omitempty"`
	// SavedMs is the mean start time saved: MeanColdMs - MeanChosenMs; ChosenOverCold their
	// ratio.
	SavedMs        float64 `json:"saved_ms"`
	ChosenOverCold float64 `json:"chosen_over_cold"`
	// ModelErrorPct is the cost model's error on the mean: 100 x (measured / predicted - 1);
	// MeanAbsErrorPct the mean of each request's |measured - predicted| / predicted.
	ModelErrorPct   float64 `json:"model_error_pct,omitempty"`
	MeanAbsErrorPct float64 `json:"mean_abs_error_pct,omitempty"`
	// With a pool: MeanPooledMs, PooledOverCold (MeanPooledMs / MeanColdMs), the mean
	// predicted pooled start and the model's error on it (absent without a pooled line), and
	// CreateMs, the mean `runsc create` of the pool's sandboxes (measured off the clock in the
	// same run: what the pool took off the starts, for comparison).
	MeanPooledMs        float64 `json:"mean_pooled_ms,omitempty"`
	PooledOverCold      float64 `json:"pooled_over_cold,omitempty"`
	PredictedPooledMs   float64 `json:"predicted_pooled_ms,omitempty"`
	PooledModelErrorPct float64 `json:"pooled_model_error_pct,omitempty"`
	CreateMs            float64 `json:"create_ms,omitempty"`
}

// CorpusReport is corpus.json.
type CorpusReport struct {
	CreatedAt time.Time `json:"created_at"`
	Machine   Machine   `json:"machine"`
	// Revision is the pipeline's; Load the machine's around the replay and the arrivals.
	Revision     string              `json:"revision,omitempty"`
	Load         Load                `json:"load"`
	Runsc        manifest.Runsc      `json:"runsc"`
	RestoreFlags []string            `json:"restore_flags"`
	CostModel    catalogue.CostModel `json:"cost_model"`
	// Basis is how Select chose every start: by the cost model, or by image size when the
	// catalogue has no measured prices (then nothing is predicted).
	Basis        catalogue.Basis `json:"basis"`
	Corpus       string          `json:"corpus"`
	Part         string          `json:"part"`
	Rounds       int             `json:"rounds"`
	WarmupRounds int             `json:"warmup_rounds"`
	// Pool is the size of the pool of the pooled series; 0: not measured.
	Pool int `json:"pool"`
	// Eligible is how many requests of the part the replay could draw from; Unservable how
	// many it could not (a module the image lacks, or a name the catalogue has not analysed).
	Eligible   int             `json:"eligible"`
	Unservable int             `json:"unservable"`
	Requests   []CorpusRequest `json:"requests"`
	Summary    ReplaySummary   `json:"summary"`
	// Arrivals are the open-loop runs (--arrivals), absent without.
	Arrivals *Arrivals `json:"arrivals,omitempty"`
	Dir      string    `json:"-"`
}

// Predicted reports whether the replay's starts were priced: Select chose by the cost model.
func (r *CorpusReport) Predicted() bool { return r.Basis == catalogue.BasisCostModel }

// ErrCorpusBench reports a replay that cannot run: no catalogue, nothing to draw.
var ErrCorpusBench = errors.New("corpus bench")

// RunCorpus replays requests of a corpus on the output out: for each, the start Select chooses
// from out's catalogue (a restore of a checkpoint, or a cold start) and a cold start, each
// making the one call that imports the request's modules, interleaved request by request and
// round by round after a discarded warm-up. It writes corpus.json, bench.txt and corpus.svg into
// OUT/bench/<UTC time>/.
func RunCorpus(ctx context.Context, env *run.Env, out string, o CorpusOptions) (*CorpusReport, error) {
	var report *CorpusReport
	_, err := env.WithVerifiedOutput(ctx, out, nil, func(x *run.VerifiedOutput) error {
		var err error
		report, err = runCorpusOn(ctx, x, o)
		return err
	})
	return report, err
}

// corpusTrial is one replayed request: where it starts and what its call imports.
type corpusTrial struct {
	req    CorpusRequest
	weight float64
	dir    string // the chosen checkpoint's directory; "" for a cold start
	cold   []float64
	chosen []float64
	pooled []float64

	// predictedPooled is the choice's price from a pool (0: no pooled line).
	predictedPooled float64
	// warmAlso are the other checkpoints whose warm sandbox serves it faster (Choice.Warm).
	warmAlso []string
}

func runCorpusOn(ctx context.Context, x *run.VerifiedOutput, o CorpusOptions) (*CorpusReport, error) {
	cat, router, err := openCatalogue(x.Out)
	if err != nil {
		return nil, err
	}
	if router.Basis() == catalogue.BasisImageSize {
		x.Sandboxes.Log.Warnf("bench --corpus: the catalogue has no measured prices (%s): Select chooses by image size and nothing is predicted; %s", router.Unpriced(), catalogue.MeasureHint)
	} else if o.Pool > 0 && !cat.CostModel.Pooled.Measured() {
		x.Sandboxes.Log.Warn("bench --corpus: the catalogue's cost model has no pooled line (analysed before it was measured): the pooled series goes without a prediction; run pipeline analyze, then capture, to measure it")
	}
	trials, eligible, unservable, err := drawRequests(o, router, x)
	if err != nil {
		return nil, err
	}
	sampler, err := sampleLoad(ctx, LoadInterval)
	if err != nil {
		return nil, err
	}
	defer sampler.cancel()
	createMs, err := replay(ctx, x, trials, o)
	if err != nil {
		return nil, err
	}
	report := &CorpusReport{
		CreatedAt: time.Now().UTC(), Machine: ThisMachine(), Revision: o.Revision, Runsc: x.Manifest.Runsc,
		RestoreFlags: slices.Clone(x.Manifest.RestoreFlags), CostModel: cat.CostModel, Basis: router.Basis(),
		Corpus: o.Path, Part: o.Part, Rounds: o.Rounds, WarmupRounds: 1, Pool: o.Pool, Eligible: eligible, Unservable: unservable,
	}
	for _, t := range trials {
		r := t.req
		r.Cold, r.Chosen = measure.Summarize(t.cold), measure.Summarize(t.chosen)
		r.ColdMs, r.ChosenMs = r.Cold.Median, r.Chosen.Median
		if o.Pool > 0 {
			st := measure.Summarize(t.pooled)
			r.Pooled, r.PooledMs, r.PredictedPooledMs = &st, st.Median, t.predictedPooled
		}
		report.Requests = append(report.Requests, r)
	}
	report.Summary = summarize(report.Requests)
	if o.Pool > 0 {
		report.Summary.CreateMs = createMs
	}
	if o.Arrivals.RatePerSec > 0 {
		if report.Arrivals, err = runArrivals(ctx, x, cat, trials, max(o.Pool, 1), o.Arrivals); err != nil {
			return nil, fmt.Errorf("bench --arrivals: %w", err)
		}
	}
	if report.Load, err = sampler.stop(report.Machine.CPUs); err != nil {
		return nil, err
	}
	if report.Dir, err = writeCorpusRun(x.Out, report); err != nil {
		return nil, err
	}
	return report, nil
}

// openCatalogue loads the catalogue of the output out and its router; an output without one,
// or whose catalogue analyses no module, cannot be replayed on.
func openCatalogue(out string) (*catalogue.Catalogue, *catalogue.Router, error) {
	path := filepath.Join(out, catalogue.FileName)
	cat, err := catalogue.Load(path)
	if errors.Is(err, fs.ErrNotExist) {
		return nil, nil, fmt.Errorf("%w: %w: %s has no catalogue.json (capture it with an analysis: pipeline analyze, then capture)", run.ErrSetup, ErrCorpusBench, out)
	}
	if err != nil {
		return nil, nil, fmt.Errorf("%w: %w", run.ErrSetup, err)
	}
	if len(cat.Modules) == 0 {
		return nil, nil, fmt.Errorf("%w: %w: the catalogue of %s analyses no module: run pipeline analyze --corpus into it, then capture again", run.ErrSetup, ErrCorpusBench, out)
	}
	router, err := catalogue.NewRouter(cat)
	if err != nil {
		return nil, nil, fmt.Errorf("%w: %s: %w", run.ErrSetup, path, err)
	}
	return cat, router, nil
}

// replay runs one warm-up of each series, discarded, then o.Rounds rounds of every trial's
// cold and chosen starts (and pooled ones with o.Pool), rotating which goes first, and records
// the times in the trials. It returns the pool's mean `runsc create` time in milliseconds.
func replay(ctx context.Context, x *run.VerifiedOutput, trials []corpusTrial, o CorpusOptions) (createMs float64, err error) {
	env := x.Sandboxes
	// A cold start and a restore are each bounded like a smoke test: a start plus a call.
	restorer := env.Restorer(x.Work, env.Config.Timeouts.Smoke)
	series := []string{Cold, "chosen"}
	var p *pool.Pool
	if o.Pool > 0 {
		series = append(series, Pooled)
		if p, err = NewPool(ctx, &restorer.Launcher, o.Pool); err != nil {
			return 0, err
		}
		defer func() { err = errors.Join(err, p.Close()) }()
	}
	runOne := func(t *corpusTrial, series string) (float64, error) {
		switch {
		case series == Pooled:
			// Select's choice from a pooled sandbox: restored, or started cold.
			marks, err := TimePooledCall(ctx, p, t.dir, restorer.Flags, t.req.Modules, restorer.Timeout)
			return marks.TotalMS(), err
		case series == Cold || t.dir == "":
			return TimeColdCall(ctx, &restorer.Launcher, "corpus", t.req.Modules)
		}
		marks, err := TimeRestoreCall(ctx, restorer, t.req.Choice, t.dir, t.req.Modules, false)
		return marks.TotalMS(), err
	}
	env.Log.WithFields(logrus.Fields{"requests": len(trials), "rounds": o.Rounds, "part": o.Part, "pool": o.Pool}).Info("bench --corpus: start")
	start := time.Now()
	// One warm-up of each series, discarded: the first sandboxes of a run pay for cold caches.
	for _, name := range series {
		if _, err := runOne(&trials[0], name); err != nil {
			return 0, fmt.Errorf("bench --corpus: warm-up, request at line %d, %s: %w", trials[0].req.Line, name, err)
		}
	}
	for round := range o.Rounds {
		for i := range trials {
			t := &trials[i]
			k := (round + i) % len(series)
			order := append(slices.Clone(series[k:]), series[:k]...)
			for _, name := range order {
				if err := ctx.Err(); err != nil {
					return 0, context.Cause(ctx)
				}
				ms, err := runOne(t, name)
				if err != nil {
					return 0, fmt.Errorf("bench --corpus: request at line %d (%s), %s, round %d: %w", t.req.Line, strings.Join(t.req.Imports, ","), name, round+1, err)
				}
				switch name {
				case Cold:
					t.cold = append(t.cold, ms)
				case Pooled:
					t.pooled = append(t.pooled, ms)
				default:
					t.chosen = append(t.chosen, ms)
				}
			}
		}
		env.Log.WithFields(logrus.Fields{"round": fmt.Sprintf("%d/%d", round+1, o.Rounds), "took": time.Since(start).Round(time.Second)}).Info("bench --corpus: round done")
	}
	if p != nil {
		if s := p.Stats(); s.Created > 0 {
			createMs = launch.MS(s.CreateTime / time.Duration(s.Created))
		}
	}
	return createMs, nil
}

// drawRequests draws o.Sample requests of the part, deterministically: among the requests
// Select can serve, weighted sampling without replacement (Efraimidis-Spirakis keys from a
// generator of fixed seed), so a request of weight 3 is as likely as three of weight 1. The
// draw depends on the corpus and the catalogue alone.
func drawRequests(o CorpusOptions, router *catalogue.Router, x *run.VerifiedOutput) (trials []corpusTrial, eligible, unservable int, err error) {
	dirs := map[string]string{}
	for i := range x.Manifest.Checkpoints {
		c := &x.Manifest.Checkpoints[i]
		dirs[c.ID] = x.Dir(c)
	}
	type candidate struct {
		t   corpusTrial
		key float64
	}
	rng := rand.New(rand.NewPCG(0x5eed, 19))
	var cands []candidate
	for i, r := range o.Corpus.Requests {
		u := rng.Float64() // drawn for every request, so a request's key never depends on the others
		switch o.Part {
		case PartHeldOut:
			if !corpus.HeldOut(i) {
				continue
			}
		case PartPlanned:
			if corpus.HeldOut(i) {
				continue
			}
		}
		ch := router.SelectFor(r.Imports, r.Packages)
		if len(ch.Unavailable) > 0 || len(ch.Unknown) > 0 {
			unservable++
			continue
		}
		eligible++
		req := CorpusRequest{Index: i, Line: r.Line, Imports: slices.Clone(r.Imports), Modules: ch.Modules, Choice: ch.Checkpoint,
			PredictedMs: ch.PredictedMs, PredictedColdMs: ch.ColdMs}
		if req.Modules == nil {
			req.Modules = []string{}
		}
		t := corpusTrial{req: req, weight: r.Weight, predictedPooled: ch.PredictedPooledMs}
		for _, w := range ch.Warm {
			t.warmAlso = append(t.warmAlso, w.Checkpoint)
		}
		if ch.Cold {
			t.req.Choice = Cold
		} else if t.dir = dirs[ch.Checkpoint]; t.dir == "" {
			return nil, 0, 0, fmt.Errorf("%w: the catalogue names checkpoint %s, which the manifest lacks: capture again", run.ErrSetup, ch.Checkpoint)
		}
		cands = append(cands, candidate{t: t, key: math.Log(max(u, 1e-300)) / r.Weight})
	}
	if len(cands) == 0 {
		return nil, 0, 0, fmt.Errorf("%w: %w: no request of the %s part can be served by the image (%d unservable)", run.ErrSetup, ErrCorpusBench, o.Part, unservable)
	}
	slices.SortStableFunc(cands, func(a, b candidate) int { return cmp.Compare(b.key, a.key) })
	cands = cands[:min(o.Sample, len(cands))]
	slices.SortFunc(cands, func(a, b candidate) int { return cmp.Compare(a.t.req.Index, b.t.req.Index) })
	for _, c := range cands {
		trials = append(trials, c.t)
	}
	return trials, eligible, unservable, nil
}

func summarize(reqs []CorpusRequest) ReplaySummary {
	s := ReplaySummary{Requests: len(reqs)}
	if len(reqs) == 0 {
		return s
	}
	var absErr float64
	for _, r := range reqs {
		s.MeanColdMs += r.ColdMs
		s.MeanChosenMs += r.ChosenMs
		s.MeanPredictedMs += r.PredictedMs
		s.MeanPredictedColdMs += r.PredictedColdMs
		if r.PredictedMs > 0 {
			absErr += math.Abs(r.ChosenMs-r.PredictedMs) / r.PredictedMs
		}
	}
	n := float64(len(reqs))
	s.MeanColdMs /= n
	s.MeanChosenMs /= n
	s.MeanPredictedMs /= n
	s.MeanPredictedColdMs /= n
	s.SavedMs = s.MeanColdMs - s.MeanChosenMs
	if s.MeanColdMs > 0 {
		s.ChosenOverCold = s.MeanChosenMs / s.MeanColdMs
	}
	if s.MeanPredictedMs > 0 {
		s.ModelErrorPct = 100 * (s.MeanChosenMs/s.MeanPredictedMs - 1)
		s.MeanAbsErrorPct = 100 * absErr / n
	}
	if reqs[0].Pooled != nil {
		for _, r := range reqs {
			s.MeanPooledMs += r.PooledMs
			s.PredictedPooledMs += r.PredictedPooledMs
		}
		s.MeanPooledMs /= n
		s.PredictedPooledMs /= n
		if s.MeanColdMs > 0 {
			s.PooledOverCold = s.MeanPooledMs / s.MeanColdMs
		}
		if s.PredictedPooledMs > 0 {
			s.PooledModelErrorPct = 100 * (s.MeanPooledMs/s.PredictedPooledMs - 1)
		}
	}
	return s
}

// writeCorpusRun writes corpus.json, bench.txt and corpus.svg into a new run directory and
// points OUT/bench/latest at it.
func writeCorpusRun(out string, r *CorpusReport) (string, error) {
	return writeRunDir(out, r.CreatedAt,
		"corpus.json", r,
		runFile{"bench.txt", func(w io.Writer) error { return WriteCorpusBenchfmt(w, r) }},
		runFile{"corpus.svg", func(w io.Writer) error {
			if err := WriteCorpusChart(w, r); err != nil {
				return fmt.Errorf("draw corpus.svg: %w", err)
			}
			return nil
		}})
}

// WriteCorpusBenchfmt writes the replay in the Go benchmark format: every run of every request
// (BenchmarkCorpus/req=00017/series=cold), each line carrying the predicted cost as a second
// unit when the starts were priced, and per round the mean over the requests
// (BenchmarkCorpusMean), so that `benchstat -col /series bench.txt` compares cold and chosen
// with its own statistics.
func WriteCorpusBenchfmt(w io.Writer, r *CorpusReport) error {
	// predicted is the second unit: none without a price (no prices, or no pooled line),
	// rather than a price of 0 ms.
	predicted := func(ms float64) string {
		if !r.Predicted() || !(ms > 0) {
			return ""
		}
		return fmt.Sprintf(" %.1f predicted-ms", ms)
	}
	var b strings.Builder
	fmt.Fprintf(&b, "goos: %s\ngoarch: %s\npkg: readie.dev/pipeline/bench\ncpu: %s\n", r.Machine.GOOS, r.Machine.GOARCH, r.Machine.CPUModel)
	fmt.Fprintf(&b, "date: %s\nrounds: %d\nrevision: %s\n", r.CreatedAt.UTC().Format(time.RFC3339), r.Rounds, cmp.Or(r.Revision, "(unknown)"))
	fmt.Fprintf(&b, "runsc: %s\nrestore-flags: %s\ncorpus: %s\npart: %s\nload: %s\n", r.Runsc.Version, strings.Join(r.RestoreFlags, " "), r.Corpus, r.Part, r.Load.Describe())
	if r.Load.Warning != "" {
		fmt.Fprintf(&b, "load-warning: %s\n", r.Load.Warning)
	}
	for _, q := range r.Requests {
		for _, ms := range q.Cold.Runs {
			fmt.Fprintf(&b, "BenchmarkCorpus/req=%05d/series=cold 1 %d ns/op%s\n", q.Index, int64(ms*1e6), predicted(q.PredictedColdMs))
		}
		for _, ms := range q.Chosen.Runs {
			fmt.Fprintf(&b, "BenchmarkCorpus/req=%05d/series=chosen 1 %d ns/op%s\n", q.Index, int64(ms*1e6), predicted(q.PredictedMs))
		}
		if q.Pooled != nil {
			for _, ms := range q.Pooled.Runs {
				fmt.Fprintf(&b, "BenchmarkCorpus/req=%05d/series=pooled 1 %d ns/op%s\n", q.Index, int64(ms*1e6), predicted(q.PredictedPooledMs))
			}
		}
	}
	for round := range r.Rounds {
		var cold, chosen float64
		for _, q := range r.Requests {
			cold += q.Cold.Runs[round]
			chosen += q.Chosen.Runs[round]
		}
		n := float64(len(r.Requests))
		fmt.Fprintf(&b, "BenchmarkCorpusMean/series=cold 1 %d ns/op%s\n", int64(cold/n*1e6), predicted(r.Summary.MeanPredictedColdMs))
		fmt.Fprintf(&b, "BenchmarkCorpusMean/series=chosen 1 %d ns/op%s\n", int64(chosen/n*1e6), predicted(r.Summary.MeanPredictedMs))
		if r.Pool > 0 {
			var pooled float64
			for _, q := range r.Requests {
				pooled += q.Pooled.Runs[round]
			}
			fmt.Fprintf(&b, "BenchmarkCorpusMean/series=pooled 1 %d ns/op%s\n", int64(pooled/n*1e6), predicted(r.Summary.PredictedPooledMs))
		}
	}
	// The arrivals: every answered request's time, per run (benchstat -col /warm).
	if a := r.Arrivals; a != nil {
		for _, run := range []struct {
			name string
			r    ArrivalsRun
		}{{"with", a.WithWarm}, {"without", a.WithoutWarm}} {
			for _, ms := range run.r.LatenciesMs {
				fmt.Fprintf(&b, "BenchmarkArrivals/warm=%s 1 %d ns/op\n", run.name, int64(ms*1e6))
			}
		}
	}
	_, err := io.WriteString(w, b.String())
	return err
}

// WriteCorpusChart draws, per request (sorted by its cold median), the measured cold and
// chosen starts (median, bars min-max) and the predicted cost of the chosen start, as SVG.
func WriteCorpusChart(w io.Writer, r *CorpusReport) error {
	reqs := slices.Clone(r.Requests)
	slices.SortStableFunc(reqs, func(a, b CorpusRequest) int { return cmp.Compare(a.ColdMs, b.ColdMs) })
	p := plot.New()
	p.Title.Text = fmt.Sprintf("Start to first answer, %d requests of %s (%s part): mean cold %.0f ms, chosen %.0f ms",
		len(reqs), filepath.Base(r.Corpus), r.Part, r.Summary.MeanColdMs, r.Summary.MeanChosenMs)
	if r.Predicted() {
		p.Title.Text += fmt.Sprintf(" (predicted %.0f ms)", r.Summary.MeanPredictedMs)
	} else {
		p.Title.Text += " (chosen by image size, not predicted)"
	}
	p.X.Label.Text = "request, by cold start time"
	p.Y.Label.Text = "ms (median, bars min-max)"
	var cold, chosen, pooled spread
	predicted := plotter.XYs{}
	var top float64
	for i, q := range reqs {
		cold.add(float64(i)-0.12, q.Cold)
		chosen.add(float64(i)+0.12, q.Chosen)
		if q.Pooled != nil {
			pooled.add(float64(i)+0.3, *q.Pooled)
		}
		if r.Predicted() {
			predicted = append(predicted, plotter.XY{X: float64(i) + 0.12, Y: q.PredictedMs})
			top = max(top, q.PredictedMs)
		}
	}
	if err := addSpread(p, &cold, 0, "cold start"); err != nil {
		return err
	}
	if err := addSpread(p, &chosen, 1, "Select's choice"); err != nil {
		return err
	}
	legend := 2
	if len(pooled.XYs) > 0 {
		if err := addSpread(p, &pooled, 3, fmt.Sprintf("the same from a pool of %d", r.Pool)); err != nil {
			return err
		}
		legend++
	}
	if len(predicted) > 0 {
		pts, err := plotter.NewScatter(predicted)
		if err != nil {
			return err
		}
		pts.Color, pts.Shape, pts.Radius = plotutil.Color(2), plotutil.Shape(4), vg.Points(4)
		p.Add(pts)
		p.Legend.Add("predicted (choice)", pts)
		legend++
	}
	roomForLegend(p, legend, max(top, cold.top(), chosen.top(), pooled.top()))
	p.Legend.Left = true
	p.X.Min, p.X.Max = -1, float64(len(reqs))
	width := vg.Points(float64(max(chartWidth/2, min(chartWidth*2, 40+14*len(reqs)))))
	wt, err := p.WriterTo(width, vg.Points(chartHeight), "svg")
	if err != nil {
		return err
	}
	_, err = wt.WriteTo(w)
	return err
}
