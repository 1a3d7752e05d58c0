package run

import (
	"crypto/rand"
	"encoding/hex"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strings"

	"readie.dev/pipeline/internal/lease"
)

// scratchPrefix names the runs' scratch directories: readie-scratch-RUN-RAND, after the run's
// lease. Pipelines from before leases named theirs rd-PID-RAND; those are never touched here
// (a pid cannot tell whose they are), and theirs never matched this name.
const scratchPrefix = "readie-scratch-"

// workDir is a short scratch directory for bundles and sockets (108-byte socket paths), named
// after this run's lease so that a later run can remove it if this one is killed.
func (e *Env) workDir() (string, func(), error) { return scratchDir(e.lease) }

// scratchDir is a scratch directory named after the lease l (a run's, or a push's).
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

// removeDeadWorkDirs removes the scratch directories in tmp of runs that are over, judged by
// their lease, and returns them. Those of live runs, in any pid namespace, and this run's stay.
func removeDeadWorkDirs(tmp string, own *lease.Lease) ([]string, error) {
	dirs, err := filepath.Glob(filepath.Join(tmp, scratchPrefix+"*"))
	if err != nil {
		return nil, err
	}
	claims := map[string]*lease.Claim{}
	var removed []string
	var errs []error
	for _, dir := range dirs {
		id, _, _ := strings.Cut(strings.TrimPrefix(filepath.Base(dir), scratchPrefix), "-")
		if !lease.IsID(id) {
			continue
		}
		claim, seen := claims[id]
		if !seen {
			if claim, err = own.TakeOver(tmp, id); err != nil {
				errs = append(errs, err)
			}
			claims[id] = claim
		}
		if claim == nil {
			continue
		}
		if err := os.RemoveAll(dir); err != nil {
			errs = append(errs, err)
			continue
		}
		removed = append(removed, dir)
	}
	for _, claim := range claims {
		if claim != nil {
			errs = append(errs, claim.Release())
		}
	}
	return removed, errors.Join(errs...)
}

// Names beside an output OUT: OUT.staging-RAND is where a run builds the next output,
// OUT.old-RAND is the previous output while a swap moves it aside, OUT.failed-RAND is the
// staging directory of a failed run, kept for inspection. The first two exist only while a
// run holds OUT.lock exclusively; so a run that holds it finds only leftovers of runs that
// are over under those names, whatever pid namespace or machine they ran in.
const (
	stagingInfix = ".staging-"
	oldInfix     = ".old-"
	failedInfix  = ".failed-"
)

// besideOutput is a new name OUT.INFIX-RAND beside out.
func besideOutput(out, infix string) string {
	var b [6]byte
	rand.Read(b[:])
	return strings.TrimSuffix(out, "/") + infix + hex.EncodeToString(b[:])
}

// newStaging makes a fresh staging directory beside out.
func newStaging(out string) (string, error) {
	staging := besideOutput(out, stagingInfix)
	if err := os.Mkdir(staging, 0o755); err != nil {
		return "", err
	}
	return staging, nil
}

// keepStaging renames a failed run's staging directory so that no later run takes it for a
// leftover (sweepOutput), and returns where it is now. When the rename fails, it stays where
// it is (and the next run removes it).
func keepStaging(out, staging string) string {
	kept := besideOutput(out, failedInfix)
	if err := os.Rename(staging, kept); err != nil {
		return staging
	}
	return kept
}

// sweepOutput cleans up after runs over out that were killed (a run that fails on its own
// cleans up itself); the caller holds out's lock exclusively, so whatever it finds is not in
// use. It removes their staging directories (OUT.staging-*), and puts back a previous output
// that a killed swap left aside (OUT.old-*) when OUT itself is missing, or removes it when OUT
// is there. Kept staging directories of failed runs (OUT.failed-*) stay. It returns what it
// did, one line each, for the log.
func sweepOutput(out string) ([]string, error) {
	out = strings.TrimSuffix(out, "/")
	var did []string
	staging, _ := filepath.Glob(out + stagingInfix + "*")
	for _, dir := range staging {
		if err := os.RemoveAll(dir); err != nil {
			return did, fmt.Errorf("remove the staging directory of a run that died: %w", err)
		}
		did = append(did, "removed the staging directory of a run that died: "+dir)
	}
	old, _ := filepath.Glob(out + oldInfix + "*")
	for _, dir := range old {
		if _, err := os.Lstat(out); os.IsNotExist(err) {
			if err := os.Rename(dir, out); err != nil {
				return did, fmt.Errorf("put back the previous output %s: %w", dir, err)
			}
			did = append(did, "put back the previous output that a run which died had moved aside: "+dir)
			continue
		}
		if err := carryOver(dir, out); err != nil {
			return did, fmt.Errorf("take the history of the output over from %s: %w", dir, err)
		}
		if err := os.RemoveAll(dir); err != nil {
			return did, fmt.Errorf("remove the previous output of a run that died: %w", err)
		}
		did = append(did, "removed the previous output that a run which died had moved aside: "+dir)
	}
	return did, nil
}

// writeOutput writes out the way a capture does, for a step that starts no sandbox (merge,
// pull): out's lock, a sweep of dead runs' leftovers, a staging directory that fill writes,
// and the swap. When fill fails, out is left as it was and staging removed.
func writeOutput(out string, fill func(staging string) error) error {
	if err := checkOutput(out); err != nil {
		return err
	}
	lock, err := LockOutput(out)
	if err != nil {
		return err
	}
	defer lock.Unlock()
	if _, err := sweepOutput(out); err != nil {
		return err
	}
	staging, err := newStaging(out)
	if err != nil {
		return err
	}
	if err := fill(staging); err != nil {
		os.RemoveAll(staging)
		return fmt.Errorf("%w (%s left as it was)", err, out)
	}
	return replaceDir(out, staging)
}
