"""kerneld's own pieces that need no VM (images/code-interpreter/kerneld.py runs in the
guest; the rest of it is tested there, by test_kernel and the code doors): its own-code
requests (silent) with a kernel that loses a request or never answers, and the
diagnosis of a kernel that stopped answering. Needs Debian's jupyter_client
(/usr/bin/python3)."""
import asyncio
import importlib.util
import os
import subprocess
import sys
import tempfile
import time
import types
import unittest

from jupyter_client.session import Session

HERE = os.path.dirname(os.path.abspath(__file__))
SRC = os.path.join(HERE, "..", "..", "images", "code-interpreter", "kerneld.py")
spec = importlib.util.spec_from_file_location("kerneld", SRC)
kerneld = importlib.util.module_from_spec(spec)
spec.loader.exec_module(kerneld)


def fake_ctx(answer):
    """A context whose kernel answers the requests answer(n) says yes to (n from 1): a
    busy status, then an ok execute_reply, as ipykernel sends them."""
    ctx = types.SimpleNamespace(km=types.SimpleNamespace(session=Session(key=b"k")),
                                waiters={}, id="t", sent=[])

    def send(ch, msg):
        ctx.sent.append(msg["header"]["msg_id"])
        if not answer(len(ctx.sent)):
            return
        q = ctx.waiters[msg["header"]["msg_id"]]
        loop = asyncio.get_running_loop()
        loop.call_later(0.05, q.put_nowait, ("iopub", {"msg_type": "status"}))
        loop.call_later(0.1, q.put_nowait,
                        ("shell", {"msg_type": "execute_reply", "content": {"status": "ok"}}))
    ctx.send = send
    return ctx


def silent(ctx, **kw):
    return asyncio.run(kerneld.PyContext.silent(ctx, "import os", **kw))


class SilentTest(unittest.TestCase):
    def test_answered(self):
        ctx = fake_ctx(lambda n: True)
        self.assertTrue(silent(ctx, timeout=5.0, resend_after=1.0))
        self.assertEqual((len(ctx.sent), ctx.waiters), (1, {}))

    def test_lost_request_is_sent_again(self):
        ctx = fake_ctx(lambda n: n > 1)
        self.assertTrue(silent(ctx, timeout=5.0, resend_after=0.3))
        self.assertEqual((len(ctx.sent), ctx.waiters), (2, {}))

    def test_not_sent_again_without_resend(self):
        ctx = fake_ctx(lambda n: n > 1)
        self.assertFalse(silent(ctx, timeout=0.5))
        self.assertEqual(len(ctx.sent), 1)
        self.assertEqual(ctx.silent_why, "no reply within 0 s (1 requests)")

    def test_never_answered_gives_up_at_the_deadline(self):
        ctx = fake_ctx(lambda n: False)
        t0 = time.monotonic()
        self.assertFalse(silent(ctx, timeout=2.0, resend_after=0.3))
        # four requests at most, and the whole timeout waited, not cut short by them
        self.assertEqual(len(ctx.sent), 4)
        self.assertGreaterEqual(time.monotonic() - t0, 1.9)
        self.assertEqual(ctx.silent_why, "no reply within 2 s (4 requests)")
        self.assertEqual(ctx.waiters, {})

    def test_failed_code_says_why(self):
        ctx = fake_ctx(lambda n: False)

        def send(ch, msg):
            ctx.sent.append(1)
            ctx.waiters[msg["header"]["msg_id"]].put_nowait(
                ("shell", {"msg_type": "execute_reply",
                           "content": {"status": "error", "ename": "ImportError",
                                       "evalue": "no numpy"}}))
        ctx.send = send
        self.assertFalse(silent(ctx, timeout=5.0, resend_after=0.3))
        self.assertEqual(ctx.silent_why, "ImportError: no numpy")


class DiagnoseTest(unittest.TestCase):
    def test_a_waiting_process(self):
        with tempfile.NamedTemporaryFile() as log:
            kerneld.LOG = log.name
            p = subprocess.Popen(
                [sys.executable, "-c",
                 "import time\ndef waits_here():\n    time.sleep(60)\nwaits_here()\n"],
                stderr=open(log.name, "ab"), env=dict(os.environ, PYTHONFAULTHANDLER="1"))
            time.sleep(1)
            ctx = types.SimpleNamespace(pid=p.pid, readers={}, reader_end={}, dropped={},
                                        socks={})
            got = asyncio.run(kerneld.PyContext.diagnose(ctx))
            p.wait(timeout=10)
        self.assertIn("kernel pid %d threads S:" % p.pid, got)
        self.assertIn("in waits_here", got)

    def test_a_gone_process(self):
        p = subprocess.Popen(["true"])
        p.wait()
        ctx = types.SimpleNamespace(pid=p.pid, readers={}, reader_end={}, dropped={}, socks={})
        self.assertEqual(asyncio.run(kerneld.PyContext.diagnose(ctx)),
                         "kernel pid %d is gone" % p.pid)


if __name__ == "__main__":
    unittest.main()
