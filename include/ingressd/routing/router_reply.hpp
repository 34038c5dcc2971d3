#pragma once
// Ray's /internal/route protocol, sans I/O (contract §4.2; ray-serve-ingress.md §2.1): building
// the router request and interpreting the reply.
#include <cstdint>
#include <optional>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

namespace ingressd::routing {

/// What a complete router reply means.
struct router_reply {
  enum class kind {
    pinned,       ///< 200 with a string replica_id
    non_200,      ///< any other status: final, no failover
    unparseable,  ///< 200 without a usable replica_id (or with invalid request_headers)
  };
  kind what = kind::unparseable;
  std::string replica_id;
  /// Headers to set on the forwarded request (validated: token names, no CR/LF/NUL in values;
  /// framing, hop-by-hop and proxy-owned names such as Content-Length or X-Request-Id dropped).
  std::vector<std::pair<std::string, std::string>> request_headers;
  /// request_headers members whose value was not a string: left out (the reply is still used),
  /// logged and counted by the caller (ingressd_router_reply_headers_skipped_total).
  unsigned skipped_headers = 0;
};

/// Interprets a complete reply. The body must be one valid JSON object (RFC 8259, checked in
/// full: what nlohmann::json accepts, see router_reply.cpp); a flat object with a string
/// `replica_id` is what every Ray router sends.
router_reply parse_router_reply(unsigned status, std::string_view body);

/// Inputs of one router request.
struct router_request_parts {
  std::string_view host;            ///< "ip:port" of the router
  std::string_view body;            ///< empty, or the body prefix when forward_body is on
  std::optional<std::uint64_t> truncated_total;  ///< client Content-Length when body was cut
  std::string_view session_header;  ///< configured name ("" = none)
  std::string_view session_value;   ///< client's value ("" = none sent)
  std::string_view request_id;
};

/// The exact bytes of `POST /internal/route` (HTTP/1.1 keep-alive).
std::string build_router_request(const router_request_parts& p);
/// The same into `out` (cleared first), whose capacity a caller can keep from one request to the next.
void build_router_request(const router_request_parts& p, std::string& out);

}  // namespace ingressd::routing
