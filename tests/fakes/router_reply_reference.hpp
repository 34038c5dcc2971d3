#pragma once
// The router-reply interpretation written on nlohmann::json: the reference that the hand-written
// reader in src/routing/router_reply.cpp must agree with on every input (unit test and fuzz
// target). Same rules as parse_router_reply; only the JSON parser differs.
#include <nlohmann/json.hpp>

#include "ingressd/core/text.hpp"
#include "ingressd/routing/router_reply.hpp"

namespace ingressd::routing::reference {

inline bool reserved(std::string_view name) noexcept {
  static constexpr std::string_view names[] = {
      "host", "content-length", "transfer-encoding", "connection", "keep-alive", "proxy-connection",
      "te", "upgrade", "expect", "trailer", "x-request-id", "x-forwarded-for", "x-forwarded-proto"};
  for (auto n : names)
    if (iequals(n, name)) return true;
  return false;
}

inline router_reply parse_router_reply(unsigned status, std::string_view body) {
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
    if (!h->is_object()) return r;
    for (auto it = h->begin(); it != h->end(); ++it) {
      if (!it.value().is_string() || !is_token(it.key())) return r;
      const auto& v = it.value().get_ref<const std::string&>();
      if (v.find_first_of(std::string_view("\r\n\0", 3)) != std::string::npos) return r;
      if (!reserved(it.key())) r.request_headers.emplace_back(it.key(), v);
    }
  }
  r.replica_id = id->get<std::string>();
  r.what = router_reply::kind::pinned;
  return r;
}

}  // namespace ingressd::routing::reference
