package sandboxes

import (
	"crypto/rand"
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"fmt"
	"strings"

	"readie.dev/pipeline/internal/lease"
)

// NewID names a sandbox after its package set, its step and the ID of the run's lease, unique
// per call ("readie-SET-STEP-RUN-RAND"), so `runsc list` says what each sandbox is for and a
// later run can tell the leftovers of a run that is over from the sandboxes of a run still
// going, in any pid namespace (RemoveOrphans). It holds the lease in the runsc root first.
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

// shortSetID is setID, or for a longer one its first characters and 8 hex digits of its
// sha256: still readable in `runsc list`, still distinct.
func shortSetID(setID string) string {
	if len(setID) <= maxSetIDInID {
		return setID
	}
	sum := sha256.Sum256([]byte(setID))
	return setID[:maxSetIDInID-9] + "-" + hex.EncodeToString(sum[:4])
}

// OwnerRun returns the lease ID of the run that a pipeline sandbox ID carries. IDs of
// pipelines from before leases carry a pid there instead, and are not the pipeline's to judge.
func OwnerRun(id string) (string, bool) {
	if !strings.HasPrefix(id, "readie-") {
		return "", false
	}
	parts := strings.Split(id, "-")
	if len(parts) < 5 {
		return "", false
	}
	run := parts[len(parts)-2]
	return run, lease.IsID(run)
}
