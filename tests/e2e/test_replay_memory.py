"""What the batches kept for ReplayBatch may hold, on the real keyflowd
(docs/semantics.md, "Memory budget" and "Process functions"):

  - --replay-bytes bounds the process, whatever the partition count: its
    partitions share it (it used to be per partition, 512 MiB at 8);
  - the kept batches live in the room the engine's tables leave in
    --memory-budget: new windows are admitted into that room (never refused
    because of kept batches), and the oldest kept batches are forgotten as
    the tables grow, so tables and batches stay within the budget together.

keyflow_replay_bytes and keyflow_memory_used_bytes are read from /metrics.
Nothing sleeps for timing: conditions are waited on with deadlines.
"""

import json
import os
import re
import sys
import unittest

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import harness  # noqa: E402

harness.stubs()
import grpc  # noqa: E402
from keyflow.v1 import coordinators_pb2 as C  # noqa: E402
from keyflow.v1 import coordinators_pb2_grpc as CG  # noqa: E402

HANDLERS = os.path.join(harness.BUILD, "handlers")
BASE_US = 1700000000000000
TIMEOUT_S = 30


def gauge(server, name):
    status, text = server.http("GET", "/metrics")
    assert status == 200, text
    m = re.search(r"^%s (\d+)$" % name, text, re.M)
    assert m is not None, "no %s in /metrics" % name
    return int(m.group(1))


class ReplayMemory:
    ARGS = []
    PLACEMENT = "single"

    def setUp(self):
        self.server = harness.Keyflowd(args=["--plugin-dir", HANDLERS] + self.ARGS).start()
        self.addCleanup(self.server.cleanup)
        with open(os.path.join(HANDLERS, "running_sum.descriptor.json")) as f:
            self.ok("POST", "/v1/functions", dict(json.load(f), placement=self.PLACEMENT))

    def ok(self, method, path, body=None):
        status, doc = self.server.http(method, path, body)
        self.assertEqual(status, 200, doc)
        return doc

    def push(self, seq, users, rows_per_user):
        rows = [{"user": u, "ts": BASE_US + seq * 1000 + i, "amount": i}
                for i in range(rows_per_user) for u in users]
        self.ok("POST", "/v1/functions/running_sum/batches",
                {"producerId": "p", "sequence": seq, "rows": rows})

    def replay(self, seq):
        return self.server.http(
            "POST", "/v1/functions/running_sum/producers/p/batches/%d:replay" % seq, {})


class SharedByPartitions(ReplayMemory, unittest.TestCase):
    """Four partitions share --replay-bytes 64KiB: each keeps 16 KiB of
    its parts of the batches, where each used to keep 64 KiB."""

    REPLAY_BYTES = 64 * 1024
    PLACEMENT = "split"  # its batches spread over the partitions' shares
    ARGS = ["--partition-count", "4", "--replay-bytes", "64KiB", "--memory-budget", "1GiB"]

    def test_the_process_keeps_at_most_replay_bytes(self):
        users = ["user-%d" % i for i in range(32)]
        # 8 batches of about 24 KiB of kept record each (rows, output and
        # the keys touched), spread over the partitions: about 4 times
        # --replay-bytes in all, within what each partition alone could keep.
        for seq in range(1, 9):
            self.push(seq, users, 24)
        kept = gauge(self.server, "keyflow_replay_bytes")
        self.assertGreater(kept, 0)
        self.assertLessEqual(kept, self.REPLAY_BYTES)
        status, rep = self.replay(8)
        self.assertEqual(status, 200, rep)
        self.assertTrue(rep.get("reproduced"), rep)
        status, rep = self.replay(1)
        self.assertEqual((status, rep.get("status")), (404, "NOT_FOUND"), rep)


class InsideTheMemoryBudget(ReplayMemory, unittest.TestCase):
    """With --memory-budget 64KiB, kept batches take the room the tables
    leave; windows opened afterwards take it back."""

    BUDGET = 64 * 1024
    ARGS = harness.ONE_PARTITION + ["--memory-budget", "64KiB"]

    def test_kept_batches_yield_to_the_tables(self):
        users = ["a", "b", "c", "d"]
        self.push(1, users, 1)  # the keys: later batches add none
        # Batches of about 20 KiB of kept record: a few fill the room.
        for seq in range(2, 10):
            self.push(seq, users, 100)
            self.assertLessEqual(gauge(self.server, "keyflow_memory_used_bytes") +
                                 gauge(self.server, "keyflow_replay_bytes"), self.BUDGET)
        kept_before = gauge(self.server, "keyflow_replay_bytes")
        used_before = gauge(self.server, "keyflow_memory_used_bytes")
        self.assertGreater(kept_before, self.BUDGET // 4, "batches filled the room")
        status, rep = self.replay(9)
        self.assertEqual(status, 200, rep)
        self.assertTrue(rep.get("reproduced"), rep)

        # New windows are admitted into the room the kept batches held.
        channel = grpc.insecure_channel(self.server.grpc_target)
        self.addCleanup(channel.close)
        coords = CG.CoordinatorsStub(channel)
        rule = C.Rule(kind=C.RULE_KIND_DEBOUNCE, window_ms=600000)
        for i in range(2000):
            try:
                coords.SendEvent(C.SendEventRequest(
                    workflow="wf", key="k%d" % i, event=C.Event(rule=rule, input_json="1")),
                    timeout=TIMEOUT_S)
            except grpc.RpcError as e:
                self.assertEqual(e.code(), grpc.StatusCode.RESOURCE_EXHAUSTED, e.details())
                self.assertIn("--memory-budget %d" % self.BUDGET, e.details())
                break
        else:
            self.fail("2000 windows and no refusal from a %d-byte budget" % self.BUDGET)
        used = gauge(self.server, "keyflow_memory_used_bytes")
        kept = gauge(self.server, "keyflow_replay_bytes")
        self.assertGreater(used, used_before + kept_before // 2,
                           "windows took the room kept batches held")
        self.assertLess(kept, kept_before, "the oldest kept batches were forgotten")
        self.assertLessEqual(used + kept, self.BUDGET)
        # The oldest went first: the newest batch is kept while any is.
        status, rep = self.replay(9)
        self.assertEqual(status, 200 if kept else 404, rep)


if __name__ == "__main__":
    unittest.main()
