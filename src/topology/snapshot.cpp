#include "ingressd/topology/snapshot.hpp"

#include <optional>
#include <utility>

#include <boost/asio/ip/address.hpp>
#include <boost/system/error_code.hpp>

#include "ingressd/routing/router_pool.hpp"

namespace ingressd::topology {
namespace {

std::optional<boost::asio::ip::address> to_address(const std::string& text) {
  boost::system::error_code ec;
  auto a = boost::asio::ip::make_address(text, ec);
  if (ec) return std::nullopt;
  return a;
}


class resolver {
 public:
  resolver(const std::string& node_ip, const std::string& local_dial_host)
      : node_ip_(node_ip), local_(local_dial_host.empty() ? std::nullopt : to_address(local_dial_host)) {}

  endpoint operator()(const target& t) const {
    endpoint e;
    // Same textual comparison as Ray and build_router_pool, so "co-located" means one thing.
    e.colocated = !node_ip_.empty() && t.ip == node_ip_;
    // An unparsable local_dial_host is a config error caught at load; here it simply has no effect.
    auto address = (e.colocated && local_) ? local_ : to_address(t.ip);
    e.dial = boost::asio::ip::tcp::endpoint(address.value_or(boost::asio::ip::address{}), t.port);
    e.key = key_of(t);
    e.name = t.name;
    return e;
  }

 private:
  const std::string& node_ip_;
  std::optional<boost::asio::ip::address> local_;
};

/// Gives endpoints their live state: the previous snapshot's for a key it had, else a new one.
class state_table {
 public:
  state_table(snapshot& s, const snapshot* previous) : s_(s), previous_(previous) {}

  endpoint with_state(endpoint e) {
    auto& slot = s_.states[e.key];
    if (!slot) {
      if (previous_)
        if (auto it = previous_->states.find(e.key); it != previous_->states.end()) slot = it->second;
      if (!slot) slot = std::make_shared<upstream_state>();
    }
    e.state = slot.get();
    return e;
  }

 private:
  snapshot& s_;
  const snapshot* previous_;
};

app_view make_view(const app& a, const resolver& resolve, std::string_view node_ip, state_table& states,
                   const std::optional<endpoint>& document_fallback) {
  app_view v;
  v.name = a.name;
  v.route_prefix = a.route_prefix;
  v.router_fallback = a.router_fallback;
  v.replicas.reserve(a.replicas.size());
  for (std::size_t i = 0; i < a.replicas.size(); ++i) {
    v.replicas.push_back(states.with_state(resolve(a.replicas[i])));
    v.replica_by_name.emplace(a.replicas[i].name, i);
  }
  if (a.fallback) v.fallback = states.with_state(resolve(*a.fallback));
  else v.fallback = document_fallback;
  for (std::size_t index : routing::build_router_pool(a.routers, node_ip)) {
    v.router_pool.push_back(resolve(a.routers[index]));
    // Keys contain no ',' (ip literal, ':' and digits), so the join is unambiguous.
    if (!v.pool_signature.empty()) v.pool_signature += ',';
    v.pool_signature += v.router_pool.back().key;
  }
  return v;
}

}  // namespace

std::shared_ptr<const snapshot> make_snapshot(document doc, const std::string& node_ip,
                                              const std::string& local_dial_host,
                                              std::uint64_t generation, std::string source,
                                              const snapshot* previous, const std::string& ray_node_id) {
  auto s = std::make_shared<snapshot>();
  s->doc = std::move(doc);
  s->node_ip = node_ip;
  for (const auto& p : s->doc.proxies) {
    if (ray_node_id.empty() ? p.node_ip != node_ip : p.node_id != ray_node_id) continue;
    s->ray_node_id = p.node_id;
    s->ray_node_status = p.status;
    break;
  }
  s->generation = generation;
  s->source = std::move(source);

  const resolver resolve(s->node_ip, local_dial_host);
  state_table states(*s, previous);
  if (s->doc.http_fallback) s->fallback = states.with_state(resolve(*s->doc.http_fallback));
  std::vector<std::string> prefixes;
  s->apps.reserve(s->doc.apps.size());
  prefixes.reserve(s->doc.apps.size());
  for (const app& a : s->doc.apps) {
    s->apps.push_back(make_view(a, resolve, s->node_ip, states, s->fallback));
    prefixes.push_back(a.route_prefix);
  }
  s->routes = routing::route_table(prefixes);
  if (s->doc.grpc_fallback) s->grpc_fallback = states.with_state(resolve(*s->doc.grpc_fallback));
  s->grpc_apps.reserve(s->doc.grpc_apps.size());
  for (const app& a : s->doc.grpc_apps) {
    s->grpc_by_name.emplace(a.name, s->grpc_apps.size());
    s->grpc_apps.push_back(make_view(a, resolve, s->node_ip, states, s->grpc_fallback));
    for (const auto& r : s->grpc_apps.back().replicas) s->grpc_keys.emplace(r.key, true);
    if (const auto& f = s->grpc_apps.back().fallback) s->grpc_keys.emplace(f->key, true);
  }
  s->updated = std::chrono::system_clock::now();
  return s;
}

std::optional<placement> remap(const snapshot& from, const placement& where, const snapshot& to) {
  const app_view& old = from.apps[where.app];
  for (std::size_t i = 0; i < to.apps.size(); ++i) {
    if (to.apps[i].name != old.name) continue;
    placement next{i, std::nullopt};
    if (where.pinned) {
      const auto& by_name = to.apps[i].replica_by_name;
      if (auto it = by_name.find(old.replicas[*where.pinned].name); it != by_name.end()) next.pinned = it->second;
    }
    return next;
  }
  return std::nullopt;
}

std::size_t snapshot::router_count() const {
  std::size_t n = 0;
  for (const app& a : doc.apps) n += a.routers.size();
  return n;
}

std::size_t snapshot::replica_count() const {
  std::size_t n = 0;
  for (const app& a : doc.apps) n += a.replicas.size();
  return n;
}

std::size_t snapshot::apps_with_routers() const {
  std::size_t n = 0;
  for (const app& a : doc.apps) n += a.routers.empty() ? 0 : 1;
  return n;
}

}  // namespace ingressd::topology
