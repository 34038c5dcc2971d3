#include "ingressd/routing/router_memory.hpp"

#include <algorithm>

namespace ingressd::routing {

router_memory::state router_memory::get(const std::string& key, clock::time_point now) const {
  auto it = entries_.find(key);
  if (it == entries_.end()) return state::up;
  const auto& e = it->second;
  if (e.failures > 0) return now >= e.retry_at ? state::probe : state::down;
  return e.losses >= slow_after && now < e.slow_until ? state::slow : state::up;
}

void router_memory::lost(const std::string& key, clock::time_point now) {
  auto& e = entries_[key];
  e.losses = std::min(e.losses + 1, slow_after);
  // Once slow, each further loss (the first call after slow_for, say) keeps it slow.
  if (e.losses >= slow_after) e.slow_until = now + slow_for;
}

void router_memory::failed(const std::string& key, clock::time_point now) {
  auto& e = entries_[key];
  e.failures = std::min(e.failures + 1, 16u);
  auto backoff = first_;
  for (unsigned i = 1; i < e.failures && backoff < max_; ++i) backoff *= 2;
  e.retry_at = now + std::min(backoff, max_);
}

void router_memory::probing(const std::string& key, clock::time_point now) {
  // While one probe is out, hold the others back for as long as that probe may take.
  auto it = entries_.find(key);
  if (it != entries_.end() && it->second.failures > 0) it->second.retry_at = now + first_;
}

}  // namespace ingressd::routing
