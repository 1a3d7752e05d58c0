package cpubaseline

import (
	"encoding/json"
	"errors"
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

// thisMachine is `runsc cpu-features` of the machine the controls were tried on (AMD EPYC).
const thisMachine = "fpu,vme,de,pse,tsc,msr,pae,mce,cx8,apic,sep,mtrr,pge,mca,cmov,pat,pse36,clflush,mmx,fxsr,sse,sse2,ht," +
	"syscall,nx,mmxext,fxsr_opt,pdpe1gb,rdtscp,lm,pni,pclmulqdq,ssse3,fma,cx16,pcid,sse4_1,sse4_2,x2apic," +
	"movbe,popcnt,tsc_deadline_timer,aes,xsave,osxsave,avx,f16c,rdrand,hypervisor,lahf_lm,cmp_legacy," +
	"cr8_legacy,abm,sse4a,misalignsse,3dnowprefetch,osvw,topoext,fsgsbase,tsc_adjust,bmi1,avx2,smep,bmi2," +
	"erms,invpcid,avx512f,avx512dq,rdseed,adx,smap,clfushopt,clwb,avx512cd,sha_ni,avx512bw,avx512vl," +
	"xsaveopt,xsavec,xgetbv1,xsaves,avx512vbmi,umip,avx512_vbmi2,cet_ss,gfni,vaes,vpclmulqdq,avx512_vnni," +
	"avx512_bitalg,avx512_vpopcntdq,rdpid,fsrm"

func without(prefix string) []string {
	var out []string
	for _, f := range strings.Split(thisMachine, ",") {
		if !strings.HasPrefix(f, prefix) {
			out = append(out, f)
		}
	}
	return out
}

func TestControls(t *testing.T) {
	noAVX512 := Controls(without("avx512"))
	want := map[string]string{
		EnvNumpy:    "XOP FMA4 AVX512F AVX512CD AVX512_KNL AVX512_KNM AVX512_SKX AVX512_CLX AVX512_CNL AVX512_ICL AVX512_SPR",
		EnvGlibc:    "glibc.cpu.hwcaps=-AVX512BW,-AVX512CD,-AVX512DQ,-AVX512ER,-AVX512F,-AVX512PF,-AVX512VL,-FMA4,-RTM",
		EnvOpenBLAS: "Haswell",
	}
	for k, v := range want {
		if noAVX512[k] != v {
			t.Errorf("%s=%q, want %q", k, noAVX512[k], v)
		}
	}
	// OpenSSL: every AVX-512 bit of word 1 (avx512f is bit 16, avx512vbmi bit 33, avx512ifma 21).
	ssl := noAVX512[EnvOpenSSL]
	if !strings.HasPrefix(ssl, "~0x") || !strings.Contains(ssl, ":~0x") {
		t.Fatalf("%s=%q", EnvOpenSSL, ssl)
	}
	w1, err := strconv.ParseUint(strings.SplitN(ssl, ":~", 2)[1], 0, 64)
	if err != nil {
		t.Fatal(err)
	}
	for _, bit := range []uint{16, 17, 21, 28, 30, 31, 33, 38, 43, 44, 46} {
		if w1>>bit&1 == 0 {
			t.Errorf("OpenSSL word 1 bit %d is not masked: %#x", bit, w1)
		}
	}
	for _, bit := range []uint{3, 5, 8, 29} { // bmi1, avx2, bmi2, sha_ni stay
		if w1>>bit&1 != 0 {
			t.Errorf("OpenSSL word 1 bit %d is masked: %#x", bit, w1)
		}
	}

	// Everything gVisor can name: only what needs the unnamed avx512ifma stays off.
	all := Controls(cpu.Names())
	if all[EnvNumpy] != "AVX512_CNL AVX512_ICL AVX512_SPR" || all[EnvGlibc] != "" || all[EnvOpenBLAS] != "SkylakeX" || all[EnvOpenSSL] != ":~0x0000000000200000" {
		t.Errorf("the widest baseline: %v", all)
	}
	// No AVX at all: memmove's AVX variant is turned off by its preferred bit too.
	v2 := Controls(slices.DeleteFunc(without("avx512"), func(f string) bool { return strings.HasPrefix(f, "avx") }))
	if !strings.HasSuffix(v2[EnvGlibc], ",-AVX_Fast_Unaligned_Load") || v2[EnvOpenBLAS] != "Nehalem" {
		t.Errorf("no AVX: %v", v2)
	}
	if Controls(nil) != nil {
		t.Error("controls without a baseline")
	}
	if got := Env(map[string]string{"B": "2", "A": "1"}); !slices.Equal(got, []string{"A=1", "B=2"}) {
		t.Errorf("Env: %v", got)
	}
}

// TestTablesMatchTheExecutor: the tables the controls are made from are the executor's, which
// checks them from inside the sandbox, and its CPUID names are gVisor's (pkg/cpu).
func TestTablesMatchTheExecutor(t *testing.T) {
	script := `
import json
from readie_executor import cpucheck as c
openssl = {}
for (leaf, sub, reg), bits in c.GVISOR_BITS.items():
    word, shift = {(1, 0, 3): (0, 0), (1, 0, 2): (0, 32), (7, 0, 1): (1, 0), (7, 0, 2): (1, 32)}.get((leaf, sub, reg), (None, 0))
    if word is not None:
        for bit, name in bits.items():
            if name not in c.OPENSSL_REUSED:
                openssl[name] = [word, bit + shift]
openssl["avx512ifma"] = [1, 21]
print(json.dumps({"names": sorted(c.GVISOR_NAMES), "numpy": c.NUMPY_TARGETS, "glibc": c.GLIBC_HWCAPS,
                  "openblas": c.OPENBLAS_CORES, "openssl": openssl, "preferred": c.GLIBC_AVX_PREFERRED}))
`
	cmd := testenv.Command(t, time.Minute, "/usr/bin/python3", "-c", script)
	cmd.Dir = "../../images/executor"
	out, err := cmd.Output()
	if err != nil {
		t.Fatalf("the executor's tables: %v", err)
	}
	var py struct {
		Names     []string
		Numpy     map[string][]string
		Glibc     map[string]string
		OpenBLAS  map[string][]string
		OpenSSL   map[string][2]uint
		Preferred string
	}
	if err := json.Unmarshal(out, &py); err != nil {
		t.Fatal(err)
	}
	if !slices.Equal(py.Names, cpu.Names()) {
		t.Errorf("the executor's CPUID names differ from gVisor's: %v / %v", cpu.Missing(py.Names, cpu.Names()), cpu.Missing(cpu.Names(), py.Names))
	}
	if len(py.Numpy) != len(numpyTargets) {
		t.Errorf("numpy targets: the executor has %d, the controls %d", len(py.Numpy), len(numpyTargets))
	}
	for _, target := range numpyTargets {
		if !slices.Equal(py.Numpy[target.name], target.needs) {
			t.Errorf("numpy %s: the executor says %v, the controls %v", target.name, py.Numpy[target.name], target.needs)
		}
	}
	if len(py.Glibc) != len(glibcHWCaps) || py.Preferred != glibcAVXPreferred {
		t.Errorf("glibc: %v / %v", py.Glibc, glibcHWCaps)
	}
	for k, v := range glibcHWCaps {
		if py.Glibc[k] != v {
			t.Errorf("glibc %s: %q / %q", k, py.Glibc[k], v)
		}
	}
	for _, core := range openBLASCores {
		if needs, ok := py.OpenBLAS[strings.ToLower(core.name)]; !ok || !slices.Equal(cpu.Normalize(needs), cpu.Normalize(core.needs)) {
			t.Errorf("OpenBLAS %s: the executor says %v, the controls %v", core.name, needs, core.needs)
		}
	}
	if len(py.OpenSSL) != len(openSSLBits) {
		t.Errorf("OpenSSL bits: the executor places %d names, the controls %d", len(py.OpenSSL), len(openSSLBits))
	}
	for name, pos := range openSSLBits {
		if py.OpenSSL[name] != pos {
			t.Errorf("OpenSSL %s: the executor reads bit %v, the controls mask %v", name, py.OpenSSL[name], pos)
		}
	}
}

func TestJudge(t *testing.T) {
	libs := &manifest.CPUCheck{Verdict: manifest.CPULibraries, Outside: map[string][]string{
		"cpuid": {"avx512bw", "avx512f"}, "cpuid_unnamed": {"avx512ifma"}}}
	unnamedOnly := &manifest.CPUCheck{Verdict: manifest.CPULibraries, Outside: map[string][]string{"cpuid_unnamed": {"avx512ifma"}}}
	violated := &manifest.CPUCheck{Verdict: manifest.CPUViolated, Outside: map[string][]string{
		"cpuid": {"avx512f"}, "numpy": {"AVX512F", "AVX512_SKX"}, "glibc": {"avx512f"}}, Checked: map[string]string{"openssl": "error: OSError: x"}}
	tests := []struct {
		name    string
		check   *manifest.CPUCheck
		enforce bool
		host    BuildHost
		want    []string // nil: accepted
	}{
		{"enforced", &manifest.CPUCheck{Verdict: manifest.CPUEnforced}, true, BuildHost{}, nil},
		{"libraries, unenforced accepted", libs, false, BuildHost{}, nil},
		{"libraries, no faulting", libs, true, BuildHost{}, []string{"cannot hide", "it sees avx512bw, avx512f and avx512ifma, which gVisor has no names for", "no CPUID faulting", "enforce: false"}},
		{"libraries, faulting", libs, true, BuildHost{CPUIDFaulting: true}, []string{"reports CPUID faulting, yet"}},
		{"libraries, unnamed bits only", unnamedOnly, true, BuildHost{CPUIDFaulting: true}, []string{"avx512ifma, which gVisor has no names for", "cannot mask them"}},
		{"violated", violated, false, BuildHost{}, []string{"numpy: AVX512F, AVX512_SKX; glibc: avx512f", "openssl: error: OSError: x"}},
		{"error", &manifest.CPUCheck{Verdict: "error", Checked: map[string]string{"error": "ZeroDivisionError"}}, false, BuildHost{}, []string{"failed: ZeroDivisionError"}},
		{"no check", nil, false, BuildHost{}, []string{"reported no CPU check"}},
		{"unknown verdict", &manifest.CPUCheck{Verdict: "maybe"}, false, BuildHost{}, []string{`"maybe"`}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			err := Judge(tt.check, tt.enforce, tt.host)
			if tt.want == nil {
				if err != nil {
					t.Fatal(err)
				}
				return
			}
			if !errors.Is(err, ErrBaseline) {
				t.Fatalf("error %v", err)
			}
			// Only CPUID's view holds for every capture on the host.
			if errors.Is(err, ErrUnenforceable) != (tt.check != nil && tt.check.Verdict == manifest.CPULibraries) {
				t.Errorf("ErrUnenforceable: %v", err)
			}
			for _, w := range tt.want {
				if !strings.Contains(err.Error(), w) {
					t.Errorf("%q does not say %q", err, w)
				}
			}
		})
	}
}

// recordedHost reads a host recorded in testdata/hosts: runsc's features, and the CPU check's
// answers in a host process before and after libcrypto was loaded.
func recordedHost(t *testing.T, name string) (features []string, checks map[bool]*manifest.CPUCheck) {
	t.Helper()
	dir := filepath.Join("..", "..", "testdata", "hosts", name)
	text, err := os.ReadFile(filepath.Join(dir, "runsc-cpu-features.txt"))
	if err != nil {
		t.Fatal(err)
	}
	checks = map[bool]*manifest.CPUCheck{}
	for libcrypto, file := range map[bool]string{false: "cpucheck.json", true: "cpucheck-with-libcrypto.json"} {
		data, err := os.ReadFile(filepath.Join(dir, file))
		if err != nil {
			t.Fatal(err)
		}
		var seen map[string]json.RawMessage
		if err := json.Unmarshal(data, &seen); err != nil {
			t.Fatal(err)
		}
		var check manifest.CPUCheck
		if err := json.Unmarshal(seen["check(runsc cpu-features as baseline)"], &check); err != nil {
			t.Fatal(err)
		}
		checks[libcrypto] = &check
	}
	return strings.Split(strings.TrimSpace(string(text)), ","), checks
}

// TestRecordedHosts: the judgement of what the check saw on each CPU this kind of machine
// comes with (the verdicts and why: images/executor/tests/test_cpucheck.py RecordedHostsTest),
// and the controls of a baseline of all their features. The bits gVisor cannot name
// (avx512ifma, avx512_bf16, avx_vnni) are on both: a library that chose them (OpenSSL's
// avx512ifma once libcrypto is loaded) is refused even with enforce: false, since a restore
// host with every named feature but not that bit would pass restore's check and then fault;
// CPUID alone showing them is refused only when enforcement is asked, saying it cannot be had.
// The controls always turn off what needs them, whatever the baseline.
func TestRecordedHosts(t *testing.T) {
	for _, tt := range []struct {
		host     string
		faulting bool
		bare     string // the verdict before libcrypto was loaded
	}{
		// The host kernel's /proc/cpuinfo lists x2apic, tsc_deadline_timer and topoext, which
		// CPUID does not show (a sandbox's cpuinfo is gVisor's).
		{"amd-epyc-no-cpuid-faulting", false, manifest.CPUViolated},
		{"intel-xeon-cpuid-faulting", true, manifest.CPULibraries},
	} {
		t.Run(tt.host, func(t *testing.T) {
			features, checks := recordedHost(t, tt.host)
			h := BuildHost{CPUIDFaulting: tt.faulting}
			withSSL := checks[true]
			for _, enforce := range []bool{true, false} {
				err := Judge(withSSL, enforce, h)
				if !errors.Is(err, ErrBaseline) || errors.Is(err, ErrUnenforceable) || !strings.Contains(err.Error(), "openssl: avx512ifma") {
					t.Errorf("libcrypto loaded, enforce %v: %v", enforce, err)
				}
			}
			if bare := checks[false]; bare.Verdict != tt.bare {
				t.Errorf("before libcrypto: verdict %s, want %s", bare.Verdict, tt.bare)
			} else if bare.Verdict == manifest.CPULibraries {
				if err := Judge(bare, false, h); err != nil {
					t.Errorf("CPUID alone, enforce false: %v", err)
				}
				err := Judge(bare, true, h)
				if !errors.Is(err, ErrUnenforceable) || !strings.Contains(err.Error(), "avx512_bf16, avx512ifma, avx_vnni, which gVisor has no names for") {
					t.Errorf("CPUID alone, enforced: %v", err)
				}
			}
			controls := Controls(features)
			if !slices.Contains(strings.Fields(controls[EnvNumpy]), "AVX512_ICL") || slices.Contains(strings.Fields(controls[EnvNumpy]), "AVX512_SKX") {
				t.Errorf("numpy's targets turned off under the host's own features: %q", controls[EnvNumpy])
			}
			// OpenSSL's word 1 is CPUID.7.0 EBX | ECX<<32: avx512ifma is EBX bit 21.
			words := strings.Split(controls[EnvOpenSSL], ":")
			if len(words) != 2 || words[1] == "" {
				t.Fatalf("OPENSSL_ia32cap %q", controls[EnvOpenSSL])
			}
			mask, err := strconv.ParseUint(strings.TrimPrefix(words[1], "~0x"), 16, 64)
			if err != nil || mask&(1<<21) == 0 {
				t.Errorf("OPENSSL_ia32cap %q does not turn off avx512ifma: %v", controls[EnvOpenSSL], err)
			}
		})
	}
}
