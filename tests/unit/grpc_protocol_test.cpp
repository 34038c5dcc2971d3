// The sans-I/O parts of the gRPC ingress (include/ingressd/grpc/protocol.hpp).
#include "ingressd/grpc/protocol.hpp"

#include <gtest/gtest.h>

#include <algorithm>
#include <optional>

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

bytes frame(std::uint8_t type, std::uint32_t sid, const bytes& payload = {}, std::uint8_t flags = 0) {
  // (Pushed byte by byte: GCC 12 warns, wrongly, about inserting after an initializer list.)
  bytes f;
  f.reserve(9 + payload.size());
  const std::size_t n = payload.size();
  for (int shift : {16, 8, 0}) f.push_back(static_cast<std::uint8_t>(n >> shift));
  f.push_back(type);
  f.push_back(flags);
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

constexpr std::size_t no_limit = std::size_t{1} << 40;

/// What the screen passes on for `in`, fed in pieces of `step` bytes.
bytes filtered(const bytes& in, std::size_t step, std::uint64_t* dropped = nullptr) {
  grpc::frame_screen f;
  bytes out;
  for (std::size_t i = 0; i < in.size(); i += step) {
    const auto n = std::min(step, in.size() - i);
    const auto got = f.feed(std::span<const std::uint8_t>(in.data() + i, n), no_limit);
    EXPECT_FALSE(got.error);
    out.insert(out.end(), got.bytes.begin(), got.bytes.end());
  }
  if (dropped) *dropped = f.dropped();
  return out;
}

}  // namespace

TEST(GrpcFrameScreen, PassesEverythingOfStreamsThatWereOpened) {
  const auto in = cat({preface, frame(0x4, 0), headers(1), data(1, 40), rst(1), headers(3), rst(3), frame(0x6, 0,
                                                                                                            bytes(8, 0))});
  for (std::size_t step : {std::size_t{1}, std::size_t{2}, std::size_t{7}, std::size_t{9}, in.size()}) {
    std::uint64_t dropped = 1;
    EXPECT_EQ(filtered(in, step, &dropped), in) << "step " << step;
    EXPECT_EQ(dropped, 0u);
  }
}

TEST(GrpcFrameScreen, DropsResetsOfStreamsNeverOpenedAtEverySplit) {
  // grpc-core's pattern: a reset for stream 5 whose HEADERS never came, between streams it did open.
  const auto in = cat({preface, headers(1), headers(3), rst(5), rst(3), headers(7), rst(9), data(7, 20), rst(7)});
  const auto want = cat({preface, headers(1), headers(3), rst(3), headers(7), data(7, 20), rst(7)});
  for (std::size_t step = 1; step <= in.size(); ++step) {
    std::uint64_t dropped = 0;
    ASSERT_EQ(filtered(in, step, &dropped), want) << "step " << step;
    EXPECT_EQ(dropped, 2u);
  }
}

TEST(GrpcFrameScreen, LeavesWhatIsNotAClientStreamToNghttp2) {
  // An even stream id or stream 0 is the peer's error, not an idle client stream: nghttp2 decides.
  const auto in = cat({preface, rst(2), rst(0)});
  EXPECT_EQ(filtered(in, in.size()), in);
}

TEST(GrpcFrameScreen, AReadWithNothingToDropIsPassedOnWithoutACopy) {
  grpc::frame_screen f;
  const auto first = cat({preface, headers(1), data(1, 100)});
  const auto got = f.feed(first, no_limit).bytes;
  EXPECT_EQ(got.data(), first.data());
  EXPECT_EQ(got.size(), first.size());
  const auto second = cat({rst(3), rst(1)});  // 3 was never opened: this read is copied without it
  const auto filtered_second = f.feed(second, no_limit).bytes;
  EXPECT_EQ(bytes(filtered_second.begin(), filtered_second.end()), rst(1));
}

namespace {

constexpr std::uint8_t end_stream = 0x1, end_headers = 0x4, padded = 0x8, priority = 0x20;

/// An HPACK integer (RFC 7541 §5.1).
bytes hpack_int(std::uint64_t v, int prefix_bits, std::uint8_t flags) {
  const std::uint64_t max = (std::uint64_t{1} << prefix_bits) - 1;
  if (v < max) return {static_cast<std::uint8_t>(flags | v)};
  bytes out{static_cast<std::uint8_t>(flags | max)};
  for (v -= max; v >= 128; v >>= 7) out.push_back(static_cast<std::uint8_t>((v & 0x7f) | 0x80));
  out.push_back(static_cast<std::uint8_t>(v));
  return out;
}
/// An HPACK string of `n` bytes (their content does not matter to the screen).
bytes str(std::size_t n, bool huffman = false) {
  auto out = hpack_int(n, 7, huffman ? 0x80 : 0);
  out.insert(out.end(), n, 'v');
  return out;
}
/// A literal field without indexing, its name a string: RFC 9113 counts it `name + value + 32`.
bytes literal(std::size_t name, std::size_t value, bool huffman = false) {
  return cat({{0x00}, str(name), str(value, huffman)});
}
bytes headers_with(std::uint32_t sid, const bytes& hpack, std::uint8_t flags = end_headers) {
  return frame(0x1, sid, hpack, flags);
}
bytes continuation_with(std::uint32_t sid, const bytes& hpack, std::uint8_t flags = 0) {
  return frame(0x9, sid, hpack, flags);
}
/// HEADERS with `pad` bytes of padding and, with `prio`, PRIORITY fields; both would count if
/// they were taken for HPACK (padding is zeros: literal fields; the PRIORITY fields start 0x80,
/// an indexed field).
bytes padded_headers_with(std::uint32_t sid, const bytes& hpack, std::uint8_t pad, bool prio) {
  const auto payload = cat({bytes(1, pad), prio ? bytes{0x80, 0, 0, 3, 15} : bytes{}, hpack, bytes(pad, 0)});
  return frame(0x1, sid, payload, static_cast<std::uint8_t>(end_headers | padded | (prio ? priority : 0)));
}
bytes first(const bytes& b, std::size_t n) { return bytes(b.begin(), b.begin() + static_cast<std::ptrdiff_t>(n)); }

struct screened {
  bytes out;
  std::optional<grpc::conn_error> error;
  std::uint64_t dropped = 0;
};
/// `in` through one screen, fed in pieces of `step` bytes.
screened screen(const bytes& in, std::size_t limit, std::size_t step) {
  grpc::frame_screen f;
  screened r;
  for (std::size_t i = 0; i < in.size(); i += step) {
    const auto got = f.feed(std::span<const std::uint8_t>(in.data() + i, std::min(step, in.size() - i)), limit);
    if (r.error) {
      EXPECT_TRUE(got.bytes.empty()) << "bytes passed after the error";
    }
    r.out.insert(r.out.end(), got.bytes.begin(), got.bytes.end());
    if (got.error) r.error = got.error;
  }
  r.dropped = f.dropped();
  return r;
}
const std::size_t steps[] = {1, 2, 7, 9, 10, 100, 1 << 20};

}  // namespace

TEST(GrpcFrameScreen, ABlockAtTheLimitPassesWithoutACopy) {
  // 1000 bytes by RFC 9113's count: two literals of 333 (one split across frames in its value,
  // one in its length) and an indexed field and a literal of 334 - 32.
  const auto hpack = cat({literal(1, 300), literal(1, 300), {0x82}, literal(1, 269)});
  const auto in = cat({preface, headers_with(1, first(hpack, 200), 0),
                       continuation_with(1, bytes(hpack.begin() + 200, hpack.begin() + 310)),
                       continuation_with(1, bytes(hpack.begin() + 310, hpack.end()), end_headers), data(1, 50)});
  grpc::frame_screen f;
  const auto got = f.feed(in, 1000);
  EXPECT_FALSE(got.error);
  EXPECT_EQ(got.bytes.data(), in.data());
  EXPECT_EQ(got.bytes.size(), in.size());
  grpc::frame_screen tighter;
  EXPECT_EQ(tighter.feed(in, 999).error, grpc::conn_error::header_list);
}

TEST(GrpcFrameScreen, AStringLengthPastTheLimitStopsBeforeIt) {
  // A 1000-byte value under a limit of 1000 (its length bytes 7f e9 06), then a 90-byte one
  // under 100 (5a): nghttp2 gets the block up to the length's last byte, and nothing after.
  const auto before = cat({preface, headers_with(1, literal(1, 10)), data(1, 20)});
  for (const auto& [limit, value] : {std::pair<std::size_t, std::size_t>{1000, 1000}, {100, 90}}) {
    const auto field = literal(1, value);
    const auto block = headers_with(3, field);
    const std::size_t length_bytes = value < 127 ? 1 : 3;
    const auto in = cat({before, block, data(3, 20)});
    for (std::size_t step : steps) {
      const auto r = screen(in, limit, step);
      EXPECT_EQ(r.out, cat({before, first(block, 9 + 3 + length_bytes - 1)})) << "step " << step;
      EXPECT_EQ(r.error, grpc::conn_error::header_list) << "step " << step;
    }
  }
  // A length whose bytes so far are already past the limit (7f ff ff: 16510 and more to come):
  // nghttp2 would refuse such a part past 64 KiB.
  const auto partial = cat({preface, headers_with(1, bytes{0x00, 0x01, 'v', 0x7f, 0xff, 0xff, 0x00})});
  for (std::size_t step : steps) {
    const auto r = screen(partial, 1000, step);
    EXPECT_EQ(r.out, first(partial, partial.size() - 2)) << "step " << step;
    EXPECT_EQ(r.error, grpc::conn_error::header_list) << "step " << step;
  }
  // Nothing more passes once the connection is to end.
  grpc::frame_screen f;
  EXPECT_EQ(f.feed(cat({preface, headers_with(1, literal(1, 1000))}), 1000).error, grpc::conn_error::header_list);
  const auto got = f.feed(data(1, 10), 1000);
  EXPECT_TRUE(got.bytes.empty());
  EXPECT_EQ(got.error, grpc::conn_error::header_list);
}

TEST(GrpcFrameScreen, EachFieldCountsThirtyTwo) {
  // Indexed fields (one byte each): the 32nd passes a limit of 1000.
  const auto in = cat({preface, headers_with(1, bytes(40, 0x82))});
  const auto r = screen(in, 1000, in.size());
  EXPECT_EQ(r.out, first(in, preface.size() + 9 + 31));
  EXPECT_EQ(r.error, grpc::conn_error::header_list);
  // A table size update is no field.
  const auto updates = cat({preface, headers_with(1, cat({bytes(40, 0x20), bytes(31, 0x82)}))});
  EXPECT_FALSE(screen(updates, 1000, updates.size()).error);
}

TEST(GrpcFrameScreen, ContinuationsAddUpToTheBlock) {
  const auto at_limit = cat({preface, headers_with(1, literal(1, 300), 0), continuation_with(1, literal(1, 300)),
                             continuation_with(1, literal(1, 301), end_headers)});
  for (std::size_t step : steps) {
    const auto r = screen(at_limit, 1000, step);
    EXPECT_EQ(r.out, at_limit) << "step " << step;
    EXPECT_FALSE(r.error) << "step " << step;
  }
  const auto before = cat({preface, headers_with(1, literal(1, 300), 0), continuation_with(1, literal(1, 300))});
  const auto last = continuation_with(1, literal(1, 302), end_headers);
  const auto over = cat({before, last, data(1, 10)});
  for (std::size_t step : steps) {
    const auto r = screen(over, 1000, step);
    EXPECT_EQ(r.out, cat({before, first(last, 9 + 3 + 2)})) << "step " << step;  // (length 7f af 01)
    EXPECT_EQ(r.error, grpc::conn_error::header_list) << "step " << step;
  }
}

TEST(GrpcFrameScreen, PaddingAndPriorityFieldsAreNotHpack) {
  // 1000 bytes by RFC 9113's count beside a Pad Length byte, 5 bytes of PRIORITY and 255 of
  // padding.
  const auto hpack = literal(1, 967);
  const auto ok = cat({preface, padded_headers_with(1, hpack, 255, true), padded_headers_with(3, hpack, 0, false),
                       frame(0x1, 5, cat({{0x80, 0, 0, 3, 15}, hpack}), end_headers | priority)});
  for (std::size_t step : steps) {
    const auto r = screen(ok, 1000, step);
    EXPECT_EQ(r.out, ok) << "step " << step;
    EXPECT_FALSE(r.error) << "step " << step;
  }
  const auto over = padded_headers_with(1, literal(1, 968), 255, true);
  const auto r = screen(cat({preface, over}), 1000, 1);
  EXPECT_EQ(r.out, cat({preface, first(over, 9 + 1 + 5 + 3 + 2)}));
  EXPECT_EQ(r.error, grpc::conn_error::header_list);
}

TEST(GrpcFrameScreen, HuffmanStringsCountTheLeastTheyDecodeTo) {
  // 8 bits per 30 of code: 3630 bytes decode to 968 bytes at least, 3600 to 960.
  const auto fits = cat({preface, headers_with(1, literal(1, 3600, true))});
  EXPECT_FALSE(screen(fits, 1000, fits.size()).error);
  const auto over = cat({preface, headers_with(1, literal(1, 3630, true))});
  EXPECT_EQ(screen(over, 1000, over.size()).error, grpc::conn_error::header_list);
  // Past 64 KiB nghttp2 refuses the string anyway: it counts whole. (Its length alone comes.)
  const auto huge = cat({{0x00}, str(1), hpack_int(65537, 7, 0x80)});
  const auto in = cat({preface, headers_with(1, huge, 0)});
  const auto r = screen(in, 65536, in.size());
  EXPECT_EQ(r.out, first(in, in.size() - 1));
  EXPECT_EQ(r.error, grpc::conn_error::header_list);
  const auto refused_anyway = cat({preface, headers_with(1, cat({{0x00}, str(1), hpack_int(65537, 7, 0x80)}), 0)});
  EXPECT_FALSE(screen(refused_anyway, 1 << 20, refused_anyway.size()).error);
}

TEST(GrpcFrameScreen, TrailersAreABlockOfTheirOwn) {
  const auto in = cat({preface, headers_with(1, literal(1, 767)), data(1, 100),
                       headers_with(1, literal(1, 767), end_headers | end_stream), headers_with(3, literal(1, 500), 0),
                       continuation_with(3, literal(1, 434), end_headers)});
  const auto r = screen(in, 1000, in.size());
  EXPECT_EQ(r.out, in);
  EXPECT_FALSE(r.error);
}

TEST(GrpcFrameScreen, MeasuresAcrossReadsSplitAtEveryByte) {
  // With a reset to drop before the block, and frame headers and string lengths split every way.
  const auto head = cat({preface, headers(1), data(1, 5)});
  const auto block = cat({headers_with(3, literal(2, 100), 0), continuation_with(3, literal(3, 30))});
  const auto last = continuation_with(3, cat({{0x00}, str(4), hpack_int(133, 7, 0)}), end_headers);
  const auto over = cat({head, rst(5), block, last, data(3, 5)});
  const auto fits = cat({head, rst(5), block, continuation_with(3, literal(4, 132), end_headers), data(3, 5)});
  for (std::size_t step = 1; step <= over.size(); ++step) {
    // 134 + 65 + 36 + 133 = 368 > 367: the value's length (7f 06) is where it shows.
    const auto r = screen(over, 367, step);
    ASSERT_EQ(r.out, cat({head, block, first(last, 9 + 1 + 5 + 1)})) << "step " << step;
    EXPECT_EQ(r.error, grpc::conn_error::header_list) << "step " << step;
    EXPECT_EQ(r.dropped, 1u) << "step " << step;
    const auto ok = screen(fits, 367, step);
    ASSERT_EQ(ok.out, cat({head, block, continuation_with(3, literal(4, 132), end_headers), data(3, 5)}))
        << "step " << step;
    EXPECT_FALSE(ok.error) << "step " << step;
  }
}

TEST(GrpcFrameScreen, LeavesWhatNghttp2RefusesByItselfUnmeasured) {
  // A frame over the 16 KiB frame size (FRAME_SIZE_ERROR); HEADERS on an even stream, a
  // CONTINUATION after another frame or of another stream (PROTOCOL_ERROR); a string length of
  // more than 32 bits (COMPRESSION_ERROR): nghttp2 says why.
  const auto big = literal(1, 2000);
  for (const auto& frames : {headers_with(1, cat({big, bytes(grpc::frame_screen::max_frame_size, 0x82)})),
                             headers_with(2, big), cat({headers_with(1, literal(1, 10), 0), data(1, 10),
                                                        continuation_with(1, big, end_headers)}),
                             cat({headers_with(1, literal(1, 10), 0), continuation_with(3, big, end_headers)}),
                             headers_with(1, cat({{0x00, 0x7f, 0x80, 0x80, 0x80, 0x80, 0x80, 0x01}, big}))}) {
    const auto in = cat({preface, frames});
    const auto r = screen(in, 1024, in.size());
    EXPECT_EQ(r.out, in);
    EXPECT_FALSE(r.error);
  }
}
