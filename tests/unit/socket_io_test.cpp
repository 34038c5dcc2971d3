// The socket helpers that finish at once when they can (core/socket_io.hpp), on real loopback
// sockets, and the one body framing of both relay directions (http::framed_piece).
#include <string>
#include <vector>

#include <boost/asio/connect.hpp>
#include <boost/asio/read.hpp>
#include <boost/beast/core/flat_buffer.hpp>
#include <boost/beast/http/string_body.hpp>
#include <gtest/gtest.h>

#include "ingressd/core/socket_io.hpp"
#include "ingressd/http/parse_now.hpp"
#include "ingressd/http/message.hpp"
#include "ingressd/http/parse_guards.hpp"

namespace ingressd {
namespace {

namespace bhttp = boost::beast::http;

/// A connected pair of loopback TCP sockets.
struct socket_pair {
  asio::io_context ioc;
  tcp::socket a{ioc}, b{ioc};
  socket_pair() {
    tcp::acceptor acc(ioc, tcp::endpoint(asio::ip::make_address("127.0.0.1"), 0));
    a.connect(acc.local_endpoint());
    acc.accept(b);
  }
  std::string read_b(std::size_t n) {
    std::string out(n, '\0');
    asio::read(b, asio::buffer(out));
    return out;
  }
};

TEST(WriteNow, SendsEveryBufferInOneCallAndDropsWhatWentOut) {
  socket_pair s;
  const std::string head = "HTTP/1.1 200 OK\r\n\r\n", body = "data";
  std::array<asio::const_buffer, 2> bufs{asio::buffer(head), asio::buffer(body)};
  std::span<asio::const_buffer> pending(bufs);
  error_code ec;
  EXPECT_TRUE(write_now(s.a, pending, ec));
  EXPECT_FALSE(ec);
  EXPECT_TRUE(pending.empty());
  EXPECT_EQ(s.read_b(head.size() + body.size()), head + body);
}

TEST(WriteNow, AFullSocketLeavesTheRestForTheCallerToAwait) {
  socket_pair s;
  s.a.set_option(asio::socket_base::send_buffer_size(4096));
  s.b.set_option(asio::socket_base::receive_buffer_size(4096));
  const std::string big(4 * 1024 * 1024, 'x');  // far more than both buffers hold
  std::array<asio::const_buffer, 2> bufs{asio::buffer(big.data(), 10), asio::buffer(big.data() + 10, big.size() - 10)};
  std::span<asio::const_buffer> pending(bufs);
  error_code ec;
  EXPECT_FALSE(write_now(s.a, pending, ec));  // would block: not done, no error
  EXPECT_FALSE(ec);
  ASSERT_EQ(pending.size(), 1u);  // the first buffer went out whole, the second in part
  EXPECT_LT(pending[0].size(), big.size() - 10);
  EXPECT_EQ(static_cast<const char*>(pending[0].data()) + pending[0].size(), big.data() + big.size());
  // What is left is exactly what the caller's async_write must still send.
  const std::size_t sent = big.size() - pending[0].size();
  EXPECT_EQ(s.read_b(sent), big.substr(0, sent));
}

TEST(WriteNow, AnErrorIsReported) {
  socket_pair s;
  s.b.set_option(asio::socket_base::linger(true, 0));
  s.b.close();  // RST
  const std::string data(64 * 1024, 'y');
  error_code ec;
  // The first write may still be taken by the kernel; the reset shows by the next ones at the latest.
  for (int i = 0; i < 10 && !ec; ++i) {
    std::array<asio::const_buffer, 1> bufs{asio::buffer(data)};
    std::span<asio::const_buffer> pending(bufs);
    EXPECT_TRUE(write_now(s.a, pending, ec) || !ec);
  }
  EXPECT_TRUE(ec == asio::error::connection_reset || ec == asio::error::broken_pipe) << ec.message();
}

TEST(ParseNow, ParsesWhatIsThereAndSaysWhenMoreMustBeAwaited) {
  socket_pair s;
  boost::beast::flat_buffer buf;
  bhttp::response_parser<bhttp::string_body> p;
  error_code ec;
  EXPECT_FALSE(parse_now(s.a, buf, 65536, p, false, ec));  // nothing yet: the caller reads
  EXPECT_FALSE(ec);
  asio::write(s.b, asio::buffer(std::string("HTTP/1.1 200 OK\r\nContent-Length: 5\r\n\r\nhel")));
  s.a.wait(tcp::socket::wait_read);
  // The head only: settled once it is parsed, the body left buffered.
  EXPECT_TRUE(parse_now(s.a, buf, 65536, p, false, ec));
  EXPECT_FALSE(ec);
  EXPECT_TRUE(p.is_header_done());
  EXPECT_EQ(p.get().result_int(), 200);
  EXPECT_FALSE(p.is_done());
  // The whole message: not settled until it is complete.
  EXPECT_FALSE(parse_now(s.a, buf, 65536, p, true, ec));
  EXPECT_FALSE(ec);
  asio::write(s.b, asio::buffer(std::string("lo")));
  s.a.wait(tcp::socket::wait_read);
  EXPECT_TRUE(parse_now(s.a, buf, 65536, p, true, ec));
  EXPECT_TRUE(p.is_done());
  EXPECT_EQ(p.get().body(), "hello");
}

TEST(ParseNow, AParseErrorSettlesIt) {
  socket_pair s;
  boost::beast::flat_buffer buf;
  bhttp::response_parser<bhttp::string_body> p;
  asio::write(s.b, asio::buffer(std::string("NOT HTTP\r\n\r\n")));
  s.a.wait(tcp::socket::wait_read);
  error_code ec;
  EXPECT_TRUE(parse_now(s.a, buf, 65536, p, false, ec));
  EXPECT_TRUE(ec);
}

TEST(FillNow, SaysWhatTheSocketHeldAndWhetherTheReadTookItAll) {
  socket_pair s;
  boost::beast::flat_buffer buf;
  error_code ec;
  bool drained = false;
  // Nothing there: -1, no error, and the socket is known empty.
  EXPECT_EQ(fill_now(s.a, buf, 65536, ec, &drained), -1);
  EXPECT_FALSE(ec);
  EXPECT_TRUE(drained);
  // Fewer bytes than asked for: all of it was taken.
  asio::write(s.b, asio::buffer(std::string("abc")));
  s.a.wait(tcp::socket::wait_read);
  drained = false;
  EXPECT_EQ(fill_now(s.a, buf, 65536, ec, &drained), 3);
  EXPECT_TRUE(drained);
  EXPECT_EQ(http::pending(buf), "abc");
  // As many as asked for (the cap): more may be waiting, so not drained.
  buf.consume(buf.size());
  asio::write(s.b, asio::buffer(std::string(2000, 'x')));
  s.a.wait(tcp::socket::wait_read);
  drained = false;
  EXPECT_EQ(fill_now(s.a, buf, 512, ec, &drained), 512);
  EXPECT_FALSE(drained);
  // EOF once the rest is read.
  buf.consume(buf.size());
  s.b.shutdown(tcp::socket::shutdown_send);
  for (std::ptrdiff_t n; (n = fill_now(s.a, buf, 65536, ec, nullptr)) != 0;) {
    ASSERT_FALSE(ec);
    if (n < 0) s.a.wait(tcp::socket::wait_read);
  }
  EXPECT_EQ(buf.size(), 2000u - 512u);
  // A reset is an error, not "nothing yet".
  socket_pair r;
  r.b.set_option(asio::socket_base::linger(true, 0));
  r.b.close();
  r.a.wait(tcp::socket::wait_read);
  boost::beast::flat_buffer buf2;
  EXPECT_EQ(fill_now(r.a, buf2, 65536, ec, nullptr), -1);
  EXPECT_EQ(ec, asio::error::connection_reset) << ec.message();
}

std::string bytes_of(http::framed_piece& f) {
  std::string out;
  for (const auto& b : f.buffers()) out.append(static_cast<const char*>(b.data()), b.size());
  return out;
}

TEST(FramedPiece, OneFramingForBothDirections) {
  {
    http::framed_piece f(/*chunked=*/true);
    f.head("HEAD\r\n\r\n");
    f.data("hello", 5);
    f.end();
    EXPECT_EQ(bytes_of(f), "HEAD\r\n\r\n5\r\nhello\r\n0\r\n\r\n");
  }
  {
    http::framed_piece f(true);
    f.data("", 0);  // nothing read: no empty chunk (that would end the body)
    EXPECT_TRUE(f.empty());
    const std::string piece(300, 'z');
    f.data(piece.data(), piece.size());
    EXPECT_EQ(bytes_of(f), "12c\r\n" + piece + "\r\n");
  }
  {
    http::framed_piece f(/*chunked=*/false);  // Content-Length framing: the bytes as they are
    f.head("H\r\n\r\n");
    f.data("abc", 3);
    f.end();
    EXPECT_EQ(bytes_of(f), "H\r\n\r\nabc");
  }
}

}  // namespace
}  // namespace ingressd
