package testenv

import (
	"context"
	"fmt"
	"os"
	"os/exec"
	"syscall"
	"testing"
	"time"
)

// Command returns a command for a test, in a process group of its own. The group is killed
// when limit passes and again when the test ends, so nothing it starts in the background
// outlives the test or holds a pipe that Wait or go test waits on; WaitDelay bounds Wait
// when something outside the group still holds its output.
func Command(t testing.TB, limit time.Duration, name string, args ...string) *exec.Cmd {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), limit)
	cmd := exec.CommandContext(ctx, name, args...)
	cmd.SysProcAttr = &syscall.SysProcAttr{Setpgid: true}
	test := t.Name()
	cmd.Cancel = func() error {
		if ctx.Err() == context.DeadlineExceeded {
			// Not t.Logf: this may run after the test has ended.
			fmt.Fprintf(os.Stderr, "%s: killing %s %q: it ran past its limit of %s\n", test, name, args, limit)
		}
		return syscall.Kill(-cmd.Process.Pid, syscall.SIGKILL)
	}
	cmd.WaitDelay = 10 * time.Second
	t.Cleanup(func() {
		cancel()
		if cmd.Process != nil {
			syscall.Kill(-cmd.Process.Pid, syscall.SIGKILL)
		}
	})
	return cmd
}
