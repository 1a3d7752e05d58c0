package exchange

import (
	"context"
	"errors"
	"fmt"
	"path/filepath"

	v1 "github.com/google/go-containerregistry/pkg/v1"
	"github.com/sirupsen/logrus"

	"readie.dev/pipeline/internal/config"
	"readie.dev/pipeline/internal/lease"
	"readie.dev/pipeline/internal/oci/output"
	"readie.dev/pipeline/internal/oci/ref"
	"readie.dev/pipeline/internal/oci/unpack"
	"readie.dev/pipeline/internal/oci/verify"
	"readie.dev/pipeline/internal/outcatalogue"
	"readie.dev/pipeline/internal/outdir"
	"readie.dev/pipeline/internal/progress"
	"readie.dev/pipeline/internal/scratch"
	"readie.dev/pipeline/pkg/executorproto"
	"readie.dev/pipeline/pkg/manifest"
)

// Pull writes the output that img holds into out as a capture would (lock, staging, verify,
// swap: writeOutput): out changes only when every layer matched its digests and the pulled
// output verifies. An image of another executor protocol is refused before any layer is read.
// Layer reads stop with ctx; what the layers may write is bounded by limits. With runtimeDir
// set, the runtime the output was captured with is laid out there too (output.PullRuntime),
// before out is swapped: a runtime refused leaves out as it was.
func Pull(ctx context.Context, img v1.Image, out, runtimeDir string, limits unpack.Limits, log logrus.FieldLogger, meter *progress.Meter, what string) (*manifest.Manifest, error) {
	if err := output.CheckProtocol(img, executorproto.Version); err != nil {
		return nil, err
	}
	var m *manifest.Manifest
	err := outdir.Write(out, func(staging string) error {
		logLayer := unpack.LogLayers(log, what)
		each := func(l verify.Layer) {
			logLayer(l)
			meter.Step(what, l.Index, l.Count, "layers", fmt.Sprintf("%.1f MiB", float64(l.Uncompressed)/(1<<20)))
		}
		if err := output.Extract(ctx, img, staging, limits, each); err != nil {
			return err
		}
		var err error
		if m, err = manifest.Verify(staging, executorproto.Version); err != nil {
			return err
		}
		if runtimeDir != "" {
			if err := output.PullRuntime(ctx, img, m, runtimeDir, limits, log, each); err != nil {
				return err
			}
		}
		return outcatalogue.Pulled(staging, m)
	})
	meter.Done()
	return m, err
}

// PullAside pulls the output img holds (Pull) into a scratch directory named after a lease of
// its own (swept like a run's when the process dies), for a command that only reads its
// manifest, and removes it before it returns the manifest.
func PullAside(ctx context.Context, img v1.Image, limits unpack.Limits, log logrus.FieldLogger, meter *progress.Meter, what string) (_ *manifest.Manifest, err error) {
	l, err := lease.New()
	if err != nil {
		return nil, err
	}
	defer func() { err = errors.Join(err, l.Release()) }()
	dir, cleanup, err := scratch.Dir(l)
	if err != nil {
		return nil, err
	}
	defer cleanup() // before the lease goes: nothing named after it may outlive it
	return Pull(ctx, img, filepath.Join(dir, "out"), "", limits, log, meter, what)
}

// Push pushes the output out to r (output.Push) under out's lock taken shared: a capture cannot
// swap out while it is read, so the image holds one output, never a mix of two. While a run
// writes out, Push waits for it, bounded by ctx. The layers' gzip goes into a scratch
// directory named after a lease of the push's own, swept like a run's when the push dies. The
// image carries rt's layers when rt is set.
func Push(ctx context.Context, out string, r ref.Ref, rt *output.Runtime, log logrus.FieldLogger, meter *progress.Meter) (_ string, err error) {
	lock, err := outdir.ReadLockOutput(ctx, out, func(pid int) {
		log.WithField("pid", pid).Info("push: waiting for the run that writes the output")
	})
	if err != nil {
		return "", err
	}
	defer lock.Unlock()
	l, err := lease.New()
	if err != nil {
		return "", err
	}
	defer func() { err = errors.Join(err, l.Release()) }()
	dir, cleanup, err := scratch.Dir(l)
	if err != nil {
		return "", err
	}
	defer cleanup() // before the lease goes: nothing named after it may outlive it
	return output.Push(ctx, out, dir, r, rt, log, meter)
}

// ImageLimits returns the config's limits on what unpacking an image or pulling an output writes.
func ImageLimits(l config.Limits) unpack.Limits {
	return unpack.Limits{Bytes: int64(l.ImageBytes), Entries: l.ImageEntries, FileBytes: int64(l.ImageFileBytes)}
}
