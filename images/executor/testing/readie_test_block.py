"""Test-only: importing this module never returns, so a capture of a set that imports it can
never finish in time, on any machine. The image installs it under /usr/lib/readie/testing,
which is on no interpreter's path unless PYTHONPATH names it (the fault tests pass it in).

It says so on stderr first: a test that kills the pipeline waits for this line, because a
write after the pipeline is gone would break the executor's pipe and end the capture."""

import sys
import threading

sys.stderr.write("readie_test_block: blocking forever\n")
sys.stderr.flush()
threading.Event().wait()
