"""Files against real microVMs: streamed upload/download, metadata ops, isolation."""
import hashlib
import os
import threading
import time
import unittest
import urllib.parse

from warren import SANITIZED, WarrenCase, rss_kib

MiB = 1024 * 1024


def q(path, **extra):
    return urllib.parse.urlencode(dict(path=path, **extra))


class FilesTest(WarrenCase):
    @classmethod
    def setUpClass(cls):
        super().setUpClass()
        cls.sid = cls.w.create()

    def files(self, method, path, body=None, sub="", sid=None, **extra):
        sid = sid or self.sid
        return self.w.request(method, f"/v1/sandboxes/{sid}/files{sub}?{q(path, **extra)}",
                              body=body)

    def test_50mib_roundtrip_sha256(self):
        data = os.urandom(50 * MiB)
        r = self.files("PUT", "/root/deep/dir/blob.bin", body=data)
        self.assertEqual(r.status, 200, r)
        self.assertEqual(r.json()["size"], len(data))
        r = self.files("GET", "/root/deep/dir/blob.bin")
        self.assertEqual(r.status, 200)
        self.assertEqual(hashlib.sha256(r.body).hexdigest(), hashlib.sha256(data).hexdigest())
        # The guest sees the same bytes.
        res = self.w.run(self.sid, "sha256sum /root/deep/dir/blob.bin")
        self.assertEqual(res["stdout"].split()[0], hashlib.sha256(data).hexdigest())

    def test_metadata_ops(self):
        self.assertEqual(self.files("POST", "/root/a/b/c", sub="/mkdir").status, 200)
        self.assertEqual(self.files("PUT", "/root/a/b/c/f.txt", body=b"hello").status, 200)
        r = self.files("PUT", "/root/a/run.sh", body=b"#!/bin/sh\necho ran\n", mode="0755")
        self.assertEqual(r.status, 200, r)
        self.assertEqual(self.files("GET", "/root/a/run.sh", sub="/stat").json()["mode"], "0755")
        self.assertEqual(self.w.run(self.sid, "/root/a/run.sh")["stdout"], "ran\n")
        self.assertEqual(self.files("DELETE", "/root/a/run.sh").status, 200)
        st = self.files("GET", "/root/a/b/c/f.txt", sub="/stat").json()
        self.assertEqual((st["type"], st["size"], st["name"]), ("file", 5, "f.txt"))
        ls = self.files("GET", "/root/a", sub="/list", depth=3).json()
        paths = sorted(e["path"] for e in ls["entries"])
        self.assertEqual(paths, ["/root/a/b", "/root/a/b/c", "/root/a/b/c/f.txt"])
        ls1 = self.files("GET", "/root/a", sub="/list").json()
        self.assertEqual([e["path"] for e in ls1["entries"]], ["/root/a/b"])
        r = self.w.request("POST", f"/v1/sandboxes/{self.sid}/files/rename",
                           {"from": "/root/a/b/c/f.txt", "to": "/root/a/g.txt"})
        self.assertEqual(r.status, 200, r)
        self.assertEqual(self.files("GET", "/root/a/g.txt").body, b"hello")
        self.assertError(self.files("DELETE", "/root/a"), 409, "directory_not_empty")
        self.assertEqual(self.files("DELETE", "/root/a", recursive="true").status, 200)
        self.assertError(self.files("GET", "/root/a", sub="/stat"), 404, "file_not_found")

    def test_file_errors(self):
        self.assertError(self.files("GET", "/no/such/file"), 404, "file_not_found")
        self.assertError(self.files("GET", "relative/path"), 400)
        self.assertError(self.files("GET", "/root"), 400)  # a directory
        self.assertError(self.files("GET", "/x", sid="sb-0000000000000000"), 404,
                         "sandbox_not_found")

    def test_full_disk_is_507_and_loses_nothing(self):
        # /tmp is a tmpfs of a quarter of the guest's 256 MiB: 96 MiB cannot fit.
        self.assertEqual(self.files("PUT", "/tmp/keep.txt", body=b"kept").status, 200)
        try:
            r = self.files("PUT", "/tmp/fill.bin", body=os.urandom(96 * MiB))
            status = r.status
            body = r.json()
        except (ConnectionError, OSError) as e:
            self.fail(f"warrend must answer a full disk with an error, not drop the upload: {e}")
        self.assertEqual(status, 507, body)
        self.assertEqual(body["error"]["code"], "disk_full")
        # The sandbox keeps working and earlier files are intact.
        self.assertEqual(self.files("GET", "/tmp/keep.txt").body, b"kept")
        self.w.run(self.sid, "rm -f /tmp/fill.bin")
        self.assertEqual(self.files("PUT", "/tmp/after.txt", body=b"ok").status, 200)

    def test_sandboxes_are_isolated(self):
        other = self.w.create()
        self.assertEqual(self.files("PUT", "/root/secret", body=b"mine").status, 200)
        self.assertError(self.files("GET", "/root/secret", sid=other), 404, "file_not_found")
        res = self.w.run(other, "cat /root/secret; ls /root")
        self.assertNotIn("mine", res["stdout"])
        self.w.delete(other)

    def test_1gib_upload_and_download_constant_memory(self):
        pid = self.w.proc.pid
        # Under ASan 64 MiB: the same code paths, without the bulk twice in CI.
        size = (64 if SANITIZED else 1024) * MiB
        before = rss_kib(pid)
        peak = [before]
        stop = threading.Event()

        def sample():
            while not stop.is_set():
                peak[0] = max(peak[0], rss_kib(pid))
                time.sleep(0.05)

        t = threading.Thread(target=sample)
        t.start()
        block = os.urandom(MiB)
        h = hashlib.sha256()

        def body():
            for _ in range(size // MiB):
                h.update(block)
                yield block

        try:
            c = self.w.conn()
            c.putrequest("PUT", f"/v1/sandboxes/{self.sid}/files?{q('/root/big.bin')}")
            c.putheader("Authorization", f"Bearer {self.w.key}")
            c.putheader("Content-Length", str(size))
            c.endheaders()
            for b in body():
                c.send(b)
            r = c.getresponse()
            resp = r.read()
            c.close()
        finally:
            stop.set()
            t.join()
        self.assertEqual(r.status, 200, resp)
        st = self.files("GET", "/root/big.bin", sub="/stat").json()
        self.assertEqual(st["size"], size)
        # The bytes themselves are checked by the download below, against the same
        # hash: a sha256sum of 1 GiB inside the guest would cost ~45 s of TCG.
        up_peak = peak[0]
        print(f"\n{size // MiB} MiB upload: warrend RSS {before} KiB -> peak {up_peak} KiB")
        if not SANITIZED:
            self.assertLess((up_peak - before) / 1024, 32,
                            "warrend memory must stay flat during an upload")

        # And back: a streamed 1 GiB download, read slowly enough to need backpressure.
        stop.clear()
        peak[0] = rss_kib(pid)
        t = threading.Thread(target=sample)
        t.start()
        h2 = hashlib.sha256()
        got = 0
        try:
            c = self.w.conn()
            c.request("GET", f"/v1/sandboxes/{self.sid}/files?{q('/root/big.bin')}",
                      headers={"Authorization": f"Bearer {self.w.key}"})
            r = c.getresponse()
            self.assertEqual(r.status, 200)
            self.assertEqual(int(r.getheader("Content-Length")), size)
            while True:
                chunk = r.read(MiB)
                if not chunk:
                    break
                h2.update(chunk)
                got += len(chunk)
            c.close()
        finally:
            stop.set()
            t.join()
        self.assertEqual((got, h2.hexdigest()), (size, h.hexdigest()))
        print(f"{size // MiB} MiB download: warrend RSS peak {peak[0]} KiB")
        if not SANITIZED:
            self.assertLess((peak[0] - before) / 1024, 32,
                            "warrend memory must stay flat during a download")
        self.w.run(self.sid, "rm /root/big.bin")


if __name__ == "__main__":
    unittest.main()
