// The router path (contract §4.2) end to end: the daemon runs in-process, with fake routers and
// fake replicas on loopback. 127.0.0.2 is this node; 127.0.0.3, .4 (and .9, .10) are other nodes.
#include <algorithm>
#include <chrono>
#include <cstdint>
#include <map>
#include <memory>
#include <optional>
#include <set>
#include <string>
#include <thread>
#include <vector>

#include <gtest/gtest.h>

#include "fakes/admin_client.hpp"
#include "fakes/http_client.hpp"
#include "fakes/servers.hpp"
#include "fakes/topology_builder.hpp"
#include "fakes/proxy_fixture.hpp"
#include "ingressd/core/asio.hpp"
#include "ingressd/demo/replica_server.hpp"
#include "ingressd/demo/router_server.hpp"
#include "ingressd/topology/topology.hpp"

namespace ingressd {
namespace {

using namespace std::chrono_literals;
using demo::recorded_request;
using demo::replica_server;
using demo::router_behaviour;
using demo::router_server;
using testing::connection;
using testing::format_request;
using testing::http_request;
using testing::http_response;

const std::string node_ip = "127.0.0.2";
const std::string replica_ip = "127.0.0.1";
const std::string proxy_host = "127.0.0.1";

using testing::make_replica;
using testing::make_router;
using testing::target_of;
topology::target target_of(const router_server& r) { return target_of(r, r.name()); }
topology::target target_of(const replica_server& r) { return target_of(r, r.name()); }

topology::app make_app(std::string name, std::string prefix, const std::vector<const replica_server*>& replicas,
                       const std::vector<const router_server*>& routers) {
  topology::app a;
  a.name = std::move(name);
  a.route_prefix = std::move(prefix);
  for (const auto* r : replicas) a.replicas.push_back(target_of(*r));
  for (const auto* r : routers) a.routers.push_back(target_of(*r));
  return a;
}

topology::document one_app(const std::vector<const replica_server*>& replicas,
                           const std::vector<const router_server*>& routers) {
  topology::document d;
  d.apps.push_back(make_app("llm", "/", replicas, routers));
  return d;
}

enum class hedging { off, on };

/// Every router-path test runs twice: with router.hedge off (test_config's choice, so that router
/// calls can be counted and ordered exactly) and with the product's default, `auto`. Hedging only
/// ever adds calls to a second router of a pool of two or more, so the tests with such pools
/// account for hedged calls through ingressd_router_hedges_total; the rest must pass unchanged.
class RouterPath : public ::testing::TestWithParam<hedging> {
 protected:
  /// A test config with short timeouts, so that a failure ends the test quickly.
  static config::config short_config(unsigned threads = 1) {
    auto c = testing::test_config(threads);
    c.router.timeout = 2s;
    c.upstream.connect_timeout = 1s;
    c.upstream.first_byte_timeout = 5s;
    c.upstream.idle_timeout = 5s;
    if (GetParam() == hedging::on) {
      const config::config defaults;
      c.router.hedge_auto = defaults.router.hedge_auto;
      c.router.hedge_after = defaults.router.hedge_after;
      c.router.hedge_budget_permille = defaults.router.hedge_budget_permille;
    }
    return c;
  }
};

INSTANTIATE_TEST_SUITE_P(Hedging, RouterPath, ::testing::Values(hedging::off, hedging::on),
                         [](const ::testing::TestParamInfo<hedging>& i) {
                           return std::string(i.param == hedging::on ? "HedgeAuto" : "HedgeOff");
                         });

/// ingressd_router_hedges_total, summed over apps: `sent` second calls, `won` of them used.
struct hedge_counts {
  std::size_t sent = 0;
  std::size_t won = 0;
};

hedge_counts hedges_of(const testing::proxy& p) {
  const auto m = testing::scrape_metrics(p.admin_port());
  hedge_counts h;
  for (const auto& [series, value] : m.samples) {
    if (series.rfind("ingressd_router_hedges_total{", 0) != 0) continue;
    if (series.find("result=\"sent\"") != std::string::npos) h.sent += static_cast<std::size_t>(value);
    if (series.find("result=\"won\"") != std::string::npos) h.won += static_cast<std::size_t>(value);
  }
  return h;
}

http_response post(const testing::proxy& p, const testing::header_list& headers = {}, std::string_view body = {},
                   std::string_view target = "/v1/route-me") {
  return testing::http_post(proxy_host, p.port(), target, headers, body, 5s);
}

/// One request on an open keep-alive connection.
http_response exchange(connection& c, const testing::proxy& p, std::string_view method, std::string_view target,
                       const testing::header_list& headers = {}, std::string_view body = {}) {
  if (!c.write(format_request(method, target, proxy_host, p.port(), headers, body), 5s)) {
    http_response r;
    r.error = "write failed: " + c.error();
    return r;
  }
  return c.read_response(5s);
}

std::string served_by(const http_response& r) { return r.header("x-served-by").value_or("<none>"); }

/// The recorded request (of any server) carrying this X-Request-Id, if any.
std::optional<recorded_request> with_request_id(const std::vector<recorded_request>& all, const std::string& id) {
  for (const auto& r : all)
    if (r.header("x-request-id").value_or("") == id) return r;
  return std::nullopt;
}

/// How a set of requests (by X-Request-Id) reached two routers, against the router each one's
/// decision asked first.
struct reach {
  std::size_t nowhere = 0;     // at neither router: no decision asked anyone
  std::size_t not_first = 0;   // not at its first router (a hedge won before that call was made)
  std::size_t second = 0;      // at the other router too, or only there: a hedged (second) call
};

/// `first[i]` is 0 or 1: the router (calls0 or calls1) request `ids[i]` should have asked first.
reach reach_of(const std::vector<std::string>& ids, const std::vector<int>& first,
               const std::vector<recorded_request>& calls0, const std::vector<recorded_request>& calls1) {
  reach out;
  for (std::size_t i = 0; i < ids.size(); ++i) {
    const bool at[2] = {with_request_id(calls0, ids[i]).has_value(), with_request_id(calls1, ids[i]).has_value()};
    if (!at[0] && !at[1]) ++out.nowhere;
    if (!at[first[i]]) ++out.not_first;
    if (at[1 - first[i]]) ++out.second;
  }
  return out;
}

std::string lower(std::string s) {
  for (auto& ch : s) ch = static_cast<char>(std::tolower(static_cast<unsigned char>(ch)));
  return s;
}

std::multiset<std::string> header_names(const recorded_request& r) {
  std::multiset<std::string> out;
  for (const auto& [name, value] : r.headers) out.insert(lower(name));
  return out;
}

// ---------------------------------------------------------------------------------------------
// 1. The router call, byte by byte

TEST_P(RouterPath, RouterRequestBytesAndRequestIdAndSessionHeader) {
  auto replica_a = make_replica("SERVE_REPLICA::llm#LLMServer#a");
  auto replica_b = make_replica("SERVE_REPLICA::llm#LLMServer#b");
  auto router = make_router(node_ip, "SERVE_REPLICA::llm#LLMRouter#r1");
  // The router always pins b: a least-loaded pick would give a at least some of the time.
  router->set_replicas({replica_b->name()});
  testing::proxy p(short_config(1), node_ip);
  p.set_topology(one_app({replica_a.get(), replica_b.get()}, {router.get()}));
  const std::string host = node_ip + ":" + std::to_string(router->port());

  // a) Client sends X-Request-Id and the session header under its configured name.
  auto r1 = post(p, {{"X-Request-Id", "rid-client-1"}, {"x-session-id", "sess-42"}, {"Content-Type", "application/json"}},
                 R"({"prompt":"hi"})");
  ASSERT_TRUE(r1.complete) << r1.error;
  EXPECT_EQ(r1.status, 200u) << r1.body;
  EXPECT_EQ(served_by(r1), replica_b->name());
  {
    auto calls = router->route_requests();
    ASSERT_EQ(calls.size(), 1u);
    const auto& call = calls[0];
    const std::string expected_start = "POST /internal/route HTTP/1.1\r\n";
    EXPECT_EQ(call.raw.substr(0, expected_start.size()), expected_start) << call.raw;
    EXPECT_EQ(call.method, "POST");
    EXPECT_EQ(call.target, "/internal/route");
    EXPECT_EQ(call.version, 11u);
    EXPECT_EQ(call.header("host").value_or(""), host);
    EXPECT_EQ(call.header("content-type").value_or(""), "application/json");
    EXPECT_EQ(call.header("content-length").value_or(""), "0");
    EXPECT_EQ(call.header("x-request-id").value_or(""), "rid-client-1");
    EXPECT_EQ(call.header("x-session-id").value_or(""), "sess-42");
    EXPECT_EQ(call.body, "");
    // Nothing else: exactly these five fields, each once, and no body after the blank line.
    const std::multiset<std::string> expected{"host", "content-type", "content-length", "x-session-id",
                                              "x-request-id"};
    EXPECT_EQ(header_names(call), expected) << call.raw;
    ASSERT_GE(call.raw.size(), 4u);
    EXPECT_EQ(call.raw.substr(call.raw.size() - 4), "\r\n\r\n") << call.raw;
    EXPECT_EQ(call.raw.find("\r\n\r\n"), call.raw.size() - 4) << call.raw;

    auto seen = replica_b->requests();
    ASSERT_EQ(seen.size(), 1u);
    EXPECT_EQ(seen[0].header_count("x-request-id"), 1u);
    EXPECT_EQ(seen[0].header("x-request-id").value_or(""), "rid-client-1");
    EXPECT_EQ(seen[0].body, R"({"prompt":"hi"})");
    EXPECT_EQ(replica_a->request_count(), 0u);
  }

  // b) No X-Request-Id from the client: a generated one, the same on both legs; the client's
  //    `x_session_id` spelling is forwarded under the configured name.
  auto r2 = post(p, {{"x_session_id", "sess-underscore"}}, "{}");
  ASSERT_TRUE(r2.complete) << r2.error;
  EXPECT_EQ(r2.status, 200u) << r2.body;
  EXPECT_EQ(served_by(r2), replica_b->name());
  {
    auto calls = router->route_requests();
    ASSERT_EQ(calls.size(), 2u);
    const auto& call = calls[1];
    bool found = false;
    for (const auto& [name, value] : call.headers) {
      if (name == "x-session-id") {
        found = true;
        EXPECT_EQ(value, "sess-underscore");
      }
    }
    EXPECT_TRUE(found) << "session header not forwarded under its configured name:\n" << call.raw;
    EXPECT_EQ(call.header_count("x_session_id"), 0u) << call.raw;
    EXPECT_EQ(call.header_count("x-session-id"), 1u) << call.raw;
    auto id = call.header("x-request-id");
    ASSERT_TRUE(id.has_value()) << call.raw;
    EXPECT_FALSE(id->empty());
    auto seen = replica_b->requests();
    ASSERT_EQ(seen.size(), 2u);
    EXPECT_EQ(seen[1].header("x-request-id").value_or("<none>"), *id);
    EXPECT_EQ(seen[1].header_count("x-request-id"), 1u);
  }

  // c) No session header from the client: none on the router call.
  auto r3 = post(p, {}, "{}");
  ASSERT_TRUE(r3.complete) << r3.error;
  EXPECT_EQ(r3.status, 200u) << r3.body;
  {
    auto calls = router->route_requests();
    ASSERT_EQ(calls.size(), 3u);
    EXPECT_EQ(calls[2].header_count("x-session-id"), 0u) << calls[2].raw;
    EXPECT_EQ(calls[2].header_count("x_session_id"), 0u) << calls[2].raw;
    const std::multiset<std::string> expected{"host", "content-type", "content-length", "x-request-id"};
    EXPECT_EQ(header_names(calls[2]), expected) << calls[2].raw;
  }
}

TEST_P(RouterPath, ReplicaPinnedByRouterServesEachRequest) {
  auto a = make_replica("rep-a");
  auto b = make_replica("rep-b");
  auto c = make_replica("rep-c");
  auto router = make_router(node_ip, "router-1");
  router->set_replicas({"rep-c", "rep-a", "rep-c", "rep-b", "rep-c", "rep-c"});
  testing::proxy p(short_config(1), node_ip);
  p.set_topology(one_app({a.get(), b.get(), c.get()}, {router.get()}));

  auto conn = connection::open(proxy_host, p.port());
  ASSERT_TRUE(conn.connected()) << conn.error();
  std::vector<std::string> served;
  for (int i = 0; i < 6; ++i) {
    auto r = exchange(conn, p, "POST", "/x", {}, "{}");
    ASSERT_TRUE(r.complete) << r.error;
    ASSERT_EQ(r.status, 200u) << r.body;
    served.push_back(served_by(r));
  }
  EXPECT_EQ(served, router->picks());
  EXPECT_EQ(c->request_count(), 4u);
}

/// One worker and one app: replica rep-a, chosen by router-1, which answers as `b` says.
struct one_router_app {
  std::unique_ptr<replica_server> a = make_replica("rep-a");
  std::unique_ptr<router_server> router = make_router(node_ip, "router-1");
  testing::proxy p;
  one_router_app(const config::config& cfg, const router_behaviour& b) : p(cfg, node_ip) {
    router->set_replicas({"rep-a"});
    router->set_behaviour(b);
    p.set_topology(one_app({a.get()}, {router.get()}));
  }
};

/// One app, replica rep-a, and two co-located routers (router-1, router-2) that both name it.
struct two_router_app {
  std::unique_ptr<replica_server> a = make_replica("rep-a");
  std::unique_ptr<router_server> r1 = make_router(node_ip, "router-1");
  std::unique_ptr<router_server> r2 = make_router(node_ip, "router-2");
  testing::proxy p;
  explicit two_router_app(const config::config& cfg) : p(cfg, node_ip) {
    r1->set_replicas({"rep-a"});
    r2->set_replicas({"rep-a"});
    p.set_topology(one_app({a.get()}, {r1.get(), r2.get()}));
  }
};

/// A router that takes 300 ms to answer: long enough to act while its call is in flight.
router_behaviour slow_router() {
  auto b = router_behaviour::round_robin();
  b.delay = 300ms;
  return b;
}

// The client watch starts before the router call when the whole body is buffered: bytes that
// arrive during the call must still be seen.
TEST_P(RouterPath, RequestPipelinedDuringTheRouterCallIsServed) {
  one_router_app t(short_config(1), slow_router());
  auto& p = t.p;
  auto conn = connection::open(proxy_host, p.port());
  ASSERT_TRUE(conn.connected()) << conn.error();
  ASSERT_TRUE(conn.write(format_request("POST", "/first", proxy_host, p.port(), {}, "{}"), 5s)) << conn.error();
  ASSERT_TRUE(t.router->wait_for_requests(1, 5s));  // the first router call is in flight
  ASSERT_TRUE(conn.write(format_request("POST", "/second", proxy_host, p.port(), {}, "{}"), 5s)) << conn.error();
  for (const char* target : {"/first", "/second"}) {
    auto r = conn.read_response(5s);
    ASSERT_TRUE(r.complete) << target << ": " << r.error;
    EXPECT_EQ(r.status, 200u) << target << ": " << r.body;
  }
  // And the connection still serves requests after both (the idle wait is armed).
  auto third = exchange(conn, p, "POST", "/third", {}, "{}");
  ASSERT_TRUE(third.complete) << third.error;
  EXPECT_EQ(third.status, 200u);
  EXPECT_EQ(t.a->request_count(), 3u);
}

TEST_P(RouterPath, RouterFailureWhileTheClientIsWatchedLeavesTheConnectionUsable) {
  one_router_app t(short_config(1), router_behaviour::round_robin());
  auto& p = t.p;
  t.router->queue_behaviour(router_behaviour::respond(500, R"({"detail":"no"})"));
  auto conn = connection::open(proxy_host, p.port());
  ASSERT_TRUE(conn.connected()) << conn.error();
  auto failed = exchange(conn, p, "POST", "/x", {}, "{}");
  ASSERT_TRUE(failed.complete) << failed.error;
  EXPECT_EQ(failed.status, 503u);
  EXPECT_EQ(failed.header("x-serve-reason").value_or(""), "router_non_200");
  // The whole request was read before the router answered, so the generated 503 keeps the
  // connection (only replies sent while a body is still unread close it).
  ASSERT_TRUE(failed.keep_alive()) << "the 503 closed a connection whose request was read whole";
  for (int i = 0; i < 3; ++i) {
    auto r = exchange(conn, p, "POST", "/x", {}, "{}");
    ASSERT_TRUE(r.complete) << "request " << i << ": " << r.error;
    EXPECT_EQ(r.status, 200u) << r.body;
  }
}

TEST_P(RouterPath, ClientGoneDuringTheRouterCallIsCountedAndTheReplicaNotAsked) {
  one_router_app t(short_config(1), slow_router());
  auto& p = t.p;
  {
    auto conn = connection::open(proxy_host, p.port());
    ASSERT_TRUE(conn.connected()) << conn.error();
    ASSERT_TRUE(conn.write(format_request("POST", "/gone", proxy_host, p.port(), {}, "{}"), 5s)) << conn.error();
    ASSERT_TRUE(t.router->wait_for_requests(1, 5s));  // the router call is in flight
  }  // closed while the router call is in flight
  // The abandoned request has ended once it is counted.
  const auto m = testing::scrape_until(
      p.admin_port(), [](const testing::metrics_scrape& s) { return s.sum("ingressd_requests_total{") == 1; }, 10s);
  ASSERT_EQ(m.sum("ingressd_requests_total{"), 1) << m.text;
  // Still serving; the abandoned request never reached the replica.
  t.router->set_behaviour(router_behaviour::round_robin());
  auto r = post(p, {}, "{}");
  ASSERT_TRUE(r.complete) << r.error;
  EXPECT_EQ(r.status, 200u);
  EXPECT_EQ(t.a->request_count(), 1u);
}

// ---------------------------------------------------------------------------------------------
// 2. Which requests consult the router

TEST_P(RouterPath, GetIsNotRoutedAndAppWithoutRoutersIsNotRouted) {
  auto a = make_replica("rep-a");
  auto plain = make_replica("rep-plain");
  auto router = make_router(node_ip, "router-1");
  router->set_replicas({"rep-a"});
  testing::proxy p(short_config(1), node_ip);
  topology::document d;
  d.apps.push_back(make_app("routed", "/routed", {a.get()}, {router.get()}));
  d.apps.push_back(make_app("plain", "/plain", {plain.get()}, {}));
  p.set_topology(d);

  auto g = testing::http_get(proxy_host, p.port(), "/routed/models", {}, 5s);
  ASSERT_TRUE(g.complete) << g.error;
  EXPECT_EQ(g.status, 200u);
  EXPECT_EQ(served_by(g), "rep-a");
  EXPECT_EQ(a->request_count(), 1u);

  auto q = post(p, {}, "{}", "/plain/v1/chat");
  ASSERT_TRUE(q.complete) << q.error;
  EXPECT_EQ(q.status, 200u);
  EXPECT_EQ(served_by(q), "rep-plain");

  // PUT is not in the default methods either.
  auto put = http_request(proxy_host, p.port(), "PUT", "/routed/x", {}, "{}", 5s);
  ASSERT_TRUE(put.complete) << put.error;
  EXPECT_EQ(put.status, 200u);

  EXPECT_EQ(router->request_count(), 0u);

  // Control: a POST to the routed app does reach the router.
  auto r = post(p, {}, "{}", "/routed/v1/chat");
  ASSERT_TRUE(r.complete) << r.error;
  EXPECT_EQ(r.status, 200u);
  EXPECT_EQ(router->route_requests().size(), 1u);
}

TEST_P(RouterPath, ConfiguredMethodsRoutePut) {
  auto a = make_replica("rep-a");
  auto router = make_router(node_ip, "router-1");
  router->set_replicas({"rep-a"});
  auto cfg = short_config(1);
  cfg.router.methods = {"POST", "PUT"};
  testing::proxy p(cfg, node_ip);
  p.set_topology(one_app({a.get()}, {router.get()}));

  auto put = http_request(proxy_host, p.port(), "PUT", "/x", {{"X-Request-Id", "put-1"}}, "{}", 5s);
  ASSERT_TRUE(put.complete) << put.error;
  EXPECT_EQ(put.status, 200u);
  auto calls = router->route_requests();
  ASSERT_EQ(calls.size(), 1u);
  EXPECT_EQ(calls[0].method, "POST");  // the router call itself is always a POST
  EXPECT_EQ(calls[0].header("x-request-id").value_or(""), "put-1");

  auto post_r = post(p, {}, "{}");
  ASSERT_TRUE(post_r.complete) << post_r.error;
  EXPECT_EQ(post_r.status, 200u);
  auto get = testing::http_get(proxy_host, p.port(), "/x", {}, 5s);
  ASSERT_TRUE(get.complete) << get.error;
  EXPECT_EQ(get.status, 200u);
  EXPECT_EQ(router->route_requests().size(), 2u);  // PUT + POST, not GET
}

// ---------------------------------------------------------------------------------------------
// 3. Round robin

TEST_P(RouterPath, TwoColocatedRoutersSplitEvenlyAcrossTwoThreads) {
  two_router_app t(short_config(2));
  auto& p = t.p;
  auto& r1 = t.r1;
  auto& r2 = t.r2;

  constexpr int connections = 10, per_connection = 20;
  std::vector<std::string> ids;
  for (int c = 0; c < connections; ++c) {
    auto conn = connection::open(proxy_host, p.port());
    ASSERT_TRUE(conn.connected()) << conn.error();
    for (int i = 0; i < per_connection; ++i) {
      ids.push_back("split-" + std::to_string(c) + "-" + std::to_string(i));
      auto r = exchange(conn, p, "POST", "/x", {{"X-Request-Id", ids.back()}}, "{}");
      ASSERT_TRUE(r.complete) << r.error;
      ASSERT_EQ(r.status, 200u) << r.body;
    }
  }
  const auto h = hedges_of(p);
  const auto calls1 = r1->route_requests();
  const auto calls2 = r2->route_requests();
  const auto n1 = calls1.size(), n2 = calls2.size();
  std::size_t at_both = 0;
  for (const auto& id : ids) {
    const bool at1 = with_request_id(calls1, id).has_value(), at2 = with_request_id(calls2, id).has_value();
    EXPECT_TRUE(at1 || at2) << id << " reached no router";
    at_both += at1 && at2;
  }
  // Every call beyond one per request is a hedge (none with hedging off).
  EXPECT_LE(at_both, h.sent);
  EXPECT_GE(n1 + n2, 200u);
  EXPECT_LE(n1 + n2, 200u + h.sent) << "router-1 " << n1 << ", router-2 " << n2;
  if (GetParam() == hedging::off) {
    // Each worker alternates strictly, so each worker is off by at most one: ±2 in all. (With
    // hedging a router whose calls lose three races in a row is asked second for a second, by
    // design: the split then depends on the machine's load, so only the accounting above holds.)
    EXPECT_EQ(h.sent, 0u);
    EXPECT_EQ(n1 + n2, 200u);
    EXPECT_GE(n1, 98u) << "router-1 " << n1 << ", router-2 " << n2;
    EXPECT_LE(n1, 102u) << "router-1 " << n1 << ", router-2 " << n2;
  }
}

TEST_P(RouterPath, OneThreadAlternatesStrictly) {
  two_router_app t(short_config(1));
  auto& p = t.p;
  auto& r1 = t.r1;
  auto& r2 = t.r2;

  auto conn = connection::open(proxy_host, p.port());
  ASSERT_TRUE(conn.connected()) << conn.error();
  std::vector<std::string> ids;
  for (int i = 0; i < 10; ++i) {
    ids.push_back("alt-" + std::to_string(i));
    auto r = exchange(conn, p, "POST", "/x", {{"X-Request-Id", ids.back()}}, "{}");
    ASSERT_TRUE(r.complete) << r.error;
    ASSERT_EQ(r.status, 200u) << r.body;
  }
  const auto h = hedges_of(p);
  const auto calls1 = r1->route_requests();
  const auto calls2 = r2->route_requests();
  // The cursor starts at one of the two and then alternates, hedged requests included: request i
  // asks router (start + i) % 2 first. A hedge adds a call at the other router, and when it wins
  // the first call may never have been made; at most one of ten calls can be hedged (the 10 %
  // budget), so no router loses the three races that would reorder the pool.
  std::vector<int> from1(ids.size()), from2(ids.size());
  for (std::size_t i = 0; i < ids.size(); ++i) {
    from1[i] = static_cast<int>(i % 2);
    from2[i] = 1 - from1[i];
  }
  const auto a1 = reach_of(ids, from1, calls1, calls2);
  const auto a2 = reach_of(ids, from2, calls1, calls2);
  const auto& best = a1.not_first + a1.second <= a2.not_first + a2.second ? a1 : a2;
  EXPECT_EQ(best.nowhere, 0u);
  EXPECT_LE(best.not_first, h.won) << "not strictly alternating";
  EXPECT_LE(best.second, h.sent) << "not strictly alternating";
  EXPECT_LE(h.sent, 1u);
  EXPECT_GE(calls1.size(), 5u - h.won);
  EXPECT_GE(calls2.size(), 5u - h.won);
  EXPECT_LE(calls1.size() + calls2.size(), 10u + h.sent);
}

TEST_P(RouterPath, CursorSurvivesTopologyChangeThatKeepsThePool) {
  auto a = make_replica("rep-a");
  auto b = make_replica("rep-b");
  auto r1 = make_router(node_ip, "router-1");
  auto r2 = make_router(node_ip, "router-2");
  r1->set_replicas({"rep-a"});
  r2->set_replicas({"rep-a"});
  testing::proxy p(short_config(1), node_ip);
  p.set_topology(one_app({a.get()}, {r1.get(), r2.get()}));

  std::string sequence;
  for (int i = 0; i < 4; ++i) {
    const auto before1 = r1->route_requests().size();
    auto r = post(p, {}, "{}");
    ASSERT_TRUE(r.complete) << r.error;
    ASSERT_EQ(r.status, 200u) << r.body;
    sequence += r1->route_requests().size() > before1 ? '1' : '2';
    // Republish with another replica: the router pool is unchanged, so is the cursor (§3.2).
    p.set_topology(one_app(i % 2 == 0 ? std::vector<const replica_server*>{a.get(), b.get()}
                                      : std::vector<const replica_server*>{a.get()},
                           {r1.get(), r2.get()}));
  }
  for (std::size_t i = 1; i < sequence.size(); ++i)
    EXPECT_NE(sequence[i], sequence[i - 1]) << "cursor reset by a topology change: " << sequence;
  // Four calls are within any hedge budget (10 % of a worker's calls): none was hedged, so each
  // request's one call tells which router its decision asked.
  EXPECT_EQ(hedges_of(p).sent, 0u);
}

TEST_P(RouterPath, TopologyChangeDuringBodyUploadAdvancesTheRightAppsCursor) {
  // forward_body on: the router is asked only once the body prefix is in. A topology change that
  // reorders the apps lands while the request waits for its body; the request must still advance
  // its own app's cursor (contract §4.2), so that app's next request goes to the other router.
  auto a = make_replica("rep-a");
  auto b = make_replica("rep-b");
  auto ra1 = make_router(node_ip, "router-a1");
  auto ra2 = make_router(node_ip, "router-a2");
  auto rb1 = make_router(node_ip, "router-b1");
  auto rb2 = make_router(node_ip, "router-b2");
  for (auto* r : {ra1.get(), ra2.get()}) r->set_replicas({"rep-a"});
  for (auto* r : {rb1.get(), rb2.get()}) r->set_replicas({"rep-b"});
  auto cfg = short_config(1);
  cfg.router.forward_body = true;
  cfg.router.body_limit = 1024;
  testing::proxy p(cfg, node_ip);
  auto app_a = make_app("app-a", "/a", {a.get()}, {ra1.get(), ra2.get()});
  auto app_b = make_app("app-b", "/b", {b.get()}, {rb1.get(), rb2.get()});
  topology::document before;
  before.apps = {app_a, app_b};
  topology::document after;
  after.apps = {app_b, app_a};
  p.set_topology(before);

  const std::string body = R"({"prompt":"slow upload"})";
  auto conn = connection::open(proxy_host, p.port());
  ASSERT_TRUE(conn.connected()) << conn.error();
  ASSERT_TRUE(conn.write("POST /b/x HTTP/1.1\r\nHost: x\r\nExpect: 100-continue\r\nContent-Length: " +
                         std::to_string(body.size()) + "\r\n\r\n"));
  // 100 Continue: the proxy has the head (and the app) and now waits for the body.
  auto interim = conn.read_response(5s);
  ASSERT_TRUE(interim.complete) << interim.error;
  ASSERT_EQ(interim.status, 100u);
  p.set_topology(after);
  ASSERT_TRUE(conn.write(body));
  auto first = conn.read_response(5s);
  ASSERT_TRUE(first.complete) << first.error;
  ASSERT_EQ(first.status, 200u) << first.body;
  EXPECT_EQ(served_by(first), "rep-b");
  ASSERT_EQ(rb1->route_requests().size() + rb2->route_requests().size(), 1u);
  EXPECT_EQ(ra1->request_count() + ra2->request_count(), 0u);

  auto second = exchange(conn, p, "POST", "/b/x", {}, body);
  ASSERT_TRUE(second.complete) << second.error;
  ASSERT_EQ(second.status, 200u) << second.body;
  EXPECT_EQ(rb1->route_requests().size(), 1u) << "app-b's second request did not go to the other router";
  EXPECT_EQ(rb2->route_requests().size(), 1u) << "app-b's second request did not go to the other router";
  EXPECT_EQ(hedges_of(p).sent, 0u) << "two calls are within any hedge budget";
}

// The parameter does what it says: the product default hedges a late router call to the pool's
// other router; with router.hedge off the request waits for router.timeout and fails over.
TEST_P(RouterPath, LateRouterIsHedgedOnlyWithHedgingOn) {
  two_router_app t(short_config(1));
  auto& p = t.p;
  auto& r1 = t.r1;
  auto& r2 = t.r2;

  // Nine calls first: the budget (10 % of the worker's calls) allows the first hedge at the tenth.
  auto conn = connection::open(proxy_host, p.port());
  ASSERT_TRUE(conn.connected()) << conn.error();
  for (int i = 0; i < 9; ++i) {
    auto r = exchange(conn, p, "POST", "/x", {{"X-Request-Id", "warm-" + std::to_string(i)}}, "{}");
    ASSERT_TRUE(r.complete) << r.error;
    ASSERT_EQ(r.status, 200u) << r.body;
  }
  // The tenth decision asks first the router the ninth did not ask; that one never answers.
  const bool ninth_at_r1 = with_request_id(r1->route_requests(), "warm-8").has_value();
  auto& hung = ninth_at_r1 ? *r2 : *r1;
  auto& other = ninth_at_r1 ? *r1 : *r2;
  hung.queue_behaviour(router_behaviour::hang());
  auto r = exchange(conn, p, "POST", "/x", {{"X-Request-Id", "late"}}, "{}");
  ASSERT_TRUE(r.complete) << r.error;
  EXPECT_EQ(r.status, 200u) << r.body;
  EXPECT_EQ(served_by(r), "rep-a");
  EXPECT_TRUE(with_request_id(other.route_requests(), "late").has_value());
  const auto h = hedges_of(p);
  if (GetParam() == hedging::on) {
    EXPECT_EQ(h.sent, 1u);
    EXPECT_EQ(h.won, 1u);  // the hung call never answers: only the hedge can have
  } else {
    EXPECT_EQ(h.sent, 0u);  // the failover after router.timeout asked the other router
    EXPECT_EQ(h.won, 0u);
  }
}

// ---------------------------------------------------------------------------------------------
// 4. Co-location

TEST_P(RouterPath, ColocatedRoutersOnlyRemoteGetsNothing) {
  auto a = make_replica("rep-a");
  auto local1 = make_router(node_ip, "local-1");
  auto local2 = make_router(node_ip, "local-2");
  auto remote = make_router("127.0.0.3", "remote-1");
  for (auto* r : {local1.get(), local2.get(), remote.get()}) r->set_replicas({"rep-a"});
  testing::proxy p(short_config(1), node_ip);
  // Remote first in the document, so document order does not put it last by accident.
  p.set_topology(one_app({a.get()}, {remote.get(), local1.get(), local2.get()}));

  auto conn = connection::open(proxy_host, p.port());
  ASSERT_TRUE(conn.connected()) << conn.error();
  for (int i = 0; i < 20; ++i) {
    auto r = exchange(conn, p, "POST", "/x", {}, "{}");
    ASSERT_TRUE(r.complete) << r.error;
    ASSERT_EQ(r.status, 200u) << r.body;
  }
  // The remote router is not in the pool at all, so not even a hedge goes there. A hedge adds a
  // call at the other co-located router and, when it wins, may save the first router its call.
  const auto h = hedges_of(p);
  EXPECT_EQ(remote->request_count(), 0u);
  const auto n1 = local1->route_requests().size(), n2 = local2->route_requests().size();
  EXPECT_GE(n1, 10u - h.won);
  EXPECT_LE(n1, 10u + h.sent);
  EXPECT_GE(n2, 10u - h.won);
  EXPECT_LE(n2, 10u + h.sent);
  EXPECT_LE(n1 + n2, 20u + h.sent);
}

/// A router on `ip` whose port is below `below` when one is free nearby (so that the ip, not
/// the port, decides the order); otherwise any port.
std::unique_ptr<router_server> router_below(const std::string& ip, const std::string& name, std::uint16_t below) {
  for (std::uint16_t port = below - 1; port + 50 > below && port > 1024; --port) {
    try {
      return make_router(ip, name, port);
    } catch (const std::exception&) {
    }
  }
  return make_router(ip, name);
}

TEST_P(RouterPath, NoColocatedRouterAllCallsGoToSmallestIpText) {
  auto a = make_replica("rep-a");
  auto on3 = make_router("127.0.0.3", "remote-3");
  auto on4 = router_below("127.0.0.4", "remote-4", on3->port());
  on3->set_replicas({"rep-a"});
  on4->set_replicas({"rep-a"});
  testing::proxy p(short_config(2), node_ip);
  p.set_topology(one_app({a.get()}, {on4.get(), on3.get()}));

  for (int i = 0; i < 12; ++i) {
    auto r = post(p, {}, "{}");
    ASSERT_TRUE(r.complete) << r.error;
    ASSERT_EQ(r.status, 200u) << r.body;
  }
  EXPECT_EQ(on3->route_requests().size(), 12u);
  EXPECT_EQ(on4->request_count(), 0u) << "127.0.0.4 port " << on4->port() << ", 127.0.0.3 port " << on3->port();
}

TEST_P(RouterPath, NoColocatedRouterComparesIpAsText) {
  // "127.0.0.10" < "127.0.0.9" as text, the other way round as numbers: Ray compares text.
  auto a = make_replica("rep-a");
  auto on9 = make_router("127.0.0.9", "remote-9");
  auto on10 = make_router("127.0.0.10", "remote-10");
  on9->set_replicas({"rep-a"});
  on10->set_replicas({"rep-a"});
  testing::proxy p(short_config(1), node_ip);
  p.set_topology(one_app({a.get()}, {on9.get(), on10.get()}));

  for (int i = 0; i < 6; ++i) {
    auto r = post(p, {}, "{}");
    ASSERT_TRUE(r.complete) << r.error;
    ASSERT_EQ(r.status, 200u) << r.body;
  }
  EXPECT_EQ(on10->route_requests().size(), 6u);
  EXPECT_EQ(on9->request_count(), 0u);
}

// ---------------------------------------------------------------------------------------------
// 9. request_headers from the router

TEST_P(RouterPath, RouterRequestHeadersReplaceClientHeaders) {
  auto a = make_replica("rep-a");
  auto router = make_router(node_ip, "router-1");
  router->set_replicas({"rep-a"});
  router->set_behaviour(router_behaviour::round_robin().with_request_headers({{"serve_multiplexed_model_id", "m1"}}));
  testing::proxy p(short_config(1), node_ip);
  p.set_topology(one_app({a.get()}, {router.get()}));

  auto r = post(p, {{"serve_multiplexed_model_id", "client-forged"}, {"X-Other", "kept"}}, "{}");
  ASSERT_TRUE(r.complete) << r.error;
  EXPECT_EQ(r.status, 200u) << r.body;
  auto seen = a->requests();
  ASSERT_EQ(seen.size(), 1u);
  EXPECT_EQ(seen[0].header_count("serve_multiplexed_model_id"), 1u) << seen[0].raw;
  EXPECT_EQ(seen[0].header("serve_multiplexed_model_id").value_or(""), "m1") << seen[0].raw;
  EXPECT_EQ(seen[0].raw.find("client-forged"), std::string::npos) << seen[0].raw;
  EXPECT_EQ(seen[0].header("x-other").value_or(""), "kept");

  // Without a client value the router's header is added all the same.
  auto r2 = post(p, {}, "{}");
  ASSERT_TRUE(r2.complete) << r2.error;
  seen = a->requests();
  ASSERT_EQ(seen.size(), 2u);
  EXPECT_EQ(seen[1].header("serve_multiplexed_model_id").value_or(""), "m1") << seen[1].raw;
}

TEST_P(RouterPath, RouterRequestHeadersCannotBreakRequestFraming) {
  // Headers from the router are set on the forwarded request, but the request is still re-framed
  // by ingressd (contract §4.4: one Content-Length or our own chunking). A router's framing
  // header is left out of its request_headers (http::reserved_for_router); the reply still pins
  // the replica and its other headers still apply, so the replica never sees a second,
  // conflicting framing header.
  auto a = make_replica("rep-a");
  auto router = make_router(node_ip, "router-1");
  router->set_replicas({"rep-a"});
  router->set_behaviour(router_behaviour::round_robin().with_request_headers(
      {{"Content-Length", "3"}, {"serve_multiplexed_model_id", "m1"}}));
  testing::proxy p(short_config(1), node_ip);
  p.set_topology(one_app({a.get()}, {router.get()}));

  const std::string body = R"({"prompt":"framing"})";
  auto r = post(p, {}, body);
  ASSERT_TRUE(r.complete) << r.error;
  ASSERT_EQ(r.status, 200u) << r.header("x-serve-reason").value_or("") << " " << r.body;
  EXPECT_EQ(served_by(r), "rep-a");
  auto seen = a->requests();
  ASSERT_EQ(seen.size(), 1u) << "the replica got no request it could parse";
  EXPECT_EQ(seen[0].header_count("content-length"), 1u) << seen[0].raw;
  EXPECT_EQ(seen[0].header("content-length").value_or(""), std::to_string(body.size())) << seen[0].raw;
  EXPECT_EQ(seen[0].header_count("transfer-encoding"), 0u) << seen[0].raw;
  EXPECT_EQ(seen[0].body, body);
  EXPECT_EQ(seen[0].header("serve_multiplexed_model_id").value_or(""), "m1") << seen[0].raw;
}

TEST_P(RouterPath, RouterRequestHeadersCannotSplitTheRequestId) {
  // The same X-Request-Id on the router call and on the replica request (contract §4.2, §4.4),
  // exactly once, even if the router's request_headers name it too: that member is left out and
  // the rest of the reply stands.
  auto a = make_replica("rep-a");
  auto router = make_router(node_ip, "router-1");
  router->set_replicas({"rep-a"});
  router->set_behaviour(router_behaviour::round_robin().with_request_headers({{"X-Request-Id", "from-router"}}));
  testing::proxy p(short_config(1), node_ip);
  p.set_topology(one_app({a.get()}, {router.get()}));

  auto r = post(p, {{"X-Request-Id", "rid-77"}}, "{}");
  ASSERT_TRUE(r.complete) << r.error;
  ASSERT_EQ(r.status, 200u) << r.header("x-serve-reason").value_or("") << " " << r.body;
  EXPECT_EQ(r.header("x-request-id").value_or(""), "rid-77");
  auto seen = a->requests();
  ASSERT_EQ(seen.size(), 1u);
  EXPECT_EQ(seen[0].header_count("x-request-id"), 1u) << seen[0].raw;
  EXPECT_EQ(seen[0].header("x-request-id").value_or(""), "rid-77") << seen[0].raw;
  EXPECT_EQ(seen[0].raw.find("from-router"), std::string::npos) << seen[0].raw;
}

// ---------------------------------------------------------------------------------------------
// 10. forward_body

TEST_P(RouterPath, ForwardBodyTruncatesRouterCopyOnly) {
  auto a = make_replica("rep-a");
  auto router = make_router(node_ip, "router-1");
  router->set_replicas({"rep-a"});
  auto cfg = short_config(1);
  cfg.router.forward_body = true;
  cfg.router.body_limit = 16;
  testing::proxy p(cfg, node_ip);
  p.set_topology(one_app({a.get()}, {router.get()}));

  std::string body = R"({"model":"m","messages":[{"role":"user","content":")";
  body += std::string(100 - body.size() - 4, 'x');
  body += R"("}]})";
  ASSERT_EQ(body.size(), 100u);

  auto r = post(p, {{"Content-Type", "application/json"}}, body);
  ASSERT_TRUE(r.complete) << r.error;
  EXPECT_EQ(r.status, 200u) << r.body;
  auto calls = router->route_requests();
  ASSERT_EQ(calls.size(), 1u);
  EXPECT_EQ(calls[0].body, body.substr(0, 16));
  EXPECT_EQ(calls[0].header("content-length").value_or(""), "16");
  EXPECT_EQ(calls[0].header("x-body-truncated").value_or("<none>"), "16/100") << calls[0].raw;
  EXPECT_EQ(calls[0].header("content-type").value_or(""), "application/json");
  auto seen = a->requests();
  ASSERT_EQ(seen.size(), 1u);
  EXPECT_EQ(seen[0].body, body);
  EXPECT_EQ(seen[0].header("content-length").value_or(""), "100");
}

TEST_P(RouterPath, ForwardBodyShortBodyIsSentWhole) {
  auto a = make_replica("rep-a");
  auto router = make_router(node_ip, "router-1");
  router->set_replicas({"rep-a"});
  auto cfg = short_config(1);
  cfg.router.forward_body = true;
  cfg.router.body_limit = 16;
  testing::proxy p(cfg, node_ip);
  p.set_topology(one_app({a.get()}, {router.get()}));

  auto conn = connection::open(proxy_host, p.port());
  ASSERT_TRUE(conn.connected()) << conn.error();
  const std::string shorter = R"({"prompt":"x"})";        // 14 bytes
  const std::string exact = R"({"prompt":"xyz"})";        // 16 bytes: nothing cut
  ASSERT_LT(shorter.size(), 16u);
  ASSERT_EQ(exact.size(), 16u);
  for (const auto& body : {shorter, exact}) {
    auto r = exchange(conn, p, "POST", "/x", {{"Content-Type", "application/json"}}, body);
    ASSERT_TRUE(r.complete) << r.error;
    EXPECT_EQ(r.status, 200u) << r.body;
  }
  auto calls = router->route_requests();
  ASSERT_EQ(calls.size(), 2u);
  EXPECT_EQ(calls[0].body, shorter);
  EXPECT_EQ(calls[0].header("content-length").value_or(""), std::to_string(shorter.size()));
  EXPECT_EQ(calls[0].header_count("x-body-truncated"), 0u) << calls[0].raw;
  EXPECT_EQ(calls[1].body, exact);
  EXPECT_EQ(calls[1].header_count("x-body-truncated"), 0u) << calls[1].raw;
  auto seen = a->requests();
  ASSERT_EQ(seen.size(), 2u);
  EXPECT_EQ(seen[0].body, shorter);
  EXPECT_EQ(seen[1].body, exact);
}

// ---------------------------------------------------------------------------------------------
// 11. forward_body off: the router call overlaps the body upload

TEST_P(RouterPath, RouterCallStartsBeforeBodyArrives) {
  auto a = make_replica("rep-a");
  auto router = make_router(node_ip, "router-1");
  router->set_replicas({"rep-a"});
  router->set_behaviour(router_behaviour::round_robin().after(300ms));
  testing::proxy p(short_config(1), node_ip);
  p.set_topology(one_app({a.get()}, {router.get()}));

  const std::string body = R"({"prompt":"overlap"})";
  const std::string head = "POST /x HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Type: application/json\r\nContent-Length: " +
                           std::to_string(body.size()) + "\r\n\r\n";
  auto conn = connection::open(proxy_host, p.port());
  ASSERT_TRUE(conn.connected()) << conn.error();
  const auto head_sent = testing::clock::now();
  ASSERT_TRUE(conn.write(head));
  // The router must be asked while the body has not been sent at all.
  const bool called_before_body = router->wait_for_requests(1, 2s);
  // The scenario: the body trails the head by 200ms (a slow uploader, not a synchronisation).
  std::this_thread::sleep_until(head_sent + 200ms);
  const auto body_sent = testing::clock::now();
  ASSERT_TRUE(conn.write(body));
  auto r = conn.read_response(5s);
  ASSERT_TRUE(called_before_body) << "the router was not called before the client sent the body";
  ASSERT_TRUE(r.complete) << r.error;
  EXPECT_EQ(r.status, 200u) << r.body;

  auto calls = router->route_requests();
  ASSERT_EQ(calls.size(), 1u);
  EXPECT_LT(calls[0].head_at, body_sent);
  EXPECT_EQ(calls[0].header("content-length").value_or(""), "0");
  // Router delay (300ms) and upload (200ms) overlap: the call began before the body was sent
  // (above), and the replica got the body after that (no wall-clock bound, which a loaded
  // machine could break).
  EXPECT_GE(r.finished_at - head_sent, 300ms);
  auto seen = a->requests();
  ASSERT_EQ(seen.size(), 1u);
  EXPECT_EQ(seen[0].body, body);
}

// ---------------------------------------------------------------------------------------------
// 12. The pinned replica cannot be reached

using testing::dead_port;

TEST_P(RouterPath, PinnedReplicaRefusingConnectionsFallsThroughToHealthyReplica) {
  auto live = make_replica("rep-live");
  const topology::target dead{.ip = replica_ip, .port = dead_port(replica_ip), .instance_id = "", .name = "rep-dead"};
  auto router = make_router(node_ip, "router-1");
  router->set_replicas({"rep-dead"});
  testing::proxy p(short_config(1), node_ip);
  auto doc = one_app({live.get()}, {router.get()});
  doc.apps[0].replicas.insert(doc.apps[0].replicas.begin(), dead);
  p.set_topology(doc);

  for (int i = 0; i < 3; ++i) {
    auto r = post(p, {{"X-Request-Id", "pin-" + std::to_string(i)}}, R"({"prompt":"p"})");
    ASSERT_TRUE(r.complete) << r.error;
    EXPECT_EQ(r.status, 200u) << r.body;
    EXPECT_EQ(served_by(r), "rep-live");
  }
  EXPECT_EQ(router->route_requests().size(), 3u);
  EXPECT_EQ(router->picks(), (std::vector<std::string>{"rep-dead", "rep-dead", "rep-dead"}));
  auto seen = live->requests();
  ASSERT_EQ(seen.size(), 3u);
  EXPECT_EQ(seen[2].header("x-request-id").value_or(""), "pin-2");
  EXPECT_EQ(seen[2].body, R"({"prompt":"p"})");
}

}  // namespace
}  // namespace ingressd
