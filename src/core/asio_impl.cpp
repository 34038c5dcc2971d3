// The one translation unit that compiles Asio and Beast (BOOST_ASIO_SEPARATE_COMPILATION and
// BOOST_BEAST_SEPARATE_COMPILATION are set project-wide), so that no other file pays for them.
#include <boost/asio/impl/src.hpp>
#include <boost/beast/src.hpp>

#include <cstdint>
#include <unordered_set>

namespace ingressd::detail {
// This thread's epoll_wait calls: include/ingressd/core/quiet_wait.hpp.
thread_local std::uint64_t reactor_turns = 0;
// Registrations (Asio's descriptor_state, the epoll_event's data.ptr) for which this thread's
// epoll_wait reported a FIN, hang-up or error, until they are registered anew (EPOLL_CTL_ADD:
// Asio recycles them for new sockets). Bounded by the descriptors open at once.
thread_local std::unordered_set<const void*> hung_up_set;

bool hung_up(const void* registration) noexcept {
  return !hung_up_set.empty() && hung_up_set.count(registration) != 0;
}
}  // namespace ingressd::detail

#if defined(BOOST_ASIO_HAS_EPOLL)
#include <sys/epoll.h>
#include <sys/syscall.h>
#include <unistd.h>

// The process's epoll_wait and epoll_ctl (these definitions take precedence over libc's; Asio's
// reactor is their only caller), for quiet_wait_read (quiet_wait.hpp).
//
// epoll_wait counts the calls (reactor turns) and notes the registrations a FIN, hang-up or error
// was reported for: a read that returned fewer bytes than asked for leaves a FIN that came with
// the data unread, and its edge has been reported already, so such a socket never waits quietly
// (nginx keeps the same fact as `pending_eof`).
extern "C" int epoll_wait(int epfd, struct epoll_event* events, int maxevents, int timeout) {
  ++ingressd::detail::reactor_turns;
  const int n = ::epoll_pwait(epfd, events, maxevents, timeout, nullptr);
  for (int i = 0; i < n; ++i)
    if (events[i].events & (EPOLLRDHUP | EPOLLHUP | EPOLLERR)) {
      const void* registration = events[i].data.ptr;  // a copy: epoll_event is packed on x86-64
      ingressd::detail::hung_up_set.insert(registration);
    }
  return n;
}

// epoll_ctl adds EPOLLRDHUP to Asio's edge-triggered registrations, so that epoll_wait can report
// a FIN apart from data (Asio registers EPOLLIN | EPOLLERR | EPOLLHUP | EPOLLPRI | EPOLLET and keeps
// its own copy of the mask, which it sends again on a modification: both get the flag here). A new
// registration forgets what was noted for the registration object it reuses. Made with the system
// call itself: a wrapper that called libc's by name would call itself.
extern "C" int epoll_ctl(int epfd, int op, int fd, struct epoll_event* ev) {
  epoll_event with_rdhup;
  if ((op == EPOLL_CTL_ADD || op == EPOLL_CTL_MOD) && ev != nullptr && (ev->events & EPOLLET) != 0) {
    with_rdhup = *ev;
    with_rdhup.events |= EPOLLRDHUP;
    ev = &with_rdhup;
    if (op == EPOLL_CTL_ADD && !ingressd::detail::hung_up_set.empty()) {
      const void* registration = with_rdhup.data.ptr;  // a copy: epoll_event is packed on x86-64
      ingressd::detail::hung_up_set.erase(registration);
    }
  }
  return static_cast<int>(::syscall(SYS_epoll_ctl, epfd, op, fd, ev));
}
#endif
