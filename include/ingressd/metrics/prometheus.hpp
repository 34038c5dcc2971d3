#pragma once
// Prometheus text exposition format 0.0.4: a writer that emits one metric family at a time
// (`# HELP`, `# TYPE`, then its samples), with label values escaped.
#include <cstdint>
#include <initializer_list>
#include <string>
#include <string_view>
#include <utility>

#include "ingressd/metrics/histogram.hpp"

namespace ingressd::metrics {

using label = std::pair<std::string_view, std::string_view>;

/// Escapes a label value: backslash, double quote and line feed (`\\`, `\"`, `\n`).
std::string escape_label_value(std::string_view v);
/// Escapes HELP text: backslash and line feed.
std::string escape_help(std::string_view v);
/// A sample value: integers as integers, others in shortest round-trip form, `+Inf`/`-Inf`/`NaN`.
std::string format_value(double v);

class text_writer {
 public:
  /// Starts a family: `# HELP name help` and `# TYPE name type` (counter, gauge, histogram).
  void family(std::string_view name, std::string_view help, std::string_view type);
  /// One sample line `name{labels} value`; labels with an empty name are skipped.
  void sample(std::string_view name, std::initializer_list<label> labels, std::uint64_t value);
  void sample(std::string_view name, std::initializer_list<label> labels, double value);
  /// The `_bucket{...,le="..."}` (cumulative), `_sum` (seconds) and `_count` lines of a histogram
  /// series of family `name`.
  /// `unit`: what one second is in the exposed unit (1000 for milliseconds: bounds and sum scaled).
  void histogram(std::string_view name, std::initializer_list<label> labels, const histogram_data& h,
                 double unit = 1.0);

  const std::string& str() const& { return out_; }
  std::string str() && { return std::move(out_); }

 private:
  void series(std::string_view name, std::string_view suffix, std::initializer_list<label> labels,
              std::string_view le = {});

  std::string out_;
};

}  // namespace ingressd::metrics
