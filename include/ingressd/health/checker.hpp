#pragma once
// Active health checks of data-plane replicas (contract §2 `health.*`; ray-serve-ingress.md §5.2:
// HAProxy's `option httpchk GET /-/healthz` + `http-check expect status 200` with
// `fall`/`rise`/`inter`/`fastinter`). One checker per daemon, on the control thread.
//
// Two layers:
//  - `state_machine`: sans-I/O fall/rise counting and the next check interval (unit-tested);
//  - `checker`: one probe loop per target on a caller-provided io_context.
//
// A probe is `GET <health.path> HTTP/1.1` with `Connection: close` on a fresh TCP connection
// (connect + request + response head within `health.timeout`). It passes on status 200 and
// fails on any other status, a connect error, a reset, a malformed response or the timeout.
//
// Targets start UP (as HAProxy does for servers at startup and after a reload), so traffic flows
// before the first check completes. A new target's first check runs after a random delay in
// [0, fast_interval], which spreads the checks of many targets added at once and still finds a
// dead new replica within about fall × fast_interval.
#include <atomic>
#include <chrono>
#include <functional>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "ingressd/config/config.hpp"
#include "ingressd/core/asio.hpp"
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

/// A replica to check: `key` is the snapshot's endpoint key ("ip:port" as in the document),
/// `dial` where to connect (local_dial_host applied).
struct target_ref {
  std::string key;
  tcp::endpoint dial;
  bool operator==(const target_ref&) const = default;
};

/// Active health checker.
///
/// Threading: the io_context must be run by one thread (the daemon's control thread); probes,
/// state changes and `on_change` run there. `set_targets`, `stop`, `is_up` and the destructor may
/// be called from any thread. After `stop()` returns on the io_context's thread no `on_change`
/// runs; called from another thread, one already running may still finish.
///
/// Lifetime: the checker owns no I/O object (each probe loop keeps its timer and socket in its
/// own coroutine frame, which the io_context owns), so it may be destroyed right after the
/// io_context stops. Call stop() (or destroy it) before the io_context is destroyed; after
/// stop() it no longer touches the io_context.
class checker {
 public:
  /// `cause`: why a target went DOWN (e.g. "health check: HTTP 503 (2 consecutive checks
  /// failed)"); empty when it came UP.
  using change_callback = std::function<void(const std::string& key, bool up, const std::string& cause)>;

  checker(asio::io_context& ioc, config::health_settings settings, change_callback on_change);
  ~checker();
  checker(const checker&) = delete;
  checker& operator=(const checker&) = delete;

  /// Replaces the set of targets: targets whose key stays keep their state (and pick up a new
  /// `dial` address at their next check), new ones start UP and get their first check within
  /// fast_interval, removed ones stop being probed at once (a probe in flight is abandoned and
  /// never reported). Duplicate keys: the first one wins. No-op after stop().
  void set_targets(std::vector<target_ref> targets);

  /// Passive health marked `key` down (the daemon has already stopped routing to it): the
  /// target counts as DOWN from now on and is checked at once, then every fast_interval, until
  /// `rise` checks pass and `on_change` reports it UP (HAProxy's `on-error mark-down`). No
  /// `on_change` for the mark itself. Unknown keys are ignored. Any thread.
  void mark_down(const std::string& key);

  /// Stops every probe loop promptly (timers and sockets are cancelled on the io_context).
  /// Idempotent.
  void stop();

  /// Whether `key` is currently UP. Unknown keys (never set or removed) are reported DOWN.
  bool is_up(const std::string& key) const;

  /// Keys currently DOWN (for admin/metrics; sorted).
  std::vector<std::string> down_keys() const;

  struct impl;

 private:
  std::shared_ptr<impl> impl_;
};

}  // namespace ingressd::health
