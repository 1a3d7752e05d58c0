// Command gvisor_sentry is runsc's sentry helper, built from the pinned gVisor module by `make
// runsc` into gvisor-bin/ beside runsc: runsc boots every sandbox with it when it is there, and
// with itself, deprecated, when it is not (runsc/gvisorbinaries of the pin). gVisor builds its
// own with Bazel from a main package that its Go module does not export; this one is ours, with
// the sentry's two commands (runsc/cmd/sentry/sentrycmd): boot, and umount, which boot runs
// again in itself. It is a module of its own so that the pipeline's module does not depend on
// gVisor; go.mod pins the same gVisor as the Makefile's RUNSC_VERSION (a test checks).
package main

import (
	"gvisor.dev/gvisor/runsc/cli"
	"gvisor.dev/gvisor/runsc/cmd/sentry/sentrycmd"
	"gvisor.dev/gvisor/runsc/cmd/util"
	"gvisor.dev/gvisor/runsc/gvisorbinaries"
)

func main() {
	// The sidecar passed to Run checks, on start, that runsc's release is its own.
	cli.Run(&gvisorbinaries.GvisorSentry, map[util.SubCommand]string{
		new(sentrycmd.Boot):   "internal use only",
		new(sentrycmd.Umount): "internal use only",
	}, nil)
}
