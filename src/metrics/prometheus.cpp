#include "ingressd/metrics/prometheus.hpp"

#include <cmath>

#include <fmt/format.h>

namespace ingressd::metrics {

std::string escape_label_value(std::string_view v) {
  std::string out;
  out.reserve(v.size());
  for (char c : v) {
    switch (c) {
      case '\\': out += "\\\\"; break;
      case '"': out += "\\\""; break;
      case '\n': out += "\\n"; break;
      default: out += c;
    }
  }
  return out;
}

std::string escape_help(std::string_view v) {
  std::string out;
  out.reserve(v.size());
  for (char c : v) {
    switch (c) {
      case '\\': out += "\\\\"; break;
      case '\n': out += "\\n"; break;
      default: out += c;
    }
  }
  return out;
}

std::string format_value(double v) {
  if (std::isnan(v)) return "NaN";
  if (std::isinf(v)) return v > 0 ? "+Inf" : "-Inf";
  if (v == std::floor(v) && std::fabs(v) < 1e15) return fmt::format("{}", static_cast<long long>(v));
  return fmt::format("{}", v);
}

void text_writer::family(std::string_view name, std::string_view help, std::string_view type) {
  out_ += "# HELP ";
  out_ += name;
  out_ += ' ';
  out_ += escape_help(help);
  out_ += "\n# TYPE ";
  out_ += name;
  out_ += ' ';
  out_ += type;
  out_ += '\n';
}

void text_writer::series(std::string_view name, std::string_view suffix, std::initializer_list<label> labels,
                         std::string_view le) {
  out_ += name;
  out_ += suffix;
  bool first = true;
  auto put = [&](std::string_view k, std::string_view v) {
    out_ += first ? '{' : ',';
    first = false;
    out_ += k;
    out_ += "=\"";
    out_ += escape_label_value(v);
    out_ += '"';
  };
  for (const auto& [k, v] : labels)
    if (!k.empty()) put(k, v);
  if (!le.empty()) put("le", le);
  if (!first) out_ += '}';
  out_ += ' ';
}

void text_writer::sample(std::string_view name, std::initializer_list<label> labels, std::uint64_t value) {
  series(name, {}, labels);
  out_ += fmt::format("{}\n", value);
}

void text_writer::sample(std::string_view name, std::initializer_list<label> labels, double value) {
  series(name, {}, labels);
  out_ += format_value(value);
  out_ += '\n';
}

void text_writer::histogram(std::string_view name, std::initializer_list<label> labels, const histogram_data& h,
                            double unit) {
  std::uint64_t cumulative = 0;
  const std::size_t finite = h.layout ? h.layout->size : 0;
  for (std::size_t i = 0; i < finite; ++i) {
    cumulative += h.buckets[i];
    series(name, "_bucket", labels, format_value(h.layout->bound_seconds(i) * unit));
    out_ += fmt::format("{}\n", cumulative);
  }
  if (h.layout) cumulative += h.buckets[finite];
  series(name, "_bucket", labels, "+Inf");
  out_ += fmt::format("{}\n", cumulative);
  series(name, "_sum", labels);
  out_ += format_value(static_cast<double>(h.sum_ns) / 1e9 * unit);
  out_ += '\n';
  series(name, "_count", labels);
  out_ += fmt::format("{}\n", cumulative);
}

}  // namespace ingressd::metrics
