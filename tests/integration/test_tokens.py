"""Access tokens for browsers, over REST against real microVMs: a "files" token opens
its own sandbox's file routes and nothing else; expired, tampered and foreign tokens
are refused with their own codes; the token secret is 0600 and warrend will not start
with a looser one."""
import os
import stat
import time
import unittest
import urllib.parse

from warren import Warren, WarrenCase


def q(**kw):
    return urllib.parse.urlencode(kw)


class TokensTest(WarrenCase):
    @classmethod
    def setUpClass(cls):
        super().setUpClass()
        cls.a = cls.w.create()
        cls.b = cls.w.create()
        for sid in (cls.a, cls.b):
            r = cls.w.request("PUT", f"/v1/sandboxes/{sid}/files?{q(path='/root/who.txt')}",
                              body=f"I am {sid}\n".encode())
            assert r.status == 200, r

    def mint(self, sid, scope, ttl=None, auth=True, headers=None):
        body = {"scope": scope}
        if ttl is not None:
            body["ttl_seconds"] = ttl
        return self.w.request("POST", f"/v1/sandboxes/{sid}/tokens", body, auth=auth,
                              headers=headers)

    def token(self, sid, scope=("files",), ttl=3600):
        r = self.mint(sid, list(scope), ttl)
        self.assertEqual(r.status, 201, r)
        return r.json()["token"]

    def with_token(self, method, sid, sub, tok, body=None, **params):
        return self.w.request(method, f"/v1/sandboxes/{sid}/files{sub}?"
                              f"{q(**params, access_token=tok)}", body=body, auth=False)

    def test_mint_answer(self):
        before = time.time()
        r = self.mint(self.a, ["session", "files", "pty", "files"], ttl=120)
        self.assertEqual(r.status, 201, r)
        j = r.json()
        self.assertEqual(j["sandbox"], self.a)
        self.assertEqual(j["scope"], ["pty", "session", "files"])
        # "exec" is a scope of its own, listed last
        r = self.mint(self.a, ["exec", "ports", "pty"])
        self.assertEqual(r.status, 201, r)
        self.assertEqual(r.json()["scope"], ["pty", "ports", "exec"])
        self.assertRegex(j["token"], r"^[A-Za-z0-9_-]+$")
        exp = time.mktime(time.strptime(j["expires_at"][:19], "%Y-%m-%dT%H:%M:%S")) - time.timezone
        self.assertTrue(before + 110 <= exp <= time.time() + 130, j)
        # default lifetime: one hour
        r = self.mint(self.a, ["files"])
        exp = time.mktime(time.strptime(r.json()["expires_at"][:19], "%Y-%m-%dT%H:%M:%S")) \
            - time.timezone
        self.assertTrue(before + 3500 <= exp <= time.time() + 3700, r)

    def test_mint_refusals(self):
        for body in ({"scope": []}, {"scope": ["root"]}, {"scope": "files"}, {},
                     {"scope": ["files"], "ttl_seconds": 0},
                     {"scope": ["files"], "ttl_seconds": 86401},
                     {"scope": ["files"], "ttl_seconds": "60"},
                     {"scope": ["files"], "sandbox": self.b}):
            self.assertError(self.w.request("POST", f"/v1/sandboxes/{self.a}/tokens", body),
                             400, "invalid_argument")
        self.assertEqual(self.mint(self.a, ["files"], ttl=86400).status, 201)
        self.assertError(self.mint("no-such-sandbox", ["files"]), 404, "sandbox_not_found")
        # no key: refused; a token cannot mint tokens, not even for its own sandbox
        self.assertError(self.mint(self.a, ["files"], auth=False), 401, "unauthorized")
        tok = self.token(self.a, ("files", "pty", "session"))
        r = self.w.request("POST", f"/v1/sandboxes/{self.a}/tokens?{q(access_token=tok)}",
                           {"scope": ["files"]}, auth=False)
        self.assertError(r, 401, "unauthorized")

    def test_mint_for_ended_sandbox(self):
        sid = self.w.create()
        tok = self.token(sid)
        self.assertEqual(self.w.delete(sid).status, 200)
        self.w.wait_state(sid, ["ended"])
        self.assertError(self.mint(sid, ["files"]), 409, "sandbox_ended")
        # a token minted before is no key to an ended sandbox either
        r = self.with_token("GET", sid, "", tok, path="/root/who.txt")
        self.assertEqual(r.status, 409, r)

    def test_files_token_opens_its_sandbox_files(self):
        tok = self.token(self.a)
        r = self.with_token("GET", self.a, "", tok, path="/root/who.txt")
        self.assertEqual(r.status, 200, r)
        self.assertEqual(r.body, f"I am {self.a}\n".encode())
        self.assertEqual(self.with_token("GET", self.a, "/stat", tok, path="/root/who.txt")
                         .json()["size"], len(f"I am {self.a}\n"))
        self.assertEqual(self.with_token("POST", self.a, "/mkdir", tok, path="/root/t").status,
                         200)
        r = self.with_token("PUT", self.a, "", tok, body=b"browser", path="/root/t/f")
        self.assertEqual(r.status, 200, r)
        r = self.w.request("POST", f"/v1/sandboxes/{self.a}/files/rename?{q(access_token=tok)}",
                           {"from": "/root/t/f", "to": "/root/t/g"}, auth=False)
        self.assertEqual(r.status, 200, r)
        ls = self.with_token("GET", self.a, "/list", tok, path="/root/t").json()
        self.assertEqual([e["path"] for e in ls["entries"]], ["/root/t/g"])
        self.assertEqual(self.with_token("DELETE", self.a, "", tok, path="/root/t",
                                         recursive="true").status, 200)
        self.assertEqual(self.w.run(self.a, "test -e /root/t && echo yes || echo no")["stdout"],
                         "no\n")
        # The token never reaches the log.
        self.assertNotIn(tok, self.w.log_text())

    def test_files_token_refused_elsewhere(self):
        tok = self.token(self.a)
        # another sandbox's files
        r = self.with_token("GET", self.b, "", tok, path="/root/who.txt")
        self.assertError(r, 403, "token_wrong_sandbox")
        self.assertNotIn(b"I am", r.body)
        # routes only the key opens
        r = self.w.request("POST", f"/v1/sandboxes/{self.a}/exec?{q(access_token=tok)}",
                           {"cmd": "echo pwned"}, auth=False)
        self.assertIn(r.status, (401, 403), r)
        self.assertNotIn(b"pwned", r.body)
        for m, path in (("GET", f"/v1/sandboxes/{self.a}"), ("GET", "/v1/sandboxes"),
                        ("DELETE", f"/v1/sandboxes/{self.a}"),
                        ("GET", f"/v1/sandboxes/{self.a}/processes")):
            r = self.w.request(m, f"{path}?{q(access_token=tok)}", auth=False)
            self.assertError(r, 401, "unauthorized")
        self.assertEqual(self.w.get(self.a).json()["state"], "running")
        # a token without the files scope
        r = self.with_token("GET", self.a, "", self.token(self.a, ("pty", "session")),
                            path="/root/who.txt")
        self.assertError(r, 403, "token_wrong_scope")
        # a wrong key is not rescued by a good token
        r = self.w.request("GET", f"/v1/sandboxes/{self.a}/files?"
                           f"{q(path='/root/who.txt', access_token=tok)}",
                           auth=False, headers={"Authorization": "Bearer wrong"})
        self.assertError(r, 401, "unauthorized")

    def test_expired_token(self):
        tok = self.token(self.a, ttl=1)
        time.sleep(3)
        r = self.with_token("GET", self.a, "", tok, path="/root/who.txt")
        self.assertError(r, 401, "token_expired")

    def test_tampered_and_garbage_tokens(self):
        tok = self.token(self.a)
        for i in (0, 5, len(tok) // 2, len(tok) - 2):
            t = tok[:i] + ("A" if tok[i] != "A" else "B") + tok[i + 1:]
            r = self.with_token("GET", self.a, "", t, path="/root/who.txt")
            self.assertError(r, 401, "token_invalid")
        for t in ("", "x", tok + "A", tok[:-1], tok + "=", "A" * 1000):
            r = self.with_token("GET", self.a, "", t, path="/root/who.txt")
            self.assertError(r, 401, "token_invalid")
        # two tokens in one query: refused, even if one of them is good
        r = self.w.request("GET", f"/v1/sandboxes/{self.a}/files?path=/root/who.txt&"
                           f"access_token={tok}&access_token={tok}", auth=False)
        self.assertError(r, 401, "token_invalid")
        # no credentials at all
        r = self.w.request("GET", f"/v1/sandboxes/{self.a}/files?path=/root/who.txt", auth=False)
        self.assertError(r, 401, "unauthorized")


class TokenSecretTest(unittest.TestCase):
    """The secret file on its own: no VM is started."""

    def setUp(self):
        self.w = Warren()
        self.addCleanup(self.w.cleanup)
        self.path = os.path.join(self.w.state_dir, "token_secret")

    def test_created_0600_kept_and_checked(self):
        self.w.start()
        st = os.stat(self.path)
        self.assertEqual(stat.S_IMODE(st.st_mode), 0o600)
        self.assertEqual(st.st_size, 32)
        self.assertEqual(st.st_uid, os.geteuid())
        with open(self.path, "rb") as f:
            secret = f.read()
        self.w.stop()
        # kept across restarts (tokens stay valid)
        self.w.start()
        with open(self.path, "rb") as f:
            self.assertEqual(f.read(), secret)
        self.w.stop()
        # readable by others: refused
        os.chmod(self.path, 0o644)
        with self.assertRaises(RuntimeError) as cm:
            self.w.start()
        self.assertIn("token_secret", str(cm.exception))
        self.assertIn("chmod 600", str(cm.exception))
        # the wrong size: refused too
        os.chmod(self.path, 0o600)
        with open(self.path, "ab") as f:
            f.write(b"x")
        with self.assertRaises(RuntimeError) as cm:
            self.w.start()
        self.assertIn("exactly 32 bytes", str(cm.exception))
        # a fresh one is made when it is removed
        os.unlink(self.path)
        self.w.start()
        self.assertEqual(os.stat(self.path).st_size, 32)


if __name__ == "__main__":
    unittest.main()
