#!/usr/bin/python3
"""bench/grpc.sh's table: its results TSV (round, proxy, scenario, metric, value) -> one table with
direct, HAProxy and ingressd side by side (median over rounds, [min-max] when there are several),
the ratio ingressd/HAProxy (median of the per-round ratios [min-max]), then the issue's goals.

    python3 bench/lib/grpc_report.py --results results.tsv [--hap-label "HAProxy 2.6.12"]
"""
import argparse
import collections
import statistics
import sys

PROXIES = ["direct", "haproxy", "ingressd"]

# (metric, label, format, ratio?, aggregate: "median" or "sum")
UNARY_ROWS = [
    ("calls_s", "calls/s", "{:,.0f}", True, "median"),
    ("cpu_us", "proxy CPU us/call", "{:.2f}", True, "median"),
    ("lat_mean_ms", "mean call latency ms (h2load)", "{:.3f}", True, "median"),
    ("proxy_core_share", "proxy's share of its core %", "{:.0f}", False, "median"),
    ("others_on_core", "others on the proxy core %", "{:.0f}", False, "median"),
    ("load_core_busy", "load core busy %", "{:.0f}", False, "median"),
    ("replica_per_call", "replica calls per client call", "{:.3f}", False, "median"),
    ("upstream_conns_open", "upstream conns open at end", "{:.0f}", False, "median"),
    ("upstream_conns_new", "new upstream conns in the run", "{:.0f}", False, "median"),
    ("errors", "errors (failed + non-2xx, sum)", "{:.0f}", False, "sum"),
]
STREAM_ROWS = [
    ("delay_p50_ms", "message delay p50 ms", "{:.3f}", True, "median"),
    ("delay_p99_ms", "message delay p99 ms", "{:.3f}", True, "median"),
    ("delay_max_ms", "message delay max ms", "{:.2f}", True, "median"),
    ("held_back", "held-back messages (sum)", "{:.0f}", False, "sum"),
    ("failed_streams", "failed streams (sum)", "{:.0f}", False, "sum"),
    ("messages", "messages received (sum)", "{:,.0f}", False, "sum"),
    ("cpu_us_per_msg", "proxy CPU us/message", "{:.2f}", True, "median"),
    ("proxy_runq_ms", "proxy waited for its core ms (sum)", "{:.1f}", False, "sum"),
    ("client_runq_ms", "client waited for its core ms (sum)", "{:.1f}", False, "sum"),
]


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--results", required=True)
    ap.add_argument("--hap-label", default="HAProxy")
    a = ap.parse_args()

    data = collections.defaultdict(dict)  # (proxy, scenario, metric) -> {round: value}
    for line in open(a.results):
        f = line.rstrip("\n").split("\t")
        if len(f) != 5:
            continue
        try:
            data[(f[1], f[2], f[3])][int(f[0])] = float(f[4])
        except ValueError:
            pass
    rounds = sorted({r for v in data.values() for r in v})
    have_ing = any(k[0] == "ingressd" for k in data)
    scenarios = sorted({k[1] for k in data if k[1].startswith("unary_")},
                       key=lambda s: int(s.split("_c")[1].split("m")[0]))

    def agg(proxy, scen, metric, how):
        v = data.get((proxy, scen, metric), {})
        if not v:
            return None
        vals = [v[r] for r in sorted(v)]
        if how == "sum":
            return (sum(vals), None, None)
        return (statistics.median(vals), min(vals), max(vals))

    def cell(proxy, scen, metric, fmt, how):
        x = agg(proxy, scen, metric, how)
        if x is None:
            return "-"
        s = fmt.format(x[0])
        if how == "median" and len(rounds) > 1 and x[1] != x[2]:
            s += " [" + fmt.format(x[1]) + "-" + fmt.format(x[2]) + "]"
        return s

    def ratio(scen, metric):
        i = data.get(("ingressd", scen, metric), {})
        h = data.get(("haproxy", scen, metric), {})
        # a round where either side completed nothing has no ratio
        done = lambda p, r: data.get((p, scen, "calls_s" if scen != "stream" else "messages"), {}).get(r, 1) > 0
        rs = [i[r] / h[r] for r in sorted(i) if r in h and h[r] and done("ingressd", r) and done("haproxy", r)]
        if not rs:
            return None
        return statistics.median(rs), min(rs), max(rs)

    def ratio_cell(scen, metric):
        x = ratio(scen, metric)
        if x is None:
            return "-"
        s = "%.2f" % x[0]
        if len(rounds) > 1:
            s += " [%.2f-%.2f]" % (x[1], x[2])
        return s

    labels = {"direct": "direct (no proxy)", "haproxy": a.hap_label + " (h2)",
              "ingressd": "ingressd --threads 1"}
    cols = [p for p in PROXIES if p != "ingressd" or have_ing]
    head = ["", *[labels[p] for p in cols]] + (["ingressd/HAProxy"] if have_ing else [])
    table = [head]

    def block(title, scen, rows):
        table.append([title] + [""] * (len(head) - 1))
        for metric, label, fmt, has_ratio, how in rows:
            if not any(data.get((p, scen, metric)) for p in cols):
                continue
            row = ["  " + label] + [cell(p, scen, metric, fmt, how) for p in cols]
            if have_ing:
                row.append(ratio_cell(scen, metric) if has_ratio else "")
            table.append(row)

    for scen in scenarios:
        c, m = scen[len("unary_c"):].split("m")
        block("unary /bench.Echo/Unary, h2load -c%s -m%s (%d streams)" % (c, m, int(c) * int(m)), scen, UNARY_ROWS)
    block("server stream /bench.Echo/Stream (grpc_replica stream)", "stream", STREAM_ROWS)

    widths = [max(len(r[i]) for r in table) for i in range(len(head))]
    for r in table:
        if all(x == "" for x in r[1:]):
            print(r[0])
            continue
        print("  ".join((r[i].ljust(widths[i]) if i == 0 else r[i].rjust(widths[i])) for i in range(len(r))))
    print()
    print("rounds: %d; values are medians over rounds [min-max]; ratios are medians of per-round ratios [min-max]."
          % len(rounds))
    print("CPU: utime+stime of the proxy process (/proc/PID/stat) over the measured run / calls h2load completed.")

    # sanity: every call reached the replica, no errors, every stream complete
    problems = []
    for p in cols:
        for scen in scenarios:
            for r, v in data.get((p, scen, "calls_s"), {}).items():
                if v <= 0:
                    problems.append("%s %s round %d: no call completed" % (p, scen, r))
            e = agg(p, scen, "errors", "sum")
            if e and e[0] > 0:
                problems.append("%s %s: %d errors" % (p, scen, e[0]))
            c, m = scen[len("unary_c"):].split("m")
            limit = 2 * int(c) * int(m)  # in flight when the warm-up and the measured run stopped
            for r, v in data.get((p, scen, "replica_extra"), {}).items():
                if not 0 <= v <= limit:
                    problems.append("%s %s round %d: the replica served %+d calls vs h2load's (want 0..%d)"
                                    % (p, scen, r, v, limit))
        for r, v in data.get((p, "stop", "exit_status"), {}).items():
            if v not in (0, 143):
                problems.append("%s round %d: exit status %d on SIGTERM%s" % (p, r, v, " (SIGSEGV)" if v == 139 else ""))
        fs = agg(p, "stream", "failed_streams", "sum")
        if fs and fs[0] > 0:
            problems.append("%s: %d failed streams" % (p, fs[0]))
    print("checks: " + ("every call h2load completed was served by the replica (the rest: in flight at the end),"
                        " no errors, every stream complete"
                        if not problems else "PROBLEMS: " + "; ".join(problems)))
    print()
    if not have_ing:
        print("goals (issue #20): not judged: no ingressd with --grpc-listen in this run")
        return 0
    print("goals (issue #20):")
    for scen in scenarios:
        x = ratio(scen, "cpu_us")
        if x is None:
            print("  CPU per unary call <= HAProxy's, %s: no data" % scen)
            continue
        verdict = "PASS" if x[0] <= 1.0 else "MISS"
        print("  CPU per unary call <= HAProxy's, %s: ingressd/HAProxy %.2f [%.2f-%.2f]: %s"
              % (scen, x[0], x[1], x[2], verdict))
    hb = agg("ingressd", "stream", "held_back", "sum")
    if not agg("ingressd", "stream", "messages", "sum") or not agg("ingressd", "stream", "messages", "sum")[0]:
        hb = None
    hbh = agg("haproxy", "stream", "held_back", "sum")
    if hb is None:
        print("  no message of a stream held back: no data")
    else:
        pw = agg("ingressd", "stream", "proxy_runq_ms", "sum")
        cw = agg("ingressd", "stream", "client_runq_ms", "sum")
        hbd = agg("direct", "stream", "held_back", "sum")
        print("  no message of a stream held back: ingressd %d held back (HAProxy %s, direct %s: the host's"
              " noise floor): %s" % (hb[0], "%d" % hbh[0] if hbh else "-", "%d" % hbd[0] if hbd else "-",
                                    "PASS" if hb[0] == 0 else "MISS"))
        if hb[0]:
            print("    (in those runs ingressd waited %.1f ms and the client %.1f ms for a core: a process kept"
                  " off its core for >= 10 ms holds messages back too)" % (pw[0] if pw else 0, cw[0] if cw else 0))
    return 0


if __name__ == "__main__":
    sys.exit(main())
