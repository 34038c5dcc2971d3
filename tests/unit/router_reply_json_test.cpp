// The hand-written JSON reader behind parse_router_reply against the nlohmann::json reference
// (tests/fakes/router_reply_reference.hpp): same kind, replica id and headers for every input.
// Tricky inputs are listed; more come from seeded random edits of them (the fuzz target
// tests/fuzz/router_reply_fuzz.cpp explores further in CI).
#include <gtest/gtest.h>

#include <random>
#include <string>
#include <vector>

#include "fakes/router_reply_reference.hpp"
#include "ingressd/routing/router_reply.hpp"

namespace ingressd::routing {
namespace {

using namespace std::string_literals;

::testing::AssertionResult same(std::string_view body) {
  const auto fast = parse_router_reply(200, body);
  const auto ref = reference::parse_router_reply(200, body);
  // Headers mean something only in a pinned reply (an unusable one may carry a partial list).
  const bool same_headers = fast.what != router_reply::kind::pinned ||
                            (fast.request_headers == ref.request_headers && fast.skipped_headers == ref.skipped_headers);
  if (fast.what == ref.what && fast.replica_id == ref.replica_id && same_headers)
    return ::testing::AssertionSuccess();
  return ::testing::AssertionFailure() << "kind " << static_cast<int>(fast.what) << " vs reference "
                                       << static_cast<int>(ref.what) << ", id '" << fast.replica_id << "' vs '"
                                       << ref.replica_id << "', " << fast.request_headers.size() << " vs "
                                       << ref.request_headers.size() << " headers";
}

const std::vector<std::string>& cases() {
  static const std::vector<std::string> all = {
      R"({"host":"10.0.0.1","port":30001,"replica_id":"SERVE_REPLICA::llm#LLMServer#ab12"})",
      R"({"replica_id":"x"})", R"( { "replica_id" : "x" } )", "{\"replica_id\":\"x\"}\n\r\t ",
      "", " ", "{", "}", "{}", "[]", "null", "\"x\"", "1", R"({"replica_id":"x"} trailing)",
      R"({"replica_id":"x"}{})", R"({"replica_id":"x",})", R"({,"replica_id":"x"})",
      R"({"replica_id" "x"})", R"({"replica_id":})", R"({replica_id:"x"})", R"({'replica_id':'x'})",
      R"({"replica_id":""})", R"({"replica_id":7})", R"({"replica_id":null})", R"({"replica_id":["x"]})",
      R"({"replica_id":"a","replica_id":"b"})", R"({"replica_id":"a","replica_id":1})",
      R"({"replica_id":1,"replica_id":"b"})", R"({"replica_id":"a","replica_id":""})",
      R"({"replica\u005fid":"x"})", R"({"replica_id":"a\"b\\c\/d\b\f\n\r\t"})",
      R"({"replica_id":"\u00e9\u4e2d\ud83d\ude00"})", R"({"replica_id":"\ud83d"})", R"({"replica_id":"\ude00"})",
      R"({"replica_id":"\ud83dx"})", R"({"replica_id":"\ud83d\u0041"})", R"({"replica_id":"\u00"})",
      R"({"replica_id":"\uZZZZ"})", R"({"replica_id":"\x"})", R"({"replica_id":"\u0000"})",
      "{\"replica_id\":\"caf\xC3\xA9\"}", "{\"replica_id\":\"\xC3\"}", "{\"replica_id\":\"\xC0\xAF\"}",
      "{\"replica_id\":\"\xE0\x80\xAF\"}", "{\"replica_id\":\"\xED\xA0\x80\"}", "{\"replica_id\":\"\xF4\x90\x80\x80\"}",
      "{\"replica_id\":\"\xF0\x9F\x98\x80\"}", "{\"replica_id\":\"\xFF\"}", "{\"replica_id\":\"a\x01\"}",
      "{\"replica_id\":\"a\x7F\"}", "{\"replica_id\":\"a\tb\"}", "{\"replica_id\":\"x\"}\x00"s,
      "\xEF\xBB\xBF{\"replica_id\":\"x\"}", "\xEF\xBB{\"replica_id\":\"x\"}", " \xEF\xBB\xBF{\"replica_id\":\"x\"}",
      R"({"replica_id":"x","n":0})", R"({"replica_id":"x","n":-0})", R"({"replica_id":"x","n":01})",
      R"({"replica_id":"x","n":1.})", R"({"replica_id":"x","n":.5})", R"({"replica_id":"x","n":-})",
      R"({"replica_id":"x","n":1e})", R"({"replica_id":"x","n":1e+})", R"({"replica_id":"x","n":-1.5E-3})",
      R"({"replica_id":"x","n":1e999})", R"({"replica_id":"x","n":-1e999})", R"({"replica_id":"x","n":1e-999})",
      R"({"replica_id":"x","n":123456789012345678901234567890})", R"({"replica_id":"x","n":+1})",
      "{\"replica_id\":\"x\",\"n\":1" + std::string(400, '0') + "}", R"({"replica_id":"x","n":NaN})",
      R"({"replica_id":"x","b":true,"c":false,"d":null})", R"({"replica_id":"x","b":tru})",
      R"({"replica_id":"x","b":True})", R"({"replica_id":"x","a":[]})", R"({"replica_id":"x","a":[1,]})",
      R"({"replica_id":"x","a":[,1]})", R"({"replica_id":"x","a":[[[[{"b":[{}]}]]]]})",
      R"({"replica_id":"x","a":[[[[{"b":[{}]}]]]})", R"({"replica_id":"x","a":{"b":1,}})",
      R"({"replica_id":"x","a":{"b"}})", R"({"replica_id":"x","a":[1 2]})", R"({"replica_id":"x","a":{}})",
      "{\"replica_id\":\"x\",\"a\":" + std::string(300, '[') + std::string(300, ']') + "}",
      "{\"replica_id\":\"x\",\"a\":" + std::string(300, '[') + std::string(299, ']') + "}",
      R"({"replica_id":"x","request_headers":{"serve_multiplexed_model_id":"m1","x-a":"b"}})",
      R"({"replica_id":"x","request_headers":{"x-b":"1","x-a":"2","x-b":"3"}})",
      R"({"replica_id":"x","request_headers":{"X-A":"1","x-a":"2"}})",
      R"({"replica_id":"x","request_headers":{"x-a":"b\r\nX-Evil: 1"}})",
      R"({"replica_id":"x","request_headers":{"x-a":"b\u0000"}})",
      R"({"replica_id":"x","request_headers":{"bad name":"v"}})", R"({"replica_id":"x","request_headers":{"":"v"}})",
      R"({"replica_id":"x","request_headers":{"x-a":5}})", R"({"replica_id":"x","request_headers":{"x-a":null}})",
      R"({"replica_id":"x","request_headers":["x"]})", R"({"replica_id":"x","request_headers":"x"})",
      R"({"replica_id":"x","request_headers":null})", R"({"replica_id":"x","request_headers":{}})",
      R"({"replica_id":"x","request_headers":{"a":"1"},"request_headers":null})",
      R"({"replica_id":"x","request_headers":{"a":1},"request_headers":{"b":"2"}})",
      R"({"replica_id":"x","request_headers":{"b":"2"},"request_headers":{"a":1}})",
      R"({"replica_id":"x","request_headers":{"Content-Length":"3","x-request-id":"r","m":"1"}})",
      R"({"replica_id":"x","request_headers":{"x-a":"\u00e9","x\u002db":"v"}})",
      R"({"replica_id":"x","request_headers":{"x-a":"v",}})", R"({"replica_id":"x","request_headers":{"x-a"}})",
      R"({"replica_id":"x","request_headers":nul})", R"({"replica_id":"x","request_headers":{"a":"1"})",
      // found by router_reply_fuzz: a repeated header name whose last value is (not) a string
      R"({"replica_id":"x","request_headers":{"a":true,"a":"1"}})", R"({"replica_id":"x","request_headers":{"a":"1","a":true}})",
      // found by router_reply_fuzz: an unusable header after a usable one
      R"({"replica_id":"x","request_headers":{"serv99d":"m1","d":"x","request_headers":{"sx-a":"b","x-a":"c"}}})",
  };
  return all;
}

TEST(RouterReplyJson, AgreesWithNlohmannOnTrickyInputs) {
  for (const auto& body : cases()) EXPECT_TRUE(same(body)) << "body: " << body;
}

TEST(RouterReplyJson, AgreesWithNlohmannOnRandomEdits) {
  // Seeded: the same inputs on every run. Edits: replace, insert, delete a byte, or splice in a
  // JSON token, so that most inputs stay close to valid documents.
  std::mt19937 rng(20261201);
  static const std::vector<std::string> tokens = {"{", "}", "[", "]", ":", ",", "\"", "\\", "\\u", "\\ud83d",
                                                  "true", "null", "-", "1e9", ".", "\"replica_id\"",
                                                  "\"request_headers\"", "\xC3", "\xED\xA0\x80", " "};
  int disagreements = 0;
  for (int i = 0; i < 20000 && disagreements < 5; ++i) {
    std::string body = cases()[rng() % cases().size()];
    const int edits = 1 + static_cast<int>(rng() % 3);
    for (int e = 0; e < edits; ++e) {
      const std::size_t at = body.empty() ? 0 : rng() % (body.size() + 1);
      switch (rng() % 4) {
        case 0: if (at < body.size()) body[at] = static_cast<char>(rng() % 256); break;
        case 1: body.insert(at, 1, static_cast<char>(rng() % 256)); break;
        case 2: if (at < body.size()) body.erase(at, 1); break;
        default: body.insert(at, tokens[rng() % tokens.size()]); break;
      }
    }
    if (!same(body)) {
      ++disagreements;
      ADD_FAILURE() << "body: " << body << "\n" << same(body).message();
    }
  }
}

TEST(RouterReplyJson, TypicalReplyIsPinnedWithoutHeaders) {
  const auto r = parse_router_reply(200, R"({"host":"127.0.0.1","port":8000,"replica_id":"SERVE_REPLICA::a#B#c"})");
  EXPECT_EQ(r.what, router_reply::kind::pinned);
  EXPECT_EQ(r.replica_id, "SERVE_REPLICA::a#B#c");
  EXPECT_TRUE(r.request_headers.empty());
}

}  // namespace
}  // namespace ingressd::routing
