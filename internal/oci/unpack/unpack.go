// Package unpack applies image layers to a directory the way a container runtime would, and
// unpacks an image once into the cache.
package unpack

import (
	"archive/tar"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"os"
	"path"
	"path/filepath"
	"strings"
	"syscall"
	"time"

	v1 "github.com/google/go-containerregistry/pkg/v1"
	"github.com/sirupsen/logrus"
)

// ErrLayer reports a layer entry that must not be applied: it would land outside the root.
var ErrLayer = errors.New("refused layer entry")

const (
	whiteoutPrefix = ".wh."
	opaqueWhiteout = ".wh..wh..opq"
)

// Unpack applies the layers of img, in order, to the empty directory root, the way a container
// runtime would: whiteouts (.wh.NAME removes NAME of lower layers; .wh..wh..opq empties its
// directory of lower layers' entries), modes, ownership, times, symlinks and hard links kept,
// device nodes skipped. An entry that would land outside root (an absolute name, "..", a
// write through a symlink an earlier entry planted, a hard link to outside) is refused with
// its name, and nothing is written outside root. It does not use go-containerregistry's
// mutate.Extract, which has had bugs with opaque whiteouts.
func Unpack(img v1.Image, root string, progress func(layer, layers int, bytes int64)) error {
	return ForEachLayer(img, func(tr *tar.Reader) error { return applyLayer(tr, root) }, progress)
}

// ForEachLayer runs apply on each layer of img, in order, uncompressed; progress, if set,
// hears of each layer when it is done.
func ForEachLayer(img v1.Image, apply func(*tar.Reader) error, progress func(layer, layers int, bytes int64)) error {
	layers, err := img.Layers()
	if err != nil {
		return err
	}
	for i, l := range layers {
		rc, err := l.Uncompressed()
		if err != nil {
			return fmt.Errorf("layer %d of %d: %w", i+1, len(layers), err)
		}
		counted := &countingReader{r: rc}
		err = apply(tar.NewReader(counted))
		rc.Close()
		if err != nil {
			return fmt.Errorf("layer %d of %d: %w", i+1, len(layers), err)
		}
		if progress != nil {
			progress(i+1, len(layers), counted.n)
		}
	}
	return nil
}

type countingReader struct {
	r io.Reader
	n int64
}

func (c *countingReader) Read(p []byte) (int, error) {
	n, err := c.r.Read(p)
	c.n += int64(n)
	return n, err
}

// entryPath checks a layer entry's name and returns it cleaned, relative to the root.
func entryPath(name string) (string, error) {
	if path.IsAbs(name) {
		return "", fmt.Errorf("%w %q: an absolute name", ErrLayer, name)
	}
	clean := path.Clean(name)
	if clean == ".." || strings.HasPrefix(clean, "../") {
		return "", fmt.Errorf("%w %q: it leaves the root", ErrLayer, name)
	}
	return clean, nil
}

// noSymlinkIn refuses rel when a directory on its way from root (not rel itself) is a symlink:
// writing there would follow a link that an earlier entry planted, possibly out of the root.
func noSymlinkIn(root, rel, name string) error {
	dir := path.Dir(rel)
	if dir == "." {
		return nil
	}
	p := root
	for _, part := range strings.Split(dir, "/") {
		p = filepath.Join(p, part)
		fi, err := os.Lstat(p)
		if errors.Is(err, os.ErrNotExist) {
			return nil // made as a directory below
		}
		if err != nil {
			return err
		}
		if fi.Mode()&os.ModeSymlink != 0 {
			return fmt.Errorf("%w %q: it would be written through the symlink %s", ErrLayer, name, strings.TrimPrefix(p, root))
		}
		if !fi.IsDir() {
			return fmt.Errorf("%w %q: %s is not a directory", ErrLayer, name, strings.TrimPrefix(p, root))
		}
	}
	return nil
}

func applyLayer(tr *tar.Reader, root string) error {
	created := map[string]bool{} // entries of this layer, which its opaque whiteouts keep
	type dirTime struct {
		path string
		t    time.Time
	}
	var dirTimes []dirTime // set last: writing into a directory changes its time
	for {
		hdr, err := tr.Next()
		if err == io.EOF {
			break
		}
		if err != nil {
			return err
		}
		rel, err := entryPath(hdr.Name)
		if err != nil {
			return err
		}
		if rel == "." {
			continue
		}
		if err := noSymlinkIn(root, rel, hdr.Name); err != nil {
			return err
		}
		target := filepath.Join(root, rel)
		base, parent := path.Base(rel), filepath.Dir(target)
		if base == opaqueWhiteout {
			if err := emptyLowerEntries(parent, rel, created); err != nil {
				return err
			}
			continue
		}
		if hidden, ok := strings.CutPrefix(base, whiteoutPrefix); ok {
			if hidden == "" || hidden == "." || hidden == ".." {
				return fmt.Errorf("%w %q: a whiteout of %q", ErrLayer, hdr.Name, hidden)
			}
			if err := os.RemoveAll(filepath.Join(parent, hidden)); err != nil {
				return err
			}
			continue
		}
		if err := os.MkdirAll(parent, 0o755); err != nil {
			return err
		}
		created[rel] = true
		mode := uint32(hdr.Mode & 0o7777)
		switch hdr.Typeflag {
		case tar.TypeDir:
			if fi, err := os.Lstat(target); err == nil && !fi.IsDir() {
				os.Remove(target)
			}
			if err := os.Mkdir(target, 0o755); err != nil && !errors.Is(err, os.ErrExist) {
				return err
			}
			dirTimes = append(dirTimes, dirTime{target, hdr.ModTime})
		case tar.TypeReg:
			if err := replaceable(target); err != nil {
				return err
			}
			f, err := os.OpenFile(target, os.O_WRONLY|os.O_CREATE|os.O_EXCL, 0o600)
			if err != nil {
				return err
			}
			_, err = io.Copy(f, tr)
			if cerr := f.Close(); err == nil {
				err = cerr
			}
			if err != nil {
				return fmt.Errorf("%s: %w", hdr.Name, err)
			}
		case tar.TypeSymlink:
			if err := replaceable(target); err != nil {
				return err
			}
			if err := os.Symlink(hdr.Linkname, target); err != nil {
				return err
			}
		case tar.TypeLink:
			linkRel, err := entryPath(hdr.Linkname)
			if err != nil {
				return fmt.Errorf("%w %q: its link target: %w", ErrLayer, hdr.Name, err)
			}
			if err := noSymlinkIn(root, linkRel, hdr.Name); err != nil {
				return err
			}
			if fi, err := os.Lstat(filepath.Join(root, linkRel)); err != nil || fi.Mode()&os.ModeSymlink != 0 {
				return fmt.Errorf("%w %q: hard link to %q, which is not a file of the root", ErrLayer, hdr.Name, hdr.Linkname)
			}
			if err := replaceable(target); err != nil {
				return err
			}
			if err := os.Link(filepath.Join(root, linkRel), target); err != nil {
				return err
			}
			continue // the link shares its target's mode and owner
		case tar.TypeFifo:
			if err := replaceable(target); err != nil {
				return err
			}
			if err := syscall.Mkfifo(target, mode); err != nil {
				return err
			}
		default:
			continue // device nodes and the like: a sandbox gets its own /dev
		}
		if err := os.Lchown(target, hdr.Uid, hdr.Gid); err != nil {
			return err
		}
		if hdr.Typeflag != tar.TypeSymlink {
			// chmod after chown: chown clears setuid and setgid bits.
			if err := syscall.Chmod(target, mode); err != nil {
				return err
			}
			if hdr.Typeflag != tar.TypeDir {
				os.Chtimes(target, hdr.ModTime, hdr.ModTime)
			}
		}
	}
	for i := len(dirTimes) - 1; i >= 0; i-- {
		os.Chtimes(dirTimes[i].path, dirTimes[i].t, dirTimes[i].t)
	}
	return nil
}

// replaceable removes what is at target (a lower layer's entry) so a new entry can take its
// place; never following a link.
func replaceable(target string) error {
	fi, err := os.Lstat(target)
	if errors.Is(err, os.ErrNotExist) {
		return nil
	}
	if err != nil {
		return err
	}
	if fi.IsDir() {
		return os.RemoveAll(target)
	}
	return os.Remove(target)
}

// emptyLowerEntries removes the entries of dir that lower layers made (an opaque whiteout),
// keeping those this layer made already.
func emptyLowerEntries(dir, whiteoutRel string, created map[string]bool) error {
	entries, err := os.ReadDir(dir)
	if errors.Is(err, os.ErrNotExist) {
		return nil
	}
	if err != nil {
		return err
	}
	relDir := path.Dir(whiteoutRel)
	for _, e := range entries {
		rel := path.Join(relDir, e.Name())
		if created[rel] {
			continue
		}
		if err := os.RemoveAll(filepath.Join(dir, e.Name())); err != nil {
			return err
		}
	}
	return nil
}

// ContentDigest is the digest of what an image's layers hold, whatever carries them (an OCI
// layout, a docker archive, a registry): their uncompressed digests, in order.
func ContentDigest(img v1.Image) (string, error) {
	cfg, err := img.ConfigFile()
	if err != nil {
		return "", err
	}
	var ids []string
	for _, id := range cfg.RootFS.DiffIDs {
		ids = append(ids, id.String())
	}
	data, _ := json.Marshal(ids)
	sum := sha256.Sum256(data)
	return "sha256:" + hex.EncodeToString(sum[:]), nil
}

// UnpackOnce unpacks img under cacheDir/rootfs/oci/<manifest digest>/rootfs, once: a second
// call for the same image unpacks nothing (and says so with unpacked false). Two runs unpacking
// the same image at once both end with the one complete directory.
func UnpackOnce(img v1.Image, cacheDir string, progress func(layer, layers int, bytes int64)) (dir string, unpacked bool, err error) {
	digest, err := img.Digest()
	if err != nil {
		return "", false, err
	}
	parent := filepath.Join(cacheDir, "rootfs", "oci")
	final := filepath.Join(parent, digest.Hex)
	if _, err := os.Stat(filepath.Join(final, "complete")); err == nil {
		return filepath.Join(final, "rootfs"), false, nil
	}
	if err := os.MkdirAll(parent, 0o755); err != nil {
		return "", false, err
	}
	tmp, err := os.MkdirTemp(parent, ".tmp-")
	if err != nil {
		return "", false, err
	}
	defer os.RemoveAll(tmp)
	root := filepath.Join(tmp, "rootfs")
	if err := os.Mkdir(root, 0o755); err != nil {
		return "", false, err
	}
	if err := Unpack(img, root, progress); err != nil {
		return "", false, err
	}
	if err := os.WriteFile(filepath.Join(tmp, "complete"), nil, 0o644); err != nil {
		return "", false, err
	}
	if err := os.Rename(tmp, final); err != nil {
		if _, statErr := os.Stat(filepath.Join(final, "complete")); statErr != nil {
			return "", false, fmt.Errorf("put %s in place: %w", final, err)
		}
		return filepath.Join(final, "rootfs"), false, nil
	}
	return filepath.Join(final, "rootfs"), true, nil
}

// LogLayers reports each finished layer of an unpack or a pull as a log line (what, layer I/N,
// MiB), in the log's format.
func LogLayers(log logrus.FieldLogger, what string) func(layer, layers int, bytes int64) {
	return func(layer, layers int, bytes int64) {
		log.WithFields(logrus.Fields{"layer": fmt.Sprintf("%d/%d", layer, layers), "mib": fmt.Sprintf("%.1f", float64(bytes)/(1<<20))}).Info(what)
	}
}
