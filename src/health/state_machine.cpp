// Active health checks: the fall/rise state machine (include/ingressd/health/state_machine.hpp).
#include "ingressd/health/state_machine.hpp"

#include <algorithm>

namespace ingressd::health {

state_machine::state_machine(unsigned fall, unsigned rise, duration interval, duration fast_interval, bool up)
    : fall_(std::max(1u, fall)),
      rise_(std::max(1u, rise)),
      interval_(interval),
      fast_interval_(fast_interval),
      up_(up) {}

state_machine::state_machine(const config::health_settings& s, bool up)
    : state_machine(s.fall, s.rise, s.interval, s.fast_interval, up) {}

std::optional<bool> state_machine::record(bool ok) {
  if (ok == up_) {  // a result that agrees with the current state clears any pending streak
    streak_ = 0;
    return std::nullopt;
  }
  ++streak_;
  if (streak_ < (up_ ? fall_ : rise_)) return std::nullopt;
  up_ = !up_;
  streak_ = 0;
  return up_;
}

duration state_machine::next_interval() const {
  return (up_ && streak_ == 0) ? interval_ : fast_interval_;
}

}  // namespace ingressd::health
