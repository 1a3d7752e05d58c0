package manifest

import (
	"bytes"
	"encoding/binary"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"os"
)

// ImageMagic starts every checkpoint.img that gVisor writes (pkg/state/statefile).
const ImageMagic = "gVisorSF"

// MaxImageMetadata is gVisor's own limit on the metadata that follows the magic.
const MaxImageMetadata = 16 << 20

// ErrImageHeader reports a checkpoint.img whose header is not gVisor's.
var ErrImageHeader = errors.New("bad checkpoint image header")

// ImageHeader is the metadata gVisor writes at the start of checkpoint.img, readable without
// runsc: the magic, an 8-byte big-endian length, then a JSON map of strings.
type ImageHeader map[string]string

// RunscVersion returns the version of the runsc that saved the image; restore accepts the image
// only from a runsc of the exact same version.
func (h ImageHeader) RunscVersion() string { return h["runsc_version"] }

// Compression returns the image's compression ("none" or "flate-best-speed"); gVisor's default,
// when the key is absent, is none.
func (h ImageHeader) Compression() string {
	if c, ok := h["compression"]; ok && c != "" {
		return c
	}
	return "none"
}

// ReadImageHeader reads the header of the checkpoint.img at path.
func ReadImageHeader(path string) (ImageHeader, error) {
	f, err := os.Open(path)
	if err != nil {
		return nil, err
	}
	defer f.Close()
	h, err := DecodeImageHeader(f)
	if err != nil {
		return nil, fmt.Errorf("%s: %w", path, err)
	}
	return h, nil
}

// DecodeImageHeader reads an image header from r; the length is checked before anything is
// allocated for it.
func DecodeImageHeader(r io.Reader) (ImageHeader, error) {
	var fixed [len(ImageMagic) + 8]byte
	if _, err := io.ReadFull(r, fixed[:]); err != nil {
		return nil, fmt.Errorf("%w: %w", ErrImageHeader, err)
	}
	if !bytes.Equal(fixed[:len(ImageMagic)], []byte(ImageMagic)) {
		return nil, fmt.Errorf("%w: no %q magic", ErrImageHeader, ImageMagic)
	}
	size := binary.BigEndian.Uint64(fixed[len(ImageMagic):])
	if size > MaxImageMetadata {
		return nil, fmt.Errorf("%w: metadata of %d bytes exceeds %d", ErrImageHeader, size, MaxImageMetadata)
	}
	data := make([]byte, size)
	if _, err := io.ReadFull(r, data); err != nil {
		return nil, fmt.Errorf("%w: metadata: %w", ErrImageHeader, err)
	}
	var h ImageHeader
	if err := json.Unmarshal(data, &h); err != nil {
		return nil, fmt.Errorf("%w: metadata: %w", ErrImageHeader, err)
	}
	return h, nil
}
