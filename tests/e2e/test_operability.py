"""What an operator sees of the real keyflowd: structured logs (--log-format,
--log-level debug request lines, info lifecycle events), --version on both
binaries, and the build and process metrics.

Run (Debian's Python):
  KEYFLOW_BUILD_DIR=build PYENV_VERSION=system python3 -m unittest -v test_operability
"""

import json
import os
import re
import subprocess
import sys
import time
import unittest
import uuid

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import harness  # noqa: E402
from harness import wait_until  # noqa: E402

harness.stubs()
import grpc  # noqa: E402
from keyflow.v1 import coordinators_pb2 as C  # noqa: E402
from keyflow.v1 import coordinators_pb2_grpc as CG  # noqa: E402
from keyflow.v1 import runs_pb2 as R  # noqa: E402
from keyflow.v1 import runs_pb2_grpc as RG  # noqa: E402

HANDLERS = os.path.join(harness.BUILD, "handlers")


def project_version():
    with open(os.path.join(harness.ROOT, "CMakeLists.txt")) as f:
        return re.search(r"project\(keyflow VERSION ([0-9.]+)", f.read()).group(1)


def metric(text, series):
    for line in text.splitlines():
        if line.startswith(series + " "):
            return float(line.split(" ", 1)[1])
    return None


class Server(harness.ServerTest):
    """A new server for each test (its log is the test's alone) with the
    class's server_args, its log on failure."""

    fresh_server = True

    def setUp(self):
        super().setUp()
        self.channel = grpc.insecure_channel(self.server.grpc_target)
        self.addCleanup(self.channel.close)
        self.coords = CG.CoordinatorsStub(self.channel)
        self.runs = RG.RunsStub(self.channel)
        self.wf = "wf-" + uuid.uuid4().hex[:8]

    def log_lines(self):
        with open(self.server.log_path, "rb") as f:
            return f.read().decode().splitlines()

    def send(self, key, max_events=1, event_id=""):
        rule = C.Rule(kind=C.RULE_KIND_BATCH, max_events=max_events, max_wait_ms=600000)
        return self.coords.SendEvent(C.SendEventRequest(workflow=self.wf, key=key, event=C.Event(
            id=event_id, rule=rule, input_json="1")), timeout=10)


class JsonLogTest(Server):
    server_args = ("--log-format", "json", "--log-level", "debug", "--run-attempts", "1",
                   "--plugin-dir", HANDLERS)

    def records(self):
        """Every line parsed; each must be one JSON object with the common
        members."""
        out = []
        for line in self.log_lines():
            rec = json.loads(line)
            self.assertIsInstance(rec, dict, line)
            for member in ("ts", "level", "module", "msg"):
                self.assertIn(member, rec, line)
            self.assertRegex(rec["ts"], r"^\d{4}-\d\d-\d\dT\d\d:\d\d:\d\d\.\d{3}Z$")
            self.assertIn(rec["level"], ("debug", "info", "warn", "error"))
            out.append(rec)
        return out

    def find(self, msg, **fields):
        return [r for r in self.records()
                if r["msg"] == msg and all(r.get(k) == v for k, v in fields.items())]

    def test_requests_and_lifecycle_events_as_json(self):
        # A batch of one closes at once: a run starts (info), and the
        # request is logged with its method, outcome, duration and key (debug).
        receipt = self.send("k-grpc").receipt
        started = wait_until(lambda: self.find("window closed, run started", workflow=self.wf,
                                               key="k-grpc"), 10, "the run-started line")
        self.assertEqual(started[0]["level"], "info")
        self.assertEqual(started[0]["run_id"], receipt.run_id)
        self.assertEqual(started[0]["kind"], "batch")
        self.assertEqual(started[0]["events"], 1)
        req = wait_until(lambda: self.find("request", method="SendEvent", transport="grpc",
                                           key="k-grpc"), 10, "the gRPC request line")
        self.assertEqual(req[0]["level"], "debug")
        self.assertEqual(req[0]["status"], "OK")
        self.assertEqual(req[0]["workflow"], self.wf)
        self.assertIsInstance(req[0]["duration_us"], int)
        self.assertGreaterEqual(req[0]["duration_us"], 0)

        # Over HTTP, with the HTTP status; a refused request is logged too.
        status, _ = self.server.http("GET", "/v1/coordinators/batch/%s/k-http" % self.wf)
        self.assertEqual(status, 200)
        req = wait_until(lambda: self.find("request", method="DescribeCoordinator",
                                           transport="http"), 10, "the HTTP request line")
        self.assertEqual(req[0]["status"], "OK")
        self.assertEqual(req[0]["http_status"], 200)
        self.assertEqual(req[0]["key"], "k-http")
        self.assertEqual(req[0]["workflow"], self.wf)
        status, _ = self.server.http("GET", "/v1/runs/nope@x")
        self.assertEqual(status, 404)
        req = wait_until(lambda: self.find("request", method="GetRun", transport="http"), 10,
                         "the refused request's line")
        self.assertEqual(req[0]["status"], "NOT_FOUND")
        self.assertEqual(req[0]["http_status"], 404)
        self.assertEqual(req[0]["run_id"], "nope@x")

        # A lease that runs out on the only attempt: lease expired, run failed.
        polled = self.runs.PollRuns(R.PollRunsRequest(workflows=[self.wf], worker_id="w-9",
                                                      lease_ms=100), timeout=10)
        self.assertEqual(len(polled.runs), 1)
        expired = wait_until(lambda: self.find("lease expired", run_id=receipt.run_id), 10,
                             "the lease-expired line")
        self.assertEqual(expired[0]["worker_id"], "w-9")
        self.assertEqual(expired[0]["next"], "failed")
        failed = wait_until(lambda: self.find("run failed", run_id=receipt.run_id), 10,
                            "the run-failed line")
        self.assertIn("lease expired", failed[0]["error"])
        self.assertEqual(failed[0]["workflow"], self.wf)

        # A worker that fails its run.
        receipt2 = self.send("k-fail").receipt
        polled = self.runs.PollRuns(R.PollRunsRequest(workflows=[self.wf], worker_id="w",
                                                      lease_ms=60000), timeout=10)
        self.runs.CompleteRun(R.CompleteRunRequest(run_id=receipt2.run_id,
                                                   lease=polled.runs[0].lease, error="boom"),
                              timeout=10)
        failed = wait_until(lambda: self.find("run failed", run_id=receipt2.run_id), 10,
                            "the worker's failure")
        self.assertEqual(failed[0]["error"], "boom")

        # A function registered (not again when the registration repeats).
        path = os.path.join(HANDLERS, "running_sum.descriptor.json")
        with open(path, "rb") as f:
            descriptor = f.read()
        for _ in range(2):
            status, body = self.server.http("POST", "/v1/functions", raw=descriptor)
            self.assertEqual(status, 200, body)
        # One line from each of the default 8 partitions, none for the repeat.
        reg = wait_until(lambda: [r for r in [self.find("function registered",
                                                        function_id="running_sum")]
                                  if len(r) >= 8], 10, "the function-registered lines")[0]
        self.assertEqual(len(reg), 8, "an idempotent repeat registers nothing")
        self.assertRegex(reg[0]["descriptor_sha256"], r"^[0-9a-f]{64}$")
        # The start-up lines: the store's open and recovery times as
        # numbers (not inside the message), the version; every line parsed.
        opened = self.find("store opened", module="main")
        self.assertEqual(len(opened), 1, "one store-opened line")
        self.assertIsInstance(opened[0]["open_ms"], int)
        self.assertIsInstance(opened[0]["recover_ms"], int)
        self.assertIn("8 partitions", opened[0]["partitions"], "the default count")
        serving = self.find("serving", module="main")
        self.assertEqual(serving[0]["version"], project_version())


    def raw_http(self, request_line):
        """Sends one HTTP/1.1 request head as raw bytes (a path no client
        library would send as is) and returns the status."""
        import socket
        with socket.create_connection(("127.0.0.1", self.server.http_port), timeout=10) as s:
            s.sendall(request_line + b"\r\nHost: localhost\r\nConnection: close\r\n\r\n")
            head = b""
            while b"\r\n" not in head:
                chunk = s.recv(4096)
                if not chunk:
                    break
                head += chunk
        return int(head.split(b" ")[1])

    def test_requests_naming_no_rpc_are_logged_too(self):
        """A request no route takes (404, a 405 of a path whose routes take
        other methods) and the probes get a debug line as well: method "-",
        the HTTP method and the path, escaped so the line stays one line."""
        cases = [(b"GET /nope%FF%0A HTTP/1.1", 404, "GET", "/nope%FF%0A"),
                 (b"GET /caf\xc3\xa9/\xff HTTP/1.1", 404, "GET", "/caf%C3%A9/%FF"),
                 (b"PUT /v1/runs?workflow=x HTTP/1.1", 405, "PUT", "/v1/runs"),
                 (b"GET /healthz HTTP/1.1", 200, "GET", "/healthz")]
        for line, status, method, path in cases:
            with self.subTest(line=line):
                self.assertEqual(self.raw_http(line), status)
                rec = wait_until(lambda: self.find("request", method="-", path=path), 10,
                                 "the request line of %r" % line)
                self.assertEqual((rec[0]["level"], rec[0]["transport"], rec[0]["http_method"],
                                  rec[0]["http_status"]), ("debug", "http", method, status))
                self.assertIsInstance(rec[0]["duration_us"], int)
        long_path = b"/" + b"x" * 5000
        self.assertEqual(self.raw_http(b"GET " + long_path + b" HTTP/1.1"), 404)
        rec = wait_until(lambda: [r for r in self.find("request", method="-")
                                  if r["path"].startswith("/xxx")], 10, "the long path's line")
        self.assertLessEqual(len(rec[0]["path"]), 520, "a logged path is bounded")
        self.assertTrue(rec[0]["path"].endswith("..."))


class TextLogTest(Server):
    def test_default_is_text_at_info_without_request_lines(self):
        self.send("k1")
        wait_until(lambda: any("window closed, run started" in l for l in self.log_lines()), 10,
                   "the run-started line")
        lines = self.log_lines()
        line = next(l for l in lines if "window closed, run started" in l)
        self.assertRegex(line, r"^\d{4}-\d\d-\d\dT\d\d:\d\d:\d\d\.\d{3}Z info coord: "
                               r"window closed, run started kind=batch workflow=%s key=k1 "
                               r"run_id=k1@\S+ reason=full events=1$" % self.wf)
        self.assertFalse([l for l in lines if " request " in l or l.startswith("{")], lines)


class ConfigurationDocsTest(unittest.TestCase):
    """keyflowd's flags and --help, no server started."""

    def test_bad_log_flags_are_usage_errors(self):
        for args, message in ((["--log-format", "xml"], "log format must be text or json"),
                              (["--log-level", "trace"], "log level must be")):
            p = subprocess.run([harness.KEYFLOWD] + args, capture_output=True, timeout=30)
            self.assertEqual(p.returncode, 2, p.stderr)
            self.assertIn(message, p.stderr.decode())
        env = dict(os.environ, KEYFLOW_LOG_FORMAT="yaml")
        p = subprocess.run([harness.KEYFLOWD], capture_output=True, timeout=30, env=env)
        self.assertEqual(p.returncode, 2)
        self.assertIn("got yaml", p.stderr.decode())

    def test_the_readme_lists_every_environment_variable_of_help(self):
        """README's Configuration names each variable `keyflowd --help`
        reads, and none it does not."""
        p = subprocess.run([harness.KEYFLOWD, "--help"], capture_output=True, timeout=30)
        self.assertEqual(p.returncode, 0, p.stderr)
        helped = set(re.findall(r"\bKEYFLOW_[A-Z0-9_]+", p.stdout.decode()))
        self.assertGreater(len(helped), 20)
        with open(os.path.join(harness.ROOT, "README.md")) as f:
            readme = f.read()
        section = readme[readme.index("## Configuration"):]
        section = section[:section.index("\nPort 0 binds")]
        listed = set(re.findall(r"`(KEYFLOW_[A-Z0-9_]+)", section))
        self.assertEqual(sorted(helped - listed), [], "in --help, not in the README")
        self.assertEqual(sorted(listed - helped), [], "in the README, not in --help")


class VersionAndMetricsTest(Server):
    def test_version_flags_match_the_build_info_metric(self):
        version = project_version()
        outs = {}
        for name, binary in (("keyflowd", harness.KEYFLOWD), ("keyflow", harness.CLI)):
            p = subprocess.run([binary, "--version"], capture_output=True, timeout=30)
            self.assertEqual(p.returncode, 0, p.stderr)
            m = re.fullmatch(r"%s (\S+) \(commit (\S+)\)\n" % name, p.stdout.decode())
            self.assertIsNotNone(m, p.stdout)
            self.assertEqual(m.group(1), version)
            outs[name] = m.groups()
        self.assertEqual(outs["keyflowd"], outs["keyflow"], "both binaries come from one build")
        _, text = self.server.http("GET", "/metrics")
        self.assertIn('keyflow_build_info{version="%s",commit="%s"} 1' % outs["keyflowd"],
                      text.splitlines())
        self.assertIn("--version", subprocess.run([harness.KEYFLOWD, "--help"], capture_output=True,
                                                  timeout=30).stdout.decode())

    def test_process_metrics_describe_the_server(self):
        _, text = self.server.http("GET", "/metrics")
        for family, kind in (("process_cpu_seconds_total", "counter"),
                             ("process_resident_memory_bytes", "gauge"),
                             ("process_virtual_memory_bytes", "gauge"),
                             ("process_open_fds", "gauge"), ("process_max_fds", "gauge"),
                             ("process_start_time_seconds", "gauge")):
            self.assertIn("# TYPE %s %s" % (family, kind), text)
        pid = self.server.proc.pid
        # Open descriptors: what /proc shows for the server, give or take the
        # connections that come and go meanwhile.
        fds = len(os.listdir("/proc/%d/fd" % pid))
        self.assertLess(abs(metric(text, "process_open_fds") - fds), 8, (fds, text))
        with open("/proc/%d/statm" % pid) as f:
            rss = int(f.read().split()[1]) * os.sysconf("SC_PAGE_SIZE")
        self.assertLess(abs(metric(text, "process_resident_memory_bytes") - rss), rss / 2)
        start = metric(text, "process_start_time_seconds")
        self.assertLess(abs(start - (time.time() - (time.monotonic() - self.started_at))), 30)
        # CPU time only grows: burn some with requests and look again.
        cpu = metric(text, "process_cpu_seconds_total")
        for i in range(200):
            self.server.http("GET", "/readyz")
        _, text = self.server.http("GET", "/metrics")
        self.assertGreater(metric(text, "process_cpu_seconds_total"), cpu)

    def setUp(self):
        self.started_at = time.monotonic()
        super().setUp()


if __name__ == "__main__":
    unittest.main()
