"""How many CPUs the sandbox shows the executor: a checkpoint keeps the count, and libraries
size themselves by it at import (OpenBLAS starts a thread per CPU).

In capture mode the executor prints REPORT_PREFIX and one JSON object before its checkpoint;
the pipeline checks that every view holds the count its config pins (sandbox.cpus).
"""

import json
import os

REPORT_PREFIX = "readie-executor: cpus "


def seen(cpuinfo_path="/proc/cpuinfo"):
    """The CPU count as Python, the scheduler and /proc/cpuinfo give it (None: not readable)."""
    try:
        affinity = len(os.sched_getaffinity(0))
    except OSError:
        affinity = None
    try:
        with open(cpuinfo_path, encoding="ascii", errors="replace") as f:
            cpuinfo = sum(1 for line in f if line.split(":", 1)[0].strip() == "processor")
    except OSError:
        cpuinfo = None
    return {"cpu_count": os.cpu_count(), "affinity": affinity, "cpuinfo": cpuinfo}


def report(cpuinfo_path="/proc/cpuinfo"):
    """The line the executor prints: REPORT_PREFIX and seen() as one JSON object."""
    return REPORT_PREFIX + json.dumps(seen(cpuinfo_path), sort_keys=True, separators=(",", ":"))
