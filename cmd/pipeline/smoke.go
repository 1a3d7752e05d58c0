package main

import (
	"context"
	"flag"
)

type smokeCmd struct {
	config configFlag
	out    outFlag
	only   onlyFlag
	pass   passEnvFlag
}

func (*smokeCmd) Name() string  { return "smoke" }
func (*smokeCmd) Usage() string { return "smoke [flags] [OUT]" }
func (*smokeCmd) Synopsis() string {
	return "smoke-test the checkpoints of an existing output directory again"
}
func (c *smokeCmd) SetFlags(fs *flag.FlagSet) {
	c.config.register(fs)
	c.out.register(fs)
	c.only.register(fs)
	c.pass.register(fs)
}
func (*smokeCmd) CheckArgs(args []string) error { return readsOutput(args) }

func (c *smokeCmd) Execute(ctx context.Context, con *console, args []string) error {
	cfg, err := c.config.load()
	if err != nil {
		return err
	}
	if err := c.out.apply(cfg, args); err != nil {
		return err
	}
	env, err := newEnv(ctx, cfg, con)
	if err != nil {
		return err
	}
	defer env.Close()
	env.PassEnvToOutputs = c.pass.on
	m, err := env.Smoke(ctx, cfg.Output, c.only.ids())
	if err != nil {
		return usageIfSetup(err)
	}
	return printCheckpoints(con, m, "tested")
}
