"""QEMU in a jail: every VM's QEMU under its own uid, in its own
mount namespace and cgroup; nothing leaks across create/delete cycles or a
kill -9 of warrend; TCG is refused on a non-loopback address.

Needs root and cgroups with the memory, cpu and pids controllers (v1 or v2);
the daemon runs with jail = required, so a jail that cannot be set up fails
these tests instead of passing them unjailed. WARREN_JAIL_CYCLES sets the
number of create/delete cycles of the leak test (default 20).
"""
import os
import signal
import subprocess
import time
import unittest

from warren import Warren, WarrenCase, fnv1a, free_port, image_dir, qemu_pids, warrend_path, wait_no_qemu

CG_SYSFS = "/sys/fs/cgroup"
# Under ASan (WARREN_SANITIZED) five cycles run the same C paths (uid and cgroup
# hand-out and return, mounts) for a quarter of the TCG boots.
CYCLES = int(os.environ.get("WARREN_JAIL_CYCLES",
                            "5" if os.environ.get("WARREN_SANITIZED") == "1" else "20"))
# One uid range per test process: never shared with another warrend running here.
UID_BASE = 400000 + (os.getpid() % 500) * 100


def jail_possible():
    if os.geteuid() != 0:
        return False
    v1 = all(os.path.exists(f"{CG_SYSFS}/{c}/cgroup.procs") for c in ("memory", "cpu", "pids"))
    v2 = False
    for d in (CG_SYSFS, f"{CG_SYSFS}/unified"):
        try:
            words = open(f"{d}/cgroup.controllers").read().split()
            v2 = v2 or all(c in words for c in ("memory", "cpu", "pids"))
        except OSError:
            pass
    return v1 or v2


def group_parents(w):
    """The VM groups' parent dirs of this warrend (one per v1 controller, or one v2 dir)."""
    name = f"{w.conf['jail_cgroup']}/{fnv1a(w.state_dir)}"
    if all(os.path.exists(f"{CG_SYSFS}/{c}/cgroup.procs") for c in ("memory", "cpu", "pids")):
        return [f"{CG_SYSFS}/{c}/{name}" for c in ("memory", "cpu", "pids")]
    for root in (CG_SYSFS, f"{CG_SYSFS}/unified"):
        if os.path.isdir(f"{root}/{name}"):
            return [f"{root}/{name}"]
    return []


def vm_groups(w):
    out = []
    for p in group_parents(w):
        try:
            out += [f"{p}/{d}" for d in os.listdir(p) if d.startswith("u")]
        except FileNotFoundError:
            pass
    return sorted(out)


def cleanup(w):
    """Stop w and its VMs, then remove its (empty) parent groups."""
    parents = group_parents(w)
    w.cleanup()
    for p in parents:
        for d in (p, os.path.dirname(p)):
            try:
                os.rmdir(d)
            except OSError:
                pass  # not empty: another warrend's, or a leak the test reports


def proc_uid(pid):
    with open(f"/proc/{pid}/status") as f:
        for line in f:
            if line.startswith("Uid:"):
                return int(line.split()[1])
    return -1


def procs_in_uid_range(lo, n):
    out = []
    for pid in os.listdir("/proc"):
        if pid.isdigit():
            try:
                if lo <= proc_uid(pid) < lo + n:
                    out.append(int(pid))
            except OSError:
                pass
    return out


def jail_conf(**extra):
    c = {"jail": "required", "jail_uid_base": str(UID_BASE), "jail_uid_count": "50",
         "jail_cgroup": "warren-it"}
    c.update({k: str(v) for k, v in extra.items()})
    return c


def qemu_of(w, sid):
    pids = qemu_pids(w.run_dir(sid) + "/")
    assert len(pids) == 1, pids
    return pids[0]


def run_reconnecting(test, w, sid, cmd, timeout=30):
    """Exec right after a restart: 503 while the guest channel reconnects, then 200."""
    deadline = time.time() + timeout
    while True:
        r = w.exec(sid, cmd)
        if r.status == 200 or time.time() > deadline:
            break
        test.assertEqual(r.status, 503, r)
        time.sleep(0.1)
    test.assertEqual(r.status, 200, r)
    return r.json()


def our_mounts(state_dir):
    """Mounts in the host's namespace under state_dir (the jails mount only in their own)."""
    with open("/proc/self/mountinfo") as f:
        return [line for line in f if state_dir in line]


@unittest.skipUnless(jail_possible(), "needs root and cgroups (memory, cpu, pids)")
class JailTest(WarrenCase):
    conf = jail_conf()

    @classmethod
    def tearDownClass(cls):
        cleanup(cls.w)

    def test_restored_from_a_snapshot_is_jailed(self):
        """A sandbox created from a snapshot runs jailed like a boot (its RAM comes
        from the snapshot stream through an fd; its disk chain is shown read-only):
        its own uid, and the snapshot's disk and nothing else of the state dir."""
        w = self.w
        a = w.create(ttl_seconds=1200)
        b = snap = None
        try:
            self.assertEqual(w.run(a, "echo kept > /root/mark")["exit_code"], 0)
            r = w.request("POST", f"/v1/sandboxes/{a}/snapshot", {})
            self.assertEqual(r.status, 201, r)
            snap = r.json()["snapshot_id"]
            b = w.create(snapshot_id=snap, ttl_seconds=1200)
            pb = qemu_of(w, b)
            ub = proc_uid(pb)
            self.assertTrue(UID_BASE <= ub < UID_BASE + 50, ub)
            self.assertNotEqual(ub, proc_uid(qemu_of(w, a)))
            self.assertEqual(w.run(b, "cat /root/mark")["stdout"], "kept\n")
            root = f"/proc/{pb}/root"
            for hidden in (f"{w.state_dir}/api_key", f"{w.state_dir}/index", w.run_dir(a)):
                self.assertFalse(os.path.exists(root + hidden), hidden)
        finally:
            w.delete(a)
            if b:
                w.delete(b)
            if snap:
                w.request("DELETE", f"/v1/snapshots/{snap}")

    def test_distinct_uids_and_private_view(self):
        w = self.w
        a = w.create(ttl_seconds=1200)
        b = w.create(ttl_seconds=1200)
        try:
            pa, pb = qemu_of(w, a), qemu_of(w, b)
            ua, ub = proc_uid(pa), proc_uid(pb)
            # ps shows each QEMU under its own non-root uid from the range.
            ps = subprocess.run(["ps", "-o", "uid=", "-p", f"{pa},{pb}"], capture_output=True,
                                text=True, check=True).stdout.split()
            self.assertEqual(sorted(int(u) for u in ps), sorted([ua, ub]))
            self.assertNotEqual(ua, ub)
            for u in (ua, ub):
                self.assertTrue(UID_BASE <= u < UID_BASE + 50, u)
            # Its run dir is its own (0700) and its sockets were made by QEMU as that uid.
            rd = w.run_dir(a)
            st = os.stat(rd)
            self.assertEqual((st.st_uid, st.st_mode & 0o777), (ua, 0o700))
            self.assertEqual(os.stat(f"{rd}/qmp.sock").st_uid, ua)
            self.assertEqual(os.stat(f"{rd}/chan.sock").st_uid, ua)
            # From inside its mount namespace: its own run dir, not the key, the
            # index, the other VM's run dir or the host's /etc and /root.
            root = f"/proc/{pa}/root"
            self.assertTrue(os.path.exists(f"{root}{rd}/qmp.sock"))
            for hidden in (f"{w.state_dir}/api_key", f"{w.state_dir}/index",
                           w.run_dir(b), f"{w.state_dir}/warrend.log",
                           "/etc/passwd", "/root/.bashrc", "/proc/1", "/home"):
                self.assertFalse(os.path.exists(root + hidden), hidden)
            ls = subprocess.run(["nsenter", "-t", str(pa), "-m", "ls", "-A",
                                 f"{w.state_dir}/vms"], capture_output=True, text=True)
            # nsenter runs ls from the jail's /usr: it lists exactly one run dir.
            self.assertEqual(ls.stdout.split(), [w.vm_id(a)], ls)
            # The templates are there, read-only.
            self.assertTrue(os.path.exists(f"{root}{os.path.realpath(image_dir())}/vmlinux"))
            # Each QEMU in its own cgroup, named after its uid and VM.
            with open(f"/proc/{pa}/cgroup") as f:
                cg = f.read()
            self.assertIn(f"/u{ua}.{w.vm_id(a)}", cg)
            self.assertEqual(len(vm_groups(w)), 2 * len(group_parents(w)))
            # And the sandbox works as before.
            self.assertEqual(w.run(a, "echo hi")["stdout"], "hi\n")
        finally:
            w.delete(a)
            w.delete(b)

    def test_qemu_without_a_nic_cannot_reach_host_loopback(self):
        """A VM without networking: its QEMU is in a network namespace of its own,
        not the host's, so a process of QEMU's uid in that namespace cannot reach
        warrend's API (or anything else) on the host's loopback."""
        w = self.w
        a = w.create(ttl_seconds=1200)
        try:
            pa = qemu_of(w, a)
            self.assertNotEqual(os.stat(f"/proc/{pa}/ns/net").st_ino,
                                os.stat(f"/proc/{w.proc.pid}/ns/net").st_ino)
            ua = proc_uid(pa)
            # What a QEMU taken over by its guest could do: connect to warrend's port.
            probe = ("import socket,sys\n"
                     "try:\n"
                     f"  socket.create_connection(('127.0.0.1', {w.port}), timeout=3)\n"
                     "  print('connected')\n"
                     "except OSError as e:\n"
                     "  print('refused', e)\n")
            r = subprocess.run(["nsenter", "-t", str(pa), "-n", "-S", str(ua), "-G", str(ua),
                                "python3", "-c", probe], capture_output=True, text=True,
                               timeout=30)
            self.assertTrue(r.stdout.startswith("refused"), r)
            # The same probe from the host's namespace does connect: the probe works.
            r = subprocess.run(["setpriv", f"--reuid={ua}", f"--regid={ua}", "--clear-groups",
                                "python3", "-c", probe], capture_output=True, text=True,
                               timeout=30)
            self.assertEqual(r.stdout.strip(), "connected", r)
            self.assertEqual(w.run(a, "echo hi")["stdout"], "hi\n")
        finally:
            w.delete(a)

    def test_memory_hog_killed_by_its_cgroup(self):
        # A second warrend whose VMs get no memory margin: guest RAM is the limit,
        # so a guest touching most of its RAM pushes QEMU over it.
        w = Warren(jail_conf(jail_memory_overhead_mb=0, jail_uid_base=UID_BASE + 50)).start()
        try:
            good = self.w.create(ttl_seconds=1200)
            hog = w.create(ttl_seconds=1200, memory_mb=512)
            r = w.exec(hog, "mkdir -p /mnt/t && mount -t tmpfs -o size=480m none /mnt/t && "
                            "dd if=/dev/zero of=/mnt/t/f bs=1M count=380 && sleep 60")
            self.assertNotEqual(r.status, 200, r)
            s = w.wait_state(hog, ["dead"], timeout=60)
            self.assertIn("out of memory", s["end_reason"])
            self.assertIn("cgroup limit of 512 MiB", s["end_reason"])
            # Its logs are kept, in a run dir no longer owned by the freed uid.
            rd = w.run_dir(hog)
            self.assertEqual(os.stat(rd).st_uid, 0)
            self.assertTrue(os.path.exists(f"{rd}/console.log"))
            # warrend is untouched and still serves; the other sandbox answers.
            self.assertIsNone(w.proc.poll())
            self.assertEqual(w.get(hog).status, 200)
            self.assertEqual(self.w.run(good, "echo ok")["stdout"], "ok\n")
            self.w.delete(good)
            # The dead VM's group and uid are gone.
            deadline = time.time() + 15
            while vm_groups(w) and time.time() < deadline:
                time.sleep(0.1)
            self.assertEqual(vm_groups(w), [])
        finally:
            cleanup(w)


@unittest.skipUnless(jail_possible(), "needs root and cgroups (memory, cpu, pids)")
class JailRestartTest(unittest.TestCase):
    def test_kill9_readopts_jailed_vms_and_sweeps_the_rest(self):
        w = Warren(jail_conf(jail_uid_base=UID_BASE + 60)).start()
        try:
            keep = w.create(ttl_seconds=1200)
            lost = w.create(ttl_seconds=1200)
            pk, pl = qemu_of(w, keep), qemu_of(w, lost)
            vk, vl = w.vm_id(keep), w.vm_id(lost)
            uk = proc_uid(pk)
            groups = vm_groups(w)
            self.assertEqual(len(groups), 2 * len(group_parents(w)))
            w.kill9()
            # One VM dies while warrend is down: its group must not outlive it.
            os.kill(pl, signal.SIGKILL)
            w.start()
            self.assertEqual(run_reconnecting(self, w, keep, "echo again")["stdout"], "again\n")
            self.assertEqual(qemu_of(w, keep), pk)
            self.assertEqual(proc_uid(pk), uk)
            s = w.wait_state(lost, ["dead"], timeout=30)
            self.assertIn("vm_lost", s["end_reason"])
            self.assertEqual([g for g in vm_groups(w) if vl in g], [])
            self.assertEqual(len([g for g in vm_groups(w) if vk in g]), len(group_parents(w)))
            # A new sandbox never gets the adopted VM's uid.
            new = w.create(ttl_seconds=1200)
            self.assertNotEqual(proc_uid(qemu_of(w, new)), uk)
            self.assertEqual(w.run(new, "echo new")["stdout"], "new\n")
            w.delete(new)
            w.delete(keep)
            self.assertEqual(wait_no_qemu(w.state_dir), [])
            # An exited QEMU leaves its group only once reaped: the adopted one by
            # init, whenever init gets to it; warrend retries from its loop.
            deadline = time.time() + 15
            while vm_groups(w) and time.time() < deadline:
                time.sleep(0.1)
            self.assertEqual(vm_groups(w), [])
        finally:
            cleanup(w)

    def test_no_leaks_after_cycles_and_kill9(self):
        n_uids = 50
        base = UID_BASE + 120
        w = Warren(jail_conf(jail_uid_base=base)).start()
        try:
            t0 = time.time()
            for i in range(CYCLES):
                sid = w.create(ttl_seconds=1200)
                if i % 10 == 0:
                    self.assertEqual(w.run(sid, "echo x")["stdout"], "x\n")
                self.assertEqual(w.delete(sid).status, 200)
            print(f"\n{CYCLES} jailed create/delete cycles in {time.time() - t0:.1f} s",
                  flush=True)
            # A kill -9 with live VMs, then their deletion by the next warrend.
            live = [w.create(ttl_seconds=1200) for _ in range(2)]
            w.kill9()
            w.start()
            for sid in live:
                self.assertEqual(w.delete(sid).status, 200)
            self.assertEqual(wait_no_qemu(w.state_dir), [])
            deadline = time.time() + 15
            while (vm_groups(w) or procs_in_uid_range(base, n_uids)) and time.time() < deadline:
                time.sleep(0.1)
            self.assertEqual(vm_groups(w), [])
            self.assertEqual(procs_in_uid_range(base, n_uids), [])
            # Not a count of host mounts: other processes here mount and unmount too.
            self.assertEqual(our_mounts(w.state_dir), [])
            left = os.listdir(f"{w.state_dir}/vms")
            self.assertEqual(left, [])
        finally:
            cleanup(w)


@unittest.skipUnless(jail_possible(), "needs root and cgroups (memory, cpu, pids)")
class JailUidSharingTest(unittest.TestCase):
    """Two warrends given the same uid range (a mistake of configuration, or two state
    dirs on one host) never run two VMs as one uid, whichever of them is alive: a
    uid is claimed by a lock every warrend sees, and one a process still runs as (a
    killed warrend's QEMU) is not given out; a warrend that finds every uid of its
    range held refuses to start."""

    def test_two_warrends_one_range(self):
        base = UID_BASE + 180
        conf = jail_conf(jail_uid_base=base, jail_uid_count=2)
        w1, w2, w3 = Warren(conf), Warren(conf), Warren(dict(conf, jail_uid_count=1))
        try:
            w1.start()
            w2.start()
            a = w1.create(ttl_seconds=1200)
            pa = qemu_of(w1, a)
            ua = proc_uid(pa)
            b = w2.create(ttl_seconds=1200)
            pb = qemu_of(w2, b)
            ub = proc_uid(pb)
            # Lowest free first: w1's VM has the first uid, w2's the next.
            self.assertEqual((ua, ub), (base, base + 1))
            # A range of one uid, held by w1's VM: w3 refuses to start.
            with self.assertRaises(RuntimeError) as e:
                w3.start(timeout=30)
            self.assertIn("held by another warrend", str(e.exception))
            # w1 is killed: its QEMU runs on as ua, with no warrend holding its lock.
            w1.kill9()
            self.assertEqual(proc_uid(pa), ua)
            rb = w2.run_dir(b)
            self.assertEqual(w2.delete(b).status, 200)
            self.assertEqual(wait_no_qemu(rb + "/"), [])
            # The uid goes back once its QEMU is reaped, just after the delete's answer.
            deadline = time.time() + 15
            while time.time() < deadline:
                r = w2.request("POST", "/v1/sandboxes", {"template": "minimal", "ttl_seconds": 1200})
                if r.status == 201 or "Too many users" not in r.body.decode():
                    break
                time.sleep(0.1)
            self.assertEqual(r.status, 201, r)
            c = r.json()["id"]
            self.assertNotEqual(proc_uid(qemu_of(w2, c)), ua)
            # The range is full now (ua runs, w2 holds the other): refused, not shared.
            r = w2.request("POST", "/v1/sandboxes", {"template": "minimal", "ttl_seconds": 60})
            self.assertNotIn(r.status, (200, 201), r)
            self.assertEqual(procs_in_uid_range(ua, 1), [pa])
            self.assertEqual(w2.delete(c).status, 200)
        finally:
            for w in (w3, w2, w1):
                cleanup(w)


class StartupTest(unittest.TestCase):
    def start(self, conf_lines, addr="0.0.0.0", jail="off"):
        d = Warren().state_dir
        conf = os.path.join(d, "t.conf")
        with open(conf, "w") as f:
            f.write(f"accel = tcg\njail = {jail}\npool_size = 0\n" + conf_lines)
        p = subprocess.Popen([warrend_path(), "--config", conf, "--listen",
                              f"{addr}:{free_port()}", "--state-dir", d, "--image-dir",
                              image_dir()], stdout=subprocess.PIPE, stderr=subprocess.STDOUT)
        return d, p

    def test_jail_required_refuses_to_run_unjailed(self):
        # A parent group that cannot be used: required stops, auto warns and runs.
        bad = "jail_cgroup = /not/relative\n"
        d, p = self.start(bad, addr="127.0.0.1", jail="required")
        try:
            out, _ = p.communicate(timeout=30)
            p.stdout.close()
            self.assertNotEqual(p.returncode, 0, out)
            self.assertIn(b"jail = required, but QEMU cannot be jailed here", out)
        finally:
            subprocess.run(["rm", "-rf", d])
        d, p = self.start(bad, addr="127.0.0.1", jail="auto")
        try:
            seen = b""
            line = p.stdout.readline()
            while line and b"warrend listening" not in line:
                seen += line
                line = p.stdout.readline()
            self.assertIn(b"warrend listening", line)
            self.assertIn(b"WARNING: QEMU runs UNJAILED", seen)
        finally:
            p.terminate()
            p.wait(timeout=30)
            p.stdout.close()
            subprocess.run(["rm", "-rf", d])

    def test_tcg_on_a_public_address_needs_allow_tcg(self):
        d, p = self.start("")
        try:
            out, _ = p.communicate(timeout=30)
            p.stdout.close()
            self.assertEqual(p.returncode, 2, out)
            self.assertIn(b"QEMU's security guarantees cover KVM guests only", out)
            self.assertIn(b"allow_tcg = true", out)
        finally:
            subprocess.run(["rm", "-rf", d])
        d, p = self.start("allow_tcg = true\n")
        try:
            line = p.stdout.readline()
            while line and b"warrend listening" not in line:
                line = p.stdout.readline()
            self.assertIn(b"warrend listening", line)
        finally:
            p.terminate()
            p.wait(timeout=30)
            p.stdout.close()
            subprocess.run(["rm", "-rf", d])


if __name__ == "__main__":
    unittest.main()
