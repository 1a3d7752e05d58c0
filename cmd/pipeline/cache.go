package main

import (
	"context"
	"flag"
	"fmt"
	"path/filepath"
	"sort"
	"strings"
	"time"

	"readie.dev/pipeline/internal/config"
	"readie.dev/pipeline/internal/run"
	"readie.dev/pipeline/internal/store"
	"readie.dev/pipeline/pkg/manifest"
)

// cacheCmd manages what the pipeline keeps under {cache}: `pipeline cache ACTION [flags] ...`.
type cacheCmd struct{}

func (*cacheCmd) Name() string { return "cache" }
func (*cacheCmd) Synopsis() string {
	return "the checkpoint store and rootfs cache: list | prune --older-than D [--dry-run] [OUT...] | prune-rootfs [--dry-run] [OUT...]"
}
func (*cacheCmd) SetFlags(*flag.FlagSet) {}

// cacheAction is one action of `pipeline cache`, with flags of its own after its name.
type cacheAction struct {
	synopsis string
	run      func(ctx context.Context, g *globals, args []string) error
}

func cacheActions() map[string]cacheAction {
	return map[string]cacheAction{
		"list":         {"list the checkpoint store's entries: key, sets that used it, size, last use", listStore},
		"prune":        {"remove store entries unused for --older-than that no output named here uses", pruneStore},
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
	_, keep, err := outputKeys(fs.Args())
	if err != nil {
		return err
	}
	if rootfs, err := filepath.EvalSymlinks(cfg.Rootfs); err == nil {
		keep = append(keep, rootfs)
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

func listStore(_ context.Context, g *globals, args []string) error {
	fs := flag.NewFlagSet("pipeline cache list", flag.ContinueOnError)
	if err := g.parseAction(fs, args); err != nil {
		return err
	}
	if err := noArgs(fs.Args()); err != nil {
		return err
	}
	cfg, err := g.loadConfig()
	if err != nil {
		return err
	}
	entries, err := (&store.Store{Dir: cfg.CheckpointCache}).List()
	if err != nil {
		return err
	}
	if g.logFormat == "json" {
		return writeJSON(g.stdout, entries)
	}
	tw := newTable(g.stdout)
	fmt.Fprintln(tw, "key	sets	imports	MiB	last use (UTC)	")
	for _, e := range entries {
		fmt.Fprintf(tw, "%s	%s	%s	%.1f	%s	\n", e.Key, orDash(strings.Join(e.Sets, ",")), orDash(strings.Join(e.Imports, ",")),
			float64(e.Bytes)/(1<<20), e.LastUse.UTC().Format(time.DateTime))
	}
	return tw.Flush()
}

func orDash(s string) string {
	if s == "" {
		return "-"
	}
	return s
}

// outputKeys reads the keys that the outputs named on the command line use; an output that
// cannot be read stops the command, so nothing it uses can be removed by mistake.
func outputKeys(outs []string) (map[string]bool, []string, error) {
	keys := map[string]bool{}
	var rootfs []string
	for _, out := range outs {
		m, err := manifest.Load(filepath.Join(out, manifest.FileName))
		if err != nil {
			return nil, nil, usagef("output %s: %v (nothing removed)", out, err)
		}
		for _, c := range m.Checkpoints {
			keys[c.Key] = true
		}
		rootfs = append(rootfs, m.Rootfs.Path)
	}
	return keys, rootfs, nil
}

func pruneStore(_ context.Context, g *globals, args []string) error {
	fs := flag.NewFlagSet("pipeline cache prune", flag.ContinueOnError)
	olderThan := fs.Duration("older-than", 0, "remove entries last used longer ago than this (e.g. 720h); required")
	dryRun := fs.Bool("dry-run", false, "print what would be removed; remove nothing")
	if err := g.parseAction(fs, args); err != nil {
		return err
	}
	if *olderThan <= 0 {
		return usagef("cache prune: --older-than must be a positive duration such as 720h")
	}
	cfg, err := g.loadConfig()
	if err != nil {
		return err
	}
	keep, _, err := outputKeys(fs.Args())
	if err != nil {
		return err
	}
	pruned, err := (&store.Store{Dir: cfg.CheckpointCache}).Prune(time.Now().Add(-*olderThan), keep, *dryRun)
	verb := "removed"
	if *dryRun {
		verb = "would remove"
	}
	var bytes int64
	for _, e := range pruned {
		bytes += e.Bytes
		fmt.Fprintf(g.stdout, "%s %s (%s, last use %s)\n", verb, e.Key, orDash(strings.Join(e.Sets, ",")), e.LastUse.UTC().Format(time.DateTime))
	}
	fmt.Fprintf(g.stdout, "%s %d entries, %.1f MiB\n", verb, len(pruned), float64(bytes)/(1<<20))
	return err
}
