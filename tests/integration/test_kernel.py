"""Live Python kernels in sandboxes of the code-interpreter template
(docs/KERNELD.md), through warrend's existing REST API only: the guest's
bridge is reached as a sandbox process, `/proc/1/exe --connect`, fed one
request on stdin.

A pool clone's default kernel was started in the template (its start boot id is
the template's, not the clone's) and answers E2B's NDJSON lines; state carries
across runs; a matplotlib figure comes as a PNG result; an error has its
name, value and traceback; a timeout interrupts and the variables stay; a
bash context keeps its cwd and variables; two clones differ in random draws,
session keys and kernel ids; a cold boot runs the image's warm hook before
its create answers, so its first run finds the kernel up.

Needs the code-interpreter image (images/build.sh) in the image directory. One
warrend for the class; the methods run in name order."""
import base64
import json
import os
import shutil
import subprocess
import tempfile
import time
import unittest

from cibox import TEMPLATE, CodeCase, wait_pool
from warren import Warren, image_dir, pss_kib, qemu_pids, rss_kib

SOCK = "/run/warren/kernel.sock"


def lines(text):
    return [json.loads(l) for l in text.splitlines() if l.strip()]


class TestKernel(CodeCase):
    """On the shared code-interpreter warrend (cibox.py): a pool of 2 of the template."""

    @classmethod
    def setUpClass(cls):
        super().setUpClass()
        cls.sids = []

    def create(self, **kw):
        body = {"template": TEMPLATE, "ttl_seconds": Warren.TEST_TTL_S,
                "idle_timeout_seconds": Warren.TEST_IDLE_S}
        body.update(kw)
        r = self.w.request("POST", "/v1/sandboxes", body)
        self.assertEqual(r.status, 201, f"{r}\n{self.w.log_text()}")
        return r.json()

    def kreq(self, sid, req, timeout=600):
        """One request to the bridge; its answer lines."""
        r = self.w.exec(sid, ["/proc/1/exe", "--connect", SOCK],
                        stdin=json.dumps(req) + "\n", timeout_seconds=timeout)
        self.assertEqual(r.status, 200, r)
        out = r.json()
        self.assertEqual(out["exit_code"], 0, out)
        return lines(out["stdout"])

    def run_code(self, sid, code, **kw):
        req = {"op": "run", "code": code}
        req.update(kw)
        got = self.kreq(sid, req)
        self.assertEqual(got[-1], {"type": "end_of_execution"}, got)
        self.assertEqual(sum(1 for l in got if l["type"] == "end_of_execution"), 1, got)
        return got

    def stdout(self, got):
        return "".join(l["text"] for l in got if l["type"] == "stdout")

    def wait_pool(self, n):
        p = wait_pool(self.w, n)
        self.assertEqual(p["state"], "ready", f"{p}\n{self.w.log_text()}")
        return p

    def boot_id(self, sid):
        return self.w.run(sid, "cat /proc/sys/kernel/random/boot_id")["stdout"].strip()

    def test_1_pool_clone_runs_without_a_kernel_start(self):
        t0 = time.time()
        self.wait_pool(2)
        print(f"\n  template built and warmed, pool of 1 ready: {self.w.pool_ready_s:.1f} s, "
              f"of 2: {self.w.pool_ready_s + time.time() - t0:.1f} s")
        self.assertIn("/etc/warren/warm ran in", self.w.log_all())
        t0 = time.time()
        sb = self.create(template="code-interpreter-v1")  # the alias: the same pool
        got = self.run_code(sb["id"], "1+1")
        print(f"  pool create + first run: {time.time() - t0:.2f} s")
        self.assertEqual(sb["template"], TEMPLATE)
        self.assertEqual(sb["source"], "pool")
        self.__class__.sids.append(sb["id"])
        self.assertEqual(got[0], {"type": "number_of_executions", "execution_count": 1})
        self.assertEqual(got[1], {"type": "result", "is_main_result": True, "text": "2"})
        # The kernel was started in the template VM: its start boot id is the template's,
        # which the clone's RESYNC replaced.
        ctxs = self.kreq(sb["id"], {"op": "context_list"})[0]["contexts"]
        self.assertEqual(len(ctxs), 1, ctxs)
        self.assertTrue(ctxs[0]["default"])
        self.assertEqual(ctxs[0]["language"], "python")
        self.assertNotEqual(ctxs[0]["started_boot_id"], self.boot_id(sb["id"]))
        st = self.kreq(sb["id"], {"op": "status"})[0]
        self.assertEqual(st, {"ready": True, "contexts": 1, "boot_id": self.boot_id(sb["id"])})
        # numpy, pandas and matplotlib were imported by the warm hook.
        got = self.run_code(sb["id"], "import sys\nprint(sorted(m for m in "
                            "('numpy','pandas','matplotlib') if m in sys.modules))")
        self.assertEqual(self.stdout(got), "['matplotlib', 'numpy', 'pandas']\n")
        pid = qemu_pids(self.w.run_dir(sb["id"]))
        if pid:
            print(f"  pool clone with its kernel: PSS {pss_kib(pid[0]) / 1024:.0f} MiB, "
                  f"RSS {rss_kib(pid[0]) / 1024:.0f} MiB")

    def test_2_state_stdout_and_result(self):
        sid = self.sids[0]
        got = self.run_code(sid, "x = 41\nprint('hi')\nx + 1")
        types = [l["type"] for l in got]
        self.assertEqual(types, ["number_of_executions", "stdout", "result", "end_of_execution"])
        self.assertEqual(got[1]["text"], "hi\n")
        self.assertIn("timestamp", got[1])
        self.assertEqual(got[2]["text"], "42")
        got = self.run_code(sid, "'a string'")  # one pair of quotes is stripped
        self.assertEqual([l for l in got if l["type"] == "result"][0]["text"], "a string")
        got = self.run_code(sid, "print(x)", env={"WARREN_T": "v"})
        self.assertEqual(self.stdout(got), "41\n")
        got = self.run_code(sid, "import os\nprint(os.environ.get('WARREN_T'))",
                            env={"WARREN_T": "set"})
        self.assertEqual(self.stdout(got), "set\n")
        got = self.run_code(sid, "print(os.environ.get('WARREN_T'))")
        self.assertEqual(self.stdout(got), "None\n")  # restored after the run

    def test_3_matplotlib_png(self):
        got = self.run_code(self.sids[0], "import matplotlib.pyplot as plt\n"
                            "plt.plot([1, 2, 3], [3, 1, 2])\nplt.show()")
        res = [l for l in got if l["type"] == "result"]
        self.assertEqual(len(res), 1, got)
        self.assertFalse(res[0]["is_main_result"])
        self.assertTrue(base64.b64decode(res[0]["png"]).startswith(b"\x89PNG\r\n\x1a\n"))
        got = self.run_code(self.sids[0], "import pandas as pd\n"
                            "pd.DataFrame({'a': [1, 2], 'b': [3, 4]})")
        res = [l for l in got if l["type"] == "result"][0]
        self.assertIn("<table", res["html"])
        self.assertTrue(res["is_main_result"])

    def test_4_error(self):
        got = self.run_code(self.sids[0], "print('before')\n1/0\n")
        err = [l for l in got if l["type"] == "error"]
        self.assertEqual(len(err), 1, got)
        self.assertEqual(err[0]["name"], "ZeroDivisionError")
        self.assertEqual(err[0]["value"], "division by zero")
        self.assertIn("ZeroDivisionError", err[0]["traceback"])
        self.assertEqual(self.stdout(got), "before\n")

    def test_5_timeout_interrupts_and_state_stays(self):
        sid = self.sids[0]
        self.run_code(sid, "kept = 'yes'")
        t0 = time.time()
        got = self.run_code(sid, "import time\ntime.sleep(120)", timeout_ms=3000)
        self.assertLess(time.time() - t0, 100, "the run was not interrupted")
        err = [l for l in got if l["type"] == "error"]
        self.assertEqual(err[0]["name"], "TimeoutError", got)
        self.assertEqual(len(err), 1, got)
        self.assertEqual(self.stdout(self.run_code(sid, "print(kept)")), "yes\n")

    def test_6_bash_context(self):
        sid = self.sids[0]
        ctx = self.kreq(sid, {"op": "context_create", "language": "bash", "cwd": "/tmp"})[0]
        self.assertEqual(ctx["language"], "bash")
        self.assertEqual(ctx["cwd"], "/tmp")
        self.run_code(sid, "mkdir -p /tmp/wk && cd /tmp/wk && V=seven", context_id=ctx["id"])
        got = self.run_code(sid, "pwd; echo $V; echo oops >&2", context_id=ctx["id"])
        self.assertEqual(self.stdout(got), "/tmp/wk\nseven\n")
        self.assertEqual([l["text"] for l in got if l["type"] == "stderr"], ["oops\n"])
        got = self.run_code(sid, "exit_code_test() { return 3; }; exit_code_test",
                            context_id=ctx["id"])
        self.assertEqual([l for l in got if l["type"] == "error"][0],
                         {"type": "error", "name": "ExitError", "value": "3", "traceback": ""})
        got = self.kreq(sid, {"op": "run", "code": "1", "context_id": ctx["id"],
                              "language": "bash"})
        self.assertEqual(got[0]["type"], "fail")
        self.assertEqual(got[0]["code"], "bad_request")
        got = self.kreq(sid, {"op": "context_get", "id": "no-such"})
        self.assertEqual(got[0]["code"], "not_found")

    def test_7_clones_differ(self):
        a = self.sids[0]
        self.wait_pool(1)
        b = self.create()
        self.assertEqual(b["source"], "pool")
        self.sids.append(b["id"])
        code = ("import numpy, random\nk = get_ipython().kernel.session.key\n"
                "print(numpy.random.randint(1 << 30), random.random(), k.decode())")
        outs = [self.stdout(self.run_code(s, code)) for s in (a, b["id"])]
        self.assertNotEqual(outs[0], outs[1])
        na, ra, ka = outs[0].split()
        nb, rb, kb = outs[1].split()
        self.assertNotEqual(na, nb)
        self.assertNotEqual(ra, rb)
        self.assertNotEqual(ka, kb)
        ids = [self.kreq(s, {"op": "context_list"})[0]["contexts"][0]["kernel_id"]
               for s in (a, b["id"])]
        self.assertNotEqual(ids[0], ids[1])

    def test_7c_fork_branches_the_notebook_and_pause_keeps_it(self):
        """A fork of a sandbox whose kernel holds state gives kernels that start with the
        same variables, go their own ways, and are each re-keyed; a paused fork resumes
        with its kernel and variables."""
        a = self.sids[0]
        self.assertEqual(self.stdout(self.run_code(a, "branch = ['root']\nprint(branch)")),
                         "['root']\n")
        r = self.w.request("POST", f"/v1/sandboxes/{a}/fork", {"count": 2})
        self.assertEqual(r.status, 201, f"{r}\n{self.w.log_text()}")
        forks = [s["id"] for s in r.json()["sandboxes"]]
        self.assertEqual(len(forks), 2, r.json())
        code = ("import random\nprint(branch, random.random(), "
                "get_ipython().kernel.session.key.decode())")
        for i, f in enumerate(forks):
            self.run_code(f, f"branch.append({i})")
        self.run_code(a, "branch.append('parent')")
        outs = {s: self.stdout(self.run_code(s, code)).split("] ") for s in [a] + forks}
        self.assertEqual(outs[a][0] + "]", "['root', 'parent']")
        for i, f in enumerate(forks):
            self.assertEqual(outs[f][0] + "]", f"['root', {i}]")
        draws = [outs[s][1].split()[0] for s in outs]
        keys = [outs[s][1].split()[1] for s in outs]
        self.assertEqual(len(set(draws)), 3, outs)
        self.assertEqual(len(set(keys)), 3, outs)
        kids = [self.kreq(s, {"op": "context_list"})[0]["contexts"][0]["kernel_id"]
                for s in [a] + forks]
        self.assertEqual(len(set(kids)), 3, kids)
        # Pause and resume a fork: the same kernel process and its variables come back.
        f = forks[0]
        before = self.kreq(f, {"op": "context_list"})[0]["contexts"][0]
        r = self.w.request("POST", f"/v1/sandboxes/{f}/pause")
        self.assertEqual(r.status, 200, r)
        self.assertEqual(self.w.request("GET", f"/v1/sandboxes/{f}").json()["state"], "paused")
        r = self.w.request("POST", f"/v1/sandboxes/{f}/resume")
        self.assertEqual(r.status, 200, f"{r}\n{self.w.log_text()}")
        self.assertEqual(self.stdout(self.run_code(f, "print(branch)")), "['root', 0]\n")
        ctx = self.kreq(f, {"op": "context_list"})[0]["contexts"][0]
        self.assertEqual((ctx["id"], ctx["pid"]), (before["id"], before["pid"]))
        for s in forks:
            self.w.delete(s)

    def test_7b_output_bounds(self):
        sid = self.sids[0]
        # A line past max_line becomes one error line; the run goes on to its end.
        got = self.run_code(sid, "print('after')\n'x' * 200000", max_line=65536)
        err = [l for l in got if l["type"] == "error"]
        self.assertEqual([e["name"] for e in err], ["OutputTooLarge"], got)
        self.assertFalse([l for l in got if l["type"] == "result"], got)
        self.assertEqual(self.stdout(got), "after\n")
        self.assertTrue(all(len(json.dumps(l)) < 65536 for l in got))
        # Past max_output the rest is dropped for one error, whatever the kernel floods.
        got = self.run_code(sid, "for i in range(3000): print('y' * 100, flush=True)",
                            max_output=20000)
        self.assertEqual([l["name"] for l in got if l["type"] == "error"], ["OutputTooLarge"])
        self.assertLess(sum(len(l.get("text", "")) for l in got), 20000)
        self.assertEqual(self.stdout(self.run_code(sid, "print(kept)")), "yes\n")

    def test_8_cold_boot_warms_before_create_answers(self):
        # Another memory size has no pool (pool_on_first_use = false): it boots.
        t0 = time.time()
        sb = self.create(memory_mb=900)
        t_create = time.time() - t0
        self.assertEqual(sb["source"], "boot")
        t1 = time.time()
        got = self.run_code(sb["id"], "1+1")
        t_run = time.time() - t1
        print(f"\n  cold create (boot + warm): {t_create:.1f} s, then its first run "
              f"{t_run:.2f} s")
        self.assertEqual([l for l in got if l["type"] == "result"][0]["text"], "2")
        ctx = self.kreq(sb["id"], {"op": "context_list"})[0]["contexts"][0]
        self.assertEqual(ctx["started_boot_id"], self.boot_id(sb["id"]))
        self.assertIn(f"{sb['id']}: /etc/warren/warm ran in", self.w.log_all())
        self.w.delete(sb["id"])


class TestWarmFails(unittest.TestCase):
    """An image whose warm hook fails: the pool never saves its template (logged with the
    hook's words), and a create that boots answers 409 sandbox_dead naming the hook."""

    @classmethod
    def setUpClass(cls):
        src = image_dir()
        if not os.path.exists(os.path.join(src, TEMPLATE + ".ext4")):
            raise RuntimeError(f"no {TEMPLATE}.ext4 in {src} (run images/build.sh)")
        cls.dir = tempfile.mkdtemp(prefix="warren-warmfail-")
        for f in ("vmlinux", "initramfs.cpio"):
            shutil.copy(os.path.join(src, f), cls.dir)
        img = os.path.join(cls.dir, TEMPLATE + ".ext4")
        subprocess.run(["cp", "--sparse=always", os.path.join(src, TEMPLATE + ".ext4"), img],
                       check=True)
        hook = os.path.join(cls.dir, "warm")
        with open(hook, "w") as f:
            f.write("#!/bin/sh\necho 'no kernel today' >&2\nexit 3\n")
        for cmd in ("rm /etc/warren/warm", f"write {hook} /etc/warren/warm",
                    "sif /etc/warren/warm mode 0100755"):
            subprocess.run(["debugfs", "-w", "-R", cmd, img], check=True,
                           stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        cls.w = Warren({"pool_size": "1", "jail": "off", "default_template": TEMPLATE,
                        "pool_on_first_use": "false", "pool_max_mb": "4096"})
        cls.w.images = cls.dir
        cls.w.start()

    @classmethod
    def tearDownClass(cls):
        cls.w.cleanup()
        shutil.rmtree(cls.dir, ignore_errors=True)

    def test_pool_and_create_fail_with_the_hooks_reason(self):
        r = self.w.request("POST", "/v1/sandboxes", {"template": "code-interpreter-v1"})
        self.assertEqual(r.status, 409, r)
        err = r.json()["error"]
        self.assertEqual(err["code"], "sandbox_dead")
        self.assertIn("warm_failed: /etc/warren/warm exited 3: no kernel today", err["message"])
        deadline = time.time() + 300
        want = "its sync session failed: /etc/warren/warm exited 3: no kernel today"
        while want not in self.w.log_all() and time.time() < deadline:
            time.sleep(1)
        self.assertIn(want, self.w.log_all())
        p = self.w.request("GET", "/healthz").json()["pool"]
        self.assertNotEqual(p["state"], "ready", p)


if __name__ == "__main__":
    unittest.main()
