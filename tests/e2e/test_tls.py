"""TLS on both listeners of the real keyflowd (docs/security.md).

Certificates are made with openssl when the tests run (harness.Pki): no key
is committed. Cases: the right CA passes over gRPC (Python grpcio and the
CLI) and HTTPS (HTTP/1.1 and HTTP/2 by ALPN); a plaintext client, a wrong
CA and an expired server certificate are refused; with --tls-client-ca a
client without a certificate, with one from another CA or with an expired
one is refused; SIGHUP swaps the certificate for new connections while an
open gRPC stream and an open HTTPS connection go on; a reload with broken
files changes nothing.

Run (Debian's Python):
  KEYFLOW_BUILD_DIR=build PYENV_VERSION=system python3 -m unittest -v test_tls
"""

import http.client
import json
import os
import shutil
import signal
import socket
import ssl
import subprocess
import sys
import unittest
import urllib.error

import grpc  # noqa: E402  (before harness.stubs(): see test_functions_grpc.py)

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import harness  # noqa: E402

harness.stubs()
from grpc.health.v1 import health_pb2, health_pb2_grpc  # noqa: E402
from keyflow.v1 import coordinators_pb2 as C  # noqa: E402
from keyflow.v1 import coordinators_pb2_grpc as CG  # noqa: E402
from keyflow.v1 import functions_pb2 as F  # noqa: E402
from keyflow.v1 import functions_pb2_grpc as FG  # noqa: E402

HANDLERS = os.path.join(harness.BUILD, "handlers")
# A bound on every call and wait, not an expected time: generous for ASan on
# a loaded machine (a refusal still arrives at once).
TIMEOUT_S = 30


def channel(target, ca=None, client=None):
    """A channel of its own (no subchannel shared with other channels), TLS
    when `ca` is given."""
    options = [("grpc.use_local_subchannel_pool", 1)]
    if ca is None:
        return grpc.insecure_channel(target, options=options)
    creds = grpc.ssl_channel_credentials(
        root_certificates=harness.read_bytes(ca),
        private_key=harness.read_bytes(client[1]) if client else None,
        certificate_chain=harness.read_bytes(client[0]) if client else None)
    return grpc.secure_channel(target, creds, options=options)


def health(ch):
    return health_pb2_grpc.HealthStub(ch).Check(health_pb2.HealthCheckRequest(),
                                                timeout=TIMEOUT_S).status


def served_cert(port, ca, client=None):
    """The DER certificate the server presents to a new TLS connection that
    verifies it with `ca` (raises ssl.SSLError when it does not verify)."""
    ctx = ssl.create_default_context(cafile=ca)
    if client:
        ctx.load_cert_chain(*client)
    with socket.create_connection(("127.0.0.1", port), timeout=TIMEOUT_S) as raw:
        with ctx.wrap_socket(raw, server_hostname="127.0.0.1") as tls:
            return tls.getpeercert(binary_form=True)


def pem_to_der(path):
    return ssl.PEM_cert_to_DER_cert(harness.read_bytes(path).decode())


def write_text(path, text):
    with open(path, "w") as f:
        f.write(text)


class TlsTest(unittest.TestCase):
    @classmethod
    def setUpClass(cls):
        cls.pki = harness.Pki()
        cls.ca = cls.pki.ca("ca")
        cls.other_ca = cls.pki.ca("other-ca")
        cls.server_cert = cls.pki.leaf("server", cls.ca)
        cls.expired_cert = cls.pki.leaf("expired", cls.ca, days=-1)
        cls.client_cert = cls.pki.leaf("client", cls.ca, client=True, san=None)
        cls.foreign_client = cls.pki.leaf("foreign-client", cls.other_ca, client=True, san=None)
        cls.expired_client = cls.pki.leaf("expired-client", cls.ca, days=-1, client=True, san=None)

    @classmethod
    def tearDownClass(cls):
        cls.pki.cleanup()

    def start(self, cert, client_ca=None, tls_client=None, extra=()):
        args = ["--tls-cert", cert[0], "--tls-key", cert[1]] + list(extra)
        if client_ca:
            args += ["--tls-client-ca", client_ca]
        server = harness.Keyflowd(args=args, tls_ca=self.ca[0], tls_client=tls_client).start()
        self.addCleanup(server.cleanup)
        # A clean stop (exit 0: under ASan, no leak either) after every test.
        self.addCleanup(lambda: self.assertEqual(server.stop(), 0, server.read_log()))
        self.server = server
        return server

    def tearDown(self):
        harness.log_on_failure(self, getattr(self, "server", None))

    def assert_grpc_refused(self, ch):
        with self.assertRaises(grpc.RpcError) as cm:
            health(ch)
        self.assertEqual(cm.exception.code(), grpc.StatusCode.UNAVAILABLE)
        ch.close()

    def assert_https_refused(self, server, ca, client=None):
        with self.assertRaises((ssl.SSLError, ConnectionError, OSError)):
            served_cert(server.http_port, ca, client)

    def cli(self, *args, env=None):
        full_env = dict(os.environ)
        full_env.update(env or {})
        return subprocess.run([harness.CLI, "--addr", self.server.grpc_target] + list(args),
                              capture_output=True, text=True, env=full_env, timeout=60)

    def curl_version(self, server, path):
        """(HTTP status, HTTP version) of a curl request that may use HTTP/2."""
        out = subprocess.run(["curl", "-sS", "--http2", "--cacert", self.ca[0], "-o", "/dev/null",
                              "-w", "%{http_code} %{http_version}", server.http_base + path],
                             capture_output=True, text=True, timeout=60)
        self.assertEqual(out.returncode, 0, out.stderr)
        code, version = out.stdout.split()
        return int(code), version

    # --- the right CA ---------------------------------------------------------
    def test_right_ca_passes_on_both_listeners(self):
        server = self.start(self.server_cert)
        self.assertIn("tls=on", server.read_log())
        ch = channel(server.grpc_target, self.ca[0])
        self.addCleanup(ch.close)
        self.assertEqual(health(ch), health_pb2.HealthCheckResponse.SERVING)
        receipt = CG.CoordinatorsStub(ch).SendEvent(C.SendEventRequest(
            workflow="tls", key="k1", event=C.Event(id="e1", input_json="1", rule=C.Rule(
                kind=C.RULE_KIND_BATCH))), timeout=TIMEOUT_S)
        self.assertTrue(receipt.receipt.run_id.startswith("k1@"))
        # HTTPS: HTTP/1.1 through urllib, HTTP/2 negotiated by ALPN through curl.
        status, body = server.http("GET", "/v1/coordinators/batch/tls/k1")
        self.assertEqual(status, 200, body)
        self.assertEqual(self.curl_version(server, "/healthz"), (200, "2"))
        # The CLI, with the CA by flag and by environment variable.
        out = self.cli("--tls-ca", self.ca[0], "health")
        self.assertEqual((out.returncode, json.loads(out.stdout)), (0, {"status": "SERVING"}),
                         out.stderr)
        out = self.cli("describe", "--kind", "batch", "--workflow", "tls", "--key", "k1",
                       env={"KEYFLOW_TLS_CA": self.ca[0]})
        self.assertEqual(out.returncode, 0, out.stderr)

    # --- refusals --------------------------------------------------------------
    def test_plaintext_client_is_refused(self):
        server = self.start(self.server_cert)
        self.assert_grpc_refused(channel(server.grpc_target))
        with self.assertRaises((ConnectionError, http.client.HTTPException, OSError)):
            conn = http.client.HTTPConnection("127.0.0.1", server.http_port, timeout=TIMEOUT_S)
            conn.request("GET", "/healthz")
            conn.getresponse().read()
        out = self.cli("health", "--timeout-ms", str(TIMEOUT_S * 1000))
        self.assertEqual(out.returncode, 1)
        self.assertIn("UNAVAILABLE", out.stderr)

    def test_wrong_ca_is_refused(self):
        server = self.start(self.server_cert)
        self.assert_grpc_refused(channel(server.grpc_target, self.other_ca[0]))
        with self.assertRaises(ssl.SSLCertVerificationError):
            served_cert(server.http_port, self.other_ca[0])
        out = self.cli("--tls-ca", self.other_ca[0], "health",
                       "--timeout-ms", str(TIMEOUT_S * 1000))
        self.assertEqual(out.returncode, 1)
        self.assertIn("UNAVAILABLE", out.stderr)

    def test_expired_server_certificate_is_refused(self):
        server = self.start(self.expired_cert)
        self.assertIn("EXPIRED", server.read_log())  # served, loudly
        self.assert_grpc_refused(channel(server.grpc_target, self.ca[0]))
        with self.assertRaises(ssl.SSLCertVerificationError) as cm:
            served_cert(server.http_port, self.ca[0])
        self.assertIn("expired", str(cm.exception))

    # --- mTLS --------------------------------------------------------------------
    def test_mtls_requires_a_client_certificate_from_the_client_ca(self):
        server = self.start(self.server_cert, client_ca=self.ca[0], tls_client=self.client_cert)
        self.assertIn("tls=\"on (mTLS)\"", server.read_log())  # a quoted log field
        # Without a certificate, with one of another CA, with an expired one.
        self.assert_grpc_refused(channel(server.grpc_target, self.ca[0]))
        self.assert_grpc_refused(channel(server.grpc_target, self.ca[0], self.foreign_client))
        self.assert_grpc_refused(channel(server.grpc_target, self.ca[0], self.expired_client))
        for client in (None, self.foreign_client, self.expired_client):
            with self.assertRaises((ssl.SSLError, ConnectionError, OSError)):
                ctx = ssl.create_default_context(cafile=self.ca[0])
                if client:
                    ctx.load_cert_chain(*client)
                conn = http.client.HTTPSConnection("127.0.0.1", server.http_port, context=ctx,
                                                   timeout=TIMEOUT_S)
                conn.request("GET", "/healthz")
                conn.getresponse().read()
        out = self.cli("--tls-ca", self.ca[0], "health", "--timeout-ms", str(TIMEOUT_S * 1000))
        self.assertEqual(out.returncode, 1, out.stdout)
        # With the right certificate: gRPC, HTTPS and the CLI pass.
        ch = channel(server.grpc_target, self.ca[0], self.client_cert)
        self.addCleanup(ch.close)
        self.assertEqual(health(ch), health_pb2.HealthCheckResponse.SERVING)
        self.assertEqual(server.http("GET", "/healthz")[0], 200)
        out = self.cli("--tls-ca", self.ca[0], "--tls-cert", self.client_cert[0], "--tls-key",
                       self.client_cert[1], "health")
        self.assertEqual(out.returncode, 0, out.stderr)
        out = self.cli("--tls-ca", self.ca[0], "--tls-cert", self.client_cert[0], "health")
        self.assertEqual(out.returncode, 2)
        self.assertIn("--tls-key", out.stderr)

    def probe_get(self, path, port, client=None):
        """(status, body) of GET path over HTTPS to `port` (verified with the
        CA; `client` an optional certificate pair)."""
        ctx = ssl.create_default_context(cafile=self.ca[0])
        if client:
            ctx.load_cert_chain(*client)
        conn = http.client.HTTPSConnection("127.0.0.1", port, context=ctx, timeout=TIMEOUT_S)
        try:
            conn.request("GET", path)
            resp = conn.getresponse()
            return resp.status, resp.read().decode()
        finally:
            conn.close()

    def test_mtls_probe_listener_needs_no_client_certificate(self):
        """The kubelet's HTTPS probes and the compose healthcheck carry no
        client certificate: under mTLS the probe listener still answers them
        (same server certificate), while the gateway's port does not, and it
        serves the probes and /metrics only (no /openapi.json). A SIGHUP
        reload keeps it that way."""
        server = self.start(self.server_cert, client_ca=self.ca[0], tls_client=self.client_cert,
                            extra=["--probe-address", "127.0.0.1:0"])
        for round_ in ("start", "after SIGHUP"):
            for path in ("/healthz", "/readyz", "/metrics"):
                status, body = self.probe_get(path, server.probe_port)
                self.assertEqual(status, 200, (round_, path, body))
            status, body = self.probe_get("/openapi.json", server.probe_port)
            self.assertEqual(status, 404, (round_, body))
            self.assertIn("/healthz, /readyz and /metrics only", body)
            # The certificate it serves is the server's.
            self.assertEqual(served_cert(server.probe_port, self.ca[0]),
                             pem_to_der(self.server_cert[0]))
            # curl -k, as the compose healthcheck runs it.
            out = subprocess.run(["curl", "-fsSk", "-o", "/dev/null", "-w", "%{http_code}",
                                  "https://127.0.0.1:%d/readyz" % server.probe_port],
                                 capture_output=True, text=True, timeout=60)
            self.assertEqual((out.returncode, out.stdout), (0, "200"), out.stderr)
            # The gateway's own port still demands a client certificate.
            with self.assertRaises((ssl.SSLError, ConnectionError, OSError)):
                self.probe_get("/healthz", server.http_port)
            self.assertEqual(self.probe_get("/openapi.json", server.http_port,
                                            self.client_cert)[0], 200)
            server.proc.send_signal(signal.SIGHUP)
            harness.wait_until(lambda: "SIGHUP: new connections get" in server.read_log(),
                               TIMEOUT_S, "the reload")

    # --- SIGHUP --------------------------------------------------------------------
    def test_sighup_rotates_for_new_connections_and_keeps_open_ones(self):
        for path in (os.path.join(HANDLERS, "running_sum.so"),
                     os.path.join(HANDLERS, "running_sum.descriptor.json")):
            if not os.path.exists(path):
                self.skipTest("not built: %s" % path)
        # The server reads its files from paths that the test then rewrites.
        live = (os.path.join(self.pki.dir, "live.pem"), os.path.join(self.pki.dir, "live.key"))
        shutil.copy(self.server_cert[0], live[0])
        shutil.copy(self.server_cert[1], live[1])
        # The HTTPS connection opened before the rotation idles through it:
        # on a loaded machine (ASan) that can outlast the default 5 s allowed
        # for the next request head, which would close it under the test.
        server = self.start(live, extra=["--plugin-dir", HANDLERS,
                                         "--http-header-timeout-ms", "60000"])
        with open(os.path.join(HANDLERS, "running_sum.descriptor.json")) as f:
            descriptor = json.load(f)
        descriptor["functionId"] = "rs-rotation"
        descriptor["pipelineStateId"] = "rs-rotation.state"
        status, body = server.http("POST", "/v1/functions", descriptor)
        self.assertEqual(status, 200, body)

        # Open before the rotation: a gRPC tail stream and an HTTPS connection.
        old_channel = channel(server.grpc_target, self.ca[0])
        self.addCleanup(old_channel.close)
        tail = FG.FunctionsStub(old_channel).TailOutput(
            F.TailOutputRequest(function_id="rs-rotation", after_seq=0), timeout=60)
        self.addCleanup(tail.cancel)
        old_https = http.client.HTTPSConnection("127.0.0.1", server.http_port,
                                                context=server.ssl_context(), timeout=TIMEOUT_S)
        self.addCleanup(old_https.close)
        old_https.request("GET", "/healthz")
        self.assertEqual(old_https.getresponse().read(), b'{"status":"ok"}')
        old_socket = old_https.sock
        self.assertEqual(old_socket.getpeercert(binary_form=True), pem_to_der(live[0]))

        # Rotate to a certificate of another CA.
        rotated = self.pki.leaf("rotated", self.other_ca)
        shutil.copy(rotated[0], live[0])
        shutil.copy(rotated[1], live[1])
        server.proc.send_signal(signal.SIGHUP)
        harness.wait_until(
            lambda: "new connections get the reloaded certificate" in server.read_log(),
            TIMEOUT_S, "the reload")

        # New connections: the new certificate on both listeners.
        self.assertEqual(served_cert(server.http_port, self.other_ca[0]), pem_to_der(rotated[0]))
        with self.assertRaises(ssl.SSLCertVerificationError):
            served_cert(server.http_port, self.ca[0])
        self.assert_grpc_refused(channel(server.grpc_target, self.ca[0]))
        new_channel = channel(server.grpc_target, self.other_ca[0])
        self.addCleanup(new_channel.close)
        self.assertEqual(health(new_channel), health_pb2.HealthCheckResponse.SERVING)

        # Rows pushed over a new HTTPS connection reach the old gRPC stream.
        server.tls_ca = self.other_ca[0]
        status, body = server.http("POST", "/v1/functions/rs-rotation/batches", {
            "producerId": "p1", "sequence": 1,
            "rows": [{"user": "ann", "ts": 1700000000000000, "amount": 5}]})
        self.assertEqual(status, 200, body)
        page = next(tail)
        self.assertEqual(page.last_seq, 1)
        # The old HTTPS connection is the same socket, still serving.
        old_https.request("GET", "/healthz")
        self.assertEqual(old_https.getresponse().read(), b'{"status":"ok"}')
        self.assertIs(old_https.sock, old_socket)
        self.assertEqual(health(old_channel), health_pb2.HealthCheckResponse.SERVING)

    def test_failed_reload_keeps_the_previous_certificate(self):
        live = (os.path.join(self.pki.dir, "keep.pem"), os.path.join(self.pki.dir, "keep.key"))
        shutil.copy(self.server_cert[0], live[0])
        shutil.copy(self.server_cert[1], live[1])
        server = self.start(live)
        # A key that does not belong to the certificate, then a file that is not PEM.
        for broken in (lambda: shutil.copy(self.expired_cert[1], live[1]),
                       lambda: write_text(live[0], "not a certificate\n")):
            broken()
            before = server.read_log().count("reload failed")
            server.proc.send_signal(signal.SIGHUP)
            harness.wait_until(lambda: server.read_log().count("reload failed") > before, TIMEOUT_S,
                       "the failed reload")
            self.assertEqual(served_cert(server.http_port, self.ca[0]),
                             pem_to_der(self.server_cert[0]))
            ch = channel(server.grpc_target, self.ca[0])
            self.assertEqual(health(ch), health_pb2.HealthCheckResponse.SERVING)
            ch.close()

    # --- configuration errors ---------------------------------------------------------
    def test_configuration_errors(self):
        def run(*args):
            data = self.pki.dir + "/data-config"
            return subprocess.run([harness.KEYFLOWD, "--data", data, "--grpc", "127.0.0.1:0",
                                   "--http", "127.0.0.1:0"] + list(args),
                                  capture_output=True, text=True, timeout=60)
        out = run("--tls-cert", self.server_cert[0])
        self.assertEqual(out.returncode, 2)
        self.assertIn("--tls-key", out.stderr)
        out = run("--tls-client-ca", self.ca[0])
        self.assertEqual(out.returncode, 2)
        missing = os.path.join(self.pki.dir, "missing.pem")
        out = run("--tls-cert", missing, "--tls-key", self.server_cert[1])
        self.assertEqual(out.returncode, 1)
        self.assertIn(missing, out.stderr)
        out = run("--tls-cert", self.server_cert[0], "--tls-key", self.client_cert[1])
        self.assertEqual(out.returncode, 1)
        self.assertIn("does not match", out.stderr)


if __name__ == "__main__":
    unittest.main()
