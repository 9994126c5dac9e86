"""Exec against real microVMs: guest kernel, streams, timeouts, stdin, errors."""
import hashlib
import json
import os
import unittest

from warren import SANITIZED, WarrenCase


class ExecTest(WarrenCase):
    @classmethod
    def setUpClass(cls):
        super().setUpClass()
        cls.sid = cls.w.create()

    def test_uname_is_guest_kernel(self):
        for tmpl in ("minimal", "base"):
            sid = self.sid if tmpl == "minimal" else self.w.create(template="base")
            res = self.w.run(sid, "uname -r")
            rel = res["stdout"].strip()
            self.assertEqual(res["exit_code"], 0)
            self.assertNotEqual(rel, os.uname().release)
            self.assertRegex(rel, r"^6\.1\.\d+")
            if tmpl == "base":
                py = self.w.run(sid, ["python3", "-c", "import sys; print(sys.version_info[0])"])
                self.assertEqual(py["stdout"], "3\n")
                self.assertEqual(self.w.delete(sid).status, 200)

    def test_stdout_stderr_exit_code(self):
        res = self.w.run(self.sid, "echo out; echo err >&2; exit 3")
        self.assertEqual((res["stdout"], res["stderr"], res["exit_code"]), ("out\n", "err\n", 3))
        self.assertIsNone(res["signal"])
        self.assertFalse(res["timed_out"])
        self.assertGreaterEqual(res["duration_ms"], 0)

    def test_argv_env_cwd_user_stdin(self):
        res = self.w.run(self.sid, ["sh", "-c", 'echo "$FOO $(pwd) $(id -u)"; cat'],
                         env={"FOO": "bar baz"}, cwd="/tmp", user="user", stdin="in-data")
        self.assertEqual(res["stdout"], "bar baz /tmp 1000\nin-data")
        res = self.w.run(self.sid, "id -u")
        self.assertEqual(res["stdout"], "0\n")

    def test_binary_output_is_base64(self):
        res = self.w.run(self.sid, r"printf '\377\376A'")
        self.assertNotIn("stdout", res)
        self.assertEqual(res["stdout_b64"], "//5B")

    def test_signal_exit(self):
        res = self.w.run(self.sid, "kill -9 $$")
        self.assertEqual(res["signal"], 9)
        self.assertEqual(res["exit_code"], 137)

    def test_timeout_kills_process_and_children(self):
        res = self.w.run(self.sid, "sleep 1000 & echo $!; sleep 1000", timeout_seconds=2)
        self.assertTrue(res["timed_out"])
        child = res["stdout"].strip()
        self.assertTrue(child.isdigit(), res)
        # The background grandchild must be gone too, not just the shell.
        check = self.w.run(self.sid, f"kill -0 {child} 2>/dev/null && echo alive || echo gone")
        self.assertEqual(check["stdout"], "gone\n")

    def test_exec_errors(self):
        sid = self.sid
        self.assertError(self.w.exec(sid, "true", cwd="/no/such/dir"), 400, "exec_failed")
        self.assertError(self.w.exec(sid, ["/no/such/binary"]), 400, "exec_failed")
        self.assertError(self.w.request("POST", f"/v1/sandboxes/{sid}/exec", {"cmd": 5}), 400,
                         "invalid_argument")
        self.assertError(self.w.request("POST", f"/v1/sandboxes/{sid}/exec",
                                        {"cmd": "true", "argv": ["true"]}), 400)
        self.assertError(self.w.request("POST", f"/v1/sandboxes/{sid}/exec",
                                        {"cmd": "true", "bogus": 1}), 400, "invalid_argument")
        self.assertError(self.w.request("POST", "/v1/sandboxes/sb-nope/exec", {"cmd": "true"}),
                         404, "sandbox_not_found")

    def test_ndjson_200mib_in_order(self):
        # ~200 MiB of numbered lines on stdout and a marker on stderr, streamed as NDJSON.
        # Under ASan a tenth of it: the same code paths, without the bulk twice in CI.
        n = 2_500_000 if SANITIZED else 25_000_000  # 19e6 or 214e6 bytes
        # numlines prints what `seq 1 n` prints; BusyBox's seq would spend ~200 s
        # of TCG time formatting the numbers through floating point.
        nl = self.w.put_numlines(self.sid)
        self.assertEqual(self.w.run(self.sid, f"{nl} 1 3")["stdout"], "1\n2\n3\n")
        c = self.w.conn()
        body = json.dumps({"cmd": f"{nl} 1 {n}; echo done >&2"})
        c.request("POST", f"/v1/sandboxes/{self.sid}/exec", body=body,
                  headers={"Authorization": f"Bearer {self.w.key}",
                           "Accept": "application/x-ndjson"})
        r = c.getresponse()
        self.assertEqual(r.status, 200)
        self.assertIn("application/x-ndjson", r.getheader("Content-Type"))
        got = hashlib.sha256()
        offs = {"stdout": 0, "stderr": 0}
        stderr = b""
        last = None
        for line in r:
            ev = json.loads(line)
            if ev["type"] == "exit":
                last = ev
                continue
            data = ev["data"].encode() if "data" in ev else __import__("base64").b64decode(
                ev["data_b64"])
            self.assertEqual(ev["offset"], offs[ev["type"]], "offsets must be contiguous")
            offs[ev["type"]] += len(data)
            if ev["type"] == "stdout":
                got.update(data)
            else:
                stderr += data
        c.close()
        want = hashlib.sha256()
        total = 0
        chunk = []
        for i in range(1, n + 1):
            chunk.append(str(i))
            if len(chunk) == 100000 or i == n:
                b = ("\n".join(chunk) + "\n").encode()
                want.update(b)
                total += len(b)
                chunk = []
        self.assertIsNotNone(last, "the stream must end with an exit record")
        self.assertEqual(last["exit_code"], 0)
        self.assertEqual(offs["stdout"], total)
        self.assertEqual(got.hexdigest(), want.hexdigest())
        self.assertEqual(stderr, b"done\n")

    def test_many_concurrent_execs(self):
        import concurrent.futures
        with concurrent.futures.ThreadPoolExecutor(16) as ex:
            futs = [ex.submit(self.w.run, self.sid, f"echo {i}") for i in range(32)]
            outs = sorted(int(f.result()["stdout"]) for f in futs)
        self.assertEqual(outs, list(range(32)))


if __name__ == "__main__":
    unittest.main()
