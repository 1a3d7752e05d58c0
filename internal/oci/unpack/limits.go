package unpack

import (
	"archive/tar"
	"errors"
	"fmt"
)

// ErrLimit reports an image over one of the limits on what unpacking it may write.
var ErrLimit = errors.New("over a limit")

// Limits bound what unpacking an image (or pulling an output) may write, over all its layers:
// a small layer can claim a lot (a sparse entry, or gzip of zeros, expands to any size).
type Limits struct {
	Bytes     int64 // of all entries' data, at its declared (expanded) size (limits.image_bytes)
	Entries   int64 // tar entries, whiteouts and directories included (limits.image_entries)
	FileBytes int64 // of one entry's data, at its declared (expanded) size (limits.image_file_bytes)
}

// DefaultLimits returns limits generous for any image a Python sandbox runs from; the config's
// limits replace them.
func DefaultLimits() Limits {
	return Limits{Bytes: 64 << 30, Entries: 1_000_000, FileBytes: 16 << 30}
}

// Budget counts entries and bytes against Limits, across the layers of one image, before
// anything of an entry is written.
type Budget struct {
	limits         Limits
	bytes, entries int64
}

// NewBudget starts counting against limits.
func NewBudget(limits Limits) *Budget { return &Budget{limits: limits} }

// Take counts hdr, refusing it (naming it and the limit) when it would go over one. Every
// entry counts at its declared hdr.Size, whatever its type: archive/tar reads through the
// data of a type it does not know (a GNU volume header, a continuation entry) to reach the
// next header, so a small compressed layer could otherwise make it inflate gigabytes. For a
// sparse entry hdr.Size is its expanded size.
func (b *Budget) Take(hdr *tar.Header) error {
	b.entries++
	if b.entries > b.limits.Entries {
		return fmt.Errorf("%w: entry %q: more than %d entries (limits.image_entries)", ErrLimit, hdr.Name, b.limits.Entries)
	}
	if hdr.Size < 0 || hdr.Size > b.limits.FileBytes {
		return fmt.Errorf("%w: entry %q: %s exceeds the limit on one file, %s (limits.image_file_bytes)", ErrLimit, hdr.Name, Size(hdr.Size), Size(b.limits.FileBytes))
	}
	b.bytes += hdr.Size
	if b.bytes > b.limits.Bytes {
		return fmt.Errorf("%w: entry %q: the files come to more than %s (limits.image_bytes)", ErrLimit, hdr.Name, Size(b.limits.Bytes))
	}
	return nil
}

func isRegular(hdr *tar.Header) bool {
	// No TypeRegA: tar.Reader already turns old writers' '\x00' entries into TypeReg (or TypeDir).
	return hdr.Typeflag == tar.TypeReg || hdr.Typeflag == tar.TypeGNUSparse
}

// Size prints a byte count in binary units, as the config writes them.
func Size(n int64) string {
	for _, u := range []struct {
		unit  string
		shift uint
	}{{"TiB", 40}, {"GiB", 30}, {"MiB", 20}, {"KiB", 10}} {
		if n >= 1<<u.shift && n%(1<<u.shift) == 0 {
			return fmt.Sprintf("%d %s", n>>u.shift, u.unit)
		}
	}
	if n >= 1<<20 {
		return fmt.Sprintf("%.1f MiB", float64(n)/(1<<20))
	}
	return fmt.Sprintf("%d bytes", n)
}
