// The upstream response parser of the relay path (include/ingressd/http/relay_parser.hpp): the
// head it writes for the client, the framing it refuses (hardening A2, A15, B6), and its body
// window. Sans-I/O: bytes are fed with put(), whole or split at every offset.
#include "ingressd/http/relay_parser.hpp"

#include <gtest/gtest.h>

#include "ingressd/http/message.hpp"

#include <string>
#include <string_view>

#include <boost/asio/buffer.hpp>
#include <boost/beast/http/error.hpp>

namespace ingressd {
namespace {

namespace bhttp = boost::beast::http;

TEST(WebSocketUpgrade, OnlyAnHttp11GetThatNamesWebsocketAndUpgrade) {
  auto fields = [](std::initializer_list<std::pair<bhttp::field, const char*>> l) {
    bhttp::fields f;
    for (const auto& [k, v] : l) f.insert(k, v);
    return f;
  };
  using bhttp::field;
  using bhttp::verb;
  const auto ws = fields({{field::upgrade, "websocket"}, {field::connection, "Upgrade"}});
  EXPECT_TRUE(http::websocket_upgrade(ws, verb::get, 11));
  EXPECT_TRUE(http::websocket_upgrade(fields({{field::upgrade, "foo, WebSocket"}, {field::connection, "keep-alive, upgrade"}}),
                                      verb::get, 11));
  EXPECT_FALSE(http::websocket_upgrade(ws, verb::post, 11));
  EXPECT_FALSE(http::websocket_upgrade(ws, verb::get, 10));
  EXPECT_FALSE(http::websocket_upgrade(fields({{field::upgrade, "h2c"}, {field::connection, "Upgrade"}}), verb::get, 11));
  EXPECT_FALSE(http::websocket_upgrade(fields({{field::upgrade, "websocket"}}), verb::get, 11));
  EXPECT_FALSE(http::websocket_upgrade(fields({{field::upgrade, "websocket"}, {field::connection, "close"}}),
                                       verb::get, 11));
  EXPECT_FALSE(http::websocket_upgrade(fields({{field::upgrade, "websockets"}, {field::connection, "upgrade"}}),
                                       verb::get, 11));
}

struct parsed {
  bool header_done = false;
  bool refused = false;  // Beast itself refused the bytes
  std::string head;
  std::string framing_error;
  std::string body;
};

/// Feeds `raw` in pieces of at most `step` bytes the way async_read does (unconsumed bytes stay
/// in front of the next piece), with a body window of `window` bytes that is emptied after every
/// put.
parsed feed(std::string_view raw, std::size_t step = 1 << 20, std::size_t window = 4096) {
  parsed out;
  http::relay_response_parser p(out.head);
  std::string buffered;
  std::string win(window, '\0');
  std::size_t next = 0;
  bool want_more = true;
  while (!p.is_done()) {
    if (want_more) {
      if (next == raw.size()) {
        boost::system::error_code ec;
        if (p.is_header_done()) p.put_eof(ec);  // the end of a close-delimited body
        out.refused = out.refused || ec;
        break;
      }
      const auto n = std::min(step, raw.size() - next);
      buffered.append(raw.substr(next, n));
      next += n;
    }
    p.body_window(win.data(), win.size());
    boost::system::error_code ec;
    const auto used = p.put(boost::asio::buffer(buffered), ec);
    buffered.erase(0, used);
    out.body.append(win.data(), win.size() - p.body_left());
    if (ec && ec != bhttp::error::need_more && ec != bhttp::error::need_buffer) {
      out.refused = true;
      break;
    }
    want_more = buffered.empty() || ec == bhttp::error::need_more;
  }
  out.header_done = p.is_header_done();
  out.framing_error = std::string(p.framing_error());
  return out;
}

TEST(RelayParser, WritesStatusLineAndEndToEndFieldsOnly) {
  auto r = feed(
      "HTTP/1.1 200 OK\r\nServer: nginx\r\nContent-Type: application/json\r\nContent-Length: 2\r\n"
      "Connection: keep-alive\r\nKeep-Alive: timeout=5\r\nX-Replica: r1\r\n\r\n{}");
  ASSERT_TRUE(r.header_done);
  EXPECT_EQ(r.head, "HTTP/1.1 200 OK\r\nServer: nginx\r\nContent-Type: application/json\r\nX-Replica: r1\r\n");
  EXPECT_EQ(r.framing_error, "");
  EXPECT_EQ(r.body, "{}");
}

TEST(RelayParser, EmptyReasonGetsTheStandardOneAndHttp10IsAnsweredAs11) {
  EXPECT_EQ(feed("HTTP/1.0 404 \r\nContent-Length: 0\r\n\r\n").head, "HTTP/1.1 404 Not Found\r\n");
  EXPECT_EQ(feed("HTTP/1.1 200 Fine\r\nContent-Length: 0\r\n\r\n").head, "HTTP/1.1 200 Fine\r\n");
}

TEST(RelayParser, DropsEveryHopByHopField) {
  auto r = feed(
      "HTTP/1.1 200 OK\r\nTE: trailers\r\nUpgrade: h2c\r\nProxy-Connection: x\r\nHTTP2-Settings: y\r\n"
      "Transfer-Encoding: chunked\r\nA: 1\r\n\r\n0\r\n\r\n");
  EXPECT_EQ(r.head, "HTTP/1.1 200 OK\r\nA: 1\r\n");
  EXPECT_EQ(r.framing_error, "");
}

TEST(RelayParser, NotesAnUpgradeToWebsocketWithoutWritingIt) {
  // A 101 head: Beast's parser is done after it; the tunnel's bytes are not the parser's.
  std::string head;
  http::relay_response_parser p(head);
  boost::system::error_code ec;
  const std::string_view raw =
      "HTTP/1.1 101 Switching Protocols\r\nUpgrade: WebSocket\r\nConnection: Upgrade\r\n"
      "Sec-WebSocket-Accept: s3pPLMBiTxaQ9kYGzzhZRbK+xOo=\r\n\r\n";
  p.put(boost::asio::buffer(raw.data(), raw.size()), ec);
  EXPECT_FALSE(ec);
  EXPECT_TRUE(p.is_header_done());
  EXPECT_EQ(p.status(), 101u);
  EXPECT_TRUE(p.upgrade_websocket());
  EXPECT_EQ(head, "HTTP/1.1 101 Switching Protocols\r\nSec-WebSocket-Accept: s3pPLMBiTxaQ9kYGzzhZRbK+xOo=\r\n");
  std::string other;
  http::relay_response_parser q(other);
  const std::string_view h2c = "HTTP/1.1 101 Switching Protocols\r\nUpgrade: h2c\r\nConnection: Upgrade\r\n\r\n";
  q.put(boost::asio::buffer(h2c.data(), h2c.size()), ec);
  EXPECT_FALSE(q.upgrade_websocket());
}

TEST(RelayParser, DropsFieldsNamedInConnectionBeforeOrAfterThem) {
  auto r = feed(
      "HTTP/1.1 200 OK\r\nX-Hop: 1\r\nA: 1\r\nConnection: close, x-hop\r\nConnection: X-Other\r\n"
      "B: 2\r\nx-other: 3\r\nContent-Length: 0\r\n\r\n");
  EXPECT_EQ(r.head, "HTTP/1.1 200 OK\r\nA: 1\r\nB: 2\r\n");
}

TEST(RelayParser, SameHeadWhateverTheReadsAreSplitAt) {
  const std::string raw =
      "HTTP/1.1 200 OK\r\nServer: nginx\r\nX-Drop: a\r\nConnection: x-drop\r\nDate: today\r\n"
      "Content-Length: 11\r\n\r\nhello world";
  const auto whole = feed(raw);
  ASSERT_EQ(whole.head, "HTTP/1.1 200 OK\r\nServer: nginx\r\nDate: today\r\n");
  for (std::size_t step = 1; step < raw.size(); ++step) {
    auto r = feed(raw, step, 3);
    EXPECT_EQ(r.head, whole.head) << "step " << step;
    EXPECT_EQ(r.body, "hello world") << "step " << step;
  }
}

TEST(RelayParser, FullWindowStopsWithNeedBufferAndKeepsTheRest) {
  std::string head;
  http::relay_response_parser p(head);
  const std::string raw = "HTTP/1.1 200 OK\r\nContent-Length: 10\r\n\r\n0123456789";
  boost::system::error_code ec;
  auto used = p.put(boost::asio::buffer(raw), ec);  // the head only
  ASSERT_FALSE(ec);
  char win[4];
  p.body_window(win, sizeof win);
  used += p.put(boost::asio::buffer(raw.data() + used, raw.size() - used), ec);
  EXPECT_EQ(ec, bhttp::error::need_buffer);
  EXPECT_EQ(p.body_left(), 0u);
  EXPECT_EQ(std::string_view(win, 4), "0123");
  EXPECT_EQ(used, raw.size() - 6);
}

TEST(RelayParser, ChunkedBodyIsDechunkedAndTrailersAreDropped) {
  auto r = feed(
      "HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\nA: 1\r\n\r\n"
      "5\r\nhello\r\n6;ext=1\r\n world\r\n0\r\nX-Trailer: t\r\nConnection: close\r\n\r\n", 7, 4);
  EXPECT_EQ(r.head, "HTTP/1.1 200 OK\r\nA: 1\r\n");
  EXPECT_EQ(r.body, "hello world");
  EXPECT_FALSE(r.refused);
}

TEST(RelayParser, A2_A15_B6_FramingThatCannotBeReframed) {
  auto error = [](std::string_view raw) {
    auto r = feed(raw);
    return r.refused ? std::string("refused by Beast") : r.framing_error;
  };
  EXPECT_EQ(error("HTTP/1.1 200 OK\r\nContent-Length: 5\r\n\r\nhello"), "");
  EXPECT_EQ(error("HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n0\r\n\r\n"), "");
  EXPECT_EQ(error("HTTP/1.1 200 OK\r\nTransfer-Encoding: Chunked \r\n\r\n0\r\n\r\n"), "");
  EXPECT_EQ(error("HTTP/1.1 200 OK\r\n\r\nclose-delimited"), "");
  // Beast accepts these; ingressd cannot re-frame them faithfully.
  EXPECT_EQ(error("HTTP/1.1 200 OK\r\nContent-Length: 5\r\nContent-Length: 5\r\n\r\nhello"),
            "repeated Content-Length from upstream");
  EXPECT_EQ(error("HTTP/1.1 200 OK\r\nContent-Length: 5, 5\r\n\r\nhello"), "invalid Content-Length from upstream");
  EXPECT_EQ(error("HTTP/1.1 200 OK\r\nTransfer-Encoding: gzip\r\n\r\nx"),
            "unsupported Transfer-Encoding from upstream");
  EXPECT_EQ(error("HTTP/1.1 200 OK\r\nTransfer-Encoding: gzip, chunked\r\n\r\n0\r\n\r\n"),
            "unsupported Transfer-Encoding from upstream");
  // Beast refuses these itself (the session answers 502 for them too).
  EXPECT_EQ(error("HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\nTransfer-Encoding: chunked\r\n\r\n"),
            "refused by Beast");
  EXPECT_EQ(error("HTTP/1.1 200 OK\r\nContent-Length: 5\r\nContent-Length: 6\r\n\r\n"), "refused by Beast");
  EXPECT_EQ(error("HTTP/1.1 200 OK\r\nContent-Length: 5\r\nTransfer-Encoding: chunked\r\n\r\n"), "refused by Beast");
  EXPECT_EQ(error("FOO BAR\r\n\r\n"), "refused by Beast");
}

TEST(RelayParser, InterimResponseHeadsAreWrittenToo) {
  std::string head = "request head, still needed until the status line arrives";
  http::relay_response_parser p(head);
  boost::system::error_code ec;
  p.put(boost::asio::buffer(std::string_view("HTTP/1.1 1")), ec);
  EXPECT_EQ(head, "request head, still needed until the status line arrives");
  const std::string raw = "HTTP/1.1 103 Early Hints\r\nLink: </a.css>; rel=preload\r\n\r\n";
  p.put(boost::asio::buffer(raw), ec);
  ASSERT_FALSE(ec);
  EXPECT_TRUE(p.is_header_done());
  EXPECT_EQ(p.status(), 103u);
  EXPECT_EQ(head, "HTTP/1.1 103 Early Hints\r\nLink: </a.css>; rel=preload\r\n");
}

TEST(RelayParser, HopByHopNamesMatchWithOrWithoutBeastsEnum) {
  EXPECT_TRUE(http::always_hop_by_hop(bhttp::field::connection, "Connection"));
  EXPECT_TRUE(http::always_hop_by_hop(bhttp::field::unknown, "HTTP2-Settings"));
  EXPECT_TRUE(http::always_hop_by_hop(bhttp::field::unknown, "proxy-connection"));
  EXPECT_FALSE(http::always_hop_by_hop(bhttp::field::server, "Server"));
  EXPECT_FALSE(http::always_hop_by_hop(bhttp::field::unknown, "X-Connection"));
  EXPECT_TRUE(http::listed_in_connection("close, X-A ,x-b", "x-a"));
  EXPECT_TRUE(http::listed_in_connection("close, X-A ,x-b", "X-B"));
  EXPECT_FALSE(http::listed_in_connection("close, X-A ,x-b", "x"));
  EXPECT_FALSE(http::listed_in_connection("", "x"));
}

}  // namespace
}  // namespace ingressd
