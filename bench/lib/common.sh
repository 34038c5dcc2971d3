# Shared by bench/run.sh and bench/tls.sh (sourced, not run): logging, package checks, process
# start/stop on a pinned core, CPU sampling, and the fakes (nginx replicas + routers, the Ray
# topology, HAProxy's Lua tables) both benchmarks run on. Callers set TMP, PIDS, NOFILE, NODE_IP,
# REPLICA_NAMES, REPLICA_PORTS, ROUTER_PORTS, P_SSE, P_SSE_ROUTER and P_STATUS first.

log() { printf '%s %s\n' "$(date +%H:%M:%S)" "$*" >&2; }

# write_post_lua FILE: the router path's wrk script, the same chat-completion POST for every proxy
write_post_lua() {
  cat >"$1" <<'EOF'
wrk.method = "POST"
wrk.body = '{"model":"llm","stream":false,"max_tokens":16,"messages":[{"role":"user","content":"Say hello."}]}'
wrk.headers["Content-Type"] = "application/json"
EOF
}

# install_missing PKG...: installs from Debian the packages dpkg does not have
install_missing() {
  local p missing=() sudo=""
  for p in "$@"; do
    [[ $(dpkg-query -W -f='${Status}' "$p" 2>/dev/null) == "install ok installed" ]] || missing+=("$p")
  done
  ((${#missing[@]})) || return 0
  [ "$(id -u)" -eq 0 ] || sudo="sudo"
  log "installing from Debian: ${missing[*]}"
  $sudo apt-get update -qq
  DEBIAN_FRONTEND=noninteractive $sudo apt-get install -y -qq --no-install-recommends "${missing[@]}" >/dev/null
}

# Our processes (this shell and everything it starts) get priority over background work such as
# compilers (niced builds), which otherwise take slices of the proxy core. Only our own priority
# changes; both proxies get the same. BENCH_NICE=0 disables it. Sets PRIO.
set_priority() {
  if [ "${BENCH_NICE:--10}" != 0 ] && renice -n "${BENCH_NICE:--10}" -p $BASHPID >/dev/null 2>&1; then
    PRIO="nice ${BENCH_NICE:--10}"
  else
    PRIO="nice $(nice)"
  fi
}

# kill_all: TERM every process in PIDS, up to 2 s to go, then KILL (the cleanup on exit)
# The machine as every benchmark uses it: ingressd with its systemd unit's allocator setting
# (ING_ENV; docs/operations.md "Memory allocator"; BENCH_GLIBC_TUNABLES overrides it, empty =
# glibc's defaults), the load on core 0 and the proxy under test on core 1 (LOAD_CORE, PROXY_CORE,
# BOTH_CORES; one CPU: both on core 0, with a warning), CLK_TCK, and our priority (set_priority).
bench_machine() {
  ING_TUNABLES=${BENCH_GLIBC_TUNABLES-$(sed -n 's/^Environment=GLIBC_TUNABLES=//p' "$ROOT/packaging/systemd/ingressd.service" 2>/dev/null || true)}
  ING_ENV=(env ${ING_TUNABLES:+GLIBC_TUNABLES=$ING_TUNABLES})
  NCPU=$(nproc)
  if ((NCPU >= 2)); then LOAD_CORE=0; PROXY_CORE=1; BOTH_CORES=0,1
  else LOAD_CORE=0; PROXY_CORE=0; BOTH_CORES=0
    log "WARNING: 1 CPU: proxy and load share the core, numbers are not meaningful"; fi
  CLK_TCK=$(getconf CLK_TCK)
  set_priority
}

# The run's results file in $TMP (made by the caller) and the exit trap: every process the run
# started (PIDS) is stopped, and $TMP removed unless --keep (KEEP=1). Scripts with more to undo
# (run.sh's CPU budgets) keep their own trap.
start_run() {  # start_run RESULTS_FILE_NAME
  RESULTS=$TMP/$1
  : >"$RESULTS"
  PIDS=()
  trap end_run EXIT
  trap 'exit 130' INT TERM
}
end_run() {
  local rc=$?
  kill_all
  wait 2>/dev/null || true
  if ((KEEP)); then log "kept $TMP"; else rm -rf "$TMP"; fi
  exit $rc
}

kill_all() {
  local pid
  for pid in "${PIDS[@]}"; do kill -TERM "$pid" 2>/dev/null || true; done
  for _ in 1 2 3 4 5 6 7 8 9 10; do
    local alive=0
    for pid in "${PIDS[@]}"; do kill -0 "$pid" 2>/dev/null && alive=1; done
    ((alive)) || break
    sleep 0.2
  done
  for pid in "${PIDS[@]}"; do kill -KILL "$pid" 2>/dev/null || true; done
}

LAST_PID=""
start_bg() { # name core cmd...
  local name=$1 core=$2; shift 2
  taskset -c "$core" "$@" >>"$TMP/$name.log" 2>&1 &
  LAST_PID=$!
  PIDS+=("$LAST_PID")
}
stop_pid() {
  local pid=$1
  kill -TERM "$pid" 2>/dev/null || return 0
  for _ in $(seq 50); do kill -0 "$pid" 2>/dev/null || break; sleep 0.1; done
  kill -KILL "$pid" 2>/dev/null || true
  wait "$pid" 2>/dev/null || true
  local keep=()
  for p in "${PIDS[@]}"; do [ "$p" = "$pid" ] || keep+=("$p"); done
  PIDS=("${keep[@]}")
}

wait_port() { # host port
  for _ in $(seq 100); do
    (exec 3<>"/dev/tcp/$1/$2") 2>/dev/null && return 0
    sleep 0.1
  done
  echo "nothing listening on $1:$2" >&2; return 1
}
core_sample() { awk -v c="cpu$1" '$1 == c {b = 0; for (i = 2; i <= NF; i++) b += $i; print b - $5 - $6, b}' /proc/stat; }
busy_pct() { awk -v a="$1" -v b="$2" 'BEGIN{split(a,x," "); split(b,y," "); d=y[2]-x[2]; print (d>0 ? 100*(y[1]-x[1])/d : 0)}'; }
nginx_counts() { # connections accepted and requests served so far by the nginx fakes (all
  # replicas + routers), "ACCEPTS REQUESTS"
  local n
  exec 3<>"/dev/tcp/127.0.0.1/$P_STATUS"
  printf 'GET /status HTTP/1.0\r\nHost: x\r\n\r\n' >&3
  n=$(awk '/^ *[0-9]+ +[0-9]+ +[0-9]+ *\r?$/ {print $1, $3}' <&3)
  exec 3<&-
  echo "${n:-0 0}"
}

# render_nginx_fakes WITH_ROUTERS > file: the nginx fakes: four replicas, the llm app's routers
# (WITH_ROUTERS=0: none, --hedge starts its own), the stream app's router and the status counter
render_nginx_fakes() {
  local with_routers=$1 i p
  mkdir -p "$TMP/nginx-tmp"
  cat <<EOF
master_process off;
daemon off;
worker_rlimit_nofile $NOFILE;
pid $TMP/nginx.pid;
error_log $TMP/nginx-error.log warn;
events { worker_connections $((NOFILE - 100)); use epoll; multi_accept on; }
http {
  access_log off;
  server_tokens off;
  default_type text/plain;
  tcp_nodelay on;
  keepalive_timeout 75s;
  keepalive_requests 100000000;
  client_body_temp_path $TMP/nginx-tmp/body;
  proxy_temp_path $TMP/nginx-tmp/proxy;
  fastcgi_temp_path $TMP/nginx-tmp/fastcgi;
  uwsgi_temp_path $TMP/nginx-tmp/uwsgi;
  scgi_temp_path $TMP/nginx-tmp/scgi;
  # A router picks one of the four replicas at random (LLMRouter's load-balanced pick), or the
  # one the session header names (x-session-id: r1..r4; only the routing check sends it).
  split_clients "\${request_id}" \$random_pick { 25% r1; 25% r2; 25% r3; * r4; }
  map \$http_x_session_id \$pick { r1 r1; r2 r2; r3 r3; r4 r4; default \$random_pick; }
  map \$pick \$pick_port {
EOF
  for i in 0 1 2 3; do echo "    ${REPLICA_NAMES[$i]} ${REPLICA_PORTS[$i]};"; done
  echo "  }"
  for i in 0 1 2 3; do
    cat <<EOF
  server {   # data-plane replica SERVE_REPLICA::llm#LLMServer#${REPLICA_NAMES[$i]} (64-byte body)
    listen 127.0.0.1:${REPLICA_PORTS[$i]} backlog=4096;
    location = /-/healthz { return 200 "success"; }
    # the routing check (check_routing): who answered, and the headers the proxy set
    location = /bench/echo { return 200 "replica=${REPLICA_NAMES[$i]} xff=\$http_x_forwarded_for proto=\$http_x_forwarded_proto rid=\$http_x_request_id\n"; }
    location / { default_type application/json; return 200 '{"id":"cmpl-bench","object":"chat.completion","replica":"${REPLICA_NAMES[$i]}"}\n'; }
  }
EOF
  done
  if ((with_routers)); then for p in "${ROUTER_PORTS[@]}"; do
    cat <<EOF
  server {   # ingress request router of app llm (LLMRouter reply shape)
    listen $NODE_IP:$p backlog=4096;
    location = /internal/route {
      default_type application/json;
      return 200 '{"host":"127.0.0.1","port":\$pick_port,"replica_id":"SERVE_REPLICA::llm#LLMServer#\$pick"}';
    }
    location = /health { default_type application/json; return 200 '{"status":"ok"}'; }
  }
EOF
  done; fi
  cat <<EOF
  server {   # connection counter: accepted connections over all fakes (new upstream conns)
    listen 127.0.0.1:$P_STATUS;
    location = /status { stub_status; }
  }
  server {   # ingress request router of app stream: its only replica is the Python SSE server
    listen $NODE_IP:$P_SSE_ROUTER backlog=4096;
    location = /internal/route {
      default_type application/json;
      return 200 '{"host":"127.0.0.1","port":$P_SSE,"replica_id":"SERVE_REPLICA::stream#LLMServer#s1"}';
    }
  }
}
EOF
}

# ingressd_yaml > file: the settings of every ingressd of a run: no access log, quick stop,
# keep-alive as long as HAProxy's; then BENCH_INGRESSD_YAML, more settings (e.g. "router: {hedge: off}")
ingressd_yaml() {
  cat <<EOF
# benchmark settings: no access log, quick stop, keep-alive as long as HAProxy's
log_level: warn
access_log: "off"
client:
  keepalive_timeout: 75s
drain:
  min_period: 0s
  timeout: 0s
EOF
  if [ -n "${BENCH_INGRESSD_YAML:-}" ]; then printf '%s\n' "$BENCH_INGRESSD_YAML"; fi
}

# render_topology FILE: the Ray JSON topology ingressd reads (apps llm and stream)
render_topology() {
  python3 - "$1" "$NODE_IP" "$P_SSE" "$P_SSE_ROUTER" \
    "${REPLICA_PORTS[*]}" "${ROUTER_PORTS[*]}" "${REPLICA_NAMES[*]}" <<'EOF'
import json, sys
out, node_ip, p_sse, p_sse_router, rports, qports, names = sys.argv[1:]
t = lambda ip, port, name: {"ip": ip, "port": int(port), "instance_id": "bench-node", "name": name}
doc = {"target_groups": [
    {"app_name": "llm", "route_prefix": "/", "protocol": "HTTP",
     "ingress_deployment_name": "LLMServer",
     "targets": [t("127.0.0.1", p, "SERVE_REPLICA::llm#LLMServer#" + n)
                 for p, n in zip(rports.split(), names.split())],
     "ingress_request_router_targets": [t(node_ip, p, "SERVE_REPLICA::llm#LLMRouter#q%d" % (i + 1))
                                        for i, p in enumerate(qports.split())]},
    {"app_name": "stream", "route_prefix": "/stream", "protocol": "HTTP",
     "ingress_deployment_name": "LLMServer",
     "targets": [t("127.0.0.1", p_sse, "SERVE_REPLICA::stream#LLMServer#s1")],
     "ingress_request_router_targets": [t(node_ip, p_sse_router, "SERVE_REPLICA::stream#LLMRouter#q1")]},
]}
json.dump(doc, open(out, "w"), indent=1)
EOF
}

# ------------------------------------------------------------------ HAProxy + Lua (Ray's rendering)
safe_name() { # get_safe_name(): '#'->'-', '/'->'.', runs of other chars outside [A-Za-z0-9._-] -> '_'
  python3 -c 'import re,sys; print(re.sub(r"[^A-Za-z0-9._-]+", "_", sys.argv[1].replace("#", "-").replace("/", ".")))' "$1"
}
# render_irr_tables SCRIPT > file: the tables HAProxyManager renders into the Ray Lua template
render_irr_tables() {
  local p n
  echo "-- generated by bench/$1: the tables HAProxyManager renders into the Ray Lua template"
  echo "IRR_TIMEOUT_S = 5"
  echo "IRR_FORWARD_BODY = false"
  echo 'IRR_SESSION_HEADER = "x-session-id"'
  echo "IRR_ROUTERS = {"
  echo "  [\"http-llm\"] = {"
  for p in $(printf '%s\n' "${ROUTER_PORTS[@]}" | sort -n); do
    echo "    { host = \"$NODE_IP\", port = $p, host_header = \"$NODE_IP:$p\" },"
  done
  echo "  },"
  echo "  [\"http-stream\"] = { { host = \"$NODE_IP\", port = $P_SSE_ROUTER, host_header = \"$NODE_IP:$P_SSE_ROUTER\" } },"
  echo "}"
  echo "IRR_REPLICA_TARGETS = {"
  echo "  [\"http-llm\"] = {"
  for n in "${REPLICA_NAMES[@]}"; do
    echo "    [\"SERVE_REPLICA::llm#LLMServer#$n\"] = \"$(safe_name "SERVE_REPLICA::llm#LLMServer#$n")\","
  done
  echo "  },"
  echo "  [\"http-stream\"] = { [\"SERVE_REPLICA::stream#LLMServer#s1\"] = \"$(safe_name "SERVE_REPLICA::stream#LLMServer#s1")\" },"
  echo "}"
}

# haproxy_routing > file: the tail of HAProxy's frontend after its binds and headers (the apps by
# route prefix, the Lua router action, the backend choice) and the backends, as Ray renders them
haproxy_routing() {
  cat <<'EOF'
  # apps, longest route prefix first
  acl is_http-stream path /stream
  acl is_http-stream path_beg /stream/
  acl is_http-llm path_beg /
  http-request set-var(txn.ingress_request_router_app) str(http-stream) if is_http-stream !{ var(txn.ingress_request_router_app) -m found }
  http-request set-var(txn.ingress_request_router_app) str(http-llm) if is_http-llm !{ var(txn.ingress_request_router_app) -m found }
  http-request lua.route_via_ingress_request_router if METH_POST { var(txn.ingress_request_router_app) -m found }
  http-request return status 503 content-type text/plain lf-string "Ingress request router failed: %[var(txn.ingress_request_router_failed)]" hdr X-Serve-Reason "%[var(txn.ingress_request_router_failed)]" if { var(txn.ingress_request_router_failed) -m found }
  use_backend http-stream-via-ingress-request-router if is_http-stream { var(txn.via_ingress_request_router) -m bool }
  use_backend http-stream if is_http-stream
  use_backend http-llm-via-ingress-request-router if is_http-llm { var(txn.via_ingress_request_router) -m bool }
  use_backend http-llm if is_http-llm

EOF
  local app
  for app in llm stream; do
    local servers=() ports=()
    if [ $app = llm ]; then
      for i in 0 1 2 3; do servers+=("$(safe_name "SERVE_REPLICA::llm#LLMServer#${REPLICA_NAMES[$i]}")"); ports+=("${REPLICA_PORTS[$i]}"); done
    else
      servers+=("$(safe_name "SERVE_REPLICA::stream#LLMServer#s1")"); ports+=("$P_SSE")
    fi
    echo "backend http-$app"
    echo "  option httpchk GET /-/healthz"
    echo "  http-check expect status 200"
    echo "  default-server inter 5s fastinter 250ms downinter 250ms fall 2 rise 2"
    for i in "${!servers[@]}"; do echo "  server ${servers[$i]} 127.0.0.1:${ports[$i]} check"; done
    echo
    echo "backend http-$app-via-ingress-request-router"
    for s in "${servers[@]}"; do
      echo "  use-server $s if { var(txn.ingress_request_router_target) -m str $s }"
    done
    for i in "${!servers[@]}"; do echo "  server ${servers[$i]} 127.0.0.1:${ports[$i]} track http-$app/${servers[$i]}"; done
    echo
  done
}

# ------------------------------------------------------------------ the proxies under test
# How bench/run.sh (and bench/stream.sh) run the three proxies on the fakes above: HAProxy's config
# (Ray's rendering), nginx + Lua's, the readiness probe, CPU sampling, start and stop. Callers
# also set HERE, ROOT, INGRESSD, ING_ENV, PROXY_CORE, BOTH_CORES, WITH_NGINX and the ports P_ING,
# P_ING_ADMIN, P_HAP, P_NGX (and P_ING2, P_ING2_ADMIN, P_HAP2, P_NGX2 for two threads), and write
# $TMP/haproxy.cfg, $TMP/ingressd.yaml and $TMP/ngx1 (render_nginx) before start_proxies.

haproxy_cfg() { # port nbthread [global-line] > file
  local port=$1 nbthread=$2 extra=${3:-}
  cat <<EOF
# generated by bench/run.sh after Ray Serve's haproxy_templates.py (TPL-pool / TPL-b),
# see /work/shared/spec/ray-serve-ingress.md §1, §2.2, §2.3, §5
global
  nbthread $nbthread
  $extra
  # Ray's default (RAY_SERVE_HAPROXY_MAXCONN). HAProxy then wants ~40k fds; where the hard fd
  # limit is lower (see README), 'no strict-limits' lets it run with what it gets.
  maxconn 20000
  no strict-limits
  tune.bufsize 16384
  lua-load-per-thread $TMP/irr_tables.lua
  lua-load-per-thread $TMP/ingress_request_router.lua

defaults
  mode http
  balance leastconn
  option redispatch 1
  retry-on conn-failure
  option http-no-delay
  http-reuse always
  # the same header changes ingressd makes (X-Forwarded-For/-Proto, one X-Request-Id on both legs)
  option forwardfor
  timeout connect 2s
  timeout client 3600s
  timeout server 300s
  timeout http-request 10s
  timeout http-keep-alive 75s
  unique-id-format %{+X}o%ci%cp%fp%Ts%rt%pid

frontend http_frontend
  bind 127.0.0.1:$port
  http-request return status 200 content-type text/plain string success if { path /-/healthz } { nbsrv(http-llm) ge 1 }
  http-request return status 503 content-type text/plain string "Service Unavailable" if { path /-/healthz }
  http-request set-header X-Forwarded-Proto http
  http-request set-header X-Request-Id %[unique-id] unless { req.hdr(x-request-id) -m found }
EOF
  haproxy_routing
}

render_nginx() { # dir port workers [topology]
  python3 "$HERE/nginx/render.py" --topology "${4:-$TMP/topology.json}" --node-ip "$NODE_IP" \
    --listen "127.0.0.1:$2" --dir "$1" --workers "$3" --nofile "$NOFILE"
  nginx -t -q -p "$1" -c "$1/nginx.conf" >"$1/check.log" 2>&1 || { cat "$1/check.log" >&2; exit 1; }
}

# probe HOST PORT: until the router path (POST) and the plain path (GET) both answer 200
probe() {
  python3 - "$1" "$2" <<'EOF'
import http.client, sys, time
host, port = sys.argv[1], int(sys.argv[2])
deadline, last = time.time() + 15, ""
while time.time() < deadline:
    try:
        ok = True
        for method, path, body in (("GET", "/v1/models", None),
                                   ("POST", "/v1/chat/completions", b'{"model":"llm"}'),
                                   ("POST", "/stream/v1/chat/completions", b'{"model":"llm"}')):
            c = http.client.HTTPConnection(host, port, timeout=3)
            c.request(method, path, body=body, headers={"Content-Type": "application/json"})
            r = c.getresponse(); data = r.read(); c.close()
            if r.status != 200:
                ok, last = False, "%s %s -> %d %s %s" % (method, path, r.status,
                                                         r.getheader("X-Serve-Reason"), data[:120])
                break
        if ok:
            sys.exit(0)
    except OSError as e:
        last = repr(e)
    time.sleep(0.2)
print("not ready on %s:%d: %s" % (host, port, last), file=sys.stderr)
sys.exit(1)
EOF
}
# A proxy's processes: the pid and its children. ingressd and HAProxy (-db) are one process each;
# nginx is one too with one worker (master_process off), and a master + its workers with two.
proc_family() { echo "$1"; cat /proc/"$1"/task/*/children 2>/dev/null || true; }
cpu_ticks() { # utime + stime of all threads of the proxy's processes, in clock ticks
  local p
  for p in $(proc_family "$1"); do cat "/proc/$p/stat" 2>/dev/null || true; done |
    awk '{s += $14 + $15} END {printf "%d", s}'
}
cpu_ns() { # the same from schedstat, ns
  local p
  for p in $(proc_family "$1"); do cat /proc/"$p"/task/*/schedstat 2>/dev/null || true; done |
    awk '{s += $1} END {printf "%d", s}'
}

# ingressd_args LISTEN_PORT ADMIN_PORT CONFIG THREADS: ingressd's command line (after the binary)
# on the bench's topology, in ING_ARGS
ingressd_args() {
  ING_ARGS=(--config "$3" --threads "$4" --listen "127.0.0.1:$1" --admin-listen "127.0.0.1:$2"
            --node-ip "$NODE_IP" --topology-file "$TMP/topology.json")
}

ING_PID=""; HAP_PID=""; NGX_PID=""

start_proxies() { # threads [bp: the busy-poll variant; nginx has no busy polling and sits it out]
  local threads=$1 core=$PROXY_CORE lp=$P_ING ap=$P_ING_ADMIN hp=$P_HAP cfg=$TMP/haproxy.cfg icfg=$TMP/ingressd.yaml
  local ndir=$TMP/ngx1 np=$P_NGX
  if ((threads == 2)); then core=$BOTH_CORES; lp=$P_ING2; ap=$P_ING2_ADMIN; hp=$P_HAP2; cfg=$TMP/haproxy2.cfg
                            ndir=$TMP/ngx2; np=$P_NGX2; fi
  if [ "${2:-}" = bp ]; then cfg=$TMP/haproxy-bp.cfg; icfg=$TMP/ingressd-bp.yaml; fi
  ingressd_args "$lp" "$ap" "$icfg" "$threads"
  start_bg ingressd "$core" "${ING_ENV[@]}" "$INGRESSD" "${ING_ARGS[@]}"
  ING_PID=$LAST_PID
  start_bg haproxy "$core" haproxy -db -f "$cfg"
  HAP_PID=$LAST_PID
  ING_PORT=$lp; HAP_PORT=$hp; NGX_PID=""; NGX_PORT=$np
  if ((WITH_NGINX)) && [ "${2:-}" != bp ]; then
    start_bg nginx-proxy "$core" nginx -p "$ndir" -c "$ndir/nginx.conf"
    NGX_PID=$LAST_PID
  fi
  wait_port 127.0.0.1 "$lp" && wait_port 127.0.0.1 "$hp"
  probe 127.0.0.1 "$lp" || { tail -20 "$TMP/ingressd.log" >&2; exit 1; }
  probe 127.0.0.1 "$hp" || { tail -20 "$TMP/haproxy.log" >&2; exit 1; }
  if [ -n "$NGX_PID" ]; then
    wait_port 127.0.0.1 "$np"
    probe 127.0.0.1 "$np" || { tail -20 "$TMP/nginx-proxy.log" "$ndir/error.log" >&2; exit 1; }
  fi
}

stop_proxies() {
  for pid in "$ING_PID" "$HAP_PID" "$NGX_PID"; do
    [ -n "$pid" ] || continue
    kill -0 "$pid" 2>/dev/null || { log "ERROR: proxy pid $pid died during the run (see logs)"; }
    stop_pid "$pid"
  done
  NGX_PID=""
}
proxy_pid() { case $1 in ingressd) echo "$ING_PID" ;; nginx) echo "$NGX_PID" ;; *) echo "$HAP_PID" ;; esac; }
proxy_port() { case $1 in ingressd) echo "$ING_PORT" ;; nginx) echo "$NGX_PORT" ;; *) echo "$HAP_PORT" ;; esac; }
