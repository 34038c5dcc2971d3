#pragma once
// Runs the real ingressd binary as a child process for black-box tests (exit codes, signals,
// topology file reloads, resource limits). Output goes to a log file the test can read. The
// destructor kills a child that is still running, so no test leaves a process behind.
#include <fcntl.h>
#include <signal.h>
#include <spawn.h>
#include <sys/resource.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <filesystem>
#include <fstream>
#include <iterator>
#include <optional>
#include <sstream>
#include <string>
#include <thread>
#include <vector>

extern char** environ;

namespace ingressd::testing {

/// How to start the child, beyond its command line.
struct spawn_options {
  /// RLIMIT_NOFILE (soft and hard) set in the child before exec. The child then also starts with
  /// only descriptors 0-2, so that the limit means the same in every run.
  std::optional<rlim_t> max_open_files;
};

class child_process {
 public:
  child_process(const std::string& binary, const std::vector<std::string>& args, std::string log_path,
                spawn_options opts = {})
      : log_(std::move(log_path)) {
    std::vector<std::string> all{binary};
    all.insert(all.end(), args.begin(), args.end());
    std::vector<char*> argv;
    for (auto& a : all) argv.push_back(a.data());
    argv.push_back(nullptr);
    if (opts.max_open_files) {
      spawn_limited(binary, argv, *opts.max_open_files);
      return;
    }
    posix_spawn_file_actions_t fa;
    posix_spawn_file_actions_init(&fa);
    posix_spawn_file_actions_addopen(&fa, 1, log_.c_str(), O_WRONLY | O_CREAT | O_TRUNC, 0644);
    posix_spawn_file_actions_adddup2(&fa, 1, 2);
    posix_spawn_file_actions_addopen(&fa, 0, "/dev/null", O_RDONLY, 0);
    // Nothing else of the test's: a fake's listening socket inherited by the child would stay open
    // after the fake stops, and connects to it would hang in its backlog instead of being refused.
    posix_spawn_file_actions_addclosefrom_np(&fa, 3);
    if (posix_spawn(&pid_, binary.c_str(), &fa, nullptr, argv.data(), environ) != 0) pid_ = -1;
    posix_spawn_file_actions_destroy(&fa);
  }
  ~child_process() {
    if (pid_ > 0 && !status_) {
      ::kill(pid_, SIGKILL);
      int st = 0;
      ::waitpid(pid_, &st, 0);
    }
  }
  bool started() const { return pid_ > 0; }
  pid_t pid() const { return pid_; }
  void signal(int sig) const {
    if (pid_ > 0 && !status_) ::kill(pid_, sig);
  }
  /// The exit code once the child has exited within `timeout` (128 + signal if killed).
  std::optional<int> wait(std::chrono::milliseconds timeout) {
    const auto deadline = std::chrono::steady_clock::now() + timeout;
    while (!status_) {
      int st = 0;
      pid_t r = ::waitpid(pid_, &st, WNOHANG);
      if (r == pid_) {
        status_ = WIFEXITED(st) ? WEXITSTATUS(st) : 128 + WTERMSIG(st);
        break;
      }
      if (std::chrono::steady_clock::now() >= deadline) return std::nullopt;
      // Polling a child's exit status has no event to wait on without a SIGCHLD handler.
      std::this_thread::sleep_for(std::chrono::milliseconds(5));
    }
    return status_;
  }
  std::string output() const {
    std::ifstream in(log_);
    std::ostringstream ss;
    ss << in.rdbuf();
    return ss.str();
  }

 private:
  /// posix_spawn cannot set a resource limit: fork, and in the child (of a threaded parent)
  /// make only async-signal-safe calls before exec.
  void spawn_limited(const std::string& binary, std::vector<char*>& argv, rlim_t max_files) {
    const int log_fd = ::open(log_.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
    const int null_fd = ::open("/dev/null", O_RDONLY | O_CLOEXEC);
    if (log_fd < 0 || null_fd < 0) {
      if (log_fd >= 0) ::close(log_fd);
      if (null_fd >= 0) ::close(null_fd);
      return;
    }
    const rlimit lim{max_files, max_files};
    pid_ = ::fork();
    if (pid_ == 0) {
      if (::dup2(null_fd, 0) < 0 || ::dup2(log_fd, 1) < 0 || ::dup2(log_fd, 2) < 0) ::_exit(127);
      ::close_range(3, ~0U, 0);
      if (::setrlimit(RLIMIT_NOFILE, &lim) != 0) ::_exit(127);
      ::execve(binary.c_str(), argv.data(), environ);
      ::_exit(127);
    }
    ::close(log_fd);
    ::close(null_fd);
  }

  std::string log_;
  pid_t pid_ = -1;
  std::optional<int> status_;
};

// --- What /proc says about a (child) process ---------------------------------------------------

/// CPU time (user + system) the process has used so far (/proc/<pid>/stat, clock-tick resolution).
inline std::chrono::duration<double> cpu_time(pid_t pid) {
  std::ifstream in("/proc/" + std::to_string(pid) + "/stat");
  std::string line;
  std::getline(in, line);
  // Fields after the command name, which is in parentheses and may itself contain spaces.
  std::istringstream rest(line.substr(line.rfind(')') + 2));
  std::vector<std::string> f{std::istream_iterator<std::string>(rest), std::istream_iterator<std::string>()};
  if (f.size() < 13) return std::chrono::duration<double>(-1);
  const double ticks = std::stod(f[11]) + std::stod(f[12]);  // utime, stime (fields 14 and 15)
  return std::chrono::duration<double>(ticks / static_cast<double>(::sysconf(_SC_CLK_TCK)));
}

/// The process's open descriptor numbers (/proc/<pid>/fd).
inline std::vector<int> open_fds(pid_t pid) {
  std::vector<int> out;
  std::error_code ec;
  for (const auto& e : std::filesystem::directory_iterator("/proc/" + std::to_string(pid) + "/fd", ec))
    out.push_back(std::stoi(e.path().filename().string()));
  return out;
}

/// How many descriptors the process has open, not counting connections accepted on local TCP
/// port `port` (say the admin listener's, which a test's own scrapes open and close): the sockets
/// in /proc/<pid>/fd matched to /proc/<pid>/net/tcp by inode.
inline std::size_t open_fds_except_accepted_on(pid_t pid, std::uint16_t port) {
  const std::string proc = "/proc/" + std::to_string(pid);
  std::vector<std::string> skip;
  std::ifstream tcp(proc + "/net/tcp");
  std::string line;
  std::getline(tcp, line);  // header
  while (std::getline(tcp, line)) {
    std::istringstream f(line);
    std::string sl, local, remote, state, queues, timer, retransmits, uid, timeout, inode;
    f >> sl >> local >> remote >> state >> queues >> timer >> retransmits >> uid >> timeout >> inode;
    const auto colon = local.find(':');
    if (colon == std::string::npos || state == "0A") continue;  // 0A: LISTEN
    if (std::stoul(local.substr(colon + 1), nullptr, 16) == port) skip.push_back("socket:[" + inode + "]");
  }
  std::size_t n = 0;
  std::error_code ec;
  for (const auto& e : std::filesystem::directory_iterator(proc + "/fd", ec)) {
    const auto target = std::filesystem::read_symlink(e.path(), ec).string();
    if (std::find(skip.begin(), skip.end(), target) == skip.end()) ++n;
  }
  return n;
}

/// Whether the process has a handler installed for `sig` (SigCgt in /proc/<pid>/status).
inline bool catches_signal(pid_t pid, int sig) {
  std::ifstream in("/proc/" + std::to_string(pid) + "/status");
  for (std::string line; std::getline(in, line);)
    if (line.rfind("SigCgt:", 0) == 0) return (std::stoull(line.substr(7), nullptr, 16) >> (sig - 1)) & 1;
  return false;
}

/// Resident set size in KiB (VmRSS in /proc/<pid>/status), or -1.
inline long rss_kib(pid_t pid) {
  std::ifstream in("/proc/" + std::to_string(pid) + "/status");
  for (std::string line; std::getline(in, line);)
    if (line.rfind("VmRSS:", 0) == 0) return std::stol(line.substr(6));
  return -1;
}

}  // namespace ingressd::testing
