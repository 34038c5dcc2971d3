// make_snapshot: endpoint resolution, co-location, router pools, signatures and the route table.
#include <chrono>

#include <gtest/gtest.h>

#include "ingressd/topology/snapshot.hpp"

namespace ingressd::topology {
namespace {

using boost::asio::ip::make_address;
using boost::asio::ip::tcp;

target t(std::string ip, std::uint16_t port, std::string name) {
  return target{std::move(ip), port, "i-" + name, std::move(name)};
}

document sample() {
  document d;
  app llm;
  llm.name = "llm";
  llm.route_prefix = "/v1";
  llm.replicas = {t("10.0.0.5", 30001, "rep-a"), t("10.0.0.6", 30001, "rep-b"), t("10.0.0.5", 30002, "rep-c")};
  llm.routers = {t("10.0.0.6", 30004, "rt-6"), t("10.0.0.5", 30005, "rt-5b"), t("10.0.0.5", 30004, "rt-5a")};
  llm.router_fallback = true;
  app echo;
  echo.name = "echo";
  echo.route_prefix = "/";
  echo.replicas = {t("10.0.0.7", 8000, "echo-1")};
  d.apps = {llm, echo};
  d.http_fallback = t("10.0.0.1", 8000, "proxy");
  return d;
}

tcp::endpoint ep(const char* ip, unsigned short port) { return {make_address(ip), port}; }

TEST(Snapshot, BasicViewFields) {
  const auto before = std::chrono::system_clock::now();
  auto s = make_snapshot(sample(), "10.0.0.5", "", 42);
  ASSERT_NE(s, nullptr);
  EXPECT_EQ(s->generation, 42u);
  EXPECT_EQ(s->node_ip, "10.0.0.5");
  EXPECT_GE(s->updated, before);
  EXPECT_LE(s->updated, std::chrono::system_clock::now());
  EXPECT_EQ(s->doc, sample());
  ASSERT_EQ(s->apps.size(), 2u);

  const app_view& llm = s->apps[0];
  EXPECT_EQ(llm.name, "llm");
  EXPECT_EQ(llm.route_prefix, "/v1");
  EXPECT_TRUE(llm.router_fallback);
  ASSERT_EQ(llm.replicas.size(), 3u);
  EXPECT_EQ(llm.replicas[1].key, "10.0.0.6:30001");
  EXPECT_EQ(llm.replicas[1].name, "rep-b");
  EXPECT_EQ(llm.replicas[1].dial, ep("10.0.0.6", 30001));
  EXPECT_FALSE(llm.replicas[1].colocated);
  EXPECT_TRUE(llm.replicas[0].colocated);
  EXPECT_TRUE(llm.replicas[2].colocated);

  ASSERT_EQ(llm.replica_by_name.size(), 3u);
  EXPECT_EQ(llm.replica_by_name.at("rep-a"), 0u);
  EXPECT_EQ(llm.replica_by_name.at("rep-b"), 1u);
  EXPECT_EQ(llm.replica_by_name.at("rep-c"), 2u);
  EXPECT_EQ(llm.replica_by_name.count("rt-5a"), 0u);  // routers are not replicas

  EXPECT_FALSE(s->apps[1].router_fallback);
  EXPECT_TRUE(s->apps[1].router_pool.empty());
}

TEST(Snapshot, RouterPoolIsColocatedSorted) {
  auto s = make_snapshot(sample(), "10.0.0.5", "", 1);
  const auto& pool = s->apps[0].router_pool;
  ASSERT_EQ(pool.size(), 2u);
  EXPECT_EQ(pool[0].name, "rt-5a");
  EXPECT_EQ(pool[0].key, "10.0.0.5:30004");
  EXPECT_TRUE(pool[0].colocated);
  EXPECT_EQ(pool[1].name, "rt-5b");
  EXPECT_EQ(s->apps[0].pool_signature, "10.0.0.5:30004,10.0.0.5:30005");
}

TEST(Snapshot, RouterPoolRemoteSingle) {
  auto s = make_snapshot(sample(), "10.0.0.99", "", 1);
  const auto& pool = s->apps[0].router_pool;
  ASSERT_EQ(pool.size(), 1u);
  EXPECT_EQ(pool[0].name, "rt-5a");
  EXPECT_FALSE(pool[0].colocated);
  EXPECT_EQ(pool[0].dial, ep("10.0.0.5", 30004));
}

TEST(Snapshot, NoRoutersEmptyPoolAndSignature) {
  auto s = make_snapshot(sample(), "10.0.0.5", "", 1);
  EXPECT_TRUE(s->apps[1].router_pool.empty());
  EXPECT_EQ(s->apps[1].pool_signature, "");
}

TEST(Snapshot, LocalDialHostOnlyForColocated) {
  auto s = make_snapshot(sample(), "10.0.0.5", "127.0.0.1", 1);
  const app_view& llm = s->apps[0];
  EXPECT_EQ(llm.replicas[0].dial, ep("127.0.0.1", 30001));
  EXPECT_EQ(llm.replicas[2].dial, ep("127.0.0.1", 30002));
  EXPECT_EQ(llm.replicas[1].dial, ep("10.0.0.6", 30001));  // remote keeps its ip
  // The key stays the document's address: metrics and pools must not depend on dial rewriting.
  EXPECT_EQ(llm.replicas[0].key, "10.0.0.5:30001");
  EXPECT_EQ(llm.router_pool[0].dial, ep("127.0.0.1", 30004));
  EXPECT_EQ(s->apps[1].replicas[0].dial, ep("10.0.0.7", 8000));
  ASSERT_TRUE(s->fallback.has_value());
  EXPECT_EQ(s->fallback->dial, ep("10.0.0.1", 8000));
}

TEST(Snapshot, LocalDialHostAppliesToColocatedFallback) {
  auto s = make_snapshot(sample(), "10.0.0.1", "127.0.0.1", 1);
  ASSERT_TRUE(s->fallback.has_value());
  EXPECT_TRUE(s->fallback->colocated);
  EXPECT_EQ(s->fallback->dial, ep("127.0.0.1", 8000));
  EXPECT_EQ(s->fallback->key, "10.0.0.1:8000");
  EXPECT_EQ(s->fallback->name, "proxy");
}

TEST(Snapshot, NoLocalDialHostDialsDocumentIp) {
  auto s = make_snapshot(sample(), "10.0.0.5", "", 1);
  EXPECT_EQ(s->apps[0].replicas[0].dial, ep("10.0.0.5", 30001));
}

TEST(Snapshot, NoFallback) {
  document d = sample();
  d.http_fallback.reset();
  auto s = make_snapshot(std::move(d), "10.0.0.5", "", 1);
  EXPECT_FALSE(s->fallback.has_value());
}

TEST(Snapshot, Ipv6KeysAreBracketed) {
  document d;
  app a;
  a.name = "v6";
  a.route_prefix = "/";
  a.replicas = {t("fd00::5", 30001, "r1"), t("fd00::6", 30001, "r2")};
  a.routers = {t("fd00::5", 30004, "rt")};
  d.apps = {a};
  auto s = make_snapshot(std::move(d), "fd00::5", "::1", 1);
  const app_view& v = s->apps[0];
  EXPECT_EQ(v.replicas[0].key, "[fd00::5]:30001");
  EXPECT_EQ(v.replicas[0].dial, ep("::1", 30001));
  EXPECT_EQ(v.replicas[1].dial, ep("fd00::6", 30001));
  EXPECT_EQ(v.pool_signature, "[fd00::5]:30004");
}

TEST(Snapshot, PoolSignatureEqualForEqualPools) {
  // Replica churn and router order in the document do not change the pool.
  document a = sample();
  document b = sample();
  b.apps[0].replicas.pop_back();
  std::swap(b.apps[0].routers[1], b.apps[0].routers[2]);
  b.apps[0].routers.push_back(t("10.0.0.8", 30004, "rt-8"));  // remote: not in a co-located pool
  auto sa = make_snapshot(a, "10.0.0.5", "", 1);
  auto sb = make_snapshot(b, "10.0.0.5", "", 2);
  EXPECT_EQ(sa->apps[0].pool_signature, sb->apps[0].pool_signature);
}

TEST(Snapshot, PoolSignatureChangesWithPool) {
  auto base = make_snapshot(sample(), "10.0.0.5", "", 1);

  document added = sample();
  added.apps[0].routers.push_back(t("10.0.0.5", 30006, "rt-5c"));
  EXPECT_NE(make_snapshot(added, "10.0.0.5", "", 2)->apps[0].pool_signature, base->apps[0].pool_signature);

  document removed = sample();
  removed.apps[0].routers.pop_back();
  EXPECT_NE(make_snapshot(removed, "10.0.0.5", "", 2)->apps[0].pool_signature, base->apps[0].pool_signature);

  document moved = sample();
  moved.apps[0].routers[1].port = 30007;
  EXPECT_NE(make_snapshot(moved, "10.0.0.5", "", 2)->apps[0].pool_signature, base->apps[0].pool_signature);

  // Another node sees a different pool for the same document.
  EXPECT_NE(make_snapshot(sample(), "10.0.0.6", "", 2)->apps[0].pool_signature, base->apps[0].pool_signature);
}

TEST(Snapshot, RoutesUseAppIndices) {
  auto s = make_snapshot(sample(), "10.0.0.5", "", 1);
  EXPECT_EQ(s->routes.match("/v1/chat"), 0u);
  EXPECT_EQ(s->routes.match("/v1"), 0u);
  EXPECT_EQ(s->routes.match("/v1x"), 1u);
  EXPECT_EQ(s->routes.match("/"), 1u);
}

TEST(Snapshot, EmptyDocument) {
  auto s = make_snapshot(document{}, "10.0.0.5", "127.0.0.1", 0);
  EXPECT_TRUE(s->apps.empty());
  EXPECT_FALSE(s->routes.match("/").has_value());
  EXPECT_FALSE(s->fallback.has_value());
  EXPECT_EQ(s->router_count(), 0u);
  EXPECT_EQ(s->replica_count(), 0u);
  EXPECT_EQ(s->apps_with_routers(), 0u);
}

TEST(Snapshot, Counts) {
  auto s = make_snapshot(sample(), "10.0.0.5", "", 1);
  EXPECT_EQ(s->router_count(), 3u);  // all router targets, not only the pool
  EXPECT_EQ(s->replica_count(), 4u);
  EXPECT_EQ(s->apps_with_routers(), 1u);
}

TEST(Snapshot, EachAppHasItsFallbackTheGroupsOwnFirst) {
  auto d = sample();
  d.apps[0].fallback = t("10.0.0.1", 8500, "group-proxy");
  auto s = make_snapshot(d, "10.0.0.5", "", 1);
  ASSERT_TRUE(s->apps[0].fallback.has_value());
  EXPECT_EQ(s->apps[0].fallback->key, "10.0.0.1:8500");
  ASSERT_TRUE(s->apps[1].fallback.has_value());
  EXPECT_EQ(s->apps[1].fallback->key, "10.0.0.1:8000");  // fallback_targets.HTTP
  EXPECT_EQ(s->apps[1].fallback->state, s->fallback->state);
  d.http_fallback.reset();
  EXPECT_FALSE(make_snapshot(d, "10.0.0.5", "", 2)->apps[1].fallback.has_value());
}

TEST(Snapshot, UpstreamStateIsOnePerKeyAndOutlivesATopologyChange) {
  // In-flight counts and health are node-wide and belong to the upstream, not to one document:
  // a replica that stays keeps them; one that is new starts up and idle.
  auto d = sample();
  d.apps[1].replicas.push_back(t("10.0.0.5", 30001, "rep-a-again"));  // the same address in two apps
  auto first = make_snapshot(d, "10.0.0.5", "", 1);
  EXPECT_EQ(first->apps[0].replicas[0].state, first->apps[1].replicas[1].state);
  EXPECT_EQ(first->states.size(), 5u);  // 4 replica addresses + the fallback
  first->apps[0].replicas[0].state->in_flight = 3;
  first->apps[0].replicas[0].state->up = false;

  auto d2 = sample();
  d2.apps[0].replicas.push_back(t("10.0.0.9", 30001, "rep-new"));
  auto second = make_snapshot(d2, "10.0.0.5", "", 2, {}, first.get());
  EXPECT_EQ(second->apps[0].replicas[0].state, first->apps[0].replicas[0].state);
  EXPECT_EQ(second->apps[0].replicas[0].state->in_flight, 3u);
  EXPECT_FALSE(second->apps[0].replicas[0].state->up);
  const auto* fresh = second->apps[0].replicas[3].state;
  EXPECT_TRUE(fresh->up);
  EXPECT_EQ(fresh->in_flight, 0u);
  EXPECT_EQ(make_snapshot(d2, "10.0.0.5", "", 3)->apps[0].replicas[0].state->in_flight, 0u);  // no previous
  for (const auto& r : second->apps[0].router_pool) EXPECT_EQ(r.state, nullptr);  // routers have none
}

}  // namespace
}  // namespace ingressd::topology
