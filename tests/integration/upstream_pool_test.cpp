// The per-worker upstream pool: the idle cap (replicas keep max_idle, routers scale times it),
// and leases: one connect path, back to the pool only when ended clean, a reset otherwise.
#include "ingressd/upstream/pool.hpp"

#include <boost/asio/detached.hpp>
#include <gtest/gtest.h>

namespace ingressd::upstream {
namespace {

connection_ptr open_connection(asio::io_context& ioc, const std::string& key) {
  auto c = std::make_unique<connection>(ioc.get_executor());
  c->sock.open(tcp::v4());
  c->key = key;
  return c;
}

TEST(UpstreamPool, IdleConnectionsBeyondTheCapAreClosed) {
  asio::io_context ioc;
  pool p(2);
  for (int i = 0; i < 5; ++i) p.put(open_connection(ioc, "10.0.0.1:8000"));
  EXPECT_EQ(p.idle_count(), 2u);
  p.put(open_connection(ioc, "10.0.0.2:8000"));  // the cap is per endpoint
  EXPECT_EQ(p.idle_count(), 3u);
}

TEST(UpstreamPool, RouterConnectionsKeepScaleTimesTheCap) {
  asio::io_context ioc;
  pool p(2);
  for (int i = 0; i < 20; ++i) p.put(open_connection(ioc, "10.0.0.9:9000"), router_pool_scale);
  EXPECT_EQ(p.idle_count(), 2u * router_pool_scale);
}

TEST(UpstreamPool, AConnectionToAnEndpointThatLeftTheTopologyIsClosedWhenItComesBack) {
  asio::io_context ioc;
  pool p(4);
  const std::vector<std::string_view> keys{"10.0.0.1:8000", "10.0.0.2:8000"};
  auto in = [&](const std::string& k) { return k == keys[0] || k == keys[1]; };
  p.set_endpoints(in, keys);
  p.put(open_connection(ioc, "10.0.0.1:8000"));
  EXPECT_EQ(p.idle_count(), 1u);
  // 10.0.0.2 leaves while one of its connections is in use; it comes back afterwards.
  const std::vector<std::string_view> now{"10.0.0.1:8000"};
  p.set_endpoints([&](const std::string& k) { return k == now[0]; }, now);
  p.put(open_connection(ioc, "10.0.0.2:8000"));
  EXPECT_EQ(p.idle_count(), 1u);
  // An endpoint still in the topology keeps pooling, also after a sweep emptied its entry.
  p.sweep(std::chrono::steady_clock::now() + std::chrono::hours(1), std::chrono::seconds(60));
  EXPECT_EQ(p.idle_count(), 0u);
  p.put(open_connection(ioc, "10.0.0.1:8000"));
  EXPECT_EQ(p.idle_count(), 1u);
}

TEST(UpstreamPool, ZeroMeansNoPooling) {
  asio::io_context ioc;
  pool p(0);
  p.put(open_connection(ioc, "10.0.0.1:8000"), router_pool_scale);
  EXPECT_EQ(p.idle_count(), 0u);
}

/// A loopback listener that accepts and keeps its peers, to see how a lease ends a connection.
struct peer_end {
  asio::io_context ioc;
  tcp::acceptor acceptor{ioc, tcp::endpoint(asio::ip::make_address("127.0.0.1"), 0)};
  tcp::socket accepted{ioc};
  std::string key() const { return "127.0.0.1:" + std::to_string(acceptor.local_endpoint().port()); }
  tcp::endpoint endpoint() const { return acceptor.local_endpoint(); }
  void accept() { acceptor.accept(accepted); }
  /// How the accepted connection ended, as its reader sees it: EOF (FIN) or reset (RST).
  error_code read_end() {
    char b;
    error_code ec;
    accepted.read_some(asio::buffer(&b, 1), ec);
    return ec;
  }
};

TEST(UpstreamLease, ConnectsOnceAndGoesBackToThePoolOnlyWhenItEndsClean) {
  peer_end peer;
  asio::io_context ioc;
  pool p(4);
  const auto key = peer.key();
  auto l = p.acquire(key, {});
  EXPECT_FALSE(l);  // nothing pooled yet: the caller connects
  error_code ec;
  asio::co_spawn(ioc, [&]() -> awaitable<void> { ec = co_await l.connect(peer.endpoint(), ioc.get_executor()); },
                 asio::detached);
  ioc.run();
  ASSERT_FALSE(ec) << ec.message();
  ASSERT_TRUE(l);
  EXPECT_FALSE(l.reused());
  EXPECT_EQ(l->key, key);
  peer.accept();
  error_code opt_ec;
  tcp::no_delay nodelay;
  l->sock.get_option(nodelay, opt_ec);
  EXPECT_TRUE(nodelay.value());  // the one connect path sets TCP_NODELAY

  l.release(/*keep_alive=*/true);
  EXPECT_FALSE(l);
  EXPECT_EQ(p.idle_count(), 1u);
  auto again = p.acquire(key, {});
  ASSERT_TRUE(again);
  EXPECT_TRUE(again.reused());
  EXPECT_EQ(p.idle_count(), 0u);
  auto fresh = p.acquire(key, {acquire_policy::staleness::peek, /*fresh=*/true, 1});
  EXPECT_FALSE(fresh);  // a fresh one is asked for: the pool is not used

  // Left over bytes, or no keep-alive: closed with a FIN, not pooled.
  again->buf.commit(asio::buffer_copy(again->buf.prepare(1), asio::buffer("x", 1)));
  again.release(true);
  EXPECT_EQ(p.idle_count(), 0u);
  EXPECT_EQ(peer.read_end(), asio::error::eof);
}

TEST(UpstreamLease, DroppedWithoutEndingCleanIsAReset) {
  peer_end peer;
  asio::io_context ioc;
  pool p(4);
  const auto key = peer.key();  // the lease keeps a pointer to it: it must outlive the lease
  {
    auto l = p.acquire(key, {});
    error_code ec;
    asio::co_spawn(ioc, [&]() -> awaitable<void> { ec = co_await l.connect(peer.endpoint(), ioc.get_executor()); },
                   asio::detached);
    ioc.run();
    ASSERT_FALSE(ec);
    peer.accept();
  }  // a stage that failed mid-exchange: the peer must not take the truncation for a clean end
  EXPECT_EQ(peer.read_end(), asio::error::connection_reset);
  EXPECT_EQ(p.idle_count(), 0u);
}

TEST(UpstreamLease, ARefusedConnectLeavesNoConnection) {
  asio::io_context ioc;
  pool p(4);
  tcp::acceptor closed(ioc, tcp::endpoint(asio::ip::make_address("127.0.0.1"), 0));
  const auto ep = closed.local_endpoint();
  closed.close();
  const std::string key = "127.0.0.1:" + std::to_string(ep.port());
  auto l = p.acquire(key, {});
  error_code ec;
  asio::co_spawn(ioc, [&]() -> awaitable<void> { ec = co_await l.connect(ep, ioc.get_executor()); }, asio::detached);
  ioc.run();
  EXPECT_EQ(ec, asio::error::connection_refused);
  EXPECT_FALSE(l);
}

}  // namespace
}  // namespace ingressd::upstream
