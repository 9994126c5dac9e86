"""Slow and idle clients against warrend: open N connections that
never complete a request, hold them, and see whether a well-behaved client
still gets /healthz and an exec answered, and what it costs warrend (peak RSS).

    python3 load/slow_clients.py [--n 5000] [--hold 30] [--addrs 50]
    python3 load/slow_clients.py --port P --key KEY --sid SB [--pid PID]

Without --port it starts its own warrend (tests/integration/warren.py, default
configuration) and one sandbox. Loopback only: the connections come from
--addrs source addresses 127.0.0.10, .11, ... (so the per-client cap is seen
per address, as from many peers), the well-behaved client from 127.0.0.1.

Three kinds of peer, in equal parts:
- idle: connects and sends nothing;
- loris: sends a request head one byte a second, never finishing it;
- slowbody: a complete authenticated POST head announcing 100 body bytes,
  then one byte every 2 s.
A peer the server closes (or refuses: 429/503) opens again after a second, so
the pressure lasts the whole hold. Everything is bounded: the run ends after
--hold seconds plus at most 60 s of probing and clean-up.

import slow_clients; slow_clients.run(port, key, sid, pid=...) returns the
figures as a dict for a later load/ command.
"""
import argparse
import asyncio
import http.client
import json
import os
import resource
import sys
import time

HERE = os.path.dirname(os.path.abspath(__file__))
KINDS = ("idle", "loris", "slowbody")


def raise_nofile(want):
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    new = min(hard, max(soft, want))
    if new > soft:
        resource.setrlimit(resource.RLIMIT_NOFILE, (new, hard))
    return new


def proc_kib(pid, field):
    try:
        with open(f"/proc/{pid}/status") as f:
            for line in f:
                if line.startswith(field + ":"):
                    return int(line.split()[1])
    except OSError:
        pass
    return 0


class Stats:
    def __init__(self):
        self.opened = 0        # connects that succeeded
        self.connect_fail = 0  # connect() itself failed (backlog full, fd limit, reset)
        self.open_now = 0
        self.open_peak = 0
        self.refused = {}      # status line -> count (429, 503 answered before closing)
        self.closed = {k: 0 for k in KINDS}  # closed by the server after being held
        self.held_s = {k: [] for k in KINDS}  # how long the server kept each one


async def peer(kind, src, port, key, st, stop_at):
    head = (f"POST /v1/sandboxes HTTP/1.1\r\nHost: warren\r\nAuthorization: Bearer {key}\r\n"
            "Content-Type: application/json\r\nContent-Length: 100\r\n\r\n").encode()
    loris = b"GET /healthz HTTP/1.1\r\nHost: warren\r\nX-Padding: " + b"a" * 4000
    while time.monotonic() < stop_at:
        try:
            r, w = await asyncio.wait_for(
                asyncio.open_connection("127.0.0.1", port, local_addr=(src, 0)), 10)
        except (OSError, asyncio.TimeoutError):
            st.connect_fail += 1
            await asyncio.sleep(1)
            continue
        st.opened += 1
        st.open_now += 1
        st.open_peak = max(st.open_peak, st.open_now)
        t0 = time.monotonic()
        got = b""
        try:
            if kind == "slowbody":
                w.write(head)
            i = 0
            while time.monotonic() < stop_at:
                try:
                    data = await asyncio.wait_for(r.read(4096), 1 if kind != "slowbody" else 2)
                    if not data:
                        break
                    got += data
                    continue
                except asyncio.TimeoutError:
                    pass
                if kind == "loris" and i < len(loris):
                    w.write(loris[i:i + 1])
                    i += 1
                elif kind == "slowbody":
                    w.write(b" ")
                await w.drain()
        except (OSError, ConnectionError):
            pass
        finally:
            st.open_now -= 1
            w.close()
        if time.monotonic() >= stop_at:
            break
        line = got.split(b"\r\n", 1)[0].decode(errors="replace")
        if line.startswith("HTTP/1.1 429") or line.startswith("HTTP/1.1 503"):
            st.refused[line[9:12]] = st.refused.get(line[9:12], 0) + 1
        else:
            st.closed[kind] += 1
            st.held_s[kind].append(time.monotonic() - t0)
        await asyncio.sleep(1)


def probe(port, key, sid):
    """The well-behaved client: (healthz status, ms), (exec status, ms, stdout)."""
    out = {}
    for name, method, path, body, tmo in (
            ("healthz", "GET", "/healthz", None, 10),
            ("exec", "POST", f"/v1/sandboxes/{sid}/exec", json.dumps({"cmd": "echo ok"}), 60)):
        t0 = time.monotonic()
        try:
            c = http.client.HTTPConnection("127.0.0.1", port, timeout=tmo,
                                           source_address=("127.0.0.1", 0))
            c.request(method, path, body=body, headers={"Authorization": f"Bearer {key}"})
            r = c.getresponse()
            data = r.read()
            c.close()
            status = r.status
            if name == "exec" and status == 200:
                data = json.loads(data).get("stdout", "")
        except (OSError, http.client.HTTPException) as e:
            status, data = f"error: {e.__class__.__name__}", b""
        out[name] = (status, (time.monotonic() - t0) * 1000, data)
    return out


async def flood(port, key, sid, pid, n, hold, addrs):
    st = Stats()
    stop_at = time.monotonic() + hold
    tasks = []
    for i in range(n):
        src = f"127.0.0.{10 + i % addrs}"
        tasks.append(asyncio.create_task(peer(KINDS[i % 3], src, port, key, st, stop_at)))
        if i % 200 == 199:
            await asyncio.sleep(0.05)  # do not overrun the listen backlog all at once
    rss_peak = 0
    probes = []
    t_start = time.monotonic()
    next_probe = t_start + 5
    while time.monotonic() < stop_at:
        await asyncio.sleep(0.5)
        if pid:
            rss_peak = max(rss_peak, proc_kib(pid, "VmRSS"))
        if time.monotonic() >= next_probe:
            next_probe += 5
            p = await asyncio.to_thread(probe, port, key, sid)
            probes.append((round(time.monotonic() - t_start), st.open_now, p))
    # The peers end by themselves at stop_at; give them a moment, then cancel the rest.
    done, pending = await asyncio.wait(tasks, timeout=15)
    for t in pending:
        t.cancel()
    await asyncio.gather(*pending, return_exceptions=True)
    after = await asyncio.to_thread(probe, port, key, sid)
    return st, probes, after, rss_peak


def run(port, key, sid, pid=None, n=5000, hold=30, addrs=50):
    nofile = raise_nofile(n + 256)
    rss0 = proc_kib(pid, "VmRSS") if pid else 0
    st, probes, after, rss_peak = asyncio.run(flood(port, key, sid, pid, n, hold, addrs))
    res = {
        "peers": n, "addrs": addrs, "hold_s": hold, "nofile": nofile,
        "opened": st.opened, "connect_fail": st.connect_fail, "open_peak": st.open_peak,
        "refused": st.refused, "closed_by_server": st.closed,
        "held_s_median": {k: (sorted(v)[len(v) // 2] if v else None)
                          for k, v in st.held_s.items()},
        "probes": probes, "after": after,
        "rss_before_kib": rss0, "rss_peak_kib": rss_peak,
        "vmhwm_kib": proc_kib(pid, "VmHWM") if pid else 0,
        "rss_after_kib": proc_kib(pid, "VmRSS") if pid else 0,
    }
    return res


def report(res):
    print(f"{res['peers']} slow peers from {res['addrs']} loopback addresses, held "
          f"{res['hold_s']} s (client fd limit {res['nofile']})")
    print(f"  connections opened {res['opened']} (re-opens included), connect failures "
          f"{res['connect_fail']}, most open at once (client side) {res['open_peak']}")
    print(f"  refused with an answer: {res['refused'] or 'none'}")
    print(f"  closed by the server after being held: {res['closed_by_server']}; median "
          f"time held: " + ", ".join(f"{k} {v:.1f} s" if v is not None else f"{k} -"
                                   for k, v in res["held_s_median"].items()))
    ok = 0
    for t, open_now, p in res["probes"]:
        hs, hms, _ = p["healthz"]
        es, ems, out = p["exec"]
        good = hs == 200 and es == 200 and out == "ok\n"
        ok += good
        print(f"  t={t:3d}s open={open_now:5d}  healthz {hs} {hms:.0f} ms, exec {es} {ems:.0f} ms"
              f"{'' if good else '  <- not answered'}")
    a = res["after"]
    print(f"  well-behaved client answered in {ok} of {len(res['probes'])} probes during the "
          f"flood; after it: healthz {a['healthz'][0]}, exec {a['exec'][0]} "
          f"({a['exec'][2]!r})")
    if res["rss_peak_kib"]:
        print(f"  warrend RSS: {res['rss_before_kib'] / 1024:.1f} MiB before, peak "
              f"{res['rss_peak_kib'] / 1024:.1f} MiB (VmHWM {res['vmhwm_kib'] / 1024:.1f} MiB), "
              f"{res['rss_after_kib'] / 1024:.1f} MiB after")


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--n", type=int, default=5000)
    ap.add_argument("--hold", type=int, default=30)
    ap.add_argument("--addrs", type=int, default=50)
    ap.add_argument("--port", type=int)
    ap.add_argument("--key")
    ap.add_argument("--sid")
    ap.add_argument("--pid", type=int)
    ap.add_argument("--json", action="store_true", help="print the figures as JSON too")
    a = ap.parse_args()
    w = None
    if a.port:
        port, key, sid, pid = a.port, a.key, a.sid, a.pid
    else:
        sys.path.insert(0, os.path.join(HERE, "..", "tests", "integration"))
        from warren import Warren  # noqa: E402
        w = Warren({}).start()
        port, key, pid = w.port, w.key, w.proc.pid
        sid = w.create(template="minimal", ttl_seconds=3600)
    try:
        res = run(port, key, sid, pid=pid, n=a.n, hold=a.hold, addrs=a.addrs)
        report(res)
        if a.json:
            print(json.dumps(res, default=str))
    finally:
        if w:
            w.cleanup()


if __name__ == "__main__":
    main()
