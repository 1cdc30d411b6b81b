"""Request bytes gRPC calls may hold (--grpc-request-bytes-held): gRPC reads
a call's request message whole before keyflowd sees the call, and the call
keeps it until it is answered, while the engine's queue is bounded by count
(8192 commands a partition, each message up to 20 MiB). Calls that would
take the bytes held past the limit are refused RESOURCE_EXHAUSTED at once,
naming the limit, and change nothing; the calls taken are answered as usual.

A stuck disk makes the calls wait: the fail_sync shim holds every fsync
while a trigger file exists, so the engines stop in their group commit and
the calls sent meanwhile stay in front of them.

Run (Debian's Python):
  KEYFLOW_BUILD_DIR=build PYENV_VERSION=system python3 -m unittest -v test_grpc_limits
"""

import os
import sys
import tempfile
import unittest

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import harness  # noqa: E402
from harness import wait_until  # noqa: E402

harness.stubs()
import grpc  # noqa: E402
from keyflow.v1 import coordinators_pb2 as C  # noqa: E402
from keyflow.v1 import coordinators_pb2_grpc as CG  # noqa: E402

SYNC_SHIM = os.path.join(harness.BUILD, "tests", "e2e", "kf_fail_sync.so")
LIMIT = 4 * 1024 * 1024
CALLS = 12
EVENTS_PER_CALL = 5
INPUT_BYTES = 220 * 1024  # under the 256 KiB an event may carry


def metric(text, name):
    for line in text.split("\n"):
        if line.startswith(name + " "):
            return float(line.split()[1])
    return 0.0


class GrpcRequestBytesTest(unittest.TestCase):
    @unittest.skipUnless(os.path.exists(SYNC_SHIM), "needs the fail_sync shim of the build")
    def test_calls_past_the_request_bytes_held_are_refused_and_change_nothing(self):
        stall = os.path.join(tempfile.mkdtemp(prefix="kf-stall-"), "stall")
        env = {"LD_PRELOAD": SYNC_SHIM, "KEYFLOW_TEST_STALL_SYNC_FILE": stall,
               # Under ASan the shim comes before the sanitizer's runtime.
               "ASAN_OPTIONS": os.environ.get("ASAN_OPTIONS", "") + ":verify_asan_link_order=0"}
        server = harness.Keyflowd(args=["--grpc-request-bytes-held", "4MiB"], env=env)
        self.addCleanup(server.cleanup)
        self.addCleanup(lambda: os.path.exists(stall) and os.unlink(stall))
        server.start()
        channel = grpc.insecure_channel(server.grpc_target,
                                        options=[("grpc.max_send_message_length", 32 << 20)])
        self.addCleanup(channel.close)
        stub = CG.CoordinatorsStub(channel)
        rule = C.Rule(kind=C.RULE_KIND_DEBOUNCE, window_ms=600000)
        payload = '"%s"' % ("x" * INPUT_BYTES)

        def request(key):
            return C.SendEventsRequest(events=[
                C.SendEventRequest(workflow="wf", key=key, event=C.Event(rule=rule, input_json=payload))
                for _ in range(EVENTS_PER_CALL)])

        size = request("k00").ByteSize()
        self.assertGreater(size, 1024 * 1024)
        taken_max = LIMIT // size  # at most this many fit under the limit

        # The disk sticks: every call sent now waits in front of an engine.
        open(stall, "w").close()
        keys = ["k%02d" % i for i in range(CALLS)]
        futures = {k: stub.SendEvents.future(request(k), timeout=120) for k in keys}

        def refused():
            return [k for k, f in futures.items() if f.done() and f.exception() is not None]

        # All 12 calls (13 MiB) arrive; those past 4 MiB are answered at
        # once, while the disk is still stuck. Before the limit every one
        # waited, holding its message.
        wait_until(lambda: len(refused()) >= CALLS - taken_max, 30,
                   "the calls past the limit to be refused")
        for k in refused():
            e = futures[k].exception()
            self.assertEqual(e.code(), grpc.StatusCode.RESOURCE_EXHAUSTED, e.details())
            self.assertIn("queued request bytes", e.details())
            self.assertIn("limit of %d" % LIMIT, e.details())
        self.assertFalse(all(f.done() for f in futures.values()), "the calls taken wait for the disk")
        status, text = server.http("GET", "/metrics")
        self.assertGreaterEqual(metric(text, "keyflow_grpc_requests_refused_bytes_total"),
                                CALLS - taken_max)

        # The disk comes back: the calls taken are answered as usual.
        os.unlink(stall)
        for k, f in futures.items():
            if f.exception() is None:
                self.assertEqual(len(f.result().results), EVENTS_PER_CALL)
        refused_keys = set(refused())
        taken = [k for k in keys if k not in refused_keys]
        self.assertGreaterEqual(len(taken), 1)
        self.assertLessEqual(len(taken), taken_max)
        # A refused call changed nothing: its key has no coordinator.
        for k in keys:
            ref = C.CoordinatorRef(kind=C.RULE_KIND_DEBOUNCE, workflow="wf", key=k)
            d = stub.DescribeCoordinator(C.DescribeCoordinatorRequest(coordinator=ref), timeout=30)
            if k in refused_keys:
                self.assertFalse(d.exists, k)
            else:
                self.assertEqual(d.window.event_count, EVENTS_PER_CALL, k)
        # With nothing held, a call of any size within the message bound is
        # taken again.
        self.assertEqual(len(stub.SendEvents(request("after"), timeout=60).results), EVENTS_PER_CALL)
        self.assertEqual(server.stop(), 0)


def varint(n):
    out = b""
    while True:
        byte, n = n & 0x7F, n >> 7
        out += bytes([byte | (0x80 if n else 0)])
        if not n:
            return out


class LongLivedStreamRequestsTest(unittest.TestCase):
    """Health, reflection and TailOutput streams stay open as long as the
    client likes and hold their first request's bytes meanwhile; health and
    reflection need no key. A hostile audit held the whole
    --grpc-request-bytes-held with seven idle 19 MiB Watch requests, so every
    other call was refused. Their requests are bounded by size instead."""

    def test_oversize_stream_requests_are_refused_and_hold_nothing(self):
        from grpc.health.v1 import health_pb2 as H
        from grpc.health.v1 import health_pb2_grpc as HG
        server = harness.Keyflowd(args=["--grpc-request-bytes-held", "1MiB"])
        self.addCleanup(server.cleanup)
        server.start()
        channel = grpc.insecure_channel(server.grpc_target)
        self.addCleanup(channel.close)
        health = HG.HealthStub(channel)
        # A Watch whose request would hold most of the 1 MiB: refused at once.
        watch = health.Watch(H.HealthCheckRequest(service="x" * 900000), timeout=30)
        with self.assertRaises(grpc.RpcError) as cm:
            next(watch)
        self.assertEqual(cm.exception.code(), grpc.StatusCode.RESOURCE_EXHAUSTED)
        self.assertIn("at most 4096", cm.exception.details())
        # Reflection: a 70 KB host name (field 1) in the first request.
        reflect = channel.stream_stream(
            "/grpc.reflection.v1alpha.ServerReflection/ServerReflectionInfo")
        big = b"\x0a" + varint(70000) + b"h" * 70000
        with self.assertRaises(grpc.RpcError) as cm:
            list(reflect(iter([big]), timeout=30))
        self.assertEqual(cm.exception.code(), grpc.StatusCode.RESOURCE_EXHAUSTED)
        self.assertIn("at most 65536", cm.exception.details())
        # A well-formed Watch stays open and holds next to nothing: a call of
        # 900 KB is still taken beside it.
        ok_watch = health.Watch(H.HealthCheckRequest(service=""), timeout=60)
        self.addCleanup(ok_watch.cancel)
        self.assertEqual(next(ok_watch).status, H.HealthCheckResponse.SERVING)
        stub = CG.CoordinatorsStub(channel)
        event = C.Event(rule=C.Rule(kind=C.RULE_KIND_DEBOUNCE, window_ms=600000),
                        input_json='"%s"' % ("y" * 200000))
        reply = stub.SendEvents(C.SendEventsRequest(events=[
            C.SendEventRequest(workflow="wf", key="k%d" % i, event=event) for i in range(4)]),
            timeout=30)
        self.assertEqual(len(reply.results), 4)
        ok_watch.cancel()
        self.assertEqual(server.stop(), 0)


if __name__ == "__main__":
    unittest.main()
