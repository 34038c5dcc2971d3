#pragma once
// The daemon's configuration (contract §1 flags, §2 YAML keys). A `config` is an immutable value
// once loaded: it crosses threads only as `std::shared_ptr<const config>`.
//
// Every field documents its YAML key, its flag (if any) and its default. The defaults here are the
// single source of truth; config/ingressd.example.yaml repeats them for operators and a unit test
// checks that the two agree.
#include <chrono>
#include <cstdint>
#include <optional>
#include <string>
#include <string_view>
#include <variant>
#include <vector>

#include "ingressd/core/units.hpp"
#include "ingressd/net/cidr.hpp"

namespace ingressd::config {

using namespace std::chrono_literals;

/// "HOST:PORT" (IPv6 as "[::1]:8000"). Port 0 asks the kernel for a free port (tests).
struct host_port {
  std::string host;
  std::uint16_t port = 0;
  std::string to_string() const;  // "127.0.0.1:8000" / "[::1]:8000"
  bool operator==(const host_port&) const = default;
};

enum class on_failure { fail_closed, fail_open };
enum class log_level { trace, debug, info, warn, error };

struct topology_settings {
  std::string file;               ///< topology.file / --topology-file: watched topology document
  std::string ray_dashboard;      ///< topology.ray_dashboard / --ray-dashboard: http://HOST:PORT
  std::string url;                ///< topology.url / --topology-url: any URL serving the document
  duration poll_interval = 1s;    ///< topology.poll_interval: dashboard/URL poll period
  duration timeout = 2s;          ///< topology.timeout: per poll request
  std::string local_dial_host;    ///< topology.local_dial_host: dial co-located targets here ("" = their ip)
  bool operator==(const topology_settings&) const = default;
};

struct router_settings {
  std::vector<std::string> methods{"POST"};  ///< router.methods: methods that consult the router
  duration timeout = 5s;           ///< router.timeout: per attempt (connect + send + full reply)
  bool forward_body = false;       ///< router.forward_body: send the first body_limit bytes to the router
  std::uint64_t body_limit = 256 * 1024;      ///< router.body_limit: cap on the body copy
  /// router.body_wait: with forward_body, the longest wait for the body prefix; then the router
  /// is asked with what has arrived, marked truncated (Ray: `wait-for-body time 5s`).
  duration body_wait = 5s;
  std::string session_header = "x-session-id"; ///< router.session_header ("" disables), lowercased
  on_failure failure_mode = on_failure::fail_closed;  ///< router.on_failure
  /// router.hedge: when a router has not answered after the hedge delay, the same call goes to the
  /// next router of the pool as well and the first 200 wins. `auto` (hedge_auto): the delay
  /// follows the app's recent router latency (routing::hedge_delay); a duration: that delay;
  /// `off`: never (hedge_auto false, hedge_after zero).
  bool hedge_auto = true;
  duration hedge_after{0};
  /// router.hedge_budget: the most a worker hedges, as a share of its router calls over the last
  /// 10 s (routing::hedge_budget), in per mille: 100 = 10 %.
  unsigned hedge_budget_permille = 100;
  bool operator==(const router_settings&) const = default;
};

struct upstream_settings {
  duration connect_timeout = 2s;       ///< upstream.connect_timeout
  // Both one hour, Ray's longest wait on anything (`timeout client 3600s`; its HAProxy sets no
  // server timeout): a reasoning model may queue or think for many minutes before its first
  // token or between two, and a default must never cut a legitimate generation off. A client
  // that leaves ends the request at once whatever these say.
  duration first_byte_timeout = 3600s;  ///< upstream.first_byte_timeout: request sent -> response head
  duration idle_timeout = 3600s;        ///< upstream.idle_timeout: between response body reads
  unsigned retries = 3;                ///< upstream.retries: connect attempts on other replicas
  unsigned max_idle_per_replica = 64;  ///< upstream.max_idle_per_replica: pooled conns per worker
  bool operator==(const upstream_settings&) const = default;
};

struct client_settings {
  duration header_timeout = 10s;       ///< client.header_timeout: total time for the request head
  duration body_timeout = 60s;         ///< client.body_timeout: idle time between body reads
  duration keepalive_timeout = 75s;    ///< client.keepalive_timeout: idle time between requests
  std::uint64_t max_header_bytes = 64 * 1024;        ///< client.max_header_bytes -> 431
  std::uint64_t max_body_bytes = 64ull * 1024 * 1024; ///< client.max_body_bytes -> 413
  unsigned max_connections = 20000;    ///< client.max_connections
  /// client.trusted_proxies / --trusted-proxy (repeatable): peers (load balancers) whose
  /// X-Forwarded-For and X-Forwarded-Proto are kept, and who may send PROXY headers.
  std::vector<net::cidr> trusted_proxies;
  /// client.proxy_protocol / --proxy-protocol: every connection on every listener starts with a
  /// PROXY protocol header (v1 or v2) from a trusted proxy; its source is the client.
  bool proxy_protocol = false;
  /// client.max_tunnels: WebSocket tunnels open at once (all workers); an upgrade past it is
  /// answered 503 tunnel_limit. Each holds two sockets and, while bytes wait for a slow side,
  /// a relay buffer per direction.
  unsigned max_tunnels = 10000;
  bool operator==(const client_settings&) const = default;
};

struct health_settings {
  std::string path = "/-/healthz";  ///< health.path: replica health endpoint
  duration interval = 5s;           ///< health.interval
  duration fast_interval = 250ms;   ///< health.fast_interval: while transitioning or down
  unsigned fall = 2;                ///< health.fall: failed checks to mark down
  unsigned rise = 2;                ///< health.rise: passed checks to mark up
  duration timeout = 2s;            ///< health.timeout
  /// health.error_limit: this many consecutive connection errors to a replica (refused, timed
  /// out, reset before a response head) mark it down at once; the active checks bring it back.
  /// 0 = off. Ray: `observe layer4 error-limit 3 on-error mark-down`.
  unsigned error_limit = 3;
  bool operator==(const health_settings&) const = default;
};

/// Timeouts that belong to no one side (HAProxy's `timeout` section).
struct timeout_settings {
  /// timeout.tunnel: a WebSocket tunnel with no byte either way for this long is closed. Ray's
  /// value: its template writes `timeout tunnel` only for a backend that sets timeout_tunnel_s,
  /// which Serve's apps do not, so HAProxy's `timeout client 3600s` bounds its tunnels.
  duration tunnel = 3600s;
  bool operator==(const timeout_settings&) const = default;
};

struct drain_settings {
  duration min_period = 30s;  ///< drain.min_period: after SIGTERM healthz fails, still accepting
  duration timeout = 600s;    ///< drain.timeout: then in-flight streams get at most this long
  bool operator==(const drain_settings&) const = default;
};

/// TLS termination (contract §9): an HTTPS listener beside the plain one, same request path.
/// Certificate and key are read at start, with --check-config and on SIGHUP (tls/context.hpp).
struct tls_settings {
  /// tls.listen / --tls-listen: the HTTPS listener's address; unset (empty host) = no TLS.
  host_port listen{};
  std::string cert_file;  ///< tls.cert_file / --tls-cert: PEM certificate, its chain after it
  std::string key_file;   ///< tls.key_file / --tls-key: PEM private key of that certificate
  std::string min_version = "1.2";  ///< tls.min_version: "1.2" or "1.3"
  /// tls.ciphers: OpenSSL cipher list for TLS 1.2 (forward-secret AEAD suites only, as Mozilla's
  /// "intermediate" profile; there are no DH parameters, so no DHE).
  std::string ciphers =
      "ECDHE-ECDSA-AES128-GCM-SHA256:ECDHE-RSA-AES128-GCM-SHA256:ECDHE-ECDSA-AES256-GCM-SHA384:"
      "ECDHE-RSA-AES256-GCM-SHA384:ECDHE-ECDSA-CHACHA20-POLY1305:ECDHE-RSA-CHACHA20-POLY1305";
  /// tls.ciphersuites: TLS 1.3 suites (OpenSSL's default set).
  std::string ciphersuites = "TLS_AES_128_GCM_SHA256:TLS_AES_256_GCM_SHA384:TLS_CHACHA20_POLY1305_SHA256";
  /// tls.handshake_timeout: accept -> handshake done (an extension beyond the contract: a client
  /// that never finishes its handshake must not hold a connection).
  duration handshake_timeout = 10s;
  bool enabled() const { return !listen.host.empty(); }
  bool operator==(const tls_settings&) const = default;
};

/// gRPC ingress (contract §9, issue #20): an HTTP/2 cleartext (h2c, prior knowledge) listener for
/// Ray's `protocol: "gRPC"` target groups, framed by nghttp2.
struct grpc_settings {
  /// grpc.listen / --grpc-listen: the gRPC listener's address; unset (empty host) = none.
  host_port listen{};
  /// grpc.max_concurrent_streams: SETTINGS_MAX_CONCURRENT_STREAMS announced to each client
  /// connection; streams beyond it are refused (REFUSED_STREAM). HAProxy's and nghttp2's default.
  unsigned max_concurrent_streams = 100;
  /// grpc.health_path: the RPC that health-checks gRPC targets (Ray's template replays this call
  /// and looks for "success" in the reply; grpc-status 0 is required too).
  std::string health_path = "/ray.serve.RayServeAPIService/Healthz";
  /// grpc.max_upstream_connections: HTTP/2 connections one worker opens to one gRPC replica at
  /// most. Calls share them (up to the replica's SETTINGS_MAX_CONCURRENT_STREAMS each); at the
  /// cap a call goes on the connection with the most room and waits there for a stream.
  unsigned max_upstream_connections = 16;
  /// grpc.keepalive_interval: a connection to a replica with calls on it and nothing heard for
  /// this long is PINGed; 0 = no keepalive.
  duration keepalive_interval = 10s;
  /// grpc.keepalive_timeout: a PING unanswered this long means the replica is gone: the
  /// connection closes and its calls fail UNAVAILABLE.
  duration keepalive_timeout = 5s;
  bool enabled() const { return !listen.host.empty(); }
  bool operator==(const grpc_settings&) const = default;
};

/// What /metrics exports beside the ingressd_* families.
struct metrics_settings {
  /// metrics.ray_compatible: also export Ray Serve's own proxy series (ray_serve_num_http_requests_total,
  /// ray_serve_http_request_latency_ms, ... with Ray's names, labels and buckets), so that Ray's
  /// Serve Grafana dashboard shows ingressd's traffic unchanged.
  bool ray_compatible = true;
  bool operator==(const metrics_settings&) const = default;
};

/// What usually holds `port` on a Ray node ("" when nothing of Ray's does), for the error of a
/// listener that cannot bind: Ray Serve's proxy and its HAProxy (ray python/ray/serve/_private/
/// constants.py, haproxy.py: RAY_SERVE_HAPROXY_METRICS_PORT, RAY_SERVE_HAPROXY_STATS_PORT), the
/// dashboard, GCS and client server (ray_constants.py).
std::string_view usual_holder(std::uint16_t port) noexcept;

struct config {
  std::string config_file;                       ///< --config (not a YAML key)
  host_port listen{"0.0.0.0", 8000};             ///< listen / --listen
  host_port admin_listen{"127.0.0.1", 9190};     ///< admin_listen / --admin-listen
  unsigned threads = 0;                          ///< threads / --threads (0 = number of CPUs)
  /// busy_poll_us: after a worker has run work, it polls for more without sleeping for this many
  /// microseconds before it blocks in epoll_wait (0 = off). Trades CPU for wake-up latency on VMs
  /// whose idle CPUs halt (an extension beyond the contract; docs/configuration.md).
  unsigned busy_poll_us = 0;
  std::string node_ip;                           ///< node_ip / --node-ip (contract §3.3)
  /// ray_node_id / --ray-node-id: this node's Ray node id, to find its entry in Ray's `proxies`
  /// map (node drain) when the node IP does not (several nodes on one IP); "" = by node IP.
  std::string ray_node_id;
  std::string root_path;                         ///< root_path: stripped before route matching
  log_level level = log_level::info;             ///< log_level / --log-level
  std::string access_log = "off";                ///< access_log / --access-log: PATH, "-" or "off"
  topology_settings topology;
  router_settings router;
  upstream_settings upstream;
  client_settings client;
  health_settings health;
  timeout_settings timeout;
  drain_settings drain;
  tls_settings tls;
  grpc_settings grpc;
  metrics_settings metrics;
  bool operator==(const config&) const = default;

  /// threads with 0 resolved to the number of CPUs.
  unsigned effective_threads() const;
};

/// What the command line asked for.
struct command_line {
  config cfg;
  bool check_config = false;  ///< --check-config
  bool demo = false;          ///< --demo
  bool help = false;          ///< --help (usage text is in `usage`)
  bool version = false;       ///< --version
};

/// A configuration error: the message names the flag or key (and file line where known).
struct config_error {
  std::string message;
};

/// Parses argv (flags override the --config file). Validates everything, including that exactly
/// one topology source is set unless `demo`. Never throws.
std::variant<command_line, config_error> parse_command_line(int argc, const char* const* argv);

/// Loads and validates a YAML config file on top of `base` (used by parse_command_line and by
/// SIGHUP reload). Unknown keys are errors. Never throws.
///
/// Every key's value is checked here (with its file line in the message); the cross-field rules,
/// including the topology-source rule that depends on flags and --demo, are left to `validate`,
/// which callers run on the final config. Sets `config_file` to `path`.
std::variant<config, config_error> load_file(const std::string& path, config base = {});

/// Parses YAML text (same rules as load_file; `origin` names the text in messages).
std::variant<config, config_error> load_yaml(const std::string& text, const std::string& origin,
                                             config base = {});

/// Checks cross-field rules (exactly one topology source unless demo, limits > 0, ...).
/// With `demo`, no topology source may be set (the demo brings its own). Also re-checks every
/// single-value rule, for configs built in code rather than loaded.
std::optional<config_error> validate(const config& cfg, bool demo);

/// The --help text.
std::string usage();

/// Parses "HOST:PORT" / "[v6]:PORT". HOST is a host name, an IPv4 address or a bracketed IPv6
/// address; PORT is 0-65535.
std::optional<host_port> parse_host_port(std::string_view text);

/// Every YAML key load_yaml accepts, dotted ("router.timeout"), in contract §2 order.
std::vector<std::string_view> known_keys();

}  // namespace ingressd::config
