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

// versions is what `pipeline version` reports.
type versions struct {
	// Pipeline is the module's version and, when the build recorded it, the VCS revision.
	Pipeline         string        `json:"pipeline"`
	ExecutorProtocol int           `json:"executor_protocol"`
	Runsc            runscVersions `json:"runsc"`
}

// runscVersions is the config's runsc; Version is empty when it is not installed there.
type runscVersions struct {
	Path          string `json:"path"`
	Version       string `json:"version,omitempty"`
	Module        string `json:"module,omitempty"`
	ModuleVersion string `json:"module_version,omitempty"`
}

func (c *versionCmd) Execute(ctx context.Context, con *console, args []string) error {
	if err := noArgs(args); err != nil {
		return err
	}
	cfg, err := c.config.load()
	if err != nil {
		return err
	}
	v := versions{Pipeline: pipelineVersion(), ExecutorProtocol: executorproto.Version, Runsc: runscVersions{Path: cfg.Runsc.Path}}
	rt := &runsc.Runsc{Path: cfg.Runsc.Path, CommandTimeout: cfg.Timeouts.RunscCommand}
	if v.Runsc.Version, err = rt.Version(ctx); err == nil {
		v.Runsc.Module, v.Runsc.ModuleVersion, _ = rt.Module()
	}
	if con.json {
		return writeJSON(con.stdout, v)
	}
	fmt.Fprintf(con.stdout, "pipeline %s\nexecutor protocol %d\n", v.Pipeline, v.ExecutorProtocol)
	if v.Runsc.Version == "" {
		fmt.Fprintf(con.stdout, "runsc: not installed at %s (run `make runsc`)\n", v.Runsc.Path)
		return nil
	}
	fmt.Fprintf(con.stdout, "runsc %s (%s@%s) at %s\n", v.Runsc.Version, v.Runsc.Module, v.Runsc.ModuleVersion, v.Runsc.Path)
	return nil
}

// pipelineVersion is the module's version and, when the build recorded it, the VCS revision.
func pipelineVersion() string {
	info, ok := debug.ReadBuildInfo()
	if !ok {
		return "(unknown)"
	}
	v := info.Main.Version
	for _, s := range info.Settings {
		if s.Key == "vcs.revision" {
			v += " " + s.Value
		}
	}
	return v
}
