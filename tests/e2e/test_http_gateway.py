"""End-to-end tests of the HTTP/JSON gateway through curl against the real
keyflowd: coordinators and runs under /v1/..., the DESIGN.md JSON forms, the
gateway's JSON conventions (lowerCamelCase, int64 as strings, `input_json`
as an embedded "input" value, enums by name or alias), error bodies
({"code", "status", "message"} naming the field), /healthz, /readyz and
/metrics (Prometheus text).

Run (Debian's Python):
  cd /work/main && KEYFLOW_BUILD_DIR=build-e2e PYENV_VERSION=system \
      python3 -m unittest discover -s tests/e2e -p 'test_http_gateway.py' -v
"""

import json
import os
import re
import shutil
import subprocess
import sys
import time
import unittest
import uuid
from urllib.parse import quote

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import harness  # noqa: E402
from harness import wait_until  # noqa: E402

UUID_RE = r"[0-9a-f]{8}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{12}"
CLOCK_SLACK_MS = 5


def now_ms():
    return int(time.time() * 1000)


def enc(segment):
    """Percent-encodes one path segment (a '/' in a key becomes %2F)."""
    return quote(segment, safe="")


class Response:
    def __init__(self, status, body, text, content_type, http_version):
        self.status = status
        self.body = body
        self.text = text
        self.content_type = content_type
        self.http_version = http_version

    def __repr__(self):
        return "HTTP %s %s" % (self.status, self.text[:500])


class Gateway(harness.ServerTest):
    """The helpers; each test works in a workflow of its own."""

    server_args = ["--plugin-dir", os.path.join(harness.BUILD, "handlers")]

    def setUp(self):
        super().setUp()
        self.wf = "wf-" + uuid.uuid4().hex[:8]

    # --- curl ------------------------------------------------------------
    def curl(self, method, path, body=None, raw=None, http2=False, extra=(), check=True):
        """Runs curl; returns a Response (body parsed as JSON when it is).
        With check=False a failed transfer (e.g. --max-time) returns None."""
        cmd = ["curl", "-s", "-S", "--max-time", "30", "-X", method,
               "-w", "\n%{http_code} %{http_version} %{content_type}"]
        if http2:
            cmd.append("--http2-prior-knowledge")
        data = raw if raw is not None else (json.dumps(body) if body is not None else None)
        if data is not None:
            cmd += ["-H", "Content-Type: application/json", "--data-binary", "@-"]
        cmd += list(extra)
        cmd.append(self.server.http_base + path)
        proc = subprocess.run(cmd, input=(data or "").encode(), capture_output=True, timeout=60)
        if not check and proc.returncode != 0:
            return None
        self.assertEqual(proc.returncode, 0, "curl failed: %s" % proc.stderr.decode(errors="replace"))
        out = proc.stdout.decode()
        text, _, trailer = out.rpartition("\n")
        parts = trailer.split(" ", 2)
        status, version = int(parts[0]), parts[1]
        ctype = parts[2] if len(parts) > 2 else ""
        try:
            parsed = json.loads(text)
        except ValueError:
            parsed = None
        return Response(status, parsed, text, ctype, version)

    def ok(self, method, path, body=None, **kw):
        r = self.curl(method, path, body, **kw)
        self.assertEqual(r.status, 200, "%s %s -> %r" % (method, path, r))
        self.assertTrue(r.content_type.startswith("application/json"), r.content_type)
        return r.body

    def assert_error(self, resp, http_status, grpc_code, status_name, field=None):
        self.assertEqual(resp.status, http_status, repr(resp))
        self.assertIsInstance(resp.body, dict, "an error has a JSON body: %r" % resp)
        self.assertEqual(resp.body.get("code"), grpc_code, repr(resp))
        self.assertEqual(resp.body.get("status"), status_name, repr(resp))
        self.assertIsInstance(resp.body.get("message"), str)
        if field is not None:
            if isinstance(field, str):  # else a compiled regex
                self.assertIn(field, resp.body["message"], "the message should name %r" % field)
            else:
                self.assertRegex(resp.body["message"], field, "the message should name the field")

    # --- API helpers -----------------------------------------------------
    def events_path(self, key, workflow=None):
        return "/v1/workflows/%s/keys/%s/events" % (enc(workflow or self.wf), enc(key))

    def send(self, key, event, workflow=None):
        return self.ok("POST", self.events_path(key, workflow), event)

    def coord_path(self, kind, key, verb=""):
        return "/v1/coordinators/%s/%s/%s%s" % (kind, enc(self.wf), enc(key), verb)

    def describe(self, kind, key):
        return self.ok("GET", self.coord_path(kind, key))

    def poll(self, wait_ms=0, lease_ms=None, max_runs=None, worker="w1"):
        body = {"workflows": [self.wf], "workerId": worker, "waitMs": wait_ms}
        if lease_ms is not None:
            body["leaseMs"] = lease_ms
        if max_runs is not None:
            body["maxRuns"] = max_runs
        return self.ok("POST", "/v1/runs:poll", body).get("runs", [])

    def run_path(self, run_id, verb=""):
        return "/v1/runs/%s%s" % (enc(run_id), verb)

    def metrics(self):
        r = self.curl("GET", "/metrics")
        self.assertEqual(r.status, 200)
        self.assertTrue(r.content_type.startswith("text/plain"), r.content_type)
        return r.text

    def sample(self, text, name, labels=None):
        """The value of one sample, or 0 when it is absent (a counter not yet
        incremented is not listed)."""
        want = name + ("{" + labels + "}" if labels else "")
        for line in text.splitlines():
            if line.startswith(want + " "):
                return float(line.rsplit(" ", 1)[1])
        return 0.0


@unittest.skipIf(shutil.which("curl") is None, "curl is not installed")
class GatewayTest(Gateway):
    """One keyflowd for the class."""

    def test_batch_event_in_design_json_form(self):
        event = {"id": "e-1", "rule": {"kind": "batch", "maxEvents": 10, "maxWaitMs": 1000,
                                        "dedupMs": 600000}, "input": {"order": 17, "items": ["a", "b"]}}
        t0 = now_ms()
        r = self.send("cust-1", event)
        self.assertEqual(set(r), {"receipt", "disposition"},
                         "defaults (duplicate/runStarted false) are omitted: %r" % r)
        self.assertEqual(r["disposition"], "DISPOSITION_OPENED")
        self.assertIsInstance(r["receipt"]["commitSeq"], str, "int64 is emitted as a string")
        self.assertRegex(r["receipt"]["runId"], "^cust-1@" + UUID_RE + "$")
        self.assertIsInstance(r["receipt"]["dueMs"], str, "int64 is emitted as a string")
        due = int(r["receipt"]["dueMs"])
        self.assertGreaterEqual(due, t0 + 1000 - CLOCK_SLACK_MS)
        self.assertLessEqual(due, now_ms() + 1000 + CLOCK_SLACK_MS)
        d = self.describe("batch", "cust-1")
        self.assertTrue(d["exists"])
        self.assertEqual(d["coordinator"], {"kind": "RULE_KIND_BATCH", "workflow": self.wf, "key": "cust-1"})
        w = d["window"]
        self.assertEqual(w["runId"], r["receipt"]["runId"])
        self.assertEqual(w["eventCount"], "1")
        self.assertEqual(w["dueMs"], r["receipt"]["dueMs"])
        self.assertEqual(int(w["dueMs"]), int(w["openedMs"]) + 1000)
        self.assertEqual(w["rule"], {"kind": "RULE_KIND_BATCH", "maxEvents": "10", "maxWaitMs": "1000",
                                     "dedupMs": "600000", "maxBytes": "4194304"})
        self.assertEqual([m["id"] for m in d["rememberedIds"]], ["e-1"])
        self.assertEqual(d["journal"][0]["what"], "event_accepted")
        self.assertEqual(d["journal"][0]["eventId"], "e-1")
        # A retry of e-1 is a duplicate with the first receipt.
        dup = self.send("cust-1", event)
        self.assertEqual(dup, {"receipt": r["receipt"], "duplicate": True,
                               "disposition": "DISPOSITION_DUPLICATE"})
        e2 = self.send("cust-1", {"id": "e-2", "rule": event["rule"], "input": [1, None, "x"]})
        self.assertEqual(e2["receipt"]["runId"], r["receipt"]["runId"])
        # The window closes after maxWaitMs; a long poll gets the run with the
        # batch input embedded as a JSON array.
        runs = self.poll(wait_ms=10000)
        self.assertGreaterEqual(now_ms(), due - CLOCK_SLACK_MS)
        self.assertEqual(len(runs), 1)
        run = runs[0]
        self.assertEqual(run["runId"], r["receipt"]["runId"])
        self.assertEqual(run["input"], [{"order": 17, "items": ["a", "b"]}, [1, None, "x"]])
        self.assertEqual(run["kind"], "RULE_KIND_BATCH")
        self.assertEqual(run["status"], "RUN_STATUS_LEASED")
        self.assertEqual(run["eventCount"], "2")
        self.assertEqual(run["attempts"], "1")
        self.assertEqual(run["workflow"], self.wf)
        self.assertEqual(run["key"], "cust-1")
        self.assertRegex(run["lease"], "^" + UUID_RE + "$")

    def test_batch_full_starts_run_in_the_same_request(self):
        rule = {"kind": "batch", "maxEvents": "2", "maxWaitMs": 60000}
        r1 = self.send("k", {"rule": rule, "input": "a"})
        r2 = self.send("k", {"rule": rule, "input": "b"})
        self.assertNotIn("runStarted", r1)
        self.assertIs(r2.get("runStarted"), True)
        self.assertEqual(r2["receipt"]["runId"], r1["receipt"]["runId"])
        run = self.ok("GET", self.run_path(r1["receipt"]["runId"]))
        self.assertEqual(run["input"], ["a", "b"])
        self.assertEqual(run["status"], "RUN_STATUS_PENDING")
        self.assertEqual(run["createdMs"], r2["receipt"]["dueMs"], "due = the filling event's time")

    def test_debounce_event_in_design_json_form(self):
        r = self.send("d", {"rule": {"kind": "debounce", "windowMs": 50}, "input": 7})
        self.assertRegex(r["receipt"]["runId"], "^d@" + UUID_RE + "$")
        runs = self.poll(wait_ms=10000)
        self.assertEqual(len(runs), 1)
        self.assertEqual(runs[0]["runId"], r["receipt"]["runId"])
        self.assertEqual(runs[0]["input"], 7)
        self.assertEqual(runs[0]["kind"], "RULE_KIND_DEBOUNCE")
        self.assertGreaterEqual(int(runs[0]["createdMs"]), int(r["receipt"]["dueMs"]))

    def test_debounce_defaults_aliases_and_latest_input(self):
        # The spellings the OpenAPI document lists: the short name, the full
        # name, the number (proto3 JSON); any other case is refused.
        for i, kind in enumerate(["debounce", "RULE_KIND_DEBOUNCE", 1]):
            r = self.send("k", {"rule": {"kind": kind, "windowMs": "60000"}, "input": {"n": i}})
            if i == 0:
                first = r
            self.assertEqual(r["receipt"]["runId"], first["receipt"]["runId"], "kind %r" % (kind,))
        for kind in ["DEBOUNCE", "Debounce", "1"]:
            self.assert_error(self.curl("POST", self.events_path("k"),
                                        {"rule": {"kind": kind, "windowMs": "60000"}, "input": 0}),
                              400, 3, "INVALID_ARGUMENT", "event.rule.kind: expected one of")
        d = self.describe("debounce", "k")
        self.assertEqual(d["window"]["eventCount"], "3")
        self.assertEqual(d["window"]["rule"], {"kind": "RULE_KIND_DEBOUNCE", "windowMs": "60000",
                                               "maxWaitMs": "0", "dedupMs": "600000",
                                               "edge": "EDGE_TRAILING"})
        self.assertEqual(int(d["window"]["dueMs"]), int(d["window"]["lastMs"]) + 60000)
        # Snake-case names and the inputJson string form are accepted too.
        self.send("k", {"rule": {"kind": "debounce", "window_ms": 60000}, "inputJson": '{"n": "last"}'})
        f = self.ok("POST", self.coord_path("debounce", "k", ":flush"))
        self.assertEqual(f, {"flushed": True, "runId": first["receipt"]["runId"],
                             "disposition": "DISPOSITION_CLOSED"})
        run = self.ok("GET", self.run_path(f["runId"]))
        self.assertEqual(run["input"], {"n": "last"}, "a debounce run gets the latest input")
        self.assertEqual(run["eventCount"], "4")
        # The coordinator path takes the kind's full name too (a path is
        # text: no number).
        self.assertEqual(self.ok("GET", "/v1/coordinators/RULE_KIND_DEBOUNCE/%s/k" % enc(self.wf)).get("exists"),
                         None, "no IDs were remembered, so the coordinator is gone (exists false is omitted)")
        self.assertIs(self.ok("GET", "/v1/coordinators/debounce/%s/never" % enc(self.wf)).get("exists", False), False)
        self.assert_error(self.curl("GET", "/v1/coordinators/1/%s/never" % enc(self.wf)), 400, 3,
                          "INVALID_ARGUMENT", "expected one of")

    def test_key_with_slash_and_colon_in_path(self):
        for key in ["tenant/42/orders", "user:42", "a b/ü?#%"]:
            with self.subTest(key=key):
                r = self.send(key, {"id": "x", "rule": {"kind": "batch", "maxEvents": 5, "maxWaitMs": 60000},
                                    "input": {"key": key}})
                run_id = r["receipt"]["runId"]
                self.assertTrue(run_id.startswith(key + "@"), run_id)
                d = self.describe("batch", key)
                self.assertEqual(d["coordinator"]["key"], key)
                self.assertEqual(d["window"]["runId"], run_id)
                f = self.ok("POST", self.coord_path("batch", key, ":flush"), {})
                self.assertEqual(f["runId"], run_id)
                run = self.ok("GET", self.run_path(run_id))
                self.assertEqual(run["key"], key)
                self.assertEqual(run["input"], [{"key": key}])
                leased = self.poll(wait_ms=0)
                self.assertEqual([x["runId"] for x in leased], [run_id])
                hb = self.ok("POST", self.run_path(run_id, ":heartbeat"), {"lease": leased[0]["lease"]})
                self.assertIn("leaseExpiresMs", hb)
                done = self.ok("POST", self.run_path(run_id, ":complete"),
                               {"lease": leased[0]["lease"], "result": {"key": key}})
                self.assertEqual(done["run"]["status"], "RUN_STATUS_COMPLETED")
                self.assertEqual(done["run"]["result"], {"key": key})

    def test_flush_and_cancel(self):
        # Event IDs keep the coordinator (and its journal) after the window.
        r = self.send("k", {"id": "1", "rule": {"kind": "batch", "maxEvents": 10, "maxWaitMs": 60000}, "input": 1})
        self.send("k", {"id": "2", "rule": {"kind": "batch", "maxEvents": 10, "maxWaitMs": 60000}, "input": 2})
        c = self.ok("POST", self.coord_path("batch", "k", ":cancel"), {})
        self.assertEqual(c, {"cancelled": True, "runId": r["receipt"]["runId"], "eventsDropped": "2",
                             "disposition": "DISPOSITION_CANCELLED"})
        self.assertEqual(self.ok("POST", self.coord_path("batch", "k", ":cancel")),
                         {"disposition": "DISPOSITION_NO_WINDOW"})
        self.assertEqual(self.ok("POST", self.coord_path("batch", "k", ":flush")),
                         {"disposition": "DISPOSITION_NO_WINDOW"})
        resp = self.curl("GET", self.run_path(r["receipt"]["runId"]))
        self.assert_error(resp, 404, 5, "NOT_FOUND", "run_id")
        d = self.describe("batch", "k")
        self.assertNotIn("window", d)
        self.assertEqual(d["journal"][-1]["what"], "window_cancelled")
        r2 = self.send("k", {"rule": {"kind": "batch", "maxEvents": 10, "maxWaitMs": 60000}, "input": 3})
        self.assertNotEqual(r2["receipt"]["runId"], r["receipt"]["runId"])
        f = self.ok("POST", self.coord_path("batch", "k", ":flush"))
        self.assertEqual(f, {"flushed": True, "runId": r2["receipt"]["runId"],
                             "disposition": "DISPOSITION_CLOSED"})
        self.assertEqual([x["input"] for x in self.poll(max_runs=10)], [[3]])

    def test_runs_heartbeat_complete_get_list(self):
        ids = []
        for i in range(5):
            r = self.send("k%d" % i, {"rule": {"kind": "batch", "maxEvents": 1}, "input": i})
            self.assertTrue(r["runStarted"])
            ids.append(r["receipt"]["runId"])
        inputs = {run_id: i for i, run_id in enumerate(ids)}
        leased = self.poll(max_runs=3, lease_ms=5000)
        self.assertEqual(len(leased), 3)
        # Runs of different keys are in different partitions and have no
        # order between them (docs/scaling.md): the test goes on with the
        # three leased first, the two pending after them.
        first = [x["runId"] for x in leased]
        self.assertLessEqual(set(first), set(ids))
        ids = first + [i for i in ids if i not in first]
        before = now_ms()
        hb = self.ok("POST", self.run_path(ids[0], ":heartbeat"), {"lease": leased[0]["lease"], "leaseMs": 60000})
        self.assertGreaterEqual(int(hb["leaseExpiresMs"]), before + 60000 - CLOCK_SLACK_MS)
        done = self.ok("POST", self.run_path(ids[0], ":complete"),
                       {"lease": leased[0]["lease"], "result": {"answer": 42}})
        self.assertEqual(done["run"]["status"], "RUN_STATUS_COMPLETED")
        self.assertEqual(done["run"]["result"], {"answer": 42})
        again = self.ok("POST", self.run_path(ids[0], ":complete"),
                        {"lease": leased[0]["lease"], "result": {"answer": 42}})
        self.assertIs(again["alreadyFinished"], True)
        failed = self.ok("POST", self.run_path(ids[1], ":complete"), {"lease": leased[1]["lease"], "error": "boom"})
        self.assertEqual(failed["run"]["status"], "RUN_STATUS_FAILED")
        self.assertEqual(failed["run"]["error"], "boom")
        # Wrong lease: 409 FAILED_PRECONDITION, and nothing changes.
        wrong = str(uuid.uuid4())
        self.assert_error(self.curl("POST", self.run_path(ids[2], ":complete"), {"lease": wrong, "result": 1}),
                          409, 9, "FAILED_PRECONDITION", "lease")
        self.assert_error(self.curl("POST", self.run_path(ids[2], ":heartbeat"), {"lease": wrong}),
                          409, 9, "FAILED_PRECONDITION", "lease")
        self.assert_error(self.curl("POST", self.run_path(ids[2], ":complete"), {"lease": leased[2]["lease"]}),
                          400, 3, "INVALID_ARGUMENT", "outcome")
        got = self.ok("GET", self.run_path(ids[2]))
        self.assertEqual(got["status"], "RUN_STATUS_LEASED")
        self.assertNotIn("lease", got, "GetRun must not reveal the lease")
        got = self.ok("GET", self.run_path(ids[0]))
        self.assertEqual(got["result"], {"answer": 42})
        self.assertEqual(got["input"], [inputs[ids[0]]])
        self.assertIn("finishedMs", got)

        # ListRuns: paging with pageToken, filters by query parameters.
        seen, token, pages = [], None, 0
        while True:
            q = "?workflow=%s&pageSize=2" % enc(self.wf) + ("&pageToken=%s" % enc(token) if token else "")
            page = self.ok("GET", "/v1/runs" + q)
            pages += 1
            seen += page.get("runs", [])
            token = page.get("nextPageToken")
            if not token:
                break
            self.assertLess(pages, 20)
        self.assertEqual(sorted(x["runId"] for x in seen), sorted(ids))
        self.assertGreaterEqual(pages, 3)
        status = {x["runId"]: x["status"] for x in seen}
        self.assertEqual([status[i] for i in ids], ["RUN_STATUS_COMPLETED", "RUN_STATUS_FAILED", "RUN_STATUS_LEASED",
                                                    "RUN_STATUS_PENDING", "RUN_STATUS_PENDING"])
        for q, want in [("status=pending", ids[3:]), ("status=RUN_STATUS_COMPLETED", ids[:1]),
                        ("status=failed", ids[1:2]), ("status=leased&pageSize=1", ids[2:3])]:
            with self.subTest(q=q):
                page = self.ok("GET", "/v1/runs?workflow=%s&%s" % (enc(self.wf), q))
                self.assertEqual(sorted(x["runId"] for x in page.get("runs", [])), sorted(want))
        self.assertEqual(self.ok("GET", "/v1/runs?workflow=other-" + self.wf), {"runs": []})
        self.assert_error(self.curl("GET", "/v1/runs?pageToken=zz"), 400, 3, "INVALID_ARGUMENT", "page_token")
        self.assert_error(self.curl("GET", "/v1/runs?pageSize=many"), 400, 3, "INVALID_ARGUMENT", "pageSize")
        self.assert_error(self.curl("GET", "/v1/runs?status=bogus"), 400, 3, "INVALID_ARGUMENT", "status")
        self.assert_error(self.curl("GET", "/v1/runs?nosuch=1"), 400, 3, "INVALID_ARGUMENT", "nosuch")

    def test_every_list_is_present_when_empty(self):
        """The README's promise: every list of a response is there, [] when
        empty, so `jq '.runs[]'` works. Checked against the OpenAPI
        document: every array-typed property of every object the answer
        holds (nested ones too) must be present."""
        doc = self.ok("GET", "/openapi.json")
        schemas = doc["components"]["schemas"]

        def missing(schema, value, where):
            if "$ref" in schema:
                schema = schemas[schema["$ref"].split("/")[-1]]
            if isinstance(value, list):
                return [m for i, v in enumerate(value)
                        for m in missing(schema.get("items", {}), v, "%s[%d]" % (where, i))]
            if not isinstance(value, dict) or schema.get("type") != "object":
                return []
            out = []
            for name, prop in schema.get("properties", {}).items():
                if prop.get("writeOnly"):
                    continue  # another spelling a request may use; answers never do
                if prop.get("type") == "array" and name not in value:
                    out.append("%s.%s" % (where, name))
                elif name in value:
                    out += missing(prop, value[name], "%s.%s" % (where, name))
            return out

        with open(os.path.join(harness.BUILD, "handlers", "running_sum.descriptor.json")) as f:
            descriptor = json.load(f)
        self.ok("POST", "/v1/functions", descriptor)
        run = self.send("r", {"rule": {"kind": "debounce", "windowMs": 60000}, "input": 1})
        nothing = "none-" + self.wf
        answers = {
            "ListRuns": self.ok("GET", "/v1/runs?workflow=" + nothing),
            "PollRuns": self.ok("POST", "/v1/runs:poll", {"workerId": "w", "workflows": [nothing]}),
            "ListFunctions": self.ok("GET", "/v1/functions?pageSize=1"),
            "GetFunction": self.ok("GET", "/v1/functions/running_sum"),
            "ReadOutput": self.ok("GET", "/v1/functions/running_sum/output?after=0"),
            "GetKeyState": self.ok("GET", "/v1/functions/running_sum/keys/nobody"),
            "DescribeCoordinator": self.describe("batch", "nothing-here"),
            "GetRun": self.ok("GET", self.run_path(run["receipt"]["runId"])),
        }
        for name, body in answers.items():
            with self.subTest(rpc=name):
                generic, = [item for path, item in doc["paths"].items()
                            if path.startswith("/v1/keyflow.v1.") and path.endswith("/" + name)]
                schema = generic["post"]["responses"]["200"]["content"]["application/json"]["schema"]
                self.assertEqual(missing(schema, body, name), [], body)
        self.assertEqual(answers["ListRuns"], {"runs": []})
        self.assertEqual(answers["PollRuns"]["runs"], [])
        self.assertEqual(answers["ReadOutput"]["rows"], [], "the JSON rows of an empty page")
        self.assertEqual(answers["GetKeyState"]["timers"], [])
        described = answers["DescribeCoordinator"]
        self.assertEqual((described["journal"], described["recentRunIds"], described["rememberedIds"]),
                         ([], [], []))
        self.assertEqual(answers["GetRun"]["eventIds"], [])
        self.assertEqual(answers["GetFunction"]["descriptor"]["timerNames"], [])

    def test_path_query_and_body_cannot_disagree_or_hide_bytes(self):
        """A value in the path or query that decodes to a NUL byte is refused
        (as a C string it would name another key or run); a singular field
        may come from one place only (path, query or body) unless it is the
        same text; queries are bounded; nothing changes on a refusal."""
        batch = {"kind": "batch", "maxEvents": 10, "maxWaitMs": 60000}
        sent = self.send("k", {"id": "e1", "rule": batch, "input": 1})
        run_id = sent["receipt"]["runId"]
        nul = "/v1/workflows/%s/keys/k%%00junk/events" % enc(self.wf)
        self.assert_error(self.curl("POST", nul, {"rule": batch}), 400, 3, "INVALID_ARGUMENT",
                          re.compile(r"key: contains a NUL byte"))
        self.assert_error(self.curl("POST", "/v1/coordinators/batch/%s/k%%00x:cancel" % enc(self.wf), {}),
                          400, 3, "INVALID_ARGUMENT", "coordinator.key: contains a NUL byte")
        self.assert_error(self.curl("GET", "/v1/runs/%s%%00zz" % enc(run_id)), 400, 3, "INVALID_ARGUMENT",
                          "run_id: contains a NUL byte")
        self.assert_error(self.curl("GET", "/v1/runs?workflow=%s%%00zz" % enc(self.wf)), 400, 3,
                          "INVALID_ARGUMENT", "NUL")
        # A route with a body takes no query (it could only override the
        # body); a query may not repeat a singular field.
        for query in ["event.id=q1", "event.input=2", "event.id=q1&event.id=q2"]:
            self.assert_error(self.curl("POST", self.events_path("k") + "?" + query,
                                        {"id": "b1", "rule": batch, "input": 1}),
                              400, 3, "INVALID_ARGUMENT", "takes no query parameters")
        self.assert_error(self.curl("GET", "/v1/runs?workflow=a&workflow=b"), 400, 3,
                          "INVALID_ARGUMENT", "given more than once")
        # A path value repeated in the body must be the same text.
        self.assert_error(self.curl("POST", self.run_path(run_id, ":heartbeat"),
                                    {"runId": run_id + "x", "lease": "0" * 36}),
                          400, 3, "INVALID_ARGUMENT", "given more than once")
        d = self.describe("batch", "k")
        self.assertEqual(d["window"]["eventCount"], "1", "refused requests add nothing: %r" % d)
        self.assertEqual([r["id"] for r in d.get("rememberedIds", [])], ["e1"])
        # Bounded query: 64 parameters at most (each repetition counts).
        many = "&".join(["workflow=%s" % enc(self.wf)] * 65)
        self.assert_error(self.curl("GET", "/v1/runs?" + many), 400, 3,
                          "INVALID_ARGUMENT", "at most 64 parameters")
        # A whitespace-only body is an empty one ({}).
        self.ok("POST", self.coord_path("batch", "k", ":flush"), raw=" \n ")
        runs = self.poll()
        self.assertEqual([r["runId"] for r in runs], [run_id])

    def test_numbers_keep_their_value_and_short_form(self):
        """Embedded JSON is re-serialized over HTTP: numbers keep their exact
        value in the fewest digits (0.1 stays 0.1, not 0.10000000000000001),
        and the same document is accepted or refused on both transports."""
        body = '{"rule": {"kind": "batch", "maxEvents": 1}, "input": [0.1, 1e2, 2.5e-7, 7]}'
        sent = self.curl("POST", self.events_path("n"), raw=body)
        self.assertEqual(sent.status, 200, repr(sent))
        run = self.poll()[0]
        self.assertEqual(run["runId"], sent.body["receipt"]["runId"])
        got = self.curl("GET", self.run_path(run["runId"]))
        self.assertIn('"input":[[0.1,100.0,2.5e-7,7]]', got.text)
        self.assertEqual(run["input"], [[0.1, 100.0, 2.5e-7, 7]])
        # Duplicate keys in an embedded value are refused here as over gRPC.
        dup = '{"rule": {"kind": "batch"}, "input": {"a": 1, "a": 2}}'
        self.assert_error(self.curl("POST", self.events_path("n"), raw=dup), 400, 3, "INVALID_ARGUMENT",
                          "duplicate object key")
        # "\u0000" inside a JSON string is valid JSON: accepted and shown back.
        nul = '{"rule": {"kind": "batch", "maxEvents": 1}, "input": "a\\u0000b"}'
        sent = self.curl("POST", self.events_path("z"), raw=nul)
        self.assertEqual(sent.status, 200, repr(sent))
        self.assertEqual(self.poll()[0]["input"], ["a\u0000b"])

    def test_generic_rpc_route(self):
        r = self.ok("POST", "/v1/keyflow.v1.Coordinators/SendEvent",
                    {"workflow": self.wf, "key": "g", "event": {"rule": {"kind": "debounce", "windowMs": 60000},
                                                                 "input": {"via": "generic"}}})
        d = self.ok("POST", "/v1/keyflow.v1.Coordinators/DescribeCoordinator",
                    {"coordinator": {"kind": "debounce", "workflow": self.wf, "key": "g"}})
        self.assertEqual(d["window"]["runId"], r["receipt"]["runId"])
        self.assert_error(self.curl("GET", "/v1/keyflow.v1.Coordinators/DescribeCoordinator"), 405, 12,
                          "UNIMPLEMENTED", "POST")

    def test_http2_prior_knowledge(self):
        r = self.curl("POST", self.events_path("h2"), {"rule": {"kind": "debounce", "windowMs": 60000},
                                                       "input": "over h2c"}, http2=True)
        self.assertEqual(r.status, 200, repr(r))
        self.assertEqual(r.http_version, "2")
        d = self.curl("GET", self.coord_path("debounce", "h2"), http2=True)
        self.assertEqual(d.http_version, "2")
        self.assertEqual(d.body["window"]["runId"], r.body["receipt"]["runId"])
        err = self.curl("GET", "/v1/nope", http2=True)
        self.assert_error(err, 404, 5, "NOT_FOUND")

    def test_every_405_names_the_allowed_methods(self):
        """RFC 9110: a 405 carries Allow, listing what the path accepts; and
        the list is true (each method it names is not refused as 405)."""
        import http.client
        cases = [
            ("POST", "/healthz", "GET, HEAD"), ("PUT", "/readyz", "GET, HEAD"),
            ("DELETE", "/metrics", "GET, HEAD"),
            ("DELETE", "/v1/runs", "GET, HEAD"),
            ("GET", "/v1/runs:poll", "POST"),
            ("GET", self.events_path("k"), "POST"),
            ("PUT", self.coord_path("batch", "k"), "GET, HEAD"),
            # (GET .../k:flush is Describe of the key "k:flush", not a 405.)
            ("POST", self.coord_path("batch", "k", ":explode"), "GET, HEAD"),
            ("DELETE", "/v1/runs/x@y", "GET, HEAD"),
            ("PATCH", "/v1/functions", "POST, GET, HEAD"),
            ("GET", "/v1/keyflow.v1.Runs/GetRun", "POST"),
            ("PUT", "/v1/partitions", "GET, HEAD"),
        ]

        def request(method, path):
            conn = http.client.HTTPConnection("127.0.0.1", self.server.http_port, timeout=30)
            try:
                conn.request(method, path, body=b"{}" if method in ("POST", "PUT", "PATCH") else None)
                r = conn.getresponse()
                body = r.read()
                if r.status == 405:  # the JSON body names them too
                    self.assertIn("(allowed: %s)" % r.getheader("Allow"), json.loads(body)["message"])
                return r.status, r.getheader("Allow")
            finally:
                conn.close()

        for method, path, allow in cases:
            with self.subTest(method=method, path=path):
                status, header = request(method, path)
                self.assertEqual((status, header), (405, allow))
                for other in allow.split(", "):
                    self.assertNotEqual(request(other, path)[0], 405, other)
        # Answers other than 405 carry no Allow.
        self.assertIsNone(request("GET", "/healthz")[1])
        self.assertIsNone(request("GET", "/v1/nope")[1])

    def test_healthz_readyz(self):
        r = self.curl("GET", "/healthz")
        self.assertEqual(r.status, 200)
        self.assertEqual(r.body, {"status": "ok"})
        r = self.curl("GET", "/readyz")
        self.assertEqual(r.status, 200)
        self.assertEqual(r.body, {"status": "ready"})
        # Probes answer GET (and HEAD); another method is 405, not a 200.
        for path in ("/healthz", "/readyz", "/metrics"):
            for method in ("POST", "PUT", "DELETE"):
                self.assert_error(self.curl(method, path), 405, 12, "UNIMPLEMENTED", "use GET for " + path)
        r = self.curl("HEAD", "/healthz", extra=["-I"])
        self.assertEqual(r.status, 200)
        # HEAD on a GET route is that GET without the body.
        r = self.curl("HEAD", "/v1/runs?workflow=" + self.wf, extra=["-I"])
        self.assertEqual(r.status, 200)
        self.assertEqual(self.curl("HEAD", "/v1/runs/no@such", extra=["-I"]).status, 404)


@unittest.skipIf(shutil.which("curl") is None, "curl is not installed")
class ServerWideTest(Gateway):
    """Tests that look at the whole server (server-wide gauges and
    counters, a parked poll anywhere): a new keyflowd for each."""

    fresh_server = True

    def test_abandoned_http_long_poll_does_not_take_a_run(self):
        # curl gives up on a 30 s long poll after 0.5 s (the connection is
        # closed). A run created afterwards must go to a live worker.
        r = self.curl("POST", "/v1/runs:poll", {"workflows": [self.wf], "workerId": "gone", "waitMs": 30000},
                      extra=["--max-time", "0.5"], check=False)
        self.assertIsNone(r, "curl was expected to time out")
        deadline = time.time() + 3
        while time.time() < deadline and self.sample(self.metrics(), "keyflow_parked_polls") > 0:
            time.sleep(0.05)
        created = self.send("k", {"rule": {"kind": "batch", "maxEvents": 1}, "input": "work"})
        run_id = created["receipt"]["runId"]
        runs = self.poll(wait_ms=5000, worker="live")
        got = self.ok("GET", self.run_path(run_id))
        self.assertEqual([x["runId"] for x in runs], [run_id],
                         "the run went to the abandoned HTTP long poll: %r" % got)

    def test_abandoned_http_long_poll_with_a_pipelined_request_is_cancelled(self):
        """A client that pipelines one more request behind its long poll and
        then closes: the unread bytes must not hide the close (a peek at the
        socket found them and missed it), or the poll takes the next run."""
        import socket
        port = int(self.server.http_base.rsplit(":", 1)[1])
        body = json.dumps({"workflows": [self.wf], "workerId": "gone", "waitMs": 30000}).encode()
        sock = socket.create_connection(("127.0.0.1", port), timeout=10)
        sock.sendall(b"POST /v1/runs:poll HTTP/1.1\r\nHost: localhost\r\nContent-Type: application/json\r\n"
                     b"Content-Length: %d\r\n\r\n%s" % (len(body), body))
        # Parked in every partition: the gauge sums them.
        wait_until(lambda: self.sample(self.metrics(), "keyflow_parked_polls") >= 1, 10, "the poll to park")
        sock.sendall(b"GET /healthz HTTP/1.1\r\nHost: localhost\r\n\r\n")
        sock.close()
        wait_until(lambda: self.sample(self.metrics(), "keyflow_parked_polls") == 0, 5,
                   "the abandoned poll to be cancelled")
        created = self.send("k", {"rule": {"kind": "batch", "maxEvents": 1}, "input": "work"})
        runs = self.poll(wait_ms=5000, worker="live")
        self.assertEqual([x["runId"] for x in runs], [created["receipt"]["runId"]])

    def test_errors_name_the_field_and_change_nothing(self):
        path = self.events_path("bad")
        cases = [
            ("bad JSON body", dict(raw='{"rule": {"kind": "batch",'), 400, 3, "INVALID_ARGUMENT", "body"),
            ("body not an object", dict(raw='[1, 2]'), 400, 3, "INVALID_ARGUMENT", "body"),
            ("unknown field", dict(body={"rule": {"kind": "batch", "maxEventz": 3}}), 400, 3, "INVALID_ARGUMENT",
             "maxEventz"),
            ("duplicate key", dict(raw='{"rule": {"kind": "batch"}, "rule": {"kind": "debounce", "windowMs": 5}}'),
             400, 3, "INVALID_ARGUMENT", "rule"),
            ("one field under two spellings", dict(body={"rule": {"kind": "debounce", "windowMs": 5,
                                                                  "window_ms": 6}}), 400, 3,
             "INVALID_ARGUMENT", re.compile(r"window_?[mM]s")),
            ("integer with a fraction", dict(body={"rule": {"kind": "debounce", "windowMs": 1.5}}), 400, 3,
             "INVALID_ARGUMENT", "windowMs"),
            ("event id not a string", dict(body={"id": 5, "rule": {"kind": "batch"}}), 400, 3,
             "INVALID_ARGUMENT", "id"),
            ("unknown top-level field", dict(body={"rule": {"kind": "batch"}, "inptu": 1}), 400, 3,
             "INVALID_ARGUMENT", "inptu"),
            ("maxEvents not a number", dict(body={"rule": {"kind": "batch", "maxEvents": "ten"}}), 400, 3,
             "INVALID_ARGUMENT", "maxEvents"),
            ("maxEvents 0", dict(body={"rule": {"kind": "batch", "maxEvents": 0}}), 400, 3, "INVALID_ARGUMENT",
             re.compile(r"max_?[eE]vents")),
            ("maxEvents 10001", dict(body={"rule": {"kind": "batch", "maxEvents": 10001}}), 400, 3,
             "INVALID_ARGUMENT", re.compile(r"max_?[eE]vents")),
            ("windowMs 0", dict(body={"rule": {"kind": "debounce", "windowMs": 0}}), 400, 3, "INVALID_ARGUMENT",
             re.compile(r"window_?[mM]s")),
            ("unknown kind", dict(body={"rule": {"kind": "throttle", "windowMs": 5}}), 400, 3, "INVALID_ARGUMENT",
             "kind"),
            ("missing rule", dict(body={"input": 1}), 400, 3, "INVALID_ARGUMENT", "rule"),
            ("invalid JSON input text", dict(body={"rule": {"kind": "batch"}, "inputJson": "{nope"}), 400, 3,
             "INVALID_ARGUMENT", "input"),
            ("oversized key", dict(path=self.events_path("k" * 300)), 413, 8, "RESOURCE_EXHAUSTED", "key"),
            ("oversized input", dict(body={"rule": {"kind": "batch"}, "input": "x" * (256 * 1024)}), 413, 8,
             "RESOURCE_EXHAUSTED", "input"),
        ]
        for name, kw, http_status, code, status_name, field in cases:
            with self.subTest(name):
                resp = self.curl("POST", kw.get("path", path),
                                 kw.get("body", {"rule": {"kind": "batch"}} if "raw" not in kw else None),
                                 raw=kw.get("raw"))
                self.assert_error(resp, http_status, code, status_name, field)
        for kind in ("batch", "debounce"):
            d = self.describe(kind, "bad")
            self.assertFalse(d.get("exists", False), "a refused event creates no coordinator: %r" % d)
        self.assertEqual(self.sample(self.metrics(), "keyflow_coordinators"), 0)
        # Routes and methods.
        self.assert_error(self.curl("GET", "/v1/nope"), 404, 5, "NOT_FOUND", "/v1/nope")
        self.assert_error(self.curl("GET", "/v1/workflows/w/keys/k/evnts"), 404, 5, "NOT_FOUND")
        self.assert_error(self.curl("DELETE", "/v1/runs"), 405, 12, "UNIMPLEMENTED", "DELETE")
        self.assert_error(self.curl("GET", self.events_path("k")), 405, 12, "UNIMPLEMENTED")
        self.assert_error(self.curl("PUT", self.coord_path("batch", "k")), 405, 12, "UNIMPLEMENTED")
        # "k:explode" is a legal key: the path is the Describe route, which is GET only.
        self.assert_error(self.curl("POST", self.coord_path("batch", "k", ":explode")), 405, 12, "UNIMPLEMENTED")
        self.assert_error(self.curl("GET", "/v1/runs/x@y", raw="{}"), 400, 3, "INVALID_ARGUMENT", "body")
        self.assert_error(self.curl("POST", "/v1/runs:poll", {"workerId": "w", "waitMs": 0, "lease": 1}),
                          400, 3, "INVALID_ARGUMENT", "lease")
        self.assert_error(self.curl("POST", "/v1/runs:poll", {"waitMs": 0}), 400, 3, "INVALID_ARGUMENT",
                          "worker_id")
        self.assert_error(self.curl("GET", self.coord_path("sometimes", "k")), 400, 3, "INVALID_ARGUMENT",
                          "kind")

    def test_metrics(self):
        sample = 'keyflow_requests_total'
        ok_labels = 'method="SendEvent",transport="http",code="OK"'
        bad_labels = 'method="SendEvent",transport="http",code="INVALID_ARGUMENT"'
        before = self.metrics()
        self.assertIn("# TYPE keyflow_requests_total counter", before)
        n0 = self.sample(before, sample, ok_labels)
        bad0 = self.sample(before, sample, bad_labels)
        for i in range(3):
            self.send("m", {"rule": {"kind": "batch", "maxEvents": 100, "maxWaitMs": 60000}, "input": i})
        self.curl("POST", self.events_path("m"), {"rule": {"kind": "batch", "maxEvents": 0}})
        after = self.metrics()
        self.assertEqual(self.sample(after, sample, ok_labels), n0 + 3, "one OK sample per request")
        self.assertEqual(self.sample(after, sample, bad_labels), bad0 + 1)
        self.assertGreaterEqual(self.sample(after, "keyflow_events_accepted_total"), 3)
        self.assertEqual(self.sample(after, "keyflow_open_windows"), 1)
        # Every TYPE line names a known type; every sample line parses.
        for line in after.splitlines():
            if line.startswith("# TYPE "):
                self.assertRegex(line, r"^# TYPE [a-zA-Z_:][a-zA-Z0-9_:]* (counter|gauge|histogram|summary|untyped)$")
            elif line and not line.startswith("#"):
                self.assertRegex(line, r'^[a-zA-Z_:][a-zA-Z0-9_:]*(\{[^}]*\})? [0-9.eE+-]+$|^\S+ (NaN|\+Inf|-Inf)$')
        self.assertIn("# TYPE keyflow_request_duration_seconds histogram", after)
        # The SendEvent/http latency histogram: cumulative buckets ending in
        # le="+Inf", whose count equals _count.
        prefix = 'keyflow_request_duration_seconds_bucket{method="SendEvent",transport="http",le="'
        buckets = [(line[len(prefix):].split('"', 1)[0], float(line.rsplit(" ", 1)[1]))
                   for line in after.splitlines() if line.startswith(prefix)]
        self.assertGreater(len(buckets), 1)
        self.assertEqual(buckets[-1][0], "+Inf")
        counts = [c for _, c in buckets]
        self.assertEqual(counts, sorted(counts), "buckets are cumulative")
        bounds = [float(b) for b, _ in buckets[:-1]]
        self.assertEqual(bounds, sorted(bounds))
        total = self.sample(after, "keyflow_request_duration_seconds_count",
                            'method="SendEvent",transport="http"')
        self.assertEqual(buckets[-1][1], total)
        self.assertGreaterEqual(total, 4)
        # Latency series exist exactly for what a transport serves: over
        # HTTP the RPCs the OpenAPI document routes (no stream, no health,
        # no reflection); over gRPC every RPC.
        doc = self.ok("GET", "/openapi.json")
        over_http = {p.rsplit("/", 1)[1] for p in doc["paths"] if p.startswith("/v1/keyflow.v1.")}
        series = {}
        for m in re.finditer(r'^keyflow_request_duration_seconds_count\{method="([^"]+)",'
                             r'transport="([^"]+)"\}', after, re.M):
            series.setdefault(m.group(2), set()).add(m.group(1))
        self.assertEqual(series["http"], over_http)
        self.assertLess(series["http"], series["grpc"])
        self.assertLessEqual({"HealthWatch", "WorkerServe", "ServerReflectionInfo", "TailOutput"},
                             series["grpc"] - series["http"])

    def test_metrics_count_refused_bodies_and_only_synced_groups(self):
        """A request the gateway refuses while mapping its JSON is still a
        SendEvent that failed with INVALID_ARGUMENT (as over gRPC); a group
        that wrote nothing was never synced and is not a commit group."""
        bad_labels = 'method="SendEvent",transport="http",code="INVALID_ARGUMENT"'
        before = self.metrics()
        self.curl("POST", self.events_path("m"), raw='{"rule": {"kind": "batch"}, "inptu": 1}')
        self.curl("POST", self.events_path("m"), raw='{"rule": ')
        mid = self.metrics()
        self.assertEqual(self.sample(mid, "keyflow_requests_total", bad_labels),
                         self.sample(before, "keyflow_requests_total", bad_labels) + 2)
        self.assertEqual(self.sample(mid, "keyflow_request_duration_seconds_count",
                                     'method="SendEvent",transport="http"'),
                         self.sample(before, "keyflow_request_duration_seconds_count",
                                     'method="SendEvent",transport="http"') + 2)
        for _ in range(5):  # reads: nothing to write, nothing to sync
            self.curl("GET", self.coord_path("batch", "absent"))
        after = self.metrics()
        for name in ("keyflow_commit_groups_total", "keyflow_commit_group_commands_count",
                     "keyflow_commit_sync_seconds_count"):
            self.assertEqual(self.sample(after, name), self.sample(mid, name), name)


if __name__ == "__main__":
    unittest.main()
