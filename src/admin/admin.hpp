#pragma once
// The admin listener (contract §5): GET /metrics and GET /topology, served on the control thread.
#include <functional>
#include <memory>
#include <string>
#include <unordered_map>
#include <utility>
#include <vector>

#include "ingressd/config/config.hpp"
#include "ingressd/core/asio.hpp"
#include "ingressd/topology/snapshot.hpp"

namespace ingressd::server {

class worker;
struct shared_state;

class admin_server {
 public:
  struct handlers {
    std::function<std::shared_ptr<const topology::snapshot>()> topology;
    std::function<std::vector<const worker*>()> workers;
    shared_state* shared = nullptr;
    /// Upstreams marked down, by key ("ip:port"), with why (shown in /topology). Health and
    /// in-flight counts themselves are read from the snapshot's upstream states.
    std::function<std::unordered_map<std::string, std::string>()> down_causes;
    /// The config in force (what /metrics exports: metrics.ray_compatible).
    std::function<std::shared_ptr<const config::config>()> config;
  };
  /// Binds at once; `ec` says why it could not.
  admin_server(asio::io_context& ioc, const tcp::endpoint& ep, error_code& ec, handlers h);
  void start();
  void stop();
  std::uint16_t port() const { return port_; }

  /// The bodies, exposed for tests and reuse.
  std::string metrics_text() const;
  std::string topology_json() const;

 private:
  awaitable<void> accept_loop();
  awaitable<void> serve(tcp::socket sock);

  asio::io_context& ioc_;
  tcp::acceptor acceptor_;
  handlers h_;
  std::uint16_t port_ = 0;
  asio::steady_timer* backoff_timer_ = nullptr;  // lives in accept_loop's frame; cancelled by stop()
};

}  // namespace ingressd::server
