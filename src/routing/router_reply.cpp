#include "ingressd/routing/router_reply.hpp"

#include <algorithm>
#include <cmath>
#include <cstdlib>

#include "ingressd/core/text.hpp"
#include "ingressd/http/syntax.hpp"

namespace ingressd::routing {

// A small strict JSON reader for the router reply. nlohmann::json (a DOM parse) cost ~12,900
// instructions per request in the router-path profile, 17% of the proxy's user-space work; this
// reader accepts exactly the documents nlohmann accepts (RFC 8259, UTF-8 validated, a leading
// BOM skipped, non-finite numbers refused, duplicate keys: last one wins) and gives the same
// answer — tests/unit/router_reply_json_test.cpp and tests/fuzz/router_reply_fuzz.cpp check it
// against nlohmann on every input they make. It copies only replica_id and header strings, and
// decodes only strings that contain escapes.
namespace {

class json_reader {
 public:
  explicit json_reader(std::string_view s) noexcept : p_(s.data()), end_(s.data() + s.size()) {}

  /// Only whitespace is left. Like nlohmann's lexer, a NUL byte where a token would start ends
  /// the input (whatever follows it is ignored).
  bool at_end() noexcept {
    ws();
    return p_ == end_ || *p_ == '\0';
  }
  void skip_bom() noexcept {
    if (end_ - p_ >= 3 && std::string_view(p_, 3) == "\xEF\xBB\xBF") p_ += 3;
  }
  bool eat(char c) noexcept {
    ws();
    if (p_ != end_ && *p_ == c) {
      ++p_;
      return true;
    }
    return false;
  }
  bool peek(char c) noexcept {
    ws();
    return p_ != end_ && *p_ == c;
  }

  /// A string token; `out` views the input when it has no escapes, else `scratch`.
  bool string(std::string_view& out, std::string& scratch) {
    if (!eat('"')) return false;
    const char* begin = p_;
    bool escaped = false;
    while (p_ != end_) {
      const auto c = static_cast<unsigned char>(*p_);
      if (c == '"') {
        if (!escaped) out = std::string_view(begin, static_cast<std::size_t>(p_ - begin));
        ++p_;
        if (escaped) out = scratch;
        return true;
      }
      if (c < 0x20) return false;
      if (c == '\\') {
        if (!escaped) {
          scratch.assign(begin, p_);
          escaped = true;
        }
        if (!escape(scratch)) return false;
        continue;
      }
      const char* from = p_;
      if (c < 0x80) {
        ++p_;
      } else if (!utf8()) {
        return false;
      }
      if (escaped) scratch.append(from, p_);
    }
    return false;
  }

  /// Any value, nested to any depth (iteratively: the nesting is kept in `stack_`).
  bool skip_value() {
    const std::size_t base = stack_.size();
    for (;;) {
      // a value starts here
      ws();
      if (p_ == end_) return false;
      bool closed = false;
      switch (*p_) {
        case '{':
          ++p_;
          if (eat('}')) {
            closed = true;
          } else {
            stack_.push_back('}');
            if (!key()) return false;
          }
          break;
        case '[':
          ++p_;
          if (eat(']')) closed = true;
          else stack_.push_back(']');
          break;
        default:
          if (!scalar()) return false;
          closed = true;
      }
      if (!closed) continue;
      // after a complete value: close containers or move to the next element
      for (;;) {
        if (stack_.size() == base) return true;
        ws();
        if (p_ == end_) return false;
        if (*p_ == stack_.back()) {
          ++p_;
          stack_.pop_back();
          continue;
        }
        if (*p_ != ',') return false;
        ++p_;
        if (stack_.back() == '}' && !key()) return false;
        break;
      }
    }
  }

  bool null_literal() noexcept {
    ws();
    if (end_ - p_ >= 4 && std::string_view(p_, 4) == "null") {
      p_ += 4;
      return true;
    }
    return false;
  }

  /// `"name" :` of an object member.
  bool key() {
    std::string_view k;
    return string(k, key_scratch_) && eat(':');
  }

 private:
  void ws() noexcept {
    while (p_ != end_ && (*p_ == ' ' || *p_ == '\t' || *p_ == '\n' || *p_ == '\r')) ++p_;
  }

  static int hex(char c) noexcept {
    if (c >= '0' && c <= '9') return c - '0';
    if (c >= 'a' && c <= 'f') return c - 'a' + 10;
    if (c >= 'A' && c <= 'F') return c - 'A' + 10;
    return -1;
  }
  bool u4(unsigned& v) noexcept {
    if (end_ - p_ < 4) return false;
    v = 0;
    for (int i = 0; i < 4; ++i) {
      const int h = hex(*p_++);
      if (h < 0) return false;
      v = v * 16 + static_cast<unsigned>(h);
    }
    return true;
  }
  /// One escape sequence at p_ (the backslash), decoded onto `out`.
  bool escape(std::string& out) {
    ++p_;
    if (p_ == end_) return false;
    const char c = *p_++;
    switch (c) {
      case '"': out.push_back('"'); return true;
      case '\\': out.push_back('\\'); return true;
      case '/': out.push_back('/'); return true;
      case 'b': out.push_back('\b'); return true;
      case 'f': out.push_back('\f'); return true;
      case 'n': out.push_back('\n'); return true;
      case 'r': out.push_back('\r'); return true;
      case 't': out.push_back('\t'); return true;
      case 'u': break;
      default: return false;
    }
    unsigned cp = 0;
    if (!u4(cp)) return false;
    if (cp >= 0xDC00 && cp <= 0xDFFF) return false;  // a low surrogate alone
    if (cp >= 0xD800 && cp <= 0xDBFF) {
      unsigned lo = 0;
      if (end_ - p_ < 2 || p_[0] != '\\' || p_[1] != 'u') return false;
      p_ += 2;
      if (!u4(lo) || lo < 0xDC00 || lo > 0xDFFF) return false;
      cp = 0x10000 + ((cp - 0xD800) << 10) + (lo - 0xDC00);
    }
    if (cp < 0x80) {
      out.push_back(static_cast<char>(cp));
    } else if (cp < 0x800) {
      out.push_back(static_cast<char>(0xC0 | (cp >> 6)));
      out.push_back(static_cast<char>(0x80 | (cp & 0x3F)));
    } else if (cp < 0x10000) {
      out.push_back(static_cast<char>(0xE0 | (cp >> 12)));
      out.push_back(static_cast<char>(0x80 | ((cp >> 6) & 0x3F)));
      out.push_back(static_cast<char>(0x80 | (cp & 0x3F)));
    } else {
      out.push_back(static_cast<char>(0xF0 | (cp >> 18)));
      out.push_back(static_cast<char>(0x80 | ((cp >> 12) & 0x3F)));
      out.push_back(static_cast<char>(0x80 | ((cp >> 6) & 0x3F)));
      out.push_back(static_cast<char>(0x80 | (cp & 0x3F)));
    }
    return true;
  }
  /// One multi-byte UTF-8 sequence at p_ (core/text.hpp's rules, as nlohmann's).
  bool utf8() noexcept {
    const std::size_t n = utf8_sequence(std::string_view(p_, static_cast<std::size_t>(end_ - p_)), 0);
    p_ += n;
    return n != 0;
  }
  bool digits() noexcept {
    const char* from = p_;
    while (p_ != end_ && *p_ >= '0' && *p_ <= '9') ++p_;
    return p_ != from;
  }
  /// A number: RFC 8259 grammar, and finite as a double (nlohmann refuses 1e999).
  bool number() {
    const char* from = p_;
    if (*p_ == '-') ++p_;
    if (p_ == end_) return false;
    if (*p_ == '0') {
      ++p_;
    } else if (!digits()) {
      return false;
    }
    bool plain = true;
    if (p_ != end_ && *p_ == '.') {
      ++p_;
      if (!digits()) return false;
      plain = false;
    }
    if (p_ != end_ && (*p_ == 'e' || *p_ == 'E')) {
      ++p_;
      if (p_ != end_ && (*p_ == '+' || *p_ == '-')) ++p_;
      if (!digits()) return false;
      plain = false;
    }
    if (plain && p_ - from <= 18) return true;  // fits an int64: cannot overflow
    const std::string text(from, p_);
    return std::isfinite(std::strtod(text.c_str(), nullptr));
  }
  bool scalar() {
    switch (*p_) {
      case '"': {
        std::string_view ignored;
        return string(ignored, key_scratch_);
      }
      case 't': return word("true");
      case 'f': return word("false");
      case 'n': return word("null");
      default:
        if (*p_ == '-' || (*p_ >= '0' && *p_ <= '9')) return number();
        return false;
    }
  }
  bool word(std::string_view w) noexcept {
    if (static_cast<std::size_t>(end_ - p_) < w.size() || std::string_view(p_, w.size()) != w) return false;
    p_ += w.size();
    return true;
  }

  const char* p_;
  const char* end_;
  std::string stack_;        // closing brackets of the open containers (SSO: no allocation when shallow)
  std::string key_scratch_;  // decoded keys and skipped strings
};

/// `"request_headers": {...}`: every string value under a token name; a member whose value is
/// not a string is skipped and counted in `skipped`; anything but an object (or null) is unusable.
/// Like a JSON object, a repeated name keeps its last value; names come out sorted.
bool read_headers(json_reader& in, std::vector<std::pair<std::string, std::string>>& out, bool& usable,
                  unsigned& skipped) {
  out.clear();
  usable = true;
  skipped = 0;
  if (in.null_literal()) return true;
  if (!in.peek('{')) {
    usable = false;
    return in.skip_value();
  }
  in.eat('{');
  if (in.eat('}')) return true;
  struct member {
    std::string name, value;
    bool is_string;
  };
  std::vector<member> all;
  std::string name_scratch, value_scratch;
  do {
    std::string_view name;
    if (!in.string(name, name_scratch) || !in.eat(':')) return false;
    member m{std::string(name), {}, in.peek('"')};
    std::string_view value;
    if (m.is_string ? !in.string(value, value_scratch) : !in.skip_value()) return false;
    m.value.assign(value);
    all.push_back(std::move(m));
  } while (in.eat(','));
  if (!in.eat('}')) return false;
  // As in a JSON object: the last member of a name wins (a later string can replace an earlier
  // non-string and the other way round); names come out sorted.
  std::stable_sort(all.begin(), all.end(), [](const member& a, const member& b) { return a.name < b.name; });
  for (std::size_t i = 0; i < all.size(); ++i) {
    if (i + 1 < all.size() && all[i + 1].name == all[i].name) continue;
    if (!all[i].is_string) {
      ++skipped;  // Ray's Lua sets only string values: one odd member does not spoil the reply
      continue;
    }
    out.emplace_back(std::move(all[i].name), std::move(all[i].value));
  }
  return true;
}

}  // namespace

router_reply parse_router_reply(unsigned status, std::string_view body) {
  router_reply r;
  if (status != 200) {
    r.what = router_reply::kind::non_200;
    return r;
  }
  json_reader in(body);
  in.skip_bom();
  if (!in.eat('{')) return r;
  std::string id;
  bool id_ok = false;      // the last replica_id member is a non-empty string
  bool headers_ok = true;  // the last request_headers member is absent, null or an object
  unsigned skipped = 0;
  std::vector<std::pair<std::string, std::string>> headers;
  if (!in.eat('}')) {
    std::string key_scratch, value_scratch;
    do {
      std::string_view key;
      if (!in.string(key, key_scratch) || !in.eat(':')) return r;
      if (key == "replica_id") {
        id_ok = in.peek('"');
        std::string_view text;
        if (id_ok ? !in.string(text, value_scratch) : !in.skip_value()) return r;
        id.assign(text);
        id_ok = id_ok && !id.empty();
      } else if (key == "request_headers") {
        if (!read_headers(in, headers, headers_ok, skipped)) return r;
      } else if (!in.skip_value()) {
        return r;
      }
    } while (in.eat(','));
    if (!in.eat('}')) return r;
  }
  if (!in.at_end() || !id_ok || !headers_ok) return r;
  for (auto& [name, value] : headers) {
    // A router that asks for headers we cannot set safely has given no usable answer.
    if (!http::is_token(name) || !http::valid_field_value(value)) return r;
    if (!http::reserved_for_router(name)) r.request_headers.emplace_back(std::move(name), std::move(value));
  }
  r.replica_id = std::move(id);
  r.skipped_headers = skipped;
  r.what = router_reply::kind::pinned;
  return r;
}

std::string build_router_request(const router_request_parts& p) {
  std::string out;
  build_router_request(p, out);
  return out;
}

void build_router_request(const router_request_parts& p, std::string& out) {
  out.clear();
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
}

}  // namespace ingressd::routing
