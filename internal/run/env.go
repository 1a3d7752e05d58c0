// Package run is the capture carry-out: one capture into an output directory, as stages with
// their inputs passed in, each value made once, in the order data flows: the config's rootfs
// (Env.ResolveRootfs) and the Sandboxes on it; the Basis every set shares (runsc flags,
// restore spec and its fingerprint, CPU needs, key inputs); the plan (NewPlan: reuse,
// capture, keep or drop, and why); the carry-out through a Driver, the one boundary where
// runsc is called (capture, timed restores, smoke test), into the store and a staging
// directory; the output's files; the swap (outdir.ThroughStaging), only when every set
// passed. Env.Capture runs them on runsc; the unit tests run the same stages on a substitute
// Driver. A run over an output that a capture already made (WithVerifiedOutput: measure,
// smoke, bench) restores it exactly as its manifest records. The output directory's life
// cycle is package outdir's; merge, pull and push are package exchange's.
package run

import (
	"context"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"time"

	specs "github.com/opencontainers/runtime-spec/specs-go"
	"github.com/sirupsen/logrus"

	"readie.dev/pipeline/internal/analysis"
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
	"readie.dev/pipeline/internal/progress"
	"readie.dev/pipeline/internal/store"
	"readie.dev/pipeline/pkg/capture"
	"readie.dev/pipeline/pkg/filedigest"
	"readie.dev/pipeline/pkg/launch"
	"readie.dev/pipeline/pkg/manifest"
	"readie.dev/pipeline/pkg/measure"
	"readie.dev/pipeline/pkg/runsc"
	"readie.dev/pipeline/pkg/sandbox"
)

// ErrSetup reports a missing prerequisite or bad input (exit code 2); anything else that
// fails a run is a pipeline failure (exit code 1). It is outdir.ErrSetup: an output that is
// not the pipeline's is bad input too, and one sentinel classifies both.
var ErrSetup = outdir.ErrSetup

// RestoreSpecHostDir stands for the per-sandbox host directory in the restore spec that
// the manifest ships: a worker replaces it (and the environment and root.path), nothing else.
const RestoreSpecHostDir = "/run/readie/sandboxes/SANDBOX_ID"

// Env is what every subcommand needs, made once by NewEnv and not changed after: the config,
// the runsc toolchain (its runtime, asked once), the restore flags, the store and this run's
// lease. The rootfs is not in it: a capture resolves the config's once (ResolveRootfs), a run
// over an existing output opens the manifest's, and each makes the Sandboxes of that shape.
type Env struct {
	Config  *config.Config
	Runtime *launch.Runtime
	// Runsc is the runsc binary's version and digest, and its helpers' digests, asked of it
	// once (NewEnv): hashing it reads 100 MB. Its module, read from its build info, is added where a manifest is made
	// (runscRecord): a stand-in runsc has none.
	Runsc manifest.Runsc
	// RestoreFlags are passed to every `runsc restore`.
	RestoreFlags []string
	Log          logrus.FieldLogger
	// Progress says what a long run is doing as it goes (nil: nothing).
	Progress *progress.Meter
	// Store is the checkpoint store the config names, written under this run's lease.
	Store *store.Store
	// CleanFailed removes the staging directory of a failed run instead of leaving it.
	CleanFailed bool
	// PassEnvToOutputs passes the config's pass_env values into the sandboxes of a run over an
	// existing output (--pass-env). Off, they get none: nothing records where an output came
	// from, and a pulled one's checkpoints are a stranger's code.
	PassEnvToOutputs bool
	// Analyses finds, measuring nothing, the analysis cache's figures of modules on a rootfs,
	// for the catalogue of a capture whose output holds no analysis.json of its image; nil for
	// none. Every capture (capture, bench --capture) looks them up the same way through it.
	Analyses AnalysisLookup
	// passEnv holds the variables the config passes into every sandbox.
	passEnv []string
	// controls are the CPU baseline's library controls (cpubaseline.Controls): in every
	// sandbox's environment, as a worker puts them into its restore environment.
	controls map[string]string
	// sweep cleans up after runs that are over before this one works.
	sweep sweeper
	// lease is this run's: its sandboxes, scratch directories and pending store entries are
	// named after it, so other runs leave them alone while it lives (package lease).
	lease *lease.Lease
	// tally counts what a capture should make once per set (nil: not counted); a unit test
	// sets it.
	tally *tally
}

// AnalysisLookup returns the analysis cache's figures of the modules names on the sandboxes
// sb, measuring nothing; nil when the cache does not hold them whole.
type AnalysisLookup func(ctx context.Context, sb *Sandboxes, names []string) *analysis.File

// extraEnvOf returns what every sandbox gets besides its base environment: the pass_env
// variables passEnv and the CPU baseline's library controls, nothing else.
func extraEnvOf(passEnv []string, controls map[string]string) []string {
	return append(slices.Clone(passEnv), cpubaseline.Env(controls)...)
}

// baselineFeatures returns the features of cfg's CPU baseline (nil without one).
func baselineFeatures(cfg *config.Config) []string {
	if cfg.CPUBaseline == nil {
		return nil
	}
	return cfg.CPUBaseline.Features
}

// NewEnv checks the runsc binary named by cfg, asking its version once for the run; it
// changes nothing on disk. The rootfs is
// checked by the step that needs it: a capture uses the config's, a run over an existing
// output the manifest's.
func NewEnv(ctx context.Context, cfg *config.Config, log logrus.FieldLogger) (*Env, error) {
	rt := &launch.Runtime{
		Path:           cfg.Runsc.Path,
		Root:           cfg.Runsc.Root,
		Flags:          cfg.Runsc.SandboxFlags(),
		CommandTimeout: cfg.Timeouts.RunscCommand,
		RestoreTimeout: cfg.Timeouts.Restore,
		OutputLimit:    int64(cfg.Limits.SandboxOutput),
	}
	if _, err := os.Stat(rt.Path); err != nil {
		return nil, fmt.Errorf("%w: runsc not found at %s (run `make runsc`): %w", ErrSetup, rt.Path, err)
	}
	version, err := rt.Version(ctx)
	if err != nil {
		return nil, fmt.Errorf("%w: %w", ErrSetup, err)
	}
	_, binary, err := filedigest.Of(rt.Path)
	if err != nil {
		return nil, fmt.Errorf("%w: %w", ErrSetup, err)
	}
	helpers, err := rt.Driver().Helpers()
	if err != nil {
		return nil, fmt.Errorf("%w: %w", ErrSetup, err)
	}
	if missing := slices.DeleteFunc(runsc.HelperNames(), func(name string) bool { return helpers[name] != "" }); len(missing) > 0 {
		dir, _ := rt.Driver().ResolvedHelpersDir()
		log.WithFields(logrus.Fields{"runsc": rt.Path, "missing": strings.Join(missing, ","), "dir": dir}).
			Warn("runsc's helpers are missing: its sandboxes boot without them, which gVisor deprecates (make runsc lays them out)")
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
		Config: cfg, Runtime: rt, Runsc: manifest.Runsc{Version: version, SHA256: binary, Helpers: helpers}, RestoreFlags: slices.Clone(cfg.Runsc.RestoreFlags), Log: log, Store: st,
		passEnv: passEnv, controls: controls, lease: l,
		sweep: sweeper{runtime: rt, lease: l, store: st, rootfs: filepath.Join(config.CacheDir(), "rootfs"), log: log},
	}, nil
}

// Close ends the run: it releases its lease, so its lock files in shared directories go.
// Everything the run named after its lease must be gone by then (a failed run's kept staging
// directory is not named after it).
func (e *Env) Close() error { return e.lease.Release() }

// ResolveRootfs returns the sandbox root the config names: its rootfs, or its image (fetched
// and unpacked once into the cache, verified, within timeouts.registry and the config's
// limits; the executor layered on top, the image's own code run only in sandboxes). A run
// resolves it once and passes it on.
func (e *Env) ResolveRootfs(ctx context.Context) (*Rootfs, error) {
	if e.Config.Image == "" {
		r, err := OpenRootfs(e.Config.Rootfs)
		if err != nil {
			return nil, err
		}
		return r, e.sweep.holdShared() // from now on a prune-rootfs leaves it alone
	}
	fetchCtx, cancel := context.WithTimeoutCause(ctx, e.Config.Timeouts.Registry,
		fmt.Errorf("fetching and unpacking image %s exceeded timeouts.registry (%s)", e.Config.Image, e.Config.Timeouts.Registry))
	defer cancel()
	platform, err := ref.ParsePlatform(e.Config.Platform)
	if err != nil {
		return nil, fmt.Errorf("%w: %w", ErrSetup, err)
	}
	resolved, err := ref.Resolve(fetchCtx, e.Config.Image, e.Config.InsecureRegistries, platform)
	if err != nil {
		return nil, imageError(fetchCtx, e.Config.Image, err)
	}
	img := resolved.Image
	if err := e.sweep.holdShared(); err != nil { // before the rootfs it reuses or makes
		return nil, err
	}
	start := time.Now()
	unpacked, err := unpack.IntoCache(fetchCtx, img, config.CacheDir(), exchange.ImageLimits(e.Config.Limits), e.Log, unpack.LogLayers(e.Log, "unpack"))
	if err != nil {
		return nil, imageError(fetchCtx, e.Config.Image, err)
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
		return nil, imageError(fetchCtx, e.Config.Image, err)
	}
	process, err := imageconfig.Process(cfg.Config, unpacked.Dir)
	if err != nil {
		return nil, fmt.Errorf("%w: image %s: %w", ErrSetup, e.Config.Image, err)
	}
	path, assembled, err := rootfs.Assemble(ctx, rootfs.Options{
		Cache: config.CacheDir(), Base: unpacked.Dir, BaseDigest: unpacked.Content, Image: image, Process: &process,
		Runtime: e.Runtime, Timeout: e.Config.Timeouts.ImageProbe, Log: e.Log,
	})
	if err != nil {
		if errors.Is(err, rootfs.ErrPython) {
			return nil, fmt.Errorf("%w: %w", ErrSetup, err)
		}
		return nil, err
	}
	// Assemble's record is the one it wrote into the rootfs: kept, not read back.
	resolvedPath, err := filepath.EvalSymlinks(path)
	if err != nil {
		return nil, fmt.Errorf("%w: rootfs %s: %w", ErrSetup, path, err)
	}
	info := assembled.RootfsInfo
	return &Rootfs{Rootfs: manifest.Rootfs{Path: resolvedPath, Digest: info.Digest}, Info: &info, Image: image}, nil
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

// Rootfs is a resolved sandbox root: its directory (symlinks resolved: runsc refuses a
// symlinked root) and digest, what it records of itself (its process, its python3), and the
// user's image it was made from (nil for a rootfs directory).
type Rootfs struct {
	manifest.Rootfs
	Info  *manifest.RootfsInfo
	Image *manifest.Image
}

// OpenRootfs resolves a rootfs directory and reads what `make image` or an image's assembly
// recorded in it: its digest, its process, its python3.
func OpenRootfs(path string) (*Rootfs, error) {
	resolved, err := filepath.EvalSymlinks(path)
	if err != nil {
		return nil, fmt.Errorf("%w: rootfs %s: %w (run `make image`)", ErrSetup, path, err)
	}
	info, err := manifest.ReadRootfsInfo(resolved)
	if err != nil {
		return nil, fmt.Errorf("%w: rootfs %s has no readable image.json: %w (run `make image`)", ErrSetup, resolved, err)
	}
	return &Rootfs{Rootfs: manifest.Rootfs{Path: resolved, Digest: info.Digest}, Info: info}, nil
}

// Sandboxes is the shape of a run's sandboxes, made once and not changed after: the runtime
// (runsc's global flags), the rootfs, the variables passed in besides the base environment,
// the restore flags. A capture's is the config's (Env.Sandboxes); a run over an existing
// output's is its manifest's (manifestSandboxes).
type Sandboxes struct {
	Config       *config.Config
	Log          logrus.FieldLogger
	Runtime      *launch.Runtime
	Rootfs       *Rootfs
	RestoreFlags []string
	// extraEnv is what every sandbox gets besides its base environment: pass_env and the CPU
	// baseline's controls, nothing else (extraEnvOf).
	extraEnv []string
	// restore is the restore spec of this shape and its fingerprint, computed once (shape).
	restore struct {
		once        sync.Once
		spec        *specs.Spec
		fingerprint string
		err         error
	}
	tally *tally
}

// Sandboxes returns the config's shape of sandboxes on r.
func (e *Env) Sandboxes(r *Rootfs) *Sandboxes {
	return &Sandboxes{
		Config: e.Config, Log: e.Log, Runtime: e.Runtime, Rootfs: r, RestoreFlags: slices.Clone(e.RestoreFlags),
		extraEnv: extraEnvOf(e.passEnv, e.controls), tally: e.tally,
	}
}

// Offline returns sb's shape with no network (runsc --network=none), whatever the config's
// runsc.network: for a step that runs an image's own code for its figures alone (analyze
// imports every module a corpus names), which needs no network and must not get one. It is sb
// itself when sb has none already (the default), its fingerprint computed once for both.
func (sb *Sandboxes) Offline() *Sandboxes {
	if sb.Runtime.Flags.Network == "none" {
		return sb
	}
	flags := sb.Runtime.Flags
	flags.Network = "none"
	return &Sandboxes{
		Config: sb.Config, Log: sb.Log, Runtime: runtimeWithFlags(sb.Runtime, flags), Rootfs: sb.Rootfs,
		RestoreFlags: slices.Clone(sb.RestoreFlags), extraEnv: slices.Clone(sb.extraEnv), tally: sb.tally,
	}
}

// runtimeWithFlags returns a runtime like rt (its binary, root, lease, limits) whose sandboxes
// get the global flags flags; rt is left as it is.
func runtimeWithFlags(rt *launch.Runtime, flags sandbox.Flags) *launch.Runtime {
	with := *rt
	with.Flags = flags
	return &with
}

// singleCPU returns the host CPU a capture's sandbox of one CPU runs on (none otherwise).
func (sb *Sandboxes) singleCPU() int {
	if sb.Config.Sandbox.CPUs != 1 {
		return 0
	}
	return singleCPU()
}

// SpecFingerprint returns the fingerprint of the spec every sandbox of this shape shares (the
// restore spec's, as the manifest records it): what a measurement of the image depends on
// besides the rootfs and runsc.
func (sb *Sandboxes) SpecFingerprint() (string, error) {
	_, fingerprint, err := sb.shape()
	return fingerprint, err
}

// shape returns the restore spec of this shape and its fingerprint (restoreShape), computed
// the first time only.
func (sb *Sandboxes) shape() (*specs.Spec, string, error) {
	sb.restore.once.Do(func() {
		sb.restore.spec, sb.restore.fingerprint, sb.restore.err = restoreShape(sb.Rootfs.Path, sb.Rootfs.Info.SandboxProcess(), sb.Runtime.Flags, sb.tally)
	})
	return sb.restore.spec, sb.restore.fingerprint, sb.restore.err
}

// Launcher returns a launcher of sandboxes of this shape, each bounded by limit; workDir holds
// their bundles.
func (sb *Sandboxes) Launcher(workDir string, limit time.Duration) launch.Launcher {
	return launch.Launcher{Runtime: sb.Runtime, Rootfs: sb.Rootfs.Path, Process: sb.Rootfs.Info.SandboxProcess(), WorkDir: workDir, Env: slices.Clone(sb.extraEnv), Timeout: limit, Limits: sb.Config.SandboxLimits()}
}

// Restorer returns a restorer of checkpoints of this shape with its restore flags, each
// restore (and, in a smoke test or a timed call, the call after it) bounded by limit:
// timeouts.restore to time restores, timeouts.smoke for a smoke test.
func (sb *Sandboxes) Restorer(workDir string, limit time.Duration) *measure.Restorer {
	return &measure.Restorer{Launcher: sb.Launcher(workDir, limit), Flags: slices.Clone(sb.RestoreFlags)}
}

// CaptureRequest returns the one description of a capture of set: into dir, with this shape's
// rootfs, sandbox environment, the config's CPU baseline, CPU count and timeout, and the given
// checkpoint options.
func (sb *Sandboxes) CaptureRequest(set config.PackageSet, dir, workDir, runscVersion string, options map[string]string) capture.Request {
	return capture.Request{
		ID: set.ID, Imports: set.Imports, Rootfs: sb.Rootfs.Path, Process: sb.Rootfs.Info.SandboxProcess(), Dir: dir, WorkDir: workDir,
		Env: slices.Clone(sb.extraEnv), CheckpointOptions: options, CPUBaseline: baselineFeatures(sb.Config),
		CPUs: sb.Config.Sandbox.CPUs, SingleCPU: sb.singleCPU(),
		Timeout: sb.Config.Timeouts.Capture, RunscVersion: runscVersion, Limits: sb.Config.SandboxLimits(),
	}
}
