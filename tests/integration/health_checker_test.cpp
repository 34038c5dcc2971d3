// health::checker against fake replicas: fall/rise transitions, dead ports, target set changes,
// prompt stop. The checker runs on its own io_context thread.
#include <chrono>
#include <condition_variable>
#include <future>
#include <mutex>
#include <string>
#include <thread>
#include <utility>
#include <vector>

#include <boost/asio/executor_work_guard.hpp>
#include <boost/asio/post.hpp>
#include <gtest/gtest.h>

#include "fakes/io_thread.hpp"
#include "ingressd/demo/replica_server.hpp"
#include "ingressd/health/checker.hpp"

namespace ingressd::health {
namespace {

using namespace std::chrono_literals;
using steady = std::chrono::steady_clock;

using ingressd::testing::io_thread;

class transitions {
 public:
  checker::change_callback callback() {
    return [this](const std::string& key, bool up, const std::string& cause) {
      std::lock_guard lock(mu_);
      events_.emplace_back(key, up);
      causes_.push_back(cause);
      cv_.notify_all();
    };
  }
  bool wait(std::size_t n, steady::duration timeout = 5s) {
    std::unique_lock lock(mu_);
    return cv_.wait_for(lock, timeout, [&] { return events_.size() >= n; });
  }
  std::vector<std::pair<std::string, bool>> events() {
    std::lock_guard lock(mu_);
    return events_;
  }
  std::vector<std::string> causes() {
    std::lock_guard lock(mu_);
    return causes_;
  }

 private:
  std::mutex mu_;
  std::condition_variable cv_;
  std::vector<std::pair<std::string, bool>> events_;
  std::vector<std::string> causes_;
};

config::health_settings fast_settings(unsigned fall = 3, unsigned rise = 2) {
  config::health_settings s;
  s.interval = 50ms;
  s.fast_interval = 30ms;
  s.fall = fall;
  s.rise = rise;
  s.timeout = 300ms;
  return s;
}

std::string key_of(const demo::replica_server& r) { return r.bind_ip() + ":" + std::to_string(r.port()); }

target_ref target_of(const demo::replica_server& r) { return {key_of(r), r.endpoint()}; }

bool wait_probes(const demo::replica_server& r, std::size_t n, steady::duration timeout = 3s) {
  const auto until = steady::now() + timeout;
  while (r.probe_count() < n) {
    if (steady::now() > until) return false;
    std::this_thread::sleep_for(5ms);  // polling a counter, not synchronising on time
  }
  return true;
}

std::uint16_t dead_port() {
  asio::io_context tmp;
  tcp::acceptor a(tmp, tcp::endpoint(asio::ip::make_address("127.0.0.1"), 0));
  return a.local_endpoint().port();
}

TEST(HealthChecker, TargetsStartUpAndHealthyReplicaStaysUp) {
  demo::replica_server replica({});
  io_thread io;
  transitions tr;
  checker hc(io.ioc(), fast_settings(), tr.callback());
  hc.set_targets({target_of(replica)});
  EXPECT_TRUE(hc.is_up(key_of(replica)));  // before any check
  ASSERT_TRUE(wait_probes(replica, 3));
  EXPECT_TRUE(hc.is_up(key_of(replica)));
  EXPECT_TRUE(tr.events().empty());
  EXPECT_FALSE(hc.is_up("10.9.9.9:1"));  // unknown key
  const auto reqs = replica.requests();
  EXPECT_TRUE(reqs.empty());  // probes are counted, not recorded
  hc.stop();
  EXPECT_TRUE(io.drains_within(2s));
}

TEST(HealthChecker, UnhealthyReplicaGoesDownAfterFallThenUpAfterRise) {
  demo::replica_server replica({});
  io_thread io;
  transitions tr;
  const auto s = fast_settings(/*fall=*/3, /*rise=*/2);
  checker hc(io.ioc(), s, tr.callback());
  hc.set_targets({target_of(replica)});
  ASSERT_TRUE(wait_probes(replica, 1));

  const auto before_down = replica.probe_count();
  replica.set_healthy(false);
  ASSERT_TRUE(tr.wait(1));
  // `fall` failed checks (one in flight when the switch happened may have read either state).
  EXPECT_GE(replica.probe_count() - before_down, s.fall - 1);
  EXPECT_EQ(tr.events()[0], std::make_pair(key_of(replica), false));
  EXPECT_FALSE(hc.is_up(key_of(replica)));
  // Why, for /topology: the failing check and the count.
  EXPECT_EQ(tr.causes()[0], "health check: HTTP 503 on /-/healthz (3 consecutive checks failed)");

  // Still down while failing: no more transitions.
  const auto down_probes = replica.probe_count();
  ASSERT_TRUE(wait_probes(replica, down_probes + 3));
  EXPECT_EQ(tr.events().size(), 1u);

  const auto before_up = replica.probe_count();
  replica.set_healthy(true);
  ASSERT_TRUE(tr.wait(2));
  EXPECT_GE(replica.probe_count() - before_up, s.rise - 1);
  EXPECT_EQ(tr.events()[1], std::make_pair(key_of(replica), true));
  EXPECT_TRUE(hc.is_up(key_of(replica)));
  EXPECT_EQ(tr.events().size(), 2u);
}

TEST(HealthChecker, MarkDownIsCheckedAtOnceAndComesBackAfterRise) {
  // Passive health marked a healthy replica down: the checker must count it DOWN and check it
  // now (not after `interval`), so that `rise` passed checks report it UP again.
  demo::replica_server replica({});
  io_thread io;
  transitions tr;
  auto s = fast_settings(/*fall=*/2, /*rise=*/2);
  s.interval = 1h;  // only a mark_down can bring the next check forward
  checker hc(io.ioc(), s, tr.callback());
  hc.set_targets({target_of(replica)});
  ASSERT_TRUE(wait_probes(replica, 1));  // the first check (within fast_interval of the start)
  const auto before = replica.probe_count();
  hc.mark_down(key_of(replica));
  hc.mark_down("10.9.9.9:1");  // unknown: ignored
  ASSERT_TRUE(tr.wait(1));
  EXPECT_EQ(tr.events()[0], std::make_pair(key_of(replica), true));
  EXPECT_TRUE(tr.causes()[0].empty());
  // `rise` passed checks (one in flight when the mark came may count as the first).
  EXPECT_GE(replica.probe_count() - before, s.rise - 1);
  EXPECT_TRUE(hc.is_up(key_of(replica)));
  EXPECT_EQ(tr.events().size(), 1u);  // the mark itself is not reported
}

TEST(HealthChecker, DeadPortGoesDown) {
  io_thread io;
  transitions tr;
  checker hc(io.ioc(), fast_settings(2, 2), tr.callback());
  const tcp::endpoint ep(asio::ip::make_address("127.0.0.1"), dead_port());
  const std::string key = "127.0.0.1:" + std::to_string(ep.port());
  hc.set_targets({{key, ep}});
  ASSERT_TRUE(tr.wait(1));
  EXPECT_EQ(tr.events()[0], std::make_pair(key, false));
  EXPECT_FALSE(hc.is_up(key));
  EXPECT_EQ(hc.down_keys(), std::vector<std::string>{key});
}

TEST(HealthChecker, UnansweredCheckTimesOutAndCounts) {
  // A listener that never accepts: connect succeeds (backlog), no response ever comes.
  asio::io_context tmp;
  tcp::acceptor silent(tmp, tcp::endpoint(asio::ip::make_address("127.0.0.1"), 0));
  io_thread io;
  transitions tr;
  auto s = fast_settings(2, 2);
  s.timeout = 100ms;
  checker hc(io.ioc(), s, tr.callback());
  const auto ep = silent.local_endpoint();
  hc.set_targets({{"silent", ep}});
  ASSERT_TRUE(tr.wait(1, 3s));
  EXPECT_EQ(tr.events()[0], std::make_pair(std::string("silent"), false));
}

TEST(HealthChecker, RemovedTargetStopsBeingProbedAndKeptTargetKeepsState) {
  demo::replica_server a({.name = "a"});
  demo::replica_server b({.name = "b"});
  io_thread io;
  transitions tr;
  checker hc(io.ioc(), fast_settings(2, 2), tr.callback());
  hc.set_targets({target_of(a), target_of(b)});
  a.set_healthy(false);
  ASSERT_TRUE(tr.wait(1));
  EXPECT_EQ(tr.events()[0], std::make_pair(key_of(a), false));
  ASSERT_TRUE(wait_probes(b, 2));

  // a stays (still down, no new transition), b goes.
  hc.set_targets({target_of(a)});
  EXPECT_FALSE(hc.is_up(key_of(b)));
  ASSERT_TRUE(io.sync());  // the cancellation ran
  ASSERT_TRUE(wait_probes(a, a.probe_count() + 2));
  const auto b_probes = b.probe_count();
  ASSERT_TRUE(wait_probes(a, a.probe_count() + 5));  // several check rounds later ...
  EXPECT_EQ(b.probe_count(), b_probes);             // ... b was not probed again
  EXPECT_FALSE(hc.is_up(key_of(a)));
  EXPECT_EQ(tr.events().size(), 1u);

  // b re-added: a new target, UP again.
  hc.set_targets({target_of(a), target_of(b)});
  EXPECT_TRUE(hc.is_up(key_of(b)));
  ASSERT_TRUE(wait_probes(b, b_probes + 1));
}

TEST(HealthChecker, StopEndsEverythingPromptly) {
  asio::io_context tmp;
  tcp::acceptor silent(tmp, tcp::endpoint(asio::ip::make_address("127.0.0.1"), 0));
  demo::replica_server replica({});
  io_thread io;
  transitions tr;
  auto s = fast_settings();
  s.timeout = 30s;   // a probe in flight would block a drain for this long
  s.interval = 60s;  // and so would the wait between checks
  checker hc(io.ioc(), s, tr.callback());
  hc.set_targets({target_of(replica), {"silent", silent.local_endpoint()}});
  ASSERT_TRUE(wait_probes(replica, 1));
  hc.stop();
  EXPECT_TRUE(io.drains_within(2s));
  EXPECT_TRUE(tr.events().empty());
  hc.set_targets({target_of(replica)});  // no-op after stop
  EXPECT_FALSE(hc.is_up(key_of(replica)));
}

}  // namespace
}  // namespace ingressd::health
