package store

import (
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"time"

	"readie.dev/pipeline/internal/lease"
	"readie.dev/pipeline/pkg/atomicfile"
	"readie.dev/pipeline/pkg/filedigest"
	"readie.dev/pipeline/pkg/manifest"
)

// Store is a directory of entries, one per key: the three image files and meta.json. Entries
// hold process memory: directories 0700, files 0600.
type Store struct {
	Dir string
	// Lease is the run's: its pending entries are named after it (nil for a process that only
	// reads, lists or prunes).
	Lease *lease.Lease
	// WriteJSON writes an entry's meta.json atomically; nil is atomicfile.WriteJSON. A test
	// passes one that counts the writes where they happen.
	WriteJSON func(path string, v any) error
}

// ErrCorrupt reports an entry whose files do not match its meta.json.
var ErrCorrupt = errors.New("corrupt store entry")

// usesFile lists, a line each, the package sets that used an entry; its modification time is
// the entry's last use.
const usesFile = "uses"

func keyHex(key string) (string, error) {
	hex, ok := strings.CutPrefix(key, filedigest.Prefix)
	if !ok || len(hex) != 64 || strings.Trim(hex, "0123456789abcdef") != "" {
		return "", fmt.Errorf("store: %q is not a sha256 key", key)
	}
	return hex, nil
}

// Path returns the directory of key's entry.
func (s *Store) Path(key string) (string, error) {
	hex, err := keyHex(key)
	if err != nil {
		return "", err
	}
	return filepath.Join(s.Dir, hex), nil
}

// CorruptError is the verdict on an entry shown wrong: its directory, why, and (from Lookup)
// which directory was judged, so that RemoveCorrupt removes that one and no other. It matches
// ErrCorrupt.
type CorruptError struct {
	Dir    string
	Err    error
	key    string
	judged os.FileInfo // the entry's directory as Lookup judged it
}

func (e *CorruptError) Error() string { return fmt.Sprintf("%v: %s: %v", ErrCorrupt, e.Dir, e.Err) }

func (e *CorruptError) Unwrap() []error { return []error{ErrCorrupt, e.Err} }

// lookupAttempts bounds how often Lookup judges again an entry replaced while it read it.
const lookupAttempts = 3

// Lookup returns the entry of key, verified: its meta.json names key and every image file
// has the size and sha256 meta.json records. It returns (nil, nil) when there is none, and a
// *CorruptError (matching ErrCorrupt) when the entry is shown wrong: a file missing, a size or a
// hash that differs, a meta.json that does not parse or names another key. The verdict is on
// one directory: an entry another run put in place while it was read is judged again. Any
// other error (EACCES, EMFILE, EIO, ...) says nothing about the entry and is returned as it is:
// the caller must not remove the entry on it.
func (s *Store) Lookup(key string) (*manifest.Meta, error) {
	dir, err := s.Path(key)
	if err != nil {
		return nil, err
	}
	for range lookupAttempts {
		before, err := os.Stat(dir)
		if errors.Is(err, fs.ErrNotExist) {
			return nil, nil
		}
		if err != nil {
			return nil, fmt.Errorf("store: read entry %s: %w", dir, err)
		}
		meta, err := judge(dir, key)
		var corrupt *CorruptError
		if !errors.As(err, &corrupt) {
			return meta, err
		}
		if after, err := os.Stat(dir); err == nil && os.SameFile(before, after) {
			corrupt.key, corrupt.judged = key, before
			return nil, corrupt
		}
	}
	return nil, fmt.Errorf("store: read entry %s: it was replaced while it was read, %d times", dir, lookupAttempts)
}

// judge verifies the entry of key in dir (Lookup).
func judge(dir, key string) (*manifest.Meta, error) {
	meta, err := manifest.LoadMeta(filepath.Join(dir, manifest.MetaFileName))
	var syntax *json.SyntaxError
	var wrongType *json.UnmarshalTypeError
	switch {
	case errors.Is(err, fs.ErrNotExist) || errors.As(err, &syntax) || errors.As(err, &wrongType):
		return nil, &CorruptError{Dir: dir, Err: err}
	case err != nil:
		return nil, fmt.Errorf("store: read entry %s: %w", dir, err)
	case meta.Key != key:
		return nil, &CorruptError{Dir: dir, Err: fmt.Errorf("meta.json names key %s", meta.Key)}
	}
	if err := VerifyFiles(dir, meta); err != nil {
		if errors.Is(err, ErrCorrupt) {
			return nil, err
		}
		return nil, fmt.Errorf("store: read entry %s: %w", dir, err)
	}
	return meta, nil
}

// VerifyFiles checks that every image file in dir has the size and sha256 meta records. A file
// that is missing or differs is a *CorruptError (matching ErrCorrupt); an error reading one is
// returned as it is.
func VerifyFiles(dir string, meta *manifest.Meta) error {
	problems := manifest.CheckFiles(dir, meta)
	switch {
	case len(problems) == 0:
		return nil
	case errors.Is(problems[0], manifest.ErrFileMismatch):
		return &CorruptError{Dir: dir, Err: problems[0]}
	}
	return problems[0]
}

// RemoveCorrupt removes the entry that Lookup judged corrupt (verdict, Lookup's error), and
// only that one: the verdict may be minutes old, and another run may have put a good entry in
// its place since. An entry whose directory is not the one judged is left; one that is (or has
// its inode number, reused) is moved out of the key's name into a pending directory of this
// run's lease (swept if the run dies), judged again there, where nothing else changes it, and removed only if it is
// corrupt still; otherwise it is put back. It reports whether it removed the entry.
func (s *Store) RemoveCorrupt(verdict error) (bool, error) {
	var c *CorruptError
	if !errors.As(verdict, &c) || c.judged == nil {
		return false, fmt.Errorf("store: remove an entry: %v is not Lookup's verdict on one", verdict)
	}
	now, err := os.Stat(c.Dir)
	if errors.Is(err, fs.ErrNotExist) {
		return false, nil
	}
	if err != nil {
		return false, fmt.Errorf("store: remove %s: %w", c.Dir, err)
	}
	if !os.SameFile(now, c.judged) {
		return false, nil // another run's entry by now
	}
	aside, err := s.pendingDir(c.key)
	if err != nil {
		return false, err
	}
	entry := filepath.Join(aside, "entry")
	if err := os.Rename(c.Dir, entry); err != nil {
		os.Remove(aside)
		if errors.Is(err, fs.ErrNotExist) {
			return false, nil
		}
		return false, fmt.Errorf("store: remove %s: %w", c.Dir, err)
	}
	_, err = judge(entry, c.key)
	if errors.As(err, new(*CorruptError)) {
		return true, os.RemoveAll(aside)
	}
	// Not shown corrupt now: another run's entry after all. Put back, unless yet another took
	// the name meanwhile (Commit has judged that one).
	if err := os.Rename(entry, c.Dir); err != nil {
		return false, errors.Join(fmt.Errorf("store: put back %s: %w", c.Dir, err), os.RemoveAll(aside))
	}
	return false, os.Remove(aside)
}

// Pending is an entry being written: a private directory in the store, on the same file
// system as the entry it becomes, named .pending-RUN-KEY-RAND after the lease of the run that
// writes it (RemoveDeadPending).
type Pending struct {
	Dir   string
	store *Store
	key   string
	// found, when set, runs when Commit's rename found an entry in place, before Commit looks
	// at it: where other runs may remove or replace it (a test's step function).
	found func()
}

const pendingPrefix = ".pending-"

// Begin makes a private directory for a capture of key, under the store's lease.
func (s *Store) Begin(key string) (*Pending, error) {
	dir, err := s.pendingDir(key)
	if err != nil {
		return nil, err
	}
	return &Pending{Dir: dir, store: s, key: key}, nil
}

// pendingDir makes an empty private directory for key's entry, named after the run's lease
// (RemoveDeadPending sweeps it when the run dies).
func (s *Store) pendingDir(key string) (string, error) {
	hex, err := keyHex(key)
	if err != nil {
		return "", err
	}
	if s.Lease == nil {
		return "", errors.New("store: a write into the store needs the run's lease")
	}
	if err := os.MkdirAll(s.Dir, 0o700); err != nil {
		return "", err
	}
	if err := s.Lease.Hold(s.Dir); err != nil {
		return "", err
	}
	return os.MkdirTemp(s.Dir, pendingPrefix+s.Lease.ID()+"-"+hex[:12]+"-")
}

// RemoveDeadPending removes the pending directories of runs that are over (killed mid-capture:
// they hold process memory), judged by the lease of the run each is named after, and the lock
// files those runs left; it returns the directories removed. Directories of live runs, in any
// pid namespace or on any machine sharing the store, are left alone, and so are .tmp-KEY-PID-*
// directories of pipelines from before leases (a pid cannot tell whose they are).
func (s *Store) RemoveDeadPending() ([]string, error) {
	removed, err := s.Lease.RemoveDeadDirs(s.Dir, pendingPrefix)
	errs := []error{err}
	if _, err := s.Lease.RemoveDeadLocks(s.Dir); err != nil {
		errs = append(errs, err)
	}
	return removed, errors.Join(errs...)
}

// Abort removes the pending directory.
func (p *Pending) Abort() error { return os.RemoveAll(p.Dir) }

// Commit makes the pending directory key's entry: meta.json written, every file made read-only
// (0400: it holds process memory, and outputs share it by hard link, so nothing may write it)
// and synced, the directory renamed into place. When another run committed the same key first,
// its entry is kept if it verifies (and this one dropped), or replaced if it does not. It
// returns the entry's meta.json as it is in the store.
func (p *Pending) Commit(meta *manifest.Meta) (*manifest.Meta, error) {
	meta.Key = p.key
	write := atomicfile.WriteJSON
	if p.store.WriteJSON != nil {
		write = p.store.WriteJSON
	}
	if err := write(filepath.Join(p.Dir, manifest.MetaFileName), meta); err != nil {
		return nil, err
	}
	for _, name := range append(manifest.ImageFiles(), manifest.MetaFileName) {
		if err := syncReadOnly(filepath.Join(p.Dir, name)); err != nil {
			return nil, err
		}
	}
	if err := os.Chmod(p.Dir, 0o700); err != nil {
		return nil, err
	}
	final, err := p.store.Path(p.key)
	if err != nil {
		return nil, err
	}
	for range 2 {
		err = os.Rename(p.Dir, final)
		if err == nil {
			return meta, syncDir(p.store.Dir)
		}
		if !errors.Is(err, fs.ErrExist) && !errors.Is(err, errNotEmpty) {
			return nil, err
		}
		if p.found != nil {
			p.found()
		}
		// Another run got there first: keep its entry unless it is shown corrupt.
		theirs, lookupErr := p.store.Lookup(p.key)
		if lookupErr == nil && theirs != nil {
			p.Abort()
			return theirs, nil
		}
		if lookupErr == nil {
			continue // gone since (a prune, another run's RemoveCorrupt): nothing to judge
		}
		if !errors.Is(lookupErr, ErrCorrupt) {
			return nil, fmt.Errorf("store: commit %s: the entry there cannot be read: %w", final, lookupErr)
		}
		if _, err := p.store.RemoveCorrupt(lookupErr); err != nil {
			return nil, err
		}
	}
	return nil, fmt.Errorf("store: commit %s: %w", final, err)
}

// EntryFilePerm is the mode of every file of an entry, and of the image files that outputs
// share with it.
const EntryFilePerm = 0o400

func syncReadOnly(path string) error {
	f, err := os.Open(path)
	if err != nil {
		return err
	}
	defer f.Close()
	if err := f.Chmod(EntryFilePerm); err != nil {
		return err
	}
	return f.Sync()
}

func syncDir(dir string) error {
	d, err := os.Open(dir)
	if err != nil {
		return err
	}
	defer d.Close()
	return d.Sync()
}

// Use records that set used key's entry now (its last use, for prune and list).
func (s *Store) Use(key, set string) error {
	dir, err := s.Path(key)
	if err != nil {
		return err
	}
	f, err := os.OpenFile(filepath.Join(dir, usesFile), os.O_WRONLY|os.O_APPEND|os.O_CREATE, 0o600)
	if err != nil {
		return err
	}
	_, err = f.WriteString(set + "\n") // one short append: atomic beside a concurrent run's
	return errors.Join(err, f.Close())
}

// LinkFiles puts the image files of the entry in dir into dst by hard link, or by copy when
// the two are on different file systems.
func LinkFiles(dir, dst string) error {
	if err := os.MkdirAll(dst, 0o700); err != nil {
		return err
	}
	for _, name := range manifest.ImageFiles() {
		src, target := filepath.Join(dir, name), filepath.Join(dst, name)
		err := os.Link(src, target)
		if err == nil {
			continue
		}
		if !isCrossDevice(err) {
			return err
		}
		if err := copyFile(src, target); err != nil {
			return err
		}
	}
	return nil
}

func copyFile(src, dst string) error {
	in, err := os.Open(src)
	if err != nil {
		return err
	}
	defer in.Close()
	out, err := os.OpenFile(dst, os.O_WRONLY|os.O_CREATE|os.O_EXCL, EntryFilePerm)
	if err != nil {
		return err
	}
	if _, err := io.Copy(out, in); err != nil {
		out.Close()
		return err
	}
	if err := out.Sync(); err != nil {
		out.Close()
		return err
	}
	return out.Close()
}

// Entry is one entry as `pipeline cache list` shows it.
type Entry struct {
	Key     string    `json:"key"`
	Imports []string  `json:"imports"`
	Sets    []string  `json:"sets"`
	Bytes   int64     `json:"bytes"`
	LastUse time.Time `json:"last_use"`
	Dir     string    `json:"dir"`
}

// List returns the store's entries, most recently used first. Pending and unreadable
// directories are left out (Lookup finds the latter corrupt).
func (s *Store) List() ([]Entry, error) {
	dirs, err := os.ReadDir(s.Dir)
	if errors.Is(err, fs.ErrNotExist) {
		return nil, nil
	}
	if err != nil {
		return nil, err
	}
	var entries []Entry
	for _, d := range dirs {
		if !d.IsDir() || strings.HasPrefix(d.Name(), ".") {
			continue
		}
		dir := filepath.Join(s.Dir, d.Name())
		meta, err := manifest.LoadMeta(filepath.Join(dir, manifest.MetaFileName))
		if err != nil {
			continue
		}
		e := Entry{Key: meta.Key, Imports: meta.Imports, Bytes: meta.Bytes(), LastUse: meta.CapturedAt, Dir: dir}
		if fi, err := os.Stat(filepath.Join(dir, usesFile)); err == nil {
			e.LastUse = fi.ModTime()
			data, _ := os.ReadFile(filepath.Join(dir, usesFile))
			for _, set := range strings.Fields(string(data)) {
				if !slices.Contains(e.Sets, set) {
					e.Sets = append(e.Sets, set)
				}
			}
		}
		entries = append(entries, e)
	}
	slices.SortFunc(entries, func(a, b Entry) int { return b.LastUse.Compare(a.LastUse) })
	return entries, nil
}

// Prune removes the entries last used before cutoff whose key is not in keep, and the pending
// directories of runs that died; with dryRun it removes nothing. It returns the entries it
// removed (or would remove).
func (s *Store) Prune(cutoff time.Time, keep map[string]bool, dryRun bool) ([]Entry, error) {
	entries, err := s.List()
	if err != nil {
		return nil, err
	}
	var sweepErr error
	if !dryRun {
		// An entry may be on its way into another run's output (Lookup, then LinkFiles):
		// prune only while no run uses the store.
		if err := lease.NoneLive(s.Dir); err != nil {
			return nil, err
		}
		_, sweepErr = s.RemoveDeadPending()
	}
	var pruned []Entry
	for _, e := range entries {
		if keep[e.Key] || !e.LastUse.Before(cutoff) {
			continue
		}
		if !dryRun {
			// Again before each entry: a run that started since holds its lease by now. One
			// that starts in the instant between this check and the removal finds the entry
			// gone as it links it, fails that set with the error, and the next run captures it.
			if err := lease.NoneLive(s.Dir); err != nil {
				return pruned, errors.Join(err, sweepErr)
			}
		}
		pruned = append(pruned, e)
		if !dryRun {
			if err := os.RemoveAll(e.Dir); err != nil {
				return pruned, errors.Join(err, sweepErr)
			}
		}
	}
	return pruned, sweepErr
}
