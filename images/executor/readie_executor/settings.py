"""Executor settings, read from the environment (and re-read after a restore)."""

import dataclasses

from . import protocol

MODES = ("capture", "measure", "sandbox")


class SettingsError(Exception):
    """An environment that the executor cannot start with (exit code 2)."""


@dataclasses.dataclass(frozen=True)
class Settings:
    executor_dir: str
    mode: str
    preimport: tuple
    chunk_size: int

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
    raw_chunk = environ.get("EXECUTOR_CHUNK_SIZE", "")
    if raw_chunk.strip() == "":
        chunk_size = protocol.DEFAULT_CHUNK_SIZE
    else:
        try:
            chunk_size = int(raw_chunk, 10)
        except ValueError:
            raise SettingsError(f"EXECUTOR_CHUNK_SIZE={raw_chunk!r} is not a whole number of bytes") from None
        if not 1 <= chunk_size <= protocol.MAX_CHUNK_SIZE:
            raise SettingsError(
                f"EXECUTOR_CHUNK_SIZE={chunk_size} is out of range 1..{protocol.MAX_CHUNK_SIZE}")
    return Settings(executor_dir=executor_dir, mode=mode, preimport=preimport, chunk_size=chunk_size)
