package cpu_test

import (
	"context"
	"errors"
	"os"
	"path/filepath"
	"regexp"
	"slices"
	"strings"
	"testing"
	"time"

	"readie.dev/pipeline/internal/testenv"
	"readie.dev/pipeline/pkg/cpu"
)

// TestNamesAreGVisors: the names are exactly those of allFeatures in the pinned gVisor's
// pkg/cpuid/features_amd64.go, the table runsc checks the annotation against.
func TestNamesAreGVisors(t *testing.T) {
	_, gvisor := testenv.PinnedGVisor(t, "../../Makefile")
	src, err := os.ReadFile(filepath.Join(gvisor, "pkg/cpuid/features_amd64.go"))
	if err != nil {
		t.Fatal(err)
	}
	start := strings.Index(string(src), "var allFeatures = map[Feature]allFeatureInfo{")
	end := strings.Index(string(src)[start:], "\n}\n")
	if start < 0 || end < 0 {
		t.Fatal("no allFeatures table in features_amd64.go")
	}
	var theirs []string
	for _, m := range regexp.MustCompile(`\{"([^"]+)",\s*(true|false)\}`).FindAllStringSubmatch(string(src)[start:start+end], -1) {
		theirs = append(theirs, m[1])
	}
	if len(theirs) < 100 {
		t.Fatalf("read only %d names from gVisor's table", len(theirs))
	}
	if got, want := cpu.Names(), cpu.Normalize(theirs); !slices.Equal(got, want) {
		t.Errorf("names differ from gVisor's: only ours %v, only gVisor's %v", cpu.Missing(got, want), cpu.Missing(want, got))
	}
	for _, name := range []string{"avx512ifma", "avx512_bf16", "clflushopt", "AVX2", "sse3"} {
		if cpu.Known(name) {
			t.Errorf("%s is known, but gVisor has no such name", name)
		}
	}
}

func TestSets(t *testing.T) {
	if got := cpu.Normalize([]string{"sse2", "fpu", "sse2", "avx"}); !slices.Equal(got, []string{"avx", "fpu", "sse2"}) {
		t.Errorf("Normalize: %v", got)
	}
	if got := cpu.Missing([]string{"avx2", "fpu", "avx512f", "avx512bw"}, []string{"fpu", "avx2"}); !slices.Equal(got, []string{"avx512bw", "avx512f"}) {
		t.Errorf("Missing: %v", got)
	}
	if got := cpu.Missing([]string{"fpu"}, []string{"fpu", "sse"}); got != nil {
		t.Errorf("cpu.Missing of a subset: %v", got)
	}
	if got := cpu.Intersect([]string{"sse", "fpu", "avx"}, []string{"avx", "fpu"}, []string{"fpu", "avx", "sse2"}); !slices.Equal(got, []string{"avx", "fpu"}) {
		t.Errorf("Intersect: %v", got)
	}
	if cpu.Intersect() != nil {
		t.Error("cpu.Intersect of nothing is not nil")
	}
	if got := cpu.Unknown([]string{"fpu", "bogus", "AVX2", "bogus"}); !slices.Equal(got, []string{"AVX2", "bogus"}) {
		t.Errorf("Unknown: %v", got)
	}
}

func TestParseHosts(t *testing.T) {
	good := []struct {
		name, text string
		want       []cpu.Host
	}{
		{"runsc cpu-features alone", "sse2,fpu,avx\n", []cpu.Host{{Features: []string{"avx", "fpu", "sse2"}}}},
		{"with the cache line", "fpu,sse\nclflush size\t: 64\n", []cpu.Host{{Features: []string{"fpu", "sse"}, CacheLine: 64}}},
		{"two hosts, comments, blanks", "# type a\nfpu,avx2\nclflush size : 64\n\n# type b\n fpu , sse \n", []cpu.Host{
			{Features: []string{"avx2", "fpu"}, CacheLine: 64}, {Features: []string{"fpu", "sse"}}}},
		{"no newline at the end", "fpu", []cpu.Host{{Features: []string{"fpu"}}}},
	}
	for _, tt := range good {
		t.Run(tt.name, func(t *testing.T) {
			hosts, err := cpu.ParseHosts(strings.NewReader(tt.text), "f.txt")
			if err != nil {
				t.Fatal(err)
			}
			if len(hosts) != len(tt.want) {
				t.Fatalf("%v, want %v", hosts, tt.want)
			}
			for i := range hosts {
				if !slices.Equal(hosts[i].Features, tt.want[i].Features) || hosts[i].CacheLine != tt.want[i].CacheLine {
					t.Errorf("host %d: %v, want %v", i, hosts[i], tt.want[i])
				}
			}
			// String writes what cpu.ParseHosts reads.
			again, err := cpu.ParseHosts(strings.NewReader(hosts[0].String()), "again")
			if err != nil || !slices.Equal(again[0].Features, hosts[0].Features) || again[0].CacheLine != hosts[0].CacheLine {
				t.Errorf("String does not read back: %q: %v %v", hosts[0].String(), again, err)
			}
		})
	}
	bad := []struct{ name, text, want string }{
		{"empty", "", "holds no features line"},
		{"comments only", "# nothing\n\n", "holds no features line"},
		{"unknown names", "fpu,avx512ifma,AVX2\n", "line 1: names gVisor does not know: AVX2, avx512ifma"},
		{"cpuinfo flags", "fpu vme de pse\n", `"fpu vme de pse" is not a feature name`},
		{"empty name", "fpu,,sse\n", "an empty feature name"},
		{"cache line first", "clflush size : 64\nfpu\n", "line 1: a \"clflush size\" line belongs after"},
		{"two cache lines", "fpu\nclflush size : 64\nclflush size : 64\n", "line 3"},
		{"bad cache line", "fpu\nclflush size : lots\n", `line 2: "clflush size : lots"`},
		{"zero cache line", "fpu\nclflush size : 0\n", "line 2"},
	}
	for _, tt := range bad {
		t.Run(tt.name, func(t *testing.T) {
			_, err := cpu.ParseHosts(strings.NewReader(tt.text), "f.txt")
			if err == nil || !errors.Is(err, cpu.ErrFormat) || !strings.Contains(err.Error(), tt.want) || !strings.Contains(err.Error(), "f.txt") {
				t.Errorf("error %v, want cpu.ErrFormat naming f.txt and %q", err, tt.want)
			}
		})
	}
}

func FuzzParseHosts(f *testing.F) {
	f.Add("fpu,sse\nclflush size : 64\n")
	f.Add("# c\nfpu\n\nsse2,avx\n")
	f.Add("clflush size: 64")
	f.Fuzz(func(t *testing.T, text string) {
		hosts, err := cpu.ParseHosts(strings.NewReader(text), "fuzz")
		if err != nil {
			return
		}
		for _, h := range hosts {
			if len(h.Features) == 0 || cpu.Unknown(h.Features) != nil || !slices.IsSorted(h.Features) {
				t.Fatalf("%q gave %v", text, h)
			}
			again, err := cpu.ParseHosts(strings.NewReader(h.String()), "again")
			if err != nil || !slices.Equal(again[0].Features, h.Features) || again[0].CacheLine != h.CacheLine {
				t.Fatalf("%v does not read back: %v %v", h, again, err)
			}
		}
	})
}

func TestCPUInfo(t *testing.T) {
	dir := t.TempDir()
	write := func(name, text string) string {
		path := filepath.Join(dir, name)
		os.WriteFile(path, []byte(text), 0o644)
		return path
	}
	faulting := write("faulting", "processor\t: 0\nflags\t\t: fpu vme cpuid_fault avx2\nclflush size\t: 64\n\nprocessor\t: 1\nclflush size\t: 128\n")
	plain := write("plain", "processor\t: 0\nflags\t\t: fpu vme avx2 cpuid\nclflush size\t: 32\n")
	if ok, err := cpu.CPUIDFaulting(faulting); !ok || err != nil {
		t.Errorf("faulting: %v %v", ok, err)
	}
	if ok, err := cpu.CPUIDFaulting(plain); ok || err != nil {
		t.Errorf("plain: %v %v", ok, err)
	}
	if n, err := cpu.ReadCacheLine(faulting); n != 64 || err != nil {
		t.Errorf("cache line %d %v, want the first CPU's 64", n, err)
	}
	if n, err := cpu.ReadCacheLine(plain); n != 32 || err != nil {
		t.Errorf("cache line %d %v", n, err)
	}
	if _, err := cpu.ReadCacheLine(write("none", "processor : 0\n")); err == nil || !strings.Contains(err.Error(), `no "clflush size" line`) {
		t.Errorf("no cache line: %v", err)
	}
}

// TestReadHost: the real runsc's features, parsed, and this host's cache line; they are what
// the annotation takes (a sandbox given all of them starts: pkg/capture's tests).
func TestReadHost(t *testing.T) {
	runsc := testenv.RunscPath(t)
	h, err := cpu.ReadHost(context.Background(), runsc, 30*time.Second)
	if err != nil {
		t.Fatal(err)
	}
	raw, err := testenv.Command(t, time.Minute, runsc, "cpu-features").Output()
	if err != nil {
		t.Fatal(err)
	}
	if want := cpu.Normalize(strings.Split(strings.TrimSpace(string(raw)), ",")); !slices.Equal(h.Features, want) {
		t.Errorf("features %v, runsc printed %v", h.Features, want)
	}
	for _, f := range []string{"fpu", "sse2", "lm"} {
		if !slices.Contains(h.Features, f) {
			t.Errorf("an x86-64 host without %s: %v", f, h.Features)
		}
	}
	if want, err := cpu.ReadCacheLine(cpu.CPUInfo); err != nil || h.CacheLine != want {
		t.Errorf("cache line %d, /proc/cpuinfo says %d (%v)", h.CacheLine, want, err)
	}
}

// TestReadHostTimeout: a runsc that never answers is stopped at the limit, and the error
// says which command and which limit.
func TestReadHostTimeout(t *testing.T) {
	stuck := filepath.Join(t.TempDir(), "runsc")
	os.WriteFile(stuck, []byte("#!/bin/sh\nexec sleep 600\n"), 0o755)
	_, err := cpu.ReadHost(context.Background(), stuck, 200*time.Millisecond)
	if !errors.Is(err, context.DeadlineExceeded) || !strings.Contains(err.Error(), "cpu-features exceeded its timeout of 200ms") {
		t.Errorf("error %v", err)
	}
	failing := filepath.Join(t.TempDir(), "runsc")
	os.WriteFile(failing, []byte("#!/bin/sh\necho 'no such command' >&2\nexit 3\n"), 0o755)
	if _, err := cpu.ReadHost(context.Background(), failing, time.Minute); err == nil || !strings.Contains(err.Error(), "no such command") {
		t.Errorf("a failing runsc: %v", err)
	}
}

// TestRecordedHosts: on each CPU this kind of machine comes with (testdata/hosts, recorded by
// images/executor/tests/record_host.py), whichever one runs the tests: CPUID faulting as the
// directory's name says, the cache line, and runsc's features as a features file whose every
// name this package knows (the Intel one adds avx512_fp16, amx_*, arch_capabilities, ...).
func TestRecordedHosts(t *testing.T) {
	dirs, err := filepath.Glob(filepath.Join("..", "..", "testdata", "hosts", "*", "runsc-cpu-features.txt"))
	if err != nil || len(dirs) < 2 {
		t.Fatalf("recorded hosts: %v %v", dirs, err)
	}
	for _, features := range dirs {
		dir := filepath.Dir(features)
		t.Run(filepath.Base(dir), func(t *testing.T) {
			cpuinfo := filepath.Join(dir, "proc-cpuinfo.txt")
			faulting, err := cpu.CPUIDFaulting(cpuinfo)
			if err != nil || faulting != !strings.Contains(filepath.Base(dir), "no-cpuid-faulting") {
				t.Errorf("CPUID faulting %v %v", faulting, err)
			}
			line, err := cpu.ReadCacheLine(cpuinfo)
			if err != nil || line != 64 {
				t.Errorf("cache line %d %v", line, err)
			}
			text, err := os.ReadFile(features)
			if err != nil {
				t.Fatal(err)
			}
			hosts, err := cpu.ParseHosts(strings.NewReader(string(text)+"clflush size\t: 64\n"), features)
			if err != nil || len(hosts) != 1 || hosts[0].CacheLine != 64 || len(hosts[0].Features) < 80 {
				t.Fatalf("%v %v", hosts, err)
			}
			if unknown := cpu.Unknown(hosts[0].Features); len(unknown) > 0 {
				t.Errorf("names runsc printed that this package does not know: %v", unknown)
			}
		})
	}
}
