#!/usr/bin/python3
"""ingressd's HTTP/2 connections to gRPC replicas (issue #31 item 2): the cap on connections per
replica, keepalive PINGs that find a replica gone without FIN or RST (and spare a quiet call), and
upstream.first_byte_timeout / upstream.idle_timeout for gRPC calls.

    /usr/bin/python3 tests/grpc/links_test.py --ingressd build/release/ingressd [-v] [TEST ...]

Real grpcio clients and replicas (tests/fakes/grpc_replica.py); where a test needs to see or cut
the wire between ingressd and a replica, a relay in this file stands between them: it counts the
PING frames ingressd sends and can freeze (stop moving bytes, keep both sockets open: a host that
vanished). Loopback only, ports bound as 0, every process and thread stopped in cleanups.
"""

import os
import socket
import struct
import sys
import threading
import time
import unittest

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import support  # noqa: E402
from support import group, jdump, jload, target, topology  # noqa: E402

import grpc  # noqa: E402

PREFACE = b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n"
PING = 0x6
ACK = 0x1


class Relay:
    """A TCP relay on 127.0.0.3 (another node) to a replica. Parses the frames going to the
    replica to count PINGs (ACKs not counted); `freeze()` stops all forwarding for good."""

    def __init__(self, to_host, to_port, host="127.0.0.3"):
        self.name = "relay"
        self.to = (to_host, to_port)
        self.lsock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
        self.lsock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        self.lsock.bind((host, 0))
        self.lsock.listen(16)
        self.host, self.port = self.lsock.getsockname()
        self.cond = threading.Condition()
        self.pings = 0
        self.frozen = False
        self.closing = False
        self.socks = []
        self.threads = [threading.Thread(target=self._accept, daemon=True)]
        self.threads[0].start()

    @property
    def key(self):
        return "%s:%d" % (self.host, self.port)

    def _accept(self):
        while True:
            try:
                a, _ = self.lsock.accept()
            except OSError:
                return
            b = socket.create_connection(self.to)
            with self.cond:
                if self.closing:
                    a.close()
                    b.close()
                    return
                self.socks += [a, b]
            for src, dst, parse in ((a, b, True), (b, a, False)):
                t = threading.Thread(target=self._pump, args=(src, dst, parse), daemon=True)
                self.threads.append(t)
                t.start()

    def _pump(self, src, dst, parse):
        buf = b""
        preface_left = len(PREFACE) if parse else 0
        while True:
            try:
                data = src.recv(65536)
            except OSError:
                data = b""
            if parse:
                buf += data
                if preface_left:
                    k = min(preface_left, len(buf))
                    buf, preface_left = buf[k:], preface_left - k
                while len(buf) >= 9:
                    length = int.from_bytes(buf[0:3], "big")
                    if len(buf) < 9 + length:
                        break
                    if buf[3] == PING and not buf[4] & ACK:
                        with self.cond:
                            self.pings += 1
                            self.cond.notify_all()
                    buf = buf[9 + length:]
            with self.cond:
                # Frozen: the bytes go nowhere and nothing is closed (no FIN, no RST).
                self.cond.wait_for(lambda: not self.frozen or self.closing)
                if self.closing:
                    return
            if not data:
                try:
                    dst.shutdown(socket.SHUT_WR)
                except OSError:
                    pass
                return
            try:
                dst.sendall(data)
            except OSError:
                return

    def freeze(self):
        with self.cond:
            self.frozen = True

    def wait_pings(self, n, timeout=20.0):
        with self.cond:
            self.cond.wait_for(lambda: self.pings >= n, timeout)
            return self.pings

    def close(self):
        with self.cond:
            self.closing = True
            self.cond.notify_all()
        self.lsock.close()
        for s in self.socks:
            try:
                s.shutdown(socket.SHUT_RDWR)
            except OSError:
                pass
            s.close()
        for t in self.threads:
            t.join(10)


def config(grpc_section="", upstream=""):
    return support.HEALTH_SLOW_CONFIG + ("grpc:\n" + grpc_section if grpc_section else "") + \
        ("upstream:\n" + upstream if upstream else "")


class LinksTest(unittest.TestCase):
    maxDiff = 4000

    def replica(self, name, extra_args=()):
        r = support.FakeReplica(name, extra_args=extra_args)
        self.addCleanup(r.stop)
        return r

    def relay(self, r):
        rel = Relay(r.host, r.port)
        self.addCleanup(rel.close)
        return rel

    def ingressd(self, far, cfg):
        """ingressd with one gRPC app whose one target is `far` (a replica or a relay)."""
        d = support.Ingressd(topology(group("app", [target(far, "SERVE_REPLICA::app#r")])), config=cfg)
        self.addCleanup(d.stop)
        d.wait_grpc_apps({"app": [far.key]}, up={far.key})
        return d

    def gated_stream(self, ch, call_id, timeout=60.0):
        """A server stream whose first message arrived; the rest waits for Release."""
        it = ch.unary_stream("/test.Echo/ServerStream")(jdump({"n": 2, "gate": True, "id": call_id}),
                                                          timeout=timeout)
        self.assertEqual(jload(next(it))["i"], 0)
        return it

    # --- grpc.max_upstream_connections ------------------------------------------------------
    def links_for(self, cap):
        """12 concurrent gated streams to a replica that allows 4 streams per connection, after
        one call that made the first connection and learnt the limit: the peers it saw."""
        r = self.replica("capped", ["--max-streams", "4"])
        d = self.ingressd(r, config("  max_upstream_connections: %d\n" % cap) if cap else config())
        ch = d.channel()
        ch.unary_unary("/test.Echo/Unary")(b"warm", timeout=10)
        calls = [ch.unary_stream("/test.Echo/ServerStream")(jdump({"n": 1, "gate": True, "id": "c%d" % i}),
                                                           timeout=60) for i in range(12)]
        # The calls overlap: four hold their streams (their gates closed) while the rest are
        # placed; then all are let go, and those that waited for a stream get one in turn.
        deadline = time.monotonic() + 30
        while r.calls("/test.Echo/ServerStream") < 4 and time.monotonic() < deadline:
            time.sleep(0.02)
        self.assertGreaterEqual(r.calls("/test.Echo/ServerStream"), 4)
        for i in range(12):
            r.release("c%d" % i)
        self.assertEqual([[jload(m)["i"] for m in it] for it in calls], [[0]] * 12)
        return r.peers()

    def test_connections_per_replica_are_capped(self):
        """grpc.max_upstream_connections 1: 12 calls share one connection to a replica that takes
        4 streams on each (the other 8 wait their turn in ingressd), and all succeed."""
        peers = self.links_for(1)
        self.assertEqual(len(peers), 1, peers)

    def test_without_a_low_cap_a_full_connection_makes_another(self):
        """The same 12 calls with the default cap (16): more connections. Shows that the capped
        test above measures the cap, not a load too small to need a second connection."""
        peers = self.links_for(0)
        self.assertGreaterEqual(len(peers), 2, peers)

    # --- keepalive ----------------------------------------------------------------------------
    def test_keepalive_finds_a_replica_that_vanished(self):
        """The wire to the replica freezes mid-call (no FIN, no RST): the call fails UNAVAILABLE
        with the keepalive's reason, not DEADLINE_EXCEEDED at its 60 s deadline."""
        r = self.replica("vanishing")
        rel = self.relay(r)
        d = self.ingressd(rel, config("  keepalive_interval: 200ms\n  keepalive_timeout: 300ms\n"))
        ch = d.channel()
        it = self.gated_stream(ch, "v1")
        rel.freeze()
        with self.assertRaises(grpc.RpcError) as cm:
            list(it)
        e = cm.exception
        self.assertEqual(e.code(), grpc.StatusCode.UNAVAILABLE, str(e))
        self.assertIn("keepalive", e.details() or "")
        self.assertGreaterEqual(rel.pings, 1)

    def test_keepalive_spares_a_quiet_call(self):
        """A call on which the replica says nothing for many keepalive intervals: three PINGs go
        (grpc-core's ping abuse policy allows two strikes), then none until the replica sends
        data, and the call completes. A fourth PING would get the connection closed with
        GOAWAY ENHANCE_YOUR_CALM ("too_many_pings") and the call failed."""
        r = self.replica("quiet")
        rel = self.relay(r)
        d = self.ingressd(rel, config("  keepalive_interval: 100ms\n  keepalive_timeout: 2s\n"))
        ch = d.channel()
        it = self.gated_stream(ch, "q1")
        self.assertEqual(rel.wait_pings(3), 3)
        # Silence for ten more intervals: no PING may follow the third (the time passing is
        # what is tested here, not a synchronisation).
        time.sleep(1.0)
        self.assertEqual(rel.pings, 3)
        r.release("q1")
        self.assertEqual([jload(m)["i"] for m in it], [1])

    # --- upstream.first_byte_timeout and upstream.idle_timeout -----------------------------
    def test_idle_timeout_ends_a_stalled_call(self):
        """The replica sent its response head, then nothing for upstream.idle_timeout."""
        r = self.replica("stalls")
        d = self.ingressd(r, config(upstream="  idle_timeout: 1s\n"))
        with self.assertRaises(grpc.RpcError) as cm:
            d.channel().unary_unary("/test.Echo/Hang")(jdump({"id": "i1"}), timeout=60)
        e = cm.exception
        self.assertEqual(e.code(), grpc.StatusCode.UNAVAILABLE, str(e))
        self.assertIn("upstream_timeout", e.details() or "")
        self.assertIn("upstream.idle_timeout", e.details() or "")
        self.assertTrue(r.wait_cancelled("i1"), "the replica's stream was not cancelled")

    def test_first_byte_timeout_ends_a_call_without_a_response_head(self):
        r = self.replica("mute")
        d = self.ingressd(r, config(upstream="  first_byte_timeout: 1s\n"))
        with self.assertRaises(grpc.RpcError) as cm:
            d.channel().unary_unary("/test.Echo/Hang")(jdump({"id": "m1", "quiet": True}), timeout=60)
        e = cm.exception
        self.assertEqual(e.code(), grpc.StatusCode.UNAVAILABLE, str(e))
        self.assertIn("upstream.first_byte_timeout", e.details() or "")
        self.assertTrue(r.wait_cancelled("m1"), "the replica's stream was not cancelled")


if __name__ == "__main__":
    support.run_suite()
