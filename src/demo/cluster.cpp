#include "ingressd/demo/cluster.hpp"

#include <nlohmann/json.hpp>

namespace ingressd::demo {

namespace {

constexpr const char* local_instance = "demo-local-node";
constexpr const char* remote_instance = "demo-remote-node";

// Ray's actor naming: SERVE_REPLICA::<app>#<deployment>#<unique id>.
const char* const llm_replica_ids[] = {"a1b2", "c3d4", "e5f6"};
const char* const router_ids[] = {"r1l0", "r2l1", "r3x9"};

}  // namespace

cluster::cluster() : cluster(options{}) {}

cluster::cluster(options opts) : opts_(std::move(opts)) {
  for (const char* id : llm_replica_ids) {
    replicas_.push_back(std::make_unique<replica_server>(replica_server::options{
        .name = std::string("SERVE_REPLICA::llm#LLMServer#") + id,
        .bind_ip = opts_.local_ip,
        .port = 0,
        .token_delay = opts_.token_delay,
        .tokens = opts_.tokens,
    }));
  }
  echo_ = std::make_unique<replica_server>(replica_server::options{
      .name = "SERVE_REPLICA::echo#Echo#e7g8",
      .bind_ip = opts_.local_ip,
      .port = 0,
      .token_delay = opts_.token_delay,
      .tokens = opts_.tokens,
  });

  std::vector<topology::target> replica_targets;
  for (const auto& r : replicas_)
    replica_targets.push_back({.ip = r->bind_ip(), .port = r->port(), .instance_id = local_instance, .name = r->name()});
  for (std::size_t i = 0; i < 3; ++i) {
    const bool remote = i == 2;
    routers_.push_back(std::make_unique<router_server>(router_server::options{
        .name = std::string("SERVE_REPLICA::llm#LLMRouter#") + router_ids[i],
        .bind_ip = remote ? opts_.remote_ip : opts_.local_ip,
        .port = 0,
    }));
    routers_.back()->set_replicas(replica_targets);
  }
  for (auto& r : replicas_) r->set_record_limit(opts_.record_limit);
  echo_->set_record_limit(opts_.record_limit);
  for (auto& r : routers_) r->set_record_limit(opts_.record_limit);
}

cluster::~cluster() { stop(); }

void cluster::stop() {
  for (auto& r : routers_) r->stop();
  for (auto& r : replicas_) r->stop();
  if (echo_) echo_->stop();
}

topology::document cluster::document() const {
  auto target_of = [](const server_base& s, const std::string& name, const char* instance) {
    return topology::target{.ip = s.bind_ip(), .port = s.port(), .instance_id = instance, .name = name};
  };
  topology::app llm{.name = "llm", .route_prefix = "/", .replicas = {}, .routers = {}, .router_fallback = false, .fallback = std::nullopt};
  for (const auto& r : replicas_) llm.replicas.push_back(target_of(*r, r->name(), local_instance));
  for (std::size_t i = 0; i < routers_.size(); ++i)
    llm.routers.push_back(target_of(*routers_[i], routers_[i]->name(), i + 1 == routers_.size() ? remote_instance : local_instance));

  topology::app echo{.name = "echo", .route_prefix = "/echo", .replicas = {}, .routers = {}, .router_fallback = false, .fallback = std::nullopt};
  echo.replicas.push_back(target_of(*echo_, echo_->name(), local_instance));

  topology::document doc;
  doc.apps.push_back(std::move(llm));
  doc.apps.push_back(std::move(echo));
  return doc;
}

std::string cluster::document_json() const { return topology::to_json(document()); }

}  // namespace ingressd::demo
