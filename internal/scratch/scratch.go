// Package scratch makes the short-lived directories a run works in (bundles, sockets, a pull's
// files), named after a lease so that a later run removes them when their owner died.
package scratch

import (
	"os"

	"readie.dev/pipeline/internal/lease"
)

// Prefix names the runs' scratch directories: readie-scratch-RUN-RAND, after the run's
// lease. Pipelines from before leases named theirs rd-PID-RAND; those are never touched here
// (a pid cannot tell whose they are), and theirs never matched this name.
const Prefix = "readie-scratch-"

// Dir makes a short scratch directory for bundles and sockets (108-byte socket paths),
// named after the lease l (a run's, or a push's) so that a later run can remove it if this one
// is killed; it returns the directory and a function that removes it.
func Dir(l *lease.Lease) (string, func(), error) {
	tmp := os.TempDir()
	if err := l.Hold(tmp); err != nil {
		return "", nil, err
	}
	dir, err := os.MkdirTemp(tmp, Prefix+l.ID()+"-")
	if err != nil {
		return "", nil, err
	}
	return dir, func() { os.RemoveAll(dir) }, nil
}
