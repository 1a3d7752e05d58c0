package runsc

import (
	"errors"
	"fmt"
	"io/fs"
	"os"
	"path/filepath"

	"readie.dev/pipeline/pkg/filedigest"
)

// The helpers runsc starts a sandbox with when it finds them, as gVisor ships them in
// gvisor-bin/ beside runsc (runsc/gvisorbinaries and runsc/sandbox of the pinned gVisor): the
// sentry, which runs the sandbox (without it runsc boots with itself, which gVisor deprecates),
// and the prewarmer, which runsc runs ahead of the sentry.
const (
	Sentry    = "gvisor_sentry"
	Prewarmer = "gvisor-sentry-prewarmer"
)

// HelperNames returns the names of the helpers a sandbox boots with, in the order runsc uses
// them.
func HelperNames() []string { return []string{Prewarmer, Sentry} }

// helpersDirEnv is the variable runsc reads for a helpers directory of another place.
const helpersDirEnv = "GVISOR_SIDECAR_BINARIES_DIR"

// ResolvedHelpersDir returns the directory runsc looks for its helpers in, by runsc's own rule: the
// Runsc's HelpersDir, else $GVISOR_SIDECAR_BINARIES_DIR (runsc inherits this process's
// environment), else gvisor-bin/ beside the binary, symbolic links resolved (runsc finds itself
// through /proc/self/exe). The directory need not exist.
func (r *Runsc) ResolvedHelpersDir() (string, error) {
	if r.HelpersDir != "" {
		return r.HelpersDir, nil
	}
	if dir := os.Getenv(helpersDirEnv); dir != "" {
		return dir, nil
	}
	exe, err := filepath.EvalSymlinks(r.Path)
	if err == nil {
		exe, err = filepath.Abs(exe)
	}
	if err != nil {
		return "", fmt.Errorf("runsc's helpers: resolve %s: %w", r.Path, err)
	}
	return filepath.Join(filepath.Dir(exe), "gvisor-bin"), nil
}

// Helpers returns the sha256 digest ("sha256:" and hex) of each helper runsc would use, by
// name (HelperNames); one it would not use (absent, not a regular file, not executable: runsc's
// test) is left out, so runsc without helpers gives an empty map.
func (r *Runsc) Helpers() (map[string]string, error) {
	dir, err := r.ResolvedHelpersDir()
	if err != nil {
		return nil, err
	}
	digests := map[string]string{}
	for _, name := range HelperNames() {
		path := filepath.Join(dir, name)
		info, err := os.Stat(path)
		if errors.Is(err, fs.ErrNotExist) || err == nil && (!info.Mode().IsRegular() || info.Mode().Perm()&0o111 == 0) {
			continue
		}
		if err == nil {
			_, digests[name], err = filedigest.Of(path)
		}
		if err != nil {
			return nil, fmt.Errorf("runsc's helper %s: %w", name, err)
		}
	}
	return digests, nil
}
