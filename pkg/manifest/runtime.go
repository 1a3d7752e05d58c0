package manifest

import (
	"errors"
	"fmt"
	"maps"
)

// ErrRuntime reports a runsc, helpers or rootfs other than the ones an output was captured
// with, or a manifest that does not record them.
var ErrRuntime = errors.New("not the runtime the output was captured with")

// The runtime checks below are byte for byte, for a runtime that goes with an output (push's
// runtime layers, pull --runtime's directory, and that directory's runsc before it runs):
// CheckHost's tolerance (another prewarmer, a missing helper: warnings; a runsc sha256 not
// recorded: not compared) answers whether restore works, not whether this is the runtime the
// output was captured with, and would ship, or run as root, one that is not.

// CheckRunsc refuses a runsc binary (sha256, its digest) or helpers (their digests, by name)
// other than m's: the same binary, the same helpers, each the same. A manifest that records no
// runsc sha256 or no rootfs digest names no runtime and is refused: an empty digest must not
// pass for a checked one.
func (m *Manifest) CheckRunsc(sha256 string, helpers map[string]string) error {
	if err := m.namesRuntime(); err != nil {
		return err
	}
	if sha256 != m.Runsc.SHA256 {
		return fmt.Errorf("%w: runsc is %s, the output was captured by %s", ErrRuntime, sha256, m.Runsc.SHA256)
	}
	if !maps.Equal(helpers, m.Runsc.Helpers) {
		return fmt.Errorf("%w: runsc's helpers are %s, the output was captured with %s", ErrRuntime,
			Runsc{Helpers: helpers}.HelpersText(), m.Runsc.HelpersText())
	}
	return nil
}

// CheckRootfsDigest refuses a rootfs of another digest than m's (of a manifest that names no
// runtime too: CheckRunsc).
func (m *Manifest) CheckRootfsDigest(digest string) error {
	if err := m.namesRuntime(); err != nil {
		return err
	}
	if digest != m.Rootfs.Digest {
		return fmt.Errorf("%w: the rootfs is %s, the output was captured on %s", ErrRuntime, digest, m.Rootfs.Digest)
	}
	return nil
}

// namesRuntime refuses a manifest that records no runsc sha256 or no rootfs digest.
func (m *Manifest) namesRuntime() error {
	if m.Runsc.SHA256 == "" || m.Rootfs.Digest == "" {
		return fmt.Errorf("%w: the manifest records no runsc sha256 or no rootfs digest, nothing to check a runtime against", ErrRuntime)
	}
	return nil
}
