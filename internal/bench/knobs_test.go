package bench

import (
	"bytes"
	"context"
	"errors"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"

	ogorek "github.com/kisielk/og-rek"

	"readie.dev/pipeline/internal/config"
	"readie.dev/pipeline/internal/testenv"
	"readie.dev/pipeline/pkg/capture"
	"readie.dev/pipeline/pkg/launch"
	"readie.dev/pipeline/pkg/measure"
	"readie.dev/pipeline/pkg/sandbox"
)

// TestVariantImages: a variant gets an image of its own exactly when it has checkpoint options,
// global flags or pre-checkpoint steps, named by all three; options alone keep their old key.
func TestVariantImages(t *testing.T) {
	vs := Variants([]config.BenchVariant{
		{Name: "none"},
		{Name: "bg", RestoreFlags: []string{"-background"}, Pooled: true},
		{Name: "zero", CheckpointOptions: map[string]string{"exclude-committed-zero-pages": "true"}},
		{Name: "hs", GlobalFlags: []string{"--host-settings=ignore"}},
		{Name: "gc", PreCheckpoint: []string{"gc.collect", "gc.freeze"}},
	})
	want := []string{"", "", "exclude-committed-zero-pages=true", "flags=--host-settings=ignore", "pre_checkpoint=gc.collect+gc.freeze"}
	for i, v := range vs {
		if got := v.imageKey(); got != want[i] || v.OwnImage() != (want[i] != "") {
			t.Errorf("%s: key %q own %v, want %q", v.Name, got, v.OwnImage(), want[i])
		}
	}
	if !vs[1].Pooled || vs[3].GlobalFlags[0] != "--host-settings=ignore" {
		t.Errorf("variants %+v", vs)
	}
	set := MeasuredSet{ID: "pandas", Dir: "/out/pandas", VariantDirs: map[string]string{"flags=--host-settings=ignore": "/w/v0"}}
	if dir, err := set.variantDir(vs[3]); dir != "/w/v0" || err != nil {
		t.Errorf("variantDir(hs) = %q, %v", dir, err)
	}
	if dir, err := set.variantDir(vs[1]); dir != "/out/pandas" || err != nil {
		t.Errorf("variantDir(bg) = %q, %v", dir, err)
	}
	set.Bytes, set.VariantBytes = 1000, map[string]int64{"flags=--host-settings=ignore": 123}
	for series, want := range map[string]int64{"variant:hs": 123, "variant:hs:last-page": 123, "variant:bg": 1000, Restore: 1000} {
		if got := set.seriesBytes(series, vs); got != want {
			t.Errorf("seriesBytes(%s) = %d, want %d", series, got, want)
		}
	}
	if _, err := set.variantDir(vs[4]); err == nil || !strings.Contains(err.Error(), "pre_checkpoint=gc.collect+gc.freeze") {
		t.Errorf("variantDir(gc) without its image: %v", err)
	}
}

// TestVariantRuntime: the variant's global flags and the log directory go after the runtime's
// own flags, on a copy: the pipeline's runtime is unchanged.
func TestVariantRuntime(t *testing.T) {
	rt := &launch.Runtime{Path: "/runsc", Root: "/run/r", Flags: sandbox.Flags{Network: "none", Overlay: "none", HostUDS: "create", Extra: []string{"--ignore-cgroups"}}}
	v := Variant{GlobalFlags: []string{"--host-settings=ignore"}}
	got := v.runtime(rt, "/w/log").Flags.Args()
	want := []string{"--network=none", "--overlay2=none", "--host-uds=create", "--ignore-cgroups", "--host-settings=ignore", "--debug-log=/w/log/"}
	if !slices.Equal(got, want) {
		t.Errorf("args %q, want %q", got, want)
	}
	if len(rt.Flags.Extra) != 1 {
		t.Errorf("the runtime was changed: %q", rt.Flags.Extra)
	}
	if slices.Contains(v.runtime(rt, "").Flags.Args(), "--debug") {
		t.Error("--debug without a log directory")
	}
}

// TestVariantWithoutHelpers: a variant without_helpers gets an empty directory as runsc's
// helpers directory, in its runtime and its driver, and a pool of its own; others keep the
// runtime's. Its restores run without them for real: TestVariantRestoresWithoutHelpers.
func TestVariantWithoutHelpers(t *testing.T) {
	vs := Variants([]config.BenchVariant{{Name: "none"}, {Name: "without-helpers", WithoutHelpers: true, Pooled: true}})
	work := t.TempDir()
	if err := withHelpersDir(vs, work); err != nil {
		t.Fatal(err)
	}
	rt := &launch.Runtime{Path: "/runsc", Root: "/run/r"}
	if got := vs[0].runtime(rt, "").Driver().HelpersDir; got != "" {
		t.Errorf("none: helpers directory %q, want runsc's own", got)
	}
	dir := vs[1].runtime(rt, "").Driver().HelpersDir
	if entries, err := os.ReadDir(dir); err != nil || len(entries) != 0 || !strings.HasPrefix(dir, work) || !vs[1].WithoutHelpers {
		t.Errorf("without-helpers: helpers directory %q (%v, %v): want an empty one under %s", dir, entries, err, work)
	}
	if rt.HelpersDir != "" {
		t.Errorf("the runtime was changed: %q", rt.HelpersDir)
	}
	if vs[1].OwnImage() || vs[1].imageKey() != "" {
		t.Errorf("without-helpers restores the output's image; key %q", vs[1].imageKey())
	}
	if poolKey(vs[0]) != "" || poolKey(vs[1]) == poolKey(vs[0]) {
		t.Errorf("pool keys %q and %q: without-helpers shares the default's pool", poolKey(vs[0]), poolKey(vs[1]))
	}
}

// TestVariantRestoresWithoutHelpers restores one image as a variant with runsc's helpers and
// as one without, under real gVisor: runsc's log of each (the variant's, at info level) says
// which way its sandbox booted.
func TestVariantRestoresWithoutHelpers(t *testing.T) {
	rt := testenv.Runtime(t)
	rootfs := testenv.Rootfs(t)
	work := testenv.WorkDir(t)
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Minute)
	defer cancel()
	set := MeasuredSet{ID: "small", Imports: []string{"json"}, Dir: filepath.Join(work, "img")}
	if _, err := capture.Run(ctx, rt, capture.Request{ID: set.ID, Imports: set.Imports, Rootfs: rootfs, Dir: set.Dir, WorkDir: work, Timeout: 2 * time.Minute}); err != nil {
		t.Fatal(err)
	}
	r := &measure.Restorer{Launcher: launch.Launcher{Runtime: rt, Rootfs: rootfs, WorkDir: work, Timeout: time.Minute}}
	vs := Variants([]config.BenchVariant{{Name: "none"}, {Name: "without-helpers", WithoutHelpers: true}})
	if err := withHelpersDir(vs, work); err != nil {
		t.Fatal(err)
	}
	for _, c := range []struct {
		v        Variant
		want     string
		wantNone string
	}{
		{vs[0], `Sidecar "gvisor_sentry" found: booting sandbox with`, "not usable"},
		{vs[1], `Sidecar "gvisor_sentry" not usable`, "found: booting sandbox with"},
	} {
		logDir := filepath.Join(work, "log-"+c.v.Name)
		if err := os.Mkdir(logDir, 0o755); err != nil {
			t.Fatal(err)
		}
		if first, _, _, err := timeVariant(ctx, r, c.v, set, set.Dir, logDir); err != nil || first <= 0 {
			t.Fatalf("%s: %v, %v", c.v.Name, first, err)
		}
		logs, _ := filepath.Glob(filepath.Join(logDir, "*.restore.txt"))
		if len(logs) != 1 {
			t.Fatalf("%s: runsc restore's logs %v, want one", c.v.Name, logs)
		}
		data, err := os.ReadFile(logs[0])
		if err != nil {
			t.Fatal(err)
		}
		if !strings.Contains(string(data), c.want) || strings.Contains(string(data), c.wantNone) {
			t.Errorf("%s: runsc restore's log lacks %q or holds %q:\n%s", c.v.Name, c.want, c.wantNone, data)
		}
	}
}

func envelope(t *testing.T, value any) []byte {
	t.Helper()
	var b bytes.Buffer
	if err := ogorek.NewEncoderWithConfig(&b, &ogorek.EncoderConfig{Protocol: 4}).Encode(map[string]any{"ok": true, "value": value, "output": []any{}}); err != nil {
		t.Fatal(err)
	}
	return b.Bytes()
}

// TestCheckVariant: the answer must have every module imported, and objects frozen exactly when
// the variant's steps froze them.
func TestCheckVariant(t *testing.T) {
	freeze := Variant{PreCheckpoint: []string{"gc.collect", "gc.freeze"}}
	plain := Variant{}
	for _, c := range []struct {
		v     Variant
		value any
		ok    bool
	}{
		{plain, []any{int64(1), int64(0)}, true},
		{freeze, []any{int64(1), int64(52000)}, true},
		{freeze, []any{int64(1), int64(0)}, false},
		{plain, []any{int64(1), int64(10)}, false},
		{plain, []any{int64(0), int64(0)}, false},
		{plain, int64(1), false},
	} {
		err := checkVariant(envelope(t, c.value), []string{"pandas"}, c.v)
		if (err == nil) != c.ok {
			t.Errorf("%v with steps %q: %v, want ok %v", c.value, c.v.PreCheckpoint, err, c.ok)
		}
	}
}

// TestPagesLoadedAt: the time of the sandbox's last-page line, read as UTC whatever the local
// zone; not yet logged and a line without a time are told apart.
func TestPagesLoadedAt(t *testing.T) {
	dir := t.TempDir()
	if _, err := pagesLoadedAt(dir, 2026, time.UTC); !errors.Is(err, errNotYet) {
		t.Fatalf("no log: %v", err)
	}
	boot := filepath.Join(dir, "runsc.log.20261203-152201.000001.boot.txt")
	lines := "I1203 15:22:01.100000  1 controller.go:600] Restore ...\n"
	os.WriteFile(boot, []byte(lines), 0o644)
	if _, err := pagesLoadedAt(dir, 2026, time.UTC); !errors.Is(err, errNotYet) {
		t.Fatalf("without the line: %v", err)
	}
	lines += "I1203 15:22:01.234567  1 kernel_restore.go:354] All MemoryFile pages have been loaded.\n"
	os.WriteFile(boot, []byte(lines), 0o644)
	// The zone is pagesLoadedAt's argument, never time.Local (which a test must not change:
	// the runtime's timers read it).
	at, err := pagesLoadedAt(dir, 2026, time.UTC)
	if want := time.Date(2026, 12, 3, 15, 22, 1, 234567000, time.UTC); err != nil || !at.Equal(want) {
		t.Fatalf("at %v (%v), want %v", at, err, want)
	}
	// `runsc boot` logs in the host's zone, whatever the pipeline's TZ: read in it, the same
	// line is another instant.
	newYork, err := time.LoadLocation("America/New_York")
	if err != nil {
		t.Fatal(err)
	}
	at, err = pagesLoadedAt(dir, 2026, newYork)
	if want := time.Date(2026, 12, 3, 20, 22, 1, 234567000, time.UTC); err != nil || !at.Equal(want) {
		t.Fatalf("in New York's zone: at %v (%v), want %v", at, err, want)
	}
	os.WriteFile(filepath.Join(dir, "runsc.log.20261203-152202.000001.boot.txt"), nil, 0o644)
	if _, err := pagesLoadedAt(dir, 2026, time.UTC); err == nil || errors.Is(err, errNotYet) {
		t.Fatalf("two sandbox logs: %v", err)
	}
	if err := removeLogs(dir); err != nil {
		t.Fatal(err)
	}
	ctx := context.Background()
	if _, err := waitPagesLoaded(ctx, dir, 2026, time.UTC, 20*time.Millisecond); err == nil || !strings.Contains(err.Error(), "did not log") {
		t.Fatalf("wait on an empty directory: %v", err)
	}
}

type derivedRunner struct{ fakeRunner }

func (d *derivedRunner) Derived() map[string]float64 {
	return map[string]float64{"variant:bg" + LastPageSuffix: 500}
}

// TestExecuteDerivedSeries: a runner's derived figures become series of their own, after the
// scheduled ones, from the measured rounds only.
func TestExecuteDerivedSeries(t *testing.T) {
	runner := &derivedRunner{fakeRunner{times: map[string]float64{"variant:bg": 100}}}
	res, err := Execute(context.Background(), []MeasuredSet{{ID: "pandas"}}, []string{"variant:bg"}, 3, runner, nil)
	if err != nil {
		t.Fatal(err)
	}
	if got := strings.Join(res.Series, " "); got != "variant:bg variant:bg:last-page" {
		t.Errorf("series %q", got)
	}
	if st := res.Sets[0].Series["variant:bg:last-page"]; len(st.Runs) != 3 || st.Median != 500 {
		t.Errorf("last-page stats %+v", st)
	}
}

// TestRestoreCPUMs reads the restore CPU time the sandbox logs once its restore is done, in
// the words of the pinned gVisor (runsc/boot/restore.go).
func TestRestoreCPUMs(t *testing.T) {
	dir := t.TempDir()
	if _, err := restoreCPUMs(dir); !errors.Is(err, errNotYet) {
		t.Fatalf("no log: %v", err)
	}
	boot := filepath.Join(dir, "runsc.log.20261206-062201.000001.boot.txt")
	lines := "I1206 06:22:01.234567  1 kernel_restore.go:354] All MemoryFile pages have been loaded.\n"
	os.WriteFile(boot, []byte(lines), 0o644)
	if _, err := restoreCPUMs(dir); !errors.Is(err, errNotYet) {
		t.Fatalf("without the line: %v", err)
	}
	lines += "I1206 06:22:01.240001  1 restore.go:661] CPU time saved with restore: 1204 ms, restore CPU time: 187 ms\n"
	os.WriteFile(boot, []byte(lines), 0o644)
	if ms, err := restoreCPUMs(dir); err != nil || ms != 187 {
		t.Fatalf("%v ms, %v; want 187", ms, err)
	}
	os.WriteFile(boot, []byte("I1206 06:22:01.240001  1 restore.go:661] restore CPU time: 1.5s\n"), 0o644)
	if _, err := restoreCPUMs(dir); err == nil || errors.Is(err, errNotYet) || !strings.Contains(err.Error(), "not known here") {
		t.Fatalf("a line in another form: %v", err)
	}
}

type cpuRunner struct{ fakeRunner }

func (c *cpuRunner) RestoreCPU() (float64, bool) { return 42, len(c.calls)%2 == 0 || len(c.calls) == 5 }

// TestExecuteRestoreCPU: CPU times are kept beside the runs only when every run has one, never
// some runs' alone (they would no longer line up with their wall times).
func TestExecuteRestoreCPU(t *testing.T) {
	runner := &cpuRunner{fakeRunner{times: map[string]float64{"a": 100, "b": 200}}}
	res, err := Execute(context.Background(), []MeasuredSet{{ID: "pandas"}}, []string{"a", "b"}, 3, runner, nil)
	if err != nil {
		t.Fatal(err)
	}
	// Calls 1 and 2 are the warm-up; then a runs on odd calls (one with a CPU time), b on even ones.
	if a, b := res.Sets[0].Series["a"], res.Sets[0].Series["b"]; a.RestoreCPU != nil || len(b.RestoreCPU) != 3 || b.RestoreCPU[0] != 42 {
		t.Errorf("a's CPU times %v, b's %v", a.RestoreCPU, b.RestoreCPU)
	}
}
