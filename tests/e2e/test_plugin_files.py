"""Which files of the plugin directory keyflowd may load (docs/security.md,
"Plugins"): only regular files, owned by root or keyflowd's user, not
writable by group or others. A symlink to a good plugin, or a copy anyone
may write, is skipped (the log says which and why), and the error a client
gets names the digest, never a path on the server. A FIFO named like a
plugin is skipped without blocking, at registration and at start (opening
one for reading used to wait for a writer forever, with the engine).
"""

import json
import os
import shutil
import stat
import sys
import tempfile
import unittest

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import harness  # noqa: E402

HANDLERS = os.path.join(harness.BUILD, "handlers")


class PluginFilesTest(unittest.TestCase):
    def setUp(self):
        so = os.path.join(HANDLERS, "running_sum.so")
        if not os.path.exists(so):
            self.skipTest("not built: %s" % so)
        self.dir = tempfile.mkdtemp(prefix="kf-plugins-")
        self.addCleanup(shutil.rmtree, self.dir, True)
        os.chmod(self.dir, 0o755)
        self.so = so
        with open(os.path.join(HANDLERS, "running_sum.descriptor.json")) as f:
            self.descriptor = json.load(f)
        self.server = harness.Keyflowd(args=["--plugin-dir", self.dir]).start()
        self.addCleanup(self.server.cleanup)

    def register(self, function_id):
        d = dict(self.descriptor, functionId=function_id, pipelineStateId=function_id + ".state")
        return self.server.http("POST", "/v1/functions", d)

    def test_only_trusted_regular_files_are_loaded(self):
        link = os.path.join(self.dir, "linked.so")
        os.symlink(self.so, link)
        writable = os.path.join(self.dir, "writable.so")
        shutil.copy(self.so, writable)
        os.chmod(writable, 0o666)
        foreign = None
        if os.geteuid() == 0:  # a file of another user (nobody), when the test may chown
            foreign = os.path.join(self.dir, "foreign.so")
            shutil.copy(self.so, foreign)
            os.chmod(foreign, 0o644)
            os.chown(foreign, 65534, 65534)
        status, body = self.register("fn-untrusted")
        self.assertEqual(status, 409, body)  # FAILED_PRECONDITION
        self.assertIn(self.descriptor["implementationDigest"], body["message"])
        self.assertNotIn(self.dir, body["message"])  # no server paths to clients
        log = self.server.read_log()
        self.assertIn("skipping %s: a symbolic link" % link, log)
        self.assertIn("skipping %s: writable by group or others" % writable, log)
        if foreign:
            self.assertIn("skipping %s: owned by neither root nor keyflowd's user" % foreign, log)
        # The same bytes as a file only its owner may write: loaded.
        os.chmod(writable, 0o644)
        status, body = self.register("fn-trusted")
        self.assertEqual(status, 200, body)
        self.assertTrue(stat.S_ISREG(os.lstat(writable).st_mode))
        self.assertEqual(self.server.stop(), 0)

    def test_a_fifo_is_skipped_without_blocking_the_engine(self):
        fifo = os.path.join(self.dir, "fifo.so")
        os.mkfifo(fifo, 0o644)
        status, body = self.register("fn-fifo")
        self.assertEqual(status, 409, body)  # no plugin has the digest
        self.assertIn("skipping %s: not a regular file" % fifo, self.server.read_log())
        # The engine goes on: a write after it answers.
        status, _ = self.server.http("POST", "/v1/workflows/wf/keys/k/events",
                                     {"rule": {"kind": "batch"}, "input": 1})
        self.assertEqual(status, 200)
        self.assertEqual(self.server.stop(), 0)

    def test_a_fifo_does_not_block_the_start(self):
        # A function whose plugin was there when it was registered ...
        shutil.copy(self.so, os.path.join(self.dir, "running_sum.so"))
        status, body = self.register("fn-before")
        self.assertEqual(status, 200, body)
        self.assertEqual(self.server.stop(), 0)
        # ... and at the next start only a FIFO: the start looks for the
        # plugin, skips the FIFO and comes up with the function unavailable.
        os.unlink(os.path.join(self.dir, "running_sum.so"))
        fifo = os.path.join(self.dir, "running_sum.so")
        os.mkfifo(fifo, 0o644)
        self.server.start()
        self.assertIn("skipping %s: not a regular file" % fifo, self.server.read_log())
        status, body = self.server.http("GET", "/v1/functions/fn-before")
        self.assertEqual(status, 200, body)
        self.assertEqual(self.server.http("GET", "/readyz")[0], 200)
        self.assertEqual(self.server.stop(), 0)


if __name__ == "__main__":
    unittest.main()
