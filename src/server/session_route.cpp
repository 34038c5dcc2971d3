// The first stage of a proxied request: decide where it goes (contract §4.2), the router call
// included. See session.hpp for the stages.
#include <boost/asio/experimental/awaitable_operators.hpp>
#include <boost/container/small_vector.hpp>
#include <spdlog/spdlog.h>

#include "ingressd/core/scope.hpp"
#include "ingressd/core/socket_io.hpp"
#include "ingressd/http/syntax.hpp"
#include "ingressd/http/validate.hpp"
#include "ingressd/routing/chooser.hpp"
#include "server/session.hpp"
#include "server/session_parts.hpp"

namespace ingressd::server {

namespace {

constexpr std::uint32_t router_header_limit = 16 * 1024;
constexpr std::uint64_t router_body_limit = 1024 * 1024;
/// Timeout for an attempt at a router that recently gave no reply: a probe, not a full wait.
constexpr auto router_probe_timeout = std::chrono::seconds(1);

}  // namespace

bool session::router_decides(request_state& rs) {
  const auto& view = rs.snap->apps[rs.where.app];
  // An app with no healthy replica (scaled to zero: Ray sends `targets: []`) goes to its fallback
  // target, the head node's Serve proxy, which scales it up: no router could name a replica.
  rs.prefer_fallback = usable_fallback(view) && !has_healthy_replica(view);
  const bool use_router = !rs.prefer_fallback && !view.router_pool.empty() && method_routed(parser_->get().method_string());
  rs.resend_ok = !use_router && !rs.has_body && http::idempotent(parser_->get().method());
  return use_router;
}

awaitable<session::step> session::decide_route(request_state& rs) {
  const auto& cfg = this->cfg();
  const auto& view = rs.snap->apps[rs.where.app];
  if (rs.expect_continue) {
    rs.expect_continue = false;
    if (!(co_await write_all(continue_100))) co_return finish(rs, outcome::close);
  }
  routing::router_reply reply;
  std::optional<reason> failure;
  error_code body_ec;
  if (cfg.router.forward_body) {
    // The router sees the first body_limit bytes as soon as they have arrived, or what has
    // arrived after router.body_wait.
    body_ec = co_await read_prebody(cfg.router.body_limit, cfg.router.body_wait);
    if (!body_ec) {
      std::optional<std::uint64_t> total;
      if (!rs.chunked_in && parser_->content_length() && *parser_->content_length() > rq_->prebody.size())
        total = *parser_->content_length();
      if (!parser_->is_done()) rq_->rec.block->truncations.add();
      std::tie(reply, failure) = co_await ask_routers(rs, rq_->prebody, total);
    }
  } else if (const auto cl = parser_->content_length();
             parser_->is_done() || (!rs.chunked_in && cl && *cl <= prebody_cap && buf_.size() >= *cl)) {
    // The whole body arrived with the head (the common LLM request): take it from the buffer
    // (no I/O) and ask the router; nothing is left to overlap with.
    body_ec = co_await read_prebody(prebody_cap);
    if (!body_ec) std::tie(reply, failure) = co_await ask_routers(rs, {}, std::nullopt);
  } else {
    // The router call starts now; the body keeps arriving meanwhile (bounded by prebody_cap).
    using namespace asio::experimental::awaitable_operators;
    auto both = co_await (ask_routers(rs, {}, std::nullopt) && read_prebody(prebody_cap));
    std::tie(reply, failure) = std::get<0>(both);
    body_ec = std::get<1>(both);
  }
  if (aborted_) co_return finish(rs, outcome::close);
  if (body_ec) {
    rs.result = co_await body_error(body_ec);
    co_return step::done;
  }
  if (!failure) {
    if (auto it = view.replica_by_name.find(reply.replica_id); it != view.replica_by_name.end()) {
      rs.where.pinned = it->second;
      rs.router_headers = std::move(reply.request_headers);
    } else {
      failure = reason::unknown_replica_id;
    }
  }
  note_router_outcome(failure);
  if (!failure) co_return step::next;
  if (*failure == reason::unknown_replica_id && usable_fallback(view)) {
    // The router knows a replica we do not yet: the head node's Serve proxy re-picks (Ray #64218).
    rs.prefer_fallback = true;
  } else if (cfg.router.failure_mode == config::on_failure::fail_open || view.router_fallback) {
    spdlog::debug("router failure {} for app {}: failing open", to_string(*failure), view.name);
  } else {
    co_return co_await answer(rs, *failure);
  }
  co_return step::next;
}

awaitable<std::pair<routing::router_reply, std::optional<reason>>> session::ask_routers(
    const request_state& rs, std::string_view body, std::optional<std::uint64_t> truncated_total) {
  const auto& cfg = this->cfg();
  struct latency_mark {  // the whole decision, failovers included (ingressd_router_latency_seconds)
    session& s;
    clock::time_point t0 = clock::now();
    ~latency_mark() { s.rq_->rec.router_latency = clock::now() - t0; }
  } latency{*this};
  const auto& view = rs.snap->apps[rs.where.app];
  const auto& pool = view.router_pool;
  const std::size_t n = pool.size();
  // The cursor lives in the worker's app table, which follows the worker's current snapshot. If
  // the topology changed while the body prefix was read, use the app's cursor there only when
  // its pool is the same.
  std::size_t start = 0;
  if (w_.snapshot_ptr() == rs.snap) {
    start = w_.app(rs.where.app).router_cursor.take(n);
  } else if (const auto* cur = w_.snap()) {
    for (std::size_t i = 0; i < cur->apps.size(); ++i)
      if (cur->apps[i].name == view.name && cur->apps[i].pool_signature == view.pool_signature)
        start = w_.app(i).router_cursor.take(n);
  }

  // The session header, or its -/_ variant (ray-serve-ingress.md §2.1).
  std::string_view session_value;
  const auto& req = parser_->get();
  if (!cfg.router.session_header.empty()) {
    const std::string& name = cfg.router.session_header;
    auto it = req.find(name);
    if (it == req.end()) {
      boost::container::small_vector<char, 64> alt(name.begin(), name.end());  // no allocation for usual names
      for (auto& c : alt) c = c == '-' ? '_' : c == '_' ? '-' : c;
      it = req.find(std::string_view(alt.data(), alt.size()));
    }
    if (it != req.end() && http::valid_field_value(it->value())) session_value = it->value();
  }

  auto& memory = w_.routers();
  const auto now = clock::now();
  boost::container::small_vector<routing::router_memory::state, 8> states(n);
  for (std::size_t r = 0; r < n; ++r) states[r] = memory.get(pool[r].key, now);
  for (std::size_t r : routing::router_attempt_order(states, start)) {
    const auto& ep = pool[r];
    clock::duration timeout = cfg.router.timeout;
    if (states[r] != routing::router_memory::state::up) {
      timeout = std::min<clock::duration>(timeout, router_probe_timeout);
      memory.probing(ep.key, now);
    }
    routing::build_router_request({ep.key, body, truncated_total, cfg.router.session_header, session_value, rs.request_id},
                                  rq_->router_request);
    const auto attempt_start = clock::now();
    auto ex = co_await router_attempt(ep, rq_->router_request, timeout);
    if (aborted_) co_return std::pair{routing::router_reply{}, std::optional(reason::router_unreachable)};
    note_router_attempt(r, ep, ex, clock::now() - attempt_start);
    if (!ex.replied) {
      memory.failed(ep.key, clock::now());
      spdlog::debug("router {} gave no reply{}", ep.key, ex.timed_out ? " (timeout)" : "");
      continue;
    }
    memory.replied(ep.key);
    auto reply = routing::parse_router_reply(ex.status, ex.body);
    switch (reply.what) {
      case routing::router_reply::kind::pinned:
        co_return std::pair{std::move(reply), std::optional<reason>{}};
      case routing::router_reply::kind::non_200:
        co_return std::pair{std::move(reply), std::optional(reason::router_non_200)};
      case routing::router_reply::kind::unparseable:
        co_return std::pair{std::move(reply), std::optional(reason::unparseable_replica_id)};
    }
  }
  co_return std::pair{routing::router_reply{}, std::optional(reason::router_unreachable)};
}

awaitable<session::router_exchange> session::router_attempt(const topology::endpoint& ep,
                                                             const std::string& request,
                                                             clock::duration timeout) {
  router_call call;
  registration<router_call> in_progress(call_, call);
  const unsigned gen = ++router_gen_;
  rq_->router_timer.expires_after(timeout);
  rq_->router_timer.async_wait([self = shared_from_this(), gen](error_code ec) {
    if (ec || gen != self->router_gen_ || !self->call_) return;
    self->call_->timed_out = true;
    self->call_->lease.cancel();
  });
  struct timer_stop {
    session& s;
    ~timer_stop() {
      ++s.router_gen_;
      s.rq_->router_timer.cancel();
    }
  } stop_timer{*this};

  // Router calls are re-sent on a fresh connection when a pooled one turns out stale (below),
  // so the pool skips its liveness peek: one system call less per request.
  upstream::acquire_policy policy{upstream::acquire_policy::staleness::caller_retries, false, upstream::router_pool_scale};
  for (;; policy.fresh = true) {
    call.lease = w_.pool().acquire(ep.key, policy);
    if (!call.lease) {
      const error_code ec = co_await call.lease.connect(ep.dial, w_.ioc().get_executor());
      if (ec || call.timed_out || aborted_) co_return router_exchange{false, call.timed_out, 0, {}};
    }
    std::array<asio::const_buffer, 1> request_buf{asio::buffer(request)};
    std::span<asio::const_buffer> pending(request_buf);
    error_code ec;
    if (!write_now(call.lease->sock, pending, ec))
      std::tie(ec, std::ignore) = co_await asio::async_write(call.lease->sock, pending, nothrow);
    http::status_body_parser rp;
    rp.header_limit(router_header_limit);
    rp.body_limit(router_body_limit);
    if (!ec) {
      http::bounded_buffer in(call.lease->buf, http::body_read_cap(router_header_limit));  // endless chunk line
      co_await after_ready_handlers(w_.ioc());
      // The timer or abort() may have fired meanwhile, with no read pending to cancel.
      if (call.timed_out || aborted_) ec = asio::error::operation_aborted;
      else if (!parse_now(call.lease->sock, call.lease->buf, in.max_size(), rp, true, ec))
        std::tie(ec, std::ignore) = co_await bhttp::async_read(call.lease->sock, in, rp, nothrow);
    }
    if (ec) {
      const bool stale = call.lease.reused() && !rp.got_some() && !call.timed_out && !aborted_;
      call.lease.close();
      // A pooled connection the router had closed fails before any reply byte: that is
      // staleness, not a router failure; try once more on a fresh connection.
      if (stale && !policy.fresh) continue;
      co_return router_exchange{false, call.timed_out, 0, {}};
    }
    call.lease.release(rp.keep_alive());
    co_return router_exchange{true, false, rp.status(), std::move(rp.body())};
  }
}

}  // namespace ingressd::server
