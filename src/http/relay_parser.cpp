#include "ingressd/http/relay_parser.hpp"

#include <algorithm>
#include <array>
#include <cstring>

#include <boost/beast/http/error.hpp>

#include "ingressd/core/text.hpp"
#include "ingressd/http/list.hpp"
#include "ingressd/http/message.hpp"

namespace ingressd::http {

bool always_hop_by_hop(bhttp::field f, std::string_view name) noexcept {
  // Beast has already mapped known names to an enum while parsing: a switch instead of eight
  // case-insensitive compares per field on the hot path.
  switch (f) {
    case bhttp::field::connection:
    case bhttp::field::keep_alive:
    case bhttp::field::proxy_connection:
    case bhttp::field::te:
    case bhttp::field::transfer_encoding:
    case bhttp::field::upgrade:
    case bhttp::field::content_length:
    case bhttp::field::http2_settings:
      return true;
    case bhttp::field::unknown:
      break;
    default:
      return false;
  }
  static constexpr std::array<std::string_view, 8> fixed{
      "connection", "keep-alive", "proxy-connection", "te", "transfer-encoding", "upgrade",
      "content-length", "http2-settings"};
  return std::any_of(fixed.begin(), fixed.end(), [&](std::string_view h) { return iequals(name, h); });
}

bool listed_in_connection(std::string_view connection, std::string_view name) noexcept {
  return list_contains(connection, name);
}

void relay_response_parser::on_response_impl(int code, boost::beast::string_view reason, int,
                                             boost::beast::error_code&) {
  status_ = static_cast<unsigned>(code);
  head_.clear();
  append_status_line(head_, status_, 11, {reason.data(), reason.size()});
}

void relay_response_parser::on_field_impl(bhttp::field f, boost::beast::string_view name,
                                          boost::beast::string_view value, boost::beast::error_code&) {
  // Trailer fields (after the last chunk) are bounded by the reading buffer's cap and dropped:
  // they are never merged into the header section (hardening A11).
  if (is_header_done()) return;
  const std::string_view n{name.data(), name.size()}, v{value.data(), value.size()};
  switch (f) {
    case bhttp::field::content_length:
      if (++content_lengths_ > 1) framing_error_ = "repeated Content-Length from upstream";
      else if (!all_digits(trim_ows(v))) framing_error_ = "invalid Content-Length from upstream";
      return;
    case bhttp::field::transfer_encoding:
      if (++transfer_encodings_ > 1) framing_error_ = "repeated Transfer-Encoding from upstream";
      else if (!iequals(trim_ows(v), "chunked")) framing_error_ = "unsupported Transfer-Encoding from upstream";
      return;
    case bhttp::field::connection:
      if (!connection_.empty()) connection_.push_back(',');
      connection_.append(v);
      return;
    case bhttp::field::content_type: {
      const auto t = trim_ows(v);
      auto is = [&](std::string_view type) {
        return t.size() >= type.size() && iequals(t.substr(0, type.size()), type) &&
               (t.size() == type.size() || t[type.size()] == ';' || t[type.size()] == ' ');
      };
      media_ = is("text/event-stream") ? media::event_stream : is("application/json") ? media::json : media::other;
      append_field(head_, n, v);
      return;
    }
    case bhttp::field::upgrade:
      // Hop-by-hop, so not written to the head: a 101 gets our own Upgrade line (exchange).
      upgrade_websocket_ = upgrade_websocket_ || list_contains(v, "websocket");
      return;
    case bhttp::field::unknown:
      // The session sends the request's own id to the client (contract §9): one X-Request-Id,
      // the one in the access log, whatever the replica echoes.
      if (iequals(n, "x-request-id")) return;
      [[fallthrough]];
    default:
      if (always_hop_by_hop(f, n)) return;
      append_field(head_, n, v);
  }
}

void relay_response_parser::on_header_impl(boost::beast::error_code&) {
  // A field named in Connection is hop-by-hop for this message, and Connection may come after
  // it: drop such lines from the head now. `close` and `keep-alive` (the usual values) name no
  // field that was forwarded (Keep-Alive is never forwarded), so the common case costs one scan
  // of a short value.
  bool names_fields = false;
  for (const auto token : list_elements(connection_)) {
    if (!iequals(token, "close") && !iequals(token, "keep-alive")) {
      names_fields = true;
      break;
    }
  }
  if (!names_fields) return;
  // Every line after the status line is "Name: value\r\n", written by append_field above.
  std::size_t out = head_.find('\n') + 1;
  for (std::size_t in = out; in < head_.size();) {
    const std::size_t end = head_.find('\n', in) + 1;
    const std::string_view line(head_.data() + in, end - in);
    if (!listed_in_connection(connection_, line.substr(0, line.find(':')))) {
      if (out != in) std::memmove(head_.data() + out, line.data(), line.size());
      out += line.size();
    }
    in = end;
  }
  head_.resize(out);
}

std::size_t relay_response_parser::on_body_impl(boost::beast::string_view piece, boost::beast::error_code& ec) {
  if (!body_) {
    ec = bhttp::error::need_buffer;
    return 0;
  }
  const std::size_t n = std::min(piece.size(), body_left_);
  std::memcpy(body_, piece.data(), n);
  body_ += n;
  body_left_ -= n;
  if (n < piece.size()) ec = bhttp::error::need_buffer;
  return n;
}

}  // namespace ingressd::http
