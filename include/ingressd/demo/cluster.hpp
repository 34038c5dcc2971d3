#pragma once
// The demo cluster of `ingressd --demo` (contract §8), also the integration tests' default
// upstream: on loopback, app `llm` (route prefix "/") with three streaming replicas, two
// co-located routers on `local_ip` and one remote router on `remote_ip`; app `echo` (prefix
// "/echo") with one replica and no routers.
#include <chrono>
#include <cstddef>
#include <memory>
#include <string>
#include <vector>

#include "ingressd/demo/replica_server.hpp"
#include "ingressd/demo/router_server.hpp"
#include "ingressd/topology/topology.hpp"

namespace ingressd::demo {

class cluster {
 public:
  struct options {
    std::string local_ip = "127.0.0.1";   ///< the proxy's node: replicas and the co-located routers
    std::string remote_ip = "127.0.0.3";  ///< "another node": the remote router
    std::chrono::milliseconds token_delay{20};
    std::size_t tokens = 8;
    /// Requests (and router picks) each server keeps for inspection: a demo that serves for
    /// days must not keep every request it ever saw.
    std::size_t record_limit = 256;
  };

  /// Starts every server (throws boost::system::system_error if one cannot bind).
  cluster();
  explicit cluster(options opts);
  ~cluster();
  cluster(const cluster&) = delete;
  cluster& operator=(const cluster&) = delete;

  /// Stops every server. Idempotent.
  void stop();

  /// The topology: app `llm` (replicas in order, routers: local ones then the remote one) and
  /// app `echo`. Targets carry the servers' bind ip, port and name; instance_id is
  /// "demo-local-node" or "demo-remote-node".
  topology::document document() const;
  /// The same as a Ray-shaped JSON topology document (`{"target_groups": [...]}`), e.g. for a
  /// --topology-file.
  std::string document_json() const;

  const options& settings() const { return opts_; }
  /// The `llm` replicas (3).
  const std::vector<std::unique_ptr<replica_server>>& replicas() const { return replicas_; }
  replica_server& replica(std::size_t i) const { return *replicas_.at(i); }
  /// The `echo` replica.
  replica_server& echo_replica() const { return *echo_; }
  /// All routers: the two co-located ones first, then the remote one.
  const std::vector<std::unique_ptr<router_server>>& routers() const { return routers_; }
  router_server& local_router(std::size_t i) const { return *routers_.at(i); }
  router_server& remote_router() const { return *routers_.back(); }

 private:
  options opts_;
  std::vector<std::unique_ptr<replica_server>> replicas_;
  std::unique_ptr<replica_server> echo_;
  std::vector<std::unique_ptr<router_server>> routers_;
};

}  // namespace ingressd::demo
