"""Jupyter's kernel API on warrend (docs/API.md "Jupyter kernels"), driven by the real
gateway clients: Debian's notebook 6.4.12 and jupyter-server 1.23.3, each started with
--gateway-url pointing at a real warrend, executing cells through their own REST and
channels WebSocket in real code-interpreter microVMs; and the door itself, raw: auth,
unknown kernels, malformed frames, a dropped channels socket and kill -9 of warrend
in the middle of a cell.

Needs the code-interpreter template in the image dir (WARREN_CACHE), Debian's
jupyter-notebook, python3-jupyter-server and python3-websocket: run with
/usr/bin/python3."""
import base64
import json
import os
import re
import shutil
import socket
import subprocess
import tempfile
import time
import unittest
import uuid

import websocket

from cibox import TEMPLATE, CodeCase
from warren import free_port
T = 1500  # seconds: a kernel's first start imports numpy, pandas, matplotlib under TCG


def msg(msg_type, content, channel="shell"):
    mid = uuid.uuid4().hex
    return mid, json.dumps({
        "header": {"msg_id": mid, "msg_type": msg_type, "username": "test",
                   "session": "test-session", "date": "2026-01-01T00:00:00Z", "version": "5.3"},
        "parent_header": {}, "metadata": {}, "content": content, "buffers": [],
        "channel": channel})


def execute(code):
    return msg("execute_request", {"code": code, "silent": False, "store_history": True,
                                   "user_expressions": {}, "allow_stdin": False,
                                   "stop_on_error": True})


def collect(ws, mid, timeout=T):
    """Messages of the request mid until both its execute_reply and iopub idle came:
    (reply content, iopub messages of mid)."""
    deadline = time.time() + timeout
    reply, iopub, idle = None, [], False
    while time.time() < deadline and not (reply and idle):
        ws.settimeout(max(1, deadline - time.time()))
        m = json.loads(ws.recv())
        if m.get("parent_header", {}).get("msg_id") != mid:
            continue
        t = m["header"]["msg_type"]
        if m.get("channel") == "shell" and t == "execute_reply":
            reply = m["content"]
        elif m.get("channel") == "iopub":
            iopub.append(m)
            if t == "status" and m["content"].get("execution_state") == "idle":
                idle = True
    assert reply and idle, f"no reply/idle for {mid}: {reply} {iopub}"
    return reply, iopub


def wait_state(ws, mid, state, timeout=T):
    """Read ws up to the kernel's iopub status state for request mid."""
    deadline = time.time() + timeout
    while time.time() < deadline:
        ws.settimeout(max(1, deadline - time.time()))
        o = json.loads(ws.recv())
        if (o.get("parent_header", {}).get("msg_id") == mid
                and o["header"]["msg_type"] == "status"
                and o["content"]["execution_state"] == state):
            return
    raise AssertionError(f"no {state} status for {mid}")


def stream_text(iopub):
    return "".join(m["content"]["text"] for m in iopub if m["header"]["msg_type"] == "stream")


def wait_port(port, proc, log, timeout=120):
    deadline = time.time() + timeout
    while time.time() < deadline:
        if proc.poll() is not None:
            raise AssertionError("the Jupyter server exited:\n" + open(log).read()[-4000:])
        try:
            socket.create_connection(("127.0.0.1", port), timeout=1).close()
            return
        except OSError:
            time.sleep(0.2)
    raise AssertionError("the Jupyter server did not listen:\n" + open(log).read()[-4000:])


class JupyterCase(CodeCase):
    """On the process's code-interpreter warrend (cibox.py): a kernel's sandbox is a clone
    of its template's pool, its kernel already warm."""

    def ws(self, kid, headers=None, query=""):
        h = headers if headers is not None else [f"Authorization: token {self.w.key}"]
        return websocket.create_connection(
            f"ws://127.0.0.1:{self.w.port}/api/kernels/{kid}/channels{query}", header=h,
            timeout=T)

    def new_kernel(self):
        r = self.w.request("POST", "/api/kernels", {"name": "python3"}, timeout=T)
        self.assertEqual(r.status, 201, f"{r}\n{self.w.log_text()}")
        # Its id carries this host (a fleet's proxy routes by it): "...-<host>_<12 hex>".
        host = {k.lower(): v for k, v in r.headers.items()}["x-warren-host"]
        self.assertRegex(r.json()["id"], r"^[0-9a-f]{8}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{4}-"
                         + re.escape(host) + r"_[0-9a-f]{12}$")
        return r.json()["id"]


class DoorTest(JupyterCase):
    """The door, as a raw client sees it."""

    def test_1_auth_and_specs(self):
        w = self.w
        r = w.request("GET", "/api/kernelspecs", auth=False)
        self.assertEqual(r.status, 401, r)
        r = w.request("GET", "/api/kernelspecs", auth=False,
                      headers={"Authorization": "token wrong"})
        self.assertEqual(r.status, 403, r)
        r = w.request("GET", "/api/kernelspecs?token=wrong", auth=False)
        self.assertEqual(r.status, 403, r)
        for how in ({"headers": {"Authorization": f"token {w.key}"}},
                    {"headers": {"Authorization": f"Bearer {w.key}"}}, {}):
            path = "/api/kernelspecs" + ("" if how else f"?token={w.key}")
            r = w.request("GET", path, auth=False, **how)
            self.assertEqual(r.status, 200, r)
            j = r.json()
            self.assertEqual(j["default"], "python3")
            self.assertEqual(j["kernelspecs"]["python3"]["spec"]["language"], "python")
        r = w.request("GET", "/api/kernelspecs/python3")
        self.assertEqual(r.json()["name"], "python3")
        self.assertEqual(w.request("GET", "/api/kernelspecs/nope").status, 404)
        self.assertEqual(w.request("GET", "/kernelspecs/python3/logo-64x64.png").status, 404)
        r = w.request("POST", "/api/kernels", {"name": "nope"})
        self.assertEqual(r.status, 404, r)
        self.assertEqual(r.json()["error"]["code"], "kernelspec_not_found")

    def test_2_unknown_kernel(self):
        w = self.w
        gone = str(uuid.uuid4())
        for m in ("GET", "DELETE"):
            r = w.request(m, f"/api/kernels/{gone}")
            self.assertEqual(r.status, 404, r)
            self.assertEqual(r.json()["error"]["code"], "kernel_not_found")
        self.assertEqual(w.request("POST", f"/api/kernels/{gone}/interrupt", {}).status, 404)
        with self.assertRaises(websocket.WebSocketBadStatusException) as cm:
            self.ws(gone)
        self.assertEqual(cm.exception.status_code, 404)
        with self.assertRaises(websocket.WebSocketBadStatusException) as cm:
            self.ws(gone, headers=[])
        self.assertEqual(cm.exception.status_code, 401)
        with self.assertRaises(websocket.WebSocketBadStatusException) as cm:
            self.ws(gone, headers=["Authorization: token wrong"])
        self.assertEqual(cm.exception.status_code, 403)
        self.assertEqual(w.request("GET", "/api/kernels").json(), [])

    def test_3_channels(self):
        """A kernel of our own: a malformed frame is answered and the socket goes on; a
        dropped socket's output reaches the next one; so does a cell that ran while
        warrend was killed -9."""
        w = self.w
        kid = self.new_kernel()
        r = w.request("GET", f"/api/kernels/{kid}")
        self.assertEqual(r.status, 200, r)
        self.assertEqual(r.json()["id"], kid)
        self.assertIn(kid, [k["id"] for k in w.request("GET", "/api/kernels").json()])

        ws = self.ws(kid, query="?session_id=abc")
        for bad in ("not json", "[1,2]", '{"header":{},"channel":"iopub"}'):
            ws.send(bad)
            m = json.loads(ws.recv())
            self.assertEqual(m["header"]["msg_type"], "warren_error", m)
            self.assertEqual(m["content"]["code"], "bad_request", m)
        mid, m = execute("x = 6 * 7\nprint(x)")
        ws.send(m)
        reply, iopub = collect(ws, mid)
        self.assertEqual(reply["status"], "ok", reply)
        self.assertEqual(stream_text(iopub), "42\n")
        self.assertEqual(w.request("GET", f"/api/kernels/{kid}").json()["connections"], 1)
        self.assertEqual(w.request("GET", f"/api/kernels/{kid}").json()["execution_state"],
                         "idle")

        # execution_state follows the kernel: busy while a cell sleeps, idle after.
        mid, m = execute("import time; time.sleep(30); print('slept')")
        ws.send(m)
        wait_state(ws, mid, "busy")
        self.assertEqual(w.request("GET", f"/api/kernels/{kid}").json()["execution_state"],
                         "busy")
        self.assertEqual([k["execution_state"] for k in w.request("GET", "/api/kernels").json()
                          if k["id"] == kid], ["busy"])
        reply, iopub = collect(ws, mid)
        self.assertEqual(stream_text(iopub), "slept\n")
        self.assertEqual(w.request("GET", f"/api/kernels/{kid}").json()["execution_state"],
                         "idle")

        # Dropped while the cell runs: the next socket gets what it missed.
        mid, m = execute("import time; time.sleep(4); print('late', x)")
        ws.send(m)
        ws.close()
        time.sleep(1)
        ws = self.ws(kid)
        reply, iopub = collect(ws, mid)
        self.assertEqual(reply["status"], "ok", reply)
        self.assertIn("late 42", stream_text(iopub))

        # kill -9 of warrend mid-cell: the restarted one finds the connector again.
        mid, m = execute("import time; time.sleep(6); print('after the kill', x)")
        ws.send(m)
        time.sleep(1)
        w.kill9()
        ws.close()
        w.start()
        ws = self.ws(kid)
        reply, iopub = collect(ws, mid)
        self.assertEqual(reply["status"], "ok", reply)
        self.assertIn("after the kill 42", stream_text(iopub))
        mid, m = execute("print(x + 1)")
        ws.send(m)
        reply, iopub = collect(ws, mid)
        self.assertEqual(stream_text(iopub), "43\n")
        ws.close()

        r = w.request("DELETE", f"/api/kernels/{kid}")
        self.assertEqual(r.status, 204, r)
        self.assertEqual(r.body, b"")
        self.assertEqual(w.request("GET", f"/api/kernels/{kid}").status, 404)


# A stand-in for the guest's kernel bridge (docs/KERNELD.md "channels"), run inside a
# real code-interpreter VM, so the door's relay, replay and restart paths are tested
# even where a real python kernel cannot start in time. execute_request answers busy,
# then after "sleep N" in the code N seconds, a stream of the code, the reply and idle.
STANDIN = r"""
import json, os, socket, threading, time
P = "/run/warren/kernel.sock"
os.makedirs("/run/warren", exist_ok=True)
try: os.unlink(P)
except FileNotFoundError: pass
srv = socket.socket(socket.AF_UNIX); srv.bind(P); os.chmod(P, 0o600); srv.listen(16)
def out(f, ch, t, parent, content):
    m = {"header": {"msg_id": os.urandom(8).hex(), "msg_type": t}, "parent_header": parent,
         "metadata": {}, "content": content, "buffers": [], "channel": ch}
    f.write((json.dumps(m) + "\n").encode()); f.flush()
def serve(c):
    f = c.makefile("rwb")
    req = json.loads(f.readline())
    if req.get("op") != "channels":
        f.write(b'{"type":"fail","code":"bad_request","message":"stand-in"}\n'); f.flush(); return
    for line in f:
        m = json.loads(line); h = m["header"]
        if h.get("msg_type") != "execute_request": continue
        code = m["content"]["code"]
        out(f, "iopub", "status", h, {"execution_state": "busy"})
        if code.startswith("sleep "): time.sleep(float(code.split()[1]))
        out(f, "iopub", "stream", h, {"name": "stdout", "text": "ran " + code + "\n"})
        out(f, "shell", "execute_reply", h, {"status": "ok", "channel_seen": m["channel"]})
        out(f, "iopub", "status", h, {"execution_state": "idle"})
while True:
    c, _ = srv.accept(); threading.Thread(target=serve, args=(c,), daemon=True).start()
"""


class RelayTest(JupyterCase):
    """The channels relay against a stand-in bridge in a real VM: frames both ways, a
    malformed frame, a dropped socket and kill -9 of warrend losing no message."""

    def test_relay(self):
        w = self.w
        kid = str(uuid.uuid4())
        r = w.request("POST", "/v1/sandboxes", {
            "template": TEMPLATE, "ttl_seconds": 7200, "idle_timeout_seconds": 0,
            "metadata": {"jupyter.kernel_id": kid, "jupyter.kernelspec": "python3"}}, timeout=T)
        self.assertEqual(r.status, 201, r)
        sid = r.json()["id"]
        r = w.request("PUT", f"/v1/sandboxes/{sid}/files?path=/root/standin.py",
                      STANDIN.encode())
        self.assertIn(r.status, (200, 201), r)
        # The template's own bridge (started by its warm-up at create) gives way to the
        # stand-in: it is stopped and its socket removed, so the socket that appears next
        # is the stand-in's.
        # ([k]: the pattern must not match this shell's own command line.)
        w.run(sid, "pkill -f '/usr/lib/warren/[k]erneld.py'; while pgrep -f"
              " '/usr/lib/warren/[k]erneld.py' >/dev/null; do sleep 0.2; done;"
              " rm -f /run/warren/kernel.sock", user="root")
        r = w.exec(sid, "python3 /root/standin.py", background=True, user="root")
        self.assertEqual(r.status, 201, r)
        deadline = time.time() + 300
        while w.run(sid, "test -S /run/warren/kernel.sock && echo up",
                    user="root")["stdout"] != "up\n":
            self.assertLess(time.time(), deadline, "the stand-in bridge did not listen")
            time.sleep(1)
        self.assertEqual(w.request("GET", f"/api/kernels/{kid}").json()["id"], kid)

        ws = self.ws(kid, query="?session_id=abc")
        for bad in ("not json", "[1,2]", '{"header":{},"channel":"iopub"}'):
            ws.send(bad)
            m = json.loads(ws.recv())
            self.assertEqual(m["header"]["msg_type"], "warren_error", m)
            self.assertEqual(m["content"]["code"], "bad_request", m)
        mid, m = execute("one")
        o = json.loads(m)
        del o["channel"]  # shell when absent
        ws.send(json.dumps(o))
        reply, iopub = collect(ws, mid)
        self.assertEqual(reply, {"status": "ok", "channel_seen": "shell"})
        self.assertEqual(stream_text(iopub), "ran one\n")
        self.assertEqual(w.request("GET", f"/api/kernels/{kid}").json()["connections"], 1)

        # Dropped while the cell runs: the next socket gets what it missed.
        mid, m = execute("sleep 3")
        ws.send(m)
        ws.close()
        time.sleep(1)
        ws = self.ws(kid)
        reply, iopub = collect(ws, mid)
        self.assertEqual(stream_text(iopub), "ran sleep 3\n")

        # kill -9 of warrend mid-cell: the restarted one finds the connector again.
        mid, m = execute("sleep 5")
        ws.send(m)
        time.sleep(1)
        w.kill9()
        ws.close()
        w.start()
        ws = self.ws(kid)
        reply, iopub = collect(ws, mid)
        self.assertEqual(stream_text(iopub), "ran sleep 5\n")
        mid, m = execute("two")
        ws.send(m)
        reply, iopub = collect(ws, mid)
        self.assertEqual(stream_text(iopub), "ran two\n")
        ws.close()

        r = w.request("DELETE", f"/api/kernels/{kid}")
        self.assertEqual(r.status, 204, r)
        self.assertEqual(r.body, b"")
        self.assertEqual(w.request("GET", f"/api/kernels/{kid}").status, 404)


class GatewayClients:
    """A Jupyter server with --gateway-url at warrend, driven headless through its own
    REST and channels WebSocket. Subclasses say how to start it."""

    def start_server(self, port, token, env, root):
        raise NotImplementedError

    def setUp(self):
        self.tmp = tempfile.mkdtemp(prefix="warren-jupyter-")
        self.port = free_port()
        self.token = uuid.uuid4().hex
        env = dict(os.environ, HOME=self.tmp, JUPYTER_CONFIG_DIR=f"{self.tmp}/config",
                   JUPYTER_DATA_DIR=f"{self.tmp}/data", JUPYTER_RUNTIME_DIR=f"{self.tmp}/run",
                   JUPYTER_GATEWAY_REQUEST_TIMEOUT=str(T),
                   JUPYTER_GATEWAY_CONNECT_TIMEOUT=str(T))
        self.log = f"{self.tmp}/server.log"
        with open(self.log, "wb") as lf:
            self.proc = subprocess.Popen(self.start_server(self.port, self.token, env, self.tmp),
                                         stdin=subprocess.DEVNULL, stdout=lf, stderr=lf, env=env)
        wait_port(self.port, self.proc, self.log)

    def tearDown(self):
        self.proc.terminate()
        try:
            self.proc.wait(timeout=20)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait()
        shutil.rmtree(self.tmp, ignore_errors=True)

    def api(self, method, path, body=None, timeout=T):
        import http.client
        c = http.client.HTTPConnection("127.0.0.1", self.port, timeout=timeout)
        h = {"Authorization": f"token {self.token}"}
        data = json.dumps(body).encode() if body is not None else None
        if data is not None:
            h["Content-Type"] = "application/json"
        try:
            c.request(method, path, body=data, headers=h)
            r = c.getresponse()
            return r.status, r.read()
        finally:
            c.close()

    def channels(self, kid, session):
        """The server's channels socket, once a kernel_info round trip through it came back.

        jupyter-server 1.23.3's gateway client opens its own socket to the gateway a loop
        turn after the client's socket opened (open() spawns _connect), and a message that
        arrives before that turn is attached to a placeholder future that never completes:
        it is dropped silently. On a loaded host that is the first message sent right after
        the handshake. So, as a frontend must, ask kernel_info until it is answered (a
        request that was merely slow is answered twice, which is harmless)."""
        ws = websocket.create_connection(
            f"ws://127.0.0.1:{self.port}/api/kernels/{kid}/channels?session_id={session}"
            f"&token={self.token}", timeout=T)
        deadline = time.time() + T
        while True:
            mid, m = msg("kernel_info_request", {})
            ws.send(m)
            resend = time.time() + 20
            while time.time() < min(resend, deadline):
                ws.settimeout(max(1, min(resend, deadline) - time.time()))
                try:
                    o = json.loads(ws.recv())
                except websocket.WebSocketTimeoutException:
                    break
                if (o.get("parent_header", {}).get("msg_type") == "kernel_info_request"
                        and o["header"]["msg_type"] == "kernel_info_reply"):
                    self.assertEqual(o["content"]["status"], "ok", o)
                    ws.settimeout(T)
                    return ws
            self.assertLess(time.time(), deadline, "no kernel_info_reply through the server")

    def test_cells(self):
        st, body = self.api("GET", "/api/kernelspecs")
        self.assertEqual(st, 200, body)
        self.assertIn("python3", json.loads(body)["kernelspecs"])
        st, body = self.api("POST", "/api/sessions", {
            "path": "t.ipynb", "name": "t.ipynb", "type": "notebook",
            "kernel": {"name": "python3"}})
        self.assertEqual(st, 201, body + open(self.log, "rb").read()[-4000:])
        kid = json.loads(body)["kernel"]["id"]
        # The notebook server's kernel is warrend's.
        r = self.w.request("GET", f"/api/kernels/{kid}")
        self.assertEqual(r.status, 200, r)
        session = uuid.uuid4().hex
        ws = self.channels(kid, session)

        def run(code):
            mid, m = execute(code)
            ws.send(m)
            return collect(ws, mid)

        reply, iopub = run("a = 20\nb = a + 1")
        self.assertEqual(reply["status"], "ok", reply)
        reply, iopub = run("print(a * b)")
        self.assertEqual(stream_text(iopub), "420\n")

        reply, iopub = run("import matplotlib.pyplot as plt\nplt.plot([1, 3, 2])\nplt.show()")
        self.assertEqual(reply["status"], "ok", reply)
        pngs = [m["content"]["data"]["image/png"] for m in iopub
                if m["header"]["msg_type"] == "display_data"
                and "image/png" in m["content"]["data"]]
        self.assertTrue(pngs, iopub)
        self.assertTrue(base64.b64decode(pngs[0]).startswith(b"\x89PNG\r\n\x1a\n"))

        reply, iopub = run("def f():\n    return 1 / 0\nf()")
        self.assertEqual(reply["status"], "error", reply)
        self.assertEqual(reply["ename"], "ZeroDivisionError")
        errs = [m["content"] for m in iopub if m["header"]["msg_type"] == "error"]
        self.assertTrue(errs, iopub)
        # IPython colours its traceback: the text without its ANSI escapes.
        tb = re.sub(r"\x1b\[[0-9;]*m", "", "\n".join(errs[0]["traceback"]))
        self.assertIn("ZeroDivisionError", tb)
        self.assertIn("return 1 / 0", tb)

        # Interrupt a long sleep through the notebook server's REST.
        mid, m = execute("import time\ntime.sleep(100)")
        ws.send(m)
        wait_state(ws, mid, "busy")  # the cell is running once the kernel says busy
        # warrend's model says so too, whichever client's socket relayed it.
        r = self.w.request("GET", f"/api/kernels/{kid}")
        self.assertEqual(r.json()["execution_state"], "busy", r)
        st, body = self.api("POST", f"/api/kernels/{kid}/interrupt", {})
        self.assertEqual(st, 204, body)
        reply, iopub = collect(ws, mid, timeout=90)
        self.assertEqual(reply["status"], "error", reply)
        self.assertEqual(reply["ename"], "KeyboardInterrupt", reply)
        r = self.w.request("GET", f"/api/kernels/{kid}")
        self.assertEqual(r.json()["execution_state"], "idle", r)
        reply, iopub = run("print(a)")
        self.assertEqual(stream_text(iopub), "20\n")

        # Restart: the variables are gone.
        st, body = self.api("POST", f"/api/kernels/{kid}/restart", {})
        self.assertEqual(st, 200, body)
        ws.close()
        ws = self.channels(kid, session)
        reply, iopub = run("print('a' in dir())")
        self.assertEqual(stream_text(iopub), "False\n", iopub)
        ws.close()

        st, body = self.api("DELETE", f"/api/kernels/{kid}")
        self.assertEqual(st, 204, body)
        deadline = time.time() + 60
        while self.w.request("GET", f"/api/kernels/{kid}").status != 404:
            self.assertLess(time.time(), deadline, "the kernel's sandbox outlived its DELETE")
            time.sleep(0.5)


class NotebookTest(GatewayClients, JupyterCase):
    """notebook 6.4.12: "Authorization: token KEY" (JUPYTER_GATEWAY_AUTH_TOKEN)."""

    def start_server(self, port, token, env, root):
        env["JUPYTER_GATEWAY_AUTH_TOKEN"] = self.w.key
        return ["/usr/bin/jupyter-notebook", "--no-browser", "--allow-root", "--ip=127.0.0.1",
                f"--port={port}", f"--NotebookApp.token={token}", f"--notebook-dir={root}",
                f"--gateway-url=http://127.0.0.1:{self.w.port}"]


class JupyterServerTest(GatewayClients, JupyterCase):
    """jupyter-server 1.23.3: the key as a Bearer header (JUPYTER_GATEWAY_HEADERS)."""

    def start_server(self, port, token, env, root):
        env["JUPYTER_GATEWAY_HEADERS"] = json.dumps({"Authorization": f"Bearer {self.w.key}"})
        return ["/usr/bin/python3", "-m", "jupyter_server", "--no-browser", "--allow-root",
                "--ip=127.0.0.1", f"--port={port}", f"--ServerApp.token={token}",
                f"--ServerApp.root_dir={root}", f"--gateway-url=http://127.0.0.1:{self.w.port}"]


if __name__ == "__main__":
    unittest.main()
