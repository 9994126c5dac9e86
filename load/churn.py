"""Create/delete churn, many live sandboxes, many frozen ones.

    load/run --churn [--cycles N] [--live N] [--pool-size N] [--freeze-ms MS]
                     [--pageout-ms MS [--zram SIZE]]

One warrend with the warm pool (jail off: clones cannot be jailed yet).
  - churn: N cycles of create (from the pool: each waits for a ready VM), exec
    `echo`, delete; then, once the pool has refilled, what warrend holds (QEMU
    processes, run dirs, RAM files, its fds and RSS) against what it held
    before; then a kill -9 in the middle of a create and a restart, and the same
    check again. Any VM of a deleted sandbox still present is a leak.
  - live: N sandboxes, each from the pool (waiting for a ready VM; --live-boot:
    back to back, booted once the pool is dry; none past --stop-below MiB of
    MemAvailable), left idle until the idle freeze stops them, then one exec each,
    sequentially: how many answered, the exec p50/p99 (each a thaw), the PSS of
    every QEMU and the machine's available memory before and after.
    --pageout-ms: frozen this long, a sandbox's memory goes to swap
    (freeze_pageout_after_ms); the execs wait until all are paged out. --zram
    SIZE makes that swap on /dev/zram0 for the run when the host has none.
Printed, not asserted (the integration test test_pool runs a short churn).
"""
import argparse
import os
import sys
import time

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "tests",
                                "integration"))
from warren import (Warren, held, pss_kib, qemu_pids, rss_kib, swap_kb,  # noqa: E402
                    zram_swap_off, zram_swap_on)
from bench import pct, print_table  # noqa: E402
from pool import pool, wait_ready  # noqa: E402


def mem_available_mib():
    with open("/proc/meminfo") as f:
        for line in f:
            if line.startswith("MemAvailable:"):
                return int(line.split()[1]) // 1024
    return 0


def zram_used_mib():
    """Memory zram holds for what was swapped to it (mm_stat mem_used_total), or 0."""
    try:
        with open("/sys/block/zram0/mm_stat") as f:
            return int(f.read().split()[2]) / 2**20
    except OSError:
        return 0.0


def settle(w, size, gone, timeout=300):
    deadline = time.time() + timeout
    while True:
        wait_ready(w, size, timeout=timeout)
        h = held(w, gone)
        p = pool(w)
        n = size + p["spare"]  # the pool's VMs and its spare QEMU
        if (h["qemu"] == h["run_dirs"] == n and not h["leaked"]) or time.time() > deadline:
            return h
        time.sleep(0.5)


def churn(w, a, rows):
    wait_ready(w, a.pool_size)
    before = held(w)
    rss0 = rss_kib(w.proc.pid)
    gone, lat = [], []
    t0 = time.time()
    for i in range(a.cycles):
        wait_ready(w, 1)
        c0 = time.perf_counter()
        sid = w.create()
        lat.append(time.perf_counter() - c0)
        gone.append(w.vm_id(sid))
        r = w.run(sid, f"echo {i}")
        assert r["stdout"] == f"{i}\n", r
        assert w.delete(sid).status == 200
    took = time.time() - t0
    h = settle(w, a.pool_size, gone)
    time.sleep(7)  # ended sandboxes are kept ended_retention_seconds (5 here), then freed
    rss1 = rss_kib(w.proc.pid)
    rows.append((f"churn: {a.cycles} create+exec+delete cycles", f"{took:.0f} s", ""))
    rows.append(("churn: create (client side)", f"{pct(lat, 50) * 1000:.1f} ms",
                 f"{pct(lat, 99) * 1000:.1f} ms"))
    rows.append(("churn: deleted VMs left (QEMU, run dir or RAM file)", str(len(h["leaked"])), ""))
    rows.append(("churn: QEMUs / run dirs / pool VMs (+ spare QEMU) after",
                 f"{h['qemu']} / {h['run_dirs']} / {a.pool_size} + {pool(w)['spare']:d}", ""))
    rows.append(("churn: templates / RAM files after", f"{h['templates']} / {h['template_mem']}",
                 ""))
    rows.append(("churn: warrend fds before -> after", f"{before['fds']} -> {h['fds']}", ""))
    rows.append(("churn: warrend RSS before -> after (ended ones freed)", f"{rss0} -> {rss1} KiB",
                 ""))
    sid = w.create()
    gone.append(w.vm_id(sid))
    w.kill9()
    w.start()
    assert w.delete(sid).status == 200
    h = settle(w, a.pool_size, gone)
    rows.append(("after kill -9 mid-create + restart: deleted VMs left", str(len(h["leaked"])),
                 ""))
    rows.append(("after kill -9: QEMUs / run dirs / pool VMs (+ spare)",
                 f"{h['qemu']} / {h['run_dirs']} / {a.pool_size} + {pool(w)['spare']:d}", ""))


def count_until_all(w, sids, key, timeout):
    """How many of sids GET says key (true) of, once all do or after timeout s."""
    deadline = time.time() + timeout
    while True:
        n = sum(1 for s in sids if w.get(s).json().get(key))
        if n == len(sids) or time.time() >= deadline:
            return n
        time.sleep(2)


def live(w, a, rows):
    wait_ready(w, a.pool_size)
    avail0 = mem_available_mib()
    sids, src = [], {"pool": 0, "boot": 0}
    t0 = time.time()
    stopped = ""
    for _ in range(a.live):
        if a.live_from_pool:
            wait_ready(w, 1)
        if mem_available_mib() < a.stop_below:
            stopped = f" (stopped: MemAvailable below {a.stop_below} MiB)"
            break
        sid = w.create()
        sids.append(sid)
        src[w.get(sid).json()["source"]] += 1
    took = time.time() - t0
    # Until every one is frozen (or a deadline: then the rest answer running), and paged
    # out if asked.
    frozen = count_until_all(w, sids, "frozen", max(120, len(sids) * 2))
    paged = count_until_all(w, sids, "paged_out", max(120, len(sids) * 0.5)) if a.pageout_ms else 0
    pss, swp = [], []
    for s in sids:
        for pid in qemu_pids(w.vm_id(s)):
            pss.append(pss_kib(pid) / 1024)
            swp.append(swap_kb(pid) / 1024)
    avail1 = mem_available_mib()
    zram1 = zram_used_mib()
    lat, ok = [], 0
    for i, s in enumerate(sids):
        c0 = time.perf_counter()
        r = w.exec(s, f"echo {i}")
        lat.append(time.perf_counter() - c0)
        ok += r.status == 200 and r.json().get("stdout") == f"{i}\n"
    rows.append((f"live: {len(sids)} of {a.live} created back to back (pool {src['pool']}, "
                 f"boot {src['boot']}){stopped}", f"{took:.0f} s", ""))
    rows.append(("live: frozen before the execs", f"{frozen} of {len(sids)}", ""))
    if a.pageout_ms:
        rows.append((f"live: paged out (frozen {a.pageout_ms} ms) before the execs",
                     f"{paged} of {len(sids)}", ""))
    rows.append(("live: answered exec (sequentially)", f"{ok} of {len(sids)}", ""))
    rows.append(("live: exec on a frozen sandbox (thaw + exec)", f"{pct(lat, 50) * 1000:.1f} ms",
                 f"{pct(lat, 99) * 1000:.1f} ms"))
    if pss:
        rows.append(("live: QEMU PSS per sandbox", f"{pct(pss, 50):.1f} MiB",
                     f"{pct(pss, 99):.1f} MiB"))
    if a.pageout_ms and swp:
        rows.append(("live: QEMU swapped out per sandbox (before compression)",
                     f"{pct(swp, 50):.1f} MiB", f"{pct(swp, 99):.1f} MiB"))
        rows.append(("live: zram memory used, per sandbox (compressed)",
                     f"{zram1 / max(1, len(sids)):.1f} MiB", ""))
        rows.append(("live: machine memory per sandbox (MemAvailable drop / count)",
                     f"{(avail0 - avail1) / max(1, len(sids)):.1f} MiB", ""))
    rows.append(("live: machine MemAvailable before -> after", f"{avail0} -> {avail1} MiB", ""))
    for s in sids:
        w.delete(s)


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--cycles", type=int, default=500)
    ap.add_argument("--live", type=int, default=200)
    ap.add_argument("--pool-size", type=int, default=4)
    ap.add_argument("--freeze-ms", type=int, default=3000)
    ap.add_argument("--live-boot", dest="live_from_pool", action="store_false",
                    help="live: create back to back (boot once the pool is dry) instead of "
                    "waiting for a pool VM before each")
    ap.add_argument("--overcommit", type=int, default=1000, help="memory_overcommit_percent")
    ap.add_argument("--stop-below", type=int, default=3072,
                    help="live: create no more once the machine's MemAvailable is below this "
                    "many MiB")
    ap.add_argument("--pageout-ms", type=int, default=0,
                    help="freeze_pageout_after_ms (0: off, as by default here)")
    ap.add_argument("--zram", default="",
                    help="with --pageout-ms: swap of this size on /dev/zram0 for the run, "
                    "when the host has none (e.g. 32G)")
    a = ap.parse_args()
    conf = {"pool_size": str(a.pool_size), "jail": "off", "default_template": "minimal",
            "memory_overcommit_percent": str(a.overcommit),
            "freeze_after_ms": str(a.freeze_ms), "ended_retention_seconds": "5", "max_sandboxes": str(max(a.live + 16, 64)),
            "pool_max_mb": str(max(1024, 256 * a.pool_size)),
            "freeze_pageout_after_ms": str(a.pageout_ms)}
    made_swap = bool(a.zram) and zram_swap_on(a.zram)
    w = Warren(conf).start()
    rows = []
    try:
        if a.cycles:
            churn(w, a, rows)
        if a.live:
            live(w, a, rows)
    finally:
        w.cleanup()
        if made_swap:
            zram_swap_off()
    print_table(f"churn and live sandboxes (load {os.getloadavg()[0]:.1f})", "value", rows,
                width=60)


if __name__ == "__main__":
    main()
