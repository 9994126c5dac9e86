"""Several hosts behind HAProxy against one host directly, in one run: one table.

    load/run --fleet [--n N] [--creates N] [--list N]

Three warrend hosts in network namespaces behind Debian's HAProxy on loopback
(tests/integration/fleet.py). Side by side, the same host through the proxy
and directly (its namespace address, from this namespace over the bridge):
a GET of a sandbox (no guest: the proxy's own cost), exec `true`, and a
keystroke echoed through a PTY WebSocket (`cat`). Then creates per second
with four clients at once through the proxy (three hosts) against directly to
one host, and a list through any host (its fan-out to the two others) of
`--list` sandboxes per host against one host's own list.

All three hosts share this machine's cores, so "three hosts" here measures
placement and routing, not three machines' capacity.
"""
import argparse
import asyncio
import concurrent.futures
import json
import os
import platform
import sys
import time

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.join(HERE, "..", "tests", "integration"))
import fleet  # noqa: E402
from bench import Via, pct  # noqa: E402
from test_ws_pty import Pty  # noqa: E402


def timed(n, fn):
    xs = []
    for _ in range(n):
        t0 = time.perf_counter()
        fn()
        xs.append((time.perf_counter() - t0) * 1e3)
    return xs


async def echo(w, sid, n):
    p = await Pty.open(w, f"/v1/sandboxes/{sid}/pty", cmd="cat")
    await asyncio.sleep(0.5)
    xs = []
    for i in range(n):
        k = chr(97 + i % 26)
        start = p.next
        t0 = time.perf_counter()
        await p.send(k)
        await p.until(k, start=start)
        xs.append((time.perf_counter() - t0) * 1e3)
    await p.ws.close()
    return xs


def creates_per_s(via_factory, n, clients=4):
    """n creates by `clients` at once; returns (creates/s, ids)."""
    def one(_):
        v = via_factory()
        st, body = v.req("POST", "/v1/sandboxes", {"template": "minimal"})
        assert st == 201, (st, body)
        return json.loads(body)["id"]
    t0 = time.perf_counter()
    with concurrent.futures.ThreadPoolExecutor(clients) as ex:
        ids = list(ex.map(one, range(n)))
    return n / (time.perf_counter() - t0), ids


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--n", type=int, default=200, help="requests per latency row")
    ap.add_argument("--echo", type=int, default=100, help="keystrokes per echo row")
    ap.add_argument("--creates", type=int, default=12, help="creates per creates/s row")
    ap.add_argument("--list", type=int, default=20, help="sandboxes per host for the list row")
    a = ap.parse_args()

    # Room for the list row on every host.
    per = max(a.list + 2, a.creates + 2)
    f = fleet.Fleet(3, confs={i: {"max_sandboxes": str(per)} for i in range(3)})
    rows = []
    try:
        f.up()
        proxy = Via("127.0.0.1", f.port, f.key)
        h0 = f.hosts[0]
        direct = Via(h0.addr, fleet.API_PORT, f.key)
        # A sandbox on h0, made directly so both paths reach the same VM.
        st, body = direct.req("POST", "/v1/sandboxes", {"template": "minimal"})
        assert st == 201, body
        sid = json.loads(body)["id"]
        for label, path, body in (
                ("GET a sandbox (no guest)", f"/v1/sandboxes/{sid}", None),
                ("exec `true`", f"/v1/sandboxes/{sid}/exec", {"argv": ["true"]})):
            method = "GET" if body is None else "POST"
            for v in (proxy, direct):  # warm both paths
                v.req(method, path, body)
            xp = timed(a.n, lambda: proxy.req(method, path, body))
            xd = timed(a.n, lambda: direct.req(method, path, body))
            rows.append((label, a.n, xp, xd))

        class W:
            pass
        wp, wd = W(), W()
        wp.host, wp.port, wp.key = "127.0.0.1", f.port, f.key
        wd.host, wd.port, wd.key = h0.addr, fleet.API_PORT, f.key
        ep = asyncio.run(echo(wp, sid, a.echo))
        ed = asyncio.run(echo(wd, sid, a.echo))
        rows.append(("keystroke echo, PTY WebSocket", a.echo, ep, ed))
        direct.req("DELETE", f"/v1/sandboxes/{sid}")

        cps_fleet, ids = creates_per_s(lambda: Via("127.0.0.1", f.port, f.key), a.creates)
        for i in ids:
            proxy.req("DELETE", f"/v1/sandboxes/{i}")
        cps_one, ids = creates_per_s(lambda: Via(h0.addr, fleet.API_PORT, f.key), a.creates)
        for i in ids:
            direct.req("DELETE", f"/v1/sandboxes/{i}")

        # a.list sandboxes on every host, then lists through the proxy (fan-out) and of
        # one host alone (X-Warren-Local).
        made = []
        for h in f.hosts:
            v = Via(h.addr, fleet.API_PORT, f.key)
            for _ in range(a.list):
                st, body = v.req("POST", "/v1/sandboxes", {"template": "minimal"})
                assert st == 201, body
                made.append((v, json.loads(body)["id"]))
        st, body = proxy.req("GET", "/v1/sandboxes")
        got = json.loads(body)
        assert len(got["sandboxes"]) >= 3 * a.list and got["partial"] is False, got.get("partial")
        xl = timed(50, lambda: proxy.req("GET", "/v1/sandboxes"))
        xo = timed(50, lambda: direct.req("GET", "/v1/sandboxes", headers={"X-Warren-Local": "1"}))
        for v, i in made:
            v.req("DELETE", f"/v1/sandboxes/{i}")
    finally:
        f.down()

    print(f"Fleet: 3 hosts behind HAProxy on one machine: {platform.node()}, "
          f"{os.cpu_count()} CPUs, TCG")
    print()
    print("| what | n | through HAProxy p50 / p99 | direct p50 / p99 | HAProxy's cost, p50 |")
    print("|---|---|---|---|---|")
    for label, n, xp, xd in rows:
        print(f"| {label} | {n} | {pct(xp, 50):.2f} / {pct(xp, 99):.2f} ms | "
              f"{pct(xd, 50):.2f} / {pct(xd, 99):.2f} ms | {pct(xp, 50) - pct(xd, 50):+.2f} ms |")
    print(f"| creates/s, 4 clients, {a.creates} creates (minimal, cold boot) | {a.creates} | "
          f"{cps_fleet:.2f}/s over 3 hosts | {cps_one:.2f}/s on 1 host | |")
    print(f"| list of 3 x {a.list} sandboxes, through any host (fan-out) vs one host's own "
          f"{a.list} | 50 | {pct(xl, 50):.2f} / {pct(xl, 99):.2f} ms | "
          f"{pct(xo, 50):.2f} / {pct(xo, 99):.2f} ms | |")


if __name__ == "__main__":
    main()
