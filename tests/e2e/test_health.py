"""Health of the real keyflowd, as Kubernetes and gRPC health clients see it:
Health/Watch streams every change, an unknown service is SERVICE_UNKNOWN
(Watch) or NOT_FOUND (Check), gRPC health and /readyz always agree, and a
SIGTERM follows a rollout's order: readiness goes NOT_SERVING first, both
listeners keep serving requests (new connections too) for --drain-grace-ms,
then the server stops. A failed sync (fail-stop) turns NOT_SERVING at once
and the process exits 1; what every partition holds is told why.

Run (Debian's Python):
  KEYFLOW_BUILD_DIR=build PYENV_VERSION=system python3 -m unittest -v test_health
"""

import os
import queue
import signal
import sys
import tempfile
import threading
import unittest
import urllib.request
import uuid

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import harness  # noqa: E402
from harness import wait_until  # noqa: E402

harness.stubs()
import grpc  # noqa: E402
from grpc.health.v1 import health_pb2 as H  # noqa: E402
from grpc.health.v1 import health_pb2_grpc as HG  # noqa: E402
from grpc.reflection.v1 import reflection_pb2 as RF  # noqa: E402
from keyflow.v1 import coordinators_pb2 as C  # noqa: E402
from keyflow.v1 import coordinators_pb2_grpc as CG  # noqa: E402
from keyflow.v1 import runs_pb2 as R  # noqa: E402
from keyflow.v1 import runs_pb2_grpc as RG  # noqa: E402

SERVING = H.HealthCheckResponse.SERVING
NOT_SERVING = H.HealthCheckResponse.NOT_SERVING
SERVICE_UNKNOWN = H.HealthCheckResponse.SERVICE_UNKNOWN
FAIL_SYNC_LIB = os.path.join(harness.BUILD, "tests", "e2e", "kf_fail_sync.so")


def built_with_systemd():
    """Whether CMake found libsystemd for this build (main/notify.h)."""
    try:
        with open(os.path.join(harness.BUILD, "CMakeCache.txt")) as f:
            return "SYSTEMD_FOUND:INTERNAL=1" in f.read()
    except OSError:
        return False


class Watcher:
    """One Health/Watch stream read on its own thread into a queue."""

    def __init__(self, target, service=""):
        self.channel = grpc.insecure_channel(target)
        self.statuses = queue.Queue()
        self.end = None
        self.call = HG.HealthStub(self.channel).Watch(H.HealthCheckRequest(service=service),
                                                      timeout=120)
        self.thread = threading.Thread(target=self._read, daemon=True)
        self.thread.start()

    def _read(self):
        try:
            for m in self.call:
                self.statuses.put(m.status)
            self.end = "eof"
        except grpc.RpcError as e:
            self.end = e.code()
        self.statuses.put(None)

    def next(self, timeout=20):
        try:
            return self.statuses.get(timeout=timeout)
        except queue.Empty:
            raise AssertionError("no health message within %ss" % timeout)

    def close(self):
        self.call.cancel()
        self.channel.close()


class HealthTest(unittest.TestCase):
    def start(self, args=(), env=None):
        self.server = harness.Keyflowd(args=list(args), env=env).start()
        self.addCleanup(self.server.cleanup)
        self.channel = grpc.insecure_channel(self.server.grpc_target)
        self.addCleanup(self.channel.close)
        self.health = HG.HealthStub(self.channel)
        return self.server

    def tearDown(self):
        harness.log_on_failure(self, getattr(self, "server", None))

    def watch(self, service=""):
        w = Watcher(self.server.grpc_target, service)
        self.addCleanup(w.close)
        return w

    def check(self, service=""):
        return self.health.Check(H.HealthCheckRequest(service=service), timeout=10).status

    def readyz(self):
        return self.server.http("GET", "/readyz")[0]

    def send_event(self, target, key):
        """SendEvent over a fresh connection (a new client arriving)."""
        with grpc.insecure_channel(target) as ch:
            rule = C.Rule(kind=C.RULE_KIND_DEBOUNCE, window_ms=60000)
            return CG.CoordinatorsStub(ch).SendEvent(C.SendEventRequest(
                workflow="wf", key=key, event=C.Event(rule=rule, input_json="1")), timeout=10)

    def served_services(self):
        """The services the server says it serves (reflection's list)."""
        with grpc.insecure_channel(self.server.grpc_target) as ch:
            info = ch.stream_stream("/grpc.reflection.v1.ServerReflection/ServerReflectionInfo",
                                    request_serializer=RF.ServerReflectionRequest.SerializeToString,
                                    response_deserializer=RF.ServerReflectionResponse.FromString)
            answer, = info(iter([RF.ServerReflectionRequest(list_services="")]), timeout=10)
        return [s.name for s in answer.list_services_response.service]

    def test_unknown_services_and_check_agrees_with_readyz(self):
        self.start()
        self.assertEqual(self.check(), SERVING)
        self.assertEqual(self.readyz(), 200)
        # Every service reflection lists is one health knows: the keyflow
        # services, health itself and both reflection services.
        served = self.served_services()
        self.assertGreaterEqual(set(served), {
            "keyflow.v1.Coordinators", "keyflow.v1.Runs", "keyflow.v1.Functions",
            "keyflow.v1.Keys", "keyflow.v1.Workers", "grpc.health.v1.Health",
            "grpc.reflection.v1.ServerReflection", "grpc.reflection.v1alpha.ServerReflection"})
        for service in served:
            self.assertEqual(self.check(service), SERVING, service)
            w = self.watch(service)
            self.assertEqual(w.next(), SERVING, service)
        for service in ("nope.v1.Nothing", "keyflow.v1", "grpc.health.v1", "Health"):
            with self.assertRaises(grpc.RpcError) as e:
                self.check(service)
            self.assertEqual(e.exception.code(), grpc.StatusCode.NOT_FOUND, service)
            # Watch answers SERVICE_UNKNOWN and stays open (the service
            # could come), as the health protocol says.
            w = self.watch(service)
            self.assertEqual(w.next(), SERVICE_UNKNOWN, service)
            self.assertIsNone(w.end, "the stream stays open")
        status, body = self.server.http("GET", "/metrics")
        self.assertIn("\nkeyflow_ready 1\n", body)

    def test_sigterm_flips_readiness_first_serves_through_the_grace_then_stops(self):
        """The rollout order: NOT_SERVING is reported (Watch, Check,
        /readyz, the metric) while requests, on connections old and new,
        are still served; only then does the server stop. The grace is long
        here, and a second SIGTERM ends it (keyflowd's way to cut it short),
        so the test does not depend on how long steps take."""
        server = self.start(["--drain-grace-ms", "120000"])
        whole = self.watch("")
        runs = self.watch("keyflow.v1.Runs")
        self.assertEqual(whole.next(), SERVING)
        self.assertEqual(runs.next(), SERVING)
        old_http = urllib.request.build_opener()  # keep-alive is per request here; both are fine
        server.proc.send_signal(signal.SIGTERM)

        # 1. Readiness flips: every stream hears it, and every probe agrees.
        self.assertEqual(whole.next(), NOT_SERVING)
        self.assertEqual(runs.next(), NOT_SERVING)
        self.assertEqual(self.check(), NOT_SERVING)
        self.assertEqual(self.check("keyflow.v1.Runs"), NOT_SERVING)
        status, body = server.http("GET", "/readyz")
        self.assertEqual(status, 503, body)
        self.assertEqual(body["status"], "UNAVAILABLE")
        self.assertIn("\nkeyflow_ready 0\n", server.http("GET", "/metrics")[1])

        # 2. Still serving: gRPC on the open channel and on a new one, HTTP
        # on a new connection; a new Watch starts NOT_SERVING.
        rule = C.Rule(kind=C.RULE_KIND_DEBOUNCE, window_ms=60000)
        r = CG.CoordinatorsStub(self.channel).SendEvent(C.SendEventRequest(
            workflow="wf", key="during-drain-1", event=C.Event(rule=rule, input_json="1")),
            timeout=10)
        self.assertTrue(r.receipt.run_id.startswith("during-drain-1@"))
        r = self.send_event(server.grpc_target, "during-drain-2")
        self.assertTrue(r.receipt.run_id.startswith("during-drain-2@"))
        status, body = server.http("POST", "/v1/workflows/wf/keys/during-drain-3/events",
                                   {"rule": {"kind": "debounce", "windowMs": 60000}, "input": 3})
        self.assertEqual(status, 200, body)
        self.assertEqual(self.watch("").next(), NOT_SERVING)
        self.assertIsNone(server.proc.poll(), "still running during the grace")
        del old_http

        # 3. Then it stops (the second SIGTERM ends the grace), exits 0, and
        # the streams end.
        self.assertEqual(server.stop(), 0)
        wait_until(lambda: whole.end is not None and runs.end is not None, 20,
                   "the watches to end")
        log = server.read_log()
        order = [log.index(s) for s in ("not serving reason=draining", "draining signal=15",
                                        "drain cut short", "stopping signal=15", "stopped")]
        self.assertEqual(order, sorted(order), log)
        # What was accepted during the drain is durable.
        server.start()
        with grpc.insecure_channel(server.grpc_target) as ch:
            for k in ("during-drain-1", "during-drain-2", "during-drain-3"):
                d = CG.CoordinatorsStub(ch).DescribeCoordinator(C.DescribeCoordinatorRequest(
                    coordinator=C.CoordinatorRef(kind=C.RULE_KIND_DEBOUNCE, workflow="wf",
                                                 key=k)), timeout=10)
                self.assertTrue(d.HasField("window"), k)

    def test_grace_runs_out_then_the_server_stops(self):
        server = self.start(["--drain-grace-ms", "300"])
        w = self.watch()
        self.assertEqual(w.next(), SERVING)
        server.proc.send_signal(signal.SIGTERM)
        self.assertEqual(w.next(), NOT_SERVING)
        self.assertEqual(server.proc.wait(timeout=60), 0)
        server.proc = None
        server.log.close()
        log = server.read_log()
        self.assertIn("draining signal=15 grace_ms=300", log)
        self.assertNotIn("drain cut short", log)
        self.assertLess(log.index("draining"), log.index("stopping"))

    def test_drain_grace_flag_is_checked(self):
        import subprocess
        for value in ("-1", "300001", "x"):
            p = subprocess.run([harness.KEYFLOWD, "--drain-grace-ms", value], capture_output=True,
                               timeout=30)
            self.assertEqual(p.returncode, 2, value)
            self.assertIn("--drain-grace-ms must be an integer in 0..300000", p.stderr.decode())

    @unittest.skipUnless(built_with_systemd(), "keyflowd was built without libsystemd")
    def test_systemd_notify_ready_then_stopping(self):
        """Type=notify: systemd hears READY=1 once keyflowd serves (not when
        it starts recovering) and STOPPING=1 when SIGTERM arrives, with a
        STATUS line at each step. A datagram socket stands in for systemd's,
        which is all the protocol is."""
        import socket
        d = tempfile.mkdtemp(prefix="kf-notify-")
        path = os.path.join(d, "notify")
        sock = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM)
        sock.bind(path)
        sock.settimeout(30)
        self.addCleanup(sock.close)
        server = self.start(["--drain-grace-ms", "120000"], env={"NOTIFY_SOCKET": path})

        def next_message():
            return dict(line.split("=", 1) for line in sock.recv(4096).decode().split("\n"))

        self.assertEqual(next_message(), {"STATUS": "opening the store and recovering"})
        ready = next_message()
        self.assertEqual(ready.get("READY"), "1", ready)
        self.assertEqual(ready["STATUS"], "serving gRPC on %s, HTTP on 127.0.0.1:%d"
                         % (server.grpc_target, server.http_port))
        self.assertEqual(self.check(), SERVING, "READY means serving")
        server.proc.send_signal(signal.SIGTERM)
        draining = next_message()
        self.assertEqual(draining.get("STOPPING"), "1", draining)
        self.assertIn("draining", draining["STATUS"])
        self.assertEqual(self.check(), NOT_SERVING)
        self.assertEqual(server.stop(), 0)  # the second SIGTERM ends the grace
        stopping = next_message()
        self.assertEqual((stopping.get("STOPPING"), stopping["STATUS"]),
                         ("1", "stopping: finishing and syncing what was accepted"))

    @unittest.skipUnless(os.path.exists(FAIL_SYNC_LIB), "needs the fail_sync shim of the build")
    def test_failed_sync_turns_not_serving_at_once_and_exits_1(self):
        trigger = os.path.join(tempfile.mkdtemp(prefix="kf-fail-"), "fail-now")
        env = {"LD_PRELOAD": FAIL_SYNC_LIB, "KEYFLOW_TEST_FAIL_SYNC_FILE": trigger,
               # Under ASan the shim comes before the sanitizer's runtime.
               "ASAN_OPTIONS": os.environ.get("ASAN_OPTIONS", "") + ":verify_asan_link_order=0"}
        server = self.start(["--drain-grace-ms", "120000"], env=env)
        w = self.watch()
        self.assertEqual(w.next(), SERVING)
        self.send_event(server.grpc_target, "before")  # syncs work until the trigger exists
        open(trigger, "w").close()
        with self.assertRaises(grpc.RpcError) as cm:
            self.send_event(server.grpc_target, "after")  # never acknowledged
        # The call in flight is told what happened.
        self.assertEqual(cm.exception.code(), grpc.StatusCode.UNAVAILABLE)
        self.assertRegex(cm.exception.details(), r"^storage failure: .*, stopping$")
        self.assertEqual(w.next(), NOT_SERVING)
        # No drain grace for a failure: the process stops by itself, exit 1.
        self.assertEqual(server.proc.wait(timeout=60), 1)
        server.proc = None
        server.log.close()
        log = server.read_log()
        self.assertIn("fail-stop: a durable write failed", log)
        self.assertIn("not serving: failed", log)
        self.assertNotIn("draining", log)
        # The acknowledged event is there after a restart (the other one may
        # or may not be: it was written but never acknowledged).
        os.unlink(trigger)
        server.start()
        with grpc.insecure_channel(server.grpc_target) as ch:
            d = CG.CoordinatorsStub(ch).DescribeCoordinator(C.DescribeCoordinatorRequest(
                coordinator=C.CoordinatorRef(kind=C.RULE_KIND_DEBOUNCE, workflow="wf",
                                             key="before")), timeout=10)
            self.assertTrue(d.HasField("window"))

    @unittest.skipUnless(os.path.exists(FAIL_SYNC_LIB), "needs the fail_sync shim of the build")
    def test_a_failed_sync_in_one_partition_is_what_every_partition_answers(self):
        # 8 partitions (the default). A GetRun waits in one partition and a
        # poll is parked in all of them; then a sync fails in another
        # partition. The process stops, and the calls held by the partitions
        # whose own store did not fail are told the same: not an empty poll
        # or the waiting run's state at the stop, nor "shutting down".
        trigger = os.path.join(tempfile.mkdtemp(prefix="kf-fail-"), "fail-now")
        env = {"LD_PRELOAD": FAIL_SYNC_LIB, "KEYFLOW_TEST_FAIL_SYNC_FILE": trigger,
               "ASAN_OPTIONS": os.environ.get("ASAN_OPTIONS", "") + ":verify_asan_link_order=0"}
        server = self.start(env=env)
        ch = grpc.insecure_channel(server.grpc_target)
        self.addCleanup(ch.close)
        coords, runs = CG.CoordinatorsStub(ch), RG.RunsStub(ch)
        wf = "parts-" + uuid.uuid4().hex[:8]
        # A receipt's commit_seq names its partition (its remainder by 8).
        pending = coords.SendEvent(C.SendEventRequest(workflow=wf, key="run", event=C.Event(
            rule=C.Rule(kind=C.RULE_KIND_BATCH, max_events=1), input_json="1")), timeout=10)
        waiting_partition = pending.receipt.commit_seq % 8
        other = next(key for key in ("k-%d" % i for i in range(200))
                     if self.send_event(server.grpc_target, key).receipt.commit_seq % 8
                     != waiting_partition)
        answers = {}

        def call(name, fn):
            try:
                answers[name] = fn()
            except grpc.RpcError as e:
                answers[name] = e
        threads = [
            threading.Thread(target=call, args=("wait", lambda: runs.GetRun(R.GetRunRequest(
                run_id=pending.receipt.run_id, wait_ms=60000), timeout=90))),
            threading.Thread(target=call, args=("poll", lambda: runs.PollRuns(R.PollRunsRequest(
                workflows=[wf + "-idle"], worker_id="w", wait_ms=60000), timeout=90)))]
        for t in threads:
            t.start()

        def metric(name):
            text = server.http("GET", "/metrics")[1]
            return sum(int(line.split()[1]) for line in text.splitlines()
                       if line.startswith(name + " "))
        wait_until(lambda: metric("keyflow_run_waits") >= 1 and metric("keyflow_parked_polls") >= 8,
                   20, "the GetRun and the poll waiting")
        open(trigger, "w").close()
        with self.assertRaises(grpc.RpcError) as cm:
            self.send_event(server.grpc_target, other)
        self.assertRegex(cm.exception.details(), r"^storage failure: .*, stopping$")
        for t in threads:
            t.join(60)
        # (A call over every partition names the partition that answered.)
        for name in ("wait", "poll"):
            answer = answers.get(name)
            self.assertIsInstance(answer, grpc.RpcError, "%s answered %r" % (name, answer))
            self.assertEqual(answer.code(), grpc.StatusCode.UNAVAILABLE, name)
            self.assertRegex(answer.details(), r"^(partition \d: )?storage failure: .*, stopping$", name)
        self.assertEqual(server.proc.wait(timeout=60), 1)
        server.proc = None
        server.log.close()


if __name__ == "__main__":
    unittest.main()
