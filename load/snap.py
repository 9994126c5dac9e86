"""Snapshots, fork, pause and resume: latencies, client side.

    load/run --snap [--n N] [--fork8 N] [--gap S] [--set KEY=VALUE ...]

On one booted sandbox (pool off: its RAM goes whole into each snapshot, and
into a RAM file of its own at a fork or pause, jail off) with
a background loop running:
- snapshot: POST /snapshot until 201 (the VM stops for the save and the disk
  copy, then continues);
- create from a snapshot: POST /v1/sandboxes {snapshot_id} until 201 (a VM
  restored, continued, its session up);
- fork count 1 and count 8: POST /fork until 201 (one snapshot, then the
  restores);
- pause (POST /pause until 200: save + disk copy + QEMU ended; the first writes
  the sandbox's RAM into a file of its own, the later ones deltas over it) and resume
  (POST /resume until 200: restore + session); then three resumes, each --gap
  seconds after its pause (on these machines memory freed for longer than ~1 s
  goes back to the hypervisor, and touching it again costs ~1-2 ms per MiB:
  load/RESULTS.md); then --restarts booted sandboxes paused, warrend killed
  with -9 and started again, and each resumed: a new warrend has no checksum
  of their RAM files in memory, so each resume reads its file (from the page
  cache) to check it, beside QEMU's start.
Then the same forks of a sandbox from the pool (a second warrend, pool on,
pool_spares --spares): its fork snapshot is a delta (device state and the pages
it owns over the template's RAM), with the delta's size beside it, and each fork
is restored into a spare QEMU started ahead (the spares are back before each
round); its pauses and resumes, deltas too (the first, which copies the
template's RAM file to disk, apart), each resume into a spare; then the forks
of a pool sandbox running nothing.
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
from test_pool import pool, wait_pool_ready, wait_spares_ready  # noqa: E402


def wait_spares(w, n, prefault_s=5.0):
    """n spares past their start-up, and (under TCG, pool_spare_prefault_mb on) their
    translation buffers touched ahead, as they would be after a few seconds' wait."""
    wait_spares_ready(w, n)
    deadline = time.time() + prefault_s
    while pool(w).get("spares_prefaulted", 0) < n and time.time() < deadline:
        time.sleep(0.05)


def ms(x):
    return f"{x * 1000:.0f} ms"


def timed(fn):
    t0 = time.perf_counter()
    r = fn()
    return time.perf_counter() - t0, r


def counting_sandbox(w):
    """A sandbox with a background loop counting in /tmp/c."""
    sid = w.create()
    r = w.request("POST", f"/v1/sandboxes/{sid}/exec",
                  {"cmd": "i=0; while :; do i=$((i+1)); echo $i > /tmp/c; sleep 0.2; done",
                   "background": True})
    assert r.status == 201, r
    w.run(sid, "true")
    return sid


def forks(w, sid, a, rows, what):
    """Fork count 1 and 8 of sid, each fork deleted before the next round."""
    size = []
    for count, rounds in ((1, a.n), (8, a.fork8)):
        xs = []
        for _ in range(rounds):
            dt, r = timed(lambda: w.request("POST", f"/v1/sandboxes/{sid}/fork",
                                            {"count": count, "ttl_seconds": 600}))
            assert r.status == 201, (r, w.log_text())
            xs.append(dt)
            s = w.request("GET", f"/v1/snapshots/{r.json()['snapshot_id']}").json()
            size.append(s["size_bytes"])
            for f in r.json()["sandboxes"]:
                w.delete(f["id"])
            if "spares" in what:
                wait_spares(w, a.spares)
        rows.append((f"{what}: count {count} (n={rounds})", ms(pct(xs, 50)), ms(pct(xs, 99))))
    rows.append((f"{what}: its snapshot's files", f"{pct(size, 50) / 2**20:.1f} MiB", ""))


def pause_resume(w, sid, n, rows, what, gap=0.0):
    """n pauses, each resumed at once, or gap seconds later (rows for the resume only)."""
    pause, resume = [], []
    for _ in range(n):
        dt, r = timed(lambda: w.request("POST", f"/v1/sandboxes/{sid}/pause", {}))
        assert r.status == 200 and r.json()["state"] == "paused", r
        pause.append(dt)
        time.sleep(gap)
        dt, r = timed(lambda: w.request("POST", f"/v1/sandboxes/{sid}/resume", {}))
        assert r.status == 200 and r.json()["state"] == "running", r
        resume.append(dt)
        assert w.run(sid, "cat /tmp/c")["exit_code"] == 0
    if gap:
        rows.append((f"resume of {what}, {gap:g} s after its pause (n={n})", ms(pct(resume, 50)),
                     ms(pct(resume, 99))))
        return
    rows.append((f"pause of {what} (n={n})", ms(pct(pause, 50)), ms(pct(pause, 99))))
    rows.append((f"resume of {what} (n={n})", ms(pct(resume, 50)), ms(pct(resume, 99))))


def resume_after_restart(w, n, rows):
    """n booted sandboxes paused, warrend killed (-9) and started again, each resumed:
    the first restore over each RAM file in a warrend's life reads it to check its
    checksum."""
    sids = [w.create() for _ in range(n)]
    for sid in sids:
        w.run(sid, "true")
        r = w.request("POST", f"/v1/sandboxes/{sid}/pause", {})
        assert r.status == 200, r
    w.kill9()
    w.start()
    resume = []
    for sid in sids:
        time.sleep(0.5)
        dt, r = timed(lambda: w.request("POST", f"/v1/sandboxes/{sid}/resume", {}))
        assert r.status == 200, r
        resume.append(dt)
        w.delete(sid)
    rows.append((f"resume of a booted sandbox after a warrend restart (checks its RAM file) "
                 f"(n={n})", ms(pct(resume, 50)), ms(pct(resume, 99))))


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--n", type=int, default=5, help="rounds of each (fork 8: --fork8)")
    ap.add_argument("--fork8", type=int, default=2, help="rounds of fork count 8")
    ap.add_argument("--gap", type=float, default=3.0,
                    help="seconds paused before the resumes timed apart (0: none)")
    ap.add_argument("--restarts", type=int, default=3,
                    help="booted sandboxes resumed after a warrend restart (0: none)")
    ap.add_argument("--spares", type=int, default=8,
                    help="pool_spares of the pool's warrend (a fork of 8 takes 8)")
    ap.add_argument("--set", action="append", default=[], metavar="KEY=VALUE",
                    help="a conf option for both warrends (repeatable)")
    a = ap.parse_args()
    extra = dict(kv.split("=", 1) for kv in a.set)

    w = Warren({"jail": "off", "max_sandboxes": "64", **extra}).start()
    rows = []
    try:
        sid = counting_sandbox(w)

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

        # Unjailed, a booted sandbox's fork writes its RAM into a file the forks map.
        forks(w, sid, a, rows, "fork of a booted sandbox (a RAM file of its own)")

        # Its first pause writes its RAM into a file its resumes map; later ones are
        # deltas over that file.
        pause_resume(w, sid, a.n, rows, "a booted sandbox (its own RAM file)")
        if a.gap:
            pause_resume(w, sid, 3, rows, "a booted sandbox (its own RAM file)", a.gap)
        if a.restarts:
            resume_after_restart(w, a.restarts, rows)
        with open("/proc/loadavg") as f:
            load = f.read().split()[:3]
    finally:
        w.cleanup()
    w = Warren({"jail": "off", "max_sandboxes": "64", "pool_size": "2",
                "pool_spares": str(a.spares), "default_template": "minimal", **extra}).start()
    try:
        wait_pool_ready(w, 2)
        sid = counting_sandbox(w)
        wait_spares(w, a.spares)
        forks(w, sid, a, rows, f"fork of a pool sandbox (delta, {a.spares} spares)")
        # Its first pause copies the template's RAM file into state_dir/bases/ (once
        # per template build): timed apart.
        wait_spares(w, a.spares)
        pause_resume(w, sid, 1, rows, "a pool sandbox, first (copies the RAM file)")
        wait_spares(w, a.spares)
        pause_resume(w, sid, a.n, rows, f"a pool sandbox (delta, {a.spares} spares)")
        if a.gap:
            wait_spares(w, a.spares)
            pause_resume(w, sid, 3, rows, "a pool sandbox (delta)", a.gap)
        w.delete(sid)
        # The same without the loop: every fork of the one above runs it too (a
        # `sleep` spawned every 0.2 s in each of nine guests under TCG).
        idle = w.create()
        w.run(idle, "true")
        wait_spares(w, a.spares)
        forks(w, idle, a, rows, f"fork of an idle pool sandbox (delta, {a.spares} spares)")
    finally:
        w.cleanup()
    print_table("Snapshots, fork, pause, resume (256 MiB guest, client side)", "p50 / p99",
                rows)
    print(f"load average at the end: {' '.join(load)}")


if __name__ == "__main__":
    main()
