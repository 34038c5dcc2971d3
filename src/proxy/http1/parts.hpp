#pragma once
// What the HTTP/1 proxy's translation units (connection.cpp, exchange.cpp, exchange_router.cpp) share
// beyond connection.hpp and exchange.hpp: limits, fixed messages and small helpers over the topology view.
#include <cstddef>
#include <cstdint>
#include <cstring>
#include <functional>
#include <span>
#include <string_view>

#include "ingressd/core/asio.hpp"

#include "ingressd/metrics/counter.hpp"
#include "ingressd/topology/snapshot.hpp"

namespace ingressd::server {

/// Body bytes read ahead while a router decides (forward_body off): bounds per-request buffering.
inline constexpr std::size_t prebody_cap = 64 * 1024;
/// Caps a replica's response head (hardening B).
inline constexpr std::uint32_t upstream_header_limit = 64 * 1024;
inline constexpr std::string_view continue_100 = "HTTP/1.1 100 Continue\r\n\r\n";

/// The app's fallback target when it is up (a fallback that health checks marked down is as
/// good as none: HAProxy skips a down backup server too), else null.
inline const topology::endpoint* usable_fallback(const topology::app_view& v) noexcept {
  return v.fallback && v.fallback->state->up.load(std::memory_order_relaxed) ? &*v.fallback : nullptr;
}

inline bool has_healthy_replica(const topology::app_view& v) noexcept {
  for (const auto& r : v.replicas)
    if (r.state->up.load(std::memory_order_relaxed)) return true;
  return false;
}

/// Before a send that must wait: what is left of a piece moves out of the worker's shared relay
/// window (`window`, relay_size bytes) into the request's own buffer `own` (relay_size bytes),
/// because the window is valid only until the relaying coroutine suspends.
inline void move_out_of_window(std::span<asio::const_buffer> pending, const unsigned char* window, unsigned char* own,
                               std::size_t window_size) {
  for (auto& b : pending) {
    const auto* p = static_cast<const unsigned char*>(b.data());
    if (std::less_equal<>()(window, p) && std::less<>()(p, window + window_size)) {
      std::memcpy(own, p, b.size());
      b = asio::buffer(own, b.size());
    }
  }
}

/// Counts a stream as active while a response body is being relayed.
struct stream_guard {
  metrics::counter& c;
  explicit stream_guard(metrics::counter& x) : c(x) { c.add(); }
  ~stream_guard() { c.sub(); }
};

}  // namespace ingressd::server
