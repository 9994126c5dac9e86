"""A pool sandbox's first command, with and without the template's warm-up.

    load/run --first-exec [--n N] [--templates minimal,base] [--pool-size N]
                          [--old-warrend PATH]

For each template, warrends one after the other (jail off, pool_spares 0): with
--old-warrend, that binary first (an older build to compare with; its own
defaults), then this one with pool_template_warmup empty, then with its default
(conf/warren.conf). Each creates N
sandboxes from the pool (refilled and left 0.3 s before each) and times, client
side: the first exec `true`, then `python3 -c pass` where the image has python3
(first and second run), then `true` three more times (steady). Beside them: the
template's build (boot, warm-up, sync, save), its RAM file in /dev/shm, and the
PSS of each waiting pool VM, which is what the warm-up could cost.
"""
import argparse
import os
import platform
import re
import sys
import time

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "tests",
                                "integration"))
from warren import Warren, pss_kib, qemu_pids, shm_name  # noqa: E402
from pool import pct, wait_ready  # noqa: E402


def exec_ms(w, sid, argv):
    t0 = time.perf_counter()
    r = w.exec(sid, argv)
    ms = (time.perf_counter() - t0) * 1e3
    if r.status != 200:
        return None, r
    if r.json()["exit_code"] != 0:
        raise SystemExit(f"{argv} in {sid}: {r.json()}")
    return ms, r


def run(tmpl, kind, a):
    conf = {"pool_size": a.pool_size, "pool_spares": 0, "jail": "off",
            "default_template": tmpl, "pool_max_mb": 512 + 48 * (a.pool_size + 1),
            "max_sandboxes": 2 * a.pool_size + 8}
    if kind == "off":
        conf["pool_template_warmup"] = ""
    w = Warren(conf)
    if kind == "old":
        w.binary = a.old_warrend
    w.start()
    res = {k: [] for k in ("true", "py1", "py2", "steady")}
    try:
        wait_ready(w, a.pool_size)
        log = w.log_all()
        m = re.search(r"pool: template \S+ saved \(VM (\S+), ([0-9.]+) ms from launch\)", log)
        if not m:
            raise SystemExit("no template saved in the log:\n" + log[-2000:])
        # Named after the state dir's tag since it is swept by it; an older warrend's
        # has the VM id alone.
        mem = f"/dev/shm/{shm_name(w, m.group(1))}"
        st = os.stat(mem if os.path.exists(mem) else f"/dev/shm/warren-{m.group(1)}.mem")
        build_ms, ram_mib = float(m.group(2)), st.st_blocks * 512 / 2**20
        if "its warm-up command" in log or (kind == "on" and "warm-up ran in" not in log):
            raise SystemExit("the template's warm-up failed or did not run:\n" + log[-2000:])
        pss = [pss_kib(pid) / 1024 for pid in qemu_pids(w.state_dir)]  # the template's ended
        has_py = True
        for _ in range(a.n):
            wait_ready(w, a.pool_size)
            sid = w.create(template=tmpl)
            if w.get(sid).json()["source"] != "pool":
                raise SystemExit(f"{sid} did not come from the pool")
            time.sleep(0.3)
            res["true"].append(exec_ms(w, sid, ["true"])[0])
            if has_py:
                ms, r = exec_ms(w, sid, ["python3", "-c", "pass"])
                if ms is None:  # no python3 in this image
                    has_py = False
                else:
                    res["py1"].append(ms)
                    res["py2"].append(exec_ms(w, sid, ["python3", "-c", "pass"])[0])
            res["steady"].extend(exec_ms(w, sid, ["true"])[0] for _ in range(3))
            w.delete(sid)
    finally:
        w.cleanup()
    return res, build_ms, ram_mib, pss


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--n", type=int, default=10)
    ap.add_argument("--templates", default="minimal,base")
    ap.add_argument("--pool-size", type=int, default=3)
    ap.add_argument("--old-warrend", help="an older warrend binary, in a column of its own")
    a = ap.parse_args()
    kinds = (["old"] if a.old_warrend else []) + ["off", "on"]
    heads = {"old": "older build", "off": "template warm-up off", "on": "default"}
    print(f"first command after a pool create: {platform.node()}, {os.cpu_count()} CPUs, "
          f"load average {' '.join(f'{x:.2f}' for x in os.getloadavg())}, n={a.n} per cell, "
          "jail off")
    if a.old_warrend:
        print(f"older build: {a.old_warrend}")
    print("| template | measure | " + " | ".join(f"{heads[k]} p50 / p99" for k in kinds) + " |")
    print("|---|---|" + "---|" * len(kinds))

    def cell(xs, unit="ms"):
        return f"{pct(xs, 50):.1f} / {pct(xs, 99):.1f} {unit}" if xs else "-"

    for tmpl in a.templates.split(","):
        out = {k: run(tmpl, k, a) for k in kinds}
        for key, what in (("true", "first exec `true`"), ("py1", "then `python3 -c pass`"),
                          ("py2", "`python3 -c pass` again"), ("steady", "exec `true` steady")):
            if any(out[k][0][key] for k in kinds):
                print(f"| {tmpl} | {what} | " + " | ".join(cell(out[k][0][key]) for k in kinds)
                      + " |")
        print(f"| {tmpl} | template build: boot, warm-up, save | "
              + " | ".join(f"{out[k][1]:.0f} ms" for k in kinds) + " |")
        print(f"| {tmpl} | template RAM file, resident | "
              + " | ".join(f"{out[k][2]:.1f} MiB" for k in kinds) + " |")
        print(f"| {tmpl} | PSS per waiting pool VM | "
              + " | ".join(cell(out[k][3], "MiB") for k in kinds) + " |")
        sys.stdout.flush()


if __name__ == "__main__":
    main()
