package launch

import (
	"crypto/rand"
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"fmt"
	"path/filepath"
)

// Lease is what a runtime needs of its owner's lease (the pipeline's internal/lease.Lease is
// one): an ID that the IDs of its sandboxes carry, and a hold on the runsc root that tells
// anyone sweeping the root that the owner still lives. The pipeline's orphan sweep judges
// every "readie-" sandbox of a runsc root it shares by internal/lease's flocks: a runtime that
// shares a root with the pipeline must use such a lease, or a root of its own, or its live
// sandboxes may be taken for leftovers.
type Lease interface {
	ID() string
	Hold(dir string) error
}

// NewID returns a fresh sandbox ID that names the sandbox's package set, its step and the ID
// of the runtime's lease, unique per call ("readie-SET-STEP-LEASE-RAND"), so `runsc list` says
// what each sandbox is for and a later run can tell the leftovers of an owner that is gone
// from the sandboxes of one still going, in any pid namespace (the pipeline's orphan sweep
// reads the lease back from the ID). It holds the lease in the runsc root first.
func (r *Runtime) NewID(setID, step string) (string, error) {
	if r.Lease == nil {
		return "", errors.New("sandbox: a runtime that creates sandboxes needs the run's lease")
	}
	if err := r.Lease.Hold(r.Root); err != nil {
		return "", err
	}
	var b [4]byte
	rand.Read(b[:])
	return fmt.Sprintf("readie-%s-%s-%s-%s", shortSetID(setID), step, r.Lease.ID(), hex.EncodeToString(b[:])), nil
}

// maxSetIDInID bounds the set's part of a sandbox ID: runsc binds its control socket at
// ROOT/runsc-ID.sock (then /var/run, /run, /tmp), and a Unix socket path holds at most 107
// bytes, so a set id of 64 characters made sandboxes that runsc could not create ("unable to
// find location to write socket file").
const maxSetIDInID = 24

// shortSetID returns setID, or for a longer one its first characters and 8 hex digits of its
// sha256: still readable in `runsc list`, still distinct.
func shortSetID(setID string) string {
	if len(setID) <= maxSetIDInID {
		return setID
	}
	sum := sha256.Sum256([]byte(setID))
	return setID[:maxSetIDInID-9] + "-" + hex.EncodeToString(sum[:4])
}

// HostDir returns the host directory under workDir of the sandbox named id: named by the
// ID's random suffix, not its set, so the executor's socket path stays short (108 bytes)
// whatever the set's id.
func HostDir(workDir, id string) string {
	return filepath.Join(workDir, id[max(0, len(id)-8):])
}
