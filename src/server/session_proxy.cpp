// A proxied request after its route is decided: choose and connect the upstream, send the
// request, read the response head, relay the response (contract §4.3, §4.4). See session.hpp.
#include <cstring>
#include <functional>

#include <boost/beast/http/read.hpp>
#include <boost/container/small_vector.hpp>
#include <spdlog/spdlog.h>

#include "ingressd/core/scope.hpp"
#include "ingressd/core/socket_io.hpp"
#include "ingressd/http/forwarded.hpp"
#include "ingressd/http/message.hpp"
#include "ingressd/routing/chooser.hpp"
#include "server/session.hpp"
#include "server/session_parts.hpp"

namespace ingressd::server {

using http::iequals;

awaitable<session::outcome> session::proxy(std::size_t app_index, std::string target) {
  auto& req = parser_->get();
  request_state rs;
  rs.target = std::move(target);
  rs.request_id = rq_->request_id;
  rs.client_version = req.version();
  rs.head_only = req.method() == bhttp::verb::head;
  rs.has_body = !parser_->is_done();
  rs.chunked_in = parser_->chunked();
  rs.close = !parser_->keep_alive() || close_after_;
  rs.snap = w_.snapshot_ptr();
  rs.where.app = app_index;
  rq_->prebody.clear();
  rq_->rec.block = w_.app(app_index).metrics;
  // The watchdog, the client watch and abort() cancel what the request's upstream is doing.
  registration<upstream::lease> in_use(up_, rs.lease);

  // Expect: only 100-continue is known (RFC 9110 §10.1.1); ingressd answers it itself.
  if (auto it = req.find(bhttp::field::expect); it != req.end() && rs.client_version == 11) {
    if (!iequals(it->value(), "100-continue"))
      co_return co_await respond(http::make_response(417, "text/plain", "Expectation Failed", true), true);
    rs.expect_continue = rs.has_body;
  }

  if (router_decides(rs)) {
    // The client watch (read_response_head) starts before the router call when the whole body is
    // buffered, so that no body read on the client meets the watch's reads: a client that leaves
    // during the call is seen. serve() ends it if the request ends before read_response_head.
    if (!tls_ && !rs.expect_continue && body_buffered()) start_watch();
    if (co_await decide_route(rs) == step::done) co_return rs.result;
    if (client_gone_) co_return outcome::close;  // left during the router call: ask no replica
  }
  for (;;) {  // step::again: choose, connect and send once more
    switch (pick_upstream(rs)) {
      case pick::pooled:
        break;
      case pick::none:
        if (rs.no_upstream == reason::no_healthy_replica) {
          // Say why, so that a user of a hand-written topology sees "health check: HTTP 404 on
          // /-/healthz" instead of guessing (an error path: the daemon's lock is fine here).
          const std::string why = down_replicas_text(rs.snap->apps[rs.where.app]);
          rs.result = co_await respond_reason(rs.no_upstream, rs.close || !parser_->is_done(), {}, why);
          co_return rs.result;
        }
        co_await answer(rs, rs.no_upstream);
        co_return rs.result;
      case pick::connect:
        if (const step s = co_await connect_upstream(rs); s != step::next) {
          if (s == step::again) continue;  // refused: another upstream
          co_return rs.result;
        }
    }
    rs.load.set(rs.ep->state);
    note_replica(*rs.ep, rs.connect_failures);
    if (const step s = co_await send_request(rs); s != step::next) {
      if (s == step::again) continue;
      co_return rs.result;
    }
    if (const step s = co_await read_response_head(rs); s != step::next) {
      if (s == step::again) continue;
      co_return rs.result;
    }
    co_await relay_response(rs);
    co_return rs.result;
  }
}

session::step session::finish(request_state& rs, outcome o) {
  rs.result = o;
  return step::done;
}

awaitable<session::step> session::answer(request_state& rs, reason r) {
  rs.result = co_await respond_reason(r, rs.close || !parser_->is_done());
  co_return step::done;
}

awaitable<session::step> session::upstream_failed(request_state& rs, reason r) {
  rs.lease.reset();
  co_return co_await answer(rs, r);
}

std::string session::down_replicas_text(const topology::app_view& v) const {
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

session::pick session::pick_upstream(request_state& rs) {
  if (w_.snapshot_ptr() != rs.snap) {
    // The topology changed while we were waiting: route again in the new one.
    auto next = w_.snapshot_ptr();
    const auto moved = topology::remap(*rs.snap, rs.where, *next);
    if (!moved) {
      rs.no_upstream = reason::no_healthy_replica;
      return pick::none;
    }
    rs.snap = std::move(next);
    rs.where = *moved;
  }
  const auto& v = rs.snap->apps[rs.where.app];
  boost::container::small_vector<routing::candidate, 16> replicas(v.replicas.size());
  for (std::size_t i = 0; i < replicas.size(); ++i) {
    const auto& r = v.replicas[i];
    replicas[i] = {r.state->up.load(std::memory_order_relaxed), r.state->in_flight.load(std::memory_order_relaxed),
                   !rs.tried.empty() && std::find(rs.tried.begin(), rs.tried.end(), r.key) != rs.tried.end()};
  }
  const auto* fallback = usable_fallback(v);
  const auto choice = routing::choose_upstream(
      replicas, {rs.where.pinned, rs.prefer_fallback, fallback != nullptr, !rs.tried.empty(), w_.app(rs.where.app).lb_rotor++});
  if (choice.what == routing::choice::kind::none) {
    rs.no_upstream = rs.tried.empty() ? reason::no_healthy_replica : reason::upstream_error;
    return pick::none;
  }
  rs.observed = choice.what == routing::choice::kind::replica;
  rs.ep = rs.observed ? &v.replicas[choice.index] : fallback;
  using staleness = upstream::acquire_policy::staleness;
  rs.lease = w_.pool().acquire(rs.ep->key, {rs.resend_ok ? staleness::caller_retries : staleness::peek, rs.resent, 1});
  return rs.lease ? pick::pooled : pick::connect;
}

awaitable<session::step> session::connect_upstream(request_state& rs) {
  const auto& cfg = this->cfg();
  arm(cfg.upstream.connect_timeout, phase::connect);
  const error_code ec = co_await rs.lease.connect(rs.ep->dial, w_.ioc().get_executor());
  if (aborted_) co_return finish(rs, outcome::close);
  if (!ec) co_return step::next;
  if (rs.observed) note_upstream_error(*rs.ep, timed_out(phase::connect) ? "connect timed out" : ec.message());
  rs.tried.push_back(rs.ep->key);
  if (++rs.connect_failures > cfg.upstream.retries) co_return co_await answer(rs, reason::upstream_error);
  co_return step::again;
}

void session::send_again(request_state& rs) {
  // The pooled connection the request went out on had been closed by the replica before any
  // response byte: once more, on a fresh connection, as a new choice.
  rs.lease.reset();
  rs.resent = true;
  rs.tried.clear();
  rs.connect_failures = 0;
}

void session::collect_forwarded(std::string_view name, std::string_view value, std::string& chain,
                                std::string_view& proto) {
  if (iequals(name, "x-forwarded-for")) {
    // Several lines are one list (RFC 9110 §5.3).
    if (!chain.empty()) chain.push_back(',');
    chain.append(value);
  } else if (iequals(name, "x-forwarded-proto")) {
    proto = value;
  }
}

void session::forwarded_chain_refused(std::string_view chain) {
  w_.stats().forwarded_chain_errors.add();
  spdlog::warn("X-Forwarded-For from trusted proxy {} is not a list of addresses, ignored: {}", peer_,
               chain.substr(0, 256));
}

std::string session::client_ip() const {
  if (!cfg_) return peer_;
  const auto& trusted = cfg().client.trusted_proxies;
  if (trusted.empty() || !parser_ || !net::any_contains(trusted, peer_addr_)) return peer_;
  std::string chain;
  std::string_view proto;
  for (const auto& f : parser_->get()) collect_forwarded(f.name_string(), f.value(), chain, proto);
  return http::evaluate_forwarded(chain, proto, peer_addr_, peer_, trusted).client_ip;
}

void session::build_request_head(const request_state& rs) {
  const auto& req = parser_->get();
  // One allocation for the request's heads instead of one per doubling (the buffer is released
  // when the connection goes idle).
  auto& head = rq_->head;
  head.clear();
  head.reserve(1024);
  head.append(req.method_string()).push_back(' ');
  head.append(rs.target).append(" HTTP/1.1\r\n");
  http::hop_filter hop(req);
  bool have_host = false;
  // client.trusted_proxies: a trusted peer's forwarding chain and scheme are kept (http/forwarded.hpp).
  const auto& trusted = cfg().client.trusted_proxies;
  const bool peer_trusted = !trusted.empty() && net::any_contains(trusted, peer_addr_);
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
          if (peer_trusted) collect_forwarded(name, f.value(), chain, proto);
          continue;
        }
    }
    bool replaced = false;
    for (const auto& [hn, hv] : rs.router_headers) replaced = replaced || iequals(hn, name);
    if (!replaced) http::append_field(head, name, f.value());
  }
  if (!have_host) http::append_field(head, "Host", rs.ep->key);
  for (const auto& [hn, hv] : rs.router_headers) http::append_field(head, hn, hv);
  const std::string_view scheme = tls_ ? "https" : "http";
  if (!peer_trusted) {
    http::append_field(head, "X-Forwarded-For", peer_);
    http::append_field(head, "X-Forwarded-Proto", scheme);
  } else {
    const auto fwd = http::evaluate_forwarded(chain, proto, peer_addr_, peer_, trusted);
    if (fwd.malformed) forwarded_chain_refused(chain);
    http::append_field(head, "X-Forwarded-For", fwd.xff);
    http::append_field(head, "X-Forwarded-Proto", fwd.proto.empty() ? scheme : fwd.proto);
  }
  http::append_field(head, "X-Request-Id", rs.request_id);
  if (rs.has_body)
    http::append_field(head, rs.chunked_in ? "Transfer-Encoding" : "Content-Length",
                       rs.chunked_in ? "chunked" : std::to_string(*parser_->content_length()));
  else if (parser_->content_length())
    http::append_field(head, "Content-Length", "0");
  head.append("\r\n");
}

awaitable<session::step> session::send_request(request_state& rs) {
  const auto& cfg = this->cfg();
  build_request_head(rs);
  if (rs.expect_continue && !(co_await write_all(continue_100))) co_return finish(rs, outcome::close);
  // The head goes with the first piece of the body: the bytes read while the router decided
  // (rq_->prebody) first, then piece by piece from the client, in our own framing.
  bool head_sent = false;
  bool pre = !rq_->prebody.empty();
  unsigned char* relay = nullptr;  // made only when body bytes must still be read from the client
  while (!head_sent || pre || !parser_->is_done()) {
    http::framed_piece piece(rs.chunked_in);
    if (!head_sent) piece.head(rq_->head);
    if (pre) {
      piece.data(rq_->prebody.data(), rq_->prebody.size());
      pre = false;
    } else if (!parser_->is_done()) {
      if (!relay) relay = relay_buffer();
      auto& body = parser_->get().body();
      body.data = relay;
      body.size = relay_size;
      arm(cfg.client.body_timeout, phase::body);
      error_code ec;
      if (!body_from_buffer(ec)) ec = co_await read_body_some();
      if (ec && ec != bhttp::error::need_buffer) {
        rs.lease.reset();
        rs.result = co_await body_error(ec);
        co_return step::done;
      }
      piece.data(relay, relay_size - body.size);
    }
    if (rs.has_body && !pre && parser_->is_done()) piece.end();
    if (piece.empty()) continue;
    arm(cfg.client.body_timeout, phase::body);
    auto pending = piece.buffers();
    error_code ec;
    if (!write_now(rs.lease->sock, pending, ec))
      std::tie(ec, std::ignore) = co_await asio::async_write(rs.lease->sock, pending, nothrow);
    if (ec) {
      if (aborted_) co_return finish(rs, outcome::close);
      if (rs.resend_ok && !rs.resent && rs.lease.reused()) {  // stale pooled connection
        send_again(rs);
        co_return step::again;
      }
      if (rs.observed) note_upstream_error(*rs.ep, ec.message());
      co_return co_await upstream_failed(rs, reason::upstream_error);
    }
    head_sent = true;
  }
  rq_->prebody.clear();
  rs.sent_at = clock::now();
  co_return step::next;
}

awaitable<session::step> session::read_response_head(request_state& rs) {
  const auto& cfg = this->cfg();
  if (watch_ != watch::on) start_watch();  // else started before the router call
  // Interim 1xx responses are forwarded, then skipped (hardening F2). The parser writes the head
  // for the client into rq_->head once the status line arrives.
  for (bool first_head = true;; first_head = false) {
    auto& rp = rs.rp.emplace(rq_->head);
    rp.header_limit(upstream_header_limit);
    rp.body_limit(boost::none);
    if (rs.head_only) rp.skip(true);
    arm(cfg.upstream.first_byte_timeout, phase::first_byte);
    co_await after_ready_handlers(w_.ioc());
    // The deadline, the client watch or abort() may have fired meanwhile, with no read pending
    // to cancel: end as that read would have.
    error_code ec;
    bool drained = false;
    if (timed_out(phase::first_byte) || client_gone_ || aborted_) ec = asio::error::operation_aborted;
    else if (!parse_now(rs.lease->sock, rs.lease->buf, relay_size, rp, false, ec, &drained))
      std::tie(ec, std::ignore) = co_await bhttp::async_read_header(rs.lease->sock, rs.lease->buf, rp, nothrow);
    else
      rs.up_empty = drained;
    if (ec) {
      co_await stop_watch();
      if (aborted_) co_return finish(rs, outcome::close);
      if (client_gone_) {
        rs.lease.reset();
        co_return finish(rs, outcome::close);
      }
      const bool timeout = timed_out(phase::first_byte);
      if (rs.resend_ok && !rs.resent && rs.lease.reused() && first_head && !rp.got_some() &&
          rs.lease->buf.size() == 0 && !timeout) {  // stale pooled connection: not one byte came back
        send_again(rs);
        co_return step::again;
      }
      // No head within first_byte_timeout is a slow replica, not a broken connection.
      if (rs.observed && !timeout) note_upstream_error(*rs.ep, ec.message());
      co_return co_await upstream_failed(rs, timeout ? reason::upstream_timeout : reason::upstream_error);
    }
    if (rs.observed) note_upstream_ok(*rs.ep);
    const unsigned status = rp.status();
    // 101: we never ask for upgrades. Framing Beast accepts but that cannot be re-framed
    // faithfully (repeated Content-Length, a coding other than chunked): 502, the upstream
    // connection discarded (A15, B6).
    if (status == 101 || (status >= 200 && !rp.framing_error().empty())) {
      co_await stop_watch();
      co_return co_await upstream_failed(rs, reason::upstream_error);
    }
    if (status >= 200) break;
    if ((status == 100 && rs.expect_continue) || rs.client_version != 11) continue;
    rq_->head.append("\r\n");  // the interim head as the parser wrote it
    if (!(co_await write_all(rq_->head))) {
      co_await stop_watch();
      rs.lease.reset();
      co_return finish(rs, outcome::close);
    }
  }
  rq_->rec.block->first_byte.observe(clock::now() - rs.sent_at);
  finish_response_head(rs);
  co_return step::next;
}

void session::finish_response_head(request_state& rs) {
  const auto& rp = *rs.rp;
  const unsigned status = rp.status();
  const bool no_body = rs.head_only || status == 204 || status == 304;
  const auto length = rp.content_length();
  rs.chunked_out = !no_body && !length && rs.client_version == 11;
  if (!no_body && !length && rs.client_version != 11) rs.close = true;  // close-delimited for HTTP/1.0
  rs.close = rs.close || close_after_;
  // rq_->head holds the status line and the end-to-end fields (relay_response_parser, which
  // leaves out the replica's X-Request-Id); the request's id and our framing follow.
  auto& head = rq_->head;
  http::append_field(head, "X-Request-Id", rs.request_id);
  if (length && (!no_body || rs.head_only))
    http::append_field(head, "Content-Length", std::to_string(*length));
  else if (rs.chunked_out)
    http::append_field(head, "Transfer-Encoding", "chunked");
  if (rs.close)
    http::append_field(head, "Connection", "close");
  else if (rs.client_version == 10)
    http::append_field(head, "Connection", "keep-alive");
  head.append("\r\n");
}

namespace {

/// Before a send that must wait for the client: what is left of a piece moves out of the
/// worker's shared relay window (`window`, relay_size bytes) into the request's own buffer `own`,
/// because the window is valid only until the relaying coroutine suspends.
void move_out_of_window(std::span<asio::const_buffer> pending, const unsigned char* window, unsigned char* own) {
  for (auto& b : pending) {
    const auto* p = static_cast<const unsigned char*>(b.data());
    if (std::less_equal<>()(window, p) && std::less<>()(p, window + relay_size)) {
      std::memcpy(own, p, b.size());
      b = asio::buffer(own, b.size());
    }
  }
}

}  // namespace

awaitable<session::step> session::relay_response(request_state& rs) {
  const auto& cfg = this->cfg();
  auto& rp = *rs.rp;
  stream_guard streaming(w_.stats().active_streams);
  // Body pieces pass through the worker's relay window (worker::relay_window): bytes already
  // buffered are parsed here (Beast's async_read_some would parse them too, then complete
  // through the scheduler queue, other streams running in between); a read that does I/O parses
  // in its completion, which resumes this coroutine directly.
  unsigned char* const window = w_.relay_window();
  // A replica sending an endless chunk-size line or trailer must not grow the buffer without
  // bound: Beast stops with buffer_overflow at the cap and the stream is aborted (hardening B).
  http::bounded_buffer up_in(rs.lease->buf, http::body_read_cap(upstream_header_limit));
  bool head_sent = false;
  error_code read_ec;
  while ((!head_sent || !rp.is_done()) && !read_ec) {
    // The watch may have seen the client leave while no upstream read was pending to cancel
    // (the head and the client's EOF arrived together): stop relaying now (hardening G1).
    if (client_gone_) break;
    std::size_t got = 0;
    if (!rp.is_done()) {
      rp.body_window(window, relay_size);
      // All of what is buffered, not one framing step: one step sent a head that came with the
      // first event on its own, the event in a second send.
      if (rs.lease->buf.size() > 0) http::put_buffered(rp, rs.lease->buf, read_ec);
      if (read_ec == bhttp::error::need_buffer || read_ec == bhttp::error::need_more) read_ec = {};
      // Each piece goes out as soon as it is read; the head goes with the first piece when it is
      // already buffered, else on its own at once (TTFT).
      if (rp.body_left() == relay_size && !read_ec && head_sent && !rp.is_done()) {
        arm(cfg.upstream.idle_timeout, phase::stream);
        // The next piece is read here (body_now). When the last read took all the socket held,
        // the coroutine waits for readability first instead of trying a recv that fails with
        // EAGAIN, as Beast's read starts: one system call less per relayed event of a token stream.
        for (;;) {
          const auto r = body_now(rs, read_ec);
          if (r == piece_read::parsed || read_ec) break;
          if (r == piece_read::beast) {  // EOF, or a buffer full of one framing step
            std::tie(read_ec, std::ignore) = co_await bhttp::async_read_some(rs.lease->sock, up_in, rp, nothrow);
            if (read_ec == bhttp::error::need_buffer) read_ec = {};
            break;
          }
          auto [wec] = co_await rs.lease->sock.async_wait(tcp::socket::wait_read, nothrow);
          rs.up_empty = false;
          if (wec) {
            read_ec = wec;
            break;
          }
        }
      }
      got = relay_size - rp.body_left();
    }
    http::framed_piece piece(rs.chunked_out);
    if (!head_sent) piece.head(rq_->head);
    piece.data(window, got);
    if (!read_ec && rs.chunked_out && rp.is_done()) piece.end();
    if (piece.empty()) continue;
    arm(cfg.upstream.idle_timeout, phase::stream);
    auto pending = piece.buffers();
    error_code ec;
    if (!client([&](auto& s) { return write_now(s, pending, ec); })) {
      move_out_of_window(pending, window, relay_buffer());
      std::tie(ec, std::ignore) =
          co_await client([&](auto& s) { return asio::async_write(s, pending, nothrow); });
    }
    if (ec) {
      // The client went away (or stalled past the idle timeout): close the upstream too.
      rq_->rec.term = client_side_end();
      co_await stop_watch();
      rs.lease.reset();
      hard_close(sock_);
      co_return finish(rs, outcome::close);
    }
    if (!head_sent) rq_->rec.status = rp.status();
    rq_->rec.bytes += got;
    head_sent = true;
  }
  // The connection stays open with nothing buffered: the watch's wait carries on as the idle
  // wait (park_watch). Otherwise it ends here, before the checks that read what it saw.
  const bool broken = read_ec || client_gone_ || aborted_;
  if (rs.close || broken || buf_.size() > 0) co_await stop_watch();
  else park_watch();
  co_return end_relay(rs, broken);
}

session::piece_read session::body_now(request_state& rs, error_code& ec) {
  auto& c = rs.lease.conn();
  // Bytes of a framing step may wait in the buffer (a chunk's CRLF before the next chunk's
  // header): the read appends to them. A buffer that holds a whole relay window is Beast's
  // (its read stops an endless chunk-size line at the cap).
  if (c.buf.size() >= relay_size) return piece_read::beast;
  // Skipped when the last read took all the socket held: it would most likely fail with EAGAIN.
  if (rs.up_empty) return piece_read::wait;
  const auto n = fill_now(c.sock, c.buf, relay_size, ec, &rs.up_empty);
  if (n == 0) return piece_read::beast;  // EOF: Beast's read ends the body or reports it cut
  if (n < 0) return piece_read::wait;    // or `ec`
  http::put_buffered(*rs.rp, c.buf, ec);
  if (ec == bhttp::error::need_buffer || ec == bhttp::error::need_more) ec = {};
  return piece_read::parsed;
}

session::step session::end_relay(request_state& rs, bool broken) {
  disarm();
  if (broken) {
    // Upstream died or hung mid-stream, or the client left: abort both sides (hardening G1, G3).
    rq_->rec.term = aborted_ ? metrics::termination::shutdown
                  : client_gone_ ? metrics::termination::client_abort
                  : timed_out(phase::stream) ? metrics::termination::timeout
                  : metrics::termination::upstream_abort;
    rs.lease.reset();
    hard_close(sock_);
    return finish(rs, outcome::close);
  }
  rs.lease.release(rs.rp->keep_alive());
  return finish(rs, rs.close ? outcome::close : outcome::keep_alive);
}

}  // namespace ingressd::server
