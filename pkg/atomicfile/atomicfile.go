// Package atomicfile writes files that others read (manifest.json, meta.json, bench results)
// so that a reader sees the old file or the new one, never a part.
package atomicfile

import (
	"encoding/json"
	"os"
	"path/filepath"
	"strings"
)

// WriteJSON writes v as indented JSON to path atomically: a temporary file in the same
// directory, fsync, rename, fsync of the directory. A reader sees the old file or the new one.
func WriteJSON(path string, v any) error { return WriteJSONPerm(path, v, 0o644) }

// WriteJSONPerm writes as WriteJSON does, with the file's permissions (0o444 for an output's
// files, which nothing writes in place).
func WriteJSONPerm(path string, v any, perm os.FileMode) error {
	data, err := json.MarshalIndent(v, "", "  ")
	if err != nil {
		return err
	}
	return Write(path, append(data, '\n'), perm)
}

// tmpInfix is between the name and the random part of a temporary file: .NAME.tmp-RAND.
const tmpInfix = ".tmp-"

// TempOf reports whether name is a temporary file Write makes for a file named base
// (.BASE.tmp-RAND, RAND decimal digits), and that base. A writer killed between its create and
// its rename leaves one; only a writer of that directory (under its lock) may judge it dead.
func TempOf(name string) (base string, ok bool) {
	rest, ok := strings.CutPrefix(name, ".")
	i := strings.LastIndex(rest, tmpInfix)
	if !ok || i <= 0 {
		return "", false
	}
	rand := rest[i+len(tmpInfix):]
	if rand == "" || strings.Trim(rand, "0123456789") != "" {
		return "", false
	}
	return rest[:i], true
}

// Write writes data to path atomically (see WriteJSON).
func Write(path string, data []byte, perm os.FileMode) (err error) {
	dir := filepath.Dir(path)
	tmp, err := os.CreateTemp(dir, "."+filepath.Base(path)+tmpInfix+"*")
	if err != nil {
		return err
	}
	defer func() {
		if err != nil {
			tmp.Close()
			os.Remove(tmp.Name())
		}
	}()
	if _, err = tmp.Write(data); err != nil {
		return err
	}
	if err = tmp.Chmod(perm); err != nil {
		return err
	}
	if err = tmp.Sync(); err != nil {
		return err
	}
	if err = tmp.Close(); err != nil {
		return err
	}
	if err = os.Rename(tmp.Name(), path); err != nil {
		return err
	}
	d, err := os.Open(dir)
	if err != nil {
		return err
	}
	defer d.Close()
	return d.Sync()
}
