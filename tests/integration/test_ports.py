"""Sandbox ports through warrend (docs/NETWORK.md "Inbound", server/ports.c).

A guest HTTP server (python3 of the base template: it echoes the request line and
headers it got, serves n bytes, hashes what is posted, and echoes WebSocket frames)
is reached through warrend by path (/v1/sandboxes/{id}/ports/{port}/...) and by Host
({port}-{id}.{port_domain}), with the API key and with a "ports" token (header,
query, the cookie the Host-routed query sets), and not without one or with another
sandbox's or scope's token; the guest never sees a credential warrend consumed.
Connection refused is 502; a public port needs nothing and stays public after a
kill -9 and restart; deleting the sandbox closes an open connection.

warrend runs inside the fake network of fakenet.py (net_enabled needs an uplink; no
packet leaves the machine: the proxy's connections stay in the VM's namespace).
One warrend, two sandboxes for the class; the methods run in name order."""
import base64
import hashlib
import json
import os
import socket
import subprocess
import time
import unittest

import fakenet
from test_net import images_have_nic, net_conf, remove_namespaces
from warren import Warren

DOMAIN = "ports.test"
PORT = 8000
PUBLIC = 8004  # A's public port: the same echo server, open to anyone
BIG = 64 << 20

SERVER = r'''
import base64, hashlib, http.server, json, socketserver, struct, sys

class H(http.server.BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"
    def log_message(self, *a):
        pass
    def reply(self, body, ctype="application/json"):
        self.send_response(200)
        self.send_header("Content-Type", ctype)
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)
    def do_GET(self):
        if self.headers.get("Upgrade", "").lower() == "websocket":
            return self.ws()
        if self.path.startswith("/big/"):
            n = int(self.path[5:])
            chunk = bytes(range(256)) * 256
            self.send_response(200)
            self.send_header("Content-Length", str(n))
            self.end_headers()
            while n:
                k = min(n, len(chunk))
                self.wfile.write(chunk[:k])
                n -= k
            return
        self.reply(json.dumps({"path": self.path,
                               "headers": [[k, v] for k, v in self.headers.items()]}).encode())
    def do_POST(self):
        n = int(self.headers["Content-Length"])
        h = hashlib.sha256()
        got = 0
        while got < n:
            b = self.rfile.read(min(65536, n - got))
            if not b:
                break
            h.update(b)
            got += len(b)
        self.reply(json.dumps({"n": got, "sha256": h.hexdigest()}).encode())
    def ws(self):
        key = self.headers["Sec-WebSocket-Key"]
        acc = base64.b64encode(hashlib.sha1(
            (key + "258EAFA5-E914-47DA-95CA-C5AB0DC85B11").encode()).digest()).decode()
        self.send_response(101)
        self.send_header("Upgrade", "websocket")
        self.send_header("Connection", "Upgrade")
        self.send_header("Sec-WebSocket-Accept", acc)
        self.end_headers()
        self.wfile.flush()
        r = self.rfile
        while True:
            h = r.read(2)
            if len(h) < 2:
                return
            op, n = h[0] & 15, h[1] & 127
            if n == 126:
                n = struct.unpack(">H", r.read(2))[0]
            elif n == 127:
                n = struct.unpack(">Q", r.read(8))[0]
            mask = r.read(4)
            data = bytes(b ^ mask[i % 4] for i, b in enumerate(r.read(n)))
            if op == 8:
                return
            out = bytes([0x80 | op]) + (bytes([n]) if n < 126 else
                                         bytes([126]) + struct.pack(">H", n))
            self.wfile.write(out + data)
            self.wfile.flush()

class S(socketserver.ThreadingMixIn, http.server.HTTPServer):
    daemon_threads = True
    allow_reuse_address = True

S(("0.0.0.0", int(sys.argv[1])), H).serve_forever()
'''


def setUpModule():
    global NET
    why = fakenet.have_tools()
    if why:
        raise unittest.SkipTest(f"ports test: {why}")
    if not images_have_nic():
        raise unittest.SkipTest("ports test: the guest images have no virtio_net module")
    NET = fakenet.FakeNet()
    NET.enter()


def tearDownModule():
    if NET:
        NET.close()


NET = None


def recv_all(s):
    """Read s until the peer closes."""
    data = b""
    while True:
        b = s.recv(1 << 20)
        if not b:
            return data
        data += b


def raw(port, head, body=b"", timeout=120):
    """Send head (str, CRLFs added) and body on a fresh connection to port; read
    until the server closes. Returns (status, headers dict lowercased, body)."""
    s = socket.create_connection(("127.0.0.1", port), timeout=timeout)
    try:
        s.sendall(head.replace("\n", "\r\n").encode() + b"\r\n\r\n" + body)
        data = recv_all(s)
    finally:
        s.close()
    h, _, rest = data.partition(b"\r\n\r\n")
    lines = h.decode().split("\r\n")
    hd = {}
    for l in lines[1:]:
        k, _, v = l.partition(":")
        hd[k.strip().lower()] = v.strip()
    return int(lines[0].split()[1]), hd, rest


class TestPorts(unittest.TestCase):
    @classmethod
    def setUpClass(cls):
        cls.w = Warren(net_conf(port_domain=DOMAIN, port_idle_timeout_s="3600",
                                port_connect_timeout_ms="2000",
                                port_connections_per_sandbox="8")).start()
        try:
            cls.a = cls.w.create(template="base", public_ports=[PUBLIC])
            # B serves BusyBox's httpd on a public port, 8000.
            cls.b = cls.w.create(template="minimal", public_ports=[PORT])
            r = cls.w.request("PUT", f"/v1/sandboxes/{cls.b}/files?path=/tmp/www/index.html",
                              body=b"public page\n")
            assert r.status == 200, r
            r = cls.w.request("POST", f"/v1/sandboxes/{cls.b}/exec",
                              {"argv": ["busybox", "httpd", "-f", "-p", str(PORT), "-h", "/tmp/www"],
                               "background": True})
            assert r.status == 201, r
            r = cls.w.request("PUT", f"/v1/sandboxes/{cls.a}/files?path=/root/srv.py",
                              body=SERVER.encode())
            assert r.status == 200, r
            for port in (PORT, PUBLIC):
                r = cls.w.request("POST", f"/v1/sandboxes/{cls.a}/exec",
                                  {"argv": ["python3", "/root/srv.py", str(port)],
                                   "background": True})
                assert r.status == 201, r
            deadline = time.time() + 60
            for port in (PORT, PUBLIC):
                while True:
                    st, _, _ = cls.get(cls, f"/v1/sandboxes/{cls.a}/ports/{port}/", key=True)
                    if st == 200:
                        break
                    assert time.time() < deadline, f"the guest server never answered ({st})"
                    time.sleep(0.5)
        except BaseException:
            cls.w.cleanup()
            remove_namespaces(cls.w)
            raise

    @classmethod
    def tearDownClass(cls):
        cls.w.cleanup()
        remove_namespaces(cls.w)

    # -- helpers --
    def raw(self, head, body=b"", timeout=120):
        return raw(self.w.port, head, body, timeout)

    def get(self, path, key=False, host="x", headers=()):
        extra = "".join(f"\n{k}: {v}" for k, v in headers)
        if key:
            extra += f"\nAuthorization: Bearer {self.w.key}"
        return raw(self.w.port, f"GET {path} HTTP/1.1\nHost: {host}{extra}")

    def echo(self, *a, **kw):
        st, h, body = self.get(*a, **kw)
        self.assertEqual(st, 200, body)
        return json.loads(body)

    def token(self, sid, scope):
        r = self.w.request("POST", f"/v1/sandboxes/{sid}/tokens", {"scope": [scope]})
        self.assertEqual(r.status, 201, r)
        return r.json()["token"]

    def assertNoCredential(self, seen, *secrets):
        blob = json.dumps(seen)
        for s in secrets:
            self.assertNotIn(s, blob)
        names = [k.lower() for k, _ in seen["headers"]]
        self.assertNotIn("x-warren-token", names)

    # -- tests --
    def test_1_path_with_key(self):
        seen = self.echo(f"/v1/sandboxes/{self.a}/ports/{PORT}/echo/x?a=1&b=2", key=True)
        self.assertEqual(seen["path"], "/echo/x?a=1&b=2")
        self.assertNoCredential(seen, self.w.key)
        self.assertIn(["Connection", "close"], seen["headers"])
        # an empty rest is "/"
        self.assertEqual(self.echo(f"/v1/sandboxes/{self.a}/ports/{PORT}", key=True)["path"],
                         "/")
        # the API on the same listener is untouched
        self.assertEqual(self.w.request("GET", f"/v1/sandboxes/{self.a}").status, 200)

    def test_1b_head_in_pieces(self):
        """Heads that arrive in pieces: warrend peeks until it can tell where they go
        (a port request, or the API's), then each is served as if sent whole."""
        for path, want in ((f"/v1/sandboxes/{self.a}/ports/{PORT}/split", b'"/split"'),
                           ("/healthz", b"ok")):
            head = (f"GET {path} HTTP/1.1\r\nHost: x\r\nConnection: close\r\n"
                    f"Authorization: Bearer {self.w.key}\r\n\r\n").encode()
            s = socket.create_connection(("127.0.0.1", self.w.port), timeout=60)
            for piece in (head[:3], head[3:23], head[23:-2], head[-2:]):
                s.sendall(piece)
                time.sleep(0.4)
            data = b""
            while True:
                b = s.recv(65536)
                if not b:
                    break
                data += b
            s.close()
            self.assertTrue(data.startswith(b"HTTP/1.1 200"), data[:200])
            self.assertIn(want, data)

    def test_1c_path_pages_get_an_opaque_origin(self):
        """Pages served by path share warrend's origin: each answer carries a CSP sandbox
        (no allow-same-origin), so a browser gives the page the origin "null", whose
        sockets warrend's Origin check refuses. A guest cannot slip an answer past it
        (an interim 1xx head, or no HTTP status line at all, is 502)."""
        st, h, _ = self.get(f"/v1/sandboxes/{self.a}/ports/{PORT}/page", key=True)
        self.assertEqual(st, 200)
        csp = h.get("content-security-policy", "")
        self.assertTrue(csp.startswith("sandbox "), h)
        self.assertNotIn("allow-same-origin", csp)
        # a Host-routed page has an origin of its own: left as the guest made it
        st, h, _ = self.get("/page", key=True, host=f"{PORT}-{self.a}.{DOMAIN}")
        self.assertEqual(st, 200)
        self.assertNotIn("content-security-policy", h)
        # what such a page's socket would say is refused; warrend's own pages' passes
        for origin, want in (("null", 403), (f"http://127.0.0.1:{self.w.port}", 426)):
            r = self.w.request("GET", f"/v1/sandboxes/{self.a}/pty/1",
                               headers={"Origin": origin, "Host": f"127.0.0.1:{self.w.port}"})
            self.assertEqual(r.status, want, (origin, r))
        # Expect is not passed on in path mode: no guest has reason to send a 100
        seen = self.echo(f"/v1/sandboxes/{self.a}/ports/{PORT}/e", key=True,
                         headers=[("Expect", "100-continue")])
        self.assertNotIn("expect", [n.lower() for n, _ in seen["headers"]])
        # hostile guests: an interim head first, or no status line
        srv = ("import socket, sys\n"
               "s = socket.socket(); s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)\n"
               "s.bind(('0.0.0.0', int(sys.argv[1]))); s.listen(8)\n"
               "while True:\n"
               "    c, _ = s.accept(); c.recv(65536); c.sendall(sys.argv[2].encode()); c.close()\n")
        r = self.w.request("PUT", f"/v1/sandboxes/{self.a}/files?path=/root/liar.py",
                           body=srv.encode())
        self.assertEqual(r.status, 200, r)
        for port, answer in ((8005, "HTTP/1.1 103 Early Hints\r\nLink: </x>\r\n\r\n"
                                    "HTTP/1.1 200 OK\r\nContent-Length: 6\r\n\r\nhello!"),
                             (8006, "hello! no status line\r\n\r\n")):
            r = self.w.request("POST", f"/v1/sandboxes/{self.a}/exec",
                               {"argv": ["python3", "/root/liar.py", str(port), answer],
                                "background": True})
            self.assertEqual(r.status, 201, r)
            deadline = time.time() + 60
            while True:
                st, h, body = self.get(f"/v1/sandboxes/{self.a}/ports/{port}/", key=True)
                if st != 502 or json.loads(body)["error"]["code"] != "port_closed":
                    break
                self.assertLess(time.time(), deadline, "the guest server never listened")
                time.sleep(0.5)
            self.assertEqual(st, 502, (port, h, body))
            self.assertEqual(json.loads(body)["error"]["code"], "bad_response")
            self.assertNotIn(b"hello!", body)

    def test_2_host_with_key(self):
        seen = self.echo("/some/page?q=1", key=True, host=f"{PORT}-{self.a}.{DOMAIN}")
        self.assertEqual(seen["path"], "/some/page?q=1")
        self.assertNoCredential(seen, self.w.key)

    def test_3_tokens(self):
        tok = self.token(self.a, "ports")
        # header
        seen = self.echo(f"/v1/sandboxes/{self.a}/ports/{PORT}/h", headers=[("X-Warren-Token", tok)])
        self.assertNoCredential(seen, tok)
        # query, path mode: forwarded without it
        seen = self.echo(f"/v1/sandboxes/{self.a}/ports/{PORT}/q?x=1&warren_token={tok}")
        self.assertEqual(seen["path"], "/q?x=1")
        self.assertNoCredential(seen, tok)
        # query, Host mode: warrend's 302 sets the cookie; the cookie then opens
        host = f"{PORT}-{self.a}.{DOMAIN}"
        st, h, _ = self.get(f"/app?x=1&warren_token={tok}", host=host)
        self.assertEqual(st, 302)
        self.assertEqual(h["location"], "/app?x=1")
        self.assertIn(f"warren_token={tok}", h["set-cookie"])
        self.assertIn("HttpOnly", h["set-cookie"])
        seen = self.echo("/app?x=1", host=host,
                         headers=[("Cookie", f"theme=dark; warren_token={tok}")])
        self.assertNoCredential(seen, tok)
        self.assertIn(["Cookie", "theme=dark"], seen["headers"])

    def test_4_refusals(self):
        base = f"/v1/sandboxes/{self.a}/ports/{PORT}/"
        st, _, body = self.get(base)
        self.assertEqual(st, 401, body)
        self.assertEqual(json.loads(body)["error"]["code"], "unauthorized")
        st, _, body = self.get(base, headers=[("Authorization", "Bearer nope")])
        self.assertEqual(st, 401, body)
        st, _, body = self.get(base, headers=[("X-Warren-Token", self.token(self.b, "ports"))])
        self.assertEqual((st, json.loads(body)["error"]["code"]), (403, "token_wrong_sandbox"))
        st, _, body = self.get(base, headers=[("X-Warren-Token", self.token(self.a, "files"))])
        self.assertEqual((st, json.loads(body)["error"]["code"]), (403, "token_wrong_scope"))
        st, _, body = self.get(base, headers=[("X-Warren-Token", "garbage")])
        self.assertEqual(st, 401, body)
        # nothing listening: 502; a bad port: 400; no such sandbox: 404 (with the key)
        st, _, body = self.get(f"/v1/sandboxes/{self.a}/ports/8001/", key=True)
        self.assertEqual((st, json.loads(body)["error"]["code"]), (502, "port_closed"))
        st, _, body = self.get(f"/v1/sandboxes/{self.a}/ports/70000/", key=True)
        self.assertEqual(st, 400, body)
        st, _, body = self.get("/v1/sandboxes/nosuch/ports/80/", key=True)
        self.assertEqual(st, 404, body)

    def test_3b_key_spellings_never_reach_a_public_port(self):
        """Every spelling of the key the API accepts is the key: the proxy strips it
        from what a public port's guest gets (it once forwarded "Bearer  <key>")."""
        k = self.w.key
        spellings = [("Authorization", f"Bearer  {k}"), ("authorization", f"bearer {k}"),
                     ("AUTHORIZATION", f"BEARER     {k}"), ("Authorization", f"Bearer {k}\t"),
                     ("Authorization", f"\tBearer {k}  ")]
        for name, value in spellings:
            # the API takes it as the key ...
            st, _, body = raw(self.w.port, f"GET /v1/sandboxes/{self.a} HTTP/1.1\nHost: x\n"
                                           f"Connection: close\n{name}: {value}")
            self.assertEqual(st, 200, (value, body))
            # ... so the proxy consumes it, on a public port too
            seen = self.echo(f"/v1/sandboxes/{self.a}/ports/{PUBLIC}/p", headers=[(name, value)])
            self.assertNoCredential(seen, k)
            self.assertNotIn("authorization", [n.lower() for n, _ in seen["headers"]])
            # and on a private one it opens
            self.assertNoCredential(
                self.echo(f"/v1/sandboxes/{self.a}/ports/{PORT}/p", headers=[(name, value)]), k)
        # another credential is the guest's own and goes through
        seen = self.echo(f"/v1/sandboxes/{self.a}/ports/{PUBLIC}/p",
                         headers=[("Authorization", "Bearer the-guests-own")])
        self.assertIn(["Authorization", "Bearer the-guests-own"], seen["headers"])

    def test_3c_refusals_do_not_block_a_sandbox(self):
        """Connections refused for want of a credential are not the sandbox's: many of
        them, held open, leave its public port and keyed requests working (they once
        filled port_connections_per_sandbox and made both answer 503)."""
        held = []
        try:
            for _ in range(24):
                s = socket.create_connection(("127.0.0.1", self.w.port), timeout=60)
                s.sendall(f"GET /v1/sandboxes/{self.a}/ports/{PORT}/ HTTP/1.1\r\n"
                          f"Host: x\r\n\r\n".encode())
                held.append(s)
            for s in held:
                self.assertTrue(s.recv(100).startswith(b"HTTP/1.1 401"))
            st, _, body = self.get(f"/v1/sandboxes/{self.a}/ports/{PUBLIC}/anon")
            self.assertEqual(st, 200, body)
            st, _, body = self.get(f"/v1/sandboxes/{self.a}/ports/{PORT}/keyed", key=True)
            self.assertEqual(st, 200, body)
        finally:
            for s in held:
                s.close()

    def test_3d_cookie_redirect_stays_on_the_host(self):
        """The Host-routed redirect that moves a query token into a cookie goes to a
        path of the same host only: a target that a browser would read as another host
        (//evil, /\\evil) is refused, never a Location (it was "//evil.example/...")."""
        tok = self.token(self.a, "ports")
        host = f"{PORT}-{self.a}.{DOMAIN}"
        for target in ("//evil.example/landing", "///evil.example/", "/\\evil.example/",
                       "/%09/evil.example/x\\y"):
            st, h, body = self.get(f"{target}?warren_token={tok}", host=host)
            self.assertNotEqual(st, 302, (target, h))
            self.assertNotIn("location", h)
            self.assertNotIn(tok, json.dumps(h))
            self.assertEqual(st, 400, (target, body))
        # an ordinary path still gets its cookie
        st, h, _ = self.get(f"/a/b%2Fc?warren_token={tok}", host=host)
        self.assertEqual((st, h.get("location")), (302, "/a/b%2Fc"))
        # nor does the 307 of a port request on a kept-alive API connection leave the host
        for target in ("//evil.example/landing", "/\\evil.example/"):
            c = self.w.conn(60)
            try:
                c.request("GET", "/healthz")
                c.getresponse().read()
                c.putrequest("GET", target, skip_host=True)
                c.putheader("Host", host)
                c.endheaders()
                r = c.getresponse()
                r.read()
                loc = r.getheader("Location") or ""
                self.assertFalse(loc.startswith("//") or loc.startswith("/\\"), (target, loc))
                self.assertIn(r.status, (307, 400), target)
            finally:
                c.close()

    def test_4a_connect_timeout_and_networking_off(self):
        # SYNs to 8002 vanish inside A's namespace (a table of the test's own): 504
        (ns,) = fakenet.netns_named(self.w.vm_id(self.a))
        rules = ("table ip ports_test {\n chain o {\n  type filter hook output priority 0;\n"
                 "  tcp dport 8002 drop\n }\n}\n")
        subprocess.run(["ip", "netns", "exec", ns, "nft", "-f", "-"], input=rules.encode(),
                       check=True)
        st, _, body = self.get(f"/v1/sandboxes/{self.a}/ports/8002/", key=True)
        self.assertEqual((st, json.loads(body)["error"]["code"]), (504, "port_timeout"))
        # a warrend without networking: 409 naming the conf key
        w = Warren({"jail": "off"}).start()
        try:
            st, _, body = raw(
                w.port,
                f"GET /v1/sandboxes/{self.a}/ports/{PORT}/ HTTP/1.1\nHost: x\n"
                f"Authorization: Bearer {w.key}")
        finally:
            w.cleanup()
        self.assertEqual(st, 409, body)
        self.assertIn("net_enabled", json.loads(body)["error"]["message"])

    def test_4b_public_port(self):
        self.assertEqual(self.w.get(self.b).json()["public_ports"], [PORT])
        self.assertEqual(self.w.get(self.a).json()["public_ports"], [PUBLIC])
        deadline = time.time() + 60
        while True:
            st, _, body = self.get(f"/v1/sandboxes/{self.b}/ports/{PORT}/index.html")
            if st == 200 or time.time() > deadline:
                break
            time.sleep(0.5)
        self.assertEqual((st, body), (200, b"public page\n"))
        st, _, body = self.get("/index.html", host=f"{PORT}-{self.b}.{DOMAIN}")
        self.assertEqual(st, 200, body)
        # only that port, only that sandbox
        st, _, body = self.get(f"/v1/sandboxes/{self.b}/ports/8001/")
        self.assertEqual(st, 401, body)
        st, _, body = self.get(f"/v1/sandboxes/{self.a}/ports/{PORT}/")
        self.assertEqual(st, 401, body)
        # validated at create, before anything boots
        for bad in ([0], [70000], ["80"], [80, 80], list(range(1, 18)), 80):
            r = self.w.request("POST", "/v1/sandboxes", {"template": "minimal",
                                                         "public_ports": bad})
            self.assertEqual(r.status, 400, (bad, r))

    def test_4c_keepalive_connection_is_redirected(self):
        """A port path as the second request of a kept-alive API connection: lws has it,
        not the proxy; 307 to the same URL with Connection: close, and the retry on a
        new connection (what http.client does for a redirect is left to the caller)."""
        c = self.w.conn(60)
        try:
            c.request("GET", "/healthz")
            r = c.getresponse()
            r.read()
            self.assertEqual(r.status, 200)
            path = f"/v1/sandboxes/{self.a}/ports/{PORT}/k?x=a%20b&y=1"
            c.request("GET", path, headers={"Authorization": f"Bearer {self.w.key}"})
            r = c.getresponse()
            r.read()
            self.assertEqual(r.status, 307)
            self.assertEqual(r.getheader("Location"), path)
            self.assertEqual(r.getheader("Connection"), "close")
        finally:
            c.close()
        self.assertEqual(self.echo(path, key=True)["path"], "/k?x=a%20b&y=1")

    def test_5_big_download_and_upload(self):
        st, _, body = self.get(f"/v1/sandboxes/{self.a}/ports/{PORT}/big/{BIG}", key=True)
        self.assertEqual(st, 200)
        self.assertEqual(len(body), BIG)
        chunk = bytes(range(256)) * 256
        self.assertEqual(hashlib.sha256(body).hexdigest(),
                         hashlib.sha256(chunk * (BIG // len(chunk))).hexdigest())
        up = os.urandom(BIG)
        st, _, body = self.raw(f"POST /v1/sandboxes/{self.a}/ports/{PORT}/up HTTP/1.1\nHost: x\n"
                               f"Authorization: Bearer {self.w.key}\nContent-Length: {len(up)}",
                               up)
        self.assertEqual(st, 200, body)
        self.assertEqual(json.loads(body), {"n": BIG, "sha256": hashlib.sha256(up).hexdigest()})

    def rss_kib(self):
        with open(f"/proc/{self.w.proc.pid}/status") as f:
            return int(next(l for l in f if l.startswith("VmRSS:")).split()[1])

    def test_5b_backpressure(self):
        """A client that does not read a 64 MiB answer: warrend stops reading the guest
        once its buffer towards the client is full (port_buffer_bytes), so its memory
        does not grow with what the guest has to send; then everything arrives intact."""
        before = self.rss_kib()
        s = socket.create_connection(("127.0.0.1", self.w.port), timeout=120)
        s.sendall((f"GET /v1/sandboxes/{self.a}/ports/{PORT}/big/{BIG} HTTP/1.1\r\nHost: x\r\n"
                   f"Authorization: Bearer {self.w.key}\r\n\r\n").encode())
        time.sleep(5)  # the guest could send all 64 MiB in ~2 s if nothing held it back
        grown = self.rss_kib() - before
        data = recv_all(s)
        s.close()
        self.assertLess(grown, 16 * 1024, f"warrend grew {grown} KiB while the client slept")
        body = data.partition(b"\r\n\r\n")[2]
        chunk = bytes(range(256)) * 256
        self.assertEqual(hashlib.sha256(body).hexdigest(),
                         hashlib.sha256(chunk * (BIG // len(chunk))).hexdigest())

    @staticmethod
    def ws_frame(data):
        mask = os.urandom(4)
        n = len(data)
        hdr = bytes([0x82]) + (bytes([0x80 | n]) if n < 126 else
                               bytes([0x80 | 126]) + n.to_bytes(2, "big"))
        return hdr + mask + bytes(b ^ mask[i % 4] for i, b in enumerate(data))

    def ws_read(self, s, n):
        got = b""
        need = 2 + (2 if n >= 126 else 0) + n
        while len(got) < need:
            b = s.recv(65536)
            self.assertTrue(b)
            got += b
        return got[need - n:]

    def ws_open(self, path, early=b""):
        s = socket.create_connection(("127.0.0.1", self.w.port), timeout=60)
        key = base64.b64encode(os.urandom(16)).decode()
        s.sendall((f"GET {path} HTTP/1.1\r\nHost: x\r\nAuthorization: Bearer {self.w.key}\r\n"
                   f"Connection: Upgrade\r\nUpgrade: websocket\r\nSec-WebSocket-Version: 13\r\n"
                   f"Sec-WebSocket-Key: {key}\r\n\r\n").encode() + early)
        head = b""
        while b"\r\n\r\n" not in head:
            b = s.recv(1)
            self.assertTrue(b, head)
            head += b
        self.assertTrue(head.startswith(b"HTTP/1.1 101"), head)
        acc = base64.b64encode(hashlib.sha1(
            (key + "258EAFA5-E914-47DA-95CA-C5AB0DC85B11").encode()).digest())
        self.assertIn(acc, head)
        return s

    def ws_roundtrip(self, s, data):
        s.sendall(self.ws_frame(data))
        return self.ws_read(s, len(data))

    def test_6_websocket(self):
        # a frame sent with the handshake, before the 101: held, then delivered
        s = self.ws_open(f"/v1/sandboxes/{self.a}/ports/{PORT}/ws", self.ws_frame(b"early"))
        try:
            self.assertEqual(self.ws_read(s, 5), b"early")
            for msg in (b"hello", os.urandom(1000), os.urandom(30000)):
                self.assertEqual(self.ws_roundtrip(s, msg), msg)
        finally:
            s.close()

    def test_7_restart_keeps_public_ports(self):
        """kill -9 and a restart: the record keeps public_ports, the re-adopted VM's
        public port opens again without a credential (503 while it reconnects)."""
        self.w.kill9()
        self.w.start()
        self.assertEqual(self.w.get(self.b).json()["public_ports"], [PORT])
        deadline = time.time() + 60
        while True:
            st, _, body = self.get(f"/v1/sandboxes/{self.b}/ports/{PORT}/index.html")
            if st != 503 or time.time() > deadline:
                break
            time.sleep(0.3)
        self.assertEqual((st, body), (200, b"public page\n"))

    def test_9_delete_closes_open_connections(self):
        s = self.ws_open(f"/v1/sandboxes/{self.a}/ports/{PORT}/ws")
        self.assertEqual(self.ws_roundtrip(s, b"before"), b"before")
        r = self.w.request("DELETE", f"/v1/sandboxes/{self.a}")
        self.assertEqual(r.status, 200, r)
        s.settimeout(30)  # the proxy checks its sandboxes every second
        try:
            self.assertEqual(s.recv(100), b"")
        except ConnectionResetError:
            pass
        s.close()
        st, _, body = self.get(f"/v1/sandboxes/{self.a}/ports/{PORT}/", key=True)
        self.assertIn(st, (404, 409, 410), body)


if __name__ == "__main__":
    unittest.main()
