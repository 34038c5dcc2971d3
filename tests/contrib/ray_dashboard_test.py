#!/usr/bin/env python3
"""ctest contrib.ray_dashboard: Ray's own Serve Grafana dashboard shows ingressd's traffic, unchanged
(issue #28 item 5).

    ray_dashboard_test.py INGRESSD_BINARY [--cluster NAME]
    ray_dashboard_test.py --scrape SCRAPE.txt --traffic TRAFFIC.json [--baseline BASE.txt] [--cluster NAME]

The panels of Ray's Serve dashboard that read the request series of Serve's proxy are copied, with
Ray's file and commit, in tests/data/ray/serve_dashboard_panels.json. This check:

1. gets two scrapes of ingressd's /metrics and the traffic sent between them. With INGRESSD_BINARY
   it starts `ingressd --demo` (kit.Demo) for its replicas and a second ingressd that reads a
   topology file (apps echo at /echo, llm at /llm, down at /down with no replica; no app at /), scrapes
   it, sends known requests (GETs to echo, POSTs to llm, 503s from down, 404s that match no app,
   /-/healthz probes), waits for the counters and scrapes again. With --scrape it reads a scrape (and
   an optional --baseline, else zero) and the traffic it stands for from files;
2. checks the ray_serve_* families against Ray's definitions (names, types, HELP, label names, the
   latency buckets in ms) and the counts against the traffic: every label set counted as often as
   it was sent, errors (Ray's rule: HTTP 4xx/5xx, gRPC anything but OK) in the error counter and
   nothing else there, nothing counted that was not sent;
3. turns the two scrapes into a promtool unit test: each series grows linearly from its baseline
   value, by its increase each minute (instance/job added as Prometheus would, and ray_io_cluster
   with --cluster), so that rate() over Ray's [5m] equals increase/60 exactly;
4. builds each panel expression as Ray's generator does (str.format with the dashboard's
   global_filters) and as Grafana interpolates it (All -> allValue ".*"; chosen values
   regex-escaped, (a|b) for several), for several variable choices: everything; each application;
   two applications; one route; one gRPC method; an application that does not exist; with --cluster,
   that cluster and another. Each becomes a recording rule, and `promtool test rules` checks, at
   10m, that it returns exactly the label sets the traffic implies (application, route, method,
   error_code), each with the value the traffic implies: requests/60 per second for the QPS panels;
   for the latency panels, histogram_quantile of the traffic's latencies in Ray's buckets (file mode)
   or of the scraped buckets (live mode, where latencies are unknown); the gauge for the ongoing ones.

Standard library and promtool (Debian: prometheus). Exit 77 (ctest SKIP_RETURN_CODE) when promtool is
not installed."""
import argparse
import json
import math
import os
import re
import shutil
import subprocess
import sys
import tempfile

sys.dont_write_bytecode = True  # no __pycache__ in the source tree
HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)
import kit  # noqa: E402

PANELS = os.path.join(HERE, "..", "data", "ray", "serve_dashboard_panels.json")

# python/ray/serve/_private/constants.py DEFAULT_LATENCY_BUCKET_MS (REQUEST_LATENCY_BUCKETS_MS unless
# RAY_SERVE_REQUEST_LATENCY_BUCKETS_MS is set).
LATENCY_BUCKETS_MS = [1, 2, 5, 10, 20, 50, 100, 200, 300, 400, 500, 1000, 2000, 5000, 10000, 60000, 120000,
                      300000, 600000]
PROTOCOL_NAME = {"http": "HTTP", "grpc": "gRPC"}


def families(proto):
    """{family: (type, HELP, label names)} of one protocol, as Ray's proxy.py defines them."""
    p = PROTOCOL_NAME[proto]
    return {
        f"ray_serve_num_{proto}_requests_total": (
            "counter", f"The number of {p} requests processed.", {"route", "method", "application", "status_code"}),
        f"ray_serve_num_{proto}_error_requests_total": (
            "counter", f"The number of errored {p} responses.", {"route", "error_code", "method", "application"}),
        f"ray_serve_{proto}_request_latency_ms": (
            "histogram", f"The end-to-end latency of {p} requests (measured from the Serve {p} proxy).",
            {"method", "route", "application", "status_code"}),
        f"ray_serve_num_ongoing_{proto}_requests": (
            "gauge", f"The number of ongoing requests in this {p} proxy.", {"node_id", "node_ip_address"}),
    }


def is_error(proto, code):
    """proxy.py: an HTTP status starting with 4 or 5 (websocket close codes other than 1000/1001 too);
    a gRPC status other than StatusCode.OK."""
    if proto == "http":
        return code.startswith(("4", "5")) or (len(code) == 4 and code.startswith("1") and code not in ("1000", "1001"))
    return code != "StatusCode.OK"


problems = []


def fail(message):
    problems.append(message)


# --- scrapes -----------------------------------------------------------------------------------

def unescape(value):
    return re.sub(r'\\(.)', lambda m: "\n" if m.group(1) == "n" else m.group(1), value)


def parse(text):
    """({(sample name, ((label, value), ...)): value}, {family: type}, {family: help})."""
    samples, types, helps = {}, {}, {}
    for line in text.splitlines():
        if line.startswith("# TYPE "):
            _, _, name, kind = line.split(" ", 3)
            types[name] = kind.strip()
            continue
        if line.startswith("# HELP "):
            parts = line.split(" ", 3)
            helps[parts[2]] = unescape(parts[3]) if len(parts) > 3 else ""
            continue
        if not line.strip() or line.startswith("#"):
            continue
        m = kit.SAMPLE.match(line)
        if not m:
            raise SystemExit(f"FAIL: not a sample line: {line!r}")
        # A label whose value is "" is no label, for Prometheus and here.
        labels = tuple(sorted((k, unescape(v)) for k, v in kit.LABEL.findall(m.group(2) or "") if v))
        samples[(m.group(1), labels)] = float(m.group(3))
    return samples, types, helps


def increases(base, final, types):
    """{(name, labels): (baseline value, increase)} of every ray_serve_* sample of the final scrape;
    a gauge's increase is 0 and its "baseline" its final value."""
    out = {}
    for key, value in final.items():
        if not key[0].startswith("ray_serve_"):
            continue
        if types.get(family_of(key[0], types)) == "gauge":
            out[key] = (value, 0.0)
            continue
        before = base.get(key, 0.0)
        if value < before:
            fail(f"{key[0]}{dict(key[1])} went down between the scrapes ({before:g} -> {value:g})")
        out[key] = (before, max(value - before, 0.0))
    return out


def family_of(sample_name, types):
    for suffix in ("_bucket", "_count", "_sum"):
        if sample_name.endswith(suffix) and types.get(sample_name[:-len(suffix)]) == "histogram":
            return sample_name[:-len(suffix)]
    return sample_name


# --- step 2: the series against Ray's definitions and the traffic ------------------------------

def check_series(final, types, helps, delta, traffic, allowed_extra):
    protos = [p for p in ("http", "grpc") if traffic.get(p)]
    expected = {}
    for proto in ("http", "grpc"):
        expected.update(families(proto))
    for proto in protos:
        for fam, (kind, text, _) in families(proto).items():
            if fam not in types:
                fail(f"{fam}: no # TYPE line: the scrape lacks the family")
            elif types[fam] != kind:
                fail(f"{fam}: type {types[fam]}, Ray's is {kind}")
            if helps.get(fam) != text:
                fail(f"{fam}: HELP {helps.get(fam)!r}, Ray's is {text!r}")
    for (name, labels) in final:
        fam = family_of(name, types)
        if not fam.startswith("ray_serve_"):
            continue
        if fam not in expected:
            continue  # a family Ray has that this check does not cover (e.g. the per-deployment errors)
        names = {k for k, _ in labels} - {"le"} - set(allowed_extra)
        if not names <= expected[fam][2]:  # a missing one is "" (no app matched, probes)
            fail(f"{name}{dict(labels)}: labels {sorted(names)}, Ray's are {sorted(expected[fam][2])}")
        if name.endswith("_bucket"):
            le = dict(labels).get("le")
            bounds = [float(b) for b in LATENCY_BUCKETS_MS] + [math.inf]
            try:
                if float(le.replace("+Inf", "inf")) not in bounds:
                    fail(f"{name}: le={le!r} is not one of Ray's bounds {LATENCY_BUCKETS_MS} ms or +Inf")
            except (AttributeError, ValueError):
                fail(f"{name}: le={le!r} is not a number")
    # Every histogram label set has every bound.
    seen = {}
    for (name, labels) in final:
        if name.endswith("_latency_ms_bucket"):
            rest = tuple(kv for kv in labels if kv[0] != "le")
            seen.setdefault((name, rest), set()).add(float(dict(labels)["le"].replace("+Inf", "inf")))
    for (name, rest), les in seen.items():
        missing = {float(b) for b in LATENCY_BUCKETS_MS} | {math.inf}
        if les != missing:
            fail(f"{name}{dict(rest)}: bounds {sorted(les)}, Ray's are {LATENCY_BUCKETS_MS} and +Inf")

    for proto in protos:
        gauge = f"ray_serve_num_ongoing_{proto}_requests"
        values = [v for (name, _), v in final.items() if name == gauge]
        want = traffic.get("ongoing", {}).get(proto, 0)
        if not values:
            fail(f"{gauge}: no sample (Ray's proxy sets it at its first request)")
        elif sum(values) != want:
            fail(f"{gauge}: {sum(values):g} at the end, expected {want}")

    def key(labels):
        return tuple(sorted((k, v) for k, v in labels.items() if v))

    def grown(sample, labels):
        return delta.get((sample, key(labels)), (0.0, 0.0))[1]

    for proto in ("http", "grpc"):
        sent = {}
        for r in traffic.get(proto, []):
            base = {"application": r["application"], "route": r["route"], "method": r["method"],
                    "status_code": r["status_code"]}
            sent[key(base)] = r["count"]
            where = f"{proto} {base}"
            got = grown(f"ray_serve_num_{proto}_requests_total", base)
            if got != r["count"]:
                fail(f"{where}: ray_serve_num_{proto}_requests_total grew by {got:g}, {r['count']} were sent")
            err = dict(base, error_code=base["status_code"])
            del err["status_code"]
            got = grown(f"ray_serve_num_{proto}_error_requests_total", err)
            want = r["count"] if is_error(proto, r["status_code"]) else 0
            if got != want:
                fail(f"{where}: ray_serve_num_{proto}_error_requests_total grew by {got:g}, expected {want}")
            got = grown(f"ray_serve_{proto}_request_latency_ms_count", base)
            if got != r["count"]:
                fail(f"{where}: ray_serve_{proto}_request_latency_ms_count grew by {got:g}, {r['count']} were sent")
                continue
            total = grown(f"ray_serve_{proto}_request_latency_ms_sum", base)
            if r["count"] and not 0 < total / r["count"] < 60000:
                fail(f"{where}: mean latency {total / r['count']:g} ms is not plausible (ms, not seconds?)")
            if "latencies_ms" in r:
                got = [grown(f"ray_serve_{proto}_request_latency_ms_bucket", dict(base, le=float_text(b)))
                       for b in LATENCY_BUCKETS_MS]
                want = [sum(1 for x in r["latencies_ms"] if x <= b) for b in LATENCY_BUCKETS_MS]
                if got != want:
                    fail(f"{where}: the buckets (le={LATENCY_BUCKETS_MS}) grew by {[int(g) for g in got]}, "
                         f"the latencies {r['latencies_ms']} ms put {want} there")
        # Nothing counted that was not sent.
        for (name, labels), (_, d) in delta.items():
            if d and name in (f"ray_serve_num_{proto}_requests_total", f"ray_serve_num_{proto}_error_requests_total",
                              f"ray_serve_{proto}_request_latency_ms_count"):
                lab = dict(labels)
                lab = {k: v for k, v in lab.items() if k not in allowed_extra}
                if "error_code" in lab:
                    lab["status_code"] = lab.pop("error_code")
                if key(lab) not in sent:
                    fail(f"{name}{dict(labels)} grew by {d:g}, but no such request was sent")


def float_text(b):
    """Ray's exporter writes bounds as str(float): le="1.0"; the check finds either spelling."""
    return repr(float(b))


# --- step 3/4: the promtool test ---------------------------------------------------------------

def selector_text(name, labels):
    def q(v):
        return '"' + v.replace("\\", "\\\\").replace('"', '\\"').replace("\n", "\\n") + '"'
    return name + "{" + ",".join(f"{k}={q(v)}" for k, v in labels) + "}"


def grafana_escape(value):
    """Grafana's prometheusSpecialRegexEscape (a value of a multi-value or include-All variable),
    as it lands in the PromQL string."""
    value = value.replace("\\", "\\\\\\\\")
    return re.sub(r"[$^*{}\[\]'+?.()|]", lambda m: "\\\\" + m.group(0), value)


ALL = None


def interpolate(expr, variables, choice):
    """Grafana's $Variable interpolation for these variables (all include All, with allValue)."""
    def one(m):
        name = m.group(1) or m.group(2)
        var = variables.get(name)
        if var is None:
            raise SystemExit(f"FAIL: the expression uses ${name}, which the dashboard does not define")
        chosen = choice.get(name, ALL)
        if chosen is ALL:
            return var["allValue"]
        escaped = [grafana_escape(v) for v in chosen]
        return escaped[0] if len(escaped) == 1 else "(" + "|".join(escaped) + ")"
    return re.sub(r"\$\{(\w+)\}|\$(\w+)", one, expr)


def selected(choice, name, value):
    chosen = choice.get(name, ALL)
    return chosen is ALL or value in chosen


def matches(choice, proto, rec, cluster, total_panel=False):
    """Whether the dashboard's selector keeps a series with these labels, for this choice."""
    if not rec.get("application") or not selected(choice, "Application", rec["application"]):
        return False
    if not selected(choice, "Cluster", cluster):
        return False
    if total_panel:
        return True
    if proto == "http":
        route = rec.get("route", "")
        return selected(choice, "HTTP_Route", route) and not route.startswith("/-/")
    return selected(choice, "gRPC_Method", rec.get("method", ""))


def histogram_quantile(q, buckets):
    """Prometheus' bucketQuantile (2.42) on [(upper bound, cumulative count)]."""
    buckets = sorted(buckets)
    if len(buckets) < 2 or buckets[-1][0] != math.inf:
        return math.nan
    for i in range(1, len(buckets)):  # make it monotonic, as Prometheus does
        if buckets[i][1] < buckets[i - 1][1]:
            buckets[i] = (buckets[i][0], buckets[i - 1][1])
    total = buckets[-1][1]
    if total == 0:
        return math.nan
    rank = q * total
    b = next(i for i, (_, c) in enumerate(buckets) if c >= rank)
    if b == len(buckets) - 1:
        return buckets[-2][0]
    if b == 0 and buckets[0][0] <= 0:
        return buckets[0][0]
    start, end, count = 0.0, buckets[b][0], buckets[b][1]
    if b > 0:
        start = buckets[b - 1][0]
        count -= buckets[b - 1][1]
        rank -= buckets[b - 1][1]
    return start + (end - start) * (rank / count)


def expected(check, choice, traffic, delta, cluster, target_labels):
    """[(labels dict, value)] the expression should return for this choice."""
    kind = check["kind"]
    if kind == "rate_sum":
        proto, what = check["metric"].split("_")
        groups = {}
        for r in traffic.get(proto, []):
            if not matches(choice, proto, r, cluster) or (what == "errors" and not is_error(proto, r["status_code"])):
                continue
            lab = dict(r, error_code=r["status_code"])
            key = tuple((k, lab[k]) for k in check["by"] if lab[k])
            groups[key] = groups.get(key, 0) + r["count"]
        return [(dict(k), n / 60) for k, n in groups.items()]
    if kind in ("total_qps", "error_rate_pct"):
        sums = {"requests": 0.0, "errors": 0.0}
        for proto in ("http", "grpc"):
            for r in traffic.get(proto, []):
                if matches(choice, proto, r, cluster):
                    sums["requests"] += r["count"] / 60
                    if is_error(proto, r["status_code"]):
                        sums["errors"] += r["count"] / 60
        if kind == "total_qps":
            return [({}, sums["requests"])]
        return [({}, 100 * sums["errors"] / max(sums["requests"], 1))]
    if kind == "quantile":
        groups = {}
        total_panel = len(check["protocols"]) == 2
        records = [(p, r) for p in check["protocols"] for r in traffic.get(p, [])]
        if records and all("latencies_ms" in r for _, r in records):
            # From the latencies sent, not from the scrape: the scrape's buckets are under test.
            for proto, r in records:
                if matches(choice, proto, r, cluster, total_panel):
                    per_le = groups.setdefault(tuple((k, r[k]) for k in check["by"] if r.get(k)), {})
                    for le in [float(b) for b in LATENCY_BUCKETS_MS] + [math.inf]:
                        per_le[le] = per_le.get(le, 0.0) + sum(1 for x in r["latencies_ms"] if x <= le) / 60
        else:
            # Latencies unknown (live mode): the label sets of the traffic, the values of the scraped
            # buckets (whose bounds step 2 checked).
            for proto, r in records:
                if r["count"] and matches(choice, proto, r, cluster, total_panel):
                    groups.setdefault(tuple((k, r[k]) for k in check["by"] if r.get(k)), {})
            for (name, labels), (_, d) in delta.items():
                proto = name[len("ray_serve_"):].split("_")[0]
                if proto not in check["protocols"] or name != f"ray_serve_{proto}_request_latency_ms_bucket":
                    continue
                lab = dict(labels)
                if matches(choice, proto, lab, cluster, total_panel):
                    per_le = groups.setdefault(tuple((k, lab[k]) for k in check["by"] if lab.get(k)), {})
                    le = float(lab["le"].replace("+Inf", "inf"))
                    per_le[le] = per_le.get(le, 0.0) + d / 60
        out = [(dict(k), histogram_quantile(check["q"], list(v.items()))) for k, v in groups.items()]
        if check.get("or_zero") and not out:
            out = [({}, 0.0)]
        return out
    if kind == "gauge":
        out = []
        for (name, labels), (before, d) in delta.items():
            if name == check["metric"] and selected(choice, "Cluster", cluster):
                lab = {k: v for k, v in dict(labels, **target_labels).items() if v}  # "" is no label
                out.append((lab, before + d))
        return out
    raise SystemExit(f"FAIL: unknown check kind {kind!r} in {PANELS}")


def promtool_test(panels_doc, traffic, delta, cluster, tmp):
    """Writes the rule file and the test file; returns how many expressions and checks."""
    target_labels = {"instance": "ingressd:9000", "job": "ingressd"}
    if cluster:
        target_labels["ray_io_cluster"] = cluster
    series = []
    for (name, labels), (before, d) in sorted(delta.items()):
        labels = tuple(sorted(dict(labels, **target_labels).items()))
        series.append({"series": selector_text(name, labels), "values": f"{before!r}+{d!r}x10"})

    variables = {v["name"]: v for v in panels_doc["variables"]}
    apps = sorted({r["application"] for p in ("http", "grpc") for r in traffic.get(p, []) if r["application"]})
    routes = sorted({r["route"] for r in traffic.get("http", []) if r["application"]})
    methods = sorted({r["method"] for r in traffic.get("grpc", []) if r["application"]})
    choices = [("all", {})]
    choices += [("app_" + re.sub(r"\W", "_", a), {"Application": [a]}) for a in apps]
    if len(apps) >= 2:
        choices.append(("apps_two", {"Application": apps[:2]}))
    if routes:
        choices.append(("route", {"HTTP_Route": [routes[0]]}))
    if methods:
        choices.append(("grpc_method", {"gRPC_Method": [methods[0]]}))
    choices.append(("no_such_app", {"Application": ["no-such-app"]}))
    if cluster:
        choices += [("cluster", {"Cluster": [cluster]}), ("other_cluster", {"Cluster": [cluster + "-other"]})]

    rules, tests = [], []
    count = 0
    for dash in panels_doc["dashboards"]:
        global_filters = ",".join(dash["standard_global_filters"])
        for panel in dash["panels"]:
            for target in panel["targets"]:
                built = target["expr"].format(global_filters=global_filters)  # as Ray's generator
                for cname, choice in choices:
                    count += 1
                    record = f"ray_dashboard:{dash['name']}_{panel['id']}_{target['ref_id']}_{cname}".lower()
                    rules.append({"record": record, "expr": interpolate(built, variables, choice)})
                    where = f"{dash['name']} panel {panel['id']} {panel['title']!r} {target['ref_id']} [{cname}]"
                    want = expected(target["check"], choice, traffic, delta, cluster, target_labels)
                    tests.append({"expr": f"group without () ({record})", "eval_time": "10m",
                                  "exp_samples": [{"labels": selector_text("", sorted(lab.items())) if lab else "{}",
                                                   "value": 1} for lab, _ in want],
                                  "_where": where})
                    for lab, value in want:
                        # Empty when the value is right; else promtool prints the value got.
                        sel = selector_text(record, sorted(lab.items()))
                        if math.isnan(value):
                            expr = f"{sel} unless ({sel} != {sel})"
                        else:
                            expr = f"{sel} unless (abs({sel} - ({value!r})) <= {1e-9 * max(1.0, abs(value))!r})"
                        tests.append({"expr": expr, "eval_time": "10m", "exp_samples": [],
                                      "_where": f"{where}: expected {value!r} for {lab}"})
    # The variables the dashboard fills from ingressd's own series.
    for var, metric, label in (("HTTP_Route", "ray_serve_num_http_requests_total", "route"),
                               ("gRPC_Method", "ray_serve_num_grpc_requests_total", "method")):
        proto = "http" if label == "route" else "grpc"
        # Every value of a series present: the traffic's, and any the baseline already had.
        values = sorted({r[label] for r in traffic.get(proto, [])} |
                        {dict(labels).get(label, "") for (name, labels) in delta if name == metric})
        filters = ",".join(panels_doc["dashboards"][0]["standard_global_filters"])
        query = variables[var]["query"].format(global_filters=filters)
        m = re.match(r"^label_values\((.*),\s*(\w+)\)$", query)
        sel = interpolate(m.group(1), variables, {})
        record = f"ray_dashboard:variable_{var.lower()}"
        rules.append({"record": record, "expr": f"group by ({m.group(2)}) ({sel})"})
        tests.append({"expr": record, "eval_time": "10m",
                      "exp_samples": [{"labels": selector_text(record, [(label, v)] if v else []), "value": 1}
                                      for v in values],
                      "_where": f"variable ${var}: {query}"})
    where = [t.pop("_where") for t in tests]
    with open(os.path.join(tmp, "rules.json"), "w", encoding="utf-8") as f:
        json.dump({"groups": [{"name": "ray_serve_dashboard", "interval": "1m", "rules": rules}]}, f, indent=1)
    with open(os.path.join(tmp, "test.json"), "w", encoding="utf-8") as f:
        json.dump({"rule_files": ["rules.json"], "evaluation_interval": "1m",
                   "tests": [{"interval": "1m", "input_series": series, "promql_expr_test": tests}]}, f, indent=1)
    return count, where, tests


def run_promtool(tmp, where, tests):
    for command in (["promtool", "check", "rules", "rules.json"], ["promtool", "test", "rules", "test.json"]):
        r = subprocess.run(command, capture_output=True, text=True, cwd=tmp)
        if r.returncode == 0:
            continue
        out = "\n".join(line for line in (r.stdout + r.stderr).splitlines() if line.strip())
        # Name the panel of each failed expression.
        for i, t in enumerate(tests):
            quoted = json.dumps(t["expr"])
            if quoted in out or t["expr"] in out:
                out = out.replace(f"expr: {quoted}", f"[{where[i]}]\n    expr: {quoted}", 1)
        fail(f"{' '.join(command)}:\n{out}")
        return


# --- live mode ---------------------------------------------------------------------------------

def target_group(name, prefix, replicas):
    def target(t):
        ip, port = t["address"].rsplit(":", 1)
        return {"ip": ip, "port": int(port), "instance_id": t["name"], "name": t["name"]}
    return {"app_name": name, "route_prefix": prefix, "protocol": "HTTP",
            "targets": [target(r) for r in replicas], "ingress_request_router_targets": []}


LIVE = [  # (method, path, body, application, route, expected status, how many)
    ("GET", "/echo/hello", None, "echo", "/echo", 200, 7),
    ("POST", "/llm/generate", '{"prompt":"hi"}', "llm", "/llm", 200, 5),
    ("GET", "/down/x", None, "down", "/down", 503, 3),
    ("GET", "/nope", None, "", "", 404, 2),  # no app: Ray counts it with route="" and application=""
    ("GET", "/-/healthz", None, "", "/-/healthz", 200, 2),
]


def live(binary):
    with kit.Demo(binary) as cluster, tempfile.TemporaryDirectory() as tmp:
        apps = {a["name"]: a for a in cluster.topology()["apps"]}
        doc = {"target_groups": [target_group("echo", "/echo", apps["echo"]["replicas"]),
                                 target_group("llm", "/llm", apps["llm"]["replicas"]),
                                 target_group("down", "/down", [])]}
        topology_file = os.path.join(tmp, "topology.json")
        with open(topology_file, "w", encoding="utf-8") as f:
            json.dump(doc, f)
        with kit.FileDaemon(binary, topology_file) as proxy:
            asked = [0]

            def routed():
                status, body = proxy.request("GET", "/-/routes")
                asked[0] += 1
                return status == 200 and all(p in body for p in ("/echo", "/llm", "/down"))
            kit.wait_until(routed, 15, "the topology file's apps in /-/routes")

            # A request is counted once its response is written: the baseline waits for the
            # /-/routes requests above to be counted (else the last one can land after it).
            def routes_counted():
                return sum(v for k, v in parse(proxy.metrics())[0].items()
                           if k[0] == "ray_serve_num_http_requests_total" and ("route", "/-/routes") in k[1]) >= asked[0]
            kit.wait_until(routes_counted, 10, "the /-/routes requests counted before the baseline")
            baseline = proxy.metrics()
            http = {}
            for method, path, body, app, route, status, n in LIVE:
                headers = {"content-type": "application/json"} if body else {}
                for _ in range(n):
                    got, _ = proxy.request(method, path, body, headers)
                    if got != status:
                        raise SystemExit(f"FAIL: {method} {path} answered {got}, expected {status}\n{proxy.output()}")
                key = (app, route, method, str(status))
                http[key] = http.get(key, 0) + n
            want = sum(http.values())
            base_samples = parse(baseline)[0]

            def counted():
                samples = parse(proxy.metrics())[0]
                total = sum(v - base_samples.get(k, 0.0) for k, v in samples.items()
                            if k[0] == "ray_serve_num_http_requests_total")
                return total >= want
            try:
                kit.wait_until(counted, 10, f"ray_serve_num_http_requests_total to count the {want} requests")
            except SystemExit as e:  # report it with whatever else the scrape gets wrong
                fail(str(e).removeprefix("FAIL: "))
            final = proxy.metrics()
    traffic = {"http": [{"application": a, "route": r, "method": m, "status_code": s, "count": n}
                        for (a, r, m, s), n in sorted(http.items())], "grpc": []}
    return baseline, final, traffic


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("binary", nargs="?", help="the ingressd binary (live mode)")
    ap.add_argument("--scrape", help="a /metrics text (file mode)")
    ap.add_argument("--baseline", help="the scrape before the traffic (file mode; default: all zero)")
    ap.add_argument("--traffic", help="the traffic the scrape stands for (file mode)")
    ap.add_argument("--cluster", help="put ray_io_cluster=NAME on every series (as KubeRay's PodMonitor does) "
                                      "and also check the dashboard with $Cluster set")
    ap.add_argument("--allow-label", action="append", default=[],
                    help="a label ingressd may add to the ray_serve_* series beside Ray's (repeatable)")
    ap.add_argument("--keep", help="keep the promtool rules and test (and, live, the scrapes and traffic) in this "
                                   "directory")
    args = ap.parse_args()

    if args.scrape:
        if not args.traffic:
            ap.error("--scrape needs --traffic")
        with open(args.scrape, encoding="utf-8") as f:
            final = f.read()
        baseline = ""
        if args.baseline:
            with open(args.baseline, encoding="utf-8") as f:
                baseline = f.read()
        with open(args.traffic, encoding="utf-8") as f:
            traffic = json.load(f)
    elif args.binary:
        if not shutil.which("promtool"):
            print("SKIP: promtool is not installed (Debian: prometheus)")
            return 77
        baseline, final, traffic = live(args.binary)
        if args.keep:  # the scrapes and the traffic, to rerun the check on them with --scrape
            os.makedirs(args.keep, exist_ok=True)
            for name, text in (("baseline.txt", baseline), ("scrape.txt", final)):
                with open(os.path.join(args.keep, name), "w", encoding="utf-8") as f:
                    f.write(text)
            with open(os.path.join(args.keep, "traffic.json"), "w", encoding="utf-8") as f:
                json.dump(traffic, f, indent=1)
    else:
        ap.error("give INGRESSD_BINARY, or --scrape and --traffic")
    if not shutil.which("promtool"):
        print("SKIP: promtool is not installed (Debian: prometheus)")
        return 77

    with open(PANELS, encoding="utf-8") as f:
        panels_doc = json.load(f)
    base_samples = parse(baseline)[0]
    final_samples, types, helps = parse(final)
    delta = increases(base_samples, final_samples, types)
    if not delta:
        fail("the scrape has no ray_serve_* series")
    check_series(final_samples, types, helps, delta, traffic, args.allow_label)

    tmp = args.keep or tempfile.mkdtemp(prefix="ray-dashboard-")
    os.makedirs(tmp, exist_ok=True)
    try:
        count, where, tests = promtool_test(panels_doc, traffic, delta, args.cluster, tmp)
        run_promtool(tmp, where, tests)
    finally:
        if not args.keep:
            shutil.rmtree(tmp, ignore_errors=True)

    for p in problems:
        print("FAIL:", p)
    if problems:
        return 1
    panels = sum(len(d["panels"]) for d in panels_doc["dashboards"])
    print(f"OK: {count} evaluations of {panels} Ray Serve dashboard panels ({len(tests)} promtool checks) "
          f"return exactly the traffic's applications, routes, methods, error codes, rates and latencies")
    return 0


if __name__ == "__main__":
    sys.exit(main())
