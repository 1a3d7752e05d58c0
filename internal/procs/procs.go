// Package procs finds runsc's processes by what /proc says of them, not by runsc's own state:
// a sandbox whose state is gone (its root removed, or a create killed before it saved any) is
// still found. The soak samples its leftovers with it, and the tests check with it that
// nothing of theirs still runs.
package procs

import (
	"fmt"
	"os"
	"path/filepath"
	"strconv"
	"strings"
)

// Process is one runsc process: the runsc command, a runsc-sandbox or a runsc-gofer.
type Process struct {
	Pid, PPid int
	Args      []string
}

func (p Process) String() string {
	return fmt.Sprintf("pid %d (parent %d): %s", p.Pid, p.PPid, strings.Join(p.Args, " "))
}

// Runsc returns the live runsc processes (the base of argv[0] begins with "runsc"; zombies,
// whose command line is empty, are not) whose arguments match says are wanted.
func Runsc(match func(args []string) bool) ([]Process, error) {
	entries, err := os.ReadDir("/proc")
	if err != nil {
		return nil, err
	}
	var found []Process
	for _, e := range entries {
		pid, err := strconv.Atoi(e.Name())
		if err != nil {
			continue
		}
		data, err := os.ReadFile(filepath.Join("/proc", e.Name(), "cmdline"))
		if err != nil || len(data) == 0 {
			continue // gone since the listing, or a zombie
		}
		args := strings.Split(strings.TrimRight(string(data), "\x00"), "\x00")
		if !strings.HasPrefix(filepath.Base(args[0]), "runsc") || !match(args) {
			continue
		}
		found = append(found, Process{Pid: pid, PPid: parent(pid), Args: args})
	}
	return found, nil
}

// NameRoot matches the processes of the runsc state root root: runsc passes --root=ROOT to
// the sandbox and gofer processes it starts, as the kit passes it to runsc.
func NameRoot(root string) func(args []string) bool {
	return func(args []string) bool {
		for _, a := range args {
			if a == "--root="+root {
				return true
			}
		}
		return false
	}
}

// NameID matches the processes whose last argument, the sandbox's ID, contains part.
func NameID(part string) func(args []string) bool {
	return func(args []string) bool { return strings.Contains(args[len(args)-1], part) }
}

// parent returns the parent pid of pid (field 4 of /proc/PID/stat), or 0.
func parent(pid int) int {
	data, err := os.ReadFile(filepath.Join("/proc", strconv.Itoa(pid), "stat"))
	if err != nil {
		return 0
	}
	i := strings.LastIndexByte(string(data), ')')
	if i < 0 {
		return 0
	}
	fields := strings.Fields(string(data[i+1:]))
	if len(fields) < 2 {
		return 0
	}
	ppid, _ := strconv.Atoi(fields[1])
	return ppid
}
