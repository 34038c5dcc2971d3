#pragma once
// The immutable routing view of one topology document, as workers read it. Built once per
// topology change on the control thread and handed to every worker as shared_ptr<const snapshot>;
// no lock is ever taken to read it.
#include <chrono>
#include <cstdint>
#include <memory>
#include <optional>
#include <string>
#include <unordered_map>
#include <vector>

#include <boost/asio/ip/tcp.hpp>

#include "ingressd/routing/route_table.hpp"
#include "ingressd/topology/topology.hpp"

namespace ingressd::topology {

/// A target resolved for dialling.
struct endpoint {
  boost::asio::ip::tcp::endpoint dial;  ///< where we connect (local_dial_host applied)
  std::string key;                      ///< "ip:port" as in the document (pool and metrics key)
  std::string name;                     ///< Target.name
  bool colocated = false;               ///< ip == node IP
};

struct app_view {
  std::string name;
  std::string route_prefix;
  std::vector<endpoint> replicas;      ///< same order as the document's targets
  std::vector<endpoint> router_pool;   ///< routers in pool order (contract §4.2)
  bool router_fallback = false;        ///< ingress_router_fallback
  /// replica name (router replica_id) -> index into replicas
  std::unordered_map<std::string, std::size_t> replica_by_name;
  /// Identity of the router pool; a worker keeps an app's cursor when this is unchanged.
  std::string pool_signature;
};

struct snapshot {
  document doc;
  std::string node_ip;
  std::vector<app_view> apps;            ///< index = app index in routes
  routing::route_table routes;
  std::optional<endpoint> fallback;      ///< HTTP fallback target
  std::uint64_t generation = 0;          ///< increases with each published change
  std::string source;                    ///< where the document came from ("file /x.json", ...)
  std::chrono::system_clock::time_point updated{};

  /// For the change log line: router targets in total (all of them, not just the pools),
  /// replica targets in total, and apps that have at least one router target.
  std::size_t router_count() const;
  std::size_t replica_count() const;
  std::size_t apps_with_routers() const;
};

/// Builds the routing view. `local_dial_host` ("" = none) replaces the ip of co-located targets
/// when dialling. Target ips were validated by parse_document.
std::shared_ptr<const snapshot> make_snapshot(document doc, const std::string& node_ip,
                                              const std::string& local_dial_host,
                                              std::uint64_t generation, std::string source = {});

}  // namespace ingressd::topology
