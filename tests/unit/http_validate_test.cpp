// Request validation, table-driven (include/ingressd/http/validate.hpp; hardening A, B, D, E):
// raw bytes in → the status the session answers with (0 = accepted), exactly as the session
// reads them (Beast with guarded_parser, leading empty lines skipped, then check_request_head).
// Row ids refer to /work/shared/reference/hardening.md §1.2.
#include "ingressd/http/validate.hpp"

#include <gtest/gtest.h>

#include <string>
#include <string_view>
#include <vector>

#include <boost/asio/buffer.hpp>
#include <boost/beast/http/empty_body.hpp>
#include <boost/beast/http/string_body.hpp>

#include "ingressd/http/parse_guards.hpp"

namespace ingressd {
namespace {

using http::evaluate_request;

/// 0 with `complete` = accepted and whole; `incomplete` = no verdict yet (waits for more bytes).
constexpr unsigned accept = 0;
constexpr unsigned incomplete = 1;

struct row {
  std::string name;
  std::string bytes;
  unsigned expect;  // accept, incomplete or a status
};

std::string post(std::string_view fields, std::string_view body = {}) {
  std::string s = "POST /v1/x HTTP/1.1\r\nHost: a\r\n";
  s.append(fields).append("\r\n").append(body);
  return s;
}
std::string get(std::string_view target, std::string_view version = "HTTP/1.1") {
  return "GET " + std::string(target) + " " + std::string(version) + "\r\nHost: a\r\n\r\n";
}

void run(const std::vector<row>& rows, std::size_t header_limit = 8192, std::uint64_t body_limit = 1024 * 1024) {
  for (const auto& r : rows) {
    SCOPED_TRACE(r.name);
    auto ev = evaluate_request(r.bytes, header_limit, body_limit);
    ASSERT_NE(ev.status, 0xdeadu) << "the parser threw";
    if (r.expect == accept) {
      EXPECT_EQ(ev.status, 0u) << ev.why;
      EXPECT_TRUE(ev.complete) << "an accepted request must parse to its end";
    } else if (r.expect == incomplete) {
      EXPECT_EQ(ev.status, 0u) << ev.why;
      EXPECT_FALSE(ev.complete);
    } else {
      EXPECT_EQ(ev.status, r.expect) << ev.why;
    }
  }
}

const std::string chunked_hello = "5\r\nhello\r\n0\r\n\r\n";

TEST(HttpValidate, A1_ContentLengthWithTransferEncoding) {
  run({
      {"CL then TE", post("Content-Length: 5\r\nTransfer-Encoding: chunked\r\n", chunked_hello), 400},
      {"TE then CL", post("Transfer-Encoding: chunked\r\nContent-Length: 5\r\n", chunked_hello), 400},
      {"TE gzip then CL", post("Transfer-Encoding: gzip\r\nContent-Length: 5\r\n", "hello"), 400},
      {"CL then TE gzip", post("Content-Length: 5\r\nTransfer-Encoding: gzip\r\n", "hello"), 400},
      {"far apart", post("Transfer-Encoding: chunked\r\nX-A: 1\r\nX-B: 2\r\nContent-Length: 5\r\n", chunked_hello), 400},
  });
}

TEST(HttpValidate, A2_A3_RepeatedContentLength) {
  run({
      {"different lines", post("Content-Length: 5\r\nContent-Length: 6\r\n", "hello!"), 400},
      {"different list", post("Content-Length: 5, 6\r\n", "hello!"), 400},
      // Beast collapses identical values; ingressd refuses them (one policy: a repeated CL is
      // always 400).
      {"identical lines", post("Content-Length: 5\r\nContent-Length: 5\r\n", "hello"), 400},
      {"identical list", post("Content-Length: 5, 5\r\n", "hello"), 400},
      {"zero twice", post("Content-Length: 0\r\nContent-Length: 0\r\n"), 400},
      {"single", post("Content-Length: 5\r\n", "hello"), accept},
  });
}

TEST(HttpValidate, A4_ContentLengthSyntax) {
  run({
      {"empty", post("Content-Length:\r\n"), 400},
      {"plus", post("Content-Length: +5\r\n", "hello"), 400},
      {"hex", post("Content-Length: 0x10\r\n", "0123456789abcdef"), 400},
      {"two numbers", post("Content-Length: 5 5\r\n", "hello"), 400},
      {"negative", post("Content-Length: -1\r\n"), 400},
      {"underscore", post("Content-Length: 1_0\r\n", "hellohello"), 400},
      {"leading zeros are digits", post("Content-Length: 005\r\n", "hello"), accept},
      {"OWS around", post("Content-Length: \t5 \r\n", "hello"), accept},
  });
}

TEST(HttpValidate, A5_HugeNumbers) {
  run({
      {"CL overflows 64 bits", post("Content-Length: 99999999999999999999\r\n"), 400},
      {"CL 2^64", post("Content-Length: 18446744073709551616\r\n"), 400},
      {"CL 2^64-1 over the body limit", post("Content-Length: 18446744073709551615\r\n"), 413},
      {"chunk size over 16 hex digits", post("Transfer-Encoding: chunked\r\n", "fffffffffffffffff\r\nhello\r\n0\r\n\r\n"), 400},
      {"chunk size 2^64-1", post("Transfer-Encoding: chunked\r\n", "ffffffffffffffff\r\nhello\r\n0\r\n\r\n"), 413},
  });
}

TEST(HttpValidate, A6_TransferEncodingOtherThanChunked) {
  run({
      {"chunked", post("Transfer-Encoding: chunked\r\n", chunked_hello), accept},
      {"Chunked (case)", post("Transfer-Encoding: Chunked\r\n", chunked_hello), accept},
      {"OWS", post("Transfer-Encoding: \t chunked \t\r\n", chunked_hello), accept},
      // Beast reads these as not chunked: the body would be read as the next request.
      {"chunked, chunked", post("Transfer-Encoding: chunked, chunked\r\n", chunked_hello), 400},
      {"chunked, gzip", post("Transfer-Encoding: chunked, gzip\r\n", chunked_hello), 400},
      {"gzip", post("Transfer-Encoding: gzip\r\n", "hello"), 400},
      {"xchunked", post("Transfer-Encoding: xchunked\r\n", chunked_hello), 400},
      {"identity", post("Transfer-Encoding: identity\r\n"), 400},
      {"empty", post("Transfer-Encoding:\r\n"), 400},
      {"trailing comma", post("Transfer-Encoding: chunked,\r\n", chunked_hello), 400},
      {"leading comma", post("Transfer-Encoding: , chunked\r\n", chunked_hello), 400},
      // Beast de-chunks these; ingressd does not implement gzip or parameters.
      {"gzip, chunked", post("Transfer-Encoding: gzip, chunked\r\n", chunked_hello), 501},
      {"chunked;ext=v", post("Transfer-Encoding: chunked;a=b\r\n", chunked_hello), 400},
      {"two lines gzip+chunked", post("Transfer-Encoding: gzip\r\nTransfer-Encoding: chunked\r\n", chunked_hello), 400},
      {"two lines chunked twice", post("Transfer-Encoding: chunked\r\nTransfer-Encoding: chunked\r\n", chunked_hello), 400},
      {"space before colon", post("Transfer-Encoding : chunked\r\n", chunked_hello), 400},
      {"split by obs-fold", post("Transfer-Encoding:\r\n chunked\r\n", chunked_hello), 400},
  });
}

TEST(HttpValidate, A7_TransferEncodingOnHttp10) {
  run({
      {"TE on 1.0", "POST / HTTP/1.0\r\nTransfer-Encoding: chunked\r\n\r\n" + chunked_hello, 400},
      {"TE and CL on 1.0", "POST / HTTP/1.0\r\nTransfer-Encoding: chunked\r\nContent-Length: 5\r\n\r\nhello", 400},
      {"CL on 1.0", "POST / HTTP/1.0\r\nContent-Length: 5\r\n\r\nhello", accept},
  });
}

TEST(HttpValidate, A8_BareLineFeed) {
  run({
      {"everywhere", "POST / HTTP/1.1\nHost: a\nContent-Length: 5\n\nhello", 400},
      {"request line", "POST / HTTP/1.1\nHost: a\r\nContent-Length: 5\r\n\r\nhello", 400},
      {"header line", post("X: y\nContent-Length: 5\r\n", "hello"), 400},
      {"final empty line", "POST / HTTP/1.1\r\nHost: a\r\nContent-Length: 5\r\n\nhello", 400},
      {"chunk-size line", post("Transfer-Encoding: chunked\r\n", "5\nhello\r\n0\r\n\r\n"), 400},
      {"after chunk data", post("Transfer-Encoding: chunked\r\n", "5\r\nhello\n0\r\n\r\n"), 400},
      // Beast waits for a CRLF that never comes; a whole chunk line it cannot decide is refused
      // (http::malformed_chunk_line) instead of waiting for the session's body timer.
      {"last chunk", post("Transfer-Encoding: chunked\r\n", "5\r\nhello\r\n0\n\r\n"), 400},
      // Beast waits for a CRLF CRLF after the last chunk that such a client never sends: each of
      // these got no answer until the body timer (60 s, then 408) while the replica held a
      // half-received request (issue #29 item 2). Now refused at once.
      {"last chunk and final line", post("Transfer-Encoding: chunked\r\n", "5\r\nhello\r\n0\n\n"), 400},
      {"only a last chunk, LF LF", post("Transfer-Encoding: chunked\r\n", "0\n\n"), 400},
      {"final CRLF", post("Transfer-Encoding: chunked\r\n", "5\r\nhello\r\n0\r\n\n"), 400},
      {"after a trailer", post("Transfer-Encoding: chunked\r\n", "5\r\nhello\r\n0\r\nX-T: 1\n\r\n"), 400},
      {"after the trailers", post("Transfer-Encoding: chunked\r\n", "5\r\nhello\r\n0\r\nX-T: 1\r\n\n"), 400},
      {"LF only, everywhere", post("Transfer-Encoding: chunked\r\n", "5\nhello\n0\n\n"), 400},
      {"bare CR after the last chunk", post("Transfer-Encoding: chunked\r\n", "5\r\nhello\r\n0\r\rX"), 400},
      // Still waiting, not refused: a CRLF split across reads, a trailer section not ended yet.
      {"CR of the last CRLF only", post("Transfer-Encoding: chunked\r\n", "5\r\nhello\r\n0\r\n\r"), incomplete},
      {"trailer not ended", post("Transfer-Encoding: chunked\r\n", "5\r\nhello\r\n0\r\nX-T: 1\r\n"), incomplete},
      {"last chunk line not ended", post("Transfer-Encoding: chunked\r\n", "5\r\nhello\r\n0"), incomplete},
  });
}

TEST(HttpValidate, A8_MalformedChunkLineDecidesEveryLineEnd) {
  // http::malformed_chunk_line on its own: what follows a chunk's data, as the session holds it.
  EXPECT_FALSE(http::malformed_chunk_line("\r\n0\r\n\r\n"));
  EXPECT_FALSE(http::malformed_chunk_line("\r\n5\r\nhel"));
  EXPECT_FALSE(http::malformed_chunk_line("\r\n0\r\nX: 1\r\n"));
  EXPECT_FALSE(http::malformed_chunk_line("\r\n10"));
  EXPECT_TRUE(http::malformed_chunk_line("\r\n5\nhello"));
  EXPECT_TRUE(http::malformed_chunk_line("\r\n0\n\n"));
  EXPECT_TRUE(http::malformed_chunk_line("\r\n0\r\n\n"));
  EXPECT_TRUE(http::malformed_chunk_line("\r\n00;a=b\r\nX: 1\n\r\n"));
  EXPECT_TRUE(http::malformed_chunk_line("\n0\r\n\r\n"));
  // A non-last chunk's data may hold anything: only its size line is looked at.
  EXPECT_FALSE(http::malformed_chunk_line("\r\n10\r\nline one\nline two"));
}

TEST(HttpValidate, A17_UnderscoreTwinsOfFramingHeadersAreRefused) {
  // Backends that fold `_` into `-` (CGI/WSGI-style) read these as the real header and frame the
  // body differently from ingressd (issue #29 item 1): refused, whatever their value.
  run({
      {"Transfer_Encoding beside Content-Length",
       post("Content-Length: 51\r\nTransfer_Encoding: chunked\r\n",
            "0\r\n\r\nGET /smuggled HTTP/1.1\r\nHost: a\r\nX: 123456789\r\n"), 400},
      {"Transfer_Encoding alone", post("Transfer_Encoding: chunked\r\n", chunked_hello), 400},
      {"Content_Length alone", post("Content_Length: 5\r\n", "hello"), 400},
      {"lower case", post("content_length: 5\r\nContent-Length: 5\r\n", "hello"), 400},
      {"Keep_Alive", post("Keep_Alive: 5\r\nContent-Length: 0\r\n"), 400},
      {"Proxy_Connection", post("Proxy_Connection: close\r\nContent-Length: 0\r\n"), 400},
      {"HTTP2_Settings", post("HTTP2_Settings: AAA\r\nContent-Length: 0\r\n"), 400},
      {"X_Forwarded_For", post("X_Forwarded_For: 1.2.3.4\r\nContent-Length: 0\r\n"), 400},
      {"X-Forwarded_Proto", post("X-Forwarded_Proto: https\r\nContent-Length: 0\r\n"), 400},
      // Other names with `_` are fine: Ray's session header may be spelled x_session_id.
      {"x_session_id", post("x_session_id: abc\r\nContent-Length: 0\r\n"), accept},
      {"Content_Type", post("Content_Type: text/plain\r\nContent-Length: 0\r\n"), accept},
      {"Content_Lengthy", post("Content_Lengthy: 5\r\nContent-Length: 0\r\n"), accept},
  });
}

TEST(HttpValidate, A9_BareCarriageReturnNulAndControls) {
  run({
      {"CR in value", post("X: a\rb\r\n"), 400},
      {"CR in name", post("X\r: ab\r\n"), 400},
      {"CR in target", "GET /a\rb HTTP/1.1\r\nHost: a\r\n\r\n", 400},
      {"NUL in value", post(std::string_view("X: a\0b\r\n", 8)), 400},
      {"NUL in name", post(std::string_view("X\0: ab\r\n", 8)), 400},
      {"0x01 in value", post("X: a\x01" "b\r\n"), 400},
      {"DEL in value", post("X: a\x7f" "b\r\n"), 400},
      {"HTAB in value is legal", post("X: a\tb\r\n"), accept},
      {"obs-text in value is legal", post("X: a\x80" "b\r\n"), accept},
  });
}

TEST(HttpValidate, A10_ChunkExtensions) {
  run({
      {"ignored", post("Transfer-Encoding: chunked\r\n", "5;a=b\r\nhello\r\n0;c\r\n\r\n"), accept},
      {"quoted", post("Transfer-Encoding: chunked\r\n", "5;a=\"b;c\"\r\nhello\r\n0\r\n\r\n"), accept},
      {"bare CR inside", post("Transfer-Encoding: chunked\r\n", "5;a=b\rc\r\nhello\r\n0\r\n\r\n"), 400},
      {"CR before ;", post("Transfer-Encoding: chunked\r\n", "5\r;a=b\r\nhello\r\n0\r\n\r\n"), 400},
      {"not a token", post("Transfer-Encoding: chunked\r\n", "5;@@\r\nhello\r\n0\r\n\r\n"), 400},
      {"space after size", post("Transfer-Encoding: chunked\r\n", "5 \r\nhello\r\n0\r\n\r\n"), 400},
      {"0x prefix", post("Transfer-Encoding: chunked\r\n", "0x5\r\nhello\r\n0\r\n\r\n"), 400},
  });
}

TEST(HttpValidate, A11_TrailersAreParsedBoundedAndNeverThrow) {
  run({
      {"trailer", post("Transfer-Encoding: chunked\r\n", "5\r\nhello\r\n0\r\nX-T: 1\r\n\r\n"), accept},
      {"CL in trailer", post("Transfer-Encoding: chunked\r\n", "5\r\nhello\r\n0\r\nContent-Length: 99\r\n\r\n"), 400},
      // Beast 1.81 applies no limit to trailers and its field storage throws std::length_error
      // for a value over 65533 bytes; guarded_parser turns that into a refusal.
      {"70000-byte trailer value",
       post("Transfer-Encoding: chunked\r\n", "5\r\nhello\r\n0\r\nX-T: " + std::string(70000, 'a') + "\r\n\r\n"), 400},
  });

  // Trailer fields are dropped, never merged into the header section.
  http::guarded_parser<true, boost::beast::http::string_body> p;
  p.eager(true);
  const std::string raw = post("Transfer-Encoding: chunked\r\n", "5\r\nhello\r\n0\r\nX-Trailer: 1\r\n\r\n");
  boost::system::error_code ec;
  p.put(boost::asio::buffer(raw), ec);
  ASSERT_FALSE(ec) << ec.message();
  ASSERT_TRUE(p.is_done());
  EXPECT_EQ(p.get().body(), "hello");
  EXPECT_EQ(p.get().count("x-trailer"), 0u);
}

TEST(HttpValidate, A12_A13_ObsFold) {
  run({
      {"whitespace line after request line", "GET / HTTP/1.1\r\n \r\nHost: a\r\n\r\n", 400},
      {"first field folded", "GET / HTTP/1.1\r\n X: y\r\nHost: a\r\n\r\n", 400},
      {"obs-fold", post("X: a\r\n b\r\n"), 400},
      {"obs-fold with tab", post("X: a\r\n\tb\r\n"), 400},
      {"obs-fold of Content-Length", post("Content-Length: 5\r\n 6\r\n", "hello"), 400},
  });
}

TEST(HttpValidate, A14_HeaderNames) {
  run({
      {"@", post("X@Y: y\r\n"), 400},
      {"(", post("X(Y: y\r\n"), 400},
      {"empty name", post(": y\r\n"), 400},
      {"no colon", post("Xyz\r\n"), 400},
      {"space in name", post("X Y: y\r\n"), 400},
  });
  // A field longer than Beast's 16-bit field storage, under a large configured header limit:
  // refused as too large (431) instead of throwing.
  run({{"70000-byte value", post("X: " + std::string(70000, 'a') + "\r\n"), 431},
       {"70000-byte name", post(std::string(70000, 'n') + ": v\r\n"), 431}},
      1024 * 1024);
}

TEST(HttpValidate, A16_ExtraBytesAfterARequestStayUnconsumed) {
  const std::string first = "POST / HTTP/1.1\r\nHost: a\r\nContent-Length: 0\r\nConnection: close\r\n\r\n";
  auto ev = evaluate_request(first + "GET /smuggled HTTP/1.1\r\nHost: a\r\n\r\n");
  EXPECT_EQ(ev.status, 0u);
  EXPECT_TRUE(ev.complete);
  EXPECT_EQ(ev.consumed, first.size());
}

TEST(HttpValidate, B1_B2_B3_HeadLimits) {
  std::string many;
  for (int i = 0; i < 101; ++i) many += "X-" + std::to_string(i) + ": v\r\n";
  std::string hundred;
  for (int i = 0; i < 99; ++i) hundred += "X-" + std::to_string(i) + ": v\r\n";  // + Host = 100
  run({
      {"header section over the limit", post("X: " + std::string(9000, 'a') + "\r\n"), 431},
      {"101 fields", "GET / HTTP/1.1\r\nHost: a\r\n" + many + "\r\n", 431},
      {"100 fields", "GET / HTTP/1.1\r\nHost: a\r\n" + hundred + "\r\n", accept},
      {"request line over the limit", get("/" + std::string(9000, 'a')), 414},
      {"long target within the limit", get("/" + std::string(7000, 'a')), accept},
  });
}

TEST(HttpValidate, B4_B5_BodyLimits) {
  run(
      {
          {"declared over the limit", post("Content-Length: 2000\r\n"), 413},
          {"declared at the limit", post("Content-Length: 1024\r\n", std::string(1024, 'x')), accept},
          {"chunked growing over the limit",
           post("Transfer-Encoding: chunked\r\n", "400\r\n" + std::string(1024, 'x') + "\r\n1\r\ny\r\n0\r\n\r\n"), 413},
      },
      8192, 1024);
}

TEST(HttpValidate, D1_D2_Methods) {
  run({
      {"G=T", "G=T / HTTP/1.1\r\nHost: a\r\n\r\n", 400},
      {"NUL", std::string("GET\0 / HTTP/1.1\r\nHost: a\r\n\r\n", 28), 400},
      {"empty", " / HTTP/1.1\r\nHost: a\r\n\r\n", 400},
      // Every method token is forwarded, as Ray's proxies do (issue #28 item 7); CONNECT is not.
      {"lowercase get is another method", "get / HTTP/1.1\r\nHost: a\r\n\r\n", accept},
      {"FOO", "FOO / HTTP/1.1\r\nHost: a\r\n\r\n", accept},
      {"TRACE", "TRACE / HTTP/1.1\r\nHost: a\r\n\r\n", accept},
      {"CONNECT origin-form", "CONNECT /x HTTP/1.1\r\nHost: a\r\n\r\n", 501},
      {"CONNECT authority-form", "CONNECT a:443 HTTP/1.1\r\nHost: a\r\n\r\n", 400},
      {"PROPFIND", "PROPFIND / HTTP/1.1\r\nHost: a\r\n\r\n", accept},
      {"M-SEARCH", "M-SEARCH / HTTP/1.1\r\nHost: a\r\n\r\n", accept},
      {"GET", "GET / HTTP/1.1\r\nHost: a\r\n\r\n", accept},
      {"HEAD", "HEAD / HTTP/1.1\r\nHost: a\r\n\r\n", accept},
      {"POST", "POST / HTTP/1.1\r\nHost: a\r\nContent-Length: 0\r\n\r\n", accept},
      {"PUT", "PUT / HTTP/1.1\r\nHost: a\r\nContent-Length: 0\r\n\r\n", accept},
      {"DELETE", "DELETE / HTTP/1.1\r\nHost: a\r\n\r\n", accept},
      {"OPTIONS", "OPTIONS / HTTP/1.1\r\nHost: a\r\n\r\n", accept},
      {"PATCH", "PATCH / HTTP/1.1\r\nHost: a\r\nContent-Length: 0\r\n\r\n", accept},
  });
}

TEST(HttpValidate, D3_D4_TargetForms) {
  run({
      {"* with GET", get("*"), 400},
      {"* with OPTIONS (not served)", "OPTIONS * HTTP/1.1\r\nHost: a\r\n\r\n", 400},
      {"*/test", get("*/test"), 400},
      {"no leading slash", get("admin"), 400},
      {"authority-form", get("a:80"), 400},
      {"absolute-form", get("http://a/x"), 400},
      {"origin-form", get("/v1/chat/completions?x=1"), accept},
  });
}

TEST(HttpValidate, D5_Host) {
  run({
      {"missing on 1.1", "GET / HTTP/1.1\r\n\r\n", 400},
      {"missing on 1.0", "GET / HTTP/1.0\r\n\r\n", accept},
      {"two lines", "GET / HTTP/1.1\r\nHost: a\r\nHost: b\r\n\r\n", 400},
      {"two lines on 1.0", "GET / HTTP/1.0\r\nHost: a\r\nHost: a\r\n\r\n", 400},
      {"list", "GET / HTTP/1.1\r\nHost: a, b\r\n\r\n", 400},
      {"space", "GET / HTTP/1.1\r\nHost: a b\r\n\r\n", 400},
      {"userinfo", "GET / HTTP/1.1\r\nHost: u@a\r\n\r\n", 400},
      {"path", "GET / HTTP/1.1\r\nHost: a/b\r\n\r\n", 400},
      {"bad port", "GET / HTTP/1.1\r\nHost: a:8x\r\n\r\n", 400},
      {"port only", "GET / HTTP/1.1\r\nHost: :80\r\n\r\n", 400},
      {"unclosed IPv6", "GET / HTTP/1.1\r\nHost: [::1\r\n\r\n", 400},
      {"name and port", "GET / HTTP/1.1\r\nHost: example.com:8000\r\n\r\n", accept},
      {"IPv4", "GET / HTTP/1.1\r\nHost: 10.0.0.1\r\n\r\n", accept},
      {"IPv6 and port", "GET / HTTP/1.1\r\nHost: [::1]:8000\r\n\r\n", accept},
      {"empty", "GET / HTTP/1.1\r\nHost:\r\n\r\n", accept},
  });
}

TEST(HttpValidate, D6_TargetCharactersAndDotSegments) {
  run({
      {"fragment", get("/a#b"), 400},
      {"space", get("/a b"), 400},
      {"tab", get("/a\tb"), 400},
      {"control", get("/a\x01" "b"), 400},
      {"DEL", get("/a\x7f" "b"), 400},
      {"non-ASCII", get("/a\x80" "b"), 400},
      {"encoded dot-dot", get("/v1/%2e%2e/admin"), 400},
      {"encoded dot-dot upper", get("/v1/%2E%2E/admin"), 400},
      {"mixed dot-dot", get("/v1/.%2e/admin"), 400},
      {"dot-dot", get("/v1/../admin"), 400},
      {"dot", get("/v1/./x"), 400},
      {"trailing dot-dot", get("/v1/.."), 400},
      {"malformed percent", get("/a%zz"), 400},
      {"truncated percent", get("/a%2"), 400},
      {"encoded slash is data", get("/v1/models/meta-llama%2FLlama-3"), accept},
      {"dots inside a segment", get("/v1/file..txt/.well-known"), accept},
      {"anything in the query", get("/a?b=../c&d=%zz"), accept},
  });
}

TEST(HttpValidate, D7_Versions) {
  run({
      {"HTTP/2.0", get("/", "HTTP/2.0"), 505},
      {"HTTP/1.32", get("/", "HTTP/1.32"), 505},
      {"HTTP/1.2", get("/", "HTTP/1.2"), 505},
      {"HTTP/0.9", get("/", "HTTP/0.9"), 505},
      {"lowercase", get("/", "http/1.1"), 400},
      {"suffix", get("/", "HTTP/1.1x"), 400},
      {"trailing space", "GET / HTTP/1.1 \r\nHost: a\r\n\r\n", 400},
      {"no version (0.9 style)", "GET /\r\n\r\n", 400},
      {"HTTP/1.0", get("/", "HTTP/1.0"), accept},
  });
}

TEST(HttpValidate, D8_D9_FieldSyntax) {
  run({
      {"LF injected in value", post("X: a\nInjected: b\r\n"), 400},
      {"space before colon", post("Content-Length : 5\r\n", "hello"), 400},
      {"tab before colon", post("X\t: y\r\n"), 400},
  });
}

TEST(HttpValidate, D10_D11_D12_AcceptedShapes) {
  run({
      {"underscore in a name", "GET / HTTP/1.1\r\nHost: a\r\nx_session_id: 1\r\n\r\n", accept},
      {"GET with a body", "GET / HTTP/1.1\r\nHost: a\r\nContent-Length: 3\r\n\r\nabc", accept},
      {"one leading CRLF", "\r\n" + get("/"), accept},
      {"two leading CRLF", "\r\n\r\n" + get("/"), accept},
      {"leading bare LF", "\n" + get("/"), 400},
  });
  auto ev = evaluate_request("\r\n" + get("/"));
  EXPECT_EQ(ev.consumed, 2 + get("/").size());
}

TEST(HttpValidate, StatusForHeadErrorClassifiesBadVersion) {
  using boost::beast::http::error;
  EXPECT_EQ(http::status_for_head_error(error::bad_version, "", "GET / HTTP/2.0\r\n\r\n", 8192), 505u);
  EXPECT_EQ(http::status_for_head_error(error::bad_version, "", "GET /a b HTTP/1.1\r\n\r\n", 8192), 400u);
  EXPECT_EQ(http::status_for_head_error(error::bad_version, "", "GET / HTTP/1.1\n\n", 8192), 400u);
  EXPECT_EQ(http::status_for_head_error(error::header_limit, "", "GET /aaaaaaaa", 8), 414u);
  EXPECT_EQ(http::status_for_head_error(error::header_limit, "", "GET /\r\nX: aaaaaaaaaaaaa", 8), 431u);
  EXPECT_EQ(http::status_for_head_error(error::header_limit, "GET / HTTP/1.1\r\n", "X: aaaaaaaaaaaa", 8), 431u);
  EXPECT_EQ(http::status_for_head_error(error::body_limit, "", "", 8), 413u);
  EXPECT_EQ(http::status_for_head_error(error::bad_field, "", "", 8), 400u);
}

}  // namespace
}  // namespace ingressd

TEST(HttpValidate, IdempotentMethodsAreTheOnesRfc9110Names) {
  namespace bh = boost::beast::http;
  for (auto v : {bh::verb::get, bh::verb::head, bh::verb::options, bh::verb::trace, bh::verb::put, bh::verb::delete_})
    EXPECT_TRUE(ingressd::http::idempotent(v)) << bh::to_string(v);
  for (auto v : {bh::verb::post, bh::verb::patch, bh::verb::connect, bh::verb::unknown})
    EXPECT_FALSE(ingressd::http::idempotent(v)) << bh::to_string(v);
}
