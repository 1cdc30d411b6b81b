"""The watchdog (docs/semantics.md, "Process functions"): a NATIVE handler
that does not return within its call_timeout_ms ends keyflowd with an error
naming the function, before its step commits. The batch is not
acknowledged, nothing of it is applied, and keyflowd restarted (as its
supervisor would) serves the function again from the last durable state.

The handler is tests/unit/handlers/looping.c: a row with mode "loop" spins
forever.
"""

import hashlib
import os
import signal
import sys
import unittest

import grpc  # before harness.stubs(): see test_functions_grpc.py

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import harness  # noqa: E402

PLUGINS = os.path.join(harness.BUILD, "tests", "plugins")
LOOPING = os.path.join(PLUGINS, "looping.so")
RPC_TIMEOUT_S = 30


def field(pb, name, kind, nullable=False):
    return pb.Field(name=name, type=getattr(pb, "FIELD_TYPE_" + kind), nullable=nullable)


class WatchdogTest(unittest.TestCase):
    def setUp(self):
        if not os.path.exists(harness.KEYFLOWD) or not os.path.exists(LOOPING):
            self.skipTest("build keyflowd and the test plugins first")
        harness.stubs()
        from keyflow.v1 import functions_pb2, functions_pb2_grpc
        self.pb, self.pg = functions_pb2, functions_pb2_grpc
        self.server = harness.Keyflowd(args=["--plugin-dir", PLUGINS]).start()
        self.connect()

    def tearDown(self):
        self.channel.close()
        self.server.cleanup()

    def connect(self):
        self.channel = grpc.insecure_channel(self.server.grpc_target)
        self.stub = self.pg.FunctionsStub(self.channel)

    def descriptor(self):
        pb = self.pb
        with open(LOOPING, "rb") as f:
            digest = hashlib.sha256(f.read()).hexdigest()
        return pb.FunctionDescriptor(
            version=1, function_id="looper", pipeline_state_id="looper.v1",
            runtime=pb.RUNTIME_NATIVE, implementation_digest=digest,
            input_schema=pb.Schema(fields=[field(pb, "k", "UTF8"), field(pb, "ts", "TIMESTAMP_US"),
                                           field(pb, "mode", "UTF8"),
                                           field(pb, "amount", "INT64", nullable=True)]),
            output_schema=pb.Schema(fields=[field(pb, "key", "UTF8"),
                                            field(pb, "ts", "TIMESTAMP_US"),
                                            field(pb, "n", "INT64")]),
            key_columns=["k"], event_time_column="ts", output_event_time_column="ts",
            value_state_name="n", limits=pb.FunctionLimits(call_timeout_ms=300))

    def push(self, seq, rows):
        return self.stub.PushBatch(self.pb.PushBatchRequest(
            function_id="looper", producer_id="p", sequence=seq,
            rows_json=str(rows).replace("'", '"')), timeout=RPC_TIMEOUT_S)

    def test_a_looping_native_handler_ends_keyflowd_and_its_batch_is_not_acknowledged(self):
        info = self.stub.RegisterFunction(self.pb.RegisterFunctionRequest(
            descriptor=self.descriptor()), timeout=RPC_TIMEOUT_S).function
        self.assertEqual(info.descriptor.limits.call_timeout_ms, 300)
        ack = self.push(1, [{"k": "a", "ts": 1, "mode": "ok", "amount": 5}])
        self.assertEqual(ack.last_output_seq, 1)

        with self.assertRaises(grpc.RpcError) as cm:
            self.push(2, [{"k": "a", "ts": 2, "mode": "ok", "amount": 6},
                          {"k": "b", "ts": 2, "mode": "loop", "amount": 0}])
        self.assertEqual(cm.exception.code(), grpc.StatusCode.UNAVAILABLE, cm.exception.details())
        # keyflowd ended itself: abort() (SIGABRT), the way the watchdog does.
        code = self.server.proc.wait(timeout=30)
        self.assertEqual(code, -signal.SIGABRT, self.server.read_log())
        log = self.server.read_log()
        self.assertIn("the native handler of function looper", log)
        self.assertIn("limits.call_timeout_ms", log)
        self.assertIn("bound_ms=300", log)
        self.server.proc = None
        self.server.log.close()

        # The supervisor's restart: nothing of batch 2 was applied.
        self.channel.close()
        self.server.start()
        self.connect()
        got = self.stub.GetFunction(self.pb.GetFunctionRequest(function_id="looper"),
                                    timeout=RPC_TIMEOUT_S)
        self.assertTrue(got.available)
        self.assertEqual(got.output_seq, 1)
        state = self.stub.GetKeyState(self.pb.GetKeyStateRequest(function_id="looper", key="a"),
                                      timeout=RPC_TIMEOUT_S)
        self.assertEqual(state.value, 5)
        # Sequence 2 was never acknowledged: it can carry good rows now.
        ack = self.push(2, [{"k": "a", "ts": 3, "mode": "ok", "amount": 7}])
        self.assertFalse(ack.duplicate)
        self.assertEqual(ack.last_output_seq, 2)


if __name__ == "__main__":
    unittest.main()
