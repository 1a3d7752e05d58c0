package main

import (
	"context"
	"flag"
	"time"
)

type captureCmd struct {
	cleanFailed bool
}

func (*captureCmd) Name() string { return "capture" }
func (*captureCmd) Synopsis() string {
	return "capture, measure and smoke-test every package set; write manifest.json"
}
func (c *captureCmd) SetFlags(fs *flag.FlagSet) {
	fs.BoolVar(&c.cleanFailed, "clean-failed", false, "remove the staging directory of a failed run instead of leaving it for inspection")
}

func (c *captureCmd) Execute(ctx context.Context, g *globals, args []string) error {
	if err := noArgs(args); err != nil {
		return err
	}
	cfg, err := g.loadConfig()
	if err != nil {
		return err
	}
	sets, err := cfg.Sets(g.onlyIDs())
	if err != nil {
		return usageError{err}
	}
	env, err := g.env(ctx, cfg)
	if err != nil {
		return err
	}
	env.CleanFailed = c.cleanFailed
	start := time.Now()
	m, err := env.Capture(ctx, env.Config.Output, sets)
	if err != nil {
		return usageIfSetup(err)
	}
	g.log.WithField("took", time.Since(start).Round(time.Second)).Infof("wrote %s", env.Config.Output)
	printSummary(g.stdout, m)
	return nil
}
