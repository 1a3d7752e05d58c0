package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"path/filepath"
	"runtime"
	"slices"
	"strconv"
	"strings"
	"text/tabwriter"
	"time"

	"readie.dev/pipeline/internal/bench"
	"readie.dev/pipeline/internal/corpus"
	"readie.dev/pipeline/internal/run"
	"readie.dev/pipeline/pkg/catalogue"
	"readie.dev/pipeline/pkg/launch"
	"readie.dev/pipeline/pkg/measure"
)

type benchCmd struct {
	config      configFlag
	out         outFlag
	only        onlyFlag
	runs        runsFlag
	pass        passEnvFlag
	concurrency string
	rounds      int
	capture     bool
	variants    bool
	explain     bool
	// cleanFailed is capture's --clean-failed, for --capture.
	cleanFailed bool
	// corpus, sample and part replay a corpus instead (bench --corpus).
	corpus corpusFlag
	sample int
	part   string
	// pool is the size of the pool of the pooled series.
	pool int
	// arrivals, duration, memory: bench --corpus --arrivals RATE --duration D --memory BUDGET
	// (memoryBytes, from CheckArgs).
	arrivals    float64
	duration    time.Duration
	memory      string
	memoryBytes int64
	// corpusData is the corpus, read before anything else is done.
	corpusData *corpus.Corpus
	// soak, killEvery: bench --soak COUNT|DURATION (soakOpts, from CheckArgs).
	soak      string
	killEvery int
	soakOpts  bench.SoakOptions
	// fs tells which flags were given (CheckArgs refuses some with --soak).
	fs *flag.FlagSet
}

func (*benchCmd) Name() string  { return "bench" }
func (*benchCmd) Usage() string { return "bench [flags] [OUT]" }
func (*benchCmd) Synopsis() string {
	return "restore latency side by side: floor, cold, restore, prestarted, pooled, measure, variants; --soak: thousands of restores"
}
func (c *benchCmd) SetFlags(fs *flag.FlagSet) {
	c.fs = fs
	c.config.register(fs)
	c.out.register(fs)
	c.only.register(fs)
	c.runs.register(fs)
	c.pass.register(fs)
	fs.IntVar(&c.rounds, "rounds", 7, "rounds; every set and series runs once per round, interleaved")
	fs.BoolVar(&c.capture, "capture", false, "capture first, as the capture command does, then bench")
	fs.BoolVar(&c.cleanFailed, "clean-failed", false, "with --capture: remove the staging directory of a failed capture instead of leaving it for inspection")
	fs.BoolVar(&c.variants, "variants", true, "also measure the restore variants of the config's bench.variants")
	fs.BoolVar(&c.explain, "explain", false, "break one restore per set down from runsc's debug log")
	fs.StringVar(&c.concurrency, "concurrency", fmt.Sprintf("1,%d", runtime.NumCPU()), "restores at once to measure on the largest set, comma-separated (empty: none); with --soak one number, default 2")
	fs.StringVar(&c.soak, "soak", "", "a soak instead: COUNT restores, or as many as a DURATION allows (5000, 30m), of each checkpoint in turn, --concurrency at once (one number, default 2), through the worker's kit, every answer checked; reports failures, p50/p99 per minute and what is left (sandboxes, runsc processes, fds, mounts, runsc root and TMPDIR entries, MemAvailable); --rounds, --variants, --corpus and --explain are refused with it")
	fs.IntVar(&c.killEvery, "soak-kill-every", 0, "with --soak: SIGKILL the sandbox process of every Nth restore before its call, a fault whose every failure is reported (0: none)")
	c.corpus.register(fs, "replay this corpus instead: requests started where the output's catalogue chooses, beside cold starts (--sample, --part, --rounds)")
	fs.IntVar(&c.sample, "sample", 20, "with --corpus: how many requests to draw, deterministically")
	fs.StringVar(&c.part, "part", bench.PartHeldOut, "with --corpus: the part to draw from: held-out, planned or all")
	fs.IntVar(&c.pool, "pool", bench.DefaultPoolSize, "sandboxes created ahead for the pooled series (with --corpus: 0 leaves the series out)")
	fs.Float64Var(&c.arrivals, "arrivals", 0, "with --corpus: also requests arriving open-loop, Poisson at RATE a second, drawn from the sample, against a worker of the kit, with warm pools and without (0: none)")
	fs.DurationVar(&c.duration, "duration", time.Minute, "with --arrivals: how long requests arrive")
	fs.StringVar(&c.memory, "memory", "4GiB", "with --arrivals: the memory budget of the warm pools (bytes, or with KiB, MiB, GiB)")
}

// parseBytes reads a size: a number of bytes, or one with a KiB, MiB or GiB suffix.
func parseBytes(s string) (int64, error) {
	num, unit := strings.TrimSpace(s), int64(1)
	for _, u := range []struct {
		suffix string
		bytes  int64
	}{{"KiB", 1 << 10}, {"MiB", 1 << 20}, {"GiB", 1 << 30}} {
		if rest, ok := strings.CutSuffix(num, u.suffix); ok {
			num, unit = strings.TrimSpace(rest), u.bytes
			break
		}
	}
	v, err := strconv.ParseFloat(num, 64)
	if err != nil || !(v >= 0) || v*float64(unit) > 1<<50 {
		return 0, fmt.Errorf("%q: want a size such as 4GiB, 512MiB or 1048576", s)
	}
	return int64(v * float64(unit)), nil
}

// concurrencies parses --concurrency.
func (c *benchCmd) concurrencies() ([]int, error) {
	var ks []int
	for _, part := range strings.Split(c.concurrency, ",") {
		if part = strings.TrimSpace(part); part == "" {
			continue
		}
		k, err := strconv.Atoi(part)
		if err != nil || k < 1 || k > 256 {
			return nil, fmt.Errorf("--concurrency %q: want numbers of restores at once, 1 to 256, e.g. 1,4", c.concurrency)
		}
		if !slices.Contains(ks, k) {
			ks = append(ks, k)
		}
	}
	return ks, nil
}

// soakOptions parses --soak, --soak-kill-every and --concurrency for a soak, and refuses the
// flags of the other benchmarks.
func (c *benchCmd) soakOptions() (bench.SoakOptions, error) {
	o := bench.SoakOptions{Concurrency: 2, KillEvery: c.killEvery, Only: c.only.ids()}
	if n, err := strconv.Atoi(c.soak); err == nil {
		if n < 1 {
			return o, fmt.Errorf("--soak %s: want a number of restores of at least 1, or a duration such as 30m", c.soak)
		}
		o.Count = n
	} else if d, err := time.ParseDuration(c.soak); err == nil && d > 0 {
		o.Duration = d
	} else {
		return o, fmt.Errorf("--soak %q: want a number of restores (5000) or a duration (30m)", c.soak)
	}
	if c.killEvery < 0 {
		return o, fmt.Errorf("--soak-kill-every %d: want a number of restores, or 0 for none", c.killEvery)
	}
	var refused []string
	c.fs.Visit(func(f *flag.Flag) {
		switch f.Name {
		case "rounds", "variants", "corpus", "explain", "sample", "part", "arrivals", "duration", "memory":
			refused = append(refused, "--"+f.Name)
		case "concurrency":
			k, err := strconv.Atoi(strings.TrimSpace(c.concurrency))
			if err != nil || k < 1 || k > 256 {
				refused = append(refused, fmt.Sprintf("--concurrency %q (with --soak: one number, 1 to 256)", c.concurrency))
			}
			o.Concurrency = k
		}
	})
	if len(refused) > 0 {
		return o, fmt.Errorf("--soak restores and calls the output's checkpoints, nothing else: %s cannot go with it", strings.Join(refused, ", "))
	}
	return o, nil
}

func (c *benchCmd) CheckArgs(args []string) error {
	// These shape the capture that --capture runs first; alone they would change nothing.
	var captureOnly []string
	c.fs.Visit(func(f *flag.Flag) {
		if f.Name == "runs" || f.Name == "clean-failed" {
			captureOnly = append(captureOnly, "--"+f.Name)
		}
	})
	if len(captureOnly) > 0 && !c.capture {
		return fmt.Errorf("%s: only with --capture, whose capture it shapes (--runs: the timed restores of its measure step); the benchmark's own repetitions are --rounds", strings.Join(captureOnly, ", "))
	}
	if c.soak != "" {
		o, err := c.soakOptions()
		if err != nil {
			return err
		}
		c.soakOpts = o
		return readsOutput(args)
	}
	if c.killEvery != 0 {
		return errors.New("--soak-kill-every goes with --soak")
	}
	if c.rounds < 1 {
		return fmt.Errorf("--rounds %d: want at least 1", c.rounds)
	}
	if c.pool < 0 || c.pool > 64 || c.pool == 0 && c.corpus.path == "" {
		return fmt.Errorf("--pool %d: want 1 to 64 sandboxes (0 only with --corpus, for no pooled series)", c.pool)
	}
	if _, err := c.concurrencies(); err != nil {
		return err
	}
	if c.corpus.path != "" {
		switch {
		case c.sample < 1:
			return fmt.Errorf("--sample %d: want at least 1 request", c.sample)
		case c.part != bench.PartHeldOut && c.part != bench.PartPlanned && c.part != bench.PartAll:
			return fmt.Errorf("--part %q: want held-out, planned or all", c.part)
		case c.only.list != "" || c.explain:
			return errors.New("--only and --explain are for the set benchmark, not for --corpus")
		}
	}
	var arrivalsFlags []string
	c.fs.Visit(func(f *flag.Flag) {
		if f.Name == "duration" || f.Name == "memory" {
			arrivalsFlags = append(arrivalsFlags, "--"+f.Name)
		}
	})
	switch {
	case !(c.arrivals >= 0) || c.arrivals > 1000:
		return fmt.Errorf("--arrivals %v: want requests a second, 0 to 1000", c.arrivals)
	case c.arrivals > 0 && c.corpus.path == "":
		return errors.New("--arrivals draws its requests from a corpus: it goes with --corpus FILE")
	case c.arrivals == 0 && len(arrivalsFlags) > 0:
		return fmt.Errorf("%s: only with --arrivals RATE", strings.Join(arrivalsFlags, ", "))
	case c.duration <= 0 || c.duration > 24*time.Hour:
		return fmt.Errorf("--duration %s: want a duration from 1s to 24h", c.duration)
	}
	var err error
	if c.memoryBytes, err = parseBytes(c.memory); err != nil {
		return fmt.Errorf("--memory %w", err)
	}
	return readsOutput(args)
}

func (c *benchCmd) Execute(ctx context.Context, con *console, args []string) error {
	var ks []int
	var err error
	if c.soak == "" {
		if ks, err = c.concurrencies(); err != nil {
			return usageError{err}
		}
	}
	cfg, err := c.config.load()
	if err != nil {
		return err
	}
	if err := c.out.apply(cfg, args); err != nil {
		return err
	}
	if err := c.runs.apply(cfg); err != nil {
		return err
	}
	if c.corpus.path != "" {
		if c.corpusData, err = c.corpus.load(); err != nil {
			return err
		}
	}
	var opts run.CaptureOptions
	if c.capture {
		sel, err := cfg.Select(c.only.ids(), nil)
		if err != nil {
			return usageError{err}
		}
		opts.Selection = sel
	}
	env, err := newEnv(ctx, cfg, con)
	if err != nil {
		return err
	}
	defer env.Close()
	env.CleanFailed = c.cleanFailed
	env.PassEnvToOutputs = c.pass.on
	out := cfg.Output
	if c.capture {
		res, err := env.Capture(ctx, out, opts)
		if res != nil && !con.json {
			// The capture's table goes to stderr: stdout is the benchmark's.
			printSummary(&console{stdout: con.stderr, log: con.log}, res)
		}
		if err != nil {
			return usageIfSetup(err)
		}
	}
	if c.corpus.path != "" {
		return c.replay(ctx, con, env, out)
	}
	if c.soak != "" {
		return c.runSoak(ctx, con, env, out)
	}
	report, err := bench.Run(ctx, env, out, bench.Options{Only: c.only.ids(), Rounds: c.rounds, Variants: c.variants, Explain: c.explain, Concurrency: ks, Pool: c.pool, Revision: pipelineVersion()})
	if err != nil {
		return usageIfSetup(err)
	}
	if con.json {
		return writeJSON(con.stdout, report)
	}
	printBench(con.stdout, report)
	fmt.Fprintf(con.stdout, "\nwrote bench.json, bench.txt (for benchstat) and bench.svg into %s (%s)\n", report.Dir, filepath.Join(out, "bench", "latest"))
	return nil
}

func printBench(w io.Writer, r *bench.Report) {
	fmt.Fprintf(w, "%d rounds, interleaved, after %d warm-up round (discarded); %s UTC; %d CPUs (%s); runsc %s; restore flags %s; pipeline %s\n",
		r.Rounds, r.WarmupRounds, r.CreatedAt.UTC().Format("2006-01-02 15:04"), r.Machine.CPUs, r.Machine.CPUModel, r.Runsc.Version, strings.Join(r.RestoreFlags, " "), r.Revision)
	fmt.Fprintf(w, "load average: %s\n", r.Load.Describe())
	if r.Load.Warning != "" {
		fmt.Fprintf(w, "WARNING: %s\n", r.Load.Warning)
	}
	fmt.Fprintln(w)
	tw := tabwriter.NewWriter(w, 0, 0, 2, ' ', tabwriter.AlignRight)
	fmt.Fprintln(tw, "set\tseries\tmin ms\tp50 ms\tp90 ms\tp99 ms\tmax ms\tiqr ms\trestore CPU ms\t")
	for _, s := range r.Sets {
		for _, name := range r.Series {
			st, ok := s.Series[name]
			if !ok {
				continue
			}
			cpu := "-"
			if len(st.RestoreCPU) > 0 {
				cpu = fmt.Sprintf("%.0f", measure.Summarize(st.RestoreCPU).Median)
			}
			fmt.Fprintf(tw, "%s\t%s\t%.0f\t%.0f\t%.0f\t%.0f\t%.0f\t%.0f\t%s\t\n", s.ID, name, st.Min, st.P50, st.P90, st.P99, st.Max, st.IQR, cpu)
		}
	}
	tw.Flush()
	fmt.Fprintln(w)
	tw = tabwriter.NewWriter(w, 0, 0, 2, ' ', tabwriter.AlignRight)
	fmt.Fprintln(tw, "set\timage MiB\tcold/restore\trestore/floor\tprestarted/floor\tpooled/floor\t")
	for _, s := range r.Sets {
		fmt.Fprintf(tw, "%s\t%.1f\t%.2f\t%.2f\t%.2f\t%.2f\t\n", s.ID, float64(s.Bytes)/(1<<20),
			s.Ratios["cold/restore"], s.Ratios["restore/floor"], s.Ratios["prestarted/floor"], s.Ratios["pooled/floor"])
	}
	tw.Flush()
	printWarm(w, r)
	fmt.Fprintf(w, "\nrestore cost model (measure-mode medians): %s\n", r.Fit.Describe())
	if r.FastestVariant != nil {
		fmt.Fprintf(w, "fastest restore variant with a warm page cache (an image restored many times; sum of medians over the sets): %s\n", r.FastestVariant.Name)
	}
	if r.FastestColdVariant != nil {
		fmt.Fprintf(w, "fastest restore variant with a cold page cache (the first restore after a pull): %s\n", r.FastestColdVariant.Name)
	}
	if len(r.Concurrency) > 0 {
		fmt.Fprintf(w, "\nrestores at once of %s, from the release of one barrier to each answer (latency over all rounds; throughput: median of the rounds):\n", r.Concurrency[0].Set)
		tw := tabwriter.NewWriter(w, 0, 0, 2, ' ', tabwriter.AlignRight)
		fmt.Fprintln(tw, "series\tat once\tp50 ms\tp90 ms\tp99 ms\tmax ms\tiqr ms\trestores/s\tstart spread ms\t")
		for _, c := range r.Concurrency {
			fmt.Fprintf(tw, "%s\t%d\t%.0f\t%.0f\t%.0f\t%.0f\t%.0f\t%.2f\t%.1f\t\n", c.Series, c.Concurrency, c.Latency.P50, c.Latency.P90, c.Latency.P99, c.Latency.Max, c.Latency.IQR, c.Throughput, c.SpreadMS)
		}
		tw.Flush()
		fmt.Fprintln(w, r.Recommendation)
	}
	if len(r.Explain) > 0 {
		fmt.Fprintln(w, "\nwhere one restore's time goes (runsc --debug is on for these, which slows them):")
		bench.WriteBreakdowns(w, r.Explain)
	}
}

// printWarm prints the warm series beside the floor, with the memory a warm sandbox holds.
func printWarm(w io.Writer, r *bench.Report) {
	if !slices.Contains(r.Series, bench.Warm) {
		return
	}
	fmt.Fprintln(w, "\nwarm: a sandbox restored ahead, taken and called (its restore off the clock); resident: its memory, restored and idle (Pss), own: the part no other sandbox shares, what each warm sandbox pins")
	tw := tabwriter.NewWriter(w, 0, 0, 2, ' ', tabwriter.AlignRight)
	fmt.Fprintln(tw, "set\twarm median ms\twarm/floor\tresident MiB\town MiB\t")
	for _, s := range r.Sets {
		fmt.Fprintf(tw, "%s\t%.1f\t%.3f\t%.1f\t%.1f\t\n", s.ID, s.Series[bench.Warm].Median, s.Ratios["warm/floor"], float64(s.ResidentBytes[bench.Warm])/(1<<20), float64(s.OwnBytes[bench.Warm])/(1<<20))
	}
	tw.Flush()
}

// replay is bench --corpus: the corpus's requests started where the catalogue chooses, beside
// cold starts of the same call.
func (c *benchCmd) replay(ctx context.Context, con *console, env *run.Env, out string) error {
	report, err := bench.RunCorpus(ctx, env, out, bench.CorpusOptions{Corpus: c.corpusData, Path: c.corpus.path, Sample: c.sample, Part: c.part, Rounds: c.rounds, Pool: c.pool,
		Arrivals: bench.ArrivalsOptions{RatePerSec: c.arrivals, Duration: c.duration, MemoryBytes: c.memoryBytes, Seed: 36}, Revision: pipelineVersion()})
	if err != nil {
		return usageIfSetup(err)
	}
	if con.json {
		return writeJSON(con.stdout, report)
	}
	s := report.Summary
	fmt.Fprintf(con.stdout, "%d requests drawn from %d servable ones of the %s part (%d unservable), %d rounds interleaved after a warm-up; medians:\n\n",
		len(report.Requests), report.Eligible, report.Part, report.Unservable, report.Rounds)
	tw := newTable(con.stdout)
	fmt.Fprintln(tw, "line\tcold ms\tchosen ms\tpredicted ms\tpooled ms\tchoice\timports\t")
	for _, r := range report.Requests {
		pooled := "-"
		if r.Pooled != nil {
			pooled = fmt.Sprintf("%.0f", r.PooledMs)
		}
		predicted := "-"
		if report.Predicted() {
			predicted = fmt.Sprintf("%.0f", r.PredictedMs)
		}
		fmt.Fprintf(tw, "%d\t%.0f\t%.0f\t%s\t%s\t%s\t%s\t\n", r.Line, r.ColdMs, r.ChosenMs, predicted, pooled, r.Choice, orDash(strings.Join(r.Imports, ",")))
	}
	tw.Flush()
	fmt.Fprintf(con.stdout, "\nmean start to the first answer: cold %.0f ms, chosen %.0f ms (%.2fx cold, %.0f ms saved)", s.MeanColdMs, s.MeanChosenMs, s.ChosenOverCold, s.SavedMs)
	if report.Predicted() {
		fmt.Fprintf(con.stdout, "; predicted %.0f ms: measured %+.1f%% (per request, mean |error| %.1f%%)\n", s.MeanPredictedMs, s.ModelErrorPct, s.MeanAbsErrorPct)
	} else {
		fmt.Fprintf(con.stdout, "; not predicted: the catalogue has no measured prices, so Select chose by image size (%s)\n", catalogue.MeasureHint)
	}
	switch {
	case report.Pool > 0 && s.PredictedPooledMs > 0:
		fmt.Fprintf(con.stdout, "from a pool of %d: pooled %.0f ms (%.2fx cold; runsc create %.0f ms off the clock); predicted %.0f ms by the pooled line: measured %+.1f%%\n",
			report.Pool, s.MeanPooledMs, s.PooledOverCold, s.CreateMs, s.PredictedPooledMs, s.PooledModelErrorPct)
	case report.Pool > 0:
		why := "the catalogue has no pooled line"
		if !report.Predicted() {
			why = "no measured prices"
		}
		fmt.Fprintf(con.stdout, "from a pool of %d: pooled %.0f ms (%.2fx cold; runsc create %.0f ms off the clock); not predicted: %s\n",
			report.Pool, s.MeanPooledMs, s.PooledOverCold, s.CreateMs, why)
	}
	printArrivals(con.stdout, report.Arrivals, s.MeanColdMs)
	fmt.Fprintf(con.stdout, "wrote corpus.json, bench.txt (for benchstat) and corpus.svg into %s\n", report.Dir)
	return nil
}

// printArrivals prints the arrivals runs side by side, against the replay's mean cold start.
func printArrivals(w io.Writer, a *bench.Arrivals, meanColdMs float64) {
	if a == nil {
		return
	}
	fmt.Fprintf(w, "\narrivals: Poisson at %.2f a second for %.0f s (seed %d), at most %d starts at once; from arrival to answer:\n", a.RatePerSec, a.DurationS, a.Seed, a.Slots)
	tw := newTable(w)
	fmt.Fprintln(tw, "warm pools\trequests\tfailures\tqueued\tCPU busy\tp50 ms\tp90 ms\tp99 ms\tmean ms\tp50/cold\tp99/cold\tpaths\tmemory peak MiB\twarm pools' peak MiB\trefill ms\t")
	for _, run := range []struct {
		name string
		r    bench.ArrivalsRun
	}{{fmt.Sprintf("with (%.0f MiB budget)", float64(a.MemoryBytes)/(1<<20)), a.WithWarm}, {"without", a.WithoutWarm}} {
		r := run.r
		var paths []string
		for _, how := range launch.Paths() {
			if n := r.Paths[string(how)]; n > 0 {
				paths = append(paths, fmt.Sprintf("%s %d", how, n))
			}
		}
		ratio := func(ms float64) string {
			if meanColdMs <= 0 {
				return "-"
			}
			return fmt.Sprintf("%.2f", ms/meanColdMs)
		}
		fmt.Fprintf(tw, "%s\t%d\t%d\t%d\t%.0f%%\t%.0f\t%.0f\t%.0f\t%.0f\t%s\t%s\t%s\t%.0f\t%.0f\t%.0f\t\n", run.name, r.Requests, r.Failures, r.Queued, 100*r.CPUBusy, r.P50Ms, r.P90Ms, r.P99Ms, r.MeanMs,
			ratio(r.P50Ms), ratio(r.P99Ms), orDash(strings.Join(paths, ", ")), float64(r.MemoryPeakBytes)/(1<<20), float64(r.WarmMemoryPeakBytes)/(1<<20), r.RefillLagMs)
	}
	tw.Flush()
	fmt.Fprintf(w, "memory: the sandboxes' own (the files they map are shared page cache, aside); warm pools %v: predicted %.0f MiB\n", a.WithWarm.WarmSizes, float64(a.WithWarm.PredictedMemoryBytes)/(1<<20))
}

// runSoak is bench --soak: the summary line "N restores, F failures", the failures, the
// latency per minute and what was left, on stdout; soak.json in OUT/bench.
func (c *benchCmd) runSoak(ctx context.Context, con *console, env *run.Env, out string) error {
	report, err := bench.Soak(ctx, env, out, c.soakOpts)
	if report == nil {
		return usageIfSetup(err)
	}
	if con.json {
		if werr := writeJSON(con.stdout, report); werr != nil {
			return errors.Join(err, werr)
		}
		return err
	}
	printSoak(con.stdout, report)
	return err
}

func printSoak(w io.Writer, r *bench.SoakReport) {
	fmt.Fprintf(w, "soak of %s (%s), %d at once, %.0f s; %d CPUs (%s); runsc %s; restore flags %s\n\n", strings.Join(r.Checkpoints, ", "),
		r.Requested, r.Concurrency, r.Seconds, r.Machine.CPUs, r.Machine.CPUModel, r.Runsc.Version, strings.Join(r.RestoreFlags, " "))
	tw := newTable(w)
	fmt.Fprintln(tw, "minute\trestores\tfailures\tp50 ms\tp99 ms\t")
	for _, m := range r.Minutes {
		fmt.Fprintf(tw, "%d\t%d\t%d\t%.0f\t%.0f\t\n", m.Minute, m.Restores, m.Failures, m.P50, m.P99)
	}
	tw.Flush()
	fmt.Fprintln(w)
	tw = newTable(w)
	fmt.Fprintln(tw, "after restores\tsandboxes\trunsc processes\tfds\tmounts (own/all)\trunsc root (own/all)\tTMPDIR (own/all)\tMemAvailable MiB\t")
	for _, s := range r.Samples {
		fmt.Fprintf(tw, "%d\t%d\t%d\t%d\t%d/%d\t%d/%d\t%d/%d\t%d\t\n", s.Restores, s.Sandboxes, s.RunscProcesses, s.FDs, s.Mounts, s.AllMounts,
			s.OwnRootEntries, s.RootEntries, s.OwnTmpEntries, s.TmpEntries, s.MemAvailableKiB>>10)
	}
	tw.Flush()
	for i, f := range r.Errors {
		if i == 20 {
			fmt.Fprintf(w, "... and %d more failures in soak.json\n", len(r.Errors)-i)
			break
		}
		what := "failed"
		if f.Killed {
			what = "failed (its sandbox killed on purpose)"
		}
		fmt.Fprintf(w, "restore %d of %s %s: %s\n", f.N, f.Checkpoint, what, f.Error)
	}
	left := "nothing"
	if len(r.Left) > 0 {
		left = strings.Join(r.Left, "; ")
	}
	fmt.Fprintf(w, "\nleft at the end: %s\nrestore to checked answer: median %.0f ms, p90 %.0f ms, max %.0f ms\n", left, r.Latency.Median, r.Latency.P90, r.Latency.Max)
	fmt.Fprintf(w, "%d restores, %d failures", r.Restores, r.Failures)
	if r.Killed > 0 {
		fmt.Fprintf(w, " (%d sandboxes killed with SIGKILL on purpose, %d failures not induced)", r.Killed, r.Unexpected())
	}
	fmt.Fprintf(w, "\nwrote soak.json into %s\n", r.Dir)
}
