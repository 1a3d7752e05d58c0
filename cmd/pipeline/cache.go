package main

import (
	"context"
	"flag"
	"fmt"
	"path/filepath"
	"sort"
	"strings"

	"readie.dev/pipeline/internal/config"
	"readie.dev/pipeline/internal/run"
	"readie.dev/pipeline/pkg/manifest"
)

// cacheCmd manages what the pipeline keeps under {cache}: `pipeline cache ACTION [flags] ...`.
type cacheCmd struct{}

func (*cacheCmd) Name() string { return "cache" }
func (*cacheCmd) Synopsis() string {
	return "manage the cache: prune-rootfs [--dry-run] [OUT...]"
}
func (*cacheCmd) SetFlags(*flag.FlagSet) {}

// cacheAction is one action of `pipeline cache`, with flags of its own after its name.
type cacheAction struct {
	synopsis string
	run      func(ctx context.Context, g *globals, args []string) error
}

func cacheActions() map[string]cacheAction {
	return map[string]cacheAction{
		"prune-rootfs": {"remove rootfs directories that neither the config nor an output named here uses", pruneRootfs},
	}
}

func (*cacheCmd) Execute(ctx context.Context, g *globals, args []string) error {
	actions := cacheActions()
	var names []string
	for name := range actions {
		names = append(names, name)
	}
	sort.Strings(names)
	if len(args) == 0 {
		return usagef("cache: name an action: %s", strings.Join(names, ", "))
	}
	action, ok := actions[args[0]]
	if !ok {
		return usagef("cache: unknown action %q: want %s", args[0], strings.Join(names, ", "))
	}
	return action.run(ctx, g, args[1:])
}

func pruneRootfs(_ context.Context, g *globals, args []string) error {
	fs := flag.NewFlagSet("pipeline cache prune-rootfs", flag.ContinueOnError)
	dryRun := fs.Bool("dry-run", false, "print what would be removed; remove nothing")
	if err := g.parseAction(fs, args); err != nil {
		return err
	}
	cfg, err := g.loadConfig()
	if err != nil {
		return err
	}
	var keep []string
	if rootfs, err := filepath.EvalSymlinks(cfg.Rootfs); err == nil {
		keep = append(keep, rootfs)
	}
	// Every output named must be readable: a rootfs is kept for it, or nothing is removed.
	for _, out := range fs.Args() {
		m, err := manifest.Load(filepath.Join(out, manifest.FileName))
		if err != nil {
			return usagef("output %s: %v (nothing removed)", out, err)
		}
		keep = append(keep, m.Rootfs.Path)
	}
	pruned, err := run.PruneRootfs(filepath.Join(config.CacheDir(), "rootfs"), keep, *dryRun)
	verb := "removed"
	if *dryRun {
		verb = "would remove"
	}
	for _, dir := range pruned {
		fmt.Fprintf(g.stdout, "%s %s\n", verb, dir)
	}
	if len(pruned) == 0 && err == nil {
		fmt.Fprintln(g.stdout, "no rootfs directory to remove")
	}
	return err
}
