"""Flood warrend from both sides at once and print one table:
hostile guests writing frames of their own (tests/hostile/hostile.c, run as
root in real sandboxes) while thousands of slow clients hold connections
(load/slow_clients.py). Reports warrend's peak RSS and whether a
well-behaved sandbox still answers exec, and how fast.

    load/run --hostile [--n 5000] [--hold 60] [--addrs 50]
    python3 load/hostile.py [same flags]

Loopback only; bounded: the floods stop after --hold seconds, and the whole
run after at most --hold + ~3 minutes (boots, probes, clean-up).
"""
import argparse
import json
import os
import platform
import sys
import threading
import time

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.join(HERE, "..", "tests", "integration"))
sys.path.insert(0, HERE)
import slow_clients  # noqa: E402
from warren import RssPeak, Warren, hostile_path, rss_kib  # noqa: E402

# Cases of hostile.c that hit warrend hardest: 64 MiB of OUT against a 1 MiB
# window, 3 million HELLO{id:0} without reading, and a non-contiguous offset
# behind a partial UTF-8 byte (the old heap overflow).
CASES = ("window", "hello", "offsets")


def pct(xs, p):
    xs = sorted(xs)
    return xs[min(len(xs) - 1, int(round(p / 100.0 * (len(xs) - 1))))] if xs else float("nan")


class Hostiles(threading.Thread):
    """Keeps hostile sandboxes breaking the protocol until stop: each run of the
    program is one violation; a sandbox past protocol_violations_max is dead and
    a new one takes its place."""

    def __init__(self, w, program, stop_at):
        super().__init__(daemon=True)
        self.w, self.program, self.stop_at = w, program, stop_at
        self.runs = self.dead = self.errors = 0

    def fresh(self):
        sid = self.w.create()
        r = self.w.request("PUT", f"/v1/sandboxes/{sid}/files?path=/tmp/hostile&mode=0755",
                           body=self.program)
        if r.status != 200:
            raise RuntimeError(f"upload: {r}")
        return sid

    def run(self):
        sid = None
        i = 0
        while time.time() < self.stop_at:
            try:
                if sid is None:
                    sid = self.fresh()
                r = self.w.request("POST", f"/v1/sandboxes/{sid}/exec",
                                   {"argv": ["/tmp/hostile", CASES[i % len(CASES)]]},
                                   headers={"Accept": "application/x-ndjson"}, timeout=120)
                self.runs += 1
                i += 1
                st = self.w.get(sid).json()
                if st["state"] == "dead":
                    self.dead += 1
                    sid = None
                elif r.status == 503 or st["state"] != "running":
                    time.sleep(0.5)  # backing off after the violation: wait for the channel
            except Exception:  # a refused connection under the flood: try again
                self.errors += 1
                time.sleep(0.5)


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--n", type=int, default=5000, help="slow clients")
    ap.add_argument("--hold", type=int, default=60, help="seconds of flooding")
    ap.add_argument("--addrs", type=int, default=50, help="source addresses of slow clients")
    ap.add_argument("--json", action="store_true")
    a = ap.parse_args()

    with open(hostile_path(), "rb") as f:
        program = f.read()
    slow_clients.raise_nofile(20000)
    w = Warren({"max_sandboxes": 8}).start()
    try:
        good = w.create()
        w.run(good, "true")
        idle_kib = rss_kib(w.proc.pid)
        peak = RssPeak(w.proc.pid).__enter__()
        stop_at = time.time() + a.hold
        hostile = Hostiles(w, program, stop_at)
        hostile.start()
        slow = {}
        st = threading.Thread(target=lambda: slow.update(
            slow_clients.run(w.port, w.key, good, pid=w.proc.pid, n=a.n, hold=a.hold,
                             addrs=a.addrs)), daemon=True)
        st.start()
        lat, fails = [], 0
        while time.time() < stop_at:
            t0 = time.time()
            try:
                r = w.exec(good, "echo ok")
                if r.status == 200 and r.json()["stdout"] == "ok\n":
                    lat.append(time.time() - t0)
                else:
                    fails += 1
            except Exception:
                fails += 1
            time.sleep(1)
        hostile.join(timeout=180)
        st.join(timeout=180)
        peak.__exit__(None, None, None)
        after = w.run(good, "echo ok")["stdout"] == "ok\n"
        alive = w.proc.poll() is None
    finally:
        w.cleanup()

    rows = [
        ("warrend RSS idle, before the floods", f"{idle_kib / 1024:.1f} MiB"),
        ("warrend peak RSS during the floods", f"{peak.kib / 1024:.1f} MiB"),
        ("hostile program runs (each one a protocol violation)", str(hostile.runs)),
        ("hostile sandboxes ended dead (protocol_violation)", str(hostile.dead)),
        (f"slow clients open at once, most (asked {a.n}, {a.addrs} source addresses)",
         str(slow.get("open_peak", "?"))),
        ("good sandbox: exec answered during the floods", f"{len(lat)} of {len(lat) + fails}"),
        ("good sandbox: exec latency during the floods p50 / p99",
         f"{pct(lat, 50) * 1000:.0f} / {pct(lat, 99) * 1000:.0f} ms"),
        ("good sandbox answers after the floods; warrend still up", f"{after}; {alive}"),
    ]
    print(f"\nhostile flood, {a.hold} s, {platform.node()} ({os.cpu_count()} CPUs)")
    wd = max(len(r[0]) for r in rows)
    for k, v in rows:
        print(f"  {k:<{wd}}  {v}")
    if slow:
        print("\nthe slow clients in detail:")
        slow_clients.report(slow)
    if a.json:
        print(json.dumps(dict(rows)))
    return 0 if (after and alive and len(lat) > 0) else 1


if __name__ == "__main__":
    sys.exit(main())
