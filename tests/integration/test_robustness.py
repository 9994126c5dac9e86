"""Bad input and hostile guests: every malformed request gets a 4xx JSON error,
a vanished client loses nothing but its own stream, and a fork bomb or
memory hog in one sandbox leaves its agent and the other sandboxes answering."""
import json
import socket
import time
import unittest

import os
import signal
import threading

from warren import WarrenCase, qemu_pids


class RobustnessTest(WarrenCase):
    conf = {"max_json_body_bytes": 65536}

    @classmethod
    def setUpClass(cls):
        super().setUpClass()
        cls.sid = cls.w.create()

    def test_auth(self):
        r = self.w.request("GET", "/v1/sandboxes", auth=False)
        self.assertError(r, 401)
        r = self.w.request("GET", "/v1/sandboxes", headers={"Authorization": "Bearer wrong"},
                           auth=False)
        self.assertError(r, 401)
        self.assertEqual(self.w.request("GET", "/healthz", auth=False).status, 200)

    def test_100_malformed_requests(self):
        sid = self.sid
        bad = [
            ("POST", "/v1/sandboxes", b"{not json"),
            ("POST", "/v1/sandboxes", b"[1,2,3]"),
            ("POST", "/v1/sandboxes", b"\xff\xfe\x00garbage"),
            ("POST", "/v1/sandboxes", b'{"template": 12}'),
            ("POST", "/v1/sandboxes", b'{"ttl_seconds": "soon"}'),
            ("POST", "/v1/sandboxes", b'{"env": {"A": 1}}'),
            ("POST", "/v1/sandboxes", b'{"metadata": []}'),
            ("POST", "/v1/sandboxes", b'{"template": "../../etc/passwd"}'),
            ("POST", f"/v1/sandboxes/{sid}/exec", b"{}"),
            ("POST", f"/v1/sandboxes/{sid}/exec", b'{"cmd": ""}'),
            ("POST", f"/v1/sandboxes/{sid}/exec", b'{"argv": []}'),
            ("POST", f"/v1/sandboxes/{sid}/exec", b'{"argv": [1]}'),
            ("POST", f"/v1/sandboxes/{sid}/exec", b'{"cmd": "x", "timeout_seconds": -4}'),
            ("POST", f"/v1/sandboxes/{sid}/exec", b'{"cmd": "x", "user": "nobody"}'),
            ("POST", f"/v1/sandboxes/{sid}/exec", b'{"cmd": "x", "cwd": "rel"}'),
            ("POST", f"/v1/sandboxes/{sid}/timeout", b'{"ttl_seconds": 0}'),
            ("POST", f"/v1/sandboxes/{sid}/timeout", b"nope"),
            ("GET", f"/v1/sandboxes/{sid}/files", None),
            ("GET", f"/v1/sandboxes/{sid}/files?path=", None),
            ("GET", f"/v1/sandboxes/{sid}/files/list?path=/&depth=0", None),
            ("GET", f"/v1/sandboxes/{sid}/files/list?path=/&depth=abc", None),
            ("POST", f"/v1/sandboxes/{sid}/files/rename", b'{"from": "/a"}'),
            ("GET", "/v1/sandboxes?state=bogus", None),
            ("GET", "/v1/nothing-here", None),
            ("PATCH", "/v1/sandboxes", None),
            ("GET", "/v1/sandboxes/sb-doesnotexist", None),
            ("DELETE", "/v1/sandboxes/sb-doesnotexist", None),
        ]
        sent = 0
        while sent < 100:
            method, path, body = bad[sent % len(bad)]
            r = self.w.request(method, path, body=body,
                               headers={"Content-Type": "application/json"})
            self.assertTrue(400 <= r.status < 500, f"{method} {path} {body!r} -> {r}")
            err = r.json()["error"]
            self.assertTrue(err["code"] and err["message"], r)
            sent += 1
        self.assertEqual(self.w.request("GET", "/healthz").status, 200)
        self.assertEqual(self.w.run(self.sid, "echo fine")["stdout"], "fine\n")

    def test_body_too_large(self):
        r = self.w.request("POST", "/v1/sandboxes",
                           body=json.dumps({"metadata": {"k": "v" * 100000}}).encode())
        self.assertError(r, 413)
        self.assertEqual(self.w.request("GET", "/healthz").status, 200)

    def test_client_vanishes_mid_stream(self):
        s = socket.create_connection(("127.0.0.1", self.w.port))
        body = json.dumps({"cmd": "yes vanishing-client"}).encode()
        s.sendall(b"POST /v1/sandboxes/%s/exec HTTP/1.1\r\nHost: x\r\n"
                  b"Authorization: Bearer %s\r\nAccept: application/x-ndjson\r\n"
                  b"Content-Type: application/json\r\nContent-Length: %d\r\n\r\n%s"
                  % (self.sid.encode(), self.w.key.encode(), len(body), body))
        got = s.recv(65536)
        self.assertIn(b"200", got.split(b"\r\n")[0])
        s.close()
        # The abandoned process is killed; the sandbox and warrend keep serving.
        deadline = time.time() + 20
        while time.time() < deadline:
            out = self.w.run(self.sid, "pgrep -f vanishing-client || true")["stdout"]
            if not out.strip():
                break
            time.sleep(0.2)
        self.assertEqual(out.strip(), "", "the process of a vanished client must be killed")
        self.assertEqual(self.w.get(self.sid).json()["state"], "running")

    def test_vm_dying_mid_request_answers_at_once(self):
        sid = self.w.create(ttl_seconds=900)
        results = {}

        def json_exec():
            results["json"] = self.w.exec(sid, "sleep 300")

        def ndjson_exec():
            c = self.w.conn(timeout=120)
            c.request("POST", f"/v1/sandboxes/{sid}/exec",
                      body=json.dumps({"cmd": "echo started; sleep 300"}),
                      headers={"Authorization": f"Bearer {self.w.key}",
                               "Accept": "application/x-ndjson"})
            r = c.getresponse()
            results["ndjson_status"] = r.status
            results["ndjson"] = [json.loads(line) for line in r]
            c.close()

        threads = [threading.Thread(target=json_exec), threading.Thread(target=ndjson_exec)]
        for t in threads:
            t.start()
        time.sleep(2)  # both execs are running in the guest
        t0 = time.time()
        os.kill(qemu_pids(sid)[0], signal.SIGKILL)
        for t in threads:
            t.join(timeout=60)
        waited = time.time() - t0
        self.assertFalse(any(t.is_alive() for t in threads), "requests hung on a dead VM")
        print(f"\nrequests answered {waited:.2f} s after the VM was killed")
        r = results["json"]
        self.assertIn(r.status, (409, 502), r)
        self.assertIn(r.json()["error"]["code"], ("sandbox_dead", "guest_channel_lost"))
        # The stream had started: it ends with an error line, not silence.
        self.assertEqual(results["ndjson_status"], 200)
        self.assertEqual(results["ndjson"][0]["data"], "started\n")
        self.assertEqual(results["ndjson"][-1]["type"], "error", results["ndjson"])
        self.assertEqual(self.w.wait_state(sid, ("dead",))["state"], "dead")

    def test_fork_bomb_and_memory_hog_are_contained(self):
        bomb = self.w.create(ttl_seconds=900)
        other = self.w.create(ttl_seconds=900)
        # A fork bomb limited only by the sandbox's own pids cap, in the background.
        self.w.run(bomb, "(b(){ b|b& }; b) >/dev/null 2>&1 &", timeout_seconds=5)
        time.sleep(2)
        t0 = time.time()
        res = self.w.run(bomb, "echo agent-alive")
        print(f"\nexec during a fork bomb answered in {time.time() - t0:.2f} s")
        self.assertEqual(res["stdout"], "agent-alive\n")
        self.assertEqual(self.w.run(other, "echo other-alive")["stdout"], "other-alive\n")
        self.w.delete(bomb)
        # A memory hog is killed inside the sandbox; the agent keeps answering.
        hog = self.w.create(ttl_seconds=900)
        res = self.w.run(hog, "tail /dev/zero; echo rc=$?", timeout_seconds=120)
        self.assertIn("rc=137", res["stdout"])
        self.assertEqual(self.w.run(hog, "echo hog-alive")["stdout"], "hog-alive\n")
        self.assertEqual(self.w.get(hog).json()["state"], "running")
        self.w.delete(hog)
        self.w.delete(other)


if __name__ == "__main__":
    unittest.main()
