// The idle cap of the per-worker upstream pool: replicas keep max_idle, routers scale times it.
#include "ingressd/upstream/pool.hpp"

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

TEST(UpstreamPool, ZeroMeansNoPooling) {
  asio::io_context ioc;
  pool p(0);
  p.put(open_connection(ioc, "10.0.0.1:8000"), router_pool_scale);
  EXPECT_EQ(p.idle_count(), 0u);
}

}  // namespace
}  // namespace ingressd::upstream
