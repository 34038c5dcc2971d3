#include "ingressd/http/syntax.hpp"

#include <array>

#include "ingressd/core/text.hpp"

namespace ingressd::http {

bool is_token(std::string_view s) noexcept {
  if (s.empty()) return false;
  for (unsigned char c : s)
    if (!is_tchar(c)) return false;
  return true;
}

bool valid_field_value(std::string_view v) noexcept {
  for (char c : v)
    if (c == '\r' || c == '\n' || c == '\0') return false;
  return true;
}

bool forwarding_field(std::string_view name) noexcept {
  // Every one starts with x or f: one compare rejects nearly every field of a request.
  if (name.empty() || ((name[0] | 0x20) != 'x' && (name[0] | 0x20) != 'f')) return false;
  static constexpr std::array<std::string_view, 5> names{"x-request-id", "x-forwarded-for", "x-forwarded-proto",
                                                          "forwarded", "x-real-ip"};
  for (const auto n : names)
    if (iequals(name, n)) return true;
  return false;
}

bool router_owned_field(std::string_view name) noexcept {
  static constexpr std::string_view prefix = "x-serve-router-";
  return name.size() >= prefix.size() && (name[0] | 0x20) == 'x' && iequals(name.substr(0, prefix.size()), prefix);
}

bool proxy_owned_field(std::string_view name) noexcept { return forwarding_field(name) || router_owned_field(name); }

bool reserved_for_router(std::string_view name) noexcept {
  static constexpr std::array<std::string_view, 10> framing{"host", "content-length", "transfer-encoding",
                                                             "connection", "keep-alive", "proxy-connection",
                                                             "te", "upgrade", "expect", "trailer"};
  for (const auto n : framing)
    if (iequals(name, n)) return true;
  return forwarding_field(name);
}

}  // namespace ingressd::http
