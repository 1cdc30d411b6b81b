"""API keys, scopes and ownership on the real keyflowd (docs/security.md).

The negative suite: every RPC the .proto files under api/ declare, over
gRPC, over its REST routes and over the generic HTTP route, is called with
no key, an unknown key, a revoked key, a key holding every scope but the
one the RPC needs, and a key whose grants are limited to another name
prefix. Each must get UNAUTHENTICATED (401) or PERMISSION_DENIED (403) --
or, for a list, only what the key may see -- and an admin read afterwards
shows nothing changed. The RPC list comes from protoc and the routes from
the server's own table (rpc_table_dump): an RPC or a route without a rule
here fails the suite.

Also: producers and leases belong to the key that took them; keys survive
SIGKILL and a restart, and a revoked key stays revoked; /metrics needs
metrics:read while health probes need nothing; a bootstrap key file is
written once, 0600.
"""

import json
import os
import pathlib
import re
import secrets
import socket
import subprocess
import sys
import tempfile
import time
import unittest

import grpc  # noqa: E402  (before harness.stubs(): see test_functions_grpc.py)

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import harness  # noqa: E402

harness.stubs()
from google.protobuf import descriptor_pb2, json_format, symbol_database  # noqa: E402
from grpc.health.v1 import health_pb2  # noqa: E402,F401  (registers the messages)
from grpc.reflection.v1 import reflection_pb2  # noqa: E402,F401  (the same)
from grpc.reflection.v1alpha import reflection_pb2 as reflection_v1alpha_pb2  # noqa: E402,F401
from keyflow.v1 import coordinators_pb2 as C  # noqa: E402
from keyflow.v1 import functions_pb2 as F  # noqa: E402
from keyflow.v1 import keys_pb2 as K  # noqa: E402
from keyflow.v1 import partitions_pb2  # noqa: E402,F401  (registers the messages)
from keyflow.v1 import runs_pb2 as R  # noqa: E402
from keyflow.v1 import workers_pb2 as W  # noqa: E402

HANDLERS = os.path.join(harness.BUILD, "handlers")
DUMP = os.path.join(harness.BUILD, "tests", "unit", "proto", "rpc_table_dump")
TIMEOUT_S = 10
WF = "neg-wf"          # the workflow every rule aims at
FN = "neg-fn"          # the function every rule aims at
OTHER_PREFIX = "zz-"   # the prefix of the "other tenant" key
DENIED = "denied"      # expected outcome of a call
FILTERED = "filtered"
HIDDEN = "hidden"      # NOT_FOUND, as for an id that does not exist


def proto_rpcs():
    """Every rpc declared under api/, by gRPC path, as protoc reads them."""
    api = os.path.join(harness.ROOT, "api")
    files = sorted(str(p.relative_to(api)) for p in pathlib.Path(api).rglob("*.proto"))
    with tempfile.TemporaryDirectory() as tmp:
        out = os.path.join(tmp, "api.desc")
        subprocess.run(["protoc", "-I" + api, "--include_imports",
                        "--descriptor_set_out=" + out] + files, check=True)
        fds = descriptor_pb2.FileDescriptorSet.FromString(pathlib.Path(out).read_bytes())
    rpcs = {}
    for f in fds.file:
        for svc in f.service:
            for m in svc.method:
                rpcs["/%s.%s/%s" % (f.package, svc.name, m.name)] = m
    return rpcs


def table():
    return json.loads(subprocess.run([DUMP], check=True, capture_output=True, text=True).stdout)


def message_class(full_name):
    return symbol_database.Default().GetSymbol(full_name)


def bearer(key):
    return "Bearer " + key


class Ctx:
    """What the rules aim at, made by the admin before the suite runs."""


# --- rules: one per RPC --------------------------------------------------------
# request(ctx) -> the request message; snapshot(ctx, admin) -> what an admin
# reads before and after a refused call (None: a read, nothing to compare);
# http: [(METHOD, path, body dict or None)] for each REST route of the RPC;
# prefix: what a key limited to OTHER_PREFIX gets (DENIED, FILTERED, HIDDEN
# for a run id of another workflow, or None when the scope takes no prefix).

def snap_coord(kind, key):
    def snap(ctx, admin):
        return admin.call("/keyflow.v1.Coordinators/DescribeCoordinator",
                          C.DescribeCoordinatorRequest(coordinator=C.CoordinatorRef(
                              kind=kind, workflow=WF, key=key))).SerializeToString()
    return snap


def snap_run(attr):
    def snap(ctx, admin):
        run = admin.call("/keyflow.v1.Runs/GetRun", R.GetRunRequest(run_id=getattr(ctx, attr)))
        return (run.status, run.attempts, run.lease_expires_ms, run.result_json)
    return snap


def snap_keys(ctx, admin):
    return sorted(k.key_id for k in admin.call("/keyflow.v1.Keys/ListKeys",
                                               K.ListKeysRequest()).keys)


def snap_functions(ctx, admin):
    listed = admin.call("/keyflow.v1.Functions/ListFunctions", F.ListFunctionsRequest())
    out = admin.call("/keyflow.v1.Functions/ReadOutput",
                     F.ReadOutputRequest(function_id=FN, after_seq=0, limit=1000))
    return ([f.descriptor.function_id for f in listed.functions], out.high_water_seq)


def snap_retained(ctx, admin):
    info = admin.call("/keyflow.v1.Functions/GetFunction", F.GetFunctionRequest(function_id=FN))
    return (info.first_retained_seq, info.retained_rows)


def snap_producers(ctx, admin):
    return admin.call("/keyflow.v1.Functions/GetFunction",
                      F.GetFunctionRequest(function_id=FN)).producers


def push_request(ctx):
    return F.PushBatchRequest(function_id=FN, producer_id="p-neg", sequence=1,
                              rows_json=json.dumps([{"user": "mallory", "ts": 1, "amount": 1}]))


RULES = {
    "/keyflow.v1.Coordinators/SendEvent": dict(
        request=lambda c: C.SendEventRequest(workflow=WF, key="k-neg", event=C.Event(
            input_json="1", rule=C.Rule(kind=C.RULE_KIND_BATCH))),
        snapshot=snap_coord(C.RULE_KIND_BATCH, "k-neg"), prefix=DENIED,
        http=lambda c: [("POST", "/v1/workflows/%s/keys/k-neg/events" % WF,
                         {"rule": {"kind": "batch"}, "input": 1})]),
    "/keyflow.v1.Coordinators/SendEvents": dict(
        request=lambda c: C.SendEventsRequest(events=[
            C.SendEventRequest(workflow=WF, key="k-neg", event=C.Event(
                input_json="1", rule=C.Rule(kind=C.RULE_KIND_BATCH))),
            C.SendEventRequest(workflow=WF, key="k-neg", event=C.Event(
                input_json="2", rule=C.Rule(kind=C.RULE_KIND_BATCH)))]),
        snapshot=snap_coord(C.RULE_KIND_BATCH, "k-neg"), prefix=DENIED,
        http=lambda c: [("POST", "/v1/events:batch",
                         [{"workflow": WF, "key": "k-neg",
                           "event": {"rule": {"kind": "batch"}, "input": 1}}])]),
    "/keyflow.v1.Coordinators/DescribeCoordinator": dict(
        request=lambda c: C.DescribeCoordinatorRequest(coordinator=C.CoordinatorRef(
            kind=C.RULE_KIND_DEBOUNCE, workflow=WF, key="k-open")),
        snapshot=None, prefix=DENIED,
        http=lambda c: [("GET", "/v1/coordinators/debounce/%s/k-open" % WF, None)]),
    "/keyflow.v1.Coordinators/FlushWindow": dict(
        request=lambda c: C.FlushWindowRequest(coordinator=C.CoordinatorRef(
            kind=C.RULE_KIND_DEBOUNCE, workflow=WF, key="k-open")),
        snapshot=snap_coord(C.RULE_KIND_DEBOUNCE, "k-open"), prefix=DENIED,
        http=lambda c: [("POST", "/v1/coordinators/debounce/%s/k-open:flush" % WF, {})]),
    "/keyflow.v1.Coordinators/CancelWindow": dict(
        request=lambda c: C.CancelWindowRequest(coordinator=C.CoordinatorRef(
            kind=C.RULE_KIND_DEBOUNCE, workflow=WF, key="k-open")),
        snapshot=snap_coord(C.RULE_KIND_DEBOUNCE, "k-open"), prefix=DENIED,
        http=lambda c: [("POST", "/v1/coordinators/debounce/%s/k-open:cancel" % WF, {})]),
    "/keyflow.v1.Runs/PollRuns": dict(
        request=lambda c: R.PollRunsRequest(workflows=[WF], worker_id="mallory", wait_ms=0),
        snapshot=snap_run("pending_run"), prefix=DENIED,
        http=lambda c: [("POST", "/v1/runs:poll", {"workflows": [WF], "workerId": "mallory"})]),
    "/keyflow.v1.Runs/HeartbeatRun": dict(
        request=lambda c: R.HeartbeatRunRequest(run_id=c.leased_run, lease=c.lease),
        snapshot=snap_run("leased_run"), prefix=HIDDEN,
        http=lambda c: [("POST", "/v1/runs/%s:heartbeat" % c.leased_run, {"lease": c.lease})]),
    "/keyflow.v1.Runs/CompleteRun": dict(
        request=lambda c: R.CompleteRunRequest(run_id=c.leased_run, lease=c.lease,
                                               result_json='"forged"'),
        snapshot=snap_run("leased_run"), prefix=HIDDEN,
        http=lambda c: [("POST", "/v1/runs/%s:complete" % c.leased_run,
                         {"lease": c.lease, "result": "forged"})]),
    "/keyflow.v1.Runs/ReleaseRun": dict(
        request=lambda c: R.ReleaseRunRequest(run_id=c.leased_run, lease=c.lease),
        snapshot=snap_run("leased_run"), prefix=HIDDEN,
        http=lambda c: [("POST", "/v1/runs/%s:release" % c.leased_run, {"lease": c.lease})]),
    "/keyflow.v1.Runs/CancelRun": dict(
        request=lambda c: R.CancelRunRequest(run_id=c.pending_run),
        snapshot=snap_run("pending_run"), prefix=HIDDEN,
        http=lambda c: [("POST", "/v1/runs/%s:cancel" % c.pending_run, {})]),
    "/keyflow.v1.Runs/GetRun": dict(
        request=lambda c: R.GetRunRequest(run_id=c.leased_run), snapshot=None, prefix=HIDDEN,
        http=lambda c: [("GET", "/v1/runs/%s" % c.leased_run, None)]),
    "/keyflow.v1.Runs/ListRuns": dict(
        request=lambda c: R.ListRunsRequest(workflow=WF), snapshot=None, prefix=DENIED,
        http=lambda c: [("GET", "/v1/runs?workflow=%s" % WF, None)]),
    "/keyflow.v1.Functions/RegisterFunction": dict(
        request=lambda c: F.RegisterFunctionRequest(descriptor=c.new_descriptor),
        snapshot=snap_functions, prefix=DENIED,
        http=lambda c: [("POST", "/v1/functions",
                         json_format.MessageToDict(c.new_descriptor))]),
    "/keyflow.v1.Functions/GetFunction": dict(
        request=lambda c: F.GetFunctionRequest(function_id=FN), snapshot=None, prefix=DENIED,
        http=lambda c: [("GET", "/v1/functions/%s" % FN, None)]),
    "/keyflow.v1.Functions/ListFunctions": dict(
        request=lambda c: F.ListFunctionsRequest(), snapshot=None, prefix=FILTERED,
        http=lambda c: [("GET", "/v1/functions", None)]),
    "/keyflow.v1.Functions/PushBatch": dict(
        request=push_request, snapshot=snap_functions, prefix=DENIED,
        http=lambda c: [("POST", "/v1/functions/%s/batches" % FN, {
            "producerId": "p-neg", "sequence": 1,
            "rows": [{"user": "mallory", "ts": 1, "amount": 1}]})]),
    "/keyflow.v1.Functions/DryRunBatch": dict(
        request=lambda c: F.DryRunBatchRequest(
            function_id=FN, rows_json=json.dumps([{"user": "mallory", "ts": 1, "amount": 1}])),
        snapshot=None, prefix=DENIED,
        http=lambda c: [("POST", "/v1/functions/%s/dry-run" % FN, {
            "rows": [{"user": "mallory", "ts": 1, "amount": 1}]})]),
    "/keyflow.v1.Functions/ReplayBatch": dict(
        request=lambda c: F.ReplayBatchRequest(function_id=FN, producer_id="p-admin",
                                               sequence=1),
        snapshot=None, prefix=DENIED,
        http=lambda c: [("POST", "/v1/functions/%s/producers/p-admin/batches/1:replay" % FN,
                         {})]),
    "/keyflow.v1.Functions/ReadOutput": dict(
        request=lambda c: F.ReadOutputRequest(function_id=FN), snapshot=None, prefix=DENIED,
        http=lambda c: [("GET", "/v1/functions/%s/output?after=0" % FN, None)]),
    "/keyflow.v1.Functions/GetKeyState": dict(
        request=lambda c: F.GetKeyStateRequest(function_id=FN, key="ann"), snapshot=None,
        prefix=DENIED, http=lambda c: [("GET", "/v1/functions/%s/keys/ann" % FN, None)]),
    "/keyflow.v1.Functions/TrimOutput": dict(
        request=lambda c: F.TrimOutputRequest(function_id=FN, before_seq=2),
        snapshot=snap_retained, prefix=DENIED,
        http=lambda c: [("POST", "/v1/functions/%s/output:trim" % FN, {"beforeSeq": "2"})]),
    "/keyflow.v1.Functions/DeleteFunction": dict(
        request=lambda c: F.DeleteFunctionRequest(function_id=FN), snapshot=snap_functions,
        prefix=DENIED, http=lambda c: [("DELETE", "/v1/functions/%s" % FN, None)]),
    "/keyflow.v1.Functions/DeleteProducer": dict(
        request=lambda c: F.DeleteProducerRequest(function_id=FN, producer_id="p-admin"),
        snapshot=snap_producers, prefix=DENIED,
        http=lambda c: [("DELETE", "/v1/functions/%s/producers/p-admin" % FN, None)]),
    "/keyflow.v1.Functions/TailOutput": dict(
        request=lambda c: F.TailOutputRequest(function_id=FN), snapshot=None, prefix=DENIED,
        http=lambda c: []),
    # A worker's hello for FN (NATIVE: the right key would be refused
    # FAILED_PRECONDITION, after the key checks this suite is about).
    "/keyflow.v1.Workers/Serve": dict(
        request=lambda c: W.WorkerMessage(hello=W.WorkerHello(
            function_id=FN, implementation_digest="ab" * 32)),
        snapshot=snap_functions, prefix=DENIED, http=lambda c: []),
    "/keyflow.v1.Keys/CreateKey": dict(
        request=lambda c: K.CreateKeyRequest(name="mallory", grants=[
            K.Grant(scope="keys:admin")]),
        snapshot=snap_keys, prefix=None,
        http=lambda c: [("POST", "/v1/keys",
                         {"name": "mallory", "grants": [{"scope": "keys:admin"}]})]),
    "/keyflow.v1.Keys/ListKeys": dict(
        request=lambda c: K.ListKeysRequest(), snapshot=None, prefix=None,
        http=lambda c: [("GET", "/v1/keys", None)]),
    "/keyflow.v1.Keys/RevokeKey": dict(
        request=lambda c: K.RevokeKeyRequest(key_id=c.victim), snapshot=snap_keys, prefix=None,
        http=lambda c: [("POST", "/v1/keys/%s:revoke" % c.victim, {})]),
    # No key needed: health is for probes, reflection tells only what the
    # repository's protos say, the placement is what a client needs before
    # its first call (docs/scaling.md).
    "/keyflow.v1.Partitions/GetPlacement": dict(request=None, open=True),
    "/grpc.health.v1.Health/Check": dict(request=None, open=True),
    "/grpc.health.v1.Health/Watch": dict(request=None, open=True),
    "/grpc.reflection.v1.ServerReflection/ServerReflectionInfo": dict(request=None, open=True),
    "/grpc.reflection.v1alpha.ServerReflection/ServerReflectionInfo": dict(request=None,
                                                                          open=True),
}


def route_regex(route):
    """The concrete paths a route of the table matches."""
    parts = []
    for seg in route["pattern"].strip("/").split("/"):
        parts.append("[^/]+" if seg.startswith("{") else re.escape(seg))
    verb = ":" + re.escape(route["verb"]) if route["verb"] else ""
    return re.compile("^/" + "/".join(parts) + verb + r"(\?.*)?$")


class Client:
    """gRPC calls by path with one key (or none)."""

    def __init__(self, target, rows, key=None):
        self.channel = grpc.insecure_channel(target)
        self.rows = rows
        self.metadata = [("authorization", bearer(key))] if key else []

    def close(self):
        self.channel.close()

    def _types(self, path):
        row = self.rows[path]
        return message_class(row["response"])

    def call(self, path, request):
        resp = self._types(path)
        if self.rows[path]["shape"] == "bidi_stream":
            stream = self.channel.stream_stream(path, request_serializer=lambda m: m.SerializeToString(),
                                                response_deserializer=resp.FromString)(
                iter([request]), metadata=self.metadata, timeout=TIMEOUT_S)
            try:
                return next(stream)
            finally:
                stream.cancel()
        if self.rows[path]["shape"] == "server_stream":
            stream = self.channel.unary_stream(path, request_serializer=lambda m: m.SerializeToString(),
                                               response_deserializer=resp.FromString)(
                request, metadata=self.metadata, timeout=TIMEOUT_S)
            try:
                return next(stream)
            finally:
                stream.cancel()
        if self.rows[path]["shape"] == "bidi_stream":
            stream = self.channel.stream_stream(path, request_serializer=lambda m: m.SerializeToString(),
                                                response_deserializer=resp.FromString)(
                iter([request]), metadata=self.metadata, timeout=TIMEOUT_S)
            try:
                return next(stream)
            finally:
                stream.cancel()
        return self.channel.unary_unary(path, request_serializer=lambda m: m.SerializeToString(),
                                        response_deserializer=resp.FromString)(
            request, metadata=self.metadata, timeout=TIMEOUT_S)

    def code(self, path, request):
        try:
            self.call(path, request)
            return grpc.StatusCode.OK
        except grpc.RpcError as e:
            return e.code()


class Auth(unittest.TestCase):
    """The helpers. A server with --auth, stopped with SIGTERM at the end
    (exit 0: no sanitizer report): one per class, or one per test where
    the class sets fresh_server."""

    ARGS = ["--auth", "--plugin-dir", HANDLERS, "--probe-address", "127.0.0.1:0"]
    fresh_server = False

    @classmethod
    def setUpClass(cls):
        for path in (DUMP, os.path.join(HANDLERS, "running_sum.so")):
            if not os.path.exists(path):
                raise unittest.SkipTest("not built: %s" % path)
        cls.rows = {r["path"]: r for r in table()["methods"]}
        cls.routes = table()["routes"]
        if not cls.fresh_server:
            cls.shared_server = harness.class_server(cls, args=cls.ARGS)
            cls.addClassCleanup(harness.stopped, cls.shared_server)

    def setUp(self):
        if self.fresh_server:
            self.server = harness.Keyflowd(args=self.ARGS).start()
            self.addCleanup(self.server.cleanup)
            self.addCleanup(lambda: self.assertEqual(self.server.stop(), 0, self.server.read_log()))
        else:
            self.server = self.shared_server
        self.admin_key = self.bootstrap_key()
        self.admin = Client(self.server.grpc_target, self.rows, self.admin_key)
        self.addCleanup(self.admin.close)

    def tearDown(self):
        harness.log_on_failure(self, self.server)

    def bootstrap_key(self):
        path = os.path.join(self.server.data_dir, "db", "bootstrap-admin.key")
        self.assertEqual(os.stat(path).st_mode & 0o777, 0o600)
        with open(path) as f:
            return f.read().strip()

    def create_key(self, name, grants):
        resp = self.admin.call("/keyflow.v1.Keys/CreateKey", K.CreateKeyRequest(
            name=name, grants=[K.Grant(scope=s, prefix=p) for s, p in grants]))
        return resp.key.key_id, resp.api_key

    def http(self, method, path, body, key):
        headers = {"Authorization": bearer(key)} if key else {}
        return self.server.http(method, path, body, headers=headers)[0]


class AuthTest(Auth):
    """One server for the class: each test makes keys, workflows and
    functions of its own."""

    # --- the negative suite ----------------------------------------------------
    def make_ctx(self):
        ctx = Ctx()
        a = self.admin
        send = "/keyflow.v1.Coordinators/SendEvent"
        a.call(send, C.SendEventRequest(workflow=WF, key="k-open", event=C.Event(
            input_json="1", rule=C.Rule(kind=C.RULE_KIND_DEBOUNCE, window_ms=600000))))
        for key in ("k-run1", "k-run2"):
            a.call(send, C.SendEventRequest(workflow=WF, key=key, event=C.Event(
                input_json="1", rule=C.Rule(kind=C.RULE_KIND_BATCH, max_events=1))))
        polled = a.call("/keyflow.v1.Runs/PollRuns", R.PollRunsRequest(
            workflows=[WF], worker_id="admin", lease_ms=600000))
        self.assertEqual(len(polled.runs), 1)
        ctx.leased_run, ctx.lease = polled.runs[0].run_id, polled.runs[0].lease
        listed = a.call("/keyflow.v1.Runs/ListRuns", R.ListRunsRequest(
            workflow=WF, status=R.RUN_STATUS_PENDING))
        ctx.pending_run = listed.runs[0].run_id
        with open(os.path.join(HANDLERS, "running_sum.descriptor.json")) as f:
            d = json.load(f)
        d["functionId"], d["pipelineStateId"] = FN, FN + ".state"
        a.call("/keyflow.v1.Functions/RegisterFunction", F.RegisterFunctionRequest(
            descriptor=json_format.ParseDict(d, F.FunctionDescriptor())))
        a.call("/keyflow.v1.Functions/PushBatch", F.PushBatchRequest(
            function_id=FN, producer_id="p-admin", sequence=1,
            rows_json=json.dumps([{"user": "ann", "ts": 1, "amount": 5}])))
        d["functionId"], d["pipelineStateId"] = FN + "-new", FN + "-new.state"
        ctx.new_descriptor = json_format.ParseDict(d, F.FunctionDescriptor())
        ctx.victim, _ = self.create_key("victim", [("runs:read", "")])
        return ctx

    def test_every_rpc_and_route_refuses_without_the_right_key(self):
        rpcs = proto_rpcs()
        # Every RPC has a rule, every rule an RPC, and every row of the table
        # an RPC (rpc_table checks the last one too).
        self.assertEqual(sorted(set(rpcs) - set(RULES)), [], "RPCs without a rule in RULES")
        self.assertEqual(sorted(set(RULES) - set(rpcs)), [], "rules for RPCs that do not exist")
        self.assertEqual(set(self.rows), set(rpcs))
        ctx = self.make_ctx()
        scopes = [s for s in table()["scopes"] if s != "none"]
        # Keys: unknown (well formed), revoked, one per scope lacking only
        # that scope, and one with every scope limited to another prefix.
        unknown = "kf_%s_%s" % (secrets.token_hex(8), secrets.token_hex(32))
        revoked_id, revoked = self.create_key("revoked", [(s, "") for s in scopes])
        self.admin.call("/keyflow.v1.Keys/RevokeKey", K.RevokeKeyRequest(key_id=revoked_id))
        lacking = {s: self.create_key("lacks " + s, [(o, "") for o in scopes if o != s])[1]
                   for s in scopes}
        prefixed = self.create_key("other tenant", [
            (s, OTHER_PREFIX) for s in scopes if s not in ("metrics:read", "keys:admin")])[1]
        clients = {}

        def client(key):
            if key not in clients:
                clients[key] = Client(self.server.grpc_target, self.rows, key)
                self.addCleanup(clients[key].close)
            return clients[key]

        covered_routes = set()
        checked = 0
        for path, rule in sorted(RULES.items()):
            row = self.rows[path]
            if rule.get("open"):
                self.assertEqual(row["scope"], "none", path)
                request = message_class(row["request"])()
                for key in (None, unknown):
                    self.assertEqual(client(key).code(path, request), grpc.StatusCode.OK, path)
                continue
            request = rule["request"](ctx)
            # (key, gRPC code, HTTP status) for each kind of wrong key.
            cases = [(None, grpc.StatusCode.UNAUTHENTICATED, 401),
                     (unknown, grpc.StatusCode.UNAUTHENTICATED, 401),
                     (revoked, grpc.StatusCode.UNAUTHENTICATED, 401),
                     (lacking[row["scope"]], grpc.StatusCode.PERMISSION_DENIED, 403)]
            if rule["prefix"] == DENIED:
                cases.append((prefixed, grpc.StatusCode.PERMISSION_DENIED, 403))
            elif rule["prefix"] == HIDDEN:
                cases.append((prefixed, grpc.StatusCode.NOT_FOUND, 404))
            http_calls = rule["http"](ctx)
            for method, concrete, _ in http_calls:
                matched = [r for r in self.routes if r["rpc"] == path and r["http_method"] == method
                           and route_regex(r).match(concrete)]
                self.assertEqual(len(matched), 1, "%s %s: not one route of %s" % (method, concrete,
                                                                                  path))
                covered_routes.add((matched[0]["http_method"], matched[0]["pattern"],
                                    matched[0]["verb"]))
            if row["http"]:
                generic = json_format.MessageToDict(request)
                http_calls = http_calls + [("POST", "/v1/%s/%s" % (row["service"], path.split("/")[-1]),
                                            generic)]
            snapshot = rule["snapshot"]
            for key, code, status in cases:
                before = snapshot(ctx, self.admin) if snapshot else None
                self.assertEqual(client(key).code(path, request), code, "%s with key %s" % (path, key))
                for method, concrete, body in http_calls:
                    self.assertEqual(self.http(method, concrete, body, key), status,
                                     "%s %s with key %s" % (method, concrete, key))
                if snapshot:
                    self.assertEqual(snapshot(ctx, self.admin), before, "%s changed something" % path)
                checked += 1
            if rule["prefix"] == FILTERED:
                listed = client(prefixed).call(path, request)
                self.assertNotIn(FN, [f.descriptor.function_id for f in listed.functions])
                self.assertIn(FN, [f.descriptor.function_id for f in
                                   self.admin.call(path, request).functions])
        all_routes = {(r["http_method"], r["pattern"], r["verb"]) for r in self.routes}
        self.assertEqual(sorted(all_routes - covered_routes, key=str), [],
                         "HTTP routes without a rule")
        self.assertGreater(checked, 60)

    # --- metrics and probes ----------------------------------------------------
    def test_probes_need_no_key_and_metrics_need_metrics_read(self):
        _, other = self.create_key("no metrics", [("runs:read", "")])
        _, reader = self.create_key("prometheus", [("metrics:read", "")])
        probe_base = "http://127.0.0.1:%d" % self.server.probe_port
        for base in (self.server.http_base, probe_base):
            def get(path, key):
                headers = {"Authorization": bearer(key)} if key else {}
                return self.server.http("GET", path, None, headers=headers, base=base)[0]
            for path in ("/healthz", "/readyz"):
                self.assertEqual(get(path, None), 200, (base, path))
            self.assertEqual(get("/metrics", None), 401, base)
            self.assertEqual(get("/metrics", other), 403, base)
            self.assertEqual(get("/metrics", reader), 200, base)
        # The API's description is the gateway's, not the probe listener's.
        self.assertEqual(self.server.http("GET", "/openapi.json")[0], 200)
        status, body = self.server.http("GET", "/openapi.json", base=probe_base)
        self.assertEqual(status, 404, body)
        # metrics:read takes no prefix; an unknown scope is no scope.
        for grant in (("metrics:read", "x"), ("metrics:write", ""), ("none", "")):
            with self.assertRaises(grpc.RpcError) as cm:
                self.create_key("bad", [grant])
            self.assertEqual(cm.exception.code(), grpc.StatusCode.INVALID_ARGUMENT)

    def test_another_workflows_run_answers_like_an_unknown_one(self):
        """A key limited to other workflows learns neither that a run id
        exists nor its workflow: the answer is the unknown id's NOT_FOUND."""
        self.admin.call("/keyflow.v1.Coordinators/SendEvent", C.SendEventRequest(
            workflow="b1-payroll", key="k", event=C.Event(input_json="1", rule=C.Rule(
                kind=C.RULE_KIND_BATCH, max_events=1))))
        run = self.admin.call("/keyflow.v1.Runs/PollRuns", R.PollRunsRequest(
            workflows=["b1-payroll"], worker_id="admin", lease_ms=600000)).runs[0]
        unknown_id = "k@00000000-0000-4000-8000-000000000000"
        _, other = self.create_key("tenant a", [("runs:read", "a"), ("runs:work", "a"),
                                                ("coordinators:write", "a")])
        c = Client(self.server.grpc_target, self.rows, other)
        self.addCleanup(c.close)
        calls = [("/keyflow.v1.Runs/GetRun", lambda rid: R.GetRunRequest(run_id=rid)),
                 ("/keyflow.v1.Runs/HeartbeatRun",
                  lambda rid: R.HeartbeatRunRequest(run_id=rid, lease=run.lease)),
                 ("/keyflow.v1.Runs/CompleteRun",
                  lambda rid: R.CompleteRunRequest(run_id=rid, lease=run.lease, result_json="1")),
                 ("/keyflow.v1.Runs/ReleaseRun",
                  lambda rid: R.ReleaseRunRequest(run_id=rid, lease=run.lease)),
                 ("/keyflow.v1.Runs/CancelRun", lambda rid: R.CancelRunRequest(run_id=rid))]
        for path, request in calls:
            answers = []
            for rid in (run.run_id, unknown_id):
                with self.assertRaises(grpc.RpcError) as cm:
                    c.call(path, request(rid))
                answers.append((cm.exception.code(), cm.exception.details().replace(rid, "ID")))
                self.assertNotIn("payroll", cm.exception.details())
            self.assertEqual(answers[0], answers[1], path)
            self.assertEqual(answers[0][0], grpc.StatusCode.NOT_FOUND, path)
            status, body = self.server.http("GET", "/v1/runs/%s" % run.run_id,
                                            headers={"Authorization": bearer(other)})
            self.assertEqual(status, 404, body)
            self.assertNotIn("payroll", json.dumps(body))
        leased = self.admin.call("/keyflow.v1.Runs/GetRun", R.GetRunRequest(run_id=run.run_id))
        self.assertEqual(leased.status, R.RUN_STATUS_LEASED)

    def test_a_key_name_cannot_forge_log_lines(self):
        """A key's name is the caller's text: in the text log it is a quoted
        field with its quotes and newlines escaped, so a name cannot close
        its quotes and write the rest of the line (or another line)."""
        name = 'x" by 0000000000000000\n2026-01-01T00:00:00.000Z warn keys: forged'
        key_id, _ = self.create_key(name, [("runs:read", "")])
        self.admin.call("/keyflow.v1.Keys/RevokeKey", K.RevokeKeyRequest(key_id=key_id))
        lines = [line for line in self.server.read_log().splitlines() if key_id in line]
        self.assertEqual(len(lines), 2, lines)
        escaped = 'name="x\\" by 0000000000000000\\n2026-01-01T00:00:00.000Z warn keys: forged"'
        for line in lines:
            self.assertIn(escaped, line)

    def test_a_grant_prefix_with_a_control_byte_is_refused(self):
        """A grant's prefix is matched against workflow and function names,
        which refuse control bytes: a prefix holding one is refused at
        CreateKey (gRPC and HTTP, naming the grant), and no key is made."""
        listed = lambda: sorted(k.name for k in self.admin.call(
            "/keyflow.v1.Keys/ListKeys", K.ListKeysRequest()).keys)
        before = listed()
        for i, prefix in enumerate(("team\x01", "a\nb", "tab\t", "del\x7f", "\x1f")):
            with self.assertRaises(grpc.RpcError) as cm:
                self.create_key("ctl-grpc-%d" % i, [("runs:read", ""), ("events:send", prefix)])
            self.assertEqual(cm.exception.code(), grpc.StatusCode.INVALID_ARGUMENT, prefix)
            self.assertIn("grants[1].prefix", cm.exception.details())
            self.assertIn("control characters", cm.exception.details())
            # Over HTTP, on a raw socket: the JSON escape reaches the server
            # as the byte itself.
            body = json.dumps({"name": "ctl-http-%d" % i,
                               "grants": [{"scope": "events:send", "prefix": prefix}]}).encode()
            with socket.create_connection(("127.0.0.1", self.server.http_port), timeout=10) as s:
                s.sendall(b"POST /v1/keys HTTP/1.1\r\nHost: localhost\r\nConnection: close\r\n"
                          b"Authorization: " + bearer(self.admin_key).encode() + b"\r\n"
                          b"Content-Type: application/json\r\nContent-Length: %d\r\n\r\n"
                          % len(body) + body)
                answer = b""
                while True:
                    chunk = s.recv(65536)
                    if not chunk:
                        break
                    answer += chunk
            head, _, text = answer.partition(b"\r\n\r\n")
            self.assertTrue(head.startswith(b"HTTP/1.1 400 "), answer)
            doc = json.loads(text)
            self.assertEqual((doc["code"], doc["status"]), (3, "INVALID_ARGUMENT"))
            self.assertIn("grants[0].prefix", doc["message"])
        self.assertEqual(listed(), before)
        # A clean prefix is still taken.
        self.create_key("ctl-clean", [("events:send", "team-")])

    # --- malformed headers ------------------------------------------------------
    def test_two_authorization_headers_are_refused(self):
        """Two keys in one request: refused (401), never first- or last-wins,
        whichever of them is the good one."""
        import http.client
        _, reader = self.create_key("reader", [("runs:read", "")])
        bad = "kf_%s_%s" % (secrets.token_hex(8), secrets.token_hex(32))
        for pair in ((reader, bad), (bad, reader), (reader, reader)):
            conn = http.client.HTTPConnection("127.0.0.1", self.server.http_port, timeout=10)
            conn.putrequest("GET", "/v1/runs")
            for key in pair:
                conn.putheader("Authorization", bearer(key))
            conn.endheaders()
            resp = conn.getresponse()
            body = json.loads(resp.read())
            conn.close()
            self.assertEqual(resp.status, 401, body)
            self.assertIn("sent 2 times", body["message"])
            md = [("authorization", bearer(k)) for k in pair]
            with self.assertRaises(grpc.RpcError) as cm:
                self.admin.channel.unary_unary(
                    "/keyflow.v1.Runs/ListRuns", request_serializer=lambda m: m.SerializeToString(),
                    response_deserializer=R.ListRunsResponse.FromString)(
                    R.ListRunsRequest(), metadata=md, timeout=TIMEOUT_S)
            self.assertEqual(cm.exception.code(), grpc.StatusCode.UNAUTHENTICATED)
            self.assertIn("sent 2 times", cm.exception.details())
        self.assertEqual(self.http("GET", "/v1/runs", None, reader), 200)

    # --- malformed streams ------------------------------------------------------
    def test_a_result_before_any_hello_ends_only_that_stream(self):
        """Workers/Serve's resource is hello.function_id, a oneof member: a
        first message holding a result names no function. It is refused
        INVALID_ARGUMENT (it used to abort keyflowd), for a key with or
        without a prefix, and the server goes on serving."""
        _, anyfn = self.create_key("serve all", [("functions:serve", "")])
        _, some = self.create_key("serve fa", [("functions:serve", "fa")])
        path = "/keyflow.v1.Workers/Serve"
        for key in (anyfn, some):
            stream = self.admin.channel.stream_stream(
                path, request_serializer=lambda m: m.SerializeToString(),
                response_deserializer=W.ServerMessage.FromString)(
                iter([W.WorkerMessage(result=W.CallResult())]),
                metadata=[("authorization", bearer(key))], timeout=TIMEOUT_S)
            with self.assertRaises(grpc.RpcError) as cm:
                next(stream)
            self.assertEqual(cm.exception.code(), grpc.StatusCode.INVALID_ARGUMENT,
                             cm.exception.details())
            self.assertIn("hello.function_id", cm.exception.details())
            self.assertIsNone(self.server.proc.poll(), self.server.read_log())
        self.assertEqual(self.admin.code("/keyflow.v1.Keys/ListKeys", K.ListKeysRequest()),
                         grpc.StatusCode.OK)


class NewServerAuthTest(Auth):
    """A new server for each test: these kill and restart it, or count
    every admin key it holds."""

    fresh_server = True

    # --- ownership ---------------------------------------------------------------
    def test_a_producer_belongs_to_the_key_that_first_used_it(self):
        with open(os.path.join(HANDLERS, "running_sum.descriptor.json")) as f:
            d = json.load(f)
        d["functionId"], d["pipelineStateId"] = "own-fn", "own-fn.state"
        self.admin.call("/keyflow.v1.Functions/RegisterFunction", F.RegisterFunctionRequest(
            descriptor=json_format.ParseDict(d, F.FunctionDescriptor())))
        _, alice = self.create_key("alice", [("functions:push", "own-")])
        _, bob = self.create_key("bob", [("functions:push", "")])

        def push(key, seq):
            return Client(self.server.grpc_target, self.rows, key).code(
                "/keyflow.v1.Functions/PushBatch", F.PushBatchRequest(
                    function_id="own-fn", producer_id="p1", sequence=seq,
                    rows_json=json.dumps([{"user": "ann", "ts": seq, "amount": 1}])))
        self.assertEqual(push(alice, 1), grpc.StatusCode.OK)
        # Bob cannot lock alice out with sequence INT64_MAX, nor replay her acks.
        self.assertEqual(push(bob, 2 ** 63 - 1), grpc.StatusCode.PERMISSION_DENIED)
        self.assertEqual(push(bob, 1), grpc.StatusCode.PERMISSION_DENIED)
        self.assertEqual(push(alice, 2), grpc.StatusCode.OK)
        # The owner is durable.
        self.server.kill()
        self.server.start()
        self.assertEqual(push(bob, 3), grpc.StatusCode.PERMISSION_DENIED)
        self.assertEqual(push(alice, 3), grpc.StatusCode.OK)

    def test_a_lease_belongs_to_the_key_that_took_it(self):
        self.admin.call("/keyflow.v1.Coordinators/SendEvent", C.SendEventRequest(
            workflow="jobs", key="k1", event=C.Event(input_json="1", rule=C.Rule(
                kind=C.RULE_KIND_BATCH, max_events=1))))
        _, alice = self.create_key("alice", [("runs:work", "jobs")])
        _, bob = self.create_key("bob", [("runs:work", "")])
        a = Client(self.server.grpc_target, self.rows, alice)
        b = Client(self.server.grpc_target, self.rows, bob)
        self.addCleanup(a.close)
        self.addCleanup(b.close)
        run = a.call("/keyflow.v1.Runs/PollRuns", R.PollRunsRequest(
            workflows=["jobs"], worker_id="alice", lease_ms=600000)).runs[0]
        hb = R.HeartbeatRunRequest(run_id=run.run_id, lease=run.lease)
        done = R.CompleteRunRequest(run_id=run.run_id, lease=run.lease, result_json='"forged"')
        self.assertEqual(b.code("/keyflow.v1.Runs/HeartbeatRun", hb),
                         grpc.StatusCode.PERMISSION_DENIED)
        self.assertEqual(b.code("/keyflow.v1.Runs/CompleteRun", done),
                         grpc.StatusCode.PERMISSION_DENIED)
        self.server.kill()  # the owner is durable
        self.server.start()
        a = Client(self.server.grpc_target, self.rows, alice)
        b = Client(self.server.grpc_target, self.rows, bob)
        self.addCleanup(a.close)
        self.addCleanup(b.close)
        # The port file comes before recovery ends: until then calls are
        # UNAVAILABLE (an ASan CI run met it). The owner's heartbeat says
        # when the partitions serve.
        harness.wait_until(lambda: a.code("/keyflow.v1.Runs/HeartbeatRun", hb)
                           != grpc.StatusCode.UNAVAILABLE, 60, "the restarted keyflowd to serve")
        self.assertEqual(b.code("/keyflow.v1.Runs/CompleteRun", done),
                         grpc.StatusCode.PERMISSION_DENIED)
        self.assertEqual(a.code("/keyflow.v1.Runs/HeartbeatRun", hb), grpc.StatusCode.OK)
        ok = a.call("/keyflow.v1.Runs/CompleteRun", R.CompleteRunRequest(
            run_id=run.run_id, lease=run.lease, result_json='"real"'))
        self.assertEqual(ok.run.result_json, '"real"')

    # --- durability ---------------------------------------------------------------
    def test_keys_survive_sigkill_and_revoked_stays_revoked(self):
        keep_id, keep = self.create_key("keep", [("runs:read", "")])
        gone_id, gone = self.create_key("gone", [("runs:read", "")])
        self.admin.call("/keyflow.v1.Keys/RevokeKey", K.RevokeKeyRequest(key_id=gone_id))
        with self.assertRaises(grpc.RpcError) as cm:  # revoking twice
            self.admin.call("/keyflow.v1.Keys/RevokeKey", K.RevokeKeyRequest(key_id=gone_id))
        self.assertEqual(cm.exception.code(), grpc.StatusCode.NOT_FOUND)
        bootstrap = os.path.join(self.server.data_dir, "db", "bootstrap-admin.key")
        self.server.kill()
        self.server.start()
        list_runs = ("/keyflow.v1.Runs/ListRuns", R.ListRunsRequest())
        self.assertEqual(Client(self.server.grpc_target, self.rows, keep).code(*list_runs),
                         grpc.StatusCode.OK)
        self.assertEqual(Client(self.server.grpc_target, self.rows, gone).code(*list_runs),
                         grpc.StatusCode.UNAUTHENTICATED)
        admin = Client(self.server.grpc_target, self.rows, self.admin_key)
        self.addCleanup(admin.close)
        ids = [k.key_id for k in admin.call("/keyflow.v1.Keys/ListKeys", K.ListKeysRequest()).keys]
        self.assertIn(keep_id, ids)
        self.assertNotIn(gone_id, ids)
        # The bootstrap key is made once per store: not again after a restart
        # (the file is still the first key's), and never logged.
        self.assertEqual(open(bootstrap).read().strip(), self.admin_key)
        self.assertEqual(self.server.read_log().count("wrote the admin API key"), 1)
        self.assertNotIn(self.admin_key, self.server.read_log())
        self.assertNotIn(keep, self.server.read_log())

    def test_the_last_admin_key_cannot_be_revoked(self):
        admin_id = self.admin.call("/keyflow.v1.Keys/ListKeys", K.ListKeysRequest()).keys[0].key_id
        with self.assertRaises(grpc.RpcError) as cm:
            self.admin.call("/keyflow.v1.Keys/RevokeKey", K.RevokeKeyRequest(key_id=admin_id))
        self.assertEqual(cm.exception.code(), grpc.StatusCode.FAILED_PRECONDITION)
        _, second = self.create_key("second admin", [("keys:admin", "")])
        b = Client(self.server.grpc_target, self.rows, second)
        self.addCleanup(b.close)
        b.call("/keyflow.v1.Keys/RevokeKey", K.RevokeKeyRequest(key_id=admin_id))
        self.assertEqual(self.admin.code("/keyflow.v1.Keys/ListKeys", K.ListKeysRequest()),
                         grpc.StatusCode.UNAUTHENTICATED)


class AdminKeyFileTest(unittest.TestCase):
    """--admin-key-file: the operator's key (a Kubernetes or compose secret)
    becomes the admin key at the store's first start; no file is written."""

    def test_the_operators_key_is_adopted_once(self):
        d = tempfile.mkdtemp(prefix="kf-admin-")
        self.addCleanup(lambda: subprocess.run(["rm", "-rf", d]))
        key = "kf_%s_%s" % (secrets.token_hex(8), secrets.token_hex(32))
        path = os.path.join(d, "admin.key")
        with open(path, "w") as f:
            f.write(key + "\n")
        server = harness.Keyflowd(args=["--auth", "--admin-key-file", path]).start()
        self.addCleanup(server.cleanup)
        rows = {r["path"]: r for r in table()["methods"]}
        admin = Client(server.grpc_target, rows, key)
        self.addCleanup(admin.close)
        listed = admin.call("/keyflow.v1.Keys/ListKeys", K.ListKeysRequest()).keys
        self.assertEqual([k.key_id for k in listed], [key[3:19]])
        self.assertFalse(os.path.exists(os.path.join(server.data_dir, "db", "bootstrap-admin.key")))
        self.assertNotIn(key[20:], server.read_log())
        # Revoked (after a second admin exists), it stays revoked: the file is
        # read again at every start, but the store was bootstrapped already.
        second = admin.call("/keyflow.v1.Keys/CreateKey", K.CreateKeyRequest(
            name="second", grants=[K.Grant(scope="keys:admin")])).api_key
        b = Client(server.grpc_target, rows, second)
        self.addCleanup(b.close)
        b.call("/keyflow.v1.Keys/RevokeKey", K.RevokeKeyRequest(key_id=key[3:19]))
        self.assertEqual(server.stop(), 0)
        server.start()
        admin2 = Client(server.grpc_target, rows, key)
        self.addCleanup(admin2.close)
        self.assertEqual(admin2.code("/keyflow.v1.Keys/ListKeys", K.ListKeysRequest()),
                         grpc.StatusCode.UNAUTHENTICATED)
        self.assertIn("ignored", server.read_log())
        self.assertEqual(server.stop(), 0)

    def test_a_malformed_key_file_stops_the_start(self):
        d = tempfile.mkdtemp(prefix="kf-admin-")
        self.addCleanup(lambda: subprocess.run(["rm", "-rf", d]))
        path = os.path.join(d, "admin.key")
        with open(path, "w") as f:
            f.write("not-a-key\n")
        out = subprocess.run([harness.KEYFLOWD, "--data", os.path.join(d, "db"), "--grpc",
                              "127.0.0.1:0", "--http", "127.0.0.1:0", "--auth",
                              "--admin-key-file", path],
                             capture_output=True, text=True, timeout=60)
        self.assertEqual(out.returncode, 1)
        self.assertIn(path, out.stderr)
        self.assertIn("kf_<16 hex digits>", out.stderr)


class DataDirectoryModeTest(unittest.TestCase):
    """The data directory holds every input and the key hashes: keyflowd
    creates it 0700 and its files 0600 (RocksDB's too), whatever umask it
    was started with."""

    def test_the_store_is_private_to_keyflowds_user(self):
        old = os.umask(0o022)
        self.addCleanup(os.umask, old)
        server = harness.Keyflowd(args=["--auth"]).start()
        self.addCleanup(server.cleanup)
        db = os.path.join(server.data_dir, "db")
        self.assertEqual(os.stat(db).st_mode & 0o777, 0o700)
        self.assertEqual(server.http("GET", "/healthz")[0], 200)
        self.assertEqual(server.stop(), 0)  # RocksDB has written its files
        files = 0
        for base, dirs, names in os.walk(db):
            for d in dirs:
                self.assertEqual(os.stat(os.path.join(base, d)).st_mode & 0o077, 0, d)
            for n in names:
                mode = os.stat(os.path.join(base, n)).st_mode & 0o777
                self.assertEqual(mode & 0o077, 0, "%s is %o" % (n, mode))
                files += 1
        self.assertGreater(files, 5)

    def test_an_existing_open_directory_is_warned_about(self):
        data = tempfile.mkdtemp(prefix="kf-data-")
        self.addCleanup(lambda: subprocess.run(["rm", "-rf", data]))
        os.makedirs(os.path.join(data, "db"))
        os.chmod(os.path.join(data, "db"), 0o755)
        server = harness.Keyflowd(data_dir=data).start()
        self.addCleanup(server.cleanup)
        self.assertEqual(server.stop(), 0)
        self.assertRegex(server.read_log(), r"warn main: data directory .*/db is accessible to "
                                            r"other users \(mode 755\)")


class AuthDefaultsTest(unittest.TestCase):
    def test_loopback_without_auth_needs_no_key(self):
        server = harness.Keyflowd().start()
        self.addCleanup(server.cleanup)
        self.assertRegex(server.read_log(), r"serving .*auth=\"?off")
        self.assertEqual(server.http("GET", "/v1/runs", None)[0], 200)
        self.assertFalse(os.path.exists(os.path.join(server.data_dir, "db",
                                                     "bootstrap-admin.key")))
        self.assertEqual(server.stop(), 0)

    def raw(self, port, method, path, headers, body=b"", version="HTTP/1.1"):
        """(status, body text) of one request sent byte for byte (urllib
        would add or fix headers)."""
        import socket
        lines = ["%s %s %s" % (method, path, version)] + ["%s: %s" % h for h in headers]
        if body:
            lines.append("Content-Length: %d" % len(body))
        lines.append("Connection: close")
        with socket.create_connection(("127.0.0.1", port), timeout=TIMEOUT_S) as s:
            s.sendall(("\r\n".join(lines) + "\r\n\r\n").encode() + body)
            data = b""
            while True:
                chunk = s.recv(65536)
                if not chunk:
                    break
                data += chunk
        head, _, text = data.partition(b"\r\n\r\n")
        return int(head.split()[1]), text.decode()

    def test_without_keys_a_web_page_cannot_drive_keyflowd(self):
        """Auth off on loopback: a cross-site page's requests (any Origin
        but a loopback one, CORS-simple text/plain POSTs included) and DNS
        rebinding (a Host that is not a loopback literal) are refused 403
        and change nothing; curl and other clients that are not browsers
        keep working, the README's curl -d (form Content-Type) too."""
        server = harness.Keyflowd(args=["--probe-address", "127.0.0.1:0"]).start()
        self.addCleanup(server.cleanup)
        port = server.http_port
        local = ("Host", "127.0.0.1:%d" % port)
        event = json.dumps({"rule": {"kind": "batch"}, "input": 1}).encode()
        send = "/v1/workflows/web/keys/k/events"
        refused = [
            [local, ("Origin", "http://evil.example"), ("Content-Type", "text/plain")],
            [local, ("Origin", "null"), ("Content-Type", "text/plain")],
            [local, ("Origin", "https://evil.example:%d" % port)],
            [("Host", "evil.example:%d" % port), ("Content-Type", "application/json")],
            [("Host", "rebind.evil.example")],
        ]
        for headers in refused:
            status, text = self.raw(port, "POST", send, headers, event)
            self.assertEqual(status, 403, (headers, text))
            body = json.loads(text)
            self.assertEqual(body["status"], "PERMISSION_DENIED")
            self.assertRegex(body["message"], r"^(origin|host): .*--auth")
        for path in ("/v1/runs", "/healthz", "/metrics"):  # reads and probes too
            self.assertEqual(self.raw(port, "GET", path, [("Host", "evil.example")])[0], 403)
        self.assertEqual(self.raw(server.probe_port, "GET", "/metrics",
                                  [("Host", "evil.example")])[0], 403)
        status, body = server.http("GET", "/v1/coordinators/batch/web/k")
        self.assertEqual(status, 200, body)
        self.assertFalse(body.get("exists"), body)  # nothing was sent
        # What keeps working: a loopback page, any loopback Host, no Host at
        # all (HTTP/1.0), and curl -d with its default form Content-Type.
        allowed = [
            [local, ("Origin", "http://localhost:3000"), ("Content-Type", "application/json")],
            [("Host", "localhost:%d" % port)],
            [("Host", "[::1]:%d" % port)],
        ]
        for headers in allowed:
            status, text = self.raw(port, "POST", send, headers, event)
            self.assertEqual(status, 200, (headers, text))
        self.assertEqual(self.raw(port, "GET", "/healthz", [], version="HTTP/1.0")[0], 200)
        out = subprocess.run(["curl", "-sS", "-o", "/dev/null", "-w", "%{http_code}", "-d",
                              event.decode(), server.http_base + send],
                             capture_output=True, text=True, timeout=60)
        self.assertEqual(out.stdout, "200", out.stderr)
        self.assertEqual(server.stop(), 0)

    def test_without_keys_the_origin_must_be_the_listeners_own(self):
        """--insecure-no-auth on a listener other machines reach: any Host
        (clients use the server's names), but a browser's Origin must be
        the request's own (a page served elsewhere cannot drive it).
        [::ffff:127.0.0.1] is such a listener to keyflowd (not a loopback
        literal), yet reachable from this test."""
        server = harness.Keyflowd(args=["--http", "[::ffff:127.0.0.1]:0",
                                        "--insecure-no-auth"]).start()
        self.addCleanup(server.cleanup)
        port = server.http_port
        host = ("Host", "keyflow.internal:%d" % port)
        self.assertEqual(self.raw(port, "GET", "/v1/runs", [host])[0], 200)
        self.assertEqual(self.raw(port, "GET", "/v1/runs", [
            host, ("Origin", "http://keyflow.internal:%d" % port)])[0], 200)
        status, text = self.raw(port, "POST", "/v1/workflows/web/keys/k/events", [
            host, ("Origin", "http://evil.example"), ("Content-Type", "text/plain")],
            json.dumps({"input": 1}).encode())
        self.assertEqual(status, 403, text)
        self.assertIn("origin:", text)
        self.assertEqual(server.stop(), 0)

    def test_keys_cannot_be_managed_while_auth_is_off(self):
        """A key made while keys are off would be anyone's (or a web
        page's), and would hold its grants at the first start with --auth:
        the Keys service refuses until keyflowd checks keys."""
        server = harness.Keyflowd().start()
        self.addCleanup(server.cleanup)
        status, body = server.http("POST", "/v1/keys", {
            "name": "sneaky", "grants": [{"scope": "keys:admin"}]})
        self.assertEqual(status, 409, body)
        self.assertIn("--auth", body["message"])
        self.assertEqual(server.http("GET", "/v1/keys")[0], 409)
        rows = {r["path"]: r for r in table()["methods"]}
        c = Client(server.grpc_target, rows)
        self.addCleanup(c.close)
        self.assertEqual(c.code("/keyflow.v1.Keys/CreateKey", K.CreateKeyRequest(
            name="sneaky", grants=[K.Grant(scope="keys:admin")])),
            grpc.StatusCode.FAILED_PRECONDITION)
        self.assertEqual(server.stop(), 0)
        # With --auth, the bootstrap admin is the only key there is.
        server.args = ["--auth"]
        server.start()
        with open(os.path.join(server.data_dir, "db", "bootstrap-admin.key")) as f:
            admin = Client(server.grpc_target, rows, f.read().strip())
        self.addCleanup(admin.close)
        keys = admin.call("/keyflow.v1.Keys/ListKeys", K.ListKeysRequest()).keys
        self.assertEqual([k.name for k in keys], ["bootstrap admin"])
        self.assertEqual(server.stop(), 0)

    def test_bootstrap_file_is_never_overwritten(self):
        data = tempfile.mkdtemp(prefix="kf-data-")
        self.addCleanup(lambda: subprocess.run(["rm", "-rf", data]))
        os.makedirs(os.path.join(data, "db"))
        stale = os.path.join(data, "db", "bootstrap-admin.key")
        with open(stale, "w") as f:
            f.write("someone else's key\n")
        out = subprocess.run([harness.KEYFLOWD, "--data", os.path.join(data, "db"), "--grpc",
                              "127.0.0.1:0", "--http", "127.0.0.1:0", "--auth"],
                             capture_output=True, text=True, timeout=60)
        self.assertEqual(out.returncode, 1)
        self.assertIn("already exists", out.stderr)
        self.assertEqual(open(stale).read(), "someone else's key\n")


if __name__ == "__main__":
    unittest.main()
