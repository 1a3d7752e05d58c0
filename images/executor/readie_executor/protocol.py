"""Executor wire protocol, version 2.

A message is a series of chunks, each an 8-byte big-endian length followed by that many bytes,
ended by a zero-length chunk. The Go side (pkg/executorproto) implements the same framing;
testdata/frames.golden.json keeps the two byte-identical.
"""

import struct

VERSION = 2
DEFAULT_CHUNK_SIZE = 1 << 20
MAX_CHUNK_SIZE = 64 << 20
MAX_MESSAGE_SIZE = 4 << 30

_HEADER = struct.Struct(">Q")
_TERMINATOR = bytes(_HEADER.size)


class ProtocolError(Exception):
    """A stream that does not hold a valid message."""


class TruncatedMessageError(ProtocolError):
    """The stream ended before the message's terminator.

    ``received`` counts the stream bytes of this message that did arrive: 0 means the peer
    closed without starting a message, which a server treats as an ordinary hang-up.
    """

    def __init__(self, message, received):
        super().__init__(message)
        self.received = received


class ChunkTooLargeError(ProtocolError):
    """A chunk header claimed more than MAX_CHUNK_SIZE bytes."""


class MessageTooLargeError(ProtocolError):
    """A message's payload would exceed MAX_MESSAGE_SIZE bytes."""


def _check_chunk_size(chunk_size):
    if isinstance(chunk_size, bool) or not isinstance(chunk_size, int):
        raise ValueError(f"chunk size must be an integer, not {chunk_size!r}")
    if not 1 <= chunk_size <= MAX_CHUNK_SIZE:
        raise ValueError(f"chunk size {chunk_size} out of range 1..{MAX_CHUNK_SIZE}")


def write_message(stream, payload, chunk_size=DEFAULT_CHUNK_SIZE):
    """Write payload (bytes-like) to a binary stream as one message, then flush it."""
    _check_chunk_size(chunk_size)
    view = memoryview(payload).cast("B")
    if len(view) > MAX_MESSAGE_SIZE:
        raise MessageTooLargeError(f"payload of {len(view)} bytes exceeds {MAX_MESSAGE_SIZE}")
    for start in range(0, len(view), chunk_size):
        chunk = view[start:start + chunk_size]  # a view: no copy of the payload here
        stream.write(_HEADER.pack(len(chunk)))
        stream.write(chunk)
    stream.write(_TERMINATOR)
    flush = getattr(stream, "flush", None)
    if flush is not None:
        flush()


def _read_exact(stream, size, received, what):
    """Read exactly size bytes; a short read means the peer went away mid-message."""
    data = stream.read(size)
    if data is None:
        data = b""
    if len(data) == size:
        return data
    parts = [data]
    got = len(data)
    while got < size:
        more = stream.read(size - got)
        if not more:
            raise TruncatedMessageError(
                f"stream ended {received + got} bytes into a message, inside {what}",
                received + got)
        parts.append(more)
        got += len(more)
    return b"".join(parts)


def read_message(stream):
    """Read one message from a binary stream and return its payload as bytes."""
    chunks = []
    received = 0  # stream bytes of this message, headers included
    total = 0  # payload bytes
    while True:
        header = _read_exact(stream, _HEADER.size, received, "a chunk header")
        received += _HEADER.size
        (size,) = _HEADER.unpack(header)
        if size == 0:
            break
        if size > MAX_CHUNK_SIZE:
            raise ChunkTooLargeError(f"chunk header claims {size} bytes, limit {MAX_CHUNK_SIZE}")
        if total + size > MAX_MESSAGE_SIZE:
            raise MessageTooLargeError(f"message exceeds {MAX_MESSAGE_SIZE} bytes")
        chunks.append(_read_exact(stream, size, received, "a chunk"))
        received += size
        total += size
    if len(chunks) == 1:
        return chunks[0]
    return b"".join(chunks)
