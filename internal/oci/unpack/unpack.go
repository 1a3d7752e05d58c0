// Package unpack applies image layers to a directory the way a container runtime would, with
// one set of rules (Applier), and unpacks an image once into the cache (IntoCache). Every
// layer is read through package verify: nothing is marked complete unless every byte matched
// its digest.
package unpack

import (
	"archive/tar"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io/fs"
	"os"
	"path/filepath"
	"syscall"
	"time"

	v1 "github.com/google/go-containerregistry/pkg/v1"
	"github.com/sirupsen/logrus"

	"readie.dev/pipeline/internal/oci/verify"
	"readie.dev/pipeline/pkg/atomicfile"
)

// Into applies the layers of img, in order and verified, to the empty directory dir (see
// Applier), within limits. done, when set, hears of each verified layer.
func Into(ctx context.Context, img v1.Image, dir string, limits Limits, done func(verify.Layer)) (*verify.Image, error) {
	root, err := os.OpenRoot(dir)
	if err != nil {
		return nil, err
	}
	defer root.Close()
	a := NewApplier(root, NewBudget(limits))
	return verify.Layers(ctx, img, func(_ verify.Layer, tr *tar.Reader) error { return a.Apply(tr) }, done)
}

// Unpacked is an image unpacked into the cache.
type Unpacked struct {
	// Dir is the root filesystem; nothing writes it again.
	Dir string `json:"-"`
	// Manifest is the digest of the image's manifest, which names the directory.
	Manifest string `json:"manifest"`
	// Content is the digest of its verified layers' diff IDs (verify.Image.Content).
	Content string `json:"content"`
	// Made says this call unpacked it.
	Made bool `json:"-"`
}

// recordName is the file beside rootfs/ that says an unpack is complete and what it holds; it
// is written last.
const recordName = "unpack.json"

// IntoCache unpacks img, verified, into cacheDir/rootfs/oci/<manifest digest>/rootfs, once
// (Once): a later call, from any run, finds it complete and reads what it holds from the
// record written beside it. The directory is named by the digest of the manifest's own bytes,
// which names every other byte through the digests it holds, and is complete only when all of
// them matched: an image whose config claims another image's diff IDs is refused, never served
// the other's directory.
func IntoCache(ctx context.Context, img v1.Image, cacheDir string, limits Limits, log logrus.FieldLogger, done func(verify.Layer)) (*Unpacked, error) {
	raw, err := img.RawManifest()
	if err != nil {
		return nil, fmt.Errorf("read the manifest: %w", err)
	}
	manifest := verify.Sum(raw)
	var got Unpacked
	complete := func(dir string) (bool, error) {
		data, err := os.ReadFile(filepath.Join(dir, recordName))
		if errors.Is(err, fs.ErrNotExist) || errors.Is(err, syscall.ENOTDIR) { // ENOTDIR: a stray file at its place, removed
			return false, nil
		} else if err != nil {
			return false, fmt.Errorf("unpacked image %s: %w", dir, err)
		}
		return json.Unmarshal(data, &got) == nil && got.Manifest == manifest.String() && got.Content != "", nil
	}
	dir, made, err := Once(ctx, filepath.Join(cacheDir, "rootfs", "oci"), manifest.Hex, complete, func(tmp string) error {
		root := filepath.Join(tmp, "rootfs")
		if err := os.Mkdir(root, 0o755); err != nil {
			return err
		}
		image, err := Into(ctx, img, root, limits, done)
		if err != nil {
			return err
		}
		if image.Manifest != manifest {
			return fmt.Errorf("%w: the manifest changed while it was read (%s, then %s)", verify.ErrDigest, manifest, image.Manifest)
		}
		got = Unpacked{Manifest: manifest.String(), Content: image.Content}
		return atomicfile.WriteJSON(filepath.Join(tmp, recordName), got)
	}, log)
	if err != nil {
		return nil, err
	}
	if !made {
		// Its last use, for `cache prune-rootfs --older-than` (LastUse).
		now := time.Now()
		if err := os.Chtimes(filepath.Join(dir, recordName), now, now); err != nil {
			log.WithError(err).WithField("dir", dir).Warn("could not record the unpacked image's use")
		}
	}
	got.Dir, got.Made = filepath.Join(dir, "rootfs"), made
	return &got, nil
}

// LastUse returns when the image unpacked in dir (a directory of cacheDir/rootfs/oci) was last
// unpacked or used, and whether dir is a complete unpacked image at all.
func LastUse(dir string) (time.Time, bool) {
	fi, err := os.Stat(filepath.Join(dir, recordName))
	if err != nil || !fi.Mode().IsRegular() {
		return time.Time{}, false
	}
	return fi.ModTime(), true
}

// LogLayers reports each verified layer of an unpack or a pull as one log line: what, the
// layer (I/N), its uncompressed and its compressed MiB.
func LogLayers(log logrus.FieldLogger, what string) func(verify.Layer) {
	return func(l verify.Layer) {
		log.WithFields(logrus.Fields{
			"layer": fmt.Sprintf("%d/%d", l.Index, l.Count), "mib": mib(l.Uncompressed), "compressed_mib": mib(l.Compressed),
		}).Info(what)
	}
}

func mib(n int64) string { return fmt.Sprintf("%.1f", float64(n)/(1<<20)) }
