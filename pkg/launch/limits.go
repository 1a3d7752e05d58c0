package launch

import (
	"bufio"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
)

var (
	// ErrMemoryLimit reports a sandbox the kernel's OOM killer ended when it went past its
	// memory limit (sandbox.Limits.Memory); the error names the limit.
	ErrMemoryLimit = errors.New("sandbox memory limit reached")
	// ErrPidsLimit reports a sandbox that went past its pids limit (sandbox.Limits.Pids): a
	// fork or thread was refused, which ends a gVisor sandbox; the error names the limit.
	ErrPidsLimit = errors.New("sandbox pids limit reached")
)

// cgroupRoot is where the host mounts its cgroups: runsc looks there too.
const cgroupRoot = "/sys/fs/cgroup"

// cgroupsPath is the cgroups path of the sandbox id: runsc's own default ("/" + ID), set in
// the spec so that the kit reads the counters where runsc makes them.
func cgroupsPath(id string) string { return "/" + id }

// cgroupEvents are what a sandbox's cgroups refused so far.
type cgroupEvents struct {
	oomKills    int64 // processes the OOM killer ended in the memory cgroup
	pidsRefused int64 // forks and clones the pids cgroup refused
}

// readCgroupEvents reads the events of the cgroups at path (a cgroups path, as in the spec)
// under the host's hierarchy: cgroup v2's memory.events and pids.events, or v1's
// memory.oom_control and pids.events in the mounts of those controllers. A cgroup that is gone
// (its sandbox deleted) is an error.
func readCgroupEvents(path string) (cgroupEvents, error) {
	var ev cgroupEvents
	memory, pids, unified, err := cgroupDirs(path)
	if err != nil {
		return ev, err
	}
	var errs []error
	oomFile := filepath.Join(memory, "memory.oom_control")
	if unified {
		oomFile = filepath.Join(memory, "memory.events")
	}
	if ev.oomKills, err = counter(oomFile, "oom_kill"); err != nil {
		errs = append(errs, err)
	}
	if pids != "" {
		if ev.pidsRefused, err = counter(filepath.Join(pids, "pids.events"), "max"); err != nil {
			errs = append(errs, err)
		}
	}
	return ev, errors.Join(errs...)
}

// cgroupDirs returns the directories of the memory and pids cgroups at path: one directory
// under a unified (v2) hierarchy, as runsc takes it when cgroupRoot is cgroup2 (unified true);
// or each controller's mount of a v1 one, a hybrid host's too ("" for pids when no mount has
// that controller).
func cgroupDirs(path string) (memory, pids string, unified bool, err error) {
	var fs syscall.Statfs_t
	if err := syscall.Statfs(cgroupRoot, &fs); err != nil {
		return "", "", false, fmt.Errorf("cgroups: %w", err)
	}
	const cgroup2Magic = 0x63677270
	if fs.Type == cgroup2Magic {
		dir := filepath.Join(cgroupRoot, path)
		return dir, dir, true, nil
	}
	mounts, err := v1Mounts()
	if err != nil {
		return "", "", false, err
	}
	if mounts["memory"] == "" {
		return "", "", false, errors.New("cgroups: no mount of the memory controller")
	}
	if pids = mounts["pids"]; pids != "" {
		pids = filepath.Join(pids, path)
	}
	return filepath.Join(mounts["memory"], path), pids, false, nil
}

// v1Mounts returns the mount point of each cgroup v1 controller this process sees
// (/proc/self/mountinfo: "... MOUNTPOINT ... - cgroup SOURCE rw,memory").
func v1Mounts() (map[string]string, error) {
	f, err := os.Open("/proc/self/mountinfo")
	if err != nil {
		return nil, fmt.Errorf("cgroups: %w", err)
	}
	defer f.Close()
	mounts := map[string]string{}
	scanner := bufio.NewScanner(f)
	for scanner.Scan() {
		before, after, ok := strings.Cut(scanner.Text(), " - ")
		fields, super := strings.Fields(before), strings.Fields(after)
		if !ok || len(fields) < 5 || len(super) < 3 || super[0] != "cgroup" {
			continue
		}
		for _, option := range strings.Split(super[2], ",") {
			if _, seen := mounts[option]; !seen {
				mounts[option] = fields[4]
			}
		}
	}
	return mounts, scanner.Err()
}

// counter returns the value of the line "name N" of a flat-keyed cgroup file.
func counter(file, name string) (int64, error) {
	data, err := os.ReadFile(file)
	if err != nil {
		return 0, fmt.Errorf("cgroups: %w", err)
	}
	for line := range strings.Lines(string(data)) {
		if key, value, ok := strings.Cut(strings.TrimSpace(line), " "); ok && key == name {
			return strconv.ParseInt(value, 10, 64)
		}
	}
	return 0, fmt.Errorf("cgroups: %s has no %s line", file, name)
}

// LimitError returns err, wrapped with ErrMemoryLimit or ErrPidsLimit and the limit, when the
// sandbox's cgroups say that it went past one of its limits (sandbox.Limits): what a call or a
// restore that failed because of it says. Call it before Delete, which removes the cgroups;
// err itself when the sandbox has no limits, nil for a nil err.
func (s *Sandbox) LimitError(err error) error {
	if err == nil || s.limits.IsZero() {
		return err
	}
	ev, readErr := readCgroupEvents(s.cgroupsPath)
	if readErr != nil && ev == (cgroupEvents{}) {
		return err // the cgroups are gone or unreadable: nothing to say of the limits
	}
	switch {
	case ev.oomKills > 0 && s.limits.Memory > 0:
		return fmt.Errorf("%w: sandbox %s went past its memory limit of %s and the kernel's OOM killer ended it: %w", ErrMemoryLimit, s.ID, s.limits.Memory, err)
	case ev.pidsRefused > 0 && s.limits.Pids > 0:
		return fmt.Errorf("%w: %w", s.pidsError(ev.pidsRefused), err)
	}
	return err
}

// pidsRefused returns how many tasks the sandbox's pids cgroup refused so far; 0 without a
// pids limit or when its cgroup cannot be read.
func (s *Sandbox) pidsRefused() int64 {
	if s.limits.Pids == 0 {
		return 0
	}
	ev, _ := readCgroupEvents(s.cgroupsPath)
	return ev.pidsRefused
}

// pidsError says that the pids limit refused refused tasks.
func (s *Sandbox) pidsError(refused int64) error {
	return fmt.Errorf("%w: sandbox %s went past its pids limit of %d host tasks (%d forks or threads refused; the application sees ENOMEM, or the sandbox ends)", ErrPidsLimit, s.ID, s.limits.Pids, refused)
}

// statusKilled is a process's status when SIGKILL ended it (128+9), as the kernel's OOM killer
// does.
const statusKilled = 128 + int(syscall.SIGKILL)

// runLimitError is LimitError for a sandbox run in the foreground (Run), whose cgroups runsc
// removed when it returned: a sandbox with a memory limit that SIGKILL ended is taken for one
// the OOM killer ended, and says so.
func (s *Sandbox) runLimitError(status int, err error) error {
	if err == nil || status != statusKilled || s.limits.Memory == 0 {
		return err
	}
	return fmt.Errorf("%w: sandbox %s was killed (status %d), as the kernel's OOM killer ends a sandbox past its memory limit of %s: %w", ErrMemoryLimit, s.ID, status, s.limits.Memory, err)
}
