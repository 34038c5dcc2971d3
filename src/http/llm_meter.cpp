#include "ingressd/http/llm_meter.hpp"

#include <algorithm>
#include <cstring>

namespace ingressd::http {
namespace {

constexpr std::string_view usage_key = "\"usage\"";

bool space(char c) noexcept { return c == ' ' || c == '\t' || c == '\n' || c == '\r'; }

/// The unsigned integer after `"name"` and a colon in `text`, if there is one.
std::optional<std::uint64_t> number_after(std::string_view text, std::string_view name) {
  const auto at = text.find(name);
  if (at == std::string_view::npos) return std::nullopt;
  std::size_t i = at + name.size();
  while (i < text.size() && space(text[i])) ++i;
  if (i == text.size() || text[i] != ':') return std::nullopt;
  ++i;
  while (i < text.size() && space(text[i])) ++i;
  if (i == text.size() || text[i] < '0' || text[i] > '9') return std::nullopt;
  std::uint64_t v = 0;
  for (; i < text.size() && text[i] >= '0' && text[i] <= '9'; ++i) {
    if (v > (UINT64_MAX - 9) / 10) return std::nullopt;  // no token count is that large
    v = v * 10 + static_cast<unsigned>(text[i] - '0');
  }
  return v;
}

}  // namespace

std::size_t llm_meter::feed(std::string_view bytes) {
  if (body_ == body::json) {
    scan_usage(bytes);
    return 0;
  }
  const auto before = events_;
  const char* p = bytes.data();
  const char* const end = p + bytes.size();
  while (p < end) {
    if (after_cr_) {
      after_cr_ = false;
      if (*p == '\n') {  // CRLF: one line end
        ++p;
        continue;
      }
    }
    // The line's end: the first CR or LF (memchr twice beats a byte loop on token-sized lines).
    const auto left = static_cast<std::size_t>(end - p);
    const char* lf = static_cast<const char*>(std::memchr(p, '\n', left));
    const char* cr = static_cast<const char*>(std::memchr(p, '\r', lf ? static_cast<std::size_t>(lf - p) : left));
    const char* eol = cr ? cr : lf;
    line_bytes({p, static_cast<std::size_t>((eol ? eol : end) - p)});
    if (!eol) break;
    after_cr_ = *eol == '\r';
    end_line();
    p = eol + 1;
  }
  return static_cast<std::size_t>(events_ - before);
}

void llm_meter::line_bytes(std::string_view s) {
  if (s.empty()) return;
  std::size_t used = 0;
  if (line_len_ < sizeof field_) {
    used = std::min(s.size(), sizeof field_ - line_len_);
    std::memcpy(field_ + line_len_, s.data(), used);
    if (line_len_ + used == sizeof field_) data_line_ = std::string_view(field_, sizeof field_) == "data:";
  }
  line_len_ += s.size();
  if (data_line_ && used < s.size()) scan_usage(s.substr(used));
}

void llm_meter::end_line() {
  if (line_len_ == 0) {
    end_event();
    return;
  }
  // "data:<value>", or "data" alone (a data field with an empty value).
  if (data_line_ || (line_len_ == 4 && std::string_view(field_, 4) == "data")) {
    event_has_data_ = true;
    if (data_line_) scan_usage("\n");  // an event's data lines are joined with LF
  }
  line_len_ = 0;
  data_line_ = false;
}

void llm_meter::end_event() {
  if (event_has_data_) ++events_;
  event_has_data_ = false;
  // A usage object is one event's: a search left open at its end starts over.
  key_matched_ = 0;
  cap_ = capture::off;
  object_.clear();
}

void llm_meter::scan_usage(std::string_view s) {
  std::size_t i = 0;
  while (i < s.size()) {
    const char c = s[i];
    switch (cap_) {
      case capture::off:
        if (key_matched_ == 0) {
          // Skip to the next quote: most bytes are text that cannot start the key.
          const void* q = std::memchr(s.data() + i, '"', s.size() - i);
          if (!q) return;
          i = static_cast<std::size_t>(static_cast<const char*>(q) - s.data()) + 1;
          key_matched_ = 1;
          continue;
        }
        if (c == usage_key[key_matched_]) {
          if (++key_matched_ == usage_key.size()) {
            key_matched_ = 0;
            cap_ = capture::colon;
          }
        } else {
          key_matched_ = c == '"' ? 1 : 0;
        }
        break;
      case capture::colon:
        if (c == ':') cap_ = capture::open;
        else if (!space(c)) {
          cap_ = capture::off;
          continue;  // this byte may start the key again
        }
        break;
      case capture::open:
        if (c == '{') {
          cap_ = capture::object;
          object_.assign(1, '{');
          depth_ = 1;
          in_string_ = escaped_ = false;
        } else if (!space(c)) {
          cap_ = capture::off;  // "usage": null, or a string: not the object
          continue;
        }
        break;
      case capture::object:
        if (object_.size() >= max_usage_text) {
          cap_ = capture::off;
          object_.clear();
          continue;
        }
        object_.push_back(c);
        if (in_string_) {
          if (escaped_) escaped_ = false;
          else if (c == '\\') escaped_ = true;
          else if (c == '"') in_string_ = false;
        } else if (c == '"') {
          in_string_ = true;
        } else if (c == '{') {
          ++depth_;
        } else if (c == '}' && --depth_ == 0) {
          usage_complete();
          cap_ = capture::off;
        }
        break;
    }
    ++i;
  }
}

void llm_meter::usage_complete() {
  const auto prompt = number_after(object_, "\"prompt_tokens\"");
  const auto completion = number_after(object_, "\"completion_tokens\"");
  const auto total = number_after(object_, "\"total_tokens\"");
  object_.clear();
  if (!prompt && !completion && !total) return;  // some other "usage"
  llm_usage u;
  u.prompt = prompt.value_or(0);
  u.completion = completion.value_or(0);
  u.total = total.value_or(u.prompt + u.completion);
  usage_ = u;
}

}  // namespace ingressd::http
