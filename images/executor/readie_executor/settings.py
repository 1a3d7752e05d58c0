"""Executor settings, read from the environment (and re-read after a restore)."""

import dataclasses

from . import precheckpoint, protocol

MODES = ("capture", "measure", "sandbox")

# What a call's output may add to its response: the head and the tail are kept, the middle is
# counted and dropped (EXECUTOR_OUTPUT_LIMIT).
DEFAULT_OUTPUT_LIMIT = 16 << 20


class SettingsError(Exception):
    """An environment that the executor cannot start with (exit code 2)."""


@dataclasses.dataclass(frozen=True)
class Settings:
    executor_dir: str
    mode: str
    preimport: tuple
    chunk_size: int
    # The largest response this executor sends (EXECUTOR_MAX_MESSAGE_SIZE, at most the
    # protocol's limit): a return value that pickles to more is answered with an ok: False
    # envelope. Lowered by tests; the default is the protocol's.
    max_message_size: int = protocol.MAX_MESSAGE_SIZE
    output_limit: int = DEFAULT_OUTPUT_LIMIT
    # Steps run after the imports, before the checkpoint (READIE_PRE_CHECKPOINT, a pipeline
    # extension: precheckpoint.py); empty by default.
    pre_checkpoint: tuple = ()

    @property
    def socket_path(self):
        return self.executor_dir.rstrip("/") + "/executor.sock"


def from_environ(environ):
    executor_dir = environ.get("EXECUTOR_DIR", "")
    if not executor_dir:
        raise SettingsError("EXECUTOR_DIR is not set: it must name the directory for executor.sock")
    mode = environ.get("EXECUTOR_MODE", "sandbox")
    if mode not in MODES:
        mode = "sandbox"  # the spec: any unknown value falls back to sandbox
    preimport = tuple(name.strip() for name in environ.get("READIE_PREIMPORT", "").split(",") if name.strip())
    chunk_size = _bytes(environ, "EXECUTOR_CHUNK_SIZE", protocol.DEFAULT_CHUNK_SIZE, 1, protocol.MAX_CHUNK_SIZE)
    max_message_size = _bytes(environ, "EXECUTOR_MAX_MESSAGE_SIZE", protocol.MAX_MESSAGE_SIZE, 1,
                              protocol.MAX_MESSAGE_SIZE)
    output_limit = _bytes(environ, "EXECUTOR_OUTPUT_LIMIT", DEFAULT_OUTPUT_LIMIT, 2, protocol.MAX_MESSAGE_SIZE)
    # Read in capture mode only: elsewhere the steps mean nothing, and a value an image set must
    # not stop a cold start or a restore.
    pre_checkpoint = ()
    if mode == "capture":
        try:
            pre_checkpoint = precheckpoint.parse(environ.get(precheckpoint.ENV, ""))
        except ValueError as e:
            raise SettingsError(str(e)) from None
    return Settings(executor_dir=executor_dir, mode=mode, preimport=preimport, chunk_size=chunk_size,
                    max_message_size=max_message_size, output_limit=output_limit, pre_checkpoint=pre_checkpoint)


def _bytes(environ, name, default, low, high):
    """A byte count from environ[name] in low..high; default when unset or blank."""
    raw = environ.get(name, "")
    if raw.strip() == "":
        return default
    try:
        value = int(raw, 10)
    except ValueError:
        raise SettingsError(f"{name}={raw!r} is not a whole number of bytes") from None
    if not low <= value <= high:
        raise SettingsError(f"{name}={value} is out of range {low}..{high}")
    return value
