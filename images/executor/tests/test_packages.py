"""The packages report of capture mode (readie_executor.packages), on the host: the child
interpreter maps loaded modules to their distributions and versions without this process
importing importlib.metadata, on synthetic site-packages trees of every layout it knows. The
same report inside real sandboxes, on real images (Debian 12 and 13, a venv), is tested by the
Go suite (pkg/capture TestPackages, cmd/pipeline TestDebian13Image and TestVenvImage)."""

import importlib.metadata
import importlib.util
import json
import os
import sys
import tempfile
import types
import unittest
from unittest import mock

import cloudpickle  # noqa: F401 (loaded, so the report must name its distribution)

from readie_executor import checkpoint, cpucount, packages
from tests.test_executor import EXECUTOR_ROOT, run_executor


def write(path, text=""):
    os.makedirs(os.path.dirname(path), exist_ok=True)
    with open(path, "w") as f:
        f.write(text)


def dist_info(site, dirname, name, version, **files):
    """A metadata directory site/dirname with METADATA (or PKG-INFO for an .egg-info) naming
    name and version, and files (RECORD, top_level.txt, direct_url.json: "." for "_")."""
    meta = "PKG-INFO" if dirname.endswith(".egg-info") else "METADATA"
    write(os.path.join(site, dirname, meta), f"Metadata-Version: 2.1\nName: {name}\nVersion: {version}\n")
    for file, text in files.items():
        write(os.path.join(site, dirname, file.replace("_txt", ".txt").replace("_json", ".json")), text)


class Layouts(unittest.TestCase):
    """One tree per layout, all on one sys.path, mapped by one child (each child costs a
    Python start-up)."""

    @classmethod
    def setUpClass(cls):
        cls.tmp = tempfile.TemporaryDirectory()
        root = cls.tmp.name
        site = cls.site = os.path.join(root, "site-packages")
        other = cls.other = os.path.join(root, "other-site")
        cls.dpkg = os.path.join(root, "dpkg-info")
        mods = cls.modules = {}

        # Debian 13's numpy: a .dist-info without RECORD and without top_level.txt (meson),
        # named as its module: found by its name, in the directory the module came from.
        write(os.path.join(site, "debnumpy/__init__.py"))
        dist_info(site, "debnumpy-2.2.4.dist-info", "debnumpy", "2.2.4", WHEEL="", INSTALLER="debian\n")
        mods["debnumpy"] = [os.path.join(site, "debnumpy")]
        # The same name in a directory earlier on sys.path, not where the module came from.
        dist_info(other, "debnumpy-1.0.dist-info", "debnumpy", "1.0")

        # A Debian package whose module is not named as its distribution (attr of attrs,
        # hatchling-built, RECORD removed): only dpkg's file list ties them.
        write(os.path.join(site, "debattr/__init__.py"))
        dist_info(site, "debattrs-23.2.0.dist-info", "debattrs", "23.2.0", WHEEL="")
        write(os.path.join(cls.dpkg, "python3-debattr.list"), "\n".join([
            "/.", os.path.dirname(site), site, os.path.join(site, "debattr"), os.path.join(site, "debattr/__init__.py"),
            os.path.join(site, "debattrs-23.2.0.dist-info"), os.path.join(site, "debattrs-23.2.0.dist-info/METADATA")]) + "\n")
        # A package without metadata that lists the module's directory too, read first.
        write(os.path.join(cls.dpkg, "python3-debattr-dev.list"), "\n".join(["/.", site, os.path.join(site, "debattr")]) + "\n")
        write(os.path.join(cls.dpkg, "python3-debattr.md5sums"), "0 " + os.path.join(site, "debnumpy/__init__.py") + "\n")
        write(os.path.join(cls.dpkg, "libc6.list"), "/.\n/usr\n/usr/lib\n")
        mods["debattr"] = [os.path.join(site, "debattr")]

        # Debian 12's .egg-info: top_level.txt names the module.
        write(os.path.join(site, "eggmod.py"))
        dist_info(site, "Egg_Dist-1.5.3.egg-info", "Egg-Dist", "1.5.3", top_level_txt="eggmod\n")
        mods["eggmod"] = [os.path.join(site, "eggmod.py")]

        # A wheel pip installed: RECORD, no top_level.txt (meson-python, scikit-build-core).
        write(os.path.join(site, "wheelmod/__init__.py"))
        dist_info(site, "Wheel_Dist-3.0.dist-info", "Wheel.Dist", "3.0",
                  RECORD="wheelmod/__init__.py,sha256=x,0\nWheel_Dist-3.0.dist-info/RECORD,,\n")
        mods["wheelmod"] = [os.path.join(site, "wheelmod")]
        # A module that is one extension file: Python 3.11's packages_distributions() infers
        # names from .py files only; RECORD holds it.
        so = "fastext.cpython-311-x86_64-linux-gnu.so"
        write(os.path.join(site, so))
        dist_info(site, "fast_ext-0.9.dist-info", "fast-ext", "0.9", RECORD=f"{so},sha256=x,0\n")
        mods["fastext"] = [os.path.join(site, so)]

        # An editable install (hatchling's: a .pth names the project's src; RECORD holds only
        # the .pth): direct_url.json says editable and where the project is.
        project = os.path.join(root, "work/proj")
        write(os.path.join(project, "src/editmod/__init__.py"))
        dist_info(site, "edit_project-0.1.dev0.dist-info", "Edit-Project", "0.1.dev0",
                  RECORD="_edit_project.pth,sha256=x,0\n",
                  direct_url_json=json.dumps({"url": "file://" + project.replace(" ", "%20"), "dir_info": {"editable": True}}))
        write(os.path.join(site, "_edit_project.pth"), os.path.join(project, "src") + "\n")
        mods["editmod"] = [os.path.join(project, "src/editmod")]

        # uv's or poetry's layout: the editable project at app, its venv at app/.venv. The
        # project's module is the project's; a module of the venv's site-packages without
        # metadata is not: unmapped.
        app = os.path.join(root, "app")
        venv_site = os.path.join(app, ".venv/lib/python3.11/site-packages")
        write(os.path.join(app, "src/appmod/__init__.py"))
        dist_info(venv_site, "app-1.0.dist-info", "app", "1.0", RECORD="_app.pth,sha256=x,0\n",
                  direct_url_json=json.dumps({"url": "file://" + app, "dir_info": {"editable": True}}))
        write(os.path.join(venv_site, "_app.pth"), os.path.join(app, "src") + "\n")
        write(os.path.join(venv_site, "nometa.py"))
        mods["appmod"] = [os.path.join(app, "src/appmod")]
        mods["nometa"] = [os.path.join(venv_site, "nometa.py")]
        # pip install --target into an editable project's directory: the extension module is
        # the distribution's whose RECORD holds it, not the project's too.
        tool = os.path.join(root, "tool")
        vendor = os.path.join(tool, "vendor")
        dist_info(site, "tool-0.5.dist-info", "tool", "0.5", RECORD="_tool.pth,sha256=x,0\n",
                  direct_url_json=json.dumps({"url": "file://" + tool, "dir_info": {"editable": True}}))
        vso = "vendext.cpython-311-x86_64-linux-gnu.so"
        write(os.path.join(vendor, vso))
        dist_info(vendor, "vend_ext-2.0.dist-info", "vend-ext", "2.0", RECORD=f"{vso},sha256=x,0\n")
        mods["vendext"] = [os.path.join(vendor, vso)]

        # No metadata anywhere: unmapped. A distribution of its name elsewhere is not its.
        write(os.path.join(site, "orphan.py"))
        write(os.path.join(root, "elsewhere/lonely/__init__.py"))
        dist_info(site, "lonely-1.0.dist-info", "lonely", "1.0")
        mods["orphan"] = [os.path.join(site, "orphan.py")]
        mods["lonely"] = [os.path.join(root, "elsewhere/lonely")]
        # Not a distribution's: made at run time (Cython's), or of the interpreter's library.
        mods["_cython_3_0_11"] = []
        mods["_sysconfigdata_fake"] = [os.path.join(os.path.dirname(os.__file__), "_sysconfigdata_fake.py")]

        cls.path = [other, site, venv_site, vendor, *sys.path]
        cls.got = packages.query(cls.path, mods, cls.dpkg)

    @classmethod
    def tearDownClass(cls):
        cls.tmp.cleanup()

    def test_every_layout(self):
        self.assertEqual(self.got["packages"], {
            "debnumpy": "2.2.4", "debattrs": "23.2.0", "egg-dist": "1.5.3", "wheel-dist": "3.0",
            "fast-ext": "0.9", "edit-project": "0.1.dev0", "app": "1.0", "vend-ext": "2.0"}, self.got)
        self.assertEqual(self.got["errors"], {})
        self.assertEqual(self.got["unmapped"], ["lonely", "nometa", "orphan"])

    def test_without_dpkg(self):
        # On an image without dpkg, the module that only dpkg's list names is unmapped.
        got = packages.query(self.path, {"debattr": self.modules["debattr"]}, os.path.join(self.tmp.name, "none"))
        self.assertEqual((got["packages"], got["unmapped"]), ({}, ["debattr"]))


class DpkgLists(unittest.TestCase):
    """dpkg's info directory is the image's: a "*.list" that is not a regular file is skipped,
    and the lists that are still map the module."""

    def test_lists_that_are_not_files(self):
        with tempfile.TemporaryDirectory() as root:
            site, dpkg = os.path.join(root, "site-packages"), os.path.join(root, "dpkg-info")
            write(os.path.join(site, "debattr/__init__.py"))
            dist_info(site, "debattrs-23.2.0.dist-info", "debattrs", "23.2.0")
            os.makedirs(dpkg)
            # Sorted before the real list: each would stop the child before it is read.
            os.symlink(os.path.join(root, "missing"), os.path.join(dpkg, "a-dangling.list"))
            os.mkdir(os.path.join(dpkg, "b-dir.list"))
            os.mkfifo(os.path.join(dpkg, "c-fifo.list"))
            os.symlink("c-loop.list", os.path.join(dpkg, "c-loop.list"))
            os.symlink("/dev/zero", os.path.join(dpkg, "d-zero.list"))
            write(os.path.join(dpkg, "python3-debattr.list"), "\n".join([
                site, os.path.join(site, "debattr"), os.path.join(site, "debattrs-23.2.0.dist-info")]) + "\n")
            got = packages.query([site, *sys.path], {"debattr": [os.path.join(site, "debattr")]}, dpkg)
        self.assertEqual(got.get("packages"), {"debattrs": "23.2.0"}, got)
        self.assertEqual(got["unmapped"], [])

    def test_oversized_list_is_skipped(self):
        with tempfile.TemporaryDirectory() as root:
            site, dpkg = os.path.join(root, "site-packages"), os.path.join(root, "dpkg-info")
            write(os.path.join(site, "debattr/__init__.py"))
            dist_info(site, "debattrs-23.2.0.dist-info", "debattrs", "23.2.0")
            write(os.path.join(dpkg, "python3-debattr.list"), "\n".join([
                site, os.path.join(site, "debattr"), os.path.join(site, "debattrs-23.2.0.dist-info")]) + "\n")
            with mock.patch.object(packages, "DPKG_LIST_MAX", 20):
                got = packages.query([site, *sys.path], {"debattr": [os.path.join(site, "debattr")]}, dpkg)
        self.assertEqual((got.get("packages"), got.get("unmapped")), ({}, ["debattr"]), got)


class PackagesTest(unittest.TestCase):
    def test_huge_closure(self):
        # More than a single argument's 128 KiB limit: passed on stdin, not argv.
        with tempfile.TemporaryDirectory() as d:
            where = [os.path.join(d, f"dir{i:05}", "readie_ns_zz") for i in range(4000)]
            modules = {f"readie_made_{i:05}_zz": [] for i in range(4000)}
            modules["readie_ns_zz"] = where
            self.assertGreater(len(json.dumps(modules)), 128 << 10)
            got = packages.query(sys.path, modules, os.path.join(d, "none"))
        self.assertEqual(got, {"packages": {}, "errors": {}, "unmapped": ["readie_ns_zz"]})

    def test_output_is_bounded(self):
        # A child that prints without end is cut off.
        with tempfile.TemporaryDirectory() as d:
            endless = f"{d}/python3"
            with open(endless, "w") as f:
                f.write("#!/bin/sh\nexec yes readie\n")
            os.chmod(endless, 0o755)
            with mock.patch.object(sys, "executable", endless):
                got = packages.read(["cloudpickle"])
        self.assertIn(f"printed more than {packages.OUTPUT_MAX} bytes", got.get("error", ""), got)

    def test_loaded_distributions(self):
        self.assertIn("cloudpickle", packages.loaded_top_levels())
        self.assertNotIn("json", packages.loaded_top_levels())
        got = packages.read()
        self.assertEqual(got["packages"]["cloudpickle"], importlib.metadata.version("cloudpickle"))
        self.assertEqual(got["errors"], {})
        # The tests' own package has no metadata; the executor's is left out.
        self.assertIn("tests", got["unmapped"])
        self.assertNotIn("readie_executor", got["unmapped"])

    def test_only_what_is_asked(self):
        self.assertEqual(packages.read(["no_such_module_zz"]), {"packages": {}, "errors": {}, "unmapped": []})

    def test_own_modules_are_never_unmapped(self):
        with tempfile.TemporaryDirectory() as d:
            write(os.path.join(d, "readie_orphan_zz.py"))
            spec = importlib.util.spec_from_file_location("readie_orphan_zz", os.path.join(d, "readie_orphan_zz.py"))
            with mock.patch.dict(sys.modules, {"readie_orphan_zz": importlib.util.module_from_spec(spec)}):
                self.assertEqual(packages.read(["readie_orphan_zz"])["unmapped"], ["readie_orphan_zz"])
                self.assertEqual(packages.read(["readie_orphan_zz"], own=["readie_orphan_zz"])["unmapped"], [])

    def test_origins(self):
        ns = types.ModuleType("readie_ns_zz")
        ns.__path__ = ["/a/readie_ns_zz", "/b/readie_ns_zz"]
        lazy = types.ModuleType("readie_lazy_zz")
        lazy.__spec__ = importlib.util.spec_from_loader("readie_lazy_zz", loader=None, origin="/c/readie_lazy_zz.so")

        def refuse(name):
            raise AssertionError(f"module __getattr__ called for {name}")
        lazy.__getattr__ = refuse
        made = types.ModuleType("readie_made_zz")
        made.__file__ = "relative.py"
        with mock.patch.dict(sys.modules, {"readie_ns_zz": ns, "readie_lazy_zz": lazy, "readie_made_zz": made, "readie_obj_zz": object()}):
            self.assertEqual(packages.origins("readie_ns_zz"), ["/a/readie_ns_zz", "/b/readie_ns_zz"])
            self.assertEqual(packages.origins("readie_lazy_zz"), ["/c/readie_lazy_zz.so"])
            self.assertEqual(packages.origins("readie_made_zz"), [])
            self.assertEqual(packages.origins("readie_obj_zz"), [])
        self.assertEqual(packages.origins("cloudpickle"), [os.path.dirname(cloudpickle.__file__)])

    def test_report_line(self):
        line = packages.report(["cloudpickle"])
        self.assertTrue(line.startswith(packages.REPORT_PREFIX))
        self.assertEqual(json.loads(line[len(packages.REPORT_PREFIX):]),
                         {"packages": {"cloudpickle": importlib.metadata.version("cloudpickle")}, "errors": {}, "unmapped": []})

    def test_noise_before_the_answer(self):
        # An image's sitecustomize may print: the answer is the child's last line.
        with tempfile.TemporaryDirectory() as d:
            noisy = f"{d}/python3"
            with open(noisy, "w") as f:
                f.write(f"#!/bin/sh\necho 'hello from sitecustomize'\nexec {sys.executable} \"$@\"\n")
            os.chmod(noisy, 0o755)
            with mock.patch.object(sys, "executable", noisy):
                self.assertEqual(packages.read(["cloudpickle"])["packages"],
                                 {"cloudpickle": importlib.metadata.version("cloudpickle")})

    def test_reader_failure_is_reported(self):
        with mock.patch.object(sys, "executable", "/bin/false"):
            self.assertIn("exited with status 1", packages.read(["cloudpickle"])["error"])
        with mock.patch.object(sys, "executable", "/nonexistent/python3"):
            self.assertIn("cannot start", packages.read(["cloudpickle"])["error"])
        with mock.patch.object(sys, "executable", "/bin/echo"):
            self.assertIn("printed", packages.read(["cloudpickle"])["error"])

    def test_capture_reports_before_the_checkpoint(self):
        with tempfile.TemporaryDirectory() as d:
            write(os.path.join(d, "lib/readie_orphan_zz.py"))
            result = run_executor(EXECUTOR_DIR=d, EXECUTOR_MODE="capture", READIE_PREIMPORT="json,readie_orphan_zz",
                                  PYTHONPATH=EXECUTOR_ROOT + os.pathsep + os.path.join(d, "lib"))
        # No gVisor on the host: the checkpoint fails (exit 4) after the report and the marker.
        self.assertEqual(result.returncode, 4, result.stderr)
        lines = result.stdout.splitlines()
        self.assertTrue(lines[0].startswith(cpucount.REPORT_PREFIX), lines)
        self.assertTrue(lines[1].startswith(packages.REPORT_PREFIX), lines)
        self.assertTrue(lines[2].startswith(checkpoint.MARKER), lines)
        got = json.loads(lines[1][len(packages.REPORT_PREFIX):])
        # The executor itself loads cloudpickle: every checkpoint holds it.
        self.assertEqual(got["packages"]["cloudpickle"], importlib.metadata.version("cloudpickle"))
        # The set's module without metadata is named; the executor's own modules are not.
        self.assertEqual(got["unmapped"], ["readie_orphan_zz"])


if __name__ == "__main__":
    unittest.main()
