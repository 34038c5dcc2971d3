#pragma once
// The sans-I/O parts of the gRPC ingress (issue #20): gRPC status codes and how failures map to
// them, the `grpc-timeout` header, `grpc-message` encoding, which app a call belongs to, the
// byte queues that carry a stream's bytes between its two HTTP/2 connections, the budget that
// ends a connection flooding us with frames that cost work but carry no request, and the screen a
// client's frames pass before nghttp2. Unit-tested without sockets
// (tests/unit/grpc_protocol_test.cpp); src/proxy/grpc/grpc_proxy.cpp does the I/O.
#include <chrono>
#include <cstddef>
#include <cstdint>
#include <cstring>
#include <array>
#include <optional>
#include <span>
#include <string>
#include <string_view>
#include <vector>

namespace ingressd::topology {
struct snapshot;
}

namespace ingressd::grpc {

/// gRPC status codes (grpc/doc/statuscodes.md) that ingressd generates or names.
enum class status : std::uint8_t {
  ok = 0,
  cancelled = 1,
  unknown = 2,
  deadline_exceeded = 4,
  not_found = 5,
  permission_denied = 7,
  resource_exhausted = 8,
  unimplemented = 12,
  internal = 13,
  unavailable = 14,
};
/// Codes 0..16 are defined; labels of ingressd_grpc_requests_total use them as numbers.
inline constexpr unsigned status_count = 17;

/// The status a client sees when the stream is reset with HTTP/2 error `code` before it got one
/// (grpc/doc/PROTOCOL-HTTP2.md "Errors"): REFUSED_STREAM is UNAVAILABLE (safe to retry), CANCEL
/// is CANCELLED, ENHANCE_YOUR_CALM is RESOURCE_EXHAUSTED, INADEQUATE_SECURITY is
/// PERMISSION_DENIED, and the rest (NO_ERROR, PROTOCOL_ERROR, INTERNAL_ERROR, ...) INTERNAL.
status status_of_h2_error(std::uint32_t code) noexcept;

/// `grpc-timeout` (PROTOCOL-HTTP2.md: 1-8 ASCII digits, then H M S m u n). Nullopt when malformed
/// (the header is then ignored, as gRPC servers do).
std::optional<std::chrono::nanoseconds> parse_timeout(std::string_view text) noexcept;

/// `grpc-message` value: percent-encodes bytes outside 0x20..0x7E and '%' (PROTOCOL-HTTP2.md).
std::string encode_message(std::string_view text);

/// Parses a `grpc-status` value ("0".."16"; anything else: nullopt).
std::optional<unsigned> parse_status(std::string_view text) noexcept;

/// Which gRPC app a call goes to. `application`: the call's `application` metadata (nullopt when
/// absent). Ray's rule (haproxy_templates.py gRPC frontend): with exactly one gRPC app every call
/// goes to it, whatever the metadata says; otherwise the metadata names the app. Nullopt: no app
/// (answered NOT_FOUND).
std::optional<std::size_t> pick_app(const topology::snapshot& snap, std::optional<std::string_view> application);

/// Serve's own API (ListApplications, Healthz): Ray sends it to the head node's Serve proxy
/// (fallback_targets.gRPC) rather than to an app.
inline bool is_serve_api(std::string_view path) { return path.starts_with("/ray.serve.RayServeAPIService/"); }

/// Bytes on their way from one HTTP/2 stream to another: appended as frames arrive, taken as the
/// other connection's frames are built. Bounded by the flow-control window of the stream they came
/// from (the bytes are only acknowledged once taken), so it never grows past 64 KiB-ish.
class byte_queue {
 public:
  void append(const std::uint8_t* p, std::size_t n) {
    if (off_ == buf_.size()) {
      buf_.clear();
      off_ = 0;
    } else if (off_ > 0 && off_ >= buf_.size() / 2) {
      buf_.erase(buf_.begin(), buf_.begin() + static_cast<std::ptrdiff_t>(off_));
      off_ = 0;
    }
    buf_.insert(buf_.end(), p, p + n);
  }
  /// Moves up to `n` bytes to `out`; returns how many.
  std::size_t take(std::uint8_t* out, std::size_t n) {
    n = std::min(n, size());
    if (n) std::memcpy(out, buf_.data() + off_, n);
    off_ += n;
    return n;
  }
  std::size_t size() const { return buf_.size() - off_; }
  bool empty() const { return size() == 0; }
  void clear() {
    buf_.clear();
    off_ = 0;
  }
  /// Gives the memory back (a finished stream keeps none).
  void release() {
    std::vector<std::uint8_t>().swap(buf_);
    off_ = 0;
  }

 private:
  std::vector<std::uint8_t> buf_;
  std::size_t off_ = 0;
};

/// Why a client connection was ended by us (label `reason` of
/// ingressd_grpc_connection_errors_total; the GOAWAY error code it got).
enum class conn_error : std::uint8_t {
  protocol,      ///< invalid preface or frames (PROTOCOL_ERROR, FRAME_SIZE_ERROR, ...)
  flow_control,  ///< window overflow (FLOW_CONTROL_ERROR)
  compression,   ///< bad HPACK (COMPRESSION_ERROR)
  flood,         ///< too many frames that carry no request (ENHANCE_YOUR_CALM)
  header_list,   ///< a header list past client.max_header_bytes (ENHANCE_YOUR_CALM)
  reset_flood,   ///< streams opened and reset by the client faster than allowed (ENHANCE_YOUR_CALM)
  timeout,       ///< no preface or no request within client.header_timeout
};
inline constexpr std::size_t conn_error_count = 7;
std::string_view to_string(conn_error e) noexcept;

/// Frame budget of one client connection: frames that make us work but carry no request data
/// (PING, SETTINGS, PRIORITY, WINDOW_UPDATE, RST_STREAM, empty DATA, CONTINUATION-free HEADERS
/// without a stream) may number at most `base` plus `per_useful` per useful frame (a request's
/// HEADERS or a DATA frame with payload received, a HEADERS or DATA frame sent). Legitimate
/// clients stay far below; a flood (CVE-2019-9512/9513/9514/9518 style) runs out and the
/// connection ends with GOAWAY ENHANCE_YOUR_CALM. Envoy bounds the same frames per data frame.
class frame_budget {
 public:
  static constexpr std::uint64_t base = 1000;
  static constexpr std::uint64_t per_useful = 10;
  void useful() noexcept { ++useful_; }
  /// False once the connection is over budget.
  bool cheap() noexcept { return ++cheap_ <= base + per_useful * useful_; }
  /// Streams the client reset before their response started (rapid reset, CVE-2023-44487): after
  /// 100 such streams, more than half of all streams reset is a flood (Envoy's premature reset
  /// rule).
  bool reset_early(std::uint64_t streams_opened) noexcept {
    ++early_resets_;
    return !(early_resets_ >= 100 && early_resets_ * 2 > streams_opened);
  }

 private:
  std::uint64_t cheap_ = 0;
  std::uint64_t useful_ = 0;
  std::uint64_t early_resets_ = 0;
};

/// Screens a client's frames before nghttp2 sees them: fed the client's bytes as they are read,
/// the connection preface first, it returns the bytes for nghttp2 (a frame header split across
/// reads is held until it is whole). Two jobs:
///
/// - Drops the RST_STREAM frames a client sends for a stream it never opened (an odd id above
///   every HEADERS it sent). grpc-core sends such resets under load (seen with 1,500 calls with a
///   20 ms deadline on one connection, issue #31: probably calls cancelled between getting their
///   stream id and their first write); RFC 9113 §6.4 makes one a connection error, which nghttp2
///   enforces ("RST_STREAM: stream in idle"), and every call of the connection failed. The stream
///   never existed, so the frame says nothing and nothing else changes.
/// - Stops a header block (a HEADERS frame and its CONTINUATION frames up to END_HEADERS) that
///   decodes to a header list over `max_header_bytes`, before nghttp2 reads the part that shows
///   it. nghttp2's HPACK decoder refuses a string over 64 KiB (NGHTTP2_HD_MAX_NV) with
///   COMPRESSION_ERROR as soon as it reads the string's length, before any header callback could
///   count it, so one oversized field would not end the connection as an oversized list does
///   (ENHANCE_YOUR_CALM, `header_list`), and the block's size is known too late: it must be
///   judged from its start. The screen walks the block's HPACK representations (RFC 7541 §6:
///   prefixes and string lengths; nothing is decoded, no table kept; padding and PRIORITY fields
///   skipped) and adds up the least the list can come to by RFC 9113 §6.5.2's count: 32 per
///   field, the length of each plain string, and 8 bits per 30 of a Huffman-coded one (the
///   longest code, RFC 7541 Appendix B). A Huffman-coded string over 64 KiB counts whole: nghttp2
///   refuses it anyway, and encoders Huffman-code a string only when that shortens it. Names and
///   values taken from a table count nothing here: such lists (HPACK bombs) are left to the count
///   of decoded fields. Once the sum passes the limit the screen stops before that byte (a
///   field's first byte, a string length's), and nothing more is passed. A frame over 16 KiB (the
///   SETTINGS_MAX_FRAME_SIZE ingressd keeps) is not walked: nghttp2 refuses it whole
///   (FRAME_SIZE_ERROR, RFC 9113 §4.2).
class frame_screen {
 public:
  struct result {
    /// `in` itself when nothing of it is dropped or held (the usual read: no copy), else a view
    /// of the screen's own buffer, valid until the next call. After an error: the bytes before
    /// the one that showed it.
    std::span<const std::uint8_t> bytes;
    /// `header_list`: a header block over the limit. From then on nothing more is passed.
    std::optional<conn_error> error;
  };
  /// `max_header_bytes`: the header list size the connection allows (client.max_header_bytes).
  result feed(std::span<const std::uint8_t> in, std::size_t max_header_bytes);
  /// Resets dropped so far.
  std::uint64_t dropped() const noexcept { return st_.dropped; }

  /// Frames longer than this are nghttp2's FRAME_SIZE_ERROR: not walked.
  static constexpr std::size_t max_frame_size = 16384;
  /// nghttp2 refuses a longer HPACK string (NGHTTP2_HD_MAX_NV).
  static constexpr std::uint64_t max_hpack_string = 65536;

 private:
  /// Where the walk through a header block's HPACK stands.
  struct hpack_walk {
    enum class at : std::uint8_t { field, integer, length, length_more, string } where = at::field;
    std::uint8_t strings = 0;  ///< strings still to come in this field (name, value)
    bool huffman = false;
    std::uint32_t shift = 0;   ///< of the next continuation byte of a string length
    std::uint64_t value = 0;   ///< the string length so far; then the string bytes left
    std::uint64_t least = 0;   ///< the least the list decodes to (RFC 9113 §6.5.2)
    bool lost = false;         ///< malformed: nghttp2 refuses it (COMPRESSION_ERROR)
  };
  struct state {
    std::size_t preface_left = 24;
    std::array<std::uint8_t, 9> head{};
    std::size_t head_have = 0;
    std::size_t payload_left = 0;
    bool dropping = false;
    std::uint32_t max_opened = 0;
    std::uint64_t dropped = 0;
    /// The stream whose header block goes on in a CONTINUATION; 0: none.
    std::uint32_t block_sid = 0;
    /// The payload being read belongs to a header block: first its Pad Length byte when
    /// `pad_pending`, then `front` bytes of PRIORITY fields, then `fragment` bytes of HPACK, then
    /// padding.
    bool walking = false;
    bool pad_pending = false;
    std::size_t front = 0;
    std::size_t fragment = 0;
    hpack_walk hpack;
    bool over = false;
  };
  /// Runs `in` through `st`; with `out`, appends what nghttp2 gets. False (without `out`) as soon
  /// as some byte of `in` would not go through unchanged.
  static bool scan(state& st, std::span<const std::uint8_t> in, std::size_t limit, std::vector<std::uint8_t>* out);
  /// Walks HPACK bytes of a block; returns how many it took: all, or fewer when the byte after
  /// them shows the list past `limit`.
  static std::size_t walk(hpack_walk& w, std::span<const std::uint8_t> in, std::size_t limit);
  state st_;
  std::vector<std::uint8_t> out_;
};

}  // namespace ingressd::grpc
