package executorproto

import (
	"fmt"

	"readie.dev/pipeline/pkg/exitcode"
)

// The codes the executor exits with besides 0 (images/executor/readie_executor/server.py,
// whose EXIT_ constants TestExitCodesMatchTheExecutor compares with these).
const (
	// ExitSettings: bad settings (EXECUTOR_DIR missing, a bad size).
	ExitSettings = 2
	// ExitImport: capture mode, an import of READIE_PREIMPORT failed; no checkpoint.
	ExitImport = 3
	// ExitCheckpoint: capture mode, the checkpoint could not be triggered or gVisor reported an
	// error.
	ExitCheckpoint = 4
	// ExitEnviron: after a restore, the restore-time environment could not be applied.
	ExitEnviron = 5
)

// ExitMeaning returns what an exit code of the executor (as exitcode.Of reads it from runsc's
// error) says, or "" for 0 and for a code the executor does not choose.
func ExitMeaning(code int) string {
	switch code {
	case ExitSettings:
		return "bad executor settings"
	case ExitImport:
		return "an import of the package set failed"
	case ExitCheckpoint:
		return "the checkpoint could not be triggered or gVisor reported an error"
	case ExitEnviron:
		return "the restore-time environment could not be applied"
	}
	if sig, ok := exitcode.Signal(code); ok {
		return fmt.Sprintf("killed by signal %d, %v", int(sig), sig)
	}
	return ""
}
