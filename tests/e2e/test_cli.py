"""End-to-end tests of the `keyflow` CLI against the real keyflowd.

Every interaction goes through the CLI binary (harness.CLI); the server is
started once for the module on 127.0.0.1 port 0. Each test uses its own
workflow name, so tests do not see each other's runs. Nothing sleeps for
timing: windows are closed with flush or a full batch, and where a window
must close on its own it is 50 ms long and a long poll waits for the run.

Run (Debian's Python, which has grpcio for the harness):
  KEYFLOW_BUILD_DIR=build-cli PYENV_VERSION=system python3 -m unittest \
      discover -s tests/e2e -p 'test_cli.py' -v
"""

import json
import os
import re
import subprocess
import sys
import tempfile
import time
import unittest
import uuid

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import harness  # noqa: E402

UUID_RE = re.compile(r"^[0-9a-f]{8}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{12}$")
CLI_TIMEOUT_S = 60


def unique(prefix):
    return "%s-%s" % (prefix, uuid.uuid4().hex[:12])


class CliTestCase(unittest.TestCase):
    """One keyflowd for every class of the test module (each test uses its
    own workflow), stopped when the module is done."""
    server = None

    @classmethod
    def setUpClass(cls):
        if not os.path.exists(harness.CLI):
            raise unittest.SkipTest("CLI not built: %s" % harness.CLI)
        if CliTestCase.server is None:
            CliTestCase.server = harness.Keyflowd().start()
            unittest.addModuleCleanup(CliTestCase.stop_server)

    @staticmethod
    def stop_server():
        server, CliTestCase.server = CliTestCase.server, None
        server.stop()
        server.cleanup()

    # --- helpers ------------------------------------------------------------

    def run_cli(self, *args, stdin=None, expect=0, addr=True):
        """Runs the CLI; asserts its exit code; returns the CompletedProcess."""
        env = dict(os.environ)
        env.pop("KEYFLOW_ADDR", None)
        if addr:
            env["KEYFLOW_ADDR"] = self.server.grpc_target
        proc = subprocess.run([harness.CLI] + [str(a) for a in args], input=stdin,
                              capture_output=True, text=True, timeout=CLI_TIMEOUT_S, env=env)
        self.assertEqual(proc.returncode, expect,
                         "keyflow %s exited %d\nstdout: %s\nstderr: %s\nserver log:\n%s"
                         % (" ".join(map(str, args)), proc.returncode, proc.stdout, proc.stderr,
                            self.server.read_log()[-2000:]))
        return proc

    def json_cli(self, *args, stdin=None):
        """Runs the CLI expecting success and exactly one JSON document."""
        proc = self.run_cli(*args, stdin=stdin)
        lines = proc.stdout.splitlines()
        self.assertEqual(len(lines), 1, "expected one JSON line, got %r" % proc.stdout)
        return json.loads(lines[0])

    def rpc_error(self, *args, code, field):
        """Runs the CLI expecting an RPC error with `code` naming `field`."""
        proc = self.run_cli(*args, expect=1)
        self.assertEqual(proc.stdout, "")
        prefix = "keyflow: %s: " % code
        self.assertTrue(proc.stderr.startswith(prefix), proc.stderr)
        message = proc.stderr[len(prefix):].strip()
        self.assertIn(field, message)
        return message

    def usage_error(self, *args, flag, stdin=None):
        proc = self.run_cli(*args, expect=2, stdin=stdin)
        self.assertEqual(proc.stdout, "")
        self.assertIn(flag, proc.stderr)
        return proc.stderr

    def send(self, workflow, key, *rule, input=None, event_id=None):
        args = ["send", "--workflow", workflow, "--key", key] + list(rule)
        if input is not None:
            args += ["--input", json.dumps(input)]
        if event_id is not None:
            args += ["--id", event_id]
        return self.json_cli(*args)

    def poll_one(self, workflow, worker="w1", wait_ms=10000, lease_ms=None):
        args = ["poll", "--worker", worker, "--workflow", workflow, "--wait-ms", wait_ms]
        if lease_ms is not None:
            args += ["--lease-ms", lease_ms]
        out = self.json_cli(*args)
        runs = out.get("runs", [])
        self.assertEqual(len(runs), 1, out)
        return runs[0]

    def describe(self, kind, workflow, key):
        return self.json_cli("describe", "--kind", kind, "--workflow", workflow, "--key", key)

    def list_ids(self, *filters):
        out = self.json_cli("list", *filters)
        return [r["runId"] for r in out.get("runs", [])]

    def check_run_id(self, run_id, key):
        self.assertTrue(run_id.startswith(key + "@"), run_id)
        self.assertRegex(run_id[len(key) + 1:], UUID_RE)


class TestUsage(CliTestCase):
    def test_help_lists_every_command(self):
        out = self.run_cli("--help").stdout
        for cmd in ("send", "describe", "flush", "cancel", "poll", "heartbeat", "complete",
                    "get", "list", "health", "work", "call"):
            self.assertRegex(out, r"\n  %s +\S" % cmd)
        send_help = self.run_cli("send", "--help").stdout
        self.assertIn("--window-ms N", send_help)
        self.assertIn("--max-events N", send_help)
        call_help = self.run_cli("call", "--help").stdout
        self.assertIn("/keyflow.v1.Coordinators/SendEvent", call_help)
        self.assertIn("/keyflow.v1.Runs/ListRuns", call_help)

    def test_usage_errors_name_the_flag(self):
        wf = unique("usage")
        self.usage_error("send", "--workflow", wf, "--key", "k", "--batch", "--bogus",
                         flag="--bogus")
        self.usage_error("send", "--workflow", wf, "--key", "k", "--batch", "--max-events",
                         "ten", flag="--max-events")
        self.usage_error("send", "--workflow", wf, "--key", "k", "--batch", "--max-events",
                         "99999999999999999999", flag="--max-events")
        self.usage_error("send", "--workflow", wf, "--key", "k", "--batch", "--max-events",
                         "3x", flag="--max-events")
        self.usage_error("send", "--workflow", wf, "--key", "k", "--batch", "--max-events",
                         "", flag="--max-events")
        self.usage_error("send", "--workflow", wf, "--key", "k", flag="--debounce")
        self.usage_error("send", "--workflow", wf, "--batch", flag="--key")
        self.usage_error("send", "--workflow", wf, "--key", "k", "--batch", "--window-ms",
                         flag="--window-ms")
        self.usage_error("send", "--workflow", wf, "--key", "k", "--batch", "--input", "1",
                         "--input-file", "/dev/null", flag="--input-file")
        self.usage_error("send", "--workflow", wf, "--workflow", wf, "--key", "k", "--batch",
                         flag="--workflow")
        self.usage_error("describe", "--kind", "sometimes", "--workflow", wf, "--key", "k",
                         flag="--kind")
        self.usage_error("list", "--status", "done", flag="--status")
        self.usage_error("complete", "r@x", "--lease", "l", flag="--result")
        self.usage_error("work", "--worker", "w", "--workflow", wf, "--once", flag="after '--'")
        self.usage_error("work", "--worker", "w", "--workflow", wf, "--lease-ms", "5", "--",
                         "true", flag="--lease-ms")
        self.usage_error("--timeout-ms", "0", "health", flag="--timeout-ms")
        self.run_cli("frobnicate", expect=2)
        self.run_cli(expect=2)
        # Nothing reached the server: no run, no coordinator of that workflow.
        self.assertEqual(self.list_ids("--workflow", wf), [])

    def test_input_file_is_bounded(self):
        with tempfile.NamedTemporaryFile(suffix=".json") as f:
            f.truncate(16 * 1024 * 1024 + 1)
            f.flush()
            err = self.usage_error("send", "--workflow", unique("big"), "--key", "k", "--batch",
                                   "--input-file", f.name, flag="--input-file")
            self.assertIn("larger than 16777216 bytes", err)


class TestCoordinators(CliTestCase):
    def test_debounce_receipt_describe_and_cancel(self):
        wf, key = unique("deb"), "user-1"
        before_ms = int(time.time() * 1000)
        first = self.send(wf, key, "--debounce", "--window-ms", 60000, input={"v": 1})
        after_ms = int(time.time() * 1000)
        receipt = first["receipt"]
        self.check_run_id(receipt["runId"], key)
        self.assertIsInstance(receipt["dueMs"], str)  # int64 travels as a JSON string
        self.assertGreaterEqual(int(receipt["dueMs"]), before_ms + 60000)
        self.assertLessEqual(int(receipt["dueMs"]), after_ms + 60000)
        self.assertFalse(first.get("duplicate", False))
        self.assertFalse(first.get("runStarted", False))

        second = self.send(wf, key, "--debounce", "--window-ms", 60000, input={"v": 2})
        self.assertEqual(second["receipt"]["runId"], receipt["runId"])
        self.assertGreaterEqual(int(second["receipt"]["dueMs"]), int(receipt["dueMs"]))

        desc = self.describe("debounce", wf, key)
        self.assertTrue(desc["exists"])
        self.assertEqual(desc["coordinator"]["workflow"], wf)
        self.assertEqual(desc["coordinator"]["key"], key)
        window = desc["window"]
        self.assertEqual(window["runId"], receipt["runId"])
        self.assertEqual(window["eventCount"], "2")
        self.assertEqual(window["dueMs"], second["receipt"]["dueMs"])
        self.assertEqual(window["rule"]["windowMs"], "60000")
        # The batch coordinator of the same (workflow, key) is a different one.
        self.assertNotIn("window", self.describe("batch", wf, key))

        cancelled = self.json_cli("cancel", "--kind", "debounce", "--workflow", wf, "--key", key)
        self.assertTrue(cancelled["cancelled"])
        self.assertEqual(cancelled["runId"], receipt["runId"])
        self.assertEqual(cancelled["eventsDropped"], "2")
        self.assertNotIn("window", self.describe("debounce", wf, key))
        again = self.json_cli("cancel", "--kind", "debounce", "--workflow", wf, "--key", key)
        self.assertFalse(again.get("cancelled", False))
        # The cancelled run never exists.
        self.rpc_error("get", receipt["runId"], code="NOT_FOUND", field="run_id")
        self.assertEqual(self.list_ids("--workflow", wf), [])

    def test_dedup_retry_returns_the_first_receipt(self):
        wf, key = unique("dedup"), "order-7"
        first = self.send(wf, key, "--batch", "--max-events", 10, "--max-wait-ms", 60000,
                          input={"n": 1}, event_id="e-1")
        self.assertFalse(first.get("duplicate", False))
        retry = self.send(wf, key, "--batch", "--max-events", 10, "--max-wait-ms", 60000,
                          input={"n": 1}, event_id="e-1")
        self.assertTrue(retry["duplicate"])
        self.assertEqual(retry["receipt"], first["receipt"])
        other = self.send(wf, key, "--batch", "--max-events", 10, "--max-wait-ms", 60000,
                          input={"n": 2}, event_id="e-2")
        self.assertFalse(other.get("duplicate", False))
        self.assertEqual(other["receipt"]["runId"], first["receipt"]["runId"])
        # The retry added nothing: two events, not three.
        desc = self.describe("batch", wf, key)
        self.assertEqual(desc["window"]["eventCount"], "2")
        self.assertEqual(sorted(r["id"] for r in desc["rememberedIds"]), ["e-1", "e-2"])
        self.assertEqual(first["disposition"], "DISPOSITION_OPENED")
        self.assertEqual(retry["disposition"], "DISPOSITION_DUPLICATE")
        self.assertEqual(other["disposition"], "DISPOSITION_JOINED")
        # The ID with another input is refused, naming the ID.
        self.rpc_error("send", "--workflow", wf, "--key", key, "--batch", "--max-events", 10,
                       "--max-wait-ms", 60000, "--input", '{"n": 9}', "--id", "e-1",
                       code="ALREADY_EXISTS", field="event.id")

    def test_send_many_sends_json_lines_in_calls_of_batch_events(self):
        wf = unique("many")
        rule = {"kind": "batch", "maxEvents": 100, "maxWaitMs": 60000}
        lines = [json.dumps({"key": "k%d" % (i % 2), "event": {"id": "e-%d" % i, "rule": rule, "input": i}})
                 for i in range(5)]
        text = "\n".join(lines[:3]) + "\n\n" + "\n".join(lines[3:]) + "\n"
        out = self.run_cli("send-many", "--workflow", wf, "--batch-events", 2, stdin=text).stdout
        results = [json.loads(line) for line in out.splitlines()]
        self.assertEqual([r["response"]["disposition"] for r in results],
                         ["DISPOSITION_OPENED", "DISPOSITION_OPENED"] + ["DISPOSITION_JOINED"] * 3)
        seqs = [int(r["response"]["receipt"]["commitSeq"]) for r in results]
        # One call, one write per partition (commit_seq mod 8 names it,
        # docs/semantics.md): k0 and k1 share it when they share a partition.
        if seqs[0] % 8 == seqs[1] % 8:
            self.assertEqual(seqs[0], seqs[1], "one call, one write")
        else:
            self.assertNotEqual(seqs[0], seqs[1])
        self.assertLess(seqs[0], seqs[2], "k0's second call is a later write")
        self.assertLess(seqs[1], seqs[3], "k1's second call is a later write")
        self.assertEqual(self.describe("batch", wf, "k0")["window"]["eventCount"], "3")
        # A refused event is a result line of its own; the exit code says so.
        again = "\n".join([lines[0], json.dumps({"key": "k0", "event": {"id": "e-0", "rule": rule,
                                                                         "input": "other"}})])
        proc = self.run_cli("send-many", "--workflow", wf, stdin=again, expect=1)
        results = [json.loads(line) for line in proc.stdout.splitlines()]
        self.assertEqual(results[0]["response"]["disposition"], "DISPOSITION_DUPLICATE")
        self.assertEqual(results[1]["error"]["status"], "ALREADY_EXISTS")
        self.assertIn("1 of 2 events were refused", proc.stderr)
        # A line that is not an event: nothing is sent.
        bad = lines[0] + "\n" + '{"key": "k9", "event": {"rule": {"maxEvents": "x"}}}\n'
        err = self.usage_error("send-many", "--workflow", wf, stdin=bad, flag="line 2")
        self.assertIn("maxEvents", err)
        self.assertFalse(self.describe("batch", wf, "k9").get("exists", False))

    def test_edge_flush_and_max_bytes_flags(self):
        wf = unique("edges")
        lead = self.send(wf, "l", "--debounce", "--window-ms", 60000, "--edge", "leading", input=1)
        self.assertEqual(lead["disposition"], "DISPOSITION_CLOSED")
        self.assertEqual(self.poll_one(wf)["runId"], lead["receipt"]["runId"])
        absorbed = self.send(wf, "l", "--debounce", "--window-ms", 60000, "--edge", "LEADING", input=2)
        self.assertEqual(absorbed["disposition"], "DISPOSITION_JOINED")
        self.assertEqual(self.describe("debounce", wf, "l")["window"]["rule"]["edge"], "EDGE_LEADING")
        self.usage_error("send", "--workflow", wf, "--key", "l", "--debounce", "--window-ms", 5,
                         "--edge", "middle", flag="--edge")
        self.send(wf, "b", "--batch", "--max-events", 10, "--max-bytes", 10, input=1234)
        flushed = self.send(wf, "b", "--batch", "--max-events", 10, "--max-bytes", 10, "--flush",
                            input=567)
        self.assertEqual(flushed["disposition"], "DISPOSITION_CLOSED")
        self.assertEqual(self.poll_one(wf)["input"], [1234, 567])
        self.rpc_error("send", "--workflow", wf, "--key", "b", "--batch", "--max-bytes", 10,
                       "--input", "123456789", code="INVALID_ARGUMENT", field="event.rule.max_bytes")
        flush = self.json_cli("flush", "--kind", "batch", "--workflow", wf, "--key", "b")
        self.assertEqual(flush, {"disposition": "DISPOSITION_NO_WINDOW"})

    def test_batch_fires_on_the_third_event_and_the_run_completes(self):
        wf, key = unique("batch"), "acct-3"
        inputs = [{"n": 1}, [2, "two"], "three"]
        receipts = []
        for i, value in enumerate(inputs):
            out = self.send(wf, key, "--batch", "--max-events", 3, "--max-wait-ms", 600000,
                            input=value)
            receipts.append(out)
            self.assertEqual(out.get("runStarted", False), i == 2, out)
        run_id = receipts[0]["receipt"]["runId"]
        self.check_run_id(run_id, key)
        self.assertEqual({r["receipt"]["runId"] for r in receipts}, {run_id})
        self.assertNotIn("window", self.describe("batch", wf, key))

        pending = self.json_cli("get", run_id)
        self.assertEqual(pending["status"], "RUN_STATUS_PENDING")
        self.assertEqual(pending["input"], inputs)
        self.assertEqual(self.list_ids("--workflow", wf, "--status", "pending"), [run_id])

        run = self.poll_one(wf, worker="worker-a")
        self.assertEqual(run["runId"], run_id)
        self.assertEqual(run["workflow"], wf)
        self.assertEqual(run["key"], key)
        self.assertEqual(run["kind"], "RULE_KIND_BATCH")
        self.assertEqual(run["input"], inputs)
        self.assertEqual(run["eventCount"], "3")
        self.assertEqual(run["status"], "RUN_STATUS_LEASED")
        self.assertEqual(run["attempts"], "1")
        self.assertEqual(run["workerId"], "worker-a")
        self.assertRegex(run["lease"], UUID_RE)
        self.assertEqual(self.list_ids("--workflow", wf, "--status", "leased"), [run_id])
        self.assertEqual(self.list_ids("--workflow", wf, "--status", "pending"), [])

        beat = self.json_cli("heartbeat", run_id, "--lease", run["lease"], "--lease-ms", 120000)
        self.assertGreater(int(beat["leaseExpiresMs"]), int(run["leaseExpiresMs"]))

        done = self.json_cli("complete", run_id, "--lease", run["lease"],
                             "--result", '{"sum": 6, "ok": true}')
        self.assertEqual(done["run"]["status"], "RUN_STATUS_COMPLETED")
        self.assertFalse(done.get("alreadyFinished", False))
        got = self.json_cli("get", run_id)
        self.assertEqual(got["status"], "RUN_STATUS_COMPLETED")
        self.assertEqual(got["result"], {"sum": 6, "ok": True})
        self.assertEqual(got["attempts"], "1")
        self.assertEqual(self.list_ids("--workflow", wf, "--status", "completed"), [run_id])
        self.assertEqual(self.list_ids("--workflow", wf, "--status", "leased"), [])
        self.assertEqual(self.list_ids("--workflow", wf, "--status", "failed"), [])
        # A retry of the same completion is recognised, not applied twice.
        retry = self.json_cli("complete", run_id, "--lease", run["lease"],
                              "--result", '{"sum": 6, "ok": true}')
        self.assertTrue(retry["alreadyFinished"])
        # Nothing more to lease for this workflow.
        empty = self.json_cli("poll", "--worker", "worker-a", "--workflow", wf)
        self.assertEqual(empty.get("runs", []), [])

    def test_flush_starts_the_run_with_the_latest_input(self):
        wf, key = unique("flush"), "doc-9"
        self.send(wf, key, "--debounce", "--window-ms", 600000, input={"rev": 1})
        sent = self.send(wf, key, "--debounce", "--window-ms", 600000, input={"rev": 2})
        flushed = self.json_cli("flush", "--kind", "debounce", "--workflow", wf, "--key", key)
        self.assertTrue(flushed["flushed"])
        self.assertEqual(flushed["runId"], sent["receipt"]["runId"])
        self.assertNotIn("window", self.describe("debounce", wf, key))
        again = self.json_cli("flush", "--kind", "debounce", "--workflow", wf, "--key", key)
        self.assertFalse(again.get("flushed", False))

        run = self.poll_one(wf)
        self.assertEqual(run["runId"], flushed["runId"])
        self.assertEqual(run["input"], {"rev": 2})
        self.assertEqual(run["kind"], "RULE_KIND_DEBOUNCE")
        failed = self.json_cli("complete", run["runId"], "--lease", run["lease"],
                               "--error", "boom: disk full")
        self.assertEqual(failed["run"]["status"], "RUN_STATUS_FAILED")
        got = self.json_cli("get", run["runId"])
        self.assertEqual(got["status"], "RUN_STATUS_FAILED")
        self.assertEqual(got["error"], "boom: disk full")
        self.assertEqual(self.list_ids("--workflow", wf, "--status", "failed"), [run["runId"]])
        self.assertEqual(self.list_ids("--workflow", wf, "--status", "completed"), [])

    def test_short_debounce_window_closes_by_itself(self):
        # One event: two CLI processes in a row may take longer than 50 ms,
        # so collapsing is tested with long windows (flush, describe) instead.
        wf, key = unique("tiny"), "k"
        sent = self.send(wf, key, "--debounce", "--window-ms", 50, input={"late": True})
        self.assertFalse(sent.get("runStarted", False))
        # The long poll returns as soon as the window has closed.
        run = self.poll_one(wf, wait_ms=20000)
        self.assertEqual(run["runId"], sent["receipt"]["runId"])
        self.assertEqual(run["input"], {"late": True})
        self.assertEqual(run["eventCount"], "1")
        self.assertGreaterEqual(int(run["createdMs"]), int(sent["receipt"]["dueMs"]))
        self.assertNotIn("window", self.describe("debounce", wf, key))

    def test_input_from_file_and_stdin(self):
        wf = unique("files")
        with tempfile.NamedTemporaryFile("w", suffix=".json") as f:
            json.dump({"from": "file", "list": [1, 2, 3]}, f)
            f.flush()
            self.json_cli("send", "--workflow", wf, "--key", "a", "--batch", "--max-events", 1,
                          "--input-file", f.name)
        self.json_cli("send", "--workflow", wf, "--key", "b", "--batch", "--max-events", 1,
                      "--input-file", "-", stdin='{"from": "stdin"}\n')
        inputs = {}
        for _ in range(2):
            run = self.poll_one(wf)
            inputs[run["key"]] = run["input"]
        # A batch run's input is the array of its events' inputs.
        self.assertEqual(inputs, {"a": [{"from": "file", "list": [1, 2, 3]}],
                                  "b": [{"from": "stdin"}]})

    def test_bad_requests_are_invalid_argument_naming_the_field(self):
        wf = unique("bad")
        msg = self.rpc_error("send", "--workflow", wf, "--key", "", "--batch",
                             code="INVALID_ARGUMENT", field="key")
        self.assertTrue(msg.startswith("key:"), msg)
        msg = self.rpc_error("send", "--workflow", wf, "--key", "k", "--batch", "--max-events", 0,
                             code="INVALID_ARGUMENT", field="event.rule.max_events")
        self.assertIn("got 0", msg)
        self.rpc_error("send", "--workflow", wf, "--key", "k", "--batch", "--input", "{nope",
                       code="INVALID_ARGUMENT", field="event.input")
        self.rpc_error("send", "--workflow", wf, "--key", "k", "--debounce",
                       code="INVALID_ARGUMENT", field="event.rule.window_ms")
        self.rpc_error("send", "--workflow", wf, "--key", "k", "--batch", "--window-ms", 5,
                       code="INVALID_ARGUMENT", field="event.rule.window_ms")
        self.rpc_error("get", "nobody@" + str(uuid.uuid4()), code="NOT_FOUND", field="run_id")
        self.rpc_error("complete", "nobody@x", "--lease", "short", "--result", "1",
                       code="INVALID_ARGUMENT", field="lease")
        # None of them left anything behind.
        self.assertNotIn("window", self.describe("batch", wf, "k"))
        self.assertEqual(self.list_ids("--workflow", wf), [])


class TestListAndCall(CliTestCase):
    def test_list_pages_through_runs(self):
        wf = unique("pages")
        ids = set()
        for i in range(3):
            out = self.send(wf, "k%d" % i, "--batch", "--max-events", 1, input=i)
            self.assertTrue(out["runStarted"])
            ids.add(out["receipt"]["runId"])
        seen = []
        token = None
        for _ in range(10):
            args = ["list", "--workflow", wf, "--page-size", 2]
            if token:
                args += ["--page-token", token]
            page = self.json_cli(*args)
            self.assertLessEqual(len(page.get("runs", [])), 2)
            seen += [r["runId"] for r in page.get("runs", [])]
            token = page.get("nextPageToken")
            if not token:
                break
        self.assertEqual(sorted(seen), sorted(ids))
        self.rpc_error("list", "--page-token", "not-a-token", code="INVALID_ARGUMENT",
                       field="page_token")

    def test_call_any_method_with_json(self):
        wf, key = unique("call"), "c1"
        sent = self.json_cli("call", "/keyflow.v1.Coordinators/SendEvent", json.dumps({
            "workflow": wf, "key": key,
            "event": {"id": "e-1", "rule": {"kind": "batch", "maxEvents": 1}, "input": {"a": 1}}}))
        self.assertTrue(sent["runStarted"])
        run_id = sent["receipt"]["runId"]
        self.check_run_id(run_id, key)
        # Without JSON the request comes from stdin.
        got = self.json_cli("call", "/keyflow.v1.Runs/GetRun", stdin=json.dumps({"runId": run_id}))
        self.assertEqual(got["runId"], run_id)
        self.assertEqual(got["input"], [{"a": 1}])
        self.assertEqual(self.json_cli("get", run_id), got)
        health = self.json_cli("call", "/grpc.health.v1.Health/Check", "{}")
        self.assertEqual(health, {"status": "SERVING"})
        self.usage_error("call", "/keyflow.v1.Nope/Nope", "{}", flag="/keyflow.v1.Nope/Nope")
        self.usage_error("call", "/grpc.health.v1.Health/Watch", "{}", flag="Watch")
        self.usage_error("call", "/keyflow.v1.Functions/TailOutput", "{}", flag="TailOutput")
        self.usage_error("call", "/keyflow.v1.Runs/GetRun", '{"runIdd": "x"}', flag="runIdd")
        self.rpc_error("call", "/keyflow.v1.Runs/GetRun", '{"runId": ""}',
                       code="INVALID_ARGUMENT", field="run_id")

    def test_health_and_unreachable_server(self):
        self.assertEqual(self.json_cli("health"), {"status": "SERVING"})
        self.assertEqual(self.json_cli("health", "--service", "keyflow.v1.Runs"),
                         {"status": "SERVING"})
        self.rpc_error("health", "--service", "no.such.Service", code="NOT_FOUND",
                       field="service")
        # --addr wins over $KEYFLOW_ADDR; port 1 on loopback refuses connections.
        proc = self.run_cli("--addr", "127.0.0.1:1", "health", expect=1)
        self.assertTrue(proc.stderr.startswith("keyflow: UNAVAILABLE: "), proc.stderr)
        proc = self.run_cli("health", "--addr", "127.0.0.1:1", expect=1)
        self.assertTrue(proc.stderr.startswith("keyflow: UNAVAILABLE: "), proc.stderr)
        # Without --addr and $KEYFLOW_ADDR the default address is used;
        # --addr alone reaches the test server.
        self.assertEqual(self.json_cli("--addr", self.server.grpc_target, "health"),
                         {"status": "SERVING"})


class TestWork(CliTestCase):
    def fire(self, wf, key, value):
        """Starts a run whose input is exactly `value` (a debounce window
        keeps the latest input; a batch would wrap it in an array)."""
        sent = self.send(wf, key, "--debounce", "--window-ms", 600000, input=value)
        flushed = self.json_cli("flush", "--kind", "debounce", "--workflow", wf, "--key", key)
        self.assertTrue(flushed["flushed"])
        self.assertEqual(flushed["runId"], sent["receipt"]["runId"])
        return flushed["runId"]

    def work_once(self, wf, *cmd, expect=0, extra=()):
        return self.run_cli("work", "--worker", "cli-worker", "--workflow", wf, "--once",
                            "--wait-ms", 10000, *extra, "--", *cmd, expect=expect)

    def test_work_once_runs_a_shell_command(self):
        wf, key = unique("work"), "job-1"
        run_id = self.fire(wf, key, {"x": 1, "s": "hé"})
        proc = self.work_once(wf, "sh", "-c", "cat; echo >&2 done")
        lines = proc.stdout.splitlines()
        self.assertEqual(len(lines), 1, proc.stdout)
        printed = json.loads(lines[0])
        self.assertEqual(printed["runId"], run_id)
        self.assertEqual(printed["status"], "RUN_STATUS_COMPLETED")
        self.assertEqual(printed["result"], {"x": 1, "s": "hé"})
        self.assertIn("done", proc.stderr)  # the command's stderr is passed through
        got = self.json_cli("get", run_id)
        self.assertEqual(got["status"], "RUN_STATUS_COMPLETED")
        self.assertEqual(got["result"], {"x": 1, "s": "hé"})
        self.assertEqual(got["workerId"], "cli-worker")
        self.assertEqual(got["attempts"], "1")

    def test_work_sets_the_environment(self):
        wf, key = unique("env"), "key-env"
        run_id = self.fire(wf, key, [1, 2])
        script = ("import json, os, sys; json.dump({'id': os.environ['KEYFLOW_RUN_ID'], "
                  "'wf': os.environ['KEYFLOW_WORKFLOW'], 'key': os.environ['KEYFLOW_KEY'], "
                  "'input': json.load(sys.stdin)}, sys.stdout)")
        proc = self.work_once(wf, sys.executable, "-c", script)
        printed = json.loads(proc.stdout)
        self.assertEqual(printed["result"], {"id": run_id, "wf": wf, "key": key, "input": [1, 2]})

    def test_work_plain_text_output_becomes_a_json_string(self):
        wf = unique("text")
        run_id = self.fire(wf, "t", None)
        proc = self.work_once(wf, "sh", "-c", "cat >/dev/null; echo hello world")
        self.assertEqual(json.loads(proc.stdout)["result"], "hello world")
        self.assertEqual(self.json_cli("get", run_id)["result"], "hello world")

    def test_work_failure_reports_exit_status_and_last_stderr_line(self):
        wf = unique("fail")
        run_id = self.fire(wf, "f", {"bad": True})
        proc = self.work_once(
            wf, "sh", "-c", "cat >/dev/null; echo partial; echo >&2 first; "
                            "echo >&2 'it broke'; exit 3")
        printed = json.loads(proc.stdout)
        self.assertEqual(printed["status"], "RUN_STATUS_FAILED")
        self.assertEqual(printed["error"], "exit status 3: it broke")
        got = self.json_cli("get", run_id)
        self.assertEqual(got["status"], "RUN_STATUS_FAILED")
        self.assertEqual(got["error"], "exit status 3: it broke")
        self.assertNotIn("result", got)

    def test_work_missing_command_fails_the_run(self):
        wf = unique("nocmd")
        run_id = self.fire(wf, "n", 1)
        proc = self.work_once(wf, "/nonexistent/keyflow-test-command")
        printed = json.loads(proc.stdout)
        self.assertEqual(printed["runId"], run_id)
        self.assertEqual(printed["status"], "RUN_STATUS_FAILED")
        self.assertIn("cannot run /nonexistent/keyflow-test-command", printed["error"])

    def test_work_heartbeats_a_command_that_outlives_its_lease(self):
        wf = unique("slow")
        run_id = self.fire(wf, "s", 41)
        # A 300 ms lease and a 1.2 s command: only heartbeats (every 150 ms)
        # keep the lease; without them it expires and completion is refused.
        proc = self.work_once(wf, "sh", "-c", "read v; sleep 1.2; echo $((v + 1))",
                              extra=("--lease-ms", 300))
        printed = json.loads(proc.stdout)
        self.assertEqual(printed["runId"], run_id)
        self.assertEqual(printed["status"], "RUN_STATUS_COMPLETED")
        self.assertEqual(printed["result"], 42)
        self.assertEqual(printed["attempts"], "1")

    def test_work_once_with_nothing_to_do_exits_1(self):
        wf = unique("idle")
        proc = self.run_cli("work", "--worker", "w", "--workflow", wf, "--once", "--wait-ms",
                            200, "--", "true", expect=1)
        self.assertEqual(proc.stdout, "")
        self.assertIn("no run arrived within 200 ms", proc.stderr)

    def test_work_max_runs_handles_that_many_in_order(self):
        wf = unique("many")
        ids = [self.fire(wf, "m%d" % i, i) for i in range(3)]
        proc = self.run_cli("work", "--worker", "w", "--workflow", wf, "--max-runs", 3,
                            "--wait-ms", 10000, "--", "sh", "-c", "read v; echo $((v * 10))")
        printed = [json.loads(line) for line in proc.stdout.splitlines()]
        self.assertEqual(len(printed), 3)
        self.assertEqual(sorted(p["runId"] for p in printed), sorted(ids))
        by_id = {p["runId"]: p["result"] for p in printed}
        self.assertEqual([by_id[i] for i in ids], [0, 10, 20])
        self.assertEqual(sorted(self.list_ids("--workflow", wf, "--status", "completed")),
                         sorted(ids))


if __name__ == "__main__":
    unittest.main()
