"""Warren benchmarks: one command, one table. Drives the real warrend and real
microVMs (see tests/integration/warren.py) and prints p50/p99 and MB/s.

    python3 load/bench.py [--boots N] [--execs N] [--mib N]
"""
import argparse
import hashlib
import http.client
import json
import os
import platform
import sys
import time

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "tests",
                                "integration"))
from warren import Warren, qemu_pids, rss_kib  # noqa: E402

MiB = 1024 * 1024



class Via:
    """Requests to one address (the proxy, or a host directly), keep-alive."""

    def __init__(self, host, port, key):
        self.host, self.port, self.key = host, port, key
        self.c = None

    def req(self, method, path, body=None, headers=None, with_headers=False):
        h = {"Authorization": f"Bearer {self.key}"}
        data = None
        if body is not None:
            data = json.dumps(body).encode()
            h["Content-Type"] = "application/json"
        h.update(headers or {})
        for attempt in (0, 1):
            if self.c is None:
                self.c = http.client.HTTPConnection(self.host, self.port, timeout=600)
            try:
                self.c.request(method, path, body=data, headers=h)
                r = self.c.getresponse()
                out = r.read()
                if with_headers:
                    return r.status, out, {k.lower(): v for k, v in r.getheaders()}
                return r.status, out
            except (http.client.HTTPException, OSError):
                self.c.close()
                self.c = None
                if attempt:
                    raise


def pct(xs, p):
    xs = sorted(xs)
    return xs[min(len(xs) - 1, int(round(p / 100.0 * (len(xs) - 1))))]


def ms(x):
    return f"{x * 1000:.1f} ms"


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--boots", type=int, default=10)
    ap.add_argument("--execs", type=int, default=200)
    ap.add_argument("--mib", type=int, default=100)
    ap.add_argument("--template", default="minimal")
    a = ap.parse_args()

    w = Warren({"max_sandboxes": 8}).start()
    rows = []
    try:
        # Cold boot: POST /v1/sandboxes until 201 = QEMU start + guest kernel + agent HELLO.
        boots = []
        for _ in range(a.boots):
            t0 = time.perf_counter()
            sid = w.create(template=a.template)
            boots.append(time.perf_counter() - t0)
            w.delete(sid)
        rows.append((f"cold boot to guest ready ({a.template}, n={a.boots})",
                     ms(pct(boots, 50)), ms(pct(boots, 99))))

        sid = w.create(template=a.template)
        # Baseline beside it: the HTTP stack alone, no guest involved.
        hz = []
        for _ in range(a.execs):
            t0 = time.perf_counter()
            w.request("GET", "/healthz", auth=False)
            hz.append(time.perf_counter() - t0)
        rows.append((f"GET /healthz (HTTP baseline, n={a.execs})", ms(pct(hz, 50)),
                     ms(pct(hz, 99))))
        # The same on one kept-alive connection, as HTTP clients with a pool send them: a
        # response held back for the client's delayed ACK shows here (40 ms), not above.
        c, hz = w.conn(timeout=60), []
        for _ in range(a.execs):
            t0 = time.perf_counter()
            c.request("GET", "/healthz")
            c.getresponse().read()
            hz.append(time.perf_counter() - t0)
        c.close()
        rows.append((f"GET /healthz, one kept-alive connection (n={a.execs})", ms(pct(hz, 50)),
                     ms(pct(hz, 99))))
        rt = []
        for _ in range(a.execs):
            t0 = time.perf_counter()
            r = w.exec(sid, ["true"])
            rt.append(time.perf_counter() - t0)
            assert r.status == 200 and r.json()["exit_code"] == 0, r
        rows.append((f"exec `true` round trip (n={a.execs})", ms(pct(rt, 50)), ms(pct(rt, 99))))

        data = os.urandom(a.mib * MiB)
        t0 = time.perf_counter()
        r = w.request("PUT", f"/v1/sandboxes/{sid}/files?path=/root/bench.bin", body=data)
        up = time.perf_counter() - t0
        assert r.status == 200, r
        t0 = time.perf_counter()
        r = w.request("GET", f"/v1/sandboxes/{sid}/files?path=/root/bench.bin")
        down = time.perf_counter() - t0
        assert hashlib.sha256(r.body).digest() == hashlib.sha256(data).digest()
        rows.append((f"file upload {a.mib} MiB", f"{a.mib / up:.1f} MB/s", ""))
        rows.append((f"file download {a.mib} MiB", f"{a.mib / down:.1f} MB/s", ""))
        w.run(sid, "rm /root/bench.bin")

        # Two writers: busybox head writes 4 KiB at a time (a frame per write), dd 64 KiB.
        for label, cmd in (("4 KiB writes", f"head -c {a.mib * MiB} /dev/zero"),
                           ("64 KiB writes",
                            f"dd if=/dev/zero bs=65536 count={a.mib * 16} 2>/dev/null")):
            c = w.conn()
            t0 = time.perf_counter()
            c.request("POST", f"/v1/sandboxes/{sid}/exec", body=json.dumps({"cmd": cmd}),
                      headers={"Authorization": f"Bearer {w.key}",
                               "Accept": "application/x-ndjson"})
            resp = c.getresponse()
            n = 0
            for line in resp:
                ev = json.loads(line)
                if ev["type"] == "stdout":
                    n += len(ev.get("data", ""))
            st = time.perf_counter() - t0
            c.close()
            assert n == a.mib * MiB, n
            rows.append((f"exec stdout {a.mib} MiB as NDJSON, {label}", f"{a.mib / st:.1f} MB/s",
                         ""))

        # Memory: warrend itself, and one booted VM's QEMU (proportional set size).
        pss = 0
        for pid in qemu_pids(w.vm_id(sid)):
            with open(f"/proc/{pid}/smaps_rollup") as f:
                for line in f:
                    if line.startswith("Pss:"):
                        pss += int(line.split()[1])
        rows.append(("warrend RSS (1 sandbox, after the runs above)",
                     f"{rss_kib(w.proc.pid) / 1024:.1f} MiB", ""))
        rows.append(("QEMU PSS of one booted 256 MiB VM", f"{pss / 1024:.0f} MiB", ""))
        w.delete(sid)
    finally:
        w.cleanup()

    print_table("Warren benchmarks", "p50 / rate", rows)


def emit_rows(title, rows):
    """Append rows as JSON lines to $WARREN_ROWS when set (load/targets.py reads them)."""
    path = os.environ.get("WARREN_ROWS")
    if path:
        with open(path, "a") as f:
            for r in rows:
                f.write(json.dumps({"title": title, "row": [str(x) for x in r]}) + "\n")


def print_table(title, head, rows, width=52):
    """rows of (measure, p50 or value, p99), with the machine they ran on."""
    emit_rows(title, rows)
    print(f"\n{title} on {platform.node()} ({os.cpu_count()} cores, "
          f"{platform.machine()}, kernel {platform.release()})")
    print(f"{'measure':{width}} {head:>14} {'p99':>12}")
    print("-" * (width + 28))
    for name, p50, p99 in rows:
        print(f"{name:{width}} {p50:>14} {p99:>12}")


if __name__ == "__main__":
    main()
