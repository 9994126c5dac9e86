"""The Python client (clients/python/warren_client.py) and the `warren` command
line (clients/warren) against a real warrend and real microVMs: what a user of
E2B's SDK or CLI does first (create, run with streamed output, files both ways,
a background process and its output, pause/resume, fork, snapshot, delete), and
how errors come out (a WarrenError with the server's code; exit status 125 and
"status code: message" from the CLI)."""
import io
import os
import subprocess
import sys
import tempfile
import unittest
import urllib.error
import urllib.parse
import urllib.request

from warren import WarrenCase, image_dir

HERE = os.path.dirname(os.path.abspath(__file__))
CLIENTS = os.path.join(HERE, "..", "..", "clients")
sys.path.insert(0, os.path.join(CLIENTS, "python"))
from warren_client import Warren as Client, WarrenError  # noqa: E402


class ClientTest(WarrenCase):
    @classmethod
    def setUpClass(cls):
        super().setUpClass()
        cls.c = Client(f"http://127.0.0.1:{cls.w.port}", cls.w.key)
        cls.sb = cls.c.create(template="minimal", ttl_seconds=cls.w.TEST_TTL_S,
                              idle_timeout_seconds=cls.w.TEST_IDLE_S,
                              metadata={"suite": "clients"})

    def cli(self, *args, stdin=None, check=True):
        env = dict(os.environ, WARREN_URL=f"http://127.0.0.1:{self.w.port}",
                   WARREN_API_KEY=self.w.key)
        p = subprocess.run([sys.executable, os.path.join(CLIENTS, "warren"), *args],
                           input=stdin, capture_output=True, env=env, timeout=600)
        if check and p.returncode != 0:
            raise AssertionError(f"warren {' '.join(args)}: {p.returncode}\n"
                                 f"{p.stderr.decode()}\n{self.w.log_text()}")
        return p

    # ------------------------------------------------------------ the SDK
    def test_run_buffered_and_streamed(self):
        r = self.sb.run("echo hi; echo oops >&2; exit 3")
        self.assertEqual((r.stdout, r.stderr, r.exit_code), ("hi\n", "oops\n", 3))
        pieces = []
        r = self.sb.run(["sh", "-c", "for i in 1 2 3; do echo $i; sleep 0.2; done"],
                        on_stdout=pieces.append)
        self.assertEqual((r.stdout, r.exit_code), ("1\n2\n3\n", 0))
        self.assertEqual("".join(pieces), "1\n2\n3\n")
        # Bytes that are not UTF-8 come back as bytes, unchanged.
        r = self.sb.run("printf '\\377\\376'", on_stdout=lambda b: None)
        self.assertEqual(r.stdout, b"\xff\xfe")

    def test_files_both_ways(self):
        data = os.urandom(3 << 20)
        self.assertEqual(self.sb.files.write("/root/c/a.bin", data)["size"], len(data))
        self.assertEqual(self.sb.files.read("/root/c/a.bin"), data)
        # A file object is streamed (chunked), and read back into one.
        self.sb.files.write("/root/c/b.bin", io.BytesIO(data), mode=0o600)
        out = io.BytesIO()
        self.assertEqual(self.sb.files.read("/root/c/b.bin", into=out), len(data))
        self.assertEqual(out.getvalue(), data)
        st = self.sb.files.stat("/root/c/b.bin")
        self.assertEqual((st["size"], st["mode"]), (len(data), "0600"))
        self.assertEqual(sorted(e["name"] for e in self.sb.files.list("/root/c")),
                         ["a.bin", "b.bin"])
        self.sb.files.rename("/root/c/a.bin", "/root/c/z.bin")
        self.sb.files.remove("/root/c", recursive=True)
        with self.assertRaises(WarrenError) as cm:
            self.sb.files.read("/root/c/z.bin")
        self.assertEqual((cm.exception.status, cm.exception.code), (404, "file_not_found"))

    def test_background_process(self):
        p = self.sb.start("read x; echo got $x; exit 4", tag="reader")
        self.assertIn(p.pid, [x["pid"] for x in self.sb.processes()])
        p.stdin("hello\n")
        lines = list(p.output(follow=True))
        text = "".join(j.get("data", "") for j in lines if j["type"] == "stdout")
        self.assertEqual(text, "got hello\n")
        self.assertEqual((lines[-1]["type"], lines[-1]["exit_code"]), ("exit", 4))

    def test_errors(self):
        with self.assertRaises(WarrenError) as cm:
            self.c.sandbox("sb-0000000000000000")
        self.assertEqual((cm.exception.status, cm.exception.code), (404, "sandbox_not_found"))
        with self.assertRaises(WarrenError) as cm:
            Client(self.c.url, "wrong-key").list()
        self.assertEqual(cm.exception.status, 401)

    def test_templates(self):
        # Every image a create may name; the pool is off here, so none has a pool.
        images = sorted(f[:-5] for f in os.listdir(image_dir()) if f.endswith(".ext4"))
        ts = self.c.templates()
        self.assertEqual([t["name"] for t in ts], images)
        self.assertEqual([t["name"] for t in ts if t["default"]], ["base"])
        self.assertTrue(all(t["pools"] == [] and t["size_bytes"] > 0 for t in ts), ts)
        lines = self.cli("templates").stdout.decode().splitlines()
        self.assertEqual(lines, [f"{n}{' (default)' if n == 'base' else ''}  no pool"
                                 for n in images])

    def test_list_by_metadata_and_terminal_url(self):
        ids = [s["id"] for s in self.c.list(metadata={"suite": "clients"})]
        self.assertIn(self.sb.id, ids)
        self.assertEqual(self.c.list(metadata={"suite": "nobody"}), [])
        url = self.sb.terminal_url()
        self.assertTrue(url.startswith(f"{self.c.url}/terminal/{self.sb.id}?token="), url)
        # its token opens a new PTY (the page's default); one for a pid only attaches
        def probe(tok):
            path = f"/v1/sandboxes/{self.sb.id}/pty?access_token={tok}"
            try:
                urllib.request.urlopen(self.c.url + path, timeout=60)
            except urllib.error.HTTPError as e:
                return e.code
            return 200
        tok = urllib.parse.parse_qs(urllib.parse.urlparse(url).query)["token"][0]
        self.assertEqual(probe(tok), 426)
        url = self.sb.terminal_url(pid=1)
        self.assertTrue(url.endswith("&pid=1"), url)
        tok = urllib.parse.parse_qs(urllib.parse.urlparse(url).query)["token"][0]
        self.assertEqual(probe(tok), 403)

    # ------------------------------------------------------------ the CLI
    def test_cli(self):
        sid = self.cli("create", "--template", "minimal", "--meta", "k=v").stdout.decode().strip()
        self.assertTrue(sid.startswith("sb-"), sid)
        self.assertIn(sid, self.cli("ls").stdout.decode())
        # exec: output streamed through, the command's exit status returned.
        p = self.cli("exec", sid, "--", "sh", "-c", "echo out; echo err >&2; exit 7",
                     check=False)
        self.assertEqual((p.returncode, p.stdout, p.stderr), (7, b"out\n", b"err\n"))
        p = self.cli("exec", sid, "--env", "A=1", "--cwd", "/tmp", "echo $A $(pwd)")
        self.assertEqual(p.stdout, b"1 /tmp\n")
        # cp both ways, and through stdin/stdout.
        data = os.urandom(1 << 20)
        with tempfile.TemporaryDirectory() as d:
            src, back = os.path.join(d, "src"), os.path.join(d, "back")
            with open(src, "wb") as f:
                f.write(data)
            self.cli("cp", src, f"{sid}:/root/f.bin")
            self.cli("cp", f"{sid}:/root/f.bin", back)
            with open(back, "rb") as f:
                self.assertEqual(f.read(), data)
        self.cli("cp", "-", f"{sid}:/root/g.txt", stdin=b"piped\n")
        self.assertEqual(self.cli("cp", f"{sid}:/root/g.txt", "-").stdout, b"piped\n")
        self.assertIn("/root/g.txt", self.cli("files", sid, "/root").stdout.decode())
        # A background process, its listing and its output.
        pid = self.cli("start", sid, "--tag", "t", "--", "echo bg; exit 5").stdout.decode().strip()
        p = self.cli("logs", sid, pid, "-f", check=False)
        self.assertEqual((p.returncode, p.stdout), (5, b"bg\n"))
        self.assertIn(pid, self.cli("ps", sid).stdout.decode())
        # pause / resume / snapshot / fork.
        self.assertEqual(self.cli("pause", sid).stdout, b"paused\n")
        self.assertEqual(self.cli("resume", sid).stdout, b"running\n")
        self.assertEqual(self.cli("exec", sid, "cat /root/g.txt").stdout, b"piped\n")
        snap = self.cli("snapshot", sid).stdout.decode().strip()
        self.assertIn(snap, self.cli("snapshots").stdout.decode())
        kid = self.cli("fork", sid).stdout.decode().strip()
        self.assertEqual(self.cli("exec", kid, "cat /root/g.txt").stdout, b"piped\n")
        restored = self.cli("create", "--snapshot", snap).stdout.decode().strip()
        self.assertEqual(self.cli("exec", restored, "cat /root/g.txt").stdout, b"piped\n")
        # Errors: the server's status and code, exit status 125.
        p = self.cli("rm-snapshot", snap, check=False)
        self.assertEqual(p.returncode, 125)
        self.assertIn(b"409 snapshot_in_use", p.stderr)
        self.cli("rm", kid, sid, restored)
        self.cli("rm-snapshot", snap)
        p = self.cli("exec", sid, "true", check=False)
        self.assertEqual(p.returncode, 125)
        self.assertIn(b"409 sandbox_ended", p.stderr)
        p = self.cli("get", "sb-0000000000000000", check=False)
        self.assertEqual((p.returncode, p.stderr.startswith(b"warren: 404 sandbox_not_found")),
                         (125, True), p.stderr)


if __name__ == "__main__":
    unittest.main()
