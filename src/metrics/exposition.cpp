#include "ingressd/metrics/exposition.hpp"

#include <algorithm>
#include <array>
#include <chrono>
#include <map>
#include <set>
#include <tuple>

#include "ingressd/metrics/prometheus.hpp"

namespace ingressd::metrics {

namespace {

/// One router of an app, summed over the workers.
struct router_sum {
  std::array<std::uint64_t, attempt_result_count> results{};
  histogram_data latency{router_buckets()};
  bool colocated = false;
  std::int64_t hedge_delay_us = -1;  ///< the largest over the workers; -1: none hedges to it
};

struct app_sum {
  app_sum() {
    for (auto& h : router_latency) h = histogram_data(router_buckets());
  }
  std::map<unsigned, std::uint64_t> codes;
  std::uint64_t other_codes = 0;
  histogram_data duration{request_buckets()};
  histogram_data first_byte{request_buckets()};
  std::array<histogram_data, router_outcome_count> router_latency;
  std::array<std::uint64_t, router_outcome_count> failures{};
  std::uint64_t truncations = 0;
  std::array<std::uint64_t, hedge_result_count> hedges{};
  std::array<std::uint64_t, reason_count> generated{};
  std::array<std::uint64_t, grpc::status_count> grpc_status{};
  histogram_data grpc_duration{request_buckets()};
  std::map<std::string, router_sum> routers;  // by router label
  bool routed = false;  ///< the app has a router pool (now)
  /// Ray's series by (method, status, route kind), and the app's route prefix.
  using ray_key = std::tuple<std::string, unsigned, ray_series::route>;
  std::map<ray_key, histogram_data> ray_http, ray_grpc;
  std::string route_prefix;
};

void add_block(app_sum& s, const app_metrics& b) {
  b.codes.for_each([&](unsigned code, std::uint64_t n) { s.codes[code] += n; });
  s.other_codes += b.codes.other();
  s.duration.add(b.duration);
  s.first_byte.add(b.first_byte);
  for (std::size_t i = 0; i < router_outcome_count; ++i) {
    s.router_latency[i].add(b.router_latency[i]);
    s.failures[i] += b.router_failures[i].get();
  }
  s.truncations += b.truncations.get();
  for (std::size_t i = 0; i < hedge_result_count; ++i) s.hedges[i] += b.hedges[i].get();
  for (std::size_t i = 0; i < reason_count; ++i) s.generated[i] += b.generated[i].get();
  for (std::size_t i = 0; i < grpc::status_count; ++i) s.grpc_status[i] += b.grpc_status[i].get();
  s.grpc_duration.add(b.grpc_duration);
  for (const auto& r : b.routers()) {
    auto& a = s.routers[r->label];
    for (std::size_t i = 0; i < attempt_result_count; ++i) a.results[i] += r->results[i].get();
    a.latency.add(r->latency);
    a.colocated = r->colocated;
    a.hedge_delay_us = std::max(a.hedge_delay_us, r->hedge_delay_us.load(std::memory_order_relaxed));
  }
  if (!b.routers().empty()) s.routed = true;
  auto add_ray = [](std::map<app_sum::ray_key, histogram_data>& to, const ray_series& from) {
    from.for_each([&](std::string_view method, unsigned status, ray_series::route r, const histogram& h) {
      auto [it, fresh] = to.try_emplace({std::string(method), status, r}, ray_latency_buckets());
      it->second.add(h);
    });
  };
  add_ray(s.ray_http, b.ray_http);
  add_ray(s.ray_grpc, b.ray_grpc);
  if (!b.route_prefix.empty()) s.route_prefix = b.route_prefix;
}

/// grpc.StatusCode's names, as Ray's proxy writes them in its status_code label.
std::string grpc_status_label(unsigned code) {
  static constexpr std::array<std::string_view, grpc::status_count> names{
      "OK", "CANCELLED", "UNKNOWN", "INVALID_ARGUMENT", "DEADLINE_EXCEEDED", "NOT_FOUND", "ALREADY_EXISTS",
      "PERMISSION_DENIED", "RESOURCE_EXHAUSTED", "FAILED_PRECONDITION", "ABORTED", "OUT_OF_RANGE",
      "UNIMPLEMENTED", "INTERNAL", "UNAVAILABLE", "DATA_LOSS", "UNAUTHENTICATED"};
  return "StatusCode." + std::string(code < names.size() ? names[code] : "UNKNOWN");
}

/// Ray Serve's proxy series (ray python/ray/serve/_private/proxy.py: metric names, tag keys, the
/// error rule; constants.py: the latency buckets in ms), for Ray's Serve Grafana dashboard.
void render_ray(text_writer& w, const std::map<std::string, app_sum>& apps, const scrape_input& in) {
  auto route_of = [](const std::string& app, const app_sum& s, ray_series::route r, bool grpc) -> std::string {
    switch (r) {
      case ray_series::route::healthz: return "/-/healthz";
      case ray_series::route::routes: return "/-/routes";
      case ray_series::route::app: break;
    }
    if (app.empty()) return "";
    return grpc ? app : s.route_prefix;  // Ray: a gRPC call's route is its app's name
  };
  struct protocol {
    bool grpc;
    std::string_view requests, errors, latency, ongoing, requests_help, errors_help, latency_help, ongoing_help;
    std::uint64_t ongoing_value;
  };
  std::vector<protocol> protocols{{false, "ray_serve_num_http_requests_total", "ray_serve_num_http_error_requests_total",
                                   "ray_serve_http_request_latency_ms", "ray_serve_num_ongoing_http_requests",
                                   "The number of HTTP requests processed.", "The number of errored HTTP responses.",
                                   "The end-to-end latency of HTTP requests (measured from the Serve HTTP proxy).",
                                   "The number of ongoing requests in this HTTP proxy.", in.ongoing_http}};
  if (in.grpc)
    protocols.push_back({true, "ray_serve_num_grpc_requests_total", "ray_serve_num_grpc_error_requests_total",
                         "ray_serve_grpc_request_latency_ms", "ray_serve_num_ongoing_grpc_requests",
                         "The number of gRPC requests processed.", "The number of errored gRPC responses.",
                         "The end-to-end latency of gRPC requests (measured from the Serve gRPC proxy).",
                         "The number of ongoing requests in this gRPC proxy.", in.ongoing_grpc});
  for (const auto& p : protocols) {
    auto series = [&](const app_sum& s) -> const std::map<app_sum::ray_key, histogram_data>& {
      return p.grpc ? s.ray_grpc : s.ray_http;
    };
    auto status_label = [&](unsigned status) { return p.grpc ? grpc_status_label(status) : std::to_string(status); };
    // Ray's error rule: an HTTP status of 4xx or 5xx; for gRPC anything but OK.
    auto is_error = [&](unsigned status) { return p.grpc ? status != 0 : status >= 400; };
    // f(application, route, method, status label, status, latency) for every series of this protocol.
    auto each = [&](auto&& f) {
      for (const auto& [app, s] : apps)
        for (const auto& [key, h] : series(s)) {
          const auto& [method, status, r] = key;
          f(app, route_of(app, s, r, p.grpc), method, status_label(status), status, h);
        }
    };
    using hist = histogram_data;
    w.family(p.requests, p.requests_help, "counter");
    each([&](const std::string& app, const std::string& route, const std::string& method, const std::string& code,
             unsigned, const hist& h) {
      w.sample(p.requests, {{"application", app}, {"route", route}, {"method", method}, {"status_code", code}}, h.count());
    });
    w.family(p.errors, p.errors_help, "counter");
    each([&](const std::string& app, const std::string& route, const std::string& method, const std::string& code,
             unsigned status, const hist& h) {
      if (is_error(status))
        w.sample(p.errors, {{"application", app}, {"route", route}, {"method", method}, {"error_code", code}}, h.count());
    });
    w.family(p.latency, p.latency_help, "histogram");
    each([&](const std::string& app, const std::string& route, const std::string& method, const std::string& code,
             unsigned, const hist& h) {
      w.histogram(p.latency, {{"application", app}, {"route", route}, {"method", method}, {"status_code", code}}, h,
                  1000.0);
    });
    w.family(p.ongoing, p.ongoing_help, "gauge");
    w.sample(p.ongoing, {{"node_id", in.node_id}, {"node_ip_address", in.node_ip}}, p.ongoing_value);
  }
}

}  // namespace

std::string render(const scrape_input& in) {
  std::map<std::string, app_sum> apps;
  apps[""];  // requests that matched no app
  for (const auto* w : in.workers)
    w->visit([&](const app_metrics& b) { add_block(apps[b.name], b); });
  if (in.topology)
    for (const auto& a : in.topology->apps) {
      auto& s = apps[a.name];
      if (!a.router_pool.empty()) s.routed = true;
    }
  // The "" series appear once something was counted there (no empty app="" series).
  auto shown = [](const std::string& name, const histogram_data& h) { return !name.empty() || h.count() > 0; };

  text_writer w;
  w.family("ingressd_requests_received_total", "Requests whose head was read.", "counter");
  w.sample("ingressd_requests_received_total", {}, in.requests_received);

  w.family("ingressd_listener_requests_total",
           "Requests whose head was read, by listener: http (listen) or https (tls.listen).", "counter");
  const std::uint64_t over_tls = in.tls ? in.tls->requests : 0;
  w.sample("ingressd_listener_requests_total", {{"listener", "http"}}, in.requests_received - over_tls);
  if (in.tls) w.sample("ingressd_listener_requests_total", {{"listener", "https"}}, over_tls);

  w.family("ingressd_requests_total", "Requests answered, by app and HTTP status code (499: the client left first).",
           "counter");
  for (const auto& [app, s] : apps) {
    for (const auto& [code, n] : s.codes) {
      const auto c = std::to_string(code);
      w.sample("ingressd_requests_total", {{"app", app}, {"code", c}}, n);
    }
    if (s.other_codes) w.sample("ingressd_requests_total", {{"app", app}, {"code", "other"}}, s.other_codes);
  }

  w.family("ingressd_generated_responses_total",
           "Responses ingressd generated itself, by app and the X-Serve-Reason they carried.", "counter");
  for (const auto& [app, s] : apps)
    for (std::size_t i = 0; i < reason_count; ++i) {
      // Zeros too, so that rate() sees the first one; but no_route only ever answers requests
      // that matched no app (app=""), and the other reasons only come with an app.
      const bool possible = app.empty() == (static_cast<reason>(i) == reason::no_route);
      if (s.generated[i] > 0 || (possible && !app.empty()))
        w.sample("ingressd_generated_responses_total", {{"app", app}, {"reason", to_string(static_cast<reason>(i))}},
                 s.generated[i]);
    }

  w.family("ingressd_request_duration_seconds", "Time from the request head to the end of the response.",
           "histogram");
  for (const auto& [app, s] : apps)
    if (shown(app, s.duration)) w.histogram("ingressd_request_duration_seconds", {{"app", app}}, s.duration);

  w.family("ingressd_upstream_first_byte_seconds",
           "Time from the request sent to the replica to its response headers (TTFT on streams).", "histogram");
  for (const auto& [app, s] : apps)
    if (shown(app, s.first_byte)) w.histogram("ingressd_upstream_first_byte_seconds", {{"app", app}}, s.first_byte);

  w.family("ingressd_router_latency_seconds",
           "Time of the whole routing decision, failovers included, by outcome (ok or the failure reason).",
           "histogram");
  for (const auto& [app, s] : apps)
    for (std::size_t i = 0; i < router_outcome_count; ++i)
      if (s.router_latency[i].count() > 0 || (i == 0 && s.routed))
        w.histogram("ingressd_router_latency_seconds", {{"app", app}, {"outcome", router_outcome_name(i)}},
                    s.router_latency[i]);

  w.family("ingressd_router_attempts_total",
           "Router calls by router and result (ok: 200 reply, no_reply: none in time, non_200: other status, "
           "cancelled: the other call of a hedged pair won first).",
           "counter");
  for (const auto& [app, s] : apps)
    for (const auto& [router, r] : s.routers)
      for (std::size_t i = 0; i < attempt_result_count; ++i)
        w.sample("ingressd_router_attempts_total",
                 {{"app", app}, {"router", router}, {"result", to_string(static_cast<attempt_result>(i))}},
                 r.results[i]);

  w.family("ingressd_router_attempt_latency_seconds",
           "Time of one router call, reply or failure, by router and whether it is on this node (colocated).",
           "histogram");
  for (const auto& [app, s] : apps)
    for (const auto& [router, r] : s.routers)
      w.histogram("ingressd_router_attempt_latency_seconds",
                  {{"app", app}, {"router", router}, {"colocated", r.colocated ? "true" : "false"}}, r.latency);

  w.family("ingressd_router_failures_total", "Routing decisions that failed, by reason.", "counter");
  for (const auto& [app, s] : apps)
    for (std::size_t i = 1; i < router_outcome_count; ++i)
      if (s.routed || s.failures[i] > 0)
        w.sample("ingressd_router_failures_total", {{"app", app}, {"reason", router_outcome_name(i)}}, s.failures[i]);

  w.family("ingressd_router_truncations_total",
           "Routing decisions whose body copy for the router was cut short at router.body_limit.",
           "counter");
  for (const auto& [app, s] : apps)
    if (s.routed || s.truncations > 0) w.sample("ingressd_router_truncations_total", {{"app", app}}, s.truncations);

  w.family("ingressd_router_hedges_total",
           "Hedged router calls (router.hedge): sent (a second router was asked), won (its reply was used), "
           "refused (late, but router.hedge_budget was spent).",
           "counter");
  for (const auto& [app, s] : apps)
    if (s.routed)
      for (std::size_t i = 0; i < hedge_result_count; ++i)
        w.sample("ingressd_router_hedges_total", {{"app", app}, {"result", to_string(static_cast<hedge_result>(i))}},
                 s.hedges[i]);

  w.family("ingressd_router_hedge_delay_seconds",
           "How long a call to another router of the pool waits before it is hedged to this router (the largest "
           "over the workers; router.hedge auto follows this router's latency). Absent when not hedged.",
           "gauge");
  for (const auto& [app, s] : apps)
    for (const auto& [router, r] : s.routers)
      if (r.hedge_delay_us >= 0)
        w.sample("ingressd_router_hedge_delay_seconds", {{"app", app}, {"router", router}},
                 static_cast<double>(r.hedge_delay_us) / 1e6);

  w.family("ingressd_router_colocated_ratio", "Share of the app's router pool that is on this node (1 when all).",
           "gauge");
  if (in.topology)
    for (const auto& a : in.topology->apps) {
      if (a.router_pool.empty()) continue;
      std::size_t local = 0;
      for (const auto& r : a.router_pool) local += r.colocated ? 1 : 0;
      w.sample("ingressd_router_colocated_ratio", {{"app", a.name}},
               static_cast<double>(local) / static_cast<double>(a.router_pool.size()));
    }

  // Each replica once per app (a name listed twice in a group is one series).
  auto each_replica = [&](auto&& f) {
    if (!in.topology) return;
    std::set<std::pair<std::string_view, std::string_view>> seen;
    for (const auto& a : in.topology->apps)
      for (const auto& r : a.replicas)
        if (seen.emplace(a.name, r.name).second) f(a, r);
  };
  w.family("ingressd_replica_up",
           "1 when the replica is up, else 0 (marked down by active health checks or by health.error_limit "
           "consecutive connection errors).",
           "gauge");
  each_replica([&](const topology::app_view& a, const topology::endpoint& r) {
    const bool up = r.state->up.load(std::memory_order_relaxed);
    w.sample("ingressd_replica_up", {{"app", a.name}, {"replica", r.name}}, std::uint64_t{up ? 1u : 0u});
  });
  w.family("ingressd_replica_marked_down_total",
           "Times the replica was marked down, by cause: health_check (health.fall failed checks) or "
           "connection_errors (passive health, health.error_limit).",
           "counter");
  each_replica([&](const topology::app_view& a, const topology::endpoint& r) {
    w.sample("ingressd_replica_marked_down_total", {{"app", a.name}, {"replica", r.name}, {"cause", "health_check"}},
             r.state->downs_by_check.load(std::memory_order_relaxed));
    w.sample("ingressd_replica_marked_down_total",
             {{"app", a.name}, {"replica", r.name}, {"cause", "connection_errors"}},
             r.state->downs_by_errors.load(std::memory_order_relaxed));
  });
  w.family("ingressd_replica_in_flight", "Requests this daemon has at the replica now (all worker threads).",
           "gauge");
  each_replica([&](const topology::app_view& a, const topology::endpoint& r) {
    w.sample("ingressd_replica_in_flight", {{"app", a.name}, {"replica", r.name}},
             std::uint64_t{r.state->in_flight.load(std::memory_order_relaxed)});
  });

  w.family("ingressd_active_connections", "Open client connections.", "gauge");
  w.sample("ingressd_active_connections", {}, in.active_connections);
  w.family("ingressd_active_streams", "Responses being relayed.", "gauge");
  w.sample("ingressd_active_streams", {}, in.active_streams);

  if (in.grpc) {
    const auto& g = *in.grpc;
    std::set<std::string> grpc_apps;  // apps with a gRPC group now: their OK series show from the start
    if (in.topology)
      for (const auto& a : in.topology->grpc_apps) grpc_apps.insert(a.name);
    w.family("ingressd_grpc_requests_total",
             "gRPC calls by app and the grpc-status the client got (1 CANCELLED: it reset the call first; app \"\": "
             "no app matched).",
             "counter");
    for (const auto& [app, s] : apps)
      for (std::size_t i = 0; i < grpc::status_count; ++i)
        if (s.grpc_status[i] > 0 || (i == 0 && grpc_apps.contains(app)))
          w.sample("ingressd_grpc_requests_total", {{"app", app}, {"grpc_status", std::to_string(i)}}, s.grpc_status[i]);
    w.family("ingressd_grpc_request_duration_seconds", "gRPC calls: time from the request headers to the end of the call.",
             "histogram");
    for (const auto& [app, s] : apps)
      if (s.grpc_duration.count() > 0 || grpc_apps.contains(app))
        w.histogram("ingressd_grpc_request_duration_seconds", {{"app", app}}, s.grpc_duration);
    w.family("ingressd_grpc_connections", "Open connections on the gRPC listener (in ingressd_active_connections too).",
             "gauge");
    w.sample("ingressd_grpc_connections", {}, g.connections);
    w.family("ingressd_grpc_active_streams", "gRPC calls in progress.", "gauge");
    w.sample("ingressd_grpc_active_streams", {}, g.streams);
    w.family("ingressd_grpc_connection_errors_total",
             "gRPC listener connections ended by ingressd with GOAWAY, by reason (protocol, flow_control, "
             "compression, flood, header_list, reset_flood, timeout).",
             "counter");
    for (std::size_t i = 0; i < grpc::conn_error_count; ++i)
      w.sample("ingressd_grpc_connection_errors_total", {{"reason", grpc::to_string(static_cast<grpc::conn_error>(i))}},
               g.conn_errors[i]);
  }

  if (in.tls) {
    const auto& t = *in.tls;
    w.family("ingressd_tls_connections", "Open connections on the HTTPS listener (in ingressd_active_connections too).",
             "gauge");
    w.sample("ingressd_tls_connections", {}, t.connections);
    w.family("ingressd_tls_handshakes_total",
             "TLS handshakes completed, by kind: full, or resumed from a session ticket.", "counter");
    w.sample("ingressd_tls_handshakes_total", {{"kind", "full"}}, t.handshakes - t.resumed);
    w.sample("ingressd_tls_handshakes_total", {{"kind", "resumed"}}, t.resumed);
    w.family("ingressd_tls_handshake_failures_total",
             "TLS handshakes that failed, by reason: timeout (tls.handshake_timeout), http_request (plain HTTP on "
             "the HTTPS port), protocol_version, no_shared_cipher, peer_closed, bad_certificate (the client "
             "refused ours), other.",
             "counter");
    for (const auto& [why, n] : t.failures) w.sample("ingressd_tls_handshake_failures_total", {{"reason", why}}, n);
    w.family("ingressd_tls_certificate_expiry_timestamp_seconds",
             "Unix time at which the HTTPS listener's certificate in force expires (its notAfter).", "gauge");
    w.sample("ingressd_tls_certificate_expiry_timestamp_seconds", {}, static_cast<double>(t.not_after));
  }

  w.family("ingressd_topology_updates_total", "Topology changes applied.", "counter");
  w.sample("ingressd_topology_updates_total", {}, in.topology_updates);
  w.family("ingressd_topology_errors_total", "Topology documents or fetches rejected (the last good one stays).",
           "counter");
  w.sample("ingressd_topology_errors_total", {}, in.topology_errors);
  w.family("ingressd_topology_last_update_timestamp_seconds",
           "Unix time at which the topology in force was applied (its last change; /topology last_update).",
           "gauge");
  if (in.topology)
    w.sample("ingressd_topology_last_update_timestamp_seconds", {},
             std::chrono::duration<double>(in.topology->updated.time_since_epoch()).count());
  w.family("ingressd_topology_last_success_timestamp_seconds",
           "Unix time at which the topology source last confirmed the topology in force: a fetch or file check "
           "that found a valid document, changed or not (0: none yet).",
           "gauge");
  if (in.topology_last_success)
    w.sample("ingressd_topology_last_success_timestamp_seconds", {}, *in.topology_last_success);
  w.family("ingressd_config_reloads_total", "SIGHUP reloads applied.", "counter");
  w.sample("ingressd_config_reloads_total", {}, in.config_reloads);
  w.family("ingressd_config_reload_errors_total", "SIGHUP reloads rejected (the running config stays).",
           "counter");
  w.sample("ingressd_config_reload_errors_total", {}, in.config_errors);
  w.family("ingressd_config_generations",
           "Configs in memory: the one in force plus older ones still held by requests that started under "
           "them (SIGHUP).",
           "gauge");
  w.sample("ingressd_config_generations", {}, in.config_generations);
  w.family("ingressd_accept_errors_total",
           "Accepts that failed for lack of file descriptors or memory (main and admin listeners); each pauses "
           "that listener, 5 ms doubling to 1 s.",
           "counter");
  w.sample("ingressd_accept_errors_total", {}, in.accept_errors);
  w.family("ingressd_proxy_protocol_errors_total",
           "Connections closed without a response for their PROXY protocol header (client.proxy_protocol), by "
           "reason: untrusted (peer not in client.trusted_proxies), invalid, oversized, truncated, timeout.",
           "counter");
  for (std::size_t i = 0; i < net::proxy_error_count; ++i)
    w.sample("ingressd_proxy_protocol_errors_total", {{"reason", net::to_string(static_cast<net::proxy_error>(i))}},
             in.proxy_protocol_errors[i]);
  w.family("ingressd_forwarded_chain_errors_total",
           "X-Forwarded-For chains from trusted proxies (client.trusted_proxies) that held something other than "
           "addresses: ignored, the proxy taken as the client.",
           "counter");
  w.sample("ingressd_forwarded_chain_errors_total", {}, in.forwarded_chain_errors);
  w.family("ingressd_router_reply_headers_skipped_total",
           "Members of router replies' request_headers left out because their value was not a string (the reply "
           "is used without them).",
           "counter");
  w.sample("ingressd_router_reply_headers_skipped_total", {}, in.router_headers_skipped);
  w.family("ingressd_access_log_dropped_total", "Access log lines dropped because the log queue was full.",
           "counter");
  w.sample("ingressd_access_log_dropped_total", {}, in.access_log_dropped);
  w.family("ingressd_draining", "1 once SIGTERM or SIGINT has started the drain, else 0.", "gauge");
  w.sample("ingressd_draining", {}, std::uint64_t{in.draining ? 1u : 0u});
  w.family("ingressd_ray_node_draining",
           "1 while Ray drains this node (its Serve proxy is DRAINING in Ray's proxies map): /-/healthz fails, "
           "requests are still served.",
           "gauge");
  w.sample("ingressd_ray_node_draining", {}, std::uint64_t{in.topology && in.topology->ray_node_draining() ? 1u : 0u});
  if (in.ray_compatible) render_ray(w, apps, in);
  if (in.process) render_process(w, *in.process);
  return std::move(w).str();
}

}  // namespace ingressd::metrics
