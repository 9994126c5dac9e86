"""E2B's control plane on warrend, against real microVMs: E2B's unmodified JS SDK
(npm e2b@2.51.0, from setup.sh's npm cache) drives it through e2b_sdk.mjs, and the
Python SDK's request shapes (read from e2b-dev/E2B's python-sdk; the SDK itself
cannot be installed here) are replayed at the wire.

The SDK's envd calls (commands, files, pty, ports, connect after a restart) are
test_envd.py's (e2b_envd.mjs), runCode test_e2b_code.py's (e2b_code.mjs)."""
import contextlib
import hashlib
import json
import os
import re
import shutil
import subprocess
import tempfile
import time
import unittest
import urllib.parse

from warren import HERE, WarrenCase

TEMPLATE = "base"


def npm_modules():
    """node_modules of setup.sh's npm cache for its own package list (the keyed
    directory, not npm/current, which another checkout's setup.sh may switch)."""
    if os.environ.get("WARREN_NPM_MODULES"):
        return os.environ["WARREN_NPM_MODULES"]
    with open(os.path.join(HERE, "..", "..", "scripts", "setup.sh")) as f:
        pkgs = re.search(r'^NPM_PACKAGES="([^"]*)"', f.read(), re.M).group(1).split()
    key = hashlib.sha256("".join(p + "\n" for p in pkgs).encode()).hexdigest()[:16]
    cache = os.environ.get("WARREN_CACHE", os.path.expanduser("~/.cache/warren"))
    return os.path.join(cache, "npm", key, "node_modules")


@contextlib.contextmanager
def sdk_script(name, package, port, key, **env):
    """node's argv and environment for tests/integration/<name> (an .mjs of checks, one
    JSON line each; an absolute name is taken as is) against warrend at port; the copy
    it runs is removed afterwards.
    package: the npm package it needs, which setup.sh installs (missing is a broken
    set-up, not a pass)."""
    node = shutil.which("node")
    mods = npm_modules()
    if not node or not os.path.isdir(os.path.join(mods, package)):
        raise RuntimeError(f"no node or no {package} in {mods} (run scripts/setup.sh)")
    env = dict(os.environ, E2B_API_URL=f"http://127.0.0.1:{port}",
               E2B_SANDBOX_URL=f"http://127.0.0.1:{port}", E2B_API_KEY=key, NODE_PATH=mods,
               **env)
    # Node resolves bare imports of an .mjs from its own folder upwards, not from
    # NODE_PATH: run a copy in a folder whose node_modules is the cache's.
    tmp = tempfile.mkdtemp(prefix="warren-sdk-")
    try:
        os.symlink(mods, os.path.join(tmp, "node_modules"))
        script = os.path.join(tmp, os.path.basename(name))
        shutil.copy(os.path.join(HERE, name), script)
        yield [node, script], env
    finally:
        shutil.rmtree(tmp, ignore_errors=True)


def run_sdk_script(name, package, port, key, timeout, **env):
    """Run tests/integration/<name> with node against warrend at port, to its end: (the
    finished process, its checks). See sdk_script."""
    with sdk_script(name, package, port, key, **env) as (argv, env):
        p = subprocess.run(argv, env=env, capture_output=True, text=True, timeout=timeout)
    return p, [json.loads(l) for l in p.stdout.splitlines() if l.startswith("{")]


class E2BCase(WarrenCase):
    # Several sandboxes boot at once on a shared, loaded machine (TCG): give a boot
    # time, so what is tested is the door, not the host's load.
    conf = {"boot_timeout_seconds": "300"}

    @classmethod
    def setUpClass(cls):
        super().setUpClass()
        with open(os.path.join(cls.w.state_dir, "e2b_api_key")) as f:
            cls.e2b_key = f.read().strip()

    def e2b(self, method, path, body=None, key=None, headers=None):
        h = {"X-API-KEY": key if key is not None else self.e2b_key}
        h.update(headers or {})
        return self.w.request(method, path, body, headers=h, auth=False)

    def assertE2BError(self, r, status):
        self.assertEqual(r.status, status, r)
        o = r.json()
        self.assertEqual(o["code"], status, r)
        self.assertIsInstance(o["message"], str)


class TestKey(E2BCase):
    def test_key_file(self):
        # The e2b_ spelling is the key's bytes in hex, as the SDKs' check wants.
        self.assertRegex(self.e2b_key, r"^e2b_[0-9a-f]+$")
        self.assertEqual(bytes.fromhex(self.e2b_key[4:]).decode(), self.w.key)

    def test_spellings(self):
        self.assertEqual(self.e2b("GET", "/v2/sandboxes").status, 200)
        self.assertEqual(self.e2b("GET", "/v2/sandboxes", key=self.w.key).status, 200)
        # Warren's own header opens the door too
        r = self.w.request("GET", "/v2/sandboxes")
        self.assertEqual(r.status, 200, r)

    def test_refused(self):
        flipped = self.e2b_key[:-1] + ("1" if self.e2b_key[-1] == "0" else "0")
        for k in ("e2b_00", flipped, self.w.key[:-1], self.e2b_key.upper(), ""):
            self.assertE2BError(self.e2b("GET", "/v2/sandboxes", key=k), 401)
        r = self.w.request("GET", "/v2/sandboxes", auth=False)
        self.assertE2BError(r, 401)
        r = self.w.request("GET", "/sandboxes/sb-x", auth=False,
                           headers={"Authorization": "Bearer nope"})
        self.assertE2BError(r, 401)

    def test_routes(self):
        self.assertE2BError(self.e2b("PATCH", "/sandboxes/sb-x"), 405)
        self.assertE2BError(self.e2b("GET", "/sandboxes/sb-nope"), 404)
        self.assertE2BError(self.e2b("DELETE", "/sandboxes/sb-nope"), 404)
        self.assertE2BError(self.e2b("POST", "/sandboxes/sb-nope/timeout", {"timeout": 5}), 404)
        self.assertE2BError(self.e2b("POST", "/sandboxes/sb-nope/connect", {"timeout": 5}), 404)
        self.assertE2BError(self.e2b("DELETE", "/templates/snap-nope"), 404)
        self.assertE2BError(self.e2b("POST", "/sandboxes/sb-nope/fork", {"count": 1}), 404)
        self.assertE2BError(self.e2b("POST", "/sandboxes/sb-nope/snapshots", {}), 404)
        self.assertE2BError(self.e2b("POST", "/sandboxes/sb-nope/pause", {}), 404)
        self.assertE2BError(self.e2b("GET", "/sandboxes/bad%20id"), 404)
        self.assertE2BError(self.e2b("GET", "/v2/sandboxes?limit=0"), 400)
        self.assertE2BError(self.e2b("GET", "/v2/sandboxes?state=gone"), 400)
        self.assertE2BError(self.e2b("GET", "/v2/sandboxes?metadata=%FF"), 400)
        self.assertE2BError(self.e2b("GET", "/v2/sandboxes?metadata=k%3D%25FF"), 400)
        self.assertE2BError(self.e2b("GET", "/v2/sandboxes?metadata=novalue"), 400)
        self.assertE2BError(self.e2b("POST", "/sandboxes", {"templateID": 7}), 400)
        self.assertE2BError(self.e2b("POST", "/sandboxes", {"templateID": "base", "bogus": 1}), 400)
        self.assertE2BError(self.e2b("POST", "/sandboxes", {"templateID": "base", "timeout": -1}),
                            400)
        self.assertE2BError(self.e2b("POST", "/sandboxes", {"metadata": {"a": 1}}), 400)
        self.assertE2BError(self.e2b("POST", "/sandboxes", {"autoPause": "yes"}), 400)
        r = self.e2b("POST", "/sandboxes", {"templateID": "no-such-template"})
        self.assertIn(r.status, (400, 404), r)
        # Warren's own routes keep their own shape
        r = self.w.request("GET", "/v1/sandboxes/sb-nope")
        self.assertEqual(r.json()["error"]["code"], "sandbox_not_found", r)


class TestPythonShapes(E2BCase):
    """The Python SDK's control-plane requests, as its generated client sends them."""
    conf = dict(E2BCase.conf, e2b_templates="code-interpreter-v1=code-interpreter "
                "small-v1=minimal gone-v1=no-such-template")

    def create(self, **kw):
        body = {"templateID": TEMPLATE, "timeout": 3600, "secure": True,
                "allow_internet_access": True, "autoPause": False}
        body.update(kw)
        r = self.e2b("POST", "/sandboxes", body)
        self.assertEqual(r.status, 201, f"{r}\n{self.w.log_text()}")
        return r.json()

    def test_lifecycle(self):
        s = self.create(metadata={"suite": "py", "k": "a b&c"}, envVars={"FOO": "bar"})
        sid = s["sandboxID"]
        self.assertEqual(s["templateID"], TEMPLATE)
        self.assertEqual(s["envdVersion"], "0.5.7")
        self.assertRegex(s["envdAccessToken"], r"^[0-9a-f]{64}$")
        self.assertRegex(s["trafficAccessToken"], r"^[0-9a-f]{64}$")
        self.assertNotEqual(s["envdAccessToken"], s["trafficAccessToken"])
        self.assertIn("clientID", s)

        r = self.e2b("GET", f"/sandboxes/{sid}")
        self.assertEqual(r.status, 200, r)
        info = r.json()
        self.assertEqual(info["sandboxID"], sid)
        self.assertEqual(info["state"], "running")
        self.assertEqual(info["metadata"], {"suite": "py", "k": "a b&c"})
        self.assertEqual(info["envdAccessToken"], s["envdAccessToken"])
        for f in ("startedAt", "endAt", "cpuCount", "memoryMB", "envdVersion", "templateID"):
            self.assertIn(f, info)
        # a Warren sandbox under it: E2B has no idle limit
        self.assertEqual(self.w.get(sid).json()["idle_timeout_seconds"], 0)

        # list as the Python SDK asks: urlencoded metadata, repeated state, limit 1000
        q = urllib.parse.urlencode([("metadata", urllib.parse.urlencode({"k": "a b&c"})),
                                    ("state", "running"), ("state", "paused"),
                                    ("limit", "1000")])
        r = self.e2b("GET", f"/v2/sandboxes?{q}")
        self.assertEqual(r.status, 200, r)
        self.assertEqual([x["sandboxID"] for x in r.json()], [sid])
        self.assertNotIn("x-next-token", {k.lower() for k in r.headers})
        q = urllib.parse.urlencode({"metadata": urllib.parse.urlencode({"k": "other"})})
        self.assertEqual(self.e2b("GET", f"/v2/sandboxes?{q}").json(), [])

        # timeout
        r = self.e2b("POST", f"/sandboxes/{sid}/timeout", {"timeout": 7200})
        self.assertEqual(r.status, 204, r)
        self.assertEqual(r.body, b"")
        end = self.e2b("GET", f"/sandboxes/{sid}").json()["endAt"]
        self.assertGreater(end, info["endAt"])

        # network: PUT replaces the policy; with networking off (this warrend) that is
        # a 400 in E2B's shape, and the sandbox runs on
        r = self.e2b("PUT", f"/sandboxes/{sid}/network",
                     {"allowOut": ["example.com"], "allow_internet_access": True})
        self.assertE2BError(r, 400)
        self.assertE2BError(self.e2b("PUT", f"/sandboxes/{sid}/network", {"rules": [{"x": 1}]}),
                            400)
        self.assertE2BError(self.e2b("PUT", "/sandboxes/sb-nope/network", {}), 404)

        # pause as the Python SDK sends it: a POST with no body and no length
        sock = self.w.raw_request("POST", f"/sandboxes/{sid}/pause",
                                  headers={"Authorization": "x", "X-API-KEY": self.e2b_key})
        sock.settimeout(300)
        head = b""
        while b"\r\n\r\n" not in head:
            b = sock.recv(4096)
            if not b:
                break
            head += b
        sock.close()
        self.assertTrue(head.startswith(b"HTTP/1.1 204"), f"{head!r}\n{self.w.log_text()}")
        self.assertEqual(self.e2b("GET", f"/sandboxes/{sid}").json()["state"], "paused")
        self.assertE2BError(self.e2b("POST", f"/sandboxes/{sid}/pause", {}), 409)
        r = self.e2b("GET", "/v2/sandboxes?state=paused")
        self.assertEqual([x["sandboxID"] for x in r.json()], [sid])
        self.assertEqual(self.e2b("GET", "/sandboxes").json(), [])  # v1: running ones
        r = self.e2b("POST", f"/sandboxes/{sid}/connect", {"timeout": 600})
        self.assertEqual(r.status, 201, f"{r}\n{self.w.log_text()}")
        self.assertEqual(r.json()["sandboxID"], sid)
        self.assertEqual(r.json()["envdAccessToken"], s["envdAccessToken"])
        self.assertEqual(self.e2b("GET", f"/sandboxes/{sid}").json()["state"], "running")
        # the guest kept its state across (an exec through Warren's own API)
        self.assertEqual(self.w.run(sid, "echo $FOO")["stdout"], "bar\n")
        # connect only extends: 60 s leaves the TTL (about 2 h) alone, 3 h moves it
        end = self.e2b("GET", f"/sandboxes/{sid}").json()["endAt"]
        r = self.e2b("POST", f"/sandboxes/{sid}/connect", {"timeout": 60})
        self.assertEqual(r.status, 200, r)
        self.assertEqual(self.e2b("GET", f"/sandboxes/{sid}").json()["endAt"], end)
        r = self.e2b("POST", f"/sandboxes/{sid}/connect", {"timeout": 3 * 3600})
        self.assertEqual(r.status, 200, r)
        self.assertGreater(self.e2b("GET", f"/sandboxes/{sid}").json()["endAt"], end)
        self.assertE2BError(self.e2b("POST", f"/sandboxes/{sid}/resume", {"timeout": 60}), 409)

        # metrics: known sandbox, empty series; unknown: 404
        r = self.e2b("GET", f"/sandboxes/{sid}/metrics")
        self.assertEqual((r.status, r.json()), (200, []))
        self.assertE2BError(self.e2b("GET", "/sandboxes/sb-nope/metrics"), 404)

        r = self.e2b("GET", f"/sandboxes/metrics?sandbox_ids={sid}")
        self.assertEqual((r.status, r.json()), (200, {"sandboxes": {}}))

        # kill: 204, then 404; its tokens are of a sandbox that no longer lists
        r = self.e2b("DELETE", f"/sandboxes/{sid}")
        self.assertEqual(r.status, 204, r)
        self.assertE2BError(self.e2b("DELETE", f"/sandboxes/{sid}"), 404)
        self.assertE2BError(self.e2b("GET", f"/sandboxes/{sid}"), 404)
        r = self.e2b("GET", "/v2/sandboxes")
        self.assertNotIn(sid, [x["sandboxID"] for x in r.json()])

    def test_auto_pause(self):
        """autoPause: the timeout pauses the sandbox instead of killing it; connect brings
        it back, its files and processes as they were."""
        s = self.create(timeout=5, autoPause=True)
        sid = s["sandboxID"]
        self.assertEqual(self.w.run(sid, "echo kept > /tmp/mark")["exit_code"], 0)
        deadline = time.time() + 240
        while self.e2b("GET", f"/sandboxes/{sid}").json().get("state") != "paused":
            self.assertLess(time.time(), deadline, self.w.log_text())
            time.sleep(0.5)
        rec = self.w.request("GET", f"/v1/sandboxes/{sid}").json()
        self.assertEqual((rec["state"], rec["auto_pause"]), ("paused", True), rec)
        r = self.e2b("POST", f"/sandboxes/{sid}/connect", {"timeout": 600})
        self.assertEqual(r.status, 201, f"{r}\n{self.w.log_text()}")
        self.assertEqual(self.e2b("GET", f"/sandboxes/{sid}").json()["state"], "running")
        self.assertEqual(self.w.run(sid, "cat /tmp/mark")["stdout"], "kept\n")
        self.assertEqual(self.e2b("DELETE", f"/sandboxes/{sid}").status, 204)
        # without it, the timeout ends the sandbox, as before
        rec = self.w.request("GET", f"/v1/sandboxes/{self.create(timeout=3)['sandboxID']}").json()
        self.assertIs(rec["auto_pause"], False)

    def test_template_alias(self):
        # e2b_templates maps E2B's names to Warren's templates (code-interpreter-v1 to
        # code-interpreter by default; the SDK's own create of it is in
        # integration_code). A sandbox made from an alias shows the template's own name
        # as templateID and the alias as alias; an alias of a template this host does
        # not have is refused naming Warren's template.
        r = self.e2b("POST", "/sandboxes", {"templateID": "small-v1", "timeout": 600})
        self.assertEqual(r.status, 201, f"{r}\n{self.w.log_text()}")
        self.assertEqual((r.json()["templateID"], r.json()["alias"]), ("minimal", "small-v1"))
        sid = r.json()["sandboxID"]
        self.assertEqual(self.w.get(sid).json()["template"], "minimal")
        self.assertEqual(self.e2b("DELETE", f"/sandboxes/{sid}").status, 204)
        r = self.e2b("POST", "/sandboxes", {"templateID": "gone-v1", "timeout": 600})
        self.assertIn(r.status, (400, 404), r)
        self.assertIn("'no-such-template'", r.json()["message"])

    def test_paging_and_snapshots(self):
        # pages come in the fleet's order, (startedAt, id): here the order of creation
        ids = [self.create(metadata={"suite": "page"})["sandboxID"] for _ in range(3)]
        seen, token, pages = [], None, 0
        while True:
            q = "limit=1&metadata=" + urllib.parse.quote("suite=page")
            if token:
                q += "&nextToken=" + urllib.parse.quote(token)
            r = self.e2b("GET", f"/v2/sandboxes?{q}")
            self.assertEqual(r.status, 200, r)
            self.assertLessEqual(len(r.json()), 1)
            seen += [x["sandboxID"] for x in r.json()]
            pages += 1
            token = {k.lower(): v for k, v in r.headers.items()}.get("x-next-token")
            if not token:
                break
            self.assertLess(pages, 10)
        self.assertEqual(seen, ids)

        # snapshot with a name, list it by sandbox and by name, create from it, delete
        r = self.e2b("POST", f"/sandboxes/{ids[0]}/snapshots", {"name": "py-snap"})
        self.assertEqual(r.status, 201, f"{r}\n{self.w.log_text()}")
        snap = r.json()
        self.assertEqual(snap["names"], ["py-snap"])
        r = self.e2b("GET", f"/snapshots?sandboxID={ids[0]}")
        self.assertEqual([x["snapshotID"] for x in r.json()], [snap["snapshotID"]])
        self.assertEqual(self.e2b("GET", f"/snapshots?sandboxID={ids[1]}").json(), [])
        r = self.e2b("GET", "/snapshots?name=py-snap")
        self.assertEqual([x["snapshotID"] for x in r.json()], [snap["snapshotID"]])
        child = self.create(templateID=snap["snapshotID"])["sandboxID"]
        self.assertEqual(self.w.get(child).json()["snapshot_id"], snap["snapshotID"])
        # in use by the child: refused; once it is gone, deleted
        self.assertE2BError(self.e2b("DELETE", f"/templates/{snap['snapshotID']}"), 409)
        self.assertEqual(self.e2b("DELETE", f"/sandboxes/{child}").status, 204)
        r = self.e2b("DELETE", f"/templates/{snap['snapshotID']}")
        self.assertEqual(r.status, 204, r)
        self.assertE2BError(self.e2b("DELETE", f"/templates/{snap['snapshotID']}"), 404)

        # fork: the answer is a list of {sandbox: ...}
        r = self.e2b("POST", f"/sandboxes/{ids[1]}/fork", {"timeout": 600, "count": 1})
        self.assertEqual(r.status, 201, f"{r}\n{self.w.log_text()}")
        forks = r.json()
        self.assertEqual(len(forks), 1)
        fid = forks[0]["sandbox"]["sandboxID"]
        self.assertNotIn(fid, ids)
        self.assertRegex(forks[0]["sandbox"]["envdAccessToken"], r"^[0-9a-f]{64}$")
        self.assertEqual(self.e2b("GET", f"/sandboxes/{fid}").json()["state"], "running")
        for sid in ids + [fid]:
            self.assertEqual(self.e2b("DELETE", f"/sandboxes/{sid}").status, 204)


class TestJsSdk(E2BCase):
    def test_sdk(self):
        p, checks = run_sdk_script("e2b_sdk.mjs", "e2b", self.w.port, self.e2b_key, 900,
                                   E2B_TEST_TEMPLATE=TEMPLATE)
        failed = [c for c in checks if not c["ok"]]
        self.assertEqual(p.returncode, 0,
                         f"{failed}\nstderr: {p.stderr[-3000:]}\n{self.w.log_text()}")
        names = [c["check"] for c in checks]
        for want in ("create", "getInfo", "list paging", "list metadata filter",
                     "setTimeout", "pause", "connect resumes", "createSnapshot",
                     "listSnapshots", "create from snapshot", "deleteSnapshot", "fork", "kill",
                     "kill unknown", "bad key", "done"):
            self.assertIn(want, names)


if __name__ == "__main__":
    unittest.main()
