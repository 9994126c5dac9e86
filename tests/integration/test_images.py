"""Guest images named by content and filled from a shared source, against real
microVMs: the real images published with `warrend --publish-images`; a warrend with an
EMPTY image_dir and image_source set fills it (from a directory, then over HTTP from
Python's http.server on loopback), answers its agent check with a quarter of its
weight until filled, and then boots `minimal`, which GET /v1/templates names by its
SHA-256; a create may pin that hash. A corrupt blob in the source is refused, logged,
never installed, and the host keeps its lower weight."""
import json
import os
import shutil
import socket
import subprocess
import sys
import tempfile
import time
import unittest

from warren import Warren, free_port, image_dir, warrend_path

FILES = ("vmlinux", "initramfs.cpio", "minimal.ext4")
FILL_TIMEOUT_S = 300  # a 2 GiB image copied and hashed on a loaded two-core machine


def agent_line(port):
    with socket.create_connection(("127.0.0.1", port), timeout=10) as s:
        data = b""
        while True:
            b = s.recv(256)
            if not b:
                return data.decode()
            data += b


def read_index(pub):
    with open(os.path.join(pub, "index")) as f:
        lines = f.read().splitlines()
    assert lines[0] == "warren-images 1", lines
    return {name: (sha, int(size)) for sha, size, name in (l.split(" ") for l in lines[1:])}


class ImagesTest(unittest.TestCase):
    @classmethod
    def setUpClass(cls):
        real = os.path.realpath(image_dir())
        for f in FILES:
            if not os.path.exists(os.path.join(real, f)):
                raise RuntimeError(f"no {f} in {real} (run images/build.sh)")
        cls.root = tempfile.mkdtemp(prefix="warren-images-")
        # The real images, only those the test boots: publishing hashes every byte.
        cls.src = os.path.join(cls.root, "src")
        os.mkdir(cls.src)
        for f in FILES:
            os.symlink(os.path.join(real, f), os.path.join(cls.src, f))
        cls.pub = os.path.join(cls.root, "pub")
        cls.publish()
        cls.index = read_index(cls.pub)
        cls.hosts = []

    @classmethod
    def publish(cls):
        r = subprocess.run([warrend_path(), "--image-dir", cls.src, "--publish-images", cls.pub],
                           capture_output=True, text=True, timeout=600)
        if r.returncode != 0:
            raise AssertionError(f"publish failed: {r.stdout}{r.stderr}")
        return r.stdout

    @classmethod
    def tearDownClass(cls):
        for w in cls.hosts:
            w.cleanup()
        shutil.rmtree(cls.root, ignore_errors=True)

    def host(self, source):
        images = tempfile.mkdtemp(prefix="img-", dir=self.root)
        w = Warren({"image_source": source, "image_source_interval_seconds": "1",
                    "agent_check_port": str(free_port())})
        w.images = images
        self.hosts.append(w)
        w.start()
        return w

    def health(self, w):
        r = w.request("GET", "/healthz")
        self.assertEqual(r.status, 200, r)
        return r.json()["images"]

    def wait_health(self, w, pred, what):
        deadline = time.time() + FILL_TIMEOUT_S
        while time.time() < deadline:
            h = self.health(w)
            if pred(h):
                return h
            time.sleep(0.5)
        self.fail(f"{what}: {self.health(w)}\n{w.log_text()}")

    def weight(self, w):
        return agent_line(int(w.conf["agent_check_port"]))

    def blob(self, name):
        return os.path.join(self.pub, "blobs", "sha256-" + self.index[name][0])

    def test_1_publish(self):
        """Every file listed with its hash and size, each blob that file's bytes; a second
        publish of the same images changes nothing."""
        self.assertEqual(sorted(self.index), sorted(FILES))
        for f in FILES:
            sha, size = self.index[f]
            self.assertEqual(os.path.getsize(self.blob(f)), size)
            self.assertEqual(os.path.getsize(os.path.join(self.src, f)), size)
        with open(self.blob("initramfs.cpio"), "rb") as a, \
                open(os.path.join(self.src, "initramfs.cpio"), "rb") as b:
            self.assertEqual(a.read(), b.read())
        idx = os.path.join(self.pub, "index")
        before = os.stat(idx)
        out = self.publish()
        self.assertIn("(unchanged)", out)
        after = os.stat(idx)
        self.assertEqual((before.st_ino, before.st_mtime_ns), (after.st_ino, after.st_mtime_ns))
        self.assertEqual(read_index(self.pub), self.index)

    def test_2_directory_source_corrupt_blob_then_filled(self):
        # A source whose minimal.ext4 blob is corrupt: same size, one byte changed.
        pub2 = os.path.join(self.root, "pub2")
        os.makedirs(os.path.join(pub2, "blobs"))
        shutil.copy(os.path.join(self.pub, "index"), pub2)
        for f in ("vmlinux", "initramfs.cpio"):
            os.symlink(self.blob(f), os.path.join(pub2, "blobs", os.path.basename(self.blob(f))))
        bad = os.path.join(pub2, "blobs", os.path.basename(self.blob("minimal.ext4")))
        subprocess.run(["cp", "--sparse=always", self.blob("minimal.ext4"), bad], check=True)
        with open(bad, "r+b") as f:
            f.seek(1024)  # the ext4 superblock
            b = f.read(1)
            f.seek(1024)
            f.write(bytes([b[0] ^ 0xff]))

        w = self.host(pub2)
        h = self.wait_health(
            w, lambda h: h["index_read"] and [m["name"] for m in h["missing"]] == ["minimal.ext4"],
            "only the corrupt file should stay missing")
        self.assertFalse(h["filled"])
        self.assertEqual(h["listed"], 3)
        self.assertIn("sha256", h["missing"][0]["error"])
        self.assertEqual(self.weight(w), "ready up 25%\n")
        self.assertFalse(os.path.exists(os.path.join(w.images, "minimal.ext4")))
        self.assertEqual(sorted(os.listdir(w.images)), ["initramfs.cpio", "vmlinux"])
        self.assertIn("minimal.ext4", w.log_all())
        self.assertIn("not installed", w.log_all())
        r = w.request("POST", "/v1/sandboxes", {"template": "minimal"})
        self.assertEqual(r.status, 400, r)
        self.assertEqual(r.json()["error"]["code"], "unknown_template")

        # The source is repaired: the host fills and gets its whole weight back.
        os.unlink(bad)
        os.symlink(self.blob("minimal.ext4"), bad)
        self.wait_health(w, lambda h: h["filled"] and not h["missing"], "filled")
        self.assertEqual(self.weight(w), "ready up 100%\n")
        self.check_templates_and_create(w)

    def check_templates_and_create(self, w):
        sha = self.index["minimal.ext4"][0]
        deadline = time.time() + FILL_TIMEOUT_S
        while True:
            t = w.request("GET", "/v1/templates").json()
            mins = [x for x in t["templates"] if x["name"] == "minimal"]
            if mins and mins[0]["sha256"] or time.time() > deadline:
                break
            time.sleep(0.5)
        self.assertEqual(mins[0]["sha256"], sha, t)
        self.assertEqual(mins[0]["size_bytes"], self.index["minimal.ext4"][1])
        self.assertEqual(t["kernel"]["sha256"], self.index["vmlinux"][0])
        self.assertEqual(t["initramfs"]["sha256"], self.index["initramfs.cpio"][0])

        other = ("0" if sha[0] != "0" else "1") + sha[1:]
        r = w.request("POST", "/v1/sandboxes", {"template": f"minimal@sha256:{other}"})
        self.assertEqual(r.status, 400, r)
        self.assertEqual(r.json()["error"]["code"], "invalid_argument")
        self.assertIn(sha, r.json()["error"]["message"])
        r = w.request("POST", "/v1/sandboxes", {"template": "minimal@sha256:XYZ"})
        self.assertEqual(r.status, 400, r)
        self.assertEqual(r.json()["error"]["code"], "invalid_argument")

        sid = w.create(template=f"minimal@sha256:{sha}")
        self.assertEqual(w.get(sid).json()["template"], "minimal")
        self.assertEqual(w.run(sid, "echo filled")["stdout"], "filled\n")
        w.delete(sid)
        sid = w.create(template="minimal")  # the plain name, as always
        self.assertEqual(w.run(sid, "echo plain")["stdout"], "plain\n")
        w.delete(sid)

    def test_3_http_source(self):
        port = free_port()
        srv = subprocess.Popen([sys.executable, "-m", "http.server", "--bind", "127.0.0.1",
                                "--directory", self.pub, str(port)],
                               stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        try:
            deadline = time.time() + 30
            while time.time() < deadline:
                try:
                    socket.create_connection(("127.0.0.1", port), timeout=1).close()
                    break
                except OSError:
                    time.sleep(0.1)
            w = self.host(f"http://127.0.0.1:{port}/")
            self.wait_health(w, lambda h: h["filled"] and not h["missing"], "filled over HTTP")
            self.assertEqual(self.weight(w), "ready up 100%\n")
            for f in FILES:
                self.assertEqual(os.path.getsize(os.path.join(w.images, f)), self.index[f][1])
            self.check_templates_and_create(w)
        finally:
            srv.terminate()
            srv.wait()


if __name__ == "__main__":
    unittest.main()
