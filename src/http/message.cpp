#include "ingressd/http/message.hpp"

#include <charconv>
#include <cstdint>

#include <boost/beast/http/status.hpp>

#include "ingressd/http/list.hpp"
#include "ingressd/http/relay_parser.hpp"

namespace ingressd::http {

hop_filter::hop_filter(const bhttp::fields& f) {
  auto it = f.find(bhttp::field::connection);
  if (it != f.end()) connection_ = it->value();
}

bool hop_filter::skip(bhttp::field f, std::string_view name) const noexcept {
  return always_hop_by_hop(f, name) || (!connection_.empty() && listed_in_connection(connection_, name));
}

bool websocket_upgrade(const bhttp::fields& f, bhttp::verb method, unsigned version) noexcept {
  if (method != bhttp::verb::get || version != 11) return false;
  bool upgrade = false, connection = false;
  for (const auto& field : f) {
    const std::string_view v{field.value().data(), field.value().size()};
    if (field.name() == bhttp::field::upgrade) upgrade = upgrade || list_contains(v, "websocket");
    else if (field.name() == bhttp::field::connection) connection = connection || list_contains(v, "upgrade");
  }
  return upgrade && connection;
}

void append_field(std::string& out, std::string_view name, std::string_view value) {
  out.append(name).append(": ").append(value).append("\r\n");
}

void insert_field(std::string& msg, std::string_view name, std::string_view value) {
  const auto eol = msg.find("\r\n");
  if (eol == std::string::npos) return;
  std::string line;
  line.reserve(name.size() + value.size() + 4);
  append_field(line, name, value);
  msg.insert(eol + 2, line);
}

void append_status_line(std::string& out, unsigned status, unsigned version,
                        std::string_view reason_phrase) {
  out.append(version == 10 ? "HTTP/1.0 " : "HTTP/1.1 ");
  char num[8];
  auto [end, ec] = std::to_chars(num, num + sizeof num, status);
  out.append(num, end);
  out.push_back(' ');
  if (reason_phrase.empty()) reason_phrase = bhttp::obsolete_reason(static_cast<bhttp::status>(status));
  out.append(reason_phrase).append("\r\n");
}

std::string make_response(unsigned status, std::string_view content_type, std::string_view body,
                          bool close, unsigned version, bool head_only,
                          std::string_view serve_reason) {
  std::string out;
  out.reserve(160 + body.size());
  append_status_line(out, status, version);
  if (!content_type.empty()) append_field(out, "Content-Type", content_type);
  if (!serve_reason.empty()) append_field(out, "X-Serve-Reason", serve_reason);
  append_field(out, "Content-Length", std::to_string(body.size()));
  if (close)
    append_field(out, "Connection", "close");
  else if (version == 10)
    append_field(out, "Connection", "keep-alive");
  out.append("\r\n");
  if (!head_only) out.append(body);
  return out;
}

std::string make_reason_response(reason r, bool close, unsigned version, bool head_only,
                                 std::string_view path, std::string_view detail) {
  std::string body;
  auto name = to_string(r);
  if (is_router_failure(r)) {
    body.append("Ingress request router failed: ").append(name);
  } else if (r == reason::no_route) {
    // Ray's text (ray-serve-ingress.md §2.2), so clients that match on it keep working.
    body.append("Path '").append(path).append("' not found. Ping http://.../-/routes for available routes.");
  } else {
    body.append(bhttp::obsolete_reason(static_cast<bhttp::status>(status_of(r))))
        .append(": ")
        .append(name);
  }
  if (!detail.empty()) body.append("; ").append(detail);
  return make_response(status_of(r), "text/plain", body, close, version, head_only, name);
}

std::size_t chunk_header(char* out, std::size_t n) noexcept {
  auto [end, ec] = std::to_chars(out, out + 16, n, 16);
  end[0] = '\r';
  end[1] = '\n';
  return static_cast<std::size_t>(end + 2 - out);
}

bool http2_preface(std::string_view bytes) noexcept { return bytes.starts_with("PRI * HTTP/2.0\r\n"); }

std::string http2_refusal(std::string_view why) {
  // Frames (RFC 9113 §4.1): 24-bit length, type, flags, 31-bit stream id; then the payload.
  auto frame = [](std::string& out, std::uint8_t type, std::string_view payload) {
    const auto n = static_cast<std::uint32_t>(payload.size());
    const char head[9] = {static_cast<char>(n >> 16), static_cast<char>(n >> 8), static_cast<char>(n),
                          static_cast<char>(type), 0, 0, 0, 0, 0};
    out.append(head, sizeof head).append(payload);
  };
  constexpr std::uint8_t settings = 0x4, goaway = 0x7;
  constexpr char http_1_1_required = 0xd;
  // GOAWAY: last stream id 0 (none was processed), the error code, the debug data.
  std::string payload{0, 0, 0, 0, 0, 0, 0, http_1_1_required};
  payload.append(why.substr(0, 1024));
  std::string out;
  frame(out, settings, {});
  frame(out, goaway, payload);
  return out;
}

void framed_piece::data(const void* p, std::size_t n) noexcept {
  if (n == 0) return;
  if (chunked_) add(size_line_.data(), chunk_header(size_line_.data(), n));
  add(p, n);
  if (chunked_) add("\r\n", 2);
}

void framed_piece::end() noexcept {
  if (chunked_) add("0\r\n\r\n", 5);
}

}  // namespace ingressd::http
