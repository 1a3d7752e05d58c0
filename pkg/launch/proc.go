package launch

import (
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"syscall"
)

// readPid reads the sandbox process's pid from runsc's pid file and its start time.
func readPid(path string) (int, string, error) {
	data, err := os.ReadFile(path)
	if err != nil {
		return 0, "", fmt.Errorf("runsc create wrote no pid file: %w", err)
	}
	pid, err := strconv.Atoi(strings.TrimSpace(string(data)))
	if err != nil || pid <= 0 {
		return 0, "", fmt.Errorf("pid file %s holds %q, not a pid", path, data)
	}
	_, start, err := procStat(pid)
	if err != nil {
		return 0, "", fmt.Errorf("the sandbox process %d: %w", pid, err)
	}
	return pid, start, nil
}

// procStat returns fields 3 and 22 of /proc/PID/stat: the process's state and its start time
// in clock ticks since boot (a pid reused by another process has another).
func procStat(pid int) (state, start string, err error) {
	data, err := os.ReadFile("/proc/" + strconv.Itoa(pid) + "/stat")
	if err != nil {
		return "", "", err
	}
	// The command name (field 2) may hold spaces and parentheses: count after its last ')'.
	i := strings.LastIndexByte(string(data), ')')
	if i < 0 {
		return "", "", fmt.Errorf("/proc/%d/stat: no command name", pid)
	}
	fields := strings.Fields(string(data[i+1:]))
	if len(fields) < 20 {
		return "", "", fmt.Errorf("/proc/%d/stat: %d fields after the name", pid, len(fields))
	}
	return fields[0], fields[19], nil
}

// Memory is what a sandbox's processes hold, from their /proc/PID/smaps_rollup, in bytes.
type Memory struct {
	// Resident is their proportional set size (Pss): a page they share with other processes
	// counts as its share.
	Resident int64
	// Own is the anonymous and shared-memory part of Resident (Pss_Anon + Pss_Shmem): the
	// sandbox's kernel and application memory, which no other sandbox maps. A further sandbox
	// of the same checkpoint adds about as much.
	Own int64
	// Files is the file-backed part of Resident (Pss_File): runsc's text and the files the
	// application maps, shared with every process of the host that maps them, so that it
	// shrinks as more sandboxes run.
	Files int64
}

// Memory returns the memory the sandbox holds: that of its runsc processes (the sandbox, the
// gofer: those whose last argument is its ID) and of their children. It reads /proc only.
func (s *Sandbox) Memory() (Memory, error) {
	m, n, err := memoryOf(func(args []string) bool { return args[len(args)-1] == s.ID })
	if err == nil && n == 0 {
		err = fmt.Errorf("sandbox %s: no process of it runs", s.ID)
	}
	return m, err
}

// Memory returns the memory every sandbox of the runtime holds (the runsc processes run with
// its --root whose last argument, the sandbox's ID, carries its lease's ID when it has one,
// and their children) and how many sandboxes that is: a worker's whole footprint. It reads
// /proc only.
func (r *Runtime) Memory() (Memory, int, error) {
	root := "--root=" + r.Root
	lease := ""
	if r.Lease != nil {
		lease = "-" + r.Lease.ID() + "-"
	}
	ids := map[string]bool{}
	m, _, err := memoryOf(func(args []string) bool {
		id := args[len(args)-1]
		if !slices.Contains(args, root) || !strings.Contains(id, lease) {
			return false
		}
		ids[id] = true
		return true
	})
	return m, len(ids), err
}

// memoryOf sums the memory of the runsc processes whose arguments match (args[0] is runsc's,
// the list never empty) and of their children, and says how many processes matched.
func memoryOf(match func(args []string) bool) (Memory, int, error) {
	entries, err := os.ReadDir("/proc")
	if err != nil {
		return Memory{}, 0, err
	}
	parents := map[int]int{}
	var roots []int
	for _, e := range entries {
		pid, err := strconv.Atoi(e.Name())
		if err != nil {
			continue
		}
		data, err := os.ReadFile("/proc/" + e.Name() + "/stat")
		if err != nil {
			continue // gone since the listing
		}
		i := strings.LastIndexByte(string(data), ')')
		fields := strings.Fields(string(data[i+1:]))
		if i < 0 || len(fields) < 2 {
			continue
		}
		if ppid, err := strconv.Atoi(fields[1]); err == nil {
			parents[pid] = ppid
		}
		cmdline, err := os.ReadFile("/proc/" + e.Name() + "/cmdline")
		if err != nil || len(cmdline) == 0 {
			continue
		}
		args := strings.Split(strings.TrimRight(string(cmdline), "\x00"), "\x00")
		if strings.HasPrefix(filepath.Base(args[0]), "runsc") && match(args) {
			roots = append(roots, pid)
		}
	}
	ours := map[int]bool{}
	for _, pid := range roots {
		ours[pid] = true
	}
	for grew := true; grew; { // children, and theirs
		grew = false
		for pid, ppid := range parents {
			if !ours[pid] && ours[ppid] {
				ours[pid], grew = true, true
			}
		}
	}
	var total Memory
	for pid := range ours {
		m, err := rollup(pid)
		if err != nil {
			if errors.Is(err, os.ErrNotExist) || errors.Is(err, syscall.ESRCH) {
				continue // a process that ended since (gone, or a zombie): it holds nothing
			}
			return Memory{}, 0, err
		}
		total.Resident += m.Resident
		total.Own += m.Own
		total.Files += m.Files
	}
	return total, len(roots), nil
}

// rollup reads the Pss lines of /proc/PID/smaps_rollup.
func rollup(pid int) (Memory, error) {
	path := "/proc/" + strconv.Itoa(pid) + "/smaps_rollup"
	data, err := os.ReadFile(path)
	if err != nil {
		return Memory{}, err
	}
	if len(data) == 0 { // a zombie's: it has no address space left
		return Memory{}, nil
	}
	kib := map[string]int64{}
	for _, line := range strings.Split(string(data), "\n") {
		name, rest, ok := strings.Cut(line, ":")
		if !ok || !strings.HasPrefix(name, "Pss") {
			continue
		}
		n, err := strconv.ParseInt(strings.TrimSuffix(strings.TrimSpace(rest), " kB"), 10, 64)
		if err != nil {
			return Memory{}, fmt.Errorf("%s: %s: %w", path, line, err)
		}
		kib[name] = n
	}
	// Pss_Anon, Pss_File and Pss_Shmem are Linux 5.14's: an older kernel's rollup lacks them.
	for _, name := range []string{"Pss", "Pss_Anon", "Pss_File", "Pss_Shmem"} {
		if _, ok := kib[name]; !ok {
			return Memory{}, fmt.Errorf("%s has no %s line (Linux 5.14 or later has)", path, name)
		}
	}
	return Memory{Resident: kib["Pss"] << 10, Own: (kib["Pss_Anon"] + kib["Pss_Shmem"]) << 10, Files: kib["Pss_File"] << 10}, nil
}
