package sandbox_test

import (
	"context"
	"fmt"
	"os"
	"os/exec"
	"slices"
	"strings"
	"testing"
	"time"

	"readie.dev/pipeline/internal/testenv"
	"readie.dev/pipeline/pkg/sandbox"
)

// TestRemoveOrphans (with a stand-in runsc): only the pipeline's sandboxes whose owning process
// is gone are deleted; a failed delete is reported with runsc's words.
func TestRemoveOrphans(t *testing.T) {
	gone := exec.Command("true")
	if err := gone.Run(); err != nil {
		t.Fatal(err)
	}
	dead, live := gone.Process.Pid, os.Getpid()
	orphan := fmt.Sprintf("readie-numpy-capture-%d-aaaa0000", dead)
	stuck := fmt.Sprintf("readie-fail-measure-%d-bbbb0000", dead)
	running := fmt.Sprintf("readie-pandas-capture-%d-cccc0000", live)
	list := fmt.Sprintf(`[{"id":%q,"status":"running"},{"id":%q,"status":"stopped"},{"id":%q,"status":"running"},{"id":"someone-elses","status":"running"}]`,
		orphan, stuck, running)
	path, calls := testenv.FakeRunsc(t, list)
	rt := &sandbox.Runtime{Path: path, Root: t.TempDir(), Flags: sandbox.DefaultFlags()}
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	removed, err := rt.RemoveOrphans(ctx)
	if len(removed) != 1 || removed[0] != orphan {
		t.Errorf("removed %v, want only %s", removed, orphan)
	}
	if err == nil || !strings.Contains(err.Error(), stuck) || !strings.Contains(err.Error(), "device or resource busy") {
		t.Errorf("err = %v, want the failed delete of %s with runsc's words", err, stuck)
	}
	var deleted []string
	for _, line := range calls() {
		if strings.Contains(line, " delete ") {
			deleted = append(deleted, line[strings.LastIndex(line, " ")+1:])
		}
	}
	slices.Sort(deleted)
	if strings.Join(deleted, ",") != stuck+","+orphan {
		t.Errorf("deleted %v", deleted)
	}
}
