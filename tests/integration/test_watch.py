"""File watches over REST, against real microVMs: guest-init's --watch
builtin runs as a background process of the sandbox and its events stream as
NDJSON; a watch outlives its client and a kill -9 of warrend, resumes from an
offset with nothing missed, survives a flood without warrend's memory growing,
and is capped per sandbox."""
import json
import os
import time
import unittest

from warren import SANITIZED, RssPeak, Warren, WarrenCase, built

FSFLOOD = "FSFLOOD"


class Stream:
    """A watch's NDJSON answer, read line by line as it comes."""

    def __init__(self, w, path, timeout=300):
        self.c = w.conn(timeout)
        self.c.request("GET", path, headers={"Authorization": f"Bearer {w.key}"})
        self.r = self.c.getresponse()
        self.status = self.r.status
        self.headers = self.r.headers  # case-insensitive
        self.events = []

    def body(self):
        return self.r.read()

    def next(self):
        line = self.r.readline()
        if not line:
            return None
        ev = json.loads(line)
        self.events.append(ev)
        return ev

    def until(self, pred, what):
        """Events up to and including the first that pred accepts."""
        got = []
        while True:
            ev = self.next()
            if ev is None:
                raise AssertionError(f"stream ended before {what}: {got[-20:]}")
            got.append(ev)
            if pred(ev):
                return got

    def close(self):
        self.c.close()


def named(name, type_=None):
    return lambda ev: ev.get("name") == name and (type_ is None or ev["type"] == type_)


def watch(w, sid, path, recursive=False):
    q = f"/v1/sandboxes/{sid}/files/watch?path={path}"
    if recursive:
        q += "&recursive=true"
    return Stream(w, q)


def resume(w, sid, wid, offset):
    return Stream(w, f"/v1/sandboxes/{sid}/files/watch/{wid}?offset={offset}")


def started(tc, s, path, recursive):
    """The head and first two lines of a new watch; returns (id, ready)."""
    tc.assertEqual(s.status, 200, s.body()[:300] if s.status != 200 else "")
    tc.assertEqual(s.headers.get("Content-Type"), "application/x-ndjson")
    first = s.next()
    tc.assertEqual(first["type"], "watch", first)
    tc.assertEqual(str(first["id"]), s.headers.get("X-Warren-Watch"))
    tc.assertEqual(first["offset"], 0)
    ready = s.next()
    tc.assertEqual(ready["type"], "ready", ready)
    tc.assertEqual(ready["path"], path)
    tc.assertEqual(ready["recursive"], recursive)
    tc.assertGreater(ready["offset"], 0)
    return first["id"], ready


class WatchTest(WarrenCase):
    conf = {"watch_max_per_sandbox": "3", "watch_max_dirs": "64"}

    @classmethod
    def setUpClass(cls):
        super().setUpClass()
        cls.sid = cls.w.create()

    def tearDown(self):
        # A failed test must not leave its watches counting against the next test's cap.
        for pid, p in self.procs().items():
            if p["running"] and (p["tag"] or "").startswith("watch:"):
                self.w.request("DELETE", f"/v1/sandboxes/{self.sid}/files/watch/{pid}")

    def sh(self, cmd):
        r = self.w.run(self.sid, cmd)
        self.assertEqual(r["exit_code"], 0, r)

    def procs(self):
        r = self.w.request("GET", f"/v1/sandboxes/{self.sid}/processes")
        self.assertEqual(r.status, 200, r)
        return {p["pid"]: p for p in r.json()["processes"]}

    def end(self, wid):
        r = self.w.request("DELETE", f"/v1/sandboxes/{self.sid}/files/watch/{wid}")
        self.assertEqual(r.status, 200, r)
        self.assertEqual(r.json()["id"], wid)
        self.assertFalse(r.json()["running"])

    def test_events_recursive(self):
        self.sh("mkdir -p /tmp/ev/old/deep")
        s = watch(self.w, self.sid, "/tmp/ev", recursive=True)
        try:
            wid, ready = started(self, s, "/tmp/ev", True)
            self.assertEqual(ready["watches"], 3)  # ev, old, old/deep
            self.assertTrue(self.procs()[wid]["tag"].startswith("watch:/tmp/ev"))
            self.sh("echo a > /tmp/ev/a")
            got = s.until(named("a", "write"), "write of a")
            self.assertIn({"type": "create", "name": "a", "path": "/tmp/ev/a"},
                          [{k: e[k] for k in ("type", "name", "path")} for e in got])
            self.sh("chmod 600 /tmp/ev/a")
            s.until(named("a", "chmod"), "chmod of a")
            self.sh("mv /tmp/ev/a /tmp/ev/b")
            ev = s.until(lambda e: e["type"] == "rename", "rename")[-1]
            self.assertEqual((ev["name"], ev["from"], ev["path"]), ("b", "a", "/tmp/ev/b"))
            self.sh("rm /tmp/ev/b")
            s.until(named("b", "remove"), "remove of b")
            # A directory made now, and a file made in it at once: both seen, whether
            # the file came before the directory's own watch (the scan) or after.
            self.sh("mkdir /tmp/ev/sub && echo c > /tmp/ev/sub/c")
            got = s.until(named("sub/c", "create"), "create of sub/c")
            self.assertIn(("create", "sub", True),
                          [(e["type"], e["name"], e.get("dir", False)) for e in got])
            # A directory there before the watch began, two levels down.
            self.sh("echo d > /tmp/ev/old/deep/d")
            ev = s.until(named("old/deep/d", "create"), "create in an old subdir")[-1]
            self.assertEqual(ev["path"], "/tmp/ev/old/deep/d")
            # A renamed directory's events carry its new name.
            self.sh("mv /tmp/ev/old /tmp/ev/new && echo e > /tmp/ev/new/deep/e")
            s.until(named("new/deep/e", "create"), "create under a renamed dir")
            # A directory moved out is a remove; what happens in it later is not ours.
            self.sh("mv /tmp/ev/new /tmp/gone && echo f > /tmp/gone/deep/f && echo g > /tmp/ev/g")
            got = s.until(named("g", "create"), "create of g")
            self.assertIn(("remove", "new"), [(e["type"], e["name"]) for e in got])
            self.assertNotIn("new/deep/f", [e.get("name") for e in got])
            # Offsets grow, one per line: each is where a resume would go on from.
            offs = [e["offset"] for e in s.events[1:]]
            self.assertEqual(offs, sorted(set(offs)))
        finally:
            s.close()
        self.end(wid)

    def test_not_recursive(self):
        self.sh("mkdir -p /tmp/flat")
        s = watch(self.w, self.sid, "/tmp/flat")
        try:
            wid, _ = started(self, s, "/tmp/flat", False)
            self.sh("mkdir /tmp/flat/d && echo x > /tmp/flat/d/x && echo y > /tmp/flat/top")
            got = s.until(named("top", "create"), "create of top")
            names = [e.get("name") for e in got]
            self.assertIn("d", names)
            self.assertNotIn("d/x", names)
        finally:
            s.close()
        self.end(wid)

    def test_resume_after_disconnect(self):
        self.sh("mkdir -p /tmp/res")
        s = watch(self.w, self.sid, "/tmp/res")
        wid, ready = started(self, s, "/tmp/res", False)
        self.sh("echo 1 > /tmp/res/f1")
        last = s.until(named("f1", "create"), "f1")[-1]["offset"]
        s.close()
        # No client: the watch runs on, and what happens now is kept in the guest.
        self.sh("for i in 2 3 4 5; do : > /tmp/res/f$i; done")
        self.assertTrue(self.procs()[wid]["running"])
        r = resume(self.w, self.sid, wid, last)
        try:
            self.assertEqual(r.status, 200)
            self.assertEqual(r.headers.get("X-Warren-Watch"), str(wid))
            self.assertEqual(r.next(), {"type": "watch", "id": wid, "offset": last})
            got = r.until(named("f5", "create"), "f5")
            self.assertNotIn("lost", [e["type"] for e in got])
            creates = [e["name"] for e in got if e["type"] == "create"]
            self.assertEqual(creates, ["f2", "f3", "f4", "f5"])
            # Whatever came between f1's line and f2's was not an f1 create again.
            self.assertNotIn("f1", creates)
        finally:
            r.close()
        # From 0, the whole watch again: its ready line first.
        r = resume(self.w, self.sid, wid, 0)
        try:
            r.next()
            self.assertEqual(r.next()["type"], "ready")
        finally:
            r.close()
        # Past its end: a plain error, before any stream.
        r = self.w.request("GET", f"/v1/sandboxes/{self.sid}/files/watch/{wid}?offset={10**9}")
        self.assertError(r, 400, "bad_offset")
        self.end(wid)
        # An ended watch's stream ends with its exit.
        r = resume(self.w, self.sid, wid, last)
        self.assertEqual(r.status, 200)
        lines = [json.loads(x) for x in r.body().splitlines()]
        r.close()
        self.assertEqual(lines[-1]["type"], "end", lines[-3:])

    def test_bad_requests(self):
        self.sh("mkdir -p /tmp/bad && echo x > /tmp/bad/file")
        base = f"/v1/sandboxes/{self.sid}/files/watch"
        r = self.w.request("GET", base + "?path=/tmp/bad/none")
        self.assertError(r, 404, "file_not_found")
        r = self.w.request("GET", base + "?path=/tmp/bad/file")
        self.assertError(r, 400, "not_a_directory")
        self.assertError(self.w.request("GET", base + "?path=tmp/bad"), 400, "bad_request")
        self.assertError(self.w.request("GET", base), 400, "bad_request")
        self.assertError(self.w.request("GET", base + "?path=/tmp&bogus=1"), 400, "bad_request")
        # A process that is not a watch, and no process at all.
        pid = self.w.request("POST", f"/v1/sandboxes/{self.sid}/exec",
                             {"cmd": "sleep 600", "background": True}).json()["pid"]
        self.assertError(self.w.request("GET", f"{base}/{pid}?offset=0"), 404, "watch_not_found")
        self.assertError(self.w.request("DELETE", f"{base}/{pid}"), 404, "watch_not_found")
        self.assertTrue(self.procs()[pid]["running"])
        self.assertError(self.w.request("GET", f"{base}/4000000?offset=0"), 404,
                         "watch_not_found")
        self.assertError(self.w.request("GET", "/v1/sandboxes/nosuch/files/watch?path=/tmp"),
                         404, "sandbox_not_found")
        # The failed watches leave no process running (each exits after its error line:
        # the process list may show it a moment longer).
        deadline = time.time() + 15
        while True:
            running = [p for p in self.procs().values()
                       if p["running"] and (p["tag"] or "").startswith("watch:")]
            if not running or time.time() > deadline:
                break
            time.sleep(0.2)
        self.assertEqual(running, [])

    def test_cap(self):
        self.sh("mkdir -p /tmp/cap")
        streams, ids = [], []
        try:
            for _ in range(3):
                s = watch(self.w, self.sid, "/tmp/cap")
                ids.append(started(self, s, "/tmp/cap", False)[0])
                streams.append(s)
            r = self.w.request("GET", f"/v1/sandboxes/{self.sid}/files/watch?path=/tmp/cap")
            self.assertError(r, 429, "too_many_watches")
            # Ending one makes room; its client sees its stream end.
            self.end(ids[0])
            last = streams[0].until(lambda e: e["type"] == "end", "the end of a deleted watch")
            self.assertIsNone(streams[0].next())
            self.assertEqual(last[-1]["signal"], 15)
            s = watch(self.w, self.sid, "/tmp/cap")
            streams.append(s)
            ids.append(started(self, s, "/tmp/cap", False)[0])
            # Every live watch sees the same event.
            self.sh("echo z > /tmp/cap/z")
            for s in streams[1:]:
                s.until(named("z", "create"), "create of z")
            self.end(ids[0])  # already ended: still 200, not running
        finally:
            for s in streams:
                s.close()
        for wid in ids[1:]:
            self.end(wid)

    def test_tree_past_the_cap(self):
        # 200 subdirectories with 5 files each and room for 64 watches: the root and 63
        # subdirectories are watched, each of the other 137 is reported once.
        self.sh("mkdir -p /tmp/tree && cd /tmp/tree && i=0; while [ $i -lt 200 ]; do "
                "mkdir d$i && : > d$i/a && : > d$i/b && : > d$i/c && : > d$i/d && : > d$i/e; "
                "i=$((i+1)); done")
        s = watch(self.w, self.sid, "/tmp/tree", recursive=True)
        try:
            self.assertEqual(s.status, 200)
            self.assertEqual(s.next()["type"], "watch")
            got = s.until(lambda e: e["type"] == "ready", "ready")
            unwatched = [e for e in got if e["type"] == "unwatched"]
            self.assertEqual(len(unwatched), 137)
            self.assertTrue(all(e["reason"] == "limit" for e in unwatched), unwatched[:3])
            self.assertEqual(len({e["name"] for e in unwatched}), 137)
            self.assertEqual(got[-1]["watches"], 64)
            watched = sorted({f"d{i}" for i in range(200)} - {e["name"] for e in unwatched})
            self.sh(f"echo > /tmp/tree/{watched[0]}/new")
            s.until(named(f"{watched[0]}/new", "create"), "a create in a watched subdir")
            wid = s.events[0]["id"]
        finally:
            s.close()
        self.end(wid)

    def test_flood(self):
        flood = self.w.put_guestbin(self.sid, "fsflood", FSFLOOD)
        self.sh("mkdir -p /tmp/fl")
        s = watch(self.w, self.sid, "/tmp/fl", recursive=True)
        wid, ready = started(self, s, "/tmp/fl", True)
        # One write to one file, 200k times: coalesced to a handful of write events.
        self.sh(f"{flood} write /tmp/fl/one 200000")
        self.sh("echo > /tmp/fl/mark1")
        got = s.until(named("mark1", "create"), "mark1")
        writes = [e for e in got if e["type"] == "write" and e["name"] == "one"]
        self.assertGreaterEqual(len(writes), 1)
        self.assertLess(len(writes), 2000, "200k writes were not coalesced")
        s.close()
        # 20k rounds of create, write and remove (60k events, ~4 MiB of lines: the
        # guest's 1 MiB ring overflows) with the client connected but not reading:
        # the guest's ring and the kernel's queue overflow, warrend's memory does not.
        raw = self.w.raw_request("GET", f"/v1/sandboxes/{self.sid}/files/watch/{wid}?offset="
                                 f"{got[-1]['offset']}", rcvbuf=4096)
        try:
            with RssPeak(self.w.proc.pid) as peak:
                base = peak.kib
                self.sh(f"{flood} churn /tmp/fl 20000")
            if not SANITIZED:
                self.assertLess(peak.kib - base, 32 * 1024, f"{base} -> {peak.kib} KiB")
        finally:
            raw.close()
        # Read again from there: the gap says so, and the watch still works.
        self.sh("echo > /tmp/fl/mark2")
        r = resume(self.w, self.sid, wid, got[-1]["offset"])
        try:
            got = r.until(named("mark2", "create"), "mark2 after the flood")
            types = {e["type"] for e in got}
            self.assertIn("lost", types, [e for e in got if e["type"] not in
                                          ("create", "write", "remove")][:5])
        finally:
            r.close()
        self.assertTrue(self.procs()[wid]["running"])
        self.end(wid)


class WatchRestartTest(unittest.TestCase):
    def test_kill9_warrend_watch_carries_on(self):
        w = Warren()
        try:
            w.start()
            sid = w.create()
            r = w.run(sid, "mkdir -p /tmp/k")
            s = watch(w, sid, "/tmp/k", recursive=True)
            wid, ready = started(self, s, "/tmp/k", True)
            s.close()
            w.kill9()
            w.start()
            deadline = time.time() + 60
            while True:
                r = w.exec(sid, "mkdir /tmp/k/after && echo > /tmp/k/after/x")
                if r.status == 200 or time.time() > deadline:
                    break
                self.assertEqual(r.status, 503, r)  # reconnecting to the guest
                time.sleep(0.1)
            self.assertEqual(r.status, 200, r)
            st = resume(w, sid, wid, ready["offset"])
            try:
                self.assertEqual(st.status, 200)
                got = st.until(named("after/x", "create"), "a create after the restart")
                self.assertEqual(got[0], {"type": "watch", "id": wid, "offset": ready["offset"]})
                self.assertIn(("create", "after"), [(e["type"], e.get("name")) for e in got])
            finally:
                st.close()
        finally:
            w.cleanup()


if __name__ == "__main__":
    unittest.main()
