#include "ingressd/metrics/histogram.hpp"

#include <algorithm>
#include <cmath>

namespace ingressd::metrics {

bucket_layout::bucket_layout(std::initializer_list<double> seconds) {
  for (double s : seconds) {
    if (size == max_bounds) break;
    bounds_ns[size++] = static_cast<std::uint64_t>(std::llround(s * 1e9));
  }
}

const bucket_layout& request_buckets() {
  static const bucket_layout l{0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60, 120, 300, 600};
  return l;
}

const bucket_layout& ray_latency_buckets() {
  static const bucket_layout l{0.001, 0.002, 0.005, 0.01, 0.02, 0.05, 0.1, 0.2, 0.3, 0.4,
                               0.5,   1,     2,     5,    10,   60,   120, 300, 600};
  return l;
}

const bucket_layout& router_buckets() {
  static const bucket_layout l{0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10};
  return l;
}

std::uint64_t histogram::count() const noexcept {
  std::uint64_t n = 0;
  for (std::size_t i = 0; i <= layout_->size; ++i) n += buckets_[i].get();
  return n;
}

void histogram_data::add(const histogram& h) {
  if (!layout) {
    layout = &h.layout();
    buckets.assign(layout->size + 1, 0);
  }
  const std::size_t n = std::min(buckets.size(), h.layout().size + 1);
  for (std::size_t i = 0; i < n; ++i) buckets[i] += h.bucket(i);
  sum_ns += h.sum_ns();
}

std::uint64_t histogram_data::count() const noexcept {
  std::uint64_t n = 0;
  for (auto b : buckets) n += b;
  return n;
}

}  // namespace ingressd::metrics
