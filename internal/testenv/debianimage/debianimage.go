// Package debianimage builds Debian images as a user's image build would, for the tests of images
// the pipeline did not make (Debian 13: Python 3.13, numpy 2), cached like the default rootfs.
package debianimage

import (
	"compress/gzip"
	"context"
	"crypto/sha256"
	"encoding/hex"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"

	v1 "github.com/google/go-containerregistry/pkg/v1"
	"github.com/google/go-containerregistry/pkg/v1/empty"
	"github.com/google/go-containerregistry/pkg/v1/layout"
	"github.com/google/go-containerregistry/pkg/v1/mutate"
	"github.com/google/go-containerregistry/pkg/v1/tarball"
	"github.com/sirupsen/logrus"

	"readie.dev/pipeline/internal/config"
	"readie.dev/pipeline/internal/oci/unpack"
	"readie.dev/pipeline/pkg/manifest"
)

// Packages are what a Debian image of DebianLayout holds besides minbase.
var Packages = []string{"python3", "python3-cloudpickle", "python3-numpy", "python3-pandas"}

// Layout returns an OCI layout (one layer, tagged "latest") of Debian suite as
// mmdebstrap makes it from Debian's own archive (minbase plus Packages), as a user's
// image build would: built once, about 20 s, and cached under {cache}/images like the default
// rootfs, so that a second `make test` pays nothing. Call it before the test moves
// XDG_CACHE_HOME. The mirror is READIE_DEBIAN_MIRROR's, as in `make image`.
func Layout(t testing.TB, suite string) string {
	t.Helper()
	mirror := os.Getenv("READIE_DEBIAN_MIRROR")
	if mirror == "" {
		mirror = "http://deb.debian.org/debian"
	}
	// The recipe names the directory: another package list or mirror builds another.
	recipe := sha256.Sum256([]byte(strings.Join(append([]string{suite, mirror, "minbase", "gzip-1"}, Packages...), "\x00")))
	name := "debian-" + suite + "-" + hex.EncodeToString(recipe[:8])
	ctx, cancel := context.WithTimeout(context.Background(), 15*time.Minute)
	defer cancel()
	complete := func(dir string) (bool, error) {
		_, err := os.Stat(filepath.Join(dir, "complete"))
		return err == nil, nil
	}
	log := logrus.New()
	log.SetOutput(testWriter{t})
	dir, _, err := unpack.Once(ctx, filepath.Join(config.CacheDir(), "images"), name, complete, func(tmp string) error {
		return buildDebianLayout(ctx, t, suite, mirror, tmp)
	}, log)
	if err != nil {
		t.Fatalf("the Debian %s image: %v", suite, err)
	}
	return filepath.Join(dir, "layout")
}

// buildDebianLayout runs mmdebstrap into a tar in tmp and writes it as an OCI layout at
// tmp/layout: one gzip layer, a config whose Env has Debian's PATH.
func buildDebianLayout(ctx context.Context, t testing.TB, suite, mirror, tmp string) error {
	t.Logf("building the Debian %s image with mmdebstrap (once; cached)", suite)
	rootfsTar := filepath.Join(tmp, "rootfs.tar")
	cmd := exec.CommandContext(ctx, "mmdebstrap", "--variant=minbase", "--include="+strings.Join(Packages, ","), "--quiet", suite, rootfsTar, mirror)
	cmd.WaitDelay = 10 * time.Second
	if out, err := cmd.CombinedOutput(); err != nil {
		return fmt.Errorf("mmdebstrap %s: %w\n%s", suite, err, out)
	}
	layer, err := tarball.LayerFromFile(rootfsTar, tarball.WithCompressionLevel(gzip.BestSpeed))
	if err != nil {
		return err
	}
	img, err := mutate.AppendLayers(empty.Image, layer)
	if err != nil {
		return err
	}
	img, err = mutate.Config(img, v1.Config{Env: []string{"PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"}})
	if err != nil {
		return err
	}
	p, err := layout.Write(filepath.Join(tmp, "layout"), empty.Index)
	if err != nil {
		return err
	}
	if err := p.AppendImage(img, layout.WithAnnotations(map[string]string{"org.opencontainers.image.ref.name": "latest"})); err != nil {
		return err
	}
	if err := os.Remove(rootfsTar); err != nil {
		return err
	}
	return os.WriteFile(filepath.Join(tmp, "complete"), nil, 0o644)
}

// testWriter sends log lines to the test's log.
type testWriter struct{ t testing.TB }

func (w testWriter) Write(p []byte) (int, error) {
	w.t.Log(strings.TrimSpace(string(p)))
	return len(p), nil
}

// RootfsLayer returns rootfs (a directory) less the paths in exclude ("./usr/lib/readie") as
// one gzip layer, the base of a user's image in the tests. Made once per rootfs record digest
// and exclude list, about 15 s, and cached under {cache}/images like Layout: seven tests build
// on it, and each paid the tar and the gzip of 330 MiB. Call it before the test moves
// XDG_CACHE_HOME. The layer is read from the cache's layout: write it into a layout of the
// test's own (a copy), never link it, since a test may forge the bytes of its copy.
func RootfsLayer(t testing.TB, rootfs string, exclude []string) v1.Layer {
	t.Helper()
	record, err := os.ReadFile(filepath.Join(rootfs, manifest.RootfsInfoFile))
	if err != nil {
		t.Fatalf("the rootfs's record: %v", err)
	}
	recipe := sha256.Sum256([]byte(strings.Join(append([]string{string(record), "gzip-1"}, exclude...), "\x00")))
	name := "rootfs-layer-" + hex.EncodeToString(recipe[:8])
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Minute)
	defer cancel()
	complete := func(dir string) (bool, error) {
		_, err := os.Stat(filepath.Join(dir, "complete"))
		return err == nil, nil
	}
	log := logrus.New()
	log.SetOutput(testWriter{t})
	dir, _, err := unpack.Once(ctx, filepath.Join(config.CacheDir(), "images"), name, complete, func(tmp string) error {
		return buildRootfsLayout(ctx, t, rootfs, exclude, tmp)
	}, log)
	if err != nil {
		t.Fatalf("the rootfs as a layer: %v", err)
	}
	p, err := layout.FromPath(filepath.Join(dir, "layout"))
	if err != nil {
		t.Fatal(err)
	}
	index, err := p.ImageIndex()
	if err != nil {
		t.Fatal(err)
	}
	im, err := index.IndexManifest()
	if err != nil || len(im.Manifests) != 1 {
		t.Fatalf("the cached layout %s: %v (%d images)", dir, err, len(im.Manifests))
	}
	img, err := index.Image(im.Manifests[0].Digest)
	if err != nil {
		t.Fatal(err)
	}
	layers, err := img.Layers()
	if err != nil || len(layers) != 1 {
		t.Fatalf("the cached layout %s: %v (%d layers)", dir, err, len(layers))
	}
	return layers[0]
}

// buildRootfsLayout tars rootfs less exclude and writes it as an OCI layout of one gzip
// layer at tmp/layout.
func buildRootfsLayout(ctx context.Context, t testing.TB, rootfs string, exclude []string, tmp string) error {
	t.Logf("making %s a layer (once; cached)", rootfs)
	plain := filepath.Join(tmp, "rootfs.tar")
	args := []string{"-C", rootfs, "-cf", plain}
	for _, path := range exclude {
		args = append(args, "--exclude="+path)
	}
	cmd := exec.CommandContext(ctx, "tar", append(args, ".")...)
	cmd.WaitDelay = 10 * time.Second
	if out, err := cmd.CombinedOutput(); err != nil {
		return fmt.Errorf("tar %s: %w\n%s", rootfs, err, out)
	}
	layer, err := tarball.LayerFromFile(plain, tarball.WithCompressionLevel(gzip.BestSpeed))
	if err != nil {
		return err
	}
	img, err := mutate.AppendLayers(empty.Image, layer)
	if err != nil {
		return err
	}
	p, err := layout.Write(filepath.Join(tmp, "layout"), empty.Index)
	if err != nil {
		return err
	}
	if err := p.AppendImage(img); err != nil {
		return err
	}
	if err := os.Remove(plain); err != nil {
		return err
	}
	return os.WriteFile(filepath.Join(tmp, "complete"), nil, 0o644)
}
