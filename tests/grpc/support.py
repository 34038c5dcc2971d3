"""Shared helpers of the gRPC tests: start/stop fake replicas and ingressd, control calls.

Loopback only: 127.0.0.2 is "this node", 127.0.0.3 "another node"; every port is bound as 0.
Every process started here is stopped by its owner's cleanup (unittest addCleanup), also on
failure. Waits are for events (a line of output, a control RPC that returns when something
happened, an endpoint reaching a state), each bounded by a deadline; never a fixed sleep.
"""

import http.client
import json
import os
import re
import signal
import socket
import subprocess
import sys
import tempfile
import threading
import time

import grpc

HERE = os.path.dirname(os.path.abspath(__file__))
REPO = os.path.dirname(os.path.dirname(HERE))
FAKE = os.path.join(REPO, "tests", "fakes", "grpc_replica.py")
PYTHON = "/usr/bin/python3" if os.path.exists("/usr/bin/python3") else sys.executable
THIS_NODE = "127.0.0.2"
OTHER_NODE = "127.0.0.3"
START_TIMEOUT = 20.0

# Set by grpc_test.py from --ingressd / INGRESSD_BIN.
INGRESSD = os.environ.get("INGRESSD_BIN") or os.path.join(REPO, "build", "release", "ingressd")

CHANNEL_OPTIONS = [
    ("grpc.enable_http_proxy", 0),   # never route loopback test traffic through an http_proxy
    ("grpc.enable_retries", 0),      # a failure must show as it is, not be retried away
    ("grpc.max_receive_message_length", 64 * 1024 * 1024),
    ("grpc.max_send_message_length", 64 * 1024 * 1024),
]


def channel(host, port, options=()):
    return grpc.insecure_channel("%s:%d" % (host, port), options=CHANNEL_OPTIONS + list(options))


def jdump(obj):
    return json.dumps(obj).encode("utf-8")


def jload(data):
    return json.loads(data.decode("utf-8"))


def closed_port(host=THIS_NODE):
    """A port on host that nothing listens on (bound once, then closed)."""
    s = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    try:
        s.bind((host, 0))
        return s.getsockname()[1]
    finally:
        s.close()


class LineReader:
    """Drains a pipe in a thread (so the child never blocks on it) and lets callers wait for a line."""

    def __init__(self, pipe, echo_prefix=None):
        self.lines = []
        self.cond = threading.Condition()
        self.eof = False
        self.echo_prefix = echo_prefix
        self.thread = threading.Thread(target=self._run, args=(pipe,), daemon=True)
        self.thread.start()

    def _run(self, pipe):
        for raw in iter(pipe.readline, b""):
            line = raw.decode("utf-8", errors="replace").rstrip("\n")
            with self.cond:
                self.lines.append(line)
                self.cond.notify_all()
        with self.cond:
            self.eof = True
            self.cond.notify_all()

    def wait_for(self, pattern, timeout, start=0):
        """First match of regex pattern in lines[start:], waiting up to timeout; None if none."""
        rx = re.compile(pattern)
        deadline = time.monotonic() + timeout
        seen = start
        with self.cond:
            while True:
                while seen < len(self.lines):
                    m = rx.search(self.lines[seen])
                    seen += 1
                    if m:
                        return m
                remaining = deadline - time.monotonic()
                if self.eof or remaining <= 0:
                    return None
                self.cond.wait(remaining)

    def text(self):
        with self.cond:
            return "\n".join(self.lines)


class FakeReplica:
    """tests/fakes/grpc_replica.py in a subprocess, plus a channel to it for control calls."""

    def __init__(self, name, host=THIS_NODE, extra_args=()):
        self.name = name
        self.host = host
        self.proc = subprocess.Popen([PYTHON, FAKE, "--host", host, "--name", name] + list(extra_args),
                                     stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                                     stderr=subprocess.STDOUT)
        try:
            self.out = LineReader(self.proc.stdout)
            m = self.out.wait_for(r"^PORT (\d+)$", START_TIMEOUT)
            if not m:
                raise RuntimeError("fake replica %s did not start: %s" % (name, self.out.text()))
            self.port = int(m.group(1))
            self.channel = channel(host, self.port)
        except BaseException:
            self.stop()
            raise

    @property
    def key(self):
        return "%s:%d" % (self.host, self.port)

    def control(self, method, obj=None, timeout=30.0):
        call = self.channel.unary_unary("/test.Control/" + method)
        return jload(call(jdump(obj or {}), timeout=timeout))

    def wait_started(self, call_id, timeout=10.0):
        return self.control("WaitStarted", {"id": call_id, "timeout": timeout}, timeout + 5)["started"]

    def wait_cancelled(self, call_id, timeout=10.0):
        return self.control("WaitCancelled", {"id": call_id, "timeout": timeout}, timeout + 5)["cancelled"]

    def release(self, call_id):
        return self.control("Release", {"id": call_id})

    def calls(self, method):
        return self.control("Stats")["calls"].get(method, 0)

    def peers(self):
        """The distinct connections that made test.Echo calls."""
        return self.control("Stats")["peers"]

    def kill(self):
        """Abrupt death (SIGKILL): connections reset, no goodbye."""
        if self.proc.poll() is None:
            self.proc.kill()
            self.proc.wait(10)

    def stop(self):
        ch = getattr(self, "channel", None)
        if ch is not None:
            ch.close()
        stop_process(self.proc)


def stop_process(proc):
    """Ends a fake's process (SIGTERM, SIGKILL after 10 s) and closes its pipes."""
    if proc.poll() is None:
        proc.terminate()
        try:
            proc.wait(10)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait(10)
    for pipe in (proc.stdin, proc.stdout):
        try:
            pipe.close()
        except OSError:
            pass


def target(replica, name=None, instance_id="n1"):
    return {"ip": replica.host, "port": replica.port, "instance_id": instance_id,
            "name": name or ("SERVE_REPLICA::%s" % replica.name)}


def group(app, targets, protocol="gRPC", route_prefix=None):
    return {"app_name": app, "route_prefix": route_prefix or "/" + app, "protocol": protocol,
            "targets": targets}


def topology(*groups):
    return {"target_groups": list(groups), "fallback_targets": {}}


# HTTP apps (the WebSocket and LLM suites): no drain wait, and replicas checked often only while
# they change state, so that a test's own traffic is all a replica sees once it is up.
HTTP_APP_CONFIG = """\
drain:
  min_period: 0s
  timeout: 5s
health:
  interval: 60s
  fast_interval: 100ms
  fall: 2
  rise: 1
"""


def read_all(sock, timeout=20):
    """Everything a raw socket receives until the peer closes it."""
    sock.settimeout(timeout)
    data = b""
    while True:
        chunk = sock.recv(65536)
        if not chunk:
            return data
        data += chunk


DEFAULT_CONFIG = """\
drain:
  min_period: 0s
  timeout: 5s
"""


class Ingressd:
    """The daemon under test with a topology file, a config file and its output read in a thread."""

    LISTEN_RX = (r"listening on 127\.0\.0\.2:(\d+) \(admin 127\.0\.0\.2:(\d+)\)"
                 r".*, grpc 127\.0\.0\.2:(\d+)")

    def __init__(self, topo, config=DEFAULT_CONFIG, access_log=False, extra_args=()):
        self.dir = tempfile.TemporaryDirectory(prefix="ingressd-grpc-test-")
        self.topology_path = os.path.join(self.dir.name, "topology.json")
        self.config_path = os.path.join(self.dir.name, "ingressd.yaml")
        self.access_log_path = os.path.join(self.dir.name, "access.log") if access_log else None
        self.write_topology(topo)
        with open(self.config_path, "w") as f:
            f.write(config)
        args = [INGRESSD, "--config", self.config_path, "--topology-file", self.topology_path,
                "--listen", THIS_NODE + ":0", "--admin-listen", THIS_NODE + ":0",
                "--grpc-listen", THIS_NODE + ":0", "--node-ip", THIS_NODE, "--threads", "1"]
        if self.access_log_path:
            args += ["--access-log", self.access_log_path]
        args += list(extra_args)
        self.proc = subprocess.Popen(args, stdin=subprocess.DEVNULL, stdout=subprocess.PIPE,
                                     stderr=subprocess.STDOUT)
        self.channels = []
        try:
            self.out = LineReader(self.proc.stdout)
            m = self.out.wait_for(self.LISTEN_RX, START_TIMEOUT)
            if not m:
                raise RuntimeError("ingressd did not report its gRPC listener (exit %s):\n%s"
                                   % (self.proc.poll(), self.out.text()))
            self.port, self.admin_port, self.grpc_port = (int(g) for g in m.groups())
        except BaseException:
            self.stop()
            raise

    def write_topology(self, topo):
        tmp = self.topology_path + ".tmp"
        with open(tmp, "w") as f:
            json.dump(topo, f)
        os.replace(tmp, self.topology_path)

    def channel(self, options=()):
        ch = channel(THIS_NODE, self.grpc_port, options)
        self.channels.append(ch)
        return ch

    # --- admin ---------------------------------------------------------------------------------
    def admin_get(self, path, timeout=5.0):
        conn = http.client.HTTPConnection(THIS_NODE, self.admin_port, timeout=timeout)
        try:
            conn.request("GET", path)
            resp = conn.getresponse()
            return resp.status, resp.read().decode("utf-8", errors="replace")
        finally:
            conn.close()

    def topology(self):
        status, body = self.admin_get("/topology")
        if status != 200:
            raise AssertionError("GET /topology: %d %s" % (status, body[:500]))
        return json.loads(body)

    def grpc_apps(self):
        return {app["name"]: app for app in self.topology().get("grpc_apps", [])}

    def metrics(self):
        status, body = self.admin_get("/metrics")
        if status != 200:
            raise AssertionError("GET /metrics: %d %s" % (status, body[:500]))
        return body

    def wait_until(self, what, predicate, timeout=15.0):
        """Polls predicate() (an endpoint's state) until true or the deadline; returns last value.

        Polling an endpoint for a state with a deadline, not sleeping as synchronisation: each
        round is one HTTP request; the short pause between rounds only bounds the request rate.
        """
        deadline = time.monotonic() + timeout
        last = None
        while True:
            try:
                last = predicate()
            except (OSError, http.client.HTTPException) as e:
                raise AssertionError("admin endpoint failed (%r) while waiting for %s; %s"
                                     % (e, what, self.describe())) from e
            if last:
                return last
            if time.monotonic() >= deadline:
                raise AssertionError("timed out after %.0fs waiting for %s; %s"
                                     % (timeout, what, self.describe()))
            time.sleep(0.05)

    def describe(self):
        """Exit status and the end of the daemon's output, for failure messages."""
        tail = "\n".join(self.out.text().splitlines()[-15:])
        return "ingressd %s; last output:\n%s" % (
            "running" if self.proc.poll() is None else "exited with %s" % self.proc.poll(), tail)

    def wait_http_app(self, name, replicas):
        """Waits until /topology lists the HTTP app `name` with `replicas` replicas, all up."""
        def ready():
            apps = {a["name"]: a for a in self.topology().get("apps", [])}
            listed = apps.get(name, {}).get("replicas", [])
            return len(listed) == replicas and all(replica_up(r) for r in listed)
        self.wait_until("the %s app's %d replicas up" % (name, replicas), ready)

    def wait_grpc_apps(self, expected, up=None, timeout=15.0, need_listing=False):
        """Waits until /topology lists the gRPC apps {name: [replica keys]} (and, when up is a set
        of keys, those replicas are up)."""
        def ok():
            topo = self.topology()
            if "grpc_apps" not in topo and not need_listing:
                # /topology without grpc_apps (a daemon before that part of the contract): ready
                # once the topology is loaded; test_topology_grpc_apps reports the missing listing.
                return bool(topo.get("loaded"))
            apps = {app["name"]: app for app in topo.get("grpc_apps", [])}
            for name, keys in expected.items():
                app = apps.get(name)
                if app is None:
                    return False
                have = {replica_key(r): r for r in app.get("replicas", [])}
                if set(have) != set(keys):
                    return False
                for key in (up or ()):
                    if key in have and not replica_up(have[key]):
                        return False
            return apps
        got = self.wait_until("grpc_apps %s (up %s)" % (expected, sorted(up or ())), ok, timeout)
        return got if isinstance(got, dict) else {}

    # --- process -------------------------------------------------------------------------------
    def signal(self, sig):
        self.proc.send_signal(sig)

    def wait_exit(self, timeout):
        return self.proc.wait(timeout)

    def stop(self):
        for ch in self.channels:
            ch.close()
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGKILL)
            self.proc.wait(10)
        try:
            self.proc.stdout.close()
        except OSError:
            pass
        self.dir.cleanup()


def replica_key(entry):
    """A /topology replica entry's address. The brief said "key"; the daemon (like its HTTP app
    entries) says "address": either is accepted."""
    return entry.get("key", entry.get("address"))


def replica_up(entry):
    """True when a /topology replica entry is up: "up": true (brief) or "health": "up" (daemon,
    like its HTTP app entries)."""
    if "up" in entry:
        return entry["up"] is True
    return entry.get("health") == "up"


def metric_value(text, name, labels=None):
    """Value of the sample name{labels} (exact label set) in Prometheus text, or None."""
    want = dict(labels or {})
    for line in text.splitlines():
        if not line or line.startswith("#"):
            continue
        m = re.match(r"^([a-zA-Z_:][a-zA-Z0-9_:]*)(?:\{(.*)\})?\s+(\S+)", line)
        if not m or m.group(1) != name:
            continue
        have = dict(re.findall(r'([a-zA-Z_][a-zA-Z0-9_]*)="((?:[^"\\]|\\.)*)"', m.group(2) or ""))
        if have == want:
            return float(m.group(3))
    return None


def run_suite(argv=None):
    """The suites' entry point: `--ingressd PATH` (default INGRESSD) picks the binary, the other
    arguments go to unittest. Exit code 0 when every test passed, 1 otherwise, 2 without a binary."""
    import argparse
    import unittest
    parser = argparse.ArgumentParser(add_help=False)
    parser.add_argument("--ingressd", default=None)
    args, rest = parser.parse_known_args(argv)
    global INGRESSD
    INGRESSD = os.path.abspath(args.ingressd or INGRESSD)
    if not os.access(INGRESSD, os.X_OK):
        print("ingressd binary not found or not executable: %s" % INGRESSD, file=sys.stderr)
        return 2
    prog = unittest.main(module="__main__", argv=[sys.argv[0]] + rest, exit=False)
    return 0 if prog.result.wasSuccessful() else 1


# Health checks far apart: a test about connection failures or abusive clients sees what the call
# path does, not what a health check concluded first.
HEALTH_SLOW_CONFIG = """\
drain:
  min_period: 0s
  timeout: 5s
health:
  interval: 60s
  fast_interval: 60s
  fall: 2
  rise: 1
"""
