package outdir

import (
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strings"

	"readie.dev/pipeline/internal/lease"
	"readie.dev/pipeline/pkg/manifest"
)

// Sweep cleans up after runs over out that were killed (a run that fails on its own
// cleans up itself); the caller holds out's lock exclusively, so whatever it finds is not in
// use. It removes their staging directories (OUT.staging-RAND holding the staging marker), and
// puts back a previous output that a killed swap left aside (OUT.old-RAND, an output of the
// pipeline) when OUT itself is missing, or removes it when OUT is there; then the temporary
// files killed writers left in OUT (sweepTemporaries). Kept staging
// directories of failed runs (OUT.failed-*) stay, and so does anything else of such a name: it
// is said, not touched. It returns what it did, one line each, for the log.
func Sweep(out string) ([]string, error) {
	out = strings.TrimSuffix(out, "/")
	var did []string
	staging, err := namesBeside(out, stagingInfix)
	if err != nil {
		return nil, err
	}
	for _, dir := range staging {
		if !isStaging(dir) {
			did = append(did, "left alone "+dir+": named like a staging directory, but not one of the pipeline's")
			continue
		}
		if err := os.RemoveAll(dir); err != nil {
			return did, fmt.Errorf("remove the staging directory of a run that died: %w", err)
		}
		did = append(did, "removed the staging directory of a run that died: "+dir)
	}
	old, err := namesBeside(out, oldInfix)
	if err != nil {
		return did, err
	}
	for _, dir := range old {
		if !isOutput(dir) {
			did = append(did, "left alone "+dir+": named like a previous output, but not an output of the pipeline")
			continue
		}
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
	// Last: a previous output put back may hold some too.
	removed, err := sweepTemporaries(out)
	return append(did, removed...), err
}

// isStaging reports whether dir is a staging directory the pipeline made: it holds the
// staging marker, or (a run killed in its swap, after the marker went) it is a whole output.
func isStaging(dir string) bool {
	if _, err := os.Lstat(filepath.Join(dir, StagingMarker)); err == nil {
		return true
	}
	_, err := os.Lstat(filepath.Join(dir, manifest.FileName))
	return err == nil && isOutput(dir)
}

// isOutput reports whether dir holds only what the pipeline writes into an output (Check),
// and something: a previous output may hold only analyze's and plan-sets' files.
func isOutput(dir string) bool {
	entries, err := os.ReadDir(dir)
	return err == nil && len(entries) > 0 && Check(dir) == nil
}

// MergePullPrefix names the directory a merge pulls its image sources into, beside the output:
// .merge-pull-RUN-RAND, after the merge's lease, so that a later merge (or capture) beside it
// removes it when the merge that made it died (SweepMergePulls).
const MergePullPrefix = ".merge-pull-"

// SweepMergePulls removes, beside out, the pull directories of merges that are over (judged by
// their lease, l being this process's) and those merges' lock files there; it returns the
// directories removed.
func SweepMergePulls(l *lease.Lease, out string) ([]string, error) {
	parent := filepath.Dir(strings.TrimSuffix(out, "/"))
	removed, err := l.RemoveDeadDirs(parent, MergePullPrefix)
	_, lockErr := l.RemoveDeadLocks(parent)
	return removed, errors.Join(err, lockErr)
}
