// Request head validation (include/ingressd/http/validate.hpp).
#include "ingressd/http/validate.hpp"

#include <algorithm>
#include <array>
#include <cstdint>
#include <optional>
#include <stdexcept>

#include <boost/asio/buffer.hpp>
#include <boost/beast/http/error.hpp>
#include <boost/beast/http/buffer_body.hpp>

#include "ingressd/core/text.hpp"
#include "ingressd/http/list.hpp"
#include "ingressd/http/parse_guards.hpp"
#include "ingressd/http/syntax.hpp"

namespace ingressd::http {

namespace {

constexpr bool is_digit(unsigned char c) noexcept { return c >= '0' && c <= '9'; }
constexpr bool is_alpha(unsigned char c) noexcept { return (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z'); }
constexpr bool is_hex(unsigned char c) noexcept {
  return is_digit(c) || (c >= 'a' && c <= 'f') || (c >= 'A' && c <= 'F');
}

/// Byte classes for the scan of every request head, one table lookup per byte: k_tchar = may
/// appear in a field name (tchar); k_field = may appear in a field line (no control character
/// other than HTAB, no DEL; CR counts as a control character).
enum : std::uint8_t { k_tchar = 1, k_field = 2 };
constexpr std::array<std::uint8_t, 256> byte_class = [] {
  std::array<std::uint8_t, 256> t{};
  for (unsigned i = 0; i < 256; ++i) {
    const auto c = static_cast<unsigned char>(i);
    if (is_tchar(c)) t[i] |= k_tchar;
    if (!((c < 0x20 && c != '\t') || c == 0x7f)) t[i] |= k_field;
  }
  return t;
}();

constexpr char lower(char c) noexcept { return c >= 'A' && c <= 'Z' ? static_cast<char>(c + 32) : c; }

/// Transfer-Encoding of a request: only exactly `chunked` is accepted (RFC 9112 §6.1, §6.3 item
/// 4, §7.1; hardening A6).
verdict check_transfer_encoding(std::string_view value) noexcept {
  std::string_view last;
  bool chunked_before = false;
  bool other_before = false;
  bool first = true;
  // Empty elements are kept: a coding list with a hole is refused, not read past.
  for (const auto element : list_elements(value, empty_elements::keep)) {
    if (element.empty()) return {400, "empty transfer coding"};
    if (!first) {
      // `last` was not the final element.
      auto name = last.substr(0, last.find_first_of("; \t"));
      if (iequals(name, "chunked"))
        chunked_before = true;
      else
        other_before = true;
    }
    last = element;
    first = false;
  }
  if (!iequals(last, "chunked")) {
    auto name = last.substr(0, last.find_first_of("; \t"));
    if (iequals(name, "chunked")) return {400, "parameters on the chunked transfer coding"};
    return {400, "chunked is not the final transfer coding"};
  }
  if (chunked_before) return {400, "chunked applied more than once"};
  if (other_before) return {501, "transfer coding not implemented"};
  return {};
}

/// uri-host [ ":" port ] (RFC 9110 §7.2), or empty. A comma (a list of hosts) is refused.
bool valid_host(std::string_view h) noexcept {
  if (h.empty()) return true;
  std::size_t i = 0;
  if (h[0] == '[') {
    auto close = h.find(']');
    if (close == std::string_view::npos || close == 1) return false;
    for (std::size_t k = 1; k < close; ++k) {
      unsigned char c = static_cast<unsigned char>(h[k]);
      if (!is_hex(c) && c != ':' && c != '.') return false;
    }
    i = close + 1;
  } else {
    for (; i < h.size() && h[i] != ':'; ++i) {
      unsigned char c = static_cast<unsigned char>(h[i]);
      if (is_alpha(c) || is_digit(c)) continue;
      switch (c) {
        case '-': case '.': case '_': case '~':                        // unreserved
        case '!': case '$': case '&': case '\'': case '(': case ')':   // sub-delims but ','
        case '*': case '+': case ';': case '=':
          continue;
        case '%':
          if (i + 2 < h.size() && is_hex(static_cast<unsigned char>(h[i + 1])) &&
              is_hex(static_cast<unsigned char>(h[i + 2]))) {
            i += 2;
            continue;
          }
          return false;
        default:
          return false;
      }
    }
    if (i == 0) return false;  // ":80"
  }
  if (i == h.size()) return true;
  if (h[i] != ':') return false;
  auto port = h.substr(i + 1);
  if (port.size() > 5) return false;
  for (unsigned char c : port)
    if (!is_digit(c)) return false;
  return true;
}

/// Whether a path segment is `.` or `..`, spelled plainly or with %2e (RFC 3986 §3.3, §6.2.2.2).
bool dot_segment(std::string_view seg) noexcept {
  std::size_t dots = 0;
  for (std::size_t i = 0; i < seg.size();) {
    if (seg[i] == '.') {
      ++dots;
      ++i;
    } else if (seg[i] == '%' && i + 2 < seg.size() && seg[i + 1] == '2' && lower(seg[i + 2]) == 'e') {
      ++dots;
      i += 3;
    } else {
      return false;
    }
  }
  return dots == 1 || dots == 2;
}

/// origin-form only, clean bytes, well-formed percent-encoding and no dot segments in the path
/// (hardening D3, D4, D6).
verdict check_target(std::string_view t) noexcept {
  if (t.empty() || t.front() != '/') return {400, "request-target is not in origin-form"};
  for (unsigned char c : t) {
    if (c <= 0x20 || c >= 0x7f) return {400, "invalid character in request-target"};
    if (c == '#') return {400, "fragment in request-target"};
  }
  auto path = t.substr(0, t.find('?'));
  for (std::size_t i = 0; i < path.size(); ++i) {
    if (path[i] != '%') continue;
    if (i + 2 >= path.size() || !is_hex(static_cast<unsigned char>(path[i + 1])) ||
        !is_hex(static_cast<unsigned char>(path[i + 2])))
      return {400, "malformed percent-encoding in path"};
  }
  std::size_t start = 1;
  for (;;) {
    auto slash = path.find('/', start);
    auto seg = path.substr(start, slash == std::string_view::npos ? std::string_view::npos : slash - start);
    if (dot_segment(seg)) return {400, "dot segment in path"};
    if (slash == std::string_view::npos) break;
    start = slash + 1;
  }
  return {};
}

/// True when `name` spells a framing, hop-by-hop or forwarding header with `_` for `-`
/// (Transfer_Encoding, Content_Length, X_Forwarded_For, ...). Backends that fold `_` into `-`
/// (CGI/WSGI-style servers) would read such a field as the real one: a Content_Length or
/// Transfer_Encoding twin frames the body differently from ingressd (smuggling), an
/// X_Forwarded_For twin stands beside the address ingressd writes. Other names with `_` stay
/// accepted (Ray's session header may be spelled `x_session_id`).
bool underscore_twin(std::string_view name) noexcept {
  static constexpr std::array<std::string_view, 8> dashed{
      "content-length", "transfer-encoding", "keep-alive", "proxy-connection", "http2-settings",
      "x-forwarded-for", "x-forwarded-proto", "x-request-id"};
  for (auto d : dashed) {
    if (d.size() != name.size()) continue;
    bool same = true;
    for (std::size_t i = 0; i < d.size() && same; ++i) {
      const char c = name[i] == '_' ? '-' : lower(name[i]);
      same = c == d[i];
    }
    if (same) return true;
  }
  return false;
}

}  // namespace

bool forwarded_method(std::string_view m) noexcept {
  // Ray's proxies forward every method (HAProxy in http mode, uvicorn): so does ingressd, but for
  // CONNECT, which asks for a tunnel ingressd does not make. Beast has checked it is a token.
  return !m.empty() && m != "CONNECT";
}

bool idempotent(bhttp::verb method) noexcept {
  switch (method) {
    case bhttp::verb::get:
    case bhttp::verb::head:
    case bhttp::verb::options:
    case bhttp::verb::trace:
    case bhttp::verb::put:
    case bhttp::verb::delete_:
      return true;
    default:
      return false;
  }
}

verdict check_request_head(std::string_view raw, const bhttp::request_header<>& req) noexcept {
  // Re-scan the raw head for what the parsed fields no longer show: obs-fold (Beast unfolds
  // it), repeated Content-Length / Transfer-Encoding / Host lines, the field count. Beast has
  // already refused most byte-level errors; checking them again costs little and keeps this
  // function correct on its own (the fuzz target feeds it directly).
  auto eol = raw.find('\n');
  if (eol == std::string_view::npos || eol == 0 || raw[eol - 1] != '\r') return {400, "malformed request line"};
  for (std::size_t i = 0; i + 1 < eol; ++i) {
    unsigned char c = static_cast<unsigned char>(raw[i]);
    if (c < 0x20 || c == 0x7f) return {400, "control character in request line"};
  }
  std::size_t pos = eol + 1;
  std::size_t fields = 0, cl_lines = 0, te_lines = 0, host_lines = 0;
  std::string_view cl_value, te_value, host_value;
  for (;;) {
    eol = raw.find('\n', pos);
    if (eol == std::string_view::npos) return {400, "malformed header section"};
    if (eol == pos || raw[eol - 1] != '\r') return {400, "bare LF in header section"};
    auto line = raw.substr(pos, eol - 1 - pos);
    pos = eol + 1;
    if (line.empty()) break;
    if (line.front() == ' ' || line.front() == '\t') return {400, "obs-fold in header section"};
    for (unsigned char c : line) {
      if (!(byte_class[c] & k_field))
        return c == '\r' ? verdict{400, "bare CR in header section"} : verdict{400, "control character in header field"};
    }
    auto colon = line.find(':');
    if (colon == std::string_view::npos || colon == 0) return {400, "malformed header field"};
    auto name = line.substr(0, colon);
    for (unsigned char c : name)
      if (!(byte_class[c] & k_tchar)) return {400, "invalid header field name"};
    auto value = trim_ows(line.substr(colon + 1));
    ++fields;
    if (name.find('_') != std::string_view::npos && underscore_twin(name))
      return {400, "underscore in the name of a framing, hop-by-hop or forwarding header"};
    if (iequals(name, "content-length")) {
      ++cl_lines;
      cl_value = value;
    } else if (iequals(name, "transfer-encoding")) {
      ++te_lines;
      te_value = value;
    } else if (iequals(name, "host")) {
      ++host_lines;
      host_value = value;
    }
  }
  if (pos != raw.size()) return {400, "malformed header section"};
  if (fields > max_header_fields) return {431, "too many header fields"};

  // Framing (hardening A1-A7).
  if (cl_lines > 1) return {400, "repeated Content-Length"};
  if (cl_lines == 1 && !all_digits(cl_value)) return {400, "invalid Content-Length"};
  verdict te_verdict;
  if (te_lines > 0) {
    if (te_lines > 1) return {400, "repeated Transfer-Encoding"};
    if (cl_lines > 0) return {400, "Content-Length with Transfer-Encoding"};
    if (req.version() < 11) return {400, "Transfer-Encoding in HTTP/1.0"};
    te_verdict = check_transfer_encoding(te_value);
    if (te_verdict.status == 400) return te_verdict;
  }

  // Host (hardening D5).
  if (host_lines > 1) return {400, "repeated Host"};
  if (host_lines == 0 && req.version() >= 11) return {400, "missing Host"};
  if (host_lines == 1 && !valid_host(host_value)) return {400, "invalid Host"};

  // Target (D3, D4, D6).
  if (auto v = check_target(req.target()); !v.ok()) return v;

  // Method (D1, D2) and codings we do not implement (A6).
  if (!forwarded_method(req.method_string())) return {501, "method not implemented"};
  return te_verdict;
}

unsigned status_for_head_error(const boost::system::error_code& ec, std::string_view consumed,
                               std::string_view pending, std::size_t header_limit) noexcept {
  namespace err = bhttp;
  if (ec == err::error::header_limit || ec == err::error::buffer_overflow) {
    // The request line alone does not fit: 414 (RFC 9112 §3, hardening B3); else 431 (B1).
    // Beast consumes the request line as soon as it is complete, before the fields arrive.
    if (consumed.find('\n') != std::string_view::npos) return 431;
    auto window = pending.substr(0, header_limit);
    return window.find('\n') == std::string_view::npos ? 414 : 431;
  }
  if (ec == err::error::body_limit) return 413;
  if (ec == err::error::bad_version) {
    // Beast says bad_version for any request line that does not end in " HTTP/1.x\r\n": a
    // space in the target or a bare LF is a syntax error (400); only a well-formed HTTP-version
    // of another number is an unsupported version (505, hardening D7).
    auto eol = pending.find('\n');
    if (eol == std::string_view::npos || eol == 0 || pending[eol - 1] != '\r') return 400;
    auto line = pending.substr(0, eol - 1);
    auto sp1 = line.find(' ');
    auto sp2 = line.rfind(' ');
    if (sp1 == std::string_view::npos || sp1 == sp2 || line.find(' ', sp1 + 1) != sp2) return 400;
    auto version = line.substr(sp2 + 1);
    if (version.size() < 8 || version.substr(0, 5) != "HTTP/") return 400;
    auto number = version.substr(5);
    auto dot = number.find('.');
    if (dot == std::string_view::npos || !all_digits(number.substr(0, dot)) || !all_digits(number.substr(dot + 1)))
      return 400;
    return 505;
  }
  return 400;
}

std::size_t leading_empty_lines(std::string_view pending) noexcept {
  std::size_t n = 0;
  while (n + 1 < pending.size() && pending[n] == '\r' && pending[n + 1] == '\n') n += 2;
  return n;
}

namespace {

/// Whether `text` holds a line end other than CRLF before `end`: an LF without its CR, or a CR
/// followed by something else than LF. A CR at the very end may still get its LF.
bool bare_line_end(std::string_view text, std::size_t end) noexcept {
  end = std::min(end, text.size());
  for (std::size_t i = 0; i < end; ++i) {
    if (text[i] == '\n') return true;  // every CRLF ends the scan before its LF
    if (text[i] == '\r' && i + 1 < text.size() && text[i + 1] != '\n') return true;
  }
  return false;
}

/// After a last chunk's line: trailer fields, then the empty line, all ended by CRLF. True when
/// a bare LF or CR stands in them: Beast waits for a CRLF CRLF that such a client never sends.
bool malformed_trailer_section(std::string_view rest) noexcept {
  for (;;) {
    const auto eol = rest.find("\r\n");
    if (bare_line_end(rest, eol)) return true;
    if (eol == 0 || eol == std::string_view::npos) return false;  // the end, or not there yet
    rest.remove_prefix(eol + 2);
  }
}

}  // namespace

bool malformed_chunk_line(std::string_view pending) noexcept {
  // The CRLF that ends the previous chunk's data comes first (Beast parses it with the header).
  if (pending.starts_with("\r\n")) pending.remove_prefix(2);
  const auto eol = pending.find("\r\n");
  // A line ended by LF alone (or with a stray CR) never gets the CRLF Beast waits for.
  if (bare_line_end(pending, eol)) return true;
  if (eol == std::string_view::npos) return false;  // not a whole line yet: incomplete, not bad
  const std::string_view line = pending.substr(0, eol);
  // The last chunk (size 0): Beast also waits for the trailer section's end.
  if (line.find_first_not_of('0') == line.find_first_of("; \t") && line.front() == '0' &&
      malformed_trailer_section(pending.substr(eol + 2)))
    return true;
  // chunk-size [ chunk-ext ], chunk-ext = *( BWS ";" BWS ext-name [ BWS "=" BWS ext-val ] )
  std::size_t i = 0;
  auto bws = [&] {
    while (i < line.size() && (line[i] == ' ' || line[i] == '\t')) ++i;
  };
  auto token = [&] {
    const auto start = i;
    while (i < line.size() && (byte_class[static_cast<unsigned char>(line[i])] & k_tchar)) ++i;
    return i > start;
  };
  while (i < line.size() && is_hex(static_cast<unsigned char>(line[i]))) ++i;
  if (i == 0) return true;
  for (;;) {
    bws();
    if (i == line.size()) return false;
    if (line[i] != ';') return true;
    ++i;
    bws();
    if (!token()) return true;
    bws();
    if (i == line.size() || line[i] == ';') continue;
    if (line[i] != '=') return true;
    ++i;
    bws();
    if (i < line.size() && line[i] == '"') {
      // quoted-string: qdtext or quoted-pair, and the closing quote on this line
      for (++i;; ++i) {
        if (i >= line.size()) return true;
        const auto c = static_cast<unsigned char>(line[i]);
        if (c == '"') break;
        if (c == '\\') {
          if (++i >= line.size()) return true;
          continue;
        }
        if ((c < 0x20 && c != '\t') || c == 0x7f) return true;
      }
      ++i;
    } else if (!token()) {
      return true;
    }
  }
}

head_verdict judge_head(const boost::system::error_code& ec, int skips, std::string_view raw, std::string_view pending,
                        std::size_t header_limit, const bhttp::request_header<>& req) noexcept {
  using kind = head_verdict::kind;
  // Empty lines before the request line are ignored (RFC 9112 §2.2, hardening D12), a few only.
  if (ec == bhttp::error::bad_method && skips < 8)
    if (const auto n = leading_empty_lines(pending); n > 0) return {kind::skip, n, 0, {}};
  if (ec) return {kind::refuse, 0, status_for_head_error(ec, raw, pending, header_limit), {}};
  if (const auto v = check_request_head(raw, req); !v.ok()) return {kind::refuse, 0, v.status, v.why};
  if (req.version() != 11 && req.version() != 10) return {kind::refuse, 0, 505, {}};
  if (req.target().empty() || req.target().front() != '/') return {kind::refuse, 0, 400, {}};
  return {};
}

verdict body_error_verdict(const boost::system::error_code& ec) noexcept {
  if (ec == bhttp::error::body_limit) return {413, {}};
  if (ec == bhttp::error::bad_chunk_extension) return {400, "malformed chunk extension"};
  return {400, {}};
}

evaluation evaluate_request(std::string_view bytes, std::size_t header_limit, std::uint64_t body_limit) {
  evaluation ev;
  boost::beast::flat_buffer buf;
  buf.commit(boost::asio::buffer_copy(buf.prepare(bytes.size()), boost::asio::buffer(bytes.data(), bytes.size())));
  std::optional<guarded_parser<true, bhttp::buffer_body>> parser;
  // Only guarded_parser stands between an over-long field and a length_error from the parser;
  // report one loudly.
  try {
    for (int skips = 0;; ++skips) {
      auto& p = parser.emplace();
      p.header_limit(static_cast<std::uint32_t>(header_limit));
      p.body_limit(body_limit);
      const std::string_view in = pending(buf);
      boost::system::error_code ec;
      const std::size_t used = p.put(boost::asio::buffer(in.data(), in.size()), ec);
      if (ec == bhttp::error::need_more) return ev;  // the head is not all there yet
      const auto v = judge_head(ec, skips, in.substr(0, used), in.substr(used), header_limit, p.get());
      if (v.what == head_verdict::kind::skip) {
        buf.consume(v.skip);
        continue;
      }
      ev.head_complete = !ec;
      if (v.what == head_verdict::kind::refuse) {
        ev.status = v.status;
        ev.why = v.why.empty() ? std::string_view("refused by the parser") : v.why;
        return ev;
      }
      buf.consume(used);
      break;
    }
    auto& p = *parser;
    std::array<char, 4096> window;
    while (!p.is_done()) {
      p.get().body().data = window.data();
      p.get().body().size = window.size();
      boost::system::error_code ec;
      if (!body_from_buffer(p, buf, header_limit, ec)) break;  // waits for more bytes
      if (ec && ec != bhttp::error::need_buffer) {
        const auto v = body_error_verdict(ec);
        ev.status = v.status;
        ev.why = v.why.empty() ? std::string_view("refused by the parser (body)") : v.why;
        return ev;
      }
    }
  } catch (const std::length_error&) {
    ev.status = 0xdead;
    ev.why = "parser threw length_error";
    return ev;
  }
  ev.complete = parser->is_done();
  ev.consumed = bytes.size() - buf.size();
  return ev;
}

}  // namespace ingressd::http
