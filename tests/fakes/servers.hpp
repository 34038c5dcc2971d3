#pragma once
// The fake replicas and routers the integration tests start (the demo cluster's servers), made
// one way for every test file.
#include <chrono>
#include <cstdint>
#include <memory>
#include <string>

#include "ingressd/demo/replica_server.hpp"
#include "ingressd/demo/router_server.hpp"
#include "ingressd/topology/topology.hpp"

namespace ingressd::testing {

/// A fake replica's options: `name` (its replica id, echoed as x-served-by), on `ip` at a port
/// the kernel picks, streaming `tokens` SSE events `token_delay` apart.
inline demo::replica_server::options replica_named(std::string name,
                                                   std::chrono::milliseconds token_delay = std::chrono::milliseconds(20),
                                                   std::size_t tokens = 8, std::string ip = "127.0.0.1") {
  return {.name = std::move(name), .bind_ip = std::move(ip), .port = 0, .token_delay = token_delay, .tokens = tokens};
}

/// A fast fake replica (events 1 ms apart, 2 of them): for tests about routing, not streaming.
inline std::unique_ptr<demo::replica_server> make_replica(std::string name, std::string ip = "127.0.0.1") {
  return std::make_unique<demo::replica_server>(
      replica_named(std::move(name), std::chrono::milliseconds(1), 2, std::move(ip)));
}

/// A fake router named `name` on `ip` (a node), at `port` (0: the kernel picks).
inline std::unique_ptr<demo::router_server> make_router(std::string ip, std::string name, std::uint16_t port = 0) {
  return std::make_unique<demo::router_server>(
      demo::router_server::options{.name = std::move(name), .bind_ip = std::move(ip), .port = port});
}

/// The topology target of a running fake, under `name` (a replica's id, a router's name).
inline topology::target target_of(const demo::server_base& s, std::string name) {
  return topology::target{.ip = s.bind_ip(), .port = s.port(), .instance_id = "", .name = std::move(name)};
}

}  // namespace ingressd::testing
