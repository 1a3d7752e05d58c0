package testenv

import (
	"testing"

	"readie.dev/pipeline/internal/lease"
)

// NewLease returns a new lease, released when the test ends.
func NewLease(t *testing.T) *lease.Lease {
	t.Helper()
	l, err := lease.New()
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { l.Release() })
	return l
}
