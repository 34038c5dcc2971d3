// A proxied request: its stages in order (run), and those after its route is decided: choose and
// connect the upstream, send the request, read the response head, relay the response (contract
// §4.3, §4.4). See exchange.hpp.
#include <cstring>
#include <functional>

#include <boost/beast/http/read.hpp>
#include <boost/container/small_vector.hpp>
#include <spdlog/spdlog.h>

#include "ingressd/core/scope.hpp"
#include "ingressd/core/socket_io.hpp"
#include "ingressd/http/parse_now.hpp"
#include "ingressd/http/forwarded.hpp"
#include "ingressd/http/message.hpp"
#include "ingressd/routing/chooser.hpp"
#include "proxy/http1/exchange.hpp"
#include "proxy/http1/parts.hpp"

namespace ingressd::server {

using http::iequals;

exchange::exchange(connection& c, std::size_t app_index, std::string target)
    : c_(c), w_(c.w_), rq_(*c.rq_), target_(std::move(target)), request_id_(rq_.request_id) {
  const auto& req = c_.parser_->get();
  client_version_ = req.version();
  head_only_ = req.method() == bhttp::verb::head;
  has_body_ = !c_.parser_->is_done();
  chunked_in_ = c_.parser_->chunked();
  close_ = !c_.parser_->keep_alive() || c_.close_after_;
  // A WebSocket handshake (issue #32) asks for a tunnel; one with a body is served as a plain GET.
  // (Beast's upgrade() flag first: the fields are scanned only for a request that asks to upgrade.)
  upgrade_ = !has_body_ && c_.parser_->upgrade() && http::websocket_upgrade(req, req.method(), req.version());
  snap_ = w_.snapshot_ptr();
  where_.app = app_index;
  rq_.prebody.clear();
  rq_.rec.block = w_.app(app_index).metrics;
  // The watchdog, the client watch and abort() cancel what the exchange is doing.
  c_.ex_ = this;
}

exchange::~exchange() {
  c_.end_watch(result_ == outcome::keep_alive);
  c_.ex_ = nullptr;
}

void exchange::cancel_all() {
  lease_.cancel();
  for (auto& slot : calls_)
    if (slot.call) slot.call->lease.cancel();
}

awaitable<exchange::outcome> exchange::run() {
  const auto& req = c_.parser_->get();
  // Expect: only 100-continue is known (RFC 9110 §10.1.1); ingressd answers it itself.
  if (auto it = req.find(bhttp::field::expect); it != req.end() && client_version_ == 11) {
    if (!iequals(it->value(), "100-continue")) {
      result_ = co_await c_.respond(http::make_response(417, "text/plain", "Expectation Failed", true), true);
      co_return result_;
    }
    expect_continue_ = has_body_;
  }
  if (upgrade_ && w_.shared().tunnels.load(std::memory_order_relaxed) >= cfg().client.max_tunnels) {
    co_await answer(reason::tunnel_limit, "client.max_tunnels WebSocket tunnels are open");
    co_return result_;
  }

  if (router_decides()) {
    // The client watch (read_response_head) starts before the router call when the whole body is
    // buffered, so that no body read on the client meets the watch's reads: a client that leaves
    // during the call is seen.
    if (!c_.tls_ && !expect_continue_ && c_.body_buffered()) c_.start_watch();
    if (co_await decide_route() == step::done) co_return result_;
    if (c_.client_gone_) co_return result_;  // (close) left during the router call: ask no replica
  }
  for (;;) {  // step::again: choose, connect and send once more
    switch (pick_upstream()) {
      case pick::pooled:
        break;
      case pick::none:
        // Say why there is no healthy replica, so that a user of a hand-written topology sees
        // "health check: HTTP 404 on /-/healthz" instead of guessing (an error path: the
        // daemon's lock is fine here).
        {
          // (A named string: GCC 12 destroys a temporary of a conditional inside co_await twice.)
          std::string why;
          if (no_upstream_ == reason::no_healthy_replica) why = down_replicas_text(view());
          co_await answer(no_upstream_, why);
        }
        co_return result_;
      case pick::connect:
        if (const step s = co_await connect_upstream(); s != step::next) {
          if (s == step::again) continue;  // refused: another upstream
          co_return result_;
        }
    }
    load_.set(ep_->state);
    c_.note_replica(*ep_, connect_failures_);
    if (const step s = co_await send_request(); s != step::next) {
      if (s == step::again) continue;
      co_return result_;
    }
    if (const step s = co_await read_response_head(); s != step::next) {
      if (s == step::again) continue;
      co_return result_;
    }
    if (tunnel_) co_await tunnel();
    else co_await relay_response();
    co_return result_;
  }
}

exchange::step exchange::finish(outcome o) {
  result_ = o;
  return step::done;
}

awaitable<exchange::step> exchange::answer(reason r, std::string_view detail) {
  result_ = co_await c_.respond_reason(r, close_ || !c_.parser_->is_done(), {}, detail);
  co_return step::done;
}

awaitable<exchange::step> exchange::upstream_failed(reason r) {
  lease_.reset();
  co_return co_await answer(r);
}

std::string exchange::down_replicas_text(const topology::app_view& v) const {
  const auto& cause_of = w_.shared().down_cause;
  auto describe = [&](std::string& out, std::string_view what, const topology::endpoint& ep) {
    out.append(what).append(" ").append(ep.name.empty() ? ep.key : ep.name).append(" is down");
    if (const auto cause = cause_of ? cause_of(ep.key) : std::string(); !cause.empty()) out.append(": ").append(cause);
  };
  std::string out;
  std::size_t down = 0;
  if (v.replicas.empty()) out = "the app has no running replica";
  for (const auto& r : v.replicas)
    if (!r.state->up.load(std::memory_order_relaxed) && ++down == 1) describe(out, "replica", r);
  if (down > 1) out.append(" (and ").append(std::to_string(down - 1)).append(" more)");
  if (v.fallback && v.fallback->state && !v.fallback->state->up.load(std::memory_order_relaxed)) {
    if (!out.empty()) out.append("; ");
    describe(out, "fallback", *v.fallback);
  }
  return out;
}

void exchange::note_upstream_error(const topology::endpoint& ep, std::string_view what) {
  w_.note_upstream_error(ep, what, cfg().health.error_limit);
}

void exchange::note_upstream_ok(const topology::endpoint& ep) {
  if (ep.state->errors.load(std::memory_order_relaxed) != 0) ep.state->errors.store(0, std::memory_order_relaxed);
}

exchange::pick exchange::pick_upstream() {
  if (w_.snapshot_ptr() != snap_) {
    // The topology changed while we were waiting: route again in the new one.
    auto next = w_.snapshot_ptr();
    const auto moved = topology::remap(*snap_, where_, *next);
    if (!moved) {
      no_upstream_ = reason::no_healthy_replica;
      return pick::none;
    }
    snap_ = std::move(next);
    where_ = *moved;
  }
  const auto& v = snap_->apps[where_.app];
  boost::container::small_vector<routing::candidate, 16> replicas(v.replicas.size());
  for (std::size_t i = 0; i < replicas.size(); ++i) {
    const auto& r = v.replicas[i];
    replicas[i] = {r.state->up.load(std::memory_order_relaxed), r.state->in_flight.load(std::memory_order_relaxed),
                   !tried_.empty() && std::find(tried_.begin(), tried_.end(), r.key) != tried_.end()};
  }
  const auto* fallback = usable_fallback(v);
  const auto choice = routing::choose_upstream(
      replicas, {where_.pinned, prefer_fallback_, fallback != nullptr, !tried_.empty(), w_.app(where_.app).lb_rotor++});
  if (choice.what == routing::choice::kind::none) {
    no_upstream_ = tried_.empty() ? reason::no_healthy_replica : reason::upstream_error;
    return pick::none;
  }
  observed_ = choice.what == routing::choice::kind::replica;
  ep_ = observed_ ? &v.replicas[choice.index] : fallback;
  using staleness = upstream::acquire_policy::staleness;
  lease_ = w_.pool().acquire(ep_->key, {resend_ok_ ? staleness::caller_retries : staleness::peek, resent_, 1});
  return lease_ ? pick::pooled : pick::connect;
}

awaitable<exchange::step> exchange::connect_upstream() {
  const auto& cfg = this->cfg();
  c_.arm(cfg.upstream.connect_timeout, phase::connect);
  const error_code ec = co_await lease_.connect(ep_->dial, w_.ioc().get_executor());
  if (c_.aborted_) co_return finish(outcome::close);
  if (!ec) co_return step::next;
  if (observed_) note_upstream_error(*ep_, c_.timed_out(phase::connect) ? "connect timed out" : ec.message());
  tried_.push_back(ep_->key);
  if (++connect_failures_ > cfg.upstream.retries) co_return co_await answer(reason::upstream_error);
  co_return step::again;
}

void exchange::send_again() {
  // The pooled connection the request went out on had been closed by the replica before any
  // response byte: once more, on a fresh connection, as a new choice.
  lease_.reset();
  resent_ = true;
  tried_.clear();
  connect_failures_ = 0;
}

void exchange::build_request_head() {
  const auto& req = c_.parser_->get();
  // One allocation for the request's heads instead of one per doubling (the buffer is released
  // when the connection goes idle).
  auto& head = rq_.request_head;
  head.clear();
  head.reserve(1024);
  head.append(req.method_string()).push_back(' ');
  head.append(target_).append(" HTTP/1.1\r\n");
  http::hop_filter hop(req);
  bool have_host = false;
  // client.trusted_proxies: a trusted peer's forwarding chain and scheme are kept (http/forwarded.hpp).
  const bool peer_trusted = c_.peer_trusted();
  std::string chain;
  std::string_view proto;
  for (const auto& f : req) {
    const auto name = f.name_string();
    if (hop.skip(f.name(), name)) continue;
    switch (f.name()) {
      case bhttp::field::expect:
      case bhttp::field::proxy_authorization:
        continue;
      case bhttp::field::host:
        have_host = true;
        break;
      default:
        if (http::proxy_owned_field(name)) {  // incl. x-serve-router-*: only a router sets those
          if (peer_trusted) c_.collect_forwarded(name, f.value(), chain, proto);
          continue;
        }
    }
    bool replaced = false;
    for (const auto& [hn, hv] : router_headers_) replaced = replaced || iequals(hn, name);
    if (!replaced) http::append_field(head, name, f.value());
  }
  if (!have_host) http::append_field(head, "Host", ep_->key);
  for (const auto& [hn, hv] : router_headers_) http::append_field(head, hn, hv);
  const std::string_view scheme = c_.tls_ ? "https" : "http";
  if (!peer_trusted) {
    http::append_field(head, "X-Forwarded-For", c_.peer_);
    http::append_field(head, "X-Forwarded-Proto", scheme);
  } else {
    const auto fwd = http::evaluate_forwarded(chain, proto, c_.peer_addr_, c_.peer_, cfg().client.trusted_proxies);
    if (fwd.malformed) c_.forwarded_chain_refused(chain);
    http::append_field(head, "X-Forwarded-For", fwd.xff);
    http::append_field(head, "X-Forwarded-Proto", fwd.proto.empty() ? scheme : fwd.proto);
  }
  http::append_field(head, "X-Request-Id", request_id_);
  if (has_body_)
    http::append_field(head, chunked_in_ ? "Transfer-Encoding" : "Content-Length",
                       chunked_in_ ? "chunked" : std::to_string(*c_.parser_->content_length()));
  else if (c_.parser_->content_length())
    http::append_field(head, "Content-Length", "0");
  if (upgrade_) {
    // The client's Upgrade and Connection are hop-by-hop: the replica gets ours, which ask for
    // the same thing (Sec-WebSocket-* went through above as end-to-end fields).
    http::append_field(head, "Connection", "Upgrade");
    http::append_field(head, "Upgrade", "websocket");
  }
  head.append("\r\n");
}

awaitable<exchange::step> exchange::send_request() {
  const auto& cfg = this->cfg();
  build_request_head();
  if (expect_continue_ && !(co_await c_.write_all(continue_100))) co_return finish(outcome::close);
  // The head goes with the first piece of the body: the bytes read while the router decided
  // (rq_.prebody) first, then piece by piece from the client, in our own framing.
  bool head_sent = false;
  bool pre = !rq_.prebody.empty();
  unsigned char* relay = nullptr;  // made only when body bytes must still be read from the client
  while (!head_sent || pre || !c_.parser_->is_done()) {
    http::framed_piece piece(chunked_in_);
    if (!head_sent) piece.head(rq_.request_head);
    if (pre) {
      piece.data(rq_.prebody.data(), rq_.prebody.size());
      pre = false;
    } else if (!c_.parser_->is_done()) {
      if (!relay) relay = c_.relay_buffer();
      auto& body = c_.parser_->get().body();
      body.data = relay;
      body.size = relay_size;
      c_.arm(cfg.client.body_timeout, phase::body);
      error_code ec;
      if (!c_.body_from_buffer(ec)) ec = co_await c_.read_body_some();
      if (ec && ec != bhttp::error::need_buffer) {
        lease_.reset();
        result_ = co_await c_.body_error(ec);
        co_return step::done;
      }
      piece.data(relay, relay_size - body.size);
    }
    if (has_body_ && !pre && c_.parser_->is_done()) piece.end();
    if (piece.empty()) continue;
    c_.arm(cfg.client.body_timeout, phase::body);
    auto pending = piece.buffers();
    error_code ec;
    if (!write_now(lease_->sock, pending, ec))
      std::tie(ec, std::ignore) = co_await asio::async_write(lease_->sock, pending, nothrow);
    if (ec) {
      if (c_.aborted_) co_return finish(outcome::close);
      if (resend_ok_ && !resent_ && lease_.reused()) {  // stale pooled connection
        send_again();
        co_return step::again;
      }
      if (observed_) note_upstream_error(*ep_, ec.message());
      co_return co_await upstream_failed(reason::upstream_error);
    }
    head_sent = true;
  }
  rq_.prebody.clear();
  sent_at_ = clock::now();
  co_return step::next;
}

awaitable<exchange::step> exchange::read_response_head() {
  const auto& cfg = this->cfg();
  if (!c_.watching()) c_.start_watch();  // else started before the router call
  // Interim 1xx responses are forwarded, then skipped (hardening F2). The parser writes the head
  // for the client into response_head once the status line arrives.
  for (bool first_head = true;; first_head = false) {
    auto& rp = rp_.emplace(rq_.response_head);
    rp.header_limit(upstream_header_limit);
    rp.body_limit(boost::none);
    if (head_only_) rp.skip(true);
    c_.arm(cfg.upstream.first_byte_timeout, phase::first_byte);
    co_await after_ready_handlers(w_.ioc());
    // The deadline, the client watch or abort() may have fired meanwhile, with no read pending
    // to cancel: end as that read would have.
    error_code ec;
    bool drained = false;
    if (c_.timed_out(phase::first_byte) || c_.client_gone_ || c_.aborted_) ec = asio::error::operation_aborted;
    else if (!parse_now(lease_->sock, lease_->buf, relay_size, rp, false, ec, &drained))
      std::tie(ec, std::ignore) = co_await bhttp::async_read_header(lease_->sock, lease_->buf, rp, nothrow);
    else
      up_empty_ = drained;
    if (ec) {
      if (c_.aborted_) co_return finish(outcome::close);
      if (c_.client_gone_) {
        lease_.reset();
        co_return finish(outcome::close);
      }
      const bool timeout = c_.timed_out(phase::first_byte);
      if (resend_ok_ && !resent_ && lease_.reused() && first_head && !rp.got_some() &&
          lease_->buf.size() == 0 && !timeout) {  // stale pooled connection: not one byte came back
        send_again();
        co_return step::again;
      }
      // No head within first_byte_timeout is a slow replica, not a broken connection.
      if (observed_ && !timeout) note_upstream_error(*ep_, ec.message());
      co_return co_await upstream_failed(timeout ? reason::upstream_timeout : reason::upstream_error);
    }
    if (observed_) note_upstream_ok(*ep_);
    const unsigned status = rp.status();
    // 101 turns the connection into a tunnel only when it answers a WebSocket handshake and
    // switches to websocket (RFC 6455 §4.2.2); any other 101 is a replica switching to what
    // nobody asked for. Framing Beast accepts but that cannot be re-framed faithfully (repeated
    // Content-Length, a coding other than chunked): 502, the upstream connection discarded (A15,
    // B6).
    if (status == 101 && upgrade_ && rp.upgrade_websocket()) {
      tunnel_ = true;
      break;
    }
    if (status == 101 || (status >= 200 && !rp.framing_error().empty()))
      co_return co_await upstream_failed(reason::upstream_error);
    if (status >= 200) break;
    if ((status == 100 && expect_continue_) || client_version_ != 11) continue;
    rq_.response_head.append("\r\n");  // the interim head as the parser wrote it
    if (!(co_await c_.write_all(rq_.response_head))) {
      lease_.reset();
      co_return finish(outcome::close);
    }
  }
  rq_.rec.block->first_byte.observe(clock::now() - sent_at_);
  finish_response_head();
  co_return step::next;
}

void exchange::finish_response_head() {
  const auto& rp = *rp_;
  if (tunnel_) {
    auto& head = rq_.response_head;
    http::append_field(head, "X-Request-Id", request_id_);
    http::append_field(head, "Connection", "Upgrade");
    http::append_field(head, "Upgrade", "websocket");
    head.append("\r\n");
    return;
  }
  const unsigned status = rp.status();
  const bool no_body = head_only_ || status == 204 || status == 304;
  const auto length = rp.content_length();
  chunked_out_ = !no_body && !length && client_version_ == 11;
  if (!no_body && status / 100 == 2 && rp.media_type() != http::relay_response_parser::media::other)
    meter_.emplace(rp.media_type() == http::relay_response_parser::media::event_stream ? http::llm_meter::body::event_stream
                                                                                     : http::llm_meter::body::json);
  if (!no_body && !length && client_version_ != 11) close_ = true;  // close-delimited for HTTP/1.0
  close_ = close_ || c_.close_after_;
  // response_head holds the status line and the end-to-end fields (relay_response_parser, which
  // leaves out the replica's X-Request-Id); the request's id and our framing follow.
  auto& head = rq_.response_head;
  http::append_field(head, "X-Request-Id", request_id_);
  if (length && (!no_body || head_only_))
    http::append_field(head, "Content-Length", std::to_string(*length));
  else if (chunked_out_)
    http::append_field(head, "Transfer-Encoding", "chunked");
  if (close_)
    http::append_field(head, "Connection", "close");
  else if (client_version_ == 10)
    http::append_field(head, "Connection", "keep-alive");
  head.append("\r\n");
}


awaitable<exchange::step> exchange::relay_response() {
  const auto& cfg = this->cfg();
  auto& rp = *rp_;
  stream_guard streaming(w_.stats().active_streams);
  // Body pieces pass through the worker's relay window (worker::relay_window): bytes already
  // buffered are parsed here (Beast's async_read_some would parse them too, then complete
  // through the scheduler queue, other streams running in between); a read that does I/O parses
  // in its completion, which resumes this coroutine directly.
  unsigned char* const window = w_.relay_window();
  // A replica sending an endless chunk-size line or trailer must not grow the buffer without
  // bound: Beast stops with buffer_overflow at the cap and the stream is aborted (hardening B).
  http::bounded_buffer up_in(lease_->buf, http::body_read_cap(upstream_header_limit));
  bool head_sent = false;
  error_code read_ec;
  while ((!head_sent || !rp.is_done()) && !read_ec) {
    // The watch may have seen the client leave while no upstream read was pending to cancel
    // (the head and the client's EOF arrived together): stop relaying now (hardening G1).
    if (c_.client_gone_) break;
    std::size_t got = 0;
    if (!rp.is_done()) {
      rp.body_window(window, relay_size);
      // All of what is buffered, not one framing step: one step sent a head that came with the
      // first event on its own, the event in a second send.
      if (lease_->buf.size() > 0) http::put_buffered(rp, lease_->buf, read_ec);
      if (read_ec == bhttp::error::need_buffer || read_ec == bhttp::error::need_more) read_ec = {};
      // Each piece goes out as soon as it is read; the head goes with the first piece when it is
      // already buffered, else on its own at once (TTFT).
      if (rp.body_left() == relay_size && !read_ec && head_sent && !rp.is_done()) {
        c_.arm(cfg.upstream.idle_timeout, phase::stream);
        // The next piece is read here (body_now). When the last read took all the socket held,
        // the coroutine waits for readability first instead of trying a recv that fails with
        // EAGAIN, as Beast's read starts: one system call less per relayed event of a token stream.
        for (;;) {
          const auto r = body_now(read_ec);
          if (r == piece_read::parsed || read_ec) break;
          if (r == piece_read::beast) {  // EOF, or a buffer full of one framing step
            std::tie(read_ec, std::ignore) = co_await bhttp::async_read_some(lease_->sock, up_in, rp, nothrow);
            if (read_ec == bhttp::error::need_buffer) read_ec = {};
            break;
          }
          auto [wec] = co_await lease_->sock.async_wait(tcp::socket::wait_read, nothrow);
          up_empty_ = false;
          if (wec) {
            read_ec = wec;
            break;
          }
        }
      }
      got = relay_size - rp.body_left();
      if (meter_ && got > 0) note_llm(window, got);
    }
    http::framed_piece piece(chunked_out_);
    if (!head_sent) piece.head(rq_.response_head);
    piece.data(window, got);
    if (!read_ec && chunked_out_ && rp.is_done()) piece.end();
    if (piece.empty()) continue;
    c_.arm(cfg.upstream.idle_timeout, phase::stream);
    auto pending = piece.buffers();
    error_code ec;
    if (!c_.client([&](auto& s) { return write_now(s, pending, ec); })) {
      move_out_of_window(pending, window, c_.relay_buffer(), relay_size);
      std::tie(ec, std::ignore) =
          co_await c_.client([&](auto& s) { return asio::async_write(s, pending, nothrow); });
    }
    if (ec) {
      // The client went away (or stalled past the idle timeout): close the upstream too.
      rq_.rec.term = c_.client_side_end();
      lease_.reset();
      connection::hard_close(c_.sock_);
      co_return finish(outcome::close);
    }
    if (!head_sent) rq_.rec.status = rp.status();
    rq_.rec.bytes += got;
    head_sent = true;
  }
  co_return end_relay(read_ec || c_.client_gone_ || c_.aborted_);
}

exchange::piece_read exchange::body_now(error_code& ec) {
  auto& c = lease_.conn();
  // Bytes of a framing step may wait in the buffer (a chunk's CRLF before the next chunk's
  // header): the read appends to them. A buffer that holds a whole relay window is Beast's
  // (its read stops an endless chunk-size line at the cap).
  if (c.buf.size() >= relay_size) return piece_read::beast;
  // Skipped when the last read took all the socket held: it would most likely fail with EAGAIN.
  if (up_empty_) return piece_read::wait;
  const auto n = fill_now(c.sock, c.buf, relay_size, ec, &up_empty_);
  if (n == 0) return piece_read::beast;  // EOF: Beast's read ends the body or reports it cut
  if (n < 0) return piece_read::wait;    // or `ec`
  http::put_buffered(*rp_, c.buf, ec);
  if (ec == bhttp::error::need_buffer || ec == bhttp::error::need_more) ec = {};
  return piece_read::parsed;
}

void exchange::note_llm(const unsigned char* p, std::size_t n) {
  const auto events = meter_->feed(p, n);
  if (events == 0) return;
  // One clock read per read that carried events, none per event.
  const auto now = clock::now();
  auto& rec = rq_.rec;
  if (!rec.ttft) {
    rec.ttft = now - rec.start;
    if (rec.block) rec.block->llm_ttft.observe(*rec.ttft);
  } else {
    const auto gap = now - last_event_at_;
    rec.max_gap = std::max(rec.max_gap, gap);
    if (rec.block) rec.block->llm_inter_event.observe(gap);
  }
  last_event_at_ = now;
  rec.events += events;
  if (rec.block) rec.block->llm_events.add(events);
}

exchange::step exchange::end_relay(bool broken) {
  c_.disarm();
  if (meter_ && meter_->usage()) {
    const auto& u = *meter_->usage();
    rq_.rec.usage = u;
    if (rq_.rec.block) {
      rq_.rec.block->llm_prompt_tokens.add(u.prompt);
      rq_.rec.block->llm_completion_tokens.add(u.completion);
    }
  }
  if (broken) {
    // Upstream died or hung mid-stream, or the client left: abort both sides (hardening G1, G3).
    rq_.rec.term = c_.aborted_ ? metrics::termination::shutdown
                  : c_.client_gone_ ? metrics::termination::client_abort
                  : c_.timed_out(phase::stream) ? metrics::termination::timeout
                  : metrics::termination::upstream_abort;
    lease_.reset();
    connection::hard_close(c_.sock_);
    return finish(outcome::close);
  }
  lease_.release(rp_->keep_alive());
  return finish(close_ ? outcome::close : outcome::keep_alive);
}

}  // namespace ingressd::server
