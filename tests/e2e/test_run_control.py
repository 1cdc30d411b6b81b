"""End-to-end tests of run control against the real keyflowd, each over gRPC
(Python grpcio) and over the HTTP gateway (urllib): per-key concurrency,
retries with backoff, delayed start, CancelRun, ReleaseRun, GetRun of a
receipt's run and GetRun(wait_ms), ListRuns by key, the event IDs a run
holds - and that what they store survives SIGKILL and a restart
(docs/semantics.md, "Runs").

Both transports go through one small API class each that speaks the JSON
shape of the gateway (gRPC answers are converted with json_format), so every
test runs unchanged over both. Nothing sleeps and hopes: long polls and
waits with deadlines.
"""

import json
import os
import sys
import threading
import time
import unittest
import urllib.parse
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

TIMEOUT_S = 30


def unique(prefix):
    return "%s-%s" % (prefix, uuid.uuid4().hex[:10])


def one(**options):
    """A batch rule of one event (its run starts at once) plus run options,
    in the gateway's JSON."""
    rule = {"kind": "batch", "maxEvents": 1}
    rule.update(options)
    return rule


def status(run):
    return run.get("status", "").replace("RUN_STATUS_", "")


def num(run, field):
    return int(run.get(field, 0))


class ApiError(Exception):
    def __init__(self, code, message):
        super().__init__("%s: %s" % (code, message))
        self.code = code  # the gRPC code name, e.g. "FAILED_PRECONDITION"
        self.message = message


class GrpcApi:
    name = "grpc"

    def __init__(self, server):
        self.channel = grpc.insecure_channel(server.grpc_target)
        self.coords = CG.CoordinatorsStub(self.channel)
        self.runs = RG.RunsStub(self.channel)

    def close(self):
        self.channel.close()

    def _call(self, fn, req, timeout=TIMEOUT_S):
        try:
            resp = fn(req, timeout=timeout)
        except grpc.RpcError as e:
            raise ApiError(e.code().name, e.details())
        out = json_format.MessageToDict(resp)
        _embed(out)
        return out

    def send(self, wf, key, rule, input=1, id=None):
        ev = C.Event(input_json=json.dumps(input), id=id or "")
        rule = dict(rule, kind="RULE_KIND_" + rule["kind"].upper())
        json_format.ParseDict(rule, ev.rule)
        return self._call(self.coords.SendEvent, C.SendEventRequest(workflow=wf, key=key, event=ev))

    def flush(self, wf, key, kind="batch"):
        ref = C.CoordinatorRef(kind=C.RULE_KIND_BATCH if kind == "batch" else C.RULE_KIND_DEBOUNCE,
                               workflow=wf, key=key)
        return self._call(self.coords.FlushWindow, C.FlushWindowRequest(coordinator=ref))

    def poll(self, wf, max_runs=10, lease_ms=30000, wait_ms=0):
        r = self._call(self.runs.PollRuns, R.PollRunsRequest(
            workflows=[wf], worker_id="w", max_runs=max_runs, lease_ms=lease_ms, wait_ms=wait_ms),
            timeout=TIMEOUT_S + wait_ms / 1000)
        return r.get("runs", [])

    def heartbeat(self, run):
        return self._call(self.runs.HeartbeatRun,
                          R.HeartbeatRunRequest(run_id=run["runId"], lease=run["lease"]))

    def complete(self, run, result=None, error=None, retryable=False):
        req = R.CompleteRunRequest(run_id=run["runId"], lease=run["lease"], retryable=retryable)
        if error is not None:
            req.error = error
        else:
            req.result_json = json.dumps(result)
        return self._call(self.runs.CompleteRun, req)["run"]

    def release(self, run):
        return self._call(self.runs.ReleaseRun,
                          R.ReleaseRunRequest(run_id=run["runId"], lease=run["lease"]))["run"]

    def cancel(self, run_id):
        return self._call(self.runs.CancelRun, R.CancelRunRequest(run_id=run_id))["run"]

    def get(self, run_id, wait_ms=0):
        return self._call(self.runs.GetRun, R.GetRunRequest(run_id=run_id, wait_ms=wait_ms),
                          timeout=TIMEOUT_S + wait_ms / 1000)

    def list(self, wf="", key="", page_token=""):
        return self._call(self.runs.ListRuns, R.ListRunsRequest(workflow=wf, key=key,
                                                                page_token=page_token))


def _embed(msg):
    """gRPC's *_json strings as the gateway embeds them (input, result)."""
    if isinstance(msg, dict):
        for field in list(msg):
            if field.endswith("Json") and isinstance(msg[field], str):
                msg[field[:-4]] = json.loads(msg.pop(field))
            else:
                _embed(msg[field])
    elif isinstance(msg, list):
        for m in msg:
            _embed(m)


class HttpApi:
    name = "http"

    def __init__(self, server):
        self.server = server

    def close(self):
        pass

    def _call(self, method, path, body=None):
        code, resp = self.server.http(method, path, body)
        if code != 200:
            raise ApiError(resp.get("status"), resp.get("message"))
        return resp

    def send(self, wf, key, rule, input=1, id=None):
        body = {"rule": rule, "input": input}
        if id:
            body["id"] = id
        return self._call("POST", "/v1/workflows/%s/keys/%s/events" % (wf, key), body)

    def flush(self, wf, key, kind="batch"):
        return self._call("POST", "/v1/coordinators/%s/%s/%s:flush" % (kind, wf, key), {})

    def poll(self, wf, max_runs=10, lease_ms=30000, wait_ms=0):
        return self._call("POST", "/v1/runs:poll", {
            "workflows": [wf], "workerId": "w", "maxRuns": max_runs, "leaseMs": lease_ms,
            "waitMs": wait_ms}).get("runs", [])

    def heartbeat(self, run):
        return self._call("POST", "/v1/runs/%s:heartbeat" % run["runId"], {"lease": run["lease"]})

    def complete(self, run, result=None, error=None, retryable=False):
        body = {"lease": run["lease"]}
        if error is not None:
            body["error"] = error
            body["retryable"] = retryable
        else:
            body["result"] = result
        return self._call("POST", "/v1/runs/%s:complete" % run["runId"], body)["run"]

    def release(self, run):
        return self._call("POST", "/v1/runs/%s:release" % run["runId"], {"lease": run["lease"]})["run"]

    def cancel(self, run_id):
        return self._call("POST", "/v1/runs/%s:cancel" % run_id, {})["run"]

    def get(self, run_id, wait_ms=0):
        q = "?waitMs=%d" % wait_ms if wait_ms else ""
        return self._call("GET", "/v1/runs/%s%s" % (urllib.parse.quote(run_id), q))

    def list(self, wf="", key="", page_token=""):
        q = urllib.parse.urlencode({k: v for k, v in
                                    (("workflow", wf), ("key", key), ("pageToken", page_token))
                                    if v})
        return self._call("GET", "/v1/runs?" + q)


class RunControl:
    """The tests, mixed into one harness.ServerTest per transport (API)
    below: one keyflowd per class, each test in a workflow of its own
    (unique())."""
    API = None
    server_args = ["--run-attempts", "2"]

    def setUp(self):
        super().setUp()
        self.api = self.API(self.server)
        self.addCleanup(self.api.close)

    def run_of(self, wf, key, **options):
        resp = self.api.send(wf, key, one(**options))
        self.assertTrue(resp.get("runStarted"), resp)
        return resp["receipt"]["runId"]

    def test_key_concurrency_leases_a_keys_runs_in_order(self):
        wf = unique("kc")
        a, b = self.run_of(wf, "k", keyConcurrency=1), self.run_of(wf, "k", keyConcurrency=1)
        other = self.run_of(wf, "j", keyConcurrency=1)
        leased = self.api.poll(wf, max_runs=10)
        self.assertEqual(sorted(r["runId"] for r in leased), sorted([a, other]))
        self.assertEqual(status(self.api.get(b)), "PENDING")
        waiting = {}
        t = threading.Thread(target=lambda: waiting.update(runs=self.api.poll(wf, wait_ms=20000)))
        t.start()
        self.api.complete(next(r for r in leased if r["runId"] == a), result="done")
        t.join(TIMEOUT_S)
        self.assertEqual([r["runId"] for r in waiting["runs"]], [b], "the freed slot's run")

    def test_retryable_error_backs_off_then_fails(self):
        wf = unique("retry")
        run_id = self.run_of(wf, "k", retry={"maxAttempts": 2, "initialBackoffMs": 2000})
        run = self.api.poll(wf)[0]
        self.assertEqual(num(run, "maxAttempts"), 2)
        before = int(time.time() * 1000)
        after = self.api.complete(run, error="db busy", retryable=True)
        self.assertEqual(status(after), "DELAYED")
        self.assertEqual(after["lastError"], "db busy")
        self.assertGreaterEqual(num(after, "dueMs"), before + 2000 - 5)
        self.assertEqual(self.api.poll(wf), [], "not during the backoff")
        again = self.api.poll(wf, wait_ms=20000)
        self.assertEqual([r["runId"] for r in again], [run_id])
        self.assertEqual(num(again[0], "attempts"), 2)
        self.assertGreaterEqual(int(time.time() * 1000), num(after, "dueMs") - 5)
        final = self.api.complete(again[0], error="db still busy", retryable=True)
        self.assertEqual(status(final), "FAILED")
        self.assertEqual(final["error"], "db still busy")
        with self.assertRaises(ApiError) as e:
            self.api.complete(again[0], result=1)
        self.assertEqual(e.exception.code, "FAILED_PRECONDITION")

    def test_start_after_delays_the_run(self):
        wf = unique("later")
        run_id = self.run_of(wf, "k", startAfterMs=2000)
        run = self.api.get(run_id)
        self.assertEqual(status(run), "DELAYED")
        self.assertEqual(self.api.poll(wf), [])
        got = self.api.poll(wf, wait_ms=20000)
        self.assertEqual([r["runId"] for r in got], [run_id])
        self.assertGreaterEqual(int(time.time() * 1000), num(run, "dueMs") - 5)

    def test_cancel_pending_and_leased_runs(self):
        wf = unique("cancel")
        pending = self.run_of(wf, "p", keyConcurrency=1)
        self.assertEqual(status(self.api.cancel(pending)), "CANCELLED")
        self.assertEqual(status(self.api.cancel(pending)), "CANCELLED", "a retry")
        leased_id = self.run_of(wf, "l")
        run = self.api.poll(wf)[0]
        self.assertEqual(run["runId"], leased_id)
        asked = self.api.cancel(leased_id)
        self.assertEqual(status(asked), "LEASED")
        self.assertTrue(asked["cancelRequested"])
        self.assertTrue(self.api.heartbeat(run)["cancelRequested"])
        done = self.api.complete(run, result={"stopped": True})
        self.assertEqual(status(done), "CANCELLED")
        self.assertEqual(done["result"], {"stopped": True})
        with self.assertRaises(ApiError) as e:
            self.api.cancel(self.api.send(wf, "w", {"kind": "batch", "maxEvents": 5})
                            ["receipt"]["runId"])
        self.assertEqual(e.exception.code, "FAILED_PRECONDITION")
        self.assertIn("CancelWindow", e.exception.message)

    def test_release_does_not_count_the_attempt(self):
        wf = unique("rel")
        run_id = self.run_of(wf, "k")
        run = self.api.poll(wf)[0]
        back = self.api.release(run)
        self.assertEqual((status(back), num(back, "attempts")), ("PENDING", 0))
        with self.assertRaises(ApiError) as e:
            self.api.release(run)
        self.assertEqual(e.exception.code, "FAILED_PRECONDITION")
        again = self.api.poll(wf)
        self.assertEqual([(r["runId"], num(r, "attempts")) for r in again], [(run_id, 1)])

    def test_get_a_receipts_run_then_wait_for_its_result(self):
        wf = unique("wait")
        resp = self.api.send(wf, "k", {"kind": "batch", "maxEvents": 5, "maxWaitMs": 60000},
                             id="e-1")
        run_id = resp["receipt"]["runId"]
        early = self.api.get(run_id)
        self.assertEqual(status(early), "WINDOW_OPEN")
        self.assertEqual(early["dueMs"], resp["receipt"]["dueMs"])
        answer = {}
        t = threading.Thread(target=lambda: answer.update(run=self.api.get(run_id, wait_ms=30000)))
        t.start()
        self.api.flush(wf, "k")
        run = self.api.poll(wf, wait_ms=5000)[0]
        self.assertEqual(run["eventIds"], ["e-1"])
        self.assertTrue(t.is_alive(), "leased is not finished: the wait goes on")
        self.api.complete(run, result={"shipped": True})
        t.join(TIMEOUT_S)
        self.assertEqual(status(answer["run"]), "COMPLETED")
        self.assertEqual(answer["run"]["result"], {"shipped": True})
        with self.assertRaises(ApiError) as e:
            self.api.get(run_id, wait_ms=60001)
        self.assertEqual(e.exception.code, "INVALID_ARGUMENT")

    def test_list_by_key(self):
        wf = unique("list")
        mine = [self.run_of(wf, "k") for _ in range(2)]
        self.run_of(wf, "k2")
        listed = self.api.list(wf=wf, key="k")
        self.assertEqual([r["runId"] for r in listed["runs"]], mine)


class GrpcRunControlTest(RunControl, harness.ServerTest):
    API = GrpcApi


class HttpRunControlTest(RunControl, harness.ServerTest):
    API = HttpApi


class RunStateSurvivesSigkillTest(unittest.TestCase):
    """What run control stores is back after SIGKILL and a restart."""

    def test_sigkill_and_restart(self):
        server = harness.Keyflowd(args=["--run-attempts", "3"]).start()
        try:
            api = GrpcApi(server)
            wf = unique("crash")
            delayed = api.send(wf, "d", one(startAfterMs=600000))["receipt"]["runId"]
            limited = [api.send(wf, "k", one(keyConcurrency=1))["receipt"]["runId"]
                       for _ in range(2)]
            retried = api.send(wf, "r", one(retry={"initialBackoffMs": 600000}))["receipt"]["runId"]
            window = api.send(wf, "w", {"kind": "batch", "maxEvents": 3, "maxWaitMs": 600000},
                              id="e-w")["receipt"]["runId"]
            leased = {r["runId"]: r for r in api.poll(wf, max_runs=10, lease_ms=600000)}
            self.assertEqual(sorted(leased), sorted([limited[0], retried]))
            self.assertEqual(status(api.complete(leased[retried], error="try later",
                                                 retryable=True)), "DELAYED")
            api.cancel(limited[0])
            api.close()
            server.kill()
            server.start()
            api = GrpcApi(server)
            self.assertEqual(status(api.get(delayed)), "DELAYED")
            r = api.get(retried)
            self.assertEqual((status(r), r["lastError"], num(r, "attempts")),
                             ("DELAYED", "try later", 1))
            first = api.get(limited[0])
            self.assertEqual((status(first), first["cancelRequested"]), ("LEASED", True))
            self.assertEqual(api.poll(wf, max_runs=10), [], "the key's slot is still held")
            self.assertTrue(api.heartbeat(leased[limited[0]])["cancelRequested"])
            self.assertEqual(status(api.complete(leased[limited[0]], result=1)), "CANCELLED")
            self.assertEqual([r["runId"] for r in api.poll(wf, max_runs=10)], [limited[1]])
            self.assertEqual(status(api.get(window)), "WINDOW_OPEN")
            api.send(wf, "w", {"kind": "batch", "maxEvents": 2, "maxWaitMs": 600000}, id="e-w2")
            self.assertEqual(api.get(window)["eventIds"], ["e-w", "e-w2"])
            api.close()
        finally:
            server.cleanup()


if __name__ == "__main__":
    unittest.main()
