// libFuzzer target: http::llm_meter (issue #34), the SSE and usage reader the relay feeds with
// every event-stream and JSON reply. Invariant: the figures do not depend on how the body was cut
// into reads — the whole body at once, cut at a point the input chooses, and byte by byte give the
// same events and the same usage, for both kinds of body; and no input crashes or grows memory
// past the usage capture's bound (ASan).
#include <cstddef>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <string_view>

#include "ingressd/http/llm_meter.hpp"

namespace {

using ingressd::http::llm_meter;

void check(std::string_view body, std::size_t cut, llm_meter::body kind) {
  llm_meter whole(kind), two(kind), bytes(kind);
  const auto n_whole = whole.feed(body);
  const auto n_two = two.feed(body.substr(0, cut)) + two.feed(body.substr(cut));
  std::size_t n_bytes = 0;
  for (std::size_t i = 0; i < body.size(); ++i) n_bytes += bytes.feed(body.substr(i, 1));
  if (whole.events() != two.events() || whole.events() != bytes.events() || n_whole != whole.events() ||
      n_two != whole.events() || n_bytes != whole.events() || whole.usage() != two.usage() ||
      whole.usage() != bytes.usage()) {
    std::fprintf(stderr, "llm_meter depends on the reads: events %llu / %llu / %llu, cut at %zu\n",
                 static_cast<unsigned long long>(whole.events()), static_cast<unsigned long long>(two.events()),
                 static_cast<unsigned long long>(bytes.events()), cut);
    std::abort();
  }
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t* data, std::size_t size) {
  if (size < 2) return 0;
  const std::size_t cut = (static_cast<std::size_t>(data[0]) << 8 | data[1]) % (size - 1);
  const std::string_view body(reinterpret_cast<const char*>(data + 2), size - 2);
  check(body, cut % (body.size() + 1), llm_meter::body::event_stream);
  check(body, cut % (body.size() + 1), llm_meter::body::json);
  return 0;
}
