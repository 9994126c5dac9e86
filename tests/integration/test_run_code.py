"""Code contexts and runs (POST .../run_code, .../contexts, .../runs/{run}) against a
real warrend and real code-interpreter microVMs: state across runs, the E2B NDJSON
lines in order, JSON gather mode, a matplotlib PNG, tracebacks, timeouts that keep
variables, bash contexts, contexts CRUD, runs read again after the client dropped and
after kill -9 of warrend, a 40 MB result, and run_code on the agent socket.

Needs the code-interpreter template in the image dir (WARREN_CACHE) and Debian's
python3-websockets: run with /usr/bin/python3."""
import asyncio
import base64
import json
import re
import time
import unittest

from cibox import TEMPLATE, CodeCase, have_template
from warren import RssPeak, SANITIZED, rss_kib


def create_ci(w):
    """A code-interpreter sandbox with its kernel bridge up: /etc/warren/warm is run
    (a second run, after a create that warmed it already, returns at once)."""
    # At the template's own memory: a clone of the pool, its kernel warm. Should the pool
    # not be ready, the create boots and warms the kernel before it answers
    # (template_warm_timeout_seconds): minutes under TCG, longer than the default wait.
    body = {"template": TEMPLATE, "ttl_seconds": w.TEST_TTL_S,
            "idle_timeout_seconds": w.TEST_IDLE_S}
    r = w.request("POST", "/v1/sandboxes", body, timeout=1800)
    assert r.status == 201, f"create failed: {r}\n{w.log_text()}"
    sid = r.json()["id"]
    # The bridge gives a kernel's start 120 s: on a loaded 2-core host under TCG that
    # may not be enough for the first, and a second warm starts where it left off.
    for _ in range(3):
        r = w.run(sid, "/etc/warren/warm", timeout_seconds=900)
        if r["exit_code"] == 0:
            return sid
    raise AssertionError(f"the kernel bridge did not start: {r}")


def lines_of(body):
    """NDJSON body -> list of objects (every line must be one JSON object)."""
    out = []
    for raw in body.split(b"\n"):
        if raw:
            o = json.loads(raw)
            assert isinstance(o, dict) and isinstance(o.get("type"), str), raw
            out.append(o)
    return out


def stream(w, sid, code, **kw):
    """A streamed run: (response, its lines)."""
    body = dict(code=code, **kw)
    r = w.request("POST", f"/v1/sandboxes/{sid}/run_code", body,
                  headers={"Accept": "application/x-ndjson"})
    if r.status != 200:
        return r, []
    return r, lines_of(r.body)


def gather(w, sid, code, **kw):
    r = w.request("POST", f"/v1/sandboxes/{sid}/run_code", dict(code=code, **kw))
    assert r.status == 200, f"{r}\n{w.log_text()}"
    return r.json()


def open_stream(w, sid, code):
    """Start a streamed run on a raw socket; returns (socket, run id, bytes of body read
    so far past the head)."""
    body = json.dumps({"code": code}).encode()
    s = w.raw_request("POST", f"/v1/sandboxes/{sid}/run_code", body,
                      headers={"Accept": "application/x-ndjson"})
    s.settimeout(300)
    buf = b""
    while b"\r\n\r\n" not in buf:
        b = s.recv(65536)
        if not b:
            raise AssertionError(f"closed before the head: {buf!r}")
        buf += b
    head, rest = buf.split(b"\r\n\r\n", 1)
    m = re.search(rb"(?i)\r\nx-warren-run: (\d+)", head)
    assert head.startswith(b"HTTP/1.1 200") and m, head
    return s, int(m.group(1)), rest


def read_run(w, sid, run, offset=0):
    r = w.request("GET", f"/v1/sandboxes/{sid}/runs/{run}?offset={offset}")
    assert r.status == 200, r
    return lines_of(r.body)


class TestRunCode(CodeCase):
    @classmethod
    def setUpClass(cls):
        super().setUpClass()
        try:
            cls.sid = create_ci(cls.w)
        except BaseException:
            cls.w.cleanup()  # tearDownClass does not run after a failed setUpClass
            raise

    def test_state_across_runs(self):
        self.assertIsNone(gather(self.w, self.sid, "state_x = 41")["error"])
        out = gather(self.w, self.sid, "state_x + 1")
        self.assertEqual([r["text"] for r in out["results"]], ["42"], out)
        self.assertIsInstance(out["execution_count"], int)
        self.assertIsInstance(out["run_id"], int)

    def test_ndjson_lines_and_order(self):
        r, lines = stream(self.w, self.sid, "print('hi')\nimport sys; print('e', file=sys.stderr)\n1+1")
        self.assertEqual(r.status, 200, r)
        h = {k.lower(): v for k, v in r.headers.items()}
        self.assertEqual(h.get("content-type"), "application/x-ndjson")
        self.assertTrue(int(h["x-warren-run"]) > 0, r.headers)
        types = [l["type"] for l in lines if l["type"] != "keepalive"]
        self.assertEqual(types[0], "number_of_executions", lines)
        self.assertEqual(types[-1], "end_of_execution", lines)
        self.assertEqual(types.count("end_of_execution"), 1)
        out = [l for l in lines if l["type"] == "stdout"]
        self.assertEqual("".join(l["text"] for l in out), "hi\n")
        self.assertTrue(all(isinstance(l["timestamp"], str) for l in out))
        self.assertEqual("".join(l["text"] for l in lines if l["type"] == "stderr"), "e\n")
        res = [l for l in lines if l["type"] == "result"]
        self.assertEqual(len(res), 1, lines)
        self.assertEqual((res[0]["text"], res[0]["is_main_result"]), ("2", True))
        # The result comes after the output that came before it.
        self.assertLess(types.index("stdout"), types.index("result"))
        self.assertFalse([l for l in lines if l["type"] == "error"], lines)

    def test_gather_mode(self):
        out = gather(self.w, self.sid, "print('a'); print('b')\n'x'")
        self.assertEqual(out["stdout"], "a\nb\n")
        self.assertEqual(out["stderr"], "")
        # E2B's text/plain: one pair of surrounding quotes stripped.
        self.assertEqual(out["results"][0]["text"], "x")
        self.assertIsNone(out["error"])
        self.assertFalse(out["truncated"])

    def test_matplotlib_png(self):
        code = ("import matplotlib.pyplot as plt\n"
                "plt.plot([1, 2, 3], [1, 4, 9])\nplt.show()\n")
        _, lines = stream(self.w, self.sid, code)
        pngs = [l["png"] for l in lines if l["type"] == "result" and "png" in l]
        self.assertEqual(len(pngs), 1, [l["type"] for l in lines])
        self.assertTrue(base64.b64decode(pngs[0]).startswith(b"\x89PNG\r\n\x1a\n"))

    def test_error_traceback(self):
        out = gather(self.w, self.sid, "def f():\n    return 1/0\nf()")
        err = out["error"]
        self.assertEqual(err["name"], "ZeroDivisionError", out)
        self.assertIn("division", err["value"])
        self.assertIn("ZeroDivisionError", err["traceback"])
        self.assertIn("return 1", re.sub(r"\x1b\[[0-9;]*m", "", err["traceback"]))
        _, lines = stream(self.w, self.sid, "raise ValueError('bad')")
        errs = [l for l in lines if l["type"] == "error"]
        self.assertEqual([(e["name"], e["value"]) for e in errs], [("ValueError", "bad")])
        self.assertEqual(lines[-1]["type"], "end_of_execution")

    def test_timeout_keeps_variables(self):
        gather(self.w, self.sid, "kept_y = 5")
        out = gather(self.w, self.sid, "import time\ntime.sleep(60)", timeout_seconds=2)
        self.assertEqual(out["error"]["name"], "TimeoutError", out)
        out = gather(self.w, self.sid, "kept_y * 2")
        self.assertEqual(out["results"][0]["text"], "10", out)

    def test_bash_context_cwd(self):
        r = self.w.request("POST", f"/v1/sandboxes/{self.sid}/contexts",
                           {"language": "bash", "cwd": "/tmp"})
        self.assertEqual(r.status, 201, r)
        ctx = r.json()
        self.assertEqual((ctx["language"], ctx["cwd"]), ("bash", "/tmp"))
        out = gather(self.w, self.sid, "pwd", context_id=ctx["id"])
        self.assertEqual(out["stdout"], "/tmp\n", out)
        gather(self.w, self.sid, "cd /etc; BASH_V=7", context_id=ctx["id"])
        out = gather(self.w, self.sid, "pwd; echo $BASH_V", context_id=ctx["id"])
        self.assertEqual(out["stdout"], "/etc\n7\n", out)
        out = gather(self.w, self.sid, "exit_status() { return 3; }; exit_status",
                     context_id=ctx["id"])
        self.assertEqual(out["error"]["name"], "ExitError", out)
        # The default bash context of language, apart from this one.
        out = gather(self.w, self.sid, "echo lang", language="bash")
        self.assertEqual(out["stdout"], "lang\n", out)

    def test_contexts_crud(self):
        base = f"/v1/sandboxes/{self.sid}/contexts"
        r = self.w.request("POST", base, {"language": "python"})
        self.assertEqual(r.status, 201, r)
        cid = r.json()["id"]
        r = self.w.request("GET", base)
        self.assertEqual(r.status, 200, r)
        ids = [c["id"] for c in r.json()["contexts"]]
        self.assertIn(cid, ids)
        self.assertTrue(any(c.get("default") for c in r.json()["contexts"]), r)
        self.assertEqual(self.w.request("GET", f"{base}/{cid}").json()["id"], cid)
        gather(self.w, self.sid, "crud_v = 1", context_id=cid)
        # Not in the default context: contexts are apart.
        self.assertEqual(gather(self.w, self.sid, "crud_v")["error"]["name"], "NameError")
        self.assertEqual(self.w.request("POST", f"{base}/{cid}/interrupt").status, 200)
        self.assertEqual(gather(self.w, self.sid, "crud_v", context_id=cid)["results"][0]["text"],
                         "1")
        r = self.w.request("POST", f"{base}/{cid}/restart")
        self.assertEqual(r.status, 200, r)
        out = gather(self.w, self.sid, "crud_v", context_id=cid)
        self.assertEqual(out["error"]["name"], "NameError", out)
        self.assertEqual(self.w.request("DELETE", f"{base}/{cid}").status, 200)
        self.assertError(self.w.request("GET", f"{base}/{cid}"), 404, "context_not_found")
        self.assertError(self.w.request("POST", f"/v1/sandboxes/{self.sid}/run_code",
                                        {"code": "1", "context_id": cid}),
                         404, "context_not_found")

    def test_bad_requests(self):
        url = f"/v1/sandboxes/{self.sid}/run_code"
        self.assertError(self.w.request("POST", url, {"code": "1", "context_id": "a",
                                                      "language": "python"}),
                         400, "invalid_argument")
        self.assertError(self.w.request("POST", url, {}), 400, "invalid_argument")
        self.assertError(self.w.request("POST", url, {"code": "1", "nope": 1}), 400,
                         "invalid_argument")
        self.assertError(self.w.request("POST", url, {"code": "1", "timeout_seconds": -1}),
                         400, "invalid_argument")
        self.assertError(self.w.request("POST", f"/v1/sandboxes/{self.sid}/contexts",
                                        {"language": "cobol"}), 400, "invalid_argument")
        self.assertError(self.w.request("POST", "/v1/sandboxes/nosuch/run_code", {"code": "1"}),
                         404, "sandbox_not_found")

    def test_reread_after_client_dropped(self):
        code = ("import time\n"
                "for i in range(6):\n"
                "    print('tick', i, flush=True)\n"
                "    time.sleep(0.5)\n")
        s, run, _ = open_stream(self.w, self.sid, code)
        s.close()  # gone mid-run: the run must go on
        deadline = time.time() + 120
        while True:
            lines = read_run(self.w, self.sid, run)
            if lines[-1]["type"] == "end_of_execution" or time.time() > deadline:
                break
        text = "".join(l["text"] for l in lines if l["type"] == "stdout")
        self.assertEqual(text, "".join(f"tick {i}\n" for i in range(6)), lines)
        # From an offset: the bytes of the lines before it, each with its newline.
        r = self.w.request("GET", f"/v1/sandboxes/{self.sid}/runs/{run}?offset=0")
        raw = [l for l in r.body.split(b"\n") if l and b'"keepalive"' not in l]
        off = len(raw[0]) + 1 + len(raw[1]) + 1
        again = read_run(self.w, self.sid, run, off)
        self.assertEqual(again[0], json.loads(raw[2]))
        # Inside a line: from the next one.
        self.assertEqual(read_run(self.w, self.sid, run, off - 3)[0], json.loads(raw[2]))
        self.assertError(self.w.request("GET", f"/v1/sandboxes/{self.sid}/runs/{run}"
                                        f"?offset={10**9}"), 400, "bad_offset")
        self.assertError(self.w.request("GET", f"/v1/sandboxes/{self.sid}/runs/4000000"),
                         404, "process_not_found")

    def test_delete_run_interrupts(self):
        s, run, _ = open_stream(self.w, self.sid, "import time\ntime.sleep(300)")
        try:
            r = self.w.request("DELETE", f"/v1/sandboxes/{self.sid}/runs/{run}")
            self.assertEqual(r.status, 200, r)
        finally:
            s.close()
        # The context is free again, and answers.
        out = gather(self.w, self.sid, "'after'")
        self.assertEqual(out["results"][0]["text"], "after", out)

    def test_big_result_is_an_error_and_warrend_stays_flat(self):
        before = rss_kib(self.w.proc.pid)
        with RssPeak(self.w.proc.pid) as peak:
            _, lines = stream(self.w, self.sid, "'x' * 40_000_000")
        errs = [l for l in lines if l["type"] == "error"]
        self.assertEqual([e["name"] for e in errs], ["OutputTooLarge"], [l["type"] for l in lines])
        self.assertEqual(lines[-1]["type"], "end_of_execution")
        if not SANITIZED:
            # One line is bounded by run_code_max_line_bytes (16 MiB); nothing near 40 MB.
            self.assertLess(peak.kib - before, 48 * 1024, (before, peak.kib))
        # The context lives on.
        self.assertEqual(gather(self.w, self.sid, "2*3")["results"][0]["text"], "6")
        # The kernel keeps that result in its output history: dropped, so the class's
        # other tests (a second kernel's start among them) do not share the VM with it.
        self.assertIsNone(gather(self.w, self.sid,
                                 "get_ipython().run_line_magic('reset', '-f out')")["error"])

    def test_no_kernel(self):
        """A sandbox without the bridge: 409 no_kernel. Without a minimal image here, this
        sandbox with the bridge's program moved aside stands for one."""
        if have_template("minimal"):
            sid, undo = self.w.create(), None
        else:
            sid, undo = self.sid, "mv /tmp/kerneld.py.aside /usr/lib/warren/kerneld.py"
            self.w.run(sid, "mv /usr/lib/warren/kerneld.py /tmp/kerneld.py.aside")
        try:
            r = self.w.request("POST", f"/v1/sandboxes/{sid}/run_code", {"code": "1"})
            self.assertError(r, 409, "no_kernel")
            self.assertIn("code-interpreter", r.json()["error"]["message"])
            self.assertError(self.w.request("GET", f"/v1/sandboxes/{sid}/contexts"), 409,
                             "no_kernel")
        finally:
            if undo:
                self.w.run(sid, undo)
            else:
                self.w.delete(sid)

    def test_zz_reread_after_kill9_of_warrend(self):
        """Last (by name): kill -9 of the class's warrend mid-run, and a new one."""
        w = self.w
        code = ("import time\n"
                "for beat in range(8):\n"
                "    print('beat', beat, flush=True)\n"
                "    time.sleep(0.5)\n"
                "'done'")
        s, run, _ = open_stream(w, self.sid, code)
        w.kill9()
        s.close()
        w.start()
        self.assertEqual(w.wait_guest(self.sid).status, 200)
        deadline = time.time() + 120
        while True:
            lines = read_run(w, self.sid, run)
            if lines[-1]["type"] == "end_of_execution" or time.time() > deadline:
                break
        text = "".join(l["text"] for l in lines if l["type"] == "stdout")
        self.assertEqual(text, "".join(f"beat {i}\n" for i in range(8)), lines)
        self.assertEqual([l["text"] for l in lines if l["type"] == "result"], ["done"])
        # The kernel and its context are the same after the restart.
        self.assertEqual(gather(w, self.sid, "beat")["results"][0]["text"], "7")

    def test_agent_socket_run_code(self):
        import websockets
        from test_ws_session import PROTO, mp_pack, mp_unpack

        async def go():
            ws = await websockets.connect(
                f"ws://127.0.0.1:{self.w.port}/v1/sandboxes/{self.sid}/session",
                extra_headers={"Authorization": f"Bearer {self.w.key}"},
                subprotocols=[PROTO], max_size=None, ping_interval=None)
            try:
                await ws.send(mp_pack({"id": 1, "op": "run_code",
                                       "code": "ws_v = 6\nprint('ws')\nws_v * 7"}))
                frames = []
                while not frames or frames[-1]["type"] not in ("end_of_execution", "error"):
                    frames.append(mp_unpack(await asyncio.wait_for(ws.recv(), 300)))
                await ws.send(mp_pack({"id": 2, "op": "contexts", "action": "list"}))
                listed = mp_unpack(await asyncio.wait_for(ws.recv(), 300))
                await ws.send(mp_pack({"id": 3, "op": "contexts", "action": "get",
                                       "context_id": "no-such-context"}))
                missing = mp_unpack(await asyncio.wait_for(ws.recv(), 300))
                return frames, listed, missing
            finally:
                await ws.close()

        frames, listed, missing = asyncio.run(asyncio.wait_for(go(), 600))
        self.assertTrue(all(f["id"] == 1 for f in frames))
        self.assertEqual(frames[0]["type"], "started")
        self.assertIsInstance(frames[0]["run_id"], int)
        types = [f["type"] for f in frames]
        self.assertEqual(types[-1], "end_of_execution", frames)
        self.assertIn("number_of_executions", types)
        self.assertEqual("".join(f["text"] for f in frames if f["type"] == "stdout"), "ws\n")
        self.assertEqual([f["text"] for f in frames if f["type"] == "result"], ["42"])
        self.assertEqual((listed["id"], listed["type"]), (2, "result"))
        self.assertTrue(listed["contexts"], listed)
        self.assertEqual((missing["type"], missing["code"]), ("error", "context_not_found"))


if __name__ == "__main__":
    unittest.main()
