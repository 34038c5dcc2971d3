"""Raw HTTP/2 for the gRPC hardening tests: frames built by hand with struct, a minimal HPACK
encoder (literal fields without Huffman, indexed fields), and a client connection that reads
frames until the one expected arrives or the connection closes (a socket timeout bounds it).

Stdlib only (no h2/hpack packages). The server's HPACK is never decoded: tests look at frame
types, flags, stream ids, error codes and DATA payloads, none of which need it.
"""

import os
import socket
import struct
import threading
import time

PREFACE = b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n"

# Frame types (RFC 9113 §6).
DATA, HEADERS, PRIORITY, RST_STREAM, SETTINGS, PUSH_PROMISE, PING, GOAWAY, WINDOW_UPDATE, \
    CONTINUATION = range(10)
TYPE_NAMES = {DATA: "DATA", HEADERS: "HEADERS", PRIORITY: "PRIORITY", RST_STREAM: "RST_STREAM",
              SETTINGS: "SETTINGS", PUSH_PROMISE: "PUSH_PROMISE", PING: "PING", GOAWAY: "GOAWAY",
              WINDOW_UPDATE: "WINDOW_UPDATE", CONTINUATION: "CONTINUATION"}

# Flags.
END_STREAM = 0x1
ACK = 0x1
END_HEADERS = 0x4
PADDED = 0x8

# Error codes (RFC 9113 §7).
NO_ERROR = 0x0
PROTOCOL_ERROR = 0x1
INTERNAL_ERROR = 0x2
FLOW_CONTROL_ERROR = 0x3
SETTINGS_TIMEOUT = 0x4
STREAM_CLOSED = 0x5
FRAME_SIZE_ERROR = 0x6
REFUSED_STREAM = 0x7
CANCEL = 0x8
COMPRESSION_ERROR = 0x9
CONNECT_ERROR = 0xa
ENHANCE_YOUR_CALM = 0xb
INADEQUATE_SECURITY = 0xc
HTTP_1_1_REQUIRED = 0xd
ERROR_NAMES = {NO_ERROR: "NO_ERROR", PROTOCOL_ERROR: "PROTOCOL_ERROR",
               INTERNAL_ERROR: "INTERNAL_ERROR", FLOW_CONTROL_ERROR: "FLOW_CONTROL_ERROR",
               SETTINGS_TIMEOUT: "SETTINGS_TIMEOUT", STREAM_CLOSED: "STREAM_CLOSED",
               FRAME_SIZE_ERROR: "FRAME_SIZE_ERROR", REFUSED_STREAM: "REFUSED_STREAM",
               CANCEL: "CANCEL", COMPRESSION_ERROR: "COMPRESSION_ERROR",
               CONNECT_ERROR: "CONNECT_ERROR", ENHANCE_YOUR_CALM: "ENHANCE_YOUR_CALM",
               INADEQUATE_SECURITY: "INADEQUATE_SECURITY", HTTP_1_1_REQUIRED: "HTTP_1_1_REQUIRED"}

# SETTINGS identifiers.
SETTINGS_HEADER_TABLE_SIZE = 0x1
SETTINGS_ENABLE_PUSH = 0x2
SETTINGS_MAX_CONCURRENT_STREAMS = 0x3
SETTINGS_INITIAL_WINDOW_SIZE = 0x4
SETTINGS_MAX_FRAME_SIZE = 0x5
SETTINGS_MAX_HEADER_LIST_SIZE = 0x6

MAX_WINDOW = 2 ** 31 - 1
DEFAULT_WINDOW = 65535


def error_name(code):
    return ERROR_NAMES.get(code, "0x%x" % code)


# --- frames ------------------------------------------------------------------------------------
def frame(ftype, flags, sid, payload=b""):
    n = len(payload)
    return struct.pack(">BHBBI", (n >> 16) & 0xff, n & 0xffff, ftype, flags, sid & 0x7fffffff) + payload


def settings(entries=(), ack=False):
    payload = b"".join(struct.pack(">HI", k, v) for k, v in entries)
    return frame(SETTINGS, ACK if ack else 0, 0, payload)


def settings_ack():
    return settings(ack=True)


def ping(opaque=b"\0" * 8, ack=False):
    return frame(PING, ACK if ack else 0, 0, opaque)


def window_update(sid, increment):
    return frame(WINDOW_UPDATE, 0, sid, struct.pack(">I", increment & 0x7fffffff))


def rst_stream(sid, code):
    return frame(RST_STREAM, 0, sid, struct.pack(">I", code))


def goaway(last_sid, code, debug=b""):
    return frame(GOAWAY, 0, 0, struct.pack(">II", last_sid, code) + debug)


def data(sid, payload=b"", end_stream=False):
    return frame(DATA, END_STREAM if end_stream else 0, sid, payload)


def headers(sid, block, end_stream=False, end_headers=True):
    flags = (END_STREAM if end_stream else 0) | (END_HEADERS if end_headers else 0)
    return frame(HEADERS, flags, sid, block)


def continuation(sid, block, end_headers=False):
    return frame(CONTINUATION, END_HEADERS if end_headers else 0, sid, block)


def count_frames(buf):
    """How many frames a byte string of whole frames holds."""
    n, i = 0, 0
    while i + 9 <= len(buf):
        i += 9 + ((buf[i] << 16) | (buf[i + 1] << 8) | buf[i + 2])
        n += 1
    return n


def grpc_message(payload):
    """A gRPC length-prefixed message (uncompressed)."""
    return struct.pack(">BI", 0, len(payload)) + payload


# --- HPACK (RFC 7541), encoder only, no Huffman ------------------------------------------------
def hpack_int(value, prefix_bits, first_byte_flags=0):
    limit = (1 << prefix_bits) - 1
    if value < limit:
        return bytes([first_byte_flags | value])
    out = bytearray([first_byte_flags | limit])
    value -= limit
    while value >= 128:
        out.append((value & 0x7f) | 0x80)
        value >>= 7
    out.append(value)
    return bytes(out)


def hpack_str(s):
    if isinstance(s, str):
        s = s.encode("latin-1")
    return hpack_int(len(s), 7, 0x00) + s  # H bit 0: no Huffman


def indexed(index):
    """Indexed header field (static 1..61, dynamic from 62): 0x80 | index."""
    return hpack_int(index, 7, 0x80)


def literal(name, value, index_name=None, incremental=False):
    """Literal header field without indexing (0x00) or with incremental indexing (0x40); the
    name either as a static/dynamic table index or as a literal string."""
    if incremental:
        prefix_bits, flags = 6, 0x40
    else:
        prefix_bits, flags = 4, 0x00
    if index_name:
        return hpack_int(index_name, prefix_bits, flags) + hpack_str(value)
    return bytes([flags]) + hpack_str(name) + hpack_str(value)


# Static table indexes used here (RFC 7541 Appendix A).
STATIC_AUTHORITY = 1
STATIC_METHOD_POST = 3
STATIC_PATH = 4
STATIC_SCHEME_HTTP = 6
STATIC_CONTENT_TYPE = 31
FIRST_DYNAMIC = 62


def grpc_request_block(path, authority="ingressd.test", extra=()):
    """A gRPC request's header block: :method POST, :scheme http, :path, :authority,
    content-type application/grpc, te trailers, then extra (name, value) literals."""
    out = [indexed(STATIC_METHOD_POST), indexed(STATIC_SCHEME_HTTP),
           literal(":path", path, index_name=STATIC_PATH),
           literal(":authority", authority, index_name=STATIC_AUTHORITY),
           literal("content-type", "application/grpc", index_name=STATIC_CONTENT_TYPE),
           literal("te", "trailers")]
    for name, value in extra:
        out.append(literal(name, value))
    return b"".join(out)


# --- a received frame --------------------------------------------------------------------------
class Frame:
    __slots__ = ("type", "flags", "sid", "payload")

    def __init__(self, ftype, flags, sid, payload):
        self.type, self.flags, self.sid, self.payload = ftype, flags, sid, payload

    @property
    def error_code(self):
        """RST_STREAM's or GOAWAY's error code."""
        if self.type == RST_STREAM:
            return struct.unpack(">I", self.payload[:4])[0]
        if self.type == GOAWAY:
            return struct.unpack(">I", self.payload[4:8])[0]
        raise ValueError("no error code in a %s frame" % TYPE_NAMES.get(self.type, self.type))

    @property
    def last_stream_id(self):
        return struct.unpack(">I", self.payload[:4])[0] & 0x7fffffff

    @property
    def debug_data(self):
        return self.payload[8:] if self.type == GOAWAY else b""

    def settings(self):
        return dict(struct.unpack(">HI", self.payload[i:i + 6])
                    for i in range(0, len(self.payload) - 5, 6))

    @property
    def increment(self):
        return struct.unpack(">I", self.payload[:4])[0] & 0x7fffffff

    def __repr__(self):
        name = TYPE_NAMES.get(self.type, "type%d" % self.type)
        extra = ""
        if self.type in (RST_STREAM, GOAWAY) and len(self.payload) >= 4:
            try:
                extra = " %s" % error_name(self.error_code)
            except struct.error:
                pass
            if self.type == GOAWAY:
                extra += " last=%d" % self.last_stream_id
                if self.debug_data:
                    extra += " debug=%r" % self.debug_data[:80]
        elif self.type == SETTINGS and not self.flags & ACK:
            extra = " %s" % self.settings()
        elif self.type == WINDOW_UPDATE and len(self.payload) >= 4:
            extra = " +%d" % self.increment
        elif self.type == DATA:
            extra = " %r" % self.payload[:60]
        return "%s(sid=%d flags=0x%x len=%d%s)" % (name, self.sid, self.flags, len(self.payload),
                                                   extra)


def summarize(frames, limit=40):
    """Frames as text for failure messages: repeated kinds collapsed."""
    out = []
    last, count = None, 0
    for f in frames:
        key = repr(f) if f.type not in (SETTINGS, PING, WINDOW_UPDATE) or not f.flags & ACK \
            else "%s ack" % TYPE_NAMES[f.type]
        if f.type == PING and f.flags & ACK:
            key = "PING ack"
        if key == last:
            count += 1
            continue
        if last is not None:
            out.append(last + (" x%d" % count if count > 1 else ""))
        last, count = key, 1
    if last is not None:
        out.append(last + (" x%d" % count if count > 1 else ""))
    if len(out) > limit:
        out = out[:limit // 2] + ["..."] + out[-limit // 2:]
    return "[" + ", ".join(out) + "]"


# --- a client connection -----------------------------------------------------------------------
class Conn:
    """A raw TCP connection speaking HTTP/2 frames. Reads are bounded by `timeout` (the socket
    timeout) per recv; every frame read is kept in `frames`; `closed` is the reason the read side
    ended (None while open: "eof", "reset" or "timeout")."""

    def __init__(self, host, port, timeout=10.0, rcvbuf=None):
        """rcvbuf: SO_RCVBUF set before connecting (a small one makes the server's writes block
        as soon as we stop reading)."""
        self.sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
        if rcvbuf:
            self.sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, rcvbuf)
        self.sock.settimeout(timeout)
        try:
            self.sock.connect((host, port))
        except BaseException:
            self.sock.close()
            raise
        self.sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        self.timeout = timeout
        self.buf = bytearray()
        self.frames = []
        self.closed = None
        self.send_error = None
        self.chunks_sent = 0  # by send_in_background
        self.senders = []

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()

    def close(self):
        for t in self.senders:
            t.join(self.timeout)
        try:
            self.sock.close()
        except OSError:
            pass

    def send(self, payload):
        """Sends all of payload; False (and send_error set) when the peer is gone."""
        try:
            self.sock.sendall(payload)
            return True
        except OSError as e:  # EPIPE, ECONNRESET, timeout: the daemon stopped taking bytes
            self.send_error = e
            return False

    def send_in_background(self, chunks):
        """Sends an iterable of byte chunks from a thread (the daemon may stop reading and close
        while we write: errors end the thread quietly, see send_error). Returns the thread."""
        def run():
            for chunk in chunks:
                if not self.send(chunk):
                    return
                self.chunks_sent += 1
        t = threading.Thread(target=run, daemon=True)
        t.start()
        self.senders.append(t)
        return t

    def start(self, client_settings=()):
        """Client preface + SETTINGS."""
        self.send(PREFACE + settings(client_settings))

    def _fill(self):
        try:
            chunk = self.sock.recv(65536)
        except socket.timeout:
            self.closed = "timeout"
            return False
        except ConnectionResetError:
            self.closed = "reset"
            return False
        except OSError as e:
            self.closed = "error %s" % e
            return False
        if not chunk:
            self.closed = "eof"
            return False
        self.buf += chunk
        return True

    def read_frame(self):
        """The next frame, or None once the connection is closed (or the read timed out)."""
        while True:
            if len(self.buf) >= 9:
                n = (self.buf[0] << 16) | (self.buf[1] << 8) | self.buf[2]
                if len(self.buf) >= 9 + n:
                    ftype, flags = self.buf[3], self.buf[4]
                    sid = struct.unpack(">I", bytes(self.buf[5:9]))[0] & 0x7fffffff
                    payload = bytes(self.buf[9:9 + n])
                    del self.buf[:9 + n]
                    f = Frame(ftype, flags, sid, payload)
                    self.frames.append(f)
                    return f
            if self.closed is not None or not self._fill():
                return None

    def read_until(self, predicate, on_frame=None):
        """Reads frames until predicate(frame) is true (that frame is returned) or the connection
        closes / a read times out (None). on_frame(frame) runs for every frame read."""
        while True:
            f = self.read_frame()
            if f is None:
                return None
            if on_frame is not None:
                on_frame(f)
            if predicate(f):
                return f

    def read_to_close(self, on_frame=None):
        """Reads until the connection closes or a read times out; returns the frames read."""
        start = len(self.frames)
        while True:
            f = self.read_frame()
            if f is None:
                return self.frames[start:]
            if on_frame is not None:
                on_frame(f)

    def server_settings(self):
        """Reads until the server's first (non-ack) SETTINGS frame; returns its entries or None."""
        f = self.read_until(lambda f: f.type == SETTINGS and not f.flags & ACK)
        return None if f is None else f.settings()

    def goaways(self):
        return [f for f in self.frames if f.type == GOAWAY]

    def rsts(self, sid=None):
        return [f for f in self.frames if f.type == RST_STREAM and (sid is None or f.sid == sid)]

    def describe(self):
        return "frames read: %s; closed: %s; send error: %r" % (
            summarize(self.frames), self.closed, self.send_error)


def auto_ack(conn):
    """An on_frame callback that answers the server's SETTINGS and PINGs as a well-behaved client
    does."""
    def on_frame(f):
        if f.type == SETTINGS and not f.flags & ACK:
            conn.send(settings_ack())
        elif f.type == PING and not f.flags & ACK:
            conn.send(ping(f.payload, ack=True))
    return on_frame


# --- process cost ------------------------------------------------------------------------------
def cpu_seconds(pid):
    """CPU time of a process, seconds: the sum over its threads of the scheduler's run time
    (/proc/<pid>/task/*/schedstat, nanoseconds), which unlike utime+stime in /proc/<pid>/stat
    (clock ticks, 10 ms) resolves a flood that costs a millisecond. Falls back to utime+stime."""
    total = 0
    try:
        for tid in os.listdir("/proc/%d/task" % pid):
            try:
                with open("/proc/%d/task/%s/schedstat" % (pid, tid)) as f:
                    total += int(f.read().split()[0])
            except (FileNotFoundError, ProcessLookupError):
                pass  # a thread that ended meanwhile
        return total / 1e9
    except FileNotFoundError:
        pass
    with open("/proc/%d/stat" % pid) as f:
        text = f.read()
    fields = text[text.rindex(")") + 2:].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")  # utime, stime


def rss_kib(pid):
    with open("/proc/%d/status" % pid) as f:
        for line in f:
            if line.startswith("VmRSS:"):
                return int(line.split()[1])
    raise AssertionError("no VmRSS for pid %d" % pid)


class Stopwatch:
    def __init__(self):
        self.t0 = time.monotonic()

    def elapsed(self):
        return time.monotonic() - self.t0


# --- a replica that never takes a byte -----------------------------------------------------------
class StallServer:
    """An HTTP/2 'replica' on host that accepts connections, announces
    SETTINGS_INITIAL_WINDOW_SIZE 0 and then reads and discards everything, answering nothing: a
    call routed to it can send no request byte upstream, so ingressd never consumes (and never
    reopens the window of) what the client sends on that call. Threads; stop() ends them."""

    def __init__(self, host):
        self.host = host
        self.lsock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
        self.lsock.bind((host, 0))
        self.lsock.listen(64)
        self.port = self.lsock.getsockname()[1]
        self.lock = threading.Lock()
        self.conns = []
        self.threads = []
        self.stopped = False
        t = threading.Thread(target=self._accept, daemon=True)
        t.start()
        self.threads.append(t)

    @property
    def key(self):
        return "%s:%d" % (self.host, self.port)

    def _accept(self):
        while True:
            try:
                conn, _ = self.lsock.accept()
            except OSError:
                return
            with self.lock:
                if self.stopped:
                    conn.close()
                    return
                self.conns.append(conn)
                t = threading.Thread(target=self._drain, args=(conn,), daemon=True)
                self.threads.append(t)
            try:
                conn.sendall(settings([(SETTINGS_INITIAL_WINDOW_SIZE, 0)]))
            except OSError:
                pass
            t.start()

    @staticmethod
    def _drain(conn):
        try:
            while conn.recv(65536):
                pass
        except OSError:
            pass

    def stop(self):
        with self.lock:
            self.stopped = True
            conns = list(self.conns)
            threads = list(self.threads)
        for s in [self.lsock] + conns:
            try:
                s.shutdown(socket.SHUT_RDWR)  # wakes accept() / recv() in the threads
            except OSError:
                pass
        for t in threads:
            t.join(5)
        for s in [self.lsock] + conns:
            s.close()
