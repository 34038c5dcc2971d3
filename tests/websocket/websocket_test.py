#!/usr/bin/python3
"""WebSocket tunnels through ingressd (issue #32), with a real client and a real server library
(Debian's python3-websockets): tests/fakes/ws_replica.py behind the daemon, websockets' client in
front of it, raw sockets where a test needs bytes no library sends.

    /usr/bin/python3 tests/websocket/websocket_test.py --ingressd build/release/ingressd [-v] [TEST ...]

Loopback only (127.0.0.2 = this node), ports bound as 0, every process stopped in cleanups. Waits
are for events: a line of the replica's output, a WebSocket message or close, an admin endpoint's
state polled against a deadline.
"""

import asyncio
import http.server
import json
import os
import re
import signal
import socket
import ssl
import subprocess
import sys
import tempfile
import threading
import unittest

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.join(HERE, "..", "grpc"))
import support  # noqa: E402
from support import LineReader, metric_value  # noqa: E402

import websockets  # noqa: E402

FAKE = os.path.join(HERE, "..", "fakes", "ws_replica.py")
NODE = support.THIS_NODE
CONFIG = support.HTTP_APP_CONFIG


class Replica:
    def __init__(self, name):
        self.name = name
        self.host = NODE
        self.proc = subprocess.Popen([support.PYTHON, FAKE, "--host", NODE, "--name", name],
                                     stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.STDOUT)
        self.out = LineReader(self.proc.stdout)
        m = self.out.wait_for(r"^PORT (\d+)$", 20)
        if not m:
            self.stop()
            raise RuntimeError("ws replica %s did not start: %s" % (name, self.out.text()))
        self.port = int(m.group(1))

    @property
    def key(self):
        return "%s:%d" % (self.host, self.port)

    def wait(self, pattern, timeout=15):
        m = self.out.wait_for(pattern, timeout)
        if not m:
            raise AssertionError("replica %s never printed %r; output:\n%s" % (self.name, pattern, self.out.text()))
        return m

    def kill(self):
        if self.proc.poll() is None:
            self.proc.kill()
            self.proc.wait(10)

    def stop(self):
        support.stop_process(self.proc)


class Router:
    """A fake ingress request router: answers POST /internal/route with {"replica_id": pin} and
    counts the calls."""

    def __init__(self, pin):
        outer = self
        self.calls = 0

        class H(http.server.BaseHTTPRequestHandler):
            protocol_version = "HTTP/1.1"

            def do_POST(self):
                n = int(self.headers.get("Content-Length", "0"))
                self.rfile.read(n)
                outer.calls += 1
                body = json.dumps({"replica_id": pin}).encode()
                self.send_response(200)
                self.send_header("Content-Type", "application/json")
                self.send_header("Content-Length", str(len(body)))
                self.end_headers()
                self.wfile.write(body)

            def do_GET(self):  # health checks
                self.send_response(200)
                self.send_header("Content-Length", "0")
                self.end_headers()

            def log_message(self, *a):
                pass

        self.server = http.server.ThreadingHTTPServer((NODE, 0), H)
        self.port = self.server.server_address[1]
        self.thread = threading.Thread(target=self.server.serve_forever, daemon=True)
        self.thread.start()

    def stop(self):
        self.server.shutdown()
        self.server.server_close()
        self.thread.join(10)


def target(r, name=None):
    return {"ip": r.host, "port": r.port, "instance_id": "n1", "name": name or "SERVE_REPLICA::ws#" + r.name}


def topology(replicas, routers=None):
    g = {"app_name": "ws", "route_prefix": "/", "protocol": "HTTP", "targets": [target(r) for r in replicas]}
    if routers:
        g["ingress_request_router_targets"] = [{"ip": NODE, "port": rt.port, "instance_id": "n1",
                                                "name": "SERVE_REPLICA::ws#router"} for rt in routers]
    return {"target_groups": [g], "fallback_targets": {}}


def run(coro, timeout=30):
    return asyncio.run(asyncio.wait_for(coro, timeout))


class WebSocketTest(unittest.TestCase):
    maxDiff = 4000

    def replica(self, name="r1"):
        r = Replica(name)
        self.addCleanup(r.stop)
        return r

    def ingressd(self, replicas, config=CONFIG, routers=None, access_log=False, extra_args=()):
        d = support.Ingressd(topology(replicas, routers), config=config, access_log=access_log, extra_args=extra_args)
        self.addCleanup(d.stop)
        d.wait_http_app("ws", len(replicas))
        return d

    def url(self, d, path, scheme="ws", port=None):
        return "%s://%s:%d%s" % (scheme, NODE, port or d.port, path)

    # --- the tunnel ----------------------------------------------------------------------------
    def test_echo_text_and_binary(self):
        r = self.replica()
        d = self.ingressd([r])

        async def go():
            async with websockets.connect(self.url(d, "/ws/echo"), compression=None) as ws:
                out = []
                for m in ["hello", b"\x00\x01binary", "é ünïcode"]:
                    await ws.send(m)
                    out.append(await ws.recv())
                return out
        self.assertEqual(run(go()), ["hello", b"\x00\x01binary", "é ünïcode"])

    def test_server_push_first(self):
        """The replica speaks first, right after its 101: the messages that came with the 101
        head reach the client too."""
        r = self.replica()
        d = self.ingressd([r])

        async def go():
            async with websockets.connect(self.url(d, "/ws/push?n=20"), compression=None) as ws:
                return [await ws.recv() for _ in range(20)]
        self.assertEqual(run(go()), ["push %d" % i for i in range(20)])

    def test_one_mebibyte_messages(self):
        r = self.replica()
        d = self.ingressd([r])
        blobs = [os.urandom(1024 * 1024) for _ in range(3)]

        async def go():
            async with websockets.connect(self.url(d, "/ws/echo"), max_size=4 * 1024 * 1024, compression=None) as ws:
                got = []
                for b in blobs:
                    await ws.send(b)
                    got.append(await ws.recv())
                return got
        self.assertEqual(run(go()), blobs)

    def test_ping_pong(self):
        r = self.replica()
        d = self.ingressd([r])

        async def go():
            async with websockets.connect(self.url(d, "/ws/echo"), compression=None) as ws:
                for _ in range(3):
                    pong = await ws.ping(b"are you there")
                    await asyncio.wait_for(pong, 10)
                return True
        self.assertTrue(run(go()))

    def test_close_code_passed_through(self):
        r = self.replica()
        d = self.ingressd([r])

        async def go():
            async with websockets.connect(self.url(d, "/ws/close?code=4001&reason=bye"), compression=None) as ws:
                with self.assertRaises(websockets.ConnectionClosed):
                    await ws.recv()
                return ws.close_code, ws.close_reason
        self.assertEqual(run(go()), (4001, "bye"))

    def test_headers_reach_the_replica(self):
        """Sec-WebSocket-* go through; the replica gets Connection: Upgrade, Upgrade: websocket
        and the forwarding headers of any request."""
        r = self.replica()
        d = self.ingressd([r])

        async def go():
            async with websockets.connect(self.url(d, "/ws/info"), subprotocols=["chat.v1"],
                                          compression=None) as ws:
                info = json.loads(await ws.recv())
                return info, ws.subprotocol, ws.response_headers.get("X-Request-Id")
        info, sub, rid = run(go())
        h = info["headers"]
        self.assertEqual(h.get("upgrade", "").lower(), "websocket")
        self.assertIn("upgrade", h.get("connection", "").lower())
        self.assertIn("sec-websocket-key", h)
        self.assertEqual(h.get("sec-websocket-protocol"), "chat.v1")
        self.assertEqual(sub, None)  # the fake accepts no subprotocol: none is made up on the way
        # The client's address as the replica sees it through ingressd (the client's socket
        # leaves from 127.0.0.1).
        self.assertEqual(h.get("x-forwarded-for"), "127.0.0.1")
        self.assertTrue(rid)

    def test_client_gone_closes_the_replica_side(self):
        r = self.replica()
        d = self.ingressd([r])

        async def go():
            ws = await websockets.connect(self.url(d, "/ws/echo?id=gone1"), compression=None)
            await ws.send("x")
            await ws.recv()
            ws.transport.abort()  # RST, no close frame
        run(go())
        r.wait(r"^CLOSED gone1 1006$")

    def test_replica_gone_closes_the_client_side(self):
        r = self.replica()
        d = self.ingressd([r])

        async def go():
            async with websockets.connect(self.url(d, "/ws/echo?id=k1"), compression=None) as ws:
                await ws.send("x")
                await ws.recv()
                r.kill()
                with self.assertRaises(websockets.ConnectionClosed):
                    await ws.recv()
                return ws.close_code
        self.assertEqual(run(go()), 1006)

    def test_slow_reader_holds_its_replica_not_the_worker(self):
        """The client stops reading while the replica floods it: the replica's sends stall once
        the kernel buffers and ingressd's own (16 KiB per direction) are full, and the worker
        serves other requests meanwhile. Without back-pressure the replica would never stall."""
        r = self.replica()
        d = self.ingressd([r])
        sock = socket.create_connection((NODE, d.port))
        self.addCleanup(sock.close)
        sock.sendall(b"GET /ws/flood?id=slow HTTP/1.1\r\nHost: x\r\nUpgrade: websocket\r\nConnection: Upgrade\r\n"
                     b"Sec-WebSocket-Key: dGhlIHNhbXBsZSBub25jZQ==\r\nSec-WebSocket-Version: 13\r\n\r\n")
        m = r.wait(r"^STALLED slow (\d+)$", 30)
        self.assertLess(int(m.group(1)), 64 * 1024 * 1024)
        # The worker is free: a plain request on another connection is served.
        body = self.plain_get(d, "/plain")
        self.assertTrue(body.startswith(b"plain r1"), body)

    def plain_get(self, d, path):
        s = socket.create_connection((NODE, d.port))
        try:
            s.sendall(("GET %s HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n" % path).encode())
            data = support.read_all(s)
        finally:
            s.close()
        head, _, body = data.partition(b"\r\n\r\n")
        self.assertTrue(head.startswith(b"HTTP/1.1 200"), head)
        return body

    # --- refused upgrades: no tunnel, no smuggling -------------------------------------------
    def refused_then_second_request(self, path, status):
        """A handshake the replica refuses with `status`, and a second request sent at once on the
        same client connection: ingressd relays the refusal and then parses the second request as
        HTTP (it reaches the replica as a request of its own), never as tunnelled bytes."""
        r = self.replica()
        d = self.ingressd([r])
        s = socket.create_connection((NODE, d.port))
        self.addCleanup(s.close)
        s.sendall(("GET %s HTTP/1.1\r\nHost: x\r\nUpgrade: websocket\r\nConnection: Upgrade\r\n"
                   "Sec-WebSocket-Key: dGhlIHNhbXBsZSBub25jZQ==\r\nSec-WebSocket-Version: 13\r\n\r\n"
                   "GET /plain?second HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n" % path).encode())
        data = support.read_all(s)
        first, _, rest = data.partition(b"\r\n\r\n")
        self.assertTrue(first.startswith(b"HTTP/1.1 %d" % status), data[:300])
        self.assertNotIn(b"upgrade: websocket", first.lower())
        self.assertIn(b"plain r1 /plain?second", rest)

    def test_refused_upgrade_200_then_http(self):
        self.refused_then_second_request("/refuse/200", 200)

    def test_refused_upgrade_426_then_http(self):
        self.refused_then_second_request("/refuse/426", 426)

    def test_other_upgrades_are_not_tunnelled(self):
        """Upgrade: h2c (and any upgrade but websocket) is dropped as hop-by-hop: a plain request."""
        r = self.replica()
        d = self.ingressd([r])
        s = socket.create_connection((NODE, d.port))
        self.addCleanup(s.close)
        s.sendall(b"GET /plain HTTP/1.1\r\nHost: x\r\nUpgrade: h2c\r\nConnection: Upgrade, HTTP2-Settings\r\n"
                  b"HTTP2-Settings: AAMAAABkAARAAAAAAAIAAAAA\r\nConnection: close\r\n\r\n")
        data = support.read_all(s)
        self.assertTrue(data.startswith(b"HTTP/1.1 200"), data[:200])
        self.assertIn(b"plain r1 /plain", data)

    # --- routing, TLS, limits, drain, timeouts -----------------------------------------------
    def test_router_app_pins_the_tunnel(self):
        """router.methods with GET: the handshake asks the app's router, and the tunnel goes to
        the replica it named."""
        r1, r2 = self.replica("r1"), self.replica("r2")
        rt = Router("SERVE_REPLICA::ws#r2")
        self.addCleanup(rt.stop)
        d = self.ingressd([r1, r2], config=CONFIG + "router:\n  methods: [GET, POST]\n", routers=[rt])

        async def go():
            got = []
            for _ in range(3):
                async with websockets.connect(self.url(d, "/ws/info"), compression=None) as ws:
                    got.append(json.loads(await ws.recv())["replica"])
            return got
        self.assertEqual(run(go()), ["r2"] * 3)
        self.assertGreaterEqual(rt.calls, 3)

    def test_over_tls(self):
        tmp = tempfile.TemporaryDirectory()
        self.addCleanup(tmp.cleanup)
        cert, key = os.path.join(tmp.name, "cert.pem"), os.path.join(tmp.name, "key.pem")
        subprocess.run(["openssl", "req", "-x509", "-newkey", "ec", "-pkeyopt", "ec_paramgen_curve:P-256",
                        "-nodes", "-keyout", key, "-out", cert, "-days", "2", "-subj", "/CN=localhost",
                        "-addext", "subjectAltName=DNS:localhost,IP:" + NODE], check=True, capture_output=True)
        r = self.replica()
        d = self.ingressd([r], extra_args=["--tls-listen", NODE + ":0", "--tls-cert", cert, "--tls-key", key])
        port = int(re.search(r", https 127\.0\.0\.2:(\d+)", d.out.text()).group(1))
        ctx = ssl.create_default_context(cafile=cert)
        blob = os.urandom(300 * 1024)

        async def go():
            async with websockets.connect(self.url(d, "/ws/echo", "wss", port), ssl=ctx, server_hostname="localhost",
                                          max_size=4 * 1024 * 1024, compression=None) as ws:
                await ws.send("over tls")
                a = await ws.recv()
                await ws.send(blob)
                b = await ws.recv()
                return a, b == blob
        self.assertEqual(run(go()), ("over tls", True))

    def test_max_tunnels(self):
        r = self.replica()
        d = self.ingressd([r], config=CONFIG + "client:\n  max_tunnels: 1\n")

        async def go():
            async with websockets.connect(self.url(d, "/ws/echo"), compression=None) as ws:
                await ws.send("one")
                await ws.recv()
                with self.assertRaises(websockets.InvalidStatusCode) as cm:
                    await websockets.connect(self.url(d, "/ws/echo"), compression=None)
                return cm.exception.status_code, cm.exception.headers.get("X-Serve-Reason")
        self.assertEqual(run(go()), (503, "tunnel_limit"))

    def test_idle_tunnel_closed_by_timeout(self):
        r = self.replica()
        d = self.ingressd([r], config=CONFIG + "timeout:\n  tunnel: 1s\n", access_log=True)

        async def go():
            async with websockets.connect(self.url(d, "/ws/echo?id=idle"), compression=None) as ws:
                with self.assertRaises(websockets.ConnectionClosed):
                    await ws.recv()
                return ws.close_code
        self.assertEqual(run(go()), 1006)
        r.wait(r"^CLOSED idle 1006$")
        line = self.access_line(d, lambda e: e.get("status") == 101)
        self.assertEqual(line["tunnel"]["closed_by"], "timeout")
        self.assertEqual(line["termination"], "timeout")

    def test_drain_lets_tunnels_run_then_closes_them(self):
        """SIGTERM: an open tunnel keeps working during the drain, then is closed at drain.timeout."""
        r = self.replica()
        d = self.ingressd([r], config=CONFIG.replace("timeout: 5s", "timeout: 2s"))

        async def go():
            async with websockets.connect(self.url(d, "/ws/echo"), compression=None) as ws:
                await ws.send("before")
                assert await ws.recv() == "before"
                d.signal(signal.SIGTERM)
                d.out.wait_for(r"drain", 10)
                await ws.send("during")
                during = await ws.recv()
                with self.assertRaises(websockets.ConnectionClosed):
                    await ws.recv()
                return during
        self.assertEqual(run(go(), 60), "during")
        d.wait_exit(30)

    def test_replica_leaving_the_topology_keeps_its_tunnels(self):
        """A replica that leaves the topology (or is marked down) gets no new handshakes, and the
        tunnels already open to it go on."""
        r1, r2 = self.replica("r1"), self.replica("r2")
        d = self.ingressd([r1])

        async def go():
            async with websockets.connect(self.url(d, "/ws/info"), compression=None) as ws:
                self.assertEqual(json.loads(await ws.recv())["replica"], "r1")
                d.write_topology(topology([r2]))
                d.wait_until("only r2 in the topology", lambda: [
                    support.replica_key(x) for a in d.topology().get("apps", []) for x in a.get("replicas", [])
                ] == [r2.key])
                async with websockets.connect(self.url(d, "/ws/info"), compression=None) as ws2:
                    self.assertEqual(json.loads(await ws2.recv())["replica"], "r2")
                await ws.send("still here")
                return await ws.recv()
        self.assertEqual(run(go()), "still here")

    # --- observability ---------------------------------------------------------------------
    def access_line(self, d, pred):
        def find():
            try:
                with open(d.access_log_path) as f:
                    for raw in f:
                        e = json.loads(raw)
                        if pred(e):
                            return e
            except FileNotFoundError:
                return None
            return None
        return d.wait_until("an access log line", find)

    def test_metrics_and_access_log(self):
        r = self.replica()
        d = self.ingressd([r], access_log=True)

        async def go():
            async with websockets.connect(self.url(d, "/ws/echo"), compression=None) as ws:
                await ws.send("x" * 1000)
                await ws.recv()
                d.wait_until("ingressd_tunnels 1",
                             lambda: metric_value(d.metrics(), "ingressd_tunnels") == 1)
        run(go())
        d.wait_until("ingressd_tunnels 0", lambda: metric_value(d.metrics(), "ingressd_tunnels") == 0)
        m = d.metrics()
        to_replica = metric_value(m, "ingressd_tunnel_bytes_total", {"direction": "to_replica"})
        to_client = metric_value(m, "ingressd_tunnel_bytes_total", {"direction": "to_client"})
        # 1000 payload bytes each way plus framing (the client's are masked: 4 bytes more) and
        # the close handshake.
        self.assertGreaterEqual(to_replica, 1000)
        self.assertGreaterEqual(to_client, 1000)
        self.assertEqual(metric_value(m, "ingressd_tunnel_duration_seconds_count", {"app": "ws"}), 1)
        self.assertEqual(metric_value(m, "ingressd_requests_total", {"app": "ws", "code": "101"}), 1)
        line = self.access_line(d, lambda e: e.get("status") == 101)
        self.assertEqual(line["path"], "/ws/echo")
        # The client closed the WebSocket; in its close handshake the server ends TCP first
        # (RFC 6455 §7.1.1), so the replica's FIN is the first end ingressd sees.
        self.assertEqual(line["tunnel"]["closed_by"], "replica")
        self.assertEqual(line["termination"], "ok")
        self.assertEqual(line["tunnel"]["bytes_to_replica"], to_replica)
        self.assertEqual(line["bytes"], to_client)


if __name__ == "__main__":
    support.run_suite()
