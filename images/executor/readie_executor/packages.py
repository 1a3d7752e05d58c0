"""The distributions a checkpoint holds loaded, and their versions.

Run by the executor in capture mode after the preimports, before the checkpoint. The metadata
is read by a child interpreter (same executable, same sys.path), not in this process: the
modules importlib.metadata pulls in and the memory its scan touches would otherwise be saved in
every checkpoint and paid for in every restore. The child maps each top-level module this
process has loaded to the distributions that provide it (packages_distributions) and their
versions. The report is one JSON line on stdout after REPORT_PREFIX, read by the pipeline from
the capture's stdout log: {"packages": {normalized name: version}, "errors": {...}}, or
{"error": "..."} when the child could not run.
"""

import json
import os
import sys

REPORT_PREFIX = "readie-executor: packages "

# The child's code: argv[1] is the parent's sys.path, argv[2] its loaded top-level names.
CHILD = r"""
import json, sys
sys.path[:] = json.loads(sys.argv[1])
import importlib.metadata as md, re
def norm(name):
    return re.sub(r"[-_.]+", "-", name).lower()
provided = md.packages_distributions()
packages, errors = {}, {}
for top in json.loads(sys.argv[2]):
    for name in provided.get(top, ()):
        if not name or norm(name) in packages:
            continue
        try:
            packages[norm(name)] = md.version(name)
        except Exception as e:
            errors[norm(name)] = (type(e).__name__ + ": " + str(e))[:300]
sys.stdout.write("\n" + json.dumps({"packages": packages, "errors": errors}, sort_keys=True) + "\n")
"""


def loaded_top_levels():
    """The top-level names of sys.modules outside the standard library, sorted."""
    tops = {name.partition(".")[0] for name in list(sys.modules) if isinstance(name, str)}
    return sorted(tops - set(sys.stdlib_module_names))


def read(tops=None):
    """The child's answer for tops (default: what this process has loaded), as a dict."""
    if tops is None:
        tops = loaded_top_levels()
    exe = sys.executable or "/proc/self/exe"
    r, w = os.pipe()
    try:
        pid = os.posix_spawn(exe, [exe, "-c", CHILD, json.dumps(sys.path), json.dumps(tops)], os.environ,
                             file_actions=[(os.POSIX_SPAWN_DUP2, w, 1), (os.POSIX_SPAWN_CLOSE, r)])
    except OSError as e:
        os.close(r)
        os.close(w)
        return {"error": f"cannot start {exe}: {e}"}
    os.close(w)
    chunks = []
    with os.fdopen(r, "rb") as f:
        while chunk := f.read(65536):
            chunks.append(chunk)
    _, status = os.waitpid(pid, 0)
    out = b"".join(chunks)
    if os.waitstatus_to_exitcode(status) != 0:
        return {"error": f"the metadata reader exited with status {os.waitstatus_to_exitcode(status)}"}
    try:
        # The last line: a sitecustomize of the image may print before the child's answer.
        result = json.loads(out.strip().splitlines()[-1]) if out.strip() else None
    except ValueError:
        return {"error": f"the metadata reader printed {out[:200]!r}"}
    if not isinstance(result, dict) or not isinstance(result.get("packages"), dict):
        return {"error": f"the metadata reader printed {out[:200]!r}"}
    return result


def report(tops=None):
    """The line the executor prints: REPORT_PREFIX and read's result as one JSON object."""
    return REPORT_PREFIX + json.dumps(read(tops), sort_keys=True, separators=(",", ":"))
