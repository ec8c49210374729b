"""`pip install client/python` builds a working package: the stubs are generated while pip
builds it, and py.typed ships. Installed offline (--no-build-isolation: Debian's setuptools)
into a temporary --target directory from a copy of the sources, so the tree stays clean."""

import os
import shutil
import subprocess
import sys
import tempfile
import unittest

SOURCE_ROOT = os.path.abspath(os.path.join(os.path.dirname(__file__), "..", ".."))


def pip_available() -> bool:
    return subprocess.run([sys.executable, "-m", "pip", "--version"],
                          capture_output=True).returncode == 0


@unittest.skipUnless(pip_available(), "pip is not installed (Debian: python3-pip)")
class PackageInstallTest(unittest.TestCase):
    def test_pip_install_generates_stubs_and_ships_py_typed(self):
        with tempfile.TemporaryDirectory() as scratch:
            source = os.path.join(scratch, "src")
            shutil.copytree(os.path.join(SOURCE_ROOT, "client", "python"),
                            os.path.join(source, "client", "python"),
                            ignore=shutil.ignore_patterns("build", "*.egg-info", "__pycache__"))
            shutil.copytree(os.path.join(SOURCE_ROOT, "proto"), os.path.join(source, "proto"))
            target = os.path.join(scratch, "site")
            install = subprocess.run(
                [sys.executable, "-m", "pip", "install", "--no-build-isolation", "--no-deps",
                 "--no-index", "--target", target, os.path.join(source, "client", "python")],
                capture_output=True, text=True, timeout=240)
            self.assertEqual(install.returncode, 0, install.stdout + install.stderr)
            self.assertTrue(os.path.exists(os.path.join(target, "entrokv", "py.typed")))
            probe = subprocess.run(
                [sys.executable, "-c",
                 "import entrokv, entrokv.v1.cache_manager_pb2_grpc as g; "
                 "print(entrokv.__file__, g.CacheManagerStub.__name__, "
                 "issubclass(entrokv.NotFoundError, entrokv.EntrokvError))"],
                capture_output=True, text=True, timeout=60,
                env=dict(os.environ, PYTHONPATH=target))
            self.assertEqual(probe.returncode, 0, probe.stderr)
            installed_at, stub, subclass = probe.stdout.split()
            self.assertTrue(installed_at.startswith(target), installed_at)
            self.assertEqual((stub, subclass), ("CacheManagerStub", "True"))


if __name__ == "__main__":
    unittest.main()
