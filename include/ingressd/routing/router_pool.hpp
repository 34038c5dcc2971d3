#pragma once
// Router pool selection and per-worker cursors (contract §4.2). Sans-I/O: plain data in, indices out.
#include <algorithm>
#include <cstddef>
#include <string_view>
#include <tuple>
#include <vector>

namespace ingressd::routing {

/// Indices into `routers` in pool order: the co-located ones (ip == node_ip) sorted by
/// (ip, port); if there are none, the single router with the smallest (ip as text, port);
/// empty when there are no routers. `Target` has `ip` (text) and `port` (topology::target):
/// a template, so that routing does not depend on the topology module that depends on it.
template <class Target>
std::vector<std::size_t> build_router_pool(const std::vector<Target>& routers, std::string_view node_ip) {
  // Ray orders by (host text, port). Ties (the same ip:port listed twice) fall back to document
  // order so the pool, and with it the pool signature, is deterministic.
  const auto less = [&](std::size_t a, std::size_t b) {
    return std::tie(routers[a].ip, routers[a].port, a) < std::tie(routers[b].ip, routers[b].port, b);
  };

  std::vector<std::size_t> pool;
  for (std::size_t i = 0; i < routers.size(); ++i)
    if (routers[i].ip == node_ip) pool.push_back(i);
  if (!pool.empty()) {
    std::sort(pool.begin(), pool.end(), less);
    return pool;
  }
  if (routers.empty()) return pool;

  // No local router: a single remote one, chosen the same way on every node (smallest by text,
  // so "10.0.0.10" sorts before "10.0.0.9"). Ray keeps this deterministic to avoid the
  // first-response latency regression of cycling routers across requests.
  std::size_t best = 0;
  for (std::size_t i = 1; i < routers.size(); ++i)
    if (less(i, best)) best = i;
  pool.push_back(best);
  return pool;
}

/// A per-worker, per-app round-robin cursor. Advances exactly once per request.
class rr_cursor {
 public:
  explicit rr_cursor(std::size_t start = 0) : next_(start) {}
  /// Returns the start offset for this request (in [0, n)) and advances. n must be > 0.
  std::size_t take(std::size_t n) noexcept {
    std::size_t s = next_ % n;
    next_ = s + 1;
    return s;
  }
  std::size_t peek() const noexcept { return next_; }

 private:
  std::size_t next_;
};

}  // namespace ingressd::routing
