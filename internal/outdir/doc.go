// Package outdir holds the life cycle of an output directory: its lock (LockOutput,
// ReadLockOutput), the staging directory a new output is written into and swapped in
// (ThroughStaging, Write), the sweep of what killed runs left beside and in it (Sweep), and
// the checks that it is an output of the pipeline (Check, Verify).
package outdir

import "errors"

// ErrSetup reports a missing prerequisite or bad input (exit code 2); anything else that
// fails a run is a pipeline failure (exit code 1).
var ErrSetup = errors.New("setup")
