package main

import (
	"context"
	"flag"
	"fmt"
	"time"

	"readie.dev/pipeline/internal/config"
	"readie.dev/pipeline/internal/run"
)

// setFlags are the flags that choose what a capture works on: `capture` and `plan` share them.
type setFlags struct {
	image     string
	sets      []config.Set
	shard     string
	jobs      int
	recapture bool
	remeasure bool
}

func (f *setFlags) register(fs *flag.FlagSet) {
	fs.Func("set", "a package set ID=MODULE,MODULE (repeatable): added to the config's (replacing one with the same id) and selected as --only would", func(arg string) error {
		s, err := config.ParseSet(arg)
		if err != nil {
			return err
		}
		f.sets = append(f.sets, s)
		return nil
	})
	fs.StringVar(&f.image, "image", "", "the sandbox root: an OCI image (oci-layout:DIR[:TAG|@DIGEST], docker-archive:FILE, HOST/REPO[:TAG|@DIGEST]) with the executor layered on top (default: the config's image, else its rootfs)")
	fs.StringVar(&f.shard, "shard", "", "I/N: work on shard I (from 0, like JOB_COMPLETION_INDEX) of N; the output holds that shard's sets and empty")
	fs.IntVar(&f.jobs, "jobs", 0, "sets captured and smoke-tested at a time (default: the config's jobs)")
	fs.BoolVar(&f.recapture, "recapture", false, "capture every selected set again, ignoring the output's and the store's checkpoints")
	fs.BoolVar(&f.remeasure, "remeasure", false, "time the restores of reused checkpoints again instead of keeping their timings")
}

// setup loads the config, applies the flags and checks runsc: what capture and plan share.
func (f *setFlags) setup(ctx context.Context, g *globals) (*config.Config, run.CaptureOptions, *run.Env, error) {
	cfg, err := g.loadConfig()
	if err != nil {
		return nil, run.CaptureOptions{}, nil, err
	}
	opts, err := f.options(g, cfg)
	if err != nil {
		return nil, run.CaptureOptions{}, nil, err
	}
	env, err := g.env(ctx, cfg)
	return cfg, opts, env, err
}

// options turns the flags and the config into the capture's options (exit 2 on a bad --only).
func (f *setFlags) options(g *globals, cfg *config.Config) (run.CaptureOptions, error) {
	sel, err := cfg.Select(g.onlyIDs(), f.sets)
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
	switch {
	case f.jobs < 0:
		return run.CaptureOptions{}, usagef("--jobs %d: want a positive number", f.jobs)
	case f.jobs > 0:
		cfg.Jobs = f.jobs
	}
	return run.CaptureOptions{Selection: sel, Recapture: f.recapture, Remeasure: f.remeasure}, nil
}

type captureCmd struct {
	setFlags
	cleanFailed bool
}

func (*captureCmd) Name() string { return "capture" }
func (*captureCmd) Synopsis() string {
	return "capture (or reuse), measure and smoke-test the package sets; write manifest.json"
}
func (c *captureCmd) SetFlags(fs *flag.FlagSet) {
	c.setFlags.register(fs)
	fs.BoolVar(&c.cleanFailed, "clean-failed", false, "remove the staging directory of a failed run instead of leaving it for inspection")
}

func (f *setFlags) CheckArgs(_ *globals, args []string) error {
	if f.shard != "" {
		if _, _, err := config.ParseShard(f.shard); err != nil {
			return usageError{err}
		}
	}
	return noArgs(args)
}

func (c *captureCmd) Execute(ctx context.Context, g *globals, args []string) error {
	cfg, opts, env, err := c.setup(ctx, g)
	if err != nil {
		return err
	}
	env.CleanFailed = c.cleanFailed
	start := time.Now()
	res, err := env.Capture(ctx, cfg.Output, opts)
	if res != nil {
		printSummary(g.stdout, res)
	}
	if err != nil {
		return usageIfSetup(err)
	}
	g.log.WithField("took", time.Since(start).Round(time.Millisecond)).Infof("wrote %s", cfg.Output)
	return nil
}

type planCmd struct{ setFlags }

func (*planCmd) Name() string { return "plan" }
func (*planCmd) Synopsis() string {
	return "print what capture would do with each set (reuse, capture, keep, drop) and why; change nothing"
}
func (c *planCmd) SetFlags(fs *flag.FlagSet) { c.setFlags.register(fs) }

func (c *planCmd) Execute(ctx context.Context, g *globals, args []string) error {
	cfg, opts, env, err := c.setup(ctx, g)
	if err != nil {
		return err
	}
	if err := env.PrepareRootfs(ctx); err != nil {
		return usageIfSetup(err)
	}
	plan, err := env.Plan(ctx, cfg.Output, opts)
	if err != nil {
		return usageIfSetup(err)
	}
	if g.logFormat == "json" {
		return writeJSON(g.stdout, plan)
	}
	tw := newTable(g.stdout)
	fmt.Fprintln(tw, "set\taction\tfrom\treason\t")
	for _, s := range plan.Sets {
		from := s.From
		if from == "" {
			from = "-"
		}
		fmt.Fprintf(tw, "%s\t%s\t%s\t%s\t\n", s.ID, s.Action, from, s.Reason)
	}
	for _, d := range plan.Dropped {
		fmt.Fprintf(tw, "%s\tdrop\t-\t%s\t\n", d.ID, d.Reason)
	}
	tw.Flush()
	return nil
}
