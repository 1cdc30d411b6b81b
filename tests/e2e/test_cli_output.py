"""The `keyflow` CLI as a person and as a script see it: --output json|table
(tables by default on a terminal, JSON otherwise), empty lists present as
[], grpcurl's method spellings for `call`, the progress line of a long push
on a terminal, and the bash completion script.

Terminals are real: the CLI runs on a pseudo-terminal (Python's pty), which
is what isatty() sees in a shell.

Run (Debian's Python):
  KEYFLOW_BUILD_DIR=build PYENV_VERSION=system python3 -m unittest -v test_cli_output
"""

import json
import os
import pty
import re
import select
import shutil
import subprocess
import sys
import tempfile
import unittest
import uuid

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import harness  # noqa: E402

HANDLERS = os.path.join(harness.BUILD, "handlers")
STAMP = r"\d{4}-\d\d-\d\d \d\d:\d\d:\d\dZ \((now|in [0-9.dhms]+|[0-9.dhms]+ ago)\)"


def unique(prefix):
    return "%s-%s" % (prefix, uuid.uuid4().hex[:10])


def on_pty(argv, env, stdout_tty=True, stderr_tty=True, stdin=None, timeout=60):
    """Runs argv with stdout and/or stderr on a pseudo-terminal; returns
    (exit code, stdout text, stderr text)."""
    master, slave = pty.openpty()
    pipes = {}
    out = slave if stdout_tty else subprocess.PIPE
    err = slave if stderr_tty else subprocess.PIPE
    proc = subprocess.Popen(argv, stdin=subprocess.PIPE if stdin is not None else subprocess.DEVNULL,
                            stdout=out, stderr=err, env=env)
    os.close(slave)
    if stdin is not None:
        proc.stdin.write(stdin.encode())
        proc.stdin.close()
    tty_bytes = b""
    while True:
        ready, _, _ = select.select([master], [], [], timeout)
        if not ready:
            proc.kill()
            raise AssertionError("no output from %r within %ss" % (argv, timeout))
        try:
            chunk = os.read(master, 65536)
        except OSError:  # EIO: every writer closed the terminal
            break
        if not chunk:
            break
        tty_bytes += chunk
    os.close(master)
    for name, stream in (("out", proc.stdout), ("err", proc.stderr)):
        pipes[name] = stream.read() if stream is not None else b""
        if stream is not None:
            stream.close()
    code = proc.wait(timeout=timeout)
    tty_text = tty_bytes.decode().replace("\r\n", "\n")
    return (code, tty_text if stdout_tty else pipes["out"].decode(),
            tty_text if stderr_tty and not stdout_tty else pipes["err"].decode())


class CliOutputTest(unittest.TestCase):
    @classmethod
    def setUpClass(cls):
        # One partition: these tests model a function's output as one
        # sequence over all keys (harness.ONE_PARTITION says why).
        cls.server = harness.Keyflowd(args=harness.ONE_PARTITION + ["--plugin-dir", HANDLERS]).start()

    @classmethod
    def tearDownClass(cls):
        cls.server.stop()
        cls.server.cleanup()

    def env(self):
        env = dict(os.environ, KEYFLOW_ADDR=self.server.grpc_target)
        env.pop("KEYFLOW_OUTPUT", None)
        return env

    def cli(self, *args, expect=0, stdin=None):
        p = subprocess.run([harness.CLI] + [str(a) for a in args], capture_output=True, text=True,
                           env=self.env(), timeout=60, input=stdin)
        self.assertEqual(p.returncode, expect, "%s\n%s" % (p.stdout, p.stderr))
        return p

    def send(self, wf, key, event_id, max_events=3):
        return json.loads(self.cli("send", "--workflow", wf, "--key", key, "--id", event_id,
                                   "--batch", "--max-events", max_events, "--max-wait-ms", 600000,
                                   "--input", '{"n": 1}').stdout)

    # --- JSON -----------------------------------------------------------------

    def test_json_when_piped_with_empty_lists_present(self):
        wf = unique("wf")
        listed = self.cli("list", "--workflow", wf).stdout
        self.assertEqual(listed, '{"runs":[]}\n', "an empty list is [] so jq '.runs[]' works")
        polled = json.loads(self.cli("poll", "--worker", "w", "--workflow", wf).stdout)
        self.assertEqual(polled, {"runs": []})
        # Nested lists too: a coordinator with a window but no journal
        # entries of some kind still shows its lists.
        self.send(wf, "k", "e1")
        d = json.loads(self.cli("describe", "--kind", "batch", "--workflow", wf,
                                "--key", "k").stdout)
        self.assertIsInstance(d["rememberedIds"], list)
        self.assertIsInstance(d["journal"], list)
        self.assertIn("recentRunIds", d)
        self.assertEqual(d["recentRunIds"], [])
        # The same with --output json on a terminal.
        code, out, _ = on_pty([harness.CLI, "--output", "json", "list", "--workflow", wf],
                              self.env())
        self.assertEqual((code, out), (0, '{"runs":[]}\n'))

    def test_output_flag_is_checked(self):
        p = self.cli("--output", "xml", "list", expect=2)
        self.assertIn('--output: expected json or table, got "xml"', p.stderr)
        env = dict(self.env(), KEYFLOW_OUTPUT="yaml")
        p = subprocess.run([harness.CLI, "list"], capture_output=True, text=True, env=env,
                           timeout=60)
        self.assertEqual(p.returncode, 2)
        self.assertIn('got "yaml"', p.stderr)

    # --- tables ---------------------------------------------------------------

    def assert_aligned(self, lines):
        """Every row's cells start where the header's columns start."""
        header = lines[0]
        # Header labels may hold single spaces ("RUN ID"): a column starts
        # after two or more spaces.
        starts = [0] + [m.end() for m in re.finditer(r"\S {2,}(?=\S)", header)]
        for line in lines[1:]:
            for s in starts[1:]:
                if s < len(line):
                    self.assertTrue(line[s - 1] == " ", "column at %d in %r (header %r)"
                                    % (s, line, header))
            self.assertEqual(line, line.rstrip(), "no trailing blanks")
        return starts

    def test_table_by_default_on_a_terminal(self):
        wf = unique("wf")
        for i in range(3):
            self.send(wf, "key-%d" % i, "e", max_events=1)  # each starts a run
        code, out, _ = on_pty([harness.CLI, "list", "--workflow", wf], self.env())
        self.assertEqual(code, 0, out)
        lines = out.rstrip("\n").split("\n")
        self.assertEqual(len(lines), 4, out)
        self.assertTrue(lines[0].startswith("RUN ID"), out)
        for column in ("WORKFLOW", "KEY", "STATUS", "CREATED", "INPUT"):
            self.assertIn(column, lines[0])
        self.assert_aligned(lines)
        for line in lines[1:]:
            self.assertIn(wf, line)
            self.assertIn("PENDING", line, "enum values without their prefix")
            self.assertNotIn("RUN_STATUS_", line)
            self.assertRegex(line, STAMP, "times are readable")
            self.assertNotRegex(line, r"\b1[0-9]{12}\b", "no raw epoch milliseconds")
        # The same rows, as JSON when piped.
        runs = json.loads(self.cli("list", "--workflow", wf).stdout)["runs"]
        self.assertEqual(sorted(r["key"] for r in runs), ["key-0", "key-1", "key-2"])
        for r in runs:
            self.assertTrue(any(r["runId"] in l for l in lines[1:]), r["runId"])

    def test_table_shows_fields_lists_and_durations(self):
        wf = unique("wf")
        self.cli("send", "--workflow", wf, "--key", "k", "--id", "e1", "--debounce",
                 "--window-ms", 90000, "--max-wait-ms", 7200000, "--input", '"x"')
        p = self.cli("--output", "table", "describe", "--kind", "debounce", "--workflow", wf,
                     "--key", "k")
        text = p.stdout
        self.assertRegex(text, r"(?m)^coordinator workflow +%s$" % wf)
        self.assertRegex(text, r"(?m)^window rule window +1m30s$", "a duration")
        self.assertRegex(text, r"(?m)^window rule max wait +2h$")
        self.assertRegex(text, r"(?m)^window due +%s$" % STAMP)
        self.assertRegex(text, r"(?m)^window rule kind +DEBOUNCE$")
        # Lists of objects become tables of their own, titled.
        self.assertIn("\nremembered ids:\nID ", text)
        self.assertIn("\njournal:\n", text)
        # An empty list is said to be empty; an enum drops its type's prefix.
        p = self.cli("--output", "table", "list", "--workflow", unique("none"))
        self.assertEqual(p.stdout, "runs  (none)\n")
        p = self.cli("--output", "table", "cancel", "--kind", "batch", "--workflow", wf,
                     "--key", "nothing-open")
        self.assertEqual(p.stdout, "disposition  NO_WINDOW\n")

    def test_table_of_output_rows_uses_the_rows_fields(self):
        fid = "running_sum"
        path = os.path.join(HANDLERS, "running_sum.descriptor.json")
        self.cli("functions", "register", path)
        t0 = 1700000000000000  # 2023-11-14 22:13:20Z
        rows = "".join(json.dumps({"user": u, "ts": t0 + i, "amount": i}) + "\n"
                       for i, u in enumerate(["ann", "bob", "ann"]))
        producer = unique("p")
        ack = json.loads(self.cli("functions", "push", fid, "--producer", producer, "--sequence", 1,
                                  stdin=rows).stdout)
        first = int(ack["firstOutputSeq"])
        out = self.cli("--output", "table", "functions", "output", fid, "--after", first - 1,
                       "--limit", 3).stdout
        section = out[out.index("rows:\n") + len("rows:\n"):].rstrip("\n").split("\n")
        self.assertEqual(section[0].split(), ["SEQ", "KEY", "TS", "SUM", "PREVIOUS"])
        self.assert_aligned(section)
        self.assertEqual(len(section), 4)
        # A TIMESTAMP_US column of the output schema is a time, like the
        # function's watermark (the JSON keeps the number).
        for line in section[1:]:
            self.assertIn("2023-11-14 22:13:20Z (", line)
        self.assertNotIn(str(t0), out)
        page = json.loads(self.cli("functions", "output", fid, "--after", first - 1,
                                   "--limit", 1).stdout)
        self.assertEqual(page["rows"][0]["ts"], str(t0))

    # --- call -------------------------------------------------------------------

    def test_call_accepts_grpcurl_method_spellings(self):
        wf = unique("wf")
        self.send(wf, "k", "e1", max_events=1)
        request = json.dumps({"workflow": wf})
        answers = [json.loads(self.cli("call", name, request).stdout)
                   for name in ("/keyflow.v1.Runs/ListRuns", "keyflow.v1.Runs/ListRuns",
                                "keyflow.v1.Runs.ListRuns")]
        self.assertEqual(len(answers[0]["runs"]), 1)
        self.assertEqual(answers[0], answers[1])
        self.assertEqual(answers[0], answers[2])
        health = json.loads(self.cli("call", "grpc.health.v1.Health.Check", "{}").stdout)
        self.assertEqual(health, {"status": "SERVING"})
        for bad in ("keyflow.v1.Runs", "ListRuns", "keyflow.v1.Runs.Nope", "keyflow.v1/Runs/X"):
            p = self.cli("call", bad, "{}", expect=2)
            self.assertIn("unknown method %s" % bad, p.stderr)

    # --- progress ---------------------------------------------------------------

    def test_long_push_shows_progress_on_a_terminal_only(self):
        fid = "running_sum"
        self.cli("functions", "register", os.path.join(HANDLERS, "running_sum.descriptor.json"))
        rows = "".join(json.dumps({"user": "p", "ts": 100 + i, "amount": 1}) + "\n"
                       for i in range(5))
        argv = [harness.CLI, "--output", "json", "functions", "push", fid, "--producer",
                unique("p"), "--sequence", "1", "--batch-rows", "2"]
        # stderr on a terminal, stdout piped: the progress goes to the terminal.
        code, out, err = on_pty(argv, self.env(), stdout_tty=False, stderr_tty=True, stdin=rows)
        self.assertEqual(code, 0, err)
        self.assertEqual(len(out.splitlines()), 3, "one acknowledgement per batch")
        self.assertIn("\r\x1b[Kkeyflow: pushing batch 1 of 3 (0 of 5 rows sent)", err)
        self.assertIn("pushing batch 3 of 3 (4 of 5 rows sent)", err)
        self.assertTrue(err.endswith("\r\x1b[K"), "the line is erased at the end: %r" % err)
        # Not a terminal: no progress at all.
        argv[argv.index("--producer") + 1] = unique("p")
        p = subprocess.run(argv, input=rows, capture_output=True, text=True, env=self.env(),
                           timeout=60)
        self.assertEqual((p.returncode, p.stderr), (0, ""))
        self.assertEqual(len(p.stdout.splitlines()), 3)

    # --- completion -------------------------------------------------------------

    def test_bash_completion(self):
        bash = shutil.which("bash")
        if bash is None:
            self.skipTest("no bash")
        script = subprocess.run([harness.CLI, "completion", "bash"], capture_output=True,
                                text=True, timeout=30, env={"PATH": os.environ["PATH"]})
        self.assertEqual(script.returncode, 0, script.stderr)  # no server needed
        d = tempfile.mkdtemp(prefix="kf-comp-")
        self.addCleanup(shutil.rmtree, d)
        with open(os.path.join(d, "keyflow.bash"), "w") as f:
            f.write(script.stdout)
        open(os.path.join(d, "rows.jsonl"), "w").close()

        def complete(*words):
            probe = ('source "%s/keyflow.bash"; cd "%s"; COMP_WORDS=(%s); '
                     'COMP_CWORD=$((${#COMP_WORDS[@]} - 1)); _keyflow; printf "%%s\\n" '
                     '"${COMPREPLY[@]}"') % (d, d, " ".join("'%s'" % w for w in words))
            p = subprocess.run([bash, "--norc", "-c", probe], capture_output=True, text=True,
                               timeout=30)
            self.assertEqual(p.returncode, 0, p.stderr)
            return sorted(w for w in p.stdout.split("\n") if w)

        self.assertEqual(complete("keyflow", "fun"), ["functions"])
        self.assertIn("send", complete("keyflow", ""))
        self.assertEqual(complete("keyflow", "functions", "pu"), ["push"])
        self.assertEqual(complete("keyflow", "functions", "push", "--batch-r"), ["--batch-rows"])
        self.assertEqual(complete("keyflow", "send", "--window"), ["--window-ms"])
        self.assertEqual(complete("keyflow", "describe", "--kind", ""), ["batch", "debounce"])
        self.assertEqual(complete("keyflow", "--output", ""), ["json", "table"])
        self.assertEqual(complete("keyflow", "list", "--status", "c"), ["cancelled", "completed"])
        self.assertEqual(complete("keyflow", "run", "w"), ["wait"])
        self.assertEqual(complete("keyflow", "--addr", "h:1", "call", "keyflow.v1.Runs/Get"),
                         ["keyflow.v1.Runs/GetRun"])
        self.assertEqual(complete("keyflow", "functions", "push", "f", "--file", "ro"),
                         ["rows.jsonl"])
        self.assertEqual(complete("keyflow", "send", "--key", ""), [], "free text: nothing")
        self.assertIn("--output", complete("keyflow", "poll", "--"))
        self.assertEqual(complete("keyflow", "completion", ""), ["bash"])
        # A flag given once is not offered again, unless it repeats.
        self.assertEqual(complete("keyflow", "send", "--workflow", "w", "--workf"), [])
        self.assertEqual(complete("keyflow", "--output", "json", "send", "--outp"), [])
        self.assertEqual(complete("keyflow", "--output", "json", "--outp"), [])
        self.assertEqual(complete("keyflow", "poll", "--workflow", "a", "--workf"), ["--workflow"])
        # The commands offered first are those --help lists, help included.
        main_help = self.cli("--help").stdout
        listed = re.findall(r"^  ([a-z-]+) ", main_help[main_help.index("Commands:"):
                                                      main_help.index("Global flags")], re.M)
        self.assertIn("help", listed)
        self.assertEqual(complete("keyflow", ""), sorted(listed))
        p = self.cli("completion", "zsh", expect=2)
        self.assertIn("only bash", p.stderr)


if __name__ == "__main__":
    unittest.main()
