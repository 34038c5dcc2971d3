#include "ingressd/core/units.hpp"

#include <array>
#include <limits>

namespace ingressd {

namespace {

/// Splits "<digits><rest>" and parses the digits. Rejects an empty digit run (which also covers
/// signs, spaces and a leading '.') and values above uint64 max. `rest` is what follows.
std::optional<std::uint64_t> leading_number(std::string_view text, std::string_view& rest) {
  std::size_t i = 0;
  std::uint64_t value = 0;
  constexpr auto max = std::numeric_limits<std::uint64_t>::max();
  while (i < text.size() && text[i] >= '0' && text[i] <= '9') {
    const auto digit = static_cast<std::uint64_t>(text[i] - '0');
    if (value > (max - digit) / 10) return std::nullopt;
    value = value * 10 + digit;
    ++i;
  }
  if (i == 0) return std::nullopt;
  rest = text.substr(i);
  return value;
}

struct unit {
  std::string_view suffix;
  std::uint64_t factor;
};

// Formatting walks these in order and takes the first unit that divides evenly, so the larger
// units come first; parsing only needs an exact suffix match.
constexpr std::array<unit, 4> duration_units{{
    {"h", 3'600'000},
    {"m", 60'000},
    {"s", 1'000},
    {"ms", 1},
}};

// Binary units first: operators mostly think in KiB/MiB (the contract's defaults are binary),
// and a value that is both (e.g. 0) then prints in the form they expect.
constexpr std::array<unit, 6> size_units{{
    {"GiB", 1024ull * 1024 * 1024},
    {"MiB", 1024ull * 1024},
    {"KiB", 1024ull},
    {"GB", 1'000'000'000ull},
    {"MB", 1'000'000ull},
    {"KB", 1'000ull},
}};

}  // namespace

std::optional<duration> parse_duration(std::string_view text) {
  std::string_view rest;
  const auto number = leading_number(text, rest);
  if (!number) return std::nullopt;
  // A bare zero is unambiguous in any unit; every other number needs one so "5" is never
  // silently read as 5ms or 5s.
  if (rest.empty()) {
    if (*number == 0) return duration::zero();
    return std::nullopt;
  }
  for (const auto& u : duration_units) {
    if (rest != u.suffix) continue;
    const auto max_ms = static_cast<std::uint64_t>(max_duration.count());
    if (*number > max_ms / u.factor) return std::nullopt;
    return duration{static_cast<duration::rep>(*number * u.factor)};
  }
  return std::nullopt;
}

std::optional<std::uint64_t> parse_size(std::string_view text) {
  std::string_view rest;
  const auto number = leading_number(text, rest);
  if (!number) return std::nullopt;
  if (rest.empty() || rest == "B") return number;
  for (const auto& u : size_units) {
    if (rest != u.suffix) continue;
    if (*number > std::numeric_limits<std::uint64_t>::max() / u.factor) return std::nullopt;
    return *number * u.factor;
  }
  return std::nullopt;
}

std::string format_duration(duration d) {
  const auto count = d.count();
  if (count == 0) return "0s";
  // Negative durations never come out of parse_duration; print them readably anyway (logs).
  const bool negative = count < 0;
  // Widen before negating so duration::min() does not overflow.
  const std::uint64_t magnitude =
      negative ? static_cast<std::uint64_t>(-(count + 1)) + 1 : static_cast<std::uint64_t>(count);
  for (const auto& u : duration_units) {
    if (magnitude % u.factor == 0) {
      return (negative ? "-" : "") + std::to_string(magnitude / u.factor) + std::string{u.suffix};
    }
  }
  return {};  // unreachable: "ms" has factor 1
}

std::string format_size(std::uint64_t bytes) {
  if (bytes != 0) {
    for (const auto& u : size_units) {
      if (bytes % u.factor == 0) return std::to_string(bytes / u.factor) + std::string{u.suffix};
    }
  }
  return std::to_string(bytes) + "B";
}

}  // namespace ingressd
