"""PTY output through the PTY WebSocket, by producer, and keystroke echo: one table,
two guest image sets side by side in one run.

    load/run --pty-out [--images DIR] [--old-images DIR] [--echo N] [--vcpus N]

Per image set one warrend (jail off) and one sandbox, measured interleaved so both
see the same machine. Each producer runs as the PTY's command; a python3-websockets
client acknowledges every OUTPUT frame at once (the PTY socket's flow control) and
counts bytes and frames until the exit frame: MB/s of payload, frames, bytes per
frame. Producers: one big write after another (dd 64 KiB blocks), BusyBox head
(4 KiB writes), a line per write (seq, ls -lR), 2 bytes per write (yes | head).
Then keystroke echo through `cat` in a PTY: back to back (the next key once the
last one's echo is in) and paced (a key every 50 ms). Beside them, the ceiling:
tests/guestbin/ptyrate, uploaded into the same sandbox, moves 10 MiB through a PTY
of the guest's own, in 64 KiB writes, to a reader in the guest that throws them
away (no agent, channel or host in the path), with the slave cooked (a new PTY's
defaults, as above), without output processing, and raw. Printed, not asserted.
"""
import argparse
import asyncio
import os
import platform
import sys
import time

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "tests",
                                "integration"))
from warren import Warren  # noqa: E402
from bench import pct  # noqa: E402
from test_ws_pty import Pty  # noqa: E402

PRODUCERS = [
    ("dd, 64 KiB writes, 10 MiB", "dd if=/dev/zero bs=64k count=160 2>/dev/null"),
    ("head -c 10 MiB /dev/zero", "head -c 10485760 /dev/zero"),
    ("seq 1 30000 (a line per write)", "seq 1 30000"),
    ("ls -lR /, first 3 MB", "ls -lR / 2>/dev/null | head -c 3000000"),
    ("yes | head -c 1 MB", "yes | head -c 1000000"),
]


async def produce(w, sid, cmd):
    p = await Pty.open(w, f"/v1/sandboxes/{sid}/pty", cmd=cmd)
    t0 = time.perf_counter()
    frames = 0
    while p.exit is None and await p.frame():
        frames += 1
    secs = time.perf_counter() - t0
    await p.ws.close()
    return p.received(), frames, secs


async def echo(w, sid, n, gap):
    p = await Pty.open(w, f"/v1/sandboxes/{sid}/pty", cmd="cat")
    await asyncio.sleep(0.5)
    xs = []
    for i in range(n):
        if gap:
            await asyncio.sleep(gap)
        k = chr(97 + i % 26)
        start = p.next
        t0 = time.perf_counter()
        await p.send(k)
        await p.until(k, start=start)
        xs.append((time.perf_counter() - t0) * 1e3)
    await p.ws.close()
    return xs


GUEST_PTY = ["cooked", "noopost", "raw"]


def guest_pty(w, sid, mode):
    """ptyrate in the guest: (bytes, reads, seconds) through the guest's own PTY."""
    r = w.run(sid, ["/tmp/ptyrate", mode, str(10 << 20), "65536"], timeout_seconds=300)
    _, got, reads, secs = r["stdout"].split()
    return int(got), int(reads), float(secs)


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--images", help="image set under test (default: the current one)")
    ap.add_argument("--old-images", help="image set to compare with, in the same run")
    ap.add_argument("--echo", type=int, default=200, help="keystrokes each way")
    ap.add_argument("--vcpus", type=int, default=1, help="the sandboxes' vCPUs")
    a = ap.parse_args()
    sets = [("new", a.images)] + ([("old", a.old_images)] if a.old_images else [])
    ws = []
    try:
        for label, d in sets:
            if d:
                os.environ["WARREN_IMAGE_DIR"] = os.path.abspath(d)
            w = Warren({"jail": "off", "max_sandboxes": 4}).start()
            sid = w.create(vcpus=a.vcpus)
            w.put_guestbin(sid, "ptyrate", "PTYRATE")
            ws.append((label, w, sid))
        res = {label: {} for label, _, _ in ws}

        async def run():
            for name, cmd in PRODUCERS:
                for label, w, sid in ws:
                    res[label][name] = await produce(w, sid, cmd)
            for mode in GUEST_PTY:
                for label, w, sid in ws:
                    res[label][mode] = guest_pty(w, sid, mode)
            for gap, name in ((0, "back to back"), (0.05, "a key every 50 ms")):
                for label, w, sid in ws:
                    res[label][name] = await echo(w, sid, a.echo, gap)
        asyncio.run(run())
    finally:
        for _, w, _ in ws:
            w.cleanup()

    la = os.getloadavg()
    print(f"PTY output and echo, by image set: {platform.node()}, {os.cpu_count()} CPUs, "
          f"{a.vcpus} vCPU(s) a sandbox, load average {la[0]:.2f} {la[1]:.2f} {la[2]:.2f}")
    labels = [label for label, _, _ in ws]
    print("| producer in a PTY | " + " | ".join(f"{x}: MB/s, B/frame" for x in labels) + " |")
    print("|---|" + "---|" * len(labels))
    for name, _ in PRODUCERS:
        cells = []
        for x in labels:
            got, frames, secs = res[x][name]
            cells.append(f"{got / secs / 1e6:.2f} MB/s, {got / max(frames, 1):.0f} B "
                         f"({secs:.1f} s)")
        print(f"| {name} | " + " | ".join(cells) + " |")
    for mode in GUEST_PTY:
        cells = []
        for x in labels:
            got, reads, secs = res[x][mode]
            cells.append(f"{got / secs / 1e6:.2f} MB/s, {got / max(reads, 1):.0f} B ({secs:.1f} s)")
        print(f"| in the guest, no Warren: dd-like 64 KiB writes to a {mode} PTY, 10 MiB | " +
              " | ".join(cells) + " |")
    for name in ("back to back", "a key every 50 ms"):
        cells = [f"{pct(res[x][name], 50):.2f} / {pct(res[x][name], 99):.2f} ms"
                 for x in labels]
        print(f"| keystroke echo, {name}, p50 / p99 (n={a.echo}) | " + " | ".join(cells) + " |")


if __name__ == "__main__":
    main()
