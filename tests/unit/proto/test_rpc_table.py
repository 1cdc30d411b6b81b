"""The RPC table (service/proto/rpcs.h) and the HTTP routes against api/.

Every `rpc` of every .proto file under api/ (compiled by protoc, so a new
file or RPC is seen without editing this test) must have exactly one row,
and every row must name an rpc with the same request and response types and
streaming. The rows' flags and authorization columns must fit the messages,
and every HTTP route must name an RPC the gateway serves and fields its
request has.

The C client's KF_CLIENT_PATH_* names (clients/c/keyflow_client.h, public
string constants) must each be the path of a row.

Environment: KF_PROTOC (protoc), KF_SOURCE_DIR (the tree), KF_RPC_TABLE_DUMP
(the rpc_table_dump binary, which prints the C tables as JSON).
"""
import copy
import json
import os
import pathlib
import re
import subprocess
import tempfile
import unittest

from google.protobuf import descriptor_pb2

FDP = descriptor_pb2.FieldDescriptorProto


def load_protos(protoc, api_dir):
    """Messages by full name, and rpcs by gRPC path, from every .proto."""
    files = sorted(str(p.relative_to(api_dir)) for p in pathlib.Path(api_dir).rglob("*.proto"))
    assert files, f"no .proto files under {api_dir}"
    with tempfile.TemporaryDirectory() as tmp:
        out = os.path.join(tmp, "api.desc")
        subprocess.run([protoc, f"-I{api_dir}", "--include_imports", f"--descriptor_set_out={out}",
                        *files], check=True)
        fds = descriptor_pb2.FileDescriptorSet.FromString(pathlib.Path(out).read_bytes())
    messages, rpcs = {}, {}

    def add_messages(prefix, types):
        for m in types:
            name = f"{prefix}.{m.name}"
            messages[name] = m
            add_messages(name, m.nested_type)

    for f in fds.file:
        add_messages(f.package, f.message_type)
        for svc in f.service:
            for meth in svc.method:
                path = f"/{f.package}.{svc.name}/{meth.name}"
                rpcs.setdefault(path, []).append(meth)
    return messages, rpcs


def field(messages, message_name, dotted):
    """The field a dotted path names, or an error text. A path may pass
    through repeated messages (SendEvents' "events.workflow": the field of
    every element)."""
    msg = messages[message_name]
    parts = dotted.split(".")
    for i, part in enumerate(parts):
        found = [f for f in msg.field if f.name == part]
        if not found:
            return None, f"{message_name} has no field {'.'.join(parts[:i + 1])}"
        f = found[0]
        if i < len(parts) - 1:
            if f.type != FDP.TYPE_MESSAGE:
                return None, f"{'.'.join(parts[:i + 1])} is not a message"
            message_name = f.type_name.lstrip(".")
            msg = messages[message_name]
    return f, None


# Resource paths that run through a member of a oneof, each checked by hand:
# a request holding another member of that oneof names no resource, and
# auth.c (field_present) refuses it INVALID_ARGUMENT whatever the key.
# A row belongs here only once its front end ends just that call on the
# refusal (Workers/Serve: a result before the hello ends only that stream,
# tests/e2e/test_auth.py). Any other path through a oneof is reported.
ONEOF_RESOURCES = {("/keyflow.v1.Workers/Serve", "hello.function_id")}


def path_shape(messages, message_name, dotted):
    """(oneof members on the path, repeated messages after its first segment)
    as dotted prefixes: what auth.c's walk has to know about."""
    msg = messages[message_name]
    oneofs, repeated = [], []
    parts = dotted.split(".")
    for i, part in enumerate(parts):
        f = next(f for f in msg.field if f.name == part)
        here = ".".join(parts[:i + 1])
        if f.HasField("oneof_index"):
            oneofs.append(here)
        if i < len(parts) - 1:
            if i > 0 and f.label == FDP.LABEL_REPEATED:
                repeated.append(here)
            msg = messages[f.type_name.lstrip(".")]
    return oneofs, repeated


def check(tables, messages, rpcs):
    """Every problem found, as sentences; [] when the tables are right."""
    problems = []
    rows = tables["methods"]
    scopes = set(tables["scopes"])
    by_path = {}
    for row in rows:
        by_path.setdefault(row["path"], []).append(row)
    for path, meths in sorted(rpcs.items()):
        if len(meths) != 1:
            problems.append(f"{path}: declared {len(meths)} times in api/")
        n = len(by_path.get(path, []))
        if n != 1:
            problems.append(f"{path}: {n} rows in the RPC table (want exactly 1)")
    names = {}
    for row in rows:
        path = row["path"]
        names.setdefault(row["name"], []).append(path)
        if path not in rpcs:
            problems.append(f"{path}: a row, but no such rpc in api/")
            continue
        meth = rpcs[path][0]
        if path != f"/{row['service']}/{path.rsplit('/', 1)[1]}":
            problems.append(f"{path}: service {row['service']} does not match the path")
        want_req, want_resp = meth.input_type.lstrip("."), meth.output_type.lstrip(".")
        if row["request"] != want_req:
            problems.append(f"{path}: request {row['request']}, the proto says {want_req}")
        if row["response"] != want_resp:
            problems.append(f"{path}: response {row['response']}, the proto says {want_resp}")
        streaming = (meth.client_streaming, meth.server_streaming)
        want = {"unary": (False, False), "long_poll": (False, False),
                "server_stream": (False, True), "bidi_stream": (True, True)}[row["shape"]]
        if streaming != want:
            problems.append(f"{path}: shape {row['shape']}, but the proto streams "
                            f"client={streaming[0]} server={streaming[1]}")
        if row["executor"] == "engine" and row["shape"] not in ("unary", "long_poll"):
            problems.append(f"{path}: the engine executes only unary and long-poll rows")
        if row["executor"] == "engine" and not row.get("op_row_matches"):
            problems.append(f"{path}: kf_method_by_op({row.get('op')}) is another row")
        if row["request"] in messages:
            wait, _ = field(messages, row["request"], "wait_ms")
            can_wait = wait is not None and wait.type == FDP.TYPE_INT64 and \
                wait.label != FDP.LABEL_REPEATED
            if row["shape"] == "long_poll" and not can_wait:
                problems.append(f"{path}: a long poll's request needs an int64 wait_ms")
            if row["shape"] == "unary" and wait is not None:
                problems.append(f"{path}: its request has wait_ms, so it is a long poll")
            if row["resource"] is not None:
                f, err = field(messages, row["request"], row["resource"])
                if err:
                    problems.append(f"{path}: resource {row['resource']}: {err}")
                elif f.type != FDP.TYPE_STRING:
                    problems.append(f"{path}: resource {row['resource']} is not a string field")
                else:
                    oneofs, repeated = path_shape(messages, row["request"], row["resource"])
                    if oneofs and (path, row["resource"]) not in ONEOF_RESOURCES:
                        problems.append(f"{path}: resource {row['resource']} runs through the "
                                        f"oneof member {oneofs[0]}: a request holding another "
                                        f"member names nothing (see ONEOF_RESOURCES)")
                    if repeated:
                        problems.append(f"{path}: resource {row['resource']} runs through the "
                                        f"repeated message {repeated[0]}: only the first "
                                        f"segment may repeat")
        route = row["route"]
        want_fields = {"by_coordinator": 2, "by_run_id": 1, "by_function_key": 2}.get(
            route["kind"], 0)
        if len(route["fields"]) != want_fields:
            problems.append(f"{path}: route {route['kind']} names {len(route['fields'])} "
                            f"fields, want {want_fields}")
        for name in route["fields"]:
            f, err = field(messages, row["request"], name) if row["request"] in messages \
                else (None, None)
            if err:
                problems.append(f"{path}: route field {name}: {err}")
            elif f is not None and (f.type != FDP.TYPE_STRING or
                                    f.label == FDP.LABEL_REPEATED):
                problems.append(f"{path}: route field {name} is not a string field")
        if (route["plan"] is None) != (route["kind"] not in ("split", "all", "merge", "first")):
            problems.append(f"{path}: route {route['kind']} and plan {route['plan']} disagree")
        if row["executor"] == "engine" and route["kind"] == "local":
            problems.append(f"{path}: the engine runs in partitions: a route is needed")
        if row["executor"] == "engine" and row.get("disk") not in ("grows", "bounded"):
            problems.append(f"{path}: disk {row.get('disk')}, want grows or bounded")
        if row.get("disk") == "grows" and row["scope"].endswith(":read"):
            problems.append(f"{path}: disk GROWS, but a call a read scope allows must not "
                            f"grow the store (it would be refused below the disk reserve)")
        if row["scope"] not in scopes:
            problems.append(f"{path}: scope {row['scope']} is not in KF_SCOPE_TABLE")
        if row["scope"] == "none" and not path.startswith(("/grpc.health.v1.Health/",
                                                              "/grpc.reflection.",
                                                              "/keyflow.v1.Partitions/")):
            problems.append(f"{path}: only health, reflection and placement need no key")
    for name, paths in names.items():
        if len(paths) > 1:
            problems.append(f"name {name} is used by {', '.join(paths)}")
    problems += check_routes(tables["routes"], {r["path"]: r for r in rows}, messages)
    return problems


def check_routes(routes, rows, messages):
    problems, seen = [], set()
    for r in routes:
        where = f"route {r['http_method']} {r['pattern']}" + (f":{r['verb']}" if r["verb"] else "")
        if where in seen:
            problems.append(f"{where}: listed twice")
        seen.add(where)
        if r["http_method"] not in ("GET", "POST", "DELETE"):
            problems.append(f"{where}: method {r['http_method']}")
        if r["http_method"] in ("GET", "DELETE") and r["body"] is not None:
            problems.append(f"{where}: a {r['http_method']} route takes no body")
        row = rows.get(r["rpc"])
        if row is None:
            problems.append(f"{where}: names {r['rpc']}, which is not in the RPC table")
            continue
        if not row["http"]:
            problems.append(f"{where}: names {r['rpc']}, which the gateway does not serve")
            continue
        request = row["request"]
        fields = [seg[1:-1] for seg in r["pattern"].split("/") if seg.startswith("{")]
        if r["body"] not in (None, "*"):
            fields.append(r["body"])
        for pair in filter(None, (r["defaults"] or "").split("&")):
            fields.append(pair.split("=", 1)[0])  # field=value
        for pair in filter(None, (r["aliases"] or "").split("&")):
            fields.append(pair.split("=", 1)[1])  # short=field
        for name in fields:
            _, err = field(messages, request, name)
            if err:
                problems.append(f"{where}: {err}")
    return problems


class RpcTableTest(unittest.TestCase):
    @classmethod
    def setUpClass(cls):
        cls.source = pathlib.Path(os.environ["KF_SOURCE_DIR"])
        cls.messages, cls.rpcs = load_protos(os.environ["KF_PROTOC"], cls.source / "api")
        out = subprocess.run([os.environ["KF_RPC_TABLE_DUMP"]], check=True, capture_output=True)
        cls.tables = json.loads(out.stdout)

    def problems(self, tables):
        return check(tables, self.messages, self.rpcs)

    def test_the_tables_match_the_protos(self):
        self.assertGreater(len(self.rpcs), 10)
        self.assertEqual(self.problems(self.tables), [])

    def test_the_c_client_paths_are_rows(self):
        header = (self.source / "clients/c/keyflow_client.h").read_text()
        paths = re.findall(r'#define\s+KF_CLIENT_PATH_\w+\s+"([^"]+)"', header)
        self.assertGreater(len(paths), 10)
        rows = {r["path"] for r in self.tables["methods"]}
        self.assertEqual([p for p in paths if p not in rows], [])

    def test_the_table_flags_match_what_the_front_ends_do(self):
        rows = {r["path"]: r for r in self.tables["methods"]}
        self.assertEqual(rows["/keyflow.v1.Runs/PollRuns"]["shape"], "long_poll")
        self.assertEqual(rows["/keyflow.v1.Functions/TailOutput"]["executor"], "front_end")
        self.assertFalse(rows["/grpc.health.v1.Health/Check"]["http"])
        self.assertTrue(rows["/keyflow.v1.Coordinators/SendEvent"]["http"])

    # The checks must be able to fail: each mistake below is one a developer
    # can make, and each must be reported.
    def mutated(self, fn):
        tables = copy.deepcopy(self.tables)
        fn(tables)
        return self.problems(tables)

    def row(self, tables, path):
        return next(r for r in tables["methods"] if r["path"] == path)

    def test_a_missing_row_is_reported(self):
        found = self.mutated(lambda t: t["methods"].pop(0))
        self.assertTrue(any("0 rows" in p for p in found), found)

    def test_a_duplicate_row_is_reported(self):
        found = self.mutated(lambda t: t["methods"].append(copy.deepcopy(t["methods"][0])))
        self.assertTrue(any("2 rows" in p for p in found), found)

    def test_a_row_without_an_rpc_is_reported(self):
        def add(t):
            extra = copy.deepcopy(t["methods"][0])
            extra["path"], extra["name"] = "/keyflow.v1.Coordinators/Nope", "Nope"
            t["methods"].append(extra)
        found = self.mutated(add)
        self.assertTrue(any("no such rpc" in p for p in found), found)

    def test_wrong_types_and_streaming_are_reported(self):
        def wrong(t):
            r = self.row(t, "/keyflow.v1.Runs/GetRun")
            r["response"] = "keyflow.v1.ListRunsResponse"
            self.row(t, "/keyflow.v1.Functions/TailOutput")["shape"] = "unary"
        found = self.mutated(wrong)
        self.assertTrue(any("GetRun: response" in p for p in found), found)
        self.assertTrue(any("TailOutput: shape" in p for p in found), found)

    def test_a_long_poll_not_marked_is_reported(self):
        found = self.mutated(lambda t: self.row(t, "/keyflow.v1.Runs/PollRuns")
                             .update(shape="unary"))
        self.assertTrue(any("PollRuns: its request has wait_ms" in p for p in found), found)

    def test_a_bad_resource_or_scope_is_reported(self):
        def wrong(t):
            self.row(t, "/keyflow.v1.Runs/ListRuns")["resource"] = "workflw"
            self.row(t, "/keyflow.v1.Runs/GetRun")["scope"] = "runs:everything"
        found = self.mutated(wrong)
        self.assertTrue(any("no field workflw" in p for p in found), found)
        self.assertTrue(any("runs:everything" in p for p in found), found)

    def test_a_read_that_grows_the_store_is_reported(self):
        found = self.mutated(lambda t: self.row(t, "/keyflow.v1.Runs/GetRun")
                             .update(disk="grows"))
        self.assertTrue(any("GetRun: disk GROWS" in p for p in found), found)
        found = self.mutated(lambda t: self.row(t, "/keyflow.v1.Runs/GetRun").pop("disk"))
        self.assertTrue(any("GetRun: disk None" in p for p in found), found)

    def test_a_resource_through_a_oneof_is_reported_unless_listed(self):
        found = self.mutated(lambda t: self.row(t, "/keyflow.v1.Functions/PushBatch")
                             .update(resource="rows_json"))
        self.assertTrue(any("PushBatch: resource rows_json runs through the oneof member "
                            "rows_json" in p for p in found), found)
        self.assertEqual(self.problems(self.tables), [])  # Serve's hello is listed

    def test_a_resource_through_a_nested_repeated_message_is_reported(self):
        found = self.mutated(lambda t: self.row(t, "/keyflow.v1.Functions/RegisterFunction")
                             .update(resource="descriptor.input_schema.fields.name"))
        self.assertTrue(any("repeated message descriptor.input_schema.fields" in p for p in found),
                        found)

    def test_a_route_to_an_unknown_or_unserved_rpc_is_reported(self):
        def wrong(t):
            t["routes"][0]["rpc"] = "/keyflow.v1.Coordinators/Nope"
            t["routes"][1]["rpc"] = "/grpc.health.v1.Health/Check"
        found = self.mutated(wrong)
        self.assertTrue(any("not in the RPC table" in p for p in found), found)
        self.assertTrue(any("does not serve" in p for p in found), found)

    def test_a_route_capturing_a_missing_field_is_reported(self):
        found = self.mutated(lambda t: t["routes"][0].update(pattern="/v1/x/{nope}"))
        self.assertTrue(any("no field nope" in p for p in found), found)


if __name__ == "__main__":
    unittest.main()
