#pragma once
// The life of one proxied gRPC call, without I/O (issue #31): which answer the client gets, when
// the call is over, and how it is counted. The proxy (src/proxy/grpc/) feeds it the events of the
// call's two HTTP/2 streams — the client's request head, its end, the replica's response head,
// its end, resets, a lost connection, the deadline, the idle timeout, the client stream's close —
// and does what each answer says (submit a response, reset a stream, queue trailers).
// Unit-tested transition by transition (tests/unit/grpc_call_test.cpp), as routing::router_memory.
//
// The rule it keeps: a client gets exactly one answer. It is the replica's (head, messages,
// trailers) unless ingressd fails the call first; once an answer is committed (a grpc-status is
// known, or the replica's stream ended cleanly), nothing later replaces it.
#include <chrono>
#include <cstdint>
#include <optional>

#include "ingressd/core/reason.hpp"
#include "ingressd/grpc/protocol.hpp"
#include "ingressd/metrics/access_log.hpp"

namespace ingressd::grpc {

class call_state {
 public:
  using clock = std::chrono::steady_clock;

  // --- The client's side ------------------------------------------------------------------

  /// The whole request head arrived. False: it is not a gRPC call (no application/grpc content
  /// type; an h2-only HTTP client): the caller refuses the stream with HTTP_1_1_REQUIRED, and the
  /// call is logged 505 with grpc-status UNIMPLEMENTED, not counted as a gRPC call.
  bool request_head(bool end_stream, bool grpc_content) noexcept;
  /// A request head arrived, and it was not a gRPC call.
  bool http_request() const noexcept { return started_ && !grpc_content_; }
  bool started() const noexcept { return started_; }
  /// Request bytes are kept for the replica; false once the call has its answer (the bytes are
  /// dropped and their window reopened, so that the client can finish sending).
  bool takes_request_data() const noexcept { return !status_ && !response_ended_; }
  /// The client ended its side. True the first time (the replica's stream must learn of it).
  bool request_end() noexcept;
  bool request_ended() const noexcept { return request_ended_; }

  /// The call's deadline (grpc-timeout) runs from `sent_after`, the earliest the client can have
  /// sent the head: a reset of the stream from a tenth of it (at least 5 ms) before then is the
  /// client giving up on time, not abuse (rapid reset, `counts_as_early_reset`).
  void set_deadline(clock::time_point sent_after, clock::duration timeout) noexcept;

  // --- The replica's side -----------------------------------------------------------------

  enum class head_action {
    ignore,             ///< a 1xx head, or the call already has its answer
    relay,              ///< send the head on to the client; messages follow
    relay_trailers_only ///< the head ended the stream (trailers-only): the whole answer
  };
  /// The replica's response head. `grpc_status`: its grpc-status, when it ended the stream.
  head_action response_head(bool informational, bool end_stream, std::optional<unsigned> grpc_status) noexcept;
  bool response_started() const noexcept { return response_started_; }
  /// The replica ended its stream (END_STREAM on DATA or trailers): nothing more is added.
  void response_end() noexcept { response_ended_ = true; }
  bool response_ended() const noexcept { return response_ended_; }
  /// The replica's trailers go to the client now (their grpc-status, if any, is the answer).
  void trailers_sent(std::optional<unsigned> grpc_status) noexcept;

  // --- Ends ---------------------------------------------------------------------------------

  enum class fail_action {
    none,                ///< the call already has its answer (or its client is gone): keep it
    trailers_only,       ///< nothing was sent: answer with a trailers-only response
    trailers_after_data  ///< the head went out: what the replica sent still goes, then trailers
  };
  /// ingressd fails the call with `st` for `why`.
  fail_action fail(grpc::status st, reason why) noexcept;

  enum class upstream_end {
    nothing,  ///< the answer is complete, or already decided
    refuse,   ///< refused before it was processed: REFUSED_STREAM to the client (retry is safe)
    lost,     ///< the connection to the replica was lost: fail UNAVAILABLE (and count it against
              ///< the replica when no response had begun: `counts_against_replica`)
    reset     ///< the replica reset the stream: fail with status_of_h2_error
  };
  /// The replica's stream closed with `h2_error` (`connection_lost`: its connection went away).
  upstream_end upstream_closed(std::uint32_t h2_error, bool connection_lost) noexcept;
  /// A lost connection is the replica's failure only while it owed the head.
  bool counts_against_replica() const noexcept { return !response_started_; }

  /// Has the call been idle too long? `last_activity`: the last bytes of the call either way;
  /// before the response head (with the request complete) `first_byte` applies, else `idle`
  /// (upstream.first_byte_timeout and upstream.idle_timeout, as for HTTP). Only calls on a
  /// replica's stream are asked.
  bool idle_expired(clock::time_point now, clock::time_point last_activity, clock::duration first_byte,
                    clock::duration idle) const noexcept;

  /// The client stream closed (`h2_error`: NO_ERROR, or how it was reset; `now`: when). Counts
  /// toward the rapid-reset rule: a reset before any response, not on time for its deadline.
  bool counts_as_early_reset(std::uint32_t h2_error, clock::time_point now) const noexcept;

  /// How the call ended, for metrics and the access log.
  struct outcome {
    bool complete;               ///< the whole answer reached the client's stream
    unsigned status;             ///< the grpc-status the client got (CANCELLED: it reset first)
    metrics::termination term;
    int http_status;             ///< for the access log: 200 / 505 / 499
  };
  /// When the client stream closed with `h2_error` (`stopping`: the daemon is shutting down).
  outcome closed(std::uint32_t h2_error, bool stopping) const noexcept;

  std::optional<unsigned> grpc_status() const noexcept { return status_; }
  std::optional<reason> why() const noexcept { return why_; }

 private:
  void answer(grpc::status st, reason why) noexcept {
    why_ = why;
    status_ = static_cast<unsigned>(st);
  }

  std::optional<unsigned> status_;  // the committed grpc-status
  std::optional<reason> why_;       // why ingressd answered (unset: the replica's answer)
  std::optional<metrics::termination> term_;
  std::optional<clock::time_point> reset_on_time_from_;
  bool started_ = false;
  bool grpc_content_ = false;
  bool request_ended_ = false;
  bool response_started_ = false;
  bool response_ended_ = false;
};

}  // namespace ingressd::grpc
