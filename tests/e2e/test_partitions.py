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
import re
import shutil
import subprocess
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
        harness.stopped(cls.server)

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
        # ListRuns pages through every partition behind one token, each
        # page filled from one partition after the other.
        listed, token, sizes = [], "", []
        while True:
            page = self.stubs.runs.ListRuns(R.ListRunsRequest(workflow=wf, page_size=7,
                                                              page_token=token), timeout=30)
            listed += [r.run_id for r in page.runs]
            token = page.next_page_token
            sizes.append(len(page.runs))
            self.assertLess(len(sizes), 100)
            if not token:
                break
        self.assertEqual(sorted(listed), sorted(runs), "every run listed exactly once")
        self.assertEqual(sizes[:-1], [7] * (len(sizes) - 1), "full pages but the last")
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


class FunctionsAcrossPartitions(unittest.TestCase):
    """Process functions on four partitions in one process: a batch splits by
    key, output merges behind a cursor, key state routes by key, and one
    worker stream serves every partition."""

    COUNT = 4
    BASE_US = 1700000000000000

    @classmethod
    def setUpClass(cls):
        cls.server = harness.Keyflowd(args=["--partition-count", str(cls.COUNT),
                                            "--plugin-dir", HANDLERS]).start()
        with open(os.path.join(HANDLERS, "running_sum.descriptor.json")) as f:
            # SPLIT: these tests are about a function whose keys spread over
            # the partitions (a SINGLE one's are all in its home).
            cls.descriptor = dict(json.load(f), placement="split")
        status, body = cls.server.http("POST", "/v1/functions", cls.descriptor)
        assert status == 200, body

    @classmethod
    def tearDownClass(cls):
        harness.stopped(cls.server)

    def ok(self, method, path, body=None):
        status, doc = self.server.http(method, path, body)
        self.assertEqual(status, 200, doc)
        return doc

    def read_all(self, function_id, cursor="", page=7):
        """Every output row after `cursor`, page by page; returns (rows, cursor)."""
        rows = []
        for _ in range(1000):
            doc = self.ok("GET", "/v1/functions/%s/output?limit=%d&cursor=%s"
                          % (function_id, page, cursor))
            got = doc.get("rows", [])
            self.assertTrue(doc.get("nextCursor"), doc)
            cursor = doc["nextCursor"]
            if not got:
                return rows, cursor
            p = doc.get("partition", 0)
            for row in got:
                self.assertEqual(partitions.of_key([row["key"]], self.COUNT), p,
                                 "a page holds rows of its partition only")
            self.assertEqual(doc["firstSeq"], got[0]["_seq"])
            rows += [(p, row) for row in got]
        self.fail("no end of output")

    def test_a_batch_of_one_partition_names_its_partition(self):
        # Passed on to its partition as it is, the batch's output sequences
        # are still that partition's own: the answer must say which.
        user = "solo-user"
        rows = [{"user": user, "ts": self.BASE_US + i, "amount": i} for i in range(3)]
        push = {"producerId": "solo", "sequence": 1, "rows": rows}
        # A function of its own: the other tests read all of running_sum's output.
        self.ok("POST", "/v1/functions", dict(self.descriptor, functionId="running_sum_solo",
                                                 pipelineStateId="running_sum_solo.v1"))
        ack = self.ok("POST", "/v1/functions/running_sum_solo/batches", push)
        want = partitions.of_key([user], self.COUNT)
        self.assertEqual(len(ack.get("outputRanges", [])), 1, ack)
        got = ack["outputRanges"][0]
        self.assertEqual(got.get("partition", 0), want, ack)
        self.assertEqual((got["firstSeq"], got["lastSeq"]),
                         (ack["firstOutputSeq"], ack["lastOutputSeq"]), ack)
        again = self.ok("POST", "/v1/functions/running_sum_solo/batches", push)
        self.assertTrue(again.get("duplicate"), again)
        self.assertEqual(again.get("outputRanges"), ack["outputRanges"])

    def test_a_batch_splits_by_key_and_its_output_merges_behind_one_cursor(self):
        users = ["user-%d" % i for i in range(16)]
        rows = [{"user": u, "ts": self.BASE_US + i, "amount": i} for i, u in enumerate(users)]
        rows += [{"user": u, "ts": self.BASE_US + 100 + i, "amount": i}
                 for i, u in enumerate(users)]
        push = {"producerId": "split", "sequence": 1, "watermarkUs": self.BASE_US, "rows": rows}
        ack = self.ok("POST", "/v1/functions/running_sum/batches", push)
        self.assertEqual(ack["rowsAccepted"], str(len(rows)))
        ranges = ack["outputRanges"]
        self.assertEqual(sorted({r.get("partition", 0) for r in ranges}),
                         sorted({partitions.of_key([u], self.COUNT) for u in users}))
        self.assertEqual(sum(int(r["lastSeq"]) - int(r["firstSeq"]) + 1 for r in ranges),
                         len(rows))
        again = self.ok("POST", "/v1/functions/running_sum/batches", push)
        self.assertTrue(again.get("duplicate"), again)
        self.assertEqual(again["outputRanges"], ranges)
        # Each partition kept its part of the batch: a replay runs them all.
        rep = self.ok("POST", "/v1/functions/running_sum/producers/split/batches/1:replay", {})
        self.assertEqual((rep.get("reproduced"), rep["recordedOutputRows"],
                          rep["replayedOutputRows"], rep["keysCompared"]),
                         (True, str(len(rows)), str(len(rows)), str(len(users))), rep)
        out, cursor = self.read_all("running_sum")
        self.assertEqual(len(out), len(rows), "every output row once")
        seen = {(p, r["_seq"]) for p, r in out}
        self.assertEqual(len(seen), len(rows))
        for i, u in enumerate(users):
            mine = [r for _, r in out if r["key"] == u]
            self.assertEqual([r["sum"] for r in mine], [str(i), str(2 * i)],
                             "%s: its rows in order, its state whole" % u)
            state = self.ok("GET", "/v1/functions/running_sum/keys/%s" % u)
            self.assertEqual(state.get("value", "0"), str(2 * i), state)
        # The cursor goes on from where it was: a new batch's rows only.
        self.ok("POST", "/v1/functions/running_sum/batches",
                {"producerId": "split", "sequence": 2,
                 "rows": [{"user": users[0], "ts": self.BASE_US + 200, "amount": 5}]})
        more, _ = self.read_all("running_sum", cursor)
        self.assertEqual([(r["key"], r["sum"]) for _, r in more], [(users[0], "5")])
        info = self.ok("GET", "/v1/functions/running_sum")
        self.assertEqual(info["keys"], str(len(users)))
        self.assertEqual(info["outputSeq"], str(len(rows) + 1), "rows written, all partitions")

    def test_a_deleted_function_goes_from_every_partition_and_may_come_back(self):
        d = dict(self.descriptor, functionId="rs_deleted", pipelineStateId="rs_deleted.state")
        self.ok("POST", "/v1/functions", d)
        users = ["del-%d" % i for i in range(12)]
        rows = [{"user": u, "ts": self.BASE_US + i, "amount": i} for i, u in enumerate(users)]
        self.ok("POST", "/v1/functions/rs_deleted/batches",
                {"producerId": "d", "sequence": 1, "rows": rows})
        gone = self.ok("DELETE", "/v1/functions/rs_deleted")
        self.assertEqual((gone.get("deleted"), gone.get("keys"), gone.get("outputRows")),
                         (True, str(len(users)), str(len(users))), "summed over the partitions")
        # The router forgot the descriptor it split by; registered again, the
        # function takes batches as new.
        self.ok("POST", "/v1/functions", d)
        self.ok("POST", "/v1/functions/rs_deleted/batches",
                {"producerId": "d", "sequence": 1, "rows": rows[:3]})
        self.assertEqual(self.ok("GET", "/v1/functions/rs_deleted")["keys"], "3")

    def test_a_tail_follows_every_partition_and_a_trim_goes_by_the_cursor(self):
        from keyflow.v1 import functions_pb2 as F
        from keyflow.v1 import functions_pb2_grpc as FG
        fid = "tail-" + uuid.uuid4().hex[:8]
        self.ok("POST", "/v1/functions", dict(self.descriptor, functionId=fid,
                                              pipelineStateId=fid + ".v1"))
        users = ["t%d" % i for i in range(12)]
        channel = grpc.insecure_channel(self.server.grpc_target)
        stub = FG.FunctionsStub(channel)
        call = stub.TailOutput(F.TailOutputRequest(function_id=fid, max_rows_per_message=3,
                                                   format=F.ROW_FORMAT_JSON), timeout=60)
        got, cursor = [], ""
        try:
            self.ok("POST", "/v1/functions/%s/batches" % fid, {
                "producerId": "t", "sequence": 1,
                "rows": [{"user": u, "ts": self.BASE_US, "amount": 1} for u in users]})
            for msg in call:
                page = json.loads(msg.rows_json)
                for row in page:
                    self.assertEqual(partitions.of_key([row["key"]], self.COUNT), msg.partition)
                got += [row["key"] for row in page]
                cursor = msg.next_cursor
                if len(got) >= len(users):
                    break
        finally:
            call.cancel()
            channel.close()
        self.assertEqual(sorted(got), sorted(users), "every partition's rows, once")
        # Trimming up to the cursor drops what was read, in every partition.
        self.ok("POST", "/v1/functions/%s/output:trim" % fid, {"beforeCursor": cursor})
        left, _ = self.read_all(fid, cursor)
        self.assertEqual(left, [])
        status, doc = self.server.http("GET", "/v1/functions/%s/output" % fid)
        self.assertEqual((status, doc["status"]), (400, "OUT_OF_RANGE"), doc)
        status, doc = self.server.http("POST", "/v1/functions/%s/output:trim" % fid,
                                       {"beforeSeq": "2"})
        self.assertEqual(status, 400, doc)

    def test_a_cursor_before_a_trim_is_answered_with_the_cursor_to_resume_from(self):
        fid = "resume-" + uuid.uuid4().hex[:8]
        self.ok("POST", "/v1/functions", dict(self.descriptor, functionId=fid,
                                              pipelineStateId=fid + ".v1"))
        users = ["r%d" % i for i in range(12)]
        self.assertGreater(len({partitions.of_key([u], self.COUNT) for u in users}), 1)
        self.ok("POST", "/v1/functions/%s/batches" % fid, {
            "producerId": "r", "sequence": 1,
            "rows": [{"user": u, "ts": self.BASE_US, "amount": 1} for u in users]})
        _, end = self.read_all(fid)
        self.ok("POST", "/v1/functions/%s/output:trim" % fid, {"beforeCursor": end})
        self.ok("POST", "/v1/functions/%s/batches" % fid, {
            "producerId": "r", "sequence": 2,
            "rows": [{"user": u, "ts": self.BASE_US + 1, "amount": 2} for u in users]})
        # From the start (an empty cursor, or any cursor older than the trim),
        # each partition behind the trim answers OUT_OF_RANGE, when its turn
        # comes, with a cursor that moves it to its first retained row and
        # keeps the rest.
        cursor, refusals, rows = "", 0, []
        for _ in range(100):
            status, doc = self.server.http(
                "GET", "/v1/functions/%s/output?limit=100&cursor=%s" % (fid, cursor))
            if status != 200:
                self.assertEqual((status, doc["status"]), (400, "OUT_OF_RANGE"), doc)
                self.assertIn("resume with cursor ", doc["message"])
                cursor = doc["message"].rsplit("resume with cursor ", 1)[1]
                refusals += 1
                self.assertLessEqual(refusals, self.COUNT, doc)
                continue
            if not doc.get("rows"):
                break
            rows += doc["rows"]
            cursor = doc["nextCursor"]
        self.assertGreater(refusals, 0)
        self.assertEqual(sorted(row["key"] for row in rows), sorted(users),
                         "every partition's retained rows, and nothing trimmed")

    def test_after_seq_is_refused_with_several_partitions(self):
        status, doc = self.server.http("GET", "/v1/functions/running_sum/output?after=3")
        self.assertEqual(status, 400, doc)
        self.assertIn("cursor", doc["message"])

    def test_a_forged_cursor_is_refused_naming_its_field(self):
        """Positions past int64 (or the last one TrimOutput can pass on),
        signs, empty numbers and partitions out of range: INVALID_ARGUMENT
        naming the field, never a position clamped or wrapped."""
        huge = "99999999999999999999"  # past int64
        last = "9223372036854775807"  # TrimOutput trims to the position + 1
        for cursor in ["o1.4.0.0-" + huge, "o1.4.0.0-" + last, "o1.4.0.0-+1", "o1.4.",
                       "o1.4.4", "o1.4.0.4-1", "o1.4.0.0-1.0-2", "o1.4.0.0-0"]:
            status, doc = self.server.http(
                "GET", "/v1/functions/running_sum/output?limit=1&cursor=" + cursor)
            self.assertEqual((status, doc.get("status")), (400, "INVALID_ARGUMENT"), cursor)
            self.assertTrue(doc["message"].startswith("cursor: "), doc)
            status, doc = self.server.http("POST", "/v1/functions/running_sum/output:trim",
                                           {"beforeCursor": cursor})
            self.assertEqual((status, doc.get("status")), (400, "INVALID_ARGUMENT"), cursor)
            self.assertTrue(doc["message"].startswith("before_cursor: "), doc)
        # The largest position is still a cursor (after every row written).
        doc = self.ok("GET", "/v1/functions/running_sum/output?limit=1&cursor=o1.4.0.0-"
                      + str(int(last) - 1))
        self.assertIn("o1.4.", doc["nextCursor"])
        if doc.get("rows"):
            self.assertNotEqual(doc.get("partition", 0), 0, "partition 0 was read to its end")

    def serve_one_batch(self, worker, fid, users, sequence):
        """Pushes `users` as batch `sequence` while `worker` answers every call;
        returns the ack and the keys the worker was called for."""
        import test_remote_workers as rw
        result = {}

        def push():
            result["ack"] = self.server.http("POST", "/v1/functions/%s/batches" % fid, {
                "producerId": "w", "sequence": sequence,
                "rows": [{"user": u, "ts": self.BASE_US + i, "amount": 1}
                         for i, u in enumerate(users)]})
            if result["ack"][0] != 200:
                worker.inbox.put(rw.wpb.ServerMessage())  # no call will come: wake next()

        t = threading.Thread(target=push)
        t.start()
        served = set()
        try:
            while len(served) < len(users):
                call = worker.next()
                for key in call.key_texts:
                    served.add(key)
                worker.send(rw.running_sum_result(call))
        except AssertionError:
            t.join(30)
            if result.get("ack", (200,))[0] == 200:
                raise
        finally:
            t.join(30)
        self.assertFalse(t.is_alive())
        status, doc = result["ack"]
        self.assertEqual(status, 200, doc)
        return doc, served

    def remote_function(self):
        import test_remote_workers as rw
        rw.load_stubs()
        fid = "remote-" + uuid.uuid4().hex[:8]
        d = dict(self.descriptor, functionId=fid, pipelineStateId=fid + ".v1",
                 runtime="RUNTIME_REMOTE", implementationDigest="ab" * 32)
        self.ok("POST", "/v1/functions", d)
        return fid

    def test_one_worker_stream_serves_every_partition(self):
        import test_remote_workers as rw
        fid = self.remote_function()
        worker = rw.FakeWorker(self.server.grpc_target, fid, "ab" * 32, concurrency=2)
        try:
            worker.welcome()
            users = ["w%d" % i for i in range(12)]
            self.assertEqual(len({partitions.of_key([u], self.COUNT) for u in users}), self.COUNT)
            ack, served = self.serve_one_batch(worker, fid, users, 1)
            self.assertEqual(ack["rowsAccepted"], str(len(users)))
            self.assertEqual(served, set(users))
            out, _ = self.read_all(fid)
            self.assertEqual(sorted(r["key"] for _, r in out), sorted(users))
        finally:
            worker.shutdown()

    def test_a_welcomed_worker_serves_every_partition_at_once(self):
        """The welcome means every partition has the worker: a batch pushed
        the moment it arrives reaches all of them (no UNAVAILABLE from a
        partition that had not taken the hello yet)."""
        import test_remote_workers as rw
        fid = self.remote_function()
        users = ["w%d" % i for i in range(12)]
        for sequence in range(1, 41):
            worker = rw.FakeWorker(self.server.grpc_target, fid, "ab" * 32, concurrency=2)
            try:
                worker.welcome()
                ack, served = self.serve_one_batch(worker, fid, users, sequence)
                self.assertEqual(served, set(users), "round %d" % sequence)
            finally:
                worker.shutdown()


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
                                       "--node", "node-a", "--plugin-dir", HANDLERS]).start()
        cls.b = harness.Keyflowd(args=["--partition-count", "4", "--partitions", "2-3",
                                       "--placement", cls.placement,
                                       "--plugin-dir", HANDLERS]).start()
        cls.sa, cls.sb = Stubs(cls.a), Stubs(cls.b)

    @classmethod
    def tearDownClass(cls):
        for s in (cls.sa, cls.sb):
            s.close()
        for srv in (cls.a, cls.b):
            harness.stopped(srv)
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

    def test_each_process_tells_its_placement(self):
        from keyflow.v1 import partitions_pb2 as PL
        from keyflow.v1 import partitions_pb2_grpc as PLG
        for srv, served, node in ((self.a, "0-1", "node-a"), (self.b, "2-3", "")):
            channel = grpc.insecure_channel(srv.grpc_target)
            try:
                p = PLG.PartitionsStub(channel).GetPlacement(PL.GetPlacementRequest(), timeout=30)
            finally:
                channel.close()
            self.assertEqual((p.partition_count, p.hash, p.served, p.node),
                             (self.COUNT, "kf-hash-1", served, node))
            self.assertEqual([h.partition for h in p.partitions],
                             [int(x) for x in served.split("-")])
            self.assertTrue(all(h.ready and h.id for h in p.partitions), p.partitions)
            self.assertEqual([(n.name, n.partitions, n.grpc_address) for n in p.nodes],
                             [("node-a", "0-1", "a.example:50051"),
                              ("node-b", "2-3", "b.example:50051")])
            routes = {r.method: r for r in p.routes}
            send = routes["/keyflow.v1.Coordinators/SendEvent"]
            self.assertEqual((send.kind, list(send.fields)), ("by_coordinator", ["workflow", "key"]))
            self.assertEqual(routes["/keyflow.v1.Runs/PollRuns"].plan, "poll_runs")
        status, doc = self.b.http("GET", "/v1/partitions")
        self.assertEqual(status, 200, doc)
        self.assertEqual((doc["partitionCount"], doc["served"]), (4, "2-3"))

    def test_a_batch_with_a_row_of_another_process_changes_nothing(self):
        with open(os.path.join(HANDLERS, "running_sum.descriptor.json")) as f:
            descriptor = dict(json.load(f), placement="split")
        for srv in (self.a, self.b):
            status, body = srv.http("POST", "/v1/functions", descriptor)
            self.assertEqual(status, 200, body)
        users = ["p-%d" % i for i in range(12)]
        mine = [u for u in users if partitions.of_key([u], self.COUNT) in (0, 1)]
        theirs = [u for u in users if partitions.of_key([u], self.COUNT) in (2, 3)]
        self.assertTrue(mine and theirs)
        status, body = self.a.http("POST", "/v1/functions/running_sum/batches", {
            "producerId": "mixed", "sequence": 1,
            "rows": [{"user": u, "ts": 1, "amount": 1} for u in users]})
        self.assertEqual(status, 421, body)
        self.assertIn(body["partition"], (2, 3))
        self.assertEqual(body["owner"]["node"], "node-b")
        for u in mine:
            status, state = self.a.http("GET", "/v1/functions/running_sum/keys/%s" % u)
            self.assertEqual(state.get("state"), "STATE_KIND_ABSENT", "%s: nothing applied" % u)
        status, body = self.a.http("GET", "/v1/functions/running_sum/keys/%s" % theirs[0])
        self.assertEqual(status, 421, body)

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


class KubernetesManifest(unittest.TestCase):
    """deploy/kubernetes/keyflow-partitions.yaml: a pod started as the
    manifest starts it (its ConfigMap's placement, its environment) serves
    its node's partitions and tells the whole placement. No cluster here:
    the manifest's keyflowd part is what can be checked."""

    MANIFEST = os.path.join(harness.ROOT, "deploy", "kubernetes", "keyflow-partitions.yaml")

    def test_a_pod_serves_what_the_config_map_gives_it(self):
        with open(self.MANIFEST) as f:
            text = f.read()
        block = text.split("placement: |\n", 1)[1]
        lines = []
        for line in block.splitlines():
            if not line.startswith("    "):
                break
            lines.append(line.strip())
        env = dict(re.findall(r"\{name: (KEYFLOW_[A-Z_]+), value: \"?([^\"}]*)\"?\}", text))
        names = set(re.findall(r"name: (KEYFLOW_[A-Z_]+)", text))
        # keyflowd's variables, and the CLI's (for `kubectl exec ... keyflow`).
        help_text = "".join(subprocess.run([exe, "--help"], capture_output=True, text=True).stdout
                            for exe in (harness.KEYFLOWD, harness.CLI))
        for name in names:
            self.assertIn(name, help_text, "the manifest sets %s: nothing reads it" % name)
        tmp = tempfile.mkdtemp(prefix="kf-manifest-")
        self.addCleanup(shutil.rmtree, tmp, True)
        placement = os.path.join(tmp, "placement")
        with open(placement, "w") as f:
            f.write("\n".join(lines) + "\n")
        nodes = [line.split() for line in lines if line.startswith("node ")]
        self.assertEqual([n[1] for n in nodes], ["keyflow-0", "keyflow-1", "keyflow-2"])
        srv = harness.Keyflowd(args=["--plugin-dir", HANDLERS], env={
            "KEYFLOW_NODE": "keyflow-1", "KEYFLOW_PLACEMENT": placement,
            "KEYFLOW_PARTITION_COUNT": env["KEYFLOW_PARTITION_COUNT"]}).start()
        try:
            status, doc = srv.http("GET", "/v1/partitions")
            self.assertEqual(status, 200, doc)
            self.assertEqual((doc["partitionCount"], doc["node"], doc["served"]),
                             (int(env["KEYFLOW_PARTITION_COUNT"]), "keyflow-1", nodes[1][2]))
            self.assertEqual([(n["name"], n["partitions"], n["grpcAddress"]) for n in doc["nodes"]],
                             [(n[1], n[2], n[3]) for n in nodes])
        finally:
            harness.stopped(srv)


class Layout(unittest.TestCase):
    """The count is fixed at creation; a partition moves with its directory;
    a store written before partitions opens in place."""

    def setUp(self):
        self.dirs = []

    def tearDown(self):
        for d in self.dirs:
            shutil.rmtree(d, ignore_errors=True)

    def server(self, data_dir, *args):
        srv = harness.Keyflowd(data_dir=data_dir, args=list(args))
        self.addCleanup(srv.cleanup)  # a failed assertion leaves no server behind
        return srv

    def new_dir(self):
        d = tempfile.mkdtemp(prefix="kf-layout-")
        self.dirs.append(d)
        return d

    def refused(self, srv, text):
        with self.assertRaises(RuntimeError) as ctx:
            srv.start()
        srv.log.close()
        self.assertIn(text, str(ctx.exception))

    def test_commit_sequences_are_per_partition_and_never_shared_across_a_kill(self):
        """Partition i of P numbers its writes i, i + P, ...: the events of
        one SendEvents share a number exactly when they share a partition's
        write, each partition's numbers increase, and a SIGKILL and restart
        continue them on the same residue (every partition once counted 1,
        2, 3, ..., so four writes answered the same number)."""
        count, d = 4, self.new_dir()
        srv = self.server(d, "--partition-count", str(count)).start()
        stubs = Stubs(srv)
        wf = "seq-" + uuid.uuid4().hex[:8]
        keys = [k for p in range(count) for k in keys_in(wf, count, p, 2)]
        part = {k: partitions.of_coordinator(wf, k, count) for k in keys}
        resp = stubs.coords.SendEvents(C.SendEventsRequest(events=[C.SendEventRequest(
            workflow=wf, key=k, event=C.Event(rule=batch_of_one(), input_json="1"))
            for k in keys]), timeout=30)
        seqs = {k: r.response.receipt.commit_seq for k, r in zip(keys, resp.results)}
        by_partition = {}
        for k in keys:
            self.assertEqual(seqs[k] % count, part[k], "commit_seq %d of key %s" % (seqs[k], k))
            by_partition.setdefault(part[k], set()).add(seqs[k])
        self.assertEqual([len(v) for v in by_partition.values()], [1] * count,
                         "one write per partition: %r" % by_partition)
        self.assertEqual(len(set(seqs.values())), count, "no two partitions share a number")
        last = {p: next(iter(v)) for p, v in by_partition.items()}

        def one_per_partition():
            for k in keys[::2]:
                seq = stubs.send(wf, k).receipt.commit_seq
                self.assertEqual(seq % count, part[k])
                self.assertGreater(seq, last[part[k]], "partition %d went back" % part[k])
                last[part[k]] = seq
        one_per_partition()
        srv.kill()
        stubs.close()
        srv = self.server(d).start()
        stubs = Stubs(srv)
        one_per_partition()
        stubs.close()
        self.assertEqual(srv.stop(), 0)

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

    def test_a_moved_partition_is_never_hidden_by_a_new_data_set_of_another_count(self):
        """A partition moved into a new data directory, started without
        --partition-count (or with another count): refused before anything
        is made, instead of a new data set whose empty partitions would
        serve its keys."""
        count, a_dir, b_dir = 4, self.new_dir(), self.new_dir()
        wf = "hide-" + uuid.uuid4().hex[:8]
        moving = keys_in(wf, count, 3, 3)
        a = self.server(a_dir, "--partition-count", str(count)).start()
        sa = Stubs(a)
        for k in moving:
            sa.send(wf, k, event_id="e-" + k)
        sa.close()
        self.assertEqual(a.stop(), 0)
        b_parts = os.path.join(b_dir, "db", "partitions")
        os.makedirs(b_parts)
        shutil.move(os.path.join(a_dir, "db", "partitions", "3"), os.path.join(b_parts, "3"))
        for args in ([], ["--partition-count", "8"], ["--partition-count", "2", "--partitions", "1"]):
            self.refused(self.server(b_dir, *args),
                         "holds partition 3 of a data set of 4 partitions")
            self.assertEqual(os.listdir(b_parts), ["3"], "nothing made beside it (%r)" % (args,))
            self.assertFalse(os.path.exists(os.path.join(b_dir, "db", "KEYFLOW-DATASET")))
        b = self.server(b_dir, "--partition-count", str(count), "--partitions", "3").start()
        sb = Stubs(b)
        try:
            for k in moving:
                self.assertEqual(sb.send(wf, k, event_id="e-" + k).disposition,
                                 C.DISPOSITION_DUPLICATE, "%s: adopted as it was" % k)
        finally:
            sb.close()
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
