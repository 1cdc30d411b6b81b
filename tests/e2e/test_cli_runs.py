"""End-to-end tests of the CLI's run control against the real keyflowd:
`send --wait`, `run wait|cancel|release`, the rule's run options on `send`,
`complete --retryable`, `list --key`, and `work` stopping a cancelled run's
command. Same server and helpers as test_cli.py; nothing sleeps for timing
(long polls, and waits for a process or a line with a deadline).
"""

import json
import os
import subprocess
import sys
import unittest

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import harness  # noqa: E402
from test_cli import CLI_TIMEOUT_S, CliTestCase, unique  # noqa: E402

ONE = ("--batch", "--max-events", 1)


class TestRunControl(CliTestCase):
    def popen_cli(self, *args):
        env = dict(os.environ, KEYFLOW_ADDR=self.server.grpc_target)
        return subprocess.Popen([harness.CLI] + [str(a) for a in args], stdout=subprocess.PIPE,
                                stderr=subprocess.PIPE, text=True, env=env)

    def finish(self, proc):
        try:
            out, err = proc.communicate(timeout=CLI_TIMEOUT_S)
        finally:
            if proc.poll() is None:
                proc.kill()
                proc.wait()
        return proc.returncode, out, err

    def test_help_lists_run_and_its_subcommands(self):
        self.assertRegex(self.run_cli("--help").stdout, r"\n  run +\S")
        out = self.run_cli("run", "--help").stdout
        for sub in ("cancel", "wait", "release"):
            self.assertRegex(out, r"\n  %s +\S" % sub)
        send_help = self.run_cli("send", "--help").stdout
        for flag in ("--wait", "--key-concurrency N", "--retry-max-attempts N",
                     "--start-after-ms N"):
            self.assertIn(flag, send_help)

    def test_send_wait_prints_the_receipt_then_the_finished_run(self):
        wf = unique("sw")
        sender = self.popen_cli("send", "--workflow", wf, "--key", "k", *ONE, "--input", "7",
                                "--wait")
        run = self.poll_one(wf)
        self.json_cli("complete", run["runId"], "--lease", run["lease"], "--result", '{"ok": 8}')
        code, out, err = self.finish(sender)
        self.assertEqual(code, 0, err)
        receipt, done = [json.loads(line) for line in out.splitlines()]
        self.assertEqual(receipt["receipt"]["runId"], run["runId"])
        self.assertEqual(done["status"], "RUN_STATUS_COMPLETED")
        self.assertEqual(done["result"], {"ok": 8})

    def test_run_wait_from_the_receipt_and_its_exit_status(self):
        wf = unique("rw")
        receipt = self.send(wf, "k", "--batch", "--max-events", 2, input=1)
        run_id = receipt["receipt"]["runId"]
        self.assertEqual(self.json_cli("get", run_id)["status"], "RUN_STATUS_WINDOW_OPEN")
        waiter = self.popen_cli("run", "wait", run_id)
        self.send(wf, "k", "--batch", "--max-events", 2, input=2)  # fills the window
        run = self.poll_one(wf)
        self.json_cli("complete", run_id, "--lease", run["lease"], "--error", "no stock")
        code, out, err = self.finish(waiter)
        self.assertEqual(code, 1, "a FAILED run exits 1")
        self.assertEqual(json.loads(out)["error"], "no stock")
        self.assertIn("ended FAILED: no stock", err)
        pending = self.send(wf, "p", *ONE)["receipt"]["runId"]
        proc = self.run_cli("run", "wait", pending, "--wait-timeout-ms", 300, expect=1)
        self.assertEqual(json.loads(proc.stdout)["status"], "RUN_STATUS_PENDING")
        self.assertIn("did not finish within 300 ms; it is PENDING", proc.stderr)

    def test_run_cancel_and_release(self):
        wf = unique("rc")
        pending = self.send(wf, "p", *ONE)["receipt"]["runId"]
        out = self.json_cli("run", "cancel", pending)
        self.assertEqual(out["run"]["status"], "RUN_STATUS_CANCELLED")
        self.assertEqual(self.list_ids("--workflow", wf, "--status", "cancelled"), [pending])
        leased_id = self.send(wf, "l", *ONE)["receipt"]["runId"]
        run = self.poll_one(wf)
        back = self.json_cli("run", "release", leased_id, "--lease", run["lease"])
        self.assertEqual((back["run"]["status"], back["run"].get("attempts", "0")),
                         ("RUN_STATUS_PENDING", "0"))
        self.rpc_error("run", "release", leased_id, "--lease", run["lease"],
                       code="FAILED_PRECONDITION", field="lease")
        self.usage_error("run", "release", leased_id, flag="--lease")

    def test_run_options_on_send_and_a_retryable_completion(self):
        wf = unique("ro")
        run_id = self.send(wf, "k", *ONE, "--key-concurrency", 1, "--retry-max-attempts", 3,
                           "--retry-initial-backoff-ms", 600000, "--retry-multiplier", "1.5",
                           input=1, event_id="e-1")["receipt"]["runId"]
        self.send(wf, "k", *ONE, "--key-concurrency", 1, input=2)
        run = self.poll_one(wf)
        self.assertEqual((run["runId"], run["maxAttempts"], run["eventIds"]),
                         (run_id, "3", ["e-1"]))
        self.assertEqual(self.json_cli("poll", "--worker", "w", "--workflow", wf)["runs"], [],
                         "the key's one slot is taken")
        out = self.json_cli("complete", run_id, "--lease", run["lease"], "--error", "busy",
                            "--retryable")
        self.assertEqual((out["run"]["status"], out["run"]["lastError"]),
                         ("RUN_STATUS_DELAYED", "busy"))
        self.usage_error("send", "--workflow", wf, "--key", "k", *ONE, "--retry-multiplier", "x",
                         flag="--retry-multiplier")
        self.usage_error("send", "--workflow", wf, "--key", "k", *ONE, "--wait-timeout-ms", 5,
                         flag="--wait-timeout-ms")
        self.rpc_error("send", "--workflow", wf, "--key", "k", *ONE, "--start-after-ms", -1,
                       code="INVALID_ARGUMENT", field="start_after_ms")
        self.assertEqual(self.list_ids("--workflow", wf, "--key", "k", "--status", "delayed"),
                         [run_id])

    def test_work_stops_a_cancelled_runs_command(self):
        wf = unique("wc")
        run_id = self.send(wf, "k", *ONE)["receipt"]["runId"]
        # The command says it started, then sleeps; heartbeats every 150 ms.
        worker = self.popen_cli("work", "--worker", "w", "--workflow", wf, "--once",
                                "--lease-ms", 300, "--wait-ms", 10000, "--",
                                "sh", "-c", "echo started >&2; exec sleep 30")
        self.assertEqual(worker.stderr.readline().strip(), "started")
        self.json_cli("run", "cancel", run_id)
        code, out, err = self.finish(worker)
        self.assertIn("was cancelled; stopping its command", err)
        self.assertEqual(json.loads(out)["status"], "RUN_STATUS_CANCELLED")
        self.assertEqual(self.json_cli("get", run_id)["status"], "RUN_STATUS_CANCELLED")


if __name__ == "__main__":
    unittest.main()
