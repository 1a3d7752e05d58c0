"""The built executor image. Needs root (chroot) and a rootfs from `make image`; `make test`
provides both. Never skipped: without them the tests fail and say how to get them."""

import filecmp
import json
import os
import subprocess
import unittest

HERE = os.path.dirname(os.path.abspath(__file__))
EXECUTOR = os.path.dirname(HERE)
BUILD = os.path.join(EXECUTOR, "build-image.sh")


def rootfs():
    path = os.environ.get("READIE_ROOTFS")
    if not path or not os.path.isdir(path):
        raise AssertionError(f"READIE_ROOTFS={path!r} is not a built rootfs: run `make test` (it runs `make image`)")
    return os.path.realpath(path)


def snapshot(root):
    """Every path under root with its modification time and size."""
    seen = {}
    for dirpath, dirnames, filenames in os.walk(root):
        for name in dirnames + filenames:
            st = os.lstat(os.path.join(dirpath, name))
            seen[os.path.join(dirpath, name)] = (st.st_mtime_ns, st.st_size)
    return seen


class ImageTest(unittest.TestCase):
    def test_imports_in_chroot(self):
        result = subprocess.run(
            ["chroot", rootfs(), "python3", "-c",
             "import readie_executor.server, cloudpickle, numpy, pandas; print(numpy.__version__, pandas.__version__)"],
            capture_output=True, text=True, timeout=120)
        self.assertEqual(result.returncode, 0, result.stderr)

    def test_image_metadata(self):
        root = rootfs()
        with open(os.path.join(root, "usr/lib/readie/image.json")) as f:
            image = json.load(f)
        self.assertRegex(image["digest"], r"^sha256:[0-9a-f]{64}$")
        self.assertRegex(image["base_digest"], r"^sha256:[0-9a-f]{64}$")
        self.assertRegex(image["executor_digest"], r"^sha256:[0-9a-f]{64}$")
        with open(os.path.join(root, "etc/readie-resolv.conf")) as f:
            self.assertIn("nameserver", f.read())
        # The root is read-only in a sandbox: the resolver file lives in its /tmp.
        self.assertEqual(os.readlink(os.path.join(root, "etc/resolv.conf")), "../tmp/resolv.conf")
        self.assertTrue(os.path.isfile(os.path.join(root, "usr/lib/readie/testing/readie_test_block.py")))
        # Named by its digest: a manifest's path names one content forever.
        self.assertEqual(os.path.basename(os.path.dirname(root)), image["digest"].replace(":", "-"))

    def test_rebuild_reuses_both_layers_and_holds_the_current_executor(self):
        before = snapshot(rootfs())
        result = subprocess.run([BUILD], capture_output=True, text=True, timeout=600)
        self.assertEqual(result.returncode, 0, result.stderr)
        self.assertRegex(result.stderr, r"package layer \S+ reused")
        self.assertRegex(result.stderr, r'msg="rootfs reused" digest="sha256:[0-9a-f]{64}"')
        self.assertNotIn("building package layer", result.stderr)
        built = result.stdout.strip().splitlines()[-1]
        self.assertEqual(os.path.realpath(built), rootfs())
        # A rebuild writes nothing into a rootfs that manifests may name.
        self.assertEqual(snapshot(rootfs()), before)
        with open(os.path.join(built, "usr/lib/readie/image.json")) as f:
            site = json.load(f)["site_packages"].lstrip("/")
        installed = os.path.join(built, site, "readie_executor")
        source = os.path.join(EXECUTOR, "readie_executor")
        names = sorted(n for n in os.listdir(source) if n.endswith(".py"))
        match, mismatch, errors = filecmp.cmpfiles(source, installed, names, shallow=False)
        self.assertEqual((mismatch, errors), ([], []), "the image holds a stale executor")


if __name__ == "__main__":
    unittest.main()
