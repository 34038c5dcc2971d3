// libFuzzer target: YAML config text → ingressd::config::load_yaml, then validate().
// Invariants: never throws or crashes; every refusal carries a message.
#include <cstddef>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <string>
#include <variant>

#include "ingressd/config/config.hpp"

extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t* data, std::size_t size) {
  const std::string text(reinterpret_cast<const char*>(data), size);
  auto loaded = ingressd::config::load_yaml(text, "fuzz.yaml");
  if (auto* err = std::get_if<ingressd::config::config_error>(&loaded)) {
    if (err->message.empty()) {
      std::fprintf(stderr, "config error without a message\n");
      std::abort();
    }
    return 0;
  }
  const auto& cfg = std::get<ingressd::config::config>(loaded);
  for (bool demo : {false, true}) {
    if (auto err = ingressd::config::validate(cfg, demo); err && err->message.empty()) {
      std::fprintf(stderr, "validate error without a message\n");
      std::abort();
    }
  }
  (void)cfg.effective_threads();
  (void)cfg.listen.to_string();
  return 0;
}
