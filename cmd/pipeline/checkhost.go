package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"strings"

	"readie.dev/pipeline/internal/config"
	"readie.dev/pipeline/internal/exchange"
	"readie.dev/pipeline/internal/oci/ref"
	"readie.dev/pipeline/pkg/cpu"
	"readie.dev/pipeline/pkg/launch"
	"readie.dev/pipeline/pkg/manifest"
	"readie.dev/pipeline/pkg/runsc"
)

// checkHostCmd is `pipeline check-host`: would the checkpoints of an output restore on this
// host, or on a host described by a features file?
type checkHostCmd struct {
	config      configFlag
	out         outFlag
	image       string
	cpuFeatures string
	cpus        int
	runsc       string
	runtime     string
}

func (*checkHostCmd) Name() string { return "check-host" }
func (*checkHostCmd) Usage() string {
	return "check-host [--out OUT | --image REF] [--cpu-features FILE [--cpus N]] [--runsc PATH | --runtime DIR]"
}
func (*checkHostCmd) Synopsis() string {
	return "say, checkpoint by checkpoint, whether an output restores on this host (or the host of a features file); exit 3 when some do not, 1 when it could not check"
}
func (c *checkHostCmd) SetFlags(fs *flag.FlagSet) {
	c.config.register(fs)
	c.out.register(fs)
	fs.StringVar(&c.image, "image", "", "check the output held by the image `REF` of pipeline push (HOST/REPO[:TAG|@DIGEST] or oci-layout:DIR[:TAG]) instead of an output directory")
	fs.StringVar(&c.cpuFeatures, "cpu-features", "", "the host's CPU from `FILE`: the line that runsc cpu-features prints there, optionally followed by its \"clflush size : N\" line of /proc/cpuinfo (default: this host's)")
	fs.IntVar(&c.cpus, "cpus", 0, "with --cpu-features: the host's CPU count `N`, warned about when below the checkpoints' cpus (default: unknown, not checked; without --cpu-features, this host's)")
	fs.StringVar(&c.runsc, "runsc", "", "the host's runsc binary at `PATH` (default: the config's runsc.path)")
	fs.StringVar(&c.runtime, "runtime", "", "the host's runtime in `DIR`, as pull --runtime lays it out: DIR/runsc with its helpers in DIR/gvisor-bin, and DIR/rootfs, whose digest is checked too; DIR must be private, and its runsc is not run unless it and its helpers are the output's")
}

func (c *checkHostCmd) CheckArgs(args []string) error {
	if err := readsOutput(args); err != nil {
		return err
	}
	if c.cpus != 0 && (c.cpuFeatures == "" || c.cpus < 0) {
		return errors.New("--cpus N (1 or more) describes the host of --cpu-features: this host's count is its own")
	}
	if c.runtime != "" && c.runsc != "" {
		return errors.New("--runtime DIR names runsc (DIR/runsc) and --runsc names another: name one")
	}
	if c.image != "" && (c.out.dir != "" || len(args) > 0) {
		return errors.New("--image and an output directory: name one")
	}
	if c.image != "" {
		if _, err := ref.Parse(c.image, nil); err != nil {
			return err
		}
	}
	return nil
}

// errDoesNotRestore reports checkpoints that would not restore on the host: a verdict, exit 3
// (exitcode.DoesNotRestore), where an error while checking is 1 or 2.
var errDoesNotRestore = errors.New("checkpoints do not restore")

func (c *checkHostCmd) Execute(ctx context.Context, con *console, args []string) error {
	cfg, err := c.config.load()
	if err != nil {
		return err
	}
	// The manifest first: a runsc of --runtime DIR runs only once it is the manifest's.
	var m *manifest.Manifest
	if c.image != "" {
		if m, err = c.pull(ctx, con, cfg); err != nil {
			return err
		}
	} else {
		if err := c.out.apply(cfg, args); err != nil {
			return err
		}
		if m, err = manifest.Load(filepath.Join(cfg.Output, manifest.FileName)); err != nil {
			return usageError{err}
		}
	}
	driver := &runsc.Runsc{Path: cfg.Runsc.Path, CommandTimeout: cfg.Timeouts.RunscCommand}
	rootfs := ""
	switch {
	case c.runtime != "":
		d, err := launch.CheckRuntimeDir(c.runtime, m)
		switch {
		case errors.Is(err, manifest.ErrRuntime):
			return fmt.Errorf("%w with --runtime %s: %w", errDoesNotRestore, c.runtime, err)
		case err != nil:
			return usageError{err}
		}
		driver.Path, driver.HelpersDir, rootfs = d.Runsc, d.Helpers, d.Rootfs
	case c.runsc != "":
		driver.Path = c.runsc
	}
	host, where, err := c.host(ctx, driver)
	if err != nil {
		return err
	}
	report := manifest.CheckHost(m, host)
	if rootfs != "" {
		report = checkRootfs(m, rootfs, report)
	}
	if con.json {
		err = writeJSON(con.stdout, struct {
			Host manifest.RestoreHost `json:"host"`
			manifest.Report
		}{host, report})
	} else {
		err = printReport(con, host, where, report)
	}
	if err != nil {
		return err
	}
	if !report.Restores {
		var failed []string
		for _, v := range report.Checkpoints {
			if !v.Restores {
				failed = append(failed, v.ID)
			}
		}
		return fmt.Errorf("%w on %s: %s", errDoesNotRestore, where, strings.Join(failed, ", "))
	}
	return nil
}

// checkRootfs adds to every verdict of r a problem when the rootfs at path is not the one m's
// checkpoints were captured on (manifest.CheckRootfs).
func checkRootfs(m *manifest.Manifest, path string, r manifest.Report) manifest.Report {
	err := m.CheckRootfs(path)
	if err == nil {
		return r
	}
	r.Restores = false
	for i := range r.Checkpoints {
		r.Checkpoints[i].Restores = false
		r.Checkpoints[i].Problems = append(slices.Clone(r.Checkpoints[i].Problems), err.Error())
	}
	return r
}

// host describes the host checked: this one, or the CPU of --cpu-features, with the runsc of
// driver; where says which, for people.
func (c *checkHostCmd) host(ctx context.Context, driver *runsc.Runsc) (manifest.RestoreHost, string, error) {
	if _, err := os.Stat(driver.Path); err != nil {
		return manifest.RestoreHost{}, "", usagef("runsc %s: %v (name the host's runsc with --runsc, or its runtime with --runtime)", driver.Path, err)
	}
	if c.cpuFeatures == "" {
		h, err := manifest.ReadHost(ctx, driver)
		return h, "this host", err
	}
	hosts, err := cpu.ReadHosts(c.cpuFeatures)
	if err != nil {
		return manifest.RestoreHost{}, "", usageError{err}
	}
	if len(hosts) != 1 {
		return manifest.RestoreHost{}, "", usagef("--cpu-features %s describes %d host types: check-host checks one host (one features line and its clflush size line)", c.cpuFeatures, len(hosts))
	}
	h, err := manifest.ReadHost(ctx, driver)
	if err != nil {
		return manifest.RestoreHost{}, "", err
	}
	h.CPU, h.CPUs = hosts[0], c.cpus
	return h, "the host of " + c.cpuFeatures, nil
}

// pull fetches the output an image holds into a scratch directory of its own lease (verified,
// as `pipeline pull` does; run.PullAside) and returns its manifest.
func (c *checkHostCmd) pull(ctx context.Context, con *console, cfg *config.Config) (*manifest.Manifest, error) {
	r, ctx, cancel, err := registryStep(ctx, cfg, "pull", c.image)
	if err != nil {
		return nil, err
	}
	defer cancel()
	img, err := ref.Fetch(ctx, r)
	if err != nil {
		return nil, err
	}
	m, err := exchange.PullAside(ctx, img, exchange.ImageLimits(cfg.Limits), con.log, con.progress, "pull")
	if err != nil {
		return nil, usageIfSetup(err)
	}
	return m, nil
}

func printReport(con *console, h manifest.RestoreHost, where string, r manifest.Report) error {
	line := "unknown (not checked)"
	if h.CPU.CacheLine != 0 {
		line = fmt.Sprintf("%d bytes", h.CPU.CacheLine)
	}
	cpus := "unknown"
	if h.CPUs != 0 {
		cpus = fmt.Sprint(h.CPUs)
	}
	fmt.Fprintf(con.stdout, "%s: runsc %s, executor protocol %d, %s CPUs, %d CPU features, cache line %s\n",
		where, h.RunscVersion, h.ExecutorProtocol, cpus, len(h.CPU.Features), line)
	for _, v := range r.Checkpoints {
		if v.Restores {
			fmt.Fprintf(con.stdout, "%s: restores\n", v.ID)
		} else {
			fmt.Fprintf(con.stdout, "%s: does not restore: %s\n", v.ID, strings.Join(v.Problems, "; "))
		}
		for _, w := range v.Warnings {
			fmt.Fprintf(con.stdout, "  warning: %s\n", w)
		}
	}
	return nil
}
