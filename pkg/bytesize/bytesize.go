// Package bytesize reads and writes byte counts as the pipeline's config writes them: an
// integer, or one with a binary unit (512MiB, 64GiB, 2TiB). The config's limits and a worker's
// flags (-memory 512MiB) read them through Parse alone.
package bytesize

import (
	"errors"
	"fmt"
	"regexp"
	"strconv"
	"strings"
)

// Size is a byte count. As a flag.Value it reads what Parse reads.
type Size int64

// ErrSize reports a string that is not a size, or one too large.
var ErrSize = errors.New("not a size")

var pattern = regexp.MustCompile(`^([0-9]+)\s*(B|KiB|MiB|GiB|TiB)?$`)

// units are the binary units, largest first (String writes the largest that divides).
var units = []struct {
	name  string
	shift uint
}{{"TiB", 40}, {"GiB", 30}, {"MiB", 20}, {"KiB", 10}, {"B", 0}}

// Parse reads a size: bytes, or a number with B, KiB, MiB, GiB or TiB (binary units; 64GB
// is refused rather than guessed), at most 2^62 bytes.
func Parse(s string) (Size, error) {
	m := pattern.FindStringSubmatch(strings.TrimSpace(s))
	if m == nil {
		return 0, fmt.Errorf("%q is %w (bytes, or a number with B, KiB, MiB, GiB or TiB)", s, ErrSize)
	}
	var shift uint
	for _, u := range units {
		if u.name == m[2] {
			shift = u.shift
		}
	}
	n, err := strconv.ParseInt(m[1], 10, 64)
	if err != nil || n > (1<<62)>>shift {
		return 0, fmt.Errorf("%q is %w: too large (at most 4194304TiB)", s, ErrSize)
	}
	return Size(n << shift), nil
}

// String writes s as Parse reads it, in the largest unit that divides it: 512MiB, 1536KiB, 0.
func (s Size) String() string {
	if s == 0 {
		return "0"
	}
	for _, u := range units {
		if s%(1<<u.shift) == 0 {
			return strconv.FormatInt(int64(s>>u.shift), 10) + u.name
		}
	}
	return strconv.FormatInt(int64(s), 10) // not reached: every size is whole bytes
}

// Set parses v into s (flag.Value).
func (s *Size) Set(v string) error {
	n, err := Parse(v)
	if err != nil {
		return err
	}
	*s = n
	return nil
}
