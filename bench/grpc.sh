#!/usr/bin/env bash
# gRPC over HTTP/2 (issue #20): ingressd --threads 1 (--grpc-listen, h2c) vs HAProxy 2.6 nbthread 1
# (Ray's gRPC rendering: a `proto h2` frontend, h2c `proto h2` backends, leastconn, the raw-HTTP/2
# Healthz check), both in front of the same fake replica, in one run.
#
#   bench/grpc.sh [--quick] [--rounds N] [--duration S] [--streams N] [--messages N]
#                 [--interval-ms MS] [--ingressd PATH] [--keep]
#
# Per round, direct (h2load -> replica), then each proxy (alternating order):
#   1. unary calls/s and proxy CPU per call at 64 concurrent streams: h2load -c4 -m16 and -c64 -m1,
#      POST /bench.Echo/Unary with one 100-byte gRPC message (content-type application/grpc,
#      te: trailers); the replica echoes it with grpc-status 0 in the trailers
#   2. server-stream message latency: --streams concurrent /bench.Echo/Stream calls of --messages
#      messages each, --interval-ms apart (grpc_replica stream): per-message delay p50/p99/max, and
#      HELD-BACK messages (a message that arrived in the same read as the stream's next one although
#      the replica sent them >= 10 ms apart: must be 0)
# Before the rounds every endpoint passes bench/lib/grpc_check.py (a real gRPC client: echoes,
# grpc-status 0 in the trailers, a server stream, Healthz, UNIMPLEMENTED relayed).
#
# --quick: 1 round, 4 s per h2load run, 100 messages per stream (~1 min). Default: 3 rounds x 8 s,
# 200 messages (~5 min). Layout (2 cores), as bench/run.sh: core 1 = the proxy under test, core 0 =
# h2load, the fake replica and the stream client. Ports BENCH_PORT_BASE (default 18900) .. +10.
# Without an ingressd that has --grpc-listen, direct and HAProxy run alone.
set -euo pipefail

HERE=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
ROOT=$(dirname "$HERE")
LIB=$HERE/lib

QUICK=0
ROUNDS=""
DURATION=""
STREAMS=50
MESSAGES=""
INTERVAL_MS=20
KEEP=0
INGRESSD=${INGRESSD:-$ROOT/build/release/ingressd}
PORT_BASE=${BENCH_PORT_BASE:-18900}
PY=/usr/bin/python3   # Debian's python: python3-grpcio lives there

usage() { sed -n '2,24p' "$0" | sed 's/^# \{0,1\}//'; }
while (($#)); do
  case $1 in
    --quick) QUICK=1 ;;
    --rounds) ROUNDS=$2; shift ;;
    --duration) DURATION=$2; shift ;;
    --streams) STREAMS=$2; shift ;;
    --messages) MESSAGES=$2; shift ;;
    --interval-ms) INTERVAL_MS=$2; shift ;;
    --ingressd) INGRESSD=$2; shift ;;
    --keep) KEEP=1 ;;
    -h|--help) usage; exit 0 ;;
    *) echo "unknown argument: $1" >&2; usage >&2; exit 2 ;;
  esac
  shift
done
if ((QUICK)); then
  ROUNDS=${ROUNDS:-1}; DURATION=${DURATION:-4}; WARMUP=1; MESSAGES=${MESSAGES:-100}
else
  ROUNDS=${ROUNDS:-3}; DURATION=${DURATION:-8}; WARMUP=2; MESSAGES=${MESSAGES:-200}
fi
for v in "$ROUNDS" "$DURATION" "$STREAMS" "$MESSAGES" "$INTERVAL_MS"; do
  [[ $v =~ ^[1-9][0-9]*$ ]] || { echo "--rounds, --duration, --streams, --messages and --interval-ms take positive integers" >&2; exit 2; }
done

# shellcheck source=lib/common.sh
source "$LIB/common.sh"

# ------------------------------------------------------------------ dependencies
install_missing haproxy nghttp2-client python3-grpcio g++ libnghttp2-dev pkg-config iproute2 util-linux
HAP_VERSION=$(haproxy -v 2>/dev/null); HAP_VERSION=${HAP_VERSION%%$'\n'*}
H2LOAD_VERSION=$(h2load --version 2>/dev/null | awk '{print $2}')

# ------------------------------------------------------------------ machine (lib/common.sh)
bench_machine
ulimit -n "$(ulimit -Hn)" 2>/dev/null || true

# ------------------------------------------------------------------ ports and temp dir
P_ING=$((PORT_BASE + 0)); P_ING_ADMIN=$((PORT_BASE + 1)); P_ING_GRPC=$((PORT_BASE + 2)); P_HAP=$((PORT_BASE + 3))
P_REPLICA=$((PORT_BASE + 10)); P_HOLDBACK=$((PORT_BASE + 11))
for p in $P_ING $P_ING_ADMIN $P_ING_GRPC $P_HAP $P_REPLICA $P_HOLDBACK; do
  if [ -n "$(ss -Htln "sport = :$p")" ]; then
    echo "port $p is in use; set BENCH_PORT_BASE to a free range" >&2; exit 1
  fi
done

TMP=$(mktemp -d /tmp/ingressd-grpc-bench.XXXXXX)
start_run results.tsv

# ingressd: only one whose --help has --grpc-listen; a private copy (a rebuild during the run, on a
# shared machine, must not swap the binary under us)
WITH_ING=0
if [ -x "$INGRESSD" ]; then
  for _ in $(seq 12); do
    if cp "$INGRESSD" "$TMP/ingressd" 2>/dev/null && "$TMP/ingressd" --version >/dev/null 2>&1; then break; fi
    rm -f "$TMP/ingressd"; sleep 5
  done
  if [ -x "$TMP/ingressd" ] && "$TMP/ingressd" --help 2>&1 | grep -q -- '--grpc-listen'; then
    WITH_ING=1; ING_SRC=$INGRESSD; INGRESSD=$TMP/ingressd
  fi
fi
((WITH_ING)) || log "no ingressd with --grpc-listen at $INGRESSD: direct and HAProxy only"

# ------------------------------------------------------------------ the fake replica (+ stream client)
log "building bench/grpc_replica.cpp"
# shellcheck disable=SC2046
g++ -std=c++20 -O2 -o "$TMP/grpc_replica" "$HERE/grpc_replica.cpp" $(pkg-config --cflags --libs libnghttp2)
REPLICA=$TMP/grpc_replica

# h2load's request body: one gRPC message (flag 0, length 100, 100 bytes)
{ printf '\x00\x00\x00\x00\x64'; head -c 100 /dev/zero | tr '\0' 'a'; } >"$TMP/unary.bin"

# ------------------------------------------------------------------ ingressd: topology and settings
cat >"$TMP/topology.json" <<EOF
{"target_groups": [{"app_name": "bench", "route_prefix": "/bench", "protocol": "gRPC",
  "targets": [{"ip": "127.0.0.1", "port": $P_REPLICA, "instance_id": "bench-node", "name": "SERVE_REPLICA::bench#B#r1"}]}]}
EOF
ingressd_yaml >"$TMP/ingressd.yaml"

# ------------------------------------------------------------------ HAProxy (Ray's gRPC rendering)
# The health check as Ray renders it (build_grpc_healthcheck_request_hex): a raw HTTP/2 client
# stream for one unary Healthz call (preface, empty SETTINGS, HEADERS with literal fields, DATA
# with an empty message and END_STREAM), `tcp-check expect string success`.
HC_HEX=$($PY - <<'EOF'
def lit(n, v):
    n, v = n.encode(), v.encode()
    return b"\x00" + bytes([len(n)]) + n + bytes([len(v)]) + v
def frame(t, f, sid, p):
    return len(p).to_bytes(3, "big") + bytes([t, f]) + sid.to_bytes(4, "big") + p
hb = b"".join(lit(k, v) for k, v in ((":method", "POST"), (":scheme", "http"),
     (":path", "/ray.serve.RayServeAPIService/Healthz"), (":authority", "localhost"),
     ("te", "trailers"), ("content-type", "application/grpc")))
print((b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n" + frame(4, 0, 0, b"") + frame(1, 4, 1, hb)
       + frame(0, 1, 1, b"\0" * 5)).hex())
EOF
)
cat >"$TMP/haproxy.cfg" <<EOF
# generated by bench/grpc.sh after Ray Serve's HAProxy template (grpc_frontend, h2c backends),
# see /work/shared/spec/ray-serve-ingress.md §2.3; global and defaults as bench/run.sh's
global
  nbthread 1
  maxconn 20000
  no strict-limits
  tune.bufsize 16384

defaults
  mode http
  balance leastconn
  option redispatch 1
  retry-on conn-failure
  option http-no-delay
  http-reuse always
  timeout connect 2s
  timeout client 3600s
  timeout server 300s
  timeout http-request 10s
  timeout http-keep-alive 75s

frontend grpc_frontend
  bind 127.0.0.1:$P_HAP proto h2
  # Ray routes by the 'application' metadata; with exactly one gRPC app every call goes to it
  default_backend grpc-bench

backend grpc-bench
  option tcp-check
  tcp-check connect
  tcp-check send-binary $HC_HEX
  tcp-check expect string success
  default-server inter 5s fastinter 250ms downinter 250ms fall 2 rise 2
  server SERVE_REPLICA__bench-B-r1 127.0.0.1:$P_REPLICA proto h2 check
EOF
haproxy -c -q -f "$TMP/haproxy.cfg" >"$TMP/haproxy-check.log" 2>&1 ||
  { cat "$TMP/haproxy-check.log" >&2; exit 1; }

# ------------------------------------------------------------------ helpers
proc_ticks() { awk '{printf "%d", $14 + $15}' "/proc/$1/stat" 2>/dev/null || echo 0; }
runq_wait_ns() { cat /proc/"$1"/task/*/schedstat 2>/dev/null | awk '{s += $2} END {printf "%d", s}'; }  # runnable, not running
replica_stats() { # the replica's counters (its /bench.Echo/Stats call, straight to it), one line "k=v ..."
  "$REPLICA" call --port "$P_REPLICA" --path /bench.Echo/Stats | sed -n 's/^message: //p'
}
stat_of() { grep -o "\b$1=[0-9]*" <<<"$2" | cut -d= -f2; }   # KEY LINE
grpc_check() { # name port
  local out
  out=$(taskset -c $LOAD_CORE $PY "$LIB/grpc_check.py" --name "$1" --port "$2") || { log "$out"; exit 1; }
  log "$out"
}
# once per run: the trailers as they arrive, through each endpoint (nghttp -v)
show_trailers() { # name port
  local t
  t=$(nghttp -v -d "$TMP/unary.bin" -H 'content-type: application/grpc' -H 'te: trailers' \
        "http://127.0.0.1:$2/bench.Echo/Unary" 2>&1 | awk '/recv \(stream_id=13\)/ {sub(/.*\) /, ""); printf "%s; ", $0}')
  log "$1: response fields (nghttp -v): $t"
}

ING_PID=""; HAP_PID=""
start_proxies() {
  start_bg haproxy "$PROXY_CORE" haproxy -db -f "$TMP/haproxy.cfg"
  HAP_PID=$LAST_PID
  if ((WITH_ING)); then
    start_bg ingressd "$PROXY_CORE" "${ING_ENV[@]}" "$INGRESSD" --config "$TMP/ingressd.yaml" --threads 1 \
      --topology-file "$TMP/topology.json" --listen "127.0.0.1:$P_ING" --admin-listen "127.0.0.1:$P_ING_ADMIN" \
      --grpc-listen "127.0.0.1:$P_ING_GRPC" --node-ip 127.0.0.1
    ING_PID=$LAST_PID
    wait_port 127.0.0.1 "$P_ING_GRPC" || { tail -20 "$TMP/ingressd.log" >&2; exit 1; }
  fi
  wait_port 127.0.0.1 "$P_HAP" || { tail -20 "$TMP/haproxy.log" >&2; exit 1; }
}
stop_proxies() { # ROUND: SIGTERM each proxy, up to 5 s to go; its exit status goes to the results
  local name pid rc keep p
  for name in ingressd haproxy; do
    pid=$(proxy_pid "$name")
    [ -n "$pid" ] || continue
    kill -0 "$pid" 2>/dev/null || log "ERROR: $name (pid $pid) died during the run (see $TMP/$name.log)"
    kill -TERM "$pid" 2>/dev/null || true
    for _ in $(seq 50); do kill -0 "$pid" 2>/dev/null || break; sleep 0.1; done
    kill -KILL "$pid" 2>/dev/null || true
    rc=0; wait "$pid" 2>/dev/null || rc=$?
    keep=(); for p in "${PIDS[@]}"; do [ "$p" = "$pid" ] || keep+=("$p"); done; PIDS=("${keep[@]}")
    emit "$1" "$name" stop exit_status "$rc"
    # 0 or 143 (SIGTERM's default action) is a clean stop; 139 = SIGSEGV, 137 = killed after 5 s
    ((rc == 0 || rc == 143)) || log "[r$1] WARNING: $name exited with status $rc on SIGTERM (its log: $name.log, kept with --keep)"
  done
  ING_PID=""; HAP_PID=""
}
proxy_pid() { case $1 in ingressd) echo "$ING_PID" ;; haproxy) echo "$HAP_PID" ;; *) echo "" ;; esac; }
proxy_port() { case $1 in ingressd) echo "$P_ING_GRPC" ;; haproxy) echo "$P_HAP" ;; *) echo "$P_REPLICA" ;; esac; }
emit() { printf '%s\t%s\t%s\t%s\t%s\n' "$1" "$2" "$3" "$4" "$5" >>"$RESULTS"; }

# run_unary ROUND PROXY CONNS STREAMS_PER_CONN: h2load, warm-up then the measured run
run_unary() {
  local round=$1 proxy=$2 c=$3 m=$4 port pid scen="unary_c${3}m${4}"
  port=$(proxy_port "$proxy"); pid=$(proxy_pid "$proxy")
  local h2=(h2load -t1 -c"$c" -m"$m" -d "$TMP/unary.bin" -H 'content-type: application/grpc' -H 'te: trailers'
            "http://127.0.0.1:$port/bench.Echo/Unary")
  taskset -c $LOAD_CORE "${h2[@]}" -D "$WARMUP" >/dev/null 2>&1 || true
  local out=$TMP/h2load-$round-$proxy-$scen.txt c0=0 c1=0 s0 s1 l0 l1 t0 t1 u0 u1 k0 k1
  local st0 st1
  st0=$(replica_stats); u0=$(stat_of unary "$st0"); k0=$(stat_of conns_accepted "$st0")
  [ -n "$pid" ] && c0=$(proc_ticks "$pid")
  s0=$(core_sample $PROXY_CORE); l0=$(core_sample $LOAD_CORE); t0=$(date +%s.%N)
  taskset -c $LOAD_CORE "${h2[@]}" -D "$DURATION" >"$out" 2>&1 || true
  t1=$(date +%s.%N); s1=$(core_sample $PROXY_CORE); l1=$(core_sample $LOAD_CORE)
  [ -n "$pid" ] && c1=$(proc_ticks "$pid")
  st1=$(replica_stats); u1=$(stat_of unary "$st1"); k1=$(stat_of conns_accepted "$st1")
  local open; open=$(stat_of conns_open "$st1")
  # h2load: "requests: N total, N started, N done, N succeeded, N failed, N errored, N timeout"
  local ok failed errored non2xx
  read -r ok failed errored <<<"$(awk '/^requests:/ {print $8, $10, $12}' "$out")"
  non2xx=$(awk '/^status codes:/ {print $5 + $7 + $9}' "$out")
  ok=${ok:-0}
  local elapsed; elapsed=$(awk -v a="$t0" -v b="$t1" 'BEGIN{print b-a}')
  emit "$round" "$proxy" "$scen" calls_s "$(awk -v n="$ok" -v d="$DURATION" 'BEGIN{printf "%.0f", n/d}')"
  emit "$round" "$proxy" "$scen" lat_mean_ms "$(awk '/^time for request:/ {v=$6; if (v ~ /us$/) {sub(/us/,"",v); v/=1000} else if (v ~ /ms$/) sub(/ms/,"",v); else {sub(/s$/,"",v); v*=1000}; printf "%.3f", v}' "$out")"
  emit "$round" "$proxy" "$scen" errors "$(( ${failed:-0} + ${errored:-0} + ${non2xx:-0} ))"
  emit "$round" "$proxy" "$scen" replica_per_call "$(awk -v a=$((u1 - u0)) -v b="$ok" 'BEGIN{printf "%.3f", b ? a/b : 0}')"
  # calls the replica served beyond those h2load completed: the ones in flight when h2load (and its
  # warm-up run) stopped, at most 2 x the streams; fewer than h2load's would mean answers that
  # did not come from the replica
  emit "$round" "$proxy" "$scen" replica_extra $((u1 - u0 - ok))
  emit "$round" "$proxy" "$scen" upstream_conns_new $((k1 - k0 - 1))   # less the second Stats call's own connection
  emit "$round" "$proxy" "$scen" upstream_conns_open $((open - 1))   # less the Stats call's own
  emit "$round" "$proxy" "$scen" load_core_busy "$(busy_pct "$l0" "$l1")"
  if [ -n "$pid" ]; then
    local ticks=$((c1 - c0))
    emit "$round" "$proxy" "$scen" cpu_us "$(awk -v t="$ticks" -v hz="$CLK_TCK" -v n="$ok" 'BEGIN{printf "%.2f", n ? t/hz*1e6/n : 0}')"
    emit "$round" "$proxy" "$scen" proxy_core_share "$(awk -v t="$ticks" -v hz="$CLK_TCK" -v e="$elapsed" 'BEGIN{printf "%.1f", 100*t/hz/e}')"
    emit "$round" "$proxy" "$scen" others_on_core "$(awk -v b="$(busy_pct "$s0" "$s1")" -v t="$ticks" -v hz="$CLK_TCK" -v e="$elapsed" 'BEGIN{v=b-100*t/hz/e; printf "%.1f", v<0?0:v}')"
  fi
  log "[r$round] $scen $proxy: $(awk -F'\t' -v r="$round" -v p="$proxy" -v s="$scen" '$1==r && $2==p && $3==s {printf "%s=%s ", $4, $5}' "$RESULTS")"
  # nothing completed: what the replica saw (send_windows 0: the proxy stopped granting HTTP/2
  # flow-control window on its upstream connection, so the replica cannot send DATA)
  ((ok > 0)) || log "[r$round] $scen $proxy: NO CALL COMPLETED; replica: $st1"
}

# run_stream ROUND PROXY: the server-stream latency client
run_stream() {
  local round=$1 proxy=$2 port pid json c0=0 c1=0 w0=0 w1=0
  port=$(proxy_port "$proxy"); pid=$(proxy_pid "$proxy")
  [ -n "$pid" ] && { c0=$(proc_ticks "$pid"); w0=$(runq_wait_ns "$pid"); }
  json=$(taskset -c $LOAD_CORE "$REPLICA" stream --port "$port" --streams "$STREAMS" --messages "$MESSAGES" \
           --interval-ms "$INTERVAL_MS") || true
  [ -n "$pid" ] && { c1=$(proc_ticks "$pid"); w1=$(runq_wait_ns "$pid"); }
  log "[r$round] stream $proxy: $json"
  [ -n "$json" ] || { emit "$round" "$proxy" stream failed_streams "$STREAMS"; return 0; }
  $PY - "$round" "$proxy" "$json" "$STREAMS" >>"$RESULTS" <<'EOF'
import json, sys
r, p, j, n = sys.argv[1], sys.argv[2], json.loads(sys.argv[3]), int(sys.argv[4])
rows = [("delay_p50_ms", j["delay_p50_ms"]), ("delay_p99_ms", j["delay_p99_ms"]),
        ("delay_max_ms", j["delay_max_ms"]), ("held_back", j["held_back"]),
        ("messages", j["messages"]), ("failed_streams", n - j["ok_streams"]),
        ("client_runq_ms", j["client_runq_wait_ms"])]
for k, v in rows:
    print("%s\t%s\tstream\t%s\t%s" % (r, p, k, v))
EOF
  if [ -n "$pid" ]; then
    local msgs; msgs=$(awk -F'\t' -v r="$round" -v p="$proxy" '$1==r && $2==p && $3=="stream" && $4=="messages" {print $5}' "$RESULTS")
    emit "$round" "$proxy" stream proxy_runq_ms "$(awk -v a="$w0" -v b="$w1" 'BEGIN{printf "%.1f", (b-a)/1e6}')"
    emit "$round" "$proxy" stream cpu_us_per_msg "$(awk -v t=$((c1 - c0)) -v hz="$CLK_TCK" -v n="${msgs:-0}" 'BEGIN{printf "%.2f", n ? t/hz*1e6/n : 0}')"
  fi
}

# ------------------------------------------------------------------ run
T_START=$(date +%s)
PROXIES=(haproxy); ((WITH_ING)) && PROXIES=(ingressd haproxy)
log "temp dir $TMP; $HAP_VERSION; h2load $H2LOAD_VERSION; ingressd: $( ((WITH_ING)) && echo "$ING_SRC (GLIBC_TUNABLES=${ING_TUNABLES:-unset})" || echo none)"
log "cores: proxy on $PROXY_CORE, h2load + replica + clients on $LOAD_CORE; rounds=$ROUNDS duration=${DURATION}s;" \
    "streams=$STREAMS x $MESSAGES messages every ${INTERVAL_MS} ms; $PRIO"
log "uptime: $(uptime)"
start_bg replica $LOAD_CORE "$REPLICA" serve --listen "127.0.0.1:$P_REPLICA" --payload-bytes 100
wait_port 127.0.0.1 "$P_REPLICA"
# the held-back detector's own check: a replica that writes every even message only with the next
# one; 5 streams x 10 messages must count 25 held back
start_bg replica-holdback $LOAD_CORE "$REPLICA" serve --listen "127.0.0.1:$P_HOLDBACK" --hold-back
wait_port 127.0.0.1 "$P_HOLDBACK"
hb_json=$(taskset -c $LOAD_CORE "$REPLICA" stream --port "$P_HOLDBACK" --streams 5 --messages 10 --interval-ms "$INTERVAL_MS") || true
stop_pid "$LAST_PID"
if [[ $hb_json != *'"held_back": 25,'* ]]; then log "held-back detector check FAILED (want 25): $hb_json"; exit 1; fi
log "held-back detector check ok: a replica holding every other message back -> 25 of 50 counted"

for ((r = 1; r <= ROUNDS; r++)); do
  if ((r % 2)); then ORDER=("${PROXIES[@]}"); else ORDER=(); for p in "${PROXIES[@]}"; do ORDER=("$p" "${ORDER[@]}"); done; fi
  start_proxies
  if ((r == 1)); then
    for p in direct "${ORDER[@]}"; do grpc_check "$p" "$(proxy_port "$p")"; done
    for p in direct "${ORDER[@]}"; do show_trailers "$p" "$(proxy_port "$p")"; done
  fi
  for p in direct "${ORDER[@]}"; do run_unary "$r" "$p" 4 16; done
  for p in direct "${ORDER[@]}"; do run_unary "$r" "$p" 64 1; done
  for p in direct "${ORDER[@]}"; do run_stream "$r" "$p"; done
  stop_proxies "$r"
done

echo
echo "gRPC (h2c): ingressd --threads 1 vs $HAP_VERSION nbthread 1 (proto h2 frontend + backends), one fake replica" \
     "(bench/grpc_replica.cpp, nghttp2); h2load $H2LOAD_VERSION; proxy on core $PROXY_CORE, load + replica on core $LOAD_CORE;" \
     "$ROUNDS round(s) x ${DURATION}s; streams $STREAMS x $MESSAGES msgs / ${INTERVAL_MS} ms; wall time $(( $(date +%s) - T_START ))s"
echo "uptime at end: $(uptime)"
echo
$PY "$LIB/grpc_report.py" --results "$RESULTS" --hap-label "HAProxy $(awk '{print $3}' <<<"$HAP_VERSION")"
cp "$RESULTS" "${BENCH_RESULTS_OUT:-/dev/null}" 2>/dev/null || true
