#!/usr/bin/python3
"""bench/websocket.sh's table: its results TSV (round, proxy, scenario, metric, value) -> one table
with direct, ingressd, HAProxy and nginx side by side (median over rounds, [min-max] when there are
several), the ratios ingressd/HAProxy and ingressd/nginx (median of the per-round ratios
[min-max]), then the goals of issue #32 item 6:

  - CPU per message relayed <= the better (lower) of HAProxy's and nginx's, in each echo shape
    (per round: ingressd / min(HAProxy, nginx); the median of those);
  - memory per idle tunnel <= 0.5x HAProxy's (median of the per-round ratios).

    /usr/bin/python3 bench/lib/ws_report.py --results results.tsv [--hap-label ...] [--ngx-label ...]
"""
import argparse
import collections
import statistics

import report  # bench/lib/report.py: the ratio cell every bench table uses

PROXIES = ["direct", "ingressd", "haproxy", "nginx"]

# (scenario, metric, label, format, ratio?, aggregate)
ROWS = [
    ("c1", "rtt_p50_us", "echo c1: round trip p50 us", "{:.1f}", True, "median"),
    ("c1", "rtt_p99_us", "echo c1: round trip p99 us", "{:.1f}", True, "median"),
    ("c1", "cpu_us_per_msg", "echo c1: proxy CPU us/message", "{:.2f}", True, "median"),
    ("c1", "sys_us_per_msg", "echo c1: of which the kernel's (stime) us", "{:.2f}", True, "median"),
    ("c1", "others_on_core", "echo c1: others on the proxy core %", "{:.0f}", False, "median"),
    ("c64", "echoes_per_s", "echo c64 (closed loop): echoes/s", "{:,.0f}", True, "median"),
    ("c64", "rtt_p50_us", "echo c64: round trip p50 us", "{:.0f}", True, "median"),
    ("c64", "rtt_p99_us", "echo c64: round trip p99 us", "{:.0f}", True, "median"),
    ("c64", "cpu_us_per_msg", "echo c64: proxy CPU us/message", "{:.2f}", True, "median"),
    ("c64", "sys_us_per_msg", "echo c64: of which the kernel's (stime) us", "{:.2f}", True, "median"),
    ("c64", "proxy_core_share", "echo c64: proxy's share of its core %", "{:.0f}", False, "median"),
    ("c64", "load_core_busy", "echo c64: load core busy %", "{:.0f}", False, "median"),
    ("c64", "others_on_core", "echo c64: others on the proxy core %", "{:.0f}", False, "median"),
    ("paced", "rtt_p50_us", "echo paced: round trip p50 us", "{:.1f}", True, "median"),
    ("paced", "rtt_p99_us", "echo paced: round trip p99 us", "{:.1f}", True, "median"),
    ("paced", "cpu_us_per_msg", "echo paced: proxy CPU us/message", "{:.2f}", True, "median"),
    ("paced", "sys_us_per_msg", "echo paced: of which the kernel's (stime) us", "{:.2f}", True, "median"),
    ("paced", "late", "echo paced: messages due before the last echo came (sum)", "{:.0f}", False, "sum"),
    ("paced", "others_on_core", "echo paced: others on the proxy core %", "{:.0f}", False, "median"),
    ("idle", "kib_per_tunnel", "idle tunnels: proxy RSS KiB/tunnel", "{:.2f}", True, "median"),
    ("idle", "rss_before_kib", "idle tunnels: proxy RSS before, KiB", "{:,.0f}", False, "median"),
    ("idle", "rss_after_kib", "idle tunnels: proxy RSS after, KiB", "{:,.0f}", False, "median"),
    ("idle", "cpu_us_per_open", "idle tunnels: proxy CPU us per tunnel opened", "{:.1f}", True, "median"),
    ("idle", "opens_per_s", "idle tunnels: opened/s (250 in flight)", "{:,.0f}", False, "median"),
    ("idle", "replica_ws_opened", "idle tunnels: replica WebSockets opened", "{:,.0f}", False, "median"),
]
ERROR_ROWS = [("c1", "errors"), ("c64", "errors"), ("paced", "errors"), ("idle", "errors")]


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--results", required=True)
    ap.add_argument("--hap-label", default="HAProxy")
    ap.add_argument("--ngx-label", default="nginx")
    ap.add_argument("--rate", default="?")
    ap.add_argument("--idle-conns", default="?")
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
    present = [p for p in PROXIES if any(k[0] == p for k in data)]

    def agg(proxy, scen, metric, how):
        v = data.get((proxy, scen, metric), {})
        if not v:
            return None
        vals = [v[r] for r in sorted(v)]
        if how == "sum":
            return (sum(vals), None, None)
        return (statistics.median(vals), min(vals), max(vals))

    def cell(proxy, scen, metric, fmt, how):
        if proxy == "direct" and metric in ("cpu_us_per_msg", "sys_us_per_msg", "proxy_core_share", "kib_per_tunnel",
                                            "cpu_us_per_open", "rss_before_kib", "rss_after_kib"):
            return "-"
        x = agg(proxy, scen, metric, how)
        if x is None:
            return "-"
        s = fmt.format(x[0])
        if how == "median" and len(rounds) > 1 and x[1] != x[2]:
            s += " [" + fmt.format(x[1]) + "-" + fmt.format(x[2]) + "]"
        return s

    def per_round_ratios(scen, metric, other):
        i = data.get(("ingressd", scen, metric), {})
        rs = []
        for r in sorted(i):
            if other == "best":
                peers = [data.get((p, scen, metric), {}).get(r) for p in ("haproxy", "nginx")]
                peers = [x for x in peers if x]
                o = min(peers) if peers else None
            else:
                o = data.get((other, scen, metric), {}).get(r)
            if o:
                rs.append(i[r] / o)
        return rs

    def ratio_cell(scen, metric, other):
        return report.ratio_cell(per_round_ratios(scen, metric, other))

    labels = {"direct": "direct", "ingressd": "ingressd", "haproxy": a.hap_label, "nginx": a.ngx_label}
    head = ["row"] + [labels[p] for p in present]
    if "ingressd" in present and "haproxy" in present:
        head.append("ingressd/HAProxy")
    if "ingressd" in present and "nginx" in present:
        head.append("ingressd/nginx")
    print("Medians over %d round(s) [min-max]; ratios: median of per-round ratios [min-max]. 64-byte text"
          " messages; paced = 64 connections at %s messages/s in all; idle = %s tunnels." % (len(rounds), a.rate, a.idle_conns))
    print("CPU per message = the proxy's utime+stime over the measured echoes / messages relayed"
          " (2 per echo: one each way).")
    print()
    print("| " + " | ".join(head) + " |")
    print("|" + "---|" * len(head))
    for scen, metric, label, fmt, ratio, how in ROWS:
        row = [label] + [cell(p, scen, metric, fmt, how) for p in present]
        if "ingressd/HAProxy" in head:
            row.append(ratio_cell(scen, metric, "haproxy") if ratio else "")
        if "ingressd/nginx" in head:
            row.append(ratio_cell(scen, metric, "nginx") if ratio else "")
        print("| " + " | ".join(row) + " |")

    errs = []
    for p in present:
        for scen, metric in ERROR_ROWS:
            x = agg(p, scen, metric, "sum")
            if x and x[0]:
                errs.append("%s %s: %d" % (p, scen, x[0]))
            ok = data.get((p, scen, "ok"), {})
            bad = [r for r, v in ok.items() if not v]
            if bad:
                errs.append("%s %s: failed in round(s) %s" % (p, scen, ",".join(map(str, bad))))
        st = data.get((p, "stop", "exit_status"), {})
        bad = {r: int(v) for r, v in st.items() if int(v) not in (0, 143)}
        if bad:
            errs.append("%s: exit status on SIGTERM %s" % (p, bad))
    print()
    print("errors: " + ("; ".join(errs) if errs else "none"))
    # other work on the proxy core during a measured run moves its figures (bench/README.md, "How
    # to read the noise"): name the runs where others took over 25 % of it
    busy = []
    for (p, scen, metric), v in sorted(data.items()):
        if metric == "others_on_core":
            busy += ["r%d %s %s %.0f%%" % (r, scen, p, x) for r, x in sorted(v.items()) if x > 25]
    if busy:
        print("WARNING: others on the proxy core > 25 %% in %d run(s), their figures are noise: %s"
              % (len(busy), ", ".join(busy)))

    if "ingressd" not in present:
        return
    print()
    print("Goals (issue #32 item 6):")
    for scen, name in (("c1", "c1"), ("c64", "c64 closed loop"), ("paced", "paced")):
        rs = per_round_ratios(scen, "cpu_us_per_msg", "best")
        if not rs:
            continue
        m = statistics.median(rs)
        print("  CPU per message <= the better peer, %s: ingressd / min(HAProxy, nginx) = %.2f [%.2f-%.2f]  %s"
              % (name, m, min(rs), max(rs), "PASS" if m <= 1.0 else "MISS (%.0f %% over)" % (100 * (m - 1))))
    rs = per_round_ratios("idle", "kib_per_tunnel", "haproxy")
    if rs:
        m = statistics.median(rs)
        print("  memory per tunnel <= 0.5x HAProxy's: ingressd / HAProxy = %.2f [%.2f-%.2f]  %s"
              % (m, min(rs), max(rs), "PASS" if m <= 0.5 else "MISS (%.2fx the goal)" % (m / 0.5)))


if __name__ == "__main__":
    main()
