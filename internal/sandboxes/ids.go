package sandboxes

import (
	"crypto/rand"
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
	return fmt.Sprintf("readie-%s-%s-%s-%s", setID, step, r.Lease.ID(), hex.EncodeToString(b[:])), nil
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
