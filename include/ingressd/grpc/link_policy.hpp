#pragma once
// How the gRPC ingress uses its HTTP/2 connections to a replica ("links"), without I/O (issue
// #31 item 2): which link a new call goes on, and when a link is pinged to learn that its replica
// is still there. Unit-tested in tests/unit/grpc_link_test.cpp; src/proxy/grpc/ does the I/O.
#include <chrono>
#include <cstddef>
#include <cstdint>
#include <optional>
#include <span>

namespace ingressd::grpc {

/// What the chooser needs to know of one link to a target.
struct link_room {
  bool usable = true;            ///< open (or connecting), not retired, not closing
  std::size_t calls = 0;         ///< calls on it (or waiting for it to connect)
  std::size_t stream_limit = 0;  ///< calls it may carry (the replica's SETTINGS_MAX_CONCURRENT_STREAMS, capped)
  std::int64_t send_window = 0;  ///< bytes the replica lets us send on the connection now
};

/// A call's request needs this much connection window to leave at once (a unary request is
/// mostly far smaller); a link with less is passed over while another link has it.
inline constexpr std::int64_t window_wanted = 64 * 1024;

/// Which link of a target takes a new call: an index into `links`, or nullopt to open a new one.
/// Calls are packed onto the first links with a free stream and window (fewer connections mean
/// fuller writes); a new link is opened only when none has room and fewer than `cap` usable links
/// exist. At the cap, the call goes to the usable link with the most room — the one with a free
/// stream and the widest window, else the one with the fewest calls (nghttp2 holds a stream past
/// the replica's limit until one ends) — so that a cap never fails a call by itself.
std::optional<std::size_t> choose_link(std::span<const link_room> links, std::size_t cap) noexcept;

/// Keepalive of one link (grpc.keepalive_interval, grpc.keepalive_timeout): a replica that
/// vanishes without FIN or RST (a dead host, a dropped route) is found by a PING it does not
/// answer, and the link's calls fail UNAVAILABLE in seconds instead of at their deadlines.
///
/// Pings go only when the link has calls and heard nothing for an interval, and at most
/// `max_pings_without_data` between two HEADERS/DATA frames from the replica: a gRPC server
/// (grpc-core's ping abuse policy) allows one PING per 5 minutes while it sends no data and
/// closes the connection (GOAWAY ENHANCE_YOUR_CALM "too_many_pings") at the third strike, so a
/// quiet call (a model thinking) would otherwise be cut by its own keepalive. Its strikes reset
/// when it sends HEADERS or DATA; ours too.
class keepalive {
 public:
  using clock = std::chrono::steady_clock;
  /// The first ping is free, the next two are strikes 1 and 2; the third strike closes.
  static constexpr unsigned max_pings_without_data = 3;

  keepalive(clock::duration interval, clock::duration timeout) noexcept : interval_(interval), timeout_(timeout) {}

  enum class action {
    none,
    ping,  ///< send a PING now
    lost   ///< the last PING went unanswered: the replica is gone, close the link
  };
  /// At a tick (`now`): `busy`: the link has calls; `last_read`: when bytes last came from it.
  action tick(clock::time_point now, bool busy, clock::time_point last_read) noexcept;
  /// When to tick next, from `now`.
  clock::duration next_tick() const noexcept { return ping_sent_ ? timeout_ : interval_; }
  /// The replica sent HEADERS or DATA: its strike count is back to zero.
  void data_received() noexcept { pings_ = 0; }
  bool enabled() const noexcept { return interval_ > clock::duration::zero(); }

 private:
  clock::duration interval_, timeout_;
  std::optional<clock::time_point> ping_sent_;
  unsigned pings_ = 0;
};

}  // namespace ingressd::grpc
