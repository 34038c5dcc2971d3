#pragma once
// Runs the real daemon object in-process on loopback port 0 for integration tests.
#include <memory>
#include <string>

#include "ingressd/config/config.hpp"
#include "ingressd/app/daemon.hpp"
#include "ingressd/topology/snapshot.hpp"
#include "ingressd/topology/topology.hpp"

namespace ingressd::testing {

/// A config suitable for tests: loopback listeners on port 0, the given thread count.
inline config::config test_config(unsigned threads = 1) {
  config::config c;
  c.listen = {"127.0.0.1", 0};
  c.admin_listen = {"127.0.0.1", 0};
  c.threads = threads;
  c.topology.file = "(test)";
  // Most tests count and order router calls to check the pool rules (contract §4.2); a hedge,
  // which a loaded machine can trigger at any time, would add calls. Hedging has its own tests
  // (hedge_test.cpp), and the process tests run the default.
  c.router.hedge_auto = false;
  c.router.hedge_after = {};
  return c;
}

class proxy {
 public:
  explicit proxy(config::config cfg, std::string node_ip = "127.0.0.2")
      : cfg_(std::make_shared<const config::config>(std::move(cfg))), node_ip_(std::move(node_ip)), d_(cfg_) {
    d_.start();
  }
  ~proxy() {
    d_.stop();
    d_.wait();
  }
  /// Publishes a topology document (as the watcher would: upstreams that stay keep their state).
  void set_topology(topology::document doc) {
    d_.set_topology(topology::make_snapshot(std::move(doc), node_ip_, cfg_->topology.local_dial_host, ++gen_, {},
                                            d_.current_topology().get()));
    d_.sync();
  }
  std::uint16_t port() const { return d_.port(); }
  std::uint16_t admin_port() const { return d_.admin_port(); }
  std::uint16_t tls_port() const { return d_.tls_port(); }
  server::daemon& daemon() { return d_; }
  const config::config& cfg() const { return *cfg_; }

 private:
  std::shared_ptr<const config::config> cfg_;
  std::string node_ip_;
  std::uint64_t gen_ = 0;
  server::daemon d_;
};

}  // namespace ingressd::testing
