package bench

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"maps"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"time"

	"github.com/sirupsen/logrus"

	"readie.dev/pipeline/internal/config"
	"readie.dev/pipeline/internal/progress"
	"readie.dev/pipeline/internal/run"
	"readie.dev/pipeline/pkg/atomicfile"
	"readie.dev/pipeline/pkg/capture"
	"readie.dev/pipeline/pkg/launch"
	"readie.dev/pipeline/pkg/measure"
	"readie.dev/pipeline/pkg/sandbox"
)

// Options select what `pipeline bench` measures.
type Options struct {
	Only     []string
	Rounds   int
	Variants bool // also the restore variants (flags, zero-pages images)
	Explain  bool // also break one restore per set down from runsc's debug log
	// Concurrency lists the numbers of restores at once to measure on the largest set.
	Concurrency []int
	// Pool is the size of the pool of the pooled series (DefaultPoolSize when zero).
	Pool int
	// Revision is the pipeline's own version and VCS revision, for the report.
	Revision string
	// progress is the run's (run.Env's), set by Run.
	progress *progress.Meter
}

// Run measures the checkpoints of out side by side, restoring them exactly as their manifest
// records, and writes bench.json and bench.svg into out.
func Run(ctx context.Context, env *run.Env, out string, o Options) (*Report, error) {
	var report *Report
	o.progress = env.Progress
	_, err := env.WithVerifiedOutput(ctx, out, o.Only, func(x *run.VerifiedOutput) error {
		var err error
		report, err = runOn(ctx, x, o)
		return err
	})
	return report, err
}

func runOn(ctx context.Context, x *run.VerifiedOutput, o Options) (*Report, error) {
	env, m, work := x.Sandboxes, x.Manifest, x.Work
	var sets []MeasuredSet
	for _, c := range x.Picked {
		sets = append(sets, MeasuredSet{ID: c.ID, Imports: c.Imports, Dir: x.Dir(c), Bytes: c.Bytes})
	}
	restorer := env.Restorer(work, env.Config.Timeouts.Restore)
	series := CoreSeries()
	var variants []Variant
	if o.Variants {
		variants = Variants(env.Config.Bench.Variants)
		if err := withHelpersDir(variants, work); err != nil {
			return nil, err
		}
		if err := captureVariantImages(ctx, env, sets, variants, work); err != nil {
			return nil, err
		}
		for _, v := range variants {
			series = append(series, v.Name)
		}
	}
	size := o.Pool
	if size == 0 {
		size = DefaultPoolSize
	}
	// One pool for every set: one spec serves every checkpoint of the output.
	p, err := NewPool(ctx, &restorer.Launcher, size)
	if err != nil {
		return nil, err
	}
	defer p.Close()
	env.Log.WithFields(logrus.Fields{"sets": len(sets), "series": len(series), "rounds": o.Rounds, "pool": size}).Info("bench: start")
	start := time.Now()
	logDir, err := os.MkdirTemp(work, "variant-log-")
	if err != nil {
		return nil, err
	}
	// The warm series' restores go through the kit's one path, as a worker's: the output's
	// restorer, its sandboxes named by the run's lease.
	kit, err := x.Output.Restorer(launch.Options{Runtime: env.Runtime, WorkDir: work, Limits: env.Config.SandboxLimits()})
	if err != nil {
		return nil, err
	}
	warm, err := NewWarm(ctx, kit, sets, env.Config.Timeouts.Restore)
	if err != nil {
		return nil, err
	}
	defer warm.Close()
	if err := warm.Wait(ctx); err != nil { // no restore ahead beside the first trials
		return nil, err
	}
	runner := &SandboxRunner{Restorer: restorer, Variants: variants, Pool: p, PoolSize: size, LogDir: logDir, Warm: warm, Kit: kit}
	defer runner.Close()
	machine := ThisMachine()
	sampler, err := sampleLoad(ctx, LoadInterval)
	if err != nil {
		return nil, err
	}
	trials, total := 0, (o.Rounds+1)*len(sets)*len(series) // the warm-up round too
	results, err := Execute(ctx, sets, series, o.Rounds, runner,
		func(t Trial, ms float64) {
			env.Log.WithFields(logrus.Fields{"round": t.Round + 1, "set": sets[t.Set].ID, "series": t.Series, "ms": ms}).Debug("bench: trial")
			trials++
			round := "warm-up"
			if t.Round >= 0 {
				round = fmt.Sprintf("round %d/%d", t.Round+1, o.Rounds)
			}
			o.progress.Step("bench", trials, total, "trials", fmt.Sprintf("%s, %s %s", round, sets[t.Set].ID, t.Series))
		})
	o.progress.Done()
	load, loadErr := sampler.stop(machine.CPUs)
	if err != nil {
		return nil, err
	}
	if loadErr != nil {
		return nil, loadErr
	}
	env.Log.WithFields(logrus.Fields{"took": time.Since(start).Round(time.Second), "load": load.Describe()}).Info("bench: done")
	if load.Warning != "" {
		env.Log.Warn("bench: " + load.Warning)
	}
	// Before the restores at once: no idle sandbox beside them.
	if err := errors.Join(p.Close(), warm.Close(), runner.Close()); err != nil {
		return nil, err
	}
	resident := runner.Resident()
	for i := range results.Sets {
		results.Sets[i].ResidentBytes = resident[results.Sets[i].ID]
	}
	report := &Report{
		CreatedAt: time.Now().UTC(), Machine: machine, Load: load, Revision: o.Revision, Runsc: m.Runsc,
		RunscFlags: env.Runtime.Flags.Args(), RestoreFlags: slices.Clone(m.RestoreFlags),
		CheckpointOptions: maps.Clone(m.CheckpointOptions), Variants: variants, Results: *results,
	}
	if v, ok := results.Fastest(variants, false); ok {
		report.FastestVariant = &v
	}
	if v, ok := results.Fastest(variants, true); ok {
		report.FastestColdVariant = &v
	}
	if len(o.Concurrency) > 0 {
		if err := measureConcurrency(ctx, x, report, restorer, sets, variants, o); err != nil {
			return nil, err
		}
	}
	if o.Explain {
		for _, set := range sets {
			for _, pooled := range []bool{false, true} {
				b, err := explainOne(ctx, restorer, set, work, pooled)
				if err != nil {
					return nil, fmt.Errorf("bench --explain: %s: %w", set.ID, err)
				}
				report.Explain = append(report.Explain, b)
			}
		}
		bs, err := explainWarm(ctx, kit, sets, env.Config.Timeouts.Restore)
		if err != nil {
			return nil, fmt.Errorf("bench --explain: %w", err)
		}
		report.Explain = append(report.Explain, bs...)
	}
	report.Dir, err = writeRun(x.Out, report, results)
	if err != nil {
		return nil, err
	}
	return report, nil
}

// measureConcurrency measures K restores at once on the largest set and says which flags are
// fastest at 1 and at bench.concurrency; the latter go into the report (bench.json) with the
// config line that restores with them. The manifest is left alone.
func measureConcurrency(ctx context.Context, x *run.VerifiedOutput, report *Report, restorer *measure.Restorer, sets []MeasuredSet, variants []Variant, o Options) error {
	env := x.Sandboxes
	largest := sets[0]
	for _, s := range sets {
		if s.Bytes > largest.Bytes {
			largest = s
		}
	}
	start := time.Now()
	cs, err := RunConcurrency(ctx, restorer, largest, variants, o.Concurrency, o.Rounds, func(c Concurrent, round int) {
		env.Log.WithFields(logrus.Fields{"set": c.Set, "series": c.Series, "at_once": c.Concurrency, "round": round + 1}).Debug("bench: concurrent batch")
		o.progress.Step("bench, restores at once", round+1, o.Rounds, "rounds", fmt.Sprintf("%d at once, %s", c.Concurrency, c.Series))
	})
	o.progress.Done()
	if err != nil {
		return err
	}
	for _, c := range cs {
		env.Log.WithFields(logrus.Fields{"series": c.Series, "at_once": c.Concurrency, "median_ms": c.Latency.Median, "start_spread_ms": c.SpreadMS}).Info("bench: concurrent restores")
	}
	env.Log.WithField("took", time.Since(start).Round(time.Second)).Info("bench: concurrency done")
	report.Concurrency = cs
	// Only flags can be recommended for the manifest's images, not another image's options.
	var applicable []Concurrent
	for _, c := range cs {
		if !slices.ContainsFunc(variants, func(v Variant) bool { return v.Name == c.Series && v.OwnImage() }) {
			applicable = append(applicable, c)
		}
	}
	workers := env.Config.Bench.Concurrency
	one, okOne := BestAt(applicable, 1)
	best, ok := BestAt(applicable, workers)
	if !ok {
		report.Recommendation = fmt.Sprintf("bench.concurrency %d was not measured (--concurrency %v): no restore flags recommended", workers, o.Concurrency)
		return nil
	}
	// Never nil once measured: no flags is [] in bench.json, not measured null.
	flags := append([]string{}, seriesFlags(best.Series, x.Manifest.RestoreFlags, variants)...)
	report.RecommendedRestoreFlags, report.RecommendedAt = flags, workers
	report.Recommendation = fmt.Sprintf("fastest at %d at once (bench.concurrency): %s %v, recorded in bench.json; to restore with them, capture with %s",
		workers, best.Series, flags, RestoreFlagsLine(flags))
	if okOne && one.Series != best.Series {
		report.Recommendation += fmt.Sprintf("; one at a time the fastest is %s: the best flags differ with concurrency", one.Series)
	}
	return nil
}

// RestoreFlagsLine returns the config line (pipeline.yaml) that restores with flags.
func RestoreFlagsLine(flags []string) string {
	data, _ := json.Marshal(append([]string{}, flags...)) // a YAML flow sequence; [] for none
	return "runsc.restore_flags: " + string(data)
}

// seriesFlags returns the restore flags a series restores with.
func seriesFlags(series string, manifestFlags []string, variants []Variant) []string {
	for _, v := range variants {
		if v.Name == series && !v.OwnImage() {
			return slices.Clone(v.Flags)
		}
	}
	return slices.Clone(manifestFlags)
}

// writeRun writes bench.json, bench.txt and bench.svg of one run into OUT/bench/<UTC time>/,
// keeping earlier runs, and points OUT/bench/latest at it.
func writeRun(out string, report *Report, results *Results) (string, error) {
	return writeRunDir(out, report.CreatedAt,
		"bench.json", report,
		runFile{"bench.txt", func(w io.Writer) error { return WriteBenchfmt(w, report) }},
		runFile{"bench.svg", func(w io.Writer) error {
			if err := WriteChart(w, results, report.Concurrency); err != nil {
				return fmt.Errorf("draw bench.svg: %w", err)
			}
			return nil
		}})
}

// runFile is one file of a bench run and what writes it.
type runFile struct {
	name  string
	write func(io.Writer) error
}

// writeRunDir writes the report as JSON into jsonName, then files, each atomically, into a new
// run directory (newRunDir), and points OUT/bench/latest at it.
func writeRunDir(out string, created time.Time, jsonName string, report any, files ...runFile) (string, error) {
	dir, err := newRunDir(out, created)
	if err != nil {
		return "", err
	}
	if err := atomicfile.WriteJSON(filepath.Join(dir, jsonName), report); err != nil {
		return "", err
	}
	for _, f := range files {
		var buf bytes.Buffer
		if err := f.write(&buf); err != nil {
			return "", err
		}
		if err := atomicfile.Write(filepath.Join(dir, f.name), buf.Bytes(), 0o644); err != nil {
			return "", err
		}
	}
	return dir, pointLatest(dir)
}

// newRunDir makes the directory of one bench run, OUT/bench/<UTC time>/, never over an
// earlier run's files (even one of the same second).
func newRunDir(out string, created time.Time) (string, error) {
	history := filepath.Join(out, "bench")
	if err := os.MkdirAll(history, 0o755); err != nil {
		return "", err
	}
	stamp := created.UTC().Format("20060102T150405Z")
	dir := filepath.Join(history, stamp)
	for n := 2; ; n++ {
		err := os.Mkdir(dir, 0o755)
		if err == nil {
			return dir, nil
		}
		if !errors.Is(err, fs.ErrExist) {
			return "", err
		}
		dir = filepath.Join(history, fmt.Sprintf("%s-%d", stamp, n))
	}
}

// pointLatest points OUT/bench/latest at the run directory dir, atomically: a new link beside
// it, renamed over it.
func pointLatest(dir string) error {
	history := filepath.Dir(dir)
	tmp := filepath.Join(history, ".latest-"+filepath.Base(dir))
	os.Remove(tmp)
	if err := os.Symlink(filepath.Base(dir), tmp); err != nil {
		return err
	}
	return os.Rename(tmp, filepath.Join(history, "latest"))
}

// captureVariantImages captures every set again for each variant with an image of its own
// (checkpoint options, global flags, pre-checkpoint steps: once per distinct imageKey), in
// sandboxes with the variant's global flags; the images live in work and go with it.
func captureVariantImages(ctx context.Context, env *run.Sandboxes, sets []MeasuredSet, variants []Variant, work string) error {
	version, err := env.Runtime.Version(ctx)
	if err != nil {
		return err
	}
	for _, v := range variants {
		key := v.imageKey()
		for i := range sets {
			set := &sets[i]
			if key == "" || set.VariantDirs[key] != "" {
				continue
			}
			dir := filepath.Join(work, fmt.Sprintf("variant-%d-%s", len(set.VariantDirs), set.ID))
			req := env.CaptureRequest(config.PackageSet{ID: set.ID, Imports: set.Imports}, dir, work, version, v.CheckpointOptions)
			if len(v.PreCheckpoint) > 0 {
				req.Env = append(req.Env, sandbox.PreCheckpointEnv+"="+strings.Join(v.PreCheckpoint, ","))
			}
			meta, err := capture.Run(ctx, v.runtime(env.Runtime, ""), req)
			if err != nil {
				return fmt.Errorf("bench: image for %s: %w", v.Name, err)
			}
			if set.VariantDirs == nil {
				set.VariantDirs, set.VariantBytes = map[string]string{}, map[string]int64{}
			}
			set.VariantDirs[key], set.VariantBytes[key] = dir, meta.Bytes()
			env.Log.WithFields(logrus.Fields{"set": set.ID, "image": key, "bytes": meta.Bytes(), "default_bytes": set.Bytes}).Info("bench: captured a variant's image")
		}
	}
	return nil
}

// explainWarm times one warm start per set (TimeWarmCall) from a warm pool of its own: the
// take and the call are all that is on the clock; the restore the pool ran ahead is AheadMs.
func explainWarm(ctx context.Context, kit *launch.Restorer, sets []MeasuredSet, timeout time.Duration) (_ []Breakdown, err error) {
	w, err := NewWarm(ctx, kit, sets, timeout)
	if err != nil {
		return nil, err
	}
	defer func() { err = errors.Join(err, w.Close()) }()
	if err := w.Wait(ctx); err != nil {
		return nil, err
	}
	stats := w.Stats()
	var bs []Breakdown
	for _, set := range sets {
		marks, _, err := TimeWarmCall(ctx, kit, w, set.ID, set.Imports, timeout)
		if err != nil {
			return nil, fmt.Errorf("%s, warm: %w", set.ID, err)
		}
		b := Breakdown{Set: set.ID, Path: Warm, Total: marks.TotalMS(),
			Wake: launch.MS(marks.Connected.Sub(marks.Began)), Call: launch.MS(marks.Answered.Sub(marks.Connected))}
		if st := stats[set.ID]; st.Restored > 0 {
			b.AheadMs = launch.MS(st.RestoreTime / time.Duration(st.Restored))
		}
		bs = append(bs, b)
	}
	return bs, nil
}

// explainOne restores set once with runsc's debug log on and breaks the time down: a restore
// that makes its sandbox, or with pooled the pool's path, a restore onto a sandbox made by
// `runsc create` beforehand (the same runsc commands a pooled start runs; Get itself reads
// /proc only), so the breakdown shows what is left once the sandbox boot is off the clock.
func explainOne(ctx context.Context, restorer *measure.Restorer, set MeasuredSet, work string, pooled bool) (Breakdown, error) {
	logDir, err := os.MkdirTemp(work, "debug-")
	if err != nil {
		return Breakdown{}, err
	}
	defer os.RemoveAll(logDir)
	rt := *restorer.Runtime
	rt.DebugLogDir = logDir
	debug := *restorer
	debug.Runtime = &rt
	marks, err := TimeRestoreCall(ctx, &debug, set.ID, set.Dir, set.Imports, pooled)
	if err != nil {
		return Breakdown{}, err
	}
	b, err := Explain(set.ID, logDir, marks)
	b.Path = Restore
	if pooled {
		b.Path = Pooled
	}
	return b, err
}
