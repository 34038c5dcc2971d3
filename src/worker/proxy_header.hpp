#pragma once
// Reads a connection's PROXY protocol header (net/proxy_protocol.hpp) off the socket and no byte
// more: the bytes are peeked at (MSG_PEEK), and only those that belong to the header are taken.
// What follows stays in the socket for whoever serves the connection — Beast's reads, or OpenSSL,
// which reads the descriptor itself. Peeked bytes that do not finish the header all belong to it
// (parse_proxy_header's need_more), so they are taken too and the next wait does not spin.
#include <array>

#include "ingressd/core/asio.hpp"
#include "ingressd/net/proxy_protocol.hpp"

namespace ingressd::server {

template <class Socket>
awaitable<net::proxy_header> read_proxy_header(Socket& sock) {
  std::array<char, net::max_proxy_v2_bytes> buf;
  std::size_t have = 0;
  error_code ec;
  const bool was_non_blocking = sock.non_blocking();
  sock.non_blocking(true, ec);
  auto truncated = [] {
    net::proxy_header h;
    h.st = net::proxy_header::state::failed;
    h.error = net::proxy_error::truncated;
    h.detail = "the connection ended before the header did";
    return h;
  };
  net::proxy_header h;
  for (;;) {
    auto [wec] = co_await sock.async_wait(Socket::wait_read, nothrow);
    if (wec) {
      h = truncated();
      break;
    }
    const std::size_t n = sock.receive(asio::buffer(buf.data() + have, buf.size() - have), Socket::message_peek, ec);
    if (ec == asio::error::would_block || ec == asio::error::try_again) continue;
    if (ec || n == 0) {
      h = truncated();
      break;
    }
    h = net::parse_proxy_header({buf.data(), have + n});
    if (h.st == net::proxy_header::state::failed) break;
    // Take what belongs to the header: all of it so far, or up to its end.
    const std::size_t take = h.st == net::proxy_header::state::done ? h.length - have : n;
    const std::size_t taken = sock.receive(asio::buffer(buf.data() + have, take), 0, ec);
    if (ec || taken != take) {
      h = truncated();
      break;
    }
    have += take;
    if (h.st == net::proxy_header::state::done) break;
    if (have == buf.size()) {
      h.st = net::proxy_header::state::failed;
      h.error = net::proxy_error::oversized;
      h.detail = "longer than any header ingressd accepts";
      break;
    }
  }
  sock.non_blocking(was_non_blocking, ec);
  co_return h;
}

}  // namespace ingressd::server
