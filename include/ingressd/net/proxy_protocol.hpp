#pragma once
// The PROXY protocol header (HAProxy's proxy-protocol.txt, versions 1 and 2): what a TCP load
// balancer (AWS NLB, GCP, HAProxy `send-proxy`) writes before the client's bytes to say whose
// connection it relays (client.proxy_protocol). Sans-I/O: the caller peeks at the socket, asks
// parse_proxy_header(), and consumes exactly `length` bytes, so that nothing after the header
// (an HTTP request, a TLS ClientHello that OpenSSL reads from the socket itself) is taken.
#include <cstddef>
#include <cstdint>
#include <optional>
#include <string_view>

#include <boost/asio/ip/tcp.hpp>

namespace ingressd::net {

/// Why a connection's PROXY header was refused (ingressd_proxy_protocol_errors_total{reason}).
enum class proxy_error : std::uint8_t {
  untrusted,  ///< the connection's peer is not in client.trusted_proxies
  invalid,    ///< not a PROXY header, or a malformed one
  oversized,  ///< v1 longer than 107 bytes, v2 longer than max_proxy_v2_bytes
  truncated,  ///< the peer closed (or reset) before the header's end
  timeout,    ///< the header did not arrive within client.header_timeout
};
inline constexpr std::size_t proxy_error_count = 5;
std::string_view to_string(proxy_error e) noexcept;

/// v1's longest header, CRLF included (the specification's 107 bytes).
inline constexpr std::size_t max_proxy_v1_bytes = 107;
/// v2 headers longer than this are refused: the address block and the TLVs load balancers send
/// (AWS's VPC endpoint id, GCP's connection id, HAProxy's SSL and unique-id TLVs) fit in far less.
inline constexpr std::size_t max_proxy_v2_bytes = 16 + 2048;

struct proxy_header {
  enum class state : std::uint8_t { need_more, done, failed };
  state st = state::need_more;
  /// done: the header's length; the connection's own bytes follow it.
  std::size_t length = 0;
  /// done: the client the load balancer relays; nullopt for a LOCAL command (the balancer's own
  /// health check), v1 `UNKNOWN` or an address family other than TCP over IPv4/IPv6: the
  /// connection is served with the socket's own addresses.
  std::optional<boost::asio::ip::tcp::endpoint> source;
  proxy_error error = proxy_error::invalid;  ///< failed: why
  std::string_view detail;                   ///< failed: what exactly, for the debug log
};

/// Parses the start of a connection. need_more only while every byte given may still belong to
/// a valid header (so the caller may consume them all and wait for more); failed as soon as a
/// byte rules that out.
proxy_header parse_proxy_header(std::string_view bytes) noexcept;

}  // namespace ingressd::net
