package testenv

import (
	"os/exec"
	"testing"
)

// DeadPID returns the pid of a process that has exited (and been reaped): a lock file naming
// it is a dead run's.
func DeadPID(t *testing.T) int {
	t.Helper()
	cmd := exec.Command("true")
	if err := cmd.Run(); err != nil {
		t.Fatal(err)
	}
	return cmd.Process.Pid
}
