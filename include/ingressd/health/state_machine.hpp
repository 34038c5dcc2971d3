#pragma once
// The fall/rise counting of active health checks (HAProxy semantics; contract §2 `health.*`).
// Sans-I/O: the checker (checker.hpp) feeds it results and asks it when to check next.
#include <optional>

#include "ingressd/config/config.hpp"
#include "ingressd/core/units.hpp"

namespace ingressd::health {

/// The fall/rise counting of one target (HAProxy semantics):
///  - UP → DOWN after `fall` consecutive failed checks; a success while UP clears the count;
///  - DOWN → UP after `rise` consecutive passed checks; a failure while DOWN clears the count.
/// So alternating results never change the state (for fall, rise >= 2).
/// `fall` and `rise` of 0 are treated as 1.
class state_machine {
 public:
  state_machine(unsigned fall, unsigned rise, duration interval, duration fast_interval, bool up = true);
  explicit state_machine(const config::health_settings& s, bool up = true);

  /// Records one check result. Returns the new state (true = UP) when this result changed it,
  /// nullopt otherwise.
  std::optional<bool> record(bool ok);

  /// The delay before the next check: `interval` while steadily UP, `fast_interval` while
  /// transitioning (UP with failures counted, DOWN with successes counted) or DOWN.
  duration next_interval() const;

  bool up() const { return up_; }
  /// Passive health marked the target down: DOWN now, and `rise` passed checks bring it back.
  void force_down() {
    up_ = false;
    streak_ = 0;
  }
  /// UP with at least one failure counted, or DOWN with at least one success counted.
  bool transitioning() const { return streak_ > 0; }
  /// Consecutive results against the current state (failures while UP, successes while DOWN).
  unsigned streak() const { return streak_; }

 private:
  unsigned fall_;
  unsigned rise_;
  duration interval_;
  duration fast_interval_;
  bool up_;
  unsigned streak_ = 0;
};

}  // namespace ingressd::health
