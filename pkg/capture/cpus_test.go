package capture_test

import (
	"context"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"runtime"
	"strings"
	"testing"
	"time"

	"readie.dev/pipeline/internal/testenv"
	"readie.dev/pipeline/pkg/capture"
	"readie.dev/pipeline/pkg/launch"
	"readie.dev/pipeline/pkg/pycall"
)

// cpusSeenBy is what a restored executor sees of its CPUs: os.cpu_count(), the affinity and
// /proc/cpuinfo's processors, as gVisor shows them.
const cpusSeenBy = `[__import__("os").cpu_count(), len(__import__("os").sched_getaffinity(0)), open("/proc/cpuinfo").read().count("processor\t:")]`

// TestCPUs: a capture pinned to 1 CPU and one pinned to 2 (every host of this kind has 2) see
// exactly that many in the sandbox, the meta records it, and a restore in a sandbox that sets
// no CPU count at all (a worker's) sees the captured count again: the checkpoint keeps it.
// An unpinned capture sees the host's CPUs; a count the host cannot give is refused, naming
// both counts, with no meta.json.
func TestCPUs(t *testing.T) {
	if runtime.NumCPU() < 2 {
		t.Fatalf("this host gives %d CPU: the tests need 2, as every host of this kind has", runtime.NumCPU())
	}
	rt := testenv.Runtime(t)
	rootfs := testenv.Rootfs(t)
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Minute)
	defer cancel()
	for _, want := range []int{1, 2, 0} {
		t.Run(fmt.Sprintf("cpus=%d", want), func(t *testing.T) {
			work := testenv.WorkDir(t)
			dir := filepath.Join(work, "img")
			meta, err := capture.Run(ctx, rt, capture.Request{
				ID: "cpus", Imports: []string{"json"}, Rootfs: rootfs, Dir: dir, WorkDir: work,
				CPUs: want, Timeout: 2 * time.Minute,
			})
			if err != nil {
				t.Fatal(err)
			}
			seen := want
			if want == 0 {
				seen = runtime.NumCPU()
			}
			if meta.CPUs != seen {
				t.Errorf("meta.CPUs = %d, want %d", meta.CPUs, seen)
			}
			l := &launch.Launcher{Runtime: rt, Rootfs: rootfs, WorkDir: testenv.WorkDir(t), Timeout: time.Minute}
			request, err := pycall.EvalRequest(cpusSeenBy)
			if err != nil {
				t.Fatal(err)
			}
			var answer []any
			_, err = l.TimedCall(ctx, launch.Call{SetID: "cpus", Step: "restore", Image: launch.Image{Dir: dir}, Request: request, Check: func(resp []byte) error {
				v, err := pycall.DecodeEnvelope(resp)
				answer, _ = v.([]any)
				return err
			}})
			if err != nil {
				t.Fatal(err)
			}
			wantAnswer := fmt.Sprint([]any{int64(seen), int64(seen), int64(seen)})
			if fmt.Sprint(answer) != wantAnswer {
				t.Errorf("the restored executor sees [cpu_count affinity cpuinfo] = %v, want %s", answer, wantAnswer)
			}
		})
	}
	t.Run("more than the host", func(t *testing.T) {
		work := testenv.WorkDir(t)
		dir := filepath.Join(work, "img")
		want := runtime.NumCPU() + 1
		_, err := capture.Run(ctx, rt, capture.Request{
			ID: "cpus", Imports: []string{"json"}, Rootfs: rootfs, Dir: dir, WorkDir: work,
			CPUs: want, Timeout: 2 * time.Minute,
		})
		if !errors.Is(err, capture.ErrCapture) || !errors.Is(err, capture.ErrCPUs) {
			t.Fatalf("capture pinned to %d CPUs on a host of %d = %v, want ErrCPUs", want, runtime.NumCPU(), err)
		}
		for _, s := range []string{fmt.Sprintf("saw %d CPUs", runtime.NumCPU()), fmt.Sprintf("asks for %d", want)} {
			if !strings.Contains(err.Error(), s) {
				t.Errorf("the error does not say %q: %v", s, err)
			}
		}
		if _, statErr := os.Stat(filepath.Join(dir, "meta.json")); !errors.Is(statErr, os.ErrNotExist) {
			t.Errorf("meta.json written for a refused capture: %v", statErr)
		}
	})
}
