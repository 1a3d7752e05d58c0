package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"path/filepath"
	"strings"
	"time"

	"readie.dev/pipeline/internal/config"
	"readie.dev/pipeline/internal/oci/rootfs"
	"readie.dev/pipeline/internal/store"
	"readie.dev/pipeline/pkg/manifest"
)

// newCacheGroup is `pipeline cache`: what the pipeline keeps under {cache}.
func newCacheGroup() *group {
	return newGroup("cache", "the checkpoint store and the rootfs cache: list, prune, prune-rootfs",
		&cacheListCmd{}, &cachePruneCmd{}, &cachePruneRootfsCmd{})
}

type cacheListCmd struct{ config configFlag }

func (*cacheListCmd) Name() string  { return "list" }
func (*cacheListCmd) Usage() string { return "cache list [flags]" }
func (*cacheListCmd) Synopsis() string {
	return "list the checkpoint store's entries: key, sets that used it, size, last use"
}
func (c *cacheListCmd) SetFlags(fs *flag.FlagSet)   { c.config.register(fs) }
func (*cacheListCmd) CheckArgs(args []string) error { return noArgs(args) }

func (c *cacheListCmd) Execute(_ context.Context, con *console, _ []string) error {
	cfg, err := c.config.load()
	if err != nil {
		return err
	}
	entries, err := (&store.Store{Dir: cfg.CheckpointCache}).List()
	if err != nil {
		return err
	}
	if con.json {
		return writeJSON(con.stdout, entries)
	}
	tw := newTable(con.stdout)
	fmt.Fprintln(tw, "key\tsets\timports\tMiB\tlast use (UTC)\t")
	for _, e := range entries {
		fmt.Fprintf(tw, "%s\t%s\t%s\t%.1f\t%s\t\n", e.Key, orDash(strings.Join(e.Sets, ",")), orDash(strings.Join(e.Imports, ",")),
			float64(e.Bytes)/(1<<20), e.LastUse.UTC().Format(time.DateTime))
	}
	return tw.Flush()
}

// outputKeys reads the keys and rootfs paths that the outputs named on the command line use;
// an output that cannot be read stops the command, so nothing it uses is removed by mistake.
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

type cachePruneCmd struct {
	config    configFlag
	olderThan time.Duration
	dryRun    bool
}

func (*cachePruneCmd) Name() string  { return "prune" }
func (*cachePruneCmd) Usage() string { return "cache prune --older-than D [--dry-run] [OUT...]" }
func (*cachePruneCmd) Synopsis() string {
	return "remove store entries unused for --older-than that no output named here uses"
}
func (c *cachePruneCmd) SetFlags(fs *flag.FlagSet) {
	c.config.register(fs)
	fs.DurationVar(&c.olderThan, "older-than", 0, "remove entries last used longer ago than this (e.g. 720h); required")
	fs.BoolVar(&c.dryRun, "dry-run", false, "print what would be removed; remove nothing")
}

func (c *cachePruneCmd) CheckArgs([]string) error {
	if c.olderThan <= 0 {
		return fmt.Errorf("--older-than must be a positive duration such as 720h")
	}
	return nil
}

func (c *cachePruneCmd) Execute(_ context.Context, con *console, args []string) error {
	cfg, err := c.config.load()
	if err != nil {
		return err
	}
	keep, _, err := outputKeys(args)
	if err != nil {
		return err
	}
	pruned, err := (&store.Store{Dir: cfg.CheckpointCache}).Prune(time.Now().Add(-c.olderThan), keep, c.dryRun)
	var bytes int64
	for _, e := range pruned {
		bytes += e.Bytes
	}
	if con.json {
		if pruned == nil {
			pruned = []store.Entry{}
		}
		return errors.Join(err, writeJSON(con.stdout, map[string]any{"dry_run": c.dryRun, "entries": pruned, "bytes": bytes}))
	}
	verb := removeVerb(c.dryRun)
	for _, e := range pruned {
		fmt.Fprintf(con.stdout, "%s %s (%s, last use %s)\n", verb, e.Key, orDash(strings.Join(e.Sets, ",")), e.LastUse.UTC().Format(time.DateTime))
	}
	fmt.Fprintf(con.stdout, "%s %d entries, %.1f MiB\n", verb, len(pruned), float64(bytes)/(1<<20))
	return err
}

func removeVerb(dryRun bool) string {
	if dryRun {
		return "would remove"
	}
	return "removed"
}

type cachePruneRootfsCmd struct {
	config    configFlag
	olderThan time.Duration
	dryRun    bool
}

func (*cachePruneRootfsCmd) Name() string { return "prune-rootfs" }
func (*cachePruneRootfsCmd) Usage() string {
	return "cache prune-rootfs [--older-than D] [--dry-run] [OUT...]"
}
func (*cachePruneRootfsCmd) Synopsis() string {
	return "remove rootfs directories that neither the config nor an output named here uses, and unpacked images unused for --older-than"
}
func (c *cachePruneRootfsCmd) SetFlags(fs *flag.FlagSet) {
	c.config.register(fs)
	fs.DurationVar(&c.olderThan, "older-than", 0, "also remove images unpacked under rootfs/oci/ last used longer ago than this (e.g. 720h); without it they stay")
	fs.BoolVar(&c.dryRun, "dry-run", false, "print what would be removed; remove nothing")
}

func (c *cachePruneRootfsCmd) CheckArgs([]string) error {
	if c.olderThan < 0 {
		return fmt.Errorf("--older-than must be a positive duration such as 720h")
	}
	return nil
}

func (c *cachePruneRootfsCmd) Execute(_ context.Context, con *console, args []string) error {
	cfg, err := c.config.load()
	if err != nil {
		return err
	}
	_, keep, err := outputKeys(args)
	if err != nil {
		return err
	}
	if rootfs, err := filepath.EvalSymlinks(cfg.Rootfs); err == nil {
		keep = append(keep, rootfs)
	}
	var unusedSince time.Time
	if c.olderThan > 0 {
		unusedSince = time.Now().Add(-c.olderThan)
	}
	pruned, err := rootfs.Prune(filepath.Join(config.CacheDir(), "rootfs"), keep, []string{cfg.Runsc.Root, cfg.CheckpointCache}, unusedSince, c.dryRun)
	if con.json {
		if pruned == nil {
			pruned = []string{}
		}
		return errors.Join(err, writeJSON(con.stdout, map[string]any{"dry_run": c.dryRun, "dirs": pruned}))
	}
	for _, dir := range pruned {
		fmt.Fprintf(con.stdout, "%s %s\n", removeVerb(c.dryRun), dir)
	}
	if len(pruned) == 0 && err == nil {
		fmt.Fprintln(con.stdout, "no rootfs directory to remove")
	}
	return err
}
