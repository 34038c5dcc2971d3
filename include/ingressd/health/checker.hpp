#pragma once
// Active health checks of data-plane replicas (contract §2 `health.*`; ray-serve-ingress.md §5.2:
// HAProxy's `option httpchk GET /-/healthz` + `http-check expect status 200` with
// `fall`/`rise`/`inter`/`fastinter`). One checker per daemon, on the control thread.
//
// Two layers:
//  - `state_machine` (state_machine.hpp): sans-I/O fall/rise counting and the next check
//    interval (unit-tested);
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
#include "ingressd/health/state_machine.hpp"

namespace ingressd::health {

/// A replica to check: `key` is the snapshot's endpoint key ("ip:port" as in the document),
/// `dial` where to connect (local_dial_host applied).
struct target_ref {
  std::string key;
  tcp::endpoint dial;
  bool grpc = false;  ///< a gRPC target: checked with the gRPC health call (grpc_probe.hpp)
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

  /// `grpc_path`: the call that checks gRPC targets (grpc.health_path).
  checker(asio::io_context& ioc, config::health_settings settings, change_callback on_change,
          std::string grpc_path = config::grpc_settings{}.health_path);
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
