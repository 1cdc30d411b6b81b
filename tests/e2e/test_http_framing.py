"""End-to-end tests of how the gateway frames HTTP/1 requests, over raw
sockets: a request whose body's end is ambiguous (two different
Content-Length values, or Transfer-Encoding with Content-Length) is refused
with 400 and its connection closed, so that what follows it on the
connection is never taken for a request (request smuggling behind a proxy
that frames the other way, RFC 9112 section 6.3); a request head past
KF_HTTP_HEADER_BYTES_MAX is refused with 431, whether it arrived whole or is
still arriving.

Each refused request is followed, on the same connection, by a SendEvent
that would make a run: that no run exists afterwards shows it was not
executed.

Run (Debian's Python):
  cd /work/main && KEYFLOW_BUILD_DIR=build PYENV_VERSION=system \\
      python3 -m unittest discover -s tests/e2e -p 'test_http_framing.py' -v
"""

import json
import os
import socket
import sys
import unittest
import urllib.parse

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import harness  # noqa: E402

HEADER_BYTES_MAX = 32 * 1024  # KF_HTTP_HEADER_BYTES_MAX
EVENT = json.dumps({"input": 1, "rule": {"kind": "batch", "maxEvents": 1}}).encode()


def send_event(workflow, key="k", extra=b""):
    """A whole SendEvent request that makes a run at once (BATCH of 1)."""
    return (b"POST /v1/workflows/%s/keys/%s/events HTTP/1.1\r\nHost: localhost\r\n"
            b"Content-Type: application/json\r\nContent-Length: %d\r\n%s\r\n%s"
            % (workflow.encode(), key.encode(), len(EVENT), extra, EVENT))


def read_all(sock, timeout=30):
    """Everything the server sends until it closes the connection (EOF or a
    reset after its answer)."""
    sock.settimeout(timeout)
    data = b""
    while True:
        try:
            chunk = sock.recv(65536)
        except ConnectionResetError:
            return data, "reset"
        if not chunk:
            return data, "eof"
        data += chunk


def responses(data):
    """The HTTP/1.1 responses (with Content-Length) in data, in order:
    [(status, headers, body)]."""
    out = []
    while data:
        head, sep, rest = data.partition(b"\r\n\r\n")
        if not sep:
            raise AssertionError("a partial response: %r" % data)
        lines = head.decode("latin-1").split("\r\n")
        headers = {k.strip().lower(): v.strip() for k, v in (l.split(":", 1) for l in lines[1:])}
        length = int(headers.get("content-length", "0"))
        out.append((int(lines[0].split()[1]), headers, rest[:length]))
        data = rest[length:]
    return out


class HttpFramingTest(unittest.TestCase):
    @classmethod
    def setUpClass(cls):
        cls.server = harness.class_server(cls)
        cls.addClassCleanup(harness.stopped, cls.server)

    def tearDown(self):
        harness.log_on_failure(self, self.server)

    def exchange(self, raw):
        """Sends raw bytes on a new connection; returns the responses and
        how the connection ended."""
        with socket.create_connection(("127.0.0.1", self.server.http_port), timeout=30) as s:
            s.sendall(raw)
            data, end = read_all(s)
        return responses(data), end

    def runs(self, workflow):
        status, body = self.server.http("GET", "/v1/runs?workflow=" + urllib.parse.quote(workflow))
        self.assertEqual(status, 200, body)
        return body["runs"]

    def assert_refused(self, raw, workflow, status, words):
        """raw is refused with `status` and a JSON body whose message holds
        `words`, the connection is closed after that one answer, and the
        SendEvent on `workflow` that followed in raw made no run."""
        answers, end = self.exchange(raw)
        self.assertEqual(len(answers), 1, answers)
        got, headers, body = answers[0]
        self.assertEqual(got, status, body)
        self.assertEqual(headers.get("content-type"), "application/json")
        self.assertEqual(headers.get("connection"), "close")
        doc = json.loads(body)
        self.assertEqual(set(doc), {"code", "status", "message"}, doc)
        for word in words:
            self.assertIn(word, doc["message"])
        self.assertIn(end, ("eof", "reset"))
        self.assertEqual(self.runs(workflow), [], "the pipelined SendEvent was executed")

    def test_two_different_content_lengths_are_refused_and_the_connection_closed(self):
        second = send_event("smuggled-cl")
        # h2o frames by the first Content-Length: with the shorter first,
        # the second request follows the body; with the longer first, it is
        # the body's tail. Refused either way, and never run.
        for i, (first, other) in enumerate(((len(EVENT), len(EVENT) + len(second)),
                                            (len(EVENT) + len(second), len(EVENT)))):
            raw = (b"POST /v1/workflows/front-cl/keys/k%d/events HTTP/1.1\r\nHost: localhost\r\n"
                   b"Content-Type: application/json\r\nContent-Length: %d\r\n"
                   b"Content-Length: %d\r\n\r\n%s%s" % (i, first, other, EVENT, second))
            self.assert_refused(raw, "smuggled-cl", 400, ["content-length", "ambiguous"])
        self.assertEqual(self.runs("front-cl"), [])

    def test_transfer_encoding_with_content_length_is_refused_and_the_connection_closed(self):
        second = send_event("smuggled-te")
        chunked = b"%x\r\n%s\r\n0\r\n\r\n" % (len(EVENT), EVENT)
        for i, order in enumerate((b"Transfer-Encoding: chunked\r\nContent-Length: %d\r\n",
                                   b"Content-Length: %d\r\nTransfer-Encoding: chunked\r\n")):
            # A proxy framing by Content-Length sees the chunked body and
            # the second request as one body; h2o (chunked) sees two
            # requests.
            raw = (b"POST /v1/workflows/front-te/keys/k%d/events HTTP/1.1\r\nHost: localhost\r\n"
                   b"Content-Type: application/json\r\n" % i
                   + order % (len(chunked) + len(second)) + b"\r\n" + chunked + second)
            self.assert_refused(raw, "smuggled-te", 400, ["transfer-encoding", "content-length"])
        self.assertEqual(self.runs("front-te"), [])

    def test_the_same_content_length_twice_is_served_and_the_connection_kept(self):
        # Not ambiguous (RFC 9110 section 8.6 lets a recipient take it): both
        # requests are answered on the one connection.
        with socket.create_connection(("127.0.0.1", self.server.http_port), timeout=30) as s:
            s.sendall(send_event("twice-same", "a", b"Content-Length: %d\r\n" % len(EVENT))
                      + send_event("twice-same", "b")
                      + b"GET /healthz HTTP/1.1\r\nHost: localhost\r\nConnection: close\r\n\r\n")
            data, _ = read_all(s)
        self.assertEqual([a[0] for a in responses(data)], [200, 200, 200])
        self.assertEqual(len(self.runs("twice-same")), 2)

    def test_a_head_past_the_bound_is_refused_with_431(self):
        big = b"X-Padding: " + b"p" * (HEADER_BYTES_MAX + 100) + b"\r\n"
        # Whole: refused by the handler, the SendEvent after it never run.
        self.assert_refused(send_event("big-head", extra=big) + send_event("after-big-head"),
                            "after-big-head", 431, ["request head", str(HEADER_BYTES_MAX)])
        self.assertEqual(self.runs("big-head"), [])
        # Still arriving (no end in sight): refused without waiting for the
        # header timeout.
        answers, end = self.exchange(
            b"GET /healthz HTTP/1.1\r\nHost: localhost\r\n" + big + big)
        self.assertEqual(len(answers), 1, answers)
        status, headers, body = answers[0]
        self.assertEqual(status, 431, body)
        self.assertEqual(headers.get("content-type"), "application/json")
        doc = json.loads(body)
        self.assertEqual(doc["status"], "RESOURCE_EXHAUSTED")
        self.assertIn(str(HEADER_BYTES_MAX), doc["message"])
        self.assertIn(end, ("eof", "reset"))
        # A head under the bound is served.
        small = b"X-Padding: " + b"p" * (HEADER_BYTES_MAX - 1024) + b"\r\n"
        answers, _ = self.exchange(
            b"GET /healthz HTTP/1.1\r\nHost: localhost\r\nConnection: close\r\n" + small + b"\r\n")
        self.assertEqual([a[0] for a in answers], [200])


if __name__ == "__main__":
    unittest.main()
