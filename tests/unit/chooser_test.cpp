// The sans-I/O choices of a request's path (routing/chooser.hpp, topology::remap): which upstream
// serves it, in which order routers are tried, where it stands after a topology change.
#include <chrono>
#include <vector>

#include <gtest/gtest.h>

#include "ingressd/routing/chooser.hpp"
#include "ingressd/topology/snapshot.hpp"

namespace ingressd::routing {
namespace {

using namespace std::chrono_literals;
using kind = choice::kind;

choice pick(const std::vector<candidate>& c, choice_inputs in = {}) { return choose_upstream(c, in); }

/// choice_inputs by name: {"start", 2} and the like (designated initializers that leave members
/// out draw a warning from GCC 12).
struct in_ {
  choice_inputs v;
  in_& pinned(std::size_t i) { v.pinned = i; return *this; }
  in_& prefer_fallback() { v.prefer_fallback = true; return *this; }
  in_& fallback_usable(bool b = true) { v.fallback_usable = b; return *this; }
  in_& tried_any() { v.tried_any = true; return *this; }
  in_& start(std::size_t s) { v.start = s; return *this; }
  operator choice_inputs() const { return v; }  // NOLINT: used as an argument
};

TEST(Chooser, LeastLoadedUpReplicaWithTiesInRotation) {
  const std::vector<candidate> c{{true, 3}, {true, 1}, {true, 1}, {false, 0}};
  EXPECT_EQ(pick(c, in_().start(0)), (choice{kind::replica, 1}));
  EXPECT_EQ(pick(c, in_().start(2)), (choice{kind::replica, 2}));  // the tie starts where the rotor points
  EXPECT_EQ(pick(c, in_().start(3)), (choice{kind::replica, 1}));  // a down replica is never chosen, idle or not
}

TEST(Chooser, PinnedReplicaWhileUpAndUntried) {
  std::vector<candidate> c{{true, 0}, {true, 9}};
  EXPECT_EQ(pick(c, in_().pinned(1)), (choice{kind::replica, 1}));  // the router's choice beats the load
  c[1].up = false;  // health checks marked it down: falls through to the least loaded
  EXPECT_EQ(pick(c, in_().pinned(1)), (choice{kind::replica, 0}));
  c[1] = {true, 9, /*tried=*/true};  // it refused this request already
  EXPECT_EQ(pick(c, in_().pinned(1).tried_any()), (choice{kind::replica, 0}));
  EXPECT_EQ(pick(c, in_().pinned(7)), (choice{kind::replica, 0}));  // out of range: ignored
}

TEST(Chooser, TriedReplicasAreSkippedUntilNoneIsLeft) {
  std::vector<candidate> c{{true, 0, true}, {true, 5}, {true, 1, true}};
  EXPECT_EQ(pick(c, in_().tried_any()), (choice{kind::replica, 1}));
  c[1].tried = true;
  EXPECT_EQ(pick(c, in_().tried_any()), (choice{kind::none}));
}

TEST(Chooser, FallbackFirstWhenPreferredLastOtherwiseAndNeverAfterARefusal) {
  const std::vector<candidate> down{{false, 0}, {false, 0}};
  const std::vector<candidate> up{{true, 0}};
  // No healthy replica (or none at all: scaled to zero): the fallback target.
  EXPECT_EQ(pick(down, in_().fallback_usable()), (choice{kind::fallback}));
  EXPECT_EQ(pick({}, in_().fallback_usable()), (choice{kind::fallback}));
  EXPECT_EQ(pick({}, {}), (choice{kind::none}));
  // unknown_replica_id: the fallback before any replica.
  EXPECT_EQ(pick(up, in_().prefer_fallback().fallback_usable()), (choice{kind::fallback}));
  EXPECT_EQ(pick(up, in_().prefer_fallback().fallback_usable(false)), (choice{kind::replica, 0}));
  // After a refusal (the fallback's own included) a request does not end at the fallback.
  EXPECT_EQ(pick(up, in_().prefer_fallback().fallback_usable().tried_any()),
            (choice{kind::replica, 0}));
  EXPECT_EQ(pick(down, in_().fallback_usable().tried_any()), (choice{kind::none}));
}

TEST(RouterAttemptOrder, FromTheCursorWithRoutersThatFailedRecentlyLast) {
  using st = router_memory::state;
  const std::vector<st> all_up{st::up, st::up, st::up};
  EXPECT_EQ(router_attempt_order(all_up, 0), (boost::container::small_vector<std::size_t, 8>{0, 1, 2}));
  EXPECT_EQ(router_attempt_order(all_up, 2), (boost::container::small_vector<std::size_t, 8>{2, 0, 1}));
  const std::vector<st> one_down{st::up, st::down, st::probe};
  EXPECT_EQ(router_attempt_order(one_down, 1), (boost::container::small_vector<std::size_t, 8>{2, 0, 1}));
  EXPECT_TRUE(router_attempt_order({}, 0).empty());
}

TEST(RouterAttemptOrder, SlowRoutersAfterTheUpOnesBeforeTheDownOnes) {
  using st = router_memory::state;
  const std::vector<st> mixed{st::slow, st::down, st::up, st::slow};
  // From the cursor (0): up {2}, then slow {0, 3}, then down {1}.
  EXPECT_EQ(router_attempt_order(mixed, 0), (boost::container::small_vector<std::size_t, 8>{2, 0, 3, 1}));
  EXPECT_EQ(router_attempt_order(mixed, 3), (boost::container::small_vector<std::size_t, 8>{2, 3, 0, 1}));
}

TEST(RouterAttemptOrder, WithTheMemoryAndAnInjectedClock) {
  // A router that gave no reply goes last until its back-off ends, then is probed in cursor order.
  router_memory m(500ms, 4s);
  const auto t0 = router_memory::clock::time_point{} + 100s;
  const std::vector<std::string> pool{"a", "b"};
  auto order_at = [&](router_memory::clock::time_point now, std::size_t start) {
    std::vector<router_memory::state> s;
    for (const auto& k : pool) s.push_back(m.get(k, now));
    return router_attempt_order(s, start);
  };
  m.failed("a", t0);
  EXPECT_EQ(order_at(t0 + 100ms, 0), (boost::container::small_vector<std::size_t, 8>{1, 0}));
  EXPECT_EQ(order_at(t0 + 600ms, 0), (boost::container::small_vector<std::size_t, 8>{0, 1}));  // probe
  m.replied("a");
  EXPECT_EQ(order_at(t0 + 700ms, 0), (boost::container::small_vector<std::size_t, 8>{0, 1}));
}

}  // namespace
}  // namespace ingressd::routing

namespace ingressd::topology {
namespace {

target t(std::string ip, std::uint16_t port, std::string name) { return target{std::move(ip), port, "", std::move(name)}; }

app make_app(std::string name, std::string prefix, std::vector<target> replicas) {
  app a;
  a.name = std::move(name);
  a.route_prefix = std::move(prefix);
  a.replicas = std::move(replicas);
  return a;
}

TEST(Remap, FollowsTheAppAndThePinnedReplicaByName) {
  document d;
  d.apps.push_back(make_app("a", "/a", {t("10.0.0.1", 1, "r1")}));
  d.apps.push_back(make_app("llm", "/", {t("10.0.0.1", 2, "r2"), t("10.0.0.1", 3, "r3")}));
  const auto from = make_snapshot(d, "10.0.0.1", "", 1);

  document moved;  // apps reordered, a replica added before the pinned one
  moved.apps.push_back(make_app("llm", "/", {t("10.0.0.1", 4, "r4"), t("10.0.0.1", 3, "r3"), t("10.0.0.1", 2, "r2")}));
  moved.apps.push_back(d.apps[0]);
  const auto to = make_snapshot(moved, "10.0.0.1", "", 2);
  EXPECT_EQ(remap(*from, {1, 1}, *to), (placement{0, 1}));  // llm is app 0 now, r3 its replica 1
  EXPECT_EQ(remap(*from, {1, std::nullopt}, *to), (placement{0, std::nullopt}));

  document gone;  // the pinned replica left: the app stays, the pin goes
  gone.apps.push_back(make_app("llm", "/", {t("10.0.0.1", 2, "r2")}));
  const auto smaller = make_snapshot(gone, "10.0.0.1", "", 3);
  EXPECT_EQ(remap(*from, {1, 1}, *smaller), (placement{0, std::nullopt}));
  EXPECT_EQ(remap(*from, {0, 0}, *smaller), std::nullopt);  // the app left
}

}  // namespace
}  // namespace ingressd::topology
