#!/usr/bin/python3
"""Self-test of tests/fakes/grpc_replica.py: every method called directly (no ingressd).

    /usr/bin/python3 tests/grpc/fake_selftest.py [-v] [FakeReplicaTest.test_unary ...]
"""

import hashlib
import os
import queue
import sys
import unittest

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import support  # noqa: E402
from support import jdump, jload  # noqa: E402

import grpc  # noqa: E402


class FakeReplicaTest(unittest.TestCase):
    def setUp(self):
        self.r = support.FakeReplica("self1")
        self.addCleanup(self.r.stop)
        self.ch = self.r.channel

    def test_unary(self):
        call = self.ch.unary_unary("/test.Echo/Unary")
        body, c = call.with_call(b"hello", timeout=7,
                                 metadata=(("application", "app1"), ("x-mixed", "v"), ("k-bin", b"\x00")))
        reply = jload(body)
        self.assertEqual(reply["replica"], "self1")
        self.assertEqual(reply["echo"], "hello")
        self.assertEqual(reply["metadata"]["application"], "app1")
        self.assertEqual(reply["metadata"]["x-mixed"], "v")
        self.assertNotIn("k-bin", reply["metadata"])
        self.assertGreater(reply["time_remaining"], 0)
        # The deadline travels as grpc-timeout, rounded up to its unit: a little over 7 s can
        # arrive; what matters is that a deadline arrived, not a clock comparison.
        self.assertLessEqual(reply["time_remaining"], 8)
        self.assertIn(("x-replica", "self1"), tuple(c.initial_metadata()))
        self.assertEqual(c.code(), grpc.StatusCode.OK)
        # no deadline: null
        self.assertIsNone(jload(call(b"x"))["time_remaining"])

    def test_server_stream_gate(self):
        call = self.ch.unary_stream("/test.Echo/ServerStream")
        it = call(jdump({"n": 5, "gate": True, "id": "g1"}), timeout=30)
        first = jload(next(it))
        self.assertEqual((first["replica"], first["i"]), ("self1", 0))
        # message 1 does not exist until Release
        sent = self.r.control("WaitSent", {"id": "g1", "count": 2, "timeout": 0.3})
        self.assertEqual(sent, {"reached": False, "sent": 1})
        self.r.release("g1")
        rest = [jload(m)["i"] for m in it]
        self.assertEqual(rest, [1, 2, 3, 4])
        self.assertEqual(it.code(), grpc.StatusCode.OK)

    def test_server_stream_sizes(self):
        call = self.ch.unary_stream("/test.Echo/ServerStream")
        msgs = [jload(m) for m in call(jdump({"n": 3, "size": 100000}), timeout=30)]
        self.assertEqual([m["i"] for m in msgs], [0, 1, 2])
        self.assertTrue(all(m["pad"] == "x" * 100000 for m in msgs))

    def test_server_stream_backpressure(self):
        # A client that does not read stalls the producer (flow control), so WaitSent can observe it.
        call = self.ch.unary_stream("/test.Echo/ServerStream")
        n, size = 256, 256 * 1024
        it = call(jdump({"n": n, "size": size, "id": "bp"}), timeout=60)
        self.assertEqual(jload(next(it))["i"], 0)
        sent = self.r.control("WaitSent", {"id": "bp", "count": n, "timeout": 1.0})
        self.assertFalse(sent["reached"], sent)
        count = 1 + sum(1 for _ in it)
        self.assertEqual(count, n)

    def test_client_stream(self):
        call = self.ch.stream_unary("/test.Echo/ClientStream")
        msgs = [os.urandom(16 * 1024) for _ in range(50)]
        reply = jload(call(iter(msgs), timeout=30))
        self.assertEqual(reply["count"], 50)
        self.assertEqual(reply["bytes"], 50 * 16 * 1024)
        self.assertEqual(reply["sha256"], hashlib.sha256(b"".join(msgs)).hexdigest())
        self.assertEqual(reply["replica"], "self1")

    def test_bidi_ping_pong(self):
        call = self.ch.stream_stream("/test.Echo/Bidi")
        q = queue.Queue()
        responses = call(iter(q.get, None), timeout=30)
        for i in range(20):
            msg = ("ping %d" % i).encode()
            q.put(msg)
            self.assertEqual(next(responses), msg)
        q.put(None)
        self.assertEqual(list(responses), [])
        self.assertEqual(responses.code(), grpc.StatusCode.OK)

    def test_fail(self):
        call = self.ch.unary_unary("/test.Echo/Fail")
        with self.assertRaises(grpc.RpcError) as cm:
            call(jdump({"code": 9, "details": "nope: ü", "trailer": {"x-custom": "v1"}}), timeout=10)
        e = cm.exception
        self.assertEqual(e.code(), grpc.StatusCode.FAILED_PRECONDITION)
        self.assertEqual(e.details(), "nope: ü")
        self.assertIn(("x-custom", "v1"), tuple(e.trailing_metadata()))

    def test_fail_trailers_only(self):
        call = self.ch.unary_unary("/test.Echo/Fail")
        with self.assertRaises(grpc.RpcError) as cm:
            call(jdump({"code": 16, "details": "who", "trailer": {"x-custom": "v2"},
                        "initial_metadata": False}), timeout=10)
        e = cm.exception
        self.assertEqual(e.code(), grpc.StatusCode.UNAUTHENTICATED)
        self.assertEqual(e.details(), "who")
        self.assertIn(("x-custom", "v2"), tuple(e.trailing_metadata()))
        self.assertNotIn("x-replica", dict(e.initial_metadata() or ()))

    def test_hang_cancel(self):
        call = self.ch.unary_unary("/test.Echo/Hang")
        fut = call.future(jdump({"id": "h1"}))
        self.assertTrue(self.r.wait_started("h1"))
        self.assertFalse(self.r.wait_cancelled("h1", timeout=0.2))
        fut.cancel()
        self.assertTrue(self.r.wait_cancelled("h1"))

    def test_hang_deadline(self):
        # The handler must have started before the deadline passes, or grpc never runs it and no
        # cancellation is recorded: a deadline long enough for a loaded machine, and a wait for
        # the start first (a flake seen once under ASan with the whole suite running).
        call = self.ch.unary_unary("/test.Echo/Hang")
        fut = call.future(jdump({"id": "h2"}), timeout=3.0)
        self.assertTrue(self.r.wait_started("h2"))
        self.assertEqual(fut.exception(timeout=30).code(), grpc.StatusCode.DEADLINE_EXCEEDED)
        self.assertTrue(self.r.wait_cancelled("h2"))

    def test_wait_cancelled_unknown_times_out(self):
        self.assertFalse(self.r.wait_cancelled("never", timeout=0.2))

    def test_healthz_and_set_healthy(self):
        call = self.ch.unary_unary("/ray.serve.RayServeAPIService/Healthz")
        self.assertEqual(call(b"", timeout=5), b"\n\x07success")
        self.assertEqual(self.r.control("SetHealthy", {"healthy": False}), {"healthy": False})
        with self.assertRaises(grpc.RpcError) as cm:
            call(b"", timeout=5)
        self.assertEqual(cm.exception.code(), grpc.StatusCode.UNAVAILABLE)
        self.assertEqual(cm.exception.details(), "unhealthy")
        self.r.control("SetHealthy", {"healthy": True})
        self.assertEqual(call(b"", timeout=5), b"\n\x07success")

    def test_stats(self):
        call = self.ch.unary_unary("/test.Echo/Unary")
        for _ in range(3):
            call(b"x", timeout=5)
        stats = self.r.control("Stats")
        self.assertEqual(stats["replica"], "self1")
        self.assertEqual(stats["calls"]["/test.Echo/Unary"], 3)

    def test_stdin_eof_stops_it(self):
        self.r.proc.stdin.close()
        self.assertEqual(self.r.proc.wait(15), 0)

    def test_sigterm_stops_it(self):
        self.r.proc.terminate()
        self.assertEqual(self.r.proc.wait(15), 0)


if __name__ == "__main__":
    unittest.main()
