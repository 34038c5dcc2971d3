#pragma once
// Common Asio/Beast aliases for the whole project. Errors on the data path are values: every
// asynchronous call uses `nothrow`, which yields a tuple (error_code, result...) instead of throwing.
#include <boost/asio/as_tuple.hpp>
#include <boost/asio/awaitable.hpp>
#include <boost/asio/co_spawn.hpp>
#include <boost/asio/io_context.hpp>
#include <boost/asio/ip/tcp.hpp>
#include <boost/asio/steady_timer.hpp>
#include <boost/asio/use_awaitable.hpp>

namespace ingressd {
namespace asio = boost::asio;
using tcp = asio::ip::tcp;
using error_code = boost::system::error_code;
template <class T = void>
using awaitable = asio::awaitable<T>;

/// Completion token: `auto [ec, n] = co_await sock.async_read_some(buf, nothrow);`
inline constexpr auto nothrow = asio::as_tuple(asio::use_awaitable);
}  // namespace ingressd
