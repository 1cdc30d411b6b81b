"""deploy/proxy: HAProxy (Debian's, with Lua) in front of two keyflowd
processes of one data set routes each HTTP call to the process serving its
key's partition (docs/scaling.md). Keyed calls over many keys succeed
through the proxy (a wrong hash or a wrong owner would be a 421), percent-
encoded keys included; /nodes/NAME/... reaches one node.

gRPC through the same proxy (HTTP/2 without TLS) is routed by the
`keyflow-workflow` + `keyflow-key` metadata of a coordinator or the
`keyflow-key` of a function key (`keyflow-run-id` for a run): SendEvent
over many keys lands each in its owner (a misrouted call would be refused),
GetRun reaches each run, and a header naming another
partition's key sends the call to a node that refuses it with the owner.

One process is killed (SIGKILL) and restarted behind the proxy: only its
partitions are unavailable meanwhile, and every event acknowledged before
and after is in its run afterwards.

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

harness.stubs()
import grpc  # noqa: E402
from keyflow.v1 import coordinators_pb2 as C  # noqa: E402
from keyflow.v1 import coordinators_pb2_grpc as CG  # noqa: E402
from keyflow.v1 import functions_pb2 as F  # noqa: E402
from keyflow.v1 import functions_pb2_grpc as FG  # noqa: E402
from keyflow.v1 import runs_pb2 as R  # noqa: E402
from keyflow.v1 import runs_pb2_grpc as RG  # noqa: E402

_spec = importlib.util.spec_from_file_location(
    "kf_partitions", os.path.join(harness.ROOT, "clients", "python", "keyflow", "partitions.py"))
partitions = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(partitions)

MAKE_CONFIG = os.path.join(harness.ROOT, "deploy", "proxy", "make-haproxy-config.sh")
COUNT = 4
NODES = (("node-a", "0-1"), ("node-b", "2-3"))
# What the proxy answers for a node that is down: 503 (no server), 502 (the
# connection failed), or a closed connection (0).
DOWN = (0, 502, 503)


class UnixHTTPConnection(http.client.HTTPConnection):
    def __init__(self, path):
        super().__init__("127.0.0.1", timeout=30)
        self.socket_path = path

    def connect(self):
        self.sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        self.sock.settimeout(30)
        self.sock.connect(self.socket_path)


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
        # haproxy binds the socket (so the file exists) some time before it
        # listens on it: until then a connection is refused. Under load that
        # gap failed the first tests (ECONNREFUSED), so wait for a connection.
        deadline = time.monotonic() + 30
        while not cls.proxy_accepts():
            if cls.proxy.poll() is not None or time.monotonic() > deadline:
                cls.tearDownClass()
                raise RuntimeError("haproxy did not start")
            time.sleep(0.02)

    @classmethod
    def proxy_accepts(cls):
        probe = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        try:
            probe.connect(cls.socket)
            return True
        except (FileNotFoundError, ConnectionRefusedError):
            return False
        finally:
            probe.close()

    @classmethod
    def tearDownClass(cls):
        if getattr(cls, "proxy", None) is not None:
            cls.proxy.terminate()
            cls.proxy.wait(30)
            cls.proxy = None
            cls.log.close()
        for s in getattr(cls, "servers", []):
            if s.proc is not None:
                harness.stopped(s)
        shutil.rmtree(cls.dir, True)

    def request(self, method, path, body=None):
        conn = UnixHTTPConnection(self.socket)
        try:
            data = json.dumps(body).encode() if body is not None else None
            try:
                conn.request(method, path, body=data, headers={
                    "Host": "127.0.0.1", "Content-Type": "application/json"})
            except (BrokenPipeError, ConnectionResetError):
                pass  # the proxy answered (503) before reading the body: read it
            try:
                resp = conn.getresponse()
            except (ConnectionError, http.client.HTTPException) as e:
                return 0, str(e)  # closed without an answer
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

    def send(self, wf, key, event_id):
        q = urllib.parse.quote(key, safe="")
        return self.request("POST", "/v1/workflows/%s/keys/%s/events" % (wf, q), {
            "rule": {"kind": "batch", "maxEvents": 1}, "input": key, "id": event_id})

    def test_z_a_killed_process_loses_only_its_partitions_and_nothing_acknowledged(self):
        """Runs last (z): it kills and restarts node-b under the proxy."""
        wf = "crash-%s" % uuid.uuid4().hex[:8]
        keys = ["k%d" % i for i in range(24)]
        node_of = {k: partitions.of_coordinator(wf, k, COUNT) // 2 for k in keys}
        self.assertEqual(set(node_of.values()), {0, 1})
        acked = {}  # event id -> run id
        for k in keys:
            status, doc = self.send(wf, k, k + "-0")
            self.assertEqual(status, 200, doc)
            acked[k + "-0"] = doc["receipt"]["runId"]
        b = self.servers[1]
        grpc_port, http_port = b.grpc_port, b.http_port
        b.kill()  # SIGKILL: a crash
        for k in keys:
            status, doc = self.send(wf, k, k + "-1")
            if node_of[k] == 0:
                self.assertEqual(status, 200, (k, doc))  # the other partitions go on
                acked[k + "-1"] = doc["receipt"]["runId"]
            else:
                self.assertIn(status, DOWN, (k, doc))  # only its own are unavailable
        b.args = list(b.args) + ["--grpc", "127.0.0.1:%d" % grpc_port,
                                 "--http", "127.0.0.1:%d" % http_port]
        b.start()
        deadline = time.monotonic() + 60
        for k in keys:
            if node_of[k] == 1:
                while True:
                    status, doc = self.send(wf, k, k + "-1")
                    if status == 200:
                        acked[k + "-1"] = doc["receipt"]["runId"]
                        break
                    self.assertIn(status, DOWN, (k, doc))
                    self.assertLess(time.monotonic(), deadline, "node-b never came back")
                    time.sleep(0.1)
        # Every acknowledged event is in its run, on its key's one process; a
        # retry of one acknowledged before the crash is a duplicate of it.
        for event_id, run_id in acked.items():
            key = event_id.rsplit("-", 1)[0]
            status, run = self.request("GET", "/v1/runs/%s" % urllib.parse.quote(run_id, safe=""))
            self.assertEqual(status, 200, (event_id, run))
            self.assertEqual((run["key"], run["eventIds"]), (key, [event_id]))
            self.assertEqual(partitions.of_run_id(run_id, COUNT),
                             partitions.of_coordinator(wf, key, COUNT))
        for k in keys:
            status, doc = self.send(wf, k, k + "-0")
            self.assertEqual(status, 200, doc)
            self.assertEqual(doc["receipt"]["runId"], acked[k + "-0"], k)
            self.assertEqual(doc.get("disposition"), "DISPOSITION_DUPLICATE", doc)

    def test_a_node_by_its_name(self):
        for (name, parts) in NODES:
            status, doc = self.request("GET", "/nodes/%s/v1/partitions" % name)
            self.assertEqual((status, doc.get("node"), doc.get("served")), (200, name, parts))

    def register_everywhere(self):
        """Registers rs_proxy on every node (again: the same descriptor)."""
        with open(os.path.join(harness.BUILD, "handlers", "running_sum.descriptor.json")) as f:
            d = json.load(f)
        d["functionId"] = "rs_proxy"
        d["pipelineStateId"] = "rs_proxy.state"
        d["placement"] = "split"  # its keys spread over the nodes, as the proxy routes them
        for name, _ in NODES:  # registration reaches every node
            status, doc = self.request("POST", "/nodes/%s/v1/functions" % name, d)
            self.assertEqual(status, 200, doc)

    def test_a_function_key_reaches_its_process(self):
        self.register_everywhere()
        users = ("ann", "bob", "cid", "dee", "eve", "fay")
        self.assertEqual({partitions.of_key([u], COUNT) // 2 for u in users}, {0, 1})
        for user in users:
            status, doc = self.request("GET", "/v1/functions/rs_proxy/keys/%s" % user)
            self.assertEqual(status, 200, (user, doc))


    def grpc_send(self, coords, wf, key, header_key):
        event = C.Event(rule=C.Rule(kind=C.RULE_KIND_BATCH, max_events=1),
                        input_json=json.dumps(key))
        return coords.SendEvent(C.SendEventRequest(workflow=wf, key=key, event=event), timeout=30,
                                metadata=(("keyflow-workflow", urllib.parse.quote(wf, safe="")),
                                          ("keyflow-key", urllib.parse.quote(header_key,
                                                                             safe=""))))

    def test_grpc_by_the_keyflow_key_header(self):
        wf = "grpc-%s" % uuid.uuid4().hex[:8]
        keys = ["k%d" % i for i in range(24)] + ["a b/c", "ünï", "x%y", "p,q"]
        node_of = {k: partitions.of_coordinator(wf, k, COUNT) // 2 for k in keys}
        self.assertEqual(set(node_of.values()), {0, 1})
        with grpc.insecure_channel("unix:" + self.socket) as channel:
            coords = CG.CoordinatorsStub(channel)
            runs = RG.RunsStub(channel)
            for k in keys:  # each lands in its owner: another node would refuse it
                resp = self.grpc_send(coords, wf, k, k)
                run_id = resp.receipt.run_id
                self.assertEqual(partitions.of_run_id(run_id, COUNT),
                                 partitions.of_coordinator(wf, k, COUNT), k)
                # A run by `keyflow-run-id`: the partition in the ID.
                run = runs.GetRun(R.GetRunRequest(run_id=run_id), timeout=30, metadata=(
                    ("keyflow-run-id", urllib.parse.quote(run_id, safe="")),))
                self.assertEqual((run.run_id, run.key), (run_id, k))
            # A header naming a key of the other node's partitions: that node
            # refuses the call with the owner; nothing goes to a wrong store.
            a = next(k for k in keys if node_of[k] == 0)
            b = next(k for k in keys if node_of[k] == 1)
            for key, header_key, owner in ((a, b, "node-a"), (b, a, "node-b")):
                with self.assertRaises(grpc.RpcError) as ctx:
                    self.grpc_send(coords, wf, key, header_key)
                self.assertEqual(ctx.exception.code(), grpc.StatusCode.FAILED_PRECONDITION,
                                 ctx.exception.details())
                trailers = dict(ctx.exception.trailing_metadata())
                self.assertEqual(trailers["keyflow-owner-node"], owner)

            # A function key: `keyflow-key` alone.
            self.register_everywhere()
            functions = FG.FunctionsStub(channel)
            users = ("ann", "bob", "cid", "dee", "eve", "fay")
            self.assertEqual({partitions.of_key([u], COUNT) // 2 for u in users}, {0, 1})
            for user in users:
                resp = functions.GetKeyState(
                    F.GetKeyStateRequest(function_id="rs_proxy", key=user), timeout=30,
                    metadata=(("keyflow-key", user),))
                self.assertEqual(resp.state, F.STATE_KIND_ABSENT, user)
            ann_node = partitions.of_key(["ann"], COUNT) // 2
            other = next(u for u in users if partitions.of_key([u], COUNT) // 2 != ann_node)
            with self.assertRaises(grpc.RpcError) as ctx:
                functions.GetKeyState(F.GetKeyStateRequest(function_id="rs_proxy", key="ann"),
                                      timeout=30, metadata=(("keyflow-key", other),))
            self.assertEqual(ctx.exception.code(), grpc.StatusCode.FAILED_PRECONDITION)
            self.assertEqual(dict(ctx.exception.trailing_metadata())["keyflow-owner-node"],
                             NODES[ann_node][0])


if __name__ == "__main__":
    unittest.main()
