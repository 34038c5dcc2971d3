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
  histogram_data tunnel_duration{request_buckets()};
  histogram_data llm_ttft{request_buckets()};
  histogram_data llm_inter_event{router_buckets()};
  std::uint64_t llm_events = 0, llm_prompt_tokens = 0, llm_completion_tokens = 0;
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
  s.tunnel_duration.add(b.tunnel_duration);
  s.llm_ttft.add(b.llm_ttft);
  s.llm_inter_event.add(b.llm_inter_event);
  s.llm_events += b.llm_events.get();
  s.llm_prompt_tokens += b.llm_prompt_tokens.get();
  s.llm_completion_tokens += b.llm_completion_tokens.get();
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

/// What every family's samples are read from: the scrape's input and the workers' blocks summed
/// by app ("" first: requests that matched no app).
struct scrape {
  const scrape_input& in;
  std::map<std::string, app_sum> apps;
  std::set<std::string> grpc_apps;  ///< apps with a gRPC group now: their OK series show from the start
};

scrape sum_up(const scrape_input& in) {
  scrape s{in, {}, {}};
  s.apps[""];  // requests that matched no app
  for (const auto* w : in.workers)
    w->visit([&](const app_metrics& b) { add_block(s.apps[b.name], b); });
  if (in.topology) {
    // Every app of the topology has its series, counted yet or not.
    for (const auto& a : in.topology->apps) {
      auto& sum = s.apps[a.name];
      if (!a.router_pool.empty()) sum.routed = true;
    }
    for (const auto& a : in.topology->grpc_apps) s.grpc_apps.insert(a.name);
  }
  return s;
}

/// The "" series appear once something was counted there (no empty app="" series).
bool shown(const std::string& app, const histogram_data& h) { return !app.empty() || h.count() > 0; }

/// Each replica once per app (a name listed twice in a group is one series).
template <class F>
void each_replica(const scrape& s, F&& f) {
  if (!s.in.topology) return;
  std::set<std::pair<std::string_view, std::string_view>> seen;
  for (const auto& a : s.in.topology->apps)
    for (const auto& r : a.replicas)
      if (seen.emplace(a.name, r.name).second) f(a.name, r);
}

std::uint64_t flag(bool b) { return b ? 1u : 0u; }

/// One metric family: `# HELP` and `# TYPE`, then its samples. A family whose `present` says no
/// is left out whole (its listener is not configured).
struct family {
  std::string_view name, type, help;
  void (*samples)(text_writer& w, std::string_view name, const scrape& s);
  bool (*present)(const scrape_input& in) = nullptr;
};

/// A family of one unlabelled sample: a field of scrape_input.
template <auto field>
void single(text_writer& w, std::string_view name, const scrape& s) {
  w.sample(name, {}, s.in.*field);
}

bool with_grpc(const scrape_input& in) { return in.grpc.has_value(); }
bool with_tls(const scrape_input& in) { return in.tls.has_value(); }

// The ingressd_ families in exposition order (contract §6; docs/operations.md explains each one
// and what to alert on). Counters of a label set that can happen are exposed from zero, so that
// rate() sees the first increment; label sets that cannot happen are left out.
const family families[] = {
    {"ingressd_requests_received_total", "counter", "Requests whose head was read.",
     single<&scrape_input::requests_received>},
    {"ingressd_listener_requests_total", "counter",
     "Requests whose head was read, by listener: http (listen) or https (tls.listen).",
     [](text_writer& w, std::string_view n, const scrape& s) {
       const std::uint64_t over_tls = s.in.tls ? s.in.tls->requests : 0;
       w.sample(n, {{"listener", "http"}}, s.in.requests_received - over_tls);
       if (s.in.tls) w.sample(n, {{"listener", "https"}}, over_tls);
     }},
    {"ingressd_requests_total", "counter",
     "Requests answered, by app and HTTP status code (499: the client left first).",
     [](text_writer& w, std::string_view n, const scrape& s) {
       for (const auto& [app, a] : s.apps) {
         for (const auto& [code, count] : a.codes) w.sample(n, {{"app", app}, {"code", std::to_string(code)}}, count);
         if (a.other_codes) w.sample(n, {{"app", app}, {"code", "other"}}, a.other_codes);
       }
     }},
    {"ingressd_generated_responses_total", "counter",
     "Responses ingressd generated itself, by app and the X-Serve-Reason they carried.",
     [](text_writer& w, std::string_view n, const scrape& s) {
       for (const auto& [app, a] : s.apps)
         for (std::size_t i = 0; i < reason_count; ++i) {
           // no_route only ever answers requests that matched no app (app=""), and the other
           // reasons only come with an app.
           const bool possible = app.empty() == (static_cast<reason>(i) == reason::no_route);
           if (a.generated[i] > 0 || (possible && !app.empty()))
             w.sample(n, {{"app", app}, {"reason", to_string(static_cast<reason>(i))}}, a.generated[i]);
         }
     }},
    {"ingressd_request_duration_seconds", "histogram", "Time from the request head to the end of the response.",
     [](text_writer& w, std::string_view n, const scrape& s) {
       for (const auto& [app, a] : s.apps)
         if (shown(app, a.duration)) w.histogram(n, {{"app", app}}, a.duration);
     }},
    {"ingressd_upstream_first_byte_seconds", "histogram",
     "Time from the request sent to the replica to its response headers (TTFT on streams).",
     [](text_writer& w, std::string_view n, const scrape& s) {
       for (const auto& [app, a] : s.apps)
         if (shown(app, a.first_byte)) w.histogram(n, {{"app", app}}, a.first_byte);
     }},
    // LLM figures of event-stream responses (issue #34): apps that streamed events only.
    {"ingressd_llm_ttft_seconds", "histogram",
     "Event-stream responses: time from the request's first byte to its first server-sent event sent to the "
     "client (time to first token as the client sees it).",
     [](text_writer& w, std::string_view n, const scrape& s) {
       for (const auto& [app, a] : s.apps)
         if (a.llm_ttft.count() > 0) w.histogram(n, {{"app", app}}, a.llm_ttft);
     }},
    {"ingressd_llm_inter_event_seconds", "histogram",
     "Event-stream responses: gaps between the replica reads that carried server-sent events (token pace; "
     "events that arrive in one read have no gap between them).",
     [](text_writer& w, std::string_view n, const scrape& s) {
       for (const auto& [app, a] : s.apps)
         if (a.llm_inter_event.count() > 0) w.histogram(n, {{"app", app}}, a.llm_inter_event);
     }},
    {"ingressd_llm_events_total", "counter", "Server-sent events relayed to clients.",
     [](text_writer& w, std::string_view n, const scrape& s) {
       for (const auto& [app, a] : s.apps)
         if (a.llm_events > 0) w.sample(n, {{"app", app}}, a.llm_events);
     }},
    {"ingressd_llm_tokens_total", "counter",
     "Tokens replicas reported in OpenAI-style usage objects (the final chunk of a stream with "
     "stream_options.include_usage, or a JSON reply), by kind: prompt, completion.",
     [](text_writer& w, std::string_view n, const scrape& s) {
       for (const auto& [app, a] : s.apps)
         if (a.llm_prompt_tokens + a.llm_completion_tokens > 0) {
           w.sample(n, {{"app", app}, {"kind", "prompt"}}, a.llm_prompt_tokens);
           w.sample(n, {{"app", app}, {"kind", "completion"}}, a.llm_completion_tokens);
         }
     }},
    {"ingressd_router_latency_seconds", "histogram",
     "Time of the whole routing decision, failovers included, by outcome (ok or the failure reason).",
     [](text_writer& w, std::string_view n, const scrape& s) {
       for (const auto& [app, a] : s.apps)
         for (std::size_t i = 0; i < router_outcome_count; ++i)
           if (a.router_latency[i].count() > 0 || (i == 0 && a.routed))
             w.histogram(n, {{"app", app}, {"outcome", router_outcome_name(i)}}, a.router_latency[i]);
     }},
    {"ingressd_router_attempts_total", "counter",
     "Router calls by router and result (ok: 200 reply, no_reply: none in time, non_200: other status, "
     "cancelled: the other call of a hedged pair won first).",
     [](text_writer& w, std::string_view n, const scrape& s) {
       for (const auto& [app, a] : s.apps)
         for (const auto& [router, r] : a.routers)
           for (std::size_t i = 0; i < attempt_result_count; ++i)
             w.sample(n, {{"app", app}, {"router", router}, {"result", to_string(static_cast<attempt_result>(i))}},
                      r.results[i]);
     }},
    {"ingressd_router_attempt_latency_seconds", "histogram",
     "Time of one router call, reply or failure, by router and whether it is on this node (colocated).",
     [](text_writer& w, std::string_view n, const scrape& s) {
       for (const auto& [app, a] : s.apps)
         for (const auto& [router, r] : a.routers)
           w.histogram(n, {{"app", app}, {"router", router}, {"colocated", r.colocated ? "true" : "false"}}, r.latency);
     }},
    {"ingressd_router_failures_total", "counter", "Routing decisions that failed, by reason.",
     [](text_writer& w, std::string_view n, const scrape& s) {
       for (const auto& [app, a] : s.apps)
         for (std::size_t i = 1; i < router_outcome_count; ++i)
           if (a.routed || a.failures[i] > 0)
             w.sample(n, {{"app", app}, {"reason", router_outcome_name(i)}}, a.failures[i]);
     }},
    {"ingressd_router_truncations_total", "counter",
     "Routing decisions whose body copy for the router was cut short at router.body_limit.",
     [](text_writer& w, std::string_view n, const scrape& s) {
       for (const auto& [app, a] : s.apps)
         if (a.routed || a.truncations > 0) w.sample(n, {{"app", app}}, a.truncations);
     }},
    {"ingressd_router_hedges_total", "counter",
     "Hedged router calls (router.hedge): sent (a second router was asked), won (its reply was used), "
     "refused (late, but router.hedge_budget was spent).",
     [](text_writer& w, std::string_view n, const scrape& s) {
       for (const auto& [app, a] : s.apps)
         if (a.routed)
           for (std::size_t i = 0; i < hedge_result_count; ++i)
             w.sample(n, {{"app", app}, {"result", to_string(static_cast<hedge_result>(i))}}, a.hedges[i]);
     }},
    {"ingressd_router_hedge_delay_seconds", "gauge",
     "How long a call to another router of the pool waits before it is hedged to this router (the largest "
     "over the workers; router.hedge auto follows this router's latency). Absent when not hedged.",
     [](text_writer& w, std::string_view n, const scrape& s) {
       for (const auto& [app, a] : s.apps)
         for (const auto& [router, r] : a.routers)
           if (r.hedge_delay_us >= 0)
             w.sample(n, {{"app", app}, {"router", router}}, static_cast<double>(r.hedge_delay_us) / 1e6);
     }},
    {"ingressd_router_colocated_ratio", "gauge", "Share of the app's router pool that is on this node (1 when all).",
     [](text_writer& w, std::string_view n, const scrape& s) {
       if (!s.in.topology) return;
       for (const auto& a : s.in.topology->apps) {
         if (a.router_pool.empty()) continue;
         const auto local =
             std::count_if(a.router_pool.begin(), a.router_pool.end(), [](const auto& r) { return r.colocated; });
         w.sample(n, {{"app", a.name}}, static_cast<double>(local) / static_cast<double>(a.router_pool.size()));
       }
     }},
    {"ingressd_replica_up", "gauge",
     "1 when the replica is up, else 0 (marked down by active health checks or by health.error_limit "
     "consecutive connection errors).",
     [](text_writer& w, std::string_view n, const scrape& s) {
       each_replica(s, [&](std::string_view app, const topology::endpoint& r) {
         w.sample(n, {{"app", app}, {"replica", r.name}}, flag(r.state->up.load(std::memory_order_relaxed)));
       });
     }},
    {"ingressd_replica_marked_down_total", "counter",
     "Times the replica was marked down, by cause: health_check (health.fall failed checks) or "
     "connection_errors (passive health, health.error_limit).",
     [](text_writer& w, std::string_view n, const scrape& s) {
       each_replica(s, [&](std::string_view app, const topology::endpoint& r) {
         w.sample(n, {{"app", app}, {"replica", r.name}, {"cause", "health_check"}},
                  r.state->downs_by_check.load(std::memory_order_relaxed));
         w.sample(n, {{"app", app}, {"replica", r.name}, {"cause", "connection_errors"}},
                  r.state->downs_by_errors.load(std::memory_order_relaxed));
       });
     }},
    {"ingressd_replica_in_flight", "gauge", "Requests this daemon has at the replica now (all worker threads).",
     [](text_writer& w, std::string_view n, const scrape& s) {
       each_replica(s, [&](std::string_view app, const topology::endpoint& r) {
         w.sample(n, {{"app", app}, {"replica", r.name}},
                  std::uint64_t{r.state->in_flight.load(std::memory_order_relaxed)});
       });
     }},
    {"ingressd_active_connections", "gauge", "Open client connections.", single<&scrape_input::active_connections>},
    {"ingressd_active_streams", "gauge", "Responses being relayed.", single<&scrape_input::active_streams>},
    {"ingressd_tunnels", "gauge", "WebSocket tunnels open (client.max_tunnels bounds them).",
     single<&scrape_input::tunnels>},
    {"ingressd_tunnel_bytes_total", "counter",
     "Bytes WebSocket tunnels carried, by direction: to_replica (from clients) and to_client (from replicas).",
     [](text_writer& w, std::string_view n, const scrape& s) {
       w.sample(n, {{"direction", "to_replica"}}, s.in.tunnel_bytes_to_replica);
       w.sample(n, {{"direction", "to_client"}}, s.in.tunnel_bytes_to_client);
     }},
    {"ingressd_tunnel_duration_seconds", "histogram",
     "WebSocket tunnels that ended, by app: time from the replica's 101 to the end of the tunnel.",
     [](text_writer& w, std::string_view n, const scrape& s) {
       for (const auto& [app, a] : s.apps)
         if (a.tunnel_duration.count() > 0) w.histogram(n, {{"app", app}}, a.tunnel_duration);
     }},

    // The gRPC listener's families, only with one (grpc.listen).
    {"ingressd_grpc_requests_total", "counter",
     "gRPC calls by app and the grpc-status the client got (1 CANCELLED: it reset the call first; app \"\": "
     "no app matched).",
     [](text_writer& w, std::string_view n, const scrape& s) {
       for (const auto& [app, a] : s.apps)
         for (std::size_t i = 0; i < grpc::status_count; ++i)
           if (a.grpc_status[i] > 0 || (i == 0 && s.grpc_apps.contains(app)))
             w.sample(n, {{"app", app}, {"grpc_status", std::to_string(i)}}, a.grpc_status[i]);
     },
     with_grpc},
    {"ingressd_grpc_request_duration_seconds", "histogram",
     "gRPC calls: time from the request headers to the end of the call.",
     [](text_writer& w, std::string_view n, const scrape& s) {
       for (const auto& [app, a] : s.apps)
         if (a.grpc_duration.count() > 0 || s.grpc_apps.contains(app)) w.histogram(n, {{"app", app}}, a.grpc_duration);
     },
     with_grpc},
    {"ingressd_grpc_connections", "gauge",
     "Open connections on the gRPC listener (in ingressd_active_connections too).",
     [](text_writer& w, std::string_view n, const scrape& s) { w.sample(n, {}, s.in.grpc->connections); }, with_grpc},
    {"ingressd_grpc_active_streams", "gauge", "gRPC calls in progress.",
     [](text_writer& w, std::string_view n, const scrape& s) { w.sample(n, {}, s.in.grpc->streams); }, with_grpc},
    {"ingressd_grpc_connection_errors_total", "counter",
     "gRPC listener connections ended by ingressd with GOAWAY, by reason (protocol, flow_control, "
     "compression, flood, header_list, reset_flood, timeout).",
     [](text_writer& w, std::string_view n, const scrape& s) {
       for (std::size_t i = 0; i < grpc::conn_error_count; ++i)
         w.sample(n, {{"reason", grpc::to_string(static_cast<grpc::conn_error>(i))}}, s.in.grpc->conn_errors[i]);
     },
     with_grpc},

    // The HTTPS listener's families, only with one (tls.listen).
    {"ingressd_tls_connections", "gauge",
     "Open connections on the HTTPS listener (in ingressd_active_connections too).",
     [](text_writer& w, std::string_view n, const scrape& s) { w.sample(n, {}, s.in.tls->connections); }, with_tls},
    {"ingressd_tls_handshakes_total", "counter",
     "TLS handshakes completed, by kind: full, or resumed from a session ticket.",
     [](text_writer& w, std::string_view n, const scrape& s) {
       w.sample(n, {{"kind", "full"}}, s.in.tls->handshakes - s.in.tls->resumed);
       w.sample(n, {{"kind", "resumed"}}, s.in.tls->resumed);
     },
     with_tls},
    {"ingressd_tls_handshake_failures_total", "counter",
     "TLS handshakes that failed, by reason: timeout (tls.handshake_timeout), http_request (plain HTTP on "
     "the HTTPS port), protocol_version, no_shared_cipher, peer_closed, bad_certificate (the client "
     "refused ours), other.",
     [](text_writer& w, std::string_view n, const scrape& s) {
       for (const auto& [why, count] : s.in.tls->failures) w.sample(n, {{"reason", why}}, count);
     },
     with_tls},
    {"ingressd_tls_certificate_expiry_timestamp_seconds", "gauge",
     "Unix time at which the HTTPS listener's certificate in force expires (its notAfter).",
     [](text_writer& w, std::string_view n, const scrape& s) {
       w.sample(n, {}, static_cast<double>(s.in.tls->not_after));
     },
     with_tls},

    {"ingressd_topology_updates_total", "counter", "Topology changes applied.",
     single<&scrape_input::topology_updates>},
    {"ingressd_topology_errors_total", "counter", "Topology documents or fetches rejected (the last good one stays).",
     single<&scrape_input::topology_errors>},
    {"ingressd_topology_last_update_timestamp_seconds", "gauge",
     "Unix time at which the topology in force was applied (its last change; /topology last_update).",
     [](text_writer& w, std::string_view n, const scrape& s) {
       if (s.in.topology)
         w.sample(n, {}, std::chrono::duration<double>(s.in.topology->updated.time_since_epoch()).count());
     }},
    // No sample without a source to poll (--demo), so that no staleness alert can fire there.
    {"ingressd_topology_last_success_timestamp_seconds", "gauge",
     "Unix time at which the topology source last confirmed the topology in force: a fetch or file check "
     "that found a valid document, changed or not (0: none yet).",
     [](text_writer& w, std::string_view n, const scrape& s) {
       if (s.in.topology_last_success) w.sample(n, {}, *s.in.topology_last_success);
     }},
    {"ingressd_config_reloads_total", "counter", "SIGHUP reloads applied.", single<&scrape_input::config_reloads>},
    {"ingressd_config_reload_errors_total", "counter", "SIGHUP reloads rejected (the running config stays).",
     single<&scrape_input::config_errors>},
    {"ingressd_config_generations", "gauge",
     "Configs in memory: the one in force plus older ones still held by requests that started under "
     "them (SIGHUP).",
     single<&scrape_input::config_generations>},
    {"ingressd_accept_errors_total", "counter",
     "Accepts that failed for lack of file descriptors or memory (main and admin listeners); each pauses "
     "that listener, 5 ms doubling to 1 s.",
     single<&scrape_input::accept_errors>},
    {"ingressd_proxy_protocol_errors_total", "counter",
     "Connections closed without a response for their PROXY protocol header (client.proxy_protocol), by "
     "reason: untrusted (peer not in client.trusted_proxies), invalid, oversized, truncated, timeout.",
     [](text_writer& w, std::string_view n, const scrape& s) {
       for (std::size_t i = 0; i < net::proxy_error_count; ++i)
         w.sample(n, {{"reason", net::to_string(static_cast<net::proxy_error>(i))}}, s.in.proxy_protocol_errors[i]);
     }},
    {"ingressd_forwarded_chain_errors_total", "counter",
     "X-Forwarded-For chains from trusted proxies (client.trusted_proxies) that held something other than "
     "addresses: ignored, the proxy taken as the client.",
     single<&scrape_input::forwarded_chain_errors>},
    {"ingressd_router_reply_headers_skipped_total", "counter",
     "Members of router replies' request_headers left out because their value was not a string (the reply "
     "is used without them).",
     single<&scrape_input::router_headers_skipped>},
    {"ingressd_access_log_dropped_total", "counter", "Access log lines dropped because the log queue was full.",
     single<&scrape_input::access_log_dropped>},
    {"ingressd_draining", "gauge", "1 once SIGTERM or SIGINT has started the drain, else 0.",
     [](text_writer& w, std::string_view n, const scrape& s) { w.sample(n, {}, flag(s.in.draining)); }},
    {"ingressd_ray_node_draining", "gauge",
     "1 while Ray drains this node (its Serve proxy is DRAINING in Ray's proxies map): /-/healthz fails, "
     "requests are still served.",
     [](text_writer& w, std::string_view n, const scrape& s) {
       w.sample(n, {}, flag(s.in.topology && s.in.topology->ray_node_draining()));
     }},
};

// --- Ray Serve's proxy series (metrics.ray_compatible) ----------------------------------------
// Names, tag keys and the error rule from ray python/ray/serve/_private/proxy.py, the latency
// buckets (ms) from constants.py: Ray's Serve Grafana dashboard reads them unchanged.

/// One protocol's four Ray families.
struct ray_protocol {
  bool grpc;
  std::string_view requests, errors, latency, ongoing;
  std::string_view requests_help, errors_help, latency_help, ongoing_help;
  std::uint64_t scrape_input::*ongoing_value;
};

constexpr ray_protocol ray_http{false,
                                "ray_serve_num_http_requests_total",
                                "ray_serve_num_http_error_requests_total",
                                "ray_serve_http_request_latency_ms",
                                "ray_serve_num_ongoing_http_requests",
                                "The number of HTTP requests processed.",
                                "The number of errored HTTP responses.",
                                "The end-to-end latency of HTTP requests (measured from the Serve HTTP proxy).",
                                "The number of ongoing requests in this HTTP proxy.",
                                &scrape_input::ongoing_http};
constexpr ray_protocol ray_grpc{true,
                                "ray_serve_num_grpc_requests_total",
                                "ray_serve_num_grpc_error_requests_total",
                                "ray_serve_grpc_request_latency_ms",
                                "ray_serve_num_ongoing_grpc_requests",
                                "The number of gRPC requests processed.",
                                "The number of errored gRPC responses.",
                                "The end-to-end latency of gRPC requests (measured from the Serve gRPC proxy).",
                                "The number of ongoing requests in this gRPC proxy.",
                                &scrape_input::ongoing_grpc};

/// One series of a protocol, with its labels as Ray writes them.
struct ray_row {
  std::string_view app;
  std::string route, method, code;
  bool error;
  const histogram_data* latency;
};

std::string ray_route(const std::string& app, const app_sum& a, ray_series::route r, bool grpc) {
  switch (r) {
    case ray_series::route::healthz: return "/-/healthz";
    case ray_series::route::routes: return "/-/routes";
    case ray_series::route::app: break;
  }
  if (app.empty()) return "";
  return grpc ? app : a.route_prefix;  // Ray: a gRPC call's route is its app's name
}

std::vector<ray_row> ray_rows(const ray_protocol& p, const std::map<std::string, app_sum>& apps) {
  std::vector<ray_row> rows;
  for (const auto& [app, a] : apps)
    for (const auto& [key, h] : p.grpc ? a.ray_grpc : a.ray_http) {
      const auto& [method, status, r] = key;
      // Ray's error rule: an HTTP status of 4xx or 5xx; for gRPC anything but OK.
      rows.push_back({app, ray_route(app, a, r, p.grpc), method,
                      p.grpc ? grpc_status_label(status) : std::to_string(status),
                      p.grpc ? status != 0 : status >= 400, &h});
    }
  return rows;
}

void render_ray(text_writer& w, const ray_protocol& p, const scrape& s) {
  const auto rows = ray_rows(p, s.apps);
  w.family(p.requests, p.requests_help, "counter");
  for (const auto& r : rows)
    w.sample(p.requests, {{"application", r.app}, {"route", r.route}, {"method", r.method}, {"status_code", r.code}},
             r.latency->count());
  w.family(p.errors, p.errors_help, "counter");
  for (const auto& r : rows)
    if (r.error)
      w.sample(p.errors, {{"application", r.app}, {"route", r.route}, {"method", r.method}, {"error_code", r.code}},
               r.latency->count());
  w.family(p.latency, p.latency_help, "histogram");
  for (const auto& r : rows)
    w.histogram(p.latency, {{"application", r.app}, {"route", r.route}, {"method", r.method}, {"status_code", r.code}},
                *r.latency, 1000.0);
  w.family(p.ongoing, p.ongoing_help, "gauge");
  w.sample(p.ongoing, {{"node_id", s.in.node_id}, {"node_ip_address", s.in.node_ip}}, s.in.*p.ongoing_value);
}

}  // namespace

std::string render(const scrape_input& in) {
  const scrape s = sum_up(in);
  text_writer w;
  for (const auto& f : families) {
    if (f.present && !f.present(in)) continue;
    w.family(f.name, f.help, f.type);
    f.samples(w, f.name, s);
  }
  if (in.ray_compatible) {
    render_ray(w, ray_http, s);
    if (in.grpc) render_ray(w, ray_grpc, s);
  }
  if (in.process) render_process(w, *in.process);
  return std::move(w).str();
}

}  // namespace ingressd::metrics
