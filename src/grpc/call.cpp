#include "ingressd/grpc/call.hpp"

#include <algorithm>

namespace ingressd::grpc {
namespace {
// nghttp2's codes (RFC 9113 §7), named here so that this file needs no nghttp2 header.
constexpr std::uint32_t h2_no_error = 0x0;
constexpr std::uint32_t h2_refused_stream = 0x7;
}  // namespace

bool call_state::request_head(bool end_stream, bool grpc_content) noexcept {
  started_ = true;
  grpc_content_ = grpc_content;
  request_ended_ = end_stream;
  if (!grpc_content) {
    status_ = static_cast<unsigned>(grpc::status::unimplemented);
    term_ = metrics::termination::error;
  }
  return grpc_content;
}

bool call_state::request_end() noexcept {
  if (request_ended_) return false;
  request_ended_ = true;
  return true;
}

void call_state::set_deadline(clock::time_point sent_after, clock::duration timeout) noexcept {
  reset_on_time_from_ = sent_after + timeout - std::max<clock::duration>(timeout / 10, std::chrono::milliseconds(5));
}

call_state::head_action call_state::response_head(bool informational, bool end_stream,
                                                  std::optional<unsigned> grpc_status) noexcept {
  // 1xx heads are informational; gRPC servers send none, and the client needs none. A head after
  // ingressd answered (a deadline, say) has nowhere to go.
  if (informational || response_started_) return head_action::ignore;
  response_started_ = true;
  if (!end_stream) return head_action::relay;
  response_ended_ = true;
  status_ = grpc_status;
  return head_action::relay_trailers_only;
}

void call_state::trailers_sent(std::optional<unsigned> grpc_status) noexcept {
  if (grpc_status) status_ = grpc_status;
}

call_state::fail_action call_state::fail(grpc::status st, reason why) noexcept {
  // A call whose whole answer is in hand (the replica's trailers too) keeps it.
  if (status_ || response_ended_) return fail_action::none;
  answer(st, why);
  response_ended_ = true;
  if (!response_started_) {
    response_started_ = true;
    return fail_action::trailers_only;
  }
  return fail_action::trailers_after_data;
}

call_state::upstream_end call_state::upstream_closed(std::uint32_t h2_error, bool connection_lost) noexcept {
  if (status_) return upstream_end::nothing;
  if (response_ended_ && h2_error == h2_no_error) return upstream_end::nothing;
  if (h2_error == h2_refused_stream && !response_started_) {
    // The replica did not process it: the client may retry it safely (gRPC clients do so
    // transparently for a refused stream).
    answer(grpc::status::unavailable, reason::upstream_error);
    return upstream_end::refuse;
  }
  return connection_lost ? upstream_end::lost : upstream_end::reset;
}

bool call_state::idle_expired(clock::time_point now, clock::time_point last_activity, clock::duration first_byte,
                              clock::duration idle) const noexcept {
  if (status_ || response_ended_) return false;
  const auto limit = !response_started_ && request_ended_ ? first_byte : idle;
  return now - last_activity >= limit;
}

bool call_state::counts_as_early_reset(std::uint32_t h2_error, clock::time_point now) const noexcept {
  // A client that resets most of its streams before their answer starts is flooding us (rapid
  // reset): each such stream cost a dispatch and an upstream stream. A reset when the call's own
  // deadline has (nearly) passed is a client giving up on time, as grpcio does for every call
  // whose deadline passes: not counted (issue #31: 1,500 calls with a 20 ms deadline tripped the
  // rule and cut unrelated calls). Such resets come at most one per stream per deadline, so the
  // streams a connection may hold bound them; the attack opens and resets at once.
  const bool on_time = reset_on_time_from_ && now >= *reset_on_time_from_;
  return h2_error != h2_no_error && !response_started_ && !on_time;
}

call_state::outcome call_state::closed(std::uint32_t h2_error, bool stopping) const noexcept {
  outcome o{};
  o.complete = h2_error == h2_no_error && response_ended_;
  if (!o.complete) {
    o.term = stopping ? metrics::termination::shutdown : term_.value_or(metrics::termination::client_abort);
    // The client reset the call before it got an answer: CANCELLED is what it saw.
    o.status = status_.value_or(static_cast<unsigned>(grpc::status::cancelled));
  } else {
    o.term = why_ == reason::upstream_timeout ? metrics::termination::timeout
             : why_                           ? metrics::termination::error
                                              : metrics::termination::ok;
    // A stream the replica ended with no grpc-status at all: UNKNOWN (gRPC's rule for a
    // response without one).
    o.status = status_.value_or(static_cast<unsigned>(grpc::status::unknown));
  }
  if (o.status >= status_count) o.status = static_cast<unsigned>(grpc::status::unknown);
  // HTTP status for the log: 200 once the response began; else 505 for an HTTP request refused
  // above, and 499 (nginx's and Ray's code for a client that went away) for a call cancelled
  // before any response: there was no HTTP status to log, and 0 read as a success to log filters.
  o.http_status = response_started_ ? 200 : http_request() ? 505 : 499;
  return o;
}

}  // namespace ingressd::grpc
