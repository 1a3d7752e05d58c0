package main

import (
	"context"
	"flag"
)

type smokeCmd struct{}

func (*smokeCmd) Name() string { return "smoke" }
func (*smokeCmd) Synopsis() string {
	return "smoke-test the checkpoints of an existing output directory"
}
func (*smokeCmd) SetFlags(*flag.FlagSet) {}

func (*smokeCmd) Execute(ctx context.Context, g *globals, args []string) error {
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
	m, err := env.Smoke(ctx, env.Config.Output, g.onlyIDs())
	if err != nil {
		return usageIfSetup(err)
	}
	printCheckpoints(g.stdout, m)
	return nil
}
