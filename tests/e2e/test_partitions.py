"""End-to-end tests of partitions (DESIGN.md section 9, docs/scaling.md):
the data directory's layout, keyed calls routed to their partition, calls
without a key merged across partitions, a call for a partition served
elsewhere refused with its owner, the count fixed at creation, a partition
moved between processes, and a store written before partitions opened in
place.

Real keyflowd processes, Python grpcio and HTTP; the partition of each key
is computed with the SDK's kf-hash-1 (clients/python/keyflow/partitions.py,
pinned by tests/partition/vectors.json), so a routing mistake shows as a
run in the wrong partition, never as a timing.
"""

import importlib.util
import json
import os
import shutil
import sys
import tempfile
import threading
import unittest
import uuid

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import harness  # noqa: E402

harness.stubs()
import grpc  # noqa: E402
from keyflow.v1 import coordinators_pb2 as C  # noqa: E402
from keyflow.v1 import coordinators_pb2_grpc as CG  # noqa: E402
from keyflow.v1 import runs_pb2 as R  # noqa: E402
from keyflow.v1 import runs_pb2_grpc as RG  # noqa: E402

_spec = importlib.util.spec_from_file_location(
    "kf_partitions", os.path.join(harness.ROOT, "clients", "python", "keyflow", "partitions.py"))
partitions = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(partitions)

HANDLERS = os.path.join(harness.BUILD, "handlers")


def batch_of_one():
    """A batch window that closes with its first event: one run per event."""
    return C.Rule(kind=C.RULE_KIND_BATCH, max_events=1)


def keys_in(workflow, count, partition, n):
    """n keys whose coordinator of `workflow` is in `partition`."""
    out, i = [], 0
    while len(out) < n:
        key = "key-%d" % i
        if partitions.of_coordinator(workflow, key, count) == partition:
            out.append(key)
        i += 1
    return out


class Stubs:
    def __init__(self, server):
        self.channel = grpc.insecure_channel(server.grpc_target)
        self.coords = CG.CoordinatorsStub(self.channel)
        self.runs = RG.RunsStub(self.channel)

    def close(self):
        self.channel.close()

    def send(self, workflow, key, event_id=None):
        event = C.Event(rule=batch_of_one(), input_json=json.dumps({"key": key}))
        if event_id:
            event.id = event_id
        return self.coords.SendEvent(C.SendEventRequest(workflow=workflow, key=key, event=event),
                                     timeout=30)

    def poll_all(self, workflow, want):
        """Leases runs of `workflow` until `want` distinct ones came."""
        got = {}

        def more():
            resp = self.runs.PollRuns(R.PollRunsRequest(workflows=[workflow], worker_id="w",
                                                        max_runs=10, wait_ms=200), timeout=30)
            for run in resp.runs:
                self_check = run.run_id not in got
                assert self_check, "run %s handed out twice" % run.run_id
                got[run.run_id] = run
            return len(got) >= want

        harness.wait_until(more, 60, "%d runs of %s" % (want, workflow))
        return got


class OneProcessManyPartitions(unittest.TestCase):
    """Four partitions in one process: every call works as with one."""

    COUNT = 4

    @classmethod
    def setUpClass(cls):
        cls.server = harness.Keyflowd(args=["--partition-count", str(cls.COUNT),
                                          "--plugin-dir", HANDLERS]).start()
        cls.stubs = Stubs(cls.server)

    @classmethod
    def tearDownClass(cls):
        cls.stubs.close()
        cls.server.stop()
        cls.server.cleanup()

    def test_the_data_directory_holds_one_store_per_partition(self):
        db = os.path.join(self.server.data_dir, "db")
        with open(os.path.join(db, "KEYFLOW-DATASET")) as f:
            self.assertIn("partitions %d\n" % self.COUNT, f.read())
        for p in range(self.COUNT):
            with open(os.path.join(db, "partitions", str(p), "KEYFLOW-PARTITION")) as f:
                text = f.read()
            self.assertIn("partition %d\npartitions %d\n" % (p, self.COUNT), text)
            self.assertTrue(os.path.exists(os.path.join(db, "partitions", str(p), "CURRENT")))
        self.assertTrue(os.path.exists(os.path.join(db, "home", "CURRENT")))

    def test_each_coordinator_lives_in_its_partition_and_its_runs_say_so(self):
        wf = "wf-" + uuid.uuid4().hex[:8]
        keys = ["order-%d" % i for i in range(40)]
        seen = set()
        for key in keys:
            receipt = self.stubs.send(wf, key).receipt
            want = partitions.of_coordinator(wf, key, self.COUNT)
            self.assertEqual(partitions.of_run_id(receipt.run_id, self.COUNT), want, receipt.run_id)
            seen.add(want)
        self.assertEqual(seen, set(range(self.COUNT)), "40 keys reach every partition")
        runs = self.stubs.poll_all(wf, len(keys))
        self.assertEqual(sorted(r.key for r in runs.values()), sorted(keys))
        for run in runs.values():
            done = self.stubs.runs.CompleteRun(R.CompleteRunRequest(
                run_id=run.run_id, lease=run.lease, result_json="true"), timeout=30)
            self.assertEqual(done.run.status, R.RUN_STATUS_COMPLETED)
            got = self.stubs.runs.GetRun(R.GetRunRequest(run_id=run.run_id), timeout=30)
            self.assertEqual(got.status, R.RUN_STATUS_COMPLETED)
        # ListRuns pages through every partition behind one token.
        listed, token, pages = [], "", 0
        while True:
            page = self.stubs.runs.ListRuns(R.ListRunsRequest(workflow=wf, page_size=7,
                                                              page_token=token), timeout=30)
            listed += [r.run_id for r in page.runs]
            token, pages = page.next_page_token, pages + 1
            self.assertLess(pages, 100)
            if not token:
                break
        self.assertEqual(sorted(listed), sorted(runs), "every run listed exactly once")
        d = self.stubs.coords.DescribeCoordinator(C.DescribeCoordinatorRequest(
            coordinator=C.CoordinatorRef(kind=C.RULE_KIND_BATCH, workflow=wf, key=keys[0])),
            timeout=30)
        self.assertEqual(d.coordinator.key, keys[0])

    def test_send_events_splits_by_partition_and_answers_in_order(self):
        wf = "many-" + uuid.uuid4().hex[:8]
        keys = ["k%d" % i for i in range(50)]
        events = [C.SendEventRequest(workflow=wf, key=k, event=C.Event(
            id="e-" + k, rule=batch_of_one(), input_json="1")) for k in keys]
        first = self.stubs.coords.SendEvents(C.SendEventsRequest(events=events), timeout=30)
        self.assertEqual(len(first.results), len(keys))
        for key, res in zip(keys, first.results):
            self.assertEqual(res.WhichOneof("outcome"), "response", res)
            self.assertTrue(res.response.receipt.run_id.startswith(key + "@"))
            self.assertEqual(partitions.of_run_id(res.response.receipt.run_id, self.COUNT),
                             partitions.of_coordinator(wf, key, self.COUNT))
        # A retry of the whole call: every event is a duplicate with its receipt.
        again = self.stubs.coords.SendEvents(C.SendEventsRequest(events=events), timeout=30)
        for a, b in zip(first.results, again.results):
            self.assertEqual(a.response.receipt.run_id, b.response.receipt.run_id)
            self.assertEqual(b.response.disposition, C.DISPOSITION_DUPLICATE)
        self.assertEqual(len(self.stubs.poll_all(wf, len(keys))), len(keys))

    def test_a_long_poll_parks_on_every_partition(self):
        for partition in (0, self.COUNT - 1):
            wf = "park-%d-%s" % (partition, uuid.uuid4().hex[:8])
            key = keys_in(wf, self.COUNT, partition, 1)[0]
            result = {}

            def poll():
                result["resp"] = self.stubs.runs.PollRuns(R.PollRunsRequest(
                    workflows=[wf], worker_id="parked", wait_ms=20000), timeout=30)

            t = threading.Thread(target=poll)
            t.start()
            # The poll must be parked before the event comes; while it
            # waits, nothing else answers it. A poll that missed the
            # partition would come back empty after 20 s instead.
            harness.wait_until(lambda: self.parked_polls() >= self.COUNT, 20,
                               "the poll parked in all %d partitions" % self.COUNT)
            self.stubs.send(wf, key)
            t.join(40)
            self.assertFalse(t.is_alive())
            self.assertEqual([r.key for r in result["resp"].runs], [key],
                             "partition %d's run reached the parked poll" % partition)

    def parked_polls(self):
        status, text = self.server.http("GET", "/metrics")
        for line in text.splitlines():
            if line.startswith("keyflow_parked_polls "):
                return int(line.split()[1])
        return 0

    def test_registration_reaches_every_partition(self):
        with open(os.path.join(HANDLERS, "running_sum.descriptor.json")) as f:
            descriptor = json.load(f)
        status, body = self.server.http("POST", "/v1/functions", descriptor)
        self.assertEqual(status, 200, body)
        status, again = self.server.http("POST", "/v1/functions", descriptor)
        self.assertEqual(status, 200, again)
        self.assertTrue(again.get("alreadyRegistered"), again)
        self.assertEqual(again["function"]["descriptorSha256"],
                         body["function"]["descriptorSha256"])
        status, got = self.server.http("GET", "/v1/functions/running_sum")
        self.assertEqual(status, 200, got)
        self.assertTrue(got.get("available"), got)
        status, listed = self.server.http("GET", "/v1/functions")
        self.assertEqual([f["descriptor"]["functionId"] for f in listed["functions"]],
                         ["running_sum"])


class Placement(unittest.TestCase):
    """Two processes serving disjoint halves of one data set."""

    COUNT = 4

    @classmethod
    def setUpClass(cls):
        cls.dir = tempfile.mkdtemp(prefix="kf-placement-")
        cls.placement = os.path.join(cls.dir, "placement")
        with open(cls.placement, "w") as f:
            f.write("# two nodes\npartitions 4\n"
                    "node node-a 0-1 a.example:50051 a.example:8070\n"
                    "node node-b 2-3 b.example:50051 b.example:8070\n")
        cls.a = harness.Keyflowd(args=["--partition-count", "4", "--placement", cls.placement,
                                     "--node", "node-a"]).start()
        cls.b = harness.Keyflowd(args=["--partition-count", "4", "--partitions", "2-3",
                                     "--placement", cls.placement]).start()
        cls.sa, cls.sb = Stubs(cls.a), Stubs(cls.b)

    @classmethod
    def tearDownClass(cls):
        for s in (cls.sa, cls.sb):
            s.close()
        for srv in (cls.a, cls.b):
            srv.stop()
            srv.cleanup()
        shutil.rmtree(cls.dir, ignore_errors=True)

    def test_a_key_of_another_process_is_refused_with_its_owner(self):
        wf = "own-" + uuid.uuid4().hex[:8]
        mine = keys_in(wf, self.COUNT, 1, 1)[0]
        theirs = keys_in(wf, self.COUNT, 2, 1)[0]
        self.sa.send(wf, mine)
        with self.assertRaises(grpc.RpcError) as ctx:
            self.sa.send(wf, theirs)
        e = ctx.exception
        self.assertEqual(e.code(), grpc.StatusCode.FAILED_PRECONDITION)
        self.assertIn("partition 2 of 4", e.details())
        self.assertIn("node-b", e.details())
        trailers = dict(e.trailing_metadata())
        self.assertEqual(trailers["keyflow-partition"], "2")
        self.assertEqual(trailers["keyflow-owner-node"], "node-b")
        self.assertEqual(trailers["keyflow-owner-grpc"], "b.example:50051")
        self.assertEqual(trailers["keyflow-owner-http"], "b.example:8070")
        # Over HTTP: 421 with the partition and its owner in the body.
        status, body = self.a.http("POST", "/v1/workflows/%s/keys/%s/events" % (wf, theirs),
                                   {"rule": {"kind": "batch", "maxEvents": 1}, "input": 1})
        self.assertEqual(status, 421, body)
        self.assertEqual(body["status"], "FAILED_PRECONDITION")
        self.assertEqual(body["partition"], 2)
        self.assertEqual(body["owner"], {"node": "node-b", "grpc": "b.example:50051",
                                         "http": "b.example:8070"})
        # Nothing of it was kept here, and the owner takes it.
        receipt = self.sb.send(wf, theirs).receipt
        self.assertEqual(partitions.of_run_id(receipt.run_id, self.COUNT), 2)
        with self.assertRaises(grpc.RpcError) as ctx:
            self.sa.runs.GetRun(R.GetRunRequest(run_id=receipt.run_id), timeout=30)
        self.assertEqual(ctx.exception.code(), grpc.StatusCode.FAILED_PRECONDITION)
        got = self.sb.runs.GetRun(R.GetRunRequest(run_id=receipt.run_id), timeout=30)
        self.assertEqual(got.key, theirs)

    def test_send_events_refuses_only_the_foreign_events(self):
        wf = "mixed-" + uuid.uuid4().hex[:8]
        mine = keys_in(wf, self.COUNT, 0, 2)
        theirs = keys_in(wf, self.COUNT, 3, 1)
        keys = [mine[0], theirs[0], mine[1]]
        resp = self.sa.coords.SendEvents(C.SendEventsRequest(events=[
            C.SendEventRequest(workflow=wf, key=k, event=C.Event(rule=batch_of_one(),
                                                                 input_json="1"))
            for k in keys]), timeout=30)
        outcomes = [r.WhichOneof("outcome") for r in resp.results]
        self.assertEqual(outcomes, ["response", "error", "response"])
        self.assertEqual(resp.results[1].error.status, "FAILED_PRECONDITION")
        self.assertIn("node-b", resp.results[1].error.message)


class Layout(unittest.TestCase):
    """The count is fixed at creation; a partition moves with its directory;
    a store written before partitions opens in place."""

    def setUp(self):
        self.dirs = []

    def tearDown(self):
        for d in self.dirs:
            shutil.rmtree(d, ignore_errors=True)

    def server(self, data_dir, *args):
        return harness.Keyflowd(data_dir=data_dir, args=list(args))

    def new_dir(self):
        d = tempfile.mkdtemp(prefix="kf-layout-")
        self.dirs.append(d)
        return d

    def refused(self, srv, text):
        with self.assertRaises(RuntimeError) as ctx:
            srv.start()
        srv.log.close()
        self.assertIn(text, str(ctx.exception))

    def test_the_partition_count_is_fixed_at_creation(self):
        d = self.new_dir()
        srv = self.server(d, "--partition-count", "2").start()
        self.assertEqual(srv.stop(), 0)
        self.refused(self.server(d, "--partition-count", "3"),
                     "the data set in %s has 2 partitions" % os.path.join(d, "db"))
        srv = self.server(d).start()  # without the flag: the stored count
        Stubs(srv).send("w", "k")
        self.assertEqual(srv.stop(), 0)

    def test_a_missing_partition_is_never_made_for_an_existing_data_set(self):
        d = self.new_dir()
        srv = self.server(d, "--partition-count", "4", "--partitions", "0-1").start()
        self.assertEqual(srv.stop(), 0)
        self.refused(self.server(d, "--partitions", "0-2"), "partition 2 is not in")
        self.assertFalse(os.path.exists(os.path.join(d, "db", "partitions", "2")))

    def test_a_partition_moves_with_its_directory(self):
        count, a_dir, b_dir = 4, self.new_dir(), self.new_dir()
        wf = "move-" + uuid.uuid4().hex[:8]
        moving = keys_in(wf, count, 3, 5)
        staying = keys_in(wf, count, 0, 5)
        a = self.server(a_dir, "--partition-count", "4").start()
        sa = Stubs(a)
        for k in moving + staying:
            sa.send(wf, k, event_id="e-" + k)
        sa.close()
        self.assertEqual(a.stop(), 0)
        # Stop its owner, move its directory, start it elsewhere.
        os.makedirs(os.path.join(b_dir, "db", "partitions"))
        shutil.move(os.path.join(a_dir, "db", "partitions", "3"),
                    os.path.join(b_dir, "db", "partitions", "3"))
        b = self.server(b_dir, "--partition-count", "4", "--partitions", "3").start()
        a = self.server(a_dir, "--partitions", "0-2").start()
        sa, sb = Stubs(a), Stubs(b)
        try:
            for k in moving:
                again = sb.send(wf, k, event_id="e-" + k)
                self.assertEqual(again.disposition, C.DISPOSITION_DUPLICATE,
                                 "%s: the moved partition remembers its events" % k)
                with self.assertRaises(grpc.RpcError) as ctx:
                    sa.send(wf, k, event_id="e-" + k)
                self.assertEqual(ctx.exception.code(), grpc.StatusCode.FAILED_PRECONDITION)
            for k in staying:
                self.assertEqual(sa.send(wf, k, event_id="e-" + k).disposition,
                                 C.DISPOSITION_DUPLICATE)
            runs = sb.poll_all(wf, len(moving))
            self.assertEqual(sorted(r.key for r in runs.values()), sorted(moving))
        finally:
            sa.close()
            sb.close()
            a.stop()
            b.stop()

    def test_a_store_written_before_partitions_opens_in_place(self):
        # A data set of one partition stores exactly what a single-store
        # keyflowd wrote (one RocksDB, same families and format); its
        # partition directory, moved to the top of an empty data directory,
        # is such a store.
        made, old = self.new_dir(), self.new_dir()
        srv = self.server(made, "--partition-count", "1").start()
        s = Stubs(srv)
        first = s.send("legacy", "k1", event_id="e-1").receipt
        s.close()
        self.assertEqual(srv.stop(), 0)
        store = os.path.join(old, "db")
        shutil.copytree(os.path.join(made, "db", "partitions", "0"), store)
        os.unlink(os.path.join(store, "KEYFLOW-PARTITION"))
        self.refused(self.server(old, "--partition-count", "4"), "a single store written before")
        srv = self.server(old).start()
        s = Stubs(srv)
        try:
            again = s.send("legacy", "k1", event_id="e-1")
            self.assertEqual(again.disposition, C.DISPOSITION_DUPLICATE)
            self.assertEqual(again.receipt.run_id, first.run_id)
            s.send("legacy", "k2")
            self.assertIn("a single store written before partitions", srv.read_log())
        finally:
            s.close()
            self.assertEqual(srv.stop(), 0)
        self.assertFalse(os.path.exists(os.path.join(store, "KEYFLOW-DATASET")),
                         "nothing on disk changes")
        self.assertFalse(os.path.exists(os.path.join(store, "partitions")))


if __name__ == "__main__":
    unittest.main()
