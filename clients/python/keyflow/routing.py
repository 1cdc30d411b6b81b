"""A client of a data set served by several keyflowd processes
(docs/scaling.md): keyflow.Client(["host-a:50051", "host-b:50051"]) (or
KEYFLOW_ADDR="host-a:50051,host-b:50051") makes a RoutingClient.

It asks every endpoint once for its placement (keyflow.v1.Partitions/
GetPlacement: the partition count, which partitions it serves, and how each
RPC routes), then sends each call where its route says:

  * a call about one key (a coordinator's workflow and key, a run ID, a
    function key) to the endpoint serving that key's partition, found with
    kf-hash-1 (keyflow.partitions); a refusal naming another owner
    (FAILED_PRECONDITION with keyflow-partition) asks the endpoints again
    and retries once;
  * every call about a SINGLE function (the default placement: every key
    in the function's home partition, partitions.home_of_function) to the
    endpoint serving its home, as it is: a batch whole (one atomic step),
    output paged by after_seq (one sequence), its description that
    endpoint's. The placement comes with the descriptor, from the home
    endpoint, once per function;
  * for a SPLIT function, a batch split by the partitions of its rows'
    keys, one batch per endpoint, each with the call's producer and
    sequence (a watermark goes to every endpoint); output read behind one
    cursor holding a position per partition (each endpoint moves only its
    own partitions'); its description combined;
  * registration and deletion to every endpoint; runs listed endpoint
    after endpoint;
  * a poll asks the endpoints in turn without waiting, then waits on all of
    them at once; runs a second endpoint leased in the same instant beyond
    max_runs are released at once (ReleaseRun: no attempt counted).

A keyflow.Worker given a RoutingClient polls every endpoint. Thread-safe.
"""

import json
import threading
import time

import grpc

from . import partitions as _partitions
from . import rows as _rows
from ._connection import KeyflowError
from ._convert import Record, to_native
from .client import Client
from .v1 import coordinators_pb2 as cpb
from .v1 import functions_pb2 as fpb
from .v1 import keys_pb2 as kpb
from .v1 import partitions_pb2 as ppb
from .v1 import partitions_pb2_grpc as ppg
from .v1 import runs_pb2 as rpb

# Every unary RPC by its request type (they are unique per RPC), from the
# protos' service descriptors: (path, service name, method name).
_METHODS = {}
for _module in (cpb, rpb, fpb, kpb):
    for _service in _module.DESCRIPTOR.services_by_name.values():
        for _m in _service.methods:
            if not _m.client_streaming and not _m.server_streaming:
                _METHODS[_m.input_type.full_name] = (
                    "/%s/%s" % (_service.full_name, _m.name), _service.name, _m.name)


def split_addrs(addr):
    """A list of endpoints from a list, or a comma-separated string."""
    if isinstance(addr, (list, tuple)):
        return [a.strip() for a in addr if a and a.strip()]
    return [a.strip() for a in (addr or "").split(",") if a.strip()]


def _string_at(msg, path):
    for name in path.split("."):
        msg = getattr(msg, name)
    return msg


def parse_cursor(text, count):
    """An output cursor ("o1.<P>.<last>.<p>-<seq>...") as (last, {p: seq})."""
    if not text:
        return 0, {}
    parts = text.split(".")
    if len(parts) < 3 or parts[0] != "o1" or int(parts[1]) != count:
        raise ValueError("cursor: %r is not a cursor of a data set of %d partitions"
                         % (text, count))
    pos = {}
    for item in parts[3:]:
        p, _, seq = item.partition("-")
        pos[int(p)] = int(seq)
    return int(parts[2]), pos


def format_cursor(count, last, pos):
    return "o1.%d.%d" % (count, last) + "".join(
        ".%d-%d" % (p, s) for p, s in sorted(pos.items()) if s > 0)


def merge_cursors(count, *cursors):
    """Per partition the furthest position any cursor holds."""
    last, pos = 0, {}
    for c in cursors:
        if not c:
            continue
        l, p = parse_cursor(c, count)
        last = l
        for k, v in p.items():
            pos[k] = max(pos.get(k, 0), v)
    return format_cursor(count, last, pos)


class RoutingClient(Client):
    """keyflow.Client over several endpoints; see the module's text."""

    def __init__(self, addr=None, *, timeout_s=30.0, **options):
        addrs = split_addrs(addr)
        if not addrs:
            raise ValueError("addr: no endpoint given")
        self.addrs = addrs
        self._clients = [Client(a, timeout_s=timeout_s, **options) for a in addrs]
        first = self._clients[0]
        # Client's own helpers (descriptors, batches) go through the first.
        self._conn = first._conn
        self.addr = ",".join(addrs)
        self.timeout_s = timeout_s
        self._coord, self._runs, self._fns = first._coord, first._runs, first._fns
        self._schemas = {}
        self._schemas_lock = threading.Lock()
        self._placements = {}  # function_id -> "single" | "split", with _schemas
        self.push_retries = 0
        self._placement_lock = threading.Lock()
        self._count = None
        self._owner = {}   # partition -> endpoint index
        self._routes = {}  # RPC path -> keyflow.v1.Route
        self._rotation = 0

    def close(self):
        for c in self._clients:
            c.close()

    def endpoint_clients(self):
        """One single-endpoint Client per endpoint (a Worker polls each)."""
        return list(self._clients)

    # --- placement ----------------------------------------------------------

    def _discover(self):
        """Asks every endpoint for its placement; endpoints that do not answer
        keep what an earlier answer said."""
        count, owner, routes, problems = self._count, dict(self._owner), self._routes, []
        for i, c in enumerate(self._clients):
            try:
                p = ppg.PartitionsStub(c._conn.channel).GetPlacement(
                    ppb.GetPlacementRequest(), timeout=self.timeout_s, metadata=c._conn.metadata)
            except grpc.RpcError as e:
                if e.code() == grpc.StatusCode.UNIMPLEMENTED and len(self._clients) == 1:
                    count, owner = 1, {0: 0}  # a keyflowd from before partitions
                    continue
                problems.append("%s: %s" % (c.addr, e.code().name))
                continue
            if count not in (None, p.partition_count):
                raise ValueError("endpoints: %s serves a data set of %d partitions, another one "
                                 "of %d" % (c.addr, p.partition_count, count))
            count = p.partition_count
            routes = {r.method: r for r in p.routes} or routes
            for h in p.partitions:
                other = owner.get(h.partition)
                if other is not None and other != i:
                    raise ValueError("endpoints: partition %d is served by both %s and %s (two "
                                     "copies of it: docs/scaling.md)"
                                     % (h.partition, self.addrs[other], c.addr))
                owner[h.partition] = i
        if count is None:
            raise KeyflowError(grpc.StatusCode.UNAVAILABLE,
                               "no endpoint told its placement: " + "; ".join(problems))
        with self._placement_lock:
            self._count, self._owner, self._routes = count, owner, routes

    def _known(self):
        if self._count is None:
            self._discover()
        return self._count

    def partition_count(self):
        return self._known()

    def _client_of(self, partition):
        self._known()
        i = self._owner.get(partition)
        if i is None:
            self._discover()  # a partition no endpoint named: ask again
            i = self._owner.get(partition, 0)  # its refusal names the owner
        return self._clients[i]

    def _served_clients(self):
        """The endpoints that serve at least one partition."""
        self._known()
        return [self._clients[i] for i in sorted(set(self._owner.values()))] or self._clients

    # --- one key ----------------------------------------------------------------

    def _partition_of(self, route, request):
        count = self._known()
        if route.kind == "by_coordinator":
            return _partitions.of_coordinator(_string_at(request, route.fields[0]),
                                              _string_at(request, route.fields[1]), count)
        if route.kind == "by_run_id":
            p = _partitions.of_run_id(_string_at(request, route.fields[0]), count)
            return p if p >= 0 else None
        if route.kind == "by_function_key":
            function_id = _string_at(request, route.fields[0])
            if self._single(function_id):
                return _partitions.home_of_function(function_id, count)
            d = self._descriptor(function_id)
            key = _string_at(request, route.fields[1])
            columns = [key] if len(d.key_columns) == 1 else json.loads(key)
            return _partitions.of_key(columns, count)
        return None

    def _call(self, method, request, timeout_s=None):
        path, service, name = _METHODS[request.DESCRIPTOR.full_name]
        self._known()
        route = self._routes.get(path)
        for attempt in (1, 2):
            p = self._partition_of(route, request) if route is not None else None
            target = self._client_of(p) if p is not None else self._clients[0]
            stub = {"Coordinators": target._coord, "Runs": target._runs,
                    "Functions": target._fns}.get(service)
            if stub is None:  # Keys: the first endpoint's own
                return Client._call(target, method, request, timeout_s)
            try:
                return getattr(stub, name)(request, timeout=timeout_s or self.timeout_s,
                                           metadata=target._conn.metadata)
            except grpc.RpcError as e:
                trailers = dict(e.trailing_metadata() or ())
                if attempt == 1 and "keyflow-partition" in trailers:
                    self._discover()  # the partition moved: ask again, once
                    self._forget(getattr(request, "function_id", None))
                    continue
                raise KeyflowError.from_rpc(e) from None
        raise AssertionError("unreachable")

    # --- a function's placement ---------------------------------------------

    def _forget(self, function_id):
        """Drops what is known of a function (deleted, or registered again
        with another placement)."""
        if function_id:
            with self._schemas_lock:
                self._schemas.pop(function_id, None)
                self._placements.pop(function_id, None)

    def _home_client(self, function_id):
        return self._client_of(_partitions.home_of_function(function_id, self._known()))

    def _home_info(self, function_id):
        """GetFunction of the endpoint serving the function's home (which
        answers for a SINGLE function and for a SPLIT one alike); a refusal
        naming another owner asks the endpoints again, once. Remembers the
        descriptor and the placement."""
        req = fpb.GetFunctionRequest(function_id=function_id)
        for attempt in (1, 2):
            c = self._home_client(function_id)
            try:
                info = c._fns.GetFunction(req, timeout=self.timeout_s, metadata=c._conn.metadata)
                break
            except grpc.RpcError as e:
                trailers = dict(e.trailing_metadata() or ())
                if attempt == 2 or "keyflow-partition" not in trailers:
                    raise KeyflowError.from_rpc(e) from None
                self._discover()
        # In force: SINGLE or SPLIT. UNSPECIFIED comes from a keyflowd from
        # before placement, whose functions are all split.
        placement = "single" if info.placement == fpb.PLACEMENT_SINGLE else "split"
        with self._schemas_lock:
            self._schemas[function_id] = info.descriptor
            self._placements[function_id] = placement
        return info, c

    def _descriptor(self, function_id):
        with self._schemas_lock:
            d = self._schemas.get(function_id)
        return d if d is not None else self._home_info(function_id)[0].descriptor

    def _single(self, function_id):
        """Whether the function is SINGLE (asked once, of its home's endpoint)."""
        with self._schemas_lock:
            placement = self._placements.get(function_id)
        if placement is None:
            self._home_info(function_id)
            with self._schemas_lock:
                placement = self._placements.get(function_id)
        return placement == "single"

    def send_events(self, events):
        """The events split by their coordinators' endpoints, one SendEvents
        call each; the answers in the events' order. Each endpoint's events
        are durable in one write of their own."""
        count = self._known()
        groups = {}
        for i, ev in enumerate(events):
            c = self._client_of(_partitions.of_coordinator(ev.get("workflow", ""),
                                                           ev.get("key", ""), count))
            groups.setdefault(id(c), (c, []))[1].append(i)
        out = [None] * len(events)
        for c, positions in groups.values():
            for i, answer in zip(positions, c.send_events([events[i] for i in positions])):
                out[i] = answer
        return out

    # --- every endpoint -----------------------------------------------------

    def _each(self, fn):
        """fn(client) on every serving endpoint, in order; the answers."""
        return [fn(c) for c in self._served_clients()]

    def register_function(self, descriptor):
        clients = self._served_clients()
        answers = [c.register_function(descriptor) for c in clients]
        out = answers[0]
        out["already_registered"] = all(a.already_registered for a in answers)
        fid = out.function.descriptor.function_id
        self._forget(fid)  # registered again: maybe with another placement
        out["function"] = self._one_info(fid, [a.function for a in answers], clients)
        return out

    def _one_info(self, function_id, infos, clients):
        """One function as the endpoints `clients` describe it (`infos`, in
        the same order): a SINGLE function's is its home's endpoint's, a
        SPLIT one's combined."""
        if any(i.get("placement") == "single" for i in infos):
            home = self._home_client(function_id)
            for c, info in zip(clients, infos):
                if c is home:
                    return info
        return _combine_infos(infos)

    def get_function(self, function_id):
        info, home = self._home_info(function_id)
        if info.placement == fpb.PLACEMENT_SINGLE:
            return to_native(info)
        clients = self._served_clients()
        return _combine_infos([to_native(info) if c is home else c.get_function(function_id)
                               for c in clients])

    def list_functions(self, page_size=None):
        by_id = {}
        for c in self._served_clients():
            for fn in c.list_functions(page_size):
                by_id.setdefault(fn.descriptor.function_id, []).append((c, fn))
        for fid, seen in by_id.items():
            yield self._one_info(fid, [fn for _, fn in seen], [c for c, _ in seen])

    def delete_function(self, function_id, allow_missing=False):
        self._forget(function_id)
        answers = self._each(lambda c: c.delete_function(function_id, allow_missing=True))
        out = Record(answers[0])
        for key in ("keys", "timers", "output_rows", "producers"):
            out[key] = sum(a.get(key, 0) for a in answers)
        out["deleted"] = any(a.get("deleted") for a in answers)
        if not out["deleted"] and not allow_missing:
            raise KeyflowError(grpc.StatusCode.NOT_FOUND, "function %s: no such function"
                               % function_id)
        return out

    def delete_producer(self, function_id, producer_id, allow_missing=False):
        answers = self._each(lambda c: c.delete_producer(function_id, producer_id,
                                                         allow_missing=True))
        out = Record(answers[0])
        out["deleted"] = any(a.get("deleted") for a in answers)
        out["last_sequence"] = max(a.get("last_sequence", 0) for a in answers)
        if not out["deleted"] and not allow_missing:
            raise KeyflowError(grpc.StatusCode.NOT_FOUND, "producer %s: no such producer"
                               % producer_id)
        return out

    # --- runs -------------------------------------------------------------------

    def list_runs(self, workflow="", status=None, page_size=None, key=""):
        for c in self._served_clients():
            yield from c.list_runs(workflow, status, page_size, key)

    def poll_runs(self, workflows=(), worker_id="", lease_ms=None, max_runs=1, wait_ms=0):
        clients = self._served_clients()
        start = self._rotation % len(clients)
        self._rotation += 1
        got = []
        for k in range(len(clients)):
            c = clients[(start + k) % len(clients)]
            got += c.poll_runs(workflows, worker_id, lease_ms, max_runs - len(got), 0)
            if len(got) >= max_runs:
                return got
        if got or wait_ms <= 0:
            return got
        # Wait on every endpoint; the first with runs answers, the others'
        # polls are cancelled, and runs they leased meanwhile go back.
        req = rpb.PollRunsRequest(workflows=list(workflows), worker_id=worker_id,
                                  lease_ms=lease_ms or 0, max_runs=max_runs, wait_ms=wait_ms)
        futures = [(c, c._runs.PollRuns.future(req, timeout=self.timeout_s + wait_ms / 1000.0,
                                                 metadata=c._conn.metadata)) for c in clients]
        done = threading.Event()
        for _, f in futures:
            f.add_done_callback(lambda f: done.set() if not f.cancelled() and
                                f.exception() is None and f.result().runs else None)
        done.wait(self.timeout_s + wait_ms / 1000.0)
        for _, f in futures:
            f.cancel()
        error = None
        for c, f in futures:
            try:
                runs = [to_native(r) for r in f.result().runs]
            except grpc.FutureCancelledError:
                continue
            except grpc.RpcError as e:
                error = error or e
                continue
            for run in runs:
                if len(got) < max_runs:
                    got.append(run)
                else:
                    c.release_run(run.run_id, run.lease)
        if not got and error is not None and error.code() != grpc.StatusCode.CANCELLED:
            raise KeyflowError.from_rpc(error)
        return got

    # --- process functions -----------------------------------------------------

    def push_batch(self, function_id, producer_id, sequence, rows=None, *, columns=None,
                   batch=None, watermark_us=None, attempts=None):
        count = self._known()
        if batch is None:
            batch = self.make_batch(function_id, rows, columns)
        kwargs = {} if attempts is None else {"attempts": attempts}
        if self._single(function_id):
            # Every key is in the home partition: the batch goes there whole,
            # one atomic step, its ack as the home's process answers.
            return self._home_client(function_id).push_batch(
                function_id, producer_id, sequence, batch=batch, watermark_us=watermark_us,
                **kwargs)
        d = self._descriptor(function_id)
        fields = [f.name for f in d.input_schema.fields]
        key_cols = [fields.index(k) for k in d.key_columns]
        by_client = {}
        for row in range(batch.row_count):
            columns_of_key = [batch.columns[i].strings.values[row] for i in key_cols]
            c = self._client_of(_partitions.of_key(columns_of_key, count))
            by_client.setdefault(id(c), (c, []))[1].append(row)
        targets = list(by_client.values())
        if watermark_us is not None:
            for c in self._served_clients():
                if id(c) not in by_client:
                    targets.append((c, []))
        acks = []
        for c, which in targets:
            part = _rows.slice_batch(batch, which)
            acks.append(c.push_batch(function_id, producer_id, sequence, batch=part,
                                     watermark_us=watermark_us, **kwargs))
        if len(acks) == 1:
            return acks[0]
        out = Record(acks[0])
        for key in ("rows_accepted", "activations", "timer_callbacks", "handler_calls",
                    "due_timers"):
            out[key] = sum(a.get(key, 0) for a in acks)
        out["duplicate"] = all(a.get("duplicate") for a in acks)
        out["watermark_us"] = min(a.get("watermark_us", 0) for a in acks)
        ranges = []
        for a in acks:
            ranges += a.get("output_ranges") or []
        out["output_ranges"] = ranges
        one = len(ranges) == 1
        out["first_output_seq"] = ranges[0]["first_seq"] if one else 0
        out["last_output_seq"] = ranges[0]["last_seq"] if one else 0
        return out

    def read_output(self, function_id, after_seq=0, limit=None, wait_ms=0, cursor=""):
        """A SINGLE function's: one page of its one output sequence after
        after_seq, from its home's endpoint (Client.read_output). A SPLIT
        function's: one page of one partition's output after `cursor`;
        next_cursor goes on from every endpoint's position."""
        if self._single(function_id):
            return self._home_client(function_id).read_output(function_id, after_seq, limit,
                                                              wait_ms, cursor=cursor)
        clients = self._served_clients()
        if len(clients) == 1:
            return clients[0].read_output(function_id, after_seq, limit, wait_ms, cursor=cursor)
        count = self._known()
        last, _ = parse_cursor(cursor, count)
        start = (clients.index(self._client_of(last)) + 1) % len(clients)
        for k in range(len(clients)):
            c = clients[(start + k) % len(clients)]
            page = c.read_output(function_id, 0, limit, 0, cursor=cursor)
            cursor = merge_cursors(count, cursor, page.next_cursor)
            if page.rows:
                page["next_cursor"] = cursor
                return page
        if wait_ms > 0:
            # Every endpoint long-polls; the first page with rows answers
            # (reads take nothing: the others' rows stay unread).
            results = [None] * len(clients)

            def read(i):
                try:
                    results[i] = clients[i].read_output(function_id, 0, limit, wait_ms,
                                                        cursor=cursor)
                except KeyflowError as e:
                    results[i] = e

            threads = [threading.Thread(target=read, args=(i,), daemon=True)
                       for i in range(len(clients))]
            for t in threads:
                t.start()
            deadline = time.monotonic() + wait_ms / 1000.0 + self.timeout_s
            while time.monotonic() < deadline:
                for r in results:
                    if isinstance(r, Record) and r.rows:
                        r["next_cursor"] = merge_cursors(count, cursor, r.next_cursor)
                        return r
                if all(r is not None for r in results):
                    break
                time.sleep(0.01)
            for r in results:
                if isinstance(r, KeyflowError):
                    raise r
        return Record(rows=[], first_seq=0, last_seq=0, next_after_seq=0, high_water_seq=0,
                      first_retained_seq=0, partition=0, next_cursor=cursor)

    def trim_output(self, function_id, before_seq=0, before_cursor=""):
        if self._single(function_id):
            return self._home_client(function_id).trim_output(function_id, before_seq,
                                                              before_cursor=before_cursor)
        answers = self._each(lambda c: c.trim_output(function_id, before_seq,
                                                     before_cursor=before_cursor))
        return answers[0] if len(answers) == 1 else Record(first_retained_seq=0, output_seq=0)

    def tail_output(self, function_id, after_seq=0, max_rows_per_message=None, cursor=""):
        """A SINGLE function's: its home endpoint's TailOutput stream after
        after_seq. A SPLIT function's: rows as they come, from every
        endpoint, until the iterator is closed (a loop of read_output long
        polls after `cursor`)."""
        if self._single(function_id):
            return self._home_client(function_id).tail_output(function_id, after_seq,
                                                              max_rows_per_message, cursor=cursor)
        return _RoutedTail(self, function_id, cursor, max_rows_per_message)


class _RoutedTail:
    def __init__(self, client, function_id, cursor, limit):
        self._client, self._function_id = client, function_id
        self.cursor, self._limit = cursor, limit
        self._pending, self._closed = [], False

    def __iter__(self):
        return self

    def __next__(self):
        while not self._pending:
            if self._closed:
                raise StopIteration
            page = self._client.read_output(self._function_id, limit=self._limit,
                                            wait_ms=10000, cursor=self.cursor)
            self.cursor = page.next_cursor
            self._pending = list(page.rows)
        return self._pending.pop(0)

    def cancel(self):
        self._closed = True

    close = cancel

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.cancel()


def _combine_infos(infos):
    """One SPLIT function as several partitions (endpoints) describe it."""
    out = Record(infos[0])
    for key in ("keys", "timers", "state_bytes", "output_seq"):
        out[key] = sum(i.get(key, 0) for i in infos)
    out["partitions"] = sorted((p for i in infos for p in i.get("partitions") or ()),
                               key=lambda p: p["partition"])
    out["watermark_us"] = min(i.get("watermark_us", 0) for i in infos)
    out["available"] = all(i.get("available") for i in infos)
    for i in infos:
        if i.descriptor_sha256 != out.descriptor_sha256:
            raise KeyflowError(grpc.StatusCode.INTERNAL,
                               "function %s: the endpoints hold different descriptors"
                               % out.descriptor.function_id)
        if not i.get("available"):
            out["unavailable_reason"] = i.get("unavailable_reason", "")
    return out
