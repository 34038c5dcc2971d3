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
/// Every coroutine of ingressd runs on an io_context. Naming its executor type instead of the
/// type-erased any_io_executor makes each coroutine frame and each operation's completion handler
/// carry (and copy, and destroy) a pointer-sized executor instead of a type-erased one: the
/// request path is a chain of coroutines (session.hpp), so this is paid many times per request.
using executor = asio::io_context::executor_type;
template <class T = void>
using awaitable = asio::awaitable<T, executor>;
/// Completion token of those coroutines.
inline constexpr asio::use_awaitable_t<executor> use_awaitable;

/// Completion token: `auto [ec, n] = co_await sock.async_read_some(buf, nothrow);`
inline constexpr auto nothrow = asio::as_tuple(use_awaitable);
}  // namespace ingressd
