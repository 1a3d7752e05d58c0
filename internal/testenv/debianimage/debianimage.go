// Package debianimage builds Debian images as a user's image build would, for the tests of images
// the pipeline did not make (Debian 13: Python 3.13, numpy 2), and the default rootfs as a
// user's base layer; each made once and cached like the default rootfs.
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
	"readie.dev/pipeline/internal/oci/ocitest"
	"readie.dev/pipeline/internal/oci/unpack"
	"readie.dev/pipeline/pkg/manifest"
)

// Packages are what a Debian image of DebianLayout holds besides minbase. python3-attr's module
// (attr) is not named as its distribution (attrs), whose metadata has neither RECORD nor
// top_level.txt: only dpkg's file list ties them (the executor's packages report).
var Packages = []string{"python3", "python3-cloudpickle", "python3-numpy", "python3-pandas", "python3-attr"}

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
	dir := cached(t, "debian-"+suite+"-"+hex.EncodeToString(recipe[:8]), func(ctx context.Context, tmp string) error {
		return buildDebianLayout(ctx, t, suite, mirror, tmp)
	})
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
	return writeLayout(tmp, rootfsTar, v1.Config{Env: []string{"PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"}})
}

// writeLayout writes the tar plain as the one gzip layer of an image of config, tagged
// "latest", in an OCI layout at tmp/layout; then removes plain and marks tmp complete.
func writeLayout(tmp, plain string, config v1.Config) error {
	layer, err := tarball.LayerFromFile(plain, tarball.WithCompressionLevel(gzip.BestSpeed))
	if err != nil {
		return err
	}
	img, err := mutate.AppendLayers(empty.Image, layer)
	if err != nil {
		return err
	}
	img, err = mutate.Config(img, config)
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
	if err := os.Remove(plain); err != nil {
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

// rootfsLayerRecipe names how buildRootfsLayout makes a layer: tar, gzip at BestSpeed, a layout
// by writeLayout.
const rootfsLayerRecipe = "rootfs-layer-2 tar gzip-1"

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
	// The recipe names the directory: bump rootfsLayerRecipe when buildRootfsLayout changes.
	recipe := sha256.Sum256([]byte(strings.Join(append([]string{rootfsLayerRecipe, string(record)}, exclude...), "\x00")))
	dir := cached(t, "rootfs-layer-"+hex.EncodeToString(recipe[:8]), func(ctx context.Context, tmp string) error {
		return buildRootfsLayout(ctx, t, rootfs, exclude, tmp)
	})
	img, _ := ocitest.FirstImage(t, filepath.Join(dir, "layout"))
	layers, err := img.Layers()
	if err != nil || len(layers) != 1 {
		t.Fatalf("the cached layout %s: %v (%d layers)", dir, err, len(layers))
	}
	return layers[0]
}

// cached returns the directory name under {cache}/images, made by build into a temporary
// directory (which it ends by writing "complete") once for every run and test, and kept.
func cached(t testing.TB, name string, build func(ctx context.Context, tmp string) error) string {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 15*time.Minute)
	defer cancel()
	complete := func(dir string) (bool, error) {
		_, err := os.Stat(filepath.Join(dir, "complete"))
		return err == nil, nil
	}
	log := logrus.New()
	log.SetOutput(testWriter{t})
	dir, _, err := unpack.Once(ctx, filepath.Join(config.CacheDir(), "images"), name, complete, func(tmp string) error {
		return build(ctx, tmp)
	}, log)
	if err != nil {
		t.Fatalf("%s: %v", name, err)
	}
	return dir
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
	return writeLayout(tmp, plain, v1.Config{})
}
