"""Writes the reply envelopes pkg/pycall's tests decode, as the executor pickles them
(cloudpickle.dumps, protocol 5). Run from this directory with Debian's python3:

    /usr/bin/python3 make_fixtures.py

envelope-*.pickle are replies of the ordinary kind; attack-*.pickle are replies a restored
process can send to whoever calls it (issue 35).
"""

import collections
import dataclasses
import datetime

import cloudpickle


class Point:
    def __init__(self, x):
        self.x = x

    def norm(self):
        return abs(self.x)


class Child(Point):
    def norm(self):
        return super().norm() + 1  # a __class__ cell: the class refers to itself


@dataclasses.dataclass
class Pair:
    a: int
    b: list


def ok(value, output=()):
    return {"ok": True, "value": value, "output": list(output)}


def failed(exc_type, message, traceback="", output=()):
    return {"ok": False, "exc_type": exc_type, "message": message, "traceback": traceback, "output": list(output)}


def fixtures():
    yield "envelope-smoke", ok({"missing": [], "token": "t0k"}, ["hi\n"])
    yield "envelope-values", ok({
        "ints": [0, 1, 255, 256, 65535, 65536, -1, -(2**31), 2**31 - 1, 2**31, 2**63, -(2**100)],
        "floats": [0.0, -1.5, 1e300, float("inf")],
        "strings": ["", "a", "é✓\U0001f600", "x" * 300, "line\nbreak"],
        "bytes": [b"", b"\x00\xff", b"y" * 300],
        "bytearray": bytearray(b"ba"),
        "tuples": [(), (1,), (1, 2), (1, 2, 3), (1, 2, 3, 4)],
        "nested": {"a": [{"b": (None, True, False)}]},
        1: "int key",
        None: "None key",
    })
    yield "envelope-error", failed("ZeroDivisionError", "division by zero",
                                   'Traceback (most recent call last):\n  File "<string>", line 1, in <module>\nZeroDivisionError: division by zero\n',
                                   ["printed\n"])
    shared = [1, 2]
    yield "envelope-objects", ok({
        "shared": [shared, shared],
        "set": {3},
        "frozenset": frozenset(["f"]),
        "date": datetime.date(2024, 1, 2),
        "ordered": collections.OrderedDict(a=1),
    })
    # Classes of __main__, pickled by value: calls of cloudpickle's own functions.
    yield "envelope-byvalue", ok({
        "instance": Child(2),
        "dataclass": Pair(1, [2]),
        "defaultdict": collections.defaultdict(list, {"a": [1]}),
    })

    cyclic = {}
    cyclic["a"] = cyclic
    yield "attack-cyclic-dict", failed("E", cyclic)
    dag = ()
    for _ in range(60):
        dag = (dag, dag)
    yield "attack-dag60-tuples", failed(dag, "")
    dag = []
    for _ in range(60):
        dag = [dag, dag]
    yield "attack-dag60-lists", failed(dag, "")


if __name__ == "__main__":
    for name, envelope in fixtures():
        with open(name + ".pickle", "wb") as f:
            f.write(cloudpickle.dumps(envelope))
