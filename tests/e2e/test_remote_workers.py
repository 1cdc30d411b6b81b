"""End-to-end tests of REMOTE process functions over the Workers stream
(api/keyflow/v1/workers.proto): what keyflowd does with a worker that
behaves, disconnects, answers late, answers garbage, answers wrongly or
announces the wrong digest. Each failure fails the batch waiting for it
and applies nothing; the producer's retry of the same sequence then
applies it exactly once.

The workers here are hand-driven streams (FakeWorker): a test decides what
each one sends and when. Their answers follow running_sum's contract
(handlers/running_sum.c); the SDK's own workers are tested in
clients/python/tests and clients/node/test.

Nothing sleeps for timing: every wait has a deadline.
"""

import json
import os
import queue
import socket
import sys
import threading
import unittest
import uuid

import grpc  # noqa: E402  (before harness.stubs(): see test_functions_grpc.py)

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import harness  # noqa: E402

HANDLERS = os.path.join(harness.BUILD, "handlers")
T0_US = 1700000000000000
WAIT_S = 30
SERVE = "/keyflow.v1.Workers/Serve"

fpb = wpb = fpg = None


def load_stubs():
    global fpb, wpb, fpg
    if fpb is None:
        harness.stubs()
        from keyflow.v1 import functions_pb2, functions_pb2_grpc, workers_pb2
        fpb, fpg, wpb = functions_pb2, functions_pb2_grpc, workers_pb2


def unique(prefix):
    return "%s-%s" % (prefix, uuid.uuid4().hex[:12])


class FakeWorker:
    """One Workers/Serve stream driven by the test. Messages from keyflowd
    land in `inbox`; the stream's final status in `code` / `details`."""

    _END = object()

    def __init__(self, target, function_id, digest, concurrency=1, first=None, key=None,
                 credentials=None):
        self.channel = (grpc.secure_channel(target, credentials) if credentials
                        else grpc.insecure_channel(target))
        self._out = queue.SimpleQueue()
        self.inbox = queue.SimpleQueue()
        self.ended = threading.Event()
        self.code = None
        self.details = None
        hello = wpb.WorkerMessage(hello=wpb.WorkerHello(
            function_id=function_id, implementation_digest=digest,
            max_concurrent_calls=concurrency, worker_name="fake"))
        self._out.put(first if first is not None else hello.SerializeToString())
        serve = self.channel.stream_stream(SERVE, request_serializer=None,
                                           response_deserializer=wpb.ServerMessage.FromString)
        metadata = [("authorization", "Bearer " + key)] if key else None
        self._call = serve(self._requests(), metadata=metadata)
        threading.Thread(target=self._read, daemon=True).start()

    def _requests(self):
        while True:
            item = self._out.get()
            if item is self._END:
                return
            yield item

    def _read(self):
        try:
            for msg in self._call:
                self.inbox.put(msg)
        except grpc.RpcError as e:
            self.code, self.details = e.code(), e.details()
        else:
            self.code, self.details = grpc.StatusCode.OK, ""
        self.ended.set()

    def welcome(self):
        return self.next("welcome")

    def next(self, kind="call", timeout=WAIT_S):
        try:
            msg = self.inbox.get(timeout=timeout)
        except queue.Empty:
            raise AssertionError("no %s within %d s (stream ended: %s %s)"
                                 % (kind, timeout, self.code, self.details)) from None
        assert msg.WhichOneof("message") == kind, "expected %s, got %s" % (kind, msg)
        return getattr(msg, kind)

    def send(self, result):
        self._out.put(wpb.WorkerMessage(result=result).SerializeToString())

    def send_raw(self, data):
        self._out.put(data)

    def close(self):
        self._out.put(self._END)

    def cancel(self):
        self._call.cancel()

    def wait_end(self, timeout=WAIT_S):
        assert self.ended.wait(timeout), "the stream did not end within %d s" % timeout
        return self.code, self.details

    def shutdown(self):
        self._call.cancel()
        self._out.put(self._END)
        self.channel.close()


def running_sum_result(call, state=None):
    """running_sum's answer to a call (no reset column; state: overrides)."""
    r = wpb.CallResult(call_id=call.call_id)
    amounts_col = call.rows.columns[2]
    amounts = list(amounts_col.int64s.values)
    nulls = list(amounts_col.nulls) or [False] * len(amounts)
    sums, sum_nulls, prev = [], [], []
    for i in range(len(call.activation_ids)):
        kind = call.states[i]
        prev.append({fpb.STATE_KIND_ABSENT: "absent", fpb.STATE_KIND_NULL: "null",
                     fpb.STATE_KIND_VALUE: "value"}[kind])
        if nulls[i]:
            r.mutations.append(wpb.MUTATION_SET_NULL)
            r.state_values.append(0)
            sums.append(0)
            sum_nulls.append(True)
        else:
            base = call.state_values[i] if kind == fpb.STATE_KIND_VALUE else 0
            r.mutations.append(wpb.MUTATION_SET)
            r.state_values.append(base + amounts[i])
            sums.append(base + amounts[i])
            sum_nulls.append(False)
    n = len(call.activation_ids)
    out = r.output
    out.row_count = n
    out.columns.add().strings.values.extend(call.key_texts)
    out.columns.add().int64s.values.extend(call.event_times_us)
    c = out.columns.add()
    c.int64s.values.extend(sums)
    if any(sum_nulls):
        c.nulls.extend(sum_nulls)
    out.columns.add().strings.values.extend(prev)
    r.output_activations.extend(range(n))
    return r


class RemoteWorkersTest(unittest.TestCase):
    @classmethod
    def setUpClass(cls):
        load_stubs()
        # One partition: the fake worker counts one engine's calls in
        # flight and answers its call IDs (harness.ONE_PARTITION); the SDK
        # workers' tests serve 8 partitions.
        cls.server = harness.Keyflowd(args=harness.ONE_PARTITION + [
            "--plugin-dir", HANDLERS]).start()
        cls.channel = grpc.insecure_channel(cls.server.grpc_target)
        cls.fns = fpg.FunctionsStub(cls.channel)
        with open(os.path.join(HANDLERS, "running_sum.descriptor.json")) as f:
            cls.native_json = json.load(f)

    @classmethod
    def tearDownClass(cls):
        cls.channel.close()
        code = cls.server.stop()  # under ASan a leak or an error is a nonzero exit
        log = cls.server.read_log()
        cls.server.cleanup()
        assert code == 0, "keyflowd exited %s; log:\n%s" % (code, log)

    # --- helpers ----------------------------------------------------------

    def register(self, remote=True, digest="ab" * 32, timeout_ms=None, fid=None):
        from google.protobuf import json_format
        d = dict(self.native_json)
        d["functionId"] = fid or unique("rw")
        d["pipelineStateId"] = d["functionId"] + ".state"
        if remote:
            d["runtime"] = "RUNTIME_REMOTE"
            d["implementationDigest"] = digest
            if timeout_ms is not None:
                d["limits"] = {"callTimeoutMs": timeout_ms}
        desc = json_format.ParseDict(d, fpb.FunctionDescriptor())
        self.fns.RegisterFunction(fpb.RegisterFunctionRequest(descriptor=desc), timeout=WAIT_S)
        return d["functionId"]

    def worker(self, fid, digest="ab" * 32, concurrency=1, first=None):
        w = FakeWorker(self.server.grpc_target, fid, digest, concurrency, first)
        self.addCleanup(w.shutdown)
        return w

    def batch(self, rows):
        b = fpb.RowBatch(row_count=len(rows))
        b.columns.add().strings.values.extend([r[0] for r in rows])
        b.columns.add().int64s.values.extend([T0_US + i for i in range(len(rows))])
        b.columns.add().int64s.values.extend([r[1] for r in rows])
        return b

    def push_async(self, fid, seq, rows, producer="p"):
        """PushBatch on a thread: returns a function giving (ack, error)."""
        out = {}
        req = fpb.PushBatchRequest(function_id=fid, producer_id=producer, sequence=seq,
                                   batch=self.batch(rows))

        def run():
            try:
                out["ack"] = self.fns.PushBatch(req, timeout=WAIT_S)
            except grpc.RpcError as e:
                out["error"] = e
        t = threading.Thread(target=run, daemon=True)
        t.start()

        def result():
            t.join(WAIT_S)
            self.assertFalse(t.is_alive(), "PushBatch did not return")
            return out.get("ack"), out.get("error")
        return result

    def output(self, fid):
        resp = self.fns.ReadOutput(fpb.ReadOutputRequest(function_id=fid, after_seq=0,
                                                         limit=10000), timeout=WAIT_S)
        return resp

    def state(self, fid, key):
        return self.fns.GetKeyState(fpb.GetKeyStateRequest(function_id=fid, key=key),
                                    timeout=WAIT_S)

    def assert_nothing_applied(self, fid, keys):
        self.assertEqual(self.output(fid).first_seq, 0, "no output row")
        for k in keys:
            self.assertEqual(self.state(fid, k).state, fpb.STATE_KIND_ABSENT)
        info = self.fns.GetFunction(fpb.GetFunctionRequest(function_id=fid), timeout=WAIT_S)
        self.assertEqual(info.keys, 0)

    def retry_applies_once(self, fid, rows, seq=1):
        """A good worker serves; the producer's retry of `seq` applies once."""
        good = self.worker(fid)
        good.welcome()
        result = self.push_async(fid, seq, rows)
        call = good.next()
        good.send(running_sum_result(call))
        ack, err = result()
        self.assertIsNone(err)
        self.assertFalse(ack.duplicate)
        again = self.fns.PushBatch(fpb.PushBatchRequest(
            function_id=fid, producer_id="p", sequence=seq, batch=self.batch(rows)),
            timeout=WAIT_S)
        self.assertTrue(again.duplicate)
        out = self.output(fid)
        self.assertEqual(out.last_seq - out.first_seq + 1, len(rows))
        return out

    # --- a worker that behaves --------------------------------------------

    def test_welcome_call_result(self):
        fid = self.register()
        w = self.worker(fid, concurrency=3)
        welcome = w.welcome()
        self.assertEqual(welcome.descriptor.function_id, fid)
        self.assertEqual(welcome.max_concurrent_calls, 3)
        self.assertEqual(welcome.descriptor.limits.call_timeout_ms, 10000)
        self.assertTrue(welcome.worker_id.startswith("w"))
        result = self.push_async(fid, 1, [("ann", 5), ("bob", 7)])
        call = w.next()
        self.assertEqual(list(call.key_texts), ["ann", "bob"])
        self.assertEqual(list(call.keys), [b"\0\0\0\3ann", b"\0\0\0\3bob"])
        self.assertEqual(list(call.callbacks), [wpb.CALLBACK_KIND_ROW] * 2)
        self.assertEqual(list(call.states), [fpb.STATE_KIND_ABSENT] * 2)
        self.assertEqual(call.rows.row_count, 2)
        self.assertEqual(list(call.activation_ids), [1, 2])
        w.send(running_sum_result(call))
        ack, err = result()
        self.assertIsNone(err)
        self.assertEqual((ack.rows_accepted, ack.activations, ack.handler_calls), (2, 2, 1))
        self.assertEqual(self.state(fid, "bob").value, 7)
        status, metrics = self.server.http("GET", "/metrics")
        self.assertEqual(status, 200)
        workers = [line for line in metrics.splitlines()
                   if line.startswith("keyflow_function_workers ")]
        self.assertEqual(len(workers), 1)
        self.assertGreaterEqual(float(workers[0].split()[1]), 1)

    def test_calls_are_pipelined_and_spread_over_workers(self):
        """Distinct keys: a step sends every call at once, across both
        workers (2 + 2 slots), before any result; results taken in any order
        leave the output in input order."""
        fid = self.register()
        a, b = self.worker(fid, concurrency=2), self.worker(fid, concurrency=2)
        a.welcome()
        b.welcome()
        rows = [("k%04d" % i, i) for i in range(1024)]  # 4 calls of 256
        result = self.push_async(fid, 1, rows)
        calls = [(a, a.next()), (a, a.next()), (b, b.next()), (b, b.next())]
        for w, call in reversed(calls):
            w.send(running_sum_result(call))
        ack, err = result()
        self.assertIsNone(err)
        self.assertEqual(ack.handler_calls, 4)
        out = self.output(fid)
        self.assertEqual(list(out.batch.columns[0].strings.values), [r[0] for r in rows])
        self.assertEqual(list(out.batch.columns[2].int64s.values), [r[1] for r in rows])

    def test_repeated_keys_wait_for_their_previous_row(self):
        """A key's second row waits until the call holding its first row is
        answered; rows of other keys do not."""
        fid = self.register()
        w = self.worker(fid, concurrency=4)
        w.welcome()
        rows = [("a", 1), ("b", 2), ("a", 10), ("c", 3)]
        result = self.push_async(fid, 1, rows)
        first = w.next()
        self.assertEqual(list(first.key_texts), ["a", "b", "c"])
        self.assertTrue(w.inbox.empty())  # "a" again must wait for `first`
        w.send(running_sum_result(first))
        second = w.next()
        self.assertEqual(list(second.key_texts), ["a"])
        self.assertEqual(list(second.state_values), [1])
        self.assertEqual(list(second.activation_ids), [3])  # its row's place
        w.send(running_sum_result(second))
        ack, err = result()
        self.assertIsNone(err)
        out = self.output(fid)
        self.assertEqual(list(out.batch.columns[0].strings.values), ["a", "b", "a", "c"])
        self.assertEqual(list(out.batch.columns[2].int64s.values), [1, 2, 11, 3])

    # --- failures: nothing applied, the retry applies once ---------------------

    def test_worker_disconnect_fails_the_batch(self):
        fid = self.register()
        w = self.worker(fid)
        w.welcome()
        rows = [("ann", 5), ("bob", 7)]
        result = self.push_async(fid, 1, rows)
        w.next()
        w.cancel()
        ack, err = result()
        self.assertIsNotNone(err)
        self.assertEqual(err.code(), grpc.StatusCode.UNAVAILABLE)
        self.assertIn("was lost", err.details())
        self.assert_nothing_applied(fid, ["ann", "bob"])
        self.retry_applies_once(fid, rows)

    def test_due_timers_resume_with_the_next_worker_after_one_is_lost(self):
        """Losing the worker in a follow-on timer step is no refusal of the
        timers: the next worker that connects fires them, with no batch
        pushed in between (once, the follow-on steps stopped until the
        function's next PushBatch)."""
        from google.protobuf import json_format
        d = dict(self.native_json, functionId=unique("rw-due"), runtime="RUNTIME_REMOTE",
                 implementationDigest="ab" * 32, timerNames=["t"],
                 limits={"maxTimerCallbacksPerStep": 2})
        d["pipelineStateId"] = d["functionId"] + ".state"
        fid = d["functionId"]
        self.fns.RegisterFunction(fpb.RegisterFunctionRequest(
            descriptor=json_format.ParseDict(d, fpb.FunctionDescriptor())), timeout=WAIT_S)
        first = self.worker(fid)
        first.welcome()
        keys = ["k%d" % i for i in range(5)]
        result = self.push_async(fid, 1, [(k, 1) for k in keys])
        call = first.next()
        arm = wpb.CallResult(call_id=call.call_id)
        for i in range(len(call.activation_ids)):  # timer t at T0 + 1000 for every key
            arm.timer_activations.append(i)
            arm.timer_ops.append(wpb.TIMER_OP_SET)
            arm.timer_names.append("t")
            arm.timer_at_us.append(T0_US + 1000)
        first.send(arm)
        self.assertIsNone(result()[1])
        # The watermark makes five timers due; the batch's step fires two.
        req = fpb.PushBatchRequest(function_id=fid, producer_id="p", sequence=2,
                                   watermark_us=T0_US + 2000)
        pushed = {}
        t = threading.Thread(target=lambda: pushed.update(ack=self.fns.PushBatch(
            req, timeout=WAIT_S)), daemon=True)
        t.start()
        call = first.next()
        self.assertEqual(list(call.callbacks), [wpb.CALLBACK_KIND_TIMER] * 2)
        first.send(wpb.CallResult(call_id=call.call_id))
        t.join(WAIT_S)
        self.assertEqual(pushed["ack"].due_timers, 3)
        first.next()  # the first follow-on step's call: the worker goes away with it
        first.cancel()

        def info():
            return self.fns.GetFunction(fpb.GetFunctionRequest(function_id=fid), timeout=WAIT_S)
        harness.wait_until(lambda: "was lost" in info().due_timers_error, WAIT_S,
                           "the follow-on step to fail")
        self.assertEqual(info().due_timers, 3)
        second = self.worker(fid)
        second.welcome()
        fired = 0
        while fired < 3:
            call = second.next()  # no batch pushed: the follow-on steps resume by themselves
            fired += len(call.activation_ids)
            second.send(wpb.CallResult(call_id=call.call_id))
        done = harness.wait_until(lambda: (lambda i: i if i.due_timers == 0 else None)(info()),
                                  WAIT_S, "the due timers to fire")
        self.assertEqual((done.timers, done.due_timers_error), (0, ""))

    def test_half_close_with_a_call_out_fails_the_batch(self):
        fid = self.register()
        w = self.worker(fid)
        w.welcome()
        result = self.push_async(fid, 1, [("ann", 5)])
        w.next()
        w.close()
        self.assertEqual(w.wait_end()[0], grpc.StatusCode.OK)
        ack, err = result()
        self.assertEqual(err.code(), grpc.StatusCode.UNAVAILABLE)
        self.assert_nothing_applied(fid, ["ann"])

    def test_late_answer_fails_the_batch_deadline_exceeded(self):
        fid = self.register(timeout_ms=200)
        w = self.worker(fid)
        self.assertEqual(w.welcome().descriptor.limits.call_timeout_ms, 200)
        rows = [("ann", 5)]
        result = self.push_async(fid, 1, rows)
        call = w.next()
        ack, err = result()  # not answered: the deadline passes
        self.assertEqual(err.code(), grpc.StatusCode.DEADLINE_EXCEEDED)
        self.assertIn("did not answer call %d within 200 ms" % call.call_id, err.details())
        code, details = w.wait_end()
        self.assertEqual(code, grpc.StatusCode.DEADLINE_EXCEEDED)
        w.send(running_sum_result(call))  # too late: the stream is over
        self.assert_nothing_applied(fid, ["ann"])
        self.retry_applies_once(fid, rows)

    def test_garbage_bytes_end_the_stream_and_fail_the_batch(self):
        fid = self.register()
        w = self.worker(fid)
        w.welcome()
        rows = [("ann", 5)]
        result = self.push_async(fid, 1, rows)
        w.next()
        w.send_raw(b"\xff\xff\xff\xff")
        ack, err = result()
        self.assertEqual(err.code(), grpc.StatusCode.UNAVAILABLE)
        code, details = w.wait_end()
        self.assertEqual(code, grpc.StatusCode.INVALID_ARGUMENT)
        self.assertIn("not a keyflow.v1.WorkerMessage", details)
        self.assert_nothing_applied(fid, ["ann"])
        self.retry_applies_once(fid, rows)

    def test_result_for_a_call_not_out_ends_the_stream(self):
        fid = self.register()
        w = self.worker(fid)
        w.welcome()
        result = self.push_async(fid, 1, [("ann", 5)])
        call = w.next()
        bad = running_sum_result(call)
        bad.call_id = call.call_id + 1000
        w.send(bad)
        ack, err = result()
        self.assertEqual(err.code(), grpc.StatusCode.UNAVAILABLE)
        self.assertEqual(w.wait_end()[0], grpc.StatusCode.FAILED_PRECONDITION)
        self.assert_nothing_applied(fid, ["ann"])

    def test_more_results_than_calls_ends_the_stream(self):
        fid = self.register()
        w = self.worker(fid)
        w.welcome()
        w.send(wpb.CallResult(call_id=1))
        code, details = w.wait_end()
        self.assertEqual(code, grpc.StatusCode.INVALID_ARGUMENT)
        self.assertIn("more results than calls", details)

    def test_invalid_results_are_refused_like_native(self):
        """Each answer breaks one rule: the batch fails FAILED_PRECONDITION
        naming it, nothing is applied, and the worker stays connected."""
        fid = self.register()
        w = self.worker(fid)
        w.welcome()

        def early_ts(r, call):
            r.output.columns[1].int64s.values[0] = call.event_times_us[0] - 1

        def null_key(r, call):
            r.output.columns[0].nulls.extend([True])

        def two_mutation_lists(r, call):
            r.mutations.append(wpb.MUTATION_CLEAR)

        def undeclared_timer(r, call):
            r.timer_activations.append(0)
            r.timer_ops.append(wpb.TIMER_OP_SET)
            r.timer_names.append("nope")
            r.timer_at_us.append(T0_US * 2)

        def bad_activation(r, call):
            r.output_activations[0] = 5

        def wrong_type(r, call):
            r.output.columns[2].ClearField("int64s")
            r.output.columns[2].strings.values.append("7")

        def refused(r, call):
            r.Clear()
            r.call_id = call.call_id
            r.error = "cannot take this"

        cases = [(early_ts, "before the activation's event time"),
                 (null_key, "non-nullable column key"),
                 (two_mutation_lists, "mutations"),
                 (undeclared_timer, "not declared in timer_names"),
                 (bad_activation, "activation index 5"),
                 (wrong_type, "column sum needs 1 values in int64s (0 given, "
                              "the column has strings)"),
                 (refused, "handler refused the call: cannot take this")]
        for seq, (breaker, text) in enumerate(cases, start=1):
            with self.subTest(breaker.__name__):
                result = self.push_async(fid, seq, [("ann", 5)])
                call = w.next()
                r = running_sum_result(call)
                breaker(r, call)
                w.send(r)
                ack, err = result()
                self.assertIsNotNone(err)
                self.assertEqual(err.code(), grpc.StatusCode.FAILED_PRECONDITION)
                self.assertIn(text, err.details())
                self.assert_nothing_applied(fid, ["ann"])
        self.assertFalse(w.ended.is_set())

    # --- hellos keyflowd refuses -------------------------------------------------

    def test_hellos_that_are_refused(self):
        remote = self.register()
        native = self.register(remote=False)
        cases = [
            (remote, "cd" * 32, 1, grpc.StatusCode.FAILED_PRECONDITION, "implementation_digest"),
            (native, "ab" * 32, 1, grpc.StatusCode.FAILED_PRECONDITION, "NATIVE"),
            (unique("nope"), "ab" * 32, 1, grpc.StatusCode.NOT_FOUND, "hello.function_id"),
            (remote, "ab" * 32, 65, grpc.StatusCode.INVALID_ARGUMENT, "max_concurrent_calls"),
            (remote, "ab" * 32, -1, grpc.StatusCode.INVALID_ARGUMENT, "max_concurrent_calls"),
        ]
        for fid, digest, concurrency, code, text in cases:
            with self.subTest(text=text, concurrency=concurrency):
                w = self.worker(fid, digest, concurrency)
                got, details = w.wait_end()
                self.assertEqual(got, code)
                self.assertIn(text, details)
        # A first message that is not a hello.
        first = wpb.WorkerMessage(result=wpb.CallResult(call_id=1)).SerializeToString()
        w = self.worker(remote, first=first)
        self.assertEqual(w.wait_end()[0], grpc.StatusCode.INVALID_ARGUMENT)
        # None of them serves: a batch is UNAVAILABLE and names the reason.
        with self.assertRaises(grpc.RpcError) as cm:
            self.fns.PushBatch(fpb.PushBatchRequest(function_id=remote, producer_id="p",
                                                    sequence=1, batch=self.batch([("a", 1)])),
                               timeout=WAIT_S)
        self.assertEqual(cm.exception.code(), grpc.StatusCode.UNAVAILABLE)
        self.assertIn("no worker serves", cm.exception.details())

    def test_descriptor_call_timeout_rules(self):
        from google.protobuf import json_format
        # NATIVE: the watchdog's bound (tests/e2e/test_watchdog.py); left out
        # of the canonical form at its default, kept otherwise.
        d = dict(self.native_json, functionId=unique("n"), pipelineStateId=unique("s"),
                 limits={"callTimeoutMs": 100})
        got = self.fns.RegisterFunction(fpb.RegisterFunctionRequest(
            descriptor=json_format.ParseDict(d, fpb.FunctionDescriptor())), timeout=WAIT_S)
        self.assertEqual(got.function.descriptor.limits.call_timeout_ms, 100)
        d = dict(self.native_json, functionId=unique("n"), pipelineStateId=unique("s"),
                 limits={"callTimeoutMs": 10000})
        got = self.fns.RegisterFunction(fpb.RegisterFunctionRequest(
            descriptor=json_format.ParseDict(d, fpb.FunctionDescriptor())), timeout=WAIT_S)
        self.assertEqual(got.function.descriptor.limits.WhichOneof("call_timeout_ms_present"),
                         None)
        with self.assertRaises(grpc.RpcError) as cm:
            self.register(timeout_ms=300001)
        self.assertIn("call_timeout_ms: must be in 1..300000", cm.exception.details())

    def test_non_loopback_workers_need_tls_and_a_key(self):
        """From another address: refused in plaintext even with an admin
        key; admitted over TLS with a key holding functions:serve."""
        address = non_loopback_address()
        if address is None:
            self.skipTest("this machine has no non-loopback IPv4 address")
        pki = harness.Pki()
        self.addCleanup(pki.cleanup)
        ca = pki.ca("ca")
        cert = pki.leaf("server", ca, san="IP:127.0.0.1,IP:%s" % address)
        for tls in (False, True):
            with self.subTest(tls=tls):
                args = ["--plugin-dir", HANDLERS, "--grpc", "0.0.0.0:0"]
                if tls:
                    args += ["--tls-cert", cert[0], "--tls-key", cert[1]]
                server = harness.Keyflowd(args=args).start()
                self.addCleanup(server.cleanup)
                with open(os.path.join(server.data_dir, "db", "bootstrap-admin.key")) as f:
                    key = f.read().strip()
                creds = None
                if tls:
                    creds = grpc.ssl_channel_credentials(root_certificates=harness.read_bytes(ca[0]))
                target = "%s:%d" % (address, server.grpc_port)
                fid = unique("rw")
                channel = (grpc.secure_channel(target, creds) if tls
                           else grpc.insecure_channel(target))
                self.addCleanup(channel.close)
                from google.protobuf import json_format
                d = dict(self.native_json, functionId=fid, pipelineStateId=fid + ".s",
                         runtime="RUNTIME_REMOTE", implementationDigest="ab" * 32)
                fpg.FunctionsStub(channel).RegisterFunction(
                    fpb.RegisterFunctionRequest(
                        descriptor=json_format.ParseDict(d, fpb.FunctionDescriptor())),
                    metadata=[("authorization", "Bearer " + key)], timeout=WAIT_S)
                w = FakeWorker(target, fid, "ab" * 32, key=key, credentials=creds)
                self.addCleanup(w.shutdown)
                if tls:
                    self.assertEqual(w.welcome().descriptor.function_id, fid)
                else:
                    code, details = w.wait_end()
                    self.assertEqual(code, grpc.StatusCode.PERMISSION_DENIED)
                    self.assertIn("loopback", details)
                w.shutdown()
                self.assertEqual(server.stop(), 0)


class RemoteShutdownTest(unittest.TestCase):
    """SIGTERM while a call is out: the batch fails UNAVAILABLE, the worker
    is told, keyflowd exits 0, and the batch's retry after the restart
    applies once."""

    def test_sigterm_with_a_call_out(self):
        load_stubs()
        server = harness.Keyflowd(args=["--plugin-dir", HANDLERS]).start()
        self.addCleanup(server.cleanup)
        helper = RemoteWorkersTest()
        helper.server = server
        channel = grpc.insecure_channel(server.grpc_target)
        self.addCleanup(channel.close)
        helper.fns = fpg.FunctionsStub(channel)
        with open(os.path.join(HANDLERS, "running_sum.descriptor.json")) as f:
            helper.native_json = json.load(f)
        helper.addCleanup = self.addCleanup
        helper.assertFalse = self.assertFalse
        fid = helper.register()
        w = helper.worker(fid)
        w.welcome()
        result = helper.push_async(fid, 1, [("ann", 5)])
        w.next()
        server.proc.send_signal(15)
        ack, err = result()
        self.assertEqual(err.code(), grpc.StatusCode.UNAVAILABLE)
        code, details = w.wait_end()
        self.assertEqual(code, grpc.StatusCode.UNAVAILABLE)
        self.assertIn("shutting down", details)
        self.assertEqual(server.proc.wait(WAIT_S), 0)
        server.proc = None
        server.log.close()


def non_loopback_address():
    """An IPv4 address of this machine that is not loopback, or None."""
    try:
        s = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
        s.connect(("192.0.2.1", 9))  # TEST-NET: nothing is sent
        address = s.getsockname()[0]
        s.close()
    except OSError:
        return None
    return None if address.startswith("127.") else address


if __name__ == "__main__":
    unittest.main()
