#pragma once
// Runs the real ingressd binary as a child process for black-box tests (exit codes, signals,
// topology file reloads). Output goes to a log file the test can read. The destructor kills a
// child that is still running, so no test leaves a process behind.
#include <fcntl.h>
#include <signal.h>
#include <spawn.h>
#include <sys/wait.h>
#include <unistd.h>

#include <chrono>
#include <fstream>
#include <optional>
#include <sstream>
#include <string>
#include <thread>
#include <vector>

extern char** environ;

namespace ingressd::testing {

class child_process {
 public:
  child_process(const std::string& binary, const std::vector<std::string>& args, std::string log_path)
      : log_(std::move(log_path)) {
    std::vector<std::string> all{binary};
    all.insert(all.end(), args.begin(), args.end());
    std::vector<char*> argv;
    for (auto& a : all) argv.push_back(a.data());
    argv.push_back(nullptr);
    posix_spawn_file_actions_t fa;
    posix_spawn_file_actions_init(&fa);
    posix_spawn_file_actions_addopen(&fa, 1, log_.c_str(), O_WRONLY | O_CREAT | O_TRUNC, 0644);
    posix_spawn_file_actions_adddup2(&fa, 1, 2);
    posix_spawn_file_actions_addopen(&fa, 0, "/dev/null", O_RDONLY, 0);
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
  std::string log_;
  pid_t pid_ = -1;
  std::optional<int> status_;
};

}  // namespace ingressd::testing
