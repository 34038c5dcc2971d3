#!/usr/bin/python3
"""Integration tests of ingressd's gRPC (HTTP/2, h2c) listener with real gRPC clients and servers.

    /usr/bin/python3 tests/grpc/grpc_test.py --ingressd build/release/ingressd [-v] [TEST ...]
    INGRESSD_BIN=build/release/ingressd /usr/bin/python3 -m unittest -v grpc_test.GrpcTest.test_drain
        (the second form from inside tests/grpc)

The replicas are tests/fakes/grpc_replica.py (Python grpc, generic handlers, raw-bytes messages).
Loopback only (127.0.0.2 = this node), ports bound as 0, every process stopped in cleanups.
No fixed sleeps: waits are for events (control RPCs on the fake that return when something
happened, a line of output, an endpoint's state polled against a deadline).
"""

import hashlib
import http.server
import json
import os
import queue
import signal
import re
import socket
import ssl
import subprocess
import sys
import tempfile
import threading
import time
import unittest

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import support  # noqa: E402
from support import (group, jdump, jload, metric_value, replica_key, replica_up, target,  # noqa: E402
                     topology)

import grpc  # noqa: E402

HEALTH_FAST_CONFIG = """\
drain:
  min_period: 0s
  timeout: 5s
health:
  interval: 200ms
  fast_interval: 100ms
  fall: 2
  rise: 1
"""

# Health checks far apart: a test about connection failures sees what the call path does, not
# what a health check concluded first.
HEALTH_SLOW_CONFIG = support.HEALTH_SLOW_CONFIG

UNARY = "/test.Echo/Unary"


def md(app):
    return (("application", app),) if app is not None else ()


class GrpcTest(unittest.TestCase):
    maxDiff = 4000

    # --- fixtures ------------------------------------------------------------------------------
    def replica(self, name, host=support.THIS_NODE):
        r = support.FakeReplica(name, host)
        self.addCleanup(r.stop)
        return r

    def ingressd(self, topo, config=support.DEFAULT_CONFIG, access_log=False, extra_args=()):
        d = support.Ingressd(topo, config=config, access_log=access_log, extra_args=extra_args)
        self.addCleanup(d.stop)
        return d

    def tmpdir(self):
        t = tempfile.TemporaryDirectory(prefix="ingressd-grpc-test-")
        self.addCleanup(t.cleanup)
        return t.name

    def two_apps(self, config=support.DEFAULT_CONFIG, access_log=False):
        ra, rb = self.replica("ra"), self.replica("rb")
        d = self.ingressd(topology(group("alpha", [target(ra, "SERVE_REPLICA::alpha#A#ra")]),
                                   group("beta", [target(rb, "SERVE_REPLICA::beta#B#rb")])),
                          config=config, access_log=access_log)
        d.wait_grpc_apps({"alpha": [ra.key], "beta": [rb.key]}, up={ra.key, rb.key})
        return d, ra, rb

    def unary(self, ch, payload=b"hi", app=None, timeout=10.0, method=UNARY):
        body, call = ch.unary_unary(method).with_call(payload, timeout=timeout, metadata=md(app))
        return jload(body), call

    def rpc_error(self, fn):
        with self.assertRaises(grpc.RpcError) as cm:
            fn()
        return cm.exception

    # --- routing -------------------------------------------------------------------------------
    def test_unary_routing_by_metadata(self):
        d, ra, rb = self.two_apps()
        ch = d.channel()
        for i in range(3):
            for app, name in (("alpha", "ra"), ("beta", "rb")):
                payload = ("call %d to %s" % (i, app)).encode()
                reply, call = self.unary(ch, payload, app=app)
                self.assertEqual(reply["replica"], name)
                self.assertEqual(reply["echo"], payload.decode())
                self.assertEqual(call.code(), grpc.StatusCode.OK)
                self.assertIn(("x-replica", name), tuple(call.initial_metadata()))
        self.assertEqual(ra.calls(UNARY), 3)
        self.assertEqual(rb.calls(UNARY), 3)

    def test_single_app_default(self):
        rs = self.replica("rs")
        d = self.ingressd(topology(group("solo", [target(rs)]),
                                   group("web", [], protocol="HTTP", route_prefix="/web")))
        d.wait_grpc_apps({"solo": [rs.key]}, up={rs.key})
        ch = d.channel()
        reply, call = self.unary(ch, b"no app metadata")
        self.assertEqual(reply["replica"], "rs")
        self.assertEqual(call.code(), grpc.StatusCode.OK)
        reply, _ = self.unary(ch, b"named", app="solo")
        self.assertEqual(reply["replica"], "rs")

    def test_unknown_app_not_found(self):
        ra, rb = self.replica("ra"), self.replica("rb")
        d = self.ingressd(topology(group("alpha-secret-app", [target(ra)]),
                                   group("beta-hidden-app", [target(rb)])))
        d.wait_grpc_apps({"alpha-secret-app": [ra.key], "beta-hidden-app": [rb.key]})
        ch = d.channel()
        for app in (None, "gamma", ""):
            e = self.rpc_error(lambda: self.unary(ch, app=app))
            self.assertEqual(e.code(), grpc.StatusCode.NOT_FOUND, "application=%r: %s" % (app, e))
            details = e.details() or ""
            self.assertNotIn("alpha-secret-app", details)
            self.assertNotIn("beta-hidden-app", details)
        self.assertEqual(ra.calls(UNARY) + rb.calls(UNARY), 0)

    # --- call types ----------------------------------------------------------------------------
    def test_server_stream_gate(self):
        d, ra, _ = self.two_apps()
        ch = d.channel()
        it = ch.unary_stream("/test.Echo/ServerStream")(
            jdump({"n": 6, "gate": True, "id": "gate1"}), timeout=30, metadata=md("alpha"))
        # The replica sends message 1 only after Release: message 0 must get here on its own.
        first = jload(next(it))
        self.assertEqual((first["replica"], first["i"]), ("ra", 0))
        self.assertIn(("x-replica", "ra"), tuple(it.initial_metadata()))
        ra.release("gate1")
        self.assertEqual([jload(m)["i"] for m in it], [1, 2, 3, 4, 5])
        self.assertEqual(it.code(), grpc.StatusCode.OK)

    def test_client_stream_integrity(self):
        d, _, _ = self.two_apps()
        ch = d.channel()
        msgs = [os.urandom(16 * 1024) for _ in range(200)]
        reply = jload(ch.stream_unary("/test.Echo/ClientStream")(
            iter(msgs), timeout=60, metadata=md("beta")))
        self.assertEqual(reply["replica"], "rb")
        self.assertEqual(reply["count"], 200)
        self.assertEqual(reply["bytes"], 200 * 16 * 1024)
        self.assertEqual(reply["sha256"], hashlib.sha256(b"".join(msgs)).hexdigest())

    def test_bidi_ping_pong(self):
        d, _, _ = self.two_apps()
        ch = d.channel()
        outgoing = queue.Queue()
        responses = ch.stream_stream("/test.Echo/Bidi")(
            iter(outgoing.get, None), timeout=60, metadata=md("alpha"))
        try:
            # One message in flight at a time: each echo must come back before the next is sent,
            # so neither direction may hold a message back waiting for more.
            for i in range(50):
                msg = ("ping %d " % i).encode() + os.urandom(i * 37)
                outgoing.put(msg)
                self.assertEqual(next(responses), msg, "round trip %d" % i)
        finally:
            outgoing.put(None)
        self.assertEqual(list(responses), [])
        self.assertEqual(responses.code(), grpc.StatusCode.OK)

    def test_large_server_stream(self):
        d, _, _ = self.two_apps()
        ch = d.channel()
        n, size = 64, 256 * 1024
        it = ch.unary_stream("/test.Echo/ServerStream")(
            jdump({"n": n, "size": size}), timeout=120, metadata=md("alpha"))
        expect = hashlib.sha256()
        got = hashlib.sha256()
        count = 0
        for raw in it:
            expect.update(jdump({"replica": "ra", "i": count, "pad": "x" * size}))
            got.update(raw)
            count += 1
        self.assertEqual(count, n)
        self.assertEqual(got.hexdigest(), expect.hexdigest())
        self.assertEqual(it.code(), grpc.StatusCode.OK)

    def test_server_stream_backpressure(self):
        """A client that stops reading stalls the replica (flow control end to end) and the proxy's
        memory stays bounded; then the client reads everything, intact."""
        d, ra, _ = self.two_apps()
        ch = d.channel()
        self.unary(ch, app="alpha")  # warm up connections before measuring memory
        rss_before = rss_kib(d.proc.pid)
        n, size = 256, 256 * 1024   # 64 MiB in all
        it = ch.unary_stream("/test.Echo/ServerStream")(
            jdump({"n": n, "size": size, "id": "bp1"}), timeout=120, metadata=md("alpha"))
        self.assertEqual(jload(next(it))["i"], 0)
        # The client reads nothing more: within this bound the replica must not get all 64 MiB out.
        sent = ra.control("WaitSent", {"id": "bp1", "count": n, "timeout": 2.0})
        self.assertFalse(sent["reached"], "replica sent all %d messages to a client that reads "
                         "nothing: no flow control through the proxy (%s)" % (n, sent))
        grown = rss_kib(d.proc.pid) - rss_before
        self.assertLess(grown, 32 * 1024, "ingressd RSS grew %d KiB while the client did not read "
                        "(replica had sent %d of %d 256 KiB messages)" % (grown, sent["sent"], n))
        count = 1
        for raw in it:
            msg = jload(raw)
            self.assertEqual((msg["i"], len(msg["pad"])), (count, size))
            count += 1
        self.assertEqual(count, n)
        self.assertEqual(it.code(), grpc.StatusCode.OK)

    # --- status mapping ------------------------------------------------------------------------
    def test_custom_status_details_trailers(self):
        d, _, _ = self.two_apps()
        ch = d.channel()
        fail = ch.unary_unary("/test.Echo/Fail")
        # initial_metadata False: the replica answers trailers-only (one HEADERS frame, END_STREAM)
        for code, details, initial in ((9, "precondition: ü 100% wrong", True), (3, "bad argument", True),
                                       (13, "replica internal", True), (9, "trailers only", False),
                                       (16, "trailers only too", False)):
            e = self.rpc_error(lambda: fail(
                jdump({"code": code, "details": details, "initial_metadata": initial,
                       "trailer": {"x-custom-trailer": "v%d" % code, "x-second": "two"}}),
                timeout=10, metadata=md("alpha")))
            self.assertEqual(e.code().value[0], code, "%s (initial_metadata %s)" % (e, initial))
            self.assertEqual(e.details(), details)
            trailers = tuple(e.trailing_metadata() or ())
            self.assertIn(("x-custom-trailer", "v%d" % code), trailers)
            self.assertIn(("x-second", "two"), trailers)

    def test_unavailable_no_healthy_replica(self):
        d = self.ingressd(topology(group("empty", [])))
        d.wait_grpc_apps({"empty": []})
        ch = d.channel()
        for app in ("empty", None):
            e = self.rpc_error(lambda: self.unary(ch, app=app))
            self.assertEqual(e.code(), grpc.StatusCode.UNAVAILABLE, str(e))
            self.assertIn("no_healthy_replica", e.details() or "")

    def test_unavailable_upstream_error(self):
        port = support.closed_port()
        d = self.ingressd(topology(group("gone", [{"ip": support.THIS_NODE, "port": port,
                                                   "instance_id": "n1", "name": "SERVE_REPLICA::gone#G#x"}])),
                          config=HEALTH_SLOW_CONFIG)
        d.wait_grpc_apps({"gone": ["%s:%d" % (support.THIS_NODE, port)]})
        ch = d.channel()
        e = self.rpc_error(lambda: self.unary(ch, app="gone"))
        self.assertEqual(e.code(), grpc.StatusCode.UNAVAILABLE, str(e))
        self.assertIn("upstream_error", e.details() or "")

    def test_upstream_lost_mid_stream(self):
        d, ra, _ = self.two_apps(config=HEALTH_SLOW_CONFIG)
        ch = d.channel()
        it = ch.unary_stream("/test.Echo/ServerStream")(
            jdump({"n": 5, "gate": True, "id": "lost1"}), timeout=30, metadata=md("alpha"))
        self.assertEqual(jload(next(it))["i"], 0)
        ra.kill()  # the connection to the replica dies mid-stream
        e = self.rpc_error(lambda: list(it))
        self.assertEqual(e.code(), grpc.StatusCode.UNAVAILABLE, str(e))

    # --- deadlines and cancellation ------------------------------------------------------------
    def test_deadline_passed_on(self):
        d, _, _ = self.two_apps()
        ch = d.channel()
        reply, _ = self.unary(ch, app="alpha", timeout=5.0)
        self.assertIsNotNone(reply["time_remaining"], "grpc-timeout did not reach the replica")
        self.assertGreater(reply["time_remaining"], 0)
        # grpc-timeout is rounded up to its unit, and grpcio's remaining time can come out a few
        # ms over the caller's timeout: the bound says the deadline is the caller's, not a
        # default (none) or a larger one.
        self.assertLessEqual(reply["time_remaining"], 6.0)

    def test_deadline_expiry(self):
        d, ra, _ = self.two_apps()
        ch = d.channel()
        start = time.monotonic()
        e = self.rpc_error(lambda: ch.unary_unary("/test.Echo/Hang")(
            jdump({"id": "dl1"}), timeout=1.0, metadata=md("alpha")))
        self.assertEqual(e.code(), grpc.StatusCode.DEADLINE_EXCEEDED, str(e))
        self.assertLess(time.monotonic() - start, 10)
        self.assertTrue(ra.wait_cancelled("dl1"), "the replica never saw the expired call end")

    def test_deadline_expiry_at_proxy(self):
        """grpc-timeout sent with no client-side timer (grpc-python puts that metadata on the wire
        when the call has no timeout of its own): DEADLINE_EXCEEDED must come from the far side."""
        d, ra, _ = self.two_apps()
        ch = d.channel()
        start = time.monotonic()
        fut = ch.unary_unary("/test.Echo/Hang").future(
            jdump({"id": "dl2"}), metadata=md("alpha") + (("grpc-timeout", "1S"),))
        try:
            e = fut.exception(timeout=15)
        except grpc.FutureTimeoutError:
            fut.cancel()
            self.fail("no answer 15s after a call with grpc-timeout 1S")
        elapsed = time.monotonic() - start
        self.assertIsNotNone(e, "the Hang call succeeded?")
        self.assertEqual(e.code(), grpc.StatusCode.DEADLINE_EXCEEDED, str(e))
        self.assertLess(elapsed, 10, "DEADLINE_EXCEEDED after %.1fs for a 1s grpc-timeout" % elapsed)
        self.assertTrue(ra.wait_cancelled("dl2"))

    def test_client_cancel(self):
        d, ra, _ = self.two_apps()
        ch = d.channel()
        fut = ch.unary_unary("/test.Echo/Hang").future(jdump({"id": "c1"}), timeout=60,
                                                       metadata=md("alpha"))
        self.assertTrue(ra.wait_started("c1"), "Hang never reached the replica")
        fut.cancel()
        self.assertTrue(ra.wait_cancelled("c1"), "client cancel did not reset the upstream stream")

    def test_client_disconnect(self):
        d, ra, _ = self.two_apps()
        # A client in another process, killed with SIGKILL: its TCP connection just closes.
        code = ("import grpc, sys\n"
                "ch = grpc.insecure_channel('127.0.0.2:%d', options=[('grpc.enable_http_proxy', 0)])\n"
                "f = ch.unary_unary('/test.Echo/Hang').future(b'{\"id\": \"disc1\"}', timeout=60,"
                " metadata=(('application', 'alpha'),))\n"
                "sys.stdin.read()\n" % d.grpc_port)
        client = subprocess.Popen([support.PYTHON, "-c", code], stdin=subprocess.PIPE)
        try:
            self.assertTrue(ra.wait_started("disc1"), "Hang never reached the replica")
            client.kill()
            client.wait(10)
            self.assertTrue(ra.wait_cancelled("disc1"),
                            "client disconnect did not reset the upstream stream")
        finally:
            if client.poll() is None:
                client.kill()
                client.wait(10)
            client.stdin.close()

    # --- drain ---------------------------------------------------------------------------------
    def test_drain(self):
        d, ra, _ = self.two_apps()
        ch = d.channel()
        it = ch.unary_stream("/test.Echo/ServerStream")(
            jdump({"n": 8, "gate": True, "id": "drain1"}), timeout=30, metadata=md("alpha"))
        self.assertEqual(jload(next(it))["i"], 0)
        d.signal(signal.SIGTERM)
        d.wait_until("the gRPC port to refuse new connections after SIGTERM",
                     lambda: refuses(support.THIS_NODE, d.grpc_port))
        ra.release("drain1")
        self.assertEqual([jload(m)["i"] for m in it], list(range(1, 8)))
        self.assertEqual(it.code(), grpc.StatusCode.OK)
        self.assertEqual(d.wait_exit(15), 0)

    # --- health --------------------------------------------------------------------------------
    def test_health_down_moves_traffic(self):
        r1, r2 = self.replica("r1"), self.replica("r2")
        d = self.ingressd(topology(group("app", [target(r1), target(r2)])), config=HEALTH_FAST_CONFIG)
        d.wait_grpc_apps({"app": [r1.key, r2.key]}, up={r1.key, r2.key}, need_listing=True)
        r1.control("SetHealthy", {"healthy": False})

        def r1_down():
            reps = {replica_key(r): r for r in d.grpc_apps()["app"]["replicas"]}
            return not replica_up(reps[r1.key]) and replica_up(reps[r2.key])
        d.wait_until("r1 marked down", r1_down)
        self.assertGreater(r1.calls("/ray.serve.RayServeAPIService/Healthz"), 0,
                           "r1 was never health-checked with the Healthz RPC")
        before = r1.calls(UNARY)
        ch = d.channel()
        for _ in range(20):
            reply, _ = self.unary(ch, app="app")
            self.assertEqual(reply["replica"], "r2")
        self.assertEqual(r1.calls(UNARY), before)
        r1.control("SetHealthy", {"healthy": True})
        d.wait_grpc_apps({"app": [r1.key, r2.key]}, up={r1.key, r2.key}, need_listing=True)

    # --- admin, metrics, access log ------------------------------------------------------------
    def test_metrics_counts(self):
        d, _, _ = self.two_apps()
        ch = d.channel()
        fail = ch.unary_unary("/test.Echo/Fail")
        for _ in range(3):
            self.unary(ch, app="alpha")
        for _ in range(2):
            self.unary(ch, app="beta")
        for _ in range(2):
            self.rpc_error(lambda: fail(jdump({"code": 9, "details": "x"}), timeout=10, metadata=md("alpha")))
        self.rpc_error(lambda: self.unary(ch, app="nope"))
        want = {("alpha", "0"): 3, ("beta", "0"): 2, ("alpha", "9"): 2, ("", "5"): 1}

        def counts():
            text = d.metrics()
            return {k: metric_value(text, "ingressd_grpc_requests_total",
                                    {"app": k[0], "grpc_status": k[1]}) for k in want}
        d.wait_until("grpc request counters to reach %s" % want,
                     lambda: all((v or 0) >= want[k] for k, v in counts().items()))
        self.assertEqual(counts(), {k: float(v) for k, v in want.items()})

        hang = ch.unary_unary("/test.Echo/Hang").future(jdump({"id": "m1"}), timeout=60,
                                                        metadata=md("beta"))
        d.wait_until("ingressd_grpc_active_streams == 1",
                     lambda: metric_sum(d.metrics(), "ingressd_grpc_active_streams") == 1)
        hang.cancel()
        d.wait_until("ingressd_grpc_active_streams == 0",
                     lambda: metric_sum(d.metrics(), "ingressd_grpc_active_streams") == 0)

    def test_access_log(self):
        d, _, _ = self.two_apps(access_log=True)
        ch = d.channel()
        self.unary(ch, b"logged", app="alpha")
        self.rpc_error(lambda: ch.unary_unary("/test.Echo/Fail")(
            jdump({"code": 9, "details": "x"}), timeout=10, metadata=md("beta")))

        def grpc_lines():
            try:
                with open(d.access_log_path) as f:
                    lines = [json.loads(l) for l in f if l.strip()]
            except FileNotFoundError:
                return None
            lines = [l for l in lines if l.get("listener") == "grpc"]
            return lines if len(lines) >= 2 else None
        lines = d.wait_until("two gRPC access log lines", grpc_lines)
        self.assertEqual(len(lines), 2, lines)
        by_path = {l.get("path"): l for l in lines}
        self.assertEqual(set(by_path), {"/test.Echo/Unary", "/test.Echo/Fail"}, lines)
        for path, app, replica, grpc_status in (("/test.Echo/Unary", "alpha", "SERVE_REPLICA::alpha#A#ra", 0),
                                                ("/test.Echo/Fail", "beta", "SERVE_REPLICA::beta#B#rb", 9)):
            l = by_path[path]
            self.assertEqual(l.get("method"), "POST", l)
            self.assertEqual(l.get("app"), app, l)
            self.assertEqual(l.get("status"), 200, l)
            self.assertIs(type(l.get("grpc_status")), int, l)
            self.assertEqual(l.get("grpc_status"), grpc_status, l)
            self.assertEqual(l.get("replica"), replica, l)
            self.assertIs(type(l.get("bytes")), int, l)
            self.assertIn(type(l.get("duration")), (int, float), l)
            self.assertGreaterEqual(l["duration"], 0, l)
        self.assertGreater(by_path["/test.Echo/Unary"]["bytes"], 0)

    def test_topology_grpc_apps(self):
        r1, r2, r3 = self.replica("r1"), self.replica("r2"), self.replica("r3")
        d = self.ingressd(topology(
            group("alpha", [target(r1, "SERVE_REPLICA::alpha#A#r1"), target(r2, "SERVE_REPLICA::alpha#A#r2")]),
            group("beta", [target(r3, "SERVE_REPLICA::beta#B#r3")]),
            group("web", [], protocol="HTTP", route_prefix="/web")))
        apps = d.wait_grpc_apps({"alpha": [r1.key, r2.key], "beta": [r3.key]},
                                up={r1.key, r2.key, r3.key}, need_listing=True)
        self.assertEqual(set(apps), {"alpha", "beta"}, "grpc_apps lists exactly the gRPC groups")
        got = {app: sorted((replica_key(r), r["name"], replica_up(r)) for r in apps[app]["replicas"])
               for app in apps}
        self.assertEqual(got, {
            "alpha": sorted([(r1.key, "SERVE_REPLICA::alpha#A#r1", True),
                             (r2.key, "SERVE_REPLICA::alpha#A#r2", True)]),
            "beta": [(r3.key, "SERVE_REPLICA::beta#B#r3", True)],
        })
        # a topology change (atomic rewrite) shows up too
        d.write_topology(topology(group("beta", [target(r3, "SERVE_REPLICA::beta#B#r3")])))
        d.wait_until("alpha to leave grpc_apps", lambda: set(d.grpc_apps()) == {"beta"})

    def test_http_listener_unaffected(self):
        http_fake = HttpFake("http fake says hi")
        self.addCleanup(http_fake.stop)
        ra = self.replica("ra")
        d = self.ingressd(topology(
            group("web", [{"ip": support.THIS_NODE, "port": http_fake.port, "instance_id": "n1",
                           "name": "SERVE_REPLICA::web#W#h1"}], protocol="HTTP", route_prefix="/web"),
            group("alpha", [target(ra)])))
        d.wait_grpc_apps({"alpha": [ra.key]}, up={ra.key})
        ch = d.channel()
        self.assertEqual(self.unary(ch, app="alpha")[0]["replica"], "ra")
        conn = http_conn(d.port)
        try:
            conn.request("GET", "/web/hello")
            resp = conn.getresponse()
            body = resp.read().decode()
        finally:
            conn.close()
        self.assertEqual(resp.status, 200, body)
        self.assertEqual(body, "http fake says hi")
        self.assertGreater(http_fake.gets_for("/web/hello") + http_fake.gets_for("/hello"), 0)
        self.assertEqual(self.unary(ch, app="alpha")[0]["replica"], "ra")

    # --- gRPC over the HTTPS listener (ALPN h2) -------------------------------------------------
    def test_grpc_over_tls_when_alpn_chooses_h2(self):
        tmp = self.tmpdir()
        cert, key = os.path.join(tmp, "cert.pem"), os.path.join(tmp, "key.pem")
        subprocess.run(["openssl", "req", "-x509", "-newkey", "ec", "-pkeyopt", "ec_paramgen_curve:P-256",
                        "-nodes", "-keyout", key, "-out", cert, "-days", "2", "-subj", "/CN=localhost",
                        "-addext", "subjectAltName=DNS:localhost,IP:" + support.THIS_NODE],
                       check=True, capture_output=True)
        ra = self.replica("ra")
        d = self.ingressd(topology(group("alpha", [target(ra)])),
                          extra_args=["--tls-listen", support.THIS_NODE + ":0", "--tls-cert", cert, "--tls-key", key])
        m = re.search(r", https 127\.0\.0\.2:(\d+)", d.out.text())
        self.assertTrue(m, d.out.text())
        https_port = int(m.group(1))
        d.wait_grpc_apps({"alpha": [ra.key]}, up={ra.key})
        # A gRPC client offers h2 only: its calls are served as gRPC, streams and all.
        ch = grpc.secure_channel("%s:%d" % (support.THIS_NODE, https_port),
                                 grpc.ssl_channel_credentials(open(cert, "rb").read()))
        self.addCleanup(ch.close)
        body, _ = ch.unary_unary(UNARY).with_call(b"over tls", timeout=10)
        self.assertEqual(jload(body)["replica"], "ra")
        self.assertEqual(jload(body)["echo"], "over tls")
        msgs = list(ch.unary_stream("/test.Echo/ServerStream")(jdump({"n": 20, "size": 30000}), timeout=20))
        self.assertEqual(len(msgs), 20)

        # A client that offers http/1.1 as well (browsers, curl) keeps HTTP/1.1.
        def alpn(offer):
            ctx = ssl.create_default_context(cafile=cert)
            ctx.set_alpn_protocols(offer)
            with socket.create_connection((support.THIS_NODE, https_port), timeout=10) as raw:
                with ctx.wrap_socket(raw, server_hostname="localhost") as tls:
                    return tls.selected_alpn_protocol()
        self.assertEqual(alpn(["h2", "http/1.1"]), "http/1.1")
        self.assertEqual(alpn(["h2"]), "h2")

    # --- load ----------------------------------------------------------------------------------
    def test_many_concurrent_calls(self):
        r1, r2 = self.replica("r1"), self.replica("r2")
        d = self.ingressd(topology(group("app", [target(r1), target(r2)])))
        d.wait_grpc_apps({"app": [r1.key, r2.key]}, up={r1.key, r2.key})
        ch = d.channel()
        call = ch.unary_unary(UNARY)
        results, errors = [], []
        lock = threading.Lock()

        def worker(t):
            for i in range(10):
                payload = ("t%d-%d" % (t, i)).encode()
                try:
                    reply = jload(call(payload, timeout=30, metadata=md("app")))
                    ok = reply["echo"] == payload.decode()
                    with lock:
                        results.append((ok, reply["replica"]))
                except grpc.RpcError as e:
                    with lock:
                        errors.append("%s %s" % (e.code(), e.details()))
        threads = [threading.Thread(target=worker, args=(t,)) for t in range(20)]
        for t in threads:
            t.start()
        for t in threads:
            t.join(120)
        self.assertFalse(any(t.is_alive() for t in threads), "calls still running after 120s")
        self.assertEqual(errors, [])
        self.assertEqual(len(results), 200)
        self.assertTrue(all(ok for ok, _ in results))
        c1, c2 = r1.calls(UNARY), r2.calls(UNARY)
        self.assertEqual(c1 + c2, 200)
        self.assertGreater(c1, 0, "least-loaded never picked r1")
        self.assertGreater(c2, 0, "least-loaded never picked r2")


# --- helpers -----------------------------------------------------------------------------------
def rss_kib(pid):
    with open("/proc/%d/status" % pid) as f:
        for line in f:
            if line.startswith("VmRSS:"):
                return int(line.split()[1])
    raise AssertionError("no VmRSS for pid %d" % pid)


def metric_sum(text, name):
    total = None
    for line in text.splitlines():
        if line.startswith(name + " ") or line.startswith(name + "{"):
            total = (total or 0) + float(line.rsplit(None, 1)[1])
    return total


def refuses(host, port):
    s = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    s.settimeout(2)
    try:
        s.connect((host, port))
        return False
    except ConnectionRefusedError:
        return True
    except OSError:
        return False
    finally:
        s.close()


def http_conn(port):
    import http.client
    return http.client.HTTPConnection(support.THIS_NODE, port, timeout=10)


class HttpFake:
    """A tiny HTTP/1.1 replica in a thread: 200 with a fixed body for every GET."""

    def __init__(self, body):
        self.paths = []
        fake = self

        class Handler(http.server.BaseHTTPRequestHandler):
            protocol_version = "HTTP/1.1"

            def do_GET(self):
                fake.paths.append(self.path)
                data = body.encode()
                self.send_response(200)
                self.send_header("content-type", "text/plain")
                self.send_header("content-length", str(len(data)))
                self.end_headers()
                self.wfile.write(data)

            def log_message(self, *args):
                pass

        self.server = http.server.ThreadingHTTPServer((support.THIS_NODE, 0), Handler)
        self.server.daemon_threads = True
        self.port = self.server.server_address[1]
        self.thread = threading.Thread(target=self.server.serve_forever, daemon=True)
        self.thread.start()

    def gets_for(self, path):
        return sum(1 for p in list(self.paths) if p == path)

    def stop(self):
        self.server.shutdown()
        self.server.server_close()


if __name__ == "__main__":
    sys.exit(support.run_suite())
