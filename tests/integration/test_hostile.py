"""A hostile guest: root inside a real sandbox takes PID 1's channel descriptor
(pidfd_getfd), stops the agent with ptrace, and writes frames of its own
(tests/hostile/hostile.c, uploaded and run with exec). For every case:
warrend stays up, its RSS stays under a ceiling, another sandbox keeps
answering exec, and the hostile sandbox's operations fail with
protocol_violation (or get a bounded answer) until, after
protocol_violations_max violations, it is dead with that reason."""
import json
import time
import unittest

from warren import SANITIZED, RssPeak, WarrenCase, hostile_path

CEIL_KIB = 48 * 1024  # warrend's RSS ceiling during any case (it idles at ~10 MiB)


class Peak(RssPeak):
    """warrend's RSS peak during one case, kept by name for the summary line."""

    def __init__(self, pid, name):
        super().__init__(pid)
        self.name = name

    def __exit__(self, *exc):
        super().__exit__(*exc)
        HostileGuestTest.peaks[self.name] = self.kib  # kept even when the case failed


class HostileGuestTest(WarrenCase):
    conf = {}  # the default protocol_violations_max (5): the fifth violation kills
    peaks = {}

    @classmethod
    def setUpClass(cls):
        super().setUpClass()
        cls.good = cls.w.create(ttl_seconds=3600)
        with open(hostile_path(), "rb") as f:
            cls.program = f.read()

    @classmethod
    def tearDownClass(cls):
        if cls.peaks:
            print("\nwarrend peak RSS per hostile case (KiB): " +
                  ", ".join(f"{k} {v}" for k, v in cls.peaks.items()))
        for line in cls.w.log_text().splitlines():
            if "protocol violation" in line or "dead:" in line:
                print(line)
        super().tearDownClass()

    # -- helpers --
    def hostile_sandbox(self):
        sid = self.w.create(ttl_seconds=3600)
        r = self.w.request("PUT", f"/v1/sandboxes/{sid}/files?path=/tmp/hostile&mode=0755",
                           body=self.program)
        self.assertEqual(r.status, 200, r)
        return sid

    def start(self, sid, case):
        """Run the hostile program streamed; return its response once the agent is stopped."""
        c = self.w.conn(timeout=300)
        c.request("POST", f"/v1/sandboxes/{sid}/exec",
                  body=json.dumps({"argv": ["/tmp/hostile", case]}),
                  headers={"Authorization": f"Bearer {self.w.key}",
                           "Content-Type": "application/json",
                           "Accept": "application/x-ndjson"})
        r = c.getresponse()
        self.assertEqual(r.status, 200)
        first = json.loads(r.readline())
        self.assertEqual(first.get("data"), "READY\n", first)
        return c, r

    def rest(self, c, r):
        """The remaining NDJSON lines of the hostile exec; the last one."""
        last = None
        try:
            for line in r:
                if line.strip():
                    last = json.loads(line)
        finally:
            c.close()
        return last

    def assert_violation_line(self, last):
        self.assertIsNotNone(last)
        self.assertEqual(last.get("type"), "error", last)
        self.assertEqual(last["error"]["code"], "protocol_violation", last)

    def assert_download_cut(self, sid):
        """A download whose guest broke the rules: a 502 if nothing was sent yet, else a
        body cut short of its Content-Length (the only way left to say it failed)."""
        import http.client
        c = self.w.conn(timeout=300)
        try:
            c.request("GET", f"/v1/sandboxes/{sid}/files?path=/etc/hostname",
                      headers={"Authorization": f"Bearer {self.w.key}"})
            r = c.getresponse()
            if r.status == 502:
                self.assertEqual(json.loads(r.read())["error"]["code"], "protocol_violation")
                return
            self.assertEqual(r.status, 200)
            self.assertEqual(r.getheader("Content-Length"), "10")
            with self.assertRaises(http.client.IncompleteRead):
                r.read()
        finally:
            c.close()

    def wait_usable(self, sid, timeout=120):
        """The hostile sandbox answers exec again (its channel came back after the backoff)."""
        deadline = time.time() + timeout
        while time.time() < deadline:
            r = self.w.exec(sid, "echo back")
            if r.status == 200:
                self.assertEqual(r.json()["stdout"], "back\n")
                return
            # 503 while it reconnects; an exec caught by the violation itself fails with it.
            if r.status == 502:
                self.assertEqual(r.json()["error"]["code"], "protocol_violation", r)
            else:
                self.assertEqual(r.status, 503, r)
            time.sleep(0.2)
        self.fail(f"{sid} never answered again:\n{self.w.log_text()}")

    def check_case(self, name, peak):
        self.assertIsNone(self.w.proc.poll(), "warrend died:\n" + self.w.log_text())
        self.assertEqual(self.w.request("GET", "/healthz").status, 200)
        self.assertEqual(self.w.run(self.good, "echo ok")["stdout"], "ok\n")
        if not SANITIZED:
            self.assertLess(peak.kib, CEIL_KIB, f"{name}: warrend RSS {peak.kib} KiB")

    # -- cases: each on a fresh sandbox, so one case's outcome is its own --
    def test_list_huge(self):
        """800,000 one-byte list entries: bounded and flagged, not a violation."""
        sid = self.hostile_sandbox()
        with Peak(self.w.proc.pid, "list") as peak:
            c, r = self.start(sid, "list")
            ls = self.w.request("GET", f"/v1/sandboxes/{sid}/files/list?path=/")
            self.assertEqual(ls.status, 200, ls)
            self.assertTrue(ls.json().get("truncated"), ls.json().keys())
            self.assertEqual(len(ls.json()["entries"]), 10000)
            self.assertEqual(self.rest(c, r)["type"], "exit")
        self.check_case("list", peak)
        self.assertEqual(self.w.run(sid, "echo still")["stdout"], "still\n")

    def test_mtime_int64_max(self):
        """mtime INT64_MAX: clamped, a proper answer."""
        sid = self.hostile_sandbox()
        with Peak(self.w.proc.pid, "mtime") as peak:
            c, r = self.start(sid, "mtime")
            st = self.w.request("GET", f"/v1/sandboxes/{sid}/files/stat?path=/x")
            self.assertEqual(st.status, 200, st)
            self.assertEqual(st.json()["mtime"], "9999-12-31T23:59:59Z")
            self.assertEqual(self.rest(c, r)["type"], "exit")
        self.check_case("mtime", peak)

    def test_offsets_not_contiguous(self):
        """A partial UTF-8 byte, then output at a non-contiguous offset."""
        sid = self.hostile_sandbox()
        with Peak(self.w.proc.pid, "offsets") as peak:
            c, r = self.start(sid, "offsets")
            self.assert_violation_line(self.rest(c, r))
            self.wait_usable(sid)
        self.check_case("offsets", peak)

    def test_out_past_window(self):
        """64 MiB of output against a 1 MiB window while the client reads nothing."""
        sid = self.hostile_sandbox()
        with Peak(self.w.proc.pid, "window") as peak:
            c, r = self.start(sid, "window")
            self.wait_usable(sid)
            self.assert_violation_line(self.rest(c, r))
        self.check_case("window", peak)

    def test_exit_signal_2_40(self):
        sid = self.hostile_sandbox()
        with Peak(self.w.proc.pid, "exit_sig") as peak:
            c, r = self.start(sid, "exit_sig")
            self.assert_violation_line(self.rest(c, r))
            self.wait_usable(sid)
        self.check_case("exit_sig", peak)

    def test_download_over_announced_size(self):
        """A download announced as 10 bytes, then 64 KiB of it."""
        sid = self.hostile_sandbox()
        with Peak(self.w.proc.pid, "fread") as peak:
            c, r = self.start(sid, "fread")
            self.assert_download_cut(sid)
            self.assert_violation_line(self.rest(c, r))
            self.wait_usable(sid)
        self.check_case("fread", peak)

    def test_hello_flood(self):
        """3 million HELLO{id:0} from a guest that reads nothing."""
        sid = self.hostile_sandbox()
        with Peak(self.w.proc.pid, "hello") as peak:
            c, r = self.start(sid, "hello")
            last = self.rest(c, r)
            self.assertEqual(last.get("type"), "error", last)
            self.wait_usable(sid)
        self.check_case("hello", peak)

    def test_upload_credit_clamped(self):
        """A guest grants 2^40 bytes of upload credit and reads nothing: warrend keeps at most
        a window in flight and the client's 64 MiB wait in its socket, not in warrend."""
        import http.client
        sid = self.hostile_sandbox()
        body = b"U" * (64 << 20)
        with Peak(self.w.proc.pid, "upload") as peak:
            c, r = self.start(sid, "upload")
            up = self.w.conn(timeout=300)
            status = None
            try:
                up.request("PUT", f"/v1/sandboxes/{sid}/files?path=/tmp/up&mode=0644",
                           body=body, headers={"Authorization": f"Bearer {self.w.key}"})
                status = up.getresponse().status
            except (ConnectionError, http.client.HTTPException):
                pass  # answered (the guest's ERROR) before the body was all sent
            finally:
                up.close()
            self.assertNotEqual(status, 200)
            self.assertEqual(self.rest(c, r)["type"], "exit")
        self.check_case("upload", peak)
        self.assertEqual(self.w.run(sid, "echo still")["stdout"], "still\n")

    def test_bogus_stream_id(self):
        sid = self.hostile_sandbox()
        with Peak(self.w.proc.pid, "bogus_id") as peak:
            c, r = self.start(sid, "bogus_id")
            self.assert_violation_line(self.rest(c, r))
            self.wait_usable(sid)
        self.check_case("bogus_id", peak)

    def test_violations_until_dead(self):
        """Each violation reconnects later than the last; the fifth ends the sandbox."""
        sid = self.hostile_sandbox()
        for i in range(4):
            c, r = self.start(sid, "exit_sig")
            self.assert_violation_line(self.rest(c, r))
            self.wait_usable(sid)
            self.assertEqual(self.w.get(sid).json()["state"], "running")
        c, r = self.start(sid, "exit_sig")
        self.rest(c, r)
        info = self.w.wait_state(sid, ["dead"], timeout=60)
        self.assertTrue(info["end_reason"].startswith("protocol_violation: "), info)
        self.assertIn("signal 1099511627776", info["end_reason"])
        self.assertError(self.w.exec(sid, "true"), 409, "sandbox_dead")
        self.assertEqual(self.w.run(self.good, "echo ok")["stdout"], "ok\n")


if __name__ == "__main__":
    unittest.main()
