"""WebSocket benchmarks: idle agent sessions, keystroke echo among many
sockets, PTY output throughput, a saturating producer with a slow reader, exec
`true` over the agent socket beside REST. Starts warrend (tests/integration/warren.py)
with limits raised for the run, drives it with build/load/wsload (one thread, epoll)
and prints one table with bench.py's print_table.

    python3 load/wsbench.py [--sessions N] [--sandboxes S] [--echo-sockets N] ...
    python3 load/wsbench.py --quick      # a scaled-down run: a few minutes
    python3 load/wsbench.py --smoke      # ctest load_ws_smoke: behaviour only
"""
import argparse
import os
import subprocess
import sys
import threading
import time
from urllib.parse import quote

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.join(HERE, "..", "tests", "integration"))
sys.path.insert(0, HERE)
from warren import Warren, qemu_pids, rss_kib  # noqa: E402
from bench import pct, print_table  # noqa: E402

MiB = 1024 * 1024


def wsload_path():
    p = os.environ.get("WSLOAD")
    if p:
        return p
    return os.path.join(os.path.dirname(os.environ.get("WARREND", "")), "..", "load", "wsload")


def parse(lines):
    """RESULT name k=v ... lines -> {name: {k: v}} (numbers as floats)."""
    out = {}
    for line in lines:
        f = line.split()
        if len(f) < 2 or f[0] != "RESULT":
            continue
        d = {}
        for kv in f[2:]:
            k, _, v = kv.partition("=")
            try:
                d[k] = float(v)
            except ValueError:
                d[k] = v
        out.setdefault(f[1], []).append(d)
    return {k: v if len(v) > 1 else v[0] for k, v in out.items()}


def us(x):
    return f"{x / 1000:.2f} ms" if x >= 1000 else f"{x:.0f} us"


class RssWatch:
    """Samples RSS every 100 ms in a thread: start, peak, end (KiB)."""

    def __init__(self, pid):
        self.pid, self.start, self.peak = pid, rss_kib(pid), rss_kib(pid)
        self.end = self.start
        self._stop = threading.Event()
        self._t = threading.Thread(target=self._run, daemon=True)

    def _run(self):
        while not self._stop.wait(0.1):
            self.end = rss_kib(self.pid)
            self.peak = max(self.peak, self.end)

    def __enter__(self):
        self._t.start()
        return self

    def __exit__(self, *exc):
        self._stop.set()
        self._t.join()
        self.end = rss_kib(self.pid)


def cpu_s(pids):
    """User + system CPU seconds of these processes so far."""
    t = 0
    for p in pids:
        try:
            with open(f"/proc/{p}/stat") as f:
                st = f.read().rsplit(")", 1)[1].split()
            t += (int(st[11]) + int(st[12])) / os.sysconf("SC_CLK_TCK")
        except (OSError, IndexError):
            pass
    return t


def healthz(w, n):
    c = w.conn(timeout=60)
    xs = []
    for _ in range(n):
        t0 = time.perf_counter()
        c.request("GET", "/healthz")
        r = c.getresponse()
        r.read()
        xs.append(time.perf_counter() - t0)
        assert r.status == 200
    c.close()
    return xs


class Runner:
    def __init__(self, w, sids, check):
        self.w, self.sids, self.check = w, sids, check

    def cmd(self, mode, *args, sids=None):
        return [wsload_path(), mode, "-p", str(self.w.port), "-k", self.w.key, "-s",
                ",".join(sids or self.sids), *map(str, args)]

    def run(self, mode, *args, sids=None, timeout=1800):
        p = subprocess.run(self.cmd(mode, *args, sids=sids), capture_output=True, text=True,
                           timeout=timeout)
        sys.stderr.write(p.stderr[-3000:])
        if p.returncode and self.check:
            raise AssertionError(f"wsload {mode} failed ({p.returncode}):\n{p.stdout}{p.stderr}")
        return parse(p.stdout.splitlines()), p.returncode


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--quick", action="store_true", help="scaled down: a check, not a benchmark")
    ap.add_argument("--sessions", type=int, default=19000)
    ap.add_argument("--sandboxes", type=int, default=8)
    ap.add_argument("--echo-sockets", type=int, default=1000)
    ap.add_argument("--rounds", type=int, default=200, help="keystrokes per PTY")
    ap.add_argument("--key-ms", type=float, default=100,
                    help="echo paced as a typist: a key per PTY every 0.5-1.5x this (0: only "
                         "back to back)")
    ap.add_argument("--pty-mib", type=float, default=8)
    ap.add_argument("--flood-secs", type=float, default=60)
    ap.add_argument("--flood-rate", type=int, default=65536, help="slow reader, bytes/s")
    ap.add_argument("--execs", type=int, default=100)
    ap.add_argument("--phases", default="idle,echo,tput,flood,exec",
                    help="which parts to run (comma-separated)")
    ap.add_argument("--hold", type=float, default=10, help="seconds the idle sockets are held")
    ap.add_argument("--check", action="store_true",
                    help="fail (exit 1) when a socket fails to open, drops or echoes wrong")
    ap.add_argument("--smoke", action="store_true",
                    help="the ctest check: 300 sessions and echo in 1 sandbox, behaviour only")
    a = ap.parse_args()
    if a.quick:
        a.sessions, a.sandboxes, a.echo_sockets, a.rounds = 400, 2, 100, 40
        a.pty_mib, a.flood_secs, a.execs = 1, 5, 10
    if a.smoke:
        a.sessions, a.sandboxes, a.echo_sockets, a.rounds, a.hold = 300, 1, 50, 40, 1
        a.check = True

    per_sbx = a.sessions // a.sandboxes + 64
    w = Warren({
        "max_sandboxes": a.sandboxes + 1,
        "max_connections": 20000,
        "max_connections_per_client": 20000,
        "session_max_sockets_per_sandbox": per_sbx,
        "pty_sockets_per_sandbox": 64,
        "max_processes_per_sandbox": 64,
    }).start()
    rows = []
    try:
        t0 = time.perf_counter()
        sids = [w.create(template="minimal") for _ in range(a.sandboxes)]
        boot_s = time.perf_counter() - t0
        r = Runner(w, sids, a.check)
        pid = w.proc.pid

        ph = set(a.phases.split(","))
        nidle = max(0, a.echo_sockets - 2 * a.sandboxes)

        # 1. Idle agent sessions.
        if "idle" in ph:
            hz0 = healthz(w, 200)
            rss0 = rss_kib(pid)
            workers = max(1, (a.sessions + 4999) // 5000)
            p = subprocess.Popen(r.cmd("idle", "-n", a.sessions, "-j", workers),
                                 stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)
            first = parse([p.stdout.readline()]).get("idle_open", {})
            time.sleep(2)
            rss1 = rss_kib(pid)
            hz1 = healthz(w, 200)
            time.sleep(a.hold)  # held idle: nothing is dropped, RSS does not creep
            rss2 = rss_kib(pid)
            p.stdin.close()
            held = parse(p.stdout.read().splitlines()).get("idle_held", {})
            p.wait()
            time.sleep(2)
            rss3 = rss_kib(pid)
            opened = int(first.get("opened", 0))
            if a.check:
                assert opened == a.sessions == int(held.get("held", 0)), (first, held)
            rows.append((f"idle agent sockets opened / held {a.hold:g} s later (of {a.sessions}, "
                         f"{a.sandboxes} sbx)", f"{opened} / {int(held.get('held', 0))}",
                         f"{first.get('secs', 0):.1f} s"))
            per = (rss1 - rss0) * 1024 / max(opened, 1)
            rows.append(("warrend RSS per idle socket ((at N - before) / N)",
                         f"{per / 1024:.2f} KiB", ""))
            rows.append((f"warrend RSS before / at N / +{a.hold:g} s / after close",
                         f"{rss0 / 1024:.1f} MiB",
                         f"{rss1 / 1024:.1f} / {rss2 / 1024:.1f} / {rss3 / 1024:.1f}"))
            rows.append(("GET /healthz, no sockets (keep-alive, n=200)", us(pct(hz0, 50) * 1e6),
                         us(pct(hz0, 99) * 1e6)))
            rows.append((f"GET /healthz with {opened} sockets open (n=200)", us(pct(hz1, 50) * 1e6),
                         us(pct(hz1, 99) * 1e6)))

        # 2. Keystroke echo among ~1,000 sockets; pings beside it that stay in warrend.
        if "echo" in ph:
            total = nidle + 2 * a.sandboxes
            if a.key_ms > 0:
                # A typist's pace in every PTY at once, each on its own phase.
                res, _ = r.run("echo", "-n", nidle, "-r", a.rounds, "-i", a.key_ms)
                e = res["echo_pty"]
                rows.append((f"keystroke echo, a key per PTY every {a.key_ms / 2:g}-"
                             f"{a.key_ms * 1.5:g} ms, {a.sandboxes} PTYs, {total} sockets "
                             f"(n={int(e['n'])})", us(e["p50_us"]), us(e["p99_us"])))
                paced_end = res.get("echo_end", {})
                rows.append(("  sockets still open / echo errors / keys without echo in 10 s",
                             f"{int(paced_end.get('idle_still_open', 0)) + 2 * a.sandboxes} / "
                             f"{int(paced_end.get('errors', -1))} / "
                             f"{int(paced_end.get('lost', -1))}", ""))
            # Back to back: every PTY keeps a key in flight, all at once (the cores saturate).
            res, _ = r.run("echo", "-n", nidle, "-r", a.rounds)
            e, pg, er = res["echo_pty"], res["ws_ping"], res["session_error"]
            rows.append((f"keystroke echo back to back, {a.sandboxes} PTYs at once, {total} "
                         f"sockets (n={int(e['n'])})", us(e["p50_us"]), us(e["p99_us"])))
            rows.append((f"  WebSocket ping -> pong (lws, no guest; n={int(pg['n'])})",
                         us(pg["p50_us"]), us(pg["p99_us"])))
            rows.append((f"  agent request answered by warrend (bad detach; n={int(er['n'])})",
                         us(er["p50_us"]), us(er["p99_us"])))
            end = res.get("echo_end", {})
            rows.append(("  sockets still open / echo errors / keys without echo in 10 s",
                         f"{int(end.get('idle_still_open', 0)) + 2 * a.sandboxes} / "
                         f"{int(end.get('errors', -1))} / {int(end.get('lost', -1))}", ""))

        if a.smoke:
            assert int(end.get("errors", -1)) == 0 and e["n"] > 0 and pg["n"] > 0, res
            assert a.key_ms <= 0 or int(paced_end.get("errors", -1)) == 0, paced_end
            print_table("Warren WebSocket smoke check (not a benchmark)", "p50 / value", rows,
                        width=74)
            return

        # 3. Output throughput: one PTY alone, then one per sandbox at once; the same
        #    bytes through a plain exec (no PTY) on the agent socket.
        if "tput" in ph:
            nb = int(a.pty_mib * MiB)
            for label, extra in (("PTY", []), ("exec, no PTY", ["-x"])):
                qp = qemu_pids(sids[0])
                w0, q0 = cpu_s([pid]), cpu_s(qp)
                one, _ = r.run("tput", "-b", nb, *extra, sids=sids[:1])
                w1, q1 = cpu_s([pid]), cpu_s(qp)
                secs = one["tput_all"]["secs"]
                rows.append((f"{label}: head -c {a.pty_mib:g} MiB /dev/zero, 1 socket",
                             f"{one['tput_all']['mbps']:.2f} MB/s", f"{secs:.1f} s"))
                rows.append(("  CPU meanwhile, % of a core: warrend / that sandbox's QEMU",
                             f"{100 * (w1 - w0) / secs:.0f}%", f"{100 * (q1 - q0) / secs:.0f}%"))
                allr, _ = r.run("tput", "-b", nb, *extra)
                ones = allr["tput_one"]
                ones = ones if isinstance(ones, list) else [ones]
                rows.append((f"{label}: the same in {a.sandboxes} sandboxes at once, aggregate",
                             f"{allr['tput_all']['mbps']:.2f} MB/s",
                             f"min {min(o['mbps'] for o in ones):.2f}"))

        # 4. `yes` in a PTY: first read as fast as it comes (its rate under TCG), then by
        #    a reader at most a quarter as fast for flood-secs, with echo beside it. Plain
        #    `yes` writes 2 bytes per write(); `yes` of a 4,000-byte line is the producer
        #    that pushes hardest here, so the flood uses that one.
        if "flood" in ph:
            ycmds = (("`yes`", "yes"), ("`yes` of a 4000-byte line", "yes $(printf %04000d 0)"))
            yrate = 0
            for label, yc in ycmds:
                fast, _ = r.run("echo", "-n", 0, "-y", 0, "-Y", quote(yc, safe=""), "-t", 10,
                                "-R", 0, sids=sids[:1])
                yf = fast.get("yes", {})
                yrate = yf.get("got", 0) / max(yf.get("secs", 1), 0.001)
                rows.append((f"{label} in a PTY, reader as fast as it comes (10 s)",
                             f"{yrate / 1e6:.2f} MB/s", "open" if yf.get("open") else "DROPPED"))
            a.flood_rate = int(max(1024, min(a.flood_rate, yrate / 4)))
            with RssWatch(pid) as rw:
                res, _ = r.run("echo", "-n", nidle, "-y", 0, "-Y", quote(ycmds[1][1], safe=""),
                               "-t", a.flood_secs, "-R", a.flood_rate)
            y, e = res.get("yes", {}), res["echo_pty"]
            rows.append((f"the same `yes`, reader at {a.flood_rate / 1024:.0f} KiB/s for "
                         f"{a.flood_secs:g} s: socket open, bytes read",
                         "open" if y.get("open") else "DROPPED", f"{int(y.get('got', 0))} B"))
            rows.append(("  warrend RSS start / peak / end", f"{rw.start / 1024:.1f} MiB",
                         f"{rw.peak / 1024:.1f} / {rw.end / 1024:.1f}"))
            rows.append((f"  keystroke echo in the other {a.sandboxes - 1} sandboxes meanwhile "
                         f"(n={int(e['n'])})", us(e["p50_us"]), us(e["p99_us"])))
            pg = res["ws_ping"]
            rows.append(("  WebSocket ping -> pong meanwhile", us(pg["p50_us"]), us(pg["p99_us"])))

        # 5. exec `true`: agent socket and REST, interleaved, same sandbox.
        if "exec" in ph:
            res, _ = r.run("exec", "-r", a.execs, sids=sids[:1])
            for k, label in (("exec_session", "agent socket"), ("exec_rest", "REST (keep-alive)")):
                rows.append((f"exec `true` over the {label}, interleaved (n={a.execs})",
                             us(res[k]["p50_us"]), us(res[k]["p99_us"])))
        rows.append((f"({a.sandboxes} sandboxes booted in {boot_s:.1f} s; load average "
                     f"{os.getloadavg()[0]:.1f} at the end)", "", ""))
    finally:
        w.cleanup()
    print_table("Warren WebSocket benchmarks", "p50 / value", rows, width=74)


if __name__ == "__main__":
    main()
