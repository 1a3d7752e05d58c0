package bench

import (
	"slices"

	"readie.dev/pipeline/pkg/manifest"
	"readie.dev/pipeline/pkg/measure"
)

// Stats are one series' times in milliseconds: every run, manifest.Stats' summary (min,
// median, p90, max), and what a reader needs to judge how far to trust them: p50, p99 and the
// spread, the interquartile range (p25 to p75, the middle half of the runs).
type Stats struct {
	manifest.Stats
	P25 float64 `json:"p25"`
	P50 float64 `json:"p50"`
	P75 float64 `json:"p75"`
	P99 float64 `json:"p99"`
	IQR float64 `json:"iqr"`
	// RestoreCPU is, run by run beside Runs, the sandbox's CPU time when its restore was done
	// as runsc logs it ("restore CPU time"): it varies far less than the wall time on a busy
	// machine. Only for the series whose sandboxes log (variants restored into a sandbox of
	// their own making).
	RestoreCPU []float64 `json:"restore_cpu_ms,omitempty"`
}

// Summarize summarizes runs (in milliseconds, in the order measured).
func Summarize(runs []float64) Stats {
	st := Stats{Stats: measure.Summarize(runs)}
	if len(runs) == 0 {
		return st
	}
	sorted := slices.Sorted(slices.Values(runs))
	st.P25 = measure.Percentile(sorted, 25)
	st.P50 = measure.Percentile(sorted, 50)
	st.P75 = measure.Percentile(sorted, 75)
	st.P99 = measure.Percentile(sorted, 99)
	st.IQR = st.P75 - st.P25
	return st
}
