package lease

import (
	"errors"
	"io/fs"
	"os"
	"path/filepath"
	"strings"
)

// RemoveDeadDirs removes the entries of dir named prefix+ID-* whose run ID is over (TakeOver),
// then those runs' lock files in dir, and returns the entries it removed. Entries of live runs,
// in any pid namespace, l's own, and names without a lease ID are left alone. The store's
// pending entries and the runs' scratch directories are swept with it.
func (l *Lease) RemoveDeadDirs(dir, prefix string) ([]string, error) {
	// Listed, not globbed: dir may hold glob metacharacters (a user's output directory), and
	// a glob would then judge another directory's entries by this one's locks.
	names, err := os.ReadDir(dir)
	if errors.Is(err, fs.ErrNotExist) {
		return nil, nil
	}
	if err != nil {
		return nil, err
	}
	claims := map[string]*Claim{}
	var removed []string
	var errs []error
	for _, name := range names {
		rest, ok := strings.CutPrefix(name.Name(), prefix)
		id, _, _ := strings.Cut(rest, "-")
		if !ok || !IsID(id) {
			continue
		}
		entry := filepath.Join(dir, name.Name())
		claim, seen := claims[id]
		if !seen {
			if claim, err = l.TakeOver(dir, id); err != nil {
				errs = append(errs, err)
			}
			claims[id] = claim
		}
		if claim == nil {
			continue // alive, or not known to be over
		}
		if err := os.RemoveAll(entry); err != nil {
			errs = append(errs, err)
			continue
		}
		removed = append(removed, entry)
	}
	for _, claim := range claims {
		if claim != nil {
			errs = append(errs, claim.Release())
		}
	}
	return removed, errors.Join(errs...)
}
