package orphans

import (
	"strings"

	"readie.dev/pipeline/internal/lease"
)

// OwnerRun returns the lease ID of the run that a pipeline sandbox ID carries (launch's
// Runtime.NewID writes it). IDs of pipelines from before leases carry a pid there instead,
// and are not the pipeline's to judge.
func OwnerRun(id string) (string, bool) {
	if !strings.HasPrefix(id, "readie-") {
		return "", false
	}
	parts := strings.Split(id, "-")
	if len(parts) < 5 {
		return "", false
	}
	run := parts[len(parts)-2]
	return run, lease.IsID(run)
}
