// Package run is one pipeline run over an output directory, as stages with their inputs
// passed in, in the order data flows: the config's rootfs (Env.PrepareRootfs); the Basis that
// every set shares, computed once; the plan (NewPlan: reuse, capture, keep or drop, and why);
// the carry-out through a Driver, the one boundary where runsc is called (capture, timed
// restores, smoke test), into the store and a staging directory; the output's files; the swap
// (throughStaging), only when every set passed. Env.Capture runs them on runsc; the unit tests
// run the same stages on a substitute Driver. A run over an output that a capture already made
// (WithVerifiedOutput: measure, smoke, bench) restores it exactly as its manifest records.
package run

import (
	"context"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"time"

	"github.com/sirupsen/logrus"

	"readie.dev/pipeline/internal/config"
	"readie.dev/pipeline/internal/cpubaseline"
	"readie.dev/pipeline/internal/exchange"
	"readie.dev/pipeline/internal/lease"
	"readie.dev/pipeline/internal/oci/imageconfig"
	"readie.dev/pipeline/internal/oci/ref"
	"readie.dev/pipeline/internal/oci/rootfs"
	"readie.dev/pipeline/internal/oci/unpack"
	"readie.dev/pipeline/internal/oci/verify"
	"readie.dev/pipeline/internal/outdir"
	"readie.dev/pipeline/internal/sandboxes"
	"readie.dev/pipeline/internal/store"
	"readie.dev/pipeline/pkg/capture"
	"readie.dev/pipeline/pkg/filedigest"
	"readie.dev/pipeline/pkg/manifest"
	"readie.dev/pipeline/pkg/measure"
)

// ErrSetup reports a missing prerequisite or bad input (exit code 2); anything else that
// fails a run is a pipeline failure (exit code 1). It is outdir.ErrSetup: an output that is
// not the pipeline's is bad input too, and one sentinel classifies both.
var ErrSetup = outdir.ErrSetup

// RestoreSpecHostDir stands for the per-sandbox host directory in the restore spec that
// the manifest ships: a worker replaces it (and the environment and root.path), nothing else.
const RestoreSpecHostDir = "/run/readie/sandboxes/SANDBOX_ID"

// Env is what every subcommand needs: the config, a runtime, the image, the restore flags, the
// store, and the sandboxes of this shape (Launcher, Restorer, CaptureRequest). A capture's
// stages take what they need of it as inputs (Capture); a run over an existing output uses a
// copy shaped by that output's manifest (manifestEnv).
type Env struct {
	Config  *config.Config
	Runtime *sandboxes.Runtime
	// RunscSHA256 is the digest of the runsc binary, hashed once per run (it is 100 MB).
	RunscSHA256 string
	// Rootfs is the image sandboxes run; set by Capture from the config, or from the manifest
	// for a run over an existing output.
	Rootfs manifest.Rootfs
	// RootfsInfo is what Rootfs records of itself: the image's process (environment, cwd,
	// user), its python3.
	RootfsInfo *manifest.RootfsInfo
	// Image names the user's image Rootfs was made from, if it was.
	Image *manifest.Image
	// RestoreFlags are passed to every `runsc restore`.
	RestoreFlags []string
	Log          logrus.FieldLogger
	// Store is the checkpoint store the config names, written under this run's lease.
	Store *store.Store
	// CleanFailed removes the staging directory of a failed run instead of leaving it.
	CleanFailed bool
	// PassEnvToOutputs passes the config's pass_env values into the sandboxes of a run over an
	// existing output (--pass-env). Off, they get none: nothing records where an output came
	// from, and a pulled one's checkpoints are a stranger's code.
	PassEnvToOutputs bool
	// passEnv holds the variables the config passes into every sandbox.
	passEnv []string
	// controls are the CPU baseline's library controls (cpubaseline.Controls): in every
	// sandbox's environment, as a worker puts them into its restore environment.
	controls map[string]string
	// extraEnv is what every sandbox gets besides its base environment: pass_env and the
	// controls, nothing else (extraEnvOf).
	extraEnv []string
	// sweep cleans up after runs that are over before this one works.
	sweep sweeper
	// lease is this run's: its sandboxes, scratch directories and pending store entries are
	// named after it, so other runs leave them alone while it lives (package lease).
	lease *lease.Lease
}

// extraEnvOf is what every sandbox gets besides its base environment: the pass_env
// variables passEnv and the CPU baseline's library controls, nothing else.
func extraEnvOf(passEnv []string, controls map[string]string) []string {
	return append(slices.Clone(passEnv), cpubaseline.Env(controls)...)
}

// baselineFeatures are the features of cfg's CPU baseline (nil without one).
func baselineFeatures(cfg *config.Config) []string {
	if cfg.CPUBaseline == nil {
		return nil
	}
	return cfg.CPUBaseline.Features
}

// NewEnv checks the runsc binary named by cfg; it changes nothing on disk. The rootfs is
// checked by the step that needs it: a capture uses the config's, a run over an existing
// output the manifest's.
func NewEnv(ctx context.Context, cfg *config.Config, log logrus.FieldLogger) (*Env, error) {
	rt := &sandboxes.Runtime{
		Path:           cfg.Runsc.Path,
		Root:           cfg.Runsc.Root,
		Flags:          cfg.Runsc.SandboxFlags(),
		CommandTimeout: cfg.Timeouts.RunscCommand,
		OutputLimit:    int64(cfg.Limits.SandboxOutput),
	}
	if err := rt.Check(ctx); err != nil {
		return nil, fmt.Errorf("%w: %w", ErrSetup, err)
	}
	_, binary, err := filedigest.Of(rt.Path)
	if err != nil {
		return nil, fmt.Errorf("%w: %w", ErrSetup, err)
	}
	var passEnv []string
	for _, name := range cfg.PassEnv {
		if value, ok := os.LookupEnv(name); ok {
			passEnv = append(passEnv, name+"="+value)
		}
	}
	l, err := lease.New()
	if err != nil {
		return nil, err
	}
	rt.Lease = l
	controls := cpubaseline.Controls(baselineFeatures(cfg))
	st := &store.Store{Dir: cfg.CheckpointCache, Lease: l}
	return &Env{
		Config: cfg, Runtime: rt, RunscSHA256: binary, RestoreFlags: slices.Clone(cfg.Runsc.RestoreFlags), Log: log, Store: st,
		passEnv: passEnv, controls: controls, extraEnv: extraEnvOf(passEnv, controls), lease: l,
		sweep: sweeper{runtime: rt, lease: l, store: st, rootfs: filepath.Join(config.CacheDir(), "rootfs"), log: log},
	}, nil
}

// Offline is a copy of e whose sandboxes have no network (runsc --network=none), whatever the
// config's runsc.network: for a step that runs an image's own code for its figures alone
// (analyze imports every module a corpus names), which needs no network and must not get one.
func (e *Env) Offline() *Env {
	rt := *e.Runtime
	rt.Flags.Network = "none"
	x := *e
	x.Runtime = &rt
	return &x
}

// Close ends the run: it releases its lease, so its lock files in shared directories go.
// Everything the run named after its lease must be gone by then (a failed run's kept staging
// directory is not named after it).
func (e *Env) Close() error { return e.lease.Release() }

// PrepareRootfs sets e.Rootfs to the sandbox root the config names: its rootfs, or its image
// (fetched and unpacked once into the cache, verified, within timeouts.registry and the
// config's limits; the executor layered on top, the image's own code run only in sandboxes).
func (e *Env) PrepareRootfs(ctx context.Context) error {
	if e.Config.Image == "" {
		opened, info, err := OpenRootfs(e.Config.Rootfs)
		e.Rootfs, e.RootfsInfo = opened, info
		if err != nil {
			return err
		}
		return e.sweep.holdShared() // from now on a prune-rootfs leaves it alone
	}
	fetchCtx, cancel := context.WithTimeoutCause(ctx, e.Config.Timeouts.Registry,
		fmt.Errorf("fetching and unpacking image %s exceeded timeouts.registry (%s)", e.Config.Image, e.Config.Timeouts.Registry))
	defer cancel()
	platform, err := ref.ParsePlatform(e.Config.Platform)
	if err != nil {
		return fmt.Errorf("%w: %w", ErrSetup, err)
	}
	resolved, err := ref.Resolve(fetchCtx, e.Config.Image, e.Config.InsecureRegistries, platform)
	if err != nil {
		return imageError(fetchCtx, e.Config.Image, err)
	}
	img := resolved.Image
	if err := e.sweep.holdShared(); err != nil { // before the rootfs it reuses or makes
		return err
	}
	start := time.Now()
	unpacked, err := unpack.UnpackOnce(fetchCtx, img, config.CacheDir(), exchange.ImageLimits(e.Config.Limits), e.Log, unpack.LogLayers(e.Log, "unpack"))
	if err != nil {
		return imageError(fetchCtx, e.Config.Image, err)
	}
	if unpacked.Made {
		e.Log.WithFields(logrus.Fields{"image": unpacked.Manifest, "took": time.Since(start).Round(time.Millisecond)}).Info("unpack: done")
	}
	image := &manifest.Image{Ref: e.Config.Image, Digest: unpacked.Manifest, Index: resolved.Index, Platform: resolved.Platform}
	// The config's digest is in the manifest that names the unpacked directory: the same one.
	cfg, manifestDigest, err := verify.Config(img)
	if err == nil && manifestDigest.String() != unpacked.Manifest {
		err = fmt.Errorf("%w: the manifest changed while it was read (%s, then %s)", verify.ErrDigest, unpacked.Manifest, manifestDigest)
	}
	if err != nil {
		return imageError(fetchCtx, e.Config.Image, err)
	}
	process, err := imageconfig.Process(cfg.Config, unpacked.Dir)
	if err != nil {
		return fmt.Errorf("%w: image %s: %w", ErrSetup, e.Config.Image, err)
	}
	path, _, err := rootfs.Assemble(ctx, rootfs.Options{
		Cache: config.CacheDir(), Base: unpacked.Dir, BaseDigest: unpacked.Content, Image: image, Process: &process,
		Runtime: e.Runtime, Timeout: e.Config.Timeouts.ImageProbe, Log: e.Log,
	})
	if err != nil {
		if errors.Is(err, rootfs.ErrPython) {
			return fmt.Errorf("%w: %w", ErrSetup, err)
		}
		return err
	}
	opened, info, err := OpenRootfs(path)
	if err != nil {
		return err
	}
	e.Rootfs, e.RootfsInfo, e.Image = opened, info, image
	return nil
}

// imageError says which image failed. An image the pipeline cannot use (a bad reference, a
// refused entry, a limit) is bad input (exit 2); bytes that do not match their digest, and a
// fetch that ran out of time (ctx done: a registry client may keep only the words of its
// cause), fail the run (exit 1).
func imageError(ctx context.Context, image string, err error) error {
	if ctx.Err() != nil && !errors.Is(err, ctx.Err()) {
		err = fmt.Errorf("%w: %w", err, ctx.Err())
	}
	if errors.Is(err, verify.ErrDigest) || ctx.Err() != nil {
		return fmt.Errorf("image %s: %w", image, err)
	}
	return fmt.Errorf("%w: image %s: %w", ErrSetup, image, err)
}

// OpenRootfs resolves a rootfs directory (runsc refuses a symlinked root) and reads what
// `make image` or an image's assembly recorded in it: its digest, its process, its python3.
func OpenRootfs(path string) (manifest.Rootfs, *manifest.RootfsInfo, error) {
	resolved, err := filepath.EvalSymlinks(path)
	if err != nil {
		return manifest.Rootfs{}, nil, fmt.Errorf("%w: rootfs %s: %w (run `make image`)", ErrSetup, path, err)
	}
	info, err := manifest.ReadRootfsInfo(resolved)
	if err != nil {
		return manifest.Rootfs{}, nil, fmt.Errorf("%w: rootfs %s has no readable image.json: %w (run `make image`)", ErrSetup, resolved, err)
	}
	return manifest.Rootfs{Path: resolved, Digest: info.Digest}, info, nil
}

// Launcher starts sandboxes of this environment's shape, each bounded by limit; workDir
// holds their bundles.
func (e *Env) Launcher(workDir string, limit time.Duration) sandboxes.Launcher {
	return sandboxes.Launcher{Runtime: e.Runtime, Rootfs: e.Rootfs.Path, Process: e.RootfsInfo.SandboxProcess(), WorkDir: workDir, Env: slices.Clone(e.extraEnv), Timeout: limit}
}

// Restorer restores checkpoints of this environment with its restore flags, each restore
// (and, in a smoke test or a timed call, the call after it) bounded by limit:
// timeouts.restore to time restores, timeouts.smoke for a smoke test.
func (e *Env) Restorer(workDir string, limit time.Duration) *measure.Restorer {
	return &measure.Restorer{Launcher: e.Launcher(workDir, limit), Flags: slices.Clone(e.RestoreFlags)}
}

// CaptureRequest is the one place a capture of set is described: into dir, with this
// environment's rootfs, sandbox environment, CPU baseline and timeout, and the given
// checkpoint options.
func (e *Env) CaptureRequest(set config.Set, dir, workDir, runscVersion string, options map[string]string) capture.Request {
	return capture.Request{
		ID: set.ID, Imports: set.Imports, Rootfs: e.Rootfs.Path, Process: e.RootfsInfo.SandboxProcess(), Dir: dir, WorkDir: workDir,
		Env: slices.Clone(e.extraEnv), CheckpointOptions: options, CPUBaseline: baselineFeatures(e.Config),
		Timeout: e.Config.Timeouts.Capture, RunscVersion: runscVersion,
	}
}
