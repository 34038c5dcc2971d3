#include "ingressd/routing/chooser.hpp"

namespace ingressd::routing {

choice choose_upstream(std::span<const candidate> replicas, const choice_inputs& in) noexcept {
  const choice to_fallback{choice::kind::fallback, 0};
  const bool fallback_ok = in.fallback_usable && !in.tried_any;
  if (in.prefer_fallback && fallback_ok) return to_fallback;
  const auto usable = [&](std::size_t r) { return replicas[r].up && !replicas[r].tried; };
  if (in.pinned && *in.pinned < replicas.size() && usable(*in.pinned)) return {choice::kind::replica, *in.pinned};
  const std::size_t n = replicas.size();
  std::optional<std::size_t> best;
  for (std::size_t k = 0; k < n; ++k) {
    const std::size_t r = (in.start + k) % n;
    if (usable(r) && (!best || replicas[r].in_flight < replicas[*best].in_flight)) best = r;
  }
  if (best) return {choice::kind::replica, *best};
  if (fallback_ok) return to_fallback;
  return {};
}

boost::container::small_vector<std::size_t, 8> router_attempt_order(std::span<const router_memory::state> states,
                                                                    std::size_t start) {
  const std::size_t n = states.size();
  boost::container::small_vector<std::size_t, 8> order;
  // Three passes: routers up (or due a probe), then slow ones, then those that failed recently.
  auto pass_of = [](router_memory::state s) {
    return s == router_memory::state::down ? 2 : s == router_memory::state::slow ? 1 : 0;
  };
  for (int pass = 0; pass < 3; ++pass)
    for (std::size_t i = 0; i < n; ++i) {
      const std::size_t r = (start + i) % n;
      if (pass_of(states[r]) == pass) order.push_back(r);
    }
  return order;
}

}  // namespace ingressd::routing
