package oci

import (
	"archive/tar"
	"bytes"
	"compress/gzip"
	"context"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"time"

	"github.com/google/go-containerregistry/pkg/name"
	v1 "github.com/google/go-containerregistry/pkg/v1"
	"github.com/google/go-containerregistry/pkg/v1/empty"
	"github.com/google/go-containerregistry/pkg/v1/layout"
	"github.com/google/go-containerregistry/pkg/v1/mutate"
	"github.com/google/go-containerregistry/pkg/v1/remote"
	"github.com/google/go-containerregistry/pkg/v1/tarball"
	"github.com/google/go-containerregistry/pkg/v1/types"

	"readie.dev/pipeline/pkg/catalogue"
	"readie.dev/pipeline/pkg/executorproto"
	"readie.dev/pipeline/pkg/manifest"
)

// Root is the directory an output is under in the image: `COPY --from=REF /readie /opt/readie`.
const Root = "readie"

// Annotations on the image manifest, under a prefix of ours, say what a worker needs to know
// before it pulls any layer.
const (
	AnnotationPrefix          = "dev.readie."
	AnnotationProtocol        = AnnotationPrefix + "executor-protocol"
	AnnotationRunscVersion    = AnnotationPrefix + "runsc-version"
	AnnotationSpecFingerprint = AnnotationPrefix + "spec-fingerprint"
	AnnotationRootfsDigest    = AnnotationPrefix + "rootfs-digest"
	annotationCreated         = "org.opencontainers.image.created"
	annotationRefName         = "org.opencontainers.image.ref.name"
)

// epoch is every entry's time in a layer: the same checkpoint gives the same layer digest.
var epoch = time.Unix(0, 0).UTC()

// Image is the output directory out as an OCI image: one layer per checkpoint directory, in
// the manifest's order, then one with manifest.json and the restore spec. Layers are
// deterministic (sorted entries, fixed times and owners, gzip at a fixed level), so an
// unchanged checkpoint keeps its layer digest and a registry already has it.
func Image(out string) (v1.Image, *manifest.Manifest, error) {
	m, err := manifest.Verify(out, executorproto.Version)
	if err != nil {
		return nil, nil, err
	}
	var layers []v1.Layer
	for _, c := range m.Checkpoints {
		files := append(manifest.ImageFiles(), manifest.MetaFileName)
		l, err := dirLayer(out, c.Dir, files)
		if err != nil {
			return nil, nil, fmt.Errorf("layer of %s: %w", c.ID, err)
		}
		layers = append(layers, l)
	}
	topFiles := []string{manifest.FileName, m.Spec}
	if _, err := os.Stat(filepath.Join(out, catalogue.FileName)); err == nil {
		topFiles = append(topFiles, catalogue.FileName) // pull rebuilds it for the manifest
	}
	top, err := dirLayer(out, ".", topFiles)
	if err != nil {
		return nil, nil, fmt.Errorf("layer of manifest.json: %w", err)
	}
	layers = append(layers, top)
	created := v1.Time{Time: m.CreatedAt.UTC()}
	img, err := mutate.ConfigFile(empty.Image, &v1.ConfigFile{
		Architecture: "amd64", OS: "linux", Created: created,
		Config: v1.Config{Labels: map[string]string{AnnotationProtocol: strconv.Itoa(m.ExecutorProtocol)}},
		RootFS: v1.RootFS{Type: "layers"},
	})
	if err != nil {
		return nil, nil, err
	}
	img = mutate.MediaType(img, types.OCIManifestSchema1)
	img = mutate.ConfigMediaType(img, types.OCIConfigJSON)
	for _, l := range layers {
		if img, err = mutate.Append(img, mutate.Addendum{Layer: l, History: v1.History{Created: created, CreatedBy: "readie pipeline push"}}); err != nil {
			return nil, nil, err
		}
	}
	img = mutate.Annotations(img, map[string]string{
		AnnotationProtocol:        strconv.Itoa(m.ExecutorProtocol),
		AnnotationRunscVersion:    m.Runsc.Version,
		AnnotationSpecFingerprint: m.SpecFingerprint,
		AnnotationRootfsDigest:    m.Rootfs.Digest,
		annotationCreated:         m.CreatedAt.UTC().Format(time.RFC3339),
	}).(v1.Image)
	return img, m, nil
}

// dirLayer is a layer holding files of out/dir under Root/dir, with its parent directories.
func dirLayer(out, dir string, files []string) (v1.Layer, error) {
	var buf bytes.Buffer
	tw := tar.NewWriter(&buf)
	dirs := []string{Root}
	if dir != "." {
		dirs = append(dirs, filepath.ToSlash(filepath.Join(Root, dir)))
	}
	for _, d := range dirs {
		if err := tw.WriteHeader(&tar.Header{Typeflag: tar.TypeDir, Name: d + "/", Mode: 0o755, ModTime: epoch, Format: tar.FormatPAX}); err != nil {
			return nil, err
		}
	}
	files = slices.Sorted(slices.Values(files))
	for _, name := range files {
		path := filepath.Join(out, dir, name)
		f, err := os.Open(path)
		if err != nil {
			return nil, err
		}
		fi, err := f.Stat()
		if err != nil {
			f.Close()
			return nil, err
		}
		// Image files hold process memory: owner-only, as in the store.
		mode := int64(0o644)
		if strings.HasSuffix(name, ".img") {
			mode = 0o600
		}
		hdr := &tar.Header{Typeflag: tar.TypeReg, Name: filepath.ToSlash(filepath.Join(Root, dir, name)), Mode: mode, Size: fi.Size(), ModTime: epoch, Format: tar.FormatPAX}
		if err := tw.WriteHeader(hdr); err != nil {
			f.Close()
			return nil, err
		}
		_, err = io.Copy(tw, f)
		f.Close()
		if err != nil {
			return nil, fmt.Errorf("%s: %w", path, err)
		}
	}
	if err := tw.Close(); err != nil {
		return nil, err
	}
	data := buf.Bytes()
	return tarball.LayerFromOpener(func() (io.ReadCloser, error) { return io.NopCloser(bytes.NewReader(data)), nil },
		tarball.WithCompressionLevel(gzip.BestSpeed), tarball.WithMediaType(types.OCILayer), tarball.WithCompressedCaching)
}

// Push writes the output out as an image to ref and returns the pushed reference with its
// digest (REF@sha256:...).
func Push(ctx context.Context, out string, ref Ref, progress *Progress) (string, error) {
	img, m, err := Image(out)
	if err != nil {
		return "", err
	}
	if progress != nil && progress.Layer != nil {
		names := []string{}
		for _, c := range m.Checkpoints {
			names = append(names, c.ID)
		}
		if img, err = withLayerProgress(img, append(names, manifest.FileName), progress.Layer); err != nil {
			return "", err
		}
	}
	digest, err := img.Digest()
	if err != nil {
		return "", err
	}
	if ref.Layout != "" {
		if ref.Digest != "" {
			return "", fmt.Errorf("%w: push to an OCI layout takes a tag, not a digest", ErrRef)
		}
		if err := writeLayout(ref, img); err != nil {
			return "", fmt.Errorf("write OCI layout %s: %w", ref.Layout, err)
		}
		return fmt.Sprintf("oci-layout:%s@%s", ref.Layout, digest), nil
	}
	if err := remote.Write(ref.Registry, img, remoteOptions(ctx, progress)...); err != nil {
		return "", registryError("push to", ref.Registry, err)
	}
	progress.done()
	return ref.Registry.Context().Digest(digest.String()).String(), nil
}

// withLayerProgress is img with each layer (named by names, in order) reporting its upload.
func withLayerProgress(img v1.Image, names []string, report func(string, int64, int64)) (v1.Image, error) {
	layers, err := img.Layers()
	if err != nil {
		return nil, err
	}
	cfg, err := img.ConfigFile()
	if err != nil {
		return nil, err
	}
	m, err := img.Manifest()
	if err != nil {
		return nil, err
	}
	base, err := mutate.ConfigFile(empty.Image, &v1.ConfigFile{Architecture: cfg.Architecture, OS: cfg.OS, Created: cfg.Created, Config: cfg.Config, RootFS: v1.RootFS{Type: "layers"}})
	if err != nil {
		return nil, err
	}
	base = mutate.ConfigMediaType(mutate.MediaType(base, types.OCIManifestSchema1), types.OCIConfigJSON)
	for i, l := range layers {
		if base, err = mutate.Append(base, mutate.Addendum{Layer: &layerProgress{Layer: l, name: names[i], report: report}, History: cfg.History[i]}); err != nil {
			return nil, err
		}
	}
	wrapped := mutate.Annotations(base, m.Annotations).(v1.Image)
	want, _ := img.Digest()
	if got, err := wrapped.Digest(); err != nil || got != want {
		return nil, fmt.Errorf("push: the image changed when its layers were wrapped for progress (%v)", err)
	}
	return wrapped, nil
}

// writeLayout adds img to the OCI layout at ref.Layout (made when missing), replacing an image
// of the same tag.
func writeLayout(ref Ref, img v1.Image) error {
	p, err := layout.FromPath(ref.Layout)
	if err != nil {
		if p, err = layout.Write(ref.Layout, empty.Index); err != nil {
			return err
		}
	}
	var opts []layout.Option
	if ref.Tag != "" {
		opts = append(opts, layout.WithAnnotations(map[string]string{annotationRefName: ref.Tag}))
		return p.ReplaceImage(img, func(d v1.Descriptor) bool { return d.Annotations[annotationRefName] == ref.Tag }, opts...)
	}
	return p.AppendImage(img, opts...)
}

// registryError names the registry host and what failed; the cause (which names no
// credential: go-containerregistry never prints them) stays matchable.
func registryError(what string, ref name.Reference, err error) error {
	return fmt.Errorf("%s %s (registry %s): %w", what, ref, ref.Context().RegistryStr(), err)
}
