package run

import (
	"errors"
	"fmt"
	"os"
	"strconv"
	"strings"
	"syscall"
)

// ErrLocked reports an output directory another live run is writing.
var ErrLocked = errors.New("output is locked")

// Lock is held by the one run that may write an output directory.
type Lock struct {
	path string
	file *os.File
	// Stale is the pid of a dead run whose lock file this one took over, or 0.
	Stale int
}

// LockOutput takes OUT.lock beside the output (the output itself is replaced by rename). The
// lock is an flock, so the kernel releases it when its holder dies, however it dies; the pid
// written into the file only serves the error message.
func LockOutput(out string) (*Lock, error) {
	path := strings.TrimSuffix(out, "/") + ".lock"
	if err := os.MkdirAll(dirOf(path), 0o755); err != nil {
		return nil, err
	}
	f, err := os.OpenFile(path, os.O_RDWR|os.O_CREATE, 0o644)
	if err != nil {
		return nil, fmt.Errorf("%w: lock %s: %w", ErrSetup, path, err)
	}
	previous := readPID(f)
	if err := syscall.Flock(int(f.Fd()), syscall.LOCK_EX|syscall.LOCK_NB); err != nil {
		f.Close()
		if errors.Is(err, syscall.EWOULDBLOCK) {
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

// Unlock empties the lock file and releases the lock. The file stays: removing it would let a
// run that opened the old file and a run that creates a new one both hold "the" lock.
func (l *Lock) Unlock() error {
	err := l.file.Truncate(0)
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
