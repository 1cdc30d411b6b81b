#!/usr/bin/env python3
"""http_abuse.py - /healthz latency under HTTP abuse, against the idle
baseline in the same run (bench/README.md, "HTTP under abuse").

Starts keyflowd on 127.0.0.1 over a fresh data directory and, for each
phase, sends GET /healthz on a new connection (as a kubelet does) every
PERIOD ms for SECONDS seconds, to the gateway's port and, when keyflowd has
one, to the probe listener (--probe-address). Phases:

  idle       nothing else
  slowloris  4196 connections that send half a request head and stop, from
             132 loopback addresses (so that the per-address bound does not
             stop them: the gateway is at its 4096-connection bound), opened
             again as keyflowd closes them
  big-body   a client posting a 16 MB JSON event, one after the other (each
             is decoded, then refused for its size)

A probe that gets no answer within its timeout (2 s, a kubelet's
readiness timeout) counts as failed and as 2 s. Reports p50/p99/max and
failures per phase and port; it never asserts.

  bench/http_abuse.py [--keyflowd PATH] [--seconds 5] [--period-ms 20] [--no-probe-listener]
"""

import argparse
import json
import os
import resource
import select
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import threading
import time

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
CONNECTIONS = 4096 + 100
SOURCES = ["127.0.0.%d" % i for i in range(2, 134)]
PROBE_TIMEOUT_S = 2.0


def probe_once(port):
    """Seconds for one GET /healthz on a new connection, or None."""
    t0 = time.monotonic()
    s = socket.socket()
    s.settimeout(PROBE_TIMEOUT_S)
    try:
        s.connect(("127.0.0.1", port))
        s.sendall(b"GET /healthz HTTP/1.1\r\nHost: localhost\r\nConnection: close\r\n\r\n")
        data = b""
        while b"\r\n\r\n" not in data:
            chunk = s.recv(4096)
            if not chunk:
                return None
            data += chunk
            if time.monotonic() - t0 > PROBE_TIMEOUT_S:
                return None
        return time.monotonic() - t0 if data.startswith(b"HTTP/1.1 200") else None
    except OSError:
        return None
    finally:
        s.close()


def probe_loop(port, seconds, period_s, out):
    end = time.monotonic() + seconds
    while time.monotonic() < end:
        t = time.monotonic()
        out.append(probe_once(port))
        time.sleep(max(0.0, period_s - (time.monotonic() - t)))


def summary(samples):
    ok = sorted(x for x in samples if x is not None)
    failed = len(samples) - len(ok)
    lat = sorted(ok + [PROBE_TIMEOUT_S] * failed)
    if not lat:
        return "| 0 | - | - | - | - |"

    def pct(p):
        return lat[min(len(lat) - 1, int(p * len(lat)))] * 1000

    return "| %d | %.2f | %.2f | %.2f | %d |" % (len(samples), pct(0.50), pct(0.99), lat[-1] * 1000, failed)


class Slowloris(threading.Thread):
    """Keeps CONNECTIONS half-sent request heads open until stopped."""

    def __init__(self, port):
        super().__init__(daemon=True)
        self.port = port
        self.stop = threading.Event()
        self.opened = 0

    def open_one(self, i):
        s = socket.socket()
        s.setblocking(False)
        s.bind((SOURCES[i % len(SOURCES)], 0))
        s.connect_ex(("127.0.0.1", self.port))
        self.opened += 1
        return s

    def run(self):
        socks = {}
        poller = select.poll()
        sent = set()
        for i in range(CONNECTIONS):
            s = self.open_one(i)
            socks[s.fileno()] = s
            poller.register(s.fileno(), select.POLLOUT | select.POLLIN)
        i = CONNECTIONS
        while not self.stop.is_set():
            for fd, ev in poller.poll(100):
                s = socks.get(fd)
                if s is None:
                    continue
                if ev & (select.POLLIN | select.POLLHUP | select.POLLERR):
                    # Closed by keyflowd (a deadline): open another.
                    poller.unregister(fd)
                    del socks[fd]
                    sent.discard(fd)
                    s.close()
                    n = self.open_one(i)
                    i += 1
                    socks[n.fileno()] = n
                    poller.register(n.fileno(), select.POLLOUT | select.POLLIN)
                elif ev & select.POLLOUT and fd not in sent:
                    try:
                        s.send(b"GET /healthz HTTP/1.1\r\nHost: localhost\r\n")
                    except OSError:
                        pass
                    sent.add(fd)
                    poller.modify(fd, select.POLLIN)
        for s in socks.values():
            s.close()


class BigBodies(threading.Thread):
    def __init__(self, port):
        super().__init__(daemon=True)
        self.port = port
        self.stop = threading.Event()
        self.sent = 0
        self.body = json.dumps({"rule": {"kind": "debounce", "windowMs": 1000},
                                "input": {"a": ["x" * 100] * 160000}}).encode()

    def run(self):
        head = ("POST /v1/workflows/w/keys/k/events HTTP/1.1\r\nHost: localhost\r\nConnection: close\r\n"
                "Content-Type: application/json\r\nContent-Length: %d\r\n\r\n" % len(self.body)).encode()
        while not self.stop.is_set():
            s = socket.create_connection(("127.0.0.1", self.port), timeout=60)
            try:
                s.sendall(head + self.body)
                while s.recv(65536):
                    pass
                self.sent += 1
            except OSError:
                pass
            finally:
                s.close()


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--keyflowd", default=os.path.join(ROOT, "build-bench", "service", "main", "keyflowd"))
    ap.add_argument("--seconds", type=float, default=5)
    ap.add_argument("--period-ms", type=float, default=20)
    ap.add_argument("--no-probe-listener", action="store_true",
                    help="for a keyflowd without --probe-address")
    args = ap.parse_args()
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    resource.setrlimit(resource.RLIMIT_NOFILE, (min(hard, 3 * CONNECTIONS), hard))
    work = tempfile.mkdtemp(prefix="kf-abuse-")
    cmd = [args.keyflowd, "--data", os.path.join(work, "db"), "--grpc", "127.0.0.1:0",
           "--http", "127.0.0.1:0", "--port-file", os.path.join(work, "ports"), "--log-level", "warn"]
    if not args.no_probe_listener:
        cmd += ["--probe-address", "127.0.0.1:0"]
    log = open(os.path.join(work, "keyflowd.log"), "wb")
    proc = subprocess.Popen(cmd, stdout=log, stderr=subprocess.STDOUT)
    try:
        for _ in range(300):
            if os.path.exists(os.path.join(work, "ports")):
                break
            time.sleep(0.05)
        with open(os.path.join(work, "ports")) as f:
            ports = {k: int(v) for k, v in (line.split("=") for line in f.read().split())}
        targets = [("gateway", ports["http"])]
        if "probe" in ports:
            targets.append(("probe listener", ports["probe"]))
        print("keyflowd %s, %.0f s per phase, a probe every %.0f ms per port, timeout %.0f s"
              % (args.keyflowd, args.seconds, args.period_ms, PROBE_TIMEOUT_S))
        print()
        print("| phase | port | probes | p50 ms | p99 ms | max ms | failed |")
        print("|---|---|---:|---:|---:|---:|---:|")
        for phase in ("idle", "slowloris", "big-body"):
            load = None
            if phase == "slowloris":
                load = Slowloris(ports["http"])
            elif phase == "big-body":
                load = BigBodies(ports["http"])
            if load is not None:
                load.start()
                time.sleep(1.0)  # let the wave fill the gateway / the first body arrive
            results = {name: [] for name, _ in targets}
            threads = [threading.Thread(target=probe_loop, args=(port, args.seconds, args.period_ms / 1000,
                                                                 results[name])) for name, port in targets]
            for t in threads:
                t.start()
            for t in threads:
                t.join()
            extra = ""
            if load is not None:
                load.stop.set()
                load.join(120)
                extra = (" (%d connections opened)" % load.opened if phase == "slowloris"
                         else " (%d bodies answered)" % load.sent)
            for name, _ in targets:
                print("| %s%s | %s %s" % (phase, extra, name, summary(results[name])))
            time.sleep(1.0)
    finally:
        proc.send_signal(signal.SIGTERM)
        try:
            proc.wait(timeout=60)
        except subprocess.TimeoutExpired:
            proc.kill()
        log.close()
        shutil.rmtree(work, ignore_errors=True)


if __name__ == "__main__":
    main()
