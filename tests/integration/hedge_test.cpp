// Hedged router calls (router.hedge, router.hedge_budget; issue #18), end to end: the daemon runs
// in-process with fake routers that answer late, and fake replicas that say who they are.
//
// No assertion here rests on how fast anything ran. The slow routers are slower than the hedge
// delay by a wide margin, and each test checks *which* router's pick served a request (the
// routers hand out different replicas) and how many calls each router got.
#include <chrono>
#include <filesystem>
#include <memory>
#include <string>
#include <unistd.h>
#include <vector>

#include <gtest/gtest.h>
#include <nlohmann/json.hpp>

#include "fakes/admin_client.hpp"
#include "fakes/http_client.hpp"
#include "fakes/proxy_fixture.hpp"
#include "fakes/servers.hpp"
#include "ingressd/demo/replica_server.hpp"
#include "ingressd/demo/router_server.hpp"
#include "ingressd/routing/router_memory.hpp"
#include "ingressd/topology/topology.hpp"

namespace ingressd {
namespace {

using namespace std::chrono_literals;
using demo::router_behaviour;
using demo::router_server;
using testing::connection;
using testing::format_request;
using testing::http_response;
using testing::make_replica;
using testing::target_of;

const std::string node_ip = "127.0.0.2";
const std::string proxy_host = "127.0.0.1";

/// Each router hands out its own replica, so a response says whose pick it was.
struct cluster {
  std::vector<std::unique_ptr<demo::replica_server>> replicas;
  std::vector<std::unique_ptr<router_server>> routers;

  explicit cluster(std::size_t n) {
    for (std::size_t i = 0; i < n; ++i) {
      const auto id = std::to_string(i + 1);
      replicas.push_back(make_replica("rep-" + id));
      routers.push_back(testing::make_router(node_ip, "router-" + id));
      routers.back()->set_replicas({"rep-" + id});
    }
  }
  router_server& router(std::size_t i) { return *routers[i - 1]; }
  /// The routers in the app's pool order as the proxy shows it (/topology): the order sorts
  /// routers by address, and their ports are chosen by the system. One worker's cursor starts at
  /// the first.
  std::vector<router_server*> pool_order(const testing::proxy& p) {
    auto topo = testing::http_get("127.0.0.1", p.admin_port(), "/topology", {}, 5s);
    std::vector<router_server*> out;
    const auto j = nlohmann::json::parse(topo.body);
    for (const auto& r : j["apps"][0]["router_pool"])
      for (auto& mine : routers)
        if (r["name"] == mine->name()) out.push_back(mine.get());
    EXPECT_EQ(out.size(), routers.size()) << topo.status << " " << topo.body;
    return out;
  }
  std::size_t calls(std::size_t i) { return router(i).route_requests().size(); }
  topology::document doc() const {
    topology::document d;
    topology::app a;
    a.name = "llm";
    a.route_prefix = "/";
    for (std::size_t i = 0; i < replicas.size(); ++i) {
      a.replicas.push_back(target_of(*replicas[i], "rep-" + std::to_string(i + 1)));
      a.routers.push_back(target_of(*routers[i], "router-" + std::to_string(i + 1)));
    }
    d.apps.push_back(std::move(a));
    return d;
  }
};

/// One worker (one cursor: the routers take turns strictly), a fixed hedge delay far below the
/// slow routers' delays, and a budget that allows every hedge unless a test says otherwise.
config::config hedge_config(std::chrono::milliseconds hedge = 5ms, unsigned budget_permille = 1000) {
  auto c = testing::test_config(1);
  c.router.timeout = 5s;
  c.router.hedge_auto = false;
  c.router.hedge_after = hedge;
  c.router.hedge_budget_permille = budget_permille;
  return c;
}

http_response exchange(connection& c, const testing::proxy& p, const std::string& id) {
  if (!c.write(format_request("POST", "/v1/chat/completions", proxy_host, p.port(), {{"X-Request-Id", id}}, "{}"),
               10s)) {
    http_response r;
    r.error = "write failed: " + c.error();
    return r;
  }
  return c.read_response(10s);
}

/// The hedge delay of the tests that count which calls were hedged: a fast router's reply must
/// never take that long, also under sanitizers on a loaded machine (ASan runs saw a fast reply
/// take 9.5 ms; with 5 ms the fast router was hedged too, and its lost race moved the counts).
constexpr auto fast_reply_margin = 50ms;

std::string served_by(const http_response& r) { return r.header("x-served-by").value_or("<none>"); }

testing::metrics_scrape metrics_when(const testing::proxy& p, const std::function<bool(const testing::metrics_scrape&)>& ready) {
  return testing::scrape_until(p.admin_port(), ready, 10s);
}

std::string hedges(const char* result) {
  return std::string(R"(ingressd_router_hedges_total{app="llm",result=")") + result + "\"}";
}

TEST(Hedge, ASlowRouterIsStillAskedButNeverDecides) {
  cluster cl(2);
  // router-1 answers after 3 s (router.timeout is 5 s): without hedging, every second request
  // would wait for it and go to its pick, rep-1.
  cl.router(1).set_behaviour(router_behaviour::round_robin().after(3000ms));
  testing::proxy p(hedge_config(fast_reply_margin), node_ip);
  p.set_topology(cl.doc());

  auto conn = connection::open(proxy_host, p.port());
  ASSERT_TRUE(conn.connected()) << conn.error();
  constexpr int n = 8;
  for (int i = 0; i < n; ++i) {
    auto r = exchange(conn, p, "slow-" + std::to_string(i));
    ASSERT_TRUE(r.complete) << r.error;
    ASSERT_EQ(r.status, 200u) << r.body;
    EXPECT_EQ(served_by(r), "rep-2") << "request " << i << " waited for the slow router";
  }
  // The slow router was still asked: on its turns, until it had lost three races in a row
  // (then it is asked after router-2 for a second; routing::router_memory). Every call to it was
  // cancelled, none counted as a failure; router-2 answered every request.
  EXPECT_GE(cl.calls(1), std::size_t{routing::router_memory::slow_after});
  EXPECT_EQ(cl.calls(2), std::size_t{n});
  EXPECT_EQ(cl.replicas[0]->request_count(), 0u);
  // The hedge carries the same call: the same request id and body.
  const auto first_slow = cl.router(1).route_requests().front();
  bool same = false;
  for (const auto& r : cl.router(2).route_requests())
    same = same || (r.header("x-request-id") == first_slow.header("x-request-id") && r.body == first_slow.body);
  EXPECT_TRUE(same) << "no call to router-2 carries " << first_slow.header("x-request-id").value_or("<none>");

  const double slow_calls = static_cast<double>(cl.calls(1));
  auto m = metrics_when(p, [&](const testing::metrics_scrape& s) {
    return s.at(R"(ingressd_router_attempts_total{app="llm",router="router-1",result="cancelled"})") == slow_calls;
  });
  SCOPED_TRACE(m.text);
  EXPECT_GE(m.at(hedges("won")), routing::router_memory::slow_after);
  EXPECT_GE(m.at(hedges("sent")), m.at(hedges("won")));
  EXPECT_EQ(m.at(hedges("refused")), 0);
  EXPECT_EQ(m.at(R"(ingressd_router_attempts_total{app="llm",router="router-1",result="cancelled"})"), slow_calls);
  EXPECT_EQ(m.at(R"(ingressd_router_attempts_total{app="llm",router="router-1",result="no_reply"})"), 0);
  EXPECT_EQ(m.at(R"(ingressd_router_attempts_total{app="llm",router="router-2",result="ok"})"), n);
  EXPECT_EQ(m.at(R"(ingressd_router_failures_total{app="llm",reason="router_unreachable"})"), 0);
  for (const char* r : {"router-1", "router-2"})
    EXPECT_EQ(m.at(std::string(R"(ingressd_router_hedge_delay_seconds{app="llm",router=")") + r + "\"}"), 0.05) << r;
}

TEST(Hedge, AllSlowMeansOneExtraCallPerRequestAtMost) {
  cluster cl(3);
  for (std::size_t i = 1; i <= 3; ++i) cl.router(i).set_behaviour(router_behaviour::round_robin().after(300ms));
  testing::proxy p(hedge_config(), node_ip);
  p.set_topology(cl.doc());

  auto conn = connection::open(proxy_host, p.port());
  ASSERT_TRUE(conn.connected()) << conn.error();
  constexpr int n = 6;
  for (int i = 0; i < n; ++i) {
    auto r = exchange(conn, p, "all-slow-" + std::to_string(i));
    ASSERT_TRUE(r.complete) << r.error;
    ASSERT_EQ(r.status, 200u) << r.body;
  }
  // Each decision: its router, plus the hedge to the next one; the third router is not asked.
  EXPECT_EQ(cl.calls(1) + cl.calls(2) + cl.calls(3), 2u * n);
  auto m = metrics_when(p, [&](const testing::metrics_scrape& s) { return s.at(hedges("sent")) == n; });
  EXPECT_EQ(m.at(hedges("sent")), n) << m.text;
}

TEST(Hedge, AnExhaustedBudgetWaitsForTheRouter) {
  cluster cl(2);
  // 10 %: the first hedge is allowed after ten calls; these six requests get none.
  testing::proxy p(hedge_config(5ms, 100), node_ip);
  p.set_topology(cl.doc());
  const auto order = cl.pool_order(p);
  ASSERT_EQ(order.size(), 2u);
  order[0]->set_behaviour(router_behaviour::round_robin().after(300ms));

  auto conn = connection::open(proxy_host, p.port());
  ASSERT_TRUE(conn.connected()) << conn.error();
  constexpr int n = 6;
  const std::string slow_pick = order[0] == &cl.router(1) ? "rep-1" : "rep-2";
  const std::string fast_pick = slow_pick == "rep-1" ? "rep-2" : "rep-1";
  for (int i = 0; i < n; ++i) {
    auto r = exchange(conn, p, "budget-" + std::to_string(i));
    ASSERT_TRUE(r.complete) << r.error;
    ASSERT_EQ(r.status, 200u) << r.body;
    // Turns alternate, the slow router first: its turns wait for it, and its pick serves them.
    EXPECT_EQ(served_by(r), i % 2 == 0 ? slow_pick : fast_pick) << "request " << i;
  }
  EXPECT_EQ(cl.calls(1), n / 2u);
  EXPECT_EQ(cl.calls(2), n / 2u);  // no hedge reached the fast one
  auto m = metrics_when(p, [&](const testing::metrics_scrape& s) { return s.at(hedges("refused")) == n / 2; });
  SCOPED_TRACE(m.text);
  EXPECT_EQ(m.at(hedges("refused")), n / 2);
  EXPECT_EQ(m.at(hedges("sent")), 0);
}

TEST(Hedge, ANon200FromOneCallDoesNotEndTheRace) {
  cluster cl(2);
  testing::proxy p(hedge_config(), node_ip);
  p.set_topology(cl.doc());
  const auto order = cl.pool_order(p);
  ASSERT_EQ(order.size(), 2u);
  // The first call answers 503 after the hedge went out; the hedge's 200 comes later and wins.
  order[0]->set_behaviour(router_behaviour::respond(503, R"({"detail":"busy"})").after(100ms));
  order[1]->set_behaviour(router_behaviour::round_robin().after(400ms));

  auto conn = connection::open(proxy_host, p.port());
  ASSERT_TRUE(conn.connected()) << conn.error();
  auto r = exchange(conn, p, "non-200-first");
  ASSERT_TRUE(r.complete) << r.error;
  EXPECT_EQ(r.status, 200u) << r.body;
  EXPECT_EQ(served_by(r), order[1] == &cl.router(1) ? "rep-1" : "rep-2");
  EXPECT_EQ(cl.calls(1), 1u);
  EXPECT_EQ(cl.calls(2), 1u);
}

TEST(Hedge, BothNon200KeepsTheReasonOfTheRules) {
  cluster cl(2);
  // Whichever goes first, each answers after the hedge went out, and not with a 200.
  cl.router(1).set_behaviour(router_behaviour::respond(503, R"({"detail":"busy"})").after(300ms));
  cl.router(2).set_behaviour(router_behaviour::respond(500, R"({"detail":"boom"})").after(100ms));
  testing::proxy p(hedge_config(), node_ip);
  p.set_topology(cl.doc());

  auto conn = connection::open(proxy_host, p.port());
  ASSERT_TRUE(conn.connected()) << conn.error();
  auto r = exchange(conn, p, "both-non-200");
  ASSERT_TRUE(r.complete) << r.error;
  EXPECT_EQ(r.status, 503u) << r.body;
  EXPECT_EQ(r.header("x-serve-reason").value_or("<none>"), "router_non_200");
  EXPECT_EQ(cl.calls(1), 1u);
  EXPECT_EQ(cl.calls(2), 1u);
  for (auto& rep : cl.replicas) EXPECT_EQ(rep->request_count(), 0u);
}

TEST(Hedge, BothWithoutReplyFailOverToTheNextRouter) {
  cluster cl(3);
  testing::proxy p(hedge_config(), node_ip);
  p.set_topology(cl.doc());
  const auto order = cl.pool_order(p);
  ASSERT_EQ(order.size(), 3u);
  // The first two close without a reply after the hedge went out: failover goes on with the
  // third, and nobody is asked twice.
  order[0]->set_behaviour(router_behaviour::close_without_reply().after(200ms));
  order[1]->set_behaviour(router_behaviour::close_without_reply().after(200ms));

  auto conn = connection::open(proxy_host, p.port());
  ASSERT_TRUE(conn.connected()) << conn.error();
  auto r = exchange(conn, p, "both-gone");
  ASSERT_TRUE(r.complete) << r.error;
  EXPECT_EQ(r.status, 200u) << r.body;
  EXPECT_EQ(served_by(r), "rep-" + order[2]->name().substr(std::string("router-").size()));
  EXPECT_EQ(cl.calls(1), 1u);
  EXPECT_EQ(cl.calls(2), 1u);
  EXPECT_EQ(cl.calls(3), 1u);
}

TEST(Hedge, ForwardedBodyAndSessionHeaderGoToBothRouters) {
  cluster cl(2);
  auto cfg = hedge_config();
  cfg.router.forward_body = true;
  testing::proxy p(cfg, node_ip);
  p.set_topology(cl.doc());
  const auto order = cl.pool_order(p);
  ASSERT_EQ(order.size(), 2u);
  order[0]->set_behaviour(router_behaviour::round_robin().after(3000ms));

  const std::string body = R"({"model":"m","messages":[{"role":"user","content":"hi"}]})";
  auto conn = connection::open(proxy_host, p.port());
  ASSERT_TRUE(conn.connected()) << conn.error();
  ASSERT_TRUE(conn.write(format_request("POST", "/v1/chat/completions", proxy_host, p.port(),
                                        {{"X-Request-Id", "fwd-1"}, {"X-Session-Id", "conv-7"}}, body),
                         10s));
  auto r = conn.read_response(10s);
  ASSERT_TRUE(r.complete) << r.error;
  ASSERT_EQ(r.status, 200u) << r.body;
  const std::string fast_pick = order[1] == &cl.router(1) ? "rep-1" : "rep-2";
  EXPECT_EQ(served_by(r), fast_pick);
  ASSERT_EQ(cl.calls(1), 1u);
  ASSERT_EQ(cl.calls(2), 1u);
  for (std::size_t i : {1u, 2u}) {
    const auto call = cl.router(i).route_requests().front();
    EXPECT_EQ(call.body, body) << "router-" << i;
    EXPECT_EQ(call.header("x-session-id").value_or("<none>"), "conv-7") << "router-" << i;
    EXPECT_EQ(call.header("x-request-id").value_or("<none>"), "fwd-1") << "router-" << i;
  }
  // The request went to one replica only: the hedge's pick.
  EXPECT_EQ(cl.replicas[0]->request_count() + cl.replicas[1]->request_count(), 1u);
}

TEST(Hedge, APoolOfOneNeverHedges) {
  cluster cl(1);
  cl.router(1).set_behaviour(router_behaviour::round_robin().after(100ms));
  testing::proxy p(hedge_config(), node_ip);
  p.set_topology(cl.doc());
  auto conn = connection::open(proxy_host, p.port());
  ASSERT_TRUE(conn.connected()) << conn.error();
  auto r = exchange(conn, p, "alone");
  ASSERT_EQ(r.status, 200u) << r.body;
  EXPECT_EQ(cl.calls(1), 1u);
  auto m = testing::scrape_metrics(p.admin_port());
  EXPECT_EQ(m.at(hedges("sent")), 0) << m.text;
  EXPECT_EQ(m.text.find("ingressd_router_hedge_delay_seconds{"), std::string::npos) << m.text;
}

TEST(Hedge, AccessLogAndTopologyShowIt) {
  const auto dir = std::filesystem::temp_directory_path() / ("ingressd-hedge-" + std::to_string(::getpid()));
  std::filesystem::create_directories(dir);
  const std::string path = (dir / "access.log").string();
  std::filesystem::remove(path);

  cluster cl(2);
  auto cfg = hedge_config(fast_reply_margin);
  cfg.access_log = path;
  {
    testing::proxy p(cfg, node_ip);
    p.set_topology(cl.doc());
    const auto order = cl.pool_order(p);
    ASSERT_EQ(order.size(), 2u);
    order[0]->set_behaviour(router_behaviour::round_robin().after(3000ms));
    auto conn = connection::open(proxy_host, p.port());
    ASSERT_TRUE(conn.connected()) << conn.error();
    ASSERT_EQ(exchange(conn, p, "hedged-1").status, 200u);    // the slow router's turn: hedged
    ASSERT_EQ(exchange(conn, p, "straight-1").status, 200u);  // the other's turn

    auto lines = testing::wait_json_lines(path, 2);
    ASSERT_EQ(lines.size(), 2u);
    for (const auto& l : lines) {
      const bool hedged = l["request_id"] == "hedged-1";
      EXPECT_EQ(l["router_hedged"], hedged) << l.dump();
      EXPECT_EQ(l["router"], order[1]->name()) << l.dump();  // the router whose reply was used
      EXPECT_EQ(l["router_outcome"], "ok") << l.dump();
    }

    auto topo = testing::http_get("127.0.0.1", p.admin_port(), "/topology", {}, 5s);
    ASSERT_EQ(topo.status, 200u);
    const auto j = nlohmann::json::parse(topo.body);
    ASSERT_EQ(j["apps"].size(), 1u);
    for (const auto& r : j["apps"][0]["router_pool"])
      EXPECT_EQ(r["hedge_delay_ms"], nlohmann::json::array({50.0})) << topo.body;  // one worker
  }
  std::filesystem::remove_all(dir);
}

TEST(Hedge, AutoStartsAtTheCeilingAndFollowsTheRouters) {
  cluster cl(2);
  auto cfg = hedge_config();
  cfg.router.hedge_auto = true;
  cfg.router.hedge_after = {};
  testing::proxy p(cfg, node_ip);
  p.set_topology(cl.doc());
  // The delay before a call is hedged to each router, on the one worker: the longest of them.
  auto topo_delay = [&] {
    auto topo = testing::http_get("127.0.0.1", p.admin_port(), "/topology", {}, 5s);
    const auto j = nlohmann::json::parse(topo.body);
    double d = 0;
    for (const auto& r : j["apps"][0]["router_pool"]) d = std::max(d, r["hedge_delay_ms"][0].get<double>());
    return d;
  };
  EXPECT_EQ(topo_delay(), 50.0);  // no reply seen yet: the ceiling
  auto conn = connection::open(proxy_host, p.port());
  ASSERT_TRUE(conn.connected()) << conn.error();
  // Every 16 replies of a router its delay follows them: twice their 90th percentile, at least
  // 1 ms. Loopback
  // routers answer far below 25 ms, so it leaves the ceiling; a loaded machine only makes that
  // take more rounds (at most 16 here).
  double d = 50.0;
  for (int round = 0; round < 16 && d == 50.0; ++round) {
    for (int i = 0; i < 32; ++i) ASSERT_EQ(exchange(conn, p, "auto-" + std::to_string(round * 32 + i)).status, 200u);
    d = topo_delay();
  }
  EXPECT_GE(d, 1.0);
  EXPECT_LT(d, 50.0);
}

}  // namespace
}  // namespace ingressd
