package run

import (
	"fmt"
	"os"
	"path/filepath"
	"strconv"
	"strings"

	"readie.dev/pipeline/pkg/sandbox"
)

// workDir is a short scratch directory for bundles and sockets (108-byte socket paths), named
// after this process so that a later run can remove it if this one is killed.
func workDir() (string, func(), error) {
	dir, err := os.MkdirTemp("", fmt.Sprintf("rd-%d-", os.Getpid()))
	if err != nil {
		return "", nil, err
	}
	return dir, func() { os.RemoveAll(dir) }, nil
}

// deadOwner reports whether name ends in "-PID" (after prefix) of a process that is gone.
func deadOwner(name, prefix string) bool {
	rest, ok := strings.CutPrefix(name, prefix)
	if !ok {
		return false
	}
	pid, err := strconv.Atoi(strings.SplitN(rest, "-", 2)[0])
	return err == nil && pid > 0 && !sandbox.ProcessAlive(pid)
}

// removeDeadWorkDirs removes the scratch directories (rd-PID-*) of runs whose process is gone.
func removeDeadWorkDirs(tmp string) []string {
	dirs, _ := filepath.Glob(filepath.Join(tmp, "rd-*-*"))
	var removed []string
	for _, dir := range dirs {
		if deadOwner(filepath.Base(dir), "rd-") && os.RemoveAll(dir) == nil {
			removed = append(removed, dir)
		}
	}
	return removed
}

// sweepOutput cleans up after runs over out that were killed (a run that fails on its own
// cleans up itself): it removes their staging directories (OUT.staging-PID), and puts back a
// previous output that a killed swap left aside (OUT.old-PID) when OUT itself is missing, or
// removes it when OUT is there. It returns what it did, one line each, for the log.
func sweepOutput(out string) ([]string, error) {
	out = strings.TrimSuffix(out, "/")
	var did []string
	staging, _ := filepath.Glob(out + ".staging-*")
	for _, dir := range staging {
		if !deadOwner(filepath.Base(dir), filepath.Base(out)+".staging-") {
			continue
		}
		if err := os.RemoveAll(dir); err != nil {
			return did, fmt.Errorf("remove the staging directory of a run that died: %w", err)
		}
		did = append(did, "removed the staging directory of a run that died: "+dir)
	}
	old, _ := filepath.Glob(out + ".old-*")
	for _, dir := range old {
		if !deadOwner(filepath.Base(dir), filepath.Base(out)+".old-") {
			continue
		}
		if _, err := os.Lstat(out); os.IsNotExist(err) {
			if err := os.Rename(dir, out); err != nil {
				return did, fmt.Errorf("put back the previous output %s: %w", dir, err)
			}
			did = append(did, "put back the previous output that a run which died had moved aside: "+dir)
			continue
		}
		if err := carryOver(dir, out); err != nil {
			return did, fmt.Errorf("take the history of the output over from %s: %w", dir, err)
		}
		if err := os.RemoveAll(dir); err != nil {
			return did, fmt.Errorf("remove the previous output of a run that died: %w", err)
		}
		did = append(did, "removed the previous output that a run which died had moved aside: "+dir)
	}
	return did, nil
}

// writeOutput writes out the way a capture does, for a step that starts no sandbox (merge,
// pull): out's lock, a sweep of dead runs' leftovers, a staging directory that fill writes,
// and the swap. When fill fails, out is left as it was and staging removed.
func writeOutput(out string, fill func(staging string) error) error {
	if err := checkOutput(out); err != nil {
		return err
	}
	lock, err := LockOutput(out)
	if err != nil {
		return err
	}
	defer lock.Unlock()
	if _, err := sweepOutput(out); err != nil {
		return err
	}
	staging := fmt.Sprintf("%s.staging-%d", strings.TrimSuffix(out, "/"), os.Getpid())
	if err := os.RemoveAll(staging); err != nil {
		return err
	}
	if err := os.MkdirAll(staging, 0o755); err != nil {
		return err
	}
	if err := fill(staging); err != nil {
		os.RemoveAll(staging)
		return fmt.Errorf("%w (%s left as it was)", err, out)
	}
	return replaceDir(out, staging)
}
