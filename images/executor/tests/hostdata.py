"""Hosts recorded by record_host.py (testdata/hosts/<name>/), read back as stand-ins for the
process that cpucheck.check looks at: the CPU check's logic is then tested on every CPU this
project's machines come with, whichever one runs the tests."""

import ast
import json
import os

from readie_executor import cpucheck

HOSTS_DIR = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "..", "..", "testdata", "hosts")
CHECK_KEY = "check(runsc cpu-features as baseline)"


def names():
    """The recorded hosts, sorted."""
    return sorted(d for d in os.listdir(HOSTS_DIR) if os.path.isfile(os.path.join(HOSTS_DIR, d, "cpucheck.json")))


class RecordedHost:
    """One recorded host, as cpucheck.check's places: what the host process saw before
    libcrypto was loaded, or (libcrypto=True) after `import ssl`."""

    def __init__(self, name, libcrypto=False):
        self.name, self.libcrypto = name, libcrypto
        self.dir = os.path.join(HOSTS_DIR, name)
        with open(os.path.join(self.dir, "cpucheck.json")) as f:
            self.seen = json.load(f)
        if libcrypto:
            with open(os.path.join(self.dir, "cpucheck-with-libcrypto.json")) as f:
                self.seen.update(json.load(f))
        with open(os.path.join(self.dir, "runsc-cpu-features.txt")) as f:
            self.runsc_features = cpucheck.parse_baseline(f.read())

    @property
    def recorded_check(self):
        """What check() answered on the host itself, when it was recorded."""
        return self.seen[CHECK_KEY]

    def read_cpuid(self):
        return {ast.literal_eval(k): tuple(v) for k, v in self.seen["read_cpuid"].items()}

    def cpuinfo_flags(self):
        return cpucheck.cpuinfo_flags(os.path.join(self.dir, "proc-cpuinfo.txt"))

    def cpuid_faulting(self):
        return "cpuid_fault" in self.cpuinfo_flags()

    def numpy_targets(self):
        return tuple(self.seen["numpy_targets"])

    def glibc_active(self):
        active, version = self.seen["glibc_active"]
        return (None if active is None else set(active)), version

    def glibc_preferred(self):
        return set(self.seen["glibc_preferred"])

    def openblas_core(self):
        return self.seen["openblas_core"]

    def openssl_features(self):
        features, version = self.seen["openssl_features"]
        return (None if features is None else set(features)), version
