#pragma once
// Process figures for /metrics (descriptors, memory, CPU, start time) under the names that
// Prometheus client libraries give their process collector (process_open_fds,
// process_resident_memory_bytes, ...), so that dashboards and alerts written for those names work
// on ingressd unchanged. Read from /proc/self at scrape time: nothing is kept between scrapes.
#include <cstdint>
#include <optional>

#include "ingressd/metrics/prometheus.hpp"

namespace ingressd::metrics {

struct process_stats {
  double cpu_seconds = 0;            ///< process_cpu_seconds_total: user + system, all threads
  std::uint64_t open_fds = 0;        ///< process_open_fds
  std::uint64_t max_fds = 0;         ///< process_max_fds: the soft RLIMIT_NOFILE
  std::uint64_t resident_bytes = 0;  ///< process_resident_memory_bytes
  std::uint64_t virtual_bytes = 0;   ///< process_virtual_memory_bytes
  double start_time_seconds = 0;     ///< process_start_time_seconds: Unix time
};

/// This process's figures, or nullopt when /proc cannot be read (not mounted, not Linux).
std::optional<process_stats> read_process_stats();

/// Appends the six process_* families.
void render_process(text_writer& w, const process_stats& p);

}  // namespace ingressd::metrics
