"""Running one request: unpickle, call, capture output, build the response envelope."""

import io
import os
import shutil
import sys
import traceback

import cloudpickle


class OutputCapture:
    """Captures what a call writes to stdout and stderr, at the file-descriptor level so that
    output from C extensions and subprocesses is kept too, in the order it was written."""

    def __init__(self):
        self.output = []

    def __enter__(self):
        self._streams = (sys.stdout, sys.stderr)
        for stream in self._streams:
            _flush(stream)
        try:
            self._fd = os.memfd_create("readie-output", os.MFD_CLOEXEC)
            self._saved = (os.dup(1), os.dup(2))
            os.dup2(self._fd, 1)
            os.dup2(self._fd, 2)
        except OSError:
            # No usable descriptors 1 and 2: capture what Python code prints.
            self._fd = None
            self._buffer = io.StringIO()
            sys.stdout = sys.stderr = self._buffer
        return self

    def __exit__(self, *exc):
        for stream in (sys.stdout, sys.stderr):
            _flush(stream)
        sys.stdout, sys.stderr = self._streams
        if self._fd is None:
            text = self._buffer.getvalue()
        else:
            os.dup2(self._saved[0], 1)
            os.dup2(self._saved[1], 2)
            for fd in self._saved:
                os.close(fd)
            os.lseek(self._fd, 0, os.SEEK_SET)
            with open(self._fd, "rb", closefd=True) as f:
                text = f.read().decode("utf-8", "replace")
        # Lines with their endings, so "".join(output) is exactly what was written.
        self.output = text.splitlines(keepends=True)
        return False


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


def _describe(exc):
    return type(exc).__name__, str(exc), "".join(traceback.format_exception(exc))


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


def run_call(payload):
    """Runs one request payload and returns the pickled response envelope."""
    capture = OutputCapture()
    with capture:
        try:
            func, args, kwargs = _load_request(payload)
        except BaseException as e:
            exc_type, message, tb = _describe(e)
            envelope = error_envelope(exc_type, f"bad request: {message}", tb)
        else:
            try:
                envelope = {"ok": True, "value": func(*args, **kwargs)}
            except BaseException as e:  # SystemExit and KeyboardInterrupt from the function too
                exc_type, message, tb = _describe(e)
                envelope = error_envelope(exc_type, message, tb)
    envelope["output"] = capture.output
    try:
        return cloudpickle.dumps(envelope)
    except BaseException as e:
        exc_type, message, tb = _describe(e)
        what = "return value" if envelope.get("ok") else "exception"
        return cloudpickle.dumps(error_envelope(
            exc_type, f"{what} could not be pickled: {message}", tb, capture.output))
