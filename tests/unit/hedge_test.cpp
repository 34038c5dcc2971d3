// Hedged router calls, sans I/O: the delay estimator (router.hedge auto), the budget
// (router.hedge_budget) on an injected clock, and when a pool hedges at all.
#include <gtest/gtest.h>

#include "ingressd/routing/hedge.hpp"

namespace {

using namespace std::chrono_literals;
using ingressd::routing::hedge_after;
using ingressd::routing::hedge_budget;
using ingressd::routing::hedge_delay;
using clock_type = std::chrono::steady_clock;

void record_n(hedge_delay& d, std::size_t n, clock_type::duration latency) {
  for (std::size_t i = 0; i < n; ++i) d.record(latency);
}

TEST(HedgeDelay, WaitsTheLongestUntilItHasSeenEnoughReplies) {
  hedge_delay d;
  EXPECT_EQ(d.delay(), hedge_delay::max_delay);
  record_n(d, hedge_delay::recompute_every - 1, 100us);
  EXPECT_EQ(d.delay(), hedge_delay::max_delay);
  d.record(100us);
  EXPECT_EQ(d.delay(), hedge_delay::min_delay);  // 2 x 100 us is below the floor
}

TEST(HedgeDelay, IsTwiceTheNinetiethPercentile) {
  hedge_delay d;
  // 128 replies, 116 at 2 ms and 12 at 40 ms: the 90th percentile (index 115) is a fast one.
  record_n(d, 116, 2ms);
  record_n(d, 12, 40ms);
  EXPECT_EQ(d.delay(), 4ms);
  // Once more than a tenth are slow, the percentile is a slow one: 2 x 20 ms.
  hedge_delay e;
  record_n(e, 100, 2ms);
  record_n(e, 28, 20ms);
  EXPECT_EQ(e.delay(), 40ms);
}

TEST(HedgeDelay, StaysWithinItsBounds) {
  hedge_delay slow;
  record_n(slow, 128, 200ms);
  EXPECT_EQ(slow.delay(), hedge_delay::max_delay);
  hedge_delay fast;
  record_n(fast, 128, 10us);
  EXPECT_EQ(fast.delay(), hedge_delay::min_delay);
}

TEST(HedgeDelay, ForgetsOldReplies) {
  hedge_delay d;
  record_n(d, 128, 20ms);
  EXPECT_EQ(d.delay(), 40ms);
  // A window's worth of fast replies replaces the slow ones.
  record_n(d, 128, 1ms);
  EXPECT_EQ(d.delay(), 2ms);
}

TEST(HedgeBudget, AllowsItsShareOfCalls) {
  hedge_budget b(100);  // 10 %
  const auto t0 = clock_type::time_point{} + 1h;
  int granted = 0;
  for (int i = 0; i < 100; ++i) {
    b.call(t0);
    if (b.try_hedge(t0)) ++granted;
  }
  EXPECT_EQ(granted, 10);
  b.call(t0);
  EXPECT_FALSE(b.try_hedge(t0));  // 10 of 101 calls already: an 11th would pass 10 %
}

TEST(HedgeBudget, RefusesBeforeAnyCall) {
  hedge_budget b(1000);
  EXPECT_FALSE(b.try_hedge(clock_type::time_point{} + 1h));  // no call to hedge
}

TEST(HedgeBudget, ZeroNeverHedgesAndAllHedgesEveryCall) {
  const auto t0 = clock_type::time_point{} + 1h;
  hedge_budget none(0), all(1000);
  for (int i = 0; i < 50; ++i) {
    none.call(t0);
    all.call(t0);
    EXPECT_FALSE(none.try_hedge(t0));
    EXPECT_TRUE(all.try_hedge(t0));
  }
}

TEST(HedgeBudget, SlidesWithTheWindow) {
  hedge_budget b(100, 10s);
  auto t = clock_type::time_point{} + 1h;
  for (int i = 0; i < 10; ++i) b.call(t);
  EXPECT_TRUE(b.try_hedge(t));
  EXPECT_FALSE(b.try_hedge(t));  // 1 of 10 spent
  // 9.5 s later the calls are still in the window: still spent.
  t += 9500ms;
  b.call(t);
  EXPECT_FALSE(b.try_hedge(t));
  // 11 s after them their bucket has left the window (its call and its hedge): with 9 more
  // calls, 10 are in the window, which allows one hedge again.
  t += 1500ms;
  for (int i = 0; i < 9; ++i) b.call(t);
  EXPECT_TRUE(b.try_hedge(t));
}

TEST(HedgeBudget, ALongPauseEmptiesTheWindow) {
  hedge_budget b(100, 10s);
  auto t = clock_type::time_point{} + 1h;
  for (int i = 0; i < 10; ++i) b.call(t);
  EXPECT_TRUE(b.try_hedge(t));
  t += 1h;
  EXPECT_FALSE(b.try_hedge(t));  // nothing called within the window
  for (int i = 0; i < 10; ++i) b.call(t);
  EXPECT_TRUE(b.try_hedge(t));
}

TEST(HedgeAfter, OnlyPoolsOfTwoOrMoreWithABudgetHedge) {
  hedge_delay est;
  record_n(est, 16, 1ms);
  EXPECT_EQ(hedge_after(true, {}, 100, 2, est), 2ms);
  EXPECT_EQ(hedge_after(true, {}, 100, 1, est), std::nullopt);   // nobody else to ask
  EXPECT_EQ(hedge_after(true, {}, 0, 3, est), std::nullopt);     // budget 0 %
  EXPECT_EQ(hedge_after(false, 7ms, 100, 2, est), 7ms);          // a fixed delay
  EXPECT_EQ(hedge_after(false, {}, 100, 2, est), std::nullopt);  // off
}

// The race of one routing decision: every order of its events, and what the session is told.
using race = ingressd::routing::hedge_race;

/// A budget that allows every hedge (100 %, one call made).
hedge_budget open_budget(clock_type::time_point t) {
  hedge_budget b(1000);
  b.call(t);
  return b;
}

TEST(HedgeRace, NothingPlannedNothingSent) {
  race r;
  auto b = open_budget({});
  EXPECT_EQ(r.due(b, {}), race::launch::none);
  EXPECT_TRUE(r.may_plan());
  EXPECT_FALSE(r.first_ended());  // no hedge to wait for
  EXPECT_EQ(r.decide(false, false), race::taken::next_router);
  EXPECT_EQ(r.decide(true, false), race::taken::first);
}

TEST(HedgeRace, AFirstCallThatEndsBeforeItsHedgeIsDueLetsTheNextCallPlanAgain) {
  race r;
  r.plan(1);
  r.unplan();  // the first call failed fast: fail over, and hedge that call instead
  auto b = open_budget({});
  EXPECT_EQ(r.due(b, {}), race::launch::none);
  r.plan(2);
  EXPECT_EQ(r.due(b, {}), race::launch::send);
  EXPECT_EQ(r.router(), 2u);
  EXPECT_FALSE(r.may_plan());  // a decision hedges at most once
}

TEST(HedgeRace, TheBudgetRefusesAndNothingMoreIsPlanned) {
  race r;
  hedge_budget empty(0);
  r.plan(1);
  EXPECT_EQ(r.due(empty, {}), race::launch::refused);
  EXPECT_FALSE(r.launched());
  EXPECT_FALSE(r.may_plan());
  EXPECT_EQ(r.due(empty, {}), race::launch::none);  // asked once only
}

TEST(HedgeRace, TheHedgesPinnedReplyWinsAndCancelsTheFirstCall) {
  race r;
  auto b = open_budget({});
  r.plan(1);
  ASSERT_EQ(r.due(b, {}), race::launch::send);
  EXPECT_EQ(r.replied(race::call::hedge, true), race::call::first);
  EXPECT_TRUE(r.settled());
  // The cancelled first call ends without a reply; its late reply would not count either.
  EXPECT_EQ(r.replied(race::call::first, true), std::nullopt);
  EXPECT_TRUE(r.first_ended());
  EXPECT_FALSE(r.first_ended());  // the hedge is joined once
  EXPECT_EQ(r.decide(false, true), race::taken::hedge);
  EXPECT_EQ(r.decide(true, true), race::taken::hedge);
}

TEST(HedgeRace, TheFirstCallsPinnedReplyWinsAndCancelsTheHedge) {
  race r;
  auto b = open_budget({});
  r.plan(1);
  ASSERT_EQ(r.due(b, {}), race::launch::send);
  EXPECT_EQ(r.replied(race::call::first, true), race::call::hedge);
  EXPECT_EQ(r.replied(race::call::hedge, true), std::nullopt);  // too late
  EXPECT_TRUE(r.first_ended());
  EXPECT_EQ(r.decide(true, true), race::taken::first);
}

TEST(HedgeRace, APinnedReplyBeforeTheHedgeIsDueSendsNoHedge) {
  race r;
  auto b = open_budget({});
  r.plan(1);
  EXPECT_EQ(r.replied(race::call::first, true), std::nullopt);  // nothing to cancel
  EXPECT_EQ(r.due(b, {}), race::launch::none);
  EXPECT_FALSE(r.first_ended());
  EXPECT_EQ(r.decide(true, false), race::taken::first);
}

TEST(HedgeRace, AFirstReplyThatNamesNoReplicaWaitsForTheHedge) {
  race r;
  auto b = open_budget({});
  r.plan(1);
  ASSERT_EQ(r.due(b, {}), race::launch::send);
  EXPECT_EQ(r.replied(race::call::first, false), std::nullopt);  // a 503 from the router: keep racing
  EXPECT_FALSE(r.settled());
  EXPECT_TRUE(r.first_ended());
  EXPECT_EQ(r.replied(race::call::hedge, true), race::call::first);  // the hedge names a replica
  EXPECT_EQ(r.decide(true, true), race::taken::hedge);
}

TEST(HedgeRace, WhenNeitherNamesAReplicaTheFirstCallsReasonStands) {
  race r;
  auto b = open_budget({});
  r.plan(1);
  ASSERT_EQ(r.due(b, {}), race::launch::send);
  EXPECT_EQ(r.replied(race::call::first, false), std::nullopt);
  EXPECT_EQ(r.replied(race::call::hedge, false), std::nullopt);
  EXPECT_TRUE(r.first_ended());
  EXPECT_EQ(r.decide(true, true), race::taken::first);
}

TEST(HedgeRace, AFirstCallWithNoReplyTakesTheHedgesReason) {
  race r;
  auto b = open_budget({});
  r.plan(1);
  ASSERT_EQ(r.due(b, {}), race::launch::send);
  EXPECT_EQ(r.replied(race::call::hedge, false), std::nullopt);
  EXPECT_TRUE(r.first_ended());
  EXPECT_EQ(r.decide(false, true), race::taken::hedge_failure);
  EXPECT_EQ(r.decide(false, false), race::taken::next_router);  // neither replied: fail over
}

TEST(HedgeRace, AHedgeDueAfterAReplyWasTakenIsNotSent) {
  race r;
  auto b = open_budget({});
  r.plan(1);
  r.replied(race::call::first, true);
  EXPECT_EQ(r.due(b, {}), race::launch::none);
  EXPECT_TRUE(b.try_hedge({}));  // and took nothing from the budget
}

}  // namespace
