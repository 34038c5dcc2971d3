#pragma once
// Hedged router calls (router.hedge, router.hedge_budget): when to send the same routing call to a
// second router, and how often a worker may. Sans-I/O, the clock injected; one of each per worker
// (the delay per app: its routers' latency is its own).
#include <array>
#include <chrono>
#include <cstddef>
#include <cstdint>
#include <optional>

namespace ingressd::routing {

/// router.hedge: auto. A high percentile of the app's recent router latencies: a router that
/// usually answers in 300 us is hedged after 1 ms, not after router.timeout.
class hedge_delay {
 public:
  using clock = std::chrono::steady_clock;
  static constexpr clock::duration min_delay = std::chrono::milliseconds(1);
  static constexpr clock::duration max_delay = std::chrono::milliseconds(50);
  /// Replies remembered; the delay is recomputed every `recompute_every` replies.
  static constexpr std::size_t window = 128;
  static constexpr std::size_t recompute_every = 16;

  /// A reply came after `latency` (one router call, connect included).
  void record(clock::duration latency) noexcept;
  /// Twice the 90th percentile of the remembered latencies, within [min_delay, max_delay];
  /// max_delay until recompute_every replies were seen. Why the 90th: the share of calls that end
  /// up hedged is about the share slower than the delay, which the budget (10 %) allows.
  clock::duration delay() const noexcept { return delay_; }

 private:
  std::array<std::uint32_t, window> us_{};  // latencies in microseconds (ring)
  std::size_t n_ = 0;                       // replies seen (saturates at window)
  std::size_t next_ = 0;
  std::size_t since_ = 0;
  clock::duration delay_ = max_delay;
};

/// router.hedge_budget: a worker may hedge at most `permille`/1000 of its router calls over a
/// sliding window (10 buckets of a tenth of `span`).
class hedge_budget {
 public:
  using clock = std::chrono::steady_clock;
  explicit hedge_budget(unsigned permille = 100, clock::duration span = std::chrono::seconds(10)) noexcept
      : permille_(permille), bucket_span_(span / buckets) {}
  void set_share(unsigned permille) noexcept { permille_ = permille; }
  /// One routing call started (hedged or not).
  void call(clock::time_point now) noexcept;
  /// Takes one hedge when that keeps the hedges within the share of the window's calls.
  bool try_hedge(clock::time_point now) noexcept;

 private:
  static constexpr std::size_t buckets = 10;
  void advance(clock::time_point now) noexcept;
  unsigned permille_;
  clock::duration bucket_span_;
  std::array<std::uint32_t, buckets> calls_{}, hedges_{};
  std::uint64_t calls_total_ = 0, hedges_total_ = 0;  // over the window
  std::int64_t current_ = -1;                           // index of the newest bucket since the epoch
};

/// The delay after which a call to an app's router pool of `pool_size` is hedged, or nullopt
/// when it is not: router.hedge off (`automatic` false and `fixed` zero), a budget of 0, or a pool
/// of one router (there is no other router to ask).
std::optional<std::chrono::steady_clock::duration> hedge_after(bool automatic, std::chrono::steady_clock::duration fixed,
                                                               unsigned budget_permille, std::size_t pool_size,
                                                               const hedge_delay& estimate) noexcept;

}  // namespace ingressd::routing
