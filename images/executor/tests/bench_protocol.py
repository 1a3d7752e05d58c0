"""Throughput of the Python framing on a 64 MiB payload in 1 MiB chunks (target: 1 GB/s).

Writes to and reads from an in-memory stream, beside a baseline that moves the same encoded
bytes with one write and one read, so the ratio is measured in the same run.
"""

import io
import os
import statistics
import sys
import time

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

from readie_executor import protocol  # noqa: E402

SIZE = 64 << 20
ROUNDS = 9


def timed(fn):
    runs = []
    for _ in range(ROUNDS):
        start = time.perf_counter()
        fn()
        runs.append(time.perf_counter() - start)
    return statistics.median(runs)


def main():
    payload = os.urandom(SIZE)
    encoded = io.BytesIO()
    protocol.write_message(encoded, payload)
    encoded = encoded.getvalue()

    def write():
        protocol.write_message(io.BytesIO(), payload)

    def read():
        assert len(protocol.read_message(io.BufferedReader(io.BytesIO(encoded)))) == SIZE

    def baseline_write():
        io.BytesIO().write(encoded)

    def baseline_read():
        io.BufferedReader(io.BytesIO(encoded)).read()

    results = {}
    # Interleave the measurements round by round so machine noise hits them alike.
    for name, fn in [("write_message", write), ("baseline write", baseline_write),
                     ("read_message", read), ("baseline read", baseline_read)]:
        results[name] = timed(fn)
    for name, seconds in results.items():
        print(f"{name:15s} {SIZE / seconds / 1e9:6.2f} GB/s  (median of {ROUNDS}, {seconds * 1000:.1f} ms)")
    for ours, base in [("write_message", "baseline write"), ("read_message", "baseline read")]:
        print(f"{ours} / {base}: {results[base] / results[ours]:.2f} of baseline throughput")
    failed = [n for n in ("write_message", "read_message") if SIZE / results[n] < 1e9]
    if failed:
        print(f"below the 1 GB/s target: {', '.join(failed)}")
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
