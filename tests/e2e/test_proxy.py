"""deploy/proxy: HAProxy (Debian's, with Lua) in front of two keyflowd
processes of one data set routes each HTTP call to the process serving its
key's partition (docs/scaling.md). Keyed calls over many keys succeed
through the proxy (a wrong hash or a wrong owner would be a 421), percent-
encoded keys included; /nodes/NAME/... reaches one node.

Real keyflowd processes and a real haproxy, listening on a unix socket in
the test's directory (no port to pick); skipped when haproxy is not
installed (dev.sh installs it).
"""

import http.client
import importlib.util
import json
import os
import shutil
import socket
import subprocess
import sys
import tempfile
import time
import unittest
import urllib.parse
import uuid

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import harness  # noqa: E402

_spec = importlib.util.spec_from_file_location(
    "kf_partitions", os.path.join(harness.ROOT, "clients", "python", "keyflow", "partitions.py"))
partitions = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(partitions)

MAKE_CONFIG = os.path.join(harness.ROOT, "deploy", "proxy", "make-haproxy-config.sh")
COUNT = 4
NODES = (("node-a", "0-1"), ("node-b", "2-3"))


class UnixHTTPConnection(http.client.HTTPConnection):
    def __init__(self, path):
        super().__init__("127.0.0.1", timeout=30)
        self.socket_path = path

    def connect(self):
        self.sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        self.sock.settimeout(30)
        self.sock.connect(self.socket_path)


def stopped(server):
    code = server.stop()
    log = server.read_log()
    server.cleanup()
    assert code == 0, "keyflowd exited %s; log:\n%s" % (code, log)


class Proxy(unittest.TestCase):

    @classmethod
    def setUpClass(cls):
        if shutil.which("haproxy") is None:
            raise unittest.SkipTest("haproxy is not installed (dev.sh installs it)")
        cls.dir = tempfile.mkdtemp(prefix="kf-proxy-")
        # keyflowd's placement names the nodes; their ports are known only
        # once they listen, so the proxy's copy of it has the real addresses.
        served = os.path.join(cls.dir, "placement.served")
        with open(served, "w") as f:
            f.write("partitions %d\n" % COUNT)
            for name, parts in NODES:
                f.write("node %s %s %s.example:50051 %s.example:8070\n" % (name, parts, name, name))
        cls.servers = [harness.Keyflowd(args=["--partition-count", str(COUNT), "--placement",
                                              served, "--node", name, "--plugin-dir",
                                              os.path.join(harness.BUILD, "handlers")]).start()
                       for name, _ in NODES]
        proxied = os.path.join(cls.dir, "placement")
        with open(proxied, "w") as f:
            f.write("# the proxy's copy\npartitions %d\n" % COUNT)
            for (name, parts), srv in zip(NODES, cls.servers):
                f.write("node %s %s %s 127.0.0.1:%d\n" % (name, parts, srv.grpc_target,
                                                          srv.http_port))
        cls.socket = os.path.join(cls.dir, "proxy.sock")
        cfg = os.path.join(cls.dir, "haproxy.cfg")
        with open(cfg, "w") as f:
            subprocess.run([MAKE_CONFIG, proxied, "unix@" + cls.socket], stdout=f, check=True)
        cls.log = open(os.path.join(cls.dir, "haproxy.log"), "wb")
        cls.proxy = subprocess.Popen(["haproxy", "-db", "-f", cfg], stdout=cls.log,
                                     stderr=subprocess.STDOUT)
        deadline = time.monotonic() + 30
        while not os.path.exists(cls.socket):
            if cls.proxy.poll() is not None or time.monotonic() > deadline:
                cls.tearDownClass()
                raise RuntimeError("haproxy did not start")
            time.sleep(0.02)

    @classmethod
    def tearDownClass(cls):
        if getattr(cls, "proxy", None) is not None:
            cls.proxy.terminate()
            cls.proxy.wait(30)
            cls.proxy = None
            cls.log.close()
        for s in getattr(cls, "servers", []):
            if s.proc is not None:
                stopped(s)
        shutil.rmtree(cls.dir, True)

    def request(self, method, path, body=None):
        conn = UnixHTTPConnection(self.socket)
        try:
            data = json.dumps(body).encode() if body is not None else None
            conn.request(method, path, body=data, headers={
                "Host": "127.0.0.1", "Content-Type": "application/json"})
            resp = conn.getresponse()
            text = resp.read().decode()
            try:
                return resp.status, json.loads(text)
            except ValueError:
                return resp.status, text
        finally:
            conn.close()

    def test_keyed_calls_reach_the_key_s_process(self):
        wf = "wf-%s" % uuid.uuid4().hex[:8]
        keys = ["k%d" % i for i in range(24)] + ["a b/c", "ünï", "x%y"]
        self.assertEqual({partitions.of_coordinator(wf, k, COUNT) // 2 for k in keys}, {0, 1})
        for k in keys:
            q = urllib.parse.quote(k, safe="")
            status, doc = self.request("POST", "/v1/workflows/%s/keys/%s/events" % (wf, q),
                                       {"rule": {"kind": "batch", "maxEvents": 1}, "input": k})
            self.assertEqual(status, 200, (k, doc))
            run_id = doc["receipt"]["runId"]
            self.assertEqual(partitions.of_run_id(run_id, COUNT),
                             partitions.of_coordinator(wf, k, COUNT), k)
            status, run = self.request("GET", "/v1/runs/%s" % urllib.parse.quote(run_id, safe=""))
            self.assertEqual((status, run.get("key")), (200, k), run)
            status, desc = self.request("GET", "/v1/coordinators/batch/%s/%s" % (wf, q))
            self.assertEqual(status, 200, (k, desc))

    def test_a_node_by_its_name(self):
        for (name, parts) in NODES:
            status, doc = self.request("GET", "/nodes/%s/v1/partitions" % name)
            self.assertEqual((status, doc.get("node"), doc.get("served")), (200, name, parts))

    def test_a_function_key_reaches_its_process(self):
        with open(os.path.join(harness.BUILD, "handlers", "running_sum.descriptor.json")) as f:
            d = json.load(f)
        d["functionId"] = "rs_proxy"
        d["pipelineStateId"] = "rs_proxy.state"
        for name, _ in NODES:  # registration reaches every node
            status, doc = self.request("POST", "/nodes/%s/v1/functions" % name, d)
            self.assertEqual(status, 200, doc)
        users = ("ann", "bob", "cid", "dee", "eve", "fay")
        self.assertEqual({partitions.of_key([u], COUNT) // 2 for u in users}, {0, 1})
        for user in users:
            status, doc = self.request("GET", "/v1/functions/rs_proxy/keys/%s" % user)
            self.assertEqual(status, 200, (user, doc))


if __name__ == "__main__":
    unittest.main()
