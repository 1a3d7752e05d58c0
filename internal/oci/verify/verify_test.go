package verify

import (
	"archive/tar"
	"bytes"
	"compress/gzip"
	"context"
	"encoding/json"
	"errors"
	"io"
	"os"
	"path/filepath"
	"strings"
	"testing"

	v1 "github.com/google/go-containerregistry/pkg/v1"
	"github.com/google/go-containerregistry/pkg/v1/empty"
	"github.com/google/go-containerregistry/pkg/v1/layout"
	"github.com/google/go-containerregistry/pkg/v1/mutate"
	"github.com/google/go-containerregistry/pkg/v1/tarball"

	"readie.dev/pipeline/internal/oci/ocitest"
)

// tarOf is a tar of files (name, body), followed by trailing bytes after its end-of-archive.
func tarOf(t *testing.T, trailing string, files ...string) []byte {
	t.Helper()
	var buf bytes.Buffer
	tw := tar.NewWriter(&buf)
	for i := 0; i < len(files); i += 2 {
		tw.WriteHeader(&tar.Header{Name: files[i], Typeflag: tar.TypeReg, Mode: 0o644, Size: int64(len(files[i+1]))})
		io.WriteString(tw, files[i+1])
	}
	tw.Close()
	buf.WriteString(trailing)
	return buf.Bytes()
}

func gzipOf(t *testing.T, data []byte) []byte {
	t.Helper()
	var buf bytes.Buffer
	zw := gzip.NewWriter(&buf)
	zw.Write(data)
	zw.Close()
	return buf.Bytes()
}

// layoutImage writes an image of two layers into an OCI layout on disk and returns the
// layout's directory.
func layoutImage(t *testing.T) string {
	t.Helper()
	var layers []v1.Layer
	for _, data := range [][]byte{tarOf(t, "", "etc/os-release", "ID=test\n"), tarOf(t, "", "app/main.py", "print('hi')\n")} {
		l, err := tarball.LayerFromOpener(func() (io.ReadCloser, error) { return io.NopCloser(bytes.NewReader(data)), nil })
		if err != nil {
			t.Fatal(err)
		}
		layers = append(layers, l)
	}
	img, err := mutate.AppendLayers(empty.Image, layers...)
	if err != nil {
		t.Fatal(err)
	}
	dir := filepath.Join(t.TempDir(), "layout")
	p, err := layout.Write(dir, empty.Index)
	if err != nil {
		t.Fatal(err)
	}
	if err := p.AppendImage(img); err != nil {
		t.Fatal(err)
	}
	return dir
}

// onlyImage opens the one image of the layout at dir.
func onlyImage(t *testing.T, dir string) v1.Image {
	t.Helper()
	img, im := ocitest.FirstImage(t, dir)
	if len(im.Manifests) != 1 {
		t.Fatalf("index: %+v", im)
	}
	return img
}

func blobPath(dir string, h v1.Hash) string { return filepath.Join(dir, "blobs", h.Algorithm, h.Hex) }

func writeBlob(t *testing.T, dir string, data []byte) v1.Descriptor {
	t.Helper()
	h := Sum(data)
	if err := os.WriteFile(blobPath(dir, h), data, 0o644); err != nil {
		t.Fatal(err)
	}
	return v1.Descriptor{Digest: h, Size: int64(len(data))}
}

// rewrite changes the layout's image the way a forger would, keeping the layout consistent
// with itself: edit may change the manifest and the config; both are written again as blobs
// and the index points at the new manifest.
func rewrite(t *testing.T, dir string, edit func(m *v1.Manifest, cfg *v1.ConfigFile)) {
	t.Helper()
	img := onlyImage(t, dir)
	m, err := img.Manifest()
	if err != nil {
		t.Fatal(err)
	}
	cfg, err := img.ConfigFile()
	if err != nil {
		t.Fatal(err)
	}
	edit(m, cfg)
	rawConfig, _ := json.Marshal(cfg)
	d := writeBlob(t, dir, rawConfig)
	m.Config.Digest, m.Config.Size = d.Digest, d.Size
	rawManifest, _ := json.Marshal(m)
	md := writeBlob(t, dir, rawManifest)
	md.MediaType = m.MediaType
	index, _ := json.Marshal(v1.IndexManifest{SchemaVersion: 2, MediaType: "application/vnd.oci.image.index.v1+json", Manifests: []v1.Descriptor{md}})
	if err := os.WriteFile(filepath.Join(dir, "index.json"), index, 0o644); err != nil {
		t.Fatal(err)
	}
}

// TestLayersVerifiesEveryByte: an intact image reads, every layer reported; a blob replaced by
// other bytes under its name, bytes changed after a tar's end (the blob's descriptor forged
// to match), a config that claims other diff IDs, and a config blob of other bytes are each
// refused with ErrDigest, naming the layer (or the config), the expected and the actual
// digest, before Layers returns.
func TestLayersVerifiesEveryByte(t *testing.T) {
	intact := layoutImage(t)
	var seen []Layer
	got, err := Layers(context.Background(), onlyImage(t, intact), func(_ Layer, tr *tar.Reader) error {
		for {
			if _, err := tr.Next(); err != nil {
				return nil
			}
		}
	}, func(l Layer) { seen = append(seen, l) })
	if err != nil || len(seen) != 2 || seen[1].Uncompressed == 0 || !strings.HasPrefix(got.Content, "sha256:") {
		t.Fatalf("intact image: %+v %v (layers %+v)", got, err, seen)
	}

	other := gzipOf(t, tarOf(t, "", "app/main.py", "import os; os.system('evil')\n"))
	for _, tc := range []struct {
		name   string
		tamper func(t *testing.T, dir string, m *v1.Manifest)
		want   []string
	}{
		{"other bytes under the blob's name", func(t *testing.T, dir string, m *v1.Manifest) {
			os.WriteFile(blobPath(dir, m.Layers[1].Digest), other, 0o644)
		}, []string{"layer 2 of 2 (", "blob: expected " + "LAYER2", "got " + Sum(other).String()}},
		{"bytes changed after the tar's end", func(t *testing.T, dir string, m *v1.Manifest) {
			forged := gzipOf(t, tarOf(t, strings.Repeat("\x00", 512)+"after the end", "app/main.py", "print('hi')\n"))
			d := writeBlob(t, dir, forged)
			rewrite(t, dir, func(m *v1.Manifest, _ *v1.ConfigFile) { m.Layers[1].Digest, m.Layers[1].Size = d.Digest, d.Size })
		}, []string{"layer 2 of 2 (", "uncompressed tar: expected " + "DIFFID2"}},
		{"a config that claims other diff IDs", func(t *testing.T, dir string, m *v1.Manifest) {
			rewrite(t, dir, func(_ *v1.Manifest, cfg *v1.ConfigFile) { cfg.RootFS.DiffIDs[1] = Sum([]byte("another image's layer")) })
		}, []string{"layer 2 of 2 (", "uncompressed tar: expected " + Sum([]byte("another image's layer")).String(), "got DIFFID2"}},
		{"other bytes under the config's name", func(t *testing.T, dir string, m *v1.Manifest) {
			os.WriteFile(blobPath(dir, m.Config.Digest), []byte(`{"rootfs":{"type":"layers","diff_ids":[]}}`), 0o644)
		}, []string{"config: expected CONFIG"}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			dir := layoutImage(t)
			img := onlyImage(t, dir)
			m, _ := img.Manifest()
			cfg, _ := img.ConfigFile()
			tc.tamper(t, dir, m)
			var applied, verified int
			_, err := Layers(context.Background(), onlyImage(t, dir), func(_ Layer, tr *tar.Reader) error {
				applied++
				_, err := io.Copy(io.Discard, struct{ io.Reader }{readAll(tr)})
				return err
			}, func(Layer) { verified++ })
			if !errors.Is(err, ErrDigest) {
				t.Fatalf("err = %v, want ErrDigest", err)
			}
			for _, want := range tc.want {
				want = strings.NewReplacer("LAYER2", m.Layers[1].Digest.String(), "DIFFID2", cfg.RootFS.DiffIDs[1].String(), "CONFIG", m.Config.Digest.String()).Replace(want)
				if !strings.Contains(err.Error(), want) {
					t.Errorf("err = %v\nwant it to say %s", err, want)
				}
			}
			if verified > 1 {
				t.Errorf("%d layers were reported verified", verified)
			}
		})
	}
}

// readAll reads a tar to its end-of-archive, entries and all.
func readAll(tr *tar.Reader) io.Reader {
	var buf bytes.Buffer
	for {
		if _, err := tr.Next(); err != nil {
			return &buf
		}
		io.Copy(&buf, tr)
	}
}

// TestLayersStopsWithContext: a cancelled context stops the reads, with its cause.
func TestLayersStopsWithContext(t *testing.T) {
	ctx, cancel := context.WithCancelCause(context.Background())
	cancel(errors.New("timeouts.registry ran out"))
	_, err := Layers(ctx, onlyImage(t, layoutImage(t)), func(_ Layer, tr *tar.Reader) error {
		_, err := tr.Next()
		return err
	}, nil)
	if !errors.Is(err, context.Canceled) || !strings.Contains(err.Error(), "timeouts.registry ran out") {
		t.Fatalf("err = %v", err)
	}
}
