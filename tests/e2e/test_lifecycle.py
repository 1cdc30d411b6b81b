"""Lifecycle tests of the real keyflowd: SIGTERM (graceful stop, exit 0),
restarts and crashes (SIGKILL) over one data directory. Acknowledged state
(open windows, remembered IDs, pending and leased runs) survives; a window
that falls due while the server is down closes once right after the restart,
never twice.

Run (Debian's Python):
  cd /work/main && KEYFLOW_BUILD_DIR=build-e2e PYENV_VERSION=system \
      python3 -m unittest discover -s tests/e2e -p 'test_lifecycle.py' -v
"""

import json
import re
import os
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
from keyflow.v1 import coordinators_pb2 as C  # noqa: E402
from keyflow.v1 import coordinators_pb2_grpc as CG  # noqa: E402
from keyflow.v1 import runs_pb2 as R  # noqa: E402
from keyflow.v1 import runs_pb2_grpc as RG  # noqa: E402

DEBOUNCE = C.RULE_KIND_DEBOUNCE
BATCH = C.RULE_KIND_BATCH


def now_ms():
    return int(time.time() * 1000)


class Lifecycle(harness.ServerTest):
    """The helpers; each test works in a workflow of its own."""

    def setUp(self):
        super().setUp()
        self.channel = None
        self.connect()
        self.addCleanup(lambda: self.channel and self.channel.close())
        self.wf = "wf-" + uuid.uuid4().hex[:8]

    def connect(self):
        if self.channel is not None:
            self.channel.close()
        self.channel = grpc.insecure_channel(self.server.grpc_target)
        self.coords = CG.CoordinatorsStub(self.channel)
        self.runs = RG.RunsStub(self.channel)

    def restart(self, crash=False):
        if crash:
            self.server.kill()
        else:
            self.assertEqual(self.server.stop(), 0, "SIGTERM must exit 0")
        self.server.start()
        self.connect()

    # --- helpers ---------------------------------------------------------
    def send(self, key, rule, input_json="null", event_id="", timeout=10):
        return self.coords.SendEvent(C.SendEventRequest(
            workflow=self.wf, key=key, event=C.Event(id=event_id, rule=rule, input_json=input_json)),
            timeout=timeout)

    def describe(self, kind, key):
        return self.coords.DescribeCoordinator(C.DescribeCoordinatorRequest(
            coordinator=C.CoordinatorRef(kind=kind, workflow=self.wf, key=key)), timeout=10)

    def poll(self, wait_ms=0, lease_ms=0, max_runs=0, worker="w1", timeout=30):
        return list(self.runs.PollRuns(R.PollRunsRequest(
            workflows=[self.wf], worker_id=worker, lease_ms=lease_ms, max_runs=max_runs,
            wait_ms=wait_ms), timeout=timeout).runs)

    def get_run(self, run_id):
        return self.runs.GetRun(R.GetRunRequest(run_id=run_id), timeout=10)

    def list_runs(self):
        out, token = [], ""
        while True:
            resp = self.runs.ListRuns(R.ListRunsRequest(workflow=self.wf, page_token=token), timeout=10)
            out.extend(resp.runs)
            token = resp.next_page_token
            if not token:
                return out


class RestartTest(Lifecycle):
    """Restarts and crashes of one keyflowd shared by the class: what each
    test's workflow holds survives them."""

    def check_restart_keeps_state(self, crash):
        deb = C.Rule(kind=DEBOUNCE, window_ms=600000)
        bat = C.Rule(kind=BATCH, max_events=10, max_wait_ms=600000)
        d1 = self.send("deb", deb, '{"v":1}', event_id="d1")
        d2 = self.send("deb", deb, '{"v":2}', event_id="d2")
        b = [self.send("bat", bat, str(i), event_id="b%d" % i) for i in range(3)]
        # Three runs: one COMPLETED, one LEASED, one PENDING.
        # Each run is sent just before it is polled: runs of different keys
        # (partitions) have no order between them.
        completed = self.send("c", C.Rule(kind=BATCH, max_events=1), '"completed"', event_id="c1")
        first = self.poll(wait_ms=0, lease_ms=600000, max_runs=1)
        self.assertEqual([r.run_id for r in first], [completed.receipt.run_id])
        done = self.runs.CompleteRun(R.CompleteRunRequest(run_id=completed.receipt.run_id,
                                                          lease=first[0].lease, result_json='"ok"'), timeout=10)
        self.assertEqual(done.run.status, R.RUN_STATUS_COMPLETED)
        leased_src = self.send("l", C.Rule(kind=BATCH, max_events=1), '"leased"', event_id="l1")
        self.assertTrue(completed.run_started and leased_src.run_started)
        leased = self.poll(wait_ms=0, lease_ms=600000, max_runs=1)
        self.assertEqual([r.run_id for r in leased], [leased_src.receipt.run_id])
        still_pending = self.send("q", C.Rule(kind=BATCH, max_events=1), '"queued"', event_id="q1")
        before_deb = self.describe(DEBOUNCE, "deb")
        before_bat = self.describe(BATCH, "bat")

        self.restart(crash=crash)

        after_deb = self.describe(DEBOUNCE, "deb")
        self.assertTrue(after_deb.HasField("window"), "the open debounce window was lost")
        self.assertEqual(after_deb.window, before_deb.window)
        self.assertEqual(after_deb.window.run_id, d1.receipt.run_id)
        self.assertEqual(after_deb.window.event_count, 2)
        self.assertEqual(after_deb.window.due_ms, d2.receipt.due_ms)
        self.assertEqual(list(after_deb.remembered_ids), list(before_deb.remembered_ids))
        self.assertEqual(after_deb.journal_seq, before_deb.journal_seq)
        self.assertEqual(list(after_deb.journal), list(before_deb.journal))
        after_bat = self.describe(BATCH, "bat")
        self.assertEqual(after_bat.window, before_bat.window)
        self.assertEqual(after_bat.window.run_id, b[0].receipt.run_id)
        self.assertEqual(after_bat.window.event_count, 3)
        # Dedup survives: a retry gets its first receipt, and another payload
        # under the ID is still refused.
        retry = self.send("bat", bat, "1", event_id="b1")
        self.assertTrue(retry.duplicate)
        self.assertEqual(retry.receipt, b[1].receipt)
        with self.assertRaises(grpc.RpcError) as conflict:
            self.send("bat", bat, "99", event_id="b1")
        self.assertEqual(conflict.exception.code(), grpc.StatusCode.ALREADY_EXISTS)
        # Commit sequences keep increasing across the restart.
        after = self.send("bat", bat, "4", event_id="b4")
        self.assertGreater(after.receipt.commit_seq, max(x.receipt.commit_seq for x in b))
        # Runs: PENDING stays PENDING, LEASED stays LEASED with its lease,
        # COMPLETED keeps its result.
        q = self.get_run(still_pending.receipt.run_id)
        self.assertEqual(q.status, R.RUN_STATUS_PENDING)
        lr = self.get_run(leased_src.receipt.run_id)
        self.assertEqual(lr.status, R.RUN_STATUS_LEASED)
        self.assertEqual(lr.attempts, 1)
        self.assertEqual(lr.lease_expires_ms, leased[0].lease_expires_ms)
        c = self.get_run(completed.receipt.run_id)
        self.assertEqual(c.status, R.RUN_STATUS_COMPLETED)
        self.assertEqual(json.loads(c.result_json), "ok")
        # The lease held before the restart still completes the run.
        done = self.runs.CompleteRun(R.CompleteRunRequest(run_id=leased_src.receipt.run_id,
                                                          lease=leased[0].lease, result_json='1'), timeout=10)
        self.assertEqual(done.run.status, R.RUN_STATUS_COMPLETED)
        # The pending run is handed out, once.
        got = self.poll(wait_ms=0, max_runs=10)
        self.assertEqual([r.run_id for r in got], [still_pending.receipt.run_id])
        # The windows go on: new events join them, flushing gives all inputs.
        self.send("bat", bat, "3", event_id="b3")
        f = self.coords.FlushWindow(C.FlushWindowRequest(coordinator=C.CoordinatorRef(
            kind=BATCH, workflow=self.wf, key="bat")), timeout=10)
        self.assertEqual(f.run_id, b[0].receipt.run_id)
        self.assertEqual(json.loads(self.get_run(f.run_id).input_json), [0, 1, 2, 4, 3])

    def test_restart_keeps_open_windows_and_runs(self):
        self.check_restart_keeps_state(crash=False)

    def test_crash_keeps_open_windows_and_runs(self):
        self.check_restart_keeps_state(crash=True)

    def check_overdue_window_closes_once(self, crash):
        d = self.send("deb", C.Rule(kind=DEBOUNCE, window_ms=300), '{"last":true}', event_id="x1")
        b = self.send("bat", C.Rule(kind=BATCH, max_events=100, max_wait_ms=300), '"b"', event_id="y1")
        due = max(d.receipt.due_ms, b.receipt.due_ms)
        if crash:
            self.server.kill()
        else:
            self.assertEqual(self.server.stop(), 0)
        # Nothing runs while the server is down: waiting for the due time to
        # pass on the wall clock is the point of this test.
        wait_until(lambda: now_ms() > due + 100, 10, "the windows' due time to pass while the server is down")
        self.server.start()
        self.connect()
        got = self.poll(wait_ms=10000, max_runs=1, lease_ms=600000)
        got += self.poll(wait_ms=10000, max_runs=1, lease_ms=600000)
        self.assertEqual(sorted(r.run_id for r in got), sorted([d.receipt.run_id, b.receipt.run_id]))
        by_id = {r.run_id: r for r in got}
        self.assertEqual(json.loads(by_id[d.receipt.run_id].input_json), {"last": True})
        self.assertEqual(json.loads(by_id[b.receipt.run_id].input_json), ["b"])
        self.assertEqual(self.poll(wait_ms=300), [], "each overdue window starts exactly one run")
        for kind, key in ((DEBOUNCE, "deb"), (BATCH, "bat")):
            desc = self.describe(kind, key)
            self.assertFalse(desc.HasField("window"))
            self.assertEqual(desc.runs_started, 1)
            self.assertEqual(sum(1 for j in desc.journal if j.what == "run_started"), 1)

        # A second restart (and a crash after it) does not start them again.
        self.restart(crash=False)
        self.restart(crash=True)
        runs = self.list_runs()
        self.assertEqual(sorted(r.run_id for r in runs), sorted([d.receipt.run_id, b.receipt.run_id]),
                         "a restart must not create a second run")
        for r in runs:
            self.assertEqual(r.status, R.RUN_STATUS_LEASED)
            self.assertEqual(r.attempts, 1)
        self.assertEqual(self.poll(wait_ms=300), [])
        for kind, key in ((DEBOUNCE, "deb"), (BATCH, "bat")):
            self.assertEqual(self.describe(kind, key).runs_started, 1)

    def test_window_due_while_stopped_closes_once_after_restart(self):
        self.check_overdue_window_closes_once(crash=False)

    def test_window_due_while_crashed_closes_once_after_restart(self):
        self.check_overdue_window_closes_once(crash=True)

    def test_crash_after_journal_compaction_keeps_state(self):
        # 600 events on one key: the journal compacts (snapshot + deleted
        # entries) twice; recovery = snapshot + the remaining entries.
        rule = C.Rule(kind=BATCH, max_events=10000, max_wait_ms=3600000)
        errors = []

        def worker(t):
            ch = grpc.insecure_channel(self.server.grpc_target)
            stub = CG.CoordinatorsStub(ch)
            try:
                for i in range(t, 600, 6):
                    stub.SendEvent(C.SendEventRequest(workflow=self.wf, key="long", event=C.Event(
                        id="e%d" % i, rule=rule, input_json=str(i))), timeout=30)
            except grpc.RpcError as e:
                errors.append(e)
            finally:
                ch.close()

        threads = [threading.Thread(target=worker, args=(t,)) for t in range(6)]
        for th in threads:
            th.start()
        for th in threads:
            th.join(120)
        self.assertEqual(errors, [])
        before = self.describe(BATCH, "long")
        self.assertGreaterEqual(before.compactions, 2)
        self.assertEqual(before.journal_seq, 600)
        self.restart(crash=True)
        after = self.describe(BATCH, "long")
        self.assertEqual(after.window, before.window)
        self.assertEqual(after.journal_seq, before.journal_seq)
        self.assertEqual(after.journal_length, before.journal_length)
        self.assertEqual(after.compactions, before.compactions)
        self.assertEqual(list(after.journal), list(before.journal))
        self.assertEqual(sorted(m.id for m in after.remembered_ids), sorted(m.id for m in before.remembered_ids))
        self.assertTrue(self.send("long", rule, "0", event_id="e0").duplicate)
        f = self.coords.FlushWindow(C.FlushWindowRequest(coordinator=C.CoordinatorRef(
            kind=BATCH, workflow=self.wf, key="long")), timeout=10)
        self.assertEqual(f.run_id, before.window.run_id)
        items = json.loads(self.get_run(f.run_id).input_json)
        self.assertEqual(sorted(items), list(range(600)), "every acknowledged input, once")

    def test_remembered_ids_expire_across_restart(self):
        short = C.Rule(kind=BATCH, max_events=1, dedup_ms=300)
        long_ = C.Rule(kind=BATCH, max_events=1, dedup_ms=600000)
        s1 = self.send("both", short, '"s"', event_id="short")
        l1 = self.send("both", long_, '"l"', event_id="long")
        self.send("only-short", short, '"s"', event_id="short")
        expiry = max(m.expires_ms for m in self.describe(BATCH, "only-short").remembered_ids)
        self.assertEqual(self.server.stop(), 0)
        wait_until(lambda: now_ms() > expiry + 50, 10, "the short dedup span to pass while the server is down")
        self.server.start()
        self.connect()
        d = self.describe(BATCH, "both")
        self.assertEqual([m.id for m in d.remembered_ids], ["long"])
        wait_until(lambda: not self.describe(BATCH, "only-short").exists, 10,
                   "the coordinator whose only remembered ID expired to be deleted after the restart")
        again_long = self.send("both", long_, '"l"', event_id="long")
        self.assertTrue(again_long.duplicate)
        self.assertEqual(again_long.receipt, l1.receipt)
        again_short = self.send("both", short, '"s2"', event_id="short")
        self.assertFalse(again_short.duplicate, "an expired ID is new again after the restart")
        self.assertNotEqual(again_short.receipt.run_id, s1.receipt.run_id)

    def test_lease_expiring_while_down_makes_run_pending_after_restart(self):
        r = self.send("k", C.Rule(kind=BATCH, max_events=1), '"job"')
        leased = self.poll(wait_ms=0, lease_ms=300)
        self.assertEqual(len(leased), 1)
        self.assertEqual(self.server.stop(), 0)
        wait_until(lambda: now_ms() > leased[0].lease_expires_ms + 100, 10, "the lease to expire while down")
        self.server.start()
        self.connect()

        def pending():
            run = self.get_run(r.receipt.run_id)
            return run if run.status == R.RUN_STATUS_PENDING else None

        run = wait_until(pending, 10, "the run whose lease expired while the server was down to be PENDING")
        self.assertEqual(run.attempts, 1)
        again = self.poll(wait_ms=5000)
        self.assertEqual([x.run_id for x in again], [r.receipt.run_id])
        self.assertEqual(again[0].attempts, 2)
        self.assertNotEqual(again[0].lease, leased[0].lease)


class SigtermTest(Lifecycle):
    """SIGTERM of a new keyflowd for each test: its log and its parked polls
    (of every workflow) are the test's alone."""

    fresh_server = True

    def test_sigterm_exits_zero_after_finishing_in_flight_work(self):
        rule = C.Rule(kind=BATCH, max_events=10000, max_wait_ms=600000)
        acked, errors, sent = [], [], [0]
        stop = threading.Event()

        def producer():
            ch = grpc.insecure_channel(self.server.grpc_target)
            stub = CG.CoordinatorsStub(ch)
            i = 0
            while not stop.is_set() and i < 5000:
                i += 1
                sent[0] = i
                try:
                    stub.SendEvent(C.SendEventRequest(workflow=self.wf, key="load", event=C.Event(
                        id="e%d" % i, rule=rule, input_json=str(i))), timeout=10)
                    acked.append(i)
                except grpc.RpcError as e:
                    errors.append(e.code())
                    break
            ch.close()

        poll_result = {}

        def parked_poll():
            try:
                poll_result["runs"] = self.poll(wait_ms=30000, worker="parked", timeout=40)
            except grpc.RpcError as e:
                poll_result["error"] = e.code()
            poll_result["at"] = time.monotonic()

        poller = threading.Thread(target=parked_poll)
        poller.start()
        th = threading.Thread(target=producer)
        th.start()
        wait_until(lambda: len(acked) >= 50, 20, "50 acknowledged events before SIGTERM")
        t = time.monotonic()
        code = self.server.stop()
        stopped = time.monotonic()
        stop.set()
        th.join(30)
        poller.join(30)
        self.assertEqual(code, 0, "SIGTERM must exit 0")
        self.assertLess(stopped - t, 15, "shutdown must not wait for the 30 s long poll")
        self.assertIn("at", poll_result, "the parked long poll was never answered")
        self.assertLess(poll_result["at"] - t, 15)
        self.assertEqual(poll_result.get("runs", []), [], "the parked poll ends empty: %r" % poll_result)
        self.assertIn("stopped", self.server.read_log())
        # Everything acknowledged is there after the restart; nothing more
        # than was sent.
        self.server.start()
        self.connect()
        d = self.describe(BATCH, "load")
        self.assertTrue(d.HasField("window"))
        self.assertGreaterEqual(d.window.event_count, len(acked), "an acknowledged event was lost")
        self.assertLessEqual(d.window.event_count, sent[0])
        remembered = {m.id for m in d.remembered_ids}
        missing = ["e%d" % i for i in acked if "e%d" % i not in remembered]
        # At most 1024 remembered IDs per key: check the ones that can be.
        if len(acked) <= 1024:
            self.assertEqual(missing, [], "acknowledged event IDs lost")
        # The inputs are in order, with no gaps among the acknowledged ones.
        f = self.coords.FlushWindow(C.FlushWindowRequest(coordinator=C.CoordinatorRef(
            kind=BATCH, workflow=self.wf, key="load")), timeout=10)
        inputs = json.loads(self.get_run(f.run_id).input_json)
        self.assertEqual(inputs[:len(acked)], acked)
        self.assertEqual(inputs, list(range(1, len(inputs) + 1)))

    def test_sigterm_answers_parked_http_poll_and_health_watch(self):
        from grpc.health.v1 import health_pb2, health_pb2_grpc
        import subprocess
        res = {}
        url = self.server.http_base + "/v1/runs:poll"

        def http_poll():
            p = subprocess.run(["curl", "-s", "--max-time", "40", "-w", "\n%{http_code}", "-X", "POST",
                                "--data-binary", json.dumps({"workerId": "w", "waitMs": 30000}), url],
                               capture_output=True, timeout=60)
            res["http"] = p.stdout.decode()

        def watch():
            stub = health_pb2_grpc.HealthStub(self.channel)
            try:
                for m in stub.Watch(health_pb2.HealthCheckRequest(), timeout=40):
                    res.setdefault("watch", []).append(m.status)
                res["watch_end"] = "eof"
            except grpc.RpcError as e:
                res["watch_end"] = e.code()

        threads = [threading.Thread(target=http_poll), threading.Thread(target=watch)]
        for th in threads:
            th.start()
        # Parked in every partition (the gauge sums the partitions).
        wait_until(lambda: "watch" in res and re.search(
            r"\nkeyflow_parked_polls [1-9]\d*\n", self.server.http("GET", "/metrics")[1]),
            10, "the HTTP long poll to park and the watch to start")
        t = time.monotonic()
        self.assertEqual(self.server.stop(), 0)
        for th in threads:
            th.join(45)
        self.assertLess(time.monotonic() - t, 15, "shutdown waited for the long poll or the watch")
        self.assertEqual(res["watch"][0], health_pb2.HealthCheckResponse.SERVING)
        self.assertIn("watch_end", res, "the health watch stream was not ended by the shutdown")
        body, _, code = res["http"].rpartition("\n")
        self.assertIn(code, ("200", "503"), res["http"])
        if code == "200":
            self.assertEqual(json.loads(body), {"runs": []}, "a parked poll ends empty at shutdown")

    def test_sigterm_with_idle_and_unfinished_http_connections_exits_zero(self):
        """HTTP clients that keep a connection open (keep-alive after a
        request, connected but silent, half a body sent) must not stop a
        clean shutdown: the gateway closes them, and the process exits 0
        after its final sync ("stopped" in the log)."""
        import socket
        port = int(self.server.http_base.rsplit(":", 1)[1])
        socks = []
        keepalive = socket.create_connection(("127.0.0.1", port), timeout=10)
        keepalive.sendall(b"GET /healthz HTTP/1.1\r\nHost: localhost\r\n\r\n")
        self.assertTrue(keepalive.recv(64).startswith(b"HTTP/1.1 200"))
        socks.append(keepalive)
        socks.append(socket.create_connection(("127.0.0.1", port), timeout=10))
        half = socket.create_connection(("127.0.0.1", port), timeout=10)
        half.sendall(b"POST /v1/runs:poll HTTP/1.1\r\nHost: localhost\r\nContent-Length: 100\r\n\r\n{")
        socks.append(half)
        # One listener accepts in arrival order: once a fourth connection is
        # answered, the three above are open on the server's side.
        self.assertEqual(self.server.http("GET", "/healthz")[0], 200)
        try:
            self.assertEqual(self.server.stop(), 0, self.server.read_log()[-2000:])
            self.assertIn("stopped", self.server.read_log())
        finally:
            for s in socks:
                s.close()


class ProcessTest(unittest.TestCase):
    """Starts of keyflowd itself (no server of the class's own)."""

    def test_usage_errors_exit_2_before_opening_anything(self):
        """Bad flags and addresses are usage errors: exit 2 (the systemd unit
        does not restart on it) with a message naming the problem, and no
        data directory is created."""
        import subprocess
        import tempfile
        cases = [
            (["--bogus"], "unknown option --bogus"),
            (["--grpc-threads"], "--grpc-threads needs a value"),
            (["--http", "127.0.0.1:99999"], "port in 0..65535"),
            (["--http", "127.0.0.1"], "expected host:port"),
            (["--grpc", ":5"], "expected host:port"),
            (["--run-attempts", "0"], "run-attempts"),
        ]
        for args, message in cases:
            with self.subTest(args=args):
                data = os.path.join(tempfile.mkdtemp(prefix="kf-usage-"), "data")
                p = subprocess.run([harness.KEYFLOWD, "--data", data] + args, capture_output=True,
                                   timeout=30)
                self.assertEqual(p.returncode, 2, p.stderr.decode())
                self.assertIn(message, p.stderr.decode())
                self.assertFalse(os.path.exists(data), "a usage error must not create the data directory")

    def test_out_of_descriptors_the_gateway_pauses_accepting_and_recovers(self):
        """With its descriptors used up, keyflowd stops reading the HTTP
        listener for a moment (says so in its log) instead of retrying
        accept() in a busy loop, and serves again once clients leave."""
        import shutil
        import socket
        if shutil.which("prlimit") is None:
            self.skipTest("prlimit (util-linux) is not installed")
        saved = os.environ.get("KEYFLOW_WRAPPER")
        # 8 partitions' stores hold about 270 descriptors before the first
        # connection (keyflowd.c, raise_descriptor_limit): 400 leaves about
        # 130 for connections, as 200 did with one partition.
        os.environ["KEYFLOW_WRAPPER"] = "prlimit --nofile=400 --"
        try:
            # Every connection comes from 127.0.0.1: lift the per-address
            # bound so that the descriptors run out first.
            server = harness.Keyflowd(args=["--http-connections-per-address", "4096"]).start()
        finally:
            if saved is None:
                del os.environ["KEYFLOW_WRAPPER"]
            else:
                os.environ["KEYFLOW_WRAPPER"] = saved
        self.addCleanup(server.cleanup)
        port = int(server.http_base.rsplit(":", 1)[1])
        socks = []
        try:
            for _ in range(300):
                socks.append(socket.create_connection(("127.0.0.1", port), timeout=10))
            wait_until(lambda: "pausing new connections" in server.read_log(), 10,
                       "the gateway to pause accepting")
        finally:
            for s in socks:
                s.close()
        wait_until(lambda: server.http("GET", "/healthz")[0] == 200, 20, "/healthz to answer again")
        self.assertEqual(server.stop(), 0)


if __name__ == "__main__":
    unittest.main()
