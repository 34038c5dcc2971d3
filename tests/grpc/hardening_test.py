#!/usr/bin/python3
"""Hardening tests of ingressd's gRPC (h2c) listener (issue #20 item 6): raw HTTP/2 abuse.

    /usr/bin/python3 tests/grpc/hardening_test.py --ingressd build/release/ingressd [-v] [TEST ...]

Each test starts a fake replica (tests/fakes/grpc_replica.py) and ingressd with a one-app gRPC
topology (support.py), opens raw TCP connections to the gRPC port and speaks HTTP/2 frames built
by hand (h2raw.py: struct, literal/indexed HPACK fields without Huffman). It asserts the frames
ingressd answers with (GOAWAY / RST_STREAM and their error codes), that the connection is closed,
the ingressd_grpc_connection_errors_total{reason} counter, that the daemon's CPU (run time of its
threads from /proc/<pid>/task/*/schedstat: nanoseconds, where utime+stime counts 10 ms ticks) and
memory (VmRSS) stayed bounded, and that a normal grpc call still succeeds afterwards.

Loopback only (127.0.0.2), ports bound as 0, every process and thread stopped in cleanups. No
sleeps as synchronisation: frames are read until the expected one arrives or the connection
closes, each read bounded by the socket timeout.

At the end a table of the measured costs (daemon CPU per flood frame, RSS change) is printed to
stderr.
"""

import json
import os
import sys
import unittest

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import h2raw as h  # noqa: E402
import support  # noqa: E402
from support import group, jdump, jload, metric_value, target, topology  # noqa: E402

import grpc  # noqa: E402

HOST = support.THIS_NODE
HANG = "/test.Echo/Hang"
UNARY = "/test.Echo/Unary"
READ_TIMEOUT = 10.0  # bound of one socket read (a frame expected from the daemon)

# Health checks far apart (the first within a minute, and two failures needed): a replica that
# never answers (StallServer) stays up for the length of a test.
BASE_CONFIG = support.HEALTH_SLOW_CONFIG

# CPU bound of a flood: at most this much daemon CPU per frame sent, plus a fixed allowance for
# what runs beside it (connection set-up, the admin /metrics scrape, timers). nghttp2 spends
# around a microsecond on a small frame; 50 µs is a generous ceiling that still catches a daemon
# doing per-frame work in the milliseconds (or spinning).
CPU_PER_FRAME = 50e-6
CPU_BASE = 0.5

COSTS = []  # (test, what, frames sent, daemon CPU seconds, extra) for the report at the end


def config(client=None, grpc_section=None):
    text = BASE_CONFIG
    if client:
        text += "client:\n" + "".join("  %s: %s\n" % kv for kv in client.items())
    if grpc_section:
        text += "grpc:\n" + "".join("  %s: %s\n" % kv for kv in grpc_section.items())
    return text


def conn_errors(d, reason):
    return metric_value(d.metrics(), "ingressd_grpc_connection_errors_total", {"reason": reason})


class HardeningTest(unittest.TestCase):
    maxDiff = 4000

    # --- fixtures ------------------------------------------------------------------------------
    def start(self, cfg=BASE_CONFIG, stall=False, access_log=False):
        """A fake replica (app "echo") and ingressd; with stall, also a StallServer as app
        "stall". Sets self.d, self.r, self.stall, self.app (metadata of normal calls)."""
        self.r = support.FakeReplica("r1")
        self.addCleanup(self.r.stop)
        groups = [group("echo", [target(self.r)])]
        self.stall = None
        if stall:
            self.stall = h.StallServer(HOST)
            self.addCleanup(self.stall.stop)
            groups.append(group("stall", [{"ip": HOST, "port": self.stall.port,
                                           "instance_id": "n1",
                                           "name": "SERVE_REPLICA::stall"}]))
        self.d = support.Ingressd(topology(*groups), config=cfg, access_log=access_log)
        self.addCleanup(self.d.stop)
        expected = {"echo": [self.r.key]}
        if stall:
            expected["stall"] = [self.stall.key]
        self.d.wait_grpc_apps(expected, up=set(k for keys in expected.values() for k in keys))
        self.app = "echo" if stall else None
        self.pid = self.d.proc.pid
        return self.d

    def raw(self, timeout=READ_TIMEOUT):
        c = h.Conn(HOST, self.d.grpc_port, timeout=timeout)
        self.addCleanup(c.close)
        return c

    def opened(self, timeout=READ_TIMEOUT, ack=True):
        """A raw connection after the preface exchange: our preface + SETTINGS sent, the daemon's
        SETTINGS read (and acknowledged when ack). Returns (conn, daemon settings)."""
        c = self.raw(timeout)
        c.start()
        s = c.server_settings()
        self.assertIsNotNone(s, "no SETTINGS from the daemon; %s; %s" % (c.describe(), self.d.describe()))
        if ack:
            c.send(h.settings_ack())
        return c, s

    def request_block(self, path=HANG, app=None, extra=()):
        md = [("application", app)] if app else []
        return h.grpc_request_block(path, extra=tuple(md) + tuple(extra))

    def unary(self, payload=b"still serving", timeout=10.0):
        ch = self.d.channel()
        md = (("application", self.app),) if self.app else ()
        body, call = ch.unary_unary(UNARY).with_call(payload, timeout=timeout, metadata=md)
        return jload(body), call

    def assert_serves(self, what):
        """The daemon is alive and a normal grpc call (a new connection) succeeds."""
        self.assertIsNone(self.d.proc.poll(), "ingressd died after %s; %s" % (what, self.d.describe()))
        try:
            reply, call = self.unary()
        except grpc.RpcError as e:
            self.fail("a normal call after %s failed: %s %s; %s"
                      % (what, e.code(), e.details(), self.d.describe()))
        self.assertEqual(call.code(), grpc.StatusCode.OK)
        self.assertEqual(reply["replica"], "r1")
        self.assertEqual(reply["echo"], "still serving")

    def gated_streams(self, prefix, ch=None, n=5):
        """n server streams of 3 messages, each held after its first by the fake's gate, seen
        started by the replica: on channel `ch`, or each on its own channel."""
        streams = [(ch or self.d.channel()).unary_stream("/test.Echo/ServerStream")(
            jdump({"n": 3, "gate": True, "id": "%s-%d" % (prefix, i)}), timeout=120) for i in range(n)]
        for i in range(n):
            self.assertTrue(self.r.wait_started("%s-%d" % (prefix, i)), "call %s-%d did not start" % (prefix, i))
        return streams

    def assert_gated_complete(self, streams, prefix, beside):
        """The gated streams, released, deliver all their messages."""
        for i in range(len(streams)):
            self.r.release("%s-%d" % (prefix, i))
        for i, it in enumerate(streams):
            try:
                got = [jload(m)["i"] for m in it]
            except grpc.RpcError as e:
                self.fail("call %s-%d failed beside %s: %s %s; %s"
                          % (prefix, i, beside, e.code(), e.details(), self.d.describe()))
            self.assertEqual(got, [0, 1, 2])

    def assert_goaway_and_close(self, c, code, what, on_frame=None):
        """Reads until the connection closes: a GOAWAY with `code` must be among the frames and
        the connection must end (EOF or reset), not just stall. Returns the GOAWAY."""
        c.read_to_close(on_frame)
        goaways = c.goaways()
        self.assertTrue(goaways, "%s: no GOAWAY; %s" % (what, c.describe()))
        self.assertEqual([h.error_name(g.error_code) for g in goaways][-1:], [h.error_name(code)],
                         "%s: GOAWAY error code; %s" % (what, c.describe()))
        self.assertIn(c.closed, ("eof", "reset"),
                      "%s: the daemon sent GOAWAY but did not close the connection within %.0fs; %s"
                      % (what, c.timeout, c.describe()))
        return goaways[-1]

    def access_log_line(self, what, match):
        """The first access log line `match` accepts, once the daemon has written it."""
        def line():
            try:
                with open(self.d.access_log_path) as f:
                    lines = [json.loads(x) for x in f if x.strip()]
            except FileNotFoundError:
                return None
            lines = [x for x in lines if match(x)]
            return lines[0] if lines else None
        return self.d.wait_until(what + " access log line", line)

    def assert_counted(self, reason, before, what):
        after = conn_errors(self.d, reason)
        self.assertIsNotNone(after, "no ingressd_grpc_connection_errors_total{reason=%r}" % reason)
        self.assertEqual(after, (before or 0) + 1,
                         '%s: ingressd_grpc_connection_errors_total{reason="%s"} went %s -> %s'
                         % (what, reason, before, after))

    def cpu(self):
        return h.cpu_seconds(self.pid)

    def assert_cpu_bounded(self, what, cpu_before, frames, extra=""):
        used = self.cpu() - cpu_before
        COSTS.append((self.id().rsplit(".", 1)[-1], what, frames, used, extra))
        bound = CPU_BASE + CPU_PER_FRAME * frames
        self.assertLessEqual(used, bound, "%s: daemon CPU %.3fs for %d frames sent (bound %.3fs)"
                             % (what, used, frames, bound))

    # --- baseline: the raw client itself -------------------------------------------------------
    def test_raw_client_baseline(self):
        """Not abuse: the hand-built frames make a valid call, and the daemon announces what the
        other tests rely on (stream window 256 KiB, connection window 1 MiB, header list limit)."""
        self.start(config(client={"max_header_bytes": "16KiB"}))
        c, s = self.opened()
        self.assertEqual(s.get(h.SETTINGS_INITIAL_WINDOW_SIZE), 256 * 1024, s)
        self.assertEqual(s.get(h.SETTINGS_MAX_HEADER_LIST_SIZE), 16 * 1024, s)
        self.assertEqual(s.get(h.SETTINGS_MAX_CONCURRENT_STREAMS), 100, s)
        c.send(h.headers(1, self.request_block(UNARY)) + h.data(1, h.grpc_message(b"raw hello"), True))
        end = c.read_until(lambda f: f.sid == 1 and f.flags & h.END_STREAM, h.auto_ack(c))
        self.assertIsNotNone(end, c.describe())
        conn_window = h.DEFAULT_WINDOW + sum(f.increment for f in c.frames
                                             if f.type == h.WINDOW_UPDATE and f.sid == 0)
        self.assertGreaterEqual(conn_window, 1024 * 1024, c.describe())
        body = b"".join(f.payload for f in c.frames if f.type == h.DATA and f.sid == 1)
        self.assertEqual(json.loads(body[5:])["echo"], "raw hello", c.describe())
        self.assertFalse(c.goaways(), c.describe())
        self.assertFalse(c.rsts(), c.describe())

    def test_plain_http_request_over_h2_is_told_http11_is_required(self):
        """Issue #29 item 3: an HTTP request (no application/grpc content type) reaches the gRPC
        code when a client speaks only h2 (TLS ALPN h2, or prior knowledge). It is refused on its
        stream with HTTP_1_1_REQUIRED (curl then retries over HTTP/1.1), never answered as a gRPC
        no_route, and the connection goes on serving gRPC calls."""
        self.start()
        c, _ = self.opened()
        block = b"".join([h.indexed(2),  # :method GET
                          h.indexed(h.STATIC_SCHEME_HTTP),
                          h.literal(":path", "/v1/models", index_name=h.STATIC_PATH),
                          h.literal(":authority", "ingressd.test", index_name=h.STATIC_AUTHORITY),
                          h.literal("accept", "application/json")])
        c.send(h.headers(1, block, end_stream=True))
        rst = c.read_until(lambda f: f.sid == 1 and f.type == h.RST_STREAM, h.auto_ack(c))
        self.assertIsNotNone(rst, c.describe())
        self.assertEqual(h.error_name(rst.error_code), h.error_name(h.HTTP_1_1_REQUIRED), c.describe())
        self.assertFalse([f for f in c.frames if f.sid == 1 and f.type == h.HEADERS],
                         "no response headers (no gRPC trailers-only no_route): %s" % c.describe())
        # The same connection still serves a gRPC call.
        c.send(h.headers(3, self.request_block(UNARY)) + h.data(3, h.grpc_message(b"after"), True))
        end = c.read_until(lambda f: f.sid == 3 and f.flags & h.END_STREAM, h.auto_ack(c))
        self.assertIsNotNone(end, c.describe())
        self.assertFalse(c.goaways(), c.describe())

    def test_call_cancelled_before_any_response_is_logged_499_cancelled(self):
        """Issue #29 item 6: a call whose client cancels before the replica answered anything was
        logged with status 0. Now 499 (the client went away), grpc_status CANCELLED."""
        self.start(stall=True, access_log=True)
        ch = self.d.channel()
        fut = ch.unary_unary("/test.Echo/Unary").future(b"{}", timeout=60, metadata=(("application", "stall"),))
        self.d.wait_until("the call reached ingressd",
                          lambda: metric_value(self.d.metrics(), "ingressd_grpc_active_streams") == 1)
        fut.cancel()

        got = self.access_log_line("the cancelled call's", lambda x: x.get("app") == "stall")
        self.assertEqual(got.get("status"), 499, got)
        self.assertEqual(got.get("grpc_status"), 1, got)
        self.assertEqual(got.get("termination"), "client_abort", got)

    def test_proxy_protocol_on_the_grpc_listener(self):
        """Issue #28 item 2: with client.proxy_protocol, a gRPC connection starts with a PROXY
        header from a trusted proxy; its source is the client in the access log. A connection
        without one is closed without a byte (no GOAWAY: it is not HTTP/2 yet) and counted."""
        self.start(config(client={"proxy_protocol": "true", "trusted_proxies": "[127.0.0.0/8]"}), access_log=True)
        c = self.raw()
        c.send(b"PROXY TCP4 198.51.100.7 127.0.0.2 40001 9000\r\n")
        c.start()
        c.send(h.headers(1, self.request_block(UNARY)) + h.data(1, h.grpc_message(b"proxied"), True))
        end = c.read_until(lambda f: f.sid == 1 and f.flags & h.END_STREAM, h.auto_ack(c))
        self.assertIsNotNone(end, c.describe())
        body = b"".join(f.payload for f in c.frames if f.type == h.DATA and f.sid == 1)
        self.assertEqual(json.loads(body[5:])["echo"], "proxied", c.describe())

        got = self.access_log_line("the call's", lambda x: True)
        self.assertEqual(got.get("client"), "198.51.100.7", got)

        bare = self.raw()
        bare.start()  # the HTTP/2 preface where the PROXY header should be
        bare.read_to_close()
        self.assertIn(bare.closed, ("eof", "reset"), bare.describe())
        self.assertFalse(bare.frames, "closed without a response: %s" % bare.describe())
        self.d.wait_until("ingressd_proxy_protocol_errors_total{reason=invalid} == 1",
                          lambda: metric_value(self.d.metrics(), "ingressd_proxy_protocol_errors_total",
                                               {"reason": "invalid"}) == 1)

    # --- 1. invalid preface --------------------------------------------------------------------
    def check_bad_preface(self, payload, what):
        self.start()
        before = conn_errors(self.d, "protocol")
        c = self.raw()
        c.send(payload)
        self.assert_goaway_and_close(c, h.PROTOCOL_ERROR, what)
        self.assert_counted("protocol", before, what)
        self.assert_serves(what)

    def test_invalid_preface_http1(self):
        self.check_bad_preface(b"GET / HTTP/1.1\r\nHost: ingressd.test\r\nUser-Agent: x\r\n\r\n",
                               "an HTTP/1.1 request instead of the preface")

    def test_invalid_preface_garbage(self):
        self.check_bad_preface(bytes(range(256)) * 4, "1 KiB of garbage instead of the preface")

    def test_invalid_preface_tls_client_hello(self):
        # A TLS ClientHello's first bytes (a TLS client at the h2c port).
        hello = bytes.fromhex("16030100f8010000f40303") + b"\x00" * 32 + b"\x20" + b"\x11" * 32
        self.check_bad_preface(hello, "a TLS ClientHello instead of the preface")

    # --- 2. floods -----------------------------------------------------------------------------
    def check_flood(self, make_frame, count, read_while_sending, what, open_stream=False,
                    expect_reason="flood"):
        """Sends make_frame() (one frame or a few) count times, in chunks of 100, from a thread;
        with read_while_sending the frames the daemon sends are read meanwhile, otherwise only once
        everything is sent. Expects GOAWAY ENHANCE_YOUR_CALM, the close, reason counted."""
        self.start()
        before = conn_errors(self.d, expect_reason)
        cpu0 = self.cpu()
        c, _ = self.opened()
        if open_stream:
            c.send(h.headers(1, self.request_block(HANG)))
        one = make_frame()
        chunk = one * 100
        chunks = [chunk] * (count // 100)
        sender = c.send_in_background(chunks)
        if not read_while_sending:
            sender.join(60)  # the daemon closes or keeps reading: sendall ends either way
            self.assertFalse(sender.is_alive(), "sending the flood blocked for 60s; " + c.describe())
        g = self.assert_goaway_and_close(c, h.ENHANCE_YOUR_CALM, what)
        sender.join(30)
        self.assertFalse(sender.is_alive(), "the sender did not finish; " + c.describe())
        self.assert_counted(expect_reason, before, what)
        self.assert_cpu_bounded(what, cpu0, count * h.count_frames(one),
                                "GOAWAY last_stream_id=%d" % g.last_stream_id)
        self.assert_serves(what)
        return c

    def test_settings_flood_unread(self):
        """10000 empty SETTINGS frames, the acks not read while sending."""
        self.check_flood(lambda: h.settings(), 10000, False, "SETTINGS flood (acks unread)")

    def test_settings_flood_read(self):
        """10000 SETTINGS frames (each with an entry), the acks read as they come."""
        self.check_flood(lambda: h.settings([(h.SETTINGS_ENABLE_PUSH, 0)]), 10000, True,
                         "SETTINGS flood (acks read)")

    def test_ping_flood_unread(self):
        self.check_flood(lambda: h.ping(b"floodpin"), 20000, False, "PING flood (acks unread)")

    def test_ping_flood_read(self):
        self.check_flood(lambda: h.ping(b"floodpin"), 20000, True, "PING flood (acks read)")

    def test_empty_data_flood(self):
        """An open stream (a Hang call), then 10000 DATA frames of length 0 without END_STREAM."""
        self.check_flood(lambda: h.data(1, b""), 10000, True, "empty DATA flood", open_stream=True)

    def test_window_update_flood(self):
        """WINDOW_UPDATE frames of increment 1 on the connection carry no request either."""
        self.check_flood(lambda: h.window_update(0, 1), 10000, True, "WINDOW_UPDATE flood")

    def test_priority_flood(self):
        self.check_flood(lambda: h.frame(h.PRIORITY, 0, 1, b"\x00\x00\x00\x00\x10"), 10000, True,
                         "PRIORITY flood")

    def check_acks_backed_up(self, make_frame, what):
        """The ack cap of nghttp2 (at most 1000 queued PING/SETTINGS acks): a client with a 4 KiB
        receive buffer sends rounds of a 1-byte DATA frame of an open call (useful: the frame
        budget, 1000 + 10 per useful frame, is never reached) and 9 PING/SETTINGS frames, and
        reads nothing while it sends. It goes on (up to 20 MB) until the daemon stops taking
        bytes (a send blocked for 2s, the socket timeout): once the acks fill the daemon's socket
        and its 64 KiB write buffer they pile up in nghttp2, which refuses the 1001st. Then the
        client reads: GOAWAY ENHANCE_YOUR_CALM, reason flood."""
        self.start()
        before = conn_errors(self.d, "flood")
        cpu0 = self.cpu()
        c = h.Conn(HOST, self.d.grpc_port, timeout=READ_TIMEOUT, rcvbuf=4096)
        self.addCleanup(c.close)
        c.start()
        self.assertIsNotNone(c.server_settings(), c.describe())
        c.send(h.settings_ack())
        per_round = 9
        c.send(h.headers(1, self.request_block(HANG))
               + h.data(1, h.grpc_message(b"")[:1] + (10 ** 9).to_bytes(4, "big")))
        one = make_frame()
        chunk = (h.data(1, b" ") + one * per_round) * 100
        c.sock.settimeout(2.0)  # the bound of a send the daemon does not take
        sender = c.send_in_background([chunk] * (20 * 1024 * 1024 // len(chunk)))
        sender.join(120)
        self.assertFalse(sender.is_alive(), "sending did not end; " + c.describe())
        c.sock.settimeout(READ_TIMEOUT)
        frames = c.chunks_sent * 100 * (per_round + 1)
        sent = c.chunks_sent * 100 * per_round
        c.read_to_close()
        acks = sum(1 for f in c.frames if f.type == one[3] and f.flags & h.ACK) - 1  # ours
        COSTS.append((self.id().rsplit(".", 1)[-1], what + " (acks)", frames, 0.0,
                      "acks received: %d of >= %d sent; send: %r; %s"
                      % (acks, sent, c.send_error, h.summarize(c.frames[-3:]))))
        self.assertIn(c.closed, ("eof", "reset"), "%s: connection not closed; %s" % (what, c.describe()))
        self.assertLess(acks, sent, "every frame was acknowledged; " + c.describe())
        self.assert_counted("flood", before, what)
        self.assert_cpu_bounded(what, cpu0, frames)
        self.assert_serves(what)
        # Last: the GOAWAY itself. It is queued behind the acks the client has not read; a close()
        # while the client's bytes are still unread makes the kernel send RST and drop them.
        goaways = c.goaways()
        self.assertEqual([h.error_name(g.error_code) for g in goaways], ["ENHANCE_YOUR_CALM"],
                         "%s: the connection ended (counted as flood) but the GOAWAY did not arrive; "
                         "%s" % (what, c.describe()))

    def test_ping_flood_acks_backed_up(self):
        self.check_acks_backed_up(lambda: h.ping(b"backedup"), "PING flood, acks backed up")

    def test_padded_empty_data_flood(self):
        """DATA frames whose only payload is the pad length byte (PADDED, pad length 0): no
        request data, like empty DATA frames, so the same budget applies."""
        self.check_flood(lambda: h.frame(h.DATA, h.PADDED, 1, b"\x00"), 10000, True,
                         "padded empty DATA flood", open_stream=True)

    def test_ping_flood_between_padded_empty_data(self):
        """PINGs, 10 after each padded empty DATA frame (which carries no request data either),
        acks read: the budget must still run out."""
        self.check_flood(lambda: h.frame(h.DATA, h.PADDED, 1, b"\x00") + h.ping(b"launder!") * 10,
                         2000, True, "PINGs between padded empty DATA", open_stream=True)

    # --- isolation (issue #31 item 1) ----------------------------------------------------------
    def test_clients_that_stop_reading_stall_only_their_own_calls(self):
        """Eight raw clients each start a large server stream on the same replica and never send
        WINDOW_UPDATE (nor read). Every one of those streams still gets 200 KB out of the replica
        (ingressd holds up to a stream window of each, 256 KiB: 1.6 MB in all, more than the
        upstream link's 1 MiB connection window that used to be acknowledged only as each call's
        client took its bytes); and unary calls of another client to the same replica, over the
        same upstream link, all succeed while the eight are stalled."""
        self.start()
        ch = self.d.channel()
        ch.unary_unary(UNARY).with_call(b"warm", timeout=10.0)  # the upstream link is up
        before = []
        for i in range(100):
            t = h.Stopwatch()
            self.unary(b"before %d" % i, timeout=10.0)
            before.append(t.elapsed())
        stalled = 8
        for i in range(stalled):
            c, _ = self.opened()
            block = self.request_block("/test.Echo/ServerStream")
            c.send(h.headers(1, block) + h.data(1, h.grpc_message(
                jdump({"n": 400, "size": 4000, "id": "stalled-%d" % i})), True))
        for i in range(stalled):
            got = self.r.control("WaitSent", {"id": "stalled-%d" % i, "count": 50, "timeout": 20}, 30)
            self.assertTrue(got["reached"], "stalled stream %d got only %d messages out of the replica: "
                            "another call's reader holds the link's window; %s" % (i, got["sent"], self.d.describe()))
        during = []
        for i in range(100):
            t = h.Stopwatch()
            try:
                reply, call = self.unary(b"during %d" % i, timeout=5.0)
            except grpc.RpcError as e:
                self.fail("unary call %d beside %d stalled streams failed: %s %s" % (i, stalled, e.code(), e.details()))
            during.append(t.elapsed())
            self.assertEqual(reply["echo"], "during %d" % i)
        before.sort()
        during.sort()
        COSTS.append(("isolation", "unary p50/p99 ms before %.2f/%.2f, beside %d stalled streams %.2f/%.2f "
                      "(100 of 100 succeeded)"
                      % (before[50] * 1e3, before[98] * 1e3, stalled, during[50] * 1e3, during[98] * 1e3),
                      0, 0.0, ""))

    def test_metadata_larger_than_the_replica_accepts(self):
        """A call with 20 KB of metadata: ingressd takes it (client.max_header_bytes is 64 KiB),
        the replica (grpcio) says in its SETTINGS it takes 8 KiB. Sent on, grpcio failed every
        call of the shared connection and closed it, and the replica was counted as failing.
        Now the caller alone gets RESOURCE_EXHAUSTED, the replica never sees the call, and five
        calls of other clients in flight on the same upstream connection complete."""
        self.start()
        others = self.gated_streams("other")
        unary_before = self.r.calls(UNARY)
        with self.assertRaises(grpc.RpcError) as caught:
            self.d.channel().unary_unary(UNARY).with_call(b"big", timeout=10, metadata=(("x-big", "v" * 20000),))
        self.assertEqual(caught.exception.code(), grpc.StatusCode.RESOURCE_EXHAUSTED, caught.exception.details())
        self.assertIn("more than the replica accepts", caught.exception.details())
        self.assertEqual(self.r.calls(UNARY), unary_before, "the call was sent to the replica")
        self.assert_gated_complete(others, "other", "the large-metadata call")
        self.assert_serves("a call with more metadata than the replica accepts")

    # --- 3. rapid reset ------------------------------------------------------------------------
    def test_rapid_reset(self):
        self.start()
        before = conn_errors(self.d, "reset_flood")
        cpu0 = self.cpu()
        c, _ = self.opened()
        n = 400
        block = self.request_block(HANG)
        burst = [b"".join(h.headers(sid, block) + h.rst_stream(sid, h.CANCEL)
                          for sid in range(1 + 2 * i, 1 + 2 * (i + 50), 2))
                 for i in range(0, n, 50)]
        sender = c.send_in_background(burst)
        g = self.assert_goaway_and_close(c, h.ENHANCE_YOUR_CALM, "rapid reset", h.auto_ack(c))
        sender.join(30)
        self.assert_counted("reset_flood", before, "rapid reset")
        # The rule: 100 early resets and more than half of the streams reset. The GOAWAY's last
        # stream id says how many streams the daemon took before it ended the connection.
        taken = (g.last_stream_id + 1) // 2
        self.assertGreaterEqual(taken, 100, "GOAWAY before 100 streams were reset; " + c.describe())
        self.assertLess(taken, n, "the daemon took every stream; " + c.describe())
        self.assert_cpu_bounded("rapid reset", cpu0, 2 * n, "streams taken before GOAWAY: %d" % taken)
        self.assert_serves("rapid reset")

    def test_rapid_reset_with_a_deadline_is_still_caught(self):
        """The attack does not escape the rule by carrying a deadline: streams opened with
        grpc-timeout 10S and reset at once are early resets like any other."""
        self.start()
        before = conn_errors(self.d, "reset_flood")
        c, _ = self.opened()
        block = self.request_block(HANG, extra=[("grpc-timeout", "10S")])
        burst = [b"".join(h.headers(sid, block) + h.rst_stream(sid, h.CANCEL)
                          for sid in range(1 + 2 * i, 1 + 2 * (i + 50), 2))
                 for i in range(0, 400, 50)]
        sender = c.send_in_background(burst)
        self.assert_goaway_and_close(c, h.ENHANCE_YOUR_CALM, "rapid reset with deadlines", h.auto_ack(c))
        sender.join(30)
        self.assert_counted("reset_flood", before, "rapid reset with deadlines")

    def test_calls_ended_by_their_own_deadlines_are_not_rapid_reset(self):
        """Issue #31: 1,500 calls with a 20 ms deadline on one grpcio channel (grpcio resets each
        call whose deadline passes) tripped the rapid-reset rule, and five unrelated long calls on
        that channel failed UNAVAILABLE; with many more, nghttp2's own reset limit closed the
        connection (GOAWAY INTERNAL_ERROR after 1,001 resets), and grpc-core's resets of streams
        it never opened ended it too (PROTOCOL_ERROR "stream in idle"). A reset when the call's
        deadline has passed is not abuse, and a reset of a stream never opened is dropped: all
        1,500 end DEADLINE_EXCEEDED, the five complete, nothing is counted as a flood."""
        self.start()
        before = conn_errors(self.d, "reset_flood")
        ch = self.d.channel()
        longs = self.gated_streams("long", ch)
        hang = ch.unary_unary(HANG)
        futures = [hang.future(jdump({"id": "dl-%d" % i}), timeout=0.02) for i in range(1500)]
        codes = {}
        for f in futures:
            e = f.exception()  # waits for the call to end
            code = e.code() if e is not None else grpc.StatusCode.OK
            codes[code] = codes.get(code, 0) + 1
        self.assertEqual(codes, {grpc.StatusCode.DEADLINE_EXCEEDED: 1500})
        self.assert_gated_complete(longs, "long", "1,500 expiring calls")
        self.assertEqual(conn_errors(self.d, "reset_flood") or 0, before or 0)

    def test_cancels_below_reset_threshold_tolerated(self):
        """99 streams opened and cancelled at once stay below the rapid-reset rule: the connection
        lives on and still makes calls."""
        self.start()
        before = conn_errors(self.d, "reset_flood")
        c, _ = self.opened()
        block = self.request_block(HANG)
        c.send(b"".join(h.headers(sid, block) + h.rst_stream(sid, h.CANCEL)
                        for sid in range(1, 1 + 2 * 99, 2)))
        sid = 1 + 2 * 99
        c.send(h.headers(sid, self.request_block(UNARY)) + h.data(sid, h.grpc_message(b"after 99"), True))
        end = c.read_until(lambda f: (f.sid == sid and f.flags & h.END_STREAM) or f.type == h.GOAWAY,
                           h.auto_ack(c))
        self.assertIsNotNone(end, c.describe())
        self.assertNotEqual(end.type, h.GOAWAY, c.describe())
        body = b"".join(f.payload for f in c.frames if f.type == h.DATA and f.sid == sid)
        self.assertEqual(json.loads(body[5:])["echo"], "after 99", c.describe())
        self.assertEqual(conn_errors(self.d, "reset_flood"), before)

    # --- 4. HPACK bomb -------------------------------------------------------------------------
    def test_hpack_bomb(self):
        """One literal with incremental indexing (a 4000-byte value: fits the 4096-byte dynamic
        table), then HEADERS on new streams that reference it 500 times each (one byte per
        reference, ~2 MB decoded per 500-byte frame). Limit: client.max_header_bytes 16KiB."""
        self.start(config(client={"max_header_bytes": "16KiB"}))
        value = "b" * 4000
        refs = 500
        frames_per_conn = 40
        conns = 12

        def bomb_connection():
            c, _ = self.opened()
            first = self.request_block(HANG) + h.literal("x-bomb", value, incremental=True)
            out = [h.headers(1, first)]
            block = self.request_block(HANG) + h.indexed(h.FIRST_DYNAMIC) * refs
            out += [h.headers(sid, block) for sid in range(3, 3 + 2 * frames_per_conn, 2)]
            sender = c.send_in_background([b"".join(out)])
            self.assert_goaway_and_close(c, h.ENHANCE_YOUR_CALM, "HPACK bomb", h.auto_ack(c))
            sender.join(30)
            c.close()
            return c

        before = conn_errors(self.d, "header_list")
        bomb_connection()  # warm-up: allocations a first connection makes anyway
        self.assert_counted("header_list", before, "HPACK bomb")
        rss0 = h.rss_kib(self.pid)
        cpu0 = self.cpu()
        for _ in range(conns):
            bomb_connection()
        rss1 = h.rss_kib(self.pid)
        decoded = conns * frames_per_conn * refs * (len(value) + len("x-bomb") + 32)
        self.assertEqual(conn_errors(self.d, "header_list"), (before or 0) + 1 + conns)
        self.assert_cpu_bounded("HPACK bomb", cpu0, conns * (frames_per_conn + 1),
                                "RSS %d -> %d KiB; %.0f MB would have been decoded"
                                % (rss0, rss1, decoded / 1e6))
        self.assertLess(rss1 - rss0, 4096, "RSS grew %d KiB over %d bomb connections" % (rss1 - rss0, conns))
        self.assert_serves("HPACK bomb")

    # --- 5. oversized header lists, CONTINUATION flood -----------------------------------------
    def test_oversized_header_list_one_frame(self):
        """350 small literal headers (350 x (40 + 32) = 25.2 KB by RFC 9113's count) in one
        HEADERS frame of 15 KB, limit 16KiB."""
        self.start(config(client={"max_header_bytes": "16KiB"}))
        before = conn_errors(self.d, "header_list")
        c, _ = self.opened()
        extra = [("x-h%03d" % i, "v" * 34) for i in range(350)]
        block = self.request_block(HANG, extra=extra)
        self.assertLess(len(block), 16384)
        c.send(h.headers(1, block))
        self.assert_goaway_and_close(c, h.ENHANCE_YOUR_CALM, "oversized header list", h.auto_ack(c))
        self.assert_counted("header_list", before, "oversized header list")
        self.assert_serves("oversized header list")

    def test_oversized_header_list_continuations(self):
        """A header block across HEADERS + 4 CONTINUATION frames (5 x a 4000-byte literal), limit
        16KiB."""
        self.start(config(client={"max_header_bytes": "16KiB"}))
        before = conn_errors(self.d, "header_list")
        c, _ = self.opened()
        parts = [self.request_block(HANG, extra=[("x-big0", "a" * 4000)])]
        parts += [h.literal("x-big%d" % i, "a" * 4000) for i in range(1, 5)]
        out = h.headers(1, parts[0], end_headers=False)
        for i, p in enumerate(parts[1:]):
            out += h.continuation(1, p, end_headers=(i == len(parts) - 2))
        c.send(out)
        self.assert_goaway_and_close(c, h.ENHANCE_YOUR_CALM, "oversized header list (CONTINUATION)",
                                     h.auto_ack(c))
        self.assert_counted("header_list", before, "oversized header list (CONTINUATION)")
        self.assert_serves("oversized header list (CONTINUATION)")

    def test_oversized_header_list_default_limit(self):
        """The default client.max_header_bytes (64 KiB): 5 frames of 15000-byte literals."""
        self.start()
        before = conn_errors(self.d, "header_list")
        c, s = self.opened()
        self.assertEqual(s.get(h.SETTINGS_MAX_HEADER_LIST_SIZE), 64 * 1024, s)
        parts = [self.request_block(HANG, extra=[("x-big0", "a" * 15000)])]
        parts += [h.literal("x-big%d" % i, "a" * 15000) for i in range(1, 5)]
        out = h.headers(1, parts[0], end_headers=False)
        for i, p in enumerate(parts[1:]):
            out += h.continuation(1, p, end_headers=(i == len(parts) - 2))
        c.send(out)
        self.assert_goaway_and_close(c, h.ENHANCE_YOUR_CALM, "75 KB header list", h.auto_ack(c))
        self.assert_counted("header_list", before, "75 KB header list")
        self.assert_serves("75 KB header list")

    def test_single_field_over_64k(self):
        """One 70 KB metadata value, a raw literal (so its encoded string is over 64 KiB too),
        across HEADERS + 4 CONTINUATION frames of 16 KiB, default limit. nghttp2's HPACK decoder
        refuses such a string (COMPRESSION_ERROR) as soon as it reads its length, in the first
        frame, before any header callback: the daemon must stop the block before that length
        reaches nghttp2."""
        self.start()
        before = conn_errors(self.d, "header_list")
        compression_before = conn_errors(self.d, "compression") or 0
        c, _ = self.opened()
        block = self.request_block(HANG, extra=[("x-huge", "h" * 70000)])
        self.assertGreater(len(block), 70000)
        chunks = [block[i:i + 16384] for i in range(0, len(block), 16384)]
        self.assertEqual(len(chunks), 5)
        out = h.headers(1, chunks[0], end_headers=False)
        for i, p in enumerate(chunks[1:]):
            out += h.continuation(1, p, end_headers=(i == len(chunks) - 2))
        sender = c.send_in_background([out])
        self.assert_goaway_and_close(c, h.ENHANCE_YOUR_CALM, "70 KB header field", h.auto_ack(c))
        sender.join(30)
        self.assert_counted("header_list", before, "70 KB header field")
        self.assertEqual(conn_errors(self.d, "compression") or 0, compression_before)
        self.assert_serves("70 KB header field")

    def test_header_list_under_limit_accepted(self):
        """Control: a 7 KB header list in three blocks (HEADERS and two CONTINUATIONs), under
        ingressd's 16KiB limit and the replica's 8 KiB (grpcio's SETTINGS_MAX_HEADER_LIST_SIZE; a
        larger list is answered by ingressd, see test_metadata_larger_than_the_replica_accepts),
        is served."""
        self.start(config(client={"max_header_bytes": "16KiB"}))
        c, _ = self.opened()
        parts = [self.request_block(UNARY, extra=[("x-big0", "a" * 2400)])]
        parts += [h.literal("x-big%d" % i, "a" * 2400) for i in range(1, 3)]
        out = h.headers(1, parts[0], end_headers=False)
        out += h.continuation(1, parts[1]) + h.continuation(1, parts[2], end_headers=True)
        c.send(out + h.data(1, h.grpc_message(b"big head"), True))
        end = c.read_until(lambda f: (f.sid == 1 and f.flags & h.END_STREAM) or f.type == h.GOAWAY,
                           h.auto_ack(c))
        self.assertIsNotNone(end, c.describe())
        self.assertNotEqual(end.type, h.GOAWAY, c.describe())
        body = b"".join(f.payload for f in c.frames if f.type == h.DATA and f.sid == 1)
        self.assertTrue(body, c.describe())
        reply = json.loads(body[5:])
        self.assertEqual(reply["echo"], "big head")
        self.assertEqual(reply["metadata"].get("x-big2"), "a" * 2400)

    def test_continuation_flood(self):
        """HEADERS without END_HEADERS, then 2000 CONTINUATION frames (each a small literal)
        without END_HEADERS. nghttp2 is configured to allow 8 CONTINUATIONs per block; the
        connection ends with GOAWAY (the code is reported; PROTOCOL_ERROR expected: the daemon
        maps nghttp2's TOO_MANY_CONTINUATIONS to a protocol error)."""
        self.start()
        before = conn_errors(self.d, "protocol")
        cpu0 = self.cpu()
        c, _ = self.opened()
        n = 2000
        out = [h.headers(1, self.request_block(HANG), end_headers=False)]
        out += [h.continuation(1, h.literal("x-c", "c"))] * n
        sender = c.send_in_background([b"".join(out)])
        self.assert_goaway_and_close(c, h.PROTOCOL_ERROR, "CONTINUATION flood", h.auto_ack(c))
        sender.join(30)
        self.assert_counted("protocol", before, "CONTINUATION flood")
        self.assert_cpu_bounded("CONTINUATION flood", cpu0, n)
        self.assert_serves("CONTINUATION flood")

    # --- 6. streams past the limit -------------------------------------------------------------
    def test_streams_past_limit(self):
        """grpc.max_concurrent_streams 4, SETTINGS acknowledged, then 5 Hang calls opened: the
        client broke the limit it was told, and the connection ends with GOAWAY PROTOCOL_ERROR
        (nghttp2's rule, and issue #20's: "streams past the limit ... end the connection"; RFC 9113
        §5.1.2 would allow a stream error, docs/grpc.md says why not), counted as `protocol`."""
        self.start(config(grpc_section={"max_concurrent_streams": 4}))
        before = conn_errors(self.d, "protocol")
        c, s = self.opened()
        self.assertEqual(s.get(h.SETTINGS_MAX_CONCURRENT_STREAMS), 4, s)
        block = self.request_block(HANG)
        c.send(b"".join(h.headers(sid, block) for sid in [1, 3, 5, 7, 9]))
        g = self.assert_goaway_and_close(c, h.PROTOCOL_ERROR, "streams past the limit", h.auto_ack(c))
        self.assertEqual(g.last_stream_id, 7, c.describe())
        self.assert_counted("protocol", before, "streams past the limit")
        self.assert_serves("streams past the limit")

    # --- 7. window overflow --------------------------------------------------------------------
    def test_window_update_overflow_connection(self):
        self.start()
        c, _ = self.opened()
        c.send(h.window_update(0, h.MAX_WINDOW))
        self.assert_goaway_and_close(c, h.FLOW_CONTROL_ERROR, "WINDOW_UPDATE past 2^31-1 on stream 0",
                                     h.auto_ack(c))
        self.assert_serves("connection window overflow")

    def test_window_update_overflow_stream(self):
        self.start()
        c, _ = self.opened()
        c.send(h.headers(1, self.request_block(HANG)) + h.window_update(1, h.MAX_WINDOW))
        f = c.read_until(lambda f: (f.type == h.RST_STREAM and f.sid == 1) or f.type == h.GOAWAY,
                         h.auto_ack(c))
        self.assertIsNotNone(f, c.describe())
        self.assertEqual((h.TYPE_NAMES[f.type], f.sid, h.error_name(f.error_code)),
                         ("RST_STREAM", 1, "FLOW_CONTROL_ERROR"), c.describe())
        # Only the stream: the connection still makes calls.
        c.send(h.headers(3, self.request_block(UNARY)) + h.data(3, h.grpc_message(b"after"), True))
        end = c.read_until(lambda f: (f.sid == 3 and f.flags & h.END_STREAM) or f.type == h.GOAWAY,
                           h.auto_ack(c))
        self.assertIsNotNone(end, c.describe())
        self.assertEqual(end.type, h.HEADERS, c.describe())
        self.assert_serves("stream window overflow")

    def test_data_past_stream_window(self):
        """A call to a replica that takes no byte (StallServer): ingressd consumes nothing, so the
        256 KiB it announced is all the client may send; 17 x 16 KiB DATA frames overflow it."""
        self.start(stall=True)
        c, s = self.opened()
        window = s.get(h.SETTINGS_INITIAL_WINDOW_SIZE)
        self.assertEqual(window, 256 * 1024, s)
        c.send(h.headers(1, self.request_block(HANG, app="stall")))
        chunk = b"\0" * 16384
        frames = [h.data(1, chunk) for _ in range(window // len(chunk) + 1)]
        sender = c.send_in_background([b"".join(frames)])
        f = c.read_until(lambda f: (f.type == h.RST_STREAM and f.sid == 1) or f.type == h.GOAWAY,
                         h.auto_ack(c))
        sender.join(30)
        self.assertIsNotNone(f, c.describe())
        updates = [x for x in c.frames if x.type == h.WINDOW_UPDATE and x.sid == 1]
        self.assertFalse(updates, "the daemon reopened the stream window: the test premise failed; "
                         + c.describe())
        self.assertEqual((h.TYPE_NAMES[f.type], f.sid, h.error_name(f.error_code)),
                         ("RST_STREAM", 1, "FLOW_CONTROL_ERROR"), c.describe())
        self.assert_serves("DATA past the stream window")

    def test_data_past_connection_window(self):
        """Five calls to the stalled replica, 15 x 16 KiB each (under the stream window), 1200 KiB
        in all: past the 1 MiB connection window."""
        self.start(stall=True)
        c, s = self.opened()
        block = self.request_block(HANG, app="stall")
        sids = [1, 3, 5, 7, 9]
        c.send(b"".join(h.headers(sid, block) for sid in sids))
        chunk = b"\0" * 16384
        per_stream = 15
        out = [h.data(sid, chunk) for sid in sids for _ in range(per_stream)]
        self.assertGreater(len(sids) * per_stream * len(chunk), 1024 * 1024)
        sender = c.send_in_background([b"".join(out)])
        self.assert_goaway_and_close(c, h.FLOW_CONTROL_ERROR, "DATA past the connection window",
                                     h.auto_ack(c))
        sender.join(30)
        updates = [x for x in c.frames if x.type == h.WINDOW_UPDATE and x.sid == 0]
        self.assertLessEqual(sum(u.increment for u in updates), 1024 * 1024 - h.DEFAULT_WINDOW,
                             "the daemon reopened the connection window: premise failed; " + c.describe())
        self.assert_serves("DATA past the connection window")

    def test_connection_errors_counted(self):
        """Every connection ingressd ends with an error GOAWAY is counted by reason, also when
        nghttp2 (not ingressd's own callbacks) found the error: the label set documents
        flow_control and compression besides protocol."""
        self.start()
        cases = [
            ("WINDOW_UPDATE past 2^31-1 on stream 0", h.window_update(0, h.MAX_WINDOW),
             h.FLOW_CONTROL_ERROR, "flow_control"),
            ("SETTINGS_INITIAL_WINDOW_SIZE 2^31", h.settings([(h.SETTINGS_INITIAL_WINDOW_SIZE, 2 ** 31)]),
             h.FLOW_CONTROL_ERROR, "flow_control"),
            ("WINDOW_UPDATE of 0 on stream 0", h.window_update(0, 0), h.PROTOCOL_ERROR, "protocol"),
            ("DATA on stream 0", h.data(0, b"x"), h.PROTOCOL_ERROR, "protocol"),
            ("HPACK index past the tables", h.headers(1, h.indexed(200)), h.COMPRESSION_ERROR,
             "compression"),
        ]
        for what, payload, code, reason in cases:
            with self.subTest(what):
                before = conn_errors(self.d, reason)
                c, _ = self.opened()
                c.send(payload)
                self.assert_goaway_and_close(c, code, what, h.auto_ack(c))
                c.close()
                self.assert_counted(reason, before, what)
        self.assert_serves("connection errors")

    # --- 8. slow / idle connections ------------------------------------------------------------
    def check_idle(self, send, what, timeout="300ms", seconds=0.3):
        self.start(config(client={"header_timeout": timeout}))
        before = conn_errors(self.d, "timeout")
        watch = h.Stopwatch()
        c = self.raw(timeout=5.0)
        if send:
            c.send(send)
        c.read_to_close()  # nothing answered: an ack would be a frame (and no preface)
        took = watch.elapsed()
        self.assertIn(c.closed, ("eof", "reset"),
                      "%s: not closed within 5s (client.header_timeout %s); %s" % (what, timeout, c.describe()))
        self.assertGreaterEqual(took, seconds * 0.9, "%s: closed after %.3fs; %s" % (what, took, c.describe()))
        COSTS.append((self.id().rsplit(".", 1)[-1], what, 0, 0.0,
                      "closed after %.3fs; %s" % (took, h.summarize(c.frames))))
        self.assert_counted("timeout", before, what)
        self.assert_serves(what)

    def test_idle_connection_closed(self):
        """Connects, sends nothing."""
        self.check_idle(b"", "silent connection")

    def test_partial_preface_closed(self):
        self.check_idle(h.PREFACE[:10], "half a preface")

    def test_preface_without_request_closed(self):
        self.check_idle(h.PREFACE + h.settings() + h.settings_ack(), "preface and SETTINGS, no request")

    def test_incomplete_header_block_closed(self):
        """A request head that never completes (HEADERS without END_HEADERS, no CONTINUATION):
        client.header_timeout is the time a request head may take."""
        block = self.request_block(HANG)
        self.check_idle(h.PREFACE + h.settings() + h.settings_ack()
                        + h.headers(1, block[:len(block) // 2], end_headers=False),
                        "incomplete header block")


def tearDownModule():
    if not COSTS:
        return
    out = ["", "measured costs (daemon = ingressd --threads 1):"]
    for test, what, frames, cpu, extra in COSTS:
        per = " = %.2f us/frame" % (cpu / frames * 1e6) if frames else ""
        out.append("  %-45s %-38s %6d frames, CPU %.3fs%s  %s"
                   % (test, what, frames, cpu, per, extra))
    print("\n".join(out), file=sys.stderr)


if __name__ == "__main__":
    sys.exit(support.run_suite())
