package procs

import (
	"os"
	"os/exec"
	"slices"
	"testing"
)

// standIn starts a shell whose argv is argv (argv[0] as a runsc process names itself), which
// waits until the test ends.
func standIn(t *testing.T, argv ...string) int {
	t.Helper()
	// sh -c SCRIPT NAME ARGS...: the script keeps the shell itself running (no exec of its
	// last command), so its command line stays argv.
	cmd := &exec.Cmd{Path: "/bin/sh", Args: append([]string{argv[0], "-c", "sleep 3600; :"}, argv[1:]...)}
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { cmd.Process.Kill(); cmd.Wait() })
	return cmd.Process.Pid
}

// TestRunscFindsByRootAndID: a process named runsc-sandbox is found by the --root it names and
// by its last argument, its ID, with its parent; one that names another root or ID, or whose
// name is no runsc's, is not.
func TestRunscFindsByRootAndID(t *testing.T) {
	root := t.TempDir()
	ours := standIn(t, "runsc-sandbox", "--root="+root, "boot", "worker-small-restore-0a1b2c3d")
	other := standIn(t, "runsc-gofer", "--root="+root+"2", "gofer", "worker-other-restore-99999999")
	notRunsc := standIn(t, "python3", "--root="+root, "worker-small-restore-0a1b2c3d")
	pids := func(found []Process, err error) []int {
		t.Helper()
		if err != nil {
			t.Fatal(err)
		}
		var out []int
		for _, p := range found {
			out = append(out, p.Pid)
			if p.Pid == ours && p.PPid != os.Getpid() {
				t.Errorf("%v: parent %d, want this test's %d", p, p.PPid, os.Getpid())
			}
		}
		return out
	}
	for name, match := range map[string]func([]string) bool{"root": NameRoot(root), "id": NameID("small-restore")} {
		got := pids(Runsc(match))
		if !slices.Contains(got, ours) || slices.Contains(got, other) || slices.Contains(got, notRunsc) {
			t.Errorf("by %s: found %v; want %d, not %d nor %d", name, got, ours, other, notRunsc)
		}
	}
}
