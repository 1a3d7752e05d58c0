// Package limitread reads whole files that anyone may have written (an output's JSON files, a
// pulled output's included) within a limit: a file larger than the limit is refused before it
// is read, naming the limit, so that a manifest of gigabytes cannot take a reader's memory. In
// a directory of another's making (an os.Root), it opens only regular files: a FIFO cannot
// block the reader, a symbolic link cannot stand for another file.
package limitread

import (
	"errors"
	"fmt"
	"io"
	"io/fs"
	"os"
	"syscall"
)

// OutputJSON bounds each JSON file of an output: manifest.json, meta.json, restore-spec.json
// and catalogue.json. The pipeline and a worker's kit read them with the same limit, so an
// output one accepts the other reads.
const OutputJSON = 64 << 20

// OutputFile reads one JSON file of an output within OutputJSON.
func OutputFile(path string) ([]byte, error) {
	return File(path, OutputJSON, "the limit on an output's JSON files")
}

// ErrTooLarge reports a file larger than the limit it is read with.
var ErrTooLarge = errors.New("file too large")

// File reads the file at path, refusing one larger than limit bytes; what names the limit in
// that error ("the limit on an output's JSON files"). An error opening it is returned as it is
// (errors.Is(err, fs.ErrNotExist) holds).
func File(path string, limit int64, what string) ([]byte, error) {
	f, err := os.Open(path)
	if err != nil {
		return nil, err
	}
	defer f.Close()
	return read(f, path, limit, what)
}

// ErrNotRegular reports a file that is no regular file: a symbolic link, a FIFO, a device.
var ErrNotRegular = errors.New("not a regular file")

// OpenRegularIn opens name in root for reading, refusing anything but a regular file: a
// symbolic link (what it names is another file: root would follow it), a FIFO (its open would
// wait for a writer, which may never come), a device. The file opened is checked to be the one
// looked at, so nothing put in its place between the two passes.
func OpenRegularIn(root *os.Root, name string) (*os.File, error) {
	fi, err := root.Lstat(name)
	if err != nil {
		return nil, err
	}
	if !fi.Mode().IsRegular() {
		return nil, fmt.Errorf("%w: %s is %s", ErrNotRegular, name, typeOf(fi.Mode()))
	}
	// O_NONBLOCK: a FIFO put in its place is opened at once, and refused below.
	f, err := root.OpenFile(name, os.O_RDONLY|syscall.O_NONBLOCK, 0)
	if err != nil {
		return nil, err
	}
	if opened, err := f.Stat(); err != nil || !os.SameFile(fi, opened) {
		f.Close()
		return nil, fmt.Errorf("%w: %s changed while it was opened", ErrNotRegular, name)
	}
	return f, nil
}

// ReadIn reads the regular file name in root (OpenRegularIn) within limit, as File does.
func ReadIn(root *os.Root, name string, limit int64, what string) ([]byte, error) {
	f, err := OpenRegularIn(root, name)
	if err != nil {
		return nil, err
	}
	defer f.Close()
	return read(f, name, limit, what)
}

// typeOf names the type of a file for messages.
func typeOf(m fs.FileMode) string {
	switch {
	case m&fs.ModeSymlink != 0:
		return "a symbolic link"
	case m&fs.ModeNamedPipe != 0:
		return "a FIFO"
	case m&fs.ModeDevice != 0:
		return "a device"
	case m.IsDir():
		return "a directory"
	}
	return "of mode " + m.String()
}

// read reads f, opened as name, within limit.
func read(f *os.File, name string, limit int64, what string) ([]byte, error) {
	tooLarge := fmt.Errorf("%w: %s is larger than %s (%s)", ErrTooLarge, name, size(limit), what)
	if fi, err := f.Stat(); err == nil && fi.Mode().IsRegular() && fi.Size() > limit {
		return nil, tooLarge
	}
	// Read to one byte past the limit: a file that grew since, or is not a regular file, is
	// caught too.
	data, err := io.ReadAll(io.LimitReader(f, limit+1))
	if err != nil {
		return nil, fmt.Errorf("%s: %w", name, err)
	}
	if int64(len(data)) > limit {
		return nil, tooLarge
	}
	return data, nil
}

func size(n int64) string {
	if n >= 1<<20 && n%(1<<20) == 0 {
		return fmt.Sprintf("%d MiB", n>>20)
	}
	return fmt.Sprintf("%d bytes", n)
}
