#!/usr/bin/python3
"""Events over many keys into a data set spread over several keyflowd (the
pods of deploy/kubernetes/keyflow-partitions.yaml), through the routing
Python client and through the HAProxy of deploy/proxy, with one node killed
hard while sending and restarted on its volume; then the checks of
clients/python/tests/partition_ledger.py (every acknowledged event in exactly
one run, no key's state split) and the owners' names in the refusals.

    PYENV_VERSION=system PYTHONPATH=clients/python:clients/python/tests \\
    python3 partitions_traffic.py --placement FILE --proxy 127.0.0.1:PORT \\
        --victim NODE --kill 'CMD' --restart 'CMD' [--tls-ca CA] [--api-key-file KEY]

The placement file is the one the nodes serve (with their real addresses).
Rounds of one event per key alternate between the client (gRPC) and the
proxy (HTTP). In the middle of the third round --kill runs; while the
victim is down, every other node's keys must still be acknowledged and the
victim's must fail as unavailable (nothing is acknowledged for them); then
--restart runs and those events are sent again, with their IDs, until
acknowledged. Events acknowledged before the kill, sent again, are
duplicates of their runs. Prints one line per check; exits 1 on the first
failure.
"""
import argparse
import http.client
import json
import shlex
import subprocess
import sys
import time
import urllib.parse
import uuid

import keyflow
from keyflow import partitions
from partition_ledger import RETRYABLE, Ledger, balanced_keys, check_coordinators_on_owners

KEYS_PER_PARTITION = 8
ROUNDS = 6
KILL_ROUND = 2
MAX_EVENTS = 4
MAX_WAIT_MS = 300
# What the proxy answers for a node that is down: 503 (no server), 502 (the
# connection failed), or a closed connection (0).
PROXY_DOWN = (0, 502, 503)
RESTART_S = 120
SEEN_S = 90
PROXY_UP_S = 60


def parse_set(text):
    out = set()
    for part in text.split(","):
        lo, _, hi = part.partition("-")
        out.update(range(int(lo), int(hi or lo) + 1))
    return out


def read_placement(path):
    count, nodes = None, []
    with open(path) as f:
        for line in f:
            words = line.split("#", 1)[0].split()
            if words[:1] == ["partitions"]:
                count = int(words[1])
            elif words[:1] == ["node"]:
                nodes.append({"name": words[1], "set": parse_set(words[2]), "grpc": words[3],
                              "http": words[4]})
    assert count and nodes, "%s: no partition count or no node lines" % path
    return count, nodes


def ok(what):
    print("      ok  partitions: %s" % what, flush=True)


class Traffic:
    def __init__(self, args):
        self.count, self.nodes = read_placement(args.placement)
        self.owner = {p: i for i, n in enumerate(self.nodes) for p in n["set"]}
        assert sorted(self.owner) == list(range(self.count)), "a partition without a node"
        self.proxy = args.proxy
        self.auth = {}
        opts = {}
        if args.api_key_file:
            with open(args.api_key_file) as f:
                self.auth = {"Authorization": "Bearer " + f.read().strip()}
            opts["api_key_file"] = args.api_key_file
        if args.tls_ca:
            opts["tls_ca"] = args.tls_ca
        self.client = keyflow.Client([n["grpc"] for n in self.nodes], timeout_s=10, **opts)
        self.wf = "podpart-%s" % uuid.uuid4().hex[:8]
        self.keys = balanced_keys(self.wf, self.count, KEYS_PER_PARTITION)
        self.ledger = Ledger(self.wf, self.count)
        self.victim = [n["name"] for n in self.nodes].index(args.victim)

    def endpoint_of(self, partition):
        return self.owner[partition]

    def node_of_key(self, key):
        return self.owner[partitions.of_coordinator(self.wf, key, self.count)]

    def via_client(self, key, eid):
        """The receipt's run ID, or None when the call failed as unavailable."""
        try:
            return self.client.send_event(self.wf, key, {"id": eid}, id=eid, rule=keyflow.batch(
                max_events=MAX_EVENTS, max_wait_ms=MAX_WAIT_MS)).run_id
        except keyflow.KeyflowError as e:
            if e.code not in RETRYABLE:
                raise
            return None

    def proxy_request(self, method, path, body=None):
        host, port = self.proxy.rsplit(":", 1)
        conn = http.client.HTTPConnection(host, int(port), timeout=30)
        try:
            conn.request(method, path, body=None if body is None else json.dumps(body),
                         headers=dict(self.auth, **{"Content-Type": "application/json"}))
            resp = conn.getresponse()
            text = resp.read().decode()
        except (ConnectionError, http.client.HTTPException) as e:
            return 0, str(e)
        finally:
            conn.close()
        try:
            return resp.status, json.loads(text)
        except ValueError:
            return resp.status, text

    def wait_proxy(self):
        """Until the proxy reaches every node (its health checks found them up)."""
        deadline = time.monotonic() + PROXY_UP_S
        for n in self.nodes:
            while self.proxy_request("GET", "/nodes/%s/readyz" % n["name"])[0] != 200:
                assert time.monotonic() < deadline, "the proxy does not reach %s" % n["name"]
                time.sleep(0.1)
        ok("the proxy reaches every node")

    def via_proxy(self, key, eid):
        body = {"id": eid, "rule": {"kind": "batch", "maxEvents": MAX_EVENTS,
                                    "maxWaitMs": MAX_WAIT_MS}, "input": {"id": eid}}
        status, doc = self.proxy_request("POST", "/v1/workflows/%s/keys/%s/events" % (
            self.wf, urllib.parse.quote(key, safe="")), body)
        if status in PROXY_DOWN:
            return None
        assert status == 200, "proxy: %s %s -> %s %s" % (key, eid, status, doc)
        return doc["receipt"]["runId"]

    def send(self, round_, key, eid):
        return (self.via_client if round_ % 2 == 0 else self.via_proxy)(key, eid)

    def run(self, kill_cmd, restart_cmd):
        self.wait_proxy()
        worker = keyflow.Worker(self.client, concurrency=8, lease_ms=3000, poll_wait_ms=500)
        worker.handle(self.wf)(self.ledger.handle)
        worker.start()
        try:
            self.rounds(kill_cmd, restart_cmd)
            self.ledger.wait_all_seen(self.client, SEEN_S)
            ok("a worker on every pod ran all %d acknowledged events" % len(self.ledger.acked))
            self.wait_all_completed()
        finally:
            worker.stop()
        self.ledger.check_runs(self.client, self.endpoint_of)
        ok("each event in exactly one run, its receipt's; each key's runs from its own "
           "partition; each pod lists only its partitions' runs")
        check_coordinators_on_owners(self.client, self.wf, self.keys, self.count,
                                     self.endpoint_of, [n["name"] for n in self.nodes])
        ok("each of the %d coordinators only on its owner: the other pods refuse it "
           "FAILED_PRECONDITION naming the owner" % len(self.keys))
        # A run leased on the killed pod loses its lease (it expires while the
        # pod is down) and runs again, in the same run, after the restart; on
        # a busy machine a late heartbeat does the same. Counted, not refused:
        # the checks above are what must hold either way.
        print("      runs whose lease was lost and that ran again: %d" % worker.lost, flush=True)

    def wait_all_completed(self):
        """Until every run of the workflow, on every pod, is completed."""
        deadline = time.monotonic() + SEEN_S
        while True:
            runs = list(self.client.list_runs(workflow=self.wf))
            left = [r.run_id for r in runs if r.status != "completed"]
            if not left:
                break
            assert time.monotonic() < deadline, "%d of %d runs not completed after %d s: %s" % (
                len(left), len(runs), SEEN_S, left[:5])
            time.sleep(0.2)
        ok("all %d runs completed" % len(runs))

    def rounds(self, kill_cmd, restart_cmd):
        pending = []  # (round, key, event id) refused while the victim was down
        down = False
        for round_ in range(ROUNDS):
            for n, key in enumerate(self.keys):
                if round_ == KILL_ROUND and n == len(self.keys) // 2:
                    subprocess.run(shlex.split(kill_cmd), check=True, stdout=subprocess.DEVNULL)
                    down = True
                    ok("%s killed while sending (%s)" % (self.nodes[self.victim]["name"], kill_cmd))
                eid = "%s-%d" % (key, round_)
                run_id = self.send(round_, key, eid)
                if run_id is not None:
                    self.ledger.ack(eid, run_id)
                    continue
                node = self.node_of_key(key)
                assert down and node == self.victim, \
                    "%s (of %s) unavailable: only the killed pod's keys may be, while it is down" \
                    % (eid, self.nodes[node]["name"])
                pending.append((round_, key, eid))
            if round_ == KILL_ROUND + 1:
                assert pending, "no event for the killed pod was refused while it was down"
                ok("while it was down, the other pods acknowledged all their keys' events over "
                   "gRPC and the proxy; %d of its own were refused as unavailable" % len(pending))
                subprocess.run(shlex.split(restart_cmd), check=True, stdout=subprocess.DEVNULL)
                deadline = time.monotonic() + RESTART_S
                for r, key, eid in pending:
                    while True:
                        run_id = self.send(r, key, eid)
                        if run_id is not None:
                            self.ledger.ack(eid, run_id)
                            break
                        assert time.monotonic() < deadline, \
                            "%s not acknowledged %d s after the restart" % (eid, RESTART_S)
                        time.sleep(0.1)
                down = False
                ok("restarted on its volume (%s); the refused events acknowledged on retry, "
                   "with their IDs" % restart_cmd)
        for round_ in (0, 1):  # acknowledged before the kill: still there
            for key in self.keys:
                eid = "%s-%d" % (key, round_)
                run_id = self.send(round_, key, eid)
                assert run_id == self.ledger.acked[eid], \
                    "%s sent again: run %s, acknowledged in %s" % (eid, run_id,
                                                                  self.ledger.acked[eid])
        ok("all %d events acknowledged before the kill, sent again, are duplicates of their runs"
           % (2 * len(self.keys)))


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--placement", required=True)
    ap.add_argument("--proxy", required=True, help="HOST:PORT of the HAProxy (plain HTTP)")
    ap.add_argument("--victim", required=True, help="the node to kill")
    ap.add_argument("--kill", required=True, help="command that kills the victim hard")
    ap.add_argument("--restart", required=True, help="command that starts it again")
    ap.add_argument("--tls-ca")
    ap.add_argument("--api-key-file")
    args = ap.parse_args()
    t = Traffic(args)
    print("      %d keys of workflow %s over %d partitions on %s" % (
        len(t.keys), t.wf, t.count, ", ".join(n["name"] for n in t.nodes)), flush=True)
    try:
        t.run(args.kill, args.restart)
    except AssertionError as e:
        print("      FAIL  partitions: %s" % e, file=sys.stderr, flush=True)
        return 1
    finally:
        t.client.close()
    return 0


if __name__ == "__main__":
    sys.exit(main())
