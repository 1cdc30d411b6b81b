"""End-to-end tests of keyed process functions (DESIGN.md section 1) through
the HTTP/JSON gateway, driven with curl.

Routes (service/http/routes.h): POST /v1/functions (body: the descriptor),
GET /v1/functions/{id}, POST /v1/functions/{id}/batches, GET
/v1/functions/{id}/output?after=&limit=&wait=, GET
/v1/functions/{id}/keys/{key}. JSON: lowerCamelCase, int64 as strings on
output (numbers or strings on input), enums by name, rows as JSON objects,
errors as HTTP status + {"code", "status", "message"}.

Expected outputs come from the reference models in test_functions_grpc.py.
Every test registers functions of its own, so tests are independent though
the class shares one server. Nothing sleeps for timing.

Run:
  cd /work/main && KEYFLOW_BUILD_DIR=build-fe2e PYENV_VERSION=system python3 -m unittest \
      discover -s tests/e2e -p 'test_functions_*.py' -v
"""

import copy
import json
import os
import shutil
import subprocess
import sys
import threading
import time
import unittest
import urllib.parse

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import harness  # noqa: E402
from test_functions_grpc import (HANDLERS, INT64_MAX, HandlerFailed,  # noqa: E402
                                 RunningSumModel, SessionCounterModel, require_build,
                                 rs_descriptor, sc_descriptor, shipped_descriptor, unique)

CURL_TIMEOUT_S = 60
ACK_FIELDS = ("rowsAccepted", "activations", "timerCallbacks", "handlerCalls", "firstOutputSeq",
              "lastOutputSeq", "watermarkUs", "sequence")


def rs_json_rows(model_rows, first_seq):
    """Model output rows as the gateway prints them."""
    return [{"_seq": str(first_seq + i), "key": r["key"], "ts": str(r["ts"]),
             "sum": None if r["sum"] is None else str(r["sum"]), "previous": r["previous"]}
            for i, r in enumerate(model_rows)]


def sc_json_rows(model_rows, first_seq):
    return [{"_seq": str(first_seq + i), "key": r["key"], "ts": str(r["ts"]),
             "events": str(r["events"])} for i, r in enumerate(model_rows)]


def loose(text):
    """Field names appear as proto names or JSON names: compare loosely."""
    return text.lower().replace("_", "")


class FunctionsHttpTest(unittest.TestCase):
    server = None

    @classmethod
    def setUpClass(cls):
        require_build(cls)
        if shutil.which("curl") is None:
            raise unittest.SkipTest("curl not installed")
        # One partition: these tests model a function's output as one
        # sequence over all keys (harness.ONE_PARTITION says why).
        cls.server = harness.Keyflowd(args=harness.ONE_PARTITION + ["--plugin-dir", HANDLERS]).start()

    @classmethod
    def tearDownClass(cls):
        if cls.server is not None:
            cls.server.stop()
            cls.server.cleanup()

    # --- curl ---------------------------------------------------------------

    def curl(self, method, path, body=None, raw=None, data_file=None):
        """Returns (HTTP status, parsed JSON body or text)."""
        cmd = ["curl", "-sS", "-X", method, "--max-time", str(CURL_TIMEOUT_S),
               "-w", "\n%{http_code}", self.server.http_base + path]
        data = None
        if data_file is not None:
            cmd += ["-H", "Content-Type: application/json", "--data-binary", "@" + data_file]
        elif body is not None or raw is not None:
            data = raw if raw is not None else json.dumps(body).encode()
            cmd += ["-H", "Content-Type: application/json", "--data-binary", "@-"]
        proc = subprocess.run(cmd, input=data, capture_output=True, timeout=CURL_TIMEOUT_S + 10)
        self.assertEqual(proc.returncode, 0, "curl %s %s: %s" % (method, path,
                                                                 proc.stderr.decode()))
        text, _, status = proc.stdout.decode().rpartition("\n")
        try:
            return int(status), json.loads(text)
        except ValueError:
            return int(status), text

    def ok(self, method, path, body=None, **kw):
        status, doc = self.curl(method, path, body, **kw)
        self.assertEqual(status, 200, "%s %s -> %s %s\nserver log:\n%s"
                         % (method, path, status, doc, self.server.read_log()[-3000:]))
        return doc

    def error(self, method, path, body, http_status, grpc_status, *fragments, **kw):
        status, doc = self.curl(method, path, body, **kw)
        self.assertEqual(status, http_status, "%s %s -> %s" % (method, path, doc))
        self.assertIsInstance(doc, dict, doc)
        self.assertEqual(doc.get("status"), grpc_status, doc)
        self.assertIsInstance(doc.get("code"), int, doc)
        self.assertIsInstance(doc.get("message"), str, doc)
        for frag in fragments:
            self.assertIn(loose(frag), loose(doc["message"]), doc)
        return doc["message"]

    # --- function helpers -----------------------------------------------------

    def register(self, descriptor):
        return self.ok("POST", "/v1/functions", descriptor)

    def push_body(self, producer, sequence, rows, watermark=None):
        body = {"producerId": producer, "sequence": str(sequence)}
        if rows is not None:
            body["rows"] = rows
        if watermark is not None:
            body["watermarkUs"] = str(watermark)
        return body

    def push(self, d, producer, sequence, rows, watermark=None):
        return self.ok("POST", "/v1/functions/%s/batches" % d["functionId"],
                       self.push_body(producer, sequence, rows, watermark))

    def push_error(self, d, producer, sequence, rows, http_status, grpc_status, *fragments,
                   watermark=None):
        return self.error("POST", "/v1/functions/%s/batches" % d["functionId"],
                          self.push_body(producer, sequence, rows, watermark), http_status,
                          grpc_status, *fragments)

    def ack(self, doc):
        """An ack with proto3 JSON defaults filled in, int64s as ints."""
        out = {k: int(doc.get(k, "0")) for k in ACK_FIELDS}
        out["duplicate"] = doc.get("duplicate", False)
        return out

    def output(self, d, after=0, limit=None, wait=None):
        q = {"after": after}
        if limit is not None:
            q["limit"] = limit
        if wait is not None:
            q["wait"] = wait
        return self.ok("GET", "/v1/functions/%s/output?%s"
                       % (d["functionId"], urllib.parse.urlencode(q)))

    def read_all(self, d, page=7):
        rows, after = [], 0
        while True:
            doc = self.output(d, after, page)
            got = doc.get("rows", [])
            if not got:
                # proto3 JSON leaves zero values out
                self.assertNotIn("firstSeq", doc)
                self.assertEqual(doc.get("nextAfterSeq", "0"), str(after))
                return rows
            self.assertEqual(doc["firstSeq"], got[0]["_seq"])
            self.assertEqual(doc["lastSeq"], got[-1]["_seq"])
            self.assertEqual(doc["nextAfterSeq"], doc["lastSeq"])
            rows += got
            after = int(doc["nextAfterSeq"])

    def key_state(self, d, key):
        # '.' too: clients remove "." and ".." path segments (RFC 3986).
        path = urllib.parse.quote(key, safe="").replace(".", "%2E")
        return self.ok("GET", "/v1/functions/%s/keys/%s" % (d["functionId"], path))

    def info(self, d):
        return self.ok("GET", "/v1/functions/%s" % d["functionId"])

    def assert_rs_keys(self, d, model, keys):
        for k in keys:
            doc = self.key_state(d, k)
            kind, value = model.expected_state(k)
            self.assertEqual(doc["keyText"], k)
            self.assertEqual(doc["state"], kind, k)
            self.assertEqual(int(doc.get("value", "0")), value, k)
            self.assertEqual(doc.get("timers", []), [], k)
            self.assertEqual(doc["valueStateName"], "sum")

    def assert_sc_keys(self, d, model, keys):
        for k in keys:
            doc = self.key_state(d, k)
            if k in model.count:
                self.assertEqual((doc["state"], doc["value"]),
                                 ("STATE_KIND_VALUE", str(model.count[k])), k)
            else:
                self.assertEqual(doc["state"], "STATE_KIND_ABSENT", k)
                self.assertNotIn("value", doc)
            expected = [{"name": "idle", "atUs": str(model.timers[k])}] if k in model.timers \
                else []
            self.assertEqual(doc.get("timers", []), expected, k)

    # =========================================================================

    def test_register_shipped_descriptor_idempotent(self):
        # The shipped descriptors, byte for byte as the build wrote them.
        for name in ("running_sum", "session_counter"):
            with self.subTest(function=name):
                path = os.path.join(HANDLERS, name + ".descriptor.json")
                first = self.ok("POST", "/v1/functions", data_file=path)
                fn = first["function"]
                self.assertFalse(first.get("alreadyRegistered", False))
                self.assertTrue(fn["available"])
                self.assertRegex(fn["descriptorSha256"], r"^[0-9a-f]{64}$")
                desc = fn["descriptor"]
                shipped = shipped_descriptor(name)
                for field in ("functionId", "pipelineStateId", "runtime",
                              "implementationDigest", "determinism", "inputSchema",
                              "outputSchema", "keyColumns", "eventTimeColumn",
                              "outputEventTimeColumn", "valueStateName"):
                    self.assertEqual(desc[field], shipped[field], field)
                self.assertEqual(desc.get("timerNames", []), shipped["timerNames"])
                self.assertEqual(desc["limits"], {
                    "maxKeys": "100000", "maxTimers": "100000", "maxStateBytes": "67108864",
                    "maxBatchRows": "256", "maxInputRows": "4096", "maxInputBytes": "16777216",
                    "maxOutputRows": "4096", "maxOutputBytes": "16777216",
                    "maxTimerCallbacksPerStep": "256"})
                again = self.ok("POST", "/v1/functions", data_file=path)
                self.assertIs(again["alreadyRegistered"], True)
                self.assertEqual(again["function"]["descriptorSha256"], fn["descriptorSha256"])
                got = self.ok("GET", "/v1/functions/" + name)
                self.assertEqual(got["descriptorSha256"], fn["descriptorSha256"])
                self.assertEqual(got["descriptor"], desc)
        listed = self.ok("GET", "/v1/functions")
        ids = [f["descriptor"]["functionId"] for f in listed["functions"]]
        self.assertIn("running_sum", ids)
        self.assertIn("session_counter", ids)

    def test_register_conflicts(self):
        d = rs_descriptor()
        sha = self.register(d)["function"]["descriptorSha256"]
        other = copy.deepcopy(d)
        other["limits"] = {"maxInputRows": "10"}
        self.error("POST", "/v1/functions", other, 409, "ALREADY_EXISTS", "function_id")
        reuse = rs_descriptor()
        reuse["pipelineStateId"] = d["pipelineStateId"]
        status, doc = self.curl("POST", "/v1/functions", reuse)
        self.assertIn(status, (400, 409), doc)
        self.assertIn(loose("pipeline_state_id"), loose(doc["message"]))
        self.error("GET", "/v1/functions/" + reuse["functionId"], None, 404, "NOT_FOUND")
        self.assertEqual(self.info(d)["descriptorSha256"], sha)

    def test_bad_descriptors(self):
        def field(d, which, name):
            return next(f for f in d[which]["fields"] if f["name"] == name)

        cases = [
            ("unknown type name", lambda d: field(d, "inputSchema", "amount").update(
                type="FIELD_TYPE_BOGUS"), "type"),
            ("unknown type number", lambda d: field(d, "inputSchema", "amount").update(type=99),
             "input_schema"),
            ("key column missing", lambda d: d.update(keyColumns=["who"]), "key_columns"),
            ("key column nullable", lambda d: field(d, "inputSchema", "user").update(
                nullable=True), "key_columns"),
            ("key column not UTF8", lambda d: d.update(keyColumns=["amount"]), "key_columns"),
            ("event time nullable", lambda d: field(d, "inputSchema", "ts").update(
                nullable=True), "event_time_column"),
            ("event time INT64", lambda d: d.update(eventTimeColumn="amount"),
             "event_time_column"),
            ("duplicate input field", lambda d: d["inputSchema"]["fields"].append(
                {"name": "user", "type": "FIELD_TYPE_UTF8"}), "input_schema"),
            ("zero limit", lambda d: d.update(limits={"maxInputRows": 0}), "max_input_rows"),
            ("zero limit as string", lambda d: d.update(limits={"maxBatchRows": "0"}),
             "max_batch_rows"),
            ("limit out of range", lambda d: d.update(limits={"maxOutputRows": "999999999999"}),
             "max_output_rows"),
            ("negative limit", lambda d: d.update(limits={"maxKeys": -5}), "max_keys"),
            ("version 0", lambda d: d.pop("version"), "version"),
        ]
        for name, mutate, fragment in cases:
            with self.subTest(case=name):
                d = rs_descriptor()
                mutate(d)
                self.error("POST", "/v1/functions", d, 400, "INVALID_ARGUMENT", fragment)
                self.error("GET", "/v1/functions/" + d["functionId"], None, 404, "NOT_FOUND")
        self.error("POST", "/v1/functions", None, 400, "INVALID_ARGUMENT", raw=b"{not json")
        self.error("POST", "/v1/functions", None, 400, "INVALID_ARGUMENT", raw=b"[]")

    def test_push_json_rows_state_and_output(self):
        d = rs_descriptor(reset=True)
        self.register(d)
        model = RunningSumModel()
        batches = [
            # int64s as numbers and as strings; a null and a missing nullable column
            [{"user": "alice", "ts": "10", "amount": 5}, {"user": "bob", "ts": 11,
                                                          "amount": None},
             {"user": "carol", "ts": 12}],
            [{"user": "alice", "ts": 13, "amount": "-7"}, {"user": "bob", "ts": "14",
                                                           "amount": "3"},
             {"user": "carol", "ts": 15, "amount": 2, "reset": True},
             {"user": "alice", "ts": 16, "amount": None, "reset": False}],
            [{"user": "alice", "ts": 17, "amount": 1}, {"user": "carol", "ts": 18,
                                                        "amount": 4, "reset": None}],
        ]
        seq_out = 0
        for seq, rows in enumerate(batches, 1):
            ack = self.ack(self.push(d, "p", seq, rows))
            norm = [dict(r, ts=int(r["ts"]), amount=None if r.get("amount") is None
                         else int(r["amount"])) for r in rows]
            out, calls = model.push(norm)
            self.assertEqual(ack, {"rowsAccepted": len(rows), "activations": len(rows),
                                   "timerCallbacks": 0, "handlerCalls": calls,
                                   "firstOutputSeq": seq_out + 1,
                                   "lastOutputSeq": seq_out + len(out), "watermarkUs": 0,
                                   "sequence": seq, "duplicate": False})
            seq_out += len(out)
        self.assertEqual(self.read_all(d), rs_json_rows(model.output, 1))
        self.assertEqual([(r["key"], r["sum"], r["previous"]) for r in model.output], [
            ("alice", 5, "absent"), ("bob", None, "absent"), ("carol", None, "absent"),
            ("alice", -2, "value"), ("bob", 3, "null"), ("carol", None, "null"),
            ("alice", None, "value"), ("alice", 1, "null"), ("carol", 4, "absent")])
        self.assert_rs_keys(d, model, ["alice", "bob", "carol", "nobody"])
        info = self.info(d)
        self.assertEqual((info["outputSeq"], info["keys"]), ("9", "3"))

    def test_dry_run_answers_what_a_push_would_do_and_changes_nothing(self):
        d = rs_descriptor()
        self.register(d)
        self.push(d, "p", 1, [{"user": "alice", "ts": 1, "amount": 5}])
        path = "/v1/functions/%s/dry-run" % d["functionId"]
        doc = self.ok("POST", path, {"rows": [{"user": "alice", "ts": 2, "amount": 3},
                                              {"user": "bob", "ts": 2, "amount": 1}],
                                     "watermarkUs": "2", "format": "ROW_FORMAT_JSON"})
        self.assertEqual((doc["rowsAccepted"], doc["firstOutputSeq"], doc["watermarkUs"]),
                         ("2", "2", "2"))
        out = json.loads(doc["outputJson"]) if isinstance(doc["outputJson"], str) \
            else doc["outputJson"]
        self.assertEqual([(r["_seq"], r["key"], r["sum"]) for r in out],
                         [("2", "alice", "8"), ("3", "bob", "1")])
        # In canonical key order: the length-prefixed bytes put "bob" first.
        self.assertEqual([(c["keyText"], c["stateBefore"], c.get("valueAfter"))
                          for c in doc["changes"]],
                         [("bob", "STATE_KIND_ABSENT", "1"), ("alice", "STATE_KIND_VALUE", "8")])
        # Nothing was applied: the output and alice's sum are as they were.
        self.assertEqual(len(self.read_all(d)), 1)
        self.assertEqual(self.info(d)["outputSeq"], "1")
        self.assertNotIn("watermarkUs", self.info(d))
        # A batch the push would refuse is refused the same way.
        self.error("POST", path, {"rows": [{"user": "alice", "ts": 3, "amount": "x"}]}, 400,
                   "INVALID_ARGUMENT", "rows[0].amount")

    def test_replay_of_a_kept_batch(self):
        d = rs_descriptor()
        self.register(d)
        self.push(d, "p", 1, [{"user": "alice", "ts": 1, "amount": 5}])
        self.push(d, "p", 2, [{"user": "alice", "ts": 2, "amount": 3},
                              {"user": "bob", "ts": 2, "amount": 1}])
        self.push(d, "p", 3, [{"user": "alice", "ts": 3, "amount": 1}])
        path = "/v1/functions/%s/producers/p/batches/2:replay" % d["functionId"]
        doc = self.ok("POST", path, {})
        self.assertEqual(doc, {"reproduced": True, "recordedOutputRows": "2",
                               "replayedOutputRows": "2", "keysCompared": "2"})
        self.assertEqual(self.info(d)["outputSeq"], "4", "nothing applied")
        self.error("POST", "/v1/functions/%s/producers/p/batches/7:replay" % d["functionId"], {},
                   404, "NOT_FOUND", "sequence 7")
        self.error("POST", "/v1/functions/%s/producers/p/batches/x:replay" % d["functionId"], {},
                   400, "INVALID_ARGUMENT", "sequence")

    def test_one_activation_per_key_per_call(self):
        d = rs_descriptor()
        self.register(d)
        model = RunningSumModel()
        rows = [{"user": u, "ts": 100 - i, "amount": i + 1}
                for i, u in enumerate("aabab" + "ccca")]
        ack = self.ack(self.push(d, "p", 1, rows))
        _, calls = model.push(rows)
        self.assertEqual(calls, 5)
        self.assertEqual((ack["handlerCalls"], ack["activations"]), (5, 9))
        self.assertEqual(self.read_all(d), rs_json_rows(model.output, 1))
        self.assertEqual([r["sum"] for r in model.output if r["key"] == "a"], [1, 3, 7, 16])

    def test_session_counter_timers(self):
        d = sc_descriptor()
        self.register(d)
        model = SessionCounterModel()
        steps = [
            ([{"user": "u1", "ts": 100, "idle_us": 50}, {"user": "u3", "ts": "90",
                                                         "idle_us": "20"},
              {"user": "u2", "ts": 100, "idle_us": 10}, {"user": "u1", "ts": 120,
                                                         "idle_us": 50}], None),
            (None, 110),
            ([{"user": "u4", "ts": 5, "idle_us": 1}], 109),   # late row; lower watermark ignored
            ([{"user": "u2", "ts": 130}], 171),
        ]
        for seq, (rows, wm) in enumerate(steps, 1):
            norm = None if rows is None else [
                {"user": r["user"], "ts": int(r["ts"]),
                 "idle_us": None if r.get("idle_us") is None else int(r["idle_us"])}
                for r in rows]
            first = len(model.output) + 1
            expected, out = model.push(norm, wm)
            ack = self.ack(self.push(d, "p", seq, rows, wm))
            self.assertEqual({"rowsAccepted": ack["rowsAccepted"],
                              "activations": ack["activations"],
                              "timerCallbacks": ack["timerCallbacks"],
                              "handlerCalls": ack["handlerCalls"],
                              "watermarkUs": ack["watermarkUs"]},
                             {"rowsAccepted": expected["rows_accepted"],
                              "activations": expected["activations"],
                              "timerCallbacks": expected["timer_callbacks"],
                              "handlerCalls": expected["handler_calls"],
                              "watermarkUs": expected["watermark_us"]}, "step %d" % seq)
            if out:
                self.assertEqual((ack["firstOutputSeq"], ack["lastOutputSeq"]),
                                 (first, first + len(out) - 1))
            self.assert_sc_keys(d, model, ["u1", "u2", "u3", "u4"])
        self.assertEqual(model.output, [
            {"key": "u2", "ts": 110, "events": 1}, {"key": "u3", "ts": 110, "events": 1},
            {"key": "u4", "ts": 111, "events": 1}, {"key": "u1", "ts": 170, "events": 2}])
        self.assertEqual(self.read_all(d), sc_json_rows(model.output, 1))
        info = self.info(d)
        self.assertEqual((info["watermarkUs"], info["timers"], info["keys"]),
                         ("171", "1", "1"))

    def test_session_counter_saturates_at_int64_max(self):
        d = sc_descriptor()
        self.register(d)
        model = SessionCounterModel()
        rows = [{"user": "end", "ts": str(INT64_MAX - 5), "idle_us": "100"}]
        self.push(d, "p", 1, rows)
        model.push([{"user": "end", "ts": INT64_MAX - 5, "idle_us": 100}])
        self.assertEqual(model.timers["end"], INT64_MAX)
        self.assert_sc_keys(d, model, ["end"])
        ack = self.ack(self.push(d, "p", 2, None, watermark=INT64_MAX))
        self.assertEqual((ack["timerCallbacks"], ack["watermarkUs"]), (1, INT64_MAX))
        self.assertEqual(self.read_all(d), [
            {"_seq": "1", "key": "end", "ts": str(INT64_MAX), "events": "1"}])
        # No timer can be set after the end of time: the handler refuses.
        self.push_error(d, "p", 3, [{"user": "late", "ts": 1}], 409, "FAILED_PRECONDITION",
                        "INT64_MAX")
        self.assertEqual(self.key_state(d, "late")["state"], "STATE_KIND_ABSENT")

    def test_rejected_handler_response_changes_nothing(self):
        d = rs_descriptor()
        self.register(d)
        model = RunningSumModel()
        good = [{"user": "k", "ts": 1, "amount": 40}, {"user": "x", "ts": 1, "amount": -1}]
        self.push(d, "p", 1, good, watermark=5)
        model.push(good)
        before = (self.info(d), self.read_all(d),
                  [self.key_state(d, k) for k in ("k", "x", "y")])

        bad = [{"user": "y", "ts": 9, "amount": str(INT64_MAX)}, {"user": "k", "ts": 9,
                                                                  "amount": 2},
               {"user": "y", "ts": 10, "amount": str(INT64_MAX)}]
        with self.assertRaises(HandlerFailed):
            RunningSumModel().push([dict(r, amount=int(r["amount"])) for r in bad])
        message = self.push_error(d, "p", 2, bad, 409, "FAILED_PRECONDITION", "overflow",
                                  watermark=1000)
        self.assertIn("'y'", message)
        after = (self.info(d), self.read_all(d), [self.key_state(d, k) for k in ("k", "x", "y")])
        self.assertEqual(after, before)
        self.assertEqual(after[0]["watermarkUs"], "5")

        rows = [{"user": "y", "ts": 11, "amount": 3}, {"user": "k", "ts": 11, "amount": 2}]
        ack = self.ack(self.push(d, "p", 2, rows, watermark=1000))
        model.push(rows)
        self.assertEqual((ack["duplicate"], ack["firstOutputSeq"], ack["lastOutputSeq"],
                          ack["watermarkUs"]), (False, 3, 4, 1000))
        self.assertEqual(self.read_all(d), rs_json_rows(model.output, 1))
        self.assert_rs_keys(d, model, ["k", "x", "y"])

    def test_idempotent_retry_and_old_sequences(self):
        d = rs_descriptor()
        self.register(d)
        model = RunningSumModel()
        acks = {}
        for seq in range(1, 4):
            rows = [{"user": "r", "ts": seq, "amount": seq}]
            acks[seq] = self.ack(self.push(d, "p", seq, rows, watermark=seq))
            model.push(rows)
        for seq in (1, 3):
            again = self.ack(self.push(d, "p", seq, [{"user": "r", "ts": seq, "amount": seq}],
                                       watermark=seq))
            self.assertTrue(again["duplicate"])
            self.assertEqual(dict(again, duplicate=False), acks[seq])
        self.assertEqual(self.read_all(d), rs_json_rows(model.output, 1))
        # sequence as a JSON number works as well
        status, doc = self.curl("POST", "/v1/functions/%s/batches" % d["functionId"],
                                {"producerId": "p", "sequence": 2, "watermarkUs": 2,
                                 "rows": [{"user": "r", "ts": 2, "amount": 2}]})
        self.assertEqual(status, 200, doc)
        self.assertEqual(dict(self.ack(doc), duplicate=False), acks[2])
        # The same sequence with other rows, or without its watermark, is a
        # conflict: 409 ALREADY_EXISTS naming the sequence, nothing applied.
        self.push_error(d, "p", 2, [{"user": "r", "ts": 2, "amount": 3}], 409, "ALREADY_EXISTS",
                        "sequence: 2", watermark=2)
        self.push_error(d, "p", 2, [{"user": "r", "ts": 2, "amount": 2}], 409, "ALREADY_EXISTS",
                        "sequence: 2")
        for seq in range(4, 54):
            rows = [{"user": "r", "ts": seq, "amount": 1}]
            self.push(d, "p", seq, rows)
            model.push(rows)
        self.push_error(d, "p", 1, [{"user": "r", "ts": 1, "amount": 1}], 409,
                        "FAILED_PRECONDITION", "sequence")
        self.assertEqual(self.read_all(d), rs_json_rows(model.output, 1))
        self.assert_rs_keys(d, model, ["r"])

    def test_batch_over_max_input_rows(self):
        d = rs_descriptor(limits={"maxInputRows": "3"})
        info = self.register(d)["function"]
        self.assertEqual(info["descriptor"]["limits"]["maxInputRows"], "3")
        rows = [{"user": "u", "ts": i, "amount": 1} for i in range(4)]
        self.push_error(d, "p", 1, rows, 413, "RESOURCE_EXHAUSTED", "max_input_rows")
        self.assertEqual(self.read_all(d), [])
        ack = self.ack(self.push(d, "p", 1, rows[:3]))
        self.assertEqual((ack["rowsAccepted"], ack["lastOutputSeq"]), (3, 3))

    def test_input_rows_that_do_not_match_the_schema(self):
        d = rs_descriptor()
        self.register(d)
        path = "/v1/functions/%s/batches" % d["functionId"]
        cases = [
            ("unknown column", [{"user": "a", "ts": 1, "amount": 1, "extra": 1}], "extra"),
            ("missing key", [{"ts": 1, "amount": 1}], "user"),
            ("null key", [{"user": None, "ts": 1, "amount": 1}], "user"),
            ("missing event time", [{"user": "a", "amount": 1}], "ts"),
            ("string for INT64", [{"user": "a", "ts": 1, "amount": "ten"}], "amount"),
            ("fraction for INT64", [{"user": "a", "ts": 1, "amount": 1.5}], "amount"),
            ("int64 out of range", [{"user": "a", "ts": 1, "amount": "9223372036854775808"}],
             "amount"),
            ("number for UTF8", [{"user": 7, "ts": 1, "amount": 1}], "user"),
            ("row not an object", [["a", 1, 1]], "rows"),
            ("NUL in UTF8", [{"user": "a\u0000b", "ts": 1, "amount": 1}], ""),
        ]
        for name, rows, fragment in cases:
            with self.subTest(case=name):
                self.error("POST", path, {"producerId": "p", "sequence": "1", "rows": rows},
                           400, "INVALID_ARGUMENT", fragment)
        self.error("POST", path, {"producerId": "p", "sequence": "1", "rows": {"user": "a"}},
                   400, "INVALID_ARGUMENT", "rows")
        self.error("POST", path, {"producerId": "p", "sequence": "0", "rows": []},
                   400, "INVALID_ARGUMENT", "sequence")
        self.error("POST", path, {"sequence": "1", "rows": []}, 400, "INVALID_ARGUMENT",
                   "producer_id")
        self.error("POST", path, None, 400, "INVALID_ARGUMENT", raw=b'{"producerId": ')
        # Nothing was applied; sequence 1 is still free.
        self.assertEqual(self.read_all(d), [])
        ack = self.ack(self.push(d, "p", 1, [{"user": "a", "ts": 1, "amount": 1}]))
        self.assertEqual((ack["duplicate"], ack["firstOutputSeq"]), (False, 1))

    def test_output_paging(self):
        d = rs_descriptor()
        self.register(d)
        model = RunningSumModel()
        for seq in range(1, 6):
            rows = [{"user": "k%d" % (i % 3), "ts": seq * 10 + i, "amount": seq + i}
                    for i in range(5)]
            self.push(d, "p", seq, rows)
            model.push(rows)
        expected = rs_json_rows(model.output, 1)
        doc = self.output(d, 0, 10)
        self.assertEqual((doc["firstSeq"], doc["lastSeq"], doc["nextAfterSeq"],
                          doc["highWaterSeq"]), ("1", "10", "10", "25"))
        self.assertEqual(doc["rows"], expected[:10])
        doc = self.output(d, 10, 10)
        self.assertEqual((doc["firstSeq"], doc["lastSeq"], doc["nextAfterSeq"]),
                         ("11", "20", "20"))
        self.assertEqual(doc["rows"], expected[10:20])
        doc = self.output(d, 20, 10)
        self.assertEqual((doc["firstSeq"], doc["lastSeq"], doc["nextAfterSeq"]),
                         ("21", "25", "25"))
        self.assertEqual(doc["rows"], expected[20:])
        doc = self.output(d, 25, 10)
        self.assertEqual(doc.get("rows", []), [])
        self.assertEqual((doc.get("firstSeq", "0"), doc["nextAfterSeq"], doc["highWaterSeq"]),
                         ("0", "25", "25"))
        self.assertEqual(self.output(d)["rows"], expected)  # default limit
        for page in (1, 3, 6, 25):
            with self.subTest(page=page):
                self.assertEqual(self.read_all(d, page), expected)
        for query, fragment in [("after=-1", "after"), ("limit=70000", "limit"),
                                ("after=x", "after"), ("wait=-5", "wait")]:
            with self.subTest(query=query):
                self.error("GET", "/v1/functions/%s/output?%s" % (d["functionId"], query), None,
                           400, "INVALID_ARGUMENT", fragment)

    def test_output_long_poll(self):
        d = rs_descriptor()
        self.register(d)
        self.push(d, "p", 1, [{"user": "w", "ts": 1, "amount": 1}])
        t0 = time.monotonic()
        doc = self.output(d, 1, wait=300)
        self.assertGreaterEqual(time.monotonic() - t0, 0.25)
        self.assertEqual(doc.get("rows", []), [])
        self.assertEqual((doc["nextAfterSeq"], doc["highWaterSeq"]), ("1", "1"))

        result = {}

        def poll():
            try:
                result["doc"] = self.curl("GET", "/v1/functions/%s/output?after=1&wait=30000"
                                          % d["functionId"])
            except BaseException as e:  # reported by the main thread
                result["doc"] = (None, repr(e))

        thread = threading.Thread(target=poll, daemon=True)
        t0 = time.monotonic()
        thread.start()
        self.push(d, "p", 2, [{"user": "w", "ts": 2, "amount": 2}])
        thread.join(timeout=CURL_TIMEOUT_S)
        self.assertFalse(thread.is_alive())
        self.assertLess(time.monotonic() - t0, 20)
        status, doc = result["doc"]
        self.assertEqual(status, 200, doc)
        self.assertEqual(doc["rows"], [{"_seq": "2", "key": "w", "ts": "2", "sum": "3",
                                        "previous": "value"}])

    def test_key_state_and_special_keys(self):
        d = rs_descriptor()
        self.register(d)
        model = RunningSumModel()
        keys = ["a/b", "x y", "caf\u00e9", "%41", "q?r#s", "..", ".", "-", "a:b"]
        rows = [{"user": k, "ts": i, "amount": i + 1} for i, k in enumerate(keys)]
        self.push(d, "p", 1, rows)
        model.push(rows)
        self.assert_rs_keys(d, model, keys + ["never"])
        self.assertEqual(self.read_all(d), rs_json_rows(model.output, 1))

        two = rs_descriptor(extra_inputs=("region",), key_columns=["region", "user"])
        self.register(two)
        m2 = RunningSumModel(key_columns=("region", "user"))
        rows = [{"region": "eu", "user": "a/b", "ts": 1, "amount": 2},
                {"region": "eu", "user": "a/b", "ts": 2, "amount": 3}]
        self.push(two, "p", 1, rows)
        m2.push(rows)
        doc = self.key_state(two, '["eu","a/b"]')
        self.assertEqual((doc["keyText"], doc["state"], doc["value"]),
                         ('["eu","a/b"]', "STATE_KIND_VALUE", "5"))
        self.assertEqual(self.read_all(two), rs_json_rows(m2.output, 1))
        self.error("GET", "/v1/functions/%s/keys/x" % unique("none"), None, 404, "NOT_FOUND")

    def test_error_shapes(self):
        self.error("GET", "/v1/functions/" + unique("none"), None, 404, "NOT_FOUND",
                   "function_id")
        self.error("POST", "/v1/functions/%s/batches" % unique("none"),
                   {"producerId": "p", "sequence": "1", "rows": []}, 404, "NOT_FOUND")
        self.error("GET", "/v1/functions/%s/output" % unique("none"), None, 404, "NOT_FOUND")
        status, _ = self.curl("PUT", "/v1/functions/x")
        self.assertEqual(status, 405)
        status, _ = self.curl("GET", "/v1/no/such/route")
        self.assertEqual(status, 404)

    def test_generic_rpc_route(self):
        d = rs_descriptor()
        self.register(d)
        self.push(d, "p", 1, [{"user": "g", "ts": 1, "amount": 6}])
        doc = self.ok("POST", "/v1/keyflow.v1.Functions/GetKeyState",
                      {"functionId": d["functionId"], "key": "g"})
        self.assertEqual((doc["state"], doc["value"]), ("STATE_KIND_VALUE", "6"))


if __name__ == "__main__":
    unittest.main()
