// The sans-I/O parts of the gRPC ingress (include/ingressd/grpc/protocol.hpp).
#include "ingressd/grpc/protocol.hpp"

#include <gtest/gtest.h>

#include "ingressd/topology/snapshot.hpp"

using namespace std::chrono_literals;
using ingressd::grpc::status;

namespace grpc = ingressd::grpc;
namespace topology = ingressd::topology;

TEST(GrpcTimeout, UnitsAndLimits) {
  EXPECT_EQ(grpc::parse_timeout("1H"), std::chrono::nanoseconds(1h));
  EXPECT_EQ(grpc::parse_timeout("2M"), std::chrono::nanoseconds(2min));
  EXPECT_EQ(grpc::parse_timeout("5S"), std::chrono::nanoseconds(5s));
  EXPECT_EQ(grpc::parse_timeout("250m"), std::chrono::nanoseconds(250ms));
  EXPECT_EQ(grpc::parse_timeout("7u"), std::chrono::nanoseconds(7us));
  EXPECT_EQ(grpc::parse_timeout("99999999n"), std::chrono::nanoseconds(99999999));
  // 8 digits at most, a unit always, digits only.
  EXPECT_FALSE(grpc::parse_timeout("123456789S"));
  EXPECT_FALSE(grpc::parse_timeout("5"));
  EXPECT_FALSE(grpc::parse_timeout("S"));
  EXPECT_FALSE(grpc::parse_timeout("5s"));
  EXPECT_FALSE(grpc::parse_timeout("-5S"));
  EXPECT_FALSE(grpc::parse_timeout(""));
  // The largest value does not overflow.
  EXPECT_EQ(grpc::parse_timeout("99999999H"), std::chrono::nanoseconds::max());
}

TEST(GrpcStatus, OfHttp2ErrorFollowsTheGrpcSpec) {
  EXPECT_EQ(grpc::status_of_h2_error(0x0), status::internal);            // NO_ERROR before any status
  EXPECT_EQ(grpc::status_of_h2_error(0x1), status::internal);            // PROTOCOL_ERROR
  EXPECT_EQ(grpc::status_of_h2_error(0x2), status::internal);            // INTERNAL_ERROR
  EXPECT_EQ(grpc::status_of_h2_error(0x7), status::unavailable);         // REFUSED_STREAM
  EXPECT_EQ(grpc::status_of_h2_error(0x8), status::cancelled);           // CANCEL
  EXPECT_EQ(grpc::status_of_h2_error(0xb), status::resource_exhausted);  // ENHANCE_YOUR_CALM
  EXPECT_EQ(grpc::status_of_h2_error(0xc), status::permission_denied);   // INADEQUATE_SECURITY
}

TEST(GrpcStatus, Parse) {
  EXPECT_EQ(grpc::parse_status("0"), 0u);
  EXPECT_EQ(grpc::parse_status("16"), 16u);
  EXPECT_FALSE(grpc::parse_status("17"));
  EXPECT_FALSE(grpc::parse_status(""));
  EXPECT_FALSE(grpc::parse_status("1x"));
  EXPECT_FALSE(grpc::parse_status("-1"));
}

TEST(GrpcMessage, PercentEncodesOutsidePrintableAscii) {
  EXPECT_EQ(grpc::encode_message("no_route: app 'a'"), "no_route: app 'a'");
  EXPECT_EQ(grpc::encode_message("50% \xc3\xa9\n"), "50%25 %C3%A9%0A");
}

namespace {
std::shared_ptr<const topology::snapshot> snapshot_with(std::vector<std::string> names) {
  topology::document doc;
  for (auto& n : names) {
    topology::app a;
    a.name = n;
    doc.grpc_apps.push_back(a);
  }
  return topology::make_snapshot(std::move(doc), "127.0.0.2", "", 1);
}
}  // namespace

TEST(GrpcPickApp, ByApplicationMetadata) {
  auto s = snapshot_with({"a", "b"});
  EXPECT_EQ(grpc::pick_app(*s, "b"), 1u);
  EXPECT_EQ(grpc::pick_app(*s, "a"), 0u);
  EXPECT_FALSE(grpc::pick_app(*s, "c"));
  EXPECT_FALSE(grpc::pick_app(*s, std::nullopt));
  EXPECT_FALSE(grpc::pick_app(*s, ""));
}

TEST(GrpcPickApp, TheOnlyAppTakesEveryCall) {
  // Ray's template: with one gRPC app the metadata is not consulted.
  auto s = snapshot_with({"only"});
  EXPECT_EQ(grpc::pick_app(*s, std::nullopt), 0u);
  EXPECT_EQ(grpc::pick_app(*s, "other"), 0u);
  EXPECT_FALSE(grpc::pick_app(*snapshot_with({}), std::nullopt));
}

TEST(GrpcByteQueue, KeepsOrderAcrossCompaction) {
  grpc::byte_queue q;
  std::string in, out;
  for (int i = 0; i < 1000; ++i) {
    const std::string piece = std::to_string(i) + ",";
    in += piece;
    q.append(reinterpret_cast<const std::uint8_t*>(piece.data()), piece.size());
    std::uint8_t buf[3];
    const auto n = q.take(buf, sizeof buf);
    out.append(reinterpret_cast<const char*>(buf), n);
  }
  std::uint8_t buf[64];
  while (!q.empty()) {
    const auto n = q.take(buf, sizeof buf);
    out.append(reinterpret_cast<const char*>(buf), n);
  }
  EXPECT_EQ(out, in);
}

TEST(GrpcFrameBudget, CheapFramesAreBoundedByUsefulOnes) {
  grpc::frame_budget b;
  for (std::uint64_t i = 0; i < grpc::frame_budget::base; ++i) ASSERT_TRUE(b.cheap());
  EXPECT_FALSE(b.cheap());
  grpc::frame_budget busy;
  for (int i = 0; i < 100; ++i) busy.useful();
  for (std::uint64_t i = 0; i < grpc::frame_budget::base + 100 * grpc::frame_budget::per_useful; ++i)
    ASSERT_TRUE(busy.cheap());
  EXPECT_FALSE(busy.cheap());
}

TEST(GrpcFrameBudget, RapidResetNeedsAHundredAndAMajority) {
  grpc::frame_budget b;
  // 99 early resets out of 100 streams: not yet.
  for (int i = 1; i <= 99; ++i) ASSERT_TRUE(b.reset_early(100));
  // The 100th, and more than half of the 150 streams opened: a flood.
  EXPECT_FALSE(b.reset_early(150));
  grpc::frame_budget calm;
  // Many resets, but most streams completed: a client that cancels now and then.
  for (int i = 1; i <= 200; ++i) ASSERT_TRUE(calm.reset_early(1000));
}

namespace {

using bytes = std::vector<std::uint8_t>;

bytes frame(std::uint8_t type, std::uint32_t sid, const bytes& payload = {}) {
  // (Pushed byte by byte: GCC 12 warns, wrongly, about inserting after an initializer list.)
  bytes f;
  f.reserve(9 + payload.size());
  const std::size_t n = payload.size();
  for (int shift : {16, 8, 0}) f.push_back(static_cast<std::uint8_t>(n >> shift));
  f.push_back(type);
  f.push_back(0);
  for (int shift : {24, 16, 8, 0}) f.push_back(static_cast<std::uint8_t>(sid >> shift));
  for (auto b : payload) f.push_back(b);
  return f;
}
bytes headers(std::uint32_t sid) { return frame(0x1, sid, {0x82, 0x86, 0x84}); }
bytes rst(std::uint32_t sid) { return frame(0x3, sid, {0, 0, 0, 8}); }
bytes data(std::uint32_t sid, std::size_t n) { return frame(0x0, sid, bytes(n, 'x')); }
bytes cat(std::initializer_list<bytes> parts) {
  bytes out;
  for (const auto& p : parts) out.insert(out.end(), p.begin(), p.end());
  return out;
}
const bytes preface = [] {
  const std::string_view p = "PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n";
  return bytes(p.begin(), p.end());
}();

/// What the filter passes on for `in`, fed in pieces of `step` bytes.
bytes filtered(const bytes& in, std::size_t step, std::uint64_t* dropped = nullptr) {
  grpc::idle_reset_filter f;
  bytes out;
  for (std::size_t i = 0; i < in.size(); i += step) {
    const auto n = std::min(step, in.size() - i);
    const auto got = f.feed(std::span<const std::uint8_t>(in.data() + i, n));
    out.insert(out.end(), got.begin(), got.end());
  }
  if (dropped) *dropped = f.dropped();
  return out;
}

}  // namespace

TEST(GrpcIdleResetFilter, PassesEverythingOfStreamsThatWereOpened) {
  const auto in = cat({preface, frame(0x4, 0), headers(1), data(1, 40), rst(1), headers(3), rst(3), frame(0x6, 0,
                                                                                                            bytes(8, 0))});
  for (std::size_t step : {std::size_t{1}, std::size_t{2}, std::size_t{7}, std::size_t{9}, in.size()}) {
    std::uint64_t dropped = 1;
    EXPECT_EQ(filtered(in, step, &dropped), in) << "step " << step;
    EXPECT_EQ(dropped, 0u);
  }
}

TEST(GrpcIdleResetFilter, DropsResetsOfStreamsNeverOpenedAtEverySplit) {
  // grpc-core's pattern: a reset for stream 5 whose HEADERS never came, between streams it did open.
  const auto in = cat({preface, headers(1), headers(3), rst(5), rst(3), headers(7), rst(9), data(7, 20), rst(7)});
  const auto want = cat({preface, headers(1), headers(3), rst(3), headers(7), data(7, 20), rst(7)});
  for (std::size_t step = 1; step <= in.size(); ++step) {
    std::uint64_t dropped = 0;
    ASSERT_EQ(filtered(in, step, &dropped), want) << "step " << step;
    EXPECT_EQ(dropped, 2u);
  }
}

TEST(GrpcIdleResetFilter, LeavesWhatIsNotAClientStreamToNghttp2) {
  // An even stream id or stream 0 is the peer's error, not an idle client stream: nghttp2 decides.
  const auto in = cat({preface, rst(2), rst(0)});
  EXPECT_EQ(filtered(in, in.size()), in);
}

TEST(GrpcIdleResetFilter, AReadWithNothingToDropIsPassedOnWithoutACopy) {
  grpc::idle_reset_filter f;
  const auto first = cat({preface, headers(1), data(1, 100)});
  const auto got = f.feed(first);
  EXPECT_EQ(got.data(), first.data());
  EXPECT_EQ(got.size(), first.size());
  const auto second = cat({rst(3), rst(1)});  // 3 was never opened: this read is copied without it
  const auto filtered_second = f.feed(second);
  EXPECT_EQ(bytes(filtered_second.begin(), filtered_second.end()), rst(1));
}
