package sandbox

import "testing"

// OwnerPID decides which sandboxes a run may delete as orphans: it must read the pid of the
// pipeline's IDs, set ids with dashes included, and never match anybody else's sandbox.
func TestOwnerPID(t *testing.T) {
	tests := []struct {
		id   string
		pid  int
		ours bool
	}{
		{"readie-pandas-capture-4242-cf81d539", 4242, true},
		{"readie-my-set_2-measure-17-0a0b0c0d", 17, true},
		{"readie-x-0-aa", 0, false},
		{"readie-x-abc-aa", 0, false},
		{"readie-short", 0, false},
		{"other-pandas-capture-4242-cf81d539", 0, false},
		{"", 0, false},
	}
	for _, tt := range tests {
		pid, ok := OwnerPID(tt.id)
		if pid != tt.pid || ok != tt.ours {
			t.Errorf("OwnerPID(%q) = %d, %v; want %d, %v", tt.id, pid, ok, tt.pid, tt.ours)
		}
	}
}
