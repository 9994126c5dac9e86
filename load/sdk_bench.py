"""E2B's JS SDK against Warren's own Python client, on one warrend, in one run.

    python3 load/sdk_bench.py [--creates N] [--runs N] [--mib N] [--reads N]
                              [--code-runs N] [--no-code] [--smoke]

Through the unmodified npm `e2b` SDK (setup.sh's npm cache, load/sdk_bench.mjs)
and through clients/python: create -> the first `echo ready` answered (p50,
p99), a `true` round trip (p50, p99), a file of --mib MiB of random bytes
written and read back (MB/s; the SDK's gzip write too: incompressible data,
zlib's worst case). Reads: the first one right after the write, then --reads
of each way (p50): the SDK's files.read in each format (`text`, its default,
of an ASCII file of the same size; `bytes`, `blob`, `stream`), the same GET
/files of the envd door through Node's http module (no SDK), and in Python
Warren's own read and the envd door's GET /files (http.client): which part
is the server's and which the client's. Beside each read's MB/s, the p50 CPU
time the reading process spent on it (the client's own cost). With the code-interpreter template in the image dir, also
`runCode("1+1")` through @e2b/code-interpreter against Warren's
/v1/sandboxes/{id}/code run (p50, after a first run). Prints one table.
Every answer is checked: a wrong one stops the run. --smoke: tiny counts, no
code interpreter, for ctest (behaviour, never timings).
"""
import argparse
import hashlib
import hmac
import json
import os
import platform
import random
import subprocess
import sys
import time

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.join(HERE, "..", "tests", "integration"))
sys.path.insert(0, os.path.join(HERE, "..", "clients", "python"))
from warren import Warren, image_dir  # noqa: E402
from test_e2b import sdk_script  # noqa: E402
from bench import pct  # noqa: E402
import warren_client  # noqa: E402

CODE_TEMPLATE = "code-interpreter"


def ms(v):
    return f"{pct(v, 50):.1f} ({pct(v, 99):.1f}) ms" if v else "-"


def sdk(w, a, code):
    with open(os.path.join(w.state_dir, "e2b_api_key")) as f:
        key = f.read().strip()
    with sdk_script(os.path.join(HERE, "sdk_bench.mjs"), "e2b", w.port, key,
                    N_CREATE=str(a.creates), N_RUN=str(a.runs), MIB=str(a.mib),
                    N_READ=str(a.reads), CODE_TEMPLATE=CODE_TEMPLATE if code else "",
                    N_CODE=str(a.code_runs)) as (argv, env):
        p = subprocess.run(argv, env=env, capture_output=True, text=True, timeout=7200)
    lines = [json.loads(l) for l in p.stdout.splitlines() if l.startswith("{")]
    if p.returncode != 0 or not lines or "error" in lines[-1]:
        raise SystemExit(f"the SDK run failed ({p.returncode}): {p.stdout[-3000:]}\n"
                         f"{p.stderr[-3000:]}\n{w.log_text()[-3000:]}")
    return lines[-1]


def envd_read(w, sid, path):
    """GET /files of the envd door, as the SDK asks it, with Python's http.client."""
    with open(os.path.join(w.state_dir, "token_secret"), "rb") as f:
        tok = hmac.new(f.read(), b"envd\0" + sid.encode(), hashlib.sha256).hexdigest()
    c = w.conn()
    try:
        c.request("GET", "/files?path=" + path,
                  headers={"E2b-Sandbox-Id": sid, "E2b-Sandbox-Port": "49983",
                           "X-Access-Token": tok})
        r = c.getresponse()
        body = r.read()
        if r.status != 200:
            raise SystemExit(f"envd GET /files: {r.status} {body[:300]!r}")
        return body
    finally:
        c.close()


def native(w, a, code):
    c = warren_client.Warren(f"http://127.0.0.1:{w.port}", w.key)
    out = {"create_first": [], "run_true": [], "run_bash_l": []}
    sb = None
    for _ in range(a.creates):
        t0 = time.perf_counter()
        s = c.create(template="base")
        r = s.run(["echo", "ready"])
        out["create_first"].append((time.perf_counter() - t0) * 1e3)
        if r.stdout != "ready\n":
            raise SystemExit(f"echo ready: {r!r}")
        if sb:
            sb.kill()
        sb = s
    for _ in range(a.runs):
        t0 = time.perf_counter()
        r = sb.run(["true"])
        out["run_true"].append((time.perf_counter() - t0) * 1e3)
        if r.exit_code != 0:
            raise SystemExit(f"true: {r!r}")
    # What the SDK's commands.run("true") makes the guest do: a login bash first.
    for _ in range(a.runs):
        t0 = time.perf_counter()
        r = sb.run(["/bin/bash", "-l", "-c", "true"])
        out["run_bash_l"].append((time.perf_counter() - t0) * 1e3)
        if r.exit_code != 0:
            raise SystemExit(f"bash -l -c true: {r!r}")
    data = random.randbytes(a.mib << 20)
    t0 = time.perf_counter()
    sb.files.write("/tmp/bench.bin", data)
    out["write_s"] = time.perf_counter() - t0
    t0 = time.perf_counter()
    back = sb.files.read("/tmp/bench.bin")
    out["read_first_s"] = time.perf_counter() - t0
    if back != data:
        raise SystemExit(f"read back: {len(back)} of {len(data)} bytes, or other bytes")
    ways = {"read_native": lambda: sb.files.read("/tmp/bench.bin"),
            "read_envd": lambda: envd_read(w, sb.id, "/tmp/bench.bin")}
    for k in ways:
        out[k], out[k + "_cpu_ms"] = [], []
    for _ in range(a.reads):
        for k, read in ways.items():
            t0, c0 = time.perf_counter(), time.process_time()
            back = read()
            out[k + "_cpu_ms"].append((time.process_time() - c0) * 1e3)
            out[k].append(time.perf_counter() - t0)
            if back != data:
                raise SystemExit(f"{k}: {len(back)} of {len(data)} bytes, or other bytes")
    out["bytes"] = len(data)
    sb.kill()
    if code:
        s = c.create(template=CODE_TEMPLATE)
        out["run_code"] = []
        path = f"/v1/sandboxes/{s.id}/run_code"
        c.request("POST", path, {"code": "1+1"})  # the kernel's first run
        for _ in range(a.code_runs):
            t0 = time.perf_counter()
            r = c.request("POST", path, {"code": "1+1"})
            out["run_code"].append((time.perf_counter() - t0) * 1e3)
            if '"text": "2"' not in json.dumps(r):
                raise SystemExit(f"run_code: {r!r}")
        s.kill()
    return out


def mbs(o, k):
    """MB/s of o[k]: one time, or the p50 of a list of them."""
    if k not in o:
        return "-"
    t = pct(o[k], 50) if isinstance(o[k], list) else o[k]
    cpu = f", {pct(o[k + '_cpu_ms'], 50):.0f} ms CPU" if k + "_cpu_ms" in o else ""
    return f"{o['bytes'] / t / 1e6:.1f} MB/s{cpu}"


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--creates", type=int, default=5)
    ap.add_argument("--runs", type=int, default=50)
    ap.add_argument("--mib", type=int, default=10)
    ap.add_argument("--reads", type=int, default=5)
    ap.add_argument("--code-runs", type=int, default=20)
    ap.add_argument("--no-code", action="store_true")
    ap.add_argument("--smoke", action="store_true")
    a = ap.parse_args()
    if a.smoke:
        a.creates, a.runs, a.mib, a.reads, a.no_code = 1, 3, 1, 1, True
    code = not a.no_code and os.path.exists(os.path.join(image_dir(), CODE_TEMPLATE + ".ext4"))
    w = Warren({"boot_timeout_seconds": "300", "max_sandboxes": "8"}).start()
    try:
        s = sdk(w, a, code)
        n = native(w, a, code)
    finally:
        w.cleanup()
    print(f"# {time.strftime('%Y-%m-%d %H:%M UTC', time.gmtime())}, {platform.node()}, "
          f"load {os.getloadavg()[0]:.1f}; creates {a.creates}, runs {a.runs}, {a.mib} MiB, "
          f"reads {a.reads}")
    rows = [
        (f"create -> first `echo ready` answered (n={a.creates})", ms(s["create_first"]),
         ms(n["create_first"])),
        (f"`true` round trip (n={a.runs}; the SDK runs `bash -l -c true`)", ms(s["run_true"]),
         ms(n["run_true"])),
        (f"`bash -l -c true` round trip (n={a.runs})", "-", ms(n["run_bash_l"])),
        (f"file write {a.mib} MiB", mbs(s, "write_s"), mbs(n, "write_s")),
        (f"file write {a.mib} MiB, gzip (SDK's gzip: true)", mbs(s, "write_gzip_s"), "-"),
        (f"file read {a.mib} MiB, the first, right after the write (SDK: `bytes`)",
         mbs(s, "read_first_s"), mbs(n, "read_first_s")),
        (f"file read {a.mib} MiB (n={a.reads}): SDK `bytes`; Warren's own read",
         mbs(s, "read_bytes"), mbs(n, "read_native")),
        ("... SDK `blob`", mbs(s, "read_blob"), "-"),
        ("... SDK `stream` (its chunks gathered)", mbs(s, "read_stream"), "-"),
        ("... SDK `text`, the default (an ASCII file)", mbs(s, "read_text"), "-"),
        ("... envd's GET /files without the SDK: Node's http; Python's http.client",
         mbs(s, "read_node_http"), mbs(n, "read_envd")),
    ]
    if code:
        rows.append((f"`1+1` code run (n={a.code_runs})", ms(s.get("run_code", [])),
                     ms(n.get("run_code", []))))
    print("| measure | e2b JS SDK | Warren Python client |\n|---|---|---|")
    for r in rows:
        print(f"| {r[0]} | {r[1]} | {r[2]} |")


if __name__ == "__main__":
    main()
