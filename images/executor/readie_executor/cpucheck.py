"""What code in this process can see of the CPU, against a baseline of gVisor feature names.

Run by the executor in capture mode when READIE_CPU_BASELINE is set, after the preimports and
just before the checkpoint, so it sees what the checkpoint will hold: which code paths the
loaded libraries chose. It imports nothing the process has not loaded (numpy is looked at only
when the set imported it). It reports one JSON line on stdout (REPORT_PREFIX), read by the
pipeline from the capture's stdout log:

  verdict   "enforced": nothing sees beyond the baseline, not even the CPUID instruction run
            directly (the host lets gVisor trap it: CPUID faulting);
            "libraries": numpy, glibc, OpenSSL, OpenBLAS and /proc/cpuinfo stay within it,
            but CPUID run directly shows the host's features to any other code;
            "violated": a library chose code beyond it; "error": the check itself failed.
  outside   per place looked at, the gVisor names seen beyond the baseline.
  checked   what was looked at, with its version or state.

Stdlib only (Python 3.11, x86-64 Linux).
"""

import ctypes
import json
import os
import sys

REPORT_PREFIX = "readie-executor: cpu-check "
BASELINE_ENV = "READIE_CPU_BASELINE"

# gVisor's feature names (pkg/cpuid/features_amd64.go, allFeatures), by CPUID register:
# (leaf, subleaf, register 0..3 = eax, ebx, ecx, edx) -> {bit: name}.
GVISOR_BITS = {
    (1, 0, 2): {0: "pni", 1: "pclmulqdq", 2: "dtes64", 3: "monitor", 4: "ds_cpl", 5: "vmx", 6: "smx", 7: "est",
                8: "tm2", 9: "ssse3", 10: "cid", 11: "sdbg", 12: "fma", 13: "cx16", 14: "xtpr", 15: "pdcm",
                17: "pcid", 18: "dca", 19: "sse4_1", 20: "sse4_2", 21: "x2apic", 22: "movbe", 23: "popcnt",
                24: "tsc_deadline_timer", 25: "aes", 26: "xsave", 27: "osxsave", 28: "avx", 29: "f16c",
                30: "rdrand", 31: "hypervisor"},
    (1, 0, 3): {0: "fpu", 1: "vme", 2: "de", 3: "pse", 4: "tsc", 5: "msr", 6: "pae", 7: "mce", 8: "cx8",
                9: "apic", 11: "sep", 12: "mtrr", 13: "pge", 14: "mca", 15: "cmov", 16: "pat", 17: "pse36",
                18: "pn", 19: "clflush", 21: "dts", 22: "acpi", 23: "mmx", 24: "fxsr", 25: "sse", 26: "sse2",
                27: "ss", 28: "ht", 29: "tm", 30: "ia64", 31: "pbe"},
    (7, 0, 1): {0: "fsgsbase", 1: "tsc_adjust", 3: "bmi1", 4: "hle", 5: "avx2", 6: "fdp_excptn_only", 7: "smep",
                8: "bmi2", 9: "erms", 10: "invpcid", 11: "rtm", 12: "cqm", 13: "fpcsds", 14: "mpx", 15: "rdt_a",
                16: "avx512f", 17: "avx512dq", 18: "rdseed", 19: "adx", 20: "smap", 23: "clfushopt", 24: "clwb",
                25: "ipt", 26: "avx512pf", 27: "avx512er", 28: "avx512cd", 29: "sha_ni", 30: "avx512bw",
                31: "avx512vl"},
    (7, 0, 2): {0: "prefetchwt1", 1: "avx512vbmi", 2: "umip", 3: "pku", 4: "ospke", 5: "waitpkg", 6: "avx512_vbmi2",
                7: "cet_ss", 8: "gfni", 9: "vaes", 10: "vpclmulqdq", 11: "avx512_vnni", 12: "avx512_bitalg",
                13: "tme", 14: "avx512_vpopcntdq", 16: "la57", 22: "rdpid", 25: "cldemote", 27: "movdiri",
                28: "movdir64b"},
    (7, 0, 3): {2: "avx512_4vnniw", 3: "avx512_4fmaps", 4: "fsrm", 8: "avx512_vp2intersect", 9: "srbds_ctrl",
                10: "md_clear", 11: "rtm_always_abort", 13: "tsx_force_abort", 14: "serialize", 15: "hybrid_cpu",
                16: "tsxldtrk", 18: "pconfig", 19: "arch_lbr", 20: "ibt", 22: "amx_bf16", 23: "avx512_fp16",
                24: "amx_tile", 25: "amx_int8", 26: "spec_ctrl", 27: "intel_stibp", 28: "flush_l1d",
                29: "arch_capabilities", 30: "core_capabilities", 31: "spec_ctrl_ssbd"},
    (0xD, 1, 0): {0: "xsaveopt", 1: "xsavec", 2: "xgetbv1", 3: "xsaves"},
    (0x80000001, 0, 2): {0: "lahf_lm", 1: "cmp_legacy", 2: "svm", 3: "extapic", 4: "cr8_legacy", 5: "abm",
                         6: "sse4a", 7: "misalignsse", 8: "3dnowprefetch", 9: "osvw", 10: "ibs", 11: "xop",
                         12: "skinit", 13: "wdt", 15: "lwp", 16: "fma4", 17: "tce", 21: "tbm", 22: "topoext",
                         23: "perfctr_core", 24: "perfctr_nb", 26: "bpext", 27: "ptsc", 28: "perfctr_llc",
                         29: "mwaitx", 30: "ad_mask_extn"},
    (0x80000001, 0, 3): {11: "syscall", 20: "nx", 22: "mmxext", 25: "fxsr_opt", 26: "pdpe1gb", 27: "rdtscp",
                         29: "lm", 30: "3dnowext", 31: "3dnow"},
}

# Bits code dispatches on that gVisor has no name for: no baseline can name, mask or check
# them, and the sandbox's /proc/cpuinfo never lists them. Linux's names.
UNNAMED_BITS = {
    (7, 0, 1): {21: "avx512ifma"},
    (7, 1, 0): {4: "avx_vnni", 5: "avx512_bf16"},
}

GVISOR_NAMES = frozenset(n for bits in GVISOR_BITS.values() for n in bits.values())

# numpy's dispatch targets (every version's) -> the features their code uses, in gVisor names
# (avx512ifma has none: a target that needs it is beyond every baseline).
NUMPY_TARGETS = {
    "SSSE3": ["ssse3"], "SSE41": ["sse4_1"], "POPCNT": ["popcnt"], "SSE42": ["sse4_2"], "AVX": ["avx"],
    "F16C": ["f16c"], "XOP": ["xop"], "FMA4": ["fma4"], "FMA3": ["fma"], "AVX2": ["avx2"],
    "AVX512F": ["avx512f"], "AVX512CD": ["avx512cd"],
    "AVX512_KNL": ["avx512f", "avx512cd", "avx512er", "avx512pf"],
    "AVX512_KNM": ["avx512f", "avx512cd", "avx512er", "avx512pf", "avx512_4fmaps", "avx512_4vnniw",
                   "avx512_vpopcntdq"],
    "AVX512_SKX": ["avx512f", "avx512cd", "avx512vl", "avx512bw", "avx512dq"],
    "AVX512_CLX": ["avx512f", "avx512cd", "avx512vl", "avx512bw", "avx512dq", "avx512_vnni"],
    "AVX512_CNL": ["avx512f", "avx512cd", "avx512vl", "avx512bw", "avx512dq", "avx512ifma", "avx512vbmi"],
    "AVX512_ICL": ["avx512f", "avx512cd", "avx512vl", "avx512bw", "avx512dq", "avx512_vnni", "avx512ifma",
                   "avx512vbmi", "avx512_vbmi2", "avx512_bitalg", "avx512_vpopcntdq"],
    "AVX512_SPR": ["avx512f", "avx512cd", "avx512vl", "avx512bw", "avx512dq", "avx512_vnni", "avx512ifma",
                   "avx512vbmi", "avx512_vbmi2", "avx512_bitalg", "avx512_vpopcntdq", "avx512_fp16"],
}

# The features glibc's GLIBC_TUNABLES=glibc.cpu.hwcaps=-NAME can turn off (2.33..2.36,
# sysdeps/x86/cpu-tunables.c): gVisor name -> glibc name. Its string and memory routines need
# one of these to pick AVX-512 code, so other AVX-512 bits it still reports do not dispatch.
GLIBC_HWCAPS = {
    "avx": "AVX", "cx8": "CX8", "fma": "FMA", "rtm": "RTM", "avx2": "AVX2", "bmi1": "BMI1", "bmi2": "BMI2",
    "cmov": "CMOV", "erms": "ERMS", "fma4": "FMA4", "sse2": "SSE2", "abm": "LZCNT", "movbe": "MOVBE",
    "ssse3": "SSSE3", "xsave": "XSAVE", "popcnt": "POPCNT", "sse4_1": "SSE4_1", "sse4_2": "SSE4_2",
    "xsavec": "XSAVEC", "osxsave": "OSXSAVE", "avx512f": "AVX512F", "avx512cd": "AVX512CD",
    "avx512bw": "AVX512BW", "avx512dq": "AVX512DQ", "avx512er": "AVX512ER", "avx512pf": "AVX512PF",
    "avx512vl": "AVX512VL",
}
# memmove/memcpy pick their AVX variant from this "preferred" bit, which -AVX leaves set.
GLIBC_AVX_PREFERRED = "AVX_Fast_Unaligned_Load"

# OpenBLAS DYNAMIC_ARCH cores (openblas_get_corename, lower case) -> the features their kernels use.
OPENBLAS_CORES = {
    "skylakex": ["avx512f", "avx512cd", "avx512bw", "avx512dq", "avx512vl", "avx2", "fma", "avx"],
    "cooperlake": ["avx512f", "avx512cd", "avx512bw", "avx512dq", "avx512vl", "avx512_bf16", "avx2", "fma", "avx"],
    "sapphirerapids": ["avx512f", "avx512cd", "avx512bw", "avx512dq", "avx512vl", "avx512_bf16", "avx512_fp16",
                       "amx_tile", "amx_bf16", "amx_int8"],
    "haswell": ["avx2", "fma", "avx"], "zen": ["avx2", "fma", "avx"], "excavator": ["avx2", "fma", "avx"],
    "sandybridge": ["avx"], "nehalem": ["sse4_2", "popcnt", "ssse3"], "penryn": ["sse4_1"],
    "dunnington": ["sse4_1"], "core2": ["ssse3"], "atom": ["ssse3"], "prescott": ["pni"],
    "opteron_sse3": ["pni"], "opteron": ["sse2"],
}

# OpenSSL's capability vector (OpenSSL_version(OPENSSL_CPU_INFO)): word 0 is CPUID.1 EDX | ECX<<32,
# word 1 CPUID.7.0 EBX | ECX<<32, after OPENSSL_ia32cap is applied. OpenSSL reuses these word-0
# bits for flags of its own, so they say nothing about the CPU.
OPENSSL_REUSED = frozenset({"ht", "ia64", "sdbg", "pn", "dts"})

# cpuid(leaf, subleaf, uint32_t out[4]) for the SysV x86-64 ABI (edi, esi, rdx):
#   push rbx; mov r8,rdx; mov eax,edi; mov ecx,esi; cpuid;
#   mov [r8],eax; mov [r8+4],ebx; mov [r8+8],ecx; mov [r8+12],edx; pop rbx; ret
CPUID_CODE = bytes.fromhex("53" "4989d0" "89f8" "89f1" "0fa2" "418900" "41895804" "41894808" "4189500c" "5b" "c3")
PAGE = 4096


def parse_baseline(value):
    """READIE_CPU_BASELINE: gVisor names separated by commas."""
    return frozenset(n.strip() for n in value.split(",") if n.strip())


def decode(regs, table):
    """The names of table whose bits are set in regs ({(leaf, subleaf): (eax, ebx, ecx, edx)})."""
    names = set()
    for (leaf, sub, reg), bits in table.items():
        words = regs.get((leaf, sub))
        if words is not None:
            names.update(name for bit, name in bits.items() if words[reg] >> bit & 1)
    return names


def cpuid_features(regs):
    """gVisor's names for the features regs show, the bits it has no name for, and the cache line."""
    names = decode(regs, GVISOR_BITS)
    if "xsave" not in names:  # gVisor reports leaf 0xD.1 features only with XSAVE
        names -= set(GVISOR_BITS[(0xD, 1, 0)].values())
    cache_line = 8 * (regs[(1, 0)][1] >> 8 & 0xFF)  # CPUID.1:EBX[15:8], in 8-byte units
    return sorted(names), sorted(decode(regs, UNNAMED_BITS)), cache_line


def read_cpuid():
    """CPUID run directly: a page of machine code, written, then made read+execute (W^X), then
    unmapped, so the checkpoint holds no executable page of ours. Returns the registers of the
    leaves that name features."""
    libc = ctypes.CDLL(None, use_errno=True)
    libc.mmap.restype = ctypes.c_void_p
    libc.mmap.argtypes = [ctypes.c_void_p, ctypes.c_size_t, ctypes.c_int, ctypes.c_int, ctypes.c_int, ctypes.c_long]
    libc.mprotect.argtypes = [ctypes.c_void_p, ctypes.c_size_t, ctypes.c_int]
    libc.munmap.argtypes = [ctypes.c_void_p, ctypes.c_size_t]
    prot_read, prot_write, prot_exec, map_private, map_anonymous = 1, 2, 4, 0x02, 0x20
    page = libc.mmap(None, PAGE, prot_read | prot_write, map_private | map_anonymous, -1, 0)
    if page in (None, ctypes.c_void_p(-1).value):
        raise OSError(ctypes.get_errno(), "mmap of a code page failed")
    try:
        ctypes.memmove(page, CPUID_CODE, len(CPUID_CODE))
        if libc.mprotect(page, PAGE, prot_read | prot_exec) != 0:
            raise OSError(ctypes.get_errno(), "mprotect(PROT_READ|PROT_EXEC) of the code page failed")
        fn = ctypes.CFUNCTYPE(None, ctypes.c_uint32, ctypes.c_uint32, ctypes.POINTER(ctypes.c_uint32 * 4))(page)

        def cpuid(leaf, sub=0):
            out = (ctypes.c_uint32 * 4)()
            fn(leaf, sub, ctypes.byref(out))
            return tuple(out)

        regs = {(1, 0): cpuid(1)}
        max_leaf, max_ext = cpuid(0)[0], cpuid(0x80000000)[0]
        if max_leaf >= 7:
            regs[(7, 0)] = cpuid(7, 0)
            if regs[(7, 0)][0] >= 1:
                regs[(7, 1)] = cpuid(7, 1)
        if max_leaf >= 0xD:
            regs[(0xD, 1)] = cpuid(0xD, 1)
        if max_ext >= 0x80000001:
            regs[(0x80000001, 0)] = cpuid(0x80000001)
        return regs
    finally:
        libc.munmap(page, PAGE)


def cpuinfo_flags(path="/proc/cpuinfo"):
    with open(path) as f:
        for row in f:
            key, _, value = row.partition(":")
            if key.strip() == "flags":
                return set(value.split())
    return set()


def numpy_targets():
    """numpy's dispatch targets this process uses (only if it imported numpy), and its version."""
    numpy = sys.modules.get("numpy")
    if numpy is None:
        return None, None
    for name in ("numpy._core._multiarray_umath", "numpy.core._multiarray_umath"):
        umath = sys.modules.get(name)
        if umath is not None:
            on = umath.__cpu_features__
            return [t for t in umath.__cpu_dispatch__ if on.get(t)], numpy.__version__
    raise RuntimeError("numpy is loaded but its _multiarray_umath is not")


class _Leaf(ctypes.Structure):
    _fields_ = [("cpuid", ctypes.c_uint32 * 4), ("active", ctypes.c_uint32 * 4)]


# glibc's CPUID_INDEX_* (bits/platform/x86.h) -> (leaf, subleaf).
GLIBC_INDEX = {0: (1, 0), 1: (7, 0), 2: (0x80000001, 0), 3: (0xD, 1), 6: (7, 1)}


def glibc_active():
    """The features glibc's IFUNC resolvers used in this process (after GLIBC_TUNABLES), from
    __x86_get_cpuid_feature_leaf (libc.so.6, glibc >= 2.33), and glibc's version; None without
    glibc."""
    libc = ctypes.CDLL(None)
    if not hasattr(libc, "gnu_get_libc_version"):
        return None, None
    libc.gnu_get_libc_version.restype = ctypes.c_char_p
    get = libc.__x86_get_cpuid_feature_leaf
    get.restype = ctypes.POINTER(_Leaf)
    get.argtypes = [ctypes.c_uint]
    active = {leaf: tuple(get(index).contents.active) for index, leaf in GLIBC_INDEX.items()}
    return decode(active, GVISOR_BITS) | decode(active, UNNAMED_BITS), libc.gnu_get_libc_version().decode()


def glibc_preferred():
    """glibc's "preferred" bits that are set (ld.so --list-diagnostics, glibc >= 2.33)."""
    import subprocess
    out = subprocess.run(["/lib64/ld-linux-x86-64.so.2", "--list-diagnostics"], capture_output=True,
                         text=True, timeout=30, check=True).stdout
    prefix = "x86.cpu_features.preferred."
    return {line[len(prefix):].split("=")[0] for line in out.splitlines()
            if line.startswith(prefix) and not line.endswith("=0x0")}


def loaded_libraries(part):
    with open("/proc/self/maps") as f:
        return sorted({row.split()[-1] for row in f if part in os.path.basename(row.split()[-1]).lower()})


def openblas_core():
    """The core of a libopenblas this process loaded (wheels rename the symbols), or None."""
    for path in loaded_libraries("openblas"):
        lib = ctypes.CDLL(path)
        for prefix, suffix in (("", ""), ("", "64_"), ("scipy_", "64_"), ("scipy_", "")):
            fn = getattr(lib, f"{prefix}openblas_get_corename{suffix}", None)
            if fn is not None:
                fn.restype = ctypes.c_char_p
                return fn().decode()
        raise RuntimeError(f"{path} has no openblas_get_corename")
    return None


def openssl_features():
    """The features libcrypto uses (OPENSSL_CPU_INFO, OpenSSL >= 3.0), if loaded, and its version."""
    paths = loaded_libraries("libcrypto.so")
    if not paths:
        return None, None
    lib = ctypes.CDLL(paths[0])
    lib.OpenSSL_version.restype = ctypes.c_char_p
    lib.OpenSSL_version.argtypes = [ctypes.c_int]
    info = lib.OpenSSL_version(9).decode()  # "OPENSSL_ia32cap=0x...:0x... env:..."
    w0, w1 = (int(w, 16) for w in info.split("OPENSSL_ia32cap=", 1)[1].split()[0].split(":")[:2])
    regs = {(1, 0): (0, 0, w0 >> 32, w0 & 0xFFFFFFFF), (7, 0): (0, w1 & 0xFFFFFFFF, w1 >> 32, 0)}
    features = (decode(regs, GVISOR_BITS) | decode(regs, UNNAMED_BITS)) - OPENSSL_REUSED
    return features, lib.OpenSSL_version(0).decode()


def check(baseline, places=None):
    """Every place this process's code learns the CPU from, against baseline (gVisor names):
    {"verdict", "outside", "checked"} (module docstring). places stands in for this process:
    an object with this module's readers (read_cpuid, cpuinfo_flags, numpy_targets,
    glibc_active, glibc_preferred, openblas_core, openssl_features), such as a host recorded
    by tests/record_host.py; by default this module's own, which read the live process."""
    if places is None:
        places = sys.modules[__name__]
    outside, checked = {}, {}
    libraries = []  # the places whose choice stays in the checkpoint

    def look(name, fn, library=True):
        try:
            seen = fn()
        except Exception as e:  # a place that cannot be looked at is not within the baseline
            checked[name] = f"error: {type(e).__name__}: {e}"
            seen = ["(not checked)"]
        if seen is None:
            return
        if library:
            libraries.append(name)
        if seen:
            outside[name] = sorted(seen)

    def cpuid():
        features, unnamed, cache_line = cpuid_features(places.read_cpuid())
        checked["cpuid"] = f"CPUID run directly; cache line {cache_line}"
        # Bits gVisor cannot name are unusable without avx512f (software checks it first), so
        # they count only next to it.
        if "avx512f" in features:
            look("cpuid_unnamed", lambda: unnamed, library=False)
        return set(features) - baseline

    def cpuinfo():
        checked["cpuinfo"] = "/proc/cpuinfo flags"
        # Only names gVisor knows (the sandbox's cpuinfo lists no others; the bits it cannot
        # name are counted under cpuid_unnamed): a host's also lists Linux-only flags.
        return (places.cpuinfo_flags() & GVISOR_NAMES) - baseline

    def numpy():
        targets, version = places.numpy_targets()
        if targets is None:
            return None
        checked["numpy"] = version
        return {t for t in targets if not set(NUMPY_TARGETS.get(t, [t])) <= baseline}

    def glibc():
        active, version = places.glibc_active()
        if active is None:
            return None
        checked["glibc"] = version
        beyond = active - baseline
        if beyond - set(GLIBC_HWCAPS):
            outside["glibc_active_not_dispatching"] = sorted(beyond - set(GLIBC_HWCAPS))
        seen = beyond & set(GLIBC_HWCAPS)
        if "avx" not in baseline and GLIBC_AVX_PREFERRED in places.glibc_preferred():
            seen.add(GLIBC_AVX_PREFERRED)
        return seen

    def openblas():
        core = places.openblas_core()
        if core is None:
            return None
        checked["openblas"] = core
        needs = OPENBLAS_CORES.get(core.lower())
        return {f"unknown core {core}"} if needs is None else set(needs) - baseline

    def openssl():
        features, version = places.openssl_features()
        if features is None:
            return None
        checked["openssl"] = version
        return features - baseline

    look("cpuid", cpuid, library=False)
    look("cpuinfo", cpuinfo)
    for name, fn in (("numpy", numpy), ("glibc", glibc), ("openblas", openblas), ("openssl", openssl)):
        look(name, fn)
    libraries_ok = not any(outside.get(name) for name in libraries)
    cpuid_ok = not outside.get("cpuid") and not outside.get("cpuid_unnamed")
    verdict = "violated" if not libraries_ok else "enforced" if cpuid_ok else "libraries"
    return {"verdict": verdict, "outside": outside, "checked": checked}


def report(baseline):
    """The line the executor prints: REPORT_PREFIX and check's result as one JSON object."""
    try:
        result = check(baseline)
    except Exception as e:  # never let the check stop a capture without saying why
        result = {"verdict": "error", "outside": {}, "checked": {"error": f"{type(e).__name__}: {e}"}}
    return REPORT_PREFIX + json.dumps(result, sort_keys=True, separators=(",", ":"))
