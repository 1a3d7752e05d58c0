package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"strings"

	"readie.dev/pipeline/internal/config"
	"readie.dev/pipeline/internal/oci/rootfs"
)

// rootfsCmd puts the executor layer on a base root filesystem (`make image` runs it on its
// Debian package layer): the same code that layers the executor onto a user's image.
type rootfsCmd struct {
	config                  configFlag
	base, baseDigest, cache string
}

func (*rootfsCmd) Name() string  { return "rootfs" }
func (*rootfsCmd) Usage() string { return "rootfs --base DIR --base-digest sha256:... [--cache DIR]" }
func (*rootfsCmd) Synopsis() string {
	return "put the executor layer on --base (a directory that never changes); print the rootfs path"
}
func (c *rootfsCmd) SetFlags(fs *flag.FlagSet) {
	c.config.register(fs) // runsc, its root and timeouts.image_probe: the base's python3 runs in a sandbox
	fs.StringVar(&c.base, "base", "", "the base root filesystem")
	fs.StringVar(&c.baseDigest, "base-digest", "", "the base's content digest (sha256:...)")
	fs.StringVar(&c.cache, "cache", config.CacheDir(), "the cache the rootfs goes under (CACHE/rootfs/sha256-DIGEST)")
}

func (c *rootfsCmd) CheckArgs(args []string) error {
	if c.base == "" || !strings.HasPrefix(c.baseDigest, "sha256:") {
		return fmt.Errorf("--base DIR and --base-digest sha256:... are required")
	}
	return noArgs(args)
}

func (c *rootfsCmd) Execute(ctx context.Context, con *console, _ []string) error {
	cfg, err := c.config.load()
	if err != nil {
		return err
	}
	env, err := newEnv(ctx, cfg, con)
	if err != nil {
		return err
	}
	defer env.Close()
	path, info, err := rootfs.Assemble(ctx, rootfs.Options{
		Cache: c.cache, Base: c.base, BaseDigest: c.baseDigest,
		Runtime: env.Runtime, Timeout: cfg.Timeouts.ImageProbe, Log: con.log,
	})
	if errors.Is(err, rootfs.ErrPython) {
		return usageError{err}
	}
	if err != nil {
		return err
	}
	if info.Reused {
		con.log.WithField("digest", info.Digest).Info("rootfs reused")
	} else {
		con.log.WithField("digest", info.Digest).Info("rootfs assembled")
	}
	if con.json {
		return writeJSON(con.stdout, map[string]any{"rootfs": path, "digest": info.Digest, "reused": info.Reused})
	}
	fmt.Fprintln(con.stdout, path)
	return nil
}
