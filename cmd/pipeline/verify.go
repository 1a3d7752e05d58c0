package main

import (
	"context"
	"errors"
	"flag"
	"os"

	"readie.dev/pipeline/internal/outdir"
	"readie.dev/pipeline/internal/store"
)

type verifyCmd struct {
	config configFlag
	out    outFlag
}

func (*verifyCmd) Name() string  { return "verify" }
func (*verifyCmd) Usage() string { return "verify [flags] [OUT]" }
func (*verifyCmd) Synopsis() string {
	return "check manifest.json, every meta.json and every image file's hash"
}
func (c *verifyCmd) SetFlags(fs *flag.FlagSet) {
	c.config.register(fs)
	c.out.register(fs)
}
func (*verifyCmd) CheckArgs(args []string) error { return readsOutput(args) }

func (c *verifyCmd) Execute(ctx context.Context, con *console, args []string) error {
	cfg, err := c.config.load()
	if err != nil {
		return err
	}
	if err := c.out.apply(cfg, args); err != nil {
		return err
	}
	if _, err := os.Stat(cfg.Output); errors.Is(err, os.ErrNotExist) {
		return usagef("output %s does not exist", cfg.Output)
	}
	m, err := outdir.Verify(cfg.Output, &store.Store{Dir: cfg.CheckpointCache})
	if err != nil {
		return err
	}
	return printVerified(con, cfg.Output, m)
}
