package sandboxes

import "testing"

// OwnerRun decides which sandboxes a run may judge by their run's lease: it must read the run
// ID of the pipeline's IDs, set ids with dashes included, and never match anybody else's
// sandbox, nor a pipeline's from before leases (a pid where the run ID stands).
func TestOwnerRun(t *testing.T) {
	tests := []struct {
		id   string
		run  string
		ours bool
	}{
		{"readie-pandas-capture-0a1b2c3d4e5f-cf81d539", "0a1b2c3d4e5f", true},
		{"readie-my-set_2-measure-abcdef012345-0a0b0c0d", "abcdef012345", true},
		{"readie-pandas-capture-4242-cf81d539", "4242", false},
		{"readie-pandas-capture-012345678901-cf81d539", "012345678901", false},
		{"readie-x-0a1b2c3d4e5f-aa", "", false},
		{"readie-short", "", false},
		{"other-pandas-capture-0a1b2c3d4e5f-cf81d539", "", false},
		{"", "", false},
	}
	for _, tt := range tests {
		run, ok := OwnerRun(tt.id)
		if ok != tt.ours || ok && run != tt.run {
			t.Errorf("OwnerRun(%q) = %q, %v; want %q, %v", tt.id, run, ok, tt.run, tt.ours)
		}
	}
}
