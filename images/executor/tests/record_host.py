"""Records what the CPU check sees on this host, in the layout of testdata/hosts/<name>/, so the
check's logic is tested against every CPU this project's machines come with (hostdata.py reads
it back). Run on a host of a new kind, as root, with Debian's python3 and the pinned runsc:

    /usr/bin/python3 images/executor/tests/record_host.py RUNSC testdata/hosts/NAME

It writes proc-cpuinfo.txt, runsc-cpu-features.txt, ld-so-list-diagnostics.txt, cpucheck.json
(every place the check looks at, read in this process before libcrypto is loaded, and check()
with runsc's features as the baseline) and cpucheck-with-libcrypto.json (the same after
`import ssl`), then README.md's table of them is the one to fill in by hand.
"""

import json
import os
import shutil
import subprocess
import sys

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), ".."))

from readie_executor import cpucheck  # noqa: E402

CHECK_KEY = "check(runsc cpu-features as baseline)"


def record(runsc, out):
    if "ssl" in sys.modules or cpucheck.loaded_libraries("libcrypto.so"):
        raise SystemExit("record_host: libcrypto is already loaded; run this script on its own")
    os.makedirs(out, exist_ok=True)
    shutil.copyfile("/proc/cpuinfo", os.path.join(out, "proc-cpuinfo.txt"))
    features = subprocess.run([runsc, "cpu-features"], capture_output=True, text=True, timeout=60,
                              check=True).stdout
    with open(os.path.join(out, "runsc-cpu-features.txt"), "w") as f:
        f.write(features)
    diagnostics = subprocess.run(["/lib64/ld-linux-x86-64.so.2", "--list-diagnostics"], capture_output=True,
                                 text=True, timeout=30, check=True).stdout
    with open(os.path.join(out, "ld-so-list-diagnostics.txt"), "w") as f:
        f.write(diagnostics)
    baseline = cpucheck.parse_baseline(features)

    def pair(value):
        found, version = value
        return [sorted(found) if found is not None else None, version]

    seen = {
        "read_cpuid": {str(k): list(v) for k, v in cpucheck.read_cpuid().items()},
        "numpy_targets": pair(cpucheck.numpy_targets()),
        "openssl_features": pair(cpucheck.openssl_features()),
        "glibc_active": pair(cpucheck.glibc_active()),
        "glibc_preferred": sorted(cpucheck.glibc_preferred()),
        "openblas_core": cpucheck.openblas_core(),
        CHECK_KEY: cpucheck.check(baseline),
    }
    write_json(os.path.join(out, "cpucheck.json"), seen)
    import ssl  # noqa: F401 (loads libcrypto: OpenSSL's capability vector is then read)
    write_json(os.path.join(out, "cpucheck-with-libcrypto.json"), {
        "note": "same host, libcrypto loaded first (import ssl)",
        "openssl_features": pair(cpucheck.openssl_features()),
        CHECK_KEY: cpucheck.check(baseline),
    })


def write_json(path, value):
    with open(path, "w") as f:
        json.dump(value, f, indent=1)
        f.write("\n")


if __name__ == "__main__":
    if len(sys.argv) != 3:
        raise SystemExit(__doc__)
    record(sys.argv[1], sys.argv[2])
