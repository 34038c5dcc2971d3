#pragma once
// The upstream response parser of the relay path (contract §4.4, hardening A2, A15, B6, F2).
//
// Beast's basic_parser still does all the reading and framing (status line, field syntax,
// Content-Length / chunked / close-delimited bodies, keep-alive). What changes is where the
// head goes: Beast's `http::parser` stores every field in a `basic_fields` element (an
// allocation, a red-black-tree insert, a copy) that the session then looked up again for the
// framing checks and the Connection header, walked to re-serialise, and freed — ~4,200
// instructions and five allocations per proxied response, 8 % of the router path. This parser
// writes the head for the client while it is parsed: the status line and every end-to-end field
// are appended to a caller-owned string, hop-by-hop fields are left out, and the framing that
// cannot be re-framed faithfully is noted. The body is copied into a caller-supplied window, as
// with Beast's buffer_body.
#include <cstddef>
#include <cstdint>
#include <string>
#include <string_view>

#include <boost/beast/http/basic_parser.hpp>
#include <boost/beast/http/field.hpp>

namespace ingressd::http {

namespace bhttp = boost::beast::http;

/// True for a field that is never forwarded across a hop: Connection, Keep-Alive,
/// Proxy-Connection, TE, Transfer-Encoding, Upgrade, HTTP2-Settings, and Content-Length (framing
/// ingressd redoes). `f` is Beast's enum for `name` (field::unknown for names it does not know).
bool always_hop_by_hop(bhttp::field f, std::string_view name) noexcept;

/// True when `name` is one of the comma-separated tokens of a Connection value (RFC 9110
/// §7.6.1: such fields are hop-by-hop for that message).
bool listed_in_connection(std::string_view connection, std::string_view name) noexcept;

class relay_response_parser : public bhttp::basic_parser<false> {
 public:
  /// The head is written to `head` when the status line is parsed (the string is cleared first):
  /// "HTTP/1.1 <status> <reason>\r\n", then "Name: value\r\n" for each end-to-end field; the
  /// caller adds its own framing fields and the empty line. Until then `head` is not touched.
  explicit relay_response_parser(std::string& head) noexcept : head_(head) {}

  unsigned status() const noexcept { return status_; }

  /// Empty when the framing can be re-framed faithfully; else why not (the session answers 502
  /// and discards the connection): a repeated Content-Length (Beast merges identical ones), one
  /// that is not 1*DIGIT, a repeated Transfer-Encoding, or one that is not exactly `chunked`
  /// (Beast reads any other coding as close-delimited, or de-chunks a `gzip, chunked` body that
  /// would then go out without its coding).
  std::string_view framing_error() const noexcept { return framing_error_; }

  /// What the Content-Type says the body is, for http::llm_meter.
  enum class media : std::uint8_t { other, event_stream, json };
  media media_type() const noexcept { return media_; }

  /// The response's Upgrade names `websocket` (RFC 6455 §4.2.2: a 101 that switches to it).
  bool upgrade_websocket() const noexcept { return upgrade_websocket_; }

  /// Where the next body bytes go; after a read, body_left() says how much of the window is
  /// unused. A read that fills the window stops with error::need_buffer.
  void body_window(void* data, std::size_t size) noexcept {
    body_ = static_cast<char*>(data);
    body_left_ = size;
  }
  std::size_t body_left() const noexcept { return body_left_; }

 private:
  void on_request_impl(bhttp::verb, boost::beast::string_view, boost::beast::string_view, int,
                       boost::beast::error_code&) override {}
  void on_response_impl(int code, boost::beast::string_view reason, int, boost::beast::error_code&) override;
  void on_field_impl(bhttp::field f, boost::beast::string_view name, boost::beast::string_view value,
                     boost::beast::error_code&) override;
  void on_header_impl(boost::beast::error_code&) override;
  void on_body_init_impl(const boost::optional<std::uint64_t>&, boost::beast::error_code&) override {}
  std::size_t on_body_impl(boost::beast::string_view piece, boost::beast::error_code& ec) override;
  void on_chunk_header_impl(std::uint64_t, boost::beast::string_view, boost::beast::error_code&) override {}
  std::size_t on_chunk_body_impl(std::uint64_t, boost::beast::string_view piece, boost::beast::error_code& ec) override {
    return on_body_impl(piece, ec);
  }
  void on_finish_impl(boost::beast::error_code&) override {}

  std::string& head_;
  std::string connection_;  // the Connection values seen, comma-joined (names listed are hop-by-hop)
  std::string_view framing_error_;
  unsigned status_ = 0;
  bool upgrade_websocket_ = false;
  media media_ = media::other;
  unsigned content_lengths_ = 0;
  unsigned transfer_encodings_ = 0;
  char* body_ = nullptr;
  std::size_t body_left_ = 0;
};

}  // namespace ingressd::http
