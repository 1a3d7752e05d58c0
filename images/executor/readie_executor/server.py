"""The executor's startup sequence (spec: Startup sequence) and its serving loop."""

import errno
import importlib
import os
import socket
import sys
import time
import warnings

from . import calls, checkpoint, cpucheck, cpucount, packages, precheckpoint, protocol, settings as settings_mod

EXIT_OK = 0
EXIT_SETTINGS = 2
EXIT_IMPORT = 3
EXIT_CHECKPOINT = 4
EXIT_ENVIRON = 5


def log(message):
    """One line per event on stderr, where the pipeline reads why a capture failed. Never
    raises: a function may have closed or replaced sys.stderr."""
    line = f"readie-executor: {message}\n"
    try:
        sys.stderr.write(line)
        sys.stderr.flush()
    except Exception:
        try:
            os.write(2, line.encode("utf-8", "replace"))
        except OSError:
            pass


def serve_connection(conn, cfg, resolver, reserve=None):
    """Serves request/response pairs on one connection until the client closes it."""
    rfile = conn.makefile("rb")
    wfile = conn.makefile("wb")
    try:
        while True:
            try:
                payload = protocol.read_message(rfile)
            except protocol.TruncatedMessageError as e:
                if e.received:
                    log(f"dropping connection: {e}")
                return
            except (protocol.ProtocolError, OSError) as e:
                log(f"dropping connection: {type(e).__name__}: {e}")
                return
            resolver.ensure()
            started = time.monotonic()
            response = calls.run_call(payload, cfg.max_message_size, cfg.output_limit, reserve)
            try:
                protocol.write_message(wfile, response, cfg.chunk_size)
            except (protocol.ProtocolError, OSError) as e:
                log(f"dropping connection: cannot send the response: {e}")
                return
            log(f"call: {len(payload)} bytes in, {len(response)} bytes out, "
                f"{(time.monotonic() - started) * 1000:.1f} ms")
    finally:
        for f in (rfile, wfile):
            try:
                f.close()
            except OSError:
                pass


def serve(cfg, since=None):
    """Binds the socket (only now, after any checkpoint) and serves one connection at a time.

    since is the wall-clock time the process resumed from a checkpoint, for the log (the
    monotonic clock jumps on restore)."""
    path = cfg.socket_path
    try:
        os.unlink(path)  # a socket left by an earlier run of this sandbox directory
    except FileNotFoundError:
        pass
    listener = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    listener.bind(path)
    listener.listen(1)
    if since is None:
        log(f"listening on {path}")
    else:
        log(f"listening on {path}, {(time.time() - since) * 1000:.1f} ms after resuming")
    resolver = calls.Resolver(log)
    reserve = calls.FdReserve()
    while True:
        conn = accept(listener, reserve)
        try:
            with conn:
                serve_connection(conn, cfg, resolver, reserve)
        except Exception as e:  # never the end of the server: the next worker gets an answer
            log(f"dropping connection: {type(e).__name__}: {e}")


# accept's errors that the next attempt may not have: descriptors or memory that a call used up
# (EMFILE after a function leaked its descriptors), a peer that went away first.
RETRY_ACCEPT = {errno.EMFILE, errno.ENFILE, errno.ENOBUFS, errno.ENOMEM, errno.ECONNABORTED, errno.EINTR,
                errno.EPROTO, errno.EPERM}


def accept(listener, reserve):
    """The next connection. An error the next attempt may not have is logged (once per run of
    them) and retried after a pause, so a function that leaked descriptors does not end the
    server."""
    failing = False
    while True:
        try:
            conn, _ = listener.accept()
            return conn
        except OSError as e:
            if e.errno not in RETRY_ACCEPT:
                raise
            reserve.release()
            if not failing:
                log(f"accept failed, retrying: {e.strerror} (errno {e.errno})")
                failing = True
            time.sleep(0.05)


def preimport(names):
    for name in names:
        started = time.monotonic()
        try:
            importlib.import_module(name)
        except BaseException as e:
            log(f"import of {name} failed: {type(e).__name__}: {e}")
            return False
        log(f"imported {name} in {(time.monotonic() - started) * 1000:.0f} ms")
    return True


def quiet_numpy_cpu_warning():
    """A CPU baseline's NPY_DISABLE_CPU_FEATURES names the dispatch targets of every numpy
    version, so a numpy that lacks some of them warns at import that it cannot disable those.
    That is no problem, and the warning would land in every call's output that imports numpy."""
    warnings.filterwarnings("ignore", category=RuntimeWarning, message=(
        r"During parsing environment variable:? 'NPY_DISABLE_CPU_FEATURES':\s*"
        r"You cannot disable CPU features? \(.*\), since (they are|it is) not part of the dispatched"))


def main():
    quiet_numpy_cpu_warning()
    try:
        cfg = settings_mod.from_environ(os.environ)
    except settings_mod.SettingsError as e:
        log(str(e))
        return EXIT_SETTINGS

    if cfg.mode == "capture":
        # The executor's own modules and what the image's site loads into every process: never
        # "unmapped" in the packages report, which is about the set's.
        own = packages.loaded_top_levels()
        if not preimport(cfg.preimport):
            return EXIT_IMPORT
        baseline = os.environ.get(cpucheck.BASELINE_ENV)
        if baseline is not None:
            # After the imports, before the checkpoint: what the checkpoint will hold.
            started = time.monotonic()
            print(cpucheck.report(cpucheck.parse_baseline(baseline)), flush=True)
            log(f"cpu check in {(time.monotonic() - started) * 1000:.1f} ms")
        # The CPU count the checkpoint keeps, which the pipeline pins.
        print(cpucount.report(), flush=True)
        # The distributions the checkpoint will hold loaded, read in a child interpreter.
        started = time.monotonic()
        print(packages.report(own=own), flush=True)
        log(f"packages read in {(time.monotonic() - started) * 1000:.1f} ms")
        # Last before the checkpoint, so nothing above allocates after them.
        try:
            precheckpoint.run(cfg.pre_checkpoint, log)
        except precheckpoint.PreCheckpointError as e:
            log(f"checkpoint failed: {e}")
            return EXIT_CHECKPOINT
        print(f"{checkpoint.MARKER} imports={','.join(cfg.preimport)}", flush=True)
        try:
            result = checkpoint.trigger()
            resumed = time.time()
            if result == "restore":
                env = checkpoint.read_spec_environ()
                if env.get("EXECUTOR_MODE") == "measure":
                    # First thing after a restore: whatever runs before this exit is counted in
                    # every restore_ms, and teardown of a large process is not restore time.
                    os._exit(EXIT_OK)
                checkpoint.replace_environ(env)
        except checkpoint.SpecEnvironError as e:
            log(f"after restore: {e}")
            return EXIT_ENVIRON
        except (checkpoint.CheckpointError, OSError) as e:
            log(f"checkpoint failed: {e}")
            return EXIT_CHECKPOINT
        environ_done = time.time()
        try:
            cfg = settings_mod.from_environ(os.environ)
        except settings_mod.SettingsError as e:
            log(f"after {result}: {e}")
            return EXIT_SETTINGS
        checkpoint.reseed()
        reseeded = time.time()
        log(f"{result}d in {cfg.mode} mode (environment {(environ_done - resumed) * 1000:.1f} ms, "
            f"settings and reseed {(reseeded - environ_done) * 1000:.1f} ms)")
        if cfg.mode == "measure":
            # Resumed (not restored) in measure mode: leave the same way.
            os._exit(EXIT_OK)
        serve(cfg, since=resumed)
        return EXIT_OK

    serve(cfg)
    return EXIT_OK
