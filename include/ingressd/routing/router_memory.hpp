#pragma once
// Per-worker memory of routers that gave no reply, so that a dead or hung router costs at most
// an occasional probe instead of router.timeout on every request (issue #3, point 3), and of
// routers that keep losing hedged races (issue #18), so that an always-slower router is asked
// after its peers. Ray's Lua
// has no such memory; this is where ingressd deliberately does better. Sans-I/O, injected time.
#include <chrono>
#include <cstddef>
#include <string>
#include <unordered_map>

namespace ingressd::routing {

class router_memory {
 public:
  using clock = std::chrono::steady_clock;
  /// Back-off after the first failure, doubled per further failure up to `max_backoff`.
  explicit router_memory(clock::duration first_backoff = std::chrono::milliseconds(500),
                         clock::duration max_backoff = std::chrono::seconds(10))
      : first_(first_backoff), max_(max_backoff) {}

  /// State of a router for ordering the attempts of one request.
  enum class state {
    up,     ///< no recent failure: try in cursor order
    slow,   ///< lost slow_after hedged races in a row: try after the routers that are up (a while)
    probe,  ///< failed before, back-off elapsed: one request may try it (with a short timeout)
    down,   ///< failed recently: try only after every other router of the pool
  };
  /// Races a router loses in a row before it is slow, and how long it then stays slow. Three in a
  /// row is not bad luck for a router that stalls now and then (a 5 % stall rate does it once in
  /// 8000 calls), but it is what a router that is always slower than its peers does at once.
  static constexpr unsigned slow_after = 3;
  static constexpr clock::duration slow_for = std::chrono::seconds(1);
  state get(const std::string& key, clock::time_point now) const;
  /// The router gave no reply: start or extend its back-off.
  void failed(const std::string& key, clock::time_point now);
  /// The router replied: forget it.
  void replied(const std::string& key) { entries_.erase(key); }
  /// The router's call was cancelled because a hedged call to another router answered first
  /// (router.hedge). A router that keeps losing is asked after the others for slow_for: a router
  /// that is always slower then costs one hedged call a while instead of half of all requests.
  void lost(const std::string& key, clock::time_point now);
  /// A probe was handed out: others keep treating the router as down until it answers or fails.
  void probing(const std::string& key, clock::time_point now);
  std::size_t size() const { return entries_.size(); }
  /// Drops routers no longer in any pool (topology change).
  template <class Keep>
  void retain(Keep keep) {
    std::erase_if(entries_, [&](const auto& kv) { return !keep(kv.first); });
  }

 private:
  struct entry {
    unsigned failures = 0;
    clock::time_point retry_at{};
    unsigned losses = 0;  ///< races lost in a row
    clock::time_point slow_until{};
  };
  clock::duration first_, max_;
  std::unordered_map<std::string, entry> entries_;
};

}  // namespace ingressd::routing
