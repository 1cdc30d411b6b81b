"""End-to-end tests of debounce/batch coordinators and runs through Python
grpcio against the real keyflowd (DESIGN.md sections 2 and 4).

Run (Debian's Python, which has grpcio):
  cd /work/main && KEYFLOW_BUILD_DIR=build-e2e PYENV_VERSION=system \
      python3 -m unittest discover -s tests/e2e -p 'test_grpc_coordinators.py' -v

The server's clock cannot be controlled, so window arithmetic is pinned by
relations: between receipts, against DescribeCoordinator's opened_ms/last_ms,
and against the client's wall clock (same host, same CLOCK_REALTIME).
Nothing waits on a fixed sleep: long polls (PollRuns wait_ms) and bounded
polling loops with deadlines and clear failure messages.
"""

import json
import os
import re
import sys
import threading
import time
import unittest
import uuid

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import harness  # noqa: E402
from harness import wait_until  # noqa: E402

harness.stubs()
import grpc  # noqa: E402
from grpc.health.v1 import health_pb2, health_pb2_grpc  # noqa: E402
from keyflow.v1 import coordinators_pb2 as C  # noqa: E402
from keyflow.v1 import coordinators_pb2_grpc as CG  # noqa: E402
from keyflow.v1 import runs_pb2 as R  # noqa: E402
from keyflow.v1 import runs_pb2_grpc as RG  # noqa: E402

DEBOUNCE = C.RULE_KIND_DEBOUNCE
BATCH = C.RULE_KIND_BATCH
UUID_RE = r"[0-9a-f]{8}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{12}"
# Slack for the ms clock: the engine reads CLOCK_REALTIME once per turn.
CLOCK_SLACK_MS = 5


def now_ms():
    return int(time.time() * 1000)


def debounce(window_ms, max_wait_ms=None, dedup_ms=None):
    r = C.Rule(kind=DEBOUNCE, window_ms=window_ms)
    if max_wait_ms is not None:
        r.max_wait_ms = max_wait_ms
    if dedup_ms is not None:
        r.dedup_ms = dedup_ms
    return r


def batch(max_events=None, max_wait_ms=None, dedup_ms=None):
    r = C.Rule(kind=BATCH)
    if max_events is not None:
        r.max_events = max_events
    if max_wait_ms is not None:
        r.max_wait_ms = max_wait_ms
    if dedup_ms is not None:
        r.dedup_ms = dedup_ms
    return r


class ServerTest(harness.ServerTest):
    """One keyflowd per class (port 0, temp data dir), each test in a
    workflow of its own; fresh_server where a class's tests look at the
    whole server."""

    def setUp(self):
        super().setUp()
        self.channel = grpc.insecure_channel(self.server.grpc_target)
        self.addCleanup(self.channel.close)
        self.coords = CG.CoordinatorsStub(self.channel)
        self.runs = RG.RunsStub(self.channel)
        self.wf = "wf-" + uuid.uuid4().hex[:8]

    # --- helpers ---------------------------------------------------------
    def send(self, key, rule, input_json="null", event_id="", workflow=None):
        return self.coords.SendEvent(C.SendEventRequest(
            workflow=self.wf if workflow is None else workflow, key=key,
            event=C.Event(id=event_id, rule=rule, input_json=input_json)), timeout=10)

    def ref(self, kind, key, workflow=None):
        return C.CoordinatorRef(kind=kind, workflow=self.wf if workflow is None else workflow, key=key)

    def describe(self, kind, key, workflow=None):
        return self.coords.DescribeCoordinator(
            C.DescribeCoordinatorRequest(coordinator=self.ref(kind, key, workflow)), timeout=10)

    def flush(self, kind, key):
        return self.coords.FlushWindow(C.FlushWindowRequest(coordinator=self.ref(kind, key)), timeout=10)

    def cancel(self, kind, key):
        return self.coords.CancelWindow(C.CancelWindowRequest(coordinator=self.ref(kind, key)), timeout=10)

    def poll(self, wait_ms=0, lease_ms=0, max_runs=0, worker="w1", workflows=None, timeout=30):
        return self.runs.PollRuns(R.PollRunsRequest(
            workflows=[self.wf] if workflows is None else workflows, worker_id=worker,
            lease_ms=lease_ms, max_runs=max_runs, wait_ms=wait_ms), timeout=timeout).runs

    def poll_one(self, wait_ms=10000, **kw):
        runs = self.poll(wait_ms=wait_ms, **kw)
        self.assertEqual(len(runs), 1, "PollRuns(wait_ms=%d) returned %d runs" % (wait_ms, len(runs)))
        return runs[0]

    def get_run(self, run_id):
        return self.runs.GetRun(R.GetRunRequest(run_id=run_id), timeout=10)

    def complete(self, run_id, lease, result_json=None, error=None):
        req = R.CompleteRunRequest(run_id=run_id, lease=lease)
        if result_json is not None:
            req.result_json = result_json
        if error is not None:
            req.error = error
        return self.runs.CompleteRun(req, timeout=10)

    def assert_rpc_error(self, code, fn, *args, field=None, **kw):
        with self.assertRaises(grpc.RpcError) as cm:
            fn(*args, **kw)
        err = cm.exception
        self.assertEqual(err.code(), code, "expected %s, got %s: %s" % (code, err.code(), err.details()))
        if field is not None:
            self.assertIn(field, err.details() or "", "the message should name %r" % field)
        return err

    def assert_receipt_run_id(self, run_id, key):
        self.assertRegex(run_id, "^" + re.escape(key) + "@" + UUID_RE + "$")

    def metric(self, name, absent=None):
        """The sample's value; `absent` if it has none (None: a failure)."""
        status, text = self.server.http("GET", "/metrics")
        self.assertEqual(status, 200)
        for line in text.splitlines():
            if line.startswith(name + " "):
                return float(line.split()[1])
        if absent is not None:
            return absent
        raise AssertionError("metric %s not found" % name)


class DebounceTest(ServerTest):
    def test_first_event_opens_window_with_receipt(self):
        t0 = now_ms()
        r = self.send("k1", debounce(20000), '{"n":1}', event_id="e1")
        t1 = now_ms()
        self.assertFalse(r.duplicate)
        self.assertFalse(r.run_started)
        self.assert_receipt_run_id(r.receipt.run_id, "k1")
        # due = last + window, and last is this event's time (within the call).
        self.assertGreaterEqual(r.receipt.due_ms, t0 + 20000 - CLOCK_SLACK_MS)
        self.assertLessEqual(r.receipt.due_ms, t1 + 20000 + CLOCK_SLACK_MS)
        d = self.describe(DEBOUNCE, "k1")
        self.assertTrue(d.exists)
        self.assertEqual(d.window.run_id, r.receipt.run_id)
        self.assertEqual(d.window.event_count, 1)
        self.assertEqual(d.window.opened_ms, d.window.last_ms)
        self.assertEqual(d.window.due_ms, r.receipt.due_ms)
        self.assertEqual(d.window.due_ms, d.window.last_ms + 20000)

    def test_second_event_moves_due_by_elapsed_time_and_keeps_run_id(self):
        r1 = self.send("k", debounce(20000), '{"n":1}')
        d1 = self.describe(DEBOUNCE, "k")
        # Let the clock move so that the second event is strictly later.
        wait_until(lambda: now_ms() > d1.window.last_ms + 30, 2, "the clock to advance")
        r2 = self.send("k", debounce(20000), '{"n":2}')
        d2 = self.describe(DEBOUNCE, "k")
        self.assertEqual(r2.receipt.run_id, r1.receipt.run_id, "a later event joins the same window")
        self.assertEqual(d2.window.opened_ms, d1.window.opened_ms)
        elapsed = d2.window.last_ms - d1.window.last_ms
        self.assertGreaterEqual(elapsed, 30)
        self.assertEqual(r2.receipt.due_ms - r1.receipt.due_ms, elapsed,
                         "debounce due moves by exactly the time between the events")
        self.assertEqual(r2.receipt.due_ms, d2.window.last_ms + 20000)
        self.assertEqual(d2.window.event_count, 2)
        # The run's input is the latest event's input.
        f = self.flush(DEBOUNCE, "k")
        self.assertTrue(f.flushed)
        self.assertEqual(f.run_id, r1.receipt.run_id)
        run = self.get_run(f.run_id)
        self.assertEqual(json.loads(run.input_json), {"n": 2})
        self.assertEqual(run.event_count, 2)
        self.assertEqual(run.kind, DEBOUNCE)
        self.assertEqual(run.workflow, self.wf)
        self.assertEqual(run.key, "k")
        self.assertEqual(run.status, R.RUN_STATUS_PENDING)

    def test_max_wait_caps_due_time(self):
        # max_wait > 0: due = min(last + window, opened + max_wait).
        r1 = self.send("k", debounce(20000, max_wait_ms=3000), "1")
        d1 = self.describe(DEBOUNCE, "k")
        opened = d1.window.opened_ms
        self.assertEqual(r1.receipt.due_ms, opened + 3000, "opened + max_wait < last + window")
        wait_until(lambda: now_ms() > opened + 20, 2, "the clock to advance")
        r2 = self.send("k", debounce(20000, max_wait_ms=3000), "2")
        self.assertEqual(r2.receipt.due_ms, opened + 3000, "the cap does not move with later events")
        self.assertEqual(r2.receipt.run_id, r1.receipt.run_id)
        # The latest rule applies to the window: a short window under a long
        # max_wait makes last + window the minimum.
        r3 = self.send("k", debounce(2000, max_wait_ms=60000), "3")
        d3 = self.describe(DEBOUNCE, "k")
        self.assertEqual(d3.window.opened_ms, opened)
        self.assertEqual(r3.receipt.due_ms, min(d3.window.last_ms + 2000, opened + 60000))
        self.assertEqual(r3.receipt.due_ms, d3.window.last_ms + 2000)
        self.assertEqual(d3.window.rule.window_ms, 2000)
        self.assertEqual(d3.window.rule.max_wait_ms, 60000)
        self.assertEqual(d3.window.due_ms, r3.receipt.due_ms)
        self.assertEqual(r3.receipt.run_id, r1.receipt.run_id)

    def test_max_wait_closes_window_despite_continuing_events(self):
        # Events every ~50 ms keep pushing last + 400 out; max_wait 700 closes
        # the window anyway, and the next event opens a new one.
        rule = debounce(400, max_wait_ms=700)
        first = self.send("k", rule, "0")
        opened = self.describe(DEBOUNCE, "k").window.opened_ms
        self.assertEqual(first.receipt.due_ms, opened + 400, "min(last + 400, opened + 700)")
        sent = [(0, first)]
        deadline = time.time() + 10
        n = 0
        while True:
            self.assertLess(time.time(), deadline, "no new window opened within 10 s")
            time.sleep(0.05)  # pacing of the event stream, not a wait for a condition
            n += 1
            before = now_ms()
            r = self.send("k", rule, str(n))
            if r.receipt.run_id != first.receipt.run_id:
                break
            # due = min(last + 400, opened + 700): never past the cap, and at
            # the cap once the event comes more than 300 ms after the first.
            self.assertLessEqual(r.receipt.due_ms, opened + 700)
            self.assertGreaterEqual(r.receipt.due_ms, sent[-1][1].receipt.due_ms)
            if before > opened + 300 + CLOCK_SLACK_MS:
                self.assertEqual(r.receipt.due_ms, opened + 700, "late events are due at the cap")
            sent.append((n, r))
        run = self.get_run(first.receipt.run_id)
        self.assertGreaterEqual(run.created_ms, opened + 700)
        self.assertEqual(json.loads(run.input_json), sent[-1][0], "the latest input of the closed window")
        self.assertEqual(run.event_count, len(sent))
        self.assertGreaterEqual(len(sent), 3)

    def test_window_closes_by_itself_and_long_poll_returns_it(self):
        # An event ID keeps the coordinator (and its history) after the run.
        r = self.send("k", debounce(400), '{"v":"only"}', event_id="e1")
        due = r.receipt.due_ms
        run = self.poll_one(wait_ms=15000)
        returned = now_ms()
        self.assertEqual(run.run_id, r.receipt.run_id)
        self.assertEqual(json.loads(run.input_json), {"v": "only"})
        self.assertGreaterEqual(returned, due - CLOCK_SLACK_MS, "the run must not start before due_ms")
        self.assertLess(returned, due + 3000, "the long poll should return as soon as the window closes")
        self.assertGreaterEqual(run.created_ms, due)
        self.assertEqual(run.status, R.RUN_STATUS_LEASED)
        self.assertEqual(run.attempts, 1)
        self.assertEqual(run.worker_id, "w1")
        self.assertEqual(len(run.lease), 36)
        # The coordinator recorded the run and has no window left.
        d = self.describe(DEBOUNCE, "k")
        self.assertFalse(d.HasField("window"))
        self.assertEqual(d.runs_started, 1)
        self.assertIn(r.receipt.run_id, list(d.recent_run_ids))
        started = [j for j in d.journal if j.what == "run_started"]
        self.assertEqual(len(started), 1)
        self.assertEqual(started[0].run_id, r.receipt.run_id)
        self.assertIn("due", started[0].detail)


class BatchTest(ServerTest):
    def test_batch_fills_in_the_same_request(self):
        inputs = ['{"i":1}', '[1,2]', '"three"']
        t0 = now_ms()
        r1 = self.send("b", batch(max_events=3, max_wait_ms=60000), inputs[0], event_id="a")
        self.assertFalse(r1.run_started)
        self.assert_receipt_run_id(r1.receipt.run_id, "b")
        d1 = self.describe(BATCH, "b")
        opened = d1.window.opened_ms
        self.assertGreaterEqual(opened, t0 - CLOCK_SLACK_MS)
        self.assertEqual(r1.receipt.due_ms, opened + 60000, "batch due = opened + max_wait")
        r2 = self.send("b", batch(max_events=3, max_wait_ms=60000), inputs[1], event_id="b")
        self.assertFalse(r2.run_started)
        self.assertEqual(r2.receipt.run_id, r1.receipt.run_id)
        self.assertEqual(r2.receipt.due_ms, opened + 60000, "batch due does not move with events")
        r3 = self.send("b", batch(max_events=3, max_wait_ms=60000), inputs[2], event_id="c")
        t3 = now_ms()
        self.assertTrue(r3.run_started, "the max_events-th event starts the run in the same request")
        self.assertEqual(r3.receipt.run_id, r1.receipt.run_id)
        # due_ms = that event's time: between opening and the reply, and equal
        # to the journal's record of the event and to the run's creation.
        self.assertGreaterEqual(r3.receipt.due_ms, opened)
        self.assertLessEqual(r3.receipt.due_ms, t3 + CLOCK_SLACK_MS)
        d = self.describe(BATCH, "b")
        self.assertFalse(d.HasField("window"))
        acc = [j for j in d.journal if j.what == "event_accepted" and j.event_id == "c"]
        self.assertEqual(len(acc), 1)
        self.assertEqual(acc[0].at_ms, r3.receipt.due_ms)
        run = self.get_run(r1.receipt.run_id)
        self.assertEqual(run.status, R.RUN_STATUS_PENDING)
        self.assertEqual(run.created_ms, r3.receipt.due_ms)
        self.assertEqual(run.kind, BATCH)
        self.assertEqual(run.event_count, 3)
        self.assertEqual(json.loads(run.input_json), [json.loads(x) for x in inputs],
                         "batch input is the array of every input in arrival order")
        # The next event opens a new window with a new run ID.
        r4 = self.send("b", batch(max_events=3, max_wait_ms=60000), "4", event_id="d")
        self.assertFalse(r4.run_started)
        self.assert_receipt_run_id(r4.receipt.run_id, "b")
        self.assertNotEqual(r4.receipt.run_id, r1.receipt.run_id)
        # A long poll hands out the full batch.
        run = self.poll_one(wait_ms=5000)
        self.assertEqual(run.run_id, r1.receipt.run_id)

    def test_max_events_one_and_ten_thousand_are_accepted(self):
        r = self.send("one", batch(max_events=1, max_wait_ms=60000), '{"x":1}')
        self.assertTrue(r.run_started)
        self.assertEqual(json.loads(self.get_run(r.receipt.run_id).input_json), [{"x": 1}])
        r = self.send("many", batch(max_events=10000, max_wait_ms=60000), "1")
        self.assertFalse(r.run_started)
        self.assertEqual(self.describe(BATCH, "many").window.rule.max_events, 10000)

    def test_batch_window_closes_when_its_input_would_pass_4_mib(self):
        opts = [("grpc.max_receive_message_length", 64 << 20), ("grpc.max_send_message_length", 64 << 20)]
        ch = grpc.insecure_channel(self.server.grpc_target, options=opts)
        self.addCleanup(ch.close)
        coords, runs = CG.CoordinatorsStub(ch), RG.RunsStub(ch)
        big = '"' + "x" * (250 * 1024) + '"'
        rule = batch(max_events=100, max_wait_ms=600000)
        receipts = [coords.SendEvent(C.SendEventRequest(workflow=self.wf, key="big", event=C.Event(
            rule=rule, input_json=big)), timeout=30) for _ in range(20)]
        per_window = 4 * 1024 * 1024 // (len(big) + 1)  # 16 inputs and their commas fit
        first, second = receipts[0].receipt.run_id, receipts[per_window].receipt.run_id
        self.assertEqual({r.receipt.run_id for r in receipts[:per_window]}, {first})
        self.assertNotEqual(second, first, "the event that would pass 4 MiB opens the next window")
        self.assertEqual({r.receipt.run_id for r in receipts[per_window:]}, {second})
        self.assertFalse(any(r.run_started for r in receipts), "the event itself is never refused or 'full'")
        run = runs.GetRun(R.GetRunRequest(run_id=first), timeout=30)
        self.assertEqual(run.status, R.RUN_STATUS_PENDING)
        self.assertEqual(run.event_count, per_window)
        self.assertLessEqual(len(run.input_json), 4 * 1024 * 1024)
        self.assertEqual(len(json.loads(run.input_json)), per_window)
        d = self.describe(BATCH, "big")
        self.assertEqual(d.window.event_count, 20 - per_window)
        started = [j for j in d.journal if j.what == "run_started"]
        self.assertEqual(len(started), 1)
        self.assertIn("size", started[0].detail)

    def test_latest_rule_governs_the_open_window(self):
        # Shrinking max_events below the count fires the window at once.
        for i in range(3):
            self.assertFalse(self.send("s", batch(max_events=10, max_wait_ms=60000), str(i)).run_started)
        r = self.send("s", batch(max_events=2, max_wait_ms=60000), "3")
        self.assertTrue(r.run_started)
        self.assertEqual(json.loads(self.get_run(r.receipt.run_id).input_json), [0, 1, 2, 3])
        # Shrinking max_wait so that the due time is already past: the
        # window closes at once (not at the old due time).
        r1 = self.send("p", batch(max_events=100, max_wait_ms=60000), '"a"')
        opened = r1.receipt.due_ms - 60000
        wait_until(lambda: now_ms() > opened + 300, 5, "the window to be 300 ms old")
        r2 = self.send("p", batch(max_events=100, max_wait_ms=200), '"b"')
        self.assertEqual(r2.receipt.due_ms, opened + 200, "due recomputed with the new rule: opened + 200")
        self.assertFalse(r2.run_started)
        t = time.monotonic()
        runs = self.poll(wait_ms=10000, max_runs=10)
        self.assertLess(time.monotonic() - t, 3, "an overdue window closes at once")
        # Keys "s" and "p" may be in different partitions: no order between them.
        by_id = {x.run_id: x for x in runs}
        self.assertEqual(sorted(by_id), sorted([r.receipt.run_id, r1.receipt.run_id]))
        self.assertEqual(json.loads(by_id[r1.receipt.run_id].input_json), ["a", "b"])

    def test_batch_defaults(self):
        r = self.send("dflt", C.Rule(kind=BATCH), "1")
        d = self.describe(BATCH, "dflt")
        self.assertEqual(d.window.rule.max_events, 100)
        self.assertEqual(d.window.rule.max_wait_ms, 1000)
        self.assertEqual(d.window.rule.dedup_ms, 600000)
        self.assertEqual(r.receipt.due_ms, d.window.opened_ms + 1000)

    def test_batch_closes_after_max_wait(self):
        r1 = self.send("w", batch(max_events=100, max_wait_ms=300), '"a"')
        r2 = self.send("w", batch(max_events=100, max_wait_ms=300), '"b"')
        self.assertEqual(r1.receipt.run_id, r2.receipt.run_id)
        run = self.poll_one(wait_ms=15000)
        self.assertGreaterEqual(now_ms(), r1.receipt.due_ms - CLOCK_SLACK_MS)
        self.assertEqual(run.run_id, r1.receipt.run_id)
        self.assertEqual(json.loads(run.input_json), ["a", "b"])

    def test_debounce_and_batch_of_one_key_are_distinct(self):
        rd = self.send("same", debounce(20000), '"d"', event_id="x")
        rb = self.send("same", batch(max_events=5, max_wait_ms=60000), '"b"', event_id="x")
        self.assertFalse(rb.duplicate, "the same event ID in another kind's coordinator is not a retry")
        self.assertNotEqual(rd.receipt.run_id, rb.receipt.run_id)
        self.assertEqual(self.describe(DEBOUNCE, "same").window.run_id, rd.receipt.run_id)
        self.assertEqual(self.describe(BATCH, "same").window.run_id, rb.receipt.run_id)
        self.assertEqual(self.describe(BATCH, "same", workflow=self.wf + "-other").exists, False)


class DedupTest(ServerTest):
    def test_retry_with_same_id_is_a_duplicate(self):
        rule = batch(max_events=10, max_wait_ms=60000)
        r1 = self.send("k", rule, '{"n":1}', event_id="e-1")
        d1 = self.describe(BATCH, "k")
        r1b = self.send("k", rule, '{"n":1}', event_id="e-1")
        self.assertTrue(r1b.duplicate)
        self.assertFalse(r1.duplicate)
        self.assertEqual(r1b.receipt, r1.receipt, "a retry gets the first receipt")
        self.assertEqual(r1.disposition, C.DISPOSITION_OPENED)
        self.assertEqual(r1b.disposition, C.DISPOSITION_DUPLICATE)
        r2 = self.send("k", rule, '{"n":2}', event_id="e-2")
        self.assertFalse(r2.duplicate)
        r2b = self.send("k", rule, '{"n":2}', event_id="e-2")
        self.assertTrue(r2b.duplicate)
        self.assertEqual(r2b.receipt, r2.receipt)
        d = self.describe(BATCH, "k")
        self.assertEqual(d.window.event_count, 2, "duplicates add no event")
        self.assertEqual(d.journal_seq, d1.journal_seq + 1, "duplicates add no journal entry")
        f = self.flush(BATCH, "k")
        self.assertEqual(json.loads(self.get_run(f.run_id).input_json), [{"n": 1}, {"n": 2}])
        # After the window closed the ID still deduplicates: the first receipt
        # comes back and no new window opens.
        r1c = self.send("k", rule, '{"n":1}', event_id="e-1")
        self.assertTrue(r1c.duplicate)
        self.assertEqual(r1c.receipt, r1.receipt)
        self.assertFalse(self.describe(BATCH, "k").HasField("window"))

    def test_debounce_dedup_keeps_receipt_and_does_not_move_due(self):
        r1 = self.send("k", debounce(20000), '"first"', event_id="id")
        wait_until(lambda: now_ms() > r1.receipt.due_ms - 20000 + 20, 2, "the clock to advance")
        r2 = self.send("k", debounce(20000), '"first"', event_id="id")
        self.assertTrue(r2.duplicate)
        self.assertEqual(r2.receipt.due_ms, r1.receipt.due_ms)
        d = self.describe(DEBOUNCE, "k")
        self.assertEqual(d.window.due_ms, r1.receipt.due_ms)
        self.assertEqual(d.window.event_count, 1)
        self.flush(DEBOUNCE, "k")
        self.assertEqual(json.loads(self.get_run(r1.receipt.run_id).input_json), "first")

    def test_remembered_id_expires_after_dedup_ms(self):
        rule = debounce(60000, dedup_ms=200)
        r1 = self.send("k", rule, '"a"', event_id="x")
        d = self.describe(DEBOUNCE, "k")
        self.assertEqual(d.remembered_ids[0].expires_ms, d.window.last_ms + 200)
        expires = d.remembered_ids[0].expires_ms
        wait_until(lambda: now_ms() > expires + 5, 5, "the remembered ID's expiry to pass")
        self.assertEqual(len(self.describe(DEBOUNCE, "k").remembered_ids), 0, "an expired ID is not listed")
        r2 = self.send("k", rule, '"b"', event_id="x")
        self.assertFalse(r2.duplicate, "after dedup_ms the ID is new again")
        self.assertEqual(r2.receipt.run_id, r1.receipt.run_id, "it joins the open window")
        self.assertEqual(self.describe(DEBOUNCE, "k").window.event_count, 2)
        # dedup_ms 0: forgotten at once.
        self.send("z", batch(max_events=10, max_wait_ms=60000, dedup_ms=0), "1", event_id="y")
        self.assertFalse(self.send("z", batch(max_events=10, max_wait_ms=60000, dedup_ms=0), "1",
                                   event_id="y").duplicate)
        self.assertEqual(self.describe(BATCH, "z").window.event_count, 2)

    def test_remembered_ids_are_bounded_and_journal_compacts(self):
        # 1024 remembered IDs per key, the oldest forgotten first; the journal
        # compacts (continue-as-new) after 256 entries.
        rule = batch(max_events=10000, max_wait_ms=600000)
        for i in range(10):
            self.send("cap", rule, str(i), event_id="old-%d" % i)
        errors = []

        def worker(t):
            ch = grpc.insecure_channel(self.server.grpc_target)
            stub = CG.CoordinatorsStub(ch)
            try:
                for i in range(t, 1020, 8):
                    stub.SendEvent(C.SendEventRequest(workflow=self.wf, key="cap", event=C.Event(
                        id="new-%d" % i, rule=rule, input_json=str(1000 + i))), timeout=30)
            except grpc.RpcError as e:
                errors.append(e)
            finally:
                ch.close()

        threads = [threading.Thread(target=worker, args=(t,)) for t in range(8)]
        for th in threads:
            th.start()
        for th in threads:
            th.join(120)
        self.assertEqual(errors, [])
        d = self.describe(BATCH, "cap")
        self.assertEqual(d.window.event_count, 1030)
        ids = {m.id for m in d.remembered_ids}
        self.assertEqual(len(ids), 1024)
        self.assertEqual(sorted(i for i in ids if i.startswith("old-")), ["old-6", "old-7", "old-8", "old-9"],
                         "the 6 oldest IDs are forgotten first")
        self.assertEqual(d.journal_seq, 1030)
        self.assertGreaterEqual(d.compactions, 1, "the journal compacts after a few hundred entries")
        self.assertLessEqual(d.journal_length, 256)
        self.assertEqual(len(d.journal), d.journal_length)
        self.assertEqual(d.compactions * 256 + d.journal_length, d.journal_seq)
        self.assertFalse(self.send("cap", rule, '"again"', event_id="old-0").duplicate, "old-0 was forgotten")
        self.assertTrue(self.send("cap", rule, "9", event_id="old-9").duplicate)
        self.assertTrue(self.send("cap", rule, "1000", event_id="new-0").duplicate)
        f = self.flush(BATCH, "cap")
        items = json.loads(self.get_run(f.run_id).input_json)
        self.assertEqual(len(items), 1031)
        self.assertEqual(items[:10], list(range(10)))
        self.assertEqual(sorted(items[10:1030]), list(range(1000, 2020)))
        self.assertEqual(items[-1], "again")

    def test_events_without_id_are_never_deduplicated(self):
        rule = batch(max_events=10, max_wait_ms=60000)
        self.send("k", rule, "1")
        r = self.send("k", rule, "1")
        self.assertFalse(r.duplicate)
        self.assertEqual(self.describe(BATCH, "k").window.event_count, 2)
        self.assertEqual(len(self.describe(BATCH, "k").remembered_ids), 0)


class DescribeTest(ServerTest):
    def test_describe_window_ids_and_journal(self):
        self.assertFalse(self.describe(BATCH, "k").exists)
        rule = batch(max_events=10, max_wait_ms=60000, dedup_ms=120000)
        r1 = self.send("k", rule, '{"a":1}', event_id="one")
        r2 = self.send("k", rule, '{"b":2}', event_id="two")
        d = self.describe(BATCH, "k")
        self.assertTrue(d.exists)
        self.assertEqual(d.coordinator.kind, BATCH)
        self.assertEqual(d.coordinator.workflow, self.wf)
        self.assertEqual(d.coordinator.key, "k")
        w = d.window
        self.assertEqual(w.run_id, r1.receipt.run_id)
        self.assertEqual(w.event_count, 2)
        self.assertEqual(w.due_ms, w.opened_ms + 60000)
        self.assertGreaterEqual(w.last_ms, w.opened_ms)
        self.assertEqual(w.rule.kind, BATCH)
        self.assertEqual(w.rule.max_events, 10)
        self.assertEqual(w.rule.max_wait_ms, 60000)
        self.assertEqual(w.rule.dedup_ms, 120000)
        # input_bytes: the JSON array the run would get.
        self.assertEqual(w.input_bytes, len('[{"a":1},{"b":2}]'))
        ids = {m.id: m for m in d.remembered_ids}
        self.assertEqual(set(ids), {"one", "two"})
        self.assertEqual(ids["one"].receipt, r1.receipt)
        self.assertEqual(ids["two"].receipt, r2.receipt)
        # A remembered ID expires at its event time + dedup_ms.
        self.assertEqual(ids["one"].expires_ms, w.opened_ms + 120000)
        self.assertEqual(ids["two"].expires_ms, w.last_ms + 120000)
        self.assertEqual(d.journal_length, 2)
        self.assertEqual(d.journal_seq, 2)
        self.assertEqual([j.what for j in d.journal], ["event_accepted", "event_accepted"])
        self.assertEqual([j.event_id for j in d.journal], ["one", "two"])
        self.assertEqual([j.run_id for j in d.journal], [r1.receipt.run_id] * 2)
        self.assertEqual(d.journal[0].at_ms, w.opened_ms)
        self.assertEqual(d.journal[1].at_ms, w.last_ms)
        self.assertIn("opened", d.journal[0].detail)
        self.assertNotIn("opened", d.journal[1].detail)
        self.assertLess(d.journal[0].seq, d.journal[1].seq)
        self.assertEqual(d.runs_started, 0)
        # Flush: a run_started entry, the window gone, the IDs still remembered.
        self.flush(BATCH, "k")
        d = self.describe(BATCH, "k")
        self.assertTrue(d.exists)
        self.assertFalse(d.HasField("window"))
        self.assertEqual(d.runs_started, 1)
        self.assertEqual(list(d.recent_run_ids), [r1.receipt.run_id])
        self.assertEqual(d.journal_seq, 3)
        self.assertEqual(d.journal[-1].what, "run_started")
        self.assertEqual(d.journal[-1].run_id, r1.receipt.run_id)
        self.assertIn("flush", d.journal[-1].detail)
        self.assertEqual({m.id for m in d.remembered_ids}, {"one", "two"})

    def test_coordinator_without_ids_is_deleted_after_its_window(self):
        self.send("gone", batch(max_events=1, max_wait_ms=60000), "1")
        d = wait_until(lambda: (lambda d: d if not d.exists else None)(self.describe(BATCH, "gone")),
                       5, "the coordinator with no window and no remembered IDs to be deleted")
        self.assertFalse(d.exists)


class FlushCancelTest(ServerTest):
    def test_flush_window(self):
        r = self.send("k", debounce(60000), '{"x":"y"}')
        f = self.flush(DEBOUNCE, "k")
        self.assertTrue(f.flushed)
        self.assertEqual(f.run_id, r.receipt.run_id)
        run = self.get_run(r.receipt.run_id)
        self.assertEqual(run.status, R.RUN_STATUS_PENDING)
        self.assertEqual(run.attempts, 0)
        self.assertEqual(json.loads(run.input_json), {"x": "y"})
        again = self.flush(DEBOUNCE, "k")
        self.assertFalse(again.flushed, "no open window left to flush")
        self.assertEqual(again.run_id, "")
        self.assertFalse(self.flush(BATCH, "never").flushed)
        polled = self.poll_one(wait_ms=0)
        self.assertEqual(polled.run_id, r.receipt.run_id)
        self.assertEqual(list(self.poll(wait_ms=0)), [], "exactly one run per window")

    def test_cancel_window(self):
        r = self.send("k", batch(max_events=10, max_wait_ms=60000), "1", event_id="c1")
        self.send("k", batch(max_events=10, max_wait_ms=60000), "2", event_id="c2")
        c = self.cancel(BATCH, "k")
        self.assertTrue(c.cancelled)
        self.assertEqual(c.run_id, r.receipt.run_id)
        self.assertEqual(c.events_dropped, 2)
        self.assert_rpc_error(grpc.StatusCode.NOT_FOUND, self.get_run, r.receipt.run_id, field="run_id")
        self.assertEqual(list(self.poll(wait_ms=0)), [], "a cancelled window starts no run")
        d = self.describe(BATCH, "k")
        self.assertFalse(d.HasField("window"))
        self.assertEqual(d.runs_started, 0)
        self.assertEqual(d.journal[-1].what, "window_cancelled")
        self.assertEqual(d.journal[-1].run_id, r.receipt.run_id)
        again = self.cancel(BATCH, "k")
        self.assertFalse(again.cancelled)
        self.assertEqual(again.events_dropped, 0)
        self.assertFalse(self.flush(BATCH, "k").flushed)
        # A new event opens a new window with a new run ID.
        r3 = self.send("k", batch(max_events=10, max_wait_ms=60000), "3", event_id="c3")
        self.assertNotEqual(r3.receipt.run_id, r.receipt.run_id)


class RunsTest(ServerTest):
    # One partition: these tests hold runs of different keys to one order
    # (oldest first, creation order in ListRuns), which only one partition
    # has (harness.ONE_PARTITION). test_http_gateway's run tests use 8.
    server_args = harness.ONE_PARTITION
    # Polls of every workflow, ListRuns of everything, parked-poll gauges.
    fresh_server = True

    def start_run(self, key, input_json="1"):
        r = self.send(key, batch(max_events=1, max_wait_ms=60000), input_json)
        self.assertTrue(r.run_started)
        return r.receipt.run_id

    def test_poll_empty_answers_at_once_and_long_poll_times_out_empty(self):
        t = time.monotonic()
        self.assertEqual(list(self.poll(wait_ms=0)), [])
        self.assertLess(time.monotonic() - t, 2)
        t = time.monotonic()
        self.assertEqual(list(self.poll(wait_ms=300)), [])
        self.assertGreaterEqual(time.monotonic() - t, 0.25, "a long poll waits for wait_ms")

    def test_parked_long_poll_is_served_by_flush(self):
        self.send("k", debounce(60000), '"parked"')
        result = {}

        def worker():
            try:
                result["runs"] = self.poll(wait_ms=20000, worker="parked")
            except Exception as e:  # reported below
                result["error"] = e
            result["at"] = time.monotonic()

        th = threading.Thread(target=worker)
        th.start()
        try:
            wait_until(lambda: self.metric("keyflow_parked_polls") >= 1, 10, "the long poll to park")
            flushed_at = time.monotonic()
            self.assertTrue(self.flush(DEBOUNCE, "k").flushed)
        finally:
            th.join(30)
        self.assertNotIn("error", result)
        self.assertEqual(len(result["runs"]), 1)
        self.assertEqual(json.loads(result["runs"][0].input_json), "parked")
        self.assertLess(result["at"] - flushed_at, 3, "the parked poll should be answered at once")

    def test_abandoned_long_polls_do_not_take_runs(self):
        # A long poll whose client gave up (its deadline passed) or cancelled
        # is gone: a run created afterwards must go to a live worker, not be
        # leased to nobody (stuck LEASED for lease_ms, burning an attempt).
        # The server caps a long poll at the call's deadline, so the client
        # gets an empty answer just before it (or, if the answer is late,
        # DEADLINE_EXCEEDED); either way nothing was leased to it.
        try:
            early = self.runs.PollRuns(R.PollRunsRequest(workflows=[self.wf], worker_id="gone-deadline",
                                                         wait_ms=30000), timeout=0.3)
            self.assertEqual(list(early.runs), [])
        except grpc.RpcError as e:
            self.assertEqual(e.code(), grpc.StatusCode.DEADLINE_EXCEEDED)
        fut = self.runs.PollRuns.future(R.PollRunsRequest(workflows=[self.wf], worker_id="gone-cancelled",
                                                          wait_ms=30000), timeout=60)
        wait_until(lambda: self.metric("keyflow_parked_polls") >= 1, 10, "the second long poll to park")
        fut.cancel()
        # Give the server a bounded chance to notice; a server that only
        # skips dead polls when handing out a run passes as well.
        deadline = time.time() + 3
        while time.time() < deadline and self.metric("keyflow_parked_polls") > 0:
            time.sleep(0.05)
        parked = self.metric("keyflow_parked_polls")
        run_id = self.send("k", batch(max_events=1), '"work"').receipt.run_id
        runs = self.poll(wait_ms=5000, worker="live")
        got = self.get_run(run_id)
        self.assertEqual([r.run_id for r in runs], [run_id],
                         "the run went to an abandoned long poll: it is %s, worker_id=%r, attempts=%d, "
                         "lease_expires_ms=%d (%d abandoned polls still parked)"
                         % (R.RunStatus.Name(got.status), got.worker_id, got.attempts,
                            got.lease_expires_ms, parked))

    def test_many_long_polls_abandoned_at_once_are_all_cancelled(self):
        """600 long polls on two connections whose process is killed: more
        cancels at once than the engine used to keep (256), so some polls
        stayed parked and took the next runs. All must be cancelled, and a
        live worker gets the runs created afterwards."""
        import subprocess
        import textwrap
        child = textwrap.dedent("""
            import sys, time, grpc
            sys.path.insert(0, %(stubs)r)
            from keyflow.v1 import runs_pb2 as R, runs_pb2_grpc as RG
            futures = []
            for n in range(2):
                ch = grpc.insecure_channel(%(target)r, options=[("grpc.use_local_subchannel_pool", 1)])
                stub = RG.RunsStub(ch)
                for i in range(300):
                    futures.append(stub.PollRuns.future(R.PollRunsRequest(
                        workflows=[%(wf)r], worker_id="dead%%d" %% i, wait_ms=30000), timeout=60))
            print("sent", flush=True)
            time.sleep(120)
        """) % {"stubs": harness.stubs(), "target": self.server.grpc_target, "wf": self.wf}
        proc = subprocess.Popen([sys.executable, "-c", child], stdout=subprocess.PIPE)
        try:
            wait_until(lambda: self.metric("keyflow_parked_polls") >= 600, 30, "600 long polls to park")
        finally:
            proc.kill()
            proc.wait(10)
        wait_until(lambda: self.metric("keyflow_parked_polls") == 0, 10,
                   "every abandoned long poll to be cancelled")
        made = [self.start_run("k%d" % i) for i in range(5)]
        runs = self.poll(wait_ms=5000, max_runs=10, worker="live")
        self.assertEqual(sorted(r.run_id for r in runs), sorted(made))

    def test_poll_filters_by_workflow_and_max_runs(self):
        for i in range(3):
            self.start_run("k%d" % i, str(i))
        other = self.send("k", batch(max_events=1, max_wait_ms=60000), '"other"', workflow=self.wf + "-b")
        self.assertEqual(list(self.poll(wait_ms=0, workflows=[self.wf + "-none"])), [])
        runs = self.poll(wait_ms=0, max_runs=10)
        self.assertEqual([json.loads(r.input_json) for r in runs], [[0], [1], [2]],
                         "pending runs are handed out oldest first")
        runs = self.poll(wait_ms=0, max_runs=10, workflows=[])
        self.assertEqual([r.run_id for r in runs], [other.receipt.run_id])

    def test_heartbeat_and_complete_with_result(self):
        run_id = self.start_run("k", '{"job":1}')
        run = self.poll_one(wait_ms=0, lease_ms=2000)
        self.assertEqual(run.run_id, run_id)
        self.assertEqual(run.status, R.RUN_STATUS_LEASED)
        self.assertEqual(run.attempts, 1)
        before = now_ms()
        hb = self.runs.HeartbeatRun(R.HeartbeatRunRequest(run_id=run_id, lease=run.lease, lease_ms=60000),
                                    timeout=10)
        self.assertGreaterEqual(hb.lease_expires_ms, before + 60000 - CLOCK_SLACK_MS)
        self.assertLessEqual(hb.lease_expires_ms, now_ms() + 60000 + CLOCK_SLACK_MS)
        self.assertGreater(hb.lease_expires_ms, run.lease_expires_ms)
        got = self.get_run(run_id)
        self.assertEqual(got.lease_expires_ms, hb.lease_expires_ms)
        self.assertEqual(got.lease, "", "GetRun must not reveal the lease token")
        # Heartbeat without lease_ms: the length the lease was granted with
        # (2 s), not the 60 s the heartbeat above asked for once.
        before = now_ms()
        hb2 = self.runs.HeartbeatRun(R.HeartbeatRunRequest(run_id=run_id, lease=run.lease), timeout=10)
        self.assertGreaterEqual(hb2.lease_expires_ms, before + 2000 - CLOCK_SLACK_MS)
        self.assertLessEqual(hb2.lease_expires_ms, now_ms() + 2000 + CLOCK_SLACK_MS)
        done = self.complete(run_id, run.lease, result_json='{"ok": true}')
        self.assertFalse(done.already_finished)
        self.assertEqual(done.run.status, R.RUN_STATUS_COMPLETED)
        self.assertEqual(json.loads(done.run.result_json), {"ok": True})
        self.assertGreater(done.run.finished_ms, 0)
        got = self.get_run(run_id)
        self.assertEqual(got.status, R.RUN_STATUS_COMPLETED)
        self.assertEqual(json.loads(got.result_json), {"ok": True})
        self.assertEqual(got.attempts, 1)
        self.assertEqual(got.worker_id, "w1")
        self.assertEqual(json.loads(got.input_json), [{"job": 1}])
        # A retry of the same completion is acknowledged; another outcome is not.
        retry = self.complete(run_id, run.lease, result_json='{"ok": true}')
        self.assertTrue(retry.already_finished)
        self.assertEqual(retry.run.status, R.RUN_STATUS_COMPLETED)
        self.assert_rpc_error(grpc.StatusCode.FAILED_PRECONDITION, self.complete, run_id, run.lease,
                              error="changed my mind")
        self.assert_rpc_error(grpc.StatusCode.FAILED_PRECONDITION, self.runs.HeartbeatRun,
                              R.HeartbeatRunRequest(run_id=run_id, lease=run.lease), timeout=10)
        self.assertEqual(list(self.poll(wait_ms=0)), [])

    def test_complete_with_error(self):
        run_id = self.start_run("k")
        run = self.poll_one(wait_ms=0)
        done = self.complete(run_id, run.lease, error="boom: disk on fire")
        self.assertEqual(done.run.status, R.RUN_STATUS_FAILED)
        self.assertEqual(done.run.error, "boom: disk on fire")
        got = self.get_run(run_id)
        self.assertEqual(got.status, R.RUN_STATUS_FAILED)
        self.assertEqual(got.error, "boom: disk on fire")
        self.assertEqual(got.result_json, "")
        self.assertTrue(self.complete(run_id, run.lease, error="boom: disk on fire").already_finished)

    def test_complete_validation(self):
        run_id = self.start_run("k")
        run = self.poll_one(wait_ms=0)
        self.assert_rpc_error(grpc.StatusCode.INVALID_ARGUMENT, self.complete, run_id, run.lease,
                              field="outcome")
        self.assert_rpc_error(grpc.StatusCode.INVALID_ARGUMENT, self.complete, run_id, run.lease,
                              result_json="{nope", field="result")
        self.assert_rpc_error(grpc.StatusCode.INVALID_ARGUMENT, self.complete, run_id, run.lease,
                              error="", field="error")
        self.assert_rpc_error(grpc.StatusCode.INVALID_ARGUMENT, self.complete, run_id, "short",
                              result_json="1", field="lease")
        self.assertEqual(self.get_run(run_id).status, R.RUN_STATUS_LEASED, "refused calls change nothing")

    def test_wrong_lease_is_failed_precondition(self):
        run_id = self.start_run("k")
        run = self.poll_one(wait_ms=0)
        wrong = str(uuid.uuid4())
        self.assertNotEqual(wrong, run.lease)
        err = self.assert_rpc_error(grpc.StatusCode.FAILED_PRECONDITION, self.complete, run_id, wrong,
                                    result_json="1")
        self.assertIn("lease", err.details())
        err = self.assert_rpc_error(grpc.StatusCode.FAILED_PRECONDITION, self.runs.HeartbeatRun,
                                    R.HeartbeatRunRequest(run_id=run_id, lease=wrong), timeout=10)
        self.assertIn("lease", err.details())
        got = self.get_run(run_id)
        self.assertEqual(got.status, R.RUN_STATUS_LEASED)
        self.assertEqual(got.lease_expires_ms, run.lease_expires_ms, "a refused heartbeat changes nothing")
        self.assertEqual(self.complete(run_id, run.lease, result_json="1").run.status,
                         R.RUN_STATUS_COMPLETED)

    def test_get_unknown_run_is_not_found(self):
        self.assert_rpc_error(grpc.StatusCode.NOT_FOUND, self.get_run, "k@" + str(uuid.uuid4()),
                              field="run_id")
        self.assert_rpc_error(grpc.StatusCode.INVALID_ARGUMENT, self.get_run, "", field="run_id")
        self.assert_rpc_error(grpc.StatusCode.NOT_FOUND, self.complete, "k@" + str(uuid.uuid4()),
                              str(uuid.uuid4()), result_json="1", field="run_id")

    def test_list_runs_paging_and_status_filter(self):
        ids = [self.start_run("k%d" % i, str(i)) for i in range(5)]
        other = self.send("x", batch(max_events=1, max_wait_ms=60000), "9", workflow=self.wf + "-z")
        leased = self.poll(wait_ms=0, max_runs=2)
        self.assertEqual([r.run_id for r in leased], ids[:2])
        self.complete(ids[0], leased[0].lease, result_json='"done"')

        def list_all(**kw):
            seen, token, pages = [], "", 0
            while True:
                resp = self.runs.ListRuns(R.ListRunsRequest(page_token=token, **kw), timeout=10)
                pages += 1
                seen.extend(resp.runs)
                token = resp.next_page_token
                if not token:
                    return seen, pages
                self.assertLess(pages, 50, "paging does not terminate")

        runs, pages = list_all(workflow=self.wf, page_size=2)
        self.assertEqual([r.run_id for r in runs], ids, "every run once, in creation order")
        self.assertGreaterEqual(pages, 3)
        first = self.runs.ListRuns(R.ListRunsRequest(workflow=self.wf, page_size=2), timeout=10)
        self.assertEqual(len(first.runs), 2)
        self.assertNotEqual(first.next_page_token, "")
        statuses = {r.run_id: r.status for r in runs}
        self.assertEqual(statuses[ids[0]], R.RUN_STATUS_COMPLETED)
        self.assertEqual(statuses[ids[1]], R.RUN_STATUS_LEASED)
        self.assertEqual({statuses[i] for i in ids[2:]}, {R.RUN_STATUS_PENDING})
        self.assertTrue(all(r.lease == "" for r in runs), "ListRuns must not reveal lease tokens")

        pending, _ = list_all(workflow=self.wf, status=R.RUN_STATUS_PENDING, page_size=1)
        self.assertEqual([r.run_id for r in pending], ids[2:])
        completed, _ = list_all(workflow=self.wf, status=R.RUN_STATUS_COMPLETED)
        self.assertEqual([r.run_id for r in completed], ids[:1])
        self.assertEqual(json.loads(completed[0].result_json), "done")
        leased_list, _ = list_all(workflow=self.wf, status=R.RUN_STATUS_LEASED)
        self.assertEqual([r.run_id for r in leased_list], ids[1:2])
        failed, _ = list_all(workflow=self.wf, status=R.RUN_STATUS_FAILED)
        self.assertEqual(failed, [])
        everything, _ = list_all(page_size=4)
        self.assertEqual(sorted(r.run_id for r in everything), sorted(ids + [other.receipt.run_id]))

        self.assert_rpc_error(grpc.StatusCode.INVALID_ARGUMENT, self.runs.ListRuns,
                              R.ListRunsRequest(page_token="not-a-token"), timeout=10, field="page_token")
        self.assert_rpc_error(grpc.StatusCode.INVALID_ARGUMENT, self.runs.ListRuns,
                              R.ListRunsRequest(page_size=1001), timeout=10, field="page_size")


class LeaseExpiryTest(ServerTest):
    server_args = ["--run-attempts", "2"]

    def test_expired_lease_makes_run_pending_again_then_failed(self):
        r = self.send("k", batch(max_events=1, max_wait_ms=60000), '"work"')
        run_id = r.receipt.run_id
        first = self.poll_one(wait_ms=0, lease_ms=100)
        self.assertEqual(first.attempts, 1)

        def status_is(st):
            def check():
                got = self.get_run(run_id)
                return got if got.status == st else None
            return check

        pending = wait_until(status_is(R.RUN_STATUS_PENDING), 10,
                             "run %s to be PENDING again after its 100 ms lease expired" % run_id)
        self.assertEqual(pending.attempts, 1)
        self.assertEqual(pending.lease_expires_ms, 0)
        self.assert_rpc_error(grpc.StatusCode.FAILED_PRECONDITION, self.complete, run_id, first.lease,
                              result_json="1", field="lease")
        second = self.poll_one(wait_ms=5000, lease_ms=100, worker="w2")
        self.assertEqual(second.run_id, run_id)
        self.assertEqual(second.attempts, 2)
        self.assertEqual(second.worker_id, "w2")
        self.assertNotEqual(second.lease, first.lease, "a lease is a fresh token per attempt")
        self.assertEqual(self.get_run(run_id).attempts, 2)
        # The second expiry is the last attempt (--run-attempts 2): FAILED.
        failed = wait_until(status_is(R.RUN_STATUS_FAILED), 10,
                            "run %s to FAIL after its last lease expired" % run_id)
        self.assertEqual(failed.attempts, 2)
        self.assertIn("lease expired", failed.error)
        self.assertEqual(list(self.poll(wait_ms=0)), [])


class RedeliveryOrderTest(ServerTest):
    # One partition: runs of keys "a" and "b" held to one order
    # (harness.ONE_PARTITION).
    server_args = harness.ONE_PARTITION

    def test_expired_run_goes_ahead_of_newer_pending_runs(self):
        a = self.send("a", batch(max_events=1), '"a"').receipt.run_id
        leased = self.poll_one(wait_ms=0, lease_ms=100)
        self.assertEqual(leased.run_id, a)
        b = self.send("b", batch(max_events=1), '"b"').receipt.run_id
        wait_until(lambda: self.get_run(a).status == R.RUN_STATUS_PENDING, 10, "run a's lease to expire")
        runs = self.poll(wait_ms=0, max_runs=10)
        self.assertEqual([r.run_id for r in runs], [a, b], "pending runs go out oldest first (by creation)")
        self.assertEqual([r.attempts for r in runs], [2, 1])


class RetentionTest(ServerTest):
    server_args = ["--run-retention-ms", "1000"]

    def test_finished_runs_are_deleted_after_retention(self):
        run_id = self.send("k", batch(max_events=1), "1").receipt.run_id
        run = self.poll_one(wait_ms=0)
        done = self.complete(run_id, run.lease, result_json="1")
        finished = done.run.finished_ms
        self.assertEqual(self.get_run(run_id).status, R.RUN_STATUS_COMPLETED)

        def gone():
            try:
                self.get_run(run_id)
                return False
            except grpc.RpcError as e:
                return e.code() == grpc.StatusCode.NOT_FOUND

        wait_until(gone, 15, "the finished run to be deleted after --run-retention-ms 1000")
        self.assertGreaterEqual(now_ms(), finished + 1000 - CLOCK_SLACK_MS, "deleted before its retention ended")
        self.assertEqual(list(self.runs.ListRuns(R.ListRunsRequest(workflow=self.wf), timeout=10).runs), [])


class InvalidInputTest(ServerTest):
    # "Nothing was created" is checked server-wide (gauges, ListRuns).
    fresh_server = True

    def test_invalid_send_event_changes_nothing(self):
        good = debounce(1000)
        cases = [
            # (name, request kwargs, expected code, field named in the message)
            ("empty key", dict(key="", rule=good), grpc.StatusCode.INVALID_ARGUMENT, "key"),
            ("empty workflow", dict(workflow="", rule=good), grpc.StatusCode.INVALID_ARGUMENT, "workflow"),
            ("max_events 0", dict(rule=batch(max_events=0)), grpc.StatusCode.INVALID_ARGUMENT, "max_events"),
            ("max_events 10001", dict(rule=batch(max_events=10001)), grpc.StatusCode.INVALID_ARGUMENT,
             "max_events"),
            ("window_ms 0", dict(rule=debounce(0)), grpc.StatusCode.INVALID_ARGUMENT, "window_ms"),
            ("debounce without window_ms", dict(rule=C.Rule(kind=DEBOUNCE)),
             grpc.StatusCode.INVALID_ARGUMENT, "window_ms"),
            ("negative max_wait_ms", dict(rule=debounce(100, max_wait_ms=-1)),
             grpc.StatusCode.INVALID_ARGUMENT, "max_wait_ms"),
            ("batch max_wait_ms 0", dict(rule=batch(max_wait_ms=0)), grpc.StatusCode.INVALID_ARGUMENT,
             "max_wait_ms"),
            ("negative dedup_ms", dict(rule=batch(dedup_ms=-5)), grpc.StatusCode.INVALID_ARGUMENT,
             "dedup_ms"),
            ("window_ms on a batch rule", dict(rule=C.Rule(kind=BATCH, window_ms=10)),
             grpc.StatusCode.INVALID_ARGUMENT, "window_ms"),
            ("unknown rule kind", dict(rule=C.Rule(kind=7, window_ms=10)), grpc.StatusCode.INVALID_ARGUMENT,
             "kind"),
            ("unspecified rule kind", dict(rule=C.Rule(window_ms=10)), grpc.StatusCode.INVALID_ARGUMENT,
             "kind"),
            ("missing rule", dict(rule=None), grpc.StatusCode.INVALID_ARGUMENT, "rule"),
            ("invalid JSON input", dict(rule=good, input_json='{"a":'), grpc.StatusCode.INVALID_ARGUMENT,
             "input"),
            ("two JSON values", dict(rule=good, input_json='1 2'), grpc.StatusCode.INVALID_ARGUMENT,
             "input"),
            ("key with a control character", dict(key="a\nb", rule=good), grpc.StatusCode.INVALID_ARGUMENT,
             "key"),
            ("oversized key", dict(key="k" * 300, rule=good), grpc.StatusCode.RESOURCE_EXHAUSTED, "key"),
            ("oversized workflow", dict(workflow="w" * 129, rule=good), grpc.StatusCode.RESOURCE_EXHAUSTED,
             "workflow"),
            ("oversized event id", dict(event_id="i" * 129, rule=good), grpc.StatusCode.RESOURCE_EXHAUSTED,
             "id"),
            ("oversized input", dict(rule=good, input_json='"' + "x" * (256 * 1024) + '"'),
             grpc.StatusCode.RESOURCE_EXHAUSTED, "input"),
        ]
        for name, kw, code, field in cases:
            with self.subTest(name):
                workflow = kw.get("workflow", self.wf)
                key = kw.get("key", "bad")
                rule = kw.get("rule")
                event = C.Event(id=kw.get("event_id", "ev-1"), input_json=kw.get("input_json", '{"ok":1}'))
                if rule is not None:
                    event.rule.CopyFrom(rule)
                req = C.SendEventRequest(workflow=workflow, key=key, event=event)
                self.assert_rpc_error(code, self.coords.SendEvent, req, timeout=10, field=field)
                for kind in (DEBOUNCE, BATCH):
                    if name in ("empty key", "empty workflow", "key with a control character",
                                "oversized key", "oversized workflow"):
                        continue  # not a name DescribeCoordinator takes; the gauges below cover it
                    self.assertFalse(self.describe(kind, key, workflow=workflow).exists,
                                     "a refused event must create no coordinator")
        # Nothing at all was created by any refused request.
        self.assertEqual(self.metric("keyflow_coordinators"), 0)
        self.assertEqual(self.metric("keyflow_open_windows"), 0)
        self.assertEqual(self.metric("keyflow_events_accepted_total"), 0)
        self.assertEqual(list(self.runs.ListRuns(R.ListRunsRequest(), timeout=10).runs), [])
        # And the same coordinator accepts a valid event afterwards.
        ok = self.send("bad", good, '{"ok":1}', event_id="ev-1")
        self.assertFalse(ok.duplicate, "a refused event's ID must not have been remembered")

    def test_invalid_refs_and_polls(self):
        self.assert_rpc_error(grpc.StatusCode.INVALID_ARGUMENT, self.coords.DescribeCoordinator,
                              C.DescribeCoordinatorRequest(coordinator=C.CoordinatorRef(
                                  kind=BATCH, workflow=self.wf, key="")), timeout=10, field="key")
        self.assert_rpc_error(grpc.StatusCode.INVALID_ARGUMENT, self.coords.FlushWindow,
                              C.FlushWindowRequest(coordinator=C.CoordinatorRef(workflow=self.wf, key="k")),
                              timeout=10, field="kind")
        self.assert_rpc_error(grpc.StatusCode.INVALID_ARGUMENT, self.coords.CancelWindow,
                              C.CancelWindowRequest(), timeout=10, field="coordinator")
        self.assert_rpc_error(grpc.StatusCode.INVALID_ARGUMENT, self.runs.PollRuns,
                              R.PollRunsRequest(worker_id=""), timeout=10, field="worker_id")
        self.assert_rpc_error(grpc.StatusCode.INVALID_ARGUMENT, self.runs.PollRuns,
                              R.PollRunsRequest(worker_id="w", lease_ms=99), timeout=10, field="lease_ms")
        self.assert_rpc_error(grpc.StatusCode.INVALID_ARGUMENT, self.runs.PollRuns,
                              R.PollRunsRequest(worker_id="w", wait_ms=60001), timeout=10, field="wait_ms")
        self.assert_rpc_error(grpc.StatusCode.INVALID_ARGUMENT, self.runs.PollRuns,
                              R.PollRunsRequest(worker_id="w", max_runs=101), timeout=10, field="max_runs")


class HealthTest(ServerTest):
    def test_standard_health_check(self):
        health = health_pb2_grpc.HealthStub(self.channel)
        resp = health.Check(health_pb2.HealthCheckRequest(), timeout=10)
        self.assertEqual(resp.status, health_pb2.HealthCheckResponse.SERVING)
        resp = health.Check(health_pb2.HealthCheckRequest(service="keyflow.v1.Coordinators"), timeout=10)
        self.assertEqual(resp.status, health_pb2.HealthCheckResponse.SERVING)
        with self.assertRaises(grpc.RpcError) as cm:
            health.Check(health_pb2.HealthCheckRequest(service="no.such.Service"), timeout=10)
        self.assertEqual(cm.exception.code(), grpc.StatusCode.NOT_FOUND)

    def test_grpc_requests_are_counted_in_metrics(self):
        labels = 'keyflow_requests_total{method="SendEvent",transport="grpc",code="%s"}'
        codes = ("OK", "INVALID_ARGUMENT")
        # The server is shared by the class: counted from here on (a code
        # not seen yet may have no sample before).
        before = [self.metric(labels % code, absent=0) for code in codes]
        self.send("m", debounce(60000), "1")
        self.send("m", debounce(60000), "2")
        with self.assertRaises(grpc.RpcError):
            self.send("m", debounce(0), "3")
        after = [self.metric(labels % code) for code in codes]
        self.assertEqual(after[0] - before[0], 2, "one OK sample per request")
        self.assertEqual(after[1] - before[1], 1)

    def test_a_unary_call_without_its_message_is_refused(self):
        # A client that half-closes without sending the request (here: the
        # unary method called as client streaming with no messages) must
        # not have the default request run in its place.
        call = self.channel.stream_unary("/keyflow.v1.Coordinators/SendEvent")
        with self.assertRaises(grpc.RpcError) as cm:
            call(iter([]), timeout=10)
        self.assertEqual(cm.exception.code(), grpc.StatusCode.INVALID_ARGUMENT)
        self.assertIn("no keyflow.v1.SendEventRequest message was received", cm.exception.details())
        # An empty request is a message of zero bytes, and is still fine.
        health = self.channel.unary_unary("/grpc.health.v1.Health/Check")
        self.assertEqual(health(b"", timeout=10), b"\x08\x01")  # status: SERVING

    def test_unknown_method_is_unimplemented(self):
        call = self.channel.unary_unary("/keyflow.v1.Coordinators/NoSuchMethod")
        with self.assertRaises(grpc.RpcError) as cm:
            call(b"", timeout=10)
        self.assertEqual(cm.exception.code(), grpc.StatusCode.UNIMPLEMENTED)


if __name__ == "__main__":
    unittest.main()
