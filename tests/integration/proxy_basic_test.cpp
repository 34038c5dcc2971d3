// The plain proxy path (apps without routers): relaying, keep-alive and pipelining, route
// matching, least-loaded choice, connect retries, forwarding rules (contract §4.1, §4.3, §4.4),
// ingressd's own endpoints (§5) and several worker threads.
#include <atomic>
#include <chrono>
#include <cstdio>
#include <memory>
#include <regex>
#include <set>
#include <string>
#include <thread>
#include <vector>

#include <gtest/gtest.h>
#include <nlohmann/json.hpp>

#include "fakes/http_client.hpp"
#include "fakes/servers.hpp"
#include "fakes/proxy_fixture.hpp"
#include "fakes/topology_builder.hpp"
#include "ingressd/demo/replica_server.hpp"

namespace ingressd {
namespace {

using namespace std::chrono_literals;
using demo::replica_behaviour;
using demo::replica_server;
using testing::connection;
using testing::dead_port;
using testing::format_request;
using testing::http_get;
using testing::http_post;
using testing::http_request;
using testing::make_target;
using testing::proxy;
using testing::target_of;
using testing::test_config;
using testing::topology_builder;

const std::string loopback = "127.0.0.1";

using testing::replica_named;

/// The target the replica's JSON echo reports (what the replica saw as request-target).
std::string echoed_target(const testing::http_response& r) {
  auto j = nlohmann::json::parse(r.body, nullptr, false);
  if (!j.is_object() || !j.contains("target") || !j["target"].is_string()) return "<no echo: " + r.body + ">";
  return j["target"].get<std::string>();
}

std::string served_by(const testing::http_response& r) { return r.header("x-served-by").value_or("<none>"); }

std::string get_req(const proxy& p, std::string_view target, const testing::header_list& headers = {}) {
  return format_request("GET", target, loopback, p.port(), headers, {});
}

// --- 1. Relaying, keep-alive, pipelining ----------------------------------------------------------

TEST(ProxyBasic, GetReachesReplicaWithBodyIntact) {
  replica_server a(replica_named("SERVE_REPLICA::app#A#1"));
  proxy p(test_config());
  p.set_topology(topology_builder().app("app", "/", {target_of(a)}));

  auto r = http_get(loopback, p.port(), "/hello/world?x=1");
  ASSERT_TRUE(r.complete) << r.error;
  EXPECT_EQ(r.status, 200u);
  EXPECT_EQ(served_by(r), a.name());
  EXPECT_EQ(r.header("content-type").value_or(""), "application/json");
  auto j = nlohmann::json::parse(r.body, nullptr, false);
  ASSERT_TRUE(j.is_object()) << r.body;
  EXPECT_EQ(j["replica"], a.name());
  EXPECT_EQ(j["method"], "GET");
  EXPECT_EQ(j["target"], "/hello/world?x=1");
  EXPECT_EQ(r.header("content-length").value_or(""), std::to_string(r.body.size()));

  auto rec = a.requests();
  ASSERT_EQ(rec.size(), 1u);
  EXPECT_EQ(rec[0].method, "GET");
  EXPECT_EQ(rec[0].target, "/hello/world?x=1");
}

TEST(ProxyBasic, ListenersAcceptAHostName) {
  // listen / admin_listen take "host:port"; a name is resolved once at startup (IPv4 first).
  replica_server a(replica_named("SERVE_REPLICA::app#A#1"));
  auto cfg = test_config();
  cfg.listen = {"localhost", 0};
  cfg.admin_listen = {"localhost", 0};
  proxy p(cfg);
  p.set_topology(topology_builder().app("app", "/", {target_of(a)}));
  auto r = http_get("127.0.0.1", p.port(), "/x");
  ASSERT_TRUE(r.complete) << r.error;
  EXPECT_EQ(served_by(r), a.name());
  EXPECT_EQ(http_get("127.0.0.1", p.admin_port(), "/metrics").status, 200u);
}

TEST(ProxyBasic, KeepAliveServesThreeRequestsOnOneConnection) {
  replica_server a(replica_named("SERVE_REPLICA::app#A#1"));
  proxy p(test_config());
  p.set_topology(topology_builder().app("app", "/", {target_of(a)}));

  auto c = connection::open(loopback, p.port());
  ASSERT_TRUE(c.connected()) << c.error();
  for (int i = 0; i < 3; ++i) {
    const std::string target = "/req/" + std::to_string(i);
    ASSERT_TRUE(c.write(get_req(p, target))) << c.error();
    auto r = c.read_response(5s);
    ASSERT_TRUE(r.complete) << "request " << i << ": " << r.error;
    EXPECT_EQ(r.status, 200u);
    EXPECT_TRUE(r.keep_alive()) << "request " << i;
    EXPECT_EQ(echoed_target(r), target);
  }
  // Still open: one more request on it is answered (a short wait for a close would pass a slow bug).
  ASSERT_TRUE(c.write(get_req(p, "/req/3"))) << c.error();
  EXPECT_EQ(c.read_response(5s).status, 200u) << "the client connection must stay open after keep-alive responses";
  EXPECT_EQ(a.request_count(), 4u);
}

TEST(ProxyBasic, PipelinedRequestsAreAnsweredInOrder) {
  replica_server a(replica_named("SERVE_REPLICA::app#A#1"));
  proxy p(test_config());
  p.set_topology(topology_builder().app("app", "/", {target_of(a)}));

  auto c = connection::open(loopback, p.port());
  ASSERT_TRUE(c.connected()) << c.error();
  // Requests 2 and 3 carry bodies (a GET body is legal, hardening D11) so that the boundaries
  // between pipelined requests are exercised.
  std::string all = get_req(p, "/first") +
                    format_request("POST", "/second", loopback, p.port(), {{"Content-Type", "text/plain"}}, "0123456789") +
                    format_request("GET", "/third", loopback, p.port(), {}, "GET-BODY");
  ASSERT_TRUE(c.write(all)) << c.error();
  const std::vector<std::string> expected = {"/first", "/second", "/third"};
  for (std::size_t i = 0; i < expected.size(); ++i) {
    auto r = c.read_response(5s);
    ASSERT_TRUE(r.complete) << "response " << i << ": " << r.error;
    EXPECT_EQ(r.status, 200u);
    EXPECT_EQ(echoed_target(r), expected[i]) << "response " << i << " out of order";
  }
  auto rec = a.requests();
  ASSERT_EQ(rec.size(), 3u);
  EXPECT_EQ(rec[1].body, "0123456789");
  EXPECT_EQ(rec[2].body, "GET-BODY");
}

// --- 2. Route matching ------------------------------------------------------------------------

TEST(ProxyBasic, LongestMatchingPrefixWins) {
  replica_server root(replica_named("SERVE_REPLICA::root#R#1"));
  replica_server api(replica_named("SERVE_REPLICA::api#A#1"));
  proxy p(test_config());
  p.set_topology(topology_builder().app("root", "/", {target_of(root)}).app("api", "/api", {target_of(api)}));

  struct probe {
    std::string path;
    const replica_server* expect;
  };
  for (const auto& [path, expect] : std::vector<probe>{{"/api/x", &api},
                                                       {"/api", &api},
                                                       {"/api/", &api},
                                                       {"/api?q=1", &api},
                                                       {"/apix", &root},
                                                       {"/", &root},
                                                       {"/other/api", &root}}) {
    auto r = http_get(loopback, p.port(), path);
    ASSERT_TRUE(r.complete) << path << ": " << r.error;
    EXPECT_EQ(r.status, 200u) << path;
    EXPECT_EQ(served_by(r), expect->name()) << path;
    EXPECT_EQ(echoed_target(r), path) << "the path must reach the replica unchanged";
  }
}

TEST(ProxyBasic, NoMatchingRouteIs404NoRoute) {
  replica_server api(replica_named("SERVE_REPLICA::api#A#1"));
  proxy p(test_config());
  p.set_topology(topology_builder().app("api", "/api", {target_of(api)}));

  for (const std::string path : {"/", "/apix", "/other", "/ap"}) {
    auto r = http_get(loopback, p.port(), path);
    ASSERT_TRUE(r.complete) << path << ": " << r.error;
    EXPECT_EQ(r.status, 404u) << path;
    EXPECT_EQ(r.header("x-serve-reason").value_or(""), "no_route") << path;
  }
  auto ok = http_get(loopback, p.port(), "/api/v1");
  ASSERT_TRUE(ok.complete) << ok.error;
  EXPECT_EQ(ok.status, 200u);
  EXPECT_EQ(api.request_count(), 1u) << "a 404 must not reach any replica";

  // A 404 for a bodiless request leaves the connection usable.
  auto c = connection::open(loopback, p.port());
  ASSERT_TRUE(c.connected()) << c.error();
  ASSERT_TRUE(c.write(get_req(p, "/nope") + get_req(p, "/api/after-404")));
  auto miss = c.read_response(5s);
  ASSERT_TRUE(miss.complete) << miss.error;
  EXPECT_EQ(miss.status, 404u);
  EXPECT_TRUE(miss.keep_alive()) << "a 404 with nothing left unread must not close the connection";
  auto hit = c.read_response(5s);
  ASSERT_TRUE(hit.complete) << hit.error;
  EXPECT_EQ(hit.status, 200u);
  EXPECT_EQ(echoed_target(hit), "/api/after-404");
  EXPECT_EQ(api.request_count(), 2u);
}

TEST(ProxyBasic, RootPathIsStrippedBeforeMatchingAndForwarding) {
  replica_server root(replica_named("SERVE_REPLICA::root#R#1"));
  replica_server api(replica_named("SERVE_REPLICA::api#A#1"));
  auto cfg = test_config();
  cfg.root_path = "/root";
  proxy p(cfg);
  p.set_topology(topology_builder().app("root", "/", {target_of(root)}).app("api", "/api", {target_of(api)}));

  auto r = http_get(loopback, p.port(), "/root/api/x?q=1");
  ASSERT_TRUE(r.complete) << r.error;
  EXPECT_EQ(r.status, 200u);
  EXPECT_EQ(served_by(r), api.name());
  EXPECT_EQ(echoed_target(r), "/api/x?q=1") << "the replica must see the path without root_path";

  r = http_get(loopback, p.port(), "/root/other");
  ASSERT_TRUE(r.complete) << r.error;
  EXPECT_EQ(served_by(r), root.name());
  EXPECT_EQ(echoed_target(r), "/other");

  // Outside root_path: no route, even though "/" would match everything after stripping.
  for (const std::string path : {"/api/x", "/other", "/rootx/api"}) {
    auto miss = http_get(loopback, p.port(), path);
    ASSERT_TRUE(miss.complete) << path << ": " << miss.error;
    EXPECT_EQ(miss.status, 404u) << path;
    EXPECT_EQ(miss.header("x-serve-reason").value_or(""), "no_route") << path;
  }
  EXPECT_EQ(root.request_count() + api.request_count(), 2u);
}

// --- 3. Least-loaded --------------------------------------------------------------------------

TEST(ProxyBasic, LeastLoadedAvoidsReplicaHoldingAStream) {
  replica_server a(replica_named("SERVE_REPLICA::app#A#1", 100ms, 60));  // a stream lasts ~6 s
  replica_server b(replica_named("SERVE_REPLICA::app#B#1", 100ms, 60));
  proxy p(test_config(1));
  p.set_topology(topology_builder().app("app", "/", {target_of(a), target_of(b)}));

  auto stream = connection::open(loopback, p.port());
  ASSERT_TRUE(stream.connected()) << stream.error();
  ASSERT_TRUE(stream.write(format_request("POST", "/v1/chat/completions", loopback, p.port(),
                                          {{"Content-Type", "application/json"}},
                                          R"({"stream":true,"messages":[]})")));
  // The replica has the request: the proxy counts it in flight there until the stream ends.
  const auto deadline = std::chrono::steady_clock::now() + 5s;
  while (!a.wait_for_requests(1, 10ms) && !b.wait_for_requests(1, 10ms))
    ASSERT_LT(std::chrono::steady_clock::now(), deadline) << "the stream request reached no replica";
  const bool on_a = a.request_count() == 1;
  const replica_server& busy = on_a ? a : b;
  const replica_server& idle = on_a ? b : a;
  ASSERT_EQ(busy.request_count(), 1u);
  ASSERT_EQ(idle.request_count(), 0u);

  for (int i = 0; i < 4; ++i) {
    auto r = http_get(loopback, p.port(), "/x/" + std::to_string(i));
    ASSERT_TRUE(r.complete) << r.error;
    EXPECT_EQ(served_by(r), idle.name()) << "request " << i << " went to the replica busy with a stream";
  }
  EXPECT_EQ(busy.request_count(), 1u);

  // Once the stream is gone, its replica's in-flight count is released and it gets work again.
  stream.close();
  ASSERT_TRUE(busy.wait_for_aborted_responses(1, 3s));
  for (int i = 0; i < 4; ++i) {
    auto r = http_get(loopback, p.port(), "/y/" + std::to_string(i));
    ASSERT_TRUE(r.complete) << r.error;
  }
  EXPECT_GE(busy.request_count(), 2u) << "the aborted stream still counts as in flight";
}

// --- 4. Connect retry, no replicas, fallback ----------------------------------------------------

TEST(ProxyBasic, ConnectFailureIsRetriedOnAnotherReplica) {
  replica_server live(replica_named("SERVE_REPLICA::app#live#1"));
  proxy p(test_config(1));
  p.set_topology(topology_builder().app("app", "/", {make_target(dead_port(), "SERVE_REPLICA::app#dead#1"), target_of(live)}));

  // Ties rotate between replicas, so several of these try the dead one first.
  for (int i = 0; i < 6; ++i) {
    auto r = http_post(loopback, p.port(), "/v1/x", {{"Content-Type", "text/plain"}}, "payload-" + std::to_string(i));
    ASSERT_TRUE(r.complete) << r.error;
    EXPECT_EQ(r.status, 200u) << r.body;
    EXPECT_EQ(served_by(r), live.name());
  }
  auto rec = live.requests();
  ASSERT_EQ(rec.size(), 6u);
  for (int i = 0; i < 6; ++i) EXPECT_EQ(rec[i].body, "payload-" + std::to_string(i)) << "each request exactly once";
}

TEST(ProxyBasic, PooledConnectionClosedByRestartedReplicaIsNotReused) {
  auto a = std::make_unique<replica_server>(replica_named("SERVE_REPLICA::app#A#1"));
  const auto port = a->port();
  proxy p(test_config(1));
  p.set_topology(topology_builder().app("app", "/", {target_of(*a)}));

  auto first = http_get(loopback, p.port(), "/before");
  ASSERT_TRUE(first.complete) << first.error;
  ASSERT_EQ(first.status, 200u);
  // The replica restarts on the same port: the proxy's pooled keep-alive connection is dead.
  a->stop();
  a.reset();
  replica_server again({.name = "SERVE_REPLICA::app#A#1", .bind_ip = loopback, .port = port});
  auto second = http_post(loopback, p.port(), "/after", {}, "not-idempotent");
  ASSERT_TRUE(second.complete) << second.error;
  EXPECT_EQ(second.status, 200u) << "a stale pooled connection must not fail the request: " << second.body;
  EXPECT_EQ(again.request_count(), 1u);
}

TEST(ProxyBasic, GetOnAPooledConnectionTheRestartedReplicaClosedIsSentAgainOnAFreshOne) {
  // A GET takes its pooled connection without the liveness peek: the dead connection fails
  // before any response byte and the request goes once more on a fresh connection.
  auto a = std::make_unique<replica_server>(replica_named("SERVE_REPLICA::app#A#1"));
  const auto port = a->port();
  proxy p(test_config(1));
  p.set_topology(topology_builder().app("app", "/", {target_of(*a)}));

  ASSERT_EQ(http_get(loopback, p.port(), "/before").status, 200u);
  a->stop();
  a.reset();
  replica_server again({.name = "SERVE_REPLICA::app#A#1", .bind_ip = loopback, .port = port});
  auto second = http_get(loopback, p.port(), "/after");
  ASSERT_TRUE(second.complete) << second.error;
  EXPECT_EQ(second.status, 200u) << second.body;
  ASSERT_EQ(again.request_count(), 1u);
  EXPECT_EQ(again.requests()[0].target, "/after");
}

TEST(ProxyBasic, GetIsSentAgainOnlyOnceAndOnlyAfterAReusedConnectionFails) {
  replica_server r(replica_named("SERVE_REPLICA::app#A#1"));
  proxy p(test_config(1));
  p.set_topology(topology_builder().app("app", "/", {target_of(r)}));
  ASSERT_EQ(http_get(loopback, p.port(), "/warm").status, 200u);  // pools a connection

  // The pooled connection is closed after the request arrived, with no response byte: sent again
  // on a fresh connection, which answers.
  r.queue_behaviour(replica_behaviour::close_before_headers());
  auto once = http_get(loopback, p.port(), "/again");
  ASSERT_TRUE(once.complete) << once.error;
  EXPECT_EQ(once.status, 200u) << once.body;
  auto rec = r.requests();
  ASSERT_EQ(rec.size(), 3u);
  EXPECT_EQ(rec[1].target, "/again");
  EXPECT_EQ(rec[2].target, "/again");
  EXPECT_NE(rec[2].connection_id, rec[1].connection_id);

  // The fresh connection fails the same way: no second resend, 502.
  r.queue_behaviour(replica_behaviour::close_before_headers());
  r.queue_behaviour(replica_behaviour::close_before_headers());
  auto twice = http_get(loopback, p.port(), "/gone");
  ASSERT_TRUE(twice.complete) << twice.error;
  EXPECT_EQ(twice.status, 502u);
  EXPECT_EQ(twice.header("x-serve-reason").value_or(""), "upstream_error");
  EXPECT_EQ(r.request_count(), 5u);

  // A POST is never sent twice (not idempotent), even without a body.
  ASSERT_EQ(http_get(loopback, p.port(), "/warm-again").status, 200u);
  r.queue_behaviour(replica_behaviour::close_before_headers());
  auto post = http_post(loopback, p.port(), "/post", {}, "");
  ASSERT_TRUE(post.complete) << post.error;
  EXPECT_EQ(post.status, 502u);
  EXPECT_EQ(r.request_count(), 7u);
}

TEST(ProxyBasic, AllReplicasDeadIs502UpstreamError) {
  proxy p(test_config());
  p.set_topology(topology_builder().app("app", "/", {make_target(dead_port(), "SERVE_REPLICA::app#d#1"),
                                                      make_target(dead_port(), "SERVE_REPLICA::app#d#2")}));
  auto r = http_get(loopback, p.port(), "/x");
  ASSERT_TRUE(r.complete) << r.error;
  EXPECT_EQ(r.status, 502u);
  EXPECT_EQ(r.header("x-serve-reason").value_or(""), "upstream_error");
}

TEST(ProxyBasic, AppWithoutReplicasIs503NoHealthyReplica) {
  replica_server other(replica_named("SERVE_REPLICA::other#O#1"));
  proxy p(test_config());
  p.set_topology(topology_builder().app("empty", "/empty", {}).app("other", "/", {target_of(other)}));
  auto r = http_get(loopback, p.port(), "/empty/x");
  ASSERT_TRUE(r.complete) << r.error;
  EXPECT_EQ(r.status, 503u);
  EXPECT_EQ(r.header("x-serve-reason").value_or(""), "no_healthy_replica");
  EXPECT_EQ(other.request_count(), 0u);
}

TEST(ProxyBasic, FallbackTargetServesAppWithoutReplicas) {
  replica_server fallback(replica_named("SERVE_REPLICA::head#proxy#1"));
  proxy p(test_config());
  p.set_topology(topology_builder().app("empty", "/", {}).fallback(target_of(fallback)));
  auto r = http_get(loopback, p.port(), "/v1/models");
  ASSERT_TRUE(r.complete) << r.error;
  EXPECT_EQ(r.status, 200u);
  EXPECT_EQ(served_by(r), fallback.name());
  EXPECT_EQ(echoed_target(r), "/v1/models");
}

// --- 5. Forwarding rules (§4.4) -----------------------------------------------------------------

TEST(ProxyBasic, RequestHopByHopHeadersAreRemoved) {
  replica_server a(replica_named("SERVE_REPLICA::app#A#1"));
  proxy p(test_config());
  p.set_topology(topology_builder().app("app", "/", {target_of(a)}));

  auto r = http_get(loopback, p.port(), "/x",
                    {{"Connection", "close, X-Secret"},
                     {"X-Secret", "do-not-forward"},
                     {"Keep-Alive", "timeout=5"},
                     {"TE", "trailers, gzip"},
                     {"Upgrade", "h2c"},
                     {"Proxy-Connection", "keep-alive"},
                     {"Proxy-Authorization", "Basic c2VjcmV0"},
                     {"HTTP2-Settings", "AAMAAABkAARAAAAAAAIAAAAA"},
                     {"X-Kept", "yes"}});
  ASSERT_TRUE(r.complete) << r.error;
  EXPECT_EQ(r.status, 200u);
  EXPECT_FALSE(r.keep_alive()) << "the client asked to close";

  auto rec = a.requests();
  ASSERT_EQ(rec.size(), 1u);
  for (const std::string name :
       {"X-Secret", "Keep-Alive", "TE", "Upgrade", "Proxy-Connection", "Proxy-Authorization", "HTTP2-Settings"})
    EXPECT_EQ(rec[0].header_count(name), 0u) << name << " reached the replica";
  const auto conn = rec[0].header("connection").value_or("");
  EXPECT_EQ(conn.find("X-Secret"), std::string::npos) << "Connection: " << conn;
  EXPECT_EQ(conn.find("close"), std::string::npos)
      << "the client's Connection: close is hop-by-hop; it must not end the pooled upstream connection";
  EXPECT_EQ(rec[0].header("x-kept").value_or(""), "yes");
}

TEST(ProxyBasic, ResponseHopByHopHeadersAreRemoved) {
  replica_server a(replica_named("SERVE_REPLICA::app#A#1"));
  a.set_behaviour(replica_behaviour::respond(200,
                                             {{"Content-Type", "text/plain"},
                                              {"Connection", "X-Hop"},
                                              {"X-Hop", "secret"},
                                              {"Keep-Alive", "timeout=5, max=100"},
                                              {"Upgrade", "h2c"},
                                              {"Proxy-Connection", "keep-alive"},
                                              {"TE", "trailers"},
                                              {"X-End", "ok"}},
                                             "hello"));
  proxy p(test_config());
  p.set_topology(topology_builder().app("app", "/", {target_of(a)}));

  auto c = connection::open(loopback, p.port());
  ASSERT_TRUE(c.connected()) << c.error();
  ASSERT_TRUE(c.write(get_req(p, "/x")));
  auto r = c.read_response(5s);
  ASSERT_TRUE(r.complete) << r.error;
  EXPECT_EQ(r.status, 200u);
  EXPECT_EQ(r.body, "hello");
  for (const std::string name : {"X-Hop", "Keep-Alive", "Upgrade", "Proxy-Connection", "TE"})
    EXPECT_EQ(r.header_count(name), 0u) << name << " reached the client";
  EXPECT_EQ(r.header("connection").value_or("").find("X-Hop"), std::string::npos);
  EXPECT_EQ(r.header("x-end").value_or(""), "ok");
  EXPECT_EQ(r.header_count("content-length"), 1u);
  EXPECT_TRUE(r.keep_alive());
}

TEST(ProxyBasic, UpstreamConnectionCloseDoesNotCloseTheClientConnection) {
  replica_server a(replica_named("SERVE_REPLICA::app#A#1"));
  a.queue_behaviour(replica_behaviour::respond(200, {{"Connection", "close"}}, "bye"));
  proxy p(test_config());
  p.set_topology(topology_builder().app("app", "/", {target_of(a)}));

  auto c = connection::open(loopback, p.port());
  ASSERT_TRUE(c.connected()) << c.error();
  ASSERT_TRUE(c.write(get_req(p, "/one")));
  auto r = c.read_response(5s);
  ASSERT_TRUE(r.complete) << r.error;
  EXPECT_EQ(r.body, "bye");
  EXPECT_TRUE(r.keep_alive()) << "Connection: close from the replica concerns only the upstream hop";
  ASSERT_TRUE(c.write(get_req(p, "/two")));
  r = c.read_response(5s);
  ASSERT_TRUE(r.complete) << r.error;
  EXPECT_EQ(echoed_target(r), "/two");
}

TEST(ProxyBasic, RepeatedEndToEndHeadersKeepTheirOrderBothWays) {
  replica_server a(replica_named("SERVE_REPLICA::app#A#1"));
  a.set_behaviour(replica_behaviour::respond(200, {{"Set-Cookie", "a=1"}, {"X-Mid", "m"}, {"Set-Cookie", "b=2"}}, "ok"));
  proxy p(test_config());
  p.set_topology(topology_builder().app("app", "/", {target_of(a)}));

  auto r = http_get(loopback, p.port(), "/x", {{"X-Multi", "one"}, {"Accept", "*/*"}, {"X-Multi", "two"}});
  ASSERT_TRUE(r.complete) << r.error;
  std::vector<std::string> cookies;
  for (const auto& [n, v] : r.headers)
    if (n == "Set-Cookie" || n == "set-cookie") cookies.push_back(v);
  EXPECT_EQ(cookies, (std::vector<std::string>{"a=1", "b=2"}));

  auto rec = a.requests();
  ASSERT_EQ(rec.size(), 1u);
  std::vector<std::string> multi;
  for (const auto& [n, v] : rec[0].headers)
    if (n == "X-Multi" || n == "x-multi") multi.push_back(v);
  EXPECT_EQ(multi, (std::vector<std::string>{"one", "two"}));
}

TEST(ProxyBasic, ChunkedResponseIsReframed) {
  replica_server a(replica_named("SERVE_REPLICA::app#A#1"));
  a.set_behaviour(replica_behaviour::respond(
      200, {{"Content-Type", "text/plain"}, {"Transfer-Encoding", "chunked"}},
      "5;ext=upstream-secret\r\nhello\r\n6\r\n world\r\n0\r\nX-Trailer: t\r\n\r\n"));
  proxy p(test_config());
  p.set_topology(topology_builder().app("app", "/", {target_of(a)}));

  auto c = connection::open(loopback, p.port());
  ASSERT_TRUE(c.connected()) << c.error();
  ASSERT_TRUE(c.write(get_req(p, "/x", {{"Connection", "close"}})));
  auto raw = c.read_until_close(5s);
  ASSERT_TRUE(raw.closed) << raw.bytes;
  EXPECT_EQ(raw.bytes.find("ext=upstream-secret"), std::string::npos) << "upstream chunk extensions passed through";
  EXPECT_EQ(raw.bytes.find("X-Trailer"), std::string::npos) << "upstream trailers passed through";
  // The body itself arrives intact on a parsing client.
  auto r = http_get(loopback, p.port(), "/y");
  ASSERT_TRUE(r.complete) << r.error;
  EXPECT_EQ(r.body, "hello world");
}

TEST(ProxyBasic, BytesAfterTheUpstreamResponseNeverReachTheNextRequest) {
  replica_server a(replica_named("SERVE_REPLICA::app#A#1"));
  // Content-Length 5, then what looks like a second response (response splitting, hardening A15).
  a.queue_behaviour(replica_behaviour::respond(
      200, {{"Content-Length", "5"}},
      "helloHTTP/1.1 200 OK\r\nContent-Length: 8\r\nx-served-by: smuggled\r\n\r\nsmuggled"));
  a.queue_behaviour(replica_behaviour::normal());
  // A 204 that (wrongly) carries body bytes (hardening F4).
  a.queue_behaviour(replica_behaviour::respond(204, {}, "HTTP/1.1 200 OK\r\nContent-Length: 4\r\n\r\njunk"));
  proxy p(test_config(1));
  p.set_topology(topology_builder().app("app", "/", {target_of(a)}));

  auto c = connection::open(loopback, p.port());
  ASSERT_TRUE(c.connected()) << c.error();
  const std::vector<std::string> targets = {"/split", "/after-split", "/no-content", "/after-no-content"};
  for (const auto& target : targets) {
    ASSERT_TRUE(c.write(get_req(p, target)));
    auto r = c.read_response(5s);
    ASSERT_TRUE(r.complete) << target << ": " << r.error;
    if (target == "/split") {
      EXPECT_EQ(r.body, "hello");
    } else if (target == "/no-content") {
      EXPECT_EQ(r.status, 204u);
      EXPECT_TRUE(r.body.empty());
    } else {
      EXPECT_EQ(r.status, 200u) << target;
      EXPECT_EQ(served_by(r), a.name()) << target << ": a leftover upstream byte was taken as the response";
      EXPECT_EQ(echoed_target(r), target);
    }
    if (!r.keep_alive()) break;
  }
  // Still open: one more request on it is answered.
  ASSERT_TRUE(c.write(get_req(p, "/after"))) << c.error();
  EXPECT_EQ(c.read_response(5s).status, 200u);
  EXPECT_EQ(a.request_count(), 5u);
}

TEST(ProxyBasic, ForwardedHeadersReplaceClientValues) {
  replica_server a(replica_named("SERVE_REPLICA::app#A#1"));
  proxy p(test_config());
  p.set_topology(topology_builder().app("app", "/", {target_of(a)}));

  auto r = http_get(loopback, p.port(), "/x",
                    {{"X-Forwarded-For", "6.6.6.6"}, {"X-Forwarded-Proto", "https"}, {"x-forwarded-for", "7.7.7.7, 8.8.8.8"}});
  ASSERT_TRUE(r.complete) << r.error;
  auto rec = a.requests();
  ASSERT_EQ(rec.size(), 1u);
  EXPECT_EQ(rec[0].header_count("x-forwarded-for"), 1u);
  EXPECT_EQ(rec[0].header("x-forwarded-for").value_or(""), "127.0.0.1");
  EXPECT_EQ(rec[0].header_count("x-forwarded-proto"), 1u);
  EXPECT_EQ(rec[0].header("x-forwarded-proto").value_or(""), "http");
}

TEST(ProxyBasic, RequestIdIsGeneratedWhenAbsentAndKeptWhenSent) {
  replica_server a(replica_named("SERVE_REPLICA::app#A#1"));
  proxy p(test_config());
  p.set_topology(topology_builder().app("app", "/", {target_of(a)}));

  ASSERT_TRUE(http_get(loopback, p.port(), "/gen1").complete);
  ASSERT_TRUE(http_get(loopback, p.port(), "/gen2").complete);
  ASSERT_TRUE(http_get(loopback, p.port(), "/kept", {{"X-Request-Id", "client-id-42"}}).complete);
  auto rec = a.requests();
  ASSERT_EQ(rec.size(), 3u);
  const std::regex uuid("^[0-9a-fA-F]{8}-[0-9a-fA-F]{4}-[0-9a-fA-F]{4}-[0-9a-fA-F]{4}-[0-9a-fA-F]{12}$");
  for (int i = 0; i < 2; ++i) {
    EXPECT_EQ(rec[i].header_count("x-request-id"), 1u);
    const auto id = rec[i].header("x-request-id").value_or("");
    EXPECT_TRUE(std::regex_match(id, uuid)) << "not UUID-shaped: '" << id << "'";
  }
  EXPECT_NE(rec[0].header("x-request-id"), rec[1].header("x-request-id")) << "ids must differ per request";
  EXPECT_EQ(rec[2].header_count("x-request-id"), 1u);
  EXPECT_EQ(rec[2].header("x-request-id").value_or(""), "client-id-42");
}

TEST(ProxyBasic, ExpectContinueIsAnsweredByIngressd) {
  replica_server a(replica_named("SERVE_REPLICA::app#A#1"));
  proxy p(test_config());
  p.set_topology(topology_builder().app("app", "/", {target_of(a)}));

  const std::string body = R"({"prompt":"hello"})";
  auto c = connection::open(loopback, p.port());
  ASSERT_TRUE(c.connected()) << c.error();
  const auto req = format_request("POST", "/v1/completions", loopback, p.port(),
                                  {{"Content-Type", "application/json"}, {"Expect", "100-continue"}}, body);
  // The head alone: a client that honours Expect waits for 100 before sending the body.
  ASSERT_TRUE(c.write(req.substr(0, req.size() - body.size())));
  auto interim = c.read_response(5s);
  ASSERT_TRUE(interim.complete) << interim.error;
  EXPECT_EQ(interim.status, 100u);
  ASSERT_TRUE(c.write(body));
  auto r = c.read_response(5s);
  ASSERT_TRUE(r.complete) << r.error;
  EXPECT_EQ(r.status, 200u);

  auto rec = a.requests();
  ASSERT_EQ(rec.size(), 1u);
  EXPECT_EQ(rec[0].header_count("expect"), 0u) << "Expect is ingressd's to answer, not the replica's";
  EXPECT_EQ(rec[0].body, body);
}

TEST(ProxyBasic, ChunkedRequestBodyIsReframedAndDeliveredIntact) {
  replica_server a(replica_named("SERVE_REPLICA::app#A#1"));
  proxy p(test_config());
  p.set_topology(topology_builder().app("app", "/", {target_of(a)}));

  std::string big(40000, 'x');
  for (std::size_t i = 0; i < big.size(); ++i) big[i] = static_cast<char>('a' + i % 26);
  const std::string raw = "POST /upload HTTP/1.1\r\nHost: x\r\nTransfer-Encoding: chunked\r\n\r\n"
                          "6;ext=secret\r\nhello \r\n"
                          "5\r\nworld\r\n" +
                          [&] {
                            char size[16];
                            std::snprintf(size, sizeof size, "%zx", big.size());
                            return std::string(size);
                          }() +
                          "\r\n" + big + "\r\n0\r\n\r\n";
  auto c = testing::send_raw(loopback, p.port(), raw);
  ASSERT_TRUE(c.connected()) << c.error();
  auto r = c.read_response(5s);
  ASSERT_TRUE(r.complete) << r.error;
  EXPECT_EQ(r.status, 200u);

  auto rec = a.requests();
  ASSERT_EQ(rec.size(), 1u);
  EXPECT_EQ(rec[0].body, "hello world" + big);
  // Re-framed: exactly one framing header, and nothing of the client's chunk extensions.
  EXPECT_EQ(rec[0].header_count("content-length") + rec[0].header_count("transfer-encoding"), 1u);
  EXPECT_EQ(rec[0].raw.find("ext=secret"), std::string::npos) << "chunk extensions must not be passed through";
}

TEST(ProxyBasic, ContentLengthBodyIsDeliveredIntact) {
  replica_server a(replica_named("SERVE_REPLICA::app#A#1"));
  proxy p(test_config());
  p.set_topology(topology_builder().app("app", "/", {target_of(a)}));

  std::string body(200000, '\0');
  for (std::size_t i = 0; i < body.size(); ++i) body[i] = static_cast<char>((i * 7919) % 251);
  auto r = http_post(loopback, p.port(), "/upload", {{"Content-Type", "application/octet-stream"}}, body);
  ASSERT_TRUE(r.complete) << r.error;
  EXPECT_EQ(r.status, 200u);
  auto rec = a.requests();
  ASSERT_EQ(rec.size(), 1u);
  EXPECT_EQ(rec[0].header("content-length").value_or(""), std::to_string(body.size()));
  EXPECT_EQ(rec[0].header_count("transfer-encoding"), 0u);
  EXPECT_TRUE(rec[0].body == body) << "body differs (" << rec[0].body.size() << " of " << body.size() << " bytes)";
}

TEST(ProxyBasic, HeadGetsNoBodyAndConnectionStaysUsable) {
  replica_server a(replica_named("SERVE_REPLICA::app#A#1"));
  proxy p(test_config());
  p.set_topology(topology_builder().app("app", "/", {target_of(a)}));

  auto c = connection::open(loopback, p.port());
  ASSERT_TRUE(c.connected()) << c.error();
  for (int i = 0; i < 2; ++i) {
    ASSERT_TRUE(c.write(format_request("HEAD", "/h", loopback, p.port(), {}, {})));
    auto h = c.read_response(5s, /*head_request=*/true);
    ASSERT_TRUE(h.complete) << h.error;
    EXPECT_EQ(h.status, 200u);
    EXPECT_TRUE(h.body.empty());
    EXPECT_TRUE(h.keep_alive());
  }
  // Had any body bytes followed the HEAD responses, they would corrupt this one.
  ASSERT_TRUE(c.write(get_req(p, "/after-head")));
  auto g = c.read_response(5s);
  ASSERT_TRUE(g.complete) << g.error;
  EXPECT_EQ(g.status, 200u);
  EXPECT_EQ(echoed_target(g), "/after-head");
  EXPECT_EQ(a.request_count(), 3u);
}

TEST(ProxyBasic, NoContentAndNotModifiedPassWithoutBody) {
  replica_server a(replica_named("SERVE_REPLICA::app#A#1"));
  a.queue_behaviour(replica_behaviour::respond(204, {{"X-Which", "204"}}, ""));
  a.queue_behaviour(replica_behaviour::respond(304, {{"X-Which", "304"}, {"ETag", "\"v1\""}}, ""));
  proxy p(test_config());
  p.set_topology(topology_builder().app("app", "/", {target_of(a)}));

  auto c = connection::open(loopback, p.port());
  ASSERT_TRUE(c.connected()) << c.error();
  for (const unsigned status : {204u, 304u}) {
    ASSERT_TRUE(c.write(get_req(p, "/s")));
    auto r = c.read_response(5s);
    ASSERT_TRUE(r.complete) << status << ": " << r.error;
    EXPECT_EQ(r.status, status);
    EXPECT_EQ(r.header("x-which").value_or(""), std::to_string(status));
    EXPECT_TRUE(r.body.empty());
    EXPECT_EQ(r.header_count("transfer-encoding"), 0u) << status;
    EXPECT_TRUE(r.keep_alive()) << status;
  }
  EXPECT_EQ(a.request_count(), 2u);
  ASSERT_TRUE(c.write(get_req(p, "/after")));
  auto r = c.read_response(5s);
  ASSERT_TRUE(r.complete) << r.error;
  EXPECT_EQ(r.status, 200u);
  EXPECT_EQ(echoed_target(r), "/after");
}

TEST(ProxyBasic, LargeResponseBodyIsRelayedIntact) {
  std::string big(1 << 20, '\0');
  for (std::size_t i = 0; i < big.size(); ++i) big[i] = static_cast<char>((i * 31 + 7) % 253);
  replica_server a(replica_named("SERVE_REPLICA::app#A#1"));
  a.set_behaviour(replica_behaviour::respond(200, {{"Content-Type", "application/octet-stream"}}, big));
  proxy p(test_config());
  p.set_topology(topology_builder().app("app", "/", {target_of(a)}));

  auto c = connection::open(loopback, p.port());
  ASSERT_TRUE(c.connected()) << c.error();
  for (int i = 0; i < 2; ++i) {
    ASSERT_TRUE(c.write(get_req(p, "/big")));
    auto r = c.read_response(10s);
    ASSERT_TRUE(r.complete) << r.error;
    EXPECT_EQ(r.header("content-length").value_or(""), std::to_string(big.size()));
    EXPECT_TRUE(r.body == big) << "body differs (" << r.body.size() << " of " << big.size() << " bytes)";
  }
}

TEST(ProxyBasic, Http10ClientKeepAliveOnlyWhenAsked) {
  replica_server a(replica_named("SERVE_REPLICA::app#A#1"));
  proxy p(test_config());
  p.set_topology(topology_builder().app("app", "/", {target_of(a)}));

  auto c = connection::open(loopback, p.port());
  ASSERT_TRUE(c.connected()) << c.error();
  ASSERT_TRUE(c.write("GET /one HTTP/1.0\r\nHost: x\r\nConnection: keep-alive\r\n\r\n"));
  auto r = c.read_response(5s);
  ASSERT_TRUE(r.complete) << r.error;
  EXPECT_EQ(echoed_target(r), "/one");
  EXPECT_TRUE(r.keep_alive()) << "an HTTP/1.0 keep-alive request with a sized response stays open";
  ASSERT_TRUE(c.write("GET /two HTTP/1.0\r\nHost: x\r\n\r\n"));
  r = c.read_response(5s);
  ASSERT_TRUE(r.complete) << r.error;
  EXPECT_EQ(echoed_target(r), "/two");
  EXPECT_FALSE(r.keep_alive());
  EXPECT_TRUE(c.is_closed(1s)) << "HTTP/1.0 without keep-alive closes after the response";
}

TEST(ProxyBasic, InterimResponsesAreForwardedToHttp11ClientsOnly) {
  replica_server a(replica_named("SERVE_REPLICA::app#A#1"));
  // A 103 Early Hints head, then the final response (the fake writes the body bytes verbatim
  // after a bodiless 1xx head).
  const auto early_then_final = replica_behaviour::respond(
      103, {{"Link", "</style.css>; rel=preload"}}, "HTTP/1.1 200 OK\r\nContent-Length: 5\r\n\r\nfinal");
  a.queue_behaviour(early_then_final);
  a.queue_behaviour(early_then_final);
  proxy p(test_config());
  p.set_topology(topology_builder().app("app", "/", {target_of(a)}));

  auto c = connection::open(loopback, p.port());
  ASSERT_TRUE(c.connected()) << c.error();
  ASSERT_TRUE(c.write(get_req(p, "/hints")));
  auto interim = c.read_response(5s);
  ASSERT_TRUE(interim.complete) << interim.error;
  EXPECT_EQ(interim.status, 103u);
  EXPECT_EQ(interim.header("link").value_or(""), "</style.css>; rel=preload");
  auto final_res = c.read_response(5s);
  ASSERT_TRUE(final_res.complete) << final_res.error;
  EXPECT_EQ(final_res.status, 200u);
  EXPECT_EQ(final_res.body, "final");

  // HTTP/1.0 clients do not understand 1xx: they get the final response only.
  auto c10 = connection::open(loopback, p.port());
  ASSERT_TRUE(c10.connected()) << c10.error();
  ASSERT_TRUE(c10.write("GET /hints HTTP/1.0\r\nHost: x\r\n\r\n"));
  auto r10 = c10.read_response(5s);
  ASSERT_TRUE(r10.complete) << r10.error;
  EXPECT_EQ(r10.status, 200u);
  EXPECT_EQ(r10.body, "final");
}

TEST(ProxyBasic, UnrequestedUpgradeFromReplicaIs502) {
  replica_server a(replica_named("SERVE_REPLICA::app#A#1"));
  a.set_behaviour(replica_behaviour::respond(101, {{"Upgrade", "websocket"}, {"Connection", "Upgrade"}}, ""));
  proxy p(test_config());
  p.set_topology(topology_builder().app("app", "/", {target_of(a)}));
  auto r = http_get(loopback, p.port(), "/ws");
  ASSERT_TRUE(r.complete) << r.error;
  EXPECT_EQ(r.status, 502u);
  EXPECT_EQ(r.header("x-serve-reason").value_or(""), "upstream_error");
}

// --- 8. ingressd's own endpoints (§5) -------------------------------------------------------------

TEST(ProxyBasic, HealthzAndRoutesWithTopology) {
  replica_server a(replica_named("SERVE_REPLICA::app#A#1"));
  replica_server b(replica_named("SERVE_REPLICA::api#B#1"));
  proxy p(test_config());
  p.set_topology(topology_builder().app("app", "/", {target_of(a)}).app("api", "/api", {target_of(b)}));

  auto h = http_get(loopback, p.port(), "/-/healthz");
  ASSERT_TRUE(h.complete) << h.error;
  EXPECT_EQ(h.status, 200u);
  EXPECT_EQ(h.body, "success");

  auto r = http_get(loopback, p.port(), "/-/routes");
  ASSERT_TRUE(r.complete) << r.error;
  EXPECT_EQ(r.status, 200u);
  auto j = nlohmann::json::parse(r.body, nullptr, false);
  EXPECT_EQ(j, nlohmann::json({{"/", "app"}, {"/api", "api"}})) << r.body;
  EXPECT_EQ(a.request_count() + b.request_count(), 0u) << "ingressd answers these itself";
}

TEST(ProxyBasic, HealthzAndRoutesFailBeforeTopology) {
  proxy p(test_config());
  for (const std::string path : {"/-/healthz", "/-/routes"}) {
    auto r = http_get(loopback, p.port(), path);
    ASSERT_TRUE(r.complete) << path << ": " << r.error;
    EXPECT_EQ(r.status, 503u) << path;
  }
}

TEST(ProxyBasic, HealthzFailsWhenNoAppHasAReplica) {
  proxy p(test_config());
  p.set_topology(topology_builder().app("empty", "/", {}));
  auto h = http_get(loopback, p.port(), "/-/healthz");
  ASSERT_TRUE(h.complete) << h.error;
  EXPECT_EQ(h.status, 503u) << h.body;

  // A topology without apps is healthy (nothing to serve, nothing broken).
  p.set_topology(topology_builder());
  h = http_get(loopback, p.port(), "/-/healthz");
  ASSERT_TRUE(h.complete) << h.error;
  EXPECT_EQ(h.status, 200u);
  EXPECT_EQ(h.body, "success");
}

TEST(ProxyBasic, HealthzFailsDuringDrain) {
  replica_server a(replica_named("SERVE_REPLICA::app#A#1"));
  auto cfg = test_config();
  cfg.drain.min_period = 30s;  // the listener keeps accepting for the whole test
  proxy p(cfg);
  p.set_topology(topology_builder().app("app", "/", {target_of(a)}));
  auto before = http_get(loopback, p.port(), "/-/healthz");
  ASSERT_TRUE(before.complete) << before.error;
  ASSERT_EQ(before.status, 200u);

  p.daemon().begin_drain();
  auto h = http_get(loopback, p.port(), "/-/healthz");
  ASSERT_TRUE(h.complete) << h.error;
  EXPECT_EQ(h.status, 503u);
  EXPECT_EQ(h.body, "This node is being drained.");
  // Still accepting and proxying during drain.min_period.
  auto r = http_get(loopback, p.port(), "/x");
  ASSERT_TRUE(r.complete) << r.error;
  EXPECT_EQ(r.status, 200u);
}

// --- 9. Several worker threads ------------------------------------------------------------------

TEST(ProxyBasic, TwoWorkersServeManyRequestsOverSeveralConnections) {
  replica_server a(replica_named("SERVE_REPLICA::app#A#1"));
  replica_server b(replica_named("SERVE_REPLICA::app#B#1"));
  proxy p(test_config(2));
  p.set_topology(topology_builder().app("app", "/", {target_of(a), target_of(b)}));

  constexpr int clients = 8;
  constexpr int per_client = 25;
  std::atomic<int> ok{0};
  std::vector<std::string> failures(clients);
  std::vector<std::thread> threads;
  for (int t = 0; t < clients; ++t) {
    threads.emplace_back([&, t] {
      auto c = connection::open(loopback, p.port());
      if (!c.connected()) {
        failures[t] = "connect: " + c.error();
        return;
      }
      for (int i = 0; i < per_client; ++i) {
        const auto target = "/c" + std::to_string(t) + "/r" + std::to_string(i);
        if (!c.write(get_req(p, target))) {
          failures[t] = "write: " + c.error();
          return;
        }
        auto r = c.read_response(5s);
        if (!r.complete || r.status != 200 || echoed_target(r) != target) {
          failures[t] = target + ": status " + std::to_string(r.status) + " " + r.error;
          return;
        }
        ++ok;
      }
    });
  }
  for (auto& th : threads) th.join();
  for (int t = 0; t < clients; ++t) EXPECT_TRUE(failures[t].empty()) << "client " << t << ": " << failures[t];
  EXPECT_EQ(ok.load(), clients * per_client);
  EXPECT_EQ(a.request_count() + b.request_count(), static_cast<std::size_t>(clients * per_client));
  EXPECT_GT(a.request_count(), 0u);
  EXPECT_GT(b.request_count(), 0u);
}

}  // namespace
}  // namespace ingressd
