"""keyflow.Client against a real keyflowd: events, coordinators, runs,
functions (register, push, output, tail, key state), and a producer's retry
of one sequence across a keyflowd restart."""

import threading
import unittest

import keyflow
from sdk_harness import (restart_same_port, running_sum_descriptor, start_server, unique,
                         wait_for)

T0_US = 1700000000000000


class ClientTest(unittest.TestCase):
    @classmethod
    def setUpClass(cls):
        # One partition: these tests check after_seq paging, output seqs in
        # acks and trimming before a sequence, what one partition has
        # (test_partitions.py reads and trims with cursors over several).
        cls.server = start_server(["--partition-count", "1"])
        cls.client = keyflow.Client(cls.server.grpc_target)

    @classmethod
    def tearDownClass(cls):
        cls.client.close()
        cls.server.stop()
        cls.server.cleanup()

    # --- coordinators and runs ---------------------------------------------

    def test_send_event_native_input_and_receipt(self):
        wf = unique("wf")
        rule = keyflow.batch(max_events=2, max_wait_ms=60000)
        r1 = self.client.send_event(wf, "k1", {"item": 1, "tags": ["a"]}, rule=rule, id="e-1")
        self.assertTrue(r1.run_id.startswith("k1@"))
        self.assertGreater(r1.due_ms, 0)
        self.assertFalse(r1.duplicate)
        self.assertFalse(r1.run_started)
        again = self.client.send_event(wf, "k1", {"item": 1, "tags": ["a"]}, rule=rule, id="e-1")
        self.assertTrue(again.duplicate)
        self.assertEqual(again.run_id, r1.run_id)

        d = self.client.describe("batch", wf, "k1")
        self.assertTrue(d.exists)
        self.assertEqual(d.window.event_count, 1)
        self.assertEqual(d.window.rule.kind, "batch")
        self.assertEqual(d.coordinator.kind, "batch")
        self.assertEqual([j.what for j in d.journal][:1], ["event_accepted"])

        r2 = self.client.send_event(wf, "k1", "second", rule=rule)
        self.assertTrue(r2.run_started)
        run = self.client.get_run(r1.run_id)
        self.assertEqual(run.input, [{"item": 1, "tags": ["a"]}, "second"])
        self.assertEqual(run.status, "pending")
        self.assertEqual(run.kind, "batch")

    def test_receipts_edges_max_bytes_flush_and_send_events(self):
        """What a SendEvent answers beyond the run ID (disposition, commit
        sequence), the rule fields of debounce edges and batch max_bytes, a
        flushing event, and SendEvents with one answer per event."""
        wf = unique("wf")
        lead = keyflow.debounce(60000, edge="leading")
        first = self.client.send_event(wf, "l", 1, rule=lead, id="e-1")
        self.assertEqual((first.disposition, first.run_started), ("closed", True))
        self.assertGreater(first.commit_seq, 0)
        absorbed = self.client.send_event(wf, "l", 2, rule=lead)
        self.assertEqual((absorbed.disposition, absorbed.run_id), ("joined", first.run_id))
        self.assertGreater(absorbed.commit_seq, first.commit_seq)
        again = self.client.send_event(wf, "l", 1, rule=lead, id="e-1")
        self.assertEqual((again.disposition, again.commit_seq), ("duplicate", first.commit_seq))
        with self.assertRaises(ValueError) as cm:
            keyflow.debounce(60000, edge="sideways") and self.client.send_event(
                wf, "l", 1, rule=keyflow.debounce(60000, edge="sideways"))
        self.assertIn("rule.edge", str(cm.exception))

        small = keyflow.batch(max_events=100, max_wait_ms=60000, max_bytes=10)
        opened = self.client.send_event(wf, "b", "abc", rule=small)  # ["abc"]: 7 bytes
        self.assertEqual(opened.disposition, "opened")
        nxt = self.client.send_event(wf, "b", "d", rule=small)  # ["abc","d"] is 11: the next window
        self.assertEqual(nxt.disposition, "opened")
        self.assertNotEqual(nxt.run_id, opened.run_id)
        self.assertEqual(self.client.get_run(opened.run_id).input, ["abc"])
        flushed = self.client.send_event(wf, "b", "e", rule=small, flush=True)
        self.assertEqual((flushed.disposition, flushed.run_id), ("closed", nxt.run_id))
        self.assertEqual(self.client.get_run(nxt.run_id).input, ["d", "e"])

        one = keyflow.batch(max_events=2, max_wait_ms=60000)
        answers = self.client.send_events([
            {"workflow": wf, "key": "s", "input": {"n": 1}, "rule": one, "id": "x"},
            {"workflow": "", "key": "s", "rule": one},
            {"workflow": wf, "key": "s", "input": {"n": 2}, "rule": one, "id": "x"},
            {"workflow": wf, "key": "s", "input": {"n": 3}, "rule": one},
        ])
        self.assertEqual([a.disposition if isinstance(a, dict) else a.code_name for a in answers],
                         ["opened", "INVALID_ARGUMENT", "ALREADY_EXISTS", "closed"])
        self.assertIn("workflow", answers[1].message)
        self.assertEqual(answers[0].commit_seq, answers[3].commit_seq)
        self.assertEqual(self.client.get_run(answers[0].run_id).input, [{"n": 1}, {"n": 3}])
        self.assertEqual(self.client.send_events([]), [])

    def test_flush_cancel_and_list_runs(self):
        wf = unique("wf")
        rule = keyflow.debounce(window_ms=60000)
        for key in ("a", "b", "c"):
            self.client.send_event(wf, key, {"k": key}, rule=rule)
        f = self.client.flush("debounce", wf, "a")
        self.assertTrue(f.flushed)
        c = self.client.cancel("debounce", wf, "b")
        self.assertTrue(c.cancelled)
        self.assertEqual(c.events_dropped, 1)
        self.assertFalse(self.client.cancel("debounce", wf, "b").cancelled)
        self.client.flush("debounce", wf, "c")
        runs = list(self.client.list_runs(wf, status="pending", page_size=1))
        self.assertEqual(sorted(r.key for r in runs), ["a", "c"])
        self.assertEqual(sorted(r.input["k"] for r in runs), ["a", "c"])

    def test_poll_complete_result_is_native(self):
        wf = unique("wf")
        receipt = self.client.send_event(wf, "k", 7, rule=keyflow.batch(max_events=1))
        runs = self.client.poll_runs([wf], worker_id="w", wait_ms=5000)
        self.assertEqual([r.run_id for r in runs], [receipt.run_id])
        self.assertEqual(runs[0].input, [7])
        out = self.client.complete_run(runs[0].run_id, runs[0].lease, {"ok": True, "n": [1, 2]})
        self.assertEqual(out.run.status, "completed")
        self.assertFalse(out.already_finished)
        self.assertEqual(self.client.get_run(receipt.run_id).result, {"ok": True, "n": [1, 2]})

    def test_run_options_cancel_release_wait_and_key_filter(self):
        wf = unique("wf")
        one = keyflow.batch(max_events=1, key_concurrency=1,
                            retry=keyflow.retry(max_attempts=3, initial_backoff_ms=0))
        first = self.client.send_event(wf, "k", 1, rule=one, id="e-1").run_id
        second = self.client.send_event(wf, "k", 2, rule=one).run_id
        other = self.client.send_event(wf, "j", 3, rule=keyflow.batch(max_events=1)).run_id
        leased = self.client.poll_runs([wf], worker_id="w", max_runs=10)
        self.assertEqual(sorted(r.run_id for r in leased), sorted([first, other]))
        run = next(r for r in leased if r.run_id == first)
        self.assertEqual((run.max_attempts, run.event_ids), (3, ["e-1"]))
        done = self.client.complete_run(first, run.lease, error="busy", retryable=True)
        self.assertEqual((done.run.status, done.run.last_error), ("pending", "busy"))
        back = self.client.poll_runs([wf], worker_id="w")[0]
        self.assertEqual((back.run_id, back.attempts), (first, 2), "ahead of the key's next run")
        released = self.client.release_run(first, back.lease)
        self.assertEqual((released.status, released.attempts), ("pending", 1))
        self.assertEqual(self.client.cancel_run(first).status, "cancelled")
        self.assertEqual([r.run_id for r in self.client.list_runs(wf, key="k")], [first, second])
        with self.assertRaises(keyflow.KeyflowError) as e:
            self.client.release_run(first, back.lease)
        self.assertEqual(e.exception.code_name, "FAILED_PRECONDITION")
        with self.assertRaises(ValueError):
            keyflow.Client.send_event(self.client, wf, "k", 1,
                                      rule=keyflow.batch(retry={"tries": 2}))

    def test_wait_run_from_a_receipt(self):
        wf = unique("wf")
        r = self.client.send_event(wf, "k", {"x": 1},
                                   rule=keyflow.batch(max_events=2, max_wait_ms=60000))
        self.assertEqual(self.client.get_run(r.run_id).status, "window_open")
        self.assertEqual(self.client.get_run(r.run_id, wait_ms=100).status, "window_open")
        got = {}
        waiter = threading.Thread(target=lambda: got.update(run=self.client.wait_run(r.run_id)))
        waiter.start()
        self.client.flush("batch", wf, "k")
        run = self.client.poll_runs([wf], worker_id="w", wait_ms=5000)[0]
        self.client.complete_run(run.run_id, run.lease, {"ok": True})
        waiter.join(30)
        self.assertEqual((got["run"].status, got["run"].result), ("completed", {"ok": True}))
        pending = self.client.send_event(wf, "p", 1, rule=keyflow.batch(max_events=1)).run_id
        self.assertEqual(self.client.wait_run(pending, timeout_s=0.2).status, "pending")

    def test_errors_name_the_field(self):
        with self.assertRaises(keyflow.KeyflowError) as cm:
            self.client.send_event(unique("wf"), "k", 1, rule=keyflow.batch(max_events=0))
        self.assertEqual(cm.exception.code_name, "INVALID_ARGUMENT")
        self.assertIn("max_events", cm.exception.message)
        with self.assertRaises(ValueError) as cm:
            self.client.send_event("wf", "k", {1, 2}, rule=keyflow.debounce(10))
        self.assertIn("input", str(cm.exception))
        with self.assertRaises(ValueError):
            self.client.send_event("wf", "k", 1, rule={"kind": "batch", "windowMs": 5})
        with self.assertRaises(keyflow.KeyflowError) as cm:
            self.client.get_run("nope@0190")
        self.assertIn(cm.exception.code_name, ("NOT_FOUND", "INVALID_ARGUMENT"))

    # --- process functions -----------------------------------------------------

    def register(self):
        d = running_sum_descriptor()
        out = self.client.register_function(d)
        self.assertFalse(out.already_registered)
        return d["functionId"]

    def test_register_get_list(self):
        d = running_sum_descriptor()
        first = self.client.register_function(d)
        self.assertEqual(first.function.descriptor.function_id, d["functionId"])
        self.assertEqual(first.function.descriptor.runtime, "native")
        self.assertTrue(first.function.available)
        self.assertTrue(self.client.register_function(d).already_registered)
        info = self.client.get_function(d["functionId"])
        self.assertEqual([f.name for f in info.descriptor.input_schema.fields],
                         ["user", "ts", "amount"])
        self.assertIn(d["functionId"], [f.descriptor.function_id
                                        for f in self.client.list_functions(page_size=1)])

    def test_push_rows_and_columns_read_output_and_state(self):
        fid = self.register()
        p = self.client.producer(fid, "p1", next_sequence=1)
        ack = p.push([{"user": "ann", "ts": T0_US, "amount": 5},
                      {"user": "ann", "ts": T0_US + 1, "amount": 7},
                      {"user": "bob", "ts": T0_US + 2, "amount": None}], watermark_us=T0_US)
        self.assertEqual(ack.rows_accepted, 3)
        self.assertEqual((ack.first_output_seq, ack.last_output_seq), (1, 3))
        self.assertEqual(ack.sequence, 1)
        ack2 = p.push(columns={"user": ["ann", "bob"], "ts": [T0_US + 3, T0_US + 4],
                               "amount": [1, 2]})
        self.assertEqual(ack2.sequence, 2)
        self.assertEqual(ack2.last_output_seq, 5)

        page = self.client.read_output(fid, after_seq=0, limit=2)
        self.assertEqual(page.rows, [
            {"_seq": 1, "key": "ann", "ts": T0_US, "sum": 5, "previous": "absent"},
            {"_seq": 2, "key": "ann", "ts": T0_US + 1, "sum": 12, "previous": "value"}])
        rest = self.client.read_output(fid, after_seq=page.next_after_seq)
        self.assertEqual([(r["_seq"], r["key"], r["sum"], r["previous"]) for r in rest.rows],
                         [(3, "bob", None, "absent"), (4, "ann", 13, "value"),
                          (5, "bob", 2, "null")])
        self.assertEqual(rest.high_water_seq, 5)
        empty = self.client.read_output(fid, after_seq=5)
        self.assertEqual((empty.rows, empty.next_after_seq), ([], 5))

        ann = self.client.key_state(fid, "ann")
        self.assertEqual((ann.state, ann.value, ann.value_state_name), ("value", 13, "sum"))
        self.assertEqual(self.client.key_state(fid, ["nobody"]).state, "absent")
        self.assertIsNone(self.client.key_state(fid, "nobody").value)

    def test_trim_output_and_reads_below_the_retained_rows(self):
        fid = self.register()
        self.client.push_batch(fid, "p", 1, [{"user": "u", "ts": T0_US + i, "amount": i}
                                             for i in range(4)])
        out = self.client.trim_output(fid, 3)
        self.assertEqual((out.first_retained_seq, out.output_seq), (3, 4))
        self.assertEqual(self.client.trim_output(fid, 2).first_retained_seq, 3)
        with self.assertRaises(keyflow.KeyflowError) as cm:
            self.client.read_output(fid, after_seq=0)
        self.assertEqual(cm.exception.code_name, "OUT_OF_RANGE")
        self.assertIn("first retained sequence is 3", str(cm.exception))
        page = self.client.read_output(fid, after_seq=2)
        self.assertEqual(([r["_seq"] for r in page.rows], page.first_retained_seq), ([3, 4], 3))
        self.assertEqual(self.client.get_function(fid).first_retained_seq, 3)

    def test_delete_function_and_producer(self):
        fid = self.register()
        self.client.push_batch(fid, "p", 7, [{"user": "u", "ts": T0_US, "amount": 1}])
        gone = self.client.delete_producer(fid, "p")
        self.assertEqual((gone.deleted, gone.last_sequence), (True, 7))
        self.assertFalse(self.client.delete_producer(fid, "p", allow_missing=True).deleted)
        again = self.client.push_batch(fid, "p", 1, [{"user": "u", "ts": T0_US, "amount": 2}])
        self.assertFalse(again.duplicate)
        out = self.client.delete_function(fid)
        self.assertEqual((out["deleted"], out["keys"], out.output_rows, out.producers),
                         (True, 1, 2, 1))
        with self.assertRaises(keyflow.KeyflowError) as cm:
            self.client.get_function(fid)
        self.assertEqual(cm.exception.code_name, "NOT_FOUND")
        self.assertFalse(self.client.delete_function(fid, allow_missing=True).deleted)
        d = running_sum_descriptor()
        d["functionId"], d["pipelineStateId"] = fid, fid + ".v2"
        self.assertFalse(self.client.register_function(d).already_registered)
        self.assertEqual(self.client.key_state(fid, "u").state, "absent")

    def test_same_sequence_is_a_duplicate(self):
        fid = self.register()
        rows = [{"user": "u", "ts": T0_US, "amount": 1}]
        first = self.client.push_batch(fid, "p", 10, rows)
        again = self.client.push_batch(fid, "p", 10, rows)
        self.assertFalse(first.duplicate)
        self.assertTrue(again.duplicate)
        self.assertEqual(again.last_output_seq, first.last_output_seq)
        # A default producer's sequences come from the clock and increase.
        p = self.client.producer(fid)
        a, b = p.push(rows), p.push(rows)
        self.assertGreater(b.sequence, a.sequence)

    def test_bad_rows_name_row_and_field_and_send_nothing(self):
        fid = self.register()
        p = self.client.producer(fid, "p", next_sequence=1)
        cases = [
            ([{"user": "u", "ts": T0_US, "amount": "5"}], "rows[0].amount: expected INT64"),
            ([{"user": "u", "ts": T0_US}, {"user": None, "ts": T0_US}], "rows[1].user: null"),
            ([{"user": "u", "ts": True}], "rows[0].ts: expected TIMESTAMP_US"),
            ([{"user": "u", "ts": T0_US, "amt": 1}], "rows[0]: 'amt' is not a field"),
            ([{"user": "u", "ts": 2 ** 63}], "outside int64"),
        ]
        for rows, message in cases:
            with self.assertRaises(ValueError) as cm:
                p.push(rows)
            self.assertIn(message, str(cm.exception))
        with self.assertRaises(ValueError) as cm:
            p.push(columns={"user": ["a"], "ts": [1, 2]})
        self.assertIn("lengths differ", str(cm.exception))
        self.assertEqual(self.client.get_function(fid).output_seq, 0)
        self.assertEqual(p.push([{"user": "u", "ts": T0_US, "amount": 1}]).sequence, 1)

    def test_tail_follows_new_rows(self):
        fid = self.register()
        p = self.client.producer(fid, "p", next_sequence=1)
        p.push([{"user": "a", "ts": T0_US, "amount": 1}])
        got = []
        tail = self.client.tail_output(fid, after_seq=0)

        def consume():
            for row in tail:
                got.append(row)

        t = threading.Thread(target=consume)
        t.start()
        wait_for(lambda: len(got) >= 1, "the row pushed before the tail")
        p.push([{"user": "a", "ts": T0_US + 1, "amount": 2}, {"user": "b", "ts": T0_US + 1, "amount": 3}])
        wait_for(lambda: len(got) >= 3, "rows pushed after the tail started")
        tail.cancel()
        t.join(10)
        self.assertFalse(t.is_alive())
        self.assertEqual([(r["_seq"], r["key"], r["sum"]) for r in got],
                         [(1, "a", 1), (2, "a", 3), (3, "b", 3)])


class ProducerRetryTest(unittest.TestCase):
    """A push while keyflowd is down is retried with the same sequence
    until it is back; the batch is applied once."""

    def setUp(self):
        self.server = start_server()
        self.client = keyflow.Client(self.server.grpc_target)

    def tearDown(self):
        self.client.close()
        self.server.cleanup()

    def test_push_retries_same_sequence_across_restart(self):
        fid = self.client.register_function(running_sum_descriptor()).function.descriptor.function_id
        p = self.client.producer(fid, "p", next_sequence=1)
        p.push([{"user": "a", "ts": T0_US, "amount": 1}])
        port = self.server.grpc_port
        self.assertEqual(self.server.stop(), 0)
        result = {}

        def push():
            try:
                result["ack"] = p.push([{"user": "a", "ts": T0_US, "amount": 2}])
            except Exception as e:  # reported below
                result["error"] = e

        t = threading.Thread(target=push)
        t.start()
        wait_for(lambda: self.client.push_retries >= 1, "a retried push")
        self.server.args += ["--grpc", "127.0.0.1:%d" % port]
        self.server.start()
        t.join(30)
        self.assertNotIn("error", result)
        self.assertEqual(result["ack"].sequence, 2)
        self.assertFalse(result["ack"].duplicate)
        again = self.client.push_batch(fid, "p", 2, [{"user": "a", "ts": T0_US, "amount": 2}])
        self.assertTrue(again.duplicate)
        self.assertEqual(self.client.key_state(fid, "a").value, 3)


if __name__ == "__main__":
    unittest.main()


class TlsTest(unittest.TestCase):
    """The connection options reach the channel: TLS verified against a CA,
    and mTLS with a client certificate (certificates made with openssl)."""

    @classmethod
    def setUpClass(cls):
        import harness
        cls.pki = harness.Pki()
        cls.ca = cls.pki.ca("sdk-ca")
        cls.server_cert = cls.pki.leaf("server", cls.ca)
        cls.client_cert = cls.pki.leaf("client", cls.ca, client=True)
        cls.server = start_server(["--tls-cert", cls.server_cert[0], "--tls-key", cls.server_cert[1],
                                   "--tls-client-ca", cls.ca[0]])

    @classmethod
    def tearDownClass(cls):
        cls.server.stop()
        cls.server.cleanup()
        cls.pki.cleanup()

    def test_mtls_client_works_and_others_are_refused(self):
        wf = unique("tls")
        with keyflow.Client(self.server.grpc_target, tls_ca=self.ca[0], tls_cert=self.client_cert[0],
                            tls_key=self.client_cert[1], timeout_s=10) as c:
            self.assertTrue(c.send_event(wf, "k", 1, rule=keyflow.batch(max_events=1)).run_started)
        for options in ({}, {"tls_ca": self.ca[0]}):  # plaintext; TLS without a client certificate
            with keyflow.Client(self.server.grpc_target, timeout_s=5, **options) as c:
                with self.assertRaises(keyflow.KeyflowError) as cm:
                    c.send_event(wf, "k", 1, rule=keyflow.batch(max_events=1))
                self.assertEqual(cm.exception.code_name, "UNAVAILABLE")

    def test_environment_supplies_the_options(self):
        import os
        env = {"KEYFLOW_TLS_CA": self.ca[0], "KEYFLOW_TLS_CERT": self.client_cert[0],
               "KEYFLOW_TLS_KEY": self.client_cert[1], "KEYFLOW_ADDR": self.server.grpc_target}
        saved = {k: os.environ.get(k) for k in env}
        os.environ.update(env)
        try:
            with keyflow.Client(timeout_s=10) as c:
                self.assertTrue(c._conn.secure)
                self.assertEqual(c.describe("batch", unique("tls"), "k").exists, False)
        finally:
            for k, v in saved.items():
                if v is None:
                    os.environ.pop(k, None)
                else:
                    os.environ[k] = v
        with self.assertRaises(ValueError) as cm:
            keyflow.Client(self.server.grpc_target, tls_cert=self.client_cert[0])
        self.assertIn("tls_cert and tls_key", str(cm.exception))
