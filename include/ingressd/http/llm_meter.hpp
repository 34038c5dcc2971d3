#pragma once
// What a response body says about the LLM work it carried (issue #34), read as the bytes go to
// the client, without I/O: the events of a `text/event-stream` (Server-Sent Events, WHATWG HTML
// §9.2.6: lines ended by CRLF, LF or CR; an event is dispatched at an empty line when it has
// data; `:` lines are comments) and the token `usage` object of OpenAI-style replies (the final
// chunk of a stream sent with `stream_options.include_usage`, or a non-streamed JSON reply).
//
// Only what is needed is parsed, incrementally, with a bounded cost per byte: line ends and the
// start of each line are found with memchr, the `"usage"` key with a search over data lines (or
// the JSON body) and its object captured up to 512 bytes. Nothing is changed or held back: a
// malformed stream is relayed as it came and simply yields no usage. Unit-tested at every split
// of the input (tests/unit/llm_meter_test.cpp).
#include <cstddef>
#include <cstdint>
#include <optional>
#include <string>
#include <string_view>

namespace ingressd::http {

/// Token counts of an OpenAI-style `usage` object.
struct llm_usage {
  std::uint64_t prompt = 0;
  std::uint64_t completion = 0;
  std::uint64_t total = 0;
  bool operator==(const llm_usage&) const = default;
};

class llm_meter {
 public:
  enum class body : std::uint8_t { event_stream, json };
  explicit llm_meter(body b) noexcept : body_(b) {}

  /// The next body bytes, as sent to the client. Returns how many events they completed.
  std::size_t feed(std::string_view bytes);
  std::size_t feed(const unsigned char* p, std::size_t n) { return feed({reinterpret_cast<const char*>(p), n}); }
  /// Events dispatched so far (event streams).
  std::uint64_t events() const noexcept { return events_; }
  /// The last complete `usage` object seen, if any.
  const std::optional<llm_usage>& usage() const noexcept { return usage_; }

  /// The usage object's longest accepted text: longer ones are not usage objects of a reply.
  static constexpr std::size_t max_usage_text = 512;

 private:
  void line_bytes(std::string_view s);
  void end_line();
  void end_event();
  void scan_usage(std::string_view s);
  void usage_complete();

  body body_;
  std::uint64_t events_ = 0;
  std::optional<llm_usage> usage_;
  // SSE line state.
  bool after_cr_ = false;      // the last byte was CR: an LF next is part of the same line end
  std::size_t line_len_ = 0;   // bytes of the current line so far
  char field_[5] = {};         // its first bytes, to know a data line ("data:" or a bare "data")
  bool data_line_ = false;     // the current line is a data line (known after its 5th byte)
  bool event_has_data_ = false;
  // The "usage" search: how much of the key matched so far, then the object being captured.
  std::size_t key_matched_ = 0;
  enum class capture : std::uint8_t { off, colon, open, object } cap_ = capture::off;
  std::string object_;
  int depth_ = 0;
  bool in_string_ = false, escaped_ = false;
};

}  // namespace ingressd::http
