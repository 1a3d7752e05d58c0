package bench

import (
	"fmt"
	"io"
	"strings"
)

// WriteBenchfmt writes every measured run in the Go benchmark format, one line per run
// (BenchmarkRestore/set=pandas/series=restore/conc=1 1 389000000 ns/op 39.7 MiB; restores
// released together are BenchmarkRestoreAtOnce/.../conc=K, one line per restore, and
// BenchmarkRestoreAtOnceBatch in restores/s, one line per batch), so that
// `benchstat old.txt new.txt` compares two runs with its own statistics and
// `benchstat bench.txt` summarizes one. The header names the machine and runsc.
func WriteBenchfmt(w io.Writer, r *Report) error {
	var b strings.Builder
	fmt.Fprintf(&b, "goos: linux\ngoarch: amd64\npkg: readie.dev/pipeline/bench\ncpu: %s\n", r.Machine.CPUModel)
	fmt.Fprintf(&b, "runsc: %s\nrestore-flags: %s\n", r.Runsc.Version, strings.Join(r.RestoreFlags, " "))
	for _, s := range r.Sets {
		for _, name := range r.Series {
			st, ok := s.Series[name]
			if !ok {
				continue
			}
			mib := float64(s.seriesBytes(name, r.Variants)) / (1 << 20)
			for _, ms := range st.Runs {
				fmt.Fprintf(&b, "BenchmarkRestore/set=%s/series=%s/conc=1 1 %d ns/op %.1f MiB\n", s.ID, name, int64(ms*1e6), mib)
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
