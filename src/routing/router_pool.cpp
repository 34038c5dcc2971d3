#include "ingressd/routing/router_pool.hpp"

#include <algorithm>
#include <tuple>

namespace ingressd::routing {

std::vector<std::size_t> build_router_pool(const std::vector<topology::target>& routers,
                                           std::string_view node_ip) {
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

}  // namespace ingressd::routing
