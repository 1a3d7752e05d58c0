package launch

import (
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strconv"
	"strings"
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

// Resident returns the memory the sandbox holds: the proportional set size (Pss, so that
// pages its processes share are counted once) of its runsc processes (the sandbox, the gofer:
// those whose last argument is its ID) and of their children. It reads /proc only.
func (s *Sandbox) Resident() (int64, error) {
	entries, err := os.ReadDir("/proc")
	if err != nil {
		return 0, err
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
		if strings.HasPrefix(filepath.Base(args[0]), "runsc") && args[len(args)-1] == s.ID {
			roots = append(roots, pid)
		}
	}
	if len(roots) == 0 {
		return 0, fmt.Errorf("sandbox %s: no process of it runs", s.ID)
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
	var total int64
	for pid := range ours {
		kib, err := pss(pid)
		if err != nil {
			if errors.Is(err, os.ErrNotExist) {
				continue // a child that ended since
			}
			return 0, err
		}
		total += kib * 1024
	}
	return total, nil
}

// pss reads the Pss line of /proc/PID/smaps_rollup, in KiB.
func pss(pid int) (int64, error) {
	data, err := os.ReadFile("/proc/" + strconv.Itoa(pid) + "/smaps_rollup")
	if err != nil {
		return 0, err
	}
	for _, line := range strings.Split(string(data), "\n") {
		if rest, ok := strings.CutPrefix(line, "Pss:"); ok {
			return strconv.ParseInt(strings.TrimSuffix(strings.TrimSpace(rest), " kB"), 10, 64)
		}
	}
	return 0, fmt.Errorf("/proc/%d/smaps_rollup has no Pss line", pid)
}
