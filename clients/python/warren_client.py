"""warren_client: a Python client for Warren's REST API (docs/API.md).

Standard library only (http.client, json), Python 3.8 or later:

    from warren_client import Warren
    w = Warren("http://127.0.0.1:8080", api_key)        # or WARREN_URL / WARREN_API_KEY
    sb = w.create(template="base", ttl_seconds=600)
    r = sb.run("echo hi; echo oops >&2; exit 3")
    r.stdout, r.stderr, r.exit_code                       # 'hi\\n', 'oops\\n', 3
    sb.run("make test", on_stdout=print)                  # streamed as it comes
    sb.files.write("/root/a.txt", b"data")
    sb.files.read("/root/a.txt")                          # b'data'
    p = sb.start("python3 -m http.server 8000")           # a background process
    for chunk in sb.output(p.pid, follow=True): ...
    sb.pause(); sb.resume(); kids = sb.fork(2); snap = sb.snapshot()
    w.create(snapshot_id=snap["id"]); sb.kill()

Every error the server answers raises WarrenError with its HTTP status, its
stable code (docs/API.md, "Errors") and message. One HTTP connection per
call, so a Warren object may be shared between threads.
"""
import base64
import http.client
import json
import os
import urllib.parse

__all__ = ["Warren", "Sandbox", "Files", "Result", "Process", "WarrenError"]

CHUNK = 1 << 20  # upload and download pieces


class WarrenError(Exception):
    """An error answer: .status (HTTP), .code (stable name), .message."""

    def __init__(self, status, code, message):
        super().__init__(f"{status} {code}: {message}")
        self.status = status
        self.code = code
        self.message = message


class Result:
    """A finished exec: stdout and stderr (str, or bytes when not UTF-8), exit_code,
    signal (or None), timed_out, duration_ms, truncated."""

    def __init__(self, j):
        self.exit_code = j.get("exit_code")
        self.signal = j.get("signal")
        self.timed_out = j.get("timed_out", False)
        self.duration_ms = j.get("duration_ms")
        self.truncated = j.get("truncated", False)
        self.stdout = _text(j, "stdout")
        self.stderr = _text(j, "stderr")

    def __repr__(self):
        return f"Result(exit_code={self.exit_code}, stdout={self.stdout!r}, stderr={self.stderr!r})"


class Process:
    """A background process or PTY that belongs to the sandbox: .pid, .tag."""

    def __init__(self, sandbox, j):
        self.sandbox = sandbox
        self.pid = j["pid"]
        self.tag = j.get("tag")

    def info(self):
        return self.sandbox.process(self.pid)

    def stdin(self, data=None, eof=False):
        self.sandbox.stdin(self.pid, data, eof)

    def signal(self, sig="SIGTERM"):
        self.sandbox.signal(self.pid, sig)

    def output(self, offset=0, follow=False):
        return self.sandbox.output(self.pid, offset, follow)


def _text(j, name):
    if name in j:
        return j[name]
    if name + "_b64" in j:
        return base64.b64decode(j[name + "_b64"])
    return ""


def _chunk_data(j):
    """A streamed line's bytes (data, or data_b64 when not UTF-8)."""
    if "data_b64" in j:
        return base64.b64decode(j["data_b64"])
    return j.get("data", "").encode()


class Warren:
    """A Warren server. url defaults to $WARREN_URL (else http://127.0.0.1:8080), the
    key to $WARREN_API_KEY. timeout is the socket timeout of each call, in seconds."""

    def __init__(self, url=None, api_key=None, timeout=600):
        url = url or os.environ.get("WARREN_URL") or "http://127.0.0.1:8080"
        u = urllib.parse.urlsplit(url)
        if u.scheme not in ("http", "https") or not u.hostname:
            raise ValueError(f"not an http(s) URL: {url!r}")
        self.url = url.rstrip("/")
        self._https = u.scheme == "https"
        self._host = u.hostname
        self._port = u.port or (443 if self._https else 80)
        self.api_key = api_key if api_key is not None else os.environ.get("WARREN_API_KEY")
        self.timeout = timeout

    # -- transport --
    def _conn(self):
        cls = http.client.HTTPSConnection if self._https else http.client.HTTPConnection
        return cls(self._host, self._port, timeout=self.timeout)

    def _open(self, method, path, query=None, body=None, headers=None):
        """Send one request; the connection and its response (status not checked)."""
        q = {k: v for k, v in (query or {}).items() if v is not None}
        if q:
            path += "?" + urllib.parse.urlencode(q, quote_via=urllib.parse.quote)
        h = {}
        if self.api_key:
            h["Authorization"] = f"Bearer {self.api_key}"
        if isinstance(body, (dict, list)):
            body = json.dumps(body).encode()
            h["Content-Type"] = "application/json"
        h.update(headers or {})
        c = self._conn()
        try:
            c.request(method, path, body=body, headers=h)
            return c, c.getresponse()
        except BaseException:
            c.close()
            raise

    @staticmethod
    def _raise(r):
        raw = r.read()
        try:
            e = json.loads(raw)["error"]
            raise WarrenError(r.status, e.get("code", "unknown"), e.get("message", ""))
        except (ValueError, KeyError, TypeError):
            raise WarrenError(r.status, "unknown", raw[:200].decode("utf-8", "replace"))

    def request(self, method, path, body=None, query=None, headers=None):
        """One call answered with JSON (or nothing): the decoded body."""
        c, r = self._open(method, path, query, body, headers)
        try:
            if r.status >= 400:
                self._raise(r)
            raw = r.read()
            return json.loads(raw) if raw else None
        finally:
            c.close()

    def _stream(self, method, path, body=None, query=None):
        """The lines of an NDJSON answer, decoded, as they come."""
        c, r = self._open(method, path, query, body, {"Accept": "application/x-ndjson"})
        try:
            if r.status >= 400:
                self._raise(r)
            while True:
                line = r.readline()
                if not line:
                    return
                j = json.loads(line)
                if j.get("type") == "error":
                    e = j.get("error", {})
                    raise WarrenError(j.get("status", 500), e.get("code", "unknown"),
                                      e.get("message", ""))
                yield j
        finally:
            c.close()

    # -- sandboxes --
    def create(self, template=None, snapshot_id=None, **fields):
        """A new sandbox (fields as in docs/API.md: ttl_seconds, idle_timeout_seconds,
        memory_mb, vcpus, env, metadata, keep_running, persistent, network,
        public_ports). Returns once it answers commands."""
        body = dict(fields)
        if template is not None:
            body["template"] = template
        if snapshot_id is not None:
            body["snapshot_id"] = snapshot_id
        return Sandbox(self, self.request("POST", "/v1/sandboxes", body))

    def sandbox(self, sandbox_id):
        """An existing sandbox, by id."""
        return Sandbox(self, self.request("GET", f"/v1/sandboxes/{_q(sandbox_id)}"))

    def list(self, state=None, metadata=None):
        """Sandbox records; state ("running", "paused", ...) and metadata ({k: v})
        filter them."""
        q = {"state": state}
        for k, v in (metadata or {}).items():
            q[f"metadata.{k}"] = v
        return self.request("GET", "/v1/sandboxes", query=q)["sandboxes"]

    # -- snapshots --
    def snapshots(self):
        return self.request("GET", "/v1/snapshots")["snapshots"]

    def delete_snapshot(self, snapshot_id):
        return self.request("DELETE", f"/v1/snapshots/{_q(snapshot_id)}")

    def templates(self):
        """The templates (images) a create may name, each with its warm pools."""
        return self.request("GET", "/v1/templates")["templates"]

    def health(self):
        return self.request("GET", "/healthz")


def _q(s):
    return urllib.parse.quote(str(s), safe="")


class Files:
    """A sandbox's files (absolute paths inside it)."""

    def __init__(self, sandbox):
        self._sb = sandbox

    def _path(self, sub=""):
        return f"/v1/sandboxes/{_q(self._sb.id)}/files{sub}"

    def write(self, path, data, mode=None):
        """data: bytes, str, or a binary file object (streamed). Parent directories are
        made. Returns {"path", "size"}."""
        if isinstance(data, str):
            data = data.encode()
        q = {"path": path, "mode": None if mode is None else f"{mode:04o}"}
        if isinstance(data, (bytes, bytearray, memoryview)):
            return self._sb._w.request("PUT", self._path(), data, q)
        # A file object: sent in chunks (http.client frames an iterable body with
        # Transfer-Encoding: chunked), so no length is needed up front.
        return self._sb._w.request("PUT", self._path(), _chunks(data), q)

    def read(self, path, into=None):
        """The file's bytes; or, with into (a binary file object), written there and
        the byte count returned."""
        c, r = self._sb._w._open("GET", self._path(), {"path": path})
        try:
            if r.status >= 400:
                Warren._raise(r)
            want = int(r.getheader("Content-Length", "-1"))
            got, parts = 0, []
            while True:
                b = r.read(CHUNK)
                if not b:
                    break
                got += len(b)
                if into is not None:
                    into.write(b)
                else:
                    parts.append(b)
            if want >= 0 and got != want:
                raise WarrenError(502, "short_read",
                                  f"{path}: {got} of {want} bytes arrived (the sandbox ended?)")
            return got if into is not None else b"".join(parts)
        finally:
            c.close()

    def stat(self, path):
        return self._sb._w.request("GET", self._path("/stat"), query={"path": path})

    def list(self, path, depth=1):
        return self._sb._w.request("GET", self._path("/list"),
                                   query={"path": path, "depth": depth})["entries"]

    def mkdir(self, path):
        return self._sb._w.request("POST", self._path("/mkdir"), query={"path": path})

    def remove(self, path, recursive=False):
        return self._sb._w.request("DELETE", self._path(),
                                   query={"path": path, "recursive": "true" if recursive else None})

    def rename(self, src, dst):
        return self._sb._w.request("POST", self._path("/rename"), {"from": src, "to": dst})


def _chunks(f):
    while True:
        b = f.read(CHUNK)
        if not b:
            return
        yield b


class Sandbox:
    """One sandbox: .id, .record (its JSON record when last fetched), .files."""

    def __init__(self, w, record):
        self._w = w
        self.record = record
        self.id = record["id"]
        self.files = Files(self)

    def __repr__(self):
        return f"Sandbox({self.id!r}, state={self.record.get('state')!r})"

    def _p(self, sub=""):
        return f"/v1/sandboxes/{_q(self.id)}{sub}"

    def refresh(self):
        self.record = self._w.request("GET", self._p())
        return self.record

    # -- exec --
    def run(self, cmd, on_stdout=None, on_stderr=None, **fields):
        """Run cmd (a str for /bin/sh -c, or an argv list) to its end: a Result.
        fields: cwd, env, user, stdin, timeout_seconds. With on_stdout/on_stderr the
        output streams to them (str, or bytes when not UTF-8) as it comes, without
        the server's size limit, and Result.stdout/stderr hold what was received."""
        body = dict(fields)
        body["cmd" if isinstance(cmd, str) else "argv"] = cmd
        if not on_stdout and not on_stderr:
            return Result(self._w.request("POST", self._p("/exec"), body))
        got = {"stdout": bytearray(), "stderr": bytearray()}
        for j in self._w._stream("POST", self._p("/exec"), body):
            t = j.get("type")
            if t in got:
                b = _chunk_data(j)
                if j.get("offset") != len(got[t]):
                    raise WarrenError(502, "bad_stream",
                                      f"{t} chunk at {j.get('offset')}, expected {len(got[t])}")
                got[t] += b
                cb = on_stdout if t == "stdout" else on_stderr
                if cb:
                    cb(j["data"] if "data" in j else b)
            elif t == "exit":
                res = Result(j)
                for k in got:
                    try:
                        setattr(res, k, got[k].decode())
                    except UnicodeDecodeError:
                        setattr(res, k, bytes(got[k]))
                return res
        raise WarrenError(502, "bad_stream", "the stream ended without an exit line")

    def start(self, cmd=None, tag=None, pty=None, **fields):
        """Start a background process (or, with pty={"cols":C,"rows":R}, a PTY) that
        belongs to the sandbox: a Process."""
        body = dict(fields)
        if cmd is not None:
            body["cmd" if isinstance(cmd, str) else "argv"] = cmd
        if pty is not None:
            body["pty"] = pty
        else:
            body["background"] = True
        if tag is not None:
            body["tag"] = tag
        return Process(self, self._w.request("POST", self._p("/exec"), body))

    def processes(self):
        return self._w.request("GET", self._p("/processes"))["processes"]

    def process(self, pid):
        return self._w.request("GET", self._p(f"/processes/{int(pid)}"))

    def output(self, pid, offset=0, follow=False):
        """A process's output from offset, as NDJSON lines (dicts: stdout/stderr with
        offset and data, lost, exit, end); with follow, until it exits."""
        return self._w._stream("GET", self._p(f"/processes/{int(pid)}/output"),
                               query={"offset": offset, "follow": "true" if follow else None})

    def stdin(self, pid, data=None, eof=False):
        body = {}
        if isinstance(data, str):
            body["data"] = data
        elif data is not None:
            body["data_b64"] = base64.b64encode(data).decode()
        if eof:
            body["eof"] = True
        return self._w.request("POST", self._p(f"/processes/{int(pid)}/stdin"), body)

    def signal(self, pid, sig="SIGTERM"):
        return self._w.request("POST", self._p(f"/processes/{int(pid)}/signal"), {"signal": sig})

    def resize(self, pid, cols, rows):
        return self._w.request("POST", self._p(f"/processes/{int(pid)}/resize"),
                               {"cols": cols, "rows": rows})

    # -- lifecycle --
    def _set(self, record):
        self.record = record
        return self

    def pause(self):
        return self._set(self._w.request("POST", self._p("/pause"), {}))

    def resume(self):
        return self._set(self._w.request("POST", self._p("/resume"), {}))

    def set_timeout(self, ttl_seconds):
        return self._set(self._w.request("POST", self._p("/timeout"),
                                         {"ttl_seconds": ttl_seconds}))

    def snapshot(self, metadata=None):
        """A snapshot of the whole sandbox (memory and disk): its record."""
        return self._w.request("POST", self._p("/snapshot"),
                               {"metadata": metadata} if metadata else {})

    def fork(self, count=1, **fields):
        """count new sandboxes with this one's files, memory and processes."""
        body = dict(fields, count=count)
        out = self._w.request("POST", self._p("/fork"), body)
        return [Sandbox(self._w, r) for r in out["sandboxes"]]

    def token(self, scope=("pty",), ttl_seconds=3600):
        """A token a browser can use for this sandbox only (docs/API.md, "Access")."""
        return self._w.request("POST", self._p("/tokens"),
                               {"scope": list(scope), "ttl_seconds": ttl_seconds})

    def terminal_url(self, ttl_seconds=3600, pid=None):
        """The browser terminal's address, with a token in it: scope "pty" to attach
        to PTY pid only, "pty" and "exec" to open new PTYs (pid None)."""
        scope = ("pty",) if pid is not None else ("pty", "exec")
        t = self.token(scope, ttl_seconds)["token"]
        url = f"{self._w.url}/terminal/{_q(self.id)}?token={_q(t)}"
        return url if pid is None else f"{url}&pid={int(pid)}"

    def kill(self):
        """End the sandbox (its VM and everything in it)."""
        return self._w.request("DELETE", self._p())
