"""Retiring what process functions accumulate, on the real keyflowd over gRPC
and HTTP: output retention and TrimOutput (docs/semantics.md, "Output
retention"), DeleteFunction (with batches, reads and a remote worker in
flight), DeleteProducer and the idle expiry of producers, each checked
again after SIGKILL and a restart.

Nothing sleeps for timing: conditions are waited on with deadlines.
"""

import json
import os
import subprocess
import sys
import time
import unittest

import grpc  # noqa: E402  (before harness.stubs(): see test_functions_grpc.py)

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import harness  # noqa: E402
import test_functions_grpc as tf  # noqa: E402
import test_remote_workers as rw  # noqa: E402

TIMEOUT_S = 30
WAIT_S = 30


def rows(user, first_ts, n):
    return [{"user": user, "ts": first_ts + i, "amount": i + 1} for i in range(n)]


class RetireTest(unittest.TestCase):

    @classmethod
    def setUpClass(cls):
        tf.require_build(cls)
        tf.load_stubs()
        rw.load_stubs()
        cls.pb, cls.pg = tf.pb, tf.pg
        # One partition: these tests model a function's output as one
        # sequence over all keys (harness.ONE_PARTITION says why).
        cls.server = harness.Keyflowd(args=harness.ONE_PARTITION + ["--plugin-dir", tf.HANDLERS]).start()
        cls.connect()

    @classmethod
    def connect(cls):
        cls.channel = grpc.insecure_channel(cls.server.grpc_target)
        cls.stub = cls.pg.FunctionsStub(cls.channel)

    @classmethod
    def tearDownClass(cls):
        cls.channel.close()
        cls.server.cleanup()

    def restart_after_kill(self):
        self.channel.close()
        self.server.kill()
        self.server.start()
        type(self).connect()

    def register(self, descriptor):
        req = tf.json_format.ParseDict({"descriptor": descriptor},
                                       self.pb.RegisterFunctionRequest())
        return self.stub.RegisterFunction(req, timeout=TIMEOUT_S).function

    def push(self, fid, producer, seq, batch_rows):
        return self.stub.PushBatch(self.pb.PushBatchRequest(
            function_id=fid, producer_id=producer, sequence=seq,
            rows_json=json.dumps(batch_rows)), timeout=TIMEOUT_S)

    def info(self, fid):
        return self.stub.GetFunction(self.pb.GetFunctionRequest(function_id=fid),
                                     timeout=TIMEOUT_S)

    def read(self, fid, after):
        return self.stub.ReadOutput(self.pb.ReadOutputRequest(
            function_id=fid, after_seq=after, limit=1000,
            format=self.pb.ROW_FORMAT_JSON), timeout=TIMEOUT_S)

    def code_of(self, call):
        with self.assertRaises(grpc.RpcError) as cm:
            call()
        return cm.exception

    def wait_for(self, what, cond):
        deadline = time.time() + WAIT_S
        while not cond():
            if time.time() > deadline:
                self.fail("timed out waiting for " + what)
            time.sleep(0.05)

    # --- output retention -------------------------------------------------------
    def test_trim_output_over_grpc_and_http_survives_sigkill(self):
        fid = self.register(tf.rs_descriptor()).descriptor.function_id
        for seq in range(1, 6):
            self.push(fid, "p", seq, rows("ann", seq * 100, 4))  # rows 1..20
        info = self.info(fid)
        self.assertEqual((info.first_retained_seq, info.retained_rows), (1, 20))
        self.assertGreater(info.retained_bytes, 0)
        self.assertEqual(info.output_retention.max_age_ms, 7 * 24 * 3600 * 1000)

        resp = self.stub.TrimOutput(self.pb.TrimOutputRequest(function_id=fid, before_seq=9),
                                    timeout=TIMEOUT_S)
        self.assertEqual((resp.first_retained_seq, resp.output_seq), (9, 20))
        err = self.code_of(lambda: self.read(fid, 0))
        self.assertEqual(err.code(), grpc.StatusCode.OUT_OF_RANGE)
        self.assertIn("first retained sequence is 9", err.details())
        page = self.read(fid, 8)
        self.assertEqual((page.first_seq, page.last_seq, page.first_retained_seq), (9, 20, 9))

        # The same over HTTP: the route, the range error, the retained range.
        status, body = self.server.http("POST", "/v1/functions/%s/output:trim" % fid,
                                        {"beforeSeq": "13"})
        self.assertEqual(status, 200, body)
        self.assertEqual(body["firstRetainedSeq"], "13")
        cli = subprocess.run([harness.CLI, "--addr", self.server.grpc_target, "--output", "json",
                              "functions", "trim", fid, "--before", "10"],
                             capture_output=True, text=True, timeout=TIMEOUT_S)
        self.assertEqual(cli.returncode, 0, cli.stderr)
        self.assertEqual(json.loads(cli.stdout)["firstRetainedSeq"], "13", "never backwards")
        status, body = self.server.http("GET", "/v1/functions/%s/output?after=11" % fid)
        self.assertEqual(status, 400, body)
        self.assertEqual(body["status"], "OUT_OF_RANGE")
        self.assertIn("first retained sequence is 13", body["message"])
        status, body = self.server.http("GET", "/v1/functions/%s/output?after=12" % fid)
        self.assertEqual(status, 200, body)
        self.assertEqual([r["_seq"] for r in body["rows"]], [str(s) for s in range(13, 21)])
        status, body = self.server.http("GET", "/v1/functions/%s" % fid)
        self.assertEqual((body["firstRetainedSeq"], body["retainedRows"]), ("13", "8"))
        status, body = self.server.http("POST", "/v1/functions/%s/output:trim" % fid,
                                        {"beforeSeq": "22"})
        self.assertEqual((status, body["status"]), (400, "OUT_OF_RANGE"), body)
        self.assertIn("before_seq", body["message"])

        # A tail that starts below the retained range ends with the same error.
        tail = self.stub.TailOutput(self.pb.TailOutputRequest(function_id=fid, after_seq=3),
                                    timeout=TIMEOUT_S)
        with self.assertRaises(grpc.RpcError) as cm:
            next(iter(tail))
        self.assertEqual(cm.exception.code(), grpc.StatusCode.OUT_OF_RANGE)

        # Durable and idempotent across a crash; the rows go from disk too.
        self.restart_after_kill()
        self.assertEqual(self.info(fid).first_retained_seq, 13)
        self.assertEqual(self.code_of(lambda: self.read(fid, 5)).code(),
                         grpc.StatusCode.OUT_OF_RANGE)
        resp = self.stub.TrimOutput(self.pb.TrimOutputRequest(function_id=fid, before_seq=13),
                                    timeout=TIMEOUT_S)
        self.assertEqual(resp.first_retained_seq, 13)
        bytes_before = self.info(fid).retained_bytes
        self.stub.TrimOutput(self.pb.TrimOutputRequest(function_id=fid, before_seq=21),
                             timeout=TIMEOUT_S)
        self.wait_for("the sweep to delete the trimmed chunks",
                      lambda: self.info(fid).retained_bytes == 0)
        self.assertGreater(bytes_before, 0)
        self.assertEqual(self.read(fid, 20).high_water_seq, 20)

    def test_a_row_bound_in_the_descriptor_keeps_the_newest_rows(self):
        d = tf.rs_descriptor()
        d["outputRetention"] = {"maxRows": "6"}
        info = self.register(d)
        self.assertEqual(info.output_retention.max_rows, 6)
        fid = info.descriptor.function_id
        for seq in range(1, 5):
            self.push(fid, "p", seq, rows("bo", seq * 100, 3))  # rows 1..12
        self.wait_for("the row bound", lambda: self.info(fid).first_retained_seq == 7)
        self.assertEqual(self.read(fid, 6).first_seq, 7)
        self.restart_after_kill()
        self.assertEqual(self.info(fid).first_retained_seq, 7)
        status, body = self.server.http("GET", "/v1/functions/%s/output?after=0" % fid)
        self.assertEqual(status, 400, body)

    # --- DeleteFunction --------------------------------------------------------
    def test_delete_function_over_grpc_and_http_frees_its_id_across_sigkill(self):
        d = tf.rs_descriptor()
        fid = self.register(d).descriptor.function_id
        self.push(fid, "p", 1, rows("ann", 100, 3))
        out = self.stub.DeleteFunction(self.pb.DeleteFunctionRequest(function_id=fid),
                                       timeout=TIMEOUT_S)
        self.assertEqual((out.deleted, out.keys, out.output_rows, out.producers), (True, 1, 3, 1))
        self.assertEqual(self.code_of(lambda: self.info(fid)).code(), grpc.StatusCode.NOT_FOUND)
        status, body = self.server.http("DELETE", "/v1/functions/%s" % fid)
        self.assertEqual((status, body["status"]), (404, "NOT_FOUND"), body)
        status, body = self.server.http("DELETE", "/v1/functions/%s?allowMissing=true" % fid)
        self.assertEqual((status, body), (200, {}), "deleted: false is proto3 JSON's {}")

        # The same id, another descriptor (session_counter's), another state.
        d2 = tf.sc_descriptor(function_id=fid)
        d2["pipelineStateId"] = d["pipelineStateId"]
        info = self.register(d2)
        self.assertEqual(info.output_seq, 0)
        self.restart_after_kill()
        self.assertEqual(self.info(fid).descriptor.implementation_digest,
                         d2["implementationDigest"])
        self.assertEqual(self.info(fid).output_seq, 0)
        self.assertEqual(self.info(fid).producers, 0)
        # HTTP deletes it for good, durably.
        status, body = self.server.http("DELETE", "/v1/functions/%s" % fid)
        self.assertEqual(status, 200, body)
        self.assertTrue(body["deleted"])
        self.restart_after_kill()
        self.assertEqual(self.code_of(lambda: self.info(fid)).code(), grpc.StatusCode.NOT_FOUND)
        retry = self.stub.DeleteFunction(self.pb.DeleteFunctionRequest(
            function_id=fid, allow_missing=True), timeout=TIMEOUT_S)
        self.assertFalse(retry.deleted, "a retry after the crash is harmless")
        fid2 = self.register(tf.rs_descriptor(function_id=fid)).descriptor.function_id
        self.assertEqual(self.stub.GetKeyState(self.pb.GetKeyStateRequest(
            function_id=fid2, key="ann"), timeout=TIMEOUT_S).state, self.pb.STATE_KIND_ABSENT)

    def test_delete_function_answers_batches_reads_and_workers_in_flight(self):
        fid = rw.unique("rw")
        d = tf.rs_descriptor(function_id=fid)
        d["runtime"], d["implementationDigest"] = "RUNTIME_REMOTE", "ab" * 32
        self.register(d)
        worker = rw.FakeWorker(self.server.grpc_target, fid, "ab" * 32)
        self.addCleanup(worker.shutdown)
        worker.welcome()
        helper = rw.RemoteWorkersTest()
        helper.fns = self.stub
        first = helper.push_async(fid, 1, [("ann", 1)])
        worker.next()  # the call is out and stays unanswered
        second = helper.push_async(fid, 2, [("ann", 2)])
        tail = self.stub.ReadOutput.future(self.pb.ReadOutputRequest(
            function_id=fid, after_seq=0, wait_ms=20000), timeout=TIMEOUT_S)
        self.wait_for("the second batch and the read to wait", lambda: all(
            line in self.server.http("GET", "/metrics")[1].splitlines()
            for line in ("keyflow_function_batches_queued 1", "keyflow_parked_reads 1")))
        out = self.stub.DeleteFunction(self.pb.DeleteFunctionRequest(function_id=fid),
                                       timeout=TIMEOUT_S)
        self.assertTrue(out.deleted)
        for result in (first, second):
            ack, err = result()
            self.assertIsNone(ack)
            self.assertEqual(err.code(), grpc.StatusCode.ABORTED)
            self.assertIn("deleted", err.details())
        with self.assertRaises(grpc.RpcError) as cm:
            tail.result()
        self.assertEqual(cm.exception.code(), grpc.StatusCode.NOT_FOUND)
        code, details = worker.wait_end()
        self.assertEqual(code, grpc.StatusCode.NOT_FOUND)
        self.assertIn("deleted", details)

    # --- producers -------------------------------------------------------------
    def test_delete_producer_over_grpc_and_http(self):
        fid = self.register(tf.rs_descriptor()).descriptor.function_id
        self.push(fid, "p", 5, rows("ann", 100, 1))
        self.push(fid, "q", 9, rows("bob", 100, 1))
        out = self.stub.DeleteProducer(self.pb.DeleteProducerRequest(
            function_id=fid, producer_id="p"), timeout=TIMEOUT_S)
        self.assertEqual((out.deleted, out.last_sequence), (True, 5))
        status, body = self.server.http("DELETE", "/v1/functions/%s/producers/q" % fid)
        self.assertEqual((status, body["lastSequence"]), (200, "9"), body)
        status, body = self.server.http("DELETE", "/v1/functions/%s/producers/q" % fid)
        self.assertEqual(status, 404, body)
        cli = subprocess.run([harness.CLI, "--addr", self.server.grpc_target, "--output", "json",
                              "functions", "delete-producer", fid, "q", "--allow-missing"],
                             capture_output=True, text=True, timeout=TIMEOUT_S)
        self.assertEqual((cli.returncode, json.loads(cli.stdout)), (0, {}), cli.stderr)
        self.restart_after_kill()
        self.assertEqual(self.info(fid).producers, 0)
        self.assertFalse(self.push(fid, "p", 1, rows("ann", 200, 1)).duplicate)

    def test_idle_producers_expire_and_stay_forgotten(self):
        server = harness.Keyflowd(args=harness.ONE_PARTITION + [
            "--plugin-dir", tf.HANDLERS, "--producer-idle-expiry-ms", "500"]).start()
        self.addCleanup(server.cleanup)
        channel = grpc.insecure_channel(server.grpc_target)
        self.addCleanup(channel.close)
        stub = self.pg.FunctionsStub(channel)
        req = tf.json_format.ParseDict({"descriptor": tf.rs_descriptor()},
                                       self.pb.RegisterFunctionRequest())
        fid = stub.RegisterFunction(req, timeout=TIMEOUT_S).function.descriptor.function_id
        for producer in ("a", "b"):
            stub.PushBatch(self.pb.PushBatchRequest(
                function_id=fid, producer_id=producer, sequence=10,
                rows_json=json.dumps(rows("ann", 1, 1))), timeout=TIMEOUT_S)

        def producers():
            return stub.GetFunction(self.pb.GetFunctionRequest(function_id=fid),
                                    timeout=TIMEOUT_S).producers
        self.wait_for("idle producers to expire", lambda: producers() == 0)
        status, metrics = server.http("GET", "/metrics")
        self.assertIn("keyflow_function_producers_expired_total 2", metrics)
        channel.close()
        server.kill()
        server.start()
        channel = grpc.insecure_channel(server.grpc_target)
        self.addCleanup(channel.close)
        stub = self.pg.FunctionsStub(channel)
        self.assertEqual(producers(), 0, "expired producers stay forgotten")
        ack = stub.PushBatch(self.pb.PushBatchRequest(
            function_id=fid, producer_id="a", sequence=1,
            rows_json=json.dumps(rows("ann", 2, 1))), timeout=TIMEOUT_S)
        self.assertFalse(ack.duplicate)


if __name__ == "__main__":
    unittest.main()
