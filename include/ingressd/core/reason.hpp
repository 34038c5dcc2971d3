#pragma once
// Every response that ingressd generates itself has exactly one reason. Each reason maps to one
// HTTP status and to one `X-Serve-Reason` header value (contract §4.2, §4.3, §4.1).
#include <cstddef>
#include <string_view>

namespace ingressd {

enum class reason {
  /// Path matched no application's route prefix (contract §4.1). 404.
  no_route,
  /// Every router in the app's pool gave no reply (refused, reset, timed out). 503.
  router_unreachable,
  /// A router replied with a status other than 200; final, no failover. 503.
  router_non_200,
  /// A router replied 200 without a usable string `replica_id`. 503.
  unparseable_replica_id,
  /// The router's `replica_id` names no replica of this app in our topology. 503.
  unknown_replica_id,
  /// The app has no healthy replica and no fallback target. 503.
  no_healthy_replica,
  /// Request bytes were written to the replica, then the connection failed before headers. 502.
  upstream_error,
  /// Request bytes were written, no response headers within upstream.first_byte_timeout. 504.
  upstream_timeout,
  /// A WebSocket upgrade while client.max_tunnels tunnels are open (an extension beyond the
  /// contract, issue #32). 503.
  tunnel_limit,
};
/// How many reasons there are (arrays indexed by reason, e.g. per-app metric counters).
inline constexpr std::size_t reason_count = static_cast<std::size_t>(reason::tunnel_limit) + 1;

/// The `X-Serve-Reason` value, e.g. "router_unreachable".
std::string_view to_string(reason r) noexcept;
/// The HTTP status ingressd answers with for this reason.
unsigned status_of(reason r) noexcept;
/// True for the four router failure reasons (they share the body "Ingress request router failed: <reason>").
bool is_router_failure(reason r) noexcept;

}  // namespace ingressd
