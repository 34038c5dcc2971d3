// Router pool selection (contract §4.2, ray-serve-ingress.md §4.1) and the per-worker cursor.
#include <map>
#include <vector>

#include <gtest/gtest.h>

#include "ingressd/routing/router_pool.hpp"
#include "ingressd/topology/topology.hpp"

namespace ingressd::routing {
namespace {

using topology::target;

target router(std::string ip, std::uint16_t port) { return target{std::move(ip), port, "", "r"}; }

TEST(RouterPool, NoRoutersGivesEmptyPool) {
  EXPECT_TRUE(build_router_pool(std::vector<target>{}, "10.0.0.1").empty());
  EXPECT_TRUE(build_router_pool(std::vector<target>{}, "").empty());
}

TEST(RouterPool, ColocatedOnlySortedByIpThenPort) {
  const std::vector<target> routers = {
      router("10.0.0.9", 30004),  // remote
      router("10.0.0.5", 30006),
      router("10.0.0.1", 30001),  // remote, smaller: must not be chosen while a local one exists
      router("10.0.0.5", 30004),
      router("10.0.0.5", 30005),
  };
  EXPECT_EQ(build_router_pool(routers, "10.0.0.5"), (std::vector<std::size_t>{3, 4, 1}));
}

TEST(RouterPool, SingleColocated) {
  const std::vector<target> routers = {router("10.0.0.1", 1), router("10.0.0.2", 2)};
  EXPECT_EQ(build_router_pool(routers, "10.0.0.2"), (std::vector<std::size_t>{1}));
}

TEST(RouterPool, ColocatedPortsCompareNumerically) {
  const std::vector<target> routers = {router("10.0.0.5", 9000), router("10.0.0.5", 10000),
                                       router("10.0.0.5", 800)};
  EXPECT_EQ(build_router_pool(routers, "10.0.0.5"), (std::vector<std::size_t>{2, 0, 1}));
}

TEST(RouterPool, NoneColocatedPicksSmallestIpAsText) {
  // As text "10.0.0.10" < "10.0.0.9" (and "10.0.0.10" < "10.0.0.2"), unlike numeric order.
  const std::vector<target> routers = {router("10.0.0.9", 30004), router("10.0.0.2", 30004),
                                       router("10.0.0.10", 30004)};
  EXPECT_EQ(build_router_pool(routers, "10.0.0.1"), (std::vector<std::size_t>{2}));
}

TEST(RouterPool, NoneColocatedTiesBrokenByPort) {
  const std::vector<target> routers = {router("10.0.0.10", 30005), router("10.0.0.9", 1),
                                       router("10.0.0.10", 30004)};
  EXPECT_EQ(build_router_pool(routers, "10.0.0.1"), (std::vector<std::size_t>{2}));
}

TEST(RouterPool, EveryRemoteNodePicksTheSameRouter) {
  const std::vector<target> routers = {router("10.0.0.9", 30004), router("10.0.0.10", 30004),
                                       router("10.0.0.11", 30004)};
  for (const char* node : {"10.0.0.1", "10.0.0.2", "10.0.0.200", ""})
    EXPECT_EQ(build_router_pool(routers, node), (std::vector<std::size_t>{1})) << node;
  // ...while a node hosting a router uses its own.
  EXPECT_EQ(build_router_pool(routers, "10.0.0.9"), (std::vector<std::size_t>{0}));
}

TEST(RouterPool, DuplicateEntriesKeepDocumentOrder) {
  const std::vector<target> routers = {router("10.0.0.5", 1), router("10.0.0.5", 1)};
  EXPECT_EQ(build_router_pool(routers, "10.0.0.5"), (std::vector<std::size_t>{0, 1}));
  EXPECT_EQ(build_router_pool(routers, "10.0.0.6"), (std::vector<std::size_t>{0}));
}

TEST(RouterPool, Ipv6ColocatedAndText) {
  const std::vector<target> routers = {router("fd00::2", 2), router("fd00::10", 1), router("fd00::2", 1)};
  EXPECT_EQ(build_router_pool(routers, "fd00::2"), (std::vector<std::size_t>{2, 0}));
  EXPECT_EQ(build_router_pool(routers, "fd00::1"), (std::vector<std::size_t>{1}));
}

// ---- rr_cursor ----

TEST(RouterPoolCursor, AdvancesOncePerCallAndWraps) {
  rr_cursor c;
  EXPECT_EQ(c.peek(), 0u);
  EXPECT_EQ(c.take(3), 0u);
  EXPECT_EQ(c.peek(), 1u);
  EXPECT_EQ(c.take(3), 1u);
  EXPECT_EQ(c.take(3), 2u);
  EXPECT_EQ(c.take(3), 0u);  // wraps
  EXPECT_EQ(c.take(3), 1u);
}

TEST(RouterPoolCursor, SinglePoolAlwaysZero) {
  rr_cursor c(7);
  for (int i = 0; i < 10; ++i) EXPECT_EQ(c.take(1), 0u);
}

TEST(RouterPoolCursor, StartOffsetAndPoolShrink) {
  rr_cursor c(5);
  EXPECT_EQ(c.take(3), 2u);  // 5 % 3
  EXPECT_EQ(c.take(3), 0u);
  // A cursor that outgrew a smaller pool still lands in range.
  rr_cursor big(4);
  EXPECT_EQ(big.take(2), 0u);
  EXPECT_EQ(big.take(2), 1u);
  EXPECT_EQ(big.take(2), 0u);
}

TEST(RouterPoolCursor, TryOrderVisitsEveryRouterOnce) {
  // The caller tries pool[(start + i) % n] for i in [0, n): each router exactly once.
  rr_cursor c;
  const std::size_t n = 4;
  for (int request = 0; request < 8; ++request) {
    const std::size_t start = c.take(n);
    std::vector<int> seen(n, 0);
    for (std::size_t i = 0; i < n; ++i) ++seen[(start + i) % n];
    for (int s : seen) EXPECT_EQ(s, 1);
    EXPECT_EQ(start, static_cast<std::size_t>(request) % n);
  }
}

TEST(RouterPoolCursor, StartOffsetsSpreadEvenly) {
  for (std::size_t n : {1u, 2u, 3u, 5u, 8u}) {
    rr_cursor c(3);
    std::map<std::size_t, int> counts;
    const int calls = 1000 * static_cast<int>(n);
    for (int i = 0; i < calls; ++i) {
      const std::size_t s = c.take(n);
      ASSERT_LT(s, n);
      ++counts[s];
    }
    ASSERT_EQ(counts.size(), n);
    for (const auto& [start, count] : counts) EXPECT_EQ(count, 1000) << "n=" << n << " start=" << start;
  }
}

}  // namespace
}  // namespace ingressd::routing
