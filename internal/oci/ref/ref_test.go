package ref

import (
	"context"
	"errors"
	"os"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/google/go-containerregistry/pkg/v1/empty"
	"github.com/google/go-containerregistry/pkg/v1/layout"
	"github.com/google/go-containerregistry/pkg/v1/mutate"
	"github.com/google/go-containerregistry/pkg/v1/random"

	"readie.dev/pipeline/internal/oci/verify"
)

// taggedLayout writes two random images tagged v1 and v2 into an OCI layout.
func taggedLayout(t *testing.T) string {
	t.Helper()
	dir := filepath.Join(t.TempDir(), "layout")
	p, err := layout.Write(dir, empty.Index)
	if err != nil {
		t.Fatal(err)
	}
	for _, tag := range []string{"v2", "v1"} {
		img, err := random.Image(64, 1)
		if err != nil {
			t.Fatal(err)
		}
		if err := p.AppendImage(img, layout.WithAnnotations(map[string]string{AnnotationRefName: tag})); err != nil {
			t.Fatal(err)
		}
	}
	return dir
}

// TestFetchLayoutTags: a tag the layout lacks is refused listing the tags it has.
func TestFetchLayoutTags(t *testing.T) {
	dir := taggedLayout(t)
	if _, err := Fetch(context.Background(), Ref{Layout: dir, Tag: "v1"}); err != nil {
		t.Fatal(err)
	}
	_, err := Fetch(context.Background(), Ref{Layout: dir, Tag: "v3"})
	if !errors.Is(err, ErrRef) || !strings.Contains(err.Error(), `no image tagged "v3" (tags: v1, v2)`) {
		t.Fatalf("err = %v", err)
	}
}

// TestFetchLayoutRefusesOtherManifestBytes: the index names a manifest by its digest; a blob
// file of that name holding another manifest is refused naming both digests, as a registry
// client refuses a manifest of another digest.
func TestFetchLayoutRefusesOtherManifestBytes(t *testing.T) {
	dir := taggedLayout(t)
	p, _ := layout.FromPath(dir)
	index, _ := p.ImageIndex()
	im, _ := index.IndexManifest()
	want := im.Manifests[0].Digest
	img, _ := p.Image(im.Manifests[1].Digest)
	other, _ := mutate.Annotations(img, map[string]string{"forged": "yes"}).(interface{ RawManifest() ([]byte, error) }).RawManifest()
	if err := os.WriteFile(filepath.Join(dir, "blobs", "sha256", want.Hex), other, 0o644); err != nil {
		t.Fatal(err)
	}
	_, err := Fetch(context.Background(), Ref{Layout: dir, Digest: want.String()})
	if !errors.Is(err, verify.ErrDigest) || !strings.Contains(err.Error(), "expected "+want.String()) || !strings.Contains(err.Error(), "got "+verify.Sum(other).String()) {
		t.Fatalf("err = %v", err)
	}
}

// TestTransportHasTimeouts: the registry transport bounds each step, unlike
// http.DefaultTransport.
func TestTransportHasTimeouts(t *testing.T) {
	tr := Transport()
	if tr.ResponseHeaderTimeout <= 0 || tr.TLSHandshakeTimeout <= 0 || tr.DialContext == nil || tr.IdleConnTimeout <= 0 {
		t.Fatalf("transport %+v", tr)
	}
}

// TestFetchLayoutRefusesNonRegularFiles: a layout whose index.json or a blob is a FIFO is
// refused naming the file, rather than blocking the pipeline forever in go-containerregistry's
// os.ReadFile of index.json (a FIFO's open waits for a writer nobody will be).
func TestFetchLayoutRefusesNonRegularFiles(t *testing.T) {
	for _, victim := range []string{"index.json", "manifest"} {
		dir := taggedLayout(t)
		file := filepath.Join(dir, "index.json")
		if victim == "manifest" {
			p, _ := layout.FromPath(dir)
			index, _ := p.ImageIndex()
			im, _ := index.IndexManifest()
			file = filepath.Join(dir, "blobs", "sha256", im.Manifests[0].Digest.Hex)
		}
		os.Remove(file)
		if err := syscall.Mkfifo(file, 0o644); err != nil {
			t.Fatal(err)
		}
		done := make(chan error, 1)
		go func() {
			_, err := Fetch(context.Background(), Ref{Layout: dir, Tag: "v2"})
			done <- err
		}()
		select {
		case err := <-done:
			// go-containerregistry refuses a blob that is not a regular file itself.
			if err == nil || !strings.Contains(err.Error(), "not a regular file") ||
				victim == "index.json" && (!errors.Is(err, ErrRef) || !strings.Contains(err.Error(), "index.json is not a regular file")) {
				t.Errorf("%s a FIFO: %v, want an error saying it is not a regular file", victim, err)
			}
		case <-time.After(30 * time.Second):
			// The fault is a hang: unblock the read so the goroutine ends, then fail.
			if w, err := os.OpenFile(file, os.O_WRONLY, 0); err == nil {
				w.Close()
			}
			<-done
			t.Errorf("%s a FIFO: Fetch blocked reading it", victim)
		}
	}
}

// TestMovable: a registry tag (written or the default latest) can be moved to another image;
// a registry digest, with a tag or without, and an OCI layout cannot.
func TestMovable(t *testing.T) {
	digest := "sha256:" + strings.Repeat("a", 64)
	for ref, want := range map[string]bool{
		"localhost:5000/readie/out:v1":           true,
		"registry.example/readie/out":            true,
		"localhost:5000/readie/out@" + digest:    false,
		"localhost:5000/readie/out:v1@" + digest: false,
		"oci-layout:/srv/layout:v1":              false,
		"oci-layout:/srv/layout@" + digest:       false,
	} {
		r, err := Parse(ref, nil)
		if err != nil {
			t.Fatalf("%s: %v", ref, err)
		}
		if got := r.Movable(); got != want {
			t.Errorf("%s: Movable() = %v, want %v", ref, got, want)
		}
	}
}
