"""Processes and PTYs that belong to the sandbox, over REST, against
real microVMs: a background exec outlives its request, its output is kept in
a ring inside the guest and read back byte-exact from any offset, stdin,
signals and PTY sizes reach it, and everything survives kill -9 of warrend."""
import base64
import json
import re
import time
import unittest

from warren import Warren, WarrenCase


def read_output(w, sid, pid, offset=0, follow=False, timeout=300):
    """GET .../output as NDJSON: the bytes (offsets checked contiguous), the lost count
    and the last line (exit or end)."""
    path = f"/v1/sandboxes/{sid}/processes/{pid}/output?offset={offset}"
    if follow:
        path += "&follow=true"
    r = w.request("GET", path, timeout=timeout)
    if r.status != 200:
        raise AssertionError(f"output of {pid}: {r}")
    data, lost, last, pos = b"", None, None, offset
    for line in r.body.splitlines():
        o = json.loads(line)
        if o["type"] == "lost":
            if data or lost is not None:
                raise AssertionError(f"lost after data: {o}")
            lost = o["bytes"]
            if o["offset"] != pos:
                raise AssertionError(f"lost at {o['offset']}, expected {pos}")
            pos += lost
        elif o["type"] in ("stdout", "stderr"):
            chunk = (o["data"].encode() if "data" in o else base64.b64decode(o["data_b64"]))
            if o["offset"] != pos:
                raise AssertionError(f"chunk at {o['offset']}, expected {pos}")
            pos += len(chunk)
            data += chunk
        elif o["type"] in ("exit", "end"):
            last = o
        else:
            raise AssertionError(f"unexpected line {o}")
    if last is None:
        raise AssertionError(f"no exit or end line in {r.body[-300:]!r}")
    if last["type"] == "end" and last["offset"] != pos:
        raise AssertionError(f"end at {last['offset']}, data ends at {pos}")
    return {"data": data, "lost": lost or 0, "last": last, "end": pos}


def start(w, sid, **body):
    r = w.request("POST", f"/v1/sandboxes/{sid}/exec", body)
    if r.status != 201:
        raise AssertionError(f"background exec failed: {r}")
    return r.json()["pid"]


def proc(w, sid, pid):
    r = w.request("GET", f"/v1/sandboxes/{sid}/processes/{pid}")
    if r.status != 200:
        raise AssertionError(f"GET process {pid}: {r}")
    return r.json()


def wait_proc(w, sid, pid, pred, what, timeout=60):
    deadline = time.time() + timeout
    while True:
        p = proc(w, sid, pid)
        if pred(p):
            return p
        if time.time() > deadline:
            raise AssertionError(f"process {pid} never {what}: {p}")
        time.sleep(0.2)


def wait_output(w, sid, pid, pattern, offset=0, timeout=60):
    """Read (not following) until the output from offset matches pattern."""
    deadline = time.time() + timeout
    while True:
        out = read_output(w, sid, pid, offset)
        text = out["data"].decode(errors="replace")
        if re.search(pattern, text):
            return out
        if time.time() > deadline:
            raise AssertionError(f"{pattern!r} never appeared in {text[-500:]!r}")
        time.sleep(0.2)


def stdin(w, sid, pid, **body):
    return w.request("POST", f"/v1/sandboxes/{sid}/processes/{pid}/stdin", body)


SEQ = "".join(f"{i}\n" for i in range(1, 2001)).encode()


class ProcessTest(WarrenCase):
    conf = {"process_ring_bytes": 65536}

    @classmethod
    def setUpClass(cls):
        super().setUpClass()
        cls.sid = cls.w.create()

    def test_background_exec_outlives_its_request(self):
        w, sid = self.w, self.sid
        pid = start(w, sid, cmd="seq 1 2000; while read l; do echo got:$l; done; "
                    "echo bye >&2; exit 3", background=True, tag="reader")
        self.assertGreater(pid, 1)
        # The request has ended; the process is still there, listed with its tag.
        p = wait_proc(w, sid, pid, lambda p: p["output_end"] >= len(SEQ), "printed its seq")
        self.assertTrue(p["running"], p)
        self.assertEqual(p["tag"], "reader")
        self.assertFalse(p["pty"])
        self.assertTrue(p["stdin_open"])
        listed = w.request("GET", f"/v1/sandboxes/{sid}/processes").json()["processes"]
        self.assertIn(pid, [q["pid"] for q in listed])
        # From 0, and again from a middle offset: byte-exact, ending where it stands.
        out = read_output(w, sid, pid, 0)
        self.assertEqual(out["data"], SEQ)
        self.assertEqual(out["lost"], 0)
        self.assertEqual(out["last"], {"type": "end", "offset": len(SEQ)})
        self.assertEqual(read_output(w, sid, pid, 1234)["data"], SEQ[1234:])
        # stdin sent later reaches it.
        self.assertEqual(stdin(w, sid, pid, data="hello\n").status, 200)
        self.assertEqual(stdin(w, sid, pid, data_b64=base64.b64encode(b"\xffbin\n").decode())
                         .status, 200)
        wait_output(w, sid, pid, "got:hello\n", offset=len(SEQ))
        # eof: the loop ends, writes to stderr and exits 3; follow returns at the exit.
        self.assertEqual(stdin(w, sid, pid, eof=True).status, 200)
        out = read_output(w, sid, pid, len(SEQ), follow=True)
        self.assertEqual(out["data"], b"got:hello\ngot:\xffbin\nbye\n")
        self.assertEqual(out["last"]["type"], "exit")
        self.assertEqual(out["last"]["exit_code"], 3)
        self.assertIsNone(out["last"]["signal"])
        p = proc(w, sid, pid)
        self.assertFalse(p["running"])
        self.assertEqual((p["exit_code"], p["signal"]), (3, None))
        self.assertError(stdin(w, sid, pid, data="late\n"), 409, "stdin_closed")
        # After the exit, the output is still there.
        self.assertEqual(read_output(w, sid, pid, 0)["data"][:len(SEQ)], SEQ)

    def test_stderr_is_tagged_in_the_shared_offsets(self):
        w, sid = self.w, self.sid
        pid = start(w, sid, cmd="echo out; echo err >&2; echo out2", background=True)
        r = w.request("GET", f"/v1/sandboxes/{sid}/processes/{pid}/output?follow=true")
        lines = [json.loads(x) for x in r.body.splitlines()]
        chunks = [o for o in lines if o["type"] in ("stdout", "stderr")]
        # One offset space: each chunk starts where the one before ended, whatever its fd
        # (the order between the two pipes is the order the guest read them in).
        pos = 0
        for o in chunks:
            self.assertEqual(o["offset"], pos, lines)
            pos += len(o["data"])
        by = {k: "".join(o["data"] for o in chunks if o["type"] == k) for k in ("stdout", "stderr")}
        self.assertEqual(by, {"stdout": "out\nout2\n", "stderr": "err\n"})
        self.assertEqual(lines[-1]["type"], "exit")

    def test_signal_ends_it_with_the_right_status(self):
        w, sid = self.w, self.sid
        pid = start(w, sid, cmd="sleep 1000", background=True)
        r = w.request("POST", f"/v1/sandboxes/{sid}/processes/{pid}/signal",
                      {"signal": "SIGTERM"})
        self.assertEqual(r.status, 200, r)
        p = wait_proc(w, sid, pid, lambda p: not p["running"], "ended")
        self.assertEqual((p["exit_code"], p["signal"]), (143, 15))
        out = read_output(w, sid, pid, 0, follow=True)
        self.assertEqual((out["last"]["type"], out["last"]["signal"]), ("exit", 15))
        r = w.request("POST", f"/v1/sandboxes/{sid}/processes/{pid}/signal", {"signal": 9})
        self.assertError(r, 409, "process_exited")

    def test_bad_requests(self):
        w, sid = self.w, self.sid
        self.assertError(w.request("GET", f"/v1/sandboxes/{sid}/processes/999999"), 404,
                         "process_not_found")
        self.assertError(w.request("GET", f"/v1/sandboxes/{sid}/processes/999999/output"), 404,
                         "process_not_found")
        pid = start(w, sid, cmd="echo short", background=True)
        wait_proc(w, sid, pid, lambda p: not p["running"], "ended")
        self.assertError(w.request(
            "GET", f"/v1/sandboxes/{sid}/processes/{pid}/output?offset=100"), 400, "bad_offset")
        self.assertError(w.request("POST", f"/v1/sandboxes/{sid}/processes/{pid}/resize",
                                   {"cols": 10, "rows": 10}), 400, "not_a_pty")
        self.assertError(w.request("POST", f"/v1/sandboxes/{sid}/processes/{pid}/signal",
                                   {"signal": "SIGNOPE"}), 400)
        self.assertError(w.request("POST", f"/v1/sandboxes/{sid}/exec",
                                   {"cmd": "cat", "background": True, "stdin": "x"}), 400)
        self.assertError(w.request("POST", f"/v1/sandboxes/{sid}/exec",
                                   {"pty": {"cols": 0, "rows": 10}}), 400)
        self.assertError(w.request("POST", f"/v1/sandboxes/{sid}/exec",
                                   {"cmd": "true", "background": "yes"}), 400)
        self.assertError(stdin(w, sid, pid, data="x", data_b64="eA=="), 400)

    def test_pty_size_resize_and_echo(self):
        w, sid = self.w, self.sid
        # The size is set before the program starts: its first output already has it.
        first = start(w, sid, cmd="stty size; sleep 1000", pty={"cols": 100, "rows": 30})
        out = wait_output(w, sid, first, r"\n")
        self.assertTrue(out["data"].startswith(b"30 100\r\n"), out["data"])
        self.assertTrue(proc(w, sid, first)["pty"])
        # A login shell: input echoes, stty follows a resize.
        pid = start(w, sid, pty={"cols": 80, "rows": 24}, tag="shell")
        p = proc(w, sid, pid)
        self.assertEqual((p["cols"], p["rows"], p["tag"]), (80, 24, "shell"))
        self.assertEqual(stdin(w, sid, pid, data="stty size; echo $TERM\n").status, 200)
        wait_output(w, sid, pid, r"24 80\r\nxterm-256color\r\n")
        r = w.request("POST", f"/v1/sandboxes/{sid}/processes/{pid}/resize",
                      {"cols": 50, "rows": 20})
        self.assertEqual(r.status, 200, r)
        self.assertEqual((proc(w, sid, pid)["cols"], proc(w, sid, pid)["rows"]), (50, 20))
        self.assertEqual(stdin(w, sid, pid, data="stty size\n").status, 200)
        wait_output(w, sid, pid, r"20 50\r\n")
        # The typed line is echoed by the terminal, then the command's answer.
        self.assertEqual(stdin(w, sid, pid, data="echo hi-$((6*7))\n").status, 200)
        out = wait_output(w, sid, pid, r"\nhi-42\r\n")
        self.assertIn(b"echo hi-$((6*7))", out["data"])
        # eof is ^D: the shell exits.
        self.assertEqual(stdin(w, sid, pid, eof=True).status, 200)
        wait_proc(w, sid, pid, lambda p: not p["running"], "exited on ^D")

    def test_ring_that_wrapped_reports_exactly_what_was_lost(self):
        w, sid = self.w, self.sid
        expected = "".join(f"{i}\n" for i in range(1, 60001)).encode()  # 348,894 bytes
        pid = start(w, sid, cmd="seq 1 60000", background=True)
        p = wait_proc(w, sid, pid, lambda p: not p["running"], "ended")
        self.assertEqual(p["output_end"], len(expected))
        self.assertGreater(p["output_start"], 0)
        for frm in (0, 1000, p["output_start"]):
            out = read_output(w, sid, pid, frm)
            self.assertEqual(out["lost"], p["output_start"] - frm)
            self.assertEqual(frm + out["lost"] + len(out["data"]), len(expected))
            self.assertEqual(out["data"], expected[p["output_start"]:])
            self.assertEqual(out["last"]["type"], "exit")
        # The ring is bounded by process_ring_bytes (65536 here).
        self.assertLessEqual(len(expected) - p["output_start"], 65536)

    def test_reader_that_falls_behind_is_told_what_it_missed(self):
        """A follower that stops reading while the process writes far past the ring: the
        process runs to its end regardless; when the reader resumes, a lost line says how
        many bytes it missed and every byte it does get sits at its true offset."""
        w, sid = self.w, self.sid
        expected = "".join(f"{i}\n" for i in range(1, 1200001)).encode()  # 8,888,896 bytes
        pid = start(w, sid, cmd="sleep 2; seq 1 1200000", background=True)
        # A small receive window: the bytes in flight are then warrend's queue (one credit
        # window) and little more.
        s = w.raw_request("GET", f"/v1/sandboxes/{sid}/processes/{pid}/output?follow=true",
                          rcvbuf=4096)
        # Not reading while it writes: the process must still finish.
        wait_proc(w, sid, pid, lambda p: not p["running"], "finished unread", timeout=180)
        raw = b""
        s.settimeout(120)
        while not raw.endswith(b"0\r\n\r\n"):
            chunk = s.recv(1 << 20)
            if not chunk:
                break
            raw += chunk
        s.close()
        body = raw.split(b"\r\n\r\n", 1)[1]
        # De-chunk.
        lines, rest = b"", body
        while rest:
            size, rest = rest.split(b"\r\n", 1)
            n = int(size, 16)
            if n == 0:
                break
            lines += rest[:n]
            rest = rest[n + 2:]
        events = [json.loads(x) for x in lines.splitlines()]
        lost = [e for e in events if e["type"] == "lost"]
        self.assertTrue(lost, f"a reader that fell behind 8 MB must be told it lost bytes "
                        f"({len(events)} lines, {len(lines)} bytes)")
        pos, got = 0, 0
        for e in events:
            if e["type"] == "lost":
                self.assertEqual(e["offset"], pos)
                pos += e["bytes"]
            elif e["type"] == "stdout":
                d = e["data"].encode()
                self.assertEqual(e["offset"], pos)
                self.assertEqual(d, expected[pos:pos + len(d)])
                pos += len(d)
                got += len(d)
        self.assertEqual(pos, len(expected))
        self.assertEqual(events[-1]["type"], "exit")
        self.assertEqual(sum(e["bytes"] for e in lost) + got, len(expected))

    def test_slow_reader_does_not_stall_the_process(self):
        """A background process writes far more than the ring and the credit window while
        nobody reads: it runs to the end (it never waits for a reader)."""
        w, sid = self.w, self.sid
        pid = start(w, sid, cmd="head -c 8000000 /dev/zero | tr '\\0' x; echo done",
                    background=True)
        p = wait_proc(w, sid, pid, lambda p: not p["running"], "finished", timeout=120)
        self.assertEqual((p["exit_code"], p["output_end"]), (0, 8000005))


class ProcessRestartTest(unittest.TestCase):
    def test_kill9_warrend_processes_and_pty_carry_on(self):
        w = Warren()
        try:
            w.start()
            sid = w.create()
            counter = start(w, sid, background=True, tag="counter",
                            cmd="i=0; while true; do echo $i; i=$((i+1)); sleep 0.1; done")
            shell = start(w, sid, pty={"cols": 80, "rows": 24})
            self.assertEqual(stdin(w, sid, shell, data="echo shell=$$\n").status, 200)
            before_pty = wait_output(w, sid, shell, r"shell=\d+\r\n")
            shell_pid = re.search(rb"shell=(\d+)\r\n", before_pty["data"]).group(1)
            self.assertEqual(int(shell_pid), shell)
            first = wait_output(w, sid, counter, r"\n5\n")
            w.kill9()
            w.start()
            deadline = time.time() + 60
            while True:
                r = w.request("GET", f"/v1/sandboxes/{sid}/processes")
                if r.status == 200 or time.time() > deadline:
                    break
                self.assertEqual(r.status, 503, r)  # reconnecting to the guest
                time.sleep(0.1)
            self.assertEqual(r.status, 200, r)
            procs = {p["pid"]: p for p in r.json()["processes"]}
            self.assertTrue(procs[counter]["running"] and procs[shell]["running"], procs)
            # The counter's output from where we stopped joins byte-exact, and it still counts.
            end1 = first["end"]
            rest = wait_output(w, sid, counter, r"\n\d+\n\d+\n", offset=end1)
            joined = (first["data"] + rest["data"]).decode()
            nums = [int(x) for x in joined.split("\n")[:-1]]
            self.assertEqual(nums, list(range(len(nums))))
            later = proc(w, sid, counter)["output_end"]
            wait_proc(w, sid, counter, lambda p: p["output_end"] > later, "kept counting")
            # The same shell answers.
            self.assertEqual(stdin(w, sid, shell, data="echo again=$$\n").status, 200)
            wait_output(w, sid, shell, r"again=%s\r\n" % shell_pid.decode(),
                        offset=before_pty["end"])
        finally:
            w.cleanup()


if __name__ == "__main__":
    unittest.main()
