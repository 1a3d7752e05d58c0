// Package measure times restores of a checkpoint, smoke-tests a restored executor through
// the framing package, and summarises timings.
package measure

import (
	"math"
	"slices"

	"readie.dev/pipeline/pkg/manifest"
)

// Summarize returns min, median, p90 and max of runs (milliseconds), keeping the runs in the
// order they were measured. Percentiles interpolate linearly between the closest ranks.
func Summarize(runs []float64) manifest.Stats {
	st := manifest.Stats{Runs: slices.Clone(runs)}
	if len(runs) == 0 {
		return st
	}
	sorted := slices.Clone(runs)
	slices.Sort(sorted)
	st.Min = sorted[0]
	st.Max = sorted[len(sorted)-1]
	st.Median = Percentile(sorted, 50)
	st.P90 = Percentile(sorted, 90)
	return st
}

// Percentile of sorted values, p in [0, 100].
func Percentile(sorted []float64, p float64) float64 {
	if len(sorted) == 0 {
		return math.NaN()
	}
	rank := p / 100 * float64(len(sorted)-1)
	lo := int(math.Floor(rank))
	hi := int(math.Ceil(rank))
	frac := rank - float64(lo)
	return sorted[lo] + (sorted[hi]-sorted[lo])*frac
}
