// Package bench measures restore latency side by side: for every checkpoint and every series
// (the sandbox floor, a cold start, a restore, a restore into a pre-created sandbox, the
// measure-mode restore, and restore variants), interleaved round by round so that the noise of
// a shared machine hits every series alike.
package bench

import (
	"context"
	"fmt"
	"maps"
	"math"
	"slices"
	"strings"

	"readie.dev/pipeline/internal/config"
	"readie.dev/pipeline/pkg/measure"
)

// The series every set is measured in.
const (
	Floor      = "floor"      // a sandbox of the same shape running /bin/true
	Cold       = "cold"       // cold start of the executor, then the call that imports the set
	Restore    = "restore"    // restore in sandbox mode, then the same call
	Prestarted = "prestarted" // `runsc create` ahead, then restore and the same call
	Pooled     = "pooled"     // a sandbox from a pool (pkg/pool), restored, the same call
	Warm       = "warm"       // a sandbox restored ahead (pool.Warm), taken, the same call
	Measure    = "measure"    // the measure-mode restore that capture records
)

// CoreSeries returns the series measured for every set, in their order within a round.
func CoreSeries() []string {
	return []string{Floor, Cold, Restore, Prestarted, Pooled, Warm, Measure}
}

// DefaultPoolSize is the size of the pool of the pooled series when Options.Pool is zero.
const DefaultPoolSize = 2

// Variant is a restore to the answer with other restore flags, and from an image captured with
// other checkpoint options when it names some (config bench.variants).
type Variant struct {
	Name              string            `json:"name"`
	Flags             []string          `json:"flags"`
	CheckpointOptions map[string]string `json:"checkpoint_options,omitempty"`
	// ColdPageCache evicts the image's files from the page cache before each restore.
	ColdPageCache bool `json:"cold_page_cache,omitempty"`
	// GlobalFlags are further runsc global flags of the variant's sandboxes (capture, restore,
	// its pool's creates); PreCheckpoint the executor's steps before its image's checkpoint.
	GlobalFlags   []string `json:"global_flags,omitempty"`
	PreCheckpoint []string `json:"pre_checkpoint,omitempty"`
	// Pooled restores from a pool of sandboxes created ahead, timed from Get to the answer.
	Pooled bool `json:"pooled,omitempty"`
	// WithoutHelpers boots the variant's sandboxes without runsc's helpers, from noHelpers: an
	// empty directory as runsc's helpers directory (withHelpersDir).
	WithoutHelpers bool `json:"without_helpers,omitempty"`
	noHelpers      string
}

// VariantPrefix starts the series name of every variant.
const VariantPrefix = "variant:"

// Variants returns the config's bench variants as series to measure.
func Variants(cfg []config.BenchVariant) []Variant {
	var vs []Variant
	for _, v := range cfg {
		vs = append(vs, Variant{Name: VariantPrefix + v.Name, Flags: append([]string{}, v.RestoreFlags...), CheckpointOptions: maps.Clone(v.CheckpointOptions), ColdPageCache: v.PageCache == "cold",
			GlobalFlags: slices.Clone(v.GlobalFlags), PreCheckpoint: slices.Clone(v.PreCheckpoint), Pooled: v.Pooled, WithoutHelpers: v.WithoutHelpers})
	}
	return vs
}

// optionsKey names a set of checkpoint options, the same for equal sets.
func optionsKey(options map[string]string) string {
	var parts []string
	for _, k := range slices.Sorted(maps.Keys(options)) {
		parts = append(parts, k+"="+options[k])
	}
	return strings.Join(parts, ",")
}

// MeasuredSet is one checkpoint to measure.
type MeasuredSet struct {
	ID      string   `json:"id"`
	Imports []string `json:"imports"`
	Dir     string   `json:"-"`
	Bytes   int64    `json:"bytes"`
	// VariantDirs hold the set captured for variants with images of their own (by
	// Variant.imageKey); VariantBytes their sizes.
	VariantDirs  map[string]string `json:"-"`
	VariantBytes map[string]int64  `json:"variant_bytes,omitempty"`
}

// Trial is one measurement: a set, a series, a round.
type Trial struct {
	Round  int
	Set    int // index into the sets
	Series string
}

func (t Trial) roundName() string {
	if t.Round < 0 {
		return "warm-up round"
	}
	return fmt.Sprintf("round %d", t.Round+1)
}

// Schedule orders the trials round by round: every set and every series once per round
// (A B C D A B C D ...), never all of one series before the next.
func Schedule(sets, rounds int, series []string) []Trial {
	trials := make([]Trial, 0, sets*rounds*len(series))
	for r := range rounds {
		for s := range sets {
			for _, name := range series {
				trials = append(trials, Trial{Round: r, Set: s, Series: name})
			}
		}
	}
	return trials
}

// Runner performs one trial and returns its time in milliseconds.
type Runner interface {
	Run(ctx context.Context, set MeasuredSet, series string) (float64, error)
}

// DerivedRunner is a Runner whose trials may yield figures of further series: Derived returns
// those of the trial that just ran (a variant's time to its last page loaded).
type DerivedRunner interface {
	Runner
	Derived() map[string]float64
}

// CPURunner is a Runner whose trials may give the restore's CPU time: RestoreCPU returns that
// of the trial that just ran, in milliseconds, or false.
type CPURunner interface {
	Runner
	RestoreCPU() (float64, bool)
}

// SetReport holds one set's figures.
type SetReport struct {
	MeasuredSet
	Series map[string]Stats `json:"series"`
	// Ratios of medians: cold/restore, restore/floor, prestarted/floor, pooled/floor,
	// warm/floor.
	Ratios map[string]float64 `json:"ratios"`
	// ResidentBytes is, by series, the median memory of the series' sandbox before its call:
	// for warm, a sandbox restored and idle (launch.Sandbox.Resident).
	ResidentBytes map[string]int64 `json:"resident_bytes,omitempty"`
}

// Fit is the least-squares line of restore median against image size.
type Fit struct {
	Series        string  `json:"series"`
	AlphaMsPerMiB float64 `json:"alpha_ms_per_mib"`
	InterceptMs   float64 `json:"intercept_ms"`
	Points        int     `json:"points"`
	// Sizes is the number of distinct image sizes: a cost model needs at least two.
	Sizes    int     `json:"sizes"`
	RSquared float64 `json:"r_squared"`
}

// Fitted reports whether there were two image sizes or more to fit a cost model to.
func (f Fit) Fitted() bool { return f.Sizes >= 2 }

// Describe returns the cost model in words, or why there is none.
func (f Fit) Describe() string {
	if !f.Fitted() {
		return fmt.Sprintf("no cost model: it needs at least two image sizes, and %d %s measured", f.Points, plural(f.Points, "set was", "sets were"))
	}
	return fmt.Sprintf("%.2f ms/MiB + %.0f ms, R² %.2f (%d sets)", f.AlphaMsPerMiB, f.InterceptMs, f.RSquared, f.Points)
}

func plural(n int, one, many string) string {
	if n == 1 {
		return one
	}
	return many
}

// Results are the figures of one run of the benchmark.
type Results struct {
	// WarmupRounds ran first and were discarded: the first sandboxes of a run pay for cold
	// caches that no later one does.
	WarmupRounds int         `json:"warmup_rounds"`
	Rounds       int         `json:"rounds"`
	Series       []string    `json:"series"`
	Sets         []SetReport `json:"sets"`
	Fit          Fit         `json:"fit"`
}

// Execute runs one warm-up round, discarded, then every trial of the schedule with runner;
// progress, if set, sees each result (a warm-up trial's Round is -1).
func Execute(ctx context.Context, sets []MeasuredSet, series []string, rounds int, runner Runner, progress func(Trial, float64)) (*Results, error) {
	raw := make([]map[string][]float64, len(sets))
	cpu := make([]map[string][]float64, len(sets)) // restore CPU times beside raw's runs
	for i := range raw {
		raw[i], cpu[i] = map[string][]float64{}, map[string][]float64{}
	}
	var derived []string // series the runner added, in the order first seen
	warmup := Schedule(len(sets), 1, series)
	for i := range warmup {
		warmup[i].Round = -1
	}
	for _, t := range append(warmup, Schedule(len(sets), rounds, series)...) {
		if err := ctx.Err(); err != nil {
			return nil, context.Cause(ctx)
		}
		ms, err := runner.Run(ctx, sets[t.Set], t.Series)
		if err != nil {
			return nil, fmt.Errorf("bench: %s, %s, %s: %w", sets[t.Set].ID, t.Series, t.roundName(), err)
		}
		if t.Round >= 0 {
			raw[t.Set][t.Series] = append(raw[t.Set][t.Series], ms)
			if c, ok := runner.(CPURunner); ok {
				if cpuMs, ok := c.RestoreCPU(); ok {
					cpu[t.Set][t.Series] = append(cpu[t.Set][t.Series], cpuMs)
				}
			}
			if d, ok := runner.(DerivedRunner); ok {
				for _, name := range slices.Sorted(maps.Keys(d.Derived())) {
					raw[t.Set][name] = append(raw[t.Set][name], d.Derived()[name])
					if !slices.Contains(derived, name) {
						derived = append(derived, name)
					}
				}
			}
		}
		if progress != nil {
			progress(t, ms)
		}
	}
	res := &Results{WarmupRounds: 1, Rounds: rounds, Series: append(slices.Clone(series), derived...)}
	for i, set := range sets {
		rep := SetReport{MeasuredSet: set, Series: map[string]Stats{}, Ratios: map[string]float64{}}
		for name, runs := range raw[i] {
			st := Summarize(runs)
			if len(cpu[i][name]) == len(runs) { // only run by run, never some runs' alone
				st.RestoreCPU = cpu[i][name]
			}
			rep.Series[name] = st
		}
		ratio := func(key, num, den string) {
			n, okN := rep.Series[num]
			d, okD := rep.Series[den]
			if okN && okD && d.Median > 0 {
				rep.Ratios[key] = n.Median / d.Median
			}
		}
		ratio("cold/restore", Cold, Restore)
		ratio("restore/floor", Restore, Floor)
		ratio("prestarted/floor", Prestarted, Floor)
		ratio("pooled/floor", Pooled, Floor)
		ratio("warm/floor", Warm, Floor)
		res.Sets = append(res.Sets, rep)
	}
	res.Fit = fitSizes(res.Sets)
	return res, nil
}

// fitSizes fits the cost model: the measure-mode restore's median against image size.
func fitSizes(sets []SetReport) Fit {
	var sizes []int64
	var medians []float64
	for _, set := range sets {
		if st, ok := set.Series[Measure]; ok {
			sizes = append(sizes, set.Bytes)
			medians = append(medians, st.Median)
		}
	}
	line := measure.CostModel(sizes, medians)
	return Fit{Series: Measure, AlphaMsPerMiB: line.Slope, InterceptMs: line.Intercept, Points: line.Points, Sizes: line.DistinctX, RSquared: line.RSquared}
}

// Fastest returns the variant with the lowest sum of medians over the sets among those with a
// cold page cache (cold) or a warm one, or false if none was measured.
func (r *Results) Fastest(variants []Variant, cold bool) (Variant, bool) {
	best, bestSum, found := Variant{}, math.Inf(1), false
	for _, v := range variants {
		if v.ColdPageCache != cold {
			continue
		}
		sum := 0.0
		for _, s := range r.Sets {
			st, ok := s.Series[v.Name]
			if !ok {
				sum = math.Inf(1)
				break
			}
			sum += st.Median
		}
		if sum < bestSum {
			best, bestSum, found = v, sum, true
		}
	}
	return best, found
}
