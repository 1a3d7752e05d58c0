package output

import (
	"fmt"
	"path/filepath"

	v1 "github.com/google/go-containerregistry/pkg/v1"

	"readie.dev/pipeline/internal/oci/selfimage"
	"readie.dev/pipeline/pkg/filedigest"
	"readie.dev/pipeline/pkg/launch"
	"readie.dev/pipeline/pkg/manifest"
	"readie.dev/pipeline/pkg/runsc"
)

// The runtime layers: what a worker host restores an output with, beside the output in its
// image, under RuntimeRoot. Each annotation holds its layer's digest. The layers are
// deterministic (selfimage: sorted entries; runsc and its helpers of fixed owners and times,
// the rootfs with its own metadata), so every output of one runsc build and one rootfs refers
// to the same two blobs, which a registry stores once per repository.
const (
	AnnotationRuntimeRunsc  = AnnotationPrefix + "runtime-runsc"
	AnnotationRuntimeRootfs = AnnotationPrefix + "runtime-rootfs"
	// RuntimeRoot is outside Root: `COPY --from=REF /readie` takes the output alone.
	RuntimeRoot = "readie-runtime"
)

// Runtime is what an output was captured with, on this host: runsc, the directory of its
// helpers (empty: where runsc finds them), the rootfs.
type Runtime struct {
	Runsc, HelpersDir, Rootfs string
}

// check refuses a runtime other than the one m records, byte for byte (manifest.CheckRunsc,
// CheckRootfsDigest): runsc's sha256, its helpers' digests, the rootfs digest.
func (rt Runtime) check(m *manifest.Manifest) error {
	_, sum, err := filedigest.Of(rt.Runsc)
	if err != nil {
		return fmt.Errorf("runsc: %w", err)
	}
	helpers, err := (&runsc.Runsc{Path: rt.Runsc, HelpersDir: rt.HelpersDir}).Helpers()
	if err != nil {
		return err
	}
	if err := m.CheckRunsc(sum, helpers); err != nil {
		return fmt.Errorf("%s: %w", rt.Runsc, err)
	}
	info, err := manifest.ReadRootfsInfo(rt.Rootfs)
	if err != nil {
		return fmt.Errorf("rootfs %s: %w", rt.Rootfs, err)
	}
	if err := m.CheckRootfsDigest(info.Digest); err != nil {
		return fmt.Errorf("%s: %w", rt.Rootfs, err)
	}
	return nil
}

// layers checks the runtime against m and writes its two layers' gzip into scratch: runsc
// with its helpers, then the rootfs.
func (rt Runtime) layers(m *manifest.Manifest, scratch string) (runscLayer, rootfsLayer v1.Layer, err error) {
	if err := rt.check(m); err != nil {
		return nil, nil, err
	}
	dir, err := (&runsc.Runsc{Path: rt.Runsc, HelpersDir: rt.HelpersDir}).ResolvedHelpersDir()
	if err != nil {
		return nil, nil, err
	}
	rootfs, err := filepath.EvalSymlinks(rt.Rootfs)
	if err != nil {
		return nil, nil, err
	}
	// The layers hold a runtime directory's entries (launch.RuntimeIn) under RuntimeRoot.
	in := launch.RuntimeIn("/" + RuntimeRoot)
	files := []selfimage.File{{Path: in.Runsc, Mode: 0o755, Source: rt.Runsc}}
	for _, name := range runsc.HelperNames() {
		if _, ok := m.Runsc.Helpers[name]; ok {
			files = append(files, selfimage.File{Path: in.Helpers + "/" + name, Mode: 0o755, Source: filepath.Join(dir, name)})
		}
	}
	if runscLayer, err = selfimage.WriteLayer(selfimage.Layer{Name: "runtime-runsc", Files: files}, scratch); err != nil {
		return nil, nil, err
	}
	rootfsLayer, err = selfimage.WriteLayer(selfimage.Layer{Name: "runtime-rootfs", Trees: []selfimage.Tree{{Path: in.Rootfs, Source: rootfs}}}, scratch)
	return runscLayer, rootfsLayer, err
}
