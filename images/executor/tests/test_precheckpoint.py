"""The optional pre-checkpoint steps of capture mode (READIE_PRE_CHECKPOINT)."""

import gc
import tempfile
import unittest

from readie_executor import checkpoint, precheckpoint, settings
from tests.test_executor import run_executor, run_restored


class ParseTest(unittest.TestCase):
    def test_default_is_none(self):
        self.assertEqual(settings.from_environ({"EXECUTOR_DIR": "/x"}).pre_checkpoint, ())
        self.assertEqual(settings.from_environ({"EXECUTOR_DIR": "/x", precheckpoint.ENV: " , "}).pre_checkpoint, ())

    def test_steps_in_order(self):
        cfg = settings.from_environ({"EXECUTOR_DIR": "/x", "EXECUTOR_MODE": "capture",
                                     precheckpoint.ENV: " malloc_trim, gc.collect,gc.freeze"})
        self.assertEqual(cfg.pre_checkpoint, ("malloc_trim", "gc.collect", "gc.freeze"))

    def test_unknown_step_named(self):
        for bad in ("gc.collect,gc.compact", "malloc_trim(0)", "GC.COLLECT"):
            with self.subTest(bad=bad), self.assertRaisesRegex(settings.SettingsError, precheckpoint.ENV + ".*unknown step"):
                settings.from_environ({"EXECUTOR_DIR": "/x", "EXECUTOR_MODE": "capture", precheckpoint.ENV: bad})

    def test_read_in_capture_mode_only(self):
        # An image's Env reaches every sandbox: outside capture mode the variable means nothing
        # and, whatever it holds, never stops a cold start or a restored executor.
        for mode in ("sandbox", "measure", "bogus"):
            with self.subTest(mode=mode):
                cfg = settings.from_environ({"EXECUTOR_DIR": "/x", "EXECUTOR_MODE": mode,
                                             precheckpoint.ENV: "gc.collect,not-a-step"})
                self.assertEqual(cfg.pre_checkpoint, ())


class StepsTest(unittest.TestCase):
    def test_each_step_runs_and_logs(self):
        lines = []
        try:
            precheckpoint.run(("gc.collect", "gc.freeze", "malloc_trim"), lines.append)
            self.assertGreater(gc.get_freeze_count(), 0)
        finally:
            gc.unfreeze()
        self.assertEqual(len(lines), 3, lines)
        self.assertRegex(lines[0], r"^pre-checkpoint gc\.collect: \d+ objects collected in [\d.]+ ms$")
        self.assertRegex(lines[1], r"^pre-checkpoint gc\.freeze: [1-9]\d* objects frozen in [\d.]+ ms$")
        self.assertRegex(lines[2], r"^pre-checkpoint malloc_trim: (memory returned to the system|nothing to return) in [\d.]+ ms$")

    def test_none_runs_nothing(self):
        lines = []
        precheckpoint.run((), lines.append)
        self.assertEqual(lines, [])


class CapturePathTest(unittest.TestCase):
    def test_steps_run_after_the_imports_before_the_checkpoint(self):
        with tempfile.TemporaryDirectory() as d:
            result = run_executor(EXECUTOR_DIR=d, EXECUTOR_MODE="capture", READIE_PREIMPORT="json",
                                  READIE_PRE_CHECKPOINT="gc.collect,gc.freeze,malloc_trim")
        # Outside gVisor the checkpoint itself fails: everything before it ran.
        self.assertEqual(result.returncode, 4, result.stderr)
        self.assertIn(checkpoint.MARKER, result.stdout)
        err = result.stderr
        order = [err.index(s) for s in ("imported json", "pre-checkpoint gc.collect:", "pre-checkpoint gc.freeze:",
                                        "pre-checkpoint malloc_trim:", "/proc/gvisor/checkpoint")]
        self.assertEqual(order, sorted(order), err)

    def test_default_capture_runs_no_step(self):
        with tempfile.TemporaryDirectory() as d:
            result = run_executor(EXECUTOR_DIR=d, EXECUTOR_MODE="capture", READIE_PREIMPORT="json")
        self.assertEqual(result.returncode, 4, result.stderr)
        self.assertNotIn("pre-checkpoint", result.stderr)

    def test_unknown_step_exits_2_before_importing(self):
        with tempfile.TemporaryDirectory() as d:
            result = run_executor(EXECUTOR_DIR=d, EXECUTOR_MODE="capture", READIE_PREIMPORT="json",
                                  READIE_PRE_CHECKPOINT="gc.collect,gc.defrag")
        self.assertEqual(result.returncode, 2)
        self.assertIn("'gc.defrag'", result.stderr)
        self.assertNotIn("imported json", result.stderr)
        self.assertNotIn(checkpoint.MARKER, result.stdout)

    def test_restore_after_the_steps(self):
        # The restore-time environment lacks the variable: the restored settings have no steps.
        with tempfile.TemporaryDirectory() as d:
            result = run_restored(f"EXECUTOR_DIR={d}\0EXECUTOR_MODE=measure\0".encode(),
                                  EXECUTOR_DIR=d, EXECUTOR_MODE="capture", READIE_PREIMPORT="json",
                                  READIE_PRE_CHECKPOINT="gc.collect,gc.freeze")
        self.assertEqual(result.returncode, 0, result.stderr)
        self.assertIn("pre-checkpoint gc.freeze:", result.stderr)


if __name__ == "__main__":
    unittest.main()
