#!/usr/bin/env python3
"""soak.py - a steady mixed load against a running keyflowd, sampled every
few seconds (bench/soak.sh starts the server and runs this; bench/README.md,
"Soak").

The load, each kind paced at its own rate by its own threads:
  events   SendEvent with a unique event ID to one of --keys debounce
           coordinators (window --window-ms, dedup --dedup-ms): windows open
           and close (processing-time timers), IDs are remembered and expire
  runs     --workers workers PollRuns (long poll) and CompleteRun each run
  pushes   PushBatch of --rows-per-push rows to a session_counter function
           over --fn-keys keys, event time advancing 1 s per batch and the
           watermark 5 s behind it: idle timers fire (event-time timers)
  reads    a consumer reads new output --reads-per-s times a second and
           trims what it read (TrimOutput) every tenth time; plus
           DescribeCoordinator, GetRun and ListRuns (--inspects-per-s)

Every --sample-s it prints one line (and a JSON object to --out): the
process's RSS and open descriptors, the data directory's size, and per
operation the count, errors, p50 and p99 of that interval. At the end it
prints, over the samples after --warmup-s, the slopes of RSS and data
directory size (per hour, and as a share of their mean), and per operation
the p99 of the first and last 5 minutes (or halves, for a shorter run)
and their ratio. PollRuns is a long poll (wait_ms 1000): its latency
includes the wait for a run.

It reports; it never asserts. Debian's python3 (grpcio): PYENV_VERSION=system.
"""

import argparse
import json
import os
import random
import sys
import threading
import time
import uuid

import grpc

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.join(os.path.dirname(HERE), "tests", "e2e"))
import harness  # noqa: E402  (the stubs generated from api/)

harness.stubs()
from google.protobuf import json_format  # noqa: E402
from keyflow.v1 import coordinators_pb2 as C  # noqa: E402
from keyflow.v1 import coordinators_pb2_grpc as CG  # noqa: E402
from keyflow.v1 import functions_pb2 as F  # noqa: E402
from keyflow.v1 import functions_pb2_grpc as FG  # noqa: E402
from keyflow.v1 import runs_pb2 as R  # noqa: E402
from keyflow.v1 import runs_pb2_grpc as RG  # noqa: E402

WORKFLOW = "soak"
FUNCTION = "soak_sessions"
WINDOW_MINUTES = 5  # the p99 windows compared at the end
RPC_TIMEOUT_S = 30


class Stats:
    """Latencies and errors per operation, by sample interval and in all."""

    def __init__(self):
        self.lock = threading.Lock()
        self.interval = {}
        self.all = {}  # op -> [(t, seconds)]
        self.errors = {}

    def record(self, op, started, error=None):
        now = time.monotonic()
        with self.lock:
            if error is not None:
                key = (op, error)
                self.errors[key] = self.errors.get(key, 0) + 1
                return
            self.interval.setdefault(op, []).append(now - started)
            self.all.setdefault(op, []).append((now, now - started))

    def take(self):
        with self.lock:
            out, self.interval = self.interval, {}
            errors, self.errors = self.errors, {}
        return out, errors


def pct(values, p):
    if not values:
        return None
    s = sorted(values)
    return s[min(len(s) - 1, int(len(s) * p / 100.0))]


def paced(rate, stop, body):
    """Calls body() `rate` times a second until stop is set (open loop: a
    body that falls behind by more than a second skips, never bursts)."""
    step = 1.0 / rate
    next_at = time.monotonic()
    while not stop.is_set():
        now = time.monotonic()
        if next_at > now:
            stop.wait(next_at - now)
            continue
        body()
        next_at += step
        if time.monotonic() - next_at > 1.0:
            next_at = time.monotonic()


def call(stats, op, fn):
    started = time.monotonic()
    try:
        result = fn()
    except grpc.RpcError as e:
        stats.record(op, started, e.code().name)
        return None
    stats.record(op, started)
    return result


class Load:
    def __init__(self, args, stats, stop):
        self.args, self.stats, self.stop = args, stats, stop
        self.channel = grpc.insecure_channel(args.grpc)
        self.coords = CG.CoordinatorsStub(self.channel)
        self.runs = RG.RunsStub(self.channel)
        self.fns = FG.FunctionsStub(self.channel)
        self.event_time_us = 1700000000000000
        self.push_seq = 0
        self.push_lock = threading.Lock()
        self.last_run = None
        self.read_after = 0  # the consumer's position (one partition)
        self.read_cursor = ""  # ... or its cursor (several)
        self.reads = 0

    def register(self):
        with open(os.path.join(self.args.handlers, "session_counter.descriptor.json")) as f:
            d = json.load(f)
        d["functionId"], d["pipelineStateId"] = FUNCTION, FUNCTION + ".v1"
        req = json_format.ParseDict({"descriptor": d}, F.RegisterFunctionRequest())
        self.fns.RegisterFunction(req, timeout=RPC_TIMEOUT_S)

    def event(self):
        key = "k%d" % random.randrange(self.args.keys)
        rule = C.Rule(kind=C.RULE_KIND_DEBOUNCE, window_ms=self.args.window_ms,
                      dedup_ms=self.args.dedup_ms)
        req = C.SendEventRequest(workflow=WORKFLOW, key=key, event=C.Event(
            id=uuid.uuid4().hex, rule=rule, input_json='{"n": %d}' % random.randrange(1000)))
        call(self.stats, "SendEvent", lambda: self.coords.SendEvent(req, timeout=RPC_TIMEOUT_S))

    def work(self):
        while not self.stop.is_set():
            polled = call(self.stats, "PollRuns", lambda: self.runs.PollRuns(R.PollRunsRequest(
                workflows=[WORKFLOW], worker_id="soak", max_runs=20, lease_ms=60000,
                wait_ms=1000), timeout=RPC_TIMEOUT_S))
            for run in (polled.runs if polled else []):
                self.last_run = run.run_id
                call(self.stats, "CompleteRun", lambda: self.runs.CompleteRun(
                    R.CompleteRunRequest(run_id=run.run_id, lease=run.lease,
                                         result_json='{"ok": true}'), timeout=RPC_TIMEOUT_S))

    def push(self):
        with self.push_lock:
            self.push_seq += 1
            self.event_time_us += 1000000
            seq, ts = self.push_seq, self.event_time_us
        batch = F.RowBatch(row_count=self.args.rows_per_push)
        users = ["u%d" % random.randrange(self.args.fn_keys) for _ in range(self.args.rows_per_push)]
        batch.columns.add().strings.values.extend(users)
        batch.columns.add().int64s.values.extend([ts] * len(users))
        batch.columns.add().int64s.values.extend([3000000] * len(users))
        req = F.PushBatchRequest(function_id=FUNCTION, producer_id="soak-%d" % (seq % 8),
                                 sequence=seq, batch=batch, watermark_us=ts - 5000000)
        call(self.stats, "PushBatch", lambda: self.fns.PushBatch(req, timeout=RPC_TIMEOUT_S))

    def consume(self):
        """One page of new output (no wait: the latency is the read's own);
        every 10th read trims what was read. With several partitions the
        position is a cursor (docs/scaling.md); with one, after_seq."""
        page = call(self.stats, "ReadOutput", lambda: self.fns.ReadOutput(F.ReadOutputRequest(
            function_id=FUNCTION, after_seq=0 if self.read_cursor else self.read_after,
            cursor=self.read_cursor, limit=5000), timeout=RPC_TIMEOUT_S))
        if page is None:
            if self.read_cursor:
                return  # counted as an error; a cursor cannot be moved past retention here
            # Below the retained range (retention went past us): skip ahead.
            info = call(self.stats, "GetFunction", lambda: self.fns.GetFunction(
                F.GetFunctionRequest(function_id=FUNCTION), timeout=RPC_TIMEOUT_S))
            if info is not None:
                self.read_after = max(self.read_after, info.first_retained_seq - 1)
            return
        if page.next_cursor:
            self.read_cursor = page.next_cursor
        elif page.last_seq:
            self.read_after = page.last_seq
        self.reads += 1
        if self.reads % 10 == 0:
            trim = (F.TrimOutputRequest(function_id=FUNCTION, before_cursor=self.read_cursor)
                    if self.read_cursor else
                    F.TrimOutputRequest(function_id=FUNCTION, before_seq=self.read_after + 1))
            call(self.stats, "TrimOutput", lambda: self.fns.TrimOutput(trim, timeout=RPC_TIMEOUT_S))

    def inspect(self):
        key = "k%d" % random.randrange(self.args.keys)
        call(self.stats, "DescribeCoordinator", lambda: self.coords.DescribeCoordinator(
            C.DescribeCoordinatorRequest(coordinator=C.CoordinatorRef(
                kind=C.RULE_KIND_DEBOUNCE, workflow=WORKFLOW, key=key)), timeout=RPC_TIMEOUT_S))
        call(self.stats, "ListRuns", lambda: self.runs.ListRuns(R.ListRunsRequest(
            workflow=WORKFLOW, page_size=100), timeout=RPC_TIMEOUT_S))
        if self.last_run:
            call(self.stats, "GetRun", lambda: self.runs.GetRun(R.GetRunRequest(
                run_id=self.last_run), timeout=RPC_TIMEOUT_S))

    def threads(self):
        a = self.args
        out = []
        for _ in range(a.event_threads):
            out.append(lambda: paced(a.events_per_s / a.event_threads, self.stop, self.event))
        out += [self.work] * a.workers
        out.append(lambda: paced(a.pushes_per_s, self.stop, self.push))
        out.append(lambda: paced(a.reads_per_s, self.stop, self.consume))
        out.append(lambda: paced(a.inspects_per_s, self.stop, self.inspect))
        return [threading.Thread(target=t, daemon=True) for t in out]


def rss_bytes(pid):
    with open("/proc/%d/status" % pid) as f:
        for line in f:
            if line.startswith("VmRSS:"):
                return int(line.split()[1]) * 1024
    return 0


def dir_bytes(path):
    total = 0
    for base, _, files in os.walk(path):
        for name in files:
            try:
                total += os.stat(os.path.join(base, name)).st_size
            except FileNotFoundError:
                pass  # RocksDB deleted it meanwhile
    return total


def slope(points):
    """Least-squares slope of (x, y) points, or None for fewer than 2."""
    if len(points) < 2:
        return None
    n = float(len(points))
    mx = sum(x for x, _ in points) / n
    my = sum(y for _, y in points) / n
    den = sum((x - mx) ** 2 for x, _ in points)
    return sum((x - mx) * (y - my) for x, y in points) / den if den else None


def sample_loop(args, stats, stop, t0, samples, out):
    while not stop.wait(args.sample_s):
        t = time.monotonic() - t0
        lat, errors = stats.take()
        s = {"t_s": round(t), "rss_bytes": rss_bytes(args.pid),
             "fds": len(os.listdir("/proc/%d/fd" % args.pid)), "data_bytes": dir_bytes(args.data),
             "ops": {op: {"n": len(v), "p50_ms": round(pct(v, 50) * 1000, 2),
                          "p99_ms": round(pct(v, 99) * 1000, 2)} for op, v in sorted(lat.items())},
             "errors": {"%s %s" % k: n for k, n in sorted(errors.items())}}
        samples.append(s)
        out.write(json.dumps(s) + "\n")
        out.flush()
        ops = " ".join("%s n=%d p50=%.1f p99=%.1f" % (op, o["n"], o["p50_ms"], o["p99_ms"])
                       for op, o in s["ops"].items())
        print("t=%4ds rss=%.1fMiB fds=%d data=%.1fMiB %s%s" % (
            t, s["rss_bytes"] / 1048576.0, s["fds"], s["data_bytes"] / 1048576.0, ops,
            (" errors=%s" % s["errors"]) if s["errors"] else ""), flush=True)


def summarize(args, stats, samples, t0):
    steady = [s for s in samples if s["t_s"] >= args.warmup_s]
    print("\n== summary: %d samples, %d after the %d s warm-up" % (
        len(samples), len(steady), args.warmup_s))
    report = {"samples": len(samples), "steady_samples": len(steady)}
    for name, field in (("RSS", "rss_bytes"), ("data directory", "data_bytes"), ("fds", "fds")):
        pts = [(s["t_s"] / 3600.0, s[field]) for s in steady]
        k = slope(pts)
        mean = sum(y for _, y in pts) / len(pts) if pts else 0
        share = (100.0 * k / mean) if k is not None and mean else None
        report[field + "_slope_per_h"] = k
        report[field + "_slope_pct_per_h"] = share
        if k is None:
            print("%s: too few samples for a slope" % name)
        elif field == "fds":
            print("%s: mean %.0f, slope %+.1f per hour (%+.1f%%/h)" % (name, mean, k, share))
        else:
            print("%s: mean %.1f MiB, slope %+.1f MiB per hour (%+.1f%% of the mean per hour)" % (
                name, mean / 1048576.0, k / 1048576.0, share))
    start = t0 + args.warmup_s
    end = max((t for v in stats.all.values() for t, _ in v), default=start)
    # Five minutes each, or half of what followed the warm-up when that is
    # shorter, so that the two windows never overlap.
    window = min(WINDOW_MINUTES * 60, max(end - start, 0) / 2)
    print("p99 per operation, the first %.0f s after warm-up vs the last %.0f s:" % (
        window, window))
    report["p99_window_s"] = window
    report["p99"] = {}
    for op, v in sorted(stats.all.items()):
        first = [d for t, d in v if start <= t < start + window]
        last = [d for t, d in v if end - window <= t <= end]
        p_first, p_last = pct(first, 99), pct(last, 99)
        ratio = p_last / p_first if p_first and p_last else None
        report["p99"][op] = {"first_ms": p_first and p_first * 1000,
                             "last_ms": p_last and p_last * 1000, "ratio": ratio}
        print("  %-20s first %8.2f ms (n=%6d)  last %8.2f ms (n=%6d)  ratio %s" % (
            op, (p_first or 0) * 1000, len(first), (p_last or 0) * 1000, len(last),
            "%.2f" % ratio if ratio else "-"))
    return report


def main():
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--grpc", required=True, help="keyflowd's gRPC address")
    p.add_argument("--pid", type=int, required=True, help="keyflowd's process ID")
    p.add_argument("--data", required=True, help="keyflowd's data directory")
    p.add_argument("--handlers", required=True, help="the build's handlers/ directory")
    p.add_argument("--out", required=True, help="JSON lines of samples and the summary")
    p.add_argument("--duration-s", type=int, default=900)
    p.add_argument("--sample-s", type=int, default=10)
    p.add_argument("--warmup-s", type=int, default=120)
    p.add_argument("--events-per-s", type=float, default=200)
    p.add_argument("--event-threads", type=int, default=4)
    p.add_argument("--keys", type=int, default=5000)
    p.add_argument("--window-ms", type=int, default=2000)
    p.add_argument("--dedup-ms", type=int, default=60000)
    p.add_argument("--workers", type=int, default=2)
    p.add_argument("--pushes-per-s", type=float, default=10)
    p.add_argument("--rows-per-push", type=int, default=50)
    p.add_argument("--fn-keys", type=int, default=1000)
    p.add_argument("--reads-per-s", type=float, default=10)
    p.add_argument("--inspects-per-s", type=float, default=5)
    args = p.parse_args()

    stats, stop = Stats(), threading.Event()
    load = Load(args, stats, stop)
    load.register()
    samples = []
    t0 = time.monotonic()
    with open(args.out, "w") as out:
        threads = load.threads()
        for t in threads:
            t.start()
        sampler = threading.Thread(target=sample_loop, args=(args, stats, stop, t0, samples, out),
                                   daemon=True)
        sampler.start()
        try:
            stop.wait(args.duration_s)
        finally:
            stop.set()
            for t in threads:
                t.join(RPC_TIMEOUT_S)
            sampler.join(args.sample_s + 5)
        report = summarize(args, stats, samples, t0)
        out.write(json.dumps({"summary": report}) + "\n")
    load.channel.close()


if __name__ == "__main__":
    main()
