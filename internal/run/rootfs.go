package run

import (
	"fmt"
	"os"
	"path/filepath"
	"strings"

	"readie.dev/pipeline/internal/lease"
)

// PruneRootfs removes the rootfs directories under dir (a cache's rootfs/) that none of keep
// lies in: a manifest names its rootfs by path, so only a directory no output names may go.
// Package layers (layers/) and builds in progress (.tmp-*) are not rootfs directories and stay.
// With dryRun it removes nothing. It refuses while a run holds its lease in any of shared (the
// runsc root, the store: a run that uses a rootfs holds one there; any pid namespace or
// machine). It returns the directories it removed (or would remove).
func PruneRootfs(dir string, keep, shared []string, dryRun bool) ([]string, error) {
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
	entries, err := os.ReadDir(dir)
	if os.IsNotExist(err) {
		return nil, nil
	}
	if err != nil {
		return nil, err
	}
	var pruned []string
	for _, e := range entries {
		name := e.Name()
		if !e.IsDir() || name == "layers" || name == "oci" || strings.HasPrefix(name, ".") {
			continue
		}
		candidate := filepath.Join(dir, name)
		if named(candidate, keep) {
			continue
		}
		if dryRun {
			pruned = append(pruned, candidate)
			continue
		}
		if err := noneLive(); err != nil { // again: a run may have started since
			return pruned, err
		}
		pruned = append(pruned, candidate)
		// Out of its name at once (a rename), so no run can take a half-removed tree for a
		// complete one; what a killed prune leaves is a .tmp- leftover the next build of that
		// name removes (unpack.Once).
		aside, err := os.MkdirTemp(dir, ".tmp-"+name+"-pruned-")
		if err != nil {
			return pruned, err
		}
		if err := os.Rename(candidate, filepath.Join(aside, "tree")); err != nil {
			os.Remove(aside)
			return pruned, fmt.Errorf("remove %s: %w", candidate, err)
		}
		candidate = aside
		if err := os.RemoveAll(candidate); err != nil {
			return pruned, fmt.Errorf("remove %s: %w", candidate, err)
		}
	}
	return pruned, nil
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
