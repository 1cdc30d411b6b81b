"""Retiring what process functions accumulate, on the real keyflowd over gRPC
and HTTP: output retention and TrimOutput (docs/semantics.md, "Output
retention"), each checked again after SIGKILL and a restart.

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

TIMEOUT_S = 30
WAIT_S = 30


def rows(user, first_ts, n):
    return [{"user": user, "ts": first_ts + i, "amount": i + 1} for i in range(n)]


class RetireTest(unittest.TestCase):

    @classmethod
    def setUpClass(cls):
        tf.require_build(cls)
        tf.load_stubs()
        cls.pb, cls.pg = tf.pb, tf.pg
        cls.server = harness.Keyflowd(args=["--plugin-dir", tf.HANDLERS]).start()
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


if __name__ == "__main__":
    unittest.main()
