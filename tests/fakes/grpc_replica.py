#!/usr/bin/python3
"""A fake Ray Serve gRPC replica: a real grpc server with generic handlers (no .proto).

    /usr/bin/python3 tests/fakes/grpc_replica.py --host 127.0.0.2 --name r1 [--port 0]

Prints one line ``PORT <n>`` on stdout once serving, then runs until SIGTERM/SIGINT or until its
stdin reaches end of file (so a test that dies takes its fakes with it; pass --ignore-stdin to run it
by hand in the background). Messages are raw bytes (JSON where structured); every response carries
the initial metadata ``x-replica: <name>``.

Service test.Echo:
  Unary         -> {"replica", "echo": request text, "metadata": {lowercased invocation metadata,
                    no -bin keys}, "time_remaining": seconds, null without a deadline}
  ServerStream  {"n", "size"?, "gate"?, "id"?} -> n messages {"replica", "i", "pad"}; with "gate": true
                    message 0 is sent, then the stream waits for Control/Release {"id"}.
  ClientStream  -> {"replica", "count", "bytes", "sha256" of the concatenated messages}
  Bidi          -> each message echoed unchanged as it arrives
  Fail          {"code", "details", "trailer": {k: v}, "initial_metadata"?} -> that status, details
                    and trailing metadata; with "initial_metadata": false no x-replica is sent first,
                    so grpc answers trailers-only (one HEADERS frame with END_STREAM)
  Hang          {"id", "quiet"?} -> blocks until the call is cancelled or its deadline passes; records
                    id; with "quiet": true not even the initial metadata is sent (no response head)
Service test.Control (these never count as replica traffic in the sense of a test, but are counted):
  WaitStarted   {"id", "timeout"} -> {"started": bool}  (a Hang or ServerStream with that id began)
  WaitCancelled {"id", "timeout"} -> {"cancelled": bool}
  WaitSent      {"id", "count", "timeout"} -> {"reached": bool, "sent": k}  (ServerStream progress:
                    k messages handed to grpc so far)
  Release       {"id"} -> {"released": true}
  SetHealthy    {"healthy": bool} -> {"healthy": bool}
  Stats         -> {"calls": {method path: count}, "replica": name, "peers": [the distinct peers
                    (ip:port, one per HTTP/2 connection) that made test.Echo calls]}
Service ray.serve.RayServeAPIService:
  Healthz       -> b"\\n\\x07success" (HealthzResponse{message: "success"}) while healthy, else
                    UNAVAILABLE "unhealthy"
"""

import argparse
import hashlib
import json
import os
import signal
import sys
import threading
from concurrent import futures

import grpc

MAX_WAIT = 120.0  # upper bound of any blocking wait inside the fake (seconds)
STATUS_BY_INT = {code.value[0]: code for code in grpc.StatusCode}


class Replica:
    def __init__(self, name):
        self.name = name
        self.lock = threading.Condition()
        self.calls = {}
        self.healthy = True
        self.started = set()     # ids of Hang / ServerStream calls that began
        self.cancelled = set()   # ids of Hang calls that saw cancellation / deadline expiry
        self.gates = {}          # id -> threading.Event (Release sets it)
        self.sent = {}           # ServerStream id -> messages handed to grpc so far
        self.peers = set()       # context.peer() of test.Echo calls: one per connection

    # --- helpers -----------------------------------------------------------------------------
    def _count(self, method):
        with self.lock:
            self.calls[method] = self.calls.get(method, 0) + 1

    def _hello(self, context, method, head=True):
        self._count(method)
        if method.startswith("/test.Echo/"):
            with self.lock:
                self.peers.add(context.peer())
        if head:
            context.send_initial_metadata((("x-replica", self.name),))

    def _gate(self, call_id):
        with self.lock:
            ev = self.gates.get(call_id)
            if ev is None:
                ev = self.gates[call_id] = threading.Event()
            return ev

    def _mark(self, which, call_id):
        with self.lock:
            which.add(call_id)
            self.lock.notify_all()

    def _wait_for(self, predicate, timeout):
        timeout = max(0.0, min(float(timeout), MAX_WAIT))
        with self.lock:
            return self.lock.wait_for(predicate, timeout=timeout)

    @staticmethod
    def _json(request):
        if not request:
            return {}
        return json.loads(request.decode("utf-8"))

    def _reply(self, obj):
        return json.dumps(obj).encode("utf-8")

    # --- test.Echo -----------------------------------------------------------------------------
    def unary(self, request, context):
        self._hello(context, "/test.Echo/Unary")
        metadata = {}
        for key, value in context.invocation_metadata():
            key = key.lower()
            if key.endswith("-bin"):
                continue
            metadata[key] = value
        remaining = context.time_remaining()
        if remaining is not None and remaining > 1e9:  # grpc's "no deadline" is ~2^63 ns
            remaining = None
        return self._reply({
            "replica": self.name,
            "echo": request.decode("utf-8", errors="replace"),
            "metadata": metadata,
            "time_remaining": remaining,
        })

    def server_stream(self, request, context):
        self._hello(context, "/test.Echo/ServerStream")
        req = self._json(request)
        n = int(req.get("n", 1))
        size = int(req.get("size", 16))
        gate = bool(req.get("gate", False))
        call_id = str(req.get("id", ""))
        pad = "x" * size
        if call_id:
            with self.lock:
                self.sent[call_id] = 0
            self._mark(self.started, call_id)
        for i in range(n):
            if i == 1 and gate:
                if not self._gate(call_id).wait(MAX_WAIT):
                    context.abort(grpc.StatusCode.FAILED_PRECONDITION, "gate %r never released" % call_id)
                if not context.is_active():
                    return
            yield self._reply({"replica": self.name, "i": i, "pad": pad})
            # grpc pulls the next message only once this one was handed to the transport
            if call_id:
                with self.lock:
                    self.sent[call_id] = i + 1
                    self.lock.notify_all()

    def client_stream(self, request_iterator, context):
        self._hello(context, "/test.Echo/ClientStream")
        digest = hashlib.sha256()
        count = 0
        total = 0
        for message in request_iterator:
            count += 1
            total += len(message)
            digest.update(message)
        return self._reply({"replica": self.name, "count": count, "bytes": total,
                            "sha256": digest.hexdigest()})

    def bidi(self, request_iterator, context):
        self._hello(context, "/test.Echo/Bidi")
        for message in request_iterator:
            yield message

    def fail(self, request, context):
        req = self._json(request)
        if req.get("initial_metadata", True):
            self._hello(context, "/test.Echo/Fail")
        else:
            self._count("/test.Echo/Fail")  # no HEADERS before the status: a trailers-only response
        code = STATUS_BY_INT[int(req.get("code", 2))]
        trailer = tuple((str(k).lower(), str(v)) for k, v in (req.get("trailer") or {}).items())
        if trailer:
            context.set_trailing_metadata(trailer)
        context.abort(code, str(req.get("details", "")))  # no response message, status only

    def hang(self, request, context):
        req = self._json(request)
        self._hello(context, "/test.Echo/Hang", head=not req.get("quiet", False))
        call_id = str(req.get("id", ""))
        done = threading.Event()

        def on_end():
            # Runs when the RPC terminates: here only by cancellation (RST_STREAM, disconnect)
            # or deadline expiry, since the handler itself never returns before it.
            self._mark(self.cancelled, call_id)
            done.set()

        if not context.add_callback(on_end):
            on_end()  # already terminated
        self._mark(self.started, call_id)
        done.wait(MAX_WAIT)
        if not done.is_set():
            context.abort(grpc.StatusCode.ABORTED, "hang %r never cancelled" % call_id)
        return b""

    # --- test.Control --------------------------------------------------------------------------
    def wait_started(self, request, context):
        self._count("/test.Control/WaitStarted")
        req = self._json(request)
        call_id = str(req.get("id", ""))
        ok = self._wait_for(lambda: call_id in self.started, req.get("timeout", 10))
        return self._reply({"started": bool(ok)})

    def wait_cancelled(self, request, context):
        self._count("/test.Control/WaitCancelled")
        req = self._json(request)
        call_id = str(req.get("id", ""))
        ok = self._wait_for(lambda: call_id in self.cancelled, req.get("timeout", 10))
        return self._reply({"cancelled": bool(ok)})

    def wait_sent(self, request, context):
        self._count("/test.Control/WaitSent")
        req = self._json(request)
        call_id = str(req.get("id", ""))
        count = int(req.get("count", 1))
        ok = self._wait_for(lambda: self.sent.get(call_id, 0) >= count, req.get("timeout", 10))
        with self.lock:
            sent = self.sent.get(call_id, 0)
        return self._reply({"reached": bool(ok), "sent": sent})

    def release(self, request, context):
        self._count("/test.Control/Release")
        self._gate(str(self._json(request).get("id", ""))).set()
        return self._reply({"released": True})

    def set_healthy(self, request, context):
        self._count("/test.Control/SetHealthy")
        healthy = bool(self._json(request).get("healthy", True))
        with self.lock:
            self.healthy = healthy
        return self._reply({"healthy": healthy})

    def stats(self, request, context):
        self._count("/test.Control/Stats")
        with self.lock:
            calls = dict(self.calls)
            peers = sorted(self.peers)
        return self._reply({"calls": calls, "replica": self.name, "peers": peers})

    # --- ray.serve.RayServeAPIService ----------------------------------------------------------
    def healthz(self, request, context):
        self._hello(context, "/ray.serve.RayServeAPIService/Healthz")
        with self.lock:
            healthy = self.healthy
        if not healthy:
            context.abort(grpc.StatusCode.UNAVAILABLE, "unhealthy")
        return b"\n\x07success"

    def handlers(self):
        uu = grpc.unary_unary_rpc_method_handler
        us = grpc.unary_stream_rpc_method_handler
        su = grpc.stream_unary_rpc_method_handler
        ss = grpc.stream_stream_rpc_method_handler
        return [
            grpc.method_handlers_generic_handler("test.Echo", {
                "Unary": uu(self.unary),
                "ServerStream": us(self.server_stream),
                "ClientStream": su(self.client_stream),
                "Bidi": ss(self.bidi),
                "Fail": uu(self.fail),
                "Hang": uu(self.hang),
            }),
            grpc.method_handlers_generic_handler("test.Control", {
                "WaitStarted": uu(self.wait_started),
                "WaitCancelled": uu(self.wait_cancelled),
                "WaitSent": uu(self.wait_sent),
                "Release": uu(self.release),
                "SetHealthy": uu(self.set_healthy),
                "Stats": uu(self.stats),
            }),
            grpc.method_handlers_generic_handler("ray.serve.RayServeAPIService", {
                "Healthz": uu(self.healthz),
            }),
        ]


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--host", default="127.0.0.2")
    parser.add_argument("--port", type=int, default=0)
    parser.add_argument("--name", default="replica")
    parser.add_argument("--workers", type=int, default=64)
    parser.add_argument("--max-streams", type=int, default=0,
                        help="SETTINGS_MAX_CONCURRENT_STREAMS it announces (0: grpc's default, none)")
    parser.add_argument("--ignore-stdin", action="store_true",
                        help="do not exit when stdin reaches end of file")
    args = parser.parse_args()

    replica = Replica(args.name)
    server = grpc.server(futures.ThreadPoolExecutor(max_workers=args.workers),
                         handlers=replica.handlers(),
                         maximum_concurrent_rpcs=None,
                         options=[("grpc.so_reuseport", 0)] +
                         ([("grpc.max_concurrent_streams", args.max_streams)] if args.max_streams else []))
    port = server.add_insecure_port("%s:%d" % (args.host, args.port))
    if port == 0:
        print("cannot bind %s:%d" % (args.host, args.port), file=sys.stderr)
        return 1
    server.start()

    stop = threading.Event()
    signal.signal(signal.SIGTERM, lambda *_: stop.set())
    signal.signal(signal.SIGINT, lambda *_: stop.set())
    if not args.ignore_stdin:
        def watch_stdin():
            try:
                while os.read(0, 4096):
                    pass
            except OSError:
                pass
            stop.set()
        threading.Thread(target=watch_stdin, daemon=True).start()

    sys.stdout.write("PORT %d\n" % port)
    sys.stdout.flush()
    while not stop.wait(3600):
        pass
    # release anything still blocked so the stop is quick
    with replica.lock:
        for ev in replica.gates.values():
            ev.set()
    server.stop(grace=0).wait(5)
    return 0


if __name__ == "__main__":
    sys.exit(main())
