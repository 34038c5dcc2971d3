#include "ingressd/grpc/link_policy.hpp"

namespace ingressd::grpc {

std::optional<std::size_t> choose_link(std::span<const link_room> links, std::size_t cap) noexcept {
  std::size_t usable = 0;
  std::optional<std::size_t> roomiest, least_busy;
  for (std::size_t i = 0; i < links.size(); ++i) {
    const auto& l = links[i];
    if (!l.usable) continue;
    ++usable;
    const bool free_stream = l.calls < l.stream_limit;
    if (free_stream && l.send_window >= window_wanted) return i;
    if (free_stream && (!roomiest || l.send_window > links[*roomiest].send_window)) roomiest = i;
    if (!least_busy || l.calls < links[*least_busy].calls) least_busy = i;
  }
  if (usable < cap) return std::nullopt;
  return roomiest ? roomiest : least_busy;
}

keepalive::action keepalive::tick(clock::time_point now, bool busy, clock::time_point last_read) noexcept {
  if (!enabled()) return action::none;
  if (ping_sent_) {
    // Any bytes since the PING left show the replica is there (its ACK, or frames ahead of it).
    if (last_read >= *ping_sent_) {
      ping_sent_.reset();
    } else if (now - *ping_sent_ >= timeout_) {
      return action::lost;
    } else {
      return action::none;
    }
  }
  if (!busy || now - last_read < interval_ || pings_ >= max_pings_without_data) return action::none;
  ++pings_;
  ping_sent_ = now;
  return action::ping;
}

}  // namespace ingressd::grpc
