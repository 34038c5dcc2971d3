// health::state_machine: fall/rise counting (HAProxy semantics), check intervals, no flapping.
#include <chrono>
#include <optional>

#include <gtest/gtest.h>

#include "ingressd/health/state_machine.hpp"

namespace ingressd::health {
namespace {

using namespace std::chrono_literals;

constexpr duration inter = 5000ms;
constexpr duration fast = 250ms;

TEST(HealthState, StartsUpWithNormalInterval) {
  state_machine sm(2, 2, inter, fast);
  EXPECT_TRUE(sm.up());
  EXPECT_FALSE(sm.transitioning());
  EXPECT_EQ(sm.next_interval(), inter);
}

TEST(HealthState, CanStartDown) {
  state_machine sm(2, 2, inter, fast, /*up=*/false);
  EXPECT_FALSE(sm.up());
  EXPECT_EQ(sm.next_interval(), fast);
}

TEST(HealthState, GoesDownAfterFallConsecutiveFailures) {
  state_machine sm(3, 2, inter, fast);
  EXPECT_EQ(sm.record(false), std::nullopt);
  EXPECT_TRUE(sm.up());
  EXPECT_EQ(sm.streak(), 1u);
  EXPECT_EQ(sm.record(false), std::nullopt);
  EXPECT_TRUE(sm.up());
  EXPECT_EQ(sm.record(false), std::optional<bool>(false));
  EXPECT_FALSE(sm.up());
  EXPECT_EQ(sm.streak(), 0u);
  // Further failures are not transitions.
  EXPECT_EQ(sm.record(false), std::nullopt);
  EXPECT_FALSE(sm.up());
}

TEST(HealthState, ComesBackUpAfterRiseConsecutiveSuccesses) {
  state_machine sm(1, 3, inter, fast);
  ASSERT_EQ(sm.record(false), std::optional<bool>(false));
  EXPECT_EQ(sm.record(true), std::nullopt);
  EXPECT_EQ(sm.record(true), std::nullopt);
  EXPECT_FALSE(sm.up());
  EXPECT_EQ(sm.record(true), std::optional<bool>(true));
  EXPECT_TRUE(sm.up());
  EXPECT_EQ(sm.record(true), std::nullopt);
}

TEST(HealthState, SuccessWhileUpResetsFailureCount) {
  state_machine sm(2, 2, inter, fast);
  EXPECT_EQ(sm.record(false), std::nullopt);
  EXPECT_EQ(sm.record(true), std::nullopt);
  EXPECT_EQ(sm.streak(), 0u);
  EXPECT_EQ(sm.record(false), std::nullopt);  // only one in a row again
  EXPECT_TRUE(sm.up());
  EXPECT_EQ(sm.record(false), std::optional<bool>(false));
}

TEST(HealthState, FailureWhileDownResetsSuccessCount) {
  state_machine sm(1, 2, inter, fast);
  ASSERT_EQ(sm.record(false), std::optional<bool>(false));
  EXPECT_EQ(sm.record(true), std::nullopt);
  EXPECT_EQ(sm.record(false), std::nullopt);
  EXPECT_EQ(sm.streak(), 0u);
  EXPECT_EQ(sm.record(true), std::nullopt);
  EXPECT_FALSE(sm.up());
  EXPECT_EQ(sm.record(true), std::optional<bool>(true));
}

TEST(HealthState, FastIntervalWhileTransitioningOrDown) {
  state_machine sm(2, 2, inter, fast);
  EXPECT_EQ(sm.next_interval(), inter);
  sm.record(false);  // UP, one failure: transitioning
  EXPECT_TRUE(sm.transitioning());
  EXPECT_EQ(sm.next_interval(), fast);
  sm.record(false);  // DOWN
  EXPECT_FALSE(sm.up());
  EXPECT_FALSE(sm.transitioning());
  EXPECT_EQ(sm.next_interval(), fast);
  sm.record(true);  // DOWN, one success: transitioning
  EXPECT_TRUE(sm.transitioning());
  EXPECT_EQ(sm.next_interval(), fast);
  sm.record(true);  // UP again, steady
  EXPECT_TRUE(sm.up());
  EXPECT_EQ(sm.next_interval(), inter);
}

TEST(HealthState, SuccessWhileUpWithPendingFailureRestoresNormalInterval) {
  state_machine sm(3, 2, inter, fast);
  sm.record(false);
  EXPECT_EQ(sm.next_interval(), fast);
  sm.record(true);
  EXPECT_EQ(sm.next_interval(), inter);
}

TEST(HealthState, AlternatingResultsNeverFlap) {
  for (bool start_up : {true, false}) {
    state_machine sm(2, 2, inter, fast, start_up);
    for (int i = 0; i < 50; ++i) {
      EXPECT_EQ(sm.record(i % 2 == 0), std::nullopt) << "start_up=" << start_up << " i=" << i;
      EXPECT_EQ(sm.up(), start_up);
    }
  }
}

TEST(HealthState, FallAndRiseOfOneSwitchOnEveryChange) {
  state_machine sm(1, 1, inter, fast);
  EXPECT_EQ(sm.record(false), std::optional<bool>(false));
  EXPECT_EQ(sm.record(true), std::optional<bool>(true));
  EXPECT_EQ(sm.record(true), std::nullopt);
}

TEST(HealthState, ZeroFallOrRiseActsAsOne) {
  state_machine sm(0, 0, inter, fast);
  EXPECT_EQ(sm.record(false), std::optional<bool>(false));
  EXPECT_EQ(sm.record(true), std::optional<bool>(true));
}

TEST(HealthState, BuiltFromSettings) {
  config::health_settings s;  // defaults: fall 2, rise 2, 5s, 250ms
  state_machine sm(s);
  EXPECT_EQ(sm.next_interval(), s.interval);
  sm.record(false);
  EXPECT_EQ(sm.next_interval(), s.fast_interval);
  EXPECT_EQ(sm.record(false), std::optional<bool>(false));
}

}  // namespace
}  // namespace ingressd::health
