#include "ingressd/net/proxy_protocol.hpp"

#include <algorithm>
#include <array>
#include <charconv>
#include <cstring>
#include <string>

namespace ingressd::net {

namespace ip = boost::asio::ip;

std::string_view to_string(proxy_error e) noexcept {
  switch (e) {
    case proxy_error::untrusted: return "untrusted";
    case proxy_error::invalid: return "invalid";
    case proxy_error::oversized: return "oversized";
    case proxy_error::truncated: return "truncated";
    case proxy_error::timeout: return "timeout";
  }
  return "invalid";
}

namespace {

constexpr std::string_view v1_prefix = "PROXY ";
constexpr std::array<unsigned char, 12> v2_signature = {0x0D, 0x0A, 0x0D, 0x0A, 0x00, 0x0D,
                                                        0x0A, 0x51, 0x55, 0x49, 0x54, 0x0A};

proxy_header fail(proxy_error e, std::string_view detail) {
  proxy_header h;
  h.st = proxy_header::state::failed;
  h.error = e;
  h.detail = detail;
  return h;
}

proxy_header done(std::size_t length, std::optional<ip::tcp::endpoint> source = std::nullopt) {
  proxy_header h;
  h.st = proxy_header::state::done;
  h.length = length;
  h.source = source;
  return h;
}

/// A v1 port: 0-65535, decimal, no sign and no leading zero.
std::optional<std::uint16_t> v1_port(std::string_view s) {
  if (s.empty() || s.size() > 5 || (s.size() > 1 && s[0] == '0')) return std::nullopt;
  unsigned v = 0;
  const auto [end, ec] = std::from_chars(s.data(), s.data() + s.size(), v);
  if (ec != std::errc{} || end != s.data() + s.size() || v > 65535) return std::nullopt;
  return static_cast<std::uint16_t>(v);
}

/// "PROXY TCP4 192.0.2.1 198.51.100.1 56324 443\r\n" or "PROXY UNKNOWN ...\r\n".
proxy_header parse_v1(std::string_view bytes) {
  const auto window = bytes.substr(0, max_proxy_v1_bytes);
  const auto eol = window.find("\r\n");
  if (eol == std::string_view::npos) {
    // A CR may only come right before the LF, and an LF only after it.
    if (window.find('\n') != std::string_view::npos) return fail(proxy_error::invalid, "v1: bare LF");
    const auto cr = window.find('\r');
    if (cr != std::string_view::npos && cr + 1 < window.size()) return fail(proxy_error::invalid, "v1: bare CR");
    if (bytes.size() >= max_proxy_v1_bytes) return fail(proxy_error::oversized, "v1: no CRLF within 107 bytes");
    return {};
  }
  const auto line = window.substr(v1_prefix.size(), eol - v1_prefix.size());
  if (line.find_first_of("\r\n") != std::string_view::npos) return fail(proxy_error::invalid, "v1: bare CR");
  // UNKNOWN: the rest of the line is to be ignored, and the socket's own addresses stand.
  if (line == "UNKNOWN" || line.starts_with("UNKNOWN ")) return done(eol + 2);
  std::array<std::string_view, 5> f{};
  std::size_t n = 0, start = 0;
  for (;;) {
    const auto sp = line.find(' ', start);
    if (n == f.size()) return fail(proxy_error::invalid, "v1: too many fields");
    f[n++] = line.substr(start, sp == std::string_view::npos ? std::string_view::npos : sp - start);
    if (sp == std::string_view::npos) break;
    start = sp + 1;
  }
  const bool v4 = f[0] == "TCP4";
  if (!v4 && f[0] != "TCP6") return fail(proxy_error::invalid, "v1: protocol is not TCP4, TCP6 or UNKNOWN");
  if (n != 5) return fail(proxy_error::invalid, "v1: expected 5 fields");
  boost::system::error_code ec1, ec2;
  const auto src = ip::make_address(std::string(f[1]), ec1);
  const auto dst = ip::make_address(std::string(f[2]), ec2);
  if (ec1 || ec2 || src.is_v4() != v4 || dst.is_v4() != v4 || f[1].find('%') != std::string_view::npos)
    return fail(proxy_error::invalid, "v1: address does not match the protocol");
  const auto sport = v1_port(f[3]);
  if (!sport || !v1_port(f[4])) return fail(proxy_error::invalid, "v1: invalid port");
  return done(eol + 2, ip::tcp::endpoint(src, *sport));
}

std::uint16_t be16(const unsigned char* p) noexcept { return static_cast<std::uint16_t>(p[0] << 8 | p[1]); }

proxy_header parse_v2(std::string_view bytes) {
  if (bytes.size() < 16) return {};
  const auto* p = reinterpret_cast<const unsigned char*>(bytes.data());
  const unsigned version = p[12] >> 4, command = p[12] & 0x0f;
  const unsigned family = p[13] >> 4, transport = p[13] & 0x0f;
  const std::size_t length = 16 + be16(p + 14);
  if (version != 2) return fail(proxy_error::invalid, "v2: version is not 2");
  if (command > 1) return fail(proxy_error::invalid, "v2: command is neither LOCAL nor PROXY");
  if (family > 3 || transport > 2) return fail(proxy_error::invalid, "v2: unknown address family or protocol");
  if (length > max_proxy_v2_bytes) return fail(proxy_error::oversized, "v2: header longer than 2064 bytes");
  const std::size_t need = family == 1 ? 12 : family == 2 ? 36 : family == 3 ? 216 : 0;
  if (length - 16 < need) return fail(proxy_error::invalid, "v2: address block shorter than its family's");
  if (bytes.size() < length) return {};
  // LOCAL (the balancer's own connection, e.g. a health check), AF_UNSPEC, AF_UNIX and anything
  // but a stream: the socket's own addresses stand (the specification's rule for receivers).
  if (command == 0 || transport != 1 || (family != 1 && family != 2)) return done(length);
  if (family == 1) {
    ip::address_v4::bytes_type a;
    std::memcpy(a.data(), p + 16, 4);
    return done(length, ip::tcp::endpoint(ip::address_v4(a), be16(p + 24)));
  }
  ip::address_v6::bytes_type a;
  std::memcpy(a.data(), p + 16, 16);
  return done(length, ip::tcp::endpoint(ip::address_v6(a), be16(p + 48)));
}

}  // namespace

proxy_header parse_proxy_header(std::string_view bytes) noexcept {
  if (bytes.empty()) return {};
  try {
    // Decide by the first bytes as soon as they rule a version out.
    const std::size_t v1_seen = std::min(bytes.size(), v1_prefix.size());
    const std::size_t v2_seen = std::min(bytes.size(), v2_signature.size());
    const bool maybe_v1 = bytes.substr(0, v1_seen) == v1_prefix.substr(0, v1_seen);
    const bool maybe_v2 = std::memcmp(bytes.data(), v2_signature.data(), v2_seen) == 0;
    if (!maybe_v1 && !maybe_v2) return fail(proxy_error::invalid, "not a PROXY protocol header");
    if (maybe_v1 && bytes.size() >= v1_prefix.size()) return parse_v1(bytes);
    if (maybe_v2 && bytes.size() >= v2_signature.size()) return parse_v2(bytes);
    return {};
  } catch (const std::exception&) {  // std::string for make_address: only out of memory
    return fail(proxy_error::invalid, "out of memory");
  }
}

}  // namespace ingressd::net
