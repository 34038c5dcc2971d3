#include "ingressd/topology/topology.hpp"

#include <algorithm>
#include <charconv>
#include <cstdint>
#include <exception>
#include <limits>
#include <map>
#include <optional>
#include <string>
#include <string_view>
#include <unordered_map>
#include <utility>

#include <boost/asio/ip/address.hpp>
#include <boost/system/error_code.hpp>
#include <nlohmann/json.hpp>
#include <yaml-cpp/yaml.h>

namespace ingressd::topology {
namespace {

using json = nlohmann::json;

// Deeper than any real topology document; guards the recursive YAML conversion against stack
// exhaustion on hostile input.
constexpr int max_yaml_depth = 256;

// Carries a validation failure up through the nested validators. It never leaves this file:
// parse_document turns it into a parse_error.
struct invalid {
  std::string message;
};

[[noreturn]] void fail(const std::string& where, const std::string& what) {
  throw invalid{where + ": " + what};
}

// ---- YAML -> JSON ---------------------------------------------------------------------------
// yaml-cpp keeps every scalar as text, so plain (unquoted) scalars are typed here following the
// YAML 1.2 core schema. Quoted scalars stay strings, so `port: "8000"` is rejected exactly like
// the JSON document `{"port": "8000"}`.

std::optional<json> yaml_integer(const std::string& s) {
  std::string_view v = s;
  bool negative = false;
  if (!v.empty() && (v.front() == '+' || v.front() == '-')) {
    negative = v.front() == '-';
    v.remove_prefix(1);
  }
  int base = 10;
  if (v.size() > 2 && v[0] == '0' && (v[1] == 'x' || v[1] == 'o')) {
    if (negative || s.front() == '+') return std::nullopt;  // the core schema has no signed hex/octal
    base = v[1] == 'x' ? 16 : 8;
    v.remove_prefix(2);
  }
  if (v.empty()) return std::nullopt;
  std::uint64_t magnitude = 0;
  auto [end, ec] = std::from_chars(v.data(), v.data() + v.size(), magnitude, base);
  if (ec != std::errc{} || end != v.data() + v.size()) return std::nullopt;
  if (!negative) return json(magnitude);
  constexpr auto min_magnitude =
      static_cast<std::uint64_t>(std::numeric_limits<std::int64_t>::max()) + 1;
  if (magnitude > min_magnitude) return std::nullopt;
  if (magnitude == min_magnitude) return json(std::numeric_limits<std::int64_t>::min());
  return json(-static_cast<std::int64_t>(magnitude));
}

// The core schema's float: [-+]? ( \.[0-9]+ | [0-9]+ ( \.[0-9]* )? ) ( [eE] [-+]? [0-9]+ )?
// Matched by hand because std::stod alone also accepts "inf", "nan" and hex floats.
bool is_yaml_decimal(std::string_view v) {
  const auto digits = [&v] {
    std::size_t n = 0;
    while (n < v.size() && v[n] >= '0' && v[n] <= '9') ++n;
    v.remove_prefix(n);
    return n;
  };
  if (!v.empty() && (v.front() == '+' || v.front() == '-')) v.remove_prefix(1);
  const std::size_t whole = digits();
  std::size_t fraction = 0;
  if (!v.empty() && v.front() == '.') {
    v.remove_prefix(1);
    fraction = digits();
  }
  if (whole == 0 && fraction == 0) return false;
  if (!v.empty() && (v.front() == 'e' || v.front() == 'E')) {
    v.remove_prefix(1);
    if (!v.empty() && (v.front() == '+' || v.front() == '-')) v.remove_prefix(1);
    if (digits() == 0) return false;
  }
  return v.empty();
}

std::optional<json> yaml_float(const std::string& s) {
  if (is_yaml_decimal(s)) {
    try {
      return json(std::stod(s));
    } catch (const std::out_of_range&) {
      return std::nullopt;  // keep it as text; the field check reports it
    }
  }
  if (s == ".inf" || s == ".Inf" || s == ".INF" || s == "+.inf" || s == "+.Inf" || s == "+.INF")
    return json(std::numeric_limits<double>::infinity());
  if (s == "-.inf" || s == "-.Inf" || s == "-.INF")
    return json(-std::numeric_limits<double>::infinity());
  if (s == ".nan" || s == ".NaN" || s == ".NAN") return json(std::numeric_limits<double>::quiet_NaN());
  return std::nullopt;
}

json yaml_scalar(const YAML::Node& node) {
  const std::string& s = node.Scalar();
  // "!" is the tag yaml-cpp gives quoted scalars; an explicit !!str asks for text as well.
  if (node.Tag() == "!" || node.Tag() == "tag:yaml.org,2002:str") return s;
  if (s == "null" || s == "Null" || s == "NULL" || s == "~" || s.empty()) return nullptr;
  if (s == "true" || s == "True" || s == "TRUE") return true;
  if (s == "false" || s == "False" || s == "FALSE") return false;
  if (auto i = yaml_integer(s)) return *i;
  if (auto f = yaml_float(s)) return *f;
  return s;
}

/// True when `s` is well-formed UTF-8. JSON text is checked by nlohmann's parser; YAML scalars
/// are not, and a non-UTF-8 name would later make every JSON dump of the topology throw.
bool valid_utf8(std::string_view s) noexcept {
  std::size_t i = 0;
  while (i < s.size()) {
    const auto c = static_cast<unsigned char>(s[i]);
    std::size_t len = c < 0x80 ? 1 : (c >> 5) == 0x6 ? 2 : (c >> 4) == 0xe ? 3 : (c >> 3) == 0x1e ? 4 : 0;
    if (len == 0 || i + len > s.size()) return false;
    std::uint32_t cp = len == 1 ? c : len == 2 ? (c & 0x1f) : len == 3 ? (c & 0x0f) : (c & 0x07);
    for (std::size_t k = 1; k < len; ++k) {
      const auto cc = static_cast<unsigned char>(s[i + k]);
      if ((cc >> 6) != 0x2) return false;
      cp = (cp << 6) | (cc & 0x3f);
    }
    // Overlong forms, surrogates and values past U+10FFFF are not UTF-8.
    if ((len == 2 && cp < 0x80) || (len == 3 && cp < 0x800) || (len == 4 && cp < 0x10000) || cp > 0x10ffff ||
        (cp >= 0xd800 && cp <= 0xdfff))
      return false;
    i += len;
  }
  return true;
}

json yaml_to_json(const YAML::Node& node, int depth) {
  if (depth > max_yaml_depth) throw invalid{"invalid YAML: nesting deeper than " + std::to_string(max_yaml_depth)};
  switch (node.Type()) {
    case YAML::NodeType::Undefined:
    case YAML::NodeType::Null:
      return nullptr;
    case YAML::NodeType::Scalar:
      if (!valid_utf8(node.Scalar()))
        throw invalid{"invalid YAML: line " + std::to_string(node.Mark().line + 1) + ": text is not UTF-8"};
      return yaml_scalar(node);
    case YAML::NodeType::Sequence: {
      json out = json::array();
      for (const auto& item : node) out.push_back(yaml_to_json(item, depth + 1));
      return out;
    }
    case YAML::NodeType::Map: {
      json out = json::object();
      for (const auto& kv : node) {
        if (!kv.first.IsScalar()) {
          const auto mark = kv.first.Mark();
          throw invalid{"invalid YAML: line " + std::to_string(mark.line + 1) +
                        ": mapping keys must be scalars"};
        }
        if (!valid_utf8(kv.first.Scalar()))
          throw invalid{"invalid YAML: line " + std::to_string(kv.first.Mark().line + 1) + ": key is not UTF-8"};
        out[kv.first.Scalar()] = yaml_to_json(kv.second, depth + 1);
      }
      return out;
    }
  }
  return nullptr;
}

// Returns the parsed tree or the parser's own message.
std::variant<json, std::string> parse_text(std::string_view text) {
  const auto first = text.find_first_not_of(" \t\r\n");
  std::optional<std::string> json_error;
  if (first != std::string_view::npos && (text[first] == '{' || text[first] == '[')) {
    try {
      return json::parse(text.begin(), text.end());
    } catch (const json::exception& e) {
      json_error = e.what();
    }
    // A YAML flow mapping also starts with '{', so YAML gets its turn; but if both fail, the text
    // was almost certainly meant as JSON and JSON's message is the useful one.
  }
  try {
    const YAML::Node root = YAML::Load(std::string(text));
    return yaml_to_json(root, 0);
  } catch (const YAML::Exception& e) {
    if (json_error) return "invalid JSON: " + *json_error;
    return std::string("invalid YAML: ") + e.what();
  } catch (const invalid& e) {
    if (json_error) return "invalid JSON: " + *json_error;
    return e.message;
  }
}

// ---- field validation -----------------------------------------------------------------------

std::string type_name(const json& v) {
  switch (v.type()) {
    case json::value_t::null: return "null";
    case json::value_t::object: return "an object";
    case json::value_t::array: return "a list";
    case json::value_t::string: return "a string";
    case json::value_t::boolean: return "a boolean";
    case json::value_t::number_integer:
    case json::value_t::number_unsigned: return "an integer";
    case json::value_t::number_float: return "a number";
    default: return "an unsupported value";
  }
}

// A missing field and an explicit null are the same to us: pydantic's optional fields
// serialise either way depending on exclude_unset/exclude_none.
const json* field(const json& obj, const char* key) {
  auto it = obj.find(key);
  if (it == obj.end() || it->is_null()) return nullptr;
  return &*it;
}

const json& required(const json& obj, const char* key, const std::string& where) {
  const json* v = field(obj, key);
  if (v == nullptr) fail(where, "missing required field");
  return *v;
}

const std::string& as_string(const json& v, const std::string& where) {
  if (!v.is_string()) fail(where, "expected a string, got " + type_name(v));
  return v.get_ref<const std::string&>();
}

std::string optional_string(const json& obj, const char* key, const std::string& where) {
  const json* v = field(obj, key);
  return v == nullptr ? std::string{} : as_string(*v, where + "." + key);
}

const json& as_list(const json& v, const std::string& where) {
  if (!v.is_array()) fail(where, "expected a list, got " + type_name(v));
  return v;
}

const json& as_object(const json& v, const std::string& where) {
  if (!v.is_object()) fail(where, "expected an object, got " + type_name(v));
  return v;
}

std::uint16_t as_port(const json& v, const std::string& where) {
  if (v.is_number_unsigned()) {
    const auto p = v.get<std::uint64_t>();
    if (p >= 1 && p <= 65535) return static_cast<std::uint16_t>(p);
  } else if (v.is_number_integer()) {
    const auto p = v.get<std::int64_t>();
    if (p >= 1 && p <= 65535) return static_cast<std::uint16_t>(p);
  }
  fail(where, "expected an integer 1-65535, got " + (v.is_number() ? v.dump() : type_name(v)));
}

// A target's `name` is needed only where a router answers with it (the replicas of an app with
// routers); a hand-written topology may leave it out elsewhere, and the target is then named
// "ip:port".
enum class target_kind { replica, routed_replica, router, fallback };

target parse_target(const json& v, const std::string& where, target_kind kind) {
  as_object(v, where);
  target t;
  t.ip = as_string(required(v, "ip", where + ".ip"), where + ".ip");
  boost::system::error_code ec;
  (void)boost::asio::ip::make_address(t.ip, ec);
  if (ec) fail(where + ".ip", "expected an IPv4 or IPv6 address literal, got '" + t.ip + "'");
  t.port = as_port(required(v, "port", where + ".port"), where + ".port");
  t.instance_id = optional_string(v, "instance_id", where);
  if (kind == target_kind::routed_replica) {
    // The replica_id a router answers with: it must be there, and usable as a key.
    t.name = as_string(required(v, "name", where + ".name"), where + ".name");
    if (t.name.empty()) fail(where + ".name", "must not be empty");
  } else {
    t.name = optional_string(v, "name", where);
    if (t.name.empty() && kind == target_kind::replica) t.name = key_of(t);
  }
  return t;
}

std::vector<target> parse_targets(const json& v, const std::string& where, target_kind kind) {
  as_list(v, where);
  std::vector<target> out;
  out.reserve(v.size());
  for (std::size_t i = 0; i < v.size(); ++i)
    out.push_back(parse_target(v[i], where + "[" + std::to_string(i) + "]", kind));
  return out;
}

// ---- every missing field at once --------------------------------------------------------------
// A hand-written document with several gaps names them all in one error, instead of one per run.
// Only presence is checked here; types and values are checked as the document is parsed.

void missing_in_target(const json& v, const std::string& where, bool name_needed, std::vector<std::string>& out) {
  if (!v.is_object()) return;
  for (const char* key : {"ip", "port"})
    if (field(v, key) == nullptr) out.push_back(where + "." + key);
  if (name_needed && field(v, "name") == nullptr) out.push_back(where + ".name");
}

void missing_in_targets(const json* v, const std::string& where, bool names_needed, std::vector<std::string>& out) {
  if (v == nullptr || !v->is_array()) return;
  for (std::size_t i = 0; i < v->size(); ++i)
    missing_in_target((*v)[i], where + "[" + std::to_string(i) + "]", names_needed, out);
}

bool has_routers(const json& group) {
  const json* routers = field(group, "ingress_request_router_targets");
  return routers != nullptr && routers->is_array() && !routers->empty();
}

std::vector<std::string> missing_fields(const json& root) {
  std::vector<std::string> out;
  const json* groups = field(root, "target_groups");
  if (groups == nullptr || !groups->is_array()) return out;
  for (std::size_t i = 0; i < groups->size(); ++i) {
    const json& g = (*groups)[i];
    const std::string where = "target_groups[" + std::to_string(i) + "]";
    if (!g.is_object()) continue;
    const json* protocol = field(g, "protocol");
    const bool grpc = protocol != nullptr && protocol->is_string() && protocol->get_ref<const std::string&>() == "gRPC";
    if (!grpc && field(g, "route_prefix") == nullptr) out.push_back(where + ".route_prefix");
    if (field(g, "targets") == nullptr) out.push_back(where + ".targets");
    missing_in_targets(field(g, "targets"), where + ".targets", !grpc && has_routers(g), out);
    missing_in_targets(field(g, "ingress_request_router_targets"), where + ".ingress_request_router_targets", false, out);
    if (const json* f = field(g, "fallback_target")) missing_in_target(*f, where + ".fallback_target", false, out);
  }
  if (const json* fallbacks = field(root, "fallback_targets"); fallbacks && fallbacks->is_object())
    for (const char* key : {"HTTP", "gRPC"})
      if (const json* f = field(*fallbacks, key)) missing_in_target(*f, std::string("fallback_targets.") + key, false, out);
  return out;
}

// `grpc` is set when the group is a gRPC one.
app parse_group(const json& v, const std::string& where, document& doc, bool& grpc) {
  as_object(v, where);
  app a;
  a.name = optional_string(v, "app_name", where);

  // Ray always writes it; a hand-written group without it is an HTTP one.
  const std::string protocol = field(v, "protocol") ? as_string(*field(v, "protocol"), where + ".protocol") : "HTTP";
  grpc = protocol == "gRPC";
  if (!grpc && protocol != "HTTP") fail(where + ".protocol", "expected \"HTTP\" or \"gRPC\", got \"" + protocol + "\"");
  if (grpc) {
    // Calls find their app by name (the `application` metadata), so the name is the key; the
    // route prefix means nothing to a gRPC call and routers never apply (Ray: HTTP-only).
    a.replicas = parse_targets(required(v, "targets", where + ".targets"), where + ".targets", target_kind::replica);
    if (const json* fallback = field(v, "fallback_target"))
      a.fallback = parse_target(*fallback, where + ".fallback_target", target_kind::fallback);
    if (const json* prefix = field(v, "route_prefix"); prefix && prefix->is_string())
      a.route_prefix = normalise_prefix(prefix->get<std::string>());
    return a;
  }

  const std::string& prefix =
      as_string(required(v, "route_prefix", where + ".route_prefix"), where + ".route_prefix");
  // Ray only accepts prefixes that start with '/'; anything else could never match a request path.
  if (!prefix.empty() && prefix.front() != '/')
    fail(where + ".route_prefix", "must start with '/', got '" + prefix + "'");
  a.route_prefix = normalise_prefix(prefix);

  a.replicas = parse_targets(required(v, "targets", where + ".targets"), where + ".targets",
                             has_routers(v) ? target_kind::routed_replica : target_kind::replica);
  if (const json* routers = field(v, "ingress_request_router_targets"))
    a.routers = parse_targets(*routers, where + ".ingress_request_router_targets", target_kind::router);
  if (const json* fallback = field(v, "ingress_router_fallback")) {
    if (!fallback->is_boolean())
      fail(where + ".ingress_router_fallback", "expected a boolean, got " + type_name(*fallback));
    a.router_fallback = fallback->get<bool>();
  }
  if (const json* fallback = field(v, "fallback_target"))
    a.fallback = parse_target(*fallback, where + ".fallback_target", target_kind::fallback);

  // What the dashboard lists when Serve runs its own HAProxy (ray controller.py,
  // _get_proxy_target_groups): one group for "/" whose targets are the proxies. Served as it is,
  // but the apps' routers and replicas are not in it.
  const bool proxies_only = !a.replicas.empty() && std::all_of(a.replicas.begin(), a.replicas.end(), [](const target& t) {
    return t.name.starts_with("SERVE_PROXY_ACTOR");
  });
  if (proxies_only)
    doc.warnings.push_back("target group for route '" + a.route_prefix +
                           "' lists Serve proxies, not replicas: the dashboard of a cluster whose Serve runs its own "
                           "HAProxy; serve contrib/ray_topology_exporter.py's document (--topology-url) to route "
                           "through the apps' routers and replicas");

  std::unordered_map<std::string_view, std::size_t> seen;
  for (std::size_t i = 0; i < a.replicas.size(); ++i) {
    auto [it, fresh] = seen.emplace(a.replicas[i].name, i);
    if (!fresh)
      fail(where + ".targets[" + std::to_string(i) + "].name",
           "duplicate replica name '" + a.replicas[i].name + "' (also targets[" +
               std::to_string(it->second) + "])");
  }
  return a;
}

std::vector<ray_proxy> parse_proxies(const json& root) {
  std::vector<ray_proxy> out;
  const json* proxies = field(root, "proxies");
  if (proxies == nullptr || !proxies->is_object()) return out;
  for (const auto& [node_id, entry] : proxies->items()) {
    if (!entry.is_object()) continue;
    ray_proxy p;
    p.node_id = node_id;  // the map's key (Ray writes the same id inside)
    const json* ip = field(entry, "node_ip");
    const json* status = field(entry, "status");
    if (!ip || !ip->is_string() || !status || !status->is_string()) continue;
    p.node_ip = ip->get<std::string>();
    p.status = status->get<std::string>();
    if (!valid_utf8(p.node_id) || !valid_utf8(p.node_ip) || !valid_utf8(p.status)) continue;
    out.push_back(std::move(p));
  }
  return out;
}

document parse_tree(const json& root) {
  if (!root.is_object()) fail("top level", "expected an object, got " + type_name(root));
  document doc;
  doc.proxies = parse_proxies(root);

  const json* groups = field(root, "target_groups");
  if (groups == nullptr) {
    // What the dashboard answers while Serve is not running: ServeInstanceDetails'
    // get_empty_schema_dict(), {"controller_info": {}, "proxies": {}, "applications": {}, ...}
    // (ray python/ray/serve/schema.py; dashboard modules/serve/serve_head.py). A document with none
    // of these keys is still missing its target groups (a typo must not empty the topology).
    for (const char* key : {"applications", "proxies", "controller_info"})
      if (root.contains(key)) {
        doc.serve_running = false;
        return doc;
      }
    fail("target_groups", "missing required field");
  }
  as_list(*groups, "target_groups");
  if (const auto missing = missing_fields(root); !missing.empty()) {
    std::string list;
    for (const auto& m : missing) list.append(list.empty() ? "" : ", ").append(m);
    throw invalid{"missing required field" + std::string(missing.size() > 1 ? "s: " : ": ") + list};
  }

  // prefix -> (group index, app name) of the HTTP group that claimed it first
  std::map<std::string, std::pair<std::size_t, std::string>> prefixes;
  std::map<std::string, std::size_t> grpc_names;  // gRPC app name -> group index
  for (std::size_t i = 0; i < groups->size(); ++i) {
    const std::string where = "target_groups[" + std::to_string(i) + "]";
    bool grpc = false;
    auto a = std::make_optional(parse_group((*groups)[i], where, doc, grpc));
    if (grpc) {
      auto [it, fresh] = grpc_names.emplace(a->name, i);
      if (!fresh)
        fail(where + ".app_name", "duplicate gRPC app '" + a->name + "' (also target_groups[" +
                                      std::to_string(it->second) + "])");
      doc.grpc_apps.push_back(std::move(*a));
      continue;
    }
    auto [it, fresh] = prefixes.emplace(a->route_prefix, std::pair{i, a->name});
    if (!fresh)
      fail(where + ".route_prefix", "duplicate route prefix '" + a->route_prefix + "': app '" +
                                        a->name + "' and app '" + it->second.second +
                                        "' (target_groups[" + std::to_string(it->second.first) + "])");
    doc.apps.push_back(std::move(*a));
  }

  if (const json* fallbacks = field(root, "fallback_targets")) {
    as_object(*fallbacks, "fallback_targets");
    if (const json* http = field(*fallbacks, "HTTP"))
      doc.http_fallback = parse_target(*http, "fallback_targets.HTTP", target_kind::fallback);
    if (const json* g = field(*fallbacks, "gRPC"))
      doc.grpc_fallback = parse_target(*g, "fallback_targets.gRPC", target_kind::fallback);
  }
  return doc;
}

}  // namespace

std::string key_of(const target& t) {
  // IPv6 literals need brackets, otherwise the port is indistinguishable from the address.
  if (t.ip.find(':') != std::string::npos) return "[" + t.ip + "]:" + std::to_string(t.port);
  return t.ip + ":" + std::to_string(t.port);
}

std::string normalise_prefix(std::string_view prefix) {
  while (prefix.size() > 1 && prefix.back() == '/') prefix.remove_suffix(1);
  if (prefix.empty()) return "/";
  return std::string(prefix);
}

std::variant<document, parse_error> parse_document(std::string_view text) {
  try {
    auto parsed = parse_text(text);
    if (auto* message = std::get_if<std::string>(&parsed)) return parse_error{std::move(*message)};
    return parse_tree(std::get<json>(parsed));
  } catch (const invalid& e) {
    return parse_error{e.message};
  } catch (const std::exception& e) {
    return parse_error{std::string("topology document: ") + e.what()};
  } catch (...) {
    return parse_error{"topology document: unexpected error"};
  }
}

namespace {
nlohmann::ordered_json target_to_json(const target& t) {
  return {{"ip", t.ip}, {"port", t.port}, {"instance_id", t.instance_id}, {"name", t.name}};
}
}  // namespace

std::string to_json(const document& doc) {
  auto groups = nlohmann::ordered_json::array();
  for (const auto& a : doc.apps) {
    nlohmann::ordered_json g;
    g["app_name"] = a.name;
    g["route_prefix"] = a.route_prefix;
    g["protocol"] = "HTTP";
    g["targets"] = nlohmann::ordered_json::array();
    for (const auto& t : a.replicas) g["targets"].push_back(target_to_json(t));
    g["ingress_request_router_targets"] = nlohmann::ordered_json::array();
    for (const auto& t : a.routers) g["ingress_request_router_targets"].push_back(target_to_json(t));
    if (a.router_fallback) g["ingress_router_fallback"] = true;
    if (a.fallback) g["fallback_target"] = target_to_json(*a.fallback);
    groups.push_back(std::move(g));
  }
  for (const auto& a : doc.grpc_apps) {
    nlohmann::ordered_json g;
    g["app_name"] = a.name;
    // A gRPC group may have no (string) route_prefix: kept empty, and left out here so that it
    // parses back empty rather than as "/" (normalise_prefix("") is "/").
    if (!a.route_prefix.empty()) g["route_prefix"] = a.route_prefix;
    g["protocol"] = "gRPC";
    g["targets"] = nlohmann::ordered_json::array();
    for (const auto& t : a.replicas) g["targets"].push_back(target_to_json(t));
    g["ingress_request_router_targets"] = nlohmann::ordered_json::array();
    if (a.fallback) g["fallback_target"] = target_to_json(*a.fallback);
    groups.push_back(std::move(g));
  }
  nlohmann::ordered_json root;
  auto proxies = nlohmann::ordered_json::object();
  for (const auto& p : doc.proxies)
    proxies[p.node_id] = {{"node_id", p.node_id}, {"node_ip", p.node_ip}, {"status", p.status}};
  if (!doc.serve_running) {
    // Ray's empty ServeInstanceDetails, as the dashboard serves it while Serve is not running.
    root = {{"controller_info", nlohmann::ordered_json::object()},
            {"proxies", std::move(proxies)},
            {"applications", nlohmann::ordered_json::object()},
            {"target_capacity", nullptr}};
    return root.dump(2);
  }
  root["target_groups"] = std::move(groups);
  if (!doc.proxies.empty()) root["proxies"] = std::move(proxies);
  if (doc.http_fallback || doc.grpc_fallback) {
    root["fallback_targets"] = nlohmann::ordered_json::object();
    if (doc.http_fallback) root["fallback_targets"]["HTTP"] = target_to_json(*doc.http_fallback);
    if (doc.grpc_fallback) root["fallback_targets"]["gRPC"] = target_to_json(*doc.grpc_fallback);
  }
  return root.dump(2);
}

}  // namespace ingressd::topology
