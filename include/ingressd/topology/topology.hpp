#pragma once
// The topology document (contract §3.1): Ray's TargetGroup list plus the HTTP fallback target,
// and the immutable per-snapshot routing view that workers read without locks.
#include <cstdint>
#include <memory>
#include <optional>
#include <string>
#include <string_view>
#include <variant>
#include <vector>

#include <boost/asio/ip/tcp.hpp>

namespace ingressd::topology {

/// A Ray `Target`: a data-plane replica, a router replica or the fallback proxy.
struct target {
  std::string ip;           ///< node IP (an IPv4/IPv6 literal)
  std::uint16_t port = 0;   ///< direct-ingress port
  std::string instance_id;  ///< node instance id (informational)
  std::string name;         ///< actor name; for replicas this is the router's `replica_id`
  bool operator==(const target&) const = default;
};

/// One `TargetGroup`: an HTTP app (document::apps) or a gRPC app (document::grpc_apps; its
/// route_prefix is kept but unused, routers and router fallback do not apply: Ray's ingress
/// request router is HTTP-only).
struct app {
  std::string name;                 ///< app_name
  std::string route_prefix;         ///< "/" or "/x" (no trailing slash except "/")
  std::vector<target> replicas;     ///< targets (empty for an app scaled to zero)
  std::vector<target> routers;      ///< ingress_request_router_targets
  bool router_fallback = false;     ///< ingress_router_fallback: fail open for this app
  /// fallback_target: where this app's requests go when it has no healthy replica, and on
  /// unknown_replica_id (the head node's Serve proxy, which scales the app up). Wins over the
  /// document's fallback_targets.HTTP (contract §9).
  std::optional<target> fallback;
  bool operator==(const app&) const = default;
};

/// A validated topology document.
/// One entry of Ray's `proxies` map (ServeInstanceDetails.proxies, ray python/ray/serve/schema.py
/// ProxyDetails; the exporter serves the same map): the Serve proxy of one node and its status.
struct ray_proxy {
  std::string node_id;
  std::string node_ip;
  std::string status;  ///< ProxyStatus: STARTING, HEALTHY, UNHEALTHY, DRAINING, DRAINED
  bool operator==(const ray_proxy&) const = default;
};

struct document {
  std::vector<app> apps;                 ///< in document order
  std::optional<target> http_fallback;   ///< fallback_targets.HTTP: every app's fallback unless it has its own
  /// `protocol: "gRPC"` groups, in document order; app names are unique among them.
  std::vector<app> grpc_apps;
  /// fallback_targets.gRPC: the head node's Serve gRPC proxy, where calls of a gRPC app with no
  /// healthy replica go (and Serve's own RayServeAPIService calls).
  std::optional<target> grpc_fallback;
  /// False for Ray's `ServeInstanceDetails` without `target_groups`: what the dashboard answers
  /// while Serve is not running. A valid, empty topology (no apps), not an error (contract §9).
  bool serve_running = true;
  /// Ray's `proxies` map, by node id in document order: Ray drains a node (spot interruption,
  /// downscale) by marking its proxy DRAINING. Entries that are not objects with string fields are
  /// left out (Ray's schema may grow), never an error.
  std::vector<ray_proxy> proxies;
  std::vector<std::string> warnings;     ///< e.g. "... lists Serve proxies" (logged once by the caller)
  bool operator==(const document& o) const {
    return apps == o.apps && http_fallback == o.http_fallback && serve_running == o.serve_running &&
           grpc_apps == o.grpc_apps && grpc_fallback == o.grpc_fallback && proxies == o.proxies;
  }
};

struct parse_error {
  std::string message;  ///< names the field, e.g. "target_groups[1].targets[0].port: not an integer"
};

/// Parses a topology document: `{"target_groups": [...], "fallback_targets": {...}}` or a full
/// `ServeInstanceDetails`, as JSON or YAML (JSON is tried first when the text starts with '{').
/// Rejects the whole document on wrong types, missing required fields, non-IP addresses, bad
/// ports and duplicate route prefixes. A `ServeInstanceDetails` without `target_groups` (it has
/// `applications`, `proxies` or `controller_info`) is Serve not running: no apps, serve_running
/// false. Never throws.
std::variant<document, parse_error> parse_document(std::string_view text);

/// Serialises a document in Ray's JSON shape (`{"target_groups": [...], "fallback_targets": ...}`);
/// parse_document(to_json(d)) == d.
std::string to_json(const document& doc);

/// Normalises a route prefix: "" -> "/", trailing slashes removed except for "/".
std::string normalise_prefix(std::string_view prefix);

/// A target's "ip:port" ("[ipv6]:port"): the key of its upstream state, pool and metrics, and
/// the name of a target a hand-written topology leaves unnamed.
std::string key_of(const target& t);

}  // namespace ingressd::topology
