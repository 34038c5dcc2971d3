#!/usr/bin/env bash
# TLS termination (issue #19): ingressd --threads 1 vs HAProxy 2.6 nbthread 1 + the Lua router
# action, both terminating TLS, on the fakes and core layout of bench/run.sh, in one run.
#
#   bench/tls.sh [--rounds N] [--duration S] [--idle-conns N] [--conns N] [--ttft-n N]
#                [--idle-request] [--ingressd PATH] [--keep]
#   (also: bench/run.sh --tls ...)
#
# Per round, for each proxy (alternating order; both listen beside their plain port on a TLS one):
#   1. new TLS handshakes/s and proxy CPU per handshake, ECDSA P-256 and RSA 2048 certificates:
#      wrk -H 'Connection: close' GET /v1/models (proxied to a replica), every request a full
#      handshake (wrk's session reuse is switched off, see bench/README "TLS"); for reference
#      the same with wrk's own session resumption, and plain HTTP with a new connection per request
#   2. kept-alive TLS: req/s and CPU per request, plain path (GET) and router path (POST), --conns;
#      the same over plain HTTP for reference
#   3. SSE time to first event over TLS (bench/lib/tls_ttft.py), p50/p99, and direct for reference
#   4. RSS per idle TLS connection (bench/lib/tls_idle_conns.py): handshake done, no request
#
# Layout (2 cores), as bench/run.sh: core 1 = the proxy under test, core 0 = wrk, the nginx fakes,
# the Python SSE replica and the Python clients. Ports BENCH_PORT_BASE (default 18700) .. +40.
set -euo pipefail

HERE=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
ROOT=$(dirname "$HERE")
LIB=$HERE/lib

ROUNDS=3
DURATION=8
WARMUP=2
IDLE_N=10000
CONNS=64
TTFT_N=200
IDLE_REQUEST=0
KEEP=0
INGRESSD=${INGRESSD:-$ROOT/build/release/ingressd}
PORT_BASE=${BENCH_PORT_BASE:-18700}

usage() { sed -n '2,20p' "$0" | sed 's/^# \{0,1\}//'; }
while (($#)); do
  case $1 in
    --rounds) ROUNDS=$2; shift ;;
    --duration) DURATION=$2; shift ;;
    --idle-conns) IDLE_N=$2; shift ;;
    --conns) CONNS=$2; shift ;;
    --ttft-n) TTFT_N=$2; shift ;;
    --idle-request) IDLE_REQUEST=1 ;;
    --ingressd) INGRESSD=$2; shift ;;
    --keep) KEEP=1 ;;
    -h|--help) usage; exit 0 ;;
    *) echo "unknown argument: $1" >&2; usage >&2; exit 2 ;;
  esac
  shift
done
for v in "$ROUNDS" "$DURATION" "$IDLE_N" "$CONNS"; do
  [[ $v =~ ^[1-9][0-9]*$ ]] || { echo "--rounds, --duration, --idle-conns and --conns take positive integers" >&2; exit 2; }
done
[[ $TTFT_N =~ ^[0-9]+$ ]] || { echo "--ttft-n takes an integer (0 = skip)" >&2; exit 2; }
((DURATION < 3)) && WARMUP=1

# shellcheck source=lib/common.sh
source "$LIB/common.sh"

# ------------------------------------------------------------------ dependencies
need=(haproxy nginx wrk python3 iproute2 util-linux openssl gcc libc6-dev)
install_missing "${need[@]}"
[[ $(haproxy -vv 2>/dev/null) == *"Built with Lua"* ]] || { echo "this haproxy has no Lua support" >&2; exit 1; }
[[ $(haproxy -vv 2>/dev/null) == *"+OPENSSL"* ]] || { echo "this haproxy has no OpenSSL support" >&2; exit 1; }
HAP_VERSION=$(haproxy -v 2>/dev/null); HAP_VERSION=${HAP_VERSION%%$'\n'*}
[ -x "$INGRESSD" ] || { echo "no ingressd at $INGRESSD (build it: cmake --preset release && cmake --build --preset release)" >&2; exit 1; }

# ------------------------------------------------------------------ machine (lib/common.sh)
bench_machine
ulimit -n "$(ulimit -Hn)" 2>/dev/null || true
NOFILE=$(ulimit -n)
if ((IDLE_N + 2000 > NOFILE)); then
  log "WARNING: ulimit -n is $NOFILE; idle TLS connection test reduced from $IDLE_N to $((NOFILE - 2000))"
  IDLE_N=$((NOFILE - 2000))
fi

# ------------------------------------------------------------------ ports and temp dir
P_ING=$((PORT_BASE + 0)); P_ING_ADMIN=$((PORT_BASE + 1)); P_HAP=$((PORT_BASE + 2))
P_ING_TLS=$((PORT_BASE + 3)); P_HAP_TLS=$((PORT_BASE + 4))
REPLICA_PORTS=($((PORT_BASE + 10)) $((PORT_BASE + 11)) $((PORT_BASE + 12)) $((PORT_BASE + 13)))
ROUTER_PORTS=($((PORT_BASE + 20)) $((PORT_BASE + 21)))
P_SSE=$((PORT_BASE + 30)); P_SSE_ROUTER=$((PORT_BASE + 31)); P_STATUS=$((PORT_BASE + 40))
REPLICA_NAMES=(r1 r2 r3 r4)
NODE_IP=127.0.0.2          # this node's "Ray node IP": routers live here (co-located)

for p in $P_ING $P_ING_ADMIN $P_HAP $P_ING_TLS $P_HAP_TLS "${REPLICA_PORTS[@]}" "${ROUTER_PORTS[@]}" \
         $P_SSE $P_SSE_ROUTER $P_STATUS; do
  if [ -n "$(ss -Htln "sport = :$p")" ]; then
    echo "port $p is in use; set BENCH_PORT_BASE to a free range" >&2; exit 1
  fi
done

TMP=$(mktemp -d /tmp/ingressd-tls-bench.XXXXXX)
# a private copy of the binary: a rebuild during the run (a shared machine) must not swap it
for _ in $(seq 60); do
  if cp "$INGRESSD" "$TMP/ingressd" 2>/dev/null && "$TMP/ingressd" --version >/dev/null 2>&1; then break; fi
  rm -f "$TMP/ingressd"; sleep 5
done
[ -x "$TMP/ingressd" ] || { echo "cannot copy a working $INGRESSD (being rebuilt?)" >&2; rm -rf "$TMP"; exit 1; }
ING_SRC=$INGRESSD; INGRESSD=$TMP/ingressd
start_run results.tsv


# ------------------------------------------------------------------ certificates
# Self-signed, made for this run: ECDSA P-256 and RSA 2048. ingressd reads cert + key files;
# HAProxy's crt wants one PEM with both.
for kt in ecdsa rsa; do
  if [ $kt = ecdsa ]; then newkey=(-newkey ec -pkeyopt ec_paramgen_curve:prime256v1); else newkey=(-newkey rsa:2048); fi
  openssl req -x509 "${newkey[@]}" -nodes -days 2 -subj "/CN=localhost" \
    -addext "subjectAltName=DNS:localhost,IP:127.0.0.1" \
    -keyout "$TMP/$kt.key" -out "$TMP/$kt.crt" >/dev/null 2>&1 || { echo "openssl req failed ($kt)" >&2; exit 1; }
  cat "$TMP/$kt.crt" "$TMP/$kt.key" >"$TMP/$kt.pem"
done

# wrk keeps its SSL object across reconnects (ssl_close: SSL_shutdown + SSL_clear), so with
# 'Connection: close' it offers the last session's ticket on every new connection, and both
# proxies resume it (checked: HAProxy counts ~99.6 % ssl_reused_sess). This preload drops the
# session after SSL_clear: every connection is a full handshake. The servers stay as configured.
cat >"$TMP/wrk_noresume.c" <<'EOF'
#define _GNU_SOURCE
#include <dlfcn.h>
#include <stddef.h>
typedef struct ssl_st SSL;
int SSL_clear(SSL *s) {
  static int (*real_clear)(SSL *);
  static int (*set_session)(SSL *, void *);
  if (!real_clear) {
    real_clear = (int (*)(SSL *))dlsym(RTLD_NEXT, "SSL_clear");
    set_session = (int (*)(SSL *, void *))dlsym(RTLD_DEFAULT, "SSL_set_session");
  }
  int r = real_clear(s);
  if (r == 1) set_session(s, NULL);
  return r;
}
EOF
gcc -O2 -shared -fPIC -o "$TMP/wrk_noresume.so" "$TMP/wrk_noresume.c" >"$TMP/gcc.log" 2>&1 ||
  { cat "$TMP/gcc.log" >&2; exit 1; }

# ------------------------------------------------------------------ fakes: nginx replicas + routers (as bench/run.sh)
render_nginx_fakes 1 >"$TMP/nginx.conf"

# ------------------------------------------------------------------ topology (Ray JSON) for ingressd (as bench/run.sh)
render_topology "$TMP/topology.json"

ingressd_yaml >"$TMP/ingressd.yaml"   # TLS: the defaults (min_version 1.2, ciphers, ciphersuites; tickets on)

# ------------------------------------------------------------------ HAProxy + Lua (Ray's rendering, as bench/run.sh) + a TLS bind
render_irr_tables tls.sh >"$TMP/irr_tables.lua"
cp "$HERE/haproxy/ingress_request_router.lua" "$TMP/ingress_request_router.lua"

# ingressd's TLS defaults (docs/configuration.md tls.ciphers, tls.ciphersuites, tls.min_version),
# given to HAProxy too so that both negotiate the same suite (checked at the start of the run)
TLS12_CIPHERS=ECDHE-ECDSA-AES128-GCM-SHA256:ECDHE-RSA-AES128-GCM-SHA256:ECDHE-ECDSA-AES256-GCM-SHA384:ECDHE-RSA-AES256-GCM-SHA384:ECDHE-ECDSA-CHACHA20-POLY1305:ECDHE-RSA-CHACHA20-POLY1305
TLS13_SUITES=TLS_AES_128_GCM_SHA256:TLS_AES_256_GCM_SHA384:TLS_CHACHA20_POLY1305_SHA256

haproxy_cfg() { # pem [http-request timeout] > file
  local pem=$1 hreq=${2:-10s}
  cat <<EOF
# generated by bench/tls.sh: bench/run.sh's rendering of Ray Serve's HAProxy config (nbthread 1,
# the Lua router action) plus an HTTPS bind beside the plain one, with ingressd's TLS defaults
global
  nbthread 1
  maxconn 20000
  no strict-limits
  tune.bufsize 16384
  lua-load-per-thread $TMP/irr_tables.lua
  lua-load-per-thread $TMP/ingress_request_router.lua
  stats socket $TMP/haproxy.sock mode 600 level admin
  ssl-default-bind-ciphers $TLS12_CIPHERS
  ssl-default-bind-ciphersuites $TLS13_SUITES
  ssl-default-bind-options ssl-min-ver TLSv1.2
  tune.ssl.default-dh-param 2048

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
  timeout http-request $hreq
  timeout http-keep-alive 75s
  unique-id-format %{+X}o%ci%cp%fp%Ts%rt%pid

frontend http_frontend
  bind 127.0.0.1:$P_HAP
  bind 127.0.0.1:$P_HAP_TLS ssl crt $pem alpn http/1.1
  http-request return status 200 content-type text/plain string success if { path /-/healthz } { nbsrv(http-llm) ge 1 }
  http-request return status 503 content-type text/plain string "Service Unavailable" if { path /-/healthz }
  http-request set-header X-Forwarded-Proto https if { ssl_fc }
  http-request set-header X-Forwarded-Proto http if !{ ssl_fc }
  http-request set-header X-Request-Id %[unique-id] unless { req.hdr(x-request-id) -m found }
EOF
  haproxy_routing
}
for kt in ecdsa rsa; do
  haproxy_cfg "$TMP/$kt.pem" >"$TMP/haproxy-$kt.cfg"
  haproxy -c -q -f "$TMP/haproxy-$kt.cfg" >"$TMP/haproxy-check.log" 2>&1 || { cat "$TMP/haproxy-check.log" >&2; exit 1; }
done
# The idle test's variant: Ray's 'timeout http-request 10s' also bounds the wait for a new
# connection's first request, so HAProxy answers 408 and closes a TLS connection that has sent
# nothing after 10 s, before all N are open (ingressd waits client.keepalive_timeout). The
# timeout does not change what an open connection holds; 120 s keeps them all open.
haproxy_cfg "$TMP/ecdsa.pem" 120s >"$TMP/haproxy-ecdsa-idle.cfg"

write_post_lua "$TMP/post.lua"

# ------------------------------------------------------------------ helpers
# probe SCHEME PORT: until the router path (POST), the plain path (GET) and the stream app answer 200
probe() {
  python3 - "$1" "$2" <<'EOF'
import http.client, ssl, sys, time
scheme, port = sys.argv[1], int(sys.argv[2])
ctx = ssl._create_unverified_context()
deadline, last = time.time() + 15, ""
while time.time() < deadline:
    try:
        ok = True
        for method, path, body in (("GET", "/v1/models", None),
                                   ("POST", "/v1/chat/completions", b'{"model":"llm"}'),
                                   ("POST", "/stream/v1/chat/completions", b'{"model":"llm"}')):
            if scheme == "https":
                c = http.client.HTTPSConnection("127.0.0.1", port, timeout=3, context=ctx)
            else:
                c = http.client.HTTPConnection("127.0.0.1", port, timeout=3)
            c.request(method, path, body=body, headers={"Content-Type": "application/json"})
            r = c.getresponse(); data = r.read(); c.close()
            if r.status != 200:
                ok, last = False, "%s %s -> %d %s %s" % (method, path, r.status, r.getheader("X-Serve-Reason"), data[:120])
                break
        if ok:
            sys.exit(0)
    except OSError as e:
        last = repr(e)
    time.sleep(0.2)
print("not ready on %s://127.0.0.1:%d: %s" % (scheme, port, last), file=sys.stderr)
sys.exit(1)
EOF
}
# CPU of a proxy (one process each: ingressd, HAProxy -db), as bench/run.sh measures it
cpu_ticks() { awk '{printf "%d", $14 + $15}' /proc/"$1"/stat 2>/dev/null || echo 0; }
cpu_ns() { cat /proc/"$1"/task/*/schedstat 2>/dev/null | awk '{s += $1} END {printf "%d", s}'; }
# tls_counts PROXY: the proxy's own count of handshakes so far, "FULL RESUMED FAILED"
# (ingressd: /metrics ingressd_tls_*; HAProxy: the frontend's ssl_sess, ssl_reused_sess,
# ssl_failed_handshake from its stats socket)
tls_counts() {
  python3 - "$1" "$P_ING_ADMIN" "$TMP/haproxy.sock" <<'EOF'
import re, socket, sys, urllib.request
proxy, admin, sock = sys.argv[1], sys.argv[2], sys.argv[3]
try:
    if proxy == "ingressd":
        text = urllib.request.urlopen("http://127.0.0.1:%s/metrics" % admin, timeout=5).read().decode()
        def s(pat):
            return sum(float(v) for v in re.findall(r"^" + pat + r" (\S+)$", text, re.M))
        print("%d %d %d" % (s(r'ingressd_tls_handshakes_total\{kind="full"\}'),
                            s(r'ingressd_tls_handshakes_total\{kind="resumed"\}'),
                            s(r'ingressd_tls_handshake_failures_total\{[^}]*\}')))
    else:
        c = socket.socket(socket.AF_UNIX); c.settimeout(5); c.connect(sock); c.sendall(b"show stat\n")
        out = b""
        while True:
            d = c.recv(65536)
            if not d:
                break
            out += d
        lines = out.decode().splitlines()
        hdr = lines[0].lstrip("# ").split(",")
        for line in lines[1:]:
            row = dict(zip(hdr, line.split(",")))
            if row.get("pxname") == "http_frontend" and row.get("svname") == "FRONTEND":
                print("%s %s %s" % (row.get("ssl_sess") or 0, row.get("ssl_reused_sess") or 0,
                                    row.get("ssl_failed_handshake") or 0))
                break
        else:
            print("0 0 0")
except Exception as e:  # noqa: BLE001
    print("tls_counts %s: %r" % (proxy, e), file=sys.stderr)
    print("0 0 0")
EOF
}

# ingressd's command line on the bench's topology, with the certificate of key type $1
ingressd_cmd() {
  ING_CMD=("${ING_ENV[@]}" "$INGRESSD" --config "$TMP/ingressd.yaml" --threads 1
    --listen "127.0.0.1:$P_ING" --admin-listen "127.0.0.1:$P_ING_ADMIN" --node-ip "$NODE_IP"
    --topology-file "$TMP/topology.json"
    --tls-listen "127.0.0.1:$P_ING_TLS" --tls-cert "$TMP/$1.crt" --tls-key "$TMP/$1.key")
}
# ingressd starts with SIGPIPE ignored, as systemd starts every service (IgnoreSIGPIPE=yes is its
# default, and the unit does not change it); HAProxy ignores SIGPIPE itself.
# BENCH_TLS_SIGPIPE=default leaves the disposition alone. Why it matters: check_reset below.
IGN_PIPE=(bash -c 'trap "" PIPE; exec "$@"' ingressd)
[ "${BENCH_TLS_SIGPIPE:-ignore}" = default ] && IGN_PIPE=()

ING_PID=""; HAP_PID=""; KEYTYPE=""
start_proxies() { # ecdsa|rsa|ecdsa-idle: both proxies, fresh, with that certificate
  local hcfg=$TMP/haproxy-$1.cfg
  KEYTYPE=${1%-idle}
  ingressd_cmd "$KEYTYPE"
  start_bg ingressd "$PROXY_CORE" "${IGN_PIPE[@]}" "${ING_CMD[@]}"
  ING_PID=$LAST_PID
  start_bg haproxy "$PROXY_CORE" haproxy -db -f "$hcfg"
  HAP_PID=$LAST_PID
  wait_port 127.0.0.1 "$P_ING_TLS" && wait_port 127.0.0.1 "$P_HAP_TLS"
  probe https "$P_ING_TLS" || { tail -20 "$TMP/ingressd.log" >&2; exit 1; }
  probe https "$P_HAP_TLS" || { tail -20 "$TMP/haproxy.log" >&2; exit 1; }
  probe http "$P_ING" && probe http "$P_HAP"
}
stop_proxies() {
  for pid in "$ING_PID" "$HAP_PID"; do
    [ -n "$pid" ] || continue
    kill -0 "$pid" 2>/dev/null || log "ERROR: proxy pid $pid died during the run (see $TMP/*.log; run with --keep)"
    stop_pid "$pid"
  done
  ING_PID=""; HAP_PID=""
}
proxy_pid() { case $1 in ingressd) echo "$ING_PID" ;; *) echo "$HAP_PID" ;; esac; }
tls_port() { case $1 in ingressd) echo "$P_ING_TLS" ;; *) echo "$P_HAP_TLS" ;; esac; }
plain_port() { case $1 in ingressd) echo "$P_ING" ;; *) echo "$P_HAP" ;; esac; }

# check_setup PROXY: what the TLS listener negotiates (protocol, suite, key exchange group,
# certificate key) and the X-Forwarded-Proto the replica sees; logged, and kept for the table
check_setup() {
  local proxy=$1 port brief echo_line
  port=$(tls_port "$proxy")
  brief=$(openssl s_client -connect "127.0.0.1:$port" -servername localhost -brief </dev/null 2>&1 |
          awk -F': ' '/^(Protocol version|Ciphersuite|Server Temp Key|Peer signature type)/ {printf "%s%s", sep, $2; sep=", "}')
  echo_line=$(python3 - "$port" <<'EOF'
import http.client, ssl, sys
c = http.client.HTTPSConnection("127.0.0.1", int(sys.argv[1]), timeout=5, context=ssl._create_unverified_context())
c.request("GET", "/bench/echo"); r = c.getresponse()
print(r.status, r.read().decode().strip())
EOF
)
  log "setup $proxy ($KEYTYPE): $brief; replica saw: $echo_line"
  echo "$proxy $KEYTYPE: $brief; /bench/echo via TLS -> $echo_line" >>"$TMP/setup.txt"
  [[ $echo_line == *"proto=https"* ]] || { log "ERROR: $proxy did not send X-Forwarded-Proto: https"; exit 1; }
}

# check_reset: does ingressd, started with the default SIGPIPE disposition (from a shell, or in a
# container under an init process), survive TLS clients that close with data unread (the kernel
# then resets the connection)? Logged and shown above the tables; the run goes on either way.
check_reset() {
  ingressd_cmd ecdsa
  start_bg ingressd-reset-check "$PROXY_CORE" "${ING_CMD[@]}"
  local pid=$LAST_PID out rc=0
  wait_port 127.0.0.1 "$P_ING_TLS"
  # first, on the same process: a TLS client that sends its ClientHello and then stalls must not
  # hold up the worker (--threads 1: every other connection is on the same worker); 3 tries
  STALL_CHECK=$(taskset -c $LOAD_CORE python3 - "$P_ING_TLS" "$P_ING" <<'PY'
import socket, ssl, sys, time, urllib.request
tls, plain = int(sys.argv[1]), int(sys.argv[2])
ctx = ssl.SSLContext(ssl.PROTOCOL_TLS_CLIENT); ctx.check_hostname = False; ctx.verify_mode = ssl.CERT_NONE
res = []
for _ in range(3):
    raw = socket.create_connection(("127.0.0.1", tls), timeout=3); raw.setblocking(False)
    s = ctx.wrap_socket(raw, server_hostname="localhost", do_handshake_on_connect=False)
    try:
        s.do_handshake()
    except ssl.SSLWantReadError:
        pass                      # ClientHello sent; the client now never sends its Finished
    time.sleep(0.2)
    t0 = time.monotonic()
    try:
        urllib.request.urlopen("http://127.0.0.1:%d/v1/models" % plain, timeout=2).read()
        res.append("%.0f ms" % ((time.monotonic() - t0) * 1e3))
    except Exception:             # noqa: BLE001
        res.append("no answer in 2 s")
    s.close()
    time.sleep(0.2)
bad = sum(r.startswith("no") for r in res)
print("%s: a plain GET while a TLS client stalls after its ClientHello: %s" %
      ("BUG" if bad else "ok", ", ".join(res)))
PY
) || STALL_CHECK="stall check did not run"
  log "stall check: $STALL_CHECK"
  out=$(taskset -c $LOAD_CORE python3 - "$P_ING_TLS" <<'PY'
import socket, ssl, sys, time
ctx = ssl.SSLContext(ssl.PROTOCOL_TLS_CLIENT); ctx.check_hostname = False; ctx.verify_mode = ssl.CERT_NONE
ok = 0
for i in range(20):
    try:
        s = ctx.wrap_socket(socket.create_connection(("127.0.0.1", int(sys.argv[1])), timeout=3),
                            server_hostname="localhost")
    except OSError as e:
        print("connection %d failed after %d handshakes closed by a reset: %r" % (i + 1, ok, e)); sys.exit(0)
    time.sleep(0.02)   # the server's session ticket arrives and stays unread: close() sends RST
    s.close()
    ok += 1
    time.sleep(0.05)
print("%d handshakes, each closed by a reset" % ok)
PY
)
  sleep 0.3
  if kill -0 "$pid" 2>/dev/null; then
    RESET_CHECK="ingressd with the default SIGPIPE disposition survived: $out"
    stop_pid "$pid"
  else
    wait "$pid" 2>/dev/null || rc=$?
    RESET_CHECK="BUG: ingressd started with the default SIGPIPE disposition died (exit status $rc$( ((rc == 141)) && echo ", SIGPIPE")) when TLS clients reset their connections: $out"
    local keep=() p; for p in "${PIDS[@]}"; do [ "$p" = "$pid" ] || keep+=("$p"); done; PIDS=("${keep[@]}")
  fi
  log "reset check: $RESET_CHECK"
}

# run_wrk ROUND PROXY PID SCENARIO URL CONNS [wrk args...]; WRK_PRELOAD=... for the no-resume shim
run_wrk() {
  local round=$1 proxy=$2 pid=$3 scen=$4 url=$5 conns=$6; shift 6
  local out=$TMP/wrk-$round-$proxy-$scen.txt pre=()
  [ -n "${WRK_PRELOAD:-}" ] && pre=(env LD_PRELOAD="$WRK_PRELOAD")
  taskset -c $LOAD_CORE "${pre[@]}" wrk -t1 -c"$conns" -d"${WARMUP}s" "$@" "$url" >/dev/null 2>&1 || true
  local c0 c1 s0 s1 l0 l1 t0 t1 a0 a1 q0 q1 f0 r0 e0 f1 r1 e1
  read -r f0 r0 e0 <<<"$(tls_counts "$proxy")"
  c0=$(cpu_ticks "$pid")
  read -r a0 q0 <<<"$(nginx_counts)"
  s0=$(core_sample $PROXY_CORE); l0=$(core_sample $LOAD_CORE); t0=$(date +%s.%N)
  # mid-run: connections waiting in the proxy's listen queue (accepted by the kernel, not yet by
  # the proxy), median of 5 samples
  local lport=${url#*://127.0.0.1:}; lport=${lport%%/*}
  (sleep "$(awk -v d="$DURATION" 'BEGIN{print d/4}')"
   for _ in 1 2 3 4 5; do ss -Htln "sport = :$lport" | awk '{print $2}'; sleep "$(awk -v d="$DURATION" 'BEGIN{print d/10}')"; done |
     sort -n | sed -n 3p >"$out.lq") &
  local sampler=$!
  taskset -c $LOAD_CORE "${pre[@]}" wrk -t1 -c"$conns" -d"${DURATION}s" --latency "$@" "$url" >"$out" 2>&1 || true
  wait "$sampler" 2>/dev/null || true
  s1=$(core_sample $PROXY_CORE); l1=$(core_sample $LOAD_CORE); t1=$(date +%s.%N)
  c1=$(cpu_ticks "$pid")
  read -r a1 q1 <<<"$(nginx_counts)"
  read -r f1 r1 e1 <<<"$(tls_counts "$proxy")"
  python3 "$LIB/tls_report.py" wrk --file "$out" --round "$round" --proxy "$proxy" --scenario "$scen" \
    --cpu-ticks $((c1 - c0)) --clk-tck "$CLK_TCK" \
    --core-busy "$(busy_pct "$s0" "$s1")" --load-core-busy "$(busy_pct "$l0" "$l1")" \
    --elapsed "$(awk -v a="$t0" -v b="$t1" 'BEGIN{print b-a}')" \
    --upstream-accepts $((a1 - a0 - 1)) --upstream-requests $((q1 - q0 - 1)) \
    --tls-full $((f1 - f0)) --tls-resumed $((r1 - r0)) --tls-failed $((e1 - e0)) \
    --listen-queue "$(cat "$out.lq" 2>/dev/null)" | tee -a "$RESULTS" >"$out.rows"
  log "[r$round] $scen $proxy: $(awk -F'\t' '{printf "%s=%s ", $4, $5}' "$out.rows")"
}

run_idle() { # round proxy: RSS per idle TLS connection (fresh process: run first after a start)
  local round=$1 proxy=$2 json extra=() pid c0
  ((IDLE_REQUEST)) && extra=(--request)
  pid=$(proxy_pid "$proxy"); c0=$(cpu_ticks "$pid")
  json=$(taskset -c $LOAD_CORE python3 "$LIB/tls_idle_conns.py" --port "$(tls_port "$proxy")" \
         --pid "$pid" --n "$IDLE_N" "${extra[@]}") || true
  log "[r$round] idle_tls $proxy: $json"
  [ -n "$json" ] && python3 "$LIB/tls_report.py" json --json "$json" --round "$round" --proxy "$proxy" \
    --scenario idle_tls --keys bytes_per_conn,held,failed,closed_in_sample,open_seconds >>"$RESULTS"
  # the proxy's CPU over the whole test (N handshakes, the idle wait, N closes) per connection
  printf '%s\t%s\tidle_tls\tcpu_us\t%s\n' "$round" "$proxy" \
    "$(awk -v t=$(( $(cpu_ticks "$pid") - c0 )) -v hz="$CLK_TCK" -v n="$IDLE_N" 'BEGIN{printf "%.1f", t / hz * 1e6 / n}')" >>"$RESULTS"
  return 0
}

run_ttft() { # round proxy|direct: SSE time to first event through the router path, over TLS
  local round=$1 proxy=$2 json pid="" c0=0
  if [ "$proxy" = direct ]; then
    json=$(taskset -c $LOAD_CORE python3 "$LIB/ttft.py" --port "$P_SSE" --n "$TTFT_N" --warmup 10) || true
  else
    pid=$(proxy_pid "$proxy"); c0=$(cpu_ns "$pid")
    json=$(taskset -c $LOAD_CORE python3 "$LIB/tls_ttft.py" --port "$(tls_port "$proxy")" --n "$TTFT_N" --warmup 10) || true
  fi
  log "[r$round] sse_tls $proxy: $json"
  [ -n "$json" ] && python3 "$LIB/tls_report.py" json --json "$json" --round "$round" --proxy "$proxy" \
    --scenario sse_tls --keys ttft_p50_ms,ttft_p99_ms,lag_p50_ms,batched,errors >>"$RESULTS"
  [ -n "$pid" ] && printf '%s\t%s\tsse_tls\tcpu_us\t%s\n' "$round" "$proxy" \
    "$(awk -v a="$c0" -v b="$(cpu_ns "$pid")" -v n=$((TTFT_N + 10)) 'BEGIN{printf "%.1f", (b - a) / 1000 / n}')" >>"$RESULTS"
  return 0
}

# wrk_each ROUND SCENARIO https|http PATH [wrk args...]: run_wrk on each proxy in ORDER, on its
# TLS or plain port, with CONNS connections (WRK_PRELOAD passes through)
wrk_each() {
  local round=$1 scen=$2 scheme=$3 path=$4 p port; shift 4
  for p in "${ORDER[@]}"; do
    if [ "$scheme" = https ]; then port=$(tls_port "$p"); else port=$(plain_port "$p"); fi
    run_wrk "$round" "$p" "$(proxy_pid "$p")" "$scen" "$scheme://127.0.0.1:$port$path" "$CONNS" "$@"
  done
}

# ------------------------------------------------------------------ run
T_START=$(date +%s)
log "temp dir $TMP; ingressd $ING_SRC (copied, $(stat -c %y "$ING_SRC" | cut -d. -f1); GLIBC_TUNABLES=${ING_TUNABLES:-unset}); $HAP_VERSION; $(openssl version)"
log "cores: proxy on $PROXY_CORE, wrk + fakes + clients on $LOAD_CORE; rounds=$ROUNDS duration=${DURATION}s conns=$CONNS idle_conns=$IDLE_N ttft_n=$TTFT_N; $PRIO"
log "other load on this machine right now (loadavg): $(cut -d' ' -f1-3 /proc/loadavg)"
start_bg nginx $LOAD_CORE nginx -p "$TMP" -c "$TMP/nginx.conf"
start_bg sse_server $LOAD_CORE python3 "$LIB/sse_server.py" --port "$P_SSE" --events 3 --interval-ms 5
wait_port 127.0.0.1 "${REPLICA_PORTS[0]}"; wait_port 127.0.0.1 "$P_SSE"; wait_port $NODE_IP "${ROUTER_PORTS[0]}"

RESET_CHECK="not run"; STALL_CHECK="not run"
check_reset
GET_PATH=/v1/models; POST_PATH=/v1/chat/completions
for ((r = 1; r <= ROUNDS; r++)); do
  # odd rounds: ingressd first; even rounds: HAProxy first, so drift cancels out
  if ((r % 2)); then ORDER=(ingressd haproxy); else ORDER=(haproxy ingressd); fi

  # idle memory first, on freshly started processes (only the probes ran), as bench/run.sh does
  start_proxies ecdsa-idle
  for p in "${ORDER[@]}"; do run_idle "$r" "$p"; done
  stop_proxies
  start_proxies ecdsa
  if ((r == 1)); then for p in "${ORDER[@]}"; do check_setup "$p"; done; fi
  if ((TTFT_N > 0)); then
    run_ttft "$r" direct
    for p in "${ORDER[@]}"; do run_ttft "$r" "$p"; done
  fi
  # kept-alive TLS: plain path (GET, replica only) and router path (POST: router call + replica)
  wrk_each "$r" ka_plain https "$GET_PATH"
  wrk_each "$r" ka_router https "$POST_PATH" -s "$TMP/post.lua"
  # the same over plain HTTP (reference: what TLS adds per kept-alive request)
  wrk_each "$r" http_plain http "$GET_PATH"
  wrk_each "$r" http_router http "$POST_PATH" -s "$TMP/post.lua"
  # a new connection per request: full TLS handshakes (wrk's session reuse off), wrk's own
  # resumption (reference), plain HTTP (reference: the TCP and HTTP part of a new connection)
  WRK_PRELOAD=$TMP/wrk_noresume.so wrk_each "$r" hs_ecdsa https "$GET_PATH" -H 'Connection: close'
  wrk_each "$r" hs_ecdsa_resumed https "$GET_PATH" -H 'Connection: close'
  wrk_each "$r" conn_http http "$GET_PATH" -H 'Connection: close'
  stop_proxies

  start_proxies rsa
  if ((r == 1)); then for p in "${ORDER[@]}"; do check_setup "$p"; done; fi
  WRK_PRELOAD=$TMP/wrk_noresume.so wrk_each "$r" hs_rsa https "$GET_PATH" -H 'Connection: close'
  stop_proxies
done

echo
echo "TLS termination: ingressd --threads 1 vs HAProxy $(awk '{print $3}' <<<"$HAP_VERSION") nbthread 1 + Lua (Ray router data plane);" \
     "$(openssl version | awk '{print $1, $2}'); proxy on core $PROXY_CORE, load + fakes on core $LOAD_CORE;" \
     "$ROUNDS round(s) x ${DURATION}s, $CONNS conns; idle test N=$IDLE_N$( ((IDLE_REQUEST)) && echo " (one request each)");" \
     "loadavg at end $(cut -d' ' -f1-3 /proc/loadavg); wall time $(( $(date +%s) - T_START ))s"
echo "negotiated (first round):"
sed 's/^/  /' "$TMP/setup.txt"
echo "stalled handshake check (ingressd): $STALL_CHECK"
echo "client reset check: $RESET_CHECK"
((${#IGN_PIPE[@]})) && echo "ingressd ran with SIGPIPE ignored (as under systemd); BENCH_TLS_SIGPIPE=default leaves it at the default"
echo
set +e
python3 "$LIB/tls_report.py" table --results "$RESULTS"
rc=$?
set -e
cp "$RESULTS" "${BENCH_RESULTS_OUT:-/dev/null}" 2>/dev/null || true
exit $rc
