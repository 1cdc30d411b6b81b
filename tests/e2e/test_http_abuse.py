"""End-to-end tests of the HTTP gateway under abuse: slowloris clients, a
body larger than the bound, a body large enough to take seconds to decode.
Each attack runs against the real keyflowd while a probe checks that
/healthz is still answered (that it is answered, not how fast: timings are
bench/'s business).

Run (Debian's Python):
  cd /work/main && KEYFLOW_BUILD_DIR=build PYENV_VERSION=system \
      python3 -m unittest discover -s tests/e2e -p 'test_http_abuse.py' -v
"""

import json
import os
import resource
import select
import socket
import sys
import threading
import time
import unittest
import urllib.request

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import harness  # noqa: E402
from harness import wait_until  # noqa: E402

CONNECTIONS_MAX = 4096  # KF_HTTP_CONNECTIONS_MAX


def read_response(sock, timeout):
    """Reads one HTTP/1.1 response (with a Content-Length) from sock;
    returns (status, headers dict, body bytes). Raises socket.timeout."""
    sock.settimeout(timeout)
    data = b""
    while b"\r\n\r\n" not in data:
        chunk = sock.recv(65536)
        if not chunk:
            raise ConnectionError("closed before a response: %r" % data)
        data += chunk
    head, body = data.split(b"\r\n\r\n", 1)
    lines = head.decode("latin-1").split("\r\n")
    status = int(lines[0].split()[1])
    headers = {k.strip().lower(): v.strip() for k, v in (l.split(":", 1) for l in lines[1:])}
    length = int(headers.get("content-length", "0"))
    while len(body) < length:
        chunk = sock.recv(65536)
        if not chunk:
            break
        body += chunk
    return status, headers, body


def get(port, path, source="127.0.0.1", timeout=10):
    """GET on a new connection from `source`; returns (status, parsed body)."""
    s = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    try:
        s.settimeout(timeout)
        s.bind((source, 0))
        s.connect(("127.0.0.1", port))
        s.sendall(("GET %s HTTP/1.1\r\nHost: localhost\r\nConnection: close\r\n\r\n" % path).encode())
        status, _, body = read_response(s, timeout)
        return status, json.loads(body)
    finally:
        s.close()


def closed_by_server(socks):
    """How many of the non-blocking sockets the server closed (a read
    gives EOF or an error)."""
    n = 0
    for s in socks:
        try:
            if s.recv(1) == b"":
                n += 1
        except BlockingIOError:
            pass
        except OSError:
            n += 1
    return n


class Slowloris:
    """Many connections that send the start of a request head and nothing
    more, each from one of `sources`, without blocking on any of them."""

    def __init__(self, port, count, sources):
        self.socks = []
        for i in range(count):
            s = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
            s.setblocking(False)
            s.bind((sources[i % len(sources)], 0))
            s.connect_ex(("127.0.0.1", port))
            self.socks.append(s)
        # Connected (by the kernel's accept queue, whether keyflowd accepted
        # them or not): send the first line and one header, never the end.
        pending = {s.fileno(): s for s in self.socks}
        poller = select.poll()
        for fd in pending:
            poller.register(fd, select.POLLOUT)
        deadline = time.time() + 30
        while pending and time.time() < deadline:
            for fd, _ in poller.poll(1000):
                try:
                    pending[fd].send(b"GET /healthz HTTP/1.1\r\nHost: localhost\r\n")
                except OSError:
                    pass
                poller.unregister(fd)
                del pending[fd]

    def closed_by_server(self):
        return closed_by_server(self.socks)

    def close(self):
        for s in self.socks:
            s.close()


class HttpAbuseTest(unittest.TestCase):
    @classmethod
    def setUpClass(cls):
        soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
        want = CONNECTIONS_MAX + 1000
        if soft < want:
            if hard < want:
                raise unittest.SkipTest("needs %d descriptors (the hard limit is %d)" % (want, hard))
            resource.setrlimit(resource.RLIMIT_NOFILE, (want, hard))

    def start(self, *args):
        server = harness.Keyflowd(args=["--probe-address", "127.0.0.1:0"] + list(args)).start()
        self.addCleanup(server.cleanup)
        with open(os.path.join(server.data_dir, "ports")) as f:
            ports = dict(line.split("=") for line in f.read().split())
        server.probe_port = int(ports["probe"])
        self.server = server
        return server

    def tearDown(self):
        harness.log_on_failure(self, getattr(self, "server", None))

    def test_a_slowloris_from_one_address_leaves_the_gateway_to_the_others(self):
        server = self.start("--http-connections-per-address", "32")
        wave = Slowloris(server.http_port, CONNECTIONS_MAX + 100, ["127.0.0.1"])
        self.addCleanup(wave.close)
        # All but 32 were closed at once, so another address is served...
        wait_until(lambda: wave.closed_by_server() >= CONNECTIONS_MAX + 100 - 32, 30,
                   "the connections past 32 from one address to be closed")
        self.assertEqual(get(server.http_port, "/healthz", source="127.0.0.2"), (200, {"status": "ok"}))
        # ... and so is that one, once its 32 are gone.
        wave.close()
        wait_until(lambda: get(server.http_port, "/healthz")[0] == 200, 30,
                   "/healthz from 127.0.0.1 again")
        self.assertIn("keyflow_http_connections_refused_total",
                      get_text(server.probe_port, "/metrics"))
        self.assertEqual(server.stop(), 0)

    def test_a_slowloris_at_the_connection_bound_leaves_the_probes_answered(self):
        server = self.start("--http-connections-per-address", "32", "--http-header-timeout-ms", "1500")
        sources = ["127.0.0.%d" % i for i in range(2, 2 + CONNECTIONS_MAX // 32 + 4)]
        wave = Slowloris(server.http_port, CONNECTIONS_MAX + 100, sources)
        self.addCleanup(wave.close)
        # The gateway is full, or closing heads that never end: the probe
        # listener answers all the while.
        for path, want in (("/healthz", {"status": "ok"}), ("/readyz", {"status": "ready"})):
            self.assertEqual(get(server.probe_port, path), (200, want))
        # No complete request head within the header timeout: every one of
        # them is closed by the server, and the gateway serves again.
        wait_until(lambda: wave.closed_by_server() == len(wave.socks), 60,
                   "every slowloris connection to be closed")
        self.assertEqual(get(server.http_port, "/healthz"), (200, {"status": "ok"}))
        self.assertEqual(server.stop(), 0)

    def test_a_body_that_stops_coming_is_cut_at_the_body_timeout(self):
        server = self.start("--http-body-timeout-ms", "1000")
        s = socket.create_connection(("127.0.0.1", server.http_port), timeout=30)
        self.addCleanup(s.close)
        s.sendall(b"POST /v1/workflows/w/keys/k/events HTTP/1.1\r\nHost: localhost\r\n"
                  b"Content-Length: 1000\r\n\r\n{\"input\":")
        s.settimeout(30)
        self.assertEqual(s.recv(1), b"", "the server closes the connection")

    def test_a_body_over_the_bound_is_refused_unread_in_json(self):
        server = self.start()
        s = socket.create_connection(("127.0.0.1", server.http_port), timeout=30)
        self.addCleanup(s.close)
        # The head only: the answer comes from the Content-Length.
        s.sendall(b"POST /v1/workflows/w/keys/k/events HTTP/1.1\r\nHost: localhost\r\n"
                  b"Content-Type: application/json\r\nContent-Length: 30000000\r\n\r\n")
        status, headers, body = read_response(s, 30)
        self.assertEqual(status, 413)
        self.assertEqual(headers.get("content-type"), "application/json")
        doc = json.loads(body)
        self.assertEqual((doc["code"], doc["status"]), (8, "RESOURCE_EXHAUSTED"))
        self.assertIn("20971520", doc["message"])

    def test_bodies_held_past_the_gateway_s_bound_are_shed_largest_first(self):
        # Ten connections from one address each send 18 MiB of a 19 MiB
        # body and stop: 180 MiB held, past KF_HTTP_BUFFERED_BYTES_MAX
        # (128 MiB). Before the bound all ten were kept until the body
        # timeout (30 s), and 64 such connections took 508 MiB of RSS.
        server = self.start()
        declared, sent = 19 * 1024 * 1024, 18 * 1024 * 1024
        chunk = b"x" * (1024 * 1024)
        socks = []
        self.addCleanup(lambda: [s.close() for s in socks])
        for _ in range(10):
            s = socket.create_connection(("127.0.0.1", server.http_port), timeout=30)
            socks.append(s)
            try:
                s.sendall(b"POST /v1/workflows/w/keys/k/events HTTP/1.1\r\nHost: localhost\r\n"
                          b"Content-Type: application/json\r\nContent-Length: %d\r\n\r\n" % declared)
                for _ in range(sent // len(chunk)):
                    s.sendall(chunk)
            except OSError:
                pass  # shed while it was sending

        def closed():
            for s in socks:
                s.setblocking(False)
            return closed_by_server(socks)

        # At most 7 x 18 MiB = 126 MiB may stay: at least 3 are closed, well
        # before the 30 s body timeout.
        wait_until(lambda: closed() >= 3, 15, "connections past the bound to be closed")
        self.assertGreater(metric(get_text(server.probe_port, "/metrics"),
                                  "keyflow_http_connections_shed_total"), 0)
        self.assertEqual(get(server.http_port, "/healthz"), (200, {"status": "ok"}))
        for s in socks:
            s.close()
        self.assertEqual(server.stop(), 0)

    def test_http2_bodies_held_past_the_gateway_s_bound_are_refused_stream_by_stream(self):
        # One h2c connection sends 18 MiB on each of ten streams and ends
        # none: 180 MiB held, past KF_HTTP_BUFFERED_BYTES_MAX (128 MiB).
        # h2o buffers each stream's body whole and gives the window back as
        # it arrives (16 MiB a stream, 100 streams), so before the bound all
        # of it stayed for as long as the connection lived.
        from h2client import H2Connection
        server = self.start()
        conn = H2Connection(server.http_port)
        self.addCleanup(conn.close)
        # A request answered first: the connection is known to be HTTP/2 and
        # held to the body deadline (30 s), not the head's.
        self.assertEqual(conn.get("/healthz")[0], 200)
        sent = []
        for _ in range(10):
            stream = conn.open("POST", "/v1/workflows/w/keys/k/events",
                               headers=[("content-type", "application/json")])
            sent.append(conn.send_body(stream, 18 * 1024 * 1024))
        # At most 7 x 18 MiB = 126 MiB may stay: at least 3 streams are
        # refused, and the connection goes on.
        wait_until(lambda: len(conn.refused()) >= 3, 15, "streams past the bound to be refused")
        self.assertEqual(conn.get("/healthz")[0], 200)
        self.assertIsNone(conn.goaway)
        self.assertGreaterEqual(metric(get_text(server.probe_port, "/metrics"),
                                       "keyflow_http_streams_shed_total"), 3)
        self.assertEqual(metric(get_text(server.probe_port, "/metrics"),
                                "keyflow_http_connections_shed_total"), 0)
        conn.close()
        self.assertEqual(server.stop(), 0)

    def test_a_large_body_is_decoded_off_the_loop(self):
        server = self.start()
        # A 16 MB event: decoding it takes on the order of a second (then
        # its input is refused for its size).
        body = json.dumps({"rule": {"kind": "debounce", "windowMs": 1000},
                           "input": {"a": ["x" * 100] * 160000}}).encode()
        self.assertGreater(len(body), 16 * 1000 * 1000)
        result = {}

        def post():
            req = urllib.request.Request(server.http_base + "/v1/workflows/w/keys/k/events",
                                         data=body, method="POST")
            try:
                urllib.request.urlopen(req, timeout=120)
            except urllib.error.HTTPError as e:
                result["status"], result["body"] = e.code, json.loads(e.read())

        t = threading.Thread(target=post)
        t.start()
        self.addCleanup(t.join, 120)
        # While a worker decodes it (the probe listener's /metrics says so)...
        wait_until(lambda: "\nkeyflow_http_offloading 1\n" in get_text(server.probe_port, "/metrics"),
                   60, "the body to be handed to a worker", interval=0.005)
        # ... the gateway's own loop answers /healthz, before that body's
        # answer comes.
        self.assertEqual(get(server.http_port, "/healthz"), (200, {"status": "ok"}))
        self.assertTrue(t.is_alive(), "the large body was answered first")
        t.join(120)
        self.assertEqual(result.get("status"), 413, result)
        self.assertIn("event.input", result["body"]["message"])
        self.assertEqual(server.stop(), 0)

    def test_large_answers_and_http2_bodies_go_through_the_workers(self):
        """The paths the attack tests do not take: a response rendered by a
        worker (sent from its memory, no copy), and an HTTP/2 body (copied
        before a worker decodes it), both arriving whole."""
        import shutil
        import subprocess
        server = self.start()
        big = "y" * (200 * 1024)
        status, body = server.http("POST", "/v1/workflows/w/keys/k/events",
                                   {"rule": {"kind": "batch", "maxEvents": 1}, "input": big})
        self.assertEqual(status, 200, body)
        run_id = body["receipt"]["runId"]
        status, body = server.http("POST", "/v1/runs:poll", {"workflows": ["w"], "workerId": "w1"})
        self.assertEqual(status, 200, body)
        lease = body["runs"][0]["lease"]
        status, body = server.http("POST", "/v1/runs/%s:complete" % run_id,
                                   {"lease": lease, "result": {"r": big}})
        self.assertEqual(status, 200, body)
        before = metric(get_text(server.probe_port, "/metrics"), "keyflow_http_offloaded_total")
        status, run = server.http("GET", "/v1/runs/" + run_id)
        self.assertEqual(status, 200)
        self.assertEqual((run["input"], run["result"]), ([big], {"r": big}))
        after = metric(get_text(server.probe_port, "/metrics"), "keyflow_http_offloaded_total")
        self.assertEqual(after, before + 1, "the answer was rendered by a worker")
        if shutil.which("curl") is None:
            return
        doc = json.dumps({"rule": {"kind": "debounce", "windowMs": 60000}, "input": big})
        p = subprocess.run(["curl", "-s", "--http2-prior-knowledge", "-w", "\n%{http_version}",
                            "-XPOST", "--data-binary", "@-",
                            server.http_base + "/v1/workflows/w/keys/h2/events"],
                           input=doc.encode(), capture_output=True, timeout=60)
        out, version = p.stdout.decode().rsplit("\n", 1)
        self.assertEqual(version, "2")
        self.assertTrue(json.loads(out)["receipt"]["runId"].startswith("h2@"), out)
        self.assertEqual(metric(get_text(server.probe_port, "/metrics"), "keyflow_http_offloaded_total"),
                         after + 1)
        self.assertEqual(server.stop(), 0)


def metric(text, name):
    for line in text.split("\n"):
        if line.startswith(name + " "):
            return float(line.split()[1])
    return 0.0


def get_text(port, path):
    with urllib.request.urlopen("http://127.0.0.1:%d%s" % (port, path), timeout=10) as r:
        return r.read().decode()


if __name__ == "__main__":
    unittest.main()
