#pragma once
// The /metrics body (contract §6): sums every worker's blocks and renders all ingressd_ families
// in Prometheus text format. Runs on the admin thread; never touches worker-owned state other
// than through single-writer counters and worker_metrics::visit.
#include <array>

#include "ingressd/grpc/protocol.hpp"
#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include "ingressd/metrics/process.hpp"
#include "ingressd/net/proxy_protocol.hpp"
#include "ingressd/metrics/request_metrics.hpp"
#include "ingressd/topology/snapshot.hpp"

namespace ingressd::metrics {

/// scrape_input::tls_input (at namespace scope: clang cannot default-construct a nested struct
/// with member initializers inside std::optional before the enclosing class is complete).
struct scrape_tls_input {
  std::uint64_t requests = 0;     ///< requests_received that came over TLS
  std::uint64_t connections = 0;  ///< ingressd_tls_connections
  std::uint64_t handshakes = 0;   ///< ingressd_tls_handshakes_total (all: full + resumed)
  std::uint64_t resumed = 0;
  /// ingressd_tls_handshake_failures_total by reason (tls::handshake_failure's names)
  std::vector<std::pair<std::string_view, std::uint64_t>> failures;
  std::int64_t not_after = 0;     ///< ingressd_tls_certificate_expiry_timestamp_seconds
};
/// scrape_input::grpc_input.
struct scrape_grpc_input {
  std::uint64_t connections = 0;  ///< ingressd_grpc_connections
  std::uint64_t streams = 0;      ///< ingressd_grpc_active_streams
  std::array<std::uint64_t, grpc::conn_error_count> conn_errors{};  ///< ingressd_grpc_connection_errors_total
};
struct scrape_input {
  std::vector<const worker_metrics*> workers;
  std::uint64_t requests_received = 0;   ///< ingressd_requests_received_total
  std::uint64_t active_connections = 0;  ///< ingressd_active_connections
  std::uint64_t active_streams = 0;      ///< ingressd_active_streams
  std::uint64_t tunnels = 0;                  ///< ingressd_tunnels
  std::uint64_t tunnel_bytes_to_replica = 0;  ///< ingressd_tunnel_bytes_total{direction="to_replica"}
  std::uint64_t tunnel_bytes_to_client = 0;   ///< ingressd_tunnel_bytes_total{direction="to_client"}
  /// The current topology (replica_up and marked_down from its upstream states,
  /// colocated_ratio); may be null.
  const topology::snapshot* topology = nullptr;
  /// ingressd_topology_last_success_timestamp_seconds: Unix time at which the topology source
  /// last confirmed the topology in force (0: not yet); nullopt when there is no source to poll
  /// (--demo), so that no staleness alert can fire there.
  std::optional<double> topology_last_success;
  bool draining = false;                 ///< ingressd_draining
  std::uint64_t topology_updates = 0;    ///< ingressd_topology_updates_total
  std::uint64_t topology_errors = 0;     ///< ingressd_topology_errors_total
  std::uint64_t config_reloads = 0;      ///< ingressd_config_reloads_total
  std::uint64_t config_errors = 0;       ///< ingressd_config_reload_errors_total
  std::uint64_t config_generations = 0;  ///< ingressd_config_generations
  std::uint64_t accept_errors = 0;       ///< ingressd_accept_errors_total
  /// ingressd_proxy_protocol_errors_total by net::proxy_error
  std::array<std::uint64_t, net::proxy_error_count> proxy_protocol_errors{};
  std::uint64_t forwarded_chain_errors = 0;  ///< ingressd_forwarded_chain_errors_total
  std::uint64_t router_headers_skipped = 0;  ///< ingressd_router_reply_headers_skipped_total
  /// metrics.ray_compatible: also the ray_serve_* proxy series (request_metrics.hpp ray_series).
  bool ray_compatible = false;
  std::string node_ip;   ///< label node_ip_address of ray_serve_num_ongoing_*_requests
  std::string node_id;   ///< label node_id: this node's Ray node id when known ("" otherwise)
  std::uint64_t ongoing_http = 0;  ///< ray_serve_num_ongoing_http_requests
  std::uint64_t ongoing_grpc = 0;  ///< ray_serve_num_ongoing_grpc_requests
  std::uint64_t access_log_dropped = 0;  ///< ingressd_access_log_dropped_total
  /// The HTTPS listener (tls.listen); nullopt without one.
  using tls_input = scrape_tls_input;

  std::optional<tls_input> tls;
  /// The gRPC listener (grpc.listen); nullopt without one.
  using grpc_input = scrape_grpc_input;

  std::optional<grpc_input> grpc;
  /// The process_* families (descriptors, memory, CPU); nullopt leaves them out.
  std::optional<process_stats> process;
};

std::string render(const scrape_input& in);

}  // namespace ingressd::metrics
