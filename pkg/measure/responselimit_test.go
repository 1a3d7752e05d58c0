package measure_test

import (
	"context"
	"errors"
	"strconv"
	"testing"
	"time"

	"readie.dev/pipeline/internal/testenv"
	"readie.dev/pipeline/pkg/executorproto"
	"readie.dev/pipeline/pkg/launch"
	"readie.dev/pipeline/pkg/pycall"
)

// TestTimedCallResponseLimit: a call with MaxResponseSize (the pipeline's own calls set
// pycall.SmallResponse) reads no more of a real executor's answer: one a byte over the limit
// fails with executorproto.ErrMessageTooLarge before its check sees it, and the sandbox is
// gone (testenv.Runtime checks).
func TestTimedCallResponseLimit(t *testing.T) {
	rt := testenv.Runtime(t)
	l := &launch.Launcher{Runtime: rt, Rootfs: testenv.Rootfs(t), WorkDir: testenv.WorkDir(t), Timeout: time.Minute}
	request, err := pycall.EvalRequest(`"x" * ` + strconv.Itoa(pycall.SmallResponse))
	if err != nil {
		t.Fatal(err)
	}
	checked := false
	// The zero Image: a cold start.
	_, err = l.TimedCall(context.Background(), launch.Call{SetID: "limit", Step: "cold", Request: request,
		Check: func([]byte) error { checked = true; return nil }, MaxResponseSize: pycall.SmallResponse})
	if !errors.Is(err, executorproto.ErrMessageTooLarge) || checked {
		t.Fatalf("TimedCall of an answer over %d bytes = %v (checked: %v), want ErrMessageTooLarge before the check", pycall.SmallResponse, err, checked)
	}
}
