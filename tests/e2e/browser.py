"""A headless Chromium (Debian's `chromium`) driven over the DevTools
protocol through a pipe (--remote-debugging-pipe: JSON messages ended by a
NUL byte, Chromium reading fd 3 and writing fd 4), so that no WebSocket
client and no driver binary is needed.

Waiting is always for a condition in the page with a deadline (wait_for),
never a sleep. Script errors in the page and Content-Security-Policy
violations are collected (page_errors) for the test to assert on.
"""

import base64
import json
import os
import select
import shutil
import subprocess
import tempfile
import time

COMMAND_TIMEOUT_S = 30


def chromium_path():
    return shutil.which("chromium") or shutil.which("chromium-browser")


class BrowserError(AssertionError):
    pass


class Browser:
    def __init__(self):
        exe = chromium_path()
        if exe is None:
            raise RuntimeError("chromium not found (apt install chromium)")
        self.profile = tempfile.mkdtemp(prefix="kf-chromium-")
        to_child_r, self._to_child = os.pipe()
        self._from_child, from_child_w = os.pipe()
        # Out of the way of 3 and 4, which the child's copies must take.
        high_r = os.dup2(to_child_r, 100)
        high_w = os.dup2(from_child_w, 101)
        for fd in (to_child_r, from_child_w):
            os.close(fd)

        def child_fds():
            os.dup2(high_r, 3)
            os.dup2(high_w, 4)

        args = [exe, "--headless=new", "--remote-debugging-pipe",
                "--user-data-dir=" + self.profile, "--no-first-run",
                "--no-default-browser-check", "--disable-gpu", "--disable-extensions",
                "--disable-background-networking", "--disable-sync", "--disable-dev-shm-usage",
                "--mute-audio", "--hide-scrollbars", "--password-store=basic", "about:blank"]
        if os.geteuid() == 0:
            args.insert(1, "--no-sandbox")  # Chromium refuses to run as root otherwise
        self.log_path = os.path.join(self.profile, "chromium.log")
        self._log = open(self.log_path, "wb")
        self.proc = subprocess.Popen(args, stdin=subprocess.DEVNULL, stdout=self._log,
                                     stderr=subprocess.STDOUT, pass_fds=(3, 4),
                                     preexec_fn=child_fds)
        os.close(high_r)
        os.close(high_w)
        self._buf = b""
        self._next_id = 0
        self.events = []
        self.session = None

    def close(self):
        if self.proc is not None:
            try:
                self.send("Browser.close", session=False, timeout=5)
            except Exception:
                pass
            try:
                self.proc.wait(timeout=10)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()
            self.proc = None
        for fd in (self._to_child, self._from_child):
            try:
                os.close(fd)
            except OSError:
                pass
        self._log.close()
        shutil.rmtree(self.profile, ignore_errors=True)

    # --- the protocol -----------------------------------------------------

    def _read_message(self, deadline):
        while b"\0" not in self._buf:
            left = deadline - time.time()
            if left <= 0:
                raise BrowserError("chromium: no answer in time")
            ready, _, _ = select.select([self._from_child], [], [], left)
            if ready:
                chunk = os.read(self._from_child, 1 << 20)
                if not chunk:
                    raise BrowserError("chromium exited; log:\n" + self.read_log())
                self._buf += chunk
        raw, self._buf = self._buf.split(b"\0", 1)
        return json.loads(raw)

    def send(self, method, params=None, session=True, timeout=COMMAND_TIMEOUT_S):
        self._next_id += 1
        msg = {"id": self._next_id, "method": method, "params": params or {}}
        if session and self.session:
            msg["sessionId"] = self.session
        data = json.dumps(msg).encode() + b"\0"
        while data:
            data = data[os.write(self._to_child, data):]
        deadline = time.time() + timeout
        while True:
            reply = self._read_message(deadline)
            if reply.get("id") == self._next_id:
                if "error" in reply:
                    raise BrowserError("%s: %s" % (method, reply["error"]))
                return reply.get("result", {})
            if "method" in reply:
                self.events.append(reply)

    def read_log(self):
        try:
            with open(self.log_path, "rb") as f:
                return f.read().decode(errors="replace")[-4000:]
        except OSError:
            return ""

    # --- a page -----------------------------------------------------------

    def open_page(self, width, height, mobile=False):
        """A new tab at about:blank with the given viewport; it becomes the
        target of every later command."""
        if self.session:
            self.send("Target.closeTarget", {"targetId": self.target}, session=False)
        self.target = self.send("Target.createTarget", {"url": "about:blank"},
                                session=False)["targetId"]
        self.session = self.send("Target.attachToTarget", {"targetId": self.target,
                                                           "flatten": True},
                                 session=False)["sessionId"]
        self.events = []
        for domain in ("Page", "Runtime", "Log"):
            self.send(domain + ".enable")
        self.send("Emulation.setDeviceMetricsOverride", {
            "width": width, "height": height, "deviceScaleFactor": 1, "mobile": mobile})

    def goto(self, url):
        self.send("Page.navigate", {"url": url})

    def evaluate(self, expression):
        r = self.send("Runtime.evaluate", {"expression": expression, "returnByValue": True,
                                           "awaitPromise": True})
        if "exceptionDetails" in r:
            raise BrowserError("script failed: %s\n%s" % (expression, json.dumps(r["exceptionDetails"])[:2000]))
        return r.get("result", {}).get("value")

    def wait_for(self, expression, what, timeout=15):
        """Evaluates `expression` until it is truthy in JavaScript, for at
        most `timeout` seconds; then fails naming `what` and the last
        error, if any."""
        expression = "!!(%s)" % expression
        deadline = time.time() + timeout
        last = None
        while time.time() < deadline:
            try:
                value = self.evaluate(expression)
                if value:
                    return value
                last = value
            except BrowserError as e:  # not there yet, or a navigation in between
                last = str(e)[:300]
            time.sleep(0.05)
        raise BrowserError("timed out after %.0fs waiting for %s (last value: %r)"
                           % (timeout, what, last))

    def text(self, selector):
        return self.evaluate("(document.querySelector(%s) || {}).textContent || ''"
                             % json.dumps(selector))

    def click(self, selector):
        """Clicks the element (it must be there and visible)."""
        ok = self.evaluate("""(() => { const e = document.querySelector(%s);
            if (!e || e.offsetParent === null && e.tagName !== 'DIALOG') return false;
            e.click(); return true; })()""" % json.dumps(selector))
        if not ok:
            raise BrowserError("no visible %s to click" % selector)

    def fill(self, selector, value):
        ok = self.evaluate("""(() => { const e = document.querySelector(%s); if (!e) return false;
            e.value = %s; e.dispatchEvent(new Event('input', {bubbles: true}));
            e.dispatchEvent(new Event('change', {bubbles: true})); return true; })()"""
                           % (json.dumps(selector), json.dumps(value)))
        if not ok:
            raise BrowserError("no %s to fill" % selector)

    def screenshot(self, path):
        """A PNG of the whole page (not only the viewport)."""
        data = self.send("Page.captureScreenshot", {"format": "png",
                                                    "captureBeyondViewport": True})["data"]
        os.makedirs(os.path.dirname(path), exist_ok=True)
        with open(path, "wb") as f:
            f.write(base64.b64decode(data))
        return path

    def page_errors(self):
        """Uncaught script errors and security (CSP) messages so far."""
        out = []
        for ev in self.events:
            if ev.get("method") == "Runtime.exceptionThrown":
                out.append(json.dumps(ev["params"]["exceptionDetails"])[:500])
            elif ev.get("method") == "Log.entryAdded":
                entry = ev["params"]["entry"]
                if entry.get("source") in ("security", "javascript") or \
                        "Content Security Policy" in entry.get("text", ""):
                    out.append(entry.get("text", ""))
        return out
