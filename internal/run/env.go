// Package run is one pipeline run over an output directory: every package set captured,
// measured and smoke-tested into a staging directory beside the output, the manifest written,
// and the output replaced only when everything passed; or a run over an output that a capture
// already made, restored exactly as its manifest records.
package run

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"time"

	specs "github.com/opencontainers/runtime-spec/specs-go"
	"github.com/sirupsen/logrus"

	"readie.dev/pipeline/internal/filedigest"
	"readie.dev/pipeline/internal/oci"

	"readie.dev/pipeline/internal/config"
	"readie.dev/pipeline/internal/lease"
	"readie.dev/pipeline/internal/sandboxes"
	"readie.dev/pipeline/pkg/capture"
	"readie.dev/pipeline/pkg/manifest"
	"readie.dev/pipeline/pkg/measure"
	"readie.dev/pipeline/pkg/sandbox"
)

// ErrSetup reports a missing prerequisite or bad input (exit code 2); anything else that
// fails a run is a pipeline failure (exit code 1).
var ErrSetup = errors.New("setup")

// RestoreSpecHostDir stands for the per-sandbox host directory in the restore spec that
// the manifest ships: a worker replaces it (and the environment and root.path), nothing else.
const RestoreSpecHostDir = "/run/readie/sandboxes/SANDBOX_ID"

// ImageInfoPath is where `make image` records the rootfs digest inside the rootfs.
const ImageInfoPath = "usr/lib/readie/image.json"

// Env is what every subcommand needs: the config, a runtime, the image and the restore flags.
// A run over an existing output uses a copy shaped by that output's manifest (forManifest).
type Env struct {
	Config  *config.Config
	Runtime *sandboxes.Runtime
	// RunscSHA256 is the digest of the runsc binary, hashed once per run (it is 100 MB).
	RunscSHA256 string
	// Rootfs is the image sandboxes run; set by Capture from the config, or from the manifest
	// for a run over an existing output.
	Rootfs manifest.Rootfs
	// Image names the user's image Rootfs was made from, if it was.
	Image *manifest.Image
	// RestoreFlags are passed to every `runsc restore`.
	RestoreFlags []string
	Log          logrus.FieldLogger
	// CleanFailed removes the staging directory of a failed run instead of leaving it.
	CleanFailed bool
	// sandboxEnv holds the variables the config passes into every sandbox, and nothing else.
	sandboxEnv []string
	// lease is this run's: its sandboxes, scratch directories and pending store entries are
	// named after it, so other runs leave them alone while it lives (package lease).
	lease *lease.Lease
}

// NewEnv checks the runsc binary named by cfg; it changes nothing on disk. The rootfs is
// checked by the step that needs it: a capture uses the config's, a run over an existing
// output the manifest's.
func NewEnv(ctx context.Context, cfg *config.Config, log logrus.FieldLogger) (*Env, error) {
	rt := &sandboxes.Runtime{
		Path: cfg.Runsc.Path,
		Root: cfg.Runsc.Root,
		Flags: sandbox.Flags{
			Network: cfg.Runsc.Network, Overlay: cfg.Runsc.Overlay, HostUDS: cfg.Runsc.HostUDS,
			Extra: slices.Clone(cfg.Runsc.GlobalFlags),
		},
		CommandTimeout: cfg.Timeouts.RunscCommand,
	}
	if err := rt.Check(ctx); err != nil {
		return nil, fmt.Errorf("%w: %w", ErrSetup, err)
	}
	_, binary, err := filedigest.Of(rt.Path)
	if err != nil {
		return nil, fmt.Errorf("%w: %w", ErrSetup, err)
	}
	var env []string
	for _, name := range cfg.PassEnv {
		if value, ok := os.LookupEnv(name); ok {
			env = append(env, name+"="+value)
		}
	}
	l, err := lease.New()
	if err != nil {
		return nil, err
	}
	rt.Lease = l
	return &Env{Config: cfg, Runtime: rt, RunscSHA256: binary, RestoreFlags: slices.Clone(cfg.Runsc.RestoreFlags), Log: log, sandboxEnv: env, lease: l}, nil
}

// Close ends the run: it releases its lease, so its lock files in shared directories go.
// Everything the run named after its lease must be gone by then (a failed run's kept staging
// directory is not named after it).
func (e *Env) Close() error { return e.lease.Release() }

// PrepareRootfs sets e.Rootfs to the sandbox root the config names: its rootfs, or its image
// (unpacked once into the cache, with the executor layered on top).
func (e *Env) PrepareRootfs(ctx context.Context) error {
	if e.Config.Image == "" {
		rootfs, err := OpenRootfs(e.Config.Rootfs)
		e.Rootfs = rootfs
		return err
	}
	img, err := oci.OpenImage(ctx, e.Config.Image, e.Config.InsecureRegistries)
	if err != nil {
		return fmt.Errorf("%w: image %s: %w", ErrSetup, e.Config.Image, err)
	}
	digest, err := img.Digest()
	if err != nil {
		return err
	}
	start := time.Now()
	base, unpacked, err := oci.UnpackOnce(img, config.CacheDir(), oci.LogLayers(e.Log, "unpack"))
	if err != nil {
		return fmt.Errorf("%w: image %s: %w", ErrSetup, e.Config.Image, err)
	}
	if unpacked {
		e.Log.WithFields(logrus.Fields{"image": digest.String(), "took": time.Since(start).Round(time.Millisecond)}).Info("unpack: done")
	}
	content, err := oci.ContentDigest(img)
	if err != nil {
		return err
	}
	ref := &oci.ImageRef{Ref: e.Config.Image, Digest: digest.String()}
	path, _, err := oci.Assemble(ctx, config.CacheDir(), base, content, ref)
	if err != nil {
		if errors.Is(err, oci.ErrPython) {
			return fmt.Errorf("%w: %w", ErrSetup, err)
		}
		return err
	}
	rootfs, err := OpenRootfs(path)
	if err != nil {
		return err
	}
	e.Rootfs, e.Image = rootfs, &manifest.Image{Ref: ref.Ref, Digest: ref.Digest}
	return nil
}

// OpenRootfs resolves a rootfs directory (runsc refuses a symlinked root) and reads the digest
// that `make image` recorded in it.
func OpenRootfs(path string) (manifest.Rootfs, error) {
	resolved, err := filepath.EvalSymlinks(path)
	if err != nil {
		return manifest.Rootfs{}, fmt.Errorf("%w: rootfs %s: %w (run `make image`)", ErrSetup, path, err)
	}
	var image struct {
		Digest string `json:"digest"`
	}
	data, err := os.ReadFile(filepath.Join(resolved, ImageInfoPath))
	if err == nil {
		err = json.Unmarshal(data, &image)
	}
	if err == nil && image.Digest == "" {
		err = errors.New("no digest")
	}
	if err != nil {
		return manifest.Rootfs{}, fmt.Errorf("%w: rootfs %s has no readable image.json: %w (run `make image`)", ErrSetup, resolved, err)
	}
	return manifest.Rootfs{Path: resolved, Digest: image.Digest}, nil
}

// Launcher starts sandboxes of this environment's shape, each bounded by limit; workDir
// holds their bundles.
func (e *Env) Launcher(workDir string, limit time.Duration) sandboxes.Launcher {
	return sandboxes.Launcher{Runtime: e.Runtime, Rootfs: e.Rootfs.Path, WorkDir: workDir, Env: e.sandboxEnv, Timeout: limit}
}

// Restorer restores checkpoints of this environment with its restore flags, each restore
// bounded by timeouts.restore.
func (e *Env) Restorer(workDir string) *measure.Restorer {
	return &measure.Restorer{Launcher: e.Launcher(workDir, e.Config.Timeouts.Restore), Flags: slices.Clone(e.RestoreFlags)}
}

// Smoker is Restorer bounded by timeouts.smoke (a restore plus a call).
func (e *Env) Smoker(workDir string) *measure.Restorer {
	return &measure.Restorer{Launcher: e.Launcher(workDir, e.Config.Timeouts.Smoke), Flags: slices.Clone(e.RestoreFlags)}
}

// CaptureRequest is the one place a capture of set is described: into dir, with this
// environment's rootfs, sandbox environment and timeout, and the given checkpoint options.
func (e *Env) CaptureRequest(set config.Set, dir, workDir, runscVersion string, options map[string]string) capture.Request {
	return capture.Request{
		ID: set.ID, Imports: set.Imports, Rootfs: e.Rootfs.Path, Dir: dir, WorkDir: workDir,
		Env: e.sandboxEnv, CheckpointOptions: options,
		Timeout: e.Config.Timeouts.Capture, RunscVersion: runscVersion,
	}
}

// restoreSpec is the spec a worker restores with: sandbox mode, no checkpoint annotations.
func (e *Env) restoreSpec() (*specs.Spec, error) {
	return sandbox.Spec(sandbox.SpecOptions{Mode: sandbox.ModeSandbox, Rootfs: e.Rootfs.Path, HostDir: RestoreSpecHostDir})
}
