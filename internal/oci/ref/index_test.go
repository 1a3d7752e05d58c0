package ref

import (
	"context"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/google/go-containerregistry/pkg/name"
	v1 "github.com/google/go-containerregistry/pkg/v1"
	"github.com/google/go-containerregistry/pkg/v1/empty"
	"github.com/google/go-containerregistry/pkg/v1/layout"
	"github.com/google/go-containerregistry/pkg/v1/mutate"
	"github.com/google/go-containerregistry/pkg/v1/random"
	"github.com/google/go-containerregistry/pkg/v1/remote"
	"github.com/google/go-containerregistry/pkg/v1/types"

	"readie.dev/pipeline/internal/oci/verify"
	"readie.dev/pipeline/internal/testenv"
)

func platformImage(t *testing.T, p *v1.Platform) mutate.IndexAddendum {
	t.Helper()
	img, err := random.Image(64, 1)
	if err != nil {
		t.Fatal(err)
	}
	return mutate.IndexAddendum{Add: img, Descriptor: v1.Descriptor{Platform: p}}
}

// multiLayout writes an OCI layout whose index.json names, tagged "multi", an index of: an
// attestation manifest, linux/arm/v7, and a nested index holding linux/arm64/v8 and
// linux/amd64. It returns the layout, the outer index's digest and the amd64 image's.
func multiLayout(t *testing.T) (string, v1.Hash, v1.Hash) {
	t.Helper()
	amd64 := platformImage(t, &v1.Platform{OS: "linux", Architecture: "amd64"})
	inner := mutate.IndexMediaType(mutate.AppendManifests(empty.Index,
		platformImage(t, &v1.Platform{OS: "linux", Architecture: "arm64", Variant: "v8"}), amd64), types.OCIImageIndex)
	outer := mutate.IndexMediaType(mutate.AppendManifests(empty.Index,
		platformImage(t, &v1.Platform{OS: "unknown", Architecture: "unknown"}),
		platformImage(t, &v1.Platform{OS: "linux", Architecture: "arm", Variant: "v7"}),
		mutate.IndexAddendum{Add: inner},
	), types.OCIImageIndex)
	dir := filepath.Join(t.TempDir(), "layout")
	p, err := layout.Write(dir, empty.Index)
	if err != nil {
		t.Fatal(err)
	}
	if err := p.AppendIndex(outer, layout.WithAnnotations(map[string]string{AnnotationRefName: "multi"})); err != nil {
		t.Fatal(err)
	}
	od, _ := outer.Digest()
	ad, _ := amd64.Add.(v1.Image).Digest()
	return dir, od, ad
}

// TestResolveIndex: an index (with a nested one) resolves to the platform asked for, or the
// host's; an attestation manifest is never chosen; a platform the index lacks is refused
// naming the platforms it has.
func TestResolveIndex(t *testing.T) {
	dir, outer, amd64 := multiLayout(t)
	ref := "oci-layout:" + dir + ":multi"
	ctx := context.Background()
	res, err := Resolve(ctx, ref, nil, &v1.Platform{OS: "linux", Architecture: "amd64"})
	if err != nil {
		t.Fatal(err)
	}
	got, _ := res.Image.Digest()
	if got != amd64 || res.Index != outer.String() || res.Platform != "linux/amd64" {
		t.Errorf("linux/amd64: image %s index %s platform %s; want %s in %s", got, res.Index, res.Platform, amd64, outer)
	}
	for _, want := range []string{"linux/arm64", "linux/arm64/v8", "linux/arm/v7"} {
		p, _ := ParsePlatform(want)
		res, err := Resolve(ctx, ref, nil, p)
		if err != nil || !strings.HasPrefix(res.Platform, strings.TrimSuffix(want, "/v8")) {
			t.Errorf("%s: %+v, %v", want, res, err)
		}
	}
	_, err = Resolve(ctx, ref, nil, &v1.Platform{OS: "linux", Architecture: "s390x"})
	if !errors.Is(err, ErrRef) || !strings.Contains(err.Error(), "no image for linux/s390x") ||
		!strings.Contains(err.Error(), "linux/arm/v7, unknown/unknown (attestation)") || !strings.Contains(err.Error(), "an index without linux/s390x") {
		t.Errorf("linux/s390x: %v", err)
	}
	_, err = Resolve(ctx, ref, nil, &v1.Platform{OS: "unknown", Architecture: "unknown"})
	if !errors.Is(err, ErrRef) {
		t.Errorf("an attestation manifest was chosen: %v", err)
	}
}

// TestResolveIndexVerifiesBytes: a nested index whose blob holds other bytes than its digest
// says is refused, naming both digests.
func TestResolveIndexVerifiesBytes(t *testing.T) {
	dir, outer, _ := multiLayout(t)
	path := filepath.Join(dir, "blobs", "sha256", outer.Hex)
	data, _ := os.ReadFile(path)
	forged := []byte(strings.Replace(string(data), `"manifests"`, ` "manifests"`, 1))
	os.WriteFile(path, forged, 0o644)
	_, err := Resolve(context.Background(), "oci-layout:"+dir+":multi", nil, nil)
	if !errors.Is(err, verify.ErrDigest) || !strings.Contains(err.Error(), "expected "+outer.String()) {
		t.Errorf("a forged index: %v", err)
	}
}

// TestResolveSingleImagePlatform: an image named directly is used for the host's platform
// whatever its config says, and refused when --platform names another.
func TestResolveSingleImagePlatform(t *testing.T) {
	img, _ := random.Image(64, 1)
	cf, _ := img.ConfigFile()
	cf = cf.DeepCopy()
	cf.OS, cf.Architecture = "linux", "amd64"
	img, _ = mutate.ConfigFile(img, cf)
	dir := filepath.Join(t.TempDir(), "layout")
	p, _ := layout.Write(dir, empty.Index)
	if err := p.AppendImage(img); err != nil {
		t.Fatal(err)
	}
	ref := "oci-layout:" + dir
	if _, err := Resolve(context.Background(), ref, nil, nil); err != nil {
		t.Fatal(err)
	}
	_, err := Resolve(context.Background(), ref, nil, &v1.Platform{OS: "linux", Architecture: "riscv64"})
	if !errors.Is(err, ErrRef) || !strings.Contains(err.Error(), "not linux/riscv64") {
		t.Errorf("%v", err)
	}
}

func TestParsePlatform(t *testing.T) {
	for _, bad := range []string{"linux", "linux/", "/amd64", "linux/arm/v7/x", "linux amd64", "linux:amd64"} {
		if _, err := ParsePlatform(bad); !errors.Is(err, ErrRef) {
			t.Errorf("ParsePlatform(%q) = %v", bad, err)
		}
	}
	if p, err := ParsePlatform("linux/arm/v7"); err != nil || p.OS != "linux" || p.Architecture != "arm" || p.Variant != "v7" {
		t.Errorf("linux/arm/v7: %+v %v", p, err)
	}
}

// TestResolveRegistryIndex: a registry reference that resolves to an index (nested, with an
// attestation) gives the host's image, the index's digest and the platform, as a layout does.
func TestResolveRegistryIndex(t *testing.T) {
	dir, outer, amd64 := multiLayout(t)
	p, _ := layout.FromPath(dir)
	root, _ := p.ImageIndex()
	idx, err := root.ImageIndex(outer)
	if err != nil {
		t.Fatal(err)
	}
	reg := testenv.StartRegistry(t, false)
	tag, _ := name.NewTag(reg.Host + "/readie/multi:v1")
	if err := remote.WriteIndex(tag, idx); err != nil {
		t.Fatal(err)
	}
	res, err := Resolve(context.Background(), tag.String(), nil, &v1.Platform{OS: "linux", Architecture: "amd64"})
	if err != nil {
		t.Fatal(err)
	}
	got, _ := res.Image.Digest()
	if got != amd64 || res.Index != outer.String() || res.Platform != "linux/amd64" {
		t.Errorf("image %s index %s platform %s; want %s in %s", got, res.Index, res.Platform, amd64, outer)
	}
	if _, err := Resolve(context.Background(), tag.String(), nil, &v1.Platform{OS: "windows", Architecture: "amd64"}); !errors.Is(err, ErrRef) || !strings.Contains(err.Error(), "no image for windows/amd64") {
		t.Errorf("windows/amd64: %v", err)
	}
}

// TestResolveIndexTooDeep: indexes nested deeper than maxIndexDepth are refused saying so,
// not reported as an index that lacks the platform.
func TestResolveIndexTooDeep(t *testing.T) {
	var index v1.ImageIndex = mutate.IndexMediaType(mutate.AppendManifests(empty.Index,
		platformImage(t, &v1.Platform{OS: "linux", Architecture: "amd64"})), types.OCIImageIndex)
	for range maxIndexDepth + 1 {
		index = mutate.IndexMediaType(mutate.AppendManifests(empty.Index, mutate.IndexAddendum{Add: index}), types.OCIImageIndex)
	}
	dir := filepath.Join(t.TempDir(), "layout")
	p, err := layout.Write(dir, empty.Index)
	if err != nil {
		t.Fatal(err)
	}
	if err := p.AppendIndex(index, layout.WithAnnotations(map[string]string{AnnotationRefName: "deep"})); err != nil {
		t.Fatal(err)
	}
	_, err = Resolve(context.Background(), "oci-layout:"+dir+":deep", nil, &v1.Platform{OS: "linux", Architecture: "amd64"})
	if !errors.Is(err, ErrRef) || !strings.Contains(err.Error(), fmt.Sprintf("image indexes nested too deep: oci-layout:%s:deep: more than %d deep", dir, maxIndexDepth)) {
		t.Errorf("indexes nested %d deep: %v, want ErrRef saying they are nested too deep", maxIndexDepth+2, err)
	}
}
