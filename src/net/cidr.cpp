#include "ingressd/net/cidr.hpp"

#include <charconv>

namespace ingressd::net {

namespace ip = boost::asio::ip;

ip::address unmapped(const ip::address& a) noexcept {
  if (a.is_v6() && a.to_v6().is_v4_mapped()) return ip::make_address_v4(ip::v4_mapped, a.to_v6());
  return a;
}

namespace {

/// The bytes of `a` with every bit past `prefix` cleared.
template <class Bytes>
Bytes masked(Bytes b, unsigned prefix) noexcept {
  for (std::size_t i = 0; i < b.size(); ++i) {
    const unsigned bit = static_cast<unsigned>(i) * 8;
    if (bit >= prefix) b[i] = 0;
    else if (prefix - bit < 8) b[i] = static_cast<unsigned char>(b[i] & (0xff << (8 - (prefix - bit))));
  }
  return b;
}

}  // namespace

std::optional<cidr> cidr::parse(std::string_view text) {
  const auto slash = text.find('/');
  boost::system::error_code ec;
  const auto addr = unmapped(ip::make_address(std::string(text.substr(0, slash)), ec));
  if (ec) return std::nullopt;
  const unsigned width = addr.is_v4() ? 32 : 128;
  unsigned prefix = width;
  if (slash != std::string_view::npos) {
    const auto digits = text.substr(slash + 1);
    if (digits.empty() || digits.size() > 3) return std::nullopt;
    const auto [end, err] = std::from_chars(digits.data(), digits.data() + digits.size(), prefix);
    if (err != std::errc{} || end != digits.data() + digits.size() || prefix > width) return std::nullopt;
  }
  cidr c;
  c.prefix = prefix;
  if (addr.is_v4()) c.network = ip::address_v4(masked(addr.to_v4().to_bytes(), prefix));
  else c.network = ip::address_v6(masked(addr.to_v6().to_bytes(), prefix));
  return c;
}

bool cidr::contains(const ip::address& raw) const noexcept {
  const auto a = unmapped(raw);
  if (a.is_v4() != network.is_v4()) return false;
  if (a.is_v4()) return masked(a.to_v4().to_bytes(), prefix) == network.to_v4().to_bytes();
  return masked(a.to_v6().to_bytes(), prefix) == network.to_v6().to_bytes();
}

std::string cidr::to_string() const { return network.to_string() + "/" + std::to_string(prefix); }

bool any_contains(const std::vector<cidr>& set, const ip::address& a) noexcept {
  for (const auto& c : set)
    if (c.contains(a)) return true;
  return false;
}

}  // namespace ingressd::net
