// Package measure times restores of a checkpoint, smoke-tests a restored executor through
// the framing package, and summarises timings.
//
// Requests for anyone who calls an executor (EvalRequest, SmokeRequest, DecodeEnvelope, ...)
// are in pkg/pycall.
//
// Statistics: Summarize (min, median, p90, max of runs), Percentile, LeastSquares and
// CostModel (restore median against image size).
//
// Timed restores: Restorer's MeasureRuns, MeasureOnce and Smoke run in sandboxes of a
// pkg/launch Launcher.
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

// Percentile returns the p-th percentile of sorted values, p in [0, 100].
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

// Line is a least-squares line y = Slope*x + Intercept over Points points at DistinctX
// distinct x; RSquared is the share of the variance of y it explains (1 for a perfect fit; 0
// with one point or flat y).
type Line struct {
	Slope, Intercept float64
	Points           int
	DistinctX        int
	RSquared         float64
}

// Fitted reports whether the line was fitted at all: a slope needs two distinct x.
func (l Line) Fitted() bool { return l.DistinctX >= 2 }

// LeastSquares fits a line to (xs, ys). With fewer than two distinct x it returns a flat line
// through the mean.
func LeastSquares(xs, ys []float64) Line {
	l := Line{Points: len(xs)}
	if len(xs) == 0 || len(xs) != len(ys) {
		return l
	}
	distinct := slices.Clone(xs)
	slices.Sort(distinct)
	l.DistinctX = len(slices.Compact(distinct))
	n := float64(len(xs))
	var sx, sy, sxx, sxy float64
	for i := range xs {
		sx += xs[i]
		sy += ys[i]
		sxx += xs[i] * xs[i]
		sxy += xs[i] * ys[i]
	}
	den := n*sxx - sx*sx
	if math.Abs(den) < 1e-12 {
		l.Intercept = sy / n
		return l
	}
	l.Slope = (n*sxy - sx*sy) / den
	l.Intercept = (sy - l.Slope*sx) / n
	mean := sy / n
	var ssTot, ssRes float64
	for i := range xs {
		ssTot += (ys[i] - mean) * (ys[i] - mean)
		d := ys[i] - (l.Slope*xs[i] + l.Intercept)
		ssRes += d * d
	}
	if ssTot > 0 {
		l.RSquared = 1 - ssRes/ssTot
	}
	return l
}

// CostModel returns the line fitted to restore medians (ms) against image sizes (bytes, fitted in MiB): the
// manifest's and the benchmark's cost model, one computation.
func CostModel(sizes []int64, medians []float64) Line {
	mib := make([]float64, len(sizes))
	for i, b := range sizes {
		mib[i] = float64(b) / (1 << 20)
	}
	return LeastSquares(mib, medians)
}
