package outdir

import (
	"context"
	"errors"
	"fmt"
	"os"
	"strconv"
	"strings"
	"syscall"
	"time"
)

// ErrLocked reports an output directory another live run is writing or reading.
var ErrLocked = errors.New("output is locked")

// Lock is OUT.lock held by a run: exclusively by the one run that may write the output (a
// capture, a merge, a pull), shared by runs that read it whole (a push).
type Lock struct {
	path   string
	file   *os.File
	shared bool
	// Stale is the pid of a dead run whose lock file this one took over, or 0.
	Stale int
}

func openLock(out string) (string, *os.File, error) {
	path := strings.TrimSuffix(out, "/") + ".lock"
	if err := os.MkdirAll(dirOf(path), 0o755); err != nil {
		return "", nil, err
	}
	f, err := os.OpenFile(path, os.O_RDWR|os.O_CREATE, 0o644)
	if err != nil {
		return "", nil, fmt.Errorf("%w: lock %s: %w", ErrSetup, path, err)
	}
	return path, f, nil
}

// LockOutput takes OUT.lock beside the output (the output itself is replaced by rename)
// exclusively, or fails at once naming who holds it. The lock is an flock, so the kernel
// releases it when its holder dies, however it dies; the pid written into the file only serves
// the error message.
func LockOutput(out string) (*Lock, error) {
	path, f, err := openLock(out)
	if err != nil {
		return nil, err
	}
	previous := readPID(f)
	if err := syscall.Flock(int(f.Fd()), syscall.LOCK_EX|syscall.LOCK_NB); err != nil {
		f.Close()
		if errors.Is(err, syscall.EWOULDBLOCK) {
			if readersOnly(path) {
				return nil, fmt.Errorf("%w: %s is being read by another run (a push; lock file %s): try again when it is done", ErrLocked, out, path)
			}
			return nil, fmt.Errorf("%w: %s is being written by pid %d (lock file %s)", ErrLocked, out, previous, path)
		}
		return nil, fmt.Errorf("lock %s: %w", path, err)
	}
	l := &Lock{path: path, file: f}
	if previous != 0 && previous != os.Getpid() {
		l.Stale = previous
	}
	if err := f.Truncate(0); err == nil {
		f.WriteAt([]byte(strconv.Itoa(os.Getpid())+"\n"), 0)
	}
	return l, nil
}

// readersOnly reports whether the lock at path is held shared (by readers), not by a writer:
// a shared lock can then be taken beside them.
func readersOnly(path string) bool {
	f, err := os.Open(path)
	if err != nil {
		return false
	}
	defer f.Close()
	return syscall.Flock(int(f.Fd()), syscall.LOCK_SH|syscall.LOCK_NB) == nil
}

// ReadLockOutput takes OUT.lock shared, for a run that reads the output whole and must see
// one output, never a mix of two (a push): readers share it, and a writer cannot swap the
// output while one holds it. While a writer holds it, ReadLockOutput waits, bounded by ctx;
// waiting, when set, hears once that it waits and for which pid.
func ReadLockOutput(ctx context.Context, out string, waiting func(pid int)) (*Lock, error) {
	path, f, err := openLock(out)
	if err != nil {
		return nil, err
	}
	said := false
	for {
		err := syscall.Flock(int(f.Fd()), syscall.LOCK_SH|syscall.LOCK_NB)
		if err == nil {
			return &Lock{path: path, file: f, shared: true}, nil
		}
		if !errors.Is(err, syscall.EWOULDBLOCK) {
			f.Close()
			return nil, fmt.Errorf("lock %s: %w", path, err)
		}
		if !said && waiting != nil {
			waiting(readPID(f))
			said = true
		}
		select {
		case <-ctx.Done():
			pid := readPID(f)
			f.Close()
			err := ctx.Err()
			if cause := context.Cause(ctx); cause != err {
				err = fmt.Errorf("%w: %w", cause, err)
			}
			return nil, fmt.Errorf("%w: waiting for pid %d to finish writing %s (lock file %s): %w", ErrLocked, pid, out, path, err)
		case <-time.After(100 * time.Millisecond):
		}
	}
}

// Unlock releases the lock; a writer empties the lock file first. The file stays: removing it
// would let a run that opened the old file and a run that creates a new one both hold "the"
// lock.
func (l *Lock) Unlock() error {
	var err error
	if !l.shared {
		err = l.file.Truncate(0)
	}
	return errors.Join(err, l.file.Close())
}

func readPID(f *os.File) int {
	buf := make([]byte, 32)
	n, _ := f.ReadAt(buf, 0)
	pid, _ := strconv.Atoi(strings.TrimSpace(string(buf[:n])))
	return pid
}

func dirOf(path string) string {
	if i := strings.LastIndex(path, "/"); i > 0 {
		return path[:i]
	}
	return "."
}
