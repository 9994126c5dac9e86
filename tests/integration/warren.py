"""Integration-test harness: runs the real warrend on a free loopback port
with its own state directory and talks to it over HTTP (stdlib only).

Every sandbox is a real QEMU microVM booted from the guest images; nothing
is mocked. The harness kills the daemon and any VM it started when a test
class ends, so a failed test never leaks processes into the next one.
"""
import http.client
import json
import os
import shutil
import signal
import socket
import subprocess
import tempfile
import threading
import time
import unittest

HERE = os.path.dirname(os.path.abspath(__file__))
# Set by scripts/test.sh for the ASan+UBSan run: ASan keeps freed memory in its
# quarantine (256 MiB), so RSS says nothing about warrend's own memory there.
SANITIZED = os.environ.get("WARREN_SANITIZED") == "1"


def image_dir():
    d = os.environ.get("WARREN_IMAGE_DIR")
    if d:
        return d
    cache = os.environ.get("WARREN_CACHE", os.path.expanduser("~/.cache/warren"))
    return os.path.join(cache, "images", "current")


def built(env, rel):
    """A build artifact: $env if set (ctest sets it), else build/<rel> beside the sources."""
    p = os.environ.get(env)
    if p:
        return p
    for cand in ("build", "../build"):
        c = os.path.join(HERE, "..", "..", cand, rel)
        if os.path.exists(c):
            return os.path.abspath(c)
    raise RuntimeError(f"set {env} to the built {rel}")


def warrend_path():
    return built("WARREND", "server/warrend")


def hostile_path():
    """The hostile guest program (tests/hostile), run as root inside sandboxes."""
    return built("HOSTILE", "tests/hostile/hostile")


def free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def flip_ram_byte(path):
    """Change one byte inside the first page with data of a (sparse) RAM file, as a
    damaged disk could, keeping its size; returns what undoes it. Each write also
    moves the file's mtime a second back: warrend remembers checksums by size and
    change times, and a write in the same clock tick as its last look (file times
    tick coarsely) would not move them."""
    mtime = os.stat(path).st_mtime_ns

    def put(byte, back):
        with open(path, "r+b") as f:
            f.seek(off)
            f.write(byte)
        os.utime(path, ns=(mtime, mtime - back * 10**9))

    with open(path, "rb") as f:
        off = os.lseek(f.fileno(), 0, os.SEEK_DATA) + 2049
        f.seek(off)
        orig = f.read(1)
    put(bytes([orig[0] ^ 0x01]), 1)
    return lambda: put(orig, 2)


def qemu_pids(marker):
    """Pids of QEMU processes whose command line contains marker."""
    out = []
    for pid in os.listdir("/proc"):
        if not pid.isdigit():
            continue
        try:
            with open(f"/proc/{pid}/cmdline", "rb") as f:
                cmd = f.read()
        except OSError:
            continue
        if b"qemu-system" in cmd and marker.encode() in cmd:
            out.append(int(pid))
    return out


def wait_no_qemu(marker, timeout=15):
    """The QEMU pids still matching marker after waiting: a killed VM takes a moment to go."""
    deadline = time.time() + timeout
    while qemu_pids(marker) and time.time() < deadline:
        time.sleep(0.05)
    return qemu_pids(marker)


def proc_kib(pid, key, file="status"):
    """The "key: N kB" line of /proc/PID/file, in KiB (0 if absent)."""
    with open(f"/proc/{pid}/{file}") as f:
        for line in f:
            if line.startswith(key + ":"):
                return int(line.split()[1])
    return 0


def rss_kib(pid):
    return proc_kib(pid, "VmRSS")


def swap_kb(pid):
    """VmSwap of a process, in KiB."""
    return proc_kib(pid, "VmSwap")


def pss_kib(pid):
    return proc_kib(pid, "Pss", "smaps_rollup")


def zram_swap_on(size="4G"):
    """Swap on /dev/zram0 (size: what it takes before compression) if the host has
    none. True if made here (to undo with zram_swap_off)."""
    with open("/proc/swaps") as f:
        if len(f.read().splitlines()) > 1:
            return False
    dev = "/sys/block/zram0"
    if not os.path.exists(dev):
        raise unittest.SkipTest("no swap on the host and no /dev/zram0 to make some")
    with open(f"{dev}/disksize") as f:
        if int(f.read()) != 0:
            raise unittest.SkipTest("/dev/zram0 is in use, and the host has no swap")
    with open(f"{dev}/disksize", "w") as f:
        f.write(size)
    subprocess.run(["mkswap", "/dev/zram0"], check=True, capture_output=True)
    subprocess.run(["swapon", "/dev/zram0"], check=True, capture_output=True)
    return True


def zram_swap_off():
    """Undo what zram_swap_on made."""
    subprocess.run(["swapoff", "/dev/zram0"], check=True, capture_output=True)
    with open("/sys/block/zram0/reset", "w") as f:
        f.write("1")


def open_fds(pid):
    return len(os.listdir(f"/proc/{pid}/fd"))


def fnv1a(s):
    """FNV-1a of s, as warrend tags what it makes for one state dir (its jail's
    cgroups, its network namespaces): 8 hex digits."""
    h = 2166136261
    for b in s.encode():
        h = ((h ^ b) * 16777619) & 0xFFFFFFFF
    return f"{h:08x}"


def shm_name(w, vm_id):
    """The name in /dev/shm of the RAM file of w's template VM vm_id (pool.c: the
    state dir's tag first, so a warrend's sweep knows its own)."""
    return f"warren-{fnv1a(w.state_dir)}-{vm_id}.mem"


def shm_files(state_dir):
    """The template RAM files in /dev/shm of the warrend of state_dir."""
    prefix = f"warren-{fnv1a(state_dir)}-"
    return sorted(f for f in os.listdir("/dev/shm") if f.startswith(prefix) and f.endswith(".mem"))


def held(w, gone_vms=()):
    """What w's warrend holds on this machine: its QEMU processes (found by state dir),
    its VM run dirs, the templates' guest RAM files in /dev/shm; and, of the VMs in
    gone_vms (deleted ones), any QEMU, run dir or /dev/shm file still there."""
    vms = os.path.join(w.state_dir, "vms")
    dirs = sorted(os.listdir(vms)) if os.path.isdir(vms) else []
    tpl = os.path.join(w.state_dir, "templates")
    tids = sorted(os.listdir(tpl)) if os.path.isdir(tpl) else []
    shm = set(os.listdir("/dev/shm"))
    leaked = []
    for v in gone_vms:
        if v in dirs or shm_name(w, v) in shm or qemu_pids(v):
            leaked.append(v)
    return {"qemu": len(qemu_pids(w.state_dir)), "run_dirs": len(dirs),
            "template_mem": sum(shm_name(w, t) in shm for t in tids), "templates": len(tids),
            "leaked": leaked, "fds": open_fds(w.proc.pid) if w.proc else 0}


def counter_value(w, sid, path="/tmp/count"):
    """The value a background counter loop wrote to path (the file exists only after
    its first tick: waited for, up to 10 s)."""
    deadline = time.time() + 10
    while True:
        out = w.run(sid, f"cat {path} 2>/dev/null")["stdout"]
        if out or time.time() > deadline:
            return int(out)
        time.sleep(0.2)


def counter_runs(w, sid, path="/tmp/count"):
    """The counter still runs: its value grows within 10 s."""
    c0 = counter_value(w, sid, path)
    deadline = time.time() + 10
    while time.time() < deadline:
        time.sleep(0.3)
        if counter_value(w, sid, path) > c0:
            return True
    return False


class RssPeak:
    """Samples a process's RSS every 20 ms in a thread, as a context manager;
    .kib is the highest seen (it starts at the RSS on creation)."""

    def __init__(self, pid):
        self.pid = pid
        self.kib = rss_kib(pid)
        self._stop = threading.Event()
        self._t = threading.Thread(target=self._run, daemon=True)

    def _run(self):
        while not self._stop.is_set():
            try:
                self.kib = max(self.kib, rss_kib(self.pid))
            except OSError:
                return
            time.sleep(0.02)

    def __enter__(self):
        self._t.start()
        return self

    def __exit__(self, *exc):
        self._stop.set()
        self._t.join()


class Response:
    def __init__(self, status, headers, body):
        self.status = status
        self.headers = headers
        self.body = body

    def json(self):
        return json.loads(self.body)

    def __repr__(self):
        return f"<{self.status} {self.body[:300]!r}>"


class Warren:
    def __init__(self, conf=None, env=None):
        self.state_dir = tempfile.mkdtemp(prefix="warren-it-")
        self.env = dict(os.environ, **(env or {}))
        self.port = free_port()
        self.conf = dict(conf or {})
        self.proc = None
        self.log_path = os.path.join(self.state_dir, "warrend.log")
        self.log = None
        self.key = None
        self.binary = None  # None: the warrend under test (warrend_path())
        self.images = None  # None: the guest images of image_dir()

    # -- process --
    def start(self, timeout=60):
        conf_path = os.path.join(self.state_dir, "test.conf")
        conf = dict(self.conf)
        if self.binary is None:
            # The warm pool is on by default (a template built at start, 2 VMs): a test
            # that is not about it runs without it, so its VMs and timings are its own.
            # (An older warrend, run by an upgrade test, has no such option.)
            conf.setdefault("pool_size", "0")
        with open(conf_path, "w") as f:
            for k, v in conf.items():
                f.write(f"{k} = {v}\n")
        if self.log:
            self.log.close()
        self.log = open(self.log_path, "ab")
        seen = self.log.tell()  # a restart appends: look only at this run's lines
        self.proc = subprocess.Popen(
            [self.binary or warrend_path(), "--config", conf_path,
             "--listen", f"127.0.0.1:{self.port}",
             "--state-dir", self.state_dir, "--image-dir", self.images or image_dir()],
            stdin=subprocess.DEVNULL, stdout=self.log, stderr=self.log, env=self.env)
        deadline = time.time() + timeout
        while time.time() < deadline:
            if self.proc.poll() is not None:
                raise RuntimeError("warrend exited:\n" + self.log_text())
            with open(self.log_path, "rb") as f:
                f.seek(seen)
                if b"warrend listening" in f.read():
                    break
            time.sleep(0.05)
        else:
            raise RuntimeError("warrend did not start:\n" + self.log_text())
        with open(os.path.join(self.state_dir, "api_key")) as f:
            self.key = f.read().strip()
        return self

    def log_all(self):
        """All that warrend has logged (every start of it, appended)."""
        try:
            with open(self.log_path, errors="replace") as f:
                return f.read()
        except OSError:
            return ""

    def log_text(self):
        """The log's last 6,000 characters: enough for a failure message."""
        return self.log_all()[-6000:]

    def kill9(self):
        self.proc.send_signal(signal.SIGKILL)
        self.proc.wait()

    def stop(self):
        if self.proc and self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
            try:
                self.proc.wait(timeout=20)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()
        if self.log:
            self.log.close()
            self.log = None

    def cleanup(self):
        self.stop()
        for pid in qemu_pids(self.state_dir):
            try:
                os.kill(pid, signal.SIGKILL)
            except ProcessLookupError:
                pass
        # A warrend ended by kill -9 never removed its templates' RAM files, and no
        # warrend of this state dir will start again to sweep them: 256 MiB each.
        for f in shm_files(self.state_dir):
            try:
                os.unlink(os.path.join("/dev/shm", f))
            except FileNotFoundError:
                pass
        shutil.rmtree(self.state_dir, ignore_errors=True)

    # -- HTTP --
    def conn(self, timeout=600):
        return http.client.HTTPConnection("127.0.0.1", self.port, timeout=timeout)

    def request(self, method, path, body=None, headers=None, auth=True, timeout=600):
        h = {}
        if auth:
            h["Authorization"] = f"Bearer {self.key}"
        if isinstance(body, (dict, list)):
            body = json.dumps(body).encode()
            h["Content-Type"] = "application/json"
        h.update(headers or {})
        c = self.conn(timeout)
        try:
            c.request(method, path, body=body, headers=h)
            r = c.getresponse()
            return Response(r.status, dict(r.getheaders()), r.read())
        finally:
            c.close()

    def raw_request(self, method, path, body=b"", headers=None, rcvbuf=None):
        """Send one request on a raw socket and return the socket, for tests of clients
        that stop reading or vanish. rcvbuf is set before connecting, so the TCP window
        stays that small (set after, the kernel's autotuned window of megabytes would
        absorb what the test means to hold back)."""
        s = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
        if rcvbuf:
            s.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, rcvbuf)
        s.connect(("127.0.0.1", self.port))
        h = {"Host": "x", "Authorization": f"Bearer {self.key}"}
        if body:
            h["Content-Type"] = "application/json"
            h["Content-Length"] = str(len(body))
        h.update(headers or {})
        head = f"{method} {path} HTTP/1.1\r\n" + "".join(f"{k}: {v}\r\n" for k, v in h.items())
        s.sendall(head.encode() + b"\r\n" + body)
        return s

    # Test sandboxes live far longer than any test uses them (a class can take
    # several minutes under ASan): only tests of the TTL or idle timeout set
    # these, explicitly.
    TEST_TTL_S = 4 * 3600
    TEST_IDLE_S = 2 * 3600

    def create(self, **kw):
        body = {"template": "minimal", "ttl_seconds": self.TEST_TTL_S,
                "idle_timeout_seconds": self.TEST_IDLE_S}
        if "snapshot_id" in kw:  # a snapshot has its template
            del body["template"]
        body.update(kw)
        r = self.request("POST", "/v1/sandboxes", body)
        if r.status != 201:
            raise AssertionError(f"create failed: {r}\n{self.log_text()}")
        return r.json()["id"]

    def exec(self, sid, cmd, **kw):
        body = {"cmd": cmd} if isinstance(cmd, str) else {"argv": cmd}
        body.update(kw)
        return self.request("POST", f"/v1/sandboxes/{sid}/exec", body)

    def run(self, sid, cmd, **kw):
        """Exec that must succeed; returns the JSON result."""
        r = self.exec(sid, cmd, **kw)
        if r.status != 200:
            raise AssertionError(f"exec {cmd!r} failed: {r}")
        return r.json()

    def put_guestbin(self, sid, name, env):
        """Upload tests/guestbin/NAME (built; $ENV if set) as /tmp/NAME in sid, mode 0755;
        returns that path."""
        with open(built(env, f"tests/guestbin/{name}"), "rb") as f:
            r = self.request("PUT", f"/v1/sandboxes/{sid}/files?path=/tmp/{name}&mode=0755",
                             body=f.read())
        if r.status != 200:
            raise AssertionError(f"upload of {name} failed: {r}")
        return f"/tmp/{name}"

    def put_numlines(self, sid):
        """Upload tests/guestbin/numlines as /tmp/numlines in sid; returns that path.
        It prints what `seq FIRST LAST` prints, ~40x faster under TCG than BusyBox's
        seq (which formats through floating point): for tests whose bulk streams
        should measure the streaming, not the guest's number formatting."""
        return self.put_guestbin(sid, "numlines", "NUMLINES")

    def get(self, sid):
        return self.request("GET", f"/v1/sandboxes/{sid}")

    def vm_id(self, sid):
        """The id of the sandbox's VM: what its QEMU's command line and run dir carry."""
        r = self.get(sid)
        assert r.status == 200, r
        return r.json()["vm_id"]

    def run_dir(self, sid):
        return os.path.join(self.state_dir, "vms", self.vm_id(sid))

    def delete(self, sid):
        return self.request("DELETE", f"/v1/sandboxes/{sid}")

    def wait_guest(self, sid, timeout=120):
        """After warrend's restart: until the adopted sandbox's guest answers again
        (until then a request is answered 503 sandbox_not_ready); the last answer."""
        deadline = time.time() + timeout
        while True:
            r = self.request("GET", f"/v1/sandboxes/{sid}/processes")
            if r.status == 200 or time.time() > deadline:
                return r
            time.sleep(0.1)

    def wait_state(self, sid, states, timeout=30):
        deadline = time.time() + timeout
        while time.time() < deadline:
            r = self.get(sid)
            if r.status == 200 and r.json()["state"] in states:
                return r.json()
            time.sleep(0.2)
        raise AssertionError(f"{sid} never reached {states}: {self.get(sid)}")


class WarrenCase(unittest.TestCase):
    """One warrend per test class, killed with its VMs at the end."""
    conf = {}

    @classmethod
    def setUpClass(cls):
        if not os.path.exists(os.path.join(image_dir(), "vmlinux")):
            # A missing image is a broken set-up, not a reason to pass quietly.
            raise RuntimeError(f"no guest images in {image_dir()} (run images/build.sh)")
        cls.w = Warren(cls.conf).start()

    @classmethod
    def tearDownClass(cls):
        cls.w.cleanup()

    def assertError(self, r, status, code=None):
        self.assertEqual(r.status, status, r)
        err = r.json()["error"]
        self.assertIsInstance(err["message"], str)
        if code:
            self.assertEqual(err["code"], code, r)
