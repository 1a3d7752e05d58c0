package unpack

import (
	"archive/tar"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"os"
	"path"
	"strings"
	"syscall"
	"time"
)

// ErrLayer reports a layer entry that must not be applied: it would land outside the root.
var ErrLayer = errors.New("refused layer entry")

const (
	whiteoutPrefix = ".wh."
	opaqueWhiteout = ".wh..wh..opq"
)

// Applier applies layers, in order, to one directory, the way a container runtime would, with
// the rules of the OCI image spec: .wh.NAME hides NAME of lower layers; .wh..wh..opq hides
// every lower layer's entry in its directory, nested ones included, and keeps this layer's,
// before or after the marker; modes (setuid included), owners, times, symlinks, hard links and
// FIFOs are kept, device nodes skipped (a sandbox gets its own /dev). Every entry is made
// through an os.Root; an entry that would land outside the root (an absolute name, "..", a
// write through a symlink, a hard link to outside, a whiteout of "..") is refused with its
// name. An existing file is replaced, never written into: it may be a hard link to a base
// that must not change. Entries count against a Budget before anything of them is written.
type Applier struct {
	root   *os.Root
	budget *Budget
}

// NewApplier applies layers to root, counting against budget.
func NewApplier(root *os.Root, budget *Budget) *Applier {
	return &Applier{root: root, budget: budget}
}

// Apply applies one layer.
func (a *Applier) Apply(tr *tar.Reader) error {
	l := &layerState{Applier: a, inLayer: map[string]bool{}, dirs: map[string]bool{}}
	for {
		hdr, err := tr.Next()
		if err == io.EOF {
			break
		}
		if err != nil {
			return err
		}
		if err := a.budget.Take(hdr); err != nil {
			return err
		}
		if err := l.entry(hdr, tr); err != nil {
			return err
		}
	}
	// Last, deepest first: making entries in a directory changes its time.
	for i := len(l.dirTimes) - 1; i >= 0; i-- {
		a.root.Chtimes(l.dirTimes[i].rel, l.dirTimes[i].t, l.dirTimes[i].t)
	}
	return nil
}

type dirTime struct {
	rel string
	t   time.Time
}

// layerState is what applying one layer keeps: the paths it holds (its entries and their
// parents, which its opaque whiteouts keep), its directories' times, and the paths known to be
// directories. That last spares walking every entry's parents again through the os.Root (a
// lookup per component, for each of them): it was most of an unpack's time. Every removal
// forgets it whole, so it only ever holds directories as they are now.
type layerState struct {
	*Applier
	inLayer  map[string]bool
	dirTimes []dirTime
	dirs     map[string]bool
}

func (l *layerState) entry(hdr *tar.Header, r io.Reader) error {
	rel, err := entryPath(hdr.Name)
	if err != nil || rel == "." {
		return err
	}
	if err := l.noSymlinkIn(rel, hdr.Name); err != nil {
		return err
	}
	base, dir := path.Base(rel), path.Dir(rel)
	for p := dir; p != "."; p = path.Dir(p) {
		l.inLayer[p] = true
	}
	if base == opaqueWhiteout {
		return l.hideLower(dir)
	}
	if hidden, ok := strings.CutPrefix(base, whiteoutPrefix); ok {
		return l.whiteout(dir, hidden, hdr.Name)
	}
	l.inLayer[rel] = true
	if dir != "." && !l.dirs[dir] {
		if err := l.root.MkdirAll(dir, 0o755); err != nil {
			return err
		}
		for p := dir; p != "."; p = path.Dir(p) {
			l.dirs[p] = true
		}
	}
	made, err := l.make(rel, hdr, r)
	if err != nil || !made {
		return err
	}
	if !isRegular(hdr) { // writeFile set a file's owner and mode through its descriptor
		if err := l.root.Lchown(rel, hdr.Uid, hdr.Gid); err != nil {
			return err
		}
		// chmod after chown: chown clears the setuid and setgid bits.
		if err := l.root.Chmod(rel, fileMode(hdr.Mode)); err != nil {
			return err
		}
	}
	if hdr.Typeflag != tar.TypeDir {
		l.root.Chtimes(rel, hdr.ModTime, hdr.ModTime)
	}
	return nil
}

// whiteout hides name of lower layers (.wh.NAME in dir), never this layer's own: of a
// directory this layer also lists, only the lower layers' entries go.
func (l *layerState) whiteout(dir, name, entry string) error {
	if name == "" || name == "." || name == ".." || strings.Contains(name, "/") {
		return fmt.Errorf("%w %q: a whiteout of %q", ErrLayer, entry, name)
	}
	p := path.Join(dir, name)
	if !l.inLayer[p] {
		return l.removeAll(p)
	}
	if fi, err := l.root.Lstat(p); err == nil && fi.IsDir() {
		return l.hideLower(p)
	}
	return nil
}

// make makes the entry at rel (replacing a lower layer's) and says whether its mode, owner and
// times are still to be set: a symlink and a hard link are done, and so are what a sandbox
// never sees (device nodes: it gets its own /dev).
func (l *layerState) make(rel string, hdr *tar.Header, r io.Reader) (bool, error) {
	switch {
	case hdr.Typeflag == tar.TypeDir:
		if fi, err := l.root.Lstat(rel); err == nil && !fi.IsDir() {
			if err := l.remove(rel); err != nil {
				return false, err
			}
		}
		if err := l.root.Mkdir(rel, 0o755); err != nil && !errors.Is(err, fs.ErrExist) {
			return false, err
		}
		l.dirs[rel] = true
		l.dirTimes = append(l.dirTimes, dirTime{rel, hdr.ModTime})
		return true, nil
	case isRegular(hdr):
		if err := l.replace(rel); err != nil {
			return false, err
		}
		return true, l.writeFile(rel, hdr, r)
	case hdr.Typeflag == tar.TypeSymlink:
		if err := l.replace(rel); err != nil {
			return false, err
		}
		if err := l.root.Symlink(hdr.Linkname, rel); err != nil {
			return false, err
		}
		return false, l.root.Lchown(rel, hdr.Uid, hdr.Gid)
	case hdr.Typeflag == tar.TypeLink:
		return false, l.link(rel, hdr)
	case hdr.Typeflag == tar.TypeFifo:
		if err := l.replace(rel); err != nil {
			return false, err
		}
		return true, l.mkfifo(path.Dir(rel), path.Base(rel))
	}
	return false, nil
}

// writeFile makes the file at rel with hdr's content, owner and mode (chmod after chown:
// chown clears the setuid and setgid bits).
func (l *layerState) writeFile(rel string, hdr *tar.Header, r io.Reader) error {
	f, err := l.root.OpenFile(rel, os.O_WRONLY|os.O_CREATE|os.O_EXCL, 0o600)
	if err != nil {
		return err
	}
	n, err := io.Copy(f, r)
	if err == nil && n != hdr.Size {
		err = io.ErrUnexpectedEOF
	}
	if err == nil {
		err = f.Chown(hdr.Uid, hdr.Gid)
	}
	if err == nil {
		err = f.Chmod(fileMode(hdr.Mode))
	}
	if cerr := f.Close(); err == nil {
		err = cerr
	}
	if err != nil {
		return fmt.Errorf("%s: %w", hdr.Name, err)
	}
	return nil
}

func (l *layerState) link(rel string, hdr *tar.Header) error {
	target, err := entryPath(hdr.Linkname)
	if err != nil {
		return fmt.Errorf("%w %q: its link target: %w", ErrLayer, hdr.Name, err)
	}
	if err := l.noSymlinkIn(target, hdr.Name); err != nil {
		return err
	}
	if fi, err := l.root.Lstat(target); err != nil || !fi.Mode().IsRegular() && fi.Mode()&fs.ModeNamedPipe == 0 {
		return fmt.Errorf("%w %q: hard link to %q, which is not a file of the root", ErrLayer, hdr.Name, hdr.Linkname)
	}
	if target == rel {
		return nil
	}
	if err := l.replace(rel); err != nil {
		return err
	}
	return l.root.Link(target, rel) // a link shares its target's mode and owner
}

func (l *layerState) mkfifo(dir, base string) error {
	d, err := l.root.Open(dir)
	if err != nil {
		return err
	}
	defer d.Close()
	return syscall.Mknodat(int(d.Fd()), base, syscall.S_IFIFO|0o600, 0)
}

// replace removes what is at rel (a lower layer's entry) so a new entry can take its place;
// never following a link, never writing into a file that may be shared.
func (l *layerState) replace(rel string) error {
	fi, err := l.root.Lstat(rel)
	if errors.Is(err, fs.ErrNotExist) {
		return nil
	}
	if err != nil {
		return err
	}
	if fi.IsDir() {
		return l.removeAll(rel)
	}
	return l.remove(rel)
}

// remove and removeAll forget the directories known (some may be gone) and remove rel.
func (l *layerState) remove(rel string) error {
	clear(l.dirs)
	return l.root.Remove(rel)
}

func (l *layerState) removeAll(rel string) error {
	clear(l.dirs)
	return l.root.RemoveAll(rel)
}

// hideLower removes from dir every entry that lower layers made (an opaque whiteout), nested
// ones included: a directory this layer also lists stays, but only with this layer's entries.
func (l *layerState) hideLower(dir string) error {
	d, err := l.root.Open(dir)
	if errors.Is(err, fs.ErrNotExist) {
		return nil
	}
	if err != nil {
		return err
	}
	entries, err := d.ReadDir(-1)
	d.Close()
	if err != nil {
		return err
	}
	for _, e := range entries {
		p := path.Join(dir, e.Name())
		switch {
		case !l.inLayer[p]:
			if err := l.removeAll(p); err != nil {
				return err
			}
		case e.IsDir():
			if err := l.hideLower(p); err != nil {
				return err
			}
		}
	}
	return nil
}

// noSymlinkIn refuses rel when a directory on its way from the root (not rel itself) is a
// symlink or not a directory: writing there would follow a link an earlier entry planted.
// os.Root would keep such a write inside the root; this says which entry and which link.
func (l *layerState) noSymlinkIn(rel, name string) error {
	dir := path.Dir(rel)
	if dir == "." {
		return nil
	}
	p := ""
	for _, part := range strings.Split(dir, "/") {
		p = path.Join(p, part)
		if l.dirs[p] {
			continue
		}
		fi, err := l.root.Lstat(p)
		if errors.Is(err, fs.ErrNotExist) {
			return nil // made as a directory
		}
		if err != nil {
			return err
		}
		if fi.Mode()&fs.ModeSymlink != 0 {
			return fmt.Errorf("%w %q: it would be written through the symlink /%s", ErrLayer, name, p)
		}
		if !fi.IsDir() {
			return fmt.Errorf("%w %q: /%s is not a directory", ErrLayer, name, p)
		}
		l.dirs[p] = true
	}
	return nil
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

// fileMode returns a tar mode as an os.FileMode: permissions, setuid, setgid and sticky bits.
func fileMode(mode int64) os.FileMode {
	m := os.FileMode(mode & 0o777)
	if mode&0o4000 != 0 {
		m |= os.ModeSetuid
	}
	if mode&0o2000 != 0 {
		m |= os.ModeSetgid
	}
	if mode&0o1000 != 0 {
		m |= os.ModeSticky
	}
	return m
}
