#!/usr/bin/python3
"""A stand-in for ingressd's gRPC contract, written in Python grpc, used ONLY to check the tests
themselves (grpc_test.py --ingressd tests/grpc/mock_ingressd.py) while the daemon is not there.

It is not a model of the real implementation: it re-frames calls through grpc-core (no byte
relaying), polls the topology file, and its HTTP listener only forwards GETs. It implements just
enough of the flags, log line, admin endpoints, metrics, access log, health checks and drain the
test suite relies on.
"""

import argparse
import http.client
import http.server
import json
import os
import signal
import sys
import threading
import time
from concurrent import futures

import grpc
import yaml

OPTS = [("grpc.enable_http_proxy", 0), ("grpc.enable_retries", 0),
        ("grpc.max_receive_message_length", -1), ("grpc.max_send_message_length", -1)]


def duration(v, default):
    if v is None:
        return default
    s = str(v)
    for suffix, mult in (("ms", 0.001), ("s", 1), ("m", 60), ("h", 3600)):
        if s.endswith(suffix):
            return float(s[:-len(suffix)]) * mult
    return float(s)


class Replica:
    def __init__(self, t):
        self.key = "%s:%d" % (t["ip"], t["port"])
        self.name = t.get("name", "")
        self.up = True
        self.in_flight = 0
        self.fails = 0
        self.passes = 0
        self.channel = grpc.insecure_channel(self.key, options=OPTS)


class Mock:
    def __init__(self, args, cfg):
        self.args = args
        self.cfg = cfg
        self.lock = threading.Lock()
        self.grpc_apps = {}   # name -> [Replica]
        self.http_apps = {}   # prefix -> [(ip, port)]
        self.replicas = {}    # key -> Replica
        self.counts = {}
        self.active = 0
        self.mtime = None
        self.log = open(args.access_log, "a") if args.access_log and args.access_log != "off" else None
        self.load()

    # --- topology ------------------------------------------------------------------------------
    def load(self):
        st = os.stat(self.args.topology_file)
        if st.st_mtime_ns == self.mtime:
            return
        self.mtime = st.st_mtime_ns
        with open(self.args.topology_file) as f:
            doc = json.load(f)
        apps, http_apps = {}, {}
        with self.lock:
            for g in doc.get("target_groups", []):
                if g.get("protocol") == "gRPC":
                    reps = []
                    for t in g.get("targets", []):
                        key = "%s:%d" % (t["ip"], t["port"])
                        r = self.replicas.get(key) or Replica(t)
                        r.name = t.get("name", "")
                        self.replicas[key] = r
                        reps.append(r)
                    apps[g["app_name"]] = reps
                else:
                    http_apps[g["route_prefix"]] = [(t["ip"], t["port"]) for t in g.get("targets", [])]
            self.grpc_apps, self.http_apps = apps, http_apps

    def watch(self):
        while True:
            time.sleep(0.1)
            try:
                self.load()
            except (OSError, ValueError):
                pass

    def health(self):
        h = self.cfg.get("health") or {}
        interval = duration(h.get("interval"), 5)
        fast = duration(h.get("fast_interval"), 0.25)
        fall, rise = int(h.get("fall", 2)), int(h.get("rise", 2))
        while True:
            with self.lock:
                reps = [r for reps in self.grpc_apps.values() for r in reps]
            for r in reps:
                try:
                    body = r.channel.unary_unary("/ray.serve.RayServeAPIService/Healthz")(b"", timeout=2)
                    ok = b"success" in body
                except grpc.RpcError:
                    ok = False
                with self.lock:
                    if ok:
                        r.passes, r.fails = r.passes + 1, 0
                        if not r.up and r.passes >= rise:
                            r.up = True
                    else:
                        r.fails, r.passes = r.fails + 1, 0
                        if r.up and r.fails >= fall:
                            r.up = False
            time.sleep(fast if any(not r.up or r.fails for r in reps) else interval)

    # --- grpc ----------------------------------------------------------------------------------
    def count(self, app, status):
        with self.lock:
            self.counts[(app, status)] = self.counts.get((app, status), 0) + 1

    def access(self, path, app, status, replica, nbytes, start):
        if self.log:
            self.log.write(json.dumps({"listener": "grpc", "method": "POST", "path": path, "app": app,
                                       "status": 200, "grpc_status": status, "replica": replica,
                                       "bytes": nbytes, "duration": time.monotonic() - start}) + "\n")
            self.log.flush()

    def handle(self, method, app_md, request_iterator, context):
        start = time.monotonic()
        with self.lock:
            apps = dict(self.grpc_apps)
            self.active += 1
        try:
            app = app_md
            if app is None and len(apps) == 1:
                app = next(iter(apps))
            if app not in apps:
                self.count("", 5)
                self.access(method, "", 5, "", 0, start)
                context.abort(grpc.StatusCode.NOT_FOUND, "unknown application")
            with self.lock:
                healthy = [r for r in apps[app] if r.up]
                r = min(healthy, key=lambda x: x.in_flight) if healthy else None
                if r:
                    r.in_flight += 1
            if r is None:
                self.count(app, 14)
                self.access(method, app, 14, "", 0, start)
                context.abort(grpc.StatusCode.UNAVAILABLE, "no_healthy_replica")
            nbytes = 0
            try:
                remaining = context.time_remaining()
                md = [(k, v) for k, v in context.invocation_metadata()]
                call = r.channel.stream_stream(method)(
                    request_iterator, timeout=remaining if remaining and remaining < 1e9 else None,
                    metadata=md)
                context.add_callback(call.cancel)
                got_headers = False
                try:
                    headers = call.initial_metadata()
                    got_headers = bool(headers)
                    context.send_initial_metadata(headers or ())
                    for msg in call:
                        nbytes += len(msg)
                        yield msg
                    code, details, trailers = call.code(), call.details(), call.trailing_metadata()
                except grpc.RpcError as e:
                    code, details, trailers = e.code(), e.details(), e.trailing_metadata()
                    if code == grpc.StatusCode.UNAVAILABLE and not got_headers:
                        details = "upstream_error"
                if trailers:
                    context.set_trailing_metadata(trailers)
                status = code.value[0]
                self.count(app, status)
                self.access(method, app, status, r.name, nbytes, start)
                if code != grpc.StatusCode.OK:
                    context.abort(code, details or "")
            finally:
                with self.lock:
                    r.in_flight -= 1
        finally:
            with self.lock:
                self.active -= 1

    def generic_handler(self):
        mock = self

        class Handler(grpc.GenericRpcHandler):
            def service(self, details):
                app = None
                for k, v in details.invocation_metadata:
                    if k == "application":
                        app = v
                return grpc.stream_stream_rpc_method_handler(
                    lambda it, ctx: mock.handle(details.method, app, it, ctx))
        return Handler()

    # --- admin + http --------------------------------------------------------------------------
    def admin_handler(self):
        mock = self

        class H(http.server.BaseHTTPRequestHandler):
            def do_GET(self):
                if self.path == "/topology":
                    with mock.lock:
                        body = json.dumps({"grpc_apps": [
                            {"name": n, "replicas": [{"key": r.key, "name": r.name, "up": r.up,
                                                      "in_flight": r.in_flight} for r in reps]}
                            for n, reps in mock.grpc_apps.items()]})
                elif self.path == "/metrics":
                    with mock.lock:
                        lines = ['ingressd_grpc_requests_total{app="%s",grpc_status="%d"} %d' % (a, s, n)
                                 for (a, s), n in mock.counts.items()]
                        lines.append("ingressd_grpc_active_streams %d" % mock.active)
                    body = "\n".join(lines) + "\n"
                else:
                    self.send_error(404)
                    return
                data = body.encode()
                self.send_response(200)
                self.send_header("content-length", str(len(data)))
                self.end_headers()
                self.wfile.write(data)

            def log_message(self, *a):
                pass
        return H

    def http_handler(self):
        mock = self

        class H(http.server.BaseHTTPRequestHandler):
            def do_GET(self):
                with mock.lock:
                    apps = dict(mock.http_apps)
                for prefix, targets in sorted(apps.items(), key=lambda kv: -len(kv[0])):
                    if self.path.startswith(prefix) and targets:
                        c = http.client.HTTPConnection(*targets[0], timeout=10)
                        c.request("GET", self.path)
                        resp = c.getresponse()
                        data = resp.read()
                        self.send_response(resp.status)
                        self.send_header("content-length", str(len(data)))
                        self.end_headers()
                        self.wfile.write(data)
                        return
                self.send_error(404)

            def log_message(self, *a):
                pass
        return H


def hostport(s):
    h, p = s.rsplit(":", 1)
    return h, int(p)


def main():
    p = argparse.ArgumentParser()
    for flag in ("--config", "--topology-file", "--listen", "--admin-listen", "--grpc-listen",
                 "--node-ip", "--threads", "--access-log"):
        p.add_argument(flag)
    args = p.parse_args()
    cfg = {}
    if args.config:
        with open(args.config) as f:
            cfg = yaml.safe_load(f) or {}
    mock = Mock(args, cfg)
    threading.Thread(target=mock.watch, daemon=True).start()
    threading.Thread(target=mock.health, daemon=True).start()

    server = grpc.server(futures.ThreadPoolExecutor(max_workers=256), handlers=[mock.generic_handler()],
                         options=OPTS + [("grpc.so_reuseport", 0)])
    gport = server.add_insecure_port(args.grpc_listen)
    server.start()
    servers = []
    for addr, handler in ((args.listen, mock.http_handler()), (args.admin_listen, mock.admin_handler())):
        s = http.server.ThreadingHTTPServer(hostport(addr), handler)
        s.daemon_threads = True
        threading.Thread(target=s.serve_forever, daemon=True).start()
        servers.append(s)
    host = hostport(args.listen)[0]
    print("mock ingressd listening on %s:%d (admin %s:%d), grpc %s:%d, 1 threads" % (
        host, servers[0].server_address[1], host, servers[1].server_address[1],
        hostport(args.grpc_listen)[0], gport), flush=True)

    stop = threading.Event()
    signal.signal(signal.SIGTERM, lambda *_: stop.set())
    while not stop.wait(3600):
        pass
    print("drain", flush=True)
    server.stop(grace=duration((cfg.get("drain") or {}).get("timeout"), 5)).wait()
    return 0


if __name__ == "__main__":
    sys.exit(main())
