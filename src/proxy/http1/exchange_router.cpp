// The first stage of a proxied request: decide where it goes (contract §4.2), the router call
// and its hedge included. See exchange.hpp for the stages.
#include <boost/asio/experimental/awaitable_operators.hpp>
#include <boost/container/small_vector.hpp>
#include <spdlog/spdlog.h>

#include "ingressd/core/scope.hpp"
#include "ingressd/core/socket_io.hpp"
#include "ingressd/http/parse_now.hpp"
#include "ingressd/http/syntax.hpp"
#include "ingressd/http/validate.hpp"
#include "ingressd/routing/chooser.hpp"
#include "proxy/http1/exchange.hpp"
#include "proxy/http1/parts.hpp"

namespace ingressd::server {

namespace {

constexpr std::uint32_t router_header_limit = 16 * 1024;
constexpr std::uint64_t router_body_limit = 1024 * 1024;
/// Timeout for an attempt at a router that recently gave no reply: a probe, not a full wait.
constexpr auto router_probe_timeout = std::chrono::seconds(1);

bool failed_recently(routing::router_memory::state s) {
  return s == routing::router_memory::state::probe || s == routing::router_memory::state::down;
}

using race_call = routing::hedge_race::call;

}  // namespace

bool exchange::router_decides() {
  const auto& v = view();
  // An app with no healthy replica (scaled to zero: Ray sends `targets: []`) goes to its fallback
  // target, the head node's Serve proxy, which scales it up: no router could name a replica.
  prefer_fallback_ = usable_fallback(v) && !has_healthy_replica(v);
  const auto& req = c_.parser_->get();
  const bool use_router = !prefer_fallback_ && !v.router_pool.empty() && c_.method_routed(req.method_string());
  resend_ok_ = !use_router && !has_body_ && http::idempotent(req.method());
  return use_router;
}

awaitable<exchange::step> exchange::decide_route() {
  const auto& cfg = this->cfg();
  if (expect_continue_) {
    expect_continue_ = false;
    if (!(co_await c_.write_all(continue_100))) co_return finish(outcome::close);
  }
  decision d{{}, std::nullopt};
  error_code body_ec;
  auto& parser = *c_.parser_;
  if (cfg.router.forward_body) {
    // The router sees the first body_limit bytes as soon as they have arrived, or what has
    // arrived after router.body_wait.
    body_ec = co_await c_.read_prebody(cfg.router.body_limit, cfg.router.body_wait);
    if (!body_ec) {
      std::optional<std::uint64_t> total;
      if (!chunked_in_ && parser.content_length() && *parser.content_length() > rq_.prebody.size())
        total = *parser.content_length();
      if (!parser.is_done()) rq_.rec.block->truncations.add();
      d = co_await ask_routers(rq_.prebody, total);
    }
  } else if (const auto cl = parser.content_length();
             parser.is_done() || (!chunked_in_ && cl && *cl <= prebody_cap && c_.buf_.size() >= *cl)) {
    // The whole body arrived with the head (the common LLM request): take it from the buffer
    // (no I/O) and ask the router; nothing is left to overlap with.
    body_ec = co_await c_.read_prebody(prebody_cap);
    if (!body_ec) d = co_await ask_routers({}, std::nullopt);
  } else {
    // The router call starts now; the body keeps arriving meanwhile (bounded by prebody_cap).
    using namespace asio::experimental::awaitable_operators;
    auto both = co_await (ask_routers({}, std::nullopt) && c_.read_prebody(prebody_cap));
    d = std::move(std::get<0>(both));
    body_ec = std::get<1>(both);
  }
  if (c_.aborted_) co_return finish(outcome::close);
  if (body_ec) {
    result_ = co_await c_.body_error(body_ec);
    co_return step::done;
  }
  co_return co_await take_router_reply(std::move(d.first), d.second);
}

awaitable<exchange::step> exchange::take_router_reply(routing::router_reply reply, std::optional<reason> failure) {
  const auto& v = view();
  if (!failure && reply.skipped_headers > 0) {
    w_.stats().router_headers_skipped.add(reply.skipped_headers);
    spdlog::debug("router reply for {}: {} request_headers value(s) not a string, left out", v.name,
                  reply.skipped_headers);
  }
  if (!failure) {
    if (auto it = v.replica_by_name.find(reply.replica_id); it != v.replica_by_name.end()) {
      where_.pinned = it->second;
      router_headers_ = std::move(reply.request_headers);
    } else {
      failure = reason::unknown_replica_id;
    }
  }
  c_.note_router_outcome(failure);
  if (!failure) co_return step::next;
  if (*failure == reason::unknown_replica_id && usable_fallback(v)) {
    // The router knows a replica we do not yet: the head node's Serve proxy re-picks (Ray #64218).
    prefer_fallback_ = true;
  } else if (cfg().router.failure_mode == config::on_failure::fail_open || v.router_fallback) {
    spdlog::debug("router failure {} for app {}: failing open", to_string(*failure), v.name);
  } else {
    co_return co_await answer(*failure);
  }
  co_return step::next;
}

app_state* exchange::app_now(bool same_pool) {
  if (w_.snapshot_ptr() == snap_) return &w_.app(where_.app);
  const auto& v = view();
  if (const auto* cur = w_.snap())
    for (std::size_t i = 0; i < cur->apps.size(); ++i)
      if (cur->apps[i].name == v.name && (!same_pool || cur->apps[i].pool_signature == v.pool_signature))
        return &w_.app(i);
  return nullptr;
}

std::string_view exchange::session_value() const {
  // The connection header, or its -/_ variant (ray-serve-ingress.md §2.1).
  const std::string& name = cfg().router.session_header;
  if (name.empty()) return {};
  const auto& req = c_.parser_->get();
  auto it = req.find(name);
  if (it == req.end()) {
    boost::container::small_vector<char, 64> alt(name.begin(), name.end());  // no allocation for usual names
    for (auto& ch : alt) ch = ch == '-' ? '_' : ch == '_' ? '-' : ch;
    it = req.find(std::string_view(alt.data(), alt.size()));
  }
  if (it == req.end() || !http::valid_field_value(it->value())) return {};
  return it->value();
}

awaitable<exchange::decision> exchange::ask_routers(std::string_view body,
                                                    std::optional<std::uint64_t> truncated_total) {
  struct latency_mark {  // the whole decision, failovers included (ingressd_router_latency_seconds)
    request_scratch& rq;
    clock::time_point t0 = clock::now();
    ~latency_mark() { rq.rec.router_latency = clock::now() - t0; }
  } latency{rq_};
  const auto& pool = view().router_pool;
  const auto& rc = cfg().router;
  // The cursor lives in the worker's app table, which follows the worker's current snapshot. If
  // the topology changed while the body prefix was read, use the app's cursor there only when
  // its pool is the same.
  std::size_t start = 0;
  if (auto* st = app_now(true)) start = st->router_cursor.take(pool.size());
  routing::router_request_parts parts{{}, body, truncated_total, rc.session_header, session_value(), request_id_};
  const auto now = clock::now();
  boost::container::small_vector<routing::router_memory::state, 8> states(pool.size());
  for (std::size_t r = 0; r < pool.size(); ++r) states[r] = w_.routers().get(pool[r].key, now);
  const auto order = routing::router_attempt_order(states, start);
  const bool may_hedge =
      pool.size() > 1 && rc.hedge_budget_permille > 0 && (rc.hedge_auto || rc.hedge_after.count() > 0);
  if (may_hedge) w_.hedge_budget().call(now);

  const topology::endpoint* consulted = nullptr;
  for (std::size_t k = 0; k < order.size(); ++k) {
    const std::size_t r = order[k];
    if (race_.launched() && r == race_.router()) continue;  // the hedge asked it already
    consulted = &pool[r];
    const auto timeout = prepare_attempt(r, parts, rq_.router_request, failed_recently(states[r]));
    const auto attempt_start = clock::now();
    // A decision hedges at most once: to the router it would fail over to next.
    auto hedge_at = clock::time_point::max();
    if (may_hedge && k + 1 < order.size())
      hedge_at = plan_hedge(order[k + 1], failed_recently(states[order[k + 1]]), parts, attempt_start);
    auto ex = co_await router_attempt(pool[r], rq_.router_request, timeout, 0, hedge_at);
    const auto took = clock::now() - attempt_start;
    race_.unplan();
    routing::router_reply reply;
    if (ex.replied) {
      reply = routing::parse_router_reply(ex.status, ex.body);
      if (race_.replied(race_call::first, reply.what == routing::router_reply::kind::pinned)) cancel_call(1);
    }
    if (race_.first_ended()) {
      co_await hedge_ended();
      account(race_.router(), hedge_.result, hedge_.took);
    }
    account(r, ex, took);
    if (c_.aborted_) co_return decision{{}, reason::router_unreachable};
    switch (race_.decide(ex.replied, hedge_.result.replied)) {
      case routing::hedge_race::taken::hedge:
        c_.note_hedge(metrics::hedge_result::won);
        [[fallthrough]];
      case routing::hedge_race::taken::hedge_failure:
        co_return reply_decision(*hedge_.ep, std::move(hedge_.reply), true);
      case routing::hedge_race::taken::first:
        co_return reply_decision(pool[r], std::move(reply), race_.launched());
      case routing::hedge_race::taken::next_router:
        break;
    }
  }
  if (consulted) c_.note_router_used(*consulted, race_.launched());
  co_return decision{{}, reason::router_unreachable};
}

exchange::decision exchange::reply_decision(const topology::endpoint& ep, routing::router_reply reply, bool hedged) {
  c_.note_router_used(ep, hedged);
  std::optional<reason> why;
  switch (reply.what) {
    case routing::router_reply::kind::pinned: break;
    case routing::router_reply::kind::non_200: why = reason::router_non_200; break;
    case routing::router_reply::kind::unparseable: why = reason::unparseable_replica_id; break;
  }
  return {std::move(reply), why};
}

exchange::clock::duration exchange::prepare_attempt(std::size_t r, routing::router_request_parts& parts,
                                                    std::string& request, bool probe) {
  const auto& ep = view().router_pool[r];
  clock::duration timeout = cfg().router.timeout;
  if (probe) {
    timeout = std::min<clock::duration>(timeout, router_probe_timeout);
    w_.routers().probing(ep.key, clock::now());
  }
  parts.host = ep.key;
  routing::build_router_request(parts, request);
  return timeout;
}

exchange::clock::time_point exchange::plan_hedge(std::size_t h, bool probe, const routing::router_request_parts& parts,
                                                 clock::time_point attempt_start) {
  if (!race_.may_plan()) return clock::time_point::max();
  auto* st = app_now(true);
  const auto delay = st ? w_.hedge_after(*st, h) : std::nullopt;
  if (!delay) return clock::time_point::max();
  race_.plan(h);
  hedge_.ep = &view().router_pool[h];
  hedge_.probe = probe;
  hedge_.request = parts;
  return attempt_start + *delay;
}

void exchange::account(std::size_t r, const router_exchange& ex, clock::duration took) {
  const auto& ep = view().router_pool[r];
  c_.note_router_attempt(r, ep, ex.replied ? std::optional<unsigned>(ex.status) : std::nullopt, ex.lost, took);
  auto& memory = w_.routers();
  if (ex.replied) {
    memory.replied(ep.key);
    // A call that replied teaches the hedge delay its router's latency.
    if (cfg().router.hedge_auto)
      if (auto* st = app_now(true)) {
        auto& est = st->router_latency[r];
        const auto before = est.delay();
        est.record(took);
        if (est.delay() != before) w_.publish_hedge(*st, r);
      }
  } else if (ex.lost) {
    memory.lost(ep.key, clock::now());
  } else if (!c_.aborted_) {
    memory.failed(ep.key, clock::now());
    spdlog::debug("router {} gave no reply{}", ep.key, ex.timed_out ? " (timeout)" : "");
  }
}

void exchange::launch_hedge() {
  if (c_.aborted_) return;
  switch (race_.due(w_.hedge_budget(), clock::now())) {
    case routing::hedge_race::launch::none:
      return;
    case routing::hedge_race::launch::refused:
      c_.note_hedge(metrics::hedge_result::refused);
      return;
    case routing::hedge_race::launch::send:
      break;
  }
  rq_.rec.hedged = true;
  c_.note_hedge(metrics::hedge_result::sent);
  // The completion keeps the connection (and so this exchange's frame) alive until the call ends.
  asio::co_spawn(w_.ioc(), hedge_call(), [self = c_.shared_from_this()](std::exception_ptr) {});
}

awaitable<void> exchange::hedge_call() {
  // ask_routers waits for hedge_.done before the exchange goes: see hedge_ended(). (Not marked
  // from a destructor: at shutdown the io_context destroys both frames in any order.)
  if (!race_.settled() && !c_.aborted_) {
    const auto timeout = prepare_attempt(race_.router(), hedge_.request, rq_.hedge_request, hedge_.probe);
    const auto t0 = clock::now();
    hedge_.result = co_await router_attempt(*hedge_.ep, rq_.hedge_request, timeout, 1);
    hedge_.took = clock::now() - t0;
    if (hedge_.result.replied) {
      hedge_.reply = routing::parse_router_reply(hedge_.result.status, hedge_.result.body);
      if (race_.replied(race_call::hedge, hedge_.reply.what == routing::router_reply::kind::pinned)) cancel_call(0);
    }
  } else {
    hedge_.result.lost = true;
  }
  hedge_.done = true;
  rq_.hedge_done.cancel();
}

awaitable<void> exchange::hedge_ended() {
  while (!hedge_.done) {
    rq_.hedge_done.expires_at(clock::time_point::max());
    auto [ec] = co_await rq_.hedge_done.async_wait(nothrow);
    // This wait itself was cancelled (the request is going away): end the hedge now too.
    if (ec && !hedge_.done) cancel_call(1);
  }
}

void exchange::cancel_call(std::size_t slot) {
  if (auto* call = calls_[slot].call) {
    call->lost = true;
    call->lease.cancel();
  }
}

void exchange::arm_router_timer(std::size_t slot) {
  const auto& c = calls_[slot];
  auto& t = rq_.router_timers[slot];
  t.expires_at(std::min(c.call->deadline, c.call->hedge_at));
  t.async_wait([self = c_.shared_from_this(), slot, gen = c.gen](error_code ec) {
    if (!ec && self->ex_) self->ex_->on_router_timer(slot, gen);
  });
}

void exchange::on_router_timer(std::size_t slot, unsigned gen) {
  auto& c = calls_[slot];
  if (!c.call || c.gen != gen) return;  // that call has ended
  auto& call = *c.call;
  if (call.hedge_at != clock::time_point::max()) {
    call.hedge_at = clock::time_point::max();
    if (clock::now() < call.deadline) {
      // A reply that has arrived and only waits for this worker to read it (a busy event loop,
      // not a late router) would not come sooner from another router.
      error_code ec;
      const bool reply_waiting = call.lease && call.lease->sock.is_open() && call.lease->sock.available(ec) > 0;
      if (!reply_waiting) launch_hedge();
      arm_router_timer(slot);
      return;
    }
  }
  call.timed_out = true;
  call.lease.cancel();
}

awaitable<exchange::router_exchange> exchange::router_attempt(const topology::endpoint& ep,
                                                             const std::string& request,
                                                             clock::duration timeout, std::size_t slot,
                                                             clock::time_point hedge_at) {
  router_call call;
  call.deadline = clock::now() + timeout;
  if (hedge_at < call.deadline) call.hedge_at = hedge_at;
  registration<router_call> in_progress(calls_[slot].call, call);
  calls_[slot].gen = ++c_.router_gen_;
  arm_router_timer(slot);
  struct timer_stop {
    request_scratch& rq;
    std::size_t slot;
    ~timer_stop() { rq.router_timers[slot].cancel(); }
  } stop_timer{rq_, slot};
  auto failed = [&call] { return router_exchange{false, call.timed_out, call.lost, 0, {}}; };

  // Router calls are re-sent on a fresh connection when a pooled one turns out stale (below),
  // so the pool skips its liveness peek: one system call less per request.
  upstream::acquire_policy policy{upstream::acquire_policy::staleness::caller_retries, false, upstream::router_pool_scale};
  for (;; policy.fresh = true) {
    call.lease = w_.pool().acquire(ep.key, policy);
    if (!call.lease) {
      const error_code ec = co_await call.lease.connect(ep.dial, w_.ioc().get_executor());
      if (ec || call.timed_out || call.lost || c_.aborted_) co_return failed();
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
      if (call.timed_out || call.lost || c_.aborted_) ec = asio::error::operation_aborted;
      else if (!parse_now(call.lease->sock, call.lease->buf, in.max_size(), rp, true, ec))
        std::tie(ec, std::ignore) = co_await bhttp::async_read(call.lease->sock, in, rp, nothrow);
    }
    if (ec) {
      const bool stale = call.lease.reused() && !rp.got_some() && !call.timed_out && !call.lost && !c_.aborted_;
      call.lease.close();
      // A pooled connection the router had closed fails before any reply byte: that is
      // staleness, not a router failure; try once more on a fresh connection.
      if (stale && !policy.fresh) continue;
      co_return failed();
    }
    call.lease.release(rp.keep_alive());
    co_return router_exchange{true, false, false, rp.status(), std::move(rp.body())};
  }
}

}  // namespace ingressd::server
