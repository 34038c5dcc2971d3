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
#include "fakes/topology_builder.hpp"
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
              log_ += 'd';
              cv_.notify_all();
            },
            [this](std::string e) {
              std::lock_guard lock(mu_);
              errors_.push_back(std::move(e));
              log_ += 'e';
              cv_.notify_all();
            },
            [this] {
              std::lock_guard lock(mu_);
              ++currents_;
              log_ += 'c';
              cv_.notify_all();
            }};
  }
  /// Every callback so far, in order: 'd' document, 'e' error, 'c' current (a poll confirmed).
  std::string log() {
    std::lock_guard lock(mu_);
    return log_;
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
  std::string log_;
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

/// The setup of every source test: a temporary directory with `path` in it, the io thread the
/// source runs on, the recorder of its callbacks, and the source itself (stopped, then destroyed
/// before the io thread ends).
class TopologySourceIo : public ::testing::Test {
 protected:
  ~TopologySourceIo() override {
    if (src) src->stop();
    src.reset();
  }
  /// A file source on `path`, which holds `text`; `loaded` is what the caller had loaded from it
  /// (none: the source takes the first content it reads as its silent baseline).
  void start_file(const std::string& text, std::optional<std::string> loaded) {
    write_in_place(path, text);
    src = loaded ? make_file_source(io.ioc(), path, rec.callbacks(), parsed(*loaded))
                 : make_file_source(io.ioc(), path, rec.callbacks());
    src->start();
  }
  /// A file source on `path` holding doc_json(`port`), the caller having loaded that same
  /// document, whose first check has run.
  void start_file_loaded(int port) {
    start_file(doc_json(port), doc_json(port));
    ASSERT_TRUE(io.sync());
  }
  /// A dashboard source on `url`, polling every `poll`, each fetch bounded by `timeout`.
  void start_dashboard(const std::string& url, duration poll = 50ms, duration timeout = 1s) {
    src = make_dashboard_source(io.ioc(), url, poll, timeout, rec.callbacks());
    src->start();
  }
  /// Runs `f` while the io thread is held, so that no poll runs meanwhile: the next poll comes
  /// after everything `f` did.
  template <class F>
  void with_polls_held(F f) {
    std::promise<void> held, release;
    // The io thread owns its future: it may still be waking from wait() after this returns.
    boost::asio::post(io.ioc(), [&held, released = release.get_future()]() mutable {
      held.set_value();
      released.wait();
    });
    held.get_future().wait();
    f();
    release.set_value();
  }
  /// Stops the source: true when nothing (no timer, no socket operation) is left on the io thread.
  bool stop_drains() {
    src->stop();
    return io.drains_within(5s);
  }

  temp_dir dir;
  const std::string path = dir.file("topology.json");
  io_thread io;
  recorder rec;
  std::unique_ptr<source> src;
};

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

enum class file_write { in_place, rename };

class FileChange : public TopologySourceIo, public ::testing::WithParamInterface<file_write> {
 protected:
  void write(const std::string& text) {
    if (GetParam() == file_write::in_place) write_in_place(path, text);
    else write_and_rename(path, text);
  }
};

INSTANTIATE_TEST_SUITE_P(TopologySource, FileChange, ::testing::Values(file_write::in_place, file_write::rename),
                         [](const ::testing::TestParamInfo<file_write>& i) {
                           return std::string(i.param == file_write::in_place ? "InPlace" : "RenameIntoPlace");
                         });

// A change is delivered by the first poll after it, whatever the machine's load: the write is
// made while no poll can run, and the next callback must be the new document.
TEST_P(FileChange, AppliedAtTheNextPoll) {
  start_file_loaded(30001);
  EXPECT_EQ(src->describe(), "topology file " + path);
  ASSERT_TRUE(rec.wait_currents(1));
  // Sizes differ from one version to the next: a file rewritten within one timestamp tick is
  // still seen to change.
  const std::vector<std::pair<int, std::string>> versions{{30002, "/v2"}, {30003, "/v33"}};
  for (std::size_t i = 0; i < versions.size(); ++i) {
    std::string before;
    with_polls_held([&] {
      before = rec.log();
      write(doc_json(versions[i].first, versions[i].second));
    });
    ASSERT_TRUE(rec.wait_docs(i + 1));
    EXPECT_EQ(replica_port(rec.doc(i)), versions[i].first);
    const auto after = rec.log().substr(before.size());
    EXPECT_EQ(after.front(), 'd') << "a poll after the change did not deliver it: " << after;
  }
  EXPECT_EQ(rec.error_count(), 0u);
  EXPECT_TRUE(stop_drains());
}

TEST_F(TopologySourceIo, FileChangeBeforeStartIsDelivered) {
  // The caller loaded 30001, the file says 30005 by the time the source starts.
  start_file(doc_json(30005), doc_json(30001));
  ASSERT_TRUE(rec.wait_docs(1));
  EXPECT_EQ(replica_port(rec.doc(0)), 30005);
  EXPECT_EQ(rec.log().front(), 'd') << "the first check delivers it: " << rec.log();
}

TEST_F(TopologySourceIo, FileWithoutInitialTakesStartContentAsSilentBaseline) {
  start_file(doc_json(30001), std::nullopt);
  ASSERT_TRUE(io.sync());  // the first check ran
  ASSERT_TRUE(io.sync());
  write_in_place(path, doc_json(30002, "/v2"));
  ASSERT_TRUE(rec.wait_docs(1));
  EXPECT_EQ(replica_port(rec.doc(0)), 30002);
  EXPECT_EQ(rec.doc_count(), 1u);
}

TEST_F(TopologySourceIo, FileInvalidDocumentReportsErrorAndNoDocument) {
  start_file_loaded(30001);

  write_in_place(path, R"({"target_groups":[{"route_prefix":"/v1","protocol":"HTTP","targets":[{"ip":"10.0.0.5","port":"x","name":"n"}]}]})");
  ASSERT_TRUE(rec.wait_errors(1));
  EXPECT_NE(rec.error(0).find(path), std::string::npos) << rec.error(0);
  EXPECT_NE(rec.error(0).find("port"), std::string::npos) << rec.error(0);
  EXPECT_EQ(rec.doc_count(), 0u);

  // Reported once, not at every poll.
  write_in_place(path, "{ not json");
  ASSERT_TRUE(rec.wait_errors(2));
  EXPECT_FALSE(rec.wait_errors(3, 700ms));  // absence check over more than two polls
  EXPECT_EQ(rec.doc_count(), 0u);

  // A valid document afterwards is applied.
  write_in_place(path, doc_json(30009));
  ASSERT_TRUE(rec.wait_docs(1));
  EXPECT_EQ(replica_port(rec.doc(0)), 30009);
}

TEST_F(TopologySourceIo, FileMissingThenCreated) {
  start_file_loaded(30001);
  fs::remove(path);
  ASSERT_TRUE(rec.wait_errors(1));
  EXPECT_NE(rec.error(0).find("cannot stat"), std::string::npos) << rec.error(0);
  write_and_rename(path, doc_json(30001));  // same content as the last delivered: no callback
  write_and_rename(path, doc_json(30002));
  ASSERT_TRUE(rec.wait_docs(1));
  EXPECT_EQ(replica_port(rec.doc(0)), 30002);
}

TEST_F(TopologySourceIo, FileUnchangedContentNoCallback) {
  const auto text = doc_json(30001);
  start_file(text, text);
  ASSERT_TRUE(io.sync());

  write_in_place(path, text);    // new mtime, same content
  write_and_rename(path, text);  // new inode, same content
  // Same document, different formatting.
  write_and_rename(path, "\n  " + text + "\n");
  EXPECT_FALSE(rec.wait_docs(1, 700ms));  // absence check over more than two polls
  EXPECT_EQ(rec.error_count(), 0u);

  write_in_place(path, doc_json(30002));
  ASSERT_TRUE(rec.wait_docs(1));
  EXPECT_EQ(rec.doc_count(), 1u);
}

// on_current feeds ingressd_topology_last_success_timestamp_seconds: a file that stays valid keeps
// confirming the topology at every poll; one that turned invalid stops until it is valid again.
TEST_F(TopologySourceIo, FileConfirmsWhileValidOnly) {
  start_file(doc_json(30001), doc_json(30001));
  ASSERT_TRUE(rec.wait_currents(3));  // unchanged file, several polls
  EXPECT_EQ(rec.doc_count(), 0u);

  write_in_place(path, "{ not json");
  ASSERT_TRUE(rec.wait_errors(1));
  const auto at_error = rec.current_count();
  EXPECT_FALSE(rec.wait_currents(at_error + 1, 700ms));  // absence check over more than two polls

  write_in_place(path, doc_json(30002));
  ASSERT_TRUE(rec.wait_docs(1));
  ASSERT_TRUE(rec.wait_currents(at_error + 2));
}

// ---------------------------------------------------------------------------------------------
// HTTP / dashboard sources

TEST_F(TopologySourceIo, DashboardConfirmsEverySuccessfulPollOnly) {
  testing::fake_dashboard dash({.body = doc_json(30001)});
  start_dashboard(dash.url());
  ASSERT_TRUE(rec.wait_docs(1));
  ASSERT_TRUE(rec.wait_currents(3));  // the same body again: no document, but current
  EXPECT_EQ(rec.doc_count(), 1u);

  dash.set_status(500);
  ASSERT_TRUE(rec.wait_errors(1));
  const auto at_error = rec.current_count();
  ASSERT_TRUE(rec.wait_errors(3));
  EXPECT_EQ(rec.current_count(), at_error);

  dash.set_status(200);
  ASSERT_TRUE(rec.wait_currents(at_error + 1));
}

std::string test_file(const std::string& rel) { return read_text(std::string(INGRESSD_TEST_DATA) + "/" + rel); }

TEST_F(TopologySourceIo, DashboardInitialFetchParsesServeInstanceDetails) {
  const auto body = test_file("topology/valid/serve_instance_details.json");
  ASSERT_FALSE(body.empty());
  testing::fake_dashboard dash({.body = body});
  // The first poll runs at once (the poll interval is 10 s).
  start_dashboard(dash.url(), 10s, 2s);
  EXPECT_EQ(src->describe(), "Ray dashboard " + dash.url() + "/api/serve/applications/");
  ASSERT_TRUE(rec.wait_docs(1));
  EXPECT_EQ(rec.doc(0), parsed(body));
  EXPECT_FALSE(rec.doc(0).apps.empty());
  EXPECT_EQ(rec.error_count(), 0u);
  EXPECT_EQ(dash.served_count(), 1u);
  const auto reqs = dash.requests();
  ASSERT_EQ(reqs.size(), 1u);
  EXPECT_EQ(reqs[0].method, "GET");
  EXPECT_EQ(reqs[0].target, "/api/serve/applications/");
  EXPECT_EQ(reqs[0].header("host").value_or(""), "127.0.0.1:" + std::to_string(dash.port()));
  EXPECT_TRUE(stop_drains());
}

TEST_F(TopologySourceIo, DashboardChangeAppliedOnNextPollAndSameBodyIsSilent) {
  testing::fake_dashboard dash({.body = doc_json(30001)});
  start_dashboard(dash.url() + "/");
  ASSERT_TRUE(rec.wait_docs(1));
  EXPECT_EQ(replica_port(rec.doc(0)), 30001);

  // Several more polls of the same body: no callback.
  const auto served = dash.served_count();
  ASSERT_TRUE(dash.wait_for_requests(served + 3, 5s));
  EXPECT_EQ(rec.doc_count(), 1u);

  dash.set_body(doc_json(30002, "/v2"));
  ASSERT_TRUE(rec.wait_docs(2));
  EXPECT_EQ(replica_port(rec.doc(1)), 30002);
  EXPECT_EQ(rec.error_count(), 0u);
}

TEST_F(TopologySourceIo, DashboardAfterServeShutdownDeliversTheEmptyTopologyNotAnError) {
  // `serve shutdown`: the dashboard answers Ray's empty ServeInstanceDetails (no target_groups).
  // That is a topology (no applications) replacing the stale one, not a failed poll.
  testing::fake_dashboard dash({.body = doc_json(30001)});
  start_dashboard(dash.url());
  ASSERT_TRUE(rec.wait_docs(1));
  EXPECT_TRUE(rec.doc(0).serve_running);
  dash.set_body(test_file("ray/dashboard_serve_not_started.json"));
  ASSERT_TRUE(rec.wait_docs(2));
  EXPECT_FALSE(rec.doc(1).serve_running);
  EXPECT_TRUE(rec.doc(1).apps.empty());
  const auto served = dash.served_count();
  ASSERT_TRUE(dash.wait_for_requests(served + 3, 5s));  // polls keep coming, each one fine
  EXPECT_EQ(rec.error_count(), 0u);
  EXPECT_EQ(rec.doc_count(), 2u);
  EXPECT_TRUE(stop_drains());
}

/// A dashboard fault, what the error says, and how the fault is lifted.
struct dashboard_fault {
  const char* name;
  std::string first_body;  // what the dashboard serves before the fault ("" : the fault from the start)
  void (*fault)(testing::fake_dashboard&);
  void (*lift)(testing::fake_dashboard&);
  std::string says;          // in the error message
  bool names_the_url;
};

class DashboardFault : public TopologySourceIo, public ::testing::WithParamInterface<dashboard_fault> {};

INSTANTIATE_TEST_SUITE_P(
    TopologySource, DashboardFault,
    ::testing::Values(
        dashboard_fault{"ServerError", doc_json(30001), [](testing::fake_dashboard& d) { d.set_status(500); },
                        [](testing::fake_dashboard& d) { d.set_status(200); }, "HTTP 500", true},
        dashboard_fault{"Hang", doc_json(30001), [](testing::fake_dashboard& d) { d.set_hang(true); },
                        [](testing::fake_dashboard& d) { d.set_hang(false); }, "timed out after 200ms", false},
        dashboard_fault{"InvalidBody", "", [](testing::fake_dashboard& d) { d.set_body(R"({"target_groups": 5})"); },
                        [](testing::fake_dashboard&) {}, "target_groups", false}),
    [](const ::testing::TestParamInfo<dashboard_fault>& i) { return std::string(i.param.name); });

// A failed poll is an error, never a document (the caller keeps its last good one); the next good
// poll after the fault is lifted delivers the dashboard's new document.
TEST_P(DashboardFault, ReportedThenRecovered) {
  const auto& c = GetParam();
  testing::fake_dashboard dash({.body = c.first_body.empty() ? std::string("{}") : c.first_body});
  if (c.first_body.empty()) c.fault(dash);
  start_dashboard(dash.url(), 50ms, 200ms);
  const std::size_t good = c.first_body.empty() ? 0 : 1;
  if (good) {
    ASSERT_TRUE(rec.wait_docs(1));
    c.fault(dash);
  }
  ASSERT_TRUE(rec.wait_errors(1));
  EXPECT_NE(rec.error(0).find(c.says), std::string::npos) << rec.error(0);
  if (c.names_the_url) {
    EXPECT_NE(rec.error(0).find(dash.url()), std::string::npos) << rec.error(0);
  }
  EXPECT_EQ(rec.doc_count(), good);

  dash.set_body(doc_json(30002));
  c.lift(dash);
  ASSERT_TRUE(rec.wait_docs(good + 1));
  EXPECT_EQ(replica_port(rec.doc(good)), 30002);
}

TEST_F(TopologySourceIo, HttpSourceServesTargetGroupsDocumentViaHostName) {
  const auto body = test_file("topology/valid/target_groups.json");
  testing::fake_dashboard dash({.body = body, .path = "/topology"});
  // "localhost" goes through the resolver (it may yield ::1 first; the connect tries each).
  const auto url = "http://localhost:" + std::to_string(dash.port()) + "/topology";
  src = make_http_source(io.ioc(), url, 10s, 2s, rec.callbacks());
  EXPECT_EQ(src->describe(), "topology URL " + url);
  src->start();
  ASSERT_TRUE(rec.wait_docs(1)) << (rec.error_count() ? rec.error(0) : "");
  EXPECT_EQ(rec.doc(0), parsed(body));
  ASSERT_TRUE(rec.doc(0).http_fallback.has_value());
}

TEST_F(TopologySourceIo, HttpSourceConnectionRefusedBacksOff) {
  const auto url = "http://127.0.0.1:" + std::to_string(testing::dead_port()) + "/";
  src = make_http_source(io.ioc(), url, 20ms, 500ms, rec.callbacks());
  const auto t0 = steady::now();
  src->start();
  // Back-off 20, 40, 80, 160 ms between attempts: 5 errors take at least ~300 ms (a lower bound,
  // which no load can break).
  ASSERT_TRUE(rec.wait_errors(5));
  EXPECT_GE(steady::now() - t0, 280ms);
  EXPECT_NE(rec.error(0).find("connect"), std::string::npos) << rec.error(0);
  EXPECT_EQ(rec.doc_count(), 0u);
  EXPECT_TRUE(stop_drains());
}

TEST_F(TopologySourceIo, StopCancelsRequestInFlight) {
  testing::fake_dashboard dash({.body = doc_json(30001)});
  dash.set_hang(true);
  // The fetch may take 30 s: the dashboard seeing its connection close, and nothing left on the io
  // thread, well before that are stop()'s doing.
  start_dashboard(dash.url(), 50ms, 30s);
  ASSERT_TRUE(dash.wait_for_requests(1, 5s));  // the request is in flight, unanswered
  src->stop();
  EXPECT_TRUE(dash.wait_for_disconnects(1, 10s));  // our socket was closed
  EXPECT_TRUE(io.drains_within(10s));              // no timer or operation left
  EXPECT_EQ(rec.error_count(), 0u);  // stopping is not an error
  EXPECT_EQ(rec.doc_count(), 0u);
}

TEST_F(TopologySourceIo, DestroyWithoutStartOrAfterIoStops) {
  { auto never_started = make_dashboard_source(io.ioc(), "http://127.0.0.1:1", 50ms, 1s, rec.callbacks()); }
  start_file(doc_json(30001), std::nullopt);
  ASSERT_TRUE(io.sync());
  EXPECT_TRUE(stop_drains());
  src.reset();  // after the io_context stopped
  EXPECT_EQ(rec.error_count(), 0u);
}

}  // namespace
}  // namespace ingressd::topology
