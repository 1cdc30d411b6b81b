"""keyflow.Worker against a real keyflowd: results and errors, N runs at
once, heartbeats that outlive the lease, shutdown that finishes or releases,
SIGTERM in a worker process, and reconnecting after a keyflowd restart."""

import os
import select
import signal
import subprocess
import sys
import textwrap
import threading
import unittest

import keyflow
from sdk_harness import WAIT_S, restart_same_port, start_server, unique, wait_for

ONE = keyflow.batch(max_events=1)


def read_line(stream, what, timeout_s=30):
    """One line of a child's stdout, failing after timeout_s."""
    ready, _, _ = select.select([stream], [], [], timeout_s)
    if not ready:
        raise AssertionError("timed out after %d s waiting for %s" % (timeout_s, what))
    return stream.readline().decode().strip()


class WorkerTest(unittest.TestCase):
    def setUp(self):
        self.server = start_server()
        self.client = keyflow.Client(self.server.grpc_target)
        self.workers = []
        self.unblock = threading.Event()

    def tearDown(self):
        self.unblock.set()
        for w in self.workers:
            w.stop(grace_s=0)
        self.client.close()
        self.server.cleanup()

    def worker(self, **options):
        w = keyflow.Worker(self.client, worker_id=unique("w"), poll_wait_ms=1000, **options)
        self.workers.append(w)
        return w

    def send(self, wf, key, input=None):
        return self.client.send_event(wf, key, input, rule=ONE).run_id

    def send_once_up(self, wf, key, input):
        """send(), or None while the channel still reconnects (UNAVAILABLE:
        calls fail fast rather than wait for the connection)."""
        try:
            return self.send(wf, key, input)
        except keyflow.KeyflowError as e:
            if e.code_name != "UNAVAILABLE":
                raise
            return None

    def wait_status(self, run_id, status):
        return wait_for(lambda: (lambda r: r if r.status == status else None)(
            self.client.get_run(run_id)), "run %s to be %s" % (run_id, status))

    def test_results_errors_and_runs_at_once(self):
        wf_ok, wf_fail, wf_bad = unique("ok"), unique("fail"), unique("bad")
        at_once = threading.Barrier(4, timeout=20)  # breaks unless 4 run together
        w = self.worker(concurrency=4)

        @w.handle(wf_ok)
        def ok(input, run):
            at_once.wait()
            return {"got": input, "key": run.key, "attempts": run.attempts}

        w.handle(wf_fail, lambda input, run: 1 / 0)
        w.handle(wf_bad, lambda input, run: {1, 2})
        ids = [self.send(wf_ok, "k%d" % i, {"i": i}) for i in range(4)]
        w.start()
        for i, run_id in enumerate(ids):
            run = self.wait_status(run_id, "completed")
            self.assertEqual(run.result, {"got": [{"i": i}], "key": "k%d" % i, "attempts": 1})
        failed = self.wait_status(self.send(wf_fail, "f"), "failed")
        self.assertEqual(failed.error, "ZeroDivisionError: division by zero")
        bad = self.wait_status(self.send(wf_bad, "b"), "failed")
        self.assertIn("result: not JSON-serializable", bad.error)
        w.stop()
        self.assertEqual((w.completed, w.failed, w.lost, w.released), (4, 2, 0, 0))

    def test_heartbeats_keep_a_run_past_its_lease(self):
        wf = unique("hb")
        # A heartbeat every 200 ms: the lease survives one that a loaded
        # machine delays by up to 1.8 s.
        w = self.worker(concurrency=1, lease_ms=2000, heartbeat_fraction=0.1)
        w.handle(wf, lambda input, run: self.unblock.wait(WAIT_S) and "done")
        run_id = self.send(wf, "k")
        w.start()
        first = self.wait_status(run_id, "leased").lease_expires_ms
        # A lease extended from its first expiry on: without heartbeats the
        # run would have gone back to pending for a second attempt by then.
        wait_for(lambda: self.client.get_run(run_id).lease_expires_ms >= first + 2000,
                 "heartbeats to keep the lease past its first expiry")
        self.unblock.set()
        run = self.wait_status(run_id, "completed")
        self.assertEqual((run.result, run.attempts), ("done", 1))

    def test_stop_finishes_cooperative_runs_and_releases_the_rest(self):
        wf_coop, wf_stuck = unique("coop"), unique("stuck")
        w = self.worker(concurrency=2)
        started = threading.Semaphore(0)

        def coop(input, run):
            started.release()
            wait_for(lambda: run.stopping, "stop", timeout_s=30)
            return "finished"

        def stuck(input, run):
            started.release()
            self.unblock.wait(60)
            return "too late"

        w.handle(wf_coop, coop)
        w.handle(wf_stuck, stuck)
        coop_id, stuck_id = self.send(wf_coop, "c"), self.send(wf_stuck, "s")
        w.start()
        self.assertTrue(started.acquire(timeout=WAIT_S) and started.acquire(timeout=WAIT_S))
        # A grace no machine outlasts for the cooperative run; once it has
        # finished, a second stop() ends the grace for the stuck one. (A
        # short grace that runs out instead raced the cooperative run's
        # completion on a loaded machine.)
        w.stop(wait=False, grace_s=2 * WAIT_S)
        wait_for(lambda: w.completed == 1, "the cooperative run to finish during the grace")
        w.stop(grace_s=0)
        self.assertEqual(self.client.get_run(coop_id).result, "finished")
        self.assertEqual((w.completed, w.released), (1, 1))
        # Released: pending again at once, and the attempt does not count.
        run = self.client.get_run(stuck_id)
        self.assertEqual((run.status, run.attempts), ("pending", 0))
        again = self.client.poll_runs([wf_stuck], worker_id="other", wait_ms=5000)
        self.assertEqual([r.run_id for r in again], [stuck_id])

    def test_stop_waits_for_a_poll_with_runs_in_hand(self):
        """A poll whose answer arrived just as stop() cancelled it holds a
        leased run the worker has not registered yet: stop() must still
        finish or release it, never return with it leased and running
        unheartbeated. The seam holds the poller between the answer and
        the registration until stop() is done (or 2 s, when stop() rightly
        waits for the poller)."""
        import keyflow.worker as worker_module
        wf = unique("late")
        w = self.worker(concurrency=1, pollers=1, grace_s=0)
        w.handle(wf, lambda input, run: self.unblock.wait(60) and "too late")
        in_hand = threading.Event()
        real = worker_module.to_native

        def held(run):
            in_hand.set()
            w._done.wait(2)
            return real(run)
        worker_module.to_native = held
        self.addCleanup(setattr, worker_module, "to_native", real)
        run_id = self.send(wf, "k")
        w.start()
        self.assertTrue(in_hand.wait(WAIT_S), "the poll did not lease the run")
        w.stop()
        run = self.client.get_run(run_id)
        self.assertEqual((run.status, run.attempts), ("pending", 0),
                         "stop() returned with the run still leased")
        self.assertEqual(w.released, 1)

    def test_retryable_errors_are_retried_and_cancel_reaches_the_handler(self):
        wf_flaky, wf_long = unique("flaky"), unique("long")
        # Cancels reach the handler with heartbeats (every 300 ms); the lease
        # outlives one that a loaded machine delays by up to 2.7 s.
        w = self.worker(concurrency=2, lease_ms=3000, heartbeat_fraction=0.1)
        tries = []

        @w.handle(wf_flaky)
        def flaky(input, run):
            tries.append(run.attempts)
            if run.attempts < 3:
                raise keyflow.RetryableError("not yet")
            return "third time"

        @w.handle(wf_long)
        def long(input, run):
            wait_for(lambda: run.cancel_requested, "the cancel to reach the handler")
            return "stopped early"

        retry_now = keyflow.batch(max_events=1,
                                  retry=keyflow.retry(max_attempts=3, initial_backoff_ms=0))
        flaky_id = self.client.send_event(wf_flaky, "k", 1, rule=retry_now).run_id
        long_id = self.send(wf_long, "k")
        w.start()
        self.assertEqual(self.wait_status(flaky_id, "completed").result, "third time")
        self.assertEqual(tries, [1, 2, 3])
        self.wait_status(long_id, "leased")
        self.client.cancel_run(long_id)
        run = self.wait_status(long_id, "cancelled")
        self.assertEqual(run.result, "stopped early")
        w.stop()
        self.assertEqual((w.completed, w.retried, w.cancelled, w.failed), (1, 2, 1, 0))

    def test_sigterm_finishes_the_held_run_and_exits(self):
        wf = unique("term")
        script = textwrap.dedent("""
            import sys, time, keyflow
            w = keyflow.Worker(keyflow.Client(sys.argv[1]), concurrency=2, poll_wait_ms=1000)
            def handler(input, run):
                print("started", flush=True)  # the test's cue for SIGTERM
                while not run.stopping:
                    time.sleep(0.01)
                return {"stopped_cleanly": input}
            w.handle(sys.argv[2], handler)
            w.run()
            print("completed=%d released=%d" % (w.completed, w.released))
        """)
        run_id = self.send(wf, "k", "x")
        proc = subprocess.Popen([sys.executable, "-c", script, self.server.grpc_target, wf],
                                stdout=subprocess.PIPE, stderr=subprocess.PIPE, env=os.environ.copy())
        try:
            # SIGTERM once the handler runs: the server shows the run leased
            # before the worker has it, and a stop then cancels the poll.
            self.assertEqual(read_line(proc.stdout, "the handler to start"), "started")
            proc.send_signal(signal.SIGTERM)
            out, err = proc.communicate(timeout=30)
        finally:
            if proc.poll() is None:
                proc.kill()
                proc.wait()
        self.assertEqual(proc.returncode, 0, err.decode())
        self.assertEqual(out.decode().strip(), "completed=1 released=0")
        self.assertEqual(self.client.get_run(run_id).result, {"stopped_cleanly": ["x"]})

    def test_reconnects_after_keyflowd_restarts(self):
        wf = unique("re")
        w = self.worker(concurrency=2)
        w.handle(wf, lambda input, run: input)
        w.start()
        self.assertEqual(self.wait_status(self.send(wf, "a", 1), "completed").result, [1])
        restart_same_port(self.server)
        run_id = wait_for(lambda: self.send_once_up(wf, "b", 2), "keyflowd to answer again")
        self.assertEqual(self.wait_status(run_id, "completed").result, [2])
        w.stop()
        self.assertEqual(w.completed, 2)


if __name__ == "__main__":
    unittest.main()
