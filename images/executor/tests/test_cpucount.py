"""The CPU count report of capture mode (readie_executor.cpucount), on the host. Inside real
sandboxes, where gVisor gives the count the pipeline pins, it is tested by the Go suite
(pkg/capture TestCPUs, cmd/pipeline TestSandboxCPUs)."""

import json
import os
import tempfile
import unittest

from readie_executor import checkpoint, cpucount
from tests.test_executor import run_executor


class SeenTest(unittest.TestCase):
    def test_counts_what_this_host_shows(self):
        got = cpucount.seen()
        self.assertEqual(got["cpu_count"], os.cpu_count())
        self.assertEqual(got["affinity"], len(os.sched_getaffinity(0)))
        # /proc/cpuinfo lists every online CPU, the affinity only this process's.
        self.assertGreaterEqual(got["cpuinfo"], got["affinity"])

    def test_cpuinfo_processor_lines_only(self):
        with tempfile.NamedTemporaryFile("w", suffix=".cpuinfo") as f:
            f.write("processor\t: 0\nmodel name\t: x processor y\n\nprocessor\t: 1\nflags\t: fpu\n\n"
                    "processor\t: 2\n")
            f.flush()
            self.assertEqual(cpucount.seen(f.name)["cpuinfo"], 3)

    def test_unreadable_cpuinfo_is_none(self):
        self.assertIsNone(cpucount.seen("/nonexistent/cpuinfo")["cpuinfo"])

    def test_report_is_one_json_line(self):
        line = cpucount.report()
        self.assertTrue(line.startswith(cpucount.REPORT_PREFIX))
        self.assertNotIn("\n", line)
        self.assertEqual(json.loads(line[len(cpucount.REPORT_PREFIX):]), cpucount.seen())


class ExecutorTest(unittest.TestCase):
    def test_capture_reports_before_the_checkpoint(self):
        with tempfile.TemporaryDirectory() as d:
            result = run_executor(EXECUTOR_DIR=d, EXECUTOR_MODE="capture", READIE_PREIMPORT="json")
        # No gVisor on the host: the checkpoint fails (exit 4) after the reports and the marker.
        self.assertEqual(result.returncode, 4, result.stderr)
        lines = result.stdout.splitlines()
        self.assertTrue(lines[0].startswith(cpucount.REPORT_PREFIX), lines)
        self.assertTrue(lines[-1].startswith(checkpoint.MARKER), lines)
        self.assertEqual(json.loads(lines[0][len(cpucount.REPORT_PREFIX):])["cpu_count"], os.cpu_count())


if __name__ == "__main__":
    unittest.main()
