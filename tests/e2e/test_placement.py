"""A process function keeps the seed's contract at the default partition
count (8), on the real keyflowd (docs/scaling.md, "Placement";
docs/semantics.md, "Split functions"):

  - SINGLE (the default): a refused handler response applies nothing of
    the batch anywhere; max_keys binds the function, not each partition;
    the output is one sequence paged by after_seq;
  - SPLIT: a batch some partitions applied and others refused says so
    (message, gRPC keyflow-applied-partitions, HTTP appliedPartitions),
    and repeating it applies the applied part no second time;
  - SendEvents' 1,000 events bind the call, not each partition's part.

Over HTTP, and over gRPC where the answer differs (trailers).
"""

import json
import os
import sys
import unittest
import uuid

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import harness  # noqa: E402

harness.stubs()
import grpc  # noqa: E402
from keyflow.v1 import coordinators_pb2 as C  # noqa: E402
from keyflow.v1 import coordinators_pb2_grpc as CG  # noqa: E402
from keyflow.v1 import functions_pb2 as F  # noqa: E402
from keyflow.v1 import functions_pb2_grpc as FG  # noqa: E402

HANDLERS = os.path.join(harness.BUILD, "handlers")
INT64_MAX = 2 ** 63 - 1
USERS = ["user-%d" % i for i in range(16)]  # spread over every one of 8 partitions


class Placement(unittest.TestCase):
    @classmethod
    def setUpClass(cls):
        cls.server = harness.Keyflowd(args=["--plugin-dir", HANDLERS]).start()
        with open(os.path.join(HANDLERS, "running_sum.descriptor.json")) as f:
            cls.base = json.load(f)
        cls.channel = grpc.insecure_channel(cls.server.grpc_target)
        cls.fns = FG.FunctionsStub(cls.channel)

    @classmethod
    def tearDownClass(cls):
        cls.channel.close()
        harness.stopped(cls.server)

    def register(self, **fields):
        fid = "rs_" + uuid.uuid4().hex[:10]
        d = dict(self.base, functionId=fid, pipelineStateId=fid + ".v1", **fields)
        status, body = self.server.http("POST", "/v1/functions", d)
        self.assertEqual(status, 200, body)
        return fid, body["function"]

    def push(self, fid, seq, rows, producer="p", watermark=None):
        body = {"producerId": producer, "sequence": seq,
                "rows": [{"user": u, "ts": ts, "amount": a} for (u, ts, a) in rows]}
        if watermark is not None:
            body["watermarkUs"] = watermark
        return self.server.http("POST", "/v1/functions/%s/batches" % fid, body)

    def state(self, fid, user):
        status, body = self.server.http("GET", "/v1/functions/%s/keys/%s" % (fid, user))
        self.assertEqual(status, 200, body)
        return body.get("state"), body.get("value")

    def test_a_new_function_is_single_with_its_home(self):
        fid, info = self.register()
        self.assertEqual(info["placement"], "PLACEMENT_SINGLE", info)
        self.assertEqual(info.get("partitions", []), [], info)
        self.assertIn(info.get("homePartition", 0), range(8), info)

    def test_a_refused_response_applies_nothing_of_the_batch(self):
        fid, _ = self.register()
        status, body = self.push(fid, 1, [("big", 1, INT64_MAX)])
        self.assertEqual(status, 200, body)
        # Every user plus the one that overflows: at P = 8 these keys are in
        # every partition's range, and all of them live in the home.
        rows = [(u, 2, 5) for u in USERS] + [("big", 2, 1)]
        status, body = self.push(fid, 2, rows)
        self.assertEqual(status, 409, body)
        self.assertNotIn("appliedPartitions", body)
        for u in USERS:
            self.assertEqual(self.state(fid, u), ("STATE_KIND_ABSENT", None), u)
        self.assertEqual(self.state(fid, "big")[1], str(INT64_MAX))

    def test_max_keys_binds_the_function(self):
        fid, _ = self.register(limits=dict(self.base.get("limits", {}), maxKeys="2"))
        status, body = self.push(fid, 1, [(USERS[0], 1, 1), (USERS[1], 1, 1)])
        self.assertEqual(status, 200, body)
        status, body = self.push(fid, 2, [(USERS[2], 2, 1)])
        self.assertNotEqual(status, 200, body)
        self.assertIn("max_keys", body["message"])
        status, info = self.server.http("GET", "/v1/functions/%s" % fid)
        self.assertEqual(info["keys"], "2", info)

    def test_output_is_one_sequence_paged_by_after_seq(self):
        fid, _ = self.register()
        status, body = self.push(fid, 1, [(u, 1, 1) for u in USERS])
        self.assertEqual(status, 200, body)
        seqs, after = [], 0
        for _ in range(20):
            status, page = self.server.http(
                "GET", "/v1/functions/%s/output?after=%d&limit=5" % (fid, after))
            self.assertEqual(status, 200, page)
            if not page["rows"]:
                break
            self.assertEqual(int(page["firstSeq"]), after + 1, page)
            seqs += [int(r["_seq"]) for r in page["rows"]]
            after = int(page["nextAfterSeq"])
        self.assertEqual(seqs, list(range(1, len(USERS) + 1)))
        self.assertEqual([r["key"] for r in self.read_rows(fid)], USERS)

    def read_rows(self, fid):
        status, page = self.server.http("GET", "/v1/functions/%s/output?limit=1000" % fid)
        self.assertEqual(status, 200, page)
        return page["rows"]

    def test_a_split_batch_partly_applied_says_so_and_a_retry_converges(self):
        fid, info = self.register(placement="split")
        self.assertEqual(info["placement"], "PLACEMENT_SPLIT", info)
        status, body = self.push(fid, 1, [("big", 1, INT64_MAX)])
        self.assertEqual(status, 200, body)
        rows = [(u, 2, 5) for u in USERS] + [("big", 2, 1)]
        status, body = self.push(fid, 2, rows)
        self.assertEqual(status, 409, body)
        self.assertIn("partly applied", body["message"])
        applied = body["appliedPartitions"]
        self.assertTrue(applied, body)
        # The same batch again: applied where it was refused, never twice.
        status, again = self.push(fid, 2, rows)
        self.assertEqual(status, 409, again)
        self.assertEqual(again["appliedPartitions"], applied, again)
        values = [self.state(fid, u)[1] for u in USERS]
        self.assertTrue(all(v in (None, "5") for v in values), values)
        self.assertIn("5", values)
        # gRPC says the same in trailing metadata.
        batch_rows = json.dumps([{"user": u, "ts": ts, "amount": a} for (u, ts, a) in rows])
        with self.assertRaises(grpc.RpcError) as e:
            self.fns.PushBatch(F.PushBatchRequest(function_id=fid, producer_id="g", sequence=1,
                                                  rows_json=batch_rows), timeout=30)
        self.assertEqual(e.exception.code(), grpc.StatusCode.FAILED_PRECONDITION)
        trailers = dict(e.exception.trailing_metadata())
        self.assertEqual(trailers.get("keyflow-applied-partitions"),
                         ",".join(str(p) for p in applied), trailers)
        # GetFunction shows every partition's share, adding up to the limit.
        status, got = self.server.http("GET", "/v1/functions/%s" % fid)
        shares = got["partitions"]
        self.assertEqual(len(shares), 8, got)
        self.assertEqual(sum(int(s["maxKeys"]) for s in shares),
                         int(got["descriptor"]["limits"]["maxKeys"]))

    def test_send_events_bound_is_the_calls(self):
        coords = CG.CoordinatorsStub(self.channel)
        events = [C.SendEventRequest(workflow="bound", key="k-%d" % i,
                                     event=C.Event(input_json="1")) for i in range(1001)]
        with self.assertRaises(grpc.RpcError) as e:
            coords.SendEvents(C.SendEventsRequest(events=events), timeout=30)
        self.assertEqual(e.exception.code(), grpc.StatusCode.INVALID_ARGUMENT)
        self.assertIn("KF_SEND_EVENTS_MAX", e.exception.details())


if __name__ == "__main__":
    unittest.main()
