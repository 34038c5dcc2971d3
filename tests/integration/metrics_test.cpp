// Metrics on the admin listener and the access log (contract §6), end to end: the daemon runs
// in-process with fake routers and replicas on loopback; known traffic (successes, every router
// failure reason, a client abort, an upstream abort) must show up as exact numbers on /metrics
// and as one JSON line per request in the access log. 127.0.0.2 is this node.
#include <atomic>
#include <chrono>
#include <filesystem>
#include <fstream>
#include <functional>
#include <map>
#include <memory>
#include <optional>
#include <sstream>
#include <string>
#include <thread>
#include <vector>

#include <gtest/gtest.h>
#include <nlohmann/json.hpp>
#include <unistd.h>

#include "fakes/admin_client.hpp"
#include "fakes/http_client.hpp"
#include "fakes/proxy_fixture.hpp"
#include "fakes/topology_builder.hpp"
#include "ingressd/demo/replica_server.hpp"
#include "ingressd/demo/router_server.hpp"

namespace ingressd {
namespace {

using namespace std::chrono_literals;
using demo::replica_behaviour;
using demo::replica_server;
using demo::router_behaviour;
using demo::router_server;
using testing::connection;
using testing::format_request;
using testing::http_get;
using testing::http_post;
using testing::http_response;

const std::string node_ip = "127.0.0.2";
const std::string loopback = "127.0.0.1";

/// Two apps: "llm" on /v1 (replica rep-a, one co-located router) and "plain" on /plain (replica
/// rep-b, no router). Nothing serves other paths.
struct cluster {
  std::unique_ptr<replica_server> rep_a = std::make_unique<replica_server>(
      replica_server::options{.name = "rep-a", .bind_ip = loopback, .port = 0, .token_delay = 1ms, .tokens = 2});
  std::unique_ptr<replica_server> rep_b = std::make_unique<replica_server>(
      replica_server::options{.name = "rep-b", .bind_ip = loopback, .port = 0, .token_delay = 1ms, .tokens = 2});
  std::unique_ptr<router_server> router =
      std::make_unique<router_server>(router_server::options{.name = "router-a", .bind_ip = node_ip, .port = 0});

  cluster() { router->set_replicas({"rep-a"}); }

  topology::document doc() const {
    return testing::topology_builder()
        .app("llm", "/v1", {testing::target_of(*rep_a)})
        .routers({testing::target_of(*router)})
        .app("plain", "/plain", {testing::target_of(*rep_b)})
        .build();
  }
};

config::config metrics_config(unsigned threads = 2) {
  auto c = testing::test_config(threads);
  c.router.timeout = 300ms;
  c.upstream.connect_timeout = 1s;
  c.upstream.first_byte_timeout = 5s;
  c.upstream.idle_timeout = 5s;
  return c;
}

http_response chat(const testing::proxy& p, const testing::header_list& headers = {}) {
  return http_post(loopback, p.port(), "/v1/chat/completions", headers, R"({"stream":false})", 5s);
}

using scrape = testing::metrics_scrape;

scrape get_metrics(const testing::proxy& p) { return testing::scrape_metrics(p.admin_port()); }

scrape metrics_when(const testing::proxy& p, const std::function<bool(const scrape&)>& ready,
                    std::chrono::milliseconds within = 5s) {
  return testing::scrape_until(p.admin_port(), ready, within);
}

/// A client that sends a request, waits until the replica has it, and resets the connection.
void client_abort(const testing::proxy& p, replica_server& rep, const std::string& target) {
  const auto before = rep.request_count();
  const auto aborted = rep.aborted_responses();
  auto c = connection::open(loopback, p.port());
  ASSERT_TRUE(c.connected()) << c.error();
  ASSERT_TRUE(c.write(format_request("GET", target, loopback, p.port(), {}, {})));
  ASSERT_TRUE(rep.wait_for_requests(before + 1, 5s));
  c.reset();
  ASSERT_TRUE(rep.wait_for_aborted_responses(aborted + 1, 5s));
}

/// The replica crashes (RST) after sending the response head and two events.
void upstream_abort(const testing::proxy& p, replica_server& rep, const std::string& target) {
  rep.queue_behaviour(replica_behaviour::reset_after_events(2));
  auto c = connection::open(loopback, p.port());
  ASSERT_TRUE(c.connected()) << c.error();
  ASSERT_TRUE(c.write(format_request("GET", target, loopback, p.port(), {}, {})));
  auto r = c.read_response(5s);
  EXPECT_EQ(r.status, 200u);
  EXPECT_FALSE(r.complete);
  EXPECT_TRUE(c.is_closed(2s));
}

TEST(Metrics, CountsKnownTrafficExactly) {
  cluster cl;
  testing::proxy p(metrics_config(2), node_ip);
  p.set_topology(cl.doc());

  // llm: 5 routed successes, then one of each router failure reason (router_unreachable last:
  // the router is then remembered as failing).
  for (int i = 0; i < 5; ++i) {
    auto r = chat(p);
    ASSERT_TRUE(r.complete) << r.error;
    ASSERT_EQ(r.status, 200u) << r.body;
  }
  const std::vector<std::pair<router_behaviour, std::string>> failures = {
      {router_behaviour::respond(500, R"({"detail":"boom"})"), "router_non_200"},
      {router_behaviour::respond(200, R"({"no":"replica"})"), "unparseable_replica_id"},
      {router_behaviour::respond(200, R"({"replica_id":"ghost"})"), "unknown_replica_id"},
      {router_behaviour::hang(), "router_unreachable"},
  };
  for (const auto& [behaviour, reason] : failures) {
    cl.router->queue_behaviour(behaviour);
    auto r = chat(p);
    ASSERT_TRUE(r.complete) << r.error;
    EXPECT_EQ(r.status, 503u) << reason;
    EXPECT_EQ(r.header("x-serve-reason").value_or(""), reason);
  }
  // plain: 3 successes, a client abort while the replica hangs, an upstream abort mid-stream.
  for (int i = 0; i < 3; ++i) {
    auto r = http_get(loopback, p.port(), "/plain/x", {}, 5s);
    ASSERT_TRUE(r.complete) << r.error;
    ASSERT_EQ(r.status, 200u);
  }
  cl.rep_b->queue_behaviour(replica_behaviour::hang());
  client_abort(p, *cl.rep_b, "/plain/hang");
  upstream_abort(p, *cl.rep_b, "/plain/stream");
  // No app: 404.
  {
    auto r = http_get(loopback, p.port(), "/nothing", {}, 5s);
    ASSERT_EQ(r.status, 404u);
  }
  // Probes are neither counted in requests_total nor logged.
  ASSERT_EQ(http_get(loopback, p.port(), "/-/healthz", {}, 5s).status, 200u);
  ASSERT_EQ(http_get(loopback, p.port(), "/-/routes", {}, 5s).status, 200u);

  const double total = 5 + 4 + 3 + 2 + 1;
  auto m = metrics_when(p, [&](const scrape& s) {
    return s.sum("ingressd_requests_total{") == total && s.at("ingressd_active_streams") == 0 &&
           s.at("ingressd_active_connections") == 0;
  });
  SCOPED_TRACE(m.text);

  EXPECT_EQ(m.at("ingressd_requests_received_total"), total + 2);  // + the two probes
  EXPECT_EQ(m.sum("ingressd_requests_total{"), total);
  EXPECT_EQ(m.at(R"(ingressd_requests_total{app="llm",code="200"})"), 5);
  EXPECT_EQ(m.at(R"(ingressd_requests_total{app="llm",code="503"})"), 4);
  EXPECT_EQ(m.at(R"(ingressd_requests_total{app="plain",code="200"})"), 4);  // incl. the cut stream
  EXPECT_EQ(m.at(R"(ingressd_requests_total{app="plain",code="499"})"), 1);  // the client left first
  EXPECT_EQ(m.at(R"(ingressd_requests_total{app="",code="404"})"), 1);

  for (const char* reason : {"router_non_200", "unparseable_replica_id", "unknown_replica_id", "router_unreachable"}) {
    EXPECT_EQ(m.at(std::string(R"(ingressd_router_failures_total{app="llm",reason=")") + reason + "\"}"), 1) << reason;
    EXPECT_EQ(m.at(std::string(R"(ingressd_router_latency_seconds_count{app="llm",outcome=")") + reason + "\"}"), 1)
        << reason;
  }
  EXPECT_EQ(m.at(R"(ingressd_router_latency_seconds_count{app="llm",outcome="ok"})"), 5);
  // The unreachable decision waited for router.timeout (300 ms).
  EXPECT_EQ(m.at(R"(ingressd_router_latency_seconds_bucket{app="llm",outcome="router_unreachable",le="0.25"})"), 0);
  EXPECT_EQ(m.at(R"(ingressd_router_latency_seconds_bucket{app="llm",outcome="router_unreachable",le="0.5"})"), 1);

  // Attempts: a 200 is "ok" even when its body is unusable (5 + unparseable + unknown).
  EXPECT_EQ(m.at(R"(ingressd_router_attempts_total{app="llm",router="router-a",result="ok"})"), 7);
  EXPECT_EQ(m.at(R"(ingressd_router_attempts_total{app="llm",router="router-a",result="non_200"})"), 1);
  EXPECT_EQ(m.at(R"(ingressd_router_attempts_total{app="llm",router="router-a",result="no_reply"})"), 1);
  EXPECT_EQ(m.at(R"(ingressd_router_truncations_total{app="llm"})"), 0);
  EXPECT_FALSE(m.has(R"(ingressd_router_failures_total{app="plain",reason="router_non_200"})"));

  // Histogram counts equal request counts, and +Inf equals _count.
  EXPECT_EQ(m.at(R"(ingressd_request_duration_seconds_count{app="llm"})"), 9);
  EXPECT_EQ(m.at(R"(ingressd_request_duration_seconds_bucket{app="llm",le="+Inf"})"), 9);
  EXPECT_EQ(m.at(R"(ingressd_request_duration_seconds_count{app="plain"})"), 5);
  EXPECT_EQ(m.at(R"(ingressd_request_duration_seconds_count{app=""})"), 1);
  EXPECT_GT(m.at(R"(ingressd_request_duration_seconds_sum{app="llm"})"), 0.3);  // the unreachable one alone
  // First byte: every response head from a replica (the hung one never sent one).
  EXPECT_EQ(m.at(R"(ingressd_upstream_first_byte_seconds_count{app="llm"})"), 5);
  EXPECT_EQ(m.at(R"(ingressd_upstream_first_byte_seconds_count{app="plain"})"), 4);
  EXPECT_FALSE(m.has(R"(ingressd_upstream_first_byte_seconds_count{app=""})"));

  // Gauges from the topology.
  EXPECT_EQ(m.at(R"(ingressd_router_colocated_ratio{app="llm"})"), 1);
  EXPECT_FALSE(m.has(R"(ingressd_router_colocated_ratio{app="plain"})"));
  EXPECT_EQ(m.at(R"(ingressd_replica_up{app="llm",replica="rep-a"})"), 1);
  EXPECT_EQ(m.at(R"(ingressd_replica_up{app="plain",replica="rep-b"})"), 1);
  EXPECT_EQ(m.at("ingressd_active_streams"), 0);
  EXPECT_EQ(m.at("ingressd_active_connections"), 0);
  EXPECT_EQ(m.at("ingressd_topology_updates_total"), 1);
  EXPECT_EQ(m.at("ingressd_topology_errors_total"), 0);
  for (const char* family : {"ingressd_requests_total", "ingressd_request_duration_seconds",
                             "ingressd_upstream_first_byte_seconds", "ingressd_router_latency_seconds",
                             "ingressd_router_attempts_total", "ingressd_router_failures_total",
                             "ingressd_router_truncations_total", "ingressd_router_colocated_ratio",
                             "ingressd_replica_up", "ingressd_active_connections", "ingressd_active_streams",
                             "ingressd_topology_updates_total", "ingressd_topology_errors_total"}) {
    EXPECT_NE(m.text.find(std::string("# TYPE ") + family + " "), std::string::npos) << family;
    EXPECT_NE(m.text.find(std::string("# HELP ") + family + " "), std::string::npos) << family;
  }
}

TEST(Metrics, ClientAbortMidStreamIsCounted499NotAsItsStatus) {
  // Issue #29 item 6: the response began with 200, then the client left. Counting it as a 200
  // hid every abandoned stream from the dashboards (only the access log said client_abort).
  cluster cl;
  testing::proxy p(metrics_config(1), node_ip);
  p.set_topology(cl.doc());
  cl.rep_b->queue_behaviour(replica_behaviour::stream_events(1000, 20ms));
  const auto aborted = cl.rep_b->aborted_responses();
  auto c = connection::open(loopback, p.port());
  ASSERT_TRUE(c.connected()) << c.error();
  ASSERT_TRUE(c.write(format_request("GET", "/plain/stream", loopback, p.port(), {}, {})));
  std::string got;
  for (int i = 0; i < 100 && got.find("data:") == std::string::npos; ++i) got = c.read_until_close(100ms).bytes;
  ASSERT_NE(got.find("HTTP/1.1 200"), std::string::npos) << got;
  ASSERT_NE(got.find("data:"), std::string::npos) << "the stream had begun";
  c.reset();
  ASSERT_TRUE(cl.rep_b->wait_for_aborted_responses(aborted + 1, 5s));
  auto m = metrics_when(p, [](const scrape& s) { return s.sum("ingressd_requests_total{") == 1; });
  SCOPED_TRACE(m.text);
  EXPECT_EQ(m.at(R"(ingressd_requests_total{app="plain",code="499"})"), 1);
  EXPECT_FALSE(m.has(R"(ingressd_requests_total{app="plain",code="200"})"));
}

TEST(Metrics, CountsSurviveTopologyChangesAndFollowHealth) {
  cluster cl;
  testing::proxy p(metrics_config(1), node_ip);
  p.set_topology(cl.doc());
  for (int i = 0; i < 3; ++i) ASSERT_EQ(chat(p).status, 200u);

  // The same apps in another order, plus a new one: counts stay with their app names.
  auto doc = cl.doc();
  std::swap(doc.apps[0], doc.apps[1]);
  topology::app extra;
  extra.name = "extra";
  extra.route_prefix = "/extra";
  extra.replicas = {testing::target_of(*cl.rep_b)};
  doc.apps.push_back(extra);
  p.set_topology(doc);
  ASSERT_EQ(chat(p).status, 200u);
  ASSERT_EQ(http_get(loopback, p.port(), "/extra/y", {}, 5s).status, 200u);
  p.daemon().set_replica_health(testing::target_of(*cl.rep_b).ip + ":" + std::to_string(cl.rep_b->port()), false);
  p.daemon().count_topology_error();

  auto m = metrics_when(p, [](const scrape& s) { return s.sum("ingressd_requests_total{") == 5; });
  SCOPED_TRACE(m.text);
  EXPECT_EQ(m.at(R"(ingressd_requests_total{app="llm",code="200"})"), 4);
  EXPECT_EQ(m.at(R"(ingressd_requests_total{app="extra",code="200"})"), 1);
  EXPECT_EQ(m.at(R"(ingressd_router_attempts_total{app="llm",router="router-a",result="ok"})"), 4);
  EXPECT_EQ(m.at(R"(ingressd_request_duration_seconds_count{app="plain"})"), 0);
  EXPECT_EQ(m.at(R"(ingressd_replica_up{app="llm",replica="rep-a"})"), 1);
  EXPECT_EQ(m.at(R"(ingressd_replica_up{app="plain",replica="rep-b"})"), 0);
  EXPECT_EQ(m.at(R"(ingressd_replica_up{app="extra",replica="rep-b"})"), 0);
  EXPECT_EQ(m.at("ingressd_topology_updates_total"), 2);
  EXPECT_EQ(m.at("ingressd_topology_errors_total"), 1);
}

TEST(Metrics, ScrapesDuringTrafficAndTopologyChangesLoseNothing) {
  // Workers write while the admin thread reads and while blocks and router slots are rebuilt:
  // every request is still counted once (run under TSan for the race check).
  cluster cl;
  testing::proxy p(metrics_config(2), node_ip);
  p.set_topology(cl.doc());
  constexpr int requests = 40;
  std::atomic<int> ok{0};
  std::thread client([&] {
    for (int i = 0; i < requests; ++i) ok += chat(p).status == 200 ? 1 : 0;
  });
  for (int i = 0; i < 10; ++i) {
    auto doc = cl.doc();
    if (i % 2) std::swap(doc.apps[0], doc.apps[1]);
    p.set_topology(doc);
    get_metrics(p);
  }
  client.join();
  ASSERT_EQ(ok.load(), requests);
  auto m = metrics_when(p, [](const scrape& s) { return s.sum("ingressd_requests_total{") == requests; });
  EXPECT_EQ(m.at(R"(ingressd_requests_total{app="llm",code="200"})"), requests) << m.text;
  EXPECT_EQ(m.at(R"(ingressd_request_duration_seconds_count{app="llm"})"), requests);
  EXPECT_EQ(m.at(R"(ingressd_router_latency_seconds_count{app="llm",outcome="ok"})"), requests);
  EXPECT_EQ(m.at(R"(ingressd_router_attempts_total{app="llm",router="router-a",result="ok"})"), requests);
  EXPECT_EQ(m.at("ingressd_topology_updates_total"), 11);
}

TEST(Metrics, CountsTruncatedRouterBodies) {
  cluster cl;
  auto cfg = metrics_config(1);
  cfg.router.forward_body = true;
  cfg.router.body_limit = 16;
  testing::proxy p(cfg, node_ip);
  p.set_topology(cl.doc());
  ASSERT_EQ(http_post(loopback, p.port(), "/v1/completions", {}, std::string(100, 'x'), 5s).status, 200u);
  ASSERT_EQ(http_post(loopback, p.port(), "/v1/completions", {}, "short", 5s).status, 200u);
  auto m = metrics_when(p, [](const scrape& s) { return s.sum("ingressd_requests_total{") == 2; });
  EXPECT_EQ(m.at(R"(ingressd_router_truncations_total{app="llm"})"), 1) << m.text;
  const auto routed = cl.router->route_requests();
  ASSERT_EQ(routed.size(), 2u);
  EXPECT_EQ(routed[0].header("x-body-truncated").value_or(""), "16/100");
}

// --- access log -------------------------------------------------------------------------------

std::vector<nlohmann::json> wait_log(const std::string& path, std::size_t n) {
  return testing::wait_json_lines(path, n);
}

const nlohmann::json* find_by_id(const std::vector<nlohmann::json>& lines, const std::string& id) {
  for (const auto& l : lines)
    if (l.value("request_id", "") == id) return &l;
  return nullptr;
}

TEST(Metrics, AccessLogHasOneLinePerRequest) {
  const auto dir = std::filesystem::temp_directory_path() / ("ingressd-access-" + std::to_string(::getpid()));
  std::filesystem::create_directories(dir);
  const std::string path = (dir / "access.log").string();
  std::filesystem::remove(path);

  cluster cl;
  auto cfg = metrics_config(2);
  cfg.access_log = path;
  std::vector<nlohmann::json> lines;
  {
    testing::proxy p(cfg, node_ip);
    p.set_topology(cl.doc());
    auto r1 = chat(p, {{"X-Request-Id", "client-id-1"}});
    ASSERT_EQ(r1.status, 200u);
    auto r2 = chat(p);  // id generated by ingressd
    ASSERT_EQ(r2.status, 200u);
    cl.router->queue_behaviour(router_behaviour::respond(500, R"({"detail":"boom"})"));
    ASSERT_EQ(chat(p, {{"X-Request-Id", "fails-1"}}).status, 503u);
    auto plain = http_get(loopback, p.port(), "/plain/x", {{"X-Request-Id", "plain-1"}}, 5s);
    ASSERT_EQ(plain.status, 200u);
    ASSERT_EQ(http_get(loopback, p.port(), "/-/healthz", {}, 5s).status, 200u);
    ASSERT_EQ(http_get(loopback, p.port(), "/-/routes", {}, 5s).status, 200u);
    ASSERT_EQ(http_get(loopback, p.port(), "/nothing?secret=1", {{"X-Request-Id", "none-1"}}, 5s).status, 404u);
    cl.rep_b->queue_behaviour(replica_behaviour::hang());
    client_abort(p, *cl.rep_b, "/plain/hang");
    upstream_abort(p, *cl.rep_b, "/plain/stream");

    lines = wait_log(path, 7);
    ASSERT_EQ(lines.size(), 7u);

    // Exactly one line per request routed to a replica, with the id the replica saw.
    std::vector<demo::recorded_request> seen = cl.rep_a->requests();
    for (const auto& r : cl.rep_b->requests()) seen.push_back(r);
    ASSERT_EQ(seen.size(), 5u);
    for (const auto& r : seen) {
      const auto id = r.header("x-request-id").value_or("<none>");
      const auto* l = find_by_id(lines, id);
      ASSERT_NE(l, nullptr) << "no access log line for request id " << id;
      EXPECT_EQ((*l)["path"], r.path());
      EXPECT_EQ((*l)["replica_addr"], loopback + ":" + std::to_string(r.path().starts_with("/v1") ? cl.rep_a->port()
                                                                                             : cl.rep_b->port()));
    }

    const auto* routed = find_by_id(lines, "client-id-1");
    ASSERT_NE(routed, nullptr);
    const auto& l = *routed;
    EXPECT_EQ(l["method"], "POST");
    EXPECT_EQ(l["path"], "/v1/chat/completions");
    EXPECT_EQ(l["app"], "llm");
    EXPECT_EQ(l["client"], loopback);
    EXPECT_EQ(l["status"], 200);
    EXPECT_EQ(l["bytes"], r1.body.size());
    EXPECT_EQ(l["router"], "router-a");
    EXPECT_EQ(l["router_hedged"], false);
    EXPECT_EQ(l["router_addr"], node_ip + ":" + std::to_string(cl.router->port()));
    EXPECT_EQ(l["router_outcome"], "ok");
    EXPECT_TRUE(l["router_latency"].is_number());
    EXPECT_EQ(l["replica"], "rep-a");
    EXPECT_EQ(l["retries"], 0);
    EXPECT_EQ(l["termination"], "ok");
    EXPECT_TRUE(l["reason"].is_null());
    EXPECT_TRUE(l["duration"].is_number());
    EXPECT_GE(l["duration"].get<double>(), l["router_latency"].get<double>());
    ASSERT_TRUE(l["time"].is_string());
    EXPECT_EQ(l["time"].get<std::string>().size(), 24u) << l["time"];  // 2024-05-01T12:00:00.123Z

    const auto* generated = find_by_id(lines, cl.rep_a->requests()[1].header("x-request-id").value_or("?"));
    ASSERT_NE(generated, nullptr);
    EXPECT_EQ((*generated)["request_id"].get<std::string>().size(), 36u);  // a UUID

    const auto* failed = find_by_id(lines, "fails-1");
    ASSERT_NE(failed, nullptr);
    EXPECT_EQ((*failed)["status"], 503);
    EXPECT_EQ((*failed)["router_outcome"], "router_non_200");
    EXPECT_EQ((*failed)["reason"], "router_non_200");
    EXPECT_TRUE((*failed)["replica"].is_null());
    EXPECT_EQ((*failed)["termination"], "ok");
    EXPECT_EQ((*failed)["bytes"], std::string("Ingress request router failed: router_non_200").size());

    const auto* p1 = find_by_id(lines, "plain-1");
    ASSERT_NE(p1, nullptr);
    EXPECT_EQ((*p1)["app"], "plain");
    EXPECT_TRUE((*p1)["router"].is_null());
    EXPECT_TRUE((*p1)["router_latency"].is_null());
    EXPECT_TRUE((*p1)["router_outcome"].is_null());
    EXPECT_EQ((*p1)["replica"], "rep-b");
    EXPECT_EQ((*p1)["bytes"], plain.body.size());

    const auto* none = find_by_id(lines, "none-1");
    ASSERT_NE(none, nullptr);
    EXPECT_EQ((*none)["app"], "");
    EXPECT_EQ((*none)["path"], "/nothing");  // no query string
    EXPECT_EQ((*none)["status"], 404);
    EXPECT_EQ((*none)["reason"], "no_route");

    std::map<std::string, std::string> by_path;
    for (const auto& x : lines) by_path[x["path"].get<std::string>()] = x["termination"].get<std::string>();
    EXPECT_EQ(by_path["/plain/hang"], "client_abort");
    EXPECT_EQ(by_path["/plain/stream"], "upstream_abort");
    EXPECT_FALSE(by_path.contains("/-/healthz"));
    EXPECT_FALSE(by_path.contains("/-/routes"));
    for (const auto& x : lines) {
      if (x["path"] == "/plain/hang") {
        EXPECT_EQ(x["status"], 499);
      }
    }
  }
  // Stopping the daemon writes nothing more.
  EXPECT_EQ(testing::read_json_lines(path).size(), 7u);
  std::filesystem::remove_all(dir);
}

TEST(Metrics, AccessLogReopensOnRequest) {
  const auto dir = std::filesystem::temp_directory_path() / ("ingressd-rotate-" + std::to_string(::getpid()));
  std::filesystem::create_directories(dir);
  const std::string path = (dir / "access.log").string();
  std::filesystem::remove(path);
  std::filesystem::remove(path + ".1");

  cluster cl;
  auto cfg = metrics_config(1);
  cfg.access_log = path;
  testing::proxy p(cfg, node_ip);
  p.set_topology(cl.doc());
  ASSERT_EQ(http_get(loopback, p.port(), "/plain/a", {}, 5s).status, 200u);
  ASSERT_EQ(wait_log(path, 1).size(), 1u);
  std::filesystem::rename(path, path + ".1");  // logrotate
  ASSERT_TRUE(p.daemon().reopen_access_log());   // what SIGUSR1 does
  ASSERT_EQ(http_get(loopback, p.port(), "/plain/b", {}, 5s).status, 200u);
  auto fresh = wait_log(path, 1);
  ASSERT_EQ(fresh.size(), 1u);
  EXPECT_EQ(fresh[0]["path"], "/plain/b");
  EXPECT_EQ(testing::read_json_lines(path + ".1").size(), 1u);
  std::filesystem::remove_all(dir);
}

}  // namespace
}  // namespace ingressd
