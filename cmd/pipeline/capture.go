package main

import (
	"context"
	"flag"
	"fmt"
	"time"

	"readie.dev/pipeline/internal/config"
	"readie.dev/pipeline/internal/run"
	"readie.dev/pipeline/internal/setplan"
	"readie.dev/pipeline/pkg/catalogue"
	"readie.dev/pipeline/pkg/catalogue/plan"
)

// selectionFlags choose what a capture works on and how: `capture` and `plan` share them, so
// a plan is always the plan the same capture carries out.
type selectionFlags struct {
	config    configFlag
	out       outFlag
	only      onlyFlag
	runs      runsFlag
	image     string
	platform  string
	sets      []config.PackageSet
	shard     string
	jobs      int
	recapture bool
	remeasure bool
	// plan is --plan: a plan.json whose sets replace the config's.
	plan string
}

func (f *selectionFlags) register(fs *flag.FlagSet) {
	f.config.register(fs)
	f.out.register(fs)
	f.only.register(fs)
	f.runs.register(fs)
	fs.Func("set", "a package set ID=MODULE,MODULE (repeatable): added to the config's (replacing one with the same id) and selected as --only would", func(arg string) error {
		s, err := config.ParseSet(arg)
		if err != nil {
			return err
		}
		f.sets = append(f.sets, s)
		return nil
	})
	fs.StringVar(&f.image, "image", "", "the sandbox root: an OCI image (oci-layout:DIR[:TAG|@DIGEST], docker-archive:FILE, HOST/REPO[:TAG|@DIGEST]) with the executor layered on top (default: the config's image, else its rootfs)")
	fs.StringVar(&f.platform, "platform", "", "the platform `OS/ARCH[/VARIANT]` to choose when the image is an index (default: the config's platform, else this host's)")
	fs.StringVar(&f.shard, "shard", "", "I/N: work on shard I (from 0, like JOB_COMPLETION_INDEX) of N; the output holds that shard's sets and empty")
	fs.IntVar(&f.jobs, "jobs", 0, "sets captured and smoke-tested at a time (default: the config's jobs)")
	fs.BoolVar(&f.recapture, "recapture", false, "capture every selected set again, ignoring the output's and the store's checkpoints")
	fs.BoolVar(&f.remeasure, "remeasure", false, "time the restores of reused checkpoints again instead of keeping their timings")
	fs.StringVar(&f.plan, "plan", "", "a plan.json of plan-sets: its sets replace the config's checkpoints, and catalogue.json compares their predicted image sizes with the real ones")
}

func (f *selectionFlags) CheckArgs(args []string) error {
	if f.shard != "" {
		if _, _, err := config.ParseShard(f.shard); err != nil {
			return err
		}
	}
	if f.jobs < 0 {
		return fmt.Errorf("--jobs %d: want a positive number", f.jobs)
	}
	return noArgs(args)
}

// setup loads the config, applies the flags and checks runsc: what capture and plan share.
func (f *selectionFlags) setup(ctx context.Context, c *console) (*config.Config, run.CaptureOptions, *run.Env, error) {
	cfg, err := f.config.load()
	if err != nil {
		return nil, run.CaptureOptions{}, nil, err
	}
	opts, err := f.options(cfg)
	if err != nil {
		return nil, run.CaptureOptions{}, nil, err
	}
	env, err := newEnv(ctx, cfg, c)
	return cfg, opts, env, err
}

// options applies the flags to cfg and turns them into the capture's options; it checks
// everything it can before anything outside the config is looked at.
func (f *selectionFlags) options(cfg *config.Config) (run.CaptureOptions, error) {
	if err := f.out.apply(cfg, nil); err != nil {
		return run.CaptureOptions{}, err
	}
	if err := f.runs.apply(cfg); err != nil {
		return run.CaptureOptions{}, err
	}
	var predicted map[string]float64
	if f.plan != "" {
		p, err := plan.Load(f.plan)
		if err != nil {
			return run.CaptureOptions{}, usageError{fmt.Errorf("--plan: %w", err)}
		}
		cfg.Checkpoints = setplan.ConfigSets(p)
		predicted = map[string]float64{}
		for _, s := range p.Sets {
			predicted[s.ID] = s.PredictedMiB
		}
	}
	sel, err := cfg.Select(f.only.ids(), f.sets)
	if err != nil {
		return run.CaptureOptions{}, usageError{err}
	}
	if f.shard != "" {
		index, count, err := config.ParseShard(f.shard)
		if err != nil {
			return run.CaptureOptions{}, usageError{err}
		}
		sel.Shard(index, count)
	}
	if f.image != "" {
		cfg.Image = f.image
	}
	if f.platform != "" {
		cfg.Platform = f.platform
	}
	if f.jobs > 0 {
		cfg.Jobs = f.jobs
	}
	return run.CaptureOptions{Selection: sel, Recapture: f.recapture, Remeasure: f.remeasure, Predicted: predicted}, nil
}

type captureCmd struct {
	selectionFlags
	cleanFailed bool
}

func (*captureCmd) Name() string  { return "capture" }
func (*captureCmd) Usage() string { return "capture [flags]" }
func (*captureCmd) Synopsis() string {
	return "capture (or reuse), measure and smoke-test the package sets; write manifest.json"
}
func (c *captureCmd) SetFlags(fs *flag.FlagSet) {
	c.selectionFlags.register(fs)
	fs.BoolVar(&c.cleanFailed, "clean-failed", false, "remove the staging directory of a failed run instead of leaving it for inspection")
}

func (c *captureCmd) Execute(ctx context.Context, con *console, args []string) error {
	cfg, opts, env, err := c.setup(ctx, con)
	if err != nil {
		return err
	}
	defer env.Close()
	env.CleanFailed = c.cleanFailed
	start := time.Now()
	res, err := env.Capture(ctx, cfg.Output, opts)
	if res != nil {
		if werr := printSummary(con, res); werr != nil && err == nil {
			err = werr
		}
		if res.Catalogue != nil && !con.json {
			printPrediction(con, res.Catalogue)
		}
	}
	if err != nil {
		return usageIfSetup(err)
	}
	con.log.WithField("took", time.Since(start).Round(time.Millisecond)).Infof("wrote %s", cfg.Output)
	return nil
}

// printPrediction compares the planned sets' predicted image sizes with the real ones.
func printPrediction(con *console, c *catalogue.Catalogue) {
	if c.Prediction == nil {
		return
	}
	fmt.Fprintln(con.stdout, "\npredicted against real image sizes (capture --plan):")
	tw := newTable(con.stdout)
	fmt.Fprintln(tw, "set\tpredicted MiB\treal MiB\terror\t")
	for _, cp := range c.Checkpoints {
		if cp.PredictedMiB > 0 {
			fmt.Fprintf(tw, "%s\t%.1f\t%.1f\t%+.1f%%\t\n", cp.ID, cp.PredictedMiB, cp.ImageMiB, 100*(cp.PredictedMiB/cp.ImageMiB-1))
		}
	}
	tw.Flush()
	fmt.Fprintf(con.stdout, "mean absolute error %.2f MiB (%.1f%%) over %d sets\n", c.Prediction.MeanAbsErrorMiB, c.Prediction.MeanAbsErrorPct, c.Prediction.Sets)
}
