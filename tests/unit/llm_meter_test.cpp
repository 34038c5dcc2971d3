// http::llm_meter: SSE events and OpenAI-style usage read from a response body as it is relayed,
// the same whatever the reads' boundaries (issue #34).
#include "ingressd/http/llm_meter.hpp"

#include <gtest/gtest.h>

#include <string>

namespace ingressd::http {
namespace {

struct result {
  std::uint64_t events;
  std::optional<llm_usage> usage;
  std::size_t completed;  // events feed() reported, summed
};

result meter(std::string_view body, llm_meter::body kind = llm_meter::body::event_stream, std::size_t step = 0) {
  llm_meter m(kind);
  std::size_t completed = 0;
  if (step == 0) {
    completed = m.feed(body);
  } else {
    for (std::size_t i = 0; i < body.size(); i += step) completed += m.feed(body.substr(i, step));
  }
  return {m.events(), m.usage(), completed};
}

/// The same body at every split point (two reads) and byte by byte gives the same figures.
void same_at_every_split(std::string_view body, llm_meter::body kind, const result& want) {
  for (std::size_t cut = 0; cut <= body.size(); ++cut) {
    llm_meter m(kind);
    const auto n = m.feed(body.substr(0, cut)) + m.feed(body.substr(cut));
    EXPECT_EQ(m.events(), want.events) << "cut at " << cut;
    EXPECT_EQ(n, want.events) << "cut at " << cut;
    EXPECT_EQ(m.usage(), want.usage) << "cut at " << cut;
  }
  const auto bytewise = meter(body, kind, 1);
  EXPECT_EQ(bytewise.events, want.events);
  EXPECT_EQ(bytewise.usage, want.usage);
}

constexpr std::string_view openai_stream =
    "data: {\"id\":\"c1\",\"choices\":[{\"delta\":{\"content\":\"Hel\"}}],\"usage\":null}\n\n"
    "data: {\"id\":\"c1\",\"choices\":[{\"delta\":{\"content\":\"lo\"}}],\"usage\":null}\n\n"
    ": keep-alive comment\n\n"
    "data: {\"id\":\"c1\",\"choices\":[],\"usage\":{\"prompt_tokens\":9,\"completion_tokens\":12,"
    "\"total_tokens\":21}}\n\n"
    "data: [DONE]\n\n";

TEST(LlmMeter, OpenAiStreamEventsAndFinalUsage) {
  const result want{4, llm_usage{9, 12, 21}, 4};
  const auto r = meter(openai_stream);
  EXPECT_EQ(r.events, 4u);  // three chunks and [DONE]; the comment dispatches nothing
  EXPECT_EQ(r.completed, 4u);
  EXPECT_EQ(r.usage, (llm_usage{9, 12, 21}));
  same_at_every_split(openai_stream, llm_meter::body::event_stream, want);
}

TEST(LlmMeter, LineEndsCrLfAndCrCountTheSame) {
  std::string crlf(openai_stream), cr(openai_stream);
  for (std::size_t i = 0; (i = crlf.find('\n', i)) != std::string::npos; i += 2) crlf.replace(i, 1, "\r\n");
  for (auto& c : cr)
    if (c == '\n') c = '\r';
  same_at_every_split(crlf, llm_meter::body::event_stream, {4, llm_usage{9, 12, 21}, 4});
  same_at_every_split(cr, llm_meter::body::event_stream, {4, llm_usage{9, 12, 21}, 4});
}

TEST(LlmMeter, AnEventIsDispatchedAtTheBlankLineOnlyWithData) {
  EXPECT_EQ(meter("data: a\n").events, 0u);              // not ended yet
  EXPECT_EQ(meter("data: a\n\n").events, 1u);
  EXPECT_EQ(meter("data: a\ndata: b\ndata: c\n\n").events, 1u);  // multi-line data: one event
  EXPECT_EQ(meter("data\n\n").events, 1u);                // a bare data field (empty value)
  EXPECT_EQ(meter(": only a comment\n\n").events, 0u);
  EXPECT_EQ(meter("event: ping\nid: 7\nretry: 100\n\n").events, 0u);  // no data field
  EXPECT_EQ(meter("datum: x\n\ndata:x\n\n").events, 1u);
  EXPECT_EQ(meter("\n\n\n").events, 0u);
}

TEST(LlmMeter, UsageSplitOverDataLinesOfOneEvent) {
  constexpr std::string_view body =
      "data: {\"usage\":\n"
      "data: {\"prompt_tokens\": 5, \"completion_tokens\": 7}}\n\n";
  same_at_every_split(body, llm_meter::body::event_stream, {1, llm_usage{5, 7, 12}, 1});
}

TEST(LlmMeter, WhatIsNotAUsageObjectIsIgnored) {
  EXPECT_FALSE(meter("data: {\"usage\":null}\n\n").usage);
  EXPECT_FALSE(meter("data: {\"usage\":{\"cost\":3}}\n\n").usage);
  EXPECT_FALSE(meter("data: {\"text\":\"the \\\"usage\\\": {\\\"prompt_tokens\\\": 3}\"}\n\n").usage);
  EXPECT_FALSE(meter("event: usage\ndata: x\n\n").usage);
  // Longer than any reply's usage object: not taken (and nothing else breaks).
  const auto big = "data: {\"usage\":{\"prompt_tokens\":1,\"pad\":\"" + std::string(600, 'x') + "\"}}\n\ndata: y\n\n";
  const auto r = meter(big);
  EXPECT_FALSE(r.usage);
  EXPECT_EQ(r.events, 2u);
  // An object left open at the event's end does not swallow the next event's.
  const auto r2 = meter("data: {\"usage\":{\"prompt_tokens\":1\n\ndata: {\"usage\":{\"prompt_tokens\":2}}\n\n");
  EXPECT_EQ(r2.usage, (llm_usage{2, 0, 2}));
}

TEST(LlmMeter, JsonReplyUsage) {
  constexpr std::string_view body =
      "{\"id\":\"c2\",\"object\":\"chat.completion\",\"choices\":[{\"message\":{\"role\":\"assistant\","
      "\"content\":\"{\\\"usage\\\": 1} is text\"}}],\n  \"usage\" : { \"prompt_tokens\" : 31 ,"
      "\"completion_tokens\":40,\"total_tokens\":71,\"prompt_tokens_details\":{\"cached_tokens\":0}}}";
  const result want{0, llm_usage{31, 40, 71}, 0};
  same_at_every_split(body, llm_meter::body::json, want);
}

TEST(LlmMeter, TenThousandEvents) {
  std::string body;
  for (int i = 0; i < 10000; ++i) body += "data: {\"choices\":[{\"delta\":{\"content\":\"tok" + std::to_string(i) + "\"}}]}\n\n";
  body += "data: {\"choices\":[],\"usage\":{\"prompt_tokens\":100,\"completion_tokens\":10000,\"total_tokens\":10100}}\n\n";
  for (std::size_t step : {std::size_t{0}, std::size_t{1}, std::size_t{7}, std::size_t{4096}}) {
    const auto r = meter(body, llm_meter::body::event_stream, step);
    EXPECT_EQ(r.events, 10001u) << step;
    EXPECT_EQ(r.completed, 10001u) << step;
    EXPECT_EQ(r.usage, (llm_usage{100, 10000, 10100})) << step;
  }
}

}  // namespace
}  // namespace ingressd::http
