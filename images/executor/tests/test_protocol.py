import io
import json
import os
import random
import struct
import unittest

from readie_executor import protocol

GOLDEN = os.path.join(os.path.dirname(__file__), "..", "..", "..", "testdata", "frames.golden.json")


def encode(payload, chunk_size):
    buf = io.BytesIO()
    protocol.write_message(buf, payload, chunk_size)
    return buf.getvalue()


class GoldenTest(unittest.TestCase):
    @classmethod
    def setUpClass(cls):
        with open(GOLDEN) as f:
            cls.golden = json.load(f)

    def test_version(self):
        self.assertEqual(self.golden["protocol_version"], protocol.VERSION)

    def test_spec_example(self):
        want = bytes.fromhex("0000000000000006" "68656c6c6f20" "0000000000000005" "776f726c64" "0000000000000000")
        self.assertEqual(encode(b"hello world", 6), want)

    def test_cases(self):
        self.assertGreaterEqual(len(self.golden["cases"]), 9)
        for case in self.golden["cases"]:
            with self.subTest(case["name"]):
                payload = bytes.fromhex(case["payload_hex"])
                encoded = bytes.fromhex(case["encoded_hex"])
                self.assertEqual(encode(payload, case["chunk_size"]), encoded)
                self.assertEqual(protocol.read_message(io.BytesIO(encoded)), payload)


class FramingTest(unittest.TestCase):
    def test_truncation_at_every_prefix(self):
        encoded = encode(b"hello world, in chunks", 5)
        for cut in range(len(encoded)):
            with self.subTest(cut=cut):
                with self.assertRaises(protocol.TruncatedMessageError) as ctx:
                    protocol.read_message(io.BytesIO(encoded[:cut]))
                self.assertEqual(ctx.exception.received, cut)

    def test_chunk_too_large_before_allocation(self):
        header = struct.pack(">Q", protocol.MAX_CHUNK_SIZE + 1)
        with self.assertRaises(protocol.ChunkTooLargeError):
            protocol.read_message(io.BytesIO(header))

    def test_message_too_large(self):
        """Legal 64 MiB chunks without end: the 65th header exceeds 4 GiB and is refused.

        The stream hands out one shared 64 MiB body for every chunk, so the real read_message
        runs over 4 GiB of stream while this test holds 64 MiB."""
        header = struct.pack(">Q", protocol.MAX_CHUNK_SIZE)
        body = bytes(protocol.MAX_CHUNK_SIZE)

        class Endless:
            def __init__(self):
                self.chunks = 0
                self.headers = 0

            def read(self, size):
                if size == len(header):
                    self.headers += 1
                    return header
                assert size == len(body), size
                self.chunks += 1
                return body

        stream = Endless()
        with self.assertRaises(protocol.MessageTooLargeError):
            protocol.read_message(stream)
        self.assertEqual((stream.chunks, stream.headers),
                         (protocol.MAX_MESSAGE_SIZE // protocol.MAX_CHUNK_SIZE, 65))

    def test_write_too_large_and_bad_chunk_size(self):
        for size in (0, -1, protocol.MAX_CHUNK_SIZE + 1, 1.5, True):
            with self.subTest(size=size), self.assertRaises(ValueError):
                protocol.write_message(io.BytesIO(), b"x", size)

    def test_zero_chunk_ends_message(self):
        stream = io.BytesIO(encode(b"abc", 2) + encode(b"next", 10))
        self.assertEqual(protocol.read_message(stream), b"abc")
        self.assertEqual(protocol.read_message(stream), b"next")

    def test_round_trip_random(self):
        rng = random.Random(7)
        for _ in range(300):
            payload = rng.randbytes(rng.randrange(5000))
            chunk = rng.randrange(1, 700)
            encoded = encode(payload, chunk)
            self.assertEqual(protocol.read_message(io.BytesIO(encoded)), payload)
            # No empty chunk before the terminator.
            pos = 0
            while True:
                (n,) = struct.unpack_from(">Q", encoded, pos)
                pos += 8 + n
                if n == 0:
                    break
                self.assertLessEqual(n, chunk)
            self.assertEqual(pos, len(encoded))

    def test_unbuffered_short_reads(self):
        class Trickle(io.RawIOBase):
            def __init__(self, data):
                self.data = data

            def readable(self):
                return True

            def readinto(self, b):
                n = min(3, len(b), len(self.data))
                b[:n] = self.data[:n]
                self.data = self.data[n:]
                return n

        payload = bytes(range(256)) * 10
        self.assertEqual(protocol.read_message(Trickle(encode(payload, 100))), payload)


if __name__ == "__main__":
    unittest.main()
