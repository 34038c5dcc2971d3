#pragma once
// Fixed-bucket histograms (Prometheus semantics: bucket `le` = upper bound, inclusive).
//
// `histogram` is written by one thread (its worker) and read by any: each bucket and the sum are
// single-writer counters, observe() is a short linear scan plus two relaxed stores. Buckets are
// kept non-cumulative; `histogram_data` sums the histograms of all workers at scrape time and
// the exposition makes them cumulative, so `_count` always equals the `+Inf` bucket.
#include <array>
#include <chrono>
#include <cstddef>
#include <cstdint>
#include <initializer_list>
#include <vector>

#include "ingressd/metrics/counter.hpp"

namespace ingressd::metrics {

/// Upper bounds of a histogram's finite buckets, increasing, in nanoseconds (values are
/// durations); the `+Inf` bucket is implicit.
struct bucket_layout {
  static constexpr std::size_t max_bounds = 20;
  std::array<std::uint64_t, max_bounds> bounds_ns{};
  std::size_t size = 0;

  /// Bounds in seconds, increasing; at most max_bounds of them (extra ones are ignored).
  bucket_layout(std::initializer_list<double> seconds);
  double bound_seconds(std::size_t i) const { return static_cast<double>(bounds_ns[i]) / 1e9; }
};

/// End-to-end request durations and time to first byte: 5 ms .. 10 min (LLM streams are long).
const bucket_layout& request_buckets();
/// Router decisions: 0.5 ms .. 10 s.
const bucket_layout& router_buckets();
/// Ray Serve's proxy latency buckets (ray python/ray/serve/_private/constants.py
/// DEFAULT_LATENCY_BUCKET_MS: 1 ms .. 600 s), exposed in milliseconds.
const bucket_layout& ray_latency_buckets();

class histogram {
 public:
  explicit histogram(const bucket_layout& layout) noexcept : layout_(&layout) {}
  histogram(const histogram&) = delete;
  histogram& operator=(const histogram&) = delete;

  /// Owning thread only. Negative durations count as 0.
  void observe(std::chrono::nanoseconds d) noexcept {
    const std::uint64_t ns = d.count() < 0 ? 0 : static_cast<std::uint64_t>(d.count());
    std::size_t i = 0;
    while (i < layout_->size && ns > layout_->bounds_ns[i]) ++i;
    buckets_[i].add();
    sum_ns_.add(ns);
  }

  const bucket_layout& layout() const noexcept { return *layout_; }
  /// Non-cumulative count of bucket `i`; i == layout().size is the `+Inf` bucket.
  std::uint64_t bucket(std::size_t i) const noexcept { return buckets_[i].get(); }
  std::uint64_t sum_ns() const noexcept { return sum_ns_.get(); }
  std::uint64_t count() const noexcept;

 private:
  const bucket_layout* layout_;
  std::array<counter, bucket_layout::max_bounds + 1> buckets_;
  counter sum_ns_;
};

/// Histograms of one series summed over workers, for exposition.
struct histogram_data {
  const bucket_layout* layout = nullptr;
  std::vector<std::uint64_t> buckets;  ///< non-cumulative, layout->size + 1 entries
  std::uint64_t sum_ns = 0;

  histogram_data() = default;
  explicit histogram_data(const bucket_layout& l) : layout(&l), buckets(l.size + 1, 0) {}
  /// Adds `h` (same layout expected; the first add sets it).
  void add(const histogram& h);
  std::uint64_t count() const noexcept;
};

}  // namespace ingressd::metrics
