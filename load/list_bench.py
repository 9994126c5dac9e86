"""Lists across a fleet: three hosts holding N sandboxes each, through HAProxy,
against one host holding 3N, in one run; one table.

    python3 load/list_bench.py [--n N] [--page P] [--reps R] [--smoke]   # as root

Three warrend hosts in network namespaces behind Debian's HAProxy on loopback
(tests/integration/fleet.py). First every host gets N sandboxes (from its warm
pool, each paused at once: a paused sandbox keeps its memory on disk and no
VM, so N is bounded by disk and time, not RAM); then, R times each, through
the proxy: `GET /v1/sandboxes?state=paused` (one host's list and its fan-out
to the two others) and E2B's `GET /v2/sandboxes?state=paused&limit=P` walked page by page to the end
(x-next-token; every page asks each peer for at most P items after the token). Then those are deleted, one host gets 3N
and the same two lists are taken of it alone (`X-Warren-Local: 1`: no
fan-out), directly. Every list is checked whole: every id once, none missing,
not partial.

--smoke: N=3, P=2, R=2, a behaviour check only (registered in load/CMakeLists.txt).
All hosts share this machine's cores: the fleet's figures are three hosts' work
done on one machine, not three machines'.
"""
import argparse
import concurrent.futures
import json
import os
import platform
import subprocess
import sys
import time

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.join(HERE, "..", "tests", "integration"))
import fleet  # noqa: E402
from bench import Via, pct  # noqa: E402


FAILED = []  # creates that failed and were tried again: (status, body)


def fill(via_factory, n, clients=4):
    """n sandboxes made and paused through one address, `clients` at once: their ids,
    and the seconds it took. A create whose guest did not boot in time (a cold boot
    on a loaded machine) is tried again, up to three times, and counted in FAILED."""
    def one(_):
        v = via_factory()
        for attempt in range(4):
            st, body = v.req("POST", "/v1/sandboxes", {"template": "minimal"})
            if st == 201 or attempt == 3 or b"boot_failed" not in body:
                break
            FAILED.append((st, body[:200]))
        assert st == 201, (st, body)
        sid = json.loads(body)["id"]
        st, body = v.req("POST", f"/v1/sandboxes/{sid}/pause")
        assert st == 200, (st, body)
        return sid
    t0 = time.perf_counter()
    with concurrent.futures.ThreadPoolExecutor(clients) as ex:
        ids = list(ex.map(one, range(n)))
    return ids, time.perf_counter() - t0


def drop(via_factory, ids, clients=4):
    def one(sid):
        st, body = via_factory().req("DELETE", f"/v1/sandboxes/{sid}")
        assert st == 200, (st, body)
    with concurrent.futures.ThreadPoolExecutor(clients) as ex:
        list(ex.map(one, ids))


def rest_list(v, want, headers=None):
    """GET /v1/sandboxes?state=paused (a deleted sandbox stays listed as ended for a
    while: the filter keeps those of the first half out of the second): ms, and
    checks it holds exactly want."""
    t0 = time.perf_counter()
    st, body = v.req("GET", "/v1/sandboxes?state=paused", headers=headers)
    dt = (time.perf_counter() - t0) * 1e3
    assert st == 200, (st, body[:300])
    got = json.loads(body)
    ids = [s["id"] for s in got["sandboxes"]]
    assert got.get("partial") in (False, None), got.get("unreachable")
    assert len(ids) == len(set(ids)) and set(ids) == want, (len(ids), len(want))
    return dt, len(body)


def e2b_walk(v, key, want, page, headers=None):
    """E2B's GET /v2/sandboxes?state=paused&limit=page to the last page: total ms, page count, and
    checks every id came once, in the fleet's order (startedAt, then id)."""
    h = {"X-API-KEY": key}
    h.update(headers or {})
    seen, keys, token, pages = [], [], None, 0
    t0 = time.perf_counter()
    while True:
        q = f"/v2/sandboxes?state=paused&limit={page}" + (f"&nextToken={token}" if token else "")
        st, body, hd = v.req("GET", q, headers=h, with_headers=True)
        assert st == 200, (st, body[:300])
        assert "x-warren-partial" not in hd, hd
        items = json.loads(body)
        assert len(items) <= page, len(items)
        assert items or not token, "a token led to an empty page"
        seen += [it["sandboxID"] for it in items]
        keys += [(it["startedAt"] or "", it["sandboxID"]) for it in items]
        pages += 1
        token = hd.get("x-next-token")
        if not token:
            break
    dt = (time.perf_counter() - t0) * 1e3
    assert keys == sorted(keys) and len(seen) == len(set(seen)) and set(seen) == want, \
        (len(seen), len(want))
    return dt, pages


def loadavg():
    with open("/proc/loadavg") as f:
        return " ".join(f.read().split()[:3])


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--n", type=int, default=100, help="sandboxes per host (3N on one host)")
    ap.add_argument("--page", type=int, default=100, help="E2B's page size (limit)")
    ap.add_argument("--reps", type=int, default=10, help="lists of each kind")
    ap.add_argument("--smoke", action="store_true", help="N=3, P=2, R=2: behaviour only")
    a = ap.parse_args()
    if a.smoke:
        a.n, a.page, a.reps = 3, 2, 2
    n = a.n
    room = str(3 * n + 8)
    # Every host may hold 3N (h0 does, in the second half); a pool of four per host
    # makes the creates clones, not boots.
    conf = {"max_sandboxes": room, "pool_size": "4", "peer_timeout_ms": "30000"}
    f = fleet.Fleet(3, confs={i: dict(conf) for i in range(3)})
    out = {}
    load0 = loadavg()
    try:
        f.up()
        proxy = Via("127.0.0.1", f.port, f.key)
        h0 = f.hosts[0]
        direct = Via(h0.addr, fleet.API_PORT, f.key)

        # Three hosts, N each, through the proxy.
        want, fill_s = set(), 0.0
        for h in f.hosts:
            ids, s = fill(lambda h=h: Via(h.addr, fleet.API_PORT, f.key), n)
            want |= set(ids)
            fill_s += s
        assert len(want) == 3 * n
        rest_list(proxy, want)  # warm
        xs = [rest_list(proxy, want) for _ in range(a.reps)]
        out["fleet_rest"] = [x for x, _ in xs]
        out["fleet_rest_bytes"] = xs[0][1]
        xs = [e2b_walk(proxy, f.key, want, a.page) for _ in range(a.reps)]
        out["fleet_e2b"] = [x for x, _ in xs]
        out["pages"] = xs[0][1]
        drop(lambda: Via("127.0.0.1", f.port, f.key), sorted(want))

        # One host, 3N, alone (no fan-out), directly.
        local = {"X-Warren-Local": "1"}
        ids, s = fill(lambda: Via(h0.addr, fleet.API_PORT, f.key), 3 * n)
        fill_s += s
        want = set(ids)
        # What bounds N: a paused sandbox's disk (no RAM), h0's state dir over its 3N.
        du = subprocess.run(["du", "-sk", h0.state_dir], capture_output=True, text=True)
        out["disk_kib"] = int(du.stdout.split()[0]) if du.returncode == 0 else 0
        rest_list(direct, want, local)
        xs = [rest_list(direct, want, local) for _ in range(a.reps)]
        out["one_rest"] = [x for x, _ in xs]
        out["one_rest_bytes"] = xs[0][1]
        xs = [e2b_walk(direct, f.key, want, a.page, local) for _ in range(a.reps)]
        out["one_e2b"] = [x for x, _ in xs]
        drop(lambda: Via(h0.addr, fleet.API_PORT, f.key), sorted(want))
    finally:
        f.down()

    commit = subprocess.run(["git", "-C", HERE, "rev-parse", "--short", "HEAD"],
                            capture_output=True, text=True).stdout.strip()
    print(f"List bench: {time.strftime('%Y-%m-%d %H:%M UTC', time.gmtime())}, commit {commit}, "
          f"{platform.node()}, {os.cpu_count()} CPUs, TCG; load {load0} at the start, "
          f"{loadavg()} at the end; N={n} paused sandboxes per host, {a.reps} lists each, "
          f"E2B pages of {a.page}; {6 * n} creates+pauses took {fill_s:.0f} s; "
          f"one host's state dir with {3 * n} paused: {out['disk_kib'] / 1024:.0f} MiB "
          f"({out['disk_kib'] / (3 * n):.0f} KiB each); {len(FAILED)} create(s) failed "
          f"and were tried again{': ' + repr(FAILED[0]) if FAILED else ''}")
    print()
    print("| list | 3 hosts x N through HAProxy, p50 / p99 | 1 host x 3N alone, p50 / p99 |")
    print("|---|---|---|")
    print(f"| GET /v1/sandboxes?state=paused, {3 * n} sandboxes ({out['fleet_rest_bytes']} / "
          f"{out['one_rest_bytes']} bytes) | {pct(out['fleet_rest'], 50):.1f} / "
          f"{pct(out['fleet_rest'], 99):.1f} ms | {pct(out['one_rest'], 50):.1f} / "
          f"{pct(out['one_rest'], 99):.1f} ms |")
    print(f"| E2B GET /v2/sandboxes?state=paused, all {out['pages']} pages of {a.page} | "
          f"{pct(out['fleet_e2b'], 50):.1f} / {pct(out['fleet_e2b'], 99):.1f} ms | "
          f"{pct(out['one_e2b'], 50):.1f} / {pct(out['one_e2b'], 99):.1f} ms |")
    print(f"| the same, per page | {pct(out['fleet_e2b'], 50) / out['pages']:.1f} ms | "
          f"{pct(out['one_e2b'], 50) / out['pages']:.1f} ms |")


if __name__ == "__main__":
    main()
