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

/// One routing decision's hedge race (router.hedge), without I/O. The decision's call to a router
/// (the first call) may be joined, once it is late, by the same call to the router the decision
/// would fail over to next (the hedge); a decision hedges at most once. The first 200 reply that
/// names a replica wins and the other call is cancelled; a reply that names none counts only when
/// the other call gave nothing better. The session reports the events and does what it is told,
/// so that every order of events is decided here and unit-tested (tests/unit/hedge_test.cpp).
class hedge_race {
 public:
  using clock = std::chrono::steady_clock;
  enum class call : std::uint8_t { first, hedge };
  /// What the hedge's due time did.
  enum class launch : std::uint8_t { none, refused, send };
  /// Whose reply the decision takes once its calls have ended.
  enum class taken : std::uint8_t {
    hedge,          ///< the hedge won: its reply names the replica
    first,          ///< the first call's reply (pinned, or the reason it names none)
    hedge_failure,  ///< the first call gave no reply; the hedge's reply names none: its reason
    next_router,    ///< no reply from either: fail over to the next router
  };

  /// Whether a hedge may still be planned: none has been sent or refused yet.
  bool may_plan() const noexcept { return state_ == state::idle || state_ == state::planned; }
  /// The coming first call would be hedged to pool index `router`.
  void plan(std::size_t router) noexcept {
    if (may_plan()) state_ = state::planned, router_ = router;
  }
  /// The first call ended before its hedge was due: nothing is planned for the next one yet.
  void unplan() noexcept {
    if (state_ == state::planned) state_ = state::idle;
  }
  /// The hedge's delay has passed and the first call has not replied: send it if the worker's
  /// `budget` allows (one hedge taken from it), unless a reply was already taken.
  launch due(hedge_budget& budget, clock::time_point now) noexcept {
    if (state_ != state::planned || settled_) return launch::none;
    if (!budget.try_hedge(now)) {
      state_ = state::refused;
      return launch::refused;
    }
    state_ = state::launched;
    return launch::send;
  }
  /// A call replied; `pinned`: its reply names a replica. Returns the call to cancel: the other
  /// one, when this reply is the first pinned one.
  std::optional<call> replied(call who, bool pinned) noexcept {
    if (!pinned || settled_) return std::nullopt;
    settled_ = true;
    won_ = who == call::hedge;
    if (state_ != state::launched) return std::nullopt;
    return who == call::hedge ? call::first : call::hedge;
  }
  /// The first call ended. True once per race, when a hedge went out: the caller must wait for
  /// the hedge call to end and account for it before deciding.
  bool first_ended() noexcept {
    if (state_ != state::launched || joined_) return false;
    joined_ = true;
    return true;
  }
  /// Whose reply is taken, after first_ended() (and the hedge's end, when it asked for it);
  /// `first_replied`, `hedge_replied`: whether each call got a reply at all.
  taken decide(bool first_replied, bool hedge_replied) const noexcept {
    if (won_) return taken::hedge;
    if (first_replied) return taken::first;
    if (launched() && hedge_replied) return taken::hedge_failure;
    return taken::next_router;
  }

  bool launched() const noexcept { return state_ == state::launched; }
  /// A reply was taken: a hedge that has not started yet need not go out.
  bool settled() const noexcept { return settled_; }
  /// The pool index the hedge asks (valid once planned).
  std::size_t router() const noexcept { return router_; }

 private:
  enum class state : std::uint8_t { idle, planned, refused, launched };
  state state_ = state::idle;
  std::size_t router_ = 0;
  bool settled_ = false;  // a pinned reply was taken
  bool won_ = false;      // ... and it was the hedge's
  bool joined_ = false;   // first_ended() asked for the hedge's end
};

/// The delay after which a call to an app's router pool of `pool_size` is hedged, or nullopt
/// when it is not: router.hedge off (`automatic` false and `fixed` zero), a budget of 0, or a pool
/// of one router (there is no other router to ask).
std::optional<std::chrono::steady_clock::duration> hedge_after(bool automatic, std::chrono::steady_clock::duration fixed,
                                                               unsigned budget_permille, std::size_t pool_size,
                                                               const hedge_delay& estimate) noexcept;

}  // namespace ingressd::routing
