#pragma once
// The immutable routing view of one topology document, as workers read it. Built once per
// topology change on the control thread and handed to every worker as shared_ptr<const snapshot>;
// no lock is ever taken to read it.
#include <atomic>
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

/// The live state of one upstream (a replica or a fallback target) on this node: shared by every
/// worker (relaxed atomics, no lock) and carried from one snapshot to the next while its key
/// stays, so that in-flight counts and health survive topology changes.
struct upstream_state {
  /// Requests being proxied to it by any worker: the least-loaded choice is node-wide, as
  /// HAProxy's leastconn and Ray's proxy count (per-worker counts skew as workers grow).
  std::atomic<std::uint32_t> in_flight{0};
  /// Health: false once active checks fail (health.fall) or passive health marks it down
  /// (health.error_limit consecutive connection errors); the active checks bring it back.
  std::atomic<bool> up{true};
  /// Consecutive connection errors (refused, timed out, reset before a response head).
  std::atomic<std::uint32_t> errors{0};
  /// Times it was marked down by each cause (ingressd_replica_marked_down_total).
  std::atomic<std::uint64_t> downs_by_check{0};
  std::atomic<std::uint64_t> downs_by_errors{0};
};

/// Counts one request in an upstream's in_flight while it is proxied there, however it ends.
/// The state outlives the request: the request holds its snapshot.
class in_flight_mark {
 public:
  in_flight_mark() = default;
  in_flight_mark(const in_flight_mark&) = delete;
  in_flight_mark& operator=(const in_flight_mark&) = delete;
  ~in_flight_mark() { clear(); }
  void set(upstream_state* s) noexcept {
    clear();
    s_ = s;
    if (s_) s_->in_flight.fetch_add(1, std::memory_order_relaxed);
  }
  void clear() noexcept {
    if (s_) s_->in_flight.fetch_sub(1, std::memory_order_relaxed);
    s_ = nullptr;
  }

 private:
  upstream_state* s_ = nullptr;
};

/// A target resolved for dialling.
struct endpoint {
  boost::asio::ip::tcp::endpoint dial;  ///< where we connect (local_dial_host applied)
  std::string key;                      ///< "ip:port" as in the document (pool and metrics key)
  std::string name;                     ///< Target.name
  bool colocated = false;               ///< ip == node IP
  /// Replicas and fallback targets only (routers have none); owned by the snapshot's `states`.
  upstream_state* state = nullptr;
};

struct app_view {
  std::string name;
  std::string route_prefix;
  std::vector<endpoint> replicas;      ///< same order as the document's targets
  std::vector<endpoint> router_pool;   ///< routers in pool order (contract §4.2)
  bool router_fallback = false;        ///< ingress_router_fallback
  /// The app's fallback target: its group's fallback_target, else fallback_targets.HTTP.
  std::optional<endpoint> fallback;
  /// replica name (router replica_id) -> index into replicas
  std::unordered_map<std::string, std::size_t> replica_by_name;
  /// Identity of the router pool; a worker keeps an app's cursor when this is unchanged.
  std::string pool_signature;
};

struct snapshot {
  document doc;
  std::string node_ip;
  /// This node's entry of Ray's `proxies` map (doc.proxies): found by `ray_node_id` when one is
  /// configured (--ray-node-id), else by node IP. Empty id: no entry (or no map).
  std::string ray_node_id;
  std::string ray_node_status;
  /// Ray is draining this node (its proxy is DRAINING, ray schema.py ProxyStatus): /-/healthz
  /// fails with Ray's text so that the load balancer moves traffic away, while requests are still
  /// served.
  bool ray_node_draining() const noexcept { return ray_node_status == "DRAINING"; }
  std::vector<app_view> apps;            ///< index = app index in routes
  routing::route_table routes;
  std::optional<endpoint> fallback;      ///< fallback_targets.HTTP (apps may have their own)
  /// gRPC apps (document::grpc_apps), in document order; route_prefix, routers unused. An app's
  /// `fallback` is its group's fallback_target, else fallback_targets.gRPC.
  std::vector<app_view> grpc_apps;
  std::optional<endpoint> grpc_fallback;  ///< fallback_targets.gRPC
  /// gRPC app name -> index into grpc_apps (the `application` metadata's lookup).
  std::unordered_map<std::string, std::size_t> grpc_by_name;
  /// Keys of `states` that are gRPC targets (replicas and fallbacks): health-checked with the
  /// gRPC health RPC instead of an HTTP GET.
  std::unordered_map<std::string, bool> grpc_keys;
  /// Live state of every replica and fallback target, by key (endpoint::state points here).
  std::unordered_map<std::string, std::shared_ptr<upstream_state>> states;
  std::uint64_t generation = 0;          ///< increases with each published change
  std::string source;                    ///< where the document came from ("file /x.json", ...)
  std::chrono::system_clock::time_point updated{};

  /// For the change log line: router targets in total (all of them, not just the pools),
  /// replica targets in total, and apps that have at least one router target.
  std::size_t router_count() const;
  std::size_t replica_count() const;
  std::size_t apps_with_routers() const;
};

/// Where a request stands in a snapshot: its app, and the replica a router pinned it to.
struct placement {
  std::size_t app = 0;
  std::optional<std::size_t> pinned;
  bool operator==(const placement&) const = default;
};

/// The same place in `to` after the topology changed from `from` while the request waited: its
/// app found again by name, the pinned replica by name (dropped when it is gone; the request then
/// goes to the least-loaded one). Nullopt when the app is gone.
std::optional<placement> remap(const snapshot& from, const placement& where, const snapshot& to);

/// Builds the routing view. `local_dial_host` ("" = none) replaces the ip of co-located targets
/// when dialling. Target ips were validated by parse_document. Upstreams whose key was in
/// `previous` keep its state (in-flight counts, health); new ones start up and idle.
std::shared_ptr<const snapshot> make_snapshot(document doc, const std::string& node_ip,
                                              const std::string& local_dial_host,
                                              std::uint64_t generation, std::string source = {},
                                              const snapshot* previous = nullptr, const std::string& ray_node_id = {});

}  // namespace ingressd::topology
