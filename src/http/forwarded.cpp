#include "ingressd/http/forwarded.hpp"

#include <optional>

#include "ingressd/core/text.hpp"
#include "ingressd/http/list.hpp"

namespace ingressd::http {

namespace ip = boost::asio::ip;

namespace {

/// The address of one chain element: "1.2.3.4", "1.2.3.4:80", "2001:db8::1", "[2001:db8::1]",
/// "[2001:db8::1]:80".
std::optional<ip::address> element_address(std::string_view e) {
  if (e.empty() || e.size() > 64) return std::nullopt;
  boost::system::error_code ec;
  if (e.front() == '[') {
    const auto close = e.find(']');
    if (close == std::string_view::npos) return std::nullopt;
    const auto rest = e.substr(close + 1);
    if (!rest.empty() && (rest.front() != ':' || rest.size() < 2 || !all_digits(rest.substr(1)))) return std::nullopt;
    e = e.substr(1, close - 1);
  } else if (const auto colon = e.find(':'); colon != std::string_view::npos && e.find(':', colon + 1) == std::string_view::npos) {
    if (!all_digits(e.substr(colon + 1)) || colon + 1 == e.size()) return std::nullopt;
    e = e.substr(0, colon);  // IPv4 with a port
  }
  auto a = ip::make_address(std::string(e), ec);
  if (ec) return std::nullopt;
  return a;
}

}  // namespace

forwarded_view evaluate_forwarded(std::string_view chain, std::string_view proto, const ip::address& peer,
                                  std::string_view peer_text, const std::vector<net::cidr>& trusted) {
  forwarded_view v;
  const bool peer_trusted = net::any_contains(trusted, peer);
  v.client_ip = std::string(peer_text);
  v.xff = std::string(peer_text);
  if (!peer_trusted) return v;
  if (iequals(proto, "http") || iequals(proto, "https")) v.proto = proto;
  if (trim_ows(chain).empty()) return v;

  // Every element must be an address; the client is the rightmost one not trusted.
  // Empty elements are kept: a chain with a hole is malformed, as any other non-address is.
  std::vector<std::string_view> elements;
  for (const auto e : list_elements(chain, empty_elements::keep)) elements.push_back(e);
  std::optional<ip::address> client, farthest;
  for (auto it = elements.rbegin(); it != elements.rend(); ++it) {
    farthest = element_address(*it);
    if (!farthest) {
      v.malformed = true;
      v.proto = {};
      return v;  // the peer is the client
    }
    if (!client && !net::any_contains(trusted, *farthest)) client = farthest;
  }
  v.client_ip = (client ? *client : *farthest).to_string();  // all trusted: the farthest one known
  v.xff.clear();
  for (const auto e : elements) v.xff.append(e).append(", ");
  v.xff.append(peer_text);
  return v;
}

}  // namespace ingressd::http
