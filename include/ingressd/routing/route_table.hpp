#pragma once
// Longest-prefix route matching (contract §4.1), built once per topology snapshot.
#include <cstddef>
#include <optional>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

namespace ingressd::routing {

class route_table {
 public:
  route_table() = default;
  /// `prefixes[i]` is app i's normalised route prefix.
  explicit route_table(const std::vector<std::string>& prefixes);

  /// The index of the app whose prefix is the longest one that `path` equals or starts with
  /// followed by '/'. Prefix "/" matches every path. `path` excludes the query string.
  std::optional<std::size_t> match(std::string_view path) const noexcept;

 private:
  std::vector<std::pair<std::string, std::size_t>> by_length_;  // longest prefix first
};

/// Strips `root_path` ("" = nothing) from `path`. Returns nullopt when the path is not under it.
/// "/root" -> "/" ; "/root/x" -> "/x" ; "/rootx" -> nullopt.
std::optional<std::string_view> strip_root_path(std::string_view path, std::string_view root_path) noexcept;

/// The path part of a request target (before '?').
std::string_view path_of(std::string_view target) noexcept;

}  // namespace ingressd::routing
