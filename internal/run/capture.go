package run

import (
	"context"
	"errors"
	"fmt"
	"maps"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"time"

	"github.com/sirupsen/logrus"

	"readie.dev/pipeline/internal/atomicfile"
	"readie.dev/pipeline/internal/config"
	"readie.dev/pipeline/pkg/capture"
	"readie.dev/pipeline/pkg/executorproto"
	"readie.dev/pipeline/pkg/manifest"
	"readie.dev/pipeline/pkg/measure"
	"readie.dev/pipeline/pkg/sandbox"
)

// begin takes the output's lock and cleans up after runs that died: their sandboxes, scratch
// directories and staging directories.
func (e *Env) begin(ctx context.Context, out string) (*Lock, error) {
	if err := os.MkdirAll(e.Runtime.Root, 0o700); err != nil {
		return nil, fmt.Errorf("%w: runsc root: %w", ErrSetup, err)
	}
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
	for _, dir := range removeDeadWorkDirs(os.TempDir()) {
		e.Log.WithField("dir", dir).Warn("removed the scratch directory of a run that died")
	}
	did, err := sweepOutput(out)
	for _, line := range did {
		e.Log.Warn(line)
	}
	if err != nil {
		lock.Unlock()
		return nil, err
	}
	return lock, nil
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
	rootfs, err := OpenRootfs(e.Config.Rootfs)
	if err != nil {
		return nil, err
	}
	e.Rootfs = rootfs
	lock, err := e.begin(ctx, out)
	if err != nil {
		return nil, err
	}
	defer lock.Unlock()
	version, err := e.Runtime.Version(ctx)
	if err != nil {
		return nil, err
	}
	m, err := e.newManifest(version)
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
	m.AlphaMsPerMiB, m.InterceptMs = costModel(m.Checkpoints)
	if err := e.writeRestoreSpec(filepath.Join(staging, manifest.RestoreSpecFileName)); err != nil {
		return fmt.Errorf("write restore spec: %w", err)
	}
	if err := atomicfile.WriteJSON(filepath.Join(staging, manifest.FileName), m); err != nil {
		return fmt.Errorf("write manifest: %w", err)
	}
	return nil
}

func (e *Env) captureSet(ctx context.Context, set config.Set, staging, work, version string) (manifest.Checkpoint, error) {
	log := e.Log.WithField("set", set.ID)
	dir := filepath.Join(staging, set.ID)
	start := time.Now()
	log.WithField("imports", strings.Join(set.Imports, ",")).Info("capture: start")
	meta, err := capture.Run(ctx, e.Runtime, e.CaptureRequest(set, dir, work, version, e.Config.Runsc.CheckpointOptions))
	if err != nil {
		return manifest.Checkpoint{}, err
	}
	log.WithFields(logrus.Fields{"bytes": meta.Bytes(), "took": time.Since(start).Round(time.Millisecond)}).Info("capture: done")

	start = time.Now()
	stats, err := e.Restorer(work).MeasureRuns(ctx, set.ID, dir, e.Config.RestoreRuns)
	if err != nil {
		return manifest.Checkpoint{}, err
	}
	log.WithFields(logrus.Fields{"median_ms": round1(stats.Median), "p90_ms": round1(stats.P90), "runs": e.Config.RestoreRuns, "took": time.Since(start).Round(time.Millisecond)}).Info("measure: done")

	smoke, err := e.Smoker(work).Smoke(ctx, set.ID, dir, set.Imports)
	if err != nil {
		return manifest.Checkpoint{}, err
	}
	log.WithField("ready_ms", round1(smoke.ReadyMS)).Info("smoke: ok")
	return manifest.Checkpoint{
		ID: set.ID, Imports: slices.Clone(meta.Imports), Dir: set.ID, Bytes: meta.Bytes(),
		RestoreMS: stats, Smoke: smoke,
	}, nil
}

// costModel is the manifest's cost model: restore median against image size.
func costModel(cs []manifest.Checkpoint) (alphaMsPerMiB, interceptMs float64) {
	var sizes []int64
	var medians []float64
	for _, c := range cs {
		sizes = append(sizes, c.Bytes)
		medians = append(medians, c.RestoreMS.Median)
	}
	fit := measure.CostModel(sizes, medians)
	return fit.Slope, fit.Intercept
}

func round1(ms float64) float64 { return float64(int64(ms*10+0.5)) / 10 }

func (e *Env) newManifest(version string) (*manifest.Manifest, error) {
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
	options := map[string]string{} // {} rather than null
	maps.Copy(options, e.Config.Runsc.CheckpointOptions)
	return &manifest.Manifest{
		ExecutorProtocol:  executorproto.Version,
		Runsc:             manifest.Runsc{Version: version, Module: module + "@" + moduleVersion, SHA256: binary.SHA256},
		RunscFlags:        e.Runtime.Flags.Args(),
		RestoreFlags:      slices.Clone(e.RestoreFlags),
		CheckpointOptions: options,
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

func (e *Env) writeRestoreSpec(path string) error {
	spec, err := e.restoreSpec()
	if err != nil {
		return err
	}
	return atomicfile.WriteJSON(path, spec)
}

// replaceDir puts staging in place of out: the old output is moved aside first and removed
// only after the new one is in place, so some complete output always exists (a run killed in
// between leaves OUT.old-PID, which the next run puts back: sweepOutput).
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
