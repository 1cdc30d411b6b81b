"""GET /openapi.json of the real keyflowd: an OpenAPI 3.1 document that a
real validator accepts (npm's @seriousme/openapi-schema-validator, every
$ref resolved), that describes every route of the gateway, and that holds
for the real server: one request is sent per documented operation, each
must reach its route, and every answer must validate (ajv, JSON Schema
2020-12) against the response schema the document gives for it.

Run (Debian's Python):
  KEYFLOW_BUILD_DIR=build PYENV_VERSION=system python3 -m unittest -v test_openapi
"""

import http.client
import json
import os
import shutil
import subprocess
import sys
import tempfile
import unittest
import urllib.parse
import uuid

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import harness  # noqa: E402

HANDLERS = os.path.join(harness.BUILD, "handlers")
NODE_DIR = os.path.join(os.path.dirname(os.path.abspath(__file__)), "node")
HAVE_NODE_TOOLS = shutil.which("node") is not None and os.path.isdir(
    os.path.join(NODE_DIR, "node_modules", "@seriousme", "openapi-schema-validator"))

# Every REST route of service/http/routes.c, as the document must show it.
ROUTES = {
    ("post", "/v1/workflows/{workflow}/keys/{key}/events"),
    ("get", "/v1/coordinators/{coordinator.kind}/{coordinator.workflow}/{coordinator.key}"),
    ("post", "/v1/coordinators/{coordinator.kind}/{coordinator.workflow}/{coordinator.key}:flush"),
    ("post", "/v1/coordinators/{coordinator.kind}/{coordinator.workflow}/{coordinator.key}:cancel"),
    ("post", "/v1/runs:poll"), ("post", "/v1/runs/{run_id}:heartbeat"),
    ("post", "/v1/runs/{run_id}:complete"), ("get", "/v1/runs/{run_id}"), ("get", "/v1/runs"),
    ("post", "/v1/functions"), ("get", "/v1/functions"), ("get", "/v1/functions/{function_id}"),
    ("post", "/v1/functions/{function_id}/batches"), ("get", "/v1/functions/{function_id}/output"),
    ("get", "/v1/functions/{function_id}/keys/{key}"),
    ("get", "/healthz"), ("get", "/readyz"), ("get", "/metrics"), ("get", "/openapi.json"),
}


def check_with_node(doc, samples=None):
    d = tempfile.mkdtemp(prefix="kf-openapi-")
    try:
        with open(os.path.join(d, "doc.json"), "w") as f:
            json.dump(doc, f)
        args = ["node", os.path.join(NODE_DIR, "openapi_check.js"), os.path.join(d, "doc.json")]
        if samples is not None:
            with open(os.path.join(d, "samples.json"), "w") as f:
                json.dump(samples, f)
            args.append(os.path.join(d, "samples.json"))
        p = subprocess.run(args, capture_output=True, text=True, timeout=120)
        return p.returncode, p.stdout, p.stderr
    finally:
        shutil.rmtree(d, ignore_errors=True)


class OpenApiTest(unittest.TestCase):
    @classmethod
    def setUpClass(cls):
        # Keys on (the Keys operations work only then), every request with
        # the bootstrap admin key.
        cls.server = harness.Keyflowd(args=["--plugin-dir", HANDLERS, "--auth"]).start()
        with open(os.path.join(cls.server.data_dir, "db", "bootstrap-admin.key")) as f:
            cls.key = f.read().strip()

    @classmethod
    def tearDownClass(cls):
        cls.server.stop()
        cls.server.cleanup()

    def request(self, method, path, body=None):
        conn = http.client.HTTPConnection("127.0.0.1", self.server.http_port, timeout=30)
        try:
            data = json.dumps(body).encode() if body is not None else None
            headers = {"Authorization": "Bearer " + self.key}
            if data:
                headers["Content-Type"] = "application/json"
            conn.request(method.upper(), path, body=data, headers=headers)
            r = conn.getresponse()
            text = r.read().decode()
            return r.status, r.getheader("Content-Type"), text, r.getheader("Allow")
        finally:
            conn.close()

    def document(self):
        status, ctype, text, _ = self.request("get", "/openapi.json")
        self.assertEqual((status, ctype), (200, "application/json"))
        return json.loads(text)

    def test_document_describes_the_gateway(self):
        doc = self.document()
        self.assertEqual(doc["openapi"], "3.1.0")
        documented = {(m, p) for p, item in doc["paths"].items() for m in item}
        self.assertLessEqual(ROUTES, documented, ROUTES - documented)
        # Every RPC the gateway serves also under its generic route, nothing else.
        generic = {p for m, p in documented if p.startswith("/v1/keyflow.v1.")}
        self.assertIn("/v1/keyflow.v1.Coordinators/SendEvent", generic)
        self.assertIn("/v1/keyflow.v1.Runs/PollRuns", generic)
        self.assertNotIn("/v1/keyflow.v1.Functions/TailOutput", generic, "streams are gRPC only")
        ids = [op["operationId"] for item in doc["paths"].values() for op in item.values()]
        self.assertEqual(len(ids), len(set(ids)), "operationIds are unique")
        # Path parameters match the templates; query parameters carry aliases
        # and defaults from the route table.
        for path, item in doc["paths"].items():
            for method, op in item.items():
                names = {p["name"] for p in op.get("parameters", []) if p["in"] == "path"}
                wanted = {s[:s.index("}")] for s in path.split("{")[1:]}
                self.assertEqual(names, wanted, (method, path))
        output = {p["name"]: p for p in
                  doc["paths"]["/v1/functions/{function_id}/output"]["get"]["parameters"]}
        self.assertIn("after", output, "the after=after_seq alias")
        self.assertIn("wait", output)
        self.assertEqual(output["format"]["schema"]["default"], "ROW_FORMAT_JSON")
        # Schemas follow the JSON mapping, and the protos' comments describe them.
        run = doc["components"]["schemas"]["keyflow.v1.Run"]
        self.assertFalse(run["additionalProperties"])
        self.assertEqual(run["properties"]["createdMs"]["type"], ["string", "integer"])
        # Enums: every spelling json_map takes (the full name, the short one,
        # the number in a body), and only those.
        status_names, status_numbers = run["properties"]["status"]["anyOf"]
        self.assertLessEqual({"RUN_STATUS_PENDING", "pending", "RUN_STATUS_WINDOW_OPEN",
                              "window_open"}, set(status_names["enum"]))
        self.assertNotIn("PENDING", status_names["enum"])
        self.assertIn(1, status_numbers["enum"])
        listed = {p["name"]: p for p in doc["paths"]["/v1/runs"]["get"]["parameters"]}
        self.assertIn("completed", listed["status"]["schema"]["enum"])
        self.assertNotIn("window_open", listed["status"]["schema"]["enum"], "ListRuns refuses it")
        self.assertNotIn("RUN_STATUS_WINDOW_OPEN", listed["status"]["schema"]["enum"])
        self.assertEqual(listed["status"]["schema"]["type"], "string", "no numbers in a query")
        self.assertIn("pageSize", listed)
        self.assertNotIn("page_size", listed)
        kind = doc["paths"]["/v1/coordinators/{coordinator.kind}/{coordinator.workflow}/"
                            "{coordinator.key}"]["get"]["parameters"][0]
        self.assertEqual(sorted(kind["schema"]["enum"]),
                         ["RULE_KIND_BATCH", "RULE_KIND_DEBOUNCE", "batch", "debounce"])
        # Bodies take the proto field names too (proto3 JSON), and a _json
        # field's text form; not two spellings of one field at once.
        rule = doc["components"]["schemas"]["keyflow.v1.Rule"]
        self.assertIn("max_events", rule["properties"])
        self.assertIn("maxEvents", rule["properties"])
        self.assertIs(rule["properties"]["max_events"].get("writeOnly"), True, "answers use maxEvents")
        self.assertNotIn("writeOnly", rule["properties"]["maxEvents"])
        self.assertIn("inputJson", doc["components"]["schemas"]["keyflow.v1.Event"]["properties"])
        self.assertIn("input", run["properties"], "input_json is the embedded value 'input'")
        self.assertEqual(run["properties"]["inputJson"]["type"], "string", "its text form")
        described = [f for s in doc["components"]["schemas"].values()
                     for f in s.get("properties", {}).values() if f.get("description")]
        self.assertGreater(len(described), 20, "comments from the protos")
        self.assertEqual(doc["components"]["schemas"]["keyflow.v1.ListRunsRequest"]["properties"]
                         ["workflow"]["description"], "empty: every workflow")
        send = doc["paths"]["/v1/workflows/{workflow}/keys/{key}/events"]["post"]
        self.assertEqual(send["requestBody"]["content"]["application/json"]["schema"]["$ref"],
                         "#/components/schemas/keyflow.v1.Event")
        # HEAD works; another method is 405 with Allow.
        self.assertEqual(self.request("head", "/openapi.json")[0], 200)
        status, _, _, allow = self.request("post", "/openapi.json", {})
        self.assertEqual((status, allow), (405, "GET, HEAD"))

    @unittest.skipUnless(HAVE_NODE_TOOLS, "needs node and tests/e2e/node's packages (npm ci)")
    def test_a_real_validator_accepts_the_document(self):
        code, out, err = check_with_node(self.document())
        self.assertEqual(code, 0, out + err)
        self.assertTrue(json.loads(out)["valid"])

    @unittest.skipUnless(HAVE_NODE_TOOLS, "needs node and tests/e2e/node's packages (npm ci)")
    def test_one_request_per_documented_operation(self):
        doc = self.document()
        wf = "wf-" + uuid.uuid4().hex[:8]
        with open(os.path.join(HANDLERS, "running_sum.descriptor.json")) as f:
            descriptor = json.load(f)
        # What the operations act on: a run to read, a leased run, a key.
        self.request("post", "/v1/functions", descriptor)
        status, _, text, _ = self.request("post", "/v1/workflows/%s/keys/r/events" % wf,
                                          {"rule": {"kind": "batch", "maxEvents": 1}, "input": 1})
        self.assertEqual(status, 200, text)
        run_id = json.loads(text)["receipt"]["runId"]
        self.request("post", "/v1/workflows/%s-lease/keys/l/events" % wf,
                     {"rule": {"kind": "batch", "maxEvents": 1}, "input": 2})
        polled = json.loads(self.request("post", "/v1/runs:poll", {
            "workerId": "doc", "workflows": [wf + "-lease"], "leaseMs": 60000})[2])
        leased, lease = polled["runs"][0]["runId"], polled["runs"][0]["lease"]
        status, _, text, _ = self.request("post", "/v1/keys", {
            "name": "doc", "grants": [{"scope": "runs:read"}]})
        self.assertEqual(status, 200, text)
        key_id = json.loads(text)["key"]["keyId"]

        rows = [{"user": "ann", "ts": 1, "amount": 5}]
        # The README's spellings ("debounce", lowerCamelCase) and the other
        # ones proto3 JSON allows (the full enum name and its number, the
        # proto field name): each must be in the document and taken.
        event = {"rule": {"kind": "debounce", "windowMs": "60000"}, "input": {"n": 1}}
        coordinator = {"kind": "RULE_KIND_DEBOUNCE", "workflow": wf, "key": "k"}
        events = [{"workflow": wf, "key": "b1",
                   "event": {"rule": {"kind": 1, "window_ms": 60000}, "inputJson": "[1]"}}]
        path_values = {"workflow": wf, "key": "k", "coordinator.kind": "debounce",
                       "coordinator.workflow": wf, "coordinator.key": "k", "run_id": run_id,
                       "function_id": "running_sum", "producer_id": "doc-" + wf,
                       "sequence": "1", "key_id": key_id}
        bodies = {  # by operationId; the generic routes take the whole request
            "SendEvent": event,
            "SendEvents": events,
            "keyflow.v1.Coordinators.SendEvents": {"events": [{"workflow": wf, "key": "b2",
                                                              "event": event}]},
            "keyflow.v1.Coordinators.SendEvent": {"workflow": wf, "key": "k", "event": event},
            "keyflow.v1.Coordinators.DescribeCoordinator": {"coordinator": coordinator},
            "keyflow.v1.Coordinators.FlushWindow": {"coordinator": coordinator},
            "keyflow.v1.Coordinators.CancelWindow": {"coordinator": coordinator},
            "PollRuns": {"workerId": "doc", "workflows": [wf + "-none"]},
            "keyflow.v1.Runs.PollRuns": {"workerId": "doc", "workflows": [wf + "-none"]},
            "HeartbeatRun": {"lease": lease},
            "keyflow.v1.Runs.HeartbeatRun": {"runId": leased, "lease": lease},
            "CompleteRun": {"lease": lease, "result": {"done": True}},
            "keyflow.v1.Runs.CompleteRun": {"runId": leased, "lease": lease,
                                            "result": {"done": True}},  # a retry: same answer
            "keyflow.v1.Runs.GetRun": {"runId": run_id},
            "keyflow.v1.Runs.ListRuns": {"workflow": wf, "status": "completed"},
            "RegisterFunction": descriptor,
            "keyflow.v1.Functions.RegisterFunction": {"descriptor": descriptor},
            "keyflow.v1.Functions.GetFunction": {"functionId": "running_sum"},
            "PushBatch": {"producerId": "doc-" + wf, "sequence": "1", "rows": rows},
            "keyflow.v1.Functions.PushBatch": {"functionId": "running_sum",
                                               "producerId": "doc-" + wf, "sequence": "2",
                                               "rows": rows},
            "keyflow.v1.Functions.ReadOutput": {"functionId": "running_sum"},
            "keyflow.v1.Functions.GetKeyState": {"functionId": "running_sum", "key": "ann"},
            "CreateKey": {"name": "doc2", "grants": [{"scope": "runs:read"}]},
            "keyflow.v1.Keys.CreateKey": {"name": "doc3", "grants": [{"scope": "runs:read"}]},
            "keyflow.v1.Keys.RevokeKey": {"keyId": key_id},  # revoked already: an answer too
        }
        queries = {  # by operationId: the README's query spellings
            "ListRuns": {"workflow": wf, "status": "completed", "pageSize": "10"},
            "GetRun": {"waitMs": "0"},
            "ReadOutput": {"after": "0", "limit": "100", "wait": "0", "format": "json"},
            "ListFunctions": {"pageSize": "5"},
            "DeleteProducer": {"allowMissing": "true"},
            "DeleteFunction": {"allowMissing": "true"},
        }
        # The few that may answer an error (the state they act on is gone by
        # the time the generic twin runs); every other one must be a 200.
        may_fail = {"keyflow.v1.Keys.RevokeKey", "keyflow.v1.Runs.HeartbeatRun"}
        # Deletions go last, the deepest path first (a producer before its
        # function): what they delete is what the other operations act on.
        operations = sorted(((path, method, op) for path, item in doc["paths"].items()
                             for method, op in item.items()),
                            key=lambda o: (o[1] == "delete", -len(o[0]) if o[1] == "delete" else 0))
        samples, seen = [], 0
        for path, method, op in operations:
            seen += 1
            url = path
            values = dict(path_values)
            if op["operationId"] in ("HeartbeatRun", "CompleteRun"):
                values["run_id"] = leased
            for name, value in values.items():
                url = url.replace("{%s}" % name, urllib.parse.quote(value, safe=""))
            self.assertNotIn("{", url, "a path parameter without a value: " + path)
            query = queries.get(op["operationId"], {})
            if query:
                url += "?" + urllib.parse.urlencode(query)
            body = bodies.get(op["operationId"])
            example = body is not None or "requestBody" not in op
            if body is None and "requestBody" in op:
                # An operation this test has no example for (a new RPC):
                # the emptiest body its schema allows. It must still
                # reach its route, and its answer must validate.
                schema = op["requestBody"]["content"]["application/json"]["schema"]
                body = [] if schema.get("type") == "array" else {}
            status, ctype, text, _ = self.request(method, url, body)
            self.assertNotEqual(status, 405, (method, path, text))
            self.assertNotIn("no such route", text, (method, path))
            if example and op["operationId"] not in may_fail:
                self.assertEqual(status, 200, (method, url, body, text))
            sent = {"path": {n: v for n, v in values.items() if "{%s}" % n in path},
                    "query": query}
            if body is not None:
                sent["body"] = body
            if ctype == "application/json":
                samples.append({"path": path, "method": method, "status": status,
                                "body": json.loads(text), "request": sent})
            else:
                samples.append({"path": path, "method": method, "request": sent})
        self.assertEqual(seen, sum(len(item) for item in doc["paths"].values()))
        self.assertGreaterEqual(seen, 38)
        code, out, err = check_with_node(doc, samples)
        self.assertEqual(code, 0, out + err)
        result = json.loads(out)
        self.assertTrue(result["valid"])
        self.assertEqual(result["checked"], len([s for s in samples if "status" in s]),
                         "every JSON answer was validated")
        self.assertEqual(result["requestsChecked"], len(samples), "every request too")

    def test_enum_parameters_take_exactly_what_the_document_lists(self):
        """Every value a path or query parameter's enum lists is taken, and
        every other spelling of the proto enum's values (a refused value,
        another case, a number) is refused naming the parameter."""
        harness.stubs()
        from google.protobuf import descriptor_pool
        import keyflow.v1.coordinators_pb2  # noqa: F401  (the enums, into the pool)
        import keyflow.v1.functions_pb2  # noqa: F401
        import keyflow.v1.runs_pb2  # noqa: F401
        pool = descriptor_pool.Default()
        doc = self.document()
        with open(os.path.join(HANDLERS, "running_sum.descriptor.json")) as f:
            self.request("post", "/v1/functions", json.load(f))
        wf = "wf-" + uuid.uuid4().hex[:8]
        values = {"coordinator.workflow": wf, "coordinator.key": "k", "coordinator.kind": "batch",
                  "function_id": "running_sum", "workflow": wf, "key": "k"}
        checked = 0
        for path, item in doc["paths"].items():
            for method, op in item.items():
                if method == "delete":
                    continue
                for param in op.get("parameters", []):
                    listed = param["schema"].get("enum")
                    if listed is None:
                        continue
                    enum = pool.FindEnumTypeByName(param["schema"]["title"])
                    names = [v.name for v in enum.values]
                    prefix = os.path.commonprefix(names)
                    prefix = prefix[:prefix.rfind("_") + 1]
                    every = set(names) | {n[len(prefix):].lower() for n in names}
                    refused = (every - set(listed)) | {n[len(prefix):] for n in names} | {
                        n[len(prefix):].capitalize() for n in names} | {
                        str(v.number) for v in enum.values}
                    self.assertLessEqual(set(listed), every, (path, param["name"]))
                    for value, taken in [(v, True) for v in listed] + [(v, False) for v in refused]:
                        url = path
                        query = {}
                        for name, text in dict(values, **{param["name"]: value}).items():
                            if "{%s}" % name in url:
                                url = url.replace("{%s}" % name, urllib.parse.quote(text, safe=""))
                        if param["in"] == "query":
                            query[param["name"]] = value
                        if query:
                            url += "?" + urllib.parse.urlencode(query)
                        status, _, text, _ = self.request(method, url,
                                                          {} if method == "post" else None)
                        named = status == 400 and param["name"] in json.loads(text)["message"]
                        self.assertEqual(not named, taken, (method, url, status, text))
                        checked += 1
        self.assertGreater(checked, 40)

    def test_query_names_are_spelled_as_documented(self):
        """A query parameter goes by the name the document gives it: the
        route's alias, else the lowerCamelCase name; a route with a body
        takes no query at all."""
        for url, want in [("/v1/runs?page_size=1", "spelled pageSize"),
                          ("/v1/runs?pageSize=1&workflow=x", None),
                          ("/v1/functions/f/output?afterSeq=0", "spelled after"),
                          ("/v1/functions/f/output?after_seq=0", "spelled after"),
                          ("/v1/functions/f/output?waitMs=0", "spelled wait"),
                          ("/v1/runs/r@x?wait_ms=0", "spelled waitMs"),
                          ("/v1/runs?status=2", "status: expected one of"),
                          ("/v1/runs?status=Completed", "status: expected one of")]:
            with self.subTest(url=url):
                status, _, text, _ = self.request("get", url)
                if want is None:
                    self.assertEqual(status, 200, text)
                else:
                    self.assertEqual(status, 400, text)
                    self.assertIn(want, json.loads(text)["message"])
        for url, body in [("/v1/runs:poll?workerId=w", {"workerId": "w"}),
                          ("/v1/keyflow.v1.Runs/ListRuns?workflow=x", {})]:
            status, _, text, _ = self.request("post", url, body)
            self.assertEqual(status, 400, text)
            self.assertIn("takes no query parameters", json.loads(text)["message"])


if __name__ == "__main__":
    unittest.main()
