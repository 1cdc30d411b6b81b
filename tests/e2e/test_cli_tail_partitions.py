"""The CLI and the C client over a data set of 6 partitions served by three
processes (docs/scaling.md, "Clients over several processes"). A SINGLE
function (the default placement) lives at the process serving its home
partition: `keyflow functions push` sends each batch there whole,
`functions output --after` pages its one sequence, `functions tail` follows
that process, and `functions get` shows its placement, home partition and
the home's counters. For a function registered `--placement split`,
`functions push` splits rows_json batches by key, `functions output` reads
everything back exactly once behind one merged cursor, `functions tail`
follows every process at once and prints a merged cursor to resume from
without gaps or repeats, and a row of a partition no endpoint given serves
refuses the whole push with nothing applied anywhere.

Real keyflowd processes and the real `keyflow` binary; the partition of each
key is computed with the SDK's kf-hash-1 (pinned by
tests/partition/vectors.json).
"""

import importlib.util
import json
import os
import selectors
import subprocess
import sys
import time
import unittest
import uuid

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import harness  # noqa: E402

_spec = importlib.util.spec_from_file_location(
    "kf_partitions", os.path.join(harness.ROOT, "clients", "python", "keyflow", "partitions.py"))
partitions = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(partitions)

HANDLERS = os.path.join(harness.BUILD, "handlers")
COUNT = 6  # explicit: independent of the default partition count
SETS = ("0-1", "2-3", "4-5")
CLI_TIMEOUT_S = 60
TAIL_DEADLINE_S = 30


class ThreeProcesses(unittest.TestCase):

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

    def env(self, addr=None, output="json"):
        env = dict(os.environ)
        env["KEYFLOW_ADDR"] = addr or self.addr()
        env["KEYFLOW_OUTPUT"] = output
        return env

    def cli(self, *args, expect=0, addr=None, stdin=None, output="json"):
        proc = subprocess.run([harness.CLI] + [str(a) for a in args], capture_output=True,
                              input=stdin, text=True, timeout=CLI_TIMEOUT_S,
                              env=self.env(addr, output))
        self.assertEqual(proc.returncode, expect, "keyflow %s exited %d\nstdout: %s\nstderr: %s"
                         % (" ".join(map(str, args)), proc.returncode, proc.stdout, proc.stderr))
        return proc

    def json_lines(self, *args, addr=None):
        return [json.loads(line) for line in self.cli(*args, addr=addr).stdout.splitlines()]

    def descriptor_file(self, function_id):
        with open(os.path.join(HANDLERS, "running_sum.descriptor.json")) as f:
            d = json.load(f)
        d["functionId"] = function_id
        d["pipelineStateId"] = d["functionId"] + ".state"
        path = os.path.join(self.servers[0].data_dir, d["functionId"] + ".json")
        with open(path, "w") as f:
            json.dump(d, f)
        return path

    def register(self, *flags):
        """A new running_sum function, split over the partitions unless
        `flags` say otherwise (the tests below are about splitting)."""
        fid = "rs_tail_%s" % uuid.uuid4().hex[:8]
        self.cli("functions", "register", self.descriptor_file(fid),
                 *(flags or ("--placement", "split")))
        return fid

    @staticmethod
    def rows(users, first_ts):
        return "".join(json.dumps({"user": u, "ts": first_ts + i, "amount": 1}) + "\n"
                       for i, u in enumerate(users))

    def process_of(self, user):
        return partitions.of_key([user], COUNT) // 2

    def read_all(self, fid, cursor=""):
        """Every row after `cursor`, page by page; the rows and the last cursor."""
        out = []
        for _ in range(200):
            args = ["functions", "output", fid, "--limit", "7"]
            (page,) = self.json_lines(*(args + (["--cursor", cursor] if cursor else [])))
            self.assertTrue(page.get("nextCursor"), page)
            cursor = page["nextCursor"]
            if not page.get("rows"):
                return out, cursor
            for row in page["rows"]:
                self.assertEqual(partitions.of_key([row["key"]], COUNT), page.get("partition", 0))
            out += [(page.get("partition", 0), int(r["_seq"]), r["key"]) for r in page["rows"]]
        self.fail("output did not end")

    def test_a_single_function_lives_at_its_home_process(self):
        # A function whose home the last process serves: a client that sent
        # its calls to the first endpoint would miss it.
        fid = next(f for f in ("rs_single_%s" % uuid.uuid4().hex[:8] for _ in range(1000))
                   if partitions.home_of_function(f, COUNT) // 2 == 2)
        home = partitions.home_of_function(fid, COUNT)
        proc = self.cli("functions", "register", self.descriptor_file(fid), "--placement",
                        "spread", expect=2)
        self.assertIn("--placement: expected single or split, got \"spread\"", proc.stderr)
        (reg,) = self.json_lines("functions", "register", self.descriptor_file(fid))
        self.assertEqual(reg["function"]["placement"], "PLACEMENT_SINGLE", reg)
        users = ["u%d" % i for i in range(60)]
        self.assertEqual({self.process_of(u) for u in users}, {0, 1, 2})
        for seq, json_rows in ((1, []), (2, ["--json-rows"])):
            (ack,) = [json.loads(line) for line in self.cli(
                "functions", "push", fid, "--producer", "p", "--sequence", seq, *json_rows,
                stdin=self.rows(users, 1000 * seq)).stdout.splitlines()]
            self.assertEqual(int(ack["rowsAccepted"]), len(users), ack)
            self.assertEqual((int(ack["firstOutputSeq"]), int(ack["lastOutputSeq"])),
                             ((seq - 1) * 60 + 1, seq * 60), ack)
        # Everything at the home's process, as that process alone tells.
        (alone,) = self.json_lines("functions", "get", fid, addr=self.servers[2].grpc_target)
        self.assertEqual((int(alone["keys"]), int(alone["outputSeq"])), (60, 120), alone)
        (info,) = self.json_lines("functions", "get", fid)
        self.assertEqual((info["placement"], info.get("homePartition", 0), int(info["keys"]),
                          int(info["outputSeq"])), ("PLACEMENT_SINGLE", home, 60, 120), info)
        table = self.cli("functions", "get", fid, output="table").stdout
        self.assertRegex(table, r"(?m)^placement\s+SINGLE$")
        self.assertRegex(table, r"(?mi)^home partition\s+%d$" % home)
        listed = self.cli("functions", "list", output="table").stdout
        self.assertRegex(listed, r"(?m)^\{\"version\":1,\"functionId\":\"%s.*\sSINGLE\s+%d\s" % (fid[:12], home))
        # One sequence, paged with --after; no cursor.
        seqs, after = [], 0
        for _ in range(40):
            (page,) = self.json_lines("functions", "output", fid, "--after", after,
                                      "--limit", "7")
            self.assertEqual(page.get("partition"), home, page)  # one sequence, its home's
            if not page.get("rows"):
                break
            self.assertEqual(int(page["firstSeq"]), after + 1, page)
            seqs += [int(r["_seq"]) for r in page["rows"]]
            after = int(page["nextAfterSeq"])
        self.assertEqual(seqs, list(range(1, 121)))
        # The tail follows the home's process from a sequence.
        tail = self.start_tail(fid, "--after", "118")
        seen = []
        try:
            self.tail_until(tail, 2, seen, time.monotonic() + TAIL_DEADLINE_S)
        finally:
            self.stop_tail(tail)
        self.assertEqual([s for _, s, _ in seen], [119, 120])
        self.cli("functions", "trim", fid, "--before", "101")
        (info,) = self.json_lines("functions", "get", fid)
        self.assertEqual(int(info.get("firstRetainedSeq", 0)), 101, info)

    def test_json_rows_push_splits_and_reads_back_exactly_once(self):
        fid = self.register()
        users = ["u%d" % i for i in range(60)]
        self.assertEqual({self.process_of(u) for u in users}, {0, 1, 2})
        push = ("functions", "push", fid, "--producer", "p", "--sequence", "1", "--json-rows")
        (ack,) = [json.loads(line) for line in
                  self.cli(*push, stdin=self.rows(users, 1000)).stdout.splitlines()]
        self.assertEqual(int(ack["rowsAccepted"]), len(users), ack)
        self.assertEqual(sorted(r.get("partition", 0) for r in ack["outputRanges"]),
                         list(range(COUNT)), ack)
        (again,) = [json.loads(line) for line in
                    self.cli(*push, stdin=self.rows(users, 1000)).stdout.splitlines()]
        self.assertTrue(again.get("duplicate"), again)
        got, cursor = self.read_all(fid)
        self.assertEqual(sorted(k for _, _, k in got), sorted(users))
        self.assertEqual(len(set((p, s) for p, s, _ in got)), len(users))
        # Rows pushed later are read after the cursor, and only they.
        more = ["v%d" % i for i in range(30)]
        self.cli("functions", "push", fid, "--producer", "p", "--sequence", "2",
                 stdin=self.rows(more, 2000))
        later, _ = self.read_all(fid, cursor)
        self.assertEqual(sorted(k for _, _, k in later), sorted(more))

    def tail_until(self, proc, want, seen, deadline):
        """Reads the tail's pages until `want` rows were seen; the pages."""
        pages = []
        sel = selectors.DefaultSelector()
        sel.register(proc.stdout, selectors.EVENT_READ)
        buf = b""
        try:
            while len(seen) < want:
                left = deadline - time.monotonic()
                self.assertGreater(left, 0, "tail saw %d of %d rows" % (len(seen), want))
                if not sel.select(timeout=left):
                    continue
                chunk = os.read(proc.stdout.fileno(), 65536)
                if not chunk:
                    self.fail("the tail ended: %s" % proc.stderr.read())
                buf += chunk
                while b"\n" in buf:
                    line, buf = buf.split(b"\n", 1)
                    page = json.loads(line)
                    pages.append(page)
                    for r in page.get("rows", []):
                        seen.append((page.get("partition", 0), int(r["_seq"]), r["key"]))
        finally:
            sel.close()
        return pages

    def start_tail(self, fid, *extra):
        return subprocess.Popen([harness.CLI, "functions", "tail", fid] + list(extra),
                                stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                                env=self.env())

    def stop_tail(self, proc):
        proc.terminate()
        proc.wait(timeout=CLI_TIMEOUT_S)
        proc.stdout.close()
        proc.stderr.close()

    def test_tail_follows_every_process_and_resumes_from_its_cursor(self):
        fid = self.register()
        users = ["t%d" % i for i in range(48)]
        self.assertEqual({self.process_of(u) for u in users}, {0, 1, 2})
        tail = self.start_tail(fid)
        seen = []
        try:
            # A first row, then (once the tail has shown it) the rest.
            self.cli("functions", "push", fid, "--producer", "p", "--sequence", "1",
                     stdin=self.rows(users[:1], 1000))
            deadline = time.monotonic() + TAIL_DEADLINE_S
            pages = self.tail_until(tail, 1, seen, deadline)
            self.cli("functions", "push", fid, "--producer", "p", "--sequence", "2",
                     stdin=self.rows(users[1:], 1001))
            pages += self.tail_until(tail, len(users), seen, deadline)
        finally:
            self.stop_tail(tail)
        self.assertEqual(sorted(k for _, _, k in seen), sorted(users))
        self.assertEqual({p // 2 for p, _, _ in seen}, {0, 1, 2})
        for page in pages:
            for r in page["rows"]:
                self.assertEqual(partitions.of_key([r["key"]], COUNT), page.get("partition", 0))
        # Resume from a cursor in the middle: exactly the rows after it.
        half = len(pages) // 2
        cursor = pages[half - 1]["nextCursor"]
        before = [(p.get("partition", 0), int(r["_seq"]), r["key"])
                  for p in pages[:half] for r in p["rows"]]
        more = ["w%d" % i for i in range(12)]
        self.cli("functions", "push", fid, "--producer", "p", "--sequence", "3",
                 stdin=self.rows(more, 3000))
        want = len(users) + len(more) - len(before)
        tail = self.start_tail(fid, "--cursor", cursor)
        after = []
        try:
            self.tail_until(tail, want, after, time.monotonic() + TAIL_DEADLINE_S)
        finally:
            self.stop_tail(tail)
        self.assertEqual({r for r in after if r[2] in users}, set(seen) - set(before))
        self.assertEqual(len(set(before + after)), len(before) + len(after))
        self.assertEqual(sorted(k for _, _, k in before + after), sorted(users + more))

    def test_a_row_of_an_unserved_partition_refuses_the_whole_push(self):
        fid = self.register()
        users = ["x%d" % i for i in range(24)]
        self.assertEqual({self.process_of(u) for u in users}, {0, 1, 2})
        two = ",".join(s.grpc_target for s in self.servers[:2])
        for json_rows in ([], ["--json-rows"]):
            proc = self.cli("functions", "push", fid, "--producer", "p", "--sequence", "1",
                            *json_rows, stdin=self.rows(users, 1000), addr=two, expect=1)
            self.assertIn("which no endpoint given serves", proc.stderr)
            self.assertIn("FAILED_PRECONDITION", proc.stderr)
        # Nothing anywhere: no output row, no state, the sequence unused.
        got, _ = self.read_all(fid)
        self.assertEqual(got, [])
        for s in self.servers:
            (info,) = self.json_lines("functions", "get", fid, addr=s.grpc_target)
            self.assertEqual(int(info.get("keys", 0)), 0, info)
        (ack,) = [json.loads(line) for line in self.cli(
            "functions", "push", fid, "--producer", "p", "--sequence", "1",
            stdin=self.rows(users, 1000)).stdout.splitlines()]
        self.assertFalse(ack.get("duplicate"), ack)
        self.assertEqual(int(ack["rowsAccepted"]), len(users), ack)


if __name__ == "__main__":
    unittest.main()
