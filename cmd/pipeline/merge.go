package main

import (
	"context"
	"flag"
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"strconv"

	"readie.dev/pipeline/internal/oci"
	"readie.dev/pipeline/internal/run"
)

type mergeCmd struct{}

func (*mergeCmd) Name() string { return "merge" }
func (*mergeCmd) Synopsis() string {
	return "merge outputs (shards: directories or images of push) into --out: every source verifies and agrees; a set is kept once"
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

func (*mergeCmd) Execute(ctx context.Context, g *globals, args []string) error {
	cfg, err := g.loadConfig()
	if err != nil {
		return err
	}
	// A source that is not a directory is an image of `pipeline push`: pulled beside the
	// output first (same file system: the merge hard-links from it), removed after.
	sources := slices.Clone(args)
	var pulled string
	defer func() {
		if pulled != "" {
			os.RemoveAll(pulled)
		}
	}()
	for i, src := range sources {
		if fi, err := os.Stat(src); err == nil && fi.IsDir() {
			continue
		}
		if pulled == "" {
			if err := os.MkdirAll(filepath.Dir(cfg.Output), 0o755); err != nil {
				return err
			}
			if pulled, err = os.MkdirTemp(filepath.Dir(cfg.Output), ".merge-pull-"); err != nil {
				return err
			}
		}
		_, ref, pullCtx, cancel, err := g.registryStep(ctx, "pull", src)
		if err != nil {
			return err
		}
		img, err := oci.Fetch(pullCtx, ref, nil)
		if err == nil {
			sources[i] = filepath.Join(pulled, strconv.Itoa(i))
			_, err = run.Pull(img, sources[i], oci.LogLayers(g.log, "pull "+src))
		}
		cancel()
		if err != nil {
			return fmt.Errorf("merge source %s: %w", src, err)
		}
	}
	m, err := run.Merge(cfg.Output, sources)
	if err != nil {
		return usageIfSetup(err)
	}
	fmt.Fprintf(g.stdout, "%s: %d checkpoints from %d sources\n", cfg.Output, len(m.Checkpoints), len(args))
	printCheckpoints(g.stdout, m)
	return nil
}
