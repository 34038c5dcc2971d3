#include "ingressd/routing/route_table.hpp"

#include <algorithm>

namespace ingressd::routing {

route_table::route_table(const std::vector<std::string>& prefixes) {
  by_length_.reserve(prefixes.size());
  for (std::size_t i = 0; i < prefixes.size(); ++i) by_length_.emplace_back(prefixes[i], i);
  // Longest first, so the first hit in match() is the longest matching prefix; stable so that
  // (already rejected) duplicates would still resolve to the earlier app.
  std::stable_sort(by_length_.begin(), by_length_.end(),
                   [](const auto& a, const auto& b) { return a.first.size() > b.first.size(); });
}

std::optional<std::size_t> route_table::match(std::string_view path) const noexcept {
  for (const auto& [prefix, index] : by_length_) {
    if (prefix == "/") return index;
    if (path.size() < prefix.size() || path.compare(0, prefix.size(), prefix) != 0) continue;
    // A segment boundary is required: "/api" serves "/api" and "/api/x" but not "/apix".
    if (path.size() == prefix.size() || path[prefix.size()] == '/') return index;
  }
  return std::nullopt;
}

std::optional<std::string_view> strip_root_path(std::string_view path,
                                                std::string_view root_path) noexcept {
  // Tolerate "/root/" and "/" as configured values; both mean the same as "/root" and "".
  while (!root_path.empty() && root_path.back() == '/') root_path.remove_suffix(1);
  if (root_path.empty()) return path;
  if (path.size() < root_path.size() || path.compare(0, root_path.size(), root_path) != 0)
    return std::nullopt;
  if (path.size() == root_path.size()) return std::string_view("/");
  if (path[root_path.size()] != '/') return std::nullopt;
  return path.substr(root_path.size());
}

std::string_view path_of(std::string_view target) noexcept {
  return target.substr(0, target.find('?'));
}

}  // namespace ingressd::routing
