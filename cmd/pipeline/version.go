package main

import (
	"context"
	"flag"
	"fmt"
	"runtime/debug"

	"readie.dev/pipeline/pkg/executorproto"
	"readie.dev/pipeline/pkg/runsc"
)

type versionCmd struct{ config configFlag }

func (*versionCmd) Name() string  { return "version" }
func (*versionCmd) Usage() string { return "version [--config FILE]" }
func (*versionCmd) Synopsis() string {
	return "print the pipeline's, runsc's and the executor protocol's versions"
}
func (c *versionCmd) SetFlags(fs *flag.FlagSet) { c.config.register(fs) }

func (c *versionCmd) Execute(ctx context.Context, con *console, args []string) error {
	if err := noArgs(args); err != nil {
		return err
	}
	version := "(unknown)"
	if info, ok := debug.ReadBuildInfo(); ok {
		version = info.Main.Version
		for _, s := range info.Settings {
			if s.Key == "vcs.revision" {
				version += " " + s.Value
			}
		}
	}
	fmt.Fprintf(con.stdout, "pipeline %s\nexecutor protocol %d\n", version, executorproto.Version)
	cfg, err := c.config.load()
	if err != nil {
		return err
	}
	rt := &runsc.Runsc{Path: cfg.Runsc.Path, CommandTimeout: cfg.Timeouts.RunscCommand}
	runscVersion, err := rt.Version(ctx)
	if err != nil {
		fmt.Fprintf(con.stdout, "runsc: not installed at %s (run `make runsc`)\n", cfg.Runsc.Path)
		return nil
	}
	module, moduleVersion, _ := rt.Module()
	fmt.Fprintf(con.stdout, "runsc %s (%s@%s) at %s\n", runscVersion, module, moduleVersion, cfg.Runsc.Path)
	return nil
}
