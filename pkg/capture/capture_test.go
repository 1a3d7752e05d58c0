package capture_test

import (
	"context"
	"errors"
	"maps"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"

	"readie.dev/pipeline/internal/cpubaseline"
	"readie.dev/pipeline/internal/testenv"
	"readie.dev/pipeline/pkg/capture"
	"readie.dev/pipeline/pkg/cpu"
	"readie.dev/pipeline/pkg/launch"
	"readie.dev/pipeline/pkg/manifest"
	"readie.dev/pipeline/pkg/runsc"
	"readie.dev/pipeline/pkg/sandbox"
)

// TestFailedImport: the error names the set and the module, quotes the executor's stderr,
// writes no meta.json, and leaves no sandbox (testenv.Runtime checks `runsc list` after).
func TestFailedImport(t *testing.T) {
	rt := testenv.Runtime(t)
	work := testenv.WorkDir(t)
	dir := filepath.Join(work, "img")
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	_, err := capture.Run(ctx, rt, capture.Request{
		ID: "broken", Imports: []string{"json", "no_such_module_readie"}, Rootfs: testenv.Rootfs(t),
		Dir: dir, WorkDir: work, Timeout: time.Minute,
	})
	if !errors.Is(err, capture.ErrCapture) {
		t.Fatalf("err = %v, want ErrCapture", err)
	}
	for _, want := range []string{"broken", "no_such_module_readie", "ModuleNotFoundError", "exited with status 3 (an import of the package set failed)"} {
		if !strings.Contains(err.Error(), want) {
			t.Errorf("error does not mention %q:\n%v", want, err)
		}
	}
	if _, statErr := os.Stat(filepath.Join(dir, "meta.json")); !errors.Is(statErr, os.ErrNotExist) {
		t.Errorf("meta.json written for a failed capture: %v", statErr)
	}
}

// TestTimeoutKeepsItsCause: a capture that runs out of time (its import never returns, so on
// any machine) fails with an error that still matches context.DeadlineExceeded and names the
// limit, and leaves no sandbox.
func TestTimeoutKeepsItsCause(t *testing.T) {
	rt := testenv.Runtime(t)
	work := testenv.WorkDir(t)
	_, err := capture.Run(context.Background(), rt, capture.Request{
		ID: "slow", Imports: []string{"json", testenv.BlockingModule}, Rootfs: testenv.Rootfs(t),
		Env: []string{"PYTHONPATH=" + testenv.TestingPythonPath},
		Dir: filepath.Join(work, "img"), WorkDir: work, Timeout: 2 * time.Second,
	})
	if !errors.Is(err, capture.ErrCapture) || !errors.Is(err, context.DeadlineExceeded) || !errors.Is(err, runsc.ErrFailed) {
		t.Fatalf("err = %v; want ErrCapture wrapping runsc's deadline", err)
	}
	if !strings.Contains(err.Error(), "capture of slow exceeded its timeout of 2s") {
		t.Errorf("the error does not name the step and the limit: %v", err)
	}
}

func TestRefusesNonEmptyDir(t *testing.T) {
	work := testenv.WorkDir(t)
	dir := filepath.Join(work, "img")
	os.MkdirAll(dir, 0o755)
	os.WriteFile(filepath.Join(dir, "pages.img"), []byte("old"), 0o644)
	_, err := capture.Run(context.Background(), testenv.Runtime(t), capture.Request{
		ID: "x", Rootfs: "/nonexistent", Dir: dir, WorkDir: work, Timeout: time.Second,
	})
	if !errors.Is(err, capture.ErrCapture) || !strings.Contains(err.Error(), "not empty") {
		t.Fatalf("err = %v", err)
	}
	if data, _ := os.ReadFile(filepath.Join(dir, "pages.img")); string(data) != "old" {
		t.Fatal("existing image file changed")
	}
}

// TestFailedDeleteIsJoined (with a stand-in runsc whose run and delete both fail): the error
// says both, so a sandbox left behind is reported even when the capture failed too.
func TestFailedDeleteIsJoined(t *testing.T) {
	path, _ := testenv.FakeRunsc(t, "[]", "run")
	rt := &launch.Runtime{Path: path, Root: t.TempDir(), Flags: sandbox.DefaultFlags(), Lease: testenv.Lease(t)}
	work := testenv.WorkDir(t)
	_, err := capture.Run(context.Background(), rt, capture.Request{
		ID: "fail", Rootfs: "/rootfs", Dir: filepath.Join(work, "img"), WorkDir: work, Timeout: time.Minute,
	})
	if !errors.Is(err, capture.ErrCapture) || !strings.Contains(err.Error(), "exited with status 3") ||
		!strings.Contains(err.Error(), "delete") || !strings.Contains(err.Error(), "destroying container: device or resource busy") {
		t.Fatalf("capture whose run and delete fail = %v; want both", err)
	}
}

// belowHost is this host's features without its widest vector extension (every avx512*
// feature, or avx2 on a host without AVX-512): a baseline that a host without CPUID faulting
// cannot enforce on code that runs CPUID itself.
func belowHost(t *testing.T) (baseline, removed []string) {
	t.Helper()
	h, err := cpu.ReadHost(context.Background(), testenv.RunscPath(t), time.Minute)
	if err != nil {
		t.Fatal(err)
	}
	for _, f := range h.Features {
		if strings.HasPrefix(f, "avx512") {
			removed = append(removed, f)
		} else {
			baseline = append(baseline, f)
		}
	}
	if removed == nil {
		removed, baseline = []string{"avx2"}, slices.DeleteFunc(baseline, func(f string) bool { return f == "avx2" })
	}
	return baseline, removed
}

// TestCPUCheck: a numpy capture with a baseline below this host's features. With the
// baseline's library controls, numpy, glibc and OpenSSL chose nothing outside it (seen from
// inside the sandbox, after the import); without them, numpy and glibc chose the removed
// features. The CPUID instruction shows them either way unless the host has CPUID faulting.
func TestCPUCheck(t *testing.T) {
	baseline, removed := belowHost(t)
	faulting, err := cpu.CPUIDFaulting(cpu.CPUInfo)
	if err != nil {
		t.Fatal(err)
	}
	rt := testenv.Runtime(t)
	work := testenv.WorkDir(t)
	capture1 := func(id string, env []string) *manifest.CPUCheck {
		t.Helper()
		meta, err := capture.Run(context.Background(), rt, capture.Request{
			ID: id, Imports: []string{"numpy"}, Rootfs: testenv.Rootfs(t), Dir: filepath.Join(work, id), WorkDir: work,
			Env: env, CPUBaseline: baseline, Timeout: 2 * time.Minute,
		})
		if err != nil {
			t.Fatal(err)
		}
		if meta.CPUCheck == nil {
			t.Fatal("no CPU check in meta.json")
		}
		return meta.CPUCheck
	}
	controlled := capture1("controls", cpubaseline.Env(cpubaseline.Controls(baseline)))
	t.Logf("with the controls: %+v", controlled)
	want := manifest.CPULibraries
	if faulting {
		want = manifest.CPUEnforced
	}
	if controlled.Verdict != want || controlled.Checked["numpy"] == "" || controlled.Checked["glibc"] == "" {
		t.Errorf("with the controls: %+v, want verdict %s with numpy and glibc checked", controlled, want)
	}
	for _, place := range []string{"cpuinfo", "numpy", "glibc", "openssl", "openblas"} {
		if seen := controlled.Outside[place]; len(seen) > 0 {
			t.Errorf("with the controls, %s chose %v", place, seen)
		}
	}
	if !faulting && len(cpu.Missing(removed, controlled.Outside["cpuid"])) > 0 {
		t.Errorf("CPUID run directly (no CPUID faulting here) saw %v, want all of %v", controlled.Outside["cpuid"], removed)
	}
	bare := capture1("bare", nil)
	t.Logf("without them: %+v", bare)
	if len(bare.Outside["cpuinfo"]) > 0 || bare.Checked["numpy"] == "" || bare.Checked["glibc"] == "" {
		t.Errorf("without the controls: %+v, want numpy and glibc checked and /proc/cpuinfo within the baseline", bare)
	}
	if !faulting {
		if bare.Verdict != manifest.CPUViolated || len(bare.Outside["numpy"]) == 0 || len(bare.Outside["glibc"]) == 0 {
			t.Errorf("without the controls (no CPUID faulting here): %+v, want numpy and glibc beyond the baseline", bare)
		}
		return
	}
	// With CPUID faulting the mask binds every library that asks CPUID (numpy, glibc,
	// OpenBLAS): what shows beyond the baseline can only be bits gVisor has no name for, which
	// no mask removes (an Intel host: OpenSSL's avx512ifma).
	for _, place := range []string{"numpy", "glibc", "openblas"} {
		if seen := bare.Outside[place]; len(seen) > 0 {
			t.Errorf("without the controls (CPUID faulting here): %s chose %v", place, seen)
		}
	}
	h, err := cpu.ReadHost(context.Background(), testenv.RunscPath(t), time.Minute)
	if err != nil {
		t.Fatal(err)
	}
	for place, seen := range bare.Outside {
		for _, f := range seen {
			if slices.Contains(h.Features, f) {
				t.Errorf("without the controls (CPUID faulting here): %s saw %s, a feature the mask names", place, f)
			}
		}
	}
}

// TestPackages: meta.json names the distributions the checkpoint holds loaded and their
// versions, as the image's metadata says (the directory names Debian installed, read here as
// data): pandas brings numpy, python-dateutil, pytz and six; every checkpoint holds the executor's
// cloudpickle; an empty set holds nothing else. Debian 12's are .egg-info directories whose
// top_level.txt names each module (Debian 13's have neither it nor RECORD: cmd/pipeline
// TestDebian13Image). Nothing is unmapped: not the modules Cython makes at run time
// (_cython_0_29_32, cython_runtime), not the interpreter's own (Debian's sitecustomize,
// _sysconfigdata), not the executor's.
func TestPackages(t *testing.T) {
	rootfs := testenv.Rootfs(t)
	installed := testenv.Distributions(t, filepath.Join(rootfs, "usr/lib/python3/dist-packages"))
	rt := testenv.Runtime(t)
	work := testenv.WorkDir(t)
	for id, want := range map[string][]string{
		"pandas": {"cloudpickle", "numpy", "pandas", "python-dateutil", "pytz", "six"},
		"empty":  {"cloudpickle"},
	} {
		var imports []string
		if id != "empty" {
			imports = []string{id}
		}
		meta, err := capture.Run(context.Background(), rt, capture.Request{
			ID: id, Imports: imports, Rootfs: rootfs, Dir: filepath.Join(work, id), WorkDir: work, Timeout: 2 * time.Minute,
		})
		if err != nil {
			t.Fatal(err)
		}
		wantMap := map[string]string{}
		for _, name := range want {
			if installed[name] == "" {
				t.Fatalf("the default image has no %s metadata directory: %v", name, installed)
			}
			wantMap[name] = installed[name]
		}
		if !maps.Equal(meta.Packages, wantMap) || meta.UnmappedModules != nil {
			t.Errorf("%s: packages %v, unmapped %v; want %v, none", id, meta.Packages, meta.UnmappedModules, wantMap)
		}
		written, err := manifest.LoadMeta(filepath.Join(work, id, manifest.MetaFileName))
		if err != nil || !maps.Equal(written.Packages, wantMap) {
			t.Errorf("%s: meta.json packages %v, %v", id, written.Packages, err)
		}
	}
}
