"""The PTY WebSocket ("warren.pty.v1", docs/API.md) against a real warrend and
real VMs, with Debian's python3-websockets: keystrokes echo, sizes, offsets
that join byte-exact across reconnects and a kill -9 of warrend, several
viewers with one stalled, a big stream byte-exact, malformed frames closing
only their own socket, and refusals before the upgrade.

Run with /usr/bin/python3 (Debian's modules). WARREN_BIG=1 also pushes
100 MiB through a PTY (the default run pushes 10 MiB).
"""
import asyncio
import http.client
import json
import os
import re
import time
import unittest
import urllib.parse

import websockets

from rawws import RawWs, check_close_codes, refused
from warren import RssPeak, Warren, WarrenCase, rss_kib

PROTO = "warren.pty.v1"
WINDOW = 1 << 20  # PROTO_WINDOW: output a socket may hold unacknowledged
T = 180  # seconds any single wait may take (TCG on a loaded 2-core machine)


def seq_bytes(n):
    """What `seq 1 n` shows on a terminal (onlcr: \\n becomes \\r\\n)."""
    return b"".join(b"%d\r\n" % i for i in range(1, n + 1))


class Pty:
    """One PTY socket: checks that every OUTPUT frame starts where the last one ended
    (or where a lost frame said), and ACKs what it got unless told not to."""

    def __init__(self, ws, ack):
        self.ws = ws
        self.ack = ack
        self.hello = None
        self.segs = []  # (offset, bytes) runs, in order, split only by lost
        self.next = None
        self.lost = []
        self.exit = None

    @classmethod
    async def open(cls, w, path, ack=True, **query):
        q = ("?" + urllib.parse.urlencode(query, quote_via=urllib.parse.quote)) if query else ""
        ws = await websockets.connect(
            f"ws://127.0.0.1:{w.port}{path}{q}", subprotocols=[PROTO],
            extra_headers={"Authorization": f"Bearer {w.key}"}, max_size=None,
            ping_interval=None, open_timeout=T, close_timeout=10)
        p = cls(ws, ack)
        m = await asyncio.wait_for(ws.recv(), T)
        assert m[0] == 0x11, m[:20]
        p.hello = json.loads(m[1:])
        assert p.hello["type"] == "hello", p.hello
        p.next = p.hello["offset"]
        p.segs.append((p.next, bytearray()))
        return p

    @property
    def pid(self):
        return self.hello["pid"]

    def data(self):
        """Everything received, when nothing was lost."""
        assert len(self.segs) == 1, self.lost
        return bytes(self.segs[0][1])

    def received(self):
        return sum(len(s) for _, s in self.segs)

    async def frame(self, timeout=T):
        """One frame; returns False once the socket closed."""
        try:
            m = await asyncio.wait_for(self.ws.recv(), timeout)
        except websockets.ConnectionClosed:
            return False
        if m[0] == 0x10:
            off = int.from_bytes(m[1:9], "big")
            # No gap, no duplicate.
            assert off == self.next, f"OUTPUT at {off}, expected {self.next}"
            self.segs[-1][1].extend(m[9:])
            self.next += len(m) - 9
            if self.ack and len(m) > 9:
                try:
                    await self.ws.send(b"\x02" + (len(m) - 9).to_bytes(4, "big"))
                except websockets.ConnectionClosed:
                    # The server's close arrived already; frames sent before it (an exit)
                    # may still be queued: the next recv returns them, then raises.
                    pass
        elif m[0] == 0x11:
            j = json.loads(m[1:])
            if j["type"] == "lost":
                assert j["offset"] == self.next, (j, self.next)
                self.lost.append(j)
                self.next += j["bytes"]
                self.segs.append((self.next, bytearray()))
            elif j["type"] == "exit":
                self.exit = j
            else:
                raise AssertionError(f"unexpected control frame {j}")
        else:
            raise AssertionError(f"unknown server opcode {m[0]:#x}")
        return True

    async def until(self, pattern, start=None, timeout=T):
        """Read until pattern shows in the output after offset start; the match."""
        start = self.hello["offset"] if start is None else start
        deadline = time.time() + timeout
        rx = re.compile(pattern.encode() if isinstance(pattern, str) else pattern)
        while True:
            base, buf = self.segs[-1]
            m = rx.search(buf, max(0, start - base))
            if m:
                return m
            left = deadline - time.time()
            if left <= 0 or not await self.frame(left):
                raise AssertionError(f"never saw {pattern!r}; tail {bytes(buf[-300:])!r}")

    async def until_exit(self, timeout=T):
        deadline = time.time() + timeout
        while self.exit is None:
            left = deadline - time.time()
            if left <= 0 or not await self.frame(left):
                raise AssertionError("no exit frame")

    async def send(self, keys):
        await self.ws.send(b"\x00" + (keys.encode() if isinstance(keys, str) else keys))

    async def resize(self, cols, rows):
        await self.ws.send(b"\x01" + cols.to_bytes(2, "big") + rows.to_bytes(2, "big"))

    async def closed(self, timeout=T):
        """Drain until the server closes; (code, reason)."""
        deadline = time.time() + timeout
        while await self.frame(max(0.1, deadline - time.time())):
            pass
        await self.ws.wait_closed()
        return self.ws.close_code, self.ws.close_reason

    async def close(self):
        await self.ws.close()


def upgrade(w, path, auth=True, proto=PROTO, origin=None):
    """A raw upgrade request; the HTTP answer (status, JSON body) when refused."""
    c = http.client.HTTPConnection("127.0.0.1", w.port, timeout=T)
    h = {"Upgrade": "websocket", "Connection": "Upgrade", "Sec-WebSocket-Version": "13",
         "Sec-WebSocket-Key": "dGhlIHNhbXBsZSBub25jZQ=="}
    if proto:
        h["Sec-WebSocket-Protocol"] = proto
    if auth:
        h["Authorization"] = f"Bearer {w.key}"
    if origin:
        h["Origin"] = origin
    try:
        c.request("GET", path, headers=h)
        r = c.getresponse()
        body = r.read() if r.status != 101 else b""
        return r.status, (json.loads(body) if body else None)
    finally:
        c.close()


def run(coro):
    return asyncio.run(coro)


class PtySocketTest(WarrenCase):
    # A ring that holds the whole 10 MiB stream, so byte-exact does not depend on how
    # fast this client reads on a loaded machine.
    conf = {"process_ring_bytes": 16 << 20, "allowed_origins": "https://app.example"}

    @classmethod
    def setUpClass(cls):
        super().setUpClass()
        cls.sid = cls.w.create()

    def path(self, pid=None):
        return f"/v1/sandboxes/{self.sid}/pty" + (f"/{pid}" if pid else "")

    def test_echo_size_and_resize(self):
        async def t():
            p = await Pty.open(self.w, self.path(), cols=100, rows=30)
            self.assertEqual((p.hello["cols"], p.hello["rows"], p.hello["offset"]), (100, 30, 0))
            self.assertGreater(p.pid, 1)
            # The first prompt already has the size asked for.
            await p.send("stty size\n")
            await p.until(r"\r\n30 100\r\n")
            # Keystrokes echo, and the shell runs them.
            mark = p.next
            await p.send("echo hi-$((6*7))\n")
            await p.until(r"echo hi-\$\(\(6\*7\)\)", start=mark)
            await p.until(r"\r\nhi-42\r\n", start=mark)
            # RESIZE reaches the terminal.
            await p.resize(120, 40)
            mark = p.next
            await p.send("stty size\n")
            await p.until(r"\r\n40 120\r\n", start=mark)
            # A second viewer learns the new size in its hello.
            q = await Pty.open(self.w, self.path(p.pid), offset=p.next)
            self.assertEqual((q.hello["cols"], q.hello["rows"]), (120, 40))
            await q.close()
            # exit: the exit frame, then a normal close.
            await p.send("exit 7\n")
            code, _ = await p.closed()
            self.assertEqual(code, 1000)
            self.assertEqual(p.exit["exit_code"], 7, p.exit)
        run(t())

    def test_reconnect_with_offset_joins_byte_exact(self):
        async def t():
            p = await Pty.open(self.w, self.path(), cmd="i=0; while true; do echo $i; "
                               "i=$((i+1)); sleep 0.02; done")
            await p.until(r"\r\n40\r\n")
            # Drop the socket mid-stream (no close handshake from us).
            first = p.data()
            p.ws.transport.abort()
            # Meanwhile the process keeps going.
            await asyncio.sleep(1)
            q = await Pty.open(self.w, self.path(p.pid), offset=len(first))
            self.assertEqual(q.hello["offset"], len(first))
            await q.until(r"\r\n%d\r\n" % 200, start=len(first))
            joined = (first + q.data()).decode()
            nums = [int(x) for x in joined.split("\r\n")[:-1]]
            self.assertEqual(nums, list(range(len(nums))))
            r = self.w.request("GET", f"/v1/sandboxes/{self.sid}/processes/{p.pid}")
            self.assertTrue(r.json()["running"], r)
            await q.ws.send(b"\x03\x09")  # SIGNAL 9
            await q.until_exit()
            self.assertEqual(q.exit["signal"], 9, q.exit)
        run(t())

    def test_two_viewers_and_a_stalled_one(self):
        n = 400000  # about 2.7 MB: more than a window

        async def t():
            a = await Pty.open(self.w, self.path(), cmd=f"read x; seq 1 {n} | cat")
            b = await Pty.open(self.w, self.path(a.pid), ack=False, offset=0)
            stalled = asyncio.ensure_future(self.drain(b))
            # Input from the stalled viewer reaches the process too.
            await b.send("go\n")
            await a.until_exit()
            out = a.data()
            self.assertTrue(out.endswith(seq_bytes(n)), out[-200:])
            self.assertEqual(a.lost, [])
            # The stalled viewer got at most a window, and the same bytes as the other.
            await asyncio.sleep(1)
            self.assertFalse(stalled.done())
            got = b.data()
            self.assertLessEqual(len(got), WINDOW)
            self.assertGreater(len(got), 0)
            self.assertEqual(got, out[:len(got)])
            # Once it acknowledges, it goes on to the end (told of anything it lost).
            b.ack = True
            await b.ws.send(b"\x02" + len(got).to_bytes(4, "big"))
            await stalled
            self.assertIsNotNone(b.exit, (b.ws.close_code, b.ws.close_reason, b.next, len(out),
                                          b.lost))
            for off, seg in b.segs:
                self.assertEqual(bytes(seg), out[off:off + len(seg)])
            self.assertEqual(b.next, len(out))
        run(t())

    @staticmethod
    async def drain(p):
        while p.exit is None and await p.frame():
            pass

    def test_big_stream_byte_exact(self):
        big = os.environ.get("WARREN_BIG") == "1"
        # Under ASan (WARREN_SANITIZED) the same C paths see 2 MiB, as the other bulk
        # streams run at a fraction of their size there.
        small = os.environ.get("WARREN_SANITIZED") == "1" and not big
        n = 12_000_000 if big else 300_000 if small else 1_400_000
        expect = seq_bytes(n)
        self.assertGreater(len(expect), (100 if big else 2 if small else 10) << 20)

        nl = self.w.put_numlines(self.sid)

        async def t():
            # Through cat: seq writes a line per write() to a terminal, which under TCG
            # makes the producer, not the socket, the bottleneck (~10 KB/s); numlines
            # prints seq's bytes without BusyBox's floating point.
            p = await Pty.open(self.w, self.path(), cmd=f"{nl} 1 {n} | cat")
            await p.until_exit(timeout=3600 if big else 900)
            self.assertEqual(p.lost, [])
            self.assertEqual(len(p.data()), len(expect))
            self.assertTrue(p.data() == expect)
            self.assertEqual(p.exit["exit_code"], 0)
        run(t())

    def test_malformed_frames_close_only_their_socket(self):
        async def t():
            good = await Pty.open(self.w, self.path())
            await good.send("echo ready\n")
            await good.until(r"\r\nready\r\n")
            cases = [
                (b"\x01\x00\x50", 1008, "RESIZE"),        # truncated RESIZE
                (b"\x02\x00", 1008, "ACK"),               # truncated ACK
                (b"\x09hello", 1008, "unknown opcode"),   # unknown opcode
                (b"\x00" + b"x" * 70000, 1009, ""),      # oversized
            ]
            for frame, code, why in cases:
                bad = await Pty.open(self.w, self.path(good.pid), offset=good.next)
                await bad.ws.send(frame)
                got, reason = await bad.closed()
                self.assertEqual(got, code, (frame[:8], reason))
                self.assertIn(why, reason)
                self.assertTrue(reason)
            # A text frame is not part of the protocol either.
            bad = await Pty.open(self.w, self.path(good.pid), offset=good.next)
            await bad.ws.send("text")
            self.assertEqual((await bad.closed())[0], 1008)
            # The other socket on the same PTY carries on.
            mark = good.next
            await good.send("echo still-$((2+3))\n")
            await good.until(r"\r\nstill-5\r\n", start=mark)
            await good.close()
        run(t())

    def test_refused_before_the_upgrade(self):
        w, sid = self.w, self.sid
        st, body = upgrade(w, f"/v1/sandboxes/{sid}/pty", auth=False)
        self.assertEqual((st, body["error"]["code"]), (401, "unauthorized"), body)
        st, body = upgrade(w, "/v1/sandboxes/sbx_nosuchsandbox0000/pty")
        self.assertEqual(st, 404, body)
        self.assertIn("message", body["error"])
        st, body = upgrade(w, f"/v1/sandboxes/{sid}/pty", proto="warren.session.v1")
        self.assertEqual(st, 400, body)
        st, body = upgrade(w, f"/v1/sandboxes/{sid}/pty?cols=0")
        self.assertEqual((st, body["error"]["code"]), (400, "invalid_argument"), body)
        st, body = upgrade(w, f"/v1/sandboxes/{sid}/pty/12?bogus=1")
        self.assertEqual(st, 400, body)
        # An attach to a pid that does not exist upgrades, then says so and closes.

        async def t():
            p = await Pty.open(w, f"/v1/sandboxes/{sid}/pty/4000000")
            return p
        with self.assertRaises(AssertionError) as cm:
            run(t())
        self.assertIn("process_not_found", str(cm.exception))

    def test_never_reading_client_that_acks_everything_stays_bounded(self):
        """A client that never reads, on a 4 KiB receive buffer, but ACKs 2^32-1 over
        and over, under a PTY printing 4 KiB lines without pause: ACKs once returned
        the guest's credit for output only queued, never written, so the guest kept
        sending into a queue without a cap (warrend grew by over 100 MiB in 25 s). An
        ACK may return credit only for what was written to the client; this one claims
        more, and the socket is closed. warrend's RSS stays flat meanwhile."""
        w = self.w
        cmd = "s=x; while [ ${#s} -lt 3000 ]; do s=$s$s; done; yes $s"
        c = RawWs(w, self.path() + "?" + urllib.parse.urlencode({"cmd": cmd}), PROTO,
                  rcvbuf=4096)
        self.assertEqual(c.status, 101, c.status_line)
        try:
            base = rss_kib(w.proc.pid)
            with RssPeak(w.proc.pid) as peak:
                end = time.time() + 25
                while time.time() < end:
                    try:
                        c.send_frame(0x2, b"\x02\xff\xff\xff\xff")
                    except OSError:
                        break  # closed by warrend, as it should be
                    time.sleep(0.05)
            print(f"\nwarrend RSS under a never-reading, ACK-everything client: {base} KiB, "
                  f"peak {peak.kib} KiB")
            self.assertLess(peak.kib - base, 24 << 10,
                            f"warrend grew from {base} KiB to {peak.kib} KiB")
            # The server ended the socket: reading what it sent reaches its end (a close
            # frame when lws had none of its own output half-sent, else the TCP close).
            got = c.until_close()
            if got is not None:
                self.assertEqual(got[0], 1008, got)
        finally:
            c.close()
        self.assertEqual(w.proc.poll(), None)

    def test_ack_of_more_than_was_sent_closes(self):
        """An ACK may cover only output bytes the socket has sent; one more closes it
        with 1008 and a reason that says so (it was clamped and ignored before)."""
        async def t():
            p = await Pty.open(self.w, self.path(), ack=False, cmd="echo ready; sleep 600")
            await p.until(r"ready\r\n")
            # Exactly what was received is fine...
            await p.ws.send(b"\x02" + p.received().to_bytes(4, "big"))
            # ...one byte more than was sent is not.
            await p.ws.send(b"\x02\x00\x00\x00\x01")
            code, reason = await asyncio.wait_for(p.closed(), T)
            self.assertEqual(code, 1008, reason)
            self.assertIn("ACK", reason)
        run(t())

    def test_refusals_are_http_1_1_that_websocket_clients_read(self):
        """A refused upgrade is an HTTP/1.1 answer with the JSON error, on both socket
        doors: the PTY door once wrote HTTP/1.0, which Python's websockets reports as
        "did not receive a valid HTTP response" instead of the status."""
        w, sid = self.w, self.sid
        h = {"Authorization": f"Bearer {w.key}"}

        async def t():
            for path, proto, status in ((self.path(), None, 400),
                                        (self.path() + "?bogus=1", [PROTO], 400),
                                        ("/v1/sandboxes/sb-0000000000000000/pty", [PROTO], 404),
                                        (f"/v1/sandboxes/{sid}/session", None, 400)):
                with self.assertRaises(websockets.InvalidStatusCode) as cm:
                    await websockets.connect(f"ws://127.0.0.1:{w.port}{path}",
                                             subprotocols=proto, extra_headers=h,
                                             open_timeout=T)
                self.assertEqual(cm.exception.status_code, status, path)
        run(t())
        st, body = refused(w, self.path(), "nonsense")
        self.assertTrue(st.startswith("HTTP/1.1 400 "), st)
        self.assertEqual(body["error"]["code"], "bad_request", body)

    def test_bad_request_lines_get_a_json_error(self):
        """A request line lws cannot hold, a %00 or a malformed %-escape in the target:
        lws closed without an answer or answered with its own HTML 403; the PTY door
        answers with the JSON error of any bad request."""
        w = self.w
        for query, status, code in (("?cmd=" + "a" * 4000, 414, "uri_too_long"),
                                    ("?cmd=%00", 400, "bad_request"),
                                    ("?cmd=%zz", 400, "bad_request"),
                                    ("?cmd=%4", 400, "bad_request")):
            st, body = refused(w, self.path() + query, PROTO)
            self.assertTrue(st.startswith(f"HTTP/1.1 {status} "), (query[:12], st))
            self.assertEqual(body["error"]["code"], code, body)
        # An escape that is well formed still works.
        st, body = upgrade(w, self.path() + "?cmd=%74rue")
        self.assertEqual(st, 101, body)

    def test_fragmented_frames_with_empty_pieces(self):
        """Client frames split into fragments, empty ones first, between and last, are
        joined into the frames they make (the agent socket once passed an empty first
        fragment to memcpy with a NULL buffer: undefined behaviour)."""
        w = self.w
        c = RawWs(w, self.path() + "?cmd=cat", PROTO)
        try:
            self.assertEqual(c.status, 101, c.status_line)
            c.send_fragments([b"", b"\x00fr", b"", b"ag"])
            c.send_fragments([b"", b"\x00ment\n"])
            c.send_fragments([b"\x00", b"", b"ok\n", b""])
            out = b""
            while out.count(b"fragment") < 2 or out.count(b"ok") < 2:
                op, m = c.recv_frame()
                self.assertEqual(op, 0x2)
                if m[0] == 0x10:
                    out += m[9:]
            self.assertIn(b"fragment\r\n", out)
            self.assertIn(b"ok\r\n", out)
        finally:
            c.close()

    def test_invalid_close_codes_are_answered_with_1002(self):
        """A client's close frame is echoed only when it is valid; an invalid code (5000,
        which lws echoed) or a one-byte payload gets 1002, a reason that is not UTF-8
        1007."""
        check_close_codes(self, self.w, self.path() + "?cmd=cat", PROTO,
                          ((b"\x13\x88", 1002), (b"\x03", 1002), (b"\x00\x00", 1002),
                           (b"\x03\xe8\xff", 1007), (b"\x0f\xa0bye", 4000),
                           (b"\x03\xe8", 1000)))

    def test_keys_before_the_hello(self):
        """Keys typed right after the upgrade, before the PTY's process exists (before
        the hello), are queued and reach it once it starts: they once waited for the
        next key, so a lone first key never echoed."""
        async def t():
            ws = await websockets.connect(
                f"ws://127.0.0.1:{self.w.port}{self.path()}?cmd=cat", subprotocols=[PROTO],
                extra_headers={"Authorization": f"Bearer {self.w.key}"}, max_size=None,
                ping_interval=None, open_timeout=T, close_timeout=10)
            await ws.send(b"\x00early")
            got, hello = b"", None
            while b"early" not in got:
                m = await asyncio.wait_for(ws.recv(), T)
                if m[0] == 0x11 and hello is None:
                    hello = json.loads(m[1:])
                elif m[0] == 0x10:
                    got += m[9:]
            self.assertEqual(hello["type"], "hello")
            self.assertEqual(got, b"early")
            await ws.close()
        run(t())

    def test_opening_on_a_paused_sandbox_resumes_it(self):
        """A socket on a paused sandbox brings it back, and its PTY starts then, for a
        new PTY and for an attach to one that was running before the pause (before,
        the socket got an error frame, sandbox_not_ready, and had to be reopened)."""
        async def t():
            p = await Pty.open(self.w, self.path())
            await p.send("X=before-pause\n")
            await p.close()
            for path, query in ((self.path(), {}), (self.path(p.pid), {"offset": p.next})):
                r = self.w.request("POST", f"/v1/sandboxes/{self.sid}/pause", {})
                self.assertEqual(r.status, 200, f"{r}\n{self.w.log_text()}")
                self.assertEqual(self.w.get(self.sid).json()["state"], "paused")
                q = await Pty.open(self.w, path, **query)
                mark = q.next
                await q.send("echo $X-$((6*7))\n")
                await q.until(r"\r\n(before-pause)?-42\r\n", start=mark)
                await q.close()
                self.assertEqual(self.w.get(self.sid).json()["state"], "running")
        run(t())

    def test_plain_get_says_why(self):
        """A browser never learns why a handshake was refused, so the terminal page asks
        with a plain GET of the same address: the same checks answer with the same
        errors, and 426 when the socket would open."""
        w, sid = self.w, self.sid
        tok = w.request("POST", f"/v1/sandboxes/{sid}/tokens", {"scope": ["pty"]}).json()["token"]
        for path in (f"/v1/sandboxes/{sid}/pty?cols=80&rows=24", f"/v1/sandboxes/{sid}/pty/77",
                     f"/v1/sandboxes/{sid}/session"):
            r = w.request("GET", path)
            self.assertEqual((r.status, r.json()["error"]["code"]), (426, "upgrade_required"), r)
            r = w.request("GET", path, auth=False)
            self.assertEqual(r.status, 401, r)
            r = w.request("GET", path, headers={"Origin": "http://evil.example"})
            self.assertEqual((r.status, r.json()["error"]["code"]), (403, "origin_not_allowed"))
        p = f"/v1/sandboxes/{sid}/pty?cols=80&rows=24"
        # "pty" alone attaches; a new PTY runs a program, which needs "exec" too
        r = w.request("GET", p + "&access_token=" + tok, auth=False)
        self.assertEqual((r.status, r.json()["error"]["code"]), (403, "token_wrong_scope"), r)
        r = w.request("GET", p + "&cmd=id&access_token=" + tok, auth=False)
        self.assertEqual((r.status, r.json()["error"]["code"]), (403, "token_wrong_scope"), r)
        r = w.request("GET", f"/v1/sandboxes/{sid}/pty/77?access_token={tok}", auth=False)
        self.assertEqual(r.status, 426, r)
        tok = w.request("POST", f"/v1/sandboxes/{sid}/tokens",
                        {"scope": ["pty", "exec"]}).json()["token"]
        r = w.request("GET", p + "&access_token=" + tok, auth=False)
        self.assertEqual(r.status, 426, r)
        r = w.request("GET", p + "&access_token=" + tok[:-2] + "AA", auth=False)
        self.assertEqual(r.status, 401, r)
        self.assertNotEqual(r.json()["error"]["code"], "upgrade_required")
        # A pty token does not open the agent socket; a token for another sandbox fails.
        r = w.request("GET", f"/v1/sandboxes/{sid}/session?access_token={tok}", auth=False)
        self.assertEqual(r.status, 403, r)
        r = w.request("GET", "/v1/sandboxes/sb-0000000000000000/pty")
        self.assertEqual(r.status, 404, r)

    def test_origin(self):
        """A browser page may open sockets only from warrend's own origin or one listed
        in allowed_origins; a client that sends no Origin (not a browser) is not held
        to it. Checked on a real upgrade of both socket kinds."""
        w, sid = self.w, self.sid
        for path, proto in ((f"/v1/sandboxes/{sid}/pty?cmd=true", PROTO),
                            (f"/v1/sandboxes/{sid}/session", "warren.session.v1")):
            for origin in ("http://evil.example", "https://app.example.evil",
                           f"http://127.0.0.2:{w.port}", "null"):
                st, body = upgrade(w, path, proto=proto, origin=origin)
                self.assertEqual((st, body["error"]["code"]), (403, "origin_not_allowed"),
                                 (path, origin, body))
                self.assertIn("allowed_origins", body["error"]["message"])
            for origin in ("https://app.example", f"http://127.0.0.1:{w.port}", None):
                st, body = upgrade(w, path, proto=proto, origin=origin)
                self.assertEqual(st, 101, (path, origin, body))


class PtyViewerLimitTest(WarrenCase):
    conf = {"pty_viewers_per_process": 2, "pty_sockets_per_sandbox": 3}

    def test_limits(self):
        w = self.w
        sid = w.create()

        async def t():
            a = await Pty.open(w, f"/v1/sandboxes/{sid}/pty")
            b = await Pty.open(w, f"/v1/sandboxes/{sid}/pty/{a.pid}")
            st, body = upgrade(w, f"/v1/sandboxes/{sid}/pty/{a.pid}")
            self.assertEqual((st, body["error"]["code"]), (429, "too_many_viewers"), body)
            self.assertIn("pty_viewers_per_process", body["error"]["message"])
            c = await Pty.open(w, f"/v1/sandboxes/{sid}/pty")
            st, body = upgrade(w, f"/v1/sandboxes/{sid}/pty")
            self.assertEqual((st, body["error"]["code"]), (429, "too_many_sockets"), body)
            # The sandbox ends: every socket gets an exit frame saying why, then a
            # normal close.
            self.assertEqual(w.delete(sid).status, 200)
            for p in (a, b, c):
                code, _ = await p.closed()
                self.assertEqual(code, 1000)
                self.assertIsNotNone(p.exit)
                self.assertIsNone(p.exit["exit_code"], p.exit)
                self.assertTrue(p.exit.get("reason"), p.exit)
            # and a new socket on it is refused before the upgrade.
            st, body = upgrade(w, f"/v1/sandboxes/{sid}/pty")
            self.assertEqual((st, body["error"]["code"]), (409, "sandbox_ended"), body)
        run(t())


class PtyRestartTest(unittest.TestCase):
    def test_kill9_warrend_new_socket_joins_same_shell(self):
        w = Warren()
        try:
            w.start()
            sid = w.create()

            async def t():
                p = await Pty.open(w, f"/v1/sandboxes/{sid}/pty")
                await p.send("echo pid=$$\n")
                m = await p.until(r"\r\npid=(\d+)\r\n")
                shell = m.group(1).decode()
                # A counter that stops when told (^C does not end a loop in busybox ash).
                await p.send("i=0; while [ ! -e /tmp/stop ]; do echo n$i; i=$((i+1)); "
                             "sleep 0.05; done\n")
                await p.until(r"\r\nn30\r\n")
                # warrend dies under the open socket; the client sees it drop.
                w.kill9()
                code, _ = await p.closed()
                self.assertNotEqual(code, 1000)
                first = p.data()
                w.start()
                deadline = time.time() + 120
                while True:
                    r = w.request("GET", f"/v1/sandboxes/{sid}/processes/{p.pid}")
                    if r.status == 200 or time.time() > deadline:
                        break
                    await asyncio.sleep(0.2)
                self.assertEqual(r.status, 200, r)
                self.assertTrue(r.json()["running"], r)
                # A new socket from the last offset joins byte-exact.
                q = await Pty.open(w, f"/v1/sandboxes/{sid}/pty/{p.pid}", offset=len(first))
                self.assertEqual(q.hello["offset"], len(first))
                await q.until(r"n\d+\r\nn\d+\r\nn\d+\r\n", start=len(first))
                joined = (first + q.data()).decode()
                nums = [int(x) for x in re.findall(r"\r\nn(\d+)(?=\r\n)", joined)]
                self.assertGreater(len(nums), 33)
                self.assertEqual(nums, list(range(len(nums))))
                # The same shell, still there: $$ is unchanged.
                w.run(sid, "touch /tmp/stop")
                await q.until(r"\r\nn\d+\r\n[^n]", start=len(first))
                mark = q.next
                await q.send("echo again=$$\n")
                await q.until(r"\r\nagain=%s\r\n" % shell, start=mark)
                await q.close()
            run(t())
        finally:
            w.cleanup()


if __name__ == "__main__":
    unittest.main()
