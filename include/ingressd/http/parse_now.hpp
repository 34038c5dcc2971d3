#pragma once
// A read that finishes at once when it can (core/socket_io.hpp's fill_now), parsed in place with
// a Beast parser: the request head that readiness brought, the router's or replica's reply after
// after_ready_handlers. Here rather than in core/, which knows no HTTP.
#include <cstddef>

#include <boost/beast/http/error.hpp>

#include "ingressd/core/socket_io.hpp"
#include "ingressd/http/parse_guards.hpp"

namespace ingressd {

/// Takes what the socket holds now (only when nothing is buffered yet; at most `cap` bytes
/// buffered) and parses it here. `whole`: the complete message, else its head only. True when
/// no read operation is needed: the part is parsed, or `ec` says why it cannot be; false when the
/// bytes are not all there (nothing yet, EOF or an error: the read operation that follows finds
/// and reports it). Used where the bytes are nearly always there: a request head that readiness
/// brought, a reply after after_ready_handlers. `drained` (when given) is set when the read took
/// everything the socket held: fewer bytes than asked for.
template <class Socket, class Buffer, class Parser>
bool parse_now(Socket& s, Buffer& buf, std::size_t cap, Parser& p, bool whole, error_code& ec,
               bool* drained = nullptr) {
  if (buf.size() == 0) {
    error_code ignored;  // the read operation that follows finds and reports it
    bool took_all = false;
    if (fill_now(s, buf, cap, ignored, &took_all) <= 0) return false;
    if (drained && took_all) *drained = true;
  }
  if (whole) {
    http::put_buffered(p, buf, ec);
  } else {
    buf.consume(p.put(buf.data(), ec));  // one step: the head, and nothing of the body yet
  }
  if (ec == boost::beast::http::error::need_more) ec = {};
  return ec || (whole ? p.is_done() : p.is_header_done());
}

}  // namespace ingressd
