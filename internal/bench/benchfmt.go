package bench

import (
	"cmp"
	"fmt"
	"io"
	"strings"
	"time"
)

// WriteBenchfmt writes every measured run in the Go benchmark format, one line per run
// (BenchmarkRestore/set=pandas/series=restore/conc=1 1 389000000 ns/op 39.7 MiB; restores
// released together are BenchmarkRestoreAtOnce/.../conc=K, one line per restore, and
// BenchmarkRestoreAtOnceBatch in restores/s, one line per batch), so that
// `benchstat old.txt new.txt` compares two runs with its own statistics and
// `benchstat bench.txt` summarizes one. The header's configuration lines say where, when and
// how it was measured: goos, goarch, cpu, date (UTC), rounds, runsc, revision (the pipeline's),
// restore-flags, load (before, during, after) and load-warning when the load makes the figures
// doubtful.
func WriteBenchfmt(w io.Writer, r *Report) error {
	var b strings.Builder
	fmt.Fprintf(&b, "goos: %s\ngoarch: %s\npkg: readie.dev/pipeline/bench\ncpu: %s\n", r.Machine.GOOS, r.Machine.GOARCH, r.Machine.CPUModel)
	fmt.Fprintf(&b, "date: %s\nrounds: %d\nrunsc: %s\nrevision: %s\n", r.CreatedAt.UTC().Format(time.RFC3339), r.Rounds, r.Runsc.Version, cmp.Or(r.Revision, "(unknown)"))
	fmt.Fprintf(&b, "restore-flags: %s\nload: %s\n", strings.Join(r.RestoreFlags, " "), r.Load.Describe())
	if r.Load.Warning != "" {
		fmt.Fprintf(&b, "load-warning: %s\n", r.Load.Warning)
	}
	for _, s := range r.Sets {
		for _, name := range r.Series {
			st, ok := s.Series[name]
			if !ok {
				continue
			}
			mib := float64(s.seriesBytes(name, r.Variants)) / (1 << 20)
			for i, ms := range st.Runs {
				fmt.Fprintf(&b, "BenchmarkRestore/set=%s/series=%s/conc=1 1 %d ns/op %.1f MiB", s.ID, name, int64(ms*1e6), mib)
				if len(st.RestoreCPU) == len(st.Runs) {
					fmt.Fprintf(&b, " %.0f restore-cpu-ms", st.RestoreCPU[i])
				}
				b.WriteString("\n")
			}
		}
	}
	for _, c := range r.Concurrency {
		for _, ms := range c.Latency.Runs {
			fmt.Fprintf(&b, "BenchmarkRestoreAtOnce/set=%s/series=%s/conc=%d 1 %d ns/op\n", c.Set, c.Series, c.Concurrency, int64(ms*1e6))
		}
		for _, rps := range c.Batches {
			fmt.Fprintf(&b, "BenchmarkRestoreAtOnceBatch/set=%s/series=%s/conc=%d 1 %.3f restores/s\n", c.Set, c.Series, c.Concurrency, rps)
		}
	}
	_, err := io.WriteString(w, b.String())
	return err
}
