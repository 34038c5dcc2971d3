// grpc::choose_link and grpc::keepalive: which upstream link takes a call, and when a link is
// pinged or given up (issue #31 item 2).
#include "ingressd/grpc/link_policy.hpp"

#include <gtest/gtest.h>

#include <vector>

namespace ingressd::grpc {
namespace {

using namespace std::chrono_literals;
using act = keepalive::action;

link_room room(std::size_t calls, std::size_t limit = 100, std::int64_t window = 1 << 20, bool usable = true) {
  return {usable, calls, limit, window};
}

TEST(GrpcChooseLink, NoLinkYetOpensOne) { EXPECT_EQ(choose_link({}, 4), std::nullopt); }

TEST(GrpcChooseLink, CallsArePackedOntoTheFirstLinkWithRoom) {
  const std::vector<link_room> links{room(50), room(0)};
  EXPECT_EQ(choose_link(links, 4), 0u);
}

TEST(GrpcChooseLink, AFullLinkIsPassedOver) {
  const std::vector<link_room> links{room(100), room(99)};
  EXPECT_EQ(choose_link(links, 4), 1u);
}

TEST(GrpcChooseLink, ALinkWithoutWindowIsPassedOverWhileAnotherHasIt) {
  const std::vector<link_room> links{room(1, 100, 1000), room(80, 100, window_wanted)};
  EXPECT_EQ(choose_link(links, 4), 1u);
}

TEST(GrpcChooseLink, NoRoomUnderTheCapOpensANewLink) {
  const std::vector<link_room> links{room(100), room(3, 100, 0)};
  EXPECT_EQ(choose_link(links, 3), std::nullopt);
}

TEST(GrpcChooseLink, AtTheCapTheWidestWindowWithAFreeStream) {
  const std::vector<link_room> links{room(100), room(3, 100, 500), room(9, 100, 9000)};
  EXPECT_EQ(choose_link(links, 3), 2u);
}

TEST(GrpcChooseLink, AtTheCapWithEveryStreamTakenTheLeastBusy) {
  const std::vector<link_room> links{room(100, 100), room(40, 40), room(70, 70)};
  EXPECT_EQ(choose_link(links, 3), 1u);
}

TEST(GrpcChooseLink, UnusableLinksNeitherTakeCallsNorCountAgainstTheCap) {
  const std::vector<link_room> links{room(0, 100, 1 << 20, false), room(100, 100)};
  EXPECT_EQ(choose_link(links, 2), std::nullopt);  // one usable link, cap 2: open another
  EXPECT_EQ(choose_link(links, 1), 1u);
}

TEST(GrpcKeepalive, PingsOnlyABusyLinkThatWasQuietForAnInterval) {
  const auto t0 = keepalive::clock::time_point{} + 1h;
  keepalive k(10s, 5s);
  EXPECT_EQ(k.tick(t0 + 10s, false, t0), act::none);  // no calls: nothing to protect
  EXPECT_EQ(k.tick(t0 + 9s, true, t0), act::none);    // heard from it lately
  EXPECT_EQ(k.tick(t0 + 10s, true, t0), act::ping);
  EXPECT_EQ(k.next_tick(), 5s);
}

TEST(GrpcKeepalive, AnUnansweredPingLosesTheLink) {
  const auto t0 = keepalive::clock::time_point{} + 1h;
  keepalive k(10s, 5s);
  ASSERT_EQ(k.tick(t0 + 10s, true, t0), act::ping);
  EXPECT_EQ(k.tick(t0 + 14s, true, t0), act::none);
  EXPECT_EQ(k.tick(t0 + 15s, true, t0), act::lost);
}

TEST(GrpcKeepalive, AnyBytesAfterThePingAnswerIt) {
  const auto t0 = keepalive::clock::time_point{} + 1h;
  keepalive k(10s, 5s);
  ASSERT_EQ(k.tick(t0 + 10s, true, t0), act::ping);
  EXPECT_EQ(k.tick(t0 + 15s, true, t0 + 11s), act::none);  // its ACK came at 11 s
  EXPECT_EQ(k.next_tick(), 10s);
  EXPECT_EQ(k.tick(t0 + 21s, true, t0 + 11s), act::ping);
}

TEST(GrpcKeepalive, AtMostThreePingsWithoutDataThenWaitsForData) {
  // grpc-core's ping abuse policy closes the connection at the third strike (the fourth PING
  // without data from it): a quiet call must not be cut by its own keepalive.
  const auto t0 = keepalive::clock::time_point{} + 1h;
  keepalive k(10s, 5s);
  auto t = t0;
  for (unsigned i = 0; i < keepalive::max_pings_without_data; ++i) {
    t += 10s;
    ASSERT_EQ(k.tick(t, true, t - 10s), act::ping) << i;
    t += 1s;
    ASSERT_EQ(k.tick(t, true, t), act::none);  // answered
  }
  EXPECT_EQ(k.tick(t + 60s, true, t), act::none);
  k.data_received();
  EXPECT_EQ(k.tick(t + 60s, true, t), act::ping);
}

TEST(GrpcKeepalive, ZeroIntervalIsOff) {
  const auto t0 = keepalive::clock::time_point{} + 1h;
  keepalive k(0s, 5s);
  EXPECT_FALSE(k.enabled());
  EXPECT_EQ(k.tick(t0 + 1h, true, t0), act::none);
}

}  // namespace
}  // namespace ingressd::grpc
