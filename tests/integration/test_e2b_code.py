"""E2B's code interpreter door (port 49999 on the envd door) against a real warrend
and a real code-interpreter microVM: the unmodified @e2b/code-interpreter SDK
(npm 2.8.0, from setup.sh's npm cache) drives it through e2b_code.mjs, then raw
requests check what the SDK never sends (malformed bodies, missing tokens).

One sandbox for the whole class, on the shared code-interpreter warrend (cibox.py),
from its pool: a kernel's cold start takes minutes under TCG. Needs the code-interpreter template in the image dir
(WARREN_CACHE)."""
import hashlib
import hmac
import json
import os
import time
import unittest
import urllib.error
import urllib.request

from cibox import CodeCase
from test_e2b import run_sdk_script


class TestE2BCode(CodeCase):
    @classmethod
    def setUpClass(cls):
        super().setUpClass()
        with open(os.path.join(cls.w.state_dir, "e2b_api_key")) as f:
            cls.e2b_key = f.read().strip()
        cls.node, cls.checks = run_sdk_script("e2b_code.mjs", "@e2b/code-interpreter",
                                              cls.w.port, cls.e2b_key, 2400)
        cls.created = next((c for c in cls.checks if c["check"] == "create" and c["ok"]), None)

    def test_sdk(self):
        failed = [c for c in self.checks if not c["ok"]]
        self.assertEqual(self.node.returncode, 0,
                         f"{failed}\nstderr: {self.node.stderr[-3000:]}\n{self.w.log_text()[-6000:]}")
        names = [c["check"] for c in self.checks]
        for want in ("create", "runCode state kept", "stdout callback", "stderr callback",
                     "error", "html result", "envs", "language bash", "createCodeContext",
                     "runCode in context", "context state kept", "listCodeContexts",
                     "restartCodeContext", "removeCodeContext", "unknown context",
                     "removed context", "remove unknown context", "unknown language", "abort",
                     "context free after abort", "done"):
            self.assertIn(want, names)

    # -- raw requests, on the sandbox the SDK made --

    def raw(self, method, path, body=None, traffic=True, access=True, extra=None):
        if not self.created:
            self.fail(f"the SDK made no sandbox: {self.node.stdout[-2000:]}\n{self.node.stderr[-2000:]}")
        h = {"E2b-Sandbox-Id": self.created["sandboxId"], "E2b-Sandbox-Port": "49999"}
        if traffic:
            h["E2B-Traffic-Access-Token"] = self.created["trafficAccessToken"]
        if access:
            h["X-Access-Token"] = self.created["envdAccessToken"]
        h.update(extra or {})
        if body is not None:
            h["Content-Type"] = "application/json"
        req = urllib.request.Request(f"http://127.0.0.1:{self.w.port}{path}", data=body,
                                     headers=h, method=method)
        try:
            with urllib.request.urlopen(req, timeout=600) as r:
                return r.status, r.read().decode()
        except urllib.error.HTTPError as e:
            return e.code, e.read().decode()

    def test_malformed_body(self):
        st, text = self.raw("POST", "/execute", b'{"code": "1 + 1",')
        self.assertEqual(st, 400, text)
        self.assertIn("JSON", text)
        st, text = self.raw("POST", "/execute", b'{"code": 5}')
        self.assertEqual((st, text), (400, "code must be a string"))
        st, text = self.raw("POST", "/execute", b'["code"]')
        self.assertEqual(st, 400, text)
        st, text = self.raw("POST", "/contexts", b'{"cwd": "relative/dir"}')
        self.assertEqual(st, 400, text)
        self.assertIn("cwd", text)

    def test_context_and_language(self):
        st, text = self.raw("POST", "/execute",
                            json.dumps({"code": "1", "context_id": "abc",
                                        "language": "python"}).encode())
        self.assertEqual(st, 400, text)
        self.assertIn("context_id", text)

    def test_tokens(self):
        st, text = self.raw("POST", "/execute", json.dumps({"code": "1"}).encode(), access=False)
        self.assertEqual(st, 401, text)
        self.assertIn("X-Access-Token", text)
        st, text = self.raw("GET", "/contexts", traffic=False)
        self.assertEqual(st, 401, text)
        st, text = self.raw("GET", "/contexts",
                            extra={"E2B-Traffic-Access-Token": "x" * 40})
        self.assertEqual(st, 401, text)

    def test_keepalive(self):
        """A run silent past run_code_keepalive_ms (5 s by default) carries keepalive lines,
        as E2B's server sends them, so that proxies and the SDK keep the stream open.
        On a sandbox of its own (REST, from the shared daemon's pool), so that it does not
        hang on the SDK's run having made one."""
        sid = self.w.create(template="code-interpreter")
        with open(os.path.join(self.w.state_dir, "token_secret"), "rb") as f:
            key = f.read()

        def tok(purpose):
            return hmac.new(key, purpose.encode() + b"\0" + sid.encode(),
                            hashlib.sha256).hexdigest()

        h = {"E2b-Sandbox-Id": sid, "E2b-Sandbox-Port": "49999",
             "E2B-Traffic-Access-Token": tok("traffic"), "X-Access-Token": tok("envd"),
             "Content-Type": "application/json"}
        base = f"http://127.0.0.1:{self.w.port}"
        # the kernel bridge answers first (a clone's is up at once; a cold boot's later)
        deadline = time.time() + 600
        while True:
            try:
                with urllib.request.urlopen(urllib.request.Request(
                        base + "/contexts", headers=h), timeout=600) as r:
                    if r.status == 200:
                        break
            except urllib.error.HTTPError as e:
                if e.code != 502 or time.time() > deadline:
                    self.fail(f"GET /contexts: {e.code} {e.read()[:500]!r}")
            time.sleep(1)
        body = json.dumps({"code": "import time\ntime.sleep(12)\n6 * 7"}).encode()
        req = urllib.request.Request(base + "/execute", data=body, headers=h, method="POST")
        try:
            with urllib.request.urlopen(req, timeout=600) as r:
                self.assertEqual(r.status, 200)
                text = r.read().decode()
        except urllib.error.HTTPError as e:
            self.fail(f"POST /execute: {e.code} {e.read()[:500]!r}\n{self.w.log_text()[-4000:]}")
        lines = [json.loads(l) for l in text.splitlines() if l.strip()]
        types = [l.get("type") for l in lines]
        self.assertEqual(types[-1], "end_of_execution", lines)
        self.assertEqual(types.count("end_of_execution"), 1, lines)
        self.assertGreaterEqual(types.count("keepalive"), 1, lines)
        self.assertLess(types.index("keepalive"), types.index("end_of_execution"))
        self.assertNotIn("error", types, lines)
        # the run's own result comes through too, after the silence
        self.assertIn("42", [l.get("text") for l in lines if l.get("type") == "result"], lines)

    def test_routes(self):
        st, text = self.raw("GET", "/health")
        self.assertEqual((st, text), (200, "OK"))
        st, text = self.raw("GET", "/no/such/route")
        self.assertEqual(st, 404, text)
        st, text = self.raw("PUT", "/execute", b"{}")
        self.assertEqual(st, 405, text)
        st, text = self.raw("DELETE", "/contexts/" + "%2e%2e%2fetc")
        self.assertEqual(st, 404, text)
        st, text = self.raw("POST", "/contexts/" + "a" * 200 + "/restart")
        self.assertEqual(st, 404, text)


if __name__ == "__main__":
    unittest.main()
