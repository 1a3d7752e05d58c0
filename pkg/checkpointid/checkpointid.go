// Package checkpointid is the one rule for checkpoint ids: the config's package sets, and every
// manifest.json, meta.json and catalogue.json read, whoever wrote it. An id names a directory
// of an output (and a sandbox's bundle), so one that is not a plain name would be a path.
package checkpointid

import (
	"errors"
	"fmt"
)

// Empty is the id of the package set with no imports that every run captures first.
const Empty = "empty"

// MaxLen is the longest id.
const MaxLen = 64

// ErrInvalid reports an id that is not 1-64 letters, digits, - and _.
var ErrInvalid = errors.New("invalid checkpoint id")

// Valid reports whether id is a checkpoint id: 1-64 ASCII letters, digits, - and _.
func Valid(id string) bool {
	return len(id) <= MaxLen && Plain(id)
}

// Plain reports whether s is one or more ASCII letters, digits, - and _: a single path element,
// never "." or "..", with no separator or NUL. Valid is Plain within MaxLen; a name made of ids
// (a sandbox's, pkg/launch) is Plain within a bound of its own.
func Plain(s string) bool {
	if len(s) == 0 {
		return false
	}
	for i := 0; i < len(s); i++ {
		c := s[i]
		if !(c == '_' || c == '-' || c >= 'a' && c <= 'z' || c >= 'A' && c <= 'Z' || c >= '0' && c <= '9') {
			return false
		}
	}
	return true
}

// Check returns an error naming id (quoted) when it is not Valid.
func Check(id string) error {
	if !Valid(id) {
		return fmt.Errorf("%w %q: use 1-64 letters, digits, - and _", ErrInvalid, id)
	}
	return nil
}
