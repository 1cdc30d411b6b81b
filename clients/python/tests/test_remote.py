"""keyflow.FunctionWorker against a real keyflowd: the Python port of
handlers/running_sum.c (clients/python/examples/running_sum.py) gives byte
for byte the native handler's output on the same rows; timers, a refusal,
and a worker restart."""

import os
import sys
import time
import unittest

import keyflow
from keyflow.v1 import functions_pb2 as fpb
from sdk_harness import (HANDLERS, restart_same_port, running_sum_descriptor, start_server,
                         unique, wait_for)

EXAMPLES = os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "examples")
sys.path.insert(0, EXAMPLES)
import running_sum  # noqa: E402  (the example, as users run it)

T0_US = 1700000000000000


def rows_for(n, keys, seed=7):
    """Deterministic rows over `keys` keys: amounts, nulls, repeated keys."""
    out = []
    x = seed
    for i in range(n):
        x = (x * 1103515245 + 12345) % (1 << 31)
        amount = None if x % 17 == 0 else (x % 2001) - 1000
        out.append({"user": "u%04d" % (x % keys), "ts": T0_US + i, "amount": amount})
    return out


class RemoteHandlerTest(unittest.TestCase):
    @classmethod
    def setUpClass(cls):
        cls.server = start_server()
        cls.client = keyflow.Client(cls.server.grpc_target)

    @classmethod
    def tearDownClass(cls):
        cls.client.close()
        cls.server.stop()
        cls.server.cleanup()

    def serve(self, function_id, handler, **kw):
        w = keyflow.FunctionWorker(function_id, handler, self.client, **kw).start()
        self.addCleanup(w.stop)
        self.assertTrue(w.wait_welcomed(30), "the worker was not welcomed")
        return w

    def register_remote(self, handler=running_sum.running_sum, **kw):
        fid = unique("rs-py")
        digest = keyflow.FunctionWorker(fid, handler, self.client).digest
        base = running_sum_descriptor(fid)
        self.client.register_function(keyflow.remote_descriptor(base, digest, **kw))
        return fid

    def wait_due_timers_fired(self, fid):
        deadline = time.monotonic() + 30
        while int(self.client.get_function(fid)["due_timers"]) > 0:
            self.assertLess(time.monotonic(), deadline, "%s: due timers did not fire" % fid)
            time.sleep(0.01)

    def read_all(self, fid):
        """Every output row as the ReadOutput pages' columnar bytes, read
        with cursors as a user of the default 8 partitions does (the same
        rows give the same pages in turn). Each function is SINGLE: its
        pages come from its own home partition, which differs between
        the two functions compared, so the partition is left out."""
        stub = self.client._fns
        out, cursor = [], ""
        while True:
            resp = stub.ReadOutput(fpb.ReadOutputRequest(function_id=fid, cursor=cursor,
                                                         limit=1000))
            if resp.first_seq == 0:
                return out
            out.append(resp.batch.SerializeToString())
            cursor = resp.next_cursor

    def test_the_example_says_when_it_serves(self):
        """As README runs it: in the background, then push once it printed
        "serving ID" (pushing before that would find no function or no
        worker). The first line on stdout is that line, and a push right
        after it is handled."""
        import subprocess
        fid = unique("rs-example")
        env = dict(os.environ, KEYFLOW_ADDR=self.server.grpc_target,
                   PYTHONPATH=os.pathsep.join(p for p in sys.path if p))
        proc = subprocess.Popen([sys.executable, os.path.join(EXAMPLES, "running_sum.py"), fid],
                                stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env)
        self.addCleanup(proc.wait, 30)
        self.addCleanup(proc.terminate)
        first = proc.stdout.readline()  # "" if it ended first
        if first != "serving %s\n" % fid:
            proc.terminate()
            self.fail("first line %r; stderr: %s" % (first, proc.communicate(timeout=30)[1]))
        ack = self.client.producer(fid, "p-example").push(
            [{"user": "ann", "ts": T0_US, "amount": 5}])
        self.assertEqual(ack.rows_accepted, 1)
        self.assertEqual(self.client.key_state(fid, "ann").value, 5)

    def test_python_port_matches_native_byte_for_byte(self):
        native = unique("rs-native")
        self.client.register_function(running_sum_descriptor(native))
        remote = self.register_remote()
        w = self.serve(remote, running_sum.running_sum, concurrency=4)
        rows = rows_for(3000, 200)
        pn = self.client.producer(native, "p", next_sequence=1)
        pr = self.client.producer(remote, "p", next_sequence=1)
        for start in range(0, len(rows), 1000):
            chunk = rows[start:start + 1000]
            a = pn.push(chunk, watermark_us=T0_US + start)
            b = pr.push(chunk, watermark_us=T0_US + start)
            self.assertEqual((a.rows_accepted, a.activations, a.first_output_seq, a.last_output_seq),
                             (b.rows_accepted, b.activations, b.first_output_seq, b.last_output_seq))
        # A reset column is not in this schema; a null amount and repeats are.
        self.assertEqual(self.read_all(native), self.read_all(remote))
        self.assertGreater(w.calls, 0)
        for key in ("u0001", "u0150"):
            self.assertEqual(self.client.key_state(native, key), self.client.key_state(remote, key))
        info = self.client.get_function(remote)
        self.assertTrue(info.available)

    def test_timers_match_native_session_counter(self):
        """A port of handlers/session_counter.c: rows set an "idle" timer,
        watermarks fire them (timer activations, state cleared), byte for
        byte as the native handler."""
        import json

        def session_counter(act):
            if act.is_timer:
                act.emit(key=act.key_text, ts=act.event_time_us,
                         events=act.state if act.state_kind == "value" else 0)
                act.clear_state()
                return
            previous = act.state if act.state_kind == "value" else 0
            idle = act.get("idle_us")
            idle = 60000000 if idle is None else idle
            at = min(act.event_time_us + idle, (1 << 63) - 1)
            if act.watermark_us is not None and at <= act.watermark_us:
                at = act.watermark_us + 1
            act.set_state(previous + 1)
            act.set_timer("idle", at)

        with open(os.path.join(HANDLERS, "session_counter.descriptor.json")) as f:
            base = json.load(f)
        native, remote = unique("sc-native"), unique("sc-py")
        self.client.register_function(dict(base, functionId=native, pipelineStateId=native + ".s"))
        w = keyflow.FunctionWorker(remote, session_counter, self.client, concurrency=4)
        self.client.register_function(keyflow.remote_descriptor(
            dict(base, functionId=remote, pipelineStateId=remote + ".s"), w.digest))
        w.start()
        self.addCleanup(w.stop)
        self.assertTrue(w.wait_welcomed(30))
        x = 11
        for seq in range(1, 9):
            rows = []
            for i in range(400):
                x = (x * 1103515245 + 12345) % (1 << 31)
                rows.append({"user": "s%03d" % (x % 300), "ts": T0_US + seq * 1000000 + i,
                             "idle_us": None if x % 5 == 0 else 500000 + x % 3000000})
            for fid in (native, remote):
                self.client.push_batch(fid, "p", seq, rows, watermark_us=T0_US + seq * 1000000)
                # Timers past max_timer_callbacks_per_step fire in follow-on
                # steps the server runs between other work (all 300 keys
                # are in one partition); the next batch waits for them, so
                # both functions take the same steps in the same order.
                self.wait_due_timers_fired(fid)
        for fid in (native, remote):  # fire everything left
            self.client.push_batch(fid, "p", 99, [], watermark_us=T0_US + 10 ** 9)
            self.wait_due_timers_fired(fid)
        out = self.read_all(native)
        self.assertGreater(len(out), 0)
        self.assertEqual(self.read_all(remote), out)
        self.assertGreater(w.calls, 0)

    def test_overflow_refuses_the_batch_like_native(self):
        native = unique("rs-native")
        self.client.register_function(running_sum_descriptor(native))
        remote = self.register_remote()
        self.serve(remote, running_sum.running_sum)
        rows = [{"user": "big", "ts": T0_US, "amount": (1 << 63) - 1},
                {"user": "big", "ts": T0_US + 1, "amount": 1}]
        errors = []
        for fid in (native, remote):
            with self.assertRaises(keyflow.KeyflowError) as cm:
                self.client.push_batch(fid, "p", 1, rows)
            errors.append(cm.exception)
            self.assertEqual(self.client.key_state(fid, "big").state, "absent")
        self.assertEqual([e.code_name for e in errors], ["FAILED_PRECONDITION"] * 2)
        self.assertIn("int64 overflow adding amount 1", errors[1].message)
        self.assertEqual(errors[0].message, errors[1].message)

    def test_no_worker_is_unavailable_then_served(self):
        remote = self.register_remote()
        info = self.client.get_function(remote)
        self.assertFalse(info.available)
        self.assertIn("no worker serves", info.unavailable_reason)
        with self.assertRaises(keyflow.KeyflowError) as cm:
            self.client.push_batch(remote, "p", 1, [{"user": "a", "ts": T0_US, "amount": 1}],
                                   attempts=1)
        self.assertEqual(cm.exception.code_name, "UNAVAILABLE")
        self.serve(remote, running_sum.running_sum)
        ack = self.client.push_batch(remote, "p", 1, [{"user": "a", "ts": T0_US, "amount": 1}])
        self.assertEqual(ack.rows_accepted, 1)

    def test_handler_exception_refuses_the_call(self):
        def broken(act):
            raise RuntimeError("boom on %s" % act.key_text)
        remote = self.register_remote(broken)
        self.serve(remote, broken)
        with self.assertRaises(keyflow.KeyflowError) as cm:
            self.client.push_batch(remote, "p", 1, [{"user": "k", "ts": T0_US, "amount": 1}])
        self.assertEqual(cm.exception.code_name, "FAILED_PRECONDITION")
        self.assertIn("RuntimeError: boom on k", cm.exception.message)

    def test_bad_timer_arguments_refuse_the_call_and_the_worker_serves_on(self):
        """A timer name or time protobuf cannot encode is the handler's bug:
        its call is refused, naming the argument, and the same worker keeps
        serving (it once killed the worker's thread)."""
        def careless(act):
            if act["amount"] == 1:
                act.set_timer("t", 1.5)
            elif act["amount"] == 2:
                act.cancel_timer(7)
            running_sum.running_sum(act)
        remote = self.register_remote(careless)
        w = self.serve(remote, careless)
        for amount, expected in ((1, "set_timer: at_us 1.5 is not an int64"),
                                 (2, "cancel_timer: the timer name 7 is not a str")):
            with self.assertRaises(keyflow.KeyflowError) as cm:
                self.client.push_batch(remote, "p", amount,
                                       [{"user": "k", "ts": T0_US, "amount": amount}])
            self.assertEqual(cm.exception.code_name, "FAILED_PRECONDITION")
            self.assertIn(expected, cm.exception.message)
        ack = self.client.push_batch(remote, "p", 3, [{"user": "k", "ts": T0_US, "amount": 3}])
        self.assertEqual(ack.rows_accepted, 1)
        self.assertEqual(self.client.key_state(remote, "k").value, 3)
        self.assertEqual(w.connects, 1, "the worker kept its stream")

    def test_bools_and_ints_do_not_stand_in_for_each_other(self):
        """protobuf stores 5 in a BOOL column as true and True in an INT64
        column as 1: the handler's mistake refuses its call instead."""
        def handler(act):
            b, n = {1: (5, 1), 2: (True, True)}.get(act["amount"], (False, 7))
            act.emit(key=act.key_text, ts=act.event_time_us, b=b, n=n)
        fid = unique("typed-py")
        d = running_sum_descriptor(fid)
        d["outputSchema"] = {"fields": [{"name": "key", "type": "FIELD_TYPE_UTF8"},
                                        {"name": "ts", "type": "FIELD_TYPE_TIMESTAMP_US"},
                                        {"name": "b", "type": "FIELD_TYPE_BOOL"},
                                        {"name": "n", "type": "FIELD_TYPE_INT64"}]}
        w = keyflow.FunctionWorker(fid, handler, self.client)
        self.client.register_function(keyflow.remote_descriptor(d, w.digest))
        self.serve(fid, handler)
        for amount, text in ((1, "output field b: 5 is not a bool"),
                             (2, "output field n: True is not an int")):
            with self.assertRaises(keyflow.KeyflowError) as cm:
                self.client.push_batch(fid, "p", amount,
                                       [{"user": "k", "ts": T0_US, "amount": amount}])
            self.assertEqual(cm.exception.code_name, "FAILED_PRECONDITION")
            self.assertIn(text, cm.exception.message)
        self.client.push_batch(fid, "p", 3, [{"user": "k", "ts": T0_US, "amount": 3}])
        rows = self.client.read_output(fid, after_seq=0).rows
        self.assertEqual([(r["b"], r["n"]) for r in rows], [(False, 7)])

    def test_async_handlers_are_refused(self):
        """An async handler's answer would be only what it did before its
        first await (the batch was acknowledged with the rest silently
        missing): refused when the worker is made, and a handler returning
        an awaitable refuses its call."""
        async def coroutine(act):
            running_sum.running_sum(act)
        with self.assertRaises(ValueError) as cm:
            keyflow.FunctionWorker("x", coroutine, self.client, digest="0" * 64)
        self.assertIn("handlers are synchronous", str(cm.exception))

        def sneaky(act):
            return coroutine(act)
        remote = self.register_remote(sneaky)
        self.serve(remote, sneaky)
        with self.assertRaises(keyflow.KeyflowError) as cm:
            self.client.push_batch(remote, "p", 1, [{"user": "k", "ts": T0_US, "amount": 1}])
        self.assertEqual(cm.exception.code_name, "FAILED_PRECONDITION")
        self.assertIn("the handler returned an awaitable", cm.exception.message)
        self.assertEqual(self.client.key_state(remote, "k").state, "absent")

    def test_wrong_digest_is_refused_for_good(self):
        remote = self.register_remote()
        w = keyflow.FunctionWorker(remote, running_sum.running_sum, self.client, digest="0" * 64)
        with self.assertRaises(keyflow.KeyflowError) as cm:
            w.run(install_signal_handlers=False)
        self.assertEqual(cm.exception.code_name, "FAILED_PRECONDITION")
        self.assertIn("implementation_digest", cm.exception.message)

    def test_digest_is_sha256_of_the_sources(self):
        import hashlib
        path = running_sum.__file__
        with open(path, "rb") as f:
            data = f.read()
        w = keyflow.FunctionWorker("x", running_sum.running_sum, self.client)
        self.assertEqual(w.digest, hashlib.sha256(data).hexdigest())
        self.assertEqual(keyflow.implementation_digest(path, path),
                         hashlib.sha256(data * 2).hexdigest())


class RemoteReconnectTest(unittest.TestCase):
    def test_worker_reconnects_after_a_keyflowd_restart(self):
        server = start_server()
        self.addCleanup(server.cleanup)
        client = keyflow.Client(server.grpc_target)
        self.addCleanup(client.close)
        fid = unique("rs-py")
        w = keyflow.FunctionWorker(fid, running_sum.running_sum, client)
        client.register_function(keyflow.remote_descriptor(running_sum_descriptor(fid), w.digest))
        w.start()
        self.addCleanup(w.stop)
        self.assertTrue(w.wait_welcomed(30))
        client.push_batch(fid, "p", 1, [{"user": "a", "ts": T0_US, "amount": 1}])
        restart_same_port(server)
        wait_for(lambda: w.connects >= 2, "the worker to reconnect")
        ack = client.push_batch(fid, "p", 2, [{"user": "a", "ts": T0_US + 1, "amount": 2}])
        self.assertEqual(ack.rows_accepted, 1)
        self.assertEqual(client.key_state(fid, "a").value, 3)


if __name__ == "__main__":
    unittest.main()
