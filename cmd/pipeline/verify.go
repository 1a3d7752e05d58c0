package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"os"

	"readie.dev/pipeline/pkg/executorproto"
	"readie.dev/pipeline/pkg/manifest"
)

type verifyCmd struct{}

func (*verifyCmd) Name() string { return "verify" }
func (*verifyCmd) Synopsis() string {
	return "check manifest.json, every meta.json and every image file's hash"
}
func (*verifyCmd) SetFlags(*flag.FlagSet) {}

func (*verifyCmd) Execute(ctx context.Context, g *globals, args []string) error {
	if err := noArgs(args); err != nil {
		return err
	}
	cfg, err := g.loadConfig()
	if err != nil {
		return err
	}
	if _, err := os.Stat(cfg.Output); errors.Is(err, os.ErrNotExist) {
		return usagef("output %s does not exist", cfg.Output)
	}
	m, err := manifest.Verify(cfg.Output, executorproto.Version)
	if err != nil {
		return err
	}
	fmt.Fprintf(g.stdout, "%s: %d checkpoints verified (executor protocol %d, runsc %s)\n",
		cfg.Output, len(m.Checkpoints), m.ExecutorProtocol, m.Runsc.Version)
	return nil
}
