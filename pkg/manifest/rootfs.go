package manifest

import (
	"encoding/json"
	"fmt"
	"os"
	"path/filepath"

	"readie.dev/pipeline/pkg/limitread"
	"readie.dev/pipeline/pkg/sandbox"
)

// RootfsInfoFile is where a rootfs the pipeline built records its RootfsInfo, relative to its
// root: written when the rootfs is made (internal/oci/rootfs), read back by a run (its
// manifest's rootfs), by a worker (CheckRootfs) and by the tests.
const RootfsInfoFile = "usr/lib/readie/image.json"

// RootfsInfo is what a rootfs records of itself at RootfsInfoFile: its digest (of the base and
// the executor layer: a manifest's rootfs.digest) and where they came from.
type RootfsInfo struct {
	Digest     string `json:"digest"`
	BaseDigest string `json:"base_digest"`
	// ExecutorDigest covers the executor layer (for any site), the probe that finds its site,
	// the precompile and the executor's mount point: with the base's digest, everything the
	// rootfs is made from.
	ExecutorDigest string `json:"executor_digest"`
	// SitePackages is the directory of the image's python3 where the executor is installed.
	SitePackages string `json:"site_packages"`
	// Image is the OCI image the base was unpacked from, if it was.
	Image *Image `json:"image,omitempty"`
	// Process is the image config's environment, cwd and user, which every sandbox on this
	// rootfs runs with (nil: the default rootfs's, sandbox.Process's zero value).
	Process *sandbox.Process `json:"process,omitempty"`
	// PythonPath is the python3 found through the process's PATH, as the probe found it (a
	// venv's own bin/python3, not its realpath); Python is what the probe said of it. Both are
	// absent in a rootfs made before they were recorded.
	PythonPath string  `json:"python_path,omitempty"`
	Python     *Python `json:"python,omitempty"`
}

// SandboxProcess returns the process every sandbox on the rootfs runs with.
func (i *RootfsInfo) SandboxProcess() sandbox.Process {
	if i == nil || i.Process == nil {
		return sandbox.Process{}
	}
	return *i.Process
}

// ReadRootfsInfo reads the RootfsInfo that dir (a rootfs) records; one without a digest is an
// error.
func ReadRootfsInfo(dir string) (*RootfsInfo, error) {
	data, err := os.ReadFile(filepath.Join(dir, RootfsInfoFile))
	if err != nil {
		return nil, err
	}
	return parseRootfsInfo(data)
}

// rootfsInfoLimit bounds a RootfsInfoFile of another's making: the pipeline writes some
// hundreds of bytes.
const rootfsInfoLimit = 64 << 10

// ReadRootfsInfoIn reads the RootfsInfo of the rootfs root is opened on, as ReadRootfsInfo
// does, for a rootfs of another's making (a pulled runtime's): through root (no symbolic link
// leads out of it), a regular file (a FIFO would block the read for ever:
// limitread.OpenRegularIn) of at most rootfsInfoLimit.
func ReadRootfsInfoIn(root *os.Root) (*RootfsInfo, error) {
	data, err := limitread.ReadIn(root, RootfsInfoFile, rootfsInfoLimit, "the limit on a rootfs's record of itself")
	if err != nil {
		return nil, err
	}
	return parseRootfsInfo(data)
}

// parseRootfsInfo parses a RootfsInfoFile; one without a digest is an error.
func parseRootfsInfo(data []byte) (*RootfsInfo, error) {
	var info RootfsInfo
	if err := json.Unmarshal(data, &info); err != nil {
		return nil, fmt.Errorf("%s: %w", RootfsInfoFile, err)
	}
	if info.Digest == "" {
		return nil, fmt.Errorf("%s: no digest", RootfsInfoFile)
	}
	return &info, nil
}

// CheckRootfs checks that path is absolute and that the directory there records (in its
// RootfsInfoFile) the digest of m's rootfs. That is all it guarantees: it reads the record,
// never the tree, so any directory whose record names the digest passes, whoever wrote it (a
// rootfs another tenant unpacked on a shared worker, a directory with a planted record). It
// keeps a manifest from pointing the sandbox's root at a directory that is no pipeline rootfs
// (/, /etc); it does not prove the files are the ones captured on. A worker restores onto a
// rootfs it made or verified itself (-rootfs), never merely one a manifest's rootfs.path names.
func (m *Manifest) CheckRootfs(path string) error {
	if !filepath.IsAbs(path) {
		return fmt.Errorf("rootfs %q is not an absolute path", path)
	}
	data, err := os.ReadFile(filepath.Join(path, RootfsInfoFile))
	if err != nil {
		return fmt.Errorf("rootfs %s is not one the pipeline built: %w", path, err)
	}
	var info RootfsInfo
	if err := json.Unmarshal(data, &info); err != nil {
		return fmt.Errorf("rootfs %s: %s: %w", path, RootfsInfoFile, err)
	}
	if info.Digest != m.Rootfs.Digest {
		return fmt.Errorf("rootfs %s is %s, the checkpoints were captured on %s", path, info.Digest, m.Rootfs.Digest)
	}
	return nil
}
