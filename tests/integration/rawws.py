"""A WebSocket client on a bare socket, for the tests of the socket doors that a
library client cannot write: frames split into fragments as the test chooses (empty
ones included), close frames with any payload, a small receive buffer and no reading
at all. Frames from the client are masked, as RFC 6455 requires."""
import json
import os
import socket
import struct

T = 180  # seconds any single wait may take


class Closed(Exception):
    """The server closed the TCP connection (no close frame)."""


class RawWs:
    def __init__(self, w, path, proto, rcvbuf=None, timeout=T):
        s = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
        if rcvbuf:
            # Before connecting, so the TCP window stays that small.
            s.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, rcvbuf)
        s.settimeout(timeout)
        s.connect(("127.0.0.1", w.port))
        s.sendall((f"GET {path} HTTP/1.1\r\nHost: x\r\nUpgrade: websocket\r\n"
                   "Connection: Upgrade\r\nSec-WebSocket-Version: 13\r\n"
                   "Sec-WebSocket-Key: dGhlIHNhbXBsZSBub25jZQ==\r\n"
                   f"Sec-WebSocket-Protocol: {proto}\r\n"
                   f"Authorization: Bearer {w.key}\r\n\r\n").encode())
        self.s = s
        self.buf = b""
        while b"\r\n\r\n" not in self.buf:
            self._more()
        head, self.buf = self.buf.split(b"\r\n\r\n", 1)
        self.status_line = head.split(b"\r\n", 1)[0].decode()
        self.headers = {}
        for line in head.decode("latin-1").split("\r\n")[1:]:
            k, _, v = line.partition(":")
            self.headers[k.strip().lower()] = v.strip()
        self.status = int(self.status_line.split()[1])

    def _more(self):
        b = self.s.recv(65536)
        if not b:
            raise Closed()
        self.buf += b

    def _take(self, n):
        while len(self.buf) < n:
            self._more()
        out, self.buf = self.buf[:n], self.buf[n:]
        return out

    def send_frame(self, opcode, payload=b"", fin=True):
        mask = os.urandom(4)
        n = len(payload)
        h = bytes([(0x80 if fin else 0) | opcode])
        if n < 126:
            h += bytes([0x80 | n])
        elif n < 65536:
            h += bytes([0x80 | 126]) + struct.pack(">H", n)
        else:
            h += bytes([0x80 | 127]) + struct.pack(">Q", n)
        body = bytes(b ^ mask[i & 3] for i, b in enumerate(payload))
        self.s.sendall(h + mask + body)

    def send_fragments(self, pieces, opcode=0x2):
        """One message as len(pieces) frames: the first with opcode, the rest
        continuations, FIN on the last."""
        for i, p in enumerate(pieces):
            self.send_frame(opcode if i == 0 else 0x0, p, fin=i == len(pieces) - 1)

    def recv_frame(self):
        """(opcode, payload) of the next frame (fragments are not joined)."""
        b0, b1 = self._take(2)
        n = b1 & 0x7f
        if n == 126:
            n = struct.unpack(">H", self._take(2))[0]
        elif n == 127:
            n = struct.unpack(">Q", self._take(8))[0]
        return b0 & 0x0f, self._take(n)

    def until_close(self):
        """Read until the server's close frame: (code, reason), or None when the
        connection ended without one."""
        try:
            while True:
                op, p = self.recv_frame()
                if op == 0x8:
                    if len(p) < 2:
                        return (1005, "")
                    return struct.unpack(">H", p[:2])[0], p[2:].decode("utf-8", "replace")
        except (Closed, ConnectionResetError):
            return None

    def close(self):
        self.s.close()


def check_close_codes(test, w, path, proto, cases):
    """For each (payload, code) of cases, on a socket of its own: a client close frame
    with that payload is answered by the server's close frame with that code."""
    for payload, want in cases:
        c = RawWs(w, path, proto)
        try:
            test.assertEqual(c.status, 101, c.status_line)
            c.send_frame(0x8, payload)
            got = c.until_close()
            test.assertIsNotNone(got, payload)
            test.assertEqual(got[0], want, (payload, got))
        finally:
            c.close()


def refused(w, path, proto):
    """A raw upgrade that is refused: (status line, JSON body)."""
    s = socket.create_connection(("127.0.0.1", w.port), timeout=T)
    try:
        s.sendall((f"GET {path} HTTP/1.1\r\nHost: x\r\nUpgrade: websocket\r\n"
                   "Connection: Upgrade\r\nSec-WebSocket-Version: 13\r\n"
                   "Sec-WebSocket-Key: dGhlIHNhbXBsZSBub25jZQ==\r\n"
                   f"Sec-WebSocket-Protocol: {proto}\r\n"
                   f"Authorization: Bearer {w.key}\r\n\r\n").encode())
        buf = b""
        while True:
            b = s.recv(65536)
            if not b:
                break
            buf += b
            if b"\r\n\r\n" in buf:
                head, body = buf.split(b"\r\n\r\n", 1)
                cl = [int(l.split(b":")[1]) for l in head.split(b"\r\n")
                      if l.lower().startswith(b"content-length:")]
                if cl and len(body) >= cl[0]:
                    break
        head, _, body = buf.partition(b"\r\n\r\n")
        return head.split(b"\r\n", 1)[0].decode(), (json.loads(body) if body else None)
    finally:
        s.close()
