"""E2B's in-sandbox API (envd) served by warrend, against real microVMs, at the
wire as E2B's SDKs speak it: Connect over HTTP/1.1 with the JSON codec (unary
calls, server streams of 5-byte envelopes ending in an end envelope), /files
(multipart and octet-stream), /health, routed by E2b-Sandbox-Id and admitted
only with the sandbox's own X-Access-Token. Sandboxes are made with Warren's
REST API; the token is derived from the server's secret as warrend derives it
(HMAC-SHA256 of "envd", NUL, the sandbox id)."""
import base64
import gzip
import hashlib
import hmac
import json
import os
import struct
import subprocess
import threading
import time
import unittest

import fakenet
from test_e2b import sdk_script
from test_net import images_have_nic, net_conf, remove_namespaces
from warren import WarrenCase

ENVD = 49983


def token(w, sid, purpose="envd"):
    with open(os.path.join(w.state_dir, "token_secret"), "rb") as f:
        key = f.read()
    return hmac.new(key, purpose.encode() + b"\0" + sid.encode(), hashlib.sha256).hexdigest()


def envelope(obj, flags=0):
    body = obj if isinstance(obj, bytes) else json.dumps(obj).encode()
    return struct.pack(">BI", flags, len(body)) + body


class Stream:
    """One server stream: its envelopes read as they come."""

    def __init__(self, conn, resp):
        self.conn, self.r = conn, resp

    def next(self):
        """(flags, message), or None at the end of the body."""
        head = self.r.read(5)
        if not head:
            return None
        if len(head) != 5:
            raise AssertionError(f"short envelope head {head!r}")
        flags, n = struct.unpack(">BI", head)
        body = self.r.read(n)
        if len(body) != n:
            raise AssertionError("short envelope")
        return flags, json.loads(body)

    def events(self, until=None):
        """Events until the end envelope (returned last as ("END", msg)), or until
        until(event) holds."""
        out = []
        while True:
            e = self.next()
            if e is None:
                raise AssertionError(f"the body ended without an end envelope: {out}")
            flags, msg = e
            if flags & 2:
                out.append(("END", msg))
                if self.next() is not None:
                    raise AssertionError("bytes after the end envelope")
                return out
            if flags != 0:
                raise AssertionError(f"flags {flags}")
            out.append(msg["event"] if "event" in msg else msg)
            if until and until(out[-1]):
                return out

    def close(self):
        self.conn.close()


def output(events, key=None):
    data = b""
    for e in events:
        if isinstance(e, dict) and "data" in e:
            for k, v in e["data"].items():
                if key is None or k == key:
                    data += base64.b64decode(v)
    return data


class EnvdTest(WarrenCase):
    # a small gzip cap, so that a bomb crosses it quickly
    conf = {"port_domain": "sbx.test", "upload_gzip_max_bytes": str(4 << 20)}

    @classmethod
    def setUpClass(cls):
        super().setUpClass()
        cls.sid = cls.w.create()
        cls.tok = token(cls.w, cls.sid)

    def hdrs(self, sid=None, tok=None, port=ENVD, extra=None):
        h = {"E2b-Sandbox-Id": sid or self.sid, "E2b-Sandbox-Port": str(port)}
        if tok is not False:
            h["X-Access-Token"] = tok or self.tok
        h.update(extra or {})
        return h

    def unary(self, method, msg, **kw):
        h = self.hdrs(**kw)
        h.update({"Content-Type": "application/json", "Connect-Protocol-Version": "1"})
        c = self.w.conn(300)
        try:
            c.request("POST", "/" + method, body=json.dumps(msg).encode(), headers=h)
            r = c.getresponse()
            body = r.read()
            return r.status, (json.loads(body) if body else None)
        finally:
            c.close()

    def stream(self, method, msg, timeout_ms=None, raw=None, keepalive=None, **kw):
        h = self.hdrs(**kw)
        if keepalive is not None:
            h["Keepalive-Ping-Interval"] = keepalive
        h.update({"Content-Type": "application/connect+json", "Connect-Protocol-Version": "1"})
        if timeout_ms is not None:
            h["Connect-Timeout-Ms"] = str(timeout_ms)
        c = self.w.conn(300)
        c.request("POST", "/" + method, body=raw if raw is not None else envelope(msg),
                  headers=h)
        r = c.getresponse()
        if r.status != 200:
            raise AssertionError(f"{method}: {r.status} {r.read()[:300]!r}")
        self.assertEqual(r.getheader("Content-Type"), "application/connect+json")
        return Stream(c, r)

    def start(self, cmd, tag=None, stdin=None, pty=None, **kw):
        msg = {"process": {"cmd": "/bin/sh", "args": ["-c", cmd], "envs": {"E2BT": "yes"}}}
        if tag:
            msg["tag"] = tag
        if stdin is not None:
            msg["stdin"] = stdin
        if pty:
            msg["pty"] = {"size": {"cols": pty[0], "rows": pty[1]}}
            msg["process"] = {"cmd": "/bin/sh", "args": ["-i"]}
        s = self.stream("process.Process/Start", msg, **kw)
        first = s.events(until=lambda e: True)
        self.assertIn("start", first[0], first)
        return s, first[0]["start"]["pid"]

    def wait_for(self, s, needle, key=None):
        got = []

        def has(e):
            got.append(e)
            return needle in output(got, key)
        s.events(until=has)
        return output(got, key)

    def listed(self):
        st, body = self.unary("process.Process/List", {})
        self.assertEqual(st, 200, body)
        return {p["pid"]: p for p in body.get("processes", [])}

    # ---------------------------------------------------------------- admission

    def test_admission(self):
        st, body = self.unary("process.Process/List", {}, tok="0" * 64)
        self.assertEqual(st, 401, body)
        self.assertEqual(body["code"], "unauthenticated")
        st, body = self.unary("process.Process/List", {}, tok=False)
        self.assertEqual(st, 401, body)
        # the traffic token is not the envd one
        st, body = self.unary("process.Process/List", {}, tok=token(self.w, self.sid, "traffic"))
        self.assertEqual(st, 401, body)
        # another sandbox's id with this one's token
        st, body = self.unary("process.Process/List", {}, sid="nosuchsandbox", tok=self.tok)
        self.assertEqual(st, 401, body)
        # a token that fits an id no sandbox has
        st, body = self.unary("process.Process/List", {}, sid="nosuchsandbox",
                              tok=token(self.w, "nosuchsandbox"))
        self.assertEqual(st, 404, body)
        self.assertEqual(body["code"], "not_found")
        # the warren API key opens nothing here
        st, body = self.unary("process.Process/List", {}, tok=False,
                              extra={"Authorization": f"Bearer {self.w.key}"})
        self.assertEqual(st, 401, body)
        # /health
        c = self.w.conn()
        c.request("GET", "/health", headers=self.hdrs())
        r = c.getresponse()
        r.read()
        self.assertEqual(r.status, 204)
        c.request("GET", "/health", headers=self.hdrs(tok="1" * 64))
        r = c.getresponse()
        r.read()
        self.assertEqual(r.status, 401)
        c.close()
        # the code interpreter's port: its own token; a run takes envd's too, and a
        # sandbox without the kernel bridge says so (test_e2b_code.py has the rest)
        h = self.hdrs(port=49999, tok=False)
        h["E2B-Traffic-Access-Token"] = token(self.w, self.sid, "traffic")
        for path, extra, status in (("/health", {}, 200),
                                    ("/execute", {}, 401),
                                    ("/execute", {"X-Access-Token": self.tok}, 502)):
            c = self.w.conn()
            c.request("POST" if path == "/execute" else "GET", path,
                      body=b'{"code":"1"}' if path == "/execute" else None,
                      headers=dict(h, **extra))
            r = c.getresponse()
            self.assertEqual(r.status, status, (path, r.read()))
            r.read()
            c.close()
        c = self.w.conn()
        h = self.hdrs(port=49999, tok=False)
        c.request("GET", "/health", headers=h)
        r = c.getresponse()
        self.assertEqual(r.status, 401, r.read())
        c.close()
        st, body = self.unary("process.Process/List", {}, port=8080)
        self.assertEqual(st, 400, body)
        # by Host {port}-{id}.{port_domain}, on a connection's first request and on a
        # kept-alive one
        c = self.w.conn()
        for _ in range(2):
            c.request("POST", "/process.Process/List", body=b"{}",
                      headers={"Host": f"49983-{self.sid}.sbx.test", "X-Access-Token": self.tok,
                               "Content-Type": "application/json"})
            r = c.getresponse()
            out = r.read()
            self.assertEqual(r.status, 200, out)
            self.assertIn("processes", json.loads(out))
        c.request("POST", "/process.Process/List", body=b"{}",
                  headers={"Host": f"49983-{self.sid}.sbx.test",
                           "Content-Type": "application/json"})
        r = c.getresponse()
        self.assertEqual(r.status, 401, r.read())
        c.close()

    # ---------------------------------------------------------------- processes

    def test_start_output_exit(self):
        s, pid = self.start("echo hi $E2BT; echo err >&2; exit 3")
        self.assertGreater(pid, 0)
        ev = s.events()
        s.close()
        self.assertEqual(output(ev, "stdout"), b"hi yes\n")
        self.assertEqual(output(ev, "stderr"), b"err\n")
        ends = [e["end"] for e in ev if isinstance(e, dict) and "end" in e]
        self.assertEqual(len(ends), 1, ev)
        self.assertEqual(ends[0]["exitCode"], 3)
        self.assertTrue(ends[0]["exited"])
        self.assertEqual(ends[0]["status"], "exit status 3")
        self.assertEqual(ev[-1], ("END", {}))

    def test_keepalive(self):
        # a silent command: keepalive events fill the silence, then its end
        s, _ = self.start("sleep 3; echo woke", keepalive="1")
        ev = s.events()
        s.close()
        self.assertIn({"keepalive": {}}, ev)
        self.assertEqual(output(ev), b"woke\n")
        self.assertEqual(ev[-1], ("END", {}))
        # a malformed interval is ignored, not obeyed
        s, _ = self.start("echo plain", keepalive="nan")
        ev = s.events()
        s.close()
        self.assertEqual(output(ev), b"plain\n")
        self.assertNotIn({"keepalive": {}}, ev)

    def test_stdin_sendinput_closestdin(self):
        s, pid = self.start("cat; echo after", stdin=True)
        data = base64.b64encode(b"line one\n").decode()
        st, body = self.unary("process.Process/SendInput",
                              {"process": {"pid": pid}, "input": {"stdin": data}})
        self.assertEqual(st, 200, body)
        self.wait_for(s, b"line one\n")
        st, body = self.unary("process.Process/CloseStdin", {"process": {"pid": pid}})
        self.assertEqual(st, 200, body)
        ev = s.events()
        s.close()
        self.assertIn(b"after\n", output(ev))
        self.assertEqual([e for e in ev if isinstance(e, dict) and "end" in e][0]["end"]["exitCode"], 0)
        # stdin false (what the SDKs send by default): closed at once, cat ends
        s, _ = self.start("cat; echo closed", stdin=False)
        ev = s.events()
        s.close()
        self.assertEqual(output(ev), b"closed\n")
        # bad input
        st, body = self.unary("process.Process/SendInput",
                              {"process": {"pid": pid}, "input": {"stdin": "!!"}})
        self.assertEqual(st, 400, body)
        self.assertEqual(body["code"], "invalid_argument")
        st, body = self.unary("process.Process/SendInput",
                              {"process": {"pid": 999999}, "input": {"stdin": data}})
        self.assertEqual(st, 404, body)
        self.assertEqual(body["code"], "not_found")

    def test_signal_by_tag(self):
        s, pid = self.start("sleep 1000", tag="sleeper")
        self.assertIn(pid, self.listed())
        self.assertEqual(self.listed()[pid].get("tag"), "sleeper")
        st, body = self.unary("process.Process/SendSignal",
                              {"process": {"tag": "sleeper"}, "signal": "SIGNAL_SIGKILL"})
        self.assertEqual(st, 200, body)
        ev = s.events()
        s.close()
        end = [e for e in ev if isinstance(e, dict) and "end" in e][0]["end"]
        self.assertEqual(end["status"], "signal: killed")
        self.assertNotIn(pid, self.listed())
        st, body = self.unary("process.Process/SendSignal",
                              {"process": {"pid": pid}, "signal": "SIGNAL_NOPE"})
        self.assertEqual(st, 400, body)

    def test_pty_update(self):
        s, pid = self.start(None, pty=(80, 24))
        self.assertTrue(self.listed()[pid])
        st, body = self.unary("process.Process/Update",
                              {"process": {"pid": pid}, "pty": {"size": {"cols": 100, "rows": 30}}})
        self.assertEqual(st, 200, body)
        data = base64.b64encode(b"stty size; echo pty=$((6*7))\n").decode()
        st, body = self.unary("process.Process/SendInput",
                              {"process": {"pid": pid}, "input": {"pty": data}})
        self.assertEqual(st, 200, body)
        out = self.wait_for(s, b"pty=42", key="pty")
        self.assertIn(b"30 100", out)
        st, body = self.unary("process.Process/Update",
                              {"process": {"pid": pid}, "pty": {"size": {"cols": 0, "rows": 30}}})
        self.assertEqual(st, 400, body)
        st, body = self.unary("process.Process/SendSignal",
                              {"process": {"pid": pid}, "signal": "SIGNAL_SIGKILL"})
        self.assertEqual(st, 200, body)
        ev = s.events()
        s.close()
        self.assertEqual(ev[-1], ("END", {}))

    def test_connect_after_drop_and_deadline(self):
        s, pid = self.start("i=0; while true; do echo n$i; i=$((i+1)); sleep 0.2; done",
                            tag="counter")
        self.wait_for(s, b"n2\n")
        s.close()  # dropped: the process runs on
        self.assertIn(pid, self.listed())
        for sel in ({"pid": pid}, {"tag": "counter"}):
            c = self.stream("process.Process/Connect", {"process": sel})
            first = c.events(until=lambda e: True)
            self.assertEqual(first[0], {"start": {"pid": pid}})
            out = self.wait_for(c, b"\n")
            # only new output, never a replay from the start
            self.assertNotIn(b"n0\n", out)
            c.close()
        # a deadline ends the stream, not the process
        c = self.stream("process.Process/Connect", {"process": {"pid": pid}}, timeout_ms=1500)
        ev = c.events()
        c.close()
        self.assertEqual(ev[0], {"start": {"pid": pid}})
        self.assertEqual(ev[-1][0], "END")
        self.assertEqual(ev[-1][1]["error"]["code"], "deadline_exceeded", ev[-1])
        self.assertIn(pid, self.listed())
        c = self.stream("process.Process/Connect", {"process": {"pid": 987654}})
        ev = c.events()
        c.close()
        self.assertEqual(ev[-1][1]["error"]["code"], "not_found", ev)
        st, _ = self.unary("process.Process/SendSignal",
                           {"process": {"pid": pid}, "signal": "SIGNAL_SIGTERM"})
        self.assertEqual(st, 200)

    # ---------------------------------------------------------------- malformed

    def test_malformed(self):
        # a compressed envelope, two envelopes, a cut one, not JSON: all end the stream
        # with invalid_argument
        for raw in (envelope({"process": {"cmd": "/bin/true"}}, flags=1),
                    envelope({}) + envelope({}),
                    envelope({"process": {"cmd": "/bin/true"}})[:-3],
                    envelope(b"{nope"),
                    b""):
            s = self.stream("process.Process/Start", None, raw=raw)
            ev = s.events()
            s.close()
            self.assertEqual(len(ev), 1, ev)
            self.assertEqual(ev[0][1]["error"]["code"], "invalid_argument", (raw, ev))
        # Start without a command
        s = self.stream("process.Process/Start", {"process": {}})
        ev = s.events()
        s.close()
        self.assertEqual(ev[-1][1]["error"]["code"], "invalid_argument")
        # unary: not JSON, not an object, the stream content type
        for body, ctype, status in ((b"{x", "application/json", 400),
                                    (b"[1]", "application/json", 400),
                                    (b"{}", "application/connect+json", 415)):
            c = self.w.conn()
            h = self.hdrs()
            h["Content-Type"] = ctype
            c.request("POST", "/process.Process/List", body=body, headers=h)
            r = c.getresponse()
            self.assertEqual(r.status, status, r.read())
            c.close()
        st, body = self.unary("process.Process/Nope", {})
        self.assertEqual(st, 404, body)
        self.assertEqual(body["code"], "not_found")
        # a method not served is said to be missing, not pretended
        s = self.stream("process.Process/StreamInput", {})
        ev = s.events()
        s.close()
        self.assertEqual(ev[-1][1]["error"]["code"], "unimplemented", ev)

    def test_python_sdk_shapes(self):
        """The Python SDK's own requests (its e2b_connect client and httpx uploads, read
        from e2b-dev/E2B's python-sdk), replayed at the wire: pretty-printed JSON with
        Content-Encoding: identity on unary calls, connect-content-encoding and
        connect-timeout-ms on streams, lowercase headers."""
        h = {"e2b-sandbox-id": self.sid, "e2b-sandbox-port": str(ENVD),
             "x-access-token": self.tok, "user-agent": "connect-python",
             "connect-protocol-version": "1"}
        c = self.w.conn()
        c.request("POST", "/process.Process/List", body=b"{}\n",
                  headers=dict(h, **{"content-encoding": "identity",
                                     "content-type": "application/json"}))
        r = c.getresponse()
        out = r.read()
        self.assertEqual(r.status, 200, out)
        self.assertIn("processes", json.loads(out))
        msg = json.dumps({"process": {"cmd": "/bin/sh", "args": ["-c", "echo py"],
                                      "envs": {}}, "stdin": False}, indent=2).encode()
        c.request("POST", "/process.Process/Start", body=envelope(msg),
                  headers=dict(h, **{"connect-content-encoding": "identity",
                                     "connect-timeout-ms": "60000",
                                     "content-type": "application/connect+json"}))
        r = c.getresponse()
        self.assertEqual(r.status, 200)
        ev = Stream(c, r).events()
        self.assertEqual(output(ev), b"py\n")
        self.assertEqual(ev[-1], ("END", {}))
        # httpx's multipart: its own boundary, the path as the part's filename
        bnd = "7d1c1c9a3b7f4c0e9e3c5a3f2b1d0e4f"
        body = (f"--{bnd}\r\nContent-Disposition: form-data; name=\"file\"; "
                f"filename=\"/tmp/py.txt\"\r\nContent-Type: application/octet-stream\r\n\r\n"
                f"from python\r\n--{bnd}--\r\n").encode()
        c.request("POST", "/files?path=%2Ftmp%2Fpy.txt", body=body,
                  headers=dict(h, **{"content-type": f"multipart/form-data; boundary={bnd}"}))
        r = c.getresponse()
        out = r.read()
        self.assertEqual(r.status, 200, out)
        self.assertEqual(json.loads(out)[0]["path"], "/tmp/py.txt")
        c.close()
        self.assertEqual(self.download("/tmp/py.txt"), (200, b"from python"))

    # ---------------------------------------------------------------- watching

    def test_watchdir(self):
        st, _ = self.unary("filesystem.Filesystem/MakeDir", {"path": "/tmp/wd/sub"})
        self.assertIn(st, (200, 409))
        s = self.stream("filesystem.Filesystem/WatchDir", {"path": "/tmp/wd", "recursive": True})
        first = s.events(until=lambda e: True)
        self.assertEqual(first, [{"start": {}}])
        self.assertEqual(self.upload("/tmp/wd/sub/new.txt", b"x", multipart=False)[0], 200)
        got = []

        def seen(e):
            got.append(e)
            return {"filesystem": {"name": "sub/new.txt", "type": "EVENT_TYPE_CREATE"}} in got
        s.events(until=seen)
        st, _ = self.unary("filesystem.Filesystem/Move",
                           {"source": "/tmp/wd/sub/new.txt", "destination": "/tmp/wd/moved.txt"})
        self.assertEqual(st, 200)
        s.events(until=lambda e: e == {"filesystem": {"name": "moved.txt",
                                                      "type": "EVENT_TYPE_CREATE"}})
        # the watch is not a command, and it ends with its stream
        self.assertFalse([p for p in self.listed().values() if "watch" in p["config"]["cmd"]])
        s.close()
        r = self.w.request("GET", f"/v1/sandboxes/{self.sid}/processes")
        deadline = time.time() + 60
        while any(p["running"] and (p.get("tag") or "").startswith("watch:")
                  for p in r.json()["processes"]) and time.time() < deadline:
            time.sleep(0.2)
            r = self.w.request("GET", f"/v1/sandboxes/{self.sid}/processes")
        self.assertFalse([p for p in r.json()["processes"]
                          if p["running"] and (p.get("tag") or "").startswith("watch:")])
        # a path that cannot be watched ends the stream with its error
        s = self.stream("filesystem.Filesystem/WatchDir", {"path": "/tmp/wd/none"})
        ev = s.events()
        s.close()
        self.assertEqual(ev[-1][1]["error"]["code"], "not_found", ev)

    def new_watcher(self, path):
        """A polling watcher (the Python SDK's CreateWatcher) on a directory it makes."""
        st, _ = self.unary("filesystem.Filesystem/MakeDir", {"path": path})
        self.assertIn(st, (200, 409))
        st, body = self.unary("filesystem.Filesystem/CreateWatcher", {"path": path})
        self.assertEqual(st, 200, body)
        return body["watcherId"]

    def poll_watcher(self, wid, want, limit=60):
        """GetWatcherEvents polled until every event in want came (or limit s); all got."""
        got = []
        deadline = time.time() + limit
        while not all(x in got for x in want) and time.time() < deadline:
            st, body = self.unary("filesystem.Filesystem/GetWatcherEvents", {"watcherId": wid})
            self.assertEqual(st, 200, body)
            got += body["events"]
            time.sleep(0.3)
        for x in want:
            self.assertIn(x, got)
        return got

    def test_polling_watchers(self):
        """The Python SDK's sync watch_dir: CreateWatcher, then GetWatcherEvents polled,
        each event given once, then RemoveWatcher."""
        wid = self.new_watcher("/tmp/pw")

        def poll_until(want):
            return self.poll_watcher(wid, [want])

        created = {"name": "a.txt", "type": "EVENT_TYPE_CREATE"}
        self.assertEqual(self.upload("/tmp/pw/a.txt", b"x", multipart=False)[0], 200)
        self.assertEqual(poll_until(created).count(created), 1)
        self.assertEqual(self.upload("/tmp/pw/b.txt", b"y", multipart=False)[0], 200)
        got = poll_until({"name": "b.txt", "type": "EVENT_TYPE_CREATE"})
        self.assertNotIn(created, got)  # given once: the server kept the reader's place

        for bad, status in (("999999", 404), ("abc", 400), ("", 400)):
            st, body = self.unary("filesystem.Filesystem/GetWatcherEvents", {"watcherId": bad})
            self.assertEqual(st, status, (bad, body))
        st, body = self.unary("filesystem.Filesystem/CreateWatcher", {"path": "/tmp/pw/none"})
        self.assertEqual((st, body["code"]), (404, "not_found"), body)

        st, body = self.unary("filesystem.Filesystem/RemoveWatcher", {"watcherId": wid})
        self.assertEqual(st, 200, body)
        st, body = self.unary("filesystem.Filesystem/GetWatcherEvents", {"watcherId": wid})
        self.assertEqual(st, 404, body)
        deadline = time.time() + 60
        while True:
            r = self.w.request("GET", f"/v1/sandboxes/{self.sid}/processes/{wid}")
            if r.status != 200 or not r.json()["running"] or time.time() > deadline:
                break
            time.sleep(0.2)
        self.assertEqual((r.status, r.json()["running"]), (200, False), r)

    # ---------------------------------------------------------------- files

    def upload(self, path, data, multipart=True, boundary="----e2bTestBoundary", encoding=None):
        h = self.hdrs()
        if multipart:
            body = (f"--{boundary}\r\nContent-Disposition: form-data; name=\"file\"; "
                    f"filename=\"{path}\"\r\nContent-Type: application/octet-stream\r\n\r\n"
                    ).encode() + data + f"\r\n--{boundary}--\r\n".encode()
            h["Content-Type"] = f"multipart/form-data; boundary={boundary}"
        else:
            body = data
            h["Content-Type"] = "application/octet-stream"
        if encoding:
            # the whole body is encoded, a multipart one included (HTTP's Content-Encoding)
            body = gzip.compress(body) if encoding == "gzip" else body
            h["Content-Encoding"] = encoding
        c = self.w.conn()
        c.request("POST", "/files?path=" + path, body=body, headers=h)
        r = c.getresponse()
        out = r.read()
        c.close()
        return r.status, (json.loads(out) if out else None)

    def download(self, path):
        c = self.w.conn()
        c.request("GET", "/files?path=" + path, headers=self.hdrs())
        r = c.getresponse()
        out = r.read()
        c.close()
        return r.status, out

    def test_files(self):
        for d in ("/tmp/up", "/tmp/bad"):
            st, body = self.unary("filesystem.Filesystem/Remove", {"path": d})
            self.assertIn(st, (200, 404), body)
        # Data that looks like the delimiter up to its last byte: the byte after it is fixed
        # (a random one is the delimiter's "y" once in 256 runs, which ends the part there).
        blob = os.urandom(300000) + b"\r\n------e2bTestBoundarx" + os.urandom(1000)
        st, body = self.upload("/tmp/up/a.bin", blob)
        self.assertEqual(st, 200, body)
        self.assertEqual(body, [{"name": "a.bin", "type": "file", "path": "/tmp/up/a.bin"}])
        self.assertEqual(self.download("/tmp/up/a.bin"), (200, blob))
        st, body = self.upload("/tmp/up/b.txt", b"octets", multipart=False)
        self.assertEqual(st, 200, body)
        self.assertEqual(self.download("/tmp/up/b.txt"), (200, b"octets"))
        # relative to root's home
        st, body = self.upload("rel.txt", b"rel", multipart=False)
        self.assertEqual(st, 200, body)
        self.assertEqual(body[0]["path"], "/root/rel.txt")
        # a malformed multipart body writes nothing
        h = self.hdrs(extra={"Content-Type": "multipart/form-data; boundary=zz"})
        c = self.w.conn()
        c.request("POST", "/files?path=/tmp/bad/bad.txt", body=b"--yy\r\n\r\nx\r\n--yy--",
                  headers=h)
        r = c.getresponse()
        self.assertEqual(r.status, 400, r.read())
        c.close()
        # none of its bytes are written (the write it opened is aborted)
        st, got = self.download("/tmp/bad/bad.txt")
        self.assertIn(st, (200, 404))
        self.assertNotIn(b"x", got if st == 200 else b"")
        st, body = self.upload("/tmp/up/c.txt", b"x", boundary="b" * 71)
        self.assertEqual(st, 400, body)
        # Stat, ListDir, MakeDir, Move, Remove
        st, body = self.unary("filesystem.Filesystem/Stat", {"path": "/tmp/up/a.bin"})
        self.assertEqual(st, 200, body)
        e = body["entry"]
        self.assertEqual((e["name"], e["type"], e["path"], e["size"]),
                         ("a.bin", "FILE_TYPE_FILE", "/tmp/up/a.bin", str(len(blob))))
        self.assertEqual(e["permissions"], "-rw-r--r--")
        self.assertIn("modifiedTime", e)
        st, body = self.unary("filesystem.Filesystem/MakeDir", {"path": "/tmp/up/d/e"})
        self.assertEqual(st, 200, body)
        self.assertEqual(body["entry"]["type"], "FILE_TYPE_DIRECTORY")
        st, body = self.unary("filesystem.Filesystem/MakeDir", {"path": "/tmp/up/d/e"})
        self.assertEqual(st, 409, body)
        self.assertEqual(body["code"], "already_exists")
        st, body = self.unary("filesystem.Filesystem/ListDir", {"path": "/tmp/up", "depth": 1})
        self.assertEqual(st, 200, body)
        names = sorted(x["name"] for x in body["entries"])
        self.assertEqual(names, ["a.bin", "b.txt", "d"])
        st, body = self.unary("filesystem.Filesystem/ListDir", {"path": "/tmp/up", "depth": 2})
        self.assertIn("/tmp/up/d/e", [x["path"] for x in body["entries"]])
        st, body = self.unary("filesystem.Filesystem/Move",
                              {"source": "/tmp/up/b.txt", "destination": "/tmp/up/d/b2.txt"})
        self.assertEqual(st, 200, body)
        self.assertEqual(body["entry"]["path"], "/tmp/up/d/b2.txt")
        self.assertEqual(self.download("/tmp/up/d/b2.txt"), (200, b"octets"))
        st, body = self.unary("filesystem.Filesystem/Remove", {"path": "/tmp/up/d"})
        self.assertEqual(st, 200, body)
        st, body = self.unary("filesystem.Filesystem/Stat", {"path": "/tmp/up/d"})
        self.assertEqual(st, 404, body)
        self.assertEqual(body["code"], "not_found")
        st, body = self.download("/tmp/up/none")
        self.assertEqual(st, 404, body)
        self.assertEqual(json.loads(body)["code"], 404)
        st, body = self.unary("filesystem.Filesystem/Stat", {})
        self.assertEqual(st, 400, body)

    def post_raw(self, path, body, extra):
        c = self.w.conn()
        c.request("POST", "/files?path=" + path, body=body, headers=self.hdrs(extra=extra))
        r = c.getresponse()
        out = r.read()
        c.close()
        return r.status, (json.loads(out) if out else None)

    def test_files_gzip(self):
        """Content-Encoding: gzip uploads (E2B's files.write with gzip: true) are inflated
        into the file; a bomb past upload_gzip_max_bytes is 413, a corrupt body 400, and
        neither leaves a file."""
        st, body = self.unary("filesystem.Filesystem/Remove", {"path": "/tmp/gz"})
        self.assertIn(st, (200, 404), body)
        blob = os.urandom(1 << 20) + bytes(300000)  # random, then a compressible run
        st, body = self.upload("/tmp/gz/a.bin", blob, multipart=False, encoding="gzip")
        self.assertEqual(st, 200, body)
        self.assertEqual(body, [{"name": "a.bin", "type": "file", "path": "/tmp/gz/a.bin"}])
        self.assertEqual(self.download("/tmp/gz/a.bin"), (200, blob))
        # a gzip multipart body, and two members in a row (one stream, RFC 1952)
        st, body = self.upload("/tmp/gz/m.bin", blob[:70000], encoding="gzip")
        self.assertEqual(st, 200, body)
        self.assertEqual(self.download("/tmp/gz/m.bin"), (200, blob[:70000]))
        two = gzip.compress(b"first,") + gzip.compress(b"second")
        st, body = self.post_raw("/tmp/gz/two.txt", two, {
            "Content-Type": "application/octet-stream", "Content-Encoding": "gzip"})
        self.assertEqual(st, 200, body)
        self.assertEqual(self.download("/tmp/gz/two.txt"), (200, b"first,second"))
        # exactly the cap is taken
        st, body = self.upload("/tmp/gz/cap.bin", bytes(4 << 20), multipart=False,
                               encoding="gzip")
        self.assertEqual(st, 200, body)
        st, body = self.unary("filesystem.Filesystem/Stat", {"path": "/tmp/gz/cap.bin"})
        self.assertEqual(body["entry"]["size"], str(4 << 20))

        def gone(path):
            st, _ = self.download(path)
            self.assertEqual(st, 404, path)

        # a bomb: 64 MiB of zeros in ~64 KB of gzip, past the 4 MiB cap
        bomb = gzip.compress(bytes(64 << 20), compresslevel=9)
        self.assertLess(len(bomb), 100000)
        st, body = self.post_raw("/tmp/gz/bomb.bin", bomb, {
            "Content-Type": "application/octet-stream", "Content-Encoding": "gzip"})
        self.assertEqual(st, 413, body)
        self.assertIn("upload_gzip_max_bytes", body["message"])
        gone("/tmp/gz/bomb.bin")
        # and one over a file that was there: no partial file is left either
        self.assertEqual(self.upload("/tmp/gz/old.txt", b"old", multipart=False)[0], 200)
        st, body = self.post_raw("/tmp/gz/old.txt", bomb, {
            "Content-Type": "application/octet-stream", "Content-Encoding": "gzip"})
        self.assertEqual(st, 413, body)
        gone("/tmp/gz/old.txt")
        # corrupt: a flipped byte mid-stream, a cut-off stream, not gzip at all, empty
        good = gzip.compress(os.urandom(200000))
        bad = bytearray(good)
        bad[len(bad) // 2] ^= 0xFF
        for name, b in (("flip", bytes(bad)), ("cut", good[:-9]), ("plain", b"plain text"),
                        ("empty", b"")):
            st, body = self.post_raw(f"/tmp/gz/{name}.bin", b, {
                "Content-Type": "application/octet-stream", "Content-Encoding": "gzip"})
            self.assertEqual(st, 400, (name, body))
            gone(f"/tmp/gz/{name}.bin")
        # other codings are refused before anything is written
        for enc in ("br", "deflate", "gzip, gzip"):
            st, body = self.post_raw("/tmp/gz/enc.bin", b"x", {
                "Content-Type": "application/octet-stream", "Content-Encoding": enc})
            self.assertEqual(st, 415, (enc, body))
            self.assertIn("Content-Encoding", body["message"])
        gone("/tmp/gz/enc.bin")
        # identity is a plain upload
        st, body = self.upload("/tmp/gz/id.txt", b"same", multipart=False, encoding="identity")
        self.assertEqual((st, self.download("/tmp/gz/id.txt")), (200, (200, b"same")))

    # ---------------------------------------------------------------- restart

    def wait_up(self):
        deadline = time.time() + 60
        while True:
            st, body = self.unary("process.Process/List", {})
            if st == 200 or time.time() > deadline:
                break
            time.sleep(0.2)
        self.assertEqual(st, 200, body)

    def test_z_watcher_restart(self):
        """A polling watcher survives a kill -9 of warrend: the same watcherId then gives
        the events it had not given yet, each once, and none it gave before."""
        wid = self.new_watcher("/tmp/rw")

        def poll_until(want):
            return self.poll_watcher(wid, want)

        def created(name):
            return {"name": name, "type": "EVENT_TYPE_CREATE"}

        self.assertEqual(self.upload("/tmp/rw/a.txt", b"a", multipart=False)[0], 200)
        poll_until([created("a.txt")])
        # events the watcher has not given yet, made before the kill
        for n in ("b.txt", "c.txt"):
            self.assertEqual(self.upload("/tmp/rw/" + n, b"x", multipart=False)[0], 200)
        # the watch itself has seen them: a native read of its ring shows them
        deadline = time.time() + 60
        while time.time() < deadline:
            r = self.w.request("GET", f"/v1/sandboxes/{self.sid}/processes/{wid}/output")
            if r.status == 200 and b"c.txt" in r.body:
                break
            time.sleep(0.3)
        self.assertIn(b"c.txt", r.body)
        self.w.kill9()
        self.w.start()
        self.wait_up()
        got = poll_until([created("b.txt"), created("c.txt")])
        self.assertEqual(got.count(created("b.txt")), 1, got)
        self.assertEqual(got.count(created("c.txt")), 1, got)
        self.assertNotIn(created("a.txt"), got)  # given before the restart: not again
        # later events come on the same watcher; an unknown id is still 404
        self.assertEqual(self.upload("/tmp/rw/d.txt", b"x", multipart=False)[0], 200)
        got = poll_until([created("d.txt")])
        self.assertNotIn(created("c.txt"), got)
        st, body = self.unary("filesystem.Filesystem/GetWatcherEvents", {"watcherId": "999999"})
        self.assertEqual(st, 404, body)
        st, body = self.unary("filesystem.Filesystem/RemoveWatcher", {"watcherId": wid})
        self.assertEqual(st, 200, body)
        # removed: gone from disk too, so another restart does not bring it back
        self.w.kill9()
        self.w.start()
        self.wait_up()
        st, body = self.unary("filesystem.Filesystem/GetWatcherEvents", {"watcherId": wid})
        self.assertEqual(st, 404, body)

    def test_z_kill9_warrend(self):
        s, pid = self.start("i=0; while true; do echo k$i; i=$((i+1)); sleep 0.2; done",
                            tag="survivor")
        self.wait_for(s, b"k1\n")
        s.close()
        self.w.kill9()
        self.w.start()
        deadline = time.time() + 60
        while True:
            st, body = self.unary("process.Process/List", {})
            if st == 200 or time.time() > deadline:
                break
            time.sleep(0.2)
        self.assertEqual(st, 200, body)
        self.assertIn(pid, {p["pid"] for p in body["processes"]})
        c = self.stream("process.Process/Connect", {"process": {"tag": "survivor"}})
        self.assertEqual(c.events(until=lambda e: True)[0], {"start": {"pid": pid}})
        self.assertRegex(self.wait_for(c, b"\n").decode(), r"k\d+\n")
        c.close()


def stream_sdk_script(name, package, port, key, timeout, on_need, **env):
    """run_sdk_script (test_e2b.py) for a script that asks the test for something while
    it runs: its stdout is read line by line, each {"need": ...} line is given to
    on_need(line) as it comes, and then "go" is written to the script's stdin. Killed
    after timeout seconds. (returncode, its checks, its stderr)."""
    with sdk_script(name, package, port, key, **env) as (argv, env):
        with subprocess.Popen(argv, env=env, stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                              stderr=subprocess.PIPE, text=True) as p:
            return _stream(p, timeout, on_need)


def _stream(p, timeout, on_need):
    err = []
    reader = threading.Thread(target=lambda: err.append(p.stderr.read()), daemon=True)
    reader.start()
    watchdog = threading.Timer(timeout, p.kill)
    watchdog.start()
    checks = []
    try:
        for line in p.stdout:
            if not line.startswith("{"):
                continue
            msg = json.loads(line)
            if "need" in msg:
                on_need(msg)
                p.stdin.write("go\n")
                p.stdin.flush()
            else:
                checks.append(msg)
        p.wait()
    finally:
        watchdog.cancel()
        if p.poll() is None:
            p.kill()
            p.wait()
        reader.join(10)
    return p.returncode, checks, "".join(err)


SDK_DOMAIN = "sdk.test"


class EnvdSdkTest(WarrenCase):
    """E2B's unmodified JS SDK (npm e2b@2.51.0, setup.sh's npm cache) through
    e2b_envd.mjs: commands, pty and files on a sandbox it creates itself, a request to
    a port of it at the host sbx.getHost names (port_domain, VM networking in the fake
    network of fakenet.py), and commands.connect after warrend's kill -9 and restart."""

    conf = net_conf(port_domain=SDK_DOMAIN, boot_timeout_seconds="300")
    net = None

    @classmethod
    def setUpClass(cls):
        why = fakenet.have_tools()
        if why:
            raise unittest.SkipTest(f"the SDK's port request: {why}")
        if not images_have_nic():
            raise unittest.SkipTest("the SDK's port request: the guest images have no virtio_net")
        cls.net = fakenet.FakeNet()
        cls.net.enter()
        try:
            super().setUpClass()
        except BaseException:
            cls.net.close()
            raise

    @classmethod
    def tearDownClass(cls):
        try:
            super().tearDownClass()
            remove_namespaces(cls.w)
        finally:
            cls.net.close()

    def restart(self, need):
        """The script's sandbox lives on through warrend's kill -9; until its guest answers."""
        self.assertEqual(need["need"], "restart", need)
        self.w.kill9()
        self.w.start()
        r = self.w.wait_guest(need["id"])
        self.assertEqual(r.status, 200, r)

    def test_sdk(self):
        with open(os.path.join(self.w.state_dir, "e2b_api_key")) as f:
            key = f.read().strip()
        rc, checks, err = stream_sdk_script("e2b_envd.mjs", "e2b", self.w.port, key, 900,
                                            self.restart, E2B_TEST_TEMPLATE="base",
                                            E2B_TEST_PORT_DOMAIN=SDK_DOMAIN)
        failed = [c for c in checks if not c["ok"]]
        self.assertEqual(rc, 0, f"{failed}\nstderr: {err[-3000:]}\n{self.w.log_text()}")
        names = [c["check"] for c in checks]
        for want in ("create", "commands.run", "envs and cwd", "exit code error",
                     "commands.list", "commands.kill", "sendStdin and closeStdin",
                     "connect after disconnect", "pty", "files.write", "files.read",
                     "files binary", "files.list", "files.watchDir", "files.makeDir", "files.makeDir exists",
                     "files.rename", "files.exists", "files.remove", "getHost",
                     "trafficAccessToken", "port request", "port request needs the token",
                     "port server killed", "counter runs", "restarted", "connect after restart",
                     "listed after restart", "Sandbox.connect after restart",
                     "listed by the new Sandbox", "counter killed", "done"):
            self.assertIn(want, names)


if __name__ == "__main__":
    unittest.main()
