// Streaming responses through the proxy (contract §4.3, §4.4; hardening F6, F7, G1, G3, G7):
// SSE events are relayed as they are generated, cancellation flows both ways, and upstream
// failures are reported (before headers) or never disguised as a clean end (after headers).
#include <chrono>
#include <cstdint>
#include <filesystem>
#include <fstream>
#include <memory>
#include <thread>
#include <vector>
#include <string>

#include <boost/asio/write.hpp>
#include <gtest/gtest.h>
#include <nlohmann/json.hpp>

#include "fakes/admin_client.hpp"
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

using testing::replica_named;

std::string stream_request(const proxy& p, std::string_view path = "/v1/chat/completions") {
  return format_request("POST", path, loopback, p.port(), {{"Content-Type", "application/json"}}, stream_body);
}

/// A proxy with one app "/" served by `r`.
void route_all_to(proxy& p, const replica_server& r) { p.set_topology(topology_builder().app("llm", "/", {target_of(r)})); }

TEST(Streaming, SseEventsReachTheClientWhileTheReplicaIsStillGenerating) {
  replica_server r(replica_named("SERVE_REPLICA::llm#A#1", 50ms, 10));
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
  // Each event must reach the client before the replica writes the next. A relay that holds an
  // event until the next chunk's size line arrives still delivers them spread out (each one
  // interval late), so "spread out" is not enough: no two may arrive together. The replica
  // writes an event every 400 ms, on a path that is not a completion.
  replica_server r(replica_named("SERVE_REPLICA::llm#A#1"));
  r.set_behaviour(replica_behaviour::stream_events(4, 400ms));
  proxy p(test_config());
  route_all_to(p, r);

  auto res = http_get(loopback, p.port(), "/events");
  ASSERT_TRUE(res.complete) << res.error;
  ASSERT_EQ(res.events.size(), 5u);  // 4 events + [DONE]
  for (std::size_t i = 1; i < res.events.size(); ++i)
    EXPECT_GE(res.events[i].at - res.events[i - 1].at, 150ms) << "event " << i << " arrived with the one before it";
}

/// Events enough that a stream never ends by itself while a test runs (50 ms apart: 83 minutes):
/// the replica's connection can then only close because ingressd closed it.
constexpr std::size_t endless = 100000;

TEST(Streaming, ClientDisconnectMidStreamClosesTheUpstream) {
  replica_server r(replica_named("SERVE_REPLICA::llm#A#1", 50ms, endless));
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

  c.close();
  // The stream cannot end by itself: its abort is ingressd cancelling the upstream, and the
  // request is counted as the client's leaving.
  ASSERT_TRUE(r.wait_for_aborted_responses(1, 10s)) << "the replica never saw its connection close";
  EXPECT_EQ(testing::wait_client_left(p.admin_port(), 1), 1);
}

TEST(Streaming, ClientDisconnectWhileReplicaHangsBeforeHeadersClosesTheUpstream) {
  replica_server r(replica_named("SERVE_REPLICA::llm#A#1"));
  r.set_behaviour(replica_behaviour::hang());
  auto cfg = test_config();
  cfg.upstream.first_byte_timeout = std::chrono::hours(1);  // a long prefill: only the client's leaving ends it
  proxy p(cfg);
  route_all_to(p, r);

  auto c = connection::open(loopback, p.port());
  ASSERT_TRUE(c.connected()) << c.error();
  ASSERT_TRUE(c.write(stream_request(p)));
  ASSERT_TRUE(r.wait_for_requests(1, 5s));
  EXPECT_FALSE(r.wait_for_aborted_responses(1, 100ms)) << "nothing should close the upstream yet";

  c.close();
  // first_byte_timeout is an hour away: the close is ingressd reacting to the client (499), not
  // a timeout (504).
  ASSERT_TRUE(r.wait_for_aborted_responses(1, 10s)) << "the replica never saw its connection close";
  EXPECT_EQ(testing::wait_client_left(p.admin_port(), 1), 1);
  EXPECT_EQ(testing::requests_with_code(testing::scrape_metrics(p.admin_port()), "504"), 0);
}

TEST(Streaming, ClientResetMidStreamClosesTheUpstream) {
  replica_server r(replica_named("SERVE_REPLICA::llm#A#1", 50ms, endless));
  proxy p(test_config());
  route_all_to(p, r);

  auto c = connection::open(loopback, p.port());
  ASSERT_TRUE(c.connected()) << c.error();
  ASSERT_TRUE(c.write(stream_request(p)));
  auto partial = c.read_response(300ms);
  ASSERT_GE(partial.events.size(), 1u) << partial.error;
  c.reset();
  ASSERT_TRUE(r.wait_for_aborted_responses(1, 10s)) << "the replica never saw its connection close";
  EXPECT_EQ(testing::wait_client_left(p.admin_port(), 1), 1);
}

TEST(Streaming, UpstreamResetMidStreamIsNeverACleanEnd) {
  replica_server r(replica_named("SERVE_REPLICA::llm#A#1", 50ms, 8));
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
    EXPECT_TRUE(raw.reset) << "a truncated stream ends with RST, never a FIN (hardening G3)";
    EXPECT_NE(raw.bytes.find("Transfer-Encoding: chunked"), std::string::npos) << raw.bytes.substr(0, 300);
    const auto n = raw.bytes.size();
    EXPECT_FALSE(n >= 5 && raw.bytes.compare(n - 5, 5, "0\r\n\r\n") == 0) << "clean end after an upstream reset";
    EXPECT_EQ(raw.bytes.find("\r\n0\r\n\r\n"), std::string::npos);
  }
}

TEST(Streaming, UpstreamFinBeforeTheEndOfTheBodyIsNeverACleanEnd) {
  replica_server r(replica_named("SERVE_REPLICA::llm#A#1"));
  // Chunked, then FIN without the last chunk.
  r.queue_behaviour(replica_behaviour::respond(
      200, {{"Content-Type", "text/event-stream"}, {"Transfer-Encoding", "chunked"}, {"Connection", "close"}},
      "e\r\ndata: token1\n\n\r\n"));
  // Content-Length 100, then FIN after 50 bytes.
  r.queue_behaviour(replica_behaviour::respond(200, {{"Content-Length", "100"}, {"Connection", "close"}},
                                               std::string(50, 'z')));
  proxy p(test_config());
  route_all_to(p, r);

  auto chunked = http_get(loopback, p.port(), "/chunked", {}, 3s);
  EXPECT_EQ(chunked.status, 200u);
  EXPECT_FALSE(chunked.complete) << "the client got a clean end for a truncated chunked body";
  EXPECT_FALSE(chunked.timed_out) << "the client must see the truncation promptly";
  EXPECT_EQ(chunked.events.size(), 1u) << "bytes received before the upstream closed must be forwarded";

  auto sized = http_get(loopback, p.port(), "/sized", {}, 3s);
  EXPECT_EQ(sized.status, 200u);
  EXPECT_FALSE(sized.complete) << "the client got a clean end for a truncated Content-Length body";
  EXPECT_FALSE(sized.timed_out) << "the client must see the truncation promptly";
  EXPECT_EQ(sized.body, std::string(50, 'z'));
}

TEST(Streaming, MalformedUpstreamResponseHeadIs502) {
  replica_server r(replica_named("SERVE_REPLICA::llm#A#1"));
  // Conflicting Content-Length values (hardening A2, response side).
  r.queue_behaviour(replica_behaviour::respond(200, {{"Content-Length", "5"}, {"Content-Length", "6"}}, "hello!"));
  // A response head far beyond any sane limit (hardening B6).
  r.queue_behaviour(replica_behaviour::respond(200, {{"X-Huge", std::string(512 * 1024, 'h')}}, "ok"));
  proxy p(test_config());
  route_all_to(p, r);

  for (const std::string target : {"/conflicting-length", "/huge-head"}) {
    auto res = http_get(loopback, p.port(), target, {}, 5s);
    ASSERT_TRUE(res.complete) << target << ": " << res.error;
    EXPECT_EQ(res.status, 502u) << target;
    EXPECT_EQ(res.header("x-serve-reason").value_or(""), "upstream_error") << target;
  }
}

TEST(Streaming, UpstreamStallMidStreamAbortsAfterIdleTimeout) {
  replica_server r(replica_named("SERVE_REPLICA::llm#A#1"));
  // Stalls an hour after the first event: only upstream.idle_timeout can end the stream.
  r.set_behaviour(replica_behaviour::stream_events(3, std::chrono::hours(1)));
  auto cfg = test_config();
  cfg.upstream.idle_timeout = 300ms;
  proxy p(cfg);
  route_all_to(p, r);

  auto c = connection::open(loopback, p.port());
  ASSERT_TRUE(c.connected()) << c.error();
  ASSERT_TRUE(c.write(stream_request(p)));
  auto res = c.read_response(10s);
  EXPECT_EQ(res.status, 200u);
  EXPECT_FALSE(res.timed_out) << "a stalled stream must be aborted after upstream.idle_timeout";
  EXPECT_FALSE(res.complete) << "a stalled stream must not be ended cleanly";
  ASSERT_EQ(res.events.size(), 1u);
  EXPECT_GE(res.finished_at - res.events.front().at, 250ms);
  EXPECT_TRUE(r.wait_for_aborted_responses(1, 10s)) << "the stalled upstream must be closed too";
}

TEST(Streaming, TwoStreamsInARowOnOneConnection) {
  replica_server r(replica_named("SERVE_REPLICA::llm#A#1", 10ms, 5));
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
  replica_server r(replica_named("SERVE_REPLICA::llm#A#1", 50ms, 12));  // ~600 ms of stream
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
  auto rest = c.read_until_close(1500ms);  // the rest of stream 1 plus response 2; the connection stays open
  EXPECT_TRUE(rest.timed_out) << "the connection must stay open";
  EXPECT_NE(rest.bytes.find("data: [DONE]"), std::string::npos);
  const auto second = rest.bytes.find("\"target\":\"/second\"");
  EXPECT_NE(second, std::string::npos) << rest.bytes;
  EXPECT_LT(rest.bytes.find("data: [DONE]"), second) << "responses out of order";
  EXPECT_EQ(r.request_count(), 2u);
}

TEST(Streaming, UpstreamHangBeforeHeadersIs504AfterFirstByteTimeout) {
  replica_server r(replica_named("SERVE_REPLICA::llm#A#1"));
  replica_server r2(replica_named("SERVE_REPLICA::llm#B#1"));
  r.set_behaviour(replica_behaviour::hang());
  r2.set_behaviour(replica_behaviour::hang());
  auto cfg = test_config();
  cfg.upstream.first_byte_timeout = 300ms;
  proxy p(cfg);
  p.set_topology(topology_builder().app("llm", "/", {target_of(r), target_of(r2)}));

  const auto start = clock::now();
  auto res = http_post(loopback, p.port(), "/v1/chat/completions", {{"Content-Type", "application/json"}}, stream_body,
                       5s);
  const auto took = clock::now() - start;
  ASSERT_TRUE(res.complete) << res.error;
  EXPECT_EQ(res.status, 504u);
  EXPECT_EQ(res.header("x-serve-reason").value_or(""), "upstream_timeout");
  EXPECT_GE(took, 250ms);  // (a lower bound only: a loaded machine can only make it later)
  const auto& hung = r.request_count() == 1 ? r : r2;
  EXPECT_TRUE(hung.wait_for_aborted_responses(1, 2s)) << "the hung upstream connection must be closed";
  EXPECT_EQ(r.request_count() + r2.request_count(), 1u) << "no retry once the request was sent";
}

TEST(Streaming, FirstByteTimeoutCoversOnlyTheHeaders) {
  replica_server r(replica_named("SERVE_REPLICA::llm#A#1"));
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

TEST(Streaming, UpstreamCloseBeforeHeadersIs502WithoutRetry) {
  replica_server r(replica_named("SERVE_REPLICA::llm#A#1"));
  replica_server r2(replica_named("SERVE_REPLICA::llm#B#1"));
  r.set_behaviour(replica_behaviour::close_before_headers());
  r2.set_behaviour(replica_behaviour::close_before_headers());
  proxy p(test_config());
  p.set_topology(topology_builder().app("llm", "/", {target_of(r), target_of(r2)}));

  auto res = http_post(loopback, p.port(), "/v1/chat/completions", {{"Content-Type", "application/json"}}, stream_body,
                       5s);
  ASSERT_TRUE(res.complete) << res.error;
  EXPECT_EQ(res.status, 502u);
  EXPECT_EQ(res.header("x-serve-reason").value_or(""), "upstream_error");
  // A POST whose bytes reached a replica is never replayed on another one (hardening G5).
  EXPECT_EQ(r.request_count() + r2.request_count(), 1u);
}

TEST(Streaming, ClientDisconnectDuringUploadClosesTheUpstream) {
  replica_server r(replica_named("SERVE_REPLICA::llm#A#1"));
  auto cfg = test_config();
  cfg.client.body_timeout = std::chrono::hours(1);  // only the client's leaving can end this upload
  proxy p(cfg);
  route_all_to(p, r);

  auto c = connection::open(loopback, p.port());
  ASSERT_TRUE(c.connected()) << c.error();
  ASSERT_TRUE(c.write("POST /v1/upload HTTP/1.1\r\nHost: x\r\nContent-Length: 100000\r\n\r\n" + std::string(20000, 'u')));
  ASSERT_TRUE(r.wait_for_connections(1, 5s)) << "the upload should be on its way to the replica";
  c.close();
  ASSERT_TRUE(r.wait_for_disconnects(1, 10s)) << "the replica never saw the aborted upload's connection close";
  EXPECT_EQ(testing::wait_client_left(p.admin_port(), 1), 1);
  EXPECT_EQ(r.request_count(), 0u) << "a truncated upload must never look complete to the replica";
}

TEST(Streaming, RequestBodyIsStreamedToTheReplicaAsItArrives) {
  replica_server r(replica_named("SERVE_REPLICA::llm#A#1"));
  proxy p(test_config());
  route_all_to(p, r);

  auto c = connection::open(loopback, p.port());
  ASSERT_TRUE(c.connected()) << c.error();
  ASSERT_TRUE(c.write("POST /v1/upload HTTP/1.1\r\nHost: x\r\nContent-Length: 10\r\n\r\nfirst"));
  ASSERT_TRUE(r.wait_for_connections(1, 5s));
  // The client holds back the rest for 200 ms; is_closed() doubles as the bounded pause.
  EXPECT_FALSE(c.is_closed(200ms));
  const auto second_half_at = clock::now();
  ASSERT_TRUE(c.write("-last"));
  auto res = c.read_response(5s);
  ASSERT_TRUE(res.complete) << res.error;
  EXPECT_EQ(res.status, 200u);
  auto rec = r.requests();
  ASSERT_EQ(rec.size(), 1u);
  EXPECT_EQ(rec[0].body, "first-last");
  EXPECT_LT(rec[0].head_at, second_half_at) << "the proxy held the request head back until the whole body arrived";
}

TEST(Streaming, SlowReaderIsAbortedAfterIdleTimeoutWithBackpressure) {
  replica_server r(replica_named("SERVE_REPLICA::llm#A#1"));
  // Far more than the socket buffers of both hops hold: a proxy with backpressure stops reading
  // from the replica, whose write then stalls until the proxy gives up and closes it.
  r.set_behaviour(replica_behaviour::respond(200, {{"Content-Type", "application/octet-stream"}},
                                             std::string(96u << 20, 'b')));
  auto cfg = test_config();
  cfg.upstream.idle_timeout = 300ms;
  proxy p(cfg);
  route_all_to(p, r);

  auto c = connection::open(loopback, p.port());
  ASSERT_TRUE(c.connected()) << c.error();
  ASSERT_TRUE(c.write(format_request("GET", "/big", loopback, p.port(), {}, {})));
  // The client never reads. The proxy must neither buffer the whole body nor wait forever.
  EXPECT_TRUE(r.wait_for_aborted_responses(1, 10s))
      << "the replica finished writing 96 MiB to a client that reads nothing (no backpressure), or the "
         "stalled stream was never aborted";
}

TEST(Streaming, ConcurrentStreamsThroughOneWorkerNeverMixTheirBytes) {
  // Body pieces pass through one relay window per worker; a piece a client does not take at
  // once must leave the window before its stream waits (exchange.cpp, relay loop). Four large
  // responses on one worker, read one client after the other: while the first is read, the
  // other three are stalled mid-body by backpressure with their unsent pieces pending. Every
  // byte must arrive at its own client, in order.
  constexpr std::size_t body_size = 6u << 20;  // more than both hops' socket buffers
  auto body_of = [&](std::size_t k) {
    std::string b(body_size, '\0');
    for (std::size_t i = 0; i < body_size; ++i) b[i] = static_cast<char>('a' + (i * 31 + k * 7 + i / 4096) % 26);
    return b;
  };
  std::vector<std::unique_ptr<replica_server>> replicas;
  topology_builder t;
  for (std::size_t k = 0; k < 4; ++k) {
    replicas.push_back(std::make_unique<replica_server>(replica_named("SERVE_REPLICA::app" + std::to_string(k) + "#A#1")));
    replicas.back()->set_behaviour(
        replica_behaviour::respond(200, {{"Content-Type", "application/octet-stream"}}, body_of(k)));
    t.app("app" + std::to_string(k), "/s" + std::to_string(k), {target_of(*replicas.back())});
  }
  auto cfg = test_config(1);
  cfg.upstream.idle_timeout = 20s;  // the stalled streams must wait for their turn, not be aborted
  proxy p(cfg);
  p.set_topology(t);

  std::vector<connection> clients;
  for (std::size_t k = 0; k < 4; ++k) {
    clients.push_back(connection::open(loopback, p.port()));
    ASSERT_TRUE(clients.back().connected()) << clients.back().error();
    ASSERT_TRUE(clients.back().write(format_request("GET", "/s" + std::to_string(k), loopback, p.port(), {}, {})));
  }
  for (std::size_t k = 0; k < 4; ++k) {
    auto res = clients[k].read_response(30s);
    ASSERT_TRUE(res.complete) << "stream " << k << ": " << res.error;
    EXPECT_EQ(res.status, 200u);
    ASSERT_EQ(res.body.size(), body_size) << "stream " << k;
    EXPECT_TRUE(res.body == body_of(k)) << "stream " << k << " got bytes that are not its own";
  }
}

/// CPU time (ns) the daemon's worker threads ("ingressd-wN") have used so far, from schedstat.
std::uint64_t worker_cpu_ns() {
  std::uint64_t total = 0;
  for (const auto& task : std::filesystem::directory_iterator("/proc/self/task")) {
    std::ifstream comm(task.path() / "comm");
    std::string name;
    std::getline(comm, name);
    if (name.rfind("ingressd-w", 0) != 0) continue;
    std::ifstream sched(task.path() / "schedstat");
    std::uint64_t ns = 0;
    sched >> ns;
    total += ns;
  }
  return total;
}

TEST(Streaming, BusyPollingWorkerRelaysEventByEventAndSleepsWhenIdle) {
  // busy_poll_us: the worker spins after work instead of sleeping at once (worker::event_loop).
  // It must still serve streams event by event, and it must stop spinning when there is no
  // work: a worker that never sleeps would use the whole idle window below.
  replica_server r(replica_named("SERVE_REPLICA::llm#A#1", 30ms, 6));
  auto cfg = test_config(1);
  cfg.busy_poll_us = 10000;  // the largest allowed: a spin that never ended would show clearly
  proxy p(cfg);
  route_all_to(p, r);

  for (int i = 0; i < 3; ++i) {
    auto res = http_post(loopback, p.port(), "/v1/chat/completions", {{"Content-Type", "application/json"}}, stream_body);
    ASSERT_TRUE(res.complete) << res.error;
    EXPECT_EQ(res.status, 200u);
    EXPECT_EQ(res.header("x-served-by").value_or(""), r.name());
    ASSERT_EQ(res.events.size(), 7u);  // 6 tokens + [DONE]
    EXPECT_GE(res.events.back().at - res.events.front().at, 100ms) << "events were held back";
  }
  ASSERT_NE(worker_cpu_ns(), 0u) << "no worker thread found (thread names changed?)";

  // Idle: the only work is the worker's 1 s housekeeping timer, each followed by at most 10 ms
  // of spinning. A worker that kept spinning would use ~all of the 800 ms.
  const auto before = worker_cpu_ns();
  std::this_thread::sleep_for(800ms);
  const auto used = std::chrono::nanoseconds(worker_cpu_ns() - before);
  EXPECT_LT(used, 200ms) << "an idle busy-polling worker must sleep";
}

TEST(Streaming, Http10ClientGetsCloseDelimitedStreamWithoutTransferEncoding) {
  replica_server r(replica_named("SERVE_REPLICA::llm#A#1", 30ms, 6));
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

/// A replica that answers one request with `head`, then each of `pieces` `gap` apart, then closes:
/// a raw server, for bodies the fake replica does not frame (one that ends at the close).
struct piecewise_replica {
  asio::io_context ioc;
  tcp::acceptor acc{ioc, tcp::endpoint(asio::ip::make_address("127.0.0.1"), 0)};
  std::thread t;
  piecewise_replica(std::string head, std::vector<std::string> pieces, std::chrono::milliseconds gap) {
    t = std::thread([this, head = std::move(head), pieces = std::move(pieces), gap] {
      error_code ec;
      tcp::socket s(ioc);
      acc.accept(s, ec);
      if (ec) return;
      std::string in;
      while (in.find("\r\n\r\n") == std::string::npos) {
        char b[512];
        const auto n = s.read_some(asio::buffer(b), ec);
        if (ec) return;
        in.append(b, n);
      }
      asio::write(s, asio::buffer(head), ec);
      for (const auto& piece : pieces) {
        // The gap only makes it likely that ingressd waits for the next piece (the path under
        // test); the assertions hold whatever the timing.
        std::this_thread::sleep_for(gap);
        asio::write(s, asio::buffer(piece), ec);
      }
      s.shutdown(tcp::socket::shutdown_send, ec);
      char b[64];
      while (!ec) s.read_some(asio::buffer(b), ec);  // until ingressd closes its side
    });
  }
  ~piecewise_replica() {
    error_code ec;
    acc.close(ec);
    t.join();
  }
  std::uint16_t port() const { return acc.local_endpoint().port(); }
};

// The relay reads each piece when the replica socket becomes readable (body_now, session::up_empty);
// EOF goes to Beast's read, which ends a body delimited by the close and cuts any other.
TEST(Streaming, ReplicaBodyInPiecesIsRelayedWholeWhetherItEndsByLengthOrByClose) {
  const std::vector<std::string> events{"data: t1\n\n", "data: t2\n\n", "data: t3\n\n"};
  for (const bool by_close : {true, false}) {
    const std::string head = std::string("HTTP/1.1 200 OK\r\nContent-Type: text/event-stream\r\n") +
                             (by_close ? "Connection: close\r\n" : "Content-Length: 30\r\n") + "\r\n";
    piecewise_replica r(head, events, 20ms);
    proxy p(test_config());
    p.set_topology(topology_builder().app("llm", "/", {testing::make_target(r.port(), "SERVE_REPLICA::llm#A#1")}));
    auto res = http_get(loopback, p.port(), "/stream", {}, 5s);
    ASSERT_TRUE(res.complete) << (by_close ? "close-delimited: " : "Content-Length: ") << res.error;
    EXPECT_EQ(res.status, 200u);
    EXPECT_EQ(res.body, events[0] + events[1] + events[2]);
    ASSERT_EQ(res.events.size(), 3u);
    EXPECT_EQ(res.events[2].data, "t3");
    if (by_close) {
      EXPECT_TRUE(res.chunked) << "a close-delimited body goes to an HTTP/1.1 client chunked";
    }
  }
}

}  // namespace
}  // namespace ingressd
