"""What networking adds to create, net on and off side by side.

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
Then (or alone, --policy-only) the policy's cost, on one warrend with
net_ahead = 0 (every create does the full set-up):
  - cold create with a CIDR allow list vs a domain allow list (the latter
    also starts the VM's dnsmasq), alternating;
  - PATCH .../network latency (request to 200: the nft reload, tc and the
    resolver restart, off the loop) for: CIDR list -> another CIDR list,
    -> a domain list (dnsmasq started), domain -> domain (restarted), and
    -> rate_mbit + max_connections (tc, ct count).
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


def patch_ms(w, sid, network):
    t0 = time.monotonic()
    r = w.request("PATCH", f"/v1/sandboxes/{sid}/network", network)
    ms = (time.monotonic() - t0) * 1000
    if r.status != 200:
        raise RuntimeError(f"PATCH {network}: {r.status} {r.json()}")
    return ms


def policy(base, args):
    """Domain rules' cost: cold create and PATCH latency."""
    cidr = {"internet": True, "allow_out": ["192.0.2.0/24"]}
    cidr2 = {"internet": True, "allow_out": ["198.51.100.0/24"]}
    names = {"internet": True, "allow_out": ["www.example.com"]}
    names2 = {"internet": True, "allow_out": ["*.example.com", "api.example.org"]}
    limits = {"internet": True, "rate_mbit": 100, "max_connections": 64}
    w = Warren(dict(base, net_ahead="0", **NET)).start()
    try:
        cold = {"cidr": [], "names": []}
        for _ in range(args.creates):
            for name, pol in (("cidr", cidr), ("names", names)):
                sid, ms = timed_create(w, network=pol)
                cold[name].append(ms)
                w.delete(sid)
        for name in ("cidr", "names"):
            print(f"cold create, {name} allow list: {summary(cold[name])}")
        sid = w.create(network=cidr)
        lat = {"cidr -> cidr": [], "cidr -> names": [], "names -> names": [],
               "names -> limits": []}
        for _ in range(args.patches):
            w.request("PATCH", f"/v1/sandboxes/{sid}/network", cidr)
            lat["cidr -> cidr"].append(patch_ms(w, sid, cidr2))
            w.request("PATCH", f"/v1/sandboxes/{sid}/network", cidr)
            lat["cidr -> names"].append(patch_ms(w, sid, names))
            lat["names -> names"].append(patch_ms(w, sid, names2))
            lat["names -> limits"].append(patch_ms(w, sid, limits))
        for k, v in lat.items():
            print(f"PATCH .../network {k}: {summary(v)}, max {max(v):.0f} ms")
        w.delete(sid)
    finally:
        w.cleanup()


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--creates", type=int, default=6)
    ap.add_argument("--jail", action="store_true")
    ap.add_argument("--patches", type=int, default=20)
    ap.add_argument("--policy-only", action="store_true")
    args = ap.parse_args()
    print("load:", open("/proc/loadavg").read().strip())
    net = fakenet.FakeNet()
    ws = []
    try:
        net.enter()
        base = {"jail": "off", "default_template": "minimal"}
        if args.policy_only:
            policy(base, args)
            return
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
        for w in ws:
            w.cleanup()
        ws = []
        policy(base, args)
    finally:
        for w in ws:
            w.cleanup()
        net.close()
        print("load:", open("/proc/loadavg").read().strip())


if __name__ == "__main__":
    main()
