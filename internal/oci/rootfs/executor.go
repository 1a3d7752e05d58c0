package rootfs

import (
	"crypto/sha256"
	"encoding/hex"
	"fmt"
	"io"
	"io/fs"
	"os"
	"path"
	"path/filepath"
	"sort"
	"strings"

	pipeline "readie.dev/pipeline"
)

// TestingDir is where the executor layer puts the test-only module (on no path unless
// PYTHONPATH names it).
const TestingDir = "usr/lib/readie/testing"

// ExecutorLayer writes the pipeline's own layer into dir, as paths relative to a root:
// readie_executor in sitePackages (a directory on the image's python3 path), the test-only
// module, the resolver files (/etc/resolv.conf a link into the sandbox's /tmp, since the root
// is read-only; /etc/readie-resolv.conf the resolvers the executor writes there; /etc/hosts).
// It returns the layer's digest: "sha256:" over each entry's path and content, sorted.
func ExecutorLayer(dir, sitePackages string) (string, error) {
	site := strings.Trim(path.Clean("/"+sitePackages), "/")
	files := pipeline.ExecutorFiles()
	copyGlob := func(pattern, dest string) error {
		names, err := fs.Glob(files, pattern)
		if err != nil || len(names) == 0 {
			return fmt.Errorf("executor files %s: %v", pattern, err)
		}
		if err := os.MkdirAll(filepath.Join(dir, dest), 0o755); err != nil {
			return err
		}
		for _, name := range names {
			data, err := fs.ReadFile(files, name)
			if err != nil {
				return err
			}
			if err := os.WriteFile(filepath.Join(dir, dest, path.Base(name)), data, 0o644); err != nil {
				return err
			}
		}
		return nil
	}
	if err := copyGlob("readie_executor/*.py", path.Join(site, "readie_executor")); err != nil {
		return "", err
	}
	if err := copyGlob("testing/*.py", TestingDir); err != nil {
		return "", err
	}
	if err := os.MkdirAll(filepath.Join(dir, "etc"), 0o755); err != nil {
		return "", err
	}
	if err := os.Symlink("../tmp/resolv.conf", filepath.Join(dir, "etc/resolv.conf")); err != nil {
		return "", err
	}
	for name, text := range map[string]string{
		"etc/readie-resolv.conf": "nameserver 1.1.1.1\nnameserver 8.8.8.8\noptions edns0\n",
		"etc/hosts":              "127.0.0.1\tlocalhost\n::1\tlocalhost ip6-localhost ip6-loopback\n127.0.1.1\treadie\n",
	} {
		if err := os.WriteFile(filepath.Join(dir, name), []byte(text), 0o644); err != nil {
			return "", err
		}
	}
	return TreeDigest(dir)
}

// TreeDigest is "sha256:" over every file and link under dir: its path, and its content's
// sha256 or its target, in sorted order. Modes and times are not in it.
func TreeDigest(dir string) (string, error) {
	var lines []string
	err := filepath.WalkDir(dir, func(p string, d fs.DirEntry, err error) error {
		if err != nil || d.IsDir() {
			return err
		}
		rel, _ := filepath.Rel(dir, p)
		if d.Type()&fs.ModeSymlink != 0 {
			target, err := os.Readlink(p)
			lines = append(lines, "link "+rel+" "+target)
			return err
		}
		f, err := os.Open(p)
		if err != nil {
			return err
		}
		defer f.Close()
		h := sha256.New()
		if _, err := io.Copy(h, f); err != nil {
			return err
		}
		lines = append(lines, "file "+rel+" "+hex.EncodeToString(h.Sum(nil)))
		return nil
	})
	if err != nil {
		return "", err
	}
	sort.Strings(lines)
	sum := sha256.Sum256([]byte(strings.Join(lines, "\n") + "\n"))
	return "sha256:" + hex.EncodeToString(sum[:]), nil
}
