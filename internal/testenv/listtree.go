package testenv

import (
	"fmt"
	"io/fs"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
)

// ListTree lists every path under dir (dir itself included), a line each, with its mode,
// owner, size and, but for a directory, its modification time: two listings differ when
// anything in the tree was added, removed, replaced or written to ("left unchanged" checks;
// a directory's time moves with an entry made and removed again, which changed nothing).
func ListTree(t testing.TB, dir string) string {
	t.Helper()
	var b strings.Builder
	err := filepath.WalkDir(dir, func(path string, d fs.DirEntry, err error) error {
		if err != nil {
			return err
		}
		info, err := d.Info()
		if err != nil {
			return err
		}
		st := info.Sys().(*syscall.Stat_t)
		fmt.Fprintf(&b, "%s %s %d:%d %d", path, info.Mode(), st.Uid, st.Gid, info.Size())
		if !d.IsDir() {
			fmt.Fprintf(&b, " %s", info.ModTime())
		}
		b.WriteString("\n")
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
	return b.String()
}
