package outdir

import (
	"context"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"testing"
	"time"

	"readie.dev/pipeline/internal/testenv"
	"readie.dev/pipeline/pkg/atomicfile"
	"readie.dev/pipeline/pkg/manifest"
)

func TestLockOutput(t *testing.T) {
	out := filepath.Join(t.TempDir(), "out")
	first, err := LockOutput(out)
	if err != nil {
		t.Fatal(err)
	}
	if data, _ := os.ReadFile(out + ".lock"); strings.TrimSpace(string(data)) != strconv.Itoa(os.Getpid()) {
		t.Errorf("lock file holds %q, want this pid", data)
	}
	// flock is per open file: a second open in this process conflicts like another process.
	if _, err := LockOutput(out); !errors.Is(err, ErrLocked) || !strings.Contains(err.Error(), "pid "+strconv.Itoa(os.Getpid())) {
		t.Fatalf("second lock = %v, want ErrLocked naming the holder", err)
	}
	if err := first.Unlock(); err != nil {
		t.Fatal(err)
	}
	if data, _ := os.ReadFile(out + ".lock"); len(data) != 0 {
		t.Errorf("released lock file holds %q", data)
	}
	again, err := LockOutput(out)
	if err != nil || again.Stale != 0 {
		t.Fatalf("lock after release = %+v, %v", again, err)
	}
	again.Unlock()
}

// TestLockSharedAndExclusive: readers share the lock and a writer is refused while they hold
// it, saying that it is being read; a reader waits while a writer holds it (bounded by its
// context) and gets it once the writer is gone; the writer's pid stays in the file for errors.
func TestLockSharedAndExclusive(t *testing.T) {
	out := filepath.Join(t.TempDir(), "out")
	r1, err := ReadLockOutput(context.Background(), out, nil)
	if err != nil {
		t.Fatal(err)
	}
	r2, err := ReadLockOutput(context.Background(), out, nil)
	if err != nil {
		t.Fatalf("a second reader: %v", err)
	}
	if _, err := LockOutput(out); !errors.Is(err, ErrLocked) || !strings.Contains(err.Error(), "is being read by another run") {
		t.Fatalf("a writer beside readers: %v", err)
	}
	r1.Unlock()
	r2.Unlock()

	w, err := LockOutput(out)
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 200*time.Millisecond)
	defer cancel()
	var waitedFor int
	if _, err := ReadLockOutput(ctx, out, func(pid int) { waitedFor = pid }); !errors.Is(err, ErrLocked) || !errors.Is(err, context.DeadlineExceeded) ||
		waitedFor != os.Getpid() || !strings.Contains(err.Error(), "waiting for pid "+strconv.Itoa(os.Getpid())) {
		t.Fatalf("a reader while a writer holds it: %v (waited for %d)", err, waitedFor)
	}
	w.Unlock()
	r, err := ReadLockOutput(context.Background(), out, nil)
	if err != nil {
		t.Fatal(err)
	}
	r.Unlock()
	if again, err := LockOutput(out); err != nil || again.Stale != 0 {
		t.Fatalf("a writer after the reader: %+v %v", again, err)
	} else {
		again.Unlock()
	}
}

func TestLockTakesOverFromADeadRun(t *testing.T) {
	out := filepath.Join(t.TempDir(), "out")
	dead := testenv.DeadPID(t)
	os.WriteFile(out+".lock", []byte(fmt.Sprintf("%d\n", dead)), 0o644) // a run killed with SIGKILL
	l, err := LockOutput(out)
	if err != nil {
		t.Fatal(err)
	}
	defer l.Unlock()
	if l.Stale != dead {
		t.Fatalf("Stale = %d, want %d", l.Stale, dead)
	}
}

func TestReplaceDir(t *testing.T) {
	dir := t.TempDir()
	out, staging := filepath.Join(dir, "out"), filepath.Join(dir, "out.staging-1")
	// First output: nothing to move aside.
	os.MkdirAll(staging, 0o755)
	os.WriteFile(filepath.Join(staging, "manifest.json"), []byte("one"), 0o644)
	if err := replaceDir(out, staging); err != nil {
		t.Fatal(err)
	}
	os.MkdirAll(staging, 0o755)
	os.WriteFile(filepath.Join(staging, "manifest.json"), []byte("two"), 0o644)
	if err := replaceDir(out, staging); err != nil {
		t.Fatal(err)
	}
	if data, _ := os.ReadFile(filepath.Join(out, "manifest.json")); string(data) != "two" {
		t.Fatalf("output holds %q", data)
	}
	// The benchmark history goes over to the next output.
	os.MkdirAll(filepath.Join(out, "bench", "20261202T120000Z"), 0o755)
	os.MkdirAll(staging, 0o755)
	os.WriteFile(filepath.Join(staging, "manifest.json"), []byte("three"), 0o644)
	if err := replaceDir(out, staging); err != nil {
		t.Fatal(err)
	}
	if _, err := os.Stat(filepath.Join(out, "bench", "20261202T120000Z")); err != nil {
		t.Fatalf("the benchmark history was lost: %v", err)
	}
	if entries, _ := os.ReadDir(dir); len(entries) != 1 {
		t.Fatalf("left beside the output: %v", entries)
	}
	// A staging directory that cannot be put in place leaves the old output where it was.
	if err := replaceDir(out, filepath.Join(dir, "missing")); err == nil {
		t.Fatal("replaceDir from a missing staging directory succeeded")
	}
	if data, _ := os.ReadFile(filepath.Join(out, "manifest.json")); string(data) != "three" {
		t.Fatalf("after a failed swap the output holds %q", data)
	}
	if _, err := os.Stat(filepath.Join(out, "bench", "20261202T120000Z")); err != nil {
		t.Fatalf("a failed swap lost the benchmark history: %v", err)
	}
}

// TestSweepOutput: under the output's lock, every staging directory the pipeline made beside
// it is a leftover of a run that is over (whatever its pid or namespace), a previous output
// moved aside is put back or removed; a failed run's kept staging directory, other outputs',
// a pid-named one from before leases and a user's directories that only look like ours stay.
func TestSweepOutput(t *testing.T) {
	dir := t.TempDir()
	out := filepath.Join(dir, "out")
	content := func(name string) string { return fmt.Sprintf(`{"spec": %q}`, name) }
	mk := func(name string) string {
		p := filepath.Join(dir, name)
		os.MkdirAll(p, 0o755)
		os.WriteFile(filepath.Join(p, "manifest.json"), []byte(content(name)), 0o644)
		return p
	}
	users := func(name string) string {
		p := filepath.Join(dir, name)
		os.MkdirAll(p, 0o755)
		os.WriteFile(filepath.Join(p, "notes.txt"), []byte("precious"), 0o644)
		return p
	}
	staging, err := newStaging(out)
	if err != nil {
		t.Fatal(err)
	}
	byPid := mk(fmt.Sprintf("out.staging-%d", os.Getpid())) // a pipeline from before leases
	failed, err := newStaging(out)
	if err != nil {
		t.Fatal(err)
	}
	kept := keepStaging(out, failed)
	if !strings.HasPrefix(filepath.Base(kept), "out.failed-") {
		t.Fatalf("a failed run's staging directory was kept as %s", kept)
	}
	otherOutput := mk("out2.staging-0123456789ab") // another output's: not ours
	usersStaging, usersOld := users("out.staging-0123456789ab"), users("out.old-0123456789ab")
	// A run killed between moving the old output aside and putting the new one in place.
	oldOutput := mk(filepath.Base(besideOutput(out, oldInfix)))
	did, err := Sweep(out)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := os.Stat(staging); !os.IsNotExist(err) {
		t.Errorf("the leftover %s is still there", staging)
	}
	for _, keep := range []string{kept, otherOutput, byPid, usersStaging, usersOld} {
		if _, err := os.Stat(keep); err != nil {
			t.Errorf("%s was removed: %v", keep, err)
		}
	}
	if data, _ := os.ReadFile(filepath.Join(out, "manifest.json")); string(data) != content(filepath.Base(oldOutput)) {
		t.Errorf("the previous output was not put back: %q", data)
	}
	if len(did) != 4 || !strings.Contains(strings.Join(did, "\n"), "left alone "+usersOld) {
		t.Errorf("sweep said %q", did)
	}
	// With the output in place, a dead run's old copy is only removed.
	oldAgain := mk(filepath.Base(besideOutput(out, oldInfix)))
	if _, err := Sweep(out); err != nil {
		t.Fatal(err)
	}
	if _, err := os.Stat(oldAgain); !os.IsNotExist(err) {
		t.Error("a dead run's old output beside a present output was kept")
	}
	if data, _ := os.ReadFile(filepath.Join(out, "manifest.json")); string(data) != content(filepath.Base(oldOutput)) {
		t.Errorf("the output changed: %q", data)
	}
	if data, err := os.ReadFile(filepath.Join(usersOld, "notes.txt")); err != nil || string(data) != "precious" {
		t.Errorf("the user's directory changed: %q %v", data, err)
	}

	// A run killed in its swap, after the marker went: the staging directory is a whole output,
	// swept. A previous output that held only analyze's results is put back.
	swapped := mk(filepath.Base(besideOutput(out, stagingInfix)))
	os.RemoveAll(out)
	analysisOnly := filepath.Join(dir, filepath.Base(besideOutput(out, oldInfix)))
	os.MkdirAll(analysisOnly, 0o755)
	os.WriteFile(filepath.Join(analysisOnly, "analysis.json"), []byte("{}"), 0o644)
	if _, err := Sweep(out); err != nil {
		t.Fatal(err)
	}
	if _, err := os.Stat(swapped); !os.IsNotExist(err) {
		t.Error("the staging directory of a run killed in its swap was kept")
	}
	if _, err := os.Stat(filepath.Join(out, "analysis.json")); err != nil {
		t.Errorf("a previous output of analyze's results alone was not put back: %v", err)
	}
}

// TestReplaceDirCarriesOver: what other commands keep in an output (the benchmark history,
// analyze's and plan-sets' results) survives a capture's swap, and a swap that a kill cut
// short between putting the new output in place and moving them over.
func TestReplaceDirCarriesOver(t *testing.T) {
	dir := t.TempDir()
	out, staging := filepath.Join(dir, "out"), filepath.Join(dir, "out.staging-1")
	os.MkdirAll(filepath.Join(out, "bench", "run1"), 0o755)
	os.WriteFile(filepath.Join(out, "analysis.json"), []byte("a"), 0o644)
	os.WriteFile(filepath.Join(out, "plan.json"), []byte("p"), 0o644)
	os.WriteFile(filepath.Join(out, "manifest.json"), []byte("one"), 0o644)
	os.MkdirAll(staging, 0o755)
	os.WriteFile(filepath.Join(staging, "manifest.json"), []byte("two"), 0o644)
	if err := replaceDir(out, staging); err != nil {
		t.Fatal(err)
	}
	for _, name := range []string{"bench/run1", "analysis.json", "plan.json"} {
		if _, err := os.Stat(filepath.Join(out, name)); err != nil {
			t.Errorf("%s was not carried over: %v", name, err)
		}
	}
	// Killed after the swap: the old output still holds the history; carryOver moves it.
	old := filepath.Join(dir, "out.old-9")
	os.MkdirAll(filepath.Join(old, "bench", "run2"), 0o755)
	os.RemoveAll(filepath.Join(out, "bench"))
	if err := carryOver(old, out); err != nil {
		t.Fatal(err)
	}
	if _, err := os.Stat(filepath.Join(out, "bench", "run2")); err != nil {
		t.Errorf("the history of a cut-short swap was not taken over: %v", err)
	}
}

// TestCheckOutput: a directory that holds anything the pipeline did not write is refused as
// an output, naming what it holds; nothing is changed.
func TestCheckOutput(t *testing.T) {
	dir := t.TempDir()
	mk := func(name string, files ...string) string {
		p := filepath.Join(dir, name)
		os.MkdirAll(p, 0o755)
		for _, f := range files {
			os.MkdirAll(filepath.Dir(filepath.Join(p, f)), 0o755)
			os.WriteFile(filepath.Join(p, f), []byte("x"), 0o644)
		}
		return p
	}
	ours := mk("ours", "restore-spec.json", "analysis.json", "numpy/pages.img", "bench/x/bench.json")
	atomicfile.WriteJSON(filepath.Join(ours, manifest.FileName), &manifest.Manifest{ExecutorProtocol: 2,
		Checkpoints: []manifest.Checkpoint{{ID: "numpy", Dir: "numpy"}}})
	// A killed writer's temporary files of the output's own files: the next writer sweeps them.
	killed := mk("killed", ".manifest.json.tmp-123", ".plan.json.tmp-9", "analysis.json")
	for _, ok := range []string{ours, mk("empty"), mk("analysed", "analysis.json", "plan.json"), killed, filepath.Join(dir, "absent")} {
		if err := Check(ok); err != nil {
			t.Errorf("%s: %v", ok, err)
		}
	}
	for path, want := range map[string]string{
		mk("notes", "notes.txt"):                        "holds notes.txt",
		mk("home", ".bashrc", "src/main.go"):            "holds .bashrc, src",
		mk("stray", "analysis.json", "numpy/pages.img"): "holds numpy", // no manifest names numpy
		mk("badmanifest", "manifest.json"):              "cannot read",
		mk("othertmp", ".notes.txt.tmp-1"):              "holds .notes.txt.tmp-1", // not a file of ours
		mk("tmpdir", ".manifest.json.tmp-1/x"):          "holds .manifest.json.tmp-1",
	} {
		err := Check(path)
		if !errors.Is(err, ErrSetup) || !strings.Contains(err.Error(), want) || !strings.Contains(err.Error(), path) {
			t.Errorf("%s: %v, want ErrSetup naming it and %q", path, err, want)
		}
	}
	if _, err := os.Stat(filepath.Join(dir, "notes", "notes.txt")); err != nil {
		t.Error("CheckOutput changed the directory")
	}
}

// TestSweepTemporaries: under the lock, Sweep removes the temporary files killed writers
// left in the output (top level, checkpoint directories, bench runs), and nothing else.
func TestSweepTemporaries(t *testing.T) {
	out := filepath.Join(t.TempDir(), "out")
	keep := []string{"manifest.json", "numpy/meta.json", "bench/20261203T000000Z/bench.json", ".hidden", "notes.tmp-1"}
	gone := []string{".manifest.json.tmp-1", ".catalogue.json.tmp-22", "numpy/.meta.json.tmp-3", "bench/20261203T000000Z/.bench.json.tmp-4"}
	for _, name := range slices.Concat(keep, gone) {
		path := filepath.Join(out, name)
		os.MkdirAll(filepath.Dir(path), 0o755)
		if err := os.WriteFile(path, nil, 0o644); err != nil {
			t.Fatal(err)
		}
	}
	did, err := Sweep(out)
	if err != nil || len(did) != len(gone) {
		t.Fatalf("Sweep = %q, %v; want %d removals", did, err, len(gone))
	}
	for _, name := range gone {
		if _, err := os.Lstat(filepath.Join(out, name)); !os.IsNotExist(err) {
			t.Errorf("%s is still there", name)
		}
	}
	for _, name := range keep {
		if _, err := os.Lstat(filepath.Join(out, name)); err != nil {
			t.Errorf("%s: %v", name, err)
		}
	}
	if did, err := Sweep(filepath.Join(t.TempDir(), "absent")); err != nil || len(did) != 0 {
		t.Errorf("an absent output: %q, %v", did, err)
	}
}

// analyze and plan-sets write into an output only under its lock: while a capture holds it,
// the write is refused, naming the holder, and nothing is written.
func TestWriteInOutputTakesTheLock(t *testing.T) {
	out := filepath.Join(t.TempDir(), "out")
	held, err := LockOutput(out)
	if err != nil {
		t.Fatal(err)
	}
	write := func(path string) error { return os.WriteFile(path, []byte("x"), 0o644) }
	if err := WriteFile(out, "analysis.json", write); !errors.Is(err, ErrLocked) {
		t.Fatalf("write into a locked output: %v", err)
	}
	if _, err := os.Stat(filepath.Join(out, "analysis.json")); !errors.Is(err, os.ErrNotExist) {
		t.Errorf("written anyway: %v", err)
	}
	held.Unlock()
	if err := WriteFile(out, "analysis.json", write); err != nil {
		t.Fatal(err)
	}
	file := filepath.Join(t.TempDir(), "a-file")
	os.WriteFile(file, nil, 0o644)
	if err := WriteFile(file, "analysis.json", write); !errors.Is(err, ErrSetup) {
		t.Errorf("an output that is a file: %v", err)
	}
	// A directory that is not an output: refused, nothing written; and a previous output a
	// killed swap left aside is put back before the file is written beside nothing.
	mine := t.TempDir()
	os.WriteFile(filepath.Join(mine, "analysis.json"), []byte("mine"), 0o644)
	os.WriteFile(filepath.Join(mine, "notes.txt"), []byte("mine"), 0o644)
	if err := WriteFile(mine, "analysis.json", write); !errors.Is(err, ErrSetup) || !strings.Contains(err.Error(), "notes.txt") {
		t.Errorf("a directory that is not an output: %v", err)
	}
	if data, _ := os.ReadFile(filepath.Join(mine, "analysis.json")); string(data) != "mine" {
		t.Errorf("the user's file was overwritten: %q", data)
	}
	moved := filepath.Join(t.TempDir(), "out")
	aside := besideOutput(moved, oldInfix)
	os.MkdirAll(aside, 0o755)
	os.WriteFile(filepath.Join(aside, "manifest.json"), []byte(`{}`), 0o644)
	if err := WriteFile(moved, "plan.json", write); err != nil {
		t.Fatal(err)
	}
	if _, err := os.Stat(filepath.Join(moved, "manifest.json")); err != nil {
		t.Errorf("the previous output was not put back before the write: %v", err)
	}
}
