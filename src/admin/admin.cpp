#include "admin/admin.hpp"

#include <unordered_set>

#include <boost/asio/write.hpp>
#include <boost/beast/core/flat_buffer.hpp>
#include <boost/beast/http/read.hpp>
#include <boost/beast/http/string_body.hpp>
#include <fmt/chrono.h>
#include <fmt/format.h>
#include <nlohmann/json.hpp>
#include <spdlog/spdlog.h>

#include "ingressd/core/scope.hpp"
#include "ingressd/http/message.hpp"
#include "ingressd/metrics/exposition.hpp"
#include "worker/worker.hpp"

namespace ingressd::server {

namespace bhttp = boost::beast::http;

admin_server::admin_server(asio::io_context& ioc, const tcp::endpoint& ep, error_code& ec, handlers h)
    : ioc_(ioc), acceptor_(ioc), h_(std::move(h)) {
  acceptor_.open(ep.protocol(), ec);
  if (!ec) acceptor_.set_option(asio::socket_base::reuse_address(true), ec);
  if (!ec) acceptor_.bind(ep, ec);
  if (!ec) acceptor_.listen(asio::socket_base::max_listen_connections, ec);
  if (!ec) port_ = acceptor_.local_endpoint(ec).port();
}

void admin_server::start() {
  asio::co_spawn(ioc_, accept_loop(), [](std::exception_ptr) {});
}

void admin_server::stop() {
  error_code ignored;
  acceptor_.close(ignored);
  if (backoff_timer_) backoff_timer_->cancel();
}

awaitable<void> admin_server::accept_loop() {
  asio::steady_timer backoff_timer(ioc_);
  registration<asio::steady_timer> reg(backoff_timer_, backoff_timer);
  accept_backoff backoff;
  while (acceptor_.is_open()) {
    auto [ec, sock] = co_await acceptor_.async_accept(nothrow);
    if (ec) {
      if (ec == asio::error::operation_aborted || !acceptor_.is_open()) break;
      // A scrape while the process is out of descriptors must not spin the control thread,
      // which also sequences the drain (hardening H1).
      if (accept_starved(ec)) {
        if (h_.shared) h_.shared->accept_errors.fetch_add(1, std::memory_order_relaxed);
        const auto pause = backoff.next();
        spdlog::warn("admin accept failed: {}; pausing {}ms", ec.message(), pause.count());
        backoff_timer.expires_after(pause);
        co_await backoff_timer.async_wait(nothrow);
      }
      continue;
    }
    backoff.reset();
    asio::co_spawn(ioc_, serve(std::move(sock)), [](std::exception_ptr) {});
  }
}

awaitable<void> admin_server::serve(tcp::socket sock) {
  // One request per connection: the admin endpoints are scraped, not hammered.
  boost::beast::flat_buffer buf;
  bhttp::request_parser<bhttp::string_body> p;
  p.header_limit(16 * 1024);
  p.body_limit(64 * 1024);
  asio::steady_timer deadline(ioc_);
  deadline.expires_after(std::chrono::seconds(10));
  deadline.async_wait([&sock](error_code ec) {
    if (!ec) {
      error_code ignored;
      sock.cancel(ignored);
    }
  });
  auto [ec, n] = co_await bhttp::async_read(sock, buf, p, nothrow);
  std::string response;
  if (ec) {
    response = http::make_response(400, "text/plain", "Bad Request", true);
  } else {
    std::string_view target = p.get().target();
    auto path = target.substr(0, target.find('?'));
    const bool head_only = p.get().method() == bhttp::verb::head;
    if (p.get().method() != bhttp::verb::get && !head_only) {
      response = http::make_response(405, "text/plain", "Method Not Allowed", true);
      http::insert_field(response, "Allow", "GET, HEAD");  // RFC 9110 §15.5.6: a 405 says what is allowed
    } else if (path == "/metrics") {
      response = http::make_response(200, "text/plain; version=0.0.4", metrics_text(), true, 11, head_only);
    } else if (path == "/topology") {
      response = http::make_response(200, "application/json", topology_json(), true, 11, head_only);
    } else {
      response = http::make_response(404, "text/plain", "Not Found", true, 11, head_only);
    }
  }
  co_await asio::async_write(sock, asio::buffer(response), nothrow);
  deadline.cancel();
  error_code ignored;
  sock.shutdown(tcp::socket::shutdown_send, ignored);
  sock.close(ignored);
}

/// metrics.ray_compatible: what the ray_serve_* series need beside the workers' blocks.
static void ray_inputs(metrics::scrape_input& in) {
  in.ray_compatible = true;
  if (!in.topology) return;
  in.node_ip = in.topology->node_ip;
  in.node_id = in.topology->ray_node_id;
  // Requests being proxied to a replica or fallback target now (node-wide counts), HTTP apps'
  // and gRPC apps' apart (a target shared by both counts once, as HTTP).
  std::unordered_set<const topology::upstream_state*> seen;
  auto add = [&](const topology::endpoint& ep, std::uint64_t& to) {
    if (ep.state && seen.insert(ep.state).second) to += ep.state->in_flight.load(std::memory_order_relaxed);
  };
  for (const auto& a : in.topology->apps) {
    for (const auto& r : a.replicas) add(r, in.ongoing_http);
    if (a.fallback) add(*a.fallback, in.ongoing_http);
  }
  for (const auto& a : in.topology->grpc_apps) {
    for (const auto& r : a.replicas) add(r, in.ongoing_grpc);
    if (a.fallback) add(*a.fallback, in.ongoing_grpc);
  }
}

std::string admin_server::metrics_text() const {
  metrics::scrape_input in;
  const std::int64_t not_after = h_.shared ? h_.shared->tls_not_after.load(std::memory_order_relaxed) : 0;
  if (not_after != 0) {
    // Built whole, then moved in (GCC 12 sees the vector inside the optional as maybe uninitialized
    // when it is filled in place).
    metrics::scrape_tls_input t;
    t.not_after = not_after;
    for (std::size_t i = 0; i < tls::handshake_failure_count; ++i)
      t.failures.emplace_back(tls::to_string(static_cast<tls::handshake_failure>(i)), 0);
    in.tls = std::move(t);
  }
  for (const auto* w : h_.workers()) {
    in.workers.push_back(&w->metrics());
    if (in.tls) {
      // Before requests: a request is counted there first, so the https share never exceeds it.
      const auto& st = w->stats();
      in.tls->requests += st.tls_requests.get();
      in.tls->connections += st.tls_connections.get();
      in.tls->resumed += st.tls_resumed.get();
      in.tls->handshakes += st.tls_handshakes.get();
      for (std::size_t i = 0; i < tls::handshake_failure_count; ++i) in.tls->failures[i].second += st.tls_failures[i].get();
    }
    if (h_.shared && h_.shared->grpc) {
      if (!in.grpc) in.grpc.emplace();
      const auto& st = w->stats();
      in.grpc->connections += st.grpc_connections.get();
      in.grpc->streams += st.grpc_streams.get();
      for (std::size_t i = 0; i < grpc::conn_error_count; ++i) in.grpc->conn_errors[i] += st.grpc_conn_errors[i].get();
    }
    in.requests_received += w->stats().requests.get();
    for (std::size_t i = 0; i < net::proxy_error_count; ++i)
      in.proxy_protocol_errors[i] += w->stats().proxy_protocol_errors[i].get();
    in.forwarded_chain_errors += w->stats().forwarded_chain_errors.get();
    in.router_headers_skipped += w->stats().router_headers_skipped.get();
    in.active_connections += w->stats().active_connections.get();
    in.active_streams += w->stats().active_streams.get();
    in.tunnels += w->stats().tunnels.get();
    in.tunnel_bytes_to_replica += w->stats().tunnel_bytes_to_replica.get();
    in.tunnel_bytes_to_client += w->stats().tunnel_bytes_to_client.get();
  }
  auto snap = h_.topology ? h_.topology() : nullptr;
  in.topology = snap.get();
  if (const auto cfg = h_.config ? h_.config() : nullptr; cfg && cfg->metrics.ray_compatible) ray_inputs(in);
  in.process = metrics::read_process_stats();
  if (h_.shared) {
    in.topology_updates = h_.shared->topology_updates.load(std::memory_order_relaxed);
    in.topology_errors = h_.shared->topology_errors.load(std::memory_order_relaxed);
    in.config_reloads = h_.shared->config_reloads.load(std::memory_order_relaxed);
    in.config_errors = h_.shared->config_errors.load(std::memory_order_relaxed);
    in.config_generations = h_.shared->config_generations.load(std::memory_order_relaxed);
    in.accept_errors = h_.shared->accept_errors.load(std::memory_order_relaxed);
    in.draining = h_.shared->draining.load(std::memory_order_relaxed);
    if (const auto ms = h_.shared->topology_current_ms.load(std::memory_order_relaxed); ms >= 0)
      in.topology_last_success = static_cast<double>(ms) / 1000.0;
    if (h_.shared->access_log) in.access_log_dropped = h_.shared->access_log->dropped();
  }
  return metrics::render(in);
}

std::string admin_server::topology_json() const {
  nlohmann::json j;
  auto snap = h_.topology();
  if (!snap) {
    j["loaded"] = false;
    return j.dump();
  }
  j["loaded"] = true;
  j["serve_running"] = snap->doc.serve_running;
  j["node_ip"] = snap->node_ip;
  // This node's entry of Ray's `proxies` map (its Serve proxy's status: Ray's node drain).
  j["ray_node"] = nlohmann::json::object();
  j["ray_node"]["node_id"] = snap->ray_node_id.empty() ? nlohmann::json() : nlohmann::json(snap->ray_node_id);
  j["ray_node"]["status"] = snap->ray_node_status.empty() ? nlohmann::json() : nlohmann::json(snap->ray_node_status);
  j["ray_node"]["draining"] = snap->ray_node_draining();
  j["generation"] = snap->generation;
  j["last_update"] = fmt::format("{:%Y-%m-%dT%H:%M:%S}Z", fmt::gmtime(std::chrono::system_clock::to_time_t(snap->updated)));
  j["source"] = snap->source;
  j["topology_updates"] = h_.shared ? h_.shared->topology_updates.load() : 0;
  j["topology_errors"] = h_.shared ? h_.shared->topology_errors.load() : 0;
  std::unordered_map<std::string, std::string> causes;
  if (h_.down_causes) causes = h_.down_causes();
  // Health as routing sees it (the upstream state every worker reads), why it is down, and the
  // requests in flight to it from all workers.
  auto upstream = [&](const topology::endpoint& e) {
    nlohmann::json u{{"address", e.key}, {"name", e.name}, {"colocated", e.colocated}};
    const bool up = e.state->up.load(std::memory_order_relaxed);
    u["health"] = up ? "up" : "down";
    if (!up)
      if (auto it = causes.find(e.key); it != causes.end()) u["down_cause"] = it->second;
    u["in_flight"] = e.state->in_flight.load(std::memory_order_relaxed);
    return u;
  };
  // Each worker's current hedge delay per app and router (router.hedge), in ms: null where it
  // does not hedge.
  std::unordered_map<std::string, nlohmann::json> hedge_delays;  // by app name + "\n" + router key
  if (h_.workers)
    for (const auto* w : h_.workers())
      w->metrics().visit([&](const metrics::app_metrics& b) {
        for (const auto& r : b.routers()) {
          auto& list = hedge_delays[b.name + "\n" + r->key];
          if (!list.is_array()) list = nlohmann::json::array();
          const auto us = r->hedge_delay_us.load(std::memory_order_relaxed);
          if (us < 0) list.push_back(nullptr);
          else list.push_back(static_cast<double>(us) / 1000.0);
        }
      });
  auto& apps = j["apps"] = nlohmann::json::array();
  for (const auto& a : snap->apps) {
    nlohmann::json app;
    app["name"] = a.name;
    app["route_prefix"] = a.route_prefix;
    app["router_fallback"] = a.router_fallback;
    auto& pool = app["router_pool"] = nlohmann::json::array();
    for (const auto& r : a.router_pool) {
      nlohmann::json e{{"address", r.key}, {"name", r.name}, {"colocated", r.colocated}};
      if (auto it = hedge_delays.find(a.name + "\n" + r.key); it != hedge_delays.end()) e["hedge_delay_ms"] = it->second;
      pool.push_back(std::move(e));
    }
    auto& reps = app["replicas"] = nlohmann::json::array();
    for (const auto& r : a.replicas) reps.push_back(upstream(r));
    if (a.fallback) app["fallback"] = upstream(*a.fallback);
    apps.push_back(std::move(app));
  }
  if (snap->fallback) j["fallback"] = upstream(*snap->fallback);
  // gRPC apps (grpc.listen): found by name, no routers; targets checked with grpc.health_path.
  auto& grpc_apps = j["grpc_apps"] = nlohmann::json::array();
  for (const auto& a : snap->grpc_apps) {
    nlohmann::json app{{"name", a.name}};
    auto& reps = app["replicas"] = nlohmann::json::array();
    for (const auto& r : a.replicas) reps.push_back(upstream(r));
    if (a.fallback) app["fallback"] = upstream(*a.fallback);
    grpc_apps.push_back(std::move(app));
  }
  if (snap->grpc_fallback) j["grpc_fallback"] = upstream(*snap->grpc_fallback);
  return j.dump();
}

}  // namespace ingressd::server
