#pragma once
// A read-readiness wait without Asio's per-wait epoll_ctl (issue #22).
//
// Asio's epoll reactor registers each socket once, edge-triggered. A read or write tries the
// system call first and is queued only after EAGAIN, so the next edge is sure to come. A
// readiness wait (socket::async_wait) cannot know whether the socket is readable already, so it
// re-arms the registration with epoll_ctl(EPOLL_CTL_MOD) every time, which makes the kernel
// report the current state. The sessions' client watch (and idle wait) is such a wait, started
// once per request: it was the one epoll_ctl per request on both paths (strace -k).
//
// The re-arm is needed only if an edge may have been reported and dropped with no operation
// queued. That cannot have happened when the socket was drained (a read returned less than it
// asked for, or EAGAIN) during the current reactor turn — after the last epoll_wait of this
// thread: bytes that came after that read raise an edge that the next epoll_wait reports, and
// by then the wait is queued. One exception: a FIN that came with the data a short read took is
// still unread, and its edge was reported with the data. So the process's epoll_ctl registers
// EPOLLRDHUP, its epoll_wait notes the registrations a FIN, hang-up or error was reported for,
// and those never wait quietly (detail::hung_up; nginx keeps the same fact as `pending_eof`). quiet_wait_read queues the wait without the re-arm in exactly that
// case (the caller says when it drained: note_drained(), reactor_turn()), else it is an ordinary
// async_wait. Built with Asio's io_uring backend it is always the ordinary async_wait.
//
// reactor_turn() counts this thread's epoll_wait calls: src/core/asio_impl.cpp defines the
// process's epoll_wait (Asio's reactor is its only caller), which counts and calls epoll_pwait.
#include <cstdint>
#include <utility>

#include <boost/asio/async_result.hpp>
#include <boost/asio/basic_stream_socket.hpp>
#include <boost/asio/detail/config.hpp>
#if defined(BOOST_ASIO_HAS_EPOLL)
#include <boost/asio/detail/epoll_reactor.hpp>
#include <boost/asio/detail/fenced_block.hpp>
#include <boost/asio/detail/handler_alloc_helpers.hpp>
#include <boost/asio/detail/handler_work.hpp>
#include <boost/asio/detail/reactor_op.hpp>
#endif

#include "ingressd/core/asio.hpp"

namespace ingressd {

namespace detail {
extern thread_local std::uint64_t reactor_turns;
}  // namespace detail

/// How many times this thread has entered epoll_wait (0 when the build does not use epoll).
inline std::uint64_t reactor_turn() noexcept { return detail::reactor_turns; }

namespace detail {
/// A FIN, hang-up or error was reported for this reactor registration (src/core/asio_impl.cpp).
bool hung_up(const void* registration) noexcept;
}  // namespace detail

/// Built with Asio's epoll reactor (not its io_uring backend): quiet waits skip the re-arm.
#if defined(BOOST_ASIO_HAS_EPOLL)
inline constexpr bool quiet_waits = true;
#else
inline constexpr bool quiet_waits = false;
#endif

#if defined(BOOST_ASIO_HAS_EPOLL)
namespace detail {

/// Asio's reactive_wait_op, except that the reactor's speculative attempt (made while it is
/// being queued) reports "not ready", which queues it without the epoll_ctl.
template <class Handler, class IoExecutor>
class quiet_wait_op : public boost::asio::detail::reactor_op {
 public:
  BOOST_ASIO_DEFINE_HANDLER_PTR(quiet_wait_op);

  quiet_wait_op(const error_code& success_ec, Handler& handler, const IoExecutor& io_ex)
      : reactor_op(success_ec, &quiet_wait_op::do_perform, &quiet_wait_op::do_complete),
        handler_(std::move(handler)),
        work_(handler_, io_ex) {}

  bool queuing = true;

  static status do_perform(reactor_op* base) { return static_cast<quiet_wait_op*>(base)->queuing ? not_done : done; }

  static void do_complete(void* owner, boost::asio::detail::operation* base, const error_code&, std::size_t) {
    namespace d = boost::asio::detail;
    auto* o = static_cast<quiet_wait_op*>(base);
    ptr p = {std::addressof(o->handler_), o, o};
    d::handler_work<Handler, IoExecutor> w(std::move(o->work_));
    d::binder1<Handler, error_code> handler(o->handler_, o->ec_);
    p.h = std::addressof(handler.handler_);
    p.reset();
    if (owner) {
      d::fenced_block b(d::fenced_block::half);
      w.complete(handler, handler.handler_);
    }
  }

 private:
  Handler handler_;
  boost::asio::detail::handler_work<Handler, IoExecutor> work_;
};

/// The socket's reactor state (basic_socket::impl_ is protected).
template <class Socket>
struct socket_impl : Socket {
  static auto& of(Socket& s) { return (s.*(&socket_impl::impl_)).get_implementation(); }
};

}  // namespace detail
#endif

/// async_wait(wait_read) on `s`; without the epoll_ctl when `drained_turn == reactor_turn()` (the
/// socket was drained during this reactor turn). `ioc` is the socket's io_context.
template <class Protocol, class Executor, class Handler>
void quiet_wait_read(asio::io_context& ioc, asio::basic_stream_socket<Protocol, Executor>& s, std::uint64_t drained_turn,
                     Handler&& h) {
#if defined(BOOST_ASIO_HAS_EPOLL)
  namespace d = boost::asio::detail;
  using socket_type = asio::basic_stream_socket<Protocol, Executor>;
  auto& impl = detail::socket_impl<socket_type>::of(s);
  if (drained_turn == reactor_turn() && impl.reactor_data_ != nullptr && !detail::hung_up(impl.reactor_data_)) {
    using handler_type = std::decay_t<Handler>;
    using op = detail::quiet_wait_op<handler_type, Executor>;
    handler_type handler(std::forward<Handler>(h));
    typename op::ptr p = {std::addressof(handler), op::ptr::allocate(handler), nullptr};
    p.p = new (p.v) op(error_code{}, handler, s.get_executor());
    auto& reactor = asio::use_service<d::epoll_reactor>(ioc);
    op* queued = p.p;
    reactor.start_op(d::epoll_reactor::read_op, impl.socket_, impl.reactor_data_, queued, false, true);
    queued->queuing = false;  // the reactor owns it now; its next perform is a real event
    p.v = p.p = nullptr;
    return;
  }
#endif
  s.async_wait(asio::socket_base::wait_read, std::forward<Handler>(h));
}

/// The socket holds nothing to read: it was drained in this reactor turn (`drained_turn`) and no
/// FIN, hang-up or error is pending on it. Then a read would fail with EAGAIN.
template <class Protocol, class Executor>
bool known_empty(asio::basic_stream_socket<Protocol, Executor>& s, std::uint64_t drained_turn) {
#if defined(BOOST_ASIO_HAS_EPOLL)
  if (drained_turn != reactor_turn()) return false;
  const auto* registration = detail::socket_impl<asio::basic_stream_socket<Protocol, Executor>>::of(s).reactor_data_;
  return registration != nullptr && !detail::hung_up(registration);
#else
  return false;
#endif
}

/// quiet_wait_read as an asynchronous operation: `co_await quiet_readable(ioc, s, turn, nothrow)`.
template <class Protocol, class Executor, class Token>
auto quiet_readable(asio::io_context& ioc, asio::basic_stream_socket<Protocol, Executor>& s, std::uint64_t drained_turn,
                    Token&& token) {
  return asio::async_initiate<Token, void(error_code)>(
      [&ioc, &s, drained_turn](auto handler) { quiet_wait_read(ioc, s, drained_turn, std::move(handler)); }, token);
}

}  // namespace ingressd
