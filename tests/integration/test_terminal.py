"""The browser terminal: the page and its static files served by the
real warrend, and, in headless Debian chromium driven by playwright-core
(terminal_e2e.js), the page on a real microVM's PTY: a command's output, the
PTY's size following the window, output replayed on reload, and a page that
stays responsive while `yes` floods it (flow control on xterm.js's write
callbacks).

TestTerminalPage needs no VM and no PTY socket; TestTerminalBrowser needs the
PTY WebSocket (warren.pty.v1) and Debian's chromium with the npm packages
that scripts/setup.sh installs."""
import json
import os
import re
import shutil
import socket
import subprocess
import sys
import tempfile
import time
import unittest

from warren import HERE, Warren, WarrenCase


def web_dir():
    d = os.environ.get("WARREN_WEB_DIR")
    if d:
        return d
    cache = os.environ.get("WARREN_CACHE", os.path.expanduser("~/.cache/warren"))
    return os.path.join(cache, "npm", "current", "node_modules")


def raw_get(port, target):
    """GET target exactly as written (no client-side normalization): (status, body)."""
    with socket.create_connection(("127.0.0.1", port), timeout=60) as s:
        s.sendall(f"GET {target} HTTP/1.1\r\nHost: 127.0.0.1\r\nConnection: close\r\n\r\n"
                  .encode())
        data = b""
        while True:
            b = s.recv(65536)
            if not b:
                break
            data += b
    head, _, body = data.partition(b"\r\n\r\n")
    return int(head.split()[1]), body


class TestTerminalPage(WarrenCase):
    """The page and the xterm.js files: what is served, with which type, and nothing else."""

    def test_page_and_files(self):
        r = self.w.request("GET", "/terminal/anything-1", auth=False)
        self.assertEqual(r.status, 200, r)
        self.assertTrue(r.headers["content-type"].startswith("text/html"), r.headers)
        self.assertEqual(r.headers.get("x-content-type-options"), "nosniff")
        self.assertEqual(r.headers.get("referrer-policy"), "no-referrer")
        self.assertIn(b"/static/terminal.js", r.body)
        with open(os.path.join(HERE, "..", "..", "web", "terminal.html"), "rb") as f:
            self.assertEqual(r.body, f.read())
        r = self.w.request("GET", "/static/terminal.js", auth=False)
        self.assertEqual(r.status, 200, r)
        self.assertTrue(r.headers["content-type"].startswith("text/javascript"), r.headers)
        self.assertIn(b"warren.pty.v1", r.body)
        for url, rel, ctype in [
                ("/static/xterm/xterm.js", "@xterm/xterm/lib/xterm.js", "text/javascript"),
                ("/static/xterm/xterm.css", "@xterm/xterm/css/xterm.css", "text/css"),
                ("/static/xterm/addon-fit.js", "@xterm/addon-fit/lib/addon-fit.js",
                 "text/javascript")]:
            r = self.w.request("GET", url, auth=False)
            self.assertEqual(r.status, 200, (url, r))
            self.assertTrue(r.headers["content-type"].startswith(ctype), (url, r.headers))
            with open(os.path.join(web_dir(), rel), "rb") as f:
                self.assertEqual(r.body, f.read(), url)

    def test_nothing_else(self):
        # (lws itself collapses "//" and resolves "..": what is left must still miss.)
        for target in ["/static/xterm/../../../../../../etc/passwd",
                       "/static/xterm/%2e%2e/%2e%2e/%2e%2e/%2e%2e/etc/passwd",
                       "/static/xterm/..%2f..%2fxterm%2fpackage.json",
                       "/static/xterm/xterm.js.map",
                       "/static/xterm/./../xterm/../../web/terminal.html",
                       "/static/xterm/@xterm/xterm/package.json",
                       "/static/", "/terminal/", "/terminal/a/b", "/terminal/..%2f..%2fetc"]:
            status, body = raw_get(self.w.port, target)
            self.assertIn(status, (400, 403, 404), (target, status, body[:200]))
            self.assertNotIn(b"root:", body, target)
            self.assertNotIn(b'"name"', body, target)
        r = self.w.request("POST", "/terminal/abc", body=b"", auth=False)
        self.assertError(r, 405, "method_not_allowed")
        # The REST routes still need the key.
        self.assertError(self.w.request("GET", "/v1/sandboxes", auth=False), 401)

    def test_no_xterm_is_503(self):
        empty = tempfile.mkdtemp(prefix="warren-web-")
        w = Warren({"web_dir": empty}).start()
        try:
            r = w.request("GET", "/terminal/abc", auth=False)
            self.assertError(r, 503, "terminal_unavailable")
            self.assertIn(empty, r.json()["error"]["message"])
            self.assertIn("setup.sh", r.json()["error"]["message"])
            r = w.request("GET", "/static/xterm/xterm.js", auth=False)
            self.assertError(r, 503, "terminal_unavailable")
            # Compiled in: still there.
            self.assertEqual(w.request("GET", "/static/terminal.js", auth=False).status, 200)
        finally:
            w.cleanup()
            shutil.rmtree(empty, ignore_errors=True)


class Browser:
    """terminal_e2e.js in a child process: one JSON line each way per call."""

    def __init__(self):
        node = shutil.which("node")
        chromium = os.environ.get("CHROMIUM", "/usr/bin/chromium")
        nm = web_dir()
        # A missing tool is a broken set-up (scripts/setup.sh installs them all), not a skip.
        if not node or not os.path.exists(chromium) or \
                not os.path.isdir(os.path.join(nm, "playwright-core")):
            raise RuntimeError(f"need node, {chromium} and playwright-core in {nm}: "
                               "run scripts/setup.sh")
        self.p = subprocess.Popen(
            [node, os.path.join(HERE, "terminal_e2e.js")], stdin=subprocess.PIPE,
            stdout=subprocess.PIPE, env=dict(os.environ, NODE_PATH=nm, CHROMIUM=chromium),
            text=True, bufsize=1)

    def call(self, cmd, **kw):
        kw["cmd"] = cmd
        self.p.stdin.write(json.dumps(kw) + "\n")
        self.p.stdin.flush()
        line = self.p.stdout.readline()
        if not line:
            raise AssertionError(f"terminal_e2e.js ended (exit {self.p.wait()})")
        r = json.loads(line)
        if not r["ok"]:
            raise AssertionError(f"{cmd}: {r['error']}")
        return r["value"]

    def close(self):
        try:
            self.call("close")
        except Exception:
            pass
        try:
            self.p.stdin.close()
            self.p.wait(timeout=30)
        except subprocess.TimeoutExpired:
            self.p.kill()
            self.p.wait()


class BrowserCase(WarrenCase):
    """A sandbox and a headless chromium for the class (helpers only, no tests)."""

    # Generous for TCG: a shell's first prompt and each echo cross a VM.
    WAIT_S = 120

    @classmethod
    def setUpClass(cls):
        super().setUpClass()
        try:
            cls.sid = cls.w.create()
            cls.browser = Browser()
        except BaseException:
            cls.w.cleanup()
            raise

    @classmethod
    def tearDownClass(cls):
        cls.browser.close()
        super().tearDownClass()

    def page_url(self, extra=""):
        """The page URL and the headers the browser must send. A browser cannot set headers
        on a WebSocket: with the token route (POST .../tokens) the page gets a token in its
        URL, as in production; without it (before that branch is merged) chromium is told
        to send the API key on every request, the WebSocket handshake included."""
        r = self.w.request("POST", f"/v1/sandboxes/{self.sid}/tokens",
                           {"ttl_seconds": 3600, "scope": ["pty", "exec"]})
        base = f"http://127.0.0.1:{self.w.port}/terminal/{self.sid}"
        if r.status in (200, 201) and "token" in r.json():
            return f"{base}?token={r.json()['token']}{extra}", {}
        return base + ("?" + extra.lstrip("&") if extra else ""), \
            {"Authorization": f"Bearer {self.w.key}"}

    def open(self, width=1000, height=600):
        url, headers = self.page_url()
        self.browser.call("open", url=url, headers=headers, width=width, height=height)
        self.wait_info(lambda i: i["state"] == "open" and i["pid"])

    def wait_info(self, pred, timeout=None):
        deadline = time.time() + (timeout or self.WAIT_S)
        while True:
            i = self.browser.call("info")
            if pred(i):
                return i
            if time.time() > deadline:
                raise AssertionError(f"terminal never got there: {i}\n"
                                     f"{self.browser.call('text')[-2000:]}")
            time.sleep(0.2)

    def wait_text(self, pattern, timeout=None, count=1):
        """The terminal's text once `pattern` (a regex) matches it `count` times: the matches."""
        deadline = time.time() + (timeout or self.WAIT_S)
        while True:
            text = self.browser.call("text")
            found = re.findall(pattern, text)
            if len(found) >= count:
                return found
            if time.time() > deadline:
                raise AssertionError(f"{pattern!r} (x{count}) never appeared in:\n{text[-3000:]}"
                                     f"\nerrors: {self.browser.call('errors')}"
                                     f"\nconsole: {self.browser.call('console')[-10:]}")
            time.sleep(0.2)



class TestTerminalBrowser(BrowserCase):
    """The page in headless chromium on a real sandbox's PTY."""

    def test_type_and_see(self):
        self.open()
        # The output, not the echo of the typed line: the line says 6*7.
        self.browser.call("type", text="echo typed-$((6*7))\n")
        self.wait_text(r"typed-42")
        # The first prompt already had the page's size.
        info = self.browser.call("info")
        self.browser.call("type", text="echo size=$(stty size)\n")
        self.assertEqual(self.wait_text(r"size=(\d+) (\d+)")[0],
                         (str(info["rows"]), str(info["cols"])))
        self.assertEqual(self.browser.call("errors"), [])

    def test_refused_token_stops_and_says_why(self):
        """A handshake refused for good (a tampered token) is not retried for ever: the
        page asks why over plain HTTP, shows it and stops."""
        url, headers = self.page_url()
        self.assertIn("token=", url)
        bad = re.sub(r"token=([^&]*)", lambda m: "token=" + m.group(1)[:-3] + "AAA", url)
        self.browser.call("open", url=bad, headers=headers, width=800, height=400)
        self.wait_info(lambda i: i["state"] == "closed")
        self.assertIn("refused:", self.wait_text(r"refused:[^\n]*")[0])
        time.sleep(2)  # longer than the first retry delays: still closed, no new attempt
        self.assertEqual(self.browser.call("info")["state"], "closed")

    def test_resize_follows_window(self):
        self.open(width=800, height=400)
        small = self.browser.call("info")
        self.browser.call("type", text="echo A=$(stty size)\n")
        self.assertEqual(self.wait_text(r"A=(\d+) (\d+)")[0],
                         (str(small["rows"]), str(small["cols"])))
        self.browser.call("resize", width=1300, height=800)
        big = self.wait_info(lambda i: i["cols"] > small["cols"] and i["rows"] > small["rows"])
        self.browser.call("type", text="echo B=$(stty size)\n")
        self.assertEqual(self.wait_text(r"B=(\d+) (\d+)")[0],
                         (str(big["rows"]), str(big["cols"])))

    def test_reload_replays(self):
        self.open()
        self.browser.call("type", text="echo before-$((1000+234))\n")
        self.wait_text(r"before-1234")
        pid = self.browser.call("info")["pid"]
        self.browser.call("reload")
        # The address bar named the PTY: the same one, its output replayed from the ring.
        info = self.wait_info(lambda i: i["state"] == "open" and i["pid"])
        self.assertEqual(info["pid"], pid)
        self.assertIn(f"pid={pid}", info["url"])
        self.wait_text(r"before-1234")
        # And it is live: input still reaches the same shell.
        self.browser.call("type", text="echo after-$((2000+345))\n")
        self.wait_text(r"after-2345")

    def test_yes_does_not_freeze(self):
        self.open()
        self.browser.call("type", text="yes\n")
        self.wait_text(r"(?m)^y$", count=5)
        # For 5 s: what the tab holds undrawn stays within the window the server may send
        # ahead of its ACKs (1 MiB, plus a frame in flight), since it ACKs only once drawn.
        start = self.browser.call("info")["offset"]
        t_end, most = time.time() + 5, 0
        while time.time() < t_end:
            most = max(most, self.browser.call("info")["drawing"])
            time.sleep(0.1)
        flowed = self.browser.call("info")["offset"] - start
        print(f"\n  yes: {flowed} bytes drawn in 5 s, at most {most} bytes waiting in xterm.js",
              file=sys.stderr)
        self.assertLessEqual(most, 2 << 20)
        # The page's JS thread still answers while the flood goes on.
        t0 = time.time()
        self.browser.call("ping")
        self.browser.call("text")
        self.assertLess(time.time() - t0, 30, "the page took too long to answer under `yes`")
        off = self.browser.call("info")["offset"]
        self.browser.call("press", key="Control+C")
        self.browser.call("type", text="echo stopped-$((3*37))\n")
        self.wait_text(r"stopped-111", timeout=300)
        # The output went on while we looked (flow control does not stop it, it paces it).
        self.assertGreater(self.browser.call("info")["offset"], off)
        self.assertEqual(self.browser.call("errors"), [])

    def test_more_than_a_window(self):
        # 2 MiB of output: twice what the server sends ahead of the page's ACKs, so it all
        # arrives only if the page acknowledges what it drew.
        self.open()
        self.browser.call("type", text="seq 1 400000 > /tmp/big; wc -c /tmp/big\n")
        size = int(self.wait_text(r"(\d+) /tmp/big")[0])
        self.assertGreater(size, 2 << 20)
        t0, start = time.time(), self.browser.call("info")["offset"]
        self.browser.call("type", text="cat /tmp/big; echo done-$((5*5))\n")
        self.wait_text(r"(?m)^399999\s+400000\s+done-25$", timeout=900)
        flowed = self.browser.call("info")["offset"] - start
        print(f"\n  cat: {flowed} bytes through the page in {time.time() - t0:.1f} s",
              file=sys.stderr)
        self.assertGreater(flowed, size)


class TestTerminalRestart(BrowserCase):
    """kill -9 of warrend under an open page: it reconnects by itself, from its offset."""

    def test_reconnects_after_kill9(self):
        self.open()
        self.browser.call("type", text="echo shell=$$\n")
        shell = self.wait_text(r"shell=(\d+)")[0]
        self.browser.call(
            "type", text="i=0; while [ $i -lt 100000 ]; do echo c=$i; i=$((i+1)); sleep 0.05; done\n")
        self.wait_text(r"(?m)^c=20$")
        self.w.kill9()
        self.wait_info(lambda i: i["state"] != "open")
        last = max(int(x) for x in re.findall(r"(?m)^c=(\d+)$", self.browser.call("text")))
        self.w.start()
        # Nothing is done to the page: it reconnects from the offset it drew up to.
        self.wait_text(r"(?m)^c=%d$" % (last + 100), timeout=300)
        self.assertEqual(self.browser.call("info")["state"], "open")
        self.browser.call("press", key="Control+C")
        self.wait_text(r"\^C")  # the key reached the PTY (its line discipline echoes it)
        self.browser.call("type", text="echo again=$$\n")
        self.assertEqual(self.wait_text(r"again=(\d+)")[0], shell)
        # The counter's lines, joined across the restart: no gap, no repeat.
        nums = [int(x) for x in re.findall(r"(?m)^c=(\d+)$", self.browser.call("text"))]
        self.assertGreater(len(nums), last + 100)
        self.assertEqual(nums, list(range(len(nums))))

        # Keys typed while warrend is down are held by the page and sent, in order, once
        # the socket opens again: none is lost to the restart.
        self.w.kill9()
        self.wait_info(lambda i: i["state"] != "open")
        self.browser.call("type", text="echo held=$((6*7))\n")
        self.assertGreater(self.browser.call("info")["held"], 0)
        self.w.start()
        self.assertEqual(self.wait_text(r"held=(\d+)")[0], "42")
        self.assertEqual(self.browser.call("info")["held"], 0)


if __name__ == "__main__":
    unittest.main()
