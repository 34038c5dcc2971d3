#pragma once
// Router pool selection and per-worker cursors (contract §4.2). Sans-I/O: plain data in, indices out.
#include <cstddef>
#include <string_view>
#include <vector>

#include "ingressd/topology/topology.hpp"

namespace ingressd::routing {

/// Indices into `routers` in pool order: the co-located ones (ip == node_ip) sorted by
/// (ip, port); if there are none, the single router with the smallest (ip as text, port);
/// empty when there are no routers.
std::vector<std::size_t> build_router_pool(const std::vector<topology::target>& routers,
                                           std::string_view node_ip);

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
