package outdir

import (
	"crypto/rand"
	"encoding/hex"
	"fmt"
	"os"
	"path/filepath"
	"strings"

	"readie.dev/pipeline/pkg/executorproto"
	"readie.dev/pipeline/pkg/manifest"
)

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

// StagingMarker is the file a staging directory holds until it becomes the output: a sweep
// removes only directories that hold it, never a user's that happens to have such a name.
const StagingMarker = ".readie-staging"

// besideOutput returns a new name OUT.INFIX-RAND beside out (RAND: 12 hex digits).
func besideOutput(out, infix string) string {
	var b [6]byte
	rand.Read(b[:])
	return strings.TrimSuffix(out, "/") + infix + hex.EncodeToString(b[:])
}

// namesBeside returns the directories beside out that besideOutput could have named with infix,
// matched exactly (a glob would take out's own metacharacters and any suffix).
func namesBeside(out, infix string) ([]string, error) {
	out = strings.TrimSuffix(out, "/")
	entries, err := os.ReadDir(filepath.Dir(out))
	if os.IsNotExist(err) {
		return nil, nil
	}
	if err != nil {
		return nil, err
	}
	prefix := filepath.Base(out) + infix
	var found []string
	for _, e := range entries {
		rest, ok := strings.CutPrefix(e.Name(), prefix)
		if ok && e.IsDir() && len(rest) == 12 && strings.Trim(rest, "0123456789abcdef") == "" {
			found = append(found, filepath.Join(filepath.Dir(out), e.Name()))
		}
	}
	return found, nil
}

// newStaging makes a fresh staging directory beside out, marked as one.
func newStaging(out string) (string, error) {
	staging := besideOutput(out, stagingInfix)
	if err := os.Mkdir(staging, 0o755); err != nil {
		return "", err
	}
	if err := os.WriteFile(filepath.Join(staging, StagingMarker), nil, 0o444); err != nil {
		os.RemoveAll(staging)
		return "", err
	}
	return staging, nil
}

// keepStaging renames a failed run's staging directory so that no later run takes it for a
// leftover (Sweep), and returns where it is now. When the rename fails, it stays where
// it is (and the next run removes it).
func keepStaging(out, staging string) string {
	kept := besideOutput(out, failedInfix)
	if err := os.Rename(staging, kept); err != nil {
		return staging
	}
	return kept
}

// Write writes out the way a capture does, for a step that starts no sandbox (merge,
// pull): out's lock, a sweep of dead runs' leftovers, a staging directory that fill writes,
// and the swap (ThroughStaging). When fill fails, out is left as it was and staging removed.
func Write(out string, fill func(staging string) error) error {
	lock, err := lockForWriting(out)
	if err != nil {
		return err
	}
	defer lock.Unlock()
	return ThroughStaging(out, false, fill)
}

// lockForWriting takes out's lock for a step that starts no sandbox and writes into out: it
// refuses a directory that is not an output (Check), takes the lock, and sweeps dead runs'
// leftovers beside it, so that a previous output a killed swap left aside is back in place
// before anything is written.
func lockForWriting(out string) (*Lock, error) {
	if err := Check(out); err != nil {
		return nil, err
	}
	lock, err := LockOutput(out)
	if err != nil {
		return nil, err
	}
	if _, err := Sweep(out); err != nil {
		lock.Unlock()
		return nil, err
	}
	return lock, nil
}

// ThroughStaging writes an output, for a capture, a merge and a pull alike, through a fresh
// staging directory beside out, which fill writes, which is verified as a whole (what
// `verify`, push and workers check), and which then replaces out (replaceDir). When fill fails or the
// result does not verify, out is left as it was and staging removed, or, with keepFailed,
// kept for inspection under a name no sweep takes (keepStaging); the error says which. The
// caller holds out's lock.
func ThroughStaging(out string, keepFailed bool, fill func(staging string) error) error {
	staging, err := newStaging(out)
	if err != nil {
		return err
	}
	err = fill(staging)
	if err == nil {
		if _, verr := manifest.Verify(staging, executorproto.Version); verr != nil {
			err = fmt.Errorf("the new output does not verify, so it is not put in place: %w", verr)
		}
	}
	if err != nil {
		if !keepFailed {
			os.RemoveAll(staging)
			return fmt.Errorf("%w\n(%s left as it was; staging directory removed)", err, out)
		}
		kept := keepStaging(out, staging)
		return fmt.Errorf("%w\n(%s left as it was; staging directory kept for inspection: %s)", err, out, kept)
	}
	return replaceDir(out, staging)
}

// replaceDir puts staging in place of out: the old output is moved aside first and removed
// only after the new one is in place, so some complete output always exists; then what other
// commands keep in the output (carriedOver: the benchmark history, analyze's and plan-sets'
// results) moves over from the old one. A run killed in between leaves OUT.old-ID, which the
// next run puts back when OUT is missing, or takes those entries from (Sweep).
func replaceDir(out, staging string) error {
	if err := os.Remove(filepath.Join(staging, StagingMarker)); err != nil && !os.IsNotExist(err) {
		return err
	}
	old := ""
	if _, err := os.Stat(out); err == nil {
		old = besideOutput(out, oldInfix)
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
	if old == "" {
		return nil
	}
	if err := carryOver(old, out); err != nil {
		return fmt.Errorf("keep %s's history: %w (it is in %s)", out, err, old)
	}
	return os.RemoveAll(old)
}

// WriteFile writes one file of the output directory out (analysis.json, plan.json) with
// write, under the output's lock so that no capture replaces out meanwhile; out is made when
// missing. A capture carries these files over into the output it makes (carriedOver).
func WriteFile(out, name string, write func(path string) error) error {
	lock, err := lockForWriting(out)
	if err != nil {
		return err
	}
	defer lock.Unlock()
	if err := os.MkdirAll(out, 0o755); err != nil {
		return err
	}
	return write(filepath.Join(out, name))
}
