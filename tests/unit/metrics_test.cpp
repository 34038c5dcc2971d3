// Metrics building blocks (contract §6): fixed-bucket histograms, status-code slots, per-worker
// app blocks across topology changes, the Prometheus text exposition, and the access log format
// and file handling.
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <sstream>
#include <string>
#include <thread>
#include <vector>

#include <gtest/gtest.h>
#include <nlohmann/json.hpp>
#include <sys/resource.h>
#include <unistd.h>

#include "ingressd/metrics/access_log.hpp"
#include "ingressd/metrics/exposition.hpp"
#include "ingressd/metrics/histogram.hpp"
#include "ingressd/metrics/process.hpp"
#include "ingressd/metrics/prometheus.hpp"
#include "ingressd/metrics/request_metrics.hpp"
#include "ingressd/topology/snapshot.hpp"

namespace ingressd::metrics {
namespace {

using namespace std::chrono_literals;

bool contains_line(const std::string& text, const std::string& line) {
  std::istringstream in(text);
  for (std::string l; std::getline(in, l);)
    if (l == line) return true;
  return false;
}

std::size_t count_prefix(const std::string& text, const std::string& prefix) {
  std::istringstream in(text);
  std::size_t n = 0;
  for (std::string l; std::getline(in, l);)
    if (l.rfind(prefix, 0) == 0) ++n;
  return n;
}

topology::target t(std::string ip, std::uint16_t port, std::string name) {
  return topology::target{std::move(ip), port, "i-" + name, std::move(name)};
}

/// llm: replicas rep-a/rep-b, routers rt-5a, rt-5b on this node (10.0.0.5) and rt-6 elsewhere.
topology::document sample() {
  topology::document d;
  topology::app llm;
  llm.name = "llm";
  llm.route_prefix = "/v1";
  llm.replicas = {t("10.0.0.5", 30001, "rep-a"), t("10.0.0.6", 30001, "rep-b")};
  llm.routers = {t("10.0.0.6", 30004, "rt-6"), t("10.0.0.5", 30005, "rt-5b"), t("10.0.0.5", 30004, "rt-5a")};
  topology::app echo;
  echo.name = "echo";
  echo.route_prefix = "/";
  echo.replicas = {t("10.0.0.7", 8000, "echo-1")};
  d.apps = {llm, echo};
  return d;
}

// --- histogram -------------------------------------------------------------------------------

TEST(MetricsHistogram, BucketsAreInclusiveUpperBounds) {
  bucket_layout l{0.001, 0.01, 0.1};
  histogram h(l);
  h.observe(0ns);
  h.observe(1ms);          // == first bound: first bucket
  h.observe(1ms + 1ns);    // just above: second
  h.observe(100ms);        // == last bound
  h.observe(5s);           // +Inf
  h.observe(-3ms);         // negative counts as 0
  EXPECT_EQ(h.bucket(0), 3u);
  EXPECT_EQ(h.bucket(1), 1u);
  EXPECT_EQ(h.bucket(2), 1u);
  EXPECT_EQ(h.bucket(3), 1u);
  EXPECT_EQ(h.count(), 6u);
  EXPECT_EQ(h.sum_ns(), (1ms + 1ms + 1ns + 100ms + 5s).count());
}

TEST(MetricsHistogram, DataSumsHistograms) {
  histogram a(router_buckets()), b(router_buckets());
  a.observe(1ms);
  b.observe(1ms);
  b.observe(20s);
  histogram_data d;
  d.add(a);
  d.add(b);
  EXPECT_EQ(d.count(), 3u);
  EXPECT_EQ(d.buckets.back(), 1u);
  EXPECT_EQ(d.sum_ns, std::uint64_t(std::chrono::nanoseconds(2ms + 20s).count()));
  EXPECT_EQ(d.layout, &router_buckets());
}

// --- text format ------------------------------------------------------------------------------

TEST(MetricsText, EscapesLabelValuesAndHelp) {
  EXPECT_EQ(escape_label_value(R"(a"b\c)" "\n" "d"), R"(a\"b\\c\nd)");
  EXPECT_EQ(escape_help("x\\y\nz\""), "x\\\\y\\nz\"");
  text_writer w;
  w.family("m_total", "Help with\nnewline.", "counter");
  w.sample("m_total", {{"app", "we\"ird"}, {"code", "200"}}, std::uint64_t{7});
  w.sample("m_total", {}, std::uint64_t{1});
  EXPECT_EQ(w.str(),
            "# HELP m_total Help with\\nnewline.\n"
            "# TYPE m_total counter\n"
            "m_total{app=\"we\\\"ird\",code=\"200\"} 7\n"
            "m_total 1\n");
}

TEST(MetricsText, FormatsValues) {
  EXPECT_EQ(format_value(1.0), "1");
  EXPECT_EQ(format_value(0.5), "0.5");
  EXPECT_EQ(format_value(0.0005), "0.0005");
  EXPECT_EQ(format_value(1.0 / 0.0), "+Inf");
}

TEST(MetricsText, HistogramIsCumulativeWithSumAndCount) {
  bucket_layout l{0.1, 1};
  histogram h(l);
  h.observe(50ms);
  h.observe(500ms);
  h.observe(500ms);
  h.observe(2s);
  histogram_data d;
  d.add(h);
  text_writer w;
  w.histogram("lat_seconds", {{"app", "x"}}, d);
  EXPECT_EQ(w.str(),
            "lat_seconds_bucket{app=\"x\",le=\"0.1\"} 1\n"
            "lat_seconds_bucket{app=\"x\",le=\"1\"} 3\n"
            "lat_seconds_bucket{app=\"x\",le=\"+Inf\"} 4\n"
            "lat_seconds_sum{app=\"x\"} 3.05\n"
            "lat_seconds_count{app=\"x\"} 4\n");
}

// --- status codes -----------------------------------------------------------------------------

TEST(MetricsStatus, CountsCodesInFirstSeenOrder) {
  status_counters c;
  for (unsigned code : {200u, 200u, 503u, 404u, 200u, 503u}) c.add(code);
  std::vector<std::pair<unsigned, std::uint64_t>> seen;
  c.for_each([&](unsigned code, std::uint64_t n) { seen.emplace_back(code, n); });
  EXPECT_EQ(seen, (std::vector<std::pair<unsigned, std::uint64_t>>{{200, 3}, {503, 2}, {404, 1}}));
  EXPECT_EQ(c.other(), 0u);
}

TEST(MetricsStatus, OverflowGoesToOther) {
  status_counters c;
  for (unsigned code = 100; code < 100 + status_counters::capacity + 3; ++code) c.add(code);
  c.add(100);   // has a slot
  c.add(1234);  // out of range
  std::size_t slots = 0;
  std::uint64_t total = 0;
  c.for_each([&](unsigned, std::uint64_t n) {
    ++slots;
    total += n;
  });
  EXPECT_EQ(slots, status_counters::capacity);
  EXPECT_EQ(total, status_counters::capacity + 1);
  EXPECT_EQ(c.other(), 4u);
}

// --- worker blocks ----------------------------------------------------------------------------

TEST(MetricsWorker, BlocksFollowAppsByNameAndKeepCounts) {
  worker_metrics wm;
  auto s1 = topology::make_snapshot(sample(), "10.0.0.5", "", 1);
  auto b1 = wm.apply(*s1);
  ASSERT_EQ(b1.size(), 2u);
  EXPECT_EQ(b1[0]->name, "llm");
  EXPECT_EQ(b1[1]->name, "echo");
  EXPECT_EQ(wm.no_app().name, "");
  // Pool: the co-located routers, sorted by (ip, port).
  ASSERT_EQ(b1[0]->routers().size(), 2u);
  EXPECT_EQ(b1[0]->routers()[0]->label, "rt-5a");
  EXPECT_EQ(b1[0]->routers()[1]->label, "rt-5b");
  EXPECT_TRUE(b1[1]->routers().empty());

  b1[0]->codes.add(200);
  b1[0]->router(0, "10.0.0.5:30004")->results[0].add();
  b1[0]->router(1, "10.0.0.5:30005")->results[1].add();
  // An index that no longer matches falls back to the key; an unknown key finds nothing.
  EXPECT_EQ(b1[0]->router(0, "10.0.0.5:30005"), b1[0]->routers()[1].get());
  EXPECT_EQ(b1[0]->router(0, "10.9.9.9:1"), nullptr);

  // Swap the apps' order, drop rt-5b: the llm block and rt-5a's counts stay.
  auto doc = sample();
  std::swap(doc.apps[0], doc.apps[1]);
  doc.apps[1].routers.erase(doc.apps[1].routers.begin() + 1);
  auto s2 = topology::make_snapshot(doc, "10.0.0.5", "", 2);
  auto b2 = wm.apply(*s2);
  EXPECT_EQ(b2[1], b1[0]);
  EXPECT_EQ(b2[0], b1[1]);
  ASSERT_EQ(b2[1]->routers().size(), 1u);
  EXPECT_EQ(b2[1]->routers()[0]->label, "rt-5a");
  EXPECT_EQ(b2[1]->routers()[0]->results[0].get(), 1u);

  // Remove llm: its block (and counts) stay visible; its router slots go.
  doc.apps.pop_back();
  auto s3 = topology::make_snapshot(doc, "10.0.0.5", "", 3);
  auto b3 = wm.apply(*s3);
  ASSERT_EQ(b3.size(), 1u);
  std::vector<std::string> names;
  wm.visit([&](const app_metrics& b) { names.push_back(b.name); });
  EXPECT_EQ(names, (std::vector<std::string>{"", "llm", "echo"}));
  EXPECT_TRUE(b1[0]->routers().empty());
  std::uint64_t ok = 0;
  b1[0]->codes.for_each([&](unsigned code, std::uint64_t n) { ok += code == 200 ? n : 0; });
  EXPECT_EQ(ok, 1u);
}

TEST(MetricsWorker, RouterOutcomeNames) {
  EXPECT_EQ(router_outcome_index(std::nullopt), 0u);
  EXPECT_EQ(router_outcome_name(0), "ok");
  for (reason r : {reason::router_unreachable, reason::router_non_200, reason::unparseable_replica_id,
                   reason::unknown_replica_id}) {
    const auto i = router_outcome_index(r);
    EXPECT_GT(i, 0u);
    EXPECT_LT(i, router_outcome_count);
    EXPECT_EQ(router_outcome_name(i), to_string(r));
  }
  EXPECT_EQ(router_outcome_index(reason::upstream_error), 0u);
}

// --- exposition -------------------------------------------------------------------------------

TEST(MetricsRender, SumsWorkersAndRendersEveryFamily) {
  auto snap = topology::make_snapshot(sample(), "10.0.0.5", "", 1);
  worker_metrics w1, w2;
  auto a = w1.apply(*snap);
  auto b = w2.apply(*snap);
  a[0]->codes.add(200);
  b[0]->codes.add(200);
  b[0]->codes.add(503);
  a[0]->duration.observe(30ms);
  b[0]->duration.observe(30ms);
  b[0]->duration.observe(2ms);
  a[0]->first_byte.observe(10ms);
  a[0]->router_latency[0].observe(1ms);
  b[0]->router_latency[router_outcome_index(reason::router_non_200)].observe(2ms);
  b[0]->router_failures[router_outcome_index(reason::router_non_200)].add();
  a[0]->router(0, "10.0.0.5:30004")->results[static_cast<std::size_t>(attempt_result::ok)].add();
  b[0]->router(0, "10.0.0.5:30004")->results[static_cast<std::size_t>(attempt_result::non_200)].add();
  a[0]->truncations.add();
  a[0]->router(0, "10.0.0.5:30004")->latency.observe(1ms);
  b[0]->router(0, "10.0.0.5:30004")->latency.observe(3ms);
  a[0]->generated[static_cast<std::size_t>(reason::upstream_timeout)].add();
  b[0]->generated[static_cast<std::size_t>(reason::upstream_timeout)].add();
  w1.no_app().codes.add(404);
  w1.no_app().duration.observe(1ms);
  w1.no_app().generated[static_cast<std::size_t>(reason::no_route)].add();

  scrape_input in;
  in.workers = {&w1, &w2};
  in.requests_received = 5;
  in.active_connections = 2;
  in.active_streams = 1;
  in.topology = snap.get();
  // Health and mark-downs come from the snapshot's node-wide upstream states.
  snap->states.at("10.0.0.6:30001")->up = false;
  snap->states.at("10.0.0.6:30001")->downs_by_errors = 2;
  snap->states.at("10.0.0.6:30001")->downs_by_check = 1;
  snap->states.at("10.0.0.5:30001")->in_flight = 4;
  in.topology_updates = 3;
  in.topology_errors = 1;
  in.topology_last_success = 1700000000.5;
  in.draining = true;
  const std::string text = render(in);

  for (const char* family :
       {"ingressd_requests_total", "ingressd_request_duration_seconds", "ingressd_upstream_first_byte_seconds",
        "ingressd_router_latency_seconds", "ingressd_router_attempts_total", "ingressd_router_failures_total",
        "ingressd_router_truncations_total", "ingressd_router_colocated_ratio", "ingressd_replica_up",
        "ingressd_replica_marked_down_total", "ingressd_active_connections", "ingressd_active_streams",
        "ingressd_topology_updates_total", "ingressd_topology_errors_total", "ingressd_requests_received_total",
        "ingressd_generated_responses_total", "ingressd_router_attempt_latency_seconds", "ingressd_replica_in_flight",
        "ingressd_topology_last_update_timestamp_seconds", "ingressd_topology_last_success_timestamp_seconds",
        "ingressd_draining"}) {
    EXPECT_EQ(count_prefix(text, std::string("# TYPE ") + family + " "), 1u) << family;
    EXPECT_EQ(count_prefix(text, std::string("# HELP ") + family + " "), 1u) << family;
  }
  EXPECT_TRUE(contains_line(text, "ingressd_requests_total{app=\"llm\",code=\"200\"} 2"));
  EXPECT_TRUE(contains_line(text, "ingressd_requests_total{app=\"llm\",code=\"503\"} 1"));
  EXPECT_TRUE(contains_line(text, "ingressd_requests_total{app=\"\",code=\"404\"} 1"));
  EXPECT_TRUE(contains_line(text, "ingressd_request_duration_seconds_count{app=\"llm\"} 3"));
  EXPECT_TRUE(contains_line(text, "ingressd_request_duration_seconds_bucket{app=\"llm\",le=\"0.025\"} 1"));
  EXPECT_TRUE(contains_line(text, "ingressd_request_duration_seconds_bucket{app=\"llm\",le=\"0.05\"} 3"));
  EXPECT_TRUE(contains_line(text, "ingressd_request_duration_seconds_count{app=\"echo\"} 0"));
  EXPECT_TRUE(contains_line(text, "ingressd_request_duration_seconds_count{app=\"\"} 1"));
  EXPECT_TRUE(contains_line(text, "ingressd_upstream_first_byte_seconds_count{app=\"llm\"} 1"));
  EXPECT_FALSE(contains_line(text, "ingressd_upstream_first_byte_seconds_count{app=\"\"} 0"));
  EXPECT_TRUE(contains_line(text, "ingressd_router_latency_seconds_count{app=\"llm\",outcome=\"ok\"} 1"));
  EXPECT_TRUE(contains_line(text, "ingressd_router_latency_seconds_count{app=\"llm\",outcome=\"router_non_200\"} 1"));
  EXPECT_TRUE(contains_line(text, "ingressd_router_attempts_total{app=\"llm\",router=\"rt-5a\",result=\"ok\"} 1"));
  EXPECT_TRUE(contains_line(text, "ingressd_router_attempts_total{app=\"llm\",router=\"rt-5a\",result=\"non_200\"} 1"));
  EXPECT_TRUE(contains_line(text, "ingressd_router_attempts_total{app=\"llm\",router=\"rt-5b\",result=\"no_reply\"} 0"));
  EXPECT_TRUE(contains_line(text, "ingressd_router_failures_total{app=\"llm\",reason=\"router_non_200\"} 1"));
  EXPECT_TRUE(contains_line(text, "ingressd_router_failures_total{app=\"llm\",reason=\"router_unreachable\"} 0"));
  EXPECT_EQ(count_prefix(text, "ingressd_router_failures_total{app=\"echo\""), 0u);
  EXPECT_TRUE(contains_line(text, "ingressd_router_truncations_total{app=\"llm\"} 1"));
  EXPECT_TRUE(contains_line(text, "ingressd_router_colocated_ratio{app=\"llm\"} 1"));
  EXPECT_EQ(count_prefix(text, "ingressd_router_colocated_ratio{app=\"echo\""), 0u);
  EXPECT_TRUE(contains_line(text, "ingressd_replica_up{app=\"llm\",replica=\"rep-a\"} 1"));
  EXPECT_TRUE(contains_line(text, "ingressd_replica_up{app=\"llm\",replica=\"rep-b\"} 0"));
  EXPECT_TRUE(contains_line(text, "ingressd_replica_up{app=\"echo\",replica=\"echo-1\"} 1"));
  EXPECT_TRUE(contains_line(
      text, "ingressd_replica_marked_down_total{app=\"llm\",replica=\"rep-b\",cause=\"connection_errors\"} 2"));
  EXPECT_TRUE(contains_line(
      text, "ingressd_replica_marked_down_total{app=\"llm\",replica=\"rep-b\",cause=\"health_check\"} 1"));
  EXPECT_TRUE(contains_line(
      text, "ingressd_replica_marked_down_total{app=\"llm\",replica=\"rep-a\",cause=\"health_check\"} 0"));
  EXPECT_TRUE(contains_line(text, "ingressd_active_connections 2"));
  EXPECT_TRUE(contains_line(text, "ingressd_active_streams 1"));
  EXPECT_TRUE(contains_line(text, "ingressd_topology_updates_total 3"));
  EXPECT_TRUE(contains_line(text, "ingressd_topology_errors_total 1"));
  EXPECT_TRUE(contains_line(text, "ingressd_requests_received_total 5"));

  // Generated responses: every reason of a named app from zero on, but no_route only for app="".
  EXPECT_TRUE(contains_line(text, "ingressd_generated_responses_total{app=\"llm\",reason=\"upstream_timeout\"} 2"));
  EXPECT_TRUE(contains_line(text, "ingressd_generated_responses_total{app=\"echo\",reason=\"upstream_error\"} 0"));
  EXPECT_TRUE(contains_line(text, "ingressd_generated_responses_total{app=\"\",reason=\"no_route\"} 1"));
  EXPECT_EQ(count_prefix(text, "ingressd_generated_responses_total{app=\"llm\",reason=\"no_route\""), 0u);
  EXPECT_EQ(count_prefix(text, "ingressd_generated_responses_total{app=\"\",reason=\"upstream_error\""), 0u);
  EXPECT_EQ(count_prefix(text, "ingressd_generated_responses_total{app=\"llm\""), reason_count - 1);

  // Per-router call latency, summed over workers, labelled with where the router is (the pool
  // holds the co-located routers only, rt-6 is not in it).
  EXPECT_TRUE(contains_line(
      text, "ingressd_router_attempt_latency_seconds_count{app=\"llm\",router=\"rt-5a\",colocated=\"true\"} 2"));
  EXPECT_TRUE(contains_line(
      text, "ingressd_router_attempt_latency_seconds_sum{app=\"llm\",router=\"rt-5a\",colocated=\"true\"} 0.004"));
  EXPECT_TRUE(contains_line(
      text, "ingressd_router_attempt_latency_seconds_count{app=\"llm\",router=\"rt-5b\",colocated=\"true\"} 0"));

  EXPECT_TRUE(contains_line(text, "ingressd_replica_in_flight{app=\"llm\",replica=\"rep-a\"} 4"));
  EXPECT_TRUE(contains_line(text, "ingressd_replica_in_flight{app=\"echo\",replica=\"echo-1\"} 0"));
  const auto updated = std::chrono::duration<double>(snap->updated.time_since_epoch()).count();
  EXPECT_TRUE(contains_line(text, "ingressd_topology_last_update_timestamp_seconds " + format_value(updated)));
  EXPECT_TRUE(contains_line(text, "ingressd_topology_last_success_timestamp_seconds 1700000000.5"));
  EXPECT_TRUE(contains_line(text, "ingressd_draining 1"));
  EXPECT_EQ(count_prefix(text, "process_"), 0u);  // not asked for
}

TEST(MetricsRender, WithoutSourceOrTopologyTimestampsHaveNoSample) {
  scrape_input in;
  const std::string text = render(in);
  EXPECT_EQ(count_prefix(text, "ingressd_topology_last_update_timestamp_seconds "), 0u);
  EXPECT_EQ(count_prefix(text, "ingressd_topology_last_success_timestamp_seconds "), 0u);
  EXPECT_TRUE(contains_line(text, "ingressd_draining 0"));
  EXPECT_EQ(count_prefix(text, "ingressd_replica_in_flight{"), 0u);
}

/// Every family and every branch of the exposition at once (TLS, gRPC, Ray's series, hedging,
/// a draining node, process stats), compared byte for byte with a file: the renderer's layout
/// may change, its output may not without the golden file changing in the same commit.
TEST(MetricsRender, MatchesTheGoldenExposition) {
  auto doc = sample();
  topology::app chat;
  chat.name = "chat";
  chat.replicas = {t("10.0.0.5", 9000, "chat-1")};
  topology::app quiet;  // a gRPC app nothing was counted for yet
  quiet.name = "quiet";
  quiet.replicas = {t("10.0.0.5", 9001, "quiet-1")};
  doc.grpc_apps = {chat, quiet};
  doc.apps[0].replicas.push_back(t("10.0.0.5", 30001, "rep-a"));  // listed twice: one series
  doc.proxies = {{"node-5", "10.0.0.5", "DRAINING"}};
  auto snap = topology::make_snapshot(doc, "10.0.0.5", "", 7, "file /t.json");
  // The scrape sees a newer topology than the workers applied: "late" has no blocks yet.
  topology::app late;
  late.name = "late";
  late.route_prefix = "/late";
  late.replicas = {t("10.0.0.8", 8000, "late-1")};
  late.routers = {t("10.0.0.5", 30006, "rt-late")};
  doc.apps.push_back(late);
  auto newer = topology::make_snapshot(doc, "10.0.0.5", "", 8, "file /t.json", snap.get());
  topology::snapshot fixed = *newer;  // a fixed `updated`, so that the text does not depend on now
  fixed.updated = std::chrono::system_clock::time_point(std::chrono::milliseconds(1700000000250));

  worker_metrics w1, w2;
  std::vector<app_metrics*> g1;
  auto a = w1.apply(*snap, &g1);
  auto b = w2.apply(*snap);
  a[0]->codes.add(200);
  b[0]->codes.add(200);
  b[0]->codes.add(503);
  b[0]->codes.add(1234);  // out of range: code="other"
  a[0]->duration.observe(30ms);
  b[0]->duration.observe(2ms);
  a[0]->first_byte.observe(10ms);
  // An event stream in each worker: the LLM families sum them.
  a[0]->llm_ttft.observe(40ms);
  b[0]->llm_ttft.observe(300ms);
  a[0]->llm_inter_event.observe(20ms);
  a[0]->llm_events.add(12);
  b[0]->llm_events.add(3);
  a[0]->llm_prompt_tokens.add(9);
  a[0]->llm_completion_tokens.add(11);
  a[0]->router_latency[0].observe(1ms);
  b[0]->router_latency[router_outcome_index(reason::router_non_200)].observe(2ms);
  b[0]->router_failures[router_outcome_index(reason::router_non_200)].add();
  a[0]->router(0, "10.0.0.5:30004")->results[static_cast<std::size_t>(attempt_result::ok)].add();
  b[0]->router(0, "10.0.0.5:30004")->results[static_cast<std::size_t>(attempt_result::cancelled)].add();
  a[0]->router(0, "10.0.0.5:30004")->latency.observe(1ms);
  a[0]->router(0, "10.0.0.5:30004")->hedge_delay_us = 1500;
  b[0]->router(0, "10.0.0.5:30004")->hedge_delay_us = 2500;
  a[0]->truncations.add();
  a[0]->hedges[0].add();
  a[0]->generated[static_cast<std::size_t>(reason::upstream_timeout)].add();
  a[0]->ray_http.observe("POST", 200, ray_series::route::app, 12ms);
  b[0]->ray_http.observe("POST", 503, ray_series::route::app, 40ms);
  w1.no_app().ray_http.observe("GET", 200, ray_series::route::healthz, 1ms);
  w1.no_app().codes.add(404);
  w1.no_app().duration.observe(1ms);
  w1.no_app().generated[static_cast<std::size_t>(reason::no_route)].add();
  ASSERT_EQ(g1.size(), 2u);
  g1[0]->grpc_status[0].add();
  g1[0]->grpc_status[14].add();
  g1[0]->grpc_duration.observe(5ms);
  g1[0]->ray_grpc.observe("/chat.Chat/Say", 0, ray_series::route::app, 5ms);
  g1[0]->ray_grpc.observe("/chat.Chat/Say", 14, ray_series::route::app, 7ms);
  snap->states.at("10.0.0.6:30001")->up = false;
  snap->states.at("10.0.0.6:30001")->downs_by_errors = 2;
  snap->states.at("10.0.0.6:30001")->downs_by_check = 1;
  snap->states.at("10.0.0.5:30001")->in_flight = 4;

  scrape_input in;
  in.workers = {&w1, &w2};
  in.requests_received = 9;
  in.active_connections = 3;
  in.active_streams = 2;
  in.topology = &fixed;
  in.topology_last_success = 1700000001.5;
  in.draining = true;
  in.topology_updates = 4;
  in.topology_errors = 1;
  in.config_reloads = 2;
  in.config_errors = 1;
  in.config_generations = 2;
  in.accept_errors = 5;
  in.proxy_protocol_errors[1] = 3;
  in.forwarded_chain_errors = 6;
  in.router_headers_skipped = 7;
  in.access_log_dropped = 8;
  in.ray_compatible = true;
  in.node_ip = "10.0.0.5";
  in.node_id = "node-5";
  in.ongoing_http = 1;
  in.ongoing_grpc = 1;
  in.tls = scrape_input::tls_input{4, 1, 3, 1, {{"timeout", 2}, {"http_request", 1}}, 1800000000};
  scrape_input::grpc_input grpc;
  grpc.connections = 1;
  grpc.streams = 1;
  grpc.conn_errors[0] = 2;
  in.grpc = grpc;
  in.process = process_stats{1.5, 12, 1024, 4096, 8192, 1700000000.25};

  const std::string text = render(in);
  const std::string path = std::string(INGRESSD_TEST_DATA) + "/metrics/exposition.golden.txt";
  if (const char* out = std::getenv("INGRESSD_WRITE_GOLDEN"); out && *out) std::ofstream(path) << text;
  std::ifstream golden(path, std::ios::binary);
  ASSERT_TRUE(golden) << path;
  std::stringstream expected;
  expected << golden.rdbuf();
  EXPECT_EQ(text, expected.str());
}

// --- process metrics --------------------------------------------------------------------------

TEST(MetricsProcess, ReadsThisProcess) {
  const auto before = read_process_stats();
  ASSERT_TRUE(before.has_value());
  // A descriptor opened between two reads is counted exactly once.
  std::FILE* f = std::fopen("/proc/self/status", "r");
  ASSERT_NE(f, nullptr);
  const auto during = read_process_stats();
  std::fclose(f);
  const auto after = read_process_stats();
  ASSERT_TRUE(during && after);
  EXPECT_EQ(during->open_fds, before->open_fds + 1);
  EXPECT_EQ(after->open_fds, before->open_fds);
  EXPECT_GE(before->open_fds, 3u);  // at least stdin, stdout, stderr

  rlimit lim{};
  ASSERT_EQ(::getrlimit(RLIMIT_NOFILE, &lim), 0);
  EXPECT_EQ(before->max_fds, lim.rlim_cur);
  // RSS as /proc/self/status says (KiB there), within what a few reads may allocate.
  long vm_rss_kib = -1;
  std::ifstream status("/proc/self/status");
  for (std::string line; std::getline(status, line);)
    if (line.rfind("VmRSS:", 0) == 0) vm_rss_kib = std::stol(line.substr(6));
  ASSERT_GT(vm_rss_kib, 0);
  EXPECT_NEAR(static_cast<double>(before->resident_bytes) / 1024.0, static_cast<double>(vm_rss_kib), 4096.0);
  EXPECT_GE(before->virtual_bytes, before->resident_bytes);
  // Started in the last hour, and not in the future.
  const double now = std::chrono::duration<double>(std::chrono::system_clock::now().time_since_epoch()).count();
  EXPECT_LE(before->start_time_seconds, now + 1);
  EXPECT_GT(before->start_time_seconds, now - 3600);
  EXPECT_GE(after->cpu_seconds, before->cpu_seconds);
}

TEST(MetricsProcess, RendersTheClientLibraryNames) {
  process_stats p;
  p.cpu_seconds = 1.5;
  p.open_fds = 12;
  p.max_fds = 1048576;
  p.resident_bytes = 4096;
  p.virtual_bytes = 8192;
  p.start_time_seconds = 1700000000.25;
  scrape_input in;
  in.process = p;
  const std::string text = render(in);
  for (const char* line : {"process_cpu_seconds_total 1.5", "process_open_fds 12", "process_max_fds 1048576",
                           "process_resident_memory_bytes 4096", "process_virtual_memory_bytes 8192",
                           "process_start_time_seconds 1700000000.25", "# TYPE process_cpu_seconds_total counter",
                           "# TYPE process_open_fds gauge"})
    EXPECT_TRUE(contains_line(text, line)) << line;
}

TEST(MetricsRender, RemoteOnlyPoolHasRatioZero) {
  auto doc = sample();
  doc.apps[0].routers = {t("10.0.0.6", 30004, "rt-6")};
  auto snap = topology::make_snapshot(doc, "10.0.0.5", "", 1);
  worker_metrics w;
  w.apply(*snap)[0]->router(0, "10.0.0.6:30004")->latency.observe(20ms);
  scrape_input in;
  in.workers = {&w};
  in.topology = snap.get();
  const std::string text = render(in);
  EXPECT_TRUE(contains_line(text, "ingressd_router_colocated_ratio{app=\"llm\"} 0"));
  EXPECT_TRUE(contains_line(
      text, "ingressd_router_attempt_latency_seconds_count{app=\"llm\",router=\"rt-6\",colocated=\"false\"} 1"));
  // A fresh snapshot's replicas start up.
  EXPECT_TRUE(contains_line(text, "ingressd_replica_up{app=\"llm\",replica=\"rep-b\"} 1"));
}

// --- access log -------------------------------------------------------------------------------

access_entry sample_entry() {
  access_entry e;
  e.time = std::chrono::system_clock::time_point(std::chrono::milliseconds(1714564800123));  // 2024-05-01T12:00:00.123Z
  e.client = "10.1.2.3";
  e.method = "POST";
  e.path = "/v1/chat/completions";
  e.app = "llm";
  e.status = 200;
  e.bytes = 1234;
  e.duration = 1500ms + 250us;
  e.router = "rt-5a";
  e.router_addr = "10.0.0.5:30004";
  e.router_latency = 2ms;
  e.router_outcome = "ok";
  e.replica = "rep-a";
  e.replica_addr = "10.0.0.5:30001";
  e.retries = 1;
  e.term = termination::ok;
  e.request_id = "abc-123";
  return e;
}

TEST(MetricsAccessLog, FormatsOneJsonObject) {
  std::string line;
  format_access_entry(line, sample_entry());
  EXPECT_EQ(line.find('\n'), std::string::npos);
  auto j = nlohmann::json::parse(line);
  EXPECT_EQ(j["time"], "2024-05-01T12:00:00.123Z");
  EXPECT_EQ(j["client"], "10.1.2.3");
  EXPECT_EQ(j["client_ip"], "10.1.2.3") << "without a trusted proxy's chain, the connection's client";
  EXPECT_EQ(j["method"], "POST");
  EXPECT_EQ(j["path"], "/v1/chat/completions");
  EXPECT_EQ(j["app"], "llm");
  EXPECT_EQ(j["status"], 200);
  EXPECT_EQ(j["bytes"], 1234);
  EXPECT_DOUBLE_EQ(j["duration"].get<double>(), 1.50025);
  EXPECT_EQ(j["router"], "rt-5a");
  EXPECT_EQ(j["router_addr"], "10.0.0.5:30004");
  EXPECT_DOUBLE_EQ(j["router_latency"].get<double>(), 0.002);
  EXPECT_EQ(j["router_outcome"], "ok");
  EXPECT_EQ(j["replica"], "rep-a");
  EXPECT_EQ(j["replica_addr"], "10.0.0.5:30001");
  EXPECT_EQ(j["retries"], 1);
  EXPECT_EQ(j["termination"], "ok");
  EXPECT_TRUE(j["reason"].is_null());
  EXPECT_EQ(j["request_id"], "abc-123");
  EXPECT_TRUE(j["tunnel"].is_null()) << "not a WebSocket tunnel";
}

TEST(MetricsAccessLog, TunnelLineCarriesBothDirectionsAndWhoClosed) {
  auto e = sample_entry();
  e.method = "GET";
  e.status = 101;
  e.bytes = 5000;  // replica -> client
  e.tunnel = true;
  e.tunnel_bytes_to_replica = 700;
  e.closed_by = "client";
  std::string line;
  format_access_entry(line, e);
  auto j = nlohmann::json::parse(line);
  EXPECT_EQ(j["status"], 101);
  EXPECT_EQ(j["bytes"], 5000);
  EXPECT_EQ(j["tunnel"]["bytes_to_replica"], 700);
  EXPECT_EQ(j["tunnel"]["closed_by"], "client");
}

TEST(MetricsAccessLog, NullsAndEscaping) {
  access_entry e;
  e.method = "GET";
  e.path = std::string_view("/a\"b\\c\x01\xff\xc3\xa9", 10);
  e.status = 404;
  e.reason = "no_route";
  e.term = termination::client_abort;
  std::string line;
  format_access_entry(line, e);
  auto j = nlohmann::json::parse(line);
  EXPECT_EQ(j["path"], "/a\"b\\c\x01\xef\xbf\xbd\xc3\xa9");  // invalid byte -> U+FFFD, é kept
  EXPECT_TRUE(j["router"].is_null());
  EXPECT_TRUE(j["router_latency"].is_null());
  EXPECT_TRUE(j["router_outcome"].is_null());
  EXPECT_TRUE(j["replica"].is_null());
  EXPECT_EQ(j["reason"], "no_route");
  EXPECT_EQ(j["termination"], "client_abort");
  EXPECT_EQ(j["app"], "");
  EXPECT_TRUE(j["request_id"].is_null());
}

std::vector<std::string> read_lines(const std::string& path) {
  std::ifstream in(path);
  std::vector<std::string> out;
  for (std::string l; std::getline(in, l);) out.push_back(l);
  return out;
}

bool wait_lines(const std::string& path, std::size_t n) {
  const auto deadline = std::chrono::steady_clock::now() + 5s;
  while (std::chrono::steady_clock::now() < deadline) {
    if (read_lines(path).size() >= n) return true;
    std::this_thread::sleep_for(5ms);
  }
  return false;
}

TEST(MetricsAccessLog, WritesFileAndReopensAfterRotation) {
  const auto dir = std::filesystem::temp_directory_path() / ("ingressd-al-" + std::to_string(::getpid()));
  std::filesystem::create_directories(dir);
  const std::string path = (dir / "access.log").string();
  const std::string rotated = (dir / "access.log.1").string();
  std::filesystem::remove(path);
  std::filesystem::remove(rotated);
  {
    access_log log(path);
    auto e = sample_entry();
    log.write(e);
    e.request_id = "second";
    log.write(e);
    ASSERT_TRUE(wait_lines(path, 2));  // flushed once the queue ran empty, without a flush call
    std::filesystem::rename(path, rotated);
    ASSERT_TRUE(log.reopen());
    e.request_id = "third";
    log.write(e);
    ASSERT_TRUE(wait_lines(path, 1));
    EXPECT_EQ(log.dropped(), 0u);
  }
  auto old_lines = read_lines(rotated);
  auto new_lines = read_lines(path);
  ASSERT_EQ(old_lines.size(), 2u);
  ASSERT_EQ(new_lines.size(), 1u);
  EXPECT_EQ(nlohmann::json::parse(old_lines[1])["request_id"], "second");
  EXPECT_EQ(nlohmann::json::parse(new_lines[0])["request_id"], "third");
  std::filesystem::remove_all(dir);
}

TEST(MetricsAccessLog, UnopenablePathThrows) {
  EXPECT_THROW(access_log("/nonexistent-dir-ingressd/x.log"), std::system_error);
}

}  // namespace
}  // namespace ingressd::metrics
