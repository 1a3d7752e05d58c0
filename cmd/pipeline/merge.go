package main

import (
	"context"
	"flag"
	"fmt"

	"readie.dev/pipeline/internal/exchange"
)

type mergeCmd struct {
	config configFlag
	out    outFlag
}

func (*mergeCmd) Name() string  { return "merge" }
func (*mergeCmd) Usage() string { return "merge --out OUT SOURCE..." }
func (*mergeCmd) Synopsis() string {
	return "merge outputs (shards: directories or images of push) into --out: every source verifies and agrees; a set is kept once"
}
func (c *mergeCmd) SetFlags(fs *flag.FlagSet) {
	c.config.register(fs)
	c.out.register(fs)
}

func (c *mergeCmd) CheckArgs(args []string) error {
	if c.out.dir == "" {
		return fmt.Errorf("name the output with --out")
	}
	if len(args) == 0 {
		return fmt.Errorf("name at least one source output")
	}
	return nil
}

func (c *mergeCmd) Execute(ctx context.Context, con *console, args []string) error {
	cfg, err := c.config.load()
	if err != nil {
		return err
	}
	if err := c.out.apply(cfg, nil); err != nil {
		return err
	}
	m, err := exchange.MergeSources(ctx, cfg, cfg.Output, args, con.log)
	if err != nil {
		return usageIfSetup(err)
	}
	con.log.Infof("%s: %d checkpoints from %d %s", cfg.Output, len(m.Checkpoints), len(args), plural(len(args), "source", "sources"))
	return printCheckpoints(con, m, "merged")
}

func plural(n int, one, many string) string {
	if n == 1 {
		return one
	}
	return many
}
