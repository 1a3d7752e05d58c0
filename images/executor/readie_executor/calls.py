"""Running one request: unpickle, call, capture output, build the response envelope."""

import io
import os
import shutil
import sys
import traceback

import cloudpickle

from . import protocol, settings


class OutputCapture:
    """Captures what a call writes to stdout and stderr, at the file-descriptor level so that
    output from C extensions and subprocesses is kept too, in the order it was written.

    At most limit bytes of it are kept: the head and the tail, with a line in between saying how
    many bytes were dropped, so a function that prints gigabytes still gets an answer of a
    bounded size (and this process reads no more than limit bytes of it)."""

    def __init__(self, limit=settings.DEFAULT_OUTPUT_LIMIT):
        self.output = []
        self._limit = limit

    def __enter__(self):
        self._streams = (sys.stdout, sys.stderr)
        for stream in self._streams:
            _flush(stream)
        self._fd = None
        try:
            self._fd = os.memfd_create("readie-output", os.MFD_CLOEXEC)
            self._saved = (os.dup(1), os.dup(2))
            os.dup2(self._fd, 1)
            os.dup2(self._fd, 2)
        except OSError:
            # No usable descriptors 1 and 2 (or none free: a call before leaked them all):
            # capture what Python code prints.
            if self._fd is not None:
                os.close(self._fd)
                self._fd = None
            self._buffer = _BoundedText(self._limit)
            sys.stdout = sys.stderr = self._buffer
        return self

    def __exit__(self, *exc):
        for stream in (sys.stdout, sys.stderr):
            _flush(stream)
        # A function that closed sys.stdout or sys.stderr closed the executor's own: give the
        # next call and the executor's log working ones on the same descriptors.
        sys.stdout, sys.stderr = (_reopened(stream, fd) for stream, fd in zip(self._streams, (1, 2)))
        if self._fd is None:
            head, dropped, tail = self._buffer.parts()
        else:
            os.dup2(self._saved[0], 1)
            os.dup2(self._saved[1], 2)
            for fd in self._saved:
                os.close(fd)
            try:
                head, dropped, tail = _head_and_tail(self._fd, self._limit)
            finally:
                os.close(self._fd)
        # Lines with their endings, so "".join(output) is exactly what was written (when
        # nothing was dropped).
        self.output = head.splitlines(keepends=True)
        if dropped:
            if self.output and not self.output[-1].endswith("\n"):
                self.output[-1] += "\n"
            self.output.append(f"[readie-executor: {dropped} bytes of output dropped here, "
                               f"over the limit of {self._limit} (EXECUTOR_OUTPUT_LIMIT)]\n")
        self.output += tail.splitlines(keepends=True)
        return False


def _head_and_tail(fd, limit):
    """(head, bytes dropped, tail) of the file fd, reading at most limit bytes of it."""
    size = os.fstat(fd).st_size
    if size <= limit:
        return _read_at(fd, 0, size), 0, ""
    half = limit // 2
    return _read_at(fd, 0, half), size - limit, _read_at(fd, size - (limit - half), limit - half)


def _read_at(fd, offset, size):
    parts = []
    while size > 0:
        data = os.pread(fd, min(size, 1 << 20), offset)
        if not data:
            break
        parts.append(data)
        offset += len(data)
        size -= len(data)
    return b"".join(parts).decode("utf-8", "replace")


class _BoundedText:
    """A text stream that keeps the head and the tail of what is written, limit characters in
    all, and counts the rest."""

    def __init__(self, limit):
        self._half = limit // 2
        self._tail_limit = limit - self._half
        self._head, self._tail = [], []
        self._head_len = self._tail_len = self._dropped = 0

    def write(self, text):
        text = str(text)
        room = self._half - self._head_len
        if room > 0:
            self._head.append(text[:room])
            self._head_len += len(text[:room])
            text = text[room:]
        if text:
            self._tail.append(text)
            self._tail_len += len(text)
            if self._tail_len > 2 * self._tail_limit:
                joined = "".join(self._tail)
                self._dropped += len(joined) - self._tail_limit
                self._tail, self._tail_len = [joined[-self._tail_limit:]], self._tail_limit
        return len(text)

    def flush(self):
        pass

    def parts(self):
        tail = "".join(self._tail)
        cut = max(0, len(tail) - self._tail_limit)
        return "".join(self._head), self._dropped + cut, tail[cut:]


def _reopened(stream, fd):
    if not getattr(stream, "closed", False):
        return stream
    return open(fd, "w", buffering=1, encoding="utf-8", errors="backslashreplace", closefd=False)


def _flush(stream):
    try:
        stream.flush()
    except Exception:  # a function may leave a closed or odd object in sys.stdout
        pass


class Resolver:
    """Gives the sandbox a resolver configuration if it has none, before every call, because a
    function can reach the network on its own."""

    def __init__(self, log, conf="/etc/resolv.conf", shipped="/etc/readie-resolv.conf"):
        self._log = log
        self._conf = conf
        self._shipped = shipped
        self._warned = False

    def _configured(self):
        try:
            with open(self._conf, encoding="utf-8", errors="replace") as f:
                return any(line.split()[:1] == ["nameserver"] for line in f)
        except OSError:
            return False

    def ensure(self):
        if self._configured() or not os.path.exists(self._shipped):
            return
        try:
            shutil.copyfile(self._shipped, self._conf)
            self._log(f"dns: copied {self._shipped} to {self._conf}")
        except OSError as e:
            if not self._warned:
                self._warned = True
                self._log(f"dns: cannot write {self._conf}: {e.strerror}")


def error_envelope(exc_type, message, tb="", output=()):
    return {"ok": False, "exc_type": exc_type, "message": message, "traceback": tb,
            "output": list(output)}


# An exception's message and traceback are cut to this many characters (head and tail).
TEXT_LIMIT = 1 << 20


def _describe(exc):
    """(type name, message, traceback) of exc as plain strs, whatever exc does: a function's
    exception is the function's code, and its __str__, __repr__ or class name may raise, return
    a str subclass or hang on to gigabytes. Never raises."""
    name = _safely(lambda: type(exc).__name__, "an exception whose class has no name")
    message = _safely(lambda: str(exc), None)
    if message is None:
        message = _safely(lambda: repr(exc), None)
    if message is None:
        message = f"<{name}: str() and repr() of the exception raised>"
    tb = _safely(lambda: "".join(traceback.format_exception(exc)), "<the traceback could not be formatted>")
    return name, _cut(message), _cut(tb)


def _safely(fn, fallback):
    """fn() as a plain str (never a subclass, which could pickle as anything), or fallback if
    it raises anything or returns something else."""
    try:
        value = fn()
        if isinstance(value, str):
            return "".join([value])  # a copy of type str
    except BaseException:  # SystemExit from a __str__ too: the executor must answer
        pass
    return fallback


def _cut(text, limit=TEXT_LIMIT):
    if len(text) <= limit:
        return text
    half = limit // 2
    return f"{text[:half]}\n[readie-executor: {len(text) - limit} characters cut]\n{text[-(limit - half):]}"


def _load_request(payload):
    """Returns (func, args, kwargs) or raises TypeError describing what is wrong."""
    request = cloudpickle.loads(payload)
    if not isinstance(request, dict):
        raise TypeError(f"request must be a dict with a callable 'func', got {type(request).__name__}")
    func = request.get("func")
    if not callable(func):
        raise TypeError(f"request 'func' must be callable, got {type(func).__name__}")
    args = request.get("args", ())
    kwargs = request.get("kwargs", {})
    if not isinstance(args, (tuple, list)):
        raise TypeError(f"request 'args' must be a tuple, got {type(args).__name__}")
    if not isinstance(kwargs, dict):
        raise TypeError(f"request 'kwargs' must be a dict, got {type(kwargs).__name__}")
    # A 'packages' key from an older client is ignored: the worker installs packages.
    return func, tuple(args), kwargs


def run_call(payload, max_message_size=protocol.MAX_MESSAGE_SIZE, output_limit=settings.DEFAULT_OUTPUT_LIMIT,
             reserve=None):
    """Runs one request payload and returns the pickled response envelope, at most
    max_message_size bytes. Never raises: whatever the function does that this process
    survives (its exception, an unpicklable or oversized value) becomes an ok: False envelope.
    reserve, when given, is held while the function runs (FdReserve)."""
    capture = OutputCapture(output_limit)
    try:
        with capture:
            try:
                func, args, kwargs = _load_request(payload)
            except BaseException as e:
                exc_type, message, tb = _describe(e)
                envelope = error_envelope(exc_type, f"bad request: {message}", tb)
            else:
                if reserve is not None:
                    reserve.hold()
                try:
                    envelope = {"ok": True, "value": func(*args, **kwargs)}
                except BaseException as e:  # SystemExit and KeyboardInterrupt from the function too
                    exc_type, message, tb = _describe(e)
                    envelope = error_envelope(exc_type, message, tb)
                finally:
                    if reserve is not None:
                        reserve.release()
    except BaseException as e:  # the capture itself failed (e.g. reading back the output)
        exc_type, message, tb = _describe(e)
        envelope = error_envelope(exc_type, f"the call's output could not be read back: {message}", tb)
    envelope["output"] = capture.output
    try:
        response = cloudpickle.dumps(envelope)
    except BaseException as e:  # a __reduce__ that raises, a value nested too deep, ...
        exc_type, message, tb = _describe(e)
        what = "return value" if envelope.get("ok") else "exception"
        return _dumps_bounded(error_envelope(exc_type, f"{what} could not be pickled: {message}", tb, capture.output),
                              max_message_size)
    if len(response) <= max_message_size:
        return response
    if not envelope.get("ok"):
        return _dumps_bounded(envelope, max_message_size)
    return _dumps_bounded(error_envelope(
        "MessageTooLargeError",
        f"the return value pickles to a response of {len(response)} bytes, over the executor's limit of "
        f"{max_message_size} (EXECUTOR_MAX_MESSAGE_SIZE)", "", capture.output), max_message_size)


def _dumps_bounded(envelope, max_message_size):
    """An error envelope pickled within max_message_size: without its output, then with its
    message and traceback cut, when those make it too large."""
    response = cloudpickle.dumps(envelope)
    if len(response) > max_message_size and envelope["output"]:
        envelope["output"] = ["[readie-executor: the output was dropped: the response was over "
                              "EXECUTOR_MAX_MESSAGE_SIZE]\n"]
        response = cloudpickle.dumps(envelope)
    if len(response) > max_message_size:
        # A character may take 4 bytes in the pickle's UTF-8.
        room = max(64, (max_message_size - 1024) // 16)
        envelope.update(message=_cut(envelope["message"], room), traceback=_cut(envelope["traceback"], room))
        response = cloudpickle.dumps(envelope)
    if len(response) > max_message_size:
        envelope.update(output=[], traceback="", message=envelope["message"][:64])
        response = cloudpickle.dumps(envelope)
    return response


class FdReserve:
    """A few file descriptors held while a function runs and released after it, so that a
    function that leaks descriptors until EMFILE leaves room for the server to answer it,
    accept the next connection and capture the next call's output."""

    def __init__(self, count=8):
        self._count = count
        self._fds = []

    def hold(self):
        while len(self._fds) < self._count:
            try:
                self._fds.append(os.open(os.devnull, os.O_RDONLY | os.O_CLOEXEC))
            except OSError:
                return  # as many as there are: the function leaked the rest

    def release(self):
        while self._fds:
            os.close(self._fds.pop())
