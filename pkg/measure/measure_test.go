package measure_test

import (
	"bytes"
	"context"
	"errors"
	"math"
	"os"
	"path/filepath"
	"reflect"
	"strings"
	"syscall"
	"testing"
	"time"

	ogorek "github.com/kisielk/og-rek"
	specs "github.com/opencontainers/runtime-spec/specs-go"

	"readie.dev/pipeline/internal/testenv"
	"readie.dev/pipeline/pkg/capture"
	"readie.dev/pipeline/pkg/executorproto"
	"readie.dev/pipeline/pkg/launch"
	"readie.dev/pipeline/pkg/measure"
	"readie.dev/pipeline/pkg/sandbox"
)

func TestSummarize(t *testing.T) {
	tests := []struct {
		runs                  []float64
		min, median, p90, max float64
	}{
		{[]float64{5}, 5, 5, 5, 5},
		{[]float64{3, 1, 2}, 1, 2, 2.8, 3},
		{[]float64{10, 40, 20, 30}, 10, 25, 37, 40},
		{[]float64{1, 2, 3, 4, 5, 6, 7, 8, 9, 10}, 1, 5.5, 9.1, 10},
	}
	for _, tt := range tests {
		st := measure.Summarize(tt.runs)
		got := []float64{st.Min, st.Median, st.P90, st.Max}
		want := []float64{tt.min, tt.median, tt.p90, tt.max}
		for i := range got {
			if math.Abs(got[i]-want[i]) > 1e-9 {
				t.Errorf("Summarize(%v) = %v, want %v", tt.runs, got, want)
				break
			}
		}
		if !reflect.DeepEqual(st.Runs, tt.runs) {
			t.Errorf("Summarize reordered the runs: %v", st.Runs)
		}
	}
	if st := measure.Summarize(nil); st.Median != 0 || len(st.Runs) != 0 {
		t.Errorf("Summarize(nil) = %+v", st)
	}
}

func TestLeastSquares(t *testing.T) {
	l := measure.LeastSquares([]float64{0, 10, 20}, []float64{300, 320, 340})
	if math.Abs(l.Slope-2) > 1e-9 || math.Abs(l.Intercept-300) > 1e-9 || l.Points != 3 || math.Abs(l.RSquared-1) > 1e-9 {
		t.Fatalf("fit %+v", l)
	}
	// y = 1, 3, 2 over x = 0, 1, 2: slope 0.5, intercept 1.5; residuals -0.5, 1, -0.5 (1.5),
	// total 2: R² = 0.25.
	if l := measure.LeastSquares([]float64{0, 1, 2}, []float64{1, 3, 2}); math.Abs(l.RSquared-0.25) > 1e-9 {
		t.Fatalf("R² of a noisy fit: %+v", l)
	}
	if l := measure.LeastSquares([]float64{5, 5}, []float64{1, 3}); l.Slope != 0 || l.Intercept != 2 || l.Fitted() || l.DistinctX != 1 {
		t.Fatalf("degenerate fit %+v", l)
	}
	if l := measure.LeastSquares([]float64{5, 5, 6}, []float64{1, 3, 4}); !l.Fitted() || l.DistinctX != 2 {
		t.Fatalf("two sizes: %+v", l)
	}
	if l := measure.LeastSquares(nil, nil); l.Points != 0 {
		t.Fatalf("empty fit %+v", l)
	}
}

// TestCaptureMeasureSmoke runs the real executor under real gVisor: capture a small set,
// time restores, smoke-test a restore, and see runsc refuse a spec of another shape.
func TestCaptureMeasureSmoke(t *testing.T) {
	rt := testenv.Runtime(t)
	rootfs := testenv.Rootfs(t)
	work := testenv.WorkDir(t)
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Minute)
	defer cancel()
	version, err := rt.Version(ctx)
	if err != nil {
		t.Fatal(err)
	}
	imports := []string{"json", "email.parser"}
	dir := filepath.Join(work, "img")
	meta, err := capture.Run(ctx, rt, capture.Request{
		ID: "small", Imports: imports, Rootfs: rootfs, Dir: dir, WorkDir: work,
		Timeout: 2 * time.Minute, RunscVersion: version,
	})
	if err != nil {
		t.Fatal(err)
	}
	if meta.Bytes() == 0 || !strings.HasPrefix(meta.SpecFingerprint, "sha256:") {
		t.Fatalf("meta = %+v", meta)
	}
	r := &measure.Restorer{Launcher: launch.Launcher{Runtime: rt, Rootfs: rootfs, WorkDir: work, Timeout: time.Minute}, Flags: []string{"-direct"}}
	st, err := r.MeasureRuns(ctx, "small", dir, 2)
	if err != nil {
		t.Fatal(err)
	}
	if len(st.Runs) != 2 || st.Min <= 0 {
		t.Fatalf("stats = %+v", st)
	}
	smoke, err := r.Smoke(ctx, "small", dir, imports)
	// The sandbox's memory, restored and idle: at least the runsc binary's pages, by /proc;
	// its own part (the sentry's memory) less than all of it (runsc's text is a file's).
	if err != nil || !smoke.OK || smoke.ReadyMS <= 0 || smoke.ResidentBytes < 1<<20 || smoke.OwnBytes < 1<<20 || smoke.OwnBytes >= smoke.ResidentBytes {
		t.Fatalf("smoke = %+v, %v", smoke, err)
	}
	t.Logf("restore median %.0f ms, ready %.0f ms, resident %.1f MiB, %.1f MiB of its own", st.Median, smoke.ReadyMS, float64(smoke.ResidentBytes)/(1<<20), float64(smoke.OwnBytes)/(1<<20))

	// The smoke check must fail for a module the checkpoint never imported.
	if _, err := r.Smoke(ctx, "small", dir, []string{"json", "xml.dom.minidom"}); err == nil || !strings.Contains(err.Error(), "xml.dom.minidom") {
		t.Fatalf("smoke with a module that was not pre-imported: %v", err)
	}

	// A restore spec whose args differ from the capture's is refused by runsc itself.
	sb, err := launch.NewSandbox(launch.SandboxOptions{Runtime: rt, WorkDir: work, KeepLogs: true, Spec: func(host string) (*specs.Spec, error) {
		spec, err := sandbox.Spec(sandbox.SpecOptions{Mode: sandbox.ModeMeasure, Rootfs: rootfs, HostDir: host})
		if err != nil {
			return nil, err
		}
		spec.Process.Args = append(spec.Process.Args, "--tampered")
		return spec, nil
	}}, "small", "tampered")
	if err != nil {
		t.Fatal(err)
	}
	_, err = sb.RunRestored(ctx, launch.Image{Dir: dir})
	sb.Delete(ctx)
	if err == nil {
		t.Fatal("restore with tampered args succeeded")
	}
	stderr, _ := os.ReadFile(sb.Stderr)
	t.Logf("runsc refused the tampered spec: %v\n%s", err, stderr)
	if !strings.Contains(string(stderr), `"Args" does not match`) {
		t.Errorf("runsc's message does not mention the args:\n%s", stderr)
	}

	// A restore onto a sandbox made by `runsc create` fails with runsc's own words, not only
	// an exit status: here the image directory holds no image.
	created, err := r.NewSandbox("small", "prestarted", sandbox.ModeSandbox, nil, nil)
	if err != nil {
		t.Fatal(err)
	}
	if err := created.Create(ctx); err != nil {
		t.Fatal(err)
	}
	err = created.Start(ctx, launch.Image{Dir: t.TempDir()})
	if deleteErr := created.Delete(ctx); deleteErr != nil {
		t.Error(deleteErr)
	}
	t.Logf("restore onto a created sandbox from an empty directory: %v", err)
	if err == nil || !strings.Contains(err.Error(), "checkpoint.img") {
		t.Errorf("the error does not say what runsc said: %v", err)
	}

}

// startColdExecutor creates and starts an executor in sandbox mode without a checkpoint,
// checking runsc's state after each step; the sandbox is deleted when the test ends.
func startColdExecutor(t *testing.T, name string) (context.Context, *launch.Sandbox) {
	t.Helper()
	l := &launch.Launcher{Runtime: testenv.Runtime(t), Rootfs: testenv.Rootfs(t), WorkDir: testenv.WorkDir(t)}
	sb, err := l.NewSandbox(name, "test", sandbox.ModeSandbox, nil, nil)
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	t.Cleanup(func() {
		sb.Delete(ctx)
		cancel()
	})
	if err := sb.Create(ctx); err != nil {
		t.Fatal(err)
	}
	if state, err := sb.State(ctx); err != nil || state.Status != "created" {
		t.Fatalf("state after create = %+v, %v", state, err)
	}
	if err := sb.Start(ctx, launch.Image{}); err != nil {
		t.Fatal(err)
	}
	if state, err := sb.State(ctx); err != nil || state.Status != "running" {
		t.Fatalf("state after start = %+v, %v", state, err)
	}
	return ctx, sb
}

// TestExecutorDiesDuringCall: a function that kills the executor (os._exit) leaves the
// worker with a response that never ends; Call reports it as a truncated response.
func TestExecutorDiesDuringCall(t *testing.T) {
	ctx, sb := startColdExecutor(t, "dies")
	conn, err := executorproto.Dial(ctx, sb.SocketPath())
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close()
	var request bytes.Buffer
	err = ogorek.NewEncoderWithConfig(&request, &ogorek.EncoderConfig{Protocol: 4}).Encode(map[string]any{
		"func": ogorek.Class{Module: "os", Name: "_exit"}, "args": ogorek.Tuple{int64(3)}, "kwargs": map[string]any{},
	})
	if err != nil {
		t.Fatal(err)
	}
	_, err = executorproto.Call(ctx, conn, request.Bytes())
	if !errors.Is(err, executorproto.ErrTruncated) {
		t.Fatalf("Call to an executor that died = %v, want ErrTruncated", err)
	}
}

// TestKillStopsSandbox: `runsc kill` reaches the executor; runsc then reports it stopped.
func TestKillStopsSandbox(t *testing.T) {
	ctx, sb := startColdExecutor(t, "kill")
	if err := sb.Kill(ctx, syscall.SIGKILL); err != nil {
		t.Fatal(err)
	}
	for {
		state, err := sb.State(ctx)
		if err != nil {
			t.Fatal(err)
		}
		if state.Status == "stopped" {
			return
		}
		if ctx.Err() != nil {
			t.Fatalf("still %q after SIGKILL", state.Status)
		}
		time.Sleep(20 * time.Millisecond)
	}
}

// TestFailedDeleteIsReported (with a stand-in runsc whose delete fails): a restore that worked
// but whose sandbox could not be deleted is an error that says so.
func TestFailedDeleteIsReported(t *testing.T) {
	path, _ := testenv.FakeRunsc(t, "[]")
	rt := &launch.Runtime{Path: path, Root: t.TempDir(), Flags: sandbox.DefaultFlags(), Lease: testenv.Lease(t)}
	r := &measure.Restorer{Launcher: launch.Launcher{Runtime: rt, Rootfs: "/rootfs", WorkDir: testenv.WorkDir(t), Timeout: time.Minute}}
	_, err := r.MeasureOnce(context.Background(), "fail", t.TempDir())
	if err == nil || !strings.Contains(err.Error(), "delete") || !strings.Contains(err.Error(), "device or resource busy") {
		t.Fatalf("MeasureOnce with a failed delete = %v", err)
	}
}
