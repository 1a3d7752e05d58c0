// Package filedigest computes the "sha256:" digests the pipeline records: of a file's content,
// read to its end.
package filedigest

import (
	"crypto/sha256"
	"encoding/hex"
	"fmt"
	"io"
	"os"
)

// Of returns the size of the file at path and the "sha256:" digest of its content.
func Of(path string) (size int64, sha256Digest string, err error) {
	f, err := os.Open(path)
	if err != nil {
		return 0, "", err
	}
	defer f.Close()
	h := sha256.New()
	n, err := io.Copy(h, f)
	if err != nil {
		return 0, "", fmt.Errorf("hash %s: %w", path, err)
	}
	return n, "sha256:" + hex.EncodeToString(h.Sum(nil)), nil
}
