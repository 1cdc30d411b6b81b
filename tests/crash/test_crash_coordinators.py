"""Crash test of debounce/batch coordinators: acknowledged events survive a
SIGKILL in the middle of a concurrent load, each joins exactly one window,
and each window starts exactly one run.

  * keyflowd starts; 8 client threads (gRPC) send events with unique IDs
    over 50 keys: even keys batch (max_events 5, long max_wait), odd keys
    debounce (long window). Each key belongs to one thread, so per key the
    events are sequential and the acknowledgement order is the apply order.
    Every acknowledged receipt is recorded (run_id per event ID).
  * After ~1.5 s of load a separate thread SIGKILLs keyflowd and restarts it
    over the same data directory.
  * Each thread retries its unacknowledged event with the same ID (and the
    same input) until it is acknowledged, then sends a few more events.
  * Every coordinator is flushed, every run drained (PollRuns + CompleteRun),
    and the invariants are checked; then one more crash and restart must not
    bring any run back.

Invariants checked:
  * every acknowledged batch event appears in exactly one run's input array,
    and that run is the one its receipt named;
  * no run is handed out twice (no duplicate run_id), no event is in two runs,
    no run contains an event that was never sent, a batch run holds at most
    max_events events of one key in send order;
  * every debounce run's input is the latest acknowledged input of its window
    or a later one that was sent (an unacknowledged later event may have been
    durable before the crash), and every acknowledged debounce receipt names
    that run.

Run (Debian's Python):
  cd /work/main && KEYFLOW_BUILD_DIR=build-e2e PYENV_VERSION=system \
      python3 -m unittest discover -s tests/crash -p 'test_*.py' -v
"""

import collections
import json
import os
import random
import sys
import threading
import time
import unittest
import uuid

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.join(os.path.dirname(HERE), "e2e"))
import harness  # noqa: E402

harness.stubs()
import grpc  # noqa: E402
from keyflow.v1 import coordinators_pb2 as C  # noqa: E402
from keyflow.v1 import coordinators_pb2_grpc as CG  # noqa: E402
from keyflow.v1 import runs_pb2 as R  # noqa: E402
from keyflow.v1 import runs_pb2_grpc as RG  # noqa: E402

THREADS = 8
KEYS = 50
BATCH_MAX = 5
LOAD_SECONDS = 1.5          # load before the SIGKILL
EVENTS_AFTER_RESTART = 15   # new events per thread once its retry is acknowledged
RETRY_SECONDS = 60          # per event, across the restart


def key_name(i):
    return "key-%02d" % i


def is_batch(i):
    return i % 2 == 0


def rule_for(i):
    if is_batch(i):
        return C.Rule(kind=C.RULE_KIND_BATCH, max_events=BATCH_MAX, max_wait_ms=3600000)
    return C.Rule(kind=C.RULE_KIND_DEBOUNCE, window_ms=3600000)


class Cluster:
    """The server plus what the client threads need to follow its restart."""

    def __init__(self, server):
        self.server = server
        self.lock = threading.Lock()
        self.target = server.grpc_target
        self.generation = 0
        self.restarted = threading.Event()

    def current(self):
        with self.lock:
            return self.target, self.generation

    def crash_and_restart(self):
        self.server.kill()
        self.server.start()
        with self.lock:
            self.target = self.server.grpc_target
            self.generation += 1
        self.restarted.set()


class CrashTest(unittest.TestCase):
    def setUp(self):
        self.server = harness.Keyflowd().start()
        self.addCleanup(self.server.cleanup)
        self.wf = "crash-" + uuid.uuid4().hex[:8]

    def tearDown(self):
        harness.log_on_failure(self, self.server)

    def test_sigkill_under_concurrent_load(self):
        cluster = Cluster(self.server)
        lock = threading.Lock()
        receipts = {}                 # event id -> SendEventResponse (acknowledged)
        acked_gen = {}                # event id -> server generation that acknowledged it
        sent = {}                     # event id -> (key index, counter)
        acked_order = collections.defaultdict(list)  # key index -> counters in ack order
        sent_counters = collections.defaultdict(set)  # key index -> counters ever sent
        retried = []                  # event ids acknowledged only after a retry
        failures = []                 # unexpected problems in the threads
        total_acked = [0]
        start_load = time.monotonic()

        def client(t):
            owned = [i for i in range(KEYS) if i % THREADS == t]
            counters = {i: 0 for i in owned}
            rnd = random.Random(t)
            target, gen = cluster.current()
            channel = grpc.insecure_channel(target)
            stub = CG.CoordinatorsStub(channel)
            after_restart = 0
            try:
                while True:
                    if cluster.restarted.is_set():
                        if after_restart >= EVENTS_AFTER_RESTART:
                            return
                        after_restart += 1
                    i = rnd.choice(owned)
                    counters[i] += 1
                    c = counters[i]
                    eid = "%s-%d" % (key_name(i), c)
                    inp = json.dumps({"id": eid, "k": i, "c": c}, separators=(",", ":"))
                    req = C.SendEventRequest(workflow=self.wf, key=key_name(i),
                                             event=C.Event(id=eid, rule=rule_for(i), input_json=inp))
                    with lock:
                        sent[eid] = (i, c)
                        sent_counters[i].add(c)
                    deadline = time.monotonic() + RETRY_SECONDS
                    attempt = 0
                    while True:
                        attempt += 1
                        try:
                            resp = stub.SendEvent(req, timeout=5)
                            break
                        except grpc.RpcError as e:
                            if time.monotonic() > deadline:
                                failures.append("%s never acknowledged (last: %s %s)"
                                                % (eid, e.code(), e.details()))
                                return
                            if e.code() not in (grpc.StatusCode.UNAVAILABLE, grpc.StatusCode.DEADLINE_EXCEEDED,
                                                grpc.StatusCode.CANCELLED, grpc.StatusCode.UNKNOWN,
                                                grpc.StatusCode.INTERNAL):
                                failures.append("%s: unexpected %s %s" % (eid, e.code(), e.details()))
                                return
                            # The server is down: wait for the restart, then
                            # retry the same event (same ID, same input).
                            cluster.restarted.wait(RETRY_SECONDS)
                            new_target, new_gen = cluster.current()
                            if new_gen != gen:
                                channel.close()
                                target, gen = new_target, new_gen
                                channel = grpc.insecure_channel(target)
                                stub = CG.CoordinatorsStub(channel)
                            else:
                                time.sleep(0.05)  # transient: back off briefly, bounded by deadline
                    with lock:
                        receipts[eid] = resp
                        acked_gen[eid] = gen
                        acked_order[i].append(c)
                        total_acked[0] += 1
                        if attempt > 1:
                            retried.append(eid)
            except Exception as e:  # noqa: BLE001 - reported as a test failure
                failures.append("thread %d: %r" % (t, e))
            finally:
                channel.close()

        def killer():
            # ~1.5 s of load and a fair number of acknowledgements, bounded.
            deadline = time.monotonic() + 30
            while time.monotonic() < deadline:
                with lock:
                    n = total_acked[0]
                if time.monotonic() - start_load >= LOAD_SECONDS and n >= 200:
                    break
                time.sleep(0.01)
            try:
                cluster.crash_and_restart()
            except Exception as e:  # noqa: BLE001
                failures.append("restart failed: %r" % e)
                cluster.restarted.set()

        threads = [threading.Thread(target=client, args=(t,), name="client-%d" % t) for t in range(THREADS)]
        for th in threads:
            th.start()
        kt = threading.Thread(target=killer, name="killer")
        kt.start()
        kt.join(90)
        for th in threads:
            th.join(120)
        self.assertFalse(kt.is_alive() or any(th.is_alive() for th in threads), "client threads hung")
        self.assertEqual(failures, [])
        self.assertEqual(cluster.generation, 1, "keyflowd was killed and restarted once")
        self.assertEqual(len(receipts), len(sent), "every event was acknowledged in the end")
        sys.stderr.write("\n[crash] %d events acknowledged, %d of them after a retry across the crash "
                         "(%d of those had been durable: duplicate=true)\n"
                         % (len(receipts), len(retried), sum(1 for e in retried if receipts[e].duplicate)))

        # ---- commit sequences: every event the restarted server wrote is
        # after everything the first one acknowledged; a duplicate answers
        # with its first write's, which the first server made durable.
        before = [receipts[e].receipt.commit_seq for e in receipts if acked_gen[e] == 0]
        after_new = [receipts[e].receipt.commit_seq for e in receipts
                     if acked_gen[e] == 1 and not receipts[e].duplicate]
        self.assertTrue(all(s > 0 for s in before + after_new), "every receipt names its write")
        # Each partition numbers its own writes (i, i + 8, ...: the default
        # 8 partitions, docs/semantics.md), so the order holds per partition.
        for part in range(8):
            b = [x for x in before if x % 8 == part]
            a = [x for x in after_new if x % 8 == part]
            if a and b:
                self.assertGreater(min(a), max(b),
                                   "partition %d's commit_seq went back across the restart" % part)
        for e in receipts:
            if acked_gen[e] == 1 and receipts[e].duplicate:
                seq = receipts[e].receipt.commit_seq
                same = [x for x in after_new if x % 8 == seq % 8]
                if same:
                    self.assertLess(seq, min(same),
                                    "%s: a retry's first write was made before the crash" % e)

        channel = grpc.insecure_channel(self.server.grpc_target)
        self.addCleanup(channel.close)
        coords = CG.CoordinatorsStub(channel)
        runs_stub = RG.RunsStub(channel)

        # Flush every coordinator, then drain every run.
        for i in range(KEYS):
            coords.FlushWindow(C.FlushWindowRequest(coordinator=C.CoordinatorRef(
                kind=C.RULE_KIND_BATCH if is_batch(i) else C.RULE_KIND_DEBOUNCE,
                workflow=self.wf, key=key_name(i))), timeout=10)
        drained = {}                  # run id -> Run
        while True:
            got = runs_stub.PollRuns(R.PollRunsRequest(workflows=[self.wf], worker_id="drain", lease_ms=600000,
                                                       max_runs=100, wait_ms=0), timeout=30).runs
            if not got:
                break
            for run in got:
                self.assertNotIn(run.run_id, drained, "run %s was handed out twice" % run.run_id)
                drained[run.run_id] = run
                done = runs_stub.CompleteRun(R.CompleteRunRequest(run_id=run.run_id, lease=run.lease,
                                                                  result_json='"ok"'), timeout=10)
                self.assertEqual(done.run.status, R.RUN_STATUS_COMPLETED)
            self.assertLess(len(drained), 100000, "draining does not terminate")

        # ---- batch: every acknowledged event in exactly one run, the one
        # its receipt named.
        where = {}                    # event id -> run id
        for run in drained.values():
            key_i = int(run.key.split("-")[1])
            self.assertEqual(run.key, key_name(key_i))
            self.assertTrue(run.run_id.startswith(run.key + "@"), run.run_id)
            if run.kind != C.RULE_KIND_BATCH:
                continue
            self.assertTrue(is_batch(key_i), "a batch run for debounce key %s" % run.key)
            items = json.loads(run.input_json)
            self.assertIsInstance(items, list)
            self.assertEqual(len(items), run.event_count)
            self.assertGreaterEqual(len(items), 1)
            self.assertLessEqual(len(items), BATCH_MAX, "run %s holds more than max_events" % run.run_id)
            counters = []
            for item in items:
                eid = item["id"]
                self.assertIn(eid, sent, "run %s contains event %s that was never sent" % (run.run_id, eid))
                self.assertEqual(sent[eid], (item["k"], item["c"]), "event %s altered" % eid)
                self.assertEqual(item["k"], key_i, "event %s in another key's run" % eid)
                self.assertNotIn(eid, where, "event %s is in two runs: %s and %s" % (eid, where.get(eid), run.run_id))
                where[eid] = run.run_id
                counters.append(item["c"])
            self.assertEqual(counters, sorted(counters), "batch input out of send order in %s" % run.run_id)
        batch_acked = [eid for eid in receipts if is_batch(sent[eid][0])]
        missing = [eid for eid in batch_acked if eid not in where]
        self.assertEqual(missing, [], "acknowledged batch events lost (in no run)")
        wrong = [(eid, receipts[eid].receipt.run_id, where[eid]) for eid in batch_acked
                 if receipts[eid].receipt.run_id != where[eid]]
        self.assertEqual(wrong, [], "receipt run_id differs from the run holding the event")
        for eid in batch_acked:
            self.assertTrue(receipts[eid].receipt.run_id.startswith(key_name(sent[eid][0]) + "@"))

        # ---- debounce: one window per key (it never closes before the
        # flush), so one run, whose input is the latest acknowledged input
        # or a later one that was sent.
        deb_runs = collections.defaultdict(list)
        for run in drained.values():
            if run.kind == C.RULE_KIND_DEBOUNCE:
                deb_runs[int(run.key.split("-")[1])].append(run)
        for i in range(KEYS):
            if is_batch(i):
                continue
            if not acked_order[i]:
                self.assertEqual(deb_runs.get(i, []), [])
                continue
            runs = deb_runs.get(i, [])
            self.assertEqual(len(runs), 1, "debounce key %s: expected one run, got %s"
                             % (key_name(i), [r.run_id for r in runs]))
            run = runs[0]
            value = json.loads(run.input_json)
            highest = max(acked_order[i])
            self.assertEqual(acked_order[i], sorted(acked_order[i]))
            self.assertIn(value["c"], sent_counters[i], "debounce input %r was never sent" % value)
            self.assertEqual(value["id"], "%s-%d" % (key_name(i), value["c"]))
            self.assertGreaterEqual(value["c"], highest,
                                    "debounce run %s has input %d, older than the latest acknowledged %d"
                                    % (run.run_id, value["c"], highest))
            self.assertGreaterEqual(run.event_count, 1)
            for c in acked_order[i]:
                eid = "%s-%d" % (key_name(i), c)
                self.assertEqual(receipts[eid].receipt.run_id, run.run_id,
                                 "debounce receipt of %s names another run" % eid)

        # ---- each coordinator counted exactly the runs that were drained.
        per_key = collections.Counter(int(r.key.split("-")[1]) for r in drained.values())
        for i in range(KEYS):
            d = coords.DescribeCoordinator(C.DescribeCoordinatorRequest(coordinator=C.CoordinatorRef(
                kind=C.RULE_KIND_BATCH if is_batch(i) else C.RULE_KIND_DEBOUNCE,
                workflow=self.wf, key=key_name(i))), timeout=10)
            if acked_order[i]:
                self.assertTrue(d.exists, key_name(i))
                self.assertFalse(d.HasField("window"), "%s still has a window after the flush" % key_name(i))
                self.assertEqual(d.runs_started, per_key[i], "%s: runs_started vs runs drained" % key_name(i))

        # ---- nothing else: every run in the store was drained, once.
        listed, token = [], ""
        while True:
            page = runs_stub.ListRuns(R.ListRunsRequest(workflow=self.wf, page_token=token, page_size=1000),
                                      timeout=30)
            listed.extend(page.runs)
            token = page.next_page_token
            if not token:
                break
        self.assertEqual(len(listed), len(set(r.run_id for r in listed)), "ListRuns shows a run twice")
        self.assertEqual(set(r.run_id for r in listed), set(drained))
        self.assertTrue(all(r.status == R.RUN_STATUS_COMPLETED for r in listed))

        # ---- one more crash: no window reopens, no run comes back.
        channel.close()
        self.server.kill()
        self.server.start()
        channel = grpc.insecure_channel(self.server.grpc_target)
        self.addCleanup(channel.close)
        runs_stub = RG.RunsStub(channel)
        again = runs_stub.PollRuns(R.PollRunsRequest(workflows=[self.wf], worker_id="after", max_runs=100,
                                                     wait_ms=500), timeout=30).runs
        self.assertEqual([r.run_id for r in again], [], "runs came back after a restart")
        page = runs_stub.ListRuns(R.ListRunsRequest(workflow=self.wf, page_size=1000), timeout=30)
        listed2 = list(page.runs)
        while page.next_page_token:
            page = runs_stub.ListRuns(R.ListRunsRequest(workflow=self.wf, page_size=1000,
                                                        page_token=page.next_page_token), timeout=30)
            listed2.extend(page.runs)
        self.assertEqual(sorted(r.run_id for r in listed2), sorted(drained))


    def test_sigkill_during_journal_compaction_on_a_hot_key(self):
        """8 threads on ONE batch key (max_events 10000, so the window stays
        open): the journal compacts every 256 entries while the load runs,
        and the SIGKILL lands among compactions. Every acknowledged event
        must be in the window exactly once after the restart."""
        cluster = Cluster(self.server)
        rule = C.Rule(kind=C.RULE_KIND_BATCH, max_events=10000, max_wait_ms=3600000, dedup_ms=3600000)
        lock = threading.Lock()
        receipts, failures = {}, []
        start_load = time.monotonic()

        def client(t):
            target, gen = cluster.current()
            channel = grpc.insecure_channel(target)
            stub = CG.CoordinatorsStub(channel)
            n = 0
            try:
                while not cluster.restarted.is_set() or n % 10 != 0:
                    n += 1
                    eid = "t%d-%d" % (t, n)
                    req = C.SendEventRequest(workflow=self.wf, key="hot", event=C.Event(
                        id=eid, rule=rule, input_json=json.dumps(eid)))
                    deadline = time.monotonic() + RETRY_SECONDS
                    while True:
                        try:
                            resp = stub.SendEvent(req, timeout=5)
                            break
                        except grpc.RpcError as e:
                            if time.monotonic() > deadline:
                                failures.append("%s never acknowledged: %s" % (eid, e.code()))
                                return
                            cluster.restarted.wait(RETRY_SECONDS)
                            new_target, new_gen = cluster.current()
                            if new_gen != gen:
                                channel.close()
                                target, gen = new_target, new_gen
                                channel = grpc.insecure_channel(target)
                                stub = CG.CoordinatorsStub(channel)
                            else:
                                time.sleep(0.05)
                    with lock:
                        receipts[eid] = resp
            except Exception as e:  # noqa: BLE001
                failures.append("thread %d: %r" % (t, e))
            finally:
                channel.close()

        def killer():
            deadline = time.monotonic() + 30
            while time.monotonic() < deadline:
                with lock:
                    n = len(receipts)
                if time.monotonic() - start_load >= 1.0 and n >= 600:
                    break
                time.sleep(0.005)
            try:
                cluster.crash_and_restart()
            except Exception as e:  # noqa: BLE001
                failures.append("restart failed: %r" % e)
                cluster.restarted.set()

        threads = [threading.Thread(target=client, args=(t,)) for t in range(THREADS)]
        for th in threads:
            th.start()
        kt = threading.Thread(target=killer)
        kt.start()
        kt.join(90)
        for th in threads:
            th.join(120)
        self.assertEqual(failures, [])
        channel = grpc.insecure_channel(self.server.grpc_target)
        self.addCleanup(channel.close)
        coords, runs_stub = CG.CoordinatorsStub(channel), RG.RunsStub(channel)
        ref = C.CoordinatorRef(kind=C.RULE_KIND_BATCH, workflow=self.wf, key="hot")
        d = coords.DescribeCoordinator(C.DescribeCoordinatorRequest(coordinator=ref), timeout=10)
        sys.stderr.write("\n[hot key] %d events acknowledged, journal_seq %d, %d compactions\n"
                         % (len(receipts), d.journal_seq, d.compactions))
        self.assertGreaterEqual(d.compactions, 2, "the load should have compacted the journal")
        run_ids = {r.receipt.run_id for r in receipts.values()}
        self.assertEqual(run_ids, {d.window.run_id}, "every receipt names the one open window")
        self.assertEqual(d.window.event_count, len(receipts),
                         "the window holds exactly the acknowledged events (all were retried until acked)")
        self.assertEqual(d.journal_seq, d.compactions * 256 + d.journal_length)
        f = coords.FlushWindow(C.FlushWindowRequest(coordinator=ref), timeout=10)
        self.assertTrue(f.flushed)
        opts_channel = grpc.insecure_channel(self.server.grpc_target,
                                             options=[("grpc.max_receive_message_length", 64 << 20)])
        self.addCleanup(opts_channel.close)
        run = RG.RunsStub(opts_channel).GetRun(R.GetRunRequest(run_id=f.run_id), timeout=30)
        items = json.loads(run.input_json)
        counts = collections.Counter(items)
        self.assertEqual([e for e, c in counts.items() if c > 1], [], "events applied twice")
        self.assertEqual(set(items), set(receipts), "acknowledged events lost or unknown events present")
        for t in range(THREADS):
            mine = [int(e.split("-")[1]) for e in items if e.startswith("t%d-" % t)]
            self.assertEqual(mine, sorted(mine), "thread %d's events out of order" % t)
        self.assertEqual([r.run_id for r in runs_stub.PollRuns(R.PollRunsRequest(
            workflows=[self.wf], worker_id="w", max_runs=100), timeout=10).runs], [f.run_id])


if __name__ == "__main__":
    unittest.main()
