"""gRPC server reflection of the real keyflowd (grpc.reflection.v1 and
v1alpha), checked with clients that know nothing of keyflow's .proto files:

  - a hand-rolled Python client: grpcio plus protobuf's descriptor_pb2, with
    the reflection messages built in this file from the protocol's field
    numbers (not from api/), and every keyflow type it then uses built from
    the FileDescriptorProtos the server returned;
  - npm's grpc-js-reflection-client on @grpc/grpc-js (tests/e2e/node), the
    kind of client grpcurl-like tools are.

Both list the services and call SendEvent using only what reflection said.

Run (Debian's Python):
  KEYFLOW_BUILD_DIR=build PYENV_VERSION=system python3 -m unittest -v test_reflection
"""

import json
import os
import shutil
import subprocess
import sys
import unittest
import uuid

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import harness  # noqa: E402

import grpc  # noqa: E402
from google.protobuf import descriptor_pb2, descriptor_pool, message_factory  # noqa: E402

NODE_DIR = os.path.join(os.path.dirname(os.path.abspath(__file__)), "node")
SERVICES = {
    "keyflow.v1.Coordinators", "keyflow.v1.Runs", "keyflow.v1.Functions", "keyflow.v1.Keys",
    "keyflow.v1.Workers", "keyflow.v1.Partitions",
    "grpc.health.v1.Health", "grpc.reflection.v1.ServerReflection",
    "grpc.reflection.v1alpha.ServerReflection",
}

F = descriptor_pb2.FieldDescriptorProto


def reflection_messages(package):
    """ServerReflectionRequest and ServerReflectionResponse classes for
    `package`, declared here from the protocol's field numbers."""
    fd = descriptor_pb2.FileDescriptorProto(name="test_reflection_%s.proto" % package,
                                            package=package, syntax="proto3")

    def message(name, *fields, oneofs=()):
        m = fd.message_type.add(name=name)
        for o in oneofs:
            m.oneof_decl.add(name=o)
        for number, fname, ftype, label, type_name, oneof in fields:
            f = m.field.add(name=fname, number=number, type=ftype, label=label)
            if type_name:
                f.type_name = ".%s.%s" % (package, type_name)
            if oneof is not None:
                f.oneof_index = oneof
        return m

    opt, rep = F.LABEL_OPTIONAL, F.LABEL_REPEATED
    message("ExtensionRequest", (1, "containing_type", F.TYPE_STRING, opt, None, None),
            (2, "extension_number", F.TYPE_INT32, opt, None, None))
    message("ServerReflectionRequest",
            (1, "host", F.TYPE_STRING, opt, None, None),
            (3, "file_by_filename", F.TYPE_STRING, opt, None, 0),
            (4, "file_containing_symbol", F.TYPE_STRING, opt, None, 0),
            (5, "file_containing_extension", F.TYPE_MESSAGE, opt, "ExtensionRequest", 0),
            (6, "all_extension_numbers_of_type", F.TYPE_STRING, opt, None, 0),
            (7, "list_services", F.TYPE_STRING, opt, None, 0),
            oneofs=["message_request"])
    message("FileDescriptorResponse", (1, "file_descriptor_proto", F.TYPE_BYTES, rep, None, None))
    message("ExtensionNumberResponse", (1, "base_type_name", F.TYPE_STRING, opt, None, None),
            (2, "extension_number", F.TYPE_INT32, rep, None, None))
    message("ServiceResponse", (1, "name", F.TYPE_STRING, opt, None, None))
    message("ListServiceResponse", (1, "service", F.TYPE_MESSAGE, rep, "ServiceResponse", None))
    message("ErrorResponse", (1, "error_code", F.TYPE_INT32, opt, None, None),
            (2, "error_message", F.TYPE_STRING, opt, None, None))
    message("ServerReflectionResponse",
            (1, "valid_host", F.TYPE_STRING, opt, None, None),
            (2, "original_request", F.TYPE_MESSAGE, opt, "ServerReflectionRequest", None),
            (4, "file_descriptor_response", F.TYPE_MESSAGE, opt, "FileDescriptorResponse", 0),
            (5, "all_extension_numbers_response", F.TYPE_MESSAGE, opt, "ExtensionNumberResponse", 0),
            (6, "list_services_response", F.TYPE_MESSAGE, opt, "ListServiceResponse", 0),
            (7, "error_response", F.TYPE_MESSAGE, opt, "ErrorResponse", 0),
            oneofs=["message_response"])
    pool = descriptor_pool.DescriptorPool()
    pool.Add(fd)
    factory = message_factory.MessageFactory(pool)
    get = lambda name: factory.GetPrototype(pool.FindMessageTypeByName("%s.%s" % (package, name)))
    return get("ServerReflectionRequest"), get("ServerReflectionResponse")


class ReflectionTest(unittest.TestCase):
    @classmethod
    def setUpClass(cls):
        cls.server = harness.Keyflowd().start()
        cls.channel = grpc.insecure_channel(cls.server.grpc_target)

    @classmethod
    def tearDownClass(cls):
        cls.channel.close()
        cls.server.stop()
        cls.server.cleanup()

    def ask(self, package, *requests):
        """Sends the requests on one ServerReflectionInfo stream; returns the
        responses, in order."""
        Request, Response = reflection_messages(package)
        call = self.channel.stream_stream(
            "/%s.ServerReflection/ServerReflectionInfo" % package,
            request_serializer=lambda m: m.SerializeToString(),
            response_deserializer=Response.FromString)
        return list(call(iter([Request(**r) for r in requests]), timeout=10))

    def test_list_services_v1_and_v1alpha(self):
        for package in ("grpc.reflection.v1", "grpc.reflection.v1alpha"):
            with self.subTest(package):
                (resp,) = self.ask(package, {"host": "h", "list_services": ""})
                self.assertEqual(resp.WhichOneof("message_response"), "list_services_response")
                self.assertEqual({s.name for s in resp.list_services_response.service}, SERVICES)
                self.assertEqual(resp.valid_host, "h")
                self.assertEqual(resp.original_request.WhichOneof("message_request"),
                                 "list_services")

    def load(self, file_protos):
        """A descriptor pool holding what the server sent (dependencies
        first, as a client must add them)."""
        pending = {}
        for raw in file_protos:
            fd = descriptor_pb2.FileDescriptorProto.FromString(raw)
            pending[fd.name] = fd
        pool = descriptor_pool.DescriptorPool()
        added = set()
        while pending:
            ready = [n for n, fd in pending.items() if set(fd.dependency) <= added]
            self.assertTrue(ready, "a dependency was not sent: %s" % sorted(pending))
            for n in ready:
                pool.Add(pending.pop(n))
                added.add(n)
        return pool, added

    def test_send_event_using_only_what_reflection_returned(self):
        (resp,) = self.ask("grpc.reflection.v1",
                           {"file_containing_symbol": "keyflow.v1.Coordinators.SendEvent"})
        self.assertEqual(resp.WhichOneof("message_response"), "file_descriptor_response")
        protos = resp.file_descriptor_response.file_descriptor_proto
        pool, files = self.load(protos)
        self.assertEqual(descriptor_pb2.FileDescriptorProto.FromString(protos[0]).name,
                         "keyflow/v1/coordinators.proto", "the defining file comes first")
        method = pool.FindServiceByName("keyflow.v1.Coordinators").FindMethodByName("SendEvent")
        factory = message_factory.MessageFactory(pool)
        Request = factory.GetPrototype(method.input_type)
        Response = factory.GetPrototype(method.output_type)
        req = Request(workflow="wf-" + uuid.uuid4().hex[:8], key="k-refl")
        req.event.id = "e-1"
        kind = pool.FindEnumTypeByName("keyflow.v1.RuleKind").values_by_name["RULE_KIND_BATCH"]
        req.event.rule.kind = kind.number
        req.event.rule.max_events = 1
        req.event.input_json = '{"via": "python reflection"}'
        send = self.channel.unary_unary("/keyflow.v1.Coordinators/SendEvent",
                                        request_serializer=lambda m: m.SerializeToString(),
                                        response_deserializer=Response.FromString)
        answer = send(req, timeout=10)
        self.assertTrue(answer.receipt.run_id.startswith("k-refl@"), answer)
        self.assertTrue(answer.run_started)
        # The run exists, read with a type reflection gave too.
        (resp,) = self.ask("grpc.reflection.v1alpha", {"file_containing_symbol": "keyflow.v1.Runs"})
        runs_pool, _ = self.load(resp.file_descriptor_response.file_descriptor_proto)
        get = runs_pool.FindServiceByName("keyflow.v1.Runs").FindMethodByName("GetRun")
        runs_factory = message_factory.MessageFactory(runs_pool)
        GetRun = runs_factory.GetPrototype(get.input_type)
        Run = runs_factory.GetPrototype(get.output_type)
        run = self.channel.unary_unary("/keyflow.v1.Runs/GetRun",
                                       request_serializer=lambda m: m.SerializeToString(),
                                       response_deserializer=Run.FromString)(
            GetRun(run_id=answer.receipt.run_id), timeout=10)
        self.assertEqual(json.loads(run.input_json), [{"via": "python reflection"}])

    def test_symbols_files_errors_and_many_requests_on_one_stream(self):
        answers = self.ask(
            "grpc.reflection.v1",
            {"file_by_filename": "keyflow/v1/runs.proto"},
            {"file_containing_symbol": "keyflow.v1.Run"},                 # a message
            {"file_containing_symbol": ".keyflow.v1.RunStatus"},          # an enum, dotted
            {"file_containing_symbol": "grpc.health.v1.HealthCheckResponse.ServingStatus"},
            {"file_containing_symbol": "grpc.reflection.v1alpha.ServerReflection"},
            {"file_containing_symbol": "keyflow.v1.Nope"},
            {"file_by_filename": "keyflow/v1/nope.proto"},
            {"all_extension_numbers_of_type": "keyflow.v1.Run"},
            {"all_extension_numbers_of_type": "keyflow.v1.Runs"},         # a service
            {"file_containing_extension": {"containing_type": "keyflow.v1.Run",
                                           "extension_number": 100}},
            {"host": "only-a-host"},
        )
        self.assertEqual(len(answers), 11, "one answer per request, in order")
        names = lambda a: [descriptor_pb2.FileDescriptorProto.FromString(b).name
                           for b in a.file_descriptor_response.file_descriptor_proto]
        self.assertEqual(names(answers[0])[0], "keyflow/v1/runs.proto")
        self.assertEqual(names(answers[1])[0], "keyflow/v1/runs.proto")
        self.assertEqual(names(answers[2])[0], "keyflow/v1/runs.proto")
        self.assertEqual(names(answers[3]), ["grpc/health/v1/health.proto"])
        self.assertEqual(names(answers[4]), ["grpc/reflection/v1alpha/reflection.proto"])
        for i, fragment in ((5, "keyflow.v1.Nope"), (6, "keyflow/v1/nope.proto"),
                            (8, "keyflow.v1.Runs"), (9, "no extensions")):
            self.assertEqual(answers[i].WhichOneof("message_response"), "error_response", i)
            self.assertEqual(answers[i].error_response.error_code, 5)  # NOT_FOUND
            self.assertIn(fragment, answers[i].error_response.error_message)
        self.assertEqual(answers[7].all_extension_numbers_response.base_type_name,
                         "keyflow.v1.Run")
        self.assertEqual(list(answers[7].all_extension_numbers_response.extension_number), [])
        self.assertEqual(answers[10].error_response.error_code, 3)  # INVALID_ARGUMENT
        # Every file a response names can be loaded with its dependencies.
        for a in answers[:5]:
            self.load(a.file_descriptor_response.file_descriptor_proto)
        # Comments travel too (descriptor set built with source info).
        fd = descriptor_pb2.FileDescriptorProto.FromString(
            answers[0].file_descriptor_response.file_descriptor_proto[0])
        self.assertTrue(any(loc.leading_comments.strip() for loc in fd.source_code_info.location))

    def test_every_name_a_file_defines_resolves_to_that_file(self):
        """As reference servers (a descriptor pool) answer: messages, nested
        ones, fields and oneofs (pkg.Message.field), enums and their values
        (named beside the enum: pkg.RUN_STATUS_PENDING), services, methods."""
        services = [s.name for s in self.ask("grpc.reflection.v1", {"list_services": ""})[0]
                    .list_services_response.service]
        files = {}
        for service in services:
            (resp,) = self.ask("grpc.reflection.v1", {"file_containing_symbol": service})
            for raw in resp.file_descriptor_response.file_descriptor_proto:
                fd = descriptor_pb2.FileDescriptorProto.FromString(raw)
                files[fd.name] = fd
        wanted = []  # (symbol, the file defining it)

        def enum(scope, e, file):
            wanted.append((scope + e.name, file))
            wanted.extend((scope + v.name, file) for v in e.value)

        def message(scope, m, file):
            name = scope + m.name
            wanted.append((name, file))
            wanted.extend((name + "." + f.name, file) for f in m.field)
            wanted.extend((name + "." + o.name, file) for o in m.oneof_decl)
            for e in m.enum_type:
                enum(name + ".", e, file)
            for nested in m.nested_type:
                message(name + ".", nested, file)

        for fd in files.values():
            scope = fd.package + "." if fd.package else ""
            for m in fd.message_type:
                message(scope, m, fd.name)
            for e in fd.enum_type:
                enum(scope, e, fd.name)
            for svc in fd.service:
                wanted.append((scope + svc.name, fd.name))
                wanted.extend((scope + svc.name + "." + m.name, fd.name) for m in svc.method)
        self.assertIn(("keyflow.v1.Run.status", "keyflow/v1/runs.proto"), wanted)
        self.assertIn(("keyflow.v1.RUN_STATUS_PENDING", "keyflow/v1/runs.proto"), wanted)
        self.assertGreater(len(wanted), 300)
        for package in ("grpc.reflection.v1", "grpc.reflection.v1alpha"):
            answers = self.ask(package, *[{"file_containing_symbol": s} for s, _ in wanted])
            got = [(s, a.error_response.error_message if a.HasField("error_response") else
                    descriptor_pb2.FileDescriptorProto.FromString(
                        a.file_descriptor_response.file_descriptor_proto[0]).name)
                   for (s, _), a in zip(wanted, answers)]
            self.assertEqual([g for g, w in zip(got, wanted) if g != w], [], package)

    def test_strings_with_a_nul_byte_are_echoed_whole_and_name_nothing(self):
        answers = self.ask("grpc.reflection.v1",
                           {"host": "h\x00x", "list_services": ""},
                           {"host": "h", "file_containing_symbol": "keyflow.v1.Run\x00x"},
                           {"file_by_filename": "keyflow/v1/runs.proto\x00"})
        self.assertEqual(answers[0].valid_host, "h\x00x")
        self.assertEqual(answers[0].original_request.host, "h\x00x")
        self.assertTrue(answers[0].list_services_response.service)
        self.assertEqual(answers[1].valid_host, "h")
        self.assertEqual(answers[1].original_request.file_containing_symbol, "keyflow.v1.Run\x00x")
        for a in answers[1:]:
            self.assertEqual(a.error_response.error_code, 5, a)  # NOT_FOUND
            self.assertIn("NUL", a.error_response.error_message)

    def test_a_stream_with_no_request_ends_ok_and_garbage_ends_it_invalid(self):
        Request, Response = reflection_messages("grpc.reflection.v1")
        raw = self.channel.stream_stream("/grpc.reflection.v1.ServerReflection/ServerReflectionInfo",
                                         request_serializer=lambda b: b,
                                         response_deserializer=Response.FromString)
        self.assertEqual(list(raw(iter([]), timeout=10)), [])
        with self.assertRaises(grpc.RpcError) as e:
            list(raw(iter([b"\xff\xff\xff"]), timeout=10))
        self.assertEqual(e.exception.code(), grpc.StatusCode.INVALID_ARGUMENT)
        # The server is still fine.
        (resp,) = self.ask("grpc.reflection.v1", {"list_services": ""})
        self.assertTrue(resp.list_services_response.service)

    @unittest.skipUnless(shutil.which("node") and
                         os.path.isdir(os.path.join(NODE_DIR, "node_modules",
                                                    "grpc-js-reflection-client")),
                         "needs node and tests/e2e/node's packages (npm ci, dev.sh does it)")
    def test_npm_reflection_client_lists_services_and_calls_send_event(self):
        for version in ("v1", "v1alpha"):
            with self.subTest(version):
                key = "node-" + version
                p = subprocess.run(["node", os.path.join(NODE_DIR, "reflection_client.js"),
                                    self.server.grpc_target, version, "wf-node", key],
                                   capture_output=True, text=True, timeout=60)
                self.assertEqual(p.returncode, 0, p.stderr)
                out = json.loads(p.stdout)
                self.assertEqual(set(out["services"]), SERVICES)
                self.assertLessEqual({"SendEvent", "DescribeCoordinator", "FlushWindow",
                                      "CancelWindow"}, set(out["methods"]))
                self.assertTrue(out["receipt"]["run_id"].startswith(key + "@"), out)


if __name__ == "__main__":
    unittest.main()
