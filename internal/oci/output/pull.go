package output

import (
	"archive/tar"
	"errors"
	"fmt"
	"io"
	"os"
	"path"
	"path/filepath"
	"strconv"
	"strings"

	v1 "github.com/google/go-containerregistry/pkg/v1"

	"readie.dev/pipeline/internal/oci/unpack"
	"readie.dev/pipeline/pkg/manifest"
)

// ErrImage reports an image that does not hold a pipeline output this pipeline can use.
var ErrImage = errors.New("not a usable checkpoint image")

// CheckProtocol refuses an image whose executor protocol differs from implemented, with the
// words a worker uses, before any layer is read.
func CheckProtocol(img v1.Image, implemented int) error {
	m, err := img.Manifest()
	if err != nil {
		return err
	}
	value, ok := m.Annotations[AnnotationProtocol]
	if !ok {
		return fmt.Errorf("%w: no %s annotation: not an image of `pipeline push`", ErrImage, AnnotationProtocol)
	}
	protocol, err := strconv.Atoi(value)
	if err != nil {
		return fmt.Errorf("%w: %s=%q", ErrImage, AnnotationProtocol, value)
	}
	return (&manifest.Manifest{ExecutorProtocol: protocol}).CheckProtocol(implemented)
}

// Extract writes the output held in img into dir (which must be empty): the files under Root,
// nothing else. An entry that would leave dir, or that is not a plain file or directory, is
// refused with its name.
func Extract(img v1.Image, dir string, progress func(layer, layers int, bytes int64)) error {
	return unpack.ForEachLayer(img, func(tr *tar.Reader) error { return extractLayer(tr, dir) }, progress)
}

func extractLayer(tr *tar.Reader, dir string) error {
	for {
		hdr, err := tr.Next()
		if err == io.EOF {
			return nil
		}
		if err != nil {
			return err
		}
		rel, ok := strings.CutPrefix(path.Clean(hdr.Name), Root)
		rel = strings.TrimPrefix(rel, "/")
		if !ok || (rel != "" && !filepath.IsLocal(rel)) || strings.HasPrefix(path.Clean(hdr.Name), Root+"..") {
			return fmt.Errorf("%w: entry %q is outside %s/", ErrImage, hdr.Name, Root)
		}
		target := filepath.Join(dir, rel)
		switch hdr.Typeflag {
		case tar.TypeDir:
			if err := os.MkdirAll(target, 0o755); err != nil {
				return err
			}
		case tar.TypeReg:
			if rel == "" || strings.Count(rel, "/") > 1 {
				return fmt.Errorf("%w: entry %q is not a file of an output", ErrImage, hdr.Name)
			}
			if err := os.MkdirAll(filepath.Dir(target), 0o755); err != nil {
				return err
			}
			f, err := os.OpenFile(target, os.O_WRONLY|os.O_CREATE|os.O_EXCL, os.FileMode(hdr.Mode).Perm())
			if err != nil {
				return err
			}
			_, err = io.Copy(f, tr)
			if err == nil {
				err = f.Sync()
			}
			if cerr := f.Close(); err == nil {
				err = cerr
			}
			if err != nil {
				return fmt.Errorf("%s: %w", hdr.Name, err)
			}
		default:
			return fmt.Errorf("%w: entry %q is not a plain file or directory", ErrImage, hdr.Name)
		}
	}
}
