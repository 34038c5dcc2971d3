#pragma once
// The admin listener (contract §5): GET /metrics and GET /topology, served on the control thread.
#include <functional>
#include <memory>
#include <string>
#include <unordered_map>
#include <unordered_set>
#include <utility>
#include <vector>

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
    /// Per replica key: whether health checks have it up, and its in-flight requests summed
    /// over the workers (asked of each worker on its own thread).
    std::function<std::unordered_map<std::string, std::pair<bool, std::uint32_t>>()> replica_state;
    /// Keys ("ip:port") of replicas health checks have marked down (ingressd_replica_up);
    /// unset: every replica counts as up.
    std::function<std::unordered_set<std::string>()> down;
  };
  /// Binds at once (throws std::system_error on failure).
  admin_server(asio::io_context& ioc, const tcp::endpoint& ep, handlers h);
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
