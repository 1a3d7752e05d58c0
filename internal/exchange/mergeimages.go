package exchange

import (
	"context"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"strconv"

	"github.com/sirupsen/logrus"

	"readie.dev/pipeline/internal/config"
	"readie.dev/pipeline/internal/lease"
	"readie.dev/pipeline/internal/oci/ref"
	"readie.dev/pipeline/internal/outdir"
	"readie.dev/pipeline/pkg/manifest"
)

// MergeSources merges srcs into out (Merge), where a source that is not a directory is an
// image of `pipeline push`: it is pulled beside out first (the same file system, so the merge
// can hard-link from it), each pull bounded by timeouts.registry, and removed afterwards. The
// pulls of merges that died beside out are removed first.
func MergeSources(ctx context.Context, cfg *config.Config, out string, srcs []string, log logrus.FieldLogger) (_ *manifest.Manifest, err error) {
	l, err := lease.New()
	if err != nil {
		return nil, err
	}
	defer func() { err = errors.Join(err, l.Release()) }()
	swept, err := outdir.SweepMergePulls(l, out)
	for _, dir := range swept {
		log.WithField("dir", dir).Warn("removed the pulled sources of a merge that died")
	}
	if err != nil {
		log.WithError(err).Warn("could not remove every pulled source of merges that died")
	}
	sources := slices.Clone(srcs)
	var pulled string
	defer func() { // before the lease goes: nothing named after it may outlive it
		if pulled != "" {
			os.RemoveAll(pulled)
		}
	}()
	for i, src := range sources {
		if fi, err := os.Stat(src); err == nil && fi.IsDir() {
			continue
		}
		r, err := ref.Parse(src, cfg.InsecureRegistries)
		if err != nil {
			return nil, fmt.Errorf("%w: merge source %s is neither a directory nor an image: %w", outdir.ErrSetup, src, err)
		}
		if pulled == "" {
			parent := filepath.Dir(out)
			if err := os.MkdirAll(parent, 0o755); err != nil {
				return nil, err
			}
			if err := l.Hold(parent); err != nil {
				return nil, err
			}
			if pulled, err = os.MkdirTemp(parent, outdir.MergePullPrefix+l.ID()+"-"); err != nil {
				return nil, err
			}
		}
		pullCtx, cancel := context.WithTimeoutCause(ctx, cfg.Timeouts.Registry, fmt.Errorf("pull of %s exceeded its timeout of %s (timeouts.registry)", src, cfg.Timeouts.Registry))
		img, err := ref.Fetch(pullCtx, r)
		if err == nil {
			sources[i] = filepath.Join(pulled, strconv.Itoa(i))
			_, err = Pull(pullCtx, img, sources[i], "", ImageLimits(cfg.Limits), log, nil, "pull "+src)
		}
		cancel()
		if err != nil {
			return nil, fmt.Errorf("merge source %s: %w", src, err)
		}
	}
	return Merge(out, sources)
}
