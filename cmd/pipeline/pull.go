package main

import (
	"context"
	"flag"
	"fmt"

	"readie.dev/pipeline/internal/exchange"
	"readie.dev/pipeline/internal/oci/ref"
)

type pullCmd struct {
	config  configFlag
	runtime string
}

func (*pullCmd) Name() string  { return "pull" }
func (*pullCmd) Usage() string { return "pull REF OUT [--runtime DIR]" }
func (*pullCmd) Synopsis() string {
	return "write the output that an image of `pipeline push` holds into OUT, verified"
}
func (c *pullCmd) SetFlags(fs *flag.FlagSet) {
	c.config.register(fs)
	fs.StringVar(&c.runtime, "runtime", "", "also lay out the runtime the output was captured with in `DIR` (DIR/runsc, DIR/gvisor-bin/, DIR/rootfs; DIR private: 0700, this user's), verified; layers DIR holds already are not fetched. Its runsc runs as root: REF must name the image by digest (or be an OCI layout)")
}

func (c *pullCmd) CheckArgs(args []string) error {
	if len(args) != 2 {
		return fmt.Errorf("want an image reference and an output directory")
	}
	r, err := ref.Parse(args[0], nil)
	if err != nil {
		return err
	}
	if c.runtime != "" && r.Movable() {
		return fmt.Errorf("--runtime lays out the runsc that %s names, which then runs as root, checked only against the manifest of the same image: name the image by its digest (REF@sha256:..., as push printed it), not by a tag whoever can push to the repository can move", args[0])
	}
	return nil
}

func (c *pullCmd) Execute(ctx context.Context, con *console, args []string) error {
	cfg, err := c.config.load()
	if err != nil {
		return err
	}
	r, ctx, cancel, err := registryStep(ctx, cfg, "pull", args[0])
	if err != nil {
		return err
	}
	defer cancel()
	img, err := ref.Fetch(ctx, r)
	if err != nil {
		return err
	}
	m, err := exchange.Pull(ctx, img, args[1], c.runtime, exchange.ImageLimits(cfg.Limits), con.log, con.progress, "pull")
	if err != nil {
		return usageIfSetup(err)
	}
	return printVerified(con, args[1], m)
}
