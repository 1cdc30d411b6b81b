"""--memory-budget on the real keyflowd (docs/semantics.md, "Memory
budget"): with a small budget, new windows are refused RESOURCE_EXHAUSTED
(HTTP 429) naming the budget, while events for windows already open keep
being accepted, over gRPC and HTTP; the gauges show the budget and what is
used; when windows close and their runs finish, new ones are admitted again.

Nothing sleeps for timing: conditions are waited on with deadlines.
"""

import os
import re
import sys
import time
import unittest

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import harness  # noqa: E402

harness.stubs()
import grpc  # noqa: E402
from keyflow.v1 import coordinators_pb2 as C  # noqa: E402
from keyflow.v1 import coordinators_pb2_grpc as CG  # noqa: E402
from keyflow.v1 import runs_pb2 as R  # noqa: E402
from keyflow.v1 import runs_pb2_grpc as RG  # noqa: E402

BUDGET = 64 * 1024
WINDOWS_MAX = 1000  # far more than a 64 KiB budget admits
TIMEOUT_S = 30
WF = "mem-wf"


def window(window_ms=600000):
    return C.Rule(kind=C.RULE_KIND_DEBOUNCE, window_ms=window_ms)


class MemoryBudgetTest(unittest.TestCase):

    def setUp(self):
        self.server = harness.Keyflowd(args=["--memory-budget", "64KiB"]).start()
        self.addCleanup(self.server.cleanup)
        self.channel = grpc.insecure_channel(self.server.grpc_target)
        self.addCleanup(self.channel.close)
        self.coords = CG.CoordinatorsStub(self.channel)
        self.runs = RG.RunsStub(self.channel)

    def send(self, key, rule, input_json="1"):
        return self.coords.SendEvent(C.SendEventRequest(
            workflow=WF, key=key, event=C.Event(rule=rule, input_json=input_json)),
            timeout=TIMEOUT_S)

    def gauge(self, name):
        status, text = self.server.http("GET", "/metrics")
        self.assertEqual(status, 200)
        m = re.search(r"^%s (\d+)$" % name, text, re.M)
        self.assertIsNotNone(m, name)
        return int(m.group(1))

    def fill(self):
        """Opens windows until the budget refuses one; returns their keys."""
        opened = []
        for i in range(WINDOWS_MAX):
            try:
                self.send("k%d" % i, window())
            except grpc.RpcError as e:
                self.assertEqual(e.code(), grpc.StatusCode.RESOURCE_EXHAUSTED, e.details())
                self.assertIn("memory budget", e.details())
                self.assertIn("--memory-budget %d" % BUDGET, e.details())
                return opened
            opened.append("k%d" % i)
        self.fail("%d windows and no refusal from a %d-byte budget" % (WINDOWS_MAX, BUDGET))

    def test_new_windows_are_refused_while_open_ones_keep_working(self):
        self.assertEqual(self.gauge("keyflow_memory_budget_bytes"), BUDGET)
        opened = self.fill()
        self.assertGreater(len(opened), 5)
        self.assertLessEqual(self.gauge("keyflow_memory_used_bytes"), BUDGET)
        # An open window still takes events, over gRPC and HTTP.
        for key in (opened[0], opened[-1]):
            receipt = self.send(key, window(), '{"more": 1}').receipt
            self.assertTrue(receipt.run_id.startswith(key + "@"))
        status, body = self.server.http("POST", "/v1/workflows/%s/keys/%s/events" % (WF, opened[1]),
                                        {"rule": {"kind": "debounce", "windowMs": 600000},
                                         "input": 2})
        self.assertEqual(status, 200, body)
        # A new window is refused over HTTP too, naming the budget: the key
        # gRPC was refused, whose partition's share is full (another
        # partition's may still have room).
        refused = "k%d" % len(opened)
        status, body = self.server.http("POST", "/v1/workflows/%s/keys/%s/events" % (WF, refused),
                                        {"rule": {"kind": "debounce", "windowMs": 600000},
                                         "input": 3})
        self.assertEqual((status, body["status"]), (429, "RESOURCE_EXHAUSTED"), body)
        self.assertIn("memory budget", body["message"])
        self.assertGreater(self.gauge("keyflow_rejected_memory_budget_total"), 1)

        # Windows that close become runs; finished runs leave memory, and
        # new windows fit again.
        for key in opened:
            self.coords.FlushWindow(C.FlushWindowRequest(coordinator=C.CoordinatorRef(
                kind=C.RULE_KIND_DEBOUNCE, workflow=WF, key=key)), timeout=TIMEOUT_S)
        done = 0
        deadline = time.time() + TIMEOUT_S
        while done < len(opened) and time.time() < deadline:
            polled = self.runs.PollRuns(R.PollRunsRequest(
                workflows=[WF], worker_id="w", max_runs=100, wait_ms=1000), timeout=TIMEOUT_S)
            for run in polled.runs:
                self.runs.CompleteRun(R.CompleteRunRequest(
                    run_id=run.run_id, lease=run.lease, result_json="true"), timeout=TIMEOUT_S)
                done += 1
        self.assertEqual(done, len(opened))
        deadline = time.time() + TIMEOUT_S
        while True:
            try:
                self.send("after-drain", window())
                break
            except grpc.RpcError as e:
                self.assertEqual(e.code(), grpc.StatusCode.RESOURCE_EXHAUSTED)
                self.assertLess(time.time(), deadline, "no room came back: " + e.details())
                time.sleep(0.05)


class SharedByPartitionsTest(MemoryBudgetTest):
    """Four partitions in one process share --memory-budget equally; a
    refusal names the flag's value and the share, not only the share (a
    number the operator never gave)."""

    def setUp(self):
        self.server = harness.Keyflowd(
            args=["--memory-budget", "64KiB", "--partition-count", "4"]).start()
        self.addCleanup(self.server.cleanup)
        self.channel = grpc.insecure_channel(self.server.grpc_target)
        self.addCleanup(self.channel.close)
        self.coords = CG.CoordinatorsStub(self.channel)
        self.runs = RG.RunsStub(self.channel)

    def test_a_refusal_names_the_flag_and_the_share(self):
        opened = self.fill()  # asserts "--memory-budget 65536"
        with self.assertRaises(grpc.RpcError) as cm:
            for i in range(WINDOWS_MAX):  # some partition is full: find it
                self.send("other-%d" % i, window())
        self.assertIn("--memory-budget %d bytes, %d bytes for each of the 4 partitions"
                      % (BUDGET, BUDGET // 4), cm.exception.details())
        self.assertTrue(self.send(opened[0], window(), '{"more": 1}').receipt.run_id)


if __name__ == "__main__":
    unittest.main()
