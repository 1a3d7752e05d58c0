"""The distributions a checkpoint holds loaded, and their versions.

Run by the executor in capture mode after the preimports, before the checkpoint. The metadata
is read by a child interpreter (same executable, same sys.path), not in this process: the
modules importlib.metadata pulls in and the memory its scan touches would otherwise be saved in
every checkpoint and paid for in every restore. This process passes each loaded top-level
module (outside the standard library) with where it was loaded from; the child maps it to the
distributions that provide it and their versions, by the first of these rules that names one:

1. the metadata's own declarations: packages_distributions() (top_level.txt, or the files
   RECORD or SOURCES.txt lists);
2. a distribution whose files list (RECORD) holds the module's file, or an editable install
   (direct_url.json "dir_info": {"editable": true}) whose project directory holds it;
3. a distribution of the module's own name (normalized) in the directory it was loaded from
   (Debian removes RECORD, and meson-built metadata has no top_level.txt: numpy 2);
4. on a Debian image, the dpkg package whose file list (/var/lib/dpkg/info/*.list, read as
   data) holds the module's path: the .dist-info and .egg-info directories of that package
   (attr, of attrs).

A module none of them maps is "unmapped": its version is unknown. Modules that were not loaded
from a file (made at run time, such as Cython's "_cython_3_0_11") and those of the
interpreter's own library directories (Debian's sitecustomize) are not distributions' and are
left out, and so are, from "unmapped", the modules the executor had loaded before the
preimports (its own, and what the image's site loads into every process).

The report is one JSON line on stdout after REPORT_PREFIX, read by the pipeline from the
capture's stdout log: {"packages": {normalized name: version}, "errors": {...}, "unmapped":
[module, ...]}, or {"error": "..."} when the child could not run.
"""

import json
import os
import sys

REPORT_PREFIX = "readie-executor: packages "

# Never a distribution's: the executor's own package, and __main__, which it runs as.
EXECUTOR_MODULES = frozenset({"__main__", __name__.partition(".")[0]})

# Where dpkg keeps each installed package's file list, inside the sandbox.
DPKG_INFO = "/var/lib/dpkg/info"

# The child's code: argv[1] is the parent's sys.path, argv[2] the modules ({top-level name:
# [the module's file, or a package's directories]}), argv[3] dpkg's info directory.
CHILD = r"""
import json, os, sys
sys.path[:] = json.loads(sys.argv[1])
import importlib.metadata as md, re
modules, dpkg_info = json.loads(sys.argv[2]), sys.argv[3]

def norm(name):
    return re.sub(r"[-_.]+", "-", name).lower()

def under(path, directory):
    # path is directory or lies below it.
    while True:
        if path == directory:
            return True
        parent = os.path.dirname(path)
        if parent == path:
            return False
        path = parent

packages, errors, found = {}, {}, {}

def record(top, dist, name=None):
    # One distribution of top's: dist (its version from its own metadata) or, by name, the
    # first of that name on sys.path.
    try:
        name = name or dist.metadata["Name"]
        if not name:
            return
        version = dist.version if dist is not None else md.version(name)
        if not version:
            raise ValueError("its metadata has no version")
        packages.setdefault(norm(name), version)
    except Exception as e:
        errors[norm(name or top)] = (type(e).__name__ + ": " + str(e))[:300]
    found[top] = True

def forms(path):
    # A path as given and resolved (a venv's lib64 may be a link to lib).
    return {os.path.normpath(path), os.path.realpath(path)}

# A module's paths, and the directories it was loaded from (the entries of sys.path).
paths = {top: set().union(*map(forms, where)) for top, where in modules.items()}
sites = {top: set().union(*(forms(os.path.dirname(p)) for p in where)) for top, where in modules.items()}
# The interpreter's own library (os.py's directory: sysconfig would cost a tenth of the child).
stdlib = forms(os.path.dirname(os.__file__))
stdlib |= {os.path.join(p, "lib-dynload") for p in stdlib}
# Left out: a module not loaded from a file, or from the interpreter's own library.
left = {top for top in modules if paths[top] and not sites[top] & stdlib}

# 1. What the metadata declares, by name.
provided = md.packages_distributions()
for top in modules:
    for name in provided.get(top, ()):
        record(top, None, name)
left -= set(found)

# 2. A distribution whose files (RECORD) hold the module's, or an editable install whose
# project directory does. An unreadable distribution is skipped: it may be none of ours.
if left:
    for dist in md.distributions():
        try:
            roots = forms(dist.locate_file(""))
            # Each file's first part is the top-level module or package it belongs to.
            owned = {os.path.join(root, f.parts[0]) for f in dist.files or () if f.parts for root in roots}
            mine = {top for top in left if paths[top] & owned}
            url = json.loads(dist.read_text("direct_url.json") or "{}")
            if url.get("dir_info", {}).get("editable") and url.get("url", "").startswith("file:"):
                from urllib.parse import unquote, urlsplit
                project = os.path.realpath(unquote(urlsplit(url["url"]).path))
                mine |= {top for top in left if any(under(p, project) for p in paths[top])}
        except Exception:
            continue
        for top in mine:
            record(top, dist)
    left -= set(found)

# 3. A distribution of the module's name in the directory the module was loaded from (before
# dpkg's lists, which cost a read of every one).
for top in sorted(left):
    for dist in md.distributions(name=top):
        if forms(dist.locate_file("")) & sites[top]:
            record(top, dist)
            break
left -= set(found)

# 4. dpkg's file lists: the package holding the module, and its metadata directories.
if left and os.path.isdir(dpkg_info):
    wanted = {p: top for top in left for p in paths[top]}
    for entry in sorted(os.scandir(dpkg_info), key=lambda e: e.name):
        if not entry.name.endswith(".list"):
            continue
        with open(entry.path, encoding="utf-8", errors="surrogateescape") as f:
            text = "\n" + f.read() + "\n"
        holds = {top for p, top in wanted.items() if "\n" + p + "\n" in text}
        if not holds:
            continue
        infos = [line for line in text.split("\n") if line.endswith((".dist-info", ".egg-info"))]
        for top in holds:
            for info in infos:
                if os.path.isdir(info):
                    record(top, md.Distribution.at(info))
        # A package of no metadata may list the module's directory too (a -dev package's).
        wanted = {p: top for p, top in wanted.items() if top not in found}
        if not wanted:
            break
    left -= set(found)

sys.stdout.write("\n" + json.dumps({"packages": packages, "errors": errors, "unmapped": sorted(left)}, sort_keys=True) + "\n")
"""


def loaded_top_levels():
    """The top-level names of sys.modules outside the standard library, sorted."""
    tops = {name.partition(".")[0] for name in list(sys.modules) if isinstance(name, str)}
    return sorted(tops - set(sys.stdlib_module_names))


def origins(top):
    """Where the loaded module top came from: a package's directories, or a module's file
    (absolute paths; none for a module not loaded from a file). Read from the module's
    namespace, not its attributes: a module's __getattr__ could run code."""
    module = sys.modules.get(top)
    if not isinstance(module, type(sys)):
        return []
    try:
        namespace = vars(module)
        where = namespace.get("__path__")
        if where is not None:
            where = list(where)
        else:
            where = [namespace.get("__file__") or getattr(namespace.get("__spec__"), "origin", None)]
    except Exception:
        return []
    return [p for p in where if isinstance(p, str) and os.path.isabs(p)]


def read(tops=None, own=()):
    """The child's answer for the loaded modules tops (default: all that this process has
    loaded but the executor's), as a dict; a module of own is never "unmapped"."""
    if tops is None:
        tops = [top for top in loaded_top_levels() if top not in EXECUTOR_MODULES]
    result = query(sys.path, {top: origins(top) for top in tops})
    if "unmapped" in result:
        own = set(own)
        result["unmapped"] = [top for top in result["unmapped"] if top not in own]
    return result


def query(path, modules, dpkg_info=DPKG_INFO):
    """The child's answer, as a dict, for modules ({top-level name: its origins}) on sys.path
    path, with dpkg's file lists in dpkg_info."""
    exe = sys.executable or "/proc/self/exe"
    r, w = os.pipe()
    argv = [exe, "-c", CHILD, json.dumps(list(path)), json.dumps(modules), dpkg_info]
    try:
        pid = os.posix_spawn(exe, argv, os.environ, file_actions=[(os.POSIX_SPAWN_DUP2, w, 1), (os.POSIX_SPAWN_CLOSE, r)])
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
    if (not isinstance(result, dict) or not isinstance(result.get("packages"), dict)
            or not isinstance(result.get("unmapped"), list)):
        return {"error": f"the metadata reader printed {out[:200]!r}"}
    return result


def report(tops=None, own=()):
    """The line the executor prints: REPORT_PREFIX and read's result as one JSON object."""
    return REPORT_PREFIX + json.dumps(read(tops, own), sort_keys=True, separators=(",", ":"))
