package main

import (
	"context"
	"flag"
	"fmt"

	"readie.dev/pipeline/internal/config"
	"readie.dev/pipeline/internal/exchange"
	"readie.dev/pipeline/internal/oci/output"
	"readie.dev/pipeline/internal/oci/ref"
)

// registryStep parses ref for a push or pull against cfg, bounded by timeouts.registry.
func registryStep(ctx context.Context, cfg *config.Config, what, arg string) (ref.Ref, context.Context, context.CancelFunc, error) {
	r, err := ref.Parse(arg, cfg.InsecureRegistries)
	if err != nil {
		return ref.Ref{}, nil, nil, usageError{err}
	}
	ctx, cancel := context.WithTimeoutCause(ctx, cfg.Timeouts.Registry, fmt.Errorf("%s exceeded its timeout of %s (timeouts.registry)", what, cfg.Timeouts.Registry))
	return r, ctx, cancel, nil
}

type pushCmd struct {
	config  configFlag
	out     outFlag
	runtime bool
}

func (*pushCmd) Name() string  { return "push" }
func (*pushCmd) Usage() string { return "push [--out OUT] [--runtime] REF" }
func (*pushCmd) Synopsis() string {
	return "push the output as an OCI image to REF (HOST/REPO[:TAG] or oci-layout:DIR[:TAG]); print REF@sha256:..."
}
func (c *pushCmd) SetFlags(fs *flag.FlagSet) {
	c.config.register(fs)
	c.out.register(fs)
	fs.BoolVar(&c.runtime, "runtime", false, "add the runtime the output was captured with (runsc with gvisor-bin/, the rootfs) as two layers, stored once per repository, for `pull --runtime`; it reads the whole rootfs, so push as a user who can (root)")
}

func (*pushCmd) CheckArgs(args []string) error {
	if len(args) != 1 {
		return fmt.Errorf("want one image reference, e.g. registry.example.com/readie/checkpoints:v1")
	}
	_, err := ref.Parse(args[0], nil)
	return err
}

func (c *pushCmd) Execute(ctx context.Context, con *console, args []string) error {
	cfg, err := c.config.load()
	if err != nil {
		return err
	}
	if err := c.out.apply(cfg, nil); err != nil {
		return err
	}
	r, ctx, cancel, err := registryStep(ctx, cfg, "push", args[0])
	if err != nil {
		return err
	}
	defer cancel()
	// The runtime goes with the output when asked: building its rootfs layer reads every file
	// of the rootfs, some only root may (a push in a pod of another user cannot). Not when the
	// sandbox root is an image: its rootfs is an unpacked copy, the image's reference its own
	// way to a worker host.
	var rt *output.Runtime
	if c.runtime {
		if cfg.Image != "" {
			return usagef("push --runtime: the sandbox root is the image %s: a worker host pulls that image itself", cfg.Image)
		}
		rt = &output.Runtime{Runsc: cfg.Runsc.Path, Rootfs: cfg.Rootfs}
	}
	pushed, err := exchange.Push(ctx, cfg.Output, r, rt, con.log, con.progress)
	if err != nil {
		return err
	}
	if con.json {
		return writeJSON(con.stdout, map[string]string{"reference": pushed})
	}
	fmt.Fprintln(con.stdout, pushed)
	return nil
}
