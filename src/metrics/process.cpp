#include "ingressd/metrics/process.hpp"

#include <dirent.h>
#include <sys/resource.h>
#include <unistd.h>

#include <fstream>
#include <iterator>
#include <limits>
#include <stdexcept>
#include <sstream>
#include <string>
#include <vector>

namespace ingressd::metrics {

namespace {

/// Descriptors open in this process, not counting the one this count itself opens.
std::optional<std::uint64_t> count_open_fds() {
  DIR* dir = ::opendir("/proc/self/fd");
  if (!dir) return std::nullopt;
  const int own = ::dirfd(dir);
  std::uint64_t n = 0;
  while (const dirent* e = ::readdir(dir)) {
    const std::string name = e->d_name;
    if (name == "." || name == ".." || name == std::to_string(own)) continue;
    ++n;
  }
  ::closedir(dir);
  return n;
}

/// Boot time (Unix seconds) from /proc/stat: /proc/self/stat gives the start in ticks after it.
std::optional<double> boot_time() {
  std::ifstream in("/proc/stat");
  for (std::string key; in >> key;) {
    if (key == "btime") {
      double t = 0;
      if (in >> t) return t;
      return std::nullopt;
    }
    in.ignore(std::numeric_limits<std::streamsize>::max(), '\n');
  }
  return std::nullopt;
}

}  // namespace

std::optional<process_stats> read_process_stats() {
  std::ifstream in("/proc/self/stat");
  std::string line;
  if (!std::getline(in, line)) return std::nullopt;
  // The command name is in parentheses and may itself hold spaces and parentheses: the fields
  // start after the last ')'. f[0] is field 3 of proc(5), so field N is f[N - 3].
  const auto close = line.rfind(')');
  if (close == std::string::npos || close + 2 > line.size()) return std::nullopt;
  std::istringstream rest(line.substr(close + 2));
  const std::vector<std::string> f{std::istream_iterator<std::string>(rest), std::istream_iterator<std::string>()};
  if (f.size() < 22) return std::nullopt;
  const auto field = [&f](std::size_t n) { return std::stoull(f[n - 3]); };

  const auto ticks = static_cast<double>(::sysconf(_SC_CLK_TCK));
  const auto page = static_cast<std::uint64_t>(::sysconf(_SC_PAGESIZE));
  process_stats p;
  try {
    p.cpu_seconds = static_cast<double>(field(14) + field(15)) / ticks;  // utime + stime
    p.virtual_bytes = field(23);
    p.resident_bytes = field(24) * page;
    const auto boot = boot_time();
    if (!boot) return std::nullopt;
    p.start_time_seconds = *boot + static_cast<double>(field(22)) / ticks;
  } catch (const std::exception&) {  // std::stoull on a field that is not a number
    return std::nullopt;
  }
  const auto fds = count_open_fds();
  if (!fds) return std::nullopt;
  p.open_fds = *fds;
  rlimit lim{};
  if (::getrlimit(RLIMIT_NOFILE, &lim) == 0) p.max_fds = lim.rlim_cur;
  return p;
}

void render_process(text_writer& w, const process_stats& p) {
  w.family("process_cpu_seconds_total", "User and system CPU time spent, all threads, in seconds.", "counter");
  w.sample("process_cpu_seconds_total", {}, p.cpu_seconds);
  w.family("process_open_fds", "Open file descriptors (client and upstream connections, listeners, files).",
           "gauge");
  w.sample("process_open_fds", {}, p.open_fds);
  w.family("process_max_fds", "The limit on open file descriptors (soft RLIMIT_NOFILE, LimitNOFILE=).", "gauge");
  w.sample("process_max_fds", {}, p.max_fds);
  w.family("process_resident_memory_bytes", "Resident memory size in bytes.", "gauge");
  w.sample("process_resident_memory_bytes", {}, p.resident_bytes);
  w.family("process_virtual_memory_bytes", "Virtual memory size in bytes.", "gauge");
  w.sample("process_virtual_memory_bytes", {}, p.virtual_bytes);
  w.family("process_start_time_seconds", "Start time of the process, in seconds since the Unix epoch.", "gauge");
  w.sample("process_start_time_seconds", {}, p.start_time_seconds);
}

}  // namespace ingressd::metrics
