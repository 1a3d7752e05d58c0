package limitread

import (
	"errors"
	"io/fs"
	"os"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
)

func TestFile(t *testing.T) {
	dir := t.TempDir()
	path := filepath.Join(dir, "manifest.json")
	if err := os.WriteFile(path, []byte("0123456789"), 0o644); err != nil {
		t.Fatal(err)
	}
	if data, err := File(path, 10, "the limit"); err != nil || string(data) != "0123456789" {
		t.Errorf("File at its limit = %q, %v", data, err)
	}
	if _, err := File(path, 9, "the limit on an output's JSON files"); !errors.Is(err, ErrTooLarge) ||
		!strings.Contains(err.Error(), path+" is larger than 9 bytes (the limit on an output's JSON files)") {
		t.Errorf("File over its limit: %v", err)
	}
	// A sparse file of 65 MiB: refused before a byte of it is read.
	big := filepath.Join(dir, "big.json")
	f, err := os.Create(big)
	if err != nil {
		t.Fatal(err)
	}
	f.Truncate(OutputJSON + 1)
	f.Close()
	if _, err := File(big, OutputJSON, "x"); !errors.Is(err, ErrTooLarge) || !strings.Contains(err.Error(), "larger than 64 MiB") {
		t.Errorf("a sparse 64 MiB + 1: %v", err)
	}
	if _, err := File(filepath.Join(dir, "absent"), 10, "x"); !errors.Is(err, fs.ErrNotExist) {
		t.Errorf("an absent file: %v", err)
	}
	if _, err := File(dir, 10, "x"); err == nil || !strings.Contains(err.Error(), dir) {
		t.Errorf("a directory: %v", err)
	}
}

// TestReadIn: a regular file in a root is read within the limit; a symbolic link (to the
// regular file beside it, too), a FIFO (refused at once: no writer will come) and a directory
// are refused with ErrNotRegular, a file past the limit with ErrTooLarge.
func TestReadIn(t *testing.T) {
	dir := t.TempDir()
	if err := os.WriteFile(filepath.Join(dir, "file"), []byte("data"), 0o644); err != nil {
		t.Fatal(err)
	}
	os.Symlink("file", filepath.Join(dir, "link"))
	if err := syscall.Mkfifo(filepath.Join(dir, "fifo"), 0o644); err != nil {
		t.Fatal(err)
	}
	os.Mkdir(filepath.Join(dir, "dir"), 0o755)
	root, err := os.OpenRoot(dir)
	if err != nil {
		t.Fatal(err)
	}
	defer root.Close()
	if data, err := ReadIn(root, "file", 4, "the limit"); err != nil || string(data) != "data" {
		t.Errorf("ReadIn of a regular file = %q, %v", data, err)
	}
	if _, err := ReadIn(root, "file", 3, "the limit"); !errors.Is(err, ErrTooLarge) {
		t.Errorf("ReadIn past the limit: %v, want ErrTooLarge", err)
	}
	for _, name := range []string{"link", "fifo", "dir"} {
		if _, err := ReadIn(root, name, 4, "the limit"); !errors.Is(err, ErrNotRegular) {
			t.Errorf("ReadIn of %s: %v, want ErrNotRegular", name, err)
		}
	}
}
