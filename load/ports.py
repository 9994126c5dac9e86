"""The port proxy (docs/NETWORK.md, "Inbound"): throughput and connection set-up, through
warrend vs direct from inside the VM's namespace.

    WARREN_IMAGE_DIR=... python3 load/ports.py [--mib N] [--conns N]

Runs inside the tests' fake internet (tests/integration/fakenet.py: networking
needs an uplink; no packet leaves this machine). One warrend, one minimal
sandbox running BusyBox's httpd (a file of N MiB, served with sendfile) and
BusyBox's nc (swallows an upload). Measures:
  - download: GET of the N MiB file, MB/s;
  - upload: N MiB posted to nc (which writes it to /dev/null), MB/s until the
    last byte is taken;
  - set-up: connect, send a GET of a 6-byte file, first byte back, close:
    p50/p99 over --conns connections;
each through warrend (path route, API key) and direct (a socket made inside
the VM's namespace with setns, to 10.0.2.2). Then the guest's own traffic to
the fake internet through its NAT (egress): BusyBox wget of the fake HTTP
server's 4 MiB file, --mib worth, to /dev/null, and BusyBox nc sending
/dev/zero to a discard server there, which closes after --mib; MB/s over the
exec's time (both bound by the TCG guest's own copying, not the NAT). Needs root, ip, nft.
"""
import argparse
import ctypes
import os
import socket
import statistics
import sys
import time

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "tests",
                                "integration"))
import fakenet  # noqa: E402
from warren import Warren, fnv1a  # noqa: E402

NET = {"jail": "off", "net_enabled": "true", "net_uplink": fakenet.UPLINK,
       "net_dns_upstream": fakenet.DNS_ADDR, "net_range": "10.203.0.0/16"}
HTTPD, NC = 8000, 9000
CLONE_NEWNET = 0x40000000
libc = ctypes.CDLL(None, use_errno=True)


def ns_socket(ns_path):
    """A TCP socket made inside the namespace at ns_path (this thread returns)."""
    self_fd = os.open("/proc/thread-self/ns/net", os.O_RDONLY)
    fd = os.open(ns_path, os.O_RDONLY)
    try:
        if libc.setns(fd, CLONE_NEWNET) != 0:
            raise OSError(ctypes.get_errno(), "setns")
        s = socket.socket()
    finally:
        if libc.setns(self_fd, CLONE_NEWNET) != 0:
            os.abort()
        os.close(fd)
        os.close(self_fd)
    return s


class Target:
    def __init__(self, w, sid, ns):
        self.w, self.sid, self.ns = w, sid, ns

    def open(self, direct, port):
        if direct:
            s = ns_socket(self.ns)
            s.connect(("10.0.2.2", port))
        else:
            s = socket.create_connection(("127.0.0.1", self.w.port))
        s.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        return s

    def head(self, direct, method, port, path, extra=""):
        p = path if direct else f"/v1/sandboxes/{self.sid}/ports/{port}{path}"
        auth = "" if direct else f"Authorization: Bearer {self.w.key}\r\n"
        return (f"{method} {p} HTTP/1.1\r\nHost: x\r\n{auth}Connection: close\r\n"
                f"{extra}\r\n").encode()


def drain(s):
    n = 0
    while True:
        b = s.recv(1 << 20)
        if not b:
            return n
        n += len(b)


def download(t, direct, mib):
    s = t.open(direct, HTTPD)
    t0 = time.monotonic()
    s.sendall(t.head(direct, "GET", HTTPD, "/big"))
    n = drain(s)
    dt = time.monotonic() - t0
    s.close()
    assert n > mib << 20, n
    return (mib << 20) / dt / 1e6


def upload(t, direct, mib):
    t.w.request("POST", f"/v1/sandboxes/{t.sid}/exec",
                {"cmd": f"busybox nc -l -p {NC} >/dev/null", "background": True})
    time.sleep(1.5)  # until it listens (a probe connection would be its one client)
    s = t.open(direct, NC)
    body = os.urandom(1 << 20)
    t0 = time.monotonic()
    s.sendall(t.head(direct, "POST", NC, "/up", f"Content-Length: {mib << 20}\r\n"))
    for _ in range(mib):
        s.sendall(body)
    s.shutdown(socket.SHUT_WR)
    drain(s)  # nc closes when it has read everything
    dt = time.monotonic() - t0
    s.close()
    return (mib << 20) / dt / 1e6


def setup(t, direct, n):
    xs = []
    for _ in range(n):
        t0 = time.monotonic()
        s = t.open(direct, HTTPD)
        s.sendall(t.head(direct, "GET", HTTPD, "/small"))
        assert s.recv(1)
        xs.append((time.monotonic() - t0) * 1000)
        drain(s)
        s.close()
    xs.sort()
    return statistics.median(xs), xs[int(len(xs) * 0.99) - 1]


# A discard server for the guest's uploads: reads N bytes from each connection, closes.
DISCARD = r"""
import socket, sys
s = socket.socket()
s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
s.bind((sys.argv[1], int(sys.argv[2])))
s.listen(4)
while True:
    c, _ = s.accept()
    left = int(sys.argv[3])
    while left > 0:
        b = c.recv(min(left, 1 << 20))
        if not b:
            break
        left -= len(b)
    c.close()
"""
DISCARD_PORT = 9100


def egress(w, sid, mib):
    """The guest's own download from and upload to the fake internet, MB/s."""
    n = max(1, (mib << 20) // fakenet.BIG_SIZE)
    url = f"http://{fakenet.HTTP_ADDR}/{fakenet.BIG}"
    t0 = time.monotonic()
    r = w.run(sid, f"for i in $(seq {n}); do busybox wget -q -O /dev/null {url} || exit 1; done",
              timeout_seconds=600)
    down = n * fakenet.BIG_SIZE / (time.monotonic() - t0) / 1e6
    assert r["exit_code"] == 0, r
    t0 = time.monotonic()
    # nc reads /dev/zero itself: a `head -c` or `dd` in a pipe before it made 1.5 MB/s
    # here (the TCG guest's copies through the pipe, not the network: head alone into
    # /dev/null makes 11 MB/s).
    r = w.run(sid, f"busybox nc {fakenet.HTTP_ADDR} {DISCARD_PORT} < /dev/zero",
              timeout_seconds=600)
    up = (mib << 20) / (time.monotonic() - t0) / 1e6
    return down, up


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--mib", type=int, default=32)  # /tmp of a 256 MiB guest holds ~51 MiB
    ap.add_argument("--conns", type=int, default=200)
    ap.add_argument("--runs", type=int, default=3)
    args = ap.parse_args()
    print("load:", open("/proc/loadavg").read().strip())
    net = fakenet.FakeNet()
    w = None
    try:
        net.enter()
        w = Warren(NET).start()
        sid = w.create(template="minimal")
        w.run(sid, f"mkdir -p /tmp/www && head -c {args.mib << 20} /dev/zero > /tmp/www/big && "
                   "echo small > /tmp/www/small")
        w.request("POST", f"/v1/sandboxes/{sid}/exec",
                  {"argv": ["busybox", "httpd", "-f", "-p", str(HTTPD), "-h", "/tmp/www"],
                   "background": True})
        vm = w.get(sid).json()["vm_id"]
        t = Target(w, sid, f"/run/netns/warren-{fnv1a(w.state_dir)}-{vm}")
        time.sleep(1)
        for name, direct in (("through warrend", False), ("direct in the namespace", True)):
            down = [download(t, direct, args.mib) for _ in range(args.runs)]
            up = [upload(t, direct, args.mib) for _ in range(args.runs)]
            p50, p99 = setup(t, direct, args.conns)
            print(f"{name}: download {statistics.median(down):.0f} MB/s, upload "
                  f"{statistics.median(up):.0f} MB/s ({args.mib} MiB, median of {args.runs}); "
                  f"connect to first byte p50 {p50:.2f} ms, p99 {p99:.2f} ms (n={args.conns})")
        net._spawn([sys.executable, "-c", DISCARD, fakenet.HTTP_ADDR, str(DISCARD_PORT),
                    str(args.mib << 20)])
        time.sleep(1)
        eg = [egress(w, sid, args.mib) for _ in range(args.runs)]
        print(f"guest <-> fake internet (NAT, egress policy): download "
              f"{statistics.median([d for d, _ in eg]):.1f} MB/s, upload "
              f"{statistics.median([u for _, u in eg]):.1f} MB/s ({args.mib} MiB, median of "
              f"{args.runs}; exec time, guest's BusyBox wget / nc)")
    finally:
        if w:
            w.cleanup()
        net.close()
    print("load:", open("/proc/loadavg").read().strip())


if __name__ == "__main__":
    main()
