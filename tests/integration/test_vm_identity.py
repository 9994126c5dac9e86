"""VM identity apart from the sandbox's: a warrend kill -9 and restart keeps each
VM's id, adopts it through its record in the index's vms table and sweeps run
dirs and QEMUs that no VM record knows; a warrend upgraded in place adopts the
VMs and records of the previous release (VMs named after their sandbox, one
unnamed LMDB database) and later cleans them up."""
import ctypes
import ctypes.util
import os
import shutil
import signal
import subprocess
import time
import unittest

from warren import HERE, Warren, qemu_pids, wait_no_qemu

# The release before VMs had ids of their own (and before the index had tables).
OLD_COMMIT = "6482031"


class MDBVal(ctypes.Structure):
    _fields_ = [("mv_size", ctypes.c_size_t), ("mv_data", ctypes.c_void_p)]


def idx_delete(state_dir, table, key):
    """Delete one record of a table of warrend's index with LMDB itself (warrend stopped):
    the state a warrend leaves when it dies before saving that record."""
    lib = ctypes.CDLL(ctypes.util.find_library("lmdb") or "liblmdb.so.0")
    P, U = ctypes.c_void_p, ctypes.c_uint
    lib.mdb_env_create.argtypes = [ctypes.POINTER(P)]
    lib.mdb_env_set_maxdbs.argtypes = [P, U]
    lib.mdb_env_open.argtypes = [P, ctypes.c_char_p, U, U]
    lib.mdb_txn_begin.argtypes = [P, P, U, ctypes.POINTER(P)]
    lib.mdb_dbi_open.argtypes = [P, ctypes.c_char_p, U, ctypes.POINTER(U)]
    lib.mdb_del.argtypes = [P, U, ctypes.POINTER(MDBVal), P]
    lib.mdb_txn_commit.argtypes = [P]
    lib.mdb_env_close.argtypes = [P]
    env, txn, dbi = P(), P(), U()
    assert lib.mdb_env_create(ctypes.byref(env)) == 0
    try:
        assert lib.mdb_env_set_maxdbs(env, 8) == 0
        assert lib.mdb_env_open(env, os.path.join(state_dir, "index").encode(), 0, 0o600) == 0
        assert lib.mdb_txn_begin(env, None, 0, ctypes.byref(txn)) == 0
        assert lib.mdb_dbi_open(txn, table.encode(), 0, ctypes.byref(dbi)) == 0
        buf = ctypes.create_string_buffer(key.encode())
        k = MDBVal(len(key), ctypes.cast(buf, ctypes.c_void_p))
        assert lib.mdb_del(txn, dbi, ctypes.byref(k), None) == 0, "no such record"
        assert lib.mdb_txn_commit(txn) == 0
    finally:
        lib.mdb_env_close(env)


def old_warrend():
    """The previous release's warrend: $WARREND_OLD, else built once from git into /tmp."""
    p = os.environ.get("WARREND_OLD")
    if p:
        return p
    top = f"/tmp/warren-old-{OLD_COMMIT}"
    binary = f"{top}/build/server/warrend"
    if os.path.exists(binary):
        return binary
    repo = os.path.join(HERE, "..", "..")
    try:
        shutil.rmtree(top, ignore_errors=True)
        os.makedirs(f"{top}/src")
        arch = subprocess.run(["git", "-C", repo, "archive", OLD_COMMIT], check=True,
                              capture_output=True).stdout
        subprocess.run(["tar", "-x", "-C", f"{top}/src"], input=arch, check=True)
        subprocess.run(["cmake", "-S", f"{top}/src", "-B", f"{top}/build",
                        "-DCMAKE_BUILD_TYPE=Release"], check=True, capture_output=True)
        subprocess.run(["cmake", "--build", f"{top}/build", "-j2", "--target", "warrend"],
                       check=True, capture_output=True)
    except (OSError, subprocess.CalledProcessError) as e:
        raise unittest.SkipTest(f"cannot build warrend {OLD_COMMIT}: {e}")
    return binary


def wait_gone(path, timeout=30):
    """Run dirs are removed off the loop: soon, not at once."""
    deadline = time.time() + timeout
    while os.path.exists(path) and time.time() < deadline:
        time.sleep(0.1)
    return not os.path.exists(path)


def exec_after_restart(test, w, sid, cmd, timeout=30):
    """503 while the guest channel reconnects after a restart, then 200."""
    deadline = time.time() + timeout
    while True:
        r = w.exec(sid, cmd)
        if r.status == 200 or time.time() > deadline:
            break
        test.assertEqual(r.status, 503, r)
        time.sleep(0.1)
    test.assertEqual(r.status, 200, r)
    return r.json()


class VmIdentityTest(unittest.TestCase):
    def test_kill9_keeps_vm_ids_and_sweeps_strays(self):
        w = Warren()
        try:
            w.start()
            a = w.create(ttl_seconds=1200)
            b = w.create(ttl_seconds=1200)
            va, vb = w.vm_id(a), w.vm_id(b)
            self.assertTrue(va.startswith("vm-") and vb.startswith("vm-"), (va, vb))
            self.assertNotEqual(va, vb)
            pa, pb = qemu_pids(va), qemu_pids(vb)
            self.assertEqual((len(pa), len(pb)), (1, 1))
            self.assertEqual(w.request("PUT", f"/v1/sandboxes/{a}/files?path=/root/keep",
                                       body=b"persist").status, 200)
            rb = w.run_dir(b)
            w.kill9()
            # b's VM loses its record (as if warrend died before saving it): its QEMU and
            # run dir are strays. So is a run dir nothing ever recorded.
            idx_delete(w.state_dir, "vms", vb)
            stray = os.path.join(w.state_dir, "vms", "vm-00000000deadbeef")
            os.makedirs(stray)
            with open(os.path.join(stray, "console.log"), "w") as f:
                f.write("left over\n")
            w.start()
            # a: the same VM, under the same id, and it still answers.
            self.assertEqual(exec_after_restart(self, w, a, "cat /root/keep")["stdout"],
                             "persist")
            self.assertEqual(w.vm_id(a), va)
            self.assertEqual(qemu_pids(va), pa, "the same QEMU, not a new one")
            # b: no VM record, so its QEMU is killed and its files go; the sandbox is dead.
            self.assertEqual(wait_no_qemu(vb), [])
            self.assertTrue(wait_gone(rb), rb)
            self.assertTrue(wait_gone(stray), stray)
            sb = w.get(b).json()
            self.assertEqual(sb["state"], "dead", sb)
            self.assertIn("vm_lost", sb["end_reason"])
            self.assertIn("no VM record", w.log_text())
            # Deleting a removes its VM: no QEMU, no run dir.
            ra = w.run_dir(a)
            self.assertEqual(w.delete(a).status, 200)
            self.assertEqual(wait_no_qemu(va), [])
            self.assertTrue(wait_gone(ra), ra)
        finally:
            w.cleanup()


class UpgradeTest(unittest.TestCase):
    def test_previous_release_vms_are_adopted_then_cleaned(self):
        old = old_warrend()
        w = Warren()
        try:
            w.binary = old
            w.start()
            a = w.create(ttl_seconds=1200)
            gone = w.create(ttl_seconds=1200)
            self.assertEqual(w.delete(gone).status, 200)
            # A dead sandbox keeps its logs in its run dir until it is purged.
            dead = w.create(ttl_seconds=1200)
            dead_dir = os.path.join(w.state_dir, "sandboxes", dead)
            os.kill(qemu_pids(dead_dir + "/")[0], signal.SIGKILL)
            w.wait_state(dead, ["dead"], timeout=30)
            self.assertEqual(w.request("PUT", f"/v1/sandboxes/{a}/files?path=/root/keep",
                                       body=b"old").status, 200)
            self.assertNotIn("vm_id", w.get(a).json())
            old_dir = os.path.join(w.state_dir, "sandboxes", a)
            pids = qemu_pids(old_dir + "/")
            self.assertEqual(len(pids), 1)
            w.kill9()
            # The new warrend, in place: the old index layout and records are moved, the
            # old VM adopted under its old name (its sandbox's id).
            w.binary = None
            w.start()
            self.assertIn("moved 3 record(s) of the old layout", w.log_text())
            self.assertEqual(exec_after_restart(self, w, a, "cat /root/keep")["stdout"], "old")
            self.assertEqual(w.vm_id(a), a)
            self.assertEqual(qemu_pids(old_dir + "/"), pids)
            self.assertEqual(w.get(gone).json()["state"], "ended")
            # The dead one's run dir is known (its VM record has it): not swept.
            self.assertEqual(w.get(dead).json()["state"], "dead")
            self.assertTrue(os.path.exists(os.path.join(dead_dir, "console.log")))
            # The rewritten records are read as new ones by the next start.
            w.kill9()
            w.start()
            self.assertEqual(exec_after_restart(self, w, a, "echo again")["stdout"], "again\n")
            self.assertEqual(qemu_pids(old_dir + "/"), pids)
            # Deleting it cleans the old VM and its old run dir; new VMs get ids of their own.
            self.assertEqual(w.delete(a).status, 200)
            self.assertEqual(wait_no_qemu(old_dir + "/"), [])
            self.assertTrue(wait_gone(old_dir), old_dir)
            n = w.create(ttl_seconds=1200)
            self.assertTrue(w.vm_id(n).startswith("vm-"))
            self.assertEqual(w.run(n, "echo new")["stdout"], "new\n")
            w.delete(n)
        finally:
            w.cleanup()


if __name__ == "__main__":
    unittest.main()
