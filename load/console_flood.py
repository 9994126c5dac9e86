#!/usr/bin/env python3
"""A guest floods its console while another sandbox answers execs.

    load/console_flood.py [--seconds 30] [--floods 2]

Starts warrend (tests/integration/warren.py; WARREND picks the binary), makes
--floods sandboxes write to /dev/console as fast as they can for --seconds,
and meanwhile times `true` execs on a quiet sandbox. Prints the exec latency
(median, max), warrend's peak RSS, and each flooded console.log's size and
markers. Compare two warrend builds by running it with each.
"""
import argparse
import os
import re
import statistics
import sys
import threading
import time

sys.path.insert(0, os.path.join(os.path.dirname(__file__), "..", "tests", "integration"))
from warren import RssPeak, Warren  # noqa: E402


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--seconds", type=int, default=30)
    ap.add_argument("--floods", type=int, default=2)
    a = ap.parse_args()
    w = Warren({"console_log_bytes": 1048576}).start()
    try:
        quiet = w.create()
        floods = [w.create() for _ in range(a.floods)]
        w.run(quiet, "true")
        cmd = (f"end=$(($(date +%s)+{a.seconds})); "
               "while [ $(date +%s) -lt $end ]; do cat /proc/kallsyms; done > /dev/console")
        threads = [threading.Thread(target=w.run, args=(s, cmd), kwargs={"timeout_seconds": 600})
                   for s in floods]
        lat = []
        with RssPeak(w.proc.pid) as rss:
            for t in threads:
                t.start()
            time.sleep(2)  # the floods are under way
            end = time.time() + a.seconds - 4
            while time.time() < end:
                t0 = time.monotonic()
                w.run(quiet, "true")
                lat.append((time.monotonic() - t0) * 1000)
            for t in threads:
                t.join()
        print(f"warrend {os.environ.get('WARREND', 'build/server/warrend')}")
        print(f"exec `true` on the quiet sandbox during {a.floods} console floods: "
              f"{len(lat)} execs, median {statistics.median(lat):.0f} ms, "
              f"max {max(lat):.0f} ms; warrend peak RSS {rss.kib // 1024} MiB")
        for s in floods:
            p = f"{w.run_dir(s)}/console.log"
            with open(p, "rb") as f:
                b = f.read()
            m = re.search(rb"console truncated, +(\d+) bytes dropped", b)
            lost = sum(int(x) for x in re.findall(rb"(\d+) bytes of console output dropped", b))
            print(f"  {s}: console.log {len(b)} bytes; compacted away "
                  f"{int(m.group(1)) if m else 0}, dropped from the queue (marked) {lost}")
    finally:
        w.cleanup()


if __name__ == "__main__":
    main()
