"""End-to-end tests of `keyflow functions ...` against the real keyflowd.

Every interaction goes through the CLI binary (harness.CLI); the server is
started once per class on 127.0.0.1 port 0 with the build's handlers as its
plugin directory. Most tests register their own copy of an example
descriptor under a fresh functionId and pipelineStateId (the same .so, so
the same digest), so each test has its own output stream starting at
sequence 1 and its own state. Nothing sleeps for timing: timers fire on a
watermark the test pushes, and the tail test waits for the CLI to exit.

Run (Debian's Python, which has grpcio for the harness):
  KEYFLOW_BUILD_DIR=build-clif PYENV_VERSION=system python3 -m unittest -v \
      tests/e2e/test_cli_functions.py
KEYFLOW_CLI_WRAPPER is an optional command prefix for every CLI run, e.g.
"valgrind -q --error-exitcode=99 --leak-check=full --errors-for-leak-kinds=definite":
besides memory errors, valgrind's thread scheduling makes stream races
that are rare natively show up nearly every time.
"""

import json
import os
import subprocess
import sys
import tempfile
import unittest
import uuid

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import harness  # noqa: E402

CLI_TIMEOUT_S = 60
# A tail's own deadline: well inside CLI_TIMEOUT_S, so that a tail that
# hangs fails with its DEADLINE_EXCEEDED message rather than being killed.
TAIL_TIMEOUT_MS = CLI_TIMEOUT_S * 1000 // 2
HANDLERS = os.path.join(harness.BUILD, "handlers")
RUNNING_SUM = os.path.join(HANDLERS, "running_sum.descriptor.json")
SESSION_COUNTER = os.path.join(HANDLERS, "session_counter.descriptor.json")
INT64_MAX = 2**63 - 1
CLI = os.environ.get("KEYFLOW_CLI_WRAPPER", "").split() + [harness.CLI]


def unique(prefix):
    return "%s-%s" % (prefix, uuid.uuid4().hex[:12])


def lines(*rows):
    """JSON lines: one object per line."""
    return "".join(json.dumps(r) + "\n" for r in rows)


class FunctionsTestCase(unittest.TestCase):
    server = None

    @classmethod
    def setUpClass(cls):
        for path in (harness.CLI, RUNNING_SUM, SESSION_COUNTER):
            if not os.path.exists(path):
                raise unittest.SkipTest("not built: %s" % path)
        # One partition: these tests model a function's output as one
        # sequence over all keys (harness.ONE_PARTITION says why).
        cls.server = harness.Keyflowd(args=harness.ONE_PARTITION + ["--plugin-dir", HANDLERS]).start()

    @classmethod
    def tearDownClass(cls):
        if cls.server is not None:
            cls.server.stop()
            cls.server.cleanup()

    # --- helpers ------------------------------------------------------------

    def env(self):
        env = dict(os.environ)
        env["KEYFLOW_ADDR"] = self.server.grpc_target
        return env

    def run_cli(self, *args, stdin=None, expect=0):
        """Runs the CLI; asserts its exit code; returns the CompletedProcess."""
        proc = subprocess.run(CLI + [str(a) for a in args], input=stdin,
                              capture_output=True, text=True, timeout=CLI_TIMEOUT_S,
                              env=self.env())
        self.assertEqual(proc.returncode, expect,
                         "keyflow %s exited %d\nstdout: %s\nstderr: %s\nserver log:\n%s"
                         % (" ".join(map(str, args)), proc.returncode, proc.stdout[-2000:],
                            proc.stderr, self.server.read_log()[-2000:]))
        return proc

    def json_lines(self, *args, stdin=None):
        """Runs the CLI expecting success; every stdout line is one JSON document."""
        proc = self.run_cli(*args, stdin=stdin)
        return [json.loads(line) for line in proc.stdout.splitlines()]

    def json_cli(self, *args, stdin=None):
        """Runs the CLI expecting success and exactly one JSON document."""
        docs = self.json_lines(*args, stdin=stdin)
        self.assertEqual(len(docs), 1, docs)
        return docs[0]

    def rpc_error(self, *args, code, field, stdin=None):
        """Runs the CLI expecting an RPC error with `code` whose message names `field`."""
        proc = self.run_cli(*args, stdin=stdin, expect=1)
        first = proc.stderr.splitlines()[0]
        prefix = "keyflow: %s: " % code
        self.assertTrue(first.startswith(prefix), proc.stderr)
        self.assertIn(field, first[len(prefix):])
        return proc

    def usage_error(self, *args, names, stdin=None):
        """Runs the CLI expecting a usage error (exit 2, nothing printed on
        stdout) whose message names every string in `names`."""
        proc = self.run_cli(*args, stdin=stdin, expect=2)
        self.assertEqual(proc.stdout, "")
        for name in names:
            self.assertIn(name, proc.stderr)
        return proc.stderr

    def descriptor(self, template=RUNNING_SUM, extra_fields=(), limits=None):
        """A copy of a built descriptor under a fresh functionId and
        pipelineStateId: (function_id, JSON text)."""
        with open(template) as f:
            desc = json.load(f)
        fid = unique(desc["functionId"])
        desc["functionId"] = fid
        desc["pipelineStateId"] = fid + ".v1"
        desc["inputSchema"]["fields"] += list(extra_fields)
        if limits is not None:
            desc["limits"] = limits
        return fid, json.dumps(desc)

    def register(self, template=RUNNING_SUM, extra_fields=(), limits=None):
        """Registers a fresh copy (through stdin) and returns its functionId."""
        fid, text = self.descriptor(template, extra_fields, limits)
        out = self.json_cli("functions", "register", "-", stdin=text)
        self.assertEqual(out["function"]["descriptor"]["functionId"], fid)
        self.assertFalse(out.get("alreadyRegistered", False))
        return fid

    def push(self, fid, seq, rows, *flags, producer="p1"):
        """Pushes JSON lines from stdin; returns the acknowledgements."""
        return self.json_lines("functions", "push", fid, "--producer", producer,
                               "--sequence", seq, *flags, stdin=lines(*rows))

    def push_one(self, fid, seq, rows, *flags, producer="p1"):
        acks = self.push(fid, seq, rows, *flags, producer=producer)
        self.assertEqual(len(acks), 1, acks)
        return acks[0]

    def output(self, fid, *flags):
        return self.json_cli("functions", "output", fid, *flags)

    def rows(self, fid):
        """Every output row, without "_seq" (checked by the paging test)."""
        page = self.output(fid, "--limit", 65536)
        return [{k: v for k, v in r.items() if k != "_seq"} for r in page.get("rows", [])]

    def state(self, fid, key):
        return self.json_cli("functions", "state", fid, key)

    def high_water(self, fid):
        return int(self.output(fid, "--limit", 1).get("highWaterSeq", "0"))


class TestRegister(FunctionsTestCase):
    def test_register_built_descriptor_twice_is_idempotent(self):
        first = self.json_cli("functions", "register", RUNNING_SUM)
        info = first["function"]
        self.assertFalse(first.get("alreadyRegistered", False))
        self.assertEqual(info["descriptor"]["functionId"], "running_sum")
        self.assertTrue(info["available"])
        # The canonical descriptor comes back with every default filled in.
        self.assertEqual(info["descriptor"]["limits"]["maxInputRows"], "4096")
        self.assertRegex(info["descriptorSha256"], "^[0-9a-f]{64}$")

        again = self.json_cli("functions", "register", RUNNING_SUM)
        self.assertTrue(again["alreadyRegistered"])
        self.assertEqual(again["function"]["descriptorSha256"], info["descriptorSha256"])
        self.assertEqual(again["function"]["createdMs"], info["createdMs"])

        got = self.json_cli("functions", "get", "running_sum")
        self.assertEqual(got["descriptorSha256"], info["descriptorSha256"])
        self.assertTrue(got["available"])

        # A different descriptor under the same functionId is refused.
        with open(RUNNING_SUM) as f:
            changed = json.load(f)
        changed["valueStateName"] = "total"
        self.rpc_error("functions", "register", "-", stdin=json.dumps(changed),
                       code="ALREADY_EXISTS", field="descriptor.function_id")
        self.assertEqual(self.json_cli("functions", "get", "running_sum")["descriptorSha256"],
                         info["descriptorSha256"])

    def test_bad_descriptor_files(self):
        fid, text = self.descriptor()
        with tempfile.TemporaryDirectory() as tmp:
            broken = os.path.join(tmp, "broken.json")
            with open(broken, "w") as f:
                f.write(text[:-5])
            err = self.usage_error("functions", "register", broken, names=[broken])
            self.assertIn("not valid JSON", err)

            typo = os.path.join(tmp, "typo.json")
            with open(typo, "w") as f:
                f.write(text.replace('"keyColumns"', '"keyColumn"'))
            self.usage_error("functions", "register", typo, names=[typo, "keyColumn"])

            missing = os.path.join(tmp, "missing.json")
            self.usage_error("functions", "register", missing, names=[missing])

            # Well-formed JSON that the server refuses: an RPC error.
            wrong = json.loads(text)
            wrong["version"] = 2
            self.rpc_error("functions", "register", "-", stdin=json.dumps(wrong),
                           code="INVALID_ARGUMENT", field="descriptor.version")
            wrong = json.loads(text)
            wrong["implementationDigest"] = "0" * 64
            self.rpc_error("functions", "register", "-", stdin=json.dumps(wrong),
                           code="FAILED_PRECONDITION", field="descriptor.implementation_digest")
        # None of them registered anything.
        self.rpc_error("functions", "get", fid, code="NOT_FOUND", field=fid)

    def test_list_pages_through_functions(self):
        ids = {self.register() for _ in range(3)}
        seen = []
        token = None
        for _ in range(100):
            args = ["functions", "list", "--page-size", 2]
            if token:
                args += ["--page-token", token]
            page = self.json_cli(*args)
            self.assertLessEqual(len(page.get("functions", [])), 2)
            seen += [f["descriptor"]["functionId"] for f in page.get("functions", [])]
            token = page.get("nextPageToken")
            if not token:
                break
        self.assertEqual(seen, sorted(seen))
        self.assertEqual(len(seen), len(set(seen)))
        self.assertTrue(ids <= set(seen), (ids, seen))
        self.rpc_error("functions", "list", "--page-size", 5000, code="INVALID_ARGUMENT",
                       field="page_size")


class TestPush(FunctionsTestCase):
    RESET = {"name": "reset", "type": "FIELD_TYPE_BOOL", "nullable": True}

    def test_state_absent_null_value_across_batches(self):
        fid = self.register(extra_fields=[self.RESET])
        self.assertEqual(self.state(fid, "alice")["state"], "STATE_KIND_ABSENT")
        ack = self.push_one(fid, 1, [
            {"user": "alice", "ts": 1, "amount": 5},
            {"user": "alice", "ts": 2, "amount": None},
            {"user": "alice", "ts": 3, "amount": 3},
            {"user": "bob", "ts": 4}])  # a missing value is a null too
        self.assertEqual(ack["rowsAccepted"], "4")
        self.assertEqual((ack["firstOutputSeq"], ack["lastOutputSeq"]), ("1", "4"))
        self.assertEqual(ack["sequence"], "1")
        self.assertEqual(self.state(fid, "alice"),
                         {"keyText": "alice", "state": "STATE_KIND_VALUE", "value": "3",
                          "valueStateName": "sum", "timers": []})
        self.assertEqual(self.state(fid, "bob")["state"], "STATE_KIND_NULL")

        # The state carries over to the next batch; a reset clears it (absent).
        self.push_one(fid, 2, [
            {"user": "alice", "ts": 5, "amount": 4},
            {"user": "bob", "ts": 6, "amount": 2},
            {"user": "alice", "ts": 7, "reset": True},
            {"user": "alice", "ts": 8, "amount": 1, "reset": None}])
        self.assertEqual(self.rows(fid), [
            {"key": "alice", "ts": "1", "sum": "5", "previous": "absent"},
            {"key": "alice", "ts": "2", "sum": None, "previous": "value"},
            {"key": "alice", "ts": "3", "sum": "3", "previous": "null"},
            {"key": "bob", "ts": "4", "sum": None, "previous": "absent"},
            {"key": "alice", "ts": "5", "sum": "7", "previous": "value"},
            {"key": "bob", "ts": "6", "sum": "2", "previous": "null"},
            {"key": "alice", "ts": "7", "sum": None, "previous": "value"},
            {"key": "alice", "ts": "8", "sum": "1", "previous": "absent"},
        ])
        self.assertEqual(self.state(fid, "alice")["value"], "1")
        self.assertEqual(self.state(fid, "bob")["value"], "2")
        self.assertEqual(self.state(fid, "carol")["state"], "STATE_KIND_ABSENT")
        info = self.json_cli("functions", "get", fid)
        self.assertEqual(info["outputSeq"], "8")
        self.assertEqual(info["keys"], "2")

    def test_json_rows_and_columnar_give_the_same_output(self):
        rows = [{"user": "u1", "ts": 10, "amount": 1},
                {"user": "u2", "ts": "11", "amount": "-4"},  # int64 as decimal strings
                {"user": "u1", "ts": 12, "amount": None},
                {"user": "u1", "ts": 13, "amount": INT64_MAX - 1},
                {"user": "u1", "ts": 14, "reset": True},
                {"user": "u2", "ts": 15, "amount": 9, "reset": False}]
        columnar = self.register(extra_fields=[self.RESET])
        as_json = self.register(extra_fields=[self.RESET])
        self.assertEqual(self.push_one(columnar, 1, rows)["rowsAccepted"], "6")
        self.assertEqual(self.push_one(as_json, 1, rows, "--json-rows")["rowsAccepted"], "6")
        out = self.rows(columnar)
        self.assertEqual(len(out), 6)
        self.assertEqual(out, self.rows(as_json))
        self.assertEqual([r["sum"] for r in out],
                         ["1", "-4", None, str(INT64_MAX - 1), None, "5"])
        self.assertEqual(out[1]["ts"], "11")

    def test_every_field_type_converts(self):
        fid = self.register(extra_fields=[
            {"name": "ratio", "type": "FIELD_TYPE_FLOAT64", "nullable": True},
            {"name": "blob", "type": "FIELD_TYPE_BYTES", "nullable": True},
            {"name": "flag", "type": "FIELD_TYPE_BOOL", "nullable": True},
            {"name": "note", "type": "FIELD_TYPE_UTF8", "nullable": True},
            {"name": "at", "type": "FIELD_TYPE_TIMESTAMP_US", "nullable": True}])
        good = [{"user": "héllo ✓", "ts": 1, "amount": 2, "ratio": 0.5, "blob": "AAEC/w==",
                 "flag": True, "note": "", "at": "-5"},
                {"user": "x", "ts": 2, "ratio": 3, "blob": "", "flag": False},
                {"user": "x", "ts": 3, "ratio": "NaN", "blob": "AAEC_w"},
                {"user": "x", "ts": 4, "ratio": "-Infinity", "note": None}]
        self.assertEqual(self.push_one(fid, 1, good)["rowsAccepted"], "4")
        self.assertEqual(self.rows(fid)[0]["key"], "héllo ✓")
        for field, value, expected in [("ratio", "half", "FLOAT64"),
                                       ("blob", "not base64!", "BYTES"),
                                       ("flag", 1, "BOOL"),
                                       ("note", 7, "UTF8"),
                                       ("at", 1.5, "TIMESTAMP_US"),
                                       ("amount", "12abc", "INT64"),
                                       ("amount", "", "INT64"),
                                       ("amount", [1], "INT64")]:
            row = {"user": "x", "ts": 5, field: value}
            err = self.usage_error("functions", "push", fid, "--producer", "p1",
                                   "--sequence", 2,
                                   stdin=lines({"user": "x", "ts": 5}, row),
                                   names=["line 2", field, expected])
            self.assertIn(json.dumps(value, separators=(",", ":")), err)
        self.assertEqual(self.high_water(fid), 4)

    def test_retry_of_an_acknowledged_sequence_changes_nothing(self):
        fid = self.register()
        first = self.push_one(fid, 7, [{"user": "a", "ts": 1, "amount": 10},
                                       {"user": "b", "ts": 2, "amount": 20}])
        self.assertFalse(first.get("duplicate", False))
        before_out = self.output(fid)
        before_a = self.state(fid, "a")

        retry = self.push_one(fid, 7, [{"user": "a", "ts": 1, "amount": 10},
                                       {"user": "b", "ts": 2, "amount": 20}])
        self.assertTrue(retry["duplicate"])
        del retry["duplicate"]
        self.assertEqual(retry, first)
        # The same rows sent as JSON are the same batch.
        as_json = self.push_one(fid, 7, [{"user": "a", "ts": 1, "amount": 10},
                                         {"user": "b", "ts": 2, "amount": 20}], "--json-rows")
        self.assertTrue(as_json["duplicate"])
        # A retry carrying other rows is a conflict, not a retry: refused
        # naming the sequence, nothing of it applied.
        self.rpc_error("functions", "push", fid, "--producer", "p1", "--sequence", 7,
                       "--json-rows", stdin=lines({"user": "a", "ts": 3, "amount": 99}),
                       code="ALREADY_EXISTS", field="sequence: 7")
        self.assertEqual(self.output(fid), before_out)
        self.assertEqual(self.state(fid, "a"), before_a)

        self.push_one(fid, 8, [{"user": "a", "ts": 4, "amount": 1}])
        self.assertEqual(self.state(fid, "a")["value"], "11")
        # An older acknowledged sequence is still recognised after a newer one.
        self.assertTrue(self.push_one(fid, 7, [{"user": "a", "ts": 1, "amount": 10},
                                               {"user": "b", "ts": 2, "amount": 20}])
                        ["duplicate"])
        self.assertEqual(self.state(fid, "a")["value"], "11")
        self.assertEqual(self.high_water(fid), 3)
        # Another producer has its own sequences.
        self.assertFalse(self.push_one(fid, 7, [{"user": "a", "ts": 5, "amount": 1}],
                                       producer="p2").get("duplicate", False))
        self.assertEqual(self.state(fid, "a")["value"], "12")

    def test_overflow_fails_the_batch_and_changes_nothing(self):
        fid = self.register()
        self.push_one(fid, 1, [{"user": "a", "ts": 1, "amount": INT64_MAX - 1}])
        before_out = self.output(fid, "--format", "columnar")
        before_info = self.json_cli("functions", "get", fid)
        proc = self.rpc_error("functions", "push", fid, "--producer", "p1", "--sequence", 2,
                              "--watermark-us", 1000,
                              stdin=lines({"user": "b", "ts": 2, "amount": 5},
                                          {"user": "a", "ts": 3, "amount": 1},
                                          {"user": "a", "ts": 4, "amount": 1}),
                              code="FAILED_PRECONDITION", field="overflow")
        self.assertIn("'a'", proc.stderr)
        self.assertEqual(proc.stdout, "")
        self.assertEqual(self.state(fid, "a")["value"], str(INT64_MAX - 1))
        self.assertEqual(self.state(fid, "b")["state"], "STATE_KIND_ABSENT")
        self.assertEqual(self.output(fid, "--format", "columnar"), before_out)
        after_info = self.json_cli("functions", "get", fid)
        self.assertEqual(after_info, before_info)
        self.assertNotIn("watermarkUs", after_info)  # the batch's watermark did not apply
        # The refused sequence was not consumed: it can carry good rows now.
        ack = self.push_one(fid, 2, [{"user": "b", "ts": 2, "amount": 5}])
        self.assertFalse(ack.get("duplicate", False))
        self.assertEqual(ack["firstOutputSeq"], "2")
        self.assertEqual(self.state(fid, "b")["value"], "5")

    def test_batch_rows_split_with_consecutive_sequences(self):
        fid = self.register()
        rows = [{"user": "k%d" % (i % 2), "ts": i, "amount": i} for i in range(1, 6)]
        acks = self.push(fid, 10, rows, "--batch-rows", 2, "--watermark-us", 100)
        self.assertEqual([a["sequence"] for a in acks], ["10", "11", "12"])
        self.assertEqual([a["rowsAccepted"] for a in acks], ["2", "2", "1"])
        self.assertEqual([(a["firstOutputSeq"], a["lastOutputSeq"]) for a in acks],
                         [("1", "2"), ("3", "4"), ("5", "5")])
        # The watermark travels with the last batch only.
        self.assertEqual([a.get("watermarkUs") for a in acks], [None, None, "100"])
        self.assertEqual([r["ts"] for r in self.rows(fid)], ["1", "2", "3", "4", "5"])
        self.assertEqual(self.state(fid, "k1")["value"], "9")
        # Rerunning the same push: every batch is a duplicate, nothing changes.
        again = self.push(fid, 10, rows, "--batch-rows", 2, "--watermark-us", 100)
        self.assertEqual([a.get("duplicate") for a in again], [True, True, True])
        self.assertEqual(self.high_water(fid), 5)

        # --json-rows splits the same way.
        acks = self.push(fid, 20, rows[:3], "--batch-rows", 2, "--json-rows")
        self.assertEqual([(a["sequence"], a["rowsAccepted"]) for a in acks],
                         [("20", "2"), ("21", "1")])

    def test_default_batch_size_is_the_functions_max_input_rows(self):
        fid = self.register(limits={"maxInputRows": 3})
        rows = [{"user": "u", "ts": i, "amount": 1} for i in range(7)]
        acks = self.push(fid, 1, rows)
        self.assertEqual([(a["sequence"], a["rowsAccepted"]) for a in acks],
                         [("1", "3"), ("2", "3"), ("3", "1")])
        self.assertEqual(self.state(fid, "u")["value"], "7")
        # Asking for more than the function takes is the server's refusal.
        self.rpc_error("functions", "push", fid, "--producer", "p1", "--sequence", 4,
                       "--batch-rows", 4, stdin=lines(*rows[:4]),
                       code="RESOURCE_EXHAUSTED", field="max_input_rows")

    def test_a_failed_batch_after_acknowledged_ones_is_reported(self):
        fid = self.register()
        proc = self.run_cli("functions", "push", fid, "--producer", "p1", "--sequence", 1,
                            "--batch-rows", 1,
                            stdin=lines({"user": "a", "ts": 1, "amount": 1},
                                        {"user": "a", "ts": 2, "amount": 2},
                                        {"user": "a", "ts": 3, "amount": INT64_MAX}),
                            expect=1)
        acks = [json.loads(line) for line in proc.stdout.splitlines()]
        self.assertEqual([a["sequence"] for a in acks], ["1", "2"])
        err = proc.stderr.splitlines()
        self.assertTrue(err[0].startswith("keyflow: FAILED_PRECONDITION: "), proc.stderr)
        self.assertIn("batch 3 of 3 (sequence 3, input lines 3..3)", err[1])
        self.assertIn("batches 1..2 (sequences 1..2) were acknowledged", err[1])
        self.assertEqual(self.state(fid, "a")["value"], "3")
        self.assertEqual(self.high_water(fid), 2)

    def test_session_counter_timers_fire_on_a_watermark_advance(self):
        fid = self.register(SESSION_COUNTER)
        ack = self.push_one(fid, 1, [{"user": "alice", "ts": 1000, "idle_us": 100},
                                     {"user": "alice", "ts": 1050, "idle_us": 100},
                                     {"user": "bob", "ts": 1000, "idle_us": 500}])
        self.assertNotIn("firstOutputSeq", ack)  # rows emit nothing
        alice = self.state(fid, "alice")
        self.assertEqual((alice["state"], alice["value"]), ("STATE_KIND_VALUE", "2"))
        self.assertEqual(alice["timers"], [{"name": "idle", "atUs": "1150"}])
        self.assertEqual(self.state(fid, "bob")["timers"], [{"name": "idle", "atUs": "1500"}])

        # A push of no rows that only advances the watermark fires alice's timer.
        ack = self.push_one(fid, 2, [], "--watermark-us", 1200)
        self.assertEqual(ack["watermarkUs"], "1200")
        self.assertEqual(ack["timerCallbacks"], "1")
        self.assertNotIn("rowsAccepted", ack)
        self.assertEqual(self.rows(fid), [{"key": "alice", "ts": "1150", "events": "2"}])
        self.assertEqual(self.state(fid, "alice")["state"], "STATE_KIND_ABSENT")
        self.assertEqual(self.state(fid, "alice")["timers"], [])  # lists are always there
        self.assertEqual(self.state(fid, "bob")["value"], "1")

        # Rows and a watermark in one push: the rows first, then the timers.
        ack = self.push_one(fid, 3, [{"user": "alice", "ts": 1300, "idle_us": 50}],
                            "--watermark-us", 2000)
        self.assertEqual(ack["timerCallbacks"], "2")
        self.assertEqual(self.rows(fid)[1:], [{"key": "alice", "ts": "1350", "events": "1"},
                                              {"key": "bob", "ts": "1500", "events": "1"}])
        # Watermarks never go back.
        self.assertEqual(self.push_one(fid, 4, [], "--watermark-us", 10)["watermarkUs"], "2000")
        self.assertEqual(self.json_cli("functions", "get", fid)["watermarkUs"], "2000")

    def test_bad_input_names_the_line_and_sends_nothing(self):
        fid = self.register()
        good = lines({"user": "a", "ts": 1, "amount": 1}, {"user": "a", "ts": 2, "amount": 2})
        args = ["functions", "push", fid, "--producer", "p1", "--sequence", 1,
                "--batch-rows", 1]
        with tempfile.NamedTemporaryFile("w", suffix=".jsonl") as f:
            f.write(good + "\n" + json.dumps({"user": "a", "ts": 3, "amout": 3}) + "\n")
            f.flush()
            # Line 4 (after a blank line 3): the unknown field, named with its line.
            self.usage_error(*args, "--file", f.name, names=[f.name, "line 4", "amout"])
        self.usage_error(*args, stdin=good + '{"user": "a", "ts": 3\n', names=["line 3",
                                                                            "not valid JSON"])
        self.usage_error(*args, stdin=good + "[1, 2]\n", names=["line 3", "JSON object"])
        self.usage_error(*args, stdin=good + '{"ts": 3}\n', names=["line 3", "user",
                                                                   "not nullable"])
        self.usage_error(*args, stdin=good + '{"user": "a", "ts": 1, "ts": 2}\n',
                         names=["line 3", "duplicate"])
        # No rows and no watermark: nothing to push (a sequence spent on an
        # empty batch would make a later push of it look like a retry).
        self.usage_error(*args, stdin="", names=["stdin", "no rows", "--watermark-us"])
        self.usage_error(*args, stdin="\n\n", names=["no rows"])
        # Nothing was sent, although the first lines alone were good batches.
        self.assertEqual(self.high_water(fid), 0)
        self.assertEqual(self.state(fid, "a")["state"], "STATE_KIND_ABSENT")
        self.assertNotIn("outputSeq", self.json_cli("functions", "get", fid))

        # With --json-rows the server converts, and names the field.
        self.rpc_error("functions", "push", fid, "--producer", "p1", "--sequence", 1,
                       "--json-rows", stdin=lines({"user": "a", "ts": 1, "amout": 1}),
                       code="INVALID_ARGUMENT", field="amout")
        self.rpc_error("functions", "push", "no-such-fn", "--producer", "p1", "--sequence", 1,
                       stdin=good, code="NOT_FOUND", field="no-such-fn")
        self.rpc_error("functions", "push", fid, "--producer", "p1", "--sequence", 0,
                       stdin=good, code="INVALID_ARGUMENT", field="sequence")
        self.assertEqual(self.high_water(fid), 0)

    def test_usage_errors_name_the_flag(self):
        fid = self.register()
        push = ["functions", "push", fid]
        self.usage_error(*push, "--sequence", 1, names=["--producer"])
        self.usage_error(*push, "--producer", "p", names=["--sequence"])
        self.usage_error(*push, "--producer", "p", "--sequence", "one", names=["--sequence"])
        self.usage_error(*push, "--producer", "p", "--sequence", 1, "--batch-rows", 0,
                         names=["--batch-rows"])
        self.usage_error(*push, "--producer", "p", "--sequence", 1, "--file", "/nonexistent/x",
                         names=["--file", "/nonexistent/x"])
        self.usage_error(*push, "--producer", "p", "--sequence", 1, "--bogus",
                         names=["--bogus"])
        self.usage_error("functions", "push", "--producer", "p", "--sequence", 1,
                         names=["missing argument"])
        self.usage_error("functions", "output", fid, "--format", "xml", names=["--format"])
        self.usage_error("functions", "tail", fid, "--count", 0, names=["--count"])
        self.usage_error("functions", "state", fid, names=["missing argument"])
        self.usage_error("functions", names=["register", "push", "tail"])
        self.usage_error("functions", "frobnicate", names=["frobnicate"])
        help_text = self.run_cli("functions", "--help").stdout
        for sub in ("register", "get", "list", "push", "output", "tail", "state"):
            self.assertRegex(help_text, r"\n  %s +\S" % sub)
        self.assertIn("--batch-rows N", self.run_cli("functions", "push", "--help").stdout)
        self.assertRegex(self.run_cli("--help").stdout, r"\n  functions +\S")

    def test_input_is_bounded(self):
        fid = self.register()
        with tempfile.NamedTemporaryFile(suffix=".jsonl") as f:
            f.truncate(64 * 1024 * 1024 + 1)
            f.flush()
            self.usage_error("functions", "push", fid, "--producer", "p", "--sequence", 1,
                             "--file", f.name, names=["--file", "larger than 67108864 bytes"])


class TestOutput(FunctionsTestCase):
    def test_output_pages_with_after_and_limit(self):
        fid = self.register()
        self.push(fid, 1, [{"user": "u", "ts": i, "amount": i} for i in range(1, 6)])
        page = self.output(fid, "--limit", 2)
        self.assertEqual([r["_seq"] for r in page["rows"]], ["1", "2"])
        self.assertEqual((page["firstSeq"], page["lastSeq"]), ("1", "2"))
        self.assertEqual(page["nextAfterSeq"], "2")
        self.assertEqual(page["highWaterSeq"], "5")
        seen = []
        after = 0
        for _ in range(10):
            page = self.output(fid, "--after", after, "--limit", 2)
            if not page.get("rows"):
                break
            seen += [int(r["_seq"]) for r in page["rows"]]
            after = int(page["nextAfterSeq"])
        self.assertEqual(seen, [1, 2, 3, 4, 5])
        self.assertEqual(after, 5)
        self.assertEqual([r["sum"] for r in self.output(fid, "--after", 3)["rows"]],
                         ["10", "15"])

        columnar = self.output(fid, "--after", 1, "--limit", 3, "--format", "columnar")
        self.assertNotIn("rows", columnar)
        self.assertEqual(columnar["batch"]["rowCount"], "3")
        self.assertEqual((columnar["firstSeq"], columnar["lastSeq"]), ("2", "4"))
        self.assertEqual(columnar["batch"]["columns"][2]["int64s"]["values"], ["3", "6", "10"])

        empty = self.output(fid, "--after", 5)
        self.assertEqual(empty["rows"], [], "an empty page is [] like any list")
        self.assertEqual(empty["highWaterSeq"], "5")
        self.rpc_error("functions", "output", fid, "--limit", 70000, code="INVALID_ARGUMENT",
                       field="limit")
        self.rpc_error("functions", "output", "no-such-fn", code="NOT_FOUND",
                       field="no-such-fn")

    def test_tail_streams_rows_pushed_after_it_started(self):
        fid = self.register()
        self.push(fid, 1, [{"user": "old", "ts": 1, "amount": 1}])
        high = self.high_water(fid)
        self.assertEqual(high, 1)
        tail = subprocess.Popen(
            CLI + ["functions", "tail", fid, "--after", str(high), "--count", "1",
             "--timeout-ms", str(TAIL_TIMEOUT_MS)],
            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=self.env())
        try:
            # Nothing after `high` exists yet, so the tail cannot have ended.
            self.assertIsNone(tail.poll())
            self.push(fid, 2, [{"user": "new", "ts": 2, "amount": 5},
                               {"user": "new", "ts": 3, "amount": 6}])
            out, err = tail.communicate(timeout=CLI_TIMEOUT_S)
        finally:
            if tail.poll() is None:
                tail.kill()
                tail.communicate()
        self.assertEqual(tail.returncode, 0, err)
        pages = [json.loads(line) for line in out.splitlines()]
        self.assertEqual(len(pages), 1, out)
        self.assertEqual(pages[0]["firstSeq"], "2")
        self.assertEqual([(r["_seq"], r["key"], r["sum"]) for r in pages[0]["rows"]],
                         [("2", "new", "5"), ("3", "new", "11")])

    def test_tail_pages_and_count(self):
        fid = self.register()
        tail = subprocess.Popen(
            CLI + ["functions", "tail", fid, "--max-rows", "1", "--count", "3",
             "--timeout-ms", str(TAIL_TIMEOUT_MS)],
            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=self.env())
        try:
            self.push(fid, 1, [{"user": "a", "ts": 1, "amount": 1}])
            self.push(fid, 2, [{"user": "a", "ts": 2, "amount": 2},
                               {"user": "b", "ts": 3, "amount": 3},
                               {"user": "b", "ts": 4, "amount": 4}])
            out, err = tail.communicate(timeout=CLI_TIMEOUT_S)
        finally:
            if tail.poll() is None:
                tail.kill()
                tail.communicate()
        self.assertEqual(tail.returncode, 0, err)
        pages = [json.loads(line) for line in out.splitlines()]
        # --max-rows 1: one row per page, in order; --count 3 stops after three.
        self.assertEqual([[r["_seq"] for r in p["rows"]] for p in pages],
                         [["1"], ["2"], ["3"]])
        columnar = self.json_lines("functions", "tail", fid, "--after", 2, "--count", 1,
                                   "--format", "columnar")
        self.assertEqual(columnar[0]["batch"]["rowCount"], "2")
        self.assertEqual(columnar[0]["firstSeq"], "3")

    def test_tail_reads_pages_already_written(self):
        # Pages that are all buffered before the client asks for them: a
        # client that mistook one page's arrival for the end of the stream
        # would wait for a status that never comes (and hit --timeout-ms).
        fid = self.register()
        self.push(fid, 1, [{"user": "u%d" % (i % 3), "ts": i, "amount": i}
                           for i in range(1, 41)])
        for _ in range(3):
            pages = self.json_lines("functions", "tail", fid, "--max-rows", 1, "--count", 40,
                                    "--timeout-ms", TAIL_TIMEOUT_MS)
            self.assertEqual([p["rows"][0]["_seq"] for p in pages],
                             [str(i) for i in range(1, 41)])
            self.assertEqual({len(p["rows"]) for p in pages}, {1})

    def test_tail_errors(self):
        self.rpc_error("functions", "tail", "no-such-fn", "--count", 1, code="NOT_FOUND",
                       field="no-such-fn")
        fid = self.register()
        self.rpc_error("functions", "tail", fid, "--max-rows", -1, "--count", 1,
                       code="INVALID_ARGUMENT", field="max_rows_per_message")
        # --timeout-ms bounds the whole stream.
        self.rpc_error("functions", "tail", fid, "--timeout-ms", 200,
                       code="DEADLINE_EXCEEDED", field="")

    def test_state_of_unknown_function_and_several_key_columns(self):
        self.rpc_error("functions", "state", "no-such-fn", "k", code="NOT_FOUND",
                       field="no-such-fn")
        self.rpc_error("functions", "get", "no-such-fn", code="NOT_FOUND", field="no-such-fn")
        fid, text = self.descriptor(
            extra_fields=[{"name": "region", "type": "FIELD_TYPE_UTF8"}])
        desc = json.loads(text)
        desc["keyColumns"] = ["user", "region"]
        self.json_cli("functions", "register", "-", stdin=json.dumps(desc))
        self.push(fid, 1, [{"user": "a", "region": "eu", "ts": 1, "amount": 2},
                           {"user": "a", "region": "us", "ts": 2, "amount": 3},
                           {"user": "a", "region": "eu", "ts": 3, "amount": 4}])
        self.assertEqual(self.state(fid, '["a", "eu"]')["value"], "6")
        self.assertEqual(self.state(fid, '["a", "us"]')["value"], "3")
        self.assertEqual(self.state(fid, '["a", "ap"]')["state"], "STATE_KIND_ABSENT")
        self.rpc_error("functions", "state", fid, "a", code="INVALID_ARGUMENT", field="key")


if __name__ == "__main__":
    unittest.main()
