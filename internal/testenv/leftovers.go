package testenv

import (
	"context"
	"errors"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"readie.dev/pipeline/internal/procs"
	"readie.dev/pipeline/pkg/runsc"
)

// RunscProcesses returns the live runsc processes (the runsc command, runsc-sandbox,
// runsc-gofer) whose arguments name the runsc state root root (--root=ROOT) or, when idPart is
// not "", a sandbox ID containing it. It reads /proc, not runsc's state: a sandbox whose state
// is gone (its root removed, or a create killed before it saved any) is still found.
func RunscProcesses(root, idPart string) ([]procs.Process, error) {
	byRoot := procs.NameRoot(root)
	return procs.Runsc(func(args []string) bool {
		return byRoot(args) || idPart != "" && procs.NameID(idPart)(args)
	})
}

// processGrace bounds the wait for a deleted sandbox's processes to exit: `runsc delete`
// returns once the sandbox is killed; its gofer ends when it sees it gone.
const processGrace = time.Minute

// CheckNoRunsc fails the test if anything of a sandbox is left under the runsc root root:
// a sandbox in `runsc list`, or a runsc process naming root or, when idPart is not "", an ID
// containing it (RunscProcesses: by process, not by runsc's state). The processes of sandboxes
// just deleted are given processGrace to exit.
func CheckNoRunsc(t testing.TB, runscPath, root, idPart string) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	if cs, err := (&runsc.Runsc{Path: runscPath, Root: root}).List(ctx); err != nil || len(cs) != 0 {
		t.Errorf("runsc list under %s: %+v, %v; want no sandbox", root, cs, err)
	}
	deadline := time.Now().Add(processGrace)
	for {
		left, err := RunscProcesses(root, idPart)
		if err != nil {
			t.Errorf("runsc processes: %v", err)
			return
		}
		if len(left) == 0 {
			return
		}
		if time.Now().After(deadline) {
			var lines []string
			for _, p := range left {
				lines = append(lines, p.String())
			}
			t.Errorf("runsc processes of root %s (or IDs with %q) still running %s after the end:\n%s", root, idPart, processGrace, strings.Join(lines, "\n"))
			return
		}
		time.Sleep(50 * time.Millisecond)
	}
}

// CheckEmptyDir fails the test if dir holds anything but entries matching keep (filepath.Match
// patterns); a dir that does not exist holds nothing.
func CheckEmptyDir(t testing.TB, dir string, keep ...string) {
	t.Helper()
	entries, err := os.ReadDir(dir)
	if errors.Is(err, os.ErrNotExist) {
		return
	}
	if err != nil {
		t.Error(err)
		return
	}
	var left []string
	for _, e := range entries {
		if matched, _ := matchAny(keep, e.Name()); !matched {
			left = append(left, filepath.Join(dir, e.Name()))
		}
	}
	if len(left) > 0 {
		t.Errorf("left in %s: %v", dir, left)
	}
}

func matchAny(patterns []string, name string) (bool, error) {
	for _, p := range patterns {
		if ok, err := filepath.Match(p, name); ok || err != nil {
			return ok, err
		}
	}
	return false, nil
}
