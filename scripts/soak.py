#!/usr/bin/env python3
"""Soak under faults (issue #21): the real ingressd in front of fake routers and replicas on
loopback, mixed load for minutes while routers and replicas are killed, hung, refused, added and
removed, the config is reloaded (valid and invalid) and smuggling-shaped requests arrive; then a
table of invariants, each a number, PASS or FAIL. Exit 0 when every invariant holds, 1 when one
does not, 2 on a usage or set-up error. Python 3 standard library only (Debian 12's python3).

    scripts/soak.py --short                       # about a minute (ctest: soak.short)
    scripts/soak.py                               # 600 s of load, the full soak
    scripts/soak.py --duration 1800 --json report.json --binary build/release/ingressd

Loopback only: ingressd is node 127.0.0.2 (--node-ip), fakes stand for nodes 127.0.0.2-127.0.0.9.
Every fake is its own process (this script with --fake), so a kill is a real SIGKILL. Every
process started here is stopped on exit, on failure and on Ctrl-C, and dies with this script
(PR_SET_PDEATHSIG) if it is killed. What each invariant means: docs/operations.md, "Soak"."""

import argparse
import asyncio
import ctypes
import hashlib
import json
import os
import random
import re
import shutil
import signal
import socket
import struct
import subprocess
import sys
import tempfile
import time
import traceback

SCRIPT = os.path.abspath(__file__)
REPO = os.path.dirname(os.path.dirname(SCRIPT))
NODE_IP = "127.0.0.2"
HEALTH_PATH = "/-/healthz"
PREFIX = {"llm": "/v1", "api": "/api"}
GENERATED_5XX_REASONS = {"router_unreachable", "router_non_200", "unparseable_replica_id", "unknown_replica_id",
                         "no_healthy_replica", "upstream_error", "upstream_timeout"}
REQUEST_TIMEOUT = 90.0      # a request not answered in this long is a hang (router.timeout is 5 s)
EVENT_TIMEOUT = 90.0        # waits for an event (a restart, a health mark, a reload) fail after this long

# Timings per mode. Fault lengths are schedule, not thresholds: every check waits for events.
PROFILES = {
    "short": dict(duration=60, warmup=5, first=2.0, gap=1.0, router_down=3.0, hang=7.0, replica_down=3.0,
                  refuse=3.0, clients=10),
    "full": dict(duration=600, warmup=20, first=10.0, gap=5.0, router_down=8.0, hang=10.0, replica_down=6.0,
                 refuse=6.0, clients=14),
}

# ingressd's config. A valid SIGHUP toggles router.hedge between auto and off, so that every
# other cycle hangs a router with hedging off (failover after router.timeout) and the others with
# hedging on (the late call is hedged to the other router).
CONFIG = """\
log_level: info
router:
  timeout: 5s
  hedge: {hedge}
upstream:
  connect_timeout: 2s
  first_byte_timeout: 60s
  idle_timeout: 60s
  retries: 3
client:
  max_body_bytes: 4MiB
health:
  interval: 1s
  fast_interval: 200ms
  fall: 2
  rise: 2
  timeout: 2s
drain:
  min_period: 0s
  timeout: 10s
"""
INVALID_CONFIG = CONFIG.replace("timeout: 5s", "timeout: five-seconds").format(hedge="auto")

_LIBC = ctypes.CDLL(None, use_errno=True)


def _child_setup():
    """In every child: its own process group (a Ctrl-C reaches only this script, which stops the
    children in order) and SIGKILL when this script dies, however it dies."""
    os.setpgrp()
    _LIBC.prctl(1, signal.SIGKILL, 0, 0, 0)  # PR_SET_PDEATHSIG


def now():
    return time.monotonic()


# =============================================================================================
# The fakes (run as `soak.py --fake router|replica ...`)
# =============================================================================================

class EventLog:
    """One line per event, `<monotonic time> <event> <fields...>`, appended with one write(2)
    each: what a SIGKILL leaves behind is every line written before it."""

    def __init__(self, path):
        self.fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o644)

    def __call__(self, *fields):
        os.write(self.fd, (" ".join([f"{now():.6f}"] + [str(f) for f in fields]) + "\n").encode())


async def read_request(reader):
    """(method, target, version, headers, body) or None at a clean end of the connection."""
    try:
        head = await reader.readuntil(b"\r\n\r\n")
    except asyncio.IncompleteReadError as e:
        if not e.partial:
            return None
        raise
    lines = head[:-4].decode("latin-1").split("\r\n")
    method, target, version = lines[0].split(" ", 2)
    headers = {}
    for line in lines[1:]:
        name, _, value = line.partition(":")
        headers[name.strip().lower()] = value.strip()
    body = b""
    if "chunked" in headers.get("transfer-encoding", "").lower():
        parts = []
        while True:
            size = int((await reader.readuntil(b"\r\n")).split(b";")[0].strip(), 16)
            if size == 0:
                while await reader.readuntil(b"\r\n") != b"\r\n":
                    pass
                break
            parts.append((await reader.readexactly(size + 2))[:-2])
        body = b"".join(parts)
    elif "content-length" in headers:
        body = await reader.readexactly(int(headers["content-length"]))
    return method, target, version, headers, body


def response_bytes(status, headers, body, keep):
    out = [f"HTTP/1.1 {status} {'OK' if status == 200 else 'Soak'}"]
    out += [f"{k}: {v}" for k, v in headers]
    out.append(f"Content-Length: {len(body)}")
    if not keep:
        out.append("Connection: close")
    return ("\r\n".join(out) + "\r\n\r\n").encode() + body


def chunk(data):
    return f"{len(data):x}\r\n".encode() + data + b"\r\n"


def wants_keepalive(version, headers):
    c = headers.get("connection", "").lower()
    return c != "close" if version == "HTTP/1.1" else c == "keep-alive"


class FakeServer:
    """The listener and control channel shared by both fakes: commands arrive on stdin, one per
    line, and each gets one line on stdout; EOF on stdin (this script is gone) ends the fake."""

    def __init__(self, args):
        self.args = args
        self.name = args.name
        self.log = EventLog(args.log)
        self.server = None
        self.port = args.port
        self.active = {}   # connection-local request key -> rid
        self.seq = 0

    async def listen(self):
        for attempt in range(100):
            try:
                self.server = await asyncio.start_server(self.connection, self.args.ip, self.port,
                                                         reuse_address=True, limit=1 << 20, backlog=512)
                break
            except OSError:
                if attempt == 99 or self.port == 0:
                    raise
                await asyncio.sleep(0.1)  # the same port again after a restart: wait for it
        self.port = self.server.sockets[0].getsockname()[1]

    async def main(self):
        await self.listen()
        self.log("start", self.port)
        loop = asyncio.get_running_loop()
        reader = asyncio.StreamReader()
        await loop.connect_read_pipe(lambda: asyncio.StreamReaderProtocol(reader), sys.stdin)
        os.write(1, f"READY {self.port}\n".encode())
        while True:
            line = await reader.readline()
            if not line:
                os._exit(0)
            words = line.decode().split(None, 1)
            reply = await self.command(words[0], words[1].strip() if len(words) > 1 else "")
            os.write(1, (reply + "\n").encode())

    async def command(self, word, rest):
        if word == "active":
            return json.dumps({"active": len(self.active), "rids": sorted(set(self.active.values()))})
        if word == "quit":
            os._exit(0)
        return "error unknown command"

    async def connection(self, reader, writer):
        writer.get_extra_info("socket").setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        try:
            while True:
                req = await read_request(reader)
                if req is None:
                    break
                method, target, version, headers, body = req
                keep = wants_keepalive(version, headers)
                self.seq += 1
                key = self.seq
                self.active[key] = headers.get("x-request-id", "-")
                try:
                    keep = await self.handle(reader, writer, method, target.split("?")[0], headers, body, keep)
                finally:
                    del self.active[key]
                if not keep:
                    break
        except (ConnectionError, asyncio.IncompleteReadError, asyncio.LimitOverrunError, ValueError, OSError):
            pass
        finally:
            writer.close()


class FakeRouter(FakeServer):
    """POST /internal/route as LLMRouter answers it (ray-serve-ingress.md §2.1,
    src/demo/router_server.cpp): 200 {"host", "port", "replica_id"}, round robin over the replica
    list it was given. `hang on`: requests are read and never answered (the connection stays open
    until the peer closes it)."""

    def __init__(self, args):
        super().__init__(args)
        self.replicas = json.loads(args.replicas or "[]")
        self.cursor = 0
        self.hang = False

    async def command(self, word, rest):
        if word == "replicas":
            self.replicas = json.loads(rest)
            return "ok"
        if word == "hang":
            self.hang = rest == "on"
            return "ok"
        return await super().command(word, rest)

    async def handle(self, reader, writer, method, path, headers, body, keep):
        rid = headers.get("x-request-id", "-")
        if path == "/internal/route" and method == "POST":
            if self.hang:
                self.log("hang", rid)
                while await reader.read(65536):
                    pass
                return False
            if not self.replicas:
                writer.write(response_bytes(503, [("Content-Type", "application/json")],
                                            b'{"detail":"No replicas available for the deployment."}', keep))
                return keep
            pick = self.replicas[self.cursor % len(self.replicas)]
            self.cursor += 1
            self.log("route", rid, pick["name"])
            reply = json.dumps({"host": pick["ip"], "port": pick["port"], "replica_id": pick["name"]}).encode()
            writer.write(response_bytes(200, [("Content-Type", "application/json")], reply, keep))
            await writer.drain()
            return keep
        if path == "/health":
            writer.write(response_bytes(200, [("Content-Type", "application/json")], b'{"status":"ok"}', keep))
            return keep
        writer.write(response_bytes(404, [("Content-Type", "application/json")], b'{"detail":"Not Found"}', keep))
        return keep


class FakeReplica(FakeServer):
    """A data-plane replica that says who it is (X-Served-By) and logs every request by its
    client-chosen X-Request-Id (`req`), so duplicates and arrivals are countable.
    POST /v1/chat/completions: an SSE stream, chunked, X-Soak-Events events (-1: until the peer
    leaves) every X-Soak-Interval-Ms, then `data: [DONE]` and the last chunk in one write, logged
    `final` before that write: a stream without `final` never had its end written. X-Soak-Cut: N
    aborts after N events (X-Soak-Cut-Mode fin or rst), logged `cut`. A peer that leaves
    mid-stream is logged `gone`. GET /api/status/NNN answers NNN. Anything else: a JSON echo (the
    replica, the id, how often this replica saw the id, the body's length and hash).
    `listen off|on` closes and reopens the listener (connections already open stay)."""

    async def command(self, word, rest):
        if word == "listen":
            if rest == "off" and self.server:
                self.server.close()
                self.server = None
                self.log("listen", "off")
            elif rest == "on" and not self.server:
                await self.listen()
                self.log("listen", "on")
            return "ok"
        return await super().command(word, rest)

    def __init__(self, args):
        super().__init__(args)
        self.counts = {}

    async def handle(self, reader, writer, method, path, headers, body, keep):
        if path == HEALTH_PATH:
            writer.write(response_bytes(200, [("Content-Type", "text/plain")], b"success", keep))
            return keep
        rid = headers.get("x-request-id", "-")
        n = self.counts[rid] = self.counts.get(rid, 0) + 1
        self.log("req", rid, method, path, len(body), n)
        served = [("X-Served-By", self.name)]
        if method == "POST" and path == "/v1/chat/completions":
            return await self.stream(reader, writer, rid, headers, served, keep)
        status = 200
        if path.startswith("/api/status/"):
            status = int(path.rsplit("/", 1)[1])
        echo = json.dumps({"replica": self.name, "rid": rid, "count": n, "method": method, "path": path,
                           "len": len(body), "sha": hashlib.sha256(body).hexdigest()[:16]}).encode()
        self.log("final", rid)
        writer.write(response_bytes(status, served + [("Content-Type", "application/json")], echo, keep))
        await writer.drain()
        return keep

    async def stream(self, reader, writer, rid, headers, served, keep):
        events = int(headers.get("x-soak-events", "10"))
        interval = int(headers.get("x-soak-interval-ms", "10")) / 1000.0
        cut = int(headers.get("x-soak-cut", "0"))
        head = ["HTTP/1.1 200 OK", "Content-Type: text/event-stream", "Transfer-Encoding: chunked"]
        head += [f"{k}: {v}" for k, v in served]
        if not keep:
            head.append("Connection: close")
        writer.write(("\r\n".join(head) + "\r\n\r\n").encode())
        i = 0
        try:
            while events < 0 or i < events:
                if reader.at_eof() or writer.is_closing():
                    self.log("gone", rid, i)
                    return False
                data = json.dumps({"rid": rid, "i": i, "replica": self.name}).encode()
                writer.write(chunk(b"data: " + data + b"\n\n"))
                await writer.drain()
                i += 1
                if cut and i == cut:
                    mode = headers.get("x-soak-cut-mode", "fin")
                    self.log("cut", rid, i, mode)
                    if mode == "rst":
                        writer.get_extra_info("socket").setsockopt(socket.SOL_SOCKET, socket.SO_LINGER,
                                                                   struct.pack("ii", 1, 0))
                        writer.transport.abort()
                    else:
                        writer.close()
                    return False
                await asyncio.sleep(interval)
        except (ConnectionError, OSError):
            self.log("gone", rid, i)
            return False
        self.log("final", rid)
        writer.write(chunk(b"data: [DONE]\n\n") + b"0\r\n\r\n")
        await writer.drain()
        return keep


def run_fake(args):
    cls = FakeRouter if args.fake == "router" else FakeReplica
    signal.signal(signal.SIGINT, signal.SIG_IGN)  # this script stops its fakes itself
    try:
        asyncio.run(cls(args).main())
    except KeyboardInterrupt:
        pass


# =============================================================================================
# The client side: raw sockets, so that every byte that arrived before a reset is kept
# =============================================================================================

class Conn:
    """A client connection. Reads keep what arrived before an error (asyncio's StreamReader
    drops buffered bytes once the connection is reset)."""

    def __init__(self, sock):
        self.sock = sock
        self.buf = bytearray()
        self.loop = asyncio.get_running_loop()

    @classmethod
    async def open(cls, addr):
        s = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
        s.setblocking(False)
        s.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        try:
            await asyncio.get_running_loop().sock_connect(s, addr)
        except BaseException:
            s.close()
            raise
        return cls(s)

    async def fill(self):
        data = await self.loop.sock_recv(self.sock, 65536)
        if not data:
            raise EOFError("connection closed")
        self.buf += data

    async def line(self):
        while True:
            i = self.buf.find(b"\n")
            if i >= 0:
                out = bytes(self.buf[:i + 1])
                del self.buf[:i + 1]
                return out
            if len(self.buf) > 1 << 20:
                raise ValueError("line too long")
            await self.fill()

    async def exact(self, n):
        while len(self.buf) < n:
            await self.fill()
        out = bytes(self.buf[:n])
        del self.buf[:n]
        return out

    async def until_close(self):
        try:
            while True:
                await self.fill()
        except EOFError:
            pass
        out = bytes(self.buf)
        self.buf.clear()
        return out

    async def send(self, data):
        await self.loop.sock_sendall(self.sock, data)

    def close(self):
        self.sock.close()

    def reset(self):
        try:
            self.sock.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
        except OSError:
            pass
        self.sock.close()


class Resp:
    def __init__(self):
        self.status = None
        self.headers = {}
        self.body = b""
        self.complete = False      # the framing said the body ended
        self.terminal = False      # chunked: the last chunk arrived
        self.aborted = False       # the client stopped reading on purpose
        self.error = None
        self.version = None

    def h(self, name):
        v = self.headers.get(name)
        return v[0] if v else None

    def keep_alive(self):
        c = (self.h("connection") or "").lower()
        return c != "close" if self.version == "HTTP/1.1" else c == "keep-alive"


async def read_response(conn, head_only=False, on_chunk=None):
    """Reads one response; errors end up in resp.error, with what arrived before them kept."""
    r = Resp()
    try:
        while True:
            line = (await conn.line()).decode("latin-1").rstrip("\r\n")
            parts = line.split(" ", 2)
            r.version, r.status = parts[0], int(parts[1])
            r.headers = {}
            while True:
                hl = (await conn.line()).decode("latin-1").rstrip("\r\n")
                if not hl:
                    break
                k, _, v = hl.partition(":")
                r.headers.setdefault(k.strip().lower(), []).append(v.strip())
            if 100 <= r.status < 200:
                continue
            break
        te = (r.h("transfer-encoding") or "").lower()
        if head_only or r.status in (204, 304):
            r.complete = True
        elif "chunked" in te:
            parts = []
            while True:
                size = int((await conn.line()).split(b";")[0].strip(), 16)
                if size == 0:
                    while (await conn.line()) not in (b"\r\n", b"\n"):
                        pass
                    r.terminal = True
                    break
                data = (await conn.exact(size + 2))[:-2]
                parts.append(data)
                if on_chunk and on_chunk(data):
                    r.aborted = True
                    break
            r.body = b"".join(parts)
            r.complete = r.terminal
        elif r.h("content-length") is not None:
            r.body = await conn.exact(int(r.h("content-length")))
            r.complete = True
        else:
            r.body = await conn.until_close()
            r.complete = True
    except (OSError, EOFError, ValueError, IndexError) as e:
        r.error = f"{type(e).__name__}: {e}"
    return r


async def http_get(addr, path, timeout=10.0):
    """A one-off GET (admin endpoints): (status, body)."""
    async def go():
        c = await Conn.open(addr)
        try:
            await c.send(f"GET {path} HTTP/1.1\r\nHost: soak\r\nConnection: close\r\n\r\n".encode())
            r = await read_response(c)
            if r.status is None or r.error:
                raise OSError(f"GET {path}: {r.error}")
            return r.status, r.body
        finally:
            c.close()
    return await asyncio.wait_for(go(), timeout)


def parse_prometheus(text):
    """[(name, {label: value}, float)] of a Prometheus text page."""
    out = []
    for line in text.splitlines():
        if not line or line.startswith("#"):
            continue
        m = re.match(r'^([a-zA-Z_:][a-zA-Z0-9_:]*)(\{(.*)\})?\s+(\S+)', line)
        if not m:
            continue
        labels = dict(re.findall(r'([a-zA-Z_][a-zA-Z0-9_]*)="((?:[^"\\]|\\.)*)"', m.group(3) or ""))
        try:
            out.append((m.group(1), labels, float(m.group(4))))
        except ValueError:
            pass
    return out


def metric_sum(samples, name, **match):
    return sum(v for n, l, v in samples if n == name and all(l.get(k) == x for k, x in match.items()))


# =============================================================================================
# Processes: fakes and the daemon
# =============================================================================================

class Fake:
    """A fake router or replica process, seen from here."""

    def __init__(self, run, role, name, ip, app):
        self.run, self.role, self.name, self.ip, self.app = run, role, name, ip, app
        self.port = 0
        self.proc = None
        self.transport = None
        self.reader = None
        self.lock = asyncio.Lock()
        self.slug = re.sub(r"[^A-Za-z0-9]+", "_", name)
        self.log_path = os.path.join(run.dir, f"{role}-{self.slug}.log")
        self.err_path = os.path.join(run.dir, f"{role}-{self.slug}.stderr")
        self.starts = 0

    def target(self):
        return {"ip": self.ip, "port": self.port, "instance_id": f"node-{self.ip}", "name": self.name}

    def alive(self):
        return self.proc is not None and self.proc.poll() is None

    async def start(self, replicas=None):
        argv = [sys.executable, SCRIPT, "--fake", self.role, "--name", self.name, "--ip", self.ip,
                "--port", str(self.port), "--log", self.log_path]
        if replicas is not None:
            argv += ["--replicas", json.dumps(replicas)]
        with open(self.err_path, "ab") as err:
            self.proc = subprocess.Popen(argv, stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=err,
                                         preexec_fn=_child_setup, close_fds=True)
        self.run.children.append(self.proc)
        loop = asyncio.get_running_loop()
        self.reader = asyncio.StreamReader()
        self.transport, _ = await loop.connect_read_pipe(lambda: asyncio.StreamReaderProtocol(self.reader),
                                                         self.proc.stdout)
        line = await asyncio.wait_for(self.reader.readline(), EVENT_TIMEOUT)
        if not line.startswith(b"READY "):
            raise SetupError(f"{self.role} {self.name} did not start: {line!r}; see {self.err_path}")
        self.port = int(line.split()[1])
        self.starts += 1

    async def cmd(self, text):
        async with self.lock:
            os.write(self.proc.stdin.fileno(), (text + "\n").encode())
            line = await asyncio.wait_for(self.reader.readline(), EVENT_TIMEOUT)
        if not line:
            raise SetupError(f"{self.name} exited (command {text!r})")
        return line.decode().strip()

    def _reap(self):
        if self.transport:
            self.transport.close()
            self.transport = None
        if self.proc:
            try:
                self.proc.stdin.close()
            except OSError:
                pass
            self.proc.wait()

    def kill(self):
        """SIGKILL: the kernel closes its sockets; nothing is flushed or said."""
        if self.alive():
            self.proc.kill()
        self._reap()

    def stop(self):
        if self.alive():
            self.proc.terminate()
            try:
                self.proc.wait(timeout=5)
            except subprocess.TimeoutExpired:
                self.proc.kill()
        self._reap()


class SetupError(Exception):
    pass


class Daemon:
    """The ingressd under test: a copy of the binary, a config file, a topology file."""

    LISTENING = re.compile(r"listening on 127\.0\.0\.2:(\d+) \(admin 127\.0\.0\.2:(\d+)\)")

    def __init__(self, run, binary):
        self.run = run
        self.binary = os.path.join(run.dir, "ingressd")
        shutil.copy2(binary, self.binary)  # someone may rebuild the original while this runs
        self.config = os.path.join(run.dir, "ingressd.yaml")
        self.log_path = os.path.join(run.dir, "ingressd.log")
        self.access_log = os.path.join(run.dir, "access.log")
        self.proc = None
        self.port = self.admin_port = None
        self.exit_code = None
        self.write_config(CONFIG.format(hedge="auto"))
        with open(self.binary, "rb") as f:
            blob = f.read()
        self.sanitizer = "ASan" if b"__asan_init" in blob else "TSan" if b"__tsan_init" in blob else None

    def write_config(self, text):
        tmp = self.config + ".tmp"
        with open(tmp, "w", encoding="utf-8") as f:
            f.write(text)
        os.replace(tmp, self.config)

    async def start(self, topology_file):
        env = dict(os.environ, GLIBC_TUNABLES="glibc.malloc.tcache_count=256")
        with open(self.log_path, "ab") as log:
            self.proc = subprocess.Popen([self.binary, "--config", self.config, "--topology-file", topology_file,
                                          "--listen", f"{NODE_IP}:0", "--admin-listen", f"{NODE_IP}:0",
                                          "--threads", "2", "--node-ip", NODE_IP, "--access-log", self.access_log],
                                         stdin=subprocess.DEVNULL, stdout=log, stderr=log, env=env,
                                         preexec_fn=_child_setup, close_fds=True)
        self.run.children.append(self.proc)
        deadline = now() + EVENT_TIMEOUT
        while now() < deadline:
            m = self.LISTENING.search(self.output())
            if m:
                self.port, self.admin_port = int(m.group(1)), int(m.group(2))
                return
            if self.proc.poll() is not None:
                break
            await asyncio.sleep(0.05)
        raise SetupError(f"ingressd did not start (exit {self.proc.poll()}):\n{self.output()[-3000:]}")

    def output(self):
        with open(self.log_path, encoding="utf-8", errors="replace") as f:
            return f.read()

    def alive(self):
        return self.proc is not None and self.proc.poll() is None

    @property
    def addr(self):
        return (NODE_IP, self.port)

    async def admin(self, path):
        status, body = await http_get((NODE_IP, self.admin_port), path)
        if status != 200:
            raise SetupError(f"admin {path} answered {status}")
        return body

    async def metrics(self):
        return parse_prometheus((await self.admin("/metrics")).decode())

    async def topology(self):
        return json.loads(await self.admin("/topology"))

    def hup(self):
        self.proc.send_signal(signal.SIGHUP)

    def rss(self):
        with open(f"/proc/{self.proc.pid}/status") as f:
            for line in f:
                if line.startswith("VmRSS:"):
                    return int(line.split()[1]) * 1024
        return 0

    def descriptors(self, fake_addrs, removed_addrs):
        """Open descriptors by kind. Sockets are classified from /proc/net/tcp: listeners, client
        connections (to the main port), pooled upstream connections (to a fake), the rest."""
        fds = {}
        fd_dir = f"/proc/{self.proc.pid}/fd"
        for fd in os.listdir(fd_dir):
            try:
                fds[fd] = os.readlink(os.path.join(fd_dir, fd))
            except OSError:
                pass
        tcp = {}
        for table in ("/proc/net/tcp", "/proc/net/tcp6"):
            try:
                with open(table) as f:
                    next(f)
                    for line in f:
                        p = line.split()
                        tcp[p[9]] = (_hexaddr(p[1]), _hexaddr(p[2]), p[3])
            except OSError:
                pass
        kinds = {"total": len(fds), "listener": 0, "client": 0, "upstream": 0, "upstream_close_wait": 0,
                 "upstream_to_removed": 0, "other_socket": 0, "non_socket": 0}
        for link in fds.values():
            m = re.match(r"socket:\[(\d+)\]", link)
            if not m:
                kinds["non_socket"] += 1
                continue
            entry = tcp.get(m.group(1))
            if not entry:
                kinds["other_socket"] += 1
                continue
            local, remote, state = entry
            if state == "0A":
                kinds["listener"] += 1
            elif local == (NODE_IP, self.port):
                kinds["client"] += 1
            elif remote in fake_addrs or remote in removed_addrs:
                kinds["upstream"] += 1
                if state == "08":
                    kinds["upstream_close_wait"] += 1
                if remote in removed_addrs:
                    kinds["upstream_to_removed"] += 1
            else:
                kinds["other_socket"] += 1
        kinds["not_pooled"] = kinds["total"] - kinds["upstream"]
        return kinds

    def stop(self):
        """SIGTERM (a drain; min_period 0) and the exit code, SIGKILL after 30 s."""
        if self.proc is None:
            return None
        if self.proc.poll() is None:
            self.proc.terminate()
            try:
                self.proc.wait(timeout=30)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()
        if self.exit_code is None:
            self.exit_code = self.proc.returncode
        return self.exit_code


def _hexaddr(text):
    ip, port = text.split(":")
    if len(ip) == 8:
        return socket.inet_ntoa(struct.pack("<I", int(ip, 16))), int(port, 16)
    return ip, int(port, 16)


# =============================================================================================
# The load
# =============================================================================================

# kind: (weight, app, method, routed?)
KINDS = {
    "stream":        (26, "llm"),   # SSE through the router path, read to the end
    "stream_cut":    (4,  "llm"),   # the replica aborts it after a few events (FIN or RST)
    "stream_abort":  (4,  "llm"),   # endless; the client leaves after 3 events (close or RST)
    "post_llm":      (16, "llm"),   # POST with a JSON body through the router path
    "post_api":      (12, "api"),   # POST with a body, app without routers
    "chunked_post":  (6,  "api"),   # POST with a chunked body
    "get_api":       (14, "api"),
    "get_llm":       (8,  "llm"),   # GET: not in router.methods, least-loaded replica
    "replica_error": (4,  "api"),   # the replica's own 404/500/503 (must pass through, no reason added)
    "no_route":      (3,  None),    # 404 no_route from ingressd
}


class Load:
    def __init__(self, run, clients):
        self.run = run
        self.clients = clients
        self.rng = random.Random(run.seed)
        self.records = []
        self.stop = False
        self.counter = 0
        self.kinds = list(KINDS)
        self.weights = [KINDS[k][0] for k in self.kinds]
        self.conns = set()

    def new_rid(self, kind):
        self.counter += 1
        return f"soak-{self.run.tag}-{self.counter:07d}-{kind}"

    async def worker(self):
        conn = None
        while not self.stop:
            kind = self.rng.choices(self.kinds, self.weights)[0]
            try:
                conn = await self.one(kind, conn)
            except Exception:  # a bug in this script, not in ingressd: stop loudly
                self.run.internal_errors.append(traceback.format_exc())
                if conn:
                    conn.close()
                conn = None
                await asyncio.sleep(0.1)
        if conn:
            conn.close()
            self.conns.discard(conn)

    def build(self, kind, rid, mode):
        rng = self.rng
        headers = [("Host", "soak"), ("X-Request-Id", rid)]
        body, chunked, extra = b"", False, {}
        if kind.startswith("stream"):
            method, path = "POST", "/v1/chat/completions"
            body = json.dumps({"model": "soak", "stream": True,
                               "messages": [{"role": "user", "content": "x" * rng.randint(1, 2000)}]}).encode()
            headers.append(("Content-Type", "application/json"))
            if kind == "stream":
                extra["events"] = rng.randint(5, 30)
                headers.append(("X-Soak-Interval-Ms", str(rng.randint(5, 25))))
            elif kind == "stream_cut":
                extra["events"] = 30
                extra["cut"] = rng.randint(1, 5)
                extra["cut_mode"] = rng.choice(["fin", "rst"])
                headers += [("X-Soak-Cut", str(extra["cut"])), ("X-Soak-Cut-Mode", extra["cut_mode"]),
                            ("X-Soak-Interval-Ms", "10")]
            else:
                extra["events"] = -1
                extra["abort_after"] = 3
                extra["abort_mode"] = rng.choice(["close", "rst"])
                headers.append(("X-Soak-Interval-Ms", "20"))
            headers.append(("X-Soak-Events", str(extra["events"])))
        elif kind == "post_llm":
            method, path = "POST", "/v1/completions"
            size = rng.choice([0, 64, 2000, 20000, 150000])
            body = json.dumps({"model": "soak", "prompt": "p" * size}).encode()
            headers.append(("Content-Type", "application/json"))
        elif kind == "post_api":
            method, path = "POST", f"/api/echo/{rng.randint(0, 999)}"
            body = rng.randbytes(rng.choice([0, 1, 100, 4096, 65536, 300000]))
            headers.append(("Content-Type", "application/octet-stream"))
        elif kind == "chunked_post":
            method, path = "POST", "/api/upload"
            body = rng.randbytes(rng.choice([1, 1000, 50000, 200000]))
            chunked = True
        elif kind == "get_api":
            method, path = "GET", f"/api/items/{rng.randint(0, 999)}?q={rng.randint(0, 99)}"
        elif kind == "get_llm":
            method, path = "GET", "/v1/models"
        elif kind == "replica_error":
            extra["expect"] = rng.choice([404, 500, 503])
            method, path = "GET", f"/api/status/{extra['expect']}"
        else:
            method, path = "GET", f"/nowhere/{rng.randint(0, 99)}"
        version = "HTTP/1.0" if mode == "h10" else "HTTP/1.1"
        if mode == "close":
            headers.append(("Connection", "close"))
        if chunked:
            headers.append(("Transfer-Encoding", "chunked"))
        elif method == "POST" or body:
            headers.append(("Content-Length", str(len(body))))
        head = f"{method} {path} {version}\r\n" + "".join(f"{k}: {v}\r\n" for k, v in headers) + "\r\n"
        return method, path, head.encode(), body, chunked, extra

    async def one(self, kind, conn):
        rng = self.rng
        rid = self.new_rid(kind)
        if kind.startswith("stream"):
            mode = "fresh" if kind == "stream_abort" else rng.choice(["ka", "ka", "ka", "close"])
        elif kind == "chunked_post":  # chunked framing is HTTP/1.1 only (HTTP/1.0 + TE is refused)
            mode = rng.choices(["ka", "close"], [65, 35])[0]
        else:
            mode = rng.choices(["ka", "close", "h10"], [55, 30, 15])[0]
        method, path, head, body, chunked, extra = self.build(kind, rid, mode)
        app = KINDS[kind][1]
        rec = {"kind": kind, "rid": rid, "app": app, "method": method, "path": path, "mode": mode,
               "routed": app == "llm" and method == "POST", "reused": False, "t0": now(), "t1": None,
               "status": None, "reason": None, "served_by": None, "outcome": None, "detail": "",
               "events": 0, "done_seen": False, "terminal_seen": False, "body_len": len(body), **extra}
        self.records.append(rec)
        if mode != "ka" and conn:
            conn.close()
            self.conns.discard(conn)
            conn = None
        rec["reused"] = conn is not None
        sse = {"events": 0, "buf": b""}

        def on_chunk(data):
            if kind != "stream_abort":
                return False
            sse["buf"] += data
            return sse["buf"].count(b"\n\n") >= extra["abort_after"]

        async def exchange(c):
            try:
                await c.send(head)
                if chunked:
                    pos = 0
                    while pos < len(body):
                        n = rng.randint(1, 70000)
                        await c.send(chunk(body[pos:pos + n]))
                        pos += n
                    await c.send(b"0\r\n\r\n")
                elif body:
                    await c.send(body)
            except OSError as e:  # the response may already be there (an early refusal): read it
                rec["detail"] = f"send: {e}"
            return await read_response(c, on_chunk=on_chunk)

        resp = None
        try:
            if conn is None:
                conn = await Conn.open(self.run.daemon.addr)
                self.conns.add(conn)
            resp = await asyncio.wait_for(exchange(conn), REQUEST_TIMEOUT)
        except asyncio.TimeoutError:
            rec["outcome"] = "timeout"
        except OSError as e:
            rec["outcome"], rec["detail"] = "conn_error", f"connect: {e}"
        rec["t1"] = now()
        if resp is not None:
            self.judge(rec, resp, kind, extra)
        keep = (resp is not None and mode == "ka" and resp.complete and not resp.error and not resp.aborted
                and resp.keep_alive())
        if conn is not None and not keep:
            if resp is not None and resp.aborted and extra.get("abort_mode") == "rst":
                conn.reset()
            else:
                conn.close()
            self.conns.discard(conn)
            conn = None
        return conn

    def judge(self, rec, resp, kind, extra):
        rec["status"] = resp.status
        rec["reason"] = resp.h("x-serve-reason")
        rec["served_by"] = resp.h("x-served-by")
        rec["hdr_rid"] = resp.h("x-request-id")
        rec["reason_count"] = len(resp.headers.get("x-serve-reason", []))
        if resp.error:
            rec["detail"] = (rec["detail"] + " " + resp.error).strip()
        if resp.status is None:
            rec["outcome"] = "conn_error"
            return
        if rec["hdr_rid"] != rec["rid"]:
            rec["outcome"], rec["detail"] = "invalid", f"X-Request-Id {rec['hdr_rid']!r} on the response"
            return
        if not rec["served_by"]:  # ingressd answered itself
            if kind == "no_route" and resp.status == 404 and rec["reason"] == "no_route" and resp.complete:
                rec["outcome"] = "ok"
            elif resp.status >= 500 and resp.complete:
                rec["outcome"] = "generated_error"
            elif not resp.complete:
                rec["outcome"] = "truncated"
            else:
                rec["outcome"], rec["detail"] = "invalid", f"unexpected generated {resp.status}"
            return
        if kind.startswith("stream"):
            self.judge_stream(rec, resp, kind, extra)
            return
        if not resp.complete:
            rec["outcome"] = "truncated"
            return
        expect = extra.get("expect", 200)
        try:
            echo = json.loads(resp.body)
        except ValueError:
            rec["outcome"], rec["detail"] = "invalid", "echo is not JSON"
            return
        problems = []
        if resp.status != expect:
            problems.append(f"status {resp.status}, the replica sent {expect}")
        if echo.get("rid") != rec["rid"] or echo.get("replica") != rec["served_by"]:
            problems.append(f"echo of {echo.get('rid')} by {echo.get('replica')}")
        if echo.get("len") != rec["body_len"]:
            problems.append(f"body {echo.get('len')} bytes at the replica, {rec['body_len']} sent")
        rec["echo_count"] = echo.get("count")
        rec["outcome"] = "invalid" if problems else "ok"
        rec["detail"] = "; ".join(problems)

    def judge_stream(self, rec, resp, kind, extra):
        body = resp.body
        done = b"data: [DONE]\n\n" in body
        rec["done_seen"], rec["terminal_seen"] = done, resp.terminal
        seq, problems = [], []
        for ev in body.split(b"\n\n")[:-1]:
            if ev == b"data: [DONE]":
                continue
            try:
                j = json.loads(ev[len(b"data: "):])
            except ValueError:
                problems.append("an event is not JSON")
                continue
            if j.get("rid") != rec["rid"]:
                problems.append(f"event of {j.get('rid')}")
            seq.append(j.get("i"))
        rec["events"] = len(seq)
        if seq != list(range(len(seq))):
            problems.append("events out of order or missing")
        if kind == "stream_abort":
            rec["outcome"] = "aborted" if resp.aborted else ("truncated" if not resp.complete else "invalid")
            if resp.complete:
                problems.append("an endless stream ended")
        elif kind == "stream_cut":
            if done or resp.terminal:
                rec["outcome"] = "forged"
                problems.append("a stream the replica cut ended as complete")
            else:
                rec["outcome"] = "cut"
                if len(seq) > extra["cut"]:
                    problems.append(f"{len(seq)} events, the replica wrote {extra['cut']}")
        else:
            if resp.complete and done and len(seq) == extra["events"] and body.endswith(b"data: [DONE]\n\n"):
                rec["outcome"] = "ok"
            elif not resp.complete:
                rec["outcome"] = "truncated"
            else:
                problems.append(f"complete with {len(seq)}/{extra['events']} events, [DONE] {done}")
        if problems and rec["outcome"] not in ("forged",):
            rec["outcome"] = "invalid"
        rec["detail"] = "; ".join([rec["detail"]] + problems if rec["detail"] else problems)


# =============================================================================================
# Bad requests (the smuggling and framing catalogue of tests/integration/hardening_test.cpp)
# =============================================================================================

def bad_catalogue(n):
    sm = f"GET /api/smuggled-{n} HTTP/1.1\r\nHost: soak\r\nX-Request-Id: smuggled-{n}\r\n\r\n"
    rid = f"X-Request-Id: bad-{n}\r\n"

    def post(fields, body=""):
        return f"POST /api/bad-{n} HTTP/1.1\r\nHost: soak\r\n{rid}{fields}\r\n{body}"

    def get(fields):
        return f"GET /api/bad-{n} HTTP/1.1\r\nHost: soak\r\n{rid}{fields}\r\n"

    te, cb = "Transfer-Encoding: chunked\r\n", "5\r\nhello\r\n0\r\n\r\n"
    many = "".join(f"X-{i}: 1\r\n" for i in range(101))
    return [
        ("CL.TE", post("Content-Length: 4\r\n" + te, "0\r\n\r\n" + sm), {400}),
        ("TE.CL", post(te + "Content-Length: 4\r\n", "0\r\n\r\n" + sm), {400}),
        ("TE and CL, odd spacing", post("Transfer-Encoding:  chunked \r\nX-A: 1\r\nContent-Length:4\r\n", "0\r\n\r\n" + sm), {400}),
        ("two different Content-Length", post("Content-Length: 5\r\nContent-Length: 6\r\n", "hello!" + sm), {400}),
        ("two equal Content-Length", post("Content-Length: 5\r\nContent-Length: 5\r\n", "hello" + sm), {400}),
        ("Content-Length list", post("Content-Length: 5, 6\r\n", "hello!"), {400}),
        ("Content-Length +5", post("Content-Length: +5\r\n", "hello"), {400}),
        ("Content-Length 0x10", post("Content-Length: 0x10\r\n", "hello"), {400}),
        ("Content-Length -1", post("Content-Length: -1\r\n", "hello"), {400}),
        ("Content-Length overflow", post("Content-Length: 99999999999999999999\r\n"), {400}),
        ("Content-Length 2^64-1", post("Content-Length: 18446744073709551615\r\n"), {413}),
        ("chunk size overflow", post(te, "fffffffffffffffff\r\nhello\r\n0\r\n\r\n" + sm), {400}),
        ("chunk size not hex", post(te, "zz\r\nhello\r\n0\r\n\r\n" + sm), {400}),
        ("chunk size line with bare LF", post(te, "5\nhello\r\n0\r\n\r\n"), {400}),
        ("chunk extension with bare CR", post(te, "5;a=b\rc\r\nhello\r\n0\r\n\r\n"), {400}),
        ("TE chunked, chunked", post("Transfer-Encoding: chunked, chunked\r\n", cb), {400}),
        ("TE gzip", post("Transfer-Encoding: gzip\r\n", "hello"), {400}),
        ("TE xchunked", post("Transfer-Encoding: xchunked\r\n", cb), {400}),
        ("TE chunked;ext=v", post("Transfer-Encoding: chunked;ext=v\r\n", cb), {400}),
        ("TE space before colon", post("Transfer-Encoding : chunked\r\n", cb + sm), {400}),
        ("TE obs-fold", post("Transfer-Encoding:\r\n chunked\r\n", cb + sm), {400}),
        ("TE on two lines", post("Transfer-Encoding: gzip\r\nTransfer-Encoding: chunked\r\n", cb), {400}),
        ("TE gzip, chunked", post("Transfer-Encoding: gzip, chunked\r\n", cb), {501}),
        ("TE on HTTP/1.0", f"POST /api/bad-{n} HTTP/1.0\r\nHost: soak\r\n{rid}{te}\r\n{cb}", {400}),
        ("bare LF", f"GET /api/bad-{n} HTTP/1.1\nHost: soak\n{rid[:-2]}\n\n", {400}),
        ("bare CR in a value", get("X: a\rb\r\n"), {400}),
        ("NUL in a value", get("X: a\0b\r\n"), {400}),
        ("obs-fold", get("X: a\r\n b\r\n"), {400}),
        ("@ in a field name", get("X@Y: y\r\n"), {400}),
        ("field without colon", get("No-Colon\r\n"), {400}),
        ("whitespace line after the request line", f"GET /api/bad-{n} HTTP/1.1\r\n \r\nHost: soak\r\n{rid}\r\n", {400}),
        ("101 fields", get(many), {431}),
        ("70 KB field", get("X-Big: " + "a" * 70000 + "\r\n"), {431}),
        ("absolute-form target", f"GET http://soak/api/bad-{n} HTTP/1.1\r\nHost: soak\r\n{rid}\r\n", {400}),
        ("HTTP/2.0 request line", f"GET /api/bad-{n} HTTP/2.0\r\nHost: soak\r\n{rid}\r\n", {400, 505}),
    ]


async def send_bad(run, n, name, raw, expect):
    rec = {"kind": "bad", "name": name, "rid": f"bad-{n}", "t0": now(), "t1": None, "status": None,
           "expect": sorted(expect), "closed": False, "conn_close_header": False, "outcome": None, "detail": ""}
    run.load.records.append(rec)
    c = None
    try:
        c = await Conn.open(run.daemon.addr)
        try:
            await c.send(raw.encode("latin-1"))
        except OSError as e:
            rec["detail"] = f"send: {e}"
        r = await asyncio.wait_for(read_response(c), REQUEST_TIMEOUT)
        rec["status"] = r.status
        rec["reason"] = r.h("x-serve-reason")
        rec["served_by"] = r.h("x-served-by")
        rec["conn_close_header"] = (r.h("connection") or "").lower() == "close"
        if r.status is not None and not r.error:
            try:
                rest = await asyncio.wait_for(c.until_close(), 30)
                rec["closed"] = True
                rec["trailing"] = len(rest)
            except (asyncio.TimeoutError, OSError):
                rec["closed"] = False
        else:
            rec["detail"] = (rec["detail"] + " " + (r.error or "")).strip()
    except (OSError, asyncio.TimeoutError) as e:
        rec["detail"] = f"{type(e).__name__}: {e}"
    finally:
        if c:
            c.close()
    rec["t1"] = now()
    ok = (rec["status"] in expect and rec["conn_close_header"] and rec["closed"] and not rec.get("trailing")
          and not rec.get("served_by"))
    rec["outcome"] = "refused" if ok else "wrong"
    if not ok and not rec["detail"]:
        rec["detail"] = (f"status {rec['status']} (expected {sorted(expect)}), Connection: close "
                         f"{rec['conn_close_header']}, closed {rec['closed']}, {rec.get('trailing', 0)} bytes after")


# =============================================================================================
# The run: cluster, faults, checks
# =============================================================================================

class Run:
    def __init__(self, args):
        self.args = args
        self.profile = dict(PROFILES["short" if args.short else "full"])
        if args.duration is not None:
            self.profile["duration"] = args.duration
        self.seed = args.seed if args.seed is not None else random.randrange(1 << 30)
        self.rng = random.Random(self.seed + 1)
        self.tag = f"{self.seed:x}"
        self.dir = tempfile.mkdtemp(prefix="ingressd-soak-")
        self.children = []
        self.internal_errors = []
        self.faults = []
        self.removed = []          # (fake, barrier time)
        self.retired = []          # removed fakes already stopped
        self.routers = []
        self.replicas = {"llm": [], "api": []}
        self.next_ip = 5
        self.next_id = {"llm": 1, "api": 1}
        self.hups = {"valid": 0, "invalid": 0}
        self.hedge = "auto"
        self.samples = {"rss": []}
        self.health_log = []
        self.daemon = None
        self.load = None
        self.t_start = None
        self.notes = []

    # ---- cluster ------------------------------------------------------------------------------

    def new_replica(self, app, ip):
        i = self.next_id[app]
        self.next_id[app] += 1
        dep = "LLMServer" if app == "llm" else "Api"
        return Fake(self, "replica", f"SERVE_REPLICA::{app}#{dep}#r{i}", ip, app)

    def alloc_ip(self):
        ip = f"127.0.0.{self.next_ip}"
        self.next_ip = 5 + (self.next_ip - 4) % 5  # 127.0.0.5 .. 127.0.0.9
        return ip

    def fake_addrs(self):
        live = self.routers + self.replicas["llm"] + self.replicas["api"]
        return {(f.ip, f.port) for f in live}

    def removed_addrs(self):
        return {(f.ip, f.port) for f, _ in self.removed} | {(f.ip, f.port) for f in self.retired}

    def router_view(self):
        return [{"name": r.name, "ip": r.ip, "port": r.port} for r in self.replicas["llm"]]

    def topology_doc(self):
        return {"target_groups": [
            {"app_name": "llm", "route_prefix": PREFIX["llm"], "protocol": "HTTP",
             "targets": [r.target() for r in self.replicas["llm"]],
             "ingress_request_router_targets": [r.target() for r in self.routers]},
            {"app_name": "api", "route_prefix": PREFIX["api"], "protocol": "HTTP",
             "targets": [r.target() for r in self.replicas["api"]],
             "ingress_request_router_targets": []},
        ]}

    def write_topology(self):
        path = os.path.join(self.dir, "topology.json")
        tmp = path + ".tmp"
        with open(tmp, "w", encoding="utf-8") as f:
            json.dump(self.topology_doc(), f, indent=1)
        os.replace(tmp, path)
        return path

    async def start_cluster(self):
        # Routers: two on this node (the pool), one on another node (never in the pool: §4.2).
        for name, ip in (("a", NODE_IP), ("b", NODE_IP), ("c", "127.0.0.3")):
            self.routers.append(Fake(self, "router", f"SERVE_REPLICA::llm#LLMRouter#{name}", ip, "llm"))
        for app in ("llm", "api"):
            for ip in (NODE_IP, "127.0.0.3", "127.0.0.4"):
                self.replicas[app].append(self.new_replica(app, ip))
        await asyncio.gather(*(f.start() for f in self.replicas["llm"] + self.replicas["api"]))
        await asyncio.gather(*(r.start(self.router_view()) for r in self.routers))
        topo = self.write_topology()
        self.daemon = Daemon(self, self.args.binary)
        await self.daemon.start(topo)
        await self.wait_topology(lambda t: self.all_up(t, [f.name for f in self.replicas["llm"] + self.replicas["api"]]),
                                 "every replica up")

    @staticmethod
    def replica_health(topo):
        out = {}
        for app in topo.get("apps", []):
            for r in app.get("replicas", []):
                out[r["name"]] = r.get("health")
        return out

    def all_up(self, topo, names):
        h = self.replica_health(topo)
        return all(h.get(n) == "up" for n in names)

    async def wait_topology(self, pred, what, timeout=EVENT_TIMEOUT):
        deadline = now() + timeout
        while True:
            topo = await self.daemon.topology()
            if pred(topo):
                return topo
            if now() > deadline:
                raise SetupError(f"waited {timeout:.0f} s for ingressd's /topology to show {what}: {json.dumps(topo)[:2000]}")
            self.check_daemon()
            await asyncio.sleep(0.1)

    async def topology_barrier(self):
        """After /topology shows a change: wait until the file source confirms the file once more
        (ingressd_topology_last_success_timestamp_seconds moves). The source runs on the main
        thread, which posted the new snapshot to every worker before that confirmation, so
        requests sent from now on are routed with it."""
        first = metric_sum(await self.daemon.metrics(), "ingressd_topology_last_success_timestamp_seconds")
        deadline = now() + EVENT_TIMEOUT
        while metric_sum(await self.daemon.metrics(), "ingressd_topology_last_success_timestamp_seconds") <= first:
            if now() > deadline:
                raise SetupError("the topology file source stopped confirming the file")
            await asyncio.sleep(0.05)
        return now()

    def check_daemon(self):
        if not self.daemon.alive():
            raise SetupError(f"ingressd exited ({self.daemon.proc.returncode}) during the soak:\n"
                             f"{self.daemon.output()[-4000:]}")

    async def set_router_replicas(self):
        view = self.router_view()
        for r in self.routers:
            if r.alive():
                await r.cmd("replicas " + json.dumps(view))

    # ---- faults -----------------------------------------------------------------------------

    def begin(self, kind, target, app, **extra):
        f = {"kind": kind, "target": target, "app": app, "t_begin": now(), "t_end": None, "t_detect": None, **extra}
        self.faults.append(f)
        self.log(f"fault {kind} {target}")
        return f

    def end(self, f):
        f["t_end"] = now()
        if f["t_detect"] is None:
            f["t_detect"] = f["t_end"]

    def log(self, text):
        if self.args.verbose:
            t = now() - (self.t_start or now())
            print(f"[{t:7.1f}s] {text}", flush=True)

    async def watch_down(self, f, name):
        """Records when ingressd first shows `name` down (the end of the detection window)."""
        try:
            while f["t_end"] is None:
                if self.replica_health(await self.daemon.topology()).get(name) == "down":
                    f["t_detect"] = now()
                    f["seen_down"] = True
                    return
                await asyncio.sleep(0.05)
        except (OSError, asyncio.TimeoutError, SetupError):
            pass

    async def fault_router_kill(self, r):
        f = self.begin("router_kill", r.name, "llm")
        r.kill()
        await asyncio.sleep(self.profile["router_down"])
        await r.start(self.router_view())
        # Up when it answers a route call of its own again.
        async def probe():
            c = await Conn.open((r.ip, r.port))
            try:
                await c.send(b"POST /internal/route HTTP/1.1\r\nHost: r\r\nX-Request-Id: probe\r\n"
                             b"Content-Length: 0\r\nConnection: close\r\n\r\n")
                return (await read_response(c)).status
            finally:
                c.close()
        status = await asyncio.wait_for(probe(), EVENT_TIMEOUT)
        if status != 200:
            raise SetupError(f"restarted router {r.name} answered {status}")
        self.end(f)

    async def fault_router_hang(self, r):
        f = self.begin("router_hang", r.name, "llm", hedge=self.hedge)
        await r.cmd("hang on")
        await asyncio.sleep(self.profile["hang"])
        await r.cmd("hang off")
        self.end(f)

    async def fault_replica_kill(self, rep):
        # Mid-stream: wait (for an event, bounded) until the replica has a request in flight.
        deadline = now() + EVENT_TIMEOUT
        busy = False
        while now() < deadline and not self.load.stop:
            if any("-stream" in rid for rid in json.loads(await rep.cmd("active"))["rids"]):
                busy = True
                break
            await asyncio.sleep(0.02)
        f = self.begin("replica_kill", rep.name, rep.app, busy=busy)
        rep.kill()
        f["instant"] = (f["t_begin"], now())  # the process died in between
        watcher = asyncio.ensure_future(self.watch_down(f, rep.name))
        await asyncio.sleep(self.profile["replica_down"])
        await rep.start()
        await self.wait_topology(lambda t: self.replica_health(t).get(rep.name) == "up", f"{rep.name} up again")
        self.end(f)
        await watcher

    async def fault_replica_refuse(self, rep):
        f = self.begin("replica_refuse", rep.name, rep.app)
        await rep.cmd("listen off")
        f["instant"] = (f["t_begin"], now())  # the listener closed in between
        watcher = asyncio.ensure_future(self.watch_down(f, rep.name))
        await asyncio.sleep(self.profile["refuse"])
        await rep.cmd("listen on")
        await self.wait_topology(lambda t: self.replica_health(t).get(rep.name) == "up", f"{rep.name} up again")
        self.end(f)
        await watcher

    async def fault_topology_add(self, app):
        rep = self.new_replica(app, self.alloc_ip())
        await rep.start()
        f = self.begin("topology_add", rep.name, app)
        self.replicas[app].append(rep)
        self.write_topology()
        await self.wait_topology(lambda t: self.replica_health(t).get(rep.name) == "up", f"{rep.name} added")
        await self.topology_barrier()
        if app == "llm":  # the routers learn of it after ingressd does (else: unknown_replica_id)
            await self.set_router_replicas()
        self.end(f)

    async def fault_topology_remove(self, app, avoid=()):
        # Stop what was removed before (if it is idle): nothing should reach it any more.
        for fake, _ in list(self.removed):
            if json.loads(await fake.cmd("active"))["active"] == 0:
                fake.stop()
                self.removed.remove((fake, _))
                self.retired.append(fake)
        choices = [r for r in self.replicas[app] if r.name not in avoid]
        rep = choices[0]
        f = self.begin("topology_remove", rep.name, app)
        self.replicas[app].remove(rep)
        if app == "llm":  # the routers forget it before ingressd does
            await self.set_router_replicas()
        self.write_topology()
        await self.wait_topology(lambda t: rep.name not in self.replica_health(t), f"{rep.name} removed")
        barrier = await self.topology_barrier()
        f["t_barrier"] = barrier
        self.removed.append((rep, barrier))
        self.end(f)

    async def fault_sighup(self, valid):
        kind = "sighup_valid" if valid else "sighup_invalid"
        samples = await self.daemon.metrics()
        counter = "ingressd_config_reloads_total" if valid else "ingressd_config_reload_errors_total"
        before = metric_sum(samples, counter)
        if valid:
            self.hedge = "off" if self.hedge == "auto" else "auto"
            self.daemon.write_config(CONFIG.format(hedge=self.hedge))
        else:
            self.daemon.write_config(INVALID_CONFIG)
        f = self.begin(kind, f"router.hedge: {self.hedge}" if valid else "router.timeout: five-seconds", None)
        self.daemon.hup()
        self.hups["valid" if valid else "invalid"] += 1
        deadline = now() + EVENT_TIMEOUT
        while metric_sum(await self.daemon.metrics(), counter) <= before:
            if now() > deadline:
                raise SetupError(f"SIGHUP: {counter} did not move")
            self.check_daemon()
            await asyncio.sleep(0.05)
        if not valid:
            self.daemon.write_config(CONFIG.format(hedge=self.hedge))
        self.end(f)

    async def fault_bad_burst(self, cycle):
        f = self.begin("bad_requests", "smuggling and framing catalogue", None)
        cat = bad_catalogue(0)
        sem = asyncio.Semaphore(4)
        base = cycle * 1000

        async def one(i, item):
            async with sem:
                name, _, expect = item
                n = base + i
                await send_bad(self, n, name, bad_catalogue(n)[i][1], expect)
        await asyncio.gather(*(one(i, item) for i, item in enumerate(cat)))
        f["count"] = len(cat)
        self.end(f)

    async def scheduler(self):
        """Faults one after another, in cycles; stops between two faults once the duration is
        over and at least one whole cycle ran (so --short sees every fault at least once)."""
        p = self.profile
        await asyncio.sleep(p["first"])
        cycle = 0
        while True:
            a, b = self.routers[cycle % 2], self.routers[(cycle + 1) % 2]
            llm_kill = self.replicas["llm"][cycle % len(self.replicas["llm"])]
            refuse_app = "api" if cycle % 2 == 0 else "llm"
            refuse = self.replicas[refuse_app][(cycle + 1) % len(self.replicas[refuse_app])]
            steps = [
                lambda: self.fault_router_kill(a),
                lambda: self.fault_router_hang(b),
                lambda: self.fault_replica_kill(llm_kill),
                lambda: self.fault_replica_refuse(refuse),
                lambda: self.fault_topology_add("llm" if cycle % 2 == 0 else "api"),
                lambda: self.fault_sighup(True),
                lambda: self.fault_sighup(False),
                lambda: self.fault_bad_burst(cycle),
                lambda: self.fault_topology_remove("llm" if cycle % 2 == 0 else "api"),
            ]
            for step in steps:
                if cycle > 0 and now() - self.t_start >= p["duration"]:
                    return cycle
                self.check_daemon()
                await step()
                await asyncio.sleep(p["gap"])
            cycle += 1

    async def monitor(self):
        """RSS every second (peak) and replica health transitions as /topology shows them."""
        last = {}
        while not self.load.stop:
            try:
                self.samples["rss"].append(self.daemon.rss())
                h = self.replica_health(await self.daemon.topology())
                for name, state in h.items():
                    if last.get(name, "up") != state:
                        self.health_log.append((now(), name, state))
                last = h
            except (OSError, asyncio.TimeoutError, SetupError):
                pass
            await asyncio.sleep(0.25)

    # ---- phases -----------------------------------------------------------------------------

    async def quiesce(self, what):
        """After the load: every client connection closed, ingressd shows no connection and no
        stream, every fake has no request in flight (the endless streams' aborts arrived)."""
        for c in list(self.load.conns):
            c.close()
        self.load.conns.clear()
        deadline = now() + EVENT_TIMEOUT
        while True:
            s = await self.daemon.metrics()
            conns = metric_sum(s, "ingressd_active_connections")
            streams = metric_sum(s, "ingressd_active_streams")
            busy = []
            for f in self.replicas["llm"] + self.replicas["api"] + [f for f, _ in self.removed]:
                a = json.loads(await f.cmd("active"))
                if a["active"]:
                    busy.append((f.name, a["rids"]))
            if conns == 0 and streams == 0 and not busy:
                return {"connections": conns, "streams": streams, "busy_replicas": busy}
            if now() > deadline:
                return {"connections": conns, "streams": streams, "busy_replicas": busy, "timed_out": True,
                        "what": what}
            await asyncio.sleep(0.1)

    async def run_load(self, seconds, with_faults):
        self.load.stop = False
        workers = [asyncio.ensure_future(self.load.worker()) for _ in range(self.profile["clients"])]
        sched = asyncio.ensure_future(self.scheduler()) if with_faults else None
        mon = asyncio.ensure_future(self.monitor())
        try:
            if sched:
                self.cycles = await sched
            else:
                await asyncio.sleep(seconds)
        finally:
            self.load.stop = True
            if sched and not sched.done():
                sched.cancel()
            await asyncio.gather(*workers, return_exceptions=True)
            await asyncio.gather(mon, return_exceptions=True)
            self.t_load_end = now()


def overlaps(rec, a, b):
    return rec["t0"] <= b and (rec["t1"] or rec["t0"]) >= a


def read_event_logs(run):
    """Every fake's log: per rid, the replicas that got it (with time), which were ended
    (`final`), cut, gone; per rid, the routers' picks."""
    reqs, final, cut, gone, picks, hangs = {}, set(), {}, set(), {}, {}
    fakes = run.routers + run.replicas["llm"] + run.replicas["api"] + [f for f, _ in run.removed] + run.retired
    for f in fakes:
        try:
            with open(f.log_path, encoding="utf-8") as fh:
                lines = fh.read().splitlines()
        except OSError:
            continue
        for line in lines:
            p = line.split(" ")
            if len(p) < 3:
                continue
            t, ev, rid = float(p[0]), p[1], p[2]
            if ev == "req":
                reqs.setdefault(rid, []).append((f.name, t, p[3]))
            elif ev == "final":
                final.add(rid)
            elif ev == "cut":
                cut[rid] = f.name
            elif ev == "gone":
                gone.add(rid)
            elif ev == "route":
                picks.setdefault(rid, []).append((f.name, p[3]))
            elif ev == "hang":
                hangs.setdefault(rid, []).append(f.name)
    return reqs, final, cut, gone, picks, hangs


def analyse(run, baseline, final_state, metrics_after, quiet):
    recs = [r for r in run.load.records]
    load_recs = [r for r in recs if r["kind"] != "bad"]
    bad_recs = [r for r in recs if r["kind"] == "bad"]
    reqs, final, cut, gone, picks, hangs = read_event_logs(run)
    pool = {r.name for r in run.routers if r.ip == NODE_IP}
    for r in load_recs:
        r["hits"] = [(name, t) for name, t, _ in reqs.get(r["rid"], [])]
        r["reached"] = sorted({name for name, _ in r["hits"]})
    faults = run.faults
    for f in faults:
        f["explained"] = 0

    def window(f):
        return f["t_begin"], f["t_end"] or now()

    def explain(r):
        """The fault that accounts for this error, or None (docs/operations.md, "Soak")."""
        if r["outcome"] in ("invalid", "timeout", "forged"):
            return None
        generated = r["outcome"] == "generated_error"
        for f in faults:
            a, b = window(f)
            if not overlaps(r, a, b):
                continue
            at_fault = overlaps(r, *f.get("instant", (a, a)))
            if f["kind"] == "replica_kill" and f["app"] == r["app"]:
                if any(name == f["target"] and t <= f["instant"][1] for name, t in r["hits"]):
                    return f  # it was at the replica when the replica died
                if not r["reached"] and generated and r["reason"] == "upstream_error" and at_fault:
                    return f  # written to a connection as the replica died: sent, so never resent
            if (f["kind"] == "replica_refuse" and f["app"] == r["app"] and not r["reached"] and generated
                    and r["reason"] == "upstream_error" and at_fault):
                return f  # connected into the listen backlog, reset when the listener closed
            if (f["kind"] in ("router_kill", "router_hang") and r["routed"] and generated
                    and r["reason"] == "router_unreachable"):
                down = {g["target"] for g in faults if g["kind"] in ("router_kill", "router_hang")
                        and overlaps(r, *window(g))}
                if pool <= down:
                    return f  # every router of the pool was down during the request
            if (f["kind"] == "topology_remove" and r["routed"] and generated and r["reason"] == "unknown_replica_id"
                    and f["target"] in {p for _, p in picks.get(r["rid"], [])}):
                return f  # a router picked the replica just before it was removed
        return None

    errors, unexplained, dropped = [], [], []
    for r in load_recs:
        expected = (r["outcome"] in ("ok", "aborted", "cut"))
        if expected:
            continue
        errors.append(r)
        f = explain(r)
        if f:
            f["explained"] += 1
            r["explained_by"] = f"{f['kind']} {f['target']}"
        else:
            unexplained.append(r)
            if r["outcome"] == "generated_error" and not r["reached"] and r["reason"] in GENERATED_5XX_REASONS:
                dropped.append(r)

    # Reasons: every non-2xx ingressd generated carries exactly one X-Serve-Reason; replica
    # responses pass through without one.
    generated_non2xx = [r for r in load_recs if r["status"] and r["status"] >= 300 and not r["served_by"]]
    missing_reason = [r for r in generated_non2xx if r.get("reason_count") != 1]
    replica_non2xx = [r for r in load_recs if r["status"] and r["status"] >= 300 and r["served_by"]]
    replica_with_reason = [r for r in replica_non2xx if r.get("reason")]

    # Streams: one whose end the replica never wrote must not end complete at the client.
    stream_recs = [r for r in load_recs if r["kind"].startswith("stream") and r["reached"]]
    cut_streams = [r for r in stream_recs if r["rid"] not in final]
    forged = [r for r in cut_streams if r["done_seen"] or r["terminal_seen"]]
    forged += [r for r in load_recs if r["outcome"] == "forged" and r not in forged]
    cut_kinds = {"replica cut (X-Soak-Cut)": sum(1 for r in cut_streams if r["rid"] in cut),
                 "client left (endless)": sum(1 for r in cut_streams if r["rid"] not in cut and r["kind"] == "stream_abort"),
                 "replica killed": sum(1 for r in cut_streams if r["rid"] not in cut and r["kind"] != "stream_abort")}

    # Client aborts must reach the replica (its connection closes); a killed replica saw it die.
    aborted = [r for r in load_recs if r["outcome"] == "aborted"]
    not_propagated = [r for r in aborted if r["rid"] not in gone and not explain_kill(r, faults)]

    # Duplicate POSTs: a POST's id seen twice by the replicas.
    dup_post = [r for r in load_recs if r["method"] == "POST" and len(reqs.get(r["rid"], [])) > 1]
    dup_get = [r for r in load_recs if r["method"] == "GET" and len(reqs.get(r["rid"], [])) > 1]

    # Removed replicas: no request sent after the removal took effect reaches them.
    late = []
    for fake, barrier in list(run.removed) + [(f, None) for f in run.retired]:
        if barrier is None:
            barrier = next((f["t_barrier"] for f in faults if f["kind"] == "topology_remove"
                            and f["target"] == fake.name), None)
        if barrier is None:
            continue
        by_rid = {r["rid"]: r for r in load_recs}
        for rid, hits in reqs.items():
            for name, t, _ in hits:
                if name == fake.name and t > barrier and rid in by_rid and by_rid[rid]["t0"] > barrier:
                    late.append(rid)

    # Bad requests: refused as the hardening catalogue says, closed, nothing reached a replica.
    bad_wrong = [r for r in bad_recs if r["outcome"] != "refused"]
    bad_reached = [rid for rid in reqs if rid.startswith("bad-") or rid.startswith("smuggled-")]

    # Mix-ups and corruption.
    invalid = [r for r in load_recs if r["outcome"] == "invalid"]

    # Router pins (information): POSTs served by a replica none of their routers picked.
    off_pick = []
    for r in load_recs:
        if r["routed"] and r["served_by"] and r["rid"] in picks:
            if r["served_by"] not in {p for _, p in picks[r["rid"]]}:
                off_pick.append(r)
    remote_router_calls = sum(1 for rid, ps in picks.items() for name, _ in ps if name not in pool)
    replica_faults = [f for f in faults if f["kind"] in ("replica_kill", "replica_refuse") and f["app"] == "llm"]
    off_pick_in_fault = [r for r in off_pick if any(overlaps(r, f["t_begin"], f["t_end"] or now())
                                                    for f in replica_faults)]

    # Metrics against the client's counts (after the load: nothing in flight).
    # A stream the client left mid-way is counted by ingressd as 499 (as Ray's proxy does), not as
    # the status its response began with.
    client_codes = {}
    for r in recs:
        if r["status"] is not None:
            code = "499" if r["outcome"] == "aborted" else str(r["status"])
            client_codes[code] = client_codes.get(code, 0) + 1
    daemon_codes = {}
    for n, l, v in metrics_after:
        if n == "ingressd_requests_total" and v:
            daemon_codes[l["code"]] = daemon_codes.get(l["code"], 0) + int(v)
    client_reasons = {}
    for r in recs:
        if r.get("reason") and not r.get("served_by"):
            client_reasons[r["reason"]] = client_reasons.get(r["reason"], 0) + 1
    daemon_reasons = {}
    for n, l, v in metrics_after:
        if n == "ingressd_generated_responses_total" and v:
            daemon_reasons[l["reason"]] = daemon_reasons.get(l["reason"], 0) + int(v)
    metric_rows = []
    for code in sorted(set(client_codes) | set(daemon_codes)):
        metric_rows.append(("requests_total code=" + code, daemon_codes.get(code, 0), client_codes.get(code, 0)))
    for reason in sorted(set(client_reasons) | set(daemon_reasons)):
        metric_rows.append(("generated reason=" + reason, daemon_reasons.get(reason, 0), client_reasons.get(reason, 0)))
    metric_rows.append(("config_reloads_total", int(metric_sum(metrics_after, "ingressd_config_reloads_total")),
                        run.hups["valid"]))
    metric_rows.append(("config_reload_errors_total",
                        int(metric_sum(metrics_after, "ingressd_config_reload_errors_total")), run.hups["invalid"]))
    metric_mismatch = [row for row in metric_rows if row[1] != row[2]]

    # Descriptors and memory.
    fd_tol = 2
    fd_ok = (final_state["fds"]["not_pooled"] <= baseline["fds"]["not_pooled"] + fd_tol
             and final_state["fds"]["client"] == 0 and final_state["fds"]["upstream_to_removed"] == 0)
    rss_base, rss_final = baseline["rss"], final_state["rss"]
    rss_limit = int(rss_base * 1.5) + 16 * 1024 * 1024
    rss_enforced = run.daemon.sanitizer is None
    rss_ok = rss_final <= rss_limit or not rss_enforced

    mib = 1024 * 1024
    inv = []

    def add(name, value, ok, note):
        inv.append({"invariant": name, "value": value, "pass": bool(ok), "note": note})

    add("every request answered or failed by a fault", len(unexplained), not unexplained,
        f"{len(errors)} errors, {len(errors) - len(unexplained)} explained by a fault window, "
        f"{len(unexplained)} unexplained, of {len(load_recs)} requests")
    add("generated non-2xx carry X-Serve-Reason", len(missing_reason) + len(replica_with_reason),
        not missing_reason and not replica_with_reason,
        f"{len(generated_non2xx)} generated non-2xx checked, {len(missing_reason)} without exactly one; "
        f"{len(replica_non2xx)} replica non-2xx, {len(replica_with_reason)} given a reason")
    add("nothing dropped while an alternative could serve", len(dropped), not dropped,
        "generated 5xx for requests that reached no replica, outside every fault that explains them")
    add("no cut stream ended as complete", len(forged), not forged,
        f"{len(cut_streams)} streams the replica never ended: " + ", ".join(f"{k} {v}" for k, v in cut_kinds.items()))
    add("no POST reached two replicas", len(dup_post), not dup_post,
        f"{sum(1 for r in load_recs if r['method'] == 'POST' and r['reached'])} POSTs seen by replicas; "
        f"GETs sent twice (allowed after a stale pooled connection): {len(dup_get)}")
    add("descriptors back to baseline", final_state["fds"]["not_pooled"] - baseline["fds"]["not_pooled"], fd_ok,
        f"baseline {baseline['fds']['total']} ({baseline['fds']['not_pooled']} not pooled), final "
        f"{final_state['fds']['total']} ({final_state['fds']['not_pooled']} not pooled, "
        f"{final_state['fds']['upstream']} pooled upstream, {final_state['fds']['upstream_close_wait']} of them "
        f"CLOSE_WAIT, {final_state['fds']['upstream_to_removed']} to removed replicas, "
        f"{final_state['fds']['client']} client); tolerance +{fd_tol}; pooled connections to removed "
        f"replicas while they still ran: {final_state['to_removed_while_running']} (closed once they stopped)")
    add("RSS back to baseline", round((rss_final - rss_base) / mib, 1), rss_ok,
        f"baseline {rss_base / mib:.1f} MiB, peak {max(run.samples['rss'] or [0]) / mib:.1f} MiB, final "
        f"{rss_final / mib:.1f} MiB; limit 1.5 x baseline + 16 MiB = {rss_limit / mib:.1f} MiB"
        + ("" if rss_enforced else f" (not enforced: {run.daemon.sanitizer} build)"))
    add("metrics agree with the client", len(metric_mismatch), not metric_mismatch,
        f"{len(metric_rows)} counters compared" + (": " + "; ".join(f"{n}: ingressd {d}, client {c}"
                                                             for n, d, c in metric_mismatch) if metric_mismatch else ""))
    add("responses match their requests", len(invalid), not invalid,
        "request id, echo, body length and hash, event order")
    add("bad requests refused, nothing reached a replica", len(bad_wrong) + len(bad_reached),
        not bad_wrong and not bad_reached,
        f"{len(bad_recs)} sent, {len(bad_wrong)} not refused as expected, {len(bad_reached)} seen by a replica")
    add("client aborts reach the replica", len(not_propagated), not not_propagated,
        f"{len(aborted)} streams left by the client mid-way, {len(not_propagated)} still streaming at the replica")
    add("removed replicas get no new requests", len(late), not late,
        f"{sum(1 for f in faults if f['kind'] == 'topology_remove')} removals")
    q_ok = not quiet.get("timed_out") and final_state["generations"] == 1
    add("ingressd idle after the load", int(quiet["connections"] + quiet["streams"]) + len(quiet["busy_replicas"]), q_ok,
        f"active connections {int(quiet['connections'])}, streams {int(quiet['streams'])}, "
        f"replicas with requests in flight {len(quiet['busy_replicas'])}, config generations {final_state['generations']}")
    log_text = run.daemon.output()
    sanitizer_reports = len(re.findall(r"(?:Address|Thread|Leak|UndefinedBehavior)Sanitizer|runtime error:", log_text))
    levels = {lvl: log_text.count(f"[{lvl}]") for lvl in ("warning", "error", "critical")}
    exit_ok = run.daemon.exit_code == 0 and not sanitizer_reports
    add("ingressd exits 0 after SIGTERM", run.daemon.exit_code, exit_ok,
        f"sanitizer reports in its log: {sanitizer_reports}; log lines: "
        + ", ".join(f"{k} {v}" for k, v in levels.items()))
    add("soak script ran cleanly", len(run.internal_errors), not run.internal_errors,
        "exceptions in the load generator itself")

    return {
        "invariants": inv,
        "unexplained": unexplained, "dropped": dropped, "forged": forged, "dup_post": dup_post,
        "missing_reason": missing_reason + replica_with_reason, "invalid": invalid, "bad_wrong": bad_wrong,
        "bad_reached": bad_reached, "not_propagated": not_propagated, "late": late,
        "metric_rows": metric_rows, "off_pick": off_pick, "off_pick_in_fault": off_pick_in_fault, "remote_router_calls": remote_router_calls,
        "hangs": sum(len(v) for v in hangs.values()), "route_calls": sum(len(v) for v in picks.values()),
    }


# How long a replica may take to note a closed connection in its log: a replica killed within this
# time after a request ended may have died before writing what it saw (a TSan run showed a client
# abort, propagated by ingressd, whose replica was killed 10 ms later, before it logged the close).
KILL_GRACE_S = 1.0


def explain_kill(r, faults):
    """The request was at a replica when it was killed, or had just left it."""
    return any(f["kind"] == "replica_kill" and (r["t1"] or r["t0"]) >= f["t_begin"] - KILL_GRACE_S
               and any(name == f["target"] and t <= f["instant"][1] for name, t in r["hits"]) for f in faults)


# =============================================================================================
# Report
# =============================================================================================

def table(rows, header, align=None):
    """A plain-text table; `align` has one character per column, "<" or ">" (default: the first
    column left, the others right)."""
    align = align or "<" + ">" * (len(header) - 1)
    widths = [max(len(str(x)) for x in col) for col in zip(header, *rows)]
    line = "  ".join(f"{{:{a}{w}}}" for a, w in zip(align, widths))
    out = [line.format(*header).rstrip(), line.format(*["-" * w for w in widths]).rstrip()]
    out += [line.format(*[str(x) for x in row]).rstrip() for row in rows]
    return "\n".join(out)


def percentile(values, q):
    if not values:
        return "-"
    values = sorted(values)
    return f"{values[min(len(values) - 1, int(q * len(values)))] * 1000:.0f}"


def report(run, result, baseline, final_state, wall):
    recs = run.load.records
    t0 = run.t_start
    lines = []
    p = run.profile
    lines.append(f"ingressd soak ({'short' if run.args.short else 'full'}): {run.t_load_end - run.t_start:.0f} s of load "
                 f"with faults (--duration {p['duration']:g}) "
                 f"after {p['warmup']} s of warm-up, {p['clients']} clients, {getattr(run, 'cycles', 0)} fault cycles, "
                 f"seed {run.seed}, {wall:.0f} s in all")
    lines.append(f"binary {run.args.binary}" + (f" ({run.daemon.sanitizer})" if run.daemon.sanitizer else "")
                 + f"; work dir {run.dir}")
    lines.append("")
    outcomes = ["ok", "cut", "aborted", "generated_error", "truncated", "conn_error", "timeout", "invalid", "forged",
                "refused", "wrong"]
    kinds = list(KINDS) + ["bad"]
    rows = []
    for k in kinds:
        rs = [r for r in recs if r["kind"] == k]
        if not rs:
            continue
        took = [r["t1"] - r["t0"] for r in rs if r["t1"] and r["outcome"] in ("ok", "refused")]
        rows.append([k, len(rs)] + [sum(1 for r in rs if r["outcome"] == o) for o in outcomes]
                    + [sum(1 for r in rs if r.get("explained_by")), percentile(took, 0.5), percentile(took, 0.99),
                       percentile(took, 1.0)])
    rows.append(["all", len(recs)] + [sum(1 for r in recs if r["outcome"] == o) for o in outcomes]
                + [sum(1 for r in recs if r.get("explained_by")), "", "", ""])
    lines.append("Requests by kind and outcome (explained: errors a fault accounts for; p50/p99/max: ms, of the ok ones)")
    lines.append(table(rows, ["kind", "total"] + outcomes + ["explained", "p50", "p99", "max"]))
    lines.append("")
    modes = {}
    for r in recs:
        if r["kind"] != "bad":
            modes[r["mode"]] = modes.get(r["mode"], 0) + 1
    lines.append("Connections: " + ", ".join(f"{k} {v}" for k, v in sorted(modes.items()))
                 + f"; requests on a reused keep-alive connection {sum(1 for r in recs if r.get('reused'))}")
    statuses = {}
    for r in recs:
        if r["status"] is not None:
            statuses[r["status"]] = statuses.get(r["status"], 0) + 1
    lines.append("Statuses at the client: " + ", ".join(f"{k} {v}" for k, v in sorted(statuses.items())))
    lines.append("")
    rows = []
    for i, f in enumerate(run.faults, 1):
        a, b = f["t_begin"], f["t_end"] or f["t_begin"]
        overl = sum(1 for r in recs if r["kind"] != "bad" and overlaps(r, a, b))
        errs = sum(1 for r in recs if r["kind"] != "bad" and overlaps(r, a, b)
                   and r["outcome"] not in ("ok", "cut", "aborted"))
        detect = f"{f['t_detect'] - a:.1f}" if f.get("seen_down") else "-"
        target = f["target"].replace("SERVE_REPLICA::", "") + (f" (hedge {f['hedge']})" if "hedge" in f else "")
        rows.append([i, f"{a - t0:.1f}", f["kind"], target, f"{b - a:.1f}", detect, overl, errs,
                     f["explained"]])
    lines.append("Faults (t: seconds since the load started; down: until ingressd showed the replica down)")
    lines.append(table(rows, ["#", "t", "fault", "target", "length", "down", "requests", "errors", "explained"],
                       ">><<>>>>>"))
    lines.append("")
    lines.append("Invariants")
    rows = [[x["invariant"], x["value"], "PASS" if x["pass"] else "FAIL", x["note"]] for x in result["invariants"]]
    lines.append(table(rows, ["invariant", "value", "", "detail"], "<><<"))
    lines.append("")
    lines.append("ingressd /metrics after the load against the client's counts")
    lines.append(table([[n, d, c, "" if d == c else "MISMATCH"] for n, d, c in result["metric_rows"]],
                       ["counter", "ingressd", "client", ""], "<>><"))
    lines.append("")
    fb, ff = baseline["fds"], final_state["fds"]
    lines.append("Process: descriptors (baseline -> final): " + ", ".join(f"{k} {fb[k]} -> {ff[k]}" for k in fb))
    mib = 1024 * 1024
    lines.append(f"Process: RSS baseline {baseline['rss'] / mib:.1f} MiB, peak "
                 f"{max(run.samples['rss'] or [0]) / mib:.1f} MiB, final {final_state['rss'] / mib:.1f} MiB")
    downs = [h for h in run.health_log if h[2] == "down"]
    lines.append(f"Health: {len(downs)} down marks seen on /topology; "
                 f"router calls {result['route_calls']} (hung {result['hangs']}, to the remote router "
                 f"{result['remote_router_calls']}); POSTs served off their router's pick {len(result['off_pick'])} "
                 f"({len(result['off_pick_in_fault'])} during a replica fault)")
    for note in run.notes:
        lines.append("Note: " + note)
    worst = []
    for label in ("unexplained", "dropped", "forged", "dup_post", "missing_reason", "invalid", "bad_wrong",
                  "not_propagated"):
        for r in result[label][:8]:
            worst.append(f"  {label}: {r['kind']} {r['rid']} {r.get('method', '')} {r.get('path', r.get('name', ''))} "
                         f"mode={r.get('mode')} status={r['status']} reason={r.get('reason')} outcome={r['outcome']} "
                         f"t={r['t0'] - t0:.2f}..{(r['t1'] or r['t0']) - t0:.2f} reached={r.get('reached')} "
                         f"{r.get('detail', '')}")
    for rid in result["bad_reached"][:8]:
        worst.append(f"  bad request reached a replica: {rid}")
    for rid in result["late"][:8]:
        worst.append(f"  request reached a removed replica: {rid}")
    if worst:
        lines.append("")
        lines.append("Violations (first of each; the access log in the work dir has every request by id)")
        lines += worst
    if run.internal_errors:
        lines.append("")
        lines.append("Soak script errors:")
        lines.append(run.internal_errors[0])
    ok = all(x["pass"] for x in result["invariants"])
    lines.append("")
    lines.append("RESULT: " + ("PASS" if ok else "FAIL (" + ", ".join(x["invariant"] for x in result["invariants"]
                                                                       if not x["pass"]) + ")"))
    return "\n".join(lines), ok


# =============================================================================================
# main
# =============================================================================================

async def soak(run):
    wall0 = now()
    await run.start_cluster()
    run.load = Load(run, run.profile["clients"])
    run.t_start = now()
    # Warm-up without faults, then the baseline (pools, arenas and caches grown once).
    run.log("warm-up")
    await run.run_load(run.profile["warmup"], with_faults=False)
    quiet0 = await run.quiesce("baseline")
    if quiet0.get("timed_out"):
        raise SetupError(f"ingressd did not go idle after the warm-up: {quiet0}")
    baseline = {"fds": run.daemon.descriptors(run.fake_addrs(), run.removed_addrs()), "rss": run.daemon.rss()}
    run.t_start = now()
    run.log("load with faults")
    await run.run_load(run.profile["duration"], with_faults=True)
    run.log("quiesce")
    quiet = await run.quiesce("final")
    metrics_after = await run.daemon.metrics()
    # A connection that was in use when its replica was removed goes back to the pool when its
    # request ends, and stays there until the pool's sweep finds it dead or idle too long: count
    # them, stop the removed replicas, and wait for ingressd to close those connections.
    live = run.daemon.descriptors(run.fake_addrs(), run.removed_addrs())
    for fake, _ in list(run.removed):
        fake.stop()
        run.removed.remove((fake, _))
        run.retired.append(fake)
    deadline = now() + EVENT_TIMEOUT
    while run.daemon.descriptors(run.fake_addrs(), run.removed_addrs())["upstream_to_removed"] and now() < deadline:
        await asyncio.sleep(0.2)
    final_state = {"fds": run.daemon.descriptors(run.fake_addrs(), run.removed_addrs()), "rss": run.daemon.rss(),
                   "generations": int(metric_sum(metrics_after, "ingressd_config_generations")),
                   "to_removed_while_running": live["upstream_to_removed"]}
    run.daemon.stop()
    result = analyse(run, baseline, final_state, metrics_after, quiet)
    text, ok = report(run, result, baseline, final_state, now() - wall0)
    return text, ok, result, baseline, final_state


def cleanup(run):
    if run.daemon:
        run.daemon.stop()
    for proc in run.children:
        if proc.poll() is None:
            proc.kill()
    for proc in run.children:
        try:
            proc.wait(timeout=5)
        except subprocess.TimeoutExpired:
            pass


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--binary", default=os.path.join(REPO, "build", "release", "ingressd"),
                    help="the ingressd to soak (copied to the work dir first; default build/release/ingressd)")
    ap.add_argument("--short", action="store_true", help="the CI mode: about a minute of load")
    ap.add_argument("--duration", type=float, help="seconds of load with faults (default 600, --short 60)")
    ap.add_argument("--clients", type=int, help="concurrent clients (default 14, --short 10)")
    ap.add_argument("--seed", type=int, help="the random seed (printed; repeat a run's choices with it)")
    ap.add_argument("--json", metavar="FILE", help="also write the report as JSON")
    ap.add_argument("--keep", action="store_true", help="keep the work dir (logs) also when every invariant holds")
    ap.add_argument("--verbose", action="store_true", help="print each phase and fault as it starts")
    # the fakes
    ap.add_argument("--fake", choices=["router", "replica"], help=argparse.SUPPRESS)
    ap.add_argument("--name", help=argparse.SUPPRESS)
    ap.add_argument("--ip", help=argparse.SUPPRESS)
    ap.add_argument("--port", type=int, default=0, help=argparse.SUPPRESS)
    ap.add_argument("--log", help=argparse.SUPPRESS)
    ap.add_argument("--replicas", help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.fake:
        run_fake(args)
        return 0
    if not os.access(args.binary, os.X_OK):
        print(f"soak: no ingressd binary at {args.binary} (--binary)", file=sys.stderr)
        return 2
    run = Run(args)
    if args.clients:
        run.profile["clients"] = args.clients
    def on_term(*_):
        raise KeyboardInterrupt()
    signal.signal(signal.SIGTERM, on_term)
    ok, text, result = False, None, None
    try:
        text, ok, result, baseline, final_state = asyncio.run(soak(run))
    except SetupError as e:
        text = f"soak: FAIL (set-up or liveness): {e}"
    except KeyboardInterrupt:
        text = "soak: interrupted"
    finally:
        cleanup(run)
    print(text, flush=True)
    if args.json and result is not None:
        _public.t0 = run.t_start
        doc = {"mode": "short" if args.short else "full", "seed": run.seed, "profile": run.profile,
               "binary": args.binary, "pass": ok,
               "invariants": result["invariants"],
               "metrics": [{"counter": n, "ingressd": d, "client": c} for n, d, c in result["metric_rows"]],
               "baseline": baseline, "final": final_state,
               "rss_peak": max(run.samples["rss"] or [0]),
               "faults": [{k: (round(v - run.t_start, 3) if k.startswith("t_") and isinstance(v, float) else v)
                           for k, v in f.items()} for f in run.faults],
               "requests": _counts(run.load.records),
               "violations": {k: [_public(r) for r in result[k][:50]]
                              for k in ("unexplained", "dropped", "forged", "dup_post", "missing_reason", "invalid",
                                        "bad_wrong", "bad_reached", "not_propagated", "late")},
               "off_router_pick": len(result["off_pick"]),
               "report": text}
        with open(args.json, "w", encoding="utf-8") as f:
            json.dump(doc, f, indent=1)
    elif args.json:
        with open(args.json, "w", encoding="utf-8") as f:
            json.dump({"pass": False, "report": text}, f, indent=1)
    if ok and not args.keep:
        shutil.rmtree(run.dir, ignore_errors=True)
    else:
        print(f"soak: logs kept in {run.dir}", file=sys.stderr)
    return 0 if ok else 1


def _public(r):
    """A request record for the JSON report: times relative to the start of the load."""
    if not isinstance(r, dict):
        return r
    out = {k: v for k, v in r.items() if k != "hits"}
    base = _public.t0 or 0.0
    for k in ("t0", "t1"):
        if isinstance(out.get(k), float):
            out[k] = round(out[k] - base, 3)
    return out


_public.t0 = None


def _counts(recs):
    out = {}
    for r in recs:
        k = out.setdefault(r["kind"], {})
        k[r["outcome"]] = k.get(r["outcome"], 0) + 1
    return out


if __name__ == "__main__":
    sys.exit(main())
