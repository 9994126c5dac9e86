"""Snapshots of running sandboxes against real microVMs: a snapshot
holds the whole VM (memory, running processes) and its disk; a sandbox created
from it sees the files and a background loop still counting, with writes of
its own and a boot id and hostname of its own; the snapshot tree (parent
links) is listed, and a snapshot something depends on cannot be deleted; a
corrupt or truncated snapshot file is refused at create with a clear error and
no VM is left running from it; snapshots survive a kill -9 of warrend; fork
(count 2; count 8 with WARREN_BIG=1); pause and resume (kill -9 while paused,
an exec resumes, persistent idle timeout pauses); a changed base image is
refused.

One warrend, pool off (sandboxes are cold-booted: their RAM goes whole into
the snapshot), over an image dir of its own (links to the kernel and
initramfs, a copy of the minimal image) so that the last test can change the
base image under a snapshot. The methods run in name order and build on each
other.
"""
import concurrent.futures
import os
import shutil
import struct
import subprocess
import tempfile
import time
import unittest

from warren import (Warren, WarrenCase, counter_runs, counter_value, flip_ram_byte, image_dir,
                    qemu_pids, wait_no_qemu)
from test_pool import POOL_CONF, wait_pool_ready

# The count is written beside and renamed into place: a plain `echo > file`
# truncates first, and a snapshot (or a cat) that lands between the truncate
# and the write sees an empty file.
COUNTER = ("i=0; while :; do i=$((i+1)); echo $i > /tmp/count.new; "
           "mv /tmp/count.new /tmp/count; sleep 0.2; done")


def own_image_dir():
    """Links to the shared kernel and initramfs, a sparse copy of the minimal image."""
    d = tempfile.mkdtemp(prefix="warren-snap-img-")
    src = image_dir()
    for f in ("vmlinux", "initramfs.cpio"):
        os.symlink(os.path.join(src, f), os.path.join(d, f))
    subprocess.run(["cp", "--sparse=always", os.path.join(src, "minimal.ext4"),
                    os.path.join(d, "minimal.ext4")], check=True)
    return d


def ram_crc_field(state_snap):
    """The RAM file checksum a snapshot header carries (flags bit 4, the u32 at 192),
    or None without the flag."""
    with open(state_snap, "rb") as f:
        h = f.read(4096)
    flags, = struct.unpack("<I", h[44:48])
    return struct.unpack("<I", h[192:196])[0] if flags & 4 else None


def qcow2_backing(path):
    """The backing file name a qcow2 header records ("" for none)."""
    with open(path, "rb") as f:
        h = f.read(4096)
    off, n = struct.unpack(">QI", h[8:20])
    return h[off:off + n].decode() if off else ""


def set_qcow2_backing(path, name):
    """Rewrite the backing file name in a qcow2 header in place (it must fit in the
    first cluster after the header), as a QEMU under the guest's control could."""
    with open(path, "r+b") as f:
        h = f.read(4096)
        off, _ = struct.unpack(">QI", h[8:20])
        f.seek(16)
        f.write(struct.pack(">I", len(name)))
        f.seek(off)
        f.write(name.encode())


def assert_no_new_qemu(tc, w, before, timeout=10):
    """No QEMU of w's is left that was not in before (a refused resume's may take a
    moment to go). One of before may have gone meanwhile: a VM that was ending as
    before was taken, as a paused one's QEMU can just after the pause's answer."""
    deadline = time.time() + timeout
    while set(qemu_pids(w.state_dir)) - set(before) and time.time() < deadline:
        time.sleep(0.1)
    tc.assertEqual(sorted(set(qemu_pids(w.state_dir)) - set(before)), [])


class TestSnapshots(WarrenCase):
    conf = {}  # the default jail (auto: jailed as root); restores run jailed too

    @classmethod
    def setUpClass(cls):
        cls.images = own_image_dir()
        cls.saved_env = os.environ.get("WARREN_IMAGE_DIR")
        os.environ["WARREN_IMAGE_DIR"] = cls.images  # read at every (re)start
        super().setUpClass()
        w = cls.w
        try:
            cls.parent = w.create()
            w.run(cls.parent, "echo parent-file > /root/f")
            r = w.request("POST", f"/v1/sandboxes/{cls.parent}/exec",
                          {"cmd": COUNTER, "background": True})
            if r.status != 201:
                raise AssertionError(f"background exec failed: {r}")
        except BaseException:
            w.cleanup()  # tearDownClass does not run when setUpClass fails
            cls.restore_env()
            raise

    @classmethod
    def restore_env(cls):
        if cls.saved_env is None:
            os.environ.pop("WARREN_IMAGE_DIR", None)
        else:
            os.environ["WARREN_IMAGE_DIR"] = cls.saved_env
        shutil.rmtree(cls.images, ignore_errors=True)

    @classmethod
    def tearDownClass(cls):
        super().tearDownClass()
        cls.restore_env()

    def snapshot(self, sid, **body):
        r = self.w.request("POST", f"/v1/sandboxes/{sid}/snapshot", body)
        self.assertEqual(r.status, 201, f"{r}\n{self.w.log_text()}")
        return r.json()

    def create_from(self, snap_id):
        w = self.w
        r = w.request("POST", "/v1/sandboxes",
                      {"snapshot_id": snap_id, "ttl_seconds": w.TEST_TTL_S,
                       "idle_timeout_seconds": w.TEST_IDLE_S})
        self.assertEqual(r.status, 201, f"{r}\n{w.log_text()}")
        return r.json()

    def count(self, sid):
        return counter_value(self.w, sid)

    def counting(self, sid):
        return counter_runs(self.w, sid)

    def test_1_snapshot_then_create_from_it(self):
        w, a = self.w, self.parent
        s = self.snapshot(a, metadata={"step": "one"})
        type(self).snap = s["snapshot_id"]
        self.assertEqual(s["parent"], a, s)
        self.assertIsNone(s["parent_snapshot"], s)
        self.assertGreater(s["size_bytes"], 0, s)
        self.assertEqual(s["metadata"], {"step": "one"}, s)
        # The parent runs on after it, loop included.
        self.assertTrue(self.counting(a))

        b = self.create_from(s["snapshot_id"])
        type(self).child = b["id"]
        self.assertEqual(b["source"], "snapshot", b)
        self.assertEqual(b["snapshot_id"], s["snapshot_id"], b)
        self.assertNotEqual(b["vm_id"], w.get(a).json()["vm_id"])
        self.assertEqual(w.run(b["id"], "cat /root/f")["stdout"], "parent-file\n")
        if "jail: uids" in w.log_text():
            # The restored VM is jailed as a booted one is: its own uid, its own mounts
            # (before, a jailed restore was refused: ENOTSUP, and a pause lost the
            # sandbox).
            pids = qemu_pids(b["vm_id"])
            self.assertEqual(len(pids), 1, pids)
            with open(f"/proc/{pids[0]}/status") as f:
                uid = [int(l.split()[1]) for l in f if l.startswith("Uid:")][0]
            self.assertGreaterEqual(uid, 200000)
            self.assertNotEqual(os.readlink(f"/proc/{pids[0]}/ns/mnt"),
                                os.readlink("/proc/self/ns/mnt"))
        # The loop the parent started runs in the new VM too: restored, not rebooted.
        self.assertTrue(self.counting(b["id"]))
        r = w.run(b["id"], "ps -o args 2>/dev/null || ps")
        self.assertIn("while", r["stdout"], r)
        # Writes are private to each.
        w.run(b["id"], "echo child > /root/g && sync")
        r = w.run(a, "cat /root/g 2>&1; echo rc=$?")
        self.assertIn("rc=1", r["stdout"], r)
        w.run(a, "echo parent-later > /root/h && sync")
        r = w.run(b["id"], "cat /root/h 2>&1; echo rc=$?")
        self.assertIn("rc=1", r["stdout"], r)
        # A boot id and hostname of its own, and its RNG reseeded.
        ids = "cat /proc/sys/kernel/random/boot_id; hostname; head -c 16 /dev/urandom | od -An -tx1"
        ia, ib = w.run(a, ids)["stdout"], w.run(b["id"], ids)["stdout"]
        la, lb = ia.split("\n"), ib.split("\n")
        self.assertNotEqual(la[0], lb[0], (ia, ib))
        self.assertEqual(lb[1], b["id"])
        self.assertNotEqual(la[2], lb[2], (ia, ib))
        # Its clock was set when it was restored.
        guest = float(w.run(b["id"], "date +%s")["stdout"])
        self.assertLess(abs(guest - time.time()), 5)

    def test_2_tree_listing_and_delete(self):
        w, s, b = self.w, self.snap, self.child
        s2 = self.snapshot(b)
        self.assertEqual(s2["parent"], b, s2)
        self.assertEqual(s2["parent_snapshot"], s, s2)
        r = w.request("GET", "/v1/snapshots")
        self.assertEqual(r.status, 200, r)
        snaps = {x["snapshot_id"]: x for x in r.json()["snapshots"]}
        self.assertEqual(snaps[s]["parent"], self.parent)
        self.assertEqual(snaps[s2["snapshot_id"]]["parent_snapshot"], s)
        r = w.request("GET", f"/v1/snapshots/{s}")
        self.assertEqual(r.status, 200, r)
        self.assertEqual(r.json()["id"], s)
        self.assertError(w.request("GET", "/v1/snapshots/snap-nope"), 404, "snapshot_not_found")
        # Needed by a live sandbox and by the second snapshot: 409, saying which.
        r = w.request("DELETE", f"/v1/snapshots/{s}")
        self.assertError(r, 409, "snapshot_in_use")
        self.assertIn(b, r.json()["error"]["message"])
        self.assertIn(s2["snapshot_id"], r.json()["error"]["message"])
        self.assertEqual(w.delete(b).status, 200)
        r = w.request("DELETE", f"/v1/snapshots/{s}")
        self.assertError(r, 409, "snapshot_in_use")
        self.assertNotIn(b, r.json()["error"]["message"])
        # The leaf goes, then its parent; their files go too.
        r = w.request("DELETE", f"/v1/snapshots/{s2['snapshot_id']}")
        self.assertEqual(r.status, 200, r)
        r = w.request("DELETE", f"/v1/snapshots/{s}")
        self.assertEqual(r.status, 200, r)
        self.assertError(w.request("DELETE", f"/v1/snapshots/{s}"), 404, "snapshot_not_found")
        d = os.path.join(w.state_dir, "snapshots")
        deadline = time.time() + 10
        while os.listdir(d) and time.time() < deadline:
            time.sleep(0.1)
        self.assertEqual(os.listdir(d), [])

    def test_3_corrupt_or_truncated_snapshot_is_refused(self):
        w = self.w
        for damage in ("flip", "truncate"):
            s = self.snapshot(self.parent)["snapshot_id"]
            path = os.path.join(w.state_dir, "snapshots", s, "state.snap")
            if damage == "flip":
                with open(path, "r+b") as f:
                    f.seek(8192)
                    b = f.read(1)
                    f.seek(8192)
                    f.write(bytes([b[0] ^ 0xFF]))
            else:
                os.truncate(path, os.path.getsize(path) // 2)
            r = w.request("POST", "/v1/sandboxes",
                          {"snapshot_id": s, "ttl_seconds": w.TEST_TTL_S})
            self.assertError(r, 409, "snapshot_invalid")
            msg = r.json()["error"]["message"]
            self.assertIn(s, msg)
            self.assertTrue("checksum" in msg or "truncated" in msg, msg)
            # No VM runs from it: the sandbox it was for is dead, its QEMU gone.
            dead = [x for x in w.request("GET", "/v1/sandboxes?state=dead").json()["sandboxes"]
                    if x.get("snapshot_id") == s]
            self.assertEqual(len(dead), 1, dead)
            wait_no_qemu(dead[0]["vm_id"])
            self.assertEqual(w.request("DELETE", f"/v1/snapshots/{s}").status, 200)
        # The parent is unharmed by all this.
        self.assertTrue(self.counting(self.parent))

    def test_4_snapshots_survive_kill9(self):
        w = self.w
        s = self.snapshot(self.parent)["snapshot_id"]
        w.run(self.parent, "echo after-snap > /root/f")
        w.kill9()
        w.start()
        r = w.request("GET", f"/v1/snapshots/{s}")
        self.assertEqual(r.status, 200, r)
        b = self.create_from(s)["id"]
        self.assertEqual(w.run(b, "cat /root/f")["stdout"], "parent-file\n")
        self.assertTrue(self.counting(b))
        # The parent survived too (re-adopted), with its later write.
        self.assertEqual(w.run(self.parent, "cat /root/f")["stdout"], "after-snap\n")
        self.assertEqual(w.request("DELETE", f"/v1/snapshots/{s}").status, 409)
        w.delete(b)
        self.assertEqual(w.request("DELETE", f"/v1/snapshots/{s}").status, 200)

    def test_8_changed_base_image_is_refused(self):
        w = self.w
        s = self.snapshot(self.parent)["snapshot_id"]
        img = os.path.join(self.images, "minimal.ext4")
        st = os.stat(img)
        os.utime(img, ns=(st.st_atime_ns, st.st_mtime_ns + 1_000_000_000))
        r = w.request("POST", "/v1/sandboxes", {"snapshot_id": s, "ttl_seconds": w.TEST_TTL_S})
        self.assertError(r, 409, "snapshot_invalid")
        self.assertIn("base image changed", r.json()["error"]["message"])
        self.assertEqual(w.request("DELETE", f"/v1/snapshots/{s}").status, 200)

    def test_4b_kill9_during_a_snapshot(self):
        """A warrend killed while it saves a sandbox (its VM stopped for the save) leaves
        no stray files, and the sandbox runs again after the restart."""
        w, a = self.w, self.parent
        c = w.conn()
        c.request("POST", f"/v1/sandboxes/{a}/snapshot", body="{}",
                  headers={"Authorization": f"Bearer {w.key}",
                           "Content-Type": "application/json"})
        time.sleep(0.05)  # the save (~0.4 s here) has begun
        w.kill9()
        c.close()
        w.start()
        # Its VM was stopped for the save: continued once the save is over (a stopped
        # guest would never answer: bounded here rather than by the harness's 600 s).
        deadline = time.time() + 60
        while True:
            r = w.request("POST", f"/v1/sandboxes/{a}/exec", {"cmd": "cat /tmp/count"},
                          timeout=60)
            if r.status != 503 or time.time() > deadline:  # 503: reconnecting to its guest
                break
            time.sleep(0.1)
        self.assertEqual(r.status, 200, f"{r}\n{w.log_text()}")
        self.assertTrue(self.counting(a))
        known = {x["id"] for x in w.request("GET", "/v1/snapshots").json()["snapshots"]}
        deadline = time.time() + 10
        while time.time() < deadline:
            dirs = set(os.listdir(os.path.join(w.state_dir, "snapshots")))
            if dirs <= known:
                break
            time.sleep(0.1)
        self.assertLessEqual(dirs, known)

    def test_5_fork(self):
        w, a = self.w, self.parent
        w.run(a, "echo fork-base > /root/k")
        r = w.request("POST", f"/v1/sandboxes/{a}/fork", {"count": 2})
        self.assertEqual(r.status, 201, f"{r}\n{w.log_text()}")
        body = r.json()
        forks = [x["id"] for x in body["sandboxes"]]
        self.assertEqual(len(forks), 2, body)
        snap = w.request("GET", f"/v1/snapshots/{body['snapshot_id']}").json()
        self.assertEqual(snap["type"], "fork", snap)
        self.assertEqual(snap["parent"], a, snap)
        for f in forks:
            self.assertEqual(w.run(f, "cat /root/k")["stdout"], "fork-base\n")
            self.assertTrue(self.counting(f))
        # A write in one fork is seen by neither the parent nor the other fork.
        w.run(forks[0], "echo only-0 > /root/only && sync")
        for other in (a, forks[1]):
            r = w.run(other, "cat /root/only 2>&1; echo rc=$?")
            self.assertIn("rc=1", r["stdout"], r)
        ids = "cat /proc/sys/kernel/random/boot_id; hostname; head -c 16 /dev/urandom | od -An -tx1"
        seen = [w.run(x, ids)["stdout"].split("\n") for x in [a] + forks]
        for col in range(3):
            vals = [x[col] for x in seen]
            self.assertEqual(len(set(vals)), 3, seen)
        self.assertTrue(self.counting(a))
        # The parent's RAM went into a file of its own, and (jailed) both forks map one
        # sealed copy of it: the same memfd, not a whole stream loaded each.
        vm = w.get(a).json()["vm_id"]
        self.assertTrue(os.path.exists(os.path.join(
            w.state_dir, "bases", f"{vm}-{body['snapshot_id']}.ram")), w.log_text())
        maps = set()
        for f in forks:
            pids = qemu_pids(w.get(f).json()["vm_id"])
            self.assertEqual(len(pids), 1, pids)
            with open(f"/proc/{pids[0]}/maps") as m:
                maps |= {ln.split()[4] for ln in m if "/memfd:warren-template-ram" in ln}
        if "jail: uids" in w.log_all():
            self.assertEqual(len(maps), 1, maps)
        self.assertError(w.request("POST", f"/v1/sandboxes/{a}/fork", {"count": 0}), 400,
                         "invalid_argument")
        self.assertError(w.request("POST", f"/v1/sandboxes/{a}/fork", {"count": 17}), 400,
                         "invalid_argument")
        # The fork's snapshot goes by itself with its last fork.
        for f in forks:
            w.delete(f)
        deadline = time.time() + 15
        while time.time() < deadline:
            if w.request("GET", f"/v1/snapshots/{body['snapshot_id']}").status == 404:
                break
            time.sleep(0.2)
        self.assertEqual(w.request("GET", f"/v1/snapshots/{body['snapshot_id']}").status, 404)

    def exec_resuming(self, sid, cmd):
        """Exec on a paused sandbox: it waits while the sandbox resumes, then runs
        (before, it was answered 503 sandbox_not_ready and had to be retried)."""
        w = self.w
        self.assertEqual(w.get(sid).json()["state"], "paused")
        r = w.exec(sid, cmd)
        self.assertEqual(r.status, 200, f"{r}\n{w.log_text()}")
        self.assertEqual(w.get(sid).json()["state"], "running")
        return r.json()

    def test_6_pause_resume_keeps_processes_and_memory(self):
        w, a = self.w, self.parent
        # A process holding a value in memory only, reading its stdin.
        r = w.request("POST", f"/v1/sandboxes/{a}/exec",
                      {"cmd": 'V=mem-$RANDOM-$RANDOM; echo $V > /tmp/v; '
                              'while read l; do echo "$V:$l" >> /tmp/out; done',
                       "background": True})
        self.assertEqual(r.status, 201, r)
        pid = r.json()["pid"]
        deadline = time.time() + 10
        while not w.run(a, "cat /tmp/v 2>/dev/null")["stdout"] and time.time() < deadline:
            time.sleep(0.1)
        v = w.run(a, "cat /tmp/v")["stdout"].strip()
        w.run(a, "rm /tmp/v")
        before = w.get(a).json()
        r = w.request("POST", f"/v1/sandboxes/{a}/pause", {})
        self.assertEqual(r.status, 200, f"{r}\n{w.log_text()}")
        self.assertEqual(r.json()["state"], "paused", r)
        self.assertEqual(w.get(a).json()["state"], "paused")
        wait_no_qemu(before["vm_id"])  # its QEMU is gone
        # Paused survives a kill -9 of warrend.
        w.kill9()
        w.start()
        self.assertEqual(w.get(a).json()["state"], "paused")
        lst = w.request("GET", "/v1/sandboxes?state=paused").json()["sandboxes"]
        self.assertIn(a, [x["id"] for x in lst])
        # An exec brings it back, with its processes and their memory.
        self.assertEqual(self.exec_resuming(a, "cat /tmp/count")["exit_code"], 0)
        rec = w.get(a).json()
        self.assertEqual(rec["state"], "running", rec)
        self.assertNotEqual(rec["vm_id"], before["vm_id"])
        r = w.request("POST", f"/v1/sandboxes/{a}/processes/{pid}/stdin", {"data": "hello\n"})
        self.assertEqual(r.status, 200, r)
        deadline = time.time() + 10
        while time.time() < deadline:
            out = w.run(a, "cat /tmp/out 2>/dev/null")["stdout"]
            if out:
                break
            time.sleep(0.1)
        self.assertEqual(out, f"{v}:hello\n")
        self.assertTrue(self.counting(a))
        self.assertEqual(w.run(a, "cat /root/k")["stdout"], "fork-base\n")
        # Explicit resume; paused time did not count toward the TTL.
        t_pause = time.time()
        self.assertEqual(w.request("POST", f"/v1/sandboxes/{a}/pause", {}).status, 200)
        time.sleep(2)
        r = w.request("POST", f"/v1/sandboxes/{a}/resume", {})
        self.assertEqual(r.status, 200, f"{r}\n{w.log_text()}")
        self.assertEqual(r.json()["state"], "running", r)
        self.assertEqual(w.request("POST", f"/v1/sandboxes/{a}/resume", {}).status, 200)
        self.assertGreater(r.json()["expires_at"], before["expires_at"])
        self.assertTrue(self.counting(a))
        self.assertLess(time.time() - t_pause, 60)
        # Paused again: a download, a process listing, a file stat, two execs and two
        # uploads (one of 3 MiB, one empty) sent at once all wait for the one resume and
        # are answered (the first starts it, the others find the sandbox starting;
        # before, those got 503 sandbox_not_ready). An upload's body waits unread.
        self.assertEqual(w.request("POST", f"/v1/sandboxes/{a}/pause", {}).status, 200)
        blob = os.urandom(3 << 20)
        reqs = [("GET", f"/v1/sandboxes/{a}/files?path=/root/k", None),
                ("GET", f"/v1/sandboxes/{a}/processes", None),
                ("GET", f"/v1/sandboxes/{a}/files/stat?path=/root/k", None),
                ("POST", f"/v1/sandboxes/{a}/exec", {"cmd": "echo one"}),
                ("POST", f"/v1/sandboxes/{a}/exec", {"cmd": "echo two"}),
                ("PUT", f"/v1/sandboxes/{a}/files?path=/root/blob", blob),
                ("PUT", f"/v1/sandboxes/{a}/files?path=/root/empty", b"")]
        with concurrent.futures.ThreadPoolExecutor(len(reqs)) as ex:
            rs = list(ex.map(lambda q: w.request(*q), reqs))
        for q, r in zip(reqs, rs):
            self.assertEqual(r.status, 200, f"{q[:2]}: {r}\n{w.log_text()}")
        self.assertEqual(rs[0].body, b"fork-base\n")
        self.assertIn(pid, [x["pid"] for x in rs[1].json()["processes"]])
        self.assertEqual(rs[2].json()["size"], len(b"fork-base\n"))
        self.assertEqual(rs[3].json()["stdout"], "one\n")
        self.assertEqual(rs[4].json()["stdout"], "two\n")
        self.assertEqual(w.request("GET", f"/v1/sandboxes/{a}/files?path=/root/blob").body,
                         blob)
        self.assertEqual(w.request("GET", f"/v1/sandboxes/{a}/files/stat?path=/root/empty")
                         .json()["size"], 0)
        self.assertEqual(w.get(a).json()["state"], "running")

    def test_6b_pause_cycles_do_not_pile_up(self):
        """A resume takes its pause snapshot's disk as its own overlay, so the pause
        snapshot goes: after each pause/resume cycle no pause snapshot is left, the
        disk is one overlay over the base image again, and what was written in every
        cycle is there. Before, every cycle added a layer to
        the disk's chain and kept a pause snapshot, its RAM file included, for the
        sandbox's life.

        The first pause of a booted sandbox writes its RAM into a file of its own in
        state_dir/bases (vmm_save_ram): the pause snapshot holds only the device state,
        the resumed VM maps that file, and every later pause is a delta over it (the
        pages written since). The file stays while the sandbox runs, and goes with it."""
        w = self.w
        bases = os.path.join(w.state_dir, "bases")
        b = w.create()
        vm = w.get(b).json()["vm_id"]
        base = qcow2_backing(os.path.join(w.run_dir(b), "disk.qcow2"))
        state_sizes, ram_name = [], []

        def mine():
            return [f for f in os.listdir(bases) if f.startswith(vm + "-")]

        crcs = []

        def cycle():
            r = w.request("POST", f"/v1/sandboxes/{b}/pause", {})
            self.assertEqual(r.status, 200, f"{r}\n{w.log_text()}")
            snap = r.json()["snapshot_id"]
            state = os.path.join(w.state_dir, "snapshots", snap, "state.snap")
            state_sizes.append(os.path.getsize(state))
            # Every pause snapshot names the RAM file's checksum: the first one, which
            # wrote the file, and each delta after it (the resumed VM learnt it).
            crcs.append(ram_crc_field(state))
            if not ram_name:
                ram_name.append(f"{vm}-{snap}.ram")
            self.assertEqual(mine(), ram_name)
            r = w.request("POST", f"/v1/sandboxes/{b}/resume", {})
            self.assertEqual(r.status, 200, f"{r}\n{w.log_text()}")
            # Answered once the sandbox runs, after the pause snapshot's removal.
            self.assertEqual(self.pause_snaps(b), [], w.log_text())
            self.assertEqual(qcow2_backing(os.path.join(w.run_dir(b), "disk.qcow2")), base)

        for i in range(3):
            w.run(b, f"echo cycle-{i} > /root/c{i}")
            cycle()
        self.assertEqual(w.run(b, "cat /root/c0 /root/c1 /root/c2")["stdout"],
                         "cycle-0\ncycle-1\ncycle-2\n")
        # Paused again right after a resume: the same.
        w.run(b, "echo late > /root/c3")
        cycle()
        cycle()
        self.assertEqual(w.run(b, "cat /root/c3")["stdout"], "late\n")
        # One RAM file through every cycle, the first pause's; no pause snapshot holds
        # the guest's RAM (a whole save of this guest is ~70 MiB, a delta a few MiB).
        self.assertEqual(mine(), ram_name)
        ram = os.path.join(bases, ram_name[0])
        self.assertGreater(os.stat(ram).st_blocks * 512, 16 << 20)
        self.assertLess(max(state_sizes), 16 << 20, state_sizes)
        self.assertLess(state_sizes[0], 1 << 20, state_sizes)  # device state only
        self.assertIsNotNone(crcs[0])
        self.assertEqual(crcs, [crcs[0]] * len(crcs))
        w.delete(b)
        deadline = time.time() + 10
        while os.path.exists(ram) and time.time() < deadline:
            time.sleep(0.1)
        self.assertFalse(os.path.exists(ram), w.log_text())

    def test_6d_failed_resume_stays_paused(self):
        """A resume whose restore fails (here its pause file is damaged) leaves the
        sandbox paused, its pause snapshot and disk intact; requests waiting on that
        resume get its error. Once the file is mended, a resume brings it back with its
        processes and files. Before, the sandbox ended dead and its pause snapshot went
        with it."""
        w = self.w
        b = w.create()
        w.run(b, "echo kept > /root/k")
        r = w.request("POST", f"/v1/sandboxes/{b}/exec", {"cmd": COUNTER, "background": True})
        self.assertEqual(r.status, 201, r)
        self.assertTrue(self.counting(b))
        vm = w.get(b).json()["vm_id"]
        r = w.request("POST", f"/v1/sandboxes/{b}/pause", {})
        self.assertEqual(r.status, 200, f"{r}\n{w.log_text()}")
        snap = r.json()["snapshot_id"]
        path = os.path.join(w.state_dir, "snapshots", snap, "state.snap")
        with open(path, "r+b") as f:
            f.seek(os.fstat(f.fileno()).st_size // 2)
            orig = f.read(64)
            f.seek(-64, os.SEEK_CUR)
            f.write(bytes(x ^ 0xFF for x in orig))
        for req in (("POST", f"/v1/sandboxes/{b}/resume", {}),
                    ("POST", f"/v1/sandboxes/{b}/exec", {"cmd": "true"})):
            r = w.request(*req)
            self.assertEqual(r.status, 409, f"{r}\n{w.log_text()}")
            self.assertEqual(r.json()["error"]["code"], "snapshot_invalid", r.json())
            j = w.get(b).json()
            self.assertEqual((j["state"], j.get("snapshot_id")), ("paused", snap), j)
            self.assertTrue(os.path.exists(os.path.join(os.path.dirname(path), "disk.qcow2")))
        with open(path, "r+b") as f:
            f.seek(os.fstat(f.fileno()).st_size // 2)
            f.write(orig)
        # A byte changed in its RAM file (its size kept): refused by the file's checksum
        # in the header, the sandbox still paused, and no QEMU left from it.
        ram = os.path.join(w.state_dir, "bases", f"{vm}-{snap}.ram")
        undo = flip_ram_byte(ram)
        before = qemu_pids(w.state_dir)
        r = w.request("POST", f"/v1/sandboxes/{b}/resume", {})
        self.assertEqual(r.status, 409, f"{r}\n{w.log_text()}")
        self.assertEqual(r.json()["error"]["code"], "snapshot_invalid", r.json())
        self.assertIn("checksum mismatch", r.json()["error"]["message"])
        self.assertEqual(w.get(b).json()["state"], "paused")
        assert_no_new_qemu(self, w, before)
        undo()
        r = w.request("POST", f"/v1/sandboxes/{b}/resume", {})
        self.assertEqual(r.status, 200, f"{r}\n{w.log_text()}")
        self.assertEqual(w.run(b, "cat /root/k")["stdout"], "kept\n")
        self.assertTrue(self.counting(b))
        self.assertEqual(w.delete(b).status, 200)

    def pause_snaps(self, sid):
        snaps = self.w.request("GET", "/v1/snapshots").json()["snapshots"]
        return [x["id"] for x in snaps if x["type"] == "pause" and x["parent"] == sid]

    def test_6c_guest_written_backing_name_is_not_followed(self):
        """The overlay's header is QEMU's to write, and QEMU is the guest's side: a
        backing name changed there (here by the test, as a taken-over QEMU could)
        must not reach a snapshot's chain, nor a jail's view. Before, a snapshot
        copied the name from that header and a jailed restore showed the named host
        file (here warrend's API key) inside the new VM's jail."""
        w = self.w
        b = w.create()
        w.run(b, "echo mine > /root/m")
        secret = os.path.join(w.state_dir, "api_key")
        set_qcow2_backing(os.path.join(w.run_dir(b), "disk.qcow2"), secret)
        s = self.snapshot(b)["snapshot_id"]
        c = self.create_from(s)["id"]
        self.assertEqual(w.run(c, "cat /root/m")["stdout"], "mine\n")
        self.assertNotEqual(qcow2_backing(os.path.join(w.state_dir, "snapshots", s,
                                                       "disk.qcow2")), secret)
        if "jail: uids" in w.log_text():
            pids = qemu_pids(w.vm_id(c))
            self.assertEqual(len(pids), 1, pids)
            self.assertFalse(os.path.exists(f"/proc/{pids[0]}/root{secret}"))
        for sid in (b, c):
            w.delete(sid)
        self.assertEqual(w.request("DELETE", f"/v1/snapshots/{s}").status, 200)

    def test_7_persistent_idle_pauses(self):
        w = self.w
        s = self.snapshot(self.parent)["snapshot_id"]
        r = w.request("POST", "/v1/sandboxes",
                      {"snapshot_id": s, "ttl_seconds": w.TEST_TTL_S,
                       "idle_timeout_seconds": 2, "persistent": True})
        self.assertEqual(r.status, 201, r)
        b = r.json()["id"]
        self.assertTrue(r.json()["persistent"])
        w.wait_state(b, ["paused"], timeout=60)
        self.assertTrue(self.exec_resuming(b, "cat /tmp/count")["stdout"])
        w.delete(b)
        self.assertEqual(w.request("DELETE", f"/v1/snapshots/{s}").status, 200)

    @unittest.skipUnless(os.environ.get("WARREN_BIG") == "1", "WARREN_BIG=1: eight VMs at once")
    def test_9_fork_8(self):
        w, a = self.w, self.parent
        w.run(a, "echo eight > /root/e")
        r = w.request("POST", f"/v1/sandboxes/{a}/fork", {"count": 8})
        self.assertEqual(r.status, 201, f"{r}\n{w.log_text()}")
        forks = [x["id"] for x in r.json()["sandboxes"]]
        self.assertEqual(len(set(forks)), 8)
        boot_ids = set()
        for i, f in enumerate(forks):
            self.assertEqual(w.run(f, "cat /root/e")["stdout"], "eight\n")
            w.run(f, f"echo {i} > /root/mine")
            boot_ids.add(w.run(f, "cat /proc/sys/kernel/random/boot_id")["stdout"])
        self.assertEqual(len(boot_ids), 8)
        for i, f in enumerate(forks):
            self.assertEqual(w.run(f, "cat /root/mine")["stdout"], f"{i}\n")
            w.delete(f)


class TestSnapshotOfPoolSandbox(unittest.TestCase):
    """A sandbox from the warm pool: its disk is layered on the pool template's frozen
    overlay, which the pool removes on a clean shutdown. Its snapshot keeps that file
    (a hard link) and is still restorable after warrend stopped cleanly."""

    @classmethod
    def setUpClass(cls):
        cls.w = Warren(dict(POOL_CONF, pool_size="1")).start()

    @classmethod
    def tearDownClass(cls):
        cls.w.cleanup()

    def test_snapshot_survives_the_templates_removal(self):
        w = self.w
        wait_pool_ready(w, 1)
        a = w.create()
        self.assertEqual(w.get(a).json()["source"], "pool")
        w.run(a, "echo pooled > /root/p")
        r = w.request("POST", f"/v1/sandboxes/{a}/snapshot", {})
        self.assertEqual(r.status, 201, f"{r}\n{w.log_text()}")
        s = r.json()["snapshot_id"]
        w.delete(a)
        w.stop()  # clean: the pool removes its template's files
        tdir = os.path.join(w.state_dir, "templates")
        w.start()
        r = w.request("POST", "/v1/sandboxes", {"snapshot_id": s, "ttl_seconds": w.TEST_TTL_S})
        self.assertEqual(r.status, 201, f"{r}\n{w.log_text()}")
        b = r.json()["id"]
        self.assertEqual(w.run(b, "cat /root/p")["stdout"], "pooled\n")
        # Its disk chain goes through the snapshot's own link, not the template dir.
        with open(os.path.join(w.state_dir, "snapshots", s, "disk.qcow2"), "rb") as f:
            head = f.read(4096)
        self.assertIn(os.path.join(w.state_dir, "snapshots", s, "backing.qcow2").encode(), head)
        self.assertNotIn(tdir.encode(), head)

    def test_pause_cycles_of_a_pool_sandbox(self):
        """A pool sandbox's pause disk names the template's overlay linked inside its
        first pause snapshot: that one snapshot stays while the sandbox lives, and
        later cycles add neither layers nor snapshots."""
        w = self.w
        wait_pool_ready(w, 1)
        a = w.create()
        self.assertEqual(w.get(a).json()["source"], "pool")
        first = None  # the first cycle's snapshot
        for i in range(3):
            w.run(a, f"echo pooled-{i} > /root/p{i}")
            r = w.request("POST", f"/v1/sandboxes/{a}/pause", {})
            self.assertEqual(r.status, 200, f"{r}\n{w.log_text()}")
            r = w.request("POST", f"/v1/sandboxes/{a}/resume", {})
            self.assertEqual(r.status, 200, f"{r}\n{w.log_text()}")
            snaps = w.request("GET", "/v1/snapshots").json()["snapshots"]
            mine = [x["id"] for x in snaps if x["parent"] == a]
            self.assertEqual(len(mine), 1, snaps)
            first = first or mine[0]
            self.assertEqual(mine, [first])
            backing = os.path.join(w.state_dir, "snapshots", first, "backing.qcow2")
            self.assertEqual(qcow2_backing(os.path.join(w.run_dir(a), "disk.qcow2")), backing)
        self.assertEqual(w.run(a, "cat /root/p0 /root/p1 /root/p2")["stdout"],
                         "pooled-0\npooled-1\npooled-2\n")
        w.delete(a)



class TestBootedRamFileUnjailed(WarrenCase):
    """A booted sandbox's own RAM file (vmm_save_ram), with QEMU unjailed. A fork
    writes the parent's RAM into a file in state_dir/bases and every fork maps it
    copy-on-write instead of loading the whole RAM: the forks see the parent's files
    and its counter still counting, each writes its own, and the file goes once the
    forks are gone (jailed, the forks map one sealed copy of it:
    TestSnapshots.test_5_fork). A pause's file cut short or changed is refused at
    the resume; a QEMU adopted after a kill -9 pauses with the file's checksum."""
    conf = {"jail": "off"}

    def test_fork_maps_a_ram_file(self):
        w = self.w
        bases = os.path.join(w.state_dir, "bases")
        a = w.create()
        vm = w.get(a).json()["vm_id"]

        def mine():  # the class's other tests leave files of their own sandboxes
            return [f for f in os.listdir(bases) if f.startswith(vm + "-")]
        w.run(a, "echo parent > /root/f")
        r = w.request("POST", f"/v1/sandboxes/{a}/exec", {"cmd": COUNTER, "background": True})
        self.assertEqual(r.status, 201, r)
        deadline = time.time() + 10
        while not counter_runs(w, a) and time.time() < deadline:
            time.sleep(0.2)
        r = w.request("POST", f"/v1/sandboxes/{a}/fork", {"count": 2})
        self.assertEqual(r.status, 201, f"{r}\n{w.log_text()}")
        snap = r.json()["snapshot_id"]
        forks = [f["id"] for f in r.json()["sandboxes"]]
        self.assertEqual(mine(), [f"{vm}-{snap}.ram"])
        # The fork snapshot holds the device state only.
        self.assertLess(os.path.getsize(os.path.join(w.state_dir, "snapshots", snap,
                                                     "state.snap")), 1 << 20)
        # Its record's size counts the RAM file it made.
        size = w.request("GET", f"/v1/snapshots/{snap}").json()["size_bytes"]
        self.assertGreaterEqual(size, os.stat(os.path.join(bases, mine()[0])).st_blocks * 512)
        for i, f in enumerate(forks):
            self.assertEqual(w.run(f, "cat /root/f")["stdout"], "parent\n")
            self.assertTrue(counter_runs(w, f), f)
            self.assertEqual(w.run(f, f"echo fork{i} > /root/f")["exit_code"], 0)
        for i, f in enumerate(forks):
            self.assertEqual(w.run(f, "cat /root/f")["stdout"], f"fork{i}\n")
        self.assertEqual(w.run(a, "cat /root/f")["stdout"], "parent\n")
        self.assertTrue(counter_runs(w, a))
        for f in forks:
            self.assertEqual(w.delete(f).status, 200)
        # The reaper removes the fork snapshot nothing depends on, and its file with it.
        deadline = time.time() + 120
        while mine() and time.time() < deadline:
            time.sleep(0.5)
        self.assertEqual(mine(), [], w.log_text())
        self.assertEqual(w.delete(a).status, 200)

    def test_adopted_vm_pauses_with_the_checksum(self):
        """A resumed booted sandbox's QEMU adopted by a new warrend (kill -9) does not
        know its RAM file's checksum: its next pause reads it through the mapping
        (/proc/PID/map_files) and the delta names the same one as the first pause,
        which the resume then checks."""
        w = self.w
        b = w.create()
        w.run(b, "echo before > /root/a")
        r = w.request("POST", f"/v1/sandboxes/{b}/pause", {})
        self.assertEqual(r.status, 200, f"{r}\n{w.log_text()}")
        first = ram_crc_field(os.path.join(w.state_dir, "snapshots", r.json()["snapshot_id"],
                                           "state.snap"))
        self.assertIsNotNone(first)
        self.assertEqual(w.request("POST", f"/v1/sandboxes/{b}/resume", {}).status, 200)
        w.kill9()
        w.start()
        w.wait_state(b, ["running"])
        self.assertEqual(w.wait_guest(b).status, 200, w.log_text())
        w.run(b, "echo after > /root/b")
        r = w.request("POST", f"/v1/sandboxes/{b}/pause", {})
        self.assertEqual(r.status, 200, f"{r}\n{w.log_text()}")
        second = ram_crc_field(os.path.join(w.state_dir, "snapshots", r.json()["snapshot_id"],
                                            "state.snap"))
        self.assertEqual(second, first)
        r = w.request("POST", f"/v1/sandboxes/{b}/resume", {})
        self.assertEqual(r.status, 200, f"{r}\n{w.log_text()}")
        self.assertEqual(w.run(b, "cat /root/a /root/b")["stdout"], "before\nafter\n")
        self.assertEqual(w.delete(b).status, 200)

    def test_short_ram_file_is_refused(self):
        """A paused booted sandbox whose RAM file was cut short is refused at its
        resume with a clear error, before any QEMU maps it (one would die at the first
        page past the end)."""
        w = self.w
        bases = os.path.join(w.state_dir, "bases")
        b = w.create()
        vm = w.get(b).json()["vm_id"]
        r = w.request("POST", f"/v1/sandboxes/{b}/pause", {})
        self.assertEqual(r.status, 200, f"{r}\n{w.log_text()}")
        ram = [f for f in os.listdir(bases) if f.startswith(vm + "-")]
        self.assertEqual(len(ram), 1, os.listdir(bases))
        # One byte changed, its size kept: the checksum in the pause snapshot's header
        # refuses it (unjailed, QEMU maps the file itself: that is what is read).
        undo = flip_ram_byte(os.path.join(bases, ram[0]))
        before = qemu_pids(w.state_dir)
        r = w.request("POST", f"/v1/sandboxes/{b}/resume", {})
        self.assertEqual(r.status, 409, f"{r}\n{w.log_text()}")
        self.assertEqual(r.json()["error"]["code"], "snapshot_invalid", r.json())
        self.assertIn("checksum mismatch", r.json()["error"]["message"])
        assert_no_new_qemu(self, w, before)
        undo()
        os.truncate(os.path.join(bases, ram[0]), 64 << 20)
        r = w.request("POST", f"/v1/sandboxes/{b}/resume", {})
        self.assertEqual(r.status, 409, f"{r}\n{w.log_text()}")
        self.assertEqual(r.json()["error"]["code"], "snapshot_invalid", r.json())
        self.assertIn("is not 256 MiB long", r.json()["error"]["message"])
        assert_no_new_qemu(self, w, before)


if __name__ == "__main__":
    unittest.main()
