"""The warm pool: creates are handed VMs restored from a template
snapshot instead of booting; two hand-outs are distinct VMs; the pool refills;
an empty pool restores a clone of its template for the create instead of booting;
a sandbox from the pool survives a warrend kill -9; a corrupted snapshot is
refused and rebuilt (while that sandbox, a clone of the old one, runs on); a
template image replaced on disk invalidates the snapshot; create/delete cycles
and a kill -9 leave nothing behind (load/churn.py runs 500); nothing is left once
everything is deleted and warrend stops; with QEMU jailed the clones are jailed
too, over a sealed copy of the template's RAM; other templates and shapes get
pools of their own, at start or on first use (TestPoolTemplates).

One warrend for the class (its template is built twice: at start and after the
corruption); the methods run in name order and build on each other."""
import hashlib
import os
import re
import shutil
import signal
import struct
import subprocess
import tempfile
import threading
import time
import unittest

from warren import (Warren, counter_runs, counter_value, flip_ram_byte, held, image_dir, qemu_pids,
                    fnv1a, shm_files, shm_name, wait_no_qemu)

# Pools of the default template only: test_1 checks that another shape boots.
POOL_CONF = {"pool_size": "2", "jail": "off", "default_template": "minimal",
             "pool_on_first_use": "false"}

# A background loop (as in test_snapshots): the count is written beside and renamed
# into place, so a fork never sees a truncated file.
COUNTER = ("i=0; while :; do i=$((i+1)); echo $i > /tmp/count.new; "
           "mv /tmp/count.new /tmp/count; sleep 0.2; done")


def pool(w):
    r = w.request("GET", "/healthz")
    assert r.status == 200, r
    return r.json()["pool"]


def wait_pool_ready(w, n, timeout=90):
    """Until the pool holds n ready VMs (a template build under TCG takes ~9 s)."""
    deadline = time.time() + timeout
    while time.time() < deadline:
        p = pool(w)
        if p and p["state"] == "ready" and p["ready"] >= n:
            return p
        time.sleep(0.1)
    raise AssertionError(f"pool never had {n} ready: {pool(w)}\n{w.log_text()}")


def snap_header(w, snap_id):
    """A snapshot's state file header (vmm-driver/vmm_snap.c): its flags and the RAM
    file a delta goes over."""
    with open(os.path.join(w.state_dir, "snapshots", snap_id, "state.snap"), "rb") as f:
        h = f.read(4096)
    return struct.unpack_from("<I", h, 44)[0], h[128:192].split(b"\0", 1)[0].decode()


def pause_delta(tc, w, sid):
    """Pause sid: it is answered paused and its snapshot is a delta (flags DELTA and RAM_CRC); the
    RAM file it goes over."""
    r = w.request("POST", f"/v1/sandboxes/{sid}/pause", {})
    tc.assertEqual(r.status, 200, f"{r}\n{w.log_text()}")
    tc.assertEqual(r.json()["state"], "paused", r.json())
    flags, base = snap_header(w, r.json()["snapshot_id"])
    tc.assertEqual(flags, 6, f"flags {flags:#x}: not a delta with its RAM file's checksum")
    return base


def tcg_rwx_mib(pid):
    """MiB resident in QEMU pid's TCG translation buffer (its one large rwx mapping);
    None for a QEMU that has none (yet, or any more: just starting or ending) or is gone."""
    try:
        with open(f"/proc/{pid}/smaps") as f:
            lines = f.read().split("\n")
    except (FileNotFoundError, ProcessLookupError):
        return None
    sizes = []
    for k, line in enumerate(lines):
        if " rwxp " in line:
            lo, hi = (int(x, 16) for x in line.split()[0].split("-"))
            rss = next(int(m.split()[1]) for m in lines[k + 1:] if m.startswith("Rss:"))
            if hi - lo >= 8 << 20:
                sizes.append(rss / 1024)
    return sizes[0] if len(sizes) == 1 else None


def wait_spares_ready(w, n=1, timeout=120):
    """Until the pool has n spare QEMUs past their start-up (a fork or resume takes only
    those; they start one per loop turn)."""
    deadline = time.time() + timeout
    while time.time() < deadline and pool(w).get("spares_ready", 0) < n:
        time.sleep(0.05)
    assert pool(w).get("spares_ready", 0) >= n, pool(w)


def assert_rebuilt(tc, w, why, old):
    """The pool's template was refused (why, in the log) and rebuilt: the pool is full
    again over one new template. The new template's ids."""
    p = wait_pool_ready(w, 2)
    log = w.log_text()
    tc.assertIn(why, log)
    tc.assertIn("rebuilding it", log)
    tc.assertGreaterEqual(p["rebuilds"], 1, p)
    new = template_ids(w)
    tc.assertEqual(len(new), 1, new)
    tc.assertNotEqual(new, old)
    return new


def template_ids(w):
    d = os.path.join(w.state_dir, "templates")
    return sorted(os.listdir(d)) if os.path.isdir(d) else []


def copy_image(src, dst):
    """A new file (new inode and mtime) with src's bytes, holes kept."""
    subprocess.run(["cp", "--sparse=always", src, dst + ".new"], check=True)
    os.replace(dst + ".new", dst)


class TestPool(unittest.TestCase):
    @classmethod
    def setUpClass(cls):
        # An image directory of the class's own, so test_2c can replace the minimal
        # image without touching the shared cache: links to the other files, a
        # sparse copy of minimal.ext4.
        cls.images = tempfile.mkdtemp(prefix="warren-it-img-")
        src = image_dir()
        for name in os.listdir(src):
            if name != "minimal.ext4":
                os.symlink(os.path.join(src, name), os.path.join(cls.images, name))
        copy_image(os.path.join(src, "minimal.ext4"), os.path.join(cls.images, "minimal.ext4"))
        cls.w = Warren(POOL_CONF)
        cls.w.images = cls.images
        cls.w.start()

    @classmethod
    def tearDownClass(cls):
        cls.w.cleanup()
        shutil.rmtree(cls.images, ignore_errors=True)

    def create(self):
        sid = self.w.create()
        return sid, self.w.get(sid).json()

    def test_1_handout_distinct_vms(self):
        w = self.w
        wait_pool_ready(w, 2)
        a, ja = self.create()
        b, jb = self.create()
        self.assertEqual(ja["source"], "pool", ja)
        self.assertEqual(jb["source"], "pool", jb)
        self.assertNotEqual(ja["vm_id"], jb["vm_id"])
        pa, pb = qemu_pids(ja["vm_id"]), qemu_pids(jb["vm_id"])
        self.assertEqual(len(pa), 1, pa)
        self.assertEqual(len(pb), 1, pb)
        self.assertNotEqual(pa, pb)
        # The template's files are there (the minimal image's /bin/sh), and each
        # clone's writes are its own.
        r = w.run(a, "test -x /bin/sh && echo yes")
        self.assertEqual(r["stdout"], "yes\n", r)
        # The default pool_template_warmup ran in the template, and ran well.
        self.assertRegex(w.log_all(), r"pool: template minimal: warm-up ran in \d+ ms")
        self.assertNotIn("its warm-up command", w.log_all())
        w.run(a, "echo from-a > /root/mine && sync")
        r = w.run(b, "cat /root/mine 2>&1; echo rc=$?")
        self.assertIn("rc=1", r["stdout"], r)
        self.assertEqual(w.run(a, "cat /root/mine")["stdout"], "from-a\n")
        # The session each got at hand-out reseeded its RNG and set its clock (the
        # template's stopped minutes ago), its hostname (its sandbox id) and, by a
        # RESYNC, a boot id of its own.
        ra = w.run(a, "head -c 16 /dev/urandom | od -An -tx1")["stdout"]
        rb = w.run(b, "head -c 16 /dev/urandom | od -An -tx1")["stdout"]
        self.assertNotEqual(ra, rb)
        ids = "cat /proc/sys/kernel/random/boot_id; hostname"
        ia, ib = w.run(a, ids)["stdout"].split(), w.run(b, ids)["stdout"].split()
        self.assertEqual(ia[1], a)
        self.assertEqual(ib[1], b)
        self.assertRegex(ia[0], r"^[0-9a-f]{8}-[0-9a-f]{4}-4[0-9a-f]{3}-[89ab][0-9a-f]{3}-[0-9a-f]{12}$")
        self.assertNotEqual(ia[0], ib[0])
        for sid in (a, b):
            guest = int(w.run(sid, "date +%s")["stdout"])
            self.assertLess(abs(guest - time.time()), 60)
        # A booted sandbox says so: another memory size is not in the pool.
        c = w.create(memory_mb=192)
        self.assertEqual(w.get(c).json()["source"], "boot")
        for sid in (a, b, c):
            self.assertEqual(w.delete(sid).status, 200)
        # Deleting a pool sandbox ends its QEMU and removes its run dir and overlay;
        # the template's files stay.
        for j in (ja, jb):
            self.assertEqual(wait_no_qemu(j["vm_id"]), [])
        deadline = time.time() + 30
        while time.time() < deadline and any(
                os.path.exists(os.path.join(w.state_dir, "vms", j["vm_id"])) for j in (ja, jb)):
            time.sleep(0.1)
        for j in (ja, jb):
            self.assertFalse(os.path.exists(os.path.join(w.state_dir, "vms", j["vm_id"])))
        tid = template_ids(w)
        self.assertEqual(len(tid), 1, tid)
        self.assertTrue(os.path.exists(f"/dev/shm/{shm_name(w, tid[0])}"))
        # Refilled in the background.
        p = wait_pool_ready(w, 2)
        self.assertGreaterEqual(p["handed_out"], 2, p)

    def test_1b_empty_pool_clones_instead_of_booting(self):
        w = self.w
        wait_pool_ready(w, 2)
        # Once full, the pool starts a spare QEMU (restore mode, nothing loaded yet).
        deadline = time.time() + 60
        while not pool(w)["spare"] and time.time() < deadline:
            time.sleep(0.1)
        self.assertTrue(pool(w)["spare"], pool(w))
        # Under TCG (these machines) the spare's translation buffer is touched ahead
        # (pool_spare_prefault_mb, 12 by default) while it waits: a QEMU whose guest
        # never ran has 12 MiB of it resident, where one just started has < 1.
        deadline = time.time() + 60
        while pool(w).get("spares_prefaulted", 0) < 1 and time.time() < deadline:
            time.sleep(0.05)
        self.assertEqual(pool(w)["spares_prefaulted"], 1, pool(w))
        # Every QEMU of the state dir now, for the spare among them, found below by the
        # pid of the VM the log names: others may be starting or ending meanwhile (a
        # refill), with no translation buffer to measure; they are left out.
        rwx = {pid: mib for pid in qemu_pids(w.state_dir)
               if (mib := tcg_rwx_mib(pid)) is not None}
        # Four back to back: the pool holds two and refills one at a time (a restore
        # takes far longer than a create), so the others find it empty: the first of
        # them is restored into the spare, the next into a QEMU started for it.
        sids = [w.create() for _ in range(4)]
        src = [w.get(s).json()["source"] for s in sids]
        self.assertIn("clone", src, src)
        self.assertNotIn("boot", src, src)
        m = re.search(r"(sb-[0-9a-z-]+): .*\(the pool is empty; a QEMU started ahead\)",
                      w.log_text())
        self.assertTrue(m, w.log_text())
        spare_pid = qemu_pids(w.vm_id(m.group(1)))
        self.assertEqual(len(spare_pid), 1, spare_pid)
        self.assertIn(spare_pid[0], rwx, "the spare's QEMU was not running before the creates")
        self.assertGreaterEqual(rwx[spare_pid[0]], 12, rwx)
        ids = set()
        for sid in sids:
            out = w.run(sid, "cat /proc/sys/kernel/random/boot_id; hostname")["stdout"].split()
            self.assertEqual(out[1], sid)
            ids.add(out[0])
            guest = int(w.run(sid, "date +%s")["stdout"])
            self.assertLess(abs(guest - time.time()), 60)
        self.assertEqual(len(ids), 4, ids)
        # A clone's create holds off the refill until it runs (pool_defer): the pool
        # still fills up again while the clones live.
        self.assertIn("pool: refill deferred while a create restores a clone", w.log_all())
        wait_pool_ready(w, 2)
        for sid in sids:
            self.assertEqual(w.delete(sid).status, 200)

    # -- forks of pool clones: delta snapshots over the template's RAM file --

    def count(self, sid):
        return counter_value(self.w, sid)

    def counting(self, sid):
        return counter_runs(self.w, sid)

    def fork(self, sid, count):
        r = self.w.request("POST", f"/v1/sandboxes/{sid}/fork", {"count": count})
        self.assertEqual(r.status, 201, f"{r}\n{self.w.log_text()}")
        body = r.json()
        self.assertEqual(len(body["sandboxes"]), count, body)
        return body["snapshot_id"], [x["id"] for x in body["sandboxes"]]

    def busy_pool_sandbox(self, blob_mb, path, marker):
        """A sandbox from the pool running COUNTER, with blob_mb MiB of random bytes in
        /tmp/blob and marker in the file path: its id and the blob's md5."""
        w = self.w
        wait_pool_ready(w, 1)
        a, ja = self.create()
        self.assertEqual(ja["source"], "pool", ja)
        r = w.request("POST", f"/v1/sandboxes/{a}/exec", {"cmd": COUNTER, "background": True})
        self.assertEqual(r.status, 201, r)
        w.run(a, f"echo {marker} > {path} && sync")
        blob = os.urandom(blob_mb << 20)
        r = w.request("PUT", f"/v1/sandboxes/{a}/files?path=/tmp/blob", body=blob)
        self.assertEqual(r.status, 200, r)
        return a, hashlib.md5(blob).hexdigest()

    def assert_delta(self, snap_id, parent, min_pages, kind="fork"):
        """The fork's (or pause's) snapshot is a delta over the template's RAM file: its header
        (vmm-driver/vmm_snap.c) says version 3, flag DELTA, npages pages over
        warren-<template>.mem, and the file is far smaller than the guest's 256 MiB."""
        w = self.w
        r = w.request("GET", f"/v1/snapshots/{snap_id}")
        self.assertEqual(r.status, 200, r)
        snap = r.json()
        self.assertEqual(snap["type"], kind, snap)
        self.assertEqual(snap["parent"], parent, snap)
        path = os.path.join(w.state_dir, "snapshots", snap_id, "state.snap")
        with open(path, "rb") as f:
            h = f.read(4096)
        size = os.path.getsize(path)
        self.assertEqual(h[:8], b"WARRENSN")
        version, = struct.unpack_from("<I", h, 8)
        flags, = struct.unpack_from("<I", h, 44)
        dev_len, npages = struct.unpack_from("<QQ", h, 112)
        base = h[128:192].split(b"\0", 1)[0].decode()
        self.assertEqual(version, 3)
        self.assertEqual(flags, 6, f"flags {flags:#x}: not DELTA and RAM_CRC alone")
        self.assertGreater(dev_len, 0)
        self.assertGreater(npages, min_pages)
        self.assertLess(npages, 65536)
        self.assertRegex(base, r"^warren-[0-9a-f]{8}-vm-[0-9a-f]+\.mem$")
        tid = template_ids(w)
        self.assertEqual(len(tid), 1, tid)
        self.assertEqual(base, shm_name(w, tid[0]))
        self.assertTrue(os.path.exists(os.path.join("/dev/shm", base)))
        # The RAM file's checksum: the one the template's save computed over that file.
        with open(os.path.join(w.state_dir, "templates", tid[0], "state.snap"), "rb") as f:
            th = f.read(4096)
        self.assertEqual(struct.unpack_from("<I", th, 44)[0], 1 | 4)  # SHARED_RAM, RAM_CRC
        self.assertEqual(struct.unpack_from("<I", h, 192), struct.unpack_from("<I", th, 192))
        # The device state, the page index and the pages end the file (vmm_delta_layout).
        idx = (4096 + dev_len + 4095) // 4096 * 4096
        data = (idx + 4 * npages + 4095) // 4096 * 4096
        self.assertEqual(size, data + npages * 4096)
        self.assertLess(size, 64 << 20, size)
        return npages

    def test_1c_fork_of_a_pool_sandbox_is_a_delta(self):
        w = self.w
        # 8 MiB in /tmp (a tmpfs: guest RAM, pages the parent now owns).
        a, md5 = self.busy_pool_sandbox(8, "/root/f", "pool-parent")
        self.assertEqual(w.run(a, "md5sum /tmp/blob")["stdout"].split()[0], md5)
        self.assertTrue(self.counting(a))

        snap, forks = self.fork(a, 2)
        npages = self.assert_delta(snap, a, 2048)
        check = "cat /root/f; md5sum /tmp/blob"
        for f in forks:
            self.assertEqual(w.get(f).json()["state"], "running")
            out = w.run(f, check)["stdout"].split()
            self.assertEqual(out[:2], ["pool-parent", md5], f"{out}\n{w.log_text()}")
            self.assertTrue(self.counting(f))
        # Each is a VM of its own: boot id, hostname, RNG.
        ids = "cat /proc/sys/kernel/random/boot_id; hostname; head -c 16 /dev/urandom | od -An -tx1"
        seen = [w.run(x, ids)["stdout"].split("\n") for x in [a] + forks]
        for col in range(3):
            vals = [x[col] for x in seen]
            self.assertEqual(len(set(vals)), 3, seen)
        # A write in one fork (disk and RAM) is seen by neither the parent nor the other fork.
        w.run(forks[0], "echo only-0 > /root/only && echo only-0 > /tmp/only && sync")
        for other in (a, forks[1]):
            r = w.run(other, "cat /root/only /tmp/only 2>&1; echo rc=$?")
            self.assertIn("rc=1", r["stdout"], r)
            self.assertNotIn("only-0", r["stdout"], r)
        self.assertTrue(self.counting(a))
        self.assertEqual(w.run(a, "md5sum /tmp/blob")["stdout"].split()[0], md5)

        # A fork is itself a clone over the template's RAM: its own fork is a delta too.
        w.run(forks[1], "echo second > /root/g && sync")
        snap2, (g,) = self.fork(forks[1], 1)
        self.assertGreater(self.assert_delta(snap2, forks[1], 2048), npages // 2)
        out = w.run(g, "cat /root/f /root/g; md5sum /tmp/blob")["stdout"].split()
        self.assertEqual(out[:3], ["pool-parent", "second", md5], out)
        self.assertTrue(self.counting(g))
        self.assertIn("rc=1", w.run(g, "cat /tmp/only 2>&1; echo rc=$?")["stdout"])

        # The forks' snapshots go by themselves with their last fork.
        for sid in [g] + forks + [a]:
            self.assertEqual(w.delete(sid).status, 200)
        deadline = time.time() + 15
        while time.time() < deadline and any(
                w.request("GET", f"/v1/snapshots/{s}").status != 404
                or os.path.exists(os.path.join(w.state_dir, "snapshots", s)) for s in (snap, snap2)):
            time.sleep(0.2)
        for s in (snap, snap2):
            self.assertEqual(w.request("GET", f"/v1/snapshots/{s}").status, 404)
            self.assertFalse(os.path.exists(os.path.join(w.state_dir, "snapshots", s)))

    def test_1d_pause_of_a_pool_sandbox_is_a_delta(self):
        """A pool sandbox's pause saves the pages it owns (a delta, synced) and keeps a
        copy of the template's RAM file in state_dir/bases/, which a paused sandbox may
        need after a rebuild or a reboot removed the /dev/shm file (test_2 resumes this
        one then). Its resume goes into a QEMU the pool started ahead."""
        w = self.w
        a, md5 = self.busy_pool_sandbox(4, "/root/pz", "paused-pool")
        self.assertTrue(self.counting(a))
        tid = template_ids(w)[0]
        base = os.path.join(w.state_dir, "bases", shm_name(w, tid))
        for round_ in range(2):
            r = w.request("POST", f"/v1/sandboxes/{a}/pause", {})
            self.assertEqual(r.status, 200, f"{r}\n{w.log_text()}")
            snap = r.json()["snapshot_id"]
            self.assertEqual(r.json()["state"], "paused", r.json())
            self.assert_delta(snap, a, 1024, kind="pause")
            # The copy: the same bytes as the template's RAM file, under the same name.
            self.assertTrue(os.path.exists(base), os.listdir(w.state_dir))
            with open(base, "rb") as f1, open(f"/dev/shm/{shm_name(w, tid)}", "rb") as f2:
                self.assertEqual(hashlib.md5(f1.read()).digest(), hashlib.md5(f2.read()).digest())
            if round_ == 1:
                break
            r = w.request("POST", f"/v1/sandboxes/{a}/resume", {})
            self.assertEqual(r.status, 200, f"{r}\n{w.log_text()}")
            self.assertIn(f"restored from snapshot {snap}, into a QEMU started ahead (resume)",
                          w.log_text())
            out = w.run(a, "cat /root/pz; md5sum /tmp/blob")["stdout"].split()
            self.assertEqual(out[:2], ["paused-pool", md5], out)
            self.assertTrue(self.counting(a))
        # A resume into a spare whose restore fails (the pause file damaged) leaves it
        # paused, the file and disk intact (the spare is spent); mended, it stays paused
        # for test_2.
        path = os.path.join(w.state_dir, "snapshots", snap, "state.snap")
        with open(path, "r+b") as f:
            f.seek(8192)
            orig = f.read(64)
            f.seek(8192)
            f.write(bytes(x ^ 0xFF for x in orig))
        wait_spares_ready(w)
        r = w.request("POST", f"/v1/sandboxes/{a}/resume", {})
        self.assertEqual(r.status, 409, f"{r}\n{w.log_text()}")
        self.assertIn(f"restored from snapshot {snap}, into a QEMU started ahead (resume)",
                      w.log_text())
        self.assertEqual(w.get(a).json()["state"], "paused")
        with open(path, "r+b") as f:
            f.seek(8192)
            f.write(orig)
        type(self).paused = (a, md5, base)

    def test_1e_resume_whose_qemu_dies_stays_paused(self):
        """A resume whose QEMU ends before the guest answers (here: the spare it went into
        is killed while its restore waits) leaves the sandbox paused with its snapshot:
        the disk was copied into the spare, not taken, so nothing the guest could have
        written is lost. The next resume brings back its files and counter."""
        w = self.w
        a, md5 = self.busy_pool_sandbox(1, "/root/pe", "resume-dies")
        r = w.request("POST", f"/v1/sandboxes/{a}/pause", {})
        self.assertEqual(r.status, 200, f"{r}\n{w.log_text()}")
        snap = r.json()["snapshot_id"]
        wait_spares_ready(w)
        owned = set()
        for s in w.request("GET", "/v1/sandboxes").json()["sandboxes"]:
            if s.get("vm_id"):
                owned.update(qemu_pids(s["vm_id"]))
        pool_pids = [p for p in qemu_pids(w.state_dir) if p not in owned]
        self.assertTrue(pool_pids)
        log = w.log_all
        n0 = len(log())
        got = {}
        for p in pool_pids:
            os.kill(p, signal.SIGSTOP)
        try:
            th = threading.Thread(target=lambda: got.update(
                r=w.request("POST", f"/v1/sandboxes/{a}/resume", {})))
            th.start()
            pat = re.compile(rf"{a}: starting: VM \S+ restored from snapshot {snap}, into a "
                             rf"QEMU started ahead \(resume\), pid (\d+)")
            deadline = time.time() + 30
            while not (m := pat.search(log()[n0:])):
                self.assertLess(time.time(), deadline, log()[n0:])
                time.sleep(0.02)
            self.assertIn(int(m.group(1)), pool_pids)
            os.kill(int(m.group(1)), signal.SIGKILL)
            th.join(60)
        finally:
            for p in pool_pids:
                try:
                    os.kill(p, signal.SIGCONT)
                except ProcessLookupError:
                    pass
        self.assertIn("r", got)
        self.assertEqual(got["r"].status, 500, got["r"])
        self.assertEqual(got["r"].json()["error"]["code"], "vm_start_failed", got["r"])
        self.assertEqual(w.get(a).json()["state"], "paused")
        self.assertIn(f"{a}: the resume failed", log()[n0:])
        wait_spares_ready(w)
        r = w.request("POST", f"/v1/sandboxes/{a}/resume", {})
        self.assertEqual(r.status, 200, f"{r}\n{log()[n0:]}")
        out = w.run(a, "cat /root/pe; md5sum /tmp/blob")["stdout"].split()
        self.assertEqual(out[:2], ["resume-dies", md5], out)
        self.assertTrue(self.counting(a))
        w.delete(a)

    def test_2_corrupt_snapshot_rebuilt(self):
        w = self.w
        wait_pool_ready(w, 2)
        old = template_ids(w)
        self.assertEqual(len(old), 1, old)
        snap = os.path.join(w.state_dir, "templates", old[0], "state.snap")
        # A sandbox from the pool outlives a warrend kill -9 like a booted one.
        keep, jk = self.create()
        self.assertEqual(jk["source"], "pool", jk)
        w.run(keep, "echo kept > /root/k")
        # And a fork of it (a delta over the template's RAM file, which the rebuild
        # below removes): it runs on like any sandbox.
        fsnap, (fk,) = self.fork(keep, 1)
        self.assertEqual(w.run(fk, "cat /root/k")["stdout"], "kept\n")
        w.kill9()
        # Flip bytes in the middle of the device state: the checksum no longer holds.
        with open(snap, "r+b") as f:
            size = os.fstat(f.fileno()).st_size
            f.seek(size // 2)
            chunk = f.read(64)
            f.seek(size // 2)
            f.write(bytes(x ^ 0xFF for x in chunk))
        w.start()
        assert_rebuilt(self, w, "refused", old)
        self.assertFalse(os.path.exists(f"/dev/shm/{shm_name(w, old[0])}"))
        # test_1d's paused sandbox: its delta goes over the old template's RAM file, which
        # the rebuild removed; it resumes over the copy in state_dir/bases/, processes,
        # memory and disk as they were, and pauses and resumes again over it.
        pa, pmd5, base = self.paused
        for _ in range(2):
            r = w.request("POST", f"/v1/sandboxes/{pa}/resume", {})
            self.assertEqual(r.status, 200, f"{r}\n{w.log_text()}")
            out = w.run(pa, "cat /root/pz; md5sum /tmp/blob")["stdout"].split()
            self.assertEqual(out[:2], ["paused-pool", pmd5], out)
            self.assertTrue(self.counting(pa))
            (q,) = qemu_pids(w.get(pa).json()["vm_id"])
            with open(f"/proc/{q}/maps") as f:
                self.assertIn(base, f.read())
            self.assertEqual(pause_delta(self, w, pa), os.path.basename(base))
        r = w.request("POST", f"/v1/sandboxes/{pa}/resume", {})
        self.assertEqual(r.status, 200, f"{r}\n{w.log_text()}")
        self.assertEqual(w.run(pa, "cat /root/pz")["stdout"], "paused-pool\n")
        # The copy goes with the last snapshot over it.
        self.assertEqual(w.delete(pa).status, 200)
        deadline = time.time() + 15
        while time.time() < deadline and os.path.exists(base):
            time.sleep(0.2)
        self.assertFalse(os.path.exists(base), os.listdir(os.path.dirname(base)))
        jk2 = w.wait_state(keep, ["running"])
        self.assertEqual(jk2["source"], "pool", jk2)
        self.assertEqual(jk2["vm_id"], jk["vm_id"])
        self.assertEqual(w.run(keep, "cat /root/k")["stdout"], "kept\n")
        # Its disk is layered on the old template's overlay, which the rebuild removed:
        # a snapshot of it still works (the overlay is copied from its QEMU's fd), and a
        # sandbox restored from that snapshot sees its files.
        r = w.request("POST", f"/v1/sandboxes/{keep}/snapshot", {})
        self.assertEqual(r.status, 201, f"{r}\n{w.log_text()}")
        ks = r.json()["id"]
        self.assertIn(f"snapshot {ks}: the template's overlay", w.log_text())
        kc = w.create(snapshot_id=ks)
        self.assertEqual(w.run(kc, "cat /root/k")["stdout"], "kept\n")
        w.delete(kc)
        self.assertEqual(w.request("DELETE", f"/v1/snapshots/{ks}").status, 200)
        w.delete(keep)
        sid, j = self.create()
        self.assertEqual(j["source"], "pool", j)
        self.assertEqual(w.run(sid, "echo ok")["stdout"], "ok\n")
        w.delete(sid)
        # The fork was adopted over the old template's RAM file, which the rebuild
        # removed: its own fork saves all its RAM (a full snapshot, version 3, no
        # flags) and still sees the file.
        w.wait_state(fk, ["running"])
        fsnap2, (g,) = self.fork(fk, 1)
        with open(os.path.join(w.state_dir, "snapshots", fsnap2, "state.snap"), "rb") as f:
            h = f.read(4096)
        self.assertEqual(struct.unpack_from("<I", h, 8)[0], 3)  # version
        self.assertEqual(struct.unpack_from("<I", h, 44)[0], 0)  # flags
        self.assertEqual(w.run(g, "cat /root/k")["stdout"], "kept\n")
        w.delete(g)
        # Kept for test_2a: the fork's delta snapshot over the removed RAM file.
        type(self).stale = (fsnap, fk, f"/dev/shm/{shm_name(w, old[0])}")

    # A create from a fork's delta snapshot whose template RAM file is gone (the template
    # was rebuilt) is refused before any QEMU starts: one would create the missing RAM
    # file (memory-backend-file opens it O_CREAT), and nothing would remove it.
    def test_2a_stale_delta_snapshot_refused_cleanly(self):
        w = self.w
        snap, fk, mem = self.stale
        self.addCleanup(lambda: os.path.exists(mem) and os.unlink(mem))
        try:
            self.assertFalse(os.path.exists(mem))
            r = w.request("POST", "/v1/sandboxes", {"snapshot_id": snap,
                                                    "ttl_seconds": w.TEST_TTL_S})
            self.assertEqual(r.status, 409, f"{r}\n{w.log_text()}")
            self.assertEqual(r.json()["error"]["code"], "snapshot_invalid", r.json())
            # Whatever is left of the failed create goes: nothing may recreate the file.
            time.sleep(1)
            self.assertFalse(os.path.exists(mem), f"{mem} recreated by the create")
        finally:
            # The sandbox the create was for is dead and never had a VM (refused before
            # any launch); a VM's run dir would keep its logs for ended_retention_seconds
            # (test_3 knows).
            dead = [x for x in w.request("GET", "/v1/sandboxes?state=dead").json()["sandboxes"]
                    if x.get("snapshot_id") == snap]
            self.assertEqual(len(dead), 1, dead)
            self.assertIsNone(dead[0].get("vm_id"), dead)
            type(self).dead_vms = [x["vm_id"] for x in dead if x.get("vm_id")]
            self.assertEqual(w.delete(fk).status, 200)

    def test_2b_snapshot_reused_after_kill9(self):
        w = self.w
        wait_pool_ready(w, 2)
        tid = template_ids(w)
        # A pool sandbox adopted by the restart still forks and pauses as deltas: its
        # VM's record names its RAM file, which the driver finds mapped in QEMU.
        a, md5 = self.busy_pool_sandbox(1, "/root/adopted", "adopted")
        w.kill9()
        w.start()
        p = wait_pool_ready(w, 2)
        self.assertEqual(p["rebuilds"], 0, p)
        w.wait_state(a, ["running"])
        snap, (f1,) = self.fork(a, 1)
        self.assertEqual(snap_header(w, snap), (6, shm_name(w, tid[0])))
        self.assertEqual(w.run(f1, "cat /root/adopted; md5sum /tmp/blob")["stdout"].split()[:2],
                         ["adopted", md5])
        self.assertEqual(pause_delta(self, w, a), shm_name(w, tid[0]))
        r = w.request("POST", f"/v1/sandboxes/{a}/resume", {})
        self.assertEqual(r.status, 200, f"{r}\n{w.log_text()}")
        self.assertTrue(self.counting(a))
        for x in (f1, a):
            self.assertEqual(w.delete(x).status, 200)
        self.assertEqual(template_ids(w), tid)
        self.assertIn("pool: reusing template minimal snapshot", w.log_text())
        self.assertIn("pool VM of an earlier warrend: removing it", w.log_text())
        sid, j = self.create()
        self.assertEqual(j["source"], "pool", j)
        self.assertEqual(w.run(sid, "echo ok")["stdout"], "ok\n")
        w.delete(sid)

    def test_2c_image_replaced_invalidates_snapshot(self):
        w = self.w
        wait_pool_ready(w, 2)
        old = template_ids(w)
        keep, jk = self.create()
        self.assertEqual(jk["source"], "pool", jk)
        w.kill9()
        # The operator replaces the template's image (same bytes, a new file): the
        # snapshot was taken over the old one and must not be used.
        copy_image(os.path.join(image_dir(), "minimal.ext4"),
                   os.path.join(self.images, "minimal.ext4"))
        w.start()
        assert_rebuilt(self, w, "snapshot not used: its base image changed; rebuilding it", old)
        sid, j = self.create()
        self.assertEqual(j["source"], "pool", j)
        self.assertEqual(w.run(sid, "echo ok")["stdout"], "ok\n")
        # The sandbox cloned from the old snapshot runs on (its QEMU holds the old
        # image open).
        self.assertEqual(w.wait_state(keep, ["running"])["vm_id"], jk["vm_id"])
        self.assertEqual(w.run(keep, "echo still")["stdout"], "still\n")
        for x in (sid, keep):
            w.delete(x)

    def test_2d_churn_leaks_nothing(self):
        w = self.w
        cycles = int(os.environ.get("WARREN_CHURN", "20"))
        wait_pool_ready(w, 2)
        before = held(w)
        gone = []
        for i in range(cycles):
            wait_pool_ready(w, 1)  # each from the pool: its VMs are what churns here
            sid = w.create()
            self.assertEqual(w.get(sid).json()["source"], "pool")
            gone.append(w.vm_id(sid))
            self.assertEqual(w.run(sid, f"echo {i}")["stdout"], f"{i}\n")
            self.assertEqual(w.delete(sid).status, 200)

        def settled(expect_fds):
            deadline = time.time() + 120
            while True:
                p = wait_pool_ready(w, 2)
                h = held(w, gone)
                # test_2a's dead sandbox keeps its run dir (its logs) until purged.
                h["run_dirs"] -= len(set(getattr(self, "dead_vms", []))
                                     & set(os.listdir(os.path.join(w.state_dir, "vms"))))
                ok = (h["qemu"] == h["run_dirs"] == p["ready"] + p["spare"] and not p["filling"]
                      and not h["leaked"] and h["fds"] <= expect_fds)
                if ok or time.time() > deadline:
                    return p, h
                time.sleep(0.2)

        p, h = settled(before["fds"] + 4)
        # Only the pool's VMs (and its spare QEMU) run, each with its run dir; one
        # template, one RAM file;
        # of the deleted sandboxes' VMs nothing is left; warrend holds no more fds.
        n = p["ready"] + p["spare"]  # the pool's VMs and its spare QEMU
        self.assertEqual((h["qemu"], h["run_dirs"]), (n, n), (h, p))
        self.assertEqual((h["templates"], h["template_mem"]), (1, 1), h)
        self.assertEqual(h["leaked"], [], h)
        self.assertLessEqual(h["fds"], before["fds"] + 4, (before, h))
        # Killed in the middle of a create/delete: the restart leaves the same.
        sid = w.create()
        gone.append(w.vm_id(sid))
        w.kill9()
        w.start()
        self.assertEqual(w.delete(sid).status, 200)
        p, h = settled(10**6)
        n = p["ready"] + p["spare"]  # the pool's VMs and its spare QEMU
        self.assertEqual((h["qemu"], h["run_dirs"]), (n, n), (h, p))
        self.assertEqual((h["templates"], h["template_mem"]), (1, 1), h)
        self.assertEqual(h["leaked"], [], h)

    def test_2e_fork_and_pause_after_a_rebuild_while_running(self):
        """The template is rebuilt while a pool sandbox runs (its snapshot refused at a
        refill): the RAM file the sandbox maps is gone by name. Its fork then takes all
        its RAM (a delta would need that file); its pause is still a delta, its copy of
        the RAM file made from QEMU's open fd, and it resumes over that copy."""
        w = self.w
        wait_pool_ready(w, 2)
        (tid,) = template_ids(w)
        mem = f"/dev/shm/{shm_name(w, tid)}"
        a, md5 = self.busy_pool_sandbox(2, "/root/live", "before-rebuild")
        with open(os.path.join(w.state_dir, "templates", tid, "state.snap"), "r+b") as f:
            f.seek(8)
            f.write(b"\xff\xff\xff\xff")  # the version: the next restore refuses it
        b = w.create()  # its refill is refused and rebuilds the template
        deadline = time.time() + 60
        while time.time() < deadline and (os.path.exists(mem) or template_ids(w) == [tid]):
            time.sleep(0.2)
        self.assertFalse(os.path.exists(mem), w.log_text())
        snap, (f1,) = self.fork(a, 1)
        self.assertEqual(snap_header(w, snap), (0, ""))  # all the RAM
        self.assertEqual(w.run(f1, "cat /root/live; md5sum /tmp/blob")["stdout"].split()[:2],
                         ["before-rebuild", md5])
        self.assertTrue(self.counting(f1))
        base = os.path.join(w.state_dir, "bases", os.path.basename(mem))
        self.assertEqual(pause_delta(self, w, a), os.path.basename(mem))
        self.assertTrue(os.path.exists(base))
        r = w.request("POST", f"/v1/sandboxes/{a}/resume", {})
        self.assertEqual(r.status, 200, f"{r}\n{w.log_text()}")
        self.assertEqual(w.run(a, "cat /root/live; md5sum /tmp/blob")["stdout"].split()[:2],
                         ["before-rebuild", md5])
        self.assertTrue(self.counting(a))
        for x in (f1, a, b):
            self.assertEqual(w.delete(x).status, 200)
        deadline = time.time() + 15
        while time.time() < deadline and os.path.exists(base):
            time.sleep(0.2)
        self.assertFalse(os.path.exists(base))

    def test_3_nothing_left(self):
        w = self.w
        wait_pool_ready(w, 2)
        tid = template_ids(w)
        sid, _ = self.create()
        w.delete(sid)
        w.stop()
        # Pool VMs and deleted sandboxes' VMs are gone; on a clean shutdown the
        # template's snapshot, overlay and RAM file go too. A dead sandbox's run dir
        # (test_2a's) keeps only its logs until its record is purged.
        self.assertEqual(wait_no_qemu(w.state_dir), [])
        deadline = time.time() + 10
        vms = os.path.join(w.state_dir, "vms")
        dead = set(getattr(self, "dead_vms", []))
        while time.time() < deadline and set(os.listdir(vms)) - dead:
            time.sleep(0.1)
        self.assertEqual(sorted(set(os.listdir(vms)) - dead), [])
        for v in dead & set(os.listdir(vms)):
            self.assertLessEqual(set(os.listdir(os.path.join(vms, v))),
                                 {"console.log", "qemu.log"})
        self.assertEqual(template_ids(w), [])
        bases = os.path.join(w.state_dir, "bases")
        self.assertEqual(os.listdir(bases) if os.path.isdir(bases) else [], [])
        for t in tid:
            self.assertFalse(os.path.exists(f"/dev/shm/{shm_name(w, t)}"))


def pools(w):
    """{(template, memory_mb): its pool's figures} from GET /healthz."""
    return {(p["template"], p["memory_mb"]): p for p in pool(w)["templates"]}


def wait_pools_ready(w, want, timeout=180):
    """Until each (template, memory_mb) in want has a ready pool with a VM in it."""
    deadline = time.time() + timeout
    while time.time() < deadline:
        ps = pools(w)
        if all(k in ps and ps[k]["state"] == "ready" and ps[k]["ready"] >= 1 for k in want):
            return ps
        time.sleep(0.2)
    raise AssertionError(f"pools never ready: {pools(w)}\n{w.log_text()}")


def mem_total_mib(w, sid):
    return int(w.run(sid, "awk '/MemTotal/{print $2}' /proc/meminfo")["stdout"]) / 1024


class TestPoolTemplates(unittest.TestCase):
    """A pool per template, not only for the default one:
    pool_templates' built at start; on first use, one for each template and shape
    (memory, vCPUs) a create asks for, that create booting; none past
    pool_max_templates (logged once, its creates boot). They survive a kill -9 and
    go with a clean stop."""
    CONF = {"pool_size": "1", "pool_spares": "0", "jail": "off", "default_template": "minimal",
            "pool_templates": "base", "pool_max_templates": "3"}

    def test_pools_per_template_and_shape(self):
        w = Warren(self.CONF).start()
        try:
            self.run_it(w)
        finally:
            w.cleanup()

    def source(self, w, sid):
        return w.get(sid).json()["source"]

    def test_jailed_pool_made_on_first_use(self):
        # Jailed, a pool made on first use seals its own template's RAM for its clones.
        uid_base = 231000
        w = Warren(dict(self.CONF, pool_templates="", jail="required",
                        jail_uid_base=str(uid_base), jail_uid_count="10",
                        jail_cgroup="warren-it"))
        try:
            w.start()
            wait_pools_ready(w, [("minimal", 256)])
            c = w.create(memory_mb=192)
            self.assertEqual(self.source(w, c), "boot")
            wait_pools_ready(w, [("minimal", 192)])
            d = w.create(memory_mb=192)
            rec = w.get(d).json()
            self.assertEqual(rec["source"], "pool", rec)
            (q,) = qemu_pids(rec["vm_id"])
            with open(f"/proc/{q}/status") as f:
                st = dict(line.split(":", 1) for line in f if ":" in line)
            self.assertTrue(uid_base <= int(st["Uid"].split()[0]) < uid_base + 10, st["Uid"])
            self.assertEqual(os.readlink(f"/proc/{q}/fd/4"),
                             "/memfd:warren-template-ram (deleted)")
            shown = [t for t in template_ids(w)
                     if os.path.lexists(f"/proc/{q}/root/dev/shm/{shm_name(w, t)}")]
            self.assertEqual(len(shown), 1, (shown, template_ids(w)))
            self.assertEqual(os.readlink(f"/proc/{q}/root/dev/shm/{shm_name(w, shown[0])}"),
                             "/proc/self/fd/4")
            self.assertLess(mem_total_mib(w, d), 192)
            for x in (c, d):
                self.assertEqual(w.delete(x).status, 200)
        finally:
            w.cleanup()

    def test_no_room_in_pool_max_mb(self):
        # The default template's RAM file (256) and its one VM (48) leave 48 MiB: no
        # room for another template's RAM file, so its creates boot and no build starts.
        w = Warren(dict(self.CONF, pool_templates="", pool_max_mb="352")).start()
        try:
            wait_pools_ready(w, [("minimal", 256)])
            c = w.create(memory_mb=192)
            self.assertEqual(self.source(w, c), "boot")
            self.assertIn("pool: no pool for template minimal@192m1c: pool_max_mb = 352 has no "
                          "room for its RAM file and a VM (240 MiB)", w.log_all())
            self.assertEqual(list(pools(w)), [("minimal", 256)])
            self.assertEqual(len(template_ids(w)), 1)
            self.assertEqual(w.run(c, "echo ok")["stdout"], "ok\n")
            self.assertEqual(w.delete(c).status, 200)
            # Shapes a client picks are logged once each, for the first
            # pool_max_templates (3) of them, then once more that the rest are not.
            for mem in (160, 176, 208, 224, 160):
                x = w.create(memory_mb=mem)
                self.assertEqual(self.source(w, x), "boot")
                self.assertEqual(w.delete(x).status, 200)
            log = w.log_all()
            named = re.findall(r"pool: no pool for template (minimal@\d+m1c): pool_max_mb", log)
            self.assertEqual(named, ["minimal@192m1c", "minimal@160m1c", "minimal@176m1c"], log)
            self.assertEqual(log.count("pool: no pool for template minimal@208m1c either (pool_max_mb"
                                       " = 352 has no room for its RAM file and a VM (256 MiB)); "
                                       "other shapes refused a pool are not logged"), 1, log)
            self.assertNotIn("minimal@224m1c", log)
            self.assertEqual(list(pools(w)), [("minimal", 256)])
        finally:
            w.cleanup()

    def run_it(self, w):
        wait_pools_ready(w, [("minimal", 256), ("base", 256)])
        # pool_templates' pool hands out base sandboxes: base has python3, minimal not.
        b = w.create(template="base")
        self.assertEqual(self.source(w, b), "pool")
        self.assertEqual(w.run(b, "python3 -c 'print(6*7)'")["stdout"], "42\n")
        m = w.create()
        self.assertEqual(self.source(w, m), "pool")
        self.assertIn("rc=1", w.run(m, "command -v python3; echo rc=$?")["stdout"])
        # GET /v1/templates: every image, the default marked, each with its pools.
        r = w.request("GET", "/v1/templates")
        self.assertEqual(r.status, 200, r)
        ts = {t["name"]: t for t in r.json()["templates"]}
        self.assertEqual(sorted(ts), sorted(f[:-5] for f in os.listdir(image_dir())
                                            if f.endswith(".ext4")))
        self.assertEqual([n for n in ts if ts[n]["default"]], ["minimal"])
        self.assertEqual([(p["memory_mb"], p["state"]) for p in ts["base"]["pools"]],
                         [(256, "ready")])
        # First use of another memory size: that create boots, its pool is built after.
        c = w.create(memory_mb=192)
        self.assertEqual(self.source(w, c), "boot")
        self.assertIn("pool: first create of template minimal@192m1c: building its pool",
                      w.log_all())
        ps = wait_pools_ready(w, [("minimal", 192)])
        self.assertEqual(len(ps), 3, ps)
        ts = {t["name"]: t for t in w.request("GET", "/v1/templates").json()["templates"]}
        self.assertEqual(sorted(p["memory_mb"] for p in ts["minimal"]["pools"]), [192, 256])
        d = w.create(memory_mb=192)
        self.assertEqual(self.source(w, d), "pool")
        # Each pool's VMs have its shape (MemTotal: 142 MiB of 192, 206 of 256).
        md, mm = mem_total_mib(w, d), mem_total_mib(w, m)
        self.assertTrue(120 < md < 192 < mm < 256, (md, mm))
        # The fourth: past pool_max_templates, logged once, its creates boot.
        refused = "pool: no pool for template minimal@160m1c: pool_max_templates = 3 reached"
        e1 = w.create(memory_mb=160)
        e2 = w.create(memory_mb=160)
        self.assertEqual([self.source(w, x) for x in (e1, e2)], ["boot", "boot"])
        self.assertEqual(w.log_all().count(refused), 1, w.log_text())
        self.assertEqual(len(pools(w)), 3, pools(w))
        tid = template_ids(w)
        self.assertEqual(len(tid), 3, tid)
        for x in (b, m, c, d, e1, e2):
            self.assertEqual(w.delete(x).status, 200)
        # A kill -9 keeps the pools and their snapshots: reused, not rebuilt.
        w.kill9()
        w.start()
        ps = wait_pools_ready(w, [("minimal", 256), ("base", 256), ("minimal", 192)])
        self.assertEqual(len(ps), 3, ps)
        self.assertEqual(sum(p["rebuilds"] for p in ps.values()), 0, ps)
        self.assertIn("pool: reusing template minimal@192m1c snapshot", w.log_all())
        self.assertEqual(template_ids(w), tid)
        d = w.create(memory_mb=192)
        self.assertEqual(self.source(w, d), "pool")
        self.assertEqual(w.run(d, "echo ok")["stdout"], "ok\n")
        w.delete(d)
        # A clean stop removes every template's files.
        w.stop()
        self.assertEqual(template_ids(w), [])
        for t in tid:
            self.assertFalse(os.path.exists(f"/dev/shm/{shm_name(w, t)}"))


class TestPoolJailed(unittest.TestCase):
    """With QEMU jailed, the pool's clones are jailed too: each maps the template's RAM
    as a memfd sealed against writes, which its jail shows at the RAM file's path (a
    link to the fd it inherits) in place of the file itself. Before, the pool stayed
    off when jailed: QEMU 7.2 opens its RAM file read-write, and the file is every
    clone's."""
    UID_BASE = 230000

    def test_jailed_clones_map_a_sealed_template(self):
        conf = dict(POOL_CONF, jail="required", jail_uid_base=str(self.UID_BASE),
                    jail_uid_count="10", jail_cgroup="warren-it")
        w = Warren(conf)
        try:
            w.start()
            wait_pool_ready(w, 2)
            tid = template_ids(w)[0]
            mem = f"/dev/shm/{shm_name(w, tid)}"
            sids = [w.create() for _ in range(3)]  # the third finds the pool empty
            recs = [w.get(s).json() for s in sids]
            self.assertEqual([r["source"] for r in recs[:2]], ["pool", "pool"], recs)
            self.assertIn(recs[2]["source"], ("pool", "clone"), recs[2])
            for sid, rec in zip(sids, recs):
                pids = qemu_pids(rec["vm_id"])
                self.assertEqual(len(pids), 1, pids)
                q = pids[0]
                with open(f"/proc/{q}/status") as f:
                    st = dict(line.split(":", 1) for line in f if ":" in line)
                uid = int(st["Uid"].split()[0])
                self.assertTrue(self.UID_BASE <= uid < self.UID_BASE + 10, uid)
                self.assertEqual(int(st["CapEff"], 16), 0)
                # Its RAM is the sealed memfd, found at the RAM file's path in its jail.
                self.assertEqual(os.readlink(f"/proc/{q}/fd/4"),
                                 "/memfd:warren-template-ram (deleted)")
                self.assertEqual(os.readlink(f"/proc/{q}/root{mem}"), "/proc/self/fd/4")
                with open(f"/proc/{q}/maps") as f:
                    self.assertIn("/memfd:warren-template-ram", f.read())
                # Nobody can write it: not QEMU, not even root through QEMU's fd.
                fd = os.open(f"/proc/{q}/fd/4", os.O_RDWR)
                try:
                    with self.assertRaises(PermissionError):
                        os.pwrite(fd, b"x", 0)
                    with self.assertRaises(PermissionError):
                        os.ftruncate(fd, 4096)
                finally:
                    os.close(fd)
                self.assertEqual(w.run(sid, "echo ok")["stdout"], "ok\n")
            # Writes stay each clone's own, and a jailed pool sandbox pauses and resumes.
            w.run(sids[0], "echo mine > /root/f")
            self.assertIn("rc=1", w.run(sids[1], "cat /root/f 2>&1; echo rc=$?")["stdout"])
            for op in ("pause", "resume"):
                r = w.request("POST", f"/v1/sandboxes/{sids[0]}/{op}", {})
                self.assertEqual(r.status, 200, f"{r}\n{w.log_text()}")
            self.assertEqual(w.run(sids[0], "cat /root/f")["stdout"], "mine\n")
            # A fork of a jailed clone: a delta over the sealed template, restored
            # into a jailed QEMU of its own.
            w.run(sids[1], "echo from-parent > /root/p && echo ram > /tmp/r")
            r = w.request("POST", f"/v1/sandboxes/{sids[1]}/fork", {"count": 1})
            self.assertEqual(r.status, 201, f"{r}\n{w.log_text()}")
            body = r.json()
            fk = body["sandboxes"][0]["id"]
            self.assertEqual(snap_header(w, body["snapshot_id"]), (6, os.path.basename(mem)))
            self.assertEqual(w.run(fk, "cat /root/p /tmp/r")["stdout"], "from-parent\nram\n")
            pids = qemu_pids(w.get(fk).json()["vm_id"])
            self.assertEqual(len(pids), 1, pids)
            with open(f"/proc/{pids[0]}/status") as f:
                st = dict(line.split(":", 1) for line in f if ":" in line)
            uid = int(st["Uid"].split()[0])
            self.assertTrue(self.UID_BASE <= uid < self.UID_BASE + 10, uid)
            self.assertEqual(int(st["CapEff"], 16), 0)
            self.assertEqual(os.readlink(f"/proc/{pids[0]}/root{mem}"), "/proc/self/fd/4")
            self.assertEqual(w.delete(fk).status, 200)
            # A jailed pool sandbox's pause is a delta too, and resumes after a rebuild
            # removed the template's RAM file: over a sealed copy of the copy in bases/.
            w.run(sids[0], "echo ram-mine > /tmp/m")
            self.assertEqual(pause_delta(self, w, sids[0]), os.path.basename(mem))
            base = os.path.join(w.state_dir, "bases", os.path.basename(mem))
            self.assertTrue(os.path.exists(base))
            w.kill9()
            with open(os.path.join(w.state_dir, "templates", tid, "state.snap"), "r+b") as f:
                f.seek(8)
                f.write(b"\xff\xff\xff\xff")  # the version: refused, rebuilt
            w.start()
            wait_pool_ready(w, 2)
            self.assertNotEqual(template_ids(w), [tid])
            self.assertFalse(os.path.exists(mem))
            r = w.request("POST", f"/v1/sandboxes/{sids[0]}/resume", {})
            self.assertEqual(r.status, 200, f"{r}\n{w.log_text()}")
            self.assertIn(f"sealing {base} for its jailed QEMU first", w.log_text())
            self.assertEqual(w.run(sids[0], "cat /root/f /tmp/m")["stdout"], "mine\nram-mine\n")
            (q,) = qemu_pids(w.get(sids[0]).json()["vm_id"])
            self.assertEqual(os.readlink(f"/proc/{q}/root{base}"), "/proc/self/fd/4")
            self.assertEqual(os.readlink(f"/proc/{q}/fd/4"), "/memfd:warren-template-ram (deleted)")
            # A jailed clone adopted by that restart maps a memfd of the removed file: the
            # driver finds it mapped, and its pause is a delta over the copy sids[0]'s
            # pause keeps.
            self.assertEqual(pause_delta(self, w, sids[1]), os.path.basename(mem))
            r = w.request("POST", f"/v1/sandboxes/{sids[1]}/resume", {})
            self.assertEqual(r.status, 200, f"{r}\n{w.log_text()}")
            self.assertEqual(w.run(sids[1], "cat /root/p /tmp/r")["stdout"], "from-parent\nram\n")
            for sid in sids:
                self.assertEqual(w.delete(sid).status, 200)
        finally:
            w.cleanup()


class TestPoolDamagedTemplateRam(unittest.TestCase):
    """A template's RAM file damaged while warrend was down (one byte of a page with
    data, its size kept: every check before this one passes) is refused by the
    checksum its snapshot's header carries at the first restore of the pool's refill,
    and the template is rebuilt; the pool then hands out working sandboxes. Unjailed,
    the restore reads the file itself; jailed (the subclass), the sealed copy made of
    it."""
    conf = POOL_CONF

    def test_damaged_template_ram_is_rebuilt(self):
        w = Warren(self.conf)
        try:
            w.start()
            wait_pool_ready(w, 2)
            (tid,) = template_ids(w)
            with open(os.path.join(w.state_dir, "templates", tid, "state.snap"), "rb") as f:
                self.assertEqual(struct.unpack_from("<I", f.read(4096), 44)[0], 1 | 4)
            w.kill9()  # a clean stop removes the template (its RAM file is in /dev/shm)
            for pid in qemu_pids(w.state_dir):  # the pool's VMs: none would be handed out
                os.kill(pid, signal.SIGKILL)
            self.assertEqual(wait_no_qemu(w.state_dir), [])
            flip_ram_byte(f"/dev/shm/{shm_name(w, tid)}")
            w.start()
            assert_rebuilt(self, w, "checksum mismatch (damaged file)", [tid])
            sid = w.create()
            self.assertEqual(w.get(sid).json()["source"], "pool")
            self.assertEqual(w.run(sid, "echo ok")["stdout"], "ok\n")
        finally:
            w.cleanup()


class TestPoolShmFiles(unittest.TestCase):
    """The template's guest RAM in /dev/shm: readable by warrend's uid alone, named after
    the state dir's tag; what a warrend killed with -9 left there is swept at the next
    start (its own tag's files that no record names and no process maps, nothing else),
    and the harness removes what a warrend that never comes back left."""

    def test_template_ram_private_and_swept(self):
        w = Warren(dict(POOL_CONF, pool_size="1"))
        holder, others = None, []
        try:
            w.start()
            wait_pool_ready(w, 1)
            (tid,) = template_ids(w)
            mem = f"/dev/shm/{shm_name(w, tid)}"
            st = os.stat(mem)
            self.assertEqual((st.st_uid, st.st_mode & 0o777), (os.geteuid(), 0o600))
            # Another local user reading a pooled guest's memory: refused.
            r = subprocess.run(["setpriv", "--reuid=65534", "--regid=65534", "--clear-groups",
                                "head", "-c", "16", mem], capture_output=True)
            self.assertNotEqual(r.returncode, 0, r)
            self.assertIn(b"Permission denied", r.stderr)
            # What a warrend killed mid-way leaves: a RAM file of a template no record
            # names; one a live process still maps; and another state dir's.
            tag = fnv1a(w.state_dir)
            stray = f"/dev/shm/warren-{tag}-vm-00000000000dead0.mem"
            mapped = f"/dev/shm/warren-{tag}-vm-00000000000dead1.mem"
            other = f"/dev/shm/warren-{fnv1a(w.state_dir + '-other')}-vm-00000000000dead2.mem"
            for f in (stray, mapped, other):
                with open(f, "wb") as out:
                    out.write(b"\0" * 4096)
                others.append(f)
            holder = subprocess.Popen(
                ["python3", "-c", "import mmap,sys,time\n"
                 f"f=open({mapped!r},'r+b'); m=mmap.mmap(f.fileno(), 4096)\n"
                 "print('mapped', flush=True); time.sleep(600)"],
                stdout=subprocess.PIPE, text=True)
            self.assertEqual(holder.stdout.readline().strip(), "mapped")
            w.kill9()
            w.start()
            p = wait_pool_ready(w, 1)
            self.assertEqual(p["rebuilds"], 0, p)
            self.assertFalse(os.path.exists(stray))
            self.assertTrue(os.path.exists(mapped))
            self.assertTrue(os.path.exists(other))
            self.assertEqual(template_ids(w), [tid])
            self.assertTrue(os.path.exists(mem))
            # The warrend dies for good (kill -9, as the suite's own tests do): its
            # template's RAM is left to the harness, which leaves none behind.
            w.kill9()
            self.assertIn(os.path.basename(mem), shm_files(w.state_dir))
        finally:
            if holder:
                holder.kill()
                holder.wait()
            w.cleanup()
            for f in others:
                if os.path.exists(f) and f.endswith("dead2.mem"):
                    os.unlink(f)
        self.assertEqual(shm_files(w.state_dir), [])


class TestPoolTemplateWarmup(unittest.TestCase):
    """pool_template_warmup runs in the template before its save: what it writes is in
    every clone, its output (more than a stream's credit window) is dropped, a failure is
    logged and the template saved anyway; a warrend started with another command refuses
    the recorded template and builds a new one."""

    def test_warmup_runs_before_the_save_and_rebuilds_when_changed(self):
        # 3 MB of output first: more than a stream's credit window, returned as it comes.
        w = Warren(dict(POOL_CONF, pool_template_warmup="head -c 3000000 /dev/zero; "
                                                        "echo one > /root/warm; exit 3"))
        try:
            w.start()
            wait_pool_ready(w, 2)
            self.assertIn("pool: template minimal: its warm-up command exited 3; saved anyway",
                          w.log_all())
            (tid,) = template_ids(w)
            sid = w.create()
            self.assertEqual(w.get(sid).json()["source"], "pool")
            self.assertEqual(w.run(sid, "cat /root/warm")["stdout"], "one\n")
            self.assertEqual(w.delete(sid).status, 200)
            # Down with its template recorded (a clean stop removes it) and no pool VM
            # of the old template left to hand out.
            w.kill9()
            for pid in qemu_pids(w.state_dir):
                os.kill(pid, signal.SIGKILL)
            self.assertEqual(wait_no_qemu(w.state_dir), [])
            seen = len(w.log_all())
            w.conf["pool_template_warmup"] = "echo two > /root/warm"
            w.start()
            assert_rebuilt(self, w, "warmed up with another pool_template_warmup", [tid])
            self.assertRegex(w.log_all()[seen:], r"warm-up ran in \d+ ms")
            sid = w.create()
            self.assertEqual(w.get(sid).json()["source"], "pool")
            self.assertEqual(w.run(sid, "cat /root/warm")["stdout"], "two\n")
        finally:
            w.cleanup()


class TestPoolDamagedTemplateRamJailed(TestPoolDamagedTemplateRam):
    conf = dict(POOL_CONF, jail="required", jail_uid_base="231000", jail_uid_count="10",
                jail_cgroup="warren-it")


if __name__ == "__main__":
    unittest.main()
