package launch

import (
	"fmt"
	"os"
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
