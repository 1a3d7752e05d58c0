package launch_test

import (
	"context"
	"errors"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
	"time"

	"readie.dev/pipeline/internal/testenv"
	"readie.dev/pipeline/pkg/executorproto"
	"readie.dev/pipeline/pkg/launch"
	"readie.dev/pipeline/pkg/pycall"
)

// TestRestoredCallResponseLimit: Restored.Call reads at most the limit it is given of a real
// restored executor's answer: one a byte over pycall.SmallResponse fails with
// executorproto.ErrMessageTooLarge, and the same answer under a limit twice as large decodes.
// Every sandbox is gone at the end (runsc list and processes).
func TestRestoredCallResponseLimit(t *testing.T) {
	output, runscPath, _ := openExample(t)
	work := testenv.WorkDir(t)
	root := filepath.Join(work, "root")
	t.Cleanup(func() {
		testenv.CheckNoRunsc(t, runscPath, root, "")
		if err := testenv.RemoveRunscRoot(root); err != nil {
			t.Error(err)
		}
	})
	rt := &launch.Runtime{Path: runscPath, Root: root, Flags: output.Flags}
	r, err := output.Restorer(launch.Options{Runtime: rt, WorkDir: filepath.Join(work, "w"), IDs: launch.RandomIDs{Prefix: "limit"}})
	if err != nil {
		t.Fatal(err)
	}
	// A str of SmallResponse bytes: its pickle is a few bytes longer.
	request, err := pycall.EvalRequest(`"x" * ` + strconv.Itoa(pycall.SmallResponse))
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	call := func(limit int64) (any, error) {
		restored, err := r.Restore(ctx, "small", launch.RestoreOptions{})
		if err != nil {
			t.Fatal(err)
		}
		response, err := restored.Call(ctx, request, limit)
		var value any
		if err == nil {
			value, err = pycall.DecodeEnvelope(response)
		}
		if closeErr := restored.Close(ctx); closeErr != nil {
			t.Errorf("close: %v", closeErr)
		}
		return value, err
	}
	if _, err := call(pycall.SmallResponse); !errors.Is(err, executorproto.ErrMessageTooLarge) {
		t.Errorf("Call of an answer over %d bytes with that limit = %v, want ErrMessageTooLarge", pycall.SmallResponse, err)
	}
	if _, err := call(0); err == nil || !strings.Contains(err.Error(), "a response limit of 0 bytes") {
		t.Errorf("Call with no limit = %v, want it refused", err)
	}
	value, err := call(2 * pycall.SmallResponse)
	if s, _ := value.(string); err != nil || len(s) != pycall.SmallResponse {
		t.Errorf("Call of the same answer with a limit of %d = %s, %v; want its %d bytes", 2*pycall.SmallResponse, pycall.Format(value, pycall.ErrorBytes), err, pycall.SmallResponse)
	}
	if entries, err := os.ReadDir(filepath.Join(work, "w")); err != nil || len(entries) != 0 {
		t.Errorf("the work dir after both restores: %v, %v; want it empty", entries, err)
	}
}
