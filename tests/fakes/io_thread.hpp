#pragma once
// An io_context on its own thread, as the daemon's control thread runs one: for tests of
// components that run on a caller-provided io_context (topology sources, health checker).
#include <chrono>
#include <future>
#include <thread>

#include <boost/asio/executor_work_guard.hpp>
#include <boost/asio/io_context.hpp>
#include <boost/asio/post.hpp>

namespace ingressd::testing {

class io_thread {
 public:
  using steady = std::chrono::steady_clock;

  io_thread()
      : work_(boost::asio::make_work_guard(ioc_)), thread_([this] {
          ioc_.run();
          done_.set_value();
        }) {}
  ~io_thread() {
    ioc_.stop();
    if (thread_.joinable()) thread_.join();
  }
  boost::asio::io_context& ioc() { return ioc_; }
  /// Runs everything posted before this call (bounded).
  bool sync(steady::duration timeout = std::chrono::seconds(2)) {
    std::promise<void> p;
    auto f = p.get_future();
    boost::asio::post(ioc_, [&p] { p.set_value(); });
    return f.wait_for(timeout) == std::future_status::ready;
  }
  /// Releases the work guard; true when run() returns by itself within `timeout`, i.e. nothing
  /// (no timer, no socket operation) is pending any more.
  bool drains_within(steady::duration timeout) {
    work_.reset();
    return finished_.wait_for(timeout) == std::future_status::ready;
  }

 private:
  boost::asio::io_context ioc_;
  boost::asio::executor_work_guard<boost::asio::io_context::executor_type> work_;
  std::promise<void> done_;
  std::future<void> finished_ = done_.get_future();
  std::thread thread_;
};

}  // namespace ingressd::testing
