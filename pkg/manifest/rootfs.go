package manifest

import (
	"encoding/json"
	"fmt"
	"os"
	"path/filepath"
)

// RootfsInfoFile is where a rootfs the pipeline built records its digest, relative to its
// root (usr/lib/readie/image.json, field "digest").
const RootfsInfoFile = "usr/lib/readie/image.json"

// CheckRootfs says whether the directory at path is the rootfs m's checkpoints were captured
// on, by the digest the rootfs records. A worker restores onto its own copy; a manifest's
// rootfs.path comes from whoever wrote the output and may name any directory of the host.
func (m *Manifest) CheckRootfs(path string) error {
	if !filepath.IsAbs(path) {
		return fmt.Errorf("rootfs %q is not an absolute path", path)
	}
	data, err := os.ReadFile(filepath.Join(path, RootfsInfoFile))
	if err != nil {
		return fmt.Errorf("rootfs %s is not one the pipeline built: %w", path, err)
	}
	var info struct {
		Digest string `json:"digest"`
	}
	if err := json.Unmarshal(data, &info); err != nil {
		return fmt.Errorf("rootfs %s: %s: %w", path, RootfsInfoFile, err)
	}
	if info.Digest != m.Rootfs.Digest {
		return fmt.Errorf("rootfs %s is %s, the checkpoints were captured on %s", path, info.Digest, m.Rootfs.Digest)
	}
	return nil
}
