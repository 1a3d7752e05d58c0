"""Optional steps run in capture mode after the imports, just before the checkpoint.

A pipeline extension, not part of the executor protocol: READIE_PRE_CHECKPOINT names the
steps (comma-separated, run in that order); unset or blank, none runs and capture mode is
exactly the spec's. The pipeline sets it only for a bench variant that measures what the steps
do to the image's size and its restore.
"""

import gc
import time

ENV = "READIE_PRE_CHECKPOINT"


class PreCheckpointError(Exception):
    """A step could not run here (capture fails with exit code 4, before the checkpoint)."""


def _collect():
    return f"{gc.collect()} objects collected"


def _freeze():
    # Moves every tracked object to the permanent generation: later collections never touch
    # (and so never write) their pages.
    gc.freeze()
    return f"{gc.get_freeze_count()} objects frozen"


def _malloc_trim():
    # ctypes is imported only for this step: it adds its own modules and libffi to the image.
    import ctypes
    try:
        trim = ctypes.CDLL(None).malloc_trim  # glibc's, through the process's own symbols
    except (OSError, AttributeError) as e:
        raise PreCheckpointError(f"malloc_trim is not available here (not glibc?): {e}") from None
    trim.argtypes = [ctypes.c_size_t]
    trim.restype = ctypes.c_int
    return "memory returned to the system" if trim(0) else "nothing to return"


STEPS = {"gc.collect": _collect, "gc.freeze": _freeze, "malloc_trim": _malloc_trim}


def parse(raw):
    """The steps named by raw (READIE_PRE_CHECKPOINT): blanks ignored; an unknown name raises
    ValueError naming it and the known ones."""
    names = tuple(name.strip() for name in raw.split(",") if name.strip())
    for name in names:
        if name not in STEPS:
            raise ValueError(f"{ENV}: unknown step {name!r} (known: {', '.join(STEPS)})")
    return names


def run(names, log):
    """Runs the steps in order, logging what each did and how long it took."""
    for name in names:
        started = time.monotonic()
        outcome = STEPS[name]()
        log(f"pre-checkpoint {name}: {outcome} in {(time.monotonic() - started) * 1000:.1f} ms")
