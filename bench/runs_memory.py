#!/usr/bin/env python3
"""runs_memory.py - what pending runs cost keyflowd: RSS per pending run,
restart-to-ready with them, and ListRuns latency with and without many
deleted runs, each against a baseline taken in the same run
(bench/README.md, "Runs: memory, restart, listing").

Phases (each on a fresh data directory unless said otherwise):

  memory    start keyflowd over an empty store, wait until ready, sample
            its RSS (VmRSS) as the baseline; create runs (SendEvents of 1000
            events, batch rules of max_events 1, one key per run, no event
            IDs: each event closes its window at once and its coordinator is
            gone, so what stays is the run) and sample RSS at each count of
            --counts. Per run: (RSS - baseline) / runs.
  restart   stop that server (SIGTERM) and start it again over the same
            directory: time from exec to the first 200 from /readyz, next to
            the same time for the empty store's start above.
  listing   a server with --run-attempts 1 and --run-retention-ms 1000:
            --list-live runs in workflow "list", ListRuns(workflow "list",
            page 100) --list-calls times (p50, p99); then --deleted runs in
            the same workflow, leased for 100 ms so that they expire into
            FAILED and retention deletes them; then --list-live more live
            runs and the same ListRuns calls again (the first page now begins
            behind every deleted run), plus ListRuns of every workflow.

It reports; it never asserts. Needs Debian's python3 with grpcio:

  PYENV_VERSION=system python3 bench/runs_memory.py [--keyflowd PATH]
      [--counts 100000,1000000] [--deleted 1000000] [--input-bytes 64]
      [--phases memory,restart,listing] [--keyflowd-args "--partition-count 1"]
"""

import argparse
import json
import os
import shlex
import shutil
import signal
import statistics
import subprocess
import sys
import tempfile
import time
import urllib.request

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
EVENTS_PER_CALL = 1000


def log(msg):
    print("== " + msg, file=sys.stderr, flush=True)


def make_stubs():
    """Python stubs for api/ (the end-to-end tests' generator)."""
    sys.path.insert(0, os.path.join(ROOT, "tests", "e2e"))
    import harness
    return harness.stubs()


class Server:
    def __init__(self, keyflowd, data, args=()):
        self.keyflowd = keyflowd
        self.data = data
        self.args = list(args)
        self.proc = None
        self.log = open(os.path.join(os.path.dirname(data), "keyflowd.log"), "ab")

    def start(self):
        """Starts keyflowd; returns seconds from exec to the first 200 from /readyz."""
        ports = os.path.join(os.path.dirname(self.data), "ports")
        if os.path.exists(ports):
            os.unlink(ports)
        t0 = time.monotonic()
        self.proc = subprocess.Popen(
            [self.keyflowd, "--data", self.data, "--grpc", "127.0.0.1:0", "--http", "127.0.0.1:0",
             "--port-file", ports, "--log-level", "warn"] + self.args,
            stdout=self.log, stderr=self.log)
        deadline = t0 + 600
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                raise SystemExit("keyflowd exited with %d" % self.proc.returncode)
            if os.path.exists(ports):
                text = open(ports).read()
                fields = dict(line.split("=", 1) for line in text.split() if "=" in line)
                if "grpc" in fields and "http" in fields:
                    self.grpc_port = int(fields["grpc"])
                    self.http_port = int(fields["http"])
                    try:
                        with urllib.request.urlopen(
                                "http://127.0.0.1:%d/readyz" % self.http_port, timeout=1) as r:
                            if r.status == 200:
                                return time.monotonic() - t0
                    except OSError:
                        pass
            time.sleep(0.005)
        raise SystemExit("keyflowd was not ready within 600 s")

    def stop(self):
        if self.proc and self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
            try:
                self.proc.wait(timeout=120)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()
        self.proc = None

    def rss_bytes(self):
        with open("/proc/%d/status" % self.proc.pid) as f:
            for line in f:
                if line.startswith("VmRSS:"):
                    return int(line.split()[1]) * 1024
        raise SystemExit("no VmRSS")

    def metric(self, name):
        with urllib.request.urlopen("http://127.0.0.1:%d/metrics" % self.http_port, timeout=5) as r:
            for line in r.read().decode().splitlines():
                if line.startswith(name + " ") or line.startswith(name + "{"):
                    return float(line.rsplit(" ", 1)[1])
        return 0.0


class Client:
    def __init__(self, port):
        import grpc
        from keyflow.v1 import coordinators_pb2, coordinators_pb2_grpc, runs_pb2, runs_pb2_grpc
        self.grpc = grpc
        self.cpb = coordinators_pb2
        self.rpb = runs_pb2
        self.channel = grpc.insecure_channel("127.0.0.1:%d" % port, options=[
            ("grpc.max_receive_message_length", 64 << 20)])
        self.coords = coordinators_pb2_grpc.CoordinatorsStub(self.channel)
        self.runs = runs_pb2_grpc.RunsStub(self.channel)

    def create_runs(self, workflow, first, count, input_bytes, tag):
        """`count` runs in `workflow`, keys tag-first .. tag-(first+count-1),
        several SendEvents calls in flight."""
        pad = "x" * max(0, input_bytes - 12)
        futures = []
        made = 0
        i = first
        end = first + count
        while i < end:
            n = min(EVENTS_PER_CALL, end - i)
            req = self.cpb.SendEventsRequest()
            for j in range(i, i + n):
                ev = req.events.add()
                ev.workflow = workflow
                ev.key = "%s-%d" % (tag, j)
                ev.event.rule.kind = self.cpb.RULE_KIND_BATCH
                ev.event.rule.max_events = 1
                ev.event.input_json = json.dumps(pad)
            futures.append((n, self.coords.SendEvents.future(req, timeout=300)))
            i += n
            if len(futures) >= 4:
                made += self._settle(futures.pop(0))
        for f in futures:
            made += self._settle(f)
        return made

    def _settle(self, item):
        n, fut = item
        resp = fut.result()
        bad = [r for r in resp.results if r.WhichOneof("outcome") != "response"]
        if bad:
            raise SystemExit("SendEvents refused %d of %d: %s" % (len(bad), n, bad[0].error.message))
        return n

    def lease_all(self, workflow, lease_ms):
        leased = 0
        while True:
            resp = self.runs.PollRuns(self.rpb.PollRunsRequest(
                workflows=[workflow], worker_id="bench", lease_ms=lease_ms, max_runs=100),
                timeout=60)
            if not resp.runs:
                return leased
            leased += len(resp.runs)

    def list_latency_ms(self, workflow, calls):
        samples = []
        for _ in range(calls):
            t0 = time.monotonic()
            resp = self.runs.ListRuns(self.rpb.ListRunsRequest(workflow=workflow, page_size=100),
                                      timeout=60)
            samples.append((time.monotonic() - t0) * 1000)
            if len(resp.runs) == 0:
                raise SystemExit("ListRuns(%r) returned no run" % workflow)
        first = samples[0]
        samples.sort()
        return {"first_ms": round(first, 2), "p50_ms": round(statistics.median(samples), 2),
                "p99_ms": round(samples[min(len(samples) - 1, int(len(samples) * 0.99))], 2)}


def wait_for(what, fn, timeout_s):
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if fn():
            return
        time.sleep(0.2)
    raise SystemExit("timed out waiting for " + what)


def settle_rss(server):
    """RSS once it stops moving: within 1 MiB over 3 s (memtables, and the
    allocator: keyflowd gives freed heap back about a second after a burst
    ends, base/trim.h), at most 30 s."""
    samples = [server.rss_bytes()]
    for _ in range(60):
        time.sleep(0.5)
        samples.append(server.rss_bytes())
        last = samples[-7:]
        if len(last) == 7 and max(last) - min(last) < (1 << 20):
            break
    return samples[-1]


def memory(server):
    """RSS, what RocksDB holds (memtables, block cache) and the run table's
    own estimate, in bytes."""
    rss = settle_rss(server)
    return {"rss": rss,
            "store": server.metric("keyflow_store_memtable_bytes")
            + server.metric("keyflow_store_block_cache_bytes"),
            "runs": server.metric("keyflow_runs_memory_bytes")}


def per_run(m, base, runs):
    """Bytes per run over the baseline: of RSS, of RSS without RocksDB's
    memtables and block cache, and the run table's estimate."""
    return {"rss": round((m["rss"] - base["rss"]) / runs),
            "rss_without_store": round(((m["rss"] - m["store"]) - (base["rss"] - base["store"]))
                                       / runs),
            "table": round((m["runs"] - base["runs"]) / runs)}


def phase_memory_restart(args, work, phases):
    data = os.path.join(work, "mem", "data")
    os.makedirs(os.path.dirname(data))
    server = Server(args.keyflowd, data, args.keyflowd_args)
    results = {}
    try:
        ready_empty = server.start()
        results["ready_empty_s"] = round(ready_empty, 3)
        base = memory(server)
        results["rss_empty_mib"] = round(base["rss"] / 1048576, 1)
        log("empty store: ready in %.3f s, RSS %.1f MiB" % (ready_empty, base["rss"] / 1048576))
        client = Client(server.grpc_port)
        made = 0
        for target in args.counts:
            t0 = time.monotonic()
            made += client.create_runs("mem", made, target - made, args.input_bytes, "k")
            took = time.monotonic() - t0
            wait_for("pending runs", lambda: server.metric("keyflow_runs_pending") >= made, 120)
            m = memory(server)
            per = per_run(m, base, made)
            results["at_%d" % made] = {"rss_mib": round(m["rss"] / 1048576, 1),
                                      "store_mib": round(m["store"] / 1048576, 1),
                                      "bytes_per_run": per}
            log("%d pending runs (made in %.1f s): RSS %.1f MiB (RocksDB memtables and cache "
                "%.1f MiB); per run: %d bytes of RSS, %d without RocksDB's, %d by the table's "
                "estimate" % (made, took, m["rss"] / 1048576, m["store"] / 1048576, per["rss"],
                              per["rss_without_store"], per["table"]))
        client.channel.close()
        if "restart" in phases:
            server.stop()
            ready = server.start()
            m = memory(server)
            per = per_run(m, base, made)
            results["restart"] = {"ready_s": round(ready, 3),
                                  "ratio_to_empty": round(ready / ready_empty, 1),
                                  "rss_mib": round(m["rss"] / 1048576, 1),
                                  "store_mib": round(m["store"] / 1048576, 1),
                                  "bytes_per_run": per}
            log("restart with %d pending runs: ready in %.3f s (%.1fx the empty start); RSS "
                "%.1f MiB (RocksDB %.1f MiB); per run: %d bytes of RSS, %d without RocksDB's"
                % (made, ready, ready / ready_empty, m["rss"] / 1048576, m["store"] / 1048576,
                   per["rss"], per["rss_without_store"]))
    finally:
        server.stop()
    return results


def phase_listing(args, work):
    data = os.path.join(work, "list", "data")
    os.makedirs(os.path.dirname(data))
    server = Server(args.keyflowd, data,
                    ["--run-attempts", "1", "--run-retention-ms", "1000"] + args.keyflowd_args)
    results = {}
    try:
        server.start()
        client = Client(server.grpc_port)
        client.create_runs("list", 0, args.list_live, args.input_bytes, "a")
        before = client.list_latency_ms("list", args.list_calls)
        results["list_before"] = before
        log("ListRuns, %d live runs: p50 %.2f ms, p99 %.2f ms"
            % (args.list_live, before["p50_ms"], before["p99_ms"]))
        t0 = time.monotonic()
        deleted0 = server.metric("keyflow_runs_deleted_total")
        done = 0
        while done < args.deleted:
            n = min(100000, args.deleted - done)
            client.create_runs("list", done, n, args.input_bytes, "d")
            done += n
        # Every run so far (the first --list-live too) is leased for 100 ms,
        # expires into FAILED (one attempt) and is deleted 1 s later: the
        # workflow's index begins with all of them, deleted.
        leased = client.lease_all("list", 100)
        log("created and leased %d runs in %.1f s; waiting for expiry and retention"
            % (leased, time.monotonic() - t0))
        wait_for("retention", lambda: server.metric("keyflow_runs_deleted_total") - deleted0 >= leased,
                 600)
        log("%d runs deleted (%.1f s since the first was created)"
            % (server.metric("keyflow_runs_deleted_total") - deleted0, time.monotonic() - t0))
        client.create_runs("list", 0, args.list_live, args.input_bytes, "b")
        after = client.list_latency_ms("list", args.list_calls)
        every = client.list_latency_ms("", args.list_calls)
        results["deleted"] = leased
        results["list_after"] = after
        results["list_all_after"] = every
        log("ListRuns after %d deleted runs: first %.2f ms, p50 %.2f ms, p99 %.2f ms; every "
            "workflow: first %.2f ms, p50 %.2f ms, p99 %.2f ms"
            % (leased, after["first_ms"], after["p50_ms"], after["p99_ms"], every["first_ms"],
               every["p50_ms"], every["p99_ms"]))
        client.channel.close()
    finally:
        server.stop()
    return results


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--keyflowd", default=os.path.join(ROOT, "build", "service", "main", "keyflowd"))
    ap.add_argument("--counts", default="100000,1000000")
    ap.add_argument("--deleted", type=int, default=1000000)
    ap.add_argument("--input-bytes", type=int, default=64)
    ap.add_argument("--list-live", type=int, default=1000)
    ap.add_argument("--list-calls", type=int, default=200)
    ap.add_argument("--phases", default="memory,restart,listing")
    ap.add_argument("--keep", action="store_true", help="keep the data directories")
    ap.add_argument("--keyflowd-args", default="",
                    help="extra keyflowd flags, e.g. \"--partition-count 1\" (a new data set "
                    "gets the default partition count otherwise)")
    args = ap.parse_args()
    args.keyflowd_args = shlex.split(args.keyflowd_args)
    args.counts = sorted(int(c) for c in args.counts.split(","))
    phases = set(args.phases.split(","))
    make_stubs()
    work = tempfile.mkdtemp(prefix="kf-runs-memory-", dir=os.path.join(ROOT, "build"))
    log("work directory %s" % work)
    results = {"keyflowd": args.keyflowd, "keyflowd_args": args.keyflowd_args,
               "input_bytes": args.input_bytes}
    try:
        if "memory" in phases:
            results.update(phase_memory_restart(args, work, phases))
        if "listing" in phases:
            results.update(phase_listing(args, work))
    finally:
        if not args.keep:
            shutil.rmtree(work, ignore_errors=True)
    print(json.dumps(results))


if __name__ == "__main__":
    main()
