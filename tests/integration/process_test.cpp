// Black-box tests of the ingressd binary: exit codes (contract §1), topology file reloads
// (§3.2), active health checks (§4.3), SIGTERM drain (§7).
#include <gtest/gtest.h>
#include <unistd.h>

#include <cstdio>
#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>

#include "fakes/http_client.hpp"
#include "fakes/process.hpp"
#include "fakes/topology_builder.hpp"
#include "ingressd/demo/replica_server.hpp"

namespace ingressd::testing {
namespace {

using namespace std::chrono_literals;
using clock_type = std::chrono::steady_clock;

class Process : public ::testing::Test {
 protected:
  void SetUp() override {
    dir_ = std::filesystem::temp_directory_path() /
           ("ingressd-process-" + std::to_string(::getpid()) + "-" +
            ::testing::UnitTest::GetInstance()->current_test_info()->name());
    std::filesystem::create_directories(dir_);
  }
  void TearDown() override { std::filesystem::remove_all(dir_); }

  std::string path(const std::string& name) const { return (dir_ / name).string(); }
  void write(const std::string& name, const std::string& text) const {
    std::ofstream(path(name), std::ios::trunc) << text;
  }
  /// Writes to a temporary file and renames it into place, as config managers do.
  void replace(const std::string& name, const std::string& text) const {
    write(name + ".tmp", text);
    std::filesystem::rename(path(name + ".tmp"), path(name));
  }
  std::unique_ptr<child_process> run(const std::vector<std::string>& args) {
    return std::make_unique<child_process>(INGRESSD_BINARY, args, path("out.log"));
  }
  /// Runs to completion and returns the exit code.
  int run_to_exit(const std::vector<std::string>& args, std::string* out = nullptr) {
    auto p = run(args);
    auto code = p->wait(10s);
    if (out) *out = p->output();
    return code ? *code : -1;
  }
  static bool wait_listening(std::uint16_t port, clock_type::duration timeout) {
    const auto deadline = clock_type::now() + timeout;
    while (clock_type::now() < deadline) {
      auto c = connection::open("127.0.0.1", port, 200ms);
      if (c.connected()) return true;
      std::this_thread::sleep_for(10ms);
    }
    return false;
  }
  /// Starts ingressd on free ports with a topology file and extra YAML config.
  std::unique_ptr<child_process> start(const std::string& extra_yaml = "") {
    port_ = dead_port();
    admin_ = dead_port();
    const bool own_drain = extra_yaml.find("drain:") == std::string::npos;
    write("ingressd.yaml", (own_drain ? "drain:\n  min_period: 0s\n  timeout: 2s\n" : "") + extra_yaml);
    auto p = run({"--config", path("ingressd.yaml"), "--topology-file", path("topology.json"), "--listen",
                  "127.0.0.1:" + std::to_string(port_), "--admin-listen", "127.0.0.1:" + std::to_string(admin_),
                  "--threads", "2", "--node-ip", "127.0.0.2"});
    EXPECT_TRUE(wait_listening(port_, 5s)) << p->output();
    return p;
  }
  nlohmann::json admin_topology() const {
    auto r = http_get("127.0.0.1", admin_, "/topology", {}, 2s);
    return nlohmann::json::parse(r.body, nullptr, false);
  }

  std::filesystem::path dir_;
  std::uint16_t port_ = 0, admin_ = 0;
};

TEST_F(Process, VersionAndHelpExitZero) {
  std::string out;
  EXPECT_EQ(run_to_exit({"--version"}, &out), 0);
  EXPECT_NE(out.find("ingressd 0."), std::string::npos) << out;
  EXPECT_EQ(run_to_exit({"--help"}, &out), 0);
  EXPECT_NE(out.find("--topology-file"), std::string::npos) << out;
}

TEST_F(Process, UsageErrorsExitTwoNamingTheProblem) {
  std::string out;
  EXPECT_EQ(run_to_exit({"--no-such-flag"}, &out), 2);
  EXPECT_NE(out.find("--no-such-flag"), std::string::npos) << out;
  EXPECT_EQ(run_to_exit({"--topology-file", "/x", "--topology-url", "http://127.0.0.1:1/"}, &out), 2);
  EXPECT_EQ(run_to_exit({}, &out), 2);  // no topology source
  EXPECT_EQ(run_to_exit({"--topology-file", path("missing.json")}, &out), 2);
  EXPECT_NE(out.find("missing.json"), std::string::npos) << out;
  write("bad.json", R"({"target_groups":[{"route_prefix":"/","protocol":"HTTP","targets":[{"ip":"x","port":1,"name":"a"}]}]})");
  EXPECT_EQ(run_to_exit({"--topology-file", path("bad.json"), "--check-config"}, &out), 2);
  EXPECT_NE(out.find("targets[0].ip"), std::string::npos) << out;
}

TEST_F(Process, CheckConfigValidatesAndExitsZero) {
  write("topology.json", topology::to_json(topology_builder().app("a", "/", {make_target(1, "r")}).build()));
  std::string out;
  EXPECT_EQ(run_to_exit({"--topology-file", path("topology.json"), "--check-config", "--node-ip", "127.0.0.2"}, &out), 0);
  EXPECT_NE(out.find("configuration OK"), std::string::npos) << out;
  EXPECT_NE(out.find("127.0.0.2"), std::string::npos) << out;
}

TEST_F(Process, BindFailureExitsOne) {
  boost::asio::io_context ioc;
  boost::asio::ip::tcp::acceptor held(ioc, {boost::asio::ip::make_address("127.0.0.1"), 0});
  write("topology.json", topology::to_json(topology_builder().app("a", "/", {make_target(1, "r")}).build()));
  std::string out;
  EXPECT_EQ(run_to_exit({"--topology-file", path("topology.json"), "--listen",
                         "127.0.0.1:" + std::to_string(held.local_endpoint().port()), "--admin-listen",
                         "127.0.0.1:0"},
                        &out),
            1)
      << out;
}

TEST_F(Process, TopologyFileChangesApplyWithoutDroppingConnections) {
  demo::replica_server a({.name = "replica-a"}), b({.name = "replica-b"});
  write("topology.json", topology::to_json(topology_builder().app("llm", "/", {target_of(a)}).build()));
  auto p = start();
  auto c = connection::open("127.0.0.1", port_);
  ASSERT_TRUE(c.write(format_request("GET", "/x", "127.0.0.1", port_, {}, "")));
  EXPECT_EQ(c.read_response(5s).header("x-served-by"), "replica-a");

  // Rename-into-place: replica a leaves, b arrives. The same keep-alive connection follows.
  replace("topology.json", topology::to_json(topology_builder().app("llm", "/", {target_of(b)}).build()));
  const auto changed_at = clock_type::now();
  std::optional<std::string> served;
  while (clock_type::now() - changed_at < 3s) {
    ASSERT_TRUE(c.write(format_request("GET", "/x", "127.0.0.1", port_, {}, "")));
    auto r = c.read_response(5s);
    ASSERT_EQ(r.status, 200u);
    served = r.header("x-served-by");
    if (served == "replica-b") break;
  }
  EXPECT_EQ(served, "replica-b");
  EXPECT_LT(clock_type::now() - changed_at, 1500ms);

  // An invalid document is rejected whole; the last good topology stays in force and is counted.
  write("topology.json", R"({"target_groups": "nope"})");
  const auto bad_at = clock_type::now();
  while (clock_type::now() - bad_at < 3s && admin_topology().value("topology_errors", 0) == 0)
    std::this_thread::sleep_for(20ms);
  EXPECT_GE(admin_topology().value("topology_errors", 0), 1);
  ASSERT_TRUE(c.write(format_request("GET", "/x", "127.0.0.1", port_, {}, "")));
  EXPECT_EQ(c.read_response(5s).header("x-served-by"), "replica-b");
  p->signal(SIGTERM);
  EXPECT_EQ(p->wait(5s), 0);
}

TEST_F(Process, UnhealthyReplicaStopsGettingTrafficAndComesBack) {
  demo::replica_server a({.name = "replica-a"}), b({.name = "replica-b"});
  write("topology.json", topology::to_json(topology_builder().app("llm", "/", {target_of(a), target_of(b)}).build()));
  auto p = start("health:\n  interval: 50ms\n  fast_interval: 50ms\n  fall: 2\n  rise: 2\n  timeout: 500ms\n");
  auto health_of = [&](const std::string& name) {
    const auto topo = admin_topology();  // keep the document alive while iterating into it
    for (const auto& r : topo["apps"][0]["replicas"])
      if (r["name"] == name) return r["health"].get<std::string>();
    return std::string("?");
  };
  a.set_healthy(false);
  auto deadline = clock_type::now() + 3s;
  while (clock_type::now() < deadline && health_of("replica-a") != "down") std::this_thread::sleep_for(20ms);
  ASSERT_EQ(health_of("replica-a"), "down");
  const auto before = a.request_count();
  for (int i = 0; i < 20; ++i) EXPECT_EQ(http_get("127.0.0.1", port_, "/x", {}, 5s).header("x-served-by"), "replica-b");
  EXPECT_EQ(a.request_count(), before);

  a.set_healthy(true);
  deadline = clock_type::now() + 3s;
  while (clock_type::now() < deadline && health_of("replica-a") != "up") std::this_thread::sleep_for(20ms);
  ASSERT_EQ(health_of("replica-a"), "up");
  for (int i = 0; i < 20; ++i) http_get("127.0.0.1", port_, "/x", {}, 5s);
  EXPECT_GT(a.request_count(), before);
}

TEST_F(Process, SigtermFailsHealthzAtOnceLetsStreamsFinishAndExitsZero) {
  demo::replica_server a({.name = "replica-a", .token_delay = 50ms, .tokens = 10});
  write("topology.json", topology::to_json(topology_builder().app("llm", "/", {target_of(a)}).build()));
  auto p = start("drain:\n  min_period: 200ms\n  timeout: 5s\n");
  auto stream = connection::open("127.0.0.1", port_);
  ASSERT_TRUE(stream.write(format_request("POST", "/v1/chat/completions", "127.0.0.1", port_,
                                          {{"content-type", "application/json"}}, R"({"stream":true})")));
  ASSERT_TRUE(a.wait_for_requests(1, 5s)) << p->output();
  p->signal(SIGTERM);
  // Healthz fails at once (poll: the signal is handled asynchronously by the daemon).
  auto deadline = clock_type::now() + 2s;
  unsigned status = 0;
  while (clock_type::now() < deadline && status != 503) {
    status = http_get("127.0.0.1", port_, "/-/healthz", {}, 2s).status;
    if (status != 503) std::this_thread::sleep_for(10ms);
  }
  EXPECT_EQ(status, 503u);
  auto r = stream.read_response(10s);
  EXPECT_TRUE(r.complete);
  EXPECT_EQ(r.events.size(), 11u);  // 10 tokens + [DONE]
  EXPECT_EQ(p->wait(5s), 0) << p->output();
}

TEST_F(Process, SighupAppliesAValidConfigAndKeepsTheRunningOneOnError) {
  demo::replica_server a({.name = "replica-a"});
  write("topology.json", topology::to_json(topology_builder().app("llm", "/", {target_of(a)}).build()));
  auto p = start("client:\n  max_header_bytes: 64KiB\n");
  const std::string big(3000, 'x');
  auto status_with_big_header = [&] {
    return http_get("127.0.0.1", port_, "/x", {{"x-big", big}}, 5s).status;
  };
  ASSERT_EQ(status_with_big_header(), 200u);
  auto metric = [&](const std::string& name) {
    auto body = http_get("127.0.0.1", admin_, "/metrics", {}, 2s).body;
    auto pos = body.find("\n" + name + " ");
    return pos == std::string::npos ? -1 : std::stol(body.substr(pos + name.size() + 2));
  };

  // A valid change applies to new requests, without a restart or new sockets.
  write("ingressd.yaml", "drain:\n  min_period: 0s\n  timeout: 2s\nclient:\n  max_header_bytes: 2KiB\n");
  p->signal(SIGHUP);
  auto deadline = clock_type::now() + 10s;
  unsigned status = 0;
  while (clock_type::now() < deadline && (status = status_with_big_header()) != 431) std::this_thread::sleep_for(20ms);
  EXPECT_EQ(status, 431u) << p->output();
  EXPECT_EQ(metric("ingressd_config_reloads_total"), 1);

  // An invalid file is rejected whole: counted, logged, and the running config stays.
  write("ingressd.yaml", "client:\n  max_header_bytes: lots\n");
  p->signal(SIGHUP);
  deadline = clock_type::now() + 10s;
  while (clock_type::now() < deadline && metric("ingressd_config_reload_errors_total") < 1)
    std::this_thread::sleep_for(20ms);
  EXPECT_EQ(metric("ingressd_config_reload_errors_total"), 1);
  EXPECT_EQ(status_with_big_header(), 431u);
  EXPECT_EQ(http_get("127.0.0.1", port_, "/x", {}, 5s).status, 200u);

  EXPECT_NE(p->output().find("config rejected"), std::string::npos);
  p->signal(SIGTERM);
  EXPECT_EQ(p->wait(5s), 0);
}

}  // namespace
}  // namespace ingressd::testing
