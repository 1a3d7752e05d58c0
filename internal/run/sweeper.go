package run

import (
	"context"
	"fmt"
	"os"
	"path/filepath"

	"github.com/sirupsen/logrus"

	"readie.dev/pipeline/internal/lease"
	"readie.dev/pipeline/internal/oci/rootfs"
	"readie.dev/pipeline/internal/oci/unpack"
	"readie.dev/pipeline/internal/orphans"
	"readie.dev/pipeline/internal/outdir"
	"readie.dev/pipeline/internal/scratch"
	"readie.dev/pipeline/internal/store"
	"readie.dev/pipeline/pkg/launch"
)

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
func (s sweeper) lockAndSweep(ctx context.Context, out string) (*outdir.Lock, error) {
	if err := s.holdShared(); err != nil {
		return nil, err
	}
	lock, err := outdir.LockOutput(out)
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
	did, err := outdir.Sweep(out)
	for _, line := range did {
		s.log.Warn(line)
	}
	if err != nil {
		lock.Unlock()
		return nil, err
	}
	pulls, err := outdir.SweepMergePulls(s.lease, out)
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
	dirs, err := s.lease.RemoveDeadDirs(tmp, scratch.Prefix)
	for _, dir := range dirs {
		s.log.WithField("dir", dir).Warn("removed the scratch directory of a run that died")
	}
	if err != nil {
		s.log.WithError(err).Warn("could not remove every scratch directory of runs that died")
	}
	if s.rootfs != "" {
		for _, parent := range []string{s.rootfs, filepath.Join(s.rootfs, rootfs.OCIDir)} {
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
