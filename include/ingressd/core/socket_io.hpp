#pragma once
// Socket reads and writes that finish at once when they can. An Asio operation always completes
// through the scheduler queue, so the coroutine resumes only after every other ready handler, its
// request's state out of the cache again; these try the system call first and fall back to the
// Asio operation only when it would block. Used by the HTTP/1 proxy for the client, router and
// replica sockets (src/proxy/http1/); tested on real sockets in tests/unit/socket_io_test.cpp.
// Parsing what such a read took is http/parse_now.hpp: core/ knows no HTTP.
#include <sys/socket.h>
#include <sys/uio.h>

#include <algorithm>
#include <array>
#include <cerrno>
#include <cstddef>
#include <span>
#include <tuple>

#include <boost/asio/post.hpp>
#include <boost/asio/write.hpp>

#include "ingressd/core/asio.hpp"

namespace ingressd {

/// Writes as much of `bufs` as the socket takes right now — one sendmsg that never waits, at most
/// 8 buffers — and drops what went out from the front of `bufs`. True when nothing is left to
/// write, or on an error (in `ec`); false when the socket buffer is full and the caller must
/// async_write the rest. Why: nearly every write fits the socket buffer, yet an async_write still
/// allocates an operation and resumes the coroutine through the scheduler queue (at 256
/// connections that was most of the cost of a request).
template <class Socket>
bool write_now(Socket& s, std::span<asio::const_buffer>& bufs, error_code& ec) {
  std::array<iovec, 8> iov;
  std::size_t k = 0;
  for (const auto& b : bufs) {
    if (k == iov.size()) break;
    iov[k++] = {const_cast<void*>(b.data()), b.size()};
  }
  msghdr msg{};
  msg.msg_iov = iov.data();
  msg.msg_iovlen = k;
  const ssize_t r = ::sendmsg(s.native_handle(), &msg, MSG_DONTWAIT | MSG_NOSIGNAL);
  if (r < 0) {
    if (errno == EAGAIN || errno == EWOULDBLOCK || errno == EINTR) return false;
    ec = error_code(errno, asio::error::get_system_category());
    return true;
  }
  auto left = static_cast<std::size_t>(r);
  while (!bufs.empty() && left >= bufs.front().size()) {
    left -= bufs.front().size();
    bufs = bufs.subspan(1);
  }
  if (left > 0) bufs.front() += left;
  return bufs.empty();
}

/// What the socket holds now, without waiting: >0 bytes, 0 at EOF, -1 when nothing is there yet or
/// on an error. (tls::recv_now is the same for a TLS stream; calls find either by argument type.)
template <class Socket>
std::ptrdiff_t recv_now(Socket& s, void* p, std::size_t n) {
  return ::recv(s.native_handle(), p, n, MSG_DONTWAIT);
}

/// write_now, then async_write for whatever the socket did not take at once.
template <class Socket>
awaitable<error_code> send(Socket& s, std::span<asio::const_buffer> bufs) {
  error_code ec;
  if (!write_now(s, bufs, ec)) std::tie(ec, std::ignore) = co_await asio::async_write(s, bufs, nothrow);
  co_return ec;
}

/// Resumes the caller after the worker's other ready handlers, to read a reply just asked for.
/// Why: a reply is never there the moment its request has been written, so reading at once (Asio
/// tries a read before it waits) costs a recv that fails with EAGAIN, then the wait. Under load the
/// other ready handlers take long enough for the router or replica to answer, and the first read
/// finds the reply: 4 recv per routed request instead of 6, and at 256 connections half the
/// cross-core wake-ups (bench/README "c64 -> c256"). An idle worker has nothing else queued and
/// resumes at once.
/// The rule that comes with it: a deadline or a cancellation that fires while the caller waits
/// here finds no operation to cancel, so the caller must check for one before it reads.
inline auto after_ready_handlers(asio::io_context& ioc) { return asio::post(ioc, use_awaitable); }

/// One read of what the socket holds now, appended to `buf` (which must hold fewer than `cap`
/// bytes; at least 512 bytes asked, `cap` in all at most): the bytes read, 0 at EOF, -1 when
/// nothing is there yet (`ec` clear) or on an error (`ec`; plain sockets only: a TLS stream's
/// recv_now leaves errno unspecified). `drained` (when given) is set when the read took everything the socket held: fewer
/// bytes than asked for, or nothing yet (the relay then waits for readability before reading again).
template <class Socket, class Buffer>
std::ptrdiff_t fill_now(Socket& s, Buffer& buf, std::size_t cap, error_code& ec, bool* drained = nullptr) {
  const std::size_t have = buf.size();
  const std::size_t want = std::min(std::max<std::size_t>(512, buf.capacity() - have), cap - have);
  auto room = buf.prepare(want);
  const auto n = recv_now(s, room.data(), room.size());
  if (n < 0) {
    if (errno == EAGAIN || errno == EWOULDBLOCK || errno == EINTR) {
      if (drained && errno != EINTR) *drained = true;
    } else {
      ec = error_code(errno, asio::error::get_system_category());
    }
    return -1;
  }
  if (drained && n > 0 && static_cast<std::size_t>(n) < room.size()) *drained = true;
  buf.commit(static_cast<std::size_t>(n));
  return n;
}

}  // namespace ingressd
