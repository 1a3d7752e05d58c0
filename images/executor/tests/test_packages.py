"""The packages report of capture mode (readie_executor.packages), on the host: the child
interpreter maps loaded modules to their distributions and versions without this process
importing importlib.metadata. The same report inside real sandboxes is tested by the Go suite
(cmd/pipeline catalogue_test.go)."""

import importlib.metadata
import json
import os
import sys
import tempfile
import unittest
from unittest import mock

import cloudpickle  # noqa: F401 (loaded, so the report must name its distribution)

from readie_executor import checkpoint, packages
from tests.test_executor import run_executor


class PackagesTest(unittest.TestCase):
    def test_loaded_distributions(self):
        self.assertIn("cloudpickle", packages.loaded_top_levels())
        self.assertNotIn("json", packages.loaded_top_levels())
        got = packages.read()
        self.assertEqual(got["packages"]["cloudpickle"], importlib.metadata.version("cloudpickle"))
        self.assertEqual(got["errors"], {})

    def test_only_what_is_asked(self):
        self.assertEqual(packages.read(["no_such_module_zz"])["packages"], {})

    def test_report_line(self):
        line = packages.report(["cloudpickle"])
        self.assertTrue(line.startswith(packages.REPORT_PREFIX))
        self.assertEqual(json.loads(line[len(packages.REPORT_PREFIX):])["packages"],
                         {"cloudpickle": importlib.metadata.version("cloudpickle")})

    def test_noise_before_the_answer(self):
        # An image's sitecustomize may print: the answer is the child's last line.
        with tempfile.TemporaryDirectory() as d:
            noisy = f"{d}/python3"
            with open(noisy, "w") as f:
                f.write(f"#!/bin/sh\necho 'hello from sitecustomize'\nexec {sys.executable} \"$@\"\n")
            os.chmod(noisy, 0o755)
            with mock.patch.object(sys, "executable", noisy):
                self.assertEqual(packages.read(["cloudpickle"])["packages"],
                                 {"cloudpickle": importlib.metadata.version("cloudpickle")})

    def test_reader_failure_is_reported(self):
        with mock.patch.object(sys, "executable", "/bin/false"):
            self.assertIn("exited with status 1", packages.read(["cloudpickle"])["error"])
        with mock.patch.object(sys, "executable", "/nonexistent/python3"):
            self.assertIn("cannot start", packages.read(["cloudpickle"])["error"])

    def test_capture_reports_before_the_checkpoint(self):
        with tempfile.TemporaryDirectory() as d:
            result = run_executor(EXECUTOR_DIR=d, EXECUTOR_MODE="capture", READIE_PREIMPORT="json")
        # No gVisor on the host: the checkpoint fails (exit 4) after the report and the marker.
        self.assertEqual(result.returncode, 4, result.stderr)
        lines = result.stdout.splitlines()
        self.assertTrue(lines[0].startswith(packages.REPORT_PREFIX), lines)
        self.assertTrue(lines[1].startswith(checkpoint.MARKER), lines)
        # The executor itself loads cloudpickle: every checkpoint holds it.
        self.assertEqual(json.loads(lines[0][len(packages.REPORT_PREFIX):])["packages"]["cloudpickle"],
                         importlib.metadata.version("cloudpickle"))


if __name__ == "__main__":
    unittest.main()
