// Behind a load balancer (issue #28 items 1 and 2): client.trusted_proxies and the PROXY protocol,
// end to end against the in-process daemon. The replica records the forwarding headers it got;
// the access log says who the client was; refusals close without a response and are counted.
#include <chrono>
#include <filesystem>
#include <string>

#include <gtest/gtest.h>
#include <nlohmann/json.hpp>

#include "fakes/admin_client.hpp"
#include "fakes/certs.hpp"
#include "fakes/http_client.hpp"
#include "fakes/proxy_fixture.hpp"
#include "fakes/servers.hpp"
#include "fakes/topology_builder.hpp"
#include "ingressd/demo/replica_server.hpp"

namespace ingressd {
namespace {

using namespace std::chrono_literals;
using demo::replica_server;
using testing::connection;
using testing::proxy;
using testing::send_raw;
using testing::target_of;
using testing::topology_builder;

const std::string loopback = "127.0.0.1";

std::string get(std::string_view target, std::string_view extra = {}) {
  return "GET " + std::string(target) + " HTTP/1.1\r\nHost: ingressd\r\n" + std::string(extra) + "\r\n";
}

std::string v2_tcp4(std::string_view src4, std::uint16_t port) {
  std::string h("\x0D\x0A\x0D\x0A\x00\x0D\x0A\x51\x55\x49\x54\x0A\x21\x11\x00\x0C", 16);
  h.append(src4);
  h.append("\x7F\x00\x00\x01", 4);
  h.push_back(static_cast<char>(port >> 8));
  h.push_back(static_cast<char>(port & 0xff));
  h.append("\x1F\x40", 2);
  return h;
}

/// One replica behind a proxy with `trusted` networks (and the PROXY protocol when asked), an
/// access log in a temporary directory.
struct env {
  explicit env(std::vector<std::string> trusted, bool proxy_protocol = false, config::config cfg = testing::test_config())
      : r(testing::replica_named("SERVE_REPLICA::app#A#1")), p(make(std::move(cfg), trusted, proxy_protocol, log)) {
    p.set_topology(topology_builder().app("app", "/", {target_of(r)}));
  }
  static config::config make(config::config cfg, const std::vector<std::string>& trusted, bool pp, const std::string& log) {
    for (const auto& t : trusted) cfg.client.trusted_proxies.push_back(*net::cidr::parse(t));
    cfg.client.proxy_protocol = pp;
    cfg.client.header_timeout = 2s;
    cfg.access_log = log;
    return cfg;
  }
  /// The forwarding headers the replica got with the last request.
  std::pair<std::string, std::string> seen() const {
    const auto rq = r.requests();
    if (rq.empty()) return {"<none>", "<none>"};
    return {rq.back().header("x-forwarded-for").value_or("<none>"), rq.back().header("x-forwarded-proto").value_or("<none>")};
  }
  nlohmann::json log_line(std::size_t n) const { return testing::wait_json_lines(log, n).at(n - 1); }
  double errors(std::string_view reason) const {
    return testing::scrape_metrics(p.admin_port())
        .at("ingressd_proxy_protocol_errors_total{reason=\"" + std::string(reason) + "\"}");
  }

  testing::temp_dir dir;
  std::string log = (std::filesystem::path(dir.path()) / "access.log").string();
  replica_server r;
  proxy p;
};

testing::http_response request(const env& e, const std::string& bytes) {
  auto c = send_raw(loopback, e.p.port(), bytes);
  EXPECT_TRUE(c.connected()) << c.error();
  return c.read_response(5s);
}

TEST(Forwarding, UntrustedPeerHeadersAreReplaced) {
  env e({"10.0.0.0/8"});  // loopback is not trusted
  auto res = request(e, get("/a", "X-Forwarded-For: 6.6.6.6\r\nX-Forwarded-Proto: https\r\n"));
  ASSERT_EQ(res.status, 200u) << res.body;
  EXPECT_EQ(e.seen(), std::make_pair(loopback, std::string("http")));
  const auto l = e.log_line(1);
  EXPECT_EQ(l["client"], loopback);
  EXPECT_EQ(l["client_ip"], loopback);
}

TEST(Forwarding, TrustedPeerChainIsKeptAndThePeerAppended) {
  env e({"127.0.0.1/32"});
  auto res = request(e, get("/a", "X-Forwarded-For: 203.0.113.9\r\nX-Forwarded-Proto: https\r\n"));
  ASSERT_EQ(res.status, 200u) << res.body;
  EXPECT_EQ(e.seen(), std::make_pair(std::string("203.0.113.9, 127.0.0.1"), std::string("https")));
  auto l = e.log_line(1);
  EXPECT_EQ(l["client"], loopback);
  EXPECT_EQ(l["client_ip"], "203.0.113.9");
  // Two lines are one list; a spoofed left part is kept but is not the client; no proto: the listener's.
  res = request(e, get("/b", "X-Forwarded-For: 1.1.1.1\r\nX-Forwarded-For: 198.51.100.7, 127.0.0.1\r\n"));
  ASSERT_EQ(res.status, 200u);
  EXPECT_EQ(e.seen(), std::make_pair(std::string("1.1.1.1, 198.51.100.7, 127.0.0.1, 127.0.0.1"), std::string("http")));
  EXPECT_EQ(e.log_line(2)["client_ip"], "198.51.100.7");
  // IPv6 forms.
  res = request(e, get("/c", "X-Forwarded-For: [2001:db8::7]:443\r\n"));
  ASSERT_EQ(res.status, 200u);
  EXPECT_EQ(e.log_line(3)["client_ip"], "2001:db8::7");
}

TEST(Forwarding, MalformedChainFromTrustedPeerMakesThePeerTheClient) {
  env e({"127.0.0.1/32"});
  auto res = request(e, get("/a", "X-Forwarded-For: 203.0.113.9, evil\r\nX-Forwarded-Proto: https\r\n"));
  ASSERT_EQ(res.status, 200u) << res.body;
  EXPECT_EQ(e.seen(), std::make_pair(loopback, std::string("http")));
  EXPECT_EQ(e.log_line(1)["client_ip"], loopback);
  EXPECT_EQ(testing::scrape_metrics(e.p.admin_port()).at("ingressd_forwarded_chain_errors_total"), 1);
}

TEST(Forwarding, ProxyProtocolV1AndV2NameTheClient) {
  env e({"127.0.0.1/32"}, true);
  auto res = request(e, "PROXY TCP4 198.51.100.7 127.0.0.1 40001 8000\r\n" + get("/v1"));
  ASSERT_EQ(res.status, 200u) << res.body;
  EXPECT_EQ(e.seen().first, "198.51.100.7");
  EXPECT_EQ(e.log_line(1)["client"], "198.51.100.7");
  res = request(e, v2_tcp4(std::string_view("\xC0\x00\x02\x09", 4), 40002) + get("/v2"));
  ASSERT_EQ(res.status, 200u) << res.body;
  EXPECT_EQ(e.seen().first, "192.0.2.9");
  EXPECT_EQ(e.log_line(2)["client"], "192.0.2.9");
  // The PROXY source is the peer for X-Forwarded-For: not trusted, so its chain is replaced.
  res = request(e, "PROXY TCP6 2001:db8::9 ::1 40003 8000\r\n" + get("/v6", "X-Forwarded-For: 6.6.6.6\r\n"));
  ASSERT_EQ(res.status, 200u) << res.body;
  EXPECT_EQ(e.seen().first, "2001:db8::9");
  // LOCAL (the balancer's own health check): the socket's address.
  res = request(e, std::string("\x0D\x0A\x0D\x0A\x00\x0D\x0A\x51\x55\x49\x54\x0A\x20\x00\x00\x00", 16) + get("/local"));
  ASSERT_EQ(res.status, 200u) << res.body;
  EXPECT_EQ(e.seen().first, loopback);
}

TEST(Forwarding, ProxyHeaderSplitAcrossWritesAndKeepAliveAfterIt) {
  env e({"127.0.0.1/32"}, true);
  auto c = connection::open(loopback, e.p.port());
  ASSERT_TRUE(c.connected());
  const std::string h = "PROXY TCP4 198.51.100.8 127.0.0.1 40001 8000\r\n";
  ASSERT_TRUE(c.write(h.substr(0, 9)));
  ASSERT_TRUE(c.write(h.substr(9, 20)));
  ASSERT_TRUE(c.write(h.substr(29) + get("/one")));
  auto first = c.read_response(5s);
  ASSERT_EQ(first.status, 200u) << first.body;
  ASSERT_TRUE(c.write(get("/two")));  // the same connection: no second header
  ASSERT_EQ(c.read_response(5s).status, 200u);
  EXPECT_EQ(e.seen().first, "198.51.100.8");
  EXPECT_EQ(e.r.request_count(), 2u);
}

/// A connection ingressd must close without a byte of response.
void expect_closed_silently(const env& e, const std::string& bytes, std::string_view what) {
  const auto before = e.r.request_count();
  auto c = send_raw(loopback, e.p.port(), bytes);
  ASSERT_TRUE(c.connected()) << what;
  const auto got = c.read_until_close(5s);
  EXPECT_TRUE(got.closed || got.reset) << what;
  EXPECT_EQ(got.bytes, "") << what;
  EXPECT_EQ(e.r.request_count(), before) << what;
}

TEST(Forwarding, ProxyProtocolRefusalsCloseWithoutAResponseAndAreCounted) {
  env e({"127.0.0.1/32"}, true);
  expect_closed_silently(e, get("/no-header"), "no header");
  EXPECT_EQ(e.errors("invalid"), 1);
  expect_closed_silently(e, "PROXY TCP4 1.2.3.4 5.6.7.8 99999 1\r\n" + get("/bad-port"), "bad port");
  EXPECT_EQ(e.errors("invalid"), 2);
  expect_closed_silently(e, "PROXY UNKNOWN " + std::string(200, 'x') + "\r\n", "v1 over 107 bytes");
  EXPECT_EQ(e.errors("oversized"), 1);
  std::string big("\x0D\x0A\x0D\x0A\x00\x0D\x0A\x51\x55\x49\x54\x0A\x21\x11\xFF\xFF", 16);
  expect_closed_silently(e, big, "v2 announcing 64 KiB");
  EXPECT_EQ(e.errors("oversized"), 2);
  {
    auto c = send_raw(loopback, e.p.port(), "PROXY TCP4 1.2.3.4");
    ASSERT_TRUE(c.connected());
    c.shutdown_write();
    EXPECT_TRUE(c.is_closed(5s));
  }
  EXPECT_TRUE(testing::eventually([&] { return e.errors("truncated") == 1; }, 5s));
  // No header within client.header_timeout (2 s here): closed, counted.
  auto slow = send_raw(loopback, e.p.port(), "PROXY TCP4 1.2.");
  ASSERT_TRUE(slow.connected());
  EXPECT_TRUE(slow.is_closed(10s));
  EXPECT_TRUE(testing::eventually([&] { return e.errors("timeout") == 1; }, 5s));
  // Still serving.
  auto ok = request(e, "PROXY TCP4 198.51.100.7 127.0.0.1 1 8000\r\n" + get("/ok"));
  EXPECT_EQ(ok.status, 200u);
}

TEST(Forwarding, ProxyProtocolFromAnUntrustedPeerIsRefused) {
  env e({"10.0.0.0/8"}, true);
  expect_closed_silently(e, "PROXY TCP4 198.51.100.7 127.0.0.1 1 8000\r\n" + get("/x"), "untrusted peer");
  EXPECT_EQ(e.errors("untrusted"), 1);
}

TEST(Forwarding, ProxyProtocolBeforeTls) {
  testing::temp_dir dir;
  const auto cert = testing::make_cert(dir.path(), "a");
  auto cfg = testing::test_config();
  cfg.tls.listen = {loopback, 0};
  cfg.tls.cert_file = cert.cert;
  cfg.tls.key_file = cert.key;
  env e({"127.0.0.1/32"}, true, cfg);
  testing::tls_options o;
  o.ca_file = cert.cert;
  o.preamble = v2_tcp4(std::string_view("\xC0\x00\x02\x0A", 4), 40004);
  auto c = connection::open_tls(loopback, e.p.tls_port(), o);
  ASSERT_TRUE(c.connected()) << c.error() << ": the ClientHello after the header must reach OpenSSL whole";
  ASSERT_TRUE(c.write(get("/tls")));
  const auto res = c.read_response(5s);
  ASSERT_EQ(res.status, 200u) << res.body;
  EXPECT_EQ(e.seen(), std::make_pair(std::string("192.0.2.10"), std::string("https")));
  EXPECT_EQ(e.log_line(1)["client"], "192.0.2.10");
}

}  // namespace
}  // namespace ingressd
