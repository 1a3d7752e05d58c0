"""Throughput of the Python framing on a 64 MiB payload in 1 MiB chunks, over a real Unix
socket pair (target: 1 GB/s each way).

Each direction runs beside a baseline that moves the same bytes through the same socket with no
framing (sendall; recv_into a fresh buffer), interleaved round by round, and the report gives
medians and ratios from this one run. It also reports how fast this machine can touch 64 MiB of
fresh memory, the floor under any read that returns a new 64 MiB object.
"""

import os
import socket
import statistics
import sys
import threading
import time

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

from readie_executor import protocol  # noqa: E402

SIZE = 64 << 20
ROUNDS = 7


def drain(sock, nbytes):
    buf = bytearray(1 << 20)
    view = memoryview(buf)
    while nbytes:
        n = sock.recv_into(view[:min(len(buf), nbytes)])
        if not n:
            raise EOFError
        nbytes -= n


def in_thread(fn, *args):
    t = threading.Thread(target=fn, args=args)
    t.start()
    return t


def main():
    payload = os.urandom(SIZE)
    encoded_len = SIZE + 8 * (SIZE // protocol.DEFAULT_CHUNK_SIZE) + 8
    a, b = socket.socketpair()
    wfile, rfile = a.makefile("wb"), b.makefile("rb")
    encoded = bytearray()

    class Collect:
        def write(self, data):
            encoded.extend(data)

    protocol.write_message(Collect(), payload)
    assert len(encoded) == encoded_len

    def write_message():
        t = in_thread(drain, b, encoded_len)
        protocol.write_message(wfile, payload)
        t.join()

    def baseline_write():
        t = in_thread(drain, b, encoded_len)
        a.sendall(encoded)
        t.join()

    def read_message():
        t = in_thread(a.sendall, encoded)
        assert len(protocol.read_message(rfile)) == SIZE
        t.join()

    def baseline_read():
        t = in_thread(a.sendall, encoded)
        buf = memoryview(bytearray(encoded_len))
        got = 0
        while got < encoded_len:
            got += b.recv_into(buf[got:])
        t.join()

    def touch_fresh_memory():
        bytearray(SIZE)

    cases = [write_message, baseline_write, read_message, baseline_read, touch_fresh_memory]
    runs = {fn.__name__: [] for fn in cases}
    for _ in range(ROUNDS):
        for fn in cases:
            start = time.perf_counter()
            fn()
            runs[fn.__name__].append(time.perf_counter() - start)
    med = {name: statistics.median(r) for name, r in runs.items()}
    for name, seconds in med.items():
        print(f"{name:20s} {SIZE / seconds / 1e9:6.2f} GB/s  median of {ROUNDS}: {seconds * 1000:7.1f} ms")
    for ours, base in [("write_message", "baseline_write"), ("read_message", "baseline_read")]:
        print(f"{ours} / {base}: {med[base] / med[ours]:.2f} of the baseline's throughput")
    below = [n for n in ("write_message", "read_message") if SIZE / med[n] < 1e9]
    if below:
        print(f"below the 1 GB/s target on this machine: {', '.join(below)}")


if __name__ == "__main__":
    main()
