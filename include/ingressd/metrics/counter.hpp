#pragma once
// Single-writer counters and gauges. A worker owns its metrics and is the only thread that writes
// them; the admin thread reads them on scrape. A relaxed load + store is a plain add on x86 (no
// locked instruction, no shared cache line between workers) yet race-free for TSan.
#include <atomic>
#include <cstdint>

namespace ingressd::metrics {

/// A single-writer counter: only the owning thread calls add()/sub(); any thread may call get().
struct counter {
  std::atomic<std::uint64_t> v{0};
  void add(std::uint64_t n = 1) noexcept {
    v.store(v.load(std::memory_order_relaxed) + n, std::memory_order_relaxed);
  }
  void sub(std::uint64_t n = 1) noexcept {
    v.store(v.load(std::memory_order_relaxed) - n, std::memory_order_relaxed);
  }
  std::uint64_t get() const noexcept { return v.load(std::memory_order_relaxed); }
};

}  // namespace ingressd::metrics
