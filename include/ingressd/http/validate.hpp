#pragma once
// Request head validation (hardening A, B, D, E; contract §4.4): what Boost 1.81's
// Beast parser accepts but ingressd refuses, and the status each refusal gets. Sans-I/O: the
// session reads the head with Beast (recording the raw bytes, see parse_guards.hpp), then asks
// check_request_head(); a refused request is answered with the returned status and the
// connection is closed, and nothing of it reaches a router or a replica.
//
// Policy (docs/hardening.md has the row-by-row table and what Beast already does itself):
//  - framing: one Content-Length line of 1*DIGIT only (a repeated CL is refused even when the
//    values agree); Transfer-Encoding only as one line whose value is exactly `chunked` (OWS and
//    case aside), never on HTTP/1.0, never together with CL. `gzip, chunked` and other unknown
//    codings before `chunked` get 501, anything where chunked is not the final coding gets 400;
//  - syntax: obs-fold, bare CR, control characters and NUL refused (400); more than
//    max_header_fields fields → 431;
//  - target: origin-form only (no `*`, absolute- or authority-form), no fragment, no space,
//    control or non-ASCII byte, well-formed %XX in the path, no `.`/`..` segment, plain or
//    percent-encoded (400);
//  - Host: exactly one on HTTP/1.1 (at most one on 1.0), a valid uri-host[:port] (400);
//  - methods: every method token is forwarded, as Ray's proxies do (TRACE, WebDAV verbs, unknown
//    and lowercase tokens included: methods are case-sensitive); CONNECT → 501;
//  - header names with `_` are accepted (Ray's session header may be spelled `x_session_id`).
#include <cstddef>
#include <cstdint>
#include <string_view>

#include <boost/beast/core/flat_buffer.hpp>
#include <boost/beast/http/error.hpp>
#include <boost/beast/http/fields.hpp>
#include <boost/beast/http/message.hpp>
#include <boost/system/error_code.hpp>

#include "ingressd/http/parse_guards.hpp"

namespace ingressd::http {

namespace bhttp = boost::beast::http;

/// A request with more header fields than this is refused with 431 (hardening B2).
inline constexpr std::size_t max_header_fields = 100;

/// The outcome of a check. `status` 0 means accepted; otherwise the status to answer with, and
/// the connection closes after it. `why` is a short static description for logs and bodies.
struct verdict {
  unsigned status = 0;
  std::string_view why;
  bool ok() const noexcept { return status == 0; }
};

/// Checks a request head that Beast parsed. `raw` holds the exact bytes of that head, from the
/// request line through the empty line (what Beast consumed); `req` is the parsed head.
verdict check_request_head(std::string_view raw, const bhttp::request_header<>& req) noexcept;

/// The status for a request head Beast refused with `ec`. `consumed` holds the bytes of the
/// head Beast had already consumed (its request line, once complete), `pending` the unparsed
/// bytes of the read buffer, `header_limit` the limit Beast was given:
/// header_limit → 414 when the request line alone does not fit, else 431; body_limit → 413;
/// bad_version → 505 for a well-formed `HTTP/x.y` token of another version, 400 otherwise
/// (bare LF, space in the target); everything else → 400.
unsigned status_for_head_error(const boost::system::error_code& ec, std::string_view consumed,
                               std::string_view pending, std::size_t header_limit) noexcept;

/// Bytes of empty lines (CRLF only) before a request line, which a server SHOULD ignore
/// (RFC 9112 §2.2, hardening D12); Beast refuses them as a bad method.
std::size_t leading_empty_lines(std::string_view pending) noexcept;

/// For a chunked body whose parser made no progress on `pending` (the bytes after the last
/// chunk's data): true when they hold a complete chunk-size line that is malformed, i.e. the
/// request is bad (400) rather than incomplete. Why: Beast looks for the closing quote of a
/// chunk extension's quoted-string past the end of the line, up to the end of the buffer, so
/// `3;a="b\r\n...` makes it wait for more bytes for ever; a quoted-string never spans a line
/// (RFC 9112 §7.1.1).
bool malformed_chunk_line(std::string_view pending) noexcept;

/// Whether ingressd forwards requests with this method (case-sensitive).
bool forwarded_method(std::string_view method) noexcept;

/// RFC 9110 §9.2.2: whether a request with this method has the same effect sent once or more
/// (GET, HEAD, OPTIONS, TRACE, PUT, DELETE), so that it may be sent again on a fresh connection.
bool idempotent(boost::beast::http::verb method) noexcept;

/// What to do with a request head once Beast's read of it has ended (`ec`; a client that went
/// away, a timeout and an HTTP/2 preface are the session's business before this). Decided
/// without I/O, in one place for the session (serve_one) and evaluate_request().
/// `skips`: leading empty lines skipped so far; `raw`: the bytes Beast consumed; `pending`: the
/// bytes after them; `req`: the parsed head (looked at only when `ec` is clear).
struct head_verdict {
  enum class kind : std::uint8_t { accept, skip, refuse };
  kind what = kind::accept;
  std::size_t skip = 0;  ///< kind::skip: empty-line bytes to drop before parsing again (D12)
  unsigned status = 0;   ///< kind::refuse: the status to answer with; the connection closes
  std::string_view why;  ///< a refusal of check_request_head(): said in the response body
};
head_verdict judge_head(const boost::system::error_code& ec, int skips, std::string_view raw, std::string_view pending,
                        std::size_t header_limit, const bhttp::request_header<>& req) noexcept;

/// One step of a request body from what `buf` already holds, without I/O: `parser`'s body window
/// (set by the caller) takes what it can. True when that settled the step: progress (`ec`
/// need_buffer when the window is full), the end, or an error in `ec`; false when more bytes
/// must be read. Beyond Beast: a whole chunk-size line Beast cannot decide is an error
/// (bad_chunk_extension, see malformed_chunk_line) instead of a wait for ever, and a buffer
/// past body_read_cap(header_limit) that made no progress overflows (hardening A8, A10, A11).
template <class Parser>
bool body_from_buffer(Parser& parser, boost::beast::flat_buffer& buf, std::size_t header_limit,
                      boost::system::error_code& ec) {
  ec = {};
  if (buf.size() == 0) return false;
  const std::size_t used = put_buffered(parser, buf, ec);
  if (ec != bhttp::error::need_more && (ec || used > 0 || parser.is_done())) return true;
  ec = {};
  if (used > 0) return true;
  if (parser.chunked() && malformed_chunk_line(pending(buf)))
    ec = bhttp::error::bad_chunk_extension;
  else if (buf.size() >= body_read_cap(header_limit))
    ec = bhttp::error::buffer_overflow;
  return static_cast<bool>(ec);
}

/// The status for a request body the parser refused with `ec` (not a timeout, not a client that
/// went away): 413 past client.max_body_bytes, else 400; `why` for the 400's body, or empty.
verdict body_error_verdict(const boost::system::error_code& ec) noexcept;

/// What the session would do with `bytes` arriving on a fresh connection, without any I/O: the
/// same parser, buffer and decisions as the session (judge_head, body_from_buffer,
/// body_error_verdict), only fed from `bytes` instead of a socket. For unit tests and fuzzing.
struct evaluation {
  unsigned status = 0;          ///< 0 = accepted (so far); else the refusal status
  bool head_complete = false;   ///< the head was complete (accepted or refused by our checks)
  bool complete = false;        ///< the whole request (head and body) was complete and accepted
  std::size_t consumed = 0;     ///< bytes used by the request (leading empty lines included)
  std::string_view why;
};
evaluation evaluate_request(std::string_view bytes, std::size_t header_limit = 64 * 1024,
                            std::uint64_t body_limit = 1024 * 1024);

}  // namespace ingressd::http
