"""What a test of a data set spread over several processes checks after
sending events over many keys and killing one process: every acknowledged
event is in exactly one run (its receipt's), every run of a key came from
the key's one partition, each process holds only its own partitions' runs,
and each coordinator exists only on its owner (the others refuse it
FAILED_PRECONDITION naming the partition, and the owner when a placement
file names it).

Shared by clients/python/tests/test_partitions.py (three processes on
loopback) and tests/container/partitions_traffic.py (three pods of
deploy/kubernetes/keyflow-partitions.yaml under podman kube play).
Failures raise AssertionError with what was wrong.
"""

import threading
import time

import grpc

import keyflow
from keyflow import partitions

RETRYABLE = (grpc.StatusCode.UNAVAILABLE, grpc.StatusCode.DEADLINE_EXCEEDED)


def balanced_keys(workflow, count, per_partition, prefix="key-"):
    """per_partition keys in each of the count partitions, chosen, not hoped for."""
    keys, n, i = [], [0] * count, 0
    while len(keys) < per_partition * count:
        p = partitions.of_coordinator(workflow, "%s%d" % (prefix, i), count)
        if n[p] < per_partition:
            keys.append("%s%d" % (prefix, i))
            n[p] += 1
        i += 1
    return keys


class Ledger:
    """The events acknowledged (event ID -> the receipt's run ID) and the
    runs a worker saw them in; `handle` is the worker's handler, for events
    whose input is {"id": event ID}."""

    def __init__(self, workflow, count):
        self.workflow = workflow
        self.count = count
        self.acked = {}
        self.seen = {}         # event ID -> run IDs it was in
        self.runs_of_key = {}  # key -> run IDs
        self.lock = threading.Lock()

    def handle(self, inputs, run):
        with self.lock:
            self.runs_of_key.setdefault(run.key, set()).add(run.run_id)
            for item in inputs:
                self.seen.setdefault(item["id"], set()).add(run.run_id)
        return len(inputs)

    def ack(self, event_id, run_id):
        with self.lock:
            self.acked[event_id] = run_id

    def wait_all_seen(self, client, timeout_s):
        """Until a worker saw every acknowledged event, or fails naming the missing."""
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            with self.lock:
                if all(e in self.seen for e in self.acked):
                    return
            time.sleep(0.05)
        with self.lock:
            missing = sorted(e for e in self.acked if e not in self.seen)
            runs = sorted({self.acked[e] for e in missing})
        detail = [(r, client.get_run(r)) for r in runs[:5]]
        raise AssertionError("%d events never in a run after %d s: %s; their runs: %s"
                             % (len(missing), timeout_s, missing[:10], detail))

    def check_runs(self, client, endpoint_of):
        """Exactly one run per event, its receipt's; each key's runs from its
        partition; each endpoint (client.endpoint_clients()) holding only the
        runs of its partitions (endpoint_of(partition) -> index)."""
        wf, count = self.workflow, self.count
        with self.lock:
            for eid, run_ids in self.seen.items():
                assert len(run_ids) == 1, "%s is in runs %s" % (eid, sorted(run_ids))
            for eid, run_id in self.acked.items():
                assert self.seen[eid] == {run_id}, \
                    "%s: in %s, its receipt says %s" % (eid, self.seen[eid], run_id)
            for key, run_ids in self.runs_of_key.items():
                p = partitions.of_coordinator(wf, key, count)
                got = {partitions.of_run_id(r, count) for r in run_ids}
                assert got == {p}, "%s: runs from partitions %s, its partition is %d" % (
                    key, sorted(got), p)
            all_runs = set().union(*self.runs_of_key.values())
        for i, c in enumerate(client.endpoint_clients()):
            for run in c.list_runs(workflow=wf):
                p = partitions.of_coordinator(wf, run.key, count)
                assert endpoint_of(p) == i, "%s (partition %d) listed by endpoint %d" % (
                    run.run_id, p, i)
        listed = {r.run_id for r in client.list_runs(workflow=wf)}
        assert listed == all_runs, "listed runs %d, worked runs %d: %s" % (
            len(listed), len(all_runs), sorted(listed ^ all_runs)[:5])


def check_coordinators_on_owners(client, workflow, keys, count, endpoint_of, owner_names=None,
                                 kind="batch"):
    """Each key's coordinator is described by its owner only; every other
    endpoint refuses it FAILED_PRECONDITION naming its partition (and the
    owner's node name, when owner_names[endpoint] is given)."""
    for key in keys:
        p = partitions.of_coordinator(workflow, key, count)
        for i, c in enumerate(client.endpoint_clients()):
            if i == endpoint_of(p):
                c.describe(kind, workflow, key)
                continue
            try:
                c.describe(kind, workflow, key)
            except keyflow.KeyflowError as e:
                assert e.code == grpc.StatusCode.FAILED_PRECONDITION, (key, i, e)
                assert "partition %d of %d" % (p, count) in e.message, (key, i, e.message)
                if owner_names:
                    assert owner_names[endpoint_of(p)] in e.message, (key, i, e.message)
            else:
                raise AssertionError("%s (partition %d) described by endpoint %d, not its owner %d"
                                     % (key, p, i, endpoint_of(p)))
