"""The CPU check of capture mode (readie_executor.cpucheck), on the host: the decoding of CPUID
words, the machine-code path against runsc's own view, the verdicts, and the executor's report
line. The same check inside real sandboxes is tested by the Go suite (cmd/pipeline cpu_test.go)."""

import json
import os
import subprocess
import sys
import tempfile
import types
import unittest
import warnings

from readie_executor import checkpoint, cpucheck, cpucount, packages, server
from tests import hostdata
from tests.test_executor import run_executor

# This machine's CPUID words (AMD EPYC, family 0x19 model 0x11), as the sandbox read them.
EPYC_REGS = {
    (1, 0): (0x00A10F11, 0x01020800, 0xFFFA3203, 0x178BFBFF),
    (7, 0): (0x00000001, 0xF1BF07AB, 0x00405FC6, 0x00000010),
    (7, 1): (0x00000020, 0x00000000, 0x00000000, 0x00000000),
    (0xD, 1): (0x0000000F, 0x000009A8, 0x00001800, 0x00000000),
    (0x80000001, 0): (0x00A10F11, 0x40000000, 0x004003F3, 0x2FD3FBFF),
}
# What `runsc cpu-features` printed on it: the decoding must name exactly these.
EPYC_RUNSC = (
    "fpu,vme,de,pse,tsc,msr,pae,mce,cx8,apic,sep,mtrr,pge,mca,cmov,pat,pse36,clflush,mmx,fxsr,sse,sse2,ht,"
    "syscall,nx,mmxext,fxsr_opt,pdpe1gb,rdtscp,lm,pni,pclmulqdq,ssse3,fma,cx16,pcid,sse4_1,sse4_2,x2apic,"
    "movbe,popcnt,tsc_deadline_timer,aes,xsave,osxsave,avx,f16c,rdrand,hypervisor,lahf_lm,cmp_legacy,"
    "cr8_legacy,abm,sse4a,misalignsse,3dnowprefetch,osvw,topoext,fsgsbase,tsc_adjust,bmi1,avx2,smep,bmi2,"
    "erms,invpcid,avx512f,avx512dq,rdseed,adx,smap,clfushopt,clwb,avx512cd,sha_ni,avx512bw,avx512vl,"
    "xsaveopt,xsavec,xgetbv1,xsaves,avx512vbmi,umip,avx512_vbmi2,cet_ss,gfni,vaes,vpclmulqdq,avx512_vnni,"
    "avx512_bitalg,avx512_vpopcntdq,rdpid,fsrm").split(",")


def runsc_features():
    runsc = os.environ.get("READIE_RUNSC")
    if not runsc or not os.path.exists(runsc):
        raise AssertionError(f"READIE_RUNSC={runsc!r} is not a runsc binary: run `make test` (it runs `make runsc`)")
    out = subprocess.run([runsc, "cpu-features"], capture_output=True, text=True, timeout=60, check=True).stdout
    return out.strip().split(",")


def clflush_size():
    with open("/proc/cpuinfo") as f:
        for row in f:
            key, _, value = row.partition(":")
            if key.strip() == "clflush size":
                return int(value)
    raise AssertionError("/proc/cpuinfo has no clflush size")


class DecodeTest(unittest.TestCase):
    def test_known_words(self):
        features, unnamed, cache_line = cpucheck.cpuid_features(EPYC_REGS)
        self.assertEqual(features, sorted(EPYC_RUNSC))
        self.assertEqual(unnamed, ["avx512_bf16", "avx512ifma"])
        self.assertEqual(cache_line, 64)  # EBX[15:8] = 8, in 8-byte units

    def test_single_bits(self):
        regs = {(1, 0): (0, 0x00001000, 1 << 28 | 1 << 0, 1 << 26), (7, 0): (0, 1 << 16 | 1 << 21, 1 << 1, 0),
                (0xD, 1): (1, 0, 0, 0)}
        features, unnamed, cache_line = cpucheck.cpuid_features(regs)
        # xsaveopt (leaf 0xD.1) only with xsave, as gVisor reports it.
        self.assertEqual(features, ["avx", "avx512f", "avx512vbmi", "pni", "sse2"])
        self.assertEqual(unnamed, ["avx512ifma"])
        self.assertEqual(cache_line, 128)
        regs[(1, 0)] = (0, 0, 1 << 26, 0)
        self.assertIn("xsaveopt", cpucheck.cpuid_features(regs)[0])

    def test_names_are_unique(self):
        names = [n for bits in cpucheck.GVISOR_BITS.values() for n in bits.values()]
        self.assertEqual(len(names), len(set(names)))
        self.assertTrue(set(cpucheck.NUMPY_TARGETS["AVX512_SKX"]) <= cpucheck.GVISOR_NAMES)

    def test_parse_baseline(self):
        self.assertEqual(cpucheck.parse_baseline(" fpu, sse2,,avx "), {"fpu", "sse2", "avx"})
        self.assertEqual(cpucheck.parse_baseline(""), frozenset())


class MachineCodeTest(unittest.TestCase):
    """CPUID run through a page of machine code: on the host it sees what runsc sees."""

    def test_cpuid_equals_runsc(self):
        features, _, cache_line = cpucheck.cpuid_features(cpucheck.read_cpuid())
        self.assertEqual(features, sorted(runsc_features()))
        self.assertEqual(cache_line, clflush_size())

    def test_no_executable_page_left(self):
        def exec_pages():
            with open("/proc/self/maps") as f:
                return {row.split()[0] for row in f if row.split()[1][2] == "x" and len(row.split()) == 5}
        cpucheck.read_cpuid()  # the first call loads ctypes' own libraries
        before = exec_pages()
        cpucheck.read_cpuid()
        self.assertEqual(exec_pages(), before)


def library_places(result):
    """The places of a check result whose choice a checkpoint keeps, with what they saw beyond."""
    return {k: v for k, v in result["outside"].items()
            if k not in ("cpuid", "cpuid_unnamed", "cpuinfo", "glibc_active_not_dispatching")}


def verdict_by_rule(result):
    """The verdict docs/cpu.md gives for what a check saw, and why: violated when a place
    whose choice the checkpoint keeps (a library, /proc/cpuinfo) saw anything beyond the
    baseline, libraries when only CPUID run directly did, enforced when nothing did."""
    outside = result["outside"]
    kept = dict(library_places(result), **({"cpuinfo": outside["cpuinfo"]} if outside.get("cpuinfo") else {}))
    if kept:
        return "violated", f"beyond the baseline: {kept}"
    if outside.get("cpuid") or outside.get("cpuid_unnamed"):
        return "libraries", f"CPUID run directly shows {outside.get('cpuid', []) + outside.get('cpuid_unnamed', [])}"
    return "enforced", "nothing beyond the baseline"


UNNAMED = frozenset(n for bits in cpucheck.UNNAMED_BITS.values() for n in bits.values())


class CheckTest(unittest.TestCase):
    def test_host_features_as_baseline(self):
        """On the live host, with runsc's view of it as the baseline, only what holds on any
        host of this kind: CPUID names nothing beyond it, and what a library or CPUID shows
        beyond it can only be a bit gVisor has no name for (which bits, and whether a library
        such as OpenSSL dispatches on them, is the CPU's: RecordedHostsTest pins each kind).
        The host's own /proc/cpuinfo may list flags Linux sets itself that CPUID does not show
        (x2apic, tsc_deadline_timer, topoext on the AMD EPYC here); a sandbox's /proc/cpuinfo is
        gVisor's, made from the baseline. The same assertions hold on every recorded host,
        with and without libcrypto, whichever CPU runs this."""
        hosts = [("live host", frozenset(runsc_features()), cpucheck)]
        for name in hostdata.names():
            for libcrypto in (False, True):
                recorded = hostdata.RecordedHost(name, libcrypto)
                hosts.append((f"{name}, libcrypto {libcrypto}", recorded.runsc_features, recorded))
        for label, features, places in hosts:
            with self.subTest(host=label):
                result = cpucheck.check(features, places)
                outside = result["outside"]
                self.assertNotIn("cpuid", outside, result)
                for place, seen in outside.items():
                    if place != "cpuinfo":
                        self.assertLessEqual(set(seen), UNNAMED, (place, result))
                named = set(cpucheck.cpuid_features(places.read_cpuid())[0])
                self.assertEqual(named, set(features))
                self.assertFalse(set(outside.get("cpuinfo", [])) & named)
                branch, why = verdict_by_rule(result)
                print(f"\n  {label}: {branch} ({why})", file=sys.stderr)
                self.assertEqual(result["verdict"], branch, result)
                self.assertIn("glibc", result["checked"])
                self.assertTrue(result["checked"]["cpuid"].startswith("CPUID run directly"))

    def test_a_baseline_without_avx2_is_violated_on_the_host(self):
        host = frozenset(runsc_features())
        self.assertIn("avx2", host, "this test needs a host with AVX2")
        result = cpucheck.check(host - {"avx2"})
        # No CPUID faulting for a host process: CPUID shows avx2, and glibc uses it.
        self.assertEqual(result["verdict"], "violated", result)
        self.assertIn("avx2", result["outside"]["cpuid"])
        self.assertIn("avx2", result["outside"]["glibc"])

    def test_a_place_that_cannot_be_read(self):
        real = cpucheck.read_cpuid

        def refused():
            raise OSError(1, "mprotect(PROT_READ|PROT_EXEC) of the code page failed")
        cpucheck.read_cpuid = refused
        try:
            result = cpucheck.check(frozenset(runsc_features()))
        finally:
            cpucheck.read_cpuid = real
        self.assertEqual(result["outside"]["cpuid"], ["(not checked)"])
        self.assertIn("mprotect", result["checked"]["cpuid"])
        self.assertNotEqual(result["verdict"], "enforced")

    def test_numpy_targets(self):
        """numpy's own dispatch table, as a loaded numpy exposes it (a stand-in: the host's
        python3 has no numpy; the sandbox tests use the real one)."""
        umath = types.ModuleType("numpy.core._multiarray_umath")
        umath.__cpu_dispatch__ = ["SSSE3", "AVX2", "AVX512F", "AVX512_SKX", "AVX512_ICL"]
        umath.__cpu_features__ = {"SSSE3": True, "AVX2": True, "AVX512F": True, "AVX512_SKX": False,
                                  "AVX512_ICL": True, "AVX512VL": True}
        numpy = types.ModuleType("numpy")
        numpy.__version__ = "9.9"
        saved = {k: sys.modules.get(k) for k in ("numpy", "numpy.core._multiarray_umath")}
        sys.modules.update({"numpy": numpy, "numpy.core._multiarray_umath": umath})
        try:
            result = cpucheck.check(frozenset(runsc_features()) - {"avx512f"})
        finally:
            for k, v in saved.items():
                if v is None:
                    sys.modules.pop(k, None)
                else:
                    sys.modules[k] = v
        self.assertEqual(result["checked"]["numpy"], "9.9")
        # AVX512_ICL needs avx512ifma, which no baseline can name; AVX512_SKX is off.
        self.assertEqual(result["outside"]["numpy"], ["AVX512F", "AVX512_ICL"])
        self.assertEqual(result["verdict"], "violated")

    def test_report_line(self):
        line = cpucheck.report(frozenset(runsc_features()))
        self.assertTrue(line.startswith(cpucheck.REPORT_PREFIX))
        self.assertNotIn("\n", line)
        result = json.loads(line[len(cpucheck.REPORT_PREFIX):])
        self.assertEqual(set(result), {"verdict", "outside", "checked"})

    def test_report_of_a_failing_check(self):
        real = cpucheck.check
        cpucheck.check = lambda baseline: 1 / 0
        try:
            line = cpucheck.report(frozenset())
        finally:
            cpucheck.check = real
        result = json.loads(line[len(cpucheck.REPORT_PREFIX):])
        self.assertEqual(result["verdict"], "error")
        self.assertIn("ZeroDivisionError", result["checked"]["error"])


class RecordedHostsTest(unittest.TestCase):
    """The check's logic on every CPU this kind of machine comes with, from hosts recorded by
    record_host.py (testdata/hosts/), whichever one runs the tests. Each verdict is for the
    host's own process with runsc's features as the baseline and no library controls."""

    # (host, libcrypto loaded) -> the verdict, the places beyond the baseline, and why.
    VERDICTS = {
        ("amd-epyc-no-cpuid-faulting", False): (
            "violated", {"cpuid_unnamed", "cpuinfo", "glibc_active_not_dispatching"},
            "the host kernel's /proc/cpuinfo lists x2apic, tsc_deadline_timer and topoext, which "
            "CPUID (and so runsc) does not show: code that reads the host's cpuinfo would choose "
            "them (in a sandbox, cpuinfo is gVisor's and holds the baseline only)"),
        ("amd-epyc-no-cpuid-faulting", True): (
            "violated", {"cpuid_unnamed", "cpuinfo", "glibc_active_not_dispatching", "openssl"},
            "as above, and OpenSSL's vector holds avx512ifma: its IFMA code would run after any "
            "restore, and restore cannot check a bit gVisor has no name for"),
        ("intel-xeon-cpuid-faulting", False): (
            "libraries", {"cpuid_unnamed", "glibc_active_not_dispatching"},
            "CPUID run directly shows avx512ifma, avx512_bf16 and avx_vnni beside avx512f, bits "
            "no baseline can name or hide; glibc marks them active but none of its routines "
            "dispatches on them; no library chose anything beyond"),
        ("intel-xeon-cpuid-faulting", True): (
            "violated", {"cpuid_unnamed", "glibc_active_not_dispatching", "openssl"},
            "OpenSSL's vector holds avx512ifma: a restore host with every named feature but not "
            "that bit passes restore's check and then faults in OpenSSL (docs/cpu.md)"),
    }

    def test_every_recorded_host_has_a_verdict(self):
        self.assertEqual(sorted({h for h, _ in self.VERDICTS}), hostdata.names())

    def test_verdicts(self):
        for (name, libcrypto), (verdict, places, why) in self.VERDICTS.items():
            with self.subTest(host=name, libcrypto=libcrypto):
                host = hostdata.RecordedHost(name, libcrypto)
                result = cpucheck.check(host.runsc_features, host)
                self.assertEqual(result["verdict"], verdict, f"{why}: {result}")
                self.assertEqual(set(result["outside"]), places, why)
                self.assertEqual(verdict_by_rule(result)[0], verdict)
                # The same logic on the same inputs answers what the host itself answered.
                self.assertEqual(result, host.recorded_check)

    def test_decoding_matches_runsc(self):
        """CPUID's words decode to exactly what runsc named on each CPU, with the bits it cannot
        name and the cache line /proc/cpuinfo gives."""
        for name in hostdata.names():
            with self.subTest(host=name):
                host = hostdata.RecordedHost(name)
                features, unnamed, cache_line = cpucheck.cpuid_features(host.read_cpuid())
                self.assertEqual(set(features), host.runsc_features)
                self.assertEqual(unnamed, ["avx512_bf16", "avx512ifma", "avx_vnni"])
                with open(os.path.join(host.dir, "proc-cpuinfo.txt")) as f:
                    line = next(r for r in f if r.startswith("clflush size"))
                self.assertEqual(cache_line, int(line.partition(":")[2]))

    def test_faulting(self):
        self.assertEqual({n: hostdata.RecordedHost(n).cpuid_faulting() for n in hostdata.names()},
                         {"amd-epyc-no-cpuid-faulting": False, "intel-xeon-cpuid-faulting": True})

    def test_below_the_host_without_controls(self):
        """A baseline without AVX-512 in a process without the library controls (a host process
        never has CPUID faulting): glibc picks AVX-512 code on both CPUs, so violated, and
        CPUID shows what was left out."""
        for name in hostdata.names():
            with self.subTest(host=name):
                host = hostdata.RecordedHost(name)
                removed = {f for f in host.runsc_features if f.startswith("avx512")}
                result = cpucheck.check(host.runsc_features - removed, host)
                self.assertEqual(result["verdict"], "violated", result)
                self.assertLessEqual(removed, set(result["outside"]["cpuid"]))
                self.assertIn("avx512f", result["outside"]["glibc"])
                # Untrapped CPUID shows avx512f, so the bits gVisor cannot name count too.
                self.assertEqual(result["outside"]["cpuid_unnamed"], ["avx512_bf16", "avx512ifma", "avx_vnni"])


class ExecutorTest(unittest.TestCase):
    def test_capture_reports_before_the_checkpoint(self):
        baseline = ",".join(runsc_features())
        with tempfile.TemporaryDirectory() as d:
            result = run_executor(EXECUTOR_DIR=d, EXECUTOR_MODE="capture", READIE_PREIMPORT="json",
                                  READIE_CPU_BASELINE=baseline)
        # No gVisor on the host: the checkpoint fails (exit 4) after the report and the marker.
        self.assertEqual(result.returncode, 4, result.stderr)
        lines = result.stdout.splitlines()
        self.assertTrue(lines[0].startswith(cpucheck.REPORT_PREFIX), lines)
        self.assertTrue(lines[1].startswith(cpucount.REPORT_PREFIX), lines)
        self.assertTrue(lines[2].startswith(packages.REPORT_PREFIX), lines)
        self.assertTrue(lines[3].startswith(checkpoint.MARKER), lines)
        report = json.loads(lines[0][len(cpucheck.REPORT_PREFIX):])
        # What the executor saw depends on the host's CPU (CheckTest.test_host_features_as_baseline).
        self.assertNotIn("cpuid", report["outside"], report)
        branch, why = verdict_by_rule(report)
        print(f"\n  executor branch: {branch} ({why})", file=sys.stderr)
        self.assertEqual(report["verdict"], branch, report)

    def test_no_report_without_a_baseline(self):
        with tempfile.TemporaryDirectory() as d:
            result = run_executor(EXECUTOR_DIR=d, EXECUTOR_MODE="capture", READIE_PREIMPORT="json")
        self.assertNotIn(cpucheck.REPORT_PREFIX, result.stdout)

    def test_numpy_disable_warning_is_quiet(self):
        message = ("During parsing environment variable 'NPY_DISABLE_CPU_FEATURES':\nYou cannot disable CPU "
                   "features (AVX512_KNL AVX512_SPR), since they are not part of the dispatched optimizations\n"
                   "(SSSE3 SSE41 POPCNT SSE42 AVX F16C FMA3 AVX2 AVX512F AVX512CD AVX512_SKX).")
        with warnings.catch_warnings(record=True) as seen:
            warnings.simplefilter("always")
            server.quiet_numpy_cpu_warning()
            warnings.warn(message, RuntimeWarning)
            warnings.warn("You cannot disable CPU feature 'SSE2'", RuntimeWarning)
        self.assertEqual([str(w.message) for w in seen], ["You cannot disable CPU feature 'SSE2'"])


if __name__ == "__main__":
    unittest.main()
