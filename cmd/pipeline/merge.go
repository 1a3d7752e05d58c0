package main

import (
	"context"
	"flag"
	"fmt"

	"readie.dev/pipeline/internal/run"
)

type mergeCmd struct{}

func (*mergeCmd) Name() string { return "merge" }
func (*mergeCmd) Synopsis() string {
	return "merge outputs (shards) into --out: every source verifies and agrees; a set is kept once"
}
func (*mergeCmd) SetFlags(*flag.FlagSet) {}

func (*mergeCmd) CheckArgs(g *globals, args []string) error {
	if g.out == "" {
		return usagef("merge: name the output with --out")
	}
	if len(args) == 0 {
		return usagef("merge: name at least one source output")
	}
	return nil
}

func (*mergeCmd) Execute(_ context.Context, g *globals, args []string) error {
	cfg, err := g.loadConfig()
	if err != nil {
		return err
	}
	m, err := run.Merge(cfg.Output, args)
	if err != nil {
		return usageIfSetup(err)
	}
	fmt.Fprintf(g.stdout, "%s: %d checkpoints from %d sources\n", cfg.Output, len(m.Checkpoints), len(args))
	printCheckpoints(g.stdout, m)
	return nil
}
