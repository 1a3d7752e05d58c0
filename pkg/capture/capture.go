// Package capture turns one package set into one checkpoint directory: it runs the executor
// in capture mode under runsc, checks the evidence that the checkpoint really happened, and
// writes meta.json beside the image files.
//
// Run captures a Request in a sandbox of a pkg/launch Runtime (its IDs, logs and deletion);
// Marker is the executor's line that says it reached the checkpoint; every failure matches
// ErrCapture.
package capture

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"maps"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"time"

	specs "github.com/opencontainers/runtime-spec/specs-go"

	"readie.dev/pipeline/pkg/atomicfile"
	"readie.dev/pipeline/pkg/catalogue"
	"readie.dev/pipeline/pkg/executorproto"
	"readie.dev/pipeline/pkg/exitcode"
	"readie.dev/pipeline/pkg/filedigest"
	"readie.dev/pipeline/pkg/launch"
	"readie.dev/pipeline/pkg/manifest"
	"readie.dev/pipeline/pkg/sandbox"
)

// Marker is the line the executor prints just before it triggers the checkpoint.
const Marker = "readie-executor: checkpoint begin"

// CPUCheckPrefix starts the line on which the executor reports its CPU check (one JSON object,
// manifest.CPUCheck), before Marker, when a capture has a CPU baseline.
const CPUCheckPrefix = "readie-executor: cpu-check "

// PackagesPrefix starts the line on which the executor reports the distributions it holds
// loaded after its imports (readie_executor/packages.py), before Marker.
const PackagesPrefix = "readie-executor: packages "

// CPUBaselineEnv tells the executor the baseline to check against (gVisor names, commas).
const CPUBaselineEnv = "READIE_CPU_BASELINE"

// ErrCapture wraps every failed capture.
var ErrCapture = errors.New("capture failed")

// ErrSpecMismatch reports a capture whose spec is not of the shape the caller restores with
// (Request.SpecFingerprint).
var ErrSpecMismatch = errors.New("capture spec mismatch")

// Request is one package set to capture.
type Request struct {
	ID      string
	Imports []string
	Rootfs  string
	// Dir is the checkpoint directory; it must not exist yet or be empty.
	Dir string
	// WorkDir holds the sandbox's bundle and host directory; keep its path short (a Unix
	// socket path must fit in 108 bytes).
	WorkDir string
	// Process is the image's environment, cwd and user (sandbox.SpecOptions).
	Process sandbox.Process
	// Env holds the only variables passed in besides the sandbox's base environment.
	Env []string
	// CheckpointOptions are extra gVisor checkpoint annotations (sandbox.SpecOptions).
	CheckpointOptions map[string]string
	// CPUBaseline, when not nil, are the only CPU features the sandbox is given, and the
	// executor checks from inside it, after its imports, what its code can see of the CPU
	// against them: the result is the meta's CPUCheck. Env should hold the library controls.
	CPUBaseline  []string
	Timeout      time.Duration
	RunscVersion string
	// SpecFingerprint, when not "", is the fingerprint the caller expects of the capture's
	// spec under rt's flags (the pipeline's, of its restore spec, once per run): a capture
	// whose spec has another is refused, not recorded under the expected one. meta.json
	// always records the fingerprint of the spec the capture ran.
	SpecFingerprint string
}

// Run captures req and returns the checkpoint's meta.json contents, already written to Dir.
// The sandbox is deleted on every path: success, failure, timeout and cancellation.
func Run(ctx context.Context, rt *launch.Runtime, req Request) (*manifest.Meta, error) {
	meta, err := Take(ctx, rt, req)
	if err != nil {
		return nil, err
	}
	if err := atomicfile.WriteJSON(filepath.Join(req.Dir, manifest.MetaFileName), meta); err != nil {
		return nil, req.fail(fmt.Errorf("write meta.json: %w", err))
	}
	return meta, nil
}

// Take captures req as Run does and returns the checkpoint's meta.json contents without
// writing them: for a caller that completes the meta and writes it once itself (the
// pipeline's store).
func Take(ctx context.Context, rt *launch.Runtime, req Request) (*manifest.Meta, error) {
	sb, fingerprint, err := newSandbox(rt, req)
	if err != nil {
		return nil, req.fail(err)
	}
	runCtx, cancel := context.WithTimeoutCause(ctx, req.Timeout,
		fmt.Errorf("capture of %s exceeded its timeout of %s", req.ID, req.Timeout))
	_, runErr := sb.Run(runCtx) // a non-zero status comes as an error that exitcode.Of reads
	timedOut := runCtx.Err() != nil
	cancel()
	deleteErr := sb.Delete(ctx)
	stderrTail := sb.Tail(15)
	withTail := func(err error) error {
		if stderrTail == "" {
			return err
		}
		return fmt.Errorf("%w\nexecutor stderr (last lines):\n%s", err, indent(stderrTail))
	}
	status, exited := exitcode.Of(runErr)
	switch {
	case runErr != nil && !timedOut && exited:
		// runsc run exits with the executor's own status: say what it means. A failed delete
		// goes with it: a sandbox left behind is always reported.
		meaning := executorproto.ExitMeaning(status)
		if meaning != "" {
			meaning = " (" + meaning + ")"
		}
		return nil, errors.Join(withTail(req.fail(fmt.Errorf("the executor exited with status %d%s: %w", status, meaning, runErr))), deleteErr)
	case runErr != nil:
		return nil, errors.Join(withTail(req.fail(runErr)), deleteErr)
	case deleteErr != nil:
		return nil, req.fail(deleteErr)
	}
	// Exit 0 proves nothing: runsc exits 0 after a save whether it succeeded or not.
	stdout, _ := os.ReadFile(sb.Stdout)
	if !strings.Contains(string(stdout), Marker) {
		return nil, withTail(req.fail(fmt.Errorf("the executor never reached the checkpoint (no %q on its stdout)", Marker)))
	}
	meta, err := req.evidence(stdout, fingerprint)
	if err != nil {
		return nil, withTail(req.fail(err))
	}
	return meta, nil
}

// fail wraps cause as req's failed capture, keeping the cause's chain: a caller can still match
// a timeout or a runsc error.
func (req Request) fail(cause error) error {
	return fmt.Errorf("%w: %s: %w", ErrCapture, req.ID, cause)
}

// newSandbox prepares the capture sandbox of req (not started) in a fresh image directory,
// and the fingerprint of its spec (req's when given). Only a capture of the expected shape
// touches the disk: the spec is checked before the sandbox's bundle or the image directory is
// made.
func newSandbox(rt *launch.Runtime, req Request) (*launch.Sandbox, string, error) {
	env := req.Env
	if req.CPUBaseline != nil {
		env = append(slices.Clone(env), CPUBaselineEnv+"="+strings.Join(req.CPUBaseline, ","))
	}
	var fingerprint string
	specFor := func(hostDir string) (*specs.Spec, error) {
		spec, err := sandbox.Spec(sandbox.SpecOptions{
			Mode: sandbox.ModeCapture, Rootfs: req.Rootfs, HostDir: hostDir, ImageDir: req.Dir, Imports: req.Imports,
			Process: req.Process, Env: env, CheckpointOptions: req.CheckpointOptions, CPUFeatures: req.CPUBaseline,
		})
		if err != nil {
			return nil, err
		}
		if fingerprint, err = sandbox.Fingerprint(spec, rt.Flags); err != nil {
			return nil, err
		}
		if req.SpecFingerprint != "" && req.SpecFingerprint != fingerprint {
			return nil, fmt.Errorf("%w: the capture's spec has fingerprint %s, the run's restore spec %s: a checkpoint of this shape would not restore as the manifest says", ErrSpecMismatch, fingerprint, req.SpecFingerprint)
		}
		return spec, freshDir(req.Dir)
	}
	// Its logs stay in the work directory: a failed set keeps them (the pipeline's run).
	sb, err := launch.NewSandbox(launch.SandboxOptions{Runtime: rt, WorkDir: req.WorkDir, Spec: specFor, KeepLogs: true}, req.ID, "capture")
	return sb, fingerprint, err
}

// evidence returns the meta.json of a capture whose executor reached the checkpoint: its CPU check
// (with a baseline) from stdout, and every image file's size and digest, none of them empty.
func (req Request) evidence(stdout []byte, fingerprint string) (*manifest.Meta, error) {
	meta := &manifest.Meta{
		ID: req.ID, Imports: append([]string{}, req.Imports...), RunscVersion: req.RunscVersion,
		SpecFingerprint: fingerprint, CapturedAt: time.Now().UTC(), Files: map[string]manifest.File{},
	}
	if req.CPUBaseline != nil {
		var err error
		if meta.CPUCheck, err = cpuCheck(stdout); err != nil {
			return nil, err
		}
	}
	var err error
	if meta.Packages, meta.UnmappedModules, err = loadedPackages(stdout); err != nil {
		return nil, err
	}
	for _, name := range manifest.ImageFiles() {
		size, sum, err := filedigest.Of(filepath.Join(req.Dir, name))
		if err != nil {
			return nil, err
		}
		if size == 0 {
			return nil, fmt.Errorf("%s is empty: gVisor did not save the checkpoint", name)
		}
		meta.Files[name] = manifest.File{Bytes: size, SHA256: sum}
	}
	return meta, nil
}

// executorLine is the rest of the executor's line that starts with prefix: the last such line
// before Marker. The image's preimports run, and may print, before the executor's reports;
// the executor prints them last, just before Marker.
func executorLine(stdout []byte, prefix string) (string, bool) {
	var report string
	found := false
	for line := range strings.Lines(string(stdout)) {
		line = strings.TrimSpace(line)
		if strings.HasPrefix(line, Marker) {
			break
		}
		if r, ok := strings.CutPrefix(line, prefix); ok {
			report, found = r, true
		}
	}
	return report, found
}

// cpuCheck reads the executor's CPU check from its stdout.
func cpuCheck(stdout []byte) (*manifest.CPUCheck, error) {
	report, ok := executorLine(stdout, CPUCheckPrefix)
	if !ok {
		return nil, fmt.Errorf("the executor reported no CPU check (no %q on its stdout before %q): does the image's executor predate it?", strings.TrimSpace(CPUCheckPrefix), Marker)
	}
	var check manifest.CPUCheck
	if err := json.Unmarshal([]byte(report), &check); err != nil || check.Verdict == "" {
		return nil, fmt.Errorf("the executor's CPU check is not readable: %.200q (%v)", report, err)
	}
	return &check, nil
}

// loadedPackages reads the executor's packages report from its stdout: the distributions the
// checkpoint holds loaded, and the top-level modules it holds that no distribution's metadata
// names (unmapped, sorted; nil for none). A distribution it could not read the version of is
// an error: a router would take the checkpoint for one that holds no such distribution.
func loadedPackages(stdout []byte) (map[string]string, []string, error) {
	report, ok := executorLine(stdout, PackagesPrefix)
	if !ok {
		return nil, nil, fmt.Errorf("the executor reported no packages (no %q on its stdout before %q): does the image's executor predate it?", strings.TrimSpace(PackagesPrefix), Marker)
	}
	var r struct {
		Packages map[string]string `json:"packages"`
		Errors   map[string]string `json:"errors"`
		Unmapped []string          `json:"unmapped"`
		Error    string            `json:"error"`
	}
	if err := json.Unmarshal([]byte(report), &r); err != nil {
		return nil, nil, fmt.Errorf("the executor's packages report is not readable: %.200q (%v)", report, err)
	}
	// The image's python wrote what follows: quoted and cut short.
	if r.Error != "" {
		return nil, nil, fmt.Errorf("the executor could not read the loaded packages: %.300q", r.Error)
	}
	if len(r.Errors) > 0 {
		names := slices.Sorted(maps.Keys(r.Errors))
		return nil, nil, fmt.Errorf("the executor could not read the versions of %d loaded distributions, %.100q first: %.300q", len(names), names[0], r.Errors[names[0]])
	}
	if err := catalogue.CheckPackages(r.Packages); err != nil {
		// Cut short: the image's metadata gave the names.
		return nil, nil, fmt.Errorf("the executor's packages report: %.600v", err)
	}
	if err := catalogue.CheckUnmapped(r.Unmapped); err != nil {
		// Cut short: the image's python gave the names.
		return nil, nil, fmt.Errorf("the executor's packages report: unmapped modules: %.300v", err)
	}
	if r.Packages == nil {
		r.Packages = map[string]string{}
	}
	var unmapped []string
	if len(r.Unmapped) > 0 {
		unmapped = slices.Sorted(slices.Values(r.Unmapped))
	}
	return r.Packages, unmapped, nil
}

// freshDir makes dir, which must be absent or empty: runsc refuses to save over image files.
func freshDir(dir string) error {
	entries, err := os.ReadDir(dir)
	switch {
	case errors.Is(err, os.ErrNotExist):
		return os.MkdirAll(dir, 0o755)
	case err != nil:
		return err
	case len(entries) > 0:
		return fmt.Errorf("checkpoint directory %s is not empty", dir)
	}
	return nil
}

func indent(s string) string { return "  " + strings.ReplaceAll(s, "\n", "\n  ") }
