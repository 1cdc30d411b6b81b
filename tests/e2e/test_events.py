"""End-to-end tests of what one event does (docs/semantics.md, "Events"):
dispositions, commit sequences, another payload under a remembered ID
(ALREADY_EXISTS), debounce edges, per-event flush and batch max_bytes, and
the dispositions of FlushWindow and CancelWindow. Every test runs twice,
once over gRPC (Python grpcio) and once over the HTTP gateway, against the
real keyflowd; the state-keeping ones also through SIGKILL and a restart.

Responses are compared in their JSON form (the gateway's, and
json_format.MessageToDict's for gRPC: the same proto3 JSON).

Run (Debian's Python):
  cd /work/main && KEYFLOW_BUILD_DIR=build PYENV_VERSION=system \\
      python3 -m unittest discover -s tests/e2e -p 'test_events.py' -v
"""

import json
import os
import sys
import time
import unittest
import uuid

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import harness  # noqa: E402

harness.stubs()
import grpc  # noqa: E402
from google.protobuf import json_format  # noqa: E402
from keyflow.v1 import coordinators_pb2 as C  # noqa: E402
from keyflow.v1 import coordinators_pb2_grpc as CG  # noqa: E402
from keyflow.v1 import runs_pb2 as R  # noqa: E402
from keyflow.v1 import runs_pb2_grpc as RG  # noqa: E402

OPENED, JOINED, DUPLICATE, CLOSED = ("DISPOSITION_" + d for d in ("OPENED", "JOINED", "DUPLICATE", "CLOSED"))
CANCELLED, NO_WINDOW = "DISPOSITION_CANCELLED", "DISPOSITION_NO_WINDOW"


class Failed(Exception):
    """An RPC error in transport-neutral form."""

    def __init__(self, code, message):
        super().__init__("%s: %s" % (code, message))
        self.code = code          # gRPC code name, e.g. "ALREADY_EXISTS"
        self.message = message


def debounce(window_ms, edge=None, max_wait_ms=None):
    r = {"kind": "RULE_KIND_DEBOUNCE", "windowMs": str(window_ms)}
    if edge:
        r["edge"] = "EDGE_" + edge.upper()
    if max_wait_ms is not None:
        r["maxWaitMs"] = str(max_wait_ms)
    return r


def batch(max_events=None, max_wait_ms=60000, max_bytes=None):
    r = {"kind": "RULE_KIND_BATCH", "maxWaitMs": str(max_wait_ms)}
    if max_events is not None:
        r["maxEvents"] = str(max_events)
    if max_bytes is not None:
        r["maxBytes"] = str(max_bytes)
    return r


def event(rule, value, event_id=None, flush=False):
    e = {"rule": rule, "input": value}
    if event_id:
        e["id"] = event_id
    if flush:
        e["flush"] = True
    return e


class GrpcTransport:
    name = "grpc"

    def __init__(self, server):
        self.channel = grpc.insecure_channel(server.grpc_target)
        self.coords = CG.CoordinatorsStub(self.channel)
        self.runs = RG.RunsStub(self.channel)

    def close(self):
        self.channel.close()

    def call(self, fn, request):
        try:
            resp = fn(request, timeout=30)
        except grpc.RpcError as e:
            raise Failed(e.code().name, e.details())
        return json_format.MessageToDict(resp)

    def send(self, wf, key, ev):
        return self.call(self.coords.SendEvent, self.request(wf, key, ev))

    def request(self, wf, key, ev):
        msg = C.Event(id=ev.get("id", ""), input_json=json.dumps(ev["input"]), flush=ev.get("flush", False))
        json_format.ParseDict(ev["rule"], msg.rule)
        return C.SendEventRequest(workflow=wf, key=key, event=msg)

    def send_many(self, items):
        req = C.SendEventsRequest(events=[self.request(wf, key, ev) for wf, key, ev in items])
        return self.call(self.coords.SendEvents, req).get("results", [])

    def ref(self, kind, wf, key):
        return C.CoordinatorRef(kind=C.RuleKind.Value("RULE_KIND_" + kind.upper()), workflow=wf, key=key)

    def flush(self, kind, wf, key):
        return self.call(self.coords.FlushWindow, C.FlushWindowRequest(coordinator=self.ref(kind, wf, key)))

    def cancel(self, kind, wf, key):
        return self.call(self.coords.CancelWindow, C.CancelWindowRequest(coordinator=self.ref(kind, wf, key)))

    def describe(self, kind, wf, key):
        return self.call(self.coords.DescribeCoordinator,
                         C.DescribeCoordinatorRequest(coordinator=self.ref(kind, wf, key)))

    def poll(self, wf, wait_ms=0):
        runs = self.call(self.runs.PollRuns, R.PollRunsRequest(workflows=[wf], worker_id="w", max_runs=100,
                                                               lease_ms=60000, wait_ms=wait_ms)).get("runs", [])
        for r in runs:
            r["input"] = json.loads(r.pop("inputJson"))
        return runs


class HttpTransport:
    name = "http"

    def __init__(self, server):
        self.server = server

    def close(self):
        pass

    def call(self, method, path, body=None):
        status, resp = self.server.http(method, path, body)
        if status != 200:
            if not isinstance(resp, dict) or "status" not in resp:
                raise AssertionError("HTTP %s without a JSON error body: %r" % (status, resp))
            raise Failed(resp["status"], resp["message"])
        return resp

    def send(self, wf, key, ev):
        return self.call("POST", "/v1/workflows/%s/keys/%s/events" % (wf, key), ev)

    def send_many(self, items):
        body = [{"workflow": wf, "key": key, "event": ev} for wf, key, ev in items]
        return self.call("POST", "/v1/events:batch", body).get("results", [])

    def flush(self, kind, wf, key):
        return self.call("POST", "/v1/coordinators/%s/%s/%s:flush" % (kind, wf, key))

    def cancel(self, kind, wf, key):
        return self.call("POST", "/v1/coordinators/%s/%s/%s:cancel" % (kind, wf, key))

    def describe(self, kind, wf, key):
        return self.call("GET", "/v1/coordinators/%s/%s/%s" % (kind, wf, key))

    def poll(self, wf, wait_ms=0):
        return self.call("POST", "/v1/runs:poll", {"workerId": "w", "workflows": [wf], "maxRuns": 100,
                                                   "leaseMs": 60000, "waitMs": wait_ms}).get("runs", [])


class EventsTest:
    """The tests; mixed into one harness.ServerTest per transport below
    (one keyflowd per class, each test in a workflow of its own and
    connected anew: a test before it may have restarted the server)."""

    transport_class = None

    def setUp(self):
        super().setUp()
        self.connect()
        self.wf = "wf-" + uuid.uuid4().hex[:8]

    def connect(self):
        self.t = self.transport_class(self.server)
        self.addCleanup(self.t.close)

    def restart_after_sigkill(self):
        self.server.kill()
        self.server.start()
        self.connect()

    def send(self, key, ev):
        return self.t.send(self.wf, key, ev)

    def refused(self, key, ev):
        with self.assertRaises(Failed) as cm:
            self.send(key, ev)
        return cm.exception

    def runs(self):
        return self.t.poll(self.wf)

    # --- tests -----------------------------------------------------------
    def test_dispositions_and_commit_sequences(self):
        rule = batch(max_events=3)
        a = self.send("k", event(rule, 1, "a"))
        self.assertEqual(a["disposition"], OPENED)
        b = self.send("k", event(rule, 2, "b"))
        self.assertEqual(b["disposition"], JOINED)
        self.assertEqual(b["receipt"]["runId"], a["receipt"]["runId"])
        self.assertGreater(int(b["receipt"]["commitSeq"]), int(a["receipt"]["commitSeq"]))
        dup = self.send("k", event(rule, 1, "a"))
        self.assertEqual(dup, {"receipt": a["receipt"], "duplicate": True, "disposition": DUPLICATE})
        c = self.send("k", event(rule, 3, "c"))
        self.assertEqual(c["disposition"], CLOSED)
        self.assertTrue(c["runStarted"])
        self.assertEqual([r["input"] for r in self.runs()], [[1, 2, 3]])
        self.assertEqual(self.t.flush("batch", self.wf, "k"), {"disposition": NO_WINDOW})
        self.assertEqual(self.t.cancel("batch", self.wf, "k"), {"disposition": NO_WINDOW})
        d = self.send("k", event(rule, 4))
        self.assertEqual(self.t.flush("batch", self.wf, "k"),
                         {"flushed": True, "runId": d["receipt"]["runId"], "disposition": CLOSED})
        e = self.send("k", event(rule, 5))
        self.assertEqual(self.t.cancel("batch", self.wf, "k"),
                         {"cancelled": True, "runId": e["receipt"]["runId"], "eventsDropped": "1",
                          "disposition": CANCELLED})

    def test_another_payload_under_a_remembered_id_is_refused(self):
        rule = batch(max_events=100)
        first = self.send("k", event(rule, {"n": 1}, "e-1"))
        for other in (event(rule, {"n": 2}, "e-1"), event(batch(max_events=99), {"n": 1}, "e-1"),
                      event(rule, {"n": 1}, "e-1", flush=True)):
            err = self.refused("k", other)
            self.assertEqual(err.code, "ALREADY_EXISTS")
            self.assertIn("event.id", err.message)
            self.assertIn("another payload", err.message)
        self.assertEqual(self.t.describe("batch", self.wf, "k")["window"]["eventCount"], "1",
                         "a refused retry adds nothing")
        self.assertEqual(self.send("k", event(rule, {"n": 1}, "e-1"))["receipt"], first["receipt"])
        # The digest is stored: the refusal survives a crash.
        self.restart_after_sigkill()
        self.assertEqual(self.refused("k", event(rule, {"n": 2}, "e-1")).code, "ALREADY_EXISTS")
        again = self.send("k", event(rule, {"n": 1}, "e-1"))
        self.assertEqual(again["disposition"], DUPLICATE)
        self.assertEqual(again["receipt"], first["receipt"], "commit sequence included")
        later = self.send("k", event(rule, {"n": 3}, "e-3"))
        self.assertGreater(int(later["receipt"]["commitSeq"]), int(first["receipt"]["commitSeq"]),
                           "commit sequences keep increasing across the restart")

    def test_leading_edge_runs_first_and_absorbs(self):
        rule = debounce(60000, edge="leading")
        a = self.send("k", event(rule, "first", "a"))
        self.assertEqual(a["disposition"], CLOSED)
        runs = self.runs()
        self.assertEqual([(r["runId"], r["input"]) for r in runs], [(a["receipt"]["runId"], "first")],
                         "the run starts at once")
        b = self.send("k", event(rule, "second", "b"))
        self.assertEqual(b["disposition"], JOINED)
        self.assertEqual(b["receipt"]["runId"], a["receipt"]["runId"], "covered by the started run")
        w = self.t.describe("debounce", self.wf, "k")["window"]
        self.assertTrue(w["runStarted"])
        self.assertEqual(w["eventsAbsorbed"], "1")
        self.assertEqual(w["rule"]["edge"], "EDGE_LEADING")
        # Through a crash the window keeps absorbing.
        self.restart_after_sigkill()
        c = self.send("k", event(rule, "third", "c"))
        self.assertEqual(c["disposition"], JOINED)
        self.assertEqual(c["receipt"]["runId"], a["receipt"]["runId"])
        self.assertEqual(self.runs(), [])
        # Flushing ends the quiet window without a run; the next event runs.
        self.assertEqual(self.t.flush("debounce", self.wf, "k")["disposition"], CLOSED)
        self.assertEqual(self.runs(), [])
        d = self.send("k", event(rule, "fourth", "d"))
        self.assertEqual(d["disposition"], CLOSED)
        self.assertEqual([r["input"] for r in self.runs()], ["fourth"])

    def test_leading_window_ends_at_its_due_time_without_a_run(self):
        rule = debounce(200, edge="leading")
        a = self.send("k", event(rule, 1, "a"))
        self.assertEqual(len(self.runs()), 1)
        deadline = time.time() + 10
        while "window" in self.t.describe("debounce", self.wf, "k"):
            self.assertLess(time.time(), deadline, "the quiet window never ended")
            time.sleep(0.02)
        self.assertEqual(self.runs(), [], "no run at the end of a leading window")
        b = self.send("k", event(rule, 2, "b"))
        self.assertEqual(b["disposition"], CLOSED)
        self.assertNotEqual(b["receipt"]["runId"], a["receipt"]["runId"])

    def test_both_edges_run_the_first_and_the_latest(self):
        rule = debounce(60000, edge="both")
        a = self.send("k", event(rule, 1))
        self.assertEqual(a["disposition"], CLOSED)
        b = self.send("k", event(rule, 2))
        self.assertEqual(b["disposition"], OPENED, "it begins the trailing run")
        c = self.send("k", event(rule, 3))
        self.assertEqual(c["disposition"], JOINED)
        self.assertEqual(c["receipt"]["runId"], b["receipt"]["runId"])
        self.restart_after_sigkill()
        f = self.t.flush("debounce", self.wf, "k")
        self.assertEqual(f["runId"], b["receipt"]["runId"])
        runs = {r["runId"]: r for r in self.runs()}
        self.assertEqual(set(runs), {a["receipt"]["runId"], b["receipt"]["runId"]})
        self.assertEqual(runs[b["receipt"]["runId"]]["input"], 3, "the latest input")
        self.assertEqual(runs[b["receipt"]["runId"]]["eventCount"], "2")

    def test_flush_true_closes_the_window_with_the_event(self):
        rule = batch(max_events=100)
        a = self.send("k", event(rule, 1))
        b = self.send("k", event(rule, 2, flush=True))
        self.assertEqual(b["disposition"], CLOSED)
        self.assertEqual(b["receipt"]["runId"], a["receipt"]["runId"])
        self.assertEqual([r["input"] for r in self.runs()], [[1, 2]])

    def test_max_bytes_bounds_a_batch_run_input(self):
        rule = batch(max_events=100, max_bytes=10)
        a = self.send("k", event(rule, 1234))
        self.assertEqual(self.send("k", event(rule, 567))["disposition"], JOINED)
        c = self.send("k", event(rule, 8))
        self.assertEqual(c["disposition"], OPENED, "[1234,567,8] would pass 10 bytes")
        self.assertNotEqual(c["receipt"]["runId"], a["receipt"]["runId"])
        self.assertEqual([r["input"] for r in self.runs()], [[1234, 567]])
        err = self.refused("k", event(rule, 123456789))
        self.assertEqual(err.code, "INVALID_ARGUMENT")
        self.assertIn("event.rule.max_bytes", err.message)
        err = self.refused("k", event(dict(debounce(100), edge=9), 1))
        self.assertEqual(err.code, "INVALID_ARGUMENT")
        self.assertIn("edge", err.message)
        err = self.refused("k", event(dict(batch(), edge="EDGE_LEADING"), 1))
        self.assertIn("event.rule.edge", err.message)


    def test_send_events_answers_each_event_from_one_write(self):
        pair = batch(max_events=2)
        self.send("k3", event(pair, 1, "e-1"))
        items = [(self.wf, "k1", event(pair, "a")),
                 (self.wf, "k2", event(debounce(60000), "b")),
                 (self.wf, "k1", event(pair, "c")),
                 (self.wf, "", event(pair, 1)),
                 (self.wf, "k3", event(pair, 2, "e-1")),
                 (self.wf, "k3", event(pair, 1, "e-1")),
                 (self.wf, "k4", event(debounce(60000, edge="leading"), "d"))]
        results = self.t.send_many(items)
        self.assertEqual(len(results), len(items))
        got = [r["response"]["disposition"] if "response" in r else r["error"]["status"] for r in results]
        self.assertEqual(got, [OPENED, OPENED, CLOSED, "INVALID_ARGUMENT", "ALREADY_EXISTS", DUPLICATE, CLOSED])
        self.assertEqual(results[3]["error"]["code"], 3)
        self.assertIn("key", results[3]["error"]["message"])
        # One write per partition (the default 8: docs/scaling.md), numbered
        # partition i, i + 8, ...: every accepted event of one partition in
        # one write, each partition's write its own.
        seqs = {}
        for i in (0, 1, 2, 6):
            seq = int(results[i]["response"]["receipt"]["commitSeq"])
            seqs.setdefault(seq % 8, set()).add(seq)
        self.assertTrue(all(len(s) == 1 for s in seqs.values()),
                        "every accepted event of a partition in one write: %s" % seqs)
        self.assertEqual(results[2]["response"]["receipt"]["runId"], results[0]["response"]["receipt"]["runId"])
        # Durable through a SIGKILL.
        self.restart_after_sigkill()
        self.assertEqual(self.t.describe("debounce", self.wf, "k2")["window"]["eventCount"], "1")
        self.assertTrue(self.t.describe("debounce", self.wf, "k4")["window"]["runStarted"])
        self.assertEqual(sorted(json.dumps(r["input"]) for r in self.runs()), ['"d"', '["a", "c"]'])
        # More than the bound is refused whole.
        too_many = [(self.wf, "k5", event(pair, i)) for i in range(1001)]
        with self.assertRaises(Failed) as cm:
            self.t.send_many(too_many)
        self.assertEqual(cm.exception.code, "INVALID_ARGUMENT")
        self.assertIn("at most 1000", cm.exception.message)
        self.assertFalse(self.t.describe("batch", self.wf, "k5").get("exists", False))
        self.assertEqual(len(self.t.send_many(too_many[:1000])), 1000)


class GrpcEventsTest(EventsTest, harness.ServerTest):
    transport_class = GrpcTransport


class HttpEventsTest(EventsTest, harness.ServerTest):
    transport_class = HttpTransport

    def test_events_batch_takes_a_json_array(self):
        status, body = self.server.http("POST", "/v1/events:batch", {"events": []})
        self.assertEqual(status, 400)
        self.assertEqual(body["message"], "body: must be a JSON array")
        # The generic route takes the request object.
        status, body = self.server.http("POST", "/v1/keyflow.v1.Coordinators/SendEvents", {"events": [
            {"workflow": self.wf, "key": "k", "event": event(batch(), 1)}]})
        self.assertEqual(status, 200, body)
        self.assertEqual(body["results"][0]["response"]["disposition"], OPENED)
        self.assertEqual(self.server.http("POST", "/v1/events:batch", [])[1], {"results": []})


if __name__ == "__main__":
    unittest.main()
