"""Write the golden framing fixture shared by the Go and Python tests.

Usage: generate_golden.py [OUTPUT]   (default: testdata/frames.golden.json at the repo root)
"""

import json
import io
import os
import random
import sys

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.dirname(HERE))

from readie_executor import protocol  # noqa: E402

DEFAULT_OUTPUT = os.path.join(HERE, "..", "..", "..", "testdata", "frames.golden.json")


def cases():
    rng = random.Random(20261202)  # fixed seed: the fixture must regenerate byte for byte
    yield "empty", 16, b""
    yield "hello_world_spec_example", 6, b"hello world"
    yield "one_chunk", 64, b"a single chunk of text"
    yield "exactly_one_full_chunk", 8, b"12345678"
    yield "many_chunks", 7, bytes(rng.getrandbits(8) for _ in range(100))
    yield "one_byte_chunks", 1, b"abcde"
    yield ("larger_than_default_chunk", protocol.DEFAULT_CHUNK_SIZE,
           bytes(rng.getrandbits(8) for _ in range(protocol.DEFAULT_CHUNK_SIZE + 3)))
    yield "contains_v1_eof", 4, b"before EOF after EOF"
    yield "contains_terminator_lookalike", 16, b"\x00" * 8 + b"tail" + b"\x00" * 8
    yield "all_zero_chunks", 8, b"\x00" * 24
    yield "every_byte_value", 100, bytes(range(256))


def build():
    out = []
    for name, chunk_size, payload in cases():
        buf = io.BytesIO()
        protocol.write_message(buf, payload, chunk_size)
        out.append({
            "name": name,
            "chunk_size": chunk_size,
            "payload_hex": payload.hex(),
            "encoded_hex": buf.getvalue().hex(),
        })
    return {"protocol_version": protocol.VERSION, "cases": out}


def main(argv):
    path = argv[1] if len(argv) > 1 else DEFAULT_OUTPUT
    text = json.dumps(build(), indent=1) + "\n"
    tmp = path + ".tmp"
    with open(tmp, "w") as f:
        f.write(text)
    os.replace(tmp, path)


if __name__ == "__main__":
    main(sys.argv)
