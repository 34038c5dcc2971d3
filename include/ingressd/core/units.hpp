#pragma once
// Parsing of the human units used in flags and config values: durations ("250ms", "5s", "1h")
// and byte sizes ("64KiB", "256KiB", "64MiB"). Errors are returned as messages, never thrown.
#include <chrono>
#include <cstdint>
#include <optional>
#include <string>
#include <string_view>

namespace ingressd {

using duration = std::chrono::milliseconds;

/// The longest duration parse_duration accepts: half the range of std::chrono::nanoseconds
/// (about 146 years). Timers add a duration to steady_clock::now() in nanoseconds, so anything
/// longer could overflow there; no real setting comes close.
inline constexpr duration max_duration{
    std::chrono::duration_cast<duration>(std::chrono::nanoseconds::max()) / 2};

/// Parses "<number><unit>" with unit in {ms, s, m, h}; a bare "0" is accepted as zero.
/// Returns nullopt on anything else (negative, missing unit, fractions, spaces, longer than
/// max_duration). Units are case-sensitive ("5S" is rejected).
std::optional<duration> parse_duration(std::string_view text);

/// Parses "<number>[unit]" with unit in {B, KiB, MiB, GiB, KB, MB, GB} (KB = 1000); no unit = bytes.
/// Returns nullopt on anything else (negative, fractions, spaces, unknown unit, > 2^64-1 bytes).
std::optional<std::uint64_t> parse_size(std::string_view text);

/// Formats a duration the way parse_duration reads it back ("250ms", "5s", "2m", "1h").
std::string format_duration(duration d);

/// Formats a size the way parse_size reads it back ("64KiB", "64MiB", "100B").
std::string format_size(std::uint64_t bytes);

}  // namespace ingressd
