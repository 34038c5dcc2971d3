#pragma once
// The router-reply interpretation written on nlohmann::json: the reference that the hand-written
// reader in src/routing/router_reply.cpp must agree with on every input (unit test and fuzz
// target). Same rules as parse_router_reply; only the JSON parser differs.
#include <nlohmann/json.hpp>

#include "ingressd/http/syntax.hpp"
#include "ingressd/routing/router_reply.hpp"

namespace ingressd::routing::reference {

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
      if (!it.value().is_string()) {
        ++r.skipped_headers;
        continue;
      }
      if (!http::is_token(it.key())) return r;
      const auto& v = it.value().get_ref<const std::string&>();
      if (!http::valid_field_value(v)) return r;
      if (!http::reserved_for_router(it.key())) r.request_headers.emplace_back(it.key(), v);
    }
  }
  r.replica_id = id->get<std::string>();
  r.what = router_reply::kind::pinned;
  return r;
}

}  // namespace ingressd::routing::reference
