package exitcode_test

import (
	"context"
	"errors"
	"fmt"
	"os/exec"
	"syscall"
	"testing"
	"time"

	"readie.dev/pipeline/pkg/exitcode"
	"readie.dev/pipeline/pkg/runsc"
)

// shell runs script under sh and returns its error.
func shell(t *testing.T, script string) error {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	cmd := exec.CommandContext(ctx, "sh", "-c", script)
	cmd.WaitDelay = time.Second
	return cmd.Run()
}

// TestOf: a real process's own exit code is read through every kind of error that carries one,
// wrapped or not; a process killed by a signal and an error of no process carry none.
func TestOf(t *testing.T) {
	exited := shell(t, "exit 3")
	killed := shell(t, "kill -TERM $$")
	if killed == nil {
		t.Fatal("sh killed by SIGTERM returned no error")
	}
	for _, tc := range []struct {
		name string
		err  error
		code int
		ok   bool
	}{
		{"exec", exited, 3, true},
		{"exec wrapped", fmt.Errorf("python3 probe: %w", exited), 3, true},
		{"runsc", &runsc.ExitError{Status: 4}, 4, true},
		{"runsc wrapped", fmt.Errorf("%w: run x: %w: runsc said so", runsc.ErrFailed, &runsc.ExitError{Status: 137}), 137, true},
		{"killed by a signal", killed, -1, false},
		{"no process", errors.New("exit status 3"), -1, false},
		{"nil", nil, -1, false},
	} {
		if code, ok := exitcode.Of(tc.err); code != tc.code || ok != tc.ok {
			t.Errorf("%s: Of(%v) = %d, %v; want %d, %v", tc.name, tc.err, code, ok, tc.code, tc.ok)
		}
	}
}

// TestSignal: a signal's code is 128+N both ways, as sh reports a child that the signal killed.
func TestSignal(t *testing.T) {
	code, ok := exitcode.Of(shell(t, "sh -c 'kill -TERM $$'; exit $?"))
	if !ok || code != exitcode.ForSignal(syscall.SIGTERM) {
		t.Errorf("sh whose child was killed by SIGTERM exited %d, %v; want %d", code, ok, exitcode.ForSignal(syscall.SIGTERM))
	}
	if exitcode.ForSignal(syscall.SIGINT) != 130 || exitcode.ForSignal(syscall.SIGKILL) != 137 {
		t.Errorf("ForSignal(SIGINT), ForSignal(SIGKILL) = %d, %d; want 130, 137", exitcode.ForSignal(syscall.SIGINT), exitcode.ForSignal(syscall.SIGKILL))
	}
	for code, want := range map[int]syscall.Signal{130: syscall.SIGINT, 137: syscall.SIGKILL, 143: syscall.SIGTERM, 129: syscall.SIGHUP} {
		if sig, ok := exitcode.Signal(code); !ok || sig != want {
			t.Errorf("Signal(%d) = %v, %v; want %v", code, sig, ok, want)
		}
	}
	for _, code := range []int{-1, 0, 1, 2, 5, 127, 128, 200, 255} {
		if sig, ok := exitcode.Signal(code); ok {
			t.Errorf("Signal(%d) = %v; want no signal", code, sig)
		}
	}
}
