// Streaming responses through the proxy (contract §4.3, §4.4; hardening F6, F7, G1, G3, G7):
// SSE events are relayed as they are generated, cancellation flows both ways, and upstream
// failures are reported (before headers) or never disguised as a clean end (after headers).
#include <chrono>
#include <string>

#include <gtest/gtest.h>
#include <nlohmann/json.hpp>

#include "fakes/http_client.hpp"
#include "fakes/proxy_fixture.hpp"
#include "fakes/topology_builder.hpp"
#include "ingressd/demo/replica_server.hpp"

namespace ingressd {
namespace {

using namespace std::chrono_literals;
using demo::replica_behaviour;
using demo::replica_server;
using testing::clock;
using testing::connection;
using testing::format_request;
using testing::http_get;
using testing::http_post;
using testing::proxy;
using testing::target_of;
using testing::test_config;
using testing::topology_builder;

const std::string loopback = "127.0.0.1";
const std::string stream_body = R"({"model":"m","stream":true,"messages":[{"role":"user","content":"hi"}]})";

replica_server::options named(std::string name, std::chrono::milliseconds token_delay = 20ms, std::size_t tokens = 8) {
  return {.name = std::move(name), .bind_ip = loopback, .port = 0, .token_delay = token_delay, .tokens = tokens};
}

std::string stream_request(const proxy& p, std::string_view path = "/v1/chat/completions") {
  return format_request("POST", path, loopback, p.port(), {{"Content-Type", "application/json"}}, stream_body);
}

/// A proxy with one app "/" served by `r`.
void route_all_to(proxy& p, const replica_server& r) { p.set_topology(topology_builder().app("llm", "/", {target_of(r)})); }

TEST(Streaming, SseEventsReachTheClientWhileTheReplicaIsStillGenerating) {
  replica_server r(named("SERVE_REPLICA::llm#A#1", 50ms, 10));
  proxy p(test_config());
  route_all_to(p, r);

  auto res = http_post(loopback, p.port(), "/v1/chat/completions", {{"Content-Type", "application/json"}}, stream_body);
  ASSERT_TRUE(res.complete) << res.error;
  EXPECT_EQ(res.status, 200u);
  EXPECT_EQ(res.header("x-served-by").value_or(""), r.name());
  EXPECT_EQ(res.header("content-type").value_or(""), "text/event-stream");
  EXPECT_TRUE(res.chunked);
  ASSERT_EQ(res.events.size(), 11u);  // 10 tokens + [DONE]
  EXPECT_EQ(res.events.back().data, "[DONE]");
  auto first = nlohmann::json::parse(res.events.front().data, nullptr, false);
  ASSERT_TRUE(first.is_object()) << res.events.front().data;
  EXPECT_EQ(first["choices"][0]["delta"]["content"], "Hello");
  // The replica spends 10 x 50 ms between its first event and [DONE]. A buffering proxy would
  // deliver them together; a streaming one delivers the first ~500 ms before the last.
  EXPECT_GE(res.events.back().at - res.events.front().at, 300ms);
  EXPECT_GE(res.events.back().at - res.headers_at, 300ms) << "headers must go out before the stream ends (TTFT)";
  for (std::size_t i = 1; i < res.events.size(); ++i) EXPECT_LE(res.events[i - 1].at, res.events[i].at);
}

TEST(Streaming, ScriptedEventStreamOnAnyPathIsRelayedEventByEvent) {
  replica_server r(named("SERVE_REPLICA::llm#A#1"));
  r.set_behaviour(replica_behaviour::stream_events(6, 80ms));
  proxy p(test_config());
  route_all_to(p, r);

  auto res = http_get(loopback, p.port(), "/events");
  ASSERT_TRUE(res.complete) << res.error;
  ASSERT_EQ(res.events.size(), 7u);
  EXPECT_GE(res.events.back().at - res.events.front().at, 300ms);
  // Events 80 ms apart are read and written one by one, so no two share an arrival.
  std::size_t separate = 0;
  for (std::size_t i = 1; i < res.events.size(); ++i)
    if (res.events[i].at - res.events[i - 1].at >= 20ms) ++separate;
  EXPECT_GE(separate, 5u);
}

TEST(Streaming, ClientDisconnectMidStreamClosesTheUpstream) {
  replica_server r(named("SERVE_REPLICA::llm#A#1", 50ms, 200));  // ~10 s if nobody stops it
  proxy p(test_config());
  route_all_to(p, r);

  auto c = connection::open(loopback, p.port());
  ASSERT_TRUE(c.connected()) << c.error();
  ASSERT_TRUE(c.write(stream_request(p)));
  auto partial = c.read_response(400ms);
  ASSERT_TRUE(partial.timed_out) << "the stream should still be running: " << partial.error;
  ASSERT_EQ(partial.status, 200u);
  ASSERT_GE(partial.events.size(), 2u) << "events should be arriving already";
  EXPECT_EQ(r.aborted_responses(), 0u);

  const auto closed_at = clock::now();
  c.close();
  ASSERT_TRUE(r.wait_for_aborted_responses(1, 3s)) << "the replica never saw its connection close";
  EXPECT_LT(clock::now() - closed_at, 1s) << "the upstream must be cancelled promptly";
}

TEST(Streaming, ClientDisconnectWhileReplicaHangsBeforeHeadersClosesTheUpstream) {
  replica_server r(named("SERVE_REPLICA::llm#A#1"));
  r.set_behaviour(replica_behaviour::hang());
  auto cfg = test_config();
  cfg.upstream.first_byte_timeout = 20s;  // a long prefill: only the client's leaving ends it
  proxy p(cfg);
  route_all_to(p, r);

  auto c = connection::open(loopback, p.port());
  ASSERT_TRUE(c.connected()) << c.error();
  ASSERT_TRUE(c.write(stream_request(p)));
  ASSERT_TRUE(r.wait_for_requests(1, 5s));
  EXPECT_FALSE(r.wait_for_aborted_responses(1, 100ms)) << "nothing should close the upstream yet";

  const auto closed_at = clock::now();
  c.close();
  ASSERT_TRUE(r.wait_for_aborted_responses(1, 3s)) << "the replica never saw its connection close";
  EXPECT_LT(clock::now() - closed_at, 1s) << "must not wait for first_byte_timeout";
}

TEST(Streaming, ClientResetMidStreamClosesTheUpstream) {
  replica_server r(named("SERVE_REPLICA::llm#A#1", 50ms, 200));
  proxy p(test_config());
  route_all_to(p, r);

  auto c = connection::open(loopback, p.port());
  ASSERT_TRUE(c.connected()) << c.error();
  ASSERT_TRUE(c.write(stream_request(p)));
  auto partial = c.read_response(300ms);
  ASSERT_GE(partial.events.size(), 1u) << partial.error;
  const auto reset_at = clock::now();
  c.reset();
  ASSERT_TRUE(r.wait_for_aborted_responses(1, 3s));
  EXPECT_LT(clock::now() - reset_at, 1s);
}

TEST(Streaming, UpstreamResetMidStreamIsNeverACleanEnd) {
  replica_server r(named("SERVE_REPLICA::llm#A#1", 50ms, 8));
  r.set_behaviour(replica_behaviour::reset_after_events(3));
  proxy p(test_config());
  route_all_to(p, r);

  // Parsed: the response must stay incomplete, with every event sent before the crash.
  {
    auto c = connection::open(loopback, p.port());
    ASSERT_TRUE(c.connected()) << c.error();
    ASSERT_TRUE(c.write(stream_request(p)));
    auto res = c.read_response(5s);
    EXPECT_EQ(res.status, 200u);
    EXPECT_FALSE(res.complete) << "a truncated stream was turned into a complete response";
    EXPECT_FALSE(res.timed_out) << "the client must see the abort promptly, not hang";
    EXPECT_EQ(res.events.size(), 3u) << "bytes received before the reset must be forwarded";
    EXPECT_TRUE(c.is_closed(2s));
  }
  // Raw: no terminating zero-size chunk ever reaches the client.
  {
    auto c = connection::open(loopback, p.port());
    ASSERT_TRUE(c.connected()) << c.error();
    ASSERT_TRUE(c.write(stream_request(p)));
    auto raw = c.read_until_close(5s);
    EXPECT_FALSE(raw.timed_out);
    EXPECT_TRUE(raw.closed || raw.reset);
    EXPECT_NE(raw.bytes.find("Transfer-Encoding: chunked"), std::string::npos) << raw.bytes.substr(0, 300);
    const auto n = raw.bytes.size();
    EXPECT_FALSE(n >= 5 && raw.bytes.compare(n - 5, 5, "0\r\n\r\n") == 0) << "clean end after an upstream reset";
    EXPECT_EQ(raw.bytes.find("\r\n0\r\n\r\n"), std::string::npos);
  }
}

TEST(Streaming, UpstreamStallMidStreamAbortsAfterIdleTimeout) {
  replica_server r(named("SERVE_REPLICA::llm#A#1"));
  r.set_behaviour(replica_behaviour::stream_events(3, 5s));  // stalls 5 s after the first event
  auto cfg = test_config();
  cfg.upstream.idle_timeout = 300ms;
  proxy p(cfg);
  route_all_to(p, r);

  auto c = connection::open(loopback, p.port());
  ASSERT_TRUE(c.connected()) << c.error();
  ASSERT_TRUE(c.write(stream_request(p)));
  auto res = c.read_response(3s);
  EXPECT_EQ(res.status, 200u);
  EXPECT_FALSE(res.timed_out) << "a stalled stream must be aborted after upstream.idle_timeout";
  EXPECT_FALSE(res.complete) << "a stalled stream must not be ended cleanly";
  ASSERT_EQ(res.events.size(), 1u);
  EXPECT_GE(res.finished_at - res.events.front().at, 250ms);
  EXPECT_LT(res.finished_at - res.events.front().at, 2s);
  EXPECT_TRUE(r.wait_for_aborted_responses(1, 2s)) << "the stalled upstream must be closed too";
}

TEST(Streaming, TwoStreamsInARowOnOneConnection) {
  replica_server r(named("SERVE_REPLICA::llm#A#1", 10ms, 5));
  proxy p(test_config());
  route_all_to(p, r);

  auto c = connection::open(loopback, p.port());
  ASSERT_TRUE(c.connected()) << c.error();
  for (int i = 0; i < 2; ++i) {
    ASSERT_TRUE(c.write(stream_request(p)));
    auto res = c.read_response(5s);
    ASSERT_TRUE(res.complete) << "stream " << i << ": " << res.error;
    EXPECT_TRUE(res.keep_alive());
    ASSERT_EQ(res.events.size(), 6u);
    EXPECT_EQ(res.events.back().data, "[DONE]");
  }
}

TEST(Streaming, RequestPipelinedBehindAStreamIsServedAfterIt) {
  replica_server r(named("SERVE_REPLICA::llm#A#1", 50ms, 6));
  proxy p(test_config());
  route_all_to(p, r);

  auto c = connection::open(loopback, p.port());
  ASSERT_TRUE(c.connected()) << c.error();
  ASSERT_TRUE(c.write(stream_request(p)));
  auto partial = c.read_response(120ms);
  ASSERT_TRUE(partial.timed_out) << partial.error;
  // Sent while the first response is still streaming: kept, and answered after it.
  ASSERT_TRUE(c.write(format_request("GET", "/second", loopback, p.port(), {}, {})));
  EXPECT_FALSE(r.wait_for_requests(2, 100ms)) << "the second request must wait for the stream (no reordering)";
  auto rest = c.read_until_close(1s);  // the rest of stream 1 plus response 2; the connection stays open
  EXPECT_TRUE(rest.timed_out) << "the connection must stay open";
  EXPECT_NE(rest.bytes.find("data: [DONE]"), std::string::npos);
  const auto second = rest.bytes.find("\"target\":\"/second\"");
  EXPECT_NE(second, std::string::npos) << rest.bytes;
  EXPECT_LT(rest.bytes.find("data: [DONE]"), second) << "responses out of order";
  EXPECT_EQ(r.request_count(), 2u);
}

TEST(Streaming, UpstreamHangBeforeHeadersIs504AfterFirstByteTimeout) {
  replica_server r(named("SERVE_REPLICA::llm#A#1"));
  r.set_behaviour(replica_behaviour::hang());
  auto cfg = test_config();
  cfg.upstream.first_byte_timeout = 300ms;
  proxy p(cfg);
  route_all_to(p, r);

  const auto start = clock::now();
  auto res = http_post(loopback, p.port(), "/v1/chat/completions", {{"Content-Type", "application/json"}}, stream_body,
                       5s);
  const auto took = clock::now() - start;
  ASSERT_TRUE(res.complete) << res.error;
  EXPECT_EQ(res.status, 504u);
  EXPECT_EQ(res.header("x-serve-reason").value_or(""), "upstream_timeout");
  EXPECT_GE(took, 250ms);
  EXPECT_LT(took, 3s);
  EXPECT_TRUE(r.wait_for_aborted_responses(1, 2s)) << "the hung upstream connection must be closed";
  EXPECT_EQ(r.request_count(), 1u) << "no retry once the request was sent";
}

TEST(Streaming, FirstByteTimeoutCoversOnlyTheHeaders) {
  replica_server r(named("SERVE_REPLICA::llm#A#1"));
  // Headers after 100 ms (within the 300 ms first-byte timeout), then a 6 x 150 ms stream that
  // lasts well beyond it.
  r.set_behaviour(replica_behaviour::stream_events(6, 150ms).after(100ms));
  auto cfg = test_config();
  cfg.upstream.first_byte_timeout = 300ms;
  proxy p(cfg);
  route_all_to(p, r);

  auto res = http_get(loopback, p.port(), "/slow-stream", {}, 5s);
  ASSERT_TRUE(res.complete) << res.error;
  EXPECT_EQ(res.status, 200u);
  ASSERT_EQ(res.events.size(), 7u);
  EXPECT_EQ(res.events.back().data, "[DONE]");
}

TEST(Streaming, UpstreamCloseBeforeHeadersIs502) {
  replica_server r(named("SERVE_REPLICA::llm#A#1"));
  r.set_behaviour(replica_behaviour::close_before_headers());
  proxy p(test_config());
  route_all_to(p, r);

  auto res = http_post(loopback, p.port(), "/v1/chat/completions", {{"Content-Type", "application/json"}}, stream_body,
                       5s);
  ASSERT_TRUE(res.complete) << res.error;
  EXPECT_EQ(res.status, 502u);
  EXPECT_EQ(res.header("x-serve-reason").value_or(""), "upstream_error");
  EXPECT_EQ(r.request_count(), 1u) << "a request that reached the replica is not retried";
}

TEST(Streaming, Http10ClientGetsCloseDelimitedStreamWithoutTransferEncoding) {
  replica_server r(named("SERVE_REPLICA::llm#A#1", 30ms, 6));
  proxy p(test_config());
  route_all_to(p, r);

  const std::string raw = "POST /v1/chat/completions HTTP/1.0\r\nHost: x\r\nContent-Type: application/json\r\n"
                          "Content-Length: " +
                          std::to_string(stream_body.size()) + "\r\n\r\n" + stream_body;
  auto c = testing::send_raw(loopback, p.port(), raw);
  ASSERT_TRUE(c.connected()) << c.error();
  auto res = c.read_response(5s);
  ASSERT_TRUE(res.complete) << res.error;
  EXPECT_EQ(res.status, 200u);
  EXPECT_EQ(res.header_count("transfer-encoding"), 0u) << "no Transfer-Encoding to an HTTP/1.0 client";
  EXPECT_EQ(res.header_count("content-length"), 0u);
  EXPECT_FALSE(res.chunked);
  ASSERT_EQ(res.events.size(), 7u);
  EXPECT_EQ(res.events.back().data, "[DONE]");
  EXPECT_EQ(res.body.find("\r\n0\r\n"), std::string::npos) << "chunk framing leaked into the body";
  EXPECT_TRUE(c.is_closed(1s)) << "the body ends by close";
}

}  // namespace
}  // namespace ingressd
