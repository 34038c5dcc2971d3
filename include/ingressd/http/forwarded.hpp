#pragma once
// X-Forwarded-For and X-Forwarded-Proto behind load balancers (client.trusted_proxies). Sans-I/O.
//
// From a peer in client.trusted_proxies (a load balancer that terminates TLS, say) the chain it
// sends is kept and the peer appended ("client, balancer"), and its X-Forwarded-Proto is kept.
// From any other peer both are replaced: the peer is the client. The client (the access log's
// client_ip) is the rightmost address of the chain that is not trusted, as nginx's
// real_ip_recursive and Envoy's trusted hops read it.
#include <string>
#include <string_view>
#include <vector>

#include <boost/asio/ip/address.hpp>

#include "ingressd/net/cidr.hpp"

namespace ingressd::http {

struct forwarded_view {
  std::string xff;         ///< the X-Forwarded-For to send on
  std::string_view proto;  ///< the peer's X-Forwarded-Proto to keep; empty: set it from the listener
  std::string client_ip;   ///< who the client is
  bool malformed = false;  ///< a trusted peer's chain held something other than addresses: ignored
};

/// `chain`: the request's X-Forwarded-For values joined with ","; `proto`: its X-Forwarded-Proto
/// (empty: none); `peer`: the connection's client as ingressd knows it (the socket's peer, or
/// the PROXY header's source). A chain element may be an address, `ip:port` or `[ipv6]:port`.
forwarded_view evaluate_forwarded(std::string_view chain, std::string_view proto,
                                  const boost::asio::ip::address& peer, std::string_view peer_text,
                                  const std::vector<net::cidr>& trusted);

}  // namespace ingressd::http
