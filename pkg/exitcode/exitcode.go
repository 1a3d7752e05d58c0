// Package exitcode classifies how a process ended, in the one convention that the pipeline,
// its example worker, runsc and the executor share: 0 for success, a small code the process
// chose (OK, Failed, Usage for the pipeline and the worker; the executor's own in
// pkg/executorproto), or 128+N for a process stopped by signal N, as a shell reports it and as
// `runsc run` and `runsc restore` report a sandbox process killed by N.
package exitcode

import (
	"errors"
	"syscall"
)

// The codes the pipeline's commands and the example worker exit with.
const (
	// OK: the command did what it was asked.
	OK = 0
	// Failed: a capture, measurement, smoke test, verification, restore or call failed.
	Failed = 1
	// Usage: bad flags, config or input; nothing was attempted.
	Usage = 2
	// DoesNotRestore: a check worked and its verdict is no: `pipeline check-host` found
	// checkpoints that will not restore on the host (a check that could not be made is Failed
	// or Usage).
	DoesNotRestore = 3
)

// signalBase is what a shell adds to a signal's number for the status of a process it stopped.
const signalBase = 128

// Of returns the exit code that err carries: that of an *exec.ExitError, a *runsc.ExitError, or
// any error in err's chain with an ExitCode method. ok is false when err carries none, or when
// the process did not exit on its own (an *exec.ExitError of a process killed by a signal): a
// runsc killed by a signal is not a sandbox process that exited with 128+N.
func Of(err error) (code int, ok bool) {
	var coded interface{ ExitCode() int }
	if errors.As(err, &coded) && coded.ExitCode() >= 0 {
		return coded.ExitCode(), true
	}
	return -1, false
}

// ForSignal returns the exit code of a process stopped by sig: 128+N.
func ForSignal(sig syscall.Signal) int { return signalBase + int(sig) }

// Signal returns the signal that code reports (128+N for a signal N), and false when code is
// not a signal's.
func Signal(code int) (syscall.Signal, bool) {
	sig := syscall.Signal(code - signalBase)
	if code <= signalBase || sig > 64 {
		return 0, false
	}
	return sig, true
}
