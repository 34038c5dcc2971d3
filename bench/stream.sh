#!/usr/bin/env bash
# Token streams at scale (issue #21): N concurrent SSE streams through the router path, new streams
# arriving as old ones end, through ingressd --threads 1, HAProxy 2.6 nbthread 1 + Lua and nginx +
# Lua (one worker), on bench/run.sh's fakes, topology and core layout, alternating order per round.
#
#   bench/stream.sh [--quick] [--rounds N] [--ns "500 2000 5000"] [--duration S] [--warmup S]
#                   [--rate MIN-MAX|auto] [--events MIN-MAX] [--stall-ms MS] [--proxies "ingressd haproxy nginx"]
#                   [--ingressd PATH] [--keep] [--syscalls] [--pause SHARE:MS]
#
# Each stream: a new client connection, POST /stream/v1/chat/completions (router call, then the
# stream app's replica), K events of ~100 bytes at R events/s (K uniform in --events, default
# 100-400; R uniform in --rate, default auto: 20-50 at N <= 500, scaled down above so that the
# total stays ~17k events/s, see rate_for), closed at its end and replaced by a new one. The
# replica and the client are C++ (bench/stream_replica.cpp, bench/stream_client.cpp, built with
# ingressd); the direct run (client straight to the replica) is the baseline of "added delay" and
# shows that the load side is not the limit. Per (round, N) all proxies start fresh.
#
# Layout (2 cores), as bench/run.sh: core 1 = the proxy under test, core 0 = the client, the
# replica and the nginx fakes (routers). Ports BENCH_PORT_BASE (default 19100) .. +40.
#
# --quick: 1 round, N = 500 and 2000, 5 s windows (~1.5 min). Exit status 1 when an ingressd run
# had a failed stream, or, while ingressd had its core (it waited <= 50 ms/s for it), a stalled
# stream (3 events in a row more than --stall-ms, default 100, later than the other streams' events
# of the same moment) or more batched events than the direct run; see bench/README.md "Token
# streams at scale".
set -euo pipefail

HERE=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
ROOT=$(dirname "$HERE")
LIB=$HERE/lib

ROUNDS=3
NS="500 2000 5000"
DURATION=8
WARMUP=4
RATE=auto
EVENTS=100-400
STALL_MS=100
KEEP=0
QUICK=0
PAUSE=""     # --pause SHARE:MS: that share of streams stop reading once for MS (the proxy's blocked-write path)
SYSCALLS=0   # --syscalls: count each proxy's system calls per event (perf trace -s) over the window
SEL_PROXIES=""
INGRESSD=${INGRESSD:-$ROOT/build/release/ingressd}
PORT_BASE=${BENCH_PORT_BASE:-19100}
WITH_NGINX=${BENCH_NGINX:-1}

usage() { sed -n '2,24p' "$0" | sed 's/^# \{0,1\}//'; }
while (($#)); do
  case $1 in
    --quick) QUICK=1; ROUNDS=1; NS="500 2000"; DURATION=5; WARMUP=3 ;;
    --rounds) ROUNDS=$2; shift ;;
    --ns) NS=$2; shift ;;
    --duration) DURATION=$2; shift ;;
    --warmup) WARMUP=$2; shift ;;
    --rate) RATE=$2; shift ;;
    --events) EVENTS=$2; shift ;;
    --stall-ms) STALL_MS=$2; shift ;;
    --proxies) SEL_PROXIES=$2; shift ;;
    --ingressd) INGRESSD=$2; shift ;;
    --keep) KEEP=1 ;;
    --syscalls) SYSCALLS=1 ;;
    --pause) PAUSE=$2; shift ;;
    -h|--help) usage; exit 0 ;;
    *) echo "unknown argument: $1" >&2; usage >&2; exit 2 ;;
  esac
  shift
done
[[ $ROUNDS =~ ^[1-9][0-9]*$ && $DURATION =~ ^[1-9][0-9]*$ && $WARMUP =~ ^[0-9]+$ ]] ||
  { echo "--rounds, --duration and --warmup take integers" >&2; exit 2; }
[[ -z $PAUSE || $PAUSE =~ ^0?\.[0-9]+:[0-9]+$ ]] || { echo "--pause takes SHARE:MS, e.g. 0.05:3000" >&2; exit 2; }
[[ ($RATE == auto || $RATE =~ ^[0-9]+-[0-9]+$) && $EVENTS =~ ^[0-9]+-[0-9]+$ ]] ||
  { echo "--rate takes MIN-MAX or auto, --events MIN-MAX" >&2; exit 2; }
# rate_for N: the per-stream event rate range. auto: 20-50 events/s (the issue's token rate) at
# N <= 500; above, scaled by 500/N so that the total stays at ~17k events/s. At 20-50 events/s,
# 2,000 streams are ~70k events/s: more than one load core can write and read here (the direct
# run at 500 streams already takes ~60 % of it) and more than one core of any of the three
# proxies relays (bench/README.md "Token streams at scale"). --rate 20-50 forces the issue's rate.
rate_for() {
  if [ "$RATE" != auto ]; then echo "$RATE"; return; fi
  local n=$1
  if ((n <= 500)); then echo 20-50; else echo "$(( (20 * 500 + n - 1) / n ))-$(( 50 * 500 / n ))"; fi
}

# shellcheck source=lib/common.sh
source "$LIB/common.sh"

need=(haproxy nginx python3 iproute2 util-linux)
((WITH_NGINX)) && need+=(libnginx-mod-http-lua lua-resty-core)
install_missing "${need[@]}"
[[ $(haproxy -vv 2>/dev/null) == *"Built with Lua"* ]] || { echo "this haproxy has no Lua support" >&2; exit 1; }

# the binaries: ingressd and the two C++ load programs, built with it when missing
BIN_DIR=$(dirname "$INGRESSD")
REPLICA_BIN=${BENCH_STREAM_REPLICA:-$BIN_DIR/ingressd-bench-stream-replica}
CLIENT_BIN=${BENCH_STREAM_CLIENT:-$BIN_DIR/ingressd-bench-stream-client}
if [ ! -x "$INGRESSD" ] || [ ! -x "$REPLICA_BIN" ] || [ ! -x "$CLIENT_BIN" ]; then
  log "building ingressd and the stream load programs (release)"
  (cd "$ROOT" && cmake --preset release >/dev/null &&
   cmake --build --preset release --target ingressd ingressd-bench-stream-replica ingressd-bench-stream-client >/dev/null)
  INGRESSD=$ROOT/build/release/ingressd
  REPLICA_BIN=$ROOT/build/release/ingressd-bench-stream-replica
  CLIENT_BIN=$ROOT/build/release/ingressd-bench-stream-client
fi
# ------------------------------------------------------------------ machine (lib/common.sh)
bench_machine
# A stream holds 2 descriptors in a proxy, 1 in the client; the replica holds one per pooled
# connection of the proxies of the round (ingressd and HAProxy keep ~N each, nginx 512) plus the
# running one's: ~3N. Root may
# raise the hard limit up to fs.nr_open; otherwise N is capped by what the hard limit allows.
WANT_NOFILE=65536
if (($(ulimit -Hn) < WANT_NOFILE)); then ulimit -Hn "$WANT_NOFILE" 2>/dev/null || true; fi
ulimit -n "$(ulimit -Hn)" 2>/dev/null || true
NOFILE=$(ulimit -n)
((NOFILE > WANT_NOFILE)) && { ulimit -n $WANT_NOFILE; NOFILE=$WANT_NOFILE; }
read -ra N_LIST <<<"$NS"
for n in "${N_LIST[@]}"; do
  [[ $n =~ ^[1-9][0-9]*$ ]] || { echo "--ns takes positive integers" >&2; exit 2; }
  if ((3 * n + 2000 > NOFILE)); then
    log "WARNING: ulimit -n is $NOFILE (hard $(ulimit -Hn)): N=$n needs ~$((3 * n + 2000)); skipped"
  fi
done

# ------------------------------------------------------------------ ports and temp dir (run.sh's layout)
P_ING=$((PORT_BASE + 0)); P_ING_ADMIN=$((PORT_BASE + 1)); P_HAP=$((PORT_BASE + 2)); P_NGX=$((PORT_BASE + 3))
REPLICA_PORTS=($((PORT_BASE + 10)) $((PORT_BASE + 11)) $((PORT_BASE + 12)) $((PORT_BASE + 13)))
ROUTER_PORTS=($((PORT_BASE + 20)) $((PORT_BASE + 21)))
P_SSE=$((PORT_BASE + 30)); P_SSE_ROUTER=$((PORT_BASE + 31)); P_STATUS=$((PORT_BASE + 40))
REPLICA_NAMES=(r1 r2 r3 r4)
NODE_IP=127.0.0.2
for p in $P_ING $P_ING_ADMIN $P_HAP $P_NGX "${REPLICA_PORTS[@]}" "${ROUTER_PORTS[@]}" $P_SSE $P_SSE_ROUTER $P_STATUS; do
  if [ -n "$(ss -Htln "sport = :$p")" ]; then echo "port $p is in use; set BENCH_PORT_BASE to a free range" >&2; exit 1; fi
done

TMP=$(mktemp -d /tmp/ingressd-stream-bench.XXXXXX)
start_run results.jsonl

# private copies of the binaries: a rebuild of the checkout during the run must not swap them
cp "$INGRESSD" "$TMP/ingressd"; INGRESSD=$TMP/ingressd
cp "$REPLICA_BIN" "$TMP/stream-replica"; REPLICA_BIN=$TMP/stream-replica
cp "$CLIENT_BIN" "$TMP/stream-client"; CLIENT_BIN=$TMP/stream-client

# ------------------------------------------------------------------ fakes, topology, proxy configs (lib/common.sh)
render_nginx_fakes 1 >"$TMP/nginx.conf"
render_topology "$TMP/topology.json"
ingressd_yaml >"$TMP/ingressd.yaml"
render_irr_tables stream.sh >"$TMP/irr_tables.lua"
cp "$HERE/haproxy/ingress_request_router.lua" "$TMP/ingress_request_router.lua"
haproxy_cfg "$P_HAP" 1 >"$TMP/haproxy.cfg"
haproxy -c -q -f "$TMP/haproxy.cfg" >"$TMP/haproxy-check.log" 2>&1 || { cat "$TMP/haproxy-check.log" >&2; exit 1; }
((WITH_NGINX)) && render_nginx "$TMP/ngx1" "$P_NGX" 1
PROXIES=(ingressd haproxy); ((WITH_NGINX)) && PROXIES+=(nginx)
if [ -n "$SEL_PROXIES" ]; then read -ra PROXIES <<<"$SEL_PROXIES"; fi

# tcp_counters: the kernel's TCP trouble counters, "name value" lines (machine-wide: other tenants'
# traffic counts too). A stream stalled by the kernel (a drop and its retransmission, 200 ms+
# on loopback; a full listen queue; a pruned receive queue) shows here, a proxy's own stall not.
TCP_KEYS="RetransSegs ListenOverflows ListenDrops TCPTimeouts TCPLossProbes TCPSynRetrans PruneCalled RcvPruned TCPRcvCollapsed TCPBacklogDrop TCPRcvQDrop TCPZeroWindowDrop TCPToZeroWindowAdv"
tcp_counters() {
  awk -v keys="$TCP_KEYS" 'BEGIN {n = split(keys, k, " "); for (i = 1; i <= n; i++) want[k[i]] = 1}
    $1 == "TcpExt:" || $1 == "Tcp:" { if (!hdr[$1]) { hdr[$1] = 1; for (i = 2; i <= NF; i++) name[$1, i] = $i; next }
      for (i = 2; i <= NF; i++) if (want[name[$1, i]]) print name[$1, i], $i }' /proc/net/netstat /proc/net/snmp
}
tcp_delta_json() { # before-file after-file: {"name":delta,...} of the counters that moved
  awk 'NR == FNR {a[$1] = $2; next} {d = $2 - a[$1]; if (d) s = s sprintf("%s\"%s\":%d", (s ? "," : ""), $1, d)}
       END {printf "{%s}", s}' "$1" "$2"
}

# run_streams ROUND N PROXY|direct: one client run, its JSON line appended to the results
run_streams() {
  local round=$1 n=$2 proxy=$3 port pid json rate
  rate=$(rate_for "$n")
  local args=(--n "$n" --warmup "$WARMUP" --duration "$DURATION" --ramp 1 --stall-ms "$STALL_MS"
              --rate-min "${rate%-*}" --rate-max "${rate#*-}" --ev-min "${EVENTS%-*}" --ev-max "${EVENTS#*-}"
              --seed $((round * 1000 + n)) --aux-pid "$REPLICA_PID")
  [ -n "$PAUSE" ] && args+=(--pause-share "${PAUSE%:*}" --pause-ms "${PAUSE#*:}")
  if [ "$proxy" = direct ]; then port=$P_SSE
  else
    port=$(proxy_port "$proxy"); pid=$(proxy_pid "$proxy")
    for p in $(proc_family "$pid"); do args+=(--pid "$p"); done
  fi
  tcp_counters >"$TMP/tcp0"
  local tracer="" trace_out=$TMP/syscalls-$round-$n-$proxy.txt
  if ((SYSCALLS)) && [ "$proxy" != direct ]; then
    # perf trace over the measured window only (its overhead makes this run's timings worthless;
    # the counts per event are what it is for)
    (sleep "$WARMUP"; exec timeout -s INT "$DURATION" perf trace -s -o "$trace_out" -p "$(proc_family "$pid" | paste -sd,)") \
      >/dev/null 2>&1 &
    tracer=$!
  fi
  # BENCH_STREAM_HOG=PROXY:K: K busy loops on the proxy core, at the bench's priority, during that
  # proxy's runs: a co-tenant on its core (how the "few streams exploded" runs are reproduced,
  # bench/README.md "Token streams at scale")
  local hogs=()
  if [[ ${BENCH_STREAM_HOG:-} == "$proxy":* ]]; then
    for _ in $(seq "${BENCH_STREAM_HOG#*:}"); do
      start_bg hog "$PROXY_CORE" sh -c 'while :; do :; done'; hogs+=("$LAST_PID")
    done
  fi
  json=$(taskset -c "$LOAD_CORE" "$CLIENT_BIN" --port "$port" "${args[@]}") || true
  for h in "${hogs[@]}"; do stop_pid "$h"; done
  [ -n "$tracer" ] && { wait "$tracer" 2>/dev/null || true; }
  tcp_counters >"$TMP/tcp1"
  [ -n "$json" ] || { log "[r$round] N=$n $proxy: the client printed nothing"; return 0; }
  json="{\"round\":$round,\"rate\":\"$rate\",\"proxy\":\"$proxy\",\"load\":$(cut -d' ' -f1 /proc/loadavg),\"tcp\":$(tcp_delta_json "$TMP/tcp0" "$TMP/tcp1"),${json#\{}"
  if [ -n "$tracer" ] && [ -s "$trace_out" ]; then
    # "syscall calls ..." rows of perf trace -s, summed over threads -> per relayed event
    json="${json%\}},\"syscalls\":$(awk -v ev="$(grep -o '"events":[0-9]*' <<<"$json" | head -1 | cut -d: -f2)" '
      $2 ~ /^[0-9]+$/ && $1 ~ /^[a-z_0-9]+$/ && NF >= 8 {c[$1] += $2}
      END {for (k in c) if (c[k] / ev >= 0.01) s = s sprintf("%s\"%s\":%.3f", (s ? "," : ""), k, c[k] / ev); printf "{%s}", s}' "$trace_out")}"
  fi
  echo "$json" >>"$RESULTS"
  log "[r$round] N=$n $proxy: $(python3 "$LIB/stream_report.py" line --json "$json")"
}

T_START=$(date +%s)
log "temp dir $TMP; ingressd $INGRESSD; rounds=$ROUNDS N=(${N_LIST[*]}) window=${WARMUP}+${DURATION}s rate=$RATE/s events=$EVENTS; ulimit -n $NOFILE; $PRIO"
log "load now: $(uptime)"
start_bg nginx "$LOAD_CORE" nginx -p "$TMP" -c "$TMP/nginx.conf"
start_bg replica "$LOAD_CORE" "$REPLICA_BIN" --listen "127.0.0.1:$P_SSE"
REPLICA_PID=$LAST_PID
wait_port 127.0.0.1 "${REPLICA_PORTS[0]}"; wait_port 127.0.0.1 "$P_SSE"; wait_port $NODE_IP "${ROUTER_PORTS[0]}"

for ((r = 1; r <= ROUNDS; r++)); do
  # odd rounds: ingressd, haproxy, nginx; even rounds the reverse, so drift cancels out
  if ((r % 2)); then ORDER=("${PROXIES[@]}"); else ORDER=(); for p in "${PROXIES[@]}"; do ORDER=("$p" "${ORDER[@]}"); done; fi
  for n in "${N_LIST[@]}"; do
    ((3 * n + 2000 > NOFILE)) && continue
    # fresh proxies per N: "RSS idle" is then a process that has not yet held any stream
    start_proxies 1
    run_streams "$r" "$n" direct
    for p in "${ORDER[@]}"; do run_streams "$r" "$n" "$p"; done
    stop_proxies
  done
done

echo
echo "token streams: ingressd --threads 1 vs $(haproxy -v 2>/dev/null | awk 'NR==1{print $1, $3}') nbthread 1 + Lua$( ((WITH_NGINX)) && echo " vs nginx $(nginx -v 2>&1 | sed 's|.*/||') 1 worker + Lua");" \
     "proxy on core $PROXY_CORE, client + replica + fakes on core $LOAD_CORE; $ROUNDS round(s), N=(${N_LIST[*]}), ${DURATION}s windows after ${WARMUP}s;" \
     "$RATE events/s, $EVENTS events per stream; loadavg at end $(cut -d' ' -f1-3 /proc/loadavg); wall time $(( $(date +%s) - T_START ))s"
echo
python3 "$LIB/stream_report.py" table --results "$RESULTS" --stall-ms "$STALL_MS"
