package main

import (
	"context"
	"flag"
	"fmt"
	"time"

	"github.com/sirupsen/logrus"

	"readie.dev/pipeline/internal/config"
	"readie.dev/pipeline/internal/oci"
	"readie.dev/pipeline/internal/run"
)

// progress reports a transfer on stderr, throttled, in the log's format.
func (g *globals) progress(what string) *oci.Progress {
	mib := func(n int64) string { return fmt.Sprintf("%.1f", float64(n)/(1<<20)) }
	return &oci.Progress{What: what, Every: time.Second,
		Report: func(what string, done, total int64) {
			g.log.WithFields(logrus.Fields{"done_mib": mib(done), "total_mib": mib(total)}).Info(what)
		},
		Layer: func(layer string, done, total int64) {
			g.log.WithFields(logrus.Fields{"layer": layer, "done_mib": mib(done), "total_mib": mib(total)}).Info(what + ": layer")
		},
	}
}

type pushCmd struct{}

func (*pushCmd) Name() string { return "push" }
func (*pushCmd) Synopsis() string {
	return "push the output as an OCI image to REF (HOST/REPO[:TAG] or oci-layout:DIR[:TAG]); print REF@sha256:..."
}
func (*pushCmd) SetFlags(*flag.FlagSet) {}

func (*pushCmd) CheckArgs(_ *globals, args []string) error {
	if len(args) != 1 {
		return usagef("push: want one image reference, e.g. registry.example.com/readie/checkpoints:v1")
	}
	if _, err := oci.ParseRef(args[0], nil); err != nil {
		return usageError{err}
	}
	return nil
}

func (*pushCmd) Execute(ctx context.Context, g *globals, args []string) error {
	cfg, ref, ctx, cancel, err := g.registryStep(ctx, "push", args[0])
	if err != nil {
		return err
	}
	defer cancel()
	pushed, err := oci.Push(ctx, cfg.Output, ref, g.progress("push"))
	if err != nil {
		return err
	}
	fmt.Fprintln(g.stdout, pushed)
	return nil
}

// registryStep loads the config and parses ref for a push or pull, bounded by
// timeouts.registry.
func (g *globals) registryStep(ctx context.Context, what, arg string) (*config.Config, oci.Ref, context.Context, context.CancelFunc, error) {
	cfg, err := g.loadConfig()
	if err != nil {
		return nil, oci.Ref{}, nil, nil, err
	}
	ref, err := oci.ParseRef(arg, cfg.InsecureRegistries)
	if err != nil {
		return nil, oci.Ref{}, nil, nil, usageError{err}
	}
	ctx, cancel := context.WithTimeoutCause(ctx, cfg.Timeouts.Registry, fmt.Errorf("%s exceeded its timeout of %s (timeouts.registry)", what, cfg.Timeouts.Registry))
	return cfg, ref, ctx, cancel, nil
}

type pullCmd struct{}

func (*pullCmd) Name() string { return "pull" }
func (*pullCmd) Synopsis() string {
	return "pull REF OUT: write the output an image of `pipeline push` holds into OUT, verified"
}
func (*pullCmd) SetFlags(*flag.FlagSet) {}

func (*pullCmd) CheckArgs(_ *globals, args []string) error {
	if len(args) != 2 {
		return usagef("pull: want an image reference and an output directory")
	}
	if _, err := oci.ParseRef(args[0], nil); err != nil {
		return usageError{err}
	}
	return nil
}

func (*pullCmd) Execute(ctx context.Context, g *globals, args []string) error {
	_, ref, ctx, cancel, err := g.registryStep(ctx, "pull", args[0])
	if err != nil {
		return err
	}
	defer cancel()
	img, err := oci.Fetch(ctx, ref, nil)
	if err != nil {
		return err
	}
	m, err := run.Pull(img, args[1], oci.LogLayers(g.log, "pull"))
	if err != nil {
		return usageIfSetup(err)
	}
	fmt.Fprintf(g.stdout, "%s: %d checkpoints verified (executor protocol %d, runsc %s)\n", args[1], len(m.Checkpoints), m.ExecutorProtocol, m.Runsc.Version)
	return nil
}
