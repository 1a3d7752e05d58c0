package run

import (
	"context"
	"fmt"
	"os"

	"readie.dev/pipeline/internal/lease"
)

// Scratch is what a command that starts sandboxes outside a capture needs (analyze, the corpus
// bench): runs that are over are swept from the shared directories first (their sandboxes,
// scratch directories and pending store entries), then a scratch directory named after this
// run's lease is made. cleanup removes it; call it after every sandbox is deleted.
func (e *Env) Scratch(ctx context.Context) (work string, cleanup func(), err error) {
	if err := os.MkdirAll(e.Runtime.Root, 0o700); err != nil {
		return "", nil, fmt.Errorf("%w: runsc root: %w", ErrSetup, err)
	}
	if err := e.sweep.shared(ctx); err != nil {
		return "", nil, err
	}
	return scratchDir(e.lease)
}

// SpecFingerprint is the fingerprint of the spec every sandbox of this environment shares
// (the restore spec's, as the manifest records it): what a measurement of the image depends
// on besides the rootfs and runsc.
func (e *Env) SpecFingerprint() (string, error) {
	_, fingerprint, err := restoreShape(e.Rootfs.Path, e.RootfsInfo.SandboxProcess(), e.Runtime.Flags)
	return fingerprint, err
}

// scratchPrefix names the runs' scratch directories: readie-scratch-RUN-RAND, after the run's
// lease. Pipelines from before leases named theirs rd-PID-RAND; those are never touched here
// (a pid cannot tell whose they are), and theirs never matched this name.
const scratchPrefix = "readie-scratch-"

// scratchDir is a short scratch directory for bundles and sockets (108-byte socket paths),
// named after the lease l (a run's, or a push's) so that a later run can remove it if this one
// is killed.
func scratchDir(l *lease.Lease) (string, func(), error) {
	tmp := os.TempDir()
	if err := l.Hold(tmp); err != nil {
		return "", nil, err
	}
	dir, err := os.MkdirTemp(tmp, scratchPrefix+l.ID()+"-")
	if err != nil {
		return "", nil, err
	}
	return dir, func() { os.RemoveAll(dir) }, nil
}
