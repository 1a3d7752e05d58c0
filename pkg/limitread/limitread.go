// Package limitread reads whole files that anyone may have written (an output's JSON files, a
// pulled output's included) within a limit: a file larger than the limit is refused before it
// is read, naming the limit, so that a manifest of gigabytes cannot take a reader's memory.
package limitread

import (
	"errors"
	"fmt"
	"io"
	"os"
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
	tooLarge := fmt.Errorf("%w: %s is larger than %s (%s)", ErrTooLarge, path, size(limit), what)
	if fi, err := f.Stat(); err == nil && fi.Mode().IsRegular() && fi.Size() > limit {
		return nil, tooLarge
	}
	// Read to one byte past the limit: a file that grew since, or is not a regular file, is
	// caught too.
	data, err := io.ReadAll(io.LimitReader(f, limit+1))
	if err != nil {
		return nil, fmt.Errorf("%s: %w", path, err)
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
