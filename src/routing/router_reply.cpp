#include "ingressd/routing/router_reply.hpp"

#include <nlohmann/json.hpp>

#include "ingressd/core/text.hpp"

namespace ingressd::routing {

bool is_token(std::string_view name) noexcept {
  if (name.empty()) return false;
  for (unsigned char c : name) {
    if ((c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || (c >= '0' && c <= '9')) continue;
    switch (c) {
      case '!': case '#': case '$': case '%': case '&': case '\'': case '*': case '+': case '-':
      case '.': case '^': case '_': case '`': case '|': case '~':
        continue;
      default:
        return false;
    }
  }
  return true;
}

namespace {


/// Headers the proxy owns on the forwarded request: framing and hop-by-hop fields, and the ones
/// it sets itself. A router may not set these (a second Content-Length would be a smuggling
/// shape; a second X-Request-Id would split the request's identity), so they are dropped.
bool reserved(std::string_view name) noexcept {
  static constexpr std::string_view names[] = {
      "host", "content-length", "transfer-encoding", "connection", "keep-alive", "proxy-connection",
      "te", "upgrade", "expect", "trailer", "x-request-id", "x-forwarded-for", "x-forwarded-proto"};
  for (auto n : names)
    if (iequals(n, name)) return true;
  return false;
}

bool valid_value(std::string_view v) noexcept {
  for (char c : v)
    if (c == '\r' || c == '\n' || c == '\0') return false;
  return true;
}
}  // namespace

router_reply parse_router_reply(unsigned status, std::string_view body) {
  router_reply r;
  if (status != 200) {
    r.what = router_reply::kind::non_200;
    return r;
  }
  auto j = nlohmann::json::parse(body, nullptr, /*allow_exceptions=*/false);
  if (!j.is_object()) return r;
  auto id = j.find("replica_id");
  if (id == j.end() || !id->is_string() || id->get_ref<const std::string&>().empty()) return r;
  if (auto h = j.find("request_headers"); h != j.end() && !h->is_null()) {
    // A router that asks for headers we cannot set safely has given no usable answer.
    if (!h->is_object()) return r;
    for (auto it = h->begin(); it != h->end(); ++it) {
      if (!it.value().is_string() || !is_token(it.key())) return r;
      const auto& v = it.value().get_ref<const std::string&>();
      if (!valid_value(v)) return r;
      if (!reserved(it.key())) r.request_headers.emplace_back(it.key(), v);
    }
  }
  r.replica_id = id->get<std::string>();
  r.what = router_reply::kind::pinned;
  return r;
}

std::string build_router_request(const router_request_parts& p) {
  std::string out;
  out.reserve(192 + p.body.size());
  out.append("POST /internal/route HTTP/1.1\r\nHost: ").append(p.host);
  out.append("\r\nContent-Type: application/json\r\nContent-Length: ").append(std::to_string(p.body.size()));
  out.append("\r\n");
  if (p.truncated_total)
    out.append("X-Body-Truncated: ")
        .append(std::to_string(p.body.size()))
        .append("/")
        .append(std::to_string(*p.truncated_total))
        .append("\r\n");
  if (!p.session_header.empty() && !p.session_value.empty())
    out.append(p.session_header).append(": ").append(p.session_value).append("\r\n");
  out.append("X-Request-Id: ").append(p.request_id).append("\r\n\r\n");
  out.append(p.body);
  return out;
}

}  // namespace ingressd::routing
