"""A small HTTP/2 client over one cleartext (h2c, prior knowledge)
connection, written frame by frame so that a test can do what a library
will not: open many streams, send most of a body on each, and never end
them. It honours flow control (it sends no more than the windows the server
grants) and records what the server sends: SETTINGS, WINDOW_UPDATE,
RST_STREAM, GOAWAY, and the HEADERS/DATA of answers.

Used by tests/e2e/test_http_abuse.py and bench/request_bytes.py.
"""

import socket
import struct
import threading
import time

PREFACE = b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n"
DATA, HEADERS, RST_STREAM, SETTINGS, PING, GOAWAY, WINDOW_UPDATE = 0, 1, 3, 4, 6, 7, 8
END_STREAM, ACK, END_HEADERS = 0x1, 0x1, 0x4
REFUSED_STREAM = 7
FRAME_BYTES = 16384  # the default SETTINGS_MAX_FRAME_SIZE
DEFAULT_WINDOW = 65535


def frame(kind, flags, stream_id, payload=b""):
    return struct.pack(">I", len(payload))[1:] + struct.pack(">BBI", kind, flags, stream_id) + payload


def hpack_int(value, prefix_bits):
    limit = (1 << prefix_bits) - 1
    if value < limit:
        return bytes([value])
    out = [limit]
    value -= limit
    while value >= 128:
        out.append(value % 128 + 128)
        value //= 128
    out.append(value)
    return bytes(out)


def hpack_literal(name, value):
    """A header as a literal without indexing, new name, no Huffman."""
    name, value = name.encode(), value.encode()
    return b"\x00" + hpack_int(len(name), 7) + name + hpack_int(len(value), 7) + value


class H2Connection:
    """One connection; a reader thread keeps the windows and the record."""

    def __init__(self, port, host="127.0.0.1", timeout=30):
        self.sock = socket.create_connection((host, port), timeout=timeout)
        self.lock = threading.Condition()
        self.send_lock = threading.Lock()  # whole frames: two threads write
        self.next_id = 1
        self.conn_window = DEFAULT_WINDOW
        self.initial_window = DEFAULT_WINDOW
        self.windows = {}
        self.reset = {}        # stream id -> error code
        self.goaway = None     # error code
        self.closed = False
        self.answers = {}      # stream id -> {"headers": bytes, "data": bytes, "ended": bool}
        self._send(PREFACE + frame(SETTINGS, 0, 0))
        self.reader = threading.Thread(target=self._read, daemon=True)
        self.reader.start()

    def _send(self, data):
        with self.send_lock:
            self.sock.sendall(data)

    # --- receiving ----------------------------------------------------
    def _recv_exactly(self, n):
        buf = b""
        while len(buf) < n:
            chunk = self.sock.recv(n - len(buf))
            if not chunk:
                raise ConnectionError("closed")
            buf += chunk
        return buf

    def _read(self):
        try:
            self.sock.settimeout(None)
            while True:
                head = self._recv_exactly(9)
                length = struct.unpack(">I", b"\x00" + head[:3])[0]
                kind, flags, stream_id = struct.unpack(">BBI", head[3:])
                stream_id &= 0x7FFFFFFF
                payload = self._recv_exactly(length) if length else b""
                self._on_frame(kind, flags, stream_id, payload)
        except OSError:
            pass
        with self.lock:
            self.closed = True
            self.lock.notify_all()

    def _on_frame(self, kind, flags, stream_id, payload):
        with self.lock:
            if kind == SETTINGS and not flags & ACK:
                for i in range(0, len(payload), 6):
                    key, value = struct.unpack(">HI", payload[i:i + 6])
                    if key == 4:  # SETTINGS_INITIAL_WINDOW_SIZE: every stream moves by the change
                        for sid in self.windows:
                            self.windows[sid] += value - self.initial_window
                        self.initial_window = value
                self._send(frame(SETTINGS, ACK, 0))
            elif kind == PING and not flags & ACK:
                self._send(frame(PING, ACK, 0, payload))
            elif kind == WINDOW_UPDATE:
                increment = struct.unpack(">I", payload)[0] & 0x7FFFFFFF
                if stream_id == 0:
                    self.conn_window += increment
                elif stream_id in self.windows:
                    self.windows[stream_id] += increment
            elif kind == RST_STREAM:
                # The first reset says why; DATA already in flight to a
                # reset stream draws STREAM_CLOSED after it.
                self.reset.setdefault(stream_id, struct.unpack(">I", payload)[0])
            elif kind == GOAWAY:
                self.goaway = struct.unpack(">II", payload[:8])[1]
            elif kind in (HEADERS, DATA):
                answer = self.answers.setdefault(stream_id, {"headers": b"", "data": b"", "ended": False})
                answer["headers" if kind == HEADERS else "data"] += payload
                if flags & END_STREAM:
                    answer["ended"] = True
                if kind == DATA and payload:  # give the window back at once
                    inc = struct.pack(">I", len(payload))
                    self._send(frame(WINDOW_UPDATE, 0, 0, inc) + frame(WINDOW_UPDATE, 0, stream_id, inc))
            self.lock.notify_all()

    # --- sending ------------------------------------------------------
    def open(self, method, path, end_stream=False, headers=()):
        """Sends HEADERS for a new stream; returns its id."""
        with self.lock:
            stream_id = self.next_id
            self.next_id += 2
            self.windows[stream_id] = self.initial_window
            block = b"".join(hpack_literal(k, v) for k, v in
                             [(":method", method), (":scheme", "http"), (":path", path),
                              (":authority", "localhost")] + list(headers))
            flags = END_HEADERS | (END_STREAM if end_stream else 0)
            self._send(frame(HEADERS, flags, stream_id, block))
        return stream_id

    def send_body(self, stream_id, nbytes, timeout=30, first=b""):
        """Sends nbytes of body on the stream (starting with `first`, then
        "x"s), as the windows allow, without ending it. Returns the bytes
        sent: fewer when the stream was reset, the connection went away, or
        the windows stayed shut for `timeout` seconds."""
        chunk = b"x" * FRAME_BYTES
        sent = 0
        deadline = time.monotonic() + timeout
        while sent < nbytes:
            with self.lock:
                while True:
                    if stream_id in self.reset or self.closed or self.goaway is not None:
                        return sent
                    room = min(self.conn_window, self.windows[stream_id], nbytes - sent)
                    if room > 0:
                        break
                    if not self.lock.wait(max(0.0, deadline - time.monotonic())):
                        return sent
                # Up to 64 frames per write: a window's worth goes in few calls.
                n = min(room, 64 * FRAME_BYTES)
                self.conn_window -= n
                self.windows[stream_id] -= n
            frames = []
            at = sent
            while at < sent + n:
                size = min(sent + n - at, FRAME_BYTES)
                head = first[at:at + size]
                frames.append(frame(DATA, 0, stream_id, head + chunk[:size - len(head)]))
                at += size
            try:
                self._send(b"".join(frames))
            except OSError:
                return sent
            sent += n
        return sent

    def get(self, path, timeout=30):
        """A GET on a new stream of this connection; returns (status, body)."""
        stream_id = self.open("GET", path, end_stream=True)
        with self.lock:
            ok = self.lock.wait_for(lambda: self.answers.get(stream_id, {}).get("ended")
                                    or stream_id in self.reset or self.closed, timeout)
            if not ok or stream_id not in self.answers:
                raise ConnectionError("no answer on stream %d" % stream_id)
            answer = self.answers[stream_id]
        # h2o's first answer names ":status" by its static-table index
        # (0x88 is 200); anything else is not a 200.
        status = 200 if answer["headers"][:1] == b"\x88" else None
        return status, answer["data"]

    def refused(self):
        """Streams the server reset with REFUSED_STREAM."""
        with self.lock:
            return sorted(sid for sid, code in self.reset.items() if code == REFUSED_STREAM)

    def close(self):
        try:
            self.sock.close()
        except OSError:
            pass
