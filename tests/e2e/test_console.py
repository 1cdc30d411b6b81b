"""End-to-end tests of the web console (docs/console.md): the files the
gateway serves at / and /ui/ (headers, bounds, the browser checks), and the
page itself driven in Debian's headless Chromium (browser.py) against the
real keyflowd, with the CLI as the worker.

Each browser scenario sends an event from the form, sees the window (its
due time counting down and the remembered ID), flushes it, finds the run in
the list, watches it become LEASED (keyflow poll) and COMPLETED with its
result (keyflow complete), cancels a pending run from the run's page,
follows a function's output while rows are pushed, reads a key's state,
dry-runs a batch and looks at the Health view. It runs at 1280 px and at
390 px (a phone) with keys off, and at 1280 px with keys on (the page asks
for the key); a key with runs:read only sees no action it cannot take.
Screenshots of every step go to <build>/tests/e2e/console-artifacts/, and a
step that does not show what it should fails the test (after a screenshot
named FAILED-...). Script errors and Content-Security-Policy violations in
the page fail it too.
"""

import json
import os
import re
import shutil
import subprocess
import sys
import unittest
import urllib.parse
import uuid

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import browser  # noqa: E402
import harness  # noqa: E402
from test_functions_grpc import HANDLERS, require_build, rs_descriptor  # noqa: E402

ARTIFACTS = os.path.join(harness.BUILD, "tests", "e2e", "console-artifacts")
FILES = ["index.html", "console.css", "favicon.svg", "app.js", "api.js", "ui.js", "runs.js",
         "coordinators.js", "functions.js", "health.js"]
CSP = ("default-src 'self'; img-src 'self' data:; base-uri 'none'; form-action 'none'; "
       "frame-ancestors 'none'")


def setUpModule():
    # This run's screenshots only: a FAILED-... left by an earlier run
    # would tell a wrong story.
    shutil.rmtree(ARTIFACTS, ignore_errors=True)
    os.makedirs(ARTIFACTS)


def unique(prefix):
    return "%s-%s" % (prefix, uuid.uuid4().hex[:8])


def raw_get(server, path, method="GET", headers=None):
    """(status, headers as a lower-case dict, body bytes)."""
    import http.client
    conn = http.client.HTTPConnection("127.0.0.1", server.http_port, timeout=30)
    try:
        conn.request(method, path, headers=headers or {})
        resp = conn.getresponse()
        return resp.status, {k.lower(): v for k, v in resp.getheaders()}, resp.read()
    finally:
        conn.close()


class ConsoleFilesTest(harness.ServerTest):
    """What the gateway serves for the console, without a browser."""

    def test_page_and_files_with_their_types_and_security_headers(self):
        types = {"html": "text/html; charset=utf-8", "css": "text/css; charset=utf-8",
                 "js": "text/javascript; charset=utf-8", "svg": "image/svg+xml"}
        source = os.path.join(harness.ROOT, "service", "http", "console")
        for path, name in [("/", "index.html"), ("/ui", "index.html"), ("/ui/", "index.html")] + \
                [("/ui/" + f, f) for f in FILES]:
            status, headers, body = raw_get(self.server, path)
            self.assertEqual(status, 200, path)
            with open(os.path.join(source, name), "rb") as f:
                self.assertEqual(body, f.read(), path)
            self.assertEqual(headers["content-type"], types[name.rsplit(".", 1)[1]], path)
            self.assertEqual(headers["content-security-policy"], CSP, path)
            self.assertEqual(headers["x-content-type-options"], "nosniff", path)
            self.assertEqual(headers["cache-control"], "no-cache", path)
            # The ETag revalidates: the same file answers 304 without a body.
            status, _, body = raw_get(self.server, path, headers={"If-None-Match": headers["etag"]})
            self.assertEqual((status, body), (304, b""), path)
            status, _, body = raw_get(self.server, path, headers={"If-None-Match": '"other"'})
            self.assertEqual(status, 200, path)
            status, headers2, body = raw_get(self.server, path, method="HEAD")
            self.assertEqual((status, body, headers2["content-length"]),
                             (200, b"", headers["content-length"]), path)

    def test_the_page_has_no_inline_script_or_style(self):
        # What the CSP forbids must not be needed: every script and style
        # sheet is a file of its own.
        _, _, body = raw_get(self.server, "/")
        html = body.decode()
        self.assertNotIn("<style", html)
        self.assertNotIn(" style=", html)
        self.assertIsNone(re.search(r"\son\w+=", html))  # no onclick= and the like
        for tag in html.split("<script")[1:]:
            self.assertIn("src=", tag.split(">")[0])
            self.assertTrue(tag.split(">", 1)[1].startswith("</script>"))

    def test_unknown_console_paths_are_json_404(self):
        for path in ["/ui/nope.js", "/ui/../etc/passwd", "/ui/app.js/x", "/ui/index.html.bak",
                     "/uix", "/index.html"]:
            status, headers, body = raw_get(self.server, path)
            self.assertEqual(status, 404, path)
            self.assertEqual(headers["content-type"], "application/json", path)
            doc = json.loads(body)
            self.assertEqual(doc["status"], "NOT_FOUND", path)

    def test_other_methods_are_405(self):
        for method in ["POST", "PUT", "DELETE"]:
            for path in ["/", "/ui/app.js", "/ui/nope"]:
                status, headers, body = raw_get(self.server, path, method=method)
                self.assertEqual(status, 405, (method, path))
                self.assertEqual(headers["allow"], "GET, HEAD")
                self.assertEqual(json.loads(body)["status"], "UNIMPLEMENTED")

    def test_the_browser_checks_still_apply(self):
        # Keys off: another name (DNS rebinding) gets nothing, the page
        # included; another site's Origin is refused as for any route.
        status, _, body = raw_get(self.server, "/", headers={"Host": "evil.example"})
        self.assertEqual(status, 403)
        self.assertIn("not a loopback name", json.loads(body)["message"])
        status, _, _ = raw_get(self.server, "/ui/app.js", headers={"Origin": "https://evil.example"})
        self.assertEqual(status, 403)
        status, _, _ = raw_get(self.server, "/ui/app.js",
                               headers={"Origin": "http://127.0.0.1:%d" % self.server.http_port})
        self.assertEqual(status, 200)

    def test_existing_routes_answer_as_before(self):
        status, doc = self.server.http("GET", "/v1/nope")
        self.assertEqual(status, 404)
        self.assertIn("no such route", doc["message"])
        status, doc = self.server.http("GET", "/healthz")
        self.assertEqual((status, doc), (200, {"status": "ok"}))


class ConsoleFilesAuthTest(harness.ServerTest):
    server_args = ["--auth"]

    def test_the_page_needs_no_key_and_the_api_still_does(self):
        status, headers, _ = raw_get(self.server, "/")
        self.assertEqual(status, 200)
        self.assertEqual(headers["content-security-policy"], CSP)
        status, _ = self.server.http("GET", "/v1/runs")
        self.assertEqual(status, 401)


class Scenario:
    """One pass over the console in one browser tab (see the module's
    docstring). `key` is the API key typed into the page, or None."""

    def __init__(self, test, server, b, name, width, key=None, cli_key_file=None):
        self.test, self.server, self.b, self.name = test, server, b, name
        self.width, self.key, self.cli_key_file = width, key, cli_key_file
        self.shots = 0

    def shot(self, what):
        self.shots += 1
        return self.b.screenshot(os.path.join(ARTIFACTS, "%s-%02d-%s.png" % (self.name, self.shots, what)))

    def wait(self, expression, what, timeout=15):
        try:
            return self.b.wait_for(expression, what, timeout)
        except browser.BrowserError:
            self.shot("FAILED-" + what.replace(" ", "-")[:40])
            raise

    def has_text(self, selector, text):
        return "(document.querySelector(%s) || {textContent: ''}).textContent.includes(%s)" % (
            json.dumps(selector), json.dumps(text))

    def cli(self, *args):
        cmd = [harness.CLI, "--addr", self.server.grpc_target, "--output", "json"]
        if self.cli_key_file:
            cmd += ["--api-key-file", self.cli_key_file]
        out = subprocess.run(cmd + list(args), check=True, capture_output=True, text=True,
                             timeout=30).stdout
        return json.loads(out.strip().splitlines()[-1])

    def api(self, method, path, body=None):
        headers = {"Authorization": "Bearer " + self.key} if self.key else {}
        status, doc = self.server.http(method, path, body, headers=headers)
        self.test.assertEqual(status, 200, (path, doc))
        return doc

    def go(self, hash_):
        self.b.evaluate("location.hash = %s" % json.dumps(hash_))

    def confirm(self):
        self.wait("document.getElementById('confirm').open", "the confirmation dialog")
        self.b.click("#confirm-yes")
        self.wait("!document.getElementById('confirm').open", "the dialog to close")

    def open(self):
        b = self.b
        b.open_page(self.width, 900 if self.width > 500 else 844, mobile=self.width < 500)
        b.goto(self.server.http_base + "/#/coordinators")
        if self.key:
            self.wait("document.getElementById('login').open", "the API key prompt")
            self.shot("login")
            b.fill("#login-key", self.key)
            b.click("#login-submit")
        self.wait("document.body.dataset.auth === %s" % json.dumps("on" if self.key else "off"),
                  "the console to start")
        # Sessions storage only, never local storage.
        stored = b.evaluate("[sessionStorage.getItem('keyflow.apiKey'), localStorage.length]")
        self.test.assertEqual(stored, [self.key, 0])

    def window_flush_lease_complete(self):
        b, t = self.b, self.test
        workflow, key = unique("ui-ship"), "order-1"
        b.fill("#send-form [name=workflow]", workflow)
        b.fill("#send-form [name=key]", key)
        b.fill("#send-form [name=maxEvents]", "3")
        b.fill("#send-form [name=maxWaitMs]", "600000")
        b.fill("#send-form [name=id]", "e-1")
        b.fill("#send-form [name=input]", '{"item": 1}')
        b.click("#send-form button[type=submit]")
        self.wait(self.has_text("#send-disposition", "OPENED"), "the receipt: OPENED")
        run_id = b.text("#send-result a")
        t.assertTrue(run_id.startswith(key + "@"), run_id)
        # The window, looked up by the page after the send.
        self.wait(self.has_text("#coord-due", "(in "), "the window's due time counting down")
        self.wait(self.has_text("table.remembered", "e-1"), "the remembered event ID")
        t.assertIn("event_accepted", b.text("table.journal"))
        first = b.text("#coord-due")
        self.wait("document.getElementById('coord-due').textContent !== %s" % json.dumps(first),
                  "the countdown to move", timeout=5)
        self.shot("window")
        b.click("#coord-flush")
        self.confirm()
        self.wait("document.getElementById('coord-no-window')", "no window after the flush")
        self.wait(self.has_text("#notice", "CLOSED"), "the flush's disposition")
        self.wait(self.has_text("table.journal", "run_started"), "run_started in the journal")
        self.shot("flushed")

        self.go("#/runs?workflow=" + urllib.parse.quote(workflow))
        self.wait(self.has_text("table.runs", run_id) + " && " +
                  self.has_text("table.runs", "PENDING"), "the pending run in the list")
        self.shot("runs")
        b.click('table.runs a[href="#/runs/%s"]' % urllib.parse.quote(run_id, safe=""))
        self.wait("document.getElementById('run').dataset.status === 'PENDING'", "the run's page")

        worker = "w-" + self.name
        leased = self.cli("poll", "--worker", worker, "--workflow", workflow)["runs"]
        t.assertEqual([r["runId"] for r in leased], [run_id])
        self.wait("document.getElementById('run').dataset.status === 'LEASED'", "LEASED")
        self.wait(self.has_text("#run", worker), "the lease holder")
        if self.can_work:
            t.assertTrue(b.evaluate("!!document.getElementById('run-release')"))
        self.shot("leased")
        self.cli("complete", run_id, "--lease", leased[0]["lease"], "--result",
                 '{"shipped": true}')
        self.wait("document.getElementById('run').dataset.status === 'COMPLETED'", "COMPLETED")
        self.wait(self.has_text("#run-result", '"shipped": true'), "the run's result")
        t.assertIn('"item": 1', b.text("#run-input"))
        t.assertFalse(b.evaluate("!!document.getElementById('run-cancel')"))
        self.shot("completed")

    def cancel_pending(self):
        b, t = self.b, self.test
        workflow = unique("ui-cancel")
        sent = self.api("POST", "/v1/workflows/%s/keys/k/events" % workflow,
                        {"rule": {"kind": "batch"}, "input": 2, "flush": True})
        run_id = sent["receipt"]["runId"]
        self.go("#/runs/" + urllib.parse.quote(run_id, safe=""))
        self.wait("document.getElementById('run').dataset.status === 'PENDING'", "a pending run")
        b.click("#run-cancel")
        self.wait(self.has_text("#confirm-text", "cannot be undone"), "the cancel question")
        self.confirm()
        self.wait("document.getElementById('run').dataset.status === 'CANCELLED'", "CANCELLED")
        self.shot("cancelled")
        run = self.api("GET", "/v1/runs/" + urllib.parse.quote(run_id, safe=""))
        t.assertEqual(run["status"], "RUN_STATUS_CANCELLED")

    def follow_output(self):
        b, t = self.b, self.test
        d = rs_descriptor(unique("ui-rs"))
        fid = d["functionId"]
        self.api("POST", "/v1/functions", d)
        rows1 = [{"user": "ann", "ts": 1700000000000000, "amount": 5},
                 {"user": "bob", "ts": 1700000000000001, "amount": 7}]
        self.api("POST", "/v1/functions/%s/batches" % fid,
                 {"producerId": "p1", "sequence": 1, "rows": rows1})
        self.go("#/functions")
        self.wait(self.has_text("table.functions", fid), "the function in the list")
        self.shot("functions")
        b.click('table.functions a[href="#/functions/%s"]' % fid)
        self.wait(self.has_text("table.limits", "maxKeys"), "the function's limits")
        t.assertIn("user", b.text("#function"))
        b.click("#follow")
        self.wait("document.querySelectorAll('#output-table tbody tr').length === 2",
                  "the first batch's two output rows")
        # Rows pushed while the page follows show up without a reload.
        self.api("POST", "/v1/functions/%s/batches" % fid,
                 {"producerId": "p1", "sequence": 2,
                  "rows": [{"user": "ann", "ts": 1700000000000002, "amount": 30}]})
        self.wait("document.querySelectorAll('#output-table tbody tr').length === 3",
                  "the second batch's row, followed")
        t.assertIn("35", b.text("#output-table"))  # ann's running sum: 5 + 30
        b.fill("#key-form [name=key]", "ann")
        b.click("#key-form button")
        self.wait(self.has_text("#key-state", "35"), "ann's state")
        if self.can_push:
            b.fill("#dry-run-form [name=rows]", json.dumps(
                [{"user": "ann", "ts": 1700000000000003, "amount": 1}]))
            b.click("#dry-run-form button")
            self.wait(self.has_text("#dry-run-result", "Rows accepted"), "the dry run")
            self.wait(self.has_text("#dry-run-output", "36"), "the dry run's output row")
        self.shot("function")
        # The dry run applied nothing.
        state = self.api("GET", "/v1/functions/%s/keys/ann" % fid)
        t.assertEqual(state["value"], "35")

    def health(self):
        self.go("#/health")
        self.wait(self.has_text("#ready-state", "Ready"), "readiness")
        self.wait("document.querySelectorAll('table.partitions tbody tr').length === 8",
                  "the eight partitions")
        self.wait(self.has_text("#reserve-state", "not reached"), "the disk reserve")
        # Two /metrics samples make a point on each chart.
        self.wait("document.getElementById('chart-group').dataset.points >= 1", "a chart point",
                  timeout=10)
        self.shot("health")

    def run(self, can_work=True, can_push=True):
        self.can_work, self.can_push = can_work, can_push
        self.open()
        self.window_flush_lease_complete()
        self.cancel_pending()
        self.follow_output()
        self.health()
        self.test.assertEqual(self.b.page_errors(), [])


class ConsoleBrowserTest(unittest.TestCase):
    """The console in headless Chromium, keys off."""

    server_args = ()

    @classmethod
    def setUpClass(cls):
        require_build(cls)
        if browser.chromium_path() is None:
            raise unittest.SkipTest("chromium not installed (./dev.sh installs it)")
        cls.server = harness.class_server(cls, args=list(cls.server_args) + ["--plugin-dir", HANDLERS])
        cls.browser = browser.Browser()
        cls.addClassCleanup(cls.browser.close)

    def tearDown(self):
        harness.log_on_failure(self, self.server)

    def test_desktop(self):
        Scenario(self, self.server, self.browser, "desktop", 1280).run()

    def test_phone(self):
        s = Scenario(self, self.server, self.browser, "phone", 390)
        s.run()
        # Nothing is wider than the phone's screen but the tables, which scroll.
        width = self.browser.evaluate("document.documentElement.scrollWidth")
        self.assertLessEqual(width, 390)


class ConsoleBrowserAuthTest(unittest.TestCase):
    """The console in headless Chromium, keys on: the page asks for a key."""

    @classmethod
    def setUpClass(cls):
        require_build(cls)
        if browser.chromium_path() is None:
            raise unittest.SkipTest("chromium not installed (./dev.sh installs it)")
        cls.server = harness.class_server(cls, args=["--auth", "--plugin-dir", HANDLERS])
        cls.admin_file = os.path.join(cls.server.data_dir, "db", "bootstrap-admin.key")
        with open(cls.admin_file) as f:
            cls.admin = f.read().strip()
        cls.browser = browser.Browser()
        cls.addClassCleanup(cls.browser.close)

    def tearDown(self):
        harness.log_on_failure(self, self.server)

    def test_with_an_admin_key(self):
        Scenario(self, self.server, self.browser, "auth", 1280, key=self.admin,
                 cli_key_file=self.admin_file).run()

    def test_a_wrong_key_is_asked_again(self):
        s = Scenario(self, self.server, self.browser, "auth-wrong", 1280, key=None)
        self.browser.open_page(1280, 900)
        self.browser.goto(self.server.http_base + "/#/runs")
        s.wait("document.getElementById('login').open", "the API key prompt")
        self.browser.fill("#login-key", "kf_0123456789abcdef_" + "0" * 64)
        self.browser.click("#login-submit")
        s.wait("document.getElementById('login').open && "
               "!document.getElementById('login-error').hidden", "the prompt again, with why")
        self.assertIsNone(self.browser.evaluate("sessionStorage.getItem('keyflow.apiKey')"))
        s.shot("refused")

    def test_a_read_only_key_sees_no_actions(self):
        status, doc = self.server.http("POST", "/v1/keys", {"name": "ui-reader", "grants": [
            {"scope": "runs:read"}, {"scope": "coordinators:read"}]},
            headers={"Authorization": "Bearer " + self.admin})
        self.assertEqual(status, 200, doc)
        reader = doc["apiKey"]
        admin = Scenario(self, self.server, self.browser, "reader", 1280, key=self.admin)
        sent = admin.api("POST", "/v1/workflows/ui-ro/keys/k/events",
                         {"rule": {"kind": "batch"}, "input": 1, "flush": True})
        run_id = sent["receipt"]["runId"]
        s = Scenario(self, self.server, self.browser, "reader", 1280, key=reader)
        s.open()
        self.assertEqual(self.browser.evaluate("document.body.dataset.scopes"),
                         "coordinators:read runs:read")
        # No send form (events:send), and no flush or cancel on a window.
        self.assertFalse(self.browser.evaluate("!!document.getElementById('send-form')"))
        s.go("#/runs/" + urllib.parse.quote(run_id, safe=""))
        s.wait("document.getElementById('run').dataset.status === 'PENDING'", "the run")
        self.assertFalse(self.browser.evaluate("!!document.getElementById('run-cancel')"))
        s.go("#/health")
        s.wait(s.has_text("main", "metrics:read"), "what the key lacks")
        s.shot("read-only")
        # The server decides all the same.
        status, _ = self.server.http("POST", "/v1/runs/%s:cancel" % urllib.parse.quote(run_id, safe=""),
                                     {}, headers={"Authorization": "Bearer " + reader})
        self.assertEqual(status, 403)
        self.assertEqual(self.browser.page_errors(), [])


if __name__ == "__main__":
    unittest.main()
