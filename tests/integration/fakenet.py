"""A fake internet for the network tests: no packet leaves this machine.

Two network namespaces: "host" (warrend runs there: the test process enters
it with setns, so warrend and its children inherit it) and "inet", joined by
a veth pair on 203.0.113.0/24 (documentation addresses). The host namespace's
only route out leads into inet, which holds an HTTP server on 192.0.2.10:80 (and 198.51.100.80, 203.0.113.2,
203.0.113.80, and impostors of 169.254.169.254 and 168.63.129.16) and a DNS server on 198.51.100.53:53 answering a few names (NAMES). Everything is
removed by close(), whatever happened.
"""
import ctypes
import os
import shutil
import socket
import subprocess
import sys
import tempfile
import time

CLONE_NEWNET = 0x40000000
HTTP_ADDR = "192.0.2.10"
DNS_ADDR = "198.51.100.53"
HTTP2_ADDR = "198.51.100.80"  # the same HTTP server on another address
INET_ADDR = "203.0.113.2"  # and on the fake internet's side of the uplink
API_ADDR = "203.0.113.80"  # and on another address, named api.example.org
# Impostors of the clouds' metadata addresses, served by the same HTTP server past
# the uplink: what an always-denied address would answer if it were let out.
METADATA_ADDRS = ("169.254.169.254", "168.63.129.16")
UPLINK = "up0"
UPLINK_ADDR = "203.0.113.1"
NAMES = {"www.example.com": HTTP_ADDR, "api.example.org": API_ADDR,
         "dl.example.com": HTTP2_ADDR}
BIG = "big.bin"  # a 4 MiB file the HTTP server serves (rate limits)
BIG_SIZE = 4 << 20
BODY = "hello from the fake internet\n"

DNS_SERVER = r'''
import socket, struct, sys
names = dict(a.split("=") for a in sys.argv[2:])
s = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
s.bind((sys.argv[1], 53))
while True:
    q, peer = s.recvfrom(512)
    if len(q) < 12:
        continue
    qid, flags, qd = struct.unpack(">HHH", q[:6])
    i, labels = 12, []
    while i < len(q) and q[i]:
        labels.append(q[i + 1:i + 1 + q[i]].decode(errors="replace"))
        i += 1 + q[i]
    question = q[12:i + 5]
    qtype = struct.unpack(">H", q[i + 1:i + 3])[0] if i + 3 <= len(q) else 0
    addr = names.get(".".join(labels).lower())
    if addr and qtype == 1:
        ans = b"\xc0\x0c" + struct.pack(">HHIH", 1, 1, 60, 4) + socket.inet_aton(addr)
        r = struct.pack(">HHHHHH", qid, 0x8180, 1, 1, 0, 0) + question + ans
    else:
        rc = 0 if addr else 3
        r = struct.pack(">HHHHHH", qid, 0x8180 | rc, 1, 0, 0, 0) + question
    s.sendto(r, peer)
'''


def have_tools():
    """None if the fake internet can be built here, else why not."""
    if os.geteuid() != 0:
        return "needs root (network namespaces)"
    for tool in ("ip", "nft"):
        if not shutil.which(tool, path="/usr/sbin:/usr/bin:/sbin:/bin"):
            return f"{tool} is not installed"
    return None


def sh(*argv, check=True):
    return subprocess.run(argv, check=check, capture_output=True, text=True)


def _setns(path):
    libc = ctypes.CDLL(None, use_errno=True)
    fd = os.open(path, os.O_RDONLY)
    try:
        if libc.setns(fd, CLONE_NEWNET) != 0:
            raise OSError(ctypes.get_errno(), "setns " + path)
    finally:
        os.close(fd)


class FakeNet:
    def __init__(self):
        tag = f"{os.getpid() % 100000}"
        self.host = f"wt-host-{tag}"
        self.inet = f"wt-inet-{tag}"
        self.procs = []
        self.dir = tempfile.mkdtemp(prefix="warren-fakenet-")
        self.orig = None
        try:
            self._build()
        except BaseException:
            self.close()
            raise

    def _build(self):
        sh("ip", "netns", "add", self.host)
        sh("ip", "netns", "add", self.inet)
        sh("ip", "-n", self.host, "link", "add", UPLINK, "type", "veth", "peer", "name", "inet0",
           "netns", self.inet)
        for cmd in (f"link set lo up\nlink set {UPLINK} up\n"
                    f"addr add {UPLINK_ADDR}/24 dev {UPLINK}\n"
                    "route add default via 203.0.113.2\n"
                    # a private address of the host, for the always-deny check
                    "addr add 10.99.0.1/32 dev lo\n", self.host), \
                   ("link set lo up\nlink set inet0 up\naddr add 203.0.113.2/24 dev inet0\n"
                    f"addr add {HTTP_ADDR}/32 dev lo\naddr add {DNS_ADDR}/32 dev lo\n"
                    f"addr add {HTTP2_ADDR}/32 dev lo\naddr add {API_ADDR}/32 dev lo\n" +
                    "".join(f"addr add {a}/32 dev lo\n" for a in METADATA_ADDRS),
                    self.inet):
            subprocess.run(["ip", "-n", cmd[1], "-b", "-"], input=cmd[0], check=True, text=True,
                           capture_output=True)
        with open(os.path.join(self.dir, "index.html"), "w") as f:
            f.write(BODY)
        with open(os.path.join(self.dir, BIG), "wb") as f:
            f.write(os.urandom(BIG_SIZE))
        self._spawn([sys.executable, "-m", "http.server", "80", "--bind", "0.0.0.0",
                     "--directory", self.dir])
        self._spawn([sys.executable, "-c", DNS_SERVER, DNS_ADDR] +
                    [f"{k}={v}" for k, v in NAMES.items()])
        self._wait_http()

    def _spawn(self, argv):
        with open(os.path.join(self.dir, f"proc{len(self.procs)}.log"), "wb") as log:
            self.procs.append(subprocess.Popen(["ip", "netns", "exec", self.inet] + argv,
                                               stdin=subprocess.DEVNULL, stdout=log, stderr=log))

    def _wait_http(self):
        deadline = time.time() + 30
        while time.time() < deadline:
            r = sh("ip", "netns", "exec", self.inet, sys.executable, "-c",
                   f"import socket; socket.create_connection(('{HTTP_ADDR}', 80), 1)",
                   check=False)
            if r.returncode == 0:
                return
            time.sleep(0.2)
        raise RuntimeError("the fake HTTP server did not start")

    def enter(self):
        """The calling thread (and every process it starts) moves into the host namespace."""
        self.orig = os.open("/proc/self/ns/net", os.O_RDONLY)
        _setns(f"/run/netns/{self.host}")

    def leave(self):
        if self.orig is not None:
            libc = ctypes.CDLL(None, use_errno=True)
            libc.setns(self.orig, CLONE_NEWNET)
            os.close(self.orig)
            self.orig = None

    def listen(self, addr, port):
        """A TCP listener in the host namespace (call after enter())."""
        s = socket.socket()
        s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        s.bind((addr, port))
        s.listen(16)
        return s

    def close(self):
        self.leave()
        for p in self.procs:
            p.kill()
            p.wait()
        for ns in (self.host, self.inet):
            sh("ip", "netns", "del", ns, check=False)
        shutil.rmtree(self.dir, ignore_errors=True)


def netns_named(marker):
    try:
        return sorted(n for n in os.listdir("/run/netns") if marker in n)
    except FileNotFoundError:
        return []
