#!/usr/bin/env python3
"""Result bookkeeping for bench/tls.sh (the TLS termination benchmark, issue #19).

  tls_report.py wrk   --file OUT --round R --proxy P --scenario S --cpu-ticks T --clk-tck HZ
                      [--core-busy PCT --load-core-busy PCT --elapsed S]
                      [--upstream-accepts N --upstream-requests N]
                      [--tls-full N --tls-resumed N --tls-failed N]
      parse one `wrk --latency` output, print result rows (TSV: round proxy scenario metric value)
  tls_report.py json  --json '{...}' --round R --proxy P --scenario S [--keys a,b,c]
      turn one JSON object (tls_ttft.py / tls_idle_conns.py output) into result rows
  tls_report.py table --results results.tsv
      one table per measurement (medians over rounds [min-max], ratio = median of the per-round
      ratios ingressd/HAProxy [min-max]), then the issue's goals with PASS/MISS
"""
import argparse
import statistics

# the wrk parsing, JSON rows and table cells of bench/run.sh's report (same directory)
from report import cmd_json, fmt_cell, load, med, parse_wrk, per_round_ratio, ratio_cell

PROXIES = ("ingressd", "haproxy")


def cmd_wrk(a):
    with open(a.file) as f:
        w = parse_wrk(f.read())
    n = w["requests"]
    rows = {
        "rps": (n - w["non2xx"]) / w["seconds"] if w["seconds"] else 0.0,
        "p50_ms": w.get("p50_ms"),
        "p99_ms": w.get("p99_ms"),
        "errors": w["non2xx"] + w["sock_errors"],
        "requests": n,
    }
    if n:
        rows["cpu_us"] = a.cpu_ticks / a.clk_tck * 1e6 / n
    if a.core_busy is not None:
        rows["core_busy"] = a.core_busy
    if a.load_core_busy is not None:
        rows["load_core_busy"] = a.load_core_busy
    if a.elapsed:
        rows["cpu_pct"] = a.cpu_ticks / a.clk_tck / a.elapsed * 100.0
        if a.core_busy is not None:
            rows["foreign_pct"] = max(0.0, a.core_busy - rows["cpu_pct"])
    if a.upstream_accepts is not None and n:
        rows["new_conns_per_req"] = max(0, a.upstream_accepts) / n
    if a.upstream_requests is not None and n:
        rows["upstream_reqs_per_req"] = max(0, a.upstream_requests) / n
    if a.listen_queue not in (None, ""):
        rows["listen_queue"] = float(a.listen_queue)
    if a.tls_full is not None:
        hs = a.tls_full + a.tls_resumed
        rows["tls_full"] = a.tls_full
        rows["tls_resumed"] = a.tls_resumed
        rows["tls_failed"] = a.tls_failed
        if hs:
            rows["resumed_pct"] = 100.0 * a.tls_resumed / hs
        if n:
            rows["hs_per_req"] = hs / n
    for k, v in rows.items():
        if v is not None:
            print("%s\t%s\t%s\t%s\t%.6g" % (a.round, a.proxy, a.scenario, k, v))


# ---------------------------------------------------------------- table

def handshake_rows(scen, kt):
    """Table 1's rows of one key type's full handshakes."""
    return [(scen, "rps", kt + ", full handshakes/s", "%.0f", True),
            (scen, "cpu_us", kt + ": proxy CPU us/handshake", "%.1f", True),
            (scen, "p99_ms", kt + ": p99 ms", "%.2f", True),
            (scen, "cap", kt + ": CPU-bound ceiling, handshakes/s", "%.0f", True),
            (scen, "core_busy", kt + ": proxy core busy %", "%.0f", False),
            (scen, "listen_queue", kt + ": listen queue mid-run (conns)", "%.0f", False),
            (scen, "resumed_pct", kt + ": resumed % (proxy's count)", "%.1f", False)]


TABLES = [
    ("1. New TLS connections: one GET /v1/models per connection (Connection: close), proxied to a replica",
     handshake_rows("hs_ecdsa", "ECDSA P-256") + handshake_rows("hs_rsa", "RSA 2048") +
     [("hs_ecdsa_resumed", "rps", "ref: ECDSA, wrk's resumption: conns/s", "%.0f", True),
      ("hs_ecdsa_resumed", "cpu_us", "ref: ECDSA, wrk's resumption: CPU us/conn", "%.1f", True),
      ("hs_ecdsa_resumed", "resumed_pct", "ref: ECDSA, wrk's resumption: resumed %", "%.1f", False),
      ("conn_http", "rps", "ref: plain HTTP, new conn/request: conns/s", "%.0f", True),
      ("conn_http", "cpu_us", "ref: plain HTTP, new conn: CPU us/conn", "%.1f", True),
      ("hs_ecdsa", "tls_us", "ECDSA full handshake minus plain conn: CPU us", "%.1f", True),
      ("hs_rsa", "tls_us", "RSA full handshake minus plain conn: CPU us", "%.1f", True)]),
    ("2. Kept-alive TLS connections (ECDSA certificate)",
     [("ka_plain", "rps", "plain path GET: req/s", "%.0f", True),
      ("ka_plain", "p50_ms", "plain path GET: p50 ms", "%.3f", True),
      ("ka_plain", "p99_ms", "plain path GET: p99 ms", "%.3f", True),
      ("ka_plain", "cpu_us", "plain path GET: proxy CPU us/req", "%.1f", True),
      ("ka_router", "rps", "router path POST: req/s", "%.0f", True),
      ("ka_router", "p50_ms", "router path POST: p50 ms", "%.3f", True),
      ("ka_router", "p99_ms", "router path POST: p99 ms", "%.3f", True),
      ("ka_router", "cpu_us", "router path POST: proxy CPU us/req", "%.1f", True),
      ("http_plain", "rps", "ref: no TLS, plain path GET: req/s", "%.0f", True),
      ("http_plain", "cpu_us", "ref: no TLS, plain path GET: CPU us/req", "%.1f", True),
      ("http_router", "rps", "ref: no TLS, router path POST: req/s", "%.0f", True),
      ("http_router", "cpu_us", "ref: no TLS, router path POST: CPU us/req", "%.1f", True)]),
    ("3. SSE over TLS through the router path (kept-alive connection; first event of 3, 5 ms apart)",
     [("sse_tls", "ttft_p50_ms", "TTFT p50 ms", "%.3f", True),
      ("sse_tls", "added_p50_ms", "TTFT added over direct (plain), p50 ms", "%.3f", True),
      ("sse_tls", "ttft_p99_ms", "TTFT p99 ms", "%.3f", True),
      ("sse_tls", "lag_p50_ms", "per-event delay p50 ms", "%.3f", True),
      ("sse_tls", "batched", "events batched (count)", "%.0f", False),
      ("sse_tls", "cpu_us", "proxy CPU us per stream", "%.0f", True),
      ("sse_tls", "errors", "errors", "%.0f", False)]),
    ("4. Idle TLS connections (handshake done, then idle; with --idle-request after one request): RSS growth / N",
     [("idle_tls", "bytes_per_conn", "RSS bytes per idle TLS conn", "%.0f", True),
      ("idle_tls", "held", "connections held", "%.0f", False),
      ("idle_tls", "open_seconds", "seconds to open them", "%.1f", True),
      ("idle_tls", "cpu_us", "proxy CPU us per conn (handshake, close)", "%.0f", True),
      ("idle_tls", "closed_in_sample", "closed by the proxy (of a sample)", "%.0f", False),
      ("idle_tls", "failed", "failed handshakes", "%.0f", False)]),
]
LOAD_SCENARIOS = ["hs_ecdsa", "hs_rsa", "hs_ecdsa_resumed", "conn_http", "ka_plain", "ka_router", "http_plain",
                  "http_router"]


def print_table(title, rows, data):
    head = ("metric", "ingressd", "haproxy", "ratio i/h")
    body = []
    for scen, metric, label, f, with_ratio in rows:
        di = data.get(("ingressd", scen, metric), {})
        dh = data.get(("haproxy", scen, metric), {})
        if not di and not dh:
            continue
        body.append((label, fmt_cell(di, f), fmt_cell(dh, f), ratio_cell(per_round_ratio(di, dh)) if with_ratio else ""))
    if not body:
        return
    widths = [max(len(r[i]) for r in [head] + body) for i in range(len(head))]
    print(title)
    print(" | ".join(h.ljust(w) for h, w in zip(head, widths)))
    print("-+-".join("-" * w for w in widths))
    for r in body:
        print(" | ".join(c.ljust(w) for c, w in zip(r, widths)))
    print()


def cmd_table(a):
    data = load(a.results)
    # derived, per round: TTFT added over the direct (plain) TTFT; a handshake's CPU over a
    # plain-HTTP connection's
    for proxy in PROXIES:
        t = data.get((proxy, "sse_tls", "ttft_p50_ms"), {})
        d = data.get(("direct", "sse_tls", "ttft_p50_ms"), {})
        for r, v in t.items():
            if r in d:
                data[(proxy, "sse_tls", "added_p50_ms")][r] = v - d[r]
        for scen in ("hs_ecdsa", "hs_rsa"):
            for r, v in data.get((proxy, scen, "cpu_us"), {}).items():
                if v:
                    data[(proxy, scen, "cap")][r] = 1e6 / v   # one core, 100 % busy, at this CPU/handshake
        base = data.get((proxy, "conn_http", "cpu_us"), {})
        for scen in ("hs_ecdsa", "hs_rsa"):
            for r, v in data.get((proxy, scen, "cpu_us"), {}).items():
                if r in base:
                    data[(proxy, scen, "tls_us")][r] = v - base[r]
    rounds = sorted({r for v in data.values() for r in v})
    for title, rows in TABLES:
        print_table(title, rows, data)
    print("cells: median over %d round(s) [min-max]; ratio: median of the per-round ratios ingressd/haproxy "
          "[min-max]" % len(rounds))

    notes = []
    d = data.get(("direct", "sse_tls", "ttft_p50_ms"), {})
    if d:
        notes.append("direct SSE TTFT p50 (client -> SSE replica, plain HTTP, no proxy): %s ms" % fmt_cell(d, "%.3f"))

    def per_proxy_notes(scens, title, cell):
        """One note per scenario: title % scen, then cell(proxy, metric -> {round: value}) of each
        proxy that has one."""
        for scen in scens:
            cells = []
            for proxy in PROXIES:
                c = cell(proxy, lambda metric: data.get((proxy, scen, metric), {}))
                if c:
                    cells.append(c)
            if cells:
                notes.append("%s: %s" % (title % scen, "; ".join(cells)))

    per_proxy_notes(LOAD_SCENARIOS, "proxy's share of its core, %s", lambda proxy, d: (
        "%s %s %% (others %s %%; load core %s %%; new upstream conns/req %s)" % (
            proxy, fmt_cell(d("cpu_pct"), "%.0f"), fmt_cell(d("foreign_pct"), "%.0f"),
            fmt_cell(d("load_core_busy"), "%.0f"), fmt_cell(d("new_conns_per_req"), "%.3f"))
        if d("cpu_pct") else None))
    per_proxy_notes(("hs_ecdsa", "hs_rsa", "hs_ecdsa_resumed"), "handshakes counted by the proxies, %s (all rounds)",
                    lambda proxy, d: (
        "%s full %d, resumed %d, failed %d, handshakes/request %s" % (
            proxy, sum(d("tls_full").values()), sum(d("tls_resumed").values()), sum(d("tls_failed").values()),
            fmt_cell(d("hs_per_req"), "%.3f"))
        if d("tls_full") or d("tls_resumed") else None))
    fo = [v for (proxy, scen, metric), dd in data.items() if metric == "foreign_pct" for v in dd.values()]
    if fo and (statistics.median(fo) > 10 or max(fo) > 25):
        notes.append("WARNING: other processes used the proxy core during the runs (median %.0f %%, max %.0f %%): "
                     "absolute numbers are depressed and noisy; compare the per-round ratios"
                     % (statistics.median(fo), max(fo)))
    errs = []
    for proxy in PROXIES:
        for scen in LOAD_SCENARIOS + ["sse_tls", "idle_tls"]:
            for metric in ("errors", "failed", "non200", "closed_in_sample"):
                tot = sum(data.get((proxy, scen, metric), {}).values())
                if tot:
                    errs.append("%s %s %s=%d" % (proxy, scen, metric, tot))
    notes.append("errors (wrk non-2xx and socket errors, TTFT errors, failed/closed idle conns): "
                 + (", ".join(errs) if errs else "none"))
    print()
    print("\n".join(notes))

    def m(proxy, scen, metric):
        return med(data.get((proxy, scen, metric), {}))

    def ratio(scen, metric):
        rs = per_round_ratio(data.get(("ingressd", scen, metric), {}), data.get(("haproxy", scen, metric), {}))
        return statistics.median(rs) if rs else None

    goals = []

    def goal(name, value, ok, shown, rs=None, line=1.0):
        if value is None:
            goals.append("  [ -- ] %s: not measured" % name)
            return
        if rs and len(rs) > 1 and min(rs) < line < max(rs):
            shown += "; the per-round ratios %.2f-%.2f straddle %g: within this run's noise" % (min(rs), max(rs), line)
        goals.append("  [%s] %s: %s" % ("PASS" if ok else "MISS", name, shown))

    def rounds_of(scen, metric):
        return per_round_ratio(data.get(("ingressd", scen, metric), {}), data.get(("haproxy", scen, metric), {}))

    for scen, kt in (("hs_ecdsa", "ECDSA P-256"), ("hs_rsa", "RSA 2048")):
        r = ratio(scen, "rps")
        busy = m("ingressd", scen, "core_busy")
        shown = "%.2fx (%.0f vs %.0f/s; CPU/handshake %.2fx)" % (
            r or 0, m("ingressd", scen, "rps") or 0, m("haproxy", scen, "rps") or 0, ratio(scen, "cpu_us") or 0)
        lq = m("ingressd", scen, "listen_queue")
        if busy is not None and busy < 90:
            if lq is not None and lq >= 8:
                shown += ("; ingressd's core only %.0f %% busy while %.0f connections waited in its listen queue "
                          "(accepted by the kernel, not yet by ingressd)" % (busy, lq))
            else:
                shown += "; ingressd's core only %.0f %% busy: the load side set this rate" % busy
        goal("new TLS handshakes/s >= HAProxy's, %s" % kt, r, r is not None and r >= 1.0, shown, rounds_of(scen, "rps"))
    for scen, path in (("ka_plain", "plain path GET"), ("ka_router", "router path POST")):
        r = ratio(scen, "cpu_us")
        goal("CPU per kept-alive TLS request <= HAProxy's, %s" % path, r, r is not None and r <= 1.0,
             "%.3fx (%.1f vs %.1f us)" % (r or 0, m("ingressd", scen, "cpu_us") or 0, m("haproxy", scen, "cpu_us") or 0),
             rounds_of(scen, "cpu_us"))
    r = ratio("ka_router", "rps")
    goal("router path req/s over TLS >= 4x HAProxy's", r, r is not None and r >= 4.0,
         "%.2fx (%.0f vs %.0f req/s)" % (r or 0, m("ingressd", "ka_router", "rps") or 0, m("haproxy", "ka_router", "rps") or 0),
         rounds_of("ka_router", "rps"), 4.0)
    r = ratio("idle_tls", "bytes_per_conn")
    goal("idle TLS connection RSS <= HAProxy's", r, r is not None and r <= 1.0,
         "%.2fx (%.0f vs %.0f bytes)" % (r or 0, m("ingressd", "idle_tls", "bytes_per_conn") or 0,
                                         m("haproxy", "idle_tls", "bytes_per_conn") or 0),
         rounds_of("idle_tls", "bytes_per_conn"))
    print()
    print("goals (issue #19):")
    print("\n".join(goals))
    return 0


def main():
    ap = argparse.ArgumentParser()
    sub = ap.add_subparsers(dest="cmd", required=True)
    w = sub.add_parser("wrk")
    w.add_argument("--file", required=True)
    w.add_argument("--round", required=True)
    w.add_argument("--proxy", required=True)
    w.add_argument("--scenario", required=True)
    w.add_argument("--cpu-ticks", type=int, required=True)
    w.add_argument("--clk-tck", type=float, default=100.0)
    w.add_argument("--core-busy", type=float)
    w.add_argument("--load-core-busy", type=float)
    w.add_argument("--elapsed", type=float)
    w.add_argument("--upstream-accepts", type=int)
    w.add_argument("--upstream-requests", type=int)
    w.add_argument("--tls-full", type=int)
    w.add_argument("--tls-resumed", type=int)
    w.add_argument("--tls-failed", type=int)
    w.add_argument("--listen-queue")
    j = sub.add_parser("json")
    j.add_argument("--json", required=True)
    j.add_argument("--round", required=True)
    j.add_argument("--proxy", required=True)
    j.add_argument("--scenario", required=True)
    j.add_argument("--keys")
    t = sub.add_parser("table")
    t.add_argument("--results", required=True)
    a = ap.parse_args()
    if a.cmd == "wrk":
        cmd_wrk(a)
    elif a.cmd == "json":
        cmd_json(a)
    else:
        raise SystemExit(cmd_table(a))


if __name__ == "__main__":
    main()
