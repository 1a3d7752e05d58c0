package unpack

import (
	"compress/gzip"
	"context"
	"os"
	"path/filepath"
	"testing"
	"time"

	v1 "github.com/google/go-containerregistry/pkg/v1"
	"github.com/google/go-containerregistry/pkg/v1/empty"
	"github.com/google/go-containerregistry/pkg/v1/layout"
	"github.com/google/go-containerregistry/pkg/v1/mutate"
	"github.com/google/go-containerregistry/pkg/v1/tarball"

	"readie.dev/pipeline/internal/testenv"
)

// BenchmarkUnpack unpacks the default rootfs from an OCI layout (one gzip layer) beside
// `tar -xzf` of the same layer blob into a fresh directory, alternating (ours verifies both
// digests of the layer as it goes); MB/s is of the
// uncompressed layer. `make bench-unpack`.
func BenchmarkUnpack(b *testing.B) {
	rootfs := testenv.Rootfs(b)
	dir := b.TempDir()
	plain := filepath.Join(dir, "layer.tar")
	if out, err := testenv.Command(b, 5*time.Minute, "tar", "-C", rootfs, "-cf", plain, ".").CombinedOutput(); err != nil {
		b.Fatalf("%v %s", err, out)
	}
	fi, _ := os.Stat(plain)
	layer, err := tarball.LayerFromFile(plain, tarball.WithCompressionLevel(gzip.BestSpeed))
	if err != nil {
		b.Fatal(err)
	}
	img, _ := mutate.AppendLayers(empty.Image, layer)
	p, err := layout.Write(filepath.Join(dir, "layout"), empty.Index)
	if err != nil {
		b.Fatal(err)
	}
	if err := p.AppendImage(img); err != nil {
		b.Fatal(err)
	}
	digest, _ := layer.Digest()
	blob := filepath.Join(dir, "layout", "blobs", "sha256", digest.Hex)
	from, err := p.Image(mustDigest(b, img))
	if err != nil {
		b.Fatal(err)
	}
	run := func(b *testing.B, unpack func(root string) error) {
		b.SetBytes(fi.Size())
		for i := 0; b.Loop(); i++ {
			b.StopTimer()
			root := filepath.Join(dir, "root")
			os.RemoveAll(root)
			os.Mkdir(root, 0o755)
			b.StartTimer()
			if err := unpack(root); err != nil {
				b.Fatal(err)
			}
		}
		os.RemoveAll(filepath.Join(dir, "root"))
	}
	b.Run("impl=unpack", func(b *testing.B) {
		run(b, func(root string) error {
			_, err := Into(context.Background(), from, root, DefaultLimits(), nil)
			return err
		})
	})
	b.Run("impl=tar-x", func(b *testing.B) {
		run(b, func(root string) error {
			out, err := testenv.Command(b, 5*time.Minute, "tar", "-C", root, "-xzpf", blob).CombinedOutput()
			if err != nil {
				b.Logf("%s", out)
			}
			return err
		})
	})
}

func mustDigest(b testing.TB, img interface{ Digest() (v1.Hash, error) }) v1.Hash {
	d, err := img.Digest()
	if err != nil {
		b.Fatal(err)
	}
	return d
}
