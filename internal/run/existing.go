package run

import (
	"context"
	"fmt"
	"path/filepath"
	"slices"

	"github.com/sirupsen/logrus"

	"readie.dev/pipeline/internal/outcatalogue"
	"readie.dev/pipeline/internal/outdir"
	"readie.dev/pipeline/internal/scratch"
	"readie.dev/pipeline/pkg/executorproto"
	"readie.dev/pipeline/pkg/launch"
	"readie.dev/pipeline/pkg/manifest"
	"readie.dev/pipeline/pkg/sandbox"
)

// VerifiedOutput is an output directory that a capture made, locked and verified, for a run
// over it (measure, smoke, bench): WithVerifiedOutput makes it.
type VerifiedOutput struct {
	// Sandboxes restore exactly as the manifest records: its runsc flags, restore flags,
	// rootfs and CPU controls.
	Sandboxes *Sandboxes
	Out       string
	Manifest  *manifest.Manifest
	Picked    []*manifest.Checkpoint // the checkpoints selected by --only (all when empty)
	Work      string                 // scratch directory for bundles and sockets
	// Output is the output opened as a worker opens it (launch.NewOutput, on the manifest
	// loaded here, with the manifest's rootfs): what restores through the kit's one restore
	// path (the soak) take.
	Output *launch.Output
}

// Dir returns the checkpoint directory of c.
func (x *VerifiedOutput) Dir(c *manifest.Checkpoint) string { return filepath.Join(x.Out, c.Dir) }

// WithVerifiedOutput takes out's lock, cleans up after runs that died, loads the manifest,
// checks its protocol, verifies every file (as push does), that this runsc, the manifest's
// rootfs and the spec they make are the ones it records, and the --only selection, and runs f
// with a scratch directory.
func (e *Env) WithVerifiedOutput(ctx context.Context, out string, only []string, f func(*VerifiedOutput) error) (*manifest.Manifest, error) {
	lock, err := e.sweep.lockAndSweep(ctx, out)
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
	sb, err := manifestSandboxes(e, m)
	if err != nil {
		return nil, err
	}
	// Every byte is checked before anything is restored or rewritten: a checkpoint that
	// changed since its capture must not be timed, smoke-tested or marked ok.
	if _, err := manifest.Verify(out, executorproto.Version); err != nil {
		return nil, fmt.Errorf("%s does not verify, so it is neither restored nor changed: %w", out, err)
	}
	opened, err := launch.NewOutput(out, m, launch.OpenOptions{Rootfs: sb.Rootfs.Path})
	if err != nil {
		return nil, fmt.Errorf("%w: %w", ErrSetup, err)
	}
	x := &VerifiedOutput{Sandboxes: sb, Out: out, Manifest: m, Output: opened}
	for i := range m.Checkpoints {
		if len(only) == 0 || slices.Contains(only, m.Checkpoints[i].ID) {
			x.Picked = append(x.Picked, &m.Checkpoints[i])
		}
	}
	if len(x.Picked) == 0 {
		return nil, fmt.Errorf("%w: no checkpoint of %s matches %v", ErrSetup, out, only)
	}
	work, cleanup, err := scratch.Dir(e.lease)
	if err != nil {
		return nil, err
	}
	defer cleanup()
	x.Work = work
	return m, f(x)
}

// mismatch names a field whose value on hand differs from the manifest's.
func mismatch(field, onHand, recorded string) error {
	return fmt.Errorf("%w: %s differs: %s on hand, %s in the manifest (capture again, or use the runsc and rootfs the output was made with)", ErrSetup, field, onHand, recorded)
}

// manifestSandboxes returns the sandboxes that restore the way m's checkpoints were made:
// m's runsc and restore flags, m's rootfs and m's CPU controls, with e's runsc binary. It
// refuses a runsc binary, a rootfs or a spec shape that differs from what m records.
func manifestSandboxes(e *Env, m *manifest.Manifest) (*Sandboxes, error) {
	if e.Runsc.SHA256 != m.Runsc.SHA256 {
		return nil, mismatch("runsc.sha256 ("+e.Runtime.Path+")", e.Runsc.SHA256, m.Runsc.SHA256)
	}
	if m.Runsc.Helpers != nil && e.Runsc.HelpersText() != m.Runsc.HelpersText() {
		return nil, mismatch("runsc.helpers ("+e.Runtime.Path+")", e.Runsc.HelpersText(), m.Runsc.HelpersText())
	}
	flags, err := m.Flags()
	if err != nil {
		return nil, fmt.Errorf("%w: manifest runsc_flags: %w", ErrSetup, err)
	}
	if err := sandbox.CheckRestoreFlags(m.RestoreFlags); err != nil {
		return nil, fmt.Errorf("%w: manifest restore_flags: %w", ErrSetup, err)
	}
	r, err := OpenRootfs(m.Rootfs.Path)
	if err != nil {
		return nil, err
	}
	if r.Digest != m.Rootfs.Digest {
		return nil, mismatch("rootfs.digest ("+m.Rootfs.Path+")", r.Digest, m.Rootfs.Digest)
	}
	var controls map[string]string
	if m.CPU != nil {
		controls = m.CPU.Controls // restored as a worker is told to: with the capture's controls
	}
	passEnv := e.passEnv
	if !e.PassEnvToOutputs {
		passEnv = nil
		if len(e.passEnv) > 0 {
			e.Log.Info("pass_env: not passed into the sandboxes of an existing output (--pass-env passes them)")
		}
	}
	sb := &Sandboxes{
		Config: e.Config, Log: e.Log, Runtime: runtimeWithFlags(e.Runtime, flags), Rootfs: r, RestoreFlags: slices.Clone(m.RestoreFlags),
		extraEnv: extraEnvOf(passEnv, controls), tally: e.tally,
	}
	// Through the once-cache: what asks for the fingerprint later gets this one.
	fingerprint, err := sb.SpecFingerprint()
	if err != nil {
		return nil, err
	}
	if fingerprint != m.SpecFingerprint {
		return nil, mismatch("spec_fingerprint", fingerprint, m.SpecFingerprint)
	}
	return sb, nil
}

// driver is the Driver that restores x's checkpoints as its manifest records.
func (x *VerifiedOutput) driver() Driver {
	return runscDriver{sandboxes: x.Sandboxes, work: x.Work, runscVersion: x.Manifest.Runsc.Version, fingerprint: x.Manifest.SpecFingerprint}
}

// Measure times again the restores of checkpoints already in out and rewrites the manifest.
func (e *Env) Measure(ctx context.Context, out string, only []string) (*manifest.Manifest, error) {
	return e.WithVerifiedOutput(ctx, out, only, func(x *VerifiedOutput) error {
		return remeasure(ctx, x.driver(), x, e.Config.RestoreRuns, e.Log)
	})
}

// remeasure times the restores of x's picked checkpoints through d, runs each, and rewrites
// x's manifest and catalogue (its restore medians changed).
func remeasure(ctx context.Context, d Driver, x *VerifiedOutput, runs int, log logrus.FieldLogger) error {
	for _, c := range x.Picked {
		stats, err := d.Measure(ctx, c.ID, x.Dir(c), runs)
		if err != nil {
			return err
		}
		log.WithFields(logrus.Fields{"set": c.ID, "median_ms": round1(stats.Median), "p90_ms": round1(stats.P90)}).Info("measure: done")
		c.RestoreMS = stats
		c.MeasuredWith = &manifest.Measured{Runs: runs, RestoreFlags: append([]string{}, x.Sandboxes.RestoreFlags...)}
	}
	x.Manifest.AlphaMsPerMiB, x.Manifest.InterceptMs = outcatalogue.CostModel(x.Manifest.Checkpoints)
	if err := outdir.WriteJSON(filepath.Join(x.Out, manifest.FileName), x.Manifest); err != nil {
		return err
	}
	return outcatalogue.Rebuild(x.Out, x.Manifest)
}

// Smoke smoke-tests checkpoints already in out and rewrites the manifest.
func (e *Env) Smoke(ctx context.Context, out string, only []string) (*manifest.Manifest, error) {
	return e.WithVerifiedOutput(ctx, out, only, func(x *VerifiedOutput) error {
		d := x.driver()
		for _, c := range x.Picked {
			smoke, err := d.Smoke(ctx, c.ID, x.Dir(c), c.Imports)
			if err != nil {
				return err
			}
			e.Log.WithFields(logrus.Fields{"set": c.ID, "ready_ms": round1(smoke.ReadyMS)}).Info("smoke: ok")
			c.Smoke = smoke
		}
		return outdir.WriteJSON(filepath.Join(x.Out, manifest.FileName), x.Manifest)
	})
}
