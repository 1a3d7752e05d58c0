package launch

import (
	"crypto/rand"
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"fmt"
	"path/filepath"

	"readie.dev/pipeline/pkg/checkpointid"
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

// ErrID reports a sandbox ID, or a part of one, that cannot name a sandbox: an ID becomes the
// names of its bundle, its host directory and its logs, and runsc's name for the container, so
// it must be a plain name (checkpointid.Plain) of bounded length.
var ErrID = errors.New("invalid sandbox id")

const (
	// MaxIDLen bounds a sandbox ID: the longest NewID makes (74 bytes) fits, and runsc's
	// control socket for it (/var/run/runsc-ID.sock when ROOT/runsc-ID.sock is too long) still
	// fits in a Unix socket address (107 bytes).
	MaxIDLen = 80
	// maxStepLen and maxLeaseIDLen bound the step's and the lease ID's parts of an ID.
	maxStepLen    = 16
	maxLeaseIDLen = 16
)

// CheckID refuses an ID that is not a plain name of 1 to MaxIDLen bytes, naming it.
func CheckID(id string) error {
	if len(id) > MaxIDLen || !checkpointid.Plain(id) {
		return fmt.Errorf("%w %.100q: want 1 to %d ASCII letters, digits, - and _", ErrID, id, MaxIDLen)
	}
	return nil
}

// NewID returns a fresh sandbox ID that names the sandbox's package set, its step and the ID
// of the runtime's lease, unique per call ("readie-SET-STEP-LEASE-RAND"), so `runsc list` says
// what each sandbox is for and a later run can tell the leftovers of an owner that is gone
// from the sandboxes of one still going, in any pid namespace (the pipeline's orphan sweep
// reads the lease back from the ID). It holds the lease in the runsc root first, once the
// parts are checked (IDPrefix).
func (r *Runtime) NewID(setID, step string) (string, error) {
	prefix, err := r.IDPrefix(setID, step)
	if err != nil {
		return "", err
	}
	if err := r.Lease.Hold(r.Root); err != nil {
		return "", err
	}
	var b [4]byte
	rand.Read(b[:])
	return prefix + hex.EncodeToString(b[:]), nil
}

// IDPrefix returns how every ID NewID gives setID's step begins, before its random part: the
// names of that step's bundles in a work directory start with it. setID must be a checkpoint
// id, step and the lease's ID plain names of at most 16 bytes: the error names the part that
// is not.
func (r *Runtime) IDPrefix(setID, step string) (string, error) {
	if r.Lease == nil {
		return "", errors.New("sandbox: a runtime that creates sandboxes needs the run's lease")
	}
	if err := checkIDParts(setID, step, "lease ID", r.Lease.ID()); err != nil {
		return "", err
	}
	return fmt.Sprintf("readie-%s-%s-%s-", shortSetID(setID), step, r.Lease.ID()), nil
}

// checkIDParts refuses the parts of an ID: setID must be a checkpoint id, step and the owner's
// part (a lease ID, a prefix: named by ownerName) plain names of at most 16 bytes. The error
// names the part that is not.
func checkIDParts(setID, step, ownerName, owner string) error {
	if err := checkpointid.Check(setID); err != nil {
		return fmt.Errorf("%w: set: %w", ErrID, err)
	}
	if len(step) > maxStepLen || !checkpointid.Plain(step) {
		return fmt.Errorf("%w: step %.100q: want 1 to %d ASCII letters, digits, - and _", ErrID, step, maxStepLen)
	}
	if len(owner) > maxLeaseIDLen || !checkpointid.Plain(owner) {
		return fmt.Errorf("%w: %s %.100q: want 1 to %d ASCII letters, digits, - and _", ErrID, ownerName, owner, maxLeaseIDLen)
	}
	return nil
}

// IDs names sandboxes: a fresh ID per call for a sandbox of the set setID (a checkpoint id, or
// a name such as "pool") at step (a short plain name: "restore", "smoke", ...). Every ID is
// checked (CheckID) before it reaches a path or runsc, whichever policy made it. Two policies
// come with the kit: a *Runtime's NewID, bound to its owner's lease (the pipeline's, which its
// orphan sweep reads back), and RandomIDs (a worker's, in a runsc root of its own).
type IDs interface {
	NewID(setID, step string) (string, error)
}

// RandomIDs names a worker's sandboxes "PREFIX-SET-STEP-RAND" (RAND 8 random hex digits), for
// a runsc root the worker has to itself: nothing there judges its sandboxes by a lease. The
// prefix is a plain name of at most 16 bytes ("worker").
type RandomIDs struct {
	Prefix string
}

// NewID returns a fresh ID, or an error naming the part (prefix, set, step) that cannot be
// one.
func (r RandomIDs) NewID(setID, step string) (string, error) {
	if err := checkIDParts(setID, step, "prefix", r.Prefix); err != nil {
		return "", err
	}
	var b [4]byte
	rand.Read(b[:])
	id := fmt.Sprintf("%s-%s-%s-%s", r.Prefix, shortSetID(setID), step, hex.EncodeToString(b[:]))
	return id, CheckID(id)
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
// whatever the set's id. An id CheckID refuses is refused, and so is one of hostDirLen bytes
// or fewer: its host directory would be its bundle (workDir/id), whose config and logs the
// sandbox could then write.
func HostDir(workDir, id string) (string, error) {
	if err := CheckID(id); err != nil {
		return "", err
	}
	if len(id) <= hostDirLen {
		return "", fmt.Errorf("%w %q: a sandbox with a host directory needs an id longer than %d bytes (its random suffix names the directory)", ErrID, id, hostDirLen)
	}
	return filepath.Join(workDir, id[len(id)-hostDirLen:]), nil
}

// hostDirLen is how many of an ID's last bytes (NewID's random part) name its host directory.
const hostDirLen = 8
