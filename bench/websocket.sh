#!/usr/bin/env bash
# WebSocket tunnels (issue #32 item 6): ingressd --threads 1 vs HAProxy 2.6 nbthread 1 (mode http,
# its built-in Upgrade handling, timeout tunnel) vs nginx 1.22 with one worker (proxy_http_version
# 1.1 + Upgrade/Connection headers), all three in front of the same fake replica, in one run.
#
#   bench/websocket.sh [--quick] [--rounds N] [--c1-messages N] [--c64-messages N] [--rate R]
#                      [--paced-seconds S] [--idle-conns N] [--proxies "ingressd haproxy nginx"]
#                      [--ingressd PATH] [--keep]
#
# Per round, all proxies started fresh, then:
#   1. idle tunnels (first, on the fresh processes): --idle-conns WebSocket connections opened
#      through each proxy (250 handshakes in flight), one 64-byte echo on each, then idle; the
#      proxy's VmRSS before and 1 s after -> KiB per tunnel; a sample of 200 must still echo
#   2. echo round trips, 64-byte text messages (client frames masked, as browsers send them):
#      c1 (one connection, closed loop), c64 (64 connections, closed loop: each sends its next
#      message when the echo of the last one arrived; the proxy's core saturates), paced (64
#      connections, --rate messages/s in all on a fixed schedule: the same load for every proxy);
#      p50/p99 round trip, echoes/s, and the proxy's CPU per message relayed (utime + stime from
#      /proc/PID/stat over the measured echoes / (2 x echoes): an echo is one message each way)
#   direct = the load tool straight to the replica (latency baseline, the load side's capacity).
# Before the rounds every endpoint passes bench/lib/ws_check.py (a real WebSocket client:
# echoes, fragments, 1 MiB, ping/pong, close 1000).
#
# --quick: 1 round, c1 10,000 / c64 100,000 messages, paced 3 s, 5,000 idle tunnels (~45 s).
# Default: 3 rounds, c1 20,000 / c64 200,000, paced 5 s (~3 min). Layout (2 cores), as
# bench/run.sh: core 1 = the proxy under test, core 0 = the load tool and the replica. Loopback
# only: replica on 127.0.0.2, proxies on 127.0.0.3, ports BENCH_PORT_BASE (default 19300) .. +10.
set -euo pipefail

HERE=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
ROOT=$(dirname "$HERE")
LIB=$HERE/lib

QUICK=0
ROUNDS=""
C1_MSGS=""
C64_MSGS=""
RATE=5000
PACED_S=""
IDLE_CONNS=5000
PROXY_LIST="ingressd haproxy nginx"
KEEP=0
INGRESSD=${INGRESSD:-$ROOT/build/release/ingressd}
PORT_BASE=${BENCH_PORT_BASE:-19300}
PY=/usr/bin/python3   # Debian's python: python3-websockets lives there

usage() { sed -n '2,27p' "$0" | sed 's/^# \{0,1\}//'; }
# shellcheck disable=SC2034  # KEEP is read by lib/common.sh (end_run)
while (($#)); do
  case $1 in
    --quick) QUICK=1 ;;
    --rounds) ROUNDS=$2; shift ;;
    --c1-messages) C1_MSGS=$2; shift ;;
    --c64-messages) C64_MSGS=$2; shift ;;
    --rate) RATE=$2; shift ;;
    --paced-seconds) PACED_S=$2; shift ;;
    --idle-conns) IDLE_CONNS=$2; shift ;;
    --proxies) PROXY_LIST=$2; shift ;;
    --ingressd) INGRESSD=$2; shift ;;
    --keep) KEEP=1 ;;
    -h|--help) usage; exit 0 ;;
    *) echo "unknown argument: $1" >&2; usage >&2; exit 2 ;;
  esac
  shift
done
if ((QUICK)); then
  ROUNDS=${ROUNDS:-1}; C1_MSGS=${C1_MSGS:-10000}; C64_MSGS=${C64_MSGS:-100000}; PACED_S=${PACED_S:-3}
else
  ROUNDS=${ROUNDS:-3}; C1_MSGS=${C1_MSGS:-20000}; C64_MSGS=${C64_MSGS:-200000}; PACED_S=${PACED_S:-5}
fi
for v in "$ROUNDS" "$C1_MSGS" "$C64_MSGS" "$RATE" "$PACED_S" "$IDLE_CONNS"; do
  [[ $v =~ ^[1-9][0-9]*$ ]] || { echo "--rounds, --*-messages, --rate, --paced-seconds and --idle-conns take positive integers" >&2; exit 2; }
done
PROXIES=()
for p in $PROXY_LIST; do
  case $p in ingressd|haproxy|nginx) PROXIES+=("$p") ;; *) echo "--proxies: ingressd, haproxy, nginx" >&2; exit 2 ;; esac
done

# shellcheck source=lib/common.sh
source "$LIB/common.sh"

# ------------------------------------------------------------------ dependencies
install_missing haproxy g++ python3-websockets iproute2 util-linux procps
command -v nginx >/dev/null 2>&1 || install_missing nginx   # nginx or nginx-light: either has the proxy module
HAP_VERSION=$(haproxy -v 2>/dev/null); HAP_VERSION=${HAP_VERSION%%$'\n'*}
NGX_VERSION=$(nginx -v 2>&1); NGX_VERSION=${NGX_VERSION#*: }

# ------------------------------------------------------------------ machine (lib/common.sh)
bench_machine
ulimit -n "$(ulimit -Hn)" 2>/dev/null || true
NOFILE=$(ulimit -n)
# a tunnel is 2 descriptors in the proxy (client + replica), 1 in the load tool, 1 in the replica
if ((NOFILE < 2 * IDLE_CONNS + 200)); then
  echo "ulimit -n is $NOFILE (hard $(ulimit -Hn)): $IDLE_CONNS tunnels need $((2 * IDLE_CONNS + 200)) in the proxy;" \
       "raise the hard limit or pass a smaller --idle-conns" >&2
  exit 1
fi

# ------------------------------------------------------------------ ports and temp dir
REPLICA_IP=127.0.0.2; PROXY_IP=127.0.0.3
P_ING=$((PORT_BASE + 0)); P_ING_ADMIN=$((PORT_BASE + 1)); P_HAP=$((PORT_BASE + 2)); P_NGX=$((PORT_BASE + 3))
P_REPLICA=$((PORT_BASE + 10))
for p in $P_ING $P_ING_ADMIN $P_HAP $P_NGX $P_REPLICA; do
  if [ -n "$(ss -Htln "sport = :$p")" ]; then
    echo "port $p is in use; set BENCH_PORT_BASE to a free range" >&2; exit 1
  fi
done

TMP=$(mktemp -d /tmp/ingressd-ws-bench.XXXXXX)
start_run results.tsv

# ingressd: a private copy (a rebuild during the run, on a shared machine, must not swap the
# binary under us)
if [[ " ${PROXIES[*]} " == *" ingressd "* ]]; then
  [ -x "$INGRESSD" ] || { echo "no ingressd at $INGRESSD (build it, or --ingressd PATH, or --proxies without it)" >&2; exit 1; }
  for _ in $(seq 12); do
    if cp "$INGRESSD" "$TMP/ingressd" 2>/dev/null && "$TMP/ingressd" --version >/dev/null 2>&1; then break; fi
    rm -f "$TMP/ingressd"; sleep 5
  done
  [ -x "$TMP/ingressd" ] || { echo "could not copy $INGRESSD" >&2; exit 1; }
  ING_SRC=$INGRESSD; INGRESSD=$TMP/ingressd
fi

# ------------------------------------------------------------------ the load tool (+ replica)
log "building bench/ws_load.cpp"
g++ -std=c++20 -O2 -o "$TMP/ws_load" "$HERE/ws_load.cpp"
WSL=$TMP/ws_load

# ------------------------------------------------------------------ ingressd
cat >"$TMP/topology.json" <<EOF
{"target_groups": [{"app_name": "ws", "route_prefix": "/", "protocol": "HTTP",
  "targets": [{"ip": "$REPLICA_IP", "port": $P_REPLICA, "instance_id": "n1", "name": "SERVE_REPLICA::ws#r1"}]}],
 "fallback_targets": {}}
EOF
cat >"$TMP/ingressd.yaml" <<EOF
# benchmark settings: no access log, quick stop; room for the idle test's tunnels
log_level: warn
access_log: "off"
client:
  keepalive_timeout: 75s
  max_connections: $((IDLE_CONNS + 1000))
  max_tunnels: $((IDLE_CONNS + 500))
timeout:
  tunnel: 3600s
drain:
  min_period: 0s
  timeout: 0s
EOF
if [ -n "${BENCH_INGRESSD_YAML:-}" ]; then printf '%s\n' "$BENCH_INGRESSD_YAML" >>"$TMP/ingressd.yaml"; fi
if [ -n "${INGRESSD:-}" ] && [ -x "$INGRESSD" ]; then
  "$INGRESSD" --config "$TMP/ingressd.yaml" --topology-file "$TMP/topology.json" --check-config >"$TMP/ingressd-check.log" 2>&1 ||
    { cat "$TMP/ingressd-check.log" >&2; exit 1; }
fi

# ------------------------------------------------------------------ HAProxy
# mode http tunnels a WebSocket by itself: after the server's 101 the stream becomes a tunnel,
# bounded by `timeout tunnel` (Ray renders it only for backends that set timeout_tunnel_s; the
# same 3600 s as ingressd's timeout.tunnel here). global and defaults as bench/run.sh's.
cat >"$TMP/haproxy.cfg" <<EOF
# generated by bench/websocket.sh
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
  option forwardfor
  timeout connect 2s
  timeout client 3600s
  timeout server 300s
  timeout tunnel 3600s
  timeout http-request 10s
  timeout http-keep-alive 75s

frontend http_frontend
  bind $PROXY_IP:$P_HAP
  maxconn 20000
  http-request set-header X-Forwarded-Proto http
  default_backend http-ws

backend http-ws
  option httpchk GET /-/healthz
  http-check expect status 200
  default-server inter 5s fastinter 250ms downinter 250ms fall 2 rise 2
  server SERVE_REPLICA__ws-r1 $REPLICA_IP:$P_REPLICA check
EOF
haproxy -c -q -f "$TMP/haproxy.cfg" >"$TMP/haproxy-check.log" 2>&1 || { cat "$TMP/haproxy-check.log" >&2; exit 1; }

# ------------------------------------------------------------------ nginx
# One process (master_process off, worker_processes 1) like haproxy -db and ingressd; the
# WebSocket recipe from nginx's documentation (proxy_http_version 1.1, Upgrade and Connection
# passed on), read/send timeouts as long as the others' tunnel timeout.
mkdir -p "$TMP/ngx/tmp"
cat >"$TMP/ngx/nginx.conf" <<EOF
# generated by bench/websocket.sh
master_process off;
daemon off;
worker_processes 1;
worker_rlimit_nofile $NOFILE;
pid $TMP/ngx/nginx.pid;
error_log $TMP/ngx/error.log warn;
events { worker_connections $((NOFILE - 100)); use epoll; multi_accept on; }
http {
  access_log off;
  server_tokens off;
  tcp_nodelay on;
  client_body_temp_path $TMP/ngx/tmp/body;
  proxy_temp_path $TMP/ngx/tmp/proxy;
  fastcgi_temp_path $TMP/ngx/tmp/fastcgi;
  uwsgi_temp_path $TMP/ngx/tmp/uwsgi;
  scgi_temp_path $TMP/ngx/tmp/scgi;
  upstream ws_replica { server $REPLICA_IP:$P_REPLICA; }
  server {
    listen $PROXY_IP:$P_NGX backlog=4096;
    location / {
      proxy_pass http://ws_replica;
      proxy_http_version 1.1;
      proxy_set_header Upgrade \$http_upgrade;
      proxy_set_header Connection "upgrade";
      proxy_set_header Host \$host;
      proxy_set_header X-Forwarded-For \$remote_addr;
      proxy_set_header X-Forwarded-Proto \$scheme;
      proxy_read_timeout 3600s;
      proxy_send_timeout 3600s;
    }
  }
}
EOF
nginx -t -q -p "$TMP/ngx" -c "$TMP/ngx/nginx.conf" >"$TMP/ngx/check.log" 2>&1 || { cat "$TMP/ngx/check.log" >&2; exit 1; }

# ------------------------------------------------------------------ helpers
emit() { printf '%s\t%s\t%s\t%s\t%s\n' "$1" "$2" "$3" "$4" "$5" >>"$RESULTS"; }
# emit_json ROUND PROXY SCENARIO JSON: every number of the load tool's JSON as a result row
emit_json() {
  $PY - "$@" >>"$RESULTS" <<'EOF'
import json, sys
r, p, s, j = sys.argv[1], sys.argv[2], sys.argv[3], json.loads(sys.argv[4])
for k, v in j.items():
    if isinstance(v, bool):
        v = int(v)
    if isinstance(v, (int, float)):
        print("%s\t%s\t%s\t%s\t%s" % (r, p, s, k, v))
EOF
}
replica_stats() { # "accepted=N open=N ws_open=N ws_total=N echoed=N"
  local out
  out=$(exec 3<>"/dev/tcp/$REPLICA_IP/$P_REPLICA" && printf 'GET /stats HTTP/1.0\r\n\r\n' >&3 && cat <&3) 2>/dev/null || true
  echo "${out##*$'\r\n\r\n'}"
}
stat_of() { grep -o "\b$1=[0-9]*" <<<"$2" | cut -d= -f2; }
# wait until the replica holds no WebSocket: the last test's tunnels all closed (10 s at most)
wait_replica_quiet() {
  local s
  for _ in $(seq 100); do
    s=$(replica_stats)
    [ "$(stat_of ws_open "$s")" = 0 ] && return 0
    sleep 0.1
  done
  log "WARNING: the replica still holds WebSockets: $s"
}

proxy_pid() { case $1 in ingressd) echo "$ING_PID" ;; haproxy) echo "$HAP_PID" ;; nginx) echo "$NGX_PID" ;; *) echo "" ;; esac; }
proxy_addr() { case $1 in ingressd) echo "$PROXY_IP:$P_ING" ;; haproxy) echo "$PROXY_IP:$P_HAP" ;; nginx) echo "$PROXY_IP:$P_NGX" ;; *) echo "$REPLICA_IP:$P_REPLICA" ;; esac; }
pid_args() { # --pid for each process of the proxy (nginx/HAProxy: all of them; one here)
  local pid p
  pid=$(proxy_pid "$1")
  [ -n "$pid" ] || return 0
  for p in $(proc_family "$pid"); do printf -- '--pid %s ' "$p"; done
}

ING_PID=""; HAP_PID=""; NGX_PID=""
# wait_ws NAME: until a WebSocket echo goes through (ingressd: its health check has passed)
wait_ws() {
  local i
  for i in $(seq 150); do
    "$WSL" echo --connect "$(proxy_addr "$1")" --conns 1 --messages 1 --warmup 0 --timeout 2 >"$TMP/ready-$1.json" 2>&1 && return 0
    sleep 0.1
  done
  log "$1 never relayed a WebSocket echo: $(cat "$TMP/ready-$1.json")"
  tail -20 "$TMP/$1.log" >&2 || true
  exit 1
}
start_proxies() {
  local p
  for p in "${PROXIES[@]}"; do
    case $p in
      ingressd)
        start_bg ingressd "$PROXY_CORE" "${ING_ENV[@]}" "$INGRESSD" --config "$TMP/ingressd.yaml" --threads 1 \
          --topology-file "$TMP/topology.json" --listen "$PROXY_IP:$P_ING" --admin-listen "$PROXY_IP:$P_ING_ADMIN" \
          --node-ip "$REPLICA_IP"
        ING_PID=$LAST_PID ;;
      haproxy) start_bg haproxy "$PROXY_CORE" haproxy -db -f "$TMP/haproxy.cfg"; HAP_PID=$LAST_PID ;;
      nginx) start_bg nginx "$PROXY_CORE" nginx -p "$TMP/ngx" -c "$TMP/ngx/nginx.conf"; NGX_PID=$LAST_PID ;;
    esac
  done
  for p in "${PROXIES[@]}"; do wait_ws "$p"; done
}
stop_proxies() { # ROUND: SIGTERM each proxy, up to 5 s to go
  local name pid rc keep q
  for name in "${PROXIES[@]}"; do
    pid=$(proxy_pid "$name")
    [ -n "$pid" ] || continue
    kill -0 "$pid" 2>/dev/null || log "ERROR: $name (pid $pid) died during the run (see $TMP/$name.log)"
    kill -TERM "$pid" 2>/dev/null || true
    for _ in $(seq 50); do kill -0 "$pid" 2>/dev/null || break; sleep 0.1; done
    kill -KILL "$pid" 2>/dev/null || true
    rc=0; wait "$pid" 2>/dev/null || rc=$?
    keep=(); for q in "${PIDS[@]}"; do [ "$q" = "$pid" ] || keep+=("$q"); done; PIDS=("${keep[@]}")
    emit "$1" "$name" stop exit_status "$rc"
    # 0, or 143 (SIGTERM's default action) is a clean stop; 139 = SIGSEGV, 137 = killed after 5 s
    ((rc == 0 || rc == 143)) || log "[r$1] WARNING: $name exited with status $rc on SIGTERM (its log: $name.log, kept with --keep)"
  done
  ING_PID=""; HAP_PID=""; NGX_PID=""
}

# BENCH_WAIT_WHILE="cc1plus ninja ...": before each measurement (idle test, echo run), wait (10 min
# at most) while a process of one of these names runs: on a shared build machine, measure between
# builds. "others on the proxy core" in the table shows what came anyway.
wait_quiet() {
  local names=${BENCH_WAIT_WHILE:-} n busy i
  [ -n "$names" ] || return 0
  for i in $(seq 60); do
    busy=""
    for n in $names; do pgrep -x "$n" >/dev/null && busy="$busy $n"; done
    [ -z "$busy" ] && return 0
    ((i == 1)) && log "waiting while$busy run(s) (BENCH_WAIT_WHILE)"
    sleep 10
  done
  log "WARNING: still running after 10 min:$busy; measuring anyway"
}

# run_idle ROUND PROXY: --idle-conns tunnels held open, the proxy's RSS before and after
run_idle() {
  local round=$1 proxy=$2 json rc=0
  wait_quiet
  # shellcheck disable=SC2046
  json=$(taskset -c "$LOAD_CORE" "$WSL" idle --connect "$(proxy_addr "$proxy")" --conns "$IDLE_CONNS" \
           --replica-stats "$REPLICA_IP:$P_REPLICA" --timeout 120 $(pid_args "$proxy") 2>>"$TMP/ws_load.log") || rc=$?
  log "[r$round] idle $proxy: $json"
  [ -n "$json" ] || { emit "$round" "$proxy" idle ok 0; return 0; }
  emit_json "$round" "$proxy" idle "$json"
  ((rc == 0)) || log "[r$round] idle $proxy: FAILED (exit $rc)"
  wait_replica_quiet
}

# run_echo ROUND PROXY SCENARIO: c1 | c64 | paced
run_echo() {
  local round=$1 proxy=$2 scen=$3 args json rc=0
  case $scen in
    c1) args=(--conns 1 --messages "$C1_MSGS" --warmup $((C1_MSGS / 10))) ;;
    c64) args=(--conns 64 --messages "$C64_MSGS" --warmup $((C64_MSGS / 10))) ;;
    paced) args=(--conns 64 --rate "$RATE" --messages $((RATE * PACED_S)) --warmup $((RATE / 2))) ;;
  esac
  wait_quiet
  # shellcheck disable=SC2046
  json=$(taskset -c "$LOAD_CORE" "$WSL" echo --connect "$(proxy_addr "$proxy")" "${args[@]}" --size 64 \
           --timeout 120 $(pid_args "$proxy") 2>>"$TMP/ws_load.log") || rc=$?
  log "[r$round] $scen $proxy: $json"
  [ -n "$json" ] || { emit "$round" "$proxy" "$scen" ok 0; return 0; }
  emit_json "$round" "$proxy" "$scen" "$json"
  # both cores over the measured echoes (the tool samples /proc/stat with the proxy's CPU): the
  # load core's busy share, and what others took of the proxy core beside the proxy
  $PY - "$round" "$proxy" "$scen" "$json" "$LOAD_CORE" "$PROXY_CORE" >>"$RESULTS" <<'EOF2'
import json, sys
r, p, s, j, lc, pc = sys.argv[1], sys.argv[2], sys.argv[3], json.loads(sys.argv[4]), sys.argv[5], sys.argv[6]
lb, pb = j.get("cpu%s_busy" % lc), j.get("cpu%s_busy" % pc)
if lb is not None:
    print("%s\t%s\t%s\tload_core_busy\t%.1f" % (r, p, s, lb))
if pb is not None:
    print("%s\t%s\t%s\tothers_on_core\t%.1f" % (r, p, s, max(0.0, pb - (j["proxy_core_share"] if p != "direct" else 0))))
EOF2
  ((rc == 0)) || log "[r$round] $scen $proxy: FAILED (exit $rc)"
}

# ------------------------------------------------------------------ run
T_START=$(date +%s)
log "temp dir $TMP; $HAP_VERSION; $NGX_VERSION; ingressd: ${ING_SRC:-none} (GLIBC_TUNABLES=${ING_TUNABLES:-unset})"
log "cores: proxy on $PROXY_CORE, load tool + replica on $LOAD_CORE; rounds=$ROUNDS; c1 $C1_MSGS, c64 $C64_MSGS messages;" \
    "paced $RATE/s x ${PACED_S}s on 64 connections; $IDLE_CONNS idle tunnels; ulimit -n $NOFILE; $PRIO"
log "uptime: $(uptime)"
start_bg replica "$LOAD_CORE" "$WSL" serve --listen "$REPLICA_IP:$P_REPLICA"
wait_port "$REPLICA_IP" "$P_REPLICA"

for ((r = 1; r <= ROUNDS; r++)); do
  if ((r % 2)); then ORDER=("${PROXIES[@]}"); else ORDER=(); for p in "${PROXIES[@]}"; do ORDER=("$p" "${ORDER[@]}"); done; fi
  start_proxies
  if ((r == 1)); then
    for p in direct "${ORDER[@]}"; do
      out=$(taskset -c "$LOAD_CORE" $PY "$LIB/ws_check.py" --name "$p" --url "ws://$(proxy_addr "$p")/ws/echo") ||
        { log "$out"; exit 1; }
      log "$out"
    done
  fi
  wait_replica_quiet
  for p in "${ORDER[@]}"; do run_idle "$r" "$p"; done
  for scen in c1 c64 paced; do
    for p in direct "${ORDER[@]}"; do run_echo "$r" "$p" "$scen"; done
  done
  stop_proxies "$r"
done

echo
echo "WebSocket tunnels: ingressd --threads 1 vs $HAP_VERSION nbthread 1 vs nginx $NGX_VERSION (1 worker), one fake replica" \
     "(bench/ws_load.cpp serve); proxy on core $PROXY_CORE, load + replica on core $LOAD_CORE; $ROUNDS round(s);" \
     "wall time $(( $(date +%s) - T_START ))s"
echo "uptime at end: $(uptime)"
echo
$PY "$LIB/ws_report.py" --results "$RESULTS" --hap-label "HAProxy $(awk '{print $3}' <<<"$HAP_VERSION")" \
  --ngx-label "nginx ${NGX_VERSION#nginx/}" --rate "$RATE" --idle-conns "$IDLE_CONNS"
cp "$RESULTS" "${BENCH_RESULTS_OUT:-/dev/null}" 2>/dev/null || true
