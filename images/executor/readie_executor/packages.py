"""The distributions a checkpoint holds loaded, and their versions.

Run by the executor in capture mode after the preimports, before the checkpoint. The metadata
is read by a child interpreter (same executable, same sys.path), not in this process: the
modules importlib.metadata pulls in and the memory its scan touches would otherwise be saved in
every checkpoint and paid for in every restore. This process passes each loaded top-level
module (outside the standard library) with where it was loaded from; the child maps it to the
distributions that provide it and their versions, by the first of these rules that names one:

1. the metadata's own declarations: packages_distributions() (top_level.txt, or the files
   RECORD or SOURCES.txt lists);
2. a distribution whose files list (RECORD) holds the module's file; else an editable install
   (direct_url.json "dir_info": {"editable": true}) whose project directory holds it, outside
   any site-packages or dist-packages directory below the project (its .venv's), the deepest
   such project when several do;
3. a distribution of the module's own name (normalized) in the directory it was loaded from
   (Debian removes RECORD, and meson-built metadata has no top_level.txt: numpy 2);
4. on a Debian image, the dpkg package whose file list (/var/lib/dpkg/info/*.list, read as
   data; a list that is not a regular file, or is larger than DPKG_LIST_MAX, is skipped) holds
   the module's path: the .dist-info and .egg-info directories of that package (attr, of
   attrs).

A module none of them maps is "unmapped": its version is unknown. Modules that were not loaded
from a file (made at run time, such as Cython's "_cython_3_0_11") and those of the
interpreter's own library directories (Debian's sitecustomize) are not distributions' and are
left out, and so are, from "unmapped", the modules the executor had loaded before the
preimports (its own, and what the image's site loads into every process).

The child takes its input as JSON on stdin (a single argument is capped at 128 KiB), and its
answer, of at most OUTPUT_MAX bytes, on stdout. The report is one JSON line on stdout after
REPORT_PREFIX, read by the pipeline from the
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

# The largest dpkg file list the child reads (Debian's largest, of kernel modules, are a few MB).
DPKG_LIST_MAX = 64 << 20

# The most the parent reads of the child's stdout (its answer is a few KB).
OUTPUT_MAX = 16 << 20

# signal.SIGKILL on Linux, without importing signal into the process being checkpointed.
SIGKILL = 9

# The child's code: stdin is one JSON object: "path", the parent's sys.path; "modules",
# {top-level name: [the module's file, or a package's directories]}; "dpkg_info", dpkg's info
# directory; "dpkg_list_max", DPKG_LIST_MAX.
CHILD = r"""
import json, os, sys
given = json.loads(sys.stdin.buffer.read())
sys.path[:] = given["path"]
import importlib.metadata as md, re, stat
modules, dpkg_info, dpkg_list_max = given["modules"], given["dpkg_info"], given["dpkg_list_max"]

def norm(name):
    return re.sub(r"[-_.]+", "-", name).lower()

def in_project(path, project):
    # path is the project directory or lies below it, not in a site directory below it (a
    # venv's at project/.venv, or pip install --target's).
    rel = os.path.relpath(path, project)
    if rel == os.pardir or rel.startswith(os.pardir + os.sep):
        return False
    return not {"site-packages", "dist-packages"} & set(rel.split(os.sep))

def read_list(path):
    # A dpkg file list's text, or None when it is not a regular file (not followed through a
    # link: a FIFO would block, /dev/zero never end), cannot be read, or is too large.
    try:
        fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC)
    except OSError:
        return None
    try:
        st = os.fstat(fd)
        if not stat.S_ISREG(st.st_mode) or st.st_size > dpkg_list_max:
            return None
        chunks, size = [], 0
        while chunk := os.read(fd, 1 << 20):
            chunks.append(chunk)
            size += len(chunk)
            if size > dpkg_list_max:
                return None
        return b"".join(chunks).decode("utf-8", "surrogateescape")
    except OSError:
        return None
    finally:
        os.close(fd)

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

# 2. A distribution whose files (RECORD) hold the module's; else an editable install whose
# project directory does (the deepest project's). An unreadable distribution is skipped: it
# may be none of ours.
if left:
    projects = []
    for dist in md.distributions():
        try:
            roots = forms(dist.locate_file(""))
            # Each file's first part is the top-level module or package it belongs to.
            owned = {os.path.join(root, f.parts[0]) for f in dist.files or () if f.parts for root in roots}
            mine = {top for top in left if paths[top] & owned}
            url = json.loads(dist.read_text("direct_url.json") or "{}")
            if url.get("dir_info", {}).get("editable") and url.get("url", "").startswith("file:"):
                from urllib.parse import unquote, urlsplit
                projects.append((os.path.realpath(unquote(urlsplit(url["url"]).path)), dist))
        except Exception:
            continue
        for top in mine:
            record(top, dist)
    left -= set(found)
    for top in sorted(left):
        holders = [(project, dist) for project, dist in projects if any(in_project(p, project) for p in paths[top])]
        if holders:
            record(top, max(holders, key=lambda h: len(h[0]))[1])
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
try:
    lists = sorted(e.path for e in os.scandir(dpkg_info) if e.name.endswith(".list")) if left else []
except OSError:
    lists = []
if lists:
    wanted = {p: top for top in left for p in paths[top]}
    for path in lists:
        text = read_list(path)
        if text is None:
            continue
        text = "\n" + text + "\n"
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
    given = json.dumps({"path": list(path), "modules": modules, "dpkg_info": dpkg_info,
                        "dpkg_list_max": DPKG_LIST_MAX}).encode()
    # The input, however large, in a memory file the child reads as its stdin: nothing to
    # write while the child runs, so no deadlock with what it prints.
    try:
        data = os.memfd_create("readie-packages")
    except OSError as e:
        return {"error": f"cannot pass the modules to the metadata reader: {e}"}
    try:
        view = memoryview(given)
        while view:
            view = view[os.write(data, view):]
        os.lseek(data, 0, os.SEEK_SET)
        r, w = os.pipe()
    except OSError as e:
        os.close(data)
        return {"error": f"cannot pass the modules to the metadata reader: {e}"}
    try:
        pid = os.posix_spawn(exe, [exe, "-c", CHILD], os.environ,
                             file_actions=[(os.POSIX_SPAWN_DUP2, data, 0), (os.POSIX_SPAWN_DUP2, w, 1), (os.POSIX_SPAWN_CLOSE, r)])
    except OSError as e:
        os.close(r)
        return {"error": f"cannot start {exe}: {e}"}
    finally:
        os.close(w)
        os.close(data)
    chunks, size = [], 0
    with os.fdopen(r, "rb") as f:
        while size <= OUTPUT_MAX and (chunk := f.read(65536)):
            chunks.append(chunk)
            size += len(chunk)
        if size > OUTPUT_MAX:
            os.kill(pid, SIGKILL)
    _, status = os.waitpid(pid, 0)
    out = b"".join(chunks)
    if size > OUTPUT_MAX:
        return {"error": f"the metadata reader printed more than {OUTPUT_MAX} bytes: {out[:200]!r}"}
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
