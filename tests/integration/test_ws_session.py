"""The agent socket (GET /v1/sandboxes/{id}/session, "warren.session.v1"): msgpack
requests with ids, many in flight on one socket, against a real warrend and real VMs.

Needs Debian's python3-websockets: run with /usr/bin/python3. The msgpack codec is a
small one written here (python3-msgpack is not among the packages set up)."""
import asyncio
import hashlib
import os
import random
import struct
import time
import unittest

import websockets

from rawws import RawWs, refused
from warren import WarrenCase

PROTO = "warren.session.v1"


# ---------------------------------------------------------------- msgpack
def mp_pack(o):
    if o is None:
        return b"\xc0"
    if o is True:
        return b"\xc3"
    if o is False:
        return b"\xc2"
    if isinstance(o, int):
        if 0 <= o < 128:
            return bytes([o])
        if -32 <= o < 0:
            return struct.pack("b", o)
        if o >= 0:
            return b"\xcf" + struct.pack(">Q", o)
        return b"\xd3" + struct.pack(">q", o)
    if isinstance(o, float):
        return b"\xcb" + struct.pack(">d", o)
    if isinstance(o, str):
        b = o.encode()
        return b"\xdb" + struct.pack(">I", len(b)) + b
    if isinstance(o, (bytes, bytearray)):
        return b"\xc6" + struct.pack(">I", len(o)) + bytes(o)
    if isinstance(o, (list, tuple)):
        return b"\xdd" + struct.pack(">I", len(o)) + b"".join(mp_pack(x) for x in o)
    if isinstance(o, dict):
        return b"\xdf" + struct.pack(">I", len(o)) + b"".join(
            mp_pack(k) + mp_pack(v) for k, v in o.items())
    raise TypeError(type(o))


def mp_unpack(b):
    v, i = _mp(b, 0)
    assert i == len(b), "trailing bytes"
    return v


def _mp(b, i):
    t = b[i]
    i += 1
    if t <= 0x7f:
        return t, i
    if t >= 0xe0:
        return t - 256, i
    if 0x80 <= t <= 0x8f:
        return _map(b, i, t & 15)
    if 0x90 <= t <= 0x9f:
        return _arr(b, i, t & 15)
    if 0xa0 <= t <= 0xbf:
        n = t & 31
        return b[i:i + n].decode(), i + n
    if t == 0xc0:
        return None, i
    if t in (0xc2, 0xc3):
        return t == 0xc3, i
    ln = {0xc4: 1, 0xc5: 2, 0xc6: 4, 0xd9: 1, 0xda: 2, 0xdb: 4}
    if t in ln:
        n = int.from_bytes(b[i:i + ln[t]], "big")
        i += ln[t]
        d = b[i:i + n]
        return (bytes(d) if t in (0xc4, 0xc5, 0xc6) else d.decode()), i + n
    fix = {0xcc: ">B", 0xcd: ">H", 0xce: ">I", 0xcf: ">Q", 0xd0: ">b", 0xd1: ">h",
           0xd2: ">i", 0xd3: ">q", 0xca: ">f", 0xcb: ">d"}
    if t in fix:
        n = struct.calcsize(fix[t])
        return struct.unpack(fix[t], b[i:i + n])[0], i + n
    if t in (0xdc, 0xdd):
        n = 2 if t == 0xdc else 4
        return _arr(b, i + n, int.from_bytes(b[i:i + n], "big"))
    if t in (0xde, 0xdf):
        n = 2 if t == 0xde else 4
        return _map(b, i + n, int.from_bytes(b[i:i + n], "big"))
    raise ValueError(f"msgpack type {t:#x}")


def _arr(b, i, n):
    out = []
    for _ in range(n):
        v, i = _mp(b, i)
        out.append(v)
    return out, i


def _map(b, i, n):
    out = {}
    for _ in range(n):
        k, i = _mp(b, i)
        v, i = _mp(b, i)
        out[k] = v
    return out, i


# ------------------------------------------------------------- the client
class Session:
    """One agent socket: requests by id, answers routed to per-id queues."""

    def __init__(self, ws):
        self.ws = ws
        self.queues = {}
        self.next_id = 1
        self.reader = asyncio.ensure_future(self._read())

    async def _read(self):
        try:
            async for m in self.ws:
                f = mp_unpack(m)
                self.queues.setdefault(f["id"], asyncio.Queue()).put_nowait(f)
        except websockets.ConnectionClosed:
            pass

    async def send(self, op, **kw):
        rid = self.next_id
        self.next_id += 1
        self.queues.setdefault(rid, asyncio.Queue())
        await self.ws.send(mp_pack(dict(id=rid, op=op, **kw)))
        return rid

    async def frame(self, rid, timeout=300):
        return await asyncio.wait_for(self.queues[rid].get(), timeout)

    async def call(self, op, **kw):
        """A request with one answer."""
        return await self.frame(await self.send(op, **kw))

    async def stream(self, rid, last=("exit",), timeout=600):
        """Frames of rid up to and including one whose type is in last (or an error)."""
        out = []
        while True:
            f = await self.frame(rid, timeout)
            out.append(f)
            if f["type"] in last or f["type"] == "error":
                return out

    async def run(self, **kw):
        """Foreground exec: (bytes of stdout, bytes of stderr, exit frame)."""
        frames = await self.stream(await self.send("exec", **kw))
        o = {"stdout": bytearray(), "stderr": bytearray()}
        for f in frames[:-1]:
            self._check_offset(o, f)
            o[f["type"]] += f["data"]
        return bytes(o["stdout"]), bytes(o["stderr"]), frames[-1]

    @staticmethod
    def _check_offset(o, f):
        assert f["type"] in ("stdout", "stderr"), f
        assert f["offset"] == len(o[f["type"]]), (f["offset"], len(o[f["type"]]))

    async def close(self):
        await self.ws.close()
        self.reader.cancel()


def frames_of(sess_frames):
    return [f["type"] for f in sess_frames]


class TestWsSession(WarrenCase):
    @classmethod
    def setUpClass(cls):
        super().setUpClass()
        cls.sid = cls.w.create()

    def url(self, sid=None):
        return f"ws://127.0.0.1:{self.w.port}/v1/sandboxes/{sid or self.sid}/session"

    async def connect(self, sid=None, key=True, proto=True, **kw):
        h = {"Authorization": f"Bearer {self.w.key}"} if key else {}
        ws = await websockets.connect(self.url(sid), extra_headers=h,
                                      subprotocols=[PROTO] if proto else None,
                                      max_size=None, ping_interval=None, **kw)
        return Session(ws)

    def arun(self, coro, timeout=900):
        return asyncio.run(asyncio.wait_for(coro, timeout))

    # ---------------------------------------------------------------- cases
    def test_exec_true_round_trip(self):
        """exec `true` over the agent socket, and beside it over REST (figures printed:
        the median of 10 each, on a warm sandbox)."""
        async def go():
            s = await self.connect()
            out, err, ex = await s.run(cmd="true")
            self.assertEqual((out, err), (b"", b""))
            self.assertEqual((ex["type"], ex["exit_code"]), ("exit", 0))
            ws_ms, rest_ms = [], []
            for _ in range(10):
                t0 = time.monotonic()
                out, err, ex = await s.run(cmd="true")
                ws_ms.append((time.monotonic() - t0) * 1000)
                self.assertEqual(ex["exit_code"], 0)
                t0 = time.monotonic()
                self.assertEqual(self.w.run(self.sid, "true")["exit_code"], 0)
                rest_ms.append((time.monotonic() - t0) * 1000)
            print(f"\nexec true round trip (median of 10): agent socket "
                  f"{sorted(ws_ms)[5]:.1f} ms, REST {sorted(rest_ms)[5]:.1f} ms")
            await s.close()
        self.arun(go())

    def test_requests_on_a_paused_sandbox_resume_it(self):
        """Requests sent on a paused sandbox's socket wait for the one resume they start
        and are answered in order (before, each got sandbox_not_ready)."""
        async def go():
            r = self.w.request("POST", f"/v1/sandboxes/{self.sid}/pause", {})
            self.assertEqual(r.status, 200, f"{r}\n{self.w.log_text()}")
            s = await self.connect()
            ex = await s.send("exec", cmd="echo one")
            wr = await s.send("write_file", path="/tmp/paused.txt", data=b"written")
            st = await s.send("stat", path="/tmp/paused.txt")
            f = await s.stream(ex)
            self.assertEqual(frames_of(f), ["stdout", "exit"], f)
            self.assertEqual((f[0]["data"], f[1]["exit_code"]), (b"one\n", 0))
            self.assertEqual((await s.frame(wr))["type"], "result")
            f = await s.frame(st)
            self.assertEqual(f["type"], "result", f)
            self.assertEqual(f["size"], 7, f)
            await s.close()
            self.assertEqual(self.w.get(self.sid).json()["state"], "running")
        self.arun(go())

    def test_refused_before_upgrade(self):
        async def go():
            for kw, status in ((dict(key=False), 401), (dict(proto=False), 400),
                               (dict(sid="nosuchsandbox"), 404)):
                with self.assertRaises(websockets.InvalidStatusCode) as cm:
                    await self.connect(**kw)
                self.assertEqual(cm.exception.status_code, status, kw)
        self.arun(go())

    def test_fragmented_messages_with_empty_pieces(self):
        """A message whose first fragment is empty once reached memcpy with a NULL
        buffer (undefined behaviour: the UBSan build aborted, ending warrend for anyone
        holding a session token). Messages split with empty pieces first, between and
        last are joined and answered; warrend stays up."""
        c = RawWs(self.w, f"/v1/sandboxes/{self.sid}/session", PROTO)
        try:
            self.assertEqual(c.status, 101, c.status_line)
            m1 = mp_pack({"id": 1, "op": "processes"})
            m2 = mp_pack({"id": 2, "op": "stat", "path": "/"})
            c.send_fragments([b"", m1])
            c.send_fragments([b"", m2[:3], b"", m2[3:], b""])
            c.send_fragments([mp_pack({"id": 3, "op": "processes"}), b""])
            got = {}
            while len(got) < 3:
                op, m = c.recv_frame()
                self.assertEqual(op, 0x2)
                f = mp_unpack(m)
                got[f["id"]] = f
            self.assertEqual([got[i]["type"] for i in (1, 2, 3)], ["result"] * 3, got)
            self.assertEqual(got[2]["type"], "result")
        finally:
            c.close()
        self.assertIsNone(self.w.proc.poll(), self.w.log_text()[-2000:])

    def test_invalid_close_codes_are_answered_with_1002(self):
        """lws echoed a close code of 5000 and up; an invalid code or a one-byte close
        payload is answered with 1002, a reason that is not UTF-8 with 1007, and a valid
        close is echoed."""
        for payload, want in ((b"\x13\x88", 1002), (b"\x03", 1002), (b"\x03\xee", 1002),
                              (b"\x03\xe8\xc3", 1007), (b"\x0b\xb8", 3000)):
            c = RawWs(self.w, f"/v1/sandboxes/{self.sid}/session", PROTO)
            try:
                self.assertEqual(c.status, 101, c.status_line)
                c.send_frame(0x8, payload)
                got = c.until_close()
                self.assertIsNotNone(got, payload)
                self.assertEqual(got[0], want, (payload, got))
            finally:
                c.close()

    def test_upgrade_checks_match_the_pty_door(self):
        """The agent socket's upgrade checks what the PTY socket's and REST check: an
        unknown query parameter is 400 (it upgraded), an ended sandbox 409 (it upgraded,
        then answered every request with sandbox_ended), and a request line lws cannot
        take, a %00 or a malformed %-escape get the JSON error of any bad request (no
        answer, or lws's HTML 403, before), on this door and on REST alike."""
        w = self.w
        path = f"/v1/sandboxes/{self.sid}/session"
        st, body = refused(w, path + "?bogus=1", PROTO)
        self.assertTrue(st.startswith("HTTP/1.1 400 "), st)
        self.assertEqual(body["error"]["code"], "invalid_argument", body)
        self.assertIn("bogus", body["error"]["message"])
        st, body = refused(w, "/v1/sandboxes/sb-0000000000000000/session", PROTO)
        self.assertEqual((st.split()[1], body["error"]["code"]), ("404", "sandbox_not_found"))
        for query, status, code in (("?x=" + "a" * 4000, 414, "uri_too_long"),
                                    ("?x=%00", 400, "bad_request"),
                                    ("?x=%zz", 400, "bad_request")):
            st, body = refused(w, path + query, PROTO)
            self.assertTrue(st.startswith(f"HTTP/1.1 {status} "), (query[:8], st))
            self.assertEqual(body["error"]["code"], code, body)
            r = w.request("GET", f"/v1/sandboxes/{self.sid}" + query)
            self.assertEqual((r.status, r.json()["error"]["code"]), (status, code), r)
        # The token parameter is the one a socket may carry.
        tok = w.request("POST", f"/v1/sandboxes/{self.sid}/tokens",
                        {"scope": ["session"]}).json()["token"]

        async def go():
            ws = await websockets.connect(f"{self.url()}?access_token={tok}",
                                          subprotocols=[PROTO], ping_interval=None)
            await ws.close()
        self.arun(go())
        ended = w.create()
        self.assertEqual(w.delete(ended).status, 200)
        st, body = refused(w, f"/v1/sandboxes/{ended}/session", PROTO)
        self.assertTrue(st.startswith("HTTP/1.1 409 "), st)
        self.assertEqual(body["error"]["code"], "sandbox_ended", body)

    def test_50_concurrent_execs(self):
        async def go():
            s = await self.connect()
            n = 50
            ids = {}
            for i in range(n):
                rid = await s.send("exec", cmd=f"seq 1 {i * 100}; echo err{i} >&2; exit {i % 7}")
                ids[rid] = i

            async def collect(rid):
                return rid, await s.stream(rid)
            results = await asyncio.gather(*(collect(r) for r in ids))
            for rid, frames in results:
                i = ids[rid]
                o = {"stdout": bytearray(), "stderr": bytearray()}
                for f in frames[:-1]:
                    Session._check_offset(o, f)
                    o[f["type"]] += f["data"]
                want = "".join(f"{k}\n" for k in range(1, i * 100 + 1)).encode()
                self.assertEqual(bytes(o["stdout"]), want, i)
                self.assertEqual(bytes(o["stderr"]), f"err{i}\n".encode())
                self.assertEqual(frames[-1]["type"], "exit", frames[-1])
                self.assertEqual(frames[-1]["exit_code"], i % 7)
            await s.close()
        self.arun(go())

    def test_big_output_byte_exact(self):
        """seq's output (numlines': every line different, so a gap, duplicate or reordering shows)
        of 10 MiB, or 100 MiB with WARREN_BIG=1, arrives byte-exact at its offsets."""
        # Under ASan (WARREN_SANITIZED) a fifth: the same C paths, less TCG time.
        n = (13_000_000 if os.environ.get("WARREN_BIG") == "1"
             else 300_000 if os.environ.get("WARREN_SANITIZED") == "1" else 1_450_000)
        want = hashlib.sha256()
        size = 0
        for k in range(1, n + 1, 100000):
            chunk = "".join(f"{i}\n" for i in range(k, min(k + 100000, n + 1))).encode()
            want.update(chunk)
            size += len(chunk)
        self.assertGreaterEqual(size, (100 if n > 2_000_000 else 10 if n > 1_000_000 else 1) << 20)

        nl = self.w.put_numlines(self.sid)

        async def go():
            s = await self.connect()
            rid = await s.send("exec", cmd=f"{nl} 1 {n}", timeout_seconds=3000)
            got = hashlib.sha256()
            off = 0
            while True:
                f = await s.frame(rid, 600)
                if f["type"] != "stdout":
                    break
                self.assertEqual(f["offset"], off)
                got.update(f["data"])
                off += len(f["data"])
            self.assertEqual(f["type"], "exit", f)
            self.assertEqual(f["exit_code"], 0, f)
            self.assertEqual(off, size)
            self.assertEqual(got.hexdigest(), want.hexdigest())
            await s.close()
        self.arun(go(), timeout=3000)

    def test_background_attach_stdin_signal(self):
        async def go():
            s = await self.connect()
            st = await s.call("exec", cmd="while read l; do echo got:$l; done; sleep 1000",
                              background=True, tag="ws-bg")
            self.assertEqual(st["type"], "started", st)
            pid = st["pid"]
            a = await s.send("attach", pid=pid, offset=0)
            r = await s.call("stdin", pid=pid, data=b"hello\n")
            self.assertEqual(r["type"], "result", r)
            got = bytearray()
            while b"got:hello\n" not in got:
                f = await s.frame(a)
                self.assertEqual(f["type"], "stdout", f)
                self.assertEqual(f["offset"], len(got))
                got += f["data"]
            r = await s.call("stdin", pid=pid, eof=True)
            self.assertEqual(r["type"], "result", r)
            # found again by its tag, as a reconnecting agent would
            r = await s.call("processes")
            mine = [p for p in r["processes"] if p.get("tag") == "ws-bg"]
            self.assertEqual([p["pid"] for p in mine], [pid])
            r = await s.call("signal", pid=pid, signal="TERM")
            self.assertEqual(r["type"], "result", r)
            frames = await s.stream(a, last=("exit",))
            self.assertEqual(frames[-1]["type"], "exit", frames)
            self.assertEqual(frames[-1]["signal"], 15, frames[-1])
            await s.close()
        self.arun(go())

    def test_reattach_after_reconnect(self):
        async def go():
            s = await self.connect()
            st = await s.call("exec", cmd="for i in $(seq 1 400); do echo line$i; sleep 0.01; done",
                              background=True, tag="ws-re")
            pid = st["pid"]
            a = await s.send("attach", pid=pid, offset=0)
            got = bytearray()
            while len(got) < 200:
                f = await s.frame(a)
                got += f["data"]
            await s.close()  # mid-stream
            s = await self.connect()
            r = await s.call("processes")
            self.assertIn(pid, [p["pid"] for p in r["processes"] if p.get("tag") == "ws-re"])
            frames = await s.stream(await s.send("attach", pid=pid, offset=len(got)))
            for f in frames[:-1]:
                self.assertEqual(f["offset"], len(got), f)
                got += f["data"]
            self.assertEqual(frames[-1]["type"], "exit")
            self.assertEqual(bytes(got), "".join(f"line{i}\n" for i in range(1, 401)).encode())
            await s.close()
        self.arun(go())

    def test_detach(self):
        async def go():
            s = await self.connect()
            st = await s.call("exec", cmd="sleep 1000", background=True)
            a = await s.send("attach", pid=st["pid"], offset=0)
            r = await s.call("detach", target=a)
            self.assertEqual(r["type"], "result", r)
            f = await s.frame(a)
            self.assertEqual(f["type"], "detached", f)
            r = await s.call("signal", pid=st["pid"], signal="KILL")
            self.assertEqual(r["type"], "result", r)
            await s.close()
        self.arun(go())

    def test_watch(self):
        """The watch op streams a file watch's events as frames; the watch belongs to the
        sandbox, so it is read again on a new socket from the offset reached."""
        async def until(s, rid, name, type_):
            got = []
            while True:
                f = await s.frame(rid, 120)
                got.append(f)
                self.assertNotEqual(f["type"], "error", f)
                if f.get("name") == name and f["type"] == type_:
                    return got

        async def go():
            self.assertEqual(self.w.run(self.sid, "mkdir -p /tmp/wsw")["exit_code"], 0)
            s = await self.connect()
            rid = await s.send("watch", path="/tmp/wsw", recursive=True)
            first = await s.frame(rid)
            self.assertEqual((first["type"], first["offset"]), ("watch", 0), first)
            wid = first["watch"]
            ready = await s.frame(rid)
            self.assertEqual((ready["type"], ready["path"]), ("ready", "/tmp/wsw"), ready)
            await s.run(cmd="mkdir /tmp/wsw/d && echo x > /tmp/wsw/d/f")
            got = await until(s, rid, "d/f", "create")
            self.assertIn(("create", "d"), [(f["type"], f.get("name")) for f in got])
            last = got[-1]["offset"]
            r = await s.call("detach", target=rid)
            self.assertEqual(r["type"], "result", r)
            # Events already queued come first (f's write), then the watch's end here.
            rest = await s.stream(rid, last=("detached",))
            self.assertEqual(rest[-1]["type"], "detached", rest)
            await s.close()
            # No socket: the watch goes on, and the socket after reads what it missed.
            self.assertEqual(self.w.run(self.sid, "echo y > /tmp/wsw/d/g")["exit_code"], 0)
            s = await self.connect()
            procs = (await s.call("processes"))["processes"]
            self.assertIn(wid, [p["pid"] for p in procs if p["running"]])
            rid = await s.send("watch", watch=wid, offset=last)
            self.assertEqual(await s.frame(rid),
                             {"id": rid, "type": "watch", "watch": wid, "offset": last})
            got = await until(s, rid, "d/g", "create")
            self.assertEqual([f["type"] for f in got if f["type"] == "lost"], [])
            # It starts after f's create (f's write came after it, so it is there).
            self.assertNotIn(("create", "d/f"), [(f["type"], f.get("name")) for f in got])
            # Errors are error frames; the socket stays open.
            e = await s.call("watch", path="/tmp/wsw/none")
            self.assertEqual((e["type"], e["code"]), ("error", "file_not_found"), e)
            st = await s.call("exec", cmd="sleep 1000", background=True)
            e = await s.call("watch", watch=st["pid"])
            self.assertEqual((e["type"], e["code"]), ("error", "watch_not_found"), e)
            e = await s.call("watch", path="rel")
            self.assertEqual((e["type"], e["code"]), ("error", "invalid_argument"), e)
            await s.call("signal", pid=st["pid"], signal="KILL")
            # Ending the watch's process ends its stream.
            r = await s.call("signal", pid=wid, signal="TERM")
            self.assertEqual(r["type"], "result", r)
            end = (await s.stream(rid, last=("end",)))[-1]
            self.assertEqual((end["type"], end["signal"]), ("end", 15), end)
            await s.close()
        self.arun(go())

    def test_files(self):
        async def go():
            s = await self.connect()
            data = os.urandom(300000)
            r = await s.call("mkdir", path="/tmp/wsf")
            self.assertEqual(r["type"], "result", r)
            r = await s.call("write_file", path="/tmp/wsf/a.bin", data=data, mode=0o600)
            self.assertEqual(r["type"], "result", r)
            self.assertEqual(r["size"], len(data))
            frames = await s.stream(await s.send("read_file", path="/tmp/wsf/a.bin"),
                                    last=("end",))
            got = bytearray()
            for f in frames[:-1]:
                self.assertEqual(f["type"], "data")
                self.assertEqual(f["offset"], len(got))
                got += f["data"]
            self.assertEqual(bytes(got), data)
            self.assertEqual(frames[-1]["size"], len(data))
            r = await s.call("stat", path="/tmp/wsf/a.bin")
            self.assertEqual(r["type"], "result", r)
            self.assertEqual(r["size"], len(data))
            r = await s.call("rename", path="/tmp/wsf/a.bin", to="/tmp/wsf/b.bin")
            self.assertEqual(r["type"], "result", r)
            r = await s.call("list", path="/tmp/wsf")
            self.assertEqual([e["name"] for e in r["entries"]], ["b.bin"], r)
            r = await s.call("read_file", path="/tmp/wsf/a.bin")
            self.assertEqual((r["type"], r["code"]), ("error", "file_not_found"), r)
            r = await s.call("remove", path="/tmp/wsf", recursive=True)
            self.assertEqual(r["type"], "result", r)
            await s.close()
        self.arun(go())

    def test_error_frames(self):
        async def go():
            s = await self.connect()
            r = await s.call("signal", pid=999999, signal="TERM")
            self.assertEqual((r["type"], r["code"]), ("error", "process_not_found"), r)
            r = await s.call("read_file", path="relative")
            self.assertEqual(r["type"], "error", r)
            r = await s.call("exec", cmd="true", bogus=1)
            self.assertEqual(r["type"], "error", r)
            # the socket still works
            out, _, ex = await s.run(cmd="echo ok")
            self.assertEqual((out, ex["exit_code"]), (b"ok\n", 0))
            await s.close()
        self.arun(go())

    def test_session_token_needs_exec_scope_to_exec(self):
        """A "session" token opens the socket for files, processes and attaching, but
        the exec op needs the "exec" scope as well (a session token once ran any
        command); with both, exec runs."""
        def mint(scope):
            r = self.w.request("POST", f"/v1/sandboxes/{self.sid}/tokens", {"scope": scope})
            self.assertEqual(r.status, 201, r)
            return r.json()["token"]

        async def open_with(tok):
            ws = await websockets.connect(f"{self.url()}?access_token={tok}",
                                          subprotocols=[PROTO], max_size=None,
                                          ping_interval=None)
            return Session(ws)

        async def go():
            s = await open_with(mint(["session"]))
            for kw in (dict(cmd="touch /tmp/token-ran"), dict(argv=["true"]),
                       dict(cmd="sh", pty={"cols": 80, "rows": 24}),
                       dict(cmd="sleep 1", background=True)):
                r = await s.call("exec", **kw)
                self.assertEqual((r["type"], r.get("code")), ("error", "token_wrong_scope"), r)
            r = await s.call("stat", path="/tmp/token-ran")
            self.assertEqual((r["type"], r.get("code")), ("error", "file_not_found"), r)
            r = await s.call("processes")
            self.assertEqual(r["type"], "result", r)
            await s.close()
            s = await open_with(mint(["session", "exec"]))
            out, _, ex = await s.run(cmd="echo ran")
            self.assertEqual((out, ex["exit_code"]), (b"ran\n", 0))
            await s.close()
            # an exec token alone opens no socket
            with self.assertRaises(websockets.InvalidStatusCode) as cm:
                await open_with(mint(["exec"]))
            self.assertEqual(cm.exception.status_code, 403)
        self.arun(go())

    def test_malformed_closes_only_that_socket(self):
        cases = [
            ("truncated", mp_pack({"id": 1, "op": "exec", "cmd": "true"})[:-3], 1008),
            ("unknown op", mp_pack({"id": 1, "op": "fly"}), 1008),
            ("missing id", mp_pack({"op": "exec", "cmd": "true"}), 1008),
            ("not a map", mp_pack([1, 2, 3]), 1008),
            ("random", bytes(random.Random(7).randrange(256) for _ in range(4000)), 1008),
            ("huge count", b"\xdd\xff\xff\xff\xff", 1008),
            ("oversized", mp_pack({"id": 1, "op": "write_file", "path": "/tmp/x",
                                   "data": b"x" * (2 << 20)}), 1009),
        ]

        async def go():
            keep = await self.connect()
            for name, msg, code in cases:
                bad = await self.connect()
                await bad.ws.send(msg)
                await asyncio.wait_for(bad.ws.wait_closed(), 120)
                self.assertEqual(bad.ws.close_code, code, name)
                self.assertTrue(bad.ws.close_reason, name)
                out, _, ex = await keep.run(cmd="echo still")
                self.assertEqual((out, ex["exit_code"]), (b"still\n", 0), name)
            await keep.close()
        self.arun(go())

    def test_pong_while_backlogged(self):
        """A socket whose output is backed up (the client reads nothing for 15 s while a
        `yes` floods it, pinging every second) is not dropped, its first ping is
        answered (behind the output already in the socket buffers), the output then
        arrives whole at its offsets, every ping is acknowledged, and a ping after it
        is answered.

        lws keeps one pending pong: pings that come while one is pending are answered
        by that pong's successor, for the most recent ping only. RFC 6455 5.5.3 allows
        exactly this ("MAY elect to send a Pong frame for only the most recently
        processed Ping frame"), and a client counts that pong for the earlier pings
        too (websockets does), so what is asserted is that every ping is acknowledged,
        not that each gets a pong of its own."""
        total = 20_000_000

        async def go():
            ws = await websockets.connect(
                self.url(), extra_headers={"Authorization": f"Bearer {self.w.key}"},
                subprotocols=[PROTO], max_size=None, max_queue=1, ping_interval=None)
            await ws.send(mp_pack({"id": 1, "op": "exec", "cmd": f"yes | head -c {total}",
                                   "timeout_seconds": 3000}))
            waiters = []
            for _ in range(15):  # read nothing meanwhile: the socket backs up
                waiters.append(await ws.ping())
                await asyncio.sleep(1)
            self.assertFalse(ws.closed)
            got = 0
            first = None
            while True:
                f = mp_unpack(await asyncio.wait_for(ws.recv(), 600))
                if first is None and waiters[0].done():
                    first = got  # bytes read before the first pong showed up
                if f["type"] != "stdout":
                    break
                self.assertEqual(f["offset"], got)
                got += len(f["data"])
            self.assertEqual(f["type"], "exit", f)
            self.assertEqual(f["exit_code"], 0)
            self.assertEqual(got, total)
            self.assertTrue(waiters[0].done())
            # A ping while output still streams is acknowledged before the stream ends.
            # The stream is read to its end: with max_queue=1 this client stops reading
            # the socket while a message waits, so a pong behind unread output would
            # never be seen.
            await ws.send(mp_pack({"id": 2, "op": "exec", "cmd": "yes | head -c 3000000"}))
            during = await ws.ping()
            n, acked_at = 0, None
            while True:
                f = mp_unpack(await asyncio.wait_for(ws.recv(), 600))
                if acked_at is None and during.done():
                    acked_at = n
                if f["type"] != "stdout":
                    break
                n += len(f["data"])
            self.assertEqual((f["type"], f["exit_code"]), ("exit", 0), f)
            self.assertEqual(n, 3000000)
            self.assertIsNotNone(acked_at, f"no pong while {n} bytes streamed")
            self.assertTrue(all(x.done() for x in waiters))
            await asyncio.wait_for(await ws.ping(), 120)
            self.assertFalse(ws.closed)
            print(f"\nfirst pong after {first} bytes of backlog")
            await ws.close()
        self.arun(go(), timeout=2400)


class TestWsSessionLimits(WarrenCase):
    conf = {"session_max_sockets_per_sandbox": 2, "session_max_requests": 2}

    def test_limits(self):
        sid = self.w.create()

        async def go():
            h = {"Authorization": f"Bearer {self.w.key}"}
            url = f"ws://127.0.0.1:{self.w.port}/v1/sandboxes/{sid}/session"
            socks = [Session(await websockets.connect(url, extra_headers=h, subprotocols=[PROTO],
                                                      ping_interval=None)) for _ in range(2)]
            with self.assertRaises(websockets.InvalidStatusCode) as cm:
                await websockets.connect(url, extra_headers=h, subprotocols=[PROTO])
            self.assertEqual(cm.exception.status_code, 429)
            s = socks[0]
            await s.send("exec", cmd="sleep 1000")
            await s.send("exec", cmd="sleep 1000")
            r = await s.call("exec", cmd="true")
            self.assertEqual((r["type"], r["code"]), ("error", "too_many_requests"), r)
            await socks[1].close()  # a closed socket frees its place
            t = Session(await websockets.connect(url, extra_headers=h, subprotocols=[PROTO],
                                                 ping_interval=None))
            out, _, ex = await t.run(cmd="echo ok")
            self.assertEqual((out, ex["exit_code"]), (b"ok\n", 0))
            await s.close()  # cancels (kills) its two foreground sleeps
            await t.close()
        asyncio.run(asyncio.wait_for(go(), 600))

    def test_held_requests_bounded_while_resuming(self):
        """Requests that reach a paused sandbox's socket in one read wait for its resume:
        session_max_requests of them run, each one past that gets too_many_requests
        (lws delivers them once reading resumes, so it is the in-flight bound that
        answers here; the held queue has the same bound for an lws that delivers them
        earlier), and every request gets exactly one answer."""
        sid = self.w.create()
        r = self.w.request("POST", f"/v1/sandboxes/{sid}/pause", {})
        self.assertEqual(r.status, 200, f"{r}\n{self.w.log_text()}")

        async def go():
            h = {"Authorization": f"Bearer {self.w.key}"}
            url = f"ws://127.0.0.1:{self.w.port}/v1/sandboxes/{sid}/session"
            s = Session(await websockets.connect(url, extra_headers=h, subprotocols=[PROTO],
                                                 ping_interval=None))
            # Six stat requests in one write, so one read of warrend's takes them all:
            # client frames, masked with a zero key (RFC 6455 5.3: the payload as is).
            raw, ids = b"", []
            for rid in range(100, 106):
                m = mp_pack(dict(id=rid, op="stat", path="/"))
                self.assertLess(len(m), 126)
                raw += bytes([0x82, 0x80 | len(m)]) + b"\0\0\0\0" + m
                ids.append(rid)
                s.queues[rid] = asyncio.Queue()
            s.ws.transport.write(raw)
            got = {rid: await s.frame(rid) for rid in ids}
            kinds = [got[rid]["type"] for rid in ids]
            codes = [got[rid].get("code") for rid in ids]
            self.assertEqual(kinds[:2], ["result", "result"], got)
            self.assertEqual(kinds[2:], ["error"] * 4, got)
            self.assertEqual(codes[2:], ["too_many_requests"] * 4, got)
            await asyncio.sleep(0.5)
            self.assertTrue(all(q.empty() for q in s.queues.values()), "a second answer")
            self.assertEqual(self.w.get(sid).json()["state"], "running")
            out, _, ex = await s.run(cmd="echo after")  # the socket still works
            self.assertEqual((out, ex["exit_code"]), (b"after\n", 0))
            await s.close()
        asyncio.run(asyncio.wait_for(go(), 600))


if __name__ == "__main__":
    unittest.main()
