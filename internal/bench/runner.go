package bench

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"os"
	"runtime"
	"strings"
	"time"

	"readie.dev/pipeline/pkg/launch"
	"readie.dev/pipeline/pkg/manifest"
	"readie.dev/pipeline/pkg/measure"
	"readie.dev/pipeline/pkg/pool"
)

// SandboxRunner runs trials with real sandboxes.
type SandboxRunner struct {
	// Restorer restores with the flags the checkpoints were recorded with.
	Restorer *measure.Restorer
	Variants []Variant
	// Pool serves the pooled series: sandboxes of the restore's shape created ahead.
	Pool *pool.Pool
	// PoolSize is the size of each pooled variant's pool (DefaultPoolSize when zero).
	PoolSize int
	// Warm serves the warm series: a sandbox of each set restored ahead, through Kit, the
	// output's restorer as a worker makes it.
	Warm *pool.Warm
	Kit  *launch.Restorer
	// LogDir holds runsc's info log of one variant trial at a time, read for the time to the
	// last page loaded; emptied before each.
	LogDir string

	variantPools variantPools
	derived      map[string]float64
	resident     map[string]map[string][]float64 // set, series: bytes per trial
	restoreCPU   float64
	hasCPU       bool
}

// Resident returns, by set and series, the median memory measured before each trial's call
// (the warm series').
func (s *SandboxRunner) Resident() map[string]map[string]int64 {
	out := map[string]map[string]int64{}
	for set, bySeries := range s.resident {
		out[set] = map[string]int64{}
		for series, runs := range bySeries {
			out[set][series] = int64(measure.Summarize(runs).Median)
		}
	}
	return out
}

// RestoreCPU implements CPURunner: the last trial's restore CPU time, for a variant that
// restores into a sandbox it makes (whose log it reads).
func (s *SandboxRunner) RestoreCPU() (float64, bool) { return s.restoreCPU, s.hasCPU }

// Derived implements DerivedRunner: the last trial's time to its last page loaded, for a
// variant that restores into a sandbox it makes.
func (s *SandboxRunner) Derived() map[string]float64 { return s.derived }

// Close deletes the sandboxes of the pooled variants' pools.
func (s *SandboxRunner) Close() error { return s.variantPools.Close() }

// Run implements Runner.
func (s *SandboxRunner) Run(ctx context.Context, set MeasuredSet, series string) (float64, error) {
	r := s.Restorer
	s.derived, s.restoreCPU, s.hasCPU = nil, 0, false
	switch series {
	case Floor:
		return TimeFloor(ctx, &r.Launcher)
	case Cold:
		return TimeColdCall(ctx, &r.Launcher, set.ID, set.Imports)
	case Restore, Prestarted:
		marks, err := TimeRestoreCall(ctx, r, set.ID, set.Dir, set.Imports, series == Prestarted)
		return marks.TotalMS(), err
	case Pooled:
		if s.Pool == nil {
			return 0, errors.New("the pooled series needs a pool")
		}
		marks, err := TimePooledCall(ctx, s.Pool, set.Dir, r.Flags, set.Imports, r.Timeout)
		return marks.TotalMS(), err
	case Warm:
		if s.Warm == nil || s.Kit == nil {
			return 0, errors.New("the warm series needs a warm pool")
		}
		marks, resident, err := TimeWarmCall(ctx, s.Kit, s.Warm, set.ID, set.Imports, r.Timeout)
		if err == nil {
			if s.resident == nil {
				s.resident = map[string]map[string][]float64{}
			}
			if s.resident[set.ID] == nil {
				s.resident[set.ID] = map[string][]float64{}
			}
			s.resident[set.ID][Warm] = append(s.resident[set.ID][Warm], float64(resident))
		}
		return marks.TotalMS(), err
	case Measure:
		return r.MeasureOnce(ctx, set.ID, set.Dir)
	}
	for _, v := range s.Variants {
		if v.Name != series {
			continue
		}
		dir, err := set.variantDir(v)
		if err != nil {
			return 0, err
		}
		if v.Pooled {
			s.variantPools.size = s.PoolSize
			if s.variantPools.size == 0 {
				s.variantPools.size = DefaultPoolSize
			}
			p, err := s.variantPools.get(ctx, &r.Launcher, v)
			if err != nil {
				return 0, err
			}
			return timePooledVariant(ctx, p, v, set, dir, r.Timeout)
		}
		if v.ColdPageCache {
			if err := EvictPageCache(dir); err != nil { // off the clock
				return 0, err
			}
		}
		if s.LogDir == "" {
			return 0, errors.New("a variant's trial needs a log directory")
		}
		if err := removeLogs(s.LogDir); err != nil {
			return 0, err
		}
		first, lastPage, cpu, err := timeVariant(ctx, r, v, set, dir, s.LogDir)
		if err != nil {
			return 0, err
		}
		s.derived = map[string]float64{v.Name + LastPageSuffix: lastPage}
		s.restoreCPU, s.hasCPU = cpu, true
		return first, nil
	}
	return 0, fmt.Errorf("unknown series %q", series)
}

// Machine describes where the figures were measured.
type Machine struct {
	CPUs     int    `json:"cpus"`
	CPUModel string `json:"cpu_model"`
	Kernel   string `json:"kernel"`
	GOOS     string `json:"goos"`
	GOARCH   string `json:"goarch"`
}

// ThisMachine reads the CPU count and model, the kernel release, and Go's names of the system
// and architecture.
func ThisMachine() Machine {
	m := Machine{CPUs: runtime.NumCPU(), GOOS: runtime.GOOS, GOARCH: runtime.GOARCH}
	if data, err := os.ReadFile("/proc/cpuinfo"); err == nil {
		for _, line := range strings.Split(string(data), "\n") {
			if k, v, ok := strings.Cut(line, ":"); ok && strings.TrimSpace(k) == "model name" {
				m.CPUModel = strings.TrimSpace(v)
				break
			}
		}
	}
	if data, err := os.ReadFile("/proc/sys/kernel/osrelease"); err == nil {
		m.Kernel = string(bytes.TrimSpace(data))
	}
	return m
}

// Report is bench.json: every run's raw figure and what they were measured with.
type Report struct {
	CreatedAt time.Time `json:"created_at"`
	Machine   Machine   `json:"machine"`
	// Load is the machine's load average before, during and after the interleaved rounds.
	Load Load `json:"load"`
	// Revision is the pipeline's version and VCS revision.
	Revision          string            `json:"revision"`
	Runsc             manifest.Runsc    `json:"runsc"`
	RunscFlags        []string          `json:"runsc_flags"`
	RestoreFlags      []string          `json:"restore_flags"`
	CheckpointOptions map[string]string `json:"checkpoint_options"`
	Variants          []Variant         `json:"variants"`
	// FastestVariant is the fastest with a warm page cache (an image restored many times),
	// FastestColdVariant with a cold one (the first restore after a pull).
	FastestVariant     *Variant    `json:"fastest_variant,omitempty"`
	FastestColdVariant *Variant    `json:"fastest_cold_variant,omitempty"`
	Explain            []Breakdown `json:"explain,omitempty"`
	// Concurrency holds K restores at once of the largest set, per series and K.
	Concurrency []Concurrent `json:"concurrency,omitempty"`
	// RecommendedRestoreFlags are the restore flags fastest at RecommendedAt restores at once
	// (bench.concurrency); nil when that was not measured. The bench never writes them into the
	// manifest: only a capture writes a manifest, with the config's runsc.restore_flags.
	RecommendedRestoreFlags []string `json:"recommended_restore_flags"` // null: none; []: no flags
	RecommendedAt           int      `json:"recommended_at,omitempty"`
	// Recommendation says which flags are fastest at bench.concurrency, the config line that
	// restores with them, and whether one restore at a time differs.
	Recommendation string `json:"recommendation,omitempty"`
	// Dir is where this run's files are (OUT/bench/<UTC time>/).
	Dir string `json:"-"`
	Results
}
