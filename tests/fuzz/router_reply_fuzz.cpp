// libFuzzer target: router replies (the body of a 200 from POST /internal/route) →
// ingressd::routing::parse_router_reply, differentially against the nlohmann::json reference
// (tests/fakes/router_reply_reference.hpp). Invariant: both give the same kind and replica id on
// every input, and the same request headers when the reply is pinned.
#include <cstddef>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <string_view>

#include "fakes/router_reply_reference.hpp"
#include "ingressd/routing/router_reply.hpp"

extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t* data, std::size_t size) {
  const std::string_view body(reinterpret_cast<const char*>(data), size);
  const auto fast = ingressd::routing::parse_router_reply(200, body);
  const auto ref = ingressd::routing::reference::parse_router_reply(200, body);
  // Headers mean something only in a pinned reply (an unusable one may carry a partial list).
  const bool same_headers = fast.what != ingressd::routing::router_reply::kind::pinned ||
                            fast.request_headers == ref.request_headers;
  if (fast.what != ref.what || fast.replica_id != ref.replica_id || !same_headers) {
    std::fprintf(stderr, "router reply readers disagree: kind %d vs %d, id '%s' vs '%s', %zu vs %zu headers\n",
                 static_cast<int>(fast.what), static_cast<int>(ref.what), fast.replica_id.c_str(),
                 ref.replica_id.c_str(), fast.request_headers.size(), ref.request_headers.size());
    std::abort();
  }
  return 0;
}
