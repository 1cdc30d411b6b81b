"""The CLI and the C client over a data set served by two processes
(docs/scaling.md): `--addr a,b` routes every keyed call to the process
serving its key's partition, lists and polls runs across both, registers a
function on both (split over the partitions by --placement split), and `keyflow partitions` shows each endpoint's placement
and fails when a partition is unserved.

Real keyflowd processes and the real `keyflow` binary; each key's partition
is computed with the SDK's kf-hash-1 (pinned by tests/partition/vectors.json),
so a routing mistake shows as a refusal or a run in the wrong process.
"""

import importlib.util
import json
import os
import subprocess
import sys
import unittest
import uuid

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import harness  # noqa: E402

_spec = importlib.util.spec_from_file_location(
    "kf_partitions", os.path.join(harness.ROOT, "clients", "python", "keyflow", "partitions.py"))
partitions = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(partitions)

HANDLERS = os.path.join(harness.BUILD, "handlers")
COUNT = 4
SETS = ("0-1", "2-3")
CLI_TIMEOUT_S = 60


class TwoProcesses(unittest.TestCase):

    @classmethod
    def setUpClass(cls):
        if not os.path.exists(harness.CLI):
            raise unittest.SkipTest("CLI not built: %s" % harness.CLI)
        cls.servers = harness.partition_processes(COUNT, SETS, ["--plugin-dir", HANDLERS])

    @classmethod
    def tearDownClass(cls):
        for s in cls.servers:
            if s.proc is not None:
                harness.stopped(s)

    def addr(self):
        return ",".join(s.grpc_target for s in self.servers)

    def cli(self, *args, expect=0, addr=None, stdin=None):
        env = dict(os.environ)
        env["KEYFLOW_ADDR"] = addr or self.addr()
        env["KEYFLOW_OUTPUT"] = "json"
        proc = subprocess.run([harness.CLI] + [str(a) for a in args], capture_output=True,
                              input=stdin, text=True, timeout=CLI_TIMEOUT_S, env=env)
        self.assertEqual(proc.returncode, expect, "keyflow %s exited %d\nstdout: %s\nstderr: %s"
                         % (" ".join(map(str, args)), proc.returncode, proc.stdout, proc.stderr))
        return proc

    def json_lines(self, *args):
        return [json.loads(line) for line in self.cli(*args).stdout.splitlines()]

    def endpoint_of(self, partition):
        return partition // (COUNT // len(SETS))

    def test_partitions_shows_each_endpoint(self):
        docs = self.json_lines("partitions")
        self.assertEqual([(d["partitionCount"], d["served"]) for d in docs],
                         [(COUNT, "0-1"), (COUNT, "2-3")])
        for d in docs:
            self.assertTrue(all(p["ready"] and p["id"] for p in d["partitions"]), d)
        # One endpoint alone: the other partitions are served by nobody given.
        proc = self.cli("partitions", addr=self.servers[0].grpc_target, expect=1)
        self.assertIn("partition 2 of 4 is served by no endpoint given", proc.stderr)
        # The same endpoint twice: two copies of its partitions.
        twice = "%s,%s" % (self.servers[0].grpc_target, self.servers[0].grpc_target)
        proc = self.cli("partitions", addr=twice, expect=1)
        self.assertIn("served by both", proc.stderr)

    def test_keyed_calls_reach_the_key_s_process(self):
        wf = "wf-%s" % uuid.uuid4().hex[:8]
        keys = ["k%d" % i for i in range(16)]
        self.assertEqual({self.endpoint_of(partitions.of_coordinator(wf, k, COUNT))
                          for k in keys}, {0, 1})
        runs = {}
        for k in keys:
            (doc,) = self.json_lines("send", "--workflow", wf, "--key", k, "--batch",
                                     "--max-events", "1", "--input", json.dumps({"k": k}))
            run_id = doc["receipt"]["runId"]
            self.assertEqual(partitions.of_run_id(run_id, COUNT),
                             partitions.of_coordinator(wf, k, COUNT), k)
            runs[k] = run_id
        for k, run_id in runs.items():
            (run,) = self.json_lines("get", run_id)
            self.assertEqual(run["key"], k)
            (desc,) = self.json_lines("describe", "--kind", "batch", "--workflow", wf, "--key", k)
            self.assertTrue(desc, k)
        # ListRuns goes endpoint after endpoint behind one page token.
        listed, token = [], ""
        for _ in range(20):
            args = ["list", "--workflow", wf, "--page-size", "5"]
            (page,) = self.json_lines(*(args + (["--page-token", token] if token else [])))
            listed += [r["runId"] for r in page.get("runs", [])]
            token = page.get("nextPageToken", "")
            if not token:
                break
        self.assertEqual(sorted(listed), sorted(runs.values()))
        # PollRuns finds runs on both; complete goes by the run ID.
        done = set()
        for _ in range(40):
            (polled,) = self.json_lines("poll", "--worker", "w", "--workflow", wf,
                                        "--max-runs", "16", "--wait-ms", "100")
            for run in polled.get("runs", []):
                self.cli("complete", run["runId"], "--lease", run["lease"], "--result", "1")
                done.add(run["runId"])
            if done == set(runs.values()):
                break
        self.assertEqual(done, set(runs.values()))
        # SendEvents splits by process and answers in order.
        lines = "\n".join(json.dumps({"workflow": wf, "key": k, "event": {
            "id": "many-" + k, "rule": {"kind": "batch", "maxEvents": 1}, "input": 1}})
            for k in keys)
        proc = self.cli("send-many", stdin=lines + "\n")
        answers = [json.loads(line) for line in proc.stdout.splitlines()]
        self.assertEqual(len(answers), len(keys))
        for k, a in zip(keys, answers):
            self.assertEqual(partitions.of_run_id(a["response"]["receipt"]["runId"], COUNT),
                             partitions.of_coordinator(wf, k, COUNT), a)

    def test_a_function_is_registered_on_every_process(self):
        with open(os.path.join(HANDLERS, "running_sum.descriptor.json")) as f:
            d = json.load(f)
        d["functionId"] = "rs_cli_%s" % uuid.uuid4().hex[:8]
        d["pipelineStateId"] = d["functionId"] + ".state"
        path = os.path.join(self.servers[0].data_dir, "descriptor.json")
        with open(path, "w") as f:
            json.dump(d, f)
        self.cli("functions", "register", path, "--placement", "split")
        for s in self.servers:
            (info,) = self.json_lines("functions", "get", d["functionId"])
            (alone,) = [json.loads(line) for line in self.cli(
                "functions", "get", d["functionId"], addr=s.grpc_target).stdout.splitlines()]
            self.assertEqual(alone["descriptorSha256"], info["descriptorSha256"])
        # A batch splits by its rows' keys, one batch per process; a retry is
        # a duplicate everywhere; each key's state is on its key's process.
        users = ["user-%d" % i for i in range(12)]
        self.assertEqual({self.endpoint_of(partitions.of_key([u], COUNT)) for u in users}, {0, 1})
        rows = "".join(json.dumps({"user": u, "ts": 1000 + i, "amount": i}) + "\n"
                       for i, u in enumerate(users))
        push = ("functions", "push", d["functionId"], "--producer", "p", "--sequence", "1")
        (ack,) = [json.loads(line) for line in self.cli(*push, stdin=rows).stdout.splitlines()]
        self.assertEqual(int(ack["rowsAccepted"]), len(users), ack)
        self.assertEqual(len(ack["outputRanges"]), COUNT, ack)
        (again,) = [json.loads(line) for line in self.cli(*push, stdin=rows).stdout.splitlines()]
        self.assertTrue(again.get("duplicate"), again)
        for i, u in enumerate(users):
            (state,) = self.json_lines("functions", "state", d["functionId"], u)
            self.assertEqual(int(state.get("value", 0)), i, state)
        # Output is read behind one cursor across both processes.
        out, cursor = [], ""
        for _ in range(50):
            args = ["functions", "output", d["functionId"], "--limit", "3"]
            (page,) = self.json_lines(*(args + (["--cursor", cursor] if cursor else [])))
            self.assertTrue(page.get("nextCursor"), page)
            cursor = page["nextCursor"]
            if not page.get("rows"):
                break
            for row in page["rows"]:
                self.assertEqual(partitions.of_key([row["key"]], COUNT), page.get("partition", 0))
            out += page["rows"]
        self.assertEqual(sorted(r["key"] for r in out), sorted(users))
        self.cli("functions", "trim", d["functionId"], "--before-cursor", cursor)
        (info,) = self.json_lines("functions", "get", d["functionId"])
        self.assertEqual(int(info.get("retainedRows", 0)), 0, info)
        # A dry run of rows on both processes is refused, as the server
        # refuses one of several partitions; one key's rows go to its process.
        dry_rows = [{"user": u, "ts": 5000, "amount": 1} for u in users]
        request = {"functionId": d["functionId"], "rowsJson": json.dumps(dry_rows)}
        proc = self.cli("call", "/keyflow.v1.Functions/DryRunBatch", json.dumps(request),
                        expect=1)
        self.assertIn("UNIMPLEMENTED", proc.stderr)
        self.assertIn("dry-run one partition's rows at a time", proc.stderr)
        request["rowsJson"] = json.dumps(dry_rows[:1])
        (dry,) = self.json_lines("call", "/keyflow.v1.Functions/DryRunBatch",
                                 json.dumps(request))
        self.assertEqual(int(dry["rowsAccepted"]), 1, dry)


if __name__ == "__main__":
    unittest.main()
