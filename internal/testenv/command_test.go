package testenv_test

import (
	"os"
	"strconv"
	"strings"
	"testing"
	"time"

	"readie.dev/pipeline/internal/testenv"
)

// TestCommandKillsItsGroup: a command past its limit is killed with the child it left in the
// background holding its output, so reading that output returns instead of waiting for the
// child.
func TestCommandKillsItsGroup(t *testing.T) {
	cmd := testenv.Command(t, time.Second, "sh", "-c", "sleep 600 & echo $!; wait")
	out, err := cmd.Output()
	if err == nil {
		t.Fatal("a command killed at its limit succeeded")
	}
	child, convErr := strconv.Atoi(strings.TrimSpace(string(out)))
	if convErr != nil {
		t.Fatalf("the command printed %q, not its child's pid (%v)", out, err)
	}
	deadline := time.Now().Add(time.Minute)
	for {
		stat, err := os.ReadFile("/proc/" + strconv.Itoa(child) + "/stat")
		// Gone, or a zombie its new parent has yet to reap.
		if err != nil || strings.Contains(string(stat), ") Z ") {
			return
		}
		if time.Now().After(deadline) {
			t.Fatalf("the background child %d outlived its command by a minute: %s", child, stat)
		}
		time.Sleep(20 * time.Millisecond)
	}
}
