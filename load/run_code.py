"""Code runs on code-interpreter sandboxes (docs/API.md "Code contexts and runs").

    load/run --run-code [--n N] [--creates N] [--template code-interpreter]

One warrend (jail off), figures client side:
- run_code("1+1") round trip p50/p99 (JSON answer), against exec `python3 -c 1+1`
  and exec `true` in the same sandbox, N each;
- create -> first run_code answered: by a cold boot (pool off) that then warms
  the kernel (/etc/warren/warm) and runs, against a create from the template's
  pool (pool_templates) whose snapshot holds a warm kernel; when the pool's clones
  have no kernel running (their template was not warmed), that row says so;
- a matplotlib plot to PNG, and a 1 MB DataFrame as HTML, N each;
- PSS of each waiting pool VM of the template.
Needs the template's image (WARREN_CACHE); prints a markdown table.
"""
import argparse
import os
import platform
import sys
import time

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "tests",
                                "integration"))
from warren import Warren, pss_kib, qemu_pids  # noqa: E402
from pool import pct, wait_ready  # noqa: E402

# Both sides at the template's own memory (template_memory_mb), the size its pool holds.
MEM = 1024  # pool_max_mb's unit below: room for the template's RAM file and its clone
PLOT = ("import matplotlib.pyplot as plt\nplt.figure()\n"
        "plt.plot(range(100), [i * i for i in range(100)])\nplt.show()\n")
FRAME = ("import pandas as pd, numpy as np\n"
         "df = pd.DataFrame(np.arange(40000).reshape(4000, 10))\n"
         "pd.set_option('display.max_rows', 5000)\ndf\n")


def timed(fn):
    t0 = time.perf_counter()
    r = fn()
    return (time.perf_counter() - t0) * 1e3, r


def run_code(w, sid, code):
    r = w.request("POST", f"/v1/sandboxes/{sid}/run_code", {"code": code})
    if r.status != 200:
        raise SystemExit(f"run_code {code!r}: {r}")
    out = r.json()
    if out["error"]:
        raise SystemExit(f"run_code {code!r}: {out['error']}")
    return out


def exec_ok(w, sid, argv, **kw):
    r = w.exec(sid, argv, **kw)
    if r.status != 200 or r.json()["exit_code"] != 0:
        raise SystemExit(f"{argv}: {r}")
    return r


def stats(xs):
    return f"{pct(xs, 50):.1f} ms", f"{pct(xs, 99):.1f} ms"


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--n", type=int, default=50)
    ap.add_argument("--creates", type=int, default=3)
    ap.add_argument("--template", default="code-interpreter")
    a = ap.parse_args()
    rows = []

    # Cold boots, pool off: create, warm, first run.
    w = Warren({"jail": "off", "pool_size": 0, "pool_on_first_use": "false"})
    w.start()
    try:
        cold = []
        for i in range(a.creates):
            t0 = time.perf_counter()
            sid = w.create(template=a.template)
            exec_ok(w, sid, "/etc/warren/warm", timeout_seconds=900)
            run_code(w, sid, "1+1")
            cold.append((time.perf_counter() - t0) * 1e3)
            if i < a.creates - 1:
                w.delete(sid)
        rows.append((f"create -> first run_code, cold boot + warm (n={a.creates})",
                     f"{pct(cold, 50) / 1e3:.1f} s", ""))
        rc = [timed(lambda: run_code(w, sid, "1+1"))[0] for _ in range(a.n)]
        py = [timed(lambda: exec_ok(w, sid, ["python3", "-c", "1+1"]))[0] for _ in range(a.n)]
        tr = [timed(lambda: exec_ok(w, sid, ["true"]))[0] for _ in range(a.n)]
        rows.append((f"run_code(\"1+1\") round trip (n={a.n})", *stats(rc)))
        rows.append((f"exec `python3 -c 1+1` round trip (n={a.n})", *stats(py)))
        rows.append((f"exec `true` round trip (n={a.n})", *stats(tr)))
        png = [timed(lambda: run_code(w, sid, PLOT))[0] for _ in range(max(3, a.n // 5))]
        out = run_code(w, sid, PLOT)
        assert any("png" in r for r in out["results"]), out
        rows.append((f"matplotlib plot to PNG (n={len(png)})", *stats(png)))
        html_len = max(len(r.get("html", "")) for r in run_code(w, sid, FRAME)["results"])
        fr = [timed(lambda: run_code(w, sid, FRAME))[0] for _ in range(max(3, a.n // 5))]
        rows.append((f"DataFrame as HTML, {html_len / 1e6:.1f} MB (n={len(fr)})", *stats(fr)))
    finally:
        w.cleanup()

    # The template's pool: its clones' first run.
    w = Warren({"jail": "off", "pool_size": 1, "default_template": a.template,
                "pool_spares": 0, "pool_max_mb": 4 * MEM})
    w.start()
    try:
        wait_ready_tpl(w, a.template, 900)
        pss = [pss_kib(pid) / 1024 for pid in qemu_pids(w.state_dir)]
        first = []
        for _ in range(a.creates):
            wait_ready_tpl(w, a.template, 900)
            t0 = time.perf_counter()
            sid = w.create(template=a.template)
            r = w.request("POST", f"/v1/sandboxes/{sid}/run_code", {"code": "1+1"})
            ms = (time.perf_counter() - t0) * 1e3
            if r.status != 200:
                first = None
                rows.append(("create -> first run_code, from the pool",
                             f"no kernel in the clone: {r.json()['error']['code']}", ""))
                break
            first.append(ms)
            w.delete(sid)
        if first:
            rows.append((f"create -> first run_code, from the pool (n={len(first)})",
                         *stats(first)))
            rows.append(("ratio cold / pool", f"{pct(cold, 50) / pct(first, 50):.0f}x", ""))
        rows.append(("PSS of a waiting pool VM of the template",
                     f"{max(pss) if pss else float('nan'):.1f} MiB", ""))
    finally:
        w.cleanup()

    print(f"{time.strftime('%Y-%m-%d %H:%M UTC', time.gmtime())}, {platform.node()}, "
          f"{os.cpu_count()} cores, load {os.getloadavg()[0]:.2f}")
    print("| measure | p50 / value | p99 |\n|---|---|---|")
    for r in rows:
        print(f"| {r[0]} | {r[1]} | {r[2]} |")


def wait_ready_tpl(w, tmpl, timeout):
    """Until the template's pool has a VM ready."""
    deadline = time.time() + timeout
    while time.time() < deadline:
        r = w.request("GET", "/v1/templates")
        for t in r.json().get("templates", []):
            for p in t.get("pools", []) if t["name"] == tmpl else []:
                if p.get("ready", 0) >= 1 and not p.get("filling"):
                    return
        time.sleep(0.2)
    raise SystemExit(f"the {tmpl} pool never had a VM ready")


if __name__ == "__main__":
    main()
