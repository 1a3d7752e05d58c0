package main

import (
	"context"
	"flag"
)

type measureCmd struct{}

func (*measureCmd) Name() string           { return "measure" }
func (*measureCmd) Synopsis() string       { return "re-time the restores of an existing output directory" }
func (*measureCmd) SetFlags(*flag.FlagSet) {}

func (*measureCmd) Execute(ctx context.Context, g *globals, args []string) error {
	if err := noArgs(args); err != nil {
		return err
	}
	cfg, err := g.loadConfig()
	if err != nil {
		return err
	}
	env, err := g.env(ctx, cfg)
	if err != nil {
		return err
	}
	m, err := env.Measure(ctx, env.Config.Output, g.onlyIDs())
	if err != nil {
		return usageIfSetup(err)
	}
	printCheckpoints(g.stdout, m)
	return nil
}
