package main

import (
	"context"
	"encoding/json"
	"flag"
	"fmt"

	"readie.dev/pipeline/internal/run"
	"readie.dev/pipeline/pkg/sandbox"
)

type specCmd struct {
	config configFlag
	mode   string
}

func (*specCmd) Name() string     { return "spec" }
func (*specCmd) Usage() string    { return "spec [--mode capture|measure|sandbox]" }
func (*specCmd) Synopsis() string { return "print the OCI spec of a sandbox mode and its fingerprint" }
func (c *specCmd) SetFlags(fs *flag.FlagSet) {
	c.config.register(fs)
	fs.StringVar(&c.mode, "mode", "sandbox", "capture, measure or sandbox")
}

func (c *specCmd) Execute(ctx context.Context, con *console, args []string) error {
	if err := noArgs(args); err != nil {
		return err
	}
	switch sandbox.Mode(c.mode) {
	case sandbox.ModeCapture, sandbox.ModeMeasure, sandbox.ModeSandbox:
	default:
		return usagef("-mode %q: want capture, measure or sandbox", c.mode)
	}
	cfg, err := c.config.load()
	if err != nil {
		return err
	}
	// The real path (runsc refuses a root reached through a symlink, and build/rootfs is one)
	// and the process the rootfs records (an image's Env, WorkingDir and User).
	rootfs, err := run.OpenRootfs(cfg.Rootfs)
	if err != nil {
		return err
	}
	opts := sandbox.SpecOptions{Mode: sandbox.Mode(c.mode), Rootfs: rootfs.Path, HostDir: run.RestoreSpecHostDir, Process: rootfs.Info.SandboxProcess()}
	if opts.Mode == sandbox.ModeCapture {
		opts.ImageDir = "/path/to/checkpoint-dir"
		opts.Imports = []string{"numpy"}
	}
	spec, err := sandbox.Spec(opts)
	if err != nil {
		return usageError{err}
	}
	fingerprint, err := sandbox.Fingerprint(spec, cfg.Runsc.SandboxFlags())
	if err != nil {
		return err
	}
	if con.json {
		return writeJSON(con.stdout, map[string]any{"spec": spec, "fingerprint": fingerprint})
	}
	data, err := json.MarshalIndent(spec, "", "  ")
	if err != nil {
		return err
	}
	fmt.Fprintf(con.stdout, "%s\nfingerprint: %s\n", data, fingerprint)
	return nil
}
