"""End-to-end tests of keyflowd on a full disk: the data directory is a
small tmpfs mounted for the test (needs root; skipped with a message
otherwise).

- Filled under load down to --disk-reserve: new events are refused with
  RESOURCE_EXHAUSTED "disk reserve reached" (HTTP 507), /readyz says why,
  while reads, run completions, polls and cancels go on; it restarts on that
  disk and serves reads; once space is freed, events go in again.
- Filled behind its back (another writer takes the last bytes): the next
  write fail-stops with keyflowd's own message, the call in flight gets
  "storage failure: ..., stopping", the process exits 1 (no abort inside
  RocksDB), and after space is freed it restarts with everything that was
  acknowledged.
- Flushing windows filled to the reserve is refused too (each would copy
  its input into a run), not a way to fill the disk.
- With 8 partitions, windows waiting in all of them when a little space
  comes back close into that room together, not each into all of it.

Run (Debian's Python, as root):
  cd /work/main && KEYFLOW_BUILD_DIR=build PYENV_VERSION=system \
      python3 -m unittest discover -s tests/e2e -p 'test_disk_full.py' -v
"""

import errno
import json
import os
import subprocess
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

FS_BYTES = 40 * 1024 * 1024
RESERVE = "8MiB"
RESERVE_BYTES = 8 * 1024 * 1024
BIG_INPUT = json.dumps("x" * (200 * 1024))  # under the 256 KiB event input bound


def fill(path, leave_bytes):
    """Writes zeros to `path` until the filesystem has about leave_bytes
    free (0: until it is full). Returns the bytes written."""
    st = os.statvfs(os.path.dirname(path))
    free = st.f_bavail * st.f_frsize
    want = max(0, free - leave_bytes)
    written = 0
    chunk = b"\0" * 65536
    with open(path, "ab") as f:
        while leave_bytes > 0 and written < want or leave_bytes == 0:
            n = min(len(chunk), want - written) if leave_bytes > 0 else len(chunk)
            try:
                f.write(chunk[:n])
                f.flush()
            except OSError as e:
                if e.errno != errno.ENOSPC:
                    raise
                break
            written += n
    return written


class DiskTestBase(unittest.TestCase):
    """A keyflowd whose data directory is a tmpfs of FS_BYTES (no tests)."""
    SERVER_ARGS = []
    FS_BYTES = FS_BYTES
    RESERVE = RESERVE

    def setUp(self):
        if os.geteuid() != 0:
            self.skipTest("needs root to mount a small tmpfs for the data directory")
        self.server = harness.Keyflowd(args=self.SERVER_ARGS + ["--disk-reserve", self.RESERVE])
        self.addCleanup(self.server.cleanup)
        self.db = os.path.join(self.server.data_dir, "db")
        os.makedirs(self.db)
        p = subprocess.run(["mount", "-t", "tmpfs", "-o", "size=%d" % self.FS_BYTES, "tmpfs", self.db],
                           capture_output=True, text=True)
        if p.returncode != 0:
            self.skipTest("cannot mount a tmpfs (%s)" % p.stderr.strip())
        self.addCleanup(lambda: subprocess.run(["umount", "-l", self.db]))
        self.addCleanup(self.stop_quietly)
        self.filler = os.path.join(self.db, "filler")
        self.wf = "wf-" + uuid.uuid4().hex[:8]
        self.channel = None

    def tearDown(self):
        harness.log_on_failure(self, self.server)

    def stop_quietly(self):
        if self.channel is not None:
            self.channel.close()
            self.channel = None
        if self.server.proc is not None:
            self.server.kill()

    def start(self):
        self.server.start()
        if self.channel is not None:
            self.channel.close()
        self.channel = grpc.insecure_channel(self.server.grpc_target)
        self.coords = CG.CoordinatorsStub(self.channel)
        self.runs = RG.RunsStub(self.channel)

    def send(self, key, rule, input_json="null", stub=None):
        return (stub or self.coords).SendEvent(C.SendEventRequest(
            workflow=self.wf, key=key, event=C.Event(rule=rule, input_json=input_json)), timeout=30)

    def debounce(self):
        return C.Rule(kind=C.RULE_KIND_DEBOUNCE, window_ms=600000)

    def free_bytes(self):
        st = os.statvfs(self.db)
        return st.f_bavail * st.f_frsize

    def metric(self, name):
        """A metric's value, summed over its series."""
        text = self.server.http("GET", "/metrics")[1]
        return sum(float(line.split()[1]) for line in text.splitlines()
                   if line.startswith(name + " ") or line.startswith(name + "{"))


class DiskFullTest(DiskTestBase):
    # One partition: the thresholds and the fail-stop path are those of one
    # store's own estimate (runtime/engine.c; with several, each engine turn
    # measures the disk and refuses at the reserve instead), and the runs are
    # polled in one order (harness.ONE_PARTITION).
    SERVER_ARGS = harness.ONE_PARTITION

    def fill_under_load(self):
        """Big events from four clients until one is refused below the
        disk reserve; returns that error."""
        refused = []
        failures = []

        def client(n):
            ch = grpc.insecure_channel(self.server.grpc_target)
            stub = CG.CoordinatorsStub(ch)
            i = 0
            try:
                while not refused and not failures and i < 1000:
                    i += 1
                    try:
                        self.send("big-%d-%d" % (n, i), self.debounce(), BIG_INPUT, stub)
                    except grpc.RpcError as e:
                        if e.code() != grpc.StatusCode.RESOURCE_EXHAUSTED:
                            failures.append(e)
                        elif "below the reserve" in e.details():
                            refused.append(e)
                        # Else the writes in flight fill the room above the
                        # reserve (docs/semantics.md, "Disk space"): once
                        # they are on disk, it is reached, unless RocksDB
                        # freed space meanwhile; go on until it is.
            finally:
                ch.close()

        threads = [threading.Thread(target=client, args=(n,)) for n in range(4)]
        for t in threads:
            t.start()
        for t in threads:
            t.join(120)
        self.assertEqual(failures, [], "only refusals for the reserve: %r" % failures[:1])
        self.assertTrue(refused, "the disk reserve was never reached (%d bytes free)" % self.free_bytes())
        return refused[0]

    def test_reserve_refuses_new_writes_and_the_rest_goes_on(self):
        self.start()
        # Before the disk fills: three runs (batches of one start at once),
        # two of them leased, and an open debounce window.
        batch_of_one = C.Rule(kind=C.RULE_KIND_BATCH, max_events=1)
        run_ids = [self.send("run-%d" % i, batch_of_one, str(i)).receipt.run_id for i in range(3)]
        leased = self.runs.PollRuns(R.PollRunsRequest(
            workflows=[self.wf], worker_id="w1", max_runs=2), timeout=10).runs
        self.assertEqual(len(leased), 2)
        self.send("open-1", self.debounce(), '"kept"')
        # A filler leaves the reserve plus 6 MiB; events fill the rest.
        fill(self.filler, RESERVE_BYTES + 6 * 1024 * 1024)
        err = self.fill_under_load()
        self.assertIn("disk reserve reached", err.details())
        self.assertIn("--disk-reserve", err.details())

        # New writes: refused on both transports, naming the reserve.
        with self.assertRaises(grpc.RpcError) as cm:
            self.send("new-key", self.debounce())
        self.assertEqual(cm.exception.code(), grpc.StatusCode.RESOURCE_EXHAUSTED)
        status, body = self.server.http("POST", "/v1/workflows/%s/keys/http-key/events" % self.wf,
                                        {"rule": {"kind": "debounce", "windowMs": 1000}, "input": 1})
        self.assertEqual(status, 507, body)
        self.assertEqual(body["status"], "RESOURCE_EXHAUSTED")
        self.assertIn("disk reserve reached", body["message"])
        status, body = self.server.http("GET", "/readyz")
        self.assertEqual(status, 503, body)
        self.assertIn("disk reserve reached", body["message"])
        self.assertEqual(self.server.http("GET", "/healthz")[0], 200)
        metrics = self.server.http("GET", "/metrics")[1]
        self.assertIn("\nkeyflow_disk_reserve_reached 1\n", metrics)

        # Reads, completions, polls and deletions go on.
        self.assertEqual(self.runs.GetRun(R.GetRunRequest(run_id=run_ids[2]), timeout=10).run_id, run_ids[2])
        d = self.coords.DescribeCoordinator(C.DescribeCoordinatorRequest(coordinator=C.CoordinatorRef(
            kind=C.RULE_KIND_DEBOUNCE, workflow=self.wf, key="open-1")), timeout=10)
        self.assertTrue(d.exists)
        self.runs.CompleteRun(R.CompleteRunRequest(
            run_id=leased[0].run_id, lease=leased[0].lease, result_json='{"ok": true}'), timeout=10)
        self.assertEqual(self.runs.GetRun(R.GetRunRequest(run_id=leased[0].run_id), timeout=10).status,
                         R.RUN_STATUS_COMPLETED)
        third = self.runs.PollRuns(R.PollRunsRequest(workflows=[self.wf], worker_id="w2"), timeout=10).runs
        self.assertEqual([r.run_id for r in third], [run_ids[2]])
        cancelled = self.coords.CancelWindow(C.CancelWindowRequest(coordinator=C.CoordinatorRef(
            kind=C.RULE_KIND_DEBOUNCE, workflow=self.wf, key="open-1")), timeout=10)
        self.assertTrue(cancelled.cancelled)

        # It restarts on that disk and serves reads; writes stay refused.
        self.assertEqual(self.server.stop(), 0)
        self.start()
        self.assertEqual(self.runs.GetRun(R.GetRunRequest(run_id=leased[0].run_id), timeout=10).status,
                         R.RUN_STATUS_COMPLETED)
        # Opening may free space (RocksDB deletes WAL files whose memtables
        # were flushed before the stop): bring the disk below the reserve
        # again; the server notices on its own.
        fill(self.filler, RESERVE_BYTES // 2)

        def reserve_reached():
            body = self.server.http("GET", "/readyz")[1]
            return isinstance(body, dict) and "disk reserve reached" in body.get("message", "")
        wait_until(reserve_reached, 10, "/readyz to report the disk reserve after the restart")
        with self.assertRaises(grpc.RpcError) as cm:
            self.send("new-key", self.debounce())
        self.assertEqual(cm.exception.code(), grpc.StatusCode.RESOURCE_EXHAUSTED)

        # Space freed: events go in again, and it is ready.
        os.unlink(self.filler)
        wait_until(lambda: self.server.http("GET", "/readyz")[0] == 200, 10, "/readyz 200 with space back")
        self.assertTrue(self.send("new-key", self.debounce()).receipt.run_id)
        self.assertEqual(self.server.stop(), 0)

    def test_windows_due_below_the_reserve_wait_for_space_instead_of_failing(self):
        # A window that closes becomes a run holding a copy of its input.
        # Windows filled up to the reserve and due after it was reached
        # would need more than the reserve: they stay open (their events are
        # kept, new ones refused) until space comes back, rather than
        # fail-stopping the process, and again at every restart.
        self.start()
        fill(self.filler, RESERVE_BYTES + 10 * 1024 * 1024)
        window = C.Rule(kind=C.RULE_KIND_DEBOUNCE, window_ms=3000)
        receipts = []
        try:
            for i in range(1000):
                receipts.append(self.send("due-%d" % i, window, BIG_INPUT).receipt.run_id)
        except grpc.RpcError as e:
            self.assertEqual(e.code(), grpc.StatusCode.RESOURCE_EXHAUSTED, e.details())
            self.assertIn("disk reserve reached", e.details())
        # Their input is more than the reserve holds.
        self.assertGreater(len(receipts) * len(BIG_INPUT), RESERVE_BYTES)

        def due_and_still_serving():
            self.assertIsNone(self.server.proc.poll(), "keyflowd stopped:\n" + self.server.read_log())
            d = self.coords.DescribeCoordinator(C.DescribeCoordinatorRequest(coordinator=C.CoordinatorRef(
                kind=C.RULE_KIND_DEBOUNCE, workflow=self.wf, key="due-0")), timeout=10)
            return d.window.due_ms <= time.time() * 1000
        wait_until(due_and_still_serving, 30, "the windows' due time")
        time.sleep(0.5)  # a few of the engine's turns, which would close them
        self.assertIsNone(self.server.proc.poll(), "keyflowd stopped:\n" + self.server.read_log())
        run = self.runs.GetRun(R.GetRunRequest(run_id=receipts[-1]), timeout=10)
        self.assertEqual(run.status, R.RUN_STATUS_WINDOW_OPEN)
        status, body = self.server.http("GET", "/readyz")
        self.assertEqual(status, 503, body)

        # A restart on that disk serves reads. (Opening may free a little
        # space, RocksDB deleting WAL files flushed at the stop: a few
        # windows may close into the room that makes; the rest wait.)
        self.assertEqual(self.server.stop(), 0)
        self.start()
        time.sleep(0.5)
        self.assertIsNone(self.server.proc.poll(), "keyflowd stopped:\n" + self.server.read_log())
        statuses = {self.runs.GetRun(R.GetRunRequest(run_id=r), timeout=10).status for r in receipts}
        self.assertIn(R.RUN_STATUS_WINDOW_OPEN, statuses)
        self.assertLessEqual(statuses, {R.RUN_STATUS_WINDOW_OPEN, R.RUN_STATUS_PENDING})

        # Space back: every window closes into its run.
        os.unlink(self.filler)

        def all_runs_started():
            return all(self.runs.GetRun(R.GetRunRequest(run_id=r), timeout=10).status == R.RUN_STATUS_PENDING
                       for r in receipts)
        wait_until(all_runs_started, 30, "the waiting windows to close with space back")
        self.assertEqual(self.server.stop(), 0)

    def test_flushing_windows_filled_to_the_reserve_is_refused_not_fatal(self):
        # A client fills the disk to the reserve with big batch windows and
        # then flushes them: each flush copies its window's input into a
        # run. Without room for that it is refused like a new event (it
        # used to go on until the disk was full and keyflowd fail-stopped,
        # and could again after every restart); CancelWindow still works.
        self.start()
        fill(self.filler, RESERVE_BYTES + 12 * 1024 * 1024)
        rule = C.Rule(kind=C.RULE_KIND_BATCH, max_events=10000, max_wait_ms=3600000)
        keys = []
        with self.assertRaises(grpc.RpcError) as cm:
            for i in range(1000):
                keys.append("w-%d" % (i // 10))
                self.send(keys[-1], rule, BIG_INPUT)
        self.assertIn("disk reserve reached", cm.exception.details())
        keys = sorted(set(keys))
        self.assertGreater(len(keys) * 10 * len(BIG_INPUT), RESERVE_BYTES)

        answers = []
        for key in keys:
            ref = C.CoordinatorRef(kind=C.RULE_KIND_BATCH, workflow=self.wf, key=key)
            try:
                answers.append(self.coords.FlushWindow(C.FlushWindowRequest(coordinator=ref),
                                                       timeout=30).flushed)
            except grpc.RpcError as e:
                self.assertEqual(e.code(), grpc.StatusCode.RESOURCE_EXHAUSTED, e.details())
                self.assertIn("disk reserve reached", e.details())
                self.assertIn("--disk-reserve", e.details())
                answers.append(None)
        self.assertIn(None, answers)
        self.assertIsNone(self.server.proc.poll(), "keyflowd stopped:\n" + self.server.read_log())
        self.assertGreater(self.free_bytes(), RESERVE_BYTES // 4)
        waiting = [k for k, a in zip(keys, answers) if a is None]
        cancelled = self.coords.CancelWindow(C.CancelWindowRequest(coordinator=C.CoordinatorRef(
            kind=C.RULE_KIND_BATCH, workflow=self.wf, key=waiting.pop())), timeout=10)
        self.assertTrue(cancelled.cancelled)

        # Space back: the rest flush.
        os.unlink(self.filler)
        wait_until(lambda: self.server.http("GET", "/readyz")[0] == 200, 10, "/readyz 200 with space back")
        for key in waiting:
            self.assertTrue(self.coords.FlushWindow(C.FlushWindowRequest(coordinator=C.CoordinatorRef(
                kind=C.RULE_KIND_BATCH, workflow=self.wf, key=key)), timeout=30).flushed)
        self.assertEqual(self.server.stop(), 0)

    def test_a_disk_filled_behind_its_back_fail_stops_with_its_own_message(self):
        self.start()
        acked = self.send("kept", self.debounce(), '"before"').receipt.run_id
        fill(self.filler, 0)
        self.assertLess(self.free_bytes(), 65536)
        # A write the reserve does not stop (a new event, or a flush that
        # copies a window's input into a run, may be refused for the
        # reserve instead, when the engine measured the disk since the
        # fill): dropping the window writes its deletions.
        with self.assertRaises(grpc.RpcError) as cm:
            self.coords.CancelWindow(C.CancelWindowRequest(coordinator=C.CoordinatorRef(
                kind=C.RULE_KIND_DEBOUNCE, workflow=self.wf, key="kept")), timeout=30)
        self.assertEqual(cm.exception.code(), grpc.StatusCode.UNAVAILABLE)
        self.assertRegex(cm.exception.details(), r"^storage failure: disk full: .*, stopping$")
        code = self.server.proc.wait(timeout=30)
        self.server.proc = None
        self.server.log.close()
        log = self.server.read_log()
        self.assertEqual(code, 1, log)
        self.assertIn("fail-stop: a durable write failed (storage failure)", log)
        self.assertIn("disk full: ", log)
        self.assertNotIn("Assertion", log)
        # With space back it starts, with everything acknowledged.
        os.unlink(self.filler)
        self.start()
        d = self.coords.DescribeCoordinator(C.DescribeCoordinatorRequest(coordinator=C.CoordinatorRef(
            kind=C.RULE_KIND_DEBOUNCE, workflow=self.wf, key="kept")), timeout=10)
        self.assertEqual(d.window.run_id, acked)
        self.assertEqual(self.server.stop(), 0)


class PartitionsDiskFullTest(DiskTestBase):
    """The default 8 partitions: one filesystem, one reserve, eight engines
    writing to it at the same time."""
    FS_BYTES = 192 * 1024 * 1024
    RESERVE = "4MiB"
    RESERVE_BYTES = 4 * 1024 * 1024
    WINDOWS = 320  # 40 in each partition
    CHUNK = json.dumps("z" * (25 * 1024 - 2))  # 5 of them fill a window to 125 KiB

    def test_windows_waiting_in_every_partition_close_into_the_room_not_past_it(self):
        # Batch windows in all 8 partitions fall due together while the disk
        # is below the reserve: they wait. Then space comes back: a room as
        # large as the reserve, each partition's windows more than that.
        # Every engine sees the same room; closing into it must not add up
        # to more than the room (two engines each taking all of it wrote
        # past the floor, a quarter of the reserve, and fail-stopped).
        self.start()
        # One call opens them all, so that each partition's are due at
        # once; the time leaves room to fill them and the disk on a busy
        # machine.
        rule = C.Rule(kind=C.RULE_KIND_BATCH, max_events=100, max_wait_ms=40000)
        keys = ["w-%d" % i for i in range(self.WINDOWS)]

        def send_all(input_json):
            answer = self.coords.SendEvents(C.SendEventsRequest(events=[
                C.SendEventRequest(workflow=self.wf, key=key, event=C.Event(rule=rule, input_json=input_json))
                for key in keys]), timeout=120)
            self.assertTrue(all(r.HasField("response") for r in answer.results), answer.results[:1])
        send_all("0")
        for _ in range(5):
            send_all(self.CHUNK)
        self.assertEqual(self.metric("keyflow_open_windows"), self.WINDOWS)
        fill(self.filler, self.RESERVE_BYTES - 1024 * 1024)
        last = self.coords.DescribeCoordinator(C.DescribeCoordinatorRequest(coordinator=C.CoordinatorRef(
            kind=C.RULE_KIND_BATCH, workflow=self.wf, key=keys[-1])), timeout=10)
        wait_until(lambda: time.time() * 1000 > last.window.due_ms + 1000, 60, "the windows' due time")
        self.assertIsNone(self.server.proc.poll(), "keyflowd stopped:\n" + self.server.read_log())
        # (RocksDB deleting WAL files it flushed may make a little room
        # meanwhile, and a slow machine may send them late: some windows
        # may close into it; the rest wait, far more than the room below.)
        waiting = self.metric("keyflow_open_windows")
        self.assertGreater(waiting * 125 * 1024, 2 * self.RESERVE_BYTES)

        # Space back: a room of the reserve's size above it, a tenth of
        # what the waiting windows need.
        room = self.RESERVE_BYTES
        with open(self.filler, "r+b") as f:
            f.truncate(max(0, os.path.getsize(self.filler) - (self.RESERVE_BYTES + room - self.free_bytes())))
        lowest = self.free_bytes()
        deadline = time.time() + 3
        while time.time() < deadline:  # the waiting windows look again every 500 ms
            self.assertIsNone(self.server.proc.poll(), "keyflowd stopped:\n" + self.server.read_log())
            lowest = min(lowest, self.free_bytes())
            time.sleep(0.02)
        self.assertNotIn("fail-stop", self.server.read_log())
        self.assertGreater(lowest, self.RESERVE_BYTES // 4, "free space went below the floor")
        self.assertLess(self.metric("keyflow_open_windows"), waiting, "none closed into the room")

        # All the space back: every window closes.
        os.unlink(self.filler)
        wait_until(lambda: self.metric("keyflow_open_windows") == 0, 60, "every window to close")
        self.assertEqual(self.server.stop(), 0)


if __name__ == "__main__":
    unittest.main()
