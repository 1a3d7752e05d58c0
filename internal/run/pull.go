package run

import (
	"fmt"
	"os"
	"strings"

	v1 "github.com/google/go-containerregistry/pkg/v1"

	"readie.dev/pipeline/internal/oci"
	"readie.dev/pipeline/pkg/executorproto"
	"readie.dev/pipeline/pkg/manifest"
)

// Pull writes the output that img holds into out as a capture would (lock, staging, verify,
// swap): out changes only when the pulled output verifies. An image of another executor
// protocol is refused before any layer is read.
func Pull(img v1.Image, out string, progress func(layer, layers int, bytes int64)) (*manifest.Manifest, error) {
	if err := oci.CheckProtocol(img, executorproto.Version); err != nil {
		return nil, err
	}
	if err := checkOutput(out); err != nil {
		return nil, err
	}
	lock, err := LockOutput(out)
	if err != nil {
		return nil, err
	}
	defer lock.Unlock()
	if _, err := sweepOutput(out); err != nil {
		return nil, err
	}
	staging := fmt.Sprintf("%s.staging-%d", strings.TrimSuffix(out, "/"), os.Getpid())
	if err := os.RemoveAll(staging); err != nil {
		return nil, err
	}
	if err := os.MkdirAll(staging, 0o755); err != nil {
		return nil, err
	}
	m, err := func() (*manifest.Manifest, error) {
		if err := oci.Extract(img, staging, progress); err != nil {
			return nil, err
		}
		return manifest.Verify(staging, executorproto.Version)
	}()
	if err != nil {
		os.RemoveAll(staging)
		return nil, fmt.Errorf("%w (%s left as it was)", err, out)
	}
	if err := replaceDir(out, staging); err != nil {
		return nil, err
	}
	return m, nil
}
