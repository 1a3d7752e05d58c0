package main

import (
	"context"
	"encoding/json"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"testing"
	"time"

	"readie.dev/pipeline/internal/testenv"
	"readie.dev/pipeline/pkg/cpu"
	"readie.dev/pipeline/pkg/manifest"
)

// cpuHost is this host's CPU as restore sees it, and whether it has CPUID faulting.
func cpuHost(t *testing.T) (cpu.Host, bool) {
	t.Helper()
	h, err := cpu.ReadHost(context.Background(), testenv.RunscPath(t), time.Minute)
	if err != nil {
		t.Fatal(err)
	}
	faulting, err := cpu.CPUIDFaulting(cpu.CPUInfo)
	if err != nil {
		t.Fatal(err)
	}
	return h, faulting
}

// widest is what a baseline below this host leaves out: every avx512* feature, or avx2 on a
// host without AVX-512.
func widest(h cpu.Host) []string {
	var out []string
	for _, f := range h.Features {
		if strings.HasPrefix(f, "avx512") {
			out = append(out, f)
		}
	}
	if out == nil {
		out = []string{"avx2"}
	}
	return out
}

func minus(features []string, drop ...string) []string {
	return slices.DeleteFunc(slices.Clone(features), func(f string) bool { return slices.Contains(drop, f) })
}

// featuresFile writes host types in the features file format and returns its path.
func featuresFile(t *testing.T, dir, name string, hosts ...cpu.Host) string {
	t.Helper()
	var text string
	for _, h := range hosts {
		text += h.String()
	}
	path := filepath.Join(dir, name)
	if err := os.WriteFile(path, []byte(text), 0o644); err != nil {
		t.Fatal(err)
	}
	return path
}

// withBaseline writes tc's config with cpu_baseline set to the YAML value given.
func withBaseline(t *testing.T, tc testConfig, baseline string) string {
	t.Helper()
	path := tc.write(t)
	f, err := os.OpenFile(path, os.O_APPEND|os.O_WRONLY, 0)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	if _, err := f.WriteString("cpu_baseline: " + baseline + "\n"); err != nil {
		t.Fatal(err)
	}
	return path
}

// TestCPUBaselineEnforcement: a baseline of this host's features without its widest vector
// extension. Without CPUID faulting (this machine) the capture is refused (exit 2) naming the
// features code sees through CPUID and why, and nothing is written; with enforce: false the
// output is made, its manifest says enforced false with the controls and each checkpoint's
// check, and check-host warns but exits 0. A later run that demands enforcement refuses the
// checkpoints it would reuse. A baseline the host lacks is refused before any sandbox.
func TestCPUBaselineEnforcement(t *testing.T) {
	t.Parallel()
	host, faulting := cpuHost(t)
	removed := widest(host)
	dir := testenv.WorkDir(t)
	tc := testConfig{runsc: testenv.RunscPath(t), root: runscRoot(t, dir), rootfs: testenv.Rootfs(t), output: filepath.Join(dir, "out"),
		sets: "  - id: js\n    imports: [json]\n"}
	below := featuresFile(t, dir, "below.txt", cpu.Host{Features: minus(host.Features, removed...), CacheLine: host.CacheLine})
	enforced := withBaseline(t, tc, "{file: "+below+"}")

	code, stdout, stderr := runCLI(t, "capture", "--config", enforced, "--jobs", "1")
	if faulting {
		// A host that traps CPUID enforces the baseline: nothing to refuse.
		if code != exitOK || !*testenv.Manifest(t, tc.output).CPU.Enforced {
			t.Fatalf("a host with CPUID faulting: exit %d\n%s%s", code, stdout, stderr)
		}
		return
	}
	if code != exitUsage {
		t.Fatalf("capture with an unenforceable baseline: exit %d, want 2\n%s%s", code, stdout, stderr)
	}
	for _, want := range append([]string{"cannot hide features outside cpu_baseline", "no CPUID faulting", "enforce: false"}, removed...) {
		if !strings.Contains(stderr, want) {
			t.Errorf("the refusal does not say %q:\n%s", want, stderr)
		}
	}
	// The reason holds for every set on this host: the sets after the first are not captured.
	if !strings.Contains(stderr, "js: not captured: this host cannot enforce the CPU baseline (see empty)") {
		t.Errorf("the second set was captured after the first was refused:\n%s", stderr)
	}
	if _, err := os.Stat(tc.output); !os.IsNotExist(err) {
		t.Errorf("a refused capture wrote the output: %v", err)
	}
	if entries, _ := os.ReadDir(filepath.Join(dir, "store")); slices.ContainsFunc(entries, func(e os.DirEntry) bool { return !strings.HasPrefix(e.Name(), ".") }) {
		t.Errorf("a refused capture left store entries: %v", entries)
	}

	unenforced := withBaseline(t, tc, "{file: "+below+", enforce: false}")
	if code, stdout, stderr := runCLI(t, "capture", "--config", unenforced); code != exitOK {
		t.Fatalf("capture with enforce: false: exit %d\n%s%s", code, stdout, stderr)
	}
	m := testenv.Manifest(t, tc.output)
	c := m.CPU
	if c == nil || c.Enforced == nil || *c.Enforced || !slices.Equal(c.Features, minus(host.Features, removed...)) ||
		!slices.Equal(c.Baseline, c.Features) || c.CacheLine != host.CacheLine || c.Controls["NPY_DISABLE_CPU_FEATURES"] == "" || c.Controls["GLIBC_TUNABLES"] == "" {
		t.Fatalf("manifest cpu %+v", c)
	}
	for _, cp := range m.Checkpoints {
		if cp.CPUCheck == nil || cp.CPUCheck.Verdict != manifest.CPULibraries || len(cpu.Missing(removed, cp.CPUCheck.Outside["cpuid"])) > 0 {
			t.Errorf("%s: cpu_check %+v", cp.ID, cp.CPUCheck)
		}
	}
	data, _ := os.ReadFile(filepath.Join(tc.output, manifest.FileName))
	if !strings.Contains(string(data), `"enforced": false`) {
		t.Errorf("manifest.json does not say enforced false")
	}
	if code, stdout, stderr := runCLI(t, "verify", "--config", unenforced); code != exitOK {
		t.Fatalf("verify: %s%s", stdout, stderr)
	}
	// Restored again as a worker would, with the manifest's controls in the environment.
	if code, stdout, stderr := runCLI(t, "smoke", "--config", unenforced); code != exitOK {
		t.Fatalf("smoke: %s%s", stdout, stderr)
	}
	code, stdout, stderr = runCLI(t, "check-host", "--config", unenforced)
	if code != exitOK || strings.Count(stdout, "warning: the CPU baseline is not enforced") != 2 || !strings.Contains(stdout, "js: restores") {
		t.Errorf("check-host on an unenforced output: exit %d\n%s%s", code, stdout, stderr)
	}

	// Enforcement demanded again: the checkpoints that would be reused say what they saw.
	code, _, stderr = runCLI(t, "capture", "--config", enforced)
	if code != exitUsage || !strings.Contains(stderr, "cannot hide features outside cpu_baseline") {
		t.Errorf("reuse under an enforced baseline: exit %d\n%s", code, stderr)
	}
	if after := testenv.Manifest(t, tc.output); after.CreatedAt != m.CreatedAt {
		t.Error("a refused run replaced the output")
	}

	// A baseline this host cannot give its sandboxes: refused before any sandbox.
	beyond := withBaseline(t, tc, "[fpu, sse2, avx512_fp16, amx_tile]")
	if slices.Contains(host.Features, "avx512_fp16") {
		beyond = withBaseline(t, tc, "[fpu, sse2, avx512er, avx512pf]")
	}
	code, _, stderr = runCLI(t, "plan", "--config", beyond)
	if code != exitUsage || !strings.Contains(stderr, "cpu_baseline names features this host lacks: ") {
		t.Errorf("a baseline beyond the host: exit %d\n%s", code, stderr)
	}
	// A host type whose cache line differs from this host's: no checkpoint from here restores there.
	otherLine := featuresFile(t, dir, "line.txt", host, cpu.Host{Features: host.Features, CacheLine: 2 * host.CacheLine})
	code, _, stderr = runCLI(t, "plan", "--config", withBaseline(t, tc, "{file: "+otherLine+"}"))
	if code != exitUsage || !strings.Contains(stderr, "host type 2 has a cache line of "+strconv.Itoa(2*host.CacheLine)+" bytes, this host "+strconv.Itoa(host.CacheLine)) {
		t.Errorf("a host type of another cache line: exit %d\n%s", code, stderr)
	}
	// An unknown name: a config error that names it.
	code, _, stderr = runCLI(t, "plan", "--config", withBaseline(t, tc, "[fpu, sse2, avx512ifma]"))
	if code != exitUsage || !strings.Contains(stderr, "names gVisor does not know: avx512ifma") {
		t.Errorf("an unknown name: exit %d\n%s", code, stderr)
	}
}

// TestCheckHost: an output captured here restores on this host (exit 0); against features files
// of other hosts, check-host names every missing feature and the differing cache line (exit 3),
// says when it could not check the cache line, and reads the output from an image of push. A
// check it could not make (a runsc that does not answer) is exit 1, never its verdict's 3.
func TestCheckHost(t *testing.T) {
	t.Parallel()
	host, _ := cpuHost(t)
	dir := testenv.WorkDir(t)
	cfg := smallOutput(t, dir)
	code, stdout, stderr := runCLI(t, "check-host", "--config", cfg)
	if code != exitOK || !strings.Contains(stdout, "this host: runsc ") || !strings.Contains(stdout, "js: restores") || strings.Contains(stdout, "warning") {
		t.Fatalf("this host: exit %d\n%s%s", code, stdout, stderr)
	}
	m := testenv.Manifest(t, filepath.Join(dir, "out"))
	if m.CPU == nil || !slices.Equal(m.CPU.Features, host.Features) || m.CPU.CacheLine != host.CacheLine || m.CPU.Baseline != nil || m.CPU.Enforced != nil {
		t.Errorf("manifest cpu without a baseline: %+v", m.CPU)
	}

	lacking := featuresFile(t, dir, "lacking.txt", cpu.Host{Features: minus(host.Features, "sse4_2"), CacheLine: 128})
	code, stdout, stderr = runCLI(t, "check-host", "--config", cfg, "--cpu-features", lacking)
	if code != exitDoesNotRestore || strings.Count(stdout, "does not restore: missing CPU features: sse4_2; cache line 128 bytes, the checkpoints need "+strconv.Itoa(host.CacheLine)) != 2 ||
		!strings.Contains(stderr, "checkpoints do not restore on the host of "+lacking+": empty, js") {
		t.Errorf("a host lacking a feature, with another cache line: exit %d\n%s%s", code, stdout, stderr)
	}
	code, stdout, _ = runCLI(t, "check-host", "--config", cfg, "--cpu-features", lacking, "--log-format", "json")
	var report struct {
		Host     manifest.RestoreHost `json:"host"`
		Restores bool                 `json:"restores"`
		manifest.Report
	}
	if err := json.Unmarshal([]byte(stdout), &report); err != nil || code != exitDoesNotRestore || report.Restores || len(report.Checkpoints) != 2 ||
		report.Checkpoints[1].ID != "js" || len(report.Checkpoints[1].Problems) != 2 || report.Host.CPU.CacheLine != 128 {
		t.Errorf("JSON: exit %d, %v\n%s", code, err, stdout)
	}

	wider := featuresFile(t, dir, "wider.txt", cpu.Host{Features: append(slices.Clone(host.Features), "amx_tile")})
	code, stdout, _ = runCLI(t, "check-host", "--config", cfg, "--cpu-features", wider)
	if code != exitOK || !strings.Contains(stdout, "warning: cache line not checked") || !strings.Contains(stdout, "cache line unknown") {
		t.Errorf("a host file without its cache line: exit %d\n%s", code, stdout)
	}
	// The default sandbox.cpus: every sandbox saw 2 CPUs, and a host of 1 restores with a warning.
	if m.CPUs != 2 {
		t.Errorf("manifest cpus = %d, want the default 2", m.CPUs)
	}
	code, stdout, _ = runCLI(t, "check-host", "--config", cfg, "--cpu-features", wider, "--cpus", "1")
	if code != exitOK || strings.Count(stdout, "warning: 1 CPUs, the checkpoints' sandboxes see 2 (cpus)") != 2 || !strings.Contains(stdout, ", 1 CPUs, ") {
		t.Errorf("a host of 1 CPU: exit %d\n%s", code, stdout)
	}

	layout := "oci-layout:" + filepath.Join(dir, "layout") + ":v1"
	if code, _, stderr := runCLI(t, "push", "--runtime", "--config", cfg, layout); code != exitOK {
		t.Fatalf("push: %s", stderr)
	}
	code, stdout, stderr = runCLI(t, "check-host", "--config", cfg, "--image", layout, "--cpu-features", lacking)
	if code != exitDoesNotRestore || !strings.Contains(stdout, "js: does not restore: missing CPU features: sse4_2") {
		t.Errorf("--image: exit %d\n%s%s", code, stdout, stderr)
	}

	// The runtime pull --runtime laid out: its runsc, helpers and rootfs are the checkpoints';
	// a rootfs of another digest is a problem of every checkpoint.
	runtime := filepath.Join(dir, "runtime")
	if code, _, stderr := runCLI(t, "pull", "--config", cfg, layout, filepath.Join(dir, "pulled"), "--runtime", runtime); code != exitOK {
		t.Fatalf("pull --runtime: %s", stderr)
	}
	code, stdout, stderr = runCLI(t, "check-host", "--config", cfg, "--runtime", runtime)
	if code != exitOK || !strings.Contains(stdout, "js: restores") || strings.Contains(stdout, "warning") {
		t.Errorf("--runtime: exit %d\n%s%s", code, stdout, stderr)
	}
	info := filepath.Join(runtime, "rootfs", manifest.RootfsInfoFile)
	writeText(t, filepath.Dir(info), filepath.Base(info), `{"digest":"sha256:0000"}`)
	code, stdout, stderr = runCLI(t, "check-host", "--config", cfg, "--runtime", runtime)
	if code != exitDoesNotRestore || strings.Count(stdout, "does not restore: rootfs "+filepath.Join(runtime, "rootfs")+" is sha256:0000, the checkpoints were captured on "+m.Rootfs.Digest) != 2 {
		t.Errorf("--runtime of another rootfs: exit %d\n%s%s", code, stdout, stderr)
	}
	// A runsc in DIR other than the checkpoints' does not restore them, and is not run to say
	// so (not even runsc --version): it would run as root.
	ran := filepath.Join(dir, "runsc-ran")
	writeText(t, runtime, "runsc", "#!/bin/sh\ntouch "+ran+"\n")
	os.Chmod(filepath.Join(runtime, "runsc"), 0o755)
	code, stdout, stderr = runCLI(t, "check-host", "--config", cfg, "--runtime", runtime)
	if code != exitDoesNotRestore || !strings.Contains(stderr, "not the runtime the output was captured with: runsc is") {
		t.Errorf("--runtime of another runsc: exit %d\n%s%s", code, stdout, stderr)
	}
	if _, err := os.Stat(ran); err == nil {
		t.Error("check-host ran a runsc of --runtime DIR that is not the checkpoints'")
	}

	broken := writeText(t, dir, "broken-runsc", "#!/bin/sh\necho 'runsc: cannot run here' >&2\nexit 1\n")
	os.Chmod(broken, 0o755)
	code, stdout, stderr = runCLI(t, "check-host", "--config", cfg, "--runsc", broken, "--cpu-features", lacking)
	if code != exitFailed || !strings.Contains(stderr, "cannot run here") || stdout != "" {
		t.Errorf("a runsc that does not answer: exit %d, want 1 (could not check)\n%s%s", code, stdout, stderr)
	}

	for _, tt := range []struct {
		name string
		args []string
		want string
	}{
		{"two host types", []string{"--cpu-features", featuresFile(t, dir, "two.txt", host, host)}, "describes 2 host types"},
		{"unknown names", []string{"--cpu-features", writeText(t, dir, "bad.txt", "fpu,AVX2\n")}, "names gVisor does not know: AVX2"},
		{"no output", []string{"--out", filepath.Join(dir, "none")}, "manifest.json"},
		{"an image and an output", []string{"--image", layout, "--out", dir}, "--image and an output directory"},
		{"no runsc", []string{"--runsc", filepath.Join(dir, "none")}, "--runsc"},
		{"a runtime and a runsc", []string{"--runtime", runtime, "--runsc", broken}, "--runtime DIR names runsc (DIR/runsc) and --runsc names another"},
		{"a CPU count of this host", []string{"--cpus", "1"}, "--cpus N (1 or more) describes the host of --cpu-features"},
	} {
		t.Run(tt.name, func(t *testing.T) {
			code, stdout, stderr := runCLI(t, append([]string{"check-host", "--config", cfg}, tt.args...)...)
			if code != exitUsage || !strings.Contains(stderr, tt.want) {
				t.Errorf("exit %d, want 2 saying %q\n%s%s", code, tt.want, stdout, stderr)
			}
		})
	}
}

func writeText(t *testing.T, dir, name, text string) string {
	t.Helper()
	path := filepath.Join(dir, name)
	if err := os.WriteFile(path, []byte(text), 0o644); err != nil {
		t.Fatal(err)
	}
	return path
}

// TestBaselineShardsMerge: two shards built as if on hosts of different CPU types (their
// baselines come from two features files, each listing host types whose features differ) with
// the same resulting baseline share keys (the second reuses the first's empty from the store)
// and merge; a shard with another baseline is refused, the merge naming cpu.
func TestBaselineShardsMerge(t *testing.T) {
	t.Parallel()
	host, faulting := cpuHost(t)
	removed := widest(host)
	base := minus(host.Features, removed...)
	dir := testenv.WorkDir(t)
	tc := testConfig{runsc: testenv.RunscPath(t), root: runscRoot(t, dir), rootfs: testenv.Rootfs(t), store: filepath.Join(dir, "store"),
		sets: "  - id: js\n    imports: [json]\n  - id: csv\n    imports: [csv]\n"}
	// Host types of two fleets' files: this host, a type without the removed features, a type
	// with features this host lacks. Both intersections are base.
	fileA := featuresFile(t, dir, "a.txt", host, cpu.Host{Features: base, CacheLine: host.CacheLine})
	fileB := featuresFile(t, dir, "b.txt", cpu.Host{Features: append(slices.Clone(base), "avx512_fp16", "amx_tile", "amx_int8")},
		cpu.Host{Features: base})
	shard := func(name, file, index string) (string, map[string]string) {
		t.Helper()
		tc.output = filepath.Join(dir, name)
		cfg := withBaseline(t, tc, "{file: "+file+", enforce: false}")
		code, stdout, stderr := runCLI(t, "capture", "--config", cfg, "--shard", index+"/2")
		if code != exitOK {
			t.Fatalf("shard %s: exit %d\n%s%s", name, code, stdout, stderr)
		}
		return cfg, tableColumn(stdout, 1)
	}
	cfgA, _ := shard("a", fileA, "0")
	_, statusB := shard("b", fileB, "1")
	if statusB["empty"] != "reused" {
		t.Errorf("the second shard's empty: %s, want reused (the same key)", statusB["empty"])
	}
	if a, b := testenv.Manifest(t, filepath.Join(dir, "a")), testenv.Manifest(t, filepath.Join(dir, "b")); a.Checkpoints[0].Key != b.Checkpoints[0].Key {
		t.Errorf("empty has keys %s and %s", a.Checkpoints[0].Key, b.Checkpoints[0].Key)
	}
	merged := filepath.Join(dir, "merged")
	code, stdout, stderr := runCLI(t, "merge", "--config", cfgA, "--out", merged, filepath.Join(dir, "a"), filepath.Join(dir, "b"))
	if code != exitOK {
		t.Fatalf("merge of one baseline: exit %d\n%s%s", code, stdout, stderr)
	}
	m := testenv.Manifest(t, merged)
	if len(m.Checkpoints) != 3 || !slices.Equal(m.CPU.Features, base) || m.CPU.Enforced == nil || *m.CPU.Enforced != faulting {
		t.Errorf("merged: %d checkpoints, cpu %+v", len(m.Checkpoints), m.CPU)
	}

	// Another baseline (one feature fewer): another effective set, refused.
	fewer := "sha_ni"
	if !slices.Contains(base, fewer) {
		fewer = "aes"
	}
	fileC := featuresFile(t, dir, "c.txt", cpu.Host{Features: minus(base, fewer)})
	shard("c", fileC, "1")
	code, _, stderr = runCLI(t, "merge", "--config", cfgA, "--out", filepath.Join(dir, "refused"), filepath.Join(dir, "a"), filepath.Join(dir, "c"))
	if code != exitFailed || !strings.Contains(stderr, "disagree on cpu.features") || !strings.Contains(stderr, "has "+fewer+";") {
		t.Errorf("merge of two baselines: exit %d\n%s", code, stderr)
	}
	if _, err := os.Stat(filepath.Join(dir, "refused")); !os.IsNotExist(err) {
		t.Errorf("a refused merge wrote its output: %v", err)
	}
}
