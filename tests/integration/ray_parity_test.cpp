// What Ray's HAProxy data plane does and ingressd must do too (issue #16, contract §9), end to
// end: the daemon runs in-process with fake routers, replicas and fallback proxies on loopback.
// 127.0.0.2 is this node. Ray sources: python/ray/serve/_private/haproxy_templates.py (fallback
// backup server, `del-header x-serve-router- -m beg`, `observe layer4 error-limit 3 on-error
// mark-down`, `wait-for-body time 5s`), constants.py (SERVE_INGRESS_ROUTER_HEADER_PREFIX).
#include <atomic>
#include <chrono>
#include <filesystem>
#include <memory>
#include <string>
#include <vector>

#include <gtest/gtest.h>
#include <nlohmann/json.hpp>
#include <unistd.h>

#include "fakes/admin_client.hpp"
#include "fakes/http_client.hpp"
#include "fakes/proxy_fixture.hpp"
#include "fakes/servers.hpp"
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
using testing::target_of;

const std::string node_ip = "127.0.0.2";
const std::string loopback = "127.0.0.1";

std::unique_ptr<replica_server> replica(const std::string& name) { return testing::make_replica(name); }
std::unique_ptr<router_server> router(const std::string& name) { return testing::make_router(node_ip, name); }

config::config parity_config(unsigned threads = 1) {
  auto c = testing::test_config(threads);
  c.router.timeout = 2s;
  c.upstream.connect_timeout = 1s;
  c.upstream.first_byte_timeout = 5s;
  c.upstream.idle_timeout = 5s;
  return c;
}

std::string key_of(const demo::server_base& s) { return s.bind_ip() + ":" + std::to_string(s.port()); }

testing::http_response chat(const testing::proxy& p, const std::string& prefix = "",
                            const testing::header_list& headers = {}) {
  return http_post(loopback, p.port(), prefix + "/v1/chat/completions", headers, R"({"stream":false})", 5s);
}

// --- fallback targets (§9 Topology) ----------------------------------------------------------

TEST(RayParity, AppScaledToZeroGoesToItsGroupFallbackWithoutAskingTheRouter) {
  // Ray sends `targets: []` for an app with no running replicas; the head node's Serve proxy
  // behind the fallback scales it up. A group's own fallback_target wins over fallback_targets.HTTP.
  auto group_fallback = replica("group-fallback");
  auto doc_fallback = replica("doc-fallback");
  auto r = router("router-a");
  testing::proxy p(parity_config(), node_ip);
  auto doc = testing::topology_builder()
                 .app("zero", "/zero", {})
                 .routers({target_of(*r)})
                 .app("other", "/other", {})
                 .fallback(target_of(*doc_fallback))
                 .build();
  doc.apps[0].fallback = target_of(*group_fallback);
  p.set_topology(doc);

  auto a = chat(p, "/zero");
  ASSERT_EQ(a.status, 200u) << a.body;
  EXPECT_EQ(a.header("x-served-by").value_or(""), "group-fallback");
  EXPECT_EQ(r->route_requests().size(), 0u);  // no router could name a replica of an app with none
  auto b = http_get(loopback, p.port(), "/other/models", {}, 5s);
  ASSERT_EQ(b.status, 200u) << b.body;
  EXPECT_EQ(b.header("x-served-by").value_or(""), "doc-fallback");
  EXPECT_EQ(group_fallback->request_count(), 1u);
  EXPECT_EQ(doc_fallback->request_count(), 1u);

  // /topology shows each app's fallback; /-/healthz counts an up fallback (Ray's backup server
  // counts for nbsrv too).
  const auto topo = testing::admin_topology(p.admin_port());
  EXPECT_EQ(topo["apps"][0]["fallback"]["name"], "group-fallback");
  EXPECT_EQ(topo["apps"][0]["fallback"]["health"], "up");
  EXPECT_EQ(topo["apps"][1]["fallback"]["name"], "doc-fallback");
  EXPECT_EQ(topo["fallback"]["name"], "doc-fallback");
  EXPECT_EQ(http_get(loopback, p.port(), "/-/healthz", {}, 5s).status, 200u);
}

TEST(RayParity, UnknownReplicaIdGoesToTheGroupFallback) {
  auto rep = replica("rep-a");
  auto fallback = replica("group-fallback");
  auto r = router("router-a");
  r->set_behaviour(router_behaviour::respond(200, R"({"replica_id":"SERVE_REPLICA::llm#LLMServer#new"})"));
  testing::proxy p(parity_config(), node_ip);
  auto doc = testing::topology_builder().app("llm", "/", {target_of(*rep)}).routers({target_of(*r)}).build();
  doc.apps[0].fallback = target_of(*fallback);
  p.set_topology(doc);
  auto resp = chat(p);
  ASSERT_EQ(resp.status, 200u) << resp.body;
  EXPECT_EQ(resp.header("x-served-by").value_or(""), "group-fallback");
  EXPECT_EQ(rep->request_count(), 0u);
}

TEST(RayParity, AFallbackMarkedDownIsNotUsed) {
  // HAProxy skips a backup server its checks marked down; so does ingressd.
  auto fallback = replica("group-fallback");
  testing::proxy p(parity_config(), node_ip);
  auto doc = testing::topology_builder().app("zero", "/", {}).build();
  doc.apps[0].fallback = target_of(*fallback);
  p.set_topology(doc);
  ASSERT_EQ(chat(p).status, 200u);
  p.daemon().set_replica_health(key_of(*fallback), false, "health check: HTTP 503");
  auto resp = chat(p);
  EXPECT_EQ(resp.status, 503u);
  EXPECT_EQ(resp.header("x-serve-reason").value_or(""), "no_healthy_replica");
  EXPECT_EQ(fallback->request_count(), 1u);
  EXPECT_EQ(http_get(loopback, p.port(), "/-/healthz", {}, 5s).status, 503u);
  const auto topo = testing::admin_topology(p.admin_port());
  EXPECT_EQ(topo["apps"][0]["fallback"]["health"], "down");
  EXPECT_EQ(topo["apps"][0]["fallback"]["down_cause"], "health check: HTTP 503");
}

// --- Serve not running (§9 Topology) ---------------------------------------------------------

TEST(RayParity, ServeNotRunningIsAnEmptyTopologyThatFailsHealthzWithAReason) {
  auto rep = replica("rep-a");
  testing::proxy p(parity_config(), node_ip);
  p.set_topology(testing::topology_builder().app("llm", "/", {target_of(*rep)}).build());
  ASSERT_EQ(chat(p).status, 200u);
  // After `serve shutdown` the dashboard answers Ray's empty ServeInstanceDetails.
  auto empty = topology::parse_document(R"({"controller_info": {}, "proxies": {}, "applications": {},
                                            "target_capacity": null})");
  ASSERT_TRUE(std::holds_alternative<topology::document>(empty));
  p.set_topology(std::get<topology::document>(empty));
  auto health = http_get(loopback, p.port(), "/-/healthz", {}, 5s);
  EXPECT_EQ(health.status, 503u);
  EXPECT_EQ(health.body, "Serve is not running: it has no applications.");
  EXPECT_EQ(http_get(loopback, p.port(), "/-/routes", {}, 5s).status, 503u);
  auto resp = chat(p);  // the stale topology is gone: nothing routes
  EXPECT_EQ(resp.status, 404u);
  EXPECT_EQ(resp.header("x-serve-reason").value_or(""), "no_route");
  const auto topo = testing::admin_topology(p.admin_port());
  EXPECT_EQ(topo["serve_running"], false);
  EXPECT_TRUE(topo["apps"].empty());
}

TEST(RayParity, RayDrainingThisNodeFailsHealthzWithRaysTextWhileRequestsAreServed) {
  // Issue #28 item 3. ray schema.py ProxyDetails.status DRAINING (proxy_state.py drains a node's
  // proxy); Ray's own proxy then answers /-/healthz 503 "This node is being drained."
  // (proxy.py DRAINING_MESSAGE) and keeps serving.
  auto rep = replica("rep-a");
  testing::proxy p(parity_config(), node_ip);
  auto doc = testing::topology_builder().app("llm", "/", {target_of(*rep)}).build();
  doc.proxies = {{"other-node", "127.0.0.9", "HEALTHY"}, {"this-node", node_ip, "DRAINING"}};
  p.set_topology(doc);
  auto health = http_get(loopback, p.port(), "/-/healthz", {}, 5s);
  EXPECT_EQ(health.status, 503u);
  EXPECT_EQ(health.body, "This node is being drained.");
  EXPECT_EQ(chat(p).status, 200u) << "requests are still served";
  auto topo = testing::admin_topology(p.admin_port());
  EXPECT_EQ(topo["ray_node"]["node_id"], "this-node");
  EXPECT_EQ(topo["ray_node"]["status"], "DRAINING");
  EXPECT_EQ(topo["ray_node"]["draining"], true);
  EXPECT_EQ(testing::scrape_metrics(p.admin_port()).at("ingressd_ray_node_draining"), 1);
  // Ray says the node is back (a drain request cancelled): healthz passes again.
  doc.proxies[1].status = "HEALTHY";
  p.set_topology(doc);
  EXPECT_EQ(http_get(loopback, p.port(), "/-/healthz", {}, 5s).status, 200u);
  EXPECT_EQ(testing::scrape_metrics(p.admin_port()).at("ingressd_ray_node_draining"), 0);
  EXPECT_EQ(testing::admin_topology(p.admin_port())["ray_node"]["draining"], false);
}

// --- router-owned headers (§9 Headers) -------------------------------------------------------

TEST(RayParity, ClientRouterHeadersAreStrippedAndTheRoutersOwnAreSet) {
  // Only the router may set x-serve-router-* (Ray: `http-request del-header x-serve-router- -m
  // beg`, then the trusted request_headers of the /internal/route reply).
  auto rep = replica("rep-a");
  auto r = router("router-a");
  r->set_replicas({rep->name()});
  r->set_behaviour(router_behaviour::round_robin().with_request_headers({{"x-serve-router-model", "lora-7"}}));
  testing::proxy p(parity_config(), node_ip);
  p.set_topology(testing::topology_builder()
                     .app("llm", "/", {target_of(*rep)})
                     .routers({target_of(*r)})
                     .build());
  const testing::header_list spoofed{{"X-Serve-Router-Model", "spoofed"},
                                     {"x-SERVE-router-tenant", "spoofed"},
                                     {"x-serve-routerless", "kept"}};
  ASSERT_EQ(chat(p, "", spoofed).status, 200u);
  ASSERT_EQ(http_get(loopback, p.port(), "/v1/models", spoofed, 5s).status, 200u);  // not routed: stripped too

  const auto routed = r->route_requests();
  ASSERT_EQ(routed.size(), 1u);
  for (const auto& [name, value] : routed[0].headers) EXPECT_NE(value, "spoofed") << name;
  const auto seen = rep->requests();
  ASSERT_EQ(seen.size(), 2u);
  EXPECT_EQ(seen[0].header_count("x-serve-router-model"), 1u);
  EXPECT_EQ(seen[0].header("x-serve-router-model").value_or(""), "lora-7");
  EXPECT_EQ(seen[0].header_count("x-serve-router-tenant"), 0u);
  EXPECT_EQ(seen[1].header_count("x-serve-router-model"), 0u);
  EXPECT_EQ(seen[1].header_count("x-serve-router-tenant"), 0u);
  for (const auto& s : seen) EXPECT_EQ(s.header("x-serve-routerless").value_or(""), "kept");  // not the prefix
}

// --- X-Request-Id on every response (§9 Headers) ---------------------------------------------

bool uuid_shaped(const std::string& id) {
  if (id.size() != 36) return false;
  for (std::size_t i = 0; i < id.size(); ++i) {
    const bool dash = i == 8 || i == 13 || i == 18 || i == 23;
    if (dash != (id[i] == '-')) return false;
    if (!dash && !std::isxdigit(static_cast<unsigned char>(id[i]))) return false;
  }
  return true;
}

TEST(RayParity, EveryResponseCarriesTheRequestId) {
  auto rep = replica("rep-a");
  auto r = router("router-a");
  r->set_replicas({rep->name()});
  testing::proxy p(parity_config(), node_ip);
  p.set_topology(testing::topology_builder()
                     .app("llm", "/v1", {target_of(*rep)})
                     .routers({target_of(*r)})
                     .build());

  // Proxied: the client's id, once, even when the replica echoes another one.
  rep->queue_behaviour(replica_behaviour::respond(200, {{"X-Request-Id", "the-replicas-own"}}, "ok"));
  auto proxied = chat(p, "", {{"X-Request-Id", "client-1"}});
  ASSERT_EQ(proxied.status, 200u);
  EXPECT_EQ(proxied.header_count("x-request-id"), 1u);
  EXPECT_EQ(proxied.header("x-request-id").value_or(""), "client-1");
  EXPECT_EQ(rep->requests().back().header("x-request-id").value_or(""), "client-1");

  // Generated by ingressd when the client sent none: the same id the replica and router saw.
  auto generated = chat(p);
  ASSERT_EQ(generated.status, 200u);
  const auto id = generated.header("x-request-id").value_or("");
  EXPECT_TRUE(uuid_shaped(id)) << id;
  EXPECT_EQ(rep->requests().back().header("x-request-id").value_or(""), id);
  EXPECT_EQ(r->route_requests().back().header("x-request-id").value_or(""), id);

  // Responses ingressd generates: errors, probes, refusals.
  r->queue_behaviour(router_behaviour::respond(500, R"({"detail":"boom"})"));
  auto failed = chat(p, "", {{"X-Request-Id", "client-2"}});
  EXPECT_EQ(failed.status, 503u);
  EXPECT_EQ(failed.header("x-request-id").value_or(""), "client-2");
  auto not_found = http_get(loopback, p.port(), "/nothing", {{"X-Request-Id", "client-3"}}, 5s);
  EXPECT_EQ(not_found.status, 404u);
  EXPECT_EQ(not_found.header("x-request-id").value_or(""), "client-3");
  EXPECT_TRUE(uuid_shaped(http_get(loopback, p.port(), "/nothing", {}, 5s).header("x-request-id").value_or("")));
  EXPECT_TRUE(uuid_shaped(http_get(loopback, p.port(), "/-/healthz", {}, 5s).header("x-request-id").value_or("")));
  // A head that could not be parsed has no usable id of the client's: one is generated.
  auto c = testing::send_raw(loopback, p.port(), "GET / HTTP/1.1\r\nHost: a\r\nBad Header\r\n\r\n");
  auto bad = c.read_response(5s);
  EXPECT_EQ(bad.status, 400u);
  EXPECT_TRUE(uuid_shaped(bad.header("x-request-id").value_or(""))) << bad.header("x-request-id").value_or("");
}

// --- passive health (§9 Health) --------------------------------------------------------------

/// Sends `n` GETs one after another; returns how many got 200.
int get_n(const testing::proxy& p, int n) {
  int ok = 0;
  for (int i = 0; i < n; ++i) ok += http_get(loopback, p.port(), "/x", {}, 5s).status == 200u ? 1 : 0;
  return ok;
}

TEST(RayParity, ErrorLimitConnectionErrorsMarkAReplicaDownOnEveryWorker) {
  // A replica that closes every connection before a response head. With health.error_limit 3
  // it gets exactly 3 requests, then none (two workers: the mark is node-wide).
  auto good = replica("good");
  auto bad = replica("bad");
  bad->set_behaviour(replica_behaviour::close_before_headers());
  auto cfg = parity_config(2);
  cfg.health.error_limit = 3;
  testing::proxy p(cfg, node_ip);
  p.set_topology(testing::topology_builder().app("llm", "/", {target_of(*good), target_of(*bad)}).build());
  get_n(p, 20);
  EXPECT_EQ(bad->request_count(), 3u);
  EXPECT_EQ(good->request_count(), 17u);

  const auto topo = testing::admin_topology(p.admin_port());
  const auto entry = testing::topology_upstream(topo, "llm", "bad");
  EXPECT_EQ(entry["health"], "down");
  EXPECT_EQ(entry["down_cause"].get<std::string>().rfind("3 consecutive connection errors (last: ", 0), 0u)
      << entry["down_cause"];
  EXPECT_EQ(testing::topology_upstream(topo, "llm", "good")["health"], "up");
  const auto m = testing::scrape_metrics(p.admin_port());
  EXPECT_EQ(m.at(R"(ingressd_replica_marked_down_total{app="llm",replica="bad",cause="connection_errors"})"), 1);
  EXPECT_EQ(m.at(R"(ingressd_replica_marked_down_total{app="llm",replica="bad",cause="health_check"})"), 0);
  EXPECT_EQ(m.at(R"(ingressd_replica_up{app="llm",replica="bad"})"), 0);

  // The active checks bring it back (here: what the checker reports), with a fresh count.
  bad->set_behaviour(replica_behaviour::normal());
  p.daemon().set_replica_health(key_of(*bad), true);
  get_n(p, 10);
  EXPECT_GT(bad->request_count(), 3u);
}

TEST(RayParity, ConnectRefusedCountsAndASuccessEndsTheRun) {
  // Refused connects are connection errors too; a response head in between ends the run.
  auto good = replica("good");
  auto flaky = replica("flaky");
  for (int i = 0; i < 6; ++i)
    flaky->queue_behaviour(i % 2 == 0 ? replica_behaviour::close_before_headers() : replica_behaviour::normal());
  auto cfg = parity_config();
  cfg.health.error_limit = 2;
  testing::proxy p(cfg, node_ip);
  const auto dead = testing::make_target(testing::dead_port(), "dead");
  p.set_topology(testing::topology_builder()
                     .app("llm", "/", {target_of(*good), target_of(*flaky)})
                     .app("gone", "/gone", {dead, target_of(*good)})
                     .build());
  get_n(p, 12);  // flaky: error, ok, error, ok, ... never two in a row
  EXPECT_EQ(testing::topology_upstream(testing::admin_topology(p.admin_port()), "llm", "flaky")["health"], "up");

  for (int i = 0; i < 6; ++i) EXPECT_EQ(http_get(loopback, p.port(), "/gone/x", {}, 5s).status, 200u);
  const auto entry = testing::topology_upstream(testing::admin_topology(p.admin_port()), "gone", "dead");
  EXPECT_EQ(entry["health"], "down");
  EXPECT_NE(entry["down_cause"].get<std::string>().find("2 consecutive connection errors"), std::string::npos);
}

TEST(RayParity, ErrorLimitZeroLeavesHealthToTheActiveChecks) {
  auto good = replica("good");
  auto bad = replica("bad");
  bad->set_behaviour(replica_behaviour::close_before_headers());
  auto cfg = parity_config();
  cfg.health.error_limit = 0;
  testing::proxy p(cfg, node_ip);
  p.set_topology(testing::topology_builder().app("llm", "/", {target_of(*good), target_of(*bad)}).build());
  get_n(p, 20);
  EXPECT_EQ(bad->request_count(), 10u);  // least-loaded alternates; nothing marks it down
  EXPECT_EQ(testing::topology_upstream(testing::admin_topology(p.admin_port()), "llm", "bad")["health"], "up");
}

// --- node-wide least-loaded ------------------------------------------------------------------

TEST(RayParity, LeastLoadedCountsRequestsOfEveryWorker) {
  // 8 long requests over 2 workers and 2 replicas: 4 each. With per-worker counts, a worker
  // that got 5 of the connections sent 3 to one replica and 2 to the other: 5/3 overall.
  auto a = replica("a");
  auto b = replica("b");
  a->set_behaviour(replica_behaviour::hang());
  b->set_behaviour(replica_behaviour::hang());
  testing::proxy p(parity_config(2), node_ip);
  p.set_topology(testing::topology_builder().app("llm", "/", {target_of(*a), target_of(*b)}).build());
  std::vector<connection> held;
  for (std::size_t i = 0; i < 8; ++i) {
    held.push_back(connection::open(loopback, p.port()));
    ASSERT_TRUE(held.back().write(format_request("GET", "/x", loopback, p.port(), {}, {})));
    // One at a time: each choice sees every earlier request in flight.
    ASSERT_TRUE(testing::eventually([&] { return a->request_count() + b->request_count() == i + 1; }, 5s));
  }
  EXPECT_EQ(a->request_count(), 4u);
  EXPECT_EQ(b->request_count(), 4u);
  const auto topo = testing::admin_topology(p.admin_port());
  EXPECT_EQ(testing::topology_upstream(topo, "llm", "a")["in_flight"], 4);
  EXPECT_EQ(testing::topology_upstream(topo, "llm", "b")["in_flight"], 4);
}

// --- router.body_wait (§9 Router) ------------------------------------------------------------

TEST(RayParity, BodyWaitRoutesOnWhatHasArrivedAndTheReplicaGetsItAll) {
  // Ray: `wait-for-body time 5s`, then the Lua routes on what HAProxy has buffered.
  auto rep = replica("rep-a");
  auto r = router("router-a");
  r->set_replicas({rep->name()});
  auto cfg = parity_config();
  cfg.router.forward_body = true;
  cfg.router.body_limit = 1024;
  cfg.router.body_wait = 200ms;
  cfg.client.body_timeout = 60s;  // the wait must end on body_wait, not here
  testing::proxy p(cfg, node_ip);
  p.set_topology(testing::topology_builder().app("llm", "/", {target_of(*rep)}).routers({target_of(*r)}).build());

  const std::string body(2000, 'b');
  auto c = connection::open(loopback, p.port());
  ASSERT_TRUE(c.write("POST /v1/chat/completions HTTP/1.1\r\nHost: a\r\nContent-Length: 2000\r\n\r\n" +
                      body.substr(0, 100)));
  // Bounded far below client.body_timeout: the router is asked once body_wait has passed.
  ASSERT_TRUE(r->wait_for_requests(1, 10s));
  const auto routed = r->route_requests();
  ASSERT_EQ(routed.size(), 1u);
  EXPECT_EQ(routed[0].body, body.substr(0, 100));
  EXPECT_EQ(routed[0].header("x-body-truncated").value_or(""), "100/2000");
  ASSERT_TRUE(c.write(body.substr(100)));
  auto resp = c.read_response(5s);
  ASSERT_EQ(resp.status, 200u) << resp.body;
  ASSERT_EQ(rep->request_count(), 1u);
  EXPECT_EQ(rep->requests()[0].body, body);
  EXPECT_EQ(testing::scrape_metrics(p.admin_port()).at(R"(ingressd_router_truncations_total{app="llm"})"), 1);
}

// --- defects found by real clients -----------------------------------------------------------

TEST(RayParity, UnterminatedQuoteInAChunkExtensionIs400AtTheLineEnd) {
  // RFC 9112 §7.1.1: a quoted-string ends on its line. Beast looked for the quote in the bytes
  // that followed and waited for more until client.body_timeout (60 s), then answered 408.
  auto rep = replica("rep-a");
  testing::proxy p(parity_config(), node_ip);
  p.set_topology(testing::topology_builder().app("llm", "/", {target_of(*rep)}).build());
  auto c = testing::send_raw(loopback, p.port(),
                             "POST /x HTTP/1.1\r\nHost: a\r\nTransfer-Encoding: chunked\r\n\r\n"
                             "3;a=\"b\r\nabc\r\n0\r\n\r\n");
  auto resp = c.read_response(10s);
  ASSERT_TRUE(resp.complete) << resp.error;
  EXPECT_EQ(resp.status, 400u);
  EXPECT_EQ(resp.body, "Bad Request: malformed chunk extension");
  EXPECT_EQ(rep->request_count(), 0u);
}

TEST(RayParity, TooLargeNamesTheLimitAndTheAccessLogTheRequest) {
  const auto dir = std::filesystem::temp_directory_path() / ("ingressd-parity-" + std::to_string(::getpid()));
  std::filesystem::create_directories(dir);
  const std::string path = (dir / "access.log").string();
  std::filesystem::remove(path);
  auto rep = replica("rep-a");
  auto cfg = parity_config();
  cfg.client.max_body_bytes = 1000;
  cfg.access_log = path;
  {
    testing::proxy p(cfg, node_ip);
    p.set_topology(testing::topology_builder().app("llm", "/", {target_of(*rep)}).build());
    // Refused while the head is read (Content-Length over the limit) ...
    auto head = http_post(loopback, p.port(), "/v1/big", {{"X-Request-Id", "big-1"}}, std::string(2000, 'x'), 5s);
    EXPECT_EQ(head.status, 413u);
    EXPECT_EQ(head.body, "Content Too Large: the request body is larger than client.max_body_bytes (1000 bytes)");
    // ... and while a chunked body is read.
    auto c = testing::send_raw(loopback, p.port(),
                               "POST /v1/chunked HTTP/1.1\r\nHost: a\r\nX-Request-Id: big-2\r\n"
                               "Transfer-Encoding: chunked\r\n\r\n7d0\r\n" + std::string(2000, 'y') + "\r\n0\r\n\r\n");
    auto chunked = c.read_response(5s);
    EXPECT_EQ(chunked.status, 413u);
    EXPECT_EQ(chunked.body, head.body);
    const auto lines = testing::wait_json_lines(path, 2);
    ASSERT_EQ(lines.size(), 2u);
    for (const auto& l : lines) {
      EXPECT_EQ(l["status"], 413);
      EXPECT_EQ(l["method"], "POST");
      EXPECT_EQ(l["path"], l["request_id"] == "big-1" ? "/v1/big" : "/v1/chunked");
    }
  }
  std::filesystem::remove_all(dir);
}

TEST(RayParity, Admin405SaysWhatIsAllowed) {
  testing::proxy p(parity_config(), node_ip);
  auto r = http_post(loopback, p.admin_port(), "/metrics", {}, "x", 5s);
  EXPECT_EQ(r.status, 405u);
  EXPECT_EQ(r.header("allow").value_or(""), "GET, HEAD");
}

}  // namespace
}  // namespace ingressd
