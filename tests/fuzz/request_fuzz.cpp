// libFuzzer target: request bytes → Beast's parser (guarded_parser) → ingressd's validator
// (http/validate.hpp) → the head re-serialisation the session does (http/message.hpp helpers).
//
// Invariants (hardening §1.4 item 3):
//  - no crash, no sanitizer report, no exception out of the parser (guarded_parser);
//  - evaluate_request() and the step-by-step pipeline below agree;
//  - every refusal uses a status from the documented set;
//  - an accepted request, re-serialised as the session forwards it, parses again (and passes
//    the validator) to the same method, target and body.
#include <cstddef>
#include <cstdint>
#include <cstdlib>
#include <optional>
#include <string>
#include <string_view>

#include <boost/asio/buffer.hpp>
#include <boost/beast/http/empty_body.hpp>
#include <boost/beast/http/error.hpp>
#include <boost/beast/http/string_body.hpp>

#include "ingressd/http/message.hpp"
#include "ingressd/http/parse_guards.hpp"
#include "ingressd/http/relay_parser.hpp"
#include "ingressd/http/validate.hpp"

namespace {

namespace bhttp = boost::beast::http;
using namespace ingressd;

constexpr std::size_t header_limit = 8 * 1024;
constexpr std::uint64_t body_limit = 64 * 1024;

[[noreturn]] void fail(const char* what) {
  std::fprintf(stderr, "invariant violated: %s\n", what);
  std::abort();
}

bool documented_refusal(unsigned s) {
  switch (s) {
    case 400: case 413: case 414: case 431: case 501: case 505:
      return true;
    default:
      return false;
  }
}

using parser_t = http::guarded_parser<true, bhttp::string_body>;

struct parsed {
  unsigned status = 0;
  bool complete = false;
  std::optional<parser_t> p;
};

/// The session's pipeline, step by step: leading empty lines, head, check, body. (Beast's
/// parsers cannot be moved, hence the out-parameter.)
void parse(std::string_view bytes, std::size_t hlimit, bool check, parsed& out) {
  std::size_t off = 0;
  for (int attempt = 0;; ++attempt) {
    out.p.emplace();
    out.p->header_limit(static_cast<std::uint32_t>(hlimit));
    out.p->body_limit(body_limit);
    auto in = bytes.substr(off);
    boost::system::error_code ec;
    auto used = out.p->put(boost::asio::buffer(in.data(), in.size()), ec);
    if (ec == bhttp::error::need_more) return;
    if (ec == bhttp::error::bad_method && attempt < 8) {
      if (auto skip = http::leading_empty_lines(in); skip > 0) {
        off += skip;
        continue;
      }
    }
    if (ec) {
      out.status = http::status_for_head_error(ec, in.substr(0, used), in.substr(used), hlimit);
      return;
    }
    if (check) {
      auto v = http::check_request_head(in.substr(0, used), out.p->get());
      if (!v.ok()) {
        out.status = v.status;
        return;
      }
    }
    off += used;
    break;
  }
  out.p->eager(true);
  while (!out.p->is_done()) {
    auto in = bytes.substr(off);
    boost::system::error_code ec;
    auto used = out.p->put(boost::asio::buffer(in.data(), in.size()), ec);
    off += used;
    if (ec == bhttp::error::need_more) {
      if (out.p->chunked() && http::malformed_chunk_line(bytes.substr(off))) out.status = 400;
      break;
    }
    if (ec) {
      out.status = ec == bhttp::error::body_limit ? 413 : 400;
      return;
    }
    if (used == 0) break;
  }
  out.complete = out.p->is_done();
}

/// The request as session::proxy() forwards it: same method and target, hop-by-hop fields and
/// proxy-owned names removed, Host kept or added, our forwarding fields, our own framing.
std::string reserialise(const parser_t& p) {
  const auto& req = p.get();
  std::string out;
  out.append(req.method_string()).push_back(' ');
  out.append(req.target()).append(" HTTP/1.1\r\n");
  http::hop_filter hop(req);
  bool have_host = false;
  for (const auto& f : req) {
    auto name = f.name_string();
    if (hop.skip(f.name(), name)) continue;
    if (f.name() == bhttp::field::expect || f.name() == bhttp::field::proxy_authorization) continue;
    if (f.name() == bhttp::field::host) have_host = true;
    if (http::proxy_owned_field(name)) continue;
    if (!http::valid_field_value(f.value())) fail("an accepted field value cannot be forwarded");
    http::append_field(out, name, f.value());
  }
  if (!have_host) http::append_field(out, "Host", "127.0.0.1:8000");
  http::append_field(out, "X-Forwarded-For", "127.0.0.1");
  http::append_field(out, "X-Forwarded-Proto", "http");
  http::append_field(out, "X-Request-Id", "fuzz");
  const auto& body = req.body();
  if (p.chunked()) {
    http::append_field(out, "Transfer-Encoding", "chunked");
    out.append("\r\n");
    if (!body.empty()) {
      char hdr[18];
      out.append(hdr, http::chunk_header(hdr, body.size()));
      out.append(body).append("\r\n");
    }
    out.append("0\r\n\r\n");
  } else {
    if (p.content_length()) http::append_field(out, "Content-Length", std::to_string(body.size()));
    out.append("\r\n").append(body);
  }
  return out;
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t* data, std::size_t size) {
  const std::string_view bytes(reinterpret_cast<const char*>(data), size);

  auto ev = http::evaluate_request(bytes, header_limit, body_limit);
  parsed got;
  parse(bytes, header_limit, true, got);
  if (ev.status == 0xdead) fail("the parser threw");
  if (ev.status != got.status || ev.complete != got.complete) fail("evaluate_request disagrees with the pipeline");
  if (got.status != 0 && !documented_refusal(got.status)) fail("undocumented refusal status");

  // The same bytes as an upstream response head: no crash, a verdict of 0 or 502.
  {
    std::string head;
    http::relay_response_parser rp(head);
    char window[256];
    rp.body_window(window, sizeof window);
    boost::system::error_code ec;
    rp.put(boost::asio::buffer(bytes.data(), bytes.size()), ec);
    if (rp.is_header_done()) {
      // The head written for the client must be well-formed lines, none of them hop-by-hop.
      if (head.rfind("HTTP/1.1 ", 0) != 0) fail("relayed head without a status line");
      std::string_view rest(head);
      rest.remove_prefix(rest.find("\r\n") + 2);
      while (!rest.empty()) {
        auto eol = rest.find("\r\n");
        if (eol == std::string_view::npos) fail("relayed head line without CRLF");
        auto line = rest.substr(0, eol);
        auto colon = line.find(':');
        if (colon == std::string_view::npos || colon == 0) fail("relayed head line without a name");
        auto name = line.substr(0, colon);
        if (http::always_hop_by_hop(bhttp::string_to_field(name), name)) fail("a hop-by-hop field was relayed");
        rest.remove_prefix(eol + 2);
      }
    }
  }

  if (!got.complete) return 0;
  const auto& req = got.p->get();
  if (!http::forwarded_method(req.method_string())) fail("an unforwarded method was accepted");
  if (req.target().empty() || req.target().front() != '/') fail("a non-origin-form target was accepted");

  const std::string again = reserialise(*got.p);
  // Forwarding adds up to four fields, so the field cap may trip on the way back in; every
  // other check must pass.
  parsed re;
  parse(again, 1 << 20, false, re);
  if (re.status != 0 || !re.complete) fail("the forwarded request does not parse");
  auto head_end = again.find("\r\n\r\n");
  auto v = http::check_request_head(std::string_view(again).substr(0, head_end + 4), re.p->get());
  if (!v.ok() && v.status != 431) fail("the forwarded request fails validation");
  const auto& req2 = re.p->get();
  if (req2.method_string() != req.method_string()) fail("method changed");
  if (req2.target() != req.target()) fail("target changed");
  if (req2.body() != req.body()) fail("body changed");
  return 0;
}
