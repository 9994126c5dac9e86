"""Idle freeze: what a thaw adds to the first exec, and what a frozen VM costs.

    load/run --freeze [--n N] [--watch S] [--pageout N]

- exec `true` round trip on a running sandbox beside the same exec on the same
  sandbox while frozen (the thaw: SIGCONT to its QEMU, then the exec), interleaved
  so both see the same machine;
- the same exec on a running sandbox that has been idle as long (a keep_running
  one, never frozen), right before or after each thaw: an exec after ~1.3 s of
  idling pays for caches gone cold (the host's and TCG's), which an exec right
  after another does not, so this is the fair baseline for what the thaw adds;
- warrend's own view of each thaw (debug log): from the thaw to the guest's
  answer to the RESYNC, which the request that woke the sandbox was queued
  right behind (and to QEMU's answer to a QMP cont, for a VM frozen by QMP
  stop: an older warrend's, or before 2026-12-03);
- CPU used by an idle running VM's QEMU (a keep_running sandbox with a
  background `sleep`, never frozen) beside a frozen one's, over the same seconds;
- --pageout N (default 10; 0 skips it): a second warrend that pages frozen VMs out
  to swap at once (freeze_pageout_after_ms 1; swap made on /dev/zram0 for the run
  when the host has none): N rounds of exec `true`, then one on the frozen and paged
  out sandbox; its QEMU's PSS and swap before that exec.

Printed, not asserted. Needs guest images whose warren-init knows RESYNC.
"""
import argparse
import os
import sys
import time

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "tests",
                                "integration"))
from warren import Warren, pss_kib, qemu_pids, swap_kb, zram_swap_off, zram_swap_on  # noqa: E402
from bench import pct, print_table  # noqa: E402

FREEZE_MS = 300  # the reaper looks once a second: frozen within ~1.3 s of idling


def ms(x):
    return f"{x * 1000:.2f} ms"


def cpu_ticks(pid):
    with open(f"/proc/{pid}/stat") as f:
        rest = f.read().rsplit(")", 1)[1].split()
    return int(rest[11]) + int(rest[12])


def frozen(w, sid):
    return w.get(sid).json()["frozen"]


def timed_exec(w, sid):
    t0 = time.perf_counter()
    r = w.exec(sid, ["true"])
    dt = time.perf_counter() - t0
    assert r.status == 200 and r.json()["exit_code"] == 0, r
    return dt


def pageout_rows(a, rows):
    made = zram_swap_on()
    w = Warren({"freeze_after_ms": FREEZE_MS, "freeze_pageout_after_ms": 1}).start()
    try:
        sid = w.create()
        timed_exec(w, sid)
        warm, back, pss, swp = [], [], [], []
        for _ in range(a.pageout):
            warm.append(timed_exec(w, sid))
            deadline = time.time() + 30
            while not w.get(sid).json()["paged_out"]:
                assert time.time() < deadline, w.get(sid).json()
                time.sleep(0.05)
            (pid,) = qemu_pids(w.vm_id(sid))
            pss.append(pss_kib(pid) / 1024)
            swp.append(swap_kb(pid) / 1024)
            back.append(timed_exec(w, sid))
        n = a.pageout
        rows.append((f"page-out: exec `true`, running (n={n})", ms(pct(warm, 50)),
                     ms(pct(warm, 99))))
        rows.append((f"page-out: frozen and paged out: thaw + exec (n={n})", ms(pct(back, 50)),
                     ms(pct(back, 99))))
        rows.append(("page-out: QEMU PSS / swapped while paged out",
                     f"{pct(pss, 50):.1f} / {pct(swp, 50):.1f} MiB", ""))
    finally:
        w.cleanup()
        if made:
            zram_swap_off()


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--n", type=int, default=20, help="exec pairs timed")
    ap.add_argument("--watch", type=float, default=5, help="seconds of CPU sampling")
    ap.add_argument("--pageout", type=int, default=10, help="page-out rounds (0: none)")
    a = ap.parse_args()

    # debug: warrend logs what each thaw took on its side (cont answered, resync answered)
    w = Warren({"freeze_after_ms": FREEZE_MS, "log_level": "debug"}).start()
    rows = []
    try:
        sid = w.create()
        keep = w.create(keep_running=True)
        r = w.request("POST", f"/v1/sandboxes/{keep}/exec",
                      {"cmd": "sleep 3600", "background": True})
        assert r.status == 201, r
        warm, thaw, idle = [], [], []
        timed_exec(w, sid)  # the first exec of a VM warms its translation cache
        timed_exec(w, keep)
        for i in range(a.n):
            warm.append(timed_exec(w, sid))  # running: the previous exec just ended
            deadline = time.time() + 30
            while not frozen(w, sid):
                assert time.time() < deadline, w.get(sid).json()
                time.sleep(0.05)
            # keep idled as long (its last exec was in the previous round); which of the
            # two goes first alternates.
            if i % 2:
                idle.append(timed_exec(w, keep))
            thaw.append(timed_exec(w, sid))
            if not i % 2:
                idle.append(timed_exec(w, keep))
            assert not frozen(w, sid) and not frozen(w, keep)
        rows.append((f"exec `true`, running (n={a.n})", ms(pct(warm, 50)), ms(pct(warm, 99))))
        rows.append((f"exec `true`, frozen: thaw + exec (n={a.n})", ms(pct(thaw, 50)),
                     ms(pct(thaw, 99))))
        rows.append((f"exec `true`, running, idle as long (keep_running; n={a.n})",
                     ms(pct(idle, 50)), ms(pct(idle, 99))))
        d = sorted(t - r for t, r in zip(thaw, idle))
        rows.append(("added by the thaw: frozen - idle as long (pairwise)", ms(pct(d, 50)),
                     ms(pct(d, 99))))
        d = sorted(t - r for t, r in zip(thaw, warm))
        rows.append(("frozen - running right after an exec (pairwise)", ms(pct(d, 50)),
                     ms(pct(d, 99))))
        log = w.log_all()
        for what in ("cont answered", "resync answered"):
            xs = [float(line.rsplit(" in ", 1)[1].split()[0]) / 1000 for line in log.splitlines()
                  if f"{sid}: thaw: {what} in " in line]
            if xs:
                rows.append((f"warrend: thaw to {what} (n={len(xs)})", ms(pct(xs, 50)),
                             ms(pct(xs, 99))))

        deadline = time.time() + 30
        while not frozen(w, sid):
            assert time.time() < deadline
            time.sleep(0.05)
        (fp,), (kp,) = qemu_pids(w.vm_id(sid)), qemu_pids(w.vm_id(keep))
        hz = os.sysconf("SC_CLK_TCK")
        f0, k0, t0 = cpu_ticks(fp), cpu_ticks(kp), time.time()
        time.sleep(a.watch)
        f1, k1, t1 = cpu_ticks(fp), cpu_ticks(kp), time.time()
        assert frozen(w, sid) and not frozen(w, keep)
        share = lambda d: f"{100.0 * d / hz / (t1 - t0):.2f} % of a core"  # noqa: E731
        rows.append((f"QEMU CPU, idle running VM (keep_running), {a.watch:.0f} s", share(k1 - k0),
                     ""))
        rows.append((f"QEMU CPU, frozen VM, same {a.watch:.0f} s", share(f1 - f0), ""))
    finally:
        w.cleanup()
    if a.pageout:
        pageout_rows(a, rows)
    print_table("Idle freeze: thaw on the first exec, CPU of a frozen VM", "p50 / value", rows)


if __name__ == "__main__":
    main()
