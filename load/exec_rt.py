"""Exec round trip against the guest's own fork+exec+wait floor: one table.

    load/run --exec-rt --images DIR [--old-images DIR] [--n N]

Per image set (a sandbox each, all alive at once, measured interleaved so every
set sees the same machine):
- REST exec `true` round trip, client side (POST exec argv ["true"] until the
  200 is read);
- the agent's own time for it, EXEC received to EXIT queued, from the guest's
  /tmp/warren-exec-timing.log: only images whose warren-init was built with
  -DGI_EXEC_TIMING write it (load/exec_rt_images.sh makes such a set); other
  sets show n/a;
- a bare fork + execv("/bin/true") + waitpid inside the same guest, timed by
  warren-init's --spawn-bench mode (run as /proc/1/exe: the helper is PID 1's
  own binary), in blocks between the REST blocks;
- with --prog /bin/true the REST exec skips execvp's PATH search (the default
  PATH has five directories before /bin);
- the ratio REST p50 / bare p50 (the issue's target is <= 1.3x), and the
  agent's median step times (--steps).
"""
import argparse
import os
import statistics
import sys
import time

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "tests",
                                "integration"))
from warren import Warren  # noqa: E402
from bench import pct, print_table  # noqa: E402

def ms2(x):
    return f"{x * 1000:.2f} ms"


LOG = "/tmp/warren-exec-timing.log"
# Segments of the agent's time, between the stamps guest-init/exec.c writes.
STEPS = [("parse request", "in", "parsed"), ("cgroup mkdir + pids.max", "parsed", "cgroup"),
         ("pipes", "cgroup", "pipes"), ("fork (parent side)", "pipes", "forked"),
         ("fork to child running", "pipes", "c_fork"), ("child: reset signals", "c_fork", "c_signals"),
         ("child: setsid", "c_signals", "c_setsid"), ("child: join cgroup", "c_setsid", "c_cgjoin"),
         ("child: oom_score_adj", "c_cgjoin", "c_oom"), ("child: stdio", "c_oom", "c_stdio"),
         ("child: close_range", "c_stdio", "c_close"), ("child: chdir", "c_close", "c_chdir"),
         ("child: to execvp", "c_chdir", "c_exec"),
         ("execvp to start report EOF", "c_exec", "started"),
         ("start report to reaped", "started", "reaped"), ("reaped to EXIT queued", "reaped", "exit"),
         ("EXIT queued to cgroup rmdir done", "exit", "rmdir"),
         ("total: EXEC in to EXIT queued", "in", "exit")]


def timing_lines(w, sid, prog):
    r = w.exec(sid, ["cat", LOG])
    if r.status != 200 or r.json()["exit_code"] != 0:
        return None
    recs = []
    for line in r.json()["stdout"].splitlines():
        f = line.split()
        kv = dict(x.split("=", 1) for x in f[2:])
        if kv.get("argv0") == prog:
            recs.append({k: int(v) for k, v in kv.items() if k != "argv0"})
    return recs


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--images", required=True, help="image set under test")
    ap.add_argument("--old-images", help="image set to compare with, in the same run")
    ap.add_argument("--n", type=int, default=200, help="REST execs and bare spawns per set")
    ap.add_argument("--block", type=int, default=25, help="samples per interleaved block")
    ap.add_argument("--steps", action="store_true", help="also print the agent's step times")
    ap.add_argument("--prog", default="true",
                    help="argv[0] of the REST exec (/bin/true skips execvp's PATH search)")
    a = ap.parse_args()

    sets = [("new", a.images)] + ([("old", a.old_images)] if a.old_images else [])
    if a.old_images:
        sets.reverse()
    env = {}
    ws = []
    try:
        for label, d in sets:
            os.environ["WARREN_IMAGE_DIR"] = os.path.abspath(d)
            w = Warren({"max_sandboxes": 2}).start()
            ws.append((label, w, w.create()))
        for label, w, sid in ws:
            for _ in range(10):  # warm the TCG translation cache and the page cache
                assert w.exec(sid, ["true"]).status == 200
            w.exec(sid, ["rm", "-f", LOG])
            env[label] = {"rest": [], "bare": []}
        done = 0
        while done < a.n:
            k = min(a.block, a.n - done)
            for label, w, sid in ws:
                for _ in range(k):
                    t0 = time.perf_counter()
                    r = w.exec(sid, [a.prog])
                    env[label]["rest"].append(time.perf_counter() - t0)
                    assert r.status == 200 and r.json()["exit_code"] == 0, r
                r = w.exec(sid, ["/proc/1/exe", "--spawn-bench", str(k), "/bin/true"])
                assert r.status == 200 and r.json()["exit_code"] == 0, r
                env[label]["bare"] += [int(x) / 1e6 for x in r.json()["stdout"].split()]
            done += k
        for label, w, sid in ws:
            env[label]["agent"] = timing_lines(w, sid, a.prog)
    finally:
        for _, w, _ in ws:
            w.cleanup()  # stop alone leaves the VMs running (warrend re-adopts them)

    rows = []
    for label, _, _ in ws:
        e = env[label]
        rest, bare, ag = e["rest"], e["bare"], e["agent"]
        tag = f"[{label}: {os.path.basename(os.path.normpath(dict(sets)[label]))}]"
        rows.append((f"{tag} REST exec `{a.prog}` (n={len(rest)})", ms2(pct(rest, 50)),
                     ms2(pct(rest, 99))))
        if ag:
            tot = [(x["exit"] - x["in"]) / 1e6 for x in ag if x["exit"] >= 0]
            rows.append((f"{tag} agent EXEC in -> EXIT queued (n={len(tot)})", ms2(pct(tot, 50)),
                         ms2(pct(tot, 99))))
        else:
            rows.append((f"{tag} agent EXEC in -> EXIT queued", "n/a", "n/a"))
        rows.append((f"{tag} bare fork+exec+wait /bin/true (n={len(bare)})", ms2(pct(bare, 50)),
                     ms2(pct(bare, 99))))
        rows.append((f"{tag} ratio REST / bare (p50; target <= 1.3x)",
                     f"{pct(rest, 50) / pct(bare, 50):.2f}x", ""))
        if ag:
            tot_p50 = pct([(x["exit"] - x["in"]) / 1e6 for x in ag], 50)
            rows.append((f"{tag} ratio agent / bare (p50)", f"{tot_p50 / pct(bare, 50):.2f}x", ""))
    la = os.getloadavg()
    print_table(f"exec round trip vs bare spawn, load average {la[0]:.2f} {la[1]:.2f} {la[2]:.2f},",
                "p50", rows, width=66)
    if a.steps:
        for label, _, _ in ws:
            ag = env[label]["agent"]
            if not ag:
                continue
            srows = []
            for name, s0, s1 in STEPS:
                d = [(x[s1] - x[s0]) / 1e6 for x in ag if x.get(s0, -1) >= 0 and x.get(s1, -1) >= 0]
                if d:
                    srows.append((f"[{label}] {name} (n={len(d)})", ms2(statistics.median(d)),
                                  ms2(pct(d, 99))))
            print_table(f"agent steps, median of each, {label}", "p50", srows, width=66)


if __name__ == "__main__":
    main()
