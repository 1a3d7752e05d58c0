"""The checkpoint step of capture mode and what a restored process must refresh."""

import os
import random
import sys

CHECKPOINT_PATH = "/proc/gvisor/checkpoint"
SPEC_ENVIRON_PATH = "/proc/gvisor/spec_environ"

# The line printed to stdout just before the checkpoint; the pipeline looks for it as
# evidence that the executor reached the checkpoint (exit code 0 alone proves nothing).
MARKER = "readie-executor: checkpoint begin"


class CheckpointError(Exception):
    """gVisor reported an error, or the checkpoint could not be triggered."""


class SpecEnvironError(Exception):
    """The restore-time environment holds an entry os.environ cannot take (exit code 5)."""


def trigger(path=CHECKPOINT_PATH):
    """Ask gVisor to checkpoint this sandbox; returns "restore" or "resume".

    The write freezes the process; the read on the same descriptor returns once this process
    runs again, either in the sandbox that saved it (resume) or in a restored clone (restore).
    """
    try:
        fd = os.open(path, os.O_RDWR)
    except OSError as e:
        raise CheckpointError(f"cannot open {path}: {e.strerror} (is the checkpoint annotation set?)") from None
    try:
        os.write(fd, b"1")
        result = os.read(fd, 64).decode("ascii", "replace").strip()
    except OSError as e:
        raise CheckpointError(f"checkpoint through {path} failed: {e.strerror}") from None
    finally:
        os.close(fd)
    if result in ("restore", "resume"):
        return result
    raise CheckpointError(f"gVisor reported {result!r} for the checkpoint")


def read_spec_environ(path=SPEC_ENVIRON_PATH):
    """The environment of the sandbox this process was restored into."""
    with open(path, "rb") as f:
        return parse_spec_environ(f.read())


def parse_spec_environ(raw):
    """NUL-separated KEY=VALUE entries; an entry without "=" is skipped, and a name that
    os.environ would refuse raises SpecEnvironError naming it."""
    env = {}
    for entry in raw.split(b"\0"):
        if not entry:
            continue
        key, sep, value = entry.decode("utf-8", "surrogateescape").partition("=")
        if not sep:
            continue
        if not key:
            raise SpecEnvironError(f"restore-time environment entry {entry[:64]!r} has an empty name")
        env[key] = value
    return env


def replace_environ(env):
    """Make os.environ exactly env: the frozen copy still holds the capture-time values."""
    for key in list(os.environ):
        if key not in env:
            del os.environ[key]
    os.environ.update(env)


def reseed():
    """Every clone of a checkpoint shares its random state: give this one its own."""
    random.seed()
    numpy = sys.modules.get("numpy")
    if numpy is not None:
        numpy.random.seed()
