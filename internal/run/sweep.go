package run

import (
	"context"
	"fmt"
	"os"
	"path/filepath"
	"strings"

	"github.com/sirupsen/logrus"

	"readie.dev/pipeline/internal/lease"
	"readie.dev/pipeline/internal/oci/unpack"
	"readie.dev/pipeline/internal/orphans"
	"readie.dev/pipeline/internal/store"
	"readie.dev/pipeline/pkg/launch"
	"readie.dev/pipeline/pkg/manifest"
)

// sweepOutput cleans up after runs over out that were killed (a run that fails on its own
// cleans up itself); the caller holds out's lock exclusively, so whatever it finds is not in
// use. It removes their staging directories (OUT.staging-RAND holding the staging marker), and
// puts back a previous output that a killed swap left aside (OUT.old-RAND, an output of the
// pipeline) when OUT itself is missing, or removes it when OUT is there; then the temporary
// files killed writers left in OUT (sweepTemporaries). Kept staging
// directories of failed runs (OUT.failed-*) stay, and so does anything else of such a name: it
// is said, not touched. It returns what it did, one line each, for the log.
func sweepOutput(out string) ([]string, error) {
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
	if _, err := os.Lstat(filepath.Join(dir, stagingMarker)); err == nil {
		return true
	}
	_, err := os.Lstat(filepath.Join(dir, manifest.FileName))
	return err == nil && isOutput(dir)
}

// isOutput reports whether dir holds only what the pipeline writes into an output (CheckOutput),
// and something: a previous output may hold only analyze's and plan-sets' files.
func isOutput(dir string) bool {
	entries, err := os.ReadDir(dir)
	return err == nil && len(entries) > 0 && CheckOutput(dir) == nil
}

// sweeper cleans up after runs that are over, in the directories runs share (the runsc root,
// the scratch directory, the store) and beside an output; lease is this run's.
type sweeper struct {
	runtime *launch.Runtime
	lease   *lease.Lease
	store   *store.Store
	// rootfs is the cache's rootfs/ directory, where runs make rootfs directories and unpack
	// images (unpack.Once); "" for none.
	rootfs string
	log    logrus.FieldLogger
}

// lockAndSweep takes the output's lock and cleans up after runs that are over: their
// sandboxes, scratch directories, pending store entries and the lease files they left in those
// shared directories (judged by lease, in any pid namespace), and their staging directories.
func (s sweeper) lockAndSweep(ctx context.Context, out string) (*Lock, error) {
	if err := s.holdShared(); err != nil {
		return nil, err
	}
	lock, err := LockOutput(out)
	if err != nil {
		return nil, err
	}
	if lock.Stale != 0 {
		s.log.WithField("pid", lock.Stale).Warn("took over the lock of a run that died")
	}
	if err := s.shared(ctx); err != nil {
		lock.Unlock()
		return nil, err
	}
	did, err := sweepOutput(out)
	for _, line := range did {
		s.log.Warn(line)
	}
	if err != nil {
		lock.Unlock()
		return nil, err
	}
	pulls, err := sweepMergePulls(s.lease, out)
	for _, dir := range pulls {
		s.log.WithField("dir", dir).Warn("removed the pulled sources of a merge that died")
	}
	if err != nil {
		s.log.WithError(err).Warn("could not remove every pulled source of merges that died")
	}
	return lock, nil
}

// holdShared takes the run's lease in the directories it uses (the runsc root, the store)
// before it uses anything there, a rootfs included: a prune of the store or of the rootfs
// directories sees it even while it only reuses (lease.NoneLive).
func (s sweeper) holdShared() error {
	if err := os.MkdirAll(s.runtime.Root, 0o700); err != nil {
		return fmt.Errorf("%w: runsc root: %w", ErrSetup, err)
	}
	for _, dir := range []string{s.runtime.Root, s.store.Dir} {
		if err := s.lease.Hold(dir); err != nil {
			return fmt.Errorf("%w: %w", ErrSetup, err)
		}
	}
	return nil
}

// shared removes what runs that are over left in the directories runs share (the runsc root,
// the scratch directory, the store, the rootfs cache), and logs each removal. A sandbox that cannot be deleted fails the run; a scratch or store directory that
// cannot be removed is logged and left for the next run.
func (s sweeper) shared(ctx context.Context) error {
	removed, err := orphans.Remove(ctx, s.runtime, s.lease)
	for _, o := range removed {
		log := s.log.WithFields(logrus.Fields{"sandbox": o.ID, "run": o.Run})
		if o.Note != "" {
			log = log.WithField("note", o.Note)
		}
		log.Warn("removed a sandbox left by a run that died")
	}
	if err != nil {
		return err
	}
	// Only now: an orphan's bind mount may have pointed into its scratch directory.
	tmp := os.TempDir()
	dirs, err := s.lease.RemoveDeadDirs(tmp, scratchPrefix)
	for _, dir := range dirs {
		s.log.WithField("dir", dir).Warn("removed the scratch directory of a run that died")
	}
	if err != nil {
		s.log.WithError(err).Warn("could not remove every scratch directory of runs that died")
	}
	if s.rootfs != "" {
		for _, parent := range []string{s.rootfs, filepath.Join(s.rootfs, ociDir)} {
			dirs, err := unpack.RemoveDead(parent)
			for _, dir := range dirs {
				s.log.WithField("dir", dir).Warn("removed what a run that died making a rootfs or unpacking an image left")
			}
			if err != nil {
				s.log.WithError(err).Warn("could not remove everything runs that died left in the rootfs cache")
			}
		}
	}
	dirs, err = s.store.RemoveDeadPending()
	for _, dir := range dirs {
		s.log.WithField("dir", dir).Warn("removed a store entry that a run which died was writing")
	}
	if err != nil {
		s.log.WithError(err).Warn("could not remove every store entry that runs which died were writing")
	}
	for _, dir := range []string{s.runtime.Root, tmp, s.store.Dir} {
		runs, err := s.lease.RemoveDeadLocks(dir)
		for _, run := range runs {
			s.log.WithFields(logrus.Fields{"dir": dir, "run": run}).Debug("removed the lease lock file of a run that died")
		}
		if err != nil {
			s.log.WithError(err).Warn("could not remove every lease lock file of runs that died")
		}
	}
	return nil
}
