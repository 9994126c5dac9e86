"""What an idle sandbox costs in memory against how fast it stays, per TCG
translation cache size (against the PSS target of load/targets.py), side by side in
one run.

    load/run --idle-mem [--tb 8,16,32,128,128h] [--n 4] [--execs 20] [--template minimal]

For each cache size (conf tcg_translation_cache_mb; a trailing h: with
tcg_huge_pages on) one warrend, jail off, pool_size N, freeze after 2 s. Measured:
  - a waiting pool VM: PSS and private memory of its QEMU (/proc/PID/smaps_rollup);
  - N sandboxes from the pool: the first exec `true`, then steady ones, then a
    heavier command (a shell loop over ls, sort, awk: more guest code to
    translate), each sandbox's QEMU memory once it is frozen, and the thaw + exec.
Private memory is what each more sandbox costs: the shared part (QEMU's binary and
libraries, the template's RAM file) is paid once however many there are.
"""
import argparse
import os
import platform
import sys
import time

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "tests",
                                "integration"))
from warren import Warren, qemu_pids  # noqa: E402

HEAVY = ("i=0; while [ $i -lt 3 ]; do ls -lR /bin /etc /sbin | sort | "
         "awk '{n+=length($0)} END {print n}' >/dev/null; i=$((i+1)); done")
FREEZE_MS = 2000


def smaps(pid):
    out = {}
    with open(f"/proc/{pid}/smaps_rollup") as f:
        for line in f:
            k, _, v = line.partition(":")
            if v.strip().endswith("kB"):
                out[k] = int(v.split()[0])
    return out


def mib(pid, *keys):
    s = smaps(pid)
    return sum(s.get(k, 0) for k in keys) / 1024


def pct(xs, p):
    xs = sorted(xs)
    return xs[min(len(xs) - 1, int(round(p / 100.0 * (len(xs) - 1))))]


def timed(w, sid, cmd):
    t0 = time.perf_counter()
    r = w.exec(sid, cmd)
    ms = (time.perf_counter() - t0) * 1e3
    assert r.status == 200 and r.json()["exit_code"] == 0, r
    return ms


def wait_pool(w, n, timeout=180):
    deadline = time.time() + timeout
    while time.time() < deadline:
        p = w.request("GET", "/healthz").json()["pool"]
        if p and p["state"] == "ready" and p["ready"] >= n and not p["filling"]:
            return
        time.sleep(0.05)
    raise SystemExit("the pool never filled")


def one(col, a):
    tb = int(col.rstrip("h"))
    w = Warren({"pool_size": a.n, "pool_spares": 0, "jail": "off",
                "tcg_huge_pages": "true" if col.endswith("h") else "false",
                "default_template": a.template, "tcg_translation_cache_mb": tb,
                "freeze_after_ms": FREEZE_MS, "pool_max_mb": 2048,
                "max_sandboxes": 4 * a.n + 8}).start()
    res = {}
    try:
        wait_pool(w, a.n)
        time.sleep(1)
        pids = qemu_pids(w.state_dir)
        res["wait_priv"] = [mib(p, "Private_Dirty", "Private_Clean") for p in pids]
        res["wait_pss"] = [mib(p, "Pss") for p in pids]
        sids = [w.create(template=a.template) for _ in range(a.n)]
        res["first"] = [timed(w, s, ["true"]) for s in sids]
        res["steady"] = [timed(w, s, ["true"]) for s in sids for _ in range(a.execs)]
        res["heavy1"] = [timed(w, s, HEAVY) for s in sids]
        res["heavy"] = [timed(w, s, HEAVY) for s in sids for _ in range(2)]
        res["steady2"] = [timed(w, s, ["true"]) for s in sids for _ in range(a.execs)]
        deadline = time.time() + 60
        while not all(w.get(s).json()["frozen"] for s in sids):
            assert time.time() < deadline, "the sandboxes never froze"
            time.sleep(0.2)
        vpids = [qemu_pids(w.vm_id(s))[0] for s in sids]
        res["frozen_priv"] = [mib(p, "Private_Dirty", "Private_Clean") for p in vpids]
        res["frozen_pss"] = [mib(p, "Pss") for p in vpids]
        res["thaw"] = [timed(w, s, ["true"]) for s in sids]
        for s in sids:
            w.delete(s)
    finally:
        w.cleanup()
    return res


ROWS = [
    ("waiting pool VM: private MiB", "wait_priv"),
    ("waiting pool VM: PSS MiB", "wait_pss"),
    ("first exec `true` after create, ms", "first"),
    ("exec `true` steady, ms", "steady"),
    ("heavy command, first run, ms", "heavy1"),
    ("heavy command, again, ms", "heavy"),
    ("exec `true` after the heavy runs, ms", "steady2"),
    ("frozen sandbox after those: private MiB", "frozen_priv"),
    ("frozen sandbox after those: PSS MiB", "frozen_pss"),
    ("thaw + exec `true`, ms", "thaw"),
]


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--tb", default="8,16,32,128,128h")
    ap.add_argument("--n", type=int, default=4)
    ap.add_argument("--execs", type=int, default=20)
    ap.add_argument("--template", default="minimal")
    a = ap.parse_args()
    sizes = a.tb.split(",")
    results = {tb: one(tb, a) for tb in sizes}
    la = os.getloadavg()
    print(f"warren idle memory by TCG translation cache: {platform.node()}, "
          f"{os.cpu_count()} CPUs, load average {la[0]:.2f} {la[1]:.2f} {la[2]:.2f}, "
          f"n {a.n}, template {a.template}; p50 (max)")
    print("| measure | " + " | ".join(f"{tb.rstrip('h')} MiB" + (", huge pages" if tb.endswith("h")
                                                                  else "")
                                      for tb in sizes) + " |")
    print("|---|" + "---|" * len(sizes))
    for name, key in ROWS:
        cells = [f"{pct(results[tb][key], 50):.1f} ({max(results[tb][key]):.1f})"
                 for tb in sizes]
        print(f"| {name} | " + " | ".join(cells) + " |")


if __name__ == "__main__":
    main()
