// Topology changes while traffic flows (contract §3.2): removed replicas get no new requests
// at once while their running streams finish; client connections survive every change.
#include <chrono>
#include <string>

#include <gtest/gtest.h>

#include "fakes/http_client.hpp"
#include "fakes/proxy_fixture.hpp"
#include "fakes/topology_builder.hpp"
#include "ingressd/demo/replica_server.hpp"

namespace ingressd {
namespace {

using namespace std::chrono_literals;
using demo::replica_server;
using testing::connection;
using testing::format_request;
using testing::proxy;
using testing::target_of;
using testing::test_config;
using testing::topology_builder;

TEST(TopologyUpdate, RemovedReplicaFinishesItsStreamAndGetsNoNewRequests) {
  replica_server a({.name = "replica-a", .token_delay = 40ms, .tokens = 10});
  replica_server b({.name = "replica-b"});
  proxy p(test_config(2));
  p.set_topology(topology_builder().app("llm", "/", {target_of(a)}).build());

  auto stream = connection::open("127.0.0.1", p.port());
  ASSERT_TRUE(stream.write(format_request("POST", "/v1/chat/completions", "127.0.0.1", p.port(),
                                          {{"content-type", "application/json"}}, R"({"stream":true})")));
  ASSERT_TRUE(a.wait_for_requests(1, 5s));

  // Replica a leaves the topology mid-stream; b arrives.
  p.set_topology(topology_builder().app("llm", "/", {target_of(b)}).build());
  auto keep_alive = connection::open("127.0.0.1", p.port());
  for (int i = 0; i < 5; ++i) {
    ASSERT_TRUE(keep_alive.write(format_request("GET", "/x", "127.0.0.1", p.port(), {}, "")));
    EXPECT_EQ(keep_alive.read_response(5s).header("x-served-by"), "replica-b");
  }
  EXPECT_EQ(a.request_count(), 1u);  // nothing new reached the removed replica

  auto r = stream.read_response(10s);
  EXPECT_TRUE(r.complete);
  EXPECT_EQ(r.header("x-served-by"), "replica-a");
  EXPECT_EQ(r.events.size(), 11u);  // all 10 tokens and [DONE]: the running stream finished
  EXPECT_EQ(r.events.back().data, "[DONE]");

  // The keep-alive connection opened before the next change keeps working through it.
  p.set_topology(topology_builder().app("llm", "/", {target_of(a), target_of(b)}).build());
  ASSERT_TRUE(keep_alive.write(format_request("GET", "/x", "127.0.0.1", p.port(), {}, "")));
  EXPECT_EQ(keep_alive.read_response(5s).status, 200u);
}

}  // namespace
}  // namespace ingressd
