"""Idle freeze against real microVMs: an idle sandbox's VM is stopped in place
(its QEMU uses no CPU), and the next exec, file read or restart of warrend
continues it with the guest clock right; keep_running with a live
background process keeps it running (and frozen once that process ended).

The freeze stops the VM's QEMU whole (SIGSTOP): the guest's clocks keep time
meanwhile, and the thaw (SIGCONT) sends no RESYNC.

TestPageout: a sandbox frozen long enough has its QEMU's memory pushed out to
swap, and comes back with its files, memory and processes intact, from an exec
and through a pause and resume. It needs
swap on the host: when there is none it makes some on /dev/zram0 for its run
and takes it away after.
"""
import time
import unittest

from warren import WarrenCase, qemu_pids, swap_kb, zram_swap_off, zram_swap_on

FREEZE_MS = 1500


def cpu_ticks(pid):
    """utime + stime of a process, in clock ticks."""
    with open(f"/proc/{pid}/stat") as f:
        rest = f.read().rsplit(")", 1)[1].split()
    return int(rest[11]) + int(rest[12])


def proc_state(pid):
    """R, S, T (stopped by a signal), ... of a process."""
    with open(f"/proc/{pid}/stat") as f:
        return f.read().rsplit(")", 1)[1].split()[0]


def wait_for(case, sid, key, timeout):
    """GET until the record says key (GET itself is not activity). Returns the record."""
    deadline = time.time() + timeout
    while time.time() < deadline:
        sb = case.w.get(sid).json()
        if sb[key]:
            return sb
        time.sleep(0.1)
    case.fail(f"{sid}: {key} not true within {timeout} s: {case.w.get(sid).json()}\n"
              + case.w.log_text())


class TestFreeze(WarrenCase):
    conf = {"freeze_after_ms": FREEZE_MS}

    @classmethod
    def setUpClass(cls):
        super().setUpClass()
        w = cls.w
        try:
            cls.sid = w.create()
            w.run(cls.sid, "echo frozen-file > /root/f")
            # keep_running, with a background loop that never ends
            cls.keep = w.create(keep_running=True)
            r = w.request("POST", f"/v1/sandboxes/{cls.keep}/exec",
                          {"cmd": "while :; do sleep 0.2; done", "background": True})
            if r.status != 201:
                raise AssertionError(f"background exec failed: {r}")
            cls.keep_pid = r.json()["pid"]
        except BaseException:
            w.cleanup()  # tearDownClass does not run when setUpClass fails
            raise

    def wait_frozen(self, sid, timeout=30):
        return wait_for(self, sid, "frozen", timeout)

    def test_1_freezes_uses_no_cpu_and_thaws_with_the_clock_set(self):
        w, sid = self.w, self.sid
        h0 = time.time()
        up0 = float(w.run(sid, "cat /proc/uptime")["stdout"].split()[0])
        t0 = time.time()
        sb = self.wait_frozen(sid)
        # a frozen sandbox is a running one to clients, and listed as one
        self.assertEqual(sb["state"], "running")
        listed = w.request("GET", "/v1/sandboxes?state=frozen").json()["sandboxes"]
        self.assertEqual([s["id"] for s in listed], [sid])
        running = w.request("GET", "/v1/sandboxes?state=running").json()["sandboxes"]
        self.assertIn(sid, [s["id"] for s in running])
        (pid,) = qemu_pids(self.w.vm_id(sid))
        c0 = cpu_ticks(pid)
        time.sleep(2)
        self.assertEqual(cpu_ticks(pid), c0, "a stopped VM's QEMU must use no CPU")
        self.assertEqual(proc_state(pid), "T", "a frozen VM's QEMU is stopped whole")
        # frozen for >= 10 s: a guest clock that stood still would be that far behind
        time.sleep(max(0, 10.5 - (time.time() - t0)))
        before = time.time()
        r = w.run(sid, "date +%s; cat /proc/uptime")
        after = time.time()
        guest_now = int(r["stdout"].split()[0])
        up1 = float(r["stdout"].split()[1])
        self.assertFalse(w.get(sid).json()["frozen"])
        # Its QEMU was stopped whole (SIGSTOP): the guest's clocks kept time meanwhile,
        # the monotonic one too, so a sleep or timeout in the guest ends when it should.
        self.assertLessEqual(abs((up1 - up0) - (after - h0)), 3,
                             f"guest uptime advanced {up1 - up0:.1f} s in {after - h0:.1f} s")
        self.assertLessEqual(abs(guest_now - (before + after) / 2), 3,
                             f"guest clock {guest_now}, host {before:.0f}..{after:.0f}")

    def test_2_file_read_and_process_list_thaw(self):
        w, sid = self.w, self.sid
        self.wait_frozen(sid)
        r = w.request("GET", f"/v1/sandboxes/{sid}/files?path=/root/f")
        self.assertEqual(r.status, 200, r)
        self.assertEqual(r.body, b"frozen-file\n")
        self.assertFalse(w.get(sid).json()["frozen"])
        # a process call too
        self.wait_frozen(sid)
        r = w.request("GET", f"/v1/sandboxes/{sid}/processes")
        self.assertEqual(r.status, 200, r)
        self.assertFalse(w.get(sid).json()["frozen"])

    def test_3_keep_running_with_a_live_process_is_not_frozen(self):
        w = self.w
        sb = w.get(self.keep).json()
        self.assertTrue(sb["keep_running"])
        # idle far longer than freeze_after_ms (several reaper ticks), never frozen
        deadline = time.time() + max(5, 3 * FREEZE_MS / 1000)
        while time.time() < deadline:
            self.assertFalse(w.get(self.keep).json()["frozen"])
            time.sleep(0.2)
        # its process ran all along: the loop is still there
        procs = w.request("GET", f"/v1/sandboxes/{self.keep}/processes").json()["processes"]
        self.assertTrue(procs and all(p["running"] for p in procs), procs)
        # once nothing runs any more, it freezes like any other
        r = w.request("POST", f"/v1/sandboxes/{self.keep}/processes/{self.keep_pid}/signal",
                      {"signal": 9})
        self.assertEqual(r.status, 200, r)
        self.wait_frozen(self.keep)

    def test_4_kill9_warrend_while_frozen_then_exec(self):
        w, sid = self.w, self.sid
        self.wait_frozen(sid)
        (vm,) = qemu_pids(self.w.vm_id(sid))
        w.kill9()
        w.start()
        deadline = time.time() + 30
        while True:
            r = w.exec(sid, "date +%s")
            if r.status == 200 or time.time() > deadline:
                break
            self.assertEqual(r.status, 503, r)  # reconnecting: retry
            time.sleep(0.1)
        self.assertEqual(r.status, 200, r)
        self.assertLessEqual(abs(int(r.json()["stdout"]) - time.time()), 3)
        self.assertEqual(qemu_pids(self.w.vm_id(sid)), [vm], "the same VM, not a new one")
        # and it freezes again, and thaws again, under the new warrend
        self.wait_frozen(sid)
        self.assertEqual(w.run(sid, "cat /root/f")["stdout"], "frozen-file\n")


class TestPageout(WarrenCase):
    conf = {"freeze_after_ms": FREEZE_MS, "freeze_pageout_after_ms": 500}

    @classmethod
    def setUpClass(cls):
        cls.made_swap = zram_swap_on()
        try:
            super().setUpClass()
        except BaseException:
            if cls.made_swap:
                zram_swap_off()
            raise

    @classmethod
    def tearDownClass(cls):
        try:
            super().tearDownClass()
        finally:
            if cls.made_swap:
                zram_swap_off()

    def wait_paged_out(self, sid, timeout=60):
        return wait_for(self, sid, "paged_out", timeout)

    def test_paged_out_sandbox_comes_back_whole(self):
        w = self.w
        sid = w.create()
        # 24 MiB in the guest's RAM (tmpfs), and a process counting in its memory
        r = w.run(sid, "head -c 25165824 /dev/urandom > /dev/shm/blob && md5sum /dev/shm/blob")
        digest = r["stdout"].split()[0]
        r = w.request("POST", f"/v1/sandboxes/{sid}/exec",
                      {"cmd": "i=0; while :; do i=$((i+1)); echo $i > /tmp/count; sleep 0.1; "
                              "done", "background": True})
        self.assertEqual(r.status, 201, r)
        sb = self.wait_paged_out(sid)
        self.assertTrue(sb["frozen"])
        (pid,) = qemu_pids(w.vm_id(sid))
        self.assertEqual(proc_state(pid), "T", "paged out and still stopped")
        self.assertGreater(swap_kb(pid), 20 * 1024, "the guest's 24 MiB at least went to swap")
        self.assertIn("paged out: resident", w.log_all())
        # the next exec brings it back: the file, the counting process, the VM
        c0 = int(w.run(sid, "cat /tmp/count")["stdout"])
        self.assertFalse(w.get(sid).json()["paged_out"])
        self.assertEqual(w.run(sid, "md5sum /dev/shm/blob")["stdout"].split()[0], digest)
        time.sleep(1)
        self.assertGreater(int(w.run(sid, "cat /tmp/count")["stdout"]), c0,
                           "the background process runs again")
        self.assertEqual(qemu_pids(w.vm_id(sid)), [pid], "the same VM, not a new one")
        # frozen and paged out again: a pause saves it from swap, a resume brings it back
        self.wait_paged_out(sid)
        r = w.request("POST", f"/v1/sandboxes/{sid}/pause", {})
        self.assertEqual(r.status, 200, f"{r}\n{w.log_text()}")
        self.assertEqual(r.json()["state"], "paused", r)
        r = w.request("POST", f"/v1/sandboxes/{sid}/resume", {})
        self.assertEqual(r.status, 200, f"{r}\n{w.log_text()}")
        self.assertEqual(w.run(sid, "md5sum /dev/shm/blob")["stdout"].split()[0], digest)
        c1 = int(w.run(sid, "cat /tmp/count")["stdout"])
        time.sleep(1)
        self.assertGreater(int(w.run(sid, "cat /tmp/count")["stdout"]), c1,
                           "the background process runs after the resume")
        w.delete(sid)


if __name__ == "__main__":
    unittest.main()
