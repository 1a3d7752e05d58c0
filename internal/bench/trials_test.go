package bench

import (
	"context"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"readie.dev/pipeline/internal/testenv"
	"readie.dev/pipeline/pkg/capture"
	"readie.dev/pipeline/pkg/launch"
	"readie.dev/pipeline/pkg/measure"
	"readie.dev/pipeline/pkg/sandbox"
)

// TestTrials runs every kind of trial once under real gVisor: a cold call, a restore to the
// answer, the same into a pre-created sandbox, the same from a pool (restored, and started
// cold), and the floor.
func TestTrials(t *testing.T) {
	rt := testenv.Runtime(t)
	rootfs := testenv.Rootfs(t)
	work := testenv.WorkDir(t)
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Minute)
	defer cancel()
	imports := []string{"json", "email.parser"}
	dir := filepath.Join(work, "img")
	if _, err := capture.Run(ctx, rt, capture.Request{
		ID: "small", Imports: imports, Rootfs: rootfs, Dir: dir, WorkDir: work, Timeout: 2 * time.Minute,
	}); err != nil {
		t.Fatal(err)
	}
	r := &measure.Restorer{Launcher: launch.Launcher{Runtime: rt, Rootfs: rootfs, WorkDir: work, Timeout: time.Minute}, Flags: []string{"-direct"}}
	cold, err := TimeColdCall(ctx, &r.Launcher, "cold", imports)
	if err != nil || cold <= 0 {
		t.Fatalf("cold call = %v, %v", cold, err)
	}
	restored, err := TimeRestoreCall(ctx, r, "small", dir, imports, false)
	if err != nil || restored.TotalMS() <= 0 || !restored.Began.Before(restored.Started) || restored.Answered.Before(restored.Connected) {
		t.Fatalf("restore call = %+v, %v", restored, err)
	}
	prestarted, err := TimeRestoreCall(ctx, r, "small", dir, imports, true)
	if err != nil || prestarted.TotalMS() <= 0 {
		t.Fatalf("prestarted restore call = %+v, %v", prestarted, err)
	}
	p, err := NewPool(ctx, &r.Launcher, 1)
	if err != nil {
		t.Fatal(err)
	}
	defer p.Close()
	for _, image := range []string{dir, ""} { // a restore, then a cold start in a pooled sandbox
		pooled, err := TimePooledCall(ctx, p, image, r.Flags, imports, time.Minute)
		if err != nil || pooled.TotalMS() <= 0 || !pooled.Began.Before(pooled.Started) {
			t.Fatalf("pooled call of %q = %+v, %v", image, pooled, err)
		}
		t.Logf("pooled (%q): %.0f ms", image, pooled.TotalMS())
	}
	if _, err := TimePooledCall(ctx, p, dir, r.Flags, []string{"no_such_module_readie"}, time.Minute); err == nil {
		t.Fatal("a pooled call importing a missing module passed")
	}
	if err := p.Wait(ctx); err != nil {
		t.Fatal(err)
	}
	if s := p.Stats(); s.HandedOut != 3 || s.Created != 4 || s.Ready != 1 {
		t.Errorf("pool stats %+v: want 3 handed out, each replaced", s)
	}
	if err := p.Close(); err != nil {
		t.Fatal(err)
	}
	floor, err := TimeFloor(ctx, &r.Launcher)
	if err != nil || floor <= 0 {
		t.Fatalf("floor = %v, %v", floor, err)
	}
	// A restore to the answer fails when the answer is wrong: the call imports a module the
	// image does not have.
	if _, err := TimeRestoreCall(ctx, r, "small", dir, []string{"no_such_module_readie"}, false); err == nil {
		t.Fatal("a call importing a missing module passed")
	}
	t.Logf("cold %.0f ms, restore %.0f ms, prestarted %.0f ms, floor %.0f ms", cold, restored.TotalMS(), prestarted.TotalMS(), floor)
}

// TestTimeFloorJoinsAFailedDelete (with a stand-in runsc whose run and delete both fail): the
// error says both.
func TestTimeFloorJoinsAFailedDelete(t *testing.T) {
	path, _ := testenv.FakeRunsc(t, "[]", "run", "delete")
	rt := &launch.Runtime{Path: path, Root: t.TempDir(), Flags: sandbox.DefaultFlags(), Lease: testenv.Lease(t)}
	_, err := TimeFloor(context.Background(), &launch.Launcher{Runtime: rt, Rootfs: "/rootfs", WorkDir: testenv.WorkDir(t), Timeout: time.Minute})
	if err == nil || !strings.Contains(err.Error(), "run readie-floor-") || !strings.Contains(err.Error(), "delete: device or resource busy") {
		t.Fatalf("TimeFloor whose run and delete fail = %v; want both", err)
	}
}
