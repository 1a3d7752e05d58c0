"""Test-only: importing this module never returns, so a capture of a set that imports it can
never finish in time, on any machine. The image installs it under /usr/lib/readie/testing,
which is on no interpreter's path unless PYTHONPATH names it (the fault tests pass it in)."""

import threading

threading.Event().wait()
