// Package selfimage assembles the pipeline's own container image without a container engine:
// reproducible layers (sorted entries; fixed owners and times for the files it is given, a
// directory tree's own metadata), an OCI config with its annotations, an OCI layout. The same
// inputs give the same digest: nothing of the build host (its paths, the time of the build)
// goes into it.
package selfimage

import (
	"archive/tar"
	"bufio"
	"compress/gzip"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"os"
	"path"
	"path/filepath"
	"slices"
	"strings"
	"syscall"
	"time"

	v1 "github.com/google/go-containerregistry/pkg/v1"
	"github.com/google/go-containerregistry/pkg/v1/empty"
	"github.com/google/go-containerregistry/pkg/v1/layout"
	"github.com/google/go-containerregistry/pkg/v1/mutate"
	"github.com/google/go-containerregistry/pkg/v1/tarball"
	"github.com/google/go-containerregistry/pkg/v1/types"
	"golang.org/x/sys/unix"
)

// ErrInput reports a layer that cannot be assembled as given (a relative or repeated path, a
// file without content, an entry of a kind an image cannot hold).
var ErrInput = errors.New("bad image input")

// epoch is the time of every File: the same files give the same layer whenever it is built.
var epoch = time.Unix(0, 0).UTC()

// File is one entry at Path (absolute, in the image), owned by root, of time epoch: a regular
// file holding the bytes of Source (a host file) or Data, a directory (Dir), or a symbolic link
// to Link.
type File struct {
	Path   string
	Mode   fs.FileMode // permission bits, with fs.ModeSetuid, ModeSetgid, ModeSticky
	Source string
	Data   []byte
	Dir    bool
	Link   string
}

// Tree is the host directory Source placed at Path in the image with its own metadata: types,
// modes, owners, modification times to the nanosecond, hard links within it, device nodes, so
// that it is the same tree as the host's (Python checks each .pyc against its source's time:
// with other times every import would compile again, on a read-only root). Extended
// attributes are not carried.
type Tree struct {
	Path, Source string
}

// Layer is what one layer holds. The parent directories of its entries that it does not name
// are added (mode 0755, root, epoch).
type Layer struct {
	Name  string
	Files []File
	Trees []Tree
}

// entry is one tar entry to write: its header, and the host file its bytes come from.
type entry struct {
	hdr    tar.Header
	source string
	data   []byte
	inode  [2]uint64 // device and inode of a tree's regular file with several links, or zero
}

// imagePath checks an absolute image path and returns it as a tar name without the slash.
func imagePath(p string) (string, error) {
	if !path.IsAbs(p) || path.Clean(p) != p || p == "/" {
		return "", fmt.Errorf("%w: %q is not a clean absolute path below /", ErrInput, p)
	}
	return p[1:], nil
}

// entries lists the layer's entries, sorted by name, parents first.
func (l Layer) entries() ([]entry, error) {
	byName := map[string]entry{}
	add := func(e entry) error {
		if _, dup := byName[e.hdr.Name]; dup {
			return fmt.Errorf("%w: layer %s: %s is given twice", ErrInput, l.Name, e.hdr.Name)
		}
		byName[e.hdr.Name] = e
		return nil
	}
	for _, f := range l.Files {
		e, err := fileEntry(f)
		if err != nil {
			return nil, fmt.Errorf("layer %s: %w", l.Name, err)
		}
		if err := add(e); err != nil {
			return nil, err
		}
	}
	for _, t := range l.Trees {
		es, err := treeEntries(t)
		if err != nil {
			return nil, fmt.Errorf("layer %s: %w", l.Name, err)
		}
		for _, e := range es {
			if err := add(e); err != nil {
				return nil, err
			}
		}
	}
	for name := range byName {
		for dir := path.Dir(strings.TrimSuffix(name, "/")); dir != "."; dir = path.Dir(dir) {
			if _, ok := byName[dir]; !ok {
				byName[dir] = entry{hdr: tar.Header{Typeflag: tar.TypeDir, Name: dir, Mode: 0o755, ModTime: epoch}}
			}
		}
	}
	names := slices.Sorted(func(yield func(string) bool) {
		for name := range byName {
			if !yield(name) {
				return
			}
		}
	})
	out := make([]entry, 0, len(names))
	for _, name := range names {
		e := byName[name]
		if e.hdr.Typeflag == tar.TypeDir {
			e.hdr.Name += "/"
		}
		e.hdr.Format = tar.FormatPAX
		out = append(out, e)
	}
	return out, nil
}

// tarMode returns the tar header mode of m's permission bits and its setuid, setgid and sticky
// bits.
func tarMode(m fs.FileMode) int64 {
	mode := int64(m.Perm())
	if m&fs.ModeSetuid != 0 {
		mode |= 0o4000
	}
	if m&fs.ModeSetgid != 0 {
		mode |= 0o2000
	}
	if m&fs.ModeSticky != 0 {
		mode |= 0o1000
	}
	return mode
}

func fileEntry(f File) (entry, error) {
	name, err := imagePath(f.Path)
	if err != nil {
		return entry{}, err
	}
	hdr := tar.Header{Name: name, Mode: tarMode(f.Mode), ModTime: epoch}
	switch {
	case f.Dir:
		hdr.Typeflag = tar.TypeDir
		return entry{hdr: hdr}, nil
	case f.Link != "":
		hdr.Typeflag, hdr.Linkname, hdr.Mode = tar.TypeSymlink, f.Link, 0o777
		return entry{hdr: hdr}, nil
	case f.Source != "":
		fi, err := os.Stat(f.Source)
		if err != nil {
			return entry{}, fmt.Errorf("%w: %s: %w", ErrInput, f.Path, err)
		}
		if !fi.Mode().IsRegular() {
			return entry{}, fmt.Errorf("%w: %s: %s is not a regular file", ErrInput, f.Path, f.Source)
		}
		hdr.Typeflag, hdr.Size = tar.TypeReg, fi.Size()
		return entry{hdr: hdr, source: f.Source}, nil
	case f.Data != nil:
		hdr.Typeflag, hdr.Size = tar.TypeReg, int64(len(f.Data))
		return entry{hdr: hdr, data: f.Data}, nil
	}
	return entry{}, fmt.Errorf("%w: %s is neither a directory, a link nor a file with content", ErrInput, f.Path)
}

// treeEntries lists the tree's entries with their own metadata, named under t.Path.
func treeEntries(t Tree) ([]entry, error) {
	base, err := imagePath(t.Path)
	if err != nil {
		return nil, err
	}
	var out []entry
	err = filepath.WalkDir(t.Source, func(p string, d fs.DirEntry, err error) error {
		if err != nil {
			return err
		}
		fi, err := os.Lstat(p)
		if err != nil {
			return err
		}
		st, ok := fi.Sys().(*syscall.Stat_t)
		if !ok {
			return fmt.Errorf("%s: no stat", p)
		}
		rel, err := filepath.Rel(t.Source, p)
		if err != nil {
			return err
		}
		hdr := tar.Header{
			Name: path.Join(base, filepath.ToSlash(rel)), Mode: tarMode(fi.Mode()),
			Uid: int(st.Uid), Gid: int(st.Gid), ModTime: time.Unix(st.Mtim.Sec, st.Mtim.Nsec).UTC(),
		}
		e := entry{}
		switch m := fi.Mode(); {
		case m.IsDir():
			hdr.Typeflag = tar.TypeDir
		case m.IsRegular():
			hdr.Typeflag, hdr.Size, e.source = tar.TypeReg, fi.Size(), p
			if st.Nlink > 1 {
				e.inode = [2]uint64{st.Dev, st.Ino}
			}
		case m&fs.ModeSymlink != 0:
			hdr.Typeflag = tar.TypeSymlink
			if hdr.Linkname, err = os.Readlink(p); err != nil {
				return err
			}
		case m&fs.ModeCharDevice != 0, m&fs.ModeDevice != 0:
			hdr.Typeflag = tar.TypeBlock
			if m&fs.ModeCharDevice != 0 {
				hdr.Typeflag = tar.TypeChar
			}
			hdr.Devmajor, hdr.Devminor = int64(unix.Major(st.Rdev)), int64(unix.Minor(st.Rdev))
		case m&fs.ModeNamedPipe != 0:
			hdr.Typeflag = tar.TypeFifo
		default:
			return fmt.Errorf("%w: %s: a %s cannot be in an image", ErrInput, p, m.Type())
		}
		e.hdr = hdr
		out = append(out, e)
		return nil
	})
	if err != nil {
		return nil, fmt.Errorf("tree %s: %w", t.Source, err)
	}
	return out, nil
}

// WriteTar writes the layer's tar to w: entries sorted by name; a regular file of a tree that
// shares its inode with an earlier one is a hard link to it.
func (l Layer) WriteTar(w io.Writer) error {
	entries, err := l.entries()
	if err != nil {
		return err
	}
	tw := tar.NewWriter(w)
	first := map[[2]uint64]string{}
	for _, e := range entries {
		if e.inode != ([2]uint64{}) {
			if target, ok := first[e.inode]; ok {
				e.hdr.Typeflag, e.hdr.Linkname, e.hdr.Size, e.source = tar.TypeLink, target, 0, ""
			} else {
				first[e.inode] = e.hdr.Name
			}
		}
		if err := tw.WriteHeader(&e.hdr); err != nil {
			return fmt.Errorf("%s: %w", e.hdr.Name, err)
		}
		if err := writeContent(tw, e); err != nil {
			return err
		}
	}
	return tw.Close()
}

func writeContent(tw *tar.Writer, e entry) error {
	if e.data != nil {
		_, err := tw.Write(e.data)
		return err
	}
	if e.source == "" {
		return nil
	}
	f, err := os.Open(e.source)
	if err != nil {
		return err
	}
	defer f.Close()
	// Exactly the size the header says: a file that changed since it was listed fails here.
	if _, err := io.CopyN(tw, f, e.hdr.Size); err != nil {
		return fmt.Errorf("%s: %w", e.source, err)
	}
	return nil
}

// WriteLayer writes the layer's gzip (fixed level, no name or time in its header) into the
// directory scratch and returns it as a layer read from that file.
func WriteLayer(l Layer, scratch string) (v1.Layer, error) {
	blob := filepath.Join(scratch, l.Name+".tar.gz")
	f, err := os.OpenFile(blob, os.O_WRONLY|os.O_CREATE|os.O_EXCL, 0o600)
	if err != nil {
		return nil, err
	}
	buffered := bufio.NewWriterSize(f, 1<<16)
	gz, err := gzip.NewWriterLevel(buffered, gzip.BestSpeed)
	if err == nil {
		err = l.WriteTar(gz)
	}
	if err == nil {
		err = gz.Close()
	}
	if err == nil {
		err = buffered.Flush()
	}
	if err = errors.Join(err, f.Close()); err != nil {
		return nil, fmt.Errorf("layer %s: %w", l.Name, err)
	}
	return tarball.LayerFromFile(blob, tarball.WithMediaType(types.OCILayer))
}

// Config is the image's run-time config and what it says about itself.
type Config struct {
	Entrypoint []string
	Env        []string
	// Created is the image's time: a time of its sources (the commit's), never the build's.
	Created time.Time
	// Annotations go on the manifest, and as labels into the config.
	Annotations map[string]string
}

// Image returns an OCI image of the layers (names for its history, in order) and c.
func Image(layers []v1.Layer, names []string, c Config) (v1.Image, error) {
	created := v1.Time{Time: c.Created.UTC()}
	img, err := mutate.ConfigFile(empty.Image, &v1.ConfigFile{
		Architecture: "amd64", OS: "linux", Created: created,
		Config: v1.Config{Entrypoint: c.Entrypoint, Env: c.Env, Labels: c.Annotations},
		RootFS: v1.RootFS{Type: "layers"},
	})
	if err != nil {
		return nil, err
	}
	img = mutate.MediaType(img, types.OCIManifestSchema1)
	img = mutate.ConfigMediaType(img, types.OCIConfigJSON)
	for i, l := range layers {
		img, err = mutate.Append(img, mutate.Addendum{Layer: l, History: v1.History{Created: created, CreatedBy: "readie pipeline-image: " + names[i]}})
		if err != nil {
			return nil, err
		}
	}
	return mutate.Annotations(img, c.Annotations).(v1.Image), nil
}

// WriteLayout writes img as the only image of a new OCI layout at dir, replacing what dir
// held only once the new layout is complete.
func WriteLayout(dir string, img v1.Image) error {
	tmp, err := os.MkdirTemp(filepath.Dir(dir), "."+filepath.Base(dir)+".tmp-")
	if err != nil {
		return err
	}
	defer os.RemoveAll(tmp)
	if err := os.Chmod(tmp, 0o755); err != nil { // MkdirTemp's 0700 is not a layout's
		return err
	}
	p, err := layout.Write(tmp, empty.Index)
	if err != nil {
		return err
	}
	if err := p.AppendImage(img); err != nil {
		return fmt.Errorf("write OCI layout: %w", err)
	}
	old := tmp + ".old"
	if err := os.Rename(dir, old); err != nil && !errors.Is(err, os.ErrNotExist) {
		return err
	}
	if err := os.Rename(tmp, dir); err != nil {
		return err
	}
	return os.RemoveAll(old)
}
