package main

import (
	"context"
	"flag"
)

type measureCmd struct {
	config configFlag
	out    outFlag
	only   onlyFlag
	runs   runsFlag
	pass   passEnvFlag
}

func (*measureCmd) Name() string     { return "measure" }
func (*measureCmd) Usage() string    { return "measure [flags] [OUT]" }
func (*measureCmd) Synopsis() string { return "re-time the restores of an existing output directory" }
func (c *measureCmd) SetFlags(fs *flag.FlagSet) {
	c.config.register(fs)
	c.out.register(fs)
	c.only.register(fs)
	c.runs.register(fs)
	c.pass.register(fs)
}
func (*measureCmd) CheckArgs(args []string) error { return readsOutput(args) }

func (c *measureCmd) Execute(ctx context.Context, con *console, args []string) error {
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
	env, err := newEnv(ctx, cfg, con)
	if err != nil {
		return err
	}
	defer env.Close()
	env.PassEnvToOutputs = c.pass.on
	m, err := env.Measure(ctx, cfg.Output, c.only.ids())
	if err != nil {
		return usageIfSetup(err)
	}
	return printCheckpoints(con, m, "measured")
}
