#include "ingressd/routing/router_reply.hpp"

#include <gtest/gtest.h>

#include "ingressd/routing/router_memory.hpp"

namespace ingressd::routing {
namespace {

using kind = router_reply::kind;

TEST(RouterReply, LLMRouterReplyPins) {
  auto r = parse_router_reply(200, R"({"host":"10.0.0.1","port":30001,"replica_id":"SERVE_REPLICA::llm#LLMServer#ab12"})");
  EXPECT_EQ(r.what, kind::pinned);
  EXPECT_EQ(r.replica_id, "SERVE_REPLICA::llm#LLMServer#ab12");
  EXPECT_TRUE(r.request_headers.empty());
}

TEST(RouterReply, EscapedQuotesInReplicaIdAreDecoded) {
  auto r = parse_router_reply(200, R"({"replica_id":"a\"b"})");
  EXPECT_EQ(r.what, kind::pinned);
  EXPECT_EQ(r.replica_id, "a\"b");
}

TEST(RouterReply, Non200IsFinalWhateverTheBody) {
  EXPECT_EQ(parse_router_reply(503, R"({"replica_id":"x"})").what, kind::non_200);
  EXPECT_EQ(parse_router_reply(404, "").what, kind::non_200);
  EXPECT_EQ(parse_router_reply(201, R"({"replica_id":"x"})").what, kind::non_200);
}

TEST(RouterReply, UnusableBodiesAreUnparseable) {
  for (const char* body : {"", "not json", "[]", R"({"replica":"x"})", R"({"replica_id":7})",
                           R"({"replica_id":""})", R"({"replica_id":null})", R"("replica_id")",
                           R"({"replica_id":"x"} trailing)"}) {
    EXPECT_EQ(parse_router_reply(200, body).what, kind::unparseable) << body;
  }
}

TEST(RouterReply, RequestHeadersAreReturnedInOrder) {
  auto r = parse_router_reply(200, R"({"replica_id":"x","request_headers":{"serve_multiplexed_model_id":"m1","x-a":"b"}})");
  ASSERT_EQ(r.what, kind::pinned);
  ASSERT_EQ(r.request_headers.size(), 2u);
  EXPECT_EQ(r.request_headers[0], (std::pair<std::string, std::string>{"serve_multiplexed_model_id", "m1"}));
  EXPECT_EQ(r.request_headers[1], (std::pair<std::string, std::string>{"x-a", "b"}));
}

TEST(RouterReply, UnsafeRequestHeadersMakeTheReplyUnusable) {
  EXPECT_EQ(parse_router_reply(200, R"({"replica_id":"x","request_headers":{"x-a":"b\r\nX-Evil: 1"}})").what,
            kind::unparseable);
  EXPECT_EQ(parse_router_reply(200, R"({"replica_id":"x","request_headers":{"bad name":"v"}})").what,
            kind::unparseable);
  // A non-string value is skipped (and counted), not the whole reply (issue #28 item 7).
  const auto odd = parse_router_reply(200, R"({"replica_id":"x","request_headers":{"x-a":5,"x-b":"ok","x-c":null,"x-d":{"n":1}}})");
  EXPECT_EQ(odd.what, kind::pinned);
  EXPECT_EQ(odd.replica_id, "x");
  ASSERT_EQ(odd.request_headers.size(), 1u);
  EXPECT_EQ(odd.request_headers[0].first, "x-b");
  EXPECT_EQ(odd.skipped_headers, 3u);
  EXPECT_EQ(parse_router_reply(200, R"({"replica_id":"x","request_headers":["x"]})").what, kind::unparseable);
  EXPECT_EQ(parse_router_reply(200, R"({"replica_id":"x","request_headers":null})").what, kind::pinned);
}

TEST(RouterReply, ProxyOwnedRequestHeadersAreDropped) {
  auto r = parse_router_reply(
      200, R"({"replica_id":"x","request_headers":{"Content-Length":"3","x-request-id":"r","Transfer-Encoding":"chunked","m":"1"}})");
  ASSERT_EQ(r.what, kind::pinned);
  ASSERT_EQ(r.request_headers.size(), 1u);
  EXPECT_EQ(r.request_headers[0].first, "m");
}

TEST(RouterRequest, ExactBytesWithoutBody) {
  auto bytes = build_router_request({"127.0.0.2:30004", "", std::nullopt, "x-session-id", "s1", "rid-1"});
  EXPECT_EQ(bytes,
            "POST /internal/route HTTP/1.1\r\n"
            "Host: 127.0.0.2:30004\r\n"
            "Content-Type: application/json\r\n"
            "Content-Length: 0\r\n"
            "x-session-id: s1\r\n"
            "X-Request-Id: rid-1\r\n\r\n");
}

TEST(RouterRequest, TruncatedBodyIsMarked) {
  auto bytes = build_router_request({"h:1", "{\"a\":", 400000, "", "", "r"});
  EXPECT_NE(bytes.find("Content-Length: 5\r\n"), std::string::npos);
  EXPECT_NE(bytes.find("X-Body-Truncated: 5/400000\r\n"), std::string::npos);
  EXPECT_EQ(bytes.substr(bytes.size() - 5), "{\"a\":");
}

TEST(RouterRequest, NoSessionHeaderWhenClientSentNone) {
  auto bytes = build_router_request({"h:1", "", std::nullopt, "x-session-id", "", "r"});
  EXPECT_EQ(bytes.find("x-session-id"), std::string::npos);
}

TEST(RouterMemory, FailedRouterIsDownThenProbedWithGrowingBackoff) {
  using namespace std::chrono_literals;
  router_memory m(500ms, 4s);
  const auto t0 = router_memory::clock::time_point{} + 100s;
  EXPECT_EQ(m.get("a", t0), router_memory::state::up);
  m.failed("a", t0);
  EXPECT_EQ(m.get("a", t0 + 499ms), router_memory::state::down);
  EXPECT_EQ(m.get("a", t0 + 500ms), router_memory::state::probe);
  m.failed("a", t0 + 500ms);  // second failure: 1s
  EXPECT_EQ(m.get("a", t0 + 1499ms), router_memory::state::down);
  EXPECT_EQ(m.get("a", t0 + 1500ms), router_memory::state::probe);
  for (int i = 0; i < 10; ++i) m.failed("a", t0 + 2s);  // capped
  EXPECT_EQ(m.get("a", t0 + 5999ms), router_memory::state::down);
  EXPECT_EQ(m.get("a", t0 + 6s), router_memory::state::probe);
  m.replied("a");
  EXPECT_EQ(m.get("a", t0 + 6s), router_memory::state::up);
  EXPECT_EQ(m.get("b", t0), router_memory::state::up);
}

TEST(RouterMemory, ProbingHoldsOthersBack) {
  using namespace std::chrono_literals;
  router_memory m(500ms, 4s);
  const auto t0 = router_memory::clock::time_point{} + 100s;
  m.failed("a", t0);
  ASSERT_EQ(m.get("a", t0 + 600ms), router_memory::state::probe);
  m.probing("a", t0 + 600ms);
  EXPECT_EQ(m.get("a", t0 + 700ms), router_memory::state::down);
}

TEST(RouterMemory, ARouterThatKeepsLosingRacesIsSlowForAWhile) {
  using namespace std::chrono_literals;
  router_memory m;
  const auto t0 = router_memory::clock::time_point{} + 100s;
  for (unsigned i = 1; i < router_memory::slow_after; ++i) {
    m.lost("a", t0);
    EXPECT_EQ(m.get("a", t0), router_memory::state::up) << i << " losses are bad luck";
  }
  m.lost("a", t0);
  EXPECT_EQ(m.get("a", t0), router_memory::state::slow);
  EXPECT_EQ(m.get("a", t0 + router_memory::slow_for - 1ms), router_memory::state::slow);
  // Then it gets its turns again; one more loss and it is slow at once, for another while.
  const auto t1 = t0 + router_memory::slow_for;
  EXPECT_EQ(m.get("a", t1), router_memory::state::up);
  m.lost("a", t1);
  EXPECT_EQ(m.get("a", t1 + router_memory::slow_for - 1ms), router_memory::state::slow);
  // A reply (a race won, or a call not hedged) clears it.
  m.replied("a");
  EXPECT_EQ(m.get("a", t1), router_memory::state::up);
  m.lost("a", t1);
  EXPECT_EQ(m.get("a", t1), router_memory::state::up);
}

TEST(RouterMemory, AFailureOutranksSlowness) {
  using namespace std::chrono_literals;
  router_memory m(500ms, 4s);
  const auto t0 = router_memory::clock::time_point{} + 100s;
  for (unsigned i = 0; i < router_memory::slow_after; ++i) m.lost("a", t0);
  m.failed("a", t0);
  EXPECT_EQ(m.get("a", t0 + 100ms), router_memory::state::down);
  EXPECT_EQ(m.get("a", t0 + 500ms), router_memory::state::probe);
}

TEST(RouterMemory, RetainDropsRemovedRouters) {
  router_memory m;
  m.failed("a", {});
  m.failed("b", {});
  m.retain([](const std::string& k) { return k == "b"; });
  EXPECT_EQ(m.size(), 1u);
}

}  // namespace
}  // namespace ingressd::routing
