#!/usr/bin/env python3
"""ctest contrib.dashboard_metrics: the Grafana dashboard and the Prometheus rules query only what
a running ingressd exports.

    dashboard_metrics_test.py DASHBOARD_JSON RULES_YML OPERATIONS_MD INGRESSD_BINARY

Starts `ingressd --demo` on loopback for its cluster of routers and replicas, and a second ingressd
that reads the same cluster from a topology file (a real topology source), with HTTPS and gRPC
listeners; sends it requests on the router path (a JSON reply with a usage object and an event
stream) and the plain path, and one gRPC call, so that labelled series exist (the LLM and gRPC
families among them), scrapes its /metrics, and checks every query of every dashboard panel and
variable and every recording and alerting rule: each metric name is exported (histograms by their
_bucket/_sum/_count samples) or recorded by the rules file; each label a selector matches is one
that metric carries (or `instance`/`job`, which Prometheus adds; a recorded metric carries the
labels its rule sums by); each literal value it matches with `=` occurs in the scrape; each label
in a by/without/on/ignoring list belongs to one of the expression's metrics. Also checks the
dashboard's own shape (data source variable, a node variable every panel query filters by,
unique ids, a description per panel, a non-overlapping grid), that every recording rule is used,
and that docs/operations.md describes every panel by its title."""
import http.client
import json
import os
import re
import socket
import ssl
import subprocess
import sys
import tempfile

sys.dont_write_bytecode = True  # no __pycache__ in the source tree
sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
# The gRPC tests' raw HTTP/2 client (standard library only): one call without grpcio.
sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), os.pardir, "grpc"))
import h2raw  # noqa: E402
import kit  # noqa: E402

problems = []


def fail(message):
    problems.append(message)


def dashboard_shape(dash):
    for key in ("title", "uid", "schemaVersion", "panels", "templating"):
        if key not in dash:
            fail(f"dashboard: no {key!r}")
    variables = {v["name"]: v for v in dash.get("templating", {}).get("list", [])}
    ds = variables.get("datasource")
    if not ds or ds.get("type") != "datasource" or ds.get("query") != "prometheus":
        fail("dashboard: needs a `datasource` variable of type datasource, query prometheus")
    if "instance" not in variables or not variables["instance"].get("multi"):
        fail("dashboard: needs a multi-value `instance` variable (the node)")
    ids, cells = set(), {}
    panels = [p for p in dash.get("panels", []) if p.get("type") != "row"]
    for p in dash.get("panels", []):
        where = f"panel {p.get('title')!r}"
        if p.get("id") in ids:
            fail(f"{where}: id {p.get('id')} is used twice")
        ids.add(p.get("id"))
        g = p.get("gridPos", {})
        if g.get("x", 0) + g.get("w", 0) > 24 or g.get("w", 0) <= 0 or g.get("h", 0) <= 0:
            fail(f"{where}: gridPos {g} is outside the 24-column grid")
        for x in range(g.get("x", 0), g.get("x", 0) + g.get("w", 0)):
            for y in range(g.get("y", 0), g.get("y", 0) + g.get("h", 0)):
                if (x, y) in cells:
                    fail(f"{where}: overlaps panel {cells[(x, y)]!r}")
                    break
                cells[(x, y)] = p.get("title")
    for p in panels:
        where = f"panel {p.get('title')!r}"
        if p.get("datasource", {}).get("uid") != "${datasource}":
            fail(f"{where}: data source must be ${{datasource}}")
        if not p.get("description"):
            fail(f"{where}: no description")
        refs = [t.get("refId") for t in p.get("targets", [])]
        if not refs or len(set(refs)) != len(refs) or not all(t.get("expr") for t in p.get("targets", [])):
            fail(f"{where}: needs targets with an expr and a unique refId each")
    return panels, variables


def recorded_labels(rules):
    """{recorded metric: (the labels its `sum by (...)` keeps, the metric it sums)}."""
    out = {}
    for group in rules["groups"]:
        for rule in group["rules"]:
            if "record" not in rule:
                continue
            m = re.match(r"^\s*sum by \(([^)]*)\)", rule["expr"])
            if not m:
                fail(f"recording rule {rule['record']}: must be `sum by (...) (...)`, so its labels are known")
                continue
            sources = kit.Expression(rule["expr"]).metrics()
            if len(sources) != 1:
                fail(f"recording rule {rule['record']}: must sum one metric, not {sorted(sources)}")
                continue
            out[rule["record"]] = ({label.strip() for label in m.group(1).split(",")}, sources.pop())
    return out


def check_expression(where, text, exported, recorded, extra_labels=()):
    try:
        e = kit.Expression(text)
    except ValueError as err:
        fail(f"{where}: {err}")
        return None
    known_here = set(kit.TARGET_LABELS) | set(extra_labels)
    for sel in e.selectors:
        if sel.metric in recorded:
            labels, source = recorded[sel.metric]
            values = exported.get(source)  # a sum keeps the values it groups by
        elif sel.metric in exported:
            labels, values = set(exported[sel.metric]) | kit.TARGET_LABELS, exported[sel.metric]
        else:
            fail(f"{where}: metric {sel.metric} is not in /metrics nor recorded by the rules")
            continue
        known_here |= labels
        for label, operator, value in sel.matchers:
            if label not in labels:
                fail(f"{where}: {sel.metric} has no label {label!r} (it has {sorted(labels)})")
            elif operator == "=" and values is not None and label in values and "$" not in value \
                    and value not in values[label]:
                fail(f"{where}: {sel.metric}{{{label}=\"{value}\"}}: /metrics has only {sorted(values[label])}")
    for label in sorted(e.grouping - known_here):
        fail(f"{where}: groups by {label!r}, which none of its metrics carries")
    return e


def closed_port():
    """A loopback port nothing listens on (bound, then closed)."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def grpc_call(port):
    """One unary gRPC call over h2c; the frame that ended its stream, or None. The server's
    HPACK is not decoded: the scrape says how the call ended."""
    with h2raw.Conn("127.0.0.1", port) as conn:
        conn.start()
        conn.send(h2raw.headers(1, h2raw.grpc_request_block("/ingressd.test.Echo/Call")))
        conn.send(h2raw.data(1, h2raw.grpc_message(b""), end_stream=True))
        return conn.read_until(lambda f: f.sid == 1 and f.type in (h2raw.HEADERS, h2raw.DATA)
                               and f.flags & h2raw.END_STREAM, on_frame=h2raw.auto_ack(conn))


def main():
    dashboard_path, rules_path, operations_path, binary = sys.argv[1:5]
    with open(dashboard_path, encoding="utf-8") as f:
        dash = json.load(f)
    rules = kit.load_yaml(rules_path)
    panels, variables = dashboard_shape(dash)
    recorded = recorded_labels(rules)

    # The demo's cluster (routers on this node and on "another", replicas) behind a second
    # ingressd that reads it from a topology file: a real topology source, as in production.
    with kit.Demo(binary) as cluster, tempfile.TemporaryDirectory() as tmp:
        topology_file = os.path.join(tmp, "topology.json")
        # Plus a gRPC app, for the ingressd_grpc_* families (they exist only with grpc.listen, and
        # their app and grpc_status labels only once the topology has a gRPC app or a call was
        # counted). Its one target refuses connections: the call below ends UNAVAILABLE, an
        # error status, without a gRPC replica in the test.
        topology = kit.ray_topology(cluster.topology())
        topology["target_groups"].append(
            {"app_name": "grpc", "route_prefix": "/grpc", "protocol": "gRPC",
             "targets": [{"ip": "127.0.0.1", "port": closed_port(), "instance_id": "n1", "name": "grpc-1"}]})
        with open(topology_file, "w", encoding="utf-8") as f:
            json.dump(topology, f)
        # With an HTTPS listener too, so that the ingressd_tls_* families are exported, and one
        # request over it from Python's own TLS client.
        cert, key = os.path.join(tmp, "cert.pem"), os.path.join(tmp, "key.pem")
        subprocess.run(["openssl", "req", "-x509", "-newkey", "ec", "-pkeyopt", "ec_paramgen_curve:P-256", "-nodes",
                        "-keyout", key, "-out", cert, "-days", "2", "-subj", "/CN=localhost",
                        "-addext", "subjectAltName=DNS:localhost,IP:127.0.0.1"], check=True, capture_output=True)
        with kit.FileDaemon(binary, topology_file, "--tls-listen", "127.0.0.1:0", "--tls-cert", cert,
                            "--tls-key", key, "--grpc-listen", "127.0.0.1:0") as proxy:
            https_port = re.search(r", https 127\.0\.0\.1:(\d+)", proxy.output())
            if not https_port:
                raise SystemExit(f"FAIL: no https port in the startup line: {proxy.output()}")
            conn = http.client.HTTPSConnection("127.0.0.1", int(https_port.group(1)), timeout=10,
                                               context=ssl.create_default_context(cafile=cert))
            conn.request("GET", "/v1/models")
            if conn.getresponse().status != 200:
                raise SystemExit(f"FAIL: GET /v1/models over TLS did not answer 200\n{proxy.output()}")
            conn.close()
            # The router path (a POST, streamed and not), the plain path and the echo app. The
            # ingressd_llm_* families exist only for apps that relayed an event stream or a usage
            # object: the demo's replicas answer the streamed POST with text/event-stream, events
            # 20 ms apart (separate reads, so inter-event gaps too), and the other with a JSON
            # chat.completion that carries usage (prompt and completion tokens). No replica of the
            # test's own is needed: should the demo stop doing so, the wait for the tokens and the
            # `needed` samples below fail the test rather than let the LLM panels go unchecked.
            for body in ('{"stream":false}', '{"stream":true}'):
                status, _ = proxy.request("POST", "/v1/chat/completions", body, {"content-type": "application/json"})
                if status != 200:
                    raise SystemExit(f"FAIL: POST /v1/chat/completions answered {status}\n{proxy.output()}")
            for path in ("/v1/models", "/echo/hello"):
                status, _ = proxy.request("GET", path)
                if status != 200:
                    raise SystemExit(f"FAIL: GET {path} answered {status}\n{proxy.output()}")
            grpc_port = re.search(r", grpc 127\.0\.0\.1:(\d+)", proxy.output())
            if not grpc_port:
                raise SystemExit(f"FAIL: no grpc port in the startup line: {proxy.output()}")
            if grpc_call(int(grpc_port.group(1))) is None:
                raise SystemExit(f"FAIL: the gRPC call got no end of stream\n{proxy.output()}")
            # Nothing orders the call's count before the frame the client read (the worker counts
            # it as it closes the stream): wait for the count rather than scrape once.
            counted = re.compile(r'^ingressd_grpc_request_duration_seconds_count\{app="grpc"\} 1$', re.M)
            kit.wait_until(lambda: counted.search(proxy.metrics()), 10, "the gRPC call in /metrics")
            # Tokens are counted as the relay ends, after the last byte went to the client: wait
            # for them too.
            tokens = re.compile(r'^ingressd_llm_tokens_total\{app="llm",kind="completion"\} [1-9]', re.M)
            kit.wait_until(lambda: tokens.search(proxy.metrics()), 10, "the JSON reply's usage tokens in /metrics")
            scrape = proxy.metrics()
    exported, types = kit.parse_exposition(scrape)
    for needed in ("ingressd_router_attempts_total", "ingressd_replica_in_flight", "process_open_fds",
                   "ingressd_grpc_requests_total", "ingressd_grpc_connection_errors_total",
                   "ingressd_llm_ttft_seconds_bucket", "ingressd_llm_inter_event_seconds_bucket",
                   "ingressd_llm_events_total", "ingressd_llm_tokens_total"):
        if needed not in exported:
            fail(f"the scrape has no {needed} sample after the requests: {sorted(exported)}")
    if subprocess.run(["sh", "-c", "command -v promtool"], capture_output=True).returncode == 0:
        lint = subprocess.run(["promtool", "check", "metrics"], input=scrape, capture_output=True, text=True)
        # Ray's own series (metrics.ray_compatible) keep Ray's names, `_ms` units included: Ray's
        # dashboard queries them by those names. Every other lint still fails the test.
        problems_left = [l for l in (lint.stdout + lint.stderr).splitlines()
                         if l.strip() and not l.startswith("ray_serve_")]
        if lint.returncode != 0 and problems_left:
            fail(f"promtool check metrics on the scrape: {lint.stdout}{lint.stderr}")

    used = set()
    queries = 0
    for p in panels:
        for t in p.get("targets", []):
            where = f"panel {p['title']!r} {t.get('refId')}"
            e = check_expression(where, t["expr"], exported, recorded)
            queries += 1
            if e is None:
                continue
            used |= e.metrics()
            for sel in e.selectors:
                if ("instance", "=~", "$instance") not in sel.matchers:
                    fail(f"{where}: {sel.metric} is not filtered by instance=~\"$instance\"")
    for name, v in variables.items():
        if v.get("type") != "query":
            continue
        m = re.match(r"^label_values\((.*),\s*([a-zA-Z_][a-zA-Z0-9_]*)\)$", v["query"])
        if not m:
            fail(f"variable {name}: query must be label_values(selector, label): {v['query']!r}")
            continue
        e = check_expression(f"variable {name}", m.group(1), exported, recorded)
        queries += 1
        if e and not any(m.group(2) in set(exported.get(s.metric, {})) | kit.TARGET_LABELS for s in e.selectors):
            fail(f"variable {name}: {m.group(1)} has no label {m.group(2)!r}")
    rule_count = 0
    for group in rules["groups"]:
        for rule in group["rules"]:
            name = rule.get("record") or rule.get("alert")
            e = check_expression(f"rule {name}", rule["expr"], exported, recorded)
            rule_count += 1
            if e:
                used |= e.metrics()
    for name in sorted(set(recorded) - used):
        fail(f"recording rule {name} is used by no panel and no alert")

    with open(operations_path, encoding="utf-8") as f:
        docs = f.read()
    for p in panels:
        if f"**{p['title']}**" not in docs:
            fail(f"{operations_path} does not describe panel {p['title']!r} (as **{p['title']}**)")

    for p in problems:
        print("FAIL:", p)
    if problems:
        return 1
    print(f"OK: {len(panels)} panels, {queries} dashboard queries and {rule_count} rules use only the "
          f"{len(exported)} sample names and their labels that a running ingressd exports "
          f"({len(recorded)} recorded)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
