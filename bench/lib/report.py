#!/usr/bin/env python3
"""Result bookkeeping for bench/run.sh.

  report.py wrk   --file OUT --round R --proxy P --scenario S --cpu-ticks T [--clk-tck HZ]
                  [--core-busy PCT]
      parse one `wrk --latency` output, print result rows (TSV: round proxy scenario metric value)
  report.py json  --json '{...}' --round R --proxy P --scenario S [--keys a,b,c]
      turn one JSON object (ttft.py / idle_conns.py output) into result rows
  report.py hedge --results results.tsv
      the late-router comparison of run.sh --hedge: per router condition and proxy, req/s, p50 and
      p99 (medians over rounds), p99 over the same proxy's p99 with healthy routers, and the share
      of requests ingressd hedged; then the goal checks (bench/README "Late routers")
  report.py table --results results.tsv [--quick] [--gate-ratio 2.0]
      print the comparison table (medians over rounds, per-round ratios ingressd/HAProxy and, when
      the nginx + Lua anchor ran, ingressd/nginx) and the goal checks; with --quick, exit 1 when
      ingressd's router-path req/s is below gate-ratio x HAProxy's in the same run (or ingressd
      had errors on that path)
"""
import argparse
import json
import re
import statistics
import sys
from collections import defaultdict

UNIT = {"us": 1e-3, "ms": 1.0, "s": 1e3, "m": 60e3, "h": 3600e3}


def to_ms(text):
    m = re.match(r"([\d.]+)(us|ms|s|m|h)$", text.strip())
    if not m:
        return None
    return float(m.group(1)) * UNIT[m.group(2)]


def parse_wrk(text):
    out = {}
    m = re.search(r"(\d+) requests in ([\d.]+)(us|ms|s|m)", text)
    if not m:
        raise SystemExit("wrk output has no request count:\n" + text)
    out["requests"] = int(m.group(1))
    out["seconds"] = float(m.group(2)) * UNIT[m.group(3)] / 1000.0
    for pct in ("50", "75", "90", "99"):
        mm = re.search(r"^\s+%s(?:\.0+)?%%\s+(\S+)" % pct, text, re.M)
        if mm:
            out["p%s_ms" % pct] = to_ms(mm.group(1))
    non2xx = re.search(r"Non-2xx or 3xx responses: (\d+)", text)
    out["non2xx"] = int(non2xx.group(1)) if non2xx else 0
    sock = re.search(r"Socket errors: connect (\d+), read (\d+), write (\d+), timeout (\d+)", text)
    out["sock_errors"] = sum(int(x) for x in sock.groups()) if sock else 0
    return out


def cmd_wrk(a):
    with open(a.file) as f:
        w = parse_wrk(f.read())
    good = w["requests"] - w["non2xx"]
    rows = {
        "rps": good / w["seconds"] if w["seconds"] else 0.0,
        "p50_ms": w.get("p50_ms"),
        "p99_ms": w.get("p99_ms"),
        "errors": w["non2xx"] + w["sock_errors"],
        "requests": w["requests"],
    }
    if a.cpu_ticks is not None and w["requests"]:
        rows["cpu_us"] = a.cpu_ticks / a.clk_tck * 1e6 / w["requests"]
    if a.core_busy is not None:
        rows["core_busy"] = a.core_busy
    if a.load_core_busy is not None:
        rows["load_core_busy"] = a.load_core_busy
    if a.upstream_accepts is not None and w["requests"]:
        rows["new_conns_per_req"] = max(0, a.upstream_accepts) / w["requests"]
    if a.upstream_requests is not None and w["requests"]:
        # requests the fakes served per client request: 1 on the plain path, 2 on the router path
        # (router call + replica); shows that every routed request asked a router
        rows["upstream_reqs_per_req"] = max(0, a.upstream_requests) / w["requests"]
    if a.cpu_ticks is not None and a.elapsed:
        # share of one core the proxy used; what else ran on the proxy core = the rest
        rows["cpu_pct"] = a.cpu_ticks / a.clk_tck / a.elapsed * 100.0
        if a.core_busy is not None and not a.scenario.endswith(("_t2", "_b2")):
            rows["foreign_pct"] = max(0.0, a.core_busy - rows["cpu_pct"])
    for k, v in rows.items():
        if v is not None:
            print("%s\t%s\t%s\t%s\t%.6g" % (a.round, a.proxy, a.scenario, k, v))


def cmd_json(a):
    obj = json.loads(a.json)
    keys = a.keys.split(",") if a.keys else list(obj)
    for k in keys:
        v = obj.get(k)
        if isinstance(v, (int, float)) and not isinstance(v, bool):
            print("%s\t%s\t%s\t%s\t%.6g" % (a.round, a.proxy, a.scenario, k, v))


# ---------------------------------------------------------------- table

ROWS = [
    # scenario, metric, label, format, goal-direction ("hi" = more is better)
    ("plain_c64", "rps", "plain GET c64: req/s", "%.0f", "hi"),
    ("plain_c64", "p50_ms", "plain GET c64: p50 ms", "%.3f", "lo"),
    ("plain_c64", "p99_ms", "plain GET c64: p99 ms", "%.3f", "lo"),
    ("plain_c64", "cpu_us", "plain GET c64: proxy CPU us/req", "%.1f", "lo"),
    ("router_c16", "rps", "router POST c16: req/s", "%.0f", "hi"),
    ("router_c16", "p50_ms", "router POST c16: p50 ms", "%.3f", "lo"),
    ("router_c16", "p99_ms", "router POST c16: p99 ms", "%.3f", "lo"),
    ("router_c16", "cpu_us", "router POST c16: proxy CPU us/req", "%.1f", "lo"),
    ("router_c64", "rps", "router POST c64: req/s", "%.0f", "hi"),
    ("router_c64", "p50_ms", "router POST c64: p50 ms", "%.3f", "lo"),
    ("router_c64", "p99_ms", "router POST c64: p99 ms", "%.3f", "lo"),
    ("router_c64", "cpu_us", "router POST c64: proxy CPU us/req", "%.1f", "lo"),
    ("router_c256", "rps", "router POST c256: req/s", "%.0f", "hi"),
    ("router_c256", "p50_ms", "router POST c256: p50 ms", "%.3f", "lo"),
    ("router_c256", "p99_ms", "router POST c256: p99 ms", "%.3f", "lo"),
    ("router_c256", "cpu_us", "router POST c256: proxy CPU us/req", "%.1f", "lo"),
    ("router_c64_t2", "rps", "router POST c64, 2 threads: req/s", "%.0f", "hi"),
    ("router_c64_t2", "cpu_us", "router POST c64, 2 threads: CPU us/req", "%.1f", "lo"),
    ("router_c64_b1", "rps", "router c64, 1 thread, budget: req/s", "%.0f", "hi"),
    ("router_c64_b2", "rps", "router c64, 2 threads, budget: req/s", "%.0f", "hi"),
    ("router_c64_b2", "cpu_us", "router c64, 2 thr, budget: CPU us/req", "%.1f", "lo"),
    ("sse", "ttft_p50_ms", "SSE TTFT p50 ms (router path)", "%.3f", "lo"),
    ("sse", "added_p50_ms", "SSE TTFT added over direct, p50 ms", "%.3f", "lo"),
    ("sse", "ttft_p99_ms", "SSE TTFT p99 ms", "%.3f", "lo"),
    ("sse", "lag_p50_ms", "SSE per-event delay p50 ms", "%.3f", "lo"),
    ("sse", "batched", "SSE events batched (count)", "%.0f", "lo"),
    ("sse", "cpu_us", "SSE proxy CPU us per stream", "%.0f", "lo"),
    ("sse_bp", "ttft_p50_ms", "SSE busy-poll: TTFT p50 ms", "%.3f", "lo"),
    ("sse_bp", "added_p50_ms", "SSE busy-poll: TTFT added p50 ms", "%.3f", "lo"),
    ("sse_bp", "lag_p50_ms", "SSE busy-poll: per-event delay p50", "%.3f", "lo"),
    ("sse_bp", "batched", "SSE busy-poll: events batched", "%.0f", "lo"),
    ("sse_bp", "cpu_us", "SSE busy-poll: CPU us per stream", "%.0f", "lo"),
    ("idle", "bytes_per_conn", "idle keep-alive conn: RSS bytes/conn", "%.0f", "lo"),
    ("streams", "held", "SSE streams held open at once (count)", "%.0f", "hi"),
    ("streams", "bytes_per_stream", "SSE streams held: RSS bytes/stream", "%.0f", "lo"),
]
ERROR_SCENARIOS = ["plain_c64", "router_c16", "router_c64", "router_c256", "router_c64_t2",
                   "router_c64_b1", "router_c64_b2"]


def load(path):
    data = defaultdict(dict)  # (proxy, scenario, metric) -> {round: value}
    with open(path) as f:
        for line in f:
            parts = line.rstrip("\n").split("\t")
            if len(parts) != 5:
                continue
            rnd, proxy, scen, metric, val = parts
            data[(proxy, scen, metric)][rnd] = float(val)
    return data


def med(d):
    return statistics.median(d.values()) if d else None


def fmt_cell(d, f):
    if not d:
        return "-"
    m = f % med(d)
    if len(d) > 1:
        m += " [%s-%s]" % (f % min(d.values()), f % max(d.values()))
    return m


def per_round_ratio(a, b):
    rs = [a[r] / b[r] for r in a if r in b and b[r]]
    return rs


def ratio_cell(rs):
    if not rs:
        return "-"
    cell = "%.2f" % statistics.median(rs)
    if len(rs) > 1:
        cell += " [%.2f-%.2f]" % (min(rs), max(rs))
    return cell


# the proxies of the table, in column order; nginx (+ lua-nginx-module, pooled cosockets: issue
# #22's anchor) only when the run measured it
PROXIES = ("ingressd", "haproxy", "nginx")


def cmd_table(a):
    data = load(a.results)
    # derived: TTFT added over direct, per round
    # (both variants against the direct run of the same round)
    for proxy in PROXIES:
        for scen in ("sse", "sse_bp"):
            t = data.get((proxy, scen, "ttft_p50_ms"), {})
            d = data.get(("direct", "sse", "ttft_p50_ms"), {})
            for r, v in t.items():
                if r in d:
                    data[(proxy, scen, "added_p50_ms")][r] = v - d[r]
    rounds = sorted({r for v in data.values() for r in v if r != "0"})
    lines = []
    nginx = any(p == "nginx" for (p, _, _) in data)
    head = ("scenario / metric", "ingressd", "haproxy", "ratio i/h")
    if nginx:
        head = ("scenario / metric", "ingressd", "haproxy", "nginx+lua", "ratio i/h", "ratio i/n")
    body = []
    for scen, metric, label, f, _ in ROWS:
        di = data.get(("ingressd", scen, metric), {})
        dh = data.get(("haproxy", scen, metric), {})
        dn = data.get(("nginx", scen, metric), {})
        if not di and not dh and not dn:
            continue
        rh = ratio_cell(per_round_ratio(di, dh) if metric != "batched" else [])
        if nginx:
            rn = ratio_cell(per_round_ratio(di, dn) if metric != "batched" else [])
            body.append((label, fmt_cell(di, f), fmt_cell(dh, f), fmt_cell(dn, f), rh, rn))
        else:
            body.append((label, fmt_cell(di, f), fmt_cell(dh, f), rh))
    widths = [max(len(r[i]) for r in [head] + body) for i in range(len(head))]
    sep = "-+-".join("-" * w for w in widths)
    lines.append(" | ".join(h.ljust(w) for h, w in zip(head, widths)))
    lines.append(sep)
    for r in body:
        lines.append(" | ".join(c.ljust(w) for c, w in zip(r, widths)))
    print("\n".join(lines))
    print("cells: median over %d round(s) [min-max]; ratio: median of per-round ingressd/haproxy%s "
          "[min-max]" % (len(rounds), " (i/h) and ingressd/nginx+lua (i/n)" if nginx else ""))

    # baselines and sanity
    extra = []
    for scen, label in (("direct_get_c64", "direct GET c64 to one nginx replica (no proxy)"),
                        ("direct_post_c64", "direct POST c64 to one nginx replica (no proxy)")):
        d = data.get(("direct", scen, "rps"), {})
        if d:
            extra.append("%s: %s req/s" % (label, fmt_cell(d, "%.0f")))
    d = data.get(("direct", "sse", "ttft_p50_ms"), {})
    if d:
        extra.append("direct SSE TTFT p50 (client -> SSE replica, no proxy): %s ms" % fmt_cell(d, "%.3f"))
    d = data.get(("direct", "direct_get_c64", "core_busy"), {})
    if d:
        extra.append("proxy core busy with other work while no proxy ran (direct GET run): %s %%"
                     % fmt_cell(d, "%.0f"))
    for scen in ("plain_c64", "router_c64", "router_c256"):
        cells = []
        for proxy in PROXIES:
            cp = data.get((proxy, scen, "cpu_pct"), {})
            fo = data.get((proxy, scen, "foreign_pct"), {})
            lb = data.get((proxy, scen, "load_core_busy"), {})
            if cp:
                cells.append("%s %s %% (others %s %%; load core busy %s %%)"
                             % (proxy, fmt_cell(cp, "%.0f"), fmt_cell(fo, "%.0f"), fmt_cell(lb, "%.0f")))
        if cells:
            extra.append("proxy CPU share of its core, %s: %s" % (scen, "; ".join(cells)))
    for scen in ("plain_c64", "router_c64", "router_c256"):
        cells = []
        for proxy in PROXIES:
            up = data.get((proxy, scen, "up_conns"), {})
            rt = data.get((proxy, scen, "router_conns"), {})
            nc = data.get((proxy, scen, "new_conns_per_req"), {})
            uq = data.get((proxy, scen, "upstream_reqs_per_req"), {})
            if up or nc:
                cells.append("%s %s new/req, %s to replicas + %s to routers open, %s upstream req/req" % (
                    proxy, fmt_cell(nc, "%.3f"), fmt_cell(up, "%.0f"), fmt_cell(rt, "%.0f"), fmt_cell(uq, "%.2f")))
        if cells:
            extra.append("upstream TCP conns (new per request; established mid-run; requests the fakes served per"
                         " request), %s: %s" % (scen, "; ".join(cells)))
    fo = [v for (proxy, scen, metric), d in data.items() if metric == "foreign_pct" for v in d.values()]
    if fo and statistics.median(fo) > 10 or fo and max(fo) > 25:
        extra.append("WARNING: other processes used the proxy core during the runs (median %.0f %%, max %.0f %% "
                     "of it): absolute numbers are depressed and noisy; compare the per-round ratios"
                     % (statistics.median(fo), max(fo)))
    errs = []
    for proxy in PROXIES:
        for scen in ERROR_SCENARIOS + ["sse", "sse_bp", "idle", "streams"]:
            for metric in ("errors", "failed", "non200", "closed_in_sample"):
                d = data.get((proxy, scen, metric), {})
                tot = sum(d.values())
                if tot:
                    errs.append("%s %s %s=%d" % (proxy, scen, metric, tot))
    extra.append("errors (non-2xx, socket errors, failed/closed idle conns): " + (", ".join(errs) if errs else "none"))
    print()
    print("\n".join(extra))

    # goals
    def m(proxy, scen, metric):
        return med(data.get((proxy, scen, metric), {}))

    def ratio(scen, metric):
        rs = per_round_ratio(data.get(("ingressd", scen, metric), {}), data.get(("haproxy", scen, metric), {}))
        return statistics.median(rs) if rs else None

    goals = []

    def goal(name, value, ok, shown):
        if value is None:
            goals.append("  [ -- ] %s: not measured" % name)
        else:
            goals.append("  [%s] %s: %s" % ("PASS" if ok else "FAIL", name, shown))

    r = ratio("router_c64", "rps")
    goal("(1a) router c64 req/s >= 4x HAProxy", r, r is not None and r >= 4, "%.2fx" % (r or 0))
    r = ratio("router_c64", "cpu_us")
    goal("(1b) router c64 CPU/req <= 1/4 of HAProxy", r, r is not None and r <= 0.25, "%.3fx" % (r or 0))
    cl = [m("ingressd", s, "rps") for s in ("router_c16", "router_c64", "router_c256")]
    if all(v is not None for v in cl):
        # "req/s does not fall as connections grow": no step below the best rate before it, give
        # or take 5 % (the spread of one configuration between runs on this machine, README).
        worst = min(cl[1] / cl[0], cl[2] / max(cl[0], cl[1]))
        goal("(1c) no cliff 16->256 conns (req/s does not fall as conns grow, 5% noise allowed)", worst,
             worst >= 0.95,
             "c16 %.0f, c64 %.0f, c256 %.0f req/s (worst step %.2f)" % (cl[0], cl[1], cl[2], worst))
    else:
        goal("(1c) no cliff 16->256 conns", None, False, "")
    r = ratio("plain_c64", "cpu_us")
    goal("(2) plain c64 CPU/req <= HAProxy", r, r is not None and r <= 1.0, "%.3fx" % (r or 0))
    for scen, name in (("sse", "(3) SSE TTFT added <= 0.2 ms p50, no batching (default config)"),
                       ("sse_bp", "(3) the same with busy polling (busy_poll_us / HAProxy busy-polling)")):
        add = m("ingressd", scen, "added_p50_ms")
        bat = sum(data.get(("ingressd", scen, "batched"), {}).values())
        goal(name, add, add is not None and add <= 0.2 and bat == 0,
             "%.3f ms added (haproxy %.3f), %d batched events"
             % (add or 0, m("haproxy", scen, "added_p50_ms") or 0, bat))
    r = ratio("idle", "bytes_per_conn")
    goal("(4) idle conn RSS/conn <= HAProxy", r, r is not None and r <= 1.0,
         "%.2fx (%.0f vs %.0f bytes)" % (r or 0, m("ingressd", "idle", "bytes_per_conn") or 0,
                                        m("haproxy", "idle", "bytes_per_conn") or 0))
    sb, sn = m("ingressd", "streams", "bytes_per_stream"), m("ingressd", "streams", "held")
    if sb:
        goals.append("  [info] (5) %d concurrent SSE streams held: ingressd %.0f bytes/stream, haproxy %s%s"
                     % (sn or 0, sb, "%.0f" % m("haproxy", "streams", "bytes_per_stream")
                        if m("haproxy", "streams", "bytes_per_stream") else "-",
                        ", nginx %.0f" % m("nginx", "streams", "bytes_per_stream")
                        if m("nginx", "streams", "bytes_per_stream") else ""))
    # Scaling where each proxy thread has the same CPU budget (bench/run.sh, BENCH_THREAD_BUDGET):
    # two threads that share nothing should serve close to twice what one does.
    b1, b2 = m("ingressd", "router_c64_b1", "rps"), m("ingressd", "router_c64_b2", "rps")
    hb1, hb2 = m("haproxy", "router_c64_b1", "rps"), m("haproxy", "router_c64_b2", "rps")
    nb1, nb2 = m("nginx", "router_c64_b1", "rps"), m("nginx", "router_c64_b2", "rps")
    goal("(5) scaling 1->2 threads, each thread with the same CPU budget: throughput grows >= 1.8x",
         b2 / b1 if b1 and b2 else None, bool(b1 and b2 and b2 / b1 >= 1.8),
         "ingressd %.2fx (%.0f -> %.0f req/s), haproxy %s%s" % (
             (b2 or 0) / (b1 or 1), b1 or 0, b2 or 0,
             "%.2fx (%.0f -> %.0f)" % (hb2 / hb1, hb1, hb2) if hb1 and hb2 else "-",
             ", nginx (workers) %.2fx (%.0f -> %.0f)" % (nb2 / nb1, nb1, nb2) if nb1 and nb2 else ""))
    t1, t2 = m("ingressd", "router_c64", "rps"), m("ingressd", "router_c64_t2", "rps")
    h1, h2 = m("haproxy", "router_c64", "rps"), m("haproxy", "router_c64_t2", "rps")
    n1, n2 = m("nginx", "router_c64", "rps"), m("nginx", "router_c64_t2", "rps")
    if t1 and t2:
        goals.append("  [info] (5) scaling 1->2 threads without budgets, router c64 (the machine is the limit: "
                     "the 2nd thread takes core 0 from wrk and the fakes): ingressd %.2fx, haproxy %s%s" % (
                         t2 / t1, "%.2fx" % (h2 / h1) if h1 and h2 else "-",
                         ", nginx %.2fx" % (n2 / n1) if n1 and n2 else ""))
    print()
    print("goals (issue):")
    print("\n".join(goals))

    # issue #22: against the best data plane an operator could build instead of Ray's HAProxy +
    # Lua (nginx + lua-nginx-module, pooled cosockets); PASS/MISS, never the exit status
    g22 = []

    def goal22(name, rs, ok, shown):
        if not rs:
            g22.append("  [ -- ] %s: not measured" % name)
        else:
            v = statistics.median(rs)
            g22.append("  [%s] %s: %s" % ("PASS" if ok(v) else "MISS", name, shown(v, rs)))

    def rng(rs):
        return " [%.2f-%.2f]" % (min(rs), max(rs)) if len(rs) > 1 else ""

    def series(proxy, scen, metric):
        return data.get((proxy, scen, metric), {})

    rs = per_round_ratio(series("ingressd", "router_c64", "rps"), series("nginx", "router_c64", "rps"))
    goal22("(22a) router c64 req/s >= 2x nginx+Lua", rs, lambda v: v >= 2.0,
           lambda v, rs: "%.2fx%s (ingressd %.0f, nginx+Lua %.0f req/s)" % (
               v, rng(rs), m("ingressd", "router_c64", "rps") or 0, m("nginx", "router_c64", "rps") or 0))
    rs = per_round_ratio(series("ingressd", "router_c64", "cpu_us"), series("nginx", "router_c64", "cpu_us"))
    goal22("(22b) router c64 CPU/req <= 0.5x nginx+Lua", rs, lambda v: v <= 0.5,
           lambda v, rs: "%.3fx%s (ingressd %.1f, nginx+Lua %.1f us/req)" % (
               v, rng(rs), m("ingressd", "router_c64", "cpu_us") or 0, m("nginx", "router_c64", "cpu_us") or 0))
    rs = per_round_ratio(series("ingressd", "router_c64", "cpu_us"), series("ingressd", "plain_c64", "cpu_us"))
    goal22("(22c) ingressd router-path CPU/req <= 1.3x its plain-path CPU/req (c64)", rs, lambda v: v <= 1.3,
           lambda v, rs: "%.2fx%s (router %.1f, plain %.1f us/req)" % (
               v, rng(rs), m("ingressd", "router_c64", "cpu_us") or 0, m("ingressd", "plain_c64", "cpu_us") or 0))
    # per round: ingressd's plain CPU/req over the better (lower) of HAProxy's and nginx's
    pi, ph, pn = (series(p, "plain_c64", "cpu_us") for p in ("ingressd", "haproxy", "nginx"))
    best = {r: min(v for v in (ph.get(r), pn.get(r)) if v) for r in pi if ph.get(r) or pn.get(r)}
    rs = per_round_ratio(pi, best) if pn else []
    goal22("(22d) plain c64 CPU/req <= 0.9x the better of HAProxy and nginx", rs, lambda v: v <= 0.9,
           lambda v, rs: "%.3fx%s (ingressd %.1f; HAProxy %.1f, nginx %.1f us/req)" % (
               v, rng(rs), m("ingressd", "plain_c64", "cpu_us") or 0, m("haproxy", "plain_c64", "cpu_us") or 0,
               m("nginx", "plain_c64", "cpu_us") or 0))
    print()
    print("goals (issue #22, against nginx + lua-nginx-module with pooled cosockets; MISS does not fail the run):")
    print("\n".join(g22))

    if a.quick:
        print("(goals above: one short round, for information; only the quick gate below sets the exit status)")
        r = ratio("router_c64", "rps")
        e = sum(data.get(("ingressd", "router_c64", "errors"), {}).values())
        n = sum(data.get(("ingressd", "router_c64", "requests"), {}).values()) or 1
        print()
        if r is None:
            print("QUICK GATE: FAIL (router path not measured)")
            return 1
        if e / n > 0.001:
            print("QUICK GATE: FAIL (ingressd router path errors: %d of %d requests)" % (e, n))
            return 1
        if r < a.gate_ratio:
            print("QUICK GATE: FAIL (ingressd router req/s = %.2fx HAProxy's, need >= %.1fx)" % (r, a.gate_ratio))
            return 1
        print("QUICK GATE: PASS (ingressd router req/s = %.2fx HAProxy's, need >= %.1fx)" % (r, a.gate_ratio))
    return 0


def cmd_ab(a):
    """Paired comparison of two ingressd builds (run.sh --ab): per scenario, the median and the
    quartiles of new/old over the pairs, which cancels the host's drift between pairs."""
    data = load(a.results)
    scens = sorted({s for (p, s, m) in data if p == "new" and "_c" in s},
                   key=lambda s: (s.split("_c")[0], int(s.split("_c")[1])))
    print("%-12s | %-26s | %-26s | %-9s | %-9s" % ("scenario", "req/s new/old [q1-q3]", "CPU/req new/old [q1-q3]",
                                                    "new req/s", "old req/s"))
    print("-" * 13 + "+" + "-" * 28 + "+" + "-" * 28 + "+" + "-" * 11 + "+" + "-" * 10)
    for scen in scens:
        cells = []
        for metric in ("rps", "cpu_us"):
            rs = per_round_ratio(data.get(("new", scen, metric), {}), data.get(("old", scen, metric), {}))
            if len(rs) >= 2:
                q = statistics.quantiles(rs, n=4)
                cells.append("%.3f [%.3f-%.3f] n=%d" % (statistics.median(rs), q[0], q[2], len(rs)))
            else:
                cells.append("%.3f n=%d" % (statistics.median(rs), len(rs)) if rs else "-")
        print("%-12s | %-26s | %-26s | %-9.0f | %-9.0f" % (scen, cells[0], cells[1],
              med(data.get(("new", scen, "rps"), {})) or 0, med(data.get(("old", scen, "rps"), {})) or 0))
    if ("new", "sse", "ttft_p50_ms") in data:
        print()
        print("%-24s | %-26s | %-9s | %-9s" % ("SSE (router path)", "new/old [q1-q3]", "new", "old"))
        print("-" * 25 + "+" + "-" * 28 + "+" + "-" * 11 + "+" + "-" * 10)
        for metric, label in (("ttft_p50_ms", "TTFT p50 ms"), ("ttft_p99_ms", "TTFT p99 ms"),
                              ("lag_p50_ms", "per-event delay p50 ms"), ("cpu_us", "CPU us per stream")):
            rs = per_round_ratio(data.get(("new", "sse", metric), {}), data.get(("old", "sse", metric), {}))
            if not rs:
                continue
            cell = "%.3f n=%d" % (statistics.median(rs), len(rs))
            if len(rs) >= 2:
                q = statistics.quantiles(rs, n=4)
                cell = "%.3f [%.3f-%.3f] n=%d" % (statistics.median(rs), q[0], q[2], len(rs))
            print("%-24s | %-26s | %-9.3f | %-9.3f" % (label, cell, med(data.get(("new", "sse", metric), {})) or 0,
                                                       med(data.get(("old", "sse", metric), {})) or 0))
    print("ratios < 1 in CPU/req, TTFT and delay, and > 1 in req/s, favour the new build; when the")
    print("quartiles straddle 1 the difference is within the noise of this run")
    return 0


def cmd_hedge(a):
    data = load(a.results)
    proxies = [("haproxy", "HAProxy + Lua"), ("nginx", "nginx + Lua (pooled)"), ("ingressd", "ingressd (hedge auto)"),
               ("nohedge", "ingressd (hedge off)")]
    conds = [("healthy", "both routers healthy"), ("stall5", "one router: 5% of replies +50 ms"),
             ("slow20", "one router always +20 ms")]
    print("%-34s | %-22s | %-9s | %-8s | %-8s | %-16s | %-8s" % ("routers", "proxy", "req/s", "p50 ms", "p99 ms",
                                                                "p99 / healthy", "hedged %"))
    print("-" * 35 + "+" + "-" * 24 + "+" + "-" * 11 + "+" + "-" * 10 + "+" + "-" * 10 + "+" + "-" * 18 + "+" + "-" * 9)
    p99_ratio = {}
    for cond, clabel in conds:
        for proxy, plabel in proxies:
            scen = "hedge_" + cond
            rps = med(data.get((proxy, scen, "rps"), {}))
            if rps is None:
                continue
            p50 = med(data.get((proxy, scen, "p50_ms"), {}))
            p99 = med(data.get((proxy, scen, "p99_ms"), {}))
            rs = per_round_ratio(data.get((proxy, scen, "p99_ms"), {}), data.get((proxy, "hedge_healthy", "p99_ms"), {}))
            ratio = statistics.median(rs) if rs else None
            p99_ratio[(proxy, cond)] = ratio
            hedged = med(data.get((proxy, scen, "hedged_pct"), {}))
            print("%-34s | %-22s | %-9.0f | %-8.3f | %-8.3f | %-16s | %-8s" % (
                clabel, plabel, rps, p50 or 0, p99 or 0, "%.2f" % ratio if ratio else "-",
                "%.2f" % hedged if hedged is not None else "-"))
    print()
    print("goals (issue #18):")
    for cond in ("stall5", "slow20"):
        r = p99_ratio.get(("ingressd", cond))
        h = p99_ratio.get(("haproxy", cond))
        if r is None:
            continue
        ng = p99_ratio.get(("nginx", cond))
        print("  [%s] %s: ingressd p99 <= 1.5x its healthy p99: %.2fx (HAProxy: %s%s)" % (
            "PASS" if r <= 1.5 else "FAIL", cond, r, "%.2fx" % h if h else "-",
            ", nginx + Lua: %.2fx" % ng if ng else ""))
        hedged = med(data.get(("ingressd", "hedge_" + cond, "hedged_pct"), {}))
        if hedged is not None:
            print("  [%s] %s: extra router calls <= 10%% of requests: %.2f%%" % ("PASS" if hedged <= 10 else "FAIL",
                                                                              cond, hedged))
    rs = per_round_ratio(data.get(("ingressd", "hedge_healthy", "rps"), {}), data.get(("nohedge", "hedge_healthy", "rps"), {}))
    if rs:
        lo, hi = min(rs), max(rs)
        print("  [%s] healthy routers: req/s hedge auto / hedge off = %.3f [%.3f-%.3f] (within noise: the range"
              " holds 1 or the median is within 3%%)" % ("PASS" if lo <= 1 <= hi or abs(statistics.median(rs) - 1) <= 0.03
                                                       else "FAIL", statistics.median(rs), lo, hi))
    return 0


def main():
    ap = argparse.ArgumentParser()
    sub = ap.add_subparsers(dest="cmd", required=True)
    w = sub.add_parser("wrk")
    w.add_argument("--file", required=True)
    w.add_argument("--round", required=True)
    w.add_argument("--proxy", required=True)
    w.add_argument("--scenario", required=True)
    w.add_argument("--cpu-ticks", type=float)
    w.add_argument("--clk-tck", type=float, default=100.0)
    w.add_argument("--core-busy", type=float)
    w.add_argument("--elapsed", type=float)
    w.add_argument("--load-core-busy", type=float)
    w.add_argument("--upstream-accepts", type=float)
    w.add_argument("--upstream-requests", type=float)
    j = sub.add_parser("json")
    j.add_argument("--json", required=True)
    j.add_argument("--round", required=True)
    j.add_argument("--proxy", required=True)
    j.add_argument("--scenario", required=True)
    j.add_argument("--keys")
    b = sub.add_parser("ab")
    b.add_argument("--results", required=True)
    h = sub.add_parser("hedge")
    h.add_argument("--results", required=True)
    t = sub.add_parser("table")
    t.add_argument("--results", required=True)
    t.add_argument("--quick", action="store_true")
    t.add_argument("--gate-ratio", type=float, default=2.0)
    a = ap.parse_args()
    if a.cmd == "wrk":
        cmd_wrk(a)
    elif a.cmd == "json":
        cmd_json(a)
    elif a.cmd == "ab":
        sys.exit(cmd_ab(a))
    elif a.cmd == "hedge":
        sys.exit(cmd_hedge(a))
    else:
        sys.exit(cmd_table(a))


if __name__ == "__main__":
    main()
