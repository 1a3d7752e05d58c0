package pool_test

import (
	"context"
	"fmt"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"readie.dev/pipeline/internal/config"
	"readie.dev/pipeline/internal/run"
	"readie.dev/pipeline/internal/testenv"
	"readie.dev/pipeline/pkg/launch"
	"readie.dev/pipeline/pkg/pool"
	"readie.dev/pipeline/pkg/pycall"
)

// captureOutput captures an output of the sets (id: imports) as `pipeline capture` does, with
// the real runsc and rootfs, and returns its directory and the rootfs.
func captureOutput(t *testing.T, sets map[string]string) (string, string) {
	t.Helper()
	rootfs, err := filepath.EvalSymlinks(testenv.Rootfs(t))
	if err != nil {
		t.Fatal(err)
	}
	dir := testenv.WorkDir(t)
	root := filepath.Join(dir, "root")
	t.Cleanup(func() {
		if err := testenv.RemoveRunscRoot(root); err != nil {
			t.Error(err)
		}
	})
	out := filepath.Join(dir, "out")
	yaml := fmt.Sprintf("runsc:\n  path: %s\n  root: %s\nrootfs: %s\noutput: %s\ncheckpoint_cache: %s\nrestore_runs: 1\ncheckpoints:\n",
		testenv.RunscPath(t), root, rootfs, out, filepath.Join(dir, "store"))
	for id, imports := range sets {
		yaml += fmt.Sprintf("  - id: %s\n    imports: [%s]\n", id, imports)
	}
	cfg, err := config.Parse([]byte(yaml), "warm.yaml", dir, filepath.Join(dir, "cache"))
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Minute)
	defer cancel()
	env, err := run.NewEnv(ctx, cfg, testenv.DiscardLog())
	if err != nil {
		t.Fatal(err)
	}
	defer env.Close()
	sel, err := cfg.Select(nil, nil)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := env.Capture(ctx, cfg.Output, run.CaptureOptions{Selection: sel}); err != nil {
		t.Fatal(err)
	}
	return out, rootfs
}

// TestRealWarm keeps sandboxes restored ahead of two checkpoints of one output, with the real
// runsc, through the kit's one restore path: a warm sandbox answers with its set's modules
// imported (and another set's not), is handed out once and never again, and is deleted on
// Close (a handed-out one not yet closed included), when its process is found dead, and once
// the pool's context is cancelled; a set with none ready is restored into a sandbox from the
// pool of created ones instead, and a set "" starts cold. Nothing is left under the worker's
// runsc root (testenv.CheckNoRunsc).
func TestRealWarm(t *testing.T) {
	testenv.SkipIfShort(t, "runsc")
	out, rootfs := captureOutput(t, map[string]string{"small": "fractions", "mail": "email.parser"})
	output, err := launch.OpenOutput(out, launch.OpenOptions{Rootfs: rootfs, Verify: true})
	if err != nil {
		t.Fatal(err)
	}
	work := testenv.WorkDir(t)
	root := filepath.Join(work, "root")
	rt := &launch.Runtime{Path: testenv.RunscPath(t), Root: root, Flags: output.Flags}
	t.Cleanup(func() {
		testenv.CheckNoRunsc(t, rt.Path, root, "")
		if err := testenv.RemoveRunscRoot(root); err != nil {
			t.Error(err)
		}
	})
	r, err := output.Restorer(launch.Options{Runtime: rt, WorkDir: filepath.Join(work, "w"), IDs: launch.RandomIDs{Prefix: "warm"}, Output: testWriter{t}})
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Minute)
	defer cancel()
	created, err := pool.New(ctx, pool.Options{New: r.NewSandbox, Size: 1})
	if err != nil {
		t.Fatal(err)
	}
	defer created.Close()
	warm, err := pool.NewWarm(ctx, pool.WarmOptions{Restorer: r, Sizes: map[string]int{"small": 2, "mail": 1, "none": 0}, Pool: created})
	if err != nil {
		t.Fatal(err)
	}
	defer warm.Close()
	if got := strings.Join(warm.Sets(), ","); got != "mail,small" {
		t.Errorf("sets kept %q, want mail,small", got)
	}
	if err := warm.Wait(ctx); err != nil {
		t.Fatal(err)
	}
	if err := created.Wait(ctx); err != nil {
		t.Fatal(err)
	}
	// A warm sandbox's memory: the sandbox's and gofer's processes, by /proc.
	memory, err := warm.Memory("small")
	// Pss and its parts are each rounded to a KiB per process: they add up to within a few.
	if gap := memory.Resident - memory.Own - memory.Files; err != nil || memory.Own < 1<<20 || memory.Files < 1<<20 || gap < -64<<10 || gap > 64<<10 {
		t.Errorf("small's warm sandbox holds %+v, %v: want its processes' memory, its own and its files' adding up", memory, err)
	}
	if all := warm.ReadyOwnBytes(); all < 3*memory.Own/2 {
		t.Errorf("the warm pool's 3 sandboxes hold %d bytes of their own, one of small's %d", all, memory.Own)
	}
	t.Logf("a warm sandbox of small holds %.1f MiB, %.1f MiB of its own", float64(memory.Resident)/(1<<20), float64(memory.Own)/(1<<20))
	// The worker's whole footprint: the 3 warm sandboxes and the created one, by its root.
	if all, n, err := rt.Memory(); err != nil || n != 4 || all.Own < 3*memory.Own/2 {
		t.Errorf("the worker's runtime holds %d sandboxes, %+v, %v: want the 3 warm ones and the created one", n, all, err)
	}
	opts := launch.RestoreOptions{Warm: warm, Pool: created}
	seen := map[string]bool{}
	start := func(set string, want launch.How) *launch.Restored {
		t.Helper()
		restored, err := r.Restore(ctx, set, opts)
		if err != nil {
			t.Fatal(err)
		}
		if restored.How != want {
			t.Errorf("%s started by %q, want %q", set, restored.How, want)
		}
		if seen[restored.Sandbox.ID] {
			t.Errorf("sandbox %s handed out twice", restored.Sandbox.ID)
		}
		seen[restored.Sandbox.ID] = true
		t.Logf("%s started by %s in %s", set, restored.How, restored.Sandbox.ID)
		return restored
	}
	imported := func(restored *launch.Restored, module string) bool {
		t.Helper()
		request, err := pycall.EvalRequest(strconv.Quote(module) + ` in __import__("sys").modules`)
		if err != nil {
			t.Fatal(err)
		}
		response, err := restored.Call(ctx, request, pycall.SmallResponse)
		if err != nil {
			t.Fatalf("call into %s (%s): %v", restored.Sandbox.ID, restored.How, err)
		}
		value, err := pycall.DecodeEnvelope(response)
		if err != nil {
			t.Fatal(err)
		}
		return value == true
	}

	// Both ready sandboxes of small, then one of mail: each warm, each answering with its
	// set's modules imported, and only its set's.
	var taken []*launch.Restored
	for _, set := range []string{"small", "small", "mail"} {
		restored := start(set, launch.FromWarm)
		taken = append(taken, restored)
		mine, other := "fractions", "email.parser"
		if set == "mail" {
			mine, other = other, mine
		}
		if !imported(restored, mine) || imported(restored, other) {
			t.Errorf("the warm sandbox %s of %s: want %s imported and %s not", restored.Sandbox.ID, set, mine, other)
		}
	}
	if s := warm.Stats()["small"]; s.HandedOut != 2 {
		t.Errorf("small's stats %+v, want 2 handed out", s)
	}
	for _, restored := range taken[:2] {
		if err := restored.Close(ctx); err != nil {
			t.Error(err)
		}
	}
	cold := start("", launch.Cold)
	if imported(cold, "email.parser") || imported(cold, "fractions") {
		t.Error("a cold start has a set's modules imported")
	}
	if err := cold.Close(ctx); err != nil {
		t.Error(err)
	}

	// Found dead: every warm sandbox ready now is killed, as a crash would; none is handed
	// out, each is deleted and replaced, and a start meanwhile restores from the created pool.
	if err := warm.Wait(ctx); err != nil {
		t.Fatal(err)
	}
	if err := created.Wait(ctx); err != nil {
		t.Fatal(err)
	}
	held := taken[2].Sandbox.ID // handed out and not closed: Close must delete it
	killed := killRunning(ctx, t, rt, held)
	if len(killed) != 3 {
		t.Fatalf("killed %v, want the 3 warm sandboxes ready", killed)
	}
	for _, set := range []string{"small", "mail"} {
		restored := start(set, launch.FromPool)
		if module := map[string]string{"small": "fractions", "mail": "email.parser"}[set]; !imported(restored, module) {
			t.Errorf("%s restored from the pool into %s: %s not imported", set, restored.Sandbox.ID, module)
		}
		if err := restored.Close(ctx); err != nil {
			t.Error(err)
		}
	}
	if s := warm.Stats(); s["small"].Dead != 2 || s["mail"].Dead != 1 {
		t.Errorf("stats %+v, want small's 2 and mail's 1 killed found dead", s)
	}
	if err := warm.Wait(ctx); err != nil {
		t.Fatal(err)
	}
	if listed := running(ctx, t, rt); containsAny(listed, killed) {
		t.Errorf("killed sandboxes %v still listed: %v", killed, listed)
	}

	// Close: every sandbox restored ahead is deleted, the one handed out included.
	if err := warm.Close(); err != nil {
		t.Fatal(err)
	}
	if listed := running(ctx, t, rt); len(listed) != 0 {
		t.Errorf("after Close, running sandboxes %v", listed)
	}
	if err := taken[2].Close(ctx); err != nil { // deleted already: the first delete's result
		t.Error(err)
	}
	if restored := warm.Take("small"); restored != nil {
		t.Errorf("a closed pool handed out %s", restored.Sandbox.ID)
	}

	// Cancel: a warm pool whose context ends deletes its sandboxes, as Close does.
	cctx, ccancel := context.WithCancel(ctx)
	warm2, err := pool.NewWarm(cctx, pool.WarmOptions{Restorer: r, Sizes: map[string]int{"mail": 1}, Pool: created})
	if err != nil {
		t.Fatal(err)
	}
	if err := warm2.Wait(ctx); err != nil {
		t.Fatal(err)
	}
	if listed := running(ctx, t, rt); len(listed) != 1 {
		t.Fatalf("running sandboxes %v, want mail's warm one", listed)
	}
	ccancel()
	testenv.WaitFor(t, "the cancelled warm pool's sandbox to be deleted", func() bool { return len(running(ctx, t, rt)) == 0 })
	if err := warm2.Wait(ctx); err == nil {
		t.Error("Wait on a cancelled warm pool succeeded")
	}
	if err := warm2.Close(); err != nil {
		t.Error(err)
	}
	if err := created.Close(); err != nil {
		t.Error(err)
	}
}

// running returns the IDs of the sandboxes under rt's root whose process runs (warm, or
// handed out), not merely created.
func running(ctx context.Context, t *testing.T, rt *launch.Runtime) []string {
	t.Helper()
	containers, err := rt.Driver().List(ctx)
	if err != nil {
		t.Fatal(err)
	}
	var ids []string
	for _, c := range containers {
		if c.Status == "running" {
			ids = append(ids, c.ID)
		}
	}
	return ids
}

// killRunning kills the sandbox process of every running sandbox but skip's, and waits until
// each is dead; it returns their IDs.
func killRunning(ctx context.Context, t *testing.T, rt *launch.Runtime, skip string) []string {
	t.Helper()
	containers, err := rt.Driver().List(ctx)
	if err != nil {
		t.Fatal(err)
	}
	var killed []string
	for _, c := range containers {
		if c.Status != "running" || c.ID == skip || c.Pid <= 0 {
			continue
		}
		if err := syscall.Kill(c.Pid, syscall.SIGKILL); err != nil {
			t.Fatal(err)
		}
		killed = append(killed, c.ID)
		testenv.WaitFor(t, "sandbox process "+strconv.Itoa(c.Pid)+" to die", func() bool {
			data, err := os.ReadFile("/proc/" + strconv.Itoa(c.Pid) + "/stat")
			return err != nil || strings.Contains(string(data), ") Z ")
		})
	}
	return killed
}

func containsAny(list, of []string) bool {
	for _, a := range list {
		for _, b := range of {
			if a == b {
				return true
			}
		}
	}
	return false
}
