// PROXY protocol headers (net/proxy_protocol.hpp), CIDR sets (net/cidr.hpp) and the forwarding
// chain of trusted proxies (http/forwarded.hpp): sans-I/O, byte by byte.
#include "ingressd/net/proxy_protocol.hpp"

#include <gtest/gtest.h>

#include <string>

#include "ingressd/http/forwarded.hpp"
#include "ingressd/net/cidr.hpp"

namespace ingressd {
namespace {

using net::parse_proxy_header;
using net::proxy_error;
using state = net::proxy_header::state;
namespace ip = boost::asio::ip;

std::string v2(unsigned char ver_cmd, unsigned char fam, const std::string& block) {
  std::string h("\x0D\x0A\x0D\x0A\x00\x0D\x0A\x51\x55\x49\x54\x0A", 12);
  h.push_back(static_cast<char>(ver_cmd));
  h.push_back(static_cast<char>(fam));
  h.push_back(static_cast<char>(block.size() >> 8));
  h.push_back(static_cast<char>(block.size() & 0xff));
  return h + block;
}
std::string v2_tcp4(const std::string& tlvs = {}) {
  // 192.0.2.1:56324 -> 198.51.100.1:443
  return v2(0x21, 0x11, std::string("\xC0\x00\x02\x01\xC6\x33\x64\x01\xDC\x04\x01\xBB", 12) + tlvs);
}

TEST(ProxyProtocol, V1Tcp4AndTcp6) {
  const std::string h = "PROXY TCP4 192.0.2.1 198.51.100.1 56324 443\r\n";
  const auto r = parse_proxy_header(h + "GET / HTTP/1.1\r\n");
  ASSERT_EQ(r.st, state::done) << r.detail;
  EXPECT_EQ(r.length, h.size());
  ASSERT_TRUE(r.source);
  EXPECT_EQ(r.source->address().to_string(), "192.0.2.1");
  EXPECT_EQ(r.source->port(), 56324);
  const auto six = parse_proxy_header("PROXY TCP6 2001:db8::1 2001:db8::2 1 65535\r\n");
  ASSERT_EQ(six.st, state::done) << six.detail;
  EXPECT_EQ(six.source->address().to_string(), "2001:db8::1");
}

TEST(ProxyProtocol, V1UnknownAndLongestLine) {
  const auto u = parse_proxy_header("PROXY UNKNOWN\r\n");
  ASSERT_EQ(u.st, state::done);
  EXPECT_FALSE(u.source) << "UNKNOWN: the socket's own address stands";
  EXPECT_EQ(parse_proxy_header("PROXY UNKNOWN ffff::1 ffff::2 65535 65535\r\n").st, state::done);
  // The specification's longest line, 107 bytes.
  const std::string longest =
      "PROXY UNKNOWN ffff:f...f:ffff ffff:f...f:ffff 65535 65535\r\n" + std::string(0, 'x');
  EXPECT_EQ(parse_proxy_header(longest).st, state::done);
}

TEST(ProxyProtocol, V1Refusals) {
  struct row {
    const char* what;
    std::string bytes;
    proxy_error why;
  };
  const row rows[] = {
      {"HTTP instead", "GET / HTTP/1.1\r\n", proxy_error::invalid},
      {"lower case", "proxy TCP4 1.2.3.4 5.6.7.8 1 2\r\n", proxy_error::invalid},
      {"family mismatch", "PROXY TCP4 2001:db8::1 5.6.7.8 1 2\r\n", proxy_error::invalid},
      {"port too large", "PROXY TCP4 1.2.3.4 5.6.7.8 65536 2\r\n", proxy_error::invalid},
      {"leading zero", "PROXY TCP4 1.2.3.4 5.6.7.8 080 2\r\n", proxy_error::invalid},
      {"double space", "PROXY TCP4  1.2.3.4 5.6.7.8 1 2\r\n", proxy_error::invalid},
      {"missing port", "PROXY TCP4 1.2.3.4 5.6.7.8 1\r\n", proxy_error::invalid},
      {"extra field", "PROXY TCP4 1.2.3.4 5.6.7.8 1 2 3\r\n", proxy_error::invalid},
      {"UDP", "PROXY UDP4 1.2.3.4 5.6.7.8 1 2\r\n", proxy_error::invalid},
      {"bare LF", "PROXY TCP4 1.2.3.4 5.6.7.8 1 2\n", proxy_error::invalid},
      {"hostname", "PROXY TCP4 host 5.6.7.8 1 2\r\n", proxy_error::invalid},
      {"no CRLF in 107 bytes", "PROXY UNKNOWN " + std::string(100, 'a'), proxy_error::oversized},
  };
  for (const auto& r : rows) {
    const auto got = parse_proxy_header(r.bytes);
    EXPECT_EQ(got.st, state::failed) << r.what;
    EXPECT_EQ(got.error, r.why) << r.what << ": " << got.detail;
  }
}

TEST(ProxyProtocol, V1ArrivingByteByByteIsNeedMoreUntilTheEnd) {
  const std::string h = "PROXY TCP4 192.0.2.1 198.51.100.1 56324 443\r\n";
  for (std::size_t n = 1; n < h.size(); ++n)
    EXPECT_EQ(parse_proxy_header(h.substr(0, n)).st, state::need_more) << n;
  EXPECT_EQ(parse_proxy_header(h).st, state::done);
  // A byte that rules the header out fails at once, not at 107 bytes.
  EXPECT_EQ(parse_proxy_header("PRO").st, state::need_more);
  EXPECT_EQ(parse_proxy_header("PRX").st, state::failed);
}

TEST(ProxyProtocol, V2Tcp4Tcp6AndTlvs) {
  const auto h = v2_tcp4();
  const auto r = parse_proxy_header(h + "\x16\x03\x01");  // a TLS ClientHello follows
  ASSERT_EQ(r.st, state::done) << r.detail;
  EXPECT_EQ(r.length, 28u);
  EXPECT_EQ(r.source->address().to_string(), "192.0.2.1");
  EXPECT_EQ(r.source->port(), 56324);
  // TLVs after the addresses (AWS's VPC endpoint id, say) are skipped.
  const auto tlv = v2_tcp4(std::string("\xEA\x00\x05vpce1", 8));
  const auto t = parse_proxy_header(tlv);
  ASSERT_EQ(t.st, state::done);
  EXPECT_EQ(t.length, tlv.size());
  std::string six(36, '\0');
  six[15] = 1;             // src ::1
  six[31] = 2;             // dst ::2
  six[32] = '\x1F';        // src port 8080
  six[33] = '\x90';
  const auto s = parse_proxy_header(v2(0x21, 0x21, six));
  ASSERT_EQ(s.st, state::done) << s.detail;
  EXPECT_EQ(s.source->address().to_string(), "::1");
  EXPECT_EQ(s.source->port(), 8080);
}

TEST(ProxyProtocol, V2LocalAndUnspecUseTheSocket) {
  const auto local = parse_proxy_header(v2(0x20, 0x00, ""));
  ASSERT_EQ(local.st, state::done);
  EXPECT_FALSE(local.source);
  EXPECT_EQ(local.length, 16u);
  // LOCAL with an address block (some balancers send one): still the socket's address.
  EXPECT_FALSE(parse_proxy_header(v2(0x20, 0x11, std::string(12, '\x01'))).source);
  EXPECT_FALSE(parse_proxy_header(v2(0x21, 0x00, "")).source);
  EXPECT_FALSE(parse_proxy_header(v2(0x21, 0x31, std::string(216, '\0'))).source) << "AF_UNIX";
}

TEST(ProxyProtocol, V2Refusals) {
  EXPECT_EQ(parse_proxy_header(v2(0x11, 0x11, std::string(12, '\0'))).error, proxy_error::invalid) << "version 1";
  EXPECT_EQ(parse_proxy_header(v2(0x22, 0x11, std::string(12, '\0'))).error, proxy_error::invalid) << "command 2";
  EXPECT_EQ(parse_proxy_header(v2(0x21, 0x41, std::string(12, '\0'))).error, proxy_error::invalid) << "family 4";
  EXPECT_EQ(parse_proxy_header(v2(0x21, 0x11, std::string(8, '\0'))).error, proxy_error::invalid)
      << "address block too short";
  const auto big = parse_proxy_header(v2(0x21, 0x11, std::string(3000, '\0')).substr(0, 16));
  EXPECT_EQ(big.st, state::failed) << "decided from the length field, before the bytes come";
  EXPECT_EQ(big.error, proxy_error::oversized);
  std::string bad_sig = v2_tcp4();
  bad_sig[11] = 'X';
  EXPECT_EQ(parse_proxy_header(bad_sig).error, proxy_error::invalid);
}

TEST(ProxyProtocol, V2SplitAtEveryByte) {
  const auto h = v2_tcp4(std::string("\x04\x00\x02" "ab", 5));
  for (std::size_t n = 1; n < h.size(); ++n) EXPECT_EQ(parse_proxy_header(h.substr(0, n)).st, state::need_more) << n;
  EXPECT_EQ(parse_proxy_header(h).st, state::done);
}

TEST(Cidr, ParsesContainsAndMapsIpv4) {
  const auto ten = net::cidr::parse("10.0.0.0/8");
  ASSERT_TRUE(ten);
  EXPECT_TRUE(ten->contains(ip::make_address("10.255.1.2")));
  EXPECT_FALSE(ten->contains(ip::make_address("11.0.0.1")));
  EXPECT_TRUE(ten->contains(ip::make_address("::ffff:10.1.2.3"))) << "an IPv4 peer on a dual-stack listener";
  EXPECT_FALSE(ten->contains(ip::make_address("::1")));
  const auto host = net::cidr::parse("192.0.2.7");
  ASSERT_TRUE(host);
  EXPECT_EQ(host->to_string(), "192.0.2.7/32");
  EXPECT_EQ(net::cidr::parse("10.1.2.3/8")->to_string(), "10.0.0.0/8") << "host bits cleared";
  const auto v6 = net::cidr::parse("fd00::/8");
  ASSERT_TRUE(v6);
  EXPECT_TRUE(v6->contains(ip::make_address("fd12::1")));
  EXPECT_FALSE(v6->contains(ip::make_address("fe80::1")));
  EXPECT_TRUE(net::cidr::parse("0.0.0.0/0")->contains(ip::make_address("8.8.8.8")));
  EXPECT_TRUE(net::cidr::parse("2001:db8::/33")->contains(ip::make_address("2001:db8:7fff::1")));
  EXPECT_FALSE(net::cidr::parse("2001:db8::/33")->contains(ip::make_address("2001:db8:8000::1")));
  for (const char* bad : {"", "10.0.0.0/33", "10.0.0.0/", "10.0.0.0/-1", "::/129", "host/8", "10.0.0.0/8x", "1.2.3"})
    EXPECT_FALSE(net::cidr::parse(bad)) << bad;
}

TEST(Forwarded, UntrustedPeerIsTheClient) {
  const std::vector<net::cidr> trusted{*net::cidr::parse("10.0.0.0/8")};
  const auto v = http::evaluate_forwarded("6.6.6.6", "https", ip::make_address("203.0.113.9"), "203.0.113.9", trusted);
  EXPECT_EQ(v.xff, "203.0.113.9") << "a client's own X-Forwarded-For is replaced";
  EXPECT_EQ(v.proto, "") << "and its X-Forwarded-Proto";
  EXPECT_EQ(v.client_ip, "203.0.113.9");
}

TEST(Forwarded, TrustedChainIsKeptAndTheClientIsTheRightmostUntrusted) {
  const std::vector<net::cidr> trusted{*net::cidr::parse("10.0.0.0/8"), *net::cidr::parse("fd00::/8")};
  const auto peer = ip::make_address("10.0.0.5");
  auto v = http::evaluate_forwarded("198.51.100.7", "https", peer, "10.0.0.5", trusted);
  EXPECT_EQ(v.xff, "198.51.100.7, 10.0.0.5");
  EXPECT_EQ(v.proto, "https");
  EXPECT_EQ(v.client_ip, "198.51.100.7");
  // A spoofed left part stays in the chain but is not the client: the rightmost untrusted is.
  v = http::evaluate_forwarded("1.1.1.1, 198.51.100.7, 10.9.9.9", "", peer, "10.0.0.5", trusted);
  EXPECT_EQ(v.xff, "1.1.1.1, 198.51.100.7, 10.9.9.9, 10.0.0.5");
  EXPECT_EQ(v.client_ip, "198.51.100.7");
  EXPECT_EQ(v.proto, "");
  // IPv6 forms, ports.
  v = http::evaluate_forwarded("[2001:db8::5]:4711,fd00::1", "http", peer, "10.0.0.5", trusted);
  EXPECT_EQ(v.client_ip, "2001:db8::5");
  v = http::evaluate_forwarded("198.51.100.7:1234", "", peer, "10.0.0.5", trusted);
  EXPECT_EQ(v.client_ip, "198.51.100.7");
  // All trusted: the farthest one.
  v = http::evaluate_forwarded("10.1.1.1, 10.2.2.2", "", peer, "10.0.0.5", trusted);
  EXPECT_EQ(v.client_ip, "10.1.1.1");
  // No chain: the trusted peer itself.
  v = http::evaluate_forwarded("", "", peer, "10.0.0.5", trusted);
  EXPECT_EQ(v.xff, "10.0.0.5");
  EXPECT_EQ(v.client_ip, "10.0.0.5");
  // An unknown scheme is not kept.
  EXPECT_EQ(http::evaluate_forwarded("", "gopher", peer, "10.0.0.5", trusted).proto, "");
}

TEST(Forwarded, MalformedChainFromATrustedPeerMakesThePeerTheClient) {
  const std::vector<net::cidr> trusted{*net::cidr::parse("10.0.0.0/8")};
  const auto peer = ip::make_address("10.0.0.5");
  for (const char* chain : {"unknown", "1.2.3.4, , 5.6.7.8", "1.2.3.4,evil.example", "1.2.3.4:x", "[::1",
                            "1.2.3.4 5.6.7.8"}) {
    const auto v = http::evaluate_forwarded(chain, "https", peer, "10.0.0.5", trusted);
    EXPECT_TRUE(v.malformed) << chain;
    EXPECT_EQ(v.xff, "10.0.0.5") << chain;
    EXPECT_EQ(v.client_ip, "10.0.0.5") << chain;
    EXPECT_EQ(v.proto, "") << chain;
  }
}

}  // namespace
}  // namespace ingressd
