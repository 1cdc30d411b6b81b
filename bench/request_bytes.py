#!/usr/bin/env python3
"""request_bytes.py - how much of keyflowd's memory one client can pin with
request bytes that are never finished or never answered
(bench/README.md, "Request bytes held").

Starts keyflowd on 127.0.0.1 over a fresh data directory, reads its RSS
(/proc/PID/status VmRSS) when idle, then runs one attack and samples RSS
every 50 ms while it runs and for --settle seconds after, and reports the
idle RSS, the peak and the RSS at the end (in MiB), with what the server
refused. It never asserts.

  h2    --connections C h2c connections, each opening --streams S streams
        that send --mib M MiB of a POST body and never end it (the client
        honours flow control: it sends what the windows grant)
  grpc-partial  as h2, against the gRPC port: each stream a SendEvents call
        whose message declares --mib MiB and never gets its last byte (what
        gRPC core buffers before keyflowd sees a call)
  grpc  --calls N concurrent SendEvents calls of --mib M MiB each (events of
        240 KiB inputs), with the disk stuck (the fail_sync shim holds every
        fsync) while they arrive, so that every call taken waits in front
        of an engine; the disk comes back before the end

  PYENV_VERSION=system bench/request_bytes.py h2 [--keyflowd PATH] [--connections 4]
      [--streams 20] [--mib 18]
  PYENV_VERSION=system bench/request_bytes.py grpc [--keyflowd PATH] [--calls 32] [--mib 16]
      [--shim build/tests/e2e/kf_fail_sync.so] [--args "--grpc-request-bytes-held 128MiB"]
"""

import argparse
import os
import sys
import tempfile
import threading
import time

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(HERE)
sys.path.insert(0, os.path.join(ROOT, "tests", "e2e"))
import harness  # noqa: E402
from h2client import H2Connection  # noqa: E402

MIB = 1024 * 1024


def rss_mib(pid):
    with open("/proc/%d/status" % pid) as f:
        for line in f:
            if line.startswith("VmRSS:"):
                return int(line.split()[1]) / 1024.0
    return 0.0


class Sampler:
    """RSS every 50 ms on a thread; peak and last."""

    def __init__(self, pid):
        self.pid, self.peak, self.last, self.stop = pid, 0.0, 0.0, False
        self.thread = threading.Thread(target=self.run, daemon=True)
        self.thread.start()

    def run(self):
        while not self.stop:
            try:
                self.last = rss_mib(self.pid)
            except OSError:
                return
            self.peak = max(self.peak, self.last)
            time.sleep(0.05)

    def end(self):
        self.stop = True
        self.thread.join()


def metric(server, name):
    status, text = server.http("GET", "/metrics")
    for line in text.split("\n"):
        if line.startswith(name + " "):
            return float(line.split()[1])
    return 0.0


def streams_on_each(conns, one, settle_s):
    """Runs one(connection) on every connection at once, each in its own
    thread, then gives keyflowd settle_s seconds to act on what they hold."""
    threads = [threading.Thread(target=one, args=(c,)) for c in conns]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    time.sleep(settle_s)


def attack_h2(server, args):
    conns = [H2Connection(server.http_port) for _ in range(args.connections)]
    for c in conns:
        c.get("/healthz")  # answered first: held to the body deadline, not the head's

    def one(c):
        for _ in range(args.streams):
            s = c.open("POST", "/v1/workflows/w/keys/k/events", headers=[("content-type", "application/json")])
            c.send_body(s, int(args.mib * MIB), timeout=120)

    streams_on_each(conns, one, args.settle)
    refused = sum(len(c.refused()) for c in conns)
    for c in conns:
        c.close()
    return "streams refused: %d of %d (keyflow_http_streams_shed_total %d)" % (
        refused, args.connections * args.streams, metric(server, "keyflow_http_streams_shed_total"))


def attack_grpc_partial(server, args):
    """Like h2, against the gRPC port: each stream is a SendEvents call whose
    message declares --mib MiB and sends all of it but its last byte."""
    import struct
    size = int(args.mib * MIB)
    conns = [H2Connection(server.grpc_port) for _ in range(args.connections)]
    sent = []

    def one(c):
        for _ in range(args.streams):
            s = c.open("POST", "/keyflow.v1.Coordinators/SendEvents",
                       headers=[("content-type", "application/grpc"), ("te", "trailers")])
            sent.append(c.send_body(s, size + 4, timeout=5, first=b"\x00" + struct.pack(">I", size)))

    streams_on_each(conns, one, args.settle)
    reset = sum(len(c.reset) for c in conns)
    for c in conns:
        c.close()
    return "sent %.0f MiB in all (%.1f MiB a stream at most), %d streams reset" % (
        sum(sent) / MIB, max(sent) / MIB, reset)


def attack_grpc(server, args, stall):
    import grpc
    from keyflow.v1 import coordinators_pb2 as C
    from keyflow.v1 import coordinators_pb2_grpc as CG
    rule = C.Rule(kind=C.RULE_KIND_DEBOUNCE, window_ms=600000)
    payload = '"%s"' % ("x" * (240 * 1024))
    events = max(1, int(args.mib * MIB) // (240 * 1024))
    ch = grpc.insecure_channel(server.grpc_target, options=[("grpc.max_send_message_length", 32 << 20)])
    stub = CG.CoordinatorsStub(ch)

    def request(i):
        # One key per event: no window takes more than its 4 MiB of input.
        return C.SendEventsRequest(events=[
            C.SendEventRequest(workflow="wf", key="k%d-%d" % (i, j), event=C.Event(rule=rule, input_json=payload))
            for j in range(events)])

    if stall:
        open(stall, "w").close()
    futures = [stub.SendEvents.future(request(i), timeout=300) for i in range(args.calls)]
    time.sleep(args.settle)
    if stall:
        os.unlink(stall)
    codes = {}
    for f in futures:
        try:
            f.result()
            codes["OK"] = codes.get("OK", 0) + 1
        except grpc.RpcError as e:
            codes[e.code().name] = codes.get(e.code().name, 0) + 1
    ch.close()
    return "calls: %s (%.1f MiB each)" % (codes, request(0).ByteSize() / MIB)


def main():
    p = argparse.ArgumentParser()
    p.add_argument("attack", choices=["h2", "grpc", "grpc-partial"])
    p.add_argument("--keyflowd", default=harness.KEYFLOWD)
    p.add_argument("--connections", type=int, default=4)
    p.add_argument("--streams", type=int, default=20)
    p.add_argument("--calls", type=int, default=32)
    p.add_argument("--mib", type=float, default=18)
    p.add_argument("--settle", type=float, default=3.0)
    p.add_argument("--shim", default=os.path.join(harness.BUILD, "tests", "e2e", "kf_fail_sync.so"))
    p.add_argument("--args", default="")
    args = p.parse_args()
    harness.KEYFLOWD = args.keyflowd
    env, stall = {}, None
    if args.attack == "grpc" and os.path.exists(args.shim):
        stall = os.path.join(tempfile.mkdtemp(prefix="kf-stall-"), "stall")
        env = {"LD_PRELOAD": args.shim, "KEYFLOW_TEST_STALL_SYNC_FILE": stall}
    if args.attack == "grpc":
        harness.stubs()
    server = harness.Keyflowd(args=args.args.split(), env=env).start()
    try:
        time.sleep(1)
        idle = rss_mib(server.proc.pid)
        sampler = Sampler(server.proc.pid)
        if args.attack == "h2":
            what = attack_h2(server, args)
        elif args.attack == "grpc":
            what = attack_grpc(server, args, stall)
        else:
            what = attack_grpc_partial(server, args)
        sampler.end()
        print("%s: RSS idle %.0f MiB, peak %.0f MiB, end %.0f MiB; %s"
              % (args.attack, idle, sampler.peak, sampler.last, what))
        server.stop()
    finally:
        if stall and os.path.exists(stall):
            os.unlink(stall)
        server.cleanup()


if __name__ == "__main__":
    main()
