// Package orphans removes the pipeline's sandboxes left by runs that are over (a run killed
// with SIGKILL cannot clean up after itself, in this pid namespace or another), judging each by
// the lease its ID carries (pkg/launch names them), and runsc's lock files such runs left.
package orphans

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io/fs"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"syscall"
	"time"

	"readie.dev/pipeline/internal/lease"
	"readie.dev/pipeline/pkg/atomicfile"
	"readie.dev/pipeline/pkg/launch"
	"readie.dev/pipeline/pkg/runsc"
)

// Orphan is a sandbox that Remove deleted: a leftover of a run that is over.
type Orphan struct {
	ID  string
	Run string // the lease ID of the run that made it
	// Note says how it was deleted when runsc could not be let do it alone: runsc recorded
	// pids for it that are not its processes here (it was made in another pid namespace).
	Note string
}

// Remove deletes the pipeline sandboxes under rt's root whose run is over (its lease in the
// root is not held) and the lock files such runs left, and returns the sandboxes; l is this
// run's lease. Sandboxes of live runs, this one's included, and sandboxes that are not the
// pipeline's are left alone.
func Remove(ctx context.Context, rt *launch.Runtime, l *lease.Lease) ([]Orphan, error) {
	r := sweep{rt: rt, lease: l}
	ids, err := rt.List(ctx)
	if err != nil {
		return nil, err
	}
	claims := map[string]*lease.Claim{}
	var removed []Orphan
	var errs []error
	for _, id := range ids {
		run, ok := OwnerRun(id)
		if !ok {
			continue
		}
		claim, seen := claims[run]
		if !seen {
			if claim, err = r.lease.TakeOver(r.rt.Root, run); err != nil {
				errs = append(errs, err)
			}
			claims[run] = claim
		}
		if claim == nil {
			continue // alive, or not known to be over
		}
		note, err := r.removeOrphan(ctx, id)
		if err != nil {
			errs = append(errs, fmt.Errorf("remove orphan %s: %w", id, err))
			continue
		}
		removed = append(removed, Orphan{ID: id, Run: run, Note: note})
	}
	errs = append(errs, r.removeStrayStateLocks(claims))
	for _, claim := range claims {
		if claim != nil {
			errs = append(errs, claim.Release())
		}
	}
	if _, err := r.lease.RemoveDeadLocks(r.rt.Root); err != nil {
		errs = append(errs, err)
	}
	return removed, errors.Join(errs...)
}

// sweep is one Remove: the runtime swept and this run's lease.
type sweep struct {
	rt    *launch.Runtime
	lease *lease.Lease
}

// removeStrayStateLocks removes runsc's lock files (ID_sandbox:ID.lock) that have no state
// file beside them, of pipeline sandboxes whose run is over. runsc opens that file with
// O_CREATE whenever it locks a container's state, so a `runsc list` (another run's sweep)
// that meets a container being deleted makes it again after `delete` removed it, and nothing
// of runsc removes it afterwards (seen: one in 5,000 soak restores while tests listed the root).
// A live run's container may have its lock before its state (runsc creates the lock first),
// so only runs judged over, by their lease, lose theirs. claims holds the runs already
// judged; it is added to.
func (r sweep) removeStrayStateLocks(claims map[string]*lease.Claim) error {
	entries, err := os.ReadDir(r.rt.Root)
	if err != nil {
		return fmt.Errorf("list %s: %w", r.rt.Root, err)
	}
	var errs []error
	for _, e := range entries {
		base, ok := strings.CutSuffix(e.Name(), ".lock")
		id, sandboxID, one := strings.Cut(base, "_sandbox:")
		if !ok || !one || id != sandboxID || !e.Type().IsRegular() {
			continue
		}
		run, ok := OwnerRun(id)
		if !ok {
			continue
		}
		state, lock := statePaths(r.rt.Root, id)
		if _, err := os.Lstat(state); !errors.Is(err, fs.ErrNotExist) {
			continue // a container runsc still knows: Remove judged it above
		}
		claim, seen := claims[run]
		if !seen {
			if claim, err = r.lease.TakeOver(r.rt.Root, run); err != nil {
				errs = append(errs, err)
			}
			claims[run] = claim
		}
		if claim == nil {
			continue // alive, or not known to be over
		}
		if err := os.Remove(lock); err != nil && !errors.Is(err, fs.ErrNotExist) {
			errs = append(errs, fmt.Errorf("remove runsc's stray lock file: %w", err))
		}
	}
	return errors.Join(errs...)
}

// removeOrphan deletes one sandbox of a run that is over. runsc's state records the pids of
// the sandbox's processes as the pid namespace that made it saw them; in another namespace
// those numbers name strangers (pid 10 of a pod is a kernel thread here), and `runsc delete`
// would signal them and wait minutes for them to stop. So the pids are checked first: each
// must be the sandbox's own runsc process here. When one is not, the sandbox's processes that
// are visible here are killed directly, runsc's state is told to forget the pids, and runsc
// deletes the rest (cgroups, control socket, state files) without signalling anyone.
func (r sweep) removeOrphan(ctx context.Context, id string) (string, error) {
	limit := r.rt.CommandTimeout
	if limit <= 0 {
		limit = runsc.DefaultCommandTimeout
	}
	ctx, cancel := context.WithTimeoutCause(ctx, limit, fmt.Errorf("removing orphan %s exceeded its timeout of %s", id, limit))
	defer cancel()
	note := ""
	recorded, err := recordedPids(r.rt.Root, id)
	if err != nil && !errors.Is(err, fs.ErrNotExist) { // gone meanwhile: delete --force succeeds
		return "", err
	}
	own := processesOf(id)
	var strangers []int
	for _, pid := range recorded {
		if pid != 0 && !slices.Contains(own, pid) {
			strangers = append(strangers, pid)
		}
	}
	if len(strangers) > 0 {
		for _, pid := range own {
			syscall.Kill(pid, syscall.SIGKILL)
		}
		if err := waitGone(ctx, id, own); err != nil {
			return "", err
		}
		if err := forgetPids(r.rt.Root, id); err != nil {
			return "", err
		}
		note = fmt.Sprintf("runsc recorded pids %v for it, which are not its processes in this pid namespace (it was made in another one): none of them was signalled", strangers)
		if len(own) > 0 {
			note += fmt.Sprintf("; its processes seen here (%v) were killed", own)
		}
	}
	if err := r.rt.Driver().Delete(ctx, id, &runsc.DeleteOpts{Force: true}); err != nil {
		return "", err
	}
	return note, nil
}

// statePaths are runsc's state file of a one-container sandbox and its lock file
// (runsc/container/state_file.go: "CONTAINER_sandbox:SANDBOX.state" and ".lock").
func statePaths(root, id string) (state, lock string) {
	base := filepath.Join(root, id+"_sandbox:"+id)
	return base + ".state", base + ".lock"
}

// runscState is the part of runsc's state file that holds pids: the gofer's at the top, the
// sandbox process's under "sandbox".
type runscState map[string]json.RawMessage

func (s runscState) pids(path string) (sandboxPid, goferPid int, sandbox map[string]json.RawMessage, err error) {
	if err := json.Unmarshal(s["sandbox"], &sandbox); err == nil {
		err = json.Unmarshal(sandbox["pid"], &sandboxPid)
		if err == nil {
			err = json.Unmarshal(s["goferPid"], &goferPid)
		}
		if err == nil {
			return sandboxPid, goferPid, sandbox, nil
		}
	}
	return 0, 0, nil, fmt.Errorf("runsc state %s has no sandbox.pid and goferPid: a format this pipeline does not know, so it signals nothing", path)
}

func readState(path string) (runscState, error) {
	data, err := os.ReadFile(path)
	if err != nil {
		return nil, err
	}
	var s runscState
	if err := json.Unmarshal(data, &s); err != nil {
		return nil, fmt.Errorf("runsc state %s: %w", path, err)
	}
	return s, nil
}

// recordedPids returns the sandbox and gofer pids runsc recorded for sandbox id.
func recordedPids(root, id string) ([]int, error) {
	path, _ := statePaths(root, id)
	s, err := readState(path)
	if err != nil {
		return nil, err
	}
	sandboxPid, goferPid, _, err := s.pids(path)
	if err != nil {
		return nil, err
	}
	return []int{sandboxPid, goferPid}, nil
}

// forgetPids sets the pids in sandbox id's runsc state to 0 ("no process"), under runsc's own
// lock of that state, so that `runsc delete` signals and waits for nobody.
func forgetPids(root, id string) error {
	path, lockPath := statePaths(root, id)
	lock, err := os.OpenFile(lockPath, os.O_RDWR|os.O_CREATE, 0o600)
	if err != nil {
		return err
	}
	defer lock.Close()
	if err := syscall.Flock(int(lock.Fd()), syscall.LOCK_EX|syscall.LOCK_NB); err != nil {
		return fmt.Errorf("lock %s (a runsc command holds it): %w", lockPath, err)
	}
	s, err := readState(path)
	if err != nil {
		return err
	}
	_, _, sandbox, err := s.pids(path)
	if err != nil {
		return err
	}
	sandbox["pid"] = json.RawMessage("0")
	if s["sandbox"], err = json.Marshal(sandbox); err != nil {
		return err
	}
	s["goferPid"] = json.RawMessage("0")
	data, err := json.Marshal(s)
	if err != nil {
		return err
	}
	return atomicfile.Write(path, data, 0o640)
}

// processesOf returns the pids, in this pid namespace, of the runsc processes of sandbox id:
// its sandbox ("runsc-sandbox ... boot ... ID") and gofer ("runsc-gofer ... gofer ... ID").
func processesOf(id string) []int {
	entries, _ := os.ReadDir("/proc")
	var pids []int
	for _, e := range entries {
		pid, err := strconv.Atoi(e.Name())
		if err != nil {
			continue
		}
		if isProcessOf(pid, id) {
			pids = append(pids, pid)
		}
	}
	return pids
}

func isProcessOf(pid int, id string) bool {
	data, err := os.ReadFile(fmt.Sprintf("/proc/%d/cmdline", pid))
	if err != nil {
		return false
	}
	args := strings.Split(strings.TrimSuffix(string(data), "\x00"), "\x00")
	return len(args) > 1 && (args[0] == "runsc-sandbox" || args[0] == "runsc-gofer") && args[len(args)-1] == id
}

// waitGone waits until none of pids is a process of sandbox id any more (gone, or a zombie:
// its cmdline is empty).
func waitGone(ctx context.Context, id string, pids []int) error {
	for _, pid := range pids {
		for isProcessOf(pid, id) {
			select {
			case <-ctx.Done():
				return fmt.Errorf("process %d still runs after SIGKILL: %w", pid, context.Cause(ctx))
			case <-time.After(10 * time.Millisecond):
			}
		}
	}
	return nil
}
