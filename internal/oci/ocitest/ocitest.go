// Package ocitest holds what the tests of internal/oci and cmd/pipeline share to make and open
// OCI images: a layer from tar bytes, and the first image of a layout.
package ocitest

import (
	"bytes"
	"io"
	"testing"

	v1 "github.com/google/go-containerregistry/pkg/v1"
	"github.com/google/go-containerregistry/pkg/v1/layout"
	"github.com/google/go-containerregistry/pkg/v1/tarball"
)

// Layer returns an uncompressed layer of the tar stream data.
func Layer(t testing.TB, data []byte) v1.Layer {
	t.Helper()
	l, err := tarball.LayerFromOpener(func() (io.ReadCloser, error) { return io.NopCloser(bytes.NewReader(data)), nil })
	if err != nil {
		t.Fatal(err)
	}
	return l
}

// FirstImage opens the OCI layout at dir: its index manifest and the image its first entry
// names. The test fails when there is none.
func FirstImage(t testing.TB, dir string) (v1.Image, *v1.IndexManifest) {
	t.Helper()
	p, err := layout.FromPath(dir)
	if err != nil {
		t.Fatal(err)
	}
	index, err := p.ImageIndex()
	if err != nil {
		t.Fatal(err)
	}
	im, err := index.IndexManifest()
	if err != nil || len(im.Manifests) == 0 {
		t.Fatalf("the index of %s: %+v %v", dir, im, err)
	}
	img, err := p.Image(im.Manifests[0].Digest)
	if err != nil {
		t.Fatal(err)
	}
	return img, im
}
