// The WebSocket tunnel (issue #32): after a replica's 101 answers a client's WebSocket handshake,
// the connection carries bytes both ways, as they arrive, until either side ends it. ingressd
// does not parse WebSocket frames: like HAProxy's and nginx's tunnels it moves bytes, so ping,
// pong, close codes and extensions pass through untouched.
//
// Each direction is a loop: read what the socket holds into the worker's relay window (no
// buffer of the tunnel's own while nothing waits), write it to the other side at once, and only
// when that side cannot take it all, copy the rest into the direction's own buffer and wait for
// the write. The next read comes only after the write: a client that stops reading holds its
// replica (TCP back-pressure), never the worker. An end of stream (FIN) is passed on as one
// (half close) and that direction stops; an error on either side, timeout.tunnel without a byte
// either way, or the daemon's stop closes both sides at once.

#include <boost/asio/experimental/awaitable_operators.hpp>
#include <spdlog/spdlog.h>

#include "ingressd/core/socket_io.hpp"
#include "proxy/http1/exchange.hpp"
#include "proxy/http1/parts.hpp"

namespace ingressd::server {

awaitable<bool> exchange::tunnel_write(bool to_client, std::span<asio::const_buffer> bufs, std::size_t carried) {
  auto& dir = to_client ? tun_.to_client : tun_.to_replica;
  auto& own = dir.own;
  error_code ec;
  const bool done = to_client ? c_.client([&](auto& s) { return write_now(s, bufs, ec); })
                              : write_now(lease_->sock, bufs, ec);
  if (!done) {
    if (!own) own = std::make_unique<unsigned char[]>(relay_size);
    move_out_of_window(bufs, w_.relay_window(), own.get(), relay_size);
    if (to_client)
      std::tie(ec, std::ignore) = co_await c_.client([&](auto& s) { return asio::async_write(s, bufs, nothrow); });
    else
      std::tie(ec, std::ignore) = co_await asio::async_write(lease_->sock, bufs, nothrow);
  }
  if (ec) co_return false;
  dir.bytes += carried;
  (to_client ? w_.stats().tunnel_bytes_to_client : w_.stats().tunnel_bytes_to_replica).add(carried);
  co_return true;
}

void exchange::tunnel_broken(std::string_view side) {
  if (tun_.closed_by.empty())
    tun_.closed_by = c_.aborted_ ? "shutdown" : c_.timed_out(phase::tunnel) ? "timeout" : side;
  if (tun_.broken) return;
  tun_.broken = true;
  // The other direction may be waiting on either socket: it ends with operation_aborted.
  error_code ignored;
  c_.sock_.cancel(ignored);
  lease_.cancel();
}

awaitable<void> exchange::tunnel_pump(bool to_client) {
  using read = connection::client_read;
  const std::string_view from = to_client ? "replica" : "client";
  const auto idle = cfg().timeout.tunnel;
  unsigned char* const window = w_.relay_window();
  // The last read took all the socket held (a short read): the next would most likely fail with
  // EAGAIN, so wait for readiness first (the response relay's up_empty_ rule; nginx's `ready`
  // flag). Not for a TLS client, whose library may hold decrypted bytes the socket no longer has.
  const bool plain = to_client || !c_.tls_;
  bool drained = false;
  while (!tun_.broken) {
    std::size_t got = 0;
    const asio::mutable_buffer room(window, relay_size);
    const auto r = drained     ? read::wait_read
                   : to_client ? connection::read_socket_now(lease_->sock.native_handle(), room, got)
                               : c_.read_client_now(room, got);
    drained = false;
    if (r == read::wait_read || r == read::wait_write) {
      const auto what = r == read::wait_read ? asio::socket_base::wait_read : asio::socket_base::wait_write;
      error_code ec;
      if (to_client) std::tie(ec) = co_await lease_->sock.async_wait(what, nothrow);
      else std::tie(ec) = co_await c_.sock_.async_wait(what, nothrow);
      if (ec) tunnel_broken(from);
      continue;
    }
    if (r == read::error) {
      tunnel_broken(from);
      break;
    }
    if (r == read::eof) {
      // The side that sent FIN is done sending: the other side learns it the same way, and may
      // still answer (a WebSocket close handshake, then its own FIN).
      if (tun_.closed_by.empty()) tun_.closed_by = from;
      error_code ignored;
      if (to_client) {
        if (c_.tls_) c_.tls_->shutdown_now();
        c_.sock_.shutdown(asio::socket_base::shutdown_send, ignored);
      } else {
        lease_->sock.shutdown(asio::socket_base::shutdown_send, ignored);
      }
      break;
    }
    c_.arm(idle, phase::tunnel);
    asio::const_buffer piece = asio::buffer(window, got);
    if (!(co_await tunnel_write(to_client, {&piece, 1}, got))) {
      tunnel_broken(to_client ? "client" : "replica");
      break;
    }
    drained = plain && got < relay_size;
  }
}

awaitable<void> exchange::tunnel() {
  using namespace boost::asio::experimental::awaitable_operators;
  const auto start = clock::now();
  auto& shared_tunnels = w_.shared().tunnels;
  shared_tunnels.fetch_add(1, std::memory_order_relaxed);
  w_.stats().tunnels.add(1);
  // The tunnel reads the client itself from here on.
  c_.end_watch(false);
  c_.arm(cfg().timeout.tunnel, phase::tunnel);
  rq_.rec.status = 101;
  rq_.rec.tunnel = true;

  // The 101 goes out with whatever the replica sent after it (a server that speaks first); what
  // the client sent after its handshake goes to the replica.
  auto& up_buf = lease_->buf;
  std::array<asio::const_buffer, 2> head{asio::buffer(rq_.response_head), up_buf.data()};
  bool ok = co_await tunnel_write(true, head, up_buf.size());
  if (ok) {
    up_buf.consume(up_buf.size());
    if (c_.buf_.size() > 0) {
      asio::const_buffer early = c_.buf_.data();
      ok = co_await tunnel_write(false, {&early, 1}, c_.buf_.size());
      c_.buf_.consume(c_.buf_.size());
    }
    if (!ok) tunnel_broken("replica");
  } else {
    tunnel_broken("client");
  }
  // Nothing more is parsed on either connection, and no head is built: their buffers go back now
  // (a tunnel may stay open for hours; what it holds is paid per tunnel).
  up_buf.shrink_to_fit();
  c_.buf_.shrink_to_fit();
  for (auto* s : {&rq_.client_head, &rq_.request_head, &rq_.response_head, &rq_.router_request, &rq_.hedge_request,
                  &rq_.prebody})
    std::string().swap(*s);
  if (ok) co_await (tunnel_pump(false) && tunnel_pump(true));

  c_.disarm();
  shared_tunnels.fetch_sub(1, std::memory_order_relaxed);
  w_.stats().tunnels.sub(1);
  if (rq_.rec.block) rq_.rec.block->tunnel_duration.observe(clock::now() - start);
  rq_.rec.bytes = tun_.to_client.bytes;
  rq_.rec.tunnel_bytes_to_replica = tun_.to_replica.bytes;
  rq_.rec.closed_by = tun_.closed_by;
  rq_.rec.term = !tun_.broken                  ? metrics::termination::ok
                 : tun_.closed_by == "shutdown" ? metrics::termination::shutdown
                 : tun_.closed_by == "timeout"  ? metrics::termination::timeout
                 : tun_.closed_by == "client"   ? metrics::termination::client_abort
                                                : metrics::termination::upstream_abort;
  // A tunnel's connection never goes back to the pool, and the client's connection ends with it.
  lease_.reset();
  if (tun_.broken) connection::hard_close(c_.sock_);
  finish(outcome::close);
}

}  // namespace ingressd::server
