package main

import (
	"errors"
	"fmt"
	"os"
	"syscall"
	"testing"

	"readie.dev/pipeline/internal/config"
	"readie.dev/pipeline/internal/run"
)

// TestExitCode: a command's error and the signal that stopped it give the pipeline's exit
// code: a signal wins over the error it caused, bad usage or config is 2, check-host's verdict that
// checkpoints do not restore 3, any other failure 1.
func TestExitCode(t *testing.T) {
	failed := errors.New("capture of a failed")
	usage := usagef("unknown flag --x")
	invalid := fmt.Errorf("pipeline.yaml: %w: sets[0].id is empty", config.ErrInvalid)
	setup := usageIfSetup(fmt.Errorf("%w: no runsc", run.ErrSetup))
	for _, tc := range []struct {
		name      string
		err       error
		stoppedBy os.Signal
		want      int
	}{
		{"success", nil, nil, 0},
		{"success despite a late signal", nil, syscall.SIGINT, 0},
		{"failure", failed, nil, 1},
		{"usage", usage, nil, 2},
		{"usage wrapped", fmt.Errorf("capture: %w", usage), nil, 2},
		{"invalid config", invalid, nil, 2},
		{"missing prerequisite", setup, nil, 2},
		{"check-host's verdict", fmt.Errorf("%w on this host: js", errDoesNotRestore), nil, 3},
		{"check-host's verdict, stopped", fmt.Errorf("%w on this host: js", errDoesNotRestore), syscall.SIGTERM, 143},
		{"SIGINT", failed, syscall.SIGINT, 130},
		{"SIGTERM", usage, syscall.SIGTERM, 143},
	} {
		if got := exitCode(tc.err, tc.stoppedBy); got != tc.want {
			t.Errorf("%s: exitCode(%v, %v) = %d; want %d", tc.name, tc.err, tc.stoppedBy, got, tc.want)
		}
	}
}
