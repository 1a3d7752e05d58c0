// Package output is an output directory as an OCI image: one layer per checkpoint directory and
// one for manifest.json, annotations a worker reads before pulling any layer, the push of it
// to a registry or an OCI layout, and its extraction back into an output directory.
package output

import (
	"context"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"runtime"
	"strconv"
	"sync"
	"sync/atomic"
	"time"

	v1 "github.com/google/go-containerregistry/pkg/v1"
	"github.com/google/go-containerregistry/pkg/v1/empty"
	"github.com/google/go-containerregistry/pkg/v1/layout"
	"github.com/google/go-containerregistry/pkg/v1/mutate"
	"github.com/google/go-containerregistry/pkg/v1/remote"
	"github.com/google/go-containerregistry/pkg/v1/types"
	"github.com/sirupsen/logrus"

	"readie.dev/pipeline/internal/oci/ref"
	"readie.dev/pipeline/internal/progress"
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
)

// Image returns the output directory out as an OCI image, after manifest.Verify: one layer per
// checkpoint directory, in the manifest's order, then one with manifest.json and the restore
// spec. Layers are deterministic (sorted entries, fixed times and owners, gzip at a fixed
// level), so an unchanged checkpoint keeps its layer digest and a registry already has it.
// Their gzip is written once into scratch (a directory the caller removes), where every read
// of the image takes it from.
func Image(out, scratch string) (v1.Image, *manifest.Manifest, error) {
	img, m, _, err := image(out, scratch, nil)
	return img, m, err
}

// image is Image, with rt's layers (Runtime.layers) after the output's when rt is set.
func image(out, scratch string, rt *Runtime) (v1.Image, *manifest.Manifest, []*fileLayer, error) {
	m, err := manifest.Verify(out, executorproto.Version)
	if err != nil {
		return nil, nil, nil, err
	}
	layers, err := writeLayers(out, m, scratch)
	if err != nil {
		return nil, nil, nil, err
	}
	created := v1.Time{Time: m.CreatedAt.UTC()}
	img, err := mutate.ConfigFile(empty.Image, &v1.ConfigFile{
		Architecture: "amd64", OS: "linux", Created: created,
		Config: v1.Config{Labels: map[string]string{AnnotationProtocol: strconv.Itoa(m.ExecutorProtocol)}},
		RootFS: v1.RootFS{Type: "layers"},
	})
	if err != nil {
		return nil, nil, nil, err
	}
	img = mutate.MediaType(img, types.OCIManifestSchema1)
	img = mutate.ConfigMediaType(img, types.OCIConfigJSON)
	all := make([]v1.Layer, 0, len(layers)+2)
	for _, l := range layers {
		all = append(all, l)
	}
	annotations := map[string]string{
		AnnotationProtocol:        strconv.Itoa(m.ExecutorProtocol),
		AnnotationRunscVersion:    m.Runsc.Version,
		AnnotationSpecFingerprint: m.SpecFingerprint,
		AnnotationRootfsDigest:    m.Rootfs.Digest,
		annotationCreated:         m.CreatedAt.UTC().Format(time.RFC3339),
	}
	if rt != nil {
		runscLayer, rootfsLayer, err := rt.layers(m, scratch)
		if err != nil {
			return nil, nil, nil, fmt.Errorf("runtime: %w", err)
		}
		for key, l := range map[string]v1.Layer{AnnotationRuntimeRunsc: runscLayer, AnnotationRuntimeRootfs: rootfsLayer} {
			d, err := l.Digest()
			if err != nil {
				return nil, nil, nil, err
			}
			annotations[key] = d.String()
		}
		all = append(all, runscLayer, rootfsLayer)
	}
	for _, l := range all {
		if img, err = mutate.Append(img, mutate.Addendum{Layer: l, History: v1.History{Created: created, CreatedBy: "readie pipeline push"}}); err != nil {
			return nil, nil, nil, err
		}
	}
	img = mutate.Annotations(img, annotations).(v1.Image)
	return img, m, layers, nil
}

// writeLayers makes the layers of the output out (m its manifest), their gzip in scratch: one
// per checkpoint, then manifest.json's, as many at once as there are CPUs (gzip is most of a
// push's work).
func writeLayers(out string, m *manifest.Manifest, scratch string) ([]*fileLayer, error) {
	type spec struct {
		dir, name string
		files     []string
	}
	var specs []spec
	for _, c := range m.Checkpoints {
		specs = append(specs, spec{c.Dir, c.ID, append(manifest.ImageFiles(), manifest.MetaFileName)})
	}
	top := []string{manifest.FileName, m.Spec}
	if _, err := os.Stat(filepath.Join(out, catalogue.FileName)); err == nil {
		top = append(top, catalogue.FileName) // pull rebuilds it when it is absent
	}
	specs = append(specs, spec{".", manifest.FileName, top})
	layers := make([]*fileLayer, len(specs))
	errs := make([]error, len(specs))
	slots := make(chan struct{}, runtime.NumCPU())
	var wg sync.WaitGroup
	for i, s := range specs {
		slots <- struct{}{}
		wg.Go(func() {
			defer func() { <-slots }()
			layers[i], errs[i] = newFileLayer(out, s.dir, s.name, s.files, filepath.Join(scratch, fmt.Sprintf("layer-%d.tar.gz", i)))
			if errs[i] != nil {
				errs[i] = fmt.Errorf("layer of %s: %w", s.name, errs[i])
			}
		})
	}
	wg.Wait()
	return layers, errors.Join(errs...)
}

// Push writes the output out as an image to r, with the runtime layers of rt when set, its
// layers' gzip in scratch (removed by the caller), and returns the pushed reference with its digest (REF@sha256:...). It logs each layer it uploads once, when it is done (its
// uncompressed and compressed MiB), a line a second while a large one goes, and a summary:
// how many layers it uploaded and how many the destination had already.
func Push(ctx context.Context, out, scratch string, r ref.Ref, rt *Runtime, log logrus.FieldLogger, meter *progress.Meter) (string, error) {
	img, _, layers, err := image(out, scratch, rt)
	if err != nil {
		return "", err
	}
	var pushedLayers atomic.Int64
	for _, l := range layers {
		l.report = func(l *fileLayer, done int64, final bool) {
			fields := logrus.Fields{"layer": l.name, "mib": mib(l.uncompressedSize), "compressed_mib": mib(l.size)}
			if !final {
				log.WithFields(logrus.Fields{"layer": l.name, "done_compressed_mib": mib(done), "compressed_mib": mib(l.size)}).Info("push: uploading")
				meter.Bytes("push: "+l.name, done, l.size)
				return
			}
			log.WithFields(fields).Info("push: layer")
			meter.Step("push", int(pushedLayers.Add(1)), len(layers), "layers uploaded", l.name)
		}
	}
	defer meter.Done()
	digest, err := img.Digest()
	if err != nil {
		return "", err
	}
	var pushed string
	if r.Layout != "" {
		if r.Digest != "" {
			return "", fmt.Errorf("%w: push to an OCI layout takes a tag, not a digest", ref.ErrRef)
		}
		if err := writeLayout(r, img); err != nil {
			return "", fmt.Errorf("write OCI layout %s: %w", r.Layout, err)
		}
		pushed = fmt.Sprintf("oci-layout:%s@%s", r.Layout, digest)
	} else {
		if err := remote.Write(r.Registry, img, ref.RemoteOptions(ctx)...); err != nil {
			return "", ref.RegistryError("push to", r.Registry, err)
		}
		pushed = r.Registry.Context().Digest(digest.String()).String()
	}
	var uploaded int
	var bytes int64
	for _, l := range layers {
		if l.uploaded.Load() {
			uploaded++
			bytes += l.size
		}
	}
	log.WithFields(logrus.Fields{"uploaded": uploaded, "present": len(layers) - uploaded, "compressed_mib": mib(bytes)}).
		Infof("push: %d layers uploaded (%s MiB compressed), %d already present", uploaded, mib(bytes), len(layers)-uploaded)
	return pushed, nil
}

func mib(n int64) string { return fmt.Sprintf("%.1f", float64(n)/(1<<20)) }

// writeLayout adds img to the OCI layout at ref.Layout (made when missing), replacing an image
// of the same tag.
func writeLayout(r ref.Ref, img v1.Image) error {
	p, err := layout.FromPath(r.Layout)
	if err != nil {
		if p, err = layout.Write(r.Layout, empty.Index); err != nil {
			return err
		}
	}
	var opts []layout.Option
	if r.Tag != "" {
		opts = append(opts, layout.WithAnnotations(map[string]string{ref.AnnotationRefName: r.Tag}))
		return p.ReplaceImage(img, func(d v1.Descriptor) bool { return d.Annotations[ref.AnnotationRefName] == r.Tag }, opts...)
	}
	return p.AppendImage(img, opts...)
}
