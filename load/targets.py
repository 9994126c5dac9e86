"""The performance targets in one table: every benchmark they name, run one after the other
on this machine, each figure beside its target and whether it is met.

    load/run --targets [--quick] [--churn] [--zram SIZE]

Runs, each in its own warrends (their own tables are printed as they finish):
  - load/pool.py --creates 500 (--quick: 50): create from the pool server and client
    side, the cold boot beside it and the ratio, the pool run dry and refilled, a
    create with the pool empty, PSS per waiting pool VM, exec on a pool sandbox
    against a booted one;
  - load/snap.py: fork (count 1 and 8), pause and resume, of a booted sandbox and of a
    pool sandbox;
  - load/freeze.py: what a thaw adds to the first exec;
  - load/exec_rt.py over the cached images: exec `true` against a bare spawn in the
    same guest;
  - with --churn, load/churn.py: 500 create/delete cycles and a kill -9 (what
    is left), then sandboxes frozen and each exec'd: 200, or with --zram SIZE 1,000
    paged out to a swap on zram made for the run.
The rows come back through $WARREN_ROWS (bench.emit_rows) and are matched by
their measure's name; a row not found prints as "not measured", never as met.
Printed, not asserted: figures move with the machine's load (load/RESULTS.md).
"""
import argparse
import json
import os
import platform
import re
import subprocess
import sys
import tempfile
import time

HERE = os.path.dirname(os.path.abspath(__file__))
PY = sys.executable

# (what, source, measure regex, column 1 = p50 / 2 = p99, target op, target, unit)
# op None: shown for context, no target of its own.
TARGETS = [
    ("create from the pool, server side, p50", "pool", r"^create from the pool, server side", 1,
     "<=", 5, "ms"),
    ("create from the pool, server side, p99", "pool", r"^create from the pool, server side", 2,
     "<=", 20, "ms"),
    ("create from the pool, client side, p50", "pool", r"^create from the pool, client side", 1,
     None, None, "ms"),
    ("create by cold boot, server side, p50", "pool", r"^create by cold boot, server side", 1,
     None, None, "ms"),
    ("ratio cold boot / pool create, server side", "pool", r"^ratio cold boot / pool, p50 server",
     1, ">=", 100, "x"),
    ("create with the pool empty (into a spare QEMU), server side, p50", "pool",
     r"^create with the pool empty, into its spare QEMU, server side", 1, "<=", 50, "ms"),
    ("create with the pool and spare gone (a new QEMU), server side, p50", "pool",
     r"^create with the pool and spare gone, a new QEMU, server side", 1, None, None, "ms"),
    ("creates per second while the pool lasts", "pool", r"^creates/s while the pool lasts", 1,
     None, None, "/s"),
    ("refill after the pool ran dry", "pool", r"^refill to \d+ ready", 1, None, None, "s"),
    ("another template: its first create (a boot, its pool built beside it)", "pool",
     r"^\S+ \(not the default template\): its first create", 1, None, None, "ms"),
    ("another template: create from its pool made on first use, server side, p50", "pool",
     r"^\S+: create from its pool made on first use, server side", 1, None, None, "ms"),
    ("fork of a pool sandbox, count 1, p50", "snap",
     r"^fork of a pool sandbox \(delta.*: count 1 ", 1, "<=", 200, "ms"),
    ("fork of a pool sandbox, count 8, p50", "snap",
     r"^fork of a pool sandbox \(delta.*: count 8 ", 1, "<=", 500, "ms"),
    ("fork of a booted sandbox, count 1, p50", "snap", r"^fork of a booted sandbox.*: count 1 ",
     1, "<=", 200, "ms"),
    ("fork of a booted sandbox, count 8, p50", "snap", r"^fork of a booted sandbox.*: count 8 ",
     1, "<=", 500, "ms"),
    ("pause of a pool sandbox, p50", "snap", r"^pause of a pool sandbox \(delta, \d+ spares\)", 1,
     "<=", 150, "ms"),
    ("resume of a pool sandbox, p50", "snap", r"^resume of a pool sandbox \(delta, \d+ spares\)",
     1, "<=", 50, "ms"),
    ("pause of a booted sandbox, p50", "snap", r"^pause of a booted sandbox .* \(n=", 1, "<=",
     150, "ms"),
    ("resume of a booted sandbox, p50", "snap", r"^resume of a booted sandbox [^,]*\(n=", 1, "<=",
     50, "ms"),
    ("snapshot of a booted sandbox, p50", "snap", r"^snapshot \(n=", 1, None, None, "ms"),
    ("thaw: added to the first exec, p50", "freeze", r"^added by the thaw", 1, "<=", 1, "ms"),
    ("PSS per waiting pool VM, p50", "pool", r"^PSS per waiting pool VM", 1, "<=", 25, "MiB"),
    ("exec `true` / bare fork+exec+wait in the same guest", "exec_rt", r"ratio REST / bare", 1,
     "<=", 1.3, "x"),
    ("exec `true` steady, pool sandbox, p50", "pool", r"^exec `true` steady, pool sandbox", 1,
     None, None, "ms"),
    ("exec `true` steady, booted sandbox, p50", "pool", r"^exec `true` steady, booted sandbox",
     1, None, None, "ms"),
    ("first exec `true` after a pool create, p50", "pool",
     r"^first exec `true` after a pool create", 1, None, None, "ms"),
    ("first exec `true` after a create into a spare QEMU, p50", "pool",
     r"^first exec `true` after a clone create", 1, None, None, "ms"),
    ("first exec `true` after a cold boot, p50", "pool", r"^first exec `true` after a cold boot",
     1, None, None, "ms"),
    ("churn: deleted VMs left after 500 cycles", "churn", r"^churn: deleted VMs left", 1, "<=", 0,
     ""),
    ("after a kill -9 of warrend: deleted VMs left", "churn", r"^after kill -9 .*deleted VMs left",
     1, "<=", 0, ""),
    ("live frozen sandboxes that answered an exec, one after another", "churn",
     r"^live: answered exec", 1, ">=", 1000, ""),
]


def number(cell):
    m = re.search(r"-?[0-9][0-9,]*\.?[0-9]*", cell or "")
    return float(m.group(0).replace(",", "")) if m else None


def run(name, argv, rows_path, log):
    print(f"== {name}: {' '.join(argv)}", flush=True)
    t0 = time.time()
    env = dict(os.environ, WARREN_ROWS=rows_path)
    r = subprocess.run(argv, env=env, cwd=os.path.dirname(HERE))
    took = time.time() - t0
    log.append((name, r.returncode, took))
    print(f"== {name}: exit {r.returncode} after {took:.0f} s", flush=True)


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--quick", action="store_true", help="50 pool creates, fewer rounds")
    ap.add_argument("--churn", action="store_true", help="also load/churn.py (longer)")
    ap.add_argument("--zram", default="", help="with --churn: 1,000 live sandboxes paged out "
                    "to a swap of this size on zram (~32 MiB each: 32G)")
    ap.add_argument("--images", default=os.path.expanduser("~/.cache/warren/images/current"),
                    help="image set for exec_rt (the cached one)")
    a = ap.parse_args()

    fd, rows_path = tempfile.mkstemp(prefix="warren-rows-", suffix=".jsonl")
    os.close(fd)
    log = []
    la0 = os.getloadavg()
    try:
        runs = [
            ("pool", [PY, f"{HERE}/pool.py", "--creates", "50" if a.quick else "500", "--boots",
                      "6", "--execs", "20"]),
            ("snap", [PY, f"{HERE}/snap.py", "--n", "3" if a.quick else "5", "--restarts", "0"]),
            ("freeze", [PY, f"{HERE}/freeze.py", "--n", "20" if a.quick else "40", "--pageout",
                        "0"]),
            ("exec_rt", [PY, f"{HERE}/exec_rt.py", "--images", a.images, "--n",
                         "50" if a.quick else "200"]),
        ]
        if a.churn:
            c = [PY, f"{HERE}/churn.py"]
            if a.zram:
                # as in load/RESULTS.md: paged out 2 s after the freeze
                c += ["--live", "1000", "--pageout-ms", "2000", "--zram", a.zram]
            runs.append(("churn", c))
        for name, argv in runs:
            with open(rows_path, "a") as f:
                f.write(json.dumps({"source": name}) + "\n")
            run(name, argv, rows_path, log)
        by_src, src = {}, None
        with open(rows_path) as f:
            for line in f:
                o = json.loads(line)
                if "source" in o:
                    src = o["source"]
                else:
                    by_src.setdefault(src, []).append(o["row"])
    finally:
        os.unlink(rows_path)

    la1 = os.getloadavg()
    print(f"\nIssue 8's targets on {platform.node()} ({os.cpu_count()} cores, "
          f"{platform.machine()}, kernel {platform.release()}), "
          f"{time.strftime('%Y-%m-%d %H:%M UTC', time.gmtime())}; load average "
          f"{la0[0]:.2f} at the start, {la1[0]:.2f} at the end; runs: "
          + ", ".join(f"{n} {t:.0f} s" + (f" (exit {rc})" if rc else "") for n, rc, t in log))
    print("| measure | value | target | met |")
    print("|---|---|---|---|")
    met = missed = 0
    for what, src, rx, col, op, target, unit in TARGETS:
        if src == "churn" and not a.churn:
            continue
        if src == "churn" and target == 1000 and not a.zram:
            op = None  # 200 live without swap: the 1,000 need --zram (load/RESULTS.md)
        row = next((r for r in by_src.get(src, []) if re.search(rx, r[0])), None)
        cell = row[col].strip() if row and len(row) > col else ""
        v = number(cell)
        if v is None:
            verdict, shown = "not measured", "-"
        elif op is None:
            verdict, shown = "", cell
        else:
            ok = v <= target if op == "<=" else v >= target
            verdict, shown = ("yes" if ok else "**no**"), cell
            met, missed = met + ok, missed + (not ok)
        tgt = f"{op.replace('<=', '≤').replace('>=', '≥')} {target:g} {unit}".strip() if op else ""
        print(f"| {what} | {shown} | {tgt} | {verdict} |")
    print(f"\n{met} met, {missed} missed.")


if __name__ == "__main__":
    main()
