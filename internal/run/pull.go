package run

import (
	v1 "github.com/google/go-containerregistry/pkg/v1"

	"readie.dev/pipeline/internal/oci"
	"readie.dev/pipeline/pkg/executorproto"
	"readie.dev/pipeline/pkg/manifest"
)

// Pull writes the output that img holds into out as a capture would (lock, staging, verify,
// swap: writeOutput): out changes only when the pulled output verifies. An image of another executor
// protocol is refused before any layer is read.
func Pull(img v1.Image, out string, progress func(layer, layers int, bytes int64)) (*manifest.Manifest, error) {
	if err := oci.CheckProtocol(img, executorproto.Version); err != nil {
		return nil, err
	}
	var m *manifest.Manifest
	err := writeOutput(out, func(staging string) error {
		if err := oci.Extract(img, staging, progress); err != nil {
			return err
		}
		var err error
		if m, err = manifest.Verify(staging, executorproto.Version); err != nil {
			return err
		}
		return pulledCatalogue(staging, m)
	})
	return m, err
}
