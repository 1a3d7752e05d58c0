// Package cpubaseline keeps captures within a CPU baseline: the library controls that ask
// numpy, glibc, OpenSSL and OpenBLAS to use no feature outside it (they read the environment
// when they load, and their choice is saved with the checkpoint), and the judgement of what the
// executor saw from inside the sandbox (readie_executor/cpucheck.py) before the checkpoint.
//
// The gVisor annotation that gives a sandbox the baseline reaches /proc/cpuinfo and, on a host
// with CPUID faulting, the CPUID instruction. Without CPUID faulting, code that runs CPUID
// itself sees the host's features: only the controls keep the known libraries within.
package cpubaseline

import (
	"fmt"
	"maps"
	"slices"
	"strings"
)

// The environment variables of the controls.
const (
	EnvNumpy    = "NPY_DISABLE_CPU_FEATURES"
	EnvGlibc    = "GLIBC_TUNABLES"
	EnvOpenSSL  = "OPENSSL_ia32cap"
	EnvOpenBLAS = "OPENBLAS_CORETYPE"
)

// ControlNames returns the variables Controls may set.
func ControlNames() []string { return []string{EnvGlibc, EnvNumpy, EnvOpenBLAS, EnvOpenSSL} }

// numpyTargets are numpy's dispatch targets of every version, in its order, with the gVisor
// features their code uses ("avx512ifma" has no gVisor name, so a target that needs it is
// outside every baseline). The executor's check holds the same table (NUMPY_TARGETS).
var numpyTargets = []struct {
	name  string
	needs []string
}{
	{"SSSE3", []string{"ssse3"}}, {"SSE41", []string{"sse4_1"}}, {"POPCNT", []string{"popcnt"}},
	{"SSE42", []string{"sse4_2"}}, {"AVX", []string{"avx"}}, {"F16C", []string{"f16c"}},
	{"XOP", []string{"xop"}}, {"FMA4", []string{"fma4"}}, {"FMA3", []string{"fma"}}, {"AVX2", []string{"avx2"}},
	{"AVX512F", []string{"avx512f"}}, {"AVX512CD", []string{"avx512cd"}},
	{"AVX512_KNL", []string{"avx512f", "avx512cd", "avx512er", "avx512pf"}},
	{"AVX512_KNM", []string{"avx512f", "avx512cd", "avx512er", "avx512pf", "avx512_4fmaps", "avx512_4vnniw", "avx512_vpopcntdq"}},
	{"AVX512_SKX", []string{"avx512f", "avx512cd", "avx512vl", "avx512bw", "avx512dq"}},
	{"AVX512_CLX", []string{"avx512f", "avx512cd", "avx512vl", "avx512bw", "avx512dq", "avx512_vnni"}},
	{"AVX512_CNL", []string{"avx512f", "avx512cd", "avx512vl", "avx512bw", "avx512dq", "avx512ifma", "avx512vbmi"}},
	{"AVX512_ICL", []string{"avx512f", "avx512cd", "avx512vl", "avx512bw", "avx512dq", "avx512_vnni", "avx512ifma", "avx512vbmi", "avx512_vbmi2", "avx512_bitalg", "avx512_vpopcntdq"}},
	{"AVX512_SPR", []string{"avx512f", "avx512cd", "avx512vl", "avx512bw", "avx512dq", "avx512_vnni", "avx512ifma", "avx512vbmi", "avx512_vbmi2", "avx512_bitalg", "avx512_vpopcntdq", "avx512_fp16"}},
}

// glibcHWCaps are the features glibc's glibc.cpu.hwcaps tunable can turn off (glibc
// 2.33-2.36, sysdeps/x86/cpu-tunables.c), by gVisor name. (GLIBC_HWCAPS in the executor.)
var glibcHWCaps = map[string]string{
	"avx": "AVX", "cx8": "CX8", "fma": "FMA", "rtm": "RTM", "avx2": "AVX2", "bmi1": "BMI1", "bmi2": "BMI2",
	"cmov": "CMOV", "erms": "ERMS", "fma4": "FMA4", "sse2": "SSE2", "abm": "LZCNT", "movbe": "MOVBE",
	"ssse3": "SSSE3", "xsave": "XSAVE", "popcnt": "POPCNT", "sse4_1": "SSE4_1", "sse4_2": "SSE4_2",
	"xsavec": "XSAVEC", "osxsave": "OSXSAVE", "avx512f": "AVX512F", "avx512cd": "AVX512CD",
	"avx512bw": "AVX512BW", "avx512dq": "AVX512DQ", "avx512er": "AVX512ER", "avx512pf": "AVX512PF",
	"avx512vl": "AVX512VL",
}

// glibcAVXPreferred: memmove and memcpy pick their AVX variant from this "preferred" bit, which
// turning off AVX leaves set.
const glibcAVXPreferred = "AVX_Fast_Unaligned_Load"

// openBLASCores are OpenBLAS's DYNAMIC_ARCH cores, best first, with the features their kernels
// use: the first within the baseline is forced (OPENBLAS_CORETYPE).
var openBLASCores = []struct {
	name  string
	needs []string
}{
	{"SkylakeX", []string{"avx512f", "avx512cd", "avx512bw", "avx512dq", "avx512vl", "avx2", "fma", "avx"}},
	{"Haswell", []string{"avx2", "fma", "avx"}},
	{"Sandybridge", []string{"avx"}},
	{"Nehalem", []string{"sse4_2", "popcnt", "ssse3"}},
	{"Core2", []string{"ssse3"}},
	{"Prescott", []string{"pni"}},
}

// openSSLBits place gVisor's names in OpenSSL's capability vector: word 0 is CPUID.1
// EDX | ECX<<32, word 1 CPUID.7.0 EBX | ECX<<32. OpenSSL reuses word 0's ht, ia64, sdbg, pn and
// dts bits for flags of its own, so they are not masked. avx512ifma has no gVisor name.
var openSSLBits = func() map[string][2]uint {
	bits := map[string][2]uint{"avx512ifma": {1, 21}}
	for word, block := range []map[uint]string{
		{0: "fpu", 1: "vme", 2: "de", 3: "pse", 4: "tsc", 5: "msr", 6: "pae", 7: "mce", 8: "cx8", 9: "apic",
			11: "sep", 12: "mtrr", 13: "pge", 14: "mca", 15: "cmov", 16: "pat", 17: "pse36", 19: "clflush",
			22: "acpi", 23: "mmx", 24: "fxsr", 25: "sse", 26: "sse2", 27: "ss", 29: "tm", 31: "pbe",
			32: "pni", 33: "pclmulqdq", 34: "dtes64", 35: "monitor", 36: "ds_cpl", 37: "vmx", 38: "smx",
			39: "est", 40: "tm2", 41: "ssse3", 42: "cid", 44: "fma", 45: "cx16", 46: "xtpr", 47: "pdcm",
			49: "pcid", 50: "dca", 51: "sse4_1", 52: "sse4_2", 53: "x2apic", 54: "movbe", 55: "popcnt",
			56: "tsc_deadline_timer", 57: "aes", 58: "xsave", 59: "osxsave", 60: "avx", 61: "f16c",
			62: "rdrand", 63: "hypervisor"},
		{0: "fsgsbase", 1: "tsc_adjust", 3: "bmi1", 4: "hle", 5: "avx2", 6: "fdp_excptn_only", 7: "smep",
			8: "bmi2", 9: "erms", 10: "invpcid", 11: "rtm", 12: "cqm", 13: "fpcsds", 14: "mpx", 15: "rdt_a",
			16: "avx512f", 17: "avx512dq", 18: "rdseed", 19: "adx", 20: "smap", 23: "clfushopt", 24: "clwb",
			25: "ipt", 26: "avx512pf", 27: "avx512er", 28: "avx512cd", 29: "sha_ni", 30: "avx512bw",
			31: "avx512vl", 32: "prefetchwt1", 33: "avx512vbmi", 34: "umip", 35: "pku", 36: "ospke",
			37: "waitpkg", 38: "avx512_vbmi2", 39: "cet_ss", 40: "gfni", 41: "vaes", 42: "vpclmulqdq",
			43: "avx512_vnni", 44: "avx512_bitalg", 45: "tme", 46: "avx512_vpopcntdq", 48: "la57",
			54: "rdpid", 57: "cldemote", 59: "movdiri", 60: "movdir64b"},
	} {
		for bit, name := range block {
			bits[name] = [2]uint{uint(word), bit}
		}
	}
	return bits
}()

// Controls returns the environment variables that ask numpy, glibc, OpenSSL and OpenBLAS to
// use no feature outside baseline (gVisor names). They depend on the baseline alone, never on
// the build host, so build hosts of different CPU types with one baseline capture alike:
//   - NPY_DISABLE_CPU_FEATURES: every numpy dispatch target (of any numpy version) whose code
//     needs a feature outside the baseline; a numpy that lacks some target warns, and the
//     executor silences that warning;
//   - GLIBC_TUNABLES=glibc.cpu.hwcaps=-...: every feature glibc can turn off that is outside
//     it (and the preferred bit that picks memmove's AVX variant, when AVX is outside);
//   - OPENSSL_ia32cap=~WORD0:~WORD1: OpenSSL's bits of the features outside it;
//   - OPENBLAS_CORETYPE: the best OpenBLAS core within it.
//
// nil for a nil baseline.
func Controls(baseline []string) map[string]string {
	if baseline == nil {
		return nil
	}
	in := func(needs []string) bool {
		for _, f := range needs {
			if !slices.Contains(baseline, f) {
				return false
			}
		}
		return true
	}
	env := map[string]string{}
	var npy []string
	for _, t := range numpyTargets {
		if !in(t.needs) {
			npy = append(npy, t.name)
		}
	}
	if len(npy) > 0 {
		env[EnvNumpy] = strings.Join(npy, " ")
	}
	var off []string
	for _, f := range slices.Sorted(maps.Keys(glibcHWCaps)) {
		if !slices.Contains(baseline, f) {
			off = append(off, "-"+glibcHWCaps[f])
		}
	}
	if !slices.Contains(baseline, "avx") {
		off = append(off, "-"+glibcAVXPreferred)
	}
	if len(off) > 0 {
		env[EnvGlibc] = "glibc.cpu.hwcaps=" + strings.Join(off, ",")
	}
	for _, core := range openBLASCores {
		if in(core.needs) {
			env[EnvOpenBLAS] = core.name
			break
		}
	}
	var mask [2]uint64
	for name, pos := range openSSLBits {
		if !slices.Contains(baseline, name) {
			mask[pos[0]] |= 1 << pos[1]
		}
	}
	if mask != [2]uint64{} {
		words := make([]string, 2)
		for i, m := range mask {
			if m != 0 {
				words[i] = fmt.Sprintf("~0x%016x", m)
			}
		}
		env[EnvOpenSSL] = strings.Join(words, ":")
	}
	return env
}

// Env returns controls as KEY=VALUE entries, sorted by name.
func Env(controls map[string]string) []string {
	var env []string
	for _, k := range slices.Sorted(maps.Keys(controls)) {
		env = append(env, k+"="+controls[k])
	}
	return env
}
