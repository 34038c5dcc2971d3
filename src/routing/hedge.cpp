#include "ingressd/routing/hedge.hpp"

#include <algorithm>

namespace ingressd::routing {

void hedge_delay::record(clock::duration latency) noexcept {
  const auto us = std::chrono::duration_cast<std::chrono::microseconds>(latency).count();
  us_[next_] = static_cast<std::uint32_t>(std::clamp<std::int64_t>(us, 0, UINT32_MAX));
  next_ = (next_ + 1) % window;
  n_ = std::min(n_ + 1, window);
  if (++since_ < recompute_every) return;
  since_ = 0;
  std::array<std::uint32_t, window> sorted = us_;
  const auto end = sorted.begin() + static_cast<std::ptrdiff_t>(n_);
  const auto p90 = sorted.begin() + static_cast<std::ptrdiff_t>((n_ * 9) / 10);
  std::nth_element(sorted.begin(), p90, end);
  delay_ = std::clamp<clock::duration>(std::chrono::microseconds(2 * std::uint64_t{*p90}), min_delay, max_delay);
}

void hedge_budget::advance(clock::time_point now) noexcept {
  const std::int64_t index = now.time_since_epoch() / bucket_span_;
  if (current_ < 0) current_ = index;
  // Buckets that fell out of the window are emptied, their counts taken off the totals.
  for (std::int64_t i = current_ + 1; i <= index && i <= current_ + static_cast<std::int64_t>(buckets); ++i) {
    auto& c = calls_[static_cast<std::size_t>(i) % buckets];
    auto& h = hedges_[static_cast<std::size_t>(i) % buckets];
    calls_total_ -= c;
    hedges_total_ -= h;
    c = h = 0;
  }
  current_ = std::max(current_, index);
}

void hedge_budget::call(clock::time_point now) noexcept {
  advance(now);
  ++calls_[static_cast<std::size_t>(current_) % buckets];
  ++calls_total_;
}

bool hedge_budget::try_hedge(clock::time_point now) noexcept {
  advance(now);
  if ((hedges_total_ + 1) * 1000 > calls_total_ * permille_) return false;
  ++hedges_[static_cast<std::size_t>(current_) % buckets];
  ++hedges_total_;
  return true;
}

std::optional<std::chrono::steady_clock::duration> hedge_after(bool automatic, std::chrono::steady_clock::duration fixed,
                                                               unsigned budget_permille, std::size_t pool_size,
                                                               const hedge_delay& estimate) noexcept {
  if (pool_size < 2 || budget_permille == 0) return std::nullopt;
  if (automatic) return estimate.delay();
  if (fixed > std::chrono::steady_clock::duration::zero()) return fixed;
  return std::nullopt;
}

}  // namespace ingressd::routing
