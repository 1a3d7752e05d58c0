// Package cpu holds what restore checks of a host's CPU, in gVisor's words: the feature names
// `runsc cpu-features` prints (and the annotation dev.gvisor.internal.cpufeatures takes), the
// file format that carries them from one host to another, set operations on them, and reading
// them from this host.
package cpu

import "slices"

// names are gVisor's amd64 feature names (pkg/cpuid/features_amd64.go, allFeatures, of the
// pinned gVisor), block by block. runsc refuses an annotation with any other name, and says
// why only in its boot log, so names are checked here first. gVisor has no name for some bits
// that code does dispatch on (avx512ifma, avx512_bf16): no baseline can name, mask or check them.
var names = []string{
	// Block 0: CPUID.1:ECX.
	"pni", "pclmulqdq", "dtes64", "monitor", "ds_cpl", "vmx", "smx", "est", "tm2", "ssse3", "cid",
	"sdbg", "fma", "cx16", "xtpr", "pdcm", "pcid", "dca", "sse4_1", "sse4_2", "x2apic", "movbe",
	"popcnt", "tsc_deadline_timer", "aes", "xsave", "avx", "f16c", "rdrand", "hypervisor", "osxsave",
	// Block 1: CPUID.1:EDX.
	"fpu", "vme", "de", "pse", "tsc", "msr", "pae", "mce", "cx8", "apic", "sep", "mtrr", "pge", "mca",
	"cmov", "pat", "pse36", "pn", "clflush", "dts", "acpi", "mmx", "fxsr", "sse", "sse2", "ss", "ht",
	"tm", "ia64", "pbe",
	// Block 2: CPUID.7.0:EBX.
	"fsgsbase", "tsc_adjust", "bmi1", "hle", "avx2", "smep", "bmi2", "erms", "invpcid", "rtm", "cqm",
	"mpx", "rdt_a", "avx512f", "avx512dq", "rdseed", "adx", "smap", "clwb", "avx512pf", "avx512er",
	"avx512cd", "sha_ni", "avx512bw", "avx512vl", "fdp_excptn_only", "fpcsds", "ipt", "clfushopt",
	// Block 3: CPUID.7.0:ECX.
	"avx512vbmi", "umip", "pku", "ospke", "waitpkg", "avx512_vbmi2", "gfni", "cet_ss", "vaes",
	"vpclmulqdq", "avx512_vnni", "avx512_bitalg", "tme", "avx512_vpopcntdq", "la57", "rdpid",
	"cldemote", "movdiri", "movdir64b", "prefetchwt1",
	// Block 4: CPUID.0xD.1:EAX.
	"xsaveopt", "xsavec", "xgetbv1", "xsaves",
	// Block 5: CPUID.0x80000001:ECX.
	"lahf_lm", "cmp_legacy", "svm", "extapic", "cr8_legacy", "abm", "sse4a", "misalignsse",
	"3dnowprefetch", "osvw", "ibs", "xop", "skinit", "wdt", "lwp", "fma4", "tce", "tbm", "topoext",
	"perfctr_core", "perfctr_nb", "bpext", "ptsc", "perfctr_llc", "mwaitx", "ad_mask_extn",
	// Block 6: CPUID.0x80000001:EDX.
	"syscall", "nx", "mmxext", "fxsr_opt", "pdpe1gb", "rdtscp", "lm", "3dnowext", "3dnow",
	// Block 7: CPUID.7.0:EDX.
	"avx512_4vnniw", "avx512_4fmaps", "fsrm", "avx512_vp2intersect", "srbds_ctrl", "md_clear",
	"rtm_always_abort", "tsx_force_abort", "serialize", "hybrid_cpu", "tsxldtrk", "pconfig",
	"arch_lbr", "ibt", "amx_bf16", "avx512_fp16", "amx_tile", "amx_int8", "spec_ctrl", "intel_stibp",
	"flush_l1d", "arch_capabilities", "core_capabilities", "spec_ctrl_ssbd",
}

// Names returns every feature name gVisor knows, sorted; a fresh slice every call.
func Names() []string { return slices.Sorted(slices.Values(names)) }

// Known reports whether gVisor knows the feature name (case-sensitive, as runsc is).
func Known(name string) bool { return slices.Contains(names, name) }

// Unknown returns the names gVisor does not know, sorted and without repeats.
func Unknown(features []string) []string {
	var bad []string
	for _, f := range features {
		if !Known(f) {
			bad = append(bad, f)
		}
	}
	return Normalize(bad)
}

// Normalize returns features sorted and without repeats: the one order the manifest, the cache
// key and every comparison use (runsc prints them in its block order).
func Normalize(features []string) []string {
	out := slices.Sorted(slices.Values(features))
	return slices.Compact(out)
}

// Missing returns the features of need that have lacks, sorted: a checkpoint restores on a
// host only when none is missing.
func Missing(need, have []string) []string {
	var missing []string
	for _, f := range need {
		if !slices.Contains(have, f) {
			missing = append(missing, f)
		}
	}
	return Normalize(missing)
}

// Intersect returns the features every one of sets has, sorted; nil for no sets.
func Intersect(sets ...[]string) []string {
	if len(sets) == 0 {
		return nil
	}
	out := Normalize(sets[0])
	for _, s := range sets[1:] {
		out = slices.DeleteFunc(out, func(f string) bool { return !slices.Contains(s, f) })
	}
	return out
}
