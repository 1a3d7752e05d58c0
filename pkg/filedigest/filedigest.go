// Package filedigest computes the "sha256:" digests the pipeline records (of a file's content,
// read to its end, or of bytes in memory) and formats them: Format is the one place that
// writes the "sha256:" + hex form.
package filedigest

import (
	"crypto/sha256"
	"encoding/hex"
	"fmt"
	"io"
	"os"
)

// Prefix starts every digest the pipeline records.
const Prefix = "sha256:"

// Format writes a SHA-256 sum as the pipeline records digests: "sha256:" and its hex.
func Format(sum []byte) string { return Prefix + hex.EncodeToString(sum) }

// OfBytes returns the "sha256:" digest of data.
func OfBytes(data []byte) string {
	sum := sha256.Sum256(data)
	return Format(sum[:])
}

// Of returns the size of the file at path and the "sha256:" digest of its content.
func Of(path string) (size int64, sha256Digest string, err error) {
	f, err := os.Open(path)
	if err != nil {
		return 0, "", err
	}
	defer f.Close()
	return OfReader(f, path)
}

// OfReader returns the size and the "sha256:" digest of what r holds to its end; name names
// it in an error.
func OfReader(r io.Reader, name string) (size int64, sha256Digest string, err error) {
	h := sha256.New()
	n, err := io.Copy(h, r)
	if err != nil {
		return 0, "", fmt.Errorf("hash %s: %w", name, err)
	}
	return n, Format(h.Sum(nil)), nil
}
