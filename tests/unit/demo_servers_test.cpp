// The demo cluster's servers and the test fakes, talking to the test client directly (no proxy).
#include <chrono>
#include <string>
#include <variant>
#include <vector>

#include <gtest/gtest.h>
#include <nlohmann/json.hpp>

#include "fakes/fake_dashboard.hpp"
#include "fakes/http_client.hpp"
#include "ingressd/demo/cluster.hpp"
#include "ingressd/demo/replica_server.hpp"
#include "ingressd/demo/router_server.hpp"
#include "ingressd/topology/topology.hpp"

namespace ingressd {
namespace {

using namespace std::chrono_literals;
using demo::replica_behaviour;
using demo::replica_server;
using demo::router_behaviour;
using demo::router_server;
using testing::http_get;
using testing::http_post;

const std::string loopback = "127.0.0.1";

replica_server::options replica_opts(std::chrono::milliseconds token_delay = 20ms, std::size_t tokens = 8) {
  return {.name = "SERVE_REPLICA::llm#LLMServer#t1", .bind_ip = loopback, .port = 0, .token_delay = token_delay, .tokens = tokens};
}

std::string route_request(const router_server& r, const std::string& extra_headers = "") {
  return "POST /internal/route HTTP/1.1\r\nHost: 127.0.0.1:" + std::to_string(r.port()) +
         "\r\nContent-Type: application/json\r\n" + extra_headers + "Content-Length: 0\r\n\r\n";
}

std::string replica_id_of(const testing::http_response& r) {
  auto j = nlohmann::json::parse(r.body, nullptr, false);
  if (!j.is_object() || !j.contains("replica_id") || !j["replica_id"].is_string()) return "<none>";
  return j["replica_id"].get<std::string>();
}

TEST(DemoServers, ReplicaStreamsSseEventsOneChunkEachSpacedByTokenDelay) {
  replica_server replica(replica_opts(100ms, 4));
  auto r = http_post(loopback, replica.port(), "/v1/chat/completions", {{"Content-Type", "application/json"}},
                     R"({"model":"m","stream":true,"messages":[{"role":"user","content":"hi"}]})");
  ASSERT_TRUE(r.complete) << r.error;
  EXPECT_EQ(r.status, 200u);
  EXPECT_EQ(r.header("content-type").value_or(""), "text/event-stream");
  EXPECT_EQ(r.header("x-served-by").value_or(""), replica.name());
  EXPECT_TRUE(r.chunked);
  ASSERT_EQ(r.events.size(), 5u);  // 4 tokens + [DONE]
  EXPECT_EQ(r.chunks.size(), 5u);  // each event flushed as its own chunk
  EXPECT_EQ(r.events.back().data, "[DONE]");
  auto first = nlohmann::json::parse(r.events[0].data);
  EXPECT_EQ(first["object"], "chat.completion.chunk");
  EXPECT_EQ(first["choices"][0]["delta"]["content"], "Hello");
  // The server waits token_delay between events (4 waits in all); the first event is in the
  // client's hands long before the last one exists.
  EXPECT_GE(r.events.back().at - r.events.front().at, 300ms);
  for (std::size_t i = 1; i < r.events.size(); ++i) EXPECT_LE(r.events[i - 1].at, r.events[i].at);

  auto rec = replica.requests();
  ASSERT_EQ(rec.size(), 1u);
  EXPECT_EQ(rec[0].method, "POST");
  EXPECT_EQ(rec[0].target, "/v1/chat/completions");
}

TEST(DemoServers, ReplicaCompletionsEndpointStreamsTextEvents) {
  replica_server replica(replica_opts(1ms, 3));
  auto r = http_post(loopback, replica.port(), "/v1/completions", {}, R"({"prompt":"x","stream":true})");
  ASSERT_TRUE(r.complete) << r.error;
  ASSERT_EQ(r.events.size(), 4u);
  auto ev = nlohmann::json::parse(r.events[1].data);
  EXPECT_EQ(ev["object"], "text_completion");
  EXPECT_EQ(ev["choices"][0]["text"], " from");
  // Not streamed: one text_completion object with the whole text.
  auto whole = nlohmann::json::parse(
      http_post(loopback, replica.port(), "/v1/completions", {}, R"({"prompt":"x"})").body, nullptr, false);
  EXPECT_EQ(whole["object"], "text_completion");
  EXPECT_EQ(whole["choices"][0]["text"], "Hello from replica") << whole.dump();
  EXPECT_EQ(whole["usage"]["completion_tokens"], 3) << whole.dump();
}

TEST(DemoServers, ReplicaEchoesAndRecordsAndAnswersHealthChecks) {
  replica_server replica(replica_opts());
  auto health = http_get(loopback, replica.port(), "/-/healthz");
  ASSERT_TRUE(health.complete) << health.error;
  EXPECT_EQ(health.status, 200u);
  EXPECT_EQ(health.body, "success");
  replica.set_healthy(false);
  health = http_get(loopback, replica.port(), "/-/healthz");
  EXPECT_EQ(health.status, 503u);
  EXPECT_EQ(health.body, "UNHEALTHY");

  auto r = http_post(loopback, replica.port(), "/v1/chat/completions?x=1",
                     {{"X-B", "2"}, {"x-a", "1"}, {"X-B", "3"}}, R"({"stream":false})");
  ASSERT_TRUE(r.complete) << r.error;
  EXPECT_EQ(r.status, 200u);
  EXPECT_EQ(r.header("x-served-by").value_or(""), replica.name());
  auto echo = nlohmann::json::parse(r.body);
  EXPECT_EQ(echo["replica"], replica.name());
  EXPECT_EQ(echo["method"], "POST");
  EXPECT_EQ(echo["target"], "/v1/chat/completions?x=1");
  EXPECT_EQ(echo["body_bytes"], 16);
  // Issue #29 item 6: a non-streamed completion is an OpenAI object that SDKs can read.
  EXPECT_EQ(echo["object"], "chat.completion");
  ASSERT_TRUE(echo["choices"].is_array() && echo["choices"].size() == 1u) << r.body;
  EXPECT_EQ(echo["choices"][0]["message"]["role"], "assistant");
  EXPECT_TRUE(echo["choices"][0]["message"]["content"].get<std::string>().starts_with("Hello from replica")) << r.body;
  EXPECT_EQ(echo["choices"][0]["finish_reason"], "stop");
  EXPECT_TRUE(echo["id"].is_string() && echo["created"].is_number_integer() && echo["model"].is_string()) << r.body;

  // Health checks are counted apart so a proxy's probes do not disturb request assertions.
  EXPECT_EQ(replica.probe_count(), 2u);
  auto rec = replica.requests();
  ASSERT_EQ(rec.size(), 1u);
  EXPECT_EQ(rec[0].path(), "/v1/chat/completions");
  EXPECT_EQ(rec[0].body, R"({"stream":false})");
  EXPECT_EQ(rec[0].peer_ip, loopback);
  ASSERT_EQ(rec[0].headers.size(), 5u);  // Host, X-B, x-a, X-B, Content-Length — in order
  EXPECT_EQ(rec[0].headers[1], (std::pair<std::string, std::string>{"X-B", "2"}));
  EXPECT_EQ(rec[0].headers[2].first, "x-a");
  EXPECT_EQ(rec[0].headers[3].second, "3");
  EXPECT_EQ(rec[0].header_count("x-b"), 2u);
}

TEST(DemoServers, KeepAliveServesSequentialAndPipelinedRequestsOnOneConnection) {
  replica_server replica(replica_opts());
  auto c = testing::connection::open(loopback, replica.port());
  ASSERT_TRUE(c.connected()) << c.error();
  ASSERT_TRUE(c.write(testing::format_request("GET", "/a", loopback, replica.port(), {}, {})));
  auto first = c.read_response(5s);
  ASSERT_TRUE(first.complete) << first.error;
  ASSERT_TRUE(c.write(testing::format_request("GET", "/b", loopback, replica.port(), {}, {})));
  auto second = c.read_response(5s);
  ASSERT_TRUE(second.complete) << second.error;
  // Two requests in one write: the leftover bytes of the first read are the second request.
  ASSERT_TRUE(c.write(testing::format_request("GET", "/c", loopback, replica.port(), {}, {}) +
                      testing::format_request("POST", "/d", loopback, replica.port(), {}, "xyz")));
  auto third = c.read_response(5s);
  auto fourth = c.read_response(5s);
  ASSERT_TRUE(third.complete && fourth.complete) << third.error << " / " << fourth.error;
  EXPECT_EQ(nlohmann::json::parse(fourth.body)["body_bytes"], 3);

  EXPECT_EQ(replica.connections_accepted(), 1u);
  auto rec = replica.requests();
  ASSERT_EQ(rec.size(), 4u);
  EXPECT_EQ(rec[0].target, "/a");
  EXPECT_EQ(rec[3].target, "/d");
  EXPECT_EQ(rec[0].connection_id, rec[3].connection_id);

  c.close();
  EXPECT_TRUE(replica.wait_for_disconnects(1, 5s));
  EXPECT_EQ(replica.aborted_responses(), 0u);  // closing while idle aborts nothing
}

TEST(DemoServers, RouterRoundRobinsAndRecordsExactRequests) {
  router_server router({.name = "SERVE_REPLICA::llm#LLMRouter#t", .bind_ip = loopback, .port = 0});
  router.set_replicas(std::vector<std::string>{"a", "b", "c"});
  auto c = testing::connection::open(loopback, router.port());
  ASSERT_TRUE(c.connected()) << c.error();
  std::vector<std::string> sent;
  std::vector<std::string> ids;
  for (int i = 0; i < 4; ++i) {
    sent.push_back(route_request(router, "x-session-id: s" + std::to_string(i) + "\r\nX-Request-Id: id-" +
                                             std::to_string(i) + "\r\n"));
    ASSERT_TRUE(c.write(sent.back()));
    auto r = c.read_response(5s);
    ASSERT_TRUE(r.complete) << r.error;
    EXPECT_EQ(r.status, 200u);
    EXPECT_TRUE(r.header("content-length").has_value());
    ids.push_back(replica_id_of(r));
  }
  EXPECT_EQ(ids, (std::vector<std::string>{"a", "b", "c", "a"}));
  EXPECT_EQ(router.picks(), ids);
  EXPECT_EQ(router.connections_accepted(), 1u);  // one keep-alive connection for all four

  auto rec = router.route_requests();
  ASSERT_EQ(rec.size(), 4u);
  for (std::size_t i = 0; i < rec.size(); ++i) {
    EXPECT_EQ(rec[i].raw, sent[i]);
    EXPECT_EQ(rec[i].version, 11u);
  }
  ASSERT_EQ(rec[2].headers.size(), 5u);
  EXPECT_EQ(rec[2].headers[0].first, "Host");
  EXPECT_EQ(rec[2].headers[2], (std::pair<std::string, std::string>{"x-session-id", "s2"}));
  EXPECT_EQ(rec[2].header("x-request-id").value_or(""), "id-2");
  EXPECT_TRUE(rec[2].body.empty());
}

TEST(DemoServers, RecordsAreABoundedWindowOfTheMostRecentRequests) {
  // A demo that serves for days keeps only the latest requests and picks (it once grew to
  // 828 MB after ~1.1 M requests); the count still covers all of them.
  router_server router({.name = "SERVE_REPLICA::llm#LLMRouter#t", .bind_ip = loopback, .port = 0});
  router.set_replicas(std::vector<std::string>{"a", "b", "c"});
  router.set_record_limit(3);
  auto c = testing::connection::open(loopback, router.port());
  ASSERT_TRUE(c.connected()) << c.error();
  for (int i = 0; i < 5; ++i) {
    ASSERT_TRUE(c.write(route_request(router, "X-Request-Id: id-" + std::to_string(i) + "\r\n")));
    ASSERT_TRUE(c.read_response(5s).complete);
  }
  EXPECT_EQ(router.request_count(), 5u);
  const auto rec = router.requests();
  ASSERT_EQ(rec.size(), 3u);
  EXPECT_EQ(rec.front().header("x-request-id").value_or(""), "id-2");
  EXPECT_EQ(rec.back().header("x-request-id").value_or(""), "id-4");
  EXPECT_EQ(router.picks(), (std::vector<std::string>{"c", "a", "b"}));
  EXPECT_TRUE(router.wait_for_requests(5, 1s));

  demo::cluster cluster;  // the demo's servers come with a bounded window
  EXPECT_EQ(cluster.replica(0).record_limit(), demo::cluster::options{}.record_limit);
  EXPECT_EQ(cluster.local_router(0).record_limit(), demo::cluster::options{}.record_limit);
  EXPECT_EQ(cluster.echo_replica().record_limit(), demo::cluster::options{}.record_limit);
}

TEST(DemoServers, RouterSpeaksHttp10WithConnectionClose) {
  router_server router({.name = "r", .bind_ip = loopback, .port = 0});
  router.set_replicas(std::vector<std::string>{"SERVE_REPLICA::llm#LLMServer#x"});
  auto c = testing::send_raw(loopback, router.port(),
                             "POST /internal/route HTTP/1.0\r\nHost: h\r\nConnection: close\r\n"
                             "Content-Type: application/json\r\nContent-Length: 2\r\n\r\n{}");
  ASSERT_TRUE(c.connected()) << c.error();
  auto r = c.read_response(5s);
  ASSERT_TRUE(r.complete) << r.error;
  EXPECT_EQ(r.status, 200u);
  EXPECT_EQ(replica_id_of(r), "SERVE_REPLICA::llm#LLMServer#x");
  EXPECT_TRUE(c.is_closed(5s));
  auto rec = router.route_requests();
  ASSERT_EQ(rec.size(), 1u);
  EXPECT_EQ(rec[0].version, 10u);
  EXPECT_FALSE(rec[0].keep_alive);
  EXPECT_EQ(rec[0].body, "{}");

  auto health = http_get(loopback, router.port(), "/health");
  ASSERT_TRUE(health.complete) << health.error;
  EXPECT_EQ(nlohmann::json::parse(health.body), nlohmann::json({{"status", "ok"}}));
}

TEST(DemoServers, RouterScriptedRepliesFailuresAndHang) {
  router_server router({.name = "r", .bind_ip = loopback, .port = 0});
  router.set_replicas(std::vector<std::string>{"a"});
  router.queue_behaviour(router_behaviour::respond(503, R"({"detail":"unavailable"})"));
  router.queue_behaviour(router_behaviour::respond(200, R"({"host":"h","port":1})"));
  router.queue_behaviour(router_behaviour::close_without_reply());
  router.queue_behaviour(router_behaviour::round_robin().with_request_headers({{"serve_multiplexed_model_id", "m1"}}));

  auto r = http_post(loopback, router.port(), "/internal/route");
  EXPECT_EQ(r.status, 503u);
  r = http_post(loopback, router.port(), "/internal/route");
  EXPECT_EQ(r.status, 200u);
  EXPECT_EQ(replica_id_of(r), "<none>");
  r = http_post(loopback, router.port(), "/internal/route");
  EXPECT_FALSE(r.complete);
  EXPECT_FALSE(r.timed_out);
  r = http_post(loopback, router.port(), "/internal/route");
  ASSERT_TRUE(r.complete) << r.error;
  EXPECT_EQ(nlohmann::json::parse(r.body)["request_headers"]["serve_multiplexed_model_id"], "m1");
  r = http_post(loopback, router.port(), "/internal/route");  // queue drained: default again
  EXPECT_EQ(replica_id_of(r), "a");

  router.set_behaviour(router_behaviour::hang());
  auto c = testing::send_raw(loopback, router.port(), route_request(router));
  auto hung = c.read_response(200ms);
  EXPECT_TRUE(hung.timed_out);
  c.close();
  EXPECT_TRUE(router.wait_for_aborted_responses(1, 5s));
  EXPECT_EQ(router.route_requests().size(), 6u);
}

TEST(DemoServers, ReplicaResetAfterEventsShowsAsConnectionError) {
  replica_server replica(replica_opts(50ms));
  replica.set_behaviour(replica_behaviour::reset_after_events(2));
  auto r = http_post(loopback, replica.port(), "/v1/chat/completions", {}, R"({"stream":true})");
  EXPECT_FALSE(r.complete);
  EXPECT_FALSE(r.timed_out);
  EXPECT_EQ(r.status, 200u);
  EXPECT_EQ(r.events.size(), 2u);
  EXPECT_NE(r.error, "eof") << "expected a reset, not a clean close";
}

TEST(DemoServers, ReplicaScriptedBehaviours) {
  replica_server replica(replica_opts(1ms));
  replica.queue_behaviour(replica_behaviour::respond(429, {{"Retry-After", "1"}}, "slow down"));
  replica.queue_behaviour(replica_behaviour::close_before_headers());
  replica.queue_behaviour(replica_behaviour::stream_events(3, 1ms));

  auto r = http_get(loopback, replica.port(), "/anything");
  EXPECT_EQ(r.status, 429u);
  EXPECT_EQ(r.body, "slow down");
  EXPECT_EQ(r.header("retry-after").value_or(""), "1");
  EXPECT_EQ(r.header("x-served-by").value_or(""), replica.name());

  r = http_get(loopback, replica.port(), "/anything");
  EXPECT_FALSE(r.complete);
  EXPECT_EQ(r.error, "eof");
  EXPECT_EQ(r.status, 0u);

  r = http_get(loopback, replica.port(), "/not/a/completion");
  ASSERT_TRUE(r.complete) << r.error;
  EXPECT_EQ(r.events.size(), 4u);

  // Queue drained: back to normal (echo).
  r = http_get(loopback, replica.port(), "/x");
  EXPECT_EQ(nlohmann::json::parse(r.body)["target"], "/x");
}

TEST(DemoServers, ReplicaNoticesPeerClosingMidStreamAndWhileHanging) {
  replica_server replica(replica_opts(20ms, 1000));
  auto c = testing::send_raw(loopback, replica.port(),
                             testing::format_request("POST", "/v1/chat/completions", loopback, replica.port(), {},
                                                     R"({"stream":true})"));
  ASSERT_TRUE(replica.wait_for_requests(1, 5s));
  c.close();
  EXPECT_TRUE(replica.wait_for_aborted_responses(1, 5s));
  EXPECT_TRUE(replica.wait_for_disconnects(1, 5s));

  replica.set_behaviour(replica_behaviour::hang());
  auto h = testing::send_raw(loopback, replica.port(), testing::format_request("GET", "/", loopback, replica.port(), {}, {}));
  EXPECT_TRUE(h.read_response(100ms).timed_out);
  h.reset();
  EXPECT_TRUE(replica.wait_for_aborted_responses(2, 5s));
  EXPECT_EQ(replica.connections_accepted(), 2u);
}

TEST(DemoServers, StopClosesConnectionsAndReleasesThePort) {
  auto replica = std::make_unique<replica_server>(replica_opts());
  const auto port = replica->port();
  auto idle = testing::connection::open(loopback, port);
  ASSERT_TRUE(idle.connected());
  ASSERT_TRUE(replica->wait_for_connections(1, 5s));
  replica->stop();
  EXPECT_TRUE(idle.is_closed(5s));
  EXPECT_EQ(replica->disconnects(), 0u);  // the server closed them, not the peer
  EXPECT_FALSE(testing::connection::open(loopback, port).connected());
  replica.reset();

  // The same port can be taken again at once (a restarted replica).
  auto opts = replica_opts();
  opts.port = port;
  replica_server again(opts);
  EXPECT_EQ(http_get(loopback, port, "/-/healthz").status, 200u);
}

TEST(DemoServers, ClusterDescribesItsServersAndRoutersPickItsReplicas) {
  demo::cluster cluster;
  const auto doc = cluster.document();
  ASSERT_EQ(doc.apps.size(), 2u);
  const auto& llm = doc.apps[0];
  EXPECT_EQ(llm.name, "llm");
  EXPECT_EQ(llm.route_prefix, "/");
  ASSERT_EQ(llm.replicas.size(), 3u);
  ASSERT_EQ(llm.routers.size(), 3u);
  EXPECT_EQ(llm.routers[0].ip, "127.0.0.1");
  EXPECT_EQ(llm.routers[1].ip, "127.0.0.1");
  EXPECT_EQ(llm.routers[2].ip, "127.0.0.3");
  EXPECT_EQ(doc.apps[1].name, "echo");
  EXPECT_EQ(doc.apps[1].route_prefix, "/echo");
  EXPECT_TRUE(doc.apps[1].routers.empty());
  ASSERT_EQ(doc.apps[1].replicas.size(), 1u);

  // The remote router really listens on the other loopback address, and names llm replicas.
  auto r = http_post(llm.routers[2].ip, llm.routers[2].port, "/internal/route");
  ASSERT_TRUE(r.complete) << r.error;
  const auto id = replica_id_of(r);
  EXPECT_EQ(id, llm.replicas[0].name);
  auto served = http_get(llm.replicas[0].ip, llm.replicas[0].port, "/v1/models");
  EXPECT_EQ(served.header("x-served-by").value_or(""), id);
  EXPECT_EQ(replica_id_of(http_post(llm.routers[0].ip, llm.routers[0].port, "/internal/route")), llm.replicas[0].name);
  EXPECT_EQ(replica_id_of(http_post(llm.routers[0].ip, llm.routers[0].port, "/internal/route")), llm.replicas[1].name);

  // The JSON form parses back to the same document.
  auto parsed = topology::parse_document(cluster.document_json());
  ASSERT_TRUE(std::holds_alternative<topology::document>(parsed)) << std::get<topology::parse_error>(parsed).message;
  EXPECT_EQ(std::get<topology::document>(parsed), doc);
  cluster.stop();
}

TEST(DemoServers, FakeDashboardServesChangingBodyAndFailsOnDemand) {
  testing::fake_dashboard dash;
  const auto path = "/api/serve/applications/";
  auto r = http_get(loopback, dash.port(), path);
  EXPECT_EQ(r.status, 200u);
  EXPECT_EQ(r.body, R"({"applications":{}})");
  dash.set_body(R"({"target_groups":[]})");
  EXPECT_EQ(http_get(loopback, dash.port(), path).body, R"({"target_groups":[]})");
  dash.set_status(500);
  EXPECT_EQ(http_get(loopback, dash.port(), path).status, 500u);
  EXPECT_EQ(http_get(loopback, dash.port(), "/other").status, 404u);
  dash.set_status(200);
  dash.set_hang(true);
  EXPECT_TRUE(http_get(loopback, dash.port(), path, {}, 100ms).timed_out);
  EXPECT_EQ(dash.served_count(), 2u);
  EXPECT_EQ(dash.url(), "http://127.0.0.1:" + std::to_string(dash.port()));
}

}  // namespace
}  // namespace ingressd
