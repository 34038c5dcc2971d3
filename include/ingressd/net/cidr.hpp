#pragma once
// Address ranges (client.trusted_proxies): which peers may tell ingressd who the client is, in
// X-Forwarded-For or a PROXY protocol header. Sans-I/O.
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include <boost/asio/ip/address.hpp>

namespace ingressd::net {

/// An IPv4 or IPv6 network: "10.0.0.0/8", "fd00::/8", or one address ("10.0.0.5", "::1").
struct cidr {
  boost::asio::ip::address network;  ///< with the host bits cleared
  unsigned prefix = 0;               ///< 0-32 (IPv4) or 0-128 (IPv6)

  /// The network `text` names, or nullopt (host bits set are cleared: "10.0.0.5/8" is
  /// 10.0.0.0/8, as nginx and HAProxy read it).
  static std::optional<cidr> parse(std::string_view text);
  /// Whether `a` lies in this network. An IPv4-mapped IPv6 address (::ffff:10.0.0.5, what a
  /// dual-stack listener reports for an IPv4 peer) is compared as the IPv4 address it maps.
  bool contains(const boost::asio::ip::address& a) const noexcept;
  std::string to_string() const;
  bool operator==(const cidr&) const = default;
};

/// Whether any network of `set` contains `a`.
bool any_contains(const std::vector<cidr>& set, const boost::asio::ip::address& a) noexcept;

/// `a` with an IPv4-mapped IPv6 address turned into the IPv4 address it maps.
boost::asio::ip::address unmapped(const boost::asio::ip::address& a) noexcept;

}  // namespace ingressd::net
