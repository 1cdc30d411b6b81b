"""Revocation reaches calls that are already open (docs/security.md).

A key revoked while its calls wait must stop getting data at once: a
parked PollRuns (gRPC and HTTP), a GetRun waiting for its run, a
TailOutput stream and a Workers/Serve stream authenticated with it end
with UNAUTHENTICATED (HTTP 401), long before their waits would, and work
that appears afterwards goes to live keys only.

And the bootstrap admin key is never committed without its file: when
the file cannot be written, keyflowd refuses to start and stores nothing,
so the next start (with a writable path) makes the key.

Real keyflowd, real gRPC and HTTP clients; every wait has a deadline.
"""

import json
import os
import queue
import subprocess
import sys
import tempfile
import threading
import time
import unittest

import grpc  # noqa: E402  (before harness.stubs(): see test_functions_grpc.py)

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import harness  # noqa: E402

harness.stubs()
from google.protobuf import json_format  # noqa: E402
from keyflow.v1 import coordinators_pb2 as C  # noqa: E402
from keyflow.v1 import coordinators_pb2_grpc as CG  # noqa: E402
from keyflow.v1 import functions_pb2 as F  # noqa: E402
from keyflow.v1 import functions_pb2_grpc as FG  # noqa: E402
from keyflow.v1 import keys_pb2 as K  # noqa: E402
from keyflow.v1 import keys_pb2_grpc as KG  # noqa: E402
from keyflow.v1 import runs_pb2 as R  # noqa: E402
from keyflow.v1 import runs_pb2_grpc as RG  # noqa: E402
from keyflow.v1 import workers_pb2 as W  # noqa: E402

HANDLERS = os.path.join(harness.BUILD, "handlers")
WAIT_MS = 50000     # what the open calls would wait without the revocation
ENDED_S = 15        # far below WAIT_MS: the revocation, not the wait, ended them
WF = "rv-wf"
FN = "rv-fn"
DIGEST = "cd" * 32


def bearer(key):
    return [("authorization", "Bearer " + key)]


class Outcome:
    """The end of a call running on a thread: its answer or its error."""

    def __init__(self, fn):
        self.done = threading.Event()
        self.value = self.code = self.details = None

        def run():
            try:
                self.value = fn()
                self.code = grpc.StatusCode.OK
            except grpc.RpcError as e:
                self.code, self.details = e.code(), e.details()
            except Exception as e:  # noqa: BLE001  (reported by the test)
                self.code, self.details = "error", repr(e)
            self.done.set()
        threading.Thread(target=run, daemon=True).start()

    def wait(self, timeout, name="the call"):
        assert self.done.wait(timeout), "%s did not end within %d s" % (name, timeout)
        return self.code, self.details, self.value


class RevokeOpenCallsTest(unittest.TestCase):
    ARGS = []

    def setUp(self):
        if not os.path.exists(os.path.join(HANDLERS, "running_sum.so")):
            raise unittest.SkipTest("not built: handlers")
        self.server = harness.Keyflowd(args=["--auth", "--plugin-dir", HANDLERS] +
                                       self.ARGS).start()
        self.addCleanup(self.server.cleanup)
        self.addCleanup(lambda: self.assertEqual(self.server.stop(), 0, self.server.read_log()))
        with open(os.path.join(self.server.data_dir, "db", "bootstrap-admin.key")) as f:
            self.admin_key = f.read().strip()
        self.channel = grpc.insecure_channel(self.server.grpc_target)
        self.addCleanup(self.channel.close)
        self.keys = KG.KeysStub(self.channel)
        self.runs = RG.RunsStub(self.channel)
        self.fns = FG.FunctionsStub(self.channel)
        self.coords = CG.CoordinatorsStub(self.channel)
        self.admin = bearer(self.admin_key)

    def create_key(self, name, grants):
        resp = self.keys.CreateKey(K.CreateKeyRequest(
            name=name, grants=[K.Grant(scope=s, prefix=p) for s, p in grants]),
            metadata=self.admin, timeout=10)
        return resp.key.key_id, resp.api_key

    def register(self, fid, remote):
        with open(os.path.join(HANDLERS, "running_sum.descriptor.json")) as f:
            d = json.load(f)
        d["functionId"], d["pipelineStateId"] = fid, fid + ".state"
        if remote:
            d["runtime"], d["implementationDigest"] = "RUNTIME_REMOTE", DIGEST
        self.fns.RegisterFunction(F.RegisterFunctionRequest(
            descriptor=json_format.ParseDict(d, F.FunctionDescriptor())),
            metadata=self.admin, timeout=10)

    def send_run(self, key):
        """A run of WF ready at once (a batch of one event)."""
        return self.coords.SendEvent(C.SendEventRequest(workflow=WF, key=key, event=C.Event(
            input_json="1", rule=C.Rule(kind=C.RULE_KIND_BATCH, max_events=1))),
            metadata=self.admin, timeout=10)

    def wait_parked(self, metric, count):
        """Until keyflowd's gauge `metric` reaches count (the calls parked)."""
        end = time.monotonic() + ENDED_S
        while True:
            status, text = self.server.http("GET", "/metrics",
                                            headers={"Authorization": "Bearer " + self.admin_key})
            self.assertEqual(status, 200, text)
            value = sum(float(line.rsplit(" ", 1)[1]) for line in text.splitlines()
                        if line.startswith(metric + " ") or line.startswith(metric + "{"))
            if value >= count:
                return
            self.assertLess(time.monotonic(), end, "%s stayed at %s, not %d" % (metric, value, count))
            threading.Event().wait(0.05)

    def test_open_calls_of_a_revoked_key_end_unauthenticated(self):
        self.register(FN, remote=False)
        self.register(FN + "-remote", remote=True)
        key_id, key = self.create_key("victim", [
            ("runs:work", ""), ("runs:read", ""), ("functions:read", ""),
            ("functions:serve", "")])
        md = bearer(key)
        # A finished-later run that GetRun waits for: pending, never completed.
        pending = self.send_run("k-get")
        got = self.runs.PollRuns(R.PollRunsRequest(workflows=[WF], worker_id="admin",
                                                   lease_ms=600000), metadata=self.admin,
                                 timeout=10).runs
        self.assertEqual([r.run_id for r in got], [pending.receipt.run_id])

        poll = Outcome(lambda: self.runs.PollRuns(R.PollRunsRequest(
            workflows=[WF], worker_id="victim", lease_ms=600000, wait_ms=WAIT_MS),
            metadata=md, timeout=WAIT_MS / 1000 + 10))
        get = Outcome(lambda: self.runs.GetRun(R.GetRunRequest(
            run_id=pending.receipt.run_id, wait_ms=WAIT_MS), metadata=md, timeout=WAIT_MS / 1000 + 10))
        tail_stream = self.fns.TailOutput(F.TailOutputRequest(function_id=FN), metadata=md,
                                          timeout=WAIT_MS / 1000 + 10)
        tail = Outcome(lambda: list(tail_stream))
        http_poll = Outcome(lambda: self.server.http(
            "POST", "/v1/runs:poll", {"workerId": "victim-http", "workflows": [WF],
                                      "leaseMs": 600000, "waitMs": WAIT_MS},
            headers={"Authorization": "Bearer " + key}))
        inbox = queue.SimpleQueue()
        out = queue.SimpleQueue()
        out.put(W.WorkerMessage(hello=W.WorkerHello(
            function_id=FN + "-remote", implementation_digest=DIGEST, max_concurrent_calls=1,
            worker_name="victim")))

        def requests():
            while True:
                item = out.get()
                if item is None:
                    return
                yield item
        serve = self.channel.stream_stream(
            "/keyflow.v1.Workers/Serve", request_serializer=lambda m: m.SerializeToString(),
            response_deserializer=W.ServerMessage.FromString)(requests(), metadata=md,
                                                              timeout=WAIT_MS / 1000 + 10)
        self.addCleanup(lambda: (out.put(None), serve.cancel()))
        worker = Outcome(lambda: [inbox.put(m) for m in serve])
        welcome = inbox.get(timeout=ENDED_S)
        self.assertEqual(welcome.WhichOneof("message"), "welcome")
        # Every call is open and waiting in keyflowd.
        self.wait_parked("keyflow_parked_polls", 2)
        self.wait_parked("keyflow_parked_reads", 1)
        for o in (poll, get, tail, http_poll, worker):
            self.assertFalse(o.done.is_set(), (o.code, o.details, o.value))

        self.keys.RevokeKey(K.RevokeKeyRequest(key_id=key_id), metadata=self.admin, timeout=10)

        for name, o in (("PollRuns", poll), ("GetRun", get), ("TailOutput", tail),
                        ("Workers/Serve", worker)):
            code, details, value = o.wait(ENDED_S, name)
            self.assertEqual(code, grpc.StatusCode.UNAUTHENTICATED, (name, details, value))
            self.assertIn("revoked", details, name)
        _, _, (status, body) = http_poll.wait(ENDED_S, "HTTP PollRuns")
        self.assertEqual(status, 401, body)
        self.assertIn("revoked", json.dumps(body))
        # Work that comes now goes to live keys only: no parked call of the
        # revoked key took it.
        fresh = self.send_run("k-after")
        got = self.runs.PollRuns(R.PollRunsRequest(workflows=[WF], worker_id="admin",
                                                   lease_ms=600000, wait_ms=5000),
                                 metadata=self.admin, timeout=10).runs
        self.assertEqual([r.run_id for r in got], [fresh.receipt.run_id])
        # And the key is refused for new calls too.
        with self.assertRaises(grpc.RpcError) as cm:
            self.runs.ListRuns(R.ListRunsRequest(), metadata=md, timeout=10)
        self.assertEqual(cm.exception.code(), grpc.StatusCode.UNAUTHENTICATED)


class RevokeOpenCallsPartitionedTest(RevokeOpenCallsTest):
    """The same with several partitions: the keys live in the home engine,
    the parked calls in the partitions' engines, which must notice."""
    ARGS = ["--partition-count", "4"]


class BootstrapKeyFileTest(unittest.TestCase):
    """The bootstrap admin key is written (and fsynced) before it is
    committed: if its file cannot be written, nothing is stored."""

    def start(self, data, key_file):
        return subprocess.run([harness.KEYFLOWD, "--data", os.path.join(data, "db"), "--grpc",
                               "127.0.0.1:0", "--http", "127.0.0.1:0", "--auth",
                               "--bootstrap-key-file", key_file],
                              capture_output=True, text=True, timeout=60)

    def test_an_unwritable_key_file_stops_the_start_and_stores_no_key(self):
        data = tempfile.mkdtemp(prefix="kf-boot-")
        self.addCleanup(lambda: subprocess.run(["rm", "-rf", data]))
        # A path whose parent is a regular file cannot be created, even by
        # root (the tests run as root, for whom permissions do not stop it).
        blocker = os.path.join(data, "not-a-directory")
        with open(blocker, "w") as f:
            f.write("x")
        bad = os.path.join(blocker, "admin.key")
        out = self.start(data, bad)
        self.assertEqual(out.returncode, 1, out.stderr)
        self.assertIn("cannot create the bootstrap admin key file", out.stderr)
        self.assertIn(bad, out.stderr)
        self.assertIn("nothing was stored", out.stderr)
        # Nothing was committed: a start with a writable path makes the key
        # (a committed one would have set the once-per-store marker, and no
        # key would be written at all).
        good = os.path.join(data, "admin.key")
        server = harness.Keyflowd(data_dir=data, args=["--auth", "--bootstrap-key-file", good])
        server.start()
        self.addCleanup(server.cleanup)
        self.assertEqual(os.stat(good).st_mode & 0o777, 0o600)
        with open(good) as f:
            key = f.read().strip()
        channel = grpc.insecure_channel(server.grpc_target)
        self.addCleanup(channel.close)
        listed = KG.KeysStub(channel).ListKeys(K.ListKeysRequest(), metadata=bearer(key),
                                               timeout=10).keys
        self.assertEqual([k.name for k in listed], ["bootstrap admin"])
        self.assertEqual(server.stop(), 0, server.read_log())


if __name__ == "__main__":
    unittest.main()
