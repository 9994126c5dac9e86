"""Snapshots, fork, pause and resume (issue 8): latencies, client side.

    load/run --snap [--n N] [--fork8 N]

On one booted sandbox (pool off: its RAM goes whole into each snapshot) with
a background loop running:
- snapshot: POST /snapshot until 201 (the VM stops for the save and the disk
  copy, then continues);
- create from a snapshot: POST /v1/sandboxes {snapshot_id} until 201 (a VM
  restored, continued, its session up);
- fork count 1 and count 8: POST /fork until 201 (one snapshot, then the
  restores);
- pause (POST /pause until 200: save + disk copy + QEMU ended) and resume
  (POST /resume until 200: restore + session).
Every sandbox and snapshot made is deleted before the next round. Printed,
not asserted.
"""
import argparse
import os
import sys
import time

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "tests",
                                "integration"))
from warren import Warren  # noqa: E402
from bench import pct, print_table  # noqa: E402


def ms(x):
    return f"{x * 1000:.0f} ms"


def timed(fn):
    t0 = time.perf_counter()
    r = fn()
    return time.perf_counter() - t0, r


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--n", type=int, default=5, help="rounds of each (fork 8: --fork8)")
    ap.add_argument("--fork8", type=int, default=2, help="rounds of fork count 8")
    a = ap.parse_args()

    w = Warren({"jail": "off", "max_sandboxes": "64"}).start()
    rows = []
    try:
        sid = w.create()
        r = w.request("POST", f"/v1/sandboxes/{sid}/exec",
                      {"cmd": "i=0; while :; do i=$((i+1)); echo $i > /tmp/c; sleep 0.2; done",
                       "background": True})
        assert r.status == 201, r
        w.run(sid, "true")

        snap, create, size = [], [], []
        for _ in range(a.n):
            dt, r = timed(lambda: w.request("POST", f"/v1/sandboxes/{sid}/snapshot", {}))
            assert r.status == 201, r
            snap.append(dt)
            s = r.json()
            size.append(s["size_bytes"])
            dt, r = timed(lambda: w.request(
                "POST", "/v1/sandboxes", {"snapshot_id": s["id"], "ttl_seconds": 600}))
            assert r.status == 201, r
            create.append(dt)
            child = r.json()["id"]
            assert w.run(child, "cat /tmp/c")["exit_code"] == 0
            w.delete(child)
            assert w.request("DELETE", f"/v1/snapshots/{s['id']}").status == 200
        rows.append((f"snapshot (n={a.n}; {sum(size) / len(size) / 2**20:.0f} MiB of files)",
                     ms(pct(snap, 50)), ms(pct(snap, 99))))
        rows.append((f"create from a snapshot (n={a.n})", ms(pct(create, 50)),
                     ms(pct(create, 99))))

        for count, rounds in ((1, a.n), (8, a.fork8)):
            xs = []
            for _ in range(rounds):
                dt, r = timed(lambda: w.request("POST", f"/v1/sandboxes/{sid}/fork",
                                                {"count": count, "ttl_seconds": 600}))
                assert r.status == 201, (r, w.log_text())
                xs.append(dt)
                for f in r.json()["sandboxes"]:
                    w.delete(f["id"])
            rows.append((f"fork count {count} (n={rounds})", ms(pct(xs, 50)), ms(pct(xs, 99))))

        pause, resume = [], []
        for _ in range(a.n):
            dt, r = timed(lambda: w.request("POST", f"/v1/sandboxes/{sid}/pause", {}))
            assert r.status == 200 and r.json()["state"] == "paused", r
            pause.append(dt)
            dt, r = timed(lambda: w.request("POST", f"/v1/sandboxes/{sid}/resume", {}))
            assert r.status == 200 and r.json()["state"] == "running", r
            resume.append(dt)
            assert w.run(sid, "cat /tmp/c")["exit_code"] == 0
        rows.append((f"pause (n={a.n})", ms(pct(pause, 50)), ms(pct(pause, 99))))
        rows.append((f"resume (n={a.n})", ms(pct(resume, 50)), ms(pct(resume, 99))))
        with open("/proc/loadavg") as f:
            load = f.read().split()[:3]
    finally:
        w.cleanup()
    print_table("Snapshots, fork, pause, resume (256 MiB guest, client side)", "p50 / p99",
                rows)
    print(f"load average at the end: {' '.join(load)}")


if __name__ == "__main__":
    main()
