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

bool failed_recently(routing::router_memory::state s) {
  return s == routing::router_memory::state::probe || s == routing::router_memory::state::down;
}

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
  if (!failure && reply.skipped_headers > 0) {
    w_.stats().router_headers_skipped.add(reply.skipped_headers);
    spdlog::debug("router reply for {}: {} request_headers value(s) not a string, left out", view.name,
                  reply.skipped_headers);
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

app_state* session::app_now(const request_state& rs, bool same_pool) {
  const auto& view = rs.snap->apps[rs.where.app];
  if (w_.snapshot_ptr() == rs.snap) return &w_.app(rs.where.app);
  if (const auto* cur = w_.snap())
    for (std::size_t i = 0; i < cur->apps.size(); ++i)
      if (cur->apps[i].name == view.name && (!same_pool || cur->apps[i].pool_signature == view.pool_signature))
        return &w_.app(i);
  return nullptr;
}

awaitable<std::pair<routing::router_reply, std::optional<reason>>> session::ask_routers(
    const request_state& rs, std::string_view body, std::optional<std::uint64_t> truncated_total) {
  using result = std::pair<routing::router_reply, std::optional<reason>>;
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
  const auto& rc = cfg.router;
  const bool may_hedge = n > 1 && rc.hedge_budget_permille > 0 && (rc.hedge_auto || rc.hedge_after.count() > 0);
  if (auto* st = app_now(rs, true)) start = st->router_cursor.take(n);

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
  routing::router_request_parts parts{{}, body, truncated_total, cfg.router.session_header, session_value, rs.request_id};

  auto& memory = w_.routers();
  const auto now = clock::now();
  boost::container::small_vector<routing::router_memory::state, 8> states(n);
  for (std::size_t r = 0; r < n; ++r) states[r] = memory.get(pool[r].key, now);
  const auto order = routing::router_attempt_order(states, start);
  if (may_hedge) w_.hedge_budget().call(now);
  hedge_race race;
  registration<hedge_race> racing(rq_->race, race);
  bool race_over = false;  // the hedge's outcome has been taken into account
  const topology::endpoint* consulted = nullptr;

  // A call that replied teaches the hedge delay its router's latency.
  auto learn = [&](std::size_t r, const router_exchange& ex, clock::duration took) {
    if (!ex.replied || !rc.hedge_auto) return;
    if (auto* st = app_now(rs, true)) {
      auto& est = st->router_latency[r];
      const auto before = est.delay();
      est.record(took);
      if (est.delay() != before) w_.publish_hedge(*st, r);
    }
  };
  // What one call's end says about its router (dead-router memory, metrics).
  auto account = [&](std::size_t r, const router_exchange& ex, clock::duration took) {
    note_router_attempt(r, pool[r], ex, took);
    learn(r, ex, took);
    if (ex.replied) memory.replied(pool[r].key);
    else if (ex.lost) memory.lost(pool[r].key, clock::now());
    else if (!aborted_) {
      memory.failed(pool[r].key, clock::now());
      spdlog::debug("router {} gave no reply{}", pool[r].key, ex.timed_out ? " (timeout)" : "");
    }
  };

  for (std::size_t k = 0; k < order.size(); ++k) {
    const std::size_t r = order[k];
    if (race.launched && r == race.pool_index) continue;  // the hedge asked it already
    const auto& ep = pool[r];
    consulted = &ep;
    clock::duration timeout = cfg.router.timeout;
    if (failed_recently(states[r])) {
      timeout = std::min<clock::duration>(timeout, router_probe_timeout);
      memory.probing(ep.key, now);
    }
    parts.host = ep.key;
    routing::build_router_request(parts, rq_->router_request);
    const auto attempt_start = clock::now();
    auto hedge_at = clock::time_point::max();
    if (may_hedge && !race.launched && !race.refused && k + 1 < order.size()) {
      // A decision hedges at most once: to the router it would fail over to next.
      const std::size_t h = order[k + 1];
      if (auto* st = app_now(rs, true))
        if (const auto delay = w_.hedge_after(*st, h)) {
          race.ep = &pool[h];
          race.pool_index = h;
          race.probe = failed_recently(states[h]);
          race.request = parts;
          race.request.host = race.ep->key;
          hedge_at = attempt_start + *delay;
        }
    }
    auto ex = co_await router_attempt(ep, rq_->router_request, timeout, 0, hedge_at);
    const auto took = clock::now() - attempt_start;
    routing::router_reply reply;
    if (ex.replied && !race.won) reply = routing::parse_router_reply(ex.status, ex.body);
    const bool pinned = ex.replied && !race.won && reply.what == routing::router_reply::kind::pinned;
    if (race.launched && !race_over) {
      race_over = true;
      if (pinned) {
        // This call's reply is taken: the hedge is not wanted any more.
        race.settled = true;
        if (auto* other = rq_->calls[1].call) {
          other->lost = true;
          other->lease.cancel();
        }
      }
      co_await hedge_ended(race);
      account(race.pool_index, race.result, race.took);
    }
    account(r, ex, took);
    if (aborted_) co_return result{routing::router_reply{}, reason::router_unreachable};
    if (race.won) {
      note_router_used(*race.ep, true);
      note_hedge(metrics::hedge_result::won);
      co_return result{std::move(race.reply), std::nullopt};
    }
    note_router_used(ep, race.launched);
    if (ex.replied) {
      switch (reply.what) {
        case routing::router_reply::kind::pinned:
          co_return result{std::move(reply), std::nullopt};
        case routing::router_reply::kind::non_200:
          co_return result{std::move(reply), reason::router_non_200};
        case routing::router_reply::kind::unparseable:
          co_return result{std::move(reply), reason::unparseable_replica_id};
      }
    }
    if (race.launched && race.result.replied) {
      // This call gave no reply and the hedge's was not usable: its reason stands.
      note_router_used(*race.ep, true);
      auto hedge_reply = routing::parse_router_reply(race.result.status, race.result.body);
      const auto why = hedge_reply.what == routing::router_reply::kind::non_200 ? reason::router_non_200
                                                                                 : reason::unparseable_replica_id;
      co_return result{std::move(hedge_reply), why};
    }
  }
  if (consulted) note_router_used(*consulted, race.launched);
  co_return result{routing::router_reply{}, reason::router_unreachable};
}

void session::launch_hedge() {
  auto* race = rq_->race;
  if (!race || race->launched || race->refused || race->settled || aborted_) return;
  if (!w_.hedge_budget().try_hedge(clock::now())) {
    race->refused = true;
    note_hedge(metrics::hedge_result::refused);
    return;
  }
  race->launched = true;
  rq_->rec.hedged = true;
  note_hedge(metrics::hedge_result::sent);
  routing::build_router_request(race->request, rq_->hedge_request);
  asio::co_spawn(w_.ioc(), hedge_call(shared_from_this(), *race), [](std::exception_ptr) {});
}

awaitable<void> session::hedge_call(std::shared_ptr<session> self, hedge_race& race) {
  // ask_routers waits for race.done before its frame (and `race`) goes: see hedge_ended(). (Not
  // marked from a destructor: at shutdown the io_context destroys both frames in any order.)
  if (!race.settled && !self->aborted_) {
    clock::duration timeout = cfg().router.timeout;
    if (race.probe) {
      timeout = std::min<clock::duration>(timeout, router_probe_timeout);
      w_.routers().probing(race.ep->key, clock::now());
    }
    const auto t0 = clock::now();
    race.result = co_await router_attempt(*race.ep, rq_->hedge_request, timeout, 1);
    race.took = clock::now() - t0;
    if (race.result.replied && !race.settled) {
      race.reply = routing::parse_router_reply(race.result.status, race.result.body);
      if (race.reply.what == routing::router_reply::kind::pinned) {
        // The first usable reply: the hedge wins, the call ask_routers awaits is cancelled.
        race.settled = race.won = true;
        if (auto* other = rq_->calls[0].call) {
          other->lost = true;
          other->lease.cancel();
        }
      }
    }
  } else {
    race.result.lost = true;
  }
  race.done = true;
  rq_->hedge_done.cancel();
}

awaitable<void> session::hedge_ended(hedge_race& race) {
  while (!race.done) {
    rq_->hedge_done.expires_at(clock::time_point::max());
    auto [ec] = co_await rq_->hedge_done.async_wait(nothrow);
    if (ec && !race.done)
      if (auto* hedge = rq_->calls[1].call) {
        // This wait itself was cancelled (the request is going away): end the hedge now too.
        hedge->lost = true;
        hedge->lease.cancel();
      }
  }
}

void session::arm_router_timer(std::size_t slot) {
  const auto& c = rq_->calls[slot];
  auto& t = rq_->router_timers[slot];
  t.expires_at(std::min(c.call->deadline, c.call->hedge_at));
  t.async_wait([self = shared_from_this(), slot, gen = c.gen](error_code ec) {
    if (!ec) self->on_router_timer(slot, gen);
  });
}

void session::on_router_timer(std::size_t slot, unsigned gen) {
  if (!rq_) return;
  auto& c = rq_->calls[slot];
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

awaitable<session::router_exchange> session::router_attempt(const topology::endpoint& ep,
                                                             const std::string& request,
                                                             clock::duration timeout, std::size_t slot,
                                                             clock::time_point hedge_at) {
  router_call call;
  call.deadline = clock::now() + timeout;
  if (hedge_at < call.deadline) call.hedge_at = hedge_at;
  registration<router_call> in_progress(rq_->calls[slot].call, call);
  rq_->calls[slot].gen = ++router_gen_;
  arm_router_timer(slot);
  struct timer_stop {
    session& s;
    std::size_t slot;
    ~timer_stop() { s.rq_->router_timers[slot].cancel(); }
  } stop_timer{*this, slot};
  auto failed = [&call] { return router_exchange{false, call.timed_out, call.lost, 0, {}}; };

  // Router calls are re-sent on a fresh connection when a pooled one turns out stale (below),
  // so the pool skips its liveness peek: one system call less per request.
  upstream::acquire_policy policy{upstream::acquire_policy::staleness::caller_retries, false, upstream::router_pool_scale};
  for (;; policy.fresh = true) {
    call.lease = w_.pool().acquire(ep.key, policy);
    if (!call.lease) {
      const error_code ec = co_await call.lease.connect(ep.dial, w_.ioc().get_executor());
      if (ec || call.timed_out || call.lost || aborted_) co_return failed();
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
      if (call.timed_out || call.lost || aborted_) ec = asio::error::operation_aborted;
      else if (!parse_now(call.lease->sock, call.lease->buf, in.max_size(), rp, true, ec))
        std::tie(ec, std::ignore) = co_await bhttp::async_read(call.lease->sock, in, rp, nothrow);
    }
    if (ec) {
      const bool stale = call.lease.reused() && !rp.got_some() && !call.timed_out && !call.lost && !aborted_;
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
