// Package run is one pipeline run over an output directory: every package set captured,
// measured and smoke-tested into a staging directory beside the output, the manifest written,
// and the output replaced only when everything passed.
package run

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"maps"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"time"

	specs "github.com/opencontainers/runtime-spec/specs-go"
	"github.com/sirupsen/logrus"

	"readie.dev/pipeline/pkg/capture"
	"readie.dev/pipeline/pkg/config"
	"readie.dev/pipeline/pkg/executorproto"
	"readie.dev/pipeline/pkg/manifest"
	"readie.dev/pipeline/pkg/measure"
	"readie.dev/pipeline/pkg/sandbox"
)

// ErrSetup reports a missing prerequisite or bad input (exit code 2); anything else that
// fails a run is a pipeline failure (exit code 1).
var ErrSetup = errors.New("setup")

// RestoreSpecHostDir stands for the per-sandbox host directory in the restore spec that
// the manifest ships: a worker replaces it (and the environment), nothing else.
const RestoreSpecHostDir = "/run/readie/sandboxes/SANDBOX_ID"

// Env is what every subcommand needs: the config, a runtime and the image.
type Env struct {
	Config  *config.Config
	Runtime *sandbox.Runtime
	Rootfs  manifest.Rootfs
	Log     logrus.FieldLogger
	// CleanFailed removes the staging directory of a failed run instead of leaving it.
	CleanFailed bool
	// sandboxEnv holds the variables the config passes into every sandbox, and nothing else.
	sandboxEnv []string
}

// NewEnv checks the prerequisites named by cfg: a working runsc and a built rootfs.
func NewEnv(ctx context.Context, cfg *config.Config, log logrus.FieldLogger) (*Env, error) {
	rt := &sandbox.Runtime{
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
	rootfs, err := filepath.EvalSymlinks(cfg.Rootfs)
	if err != nil {
		return nil, fmt.Errorf("%w: rootfs %s: %w (run `make image`)", ErrSetup, cfg.Rootfs, err)
	}
	var image struct {
		Digest string `json:"digest"`
	}
	data, err := os.ReadFile(filepath.Join(rootfs, "usr/lib/readie/image.json"))
	if err == nil {
		err = json.Unmarshal(data, &image)
	}
	if err != nil {
		return nil, fmt.Errorf("%w: rootfs %s has no readable image.json: %w (run `make image`)", ErrSetup, rootfs, err)
	}
	if err := os.MkdirAll(cfg.Runsc.Root, 0o700); err != nil {
		return nil, fmt.Errorf("%w: runsc root: %w", ErrSetup, err)
	}
	var env []string
	for _, name := range cfg.PassEnv {
		if value, ok := os.LookupEnv(name); ok {
			env = append(env, name+"="+value)
		}
	}
	return &Env{Config: cfg, Runtime: rt, Rootfs: manifest.Rootfs{Path: rootfs, Digest: image.Digest}, Log: log, sandboxEnv: env}, nil
}

// begin takes the output's lock and removes the sandboxes that runs which died left behind.
func (e *Env) begin(ctx context.Context, out string) (*Lock, error) {
	lock, err := LockOutput(out)
	if err != nil {
		return nil, err
	}
	if lock.Stale != 0 {
		e.Log.WithField("pid", lock.Stale).Warn("took over the lock of a run that died")
	}
	removed, err := e.Runtime.RemoveOrphans(ctx)
	for _, id := range removed {
		e.Log.WithField("sandbox", id).Warn("removed a sandbox left by a run that died")
	}
	if err != nil {
		lock.Unlock()
		return nil, err
	}
	// Only now: an orphan's bind mount may have pointed into its scratch directory.
	for _, dir := range removeDeadWorkDirs() {
		e.Log.WithField("dir", dir).Warn("removed the scratch directory of a run that died")
	}
	return lock, nil
}

func (e *Env) restorer(workDir string) *measure.Restorer {
	return &measure.Restorer{
		Runtime: e.Runtime, Rootfs: e.Rootfs.Path, WorkDir: workDir, Env: e.sandboxEnv,
		Flags: e.Config.Runsc.RestoreFlags, Timeout: e.Config.Timeouts.Restore,
	}
}

func (e *Env) smoker(workDir string) *measure.Restorer {
	r := e.restorer(workDir)
	r.Timeout = e.Config.Timeouts.Smoke
	return r
}

// workDir is a short scratch directory for bundles and sockets (108-byte socket paths), named
// after this process so that a later run can remove it if this one is killed.
func workDir() (string, func(), error) {
	dir, err := os.MkdirTemp("", fmt.Sprintf("rd-%d-", os.Getpid()))
	if err != nil {
		return "", nil, err
	}
	return dir, func() { os.RemoveAll(dir) }, nil
}

// removeDeadWorkDirs removes the scratch directories of runs whose process is gone.
func removeDeadWorkDirs() []string {
	dirs, _ := filepath.Glob(filepath.Join(os.TempDir(), "rd-*-*"))
	var removed []string
	for _, dir := range dirs {
		pid, err := strconv.Atoi(strings.Split(filepath.Base(dir), "-")[1])
		if err != nil || pid <= 0 || sandbox.ProcessAlive(pid) {
			continue
		}
		if os.RemoveAll(dir) == nil {
			removed = append(removed, dir)
		}
	}
	return removed
}

// checkOutput refuses an output path that exists and is not a directory.
func checkOutput(out string) error {
	fi, err := os.Stat(out)
	if err == nil && !fi.IsDir() {
		return fmt.Errorf("%w: output %s exists and is not a directory", ErrSetup, out)
	}
	if err != nil && !errors.Is(err, os.ErrNotExist) {
		return fmt.Errorf("%w: output %s: %w", ErrSetup, out, err)
	}
	return nil
}

// Capture runs every set into a staging directory beside out, writes the manifest there, and
// replaces out with it only when every set passed. On failure the staging directory is left
// for inspection and the error names it; out is untouched.
func (e *Env) Capture(ctx context.Context, out string, sets []config.Set) (*manifest.Manifest, error) {
	if err := checkOutput(out); err != nil {
		return nil, err
	}
	lock, err := e.begin(ctx, out)
	if err != nil {
		return nil, err
	}
	defer lock.Unlock()
	version, err := e.Runtime.Version(ctx)
	if err != nil {
		return nil, err
	}
	m, err := e.newManifest(ctx, version)
	if err != nil {
		return nil, err
	}
	work, cleanup, err := workDir()
	if err != nil {
		return nil, err
	}
	defer cleanup()
	// Made last, so that every failure from here on can name it or remove it.
	staging := fmt.Sprintf("%s.staging-%d", strings.TrimSuffix(out, "/"), os.Getpid())
	if err := os.RemoveAll(staging); err != nil {
		return nil, err
	}
	if err := os.MkdirAll(staging, 0o755); err != nil {
		return nil, err
	}
	if err := e.captureInto(ctx, m, staging, work, version, sets); err != nil {
		if e.CleanFailed {
			os.RemoveAll(staging)
			return nil, fmt.Errorf("%w\n(%s left as it was; staging directory removed)", err, out)
		}
		return nil, fmt.Errorf("%w\n(%s left as it was; staging directory kept for inspection: %s)", err, out, staging)
	}
	if err := replaceDir(out, staging); err != nil {
		return nil, err
	}
	return m, nil
}

func (e *Env) captureInto(ctx context.Context, m *manifest.Manifest, staging, work, version string, sets []config.Set) error {
	for _, set := range sets {
		c, err := e.captureSet(ctx, set, staging, work, version)
		if err != nil {
			return err
		}
		m.Checkpoints = append(m.Checkpoints, c)
	}
	m.AlphaMsPerMiB, m.InterceptMs = CostModel(m.Checkpoints)
	if err := e.writeRestoreSpec(filepath.Join(staging, manifest.RestoreSpecFileName)); err != nil {
		return fmt.Errorf("write restore spec: %w", err)
	}
	if err := manifest.WriteJSON(filepath.Join(staging, manifest.FileName), m); err != nil {
		return fmt.Errorf("write manifest: %w", err)
	}
	return nil
}

func (e *Env) captureSet(ctx context.Context, set config.Set, staging, work, version string) (manifest.Checkpoint, error) {
	log := e.Log.WithField("set", set.ID)
	dir := filepath.Join(staging, set.ID)
	start := time.Now()
	log.WithField("imports", strings.Join(set.Imports, ",")).Info("capture: start")
	meta, err := capture.Run(ctx, e.Runtime, capture.Request{
		ID: set.ID, Imports: set.Imports, Rootfs: e.Rootfs.Path, Dir: dir, WorkDir: work,
		Env: e.sandboxEnv, CheckpointOptions: e.Config.Runsc.CheckpointOptions,
		Timeout: e.Config.Timeouts.Capture, RunscVersion: version,
	})
	if err != nil {
		return manifest.Checkpoint{}, err
	}
	log.WithFields(logrus.Fields{"bytes": meta.Bytes(), "took": time.Since(start).Round(time.Millisecond)}).Info("capture: done")

	start = time.Now()
	stats, err := e.restorer(work).MeasureRuns(ctx, set.ID, dir, e.Config.RestoreRuns)
	if err != nil {
		return manifest.Checkpoint{}, err
	}
	log.WithFields(logrus.Fields{"median_ms": round1(stats.Median), "p90_ms": round1(stats.P90), "runs": e.Config.RestoreRuns, "took": time.Since(start).Round(time.Millisecond)}).Info("measure: done")

	smoke, err := e.smoker(work).Smoke(ctx, set.ID, dir, set.Imports)
	if err != nil {
		return manifest.Checkpoint{}, err
	}
	log.WithField("ready_ms", round1(smoke.ReadyMS)).Info("smoke: ok")
	return manifest.Checkpoint{
		ID: set.ID, Imports: slices.Clone(meta.Imports), Dir: set.ID, Bytes: meta.Bytes(),
		RestoreMS: stats, Smoke: smoke,
	}, nil
}

// checkpointOptions are the capture annotations a manifest records: {} rather than null.
func checkpointOptions(cfg *config.Config) map[string]string {
	opts := map[string]string{}
	maps.Copy(opts, cfg.Runsc.CheckpointOptions)
	return opts
}

// CostModel fits restore median against image size over the checkpoints (ms per MiB, ms).
func CostModel(cs []manifest.Checkpoint) (alpha, intercept float64) {
	var sizes, medians []float64
	for _, c := range cs {
		sizes = append(sizes, float64(c.Bytes)/(1<<20))
		medians = append(medians, c.RestoreMS.Median)
	}
	fit := measure.LeastSquares(sizes, medians)
	return fit.Slope, fit.Intercept
}

func round1(ms float64) float64 { return float64(int64(ms*10+0.5)) / 10 }

func (e *Env) newManifest(ctx context.Context, version string) (*manifest.Manifest, error) {
	spec, err := e.restoreSpec()
	if err != nil {
		return nil, err
	}
	fingerprint, err := sandbox.Fingerprint(spec, e.Runtime.Flags)
	if err != nil {
		return nil, err
	}
	module, moduleVersion, err := e.Runtime.Module()
	if err != nil {
		return nil, err
	}
	binary, err := manifest.HashFile(e.Runtime.Path)
	if err != nil {
		return nil, err
	}
	return &manifest.Manifest{
		ExecutorProtocol:  executorproto.Version,
		Runsc:             manifest.Runsc{Version: version, Module: module + "@" + moduleVersion, SHA256: binary.SHA256},
		RunscFlags:        e.Runtime.Flags.Args(),
		RestoreFlags:      slices.Clone(e.Config.Runsc.RestoreFlags),
		CheckpointOptions: checkpointOptions(e.Config),
		SpecFingerprint:   fingerprint,
		ExecutorArgv:      sandbox.ExecutorArgs(),
		PythonPath:        sandbox.PythonPath,
		Overlay:           e.Runtime.Flags.Overlay,
		Network:           e.Runtime.Flags.Network,
		RootReadonly:      spec.Root.Readonly,
		Rootfs:            e.Rootfs,
		CreatedAt:         time.Now().UTC(),
		Spec:              manifest.RestoreSpecFileName,
		Checkpoints:       []manifest.Checkpoint{},
	}, nil
}

func (e *Env) restoreSpec() (*specs.Spec, error) {
	return sandbox.Spec(sandbox.SpecOptions{Mode: sandbox.ModeSandbox, Rootfs: e.Rootfs.Path, HostDir: RestoreSpecHostDir})
}

func (e *Env) writeRestoreSpec(path string) error {
	spec, err := e.restoreSpec()
	if err != nil {
		return err
	}
	return manifest.WriteJSON(path, spec)
}

// replaceDir puts staging in place of out: the old output is moved aside first and removed
// only after the new one is in place, so some complete output always exists.
func replaceDir(out, staging string) error {
	old := ""
	if _, err := os.Stat(out); err == nil {
		old = fmt.Sprintf("%s.old-%d", strings.TrimSuffix(out, "/"), os.Getpid())
		os.RemoveAll(old)
		if err := os.Rename(out, old); err != nil {
			return fmt.Errorf("move the previous output aside: %w", err)
		}
	}
	if err := os.Rename(staging, out); err != nil {
		if old != "" {
			os.Rename(old, out)
		}
		return fmt.Errorf("put the new output in place: %w (it is in %s)", err, staging)
	}
	if old != "" {
		return os.RemoveAll(old)
	}
	return nil
}

// existingRun is a run over an output directory that a capture already made.
type existingRun struct {
	manifest *manifest.Manifest
	picked   []*manifest.Checkpoint // the checkpoints selected by --only (all when empty)
	work     string                 // scratch directory for bundles and sockets
}

// onExisting takes out's lock, removes orphaned sandboxes, loads the manifest, checks its
// protocol and the --only selection, and runs f with a scratch directory.
func (e *Env) onExisting(ctx context.Context, out string, only []string, f func(*existingRun) error) (*manifest.Manifest, error) {
	lock, err := e.begin(ctx, out)
	if err != nil {
		return nil, err
	}
	defer lock.Unlock()
	m, err := manifest.Load(filepath.Join(out, manifest.FileName))
	if err != nil {
		return nil, fmt.Errorf("%w: %w (run `pipeline capture` first)", ErrSetup, err)
	}
	if err := m.CheckProtocol(executorproto.Version); err != nil {
		return nil, fmt.Errorf("%w: %w", ErrSetup, err)
	}
	r := &existingRun{manifest: m}
	for i := range m.Checkpoints {
		if len(only) == 0 || slices.Contains(only, m.Checkpoints[i].ID) {
			r.picked = append(r.picked, &m.Checkpoints[i])
		}
	}
	if len(r.picked) == 0 {
		return nil, fmt.Errorf("%w: no checkpoint of %s matches %v", ErrSetup, out, only)
	}
	work, cleanup, err := workDir()
	if err != nil {
		return nil, err
	}
	defer cleanup()
	r.work = work
	return m, f(r)
}

// Measure re-times the restores of checkpoints already in out and rewrites the manifest.
func (e *Env) Measure(ctx context.Context, out string, only []string) (*manifest.Manifest, error) {
	return e.onExisting(ctx, out, only, func(r *existingRun) error {
		for _, c := range r.picked {
			stats, err := e.restorer(r.work).MeasureRuns(ctx, c.ID, filepath.Join(out, c.Dir), e.Config.RestoreRuns)
			if err != nil {
				return err
			}
			e.Log.WithFields(logrus.Fields{"set": c.ID, "median_ms": round1(stats.Median), "p90_ms": round1(stats.P90)}).Info("measure: done")
			c.RestoreMS = stats
		}
		r.manifest.AlphaMsPerMiB, r.manifest.InterceptMs = CostModel(r.manifest.Checkpoints)
		return manifest.WriteJSON(filepath.Join(out, manifest.FileName), r.manifest)
	})
}

// Smoke smoke-tests checkpoints already in out and rewrites the manifest.
func (e *Env) Smoke(ctx context.Context, out string, only []string) (*manifest.Manifest, error) {
	return e.onExisting(ctx, out, only, func(r *existingRun) error {
		for _, c := range r.picked {
			smoke, err := e.smoker(r.work).Smoke(ctx, c.ID, filepath.Join(out, c.Dir), c.Imports)
			if err != nil {
				return err
			}
			e.Log.WithFields(logrus.Fields{"set": c.ID, "ready_ms": round1(smoke.ReadyMS)}).Info("smoke: ok")
			c.Smoke = smoke
		}
		return manifest.WriteJSON(filepath.Join(out, manifest.FileName), r.manifest)
	})
}
