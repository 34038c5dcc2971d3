#include "ingressd/core/reason.hpp"

namespace ingressd {

std::string_view to_string(reason r) noexcept {
  switch (r) {
    case reason::no_route: return "no_route";
    case reason::router_unreachable: return "router_unreachable";
    case reason::router_non_200: return "router_non_200";
    case reason::unparseable_replica_id: return "unparseable_replica_id";
    case reason::unknown_replica_id: return "unknown_replica_id";
    case reason::no_healthy_replica: return "no_healthy_replica";
    case reason::upstream_error: return "upstream_error";
    case reason::upstream_timeout: return "upstream_timeout";
    case reason::tunnel_limit: return "tunnel_limit";
  }
  return "unknown";
}

unsigned status_of(reason r) noexcept {
  switch (r) {
    case reason::no_route: return 404;
    case reason::upstream_error: return 502;
    case reason::upstream_timeout: return 504;
    default: return 503;
  }
}

bool is_router_failure(reason r) noexcept {
  return r == reason::router_unreachable || r == reason::router_non_200 ||
         r == reason::unparseable_replica_id || r == reason::unknown_replica_id;
}

}  // namespace ingressd
