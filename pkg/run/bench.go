package run

import (
	"bytes"
	"context"
	"fmt"
	"maps"
	"os"
	"path/filepath"
	"slices"
	"time"

	"github.com/sirupsen/logrus"

	"readie.dev/pipeline/pkg/bench"
	"readie.dev/pipeline/pkg/capture"
	"readie.dev/pipeline/pkg/manifest"
)

// BenchOptions select what `pipeline bench` measures.
type BenchOptions struct {
	Only     []string
	Rounds   int
	Variants bool // also the restore variants (flags, zero-pages images)
	Explain  bool // also break one restore per set down from runsc's debug log
}

// Bench measures the checkpoints of out side by side and writes bench.json and bench.svg
// into it.
func (e *Env) Bench(ctx context.Context, out string, o BenchOptions) (*bench.Report, error) {
	var report *bench.Report
	_, err := e.onExisting(ctx, out, o.Only, func(r *existingRun) error {
		var err error
		report, err = e.bench(ctx, out, r, o)
		return err
	})
	return report, err
}

func (e *Env) bench(ctx context.Context, out string, r *existingRun, o BenchOptions) (*bench.Report, error) {
	m, work := r.manifest, r.work
	var sets []bench.Set
	for _, c := range r.picked {
		sets = append(sets, bench.Set{ID: c.ID, Imports: c.Imports, Dir: filepath.Join(out, c.Dir), Bytes: c.Bytes})
	}
	restorer := e.restorer(work)
	restorer.Flags = m.RestoreFlags // restore the way the checkpoints were recorded
	series := bench.CoreSeries()
	var variants []bench.Variant
	if o.Variants {
		variants = bench.Variants()
		if err := e.captureZeroPages(ctx, sets, work); err != nil {
			return nil, err
		}
		for _, v := range variants {
			series = append(series, v.Name)
		}
	}
	e.Log.WithFields(logrus.Fields{"sets": len(sets), "series": len(series), "rounds": o.Rounds}).Info("bench: start")
	start := time.Now()
	results, err := bench.Execute(ctx, sets, series, o.Rounds, &bench.SandboxRunner{Restorer: restorer, Variants: variants},
		func(t bench.Trial, ms float64) {
			e.Log.WithFields(logrus.Fields{"round": t.Round + 1, "set": sets[t.Set].ID, "series": t.Series, "ms": round1(ms)}).Debug("bench: trial")
		})
	if err != nil {
		return nil, err
	}
	e.Log.WithField("took", time.Since(start).Round(time.Second)).Info("bench: done")
	report := &bench.Report{
		CreatedAt: time.Now().UTC(), Machine: bench.ThisMachine(), Runsc: m.Runsc,
		RunscFlags: e.Runtime.Flags.Args(), RestoreFlags: slices.Clone(m.RestoreFlags),
		CheckpointOptions: maps.Clone(m.CheckpointOptions), Variants: variants, Results: *results,
	}
	if v, ok := results.Fastest(variants); ok {
		report.FastestVariant = &v
	}
	if o.Explain {
		for _, set := range sets {
			b, err := e.explainOne(ctx, set, m.RestoreFlags, work)
			if err != nil {
				return nil, fmt.Errorf("bench --explain: %s: %w", set.ID, err)
			}
			report.Explain = append(report.Explain, b)
		}
	}
	if err := manifest.WriteJSON(filepath.Join(out, "bench.json"), report); err != nil {
		return nil, err
	}
	var svg bytes.Buffer
	if err := bench.WriteChart(&svg, results); err != nil {
		return nil, fmt.Errorf("draw bench.svg: %w", err)
	}
	if err := manifest.WriteFileAtomic(filepath.Join(out, "bench.svg"), svg.Bytes(), 0o644); err != nil {
		return nil, err
	}
	return report, nil
}

// captureZeroPages captures every set again with committed zero pages excluded, for the
// variants; the images live in work and go with it.
func (e *Env) captureZeroPages(ctx context.Context, sets []bench.Set, work string) error {
	version, err := e.Runtime.Version(ctx)
	if err != nil {
		return err
	}
	for i := range sets {
		set := &sets[i]
		dir := filepath.Join(work, "zero-"+set.ID)
		meta, err := capture.Run(ctx, e.Runtime, capture.Request{
			ID: set.ID, Imports: set.Imports, Rootfs: e.Rootfs.Path, Dir: dir, WorkDir: work,
			Env: e.sandboxEnv, CheckpointOptions: map[string]string{"exclude-committed-zero-pages": "true"},
			Timeout: e.Config.Timeouts.Capture, RunscVersion: version,
		})
		if err != nil {
			return fmt.Errorf("bench: zero-pages image: %w", err)
		}
		set.ZeroDir, set.ZeroBytes = dir, meta.Bytes()
		e.Log.WithFields(logrus.Fields{"set": set.ID, "bytes": set.ZeroBytes, "default_bytes": set.Bytes}).Info("bench: captured zero-pages image")
	}
	return nil
}

// explainOne restores set once with runsc's debug log on and breaks the time down.
func (e *Env) explainOne(ctx context.Context, set bench.Set, flags []string, work string) (bench.Breakdown, error) {
	logDir, err := os.MkdirTemp(work, "debug-")
	if err != nil {
		return bench.Breakdown{}, err
	}
	defer os.RemoveAll(logDir)
	rt := *e.Runtime
	rt.DebugLogDir = logDir
	restorer := e.restorer(work)
	restorer.Runtime = &rt
	restorer.Flags = flags
	marks, err := restorer.RestoreCallMarks(ctx, set.ID, set.Dir, set.Imports, false)
	if err != nil {
		return bench.Breakdown{}, err
	}
	return bench.Explain(set.ID, logDir, marks)
}
