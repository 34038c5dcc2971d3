#!/usr/bin/env bash
# ingressd vs HAProxy 2.6 + Lua (Ray Serve's router data plane, rebuilt from
# /work/shared/spec/ray-serve-ingress.md) vs nginx + lua-nginx-module with pooled cosockets (the
# best an operator could build instead, issue #22), side by side on one topology, in one run.
#
#   bench/run.sh [--quick] [--rounds N] [--duration S] [--idle-conns N] [--ingressd PATH] [--keep]
#   bench/run.sh --profile plain|router [--duration S]    # ingressd under callgrind, instructions/request
#   bench/run.sh --scaling [--rounds N]                   # only the 1 -> 2 thread runs (see README)
#   bench/run.sh --ab OLD [--rounds N] [--duration S]     # this build vs another ingressd build, paired
#   bench/run.sh --hedge [--rounds N] [--duration S]      # late routers: hedged router calls (README)
#
# Layout (2 cores): core 1 = the proxy under test (ingressd --threads 1 / HAProxy nbthread 1 /
# nginx with one worker), core 0 = everything else (wrk, nginx fakes for replicas and routers,
# the Python SSE replica and the Python clients). See bench/README.md for what is measured and
# how to read the noise.
#
# --quick: 1 round, plain GET + router POST at 64 connections, short runs (about a minute
# after the build); exits 1 when ingressd's router-path req/s is below 2x HAProxy's in this run
# (or ingressd returned errors on that path). nginx + Lua runs too, for information.
set -euo pipefail

HERE=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
ROOT=$(dirname "$HERE")
LIB=$HERE/lib

QUICK=0
SCALING_ONLY=0
ROUNDS=""
DURATION=""
IDLE_N=""
KEEP=0
PROFILE=""
AB=""
HEDGE=0
INGRESSD=${INGRESSD:-$ROOT/build/release/ingressd}
PORT_BASE=${BENCH_PORT_BASE:-18400}
GATE_RATIO=${BENCH_GATE_RATIO:-2.0}
WITH_NGINX=${BENCH_NGINX:-1}     # 0: leave the nginx + Lua anchor out (and its packages)

usage() { sed -n '2,16p' "$0" | sed 's/^# \{0,1\}//'; }
while (($#)); do
  case $1 in
    --quick) QUICK=1 ;;
    --scaling) SCALING_ONLY=1 ;;
    --rounds) ROUNDS=$2; shift ;;
    --duration) DURATION=$2; shift ;;
    --idle-conns) IDLE_N=$2; shift ;;
    --ingressd) INGRESSD=$2; shift ;;
    --keep) KEEP=1 ;;
    --profile) PROFILE=$2; shift ;;
    --ab) AB=$2; shift ;;
    --hedge) HEDGE=1 ;;
    --tls) shift; exec "$HERE/tls.sh" "$@" ;;   # the TLS termination benchmark (README "TLS termination")
    -h|--help) usage; exit 0 ;;
    *) echo "unknown argument: $1" >&2; usage >&2; exit 2 ;;
  esac
  shift
done
[[ -z $PROFILE || $PROFILE == plain || $PROFILE == router ]] || { echo "--profile plain|router" >&2; exit 2; }
if [ -n "$PROFILE" ]; then
  ROUNDS=1; DURATION=${DURATION:-10}; WARMUP=2; IDLE_N=${IDLE_N:-100}; TTFT_N=0; KEEP=1; WITH_NGINX=0
elif [ -n "$AB" ]; then
  # Many short paired runs: the host's noise drifts over seconds (bench/README "Comparing two builds"), so each
  # pair is two back-to-back runs and the verdict is the median of the per-pair ratios.
  [ -x "$AB" ] || { echo "--ab: '$AB' is not an executable" >&2; exit 2; }
  ROUNDS=${ROUNDS:-12}; DURATION=${DURATION:-2}; WARMUP=1; IDLE_N=${IDLE_N:-100}; TTFT_N=${TTFT_N:-100}
  SCENARIOS=(plain_c64 router_c16 router_c64 router_c256); THREADS2=0; WITH_NGINX=0   # ingressd vs ingressd
elif ((HEDGE)); then
  # Router conditions x proxies, all at 64 connections on the router path (bench/README "Late routers").
  ROUNDS=${ROUNDS:-3}; DURATION=${DURATION:-6}; WARMUP=1; IDLE_N=${IDLE_N:-100}; TTFT_N=0
  SCENARIOS=(); THREADS2=0
elif ((QUICK)); then
  ROUNDS=${ROUNDS:-1}; DURATION=${DURATION:-4}; WARMUP=1; IDLE_N=${IDLE_N:-2000}; TTFT_N=50
  SCENARIOS=(plain_c64 router_c64); THREADS2=0
elif ((SCALING_ONLY)); then
  ROUNDS=${ROUNDS:-2}; DURATION=${DURATION:-8}; WARMUP=2; IDLE_N=${IDLE_N:-100}; TTFT_N=0
  SCENARIOS=(router_c64); THREADS2=1
else
  ROUNDS=${ROUNDS:-3}; DURATION=${DURATION:-8}; WARMUP=2; IDLE_N=${IDLE_N:-10000}; TTFT_N=200
  SCENARIOS=(plain_c64 router_c16 router_c64 router_c256); THREADS2=1
fi
# BENCH_SCENARIOS="router_c64 router_c256" narrows the load scenarios of any mode (for quick looks)
# ("none": only the idle, streams and TTFT tests)
if [ -n "${BENCH_SCENARIOS:-}" ]; then
  read -ra SCENARIOS <<<"$BENCH_SCENARIOS"
  [ "${SCENARIOS[*]}" = none ] && SCENARIOS=()
  for s in "${SCENARIOS[@]}"; do
    [[ $s =~ ^(plain|router)_c[0-9]+$ ]] || { echo "BENCH_SCENARIOS: '$s' is not plain_cN or router_cN (or none)" >&2; exit 2; }
  done
fi
[[ $ROUNDS =~ ^[1-9][0-9]*$ && $DURATION =~ ^[1-9][0-9]*$ && $IDLE_N =~ ^[1-9][0-9]*$ ]] ||
  { echo "--rounds, --duration and --idle-conns take positive integers" >&2; exit 2; }

# shellcheck source=lib/common.sh
source "$HERE/lib/common.sh"

# ------------------------------------------------------------------ dependencies
need=(haproxy nginx wrk python3 iproute2 util-linux)
((WITH_NGINX)) && need+=(libnginx-mod-http-lua lua-resty-core)
[ -n "$PROFILE" ] && need+=(valgrind strace)
install_missing "${need[@]}"
[[ $(haproxy -vv 2>/dev/null) == *"Built with Lua"* ]] || { echo "this haproxy has no Lua support" >&2; exit 1; }
HAP_VERSION=$(haproxy -v 2>/dev/null); HAP_VERSION=${HAP_VERSION%%$'\n'*}
NGX_VERSION=$(nginx -v 2>&1); NGX_VERSION=${NGX_VERSION##*/}
NGX_LUA_VERSION=$(dpkg-query -W -f='${Version}' libnginx-mod-http-lua 2>/dev/null || true); NGX_LUA_VERSION=${NGX_LUA_VERSION#*:}

if [ ! -x "$INGRESSD" ]; then
  log "building ingressd (release)"
  command -v cmake >/dev/null && command -v ninja >/dev/null || "$ROOT/scripts/deps.sh"
  (cd "$ROOT" && cmake --preset release >/dev/null && cmake --build --preset release --target ingressd)
  INGRESSD=$ROOT/build/release/ingressd
fi

# ------------------------------------------------------------------ machine (lib/common.sh)
bench_machine   # also set_priority: our processes get priority over background work (BENCH_NICE=0: not)
ING_ENV+=(${BENCH_PRELOAD:+LD_PRELOAD=$BENCH_PRELOAD})
((NCPU >= 2)) || THREADS2=0
ulimit -n "$(ulimit -Hn)" 2>/dev/null || true
NOFILE=$(ulimit -n)
STREAMS_N=$(( IDLE_N < (NOFILE - 1000) / 2 ? IDLE_N : (NOFILE - 1000) / 2 ))  # a stream takes 2 fds in the proxy
if ((IDLE_N + 2000 > NOFILE)); then
  log "WARNING: ulimit -n is $NOFILE; idle connection test reduced from $IDLE_N to $((NOFILE - 2000))"
  IDLE_N=$((NOFILE - 2000))
fi

# ------------------------------------------------------------------ ports and temp dir
P_ING=$((PORT_BASE + 0)); P_ING_ADMIN=$((PORT_BASE + 1)); P_HAP=$((PORT_BASE + 2))
P_ING2=$((PORT_BASE + 4)); P_ING2_ADMIN=$((PORT_BASE + 5)); P_HAP2=$((PORT_BASE + 6))
P_NGX=$((PORT_BASE + 3)); P_NGX2=$((PORT_BASE + 7)); P_NGX_CHECK=$((PORT_BASE + 8))
P_DEAD_ROUTER=$((PORT_BASE + 22))   # nothing listens here: the failover check's dead router
REPLICA_PORTS=($((PORT_BASE + 10)) $((PORT_BASE + 11)) $((PORT_BASE + 12)) $((PORT_BASE + 13)))
ROUTER_PORTS=($((PORT_BASE + 20)) $((PORT_BASE + 21)))
P_SSE=$((PORT_BASE + 30)); P_SSE_ROUTER=$((PORT_BASE + 31)); P_STATUS=$((PORT_BASE + 40))
REPLICA_NAMES=(r1 r2 r3 r4)
NODE_IP=127.0.0.2          # this node's "Ray node IP": routers live here (co-located)

for p in $P_ING $P_ING_ADMIN $P_HAP $P_ING2 $P_ING2_ADMIN $P_HAP2 $P_NGX $P_NGX2 $P_NGX_CHECK \
         "${REPLICA_PORTS[@]}" "${ROUTER_PORTS[@]}" $P_DEAD_ROUTER $P_SSE $P_SSE_ROUTER $P_STATUS; do
  if [ -n "$(ss -Htln "sport = :$p")" ]; then
    echo "port $p is in use; set BENCH_PORT_BASE to a free range" >&2; exit 1
  fi
done

TMP=$(mktemp -d /tmp/ingressd-bench.XXXXXX)
RESULTS=$TMP/results.tsv
: >"$RESULTS"
PIDS=()
cleanup() {
  local rc=$?
  kill_all
  sleep 0.2
  release_budgets
  wait 2>/dev/null || true
  if ((KEEP)); then log "kept $TMP"; else rm -rf "$TMP"; fi
  exit $rc
}
trap cleanup EXIT
trap 'exit 130' INT TERM


# ------------------------------------------------------------------ fakes: nginx replicas + routers
# --hedge: the app's routers are ingressd-bench-router processes (late on purpose), started per condition
render_nginx_fakes $((!HEDGE)) >"$TMP/nginx.conf"

# ------------------------------------------------------------------ topology (Ray JSON) for ingressd
render_topology "$TMP/topology.json"

ingressd_yaml >"$TMP/ingressd.yaml"
# The busy-poll variant (TTFT only; README "SSE TTFT"): the same plus busy_poll_us, and HAProxy
# with its global busy-polling.
BP_US=${BENCH_BUSY_POLL_US:-200}
{ cat "$TMP/ingressd.yaml"; echo "busy_poll_us: $BP_US"; } >"$TMP/ingressd-bp.yaml"

# ------------------------------------------------------------------ HAProxy + Lua (Ray's rendering)
render_irr_tables run.sh >"$TMP/irr_tables.lua"
cp "$HERE/haproxy/ingress_request_router.lua" "$TMP/ingress_request_router.lua"

haproxy_cfg $P_HAP 1 >"$TMP/haproxy.cfg"
haproxy_cfg $P_HAP2 2 >"$TMP/haproxy2.cfg"
haproxy_cfg $P_HAP 1 busy-polling >"$TMP/haproxy-bp.cfg"
haproxy -c -q -f "$TMP/haproxy.cfg" >"$TMP/haproxy-check.log" 2>&1 ||
  { cat "$TMP/haproxy-check.log" >&2; exit 1; }

# ------------------------------------------------------------------ nginx + lua-nginx-module (issue #22)
# The same topology file rendered into an nginx config and Lua tables (bench/nginx/render.py);
# the router action is bench/nginx/ingress_request_router.lua (pooled keep-alive cosockets).
# ngx1: one worker (master_process off: one process, like HAProxy -db and ingressd); ngx2: two
# workers (the 2-thread rows); ngx-failover, ngx-unreachable: the failover checks (a dead router).
if ((WITH_NGINX)); then
  render_nginx "$TMP/ngx1" $P_NGX 1
  render_nginx "$TMP/ngx2" $P_NGX2 2
  # the failover checks' topologies: the llm app's pool gets a third co-located router that is
  # dead (failover), or has only that one (unreachable)
  python3 - "$TMP/topology.json" "$TMP" "$NODE_IP" "$P_DEAD_ROUTER" <<'EOF'
import copy, json, sys
src, tmp, node_ip, port = sys.argv[1:]
doc = json.load(open(src))
dead = {"ip": node_ip, "port": int(port), "instance_id": "bench-node", "name": "SERVE_REPLICA::llm#LLMRouter#dead"}
for name, keep in (("failover", True), ("unreachable", False)):
    d = copy.deepcopy(doc)
    for g in d["target_groups"]:
        if g["app_name"] == "llm":
            g["ingress_request_router_targets"] = (g["ingress_request_router_targets"] if keep else []) + [dead]
    json.dump(d, open("%s/topology-%s.json" % (tmp, name), "w"), indent=1)
EOF
  render_nginx "$TMP/ngx-failover" $P_NGX_CHECK 1 "$TMP/topology-failover.json"
  render_nginx "$TMP/ngx-unreachable" $P_NGX_CHECK 1 "$TMP/topology-unreachable.json"
fi

write_post_lua "$TMP/post.lua"

# ------------------------------------------------------------------ helpers
conns_to() { # lo hi [pid]: established connections towards a port range (the proxy's upstream
  # side); with a pid, only that proxy's own (the idle proxies keep their pools open meanwhile)
  if [ -n "${3:-}" ]; then
    local pat
    pat=$(proc_family "$3" | awk '{printf "%spid=%s,", (NR > 1 ? "|" : ""), $1}')
    ss -Htnp state established "( dport >= :$1 and dport <= :$2 )" 2>/dev/null | grep -cE "$pat" || true
  else
    ss -Htn state established "( dport >= :$1 and dport <= :$2 )" 2>/dev/null | wc -l
  fi
}

# the proxies of the load rounds, in the order of odd rounds (even rounds run them in reverse)
PROXIES=(ingressd haproxy); ((WITH_NGINX)) && PROXIES+=(nginx)
# check_routing NAME PORT [MODE]: bench/lib/check_routing.py (the router's pick is the replica
# that answers, the headers are set; failover; every router dead); exits the bench on a failure
check_routing() {
  local out
  out=$(python3 "$LIB/check_routing.py" --name "$1" --port "$2" --mode "${3:-routing}") ||
    { log "$out"; exit 1; }
  log "$out"
}
# nginx + Lua's failover, before the rounds: a pool with a dead router, then one with only that
check_nginx_failover() {
  local mode
  for mode in failover unreachable; do
    start_bg "nginx-$mode" "$PROXY_CORE" nginx -p "$TMP/ngx-$mode" -c "$TMP/ngx-$mode/nginx.conf"
    local pid=$LAST_PID
    wait_port 127.0.0.1 "$P_NGX_CHECK"
    check_routing nginx "$P_NGX_CHECK" "$mode"
    stop_pid "$pid"
  done
}
# ---- per-thread CPU budgets (the scaling test). On 2 cores, wrk and the nginx fakes need ~0.8 of a
# core to feed one ingressd thread, so a second proxy thread can only take CPU from them: the
# machine, not the proxy, sets the 2-thread throughput. To see whether the proxy's own threads
# scale, each proxy thread gets the same fixed budget (a cgroup v1 CPU quota, BENCH_THREAD_BUDGET
# percent of a core, default 30) and is pinned to its own core, which leaves the load room to spare.
CG_ROOT=/sys/fs/cgroup/cpu
BUDGET_PCT=${BENCH_THREAD_BUDGET:-30}
CGROUPS=()
budget_available() { [ -e "$CG_ROOT/cpu.cfs_quota_us" ] && mkdir "$CG_ROOT/ingressd-bench-probe-$$" 2>/dev/null &&
                     rmdir "$CG_ROOT/ingressd-bench-probe-$$"; }
proxy_threads() { # pid: the threads that carry traffic (ingressd's workers; every HAProxy thread;
  # nginx's worker processes, one thread each, or nginx itself when it runs without a master)
  local pid=$1 t kids
  kids=$(cat /proc/"$pid"/task/*/children 2>/dev/null || true)
  if [ -n "$kids" ]; then echo $kids; return; fi
  for t in /proc/"$pid"/task/*; do
    local comm; comm=$(cat "$t/comm" 2>/dev/null) || continue
    if [ "$pid" = "$ING_PID" ]; then [[ $comm == ingressd-w* ]] || continue; fi
    echo "${t##*/}"
  done
}
budget_threads() { # pid core...: the i-th traffic thread on the i-th core, each with its own quota
  local pid=$1; shift
  local cores=("$@") i=0 t cg
  for t in $(proxy_threads "$pid"); do
    cg=$CG_ROOT/ingressd-bench-$$-$t
    mkdir "$cg"
    CGROUPS+=("$cg")
    echo 10000 >"$cg/cpu.cfs_period_us"
    echo $((BUDGET_PCT * 100)) >"$cg/cpu.cfs_quota_us"
    echo "$t" >"$cg/tasks"
    taskset -p -c "${cores[i % ${#cores[@]}]}" "$t" >/dev/null
    i=$((i + 1))
  done
  ((i > 0)) || { log "ERROR: no traffic threads found in pid $pid"; exit 1; }
}
release_budgets() { # after the budgeted proxies stopped: their cgroups are empty and can go
  local cg
  for cg in "${CGROUPS[@]}"; do rmdir "$cg" 2>/dev/null || true; done
  CGROUPS=()
}

# run_scenario ROUND PROXY PORT PID SCENARIO: a plain_cN (GET) or router_cN (POST) scenario
run_scenario() {
  local scen=$5 kind=POST
  [[ $scen == plain_* ]] && kind=GET
  run_wrk "$1" "$2" "$3" "$4" "$scen" "${scen##*_c}" "$kind"
}

# run_wrk ROUND PROXY PORT PID SCENARIO CONNS GET|POST
run_wrk() {
  local round=$1 proxy=$2 port=$3 pid=$4 scen=$5 conns=$6 kind=$7
  local url="http://127.0.0.1:$port/v1/models" script=()
  if [ "$kind" = POST ]; then url="http://127.0.0.1:$port/v1/chat/completions"; script=(-s "$TMP/post.lua"); fi
  local out=$TMP/wrk-$round-$proxy-$scen.txt
  taskset -c $LOAD_CORE wrk -t1 -c"$conns" -d"${WARMUP}s" "${script[@]}" "$url" >/dev/null 2>&1 || true
  local c0="" c1="" s0 s1 l0 l1 t0 t1
  [ -n "$pid" ] && c0=$(cpu_ticks "$pid")
  local a0 a1 q0 q1
  read -r a0 q0 <<<"$(nginx_counts)"
  s0=$(core_sample $PROXY_CORE); l0=$(core_sample $LOAD_CORE); t0=$(date +%s.%N)
  # mid-run: how many upstream connections the proxy holds (pooled = flat and small)
  (sleep "$(awk -v d="$DURATION" 'BEGIN{print d/2}')"
   echo "$(conns_to "${REPLICA_PORTS[0]}" "${REPLICA_PORTS[3]}" "$pid") $(conns_to "${ROUTER_PORTS[0]}" "${ROUTER_PORTS[1]}" "$pid")" \
     >"$out.conns") &
  local sampler=$!
  taskset -c $LOAD_CORE wrk -t1 -c"$conns" -d"${DURATION}s" --latency "${script[@]}" "$url" >"$out" 2>&1 || true
  wait "$sampler" 2>/dev/null || true
  s1=$(core_sample $PROXY_CORE); l1=$(core_sample $LOAD_CORE); t1=$(date +%s.%N)
  read -r a1 q1 <<<"$(nginx_counts)"
  local args=(--file "$out" --round "$round" --proxy "$proxy" --scenario "$scen"
              --core-busy "$(busy_pct "$s0" "$s1")" --load-core-busy "$(busy_pct "$l0" "$l1")"
              --elapsed "$(awk -v a="$t0" -v b="$t1" 'BEGIN{print b-a}')"
              --upstream-accepts $((a1 - a0 - 1)) --upstream-requests $((q1 - q0 - 1)))
  if [ -n "$pid" ]; then c1=$(cpu_ticks "$pid"); args+=(--cpu-ticks $((c1 - c0)) --clk-tck "$CLK_TCK"); fi
  python3 "$LIB/report.py" wrk "${args[@]}" | tee -a "$RESULTS" >"$out.rows"
  if [ -s "$out.conns" ]; then
    read -r up rt <"$out.conns"
    printf '%s\t%s\t%s\tup_conns\t%s\n%s\t%s\t%s\trouter_conns\t%s\n' \
      "$round" "$proxy" "$scen" "$up" "$round" "$proxy" "$scen" "$rt" >>"$RESULTS"
  fi
  log "[r$round] $scen $proxy: $(awk -F'\t' '{printf "%s=%s ", $4, $5}' "$out.rows")conns(replica/router)=$(cat "$out.conns" 2>/dev/null)"
}

run_idle() { # round proxy
  local round=$1 proxy=$2 port pid json
  port=$(proxy_port "$proxy"); pid=$(proxy_pid "$proxy")
  json=$(taskset -c $LOAD_CORE python3 "$LIB/idle_conns.py" --port "$port" --pid "$pid" --n "$IDLE_N") || true
  log "[r$round] idle $proxy: $json"
  [ -n "$json" ] && python3 "$LIB/report.py" json --json "$json" --round "$round" --proxy "$proxy" \
    --scenario idle --keys bytes_per_conn,failed,non200,closed_in_sample >>"$RESULTS"
}

run_streams() { # round proxy: memory per concurrent SSE stream (router path, streams held open)
  local round=$1 proxy=$2 port pid json
  port=$(proxy_port "$proxy"); pid=$(proxy_pid "$proxy")
  json=$(taskset -c $LOAD_CORE python3 "$LIB/sse_streams.py" --port "$port" --pid "$pid" --n "$STREAMS_N" \
         --hold-ms 120000) || true
  log "[r$round] streams $proxy: $json"
  [ -n "$json" ] && python3 "$LIB/report.py" json --json "$json" --round "$round" --proxy "$proxy" \
    --scenario streams --keys held,bytes_per_stream,failed >>"$RESULTS"
}

run_ttft() { # round proxy|direct [scenario [port pid]] (--ab names its builds' port and pid)
  local round=$1 proxy=$2 scen=${3:-sse} port=${4:-} json pid=${5:-} c0=0
  if [ "$proxy" = direct ]; then port=$P_SSE
  elif [ -z "$port" ]; then port=$(proxy_port "$proxy"); pid=$(proxy_pid "$proxy"); fi
  [ -n "$pid" ] && c0=$(cpu_ns "$pid")
  json=$(taskset -c $LOAD_CORE python3 "$LIB/ttft.py" --port "$port" --n "$TTFT_N" --warmup 10) || true
  log "[r$round] $scen $proxy: $json"
  [ -n "$json" ] && python3 "$LIB/report.py" json --json "$json" --round "$round" --proxy "$proxy" \
    --scenario "$scen" --keys ttft_p50_ms,ttft_p99_ms,lag_p50_ms,batched,errors >>"$RESULTS"
  # the proxy's CPU per streamed request (10 warm-up + N), spinning included: what busy polling costs
  [ -n "$pid" ] && printf '%s\t%s\t%s\tcpu_us\t%s\n' "$round" "$proxy" "$scen" \
    "$(awk -v a="$c0" -v b="$(cpu_ns "$pid")" -v n=$((TTFT_N + 10)) 'BEGIN{printf "%.1f", (b - a) / 1000 / n}')" >>"$RESULTS"
  return 0
}

# ------------------------------------------------------------------ run
T_START=$(date +%s)
log "temp dir $TMP; ingressd $INGRESSD (GLIBC_TUNABLES=${ING_TUNABLES:-unset}); $HAP_VERSION"
log "cores: proxy on $PROXY_CORE, wrk + fakes + clients on $LOAD_CORE; rounds=$ROUNDS duration=${DURATION}s idle_conns=$IDLE_N; $PRIO"
log "other load on this machine right now (loadavg): $(cut -d' ' -f1-3 /proc/loadavg)"
start_bg nginx $LOAD_CORE nginx -p "$TMP" -c "$TMP/nginx.conf"
start_bg sse_server $LOAD_CORE python3 "$LIB/sse_server.py" --port "$P_SSE" --events 3 --interval-ms 5
wait_port 127.0.0.1 "${REPLICA_PORTS[0]}"; wait_port 127.0.0.1 "$P_SSE"
((HEDGE)) || wait_port $NODE_IP "${ROUTER_PORTS[0]}"

# --hedge: the llm app's two co-located routers answer late on purpose (ingressd-bench-router);
# per condition, HAProxy + Lua, ingressd (router.hedge auto, the default), ingressd with
# router.hedge off and nginx + Lua run side by side on the proxy core, each measured while the
# others idle.
if ((HEDGE)); then
  ROUTER_BIN=${BENCH_ROUTER:-$(dirname "$INGRESSD")/ingressd-bench-router}
  if [ ! -x "$ROUTER_BIN" ]; then
    (cd "$ROOT" && cmake --build --preset release --target ingressd-bench-router >/dev/null)
    ROUTER_BIN=$ROOT/build/release/ingressd-bench-router
  fi
  { cat "$TMP/ingressd.yaml"; printf 'router:\n  hedge: off\n'; } >"$TMP/ingressd-nohedge.yaml"
  replica_args=()
  for i in 0 1 2 3; do replica_args+=(--replica "SERVE_REPLICA::llm#LLMServer#${REPLICA_NAMES[$i]}=127.0.0.1:${REPLICA_PORTS[$i]}"); done
  # condition -> the first router's delay arguments (the second always answers at once)
  declare -A CONDITION=([healthy]="" [stall5]="--delay-ms 50 --delay-share 0.05" [slow20]="--delay-ms 20")
  hedge_sent() { # ingressd's hedges sent and llm requests answered so far, from its /metrics
    python3 - "$1" <<'EOF'
import re, sys, urllib.request
text = urllib.request.urlopen("http://127.0.0.1:%s/metrics" % sys.argv[1], timeout=5).read().decode()
h = sum(float(v) for v in re.findall(r'^ingressd_router_hedges_total\{app="llm",result="sent"\} (\S+)', text, re.M))
q = sum(float(v) for v in re.findall(r'^ingressd_requests_total\{app="llm",[^}]*\} (\S+)', text, re.M))
print("%d %d" % (h, q))
EOF
  }
  for ((r = 1; r <= ROUNDS; r++)); do
    for cond in healthy stall5 slow20; do
      read -ra delay <<<"${CONDITION[$cond]}"
      start_bg router-q1 $LOAD_CORE "$ROUTER_BIN" --listen "$NODE_IP:${ROUTER_PORTS[0]}" "${replica_args[@]}" "${delay[@]}"
      Q1=$LAST_PID
      start_bg router-q2 $LOAD_CORE "$ROUTER_BIN" --listen "$NODE_IP:${ROUTER_PORTS[1]}" "${replica_args[@]}"
      Q2=$LAST_PID
      wait_port $NODE_IP "${ROUTER_PORTS[0]}"; wait_port $NODE_IP "${ROUTER_PORTS[1]}"
      start_proxies 1
      ingressd_args "$P_ING2" "$P_ING2_ADMIN" "$TMP/ingressd-nohedge.yaml" 1
      start_bg ingressd-nohedge "$PROXY_CORE" "${ING_ENV[@]}" "$INGRESSD" "${ING_ARGS[@]}"
      NOH_PID=$LAST_PID
      wait_port 127.0.0.1 "$P_ING2"; probe 127.0.0.1 "$P_ING2" || { tail -20 "$TMP/ingressd-nohedge.log" >&2; exit 1; }
      ORDER=(ingressd nohedge haproxy); ((WITH_NGINX)) && ORDER+=(nginx)
      if ((r % 2 == 0)); then rev=(); for p in "${ORDER[@]}"; do rev=("$p" "${rev[@]}"); done; ORDER=("${rev[@]}"); fi
      for p in "${ORDER[@]}"; do
        case $p in
          ingressd) port=$ING_PORT; pid=$ING_PID ;;
          nohedge) port=$P_ING2; pid=$NOH_PID ;;
          haproxy) port=$HAP_PORT; pid=$HAP_PID ;;
          nginx) port=$NGX_PORT; pid=$NGX_PID ;;
        esac
        [ "$p" = ingressd ] && read -r h0 q0 <<<"$(hedge_sent "$P_ING_ADMIN")"
        run_wrk "$r" "$p" "$port" "$pid" "hedge_${cond}" 64 POST
        if [ "$p" = ingressd ]; then
          read -r h1 q1 <<<"$(hedge_sent "$P_ING_ADMIN")"
          printf '%s\t%s\t%s\thedged_pct\t%s\n' "$r" ingressd "hedge_${cond}" \
            "$(awk -v h=$((h1 - h0)) -v q=$((q1 - q0)) 'BEGIN{printf "%.3f", q ? 100 * h / q : 0}')" >>"$RESULTS"
        fi
      done
      stop_pid "$NOH_PID"; stop_proxies; stop_pid "$Q1"; stop_pid "$Q2"
    done
  done
  echo
  echo "late routers, router path POST at 64 connections: HAProxy $(awk '{print $3}' <<<"$HAP_VERSION") + Lua vs" \
       "ingressd (router.hedge auto) vs ingressd (router.hedge off)$( ((WITH_NGINX)) && echo " vs nginx + Lua (pooled cosockets)");" \
       "proxy core $PROXY_CORE; $ROUNDS round(s) x ${DURATION}s;" \
       "loadavg at end $(cut -d' ' -f1-3 /proc/loadavg)"
  python3 "$LIB/report.py" hedge --results "$RESULTS"
  exit 0
fi

# --profile: ingressd alone under callgrind, 64 connections (BENCH_PROFILE_CONNS); instructions are counted only while
# wrk's measured run goes (zeroed after the warm-up), so Ir/request is repeatable whatever else
# the machine is doing — the number to compare before and after an optimisation.
if [ -n "$PROFILE" ]; then
  PCONNS=${BENCH_PROFILE_CONNS:-64}
  kind=GET; [ "$PROFILE" = router ] && kind=POST
  ingressd_args "$P_ING" "$P_ING_ADMIN" "$TMP/ingressd.yaml" 1
  start_bg ingressd "$PROXY_CORE" "${ING_ENV[@]}" valgrind --tool=callgrind ${BENCH_CALLGRIND_OPTS:-} --instr-atstart=no --callgrind-out-file="$TMP/callgrind.out" \
    "$INGRESSD" "${ING_ARGS[@]}"
  ING_PID=$LAST_PID
  for _ in $(seq 300); do (exec 3<>"/dev/tcp/127.0.0.1/$P_ING") 2>/dev/null && break; sleep 0.1; done
  probe 127.0.0.1 "$P_ING" || { tail -20 "$TMP/ingressd.log" >&2; exit 1; }
  url="http://127.0.0.1:$P_ING/v1/models"; script=()
  [ "$kind" = POST ] && { url="http://127.0.0.1:$P_ING/v1/chat/completions"; script=(-s "$TMP/post.lua"); }
  taskset -c $LOAD_CORE wrk -t1 -c"$PCONNS" -d"${WARMUP}s" "${script[@]}" "$url" >/dev/null 2>&1 || true
  callgrind_control -i on "$ING_PID" >/dev/null 2>&1
  taskset -c $LOAD_CORE wrk -t1 -c"$PCONNS" -d"${DURATION}s" "${script[@]}" "$url" >"$TMP/wrk-profile.txt" 2>&1 || true
  callgrind_control -d "$ING_PID" >/dev/null 2>&1
  reqs=$(awk '/requests in/ {print $1}' "$TMP/wrk-profile.txt")
  errs=$(awk '/Non-2xx|Socket errors/' "$TMP/wrk-profile.txt")
  out=$(ls -t "$TMP"/callgrind.out* | head -1)
  ir=$(callgrind_annotate "$out" 2>/dev/null | awk '/PROGRAM TOTALS/ {gsub(",", "", $1); print $1}')
  callgrind_annotate --auto=no --threshold=95 "$out" >"$TMP/profile-top.txt" 2>/dev/null || true
  echo "profile $PROFILE: $reqs requests, $ir instructions, $(awk -v a="$ir" -v b="$reqs" 'BEGIN{printf "%.0f", a/b}') Ir/request ${errs:+($errs)}"
  echo "self-cost top: $TMP/profile-top.txt; data: $out (kcachegrind/callgrind_annotate)"
  stop_pid "$ING_PID"
  # the kernel side: system calls per request, counted by strace on a native run
  if command -v strace >/dev/null; then
    start_bg ingressd "$PROXY_CORE" "${ING_ENV[@]}" "$INGRESSD" "${ING_ARGS[@]}"
    ING_PID=$LAST_PID
    wait_port 127.0.0.1 "$P_ING"; probe 127.0.0.1 "$P_ING"
    taskset -c $LOAD_CORE wrk -t1 -c"$PCONNS" -d"${WARMUP}s" "${script[@]}" "$url" >/dev/null 2>&1 || true
    strace ${BENCH_STRACE_OPTS:--c} -f -qq -o "$TMP/strace.txt" -p "$ING_PID" & st=$!
    sleep 0.5
    taskset -c $LOAD_CORE wrk -t1 -c"$PCONNS" -d"${DURATION}s" "${script[@]}" "$url" >"$TMP/wrk-strace.txt" 2>&1 || true
    kill -INT "$st"; wait "$st" 2>/dev/null || true
    reqs=$(awk '/requests in/ {print $1}' "$TMP/wrk-strace.txt")
    awk -v r="$reqs" '$1 ~ /^[0-9.]+$/ && NF >= 5 {c = $4; name = $NF; if (c ~ /^[0-9]+$/) printf "  %-16s %6.2f /request\n", name, c / r}' \
      "$TMP/strace.txt" | sort -k2 -rn | head -12
    awk -v r="$reqs" '/total/ {printf "  %-16s %6.2f /request (%d requests under strace)\n", "all syscalls", $4 / r, r}' "$TMP/strace.txt"
  fi
  exit 0
fi

# --ab: both builds run at once on the proxy core (each sleeps while the other is measured);
# every pair runs A then B or B then A, alternating, back to back
if [ -n "$AB" ]; then
  declare -A AB_PORT=([new]=$P_ING [old]=$P_ING2) AB_PID
  ingressd_args "$P_ING" "$P_ING_ADMIN" "$TMP/ingressd.yaml" 1
  start_bg ingressd "$PROXY_CORE" "${ING_ENV[@]}" "$INGRESSD" "${ING_ARGS[@]}"
  AB_PID[new]=$LAST_PID
  ingressd_args "$P_ING2" "$P_ING2_ADMIN" "$TMP/ingressd.yaml" 1
  start_bg ingressd-old "$PROXY_CORE" "${ING_ENV[@]}" "$AB" "${ING_ARGS[@]}"
  AB_PID[old]=$LAST_PID
  for p in new old; do
    wait_port 127.0.0.1 "${AB_PORT[$p]}"
    probe 127.0.0.1 "${AB_PORT[$p]}" || { tail -20 "$TMP"/ingressd*.log >&2; exit 1; }
  done
  for ((r = 1; r <= ROUNDS; r++)); do
    if ((r % 2)); then ORDER=(new old); else ORDER=(old new); fi
    for scen in "${SCENARIOS[@]}"; do
      for p in "${ORDER[@]}"; do run_scenario "$r" "$p" "${AB_PORT[$p]}" "${AB_PID[$p]}" "$scen"; done
    done
    # SSE time to first event through the router path (TTFT_N streams per build and round)
    if ((TTFT_N > 0)); then
      for p in "${ORDER[@]}"; do run_ttft "$r" "$p" sse "${AB_PORT[$p]}" "${AB_PID[$p]}"; done
    fi
  done
  stop_pid "${AB_PID[new]}"; stop_pid "${AB_PID[old]}"
  echo
  echo "new: $INGRESSD"
  echo "old: $AB"
  echo "$ROUNDS pairs x ${DURATION}s per scenario, proxy core $PROXY_CORE; loadavg at end $(cut -d' ' -f1-3 /proc/loadavg)"
  python3 "$LIB/report.py" ab --results "$RESULTS"
  exit 0
fi

BUDGETS=0
if ((THREADS2)); then
  if budget_available; then BUDGETS=1
  else log "per-thread CPU budgets need a writable cgroup v1 cpu controller ($CG_ROOT, root): scaling under budgets not measured"; fi
fi

# direct baselines: generator + upstream capacity on core 0 (must be well above the proxies' rates)
run_wrk 0 direct "${REPLICA_PORTS[0]}" "" direct_get_c64 64 GET
run_wrk 0 direct "${REPLICA_PORTS[0]}" "" direct_post_c64 64 POST
# nginx + Lua's router failover, on instances of their own (bench/lib/check_routing.py)
((WITH_NGINX)) && check_nginx_failover

for ((r = 1; r <= ROUNDS; r++)); do
  # odd rounds: ingressd, haproxy, nginx; even rounds the reverse, so drift cancels out
  if ((r % 2)); then ORDER=("${PROXIES[@]}"); else ORDER=(); for p in "${PROXIES[@]}"; do ORDER=("$p" "${ORDER[@]}"); done; fi
  start_proxies 1
  # before the first measurement: every proxy sends each request to the replica its router chose
  # and sets the forwarding headers (bench/lib/check_routing.py)
  if ((r == 1)); then for p in "${ORDER[@]}"; do check_routing "$p" "$(proxy_port "$p")"; done; fi
  # idle memory first, on freshly started processes (only the readiness probe has run): after a
  # load test both processes keep freed memory (HAProxy in its pools, ingressd in malloc), and new
  # idle connections would reuse it for free
  ((SCALING_ONLY)) || for p in "${ORDER[@]}"; do run_idle "$r" "$p"; done
  # many SSE streams at once: after the idle test, on the same fresh processes, before the load
  # tests; the proxies are restarted afterwards so that the streams' memory does not linger
  if ((! QUICK && ! SCALING_ONLY)); then
    for p in "${ORDER[@]}"; do run_streams "$r" "$p"; done
    stop_proxies; start_proxies 1
  fi
  if ((! SCALING_ONLY)); then
    run_ttft "$r" direct
    for p in "${ORDER[@]}"; do run_ttft "$r" "$p"; done
  fi
  for scen in "${SCENARIOS[@]}"; do
    for p in "${ORDER[@]}"; do run_scenario "$r" "$p" "$(proxy_port "$p")" "$(proxy_pid "$p")" "$scen"; done
  done
  stop_proxies
  # SSE TTFT again with busy polling on both (ingressd busy_poll_us, HAProxy busy-polling; nginx
  # has no busy polling and is not started)
  if ((! SCALING_ONLY)) && ((TTFT_N > 0)); then
    # One at a time: HAProxy's busy-polling spins always, and would take the shared proxy core
    # from ingressd in 4 ms slices; the proxy not measured is paused (SIGSTOP).
    start_proxies 1 bp
    for p in "${ORDER[@]}"; do
      [ "$p" = nginx ] && continue
      other=$HAP_PID; [ "$p" = haproxy ] && other=$ING_PID
      kill -STOP "$other"
      run_ttft "$r" "$p" sse_bp
      kill -CONT "$other"
    done
    stop_proxies
  fi
  if ((THREADS2)); then
    start_proxies 2
    for p in "${ORDER[@]}"; do
      run_wrk "$r" "$p" "$(proxy_port "$p")" "$(proxy_pid "$p")" router_c64_t2 64 POST
    done
    stop_proxies
    if ((BUDGETS)); then
      for threads in 1 2; do
        start_proxies "$threads"
        cores=("$PROXY_CORE"); ((threads == 2)) && cores=("$PROXY_CORE" "$LOAD_CORE")
        budget_threads "$ING_PID" "${cores[@]}"
        budget_threads "$HAP_PID" "${cores[@]}"
        [ -n "$NGX_PID" ] && budget_threads "$NGX_PID" "${cores[@]}"
        for p in "${ORDER[@]}"; do
          run_wrk "$r" "$p" "$(proxy_port "$p")" "$(proxy_pid "$p")" "router_c64_b$threads" 64 POST
        done
        stop_proxies
        release_budgets
      done
    fi
  fi
done

echo
ngx_label=""
((WITH_NGINX)) && ngx_label=" vs nginx $NGX_VERSION, 1 worker + lua-nginx-module $NGX_LUA_VERSION (pooled cosockets)"
echo "ingressd --threads 1 vs HAProxy $(awk '{print $3}' <<<"$HAP_VERSION") nbthread 1 + Lua (Ray router data plane)$ngx_label," \
     "proxy on core $PROXY_CORE, load + fakes on core $LOAD_CORE; $ROUNDS round(s) x ${DURATION}s; idle test N=$IDLE_N;" \
     "loadavg at end $(cut -d' ' -f1-3 /proc/loadavg); wall time $(( $(date +%s) - T_START ))s"
echo
gate=()
((QUICK)) && gate=(--quick --gate-ratio "$GATE_RATIO")
set +e
python3 "$LIB/report.py" table --results "$RESULTS" "${gate[@]}"
rc=$?
set -e
cp "$RESULTS" "${BENCH_RESULTS_OUT:-/dev/null}" 2>/dev/null || true
exit $rc
