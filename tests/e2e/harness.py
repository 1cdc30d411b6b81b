"""End-to-end harness: starts the real keyflowd on 127.0.0.1 port 0 and
gives tests its addresses, plus gRPC stubs generated from api/ at test time.

Run with Debian's Python (PYENV_VERSION=system python3), which has grpcio.
Environment:
  KEYFLOW_BUILD_DIR  build tree holding service/main/keyflowd (default: build)
  KEYFLOW_WRAPPER    optional command prefix for keyflowd (e.g. valgrind)
"""

import json
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import time
import unittest
import urllib.error
import urllib.request

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
BUILD = os.environ.get("KEYFLOW_BUILD_DIR", os.path.join(ROOT, "build"))
if not os.path.isabs(BUILD):
    BUILD = os.path.join(ROOT, BUILD)
KEYFLOWD = os.path.join(BUILD, "service", "main", "keyflowd")
CLI = os.path.join(BUILD, "clients", "cli", "keyflow")

# keyflowd runs with its defaults, so a new data set has 8 partitions
# (docs/scaling.md). A test about what only one partition has passes this,
# and says why: one output sequence across keys (after_seq paging,
# first/last_output_seq, trimming before a sequence), one run order across
# keys, one write for a whole SendEvents. What several partitions do
# instead is tested with the default and in test_partitions.py.
ONE_PARTITION = ["--partition-count", "1"]

_stubs_dir = None


def wait_until(fn, timeout, what, interval=0.02):
    """Calls fn until it returns something true (returned), for at most
    timeout seconds; then fails naming `what` and the last value."""
    deadline = time.time() + timeout
    last = None
    while time.time() < deadline:
        last = fn()
        if last:
            return last
        time.sleep(interval)
    raise AssertionError("timed out after %.1fs waiting for %s (last value: %r)" % (timeout, what, last))


def stubs():
    """Generates Python stubs for every .proto under api/ (once per process)
    and returns the directory, already on sys.path."""
    global _stubs_dir
    if _stubs_dir is not None:
        return _stubs_dir
    # The real grpcio package first: the generated grpc/health/v1 stubs must
    # not shadow it (they are grafted onto its __path__ below).
    import grpc as real_grpc
    out = tempfile.mkdtemp(prefix="kf-stubs-")
    api = os.path.join(ROOT, "api")
    protos = []
    for base, _, files in os.walk(api):
        for f in files:
            if f.endswith(".proto"):
                protos.append(os.path.relpath(os.path.join(base, f), api))
    plugin = shutil.which("grpc_python_plugin")
    if plugin is None:
        raise RuntimeError("grpc_python_plugin not found (apt install protobuf-compiler-grpc)")
    subprocess.run(["protoc", "-I" + api, "--python_out=" + out,
                    "--plugin=protoc-gen-grpc_python=" + plugin, "--grpc_python_out=" + out]
                   + sorted(protos), check=True)
    # Make every generated directory a package (except the top-level grpc/,
    # which extends the real grpc package instead of replacing it).
    for base, dirs, _ in os.walk(out):
        for d in dirs:
            if base == out and d == "grpc":
                continue
            init = os.path.join(base, d, "__init__.py")
            if not os.path.exists(init):
                open(init, "w").close()
    sys.path.insert(0, out)
    if os.path.isdir(os.path.join(out, "grpc")):
        real_grpc.__path__.append(os.path.join(out, "grpc"))
    _stubs_dir = out
    return out


def stopped(server):
    """Stops a server with SIGTERM, which must exit 0 (a sanitizer's report
    at exit does not), and removes its data directory."""
    code = server.stop()
    log = server.read_log()
    server.cleanup()
    assert code == 0, "keyflowd exited %s; log:\n%s" % (code, log)


def class_server(cls, **kw):
    """A keyflowd shared by the tests of one TestCase class (call it from
    setUpClass): started once, killed with its data directory when the
    class is done, even when the start fails. A class shares one only
    where its tests do not need a fresh server: each works in a workflow
    (or function) of its own, and none counts what the whole server holds."""
    server = Keyflowd(**kw)
    cls.addClassCleanup(server.cleanup)
    return server.start()


def partition_processes(count, sets, args=()):
    """One keyflowd per partition set in `sets` (e.g. ("0-1", "2-3")) of a
    new data set of `count` partitions, each with its own data directory;
    returns them started. If one cannot start, those already started are
    killed before the error goes on."""
    servers = []
    try:
        for s in sets:
            servers.append(Keyflowd(args=["--partition-count", str(count), "--partitions", s]
                                    + list(args)))
            servers[-1].start()
    except BaseException:
        for server in servers:
            server.cleanup()
        raise
    return servers


def log_on_failure(test, server):
    """For tearDown: writes the server's log to stderr when `test` failed
    (unittest has no direct hook; the log is short). server may be None
    (none started)."""
    result = getattr(getattr(test, "_outcome", None), "result", None)
    bad = getattr(result, "errors", []) + getattr(result, "failures", [])
    if server is not None and any(t is test for t, _ in bad):
        sys.stderr.write("\n--- keyflowd log ---\n%s\n" % server.read_log())


class ServerTest(unittest.TestCase):
    """A base for tests against one keyflowd started with server_args:
    self.server. One per class (a test that restarts it restarts it for
    the tests after it), unless the class sets fresh_server: one per test,
    for tests that look at the whole server (every workflow's runs,
    server-wide gauges and counters) or need it new. A failed test's
    server log goes to stderr."""

    server_args = ()
    fresh_server = False

    @classmethod
    def setUpClass(cls):
        super().setUpClass()
        if not cls.fresh_server:
            cls.shared_server = class_server(cls, args=list(cls.server_args))

    def setUp(self):
        if self.fresh_server:
            self.server = Keyflowd(args=list(self.server_args)).start()
            self.addCleanup(self.server.cleanup)
        else:
            self.server = self.shared_server
            if self.server.proc is None:  # an earlier test failed while restarting it
                self.server.start()

    def tearDown(self):
        log_on_failure(self, self.server)


class Pki:
    """Test certificates made with openssl when a test runs, so that no
    private key is ever committed. EC P-256 keys: quick to make."""

    def __init__(self):
        self.dir = tempfile.mkdtemp(prefix="kf-pki-")

    def cleanup(self):
        shutil.rmtree(self.dir, ignore_errors=True)

    def _run(self, *args):
        subprocess.run(["openssl"] + list(args), check=True, cwd=self.dir,
                       stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)

    def _key(self, name):
        key = os.path.join(self.dir, name + ".key")
        self._run("genpkey", "-algorithm", "EC", "-pkeyopt", "ec_paramgen_curve:P-256",
                  "-out", key)
        os.chmod(key, 0o600)
        return key

    def ca(self, name):
        """A self-signed CA: (cert path, key path)."""
        key = self._key(name)
        cert = os.path.join(self.dir, name + ".pem")
        self._run("req", "-x509", "-new", "-key", key, "-out", cert, "-days", "2",
                  "-subj", "/CN=" + name, "-addext", "basicConstraints=critical,CA:TRUE",
                  "-addext", "keyUsage=critical,keyCertSign,cRLSign")
        return cert, key

    def leaf(self, name, ca, days=2, client=False, san="IP:127.0.0.1,DNS:localhost"):
        """A certificate signed by `ca` (a pair from ca()); days < 0 makes one
        that has already expired. Returns (cert path, key path)."""
        key = self._key(name)
        csr = os.path.join(self.dir, name + ".csr")
        cert = os.path.join(self.dir, name + ".pem")
        ext = os.path.join(self.dir, name + ".ext")
        with open(ext, "w") as f:
            f.write("basicConstraints=CA:FALSE\n")
            f.write("extendedKeyUsage=%s\n" % ("clientAuth" if client else "serverAuth"))
            if san:
                f.write("subjectAltName=%s\n" % san)
        self._run("req", "-new", "-key", key, "-out", csr, "-subj", "/CN=" + name)
        self._run("x509", "-req", "-in", csr, "-CA", ca[0], "-CAkey", ca[1],
                  "-CAcreateserial", "-days", str(days), "-extfile", ext, "-out", cert)
        return cert, key


def read_bytes(path):
    with open(path, "rb") as f:
        return f.read()


class Keyflowd:
    """One keyflowd process over one data directory (kept across restarts).
    With tls_ca (a CA file), the HTTP helpers speak HTTPS and verify the
    server with it; tls_client is an optional (cert, key) for mTLS."""

    def __init__(self, data_dir=None, args=(), tls_ca=None, tls_client=None, env=None):
        self.owns_dir = data_dir is None
        self.data_dir = data_dir or tempfile.mkdtemp(prefix="kf-data-")
        self.args = list(args)
        self.env = dict(env or {})  # added to this process's environment
        self.tls_ca = tls_ca
        self.tls_client = tls_client
        self.proc = None
        self.grpc_port = None
        self.http_port = None
        self.log_path = os.path.join(self.data_dir, "keyflowd.log")

    @property
    def grpc_target(self):
        return "127.0.0.1:%d" % self.grpc_port

    @property
    def http_base(self):
        return "%s://127.0.0.1:%d" % ("https" if self.tls_ca else "http", self.http_port)

    def ssl_context(self):
        """The client side of HTTPS for the helpers (None without TLS)."""
        if not self.tls_ca:
            return None
        import ssl
        ctx = ssl.create_default_context(cafile=self.tls_ca)
        if self.tls_client:
            ctx.load_cert_chain(*self.tls_client)
        return ctx

    # A new data set opens 9 RocksDB stores (8 partitions and home): about
    # 2 s in a release build, but under AddressSanitizer on a busy 2-core
    # machine it was seen to take over 30 s. A deadline, not a wait.
    START_TIMEOUT_S = 120

    def start(self, timeout=START_TIMEOUT_S):
        port_file = os.path.join(self.data_dir, "ports")
        if os.path.exists(port_file):
            os.unlink(port_file)
        cmd = os.environ.get("KEYFLOW_WRAPPER", "").split() + [
            KEYFLOWD, "--data", os.path.join(self.data_dir, "db"),
            "--grpc", "127.0.0.1:0", "--http", "127.0.0.1:0",
            "--port-file", port_file] + self.args
        self.log = open(self.log_path, "ab")
        self.proc = subprocess.Popen(cmd, stdout=self.log, stderr=subprocess.STDOUT,
                                     env=dict(os.environ, **self.env))
        deadline = time.time() + timeout
        while not os.path.exists(port_file):
            if self.proc.poll() is not None:
                raise RuntimeError("keyflowd exited with %s; log:\n%s"
                                   % (self.proc.returncode, self.read_log()))
            if time.time() > deadline:
                self.kill()
                raise RuntimeError("keyflowd did not start; log:\n" + self.read_log())
            time.sleep(0.02)
        with open(port_file) as f:
            ports = dict(line.split("=") for line in f.read().split())
        self.grpc_port = int(ports["grpc"])
        self.http_port = int(ports["http"])
        self.probe_port = int(ports["probe"]) if "probe" in ports else None
        return self

    def read_log(self):
        try:
            with open(self.log_path, "rb") as f:
                return f.read().decode(errors="replace")[-8000:]
        except OSError:
            return ""

    def stop(self, timeout=30):
        """SIGTERM; returns the exit code."""
        if self.proc is None:
            return None
        self.proc.send_signal(signal.SIGTERM)
        try:
            code = self.proc.wait(timeout=timeout)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait()
            raise RuntimeError("keyflowd did not stop on SIGTERM; log:\n" + self.read_log())
        self.proc = None
        self.log.close()
        return code

    def kill(self):
        """SIGKILL: a crash."""
        if self.proc is None:
            return
        self.proc.kill()
        self.proc.wait()
        self.proc = None
        self.log.close()

    def cleanup(self):
        if self.proc is not None:
            self.kill()
        if self.owns_dir:
            shutil.rmtree(self.data_dir, ignore_errors=True)

    # --- HTTP helpers ---------------------------------------------------
    def http(self, method, path, body=None, raw=None, headers=None, base=None):
        """Returns (status, parsed JSON or text). `base` replaces http_base
        (the probe listener's, say)."""
        data = raw if raw is not None else (json.dumps(body).encode() if body is not None else None)
        req = urllib.request.Request((base or self.http_base) + path, data=data, method=method)
        if data is not None:
            req.add_header("Content-Type", "application/json")
        for k, v in (headers or {}).items():
            req.add_header(k, v)
        try:
            with urllib.request.urlopen(req, timeout=30, context=self.ssl_context()) as resp:
                status, text = resp.status, resp.read().decode()
        except urllib.error.HTTPError as e:
            status, text = e.code, e.read().decode()
        try:
            return status, json.loads(text)
        except ValueError:
            return status, text
