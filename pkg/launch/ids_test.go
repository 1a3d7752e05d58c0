package launch

import (
	"errors"
	"os"
	"path/filepath"
	"strings"
	"testing"

	specs "github.com/opencontainers/runtime-spec/specs-go"

	"readie.dev/pipeline/pkg/checkpointid"
	"readie.dev/pipeline/pkg/sandbox"
)

// fakeLease is a lease with a given ID that records the directories it was asked to hold.
type fakeLease struct {
	id   string
	held []string
}

func (l *fakeLease) ID() string { return l.id }
func (l *fakeLease) Hold(dir string) error {
	l.held = append(l.held, dir)
	return nil
}

// badIDs are names that must never become a path: separators, dot names, NUL, spaces,
// non-ASCII, empty.
var badIDs = []string{"", ".", "..", "../x", "a/b", "/abs", "a\x00b", "a b", "a.b", "é"}

func TestCheckID(t *testing.T) {
	for _, id := range []string{"readie-x-capture-0a1b2c3d4e5f-cf81d539", "worker-numpy-0a0b0c0d", strings.Repeat("x", MaxIDLen)} {
		if err := CheckID(id); err != nil {
			t.Errorf("CheckID(%q) = %v", id, err)
		}
	}
	for _, id := range append(badIDs, strings.Repeat("x", MaxIDLen+1)) {
		if err := CheckID(id); !errors.Is(err, ErrID) {
			t.Errorf("CheckID(%q) = %v, want ErrID", id, err)
		}
		if _, err := HostDir("/work", id); !errors.Is(err, ErrID) {
			t.Errorf("HostDir(/work, %q) = %v, want ErrID", id, err)
		}
	}
	// An id no longer than its host directory's name would make the bundle its host directory.
	for _, id := range []string{"a", "abcdefgh"} {
		if host, err := HostDir("/work", id); !errors.Is(err, ErrID) {
			t.Errorf("HostDir(/work, %q) = %q, %v, want ErrID", id, host, err)
		}
	}
	if host, err := HostDir("/work", "abcdefghi"); err != nil || host != "/work/bcdefghi" {
		t.Errorf("HostDir(/work, abcdefghi) = %q, %v", host, err)
	}
}

// TestNewIDRefusesParts: a set id that is no checkpoint id, or a step or a lease ID that is no
// short plain name, is refused naming the part, before the lease is held in the runsc root.
func TestNewIDRefusesParts(t *testing.T) {
	long := strings.Repeat("s", checkpointid.MaxLen+1)
	for _, tt := range []struct{ set, step, lease, part string }{
		{"../../etc", "capture", "0a1b2c3d4e5f", "set"},
		{"a/b", "capture", "0a1b2c3d4e5f", "set"},
		{"..", "capture", "0a1b2c3d4e5f", "set"},
		{"a\x00", "capture", "0a1b2c3d4e5f", "set"},
		{long, "capture", "0a1b2c3d4e5f", "set"},
		{"", "capture", "0a1b2c3d4e5f", "set"},
		{"numpy", "../x", "0a1b2c3d4e5f", "step"},
		{"numpy", "", "0a1b2c3d4e5f", "step"},
		{"numpy", strings.Repeat("p", maxStepLen+1), "0a1b2c3d4e5f", "step"},
		{"numpy", "capture", "../../tmp", "lease ID"},
		{"numpy", "capture", strings.Repeat("0", maxLeaseIDLen+1), "lease ID"},
	} {
		lease := &fakeLease{id: tt.lease}
		rt := &Runtime{Root: "/nonexistent/root", Lease: lease}
		id, err := rt.NewID(tt.set, tt.step)
		if !errors.Is(err, ErrID) || !strings.Contains(err.Error(), tt.part) {
			t.Errorf("NewID(%q, %q) with lease %q = %q, %v; want ErrID naming the %s", tt.set, tt.step, tt.lease, id, err, tt.part)
		}
		if len(lease.held) > 0 {
			t.Errorf("NewID(%q, %q) held the lease in %v before refusing", tt.set, tt.step, lease.held)
		}
	}
}

// TestNewIDLongestFits: the longest parts NewID takes give an ID that CheckID accepts, that
// begins with IDPrefix, and whose host directory and bundle are single entries of the work
// directory.
func TestNewIDLongestFits(t *testing.T) {
	lease := &fakeLease{id: strings.Repeat("L", maxLeaseIDLen)}
	rt := &Runtime{Root: "/r", Lease: lease}
	set, step := strings.Repeat("s", checkpointid.MaxLen), strings.Repeat("p", maxStepLen)
	id, err := rt.NewID(set, step)
	if err != nil {
		t.Fatal(err)
	}
	if err := CheckID(id); err != nil {
		t.Errorf("NewID gave %q (%d bytes), which CheckID refuses: %v", id, len(id), err)
	}
	prefix, err := rt.IDPrefix(set, step)
	if err != nil || !strings.HasPrefix(id, prefix) || len(id) != len(prefix)+8 {
		t.Errorf("IDPrefix = %q, %v; NewID gave %q", prefix, err, id)
	}
	host, err := HostDir("/work", id)
	if err != nil || filepath.Dir(host) != "/work" {
		t.Errorf("HostDir(/work, %q) = %q, %v", id, host, err)
	}
	if len(lease.held) != 1 || lease.held[0] != "/r" {
		t.Errorf("the lease was held in %v, want [/r]", lease.held)
	}
}

// TestNewSandboxRefusesIDs: an ID that would be a path makes nothing on disk: no bundle, no
// log, nothing in the work directory; a launcher given a set id that is no checkpoint id makes
// no host directory either.
func TestNewSandboxRefusesIDs(t *testing.T) {
	work := t.TempDir()
	rt := &Runtime{Root: filepath.Join(work, "root"), Lease: &fakeLease{id: "0a1b2c3d4e5f"}}
	spec := func(string) (*specs.Spec, error) { return &specs.Spec{Process: &specs.Process{}}, nil }
	for _, id := range append(badIDs, "../escaped", strings.Repeat("x", MaxIDLen+1)) {
		o := SandboxOptions{Runtime: rt, WorkDir: work, IDs: fixedID(id), Spec: spec}
		if sb, err := NewSandbox(o, "set", "step"); !errors.Is(err, ErrID) {
			t.Errorf("NewSandbox(%q) = %+v, %v; want ErrID", id, sb, err)
		}
	}
	l := &Launcher{Runtime: rt, Rootfs: "/rootfs", WorkDir: work}
	for _, set := range []string{"../escaped", "a/b", strings.Repeat("s", checkpointid.MaxLen+1)} {
		if _, err := l.NewSandbox(set, "capture", sandbox.ModeSandbox, nil, nil); !errors.Is(err, ErrID) {
			t.Errorf("Launcher.NewSandbox(%q) = %v, want ErrID", set, err)
		}
	}
	if entries, _ := os.ReadDir(work); len(entries) > 0 {
		t.Errorf("refused IDs left %v in the work directory", entries)
	}
	if _, err := os.Stat(filepath.Join(filepath.Dir(work), "escaped")); !os.IsNotExist(err) {
		t.Errorf("a refused ID made a directory outside the work directory (%v)", err)
	}
}

// fixedID is an IDs policy that gives one name, whatever it is asked.
type fixedID string

func (f fixedID) NewID(string, string) (string, error) { return string(f), nil }
