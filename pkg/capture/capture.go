// Package capture turns one package set into one checkpoint directory: it runs the executor
// in capture mode under runsc, checks the evidence that the checkpoint really happened, and
// writes meta.json beside the image files.
package capture

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"time"

	"readie.dev/pipeline/pkg/manifest"
	"readie.dev/pipeline/pkg/sandbox"
)

// Marker is the line the executor prints just before it triggers the checkpoint.
const Marker = "readie-executor: checkpoint begin"

// ErrCapture wraps every failed capture.
var ErrCapture = errors.New("capture failed")

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
	// Env holds the only variables passed in besides the sandbox's base environment.
	Env []string
	// CheckpointOptions are extra gVisor checkpoint annotations (sandbox.SpecOptions).
	CheckpointOptions map[string]string
	Timeout           time.Duration
	RunscVersion      string
}

// Run captures req and returns the checkpoint's meta.json contents, already written to Dir.
// The sandbox is deleted on every path: success, failure, timeout and cancellation.
func Run(ctx context.Context, rt *sandbox.Runtime, req Request) (*manifest.Meta, error) {
	// fail keeps the cause's chain: a caller can still match a timeout or a runsc error.
	fail := func(cause error) error { return fmt.Errorf("%w: %s: %w", ErrCapture, req.ID, cause) }
	if err := freshDir(req.Dir); err != nil {
		return nil, fail(err)
	}
	hostDir := filepath.Join(req.WorkDir, req.ID+"-cap")
	if err := os.MkdirAll(hostDir, 0o755); err != nil {
		return nil, fail(err)
	}
	spec, err := sandbox.Spec(sandbox.SpecOptions{
		Mode: sandbox.ModeCapture, Rootfs: req.Rootfs, HostDir: hostDir,
		ImageDir: req.Dir, Imports: req.Imports, Env: req.Env, CheckpointOptions: req.CheckpointOptions,
	})
	if err != nil {
		return nil, fail(err)
	}
	fingerprint, err := sandbox.Fingerprint(spec, rt.Flags)
	if err != nil {
		return nil, fail(err)
	}
	sb, err := rt.NewSandbox(SandboxID(req.ID, "capture"), req.WorkDir, hostDir, spec)
	if err != nil {
		return nil, fail(err)
	}

	runCtx, cancel := context.WithTimeoutCause(ctx, req.Timeout,
		fmt.Errorf("capture of %s exceeded its timeout of %s", req.ID, req.Timeout))
	status, runErr := sb.Run(runCtx)
	cancel()
	deleteErr := sb.Delete(ctx)
	stderrTail := sb.Tail(15)
	withTail := func(err error) error {
		if stderrTail == "" {
			return err
		}
		return fmt.Errorf("%w\nexecutor stderr (last lines):\n%s", err, indent(stderrTail))
	}
	if runErr != nil {
		return nil, withTail(fail(runErr))
	}
	if deleteErr != nil {
		return nil, fail(deleteErr)
	}
	if status != 0 {
		return nil, withTail(fail(fmt.Errorf("sandbox exited with status %d", status)))
	}
	// Exit 0 proves nothing: runsc exits 0 after a save whether it succeeded or not.
	stdout, _ := os.ReadFile(sb.Stdout)
	if !strings.Contains(string(stdout), Marker) {
		return nil, withTail(fail(fmt.Errorf("the executor never reached the checkpoint (no %q on its stdout)", Marker)))
	}
	meta := &manifest.Meta{
		ID: req.ID, Imports: append([]string{}, req.Imports...), RunscVersion: req.RunscVersion,
		SpecFingerprint: fingerprint, CreatedAt: time.Now().UTC(), Files: map[string]manifest.File{},
	}
	for _, name := range manifest.ImageFiles() {
		f, err := manifest.HashFile(filepath.Join(req.Dir, name))
		if err != nil {
			return nil, withTail(fail(err))
		}
		if f.Bytes == 0 {
			return nil, withTail(fail(fmt.Errorf("%s is empty: gVisor did not save the checkpoint", name)))
		}
		meta.Files[name] = f
	}
	if err := manifest.WriteJSON(filepath.Join(req.Dir, manifest.MetaFileName), meta); err != nil {
		return nil, fail(fmt.Errorf("write meta.json: %w", err))
	}
	return meta, nil
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

// SandboxID names a sandbox after its package set, its step and the pipeline's pid, unique per
// call, so `runsc list` says what each sandbox is for and a later run can tell the leftovers of
// a run that died from the sandboxes of a run still going (sandbox.OwnerPID).
func SandboxID(setID, step string) string {
	var b [4]byte
	rand.Read(b[:])
	return fmt.Sprintf("readie-%s-%s-%d-%s", setID, step, os.Getpid(), hex.EncodeToString(b[:]))
}

func indent(s string) string { return "  " + strings.ReplaceAll(s, "\n", "\n  ") }
