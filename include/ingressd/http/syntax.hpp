#pragma once
// HTTP field rules in one place (RFC 9110), for everything that judges a header name or value:
// the request validator, the config loader (router.session_header, router.methods), the router
// reply reader (request_headers) and the request the session forwards. Sans-I/O.
#include <string_view>

namespace ingressd::http {

/// RFC 9110 §5.6.2 tchar: a character of a token (field names, methods).
constexpr bool is_tchar(unsigned char c) noexcept {
  if ((c >= '0' && c <= '9') || (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z')) return true;
  switch (c) {
    case '!': case '#': case '$': case '%': case '&': case '\'': case '*': case '+': case '-':
    case '.': case '^': case '_': case '`': case '|': case '~':
      return true;
    default:
      return false;
  }
}

/// RFC 9110 §5.6.2 token: one or more tchar.
bool is_token(std::string_view s) noexcept;

/// True when `v` can be sent as a field value: no CR, LF or NUL (hardening D8).
bool valid_field_value(std::string_view v) noexcept;

/// The forwarding fields ingressd sets itself on a proxied request (X-Forwarded-For,
/// X-Forwarded-Proto, X-Request-Id) and their relatives it removes (Forwarded, X-Real-IP): a
/// client's value would let it choose what the replica believes. Case-insensitive.
bool forwarding_field(std::string_view name) noexcept;

/// The router-owned namespace, `x-serve-router-*` (ray constants.py
/// SERVE_INGRESS_ROUTER_HEADER_PREFIX): only a router's reply sets these; a client value would
/// spoof a routing decision (contract §9). Case-insensitive.
bool router_owned_field(std::string_view name) noexcept;

/// Client request fields that are never forwarded as sent: forwarding_field or router_owned_field.
bool proxy_owned_field(std::string_view name) noexcept;

/// Fields a router's `request_headers` may not set on the forwarded request: framing and
/// hop-by-hop fields (a second Content-Length would be a smuggling shape) and the forwarding
/// fields (a second X-Request-Id would split the request's identity). Case-insensitive.
bool reserved_for_router(std::string_view name) noexcept;

}  // namespace ingressd::http
