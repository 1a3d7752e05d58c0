package orphans

import (
	"path/filepath"
	"strings"
	"testing"

	"readie.dev/pipeline/internal/lease"
	"readie.dev/pipeline/pkg/launch"
)

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

// A set id of 64 characters (valid in a config, and what plan-sets makes of long import lists)
// still gives a sandbox ID whose control socket fits a Unix socket path in the runsc root.
func TestNewIDFitsASocketPath(t *testing.T) {
	l, err := lease.New()
	if err != nil {
		t.Fatal(err)
	}
	defer l.Release()
	root := t.TempDir()
	rt := &launch.Runtime{Root: root, Lease: l}
	long := strings.Repeat("sklearn_ensemble-", 4)[:64]
	a, err := rt.NewID(long, "prestarted")
	if err != nil {
		t.Fatal(err)
	}
	b, _ := rt.NewID(long[:63]+"x", "prestarted")
	if path := filepath.Join("/run/readie/runsc", "runsc-"+a+".sock"); len(path) > 107 {
		t.Errorf("control socket %s: %d bytes, over 107", path, len(path))
	}
	if run, ok := OwnerRun(a); !ok || run != l.ID() {
		t.Errorf("OwnerRun(%s) = %s, %v", a, run, ok)
	}
	if setPart := func(id string) string { return id[:strings.Index(id, "-prestarted-")] }; setPart(a) == setPart(b) {
		t.Errorf("two long set ids gave the same short form: %s %s", a, b)
	}
	if short, _ := rt.NewID("pandas", "capture"); !strings.HasPrefix(short, "readie-pandas-capture-") {
		t.Errorf("a short set id changed: %s", short)
	}
}
