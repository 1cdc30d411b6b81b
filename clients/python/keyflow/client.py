"""keyflow.Client: every keyflowd operation as a method taking and
returning native values (see _convert.py for how responses look).

Thread-safe: one Client (one channel) can serve many threads. Every method
raises KeyflowError for a refused call and ValueError for an argument this
SDK can tell is wrong before sending it.
"""

import json
import os
import random
import threading
import time
import uuid

import grpc

from . import rows as _rows
from ._connection import Connection, KeyflowError
from ._convert import Record, encode_json, enum_value, to_native
from .v1 import coordinators_pb2 as cpb
from .v1 import coordinators_pb2_grpc as cpg
from .v1 import functions_pb2 as fpb
from .v1 import functions_pb2_grpc as fpg
from .v1 import runs_pb2 as rpb
from .v1 import runs_pb2_grpc as rpg

DEFAULT_TIMEOUT_S = 30.0
# Retries of one PushBatch sequence: about 10 s of backoff in all, enough
# for a keyflowd restart, short enough that a producer notices an outage.
PUSH_ATTEMPTS = 10
RETRY_BACKOFF_MIN_S = 0.05
RETRY_BACKOFF_MAX_S = 2.0
RETRYABLE = (grpc.StatusCode.UNAVAILABLE, grpc.StatusCode.DEADLINE_EXCEEDED)

_RULE_FIELDS = ("window_ms", "max_wait_ms", "max_events", "dedup_ms", "edge", "max_bytes",
                "key_concurrency", "retry", "start_after_ms")
_STATUS_BY_NUMBER = {code.value[0]: code for code in grpc.StatusCode}
_RETRY_FIELDS = ("max_attempts", "initial_backoff_ms", "max_backoff_ms", "multiplier")
# The run statuses after which nothing changes (wait_run returns on them).
FINISHED = ("completed", "failed", "cancelled")


def debounce(window_ms, max_wait_ms=None, dedup_ms=None, edge=None, **run_options):
    """A debounce rule: the run starts window_ms after the latest event, or
    max_wait_ms after the first (None or 0: no bound). edge: "trailing"
    (default), "leading" or "both" (docs/semantics.md, "Debounce edges").
    run_options: key_concurrency, retry (keyflow.retry(...)), start_after_ms."""
    return _rule("debounce", window_ms=window_ms, max_wait_ms=max_wait_ms, dedup_ms=dedup_ms,
                 edge=edge, **run_options)


def batch(max_events=None, max_wait_ms=None, dedup_ms=None, max_bytes=None, **run_options):
    """A batch rule: the run starts when max_events arrived (default 100),
    its input array would pass max_bytes (default and at most 4 MiB), or
    max_wait_ms after the first event (default 1000). run_options: as
    debounce."""
    return _rule("batch", max_events=max_events, max_wait_ms=max_wait_ms, dedup_ms=dedup_ms,
                 max_bytes=max_bytes, **run_options)


def retry(max_attempts=None, initial_backoff_ms=None, max_backoff_ms=None, multiplier=None):
    """A run's retry policy (a rule's `retry`): after a failed attempt - a
    handler that raised keyflow.RetryableError, or a lost lease - the run
    waits min(initial_backoff_ms * multiplier^(attempt-1), max_backoff_ms),
    until max_attempts attempts were made. None takes the server's default
    (attempts: its --run-attempts; backoff 1000 ms, at most 60000, x2)."""
    return {k: v for k, v in (("max_attempts", max_attempts),
                              ("initial_backoff_ms", initial_backoff_ms),
                              ("max_backoff_ms", max_backoff_ms),
                              ("multiplier", multiplier)) if v is not None}


def _rule(kind, **fields):
    out = {"kind": kind}
    out.update((k, v) for k, v in fields.items() if v is not None)
    return out


def backoff_delays(min_s=RETRY_BACKOFF_MIN_S, max_s=RETRY_BACKOFF_MAX_S):
    """Endless exponential backoff with full jitter: min_s, 2 min_s, ...
    capped at max_s, each scaled by a random factor in [0.5, 1]."""
    delay = min_s
    while True:
        yield delay * random.uniform(0.5, 1.0)
        delay = min(delay * 2, max_s)


def _rule_message(rule):
    if isinstance(rule, cpb.Rule):
        return rule
    if not isinstance(rule, dict) or "kind" not in rule:
        raise ValueError("rule: expected keyflow.debounce(...), keyflow.batch(...) "
                         "or a dict with a kind, got %r" % (rule,))
    unknown = sorted(set(rule) - {"kind"} - set(_RULE_FIELDS))
    if unknown:
        raise ValueError("rule.%s: unknown field (fields: %s)" % (unknown[0], ", ".join(_RULE_FIELDS)))
    msg = cpb.Rule(kind=enum_value(cpb.RuleKind.DESCRIPTOR, rule["kind"], "rule.kind"))
    for name in _RULE_FIELDS:
        if name == "retry":
            if rule.get(name) is not None:
                msg.retry.CopyFrom(_retry_message(rule[name]))
        elif name == "edge":
            msg.edge = enum_value(cpb.Edge.DESCRIPTOR, rule.get(name), "rule.edge")
        elif rule.get(name) is not None:
            setattr(msg, name, rule[name])
    return msg


def _retry_message(policy):
    if isinstance(policy, cpb.RetryPolicy):
        return policy
    if not isinstance(policy, dict):
        raise ValueError("rule.retry: expected keyflow.retry(...) or a dict, got %r" % (policy,))
    unknown = sorted(set(policy) - set(_RETRY_FIELDS))
    if unknown:
        raise ValueError("rule.retry.%s: unknown field (fields: %s)"
                         % (unknown[0], ", ".join(_RETRY_FIELDS)))
    msg = cpb.RetryPolicy()
    for name in _RETRY_FIELDS:
        if policy.get(name) is not None:
            setattr(msg, name, policy[name])
    return msg


def _send_event_request(workflow, key, input, rule, id, flush):
    return cpb.SendEventRequest(workflow=workflow, key=key, event=cpb.Event(
        id=id or "", rule=_rule_message(rule), input_json=encode_json(input, "input"),
        flush=bool(flush)))


def _receipt(resp):
    """A SendEventResponse as one flat record."""
    r = resp.receipt
    return Record(run_id=r.run_id, due_ms=r.due_ms, commit_seq=r.commit_seq,
                  disposition=to_native(resp).get("disposition", "unspecified"),
                  duplicate=resp.duplicate, run_started=resp.run_started)


def _coordinator(kind, workflow, key):
    return cpb.CoordinatorRef(kind=enum_value(cpb.RuleKind.DESCRIPTOR, kind, "kind"),
                              workflow=workflow, key=key)


def _descriptor_message(descriptor):
    """A FunctionDescriptor from a message, a dict in proto3 JSON form (camel
    or snake case, as the build's *.descriptor.json) or a path to one."""
    from google.protobuf import json_format
    if isinstance(descriptor, fpb.FunctionDescriptor):
        return descriptor
    if isinstance(descriptor, str):
        with open(descriptor) as f:
            descriptor = json.load(f)
    if not isinstance(descriptor, dict):
        raise ValueError("descriptor: expected a dict, a path or a FunctionDescriptor")
    try:
        return json_format.ParseDict(descriptor, fpb.FunctionDescriptor())
    except json_format.ParseError as e:
        raise ValueError("descriptor: %s" % e) from None


class Client:
    """A connection to keyflowd. Options: see keyflow._connection (addr,
    tls_ca, tls_cert, tls_key, tls_server_name, api_key, and the KEYFLOW_*
    environment variables). timeout_s bounds each call (long polls add
    their wait to it)."""

    def __new__(cls, addr=None, *args, **kwargs):
        # Several endpoints (a list, or "a:1,b:2" here or in KEYFLOW_ADDR): a
        # data set served by several processes, routed by key
        # (keyflow.routing, docs/scaling.md).
        from .routing import RoutingClient, split_addrs
        if cls is Client and len(split_addrs(addr or os.environ.get("KEYFLOW_ADDR"))) > 1:
            return object.__new__(RoutingClient)
        return object.__new__(cls)

    def __init__(self, addr=None, *, timeout_s=DEFAULT_TIMEOUT_S, **options):
        self._conn = Connection(addr, **options)
        self.addr = self._conn.addr
        self.timeout_s = timeout_s
        ch = self._conn.channel
        self._coord = cpg.CoordinatorsStub(ch)
        self._runs = rpg.RunsStub(ch)
        self._fns = fpg.FunctionsStub(ch)
        self._schemas = {}
        self._schemas_lock = threading.Lock()
        self.push_retries = 0       # PushBatch attempts retried (UNAVAILABLE, DEADLINE_EXCEEDED)

    def close(self):
        self._conn.close()

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()

    def _call(self, method, request, timeout_s=None):
        try:
            return method(request, timeout=timeout_s or self.timeout_s,
                          metadata=self._conn.metadata)
        except grpc.RpcError as e:
            raise KeyflowError.from_rpc(e) from None

    # --- coordinators ---------------------------------------------------

    def send_event(self, workflow, key, input=None, *, rule, id="", flush=False):
        """Delivers one event (update-with-start). Returns the receipt:
        {run_id, due_ms, commit_seq, disposition, duplicate, run_started};
        disposition is "opened", "joined", "duplicate" or "closed". `input`
        is any JSON value; flush=True closes the window with this event."""
        req = _send_event_request(workflow, key, input, rule, id, flush)
        return _receipt(self._call(self._coord.SendEvent, req))

    def send_events(self, events):
        """Up to 1000 events in one call, all durable in one write: each a
        dict with workflow, key, rule and optionally input, id and flush
        (send_event's arguments). Returns one entry per event, in order: its
        receipt (as send_event's), or the KeyflowError that refused it (not
        raised: the other events went on)."""
        req = cpb.SendEventsRequest()
        for i, ev in enumerate(events):
            unknown = sorted(set(ev) - {"workflow", "key", "input", "rule", "id", "flush"})
            if unknown:
                raise ValueError("events[%d].%s: unknown field (fields: workflow, key, input, "
                                 "rule, id, flush)" % (i, unknown[0]))
            req.events.append(_send_event_request(ev.get("workflow", ""), ev.get("key", ""),
                                                  ev.get("input"), ev.get("rule"),
                                                  ev.get("id", ""), ev.get("flush", False)))
        resp = self._call(self._coord.SendEvents, req)
        return [_receipt(r.response) if r.WhichOneof("outcome") == "response"
                else KeyflowError(_STATUS_BY_NUMBER.get(r.error.code), r.error.message)
                for r in resp.results]

    def describe(self, kind, workflow, key):
        """The coordinator of (kind, workflow, key): window, remembered IDs,
        journal. kind is "debounce" or "batch"."""
        req = cpb.DescribeCoordinatorRequest(coordinator=_coordinator(kind, workflow, key))
        return to_native(self._call(self._coord.DescribeCoordinator, req))

    def flush(self, kind, workflow, key):
        """Closes the open window now: {flushed, run_id}."""
        req = cpb.FlushWindowRequest(coordinator=_coordinator(kind, workflow, key))
        return to_native(self._call(self._coord.FlushWindow, req))

    def cancel(self, kind, workflow, key):
        """Drops the open window and its events: {cancelled, run_id, events_dropped}."""
        req = cpb.CancelWindowRequest(coordinator=_coordinator(kind, workflow, key))
        return to_native(self._call(self._coord.CancelWindow, req))

    # --- runs -----------------------------------------------------------

    def get_run(self, run_id, wait_ms=0):
        """The run (a receipt's run ID works before its window closes: status
        "window_open"). With wait_ms (at most 60000) waits that long for it
        to finish (completed, failed or cancelled) and returns it as it is."""
        req = rpb.GetRunRequest(run_id=run_id, wait_ms=wait_ms)
        return to_native(self._call(self._runs.GetRun, req, self.timeout_s + wait_ms / 1000.0))

    def wait_run(self, run_id, timeout_s=None):
        """Waits until the run is completed, failed or cancelled and returns
        it (like Temporal's GetResult): a loop of GetRun long polls that rides
        out a keyflowd restart. With timeout_s, returns the run as it is then
        (check `status`)."""
        deadline = None if timeout_s is None else time.monotonic() + timeout_s
        delays = None
        run = None
        while True:
            left_ms = 60000 if deadline is None else int((deadline - time.monotonic()) * 1000)
            if left_ms <= 0 and run is not None:
                return run
            try:
                run = self.get_run(run_id, wait_ms=max(0, min(left_ms, 60000)))
                delays = None
            except KeyflowError as e:
                if e.code not in RETRYABLE or (deadline is not None and
                                               time.monotonic() >= deadline):
                    raise
                delays = delays or backoff_delays()
                time.sleep(next(delays))
                continue
            if run.status in FINISHED:
                return run

    def cancel_run(self, run_id):
        """Cancels a run: a pending or delayed one at once; a leased one when
        its worker reports (it sees run.cancel_requested). Returns the run."""
        return to_native(self._call(self._runs.CancelRun, rpb.CancelRunRequest(run_id=run_id))).run

    def release_run(self, run_id, lease):
        """Gives a leased run back: pending again at once, and the attempt
        does not count. Returns the run."""
        req = rpb.ReleaseRunRequest(run_id=run_id, lease=lease)
        return to_native(self._call(self._runs.ReleaseRun, req)).run

    def list_runs(self, workflow="", status=None, page_size=None, key=""):
        """Every matching run, oldest first per workflow, fetched a page at a
        time as the iterator is consumed."""
        req = rpb.ListRunsRequest(workflow=workflow or "",
                                  status=enum_value(rpb.RunStatus.DESCRIPTOR, status, "status"),
                                  page_size=page_size or 0, key=key or "")
        while True:
            resp = self._call(self._runs.ListRuns, req)
            for run in resp.runs:
                yield to_native(run)
            if not resp.next_page_token:
                return
            req.page_token = resp.next_page_token

    def poll_runs(self, workflows=(), worker_id="", lease_ms=None, max_runs=1, wait_ms=0):
        """Leases up to max_runs pending runs (waiting up to wait_ms for one).
        Most code wants keyflow.Worker instead."""
        req = rpb.PollRunsRequest(workflows=list(workflows), worker_id=worker_id,
                                  lease_ms=lease_ms or 0, max_runs=max_runs, wait_ms=wait_ms)
        resp = self._call(self._runs.PollRuns, req, self.timeout_s + wait_ms / 1000.0)
        return [to_native(r) for r in resp.runs]

    def heartbeat_run(self, run_id, lease, lease_ms=None):
        """Extends a lease; returns its new expiry (Unix ms)."""
        req = rpb.HeartbeatRunRequest(run_id=run_id, lease=lease, lease_ms=lease_ms or 0)
        return self._call(self._runs.HeartbeatRun, req).lease_expires_ms

    def complete_run(self, run_id, lease, result=None, *, error=None, retryable=False):
        """Completes a leased run with a JSON result, or fails it with
        `error` (text); retryable=True retries it under its rule's retry
        policy while attempts remain. Returns {run, already_finished}."""
        req = rpb.CompleteRunRequest(run_id=run_id, lease=lease)
        if error is not None:
            req.error = str(error)
            req.retryable = bool(retryable)
        else:
            req.result_json = encode_json(result, "result")
        return to_native(self._call(self._runs.CompleteRun, req))

    # --- process functions ----------------------------------------------

    def register_function(self, descriptor):
        """Registers a function; idempotent for an identical descriptor.
        Returns {function, already_registered}."""
        req = fpb.RegisterFunctionRequest(descriptor=_descriptor_message(descriptor))
        return to_native(self._call(self._fns.RegisterFunction, req))

    def get_function(self, function_id):
        return to_native(self._call(self._fns.GetFunction,
                                    fpb.GetFunctionRequest(function_id=function_id)))

    def list_functions(self, page_size=None):
        req = fpb.ListFunctionsRequest(page_size=page_size or 0)
        while True:
            resp = self._call(self._fns.ListFunctions, req)
            for fn in resp.functions:
                yield to_native(fn)
            if not resp.next_page_token:
                return
            req.page_token = resp.next_page_token

    def _descriptor(self, function_id):
        """The function's descriptor, fetched once: descriptors are immutable."""
        with self._schemas_lock:
            d = self._schemas.get(function_id)
        if d is None:
            info = self._call(self._fns.GetFunction, fpb.GetFunctionRequest(function_id=function_id))
            d = info.descriptor
            with self._schemas_lock:
                self._schemas[function_id] = d
        return d

    def make_batch(self, function_id, rows=None, columns=None):
        """A columnar RowBatch for the function's input schema from rows (a
        list of dicts) or columns (a dict of lists)."""
        if (rows is None) == (columns is None):
            raise ValueError("give rows or columns (exactly one)")
        schema = self._descriptor(function_id).input_schema
        if rows is not None:
            return _rows.batch_from_rows(schema, rows)
        return _rows.batch_from_columns(schema, columns)

    def push_batch(self, function_id, producer_id, sequence, rows=None, *, columns=None,
                   batch=None, watermark_us=None, attempts=PUSH_ATTEMPTS):
        """PushBatch of one sequence. UNAVAILABLE and DEADLINE_EXCEEDED are
        retried with the same sequence and content (a retry the server had
        already accepted answers with the original ack, duplicate=True);
        other errors raise at once. Returns the ack."""
        if batch is None:
            batch = self.make_batch(function_id, rows, columns)
        req = fpb.PushBatchRequest(function_id=function_id, producer_id=producer_id,
                                   sequence=sequence, batch=batch)
        if watermark_us is not None:
            req.watermark_us = watermark_us
        delays = backoff_delays()
        for attempt in range(1, attempts + 1):
            try:
                resp = self._fns.PushBatch(req, timeout=self.timeout_s, metadata=self._conn.metadata)
                return to_native(resp)
            except grpc.RpcError as e:
                if e.code() not in RETRYABLE or attempt == attempts:
                    raise KeyflowError.from_rpc(e) from None
            with self._schemas_lock:
                self.push_retries += 1
            time.sleep(next(delays))
        raise AssertionError("unreachable")

    def producer(self, function_id, producer_id=None, next_sequence=None):
        """A Producer: pushes batches with increasing sequences."""
        return Producer(self, function_id, producer_id, next_sequence)

    def read_output(self, function_id, after_seq=0, limit=None, wait_ms=0, cursor=""):
        """One page of output rows with seq > after_seq: {rows, first_seq,
        last_seq, next_after_seq, high_water_seq, first_retained_seq}; each
        row is a dict with "_seq" and the output schema's fields. Below the
        retained rows (output retention, trim_output) it raises KeyflowError
        OUT_OF_RANGE, naming the first retained sequence.

        With several partitions (docs/scaling.md) pass `cursor` instead of
        after_seq: the page's `next_cursor` (its rows are all of partition
        `partition`, with that partition's sequences). With one partition
        next_cursor is "" and next_after_seq is the position."""
        req = fpb.ReadOutputRequest(function_id=function_id, after_seq=after_seq,
                                    limit=limit or 0, wait_ms=wait_ms,
                                    format=fpb.ROW_FORMAT_COLUMNAR, cursor=cursor or "")
        resp = self._call(self._fns.ReadOutput, req, self.timeout_s + wait_ms / 1000.0)
        return self._page(function_id, resp, after_seq)

    def _page(self, function_id, resp, after_seq):
        schema = self._descriptor(function_id).output_schema
        rows = _rows.rows_from_batch(schema, resp.batch, resp.first_seq) if resp.first_seq else []
        return Record(rows=rows, first_seq=resp.first_seq, last_seq=resp.last_seq,
                      next_after_seq=resp.last_seq if rows else after_seq,
                      high_water_seq=resp.high_water_seq,
                      first_retained_seq=resp.first_retained_seq,
                      partition=resp.partition, next_cursor=resp.next_cursor)

    def trim_output(self, function_id, before_seq=0, before_cursor=""):
        """Drops the function's output rows before before_seq (a consumer
        committed its position there: the last row it read + 1), or with
        several partitions each partition's rows up to its position in
        before_cursor (a read_output cursor). Idempotent. Returns
        {first_retained_seq, output_seq}."""
        req = fpb.TrimOutputRequest(function_id=function_id, before_seq=before_seq,
                                    before_cursor=before_cursor or "")
        return to_native(self._call(self._fns.TrimOutput, req))

    def delete_function(self, function_id, allow_missing=False):
        """Deletes the function and everything of it (state, timers, output,
        producers, descriptor); its id can then be registered again with any
        descriptor. allow_missing: a function that does not exist is not an
        error. Returns {deleted, keys, timers, output_rows, producers}."""
        with self._schemas_lock:
            self._schemas.pop(function_id, None)  # a new one may have another schema
        req = fpb.DeleteFunctionRequest(function_id=function_id, allow_missing=allow_missing)
        return to_native(self._call(self._fns.DeleteFunction, req))

    def delete_producer(self, function_id, producer_id, allow_missing=False):
        """Forgets a producer (its last sequence and kept acks): the next batch
        under producer_id starts a new producer. Returns {deleted,
        last_sequence}."""
        req = fpb.DeleteProducerRequest(function_id=function_id, producer_id=producer_id,
                                        allow_missing=allow_missing)
        return to_native(self._call(self._fns.DeleteProducer, req))

    def tail_output(self, function_id, after_seq=0, max_rows_per_message=None, cursor=""):
        """An iterator over output rows with seq > after_seq (or after
        `cursor`, with several partitions) that follows new rows as they
        become durable, until cancel() or the iterator is closed."""
        req = fpb.TailOutputRequest(function_id=function_id, after_seq=after_seq,
                                    max_rows_per_message=max_rows_per_message or 0,
                                    format=fpb.ROW_FORMAT_COLUMNAR, cursor=cursor or "")
        self._descriptor(function_id)  # fail here, not inside the stream, for an unknown function
        call = self._fns.TailOutput(req, metadata=self._conn.metadata)
        return OutputTail(self, function_id, call)

    def key_state(self, function_id, key):
        """A key's state: {key_text, state ("absent" | "null" | "value"),
        value, timers, value_state_name}. key: the value, or a list of values
        for several key columns."""
        if isinstance(key, (list, tuple)):
            key = json.dumps(list(key), separators=(",", ":"), ensure_ascii=False)
        resp = self._call(self._fns.GetKeyState, fpb.GetKeyStateRequest(function_id=function_id, key=key))
        out = to_native(resp)
        if out.get("state") != "value":
            out["value"] = None
        return out


class OutputTail:
    """Rows of a TailOutput stream, one at a time. cancel() (or closing the
    iterator, or leaving a `with` block) ends the stream."""

    def __init__(self, client, function_id, call):
        self._client = client
        self._function_id = function_id
        self._call = call
        self._pending = []
        self._index = 0

    def __iter__(self):
        return self

    def __next__(self):
        while self._index >= len(self._pending):
            try:
                resp = next(self._call)
            except grpc.RpcError as e:
                if e.code() == grpc.StatusCode.CANCELLED:
                    raise StopIteration from None
                raise KeyflowError.from_rpc(e) from None
            self._pending = self._client._page(self._function_id, resp, 0).rows
            self._index = 0
        row = self._pending[self._index]
        self._index += 1
        return row

    def cancel(self):
        self._call.cancel()

    close = cancel

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.cancel()


class Producer:
    """Pushes batches to one function under one producer ID with strictly
    increasing sequences, retrying a sequence on UNAVAILABLE and
    DEADLINE_EXCEEDED (exactly-once effects for acknowledged batches).

    Without next_sequence the first sequence is the wall clock in
    microseconds, and each later one is max(previous + 1, clock): a producer
    restarted under the same ID keeps increasing without storing anything.
    One push at a time (a lock): concurrent pushes of one producer would
    reach the server out of order. Use one Producer per thread instead."""

    def __init__(self, client, function_id, producer_id=None, next_sequence=None):
        self.client = client
        self.function_id = function_id
        self.producer_id = producer_id or "py-" + uuid.uuid4().hex
        self._next = next_sequence
        self.last_sequence = None
        self._retry_sequence = None
        self._lock = threading.Lock()

    def push(self, rows=None, *, columns=None, watermark_us=None):
        """Pushes one batch (rows or columns) as the next sequence; returns
        the ack. A push that raised leaves its sequence pending: the next
        push() reuses it, so pushing the same rows again is the retry (the
        server answers duplicate=True if the first try had landed)."""
        batch = self.client.make_batch(self.function_id, rows, columns)
        with self._lock:
            seq = self._retry_sequence
            if seq is None:
                seq = self._next if self._next is not None else time.time_ns() // 1000
                if self.last_sequence is not None:
                    seq = max(seq, self.last_sequence + 1)
            try:
                ack = self.client.push_batch(self.function_id, self.producer_id, seq, batch=batch,
                                             watermark_us=watermark_us)
            except KeyflowError:
                self._retry_sequence = seq
                raise
            self._retry_sequence = None
            self.last_sequence = seq
            if self._next is not None:
                self._next = seq + 1
            return ack
