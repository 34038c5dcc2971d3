// Unit tests for the duration and size parsers/formatters (src/core/units.cpp).
#include "ingressd/core/units.hpp"

#include <gtest/gtest.h>

#include <cstdint>
#include <limits>
#include <string>
#include <vector>

namespace ingressd {
namespace {

using namespace std::chrono_literals;

TEST(UnitsDuration, ParsesEachUnit) {
  EXPECT_EQ(parse_duration("250ms"), duration{250});
  EXPECT_EQ(parse_duration("5s"), duration{5s});
  EXPECT_EQ(parse_duration("2m"), duration{2min});
  EXPECT_EQ(parse_duration("1h"), duration{1h});
  EXPECT_EQ(parse_duration("300s"), duration{300s});
  EXPECT_EQ(parse_duration("1ms"), duration{1});
}

TEST(UnitsDuration, ParsesZeroForms) {
  EXPECT_EQ(parse_duration("0"), duration::zero());
  EXPECT_EQ(parse_duration("0s"), duration::zero());
  EXPECT_EQ(parse_duration("0ms"), duration::zero());
  EXPECT_EQ(parse_duration("0h"), duration::zero());
}

TEST(UnitsDuration, AcceptsLeadingZeros) { EXPECT_EQ(parse_duration("007s"), duration{7s}); }

TEST(UnitsDuration, RejectsMissingUnit) {
  EXPECT_EQ(parse_duration("5"), std::nullopt);
  EXPECT_EQ(parse_duration("250"), std::nullopt);
}

TEST(UnitsDuration, RejectsNegativeAndSigned) {
  EXPECT_EQ(parse_duration("-5s"), std::nullopt);
  EXPECT_EQ(parse_duration("-0"), std::nullopt);
  EXPECT_EQ(parse_duration("+5s"), std::nullopt);
}

TEST(UnitsDuration, RejectsJunk) {
  for (const char* text : {"", "s", "ms", "5 s", " 5s", "5s ", "1.5s", ".5s", "5S", "5MS", "5sec", "5d",
                           "5us", "1h30m", "0x10s", "5s5", "five seconds", "5ss"}) {
    EXPECT_EQ(parse_duration(text), std::nullopt) << "'" << text << "'";
  }
}

TEST(UnitsDuration, RejectsOverflow) {
  // The digits alone overflow uint64.
  EXPECT_EQ(parse_duration("99999999999999999999999s"), std::nullopt);
  // Fits uint64 but not milliseconds once multiplied by the unit.
  EXPECT_EQ(parse_duration("18446744073709551615h"), std::nullopt);
  EXPECT_EQ(parse_duration("9223372036854775807ms"), std::nullopt);
}

TEST(UnitsDuration, MaxDurationIsTheBoundary) {
  const auto max_text = std::to_string(max_duration.count()) + "ms";
  EXPECT_EQ(parse_duration(max_text), max_duration);
  const auto over_text = std::to_string(max_duration.count() + 1) + "ms";
  EXPECT_EQ(parse_duration(over_text), std::nullopt);
  // Adding the longest duration to now() in nanoseconds must not overflow: that is why it exists.
  EXPECT_LE(std::chrono::duration_cast<std::chrono::nanoseconds>(max_duration).count(),
            std::numeric_limits<std::int64_t>::max() / 2);
}

TEST(UnitsDuration, FormatsWithTheLargestExactUnit) {
  EXPECT_EQ(format_duration(duration{250}), "250ms");
  EXPECT_EQ(format_duration(duration{5s}), "5s");
  EXPECT_EQ(format_duration(duration{2min}), "2m");
  EXPECT_EQ(format_duration(duration{1h}), "1h");
  EXPECT_EQ(format_duration(duration{90s}), "90s");
  EXPECT_EQ(format_duration(duration{1500}), "1500ms");
  EXPECT_EQ(format_duration(duration{300s}), "5m");
  EXPECT_EQ(format_duration(duration::zero()), "0s");
  EXPECT_EQ(format_duration(duration{-5000}), "-5s");
}

TEST(UnitsDuration, RoundTrips) {
  const std::vector<duration> values{duration::zero(), duration{1},    duration{250}, duration{999},
                                     duration{1s},     duration{61s},  duration{2min}, duration{3h},
                                     duration{600s},   duration{3601001}, max_duration};
  for (const auto d : values) {
    const auto text = format_duration(d);
    EXPECT_EQ(parse_duration(text), d) << text;
  }
}

TEST(UnitsSize, ParsesEachUnit) {
  EXPECT_EQ(parse_size("100"), 100u);
  EXPECT_EQ(parse_size("100B"), 100u);
  EXPECT_EQ(parse_size("256KiB"), 256u * 1024);
  EXPECT_EQ(parse_size("64MiB"), 64ull * 1024 * 1024);
  EXPECT_EQ(parse_size("2GiB"), 2ull * 1024 * 1024 * 1024);
  EXPECT_EQ(parse_size("1KB"), 1000u);
  EXPECT_EQ(parse_size("3MB"), 3'000'000u);
  EXPECT_EQ(parse_size("5GB"), 5'000'000'000ull);
  EXPECT_EQ(parse_size("0"), 0u);
  EXPECT_EQ(parse_size("0KiB"), 0u);
}

TEST(UnitsSize, RejectsJunk) {
  for (const char* text : {"", "-1", "+1", "1.5KiB", "1 KiB", " 1", "1 ", "1kib", "1kb", "1K", "1k",
                           "KiB", "B", "1TiB", "1TB", "1iB", "1KiBs", "0x10", "1e3"}) {
    EXPECT_EQ(parse_size(text), std::nullopt) << "'" << text << "'";
  }
}

TEST(UnitsSize, RejectsOverflow) {
  EXPECT_EQ(parse_size("18446744073709551615"), std::numeric_limits<std::uint64_t>::max());
  EXPECT_EQ(parse_size("18446744073709551616"), std::nullopt);
  EXPECT_EQ(parse_size("17179869184GiB"), std::nullopt);  // exactly 2^64
  EXPECT_EQ(parse_size("17179869183GiB"), 17179869183ull << 30);
  EXPECT_EQ(parse_size("18446744073709552KB"), std::nullopt);
}

TEST(UnitsSize, FormatsWithTheLargestExactUnit) {
  EXPECT_EQ(format_size(256 * 1024), "256KiB");
  EXPECT_EQ(format_size(64ull * 1024 * 1024), "64MiB");
  EXPECT_EQ(format_size(1ull << 30), "1GiB");
  EXPECT_EQ(format_size(1000), "1KB");
  EXPECT_EQ(format_size(3'000'000), "3MB");
  EXPECT_EQ(format_size(100), "100B");
  EXPECT_EQ(format_size(1536), "1536B");
  EXPECT_EQ(format_size(0), "0B");
}

TEST(UnitsSize, RoundTrips) {
  const std::vector<std::uint64_t> values{0,          1,         1023,        1024,
                                          1000,       1536,      262144,      64ull << 20,
                                          5ull << 30, 7'000'000'000ull, std::numeric_limits<std::uint64_t>::max()};
  for (const auto n : values) {
    const auto text = format_size(n);
    EXPECT_EQ(parse_size(text), n) << text;
  }
}

}  // namespace
}  // namespace ingressd
