"""The SDK as a package: the in-tree build backend generates the stubs from
api/ and builds a wheel that imports on its own (no source tree on the path)."""

import os
import shutil
import subprocess
import sys
import tempfile
import unittest
import zipfile

SDK = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
API = os.path.join(os.path.dirname(os.path.dirname(SDK)), "api")


class PackageTest(unittest.TestCase):
    def setUp(self):
        self.tmp = tempfile.mkdtemp(prefix="kf-pkg-")

    def tearDown(self):
        shutil.rmtree(self.tmp, ignore_errors=True)

    def test_wheel_holds_generated_stubs_and_imports(self):
        # A copy without generated files: the backend must make them.
        src = os.path.join(self.tmp, "src")
        shutil.copytree(SDK, src, ignore=shutil.ignore_patterns(
            "v1", "build", "*.egg-info", "__pycache__", "tests"))
        self.assertFalse(os.path.exists(os.path.join(src, "keyflow", "v1")))
        dist = os.path.join(self.tmp, "dist")
        os.mkdir(dist)
        env = dict(os.environ, KEYFLOW_API_DIR=API)
        out = subprocess.run(
            [sys.executable, "-c", "import keyflow_build, sys; print(keyflow_build.build_wheel(sys.argv[1]))",
             dist], cwd=src, env=env, capture_output=True, text=True)
        self.assertEqual(out.returncode, 0, out.stderr[-4000:])
        wheel = os.path.join(dist, out.stdout.strip().splitlines()[-1])
        names = zipfile.ZipFile(wheel).namelist()
        for proto in sorted(os.listdir(os.path.join(API, "keyflow", "v1"))):
            stem = proto[:-len(".proto")]
            self.assertIn("keyflow/v1/%s_pb2.py" % stem, names)
            self.assertIn("keyflow/v1/%s_pb2_grpc.py" % stem, names)
        self.assertIn("keyflow/worker.py", names)

        site = os.path.join(self.tmp, "site")
        zipfile.ZipFile(wheel).extractall(site)
        check = subprocess.run(
            [sys.executable, "-c", "import keyflow, keyflow.v1.runs_pb2 as r; "
             "print(keyflow.__file__); print(r.RunStatus.Name(3))"],
            cwd=self.tmp, env=dict(os.environ, PYTHONPATH=site), capture_output=True, text=True)
        self.assertEqual(check.returncode, 0, check.stderr)
        where, status = check.stdout.split()
        self.assertTrue(where.startswith(site), where)
        self.assertEqual(status, "RUN_STATUS_COMPLETED")


if __name__ == "__main__":
    unittest.main()
