"""Shared by the operator kit's checks (tests/contrib, tests/packaging/logrotate_test.py): a demo
ingressd run as a child process, the Prometheus text format, and a PromQL reader that lists the
metric and label names an expression uses. Standard library, plus PyYAML (Debian: python3-yaml)
for load_yaml only."""
import http.client
import json
import os
import re
import selectors
import shutil
import socket
import subprocess
import sys
import tempfile
import time

# Labels Prometheus itself puts on every series it scrapes: not in /metrics, but on every sample.
TARGET_LABELS = {"instance", "job"}


def load_yaml(path):
    try:
        import yaml
    except ImportError:
        # A Python of its own (pyenv, a venv) does not see Debian's python3-yaml: run the same
        # script with the system's Python, once.
        if sys.executable != "/usr/bin/python3" and os.path.exists("/usr/bin/python3") \
                and not os.environ.get("INGRESSD_KIT_REEXEC"):
            os.environ["INGRESSD_KIT_REEXEC"] = "1"
            os.execv("/usr/bin/python3", ["/usr/bin/python3"] + sys.argv)
        raise SystemExit("FAIL: PyYAML is not installed (Debian: python3-yaml)")
    with open(path, encoding="utf-8") as f:
        return yaml.safe_load(f)


# --- a running daemon ------------------------------------------------------------------------

class Daemon:
    """An ingressd child process on loopback, stopped (SIGTERM, then SIGKILL) when the context
    ends, whatever happened. `port` and `admin_port` are set by the subclasses."""

    def __init__(self, argv):
        self.log = tempfile.NamedTemporaryFile(prefix="ingressd-test-", suffix=".log", delete=False)
        self.proc = subprocess.Popen(argv, stdin=subprocess.DEVNULL, stdout=subprocess.PIPE, stderr=self.log)
        self.port = self.admin_port = None

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()

    def close(self):
        if self.log.closed:
            return
        if self.proc.poll() is None:
            self.proc.terminate()  # a drain: the tests set drain.min_period to 0
            try:
                self.proc.wait(timeout=10)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()
        self.proc.stdout.close()
        self.log.close()
        os.unlink(self.log.name)

    def output(self):
        with open(self.log.name, encoding="utf-8", errors="replace") as f:
            return f.read()

    def request(self, method, path, body=None, headers=None, admin=False):
        conn = http.client.HTTPConnection("127.0.0.1", self.admin_port if admin else self.port, timeout=10)
        try:
            conn.request(method, path, body=body, headers=headers or {})
            r = conn.getresponse()
            return r.status, r.read().decode()
        finally:
            conn.close()

    def metrics(self):
        status, body = self.request("GET", "/metrics", admin=True)
        if status != 200:
            raise SystemExit(f"FAIL: /metrics answered {status}")
        return body

    def topology(self):
        status, body = self.request("GET", "/topology", admin=True)
        if status != 200:
            raise SystemExit(f"FAIL: /topology answered {status}")
        return json.loads(body)


class Demo(Daemon):
    """`ingressd --demo` (its demo cluster of routers and replicas) on ports the kernel picks; the
    ports come from the demo's own printout, which it prints once its listeners are bound."""

    def __init__(self, binary, *extra_args, timeout=15):
        super().__init__([binary, "--demo", "--listen", "127.0.0.1:0", "--admin-listen", "127.0.0.1:0",
                          "--threads", "2", *extra_args])
        printed = b""
        deadline = time.monotonic() + timeout
        with selectors.DefaultSelector() as sel:
            sel.register(self.proc.stdout, selectors.EVENT_READ)
            while b"Ctrl-C" not in printed:
                left = deadline - time.monotonic()
                chunk = os.read(self.proc.stdout.fileno(), 65536) if left > 0 and sel.select(left) else b""
                if not chunk:
                    out = self.output()
                    self.close()
                    raise SystemExit(f"FAIL: ingressd --demo printed no ports in {timeout}s: {printed!r}\n{out}")
                printed += chunk
        text = printed.decode()
        port = re.search(r"http://127\.0\.0\.1:(\d+)/v1/models", text)
        admin = re.search(r"http://127\.0\.0\.1:(\d+)/metrics", text)
        if not port or not admin:
            self.close()
            raise SystemExit(f"FAIL: no ports in the demo's printout: {text}")
        self.port, self.admin_port = int(port.group(1)), int(admin.group(1))


class FileDaemon(Daemon):
    """ingressd with a topology file (a real, polling topology source) on ports the kernel picks,
    read back from its startup line (ports picked in advance could be taken by a test running
    beside this one); returns once both listeners accept."""

    LISTENING = re.compile(r"listening on 127\.0\.0\.1:(\d+) \(admin 127\.0\.0\.1:(\d+)\)")

    def __init__(self, binary, topology_file, *extra_args, timeout=15):
        self.dir = tempfile.mkdtemp(prefix="ingressd-test-")
        config = os.path.join(self.dir, "ingressd.yaml")
        with open(config, "w", encoding="utf-8") as f:
            f.write("drain:\n  min_period: 0s\n  timeout: 5s\n")
        super().__init__([binary, "--config", config, "--topology-file", topology_file,
                          "--listen", "127.0.0.1:0", "--admin-listen", "127.0.0.1:0",
                          "--threads", "2", "--node-ip", "127.0.0.1", *extra_args])
        try:
            wait_until(lambda: self.proc.poll() is not None or self.LISTENING.search(self.output()), timeout,
                       "the startup line")
        except SystemExit:
            self.close()
            raise
        found = self.LISTENING.search(self.output())
        if self.proc.poll() is not None or not found:
            out = self.output()
            self.close()
            raise SystemExit(f"FAIL: ingressd exited {self.proc.returncode} or printed no ports:\n{out}")
        self.port, self.admin_port = int(found.group(1)), int(found.group(2))
        for p in (self.port, self.admin_port):
            try:
                wait_until(lambda: accepts(p), timeout, f"port {p} to accept")
            except SystemExit:
                self.close()
                raise

    def close(self):
        super().close()
        shutil.rmtree(self.dir, ignore_errors=True)


def accepts(port):
    with socket.socket() as s:
        s.settimeout(0.2)
        return s.connect_ex(("127.0.0.1", port)) == 0


def ray_topology(dump):
    """The topology document (Ray's target_groups shape) of a /topology dump: the same apps,
    routers and replicas, for a second ingressd to read from a file."""
    def target(t):
        ip, port = t["address"].rsplit(":", 1)
        return {"ip": ip, "port": int(port), "instance_id": t["name"], "name": t["name"]}
    return {"target_groups": [
        {"app_name": a["name"], "route_prefix": a["route_prefix"], "protocol": "HTTP",
         "targets": [target(r) for r in a["replicas"]],
         "ingress_request_router_targets": [target(r) for r in a["router_pool"]]}
        for a in dump["apps"]]}


def wait_until(pred, timeout, what):
    """Polls pred() until it holds; fails after `timeout` seconds. For conditions that have no
    event to wait on (a file another process writes)."""
    deadline = time.monotonic() + timeout
    while not pred():
        if time.monotonic() > deadline:
            raise SystemExit(f"FAIL: {what} (waited {timeout}s)")
        time.sleep(0.01)


# --- Prometheus text format ------------------------------------------------------------------

SAMPLE = re.compile(r'^([a-zA-Z_:][a-zA-Z0-9_:]*)(?:\{(.*)\})?\s+(\S+)$')
LABEL = re.compile(r'([a-zA-Z_][a-zA-Z0-9_]*)="((?:[^"\\]|\\.)*)"')


def parse_exposition(text):
    """{sample name: {label name: set of values}} and {family: type} of a /metrics body."""
    series, types = {}, {}
    for line in text.splitlines():
        if line.startswith("# TYPE "):
            _, _, name, kind = line.split(" ", 3)
            types[name] = kind
            continue
        if not line or line.startswith("#"):
            continue
        m = SAMPLE.match(line)
        if not m:
            raise SystemExit(f"FAIL: not a sample line: {line!r}")
        labels = series.setdefault(m.group(1), {})
        for name, value in LABEL.findall(m.group(2) or ""):
            labels.setdefault(name, set()).add(value)
    return series, types


# --- PromQL ----------------------------------------------------------------------------------

TOKEN = re.compile(r'''
    (?P<space>\s+)
  | (?P<string>"(?:[^"\\]|\\.)*"|'(?:[^'\\]|\\.)*'|`[^`]*`)
  | (?P<range>\[[^\]]*\])
  | (?P<number>0x[0-9a-fA-F]+|(?:\d+\.?\d*|\.\d+)(?:[eE][+-]?\d+)?)
  | (?P<ident>[a-zA-Z_:][a-zA-Z0-9_:]*)
  | (?P<op>=~|!~|!=|==|<=|>=|[-+*/%^<>=(){},])
''', re.X)
LABEL_LISTS = {"by", "without", "on", "ignoring", "group_left", "group_right"}
WORDS = {"and", "or", "unless", "bool", "inf", "nan"}
GRAFANA_RANGES = ("$__rate_interval", "$__interval", "$__range")


class Selector:
    def __init__(self, metric):
        self.metric = metric
        self.matchers = []  # (label, operator, value)


class Expression:
    """What an expression uses: `selectors` (metric name and label matchers) and `grouping`
    (label names in by/without/on/ignoring/group_left/group_right lists). Raises ValueError on
    syntax it does not know, so that a query it cannot read fails the check instead of passing."""

    def __init__(self, text):
        self.text = text
        for variable in GRAFANA_RANGES:
            text = text.replace(variable, "5m")
        tokens = []
        pos = 0
        while pos < len(text):
            m = TOKEN.match(text, pos)
            if not m:
                raise ValueError(f"cannot read {text[pos:pos + 20]!r} in {self.text!r}")
            pos = m.end()
            if m.lastgroup != "space":
                tokens.append((m.lastgroup, m.group()))
        self.selectors, self.grouping = [], set()
        i = 0
        while i < len(tokens):
            kind, value = tokens[i]
            following = tokens[i + 1][1] if i + 1 < len(tokens) else None
            if kind == "range" and "$" in value:
                raise ValueError(f"unknown variable in {value!r}")
            if kind != "ident":
                if value == "{":
                    raise ValueError(f"a selector without a metric name in {self.text!r}")
                i += 1
                continue
            if value in LABEL_LISTS:
                i += 1
                if i < len(tokens) and tokens[i][1] == "(":
                    i += 1
                    while tokens[i][1] != ")":
                        if tokens[i][0] == "ident":
                            self.grouping.add(tokens[i][1])
                        i += 1
                i += 1
                continue
            if value in WORDS or following in ("(", "by", "without"):
                i += 1  # an operator word, a function, or an aggregation (`sum by (x) (...)`)
                continue
            if value == "offset" or following == "@":
                raise ValueError(f"offset and @ are not supported here: {self.text!r}")
            sel = Selector(value)
            self.selectors.append(sel)
            i += 1
            if following == "{":
                i += 1
                while tokens[i][1] != "}":
                    if tokens[i][1] == ",":
                        i += 1
                        continue
                    (k1, label), (_, operator), (k3, quoted) = tokens[i:i + 3]
                    if k1 != "ident" or k3 != "string":
                        raise ValueError(f"cannot read the matchers of {value} in {self.text!r}")
                    sel.matchers.append((label, operator, quoted[1:-1]))
                    i += 3
                i += 1

    def metrics(self):
        return {s.metric for s in self.selectors}
