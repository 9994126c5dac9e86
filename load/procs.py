"""Benchmarks of processes that belong to the sandbox: one table.

    load/run --procs [--n N] [--procs N] [--sandboxes N] [--watch S]

- background exec start (POST exec "background": true until its pid) beside a
  foreground exec `true` round trip, in the same run and the same sandbox;
- attach and replay 1 MiB of a process's ring from offset 0 (time until the
  reader has caught up with the end);
- warrend's RSS while N background processes spread over a few sandboxes
  write output nobody reads, sampled over a while: it must stay flat, since
  the rings are in the guests.
"""
import argparse
import json
import os
import sys
import time

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "tests",
                                "integration"))
from warren import Warren, rss_kib  # noqa: E402
from bench import MiB, ms, pct, print_table  # noqa: E402


def bg(w, sid, cmd, **kw):
    r = w.request("POST", f"/v1/sandboxes/{sid}/exec", dict(cmd=cmd, background=True, **kw))
    assert r.status == 201, r
    return r.json()["pid"]


def proc(w, sid, pid):
    r = w.request("GET", f"/v1/sandboxes/{sid}/processes/{pid}")
    assert r.status == 200, r
    return r.json()


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--n", type=int, default=50, help="starts and round trips timed")
    ap.add_argument("--procs", type=int, default=100, help="background writers for the RSS run")
    ap.add_argument("--sandboxes", type=int, default=4)
    ap.add_argument("--watch", type=int, default=60, help="seconds of RSS sampling")
    a = ap.parse_args()

    w = Warren({"max_sandboxes": a.sandboxes + 1, "process_ring_bytes": 2 * MiB,
                "max_processes_per_sandbox": max(64, a.procs // a.sandboxes + a.n + 2)}).start()
    rows = []
    try:
        sid = w.create()
        fg, start = [], []
        for _ in range(a.n):  # interleaved, so both see the same machine
            t0 = time.perf_counter()
            r = w.exec(sid, ["true"])
            fg.append(time.perf_counter() - t0)
            assert r.status == 200, r
            t0 = time.perf_counter()
            pid = bg(w, sid, "true")
            start.append(time.perf_counter() - t0)
        rows.append((f"foreground exec `true` round trip (n={a.n})", ms(pct(fg, 50)),
                     ms(pct(fg, 99))))
        rows.append((f"background exec start, to its pid (n={a.n})", ms(pct(start, 50)),
                     ms(pct(start, 99))))

        # 1 MiB in the ring, then a reader from 0 until it has caught up.
        pid = bg(w, sid, f"head -c {MiB} /dev/urandom | base64 -w 0 | head -c {MiB}; sleep 3600")
        deadline = time.time() + 120
        while proc(w, sid, pid)["output_end"] < MiB:
            assert time.time() < deadline, proc(w, sid, pid)
            time.sleep(0.1)
        reps = []
        for _ in range(5):
            t0 = time.perf_counter()
            r = w.request("GET", f"/v1/sandboxes/{sid}/processes/{pid}/output?offset=0")
            reps.append(time.perf_counter() - t0)
            lines = [json.loads(x) for x in r.body.splitlines()]
            got = sum(len(x["data"]) for x in lines if x["type"] == "stdout")
            assert got == MiB and lines[-1] == {"type": "end", "offset": MiB}, lines[-1]
        rows.append(("attach + replay 1 MiB of ring to caught up (n=5)", ms(pct(reps, 50)),
                     ms(pct(reps, 99))))
        w.request("POST", f"/v1/sandboxes/{sid}/processes/{pid}/signal", {"signal": 9})
        w.delete(sid)

        # Writers nobody reads.
        sids = [w.create() for _ in range(a.sandboxes)]
        for i in range(a.procs):
            bg(w, sids[i % len(sids)], "while :; do seq 1 2000; sleep 0.5; done")
        base = rss_kib(w.proc.pid)
        samples = []
        t_end = time.time() + a.watch
        while True:
            samples.append(rss_kib(w.proc.pid))
            if time.time() >= t_end:
                break
            time.sleep(max(1, a.watch // 6))
        written = 0
        for s in sids:
            ps = w.request("GET", f"/v1/sandboxes/{s}/processes").json()["processes"]
            written += sum(p["output_end"] for p in ps if p["running"])
        rows.append((f"warrend RSS, {a.procs} unread writers: at start", f"{base / 1024:.1f} MiB",
                     ""))
        rows.append((f"  ... after {a.watch} s ({written / MiB:.0f} MiB written, unread)",
                     f"{samples[-1] / 1024:.1f} MiB", f"max {max(samples) / 1024:.1f}"))
        for s in sids:
            w.delete(s)
    finally:
        w.cleanup()

    print_table("Warren process benchmarks", "p50 / value", rows, width=56)

if __name__ == "__main__":
    main()
