#!/usr/bin/python3
"""warren-kerneld: the guest's kernel bridge (docs/KERNELD.md).

Owns the sandbox's code contexts (python: a Jupyter kernel through
jupyter_client; bash: one persistent shell) and serves them on one Unix
socket, one JSON request a connection, answered with JSON lines. warrend
reaches it only through `/proc/1/exe --connect`, a sandbox process, so every
byte it writes has the bounds and durability of process output.

Everything a client or a kernel sends is hostile: requests are read with a
bounded line, answers are written one line at a time and drained before the
next (a slow reader stops the bridge, never grows it), a kernel message over
MAX_MSG is refused by ZeroMQ itself, and a run's output past its budget
becomes one OutputTooLarge error.

`kerneld.py --warm` (what /etc/warren/warm runs) starts the daemon detached
and exits 0 once the default python context is up with numpy, pandas and
matplotlib imported, or non-zero with the reason on stderr.
"""

import asyncio
import base64
import datetime
import json
import os
import re
import secrets
import select
import shlex
import signal
import socket
import sys
import uuid

# WARREN_KERNELD_RUN moves the daemon's files (a test of the bridge outside a guest).
RUN = os.environ.get("WARREN_KERNELD_RUN", "/run/warren")
SOCK = RUN + "/kernel.sock"
RUNTIME = RUN + "/kernels"
LOG = RUN + "/kerneld.log"
BOOT_ID = os.environ.get("WARREN_KERNELD_BOOT_ID", "/proc/sys/kernel/random/boot_id")
HOME = "/root"  # the sandbox's default user is root (docs/API.md, exec `user`)

MAX_REQUEST = 16 << 20  # one request line, and one channels message from a client
MAX_LINE_DEFAULT = 16 << 20
MAX_LINE_MIN = 1024
MAX_OUTPUT_DEFAULT = 256 << 20  # bytes of lines a run may write
MAX_MSG = 64 << 20  # a kernel message larger than this is dropped by ZeroMQ
MAX_CONTEXTS = 64
MAX_CLIENT_QUEUE = 1024  # iopub messages waiting for one slow channels client
MAX_LOG = 1 << 20
START_TIMEOUT = 300.0  # a kernel's start: minutes under TCG on a busy host
INTERRUPT_GRACE = 10.0  # after an interrupt, the kernel must go idle within this
READ_POLL = 2.0  # a channel's reader looks for messages at least this often (reader)
WARM_IMPORTS = (
    "import numpy, pandas, matplotlib\n"
    "import matplotlib.pyplot\n"
)
RESEED = (
    "import random as _w_r, os as _w_os\n"
    "_w_r.seed(_w_os.urandom(32))\n"
    "try:\n"
    "    import numpy as _w_np\n"
    "    _w_np.random.seed(int.from_bytes(_w_os.urandom(4), 'little'))\n"
    "except ImportError:\n"
    "    pass\n"
    "get_ipython().kernel.session.key = {key!r}\n"
    "del _w_r, _w_os\n"
)
ENV_NAME = re.compile(r"^[A-Za-z_][A-Za-z0-9_]*$")

_log_bytes = 0


def log(msg):
    global _log_bytes
    line = "%s kerneld: %s\n" % (datetime.datetime.now().isoformat(timespec="seconds"), msg)
    if _log_bytes + len(line) > MAX_LOG:
        return
    _log_bytes += len(line)
    sys.stderr.write(line)
    sys.stderr.flush()


class Fail(Exception):
    def __init__(self, code, message):
        super().__init__(message)
        self.code = code
        self.message = message


def now_iso():
    return datetime.datetime.now(datetime.timezone.utc).isoformat()


def read_boot_id():
    try:
        with open(BOOT_ID) as f:
            return f.read().strip()
    except OSError:
        return ""


def json_default(o):
    if isinstance(o, datetime.datetime):
        return o.isoformat()
    if isinstance(o, (bytes, bytearray, memoryview)):
        return base64.b64encode(bytes(o)).decode()
    return str(o)


def dumps(obj):
    return json.dumps(obj, default=json_default, ensure_ascii=False, separators=(",", ":"))


def check_env(env):
    if env is None:
        return {}
    if not isinstance(env, dict):
        raise Fail("bad_request", "env must be an object of strings")
    for k, v in env.items():
        if not ENV_NAME.match(k) or not isinstance(v, str) or "\0" in v:
            raise Fail("bad_request", "env: %r is not a variable name with a string value" % k)
    return env


class Out:
    """One client connection's writer: lines, each bounded, drained one at a time."""

    def __init__(self, writer, max_line=MAX_LINE_DEFAULT, max_output=MAX_OUTPUT_DEFAULT):
        self.w = writer
        self.max_line = max_line
        self.max_output = max_output
        self.written = 0
        self.over = False  # the run's budget is spent: only its end goes out
        self.closed = False

    def hung_up(self):
        """The peer closed its socket (not only its write side: POLLHUP, not POLLRDHUP)."""
        if self.closed:
            return True
        sock = self.w.get_extra_info("socket")
        if sock is None:
            return False
        p = select.poll()
        p.register(sock.fileno(), select.POLLHUP | select.POLLERR)
        if p.poll(0):
            self.closed = True
        return self.closed

    async def line(self, obj, always=False):
        if self.closed:
            return
        data = (dumps(obj) + "\n").encode()
        if len(data) > self.max_line:
            data = (dumps({"type": "error", "name": "OutputTooLarge",
                           "value": "a %s line of %d bytes exceeds max_line (%d)"
                           % (obj.get("type", "?"), len(data), self.max_line),
                           "traceback": ""}) + "\n").encode()
        if not always and self.written + len(data) > self.max_output:
            if self.over:
                return
            self.over = True
            data = (dumps({"type": "error", "name": "OutputTooLarge",
                           "value": "the run's output exceeds %d bytes: the rest is dropped"
                           % self.max_output, "traceback": ""}) + "\n").encode()
        self.written += len(data)
        try:
            self.w.write(data)
            await self.w.drain()
        except (ConnectionError, OSError):
            self.closed = True


# ---- python contexts ------------------------------------------------------------


class PyContext:
    language = "python"

    def __init__(self, d, cid, cwd, env, default):
        from jupyter_client.manager import AsyncKernelManager

        self.d = d
        self.id = cid
        self.cwd = cwd
        self.env = env
        self.default = default
        self.lock = asyncio.Lock()
        self.km = AsyncKernelManager(kernel_name="python3")
        self.km.connection_file = os.path.join(RUNTIME, "kernel-%s.json" % cid)
        self.socks = {}
        self.readers = {}
        self.waiters = {}  # msg_id -> queue of (channel, msg) for a run or an internal request
        self.owners = {}  # msg_id -> the channels client that sent it
        self.clients = set()  # channels clients: iopub goes to all
        self.started_boot_id = ""
        self.pid = 0
        self.iopub_lost = 0  # times the iopub connection was dropped (a message over MAX_MSG)
        self.monitor = None
        self.dropped = {}  # channel -> messages that did not deserialize (diagnose says)
        self.reader_end = {}  # channel -> why its reader stopped

    def obj(self):
        return {"id": self.id, "language": self.language, "cwd": self.cwd,
                "default": self.default, "kernel_id": self.km.kernel_id,
                "pid": self.pid, "started_boot_id": self.started_boot_id}

    def connect(self, ch):
        import zmq
        import zmq.asyncio

        info = self.km.get_connection_info()
        kind = zmq.SUB if ch == "iopub" else zmq.DEALER
        s = zmq.asyncio.Context.instance().socket(kind)
        s.setsockopt(zmq.LINGER, 0)
        s.setsockopt(zmq.MAXMSGSIZE, MAX_MSG)
        s.setsockopt(zmq.RCVHWM, 1000)
        if kind == zmq.SUB:
            s.setsockopt(zmq.SUBSCRIBE, b"")
        else:
            s.setsockopt(zmq.IDENTITY, uuid.uuid4().hex.encode())
        s.connect("%s://%s:%d" % (info["transport"], info["ip"], info[ch + "_port"]))
        self.socks[ch] = s
        self.readers[ch] = asyncio.ensure_future(self.reader(ch))

    async def watch_iopub(self):
        """A message over MAX_MSG makes ZeroMQ drop the connection, and it does not come
        back by itself: count the loss (the run in flight says so) and connect anew."""
        import zmq
        from zmq.utils.monitor import parse_monitor_message

        while True:
            mon = self.socks["iopub"].get_monitor_socket(zmq.EVENT_DISCONNECTED)
            try:
                ev = parse_monitor_message(await mon.recv_multipart())
            finally:
                mon.close(0)
            if ev["event"] != zmq.EVENT_DISCONNECTED:
                continue
            self.iopub_lost += 1
            log("%s: iopub dropped (a message over %d bytes?); reconnecting" % (self.id, MAX_MSG))
            self.readers.pop("iopub").cancel()
            self.socks.pop("iopub").close(0)
            self.connect("iopub")

    async def start(self):
        env = dict(os.environ)
        env.update(self.env)
        env.setdefault("HOME", HOME)
        env.setdefault("MPLCONFIGDIR", "/var/cache/matplotlib")
        env.pop("WARREN_EXEC_ID", None)
        env["PYDEVD_DISABLE_FILE_VALIDATION"] = "1"  # no debugger warning on every start
        # A kernel that crashes, or is sent SIGABRT (diagnose), leaves its threads' Python
        # stacks in kerneld's log (its stderr).
        env.setdefault("PYTHONFAULTHANDLER", "1")
        await self.km.start_kernel(cwd=self.cwd, env=env)
        self.pid = self.km.provisioner.pid if self.km.provisioner else 0
        self.started_boot_id = read_boot_id()
        for ch in ("shell", "control", "stdin", "iopub"):
            self.connect(ch)
        self.monitor = asyncio.ensure_future(self.watch_iopub())
        await self.wait_ready()

    async def wait_ready(self):
        """kernel_info until a reply and an iopub message both came: iopub is joined. A
        slow kernel (TCG, a busy guest) answers late, so a reply to any earlier request
        counts, and the wait between requests grows: with a fixed window, a kernel that
        takes longer than it to answer is never found ready."""
        loop = asyncio.get_running_loop()
        deadline = loop.time() + START_TIMEOUT
        q = asyncio.Queue()
        sent = []
        got_reply = got_iopub = False
        window = 1.0
        try:
            while loop.time() < deadline:
                if not await self.km.is_alive():
                    raise Fail("internal", "the python kernel exited while starting")
                msg = self.km.session.msg("kernel_info_request", {})
                sent.append(msg["header"]["msg_id"])
                self.waiters[sent[-1]] = q
                self.send("shell", msg)
                end = min(loop.time() + window, deadline)
                try:
                    while not (got_reply and got_iopub):
                        ch, _ = await asyncio.wait_for(q.get(), max(end - loop.time(), 0))
                        got_reply |= ch == "shell"
                        got_iopub |= ch == "iopub"
                except asyncio.TimeoutError:
                    pass
                if got_reply and got_iopub:
                    return
                window = min(window * 2, 8.0)
        finally:
            for m in sent:
                self.waiters.pop(m, None)
        raise Fail("internal", "the python kernel did not answer within %d s (%d kernel_info "
                   "requests; a reply: %s; iopub: %s)" % (START_TIMEOUT, len(sent),
                                                          got_reply, got_iopub))

    def expect(self, msg):
        q = asyncio.Queue()
        self.waiters[msg["header"]["msg_id"]] = q
        return q

    def send(self, ch, msg):
        self.km.session.send(self.socks[ch], msg)

    async def reader(self, ch):
        """The channel's messages to their waiters and clients. A ZeroMQ socket's fd only
        signals an edge; a wake-up missed (a warm's reply was seen to wait unread for
        300 s, the kernel idle) must not strand what came: each turn takes what is
        there without blocking, and waits for more at most READ_POLL seconds."""
        import zmq

        sess = self.km.session
        sock = self.socks[ch]
        while True:
            try:
                try:
                    parts = await sock.recv_multipart(zmq.NOBLOCK)
                except zmq.Again:
                    await sock.poll(READ_POLL * 1000, zmq.POLLIN)
                    continue
            except asyncio.CancelledError:
                raise
            except Exception as e:  # a closed socket: the context is going
                log("%s %s: %s" % (self.id, ch, e))
                self.reader_end[ch] = repr(e)
                return
            try:
                _, parts = sess.feed_identities(parts)
                msg = sess.deserialize(parts, content=True)
            except Exception:
                # unsigned, badly signed (re-keying) or malformed: not the kernel's
                self.dropped[ch] = self.dropped.get(ch, 0) + 1
                continue
            parent = (msg.get("parent_header") or {}).get("msg_id")
            q = self.waiters.get(parent)
            if q is not None:
                q.put_nowait((ch, msg))
            if ch == "iopub":
                for c in list(self.clients):
                    c.push(ch, msg)
            else:
                c = self.owners.get(parent)
                if c is not None:
                    c.push(ch, msg)
                    if ch != "stdin" and msg["msg_type"].endswith("_reply"):
                        self.owners.pop(parent, None)

    async def silent(self, code, timeout=30.0, resend_after=0.0):
        """Run code of the bridge's own (no history, no count) within timeout seconds;
        True when it succeeded. Why it did not is in self.silent_why.

        resend_after (idempotent code only): when nothing at all came for the request in
        that long (not even its busy status), the same code goes again as a new request
        (three times at most), and the first reply to any counts. Seen here: a warm's imports whose request
        or reply went missing, the kernel idle in epoll_wait and kerneld waiting, until
        the 300 s ran out; a new request gives both sides a message to wake on."""
        loop = asyncio.get_running_loop()
        q = asyncio.Queue()
        sent = []

        def send():
            msg = self.km.session.msg("execute_request", {
                "code": code, "silent": True, "store_history": False,
                "user_expressions": {}, "allow_stdin": False, "stop_on_error": False})
            sent.append(msg["header"]["msg_id"])
            self.waiters[sent[-1]] = q
            self.send("shell", msg)

        send()
        deadline = loop.time() + timeout
        heard = False
        self.silent_why = "no reply within %.0f s" % timeout
        try:
            while True:
                left = deadline - loop.time()
                nudge = resend_after and not heard and len(sent) <= 3
                if nudge:
                    left = min(left, resend_after)
                try:
                    ch, m = await asyncio.wait_for(q.get(), max(left, 0.001))
                except asyncio.TimeoutError:
                    if loop.time() >= deadline - 0.001 or not nudge:
                        self.silent_why += " (%d requests)" % len(sent)
                        return False
                    log("%s: no sign of own code's request in %g s: sending it again"
                        % (self.id, resend_after))
                    send()
                    continue
                heard = True
                if ch == "shell" and m["msg_type"] == "execute_reply":
                    if m["content"].get("status") != "ok":
                        self.silent_why = "%s: %s" % (m["content"].get("ename"),
                                                      m["content"].get("evalue"))
                        log("%s: own code failed: %s" % (self.id, self.silent_why))
                    return m["content"].get("status") == "ok"
        finally:
            for mid in sent:
                self.waiters.pop(mid, None)

    async def diagnose(self):
        """What a kernel that stopped answering is doing, for the failure's message: each
        thread's state and wait channel, then its Python stacks (SIGABRT; faulthandler
        writes them to the log, which is the kernel's stderr). Ends the kernel."""
        # A message waiting unread in kerneld's own socket would mean its reader missed
        # the wake-up, not that the kernel lost the request.
        try:
            import zmq
            unread = " ".join("%s:%s" % (c, bool(sk.getsockopt(zmq.EVENTS) & zmq.POLLIN))
                              for c, sk in self.socks.items())
        except Exception as e:
            unread = repr(e)
        pid = self.pid
        threads = []
        try:
            for tid in sorted(os.listdir("/proc/%d/task" % pid), key=int)[:16]:
                with open("/proc/%d/task/%s/stat" % (pid, tid)) as f:
                    state = f.read().rsplit(")", 1)[1].split()[0]
                with open("/proc/%d/task/%s/wchan" % (pid, tid)) as f:
                    threads.append("%s:%s" % (state, f.read().strip() or "-"))
        except (OSError, ValueError, IndexError):
            if not threads:
                return "kernel pid %d is gone" % pid
        try:
            before = os.path.getsize(LOG)
            os.kill(pid, signal.SIGABRT)
            await asyncio.sleep(3)
            with open(LOG, "rb") as f:
                f.seek(before)
                dump = f.read(1 << 16).decode("utf-8", "replace")
        except OSError:
            dump = ""
        # Each thread's stack, innermost first (faulthandler's order): where it waits.
        stack = [l.strip() if l.strip().startswith("File ") else "--" for l in dump.splitlines()
                 if l.strip().startswith(("File ", "Thread ", "Current thread "))]
        return "unread in kerneld: %s; kernel pid %d threads %s; kerneld's readers: %s, " \
            "dropped %s; stacks: %s" % (
            unread, pid, " ".join(threads),
            " ".join("%s:%s" % (c, self.reader_end.get(c, "up" if not r.done() else "done"))
                     for c, r in self.readers.items()),
            self.dropped or "none", " | ".join(stack[:24]) or "none")

    async def rekey(self):
        """A clone: fresh random state, session key and kernel id, before anything runs."""
        new = secrets.token_hex(32).encode()
        msg = self.km.session.msg("execute_request", {
            "code": RESEED.format(key=new), "silent": True, "store_history": False,
            "user_expressions": {}, "allow_stdin": False, "stop_on_error": False})
        q = self.expect(msg)
        self.send("shell", msg)
        # The reply is signed with the new key already: switch before it comes.
        self.km.session.key = new
        self.km.cleanup_connection_file()
        self.km.write_connection_file()
        ok = False
        try:
            while True:
                ch, m = await asyncio.wait_for(q.get(), 30.0)
                if ch == "shell" and m["msg_type"] == "execute_reply":
                    ok = m["content"].get("status") == "ok"
                    break
        except asyncio.TimeoutError:
            pass
        finally:
            self.waiters.pop(msg["header"]["msg_id"], None)
        self.km.kernel_id = str(uuid.uuid4())
        if not ok:
            # Whatever the old kernel holds, it must not serve with the old key.
            log("%s: re-keying failed; restarting the kernel" % self.id)
            await self.restart()

    async def interrupt(self):
        try:
            await self.km.interrupt_kernel()
        except Exception as e:
            log("%s: interrupt: %s" % (self.id, e))

    async def restart(self):
        for c in list(self.clients):
            c.push("iopub", self.km.session.msg("status", {"execution_state": "restarting"}))
        await self.km.restart_kernel(now=True)
        self.pid = self.km.provisioner.pid if self.km.provisioner else 0
        self.started_boot_id = read_boot_id()
        await self.wait_ready()

    async def close(self):
        if self.monitor:
            self.monitor.cancel()
        for t in self.readers.values():
            t.cancel()
        for s in self.socks.values():
            s.close(0)
        try:
            await self.km.shutdown_kernel(now=True)
        except Exception as e:
            log("%s: shutdown: %s" % (self.id, e))

    async def run(self, code, env, timeout_ms, out):
        if env:
            setup = "import os as _w_os\n_w_saved = {k: _w_os.environ.get(k) for k in %r}\n" \
                    "_w_os.environ.update(%r)\n" % (list(env), env)
            if not await self.silent(setup):
                await out.line({"type": "error", "name": "EnvError",
                                "value": "could not set env", "traceback": ""})
                await out.line({"type": "end_of_execution"}, always=True)
                return
        try:
            await self.run_code(code, timeout_ms, out)
        finally:
            if env:
                await self.silent(
                    "for _w_k, _w_v in _w_saved.items():\n"
                    "    if _w_v is None: _w_os.environ.pop(_w_k, None)\n"
                    "    else: _w_os.environ[_w_k] = _w_v\n"
                    "del _w_saved, _w_k, _w_v, _w_os\n")

    async def run_code(self, code, timeout_ms, out):
        loop = asyncio.get_running_loop()
        msg = self.km.session.msg("execute_request", {
            "code": code, "silent": False, "store_history": True, "user_expressions": {},
            "allow_stdin": False, "stop_on_error": True})
        q = self.expect(msg)
        self.send("shell", msg)
        deadline = loop.time() + timeout_ms / 1000.0 if timeout_ms else None
        errored = False
        interrupted = None  # why the run was interrupted: "timeout", "closed"
        grace_end = None
        lost = self.iopub_lost
        reply_at = None  # when execute_reply came: idle follows unless iopub lost it
        dropped = False
        try:
            while True:
                wait = 0.25
                if deadline is not None and interrupted is None:
                    wait = max(0.0, min(wait, deadline - loop.time()))
                try:
                    ch, m = await asyncio.wait_for(q.get(), wait)
                except asyncio.TimeoutError:
                    ch = m = None
                if self.iopub_lost != lost:
                    lost = self.iopub_lost
                    await out.line({"type": "error", "name": "OutputTooLarge",
                                    "value": "a message of the kernel exceeded %d bytes and "
                                    "was dropped" % MAX_MSG, "traceback": ""})
                    errored = dropped = True
                if m is None:
                    if dropped and reply_at is not None and loop.time() - reply_at > 1.0:
                        break  # its idle may have been dropped with the connection
                    if interrupted is None and deadline is not None and loop.time() >= deadline:
                        interrupted = "timeout"
                        await out.line({"type": "error", "name": "TimeoutError",
                                        "value": "the run exceeded %d ms: interrupted"
                                        % timeout_ms, "traceback": ""})
                        errored = True
                        await self.interrupt()
                        grace_end = loop.time() + INTERRUPT_GRACE
                    elif interrupted is None and out.hung_up():
                        interrupted = "closed"
                        await self.interrupt()
                        grace_end = loop.time() + INTERRUPT_GRACE
                    elif grace_end is not None and loop.time() >= grace_end:
                        # Deaf to SIGINT (stuck in C code): the context keeps only its id.
                        log("%s: no idle after an interrupt; restarting" % self.id)
                        await self.restart()
                        if interrupted != "closed":
                            await out.line({"type": "error", "name": "ContextRestarting",
                                            "value": "the kernel did not stop; restarted",
                                            "traceback": ""})
                        break
                    elif not await self.km.is_alive():
                        if not errored:
                            await out.line({"type": "error", "name": "ContextRestarting",
                                            "value": "the kernel died; it was restarted",
                                            "traceback": ""})
                        errored = True
                        await self.restart()
                        break
                    continue
                if interrupted:  # after a timeout or a hang-up: wait for idle, say nothing more
                    if ch == "iopub" and m["msg_type"] == "status" and \
                            m["content"].get("execution_state") == "idle":
                        break
                    continue
                t = m["msg_type"]
                c = m["content"]
                if ch == "shell" and t == "execute_reply":
                    reply_at = loop.time()
                if ch == "shell":
                    if t == "execute_reply" and c.get("status") == "aborted" and not errored:
                        errored = True
                        await out.line({"type": "error", "name": "ExecutionAborted",
                                        "value": "the execution was aborted", "traceback": ""})
                    continue
                if ch != "iopub":
                    continue
                if t == "execute_input":
                    await out.line({"type": "number_of_executions",
                                    "execution_count": c.get("execution_count")})
                elif t == "stream":
                    name = "stderr" if c.get("name") == "stderr" else "stdout"
                    await out.line({"type": name, "text": c.get("text", ""),
                                    "timestamp": json_default(m["header"].get("date"))
                                    if m["header"].get("date") else now_iso()})
                elif t in ("execute_result", "display_data"):
                    await out.line(result_line(c.get("data") or {}, t == "execute_result"))
                elif t == "error":
                    if not errored:
                        errored = True
                        await out.line({"type": "error", "name": c.get("ename", ""),
                                        "value": c.get("evalue", ""),
                                        "traceback": "\n".join(c.get("traceback") or [])})
                elif t == "status" and c.get("execution_state") == "restarting":
                    if not errored:
                        await out.line({"type": "error", "name": "ContextRestarting",
                                        "value": "the kernel is restarting", "traceback": ""})
                    break
                elif t == "status" and c.get("execution_state") == "idle":
                    break
        finally:
            self.waiters.pop(msg["header"]["msg_id"], None)
        await out.line({"type": "end_of_execution"}, always=True)


MIME = (("text/plain", "text"), ("text/html", "html"), ("text/markdown", "markdown"),
        ("image/svg+xml", "svg"), ("image/png", "png"), ("image/jpeg", "jpeg"),
        ("application/pdf", "pdf"), ("text/latex", "latex"), ("application/json", "json"),
        ("application/javascript", "javascript"), ("e2b/data", "data"),
        ("e2b/chart", "chart"))


def result_line(data, main):
    r = {"type": "result", "is_main_result": main}
    extra = {}
    names = dict(MIME)
    for k, v in data.items():
        if k in names:
            if k == "text/plain" and isinstance(v, str) and len(v) >= 2 and \
                    v[0] == v[-1] and v[0] in "'\"":
                v = v[1:-1]
            r[names[k]] = v
        else:
            extra[k] = v
    if extra:
        r["extra"] = extra
    return r


# ---- bash contexts ---------------------------------------------------------------


class BashContext:
    language = "bash"

    def __init__(self, d, cid, cwd, env, default):
        self.d = d
        self.id = cid
        self.cwd = cwd
        self.env = env
        self.default = default
        self.lock = asyncio.Lock()
        self.proc = None
        self.started_boot_id = ""
        self.seq = 0

    def obj(self):
        return {"id": self.id, "language": self.language, "cwd": self.cwd,
                "default": self.default, "pid": self.proc.pid if self.proc else 0,
                "started_boot_id": self.started_boot_id}

    async def start(self):
        env = dict(os.environ)
        env.update(self.env)
        env.setdefault("HOME", HOME)
        env.pop("WARREN_EXEC_ID", None)
        # Its own session and group: an interrupt reaches the shell's children, and
        # SIGINT is trapped so the shell itself (and its cd and variables) stays.
        self.proc = await asyncio.create_subprocess_exec(
            "/bin/bash", "--noprofile", "--norc", cwd=self.cwd, env=env,
            stdin=asyncio.subprocess.PIPE, stdout=asyncio.subprocess.PIPE,
            stderr=asyncio.subprocess.PIPE, start_new_session=True, limit=1 << 16)
        self.proc.stdin.write(b"trap : INT\n")
        self.started_boot_id = read_boot_id()

    async def rekey(self):
        pass  # a shell has no key; $RANDOM reseeds itself from the clock per use

    async def interrupt(self):
        if self.proc and self.proc.returncode is None:
            try:
                os.killpg(self.proc.pid, signal.SIGINT)
            except OSError:
                pass

    async def restart(self):
        await self.close()
        await self.start()

    async def close(self):
        if self.proc and self.proc.returncode is None:
            try:
                os.killpg(self.proc.pid, signal.SIGKILL)
            except OSError:
                pass
            await self.proc.wait()

    async def run(self, code, env, timeout_ms, out):
        loop = asyncio.get_running_loop()
        if self.proc is None or self.proc.returncode is not None:
            await self.start()
        self.seq += 1
        token = "__warren_end_%s_%d__" % (secrets.token_hex(8), self.seq)
        path = os.path.join(RUNTIME, "bash-%s.sh" % self.id)
        with open(path, "w") as f:
            f.write(code)
            f.write("\n")
        pre, post = "", ""
        for k, v in env.items():
            pre += 'if [ "${%s+x}" = x ]; then __w_s_%s=$%s; __w_h_%s=1; else __w_h_%s=0; fi; ' \
                   "export %s=%s\n" % (k, k, k, k, k, k, shlex.quote(v))
            post += 'if [ "$__w_h_%s" = 1 ]; then export %s="$__w_s_%s"; else unset %s; fi; ' \
                    "unset __w_s_%s __w_h_%s\n" % (k, k, k, k, k, k)
        script = "%s. %s </dev/null\n__w_rc=$?\n%sprintf '%%s%%d\\n' %s \"$__w_rc\"\n" \
                 "printf '%%s\\n' %s >&2\n" % (pre, shlex.quote(path), post, token, token)
        self.proc.stdin.write(script.encode())
        await self.proc.stdin.drain()
        state = {"rc": None}
        tok = token.encode()

        async def pump(stream, name):
            held = b""
            while True:
                chunk = await stream.read(1 << 16)
                if not chunk:
                    return False
                held += chunk
                i = held.find(tok)
                if i >= 0:
                    if i:
                        await emit(name, held[:i])
                    if name == "stdout":
                        rest = held[i + len(tok):]
                        while b"\n" not in rest:
                            more = await stream.read(64)
                            if not more:
                                break
                            rest += more
                        try:
                            state["rc"] = int(rest.split(b"\n", 1)[0])
                        except ValueError:
                            state["rc"] = -1
                    return True
                # Keep what may be the start of the token for the next chunk.
                keep = 0
                for n in range(min(len(tok) - 1, len(held)), 0, -1):
                    if tok.startswith(held[-n:]):
                        keep = n
                        break
                if len(held) > keep:
                    await emit(name, held[:len(held) - keep])
                    held = held[len(held) - keep:]

        async def emit(name, data):
            await out.line({"type": name, "text": data.decode("utf-8", "replace"),
                            "timestamp": now_iso()})

        tasks = [asyncio.ensure_future(pump(self.proc.stdout, "stdout")),
                 asyncio.ensure_future(pump(self.proc.stderr, "stderr"))]
        deadline = loop.time() + timeout_ms / 1000.0 if timeout_ms else None
        timed_out = closed = False
        grace_end = None
        while not all(t.done() for t in tasks):
            await asyncio.wait(tasks, timeout=0.25)
            if all(t.done() for t in tasks):
                break
            if grace_end is None and deadline is not None and loop.time() >= deadline:
                timed_out = True
                await self.interrupt()
                grace_end = loop.time() + INTERRUPT_GRACE
            elif grace_end is None and out.hung_up():
                closed = True
                await self.interrupt()
                grace_end = loop.time() + INTERRUPT_GRACE
            elif grace_end is not None and loop.time() >= grace_end:
                break
        ended = all(t.done() and not t.cancelled() and t.result() for t in tasks)
        for t in tasks:
            t.cancel()
        if not ended:
            # The shell is lost (it died or ignored the interrupt): a new one, same context.
            await self.restart()
        if timed_out:
            await out.line({"type": "error", "name": "TimeoutError",
                            "value": "the run exceeded %d ms: interrupted" % timeout_ms,
                            "traceback": ""})
        elif not ended and not closed:
            await out.line({"type": "error", "name": "ContextRestarting",
                            "value": "the shell exited; a new one was started", "traceback": ""})
        elif state["rc"]:
            await out.line({"type": "error", "name": "ExitError", "value": str(state["rc"]),
                            "traceback": ""})
        await out.line({"type": "end_of_execution"}, always=True)


# ---- the daemon ------------------------------------------------------------------


class ChannelsClient:
    def __init__(self, ctx):
        self.ctx = ctx
        self.q = asyncio.Queue(MAX_CLIENT_QUEUE)
        self.dropped = False

    def push(self, ch, msg):
        if self.dropped:
            return
        try:
            self.q.put_nowait((ch, msg))
        except asyncio.QueueFull:
            self.dropped = True  # too slow a reader: it is closed and may reconnect
            self.q = asyncio.Queue(1)
            self.q.put_nowait(None)


class Daemon:
    def __init__(self):
        self.contexts = {}
        self.boot_id = read_boot_id()
        self.rekeying = None

    async def new_context(self, language, cwd=None, env=None, default=False):
        if len(self.contexts) >= MAX_CONTEXTS:
            raise Fail("busy", "at most %d contexts" % MAX_CONTEXTS)
        if language not in ("python", "bash"):
            raise Fail("bad_request", "language must be python or bash")
        cwd = cwd or HOME
        if not isinstance(cwd, str) or not os.path.isdir(cwd):
            raise Fail("bad_request", "cwd %r is not a directory" % (cwd,))
        env = check_env(env)
        cid = str(uuid.uuid4())
        cls = PyContext if language == "python" else BashContext
        ctx = cls(self, cid, cwd, env, default)
        self.contexts[cid] = ctx
        try:
            await ctx.start()
        except Fail:
            self.contexts.pop(cid, None)
            await ctx.close()
            raise
        except Exception as e:
            self.contexts.pop(cid, None)
            await ctx.close()
            raise Fail("internal", "cannot start a %s context: %s" % (language, e))
        return ctx

    def default_of(self, language):
        for c in self.contexts.values():
            if c.default and c.language == language:
                return c
        return None

    async def check_clone(self):
        """A changed boot id: this VM is a clone. Nothing is served before re-keying."""
        b = read_boot_id()
        if b == self.boot_id:
            return
        if self.rekeying is None:
            self.rekeying = asyncio.ensure_future(self.rekey_all(b))
        await asyncio.shield(self.rekeying)

    async def rekey_all(self, b):
        log("boot id changed (%s -> %s): re-seeding and re-keying" % (self.boot_id, b))
        for ctx in list(self.contexts.values()):
            try:
                await asyncio.wait_for(ctx.lock.acquire(), 2.0)
                locked = True
            except asyncio.TimeoutError:
                locked = False  # a run in flight: the kernel queues the re-key behind it
            try:
                await ctx.rekey()
            except Exception as e:
                log("%s: re-key: %s" % (ctx.id, e))
            finally:
                if locked:
                    ctx.lock.release()
        self.boot_id = b
        self.rekeying = None

    def context(self, cid):
        if not isinstance(cid, str) or cid not in self.contexts:
            raise Fail("not_found", "context %s not found" % (cid,))
        return self.contexts[cid]

    async def serve(self, reader, writer):
        out = Out(writer)
        try:
            try:
                line = await reader.readline()
            except (asyncio.LimitOverrunError, ValueError):
                raise Fail("bad_request", "a request line is at most %d bytes" % MAX_REQUEST)
            if not line.endswith(b"\n"):
                raise Fail("bad_request", "a request is one JSON object and a newline")
            try:
                req = json.loads(line)
            except ValueError as e:
                raise Fail("bad_request", "not JSON: %s" % e)
            if not isinstance(req, dict) or not isinstance(req.get("op"), str):
                raise Fail("bad_request", "a request is an object with an op")
            await self.check_clone()
            op = req["op"]
            if op == "run":
                await self.op_run(req, out)
            elif op == "channels":
                await self.op_channels(req, reader, out)
            elif op == "status":
                await out.line({"ready": True, "contexts": len(self.contexts),
                                "boot_id": self.boot_id})
            elif op == "context_create":
                ctx = await self.new_context(req.get("language", "python"), req.get("cwd"),
                                             req.get("env"))
                await out.line(ctx.obj())
            elif op == "context_list":
                await out.line({"contexts": [c.obj() for c in self.contexts.values()]})
            elif op == "context_get":
                await out.line(self.context(req.get("id")).obj())
            elif op == "context_delete":
                ctx = self.context(req.get("id"))
                del self.contexts[ctx.id]
                await ctx.close()
                await out.line({})
            elif op == "context_restart":
                ctx = self.context(req.get("id"))
                await ctx.restart()
                await out.line({})
            elif op == "context_interrupt":
                await self.context(req.get("id")).interrupt()
                await out.line({})
            else:
                raise Fail("bad_request", "unknown op %r" % op[:64])
        except Fail as f:
            await out.line({"type": "fail", "code": f.code, "message": f.message}, always=True)
        except Exception as e:
            log("request failed: %r" % e)
            await out.line({"type": "fail", "code": "internal", "message": str(e)[:1000]},
                           always=True)
        finally:
            try:
                writer.close()
            except Exception:
                pass

    async def op_run(self, req, out):
        code = req.get("code")
        if not isinstance(code, str):
            raise Fail("bad_request", "code must be a string")
        cid, lang = req.get("context_id"), req.get("language")
        if cid is not None and lang is not None:
            raise Fail("bad_request", "context_id and language exclude each other")
        env = check_env(req.get("env"))
        tmo = req.get("timeout_ms", 0)
        if not isinstance(tmo, int) or isinstance(tmo, bool) or tmo < 0:
            raise Fail("bad_request", "timeout_ms must be a non-negative integer")
        ml = req.get("max_line", MAX_LINE_DEFAULT)
        if not isinstance(ml, int) or isinstance(ml, bool) or not MAX_LINE_MIN <= ml <= 1 << 30:
            raise Fail("bad_request", "max_line must be an integer from %d to %d"
                       % (MAX_LINE_MIN, 1 << 30))
        mo = req.get("max_output", MAX_OUTPUT_DEFAULT)
        if not isinstance(mo, int) or isinstance(mo, bool) or mo < MAX_LINE_MIN:
            raise Fail("bad_request", "max_output must be an integer of at least %d"
                       % MAX_LINE_MIN)
        out.max_line, out.max_output = ml, mo
        if cid is not None:
            ctx = self.context(cid)
        else:
            lang = lang or "python"
            if lang not in ("python", "bash"):
                raise Fail("bad_request", "language must be python or bash")
            ctx = self.default_of(lang)
            if ctx is None:
                ctx = await self.new_context(lang, default=True)
        async with ctx.lock:
            if self.contexts.get(ctx.id) is not ctx:
                raise Fail("not_found", "context %s was deleted" % ctx.id)
            await ctx.run(code, env, tmo, out)

    async def op_channels(self, req, reader, out):
        cid = req.get("context_id")
        if cid is None:
            ctx = self.default_of("python")
            if ctx is None:
                ctx = await self.new_context("python", default=True)
        else:
            ctx = self.context(cid)
        if ctx.language != "python":
            raise Fail("bad_request", "channels need a python context")
        client = ChannelsClient(ctx)
        ctx.clients.add(client)
        out.max_output = 1 << 62

        async def writer_task():
            while True:
                item = await client.q.get()
                if item is None or client.ctx.d.contexts.get(ctx.id) is not ctx:
                    return
                ch, m = item
                await out.line({"header": m["header"], "parent_header": m["parent_header"],
                                "metadata": m["metadata"], "content": m["content"],
                                "buffers": [base64.b64encode(bytes(b)).decode()
                                            for b in m.get("buffers") or []],
                                "channel": ch, "msg_id": m["header"].get("msg_id"),
                                "msg_type": m["header"].get("msg_type")}, always=True)
                if out.closed:
                    return

        wt = asyncio.ensure_future(writer_task())
        try:
            while not wt.done():
                rd = asyncio.ensure_future(reader.readline())
                done, _ = await asyncio.wait({rd, wt}, return_when=asyncio.FIRST_COMPLETED)
                if rd not in done:
                    rd.cancel()
                    break
                try:
                    line = rd.result()
                except (asyncio.LimitOverrunError, ValueError):
                    await out.line({"type": "fail", "code": "bad_request",
                                    "message": "a message is at most %d bytes" % MAX_REQUEST},
                                   always=True)
                    break  # the stream cannot be resynchronised after an overlong line
                if not line:
                    # Half-closed: the client sends no more, but still reads its answers.
                    await wt
                    break
                err = self.relay(ctx, client, line)
                if err:
                    await out.line({"type": "fail", "code": "bad_request", "message": err},
                                   always=True)
        finally:
            ctx.clients.discard(client)
            for k in [k for k, v in ctx.owners.items() if v is client]:
                del ctx.owners[k]
            wt.cancel()

    def relay(self, ctx, client, line):
        try:
            m = json.loads(line)
        except ValueError:
            return "not JSON"
        if not isinstance(m, dict):
            return "a message is an object"
        ch = m.get("channel") or "shell"
        if ch not in ("shell", "control", "stdin"):
            return "channel must be shell, control or stdin"
        h = m.get("header")
        if not isinstance(h, dict) or not isinstance(h.get("msg_id"), str) or \
                not isinstance(h.get("msg_type"), str):
            return "a message needs a header with msg_id and msg_type"
        for k in ("parent_header", "metadata", "content"):
            if not isinstance(m.get(k, {}), dict):
                return "%s must be an object" % k
        msg = {"header": h, "parent_header": m.get("parent_header") or {},
               "metadata": m.get("metadata") or {}, "content": m.get("content") or {}}
        if ch != "stdin":
            if len(ctx.owners) >= 4096:
                ctx.owners.pop(next(iter(ctx.owners)))  # unanswered requests do not pile up
            ctx.owners[h["msg_id"]] = client
        try:
            ctx.send(ch, msg)
        except Exception as e:
            return "cannot send: %s" % e
        return None


async def daemon_main(ready_fd):
    os.makedirs(RUNTIME, mode=0o700, exist_ok=True)
    os.chmod(os.path.dirname(SOCK), 0o755)
    d = Daemon()
    try:
        ctx = await d.new_context("python", default=True)
        if not await ctx.silent(WARM_IMPORTS, timeout=START_TIMEOUT, resend_after=30.0):
            why = ctx.silent_why
            if why.startswith("no reply"):
                why += " (%s)" % await ctx.diagnose()
            raise Fail("internal", "importing numpy, pandas and matplotlib: %s" % why)
        try:
            os.unlink(SOCK)
        except FileNotFoundError:
            pass
        old = os.umask(0o177)
        server = await asyncio.start_unix_server(d.serve, SOCK, limit=MAX_REQUEST)
        os.umask(old)
        os.chmod(SOCK, 0o600)
    except Exception as e:
        msg = e.message if isinstance(e, Fail) else repr(e)
        log("not ready: %s" % msg)
        if ready_fd >= 0:
            os.write(ready_fd, ("fail " + msg).encode()[:4000])
            os.close(ready_fd)
        os._exit(1)
    log("ready: %s, python context %s" % (SOCK, ctx.id))
    if ready_fd >= 0:
        os.write(ready_fd, b"ok")
        os.close(ready_fd)
    async with server:
        await server.serve_forever()


def warm():
    """Start the daemon detached; 0 once it is ready, else 1 with its reason."""
    os.makedirs(os.path.dirname(SOCK), mode=0o755, exist_ok=True)
    s = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    try:
        s.connect(SOCK)
        s.close()
        return 0  # already serving (a second warm)
    except OSError:
        s.close()
    r, w = os.pipe()
    pid = os.fork()
    if pid == 0:
        os.close(r)
        os.setsid()
        if os.fork() > 0:
            os._exit(0)
        fd = os.open("/dev/null", os.O_RDWR)
        os.dup2(fd, 0)
        lf = os.open(LOG, os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o600)
        os.dup2(lf, 1)
        os.dup2(lf, 2)
        for x in (fd, lf):
            if x > 2:
                os.close(x)
        try:
            asyncio.run(daemon_main(w))
        finally:
            os._exit(1)
    os.close(w)
    os.waitpid(pid, 0)
    got = b""
    while True:
        b = os.read(r, 4096)
        if not b:
            break
        got += b
    if got == b"ok":
        return 0
    sys.stderr.write("kerneld: %s\n" % (got.decode(errors="replace")[5:] or
                                        "the daemon exited before it was ready (see %s)" % LOG))
    return 1


def main():
    if sys.argv[1:] == ["--warm"]:
        sys.exit(warm())
    if sys.argv[1:] == ["--foreground"]:
        asyncio.run(daemon_main(-1))
        return
    sys.stderr.write("usage: kerneld.py --warm | --foreground\n")
    sys.exit(2)


if __name__ == "__main__":
    main()
