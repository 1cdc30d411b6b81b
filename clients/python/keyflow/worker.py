"""keyflow.Worker: runs handler functions for the runs of some workflows.

    worker = keyflow.Worker(concurrency=64)

    @worker.handle("ship")
    def ship(input, run):
        return {"shipped": input}

    worker.run()      # until SIGTERM / SIGINT / worker.stop()

Threads and what they own:
  * the pollers (`pollers`, default 2) lease runs (PollRuns long poll,
    max_runs = free slots) and hand each to the pool; at most `concurrency`
    runs are held or asked for at once;
  * the pool (`concurrency` threads) calls the handler, then completes the
    run with its return value (JSON) or its exception (the error text; a
    keyflow.RetryableError asks for a retry under the rule's retry policy);
  * the heartbeater extends each held lease every lease_ms *
    heartbeat_fraction, and marks a run lost when the server refuses (the
    lease expired or was taken over): a lost run is not completed. A
    heartbeat that says the run was cancelled sets run.cancel_requested.

Lifecycle:
    run() --SIGTERM/stop()--> stopping: the poll is cancelled (it takes no
    run), held runs keep their heartbeats and may finish for grace_s -->
    runs still held are released (ReleaseRun: pending again at once for
    another worker, and the attempt does not count) --> run() returns.

Errors of the connection (UNAVAILABLE and the like) are retried with
exponential backoff, forever, until stop(); an error that retrying cannot
fix (UNAUTHENTICATED, PERMISSION_DENIED, INVALID_ARGUMENT) stops the worker
and run() raises it.
"""

import heapq
import logging
import os
import signal
import socket
import threading
import time
from concurrent.futures import ThreadPoolExecutor

import grpc

from ._connection import KeyflowError
from ._convert import encode_json, to_native
from .client import Client, backoff_delays
from .v1 import runs_pb2 as rpb

log = logging.getLogger("keyflow.worker")

RUN_ERROR_BYTES_MAX = 4096  # the server's bound on a run's error text
POLL_MAX_RUNS = 100         # the server's bound on one poll
# Poll errors retrying cannot fix: the worker stops and run() raises.
FATAL_CODES = (grpc.StatusCode.UNAUTHENTICATED, grpc.StatusCode.PERMISSION_DENIED,
               grpc.StatusCode.INVALID_ARGUMENT, grpc.StatusCode.UNIMPLEMENTED)
RETRYABLE = (grpc.StatusCode.UNAVAILABLE, grpc.StatusCode.DEADLINE_EXCEEDED)


class RetryableError(Exception):
    """Raised by a handler (or subclassed): the attempt failed but the run
    may succeed later. The worker completes it with retryable=True, so it is
    retried under its rule's retry policy while attempts remain (without a
    policy: at once, up to the server's --run-attempts); other exceptions
    fail the run for good."""


def _truncate_utf8(text, limit_bytes):
    data = text.encode("utf-8", errors="replace")
    if len(data) <= limit_bytes:
        return text
    return data[:limit_bytes - 3].decode("utf-8", errors="ignore") + "..."


class RunContext:
    """What a handler gets besides the input: the run's fields (run_id,
    workflow, key, kind, attempts, max_attempts, event_count, event_ids,
    created_ms, lease), and `stopping` / `lease_lost` / `cancel_requested`
    to notice that it should give up early (a cancelled run ends CANCELLED
    whatever the handler returns)."""

    def __init__(self, worker, run, client=None):
        self._worker = worker
        # The endpoint that leased the run (with several, the one serving
        # its partition): its heartbeats and completion go there.
        self._client = client or worker.client
        self.run = run
        self.run_id = run.run_id
        self.workflow = run.workflow
        self.key = run.key
        self.kind = run.kind
        self.attempts = run.attempts
        self.max_attempts = run.get("max_attempts", 0)
        self.event_count = run.event_count
        self.event_ids = list(run.get("event_ids", ()))
        self.created_ms = run.created_ms
        self.lease = run.lease
        self.lease_lost = False     # the server refused a heartbeat
        self.cancel_requested = run.get("cancel_requested", False)  # CancelRun asked
        self.released = False       # shutdown gave the run back
        self.next_heartbeat = 0.0   # time.monotonic() of the next heartbeat

    @property
    def stopping(self):
        return self._worker._stopping.is_set()


class Worker:
    """Runs handlers for leased runs. client: a keyflow.Client, or None to
    make one from **client_options (addr, tls_*, api_key; see Client)."""

    def __init__(self, client=None, *, worker_id=None, concurrency=16, lease_ms=30000,
                 heartbeat_fraction=1 / 3, poll_wait_ms=10000, grace_s=20.0, pollers=2,
                 **client_options):
        if not 1 <= concurrency <= 10000:
            raise ValueError("concurrency: %r is not in 1..10000" % (concurrency,))
        if not 0 < heartbeat_fraction < 1:
            raise ValueError("heartbeat_fraction: %r is not in (0, 1)" % (heartbeat_fraction,))
        self._owns_client = client is None
        self.client = client or Client(**client_options)
        self.worker_id = worker_id or "%s-%d" % (socket.gethostname(), os.getpid())
        self.concurrency = concurrency
        self.lease_ms = lease_ms
        self.heartbeat_s = lease_ms * heartbeat_fraction / 1000.0
        self.poll_wait_ms = poll_wait_ms
        self.grace_s = grace_s
        self.pollers = max(1, int(pollers))
        self._poll_batch_min = max(1, min(16, concurrency // 4))
        self.handlers = {}
        self.completed = 0          # runs completed with a result
        self.failed = 0             # runs completed with an error (FAILED)
        self.retried = 0            # runs whose retryable error scheduled another attempt
        self.cancelled = 0          # runs completed after a CancelRun (CANCELLED)
        self.lost = 0               # runs whose lease was lost before completion
        self.released = 0           # runs given back at shutdown
        self._lock = threading.Condition()
        self._active = {}           # run_id -> RunContext
        self._heap = []             # (next_heartbeat, run_id)
        self._stopping = threading.Event()
        self._stop_started = None   # time.monotonic() of the first stop()
        self._done = threading.Event()
        self._polls = {}            # outstanding PollRuns future -> its client
        self._share = concurrency   # most slots one poll reserves (start())
        self._tickets = 0           # pollers reserve slots in turn (_reserve_slots)
        self._turn = 0
        self._reserved = 0          # slots promised to outstanding polls
        self._released_all = False  # shutdown gave back every held run
        self._fatal = None
        self._threads = []
        self._pool = None

    # --- registration -----------------------------------------------------

    def handle(self, workflow, fn=None):
        """Registers fn(input, run) for a workflow; usable as a decorator.
        The return value (any JSON value) completes the run; an exception
        fails it with "<ExceptionType>: <message>" (a keyflow.RetryableError
        asks for another attempt)."""
        if fn is None:
            return lambda f: self.handle(workflow, f)
        if not callable(fn):
            raise ValueError("handle(%r): the handler is not callable" % (workflow,))
        self.handlers[workflow] = fn
        return fn

    # --- lifecycle ----------------------------------------------------------

    def start(self):
        """Starts polling in background threads; returns at once."""
        if not self.handlers:
            raise ValueError("no handlers: call worker.handle(workflow, fn) first")
        if self._threads:
            raise RuntimeError("worker already started")
        self._pool = ThreadPoolExecutor(self.concurrency, thread_name_prefix="keyflow-run")
        # A client of several endpoints (keyflow.routing): pollers for each,
        # so runs of every partition reach this worker.
        endpoints = getattr(self.client, "endpoint_clients", lambda: [self.client])()
        # Each endpoint's poll may reserve only its share of the slots, so
        # every endpoint has a long poll out at once (one poll holding every
        # slot would leave runs of the other partitions waiting for its
        # whole wait_ms).
        self._share = max(1, self.concurrency // len(endpoints))
        loops = [(self._poll_loop, "keyflow-poll-%d" % i, (c,))
                 for c in endpoints for i in range(self.pollers)]
        for target, name, args in loops + [(self._heartbeat_loop, "keyflow-hb", ())]:
            t = threading.Thread(target=target, name=name, args=args, daemon=True)
            t.start()
            self._threads.append(t)
        return self

    def run(self, install_signal_handlers=True):
        """start(), then wait until stop() (from SIGTERM or SIGINT when called
        on the main thread) has finished or released every held run."""
        previous = {}
        if install_signal_handlers and threading.current_thread() is threading.main_thread():
            for sig in (signal.SIGTERM, signal.SIGINT):
                previous[sig] = signal.signal(sig, lambda *_: self.stop(wait=False))
        try:
            if not self._threads:
                self.start()
            while not self._done.wait(0.5):   # wakes for signal handlers
                pass
        finally:
            for sig, handler in previous.items():
                signal.signal(sig, handler)
        if self._fatal is not None:
            raise self._fatal

    def stop(self, wait=True, grace_s=None):
        """Stops taking runs; held runs may finish for grace_s (default: the
        worker's), then the rest are released. With wait, returns when done.
        The grace counts from the first stop(); a later call may change it
        (stop(grace_s=0) releases what is still held at once)."""
        with self._lock:
            if grace_s is not None:
                self.grace_s = grace_s
            first = not self._stopping.is_set()
            if first:
                self._stop_started = time.monotonic()
                self._stopping.set()
                for future in list(self._polls):
                    future.cancel()
            self._lock.notify_all()  # a new grace reaches _shutdown
        if first:
            threading.Thread(target=self._shutdown, name="keyflow-stop", daemon=True).start()
        if wait:
            self._done.wait()

    def _shutdown(self):
        with self._lock:
            # A poll cancelled too late has runs in hand that are not in
            # _active yet: wait for every poll to hand its runs over, else
            # they would run after run() returned, unheartbeated and never
            # released. Cancelled polls return at once.
            while self._reserved > 0:
                self._lock.wait()
            while self._active:
                left_s = self._stop_started + self.grace_s - time.monotonic()
                if left_s <= 0:
                    break
                self._lock.wait(left_s)
            held = [ctx for ctx in self._active.values() if not ctx.lease_lost]
            for ctx in held:
                ctx.released = True
            self._released_all = True
            self._lock.notify_all()
        for ctx in held:
            try:
                ctx._client.release_run(ctx.run_id, ctx.lease)
                with self._lock:
                    self.released += 1
            except KeyflowError as e:
                log.warning("releasing run %s: %s", ctx.run_id, e)
        for t in self._threads:
            t.join()
        if self._pool is not None:
            self._pool.shutdown(wait=False)
        if self._owns_client:
            self.client.close()
        self._done.set()

    # --- polling ----------------------------------------------------------------

    def _reserve_slots(self, client):
        """Waits until this poller may poll, reserves the slots it asks for
        and returns their number (0: stopping). An endpoint's first poll
        needs one free slot; another one at the same time needs a batch of
        them, so that polls overlap the runs in flight (lease and completion
        writes share commit groups) without splitting free slots into polls
        of one run. Pollers reserve in the order they asked: a poller whose
        poll just came back does not take the slots again before the others
        (with several endpoints, one would starve the others' partitions)."""
        with self._lock:
            ticket = self._tickets
            self._tickets += 1
            try:
                while not self._stopping.is_set():
                    free = self.concurrency - len(self._active) - self._reserved
                    busy = client in self._polls.values()
                    if ticket == self._turn and free >= (self._poll_batch_min if busy else 1):
                        n = min(free, POLL_MAX_RUNS, self._share)
                        self._reserved += n
                        return n
                    self._lock.wait()
                return 0
            finally:
                self._turn += 1
                self._lock.notify_all()

    def _poll_loop(self, client):
        delays = None
        while True:
            free = self._reserve_slots(client)
            if free == 0:
                break
            req = rpb.PollRunsRequest(workflows=sorted(self.handlers), worker_id=self.worker_id,
                                      lease_ms=self.lease_ms, max_runs=free,
                                      wait_ms=self.poll_wait_ms)
            future = client._runs.PollRuns.future(
                req, timeout=client.timeout_s + self.poll_wait_ms / 1000.0,
                metadata=client._conn.metadata)
            with self._lock:
                self._polls[future] = client
                if self._stopping.is_set():
                    future.cancel()
            runs, error = (), None
            try:
                runs = future.result().runs
            except grpc.FutureCancelledError:
                pass
            except grpc.RpcError as e:
                error = e
            now = time.monotonic()
            contexts = [RunContext(self, to_native(run), client) for run in runs]
            with self._lock:
                # The runs take their slots in the same step that frees the
                # reservation, so no other poller can count them twice.
                self._polls.pop(future, None)
                self._reserved -= free
                for ctx in contexts:
                    ctx.next_heartbeat = now + self.heartbeat_s
                    self._active[ctx.run_id] = ctx
                    heapq.heappush(self._heap, (ctx.next_heartbeat, ctx.run_id))
                self._lock.notify_all()
            for ctx in contexts:
                self._pool.submit(self._execute, ctx)
            if error is None:
                delays = None
                continue
            if self._stopping.is_set():
                break
            if error.code() in FATAL_CODES:
                self._fatal = KeyflowError.from_rpc(error)
                log.error("polling stopped: %s", self._fatal)
                self.stop(wait=False)
                break
            delays = delays or backoff_delays(0.1, 5.0)
            delay = next(delays)
            log.warning("poll failed (%s: %s); retrying in %.2f s",
                        error.code().name, error.details(), delay)
            self._stopping.wait(delay)

    # --- one run -------------------------------------------------------------------

    def _execute(self, ctx):
        outcome = None
        try:
            fn = self.handlers.get(ctx.workflow)
            result_json, error, retryable = None, None, False
            try:
                if fn is None:
                    raise LookupError("no handler for workflow %r" % ctx.workflow)
                result_json = encode_json(fn(ctx.run.input, ctx), "result")
            except Exception as e:  # the handler's failure is the run's
                error = _truncate_utf8("%s: %s" % (type(e).__name__, e), RUN_ERROR_BYTES_MAX)
                retryable = isinstance(e, RetryableError)
            outcome = self._complete(ctx, result_json if error is None else None, error,
                                     retryable)
        finally:
            with self._lock:
                self._active.pop(ctx.run_id, None)
                if outcome is not None:
                    setattr(self, outcome, getattr(self, outcome) + 1)
                self._lock.notify_all()

    def _complete(self, ctx, result_json, error, retryable=False):
        """CompleteRun with retries; returns the counter to bump."""
        req = rpb.CompleteRunRequest(run_id=ctx.run_id, lease=ctx.lease)
        if error is not None:
            req.error = error
            req.retryable = retryable
        else:
            req.result_json = result_json
        delays = backoff_delays(0.05, 1.0)
        deadline = time.monotonic() + self.lease_ms / 1000.0
        client = ctx._client
        while True:
            if ctx.released or ctx.lease_lost:
                return None if ctx.released else "lost"
            try:
                resp = client._runs.CompleteRun(req, timeout=client.timeout_s,
                                                metadata=client._conn.metadata)
            except grpc.RpcError as e:
                code = e.code()
                if code in RETRYABLE and time.monotonic() < deadline:
                    time.sleep(next(delays))
                    continue
                if code == grpc.StatusCode.FAILED_PRECONDITION:
                    log.warning("run %s: completion refused (%s)", ctx.run_id, e.details())
                    return "lost"
                if error is None and code in (grpc.StatusCode.INVALID_ARGUMENT,
                                              grpc.StatusCode.RESOURCE_EXHAUSTED):
                    # The result itself was refused (too large, bad JSON): fail
                    # the run with the reason rather than let the lease run out.
                    req.ClearField("result_json")
                    error = _truncate_utf8("result refused: " + (e.details() or code.name),
                                           RUN_ERROR_BYTES_MAX)
                    req.error = error
                    continue
                log.error("run %s: completion failed: %s: %s", ctx.run_id, code.name, e.details())
                return "lost"
            if resp.run.status == rpb.RUN_STATUS_CANCELLED:
                return "cancelled"
            if error is None:
                return "completed"
            return "retried" if resp.run.status in (rpb.RUN_STATUS_PENDING,
                                                    rpb.RUN_STATUS_DELAYED) else "failed"

    # --- heartbeats ------------------------------------------------------------------

    def _heartbeat_loop(self):
        while True:
            with self._lock:
                while not self._done_polling_and_idle():
                    if self._heap and self._heap[0][0] <= time.monotonic():
                        break
                    timeout = self._heap[0][0] - time.monotonic() if self._heap else None
                    self._lock.wait(timeout)
                if self._done_polling_and_idle():
                    return
                due = []
                now = time.monotonic()
                while self._heap and self._heap[0][0] <= now:
                    _, run_id = heapq.heappop(self._heap)
                    ctx = self._active.get(run_id)
                    if ctx is not None and not ctx.released and not ctx.lease_lost:
                        due.append(ctx)
            self._heartbeat(due)

    def _done_polling_and_idle(self):
        return self._stopping.is_set() and (not self._active or self._released_all)

    def _heartbeat(self, due):
        calls = [(ctx, ctx._client._runs.HeartbeatRun.future(
            rpb.HeartbeatRunRequest(run_id=ctx.run_id, lease=ctx.lease, lease_ms=self.lease_ms),
            timeout=ctx._client.timeout_s, metadata=ctx._client._conn.metadata)) for ctx in due]
        for ctx, call in calls:
            interval = self.heartbeat_s
            try:
                if call.result().cancel_requested:
                    ctx.cancel_requested = True
            except grpc.RpcError as e:
                if e.code() in (grpc.StatusCode.FAILED_PRECONDITION, grpc.StatusCode.NOT_FOUND):
                    log.warning("run %s: lease lost (%s)", ctx.run_id, e.details())
                    ctx.lease_lost = True
                    continue
                interval = self.heartbeat_s / 4  # try again well before expiry
            with self._lock:
                if ctx.run_id in self._active:
                    ctx.next_heartbeat = time.monotonic() + interval
                    heapq.heappush(self._heap, (ctx.next_heartbeat, ctx.run_id))
