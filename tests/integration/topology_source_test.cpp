// Topology sources against real files and a fake dashboard: change detection, dedup, errors,
// back-off and recovery, prompt stop. Each test runs the sources on its own io_context thread.
#include <unistd.h>

#include <chrono>
#include <condition_variable>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <future>
#include <mutex>
#include <optional>
#include <sstream>
#include <string>
#include <thread>
#include <vector>

#include <boost/asio/executor_work_guard.hpp>
#include <boost/asio/post.hpp>
#include <gtest/gtest.h>

#include "fakes/io_thread.hpp"
#include "fakes/fake_dashboard.hpp"
#include "ingressd/topology/source.hpp"

namespace ingressd::topology {
namespace {

using namespace std::chrono_literals;
using steady = std::chrono::steady_clock;
namespace fs = std::filesystem;

using ingressd::testing::io_thread;

/// Collects callbacks (they run on the io thread) for the test thread.
class recorder {
 public:
  source_callbacks callbacks() {
    return {[this](document d) {
              std::lock_guard lock(mu_);
              docs_.push_back(std::move(d));
              cv_.notify_all();
            },
            [this](std::string e) {
              std::lock_guard lock(mu_);
              errors_.push_back(std::move(e));
              cv_.notify_all();
            },
            [this] {
              std::lock_guard lock(mu_);
              ++currents_;
              cv_.notify_all();
            }};
  }
  bool wait_currents(std::size_t n, steady::duration timeout = 5s) {
    std::unique_lock lock(mu_);
    return cv_.wait_for(lock, timeout, [&] { return currents_ >= n; });
  }
  std::size_t current_count() {
    std::lock_guard lock(mu_);
    return currents_;
  }
  bool wait_docs(std::size_t n, steady::duration timeout = 5s) {
    std::unique_lock lock(mu_);
    return cv_.wait_for(lock, timeout, [&] { return docs_.size() >= n; });
  }
  bool wait_errors(std::size_t n, steady::duration timeout = 5s) {
    std::unique_lock lock(mu_);
    return cv_.wait_for(lock, timeout, [&] { return errors_.size() >= n; });
  }
  std::size_t doc_count() {
    std::lock_guard lock(mu_);
    return docs_.size();
  }
  std::size_t error_count() {
    std::lock_guard lock(mu_);
    return errors_.size();
  }
  document doc(std::size_t i) {
    std::lock_guard lock(mu_);
    return docs_.at(i);
  }
  std::string error(std::size_t i) {
    std::lock_guard lock(mu_);
    return errors_.at(i);
  }

 private:
  std::mutex mu_;
  std::condition_variable cv_;
  std::vector<document> docs_;
  std::vector<std::string> errors_;
  std::size_t currents_ = 0;
};

/// A one-app topology document whose replica port tells versions apart.
std::string doc_json(int port, const std::string& prefix = "/v1") {
  std::ostringstream s;
  s << R"({"target_groups":[{"app_name":"llm","route_prefix":")" << prefix
    << R"(","protocol":"HTTP","targets":[{"ip":"10.0.0.5","port":)" << port
    << R"(,"instance_id":"i-1","name":"SERVE_REPLICA::llm#LLMServer#r)" << port << R"("}]}]})";
  return s.str();
}

document parsed(const std::string& text) {
  auto r = parse_document(text);
  EXPECT_TRUE(std::holds_alternative<document>(r)) << text;
  return std::holds_alternative<document>(r) ? std::get<document>(r) : document{};
}

int replica_port(const document& d) { return d.apps.empty() || d.apps[0].replicas.empty() ? -1 : d.apps[0].replicas[0].port; }

std::string read_text(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  std::ostringstream s;
  s << in.rdbuf();
  return s.str();
}

class temp_dir {
 public:
  temp_dir() {
    std::string tmpl = (fs::temp_directory_path() / "ingressd-topo-XXXXXX").string();
    path_ = ::mkdtemp(tmpl.data()) ? tmpl : std::string{};
  }
  ~temp_dir() {
    std::error_code ec;
    fs::remove_all(path_, ec);
  }
  std::string file(const std::string& name) const { return path_ + "/" + name; }

 private:
  std::string path_;
};

void write_in_place(const std::string& path, const std::string& text) {
  std::ofstream out(path, std::ios::binary | std::ios::trunc);
  out << text;
}

void write_and_rename(const std::string& path, const std::string& text) {
  const std::string tmp = path + ".tmp";
  write_in_place(tmp, text);
  ASSERT_EQ(std::rename(tmp.c_str(), path.c_str()), 0);
}

// ---------------------------------------------------------------------------------------------
// Helpers (no I/O)

TEST(TopologySource, ParseHttpUrl) {
  auto u = parse_http_url("http://10.0.0.1:8265");
  ASSERT_TRUE(u);
  EXPECT_EQ(u->host, "10.0.0.1");
  EXPECT_EQ(u->port, 8265);
  EXPECT_EQ(u->authority, "10.0.0.1:8265");
  EXPECT_EQ(u->target, "/");

  u = parse_http_url("HTTP://dash.example/api/x?y=1#frag");
  ASSERT_TRUE(u);
  EXPECT_EQ(u->host, "dash.example");
  EXPECT_EQ(u->port, 80);
  EXPECT_EQ(u->target, "/api/x?y=1");

  u = parse_http_url("http://[::1]:9000/topology");
  ASSERT_TRUE(u);
  EXPECT_EQ(u->host, "::1");
  EXPECT_EQ(u->authority, "[::1]:9000");
  EXPECT_EQ(u->target, "/topology");

  u = parse_http_url("http://h?x=1");
  ASSERT_TRUE(u);
  EXPECT_EQ(u->target, "/?x=1");

  for (const char* bad : {"https://h", "ftp://h", "http://", "http://:80", "http://h:", "http://h:0",
                          "http://h:65536", "http://u@h", "http://[::1", "http://h:8x", "10.0.0.1:8265"}) {
    EXPECT_FALSE(parse_http_url(bad)) << bad;
  }
}

TEST(TopologySource, DashboardApplicationsUrl) {
  EXPECT_EQ(dashboard_applications_url("http://h:8265"), "http://h:8265/api/serve/applications/");
  EXPECT_EQ(dashboard_applications_url("http://h:8265/"), "http://h:8265/api/serve/applications/");
  EXPECT_EQ(dashboard_applications_url("http://h/ray/"), "http://h/ray/api/serve/applications/");
}

TEST(TopologySource, PollBackoffDoublesAndIsCapped) {
  EXPECT_EQ(poll_backoff(1000ms, 0), 1000ms);
  EXPECT_EQ(poll_backoff(1000ms, 1), 1000ms);
  EXPECT_EQ(poll_backoff(1000ms, 2), 2000ms);
  EXPECT_EQ(poll_backoff(1000ms, 3), 4000ms);
  EXPECT_EQ(poll_backoff(1000ms, 5), 16000ms);
  EXPECT_EQ(poll_backoff(1000ms, 6), 30000ms);
  EXPECT_EQ(poll_backoff(1000ms, 1000), 30000ms);
  EXPECT_EQ(poll_backoff(60000ms, 4), 60000ms);  // never below the poll interval
}

TEST(TopologySource, LocalAddressTowards) {
  EXPECT_EQ(local_address_towards("127.0.0.1"), std::optional<std::string>("127.0.0.1"));
  EXPECT_EQ(local_address_towards("127.0.0.1", 8265), std::optional<std::string>("127.0.0.1"));
  const auto via_name = local_address_towards("localhost", 8265);
  ASSERT_TRUE(via_name.has_value());
  EXPECT_TRUE(*via_name == "127.0.0.1" || *via_name == "::1") << *via_name;
}

// ---------------------------------------------------------------------------------------------
// File source

TEST(TopologySource, FileInPlaceWriteAppliedWithinOneSecond) {
  temp_dir dir;
  const auto path = dir.file("topology.json");
  write_in_place(path, doc_json(30001));
  io_thread io;
  recorder rec;
  auto src = make_file_source(io.ioc(), path, rec.callbacks(), parsed(doc_json(30001)));
  EXPECT_EQ(src->describe(), "topology file " + path);
  src->start();
  ASSERT_TRUE(io.sync());

  write_in_place(path, doc_json(30002, "/v2"));
  const auto t0 = steady::now();
  ASSERT_TRUE(rec.wait_docs(1, 1s));
  EXPECT_LT(steady::now() - t0, 1s);
  EXPECT_EQ(replica_port(rec.doc(0)), 30002);
  EXPECT_EQ(rec.error_count(), 0u);
  src->stop();
  EXPECT_TRUE(io.drains_within(1s));
}

TEST(TopologySource, FileRenameIntoPlaceAppliedWithinOneSecond) {
  temp_dir dir;
  const auto path = dir.file("topology.json");
  write_in_place(path, doc_json(30001));
  io_thread io;
  recorder rec;
  auto src = make_file_source(io.ioc(), path, rec.callbacks(), parsed(doc_json(30001)));
  src->start();
  ASSERT_TRUE(io.sync());

  write_and_rename(path, doc_json(30003));
  const auto t0 = steady::now();
  ASSERT_TRUE(rec.wait_docs(1, 1s));
  EXPECT_LT(steady::now() - t0, 1s);
  EXPECT_EQ(replica_port(rec.doc(0)), 30003);

  // And again (a second rename over the renamed file), same size as before.
  write_and_rename(path, doc_json(30004));
  ASSERT_TRUE(rec.wait_docs(2, 1s));
  EXPECT_EQ(replica_port(rec.doc(1)), 30004);
  EXPECT_EQ(rec.error_count(), 0u);
}

TEST(TopologySource, FileChangeBeforeStartIsDelivered) {
  temp_dir dir;
  const auto path = dir.file("topology.json");
  write_in_place(path, doc_json(30005));
  io_thread io;
  recorder rec;
  // The caller loaded 30001, the file says 30005 by the time the source starts.
  auto src = make_file_source(io.ioc(), path, rec.callbacks(), parsed(doc_json(30001)));
  src->start();
  ASSERT_TRUE(rec.wait_docs(1, 1s));
  EXPECT_EQ(replica_port(rec.doc(0)), 30005);
}

TEST(TopologySource, FileWithoutInitialTakesStartContentAsSilentBaseline) {
  temp_dir dir;
  const auto path = dir.file("topology.yaml");
  write_in_place(path, doc_json(30001));
  io_thread io;
  recorder rec;
  auto src = make_file_source(io.ioc(), path, rec.callbacks());
  src->start();
  ASSERT_TRUE(io.sync());  // the first check ran
  ASSERT_TRUE(io.sync());
  write_in_place(path, doc_json(30002, "/v2"));
  ASSERT_TRUE(rec.wait_docs(1, 1s));
  EXPECT_EQ(replica_port(rec.doc(0)), 30002);
  EXPECT_EQ(rec.doc_count(), 1u);
}

TEST(TopologySource, FileInvalidDocumentReportsErrorAndNoDocument) {
  temp_dir dir;
  const auto path = dir.file("topology.json");
  write_in_place(path, doc_json(30001));
  io_thread io;
  recorder rec;
  auto src = make_file_source(io.ioc(), path, rec.callbacks(), parsed(doc_json(30001)));
  src->start();
  ASSERT_TRUE(io.sync());

  write_in_place(path, R"({"target_groups":[{"route_prefix":"/v1","protocol":"HTTP","targets":[{"ip":"10.0.0.5","port":"x","name":"n"}]}]})");
  ASSERT_TRUE(rec.wait_errors(1, 2s));
  EXPECT_NE(rec.error(0).find(path), std::string::npos) << rec.error(0);
  EXPECT_NE(rec.error(0).find("port"), std::string::npos) << rec.error(0);
  EXPECT_EQ(rec.doc_count(), 0u);

  // Reported once, not at every poll.
  write_in_place(path, "{ not json");
  ASSERT_TRUE(rec.wait_errors(2, 2s));
  EXPECT_FALSE(rec.wait_errors(3, 700ms));
  EXPECT_EQ(rec.doc_count(), 0u);

  // A valid document afterwards is applied.
  write_in_place(path, doc_json(30009));
  ASSERT_TRUE(rec.wait_docs(1, 1s));
  EXPECT_EQ(replica_port(rec.doc(0)), 30009);
}

TEST(TopologySource, FileMissingThenCreated) {
  temp_dir dir;
  const auto path = dir.file("topology.json");
  write_in_place(path, doc_json(30001));
  io_thread io;
  recorder rec;
  auto src = make_file_source(io.ioc(), path, rec.callbacks(), parsed(doc_json(30001)));
  src->start();
  ASSERT_TRUE(io.sync());
  fs::remove(path);
  ASSERT_TRUE(rec.wait_errors(1, 2s));
  EXPECT_NE(rec.error(0).find("cannot stat"), std::string::npos) << rec.error(0);
  write_and_rename(path, doc_json(30001));  // same content as the last delivered: no callback
  write_and_rename(path, doc_json(30002));
  ASSERT_TRUE(rec.wait_docs(1, 1s));
  EXPECT_EQ(replica_port(rec.doc(0)), 30002);
}

TEST(TopologySource, FileUnchangedContentNoCallback) {
  temp_dir dir;
  const auto path = dir.file("topology.json");
  const auto text = doc_json(30001);
  write_in_place(path, text);
  io_thread io;
  recorder rec;
  auto src = make_file_source(io.ioc(), path, rec.callbacks(), parsed(text));
  src->start();
  ASSERT_TRUE(io.sync());

  write_in_place(path, text);  // new mtime, same content
  write_and_rename(path, text);  // new inode, same content
  // Same document, different formatting.
  write_and_rename(path, "\n  " + text + "\n");
  EXPECT_FALSE(rec.wait_docs(1, 700ms));  // absence check over more than two polls
  EXPECT_EQ(rec.error_count(), 0u);

  write_in_place(path, doc_json(30002));
  ASSERT_TRUE(rec.wait_docs(1, 1s));
  EXPECT_EQ(rec.doc_count(), 1u);
}

// on_current feeds ingressd_topology_last_success_timestamp_seconds: a file that stays valid keeps
// confirming the topology at every poll; one that turned invalid stops until it is valid again.
TEST(TopologySource, FileConfirmsWhileValidOnly) {
  temp_dir dir;
  const auto path = dir.file("topology.json");
  write_in_place(path, doc_json(30001));
  io_thread io;
  recorder rec;
  auto src = make_file_source(io.ioc(), path, rec.callbacks(), parsed(doc_json(30001)));
  src->start();
  ASSERT_TRUE(rec.wait_currents(3, 2s));  // unchanged file, several polls
  EXPECT_EQ(rec.doc_count(), 0u);

  write_in_place(path, "{ not json");
  ASSERT_TRUE(rec.wait_errors(1, 2s));
  const auto at_error = rec.current_count();
  EXPECT_FALSE(rec.wait_currents(at_error + 1, 700ms));  // absence check over more than two polls

  write_in_place(path, doc_json(30002));
  ASSERT_TRUE(rec.wait_docs(1, 1s));
  ASSERT_TRUE(rec.wait_currents(at_error + 2, 2s));
}

// ---------------------------------------------------------------------------------------------
// HTTP / dashboard sources

TEST(TopologySource, DashboardConfirmsEverySuccessfulPollOnly) {
  testing::fake_dashboard dash({.body = doc_json(30001)});
  io_thread io;
  recorder rec;
  auto src = make_dashboard_source(io.ioc(), dash.url(), 50ms, 1s, rec.callbacks());
  src->start();
  ASSERT_TRUE(rec.wait_docs(1, 2s));
  ASSERT_TRUE(rec.wait_currents(3, 3s));  // the same body again: no document, but current
  EXPECT_EQ(rec.doc_count(), 1u);

  dash.set_status(500);
  ASSERT_TRUE(rec.wait_errors(1, 3s));
  const auto at_error = rec.current_count();
  ASSERT_TRUE(rec.wait_errors(3, 5s));
  EXPECT_EQ(rec.current_count(), at_error);

  dash.set_status(200);
  ASSERT_TRUE(rec.wait_currents(at_error + 1, 5s));
}

std::string test_file(const std::string& rel) { return read_text(std::string(INGRESSD_TEST_DATA) + "/" + rel); }

TEST(TopologySource, DashboardInitialFetchParsesServeInstanceDetails) {
  const auto body = test_file("topology/valid/serve_instance_details.json");
  ASSERT_FALSE(body.empty());
  testing::fake_dashboard dash({.body = body});
  io_thread io;
  recorder rec;
  auto src = make_dashboard_source(io.ioc(), dash.url(), 10s, 2s, rec.callbacks());
  EXPECT_EQ(src->describe(), "Ray dashboard " + dash.url() + "/api/serve/applications/");
  src->start();
  // The first poll runs at once (the poll interval is 10 s).
  ASSERT_TRUE(rec.wait_docs(1, 2s));
  EXPECT_EQ(rec.doc(0), parsed(body));
  EXPECT_FALSE(rec.doc(0).apps.empty());
  EXPECT_EQ(rec.error_count(), 0u);
  EXPECT_EQ(dash.served_count(), 1u);
  const auto reqs = dash.requests();
  ASSERT_EQ(reqs.size(), 1u);
  EXPECT_EQ(reqs[0].method, "GET");
  EXPECT_EQ(reqs[0].target, "/api/serve/applications/");
  EXPECT_EQ(reqs[0].header("host").value_or(""), "127.0.0.1:" + std::to_string(dash.port()));
  src->stop();
  EXPECT_TRUE(io.drains_within(1s));
}

TEST(TopologySource, DashboardChangeAppliedOnNextPollAndSameBodyIsSilent) {
  testing::fake_dashboard dash({.body = doc_json(30001)});
  io_thread io;
  recorder rec;
  auto src = make_dashboard_source(io.ioc(), dash.url() + "/", 50ms, 1s, rec.callbacks());
  src->start();
  ASSERT_TRUE(rec.wait_docs(1, 2s));
  EXPECT_EQ(replica_port(rec.doc(0)), 30001);

  // Several more polls of the same body: no callback.
  const auto served = dash.served_count();
  ASSERT_TRUE(dash.wait_for_requests(served + 3, 3s));
  EXPECT_EQ(rec.doc_count(), 1u);

  dash.set_body(doc_json(30002, "/v2"));
  ASSERT_TRUE(rec.wait_docs(2, 2s));
  EXPECT_EQ(replica_port(rec.doc(1)), 30002);
  EXPECT_EQ(rec.error_count(), 0u);
}

TEST(TopologySource, DashboardAfterServeShutdownDeliversTheEmptyTopologyNotAnError) {
  // `serve shutdown`: the dashboard answers Ray's empty ServeInstanceDetails (no target_groups).
  // That is a topology (no applications) replacing the stale one, not a failed poll.
  testing::fake_dashboard dash({.body = doc_json(30001)});
  io_thread io;
  recorder rec;
  auto src = make_dashboard_source(io.ioc(), dash.url(), 50ms, 1s, rec.callbacks());
  src->start();
  ASSERT_TRUE(rec.wait_docs(1, 2s));
  EXPECT_TRUE(rec.doc(0).serve_running);
  dash.set_body(test_file("ray/dashboard_serve_not_started.json"));
  ASSERT_TRUE(rec.wait_docs(2, 2s));
  EXPECT_FALSE(rec.doc(1).serve_running);
  EXPECT_TRUE(rec.doc(1).apps.empty());
  const auto served = dash.served_count();
  ASSERT_TRUE(dash.wait_for_requests(served + 3, 3s));  // polls keep coming, each one fine
  EXPECT_EQ(rec.error_count(), 0u);
  EXPECT_EQ(rec.doc_count(), 2u);
  src->stop();
  EXPECT_TRUE(io.drains_within(1s));
}

TEST(TopologySource, DashboardServerErrorThenRecovery) {
  testing::fake_dashboard dash({.body = doc_json(30001)});
  io_thread io;
  recorder rec;
  auto src = make_dashboard_source(io.ioc(), dash.url(), 50ms, 1s, rec.callbacks());
  src->start();
  ASSERT_TRUE(rec.wait_docs(1, 2s));

  dash.set_status(500);
  ASSERT_TRUE(rec.wait_errors(2, 3s));
  EXPECT_NE(rec.error(0).find("HTTP 500"), std::string::npos) << rec.error(0);
  EXPECT_NE(rec.error(0).find(dash.url()), std::string::npos) << rec.error(0);
  EXPECT_EQ(rec.doc_count(), 1u);  // the last good document stays with the caller

  dash.set_body(doc_json(30002));
  dash.set_status(200);
  ASSERT_TRUE(rec.wait_docs(2, 3s));
  EXPECT_EQ(replica_port(rec.doc(1)), 30002);
}

TEST(TopologySource, DashboardHangTimesOutThenRecovery) {
  testing::fake_dashboard dash({.body = doc_json(30001)});
  io_thread io;
  recorder rec;
  auto src = make_dashboard_source(io.ioc(), dash.url(), 50ms, 200ms, rec.callbacks());
  src->start();
  ASSERT_TRUE(rec.wait_docs(1, 2s));

  dash.set_hang(true);
  ASSERT_TRUE(rec.wait_errors(1, 3s));
  EXPECT_NE(rec.error(0).find("timed out after 200ms"), std::string::npos) << rec.error(0);
  EXPECT_EQ(rec.doc_count(), 1u);

  dash.set_body(doc_json(30002));
  dash.set_hang(false);
  ASSERT_TRUE(rec.wait_docs(2, 3s));
  EXPECT_EQ(replica_port(rec.doc(1)), 30002);
}

TEST(TopologySource, DashboardInvalidBodyReportsErrorAndNoDocument) {
  testing::fake_dashboard dash({.body = R"({"target_groups": 5})"});
  io_thread io;
  recorder rec;
  auto src = make_dashboard_source(io.ioc(), dash.url(), 50ms, 1s, rec.callbacks());
  src->start();
  ASSERT_TRUE(rec.wait_errors(1, 2s));
  EXPECT_NE(rec.error(0).find("target_groups"), std::string::npos) << rec.error(0);
  EXPECT_EQ(rec.doc_count(), 0u);
  dash.set_body(doc_json(30003));
  ASSERT_TRUE(rec.wait_docs(1, 3s));
  EXPECT_EQ(replica_port(rec.doc(0)), 30003);
}

TEST(TopologySource, HttpSourceServesTargetGroupsDocumentViaHostName) {
  const auto body = test_file("topology/valid/target_groups.json");
  testing::fake_dashboard dash({.body = body, .path = "/topology"});
  io_thread io;
  recorder rec;
  // "localhost" goes through the resolver (it may yield ::1 first; the connect tries each).
  const auto url = "http://localhost:" + std::to_string(dash.port()) + "/topology";
  auto src = make_http_source(io.ioc(), url, 10s, 2s, rec.callbacks());
  EXPECT_EQ(src->describe(), "topology URL " + url);
  src->start();
  ASSERT_TRUE(rec.wait_docs(1, 3s)) << (rec.error_count() ? rec.error(0) : "");
  EXPECT_EQ(rec.doc(0), parsed(body));
  ASSERT_TRUE(rec.doc(0).http_fallback.has_value());
}

TEST(TopologySource, HttpSourceConnectionRefusedBacksOff) {
  // A port nobody listens on.
  std::uint16_t port = 0;
  {
    asio::io_context tmp;
    tcp::acceptor a(tmp, tcp::endpoint(asio::ip::make_address("127.0.0.1"), 0));
    port = a.local_endpoint().port();
  }
  io_thread io;
  recorder rec;
  const auto url = "http://127.0.0.1:" + std::to_string(port) + "/";
  auto src = make_http_source(io.ioc(), url, 20ms, 500ms, rec.callbacks());
  const auto t0 = steady::now();
  src->start();
  // Back-off 20, 40, 80, 160 ms between attempts: 5 errors take at least ~300 ms.
  ASSERT_TRUE(rec.wait_errors(5, 5s));
  EXPECT_GE(steady::now() - t0, 280ms);
  EXPECT_NE(rec.error(0).find("connect"), std::string::npos) << rec.error(0);
  EXPECT_EQ(rec.doc_count(), 0u);
  src->stop();
  EXPECT_TRUE(io.drains_within(1s));
}

TEST(TopologySource, StopCancelsRequestInFlight) {
  testing::fake_dashboard dash({.body = doc_json(30001)});
  dash.set_hang(true);
  io_thread io;
  recorder rec;
  auto src = make_dashboard_source(io.ioc(), dash.url(), 50ms, 30s, rec.callbacks());
  src->start();
  ASSERT_TRUE(dash.wait_for_requests(1, 2s));  // the request is in flight, unanswered
  const auto t0 = steady::now();
  src->stop();
  EXPECT_TRUE(dash.wait_for_disconnects(1, 2s));  // our socket was closed
  EXPECT_TRUE(io.drains_within(2s));              // no timer or operation left
  EXPECT_LT(steady::now() - t0, 2s);
  EXPECT_EQ(rec.error_count(), 0u);  // stopping is not an error
  EXPECT_EQ(rec.doc_count(), 0u);
}

TEST(TopologySource, DestroyWithoutStartOrAfterIoStops) {
  io_thread io;
  recorder rec;
  { auto never_started = make_dashboard_source(io.ioc(), "http://127.0.0.1:1", 50ms, 1s, rec.callbacks()); }
  temp_dir dir;
  write_in_place(dir.file("t.json"), doc_json(30001));
  auto src = make_file_source(io.ioc(), dir.file("t.json"), rec.callbacks());
  src->start();
  ASSERT_TRUE(io.sync());
  src->stop();
  EXPECT_TRUE(io.drains_within(1s));
  src.reset();  // after the io_context stopped
  EXPECT_EQ(rec.error_count(), 0u);
}

}  // namespace
}  // namespace ingressd::topology
