"""The warm pool against a cold boot, side by side in one run.

    load/run --pool [--creates N] [--boots N] [--execs N] [--pool-size N] [--jail auto|off]
                    [--other TEMPLATE] [--set KEY=VALUE ...]

One warrend with pool_size N (jailed as by default, or --jail off), the minimal
template as default. Measures:
  - create from the pool, the pool refilled before each (N creates, each deleted):
    server side (warrend's "running (X ms after create)" log line: request in to
    guest ready, the 201 follows at once) and client side (POST to 201);
  - back-to-back creates until the pool runs dry, creates/s while it lasts, and
    the refill time back to N ready;
  - creates while the pool is empty (each gets a clone of the template restored
    for it, into the pool's spare QEMU started ahead);
  - cold boots in the same warrend (memory_mb 255, a shape the pool does not hold);
  - exec `true`: the first one right after create, and steady state, on a pool
    sandbox and on a booted one (a clone's QEMU starts with an empty TCG cache);
  - then, in a second warrend (pool_on_first_use on), creates of another template
    (--other, base by default): its first boots and has its pool built, the ones
    after it are hand-outs from that pool. --other "" skips it.
"""
import argparse
import os
import platform
import re
import sys
import time

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "tests",
                                "integration"))
from warren import Warren, pss_kib, qemu_pids  # noqa: E402
from bench import emit_rows  # noqa: E402




def pct(xs, p):
    xs = sorted(xs)
    return xs[min(len(xs) - 1, int(round(p / 100.0 * (len(xs) - 1))))]


def pool(w):
    return w.request("GET", "/healthz").json()["pool"]


def wait_ready(w, n, timeout=120):
    deadline = time.time() + timeout
    while time.time() < deadline:
        p = pool(w)
        if p and p["state"] == "ready" and p["ready"] >= n and not p["filling"]:
            return
        time.sleep(0.02)
    raise SystemExit(f"pool never had {n} ready: {pool(w)}")


def server_ms(w, sid):
    """warrend's own request-in to guest-ready time for sid, from its log."""
    m = re.search(re.escape(sid) + r": running \(([0-9.]+) ms after create\)", w.log_all())
    return float(m.group(1)) if m else float("nan")


def create(w, **kw):
    t0 = time.perf_counter()
    sid = w.create(**kw)
    return sid, (time.perf_counter() - t0) * 1e3


def exec_ms(w, sid):
    t0 = time.perf_counter()
    r = w.exec(sid, ["true"])
    assert r.status == 200 and r.json()["exit_code"] == 0, r
    return (time.perf_counter() - t0) * 1e3


def row(rows, what, xs, unit="ms"):
    rows.append((what, f"{pct(xs, 50):.1f} {unit}", f"{pct(xs, 99):.1f} {unit}",
                 f"{max(xs):.1f} {unit}"))


def other_ready(w, tmpl):
    """Until the pool of template tmpl (made on first use) holds a VM and fills none."""
    deadline = time.time() + 180
    while time.time() < deadline:
        ps = [p for p in pool(w)["templates"] if p["template"] == tmpl]
        if ps and ps[0]["state"] == "ready" and ps[0]["ready"] >= 1 and not ps[0]["filling"]:
            return
        time.sleep(0.02)
    raise SystemExit(f"no pool of {tmpl} ready: {pool(w)}")


def other_template(a, rows):
    """Creates of a template other than the default: the first boots and has its pool
    built beside it (pool_on_first_use), the ones after it come from that pool."""
    tmpl, tpl_mb = a.other, 512 if a.jail != "off" else 256
    w = Warren({"pool_size": 1, "jail": a.jail, "default_template": "minimal",
                "pool_max_mb": 2 * tpl_mb + 48 * 4, **dict(kv.split("=", 1) for kv in a.set)})
    w.start()
    try:
        wait_ready(w, 1)
        t0 = time.perf_counter()
        sid, ms = create(w, template=tmpl)
        assert w.get(sid).json()["source"] == "boot", w.get(sid).json()
        first_srv = server_ms(w, sid)
        w.delete(sid)
        other_ready(w, tmpl)
        built = time.perf_counter() - t0
        srv, cli = [], []
        for _ in range(a.boots):
            other_ready(w, tmpl)
            sid, ms2 = create(w, template=tmpl)
            assert w.get(sid).json()["source"] == "pool", w.get(sid).json()
            cli.append(ms2)
            srv.append(server_ms(w, sid))
            assert w.run(sid, "echo ok")["stdout"] == "ok\n"
            w.delete(sid)
    finally:
        w.cleanup()
    rows.append((f"{tmpl} (not the default template): its first create, a boot, server side",
                 f"{first_srv:.1f} ms", "", ""))
    rows.append((f"{tmpl}: its pool ready, from that first create", f"{built:.2f} s", "", ""))
    row(rows, f"{tmpl}: create from its pool made on first use, server side (n={a.boots})", srv)
    row(rows, f"{tmpl}: create from its pool made on first use, client side (n={a.boots})", cli)


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--creates", type=int, default=50)
    ap.add_argument("--boots", type=int, default=5)
    ap.add_argument("--execs", type=int, default=30)
    ap.add_argument("--pool-size", type=int, default=4)
    ap.add_argument("--jail", choices=("auto", "off"), default="auto")
    ap.add_argument("--other", default="base",
                    help="a template pooled on first use, measured after ('': none)")
    ap.add_argument("--set", action="append", default=[], metavar="KEY=VALUE",
                    help="a conf option for the warrend (repeatable)")
    a = ap.parse_args()
    n = a.pool_size

    # Jailed, the template's RAM is held twice (the file and its sealed copy).
    # pool_on_first_use off: the cold boots' shape (memory_mb 255) keeps booting.
    w = Warren({"pool_size": n, "jail": a.jail, "default_template": "minimal",
                "pool_on_first_use": "false",
                "pool_max_mb": (512 if a.jail != "off" else 256) + 48 * (n + 1),
                "max_sandboxes": 2 * n + 8, **dict(kv.split("=", 1) for kv in a.set)}).start()
    rows = []
    try:
        t0 = time.perf_counter()
        wait_ready(w, n)
        first_fill = time.perf_counter() - t0

        # From the pool, refilled before each create.
        srv, cli, first = [], [], []
        for _ in range(a.creates):
            wait_ready(w, n)
            sid, ms = create(w)
            first.append(exec_ms(w, sid))
            assert w.get(sid).json()["source"] == "pool"
            cli.append(ms)
            srv.append(server_ms(w, sid))
            w.delete(sid)
        row(rows, f"create from the pool, server side (n={a.creates})", srv)
        row(rows, f"create from the pool, client side (n={a.creates})", cli)
        row(rows, "first exec `true` after a pool create", first)

        # Back to back until dry.
        wait_ready(w, n)
        bb, sids, srcs = [], [], []
        t0 = time.perf_counter()
        while True:
            sid, ms = create(w)
            sids.append(sid)
            src = w.get(sid).json()["source"]
            srcs.append(src)
            if src != "pool":
                break
            bb.append(ms)
        per_s = len(bb) / (sum(bb) / 1e3) if bb else 0
        for sid in sids:
            w.delete(sid)
        t0 = time.perf_counter()
        wait_ready(w, n)
        refill = time.perf_counter() - t0
        row(rows, f"back-to-back pool creates until dry ({len(bb)} from the pool)", bb)
        rows.append(("creates/s while the pool lasts", f"{per_s:.1f}", "", ""))
        rows.append((f"refill to {n} ready after the dry run's deletes", f"{refill:.2f} s",
                     "", ""))
        fills = [float(x) for x in re.findall(r"pool: [a-z0-9_@-]+: ready \(\d+ of \d+; ([0-9.]+) ms from launch",
                                              w.log_all())]
        row(rows, f"one pool VM: launch, restore, warm-up, stop (n={len(fills)})", fills)
        rows.append(("first fill at start (template boot + save + pool)",
                     f"{first_fill:.2f} s", "", ""))

        # The pool empty: creates get a clone of the template restored for them.
        csrv, ccli, cfirst, fsrv, fcli = [], [], [], [], []
        for _ in range(a.boots):
            wait_ready(w, n)
            # Its spare QEMU started and past its QMP handshake (not timed): only such a
            # spare is taken; one still starting would put its start into the create.
            deadline = time.time() + 30
            while not pool(w).get("spares_ready") and time.time() < deadline:
                time.sleep(0.02)
            time.sleep(0.5)
            sids = []
            while True:
                sid, ms = create(w)
                sids.append(sid)
                if w.get(sid).json()["source"] != "pool":
                    break
            assert w.get(sid).json()["source"] == "clone", w.get(sid).json()
            # The next clone finds no spare (one starts only once the pool is full
            # again): a QEMU started for it. Creates the refill served meanwhile are
            # the pool's.
            while True:
                sid2, ms2 = create(w)
                sids.append(sid2)
                if w.get(sid2).json()["source"] == "clone":
                    break
            cfirst.append(exec_ms(w, sid))
            ccli.append(ms)
            csrv.append(server_ms(w, sid))
            fcli.append(ms2)
            fsrv.append(server_ms(w, sid2))
            for x in sids:
                w.delete(x)
        row(rows, f"create with the pool empty, into its spare QEMU, server side (n={a.boots})",
            csrv)
        row(rows, f"create with the pool empty, into its spare QEMU, client side (n={a.boots})",
            ccli)
        row(rows, f"create with the pool and spare gone, a new QEMU, server side (n={a.boots})",
            fsrv)
        row(rows, f"create with the pool and spare gone, a new QEMU, client side (n={a.boots})",
            fcli)
        row(rows, "first exec `true` after a clone create", cfirst)

        # Cold boots beside it, same warrend.
        bsrv, bcli, bfirst = [], [], []
        for _ in range(a.boots):
            sid, ms = create(w, memory_mb=255)
            bfirst.append(exec_ms(w, sid))
            assert w.get(sid).json()["source"] == "boot"
            bcli.append(ms)
            bsrv.append(server_ms(w, sid))
            w.delete(sid)
        row(rows, f"create by cold boot, server side (n={a.boots})", bsrv)
        row(rows, f"create by cold boot, client side (n={a.boots})", bcli)
        row(rows, "first exec `true` after a cold boot", bfirst)
        rows.append(("ratio cold boot / pool, p50 server side",
                     f"{pct(bsrv, 50) / pct(srv, 50):.1f}x", "", ""))
        rows.append(("ratio cold boot / pool, p50 client side",
                     f"{pct(bcli, 50) / pct(cli, 50):.1f}x", "", ""))

        # What a waiting VM costs: no sandbox is alive, every QEMU is the pool's.
        wait_ready(w, n)
        time.sleep(2)
        pss = [pss_kib(pid) / 1024 for pid in qemu_pids(w.state_dir)]
        if pss:
            row(rows, f"PSS per waiting pool VM (n={len(pss)})", pss, "MiB")

        # Steady state exec on a pool sandbox and a booted one.
        wait_ready(w, n)
        ps, _ = create(w)
        bs, _ = create(w, memory_mb=255)
        pe = [exec_ms(w, ps) for _ in range(a.execs)]
        be = [exec_ms(w, bs) for _ in range(a.execs)]
        row(rows, f"exec `true` steady, pool sandbox (n={a.execs})", pe)
        row(rows, f"exec `true` steady, booted sandbox (n={a.execs})", be)
        w.delete(ps)
        w.delete(bs)
    finally:
        w.cleanup()
    if a.other:
        other_template(a, rows)

    la = os.getloadavg()
    print(f"warren pool benchmark: {platform.node()}, {os.cpu_count()} CPUs, "
          f"load average {la[0]:.2f} {la[1]:.2f} {la[2]:.2f}, pool_size {n}, jail {a.jail}")
    emit_rows("pool", rows)
    print("| measure | p50 / value | p99 | max |")
    print("|---|---|---|---|")
    for r in rows:
        print("| " + " | ".join(r) + " |")


if __name__ == "__main__":
    main()
