"""Python SDK run worker throughput: RUNS runs are created first (batch
rule, max_events 1: each event starts a run at once), then one
keyflow.Worker with CONCURRENCY runs in flight completes them all with the
handler's value (the input back). Prints one human line and one JSON line.

    python3 py_worker_bench.py ADDR RUNS CONCURRENCY
"""

import json
import os
import resource
import sys
import threading
import time
import uuid

import keyflow
from keyflow.v1 import coordinators_pb2 as cpb


def fill(client, workflow, runs, in_flight=64):
    """Creates the runs with SendEvent futures, in_flight at a time."""
    rule = cpb.Rule(kind=cpb.RULE_KIND_BATCH, max_events=1)
    sem = threading.Semaphore(in_flight)
    errors = []

    def done(fut):
        if fut.exception() is not None:
            errors.append(fut.exception())
        sem.release()

    for i in range(runs):
        sem.acquire()
        req = cpb.SendEventRequest(workflow=workflow, key="k%d" % i,
                                   event=cpb.Event(rule=rule, input_json='{"n":%d}' % i))
        client._coord.SendEvent.future(req, timeout=60).add_done_callback(done)
    for _ in range(in_flight):
        sem.acquire()
    if errors:
        raise errors[0]


def main():
    addr, runs, concurrency = sys.argv[1], int(sys.argv[2]), int(sys.argv[3])
    client = keyflow.Client(addr)
    workflow = "bench-py-" + uuid.uuid4().hex[:8]
    t0 = time.monotonic()
    fill(client, workflow, runs)
    fill_s = time.monotonic() - t0

    worker = keyflow.Worker(client, concurrency=concurrency, poll_wait_ms=1000,
                            pollers=int(os.environ.get("POLLERS", "2")))
    worker.handle(workflow, lambda input, run: input)
    cpu0 = resource.getrusage(resource.RUSAGE_SELF)
    t0 = time.monotonic()
    worker.start()
    while worker.completed + worker.failed < runs:
        time.sleep(0.005)
    elapsed = time.monotonic() - t0
    cpu1 = resource.getrusage(resource.RUSAGE_SELF)
    worker.stop()
    cpu_pct = 100.0 * ((cpu1.ru_utime - cpu0.ru_utime) + (cpu1.ru_stime - cpu0.ru_stime)) / elapsed
    out = {"sdk": "python", "runs": runs, "concurrency": concurrency, "seconds": round(elapsed, 3),
           "runs_per_s": round(runs / elapsed), "failed": worker.failed,
           "worker_cpu_pct": round(cpu_pct), "fill_runs_per_s": round(runs / fill_s)}
    print("python worker: %d runs at %d in flight in %.2f s: %d runs/s (worker CPU %d%%, failed %d)"
          % (runs, concurrency, elapsed, out["runs_per_s"], out["worker_cpu_pct"], worker.failed))
    print(json.dumps(out))
    client.close()
    os._exit(0)


if __name__ == "__main__":
    main()
