"""Remote process-function handlers: a REMOTE function's handler, written in
Python and served to keyflowd over the Workers stream.

    import keyflow

    def running_sum(act):                   # called once per activation
        amount = act["amount"]
        total = (act.state or 0) + amount
        act.set_state(total)
        act.emit(key=act.key_text, ts=act.event_time_us, sum=total)

    worker = keyflow.FunctionWorker("sums", running_sum, concurrency=8)
    client.register_function(keyflow.remote_descriptor(base, worker.digest))
    worker.run()                             # until SIGTERM / SIGINT / stop()

What a handler sees is what a native handler sees (api/keyflow/handler.h):
one call carries up to max_batch_rows activations, at most one per key,
each with the key's state as it was before it; the handler answers each
with output rows, at most one state mutation and ordered timer
operations. keyflowd validates the whole call's answer exactly as it does a
native handler's and applies all of it or, with an error, none of it.

The implementation digest (the descriptor's implementation_digest, which a
worker must announce) is the SHA-256 of the bytes of the handler's source
files concatenated in the order given: by default the one file that
defines the handler function, i.e. exactly `sha256sum handler.py`; with
sources=[a, b] it is `cat a b | sha256sum`. A changed file is a new digest,
so a new function: keyflowd never runs a worker whose code differs from the
one the function was registered with.

Threads: run() reads calls and runs the handler on its own thread, one call
at a time; a second thread (gRPC's) sends the results. `concurrency` is how
many calls keyflowd may have out at once on the stream: more than one lets
the next calls travel while a call runs, which hides the round trip.
"""

import hashlib
import inspect
import json
import logging
import queue
import signal
import socket
import os
import threading
import time

import grpc

from ._connection import KeyflowError
from ._convert import enum_value
from .client import Client, backoff_delays
from .v1 import functions_pb2 as fpb
from .v1 import workers_pb2 as wpb
from .v1 import workers_pb2_grpc as wpg

log = logging.getLogger("keyflow.handler")

CONCURRENCY_MAX = 64            # the server's bound on a worker's calls out
ERROR_BYTES_MAX = 300           # keyflowd keeps this much of a handler's refusal
# Refusals retrying cannot fix: run() raises them. NOT_FOUND (the function
# is not registered yet) and the transport's errors are retried.
FATAL_CODES = (grpc.StatusCode.FAILED_PRECONDITION, grpc.StatusCode.INVALID_ARGUMENT,
               grpc.StatusCode.PERMISSION_DENIED, grpc.StatusCode.UNAUTHENTICATED,
               grpc.StatusCode.UNIMPLEMENTED)

ROW = wpb.CALLBACK_KIND_ROW
TIMER = wpb.CALLBACK_KIND_TIMER
_STATE_NAMES = {fpb.STATE_KIND_ABSENT: "absent", fpb.STATE_KIND_NULL: "null",
                fpb.STATE_KIND_VALUE: "value"}
_UNCHANGED, _SET, _SET_NULL, _CLEAR = (wpb.MUTATION_UNCHANGED, wpb.MUTATION_SET,
                                       wpb.MUTATION_SET_NULL, wpb.MUTATION_CLEAR)
_SLOTS = {
    fpb.FIELD_TYPE_BOOL: ("bools", False),
    fpb.FIELD_TYPE_INT64: ("int64s", 0),
    fpb.FIELD_TYPE_TIMESTAMP_US: ("int64s", 0),
    fpb.FIELD_TYPE_FLOAT64: ("float64s", 0.0),
    fpb.FIELD_TYPE_UTF8: ("strings", ""),
    fpb.FIELD_TYPE_BYTES: ("bytes_values", b""),
}


def implementation_digest(*paths):
    """Lowercase hex SHA-256 of the files' bytes concatenated in order
    (`cat PATHS | sha256sum`)."""
    if not paths:
        raise ValueError("implementation_digest: name at least one source file")
    h = hashlib.sha256()
    for path in paths:
        with open(path, "rb") as f:
            for chunk in iter(lambda: f.read(1 << 16), b""):
                h.update(chunk)
    return h.hexdigest()


def with_placement(descriptor, placement):
    """A copy of a descriptor (a dict in proto3 JSON form, a path to one, or
    a FunctionDescriptor) with its placement (docs/scaling.md, "Placement"):
    "single" (every key in the function's home partition: one atomic step
    per batch, one output sequence, limits for the whole function; what a
    descriptor without one gets) or "split" (keys spread over the
    partitions, for a function that needs more than one core)."""
    number = enum_value(fpb.FunctionPlacement.DESCRIPTOR, placement, "placement")
    if number == fpb.PLACEMENT_UNSPECIFIED:
        raise ValueError("placement: unknown value %r (one of single, split)" % (placement,))
    if isinstance(descriptor, fpb.FunctionDescriptor):
        out = fpb.FunctionDescriptor()
        out.CopyFrom(descriptor)
        out.placement = number
        return out
    if isinstance(descriptor, str):
        with open(descriptor) as f:
            descriptor = json.load(f)
    d = json.loads(json.dumps(descriptor))
    d["placement"] = fpb.FunctionPlacement.Name(number)
    return d


def remote_descriptor(descriptor, digest, call_timeout_ms=None, placement=None):
    """A copy of a descriptor (a dict in proto3 JSON form, or a path to
    one) as a REMOTE function with this implementation digest; with
    placement ("single" or "split", see with_placement) placed so. None
    keeps the descriptor's (absent: single)."""
    if isinstance(descriptor, str):
        with open(descriptor) as f:
            descriptor = json.load(f)
    d = json.loads(json.dumps(descriptor))
    if placement is not None:
        d = with_placement(d, placement)
    for camel, snake in (("implementationDigest", "implementation_digest"),):
        d.pop(snake, None)
        d[camel] = digest
    d["runtime"] = "RUNTIME_REMOTE"
    if call_timeout_ms is not None:
        limits = d.setdefault("limits", {})
        limits["callTimeoutMs"] = call_timeout_ms
    return d


class HandlerError(Exception):
    """Raised by act.fail(): the call is refused with this message and
    nothing of it is applied (the batch fails FAILED_PRECONDITION)."""


class Activation:
    """One activation, as the handler sees it. The object is reused for the
    next activation of the call: read what you need during the handler
    call, keep nothing.

    key          canonical key (bytes: u32 big-endian length + UTF-8, per key column)
    key_text     the key's value, or a JSON array of them for several key columns
    id           per-function activation sequence
    event_time_us  the row's event time, or the timer's time
    is_timer     a timer fired (no input row); timer_name says which
    state        the key's value before this activation: an int, or None
    state_kind   "absent" (never set, or cleared), "null" or "value"
    watermark_us the watermark before the call (None before the first)
    row          the input row as a dict (None for a timer)
    act[name]    one input value (faster than act.row[name])
    """

    __slots__ = ("_call", "_i", "_row")

    def __init__(self, call):
        self._call = call
        self._i = 0
        self._row = -1

    # --- what the activation carries ----------------------------------------

    @property
    def id(self):
        return self._call.ids[self._i]

    @property
    def key(self):
        return self._call.keys[self._i]

    @property
    def key_text(self):
        return self._call.texts[self._i]

    @property
    def event_time_us(self):
        return self._call.times[self._i]

    @property
    def is_timer(self):
        return self._call.callbacks[self._i] == TIMER

    @property
    def timer_name(self):
        name = self._call.timer_names[self._i]
        return name or None

    @property
    def state(self):
        c = self._call
        return c.state_values[self._i] if c.states[self._i] == fpb.STATE_KIND_VALUE else None

    @property
    def state_kind(self):
        return _STATE_NAMES.get(self._call.states[self._i], "unknown")

    @property
    def watermark_us(self):
        return self._call.watermark_us

    @property
    def row(self):
        if self._row < 0:
            return None
        c = self._call
        return {name: col[self._row] for name, col in zip(c.input_names, c.columns)}

    def __getitem__(self, name):
        return self._call.column(name)[self._row]

    def get(self, name, default=None):
        col = self._call.columns_by_name.get(name)
        if col is None or self._row < 0:
            return default
        return col[self._row]

    # --- the answer ---------------------------------------------------------

    def set_state(self, value):
        """SET the key's value (an int), or SET_NULL with None. One state
        mutation per activation."""
        self._call.mutate(self._i, _SET_NULL if value is None else _SET, value)

    def set_state_null(self):
        self._call.mutate(self._i, _SET_NULL, None)

    def clear_state(self):
        """CLEAR: the key's state becomes absent."""
        self._call.mutate(self._i, _CLEAR, None)

    def set_timer(self, name, at_us):
        """Sets (or moves) a declared timer of this key; at_us must be after
        the watermark."""
        self._call.timer(self._i, wpb.TIMER_OP_SET, name, at_us)

    def cancel_timer(self, name):
        self._call.timer(self._i, wpb.TIMER_OP_CANCEL, name, 0)

    def emit(self, row=None, **fields):
        """Adds an output row for this activation: a dict, or keyword
        arguments, by output field name; fields left out are null."""
        if row is None:
            row = fields
        elif fields:
            row = dict(row, **fields)
        self._call.out_acts.append(self._i)
        self._call.out_rows.append(row)

    def fail(self, message):
        """Refuses the whole call: nothing of it is applied."""
        raise HandlerError(message)


class _Call:
    """One HandlerCall being answered: its columns as lists, and the answer
    built so far."""

    __slots__ = ("ids", "keys", "texts", "times", "callbacks", "timer_names", "states",
                 "state_values", "watermark_us", "input_names", "columns", "columns_by_name",
                 "mutations", "values", "t_acts", "t_ops", "t_names", "t_at", "out_acts",
                 "out_rows", "n")

    def __init__(self, msg, input_names):
        self.ids = msg.activation_ids
        self.keys = msg.keys
        self.texts = msg.key_texts
        self.times = msg.event_times_us
        self.callbacks = msg.callbacks
        self.timer_names = msg.timer_names
        self.states = msg.states
        self.state_values = msg.state_values
        self.n = len(self.ids)
        self.watermark_us = (msg.watermark_us
                             if msg.WhichOneof("watermark_present") is not None else None)
        self.input_names = input_names
        self.columns = _columns(msg.rows) if msg.HasField("rows") else []
        self.columns_by_name = dict(zip(input_names, self.columns))
        self.mutations = None
        self.values = None
        self.t_acts = []
        self.t_ops = []
        self.t_names = []
        self.t_at = []
        self.out_acts = []
        self.out_rows = []

    def column(self, name):
        try:
            return self.columns_by_name[name]
        except KeyError:
            raise KeyError("%r is not an input field (fields: %s)"
                           % (name, ", ".join(self.input_names))) from None

    def mutate(self, i, kind, value):
        if self.mutations is None:
            self.mutations = [_UNCHANGED] * self.n
            self.values = [0] * self.n
        if self.mutations[i] != _UNCHANGED:
            raise HandlerError("activation %d already has a state mutation (one per activation)"
                               % self.ids[i])
        if kind == _SET and (type(value) is not int or not -(1 << 63) <= value < (1 << 63)):
            raise HandlerError("set_state: %r is not an int64" % (value,))
        self.mutations[i] = kind
        if kind == _SET:
            self.values[i] = value

    def timer(self, i, op, name, at_us):
        # Checked here, where the handler's mistake can name itself: a value
        # protobuf refuses later would end the stream, not refuse the call.
        verb = "set_timer" if op == wpb.TIMER_OP_SET else "cancel_timer"
        if type(name) is not str:
            raise HandlerError("%s: the timer name %r is not a str" % (verb, name))
        if type(at_us) is not int or not -(1 << 63) <= at_us < (1 << 63):
            raise HandlerError("%s: at_us %r is not an int64" % (verb, at_us))
        self.t_acts.append(i)
        self.t_ops.append(op)
        self.t_names.append(name)
        self.t_at.append(at_us)


def _columns(batch):
    """A RowBatch's columns as lists, None where null."""
    cols = []
    for col in batch.columns:
        which = col.WhichOneof("values")
        values = list(getattr(col, which).values) if which else [None] * batch.row_count
        if len(col.nulls):
            values = [None if null else v for v, null in zip(values, col.nulls)]
        cols.append(values)
    return cols


def _output_batch(fields, rows):
    """The output rows as a columnar RowBatch of the output schema."""
    batch = fpb.RowBatch(row_count=len(rows))
    for field in fields:
        name = field.name
        values = [r.get(name) for r in rows]
        slot, placeholder = _SLOTS[field.type]
        col = batch.columns.add()
        if None in values:
            col.nulls.extend([v is None for v in values])
            values = [placeholder if v is None else v for v in values]
        # protobuf takes 5 as a bool and True as an int64: values the
        # handler did not mean (bool is a subclass of int).
        if slot == "bools" or slot == "int64s":
            for v in values:
                if (type(v) is bool) != (slot == "bools"):
                    raise HandlerError("output field %s: %r is not %s" % (
                        name, v, "a bool" if slot == "bools" else "an int"))
        try:
            getattr(col, slot).values.extend(values)
        except (TypeError, ValueError) as e:
            raise HandlerError("output field %s: %s" % (name, e)) from None
    known = set(f.name for f in fields)
    for r in rows:
        if len(r) > len(known) or not known.issuperset(r):
            extra = sorted(set(r) - known)
            if extra:
                raise HandlerError("output row: %r is not an output field (fields: %s)"
                                   % (extra[0], ", ".join(f.name for f in fields)))
    return batch


def _truncate(text):
    data = text.encode("utf-8", errors="replace")
    if len(data) <= ERROR_BYTES_MAX:
        return text
    return data[:ERROR_BYTES_MAX].decode("utf-8", errors="ignore")


def answer(handler, descriptor, msg):
    """The CallResult of `handler` for one HandlerCall `msg` of the function
    `descriptor` (a FunctionDescriptor). An exception of the handler refuses
    the call with "<ExceptionType>: <message>" (act.fail: the message)."""
    call = _Call(msg, [f.name for f in descriptor.input_schema.fields])
    result = wpb.CallResult(call_id=msg.call_id)
    act = Activation(call)
    row = 0
    callbacks = call.callbacks
    try:
        for i in range(call.n):
            act._i = i
            if callbacks[i] == ROW:
                act._row = row
                row += 1
            else:
                act._row = -1
            ret = handler(act)
            if inspect.isawaitable(ret):
                if inspect.iscoroutine(ret):
                    ret.close()  # never run: no "never awaited" warning
                raise HandlerError("the handler returned an awaitable: handlers are synchronous "
                                   "(the answer is what they did by the time they return)")
        if call.out_rows:
            result.output.CopyFrom(_output_batch(descriptor.output_schema.fields, call.out_rows))
            result.output_activations.extend(call.out_acts)
        # Inside the try too: whatever the handler asked for that cannot be
        # encoded refuses its call; an exception escaping answer() would end
        # the worker's stream and leave the function without a worker.
        if call.mutations is not None:
            result.mutations.extend(call.mutations)
            result.state_values.extend(call.values)
        if call.t_ops:
            result.timer_activations.extend(call.t_acts)
            result.timer_ops.extend(call.t_ops)
            result.timer_names.extend(call.t_names)
            result.timer_at_us.extend(call.t_at)
    except HandlerError as e:
        return wpb.CallResult(call_id=msg.call_id, error=_truncate(str(e)) or "refused")
    except Exception as e:  # the handler's bug refuses its call, not the worker
        log.debug("handler raised", exc_info=True)
        return wpb.CallResult(call_id=msg.call_id,
                              error=_truncate("%s: %s" % (type(e).__name__, e)))
    return result


class _Stream:
    """One Serve stream: the messages to send, fed to gRPC as an iterator."""

    _END = object()

    def __init__(self, hello):
        self._queue = queue.SimpleQueue()
        self._queue.put(wpb.WorkerMessage(hello=hello))

    def __iter__(self):
        while True:
            msg = self._queue.get()
            if msg is self._END:
                return
            yield msg

    def send(self, result):
        self._queue.put(wpb.WorkerMessage(result=result))

    def end(self):
        self._queue.put(self._END)


class FunctionWorker:
    """Serves one REMOTE function's handler: handler(act) is called once
    per activation (see Activation).

    client       a keyflow.Client, or None to make one from **client_options
    concurrency  calls keyflowd may have out on the stream (1..64)
    sources      the files whose bytes make the digest (default: the file
                 defining `handler`); digest= gives the digest directly
    name         shown in keyflowd's logs

    run() serves until stop(), SIGTERM or SIGINT, reconnecting with backoff
    when the stream breaks (keyflowd restarting, a missed deadline) or the
    function is not registered yet; a refusal retrying cannot fix (a wrong
    digest, a NATIVE function, bad arguments) stops it and run() raises
    KeyflowError. start() runs the same loop on a thread."""

    def __new__(cls, function_id=None, handler=None, client=None, **kwargs):
        # A client of several endpoints (keyflow.routing): each process calls
        # the handler only for its own partitions' keys, over a stream to it,
        # so the function needs one stream per process.
        if cls is not FunctionWorker:
            return object.__new__(cls)
        if client is None:
            from .routing import split_addrs
            if len(split_addrs(kwargs.get("addr") or os.environ.get("KEYFLOW_ADDR"))) < 2:
                return object.__new__(cls)
            own = {k: kwargs.pop(k) for k in ("concurrency", "sources", "digest", "name")
                   if k in kwargs}
            workers = FunctionWorkers(function_id, handler, Client(**kwargs), **own)
            workers._owns_client = True
            return workers
        if len(getattr(client, "endpoint_clients", lambda: [client])()) > 1:
            return FunctionWorkers(function_id, handler, client, **kwargs)
        return object.__new__(cls)

    def __init__(self, function_id, handler, client=None, *, concurrency=8, sources=None,
                 digest=None, name=None, **client_options):
        if not callable(handler):
            raise ValueError("handler: not callable")
        if inspect.iscoroutinefunction(handler):
            raise ValueError("handler: an async function; handlers are synchronous (the answer "
                             "is what they did by the time they return)")
        if not 1 <= concurrency <= CONCURRENCY_MAX:
            raise ValueError("concurrency: %r is not in 1..%d" % (concurrency, CONCURRENCY_MAX))
        self.function_id = function_id
        self.handler = handler
        self.concurrency = concurrency
        if digest is None:
            if sources is None:
                source = inspect.getsourcefile(handler)
                if source is None:
                    raise ValueError("sources: cannot tell which file defines %r; name it" %
                                     (handler,))
                sources = [source]
            digest = implementation_digest(*sources)
        self.digest = digest
        self.sources = list(sources) if sources else []
        self.name = name or "%s-%d" % (socket.gethostname(), os.getpid())
        self._owns_client = client is None
        self.client = client or Client(**client_options)
        self._stub = wpg.WorkersStub(self.client._conn.channel)
        self.calls = 0              # calls answered
        self.activations = 0
        self.refused = 0            # calls the handler refused
        self.connects = 0           # streams welcomed
        self.descriptor = None      # from the welcome
        self.worker_id = None
        self._stopping = threading.Event()
        self._welcomed = threading.Event()
        self._lock = threading.Lock()
        self._responses = None
        self._thread = None
        self._fatal = None

    def descriptor_for(self, base, call_timeout_ms=None):
        """remote_descriptor(base, self.digest)."""
        return remote_descriptor(base, self.digest, call_timeout_ms)

    def start(self):
        """Serves on a background thread; returns at once."""
        self._thread = threading.Thread(target=self._serve, name="keyflow-fn-worker", daemon=True)
        self._thread.start()
        return self

    def wait_welcomed(self, timeout_s=None):
        """True once keyflowd welcomed a stream (calls can come)."""
        return self._welcomed.wait(timeout_s)

    def run(self, install_signal_handlers=True):
        """Serves until stop() or SIGTERM/SIGINT; raises what stopped it
        for good."""
        previous = {}
        if install_signal_handlers and threading.current_thread() is threading.main_thread():
            for sig in (signal.SIGTERM, signal.SIGINT):
                previous[sig] = signal.signal(sig, lambda *_: self.stop(wait=False))
        try:
            self.start()
            while self._thread.is_alive():
                self._thread.join(0.5)  # wakes for signal handlers
        finally:
            for sig, h in previous.items():
                signal.signal(sig, h)
        if self._fatal is not None:
            raise self._fatal

    def stop(self, wait=True):
        """Ends the stream (keyflowd fails the calls still out on it, and
        their batches are retried by their producers) and stops serving."""
        self._stopping.set()
        with self._lock:
            responses = self._responses
        if responses is not None:
            responses.cancel()
        if wait and self._thread is not None and self._thread is not threading.current_thread():
            self._thread.join()
        if self._owns_client and wait:
            self.client.close()

    def _serve(self):
        delays = backoff_delays()
        while not self._stopping.is_set():
            try:
                self._serve_once()
                delays = backoff_delays()  # a stream that ended cleanly: reconnect at once
            except grpc.RpcError as e:
                if self._stopping.is_set():
                    break
                if e.code() in FATAL_CODES:
                    self._fatal = KeyflowError.from_rpc(e)
                    log.error("function worker stopped: %s", self._fatal)
                    break
                if self._welcomed.is_set():
                    delays = backoff_delays()  # it served: this is a new outage
                log.warning("function worker: stream ended (%s: %s); reconnecting",
                            e.code().name, e.details())
            self._welcomed.clear()
            if self._stopping.wait(next(delays)):
                break

    def _serve_once(self):
        hello = wpb.WorkerHello(function_id=self.function_id, implementation_digest=self.digest,
                                max_concurrent_calls=self.concurrency, worker_name=self.name)
        stream = _Stream(hello)
        responses = self._stub.Serve(iter(stream), metadata=self.client._conn.metadata)
        with self._lock:
            self._responses = responses
        if self._stopping.is_set():
            responses.cancel()
        try:
            for msg in responses:
                which = msg.WhichOneof("message")
                if which == "welcome":
                    self.descriptor = msg.welcome.descriptor
                    self.worker_id = msg.welcome.worker_id
                    self.connects += 1
                    self._welcomed.set()
                    log.info("serving %s as %s", self.function_id, self.worker_id)
                elif which == "call":
                    result = answer(self.handler, self.descriptor, msg.call)
                    self.calls += 1
                    self.activations += len(msg.call.activation_ids)
                    if result.error:
                        self.refused += 1
                    stream.send(result)
        finally:
            stream.end()
            with self._lock:
                self._responses = None


class FunctionWorkers:
    """keyflow.FunctionWorker over a client of several endpoints (what
    FunctionWorker(..., client) returns for one): a FunctionWorker per
    endpoint, started, waited for and stopped together; the counters are
    their sums."""

    def __init__(self, function_id, handler, client, **options):
        self.client = client
        self._owns_client = False
        self.workers = [FunctionWorker(function_id, handler, c, **options)
                        for c in client.endpoint_clients()]
        first = self.workers[0]
        self.function_id, self.handler, self.digest = function_id, handler, first.digest
        self.concurrency, self.sources, self.name = first.concurrency, first.sources, first.name

    calls = property(lambda self: sum(w.calls for w in self.workers))
    activations = property(lambda self: sum(w.activations for w in self.workers))
    refused = property(lambda self: sum(w.refused for w in self.workers))
    connects = property(lambda self: sum(w.connects for w in self.workers))
    descriptor = property(lambda self: self.workers[0].descriptor)
    worker_id = property(lambda self: self.workers[0].worker_id)

    def descriptor_for(self, base, call_timeout_ms=None):
        return self.workers[0].descriptor_for(base, call_timeout_ms)

    def start(self):
        for w in self.workers:
            w.start()
        return self

    def wait_welcomed(self, timeout_s=None):
        """True once every endpoint welcomed its stream."""
        deadline = None if timeout_s is None else time.monotonic() + timeout_s
        return all(w.wait_welcomed(None if deadline is None
                                   else max(0.0, deadline - time.monotonic()))
                   for w in self.workers)

    def run(self, install_signal_handlers=True):
        previous = {}
        if install_signal_handlers and threading.current_thread() is threading.main_thread():
            for sig in (signal.SIGTERM, signal.SIGINT):
                previous[sig] = signal.signal(sig, lambda *_: self.stop(wait=False))
        try:
            self.start()
            while any(w._thread.is_alive() for w in self.workers):
                time.sleep(0.5)  # wakes for signal handlers
        finally:
            for sig, h in previous.items():
                signal.signal(sig, h)
        for w in self.workers:
            if w._fatal is not None:
                raise w._fatal

    def stop(self, wait=True):
        for w in self.workers:
            w.stop(wait=False)
        for w in self.workers:
            w.stop(wait=wait)
        if self._owns_client and wait:
            self.client.close()
