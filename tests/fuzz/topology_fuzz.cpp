// libFuzzer target: topology documents (JSON or YAML) → ingressd::topology::parse_document.
// Invariants: never throws or crashes; an accepted document survives to_json() and parses back
// to an equal document (the property topology.hpp documents).
#include <cstddef>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <string_view>
#include <variant>

#include "ingressd/topology/topology.hpp"

extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t* data, std::size_t size) {
  const std::string_view text(reinterpret_cast<const char*>(data), size);
  auto parsed = ingressd::topology::parse_document(text);
  auto* doc = std::get_if<ingressd::topology::document>(&parsed);
  if (!doc) {
    if (std::get<ingressd::topology::parse_error>(parsed).message.empty()) {
      std::fprintf(stderr, "parse error without a message\n");
      std::abort();
    }
    return 0;
  }
  const auto json = ingressd::topology::to_json(*doc);
  auto again = ingressd::topology::parse_document(json);
  auto* doc2 = std::get_if<ingressd::topology::document>(&again);
  if (!doc2) {
    std::fprintf(stderr, "to_json output does not parse: %s\n%s\n",
                 std::get<ingressd::topology::parse_error>(again).message.c_str(), json.c_str());
    std::abort();
  }
  if (!(*doc2 == *doc)) {
    std::fprintf(stderr, "round trip changed the document:\n%s\n", json.c_str());
    std::abort();
  }
  return 0;
}
