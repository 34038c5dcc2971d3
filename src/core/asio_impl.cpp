// The one translation unit that compiles Asio and Beast (BOOST_ASIO_SEPARATE_COMPILATION and
// BOOST_BEAST_SEPARATE_COMPILATION are set project-wide), so that no other file pays for them.
#include <boost/asio/impl/src.hpp>
#include <boost/beast/src.hpp>

#include <cstdint>

namespace ingressd::detail {
// This thread's epoll_wait calls: include/ingressd/core/quiet_wait.hpp.
thread_local std::uint64_t reactor_turns = 0;
}  // namespace ingressd::detail

#if defined(BOOST_ASIO_HAS_EPOLL)
#include <sys/epoll.h>
// The process's epoll_wait (this definition takes precedence over libc's): Asio's reactor is its
// only caller; it counts the calls for quiet_wait_read, then does what libc's does.
extern "C" int epoll_wait(int epfd, struct epoll_event* events, int maxevents, int timeout) {
  ++ingressd::detail::reactor_turns;
  return ::epoll_pwait(epfd, events, maxevents, timeout, nullptr);
}
#endif
