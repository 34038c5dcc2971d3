// grpc::call_state, transition by transition: what the client of a proxied gRPC call is answered,
// and how the call is counted, for each order of events the two streams can produce.
#include "ingressd/grpc/call.hpp"

#include <gtest/gtest.h>

namespace ingressd::grpc {
namespace {

using namespace std::chrono_literals;
using head = call_state::head_action;
using fail = call_state::fail_action;
using up = call_state::upstream_end;
using term = metrics::termination;

constexpr std::uint32_t no_error = 0x0, internal_error = 0x2, refused_stream = 0x7, cancel = 0x8;
constexpr unsigned ok = 0, cancelled = 1, unknown = 2, deadline = 4, unimplemented = 12, unavailable = 14;

/// A gRPC call whose request head (and, with `whole`, its end) arrived.
call_state dispatched(bool whole = true) {
  call_state c;
  EXPECT_TRUE(c.request_head(whole, true));
  return c;
}

TEST(GrpcCall, RequestHeadOfAnHttpClientIsRefusedAndLogged505) {
  call_state c;
  EXPECT_FALSE(c.request_head(true, false));
  EXPECT_TRUE(c.http_request());
  EXPECT_FALSE(c.takes_request_data());
  const auto o = c.closed(refused_stream, false);  // it was reset with HTTP_1_1_REQUIRED
  EXPECT_FALSE(o.complete);
  EXPECT_EQ(o.status, unimplemented);
  EXPECT_EQ(o.term, term::error);
  EXPECT_EQ(o.http_status, 505);
}

TEST(GrpcCall, RequestEndIsNewsOnlyOnce) {
  auto c = dispatched(false);
  EXPECT_FALSE(c.request_ended());
  EXPECT_TRUE(c.request_end());
  EXPECT_FALSE(c.request_end());
  EXPECT_TRUE(c.request_ended());
  EXPECT_TRUE(dispatched(true).request_ended());
}

TEST(GrpcCall, TheReplicasWholeAnswerIsTheCallsOutcome) {
  auto c = dispatched();
  EXPECT_EQ(c.response_head(false, false, std::nullopt), head::relay);
  EXPECT_TRUE(c.response_started());
  EXPECT_TRUE(c.takes_request_data());
  c.response_end();
  EXPECT_FALSE(c.takes_request_data());  // answered: what the client still sends is dropped
  c.trailers_sent(ok);
  EXPECT_EQ(c.upstream_closed(no_error, false), up::nothing);
  const auto o = c.closed(no_error, false);
  EXPECT_TRUE(o.complete);
  EXPECT_EQ(o.status, ok);
  EXPECT_EQ(o.term, term::ok);
  EXPECT_EQ(o.http_status, 200);
  EXPECT_FALSE(c.why());
}

TEST(GrpcCall, TrailersOnlyHeadCarriesTheStatus) {
  auto c = dispatched();
  EXPECT_EQ(c.response_head(false, true, 5u), head::relay_trailers_only);
  EXPECT_TRUE(c.response_ended());
  EXPECT_EQ(c.grpc_status(), 5u);
  // Nothing ingressd learns later replaces an answer in hand.
  EXPECT_EQ(c.fail(status::unavailable, reason::upstream_error), fail::none);
  EXPECT_EQ(c.closed(no_error, false).status, 5u);
}

TEST(GrpcCall, InformationalHeadsAreSkipped) {
  auto c = dispatched();
  EXPECT_EQ(c.response_head(true, false, std::nullopt), head::ignore);
  EXPECT_FALSE(c.response_started());
  EXPECT_EQ(c.response_head(false, false, std::nullopt), head::relay);
}

TEST(GrpcCall, AnswerWithoutGrpcStatusIsUnknown) {
  auto c = dispatched();
  c.response_head(false, false, std::nullopt);
  c.response_end();
  c.trailers_sent(std::nullopt);
  EXPECT_EQ(c.closed(no_error, false).status, unknown);
}

TEST(GrpcCall, FailureBeforeAnyResponseIsTrailersOnly) {
  auto c = dispatched();
  EXPECT_EQ(c.fail(status::unavailable, reason::no_healthy_replica), fail::trailers_only);
  EXPECT_TRUE(c.response_started());
  EXPECT_EQ(c.why(), reason::no_healthy_replica);
  // A replica head that comes after has nowhere to go; a second failure changes nothing.
  EXPECT_EQ(c.response_head(false, false, std::nullopt), head::ignore);
  EXPECT_EQ(c.fail(status::internal, reason::upstream_error), fail::none);
  const auto o = c.closed(no_error, false);
  EXPECT_TRUE(o.complete);
  EXPECT_EQ(o.status, unavailable);
  EXPECT_EQ(o.term, term::error);
}

TEST(GrpcCall, FailureMidStreamFollowsWhatWasRelayed) {
  auto c = dispatched();
  c.response_head(false, false, std::nullopt);
  EXPECT_EQ(c.fail(status::unavailable, reason::upstream_error), fail::trailers_after_data);
  EXPECT_TRUE(c.response_ended());
  c.trailers_sent(unavailable);
  EXPECT_EQ(c.closed(no_error, false).status, unavailable);
}

TEST(GrpcCall, ReplicaTrailersInHandAreKeptOverALaterFailure) {
  auto c = dispatched();
  c.response_head(false, false, std::nullopt);
  c.response_end();  // trailers queued behind bytes the client has not taken yet
  EXPECT_EQ(c.fail(status::deadline_exceeded, reason::upstream_timeout), fail::none);
  c.trailers_sent(ok);
  EXPECT_EQ(c.closed(no_error, false).status, ok);
}

TEST(GrpcCall, DeadlineIsATimeoutInTheLog) {
  auto c = dispatched();
  EXPECT_EQ(c.fail(status::deadline_exceeded, reason::upstream_timeout), fail::trailers_only);
  const auto o = c.closed(no_error, false);
  EXPECT_EQ(o.status, deadline);
  EXPECT_EQ(o.term, term::timeout);
}

TEST(GrpcCall, RefusedStreamBeforeAResponseIsRefusedOnward) {
  auto c = dispatched();
  EXPECT_EQ(c.upstream_closed(refused_stream, false), up::refuse);
  EXPECT_EQ(c.grpc_status(), unavailable);
  EXPECT_EQ(c.why(), reason::upstream_error);
  // Then the client's stream is reset: not complete, but its status is the refusal's.
  const auto o = c.closed(refused_stream, false);
  EXPECT_FALSE(o.complete);
  EXPECT_EQ(o.status, unavailable);
}

TEST(GrpcCall, RefusedStreamAfterTheHeadIsAReset) {
  auto c = dispatched();
  c.response_head(false, false, std::nullopt);
  EXPECT_EQ(c.upstream_closed(refused_stream, false), up::reset);
}

TEST(GrpcCall, LostConnectionCountsAgainstTheReplicaOnlyBeforeTheHead) {
  auto before = dispatched();
  EXPECT_EQ(before.upstream_closed(internal_error, true), up::lost);
  EXPECT_TRUE(before.counts_against_replica());
  auto after = dispatched();
  after.response_head(false, false, std::nullopt);
  EXPECT_EQ(after.upstream_closed(internal_error, true), up::lost);
  EXPECT_FALSE(after.counts_against_replica());
}

TEST(GrpcCall, UpstreamCloseAfterACleanEndOrAnAnswerIsNothing) {
  auto clean = dispatched();
  clean.response_head(false, false, std::nullopt);
  clean.response_end();
  EXPECT_EQ(clean.upstream_closed(no_error, false), up::nothing);
  auto answered = dispatched();
  answered.fail(status::unavailable, reason::upstream_error);
  EXPECT_EQ(answered.upstream_closed(internal_error, true), up::nothing);
  auto reset = dispatched();
  EXPECT_EQ(reset.upstream_closed(cancel, false), up::reset);
}

TEST(GrpcCall, ClientResetBeforeAnswerIsCancelled) {
  auto c = dispatched();
  const auto o = c.closed(cancel, false);
  EXPECT_FALSE(o.complete);
  EXPECT_EQ(o.status, cancelled);
  EXPECT_EQ(o.term, term::client_abort);
  EXPECT_EQ(o.http_status, 499);
  EXPECT_EQ(c.closed(cancel, true).term, term::shutdown);
}

TEST(GrpcCall, EarlyResetsAreThoseBeforeTheResponseAndBeforeTheDeadline) {
  const auto t0 = call_state::clock::time_point{} + 1h;
  auto c = dispatched();
  EXPECT_FALSE(c.counts_as_early_reset(no_error, t0));
  EXPECT_TRUE(c.counts_as_early_reset(cancel, t0));  // no deadline: every early reset counts
  c.set_deadline(t0, 20ms);                          // on time from 15 ms (5 ms floor over a tenth)
  EXPECT_TRUE(c.counts_as_early_reset(cancel, t0 + 14ms));
  EXPECT_FALSE(c.counts_as_early_reset(cancel, t0 + 15ms));
  auto long_call = dispatched();
  long_call.set_deadline(t0, 10s);  // a tenth: from 9 s
  EXPECT_TRUE(long_call.counts_as_early_reset(cancel, t0 + 8999ms));
  EXPECT_FALSE(long_call.counts_as_early_reset(cancel, t0 + 9s));
  long_call.response_head(false, false, std::nullopt);
  EXPECT_FALSE(long_call.counts_as_early_reset(cancel, t0));  // the answer had begun
}

TEST(GrpcCall, IdleTimeoutsFirstByteThenBetweenBytes) {
  const auto t0 = call_state::clock::time_point{} + 1h;
  auto c = dispatched(false);
  // The request is still streaming: the gap limit is the idle one.
  EXPECT_FALSE(c.idle_expired(t0 + 9s, t0, 5s, 10s));
  EXPECT_TRUE(c.idle_expired(t0 + 10s, t0, 5s, 10s));
  c.request_end();
  // Waiting for the head with the whole request sent: first_byte.
  EXPECT_TRUE(c.idle_expired(t0 + 5s, t0, 5s, 10s));
  c.response_head(false, false, std::nullopt);
  EXPECT_FALSE(c.idle_expired(t0 + 5s, t0, 5s, 10s));
  EXPECT_TRUE(c.idle_expired(t0 + 10s, t0, 5s, 10s));
  c.response_end();
  EXPECT_FALSE(c.idle_expired(t0 + 1h, t0, 5s, 10s));  // the answer is whole: nothing to wait for
}

}  // namespace
}  // namespace ingressd::grpc
