#pragma once
// Two thin wrappers that close gaps in how Boost 1.81's Beast reads messages (hardening A10, A11,
// A14, B1; see docs/hardening.md):
//
//  - guarded_parser: Beast's `http::parser` stores each field in a `basic_fields` element whose
//    name and value lengths are 16-bit; a longer field makes `fields::insert` throw
//    `std::length_error` from inside the parser, i.e. from an I/O completion handler, which takes
//    the whole daemon down. The header limit keeps such fields out of a head only while it is
//    below 64 KiB, and nothing limits chunked *trailers* at all. This parser refuses an over-long
//    field with `error::header_limit` instead, and drops trailer fields instead of merging them
//    into the header section (they are parsed and bounded, never forwarded).
//
//  - bounded_buffer: a DynamicBuffer view of a `flat_buffer` whose max_size() is capped, so that
//    Beast stops reading (`error::buffer_overflow`) when the bytes it has not parsed yet exceed the
//    cap. Beast searches chunk-size lines and trailer sections without any limit, so without this
//    a client streaming an endless chunk extension or trailer grows the buffer without bound.
//    Optionally it records the bytes Beast consumes, which for `async_read_header` are exactly
//    the raw request head (start line through the empty line) — the bytes the validator
//    (validate.hpp) re-scans for what the parsed message no longer shows (obs-fold, repeated
//    fields).
#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <limits>
#include <string>
#include <string_view>

#include <boost/asio/buffer.hpp>
#include <boost/beast/core/flat_buffer.hpp>
#include <boost/beast/core/string.hpp>
#include <boost/beast/http/error.hpp>
#include <boost/beast/http/parser.hpp>

namespace ingressd::http {

/// The longest field name or value Beast's `basic_fields` can hold (16-bit lengths, +2 inside).
inline constexpr std::size_t max_field_bytes = std::numeric_limits<std::uint16_t>::max() - 2;

template <bool isRequest, class Body>
class guarded_parser : public boost::beast::http::parser<isRequest, Body> {
  using base = boost::beast::http::parser<isRequest, Body>;

 public:
  guarded_parser() = default;

 private:
  void on_field_impl(boost::beast::http::field name, boost::beast::string_view name_string,
                     boost::beast::string_view value, boost::beast::error_code& ec) override {
    if (name_string.size() > max_field_bytes || value.size() > max_field_bytes) {
      ec = boost::beast::http::error::header_limit;
      return;
    }
    // Trailer fields (after the last chunk) are bounded by the reading buffer's cap and then
    // dropped: they must never be merged into the header section (hardening A11).
    if (this->is_header_done()) return;
    this->get().insert(name, name_string, value);
  }
};

/// A response parser that keeps only the status and the body: the router's reply (contract
/// §4.2) needs nothing else, and storing each field in a `basic_fields` element cost an
/// allocation, a map insert and a free per field on every routed request. Framing fields
/// (Content-Length, Transfer-Encoding, Connection) are still interpreted by basic_parser itself;
/// over-long fields are refused as in guarded_parser; the body is bounded by body_limit().
class status_body_parser : public boost::beast::http::basic_parser<false> {
 public:
  unsigned status() const noexcept { return status_; }
  std::string& body() noexcept { return body_; }

 private:
  void on_request_impl(boost::beast::http::verb, boost::beast::string_view, boost::beast::string_view, int,
                       boost::beast::error_code&) override {}
  void on_response_impl(int code, boost::beast::string_view, int, boost::beast::error_code&) override {
    status_ = static_cast<unsigned>(code);
  }
  void on_field_impl(boost::beast::http::field, boost::beast::string_view name, boost::beast::string_view value,
                     boost::beast::error_code& ec) override {
    if (name.size() > max_field_bytes || value.size() > max_field_bytes) ec = boost::beast::http::error::header_limit;
  }
  void on_header_impl(boost::beast::error_code&) override {}
  void on_body_init_impl(const boost::optional<std::uint64_t>& length, boost::beast::error_code&) override {
    if (length) body_.reserve(static_cast<std::size_t>(*length));  // basic_parser checked it against body_limit
  }
  std::size_t on_body_impl(boost::beast::string_view piece, boost::beast::error_code&) override {
    body_.append(piece.data(), piece.size());
    return piece.size();
  }
  void on_chunk_header_impl(std::uint64_t, boost::beast::string_view, boost::beast::error_code&) override {}
  std::size_t on_chunk_body_impl(std::uint64_t, boost::beast::string_view piece, boost::beast::error_code&) override {
    body_.append(piece.data(), piece.size());
    return piece.size();
  }
  void on_finish_impl(boost::beast::error_code&) override {}

  unsigned status_ = 0;
  std::string body_;
};

/// DynamicBuffer (v1) over a flat_buffer with a capped max_size(), optionally recording the bytes
/// consumed from it. Lives only for the duration of one read call.
class bounded_buffer {
 public:
  using const_buffers_type = boost::beast::flat_buffer::const_buffers_type;
  using mutable_buffers_type = boost::beast::flat_buffer::mutable_buffers_type;

  /// `cap`: the most bytes the buffer may hold; `record`: when set, consumed bytes are appended.
  bounded_buffer(boost::beast::flat_buffer& b, std::size_t cap, std::string* record = nullptr) noexcept
      : b_(b), cap_(cap), record_(record) {}

  std::size_t size() const noexcept { return b_.size(); }
  /// Never below size(): bytes already buffered (e.g. pipelined) must not underflow Beast's
  /// `max_size() - size()`.
  std::size_t max_size() const noexcept { return std::max(cap_, b_.size()); }
  std::size_t capacity() const noexcept { return b_.capacity(); }
  const_buffers_type data() const noexcept { return b_.data(); }
  mutable_buffers_type prepare(std::size_t n) { return b_.prepare(n); }
  void commit(std::size_t n) noexcept { b_.commit(n); }
  void consume(std::size_t n) {
    if (record_ && n > 0) {
      auto d = b_.data();
      record_->append(static_cast<const char*>(d.data()), std::min(n, d.size()));
    }
    b_.consume(n);
  }

 private:
  boost::beast::flat_buffer& b_;
  std::size_t cap_;
  std::string* record_;
};

/// The cap for body reads: chunk-size lines and trailers get the header limit, but never less
/// than one 64 KiB read, so that a small header limit does not shrink body reads.
inline std::size_t body_read_cap(std::size_t header_limit) noexcept {
  return std::max<std::size_t>(header_limit, 64 * 1024);
}

/// Feeds `parser` what `b` (a flat_buffer or a bounded_buffer) already holds, one framing step
/// per put() (a chunk's size line, its data, ...), until the bytes run out, the parser is done,
/// stops making progress (`ec` = need_more) or fails (`ec`; need_buffer when its body window is
/// full). Returns the bytes consumed. For bytes already read, in place of Beast's async_read_some,
/// which would complete through the scheduler queue (see http/parse_now.hpp).
/// Not eager(): an eager parser makes that read wait for the next chunk's size line before it
/// completes with data it already has.
template <class Parser, class Buffer>
std::size_t put_buffered(Parser& parser, Buffer& b, boost::beast::error_code& ec) {
  std::size_t total = 0;
  ec = {};
  while (b.size() > 0 && !parser.is_done()) {
    const auto used = parser.put(b.data(), ec);
    b.consume(used);
    total += used;
    if (ec || used == 0) break;
  }
  return total;
}

/// The bytes of a flat_buffer that have not been consumed yet, as text.
inline std::string_view pending(const boost::beast::flat_buffer& b) noexcept {
  auto d = b.data();
  return {static_cast<const char*>(d.data()), d.size()};
}

}  // namespace ingressd::http
