package unpack

import (
	"context"
	"errors"
	"fmt"
	"os"
	"path/filepath"
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
	lock, err := lockWait(ctx, filepath.Join(parent, "."+name+".lock"), log)
	if err != nil {
		return "", false, err
	}
	defer lock.Close()
	if ok, err := complete(final); ok || err != nil {
		return final, false, err
	}
	leftovers, _ := filepath.Glob(filepath.Join(parent, ".tmp-"+name+"-*"))
	if _, err := os.Lstat(final); err == nil {
		leftovers = append(leftovers, final)
	}
	for _, dir := range leftovers {
		if err := os.RemoveAll(dir); err != nil {
			return "", false, fmt.Errorf("remove what a run that died left: %w", err)
		}
		log.WithField("dir", dir).Warn("removed what a run that died left")
	}
	tmp, err := os.MkdirTemp(parent, ".tmp-"+name+"-")
	if err != nil {
		return "", false, err
	}
	defer os.RemoveAll(tmp) // nothing left once renamed
	if err := build(tmp); err != nil {
		return "", false, err
	}
	if err := syncDir(tmp); err != nil {
		return "", false, err
	}
	if err := os.Rename(tmp, final); err != nil {
		return "", false, fmt.Errorf("put %s in place: %w", final, err)
	}
	return final, true, syncDir(parent)
}

// lockWait takes an exclusive flock on path, polling while another run holds it, until ctx is
// done; it says once that it waits.
func lockWait(ctx context.Context, path string, log logrus.FieldLogger) (*os.File, error) {
	f, err := os.OpenFile(path, os.O_RDWR|os.O_CREATE, 0o644)
	if err != nil {
		return nil, err
	}
	said := false
	for {
		err := syscall.Flock(int(f.Fd()), syscall.LOCK_EX|syscall.LOCK_NB)
		if err == nil {
			return f, nil
		}
		if !errors.Is(err, syscall.EWOULDBLOCK) {
			f.Close()
			return nil, fmt.Errorf("lock %s: %w", path, err)
		}
		if !said {
			log.WithField("lock", path).Info("waiting for another run making the same directory")
			said = true
		}
		select {
		case <-ctx.Done():
			f.Close()
			err := ctx.Err()
			if cause := context.Cause(ctx); cause != err {
				err = fmt.Errorf("%w: %w", cause, err)
			}
			return nil, fmt.Errorf("waiting for another run holding %s: %w", path, err)
		case <-time.After(100 * time.Millisecond):
		}
	}
}

// syncDir makes what was written into dir durable before it is renamed or named.
func syncDir(dir string) error {
	d, err := os.Open(dir)
	if err != nil {
		return err
	}
	defer d.Close()
	return d.Sync()
}
