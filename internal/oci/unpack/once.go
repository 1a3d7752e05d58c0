package unpack

import (
	"context"
	"errors"
	"fmt"
	"io/fs"
	"os"
	"path/filepath"
	"strings"
	"syscall"
	"time"

	"github.com/sirupsen/logrus"
)

// Once makes the directory parent/name once, for every run that shares the cache (other
// processes, other pid namespaces, other machines on a shared file system): when complete(dir)
// says it is there, it is returned as it is. Otherwise Once takes an flock on
// parent/.name.lock, waiting (bounded by ctx) while another run holds it, and builds it:
// build fills a private directory, which is renamed into place. The kernel drops the lock of a
// run that dies however it dies, so whoever holds it knows that every other directory of this
// name (.tmp-name-*, or a name that complete shows incomplete) is a dead run's leftover; Once
// removes them and logs each. complete returns an error when it cannot tell (an I/O error):
// Once then stops with it, and removes nothing that other runs may be using. It returns the
// directory and whether this call made it.
func Once(ctx context.Context, parent, name string, complete func(dir string) (bool, error), build func(tmp string) error, log logrus.FieldLogger) (string, bool, error) {
	final := filepath.Join(parent, name)
	if ok, err := complete(final); ok || err != nil {
		return final, false, err
	}
	if err := os.MkdirAll(parent, 0o755); err != nil {
		return "", false, err
	}
	lock, err := lockWait(ctx, parent, name, log)
	if err != nil {
		return "", false, err
	}
	defer lock.Close()
	if ok, err := complete(final); ok || err != nil {
		return final, false, err
	}
	leftovers, err := workDirs(parent, name)
	if err != nil {
		return "", false, err
	}
	if _, err := os.Lstat(final); err == nil {
		leftovers = append(leftovers, final)
	}
	for _, dir := range leftovers {
		if err := os.RemoveAll(dir); err != nil {
			return "", false, fmt.Errorf("remove what a run that died left: %w", err)
		}
		log.WithField("dir", dir).Warn("removed what a run that died left")
	}
	tmp, err := os.MkdirTemp(parent, workPrefix+name+"-")
	if err != nil {
		return "", false, err
	}
	defer os.RemoveAll(tmp) // nothing left once renamed
	if err := build(tmp); err != nil {
		return "", false, err
	}
	if err := SyncDir(tmp); err != nil {
		return "", false, err
	}
	if err := os.Rename(tmp, final); err != nil {
		return "", false, fmt.Errorf("put %s in place: %w", final, err)
	}
	return final, true, SyncDir(parent)
}

// Names in a parent directory of Once: .NAME.lock is NAME's lock, .tmp-NAME-RAND a work
// directory of NAME (Once's, or a prune's on its way out).
const (
	lockPrefix, lockSuffix = ".", ".lock"
	workPrefix             = ".tmp-"
	prunedInfix            = "pruned-"
)

// workDirs lists the work directories of name in parent: .tmp-name-RAND (Once's) and
// .tmp-name-pruned-RAND (Remove's), RAND holding no dash. Not by a glob or a bare prefix:
// those would take name's metacharacters, or another name's work (.tmp-a-b-RAND is a-b's,
// judged by a-b's lock, not a's).
func workDirs(parent, name string) ([]string, error) {
	entries, err := os.ReadDir(parent)
	if errors.Is(err, fs.ErrNotExist) {
		return nil, nil
	}
	if err != nil {
		return nil, err
	}
	var dirs []string
	for _, e := range entries {
		rest, ok := strings.CutPrefix(e.Name(), workPrefix+name+"-")
		rest = strings.TrimPrefix(rest, prunedInfix)
		if ok && rest != "" && !strings.Contains(rest, "-") {
			dirs = append(dirs, filepath.Join(parent, e.Name()))
		}
	}
	return dirs, nil
}

// RemoveDead removes, from parent (a directory Once makes directories in), the work
// directories of names that no one is making: those of runs that died while they made one
// (or of prunes killed while they removed one), which no later Once of another name would
// ever remove. It judges them as Once does, by NAME's lock: held, NAME is being made, and its
// work directories stay; free, taken for the instant of the removal so that no Once of NAME
// starts meanwhile. It returns the directories it removed.
func RemoveDead(parent string) ([]string, error) {
	entries, err := os.ReadDir(parent)
	if errors.Is(err, fs.ErrNotExist) {
		return nil, nil
	}
	if err != nil {
		return nil, err
	}
	var removed []string
	var errs []error
	for _, e := range entries {
		name, isLock := strings.CutPrefix(e.Name(), lockPrefix)
		name, hasSuffix := strings.CutSuffix(name, lockSuffix)
		if !isLock || !hasSuffix || e.IsDir() {
			continue
		}
		dirs, err := workDirs(parent, name)
		if err != nil || len(dirs) == 0 {
			errs = append(errs, err)
			continue
		}
		lock, err := tryLock(parent, name)
		if err != nil || lock == nil {
			errs = append(errs, err) // nil: being made
			continue
		}
		for _, dir := range dirs {
			if err := os.RemoveAll(dir); err != nil {
				errs = append(errs, err)
				continue
			}
			removed = append(removed, dir)
		}
		lock.Close()
	}
	return removed, errors.Join(errs...)
}

// tryLock takes name's lock in parent if no one holds it, and returns nil, nil if someone
// does (name is being made, or removed). Close the file to let go.
func tryLock(parent, name string) (*os.File, error) {
	path := filepath.Join(parent, lockPrefix+name+lockSuffix)
	// O_NOFOLLOW: the cache is shared with strangers, and a symlink planted in a lock's place
	// would have root create or open the file it names, anywhere.
	f, err := os.OpenFile(path, os.O_RDWR|os.O_CREATE|syscall.O_NOFOLLOW, 0o644)
	if err != nil {
		return nil, fmt.Errorf("lock %s: %w", path, err)
	}
	err = syscall.Flock(int(f.Fd()), syscall.LOCK_EX|syscall.LOCK_NB)
	if errors.Is(err, syscall.EWOULDBLOCK) {
		f.Close()
		return nil, nil
	}
	if err != nil {
		f.Close()
		return nil, fmt.Errorf("lock %s: %w", path, err)
	}
	return f, nil
}

// Remove removes dir, a directory Once made, under its name's lock: a run making it again
// waits meanwhile, and while a run makes it now, it stays (false). It leaves its name at once
// (a rename), so no run takes a half-removed tree for a complete one; what a killed removal
// leaves is a work directory of the name, which RemoveDead (or the next Once of the name)
// removes.
func Remove(dir string) (bool, error) {
	parent, name := filepath.Split(filepath.Clean(dir))
	lock, err := tryLock(parent, name)
	if err != nil || lock == nil {
		return false, err
	}
	defer lock.Close()
	aside, err := os.MkdirTemp(parent, workPrefix+name+"-"+prunedInfix)
	if err != nil {
		return false, err
	}
	if err := os.Rename(dir, filepath.Join(aside, "tree")); err != nil {
		os.Remove(aside)
		return false, fmt.Errorf("remove %s: %w", dir, err)
	}
	if err := os.RemoveAll(aside); err != nil {
		return true, fmt.Errorf("remove %s: %w", aside, err)
	}
	return true, nil
}

// lockWait takes name's lock in parent (tryLock), polling while another run holds it, until
// ctx is done; it says once that it waits.
func lockWait(ctx context.Context, parent, name string, log logrus.FieldLogger) (*os.File, error) {
	path := filepath.Join(parent, lockPrefix+name+lockSuffix)
	said := false
	for {
		f, err := tryLock(parent, name)
		if f != nil || err != nil {
			return f, err
		}
		if !said {
			log.WithField("lock", path).Info("waiting for another run making the same directory")
			said = true
		}
		select {
		case <-ctx.Done():
			err := ctx.Err()
			if cause := context.Cause(ctx); cause != err {
				err = fmt.Errorf("%w: %w", cause, err)
			}
			return nil, fmt.Errorf("waiting for another run holding %s: %w", path, err)
		case <-time.After(100 * time.Millisecond):
		}
	}
}

// SyncDir makes what was written into dir durable before it is renamed or named, or the
// renames in dir durable.
func SyncDir(dir string) error {
	d, err := os.Open(dir)
	if err != nil {
		return err
	}
	defer d.Close()
	return d.Sync()
}
