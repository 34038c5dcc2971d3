#!/usr/bin/env python3
"""bench/stream.sh's report: one line per client run (`line`), the tables and goals (`table`).

Input: the JSON lines of bench/stream_client.cpp, each with round, proxy and load added by
stream.sh. Figures are medians over rounds with [min-max]; ratios and differences against
other proxies are taken per round (same N, same round: the same host conditions) and then the
median. Exit status of `table`: 1 when an ingressd run had a stalled stream, a batched event or
failed streams (the check for the per-stream delay explosion of issue #21).
"""
import argparse
import json
import statistics
import sys

PEERS = ("haproxy", "nginx")


def fmt(v, unit=""):
    if v is None:
        return "-"
    if abs(v) >= 100:
        return "%.0f%s" % (v, unit)
    if abs(v) >= 10:
        return "%.1f%s" % (v, unit)
    return "%.2f%s" % (v, unit)


def summary(vals, unit=""):
    vals = [v for v in vals if v is not None]
    if not vals:
        return "-"
    m = statistics.median(vals)
    if len(vals) == 1:
        return fmt(m, unit)
    return "%s [%s–%s]" % (fmt(m, unit), fmt(min(vals)), fmt(max(vals)))


def derived(r):
    """Figures computed from one run's JSON."""
    d = dict(r)
    d["cpu_pct"] = 100.0 * r["proxy_cpu_s"] / r["window_s"] if r["proxy"] != "direct" else None
    d["saturated"] = d["cpu_pct"] is not None and d["cpu_pct"] >= 90
    d["rss_kb_per_stream"] = r["rss_bytes_per_stream"] / 1000.0 if r["proxy"] != "direct" else None
    d["excess_p999_ms"] = r["excess_p999_us"] / 1000.0 if r.get("excess_p999_us", -1) >= 0 else None
    for k in ("delay_p50_us", "delay_p99_us", "delay_p999_us", "delay_max_us", "ttft_p50_us", "ttft_p99_us"):
        d[k.replace("_us", "_ms")] = r[k] / 1000.0 if r[k] >= 0 else None
    cores = r.get("core_busy_pct") or []
    d["load_core_pct"] = cores[0] if cores else None
    d["proxy_core_pct"] = cores[1] if len(cores) > 1 else None
    if r["proxy"] == "direct":
        d["cpu_us_per_event"] = d["events_per_core_s"] = None
    return d


def line(args):
    r = derived(dict(json.loads(args.json), proxy="x"))
    worst = r.get("worst") or []
    print("events/s %.0f, cpu/event %.1f us (%.0f%% core), delay p50/p99/p999 %.3f/%.3f/%.3f ms max %.1f ms, "
          "sys share %s,%s batched %d, beyond-median p99.9 %s ms, stalled %d%s, ttft p50/p99 %.2f/%.2f ms, rss/stream %.0f B, errors %d%s, "
          "cores %s, client %.0f%%, replica %.0f%%, replica late p99 %.2f ms, run-queue wait ms/s proxy %s replica %s client %s, tcp %s"
          % (r["events_per_s"], r["cpu_us_per_event"], r["cpu_pct"], r["delay_p50_ms"], r["delay_p99_ms"],
             r["delay_p999_ms"], r["delay_max_ms"], fmt(r.get("proxy_sys_share")),
             (" paused %d streams," % r["paused_streams"]) if r.get("paused_streams") else "", r["batched"], fmt(r["excess_p999_ms"]), r["stalled_streams"],
             (" worst " + json.dumps(worst[:2])) if worst else "", r["ttft_p50_ms"] or -1, r["ttft_p99_ms"] or -1,
             r["rss_bytes_per_stream"], r["errors"], (" (" + r["first_error"] + ")") if r["errors"] else "",
             r.get("core_busy_pct"), r["client_cpu_pct"], r["aux_cpu_pct"], r["replica_late_p99_us"] / 1000.0,
             fmt(r.get("proxy_runq_ms_per_s")), fmt(r.get("replica_runq_ms_per_s")), fmt(r.get("client_runq_ms_per_s")),
             json.dumps(r.get("tcp", {}))) + (", syscalls/event %s" % json.dumps(r["syscalls"]) if r.get("syscalls") else ""))


ROWS = [
    ("events relayed/s", "events_per_s", ""),
    ("proxy CPU, % of its core", "cpu_pct", ""),
    ("proxy CPU per event, µs", "cpu_us_per_event", ""),
    ("events per core-second (10^6 / CPU µs)", "events_per_core_s", ""),
    ("share of that CPU in the kernel (stime)", "proxy_sys_share", ""),
    ("delay per event p50, ms", "delay_p50_ms", ""),
    ("delay per event p99, ms", "delay_p99_ms", ""),
    ("delay per event p99.9, ms", "delay_p999_ms", ""),
    ("delay per event max, ms", "delay_max_ms", ""),
    ("batched events", "batched", ""),
    ("delay beyond the moment's median p99.9, ms", "excess_p999_ms", ""),
    ("stalled streams (an event > stall ms beyond it)", "stalled_streams", ""),
    ("TTFT of streams started meanwhile p50, ms", "ttft_p50_ms", ""),
    ("TTFT p99, ms", "ttft_p99_ms", ""),
    ("RSS per open stream, KB", "rss_kb_per_stream", ""),
    ("failed streams", "errors", ""),
    ("load core (client, replica, fakes) busy %", "load_core_pct", ""),
    ("proxy core busy % (all processes)", "proxy_core_pct", ""),
    ("proxy waiting for its core (run queue), ms/s", "proxy_runq_ms_per_s", ""),
    ("replica lateness p99, ms (its own schedule)", "replica_late_p99_ms", ""),
]


def table(args):
    runs = [derived(json.loads(l)) for l in open(args.results) if l.strip()]
    for r in runs:
        r["replica_late_p99_ms"] = r["replica_late_p99_us"] / 1000.0
    proxies = [p for p in ("direct", "ingressd", "haproxy", "nginx") if any(r["proxy"] == p for r in runs)]
    ns = sorted({r["n"] for r in runs})
    by = {}
    for r in runs:
        by.setdefault((r["n"], r["proxy"]), []).append(r)
    rc = 0
    goals = []
    unjudged = []

    def quiet(r):
        q = r.get("proxy_runq_ms_per_s")
        return r["proxy"] == "direct" or (q is not None and q <= args.max_runq_ms)

    def per_round(n, fn, only_quiet=False):
        """fn(runs of one round by proxy) -> value or None, over the rounds of N; only_quiet: only
        rounds in which no proxy waited more than --max-runq-ms for its core."""
        out = []
        for rnd in sorted({r["round"] for r in runs if r["n"] == n}):
            rr = {r["proxy"]: r for r in runs if r["n"] == n and r["round"] == rnd}
            if only_quiet and not all(quiet(r) for r in rr.values()):
                continue
            v = fn(rr)
            if v is not None:
                out.append(v)
        return out

    for n in ns:
        rates = sorted({r.get("rate", "?") for r in runs if r["n"] == n})
        print("N = %d concurrent streams, %s events/s each" % (n, "/".join(rates)))
        w = 46
        print("| %-*s | %s |" % (w, "", " | ".join(proxies)))
        print("|%s|%s" % ("-" * (w + 2), "---|" * len(proxies)))
        for label, key, unit in ROWS:
            cells = [summary([r.get(key) for r in by.get((n, p), [])], unit) for p in proxies]
            print("| %-*s | %s |" % (w, label, " | ".join(cells)))

        def added(key):
            return lambda p: per_round(n, lambda rr: rr[p][key] - rr["direct"][key]
                                       if p in rr and "direct" in rr and rr[p][key] is not None else None)
        for key, label in (("delay_p50_ms", "added delay p50 over direct, ms"),
                           ("delay_p99_ms", "added delay p99 over direct, ms"),
                           ("delay_p999_ms", "added delay p99.9 over direct, ms")):
            cells = [summary(added(key)(p)) if p != "direct" else "" for p in proxies]
            print("| %-*s | %s |" % (w, label, " | ".join(cells)))
        sat = [p for p in proxies if any(r["saturated"] for r in by.get((n, p), []))]
        if sat:
            print("saturated (proxy core >= 90 %% busy in some round): %s — its delays are queueing" % ", ".join(sat))

        # goals, per round against the better peer of that round
        def better(rr, key):
            vals = [rr[p][key] for p in PEERS if p in rr and rr[p].get(key) is not None]
            return min(vals) if vals else None
        if "ingressd" in proxies and any(p in proxies for p in PEERS):
            cpu_ratio = per_round(n, lambda rr: rr["ingressd"]["cpu_us_per_event"] / better(rr, "cpu_us_per_event")
                                  if "ingressd" in rr and better(rr, "cpu_us_per_event") else None)
            # delays only from rounds where every proxy had its core: else they measure the host
            p50_diff = per_round(n, lambda rr: (rr["ingressd"]["delay_p50_ms"] - better(rr, "delay_p50_ms")) * 1000
                                 if "ingressd" in rr and better(rr, "delay_p50_ms") is not None else None, only_quiet=True)
            rss_ratio = per_round(n, lambda rr: rr["ingressd"]["rss_bytes_per_stream"] / rr["haproxy"]["rss_bytes_per_stream"]
                                  if "ingressd" in rr and "haproxy" in rr and rr["haproxy"]["rss_bytes_per_stream"] > 0 else None)
            if cpu_ratio:
                m = statistics.median(cpu_ratio)
                goals.append((n, "CPU per event ≤ 0.5× the better peer", "%.2f× [%.2f–%.2f]" % (m, min(cpu_ratio), max(cpu_ratio)), m <= 0.5))
            if p50_diff:
                m = statistics.median(p50_diff)
                goals.append((n, "delay p50 ≤ the better peer's (quiet rounds: %d)" % len(p50_diff),
                              "%+.0f µs [%+.0f–%+.0f]" % (m, min(p50_diff), max(p50_diff)), m <= 0))
            else:
                goals.append((n, "delay p50 ≤ the better peer's", "no round where every proxy had its core", None))
            if rss_ratio:
                m = statistics.median(rss_ratio)
                goals.append((n, "RSS per stream ≤ HAProxy's", "%.2f× [%.2f–%.2f]" % (m, min(rss_ratio), max(rss_ratio)), m <= 1))
        if n == 2000 and (n, "ingressd") in by:
            p99 = [r["delay_p99_ms"] for r in by[(n, "ingressd")] if quiet(r)]
            if p99:
                m = statistics.median(p99)
                goals.append((n, "delay p99 ≤ 1 ms at 2,000 streams (quiet runs: %d)" % len(p99),
                              "%.2f ms [%.2f–%.2f]" % (m, min(p99), max(p99)), m <= 1))
            else:
                goals.append((n, "delay p99 ≤ 1 ms at 2,000 streams", "no run where ingressd had its core", None))
        print()

        direct_batched = {r["round"]: r["batched"] for r in by.get((n, "direct"), [])}
        for r in by.get((n, "ingressd"), []):
            # The direct run batches too on a busy host: the client and the replica share the load
            # core, and a client that was off it for a gap reads two events at once. Batching
            # counts against the proxy beyond 3x the direct run's of the same round + 0.1 %.
            allowed = 3 * direct_batched.get(r["round"], 0) + 0.001 * r["events"]
            r = dict(r, batched=r["batched"] if r["batched"] > allowed else 0)
            if r["errors"]:
                rc = 1
                print("CHECK FAILED: ingressd, N=%d, round %d: %d failed streams (%s)" % (n, r["round"], r["errors"], r["first_error"]))
            if not (r["stalled_streams"] or r["batched"]):
                continue
            what = "%d stalled stream(s), %d batched events" % (r["stalled_streams"], r["batched"])
            if r["stalled_streams"]:
                what += ", worst %s" % json.dumps(r.get("worst", [])[:2])
            # A proxy that waited long for its core (other processes on it: a shared host) falls
            # behind, then serves its backlog stream after stream: the last ones served are late
            # beyond the moment's median and send what piled up together, whatever the proxy
            # does. Such a run is reported, not judged (bench/README.md "Token streams at scale").
            runq = r.get("proxy_runq_ms_per_s")
            if runq is None or runq > args.max_runq_ms:
                print("not judged: ingressd, N=%d, round %d: %s, while it waited %s ms/s for its core (> %g)"
                      % (n, r["round"], what, fmt(runq), args.max_runq_ms))
                unjudged.append(r)
            else:
                rc = 1
                print("CHECK FAILED: ingressd, N=%d, round %d (it waited %s ms/s for its core): %s" % (n, r["round"], fmt(runq), what))
        for p in PEERS:
            for r in by.get((n, p), []):
                if r["stalled_streams"] or r["batched"] or r["errors"]:
                    print("note: %s, N=%d, round %d: %d stalled, %d batched, %d failed (waited %s ms/s for its core)"
                          % (p, n, r["round"], r["stalled_streams"], r["batched"], r["errors"],
                             fmt(r.get("proxy_runq_ms_per_s"))))
    # Delay against how long the proxy waited for its core: what a shared host does to every proxy
    bins = ((0, 50, "< 50"), (50, 300, "50-300"), (300, 1e9, "> 300"))
    print("delay p99 (ms) by how long the proxy waited for its core (run queue, ms/s), all N: median [range] (runs)")
    print("| proxy | " + " | ".join("wait %s ms/s" % b[2] for b in bins) + " |")
    print("|---|" + "---|" * len(bins))
    for p in proxies:
        if p == "direct":
            continue
        cells = []
        for lo, hi, _ in bins:
            v = [r["delay_p99_ms"] for r in runs if r["proxy"] == p and r.get("proxy_runq_ms_per_s") is not None
                 and lo <= r["proxy_runq_ms_per_s"] < hi]
            cells.append("%s (%d)" % (summary(v), len(v)) if v else "-")
        print("| %s | %s |" % (p, " | ".join(cells)))
    if goals:
        print()
        print("| N | goal (issue #21) | ingressd vs peers, median of per-round [range] | |")
        print("|---|---|---|---|")
        for n, g, v, ok in goals:
            print("| %d | %s | %s | %s |" % (n, g, v, "-" if ok is None else "PASS" if ok else "MISS"))
    print()
    print("stall check (every ingressd run: no stream with an event %g ms later than the other streams' events of the same moment, no more batched events than the direct run shows, no failed stream): %s%s"
          % (args.stall_ms, "FAIL" if rc else "ok",
             "; %d run(s) with stalls or batching not judged (the proxy waited > %g ms/s for its core)" % (len(unjudged), args.max_runq_ms) if unjudged else ""))
    return rc


def main():
    ap = argparse.ArgumentParser()
    sub = ap.add_subparsers(dest="cmd", required=True)
    a = sub.add_parser("line")
    a.add_argument("--json", required=True)
    a = sub.add_parser("table")
    a.add_argument("--results", required=True)
    a.add_argument("--stall-ms", type=float, default=100)
    a.add_argument("--max-runq-ms", type=float, default=50,
                   help="runs where the proxy waited longer than this per second for its core are not judged")
    args = ap.parse_args()
    if args.cmd == "line":
        line(args)
        return 0
    return table(args)


if __name__ == "__main__":
    sys.exit(main())
