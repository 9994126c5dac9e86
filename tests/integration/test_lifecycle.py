"""Sandbox lifecycle against real microVMs: TTL and idle reaping, a VM killed
under warrend, warrend killed under its VMs, limits."""
import os
import signal
import time
import unittest

from warren import Warren, WarrenCase, qemu_pids, wait_no_qemu


class LifecycleTest(WarrenCase):
    conf = {"max_sandboxes": 3}

    def test_create_get_list_delete(self):
        sid = self.w.create(metadata={"owner": "alice"}, ttl_seconds=120)
        sb = self.w.get(sid).json()
        self.assertEqual((sb["state"], sb["template"], sb["metadata"]),
                         ("running", "minimal", {"owner": "alice"}))
        vm, run_dir = self.w.vm_id(sid), self.w.run_dir(sid)
        self.assertTrue(vm.startswith("vm-") and os.path.isdir(run_dir), (vm, run_dir))
        ids = [s["id"] for s in self.w.request(
            "GET", "/v1/sandboxes?metadata.owner=alice").json()["sandboxes"]]
        self.assertEqual(ids, [sid])
        self.assertEqual(self.w.request(
            "GET", "/v1/sandboxes?metadata.owner=bob").json()["sandboxes"], [])
        r = self.w.request("POST", f"/v1/sandboxes/{sid}/timeout", {"ttl_seconds": 600})
        self.assertEqual(r.status, 200, r)
        self.assertEqual(self.w.delete(sid).status, 200)
        sb = self.w.get(sid).json()
        self.assertEqual((sb["state"], sb["end_reason"]), ("ended", "deleted"))
        # The run dir (disk, sockets, logs) is removed off the loop, soon after.
        deadline = time.time() + 30
        while os.path.exists(run_dir) and time.time() < deadline:
            time.sleep(0.1)
        self.assertFalse(os.path.exists(run_dir), run_dir)
        self.assertError(self.w.exec(sid, "true"), 409, "sandbox_ended")
        self.assertEqual(wait_no_qemu(vm), [])

    def test_ttl_and_idle_reaping(self):
        ttl = self.w.create(ttl_seconds=2, idle_timeout_seconds=0)
        idle = self.w.create(ttl_seconds=600, idle_timeout_seconds=2)
        vms = [self.w.vm_id(ttl), self.w.vm_id(idle)]
        sb = self.w.wait_state(ttl, ("ended",), timeout=30)
        self.assertEqual(sb["end_reason"], "ttl_expired")
        sb = self.w.wait_state(idle, ("ended",), timeout=30)
        self.assertEqual(sb["end_reason"], "idle_timeout")
        self.assertEqual(wait_no_qemu(vms[0]) + wait_no_qemu(vms[1]), [])

    def test_busy_sandbox_is_not_idle(self):
        sid = self.w.create(ttl_seconds=600, idle_timeout_seconds=2)
        res = self.w.run(sid, "sleep 5; echo still-here")
        self.assertEqual(res["stdout"], "still-here\n")
        self.w.delete(sid)

    def test_killed_vm_is_dead_and_others_live(self):
        a = self.w.create()
        b = self.w.create()
        pids = qemu_pids(self.w.vm_id(a))
        self.assertEqual(len(pids), 1)
        os.kill(pids[0], signal.SIGKILL)
        sb = self.w.wait_state(a, ("dead",), timeout=20)
        self.assertIn("signal 9", sb["end_reason"])
        self.assertError(self.w.exec(a, "true"), 409, "sandbox_dead")
        self.assertEqual(self.w.run(b, "echo ok")["stdout"], "ok\n")
        self.w.delete(b)

    def test_limits(self):
        self.assertError(self.w.request("POST", "/v1/sandboxes", {"template": "nope"}), 400,
                         "unknown_template")
        self.assertError(self.w.request("POST", "/v1/sandboxes", {"memory_mb": 1}), 400,
                         "invalid_argument")
        self.assertError(self.w.request("POST", "/v1/sandboxes", {"vcpus": 99}), 400)
        self.assertError(self.w.request("POST", "/v1/sandboxes", {"ttl_seconds": -1}), 400)
        live = [self.w.create() for _ in range(3 - len(self.live()))]
        self.assertError(self.w.request("POST", "/v1/sandboxes", {"template": "minimal"}), 429,
                         "too_many_sandboxes")
        for sid in live:
            self.w.delete(sid)

    def live(self):
        return [s for s in self.w.request("GET", "/v1/sandboxes?state=running").json()[
            "sandboxes"]]


class RestartTest(unittest.TestCase):
    def test_kill9_warrend_readopts_live_sandboxes(self):
        w = Warren()
        try:
            w.start()
            a = w.create()
            b = w.create()
            self.assertEqual(w.request("PUT", f"/v1/sandboxes/{a}/files?path=/root/keep",
                                       body=b"persist").status, 200)
            w.run(b, "sleep 600 >/dev/null 2>&1 &")
            w.delete(b)
            vm_id = w.vm_id(a)
            w.kill9()
            vm = qemu_pids(vm_id)
            self.assertEqual(len(vm), 1, "the VM must survive warrend's death")
            w.start()
            sb = w.get(a).json()
            self.assertEqual(sb["state"], "running")
            self.assertEqual(w.get(b).json()["state"], "ended")
            deadline = time.time() + 30
            while True:
                r = w.exec(a, "cat /root/keep")
                if r.status == 200 or time.time() > deadline:
                    break
                self.assertEqual(r.status, 503, r)  # reconnecting: retry
                time.sleep(0.1)
            self.assertEqual(r.status, 200, r)
            self.assertEqual(r.json()["stdout"], "persist")
            self.assertEqual(qemu_pids(vm_id), vm, "the same VM, not a new one")
            self.assertEqual(w.vm_id(a), vm_id, "the VM keeps its id")
        finally:
            w.cleanup()

    def test_lost_index_leaks_no_vm_or_file(self):
        w = Warren()
        try:
            w.start()
            a = w.create()
            vm, run_dir = w.vm_id(a), w.run_dir(a)
            self.assertEqual(len(qemu_pids(vm)), 1)
            w.kill9()
            # The record of a live VM is gone (as if warrend died before saving it).
            import shutil
            shutil.rmtree(os.path.join(w.state_dir, "index"))
            w.start()
            self.assertEqual(wait_no_qemu(vm), [], "a VM without a record must be killed")
            deadline = time.time() + 30  # removed off the loop
            while os.path.exists(run_dir) and time.time() < deadline:
                time.sleep(0.1)
            self.assertFalse(os.path.exists(run_dir), run_dir)
            self.assertError(w.get(a), 404, "sandbox_not_found")
        finally:
            w.cleanup()

    def assertError(self, r, status, code):
        self.assertEqual(r.status, status, r)
        self.assertEqual(r.json()["error"]["code"], code, r)


if __name__ == "__main__":
    unittest.main()


class ClockStepTest(unittest.TestCase):
    """A step of the wall clock neither ends a sandbox early nor moves what GET
    shows: TTL and idle limits run on the monotonic clock. warrend's own
    CLOCK_REALTIME is shifted by an LD_PRELOAD shim (the machine's clock is
    never touched)."""

    def test_wall_clock_step_does_not_expire(self):
        shim = os.environ.get("WARREN_CLOCKSHIFT")
        if not shim:
            self.fail("WARREN_CLOCKSHIFT (the clockshift shim) is not set; run through ctest")
        w = Warren(env={"LD_PRELOAD": shim,
                        "ASAN_OPTIONS": os.environ.get("ASAN_OPTIONS", "") +
                        ":verify_asan_link_order=0"})
        shift = os.path.join(w.state_dir, "clock_shift")
        w.env["WARREN_TEST_CLOCK_SHIFT_FILE"] = shift
        with open(shift, "w") as f:
            f.write("0")
        try:
            w.start()
            sid = w.create(ttl_seconds=600, idle_timeout_seconds=300)
            before = w.get(sid).json()
            with open(shift, "w") as f:
                f.write(str(3 * 3600))  # three hours forward, past both limits
            # The shim re-reads the file within 0.1 s; the reaper runs every 1 s.
            # Waiting 5 s gives it several rounds to (wrongly) end the sandbox.
            time.sleep(5)
            after = w.get(sid).json()
            self.assertEqual(after["state"], "running", after)
            self.assertEqual(after["expires_at"], before["expires_at"])
            self.assertEqual(w.run(sid, "echo ok")["stdout"], "ok\n")
        finally:
            w.cleanup()
