#pragma once
// Small helpers to build topology documents for integration tests: targets that point at the
// fake servers, apps, a fluent document builder, and a loopback port nobody listens on.
#include <cstdint>
#include <initializer_list>
#include <string>
#include <utility>
#include <vector>

#include <boost/asio/io_context.hpp>
#include <boost/asio/ip/tcp.hpp>

#include "ingressd/demo/server_base.hpp"
#include "ingressd/topology/topology.hpp"

namespace ingressd::testing {

/// A target dialled at 127.0.0.1:`port` with the given actor name.
inline topology::target make_target(std::uint16_t port, std::string name, std::string ip = "127.0.0.1") {
  topology::target t;
  t.ip = std::move(ip);
  t.port = port;
  t.instance_id = "test-node";
  t.name = std::move(name);
  return t;
}

/// A target for a running fake server (name = the server's replica name).
template <class Server>
topology::target target_of(const Server& s) {
  return make_target(s.port(), s.name(), s.bind_ip());
}

/// A port on loopback address `ip` that nothing listens on: bound once by the kernel's choice,
/// then closed, so a connect to it is refused.
inline std::uint16_t dead_port(const std::string& ip = "127.0.0.1") {
  boost::asio::io_context ioc;
  boost::asio::ip::tcp::acceptor a(ioc);
  boost::asio::ip::tcp::endpoint ep(boost::asio::ip::make_address(ip), 0);
  a.open(ep.protocol());
  a.bind(ep);
  const auto port = a.local_endpoint().port();
  a.close();
  return port;
}

/// Fluent topology document builder.
class topology_builder {
 public:
  /// Adds an app with replica targets (no routers).
  topology_builder& app(std::string name, std::string prefix, std::vector<topology::target> replicas = {}) {
    topology::app a;
    a.name = std::move(name);
    a.route_prefix = std::move(prefix);
    a.replicas = std::move(replicas);
    doc_.apps.push_back(std::move(a));
    return *this;
  }
  /// Adds routers to the most recently added app.
  topology_builder& routers(std::vector<topology::target> routers) {
    doc_.apps.back().routers = std::move(routers);
    return *this;
  }
  topology_builder& fallback(topology::target t) {
    doc_.http_fallback = std::move(t);
    return *this;
  }
  topology::document build() const { return doc_; }
  operator topology::document() const { return doc_; }  // NOLINT: implicit on purpose

 private:
  topology::document doc_;
};

}  // namespace ingressd::testing
