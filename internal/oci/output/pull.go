package output

import (
	"archive/tar"
	"context"
	"errors"
	"fmt"
	"io"
	"os"
	"path"
	"path/filepath"
	"slices"
	"strconv"
	"strings"

	v1 "github.com/google/go-containerregistry/pkg/v1"

	"readie.dev/pipeline/internal/oci/unpack"
	"readie.dev/pipeline/internal/oci/verify"
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

// Extract writes the output held in img into dir (which must be empty), every layer but the
// runtime's (RuntimeLayers) verified
// (package verify) and within limits: exactly the files under Root/ (the top-level files and
// those of one directory level), nothing else. An entry anywhere else, a deeper one, or one
// that is not a plain file or directory is refused with its name. done, when set, hears of
// each verified layer.
func Extract(ctx context.Context, img v1.Image, dir string, limits unpack.Limits, done func(verify.Layer)) error {
	root, err := os.OpenRoot(dir)
	if err != nil {
		return err
	}
	defer root.Close()
	runtime, err := RuntimeLayers(img)
	if err != nil {
		return err
	}
	budget := unpack.NewBudget(limits)
	isOutput := func(l verify.Layer) bool { return l.Digest != runtime.Runsc && l.Digest != runtime.Rootfs }
	_, err = verify.SomeLayers(ctx, img, isOutput, func(_ verify.Layer, tr *tar.Reader) error { return extractLayer(tr, root, budget) }, done)
	return err
}

// RuntimeDigests are the digests of an image's runtime layers (zero when it has none).
type RuntimeDigests struct{ Runsc, Rootfs v1.Hash }

// RuntimeLayers returns the digests the image's annotations give its runtime layers, each one
// a layer of the image's manifest.
func RuntimeLayers(img v1.Image) (RuntimeDigests, error) {
	m, err := img.Manifest()
	if err != nil {
		return RuntimeDigests{}, err
	}
	var d RuntimeDigests
	for key, h := range map[string]*v1.Hash{AnnotationRuntimeRunsc: &d.Runsc, AnnotationRuntimeRootfs: &d.Rootfs} {
		value, ok := m.Annotations[key]
		if !ok {
			continue
		}
		if *h, err = v1.NewHash(value); err != nil {
			return RuntimeDigests{}, fmt.Errorf("%w: %s=%q: %w", ErrImage, key, value, err)
		}
		if !slices.ContainsFunc(m.Layers, func(l v1.Descriptor) bool { return l.Digest == *h }) {
			return RuntimeDigests{}, fmt.Errorf("%w: %s=%s is no layer of the image", ErrImage, key, value)
		}
	}
	return d, nil
}

func extractLayer(tr *tar.Reader, root *os.Root, budget *unpack.Budget) error {
	for {
		hdr, err := tr.Next()
		if err == io.EOF {
			return nil
		}
		if err != nil {
			return err
		}
		if err := budget.Take(hdr); err != nil {
			return err
		}
		rel, err := outputPath(hdr.Name)
		if err != nil {
			return err
		}
		switch {
		case hdr.Typeflag == tar.TypeDir && !strings.Contains(rel, "/"):
			if rel != "" {
				if err := root.MkdirAll(rel, 0o755); err != nil {
					return err
				}
			}
		case hdr.Typeflag == tar.TypeReg && rel != "" && strings.Count(rel, "/") <= 1:
			if err := extractFile(tr, root, rel); err != nil {
				return fmt.Errorf("%s: %w", hdr.Name, err)
			}
		default:
			return fmt.Errorf("%w: entry %q is not a file or directory of an output", ErrImage, hdr.Name)
		}
	}
}

// outputPath returns an entry's path relative to Root/, or an error when it lies anywhere else.
func outputPath(name string) (string, error) {
	clean := path.Clean(name)
	if clean == Root {
		return "", nil
	}
	rel, ok := strings.CutPrefix(clean, Root+"/")
	if !ok || !filepath.IsLocal(rel) {
		return "", fmt.Errorf("%w: entry %q is outside %s/", ErrImage, name, Root)
	}
	return rel, nil
}

// pulledPerm returns the mode of a pulled output's file, whatever the image's tar says (a
// stranger's image may say 0777): the modes of an output the pipeline writes, image files 0400
// (they hold process memory, and are linked, never written in place) and the rest 0444.
func pulledPerm(rel string) os.FileMode {
	if strings.HasSuffix(rel, ".img") {
		return 0o400
	}
	return 0o444
}

func extractFile(r io.Reader, root *os.Root, rel string) error {
	if dir := path.Dir(rel); dir != "." {
		if err := root.MkdirAll(dir, 0o755); err != nil {
			return err
		}
	}
	f, err := root.OpenFile(rel, os.O_WRONLY|os.O_CREATE|os.O_EXCL, pulledPerm(rel))
	if err != nil {
		return err
	}
	_, err = io.Copy(f, r)
	if err == nil {
		err = f.Sync()
	}
	return errors.Join(err, f.Close())
}
