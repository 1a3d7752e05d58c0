// Package lease tells the leftovers of a run that is over from the files of a run still going,
// in directories that many runs share: the checkpoint store, the runsc root, the scratch
// directory. The runs may be in other pid namespaces (every pod's pipeline has a pid near 1)
// or on other machines that share the cache, so a pid says nothing; a lock the owning run
// holds says everything. The kernel drops the lock when its holder dies, however it dies.
//
// A run has a random ID (Lease). Before it creates anything named with its ID in a shared
// directory D, it holds D/.readie-runs/ID.lock: created, flocked (LOCK_EX) and kept open for
// the run's life (Hold). The descriptor is close-on-exec, so no child (runsc, its sandbox and
// gofer processes, which may outlive a killed run) inherits the lock and keeps a dead run
// alive. A sweeper that finds a leftover named with ID asks TakeOver: it opens that lock file
// and tries LOCK_EX|LOCK_NB. Held: the run is alive, leave it. Acquired, or no lock file: the
// run is over; the sweeper removes the leftover and then the lock file (Claim.Release), still
// holding the lock, so two sweepers never work on one dead run at once.
//
// Races, and why each is harmless:
//
//   - Creation: a sweeper may open a run's new lock file between the run's open(O_CREAT) and
//     its flock, take the lock and unlink the file. The run's flock then succeeds on an
//     unlinked inode, or fails while the sweeper holds it. So Hold checks, after its flock,
//     that the path still names the inode it locked, and otherwise starts again with a new
//     file. A sweeper holds a fresh file only for an unlink, so this ends at once; Hold gives
//     up after holdAttempts. The run creates nothing named with its ID before Hold returns,
//     so the sweeper found nothing of it to remove.
//   - Unlink while locked: a sweeper that opened a lock file before another sweeper (or the
//     owner, in Release) unlinked it may then lock the unlinked inode, while the path names a
//     new file: the one a starting run made after the first sweeper took its fresh file away.
//     The lock of an unlinked inode says nothing about the run, so TakeOver judges only the
//     file the path names: after its flock it compares the locked file with the path (device
//     and inode) and, when they differ, judges again the file there now. And no one unlinks a
//     lock file by name alone: Claim.Release and Lease.Release remove the path only while it
//     names the very file they hold locked. As only the holder of a file's lock unlinks it,
//     the path cannot change between that check and the unlink.
//   - Release: a run removes its leftovers before it releases (unlinks, then closes) its lock
//     files; anything named with its ID found later is a leftover. A leftover it means to
//     keep (a failed run's staging directory, kept for inspection) must be renamed away from
//     its ID first.
//   - This process: flock locks belong to an open file description, so a sweeper's open of
//     its own run's lock file would not conflict with its own lock. TakeOver therefore never
//     opens the lock of the lease it is called on (its own run is alive); this also keeps the
//     lock intact on NFS, where flock is emulated by fcntl locks that any close drops.
//
// Across machines the shared directory must be on a file system whose flock is coherent
// between its clients (a local disk or a hostPath on one node is; NFSv4 with locking is).
package lease

import (
	"crypto/rand"
	"encoding/hex"
	"errors"
	"fmt"
	"io/fs"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"syscall"
	"time"
)

// RunsDir is the directory, inside each shared directory, that holds the runs' lock files.
const RunsDir = ".readie-runs"

// IDLength is the length of a run ID: 12 lowercase hex digits.
const IDLength = 12

const (
	lockSuffix   = ".lock"
	holdAttempts = 1000
	holdPause    = 10 * time.Millisecond
)

// ErrReleased reports a Hold on a lease that was already released.
var ErrReleased = errors.New("lease: already released")

// Lease is one run's claim on its files in shared directories.
type Lease struct {
	id       string
	mu       sync.Mutex
	held     map[string]*os.File // lock file by shared directory
	released bool
}

// New makes a lease with a fresh random ID. It holds nothing yet.
func New() (*Lease, error) {
	for {
		var b [IDLength / 2]byte
		if _, err := rand.Read(b[:]); err != nil {
			return nil, fmt.Errorf("lease: %w", err)
		}
		id := hex.EncodeToString(b[:])
		// Never all digits: a pipeline from before leases reads a number where the ID stands in
		// a sandbox ID as a pid, and would judge it by that pid.
		if strings.Trim(id, "0123456789") != "" {
			return &Lease{id: id, held: map[string]*os.File{}}, nil
		}
	}
}

// ID returns the run's ID, for names of the files it creates in shared directories.
func (l *Lease) ID() string { return l.id }

// IsID reports whether s has the form of a run ID. Names from before leases carry a pid in
// the same place, which never has this form.
func IsID(s string) bool {
	return len(s) == IDLength && strings.Trim(s, "0123456789abcdef") == "" && strings.Trim(s, "0123456789") != ""
}

func lockPath(dir, id string) string { return filepath.Join(dir, RunsDir, id+lockSuffix) }

// Hold makes dir's lock file of this lease and holds it until Release; it must be called
// before anything named with the ID is created in dir. Holding a directory twice is a no-op.
func (l *Lease) Hold(dir string) error {
	l.mu.Lock()
	defer l.mu.Unlock()
	if l.released {
		return ErrReleased
	}
	if _, ok := l.held[dir]; ok {
		return nil
	}
	if err := os.MkdirAll(filepath.Join(dir, RunsDir), 0o700); err != nil {
		return fmt.Errorf("lease: %w", err)
	}
	path := lockPath(dir, l.id)
	for range holdAttempts {
		f, err := lockNew(path)
		if err != nil {
			return err
		}
		if f != nil {
			l.held[dir] = f
			return nil
		}
		time.Sleep(holdPause) // a sweeper has the file this instant, and unlinks it
	}
	return fmt.Errorf("lease: could not hold %s: it was taken away %d times", path, holdAttempts)
}

// lockNew creates (or opens) path, locks it and checks that path still names the locked
// file. It returns nil, nil when a sweeper took the file away: try again.
func lockNew(path string) (*os.File, error) {
	f, err := os.OpenFile(path, os.O_RDWR|os.O_CREATE|syscall.O_NOFOLLOW, 0o600) // O_CLOEXEC: Go sets it
	if err != nil {
		return nil, fmt.Errorf("lease: %w", err)
	}
	if err := syscall.Flock(int(f.Fd()), syscall.LOCK_EX|syscall.LOCK_NB); err != nil {
		f.Close()
		if errors.Is(err, syscall.EWOULDBLOCK) {
			return nil, nil
		}
		return nil, fmt.Errorf("lease: lock %s: %w", path, err)
	}
	same, err := names(path, f)
	if err != nil {
		f.Close()
		return nil, fmt.Errorf("lease: %w", err)
	}
	if !same {
		f.Close()
		return nil, nil
	}
	// For a person looking at the file; nothing reads it.
	host, _ := os.Hostname()
	fmt.Fprintf(f, "host %s pid %d since %s\n", host, os.Getpid(), time.Now().UTC().Format(time.RFC3339))
	return f, nil
}

// Release removes the lease's lock files and releases their locks; the run must have removed
// what it created under its ID first. Release is safe to call again.
func (l *Lease) Release() error {
	l.mu.Lock()
	defer l.mu.Unlock()
	l.released = true
	var errs []error
	for dir, f := range l.held {
		// Unlink before close: a sweeper that opened the file meanwhile locks an unlinked
		// inode, finds the path gone and rightly takes the run for over.
		if err := removeHeld(lockPath(dir, l.id), f); err != nil {
			errs = append(errs, err)
		}
		if err := f.Close(); err != nil {
			errs = append(errs, fmt.Errorf("lease: %w", err))
		}
		delete(l.held, dir)
	}
	return errors.Join(errs...)
}

// Claim is a sweeper's hold on a run that is over: the lock of its lock file in one directory
// (when it had one), so that no other sweeper works on the same run's leftovers meanwhile.
type Claim struct {
	ID   string
	path string
	file *os.File
}

// TakeOver judges the run id in dir. It returns nil, nil when that run is alive (its lock is
// held), this lease's own run included; a Claim when it is over (its lock file can be locked,
// or there is none); and an error, with no judgement, when the lock file cannot be read. A
// nil lease (a process that owns nothing in dir) judges every run by its lock alone.
func (l *Lease) TakeOver(dir, id string) (*Claim, error) {
	if l != nil && id == l.id {
		return nil, nil
	}
	return takeOver(dir, id, nil)
}

// takeOver does TakeOver's work; opened, when set, runs between the open of the lock file and
// its flock, where other sweepers and a starting run may act (a test's step function).
func takeOver(dir, id string, opened func()) (*Claim, error) {
	path := lockPath(dir, id)
	for range holdAttempts {
		// Never O_CREAT: it is not ours to create. O_NOFOLLOW: a symlink in its place is no
		// run's lock, and opening what it names (a device, another program's lock) as root is
		// a stranger's choice.
		f, err := os.OpenFile(path, os.O_RDWR|syscall.O_NOFOLLOW, 0)
		if errors.Is(err, fs.ErrNotExist) {
			return &Claim{ID: id, path: path}, nil
		}
		if err != nil {
			return nil, fmt.Errorf("lease: is run %s alive: %w", id, err)
		}
		if opened != nil {
			opened()
			opened = nil
		}
		if err := syscall.Flock(int(f.Fd()), syscall.LOCK_EX|syscall.LOCK_NB); err != nil {
			f.Close()
			if errors.Is(err, syscall.EWOULDBLOCK) {
				return nil, nil
			}
			return nil, fmt.Errorf("lease: is run %s alive: lock %s: %w", id, path, err)
		}
		same, err := names(path, f)
		if err != nil {
			f.Close()
			return nil, fmt.Errorf("lease: is run %s alive: %w", id, err)
		}
		if same {
			return &Claim{ID: id, path: path, file: f}, nil
		}
		// Locked an inode that is no longer (or never was) at path: the file there now, or
		// none, is what says whether the run lives.
		f.Close()
	}
	return nil, fmt.Errorf("lease: is run %s alive: %s changed under each of %d looks", id, path, holdAttempts)
}

// names reports whether path names the file f is open on (device and inode).
func names(path string, f *os.File) (bool, error) {
	held, err := f.Stat()
	if err != nil {
		return false, err
	}
	named, err := os.Stat(path)
	if errors.Is(err, fs.ErrNotExist) {
		return false, nil
	}
	if err != nil {
		return false, err
	}
	return os.SameFile(held, named), nil
}

// removeHeld unlinks path if it names f, whose lock the caller holds; a path that names
// another file (or none) is left as it is. Only a lock's holder unlinks its file, so path
// cannot change between the check and the unlink.
func removeHeld(path string, f *os.File) error {
	same, err := names(path, f)
	if err == nil && same {
		err = os.Remove(path)
	}
	if err != nil && !errors.Is(err, fs.ErrNotExist) {
		return fmt.Errorf("lease: %w", err)
	}
	return nil
}

// Release removes the dead run's lock file, once its leftovers are gone, and lets go of it:
// only the file it holds, never another that has its name by now.
func (c *Claim) Release() error {
	if c.file == nil {
		return nil
	}
	return errors.Join(removeHeld(c.path, c.file), c.file.Close())
}

// RemoveDeadLocks removes the lock files in dir of runs that are over (killed runs leave
// theirs) and returns the IDs of those runs. It leaves the files of live runs and this one.
func (l *Lease) RemoveDeadLocks(dir string) ([]string, error) {
	ids, err := runsIn(dir)
	if err != nil {
		return nil, err
	}
	var removed []string
	var errs []error
	for _, id := range ids {
		claim, err := l.TakeOver(dir, id)
		if err != nil {
			errs = append(errs, err)
			continue
		}
		if claim == nil {
			continue
		}
		if err := claim.Release(); err != nil {
			errs = append(errs, err)
			continue
		}
		removed = append(removed, id)
	}
	return removed, errors.Join(errs...)
}

// runsIn lists the IDs of the runs that have a lock file in dir, live or not.
func runsIn(dir string) ([]string, error) {
	names, err := os.ReadDir(filepath.Join(dir, RunsDir))
	if errors.Is(err, fs.ErrNotExist) {
		return nil, nil
	}
	if err != nil {
		return nil, fmt.Errorf("lease: %w", err)
	}
	var ids []string
	for _, d := range names {
		if id, ok := strings.CutSuffix(d.Name(), lockSuffix); ok && IsID(id) {
			ids = append(ids, id)
		}
	}
	return ids, nil
}

// ErrInUse reports a shared directory that live runs hold leases in.
var ErrInUse = errors.New("in use by other runs")

// NoneLive refuses, with ErrInUse naming them, while any run holds its lease in dir (in any
// pid namespace or machine that shares it), this process's included: a command that removes
// what runs may be using (cache pruning) runs only when none does.
func NoneLive(dir string) error {
	live, err := live(dir)
	if err != nil {
		return err
	}
	if len(live) > 0 {
		return fmt.Errorf("%w: %s: %d runs hold leases there (%s); try again when none runs", ErrInUse, dir, len(live), strings.Join(live, ", "))
	}
	return nil
}

// live lists the runs that hold their leases in dir now, judged as TakeOver judges them (a
// nil lease: none is this process's own); a run that is over is only let go, its file kept.
func live(dir string) ([]string, error) {
	ids, err := runsIn(dir)
	if err != nil {
		return nil, err
	}
	var live []string
	for _, id := range ids {
		claim, err := (*Lease)(nil).TakeOver(dir, id)
		if err != nil {
			return live, err
		}
		if claim == nil {
			live = append(live, id)
		} else if claim.file != nil {
			claim.file.Close()
		}
	}
	return live, nil
}
