"""End-to-end tests of keyed process functions (DESIGN.md section 1) over gRPC.

The real keyflowd runs with the example handlers of <build>/handlers
(running_sum.so, session_counter.so). Every test registers functions of its
own (unique function_id and pipeline_state_id, same .so digest), so tests do
not see each other's state even though a class shares one server. Expected
outputs come from small reference models of the two handlers below
(RunningSumModel, SessionCounterModel); test_functions_http.py and the crash
test import them.

Nothing sleeps for timing: long polls and streams are waited on with
deadlines.

Run (Debian's Python, which has grpcio):
  cd /work/main && KEYFLOW_BUILD_DIR=build-fe2e PYENV_VERSION=system python3 -m unittest \
      discover -s tests/e2e -p 'test_functions_*.py' -v
"""

import copy
import json
import os
import queue
import struct
import sys
import threading
import time
import unittest
import uuid

# grpc must be imported before harness.stubs() puts the generated stubs on
# sys.path: api/grpc/health makes a package named `grpc` there too.
import grpc  # noqa: E402

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import harness  # noqa: E402

HANDLERS = os.path.join(harness.BUILD, "handlers")
INT64_MAX = 2 ** 63 - 1
INT64_MIN = -(2 ** 63)
RPC_TIMEOUT_S = 30
SC_IDLE_DEFAULT_US = 60000000

pb = None  # keyflow.v1.functions_pb2, loaded by load_stubs()
pg = None  # keyflow.v1.functions_pb2_grpc
json_format = None


def load_stubs():
    global pb, pg, json_format
    if pb is None:
        harness.stubs()
        from google.protobuf import json_format as jf
        from keyflow.v1 import functions_pb2, functions_pb2_grpc
        pb, pg, json_format = functions_pb2, functions_pb2_grpc, jf


def unique(prefix):
    return "%s-%s" % (prefix, uuid.uuid4().hex[:12])


def require_build(test_case_cls):
    for path in (harness.KEYFLOWD, os.path.join(HANDLERS, "running_sum.so"),
                 os.path.join(HANDLERS, "running_sum.descriptor.json"),
                 os.path.join(HANDLERS, "session_counter.so"),
                 os.path.join(HANDLERS, "session_counter.descriptor.json")):
        if not os.path.exists(path):
            raise unittest.SkipTest("not built: %s" % path)


# --- descriptors ------------------------------------------------------------

def shipped_descriptor(name):
    """The descriptor the build wrote (proto3 JSON, real digest)."""
    with open(os.path.join(HANDLERS, name + ".descriptor.json")) as f:
        return json.load(f)


def rs_descriptor(function_id=None, limits=None, reset=False, key_columns=None, extra_inputs=()):
    """A running_sum descriptor of its own identity (same .so digest)."""
    d = shipped_descriptor("running_sum")
    d["functionId"] = function_id or unique("rs")
    d["pipelineStateId"] = d["functionId"] + ".state"
    if reset:
        d["inputSchema"]["fields"].append({"name": "reset", "type": "FIELD_TYPE_BOOL",
                                           "nullable": True})
    for name in extra_inputs:
        d["inputSchema"]["fields"].insert(0, {"name": name, "type": "FIELD_TYPE_UTF8"})
    if key_columns is not None:
        d["keyColumns"] = list(key_columns)
    if limits:
        d["limits"] = dict(limits)
    return d


def sc_descriptor(function_id=None, limits=None):
    d = shipped_descriptor("session_counter")
    d["functionId"] = function_id or unique("sc")
    d["pipelineStateId"] = d["functionId"] + ".state"
    if limits:
        d["limits"] = dict(limits)
    return d


# --- reference models --------------------------------------------------------

def canonical_key(parts):
    """DESIGN.md: the length-prefixed concatenation of the key columns' UTF-8."""
    out = b""
    for p in parts:
        raw = p.encode("utf-8")
        out += struct.pack(">I", len(raw)) + raw
    return out


def key_text(parts):
    """handler.h: the key column's value for one key column, else a JSON array."""
    if len(parts) == 1:
        return parts[0]
    return json.dumps(list(parts), separators=(",", ":"), ensure_ascii=False)


def count_calls(keys, max_batch_rows):
    """Handler calls for rows of these keys: a call ends at max_batch_rows
    activations or before a second row of a key already in it."""
    calls, in_call = 0, set()
    for k in keys:
        if not in_call or k in in_call or len(in_call) >= max_batch_rows:
            calls += 1
            in_call = set()
        in_call.add(k)
    return calls


class HandlerFailed(Exception):
    """The model's handler refused the call: the whole batch is rejected."""


class RunningSumModel:
    """running_sum (handlers/README.md): state absent | None (null) | int."""

    ABSENT = object()

    def __init__(self, key_columns=("user",), max_batch_rows=256):
        self.key_columns = tuple(key_columns)
        self.max_batch_rows = max_batch_rows
        self.state = {}      # key text -> None | int (missing: absent)
        self.output = []     # every output row so far: {key, ts, sum, previous}

    def key_of(self, row):
        return key_text([row[c] for c in self.key_columns])

    def push(self, rows):
        """Applies one batch atomically; returns (output rows, handler calls).
        Raises HandlerFailed (and changes nothing) on int64 overflow."""
        state = dict(self.state)
        out = []
        for row in rows:
            k = self.key_of(row)
            prev = state.get(k, self.ABSENT)
            previous = "absent" if prev is self.ABSENT else ("null" if prev is None else "value")
            if row.get("reset"):
                state.pop(k, None)
                s = None
            elif row.get("amount") is None:
                state[k] = None
                s = None
            else:
                base = prev if isinstance(prev, int) and prev is not self.ABSENT else 0
                s = base + row["amount"]
                if s > INT64_MAX or s < INT64_MIN:
                    raise HandlerFailed("overflow for key %r" % k)
                state[k] = s
            out.append({"key": k, "ts": row["ts"], "sum": s, "previous": previous})
        self.state = state
        self.output.extend(out)
        return out, count_calls([self.key_of(r) for r in rows], self.max_batch_rows)

    def expected_state(self, k):
        """(StateKind name, value) as GetKeyState reports it."""
        if k not in self.state:
            return ("STATE_KIND_ABSENT", 0)
        if self.state[k] is None:
            return ("STATE_KIND_NULL", 0)
        return ("STATE_KIND_VALUE", self.state[k])


class SessionCounterModel:
    """session_counter (handlers/README.md): a count per key and one "idle"
    timer; timers fire in (at_us, canonical key, name) order when the
    watermark reaches them."""

    def __init__(self, max_batch_rows=256, max_timer_callbacks=256):
        self.max_batch_rows = max_batch_rows
        self.max_timer_callbacks = max_timer_callbacks
        self.per_timer_call = min(max_timer_callbacks, max_batch_rows)
        self.count = {}       # key -> int (missing: absent)
        self.timers = {}      # key -> at_us of "idle"
        self.watermark = None  # None: no watermark yet (INT64_MIN for the handler)
        self.output = []

    def push(self, rows, watermark=None):
        """Returns a dict like the ack (without sequence/output seqs) and the
        output rows of the batch's own step; due timers past
        max_timer_callbacks fire in the server's follow-on steps (their rows
        are in self.output). Raises HandlerFailed and changes nothing on a
        refusal."""
        rows = rows or []
        count, timers = dict(self.count), dict(self.timers)
        wm = self.watermark
        for row in rows:
            k = row["user"]
            idle = row.get("idle_us")
            if idle is None:
                idle = SC_IDLE_DEFAULT_US
            if idle < 0:
                raise HandlerFailed("idle_us is negative for key %r" % k)
            at = min(row["ts"] + idle, INT64_MAX)
            if wm is not None and at <= wm:
                at = wm + 1
            count[k] = count.get(k, 0) + 1
            timers[k] = at
        calls = count_calls([r["user"] for r in rows], self.max_batch_rows)
        if watermark is not None and (wm is None or watermark > wm):
            wm = watermark
        out = []
        fired = 0
        if wm is not None:
            due = sorted((at, canonical_key([k]), k) for k, at in timers.items() if at <= wm)
            for at, _, k in due:
                out.append({"key": k, "ts": at, "events": count.pop(k, 0)})
                del timers[k]
            fired = len(due)
        in_step = min(fired, self.max_timer_callbacks)
        calls += (in_step + self.per_timer_call - 1) // self.per_timer_call
        self.count, self.timers, self.watermark = count, timers, wm
        self.output.extend(out)
        ack = {"rows_accepted": len(rows), "activations": len(rows) + in_step,
               "timer_callbacks": in_step, "handler_calls": calls,
               "watermark_us": wm if wm is not None else 0, "due_timers": fired - in_step}
        return ack, out[:in_step]


# --- columnar batches ----------------------------------------------------------

_ONEOF = {
    "FIELD_TYPE_BOOL": "bools",
    "FIELD_TYPE_INT64": "int64s",
    "FIELD_TYPE_FLOAT64": "float64s",
    "FIELD_TYPE_UTF8": "strings",
    "FIELD_TYPE_BYTES": "bytes_values",
    "FIELD_TYPE_TIMESTAMP_US": "int64s",
}
_PLACEHOLDER = {"bools": False, "int64s": 0, "float64s": 0.0, "strings": "", "bytes_values": b""}


def schema_fields(descriptor, which):
    """[(name, type name)] of descriptor["inputSchema"|"outputSchema"]."""
    return [(f["name"], f["type"]) for f in descriptor[which]["fields"]]


def to_row_batch(rows, fields, names=True):
    """A columnar RowBatch: one Column per schema field, in schema order."""
    batch = pb.RowBatch(row_count=len(rows))
    for name, ftype in fields:
        kind = _ONEOF[ftype]
        values = [r.get(name) for r in rows]
        col = batch.columns.add()
        if names:
            col.name = name
        if any(v is None for v in values):
            col.nulls.extend(v is None for v in values)
        getattr(col, kind).SetInParent()
        getattr(col, kind).values.extend(_PLACEHOLDER[kind] if v is None else v for v in values)
    return batch


def from_row_batch(batch, fields):
    rows = [dict() for _ in range(batch.row_count)]
    for (name, _), col in zip(fields, batch.columns):
        kind = col.WhichOneof("values")
        values = list(getattr(col, kind).values) if kind else [None] * batch.row_count
        nulls = list(col.nulls) or [False] * batch.row_count
        for i in range(batch.row_count):
            rows[i][name] = None if nulls[i] else values[i]
    return rows


# --- the test base ---------------------------------------------------------------

class FunctionsGrpcBase(unittest.TestCase):
    server = None

    @classmethod
    def setUpClass(cls):
        require_build(cls)
        load_stubs()
        # One partition: these tests model a function's output as one
        # sequence over all keys (harness.ONE_PARTITION says why).
        cls.server = harness.Keyflowd(args=harness.ONE_PARTITION + ["--plugin-dir", HANDLERS]).start()
        cls.connect()

    @classmethod
    def connect(cls):
        cls.channel = grpc.insecure_channel(cls.server.grpc_target)
        cls.stub = pg.FunctionsStub(cls.channel)

    @classmethod
    def tearDownClass(cls):
        if cls.server is not None:
            cls.channel.close()
            cls.server.stop()
            cls.server.cleanup()

    # --- calls ---

    def rpc(self, method, request):
        try:
            return getattr(self.stub, method)(request, timeout=RPC_TIMEOUT_S)
        except grpc.RpcError as e:
            self.fail("%s failed: %s %s\nserver log:\n%s"
                      % (method, e.code(), e.details(), self.server.read_log()[-3000:]))

    def rpc_error(self, method, request, code, *fragments):
        """Asserts the call fails with `code` (or one of a tuple) and a message
        holding every fragment; returns the message."""
        try:
            resp = getattr(self.stub, method)(request, timeout=RPC_TIMEOUT_S)
        except grpc.RpcError as e:
            codes = code if isinstance(code, tuple) else (code,)
            self.assertIn(e.code(), codes, "%s: %s" % (method, e.details()))
            for frag in fragments:
                self.assertIn(frag, e.details())
            return e.details()
        self.fail("%s succeeded, expected %s: %s" % (method, code, resp))

    def register(self, descriptor):
        req = pb.RegisterFunctionRequest(
            descriptor=json_format.ParseDict(descriptor, pb.FunctionDescriptor()))
        return self.rpc("RegisterFunction", req)

    def register_error(self, descriptor, code, *fragments):
        req = pb.RegisterFunctionRequest(
            descriptor=json_format.ParseDict(descriptor, pb.FunctionDescriptor()))
        return self.rpc_error("RegisterFunction", req, code, *fragments)

    def push_request(self, descriptor, producer, sequence, rows, watermark=None):
        req = pb.PushBatchRequest(function_id=descriptor["functionId"], producer_id=producer,
                                  sequence=sequence)
        if rows is not None:
            req.batch.CopyFrom(to_row_batch(rows, schema_fields(descriptor, "inputSchema")))
        if watermark is not None:
            req.watermark_us = watermark
        return req

    def push(self, descriptor, producer, sequence, rows, watermark=None):
        return self.rpc("PushBatch", self.push_request(descriptor, producer, sequence, rows,
                                                       watermark))

    def push_error(self, descriptor, producer, sequence, rows, code, *fragments, watermark=None):
        return self.rpc_error("PushBatch", self.push_request(descriptor, producer, sequence, rows,
                                                             watermark), code, *fragments)

    def read_all(self, descriptor, after=0, page=1000):
        """Every output row after `after` as dicts with "_seq", paging through."""
        fields = schema_fields(descriptor, "outputSchema")
        rows = []
        while True:
            resp = self.rpc("ReadOutput", pb.ReadOutputRequest(
                function_id=descriptor["functionId"], after_seq=after, limit=page))
            got = from_row_batch(resp.batch, fields) if resp.first_seq else []
            for i, r in enumerate(got):
                r["_seq"] = resp.first_seq + i
            rows.extend(got)
            if not got:
                self.assertEqual(resp.next_after_seq, after)
                return rows
            self.assertEqual(resp.last_seq, resp.first_seq + len(got) - 1)
            after = resp.next_after_seq

    def key_state(self, descriptor, key):
        return self.rpc("GetKeyState", pb.GetKeyStateRequest(
            function_id=descriptor["functionId"], key=key))

    def info(self, descriptor):
        return self.rpc("GetFunction", pb.GetFunctionRequest(function_id=descriptor["functionId"]))

    def wait_no_due_timers(self, descriptor, timeout_s=20):
        """Waits until the server's follow-on steps fired every due timer
        (GetFunction's answer is released only after those steps are
        durable)."""
        deadline = time.monotonic() + timeout_s
        info = self.info(descriptor)
        while info.due_timers > 0:
            self.assertEqual(info.due_timers_error, "")
            self.assertLess(time.monotonic(), deadline, "due timers left: %d" % info.due_timers)
            time.sleep(0.01)
            info = self.info(descriptor)
        return info

    # --- assertions ---

    def assert_output(self, descriptor, expected, after=0):
        """The output after `after` is exactly `expected` (rows without _seq),
        numbered after+1, after+2, ..."""
        got = self.read_all(descriptor, after)
        self.assertEqual([r["_seq"] for r in got], list(range(after + 1, after + 1 + len(got))))
        self.assertEqual([{k: v for k, v in r.items() if k != "_seq"} for r in got], expected)

    def assert_rs_state(self, descriptor, model, keys):
        for k in keys:
            st = self.key_state(descriptor, k)
            kind, value = model.expected_state(k)
            self.assertEqual(pb.StateKind.Name(st.state), kind, "key %r" % k)
            self.assertEqual(st.value, value, "key %r" % k)
            self.assertEqual(st.key_text, k)
            self.assertEqual(list(st.timers), [])
            self.assertEqual(st.value_state_name, descriptor["valueStateName"])

    def assert_sc_state(self, descriptor, model, keys):
        for k in keys:
            st = self.key_state(descriptor, k)
            if k in model.count:
                self.assertEqual(pb.StateKind.Name(st.state), "STATE_KIND_VALUE", "key %r" % k)
                self.assertEqual(st.value, model.count[k], "key %r" % k)
            else:
                self.assertEqual(pb.StateKind.Name(st.state), "STATE_KIND_ABSENT", "key %r" % k)
            expected_timers = [("idle", model.timers[k])] if k in model.timers else []
            self.assertEqual([(t.name, t.at_us) for t in st.timers], expected_timers, "key %r" % k)

    def ack_dict(self, ack):
        return {f: getattr(ack, f) for f in ("rows_accepted", "activations", "timer_callbacks",
                                             "handler_calls", "first_output_seq",
                                             "last_output_seq", "watermark_us", "duplicate",
                                             "sequence", "due_timers")}


# =============================================================================

class RegisterTest(FunctionsGrpcBase):

    def test_register_is_idempotent_and_canonical(self):
        d = rs_descriptor()
        first = self.register(d)
        self.assertFalse(first.already_registered)
        fn = first.function
        self.assertTrue(fn.available, fn.unavailable_reason)
        self.assertRegex(fn.descriptor_sha256, r"^[0-9a-f]{64}$")
        self.assertEqual(fn.descriptor.function_id, d["functionId"])
        self.assertEqual(fn.descriptor.pipeline_state_id, d["pipelineStateId"])
        self.assertEqual(fn.descriptor.implementation_digest, d["implementationDigest"])
        self.assertEqual(fn.descriptor.determinism, pb.DETERMINISM_REPLAY_SAFE)
        # The canonical descriptor has every default limit filled in.
        limits = fn.descriptor.limits
        self.assertEqual((limits.max_keys, limits.max_timers, limits.max_state_bytes,
                          limits.max_batch_rows, limits.max_input_rows, limits.max_input_bytes,
                          limits.max_output_rows, limits.max_output_bytes,
                          limits.max_timer_callbacks_per_step),
                         (100000, 100000, 64 << 20, 256, 4096, 16 << 20, 4096, 16 << 20, 256))
        self.assertEqual((fn.output_seq, fn.keys, fn.timers, fn.watermark_us), (0, 0, 0, 0))

        again = self.register(d)
        self.assertTrue(again.already_registered)
        self.assertEqual(again.function.descriptor_sha256, fn.descriptor_sha256)
        self.assertEqual(again.function.created_ms, fn.created_ms)

        # The same descriptor with its defaults spelled out is the same
        # canonical descriptor.
        explicit = copy.deepcopy(d)
        explicit["limits"] = {"maxKeys": 100000, "maxInputRows": "4096", "maxBatchRows": 256}
        same = self.register(explicit)
        self.assertTrue(same.already_registered)
        self.assertEqual(same.function.descriptor_sha256, fn.descriptor_sha256)

        got = self.info(d)
        self.assertEqual(got.descriptor_sha256, fn.descriptor_sha256)
        self.assertEqual(got.descriptor, fn.descriptor)

        listed, token = [], ""
        while True:
            page = self.rpc("ListFunctions", pb.ListFunctionsRequest(page_size=100,
                                                                      page_token=token))
            listed += [f.descriptor.function_id for f in page.functions]
            token = page.next_page_token
            if not token:
                break
        self.assertIn(d["functionId"], listed)

    def test_list_functions_pages(self):
        prefix = unique("list")
        mine = ["%s-%d" % (prefix, i) for i in range(5)]
        for fid in mine:
            self.register(rs_descriptor(function_id=fid))
        seen, token, pages = [], "", 0
        while True:
            page = self.rpc("ListFunctions", pb.ListFunctionsRequest(page_size=2,
                                                                      page_token=token))
            self.assertLessEqual(len(page.functions), 2)
            seen += [f.descriptor.function_id for f in page.functions]
            pages += 1
            self.assertLess(pages, 10000)
            token = page.next_page_token
            if not token:
                break
        self.assertEqual(len(seen), len(set(seen)), "a function listed twice")
        self.assertEqual([f for f in seen if f.startswith(prefix)], mine)
        self.rpc_error("ListFunctions", pb.ListFunctionsRequest(page_size=-1),
                       grpc.StatusCode.INVALID_ARGUMENT, "page_size")

    def test_different_descriptor_under_same_id_is_already_exists(self):
        d = rs_descriptor()
        sha = self.register(d).function.descriptor_sha256
        for name, change in [
            ("limits", lambda x: x.update(limits={"maxInputRows": 10})),
            ("digest", lambda x: x.update(implementationDigest="0" * 64)),
            ("schema", lambda x: x["inputSchema"]["fields"].append(
                {"name": "note", "type": "FIELD_TYPE_UTF8", "nullable": True})),
            ("state name", lambda x: x.update(valueStateName="total")),
        ]:
            with self.subTest(change=name):
                other = copy.deepcopy(d)
                change(other)
                self.register_error(other, grpc.StatusCode.ALREADY_EXISTS, d["functionId"])
        # The registered function is unchanged.
        self.assertEqual(self.info(d).descriptor_sha256, sha)
        self.assertEqual(self.info(d).descriptor.limits.max_input_rows, 4096)

    def test_reused_pipeline_state_id_is_refused(self):
        d = rs_descriptor()
        self.register(d)
        other = rs_descriptor()
        other["pipelineStateId"] = d["pipelineStateId"]
        self.register_error(other, (grpc.StatusCode.ALREADY_EXISTS,
                                    grpc.StatusCode.FAILED_PRECONDITION,
                                    grpc.StatusCode.INVALID_ARGUMENT), "pipeline_state_id")
        self.rpc_error("GetFunction", pb.GetFunctionRequest(function_id=other["functionId"]),
                       grpc.StatusCode.NOT_FOUND)

    def test_bad_descriptors_are_refused_naming_the_field(self):
        def fields(d, which):
            return d[which]["fields"]

        def field(d, which, name):
            return next(f for f in fields(d, which) if f["name"] == name)

        cases = [
            ("version 2", lambda d: d.update(version=2), "version"),
            ("unknown input type", lambda d: field(d, "inputSchema", "amount").update(type=99),
             "input_schema"),
            ("unspecified output type",
             lambda d: field(d, "outputSchema", "sum").update(type="FIELD_TYPE_UNSPECIFIED"),
             "output_schema"),
            ("no key columns", lambda d: d.update(keyColumns=[]), "key_columns"),
            ("key column missing", lambda d: d.update(keyColumns=["nobody"]), "key_columns"),
            ("key column nullable", lambda d: field(d, "inputSchema", "user").update(
                nullable=True), "key_columns"),
            ("key column not UTF8", lambda d: d.update(keyColumns=["amount"]), "key_columns"),
            ("key column TIMESTAMP_US", lambda d: d.update(keyColumns=["ts"]), "key_columns"),
            ("event time nullable", lambda d: field(d, "inputSchema", "ts").update(nullable=True),
             "event_time_column"),
            ("event time not TIMESTAMP_US", lambda d: field(d, "inputSchema", "ts").update(
                type="FIELD_TYPE_INT64"), "event_time_column"),
            ("event time missing", lambda d: d.update(eventTimeColumn="when"),
             "event_time_column"),
            ("event time empty", lambda d: d.update(eventTimeColumn=""), "event_time_column"),
            ("output event time not TIMESTAMP_US", lambda d: d.update(
                outputEventTimeColumn="sum"), "output_event_time_column"),
            ("duplicate input names", lambda d: fields(d, "inputSchema").append(
                {"name": "amount", "type": "FIELD_TYPE_INT64", "nullable": True}), "input_schema"),
            ("duplicate output names", lambda d: fields(d, "outputSchema").append(
                {"name": "key", "type": "FIELD_TYPE_UTF8"}), "output_schema"),
            ("duplicate timer names", lambda d: d.update(timerNames=["idle", "idle"]),
             "timer_names"),
            ("empty input schema", lambda d: d["inputSchema"].update(fields=[]), "input_schema"),
            ("bad field name", lambda d: field(d, "inputSchema", "amount").update(
                name="not a name"), "input_schema"),
            ("no value state name", lambda d: d.update(valueStateName=""), "value_state_name"),
            ("digest not hex", lambda d: d.update(implementationDigest="XYZ"),
             "implementation_digest"),
            ("digest upper case", lambda d: d.update(
                implementationDigest=d["implementationDigest"].upper()), "implementation_digest"),
            ("no runtime", lambda d: d.update(runtime="RUNTIME_UNSPECIFIED"), "runtime"),
            ("empty function id", lambda d: d.update(functionId=""), "function_id"),
            ("bad function id", lambda d: d.update(functionId="a/b"), "function_id"),
            ("empty pipeline state id", lambda d: d.update(pipelineStateId=""),
             "pipeline_state_id"),
        ]
        limit_names = ["max_keys", "max_timers", "max_state_bytes", "max_batch_rows",
                       "max_input_rows", "max_input_bytes", "max_output_rows",
                       "max_output_bytes", "max_timer_callbacks_per_step"]
        for name in limit_names:
            camel = name.split("_")[0] + "".join(w.title() for w in name.split("_")[1:])
            for value in (0, -1, 2 ** 62):
                cases.append(("%s=%d" % (name, value),
                              (lambda c, v: lambda d: d.update(limits={c: v}))(camel, value),
                              name))
        for name, mutate, fragment in cases:
            with self.subTest(case=name):
                d = rs_descriptor()
                mutate(d)
                self.register_error(d, grpc.StatusCode.INVALID_ARGUMENT, fragment)
                if d["functionId"] and "/" not in d["functionId"]:
                    self.rpc_error("GetFunction", pb.GetFunctionRequest(
                        function_id=d["functionId"]), grpc.StatusCode.NOT_FOUND)

    def test_native_digest_without_plugin_is_refused(self):
        d = rs_descriptor()
        d["implementationDigest"] = "ab" * 32
        self.register_error(d, (grpc.StatusCode.FAILED_PRECONDITION,
                                grpc.StatusCode.INVALID_ARGUMENT, grpc.StatusCode.NOT_FOUND),
                            "implementation_digest", "ab" * 32)
        self.rpc_error("GetFunction", pb.GetFunctionRequest(function_id=d["functionId"]),
                       grpc.StatusCode.NOT_FOUND)

    def test_unknown_function(self):
        missing = {"functionId": unique("missing")}
        self.rpc_error("GetFunction", pb.GetFunctionRequest(function_id=missing["functionId"]),
                       grpc.StatusCode.NOT_FOUND)
        self.rpc_error("PushBatch", pb.PushBatchRequest(function_id=missing["functionId"],
                                                        producer_id="p", sequence=1),
                       grpc.StatusCode.NOT_FOUND)
        self.rpc_error("ReadOutput", pb.ReadOutputRequest(function_id=missing["functionId"]),
                       grpc.StatusCode.NOT_FOUND)
        self.rpc_error("GetKeyState", pb.GetKeyStateRequest(function_id=missing["functionId"],
                                                            key="k"),
                       grpc.StatusCode.NOT_FOUND)


class RunningSumTest(FunctionsGrpcBase):

    def test_state_across_batches_absent_null_value(self):
        d = rs_descriptor(reset=True)
        self.register(d)
        model = RunningSumModel()
        batches = [
            [{"user": "alice", "ts": 10, "amount": 5}, {"user": "bob", "ts": 11, "amount": None}],
            [{"user": "alice", "ts": 12, "amount": None}, {"user": "bob", "ts": 13, "amount": 7}],
            [{"user": "alice", "ts": 14, "amount": 3}, {"user": "carol", "ts": 15,
                                                        "amount": -4}],
            [{"user": "alice", "ts": 16, "amount": 1, "reset": True},
             {"user": "bob", "ts": 17, "amount": 2, "reset": False},
             {"user": "carol", "ts": 18, "amount": None, "reset": None}],
            [{"user": "alice", "ts": 19, "amount": 100}, {"user": "carol", "ts": 20,
                                                          "amount": 1}],
        ]
        seq_out = 0
        for i, rows in enumerate(batches, 1):
            ack = self.push(d, "p", i, rows)
            out, calls = model.push(rows)
            self.assertEqual(ack.rows_accepted, len(rows))
            self.assertEqual(ack.activations, len(rows))
            self.assertEqual(ack.handler_calls, calls)
            self.assertEqual(ack.timer_callbacks, 0)
            self.assertEqual((ack.first_output_seq, ack.last_output_seq),
                             (seq_out + 1, seq_out + len(out)))
            self.assertFalse(ack.duplicate)
            self.assertEqual(ack.sequence, i)
            seq_out += len(out)
            if i == 3:
                # alice: 5 -> null -> 3; bob: null -> 7; carol new -> -4.
                self.assert_rs_state(d, model, ["alice", "bob", "carol", "dave"])
                self.assertEqual(model.expected_state("alice"), ("STATE_KIND_VALUE", 3))
        self.assert_output(d, model.output)
        # The hand-checked essentials of the model's output.
        self.assertEqual([(r["key"], r["sum"], r["previous"]) for r in model.output], [
            ("alice", 5, "absent"), ("bob", None, "absent"),
            ("alice", None, "value"), ("bob", 7, "null"),
            ("alice", 3, "null"), ("carol", -4, "absent"),
            ("alice", None, "value"), ("bob", 9, "value"), ("carol", None, "value"),
            ("alice", 100, "absent"), ("carol", 1, "null"),
        ])
        self.assert_rs_state(d, model, ["alice", "bob", "carol", "dave"])
        info = self.info(d)
        self.assertEqual(info.output_seq, len(model.output))
        self.assertEqual(info.keys, 3)

    def test_null_state_and_cleared_state_are_distinct(self):
        d = rs_descriptor(reset=True)
        self.register(d)
        self.push(d, "p", 1, [{"user": "n", "ts": 1, "amount": None},
                              {"user": "c", "ts": 1, "amount": 4}])
        self.push(d, "p", 2, [{"user": "c", "ts": 2, "amount": None, "reset": True}])
        n, c = self.key_state(d, "n"), self.key_state(d, "c")
        self.assertEqual(n.state, pb.STATE_KIND_NULL)
        self.assertEqual(c.state, pb.STATE_KIND_ABSENT)
        # A cleared key is not a key with state: only "n" counts.
        self.assertEqual(self.info(d).keys, 1)
        self.push(d, "p", 3, [{"user": "n", "ts": 3, "amount": 1},
                              {"user": "c", "ts": 3, "amount": 1}])
        out = self.read_all(d, after=3)
        self.assertEqual([(r["key"], r["sum"], r["previous"]) for r in out],
                         [("n", 1, "null"), ("c", 1, "absent")])

    def test_one_activation_per_key_per_call(self):
        d = rs_descriptor()
        self.register(d)
        model = RunningSumModel()
        rows = [{"user": u, "ts": 1000 - i, "amount": a} for i, (u, a) in enumerate(
            [("a", 1), ("a", 2), ("b", 10), ("a", 3), ("b", 20), ("c", 5), ("c", 6), ("c", 7),
             ("a", 4)])]
        ack = self.push(d, "p", 1, rows)
        out, calls = model.push(rows)
        # calls: [a] [a b] [a b c] [c] [c a]
        self.assertEqual(calls, 5)
        self.assertEqual(ack.handler_calls, 5)
        self.assertEqual(ack.activations, 9)
        # Output order is arrival order (timestamps go backwards on purpose)
        # and each key's sums accumulate in that order.
        self.assert_output(d, model.output)
        self.assertEqual([(r["key"], r["sum"]) for r in model.output],
                         [("a", 1), ("a", 3), ("b", 10), ("a", 6), ("b", 30), ("c", 5),
                          ("c", 11), ("c", 18), ("a", 10)])
        self.assert_rs_state(d, model, ["a", "b", "c"])

    def test_max_batch_rows_splits_calls(self):
        d = rs_descriptor(limits={"maxBatchRows": 2})
        self.register(d)
        model = RunningSumModel(max_batch_rows=2)
        rows = [{"user": "k%d" % i, "ts": i, "amount": i} for i in range(5)]
        rows += [{"user": "k0", "ts": 9, "amount": 1}]
        ack = self.push(d, "p", 1, rows)
        _, calls = model.push(rows)
        self.assertEqual(calls, 3)  # [k0 k1] [k2 k3] [k4 k0]
        self.assertEqual(ack.handler_calls, 3)
        self.assert_output(d, model.output)

    def test_several_key_columns(self):
        d = rs_descriptor(extra_inputs=("region",), key_columns=["region", "user"])
        self.register(d)
        model = RunningSumModel(key_columns=("region", "user"))
        rows = [{"region": "eu", "user": "a", "ts": 1, "amount": 1},
                {"region": "us", "user": "a", "ts": 2, "amount": 2},
                {"region": "eu", "user": "a", "ts": 3, "amount": 3},
                {"region": "e", "user": "ua", "ts": 4, "amount": 4}]
        self.push(d, "p", 1, rows)
        model.push(rows)
        self.assert_output(d, model.output)
        self.assertEqual([r["key"] for r in model.output],
                         ['["eu","a"]', '["us","a"]', '["eu","a"]', '["e","ua"]'])
        self.assert_rs_state(d, model, ['["eu","a"]', '["us","a"]', '["e","ua"]'])

    def test_key_text_is_the_canonical_readable_key(self):
        """GetKeyState accepts any spelling of the JSON array; the key_text it
        answers with is the key's readable form, as handlers and the output
        see it."""
        d = rs_descriptor(extra_inputs=("region",), key_columns=["region", "user"])
        self.register(d)
        self.push(d, "p", 1, [{"region": "eu", "user": "caf\u00e9", "ts": 1, "amount": 3}])
        canonical = '["eu","caf\u00e9"]'
        self.assertEqual(self.read_all(d)[0]["key"], canonical)
        for spelling in (canonical, '[ "eu", "caf\u00e9" ]', '["eu","caf\\u00e9"]'):
            with self.subTest(spelling=spelling):
                st = self.key_state(d, spelling)
                self.assertEqual((st.state, st.value), (pb.STATE_KIND_VALUE, 3))
                self.assertEqual(st.key_text, canonical)
        for bad in ("eu", '["eu"]', '["eu","a","b"]', '["eu",1]', "[\"eu\""):
            with self.subTest(bad=bad):
                self.rpc_error("GetKeyState", pb.GetKeyStateRequest(
                    function_id=d["functionId"], key=bad), grpc.StatusCode.INVALID_ARGUMENT,
                    "key")

    def test_a_key_whose_text_is_longer_than_the_key_is_found(self):
        """The key text of several key columns is JSON: escapes make it longer
        than the canonical key (at most 4096 bytes). GetKeyState once refused
        any text over 4096 bytes, so keys it had accepted could not be read."""
        d = rs_descriptor(extra_inputs=("region",), key_columns=["region", "user"])
        self.register(d)
        region, user = '"' * 2000, "\u0001" * 40  # canonical: 4 + 2000 + 4 + 40 bytes
        self.push(d, "p", 1, [{"region": region, "user": user, "ts": 1, "amount": 3}])
        text = self.read_all(d)[0]["key"]
        self.assertGreater(len(text.encode()), 4096)
        st = self.key_state(d, text)
        self.assertEqual((st.state, st.value, st.key_text), (pb.STATE_KIND_VALUE, 3, text))
        self.rpc_error("GetKeyState", pb.GetKeyStateRequest(
            function_id=d["functionId"], key=json.dumps(['"' * 2000, "u" * 2089])),
            grpc.StatusCode.RESOURCE_EXHAUSTED, "the key is 4097 bytes (at most 4096)")

    def test_unicode_and_slash_keys(self):
        d = rs_descriptor()
        self.register(d)
        model = RunningSumModel()
        rows = [{"user": k, "ts": i, "amount": i + 1}
                for i, k in enumerate(["z\u00fcrich", "a/b", "\u65e5\u672c", "a/b", " "])]
        self.push(d, "p", 1, rows)
        model.push(rows)
        self.assert_output(d, model.output)
        self.assert_rs_state(d, model, ["z\u00fcrich", "a/b", "\u65e5\u672c", " "])

    def test_utf8_with_nul_is_kept_or_refused(self):
        """U+0000 is valid UTF-8: two keys that differ after a NUL must stay
        two keys (or the batch must be refused), never be merged silently."""
        d = rs_descriptor()
        self.register(d)
        rows = [{"user": "n\x00a", "ts": 1, "amount": 5}, {"user": "n\x00b", "ts": 2,
                                                            "amount": 6}]
        try:
            self.stub.PushBatch(self.push_request(d, "p", 1, rows), timeout=RPC_TIMEOUT_S)
        except grpc.RpcError as e:
            self.assertEqual(e.code(), grpc.StatusCode.INVALID_ARGUMENT, e.details())
            self.assertEqual(self.read_all(d), [])
            return
        model = RunningSumModel()
        model.push(rows)
        self.assert_output(d, model.output)

    def test_producer_ids_differing_after_nul_are_not_merged(self):
        """Two producers whose ids differ only after a NUL byte must not share
        a sequence space: the second one's batch must be refused (an invalid
        producer_id) or applied, never dropped as a duplicate of the first."""
        d = rs_descriptor()
        self.register(d)
        rows = [{"user": "u", "ts": 1, "amount": 3}]
        outcomes = []
        for producer in ("p\x00a", "p\x00b"):
            try:
                ack = self.stub.PushBatch(self.push_request(d, producer, 1, rows),
                                          timeout=RPC_TIMEOUT_S)
                outcomes.append(("ok", ack.duplicate, ack.first_output_seq))
            except grpc.RpcError as e:
                outcomes.append((e.code(), e.details()))
        self.assertNotEqual(outcomes[1][:2], ("ok", True),
                            "the second producer's batch was dropped as a duplicate: %r"
                            % outcomes)
        applied = sum(1 for o in outcomes if o[0] == "ok")
        self.assertEqual(self.info(d).output_seq, applied)

    def test_input_that_does_not_match_the_schema_is_refused(self):
        d = rs_descriptor()
        self.register(d)
        fields = schema_fields(d, "inputSchema")
        good = [{"user": "a", "ts": 1, "amount": 1}, {"user": "b", "ts": 2, "amount": 2}]

        def batch_req(batch):
            return pb.PushBatchRequest(function_id=d["functionId"], producer_id="p", sequence=1,
                                       batch=batch)

        too_few = to_row_batch(good, fields[:2])
        wrong_type = to_row_batch(good, fields)
        wrong_type.columns[2].ClearField("int64s")
        wrong_type.columns[2].strings.values.extend(["1", "2"])
        wrong_count = to_row_batch(good, fields)
        wrong_count.columns[1].int64s.values.append(3)
        null_key = to_row_batch([{"user": None, "ts": 1, "amount": 1}], fields)
        null_ts = to_row_batch([{"user": "a", "ts": None, "amount": 1}], fields)
        wrong_name = to_row_batch(good, fields)
        wrong_name.columns[2].name = "amt"
        bad_nulls = to_row_batch(good, fields)
        bad_nulls.columns[2].nulls.extend([False])
        negative = to_row_batch(good, fields)
        negative.row_count = -1
        for name, batch, fragment in [("two columns", too_few, "columns"),
                                      ("strings for INT64", wrong_type, "amount"),
                                      ("3 values for 2 rows", wrong_count, "ts"),
                                      ("null key", null_key, "user"),
                                      ("null event time", null_ts, "ts"),
                                      ("wrong column name", wrong_name, "amount"),
                                      ("one null flag for 2 rows", bad_nulls, "nulls"),
                                      ("negative row count", negative, "row_count")]:
            with self.subTest(case=name):
                self.rpc_error("PushBatch", batch_req(batch), grpc.StatusCode.INVALID_ARGUMENT,
                               fragment)
        for name, req, fragment in [
                ("no producer", pb.PushBatchRequest(function_id=d["functionId"], sequence=1,
                                                    batch=to_row_batch(good, fields)),
                 "producer_id"),
                ("sequence 0", pb.PushBatchRequest(function_id=d["functionId"], producer_id="p",
                                                   sequence=0, batch=to_row_batch(good, fields)),
                 "sequence"),
                ("rows as JSON that is not an array", pb.PushBatchRequest(
                    function_id=d["functionId"], producer_id="p", sequence=1,
                    rows_json='{"user": "a"}'), "rows")]:
            with self.subTest(case=name):
                self.rpc_error("PushBatch", req, grpc.StatusCode.INVALID_ARGUMENT, fragment)
        # Nothing of any of it was applied, and sequence 1 is still free.
        self.assertEqual(self.read_all(d), [])
        self.assertEqual(self.info(d).keys, 0)
        ack = self.push(d, "p", 1, good)
        self.assertFalse(ack.duplicate)
        self.assertEqual(ack.first_output_seq, 1)

    def test_rows_json_over_grpc(self):
        d = rs_descriptor()
        self.register(d)
        ack = self.rpc("PushBatch", pb.PushBatchRequest(
            function_id=d["functionId"], producer_id="p", sequence=1,
            rows_json=json.dumps([{"user": "a", "ts": "5", "amount": 2},
                                  {"user": "a", "ts": 6, "amount": "3"},
                                  {"user": "a", "ts": 7, "amount": None}])))
        self.assertEqual((ack.rows_accepted, ack.handler_calls), (3, 3))
        resp = self.rpc("ReadOutput", pb.ReadOutputRequest(function_id=d["functionId"],
                                                            format=pb.ROW_FORMAT_JSON))
        self.assertEqual(json.loads(resp.rows_json), [
            {"_seq": "1", "key": "a", "ts": "5", "sum": "2", "previous": "absent"},
            {"_seq": "2", "key": "a", "ts": "6", "sum": "5", "previous": "value"},
            {"_seq": "3", "key": "a", "ts": "7", "sum": None, "previous": "value"}])

    def test_rejected_handler_response_changes_nothing(self):
        d = rs_descriptor()
        self.register(d)
        model = RunningSumModel()
        first = [{"user": "k", "ts": 1, "amount": 5}, {"user": "y", "ts": 1, "amount": 1}]
        self.push(d, "p", 1, first, watermark=10)
        model.push(first)
        info_before = self.info(d)
        output_before = self.read_all(d)
        states_before = [self.key_state(d, k) for k in ("k", "x", "y")]

        # Call 1 sets x = INT64_MAX (and touches k and y); call 2 overflows
        # x: the handler fails the call and nothing of the batch may stay.
        bad = [{"user": "x", "ts": 20, "amount": INT64_MAX}, {"user": "k", "ts": 20, "amount": 1},
               {"user": "y", "ts": 20, "amount": None},
               {"user": "x", "ts": 21, "amount": INT64_MAX}]
        with self.assertRaises(HandlerFailed):
            RunningSumModel().push(bad)
        message = self.push_error(d, "p", 2, bad, grpc.StatusCode.FAILED_PRECONDITION,
                                  "overflow", "x", watermark=50)
        self.assertIn("'x'", message)

        info_after = self.info(d)
        self.assertEqual((info_after.output_seq, info_after.keys, info_after.watermark_us,
                          info_after.state_bytes),
                         (info_before.output_seq, info_before.keys, info_before.watermark_us,
                          info_before.state_bytes))
        self.assertEqual(info_after.watermark_us, 10)
        self.assertEqual(self.read_all(d), output_before)
        self.assertEqual([self.key_state(d, k) for k in ("k", "x", "y")], states_before)
        self.assertEqual(self.key_state(d, "x").state, pb.STATE_KIND_ABSENT)

        # The refused sequence was not taken: it goes through with good data.
        good = [{"user": "x", "ts": 30, "amount": 7}, {"user": "k", "ts": 30, "amount": 1}]
        ack = self.push(d, "p", 2, good, watermark=50)
        out, _ = model.push(good)
        self.assertFalse(ack.duplicate)
        self.assertEqual((ack.first_output_seq, ack.last_output_seq), (3, 4))
        self.assertEqual(ack.watermark_us, 50)
        self.assert_output(d, model.output)
        self.assert_rs_state(d, model, ["k", "x", "y"])
        self.assertEqual(model.expected_state("k"), ("STATE_KIND_VALUE", 6))

    def test_overflow_of_a_single_row_is_refused(self):
        d = rs_descriptor()
        self.register(d)
        self.push(d, "p", 1, [{"user": "m", "ts": 1, "amount": INT64_MIN}])
        self.push_error(d, "p", 2, [{"user": "m", "ts": 2, "amount": -1}],
                        grpc.StatusCode.FAILED_PRECONDITION, "overflow")
        st = self.key_state(d, "m")
        self.assertEqual((st.state, st.value), (pb.STATE_KIND_VALUE, INT64_MIN))
        ack = self.push(d, "p", 2, [{"user": "m", "ts": 2, "amount": INT64_MAX}])
        self.assertEqual(ack.first_output_seq, 2)
        self.assertEqual(self.key_state(d, "m").value, -1)

    def test_idempotent_retry_and_old_sequences(self):
        d = rs_descriptor()
        self.register(d)
        model = RunningSumModel()
        acks = {}
        for seq in (1, 2, 3):
            rows = [{"user": "u", "ts": seq, "amount": seq}, {"user": "v", "ts": seq,
                                                              "amount": 10 * seq}]
            acks[seq] = self.ack_dict(self.push(d, "p", seq, rows, watermark=seq * 100))
            model.push(rows)
        output = self.read_all(d)
        info = self.info(d)
        # Retries of kept sequences: the original ack, flagged duplicate.
        for seq in (3, 1, 2):
            with self.subTest(retry=seq):
                again = self.ack_dict(self.push(
                    d, "p", seq, [{"user": "u", "ts": seq, "amount": seq},
                                  {"user": "v", "ts": seq, "amount": 10 * seq}],
                    watermark=seq * 100))
                self.assertTrue(again["duplicate"])
                self.assertEqual(dict(again, duplicate=False), acks[seq])
        # A retry with different rows, or another watermark, is a conflict:
        # ALREADY_EXISTS naming the sequence, nothing changed.
        self.push_error(d, "p", 2, [{"user": "w", "ts": 9, "amount": 999}],
                        grpc.StatusCode.ALREADY_EXISTS, "sequence: 2", watermark=10 ** 9)
        self.push_error(d, "p", 2, [{"user": "u", "ts": 2, "amount": 2},
                                    {"user": "v", "ts": 2, "amount": 20}],
                        grpc.StatusCode.ALREADY_EXISTS, "sequence: 2", watermark=201)
        self.assertEqual(self.read_all(d), output)
        after = self.info(d)
        self.assertEqual((after.output_seq, after.keys, after.watermark_us),
                         (info.output_seq, info.keys, info.watermark_us))
        self.assert_rs_state(d, model, ["u", "v", "w"])

        # Another producer has its own sequence.
        ack = self.push(d, "q", 1, [{"user": "u", "ts": 4, "amount": 1}])
        self.assertFalse(ack.duplicate)
        model.push([{"user": "u", "ts": 4, "amount": 1}])

        # Gaps are fine; a lower sequence never accepted is refused.
        ack = self.push(d, "p", 10, [{"user": "u", "ts": 10, "amount": 1}])
        model.push([{"user": "u", "ts": 10, "amount": 1}])
        self.assertEqual(ack.sequence, 10)
        self.push_error(d, "p", 5, [{"user": "u", "ts": 5, "amount": 1}],
                        grpc.StatusCode.FAILED_PRECONDITION, "sequence")

        # Push enough later batches that the ack of sequence 1 is no longer
        # kept (the server keeps a bounded number): its retry is refused.
        for seq in range(11, 61):
            rows = [{"user": "z", "ts": seq, "amount": 1}]
            self.push(d, "p", seq, rows)
            model.push(rows)
        self.push_error(d, "p", 1, [{"user": "u", "ts": 1, "amount": 1}],
                        grpc.StatusCode.FAILED_PRECONDITION, "sequence")
        # The most recent one is still answered from its kept ack.
        self.assertTrue(self.push(d, "p", 60, [{"user": "z", "ts": 60, "amount": 1}]).duplicate)
        self.assert_output(d, model.output)
        self.assert_rs_state(d, model, ["u", "v", "z"])

    def test_batch_over_max_input_rows_is_refused(self):
        d = rs_descriptor(limits={"maxInputRows": 5})
        self.register(d)
        rows = [{"user": "k%d" % (i % 2), "ts": i, "amount": 1} for i in range(6)]
        self.push_error(d, "p", 1, rows, grpc.StatusCode.RESOURCE_EXHAUSTED, "max_input_rows")
        self.assertEqual(self.read_all(d), [])
        self.assertEqual(self.info(d).keys, 0)
        ack = self.push(d, "p", 1, rows[:5])
        self.assertEqual((ack.rows_accepted, ack.first_output_seq, ack.last_output_seq), (5, 1, 5))
        # JSON rows over gRPC are bounded the same way.
        self.rpc_error("PushBatch", pb.PushBatchRequest(
            function_id=d["functionId"], producer_id="p", sequence=2,
            rows_json=json.dumps(rows)), grpc.StatusCode.RESOURCE_EXHAUSTED, "max_input_rows")
        self.assertEqual(self.info(d).output_seq, 5)


class LimitsTest(FunctionsGrpcBase):
    """Every limit refused as RESOURCE_EXHAUSTED naming it; nothing applied."""

    def test_max_keys(self):
        d = rs_descriptor(reset=True, limits={"maxKeys": 2})
        self.register(d)
        model = RunningSumModel()
        rows = [{"user": "a", "ts": 1, "amount": 1}, {"user": "b", "ts": 1, "amount": 1}]
        self.push(d, "p", 1, rows)
        model.push(rows)
        self.push_error(d, "p", 2, [{"user": "b", "ts": 2, "amount": 1},
                                    {"user": "c", "ts": 2, "amount": 1}],
                        grpc.StatusCode.RESOURCE_EXHAUSTED, "max_keys")
        self.assert_output(d, model.output)
        self.assert_rs_state(d, model, ["a", "b", "c"])
        # Clearing a key makes room for another one.
        rows = [{"user": "a", "ts": 3, "amount": None, "reset": True},
                {"user": "c", "ts": 3, "amount": 1}]
        self.push(d, "p", 2, rows)
        model.push(rows)
        self.assert_output(d, model.output)
        self.assertEqual(self.info(d).keys, 2)

    def test_max_output_rows(self):
        d = rs_descriptor(limits={"maxOutputRows": 2, "maxBatchRows": 4})
        self.register(d)
        rows = [{"user": k, "ts": 1, "amount": 1} for k in "abc"]
        self.push_error(d, "p", 1, rows, grpc.StatusCode.RESOURCE_EXHAUSTED, "max_output_rows")
        self.assertEqual(self.read_all(d), [])
        self.assertEqual(self.info(d).keys, 0)
        # The limit is per step, however the rows split into calls: three
        # rows of one key (three calls) are refused like three keys.
        self.push_error(d, "p", 1, [{"user": "a", "ts": t, "amount": 1} for t in (1, 2, 3)],
                        grpc.StatusCode.RESOURCE_EXHAUSTED, "max_output_rows")
        ack = self.push(d, "p", 1, rows[:1] + [{"user": "a", "ts": 2, "amount": 1}])
        self.assertEqual((ack.handler_calls, ack.last_output_seq), (2, 2))

    def test_max_output_bytes(self):
        d = rs_descriptor(limits={"maxOutputBytes": 64})
        self.register(d)
        self.push_error(d, "p", 1, [{"user": "k" * 100, "ts": 1, "amount": 1}],
                        grpc.StatusCode.RESOURCE_EXHAUSTED, "max_output_bytes")
        self.assertEqual(self.read_all(d), [])
        self.assertEqual(self.info(d).keys, 0)
        ack = self.push(d, "p", 1, [{"user": "k", "ts": 1, "amount": 1}])
        self.assertEqual(ack.last_output_seq, 1)

    def test_max_output_bytes_counts_8_per_cell_and_the_text(self):
        """docs/semantics.md: a running_sum row weighs 4 cells x 8 bytes plus
        its key and its `previous` text ("absent", 6 bytes). Both refusals
        (a value that passes the limit as it is set, a row that passes it
        as it ends) say "nothing applied" once."""
        d = rs_descriptor(limits={"maxOutputBytes": 64})
        self.register(d)
        for user in ("k" * 27, "k" * 100):
            message = self.push_error(d, "p", 1, [{"user": user, "ts": 1, "amount": 1}],
                                      grpc.StatusCode.RESOURCE_EXHAUSTED, "max_output_bytes")
            self.assertTrue(message.startswith("handler response rejected, nothing applied: "
                                               "max_output_bytes: "), message)
            self.assertEqual(message.count("nothing applied"), 1, message)
        ack = self.push(d, "p", 1, [{"user": "k" * 26, "ts": 1, "amount": 1}])  # 64 bytes
        self.assertEqual(ack.last_output_seq, 1)

    def test_max_timers(self):
        d = sc_descriptor(limits={"maxTimers": 2})
        self.register(d)
        model = SessionCounterModel()
        rows = [{"user": "a", "ts": 1, "idle_us": 5}, {"user": "b", "ts": 1, "idle_us": 5}]
        self.push(d, "p", 1, rows)
        model.push(rows)
        self.push_error(d, "p", 2, [{"user": "c", "ts": 2, "idle_us": 5}],
                        grpc.StatusCode.RESOURCE_EXHAUSTED, "max_timers", watermark=1)
        self.assert_sc_state(d, model, ["a", "b", "c"])
        self.assertEqual(self.info(d).watermark_us, 0)

    def test_max_state_bytes(self):
        d = rs_descriptor(limits={"maxStateBytes": 1})
        self.register(d)
        self.push_error(d, "p", 1, [{"user": "a", "ts": 1, "amount": 1}],
                        grpc.StatusCode.RESOURCE_EXHAUSTED, "max_state_bytes")
        self.assertEqual(self.key_state(d, "a").state, pb.STATE_KIND_ABSENT)
        self.assertEqual((self.info(d).keys, self.info(d).state_bytes), (0, 0))

    def test_max_input_bytes(self):
        d = rs_descriptor(limits={"maxInputBytes": 200})
        self.register(d)
        rows = [{"user": "x" * 300, "ts": 1, "amount": 1}]
        self.push_error(d, "p", 1, rows, grpc.StatusCode.RESOURCE_EXHAUSTED, "max_input_bytes")
        self.assertEqual(self.read_all(d), [])
        ack = self.push(d, "p", 1, [{"user": "x" * 10, "ts": 1, "amount": 1}])
        self.assertEqual(ack.rows_accepted, 1)


class SessionCounterTest(FunctionsGrpcBase):

    def push_and_check(self, d, model, seq, rows, watermark=None, producer="p"):
        expected_ack, out = model.push(rows, watermark)
        before = self.info(d).output_seq
        ack = self.push(d, producer, seq, rows, watermark)
        got = {k: getattr(ack, k) for k in expected_ack}
        self.assertEqual(got, expected_ack, "batch %d" % seq)
        self.wait_no_due_timers(d)
        if out:
            self.assertEqual((ack.first_output_seq, ack.last_output_seq),
                             (before + 1, before + len(out)))
        else:
            self.assertEqual((ack.first_output_seq, ack.last_output_seq), (0, 0))
        return ack, out

    def test_timers_fire_in_order_and_clear_state(self):
        d = sc_descriptor()
        self.register(d)
        model = SessionCounterModel()
        # No watermark yet: rows arm "idle" at ts + idle_us.
        rows = [{"user": "u1", "ts": 100, "idle_us": 50}, {"user": "u3", "ts": 90, "idle_us": 20},
                {"user": "u2", "ts": 100, "idle_us": 10}, {"user": "u1", "ts": 120, "idle_us": 50},
                {"user": "u4", "ts": 1000, "idle_us": None}]
        self.push_and_check(d, model, 1, rows)
        self.assertEqual(model.timers, {"u1": 170, "u2": 110, "u3": 110, "u4": 60001000})
        self.assert_sc_state(d, model, ["u1", "u2", "u3", "u4"])
        info = self.info(d)
        self.assertEqual((info.keys, info.timers, info.output_seq), (4, 4, 0))

        # The watermark reaches 110: u2 and u3 fire, in key order although
        # u3 arrived first; each emits its count and is cleared.
        ack, out = self.push_and_check(d, model, 2, None, watermark=110)
        self.assertEqual(out, [{"key": "u2", "ts": 110, "events": 1},
                               {"key": "u3", "ts": 110, "events": 1}])
        self.assert_output(d, model.output)
        self.assert_sc_state(d, model, ["u1", "u2", "u3", "u4"])
        self.assertEqual(self.key_state(d, "u2").state, pb.STATE_KIND_ABSENT)

        # A lower watermark is ignored (watermarks never go back); nothing fires.
        ack, out = self.push_and_check(d, model, 3, None, watermark=50)
        self.assertEqual(ack.watermark_us, 110)
        self.assertEqual(out, [])

        # A late row (its idle time is behind the watermark) is clamped to
        # watermark + 1; a new session of u2 starts at 1.
        rows = [{"user": "u5", "ts": 50, "idle_us": 10}, {"user": "u2", "ts": 115, "idle_us": 5}]
        self.push_and_check(d, model, 4, rows)
        self.assertEqual(model.timers["u5"], 111)
        self.assert_sc_state(d, model, ["u2", "u5"])

        # Rows and a watermark in one batch: the rows first, then timers up to
        # the new watermark in (at_us, key) order.
        rows = [{"user": "u1", "ts": 130, "idle_us": 50}]  # u1 -> 3 events, idle at 180
        ack, out = self.push_and_check(d, model, 5, rows, watermark=200)
        self.assertEqual(out, [{"key": "u5", "ts": 111, "events": 1},
                               {"key": "u2", "ts": 120, "events": 1},
                               {"key": "u1", "ts": 180, "events": 3}])
        self.assert_output(d, model.output)
        self.assert_sc_state(d, model, ["u1", "u2", "u3", "u4", "u5"])
        info = self.info(d)
        self.assertEqual((info.keys, info.timers, info.watermark_us, info.output_seq),
                         (1, 1, 200, 5))

    def test_equal_times_fire_in_canonical_key_order(self):
        """(at_us, key, name) with key the canonical (length-prefixed) key."""
        d = sc_descriptor()
        self.register(d)
        model = SessionCounterModel()
        keys = ["b", "aa", "a", "ab", "c", "ba", "\u00e9", "z"]
        rows = [{"user": k, "ts": 1000, "idle_us": 0} for k in keys]
        rows += [{"user": "a", "ts": 1000, "idle_us": 0}]
        self.push_and_check(d, model, 1, rows, watermark=999)
        self.assertEqual(self.read_all(d), [])
        ack, out = self.push_and_check(d, model, 2, None, watermark=1000)
        self.assertEqual(len(out), len(keys))
        self.assert_output(d, model.output)
        self.assertEqual(out[0], {"key": "a", "ts": 1000, "events": 2})

    def test_due_timers_past_the_step_bound_fire_in_follow_on_steps(self):
        """A batch's step fires at most max_timer_callbacks_per_step due
        timers; the server fires the rest in steps of its own, in order, and
        the function's next batch waits until they are done."""
        d = sc_descriptor(limits={"maxTimerCallbacksPerStep": 3})
        self.register(d)
        model = SessionCounterModel(max_timer_callbacks=3)
        rows = [{"user": "k%02d" % i, "ts": 10 * i, "idle_us": 1} for i in range(10)]
        self.push_and_check(d, model, 1, rows)
        ack, out = self.push_and_check(d, model, 2, None, watermark=10 ** 6)
        self.assertEqual((ack.timer_callbacks, ack.handler_calls, ack.due_timers), (3, 1, 7))
        self.assertEqual([r["key"] for r in out], ["k00", "k01", "k02"])
        self.assert_output(d, model.output)
        self.assertEqual([r["key"] for r in model.output], ["k%02d" % i for i in range(10)])
        info = self.info(d)
        self.assertEqual((info.timers, info.due_timers, info.keys), (0, 0, 0))
        # A batch right behind a watermark sees every timer it made due
        # fired, however many steps that took.
        self.push_and_check(d, model, 3, [{"user": "k%02d" % i, "ts": 2 * 10 ** 6, "idle_us": 1}
                                          for i in range(10)])
        self.push(d, "p", 4, None, watermark=3 * 10 ** 6)
        ack = self.push(d, "p", 5, [{"user": "k00", "ts": 3 * 10 ** 6 + 5, "idle_us": 1}])
        self.assertEqual(ack.activations, 1)
        self.assertEqual(self.info(d).output_seq, 20, "all ten fired before batch 5's step")
        state = self.rpc("GetKeyState", pb.GetKeyStateRequest(function_id=d["functionId"],
                                                               key="k00"))
        self.assertEqual(state.value, 1, "k00's session was closed, then batch 5 opened one")

    def test_refused_row_changes_nothing(self):
        d = sc_descriptor()
        self.register(d)
        model = SessionCounterModel()
        self.push_and_check(d, model, 1, [{"user": "a", "ts": 10, "idle_us": 5}])
        self.push_error(d, "p", 2, [{"user": "b", "ts": 10, "idle_us": 5},
                                    {"user": "c", "ts": 10, "idle_us": -1}],
                        grpc.StatusCode.FAILED_PRECONDITION, "idle_us", watermark=100)
        self.assert_sc_state(d, model, ["a", "b", "c"])
        info = self.info(d)
        self.assertEqual((info.keys, info.timers, info.watermark_us, info.output_seq),
                         (1, 1, 0, 0))
        self.push_and_check(d, model, 2, [{"user": "b", "ts": 10, "idle_us": 5}],
                            watermark=100)
        self.assert_output(d, model.output)

    def test_watermark_only_batches_and_retries(self):
        d = sc_descriptor()
        self.register(d)
        model = SessionCounterModel()
        self.push_and_check(d, model, 1, [{"user": "a", "ts": 10, "idle_us": 5}])
        first, _ = self.push_and_check(d, model, 2, None, watermark=15)
        # The retry returns the original ack and fires nothing again.
        again = self.push(d, "p", 2, None, watermark=15)
        self.assertTrue(again.duplicate)
        self.assertEqual(dict(self.ack_dict(again), duplicate=False), self.ack_dict(first))
        self.assertEqual(self.info(d).output_seq, 1)
        self.assert_output(d, model.output)

    def test_replay_reproduces_a_kept_batch_and_applies_nothing(self):
        """ReplayBatch re-runs a kept batch against the state before it (the
        keys have moved on since) and applies nothing."""
        d = sc_descriptor()
        self.register(d)
        model = SessionCounterModel()
        self.push_and_check(d, model, 1, [{"user": "a", "ts": 10, "idle_us": 5},
                                          {"user": "b", "ts": 10, "idle_us": 50}])
        # Batch 2 counts b, opens c and fires a's timer by its watermark.
        self.push_and_check(d, model, 2, [{"user": "b", "ts": 20, "idle_us": 50},
                                          {"user": "c", "ts": 20, "idle_us": 5}], watermark=16)
        self.push_and_check(d, model, 3, [{"user": "b", "ts": 30, "idle_us": 50}],
                            watermark=100)
        before = self.info(d)
        req = pb.ReplayBatchRequest(function_id=d["functionId"], producer_id="p", sequence=2)
        r = self.rpc("ReplayBatch", req)
        self.assertTrue(r.reproduced, r.first_difference)
        self.assertEqual(r.first_difference, "")
        self.assertEqual((r.recorded_output_rows, r.replayed_output_rows, r.keys_compared),
                         (1, 1, 3))
        after = self.info(d)
        self.assertEqual((after.output_seq, after.keys, after.timers, after.state_bytes,
                          after.watermark_us),
                         (before.output_seq, before.keys, before.timers, before.state_bytes,
                          before.watermark_us))
        self.assert_output(d, model.output)
        self.assert_sc_state(d, model, ["a", "b", "c"])
        # Not kept (another producer's, or never pushed): NOT_FOUND by name.
        self.rpc_error("ReplayBatch", pb.ReplayBatchRequest(
            function_id=d["functionId"], producer_id="p", sequence=9),
            grpc.StatusCode.NOT_FOUND, "sequence 9", "--replay-batches")
        # Only a function declared REPLAY_SAFE.
        plain = sc_descriptor()
        plain["determinism"] = "DETERMINISM_UNDECLARED"
        self.register(plain)
        self.push(plain, "p", 1, [{"user": "a", "ts": 10, "idle_us": 5}])
        self.rpc_error("ReplayBatch", pb.ReplayBatchRequest(
            function_id=plain["functionId"], producer_id="p", sequence=1),
            grpc.StatusCode.FAILED_PRECONDITION, "REPLAY_SAFE")


class LongestKeyTest(FunctionsGrpcBase):
    """Keys up to KF_FUNCTION_KEY_BYTES_MAX (4096 bytes, the canonical
    form) are stored, timers included, and recovered. Stored keys were once
    capped at 1024 bytes: a row whose key was longer than 1016 bytes made
    keyflowd abort on an assertion while writing its step, and the
    producer's retry aborted it again. This class restarts its server."""

    def test_the_longest_key_keeps_its_state_and_timer_across_a_restart(self):
        d = sc_descriptor()
        self.register(d)
        longest = "k" * (4096 - 4)  # one key column: a 4-byte length, then the bytes
        self.push(d, "p", 1, [{"user": longest, "ts": 10, "idle_us": 5},
                              {"user": "short", "ts": 10, "idle_us": 5}])
        self.push_error(d, "p", 2, [{"user": longest + "k", "ts": 10, "idle_us": 5}],
                        grpc.StatusCode.RESOURCE_EXHAUSTED, "rows[0]: the key is 4097 bytes")
        self.server.kill()
        self.server.start()
        self.connect()
        state = self.key_state(d, longest)
        self.assertEqual((state.state, state.value), (pb.STATE_KIND_VALUE, 1))
        self.assertEqual([(t.name, t.at_us) for t in state.timers], [("idle", 15)])
        ack = self.push(d, "p", 2, None, watermark=15)
        self.assertEqual(ack.timer_callbacks, 2)
        self.assertEqual([r["key"] for r in self.read_all(d)], ["short", longest])  # canonical key order
        self.assertEqual(self.info(d).keys, 0)


class OutputTest(FunctionsGrpcBase):

    def fill(self, n, keys=3):
        d = rs_descriptor()
        self.register(d)
        model = RunningSumModel()
        if n:
            rows = [{"user": "k%d" % (i % keys), "ts": i, "amount": i} for i in range(n)]
            self.push(d, "p", 1, rows)
            model.push(rows)
        return d, model

    def test_read_output_paging(self):
        d, model = self.fill(25)
        fields = schema_fields(d, "outputSchema")
        after, pages = 0, []
        while True:
            resp = self.rpc("ReadOutput", pb.ReadOutputRequest(function_id=d["functionId"],
                                                                after_seq=after, limit=10))
            self.assertEqual(resp.high_water_seq, 25)
            if resp.first_seq == 0:
                self.assertEqual((resp.last_seq, resp.next_after_seq, resp.batch.row_count),
                                 (0, after, 0))
                break
            self.assertEqual(resp.first_seq, after + 1)
            pages.append((resp.first_seq, resp.last_seq, resp.next_after_seq))
            rows = from_row_batch(resp.batch, fields)
            self.assertEqual(rows, model.output[resp.first_seq - 1:resp.last_seq])
            after = resp.next_after_seq
        self.assertEqual(pages, [(1, 10, 10), (11, 20, 20), (21, 25, 25)])

        # JSON pages hold the same rows, int64 as strings, "_seq" first.
        resp = self.rpc("ReadOutput", pb.ReadOutputRequest(
            function_id=d["functionId"], after_seq=7, limit=3, format=pb.ROW_FORMAT_JSON))
        self.assertEqual((resp.first_seq, resp.last_seq, resp.next_after_seq), (8, 10, 10))
        self.assertEqual(json.loads(resp.rows_json), [
            {"_seq": str(i + 1), "key": r["key"], "ts": str(r["ts"]), "sum": str(r["sum"]),
             "previous": r["previous"]} for i, r in enumerate(model.output) if 8 <= i + 1 <= 10])

        # Past the end: no rows, the cursor stays.
        resp = self.rpc("ReadOutput", pb.ReadOutputRequest(function_id=d["functionId"],
                                                            after_seq=100))
        self.assertEqual((resp.first_seq, resp.last_seq, resp.next_after_seq,
                          resp.high_water_seq), (0, 0, 100, 25))
        # Default limit covers everything here.
        resp = self.rpc("ReadOutput", pb.ReadOutputRequest(function_id=d["functionId"]))
        self.assertEqual((resp.first_seq, resp.last_seq), (1, 25))

        for name, req, fragment in [
                ("negative after", pb.ReadOutputRequest(function_id=d["functionId"],
                                                        after_seq=-1), "after_seq"),
                ("negative limit", pb.ReadOutputRequest(function_id=d["functionId"], limit=-1),
                 "limit"),
                ("limit too large", pb.ReadOutputRequest(function_id=d["functionId"],
                                                         limit=65537), "limit"),
                ("wait too long", pb.ReadOutputRequest(function_id=d["functionId"],
                                                       wait_ms=10 ** 9), "wait_ms")]:
            with self.subTest(case=name):
                self.rpc_error("ReadOutput", req, grpc.StatusCode.INVALID_ARGUMENT, fragment)

    def test_read_output_pages_across_batches(self):
        d = rs_descriptor()
        self.register(d)
        model = RunningSumModel()
        for seq in range(1, 6):
            rows = [{"user": "k%d" % (i % 2), "ts": seq * 10 + i, "amount": seq} for i in range(3)]
            self.push(d, "p", seq, rows)
            model.push(rows)
        for limit in (1, 2, 4, 7, 15, 16):
            with self.subTest(limit=limit):
                got = self.read_all(d, page=limit)
                self.assertEqual([r.pop("_seq") for r in got], list(range(1, 16)))
                self.assertEqual(got, model.output)
        got = self.read_all(d, after=5, page=4)
        self.assertEqual([r.pop("_seq") for r in got], list(range(6, 16)))
        self.assertEqual(got, model.output[5:])

    def test_read_output_long_poll(self):
        d, model = self.fill(2)
        # Nothing new: the read waits about wait_ms and returns no rows.
        t0 = time.monotonic()
        resp = self.rpc("ReadOutput", pb.ReadOutputRequest(function_id=d["functionId"],
                                                            after_seq=2, wait_ms=300))
        self.assertGreaterEqual(time.monotonic() - t0, 0.25)
        self.assertEqual((resp.first_seq, resp.next_after_seq, resp.high_water_seq), (0, 2, 2))

        # A waiting read is answered by the next push, long before wait_ms.
        fut = self.stub.ReadOutput.future(pb.ReadOutputRequest(
            function_id=d["functionId"], after_seq=2, wait_ms=30000), timeout=RPC_TIMEOUT_S)
        t0 = time.monotonic()
        rows = [{"user": "k0", "ts": 50, "amount": 1}]
        self.push(d, "p", 2, rows)
        model.push(rows)
        resp = fut.result(timeout=RPC_TIMEOUT_S)
        self.assertLess(time.monotonic() - t0, 20)
        self.assertEqual((resp.first_seq, resp.last_seq, resp.high_water_seq), (3, 3, 3))
        self.assertEqual(from_row_batch(resp.batch, schema_fields(d, "outputSchema")),
                         model.output[2:])

    def test_tail_output_follows_pushes(self):
        d, model = self.fill(3)
        fields = schema_fields(d, "outputSchema")
        call = self.stub.TailOutput(pb.TailOutputRequest(function_id=d["functionId"],
                                                         after_seq=1, max_rows_per_message=4),
                                    timeout=120)
        q = queue.Queue()

        def follow():
            try:
                for msg in call:
                    q.put(msg)
            except grpc.RpcError as e:
                q.put(e)
            q.put(None)

        thread = threading.Thread(target=follow, daemon=True)
        thread.start()
        got = []  # (seq, row)

        def wait_rows(n):
            deadline = time.monotonic() + 20
            while len(got) < n:
                left = deadline - time.monotonic()
                self.assertGreater(left, 0, "tail delivered %d of %d rows" % (len(got), n))
                try:
                    msg = q.get(timeout=left)
                except queue.Empty:
                    continue
                self.assertIsNotNone(msg, "the tail ended early")
                self.assertNotIsInstance(msg, grpc.RpcError,
                                         getattr(msg, "details", lambda: "")())
                if msg.first_seq == 0:
                    continue
                rows = from_row_batch(msg.batch, fields)
                self.assertLessEqual(len(rows), 4)
                self.assertEqual(msg.last_seq, msg.first_seq + len(rows) - 1)
                got.extend((msg.first_seq + i, r) for i, r in enumerate(rows))

        try:
            wait_rows(2)  # rows 2 and 3 were there already
            for seq in range(2, 6):
                rows = [{"user": "k%d" % (i % 3), "ts": 100 * seq + i, "amount": seq}
                        for i in range(seq + 3)]
                self.push(d, "p", seq, rows)
                model.push(rows)
                wait_rows(len(model.output) - 1)
            self.assertEqual([s for s, _ in got], list(range(2, len(model.output) + 1)))
            self.assertEqual([r for _, r in got], model.output[1:])
        finally:
            call.cancel()
        thread.join(timeout=20)
        self.assertFalse(thread.is_alive(), "the tail did not end after cancel")
        items = []
        while not q.empty():
            items.append(q.get())
        self.assertEqual(items[-1], None)
        errors = [i for i in items if isinstance(i, grpc.RpcError)]
        self.assertEqual([e.code() for e in errors], [grpc.StatusCode.CANCELLED])
        # The server is fine afterwards.
        self.assertEqual(self.info(d).output_seq, len(model.output))

    def test_tail_output_json(self):
        d, model = self.fill(0)
        call = self.stub.TailOutput(pb.TailOutputRequest(function_id=d["functionId"],
                                                         format=pb.ROW_FORMAT_JSON), timeout=60)
        rows = [{"user": "j", "ts": 1, "amount": 41}, {"user": "j", "ts": 2, "amount": 1}]
        self.push(d, "p", 1, rows)
        got = []
        try:
            for msg in call:
                if msg.first_seq:
                    got += json.loads(msg.rows_json)
                if len(got) >= 2:
                    break
        finally:
            call.cancel()
        self.assertEqual(got, [
            {"_seq": "1", "key": "j", "ts": "1", "sum": "41", "previous": "absent"},
            {"_seq": "2", "key": "j", "ts": "2", "sum": "42", "previous": "value"}])

    def test_a_cancelled_tail_releases_its_parked_read(self):
        """A tail waits for rows with a read parked in the engine; when its
        client cancels, that read is cancelled at once (it used to stay
        parked for its whole wait, holding one of KF_PARKED_READS_MAX)."""
        d, _ = self.fill(1)
        info = self.info(d)
        call = self.stub.TailOutput(pb.TailOutputRequest(function_id=d["functionId"],
                                                         after_seq=info.output_seq), timeout=120)

        def parked():
            status, text = self.server.http("GET", "/metrics")
            for line in text.splitlines():
                if line.startswith("keyflow_parked_reads "):
                    return float(line.split()[1])
            return -1.0

        started = threading.Thread(target=lambda: next(iter(call), None), daemon=True)
        started.start()
        deadline = time.time() + 10
        while time.time() < deadline and parked() < 1:
            time.sleep(0.02)
        self.assertEqual(parked(), 1, "the tail's read should be parked")
        call.cancel()
        deadline = time.time() + 5
        while time.time() < deadline and parked() > 0:
            time.sleep(0.02)
        self.assertEqual(parked(), 0, "the cancelled tail's read is still parked")

    def test_tail_unknown_function(self):
        call = self.stub.TailOutput(pb.TailOutputRequest(function_id=unique("none")), timeout=30)
        with self.assertRaises(grpc.RpcError) as cm:
            next(iter(call))
        self.assertEqual(cm.exception.code(), grpc.StatusCode.NOT_FOUND)


class RestartTest(FunctionsGrpcBase):
    """SIGKILL and restart: everything acknowledged is there, exactly."""

    def snapshot(self, rs, sc, rs_keys, sc_keys):
        return {
            "rs_info": self.strip_info(self.info(rs)),
            "sc_info": self.strip_info(self.info(sc)),
            "rs_out": self.read_all(rs),
            "sc_out": self.read_all(sc),
            "rs_keys": [self.key_state(rs, k) for k in rs_keys],
            "sc_keys": [self.key_state(sc, k) for k in sc_keys],
        }

    @staticmethod
    def strip_info(info):
        return (info.descriptor_sha256, info.created_ms, info.available, info.watermark_us,
                info.output_seq, info.keys, info.timers, info.state_bytes, info.descriptor)

    def test_sigkill_restart_keeps_exactly_the_acknowledged_state(self):
        rs, sc = rs_descriptor(reset=True), sc_descriptor()
        self.register(rs)
        self.register(sc)
        rsm, scm = RunningSumModel(), SessionCounterModel()
        rs_keys = ["a", "b", "c", "d"]
        sc_keys = ["s%d" % i for i in range(6)]
        rs_acks, sc_acks, rs_rows, sc_rows = {}, {}, {}, {}
        for seq in range(1, 9):
            rows = [{"user": rs_keys[(seq + i) % 4], "ts": seq * 10 + i,
                     "amount": None if (seq + i) % 7 == 0 else seq * i - 5,
                     "reset": (seq + i) % 11 == 0} for i in range(6)]
            rs_rows[seq] = rows
            rs_acks[seq] = self.ack_dict(self.push(rs, "rp", seq, rows, watermark=seq * 10))
            rsm.push(rows)
            rows = [{"user": sc_keys[(seq * 3 + i) % 6], "ts": seq * 100 + i,
                     "idle_us": 150 + 10 * i} for i in range(3)]
            sc_rows[seq] = rows
            scm_ack, _ = scm.push(rows, watermark=seq * 100)
            sc_acks[seq] = self.ack_dict(self.push(sc, "sp", seq, rows, watermark=seq * 100))
            self.assertEqual({k: sc_acks[seq][k] for k in scm_ack}, scm_ack)
        # A refused batch just before the crash leaves no trace.
        self.push_error(rs, "rp", 9, [{"user": "a", "ts": 1, "amount": INT64_MAX},
                                      {"user": "a", "ts": 2, "amount": INT64_MAX}],
                        grpc.StatusCode.FAILED_PRECONDITION, "overflow", watermark=10 ** 6)
        self.assertTrue(scm.timers, "some timers must be pending at the crash")
        before = self.snapshot(rs, sc, rs_keys, sc_keys)
        self.assertEqual([{k: v for k, v in r.items() if k != "_seq"} for r in before["rs_out"]],
                         rsm.output)
        self.assertEqual([{k: v for k, v in r.items() if k != "_seq"} for r in before["sc_out"]],
                         scm.output)

        self.channel.close()
        self.server.kill()
        self.server.start()
        self.connect()

        after = self.snapshot(rs, sc, rs_keys, sc_keys)
        self.assertEqual(after, before)
        self.assert_rs_state(rs, rsm, rs_keys)
        self.assert_sc_state(sc, scm, sc_keys)
        self.assertTrue(self.info(rs).available)
        # Registration is still idempotent with the same identity.
        self.assertTrue(self.register(rs).already_registered)

        # Producer sequences survived: kept acks are replayed, a lower one is
        # refused, and the next sequence continues the computation.
        again = self.ack_dict(self.push(rs, "rp", 8, rs_rows[8], watermark=80))
        self.assertEqual(dict(again, duplicate=False), rs_acks[8])
        self.assertTrue(again["duplicate"])
        again = self.ack_dict(self.push(sc, "sp", 7, sc_rows[7], watermark=700))
        self.assertEqual(dict(again, duplicate=False), sc_acks[7])
        # Their digests survived too: other content under a kept sequence
        # is a conflict.
        self.push_error(rs, "rp", 8, [{"user": "a", "ts": 0, "amount": 1}],
                        grpc.StatusCode.ALREADY_EXISTS, "sequence: 8")
        self.push_error(rs, "rp", 0, [], grpc.StatusCode.INVALID_ARGUMENT, "sequence")

        rows = [{"user": k, "ts": 1000, "amount": 1} for k in rs_keys]
        ack = self.push(rs, "rp", 9, rows)
        rsm.push(rows)
        self.assertEqual(ack.first_output_seq, len(before["rs_out"]) + 1)
        self.assert_output(rs, rsm.output)
        self.assert_rs_state(rs, rsm, rs_keys)

        # Pending timers survived: the watermark fires them now.
        expected_ack, out = scm.push([], watermark=10 ** 7)
        ack = self.push(sc, "sp", 9, None, watermark=10 ** 7)
        self.assertEqual({k: getattr(ack, k) for k in expected_ack}, expected_ack)
        self.assertTrue(out)
        self.assert_output(sc, scm.output)
        self.assert_sc_state(sc, scm, sc_keys)

    def test_sigkill_restart_keeps_each_values_expiry(self):
        """state_ttl_us: the expiry is stored with the value, so after a
        SIGKILL a value still expires when the watermark reaches its last
        write + TTL, and one that expired before the crash stays absent."""
        d = rs_descriptor()
        d["stateTtlUs"] = "100"
        self.register(d)
        self.push(d, "p", 1, [{"user": "a", "ts": 10, "amount": 1},
                              {"user": "b", "ts": 50, "amount": 2},
                              {"user": "c", "ts": 20, "amount": 3}])
        self.push(d, "p", 2, [{"user": "a", "ts": 90, "amount": 1}], watermark=125)
        # c (written at 20) expired at 120; a moved to 190; b expires at 150.
        self.assertEqual(self.key_state(d, "c").state, pb.STATE_KIND_ABSENT)
        expiries = {k: self.key_state(d, k).state_expires_us for k in "ab"}
        self.assertEqual(expiries, {"a": 190, "b": 150})

        self.channel.close()
        self.server.kill()
        self.server.start()
        self.connect()

        self.assertEqual({k: self.key_state(d, k).state_expires_us for k in "ab"}, expiries)
        self.assertEqual((self.key_state(d, "a").value, self.key_state(d, "b").value), (2, 2))
        self.assertEqual(self.key_state(d, "c").state, pb.STATE_KIND_ABSENT)
        self.assertEqual(self.info(d).keys, 2)
        self.push(d, "p", 3, None, watermark=160)
        self.assertEqual(self.key_state(d, "b").state, pb.STATE_KIND_ABSENT)
        self.assertEqual(self.key_state(d, "a").value, 2)
        self.push(d, "p", 4, None, watermark=190)
        self.assertEqual(self.key_state(d, "a").state, pb.STATE_KIND_ABSENT)
        info = self.info(d)
        self.assertEqual((info.keys, info.state_bytes), (0, 0))


if __name__ == "__main__":
    unittest.main()
