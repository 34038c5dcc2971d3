// Router failures, failover and router connection handling (contract §4.2), end to end: the
// daemon runs in-process, with fake routers and replicas on loopback. 127.0.0.2 is this node.
#include <chrono>
#include <cstdint>
#include <memory>
#include <string>
#include <thread>
#include <vector>

#include <gtest/gtest.h>

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
using demo::replica_server;
using demo::router_behaviour;
using demo::router_server;
using testing::connection;
using testing::format_request;
using testing::http_response;

const std::string node_ip = "127.0.0.2";
const std::string replica_ip = "127.0.0.1";
const std::string proxy_host = "127.0.0.1";

/// Routers of this file stand on this node (tests/fakes/servers.hpp makes them).
std::unique_ptr<router_server> make_router(const std::string& name, std::uint16_t port = 0) {
  return testing::make_router(node_ip, name, port);
}
using testing::make_replica;
using testing::target_of;

using testing::dead_port;

topology::target dead_router(const std::string& name) {
  return topology::target{.ip = node_ip, .port = dead_port(node_ip), .instance_id = "", .name = name};
}

struct app_spec {
  std::vector<topology::target> replicas;
  std::vector<topology::target> routers;
  bool router_fallback = false;
};

topology::document doc_of(const app_spec& s) {
  topology::document d;
  topology::app a;
  a.name = "llm";
  a.route_prefix = "/";
  a.replicas = s.replicas;
  a.routers = s.routers;
  a.router_fallback = s.router_fallback;
  d.apps.push_back(std::move(a));
  return d;
}

config::config short_config(unsigned threads = 1) {
  auto c = testing::test_config(threads);
  c.router.timeout = 1s;
  c.upstream.connect_timeout = 1s;
  c.upstream.first_byte_timeout = 5s;
  c.upstream.idle_timeout = 5s;
  return c;
}

http_response post(const testing::proxy& p, const testing::header_list& headers = {}, std::string_view body = "{}") {
  return testing::http_post(proxy_host, p.port(), "/v1/chat/completions", headers, body, 5s);
}

http_response exchange(connection& c, const testing::proxy& p, const testing::header_list& headers = {},
                       std::string_view body = "{}") {
  if (!c.write(format_request("POST", "/v1/chat/completions", proxy_host, p.port(), headers, body), 5s)) {
    http_response r;
    r.error = "write failed: " + c.error();
    return r;
  }
  return c.read_response(5s);
}

std::string served_by(const http_response& r) { return r.header("x-served-by").value_or("<none>"); }

void expect_router_failure(const http_response& r, const std::string& reason) {
  ASSERT_TRUE(r.complete) << r.error;
  EXPECT_EQ(r.status, 503u) << r.body;
  EXPECT_EQ(r.header("x-serve-reason").value_or("<none>"), reason);
  EXPECT_EQ(r.body, "Ingress request router failed: " + reason);
}

long long ms(std::chrono::steady_clock::duration d) {
  return std::chrono::duration_cast<std::chrono::milliseconds>(d).count();
}

// ---------------------------------------------------------------------------------------------
// 5. Failover when a router gives no reply

TEST(RouterFailover, RefusedRouterFailsOverToLiveOne) {
  auto a = make_replica("rep-a");
  auto live = make_router("router-live");
  live->set_replicas({"rep-a"});
  testing::proxy p(short_config(1), node_ip);
  p.set_topology(doc_of({.replicas = {target_of(*a, "rep-a")},
                         .routers = {dead_router("router-dead"), target_of(*live, "router-live")}}));

  auto conn = connection::open(proxy_host, p.port());
  ASSERT_TRUE(conn.connected()) << conn.error();
  for (int i = 0; i < 10; ++i) {
    auto r = exchange(conn, p);
    ASSERT_TRUE(r.complete) << r.error;
    EXPECT_EQ(r.status, 200u) << r.body;
    EXPECT_EQ(served_by(r), "rep-a");
  }
  EXPECT_EQ(live->route_requests().size(), 10u);
  EXPECT_EQ(a->request_count(), 10u);
}

TEST(RouterFailover, HungRouterCostsTimeoutOnceThenIsTriedLast) {
  auto a = make_replica("rep-a");
  auto hung = make_router("router-hung");
  auto live = make_router("router-live");
  hung->set_behaviour(router_behaviour::hang());
  live->set_replicas({"rep-a"});
  auto cfg = short_config(1);
  cfg.router.timeout = 300ms;
  testing::proxy p(cfg, node_ip);
  p.set_topology(doc_of({.replicas = {target_of(*a, "rep-a")},
                         .routers = {target_of(*hung, "router-hung"), target_of(*live, "router-live")}}));

  auto conn = connection::open(proxy_host, p.port());
  ASSERT_TRUE(conn.connected()) << conn.error();
  // The cursor alternates, so the hung router comes first in one of the first two requests.
  testing::clock::duration first_hit{};
  int hits = 0;
  for (int i = 0; i < 2 && hung->request_count() == 0; ++i) {
    const auto t0 = testing::clock::now();
    auto r = exchange(conn, p, {{"X-Request-Id", "first-" + std::to_string(i)}});
    const auto took = testing::clock::now() - t0;
    ASSERT_TRUE(r.complete) << r.error;
    ASSERT_EQ(r.status, 200u) << r.body;
    EXPECT_EQ(served_by(r), "rep-a");
    if (hung->request_count() > 0) {
      first_hit = took;
      ++hits;
    }
  }
  ASSERT_EQ(hits, 1) << "the hung router was never tried first";
  // It waited for the router timeout (no sooner), gave up on the hung router (its connection
  // closed), then failed over to the live router.
  EXPECT_GE(first_hit, 290ms) << ms(first_hit) << "ms";
  EXPECT_TRUE(hung->wait_for_disconnects(1, 5s));
  const auto live_before = live->route_requests().size();

  // The next requests do not each pay the timeout again: the hung router is not asked by them
  // (a request that did ask it would wait the timeout), but at most once more as a probe.
  for (int i = 0; i < 10; ++i) {
    auto r = exchange(conn, p);
    ASSERT_TRUE(r.complete) << r.error;
    ASSERT_EQ(r.status, 200u) << r.body;
  }
  EXPECT_EQ(live->route_requests().size(), live_before + 10);
  EXPECT_LE(hung->request_count(), 2u);
}

TEST(RouterFailover, RouterThatComesBackGetsItsShareAgain) {
  // A router that gave no reply is remembered for a short back-off, not forever: once it
  // answers again it is back in the rotation.
  auto a = make_replica("rep-a");
  auto live = make_router("router-live");
  live->set_replicas({"rep-a"});
  const auto dead = dead_router("router-back");
  testing::proxy p(short_config(1), node_ip);
  p.set_topology(doc_of({.replicas = {target_of(*a, "rep-a")}, .routers = {dead, target_of(*live, "router-live")}}));

  auto conn = connection::open(proxy_host, p.port());
  ASSERT_TRUE(conn.connected()) << conn.error();
  for (int i = 0; i < 4; ++i) {
    auto r = exchange(conn, p);
    ASSERT_TRUE(r.complete) << r.error;
    ASSERT_EQ(r.status, 200u) << r.body;
  }
  EXPECT_EQ(live->route_requests().size(), 4u);

  auto back = make_router("router-back", dead.port);
  back->set_replicas({"rep-a"});
  // Requests paced 10ms apart until the returning router is asked again (bounded: 5s).
  const auto deadline = testing::clock::now() + 5s;
  while (back->request_count() == 0 && testing::clock::now() < deadline) {
    auto r = exchange(conn, p);
    ASSERT_TRUE(r.complete) << r.error;
    ASSERT_EQ(r.status, 200u) << r.body;
    std::this_thread::sleep_for(10ms);
  }
  ASSERT_GT(back->request_count(), 0u) << "the router was never tried again";
  // Back in the rotation: the next 10 requests split 5/5.
  const auto back_before = back->route_requests().size();
  const auto live_before = live->route_requests().size();
  for (int i = 0; i < 10; ++i) {
    auto r = exchange(conn, p);
    ASSERT_TRUE(r.complete) << r.error;
    ASSERT_EQ(r.status, 200u) << r.body;
  }
  EXPECT_EQ(back->route_requests().size() - back_before, 5u);
  EXPECT_EQ(live->route_requests().size() - live_before, 5u);
}

// ---------------------------------------------------------------------------------------------
// 6. A reply is final, whatever its status

TEST(RouterFailover, Non200IsFinalWithoutFailover) {
  auto a = make_replica("rep-a");
  auto failing = make_router("router-503");
  auto good = make_router("router-ok");
  failing->set_behaviour(router_behaviour::respond(503, R"({"detail":"no replicas"})"));
  good->set_replicas({"rep-a"});
  testing::proxy p(short_config(1), node_ip);
  p.set_topology(doc_of({.replicas = {target_of(*a, "rep-a")},
                         .routers = {target_of(*failing, "router-503"), target_of(*good, "router-ok")}}));

  auto conn = connection::open(proxy_host, p.port());
  ASSERT_TRUE(conn.connected()) << conn.error();
  int failures = 0, successes = 0;
  for (int i = 0; i < 10; ++i) {
    const auto good_before = good->route_requests().size();
    const auto failing_before = failing->route_requests().size();
    auto r = exchange(conn, p);
    ASSERT_TRUE(r.complete) << r.error;
    if (r.status == 503) {
      ++failures;
      expect_router_failure(r, "router_non_200");
      EXPECT_EQ(failing->route_requests().size(), failing_before + 1);
      EXPECT_EQ(good->route_requests().size(), good_before) << "router-ok was asked after a 503 reply";
      // A 503 closes the client connection: reconnect.
      if (!r.keep_alive()) conn = connection::open(proxy_host, p.port());
    } else {
      ++successes;
      EXPECT_EQ(r.status, 200u) << r.body;
      EXPECT_EQ(good->route_requests().size(), good_before + 1);
      EXPECT_EQ(failing->route_requests().size(), failing_before);
    }
  }
  // A router that replies (even non-200) keeps its turn: strict alternation, 5 and 5.
  EXPECT_EQ(failures, 5);
  EXPECT_EQ(successes, 5);
}

// ---------------------------------------------------------------------------------------------
// 7. Each failure reason

TEST(RouterFailover, AllRoutersDeadIsRouterUnreachable) {
  auto a = make_replica("rep-a");
  testing::proxy p(short_config(1), node_ip);
  p.set_topology(doc_of({.replicas = {target_of(*a, "rep-a")}, .routers = {dead_router("d1"), dead_router("d2")}}));
  for (int i = 0; i < 3; ++i) expect_router_failure(post(p), "router_unreachable");
  EXPECT_EQ(a->request_count(), 0u);
}

TEST(RouterFailover, GarbageReplyIsUnparseableReplicaId) {
  auto a = make_replica("rep-a");
  auto router = make_router("router-1");
  router->set_behaviour(router_behaviour::respond(200, "this is not json"));
  testing::proxy p(short_config(1), node_ip);
  p.set_topology(doc_of({.replicas = {target_of(*a, "rep-a")}, .routers = {target_of(*router, "router-1")}}));
  expect_router_failure(post(p), "unparseable_replica_id");
  router->set_behaviour(router_behaviour::respond(200, R"({"host":"x","port":1})"));
  expect_router_failure(post(p), "unparseable_replica_id");
  router->set_behaviour(router_behaviour::respond(200, R"({"replica_id":42})"));
  expect_router_failure(post(p), "unparseable_replica_id");
  EXPECT_EQ(router->route_requests().size(), 3u);
  EXPECT_EQ(a->request_count(), 0u);
}

TEST(RouterFailover, UnknownReplicaIdWithoutFallbackIs503) {
  auto a = make_replica("rep-a");
  auto router = make_router("router-1");
  router->set_replicas({"SERVE_REPLICA::llm#LLMServer#not-in-topology"});
  testing::proxy p(short_config(1), node_ip);
  p.set_topology(doc_of({.replicas = {target_of(*a, "rep-a")}, .routers = {target_of(*router, "router-1")}}));
  expect_router_failure(post(p), "unknown_replica_id");
  EXPECT_EQ(a->request_count(), 0u);
}

TEST(RouterFailover, UnknownReplicaIdGoesToHttpFallback) {
  auto a = make_replica("rep-a");
  auto fallback = make_replica("fallback-proxy");
  auto router = make_router("router-1");
  router->set_replicas({"SERVE_REPLICA::llm#LLMServer#not-in-topology"});
  testing::proxy p(short_config(1), node_ip);
  auto doc = doc_of({.replicas = {target_of(*a, "rep-a")}, .routers = {target_of(*router, "router-1")}});
  doc.http_fallback = target_of(*fallback, "fallback-proxy");
  p.set_topology(doc);

  auto r = post(p, {{"X-Request-Id", "fb-1"}}, R"({"prompt":"f"})");
  ASSERT_TRUE(r.complete) << r.error;
  EXPECT_EQ(r.status, 200u) << r.body;
  EXPECT_EQ(served_by(r), "fallback-proxy");
  EXPECT_EQ(a->request_count(), 0u);
  auto seen = fallback->requests();
  ASSERT_EQ(seen.size(), 1u);
  EXPECT_EQ(seen[0].body, R"({"prompt":"f"})");
  EXPECT_EQ(seen[0].header("x-request-id").value_or(""), "fb-1");

  // A known replica_id still goes to that replica, not to the fallback.
  router->set_replicas({"rep-a"});
  auto r2 = post(p);
  ASSERT_TRUE(r2.complete) << r2.error;
  EXPECT_EQ(r2.status, 200u) << r2.body;
  EXPECT_EQ(served_by(r2), "rep-a");
}

// ---------------------------------------------------------------------------------------------
// 8. Failing open

TEST(RouterFailover, FailOpenConfigServesDespiteUnreachableRouters) {
  auto a = make_replica("rep-a");
  auto b = make_replica("rep-b");
  auto cfg = short_config(1);
  cfg.router.failure_mode = config::on_failure::fail_open;
  testing::proxy p(cfg, node_ip);
  p.set_topology(doc_of({.replicas = {target_of(*a, "rep-a"), target_of(*b, "rep-b")},
                         .routers = {dead_router("d1"), dead_router("d2")}}));
  for (int i = 0; i < 4; ++i) {
    auto r = post(p);
    ASSERT_TRUE(r.complete) << r.error;
    EXPECT_EQ(r.status, 200u) << r.body;
    const auto who = served_by(r);
    EXPECT_TRUE(who == "rep-a" || who == "rep-b") << who;
  }
  EXPECT_EQ(a->request_count() + b->request_count(), 4u);
}

TEST(RouterFailover, FailOpenAlsoCoversNon200) {
  auto a = make_replica("rep-a");
  auto router = make_router("router-1");
  router->set_behaviour(router_behaviour::respond(500, R"({"detail":"boom"})"));
  auto cfg = short_config(1);
  cfg.router.failure_mode = config::on_failure::fail_open;
  testing::proxy p(cfg, node_ip);
  p.set_topology(doc_of({.replicas = {target_of(*a, "rep-a")}, .routers = {target_of(*router, "router-1")}}));
  auto r = post(p);
  ASSERT_TRUE(r.complete) << r.error;
  EXPECT_EQ(r.status, 200u) << r.body;
  EXPECT_EQ(served_by(r), "rep-a");
  EXPECT_EQ(router->route_requests().size(), 1u);
}

TEST(RouterFailover, AppRouterFallbackServesDespiteUnreachableRouters) {
  auto a = make_replica("rep-a");
  testing::proxy p(short_config(1), node_ip);  // fail_closed
  p.set_topology(doc_of({.replicas = {target_of(*a, "rep-a")},
                         .routers = {dead_router("d1")},
                         .router_fallback = true}));
  auto r = post(p);
  ASSERT_TRUE(r.complete) << r.error;
  EXPECT_EQ(r.status, 200u) << r.body;
  EXPECT_EQ(served_by(r), "rep-a");
}

// ---------------------------------------------------------------------------------------------
// 13, 14. Router connections

TEST(RouterFailover, RouterConnectionsArePooled) {
  auto a = make_replica("rep-a");
  auto router = make_router("router-1");
  router->set_replicas({"rep-a"});
  testing::proxy p(short_config(1), node_ip);
  p.set_topology(doc_of({.replicas = {target_of(*a, "rep-a")}, .routers = {target_of(*router, "router-1")}}));

  auto conn = connection::open(proxy_host, p.port());
  ASSERT_TRUE(conn.connected()) << conn.error();
  for (int i = 0; i < 20; ++i) {
    auto r = exchange(conn, p);
    ASSERT_TRUE(r.complete) << r.error;
    ASSERT_EQ(r.status, 200u) << r.body;
  }
  EXPECT_EQ(router->route_requests().size(), 20u);
  EXPECT_LE(router->connections_accepted(), 2u);
}

TEST(RouterFailover, RouterClosingAfterEachReplyIsNotAFailure) {
  auto a = make_replica("rep-a");
  auto router = make_router("router-1");
  router->set_behaviour(router_behaviour::respond(
      200, R"({"replica_id":"rep-a"})", {{"Content-Type", "application/json"}, {"Connection", "close"}}));
  testing::proxy p(short_config(1), node_ip);
  p.set_topology(doc_of({.replicas = {target_of(*a, "rep-a")}, .routers = {target_of(*router, "router-1")}}));

  auto conn = connection::open(proxy_host, p.port());
  ASSERT_TRUE(conn.connected()) << conn.error();
  for (int i = 0; i < 10; ++i) {
    auto r = exchange(conn, p);
    ASSERT_TRUE(r.complete) << r.error;
    ASSERT_EQ(r.status, 200u) << r.header("x-serve-reason").value_or("") << " " << r.body;
    EXPECT_EQ(served_by(r), "rep-a");
  }
  EXPECT_EQ(router->route_requests().size(), 10u);
  EXPECT_EQ(router->connections_accepted(), 10u);  // a closed connection is never reused
}

TEST(RouterFailover, PooledConnectionTheRouterClosedWhileIdleIsNotAFailure) {
  // The router restarts (its pooled keep-alive connection dies with a FIN while idle): router
  // connections are taken from the pool without a liveness peek, so the dead one is written to,
  // fails before any reply byte and the call goes again on a fresh connection.
  auto a = make_replica("rep-a");
  auto router = make_router("router-1");
  router->set_replicas({"rep-a"});
  const auto port = router->port();
  testing::proxy p(short_config(1), node_ip);
  p.set_topology(doc_of({.replicas = {target_of(*a, "rep-a")}, .routers = {target_of(*router, "router-1")}}));

  auto conn = connection::open(proxy_host, p.port());
  ASSERT_TRUE(conn.connected()) << conn.error();
  auto r1 = exchange(conn, p, {{"X-Request-Id", "before"}});
  ASSERT_TRUE(r1.complete) << r1.error;
  ASSERT_EQ(r1.status, 200u) << r1.body;
  router->stop();
  router.reset();
  auto again = make_router("router-1b", port);
  again->set_replicas({"rep-a"});
  auto r2 = exchange(conn, p, {{"X-Request-Id", "after"}});
  ASSERT_TRUE(r2.complete) << r2.error;
  EXPECT_EQ(r2.status, 200u) << r2.header("x-serve-reason").value_or("") << " " << r2.body;
  EXPECT_EQ(served_by(r2), "rep-a");
  auto calls = again->route_requests();
  ASSERT_EQ(calls.size(), 1u);
  EXPECT_EQ(calls[0].header("x-request-id").value_or(""), "after");
}

TEST(RouterFailover, StalePooledConnectionIsRetriedOnceOnAFreshOne) {
  // A pooled router connection that ends before any reply byte is staleness (the router's
  // keep-alive timer raced our reuse): retried once on a fresh connection, not a failure
  // (contract §4.2). A fresh connection that ends the same way is a router that gave no reply.
  auto a = make_replica("rep-a");
  auto router = make_router("router-1");
  router->set_replicas({"rep-a"});
  testing::proxy p(short_config(1), node_ip);
  p.set_topology(doc_of({.replicas = {target_of(*a, "rep-a")}, .routers = {target_of(*router, "router-1")}}));

  auto conn = connection::open(proxy_host, p.port());
  ASSERT_TRUE(conn.connected()) << conn.error();
  auto r1 = exchange(conn, p, {{"X-Request-Id", "warm"}});
  ASSERT_TRUE(r1.complete) << r1.error;
  ASSERT_EQ(r1.status, 200u) << r1.body;
  ASSERT_EQ(router->connections_accepted(), 1u);

  // The pooled connection is closed by the router after reading the next request.
  router->queue_behaviour(router_behaviour::close_without_reply());
  auto r2 = exchange(conn, p, {{"X-Request-Id", "stale"}});
  ASSERT_TRUE(r2.complete) << r2.error;
  EXPECT_EQ(r2.status, 200u) << r2.header("x-serve-reason").value_or("") << " " << r2.body;
  EXPECT_EQ(served_by(r2), "rep-a");
  auto calls = router->route_requests();
  ASSERT_EQ(calls.size(), 3u);
  EXPECT_EQ(calls[1].header("x-request-id").value_or(""), "stale");
  EXPECT_EQ(calls[2].header("x-request-id").value_or(""), "stale");
  EXPECT_EQ(calls[1].connection_id, calls[0].connection_id);  // the pooled one
  EXPECT_NE(calls[2].connection_id, calls[1].connection_id);  // then a fresh one

  // Pooled and then fresh both end without a reply: exactly one retry, then no reply at all.
  router->queue_behaviour(router_behaviour::close_without_reply());
  router->queue_behaviour(router_behaviour::close_without_reply());
  if (!r2.keep_alive()) conn = connection::open(proxy_host, p.port());
  auto r3 = exchange(conn, p, {{"X-Request-Id", "gone"}});
  expect_router_failure(r3, "router_unreachable");
  calls = router->route_requests();
  ASSERT_EQ(calls.size(), 5u);
  EXPECT_EQ(calls[3].header("x-request-id").value_or(""), "gone");
  EXPECT_EQ(calls[4].header("x-request-id").value_or(""), "gone");
}

TEST(RouterFailover, RouterRestartLeavesNoStalePooledConnection) {
  auto a = make_replica("rep-a");
  auto router = make_router("router-1");
  router->set_replicas({"rep-a"});
  const auto port = router->port();
  auto cfg = short_config(1);
  testing::proxy p(cfg, node_ip);
  p.set_topology(doc_of({.replicas = {target_of(*a, "rep-a")}, .routers = {target_of(*router, "router-1")}}));

  auto conn = connection::open(proxy_host, p.port());
  ASSERT_TRUE(conn.connected()) << conn.error();
  auto r1 = exchange(conn, p);
  ASSERT_TRUE(r1.complete) << r1.error;
  ASSERT_EQ(r1.status, 200u) << r1.body;

  // The router restarts on the same address: the proxy's pooled connection to it is dead.
  router.reset();
  router = make_router("router-1", port);
  router->set_replicas({"rep-a"});
  for (int i = 0; i < 3; ++i) {
    auto r = exchange(conn, p);
    ASSERT_TRUE(r.complete) << r.error;
    EXPECT_EQ(r.status, 200u) << r.header("x-serve-reason").value_or("") << " " << r.body;
  }
  EXPECT_EQ(router->route_requests().size(), 3u);
}

}  // namespace
}  // namespace ingressd
