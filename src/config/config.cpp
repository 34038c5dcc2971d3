#include "ingressd/config/config.hpp"

#include <arpa/inet.h>
#include <netinet/in.h>

#include <algorithm>
#include <cctype>
#include <cerrno>
#include <charconv>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <functional>
#include <limits>
#include <map>
#include <sstream>
#include <thread>

#include <boost/program_options.hpp>
#include <yaml-cpp/yaml.h>

#include "ingressd/http/syntax.hpp"

namespace ingressd::config {

namespace {

namespace po = boost::program_options;

/// A problem with one value, phrased without the key ("expected ..., got 'x'"); the caller
/// prefixes the key or flag, and the file line where it has one.
using problem = std::optional<std::string>;

std::string in_quotes(std::string_view text) { return "'" + std::string{text} + "'"; }

// ---------------------------------------------------------------------------------------------
// Checks on single values, shared by the YAML loader, the flags and validate() so that a value
// is judged the same way wherever it comes from.

/// Visible ASCII only: these strings end up in request lines and log lines, where spaces and
/// control characters would break framing.
bool is_visible_ascii(std::string_view text) {
  return std::all_of(text.begin(), text.end(), [](char c) { return c > 0x20 && c < 0x7f; });
}

bool is_ipv4(const std::string& text) {
  in_addr addr{};
  return inet_pton(AF_INET, text.c_str(), &addr) == 1;
}

bool is_ipv6(const std::string& text) {
  in6_addr addr{};
  return inet_pton(AF_INET6, text.c_str(), &addr) == 1;
}

/// RFC 1123 host name, or an IPv4 literal. IPv6 literals are handled by the callers because
/// whether they need brackets depends on context.
bool is_host_name_or_ipv4(std::string_view text) {
  if (text.empty() || text.size() > 253) return false;
  // All digits and dots: it must be a real IPv4 address, so "999.1.1.1" is not taken for a name.
  if (text.find_first_not_of("0123456789.") == std::string_view::npos) {
    return is_ipv4(std::string{text});
  }
  std::size_t start = 0;
  while (true) {
    const auto dot = text.find('.', start);
    const auto label = text.substr(start, dot == std::string_view::npos ? text.npos : dot - start);
    if (label.empty() || label.size() > 63 || label.front() == '-' || label.back() == '-') {
      return false;
    }
    for (char c : label) {
      const bool ok = (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || (c >= '0' && c <= '9') ||
                      c == '-';
      if (!ok) return false;
    }
    if (dot == std::string_view::npos) return true;
    start = dot + 1;
  }
}

std::optional<std::uint16_t> parse_port(std::string_view text) {
  if (text.empty() || text.size() > 5) return std::nullopt;
  unsigned value = 0;
  for (char c : text) {
    if (c < '0' || c > '9') return std::nullopt;
    value = value * 10 + static_cast<unsigned>(c - '0');
  }
  if (value > 65535) return std::nullopt;
  return static_cast<std::uint16_t>(value);
}

constexpr std::string_view host_port_hint = "expected HOST:PORT like 0.0.0.0:8000 (IPv6 as [::1]:8000)";

problem check_http_url(std::string_view text) {
  const std::string example = "expected an http:// URL like http://10.0.0.1:8265, got " + in_quotes(text);
  auto lower = std::string{text.substr(0, 8)};
  std::transform(lower.begin(), lower.end(), lower.begin(),
                 [](unsigned char c) { return static_cast<char>(std::tolower(c)); });
  if (lower.starts_with("https://")) {
    return "https is not supported (ingressd talks plain HTTP to the topology source); use an "
           "http:// URL, got " + in_quotes(text);
  }
  if (!lower.starts_with("http://")) return example;
  const auto rest = text.substr(7);
  if (!is_visible_ascii(rest)) return example;
  const auto authority = rest.substr(0, rest.find_first_of("/?#"));
  if (authority.find('@') != std::string_view::npos) {
    return "credentials in the URL are not supported, got " + in_quotes(text);
  }
  if (parse_host_port(authority)) return std::nullopt;
  // No port: the host alone (port 80), an IPv6 literal only in brackets.
  if (authority.size() > 2 && authority.front() == '[' && authority.back() == ']' &&
      is_ipv6(std::string{authority.substr(1, authority.size() - 2)})) {
    return std::nullopt;
  }
  if (is_host_name_or_ipv4(authority)) return std::nullopt;
  return example;
}

problem check_ip(const std::string& text) {
  if (is_ipv4(text) || is_ipv6(text)) return std::nullopt;
  return "expected an IP address like 10.0.0.5, got " + in_quotes(text);
}

problem check_host(const std::string& text) {
  if (is_host_name_or_ipv4(text) || is_ipv6(text)) return std::nullopt;
  return "expected a host name or IP address like 127.0.0.1, got " + in_quotes(text);
}

problem check_root_path(const std::string& text) {
  if (text.empty()) return std::nullopt;
  // '?' and '#' would never match a request path; a trailing '/' would make "/api" miss
  // "/api" itself after stripping.
  if (text.front() != '/' || text.back() == '/' || !is_visible_ascii(text) ||
      text.find_first_of("?#") != std::string::npos) {
    return "must be \"\" or a path that starts with '/' and does not end with '/' (e.g. /api), got " +
           in_quotes(text);
  }
  return std::nullopt;
}

problem check_health_path(const std::string& text) {
  if (text.empty() || text.front() != '/' || !is_visible_ascii(text)) {
    return "expected a request path starting with '/' like /-/healthz, got " + in_quotes(text);
  }
  return std::nullopt;
}

problem check_session_header(const std::string& text) {
  if (text.empty()) return std::nullopt;
  if (!http::is_token(text)) return "expected a header name (or \"\" to disable), got " + in_quotes(text);
  return std::nullopt;
}

problem check_method(const std::string& text) {
  if (!http::is_token(text)) return "expected an HTTP method like POST, got " + in_quotes(text);
  // Methods are case-sensitive (RFC 9110 §9.1): "post" is a different, unknown method, so a
  // lowercase entry would silently never match.
  if (std::any_of(text.begin(), text.end(), [](char c) { return c >= 'a' && c <= 'z'; })) {
    auto upper = text;
    std::transform(upper.begin(), upper.end(), upper.begin(),
                   [](unsigned char c) { return static_cast<char>(std::toupper(c)); });
    return "methods are case-sensitive: got " + in_quotes(text) + ", did you mean " + in_quotes(upper) +
           "?";
  }
  return std::nullopt;
}

problem check_methods(const std::vector<std::string>& methods) {
  for (std::size_t i = 0; i < methods.size(); ++i) {
    if (auto p = check_method(methods[i])) return p;
    if (std::find(methods.begin(), methods.begin() + static_cast<std::ptrdiff_t>(i), methods[i]) !=
        methods.begin() + static_cast<std::ptrdiff_t>(i)) {
      return "method " + in_quotes(methods[i]) + " is listed twice";
    }
  }
  return std::nullopt;
}

problem check_access_log(const std::string& text) {
  if (text.empty()) return "expected a file path, - (stdout) or off, got ''";
  return std::nullopt;
}

problem check_tls_version(const std::string& v) {
  if (v == "1.2" || v == "1.3") return std::nullopt;
  return "expected \"1.2\" or \"1.3\", got " + in_quotes(v);
}

problem check_not_empty(const std::string& v) {
  if (v.empty()) return std::string{"must not be empty"};
  return std::nullopt;
}

problem check_host_port(const host_port& hp) {
  if (hp.host.find(':') != std::string::npos ? is_ipv6(hp.host) : is_host_name_or_ipv4(hp.host)) {
    return std::nullopt;
  }
  return std::string{host_port_hint} + ", got host " + in_quotes(hp.host);
}

std::optional<log_level> parse_log_level(std::string_view text) {
  if (text == "trace") return log_level::trace;
  if (text == "debug") return log_level::debug;
  if (text == "info") return log_level::info;
  if (text == "warn") return log_level::warn;
  if (text == "error") return log_level::error;
  return std::nullopt;
}

std::string_view to_string(log_level level) {
  switch (level) {
    case log_level::trace: return "trace";
    case log_level::debug: return "debug";
    case log_level::info: return "info";
    case log_level::warn: return "warn";
    case log_level::error: return "error";
  }
  return "info";
}

/// More worker threads than this is a typo, not a machine: each one owns a listener socket and
/// per-replica connection pools.
constexpr unsigned max_threads = 1024;
/// Spinning longer than this between events only burns CPU: a VM's wake-up costs tens of µs.
constexpr unsigned max_busy_poll_us = 10000;
// RFC 9113 leaves it open; beyond this a client's streams cost more memory than a connection is
// worth (each holds up to a flow-control window of buffered bytes).
constexpr unsigned max_grpc_streams = 10000;
// Connections per replica per worker: past this a replica is better served by fewer, fuller ones.
constexpr unsigned max_grpc_upstream_connections = 1000;
/// The header limit ends up in Beast's parser, which takes a 32-bit value; 1 GiB is far above any
/// sane header block and well inside that.
constexpr std::uint64_t max_header_bytes_limit = 1024ull * 1024 * 1024;
constexpr std::uint64_t min_header_bytes = 1024;

enum class zero { forbidden, allowed };

problem check_duration(duration d, zero z) {
  if (d < duration::zero()) return "must not be negative";
  if (z == zero::forbidden && d == duration::zero()) return "must be greater than 0";
  return std::nullopt;
}

problem check_count(unsigned value, unsigned min, unsigned max) {
  if (value < min) return "must be at least " + std::to_string(min) + ", got " + std::to_string(value);
  if (value > max) return "must be at most " + std::to_string(max) + ", got " + std::to_string(value);
  return std::nullopt;
}

problem check_size(std::uint64_t value, std::uint64_t min, std::uint64_t max) {
  if (value < min) return "must be at least " + format_size(min) + ", got " + format_size(value);
  if (value > max) return "must be at most " + format_size(max) + ", got " + format_size(value);
  return std::nullopt;
}

// ---------------------------------------------------------------------------------------------
// The settings table: one entry per YAML key, each with a setter from text. Flags reuse the
// setters of their keys, so a flag and its key accept exactly the same values.

using setter = std::function<problem(config&, const std::string&)>;

template <class Get>
setter duration_setter(Get get, zero z) {
  return [get, z](config& c, const std::string& v) -> problem {
    const auto d = parse_duration(v);
    if (!d) return "expected a duration like 250ms or 5s, got " + in_quotes(v);
    if (auto p = check_duration(*d, z)) return p;
    get(c) = *d;
    return std::nullopt;
  };
}

template <class Get>
setter size_setter(Get get, std::uint64_t min, std::uint64_t max) {
  return [get, min, max](config& c, const std::string& v) -> problem {
    const auto n = parse_size(v);
    if (!n) return "expected a size like 256KiB, 64MiB or 1000 (bytes), got " + in_quotes(v);
    if (auto p = check_size(*n, min, max)) return p;
    get(c) = *n;
    return std::nullopt;
  };
}

template <class Get>
setter count_setter(Get get, unsigned min, unsigned max) {
  return [get, min, max](config& c, const std::string& v) -> problem {
    // Digits only: no sign, no hex, no "1e3", so "-1" cannot wrap around to a huge count.
    if (v.empty() || v.find_first_not_of("0123456789") != std::string::npos) {
      return "expected a whole number, got " + in_quotes(v);
    }
    // 19 digits always fit in unsigned long long; longer is out of range for any count.
    const auto n = v.size() > 19 ? std::numeric_limits<unsigned long long>::max() : std::stoull(v);
    if (n > std::numeric_limits<unsigned>::max()) {
      return "must be at most " + std::to_string(max) + ", got " + v;
    }
    if (auto p = check_count(static_cast<unsigned>(n), min, max)) return p;
    get(c) = static_cast<unsigned>(n);
    return std::nullopt;
  };
}

template <class Get>
setter bool_setter(Get get) {
  return [get](config& c, const std::string& v) -> problem {
    // YAML 1.2 booleans only; "yes"/"on" are YAML 1.1 and read differently by other tools.
    if (v == "true") get(c) = true;
    else if (v == "false") get(c) = false;
    else return "expected true or false, got " + in_quotes(v);
    return std::nullopt;
  };
}

template <class Get, class Check>
setter string_setter(Get get, Check check) {
  return [get, check](config& c, const std::string& v) -> problem {
    if (auto p = check(v)) return p;
    get(c) = v;
    return std::nullopt;
  };
}

/// A string key where "" means "not set".
template <class Get, class Check>
setter optional_string_setter(Get get, Check check) {
  return [get, check](config& c, const std::string& v) -> problem {
    if (!v.empty()) {
      if (auto p = check(v)) return p;
    }
    get(c) = v;
    return std::nullopt;
  };
}

template <class Get>
setter host_port_setter(Get get) {
  return [get](config& c, const std::string& v) -> problem {
    auto hp = parse_host_port(v);
    if (!hp) return std::string{host_port_hint} + ", got " + in_quotes(v);
    get(c) = std::move(*hp);
    return std::nullopt;
  };
}

/// For list keys: the whole list (a YAML sequence, or a repeated flag).
using list_setter = std::function<problem(config&, const std::vector<std::string>&)>;

struct key_spec {
  std::string_view key;  ///< dotted YAML key, e.g. "router.timeout"
  setter set;            ///< for scalar keys
  bool is_list = false;  ///< a YAML sequence: router.methods (handled by the loader), or set_list's
  list_setter set_list = nullptr;
};

problem set_trusted_proxies(config& c, const std::vector<std::string>& items) {
  std::vector<net::cidr> nets;
  for (const auto& item : items) {
    auto n = net::cidr::parse(item);
    if (!n) return "expected an address or a CIDR like 10.0.0.0/8 or fd00::/8, got " + in_quotes(item);
    nets.push_back(*n);
  }
  c.client.trusted_proxies = std::move(nets);
  return std::nullopt;
}

const std::vector<key_spec>& key_table() {
  static const std::vector<key_spec> table = [] {
    auto any = [](const std::string&) -> problem { return std::nullopt; };
    std::vector<key_spec> t;
    t.push_back({"listen", host_port_setter([](config& c) -> auto& { return c.listen; })});
    t.push_back({"admin_listen", host_port_setter([](config& c) -> auto& { return c.admin_listen; })});
    t.push_back({"threads", count_setter([](config& c) -> auto& { return c.threads; }, 0, max_threads)});
    t.push_back({"busy_poll_us",
                 count_setter([](config& c) -> auto& { return c.busy_poll_us; }, 0, max_busy_poll_us)});
    t.push_back({"node_ip", optional_string_setter([](config& c) -> auto& { return c.node_ip; }, check_ip)});
    t.push_back({"ray_node_id", optional_string_setter([](config& c) -> auto& { return c.ray_node_id; }, any)});
    t.push_back({"root_path", string_setter([](config& c) -> auto& { return c.root_path; }, check_root_path)});
    t.push_back({"log_level", [](config& c, const std::string& v) -> problem {
                   const auto level = parse_log_level(v);
                   if (!level) return "expected one of trace, debug, info, warn, error, got " + in_quotes(v);
                   c.level = *level;
                   return std::nullopt;
                 }});
    t.push_back({"access_log", string_setter([](config& c) -> auto& { return c.access_log; }, check_access_log)});

    t.push_back({"topology.file", optional_string_setter([](config& c) -> auto& { return c.topology.file; }, any)});
    t.push_back({"topology.ray_dashboard",
                 optional_string_setter([](config& c) -> auto& { return c.topology.ray_dashboard; }, check_http_url)});
    t.push_back({"topology.url", optional_string_setter([](config& c) -> auto& { return c.topology.url; }, check_http_url)});
    t.push_back({"topology.poll_interval",
                 duration_setter([](config& c) -> auto& { return c.topology.poll_interval; }, zero::forbidden)});
    t.push_back({"topology.timeout", duration_setter([](config& c) -> auto& { return c.topology.timeout; }, zero::forbidden)});
    t.push_back({"topology.local_dial_host",
                 optional_string_setter([](config& c) -> auto& { return c.topology.local_dial_host; }, check_host)});

    t.push_back({"router.methods", nullptr, true});
    t.push_back({"router.timeout", duration_setter([](config& c) -> auto& { return c.router.timeout; }, zero::forbidden)});
    t.push_back({"router.forward_body", bool_setter([](config& c) -> auto& { return c.router.forward_body; })});
    // 0 is allowed here: it only matters with forward_body, and validate() checks that pair.
    t.push_back({"router.body_limit",
                 size_setter([](config& c) -> auto& { return c.router.body_limit; }, 0,
                             std::numeric_limits<std::uint64_t>::max())});
    // 0 is meaningful: route at once on the body bytes that came with the head.
    t.push_back({"router.body_wait",
                 duration_setter([](config& c) -> auto& { return c.router.body_wait; }, zero::allowed)});
    t.push_back({"router.session_header", [](config& c, const std::string& v) -> problem {
                   // Stored lowercased: header names are case-insensitive and the router path
                   // compares against Beast's lowercase-insensitive lookups.
                   auto lower = v;
                   std::transform(lower.begin(), lower.end(), lower.begin(),
                                  [](unsigned char ch) { return static_cast<char>(std::tolower(ch)); });
                   if (check_session_header(lower)) {
                     return "expected a header name (or \"\" to disable), got " + in_quotes(v);
                   }
                   c.router.session_header = std::move(lower);
                   return std::nullopt;
                 }});
    t.push_back({"router.hedge", [](config& c, const std::string& v) -> problem {
                   if (v == "auto" || v == "off") {
                     c.router.hedge_auto = v == "auto";
                     c.router.hedge_after = duration{0};
                     return std::nullopt;
                   }
                   const auto d = parse_duration(v);
                   if (!d || *d <= duration::zero())
                     return "expected auto, off or a duration like 5ms, got " + in_quotes(v);
                   c.router.hedge_auto = false;
                   c.router.hedge_after = *d;
                   return std::nullopt;
                 }});
    t.push_back({"router.hedge_budget", [](config& c, const std::string& v) -> problem {
                   // "10%" (or "10"): a percentage, to 0.1 %.
                   std::string_view t = v;
                   if (!t.empty() && t.back() == '%') t.remove_suffix(1);
                   double pct = -1;
                   const auto [end, ec] = std::from_chars(t.data(), t.data() + t.size(), pct);
                   if (ec != std::errc{} || end != t.data() + t.size() || !(pct >= 0 && pct <= 100))
                     return "expected a percentage from 0% to 100%, like 10%, got " + in_quotes(v);
                   c.router.hedge_budget_permille = static_cast<unsigned>(pct * 10 + 0.5);
                   return std::nullopt;
                 }});
    t.push_back({"router.on_failure", [](config& c, const std::string& v) -> problem {
                   if (v == "fail_closed") c.router.failure_mode = on_failure::fail_closed;
                   else if (v == "fail_open") c.router.failure_mode = on_failure::fail_open;
                   else return "expected fail_closed or fail_open, got " + in_quotes(v);
                   return std::nullopt;
                 }});

    t.push_back({"upstream.connect_timeout",
                 duration_setter([](config& c) -> auto& { return c.upstream.connect_timeout; }, zero::forbidden)});
    t.push_back({"upstream.first_byte_timeout",
                 duration_setter([](config& c) -> auto& { return c.upstream.first_byte_timeout; }, zero::forbidden)});
    t.push_back({"upstream.idle_timeout",
                 duration_setter([](config& c) -> auto& { return c.upstream.idle_timeout; }, zero::forbidden)});
    t.push_back({"upstream.retries",
                 count_setter([](config& c) -> auto& { return c.upstream.retries; }, 0,
                              std::numeric_limits<unsigned>::max())});
    // 0 is meaningful: no pooling, every upstream request opens a fresh connection.
    t.push_back({"upstream.max_idle_per_replica",
                 count_setter([](config& c) -> auto& { return c.upstream.max_idle_per_replica; }, 0,
                              std::numeric_limits<unsigned>::max())});

    t.push_back({"client.header_timeout",
                 duration_setter([](config& c) -> auto& { return c.client.header_timeout; }, zero::forbidden)});
    t.push_back({"client.body_timeout",
                 duration_setter([](config& c) -> auto& { return c.client.body_timeout; }, zero::forbidden)});
    t.push_back({"client.keepalive_timeout",
                 duration_setter([](config& c) -> auto& { return c.client.keepalive_timeout; }, zero::forbidden)});
    t.push_back({"client.max_header_bytes",
                 size_setter([](config& c) -> auto& { return c.client.max_header_bytes; }, min_header_bytes,
                             max_header_bytes_limit)});
    t.push_back({"client.max_body_bytes",
                 size_setter([](config& c) -> auto& { return c.client.max_body_bytes; }, 1,
                             std::numeric_limits<std::uint64_t>::max())});
    t.push_back({"client.max_connections",
                 count_setter([](config& c) -> auto& { return c.client.max_connections; }, 1,
                              std::numeric_limits<unsigned>::max())});
    t.push_back({"client.trusted_proxies", nullptr, true, set_trusted_proxies});
    t.push_back({"client.proxy_protocol", bool_setter([](config& c) -> auto& { return c.client.proxy_protocol; })});
    t.push_back({"client.max_tunnels",
                 count_setter([](config& c) -> auto& { return c.client.max_tunnels; }, 1,
                              std::numeric_limits<unsigned>::max())});

    t.push_back({"health.path", string_setter([](config& c) -> auto& { return c.health.path; }, check_health_path)});
    t.push_back({"health.interval", duration_setter([](config& c) -> auto& { return c.health.interval; }, zero::forbidden)});
    t.push_back({"health.fast_interval",
                 duration_setter([](config& c) -> auto& { return c.health.fast_interval; }, zero::forbidden)});
    t.push_back({"health.fall", count_setter([](config& c) -> auto& { return c.health.fall; }, 1,
                                             std::numeric_limits<unsigned>::max())});
    t.push_back({"health.rise", count_setter([](config& c) -> auto& { return c.health.rise; }, 1,
                                             std::numeric_limits<unsigned>::max())});
    t.push_back({"health.timeout", duration_setter([](config& c) -> auto& { return c.health.timeout; }, zero::forbidden)});
    // 0 turns passive health off.
    t.push_back({"health.error_limit", count_setter([](config& c) -> auto& { return c.health.error_limit; }, 0,
                                                    std::numeric_limits<unsigned>::max())});

    t.push_back({"timeout.tunnel", duration_setter([](config& c) -> auto& { return c.timeout.tunnel; }, zero::forbidden)});

    // 0 is meaningful for both drain settings: stop accepting at once / abort in-flight at once.
    t.push_back({"drain.min_period", duration_setter([](config& c) -> auto& { return c.drain.min_period; }, zero::allowed)});
    t.push_back({"drain.timeout", duration_setter([](config& c) -> auto& { return c.drain.timeout; }, zero::allowed)});

    // "" = no TLS listener (the default), so that a config file can switch it off again.
    t.push_back({"tls.listen", [](config& c, const std::string& v) -> problem {
                   if (v.empty()) {
                     c.tls.listen = {};
                     return std::nullopt;
                   }
                   return host_port_setter([](config& c2) -> auto& { return c2.tls.listen; })(c, v);
                 }});
    t.push_back({"tls.cert_file", optional_string_setter([](config& c) -> auto& { return c.tls.cert_file; }, any)});
    t.push_back({"tls.key_file", optional_string_setter([](config& c) -> auto& { return c.tls.key_file; }, any)});
    t.push_back({"tls.min_version",
                 string_setter([](config& c) -> auto& { return c.tls.min_version; }, check_tls_version)});
    t.push_back({"tls.ciphers", string_setter([](config& c) -> auto& { return c.tls.ciphers; }, check_not_empty)});
    t.push_back({"tls.ciphersuites",
                 string_setter([](config& c) -> auto& { return c.tls.ciphersuites; }, check_not_empty)});
    t.push_back({"tls.handshake_timeout",
                 duration_setter([](config& c) -> auto& { return c.tls.handshake_timeout; }, zero::forbidden)});

    // "" = no gRPC listener (the default).
    t.push_back({"grpc.listen", [](config& c, const std::string& v) -> problem {
                   if (v.empty()) {
                     c.grpc.listen = {};
                     return std::nullopt;
                   }
                   return host_port_setter([](config& c2) -> auto& { return c2.grpc.listen; })(c, v);
                 }});
    t.push_back({"grpc.max_concurrent_streams",
                 count_setter([](config& c) -> auto& { return c.grpc.max_concurrent_streams; }, 1, max_grpc_streams)});
    t.push_back({"grpc.health_path",
                 string_setter([](config& c) -> auto& { return c.grpc.health_path; }, check_health_path)});
    t.push_back({"grpc.max_upstream_connections",
                 count_setter([](config& c) -> auto& { return c.grpc.max_upstream_connections; }, 1,
                              max_grpc_upstream_connections)});
    t.push_back({"grpc.keepalive_interval",
                 duration_setter([](config& c) -> auto& { return c.grpc.keepalive_interval; }, zero::allowed)});
    t.push_back({"grpc.keepalive_timeout",
                 duration_setter([](config& c) -> auto& { return c.grpc.keepalive_timeout; }, zero::forbidden)});
    t.push_back({"metrics.ray_compatible", bool_setter([](config& c) -> auto& { return c.metrics.ray_compatible; })});
    return t;
  }();
  return table;
}

const key_spec* find_key(std::string_view key) {
  for (const auto& spec : key_table()) {
    if (spec.key == key) return &spec;
  }
  return nullptr;
}

bool is_section(std::string_view name) {
  for (std::string_view s : {"topology", "router", "upstream", "client", "health", "timeout", "drain", "tls", "grpc", "metrics"}) {
    if (s == name) return true;
  }
  return false;
}

std::size_t edit_distance(std::string_view a, std::string_view b) {
  std::vector<std::size_t> row(b.size() + 1);
  for (std::size_t j = 0; j <= b.size(); ++j) row[j] = j;
  for (std::size_t i = 1; i <= a.size(); ++i) {
    std::size_t diagonal = row[0];
    row[0] = i;
    for (std::size_t j = 1; j <= b.size(); ++j) {
      const std::size_t above = row[j];
      row[j] = std::min({row[j] + 1, row[j - 1] + 1, diagonal + (a[i - 1] == b[j - 1] ? 0 : 1)});
      diagonal = above;
    }
  }
  return row[b.size()];
}

/// "; did you mean 'x'?" for a near miss among `candidates`, else "".
std::string suggestion(std::string_view wrong, const std::vector<std::string>& candidates) {
  std::string best;
  std::size_t best_distance = 3;  // more than two edits away is not a typo
  for (const auto& c : candidates) {
    const auto d = edit_distance(wrong, c);
    if (d < best_distance) {
      best_distance = d;
      best = c;
    }
  }
  if (best.empty()) return {};
  return "; did you mean " + in_quotes(best) + "?";
}

// ---------------------------------------------------------------------------------------------
// YAML loading

struct yaml_loader {
  const std::string& origin;
  config& cfg;
  std::map<std::string, int> seen;  // dotted key -> line, for duplicate detection

  static int line_of(const YAML::Node& node) {
    const auto mark = node.Mark();
    return mark.is_null() ? 0 : mark.line + 1;
  }

  std::string at(int line) const {
    return line > 0 ? origin + ":" + std::to_string(line) + ": " : origin + ": ";
  }

  problem load(const YAML::Node& root) {
    if (!root || root.IsNull()) return std::nullopt;  // empty file: all defaults
    if (!root.IsMap()) return at(line_of(root)) + "expected a map of settings at the top level";
    return walk(root, "");
  }

  problem walk(const YAML::Node& map, const std::string& prefix) {
    for (auto it = map.begin(); it != map.end(); ++it) {
      // Copies, not references: yaml-cpp's iterator hands out a temporary pair proxy.
      const YAML::Node key_node = it->first;
      const YAML::Node value = it->second;
      const int line = line_of(key_node);
      if (!key_node.IsScalar()) return at(line) + "keys must be plain names";
      const std::string key = prefix + key_node.Scalar();

      if (const auto [pos, inserted] = seen.emplace(key, line); !inserted) {
        return at(line) + "duplicate key " + in_quotes(key) + " (first at line " +
               std::to_string(pos->second) + ")";
      }
      if (prefix.empty() && is_section(key)) {
        if (value.IsNull()) continue;  // "router:" with nothing under it: defaults
        if (!value.IsMap()) return at(line) + key + ": expected a map of " + key + ".* settings";
        if (auto p = walk(value, key + ".")) return p;
        continue;
      }
      // Keys are names, never paths: "router.timeout" at the top level is not router.timeout.
      const bool dotted = key_node.Scalar().find('.') != std::string::npos;
      const key_spec* spec = dotted ? nullptr : find_key(key);
      if (spec == nullptr) return at(line) + unknown_key_message(key);
      if (auto p = apply(*spec, value, line)) return p;
    }
    return std::nullopt;
  }

  static std::string unknown_key_message(const std::string& key) {
    const std::string message = "unknown key " + in_quotes(key);
    const auto dot = key.find('.');
    // "router.timeout: 5s" written flat at the top level: say how to nest it.
    if (dot != std::string::npos && find_key(key) != nullptr) {
      return message + "; write it as '" + key.substr(dot + 1) + ":' under '" + key.substr(0, dot) +
             ":'";
    }
    // "timeout: 5s" at the top level: name the sections that have such a key.
    std::string nested;
    for (const auto& spec : key_table()) {
      const auto spec_dot = spec.key.find('.');
      if (spec_dot != std::string_view::npos && spec.key.substr(spec_dot + 1) == key) {
        nested += (nested.empty() ? "" : " or ") + in_quotes(spec.key);
      }
    }
    if (!nested.empty()) return message + "; did you mean " + nested + "?";
    std::vector<std::string> candidates;
    for (const auto& spec : key_table()) candidates.emplace_back(spec.key);
    return message + suggestion(key, candidates);
  }

  problem apply(const key_spec& spec, const YAML::Node& value, int line) {
    const std::string key{spec.key};
    if (spec.is_list && !spec.set_list) return apply_methods(value, line);
    if (spec.is_list) {
      if (!value.IsSequence()) return at(line) + key + ": expected a list, like [10.0.0.0/8]";
      std::vector<std::string> items;
      for (const auto& item : value) {
        if (!item.IsScalar()) return at(line_of(item) > 0 ? line_of(item) : line) + key + ": expected a list of values";
        items.push_back(item.Scalar());
      }
      if (auto p = spec.set_list(cfg, items)) return at(line) + key + ": " + *p;
      return std::nullopt;
    }
    if (value.IsSequence() || value.IsMap()) {
      return at(line) + key + ": expected a single value, not a " +
             (value.IsMap() ? "map" : "list");
    }
    // A key with no value ("node_ip:") reads as "", which string keys take as "not set" and
    // every other key rejects with its usual message.
    const std::string text = value.IsNull() ? std::string{} : value.Scalar();
    if (auto p = spec.set(cfg, text)) return at(line) + key + ": " + *p;
    return std::nullopt;
  }

  problem apply_methods(const YAML::Node& value, int line) {
    if (!value.IsSequence()) {
      return at(line) + "router.methods: expected a list of HTTP methods like [POST]";
    }
    std::vector<std::string> methods;
    for (const auto& item : value) {
      const int item_line = line_of(item) > 0 ? line_of(item) : line;
      if (!item.IsScalar()) {
        return at(item_line) + "router.methods: expected a list of HTTP methods like [POST]";
      }
      methods.push_back(item.Scalar());
      if (auto p = check_methods(methods)) return at(item_line) + "router.methods: " + *p;
    }
    cfg.router.methods = std::move(methods);
    return std::nullopt;
  }
};

// ---------------------------------------------------------------------------------------------
// Flags

struct flag_spec {
  std::string_view name;       ///< without the leading "--"
  std::string_view arg;        ///< "" for switches
  std::string help;            ///< one line for --help, with the default
  std::string_view key;        ///< the YAML key whose setter this flag uses ("" for switches)
  bool command_line::*flag = nullptr;  ///< for switches
  /// A switch that sets a boolean key to true (`key` names it), rather than a command_line field.
  bool sets_key = false;
};

const std::vector<flag_spec>& flag_table() {
  static const std::vector<flag_spec> table = [] {
    const config d{};
    std::vector<flag_spec> t;
    t.push_back({"config", "FILE", "YAML config file; flags override its settings", "", nullptr});
    t.push_back({"listen", "HOST:PORT", "main listener (default " + d.listen.to_string() + ")", "listen", nullptr});
    t.push_back({"admin-listen", "HOST:PORT",
                 "metrics and topology dump (default " + d.admin_listen.to_string() + ")", "admin_listen", nullptr});
    t.push_back({"tls-listen", "HOST:PORT", "HTTPS listener beside --listen (default: none)", "tls.listen", nullptr});
    t.push_back({"tls-cert", "FILE", "PEM certificate (chain after it) for --tls-listen", "tls.cert_file", nullptr});
    t.push_back({"tls-key", "FILE", "PEM private key of --tls-cert", "tls.key_file", nullptr});
    t.push_back({"grpc-listen", "HOST:PORT", "gRPC (HTTP/2 cleartext) listener (default: none)", "grpc.listen", nullptr});
    t.push_back({"node-ip", "IP",
                 "this node's Ray node IP (default: $RAY_NODE_IP_ADDRESS, else detected)", "node_ip", nullptr});
    t.push_back({"ray-node-id", "ID", "this node's Ray node id, for Ray's node drain (default: found by node IP)",
                 "ray_node_id", nullptr});
    t.push_back({"topology-file", "PATH", "static or hand-written topology, watched for changes",
                 "topology.file", nullptr});
    t.push_back({"ray-dashboard", "URL", "e.g. http://10.0.0.1:8265 (polls /api/serve/applications/)",
                 "topology.ray_dashboard", nullptr});
    t.push_back({"topology-url", "URL", "any http:// URL that returns the topology document",
                 "topology.url", nullptr});
    t.push_back({"threads", "N", "worker threads (default " + std::to_string(d.threads) + " = number of CPUs)",
                 "threads", nullptr});
    t.push_back({"log-level", "LEVEL",
                 "trace|debug|info|warn|error (default " + std::string{to_string(d.level)} + ")", "log_level",
                 nullptr});
    t.push_back({"access-log", "PATH|-|off",
                 "JSON access log: a file, - for stdout, or off (default " + d.access_log + ")", "access_log",
                 nullptr});
    t.push_back({"trusted-proxy", "CIDR",
                 "load balancer network whose forwarding headers count; repeatable (default: none)",
                 "client.trusted_proxies", nullptr});
    t.push_back({"proxy-protocol", "", "every connection starts with a PROXY header (v1/v2) from a --trusted-proxy",
                 "client.proxy_protocol", nullptr, true});
    t.push_back({"health-path", "PATH",
                 "replica health check path (default " + d.health.path + "; a plain HTTP backend may need /)",
                 "health.path", nullptr});
    t.push_back({"check-config", "", "validate config + topology source settings, print result, exit", "",
                 &command_line::check_config});
    t.push_back({"demo", "", "run with a built-in demo cluster on loopback", "", &command_line::demo});
    t.push_back({"version", "", "print the version and exit", "", &command_line::version});
    t.push_back({"help", "", "print this help and exit", "", &command_line::help});
    return t;
  }();
  return table;
}

/// The YAML key a flag sets ("" for a switch of its own or an unknown flag).
std::string_view flag_key(std::string_view flag) {
  for (const auto& f : flag_table())
    if (f.name == flag) return f.key;
  return {};
}

po::options_description flag_descriptions() {
  po::options_description desc;
  for (const auto& f : flag_table()) {
    const std::string name{f.name};
    if (f.arg.empty()) {
      desc.add_options()(name.c_str(), po::bool_switch());
    } else {
      desc.add_options()(name.c_str(), po::value<std::string>());
    }
  }
  return desc;
}

/// Turns a program_options exception into our message shape ("--flag: problem").
std::string describe(const po::error& e) {
  if (const auto* named = dynamic_cast<const po::error_with_option_name*>(&e)) {
    const std::string name = named->get_option_name();
    if (dynamic_cast<const po::multiple_occurrences*>(&e)) return name + ": given more than once";
    if (const auto* syntax = dynamic_cast<const po::invalid_command_line_syntax*>(&e)) {
      switch (syntax->kind()) {
        case po::invalid_syntax::missing_parameter:
        case po::invalid_syntax::empty_adjacent_parameter:
          return name + ": missing value";
        case po::invalid_syntax::extra_parameter:
          return name + ": takes no value";
        default:
          break;
      }
    }
    if (!name.empty()) return name + ": " + e.what();
  }
  return std::string{"command line: "} + e.what();
}

std::variant<command_line, config_error> parse_command_line_impl(int argc, const char* const* argv) {
  command_line result;
  const auto desc = flag_descriptions();
  // No guessing ("--list" must not mean "--listen") and no short options: the contract defines
  // only long flags, and a typo has to be an error.
  const int style = po::command_line_style::allow_long | po::command_line_style::long_allow_adjacent |
                    po::command_line_style::long_allow_next;
  // allow_unregistered lets us report unknown flags and stray arguments ourselves, by name.
  const auto parsed =
      po::command_line_parser(argc, argv).options(desc).style(style).allow_unregistered().run();

  std::vector<std::string> known;
  for (const auto& f : flag_table()) known.push_back("--" + std::string{f.name});

  std::map<std::string, std::string> values;
  std::map<std::string, std::vector<std::string>> lists;
  for (const auto& opt : parsed.options) {
    if (opt.unregistered) {
      const std::string raw = opt.original_tokens.empty() ? opt.string_key : opt.original_tokens.front();
      const std::string name = raw.substr(0, raw.find('='));
      return config_error{name + ": unknown flag" + suggestion(name, known) + " (see --help)"};
    }
    if (opt.string_key.empty()) {
      const std::string token = opt.original_tokens.empty() ? std::string{} : opt.original_tokens.front();
      // With short options disabled, "-h" arrives as a positional token; it is still a flag typo.
      if (token.size() > 1 && token.front() == '-') {
        return config_error{token + ": unknown flag (all flags are long, e.g. --help)"};
      }
      return config_error{"unexpected argument " + in_quotes(token) + " (all options are --flags; see --help)"};
    }
    const std::string name = "--" + opt.string_key;
    const std::string value = opt.value.empty() ? std::string{} : opt.value.front();
    if (const key_spec* spec = find_key(flag_key(opt.string_key)); spec && spec->set_list) {
      lists[opt.string_key].push_back(value);  // a list key's flag may be repeated
      continue;
    }
    if (values.contains(opt.string_key)) return config_error{name + ": given more than once"};
    values.emplace(opt.string_key, value);
  }

  for (const auto& f : flag_table()) {
    if (f.flag != nullptr && values.contains(std::string{f.name})) result.*(f.flag) = true;
  }
  // --help and --version answer without looking at anything else, so they work even when the
  // config file is broken.
  if (result.help || result.version) return result;

  config cfg;
  if (const auto it = values.find("config"); it != values.end()) {
    if (it->second.empty()) return config_error{"--config: missing value"};
    auto loaded = load_file(it->second);
    if (auto* err = std::get_if<config_error>(&loaded)) return std::move(*err);
    cfg = std::move(std::get<config>(loaded));
  }
  for (const auto& f : flag_table()) {
    if (f.key.empty()) continue;
    if (f.sets_key) {
      if (values.contains(std::string{f.name}) && find_key(f.key)->set(cfg, "true")) return config_error{"--" + std::string{f.name} + ": cannot set"};
      continue;
    }
    if (const auto it = lists.find(std::string{f.name}); it != lists.end()) {
      const std::string name = "--" + std::string{f.name};
      for (const auto& v : it->second)
        if (v.empty() || v.starts_with("--")) return config_error{name + ": missing value"};
      if (auto p = find_key(f.key)->set_list(cfg, it->second)) return config_error{name + ": " + *p};
      continue;
    }
    const auto it = values.find(std::string{f.name});
    if (it == values.end()) continue;
    const std::string name = "--" + std::string{f.name};
    const std::string& value = it->second;
    // program_options takes the next token as the value even when it is another flag
    // ("--listen --demo"); a value that looks like a flag is almost surely a missing value.
    if (value.empty() || value.starts_with("--")) {
      return config_error{name + ": missing value" + (value.empty() ? "" : " (got the flag " + in_quotes(value) + ")")};
    }
    const key_spec* spec = find_key(f.key);
    if (auto p = spec->set(cfg, value)) return config_error{name + ": " + *p};
  }

  if (auto err = validate(cfg, result.demo)) return std::move(*err);
  result.cfg = std::move(cfg);
  return result;
}

}  // namespace

// ---------------------------------------------------------------------------------------------

std::string_view usual_holder(std::uint16_t port) noexcept {
  switch (port) {
    case 8000: return "Ray Serve's HTTP proxy, or its HAProxy (RAY_SERVE_ENABLE_HA_PROXY=1), or another ingressd";
    case 9000: return "Ray Serve's gRPC proxy (grpc_options.port)";
    case 9101: return "Ray Serve's HAProxy metrics exporter (RAY_SERVE_HAPROXY_METRICS_PORT)";
    case 8404: return "Ray Serve's HAProxy stats page (RAY_SERVE_HAPROXY_STATS_PORT)";
    case 8265: return "the Ray dashboard";
    case 6379: return "Ray's GCS server";
    case 10001: return "the Ray client server";
    case 8500: return "Ray Serve's fallback proxy (RAY_SERVE_FALLBACK_PROXY_HTTP_PORT)";
    case 9190: return "another ingressd's admin listener (a restart while the old one still drains?)";
    default: return {};
  }
}

std::string host_port::to_string() const {
  if (host.find(':') != std::string::npos) return "[" + host + "]:" + std::to_string(port);
  return host + ":" + std::to_string(port);
}

unsigned config::effective_threads() const {
  if (threads != 0) return threads;
  // hardware_concurrency() may return 0 when it cannot tell; one worker still serves.
  return std::max(1u, std::thread::hardware_concurrency());
}

std::optional<host_port> parse_host_port(std::string_view text) {
  std::string_view host;
  std::string_view port_text;
  if (!text.empty() && text.front() == '[') {
    const auto close = text.find(']');
    if (close == std::string_view::npos || close + 1 >= text.size() || text[close + 1] != ':') {
      return std::nullopt;
    }
    host = text.substr(1, close - 1);
    port_text = text.substr(close + 2);
    if (!is_ipv6(std::string{host})) return std::nullopt;
  } else {
    const auto colon = text.rfind(':');
    if (colon == std::string_view::npos) return std::nullopt;
    host = text.substr(0, colon);
    port_text = text.substr(colon + 1);
    // A bare IPv6 address ("::1:8000") is ambiguous; the host name check rejects its colons.
    if (!is_host_name_or_ipv4(host)) return std::nullopt;
  }
  const auto port = parse_port(port_text);
  if (!port) return std::nullopt;
  return host_port{std::string{host}, *port};
}

std::variant<command_line, config_error> parse_command_line(int argc, const char* const* argv) {
  try {
    return parse_command_line_impl(argc, argv);
  } catch (const po::error& e) {
    return config_error{describe(e)};
  } catch (const std::exception& e) {
    return config_error{std::string{"command line: "} + e.what()};
  }
}

std::variant<config, config_error> load_file(const std::string& path, config base) {
  try {
    std::error_code ec;
    if (std::filesystem::is_directory(path, ec)) {
      return config_error{"cannot read config file " + in_quotes(path) + ": is a directory"};
    }
    std::ifstream in(path, std::ios::binary);
    if (!in) {
      return config_error{"cannot read config file " + in_quotes(path) + ": " + std::strerror(errno)};
    }
    std::ostringstream text;
    text << in.rdbuf();
    if (in.bad()) {
      return config_error{"cannot read config file " + in_quotes(path) + ": read error"};
    }
    auto result = load_yaml(text.str(), path, std::move(base));
    if (auto* cfg = std::get_if<config>(&result)) cfg->config_file = path;
    return result;
  } catch (const std::exception& e) {
    return config_error{"cannot read config file " + in_quotes(path) + ": " + e.what()};
  }
}

std::variant<config, config_error> load_yaml(const std::string& text, const std::string& origin,
                                             config base) {
  try {
    // Not YAML::LoadAll: yaml-cpp 0.7 (Debian 12) loops forever, allocating, on a document that
    // starts with ',' (jbeder/yaml-cpp#1040); YAML::Load is not affected. A second document is
    // found by its '---' marker after some content.
    bool content = false;
    std::size_t line_no = 0;
    for (std::size_t pos = 0; pos <= text.size();) {
      const auto end = std::min(text.find('\n', pos), text.size());
      std::string_view line(text.data() + pos, end - pos);
      ++line_no;
      if (line.starts_with("---") && (line.size() == 3 || line[3] == ' ' || line[3] == '\r')) {
        if (content) return config_error{origin + ":" + std::to_string(line_no) + ": expected one YAML document"};
      } else if (auto first = line.find_first_not_of(" \t\r"); first != std::string_view::npos && line[first] != '#') {
        content = true;
      }
      pos = end + 1;
    }
    const YAML::Node document = YAML::Load(text);
    if (!document.IsDefined() || document.IsNull()) return base;
    yaml_loader loader{origin, base, {}};
    if (auto p = loader.load(document)) return config_error{std::move(*p)};
    return base;
  } catch (const YAML::Exception& e) {
    const std::string where =
        e.mark.is_null() ? origin + ": " : origin + ":" + std::to_string(e.mark.line + 1) + ": ";
    return config_error{where + "invalid YAML: " + e.msg};
  } catch (const std::exception& e) {
    return config_error{origin + ": " + e.what()};
  }
}

namespace {

// ---------------------------------------------------------------------------------------------
// validate(): one rule per concern, run in a fixed order so that a config with several mistakes
// always reports the same one first.

using rule_result = std::optional<config_error>;

/// (key, what is wrong with its value): a rule's list of single-value checks, in reporting order.
using field_check = std::pair<std::string_view, problem>;

rule_result first_failure(std::initializer_list<field_check> checks) {
  for (const auto& [key, p] : checks)
    if (p) return config_error{std::string{key} + ": " + *p};
  return std::nullopt;
}

/// "" means the optional setting is unset: nothing to check.
template <class Check>
problem if_set(const std::string& value, Check check) {
  return value.empty() ? problem{} : check(value);
}

problem check_at_least_one(std::uint64_t value, std::string_view unit = "") {
  if (value == 0) return "must be at least 1" + std::string{unit};
  return std::nullopt;
}

/// The session id is matched against header names as the parser stores them: lowercased.
problem check_lowercase(const std::string& text) {
  if (std::any_of(text.begin(), text.end(), [](char c) { return c >= 'A' && c <= 'Z'; }))
    return "must be lowercase, got " + in_quotes(text);
  return std::nullopt;
}

problem check_timeout(duration d, zero z) {
  if (auto p = check_duration(d, z)) return p;
  if (d > max_duration) return "must be at most " + format_duration(max_duration);
  return std::nullopt;
}

// Single-value rules: load_yaml and the flags already enforce them (with line numbers), but a
// config built in code (tests, embedders) only meets them here.

rule_result listener_addresses(const config& cfg) {
  return first_failure({
      {"listen", check_host_port(cfg.listen)},
      {"admin_listen", check_host_port(cfg.admin_listen)},
      {"tls.listen", cfg.tls.enabled() ? check_host_port(cfg.tls.listen) : problem{}},
      {"grpc.listen", cfg.grpc.enabled() ? check_host_port(cfg.grpc.listen) : problem{}},
  });
}

rule_result tls_and_grpc_values(const config& cfg) {
  return first_failure({
      {"grpc.max_concurrent_streams", check_count(cfg.grpc.max_concurrent_streams, 1, max_grpc_streams)},
      {"grpc.health_path", check_health_path(cfg.grpc.health_path)},
      {"grpc.max_upstream_connections",
       check_count(cfg.grpc.max_upstream_connections, 1, max_grpc_upstream_connections)},
      {"grpc.keepalive_interval", check_timeout(cfg.grpc.keepalive_interval, zero::allowed)},
      {"grpc.keepalive_timeout", check_timeout(cfg.grpc.keepalive_timeout, zero::forbidden)},
      {"tls.min_version", check_tls_version(cfg.tls.min_version)},
      {"tls.ciphers", check_not_empty(cfg.tls.ciphers)},
      {"tls.ciphersuites", check_not_empty(cfg.tls.ciphersuites)},
  });
}

rule_result process_values(const config& cfg) {
  return first_failure({
      {"threads", check_count(cfg.threads, 0, max_threads)},
      {"busy_poll_us", check_count(cfg.busy_poll_us, 0, max_busy_poll_us)},
      {"node_ip", if_set(cfg.node_ip, check_ip)},
      {"root_path", check_root_path(cfg.root_path)},
      {"access_log", check_access_log(cfg.access_log)},
  });
}

rule_result topology_values(const config& cfg) {
  return first_failure({
      {"topology.ray_dashboard", if_set(cfg.topology.ray_dashboard, check_http_url)},
      {"topology.url", if_set(cfg.topology.url, check_http_url)},
      {"topology.local_dial_host", if_set(cfg.topology.local_dial_host, check_host)},
  });
}

rule_result router_and_health_path(const config& cfg) {
  return first_failure({
      {"router.methods", check_methods(cfg.router.methods)},
      {"router.session_header", check_session_header(cfg.router.session_header)},
      {"router.session_header", check_lowercase(cfg.router.session_header)},
      {"health.path", check_health_path(cfg.health.path)},
  });
}

rule_result timeouts(const config& cfg) {
  return first_failure({
      {"topology.poll_interval", check_timeout(cfg.topology.poll_interval, zero::forbidden)},
      {"topology.timeout", check_timeout(cfg.topology.timeout, zero::forbidden)},
      {"router.timeout", check_timeout(cfg.router.timeout, zero::forbidden)},
      {"upstream.connect_timeout", check_timeout(cfg.upstream.connect_timeout, zero::forbidden)},
      {"upstream.first_byte_timeout", check_timeout(cfg.upstream.first_byte_timeout, zero::forbidden)},
      {"upstream.idle_timeout", check_timeout(cfg.upstream.idle_timeout, zero::forbidden)},
      {"client.header_timeout", check_timeout(cfg.client.header_timeout, zero::forbidden)},
      {"client.body_timeout", check_timeout(cfg.client.body_timeout, zero::forbidden)},
      {"client.keepalive_timeout", check_timeout(cfg.client.keepalive_timeout, zero::forbidden)},
      {"health.interval", check_timeout(cfg.health.interval, zero::forbidden)},
      {"health.fast_interval", check_timeout(cfg.health.fast_interval, zero::forbidden)},
      {"health.timeout", check_timeout(cfg.health.timeout, zero::forbidden)},
      {"tls.handshake_timeout", check_timeout(cfg.tls.handshake_timeout, zero::forbidden)},
      {"timeout.tunnel", check_timeout(cfg.timeout.tunnel, zero::forbidden)},
      // 0 means something here: no body wait, stop accepting at once, abort in-flight requests at once.
      {"router.body_wait", check_timeout(cfg.router.body_wait, zero::allowed)},
      {"drain.min_period", check_timeout(cfg.drain.min_period, zero::allowed)},
      {"drain.timeout", check_timeout(cfg.drain.timeout, zero::allowed)},
  });
}

rule_result client_and_health_limits(const config& cfg) {
  const bool proxy_protocol_untrusted = cfg.client.proxy_protocol && cfg.client.trusted_proxies.empty();
  return first_failure({
      {"client.max_header_bytes", check_size(cfg.client.max_header_bytes, min_header_bytes, max_header_bytes_limit)},
      {"client.max_body_bytes", check_at_least_one(cfg.client.max_body_bytes, "B")},
      {"client.max_connections", check_at_least_one(cfg.client.max_connections)},
      {"client.max_tunnels", check_at_least_one(cfg.client.max_tunnels)},
      {"client.proxy_protocol",
       proxy_protocol_untrusted
           ? problem{"needs client.trusted_proxies (--trusted-proxy): the load balancers that send the PROXY headers"}
           : problem{}},
      {"health.fall", check_at_least_one(cfg.health.fall)},
      {"health.rise", check_at_least_one(cfg.health.rise)},
  });
}

// Cross-field rules.

rule_result router_body_limit(const config& cfg) {
  if (cfg.router.forward_body && cfg.router.body_limit == 0)
    return config_error{"router.body_limit: must be at least 1B when router.forward_body is true"};
  return std::nullopt;
}

/// Two listeners collide on the same port when a host is the same or either is a wildcard.
rule_result distinct(std::string_view name, const host_port& a, std::string_view other_name, const host_port& b) {
  const auto is_wildcard = [](const std::string& host) { return host == "0.0.0.0" || host == "::"; };
  if (a.port != 0 && a.port == b.port && (a.host == b.host || is_wildcard(a.host) || is_wildcard(b.host)))
    return config_error{std::string{name} + " (" + a.to_string() + ") and " + std::string{other_name} + " (" +
                        b.to_string() + ") must use different addresses"};
  return std::nullopt;
}

rule_result main_and_admin_distinct(const config& cfg) {
  return distinct("listen", cfg.listen, "admin_listen", cfg.admin_listen);
}

rule_result tls_listener(const config& cfg) {
  if (!cfg.tls.enabled()) return std::nullopt;
  if (cfg.tls.cert_file.empty() || cfg.tls.key_file.empty())
    return config_error{"tls.listen (" + cfg.tls.listen.to_string() +
                        ") needs tls.cert_file and tls.key_file (--tls-cert, --tls-key)"};
  if (auto err = distinct("tls.listen", cfg.tls.listen, "listen", cfg.listen)) return err;
  return distinct("tls.listen", cfg.tls.listen, "admin_listen", cfg.admin_listen);
}

rule_result grpc_listener(const config& cfg) {
  if (!cfg.grpc.enabled()) return std::nullopt;
  if (auto err = distinct("grpc.listen", cfg.grpc.listen, "listen", cfg.listen)) return err;
  if (auto err = distinct("grpc.listen", cfg.grpc.listen, "admin_listen", cfg.admin_listen)) return err;
  if (cfg.tls.enabled()) return distinct("grpc.listen", cfg.grpc.listen, "tls.listen", cfg.tls.listen);
  return std::nullopt;
}

rule_result certificate_without_listener(const config& cfg) {
  // A certificate without a listener would be ignored: say so instead of serving plain HTTP only.
  if (!cfg.tls.enabled() && (!cfg.tls.cert_file.empty() || !cfg.tls.key_file.empty()))
    return config_error{"tls.cert_file / tls.key_file are set but tls.listen is not (--tls-listen)"};
  return std::nullopt;
}

/// Exactly one topology source, or none with --demo (which brings its own: a configured source
/// would be silently ignored).
rule_result topology_source(const config& cfg, bool demo) {
  std::string sources;  // "; "-separated, for the messages
  std::size_t count = 0;
  auto add = [&](std::string_view what, const std::string& value) {
    if (value.empty()) return;
    sources += (sources.empty() ? "" : "; ") + std::string{what} + " = " + in_quotes(value);
    ++count;
  };
  add("topology.file / --topology-file", cfg.topology.file);
  add("topology.ray_dashboard / --ray-dashboard", cfg.topology.ray_dashboard);
  add("topology.url / --topology-url", cfg.topology.url);
  if (demo) {
    if (count == 0) return std::nullopt;
    return config_error{"--demo uses its built-in topology; remove the topology source (" + sources + ")"};
  }
  if (count == 0)
    return config_error{"no topology source: set exactly one of --topology-file, --ray-dashboard or "
                        "--topology-url (or topology.file, topology.ray_dashboard, topology.url in the "
                        "config file), or run with --demo"};
  if (count > 1)
    return config_error{"more than one topology source is set (" + sources +
                        "); set exactly one of --topology-file, --ray-dashboard, --topology-url"};
  return std::nullopt;
}

/// In reporting order: single values before the rules that relate them.
constexpr rule_result (*rules[])(const config&) = {
    listener_addresses,
    tls_and_grpc_values,
    process_values,
    topology_values,
    router_and_health_path,
    timeouts,
    client_and_health_limits,
    router_body_limit,
    main_and_admin_distinct,
    tls_listener,
    grpc_listener,
    certificate_without_listener,
};

}  // namespace

std::optional<config_error> validate(const config& cfg, bool demo) {
  for (auto rule : rules)
    if (auto err = rule(cfg)) return err;
  return topology_source(cfg, demo);
}

std::string usage() {
  std::ostringstream out;
  out << "Usage: ingressd [options]\n"
         "\n"
         "L7 reverse proxy for Ray Serve direct ingress: routes each request through an ingress\n"
         "request router to a data-plane replica and streams the response back.\n"
         "\n"
         "Options:\n";
  for (const auto& f : flag_table()) {
    std::string left = "  --" + std::string{f.name};
    if (!f.arg.empty()) left += " " + std::string{f.arg};
    constexpr std::size_t column = 30;
    left.resize(std::max(column, left.size() + 2), ' ');
    out << left << f.help << "\n";
  }
  out << "\n"
         "Exactly one topology source is required: --topology-file, --ray-dashboard or\n"
         "--topology-url (or topology.file / topology.ray_dashboard / topology.url in --config),\n"
         "except with --demo. Durations take units (250ms, 5s, 2m, 1h); sizes take B, KiB, MiB, GiB.\n"
         "\n"
         "Exit codes: 0 clean exit, 1 runtime failure, 2 usage or configuration error.\n";
  return out.str();
}

std::vector<std::string_view> known_keys() {
  std::vector<std::string_view> keys;
  for (const auto& spec : key_table()) keys.push_back(spec.key);
  return keys;
}

}  // namespace ingressd::config
