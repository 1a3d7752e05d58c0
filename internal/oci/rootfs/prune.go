package rootfs

import (
	"errors"
	"os"
	"path/filepath"
	"strings"
	"time"

	"readie.dev/pipeline/internal/lease"
	"readie.dev/pipeline/internal/oci/unpack"
)

// OCIDir is the directory, under a cache's rootfs/, of the images unpacked from registries and
// layouts (unpack.IntoCache).
const OCIDir = "oci"

// Prune removes the rootfs directories under dir (a cache's rootfs/) that none of keep
// lies in: a manifest names its rootfs by path, so only a directory no output names may go.
// With unusedSince set, it also removes the images unpacked under oci/ last used before it
// (unpack.LastUse): no manifest names them, a rootfs made from one keeps its files (hard
// links), and a run that needs one unpacks it again. Package layers (layers/) stay. Work
// directories of runs that died making a directory (.tmp-*) go (unpack.RemoveDead); those of
// runs making one now stay, and so does a directory being made. With dryRun it removes
// nothing. It refuses while a run holds its lease in any of shared (the runsc root, the
// store: a run that uses a rootfs or an unpacked image holds one there; any pid namespace or
// machine). It returns the directories it removed (or would remove).
func Prune(dir string, keep, shared []string, unusedSince time.Time, dryRun bool) ([]string, error) {
	noneLive := func() error {
		for _, d := range shared {
			if err := lease.NoneLive(d); err != nil {
				return err
			}
		}
		return nil
	}
	if !dryRun {
		if err := noneLive(); err != nil {
			return nil, err
		}
	}
	var pruned []string
	if !dryRun {
		for _, parent := range []string{dir, filepath.Join(dir, OCIDir)} {
			dead, err := unpack.RemoveDead(parent)
			pruned = append(pruned, dead...)
			if err != nil {
				return pruned, err
			}
		}
	}
	candidates, err := rootfsCandidates(dir, keep, unusedSince)
	if err != nil {
		return pruned, err
	}
	for _, candidate := range candidates {
		if dryRun {
			pruned = append(pruned, candidate)
			continue
		}
		if err := noneLive(); err != nil { // again: a run may have started since
			return pruned, err
		}
		removed, err := unpack.Remove(candidate)
		if err != nil {
			return pruned, err
		}
		if removed {
			pruned = append(pruned, candidate)
		}
	}
	return pruned, nil
}

// rootfsCandidates returns what Prune would remove: the rootfs directories under dir that
// no path of keep lies in, then (with unusedSince set) the complete unpacked images under oci/
// last used before unusedSince.
func rootfsCandidates(dir string, keep []string, unusedSince time.Time) ([]string, error) {
	entries, err := os.ReadDir(dir)
	if errors.Is(err, os.ErrNotExist) {
		return nil, nil
	}
	if err != nil {
		return nil, err
	}
	var candidates []string
	for _, e := range entries {
		name := e.Name()
		if !e.IsDir() || name == "layers" || name == OCIDir || strings.HasPrefix(name, ".") {
			continue
		}
		if candidate := filepath.Join(dir, name); !named(candidate, keep) {
			candidates = append(candidates, candidate)
		}
	}
	if unusedSince.IsZero() {
		return candidates, nil
	}
	oci := filepath.Join(dir, OCIDir)
	images, err := os.ReadDir(oci)
	if errors.Is(err, os.ErrNotExist) {
		return candidates, nil
	}
	if err != nil {
		return nil, err
	}
	for _, e := range images {
		if !e.IsDir() || strings.HasPrefix(e.Name(), ".") {
			continue
		}
		image := filepath.Join(oci, e.Name())
		if used, complete := unpack.LastUse(image); complete && used.Before(unusedSince) {
			candidates = append(candidates, image)
		}
	}
	return candidates, nil
}

// named reports whether any path in keep is dir or lies inside it.
func named(dir string, keep []string) bool {
	for _, k := range keep {
		if rel, err := filepath.Rel(dir, k); err == nil && filepath.IsLocal(rel) || k == dir {
			return true
		}
	}
	return false
}
