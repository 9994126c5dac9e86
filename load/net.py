"""What networking adds to create (issue 9), net on and off side by side.

    WARREN_IMAGE_DIR=... python3 load/net.py [--creates N] [--jail]

Runs inside the tests' fake internet (tests/integration/fakenet.py: no packet
leaves this machine). Two warrends at once, jail off, template minimal, one
with net_enabled, one without; creates alternate between them so that both
see the same machine load. Measures, for each:
  - cold create: POST /v1/sandboxes to 201 (the guest is ready), and the time
    warrend's loop spent launching (its "launch X ms" log line);
  - warm create (pool_size 1, refilled before each): POST to 201.
With --jail, two more warrends with jail = required (net on, net off) join
the cold creates, and the jailed net-on one also creates with internet off
(a policy no namespace is made ahead for: the jail's child runs the full
set-up); the warm part is skipped (the pool is off when QEMU is jailed).
Needs root, ip, nft, and images whose initramfs loads virtio_net.
"""
import argparse
import os
import re
import statistics
import sys
import time

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "tests",
                                "integration"))
import fakenet  # noqa: E402
from warren import Warren  # noqa: E402

NET = {"net_enabled": "true", "net_uplink": fakenet.UPLINK, "net_dns_upstream": fakenet.DNS_ADDR,
       "net_range": "10.202.0.0/16"}


def timed_create(w, **kw):
    t0 = time.monotonic()
    sid = w.create(**kw)
    return sid, (time.monotonic() - t0) * 1000


def launch_ms(w, sid):
    m = re.findall(rf"{sid}.*launch ([0-9.]+) ms", w.log_text())
    return float(m[-1]) if m else float("nan")


def wait_pool(w):
    deadline = time.time() + 180
    while time.time() < deadline:
        p = w.request("GET", "/healthz").json()["pool"]
        if p and p["state"] == "ready" and p["ready"] >= 1:
            return
        time.sleep(0.05)
    raise RuntimeError("pool never ready:\n" + w.log_text())


def summary(xs):
    return f"p50 {statistics.median(xs):.0f} ms, mean {statistics.mean(xs):.0f} ms (n={len(xs)})"


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--creates", type=int, default=6)
    ap.add_argument("--jail", action="store_true")
    args = ap.parse_args()
    print("load:", open("/proc/loadavg").read().strip())
    net = fakenet.FakeNet()
    ws = []
    try:
        net.enter()
        base = {"jail": "off", "default_template": "minimal"}
        on = Warren(dict(base, **NET)).start()
        ws.append(on)
        off = Warren(base).start()
        ws.append(off)
        runs = [("on", on, {}), ("off", off, {})]
        if args.jail:
            jail = {"jail": "required", "jail_uid_base": "470000", "jail_uid_count": "50",
                    "jail_cgroup": "warren-load"}
            jon = Warren(dict(base, **NET, **jail)).start()
            ws.append(jon)
            joff = Warren(dict(base, jail_uid_base="470100",
                               **{k: v for k, v in jail.items() if k != "jail_uid_base"})).start()
            ws.append(joff)
            runs += [("on, jailed", jon, {}), ("off, jailed", joff, {}),
                     ("on, jailed, internet off (full set-up)", jon,
                      {"network": {"internet": False}})]
        cold = {name: [] for name, _, _ in runs}
        loop = {name: [] for name, _, _ in runs}
        for _ in range(args.creates):
            for name, w, kw in runs:
                sid, ms = timed_create(w, **kw)
                cold[name].append(ms)
                loop[name].append(launch_ms(w, sid))
                w.delete(sid)
        for name, _, _ in runs:
            print(f"cold create, net {name}: {summary(cold[name])}; loop launch "
                  f"p50 {statistics.median(loop[name]):.2f} ms")
        for w in ws:
            w.cleanup()
        ws = []
        if args.jail:
            return
        on = Warren(dict(base, pool_size="1", **NET)).start()
        ws.append(on)
        off = Warren(dict(base, pool_size="1")).start()
        ws.append(off)
        warm = {"on": [], "off": []}
        for _ in range(args.creates):
            for name, w in (("on", on), ("off", off)):
                wait_pool(w)
                sid, ms = timed_create(w)
                assert w.get(sid).json()["source"] == "pool"
                warm[name].append(ms)
                w.delete(sid)
        for name in ("on", "off"):
            print(f"warm create (pool), net {name}: {summary(warm[name])}")
    finally:
        for w in ws:
            w.cleanup()
        net.close()
        print("load:", open("/proc/loadavg").read().strip())


if __name__ == "__main__":
    main()
