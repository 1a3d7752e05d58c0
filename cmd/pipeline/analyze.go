package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"maps"
	"path/filepath"
	"slices"
	"strings"

	"readie.dev/pipeline/internal/analysis"
	"readie.dev/pipeline/internal/config"
	"readie.dev/pipeline/internal/corpus"
	"readie.dev/pipeline/internal/importcost"
	"readie.dev/pipeline/internal/outdir"
)

// corpusFlag is --corpus: a corpus of requests (JSON Lines or a JSON array).
type corpusFlag struct{ path string }

func (c *corpusFlag) register(fs *flag.FlagSet, usage string) {
	fs.StringVar(&c.path, "corpus", "", usage)
}

// load reads the corpus; a bad one is bad input (exit 2), named by its line.
func (c *corpusFlag) load() (*corpus.Corpus, error) {
	if c.path == "" {
		return nil, usagef("--corpus FILE is required")
	}
	cp, err := corpus.Load(c.path)
	if err != nil {
		return nil, usageError{err}
	}
	return cp, nil
}

// corpusFlags are the flags of a command that reads a corpus into an output (analyze,
// plan-sets): --config, --out and --corpus.
type corpusFlags struct {
	config configFlag
	out    outFlag
	corpus corpusFlag
}

func (c *corpusFlags) register(fs *flag.FlagSet, corpusUsage string) {
	c.config.register(fs)
	c.out.register(fs)
	c.corpus.register(fs, corpusUsage)
}

// load reads the config, with --out applied, and the corpus. An output that is not the
// pipeline's is refused here, before the long work that writes into it.
func (c *corpusFlags) load() (*config.Config, *corpus.Corpus, error) {
	cfg, err := c.config.load()
	if err != nil {
		return nil, nil, err
	}
	if err := c.out.apply(cfg, nil); err != nil {
		return nil, nil, err
	}
	if err := outdir.Check(cfg.Output); err != nil {
		return nil, nil, usageIfSetup(err)
	}
	cp, err := c.corpus.load()
	if err != nil {
		return nil, nil, err
	}
	return cfg, cp, nil
}

type analyzeCmd struct {
	corpusFlags
	jobs int
}

func (*analyzeCmd) Name() string  { return "analyze" }
func (*analyzeCmd) Usage() string { return "analyze --corpus FILE [flags]" }
func (*analyzeCmd) Synopsis() string {
	return "measure each module a corpus imports in sandboxes of the image; write OUT/analysis.json"
}
func (c *analyzeCmd) SetFlags(fs *flag.FlagSet) {
	c.corpusFlags.register(fs, "the corpus of requests: JSON Lines or a JSON array of {\"imports\": [...], \"weight\": N} (required)")
	fs.IntVar(&c.jobs, "jobs", 0, "probes (availability, closure) at a time; timed imports always run alone (default: the config's jobs)")
}

func (c *analyzeCmd) CheckArgs(args []string) error {
	if c.corpus.path == "" {
		return errors.New("--corpus FILE is required")
	}
	if c.jobs < 0 {
		return fmt.Errorf("--jobs %d: want a positive number", c.jobs)
	}
	return noArgs(args)
}

func (c *analyzeCmd) Execute(ctx context.Context, con *console, args []string) error {
	cfg, cp, err := c.corpusFlags.load()
	if err != nil {
		return err
	}
	jobs := cfg.Jobs
	if c.jobs > 0 {
		jobs = c.jobs
	}
	env, err := newEnv(ctx, cfg, con)
	if err != nil {
		return err
	}
	defer env.Close()
	names := cp.Names()
	con.log.WithField("requests", len(cp.Requests)).WithField("names", len(names)).Infof("analyze: %s", c.corpus.path)
	f, rep, err := importcost.Run(ctx, env, names, importcost.Options{
		Runs: cfg.Analysis.Runs, Jobs: jobs, Timeout: cfg.Analysis.Timeout, CacheDir: cfg.Analysis.Cache,
		RestoreRuns: cfg.RestoreRuns, Log: con.log,
	})
	if err != nil {
		return usageIfSetup(err)
	}
	path := filepath.Join(cfg.Output, analysis.FileName)
	if err := outdir.WriteFile(cfg.Output, analysis.FileName, f.Save); err != nil {
		return usageIfSetup(err)
	}
	if con.json {
		return writeJSON(con.stdout, map[string]any{
			"analysis": path, "modules": rep.Modules, "measured": rep.Measured, "cached": rep.Cached, "sandboxes": rep.Sandboxes,
			"unavailable": rep.Unavailable, "took_s": rep.Took.Seconds(), "host": f.Host,
		})
	}
	printAnalysis(con, f)
	fmt.Fprintf(con.stdout, "\n%d modules analysed: %d measured now, %d from the cache, %d loaded by the executor already or unavailable; %d sandboxes, %s; wrote %s\n",
		rep.Modules, rep.Measured, rep.Cached, rep.Modules-rep.Measured-rep.Cached, rep.Sandboxes, rep.Took.Round(1e8), path)
	return nil
}

// printAnalysis prints one row per module: its figures and closure; unavailable ones last.
func printAnalysis(con *console, f *analysis.File) {
	modules := f.Modules()
	names := slices.Sorted(maps.Keys(modules))
	slices.SortStableFunc(names, func(a, b string) int {
		switch {
		case modules[a].Available == modules[b].Available:
			return 0
		case modules[a].Available:
			return -1
		}
		return 1
	})
	why := map[string]string{}
	for _, e := range f.Names {
		if !e.Available {
			why[e.Module] = e.Error
		}
	}
	tw := newTable(con.stdout)
	fmt.Fprintln(tw, "module\tavailable\timport ms\tMiB\town ms\town MiB\tclosure\t")
	for _, m := range names {
		x := modules[m]
		if !x.Available {
			fmt.Fprintf(tw, "%s\tno\t-\t-\t-\t-\t%s\t\n", m, why[m])
			continue
		}
		fmt.Fprintf(tw, "%s\tyes\t%.1f\t%.2f\t%.1f\t%.2f\t%s\t\n", m, x.ImportMs, x.MiB, x.OwnMs, x.OwnMiB, strings.Join(x.Closure, ","))
	}
	tw.Flush()
	if h := f.Host; h != nil {
		fmt.Fprintf(con.stdout, "\nhost: cold start of the bare executor %.0f ms; empty image %.1f MiB; restore %.2f ms/MiB + %.0f ms (R² %.2f over %s)\n",
			h.ColdStartMs, h.EmptyMiB, h.AlphaMsPerMiB, h.InterceptMs, h.RSquared, strings.Join(h.RestoreSets, ", "))
		if p := h.Pooled; p.Measured() {
			fmt.Fprintf(con.stdout, "from a pool (runsc create off the clock): cold start %.0f ms; restore %.2f ms/MiB + %.0f ms (R² %.2f)\n",
				p.ColdStartMs, p.AlphaMsPerMiB, p.InterceptMs, h.PooledRSquared)
		}
		if m := h.Memory; m.Measured() {
			fmt.Fprintf(con.stdout, "own memory restored and idle: %.2f MiB per MiB of image + %.1f MiB (R² %.2f)\n",
				m.BytesPerMiB/(1<<20), float64(m.InterceptBytes)/(1<<20), h.MemoryRSquared)
		}
	}
}
